#include "model/kv_cache.h"

#include "backend/backend.h"
#include "core/error.h"
#include "core/kv_fp8.h"

namespace peregrine {

namespace {
// The last dimension of a cache tensor: head_dim elements, or for FP8 head_dim code bytes and
// the head's 2-byte scale.
int64_t cache_cols(const KvCacheShape& s) {
    return s.dtype == DType::F8_E4M3 ? kv_fp8_cols(s.head_dim) : s.head_dim;
}
}  // namespace

size_t KvCacheShape::bytes_per_block() const {
    return static_cast<size_t>(num_layers) * 2 * block_size * num_kv_heads * cache_cols(*this) *
           static_cast<size_t>(dtype_block_bytes(dtype));
}

DType kv_cache_dtype_from_name(const std::string& name, DType native) {
    if (name == "auto") return native;
    if (name == "fp8" || name == "fp8_e4m3") return DType::F8_E4M3;
    if (name == "bf16" || name == "bfloat16") {
        if (native != DType::BF16)
            fail("--kv-cache-dtype ", name, ": this backend keeps its KV cache in ", dtype_name(native),
                 " (auto) or fp8, not bf16");
        return DType::BF16;
    }
    fail("--kv-cache-dtype must be auto, bf16 or fp8 (fp8_e4m3), got '", name, "'");
}

KvCache::KvCache(Backend& backend, const KvCacheShape& shape) : backend_(backend), shape_(shape) {
    for (int l = 0; l < shape.num_layers; ++l) {
        for (auto* list : {&k_, &v_}) {
            list->push_back(backend.allocate(
                shape.dtype, {shape.num_blocks, shape.block_size, shape.num_kv_heads, cache_cols(shape)}));
        }
    }
}

KvCache::~KvCache() {
    for (auto* list : {&k_, &v_})
        for (Tensor& t : *list) backend_.release(t);
}

}  // namespace peregrine
