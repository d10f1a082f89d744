// Element types of tensors, including GGUF's block-quantized types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace peregrine {

enum class DType : uint8_t {
    F32,
    F16,
    BF16,
    I32,
    Q8_0,  // blocks of 32: f16 scale, 32 x int8
    Q4_0,  // blocks of 32: f16 scale, 16 bytes of 4-bit values (offset 8)
    Q4_K,  // super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit values
    Q6_K,  // super-blocks of 256: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 x int8 scales, f16 d
    // OCP FP8 E4M3 (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; max 448, no infinity).
    // As a weight it carries per-row factors in Tensor::scale: element = value * scale[row].
    F8_E4M3,
};

std::string_view dtype_name(DType t);

// Elements per block (1 for plain types) and bytes per block.
int64_t dtype_block_size(DType t);
int64_t dtype_block_bytes(DType t);
bool dtype_is_quantized(DType t);

// Bytes of `n` consecutive elements; `n` must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace peregrine
