#include "backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace peregrine {

namespace {
// splitmix64: a stateless hash of (seed, index) so any element can be drawn on its own.
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
}  // namespace

float uniform_hash(uint64_t seed, uint64_t index, float lo, float hi) {
    const uint64_t h = mix(seed ^ mix(index));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // 24 bits in [0, 1)
    return lo + (hi - lo) * u;
}

void DeviceServices::fill_random(const Tensor& t, uint64_t seed, float lo, float hi) {
    PG_CHECK(t.device == Device::CPU, "fill_random: host tensors only in the base implementation");
    const int64_t n = t.numel();
    if (t.dtype == DType::F32) {
        for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = uniform_hash(seed, i, lo, hi);
    } else if (t.dtype == DType::BF16) {
        for (int64_t i = 0; i < n; ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(uniform_hash(seed, i, lo, hi));
    } else {
        fail("fill_random: unsupported dtype ", dtype_name(t.dtype));
    }
}

void* DeviceServices::allocate_host(size_t bytes) {
    // Page-aligned, so that the pool starts on its own pages (untouched pages stay uncommitted).
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = rounded == 0 ? nullptr : std::aligned_alloc(4096, rounded);
    if (!p) fail("cannot allocate ", bytes, " bytes of host memory for the KV offload tier");
    return p;
}

void DeviceServices::free_host(void* p) {
    std::free(p);
}

namespace {
// (offset of each cache's rows within a slot, bytes of one block of it), checking the slot size.
std::vector<std::pair<size_t, size_t>> slot_layout(const std::vector<Tensor>& caches, size_t slot_bytes) {
    std::vector<std::pair<size_t, size_t>> out;
    size_t off = 0;
    for (const Tensor& c : caches) {
        PG_CHECK(c.device == Device::CPU, "host-tier copies: host tensors only in the base implementation");
        const size_t bb = c.nbytes() / static_cast<size_t>(c.dim(0));
        out.emplace_back(off, bb);
        off += bb;
    }
    PG_CHECK(off == slot_bytes, "host slot of ", slot_bytes, " bytes for blocks of ", off);
    return out;
}
}  // namespace

void DeviceServices::copy_blocks_to_host(const std::vector<Tensor>& caches,
                                         const std::vector<std::pair<int32_t, int32_t>>& pairs, void* host,
                                         size_t slot_bytes) {
    const auto layout = slot_layout(caches, slot_bytes);
    for (const auto& [block, slot] : pairs) {
        char* dst = static_cast<char*>(host) + static_cast<size_t>(slot) * slot_bytes;
        for (size_t c = 0; c < caches.size(); ++c) {
            PG_CHECK(block >= 0 && block < caches[c].dim(0) && slot >= 0);
            std::memcpy(dst + layout[c].first, caches[c].ptr<char>() + block * layout[c].second, layout[c].second);
        }
    }
}

void DeviceServices::copy_blocks_from_host(const void* host, size_t slot_bytes,
                                           const std::vector<std::pair<int32_t, int32_t>>& pairs,
                                           const std::vector<Tensor>& caches) {
    const auto layout = slot_layout(caches, slot_bytes);
    for (const auto& [slot, block] : pairs) {
        const char* src = static_cast<const char*>(host) + static_cast<size_t>(slot) * slot_bytes;
        for (size_t c = 0; c < caches.size(); ++c) {
            PG_CHECK(block >= 0 && block < caches[c].dim(0) && slot >= 0);
            std::memcpy(caches[c].ptr<char>() + block * layout[c].second, src + layout[c].first, layout[c].second);
        }
    }
}

LayerWeights Backend::place_layer(const LayerWeights& host) {
    auto matrix = [&](const Tensor& t) { return t.empty() ? t : place_weight(t, true); };
    auto vec = [&](const Tensor& t) { return t.empty() ? t : place_weight(t, false); };
    LayerWeights p;
    p.attn_norm = vec(host.attn_norm);
    p.wq = matrix(host.wq);
    p.wk = matrix(host.wk);
    p.wv = matrix(host.wv);
    p.bq = vec(host.bq);
    p.bk = vec(host.bk);
    p.bv = vec(host.bv);
    p.q_norm = vec(host.q_norm);
    p.k_norm = vec(host.k_norm);
    p.wo = matrix(host.wo);
    p.ffn_norm = vec(host.ffn_norm);
    p.w_gate = matrix(host.w_gate);
    p.w_up = matrix(host.w_up);
    p.w_down = matrix(host.w_down);
    return p;
}

void Backend::set_kv_cache_dtype(DType t) {
    if (t != DType::F8_E4M3 && t != native_kv_cache_dtype())
        fail("this backend keeps its KV cache in ", dtype_name(native_kv_cache_dtype()), " or f8_e4m3, not ",
             dtype_name(t));
    kv_fp8_ = t == DType::F8_E4M3;
}

}  // namespace peregrine
