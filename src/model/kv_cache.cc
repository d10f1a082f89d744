#include "model/kv_cache.h"

#include "backend/backend.h"

namespace peregrine {

size_t KvCacheShape::bytes_per_block() const {
    return static_cast<size_t>(num_layers) * 2 * block_size * num_kv_heads * head_dim *
           static_cast<size_t>(dtype_block_bytes(dtype));
}

KvCache::KvCache(Backend& backend, const KvCacheShape& shape) : backend_(backend), shape_(shape) {
    for (int l = 0; l < shape.num_layers; ++l) {
        for (auto* list : {&k_, &v_}) {
            list->push_back(backend.allocate(shape.dtype,
                                             {shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim}));
        }
    }
}

KvCache::~KvCache() {
    for (auto* list : {&k_, &v_})
        for (Tensor& t : *list) backend_.release(t);
}

}  // namespace peregrine
