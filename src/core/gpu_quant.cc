#include "core/gpu_quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace peregrine {

namespace {

void put_f16(uint8_t* dst, uint16_t h) {
    std::memcpy(dst, &h, 2);
}

uint16_t get_f16(const uint8_t* src) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    return h;
}

// One row of k elements: codes (k bytes) and factors (k / 32 f16) of a Q8_0 row. Exact.
void repack_q8_0(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* factors) {
    for (int64_t i = 0; i < k / kQK8_0; ++i) {
        const auto b = load_block<BlockQ8_0>(src, i);
        std::memcpy(codes + i * kQK8_0, b.qs, kQK8_0);
        put_f16(factors + 2 * i, b.d);
    }
}

// Q4_0 (byte j: element j low, j + 16 high; x = d (q - 8)) into 16 code bytes with elements 2i,
// 2i + 1 in byte i, and the pair (d, 8d): 8d is exact in f16 unless it overflows (|d| > 8188).
void repack_q4_0(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* factors) {
    for (int64_t i = 0; i < k / kQK4_0; ++i) {
        const auto b = load_block<BlockQ4_0>(src, i);
        uint8_t q[kQK4_0];
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            q[j] = b.qs[j] & 0xF;
            q[j + 16] = b.qs[j] >> 4;
        }
        for (int j = 0; j < kQK4_0 / 2; ++j) codes[i * 16 + j] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
        const uint16_t min = f32_to_f16(8.0f * f16_to_f32(b.d));
        if (!std::isfinite(f16_to_f32(min)) && std::isfinite(f16_to_f32(b.d)))
            fail("q4_0 scale ", f16_to_f32(b.d), " times 8 overflows f16");
        put_f16(factors + 4 * i, b.d);
        put_f16(factors + 4 * i + 2, min);
    }
}

// Q4_K: sub-block j of super-block i becomes one GQ4_32 block with scale f16(d * sc[j]) and
// min f16(dmin * m[j]); chunk c's low nibbles are sub-block 2c, its high nibbles 2c + 1.
void repack_q4_k(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* factors) {
    for (int64_t i = 0; i < k / kQK_K; ++i) {
        const auto b = load_block<BlockQ4_K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        for (int j = 0; j < 8; ++j) {
            const uint8_t* q = b.qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            uint8_t* out = codes + (i * 8 + j) * 16;
            for (int l = 0; l < 16; ++l) {
                const int lo = (q[2 * l] >> shift) & 0xF, hi = (q[2 * l + 1] >> shift) & 0xF;
                out[l] = static_cast<uint8_t>(lo | (hi << 4));
            }
            uint8_t sc, m;
            q4_k_scale_min(b.scales, j, &sc, &m);
            uint8_t* f = factors + (i * 8 + j) * 4;
            put_f16(f, f32_to_f16(d * static_cast<float>(sc)));
            put_f16(f + 2, f32_to_f16(dmin * static_cast<float>(m)));
        }
    }
}

// Q6_K: element e's 6-bit q becomes the int8 code q - 32; sub-block s of 16 (scales[s]) gets
// the factor f16(d * scales[s]). Layout of q: see BlockQ6_K.
void repack_q6_k(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* factors) {
    for (int64_t i = 0; i < k / kQK_K; ++i) {
        const auto b = load_block<BlockQ6_K>(src, i);
        const float d = f16_to_f32(b.d);
        q6_k_codes(b, reinterpret_cast<int8_t*>(codes + i * kQK_K));
        for (int s = 0; s < kQK_K / 16; ++s)
            put_f16(factors + (i * 16 + s) * 2, f32_to_f16(d * static_cast<float>(b.scales[s])));
    }
}

// GQ6_32: where element `in` (0..31) of a chunk keeps its high 2 bits, as a byte offset into the
// chunk's 8 high-bit bytes and a bit in that byte (core/dtype.h: bits 8b + 4i + 2o of word h).
struct HighBits {
    int byte, bit;
};
HighBits gq6_high_bits(int64_t in) {
    const int64_t ee = in % 16;
    const int b = static_cast<int>(8 * ((ee % 8) / 2) + 4 * (ee / 8) + 2 * (ee % 2));
    return {static_cast<int>(4 * (in / 16)) + b / 8, b % 8};
}

// Q6_K into GQ6_32: the same values as repack_q6_k's (q6 = code + 32, the same factors per 16),
// 7 bits a value (core/dtype.h).
void repack_q6_k_6bit(const uint8_t* src, int64_t k, uint8_t* codes, uint8_t* factors) {
    uint8_t* lo = codes;          // k / 2 bytes
    uint8_t* hi = codes + k / 2;  // k / 4 bytes: 8 a chunk of 32
    std::memset(hi, 0, static_cast<size_t>(k / 4));
    for (int64_t i = 0; i < k / kQK_K; ++i) {
        const auto b = load_block<BlockQ6_K>(src, i);
        const float d = f16_to_f32(b.d);
        int8_t c[kQK_K];
        q6_k_codes(b, c);
        for (int e = 0; e < kQK_K; ++e) {
            const int64_t x = i * kQK_K + e;  // element of the row
            const int q = c[e] + 32;          // [0, 63]
            lo[x / 2] = static_cast<uint8_t>((x % 2 == 0) ? (lo[x / 2] & 0xF0) | (q & 0xF)
                                                          : (lo[x / 2] & 0x0F) | ((q & 0xF) << 4));
            const HighBits at = gq6_high_bits(x % 32);
            uint8_t& byte = hi[(x / 32) * 8 + at.byte];
            byte = static_cast<uint8_t>(byte | ((q >> 4) << at.bit));
        }
        for (int s = 0; s < kQK_K / 16; ++s)
            put_f16(factors + (i * 16 + s) * 2, f32_to_f16(d * static_cast<float>(b.scales[s])));
    }
}

}  // namespace

bool has_gpu_layout(DType gguf) {
    return gguf == DType::Q8_0 || gguf == DType::Q4_0 || gguf == DType::Q4_K || gguf == DType::Q6_K;
}

DType gpu_layout_of(DType gguf) {
    switch (gguf) {
        case DType::Q8_0:
            return DType::GQ8_32;
        case DType::Q6_K:
            return DType::GQ8_16;
        case DType::Q4_0:
        case DType::Q4_K:
            return DType::GQ4_32;
        default:
            fail("no GPU layout for dtype ", dtype_name(gguf), " (only q8_0, q4_0, q4_k, q6_k are repacked)");
    }
}

size_t gpu_code_bytes(DType t, int64_t k) {
    if (!dtype_is_gpu_layout(t)) fail(dtype_name(t), " is not a GPU layout");
    PG_CHECK(k % dtype_block_size(t) == 0, k, " elements of ", dtype_name(t), " is not a whole number of blocks");
    return static_cast<size_t>(t == DType::GQ4_32 ? k / 2 : t == DType::GQ6_32 ? 3 * k / 4 : k);
}

size_t gpu_factor_bytes(DType t, int64_t k) {
    return dtype_row_bytes(t, k) - gpu_code_bytes(t, k);
}

void repack_rows(const Tensor& src, int64_t row0, int64_t n, uint8_t* codes, uint8_t* factors, DType layout) {
    const DType t = layout == DType::F32 ? gpu_layout_of(src.dtype) : layout;
    if (t != gpu_layout_of(src.dtype) && !(src.dtype == DType::Q6_K && t == DType::GQ6_32))
        fail("no repacking of ", dtype_name(src.dtype), " into ", dtype_name(t));
    const int64_t k = src.cols();
    PG_CHECK(row0 >= 0 && n >= 0 && row0 + n <= src.rows(), "rows ", row0, "+", n, " of ", src.shape_str());
    const size_t cb = gpu_code_bytes(t, k), fb = gpu_factor_bytes(t, k);
    for (int64_t r = 0; r < n; ++r) {
        const auto* s = static_cast<const uint8_t*>(src.row(row0 + r));
        uint8_t* c = codes + r * cb;
        uint8_t* f = factors + r * fb;
        switch (src.dtype) {
            case DType::Q8_0:
                repack_q8_0(s, k, c, f);
                break;
            case DType::Q4_0:
                repack_q4_0(s, k, c, f);
                break;
            case DType::Q4_K:
                repack_q4_k(s, k, c, f);
                break;
            default:  // Q6_K: gpu_layout_of let no other type through
                if (t == DType::GQ6_32)
                    repack_q6_k_6bit(s, k, c, f);
                else
                    repack_q6_k(s, k, c, f);
                break;
        }
    }
}

float gpu_layout_value(DType t, const void* data, int64_t rows, int64_t k, int64_t r, int64_t c) {
    PG_CHECK(r >= 0 && r < rows && c >= 0 && c < k, "element (", r, ", ", c, ") of [", rows, ", ", k, "]");
    const auto* codes = static_cast<const uint8_t*>(data);
    const uint8_t* factors = codes + rows * gpu_code_bytes(t, k);  // also checks t and k
    const int64_t block = dtype_block_size(t);
    const int64_t fi = r * (k / block) + c / block;  // index of the factor (pair)
    if (t == DType::GQ4_32) {
        const uint8_t byte = codes[r * (k / 2) + c / 2];
        const int q = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
        const float scale = f16_to_f32(get_f16(factors + 4 * fi)), min = f16_to_f32(get_f16(factors + 4 * fi + 2));
        return std::fma(static_cast<float>(q), scale, -min);  // one rounding, as the CUDA kernels do
    }
    if (t == DType::GQ6_32) {
        const uint8_t* row = codes + r * (3 * k / 4);
        const int lo = (c % 2 == 0) ? (row[c / 2] & 0xF) : (row[c / 2] >> 4);
        const HighBits at = gq6_high_bits(c % 32);
        const int q = lo | (((row[k / 2 + (c / 32) * 8 + at.byte] >> at.bit) & 3) << 4);
        return static_cast<float>(q - 32) * f16_to_f32(get_f16(factors + 2 * (r * (k / 16) + c / 16)));
    }
    const auto q = static_cast<int8_t>(codes[r * k + c]);  // GQ8_32, GQ8_16
    return static_cast<float>(q) * f16_to_f32(get_f16(factors + 2 * fi));
}

}  // namespace peregrine
