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
    // Device layouts GGUF blocks are repacked into for the CUDA decode kernels (core/gpu_quant.h);
    // never in a file and never handed to the CPU backend. Each holds 16-byte chunks of codes with
    // one factor (GQ4_32: one factor pair) per chunk:
    GQ8_32,  // from Q8_0: int8 code q, f16 scale s per 32 elements; x = q * s
    GQ8_16,  // from Q6_K: int8 code c = q6 - 32 in [-32, 31], f16 scale s per 16 elements; x = c * s
    GQ4_32,  // from Q4_0 / Q4_K: 4-bit code q in [0, 15] (byte i: element 2i in the low nibble,
             // 2i + 1 in the high), f16 pair (scale, min) per 32 elements; x = q * scale - min
    // From Q6_K, 7 bits a value (GQ8_16: 9): the 6-bit q's low nibbles as GQ4_32's 16 bytes a
    // chunk of 32, its high 2 bits in 8 bytes a chunk, an f16 scale s per 16; x = (q - 32) * s.
    // A row's codes: its k / 2 low-nibble bytes, then its k / 4 high-bit bytes. High bits of
    // element 16h + 8i + 2b + o (i, o in {0, 1}, b in 0..3) of a chunk: bits 8b + 4i + 2o, +1 of
    // its 32-bit word h (little-endian), so the decode kernel assembles 4 codes with a shift and
    // a mask. Q6_K's CUDA layout (PEREGRINE_Q6K_LAYOUT=int8: GQ8_16 instead).
    GQ6_32,
    // A whole [rows, k] matrix in a GQ layout is one allocation of rows * dtype_row_bytes(t, k)
    // bytes: first the codes of every row ([rows, k * bits / 8] bytes, row-major: row r's codes
    // at r * k * bits / 8), then the factors of every row ([rows, k / block] f16, or f16 pairs
    // for GQ4_32, row-major). The factors start 16-byte aligned (k is a multiple of the block).
    // So Tensor::nbytes() is the allocation's size, but Tensor::row(r) does not address a row.
};

std::string_view dtype_name(DType t);

// Elements per block (1 for plain types) and bytes per block.
int64_t dtype_block_size(DType t);
int64_t dtype_block_bytes(DType t);
bool dtype_is_quantized(DType t);   // true for GGUF block types and the GQ device layouts
bool dtype_is_gpu_layout(DType t);  // GQ8_32, GQ8_16, GQ4_32, GQ6_32: not a GGUF file type

// Bytes of `n` consecutive elements; `n` must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

}  // namespace peregrine
