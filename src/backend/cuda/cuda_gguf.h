// GGUF matrices kept quantized on the GPU: the device layouts of core/gpu_quant.h seen as decode
// product weights. CudaBackend's placement and products of them are in cuda_gguf.cc.
#pragma once

#include "backend/cuda/cuda_kernels.h"
#include "core/tensor.h"

namespace peregrine {

// A placed device-layout matrix [m, k] as a decode product's weight: its codes, then its factors.
// first_row: the weight of rows [first_row, rows) (the same codes and factors, offset).
cuda::GemvWeight gguf_gemv_weight(const Tensor& w, int64_t first_row = 0);
// The decode kernels' kind of a product weight of this dtype: bf16, f8_e4m3, or a device layout.
cuda::GemvWeight::Kind gemv_kind(DType dtype);

}  // namespace peregrine
