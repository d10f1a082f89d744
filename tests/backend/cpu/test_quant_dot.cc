// The int8 path of quantized weights (backend/cpu/qkernels_impl.h), on every ISA table this
// machine runs: the activation quantization against its scalar reference (bit for bit), and
// qmatmul_rows on random blocks of each type against a double-precision dot of the dequantized
// weights (core/quant.h: dequantize_row) with
//   - the same 8-bit activations, to float rounding;
//   - the f32 activations, within the activation quantization's worst-case error.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace peregrine::cpu {
namespace {

std::vector<const Kernels*> runnable_kernels() {
    std::vector<const Kernels*> k;
    if (cpu_features().avx512 && cpu_features().avx512_vnni) k.push_back(&kernels_avx512());
    if (cpu_features().avx512) k.push_back(&kernels_avx512_no_vnni());
    if (cpu_features().avx2) k.push_back(&kernels_avx2());
    return k;
}

// 64-byte aligned bytes, as the backend hands them to the kernels.
struct Aligned {
    std::vector<uint8_t> buf;
    uint8_t* p;
    explicit Aligned(size_t n) : buf(n + 64) {
        p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
    }
};

uint16_t f16(float v) {
    return f32_to_f16(v);
}

// m rows of k values of type t with random bytes everywhere except the f16 scales, which get
// values of a realistic size (random bits there could be inf or NaN).
std::vector<uint8_t> random_weights(DType t, int64_t m, int64_t k, std::mt19937& rng) {
    const size_t row = dtype_row_bytes(t, k);
    std::vector<uint8_t> w(m * row);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> scale(0.002f, 0.02f);
    const int64_t block_bytes = dtype_block_bytes(t);
    for (size_t at = 0; at < w.size(); at += block_bytes) {
        uint8_t* blk = w.data() + at;
        auto put = [&](size_t off, float v) {
            const uint16_t h = f16(v);
            std::memcpy(blk + off, &h, 2);
        };
        switch (t) {
            case DType::Q8_0:
                put(0, scale(rng) * (byte(rng) & 1 ? 1.0f : -1.0f));
                if (byte(rng) < 8) blk[2 + byte(rng) % 32] = 0x80;  // -128 appears in some files
                break;
            case DType::Q4_0:
                put(0, scale(rng) * 8);
                break;
            case DType::Q4_K:
                put(0, scale(rng));
                put(2, scale(rng));
                break;
            case DType::Q6_K:
                put(208, scale(rng) / 4);
                break;
            default:
                ADD_FAILURE() << "not a quantized type";
        }
    }
    return w;
}

// Activations with the spread real ones have: mostly small, a few large outliers, some zero blocks.
std::vector<float> random_acts(int64_t n, int64_t k, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 99);
    std::vector<float> x(n * k);
    for (float& v : x) v = nd(rng) * (pick(rng) == 0 ? 30.0f : 1.0f);
    if (k >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // a block of zeros (scale 0)
    return x;
}

// Per element: the part of a dequantized weight that the kernels apply in f32 apart from the
// integer dot (Q4_K's min), for the rounding bound.
double q4_k_min_part(const uint8_t* row, int64_t i) {
    const uint8_t* blk = row + (i / 256) * 144;
    uint16_t dmin_bits;
    std::memcpy(&dmin_bits, blk + 2, 2);
    uint8_t sc, mn;
    q4_k_scale_min(blk + 4, static_cast<int>(i % 256 / 32), &sc, &mn);
    return std::fabs(f16_to_f32(dmin_bits) * mn);
}

struct Shape {
    int64_t n, k, m;
};

void check(const Kernels& kern, DType t, const Shape& s) {
    SCOPED_TRACE(::testing::Message() << kern.name << " " << kern.qmatmul_name << " " << dtype_name(t) << " n=" << s.n
                                      << " k=" << s.k << " m=" << s.m);
    std::mt19937 rng(static_cast<uint32_t>(s.n * 1000003 + s.k * 101 + s.m * 7 + static_cast<int>(t)));
    const std::vector<uint8_t> w = random_weights(t, s.m, s.k, rng);
    const std::vector<float> x = random_acts(s.n, s.k, rng);
    std::vector<float> bias(s.m), out(s.n * s.m, NAN);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : bias) v = nd(rng);

    // Quantized activations: the kernels' bytes equal the scalar reference's.
    const size_t stride = act_row_bytes(s.k);
    Aligned xq(s.n * stride), ref_q(stride);
    kern.quantize_acts(t, x.data(), s.n, s.k, xq.p);
    for (int64_t c = 0; c < s.n; ++c) {
        quantize_act_row(t, x.data() + c * s.k, s.k, ref_q.p);
        ASSERT_EQ(std::memcmp(xq.p + c * stride, ref_q.p, s.k * 3 / 2), 0) << "activation row " << c;
    }

    const size_t row = dtype_row_bytes(t, s.k);
    const MatmulArgs a{nullptr, s.n, s.k, w.data(), t, row, bias.data(), out.data(), s.m};
    // Split the rows unevenly at the kernels' alignment, as threads would.
    const int64_t align = kern.qmatmul_align(a);
    const int64_t split = std::min(s.m, (s.m / 3 + align - 1) / align * align);
    Aligned scratch(qmatmul_scratch_bytes(s.k));
    kern.qmatmul_rows(a, xq.p, 0, split, scratch.p);
    kern.qmatmul_rows(a, xq.p, split, s.m, scratch.p);

    std::vector<float> wr(s.k);
    for (int64_t r = 0; r < s.m; ++r) {
        const uint8_t* wrow = w.data() + r * row;
        dequantize_row(t, wrow, wr.data(), s.k);
        for (int64_t c = 0; c < s.n; ++c) {
            const ActRow xr = act_row(xq.p + c * stride, s.k);
            const float* xf = x.data() + c * s.k;
            double ref_q8 = bias[r], ref_f32 = bias[r], mag = std::fabs(bias[r]), qerr = 0;
            for (int64_t i = 0; i < s.k; ++i) {
                const double xd = static_cast<double>(xr.d[i / 32]) * xr.q[i];
                ref_q8 += wr[i] * xd;
                ref_f32 += static_cast<double>(wr[i]) * xf[i];
                mag += std::fabs(wr[i] * xd);
                if (t == DType::Q4_K) mag += 2 * q4_k_min_part(wrow, i) * std::fabs(xd);
                qerr += std::fabs(wr[i]) * xr.d[i / 32] * 0.5;  // |x - d q| <= d / 2
            }
            const float got = out[c * s.m + r];
            ASSERT_NEAR(got, ref_q8, 2e-6 * mag + 1e-6) << "same 8-bit activations, at (" << c << ", " << r << ")";
            ASSERT_NEAR(got, ref_f32, 1.001 * qerr + 2e-6 * mag + 1e-6)
                << "f32 activations, at (" << c << ", " << r << ")";
        }
    }
}

TEST(QuantDot, ActivationQuantizationRoundTrip) {
    // d * q is within d / 2 of x, d = max |x| / 127, ties to even, zero blocks stay zero.
    std::vector<float> x(64, 0.0f);
    for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.5f;
    x[5] = 0.1f;
    Aligned buf(act_row_bytes(64));
    quantize_act_row(DType::Q8_0, x.data(), 64, buf.p);
    const ActRow r = act_row(buf.p, 64);
    EXPECT_FLOAT_EQ(r.d[0], 8.0f / 127.0f);
    EXPECT_EQ(r.q[0], -127);
    EXPECT_EQ(r.d[1], 0.0f);
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
        EXPECT_LE(std::fabs(x[i] - r.d[0] * r.q[i]), r.d[0] * 0.5f + 1e-6f) << i;
        sum += r.q[i];
    }
    for (int i = 32; i < 64; ++i) EXPECT_EQ(r.q[i], 0);
    EXPECT_EQ(r.off[0], -128 * sum);
    EXPECT_EQ(r.off[1], 0);
    EXPECT_FLOAT_EQ(r.xs[0], r.d[0] * sum);
    quantize_act_row(DType::Q6_K, x.data(), 64, buf.p);
    int lo = 0;
    for (int i = 0; i < 16; ++i) lo += r.q[i];
    EXPECT_EQ(r.off[0], -32 * lo);
    EXPECT_EQ(r.off[1], -32 * (sum - lo));
    quantize_act_row(DType::Q4_K, x.data(), 64, buf.p);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.off[i], 0);
}

// Rows n = 1, 2, 3, 5, 17 (decode tiles, their remainders) and larger batches (prefill panels),
// odd m (row tiles and panels with a remainder), a split that is not at a panel boundary.
const Shape kShapes[] = {{1, 256, 7},   {2, 256, 33},  {3, 512, 5},   {5, 768, 17},
                         {17, 256, 50}, {40, 512, 37}, {64, 256, 16}, {9, 1024, 3}};

TEST(QuantDot, EveryTypeEveryIsa) {
    for (const Kernels* k : runnable_kernels()) {
        for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
            ASSERT_TRUE(qmatmul_supports(t));
            for (const Shape& s : kShapes) check(*k, t, s);
        }
    }
}

TEST(QuantDot, BlocksOf32Only) {
    // Q8_0 and Q4_0 rows need only whole blocks of 32.
    for (const Kernels* k : runnable_kernels())
        for (DType t : {DType::Q8_0, DType::Q4_0})
            for (const Shape& s : {Shape{1, 32, 3}, Shape{3, 96, 9}, Shape{20, 160, 19}}) check(*k, t, s);
}

}  // namespace
}  // namespace peregrine::cpu

namespace peregrine::cpu {
namespace {

// The f32-activation path (f32, bf16, f16 weights) gives every output the same bits whatever
// the batch: prefill's blocked GEMM and decode's tiles sum in the same order (chunked prefill
// and batching rely on it).
TEST(F32Matmul, BatchSizeDoesNotChangeBits) {
    for (const Kernels* kern : runnable_kernels()) {
        for (DType t : {DType::F32, DType::BF16, DType::F16}) {
            for (const Shape& s : {Shape{37, 1000, 53}, Shape{130, 64, 9}, Shape{9, 7, 5}}) {
                std::mt19937 rng(static_cast<uint32_t>(s.k + s.m));
                std::normal_distribution<float> nd(0.0f, 1.0f);
                const size_t row = dtype_row_bytes(t, s.k);
                std::vector<uint8_t> w(s.m * row);
                for (int64_t i = 0; i < s.m * s.k; ++i) {
                    const float v = nd(rng);
                    if (t == DType::F32) std::memcpy(w.data() + 4 * i, &v, 4);
                    const uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
                    if (t != DType::F32) std::memcpy(w.data() + 2 * i, &h, 2);
                }
                std::vector<float> x(s.n * s.k), bias(s.m), all(s.n * s.m), one(s.m);
                for (float& v : x) v = nd(rng);
                for (float& v : bias) v = nd(rng);
                const MatmulArgs a{x.data(), s.n, s.k, w.data(), t, row, bias.data(), all.data(), s.m};
                kern->matmul_rows(a, 0, s.m / 2);
                kern->matmul_rows(a, s.m / 2, s.m);
                for (int64_t c = 0; c < s.n; ++c) {
                    const MatmulArgs a1{x.data() + c * s.k, 1, s.k, w.data(), t, row, bias.data(), one.data(), s.m};
                    kern->matmul_rows(a1, 0, s.m);
                    ASSERT_EQ(std::memcmp(one.data(), all.data() + c * s.m, s.m * sizeof(float)), 0)
                        << kern->name << " " << dtype_name(t) << " token " << c << " of " << s.n;
                }
            }
        }
    }
}

// silu_mul's vector exp against the library's, over the range activations take and beyond.
TEST(F32Matmul, SiluMulMatchesScalar) {
    for (const Kernels* kern : runnable_kernels()) {
        std::vector<float> g, u;
        for (float v = -120.0f; v <= 120.0f; v += 0.0173f) {
            g.push_back(v);
            u.push_back(1.0f + 0.01f * v);
        }
        std::vector<float> out(g.size());
        kern->silu_mul(g.data(), u.data(), out.data(), static_cast<int64_t>(g.size()));
        for (size_t i = 0; i < g.size(); ++i) {
            const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
            ASSERT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << kern->name << " g=" << g[i];
        }
    }
}

// The matmuls' dynamic split: every index exactly once, pieces aligned, any thread count.
TEST(ThreadPoolDynamic, CoversEveryIndexOnce) {
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        for (int64_t n : {1, 15, 16, 17, 1000, 4864}) {
            for (int64_t align : {1, 4, 16}) {
                std::vector<std::atomic<int>> hits(n);
                pool.parallel_for_dynamic(
                    n,
                    [&](int64_t b, int64_t e) {
                        EXPECT_EQ(b % align, 0);
                        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
                    },
                    align);
                for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << align;
            }
        }
    }
}

}  // namespace
}  // namespace peregrine::cpu
