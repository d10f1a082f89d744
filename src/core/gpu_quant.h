// Repacking of GGUF block-quantized matrices into the GQ device layouts (core/dtype.h) that the
// CUDA decode kernels read, and the scalar reference reader of those layouts.
//
// Q8_0 -> GQ8_32 and Q4_0 -> GQ4_32 are exact (Q4_0's x = d (q - 8) becomes q * d - 8d). Q4_K
// and Q6_K fold the super-block scale into each sub-block's factor, rounded to f16 (nearest
// even): x moves by at most 2^-11 of |code * scale| + |min| (f16 normal range).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace peregrine {

// Whether GGUF type `gguf` has a device layout (Q8_0, Q4_0, Q4_K, Q6_K).
bool has_gpu_layout(DType gguf);

// The device layout a GGUF type is repacked into: Q8_0 -> GQ8_32, Q6_K -> GQ8_16,
// Q4_0 / Q4_K -> GQ4_32; throws Error naming the dtype otherwise.
DType gpu_layout_of(DType gguf);

// Code bytes and factor bytes of one row of k elements (a multiple of t's block) in layout t;
// their sum is dtype_row_bytes(t, k).
size_t gpu_code_bytes(DType t, int64_t k);
size_t gpu_factor_bytes(DType t, int64_t k);

// Rows [row0, row0 + n) of host matrix `src` ([rows, k], dtype Q8_0, Q4_0, Q4_K or Q6_K, as in
// the GGUF file) repacked: their codes into `codes` (n * gpu_code_bytes bytes) and their factors
// into `factors` (n * gpu_factor_bytes bytes), row after row. The caller places them at the
// layout's offsets (row r's codes at r * gpu_code_bytes, its factors at rows * gpu_code_bytes +
// r * gpu_factor_bytes). Throws Error naming the dtype for other types (and for a q4_0 scale
// whose 8x overflows f16).
// `layout`: F32 (the default) means gpu_layout_of(src.dtype); Q6_K also repacks into GQ6_32.
void repack_rows(const Tensor& src, int64_t row0, int64_t n, uint8_t* codes, uint8_t* factors,
                 DType layout = DType::F32);

// Element (r, c) of a whole [rows, k] matrix in device layout t held in host memory (`data` as
// described in core/dtype.h), in f32: the reference the CUDA kernels are tested against.
float gpu_layout_value(DType t, const void* data, int64_t rows, int64_t k, int64_t r, int64_t c);

}  // namespace peregrine
