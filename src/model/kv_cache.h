// Paged KV cache storage: per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim].
// The block bookkeeping (tables, reference counts) lives in the engine; this only holds memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace peregrine {

class Backend;

struct KvCacheShape {
    int num_layers = 0;
    int num_blocks = 0;
    int block_size = 16;
    int num_kv_heads = 0;
    int head_dim = 0;
    DType dtype = DType::F32;  // the backend's kv_cache_dtype()

    size_t bytes_per_block() const;  // all layers, K and V
};

class KvCache {
  public:
    KvCache(Backend& backend, const KvCacheShape& shape);
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvCacheShape& shape() const { return shape_; }
    const Tensor& k(int layer) const { return k_[layer]; }  // [num_blocks, block_size, kv_heads, head_dim]
    const Tensor& v(int layer) const { return v_[layer]; }

  private:
    Backend& backend_;
    KvCacheShape shape_;
    std::vector<Tensor> k_, v_;
};

}  // namespace peregrine
