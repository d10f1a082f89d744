// The FP8 KV-cache format (core/kv_fp8.h) and the CPU backend's FP8 cache writes and reads: the
// reference the CUDA kernels are checked against.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/half.h"
#include "core/kv_fp8.h"

namespace peregrine {
namespace {

// Largest |x - read back| the format allows for a head of scale s: half an E4M3 step (2^-4 of
// the value's power of two) for normal codes, half the subnormal step (2^-10 s) below them.
float allowed_error(float x, float s) {
    return std::max(std::fabs(x) * 0.0625f, s * 0.0009765625f) * 1.0001f;
}

std::vector<float> random_head(std::mt19937& rng, int d, float scale) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> x(d);
    for (float& v : x) v = dist(rng);
    return x;
}

TEST(KvFp8, RoundTripIsWithinHalfAStepAndExactlyCodeTimesScale) {
    std::mt19937 rng(7);
    for (const float magnitude : {1e-3f, 1.0f, 30.0f, 1e4f}) {
        for (const int d : {8, 64, 128}) {
            for (int trial = 0; trial < 20; ++trial) {
                const std::vector<float> x = random_head(rng, d, magnitude);
                std::vector<uint8_t> codes(d);
                uint16_t scale = 0;
                kv_fp8_quantize_head(x.data(), d, codes.data(), &scale);
                float amax = 0;
                for (float v : x) amax = std::max(amax, std::fabs(v));
                EXPECT_EQ(scale, f32_to_bf16(amax / 448.0f)) << "the scale is amax / 448 rounded to bf16";
                const float s = bf16_to_f32(scale);
                std::vector<float> back(d);
                kv_fp8_dequantize_head(codes.data(), scale, d, back.data());
                int top = 0;
                for (int i = 0; i < d; ++i) {
                    EXPECT_EQ(back[i], f8e4m3_to_f32(codes[i]) * s) << "read back is code * scale";
                    EXPECT_LE(std::fabs(back[i] - x[i]), allowed_error(x[i], s)) << x[i] << " scale " << s;
                    top = std::max(top, codes[i] & 0x7f);
                }
                EXPECT_GE(top, 0x7d) << "the largest value uses the top of the E4M3 range";
                EXPECT_LE(top, 0x7e) << "no NaN code";
            }
        }
    }
}

TEST(KvFp8, ZeroHeadHasScaleOneAndZeroCodes) {
    std::vector<float> x(64, 0.0f);
    x[5] = -0.0f;
    std::vector<uint8_t> codes(64, 0xaa);
    uint16_t scale = 0;
    kv_fp8_quantize_head(x.data(), 64, codes.data(), &scale);
    EXPECT_EQ(bf16_to_f32(scale), 1.0f);
    std::vector<float> back(64, 1.0f);
    kv_fp8_dequantize_head(codes.data(), scale, 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
    // A magnitude whose scale underflows bf16's range also reads back as zeros, never NaN.
    std::vector<float> tiny(64, 1e-44f);
    kv_fp8_quantize_head(tiny.data(), 64, codes.data(), &scale);
    EXPECT_EQ(bf16_to_f32(scale), 1.0f);
    kv_fp8_dequantize_head(codes.data(), scale, 64, back.data());
    for (float v : back) EXPECT_EQ(v, 0.0f);
}

TEST(KvFp8, ExactlyRepresentableHeadsRoundTripExactly) {
    // Values that are E4M3 values times a bf16 scale come back bit for bit.
    std::vector<float> x = {448.0f, -448.0f, 0.5f, -0.015625f, 0.001953125f, 240.0f, 3.5f, 0.0f};
    for (float& v : x) v *= 0.25f;  // scale 0.25 = 112 / 448
    std::vector<uint8_t> codes(x.size());
    uint16_t scale = 0;
    kv_fp8_quantize_head(x.data(), static_cast<int64_t>(x.size()), codes.data(), &scale);
    EXPECT_EQ(bf16_to_f32(scale), 0.25f);
    std::vector<float> back(x.size());
    kv_fp8_dequantize_head(codes.data(), scale, static_cast<int64_t>(x.size()), back.data());
    EXPECT_EQ(back, x);
}

TEST(KvFp8, BlockLayoutIsCodesThenScales) {
    const KvFp8Layout f{16, 4, 64};
    EXPECT_EQ(f.block_bytes(), 16 * 4 * 66);
    EXPECT_EQ(f.code_bytes(), 16 * 4 * 64);
    EXPECT_EQ(f.code_offset(0, 0), 0);
    EXPECT_EQ(f.code_offset(1, 2), (4 + 2) * 64);
    EXPECT_EQ(f.code_offset(16 * 3 + 5, 1), 3 * f.block_bytes() + (5 * 4 + 1) * 64);
    EXPECT_EQ(f.scale_offset(16 * 3 + 5, 1), 3 * f.block_bytes() + f.code_bytes() + (5 * 4 + 1) * 2);
    EXPECT_EQ(f.scale_offset(16 * 3 + 15, 3) + 2, 4 * f.block_bytes()) << "the last scale ends the block";
    Tensor t(nullptr, DType::F8_E4M3, {3, 16, 4, 66});
    const KvFp8Layout g = kv_fp8_layout(t);
    EXPECT_EQ(g.head_dim, 64);
    EXPECT_EQ(static_cast<int64_t>(t.nbytes()) / t.dim(0), g.block_bytes());
}

// A paged cache pair of both kinds over the same values: FP8 codes and the f32 values they read
// back as, every slot filled from random heads of varying magnitude.
struct CachePair {
    CpuBackend& be;
    Tensor k8, v8, k32, v32;
    CachePair(CpuBackend& b, int blocks, int bs, int kvh, int d, uint32_t seed) : be(b) {
        k8 = be.allocate(DType::F8_E4M3, {blocks, bs, kvh, kv_fp8_cols(d)});
        v8 = be.allocate(DType::F8_E4M3, {blocks, bs, kvh, kv_fp8_cols(d)});
        k32 = be.allocate(DType::F32, {blocks, bs, kvh, d});
        v32 = be.allocate(DType::F32, {blocks, bs, kvh, d});
        const KvFp8Layout f = kv_fp8_layout(k8);
        std::mt19937 rng(seed);
        for (int64_t slot = 0; slot < int64_t{blocks} * bs; ++slot) {
            for (int h = 0; h < kvh; ++h) {
                for (const auto& [c8, c32] : {std::pair{k8, k32}, std::pair{v8, v32}}) {
                    const std::vector<float> x = random_head(rng, d, slot % 5 == 0 ? 4.0f : 0.7f);
                    uint8_t* base = c8.ptr<uint8_t>();
                    uint16_t* scale = reinterpret_cast<uint16_t*>(base + f.scale_offset(slot, h));
                    kv_fp8_quantize_head(x.data(), d, base + f.code_offset(slot, h), scale);
                    kv_fp8_dequantize_head(base + f.code_offset(slot, h), *scale, d,
                                           c32.ptr<float>() + (slot * kvh + h) * d);
                }
            }
        }
    }
    ~CachePair() {
        for (Tensor* t : {&k8, &v8, &k32, &v32}) be.release(*t);
    }
};

// Sequences of (query length, context length): prefill, chunked prefill and decode together.
BatchInput mixed_batch(int blocks_per_seq, int bs) {
    const std::vector<std::pair<int, int>> seqs = {{1, 37}, {9, 9}, {12, 50}, {1, 1}, {1, 64}};
    BatchInput b;
    b.max_blocks_per_seq = blocks_per_seq;
    b.query_start.push_back(0);
    int next_block = 0;
    for (const auto& [q, ctx] : seqs) {
        for (int i = 0; i < q; ++i) {
            const int pos = ctx - q + i;
            b.token_ids.push_back(0);
            b.positions.push_back(pos);
            b.slot_mapping.push_back(-1);  // attention only: nothing is written
        }
        // Blocks of this sequence in reverse order: the table is a real indirection.
        for (int i = 0; i < blocks_per_seq; ++i) b.block_tables.push_back(next_block + blocks_per_seq - 1 - i);
        next_block += blocks_per_seq;
        b.context_lens.push_back(ctx);
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    }
    (void)bs;
    return b;
}

TEST(KvFp8, CpuAttentionOnFp8EqualsAttentionOnTheValuesItReadsBack) {
    CpuBackend be(2);
    const int bs = 16, blocks_per_seq = 4, kvh = 2, heads = 6;
    for (const int d : {64, 24}) {  // the head-size kernel and the any-size one
        CachePair c(be, 5 * blocks_per_seq, bs, kvh, d, 11 + d);
        const BatchInput b = mixed_batch(blocks_per_seq, bs);
        const int64_t n = b.num_tokens();
        Tensor q = be.allocate(DType::F32, {n, heads * d});
        std::mt19937 rng(3);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        for (int64_t i = 0; i < q.numel(); ++i) q.ptr<float>()[i] = dist(rng);
        Tensor out8 = be.allocate(DType::F32, {n, heads * d}), out32 = be.allocate(DType::F32, {n, heads * d});
        for (const int window : {0, 20}) {
            const float scale = 1.0f / std::sqrt(static_cast<float>(d));
            be.attention(q, c.k8, c.v8, b, heads, d, scale, window, out8);
            be.attention(q, c.k32, c.v32, b, heads, d, scale, window, out32);
            EXPECT_EQ(std::memcmp(out8.data, out32.data, out8.nbytes()), 0) << "head_dim " << d << " window " << window;
        }
        for (Tensor* t : {&q, &out8, &out32}) be.release(*t);
    }
}

TEST(KvFp8, CpuCacheWriteQuantizesEachRotatedHead) {
    CpuBackend be(2);
    const int d = 32, kvh = 2, heads = 4, bs = 4, blocks = 3;
    RopeTable rope;
    rope.rotary_dim = d;
    for (int i = 0; i < d / 2; ++i) rope.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / d));
    BatchInput b;
    b.max_blocks_per_seq = blocks;
    b.query_start = {0, 5};
    for (int t = 0; t < 5; ++t) {
        b.token_ids.push_back(0);
        b.positions.push_back(t);
        b.slot_mapping.push_back(t == 3 ? 11 : t);  // any slots
    }
    b.context_lens = {5};
    b.block_tables = {0, 1, 2};
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    auto filled = [&](int64_t cols) {
        Tensor t = be.allocate(DType::F32, {5, cols});
        for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
        return t;
    };
    Tensor q = filled(heads * d), k = filled(kvh * d), v = filled(kvh * d);
    Tensor q2 = be.allocate(DType::F32, {5, heads * d}), k2 = be.allocate(DType::F32, {5, kvh * d});
    std::memcpy(q2.data, q.data, q.nbytes());
    std::memcpy(k2.data, k.data, k.nbytes());
    Tensor k32 = be.allocate(DType::F32, {blocks, bs, kvh, d}), v32 = be.allocate(DType::F32, {blocks, bs, kvh, d});
    Tensor k8 = be.allocate(DType::F8_E4M3, {blocks, bs, kvh, d + 2});
    Tensor v8 = be.allocate(DType::F8_E4M3, {blocks, bs, kvh, d + 2});
    be.rope_and_cache(q, k, v, b, rope, d, k32, v32);
    be.rope_and_cache(q2, k2, v, b, rope, d, k8, v8);
    EXPECT_EQ(std::memcmp(q.data, q2.data, q.nbytes()), 0) << "q is rotated the same";
    const KvFp8Layout f = kv_fp8_layout(k8);
    for (int t = 0; t < 5; ++t) {
        const int slot = b.slot_mapping[t];
        for (int h = 0; h < kvh; ++h) {
            for (const auto& [c32, c8] : {std::pair{k32, k8}, std::pair{v32, v8}}) {
                std::vector<uint8_t> codes(d);
                uint16_t scale = 0;
                kv_fp8_quantize_head(c32.ptr<float>() + (int64_t{slot} * kvh + h) * d, d, codes.data(), &scale);
                const uint8_t* base = c8.ptr<uint8_t>();
                EXPECT_EQ(std::memcmp(base + f.code_offset(slot, h), codes.data(), d), 0) << t << " " << h;
                uint16_t stored;
                std::memcpy(&stored, base + f.scale_offset(slot, h), 2);
                EXPECT_EQ(stored, scale);
            }
        }
    }
    for (Tensor* t : {&q, &k, &v, &q2, &k2, &k32, &v32, &k8, &v8}) be.release(*t);
}

TEST(KvFp8, CpuBlockCopiesMoveScalesWithCodes) {
    CpuBackend be(1);
    CachePair c(be, 4, 16, 2, 64, 9);
    const size_t block = c.k8.nbytes() / 4;
    std::vector<uint8_t> want(c.k8.ptr<uint8_t>() + block, c.k8.ptr<uint8_t>() + 2 * block);
    be.copy_blocks(c.k8, {{1, 3}});
    EXPECT_EQ(std::memcmp(c.k8.ptr<uint8_t>() + 3 * block, want.data(), block), 0);
}

}  // namespace
}  // namespace peregrine
