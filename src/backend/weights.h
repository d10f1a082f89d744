// The tensors of a llama-family model, as views into memory-mapped files or into buffers the
// loader converted. Matrices are [out_features, in_features] (rows contiguous).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace peregrine {

struct LayerWeights {
    Tensor attn_norm;       // [hidden] f32
    Tensor wq;              // [num_heads * head_dim, hidden]
    Tensor wk, wv;          // [num_kv_heads * head_dim, hidden]
    Tensor bq, bk, bv;      // [out] f32, empty without attention bias
    Tensor q_norm, k_norm;  // [head_dim] f32, empty without qk-norm
    Tensor wo;              // [hidden, num_heads * head_dim]
    Tensor ffn_norm;        // [hidden] f32
    Tensor w_gate, w_up;    // [intermediate, hidden]
    Tensor w_down;          // [hidden, intermediate]
    // Set instead of wq/wk/wv/bq/bk/bv and w_gate/w_up where the backend's place_layer stacks
    // them (one product each, fewer and larger launches on a GPU):
    Tensor wqkv;       // [q_dim + 2 kv_dim, hidden]: rows of wq, then wk, then wv
    Tensor bqkv;       // [q_dim + 2 kv_dim] f32 or empty
    Tensor w_gate_up;  // [2 intermediate, hidden]: rows of w_gate, then w_up
};

struct ModelWeights {
    Tensor embed;  // [vocab, hidden], any dtype (rows dequantized on lookup)
    std::vector<LayerWeights> layers;
    Tensor final_norm;  // [hidden] f32
    Tensor lm_head;     // [vocab, hidden]; the embedding itself when tied
};

}  // namespace peregrine
