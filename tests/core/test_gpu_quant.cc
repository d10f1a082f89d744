// GGUF blocks repacked into the GQ device layouts (core/gpu_quant.h): every element read back
// through gpu_layout_value must equal dequantize_row of the source row (exactly where the
// repack is exact, else within the f16 rounding of the folded factors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/gpu_quant.h"
#include "core/half.h"
#include "core/quant.h"

namespace peregrine {
namespace {

// A random finite f16 with |x| in [1e-3, 1e-1] and a random sign.
uint16_t random_scale(std::mt19937& rng) {
    std::uniform_real_distribution<float> mag(1e-3f, 1e-1f);
    const float x = (rng() & 1) ? -mag(rng) : mag(rng);
    return f32_to_f16(x);
}

void put_u16(uint8_t* p, uint16_t v) {
    std::memcpy(p, &v, 2);
}

// The inverse of q4_k_scale_min: 8 (6-bit scale, 6-bit min) pairs into 12 bytes.
void pack_q4_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t* out) {
    for (int j = 0; j < 4; ++j) {
        out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// A [rows, k] host matrix of random valid blocks of type t (codes random bytes, scales as above).
std::vector<uint8_t> random_matrix(DType t, int64_t rows, int64_t k, std::mt19937& rng) {
    const int64_t nblocks = rows * k / dtype_block_size(t), bb = dtype_block_bytes(t);
    std::vector<uint8_t> m(static_cast<size_t>(nblocks * bb));
    for (auto& b : m) b = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < nblocks; ++i) {
        uint8_t* b = m.data() + i * bb;
        switch (t) {
            case DType::Q8_0:
            case DType::Q4_0:
                put_u16(b, random_scale(rng));
                break;
            case DType::Q4_K: {
                put_u16(b, random_scale(rng));
                put_u16(b + 2, random_scale(rng));
                uint8_t sc[8], mn[8];
                for (int j = 0; j < 8; ++j) sc[j] = rng() & 63, mn[j] = rng() & 63;
                pack_q4_k_scales(sc, mn, b + 4);
                for (int j = 0; j < 8; ++j) {  // the packing is the one the dequantizer reads
                    uint8_t s2, m2;
                    q4_k_scale_min(b + 4, j, &s2, &m2);
                    EXPECT_EQ(s2, sc[j]);
                    EXPECT_EQ(m2, mn[j]);
                }
                break;
            }
            case DType::Q6_K:
                put_u16(b + 208, random_scale(rng));
                break;
            default:
                ADD_FAILURE() << "not a GGUF quantized type";
        }
    }
    return m;
}

// The whole matrix in its device layout: codes of every row, then factors of every row.
std::vector<uint8_t> repack_whole(const Tensor& src, DType layout = DType::F32) {
    const DType g = layout == DType::F32 ? gpu_layout_of(src.dtype) : layout;
    const int64_t rows = src.rows(), k = src.cols();
    std::vector<uint8_t> out(static_cast<size_t>(rows) * dtype_row_bytes(g, k), 0xEE);
    repack_rows(src, 0, rows, out.data(), out.data() + rows * gpu_code_bytes(g, k), g);
    return out;
}

// Largest |code| of the layout each GGUF type goes to (Q6_K: c in [-32, 31]; Q4_K: q in [0, 15]).
float max_code(DType t) {
    return t == DType::Q6_K ? 32.0f : 15.0f;
}

TEST(GpuQuant, LayoutsAndSizes) {
    EXPECT_EQ(gpu_layout_of(DType::Q8_0), DType::GQ8_32);
    EXPECT_EQ(gpu_layout_of(DType::Q6_K), DType::GQ8_16);
    EXPECT_EQ(gpu_layout_of(DType::Q4_0), DType::GQ4_32);
    EXPECT_EQ(gpu_layout_of(DType::Q4_K), DType::GQ4_32);
    EXPECT_EQ(dtype_name(DType::GQ8_32), "gq8_32");
    EXPECT_EQ(dtype_name(DType::GQ8_16), "gq8_16");
    EXPECT_EQ(dtype_name(DType::GQ4_32), "gq4_32");
    for (DType t : {DType::GQ8_32, DType::GQ8_16, DType::GQ4_32, DType::GQ6_32}) {
        EXPECT_TRUE(dtype_is_quantized(t));
        EXPECT_TRUE(dtype_is_gpu_layout(t));
        EXPECT_EQ(gpu_code_bytes(t, 512) + gpu_factor_bytes(t, 512), dtype_row_bytes(t, 512));
    }
    EXPECT_FALSE(dtype_is_gpu_layout(DType::Q4_K));
    EXPECT_EQ(gpu_code_bytes(DType::GQ8_32, 256), 256u);
    EXPECT_EQ(gpu_factor_bytes(DType::GQ8_32, 256), 16u);  // 8 f16
    EXPECT_EQ(gpu_code_bytes(DType::GQ8_16, 256), 256u);
    EXPECT_EQ(gpu_factor_bytes(DType::GQ8_16, 256), 32u);  // 16 f16
    EXPECT_EQ(gpu_code_bytes(DType::GQ4_32, 256), 128u);
    EXPECT_EQ(gpu_factor_bytes(DType::GQ4_32, 256), 32u);  // 8 f16 pairs
}

// Every element of random matrices, k = 256 and 512. Q8_0 and Q4_0 repack exactly. Q4_K and
// Q6_K fold d into each sub-block's factor, rounded to nearest f16: the factors here are 0 or
// >= 1e-3 (normal f16), so each moves by at most 2^-11 of itself; the bound 2^-10 of
// (max |code| * |scale| + |min|) covers that plus the f32 rounding of both sides (2^-24 each),
// and is far below one quantization step (scale), which any misplaced code would cost.
TEST(GpuQuant, RepackMatchesDequantize) {
    std::mt19937 rng(1234);
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
        for (int64_t k : {256, 512}) {
            const int64_t rows = 5;
            std::vector<uint8_t> m = random_matrix(t, rows, k, rng);
            const Tensor src(m.data(), t, {rows, k});
            const std::vector<uint8_t> dev = repack_whole(src);
            const DType g = gpu_layout_of(t);
            std::vector<float> want(static_cast<size_t>(k));
            int64_t inexact = 0;
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_row(t, src.row(r), want.data(), k);
                for (int64_t c = 0; c < k; ++c) {
                    const float got = gpu_layout_value(g, dev.data(), rows, k, r, c);
                    const std::string where = std::string(dtype_name(t)) + " k=" + std::to_string(k) + " (" +
                                              std::to_string(r) + ", " + std::to_string(c) + ")";
                    if (t == DType::Q8_0 || t == DType::Q4_0) {
                        ASSERT_EQ(got, want[c]) << where;
                        continue;
                    }
                    // The exact factors, from the source block (super-block b, element e in it).
                    const uint8_t* blk = static_cast<const uint8_t*>(src.row(r)) + (c / kQK_K) * dtype_block_bytes(t);
                    const int e = static_cast<int>(c % kQK_K);
                    float scale, min = 0.0f;
                    if (t == DType::Q4_K) {
                        BlockQ4_K b;
                        std::memcpy(&b, blk, sizeof b);
                        uint8_t sc, mn;
                        q4_k_scale_min(b.scales, e / 32, &sc, &mn);
                        scale = f16_to_f32(b.d) * sc;
                        min = f16_to_f32(b.dmin) * mn;
                    } else {
                        BlockQ6_K b;
                        std::memcpy(&b, blk, sizeof b);
                        scale = f16_to_f32(b.d) * b.scales[e / 16];
                    }
                    const float bound = 0x1p-10f * (max_code(t) * std::fabs(scale) + std::fabs(min));
                    ASSERT_LE(std::fabs(got - want[c]), bound) << where << " got " << got << " want " << want[c];
                    inexact += got != want[c];
                }
            }
            if (t == DType::Q4_K || t == DType::Q6_K) {
                EXPECT_GT(inexact, 0) << "the f16 rounding should show";
            }
        }
    }
}

TEST(GpuQuant, RepackRowRangeMatchesWhole) {
    std::mt19937 rng(99);
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
        const int64_t rows = 7, k = 512, row0 = 2, n = 3;
        std::vector<uint8_t> m = random_matrix(t, rows, k, rng);
        const Tensor src(m.data(), t, {rows, k});
        const std::vector<uint8_t> whole = repack_whole(src);
        const DType g = gpu_layout_of(t);
        const size_t cb = gpu_code_bytes(g, k), fb = gpu_factor_bytes(g, k);
        std::vector<uint8_t> codes(n * cb, 0xAA), factors(n * fb, 0xAA);
        repack_rows(src, row0, n, codes.data(), factors.data());
        EXPECT_EQ(0, std::memcmp(codes.data(), whole.data() + row0 * cb, codes.size())) << dtype_name(t);
        EXPECT_EQ(0, std::memcmp(factors.data(), whole.data() + rows * cb + row0 * fb, factors.size()))
            << dtype_name(t);
    }
}

// Q6_K's 6-bit layout (GQ6_32) holds exactly GQ8_16's values, in 7 bits a value; a row range
// repacks as the whole; other types are refused into it.
TEST(GpuQuant, Q6KSixBitLayoutHoldsTheInt8LayoutsValues) {
    std::mt19937 rng(66);
    for (int64_t k : {256, 768}) {
        const int64_t rows = 5;
        std::vector<uint8_t> m = random_matrix(DType::Q6_K, rows, k, rng);
        const Tensor src(m.data(), DType::Q6_K, {rows, k});
        const std::vector<uint8_t> i8 = repack_whole(src), b6 = repack_whole(src, DType::GQ6_32);
        EXPECT_EQ(b6.size(), static_cast<size_t>(rows * k * 7 / 8));
        EXPECT_EQ(gpu_code_bytes(DType::GQ6_32, k), static_cast<size_t>(3 * k / 4));
        EXPECT_EQ(gpu_factor_bytes(DType::GQ6_32, k), static_cast<size_t>(k / 8));
        int64_t negative = 0, positive = 0;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < k; ++c) {
                const float want = gpu_layout_value(DType::GQ8_16, i8.data(), rows, k, r, c);
                ASSERT_EQ(gpu_layout_value(DType::GQ6_32, b6.data(), rows, k, r, c), want) << r << ", " << c;
                negative += want<0, positive += want> 0;
            }
        EXPECT_GT(negative, 0);
        EXPECT_GT(positive, 0);
        const int64_t row0 = 1, n = 3;
        const size_t cb = gpu_code_bytes(DType::GQ6_32, k), fb = gpu_factor_bytes(DType::GQ6_32, k);
        std::vector<uint8_t> codes(n * cb, 0xAA), factors(n * fb, 0xAA);
        repack_rows(src, row0, n, codes.data(), factors.data(), DType::GQ6_32);
        EXPECT_EQ(0, std::memcmp(codes.data(), b6.data() + row0 * cb, codes.size()));
        EXPECT_EQ(0, std::memcmp(factors.data(), b6.data() + rows * cb + row0 * fb, factors.size()));
    }
    std::vector<uint8_t> q4 = random_matrix(DType::Q4_K, 1, 256, rng);
    const Tensor q4k(q4.data(), DType::Q4_K, {1, 256});
    std::vector<uint8_t> out(256);
    EXPECT_THROW(repack_rows(q4k, 0, 1, out.data(), out.data() + 192, DType::GQ6_32), Error);
}

// A hand-built Q4_0 block: the nibble order changes (ggml: j | j + 16; GQ4_32: 2i | 2i + 1).
TEST(GpuQuant, Q4_0NibbleOrder) {
    BlockQ4_0 b;
    b.d = f32_to_f16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // e_j = j, e_{j+16} = 15 - j
    const Tensor src(&b, DType::Q4_0, {1, 32});
    const std::vector<uint8_t> dev = repack_whole(src);
    EXPECT_EQ(dev[0], 0x10);                                                     // elements 0, 1 = 0, 1
    EXPECT_EQ(dev[8], 0xEF);                                                     // elements 16, 17 = 15, 14
    EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(dev[16] | dev[17] << 8)), 0.5f);  // scale
    EXPECT_EQ(f16_to_f32(static_cast<uint16_t>(dev[18] | dev[19] << 8)), 4.0f);  // min = 8 d
    EXPECT_EQ(gpu_layout_value(DType::GQ4_32, dev.data(), 1, 32, 0, 17), 0.5f * (14 - 8));
}

template <typename F>
std::string error_of(F f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(GpuQuant, RejectsOtherTypes) {
    std::vector<uint8_t> data(4 * 256 * 4);
    uint8_t codes[4096], factors[4096];
    for (DType t : {DType::F32, DType::BF16}) {
        const Tensor src(data.data(), t, {4, 256});
        const std::string msg = error_of([&] { repack_rows(src, 0, 1, codes, factors); });
        EXPECT_NE(msg.find(dtype_name(t)), std::string::npos) << msg;
    }
    EXPECT_NE(error_of([] { gpu_layout_of(DType::F32); }).find("f32"), std::string::npos);
    EXPECT_NE(error_of([] { gpu_layout_of(DType::GQ8_32); }).find("gq8_32"), std::string::npos);
    EXPECT_NE(error_of([] { gpu_code_bytes(DType::Q8_0, 32); }).find("q8_0"), std::string::npos);
}

}  // namespace
}  // namespace peregrine
