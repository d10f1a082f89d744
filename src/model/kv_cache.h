// Paged KV cache storage: per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]
// of the backend's kv_cache_dtype(), or for F8_E4M3 [num_blocks, block_size, num_kv_heads,
// head_dim + 2] bytes laid out as core/kv_fp8.h says (codes, then a bf16 scale per token and
// head). Either way each block is contiguous, so block copies and the host and disk tiers move
// blocks by bytes. The block bookkeeping (tables, reference counts) lives in the engine; this
// only holds memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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

// The KV cache's element type for --kv-cache-dtype `name` on a backend whose native type is
// `native` (f32 on the CPU, bf16 on CUDA): auto -> native; bf16 | bfloat16 -> bf16 where that is
// native; fp8 | fp8_e4m3 -> F8_E4M3. Anything else: Error naming the allowed values.
DType kv_cache_dtype_from_name(const std::string& name, DType native);

class KvCache {
  public:
    KvCache(Backend& backend, const KvCacheShape& shape);
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvCacheShape& shape() const { return shape_; }
    const Tensor& k(int layer) const { return k_[layer]; }  // see the top of the file
    const Tensor& v(int layer) const { return v_[layer]; }

  private:
    Backend& backend_;
    KvCacheShape shape_;
    std::vector<Tensor> k_, v_;
};

}  // namespace peregrine
