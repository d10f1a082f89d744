// Block layouts and scalar dequantization (core/quant.h), and the 16-bit float conversions
// (core/half.h). Blocks are built byte by byte from the ggml layouts, and the expected values
// are computed here by formula, independently of quant.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/quant.h"

namespace peregrine {
namespace {

constexpr uint16_t kF16Half = 0x3800;       // 0.5
constexpr uint16_t kF16Quarter = 0x3400;    // 0.25
constexpr uint16_t kF16Eighth = 0x3000;     // 0.125
constexpr uint16_t kF16Sixteenth = 0x2C00;  // 0.0625

void put_u16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
    b[at] = static_cast<uint8_t>(v & 0xFF);
    b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n), std::nanf(""));
    dequantize_row(t, bytes.data(), out.data(), n);
    return out;
}

// --- Q8_0 -------------------------------------------------------------------------------

TEST(Quant, Q8_0HandBuilt) {
    // Two blocks: {d, 32 x int8}. Block 0: d = 0.5, qs[i] = 8i - 128; block 1: d = -0.25, qs[i] = 127 - i.
    std::vector<uint8_t> b(2 * 34);
    put_u16(b, 0, kF16Half);
    for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(8 * i - 128));
    put_u16(b, 34, 0xB400);  // -0.25
    for (int i = 0; i < 32; ++i) b[36 + i] = static_cast<uint8_t>(static_cast<int8_t>(127 - i));
    const auto y = dequant(DType::Q8_0, b, 64);
    for (int i = 0; i < 32; ++i) {
        EXPECT_EQ(y[i], 0.5f * static_cast<float>(8 * i - 128)) << i;
        EXPECT_EQ(y[32 + i], -0.25f * static_cast<float>(127 - i)) << i;
    }
    EXPECT_EQ(y[0], -64.0f);
    EXPECT_EQ(y[32], -31.75f);
}

TEST(Quant, DequantizeNeedsNoAlignment) {
    // The same Q8_0 block at an odd address must decode the same.
    std::vector<uint8_t> b(1 + 34);
    b[1] = kF16Quarter & 0xFF;
    b[2] = kF16Quarter >> 8;
    for (int i = 0; i < 32; ++i) b[3 + i] = static_cast<uint8_t>(i);
    float y[32];
    dequantize_row(DType::Q8_0, b.data() + 1, y, 32);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.25f * static_cast<float>(i));
}

// --- Q4_0 -------------------------------------------------------------------------------

TEST(Quant, Q4_0HandBuilt) {
    // {d, 16 bytes}: byte j = element j (low nibble) and element j + 16 (high nibble), value (q - 8) * d.
    std::vector<uint8_t> b(18);
    put_u16(b, 0, kF16Quarter);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const auto y = dequant(DType::Q4_0, b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], 0.25f * static_cast<float>(j - 8)) << j;
        EXPECT_EQ(y[j + 16], 0.25f * static_cast<float>(7 - j)) << j;
    }
    // Spot values by hand: byte 0 = 0xF0 -> element 0 is (0 - 8) * 0.25, element 16 is (15 - 8) * 0.25.
    EXPECT_EQ(y[0], -2.0f);
    EXPECT_EQ(y[16], 1.75f);
    EXPECT_EQ(y[15], 1.75f);  // byte 15 = 0x0F: low nibble 15
    EXPECT_EQ(y[31], -2.0f);
}

// --- Q4_K -------------------------------------------------------------------------------

// Packs 8 six-bit scales and mins into the 12 bytes of a Q4_K block: sub-blocks 0-3 in the low
// 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 with their low 4 bits in bytes
// 8-11 (scale low nibble, min high nibble) and their top 2 bits in the top bits of bytes 0-3
// (scales) and 4-7 (mins).
void pack_q4_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; ++j) {
        out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// A Q4_K block from 4-bit values q[256] (element order) and per-sub-block (of 32) scales and mins.
std::vector<uint8_t> make_q4_k(uint16_t d, uint16_t dmin, const uint8_t sc[8], const uint8_t m[8],
                               const uint8_t q[256]) {
    std::vector<uint8_t> b(144, 0);
    put_u16(b, 0, d);
    put_u16(b, 2, dmin);
    pack_q4_k_scales(sc, m, &b[4]);
    for (int e = 0; e < 256; ++e) {
        const int chunk = e / 64, w = e % 64;  // each 64 elements share 32 bytes: low nibbles, then high
        uint8_t& byte = b[16 + 32 * chunk + (w % 32)];
        byte = static_cast<uint8_t>(byte | (w < 32 ? q[e] : q[e] << 4));
    }
    return b;
}

TEST(Quant, Q4_KScaleMinUnpacking) {
    // Worked out by hand from the bit layout.
    const uint8_t s[12] = {0xC1, 0x02, 0x43, 0x84, 0x45, 0x86, 0x07, 0xC8, 0x9A, 0xBC, 0xDE, 0xF0};
    const uint8_t want_sc[8] = {1, 2, 3, 4, 58, 12, 30, 32};
    const uint8_t want_m[8] = {5, 6, 7, 8, 25, 43, 13, 63};
    for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0, m = 0;
        q4_k_scale_min(s, j, &sc, &m);
        EXPECT_EQ(sc, want_sc[j]) << j;
        EXPECT_EQ(m, want_m[j]) << j;
    }
    // And the packer used below inverts it for every 6-bit value.
    for (int v = 0; v < 64; ++v) {
        uint8_t sc[8], m[8], packed[12];
        for (int j = 0; j < 8; ++j) {
            sc[j] = static_cast<uint8_t>((v + 7 * j) & 63);
            m[j] = static_cast<uint8_t>((v * 5 + 11 * j + 3) & 63);
        }
        pack_q4_k_scales(sc, m, packed);
        for (int j = 0; j < 8; ++j) {
            uint8_t gsc = 0, gm = 0;
            q4_k_scale_min(packed, j, &gsc, &gm);
            ASSERT_EQ(gsc, sc[j]);
            ASSERT_EQ(gm, m[j]);
        }
    }
}

TEST(Quant, Q4_KHandBuiltSpotValues) {
    std::vector<uint8_t> b(144, 0);
    put_u16(b, 0, kF16Eighth);     // d = 0.125
    put_u16(b, 2, kF16Sixteenth);  // dmin = 0.0625
    const uint8_t s[12] = {0xC1, 0x02, 0x43, 0x84, 0x45, 0x86, 0x07, 0xC8, 0x9A, 0xBC, 0xDE, 0xF0};
    std::memcpy(&b[4], s, 12);
    b[16 + 0] = 0x5A;       // element 0 (sub-block 0): 10; element 32 (sub-block 1): 5
    b[16 + 64 + 3] = 0x7C;  // element 131 (sub-block 4): 12; element 163 (sub-block 5): 7
    const auto y = dequant(DType::Q4_K, b, 256);
    EXPECT_EQ(y[0], 0.125f * 1 * 10 - 0.0625f * 5);      // 0.9375
    EXPECT_EQ(y[32], 0.125f * 2 * 5 - 0.0625f * 6);      // 0.875
    EXPECT_EQ(y[131], 0.125f * 58 * 12 - 0.0625f * 25);  // 85.4375
    EXPECT_EQ(y[163], 0.125f * 12 * 7 - 0.0625f * 43);   // 7.8125
    EXPECT_EQ(y[1], -0.0625f * 5);                       // q = 0: just the min
    EXPECT_EQ(y[255], -0.0625f * 63);                    // sub-block 7's min is 63
    EXPECT_EQ(y[0], 0.9375f);
    EXPECT_EQ(y[131], 85.4375f);
}

TEST(Quant, Q4_KWholeBlocksByFormula) {
    std::mt19937 rng(42);
    const int nblocks = 3;
    std::vector<uint8_t> bytes;
    std::vector<float> want;
    for (int i = 0; i < nblocks; ++i) {
        uint8_t sc[8], m[8], q[256];
        for (int j = 0; j < 8; ++j) {
            sc[j] = static_cast<uint8_t>(rng() & 63);
            m[j] = static_cast<uint8_t>(rng() & 63);
        }
        sc[4 + i] = 63;  // make sure the top bits get exercised
        m[7 - i] = 48;
        for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(rng() & 15);
        const uint16_t d = f32_to_f16(0.01f * static_cast<float>(i + 1));
        const uint16_t dmin = f32_to_f16(0.003f * static_cast<float>(i + 2));
        const auto blk = make_q4_k(d, dmin, sc, m, q);
        bytes.insert(bytes.end(), blk.begin(), blk.end());
        for (int e = 0; e < 256; ++e) {
            const float dd = f16_to_f32(d) * sc[e / 32];
            const float mm = f16_to_f32(dmin) * m[e / 32];
            want.push_back(dd * static_cast<float>(q[e]) - mm);
        }
    }
    const auto y = dequant(DType::Q4_K, bytes, 256 * nblocks);
    for (size_t e = 0; e < want.size(); ++e) ASSERT_EQ(y[e], want[e]) << "element " << e;
}

// --- Q6_K -------------------------------------------------------------------------------

// A Q6_K block from 6-bit values q[256] (element order) and 16 int8 scales (one per 16 elements).
std::vector<uint8_t> make_q6_k(uint16_t d, const int8_t scales[16], const uint8_t q[256]) {
    std::vector<uint8_t> b(210, 0);
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, w = e % 128;  // half, position within it
        const int l = w % 32, quarter = w / 32;
        // Quarters 0, 1 use the low nibbles of ql[l], ql[l + 32]; quarters 2, 3 their high nibbles.
        uint8_t& lo = b[64 * h + l + (quarter & 1) * 32];
        lo = static_cast<uint8_t>(lo | ((q[e] & 0xF) << (quarter >= 2 ? 4 : 0)));
        uint8_t& hi = b[128 + 32 * h + l];
        hi = static_cast<uint8_t>(hi | ((q[e] >> 4) << (2 * quarter)));
    }
    for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(scales[s]);
    put_u16(b, 208, d);
    return b;
}

TEST(Quant, Q6_KHandBuiltSpotValues) {
    std::vector<uint8_t> b(210, 0);
    // Element l + 32k of a half takes ql[l] (k = 0, 2) or ql[l + 32] (k = 1, 3), low nibble for k < 2,
    // and bits 2k..2k+1 of qh[l]; scale index = element / 16.
    b[0] = 0x3A;    // ql[0]
    b[32] = 0x0F;   // ql[32]
    b[128] = 0xE4;  // qh[0] = 0b11'10'01'00
    auto* sc = reinterpret_cast<int8_t*>(&b[192]);
    sc[0] = -3;
    sc[2] = 7;
    sc[4] = 5;
    sc[6] = -8;
    put_u16(b, 208, kF16Half);
    // Second half: ql[64], qh[32], scales[8..16).
    b[64 + 1] = 0x21;        // element 129: low nibble 1; element 193: high nibble 2
    b[128 + 32 + 1] = 0x30;  // qh bits 4..5 = 3 -> element 193 gets high bits 3
    sc[8] = 2;
    sc[12] = 1;
    const auto y = dequant(DType::Q6_K, b, 256);
    EXPECT_EQ(y[0], (10 - 32) * 0.5f * -3);   // q = 0x0A | 0 << 4        -> 33
    EXPECT_EQ(y[32], (31 - 32) * 0.5f * 7);   // q = 0x0F | 1 << 4 = 31   -> -3.5
    EXPECT_EQ(y[64], (35 - 32) * 0.5f * 5);   // q = 0x03 | 2 << 4 = 35   -> 7.5
    EXPECT_EQ(y[96], (48 - 32) * 0.5f * -8);  // q = 0x00 | 3 << 4 = 48   -> -64
    EXPECT_EQ(y[0], 33.0f);
    EXPECT_EQ(y[96], -64.0f);
    EXPECT_EQ(y[129], (1 - 32) * 0.5f * 2);   // -31
    EXPECT_EQ(y[193], (50 - 32) * 0.5f * 1);  // q = 2 | 3 << 4 = 50 -> 9
    EXPECT_EQ(y[1], (0 - 32) * 0.5f * -3);    // all-zero bits -> q = 0
}

TEST(Quant, Q6_KWholeBlocksByFormula) {
    std::mt19937 rng(7);
    const int nblocks = 3;
    std::vector<uint8_t> bytes;
    std::vector<float> want;
    for (int i = 0; i < nblocks; ++i) {
        int8_t scales[16];
        uint8_t q[256];
        for (int s = 0; s < 16; ++s) scales[s] = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
        for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>(rng() & 63);
        q[5] = 63;
        q[200] = 0;
        const uint16_t d = f32_to_f16(0.02f / static_cast<float>(i + 1));
        const auto blk = make_q6_k(d, scales, q);
        bytes.insert(bytes.end(), blk.begin(), blk.end());
        for (int e = 0; e < 256; ++e) {
            want.push_back(f16_to_f32(d) * static_cast<float>(scales[e / 16]) * static_cast<float>(q[e] - 32));
        }
    }
    const auto y = dequant(DType::Q6_K, bytes, 256 * nblocks);
    for (size_t e = 0; e < want.size(); ++e) ASSERT_EQ(y[e], want[e]) << "element " << e;
}

// --- plain types ------------------------------------------------------------------------

TEST(Quant, PlainTypes) {
    const float f[3] = {1.5f, -0.0f, 3e38f};
    std::vector<uint8_t> b(sizeof f);
    std::memcpy(b.data(), f, sizeof f);
    auto y = dequant(DType::F32, b, 3);
    EXPECT_EQ(std::memcmp(y.data(), f, sizeof f), 0);

    b.assign(6, 0);
    put_u16(b, 0, 0x3C00);  // 1.0
    put_u16(b, 2, 0xC000);  // -2.0
    put_u16(b, 4, 0x0001);  // 2^-24
    y = dequant(DType::F16, b, 3);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -2.0f);
    EXPECT_EQ(y[2], std::ldexp(1.0f, -24));

    put_u16(b, 0, 0x3F80);  // 1.0
    put_u16(b, 2, 0xC040);  // -3.0
    put_u16(b, 4, 0x7F80);  // inf
    y = dequant(DType::BF16, b, 3);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -3.0f);
    EXPECT_EQ(y[2], std::numeric_limits<float>::infinity());
}

// --- Q8_0 quantization ------------------------------------------------------------------

TEST(Quant, Q8_0RoundTripErrorBound) {
    std::mt19937 rng(123);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t n = 32 * 64;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = dist(rng) * (1.0f + static_cast<float>(i / 32));  // scale varies by block
    std::vector<uint8_t> q(dtype_row_bytes(DType::Q8_0, n) + 1);
    quantize_row_q8_0(x.data(), q.data() + 1, n);  // an odd address on purpose
    std::vector<float> y(n);
    dequantize_row(DType::Q8_0, q.data() + 1, y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        const float d = amax / 127.0f;
        for (int j = 0; j < 32; ++j) {
            // Half a step of rounding plus the f16 rounding of d (2^-11 relative) over |q| <= 127.
            ASSERT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), d * (0.5f + 127.0f / 2048.0f) + 1e-7f)
                << "block " << b << " element " << j;
        }
    }
}

TEST(Quant, Q8_0QuantizeExactCases) {
    // A block whose values are exact multiples of a power-of-two step round-trips exactly.
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) * 0.25f;
    x[3] = 31.75f;  // max |x| = 127 * 0.25
    uint8_t q[34];
    quantize_row_q8_0(x, q, 32);
    uint16_t d;
    std::memcpy(&d, q, 2);
    EXPECT_EQ(d, kF16Quarter);
    EXPECT_EQ(static_cast<int8_t>(q[2 + 3]), 127);
    EXPECT_EQ(static_cast<int8_t>(q[2 + 0]), -16);
    float y[32];
    dequantize_row(DType::Q8_0, q, y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]) << j;

    // All zeros: d = 0 and q = 0, no division by zero.
    float z[32] = {};
    quantize_row_q8_0(z, q, 32);
    for (int i = 0; i < 34; ++i) EXPECT_EQ(q[i], 0) << i;

    // Rounding is half away from zero: with d = 1 (max 127), 2.5 -> 3 and -2.5 -> -3.
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = -127.0f;
    quantize_row_q8_0(x, q, 32);
    EXPECT_EQ(static_cast<int8_t>(q[2 + 1]), 3);
    EXPECT_EQ(static_cast<int8_t>(q[2 + 2]), -3);
    EXPECT_EQ(static_cast<int8_t>(q[2 + 3]), -127);
}

// --- f16 / bf16 -------------------------------------------------------------------------

TEST(HalfFloat, F16EveryBitPatternRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = f16_to_f32(static_cast<uint16_t>(h));
        const uint16_t back = f32_to_f16(f);
        if (std::isnan(f)) {
            ASSERT_TRUE(std::isnan(f16_to_f32(back))) << std::hex << h;
            ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
        } else {
            ASSERT_EQ(back, h) << std::hex << h;
        }
    }
}

TEST(HalfFloat, F16KnownValues) {
    EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
    EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
    EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
    EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
    EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
    EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));

    EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
    EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
    EXPECT_EQ(f32_to_f16(std::nanf("")) & 0x7C00, 0x7C00);
    EXPECT_NE(f32_to_f16(std::nanf("")) & 0x03FF, 0);
    // Rounding to nearest even between normals: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
    EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);  // just above half
    // Overflow: 65519 rounds down to 65504; 65520 (halfway to 2^16) rounds to even, i.e. infinity.
    EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
    EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
    EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
    // Subnormals and underflow, rounding half to even in units of 2^-24.
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // 0.5 unit -> 0
    EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units -> 2
    EXPECT_EQ(f32_to_f16(std::ldexp(5.0f, -25)), 0x0002);  // 2.5 units -> 2
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);
    EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -24)), 0x8001);
    EXPECT_EQ(f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400);  // 1023.5 units carries into the smallest normal
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
}

TEST(HalfFloat, Bf16EveryBitPatternRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = bf16_to_f32(static_cast<uint16_t>(h));
        const uint16_t back = f32_to_bf16(f);
        if (std::isnan(f)) {
            ASSERT_TRUE(std::isnan(bf16_to_f32(back))) << std::hex << h;
        } else {
            ASSERT_EQ(back, h) << std::hex << h;
        }
    }
}

TEST(HalfFloat, Bf16KnownValues) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // halfway: to even
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // halfway: to even (up)
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
    EXPECT_EQ(f32_to_bf16(std::ldexp(1.0f, -133)), 0x0001);  // bf16 subnormals are exact
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
    // A NaN whose payload lives only in the low 16 bits must not turn into infinity.
    uint32_t snan_bits = 0x7F800001u;
    float snan;
    std::memcpy(&snan, &snan_bits, 4);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(snan))));
    EXPECT_EQ(bf16_to_f32(0xC0A0), -5.0f);
}

}  // namespace
}  // namespace peregrine

namespace peregrine {
namespace {

// The host's E4M3 conversions (the FP8 weights' reference): every finite code decodes and
// encodes back to itself, the landmarks of the format, and round-half-to-even with saturation.
TEST(Fp8E4M3, CodesRoundTripAndRound) {
    for (int b = 0; b < 256; ++b) {
        if ((b & 0x7f) == 0x7f) {
            EXPECT_TRUE(std::isnan(f8e4m3_to_f32(static_cast<uint8_t>(b))));
            continue;
        }
        EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(b))), b) << b;
    }
    EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(f8e4m3_to_f32(0x08), 0.015625f);     // smallest normal, 2^-6
    EXPECT_EQ(f8e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal, 2^-9
    EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
    EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);  // halfway 1 | 1.125: to the even mantissa
    EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);  // halfway 1.125 | 1.25: to 1.25
    EXPECT_EQ(f32_to_f8e4m3(1.07f), 0x39);
    EXPECT_EQ(f32_to_f8e4m3(0.0029296875f), 0x02);  // 1.5 subnormal steps: to 2
    EXPECT_EQ(f32_to_f8e4m3(0.0146484375f), 0x08);  // 7.5 steps: carries into the smallest normal
    EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);        // saturates
    EXPECT_EQ(f32_to_f8e4m3(-1000.0f), 0xfe);
    EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);
    EXPECT_EQ(f32_to_f8e4m3(std::nanf("")), 0x7f);
    EXPECT_EQ(f32_to_f8e4m3(1e-9f), 0x00);
}

}  // namespace
}  // namespace peregrine
