// The CPU matmul kernels of every ISA this machine runs, for every weight dtype they read,
// against a double-precision reference on random data (odd shapes included).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "core/quant.h"

namespace peregrine::cpu {
namespace {

std::vector<const Kernels*> runnable_kernels() {
    std::vector<const Kernels*> k;
    if (cpu_features().avx512) k.push_back(&kernels_avx512());
    if (cpu_features().avx2) k.push_back(&kernels_avx2());
    return k;
}

// Random weights [m, k] stored as `t`.
std::vector<uint8_t> make_weights(DType t, int64_t m, int64_t k, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> w(m * k);
    for (float& v : w) v = nd(rng);
    const size_t row = dtype_row_bytes(t, k);
    std::vector<uint8_t> out(m * row);
    for (int64_t r = 0; r < m; ++r) {
        uint8_t* dst = out.data() + r * row;
        const float* src = w.data() + r * k;
        for (int64_t i = 0; i < k; ++i) {
            if (t == DType::F32) std::memcpy(dst + 4 * i, src + i, 4);
            if (t == DType::BF16 || t == DType::F16) {
                const uint16_t h = t == DType::BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
                std::memcpy(dst + 2 * i, &h, 2);
            }
        }
        if (t == DType::Q8_0) quantize_row_q8_0(src, dst, k);
    }
    return out;
}

struct Shape {
    int64_t n, k, m;
};

void check(const Kernels& kern, DType t, const Shape& s, bool bf16_inputs) {
    std::mt19937 rng(static_cast<uint32_t>(s.n * 1000003 + s.k * 101 + s.m));
    const std::vector<uint8_t> w = make_weights(t, s.m, s.k, rng);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(s.n * s.k), bias(s.m), out(s.n * s.m, NAN);
    for (float& v : x) v = nd(rng);
    for (float& v : bias) v = nd(rng);
    const size_t row = dtype_row_bytes(t, s.k);
    const MatmulArgs a{x.data(), s.n, s.k, w.data(), t, row, bias.data(), out.data(), s.m};
    std::vector<uint16_t> xb(x.size());
    if (bf16_inputs) {
        kern.to_bf16(x.data(), xb.data(), static_cast<int64_t>(x.size()));
        for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(xb[i], f32_to_bf16(x[i]));
        // Split the rows unevenly, as threads would.
        kern.matmul_bf16_rows(a, xb.data(), 0, s.m / 3);
        kern.matmul_bf16_rows(a, xb.data(), s.m / 3, s.m);
    } else {
        kern.matmul_rows(a, 0, s.m / 3);
        kern.matmul_rows(a, s.m / 3, s.m);
    }
    std::vector<float> wr(s.k);
    for (int64_t r = 0; r < s.m; ++r) {
        dequantize_row(t, w.data() + r * row, wr.data(), s.k);
        for (int64_t c = 0; c < s.n; ++c) {
            double ref = bias[r], mag = std::fabs(bias[r]);
            for (int64_t i = 0; i < s.k; ++i) {
                const double xv = bf16_inputs ? bf16_to_f32(xb[c * s.k + i]) : x[c * s.k + i];
                ref += static_cast<double>(wr[i]) * xv;
                mag += std::fabs(wr[i] * xv);
            }
            ASSERT_NEAR(out[c * s.m + r], ref, 1e-5 * mag + 1e-6)
                << kern.name << " " << dtype_name(t) << " n=" << s.n << " k=" << s.k << " m=" << s.m << " at (" << c
                << ", " << r << ")";
        }
    }
}

const Shape kShapes[] = {{1, 64, 7}, {3, 96, 9}, {5, 172, 13}, {70, 64, 8}, {4, 256, 16}, {9, 288, 5}};

TEST(CpuKernels, MatmulEveryDtypeEveryIsa) {
    for (const Kernels* k : runnable_kernels()) {
        for (DType t : {DType::F32, DType::BF16, DType::F16, DType::Q8_0}) {
            ASSERT_TRUE(matmul_supports(t));
            for (const Shape& s : kShapes) {
                if (s.k % dtype_block_size(t) != 0) continue;
                check(*k, t, s, false);
            }
        }
    }
}

TEST(CpuKernels, Bf16DotProducts) {
    if (!cpu_features().avx512_bf16) GTEST_SKIP() << "no AVX512-BF16";
    ASSERT_NE(kernels_avx512().matmul_bf16_rows, nullptr);
    for (const Shape& s : kShapes) check(kernels_avx512(), DType::BF16, s, true);
}

TEST(CpuKernels, DotAndAxpy) {
    for (const Kernels* k : runnable_kernels()) {
        for (int n : {1, 7, 8, 16, 33, 100}) {
            std::vector<float> a(n), b(n), y(n, 1.0f);
            double ref = 0;
            for (int i = 0; i < n; ++i) {
                a[i] = 0.5f * i - 3;
                b[i] = 1.0f / (i + 1);
                ref += static_cast<double>(a[i]) * b[i];
            }
            EXPECT_NEAR(k->dot(a.data(), b.data(), n), ref, 1e-4) << k->name << " n=" << n;
            k->axpy(2.0f, a.data(), y.data(), n);
            for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], 1.0f + 2.0f * a[i]);
        }
    }
}

}  // namespace
}  // namespace peregrine::cpu
