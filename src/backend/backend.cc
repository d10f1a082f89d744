#include "backend/backend.h"

#include <cstring>
#include <vector>

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

void Backend::fill_random(const Tensor& t, uint64_t seed, float lo, float hi) {
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

Tensor Backend::place_stacked(const std::vector<Tensor>&, bool) {
    fail(name(), ": no stacked weights (packs_projections is false)");
}
void Backend::rope_and_cache_packed(const Tensor&, const Tensor&, const BatchInput&, const RopeTable&, int, int,
                                    const Tensor&, const Tensor&) {
    fail(name(), ": no packed projections");
}
void Backend::silu_mul_packed(const Tensor&, const Tensor&) {
    fail(name(), ": no packed projections");
}
void Backend::rope_cache_attention(const Tensor& qkv, const Tensor& q, const BatchInput& batch, const RopeTable& rope,
                                   int head_dim, int num_kv_heads, const Tensor& k_cache, const Tensor& v_cache,
                                   int num_heads, float scale, int window, const Tensor& out) {
    rope_and_cache_packed(qkv, q, batch, rope, head_dim, num_kv_heads, k_cache, v_cache);
    attention(q, k_cache, v_cache, batch, num_heads, head_dim, scale, window, out);
}
void Backend::matmul_silu(const Tensor& x, const Tensor& w_gate_up, const Tensor& out, const Tensor& scratch) {
    matmul(x, w_gate_up, Tensor(), scratch);
    silu_mul_packed(scratch, out);
}

void Backend::norm_matmul(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w, const Tensor& bias,
                          const Tensor& out, const Tensor& normed) {
    rms_norm(x, Tensor(), norm_weight, eps, normed);
    matmul(normed, w, bias, out);
}
void Backend::norm_matmul_silu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w_gate_up,
                               const Tensor& out, const Tensor& normed, const Tensor& scratch) {
    rms_norm(x, Tensor(), norm_weight, eps, normed);
    matmul_silu(normed, w_gate_up, out, scratch);
}
void Backend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& scratch) {
    matmul(x, w, Tensor(), scratch);
    add(scratch, residual);
}

}  // namespace peregrine
