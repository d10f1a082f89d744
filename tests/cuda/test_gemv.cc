// The skinny-product kernel (n <= 4) against a double-precision product of the same bf16
// values, and the backend's matmul with and without it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/half.h"

namespace peregrine {
namespace {

TEST(CudaGemv, MatchesDoubleReference) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (bool with_gemv : {true, false}) {
        CudaOptions o;
        o.gemv = with_gemv;
        CudaBackend b(o);
        for (int n : {1, 2, 3, 4}) {
            for (auto [m, k] : {std::pair{2048, 2048}, std::pair{517, 64}, std::pair{3, 8192}, std::pair{16384, 2048}}) {
                for (bool out_f32 : {true, false}) {
                    std::vector<uint16_t> x(static_cast<size_t>(n) * k), w(static_cast<size_t>(m) * k);
                    for (auto& v : x) v = f32_to_bf16(u(rng));
                    for (auto& v : w) v = f32_to_bf16(u(rng) * 0.05f);
                    Tensor dx = b.allocate(DType::BF16, {n, k}), dw = b.allocate(DType::BF16, {m, k});
                    Tensor dout = b.allocate(out_f32 ? DType::F32 : DType::BF16, {n, m});
                    b.upload(x.data(), dx);
                    b.upload(w.data(), dw);
                    std::vector<uint8_t> poison(dout.nbytes(), 0xff);  // NaN in both dtypes
                    b.upload(poison.data(), dout);
                    b.matmul(dx, dw, Tensor(), dout);
                    std::vector<float> got(static_cast<size_t>(n) * m);
                    if (out_f32) {
                        b.download(dout, got.data());
                    } else {
                        std::vector<uint16_t> h(got.size());
                        b.download(dout, h.data());
                        for (size_t i = 0; i < h.size(); ++i) got[i] = bf16_to_f32(h[i]);
                    }
                    double err = 0, norm = 0;
                    for (int i = 0; i < n; ++i)
                        for (int r = 0; r < m; ++r) {
                            double ref = 0;
                            for (int c = 0; c < k; ++c)
                                ref += static_cast<double>(bf16_to_f32(x[static_cast<size_t>(i) * k + c])) *
                                       bf16_to_f32(w[static_cast<size_t>(r) * k + c]);
                            const double d = got[static_cast<size_t>(i) * m + r] - ref;
                            ASSERT_TRUE(std::isfinite(got[static_cast<size_t>(i) * m + r])) << i << "," << r;
                            err += d * d;
                            norm += ref * ref;
                        }
                    EXPECT_LT(std::sqrt(err / norm), out_f32 ? 1e-5 : 8e-3)
                        << "n " << n << " m " << m << " k " << k << (with_gemv ? " gemv" : " cublasLt");
                    b.release(dx);
                    b.release(dw);
                    b.release(dout);
                }
            }
        }
    }
}

}  // namespace
}  // namespace peregrine
