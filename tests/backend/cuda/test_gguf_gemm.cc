// gguf_gemm (tensor-core products with GGUF device-layout weights) against a double-precision
// product of the layout's values rounded to bf16 (what dequantize_weight feeds cuBLASLt), every
// layout, row and token tails, one and several token tiles, split and unsplit k (and no partials
// buffer), f32 / bf16 out, beta 0 / 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gguf.h"
#include "backend/cuda/gguf_gemm.h"
#include "core/gpu_quant.h"
#include "core/half.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;

struct Case {
    DType type, layout;
};

// out = x . w^T over the layout's values rounded to bf16; bound[i]: sum of |terms| of element i.
void reference(const std::vector<uint8_t>& codes, DType layout, int m, int k, const std::vector<uint16_t>& x, int n,
               std::vector<double>& out, std::vector<double>& bound) {
    std::vector<float> w(static_cast<size_t>(k));
    out.assign(static_cast<size_t>(n) * m, 0.0);
    bound.assign(out.size(), 0.0);
    for (int r = 0; r < m; ++r) {
        for (int c = 0; c < k; ++c) w[c] = bf16_to_f32(f32_to_bf16(gpu_layout_value(layout, codes.data(), m, k, r, c)));
        for (int t = 0; t < n; ++t) {
            double s = 0, a = 0;
            for (int c = 0; c < k; ++c) {
                const double p = static_cast<double>(w[c]) * bf16_to_f32(x[static_cast<size_t>(t) * k + c]);
                s += p;
                a += std::fabs(p);
            }
            out[static_cast<size_t>(t) * m + r] = s;
            bound[static_cast<size_t>(t) * m + r] = a;
        }
    }
}

TEST(CudaGgufGemm, MatchesReferenceEveryLayout) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(31);
    const Case cases[] = {{DType::Q8_0, DType::GQ8_32},
                          {DType::Q4_0, DType::GQ4_32},
                          {DType::Q4_K, DType::GQ4_32},
                          {DType::Q6_K, DType::GQ8_16},
                          {DType::Q6_K, DType::GQ6_32}};
    // (m, k): a row tail and k split over many CTAs; many row blocks; the smallest k.
    const std::pair<int, int> shapes[] = {{130, 4096}, {1030, 1024}, {257, 256}};
    DeviceBuffer<float> partials(size_t{1} << 22);
    for (const Case& cs : cases) {
        for (auto [m, k] : shapes) {
            const std::vector<uint8_t> blocks = cuda_test::random_gguf_blocks(cs.type, m, k, rng);
            const Tensor src(const_cast<uint8_t*>(blocks.data()), cs.type, {m, k});
            const size_t cb = gpu_code_bytes(cs.layout, k), fb = gpu_factor_bytes(cs.layout, k);
            std::vector<uint8_t> codes(static_cast<size_t>(m) * (cb + fb));
            repack_rows(src, 0, m, codes.data(), codes.data() + static_cast<size_t>(m) * cb, cs.layout);
            DeviceBuffer<uint8_t> dcodes(codes);
            const cuda::GemvWeight w = gguf_gemv_weight(Tensor(dcodes.get(), cs.layout, {m, k}, Device::CUDA));
            for (int n : {1, 9, 16, 33, 64, 100, 200}) {
                SCOPED_TRACE(::testing::Message() << dtype_name(cs.type) << " as " << dtype_name(cs.layout) << " n "
                                                  << n << " m " << m << " k " << k);
                const std::vector<uint16_t> x =
                    cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(n) * k, rng));
                std::vector<double> want, bound;
                reference(codes, cs.layout, m, k, x, n, want, bound);
                DeviceBuffer<uint16_t> dx(x);
                const size_t count = static_cast<size_t>(n) * m;
                // f32 out, beta 0, at two splits of k (1 and 8 CTAs an SM aimed at).
                std::vector<std::vector<float>> runs;
                for (int ctas : {1, 8, 8}) {
                    cuda::set_gguf_gemm_ctas_per_sm(ctas);
                    DeviceBuffer<float> out(count);
                    out.fill_bytes(0xff);  // NaN: an element never written fails
                    cuda::gguf_gemm(dx.get(), w, out.get(), true, 0.0f, n, m, k, partials.get(), partials.size(),
                                    nullptr);
                    runs.push_back(out.download());
                }
                cuda::set_gguf_gemm_ctas_per_sm(0);
                {  // no partials buffer: k unsplit
                    DeviceBuffer<float> out(count);
                    out.fill_bytes(0xff);
                    cuda::gguf_gemm(dx.get(), w, out.get(), true, 0.0f, n, m, k, nullptr, 0, nullptr);
                    runs.push_back(out.download());
                }
                EXPECT_TRUE(runs[1] == runs[2]) << "the same launch gave different bits";
                for (const auto& got : runs) {
                    int bad = 0;
                    for (size_t i = 0; i < count; ++i) bad += !(std::fabs(got[i] - want[i]) <= 1e-4 * bound[i] + 1e-30);
                    EXPECT_EQ(bad, 0);
                }
                // beta 1 into f32, and bf16 out over a bf16 start.
                std::vector<float> start = cuda_test::random_floats(count, rng);
                DeviceBuffer<float> acc(start);
                cuda::gguf_gemm(dx.get(), w, acc.get(), true, 1.0f, n, m, k, partials.get(), partials.size(), nullptr);
                const std::vector<float> got_acc = acc.download();
                const std::vector<uint16_t> start16 = cuda_test::to_bf16(start);
                DeviceBuffer<uint16_t> b16(start16);
                cuda::gguf_gemm(dx.get(), w, b16.get(), false, 1.0f, n, m, k, partials.get(), partials.size(), nullptr);
                const std::vector<uint16_t> got16 = b16.download();
                int bad_acc = 0, bad16 = 0;
                for (size_t i = 0; i < count; ++i) {
                    const double a = start[i] + want[i];
                    bad_acc += !(std::fabs(got_acc[i] - a) <= 1e-4 * bound[i] + 1e-6 * std::fabs(start[i]));
                    const double b = bf16_to_f32(start16[i]) + want[i];
                    // bf16 rounding: half a unit in the last place (2^-8 relative) and the sum's error.
                    bad16 += !(std::fabs(bf16_to_f32(got16[i]) - b) <= std::fabs(b) / 256 + 1e-4 * bound[i] + 1e-30);
                }
                EXPECT_EQ(bad_acc, 0) << "beta 1, f32";
                EXPECT_EQ(bad16, 0) << "beta 1, bf16";
            }
        }
    }
}

TEST(CudaGgufGemm, RefusesWhatItCannotTake) {
    const cuda::GemvWeight bf16(static_cast<const cuda::bf16_t*>(nullptr));
    const cuda::GemvWeight q4(cuda::GemvWeight::kU4, reinterpret_cast<const void*>(256),
                              reinterpret_cast<const void*>(512));
    const void* x = reinterpret_cast<const void*>(4096);
    EXPECT_TRUE(cuda::gguf_gemm_supported(q4, 64, 100, 256, x));
    EXPECT_TRUE(cuda::gguf_gemm_supported(q4, 8192, 100, 256, x));
    EXPECT_FALSE(cuda::gguf_gemm_supported(bf16, 16, 100, 256, x));  // not a GGUF layout
    EXPECT_FALSE(cuda::gguf_gemm_supported(q4, 0, 100, 256, x));     // no rows
    EXPECT_FALSE(cuda::gguf_gemm_supported(q4, 16, 100, 192, x));    // k not whole blocks
    EXPECT_FALSE(cuda::gguf_gemm_supported(q4, 16, 100, 256, static_cast<const char*>(x) + 2));
}

// Prefill-sized GGUF products on the 8B shapes: gguf_gemm's token tiles against the backend's
// path past 64 rows, the matrix dequantized to bf16 then cuBLASLt (each timed alone and summed).
// Random codes and finite random f16 factors; one weight copy (prefill products are bound by
// arithmetic, not by the weight's bytes). TFLOP/s counts 2 n m k.
TEST(CudaGgufGemmPerf, PrefillReport) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    if (!std::getenv("PG_GEMV_PERF")) GTEST_SKIP() << "a measurement: PG_GEMV_PERF=1 runs it (~1 min)";
    CudaBackend b;
    const std::pair<int, int> shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    DeviceBuffer<float> partials(size_t{1} << 23);
    // us a launch: 10 launches captured in a graph, replayed (the first call, outside, tunes).
    auto time_us = [&](const std::function<void()>& launch) {
        return cuda_test::graph_us_per_call(b.stream(), 10, launch);
    };
    for (DType layout : {DType::GQ4_32, DType::GQ6_32, DType::GQ8_32}) {
        for (auto [m, k] : shapes) {
            const size_t bytes = static_cast<size_t>(m) * dtype_row_bytes(layout, k);
            Tensor raw = b.allocate(DType::BF16, {static_cast<int64_t>((bytes + 1) / 2)});
            b.fill_random(raw, 11, -0.05f, 0.05f);  // as f16 bits: finite, |v| < 2
            const cuda::GemvWeight w = gguf_gemv_weight(Tensor(raw.data, layout, {m, k}, Device::CUDA));
            Tensor wb = b.allocate(DType::BF16, {m, k});
            for (int n : {64, 128, 256, 512, 1024, 2048, 8192}) {
                Tensor x = b.allocate(DType::BF16, {n, k}), out = b.allocate(DType::F32, {n, m});
                b.fill_random(x, 3, -1.0f, 1.0f);
                const double us = time_us([&] {
                    cuda::gguf_gemm(x.ptr<cuda::bf16_t>(), w, out.data, true, 0.0f, n, m, k, partials.get(),
                                    partials.size(), b.stream());
                });
                const double deq =
                    time_us([&] { cuda::dequantize_weight(w, wb.ptr<cuda::bf16_t>(), m, k, b.stream()); });
                const double lt = time_us([&] { b.matmul(x, wb, Tensor(), out); });
                const double flop = 2.0 * n * m * k;
                std::printf(
                    "gguf_gemm %s m %5d k %5d n %4d: %8.1f us (%5.1f TF/s)  dequantize %6.1f + cuBLASLt %7.1f us "
                    "(%5.1f TF/s)  gguf_gemm / dequantized speed %.2f\n",
                    std::string(dtype_name(layout)).c_str(), m, k, n, us, flop / us / 1e6, deq, lt,
                    flop / (deq + lt) / 1e6, (deq + lt) / us);
                b.release(x);
                b.release(out);
            }
            b.release(raw);
            b.release(wb);
        }
    }
}

}  // namespace
}  // namespace peregrine
