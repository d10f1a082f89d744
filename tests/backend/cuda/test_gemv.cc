// The skinny-product kernel (n <= 4) against a double-precision product of the same bf16
// values, and the backend's matmul with and without it.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gguf.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemv_mma.h"
#include "core/gpu_quant.h"
#include "core/half.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

TEST(CudaGemv, MatchesDoubleReference) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const std::pair<int, int> configs[] = {{0, 0}, {2, 1}, {2, 2}, {2, 4}, {1, 4}, {1, 8}};
    for (auto [rows, depth] : configs) {
        cuda::set_gemv_config(rows, depth);
        for (bool with_gemv : {true, false}) {
            if (!with_gemv && rows != 0) continue;
            CudaOptions o;
            o.gemv = with_gemv;
            CudaBackend b(o);
            for (int n : {1, 2, 3, 4}) {
                for (auto [m, k] :
                     {std::pair{2048, 2048}, std::pair{517, 64}, std::pair{3, 8192}, std::pair{16384, 2048}}) {
                    if (rows != 0 && m == 16384) continue;
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
                            << "n " << n << " m " << m << " k " << k << (with_gemv ? " gemv" : " cublasLt")
                            << " config " << rows << "," << depth;
                        b.release(dx);
                        b.release(dw);
                        b.release(dout);
                    }
                }
            }
        }
    }
    cuda::set_gemv_config(0, 0);
}

// The fused silu epilogue (gate | up rows paired in one CTA) against the steps run apart
// (cuBLASLt, then the SiLU·mul kernel).
TEST(CudaGemv, FusedSiluMatchesSeparateSteps) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    CudaOptions apart_opts;
    apart_opts.gemv = false;
    CudaBackend fused, apart(apart_opts);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int n : {1, 2, 3, 4}) {
        for (auto [m, k] : {std::pair{16384, 2048}, std::pair{2048, 14336}, std::pair{130, 64}}) {
            std::vector<uint16_t> x(static_cast<size_t>(n) * k), w(static_cast<size_t>(m) * k);
            for (auto& v : x) v = f32_to_bf16(u(rng));
            for (auto& v : w) v = f32_to_bf16(u(rng) * 0.05f);
            std::vector<float> got[2];
            int which = 0;
            for (CudaBackend* b : {&fused, &apart}) {
                Tensor dx = b->allocate(DType::BF16, {n, k}), dw = b->allocate(DType::BF16, {m, k});
                Tensor out = b->allocate(DType::BF16, {n, m / 2}), scratch = b->allocate(DType::BF16, {n, m});
                b->upload(x.data(), dx);
                b->upload(w.data(), dw);
                b->matmul_silu(dx, dw, out, scratch);
                std::vector<uint16_t> h(static_cast<size_t>(n) * m / 2);
                b->download(out, h.data());
                for (uint16_t v : h) got[which].push_back(bf16_to_f32(v));
                for (Tensor* t : {&dx, &dw, &out, &scratch}) b->release(*t);
                ++which;
            }
            double e = 0, nrm = 0;
            for (size_t i = 0; i < got[0].size(); ++i) {
                ASSERT_TRUE(std::isfinite(got[0][i])) << i;
                e += (got[0][i] - got[1][i]) * (got[0][i] - got[1][i]);
                nrm += got[1][i] * got[1][i];
            }
            EXPECT_LT(std::sqrt(e / nrm), 8e-3) << "n " << n << " m " << m << " k " << k;
        }
    }
}

// The norm prologue and residual-add epilogue of the decode products (norm_matmul,
// norm_matmul_silu, matmul_add) against the same ops run apart (RMSNorm kernel + cuBLASLt +
// add): the fused forms skip the bf16 rounding of the normalised x, so they agree to bf16
// tolerance, not bitwise.
TEST(CudaGemv, FusedNormAndResidualAddMatchSeparateSteps) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    CudaOptions apart_opts;
    apart_opts.gemv = false;
    CudaBackend fused, apart(apart_opts);
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto rel_err = [](const std::vector<float>& a, const std::vector<float>& b) {
        double e = 0, nrm = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(a[i])) return 1e9;
            e += (a[i] - b[i]) * (a[i] - b[i]);
            nrm += static_cast<double>(b[i]) * b[i];
        }
        return std::sqrt(e / nrm);
    };
    for (int n : {1, 2, 3, 4}) {
        for (auto [m, k] : {std::pair{3072, 2048}, std::pair{16384, 2048}, std::pair{2048, 8192}, std::pair{130, 64}}) {
            std::vector<float> x(static_cast<size_t>(n) * k), g(k), res(static_cast<size_t>(n) * m);
            std::vector<uint16_t> w(static_cast<size_t>(m) * k), xa(static_cast<size_t>(n) * k);
            for (auto& v : x) v = 3.0f * u(rng);  // the residual stream: not unit scale
            for (auto& v : g) v = 1.0f + 0.5f * u(rng);
            for (auto& v : res) v = u(rng);
            for (auto& v : w) v = f32_to_bf16(u(rng) * 0.05f);
            for (auto& v : xa) v = f32_to_bf16(u(rng));
            // [backend][0 norm_matmul f32 out, 1 norm_matmul bf16 out, 2 norm_matmul_silu, 3 matmul_add]
            std::vector<float> got[2][4];
            int which = 0;
            for (CudaBackend* b : {&fused, &apart}) {
                Tensor dx = b->allocate(DType::F32, {n, k}), dg = b->allocate(DType::F32, {k});
                Tensor dw = b->allocate(DType::BF16, {m, k}), dxa = b->allocate(DType::BF16, {n, k});
                Tensor normed = b->allocate(DType::BF16, {n, k});
                Tensor of = b->allocate(DType::F32, {n, m}), ob = b->allocate(DType::BF16, {n, m});
                Tensor os = b->allocate(DType::BF16, {n, m / 2}), scratch = b->allocate(DType::BF16, {n, m});
                Tensor dres = b->allocate(DType::F32, {n, m}), fscratch = b->allocate(DType::F32, {n, m});
                b->upload(x.data(), dx);
                b->upload(g.data(), dg);
                b->upload(w.data(), dw);
                b->upload(xa.data(), dxa);
                b->upload(res.data(), dres);
                b->norm_matmul(dx, dg, 1e-5f, dw, Tensor(), of, normed);
                b->norm_matmul(dx, dg, 1e-5f, dw, Tensor(), ob, normed);
                if (m % 2 == 0) b->norm_matmul_silu(dx, dg, 1e-5f, dw, os, normed, scratch);
                b->matmul_add(dxa, dw, dres, fscratch);
                std::vector<float>* o = got[which];
                o[0].resize(static_cast<size_t>(n) * m);
                b->download(of, o[0].data());
                std::vector<uint16_t> h(static_cast<size_t>(n) * m);
                b->download(ob, h.data());
                for (uint16_t v : h) o[1].push_back(bf16_to_f32(v));
                if (m % 2 == 0) {
                    h.resize(static_cast<size_t>(n) * m / 2);
                    b->download(os, h.data());
                    for (uint16_t v : h) o[2].push_back(bf16_to_f32(v));
                }
                o[3].resize(static_cast<size_t>(n) * m);
                b->download(dres, o[3].data());
                for (Tensor* t : {&dx, &dg, &dw, &dxa, &normed, &of, &ob, &os, &scratch, &dres, &fscratch})
                    b->release(*t);
                ++which;
            }
            const char* names[] = {"norm_matmul f32", "norm_matmul bf16", "norm_matmul_silu", "matmul_add"};
            // The apart path rounds the normalised x to bf16 (relative 2^-9 per element).
            const double tol[] = {8e-3, 1e-2, 1.5e-2, 1e-5};
            for (int i = 0; i < 4; ++i) {
                if (got[1][i].empty()) continue;
                EXPECT_LT(rel_err(got[0][i], got[1][i]), tol[i]) << names[i] << " n " << n << " m " << m << " k " << k;
            }
        }
    }
}

// The 4-bit decode products' view of x (gemv.cu, XBlock): each block of 32 values as d * q with
// d = amax / 127 and q = rint(x * (127 / amax)), the same float steps.
std::vector<double> int8_blocks(const std::vector<float>& x) {
    std::vector<double> out(x.size());
    for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0.0f;
        for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (size_t i = b; i < b + 32; ++i) {
            const float t = x[i] * id;
            out[i] = static_cast<double>(d) * std::nearbyint(t);
        }
    }
    return out;
}

// Every decode-product entry point (plain f32 / bf16 out, silu, norm, norm + silu, add) against
// a double-precision reference on the same bf16 values. At n = 1 the add and (k >= 4096) normed
// products take the persistent kernel (GGUF layouts: at every n; past kMaxGemvRows in slices):
// shapes with one, several or partial row blocks per CTA,
// one or several weight groups per row block, and a normed x too large to stage (k = 32768).
// Then bitwise against the one-block-per-CTA kernel (set_gemv_config 2x1), which sums in the
// same order. With fp8 the weights are e4m3 codes with a factor per row (quantized on the host as
// quantize_rows_e4m3 does) and the reference multiplies the decoded values. bf16 and FP8 products
// run on the tensor-core kernel where it applies (gemv_mma.cu, set_gemv_mma(.., 1): every shape
// here but an x too large to stage), then on gemv.cu's kernels (set_gemv_mma(.., 0)), both against
// the reference, the latter bitwise against one block per CTA.
// With a GGUF type (gguf != F32) the weights are random blocks of that type repacked into its
// device layout (core/gpu_quant.h), and the reference multiplies the layout's values
// (gpu_layout_value) by x quantized as the 4-bit layout's products quantize it (int8_blocks);
// dequantize_weight must write those values rounded to bf16.
void check_every_entry_point(bool fp8, DType gguf = DType::F32, DType layout_of_gguf = DType::F32) {
    using cuda_test::DeviceBuffer;
    std::mt19937 rng(17);
    cudaStream_t stream;
    PG_CUDA_CHECK(cudaStreamCreate(&stream));
    const float eps = 1e-5f;
    const bool quant = gguf != DType::F32;
    // (20000 x 64: enough units of 8 rows for gemv_mma.cu's CTAs of 4 warps at n <= 2.)
    for (auto [m, k] : {std::pair{3072, 2048}, std::pair{1030, 64}, std::pair{1030, 4096}, std::pair{130, 14336},
                        std::pair{8, 32768}, std::pair{4100, 4096}, std::pair{20000, 64}}) {
        if (quant && k % dtype_block_size(gguf) != 0) continue;
        if (quant && (m == 4100 || m == 20000)) continue;  // bf16 / FP8 cases (PERSISTENT_ROWS=auto; mma CTAs)
        // Past kMaxGemvRows: GGUF layouts in slices of 4 rows (6 = 4 + 2, 8 = 4 + 4), bf16 / FP8 on
        // the tensor-core kernel alone (an x it can stage: k <= 4096 here).
        for (int n : {1, 2, 3, 4, 6, 8}) {
            const bool mma_only = !quant && n > cuda::kMaxGemvRows;
            if (mma_only && k > 4096) continue;
            const std::vector<float> x =
                cuda_test::round_bf16(cuda_test::random_floats(static_cast<size_t>(n) * k, rng));
            const std::vector<float> xr =
                cuda_test::random_floats(static_cast<size_t>(n) * k, rng, -3.0f, 3.0f);  // residual
            const std::vector<float> g = cuda_test::random_floats(k, rng, 0.5f, 1.5f);
            std::vector<float> w =
                cuda_test::round_bf16(cuda_test::random_floats(static_cast<size_t>(m) * k, rng, -0.05f, 0.05f));
            std::vector<uint8_t> codes;
            std::vector<float> row_scale;
            if (fp8) {
                codes = cuda_test::quantize_e4m3(w, m, k, row_scale);
                for (int r = 0; r < m; ++r)
                    for (int c = 0; c < k; ++c)
                        w[static_cast<size_t>(r) * k + c] =
                            f8e4m3_to_f32(codes[static_cast<size_t>(r) * k + c]) * row_scale[r];
            }
            const DType layout = !quant                         ? DType::F32
                                 : layout_of_gguf != DType::F32 ? layout_of_gguf
                                                                : gpu_layout_of(gguf);
            if (quant) {  // codes then factors, as placed on the device
                const std::vector<uint8_t> blocks = cuda_test::random_gguf_blocks(gguf, m, k, rng);
                const Tensor src(const_cast<uint8_t*>(blocks.data()), gguf, {m, k});
                const size_t cb = gpu_code_bytes(layout, k), fb = gpu_factor_bytes(layout, k);
                codes.assign(static_cast<size_t>(m) * (cb + fb), 0);
                repack_rows(src, 0, m, codes.data(), codes.data() + static_cast<size_t>(m) * cb, layout);
                for (int r = 0; r < m; ++r)
                    for (int c = 0; c < k; ++c)
                        w[static_cast<size_t>(r) * k + c] = gpu_layout_value(layout, codes.data(), m, k, r, c);
            }
            const std::vector<float> res = cuda_test::random_floats(static_cast<size_t>(n) * m, rng);
            // The x each product multiplies: as given, or for the 4-bit layout quantized to int8 in
            // blocks of 32 as the kernels do (x4 / xg4: x, and xr * g before the rms factor).
            std::vector<float> xg(static_cast<size_t>(n) * k);
            for (size_t i = 0; i < xg.size(); ++i) xg[i] = xr[i] * g[i % k];
            const bool u4 = layout == DType::GQ4_32 || layout == DType::GQ6_32;  // x quantized (XBlock)
            const std::vector<double> x4 = u4 ? int8_blocks(x) : std::vector<double>(x.begin(), x.end());
            const std::vector<double> xg4 = u4 ? int8_blocks(xg) : std::vector<double>(xg.begin(), xg.end());
            // Double references: plain[j][r] (x . w), normed[j][r] (rms_norm(xr) * g . w).
            std::vector<double> plain(static_cast<size_t>(n) * m), normed(static_cast<size_t>(n) * m);
            for (int j = 0; j < n; ++j) {
                double ss = 0;
                for (int c = 0; c < k; ++c)
                    ss += static_cast<double>(xr[static_cast<size_t>(j) * k + c]) * xr[static_cast<size_t>(j) * k + c];
                const double inv = 1.0 / std::sqrt(ss / k + eps);
                for (int r = 0; r < m; ++r) {
                    double p = 0, q = 0;
                    for (int c = 0; c < k; ++c) {
                        const double wv = w[static_cast<size_t>(r) * k + c];
                        p += wv * x4[static_cast<size_t>(j) * k + c];
                        q += wv * xg4[static_cast<size_t>(j) * k + c] * inv;
                    }
                    plain[static_cast<size_t>(j) * m + r] = p;
                    normed[static_cast<size_t>(j) * m + r] = q;
                }
            }
            auto silu_of = [&](const std::vector<double>& ref) {
                std::vector<float> out(static_cast<size_t>(n) * (m / 2));
                for (int j = 0; j < n; ++j)
                    for (int i = 0; i < m / 2; ++i) {
                        const double gv = ref[static_cast<size_t>(j) * m + i],
                                     uv = ref[static_cast<size_t>(j) * m + m / 2 + i];
                        out[static_cast<size_t>(j) * (m / 2) + i] = static_cast<float>(gv / (1.0 + std::exp(-gv)) * uv);
                    }
                return out;
            };
            std::vector<float> want[6];
            want[0].assign(plain.begin(), plain.end());
            want[1] = want[0];
            want[2] = silu_of(plain);
            want[3].assign(normed.begin(), normed.end());
            want[4] = silu_of(normed);
            want[5] = res;
            for (size_t i = 0; i < res.size(); ++i) want[5][i] += static_cast<float>(plain[i]);
            const char* names[] = {"gemv f32", "gemv bf16", "gemv_silu", "gemv_norm", "gemv_norm_silu", "gemv_add"};
            // The tensor-core kernel stages a normed x's hi part alone (f16 / bf16) past 4 rows, and
            // for FP8 weights at 1-4 rows too unless set_fp8_norm_lo(1) (the mma pass below).
            auto tols = [&](bool hi_alone) {
                const double norm_tol = hi_alone ? (fp8 ? 1e-3 : 4e-3) : 1e-5;
                return std::array<double, 6>{1e-5, 8e-3, 8e-3, norm_tol, 8e-3, 1e-5};
            };
            std::array<double, 6> tol = tols(mma_only || fp8);

            DeviceBuffer<uint16_t> dx(cuda_test::to_bf16(x)), dw(cuda_test::to_bf16(w));
            DeviceBuffer<uint8_t> dcodes(codes);
            DeviceBuffer<float> dscale(row_scale);
            cuda::GemvWeight wt = fp8 ? cuda::GemvWeight(dcodes.get(), dscale.get()) : cuda::GemvWeight(dw.get());
            if (quant) {
                wt = gguf_gemv_weight(Tensor(dcodes.get(), layout, {m, k}, Device::CUDA));
                // The bf16 matrix larger products use: the layout's values rounded to bf16.
                DeviceBuffer<uint16_t> deq(static_cast<size_t>(m) * k);
                cuda::dequantize_weight(wt, deq.get(), m, k, stream);
                PG_CUDA_CHECK(cudaStreamSynchronize(stream));
                EXPECT_TRUE(deq.download() == cuda_test::to_bf16(w))
                    << "dequantize_weight " << dtype_name(gguf) << " m " << m << " k " << k;
            }
            DeviceBuffer<float> dxr(xr), dg(g), of(static_cast<size_t>(n) * m), oa(static_cast<size_t>(n) * m);
            DeviceBuffer<uint16_t> ob(static_cast<size_t>(n) * m), os(static_cast<size_t>(n) * (m / 2));
            // Runs all six with the current config; returns each output's raw bytes.
            auto run_all = [&]() {
                std::vector<std::vector<uint8_t>> bytes;
                auto keep = [&](const auto& buf) {
                    const auto h = buf.download();
                    std::vector<uint8_t> b(h.size() * sizeof(h[0]));
                    std::memcpy(b.data(), h.data(), b.size());
                    bytes.push_back(std::move(b));
                };
                for (int i = 0; i < 6; ++i) {
                    of.fill_bytes(0xff);
                    ob.fill_bytes(0xff);
                    os.fill_bytes(0xff);
                    oa.upload(res);
                    switch (i) {
                        case 0:
                            cuda::gemv(dx.get(), wt, of.get(), true, n, m, k, stream);
                            keep(of);
                            break;
                        case 1:
                            cuda::gemv(dx.get(), wt, ob.get(), false, n, m, k, stream);
                            keep(ob);
                            break;
                        case 2:
                            cuda::gemv_silu(dx.get(), wt, os.get(), n, m, k, stream);
                            keep(os);
                            break;
                        case 3:
                            cuda::gemv_norm(dxr.get(), dg.get(), eps, wt, of.get(), true, n, m, k, stream);
                            keep(of);
                            break;
                        case 4:
                            cuda::gemv_norm_silu(dxr.get(), dg.get(), eps, wt, os.get(), n, m, k, stream);
                            keep(os);
                            break;
                        case 5:
                            cuda::gemv_add(dx.get(), wt, oa.get(), n, m, k, stream);
                            keep(oa);
                            break;
                    }
                }
                return bytes;
            };
            auto check = [&](const std::vector<std::vector<uint8_t>>& out, const char* path) {
                for (int i = 0; i < 6; ++i) {
                    std::vector<float> f(want[i].size());
                    if (out[i].size() == f.size() * 4) {
                        std::memcpy(f.data(), out[i].data(), out[i].size());
                    } else {
                        std::vector<uint16_t> h(f.size());
                        std::memcpy(h.data(), out[i].data(), out[i].size());
                        f = cuda_test::from_bf16(h);
                    }
                    ASSERT_EQ(cuda_test::count_nonfinite(f), 0u) << names[i] << " n " << n << " m " << m << " k " << k;
                    EXPECT_LT(cuda_test::rel_error(f, want[i]), tol[i])
                        << names[i] << (fp8 ? " fp8" : "") << (quant ? dtype_name(gguf) : "") << path << " n " << n
                        << " m " << m << " k " << k;
                }
            };
            const auto mma_weight = fp8 ? cuda::MmaProduct::kF8 : cuda::MmaProduct::kBf16;
            if (!quant) {
                cuda::set_gemv_mma(mma_weight, 1);
                check(run_all(), " (mma)");
                if (fp8 && !mma_only) {  // a normed x of 1-4 rows the other way too
                    for (const int lo : {0, 1}) {
                        cuda::set_fp8_norm_lo(lo);
                        tol = tols(lo == 0);
                        check(run_all(), lo == 0 ? " (mma, hi alone)" : " (mma, hi + lo)");
                    }
                    cuda::set_fp8_norm_lo(-1);
                    tol = tols(false);  // gemv.cu's kernels below: x in f32
                }
                cuda::set_gemv_mma(mma_weight, mma_only ? -1 : 0);
                if (mma_only) continue;
            }
            const auto got = run_all();
            if (!quant) cuda::set_gemv_mma(mma_weight, -1);
            check(got, "");
            cuda::set_gemv_config(2, 1);
            const auto one_block = run_all();
            cuda::set_gemv_config(0, 0);
            for (int i = 0; i < 6; ++i)
                EXPECT_TRUE(got[i] == one_block[i])
                    << names[i] << (fp8 ? " fp8" : "") << (quant ? dtype_name(gguf) : "") << " n " << n << " m " << m
                    << " k " << k;
        }
    }
    PG_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaGemv, EveryEntryPointMatchesReferenceAndOneBlockPerCta) {
    PG_SKIP_WITHOUT_CUDA();
    check_every_entry_point(false);
}

TEST(CudaGemv, Fp8WeightsEveryEntryPointMatchesReference) {
    PG_SKIP_WITHOUT_CUDA();
    check_every_entry_point(true);
}

TEST(CudaGemv, GgufLayoutsEveryEntryPointMatchesReference) {
    PG_SKIP_WITHOUT_CUDA();
    // Both launch policies of the GGUF layouts: short CTAs, and the persistent kernel (normed and
    // add products; PEREGRINE_GGUF_GEMV=persistent).
    for (int persistent : {0, 1}) {
        SCOPED_TRACE(persistent ? "persistent" : "blocks");
        cuda::set_gguf_gemv_persistent(persistent);
        for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) check_every_entry_point(false, t);
        check_every_entry_point(false, DType::Q6_K, DType::GQ6_32);  // PEREGRINE_Q6K_LAYOUT=6bit
    }
    cuda::set_gguf_gemv_persistent(-1);
}

// gguf_embedding: each token's row of a GGUF-layout table in f32 is the layout's values
// (gpu_layout_value), ids outside [vocab_begin, vocab_begin + rows) give zeros, and a negative id
// -1 - j takes the feed's draw j.
TEST(CudaGemv, GgufEmbeddingGathersTheLayoutValues) {
    PG_SKIP_WITHOUT_CUDA();
    using cuda_test::DeviceBuffer;
    std::mt19937 rng(23);
    const int rows = 300, k = 512, vocab_begin = 100;
    const std::pair<DType, DType> kinds[] = {{DType::Q8_0, DType::GQ8_32},
                                             {DType::Q4_0, DType::GQ4_32},
                                             {DType::Q4_K, DType::GQ4_32},
                                             {DType::Q6_K, DType::GQ8_16},
                                             {DType::Q6_K, DType::GQ6_32}};
    for (const auto& [t, layout] : kinds) {
        const std::vector<uint8_t> blocks = cuda_test::random_gguf_blocks(t, rows, k, rng);
        const Tensor src(const_cast<uint8_t*>(blocks.data()), t, {rows, k});
        const size_t cb = gpu_code_bytes(layout, k), fb = gpu_factor_bytes(layout, k);
        std::vector<uint8_t> codes(static_cast<size_t>(rows) * (cb + fb));
        repack_rows(src, 0, rows, codes.data(), codes.data() + static_cast<size_t>(rows) * cb, layout);
        DeviceBuffer<uint8_t> dcodes(codes);
        const cuda::GemvWeight w = gguf_gemv_weight(Tensor(dcodes.get(), layout, {rows, k}, Device::CUDA));
        const std::vector<int32_t> ids = {100, 399, 250, 99, 400, -1, -2, 5000, 101};
        const std::vector<int32_t> feed = {117, 350};
        DeviceBuffer<int32_t> dids(ids), dfeed(feed);
        DeviceBuffer<float> out(ids.size() * k);
        out.fill_bytes(0xff);
        cuda::gguf_embedding(w, dids.get(), dfeed.get(), static_cast<int>(ids.size()), k, vocab_begin, rows, out.get(),
                             nullptr);
        const std::vector<float> got = out.download();
        for (size_t i = 0; i < ids.size(); ++i) {
            const int32_t id = ids[i] < 0 ? feed[-1 - ids[i]] : ids[i];
            const bool in = id >= vocab_begin && id < vocab_begin + rows;
            int bad = 0;
            for (int c = 0; c < k; ++c) {
                const float want = in ? gpu_layout_value(layout, codes.data(), rows, k, id - vocab_begin, c) : 0.0f;
                bad += got[i * k + c] != want;
            }
            EXPECT_EQ(bad, 0) << dtype_name(layout) << " token " << i << " (id " << ids[i] << ")";
        }
    }
}

// Times b.matmul(x, w) over the rotating weight copies `ws` at every rows x depth config (0x0:
// the default), printing us a call and TB/s of `bytes` a weight; leaves the default config.
void time_configs(CudaBackend& b, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& out, size_t bytes) {
    const std::pair<int, int> configs[] = {{0, 0}, {2, 1}, {2, 2}, {2, 4}, {1, 4}, {1, 8}};
    const int copies = static_cast<int>(ws.size());
    for (auto [rows, depth] : configs) {
        cuda::set_gemv_config(rows, depth);
        const int reps = std::max(copies, 20);
        for (int r = 0; r < copies; ++r) b.matmul(x, ws[r % copies], Tensor(), out);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, b.stream());
        for (int r = 0; r < reps; ++r) b.matmul(x, ws[r % copies], Tensor(), out);
        cudaEventRecord(e1, b.stream());
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        const double us = 1e3 * ms / reps;
        std::printf("  %dx%d %6.1f us %4.2f TB/s", rows, depth, us, bytes / us / 1e6);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    std::printf("\n");
    cuda::set_gemv_config(0, 0);
}

// Decode-product speed on the Llama 1B / 8B shapes, n = 1 and 4, bf16 and FP8 weights: a chain
// of launches over rotating weight copies (> 256 MB, so L2 holds none of them), as a decode step
// reads each weight once.
TEST(CudaGemvPerf, Report) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    CudaBackend b;
    for (bool fp8 : {false, true}) {
        const std::pair<int, int> shapes[] = {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}, {128256, 2048},
                                              {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
        for (int n : {1, 4}) {
            for (auto [m, k] : shapes) {
                const size_t bytes = static_cast<size_t>(m) * k * (fp8 ? 1 : 2);
                const int copies = static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / bytes + 1));
                std::vector<Tensor> ws, scales;
                for (int c = 0; c < copies; ++c) {
                    ws.push_back(b.allocate(DType::BF16, {m, k}));
                    b.fill_random(ws.back(), 11 + c, -0.05f, 0.05f);
                    if (fp8) {  // codes and factors in place of the bf16 copy
                        Tensor q = b.allocate(DType::F8_E4M3, {m, k}), sc = b.allocate(DType::F32, {m});
                        cuda::quantize_rows_e4m3(ws.back().ptr<uint16_t>(), q.ptr<uint8_t>(), sc.ptr<float>(), m, k,
                                                 b.stream());
                        b.release(ws.back());
                        ws.back() = q;
                        ws.back().scale = sc.ptr<float>();
                        scales.push_back(sc);
                    }
                }
                Tensor x = b.allocate(DType::BF16, {n, k}), out = b.allocate(DType::F32, {n, m});
                b.fill_random(x, 3, -1.0f, 1.0f);
                std::printf("gemv %s n %d m %6d k %5d (%6.1f MB):", fp8 ? "fp8 " : "bf16", n, m, k, bytes / 1e6);
                time_configs(b, x, ws, out, bytes);
                for (Tensor& t : ws) b.release(t);
                for (Tensor& t : scales) b.release(t);
                b.release(x);
                b.release(out);
            }
        }
    }
}

// Which products the tensor-core kernel takes (no GPU needed: gemv_mma_takes launches nothing).
// The backend sends products of 3-8 rows to the decode kernels only where it says yes.
TEST(CudaGemv, TensorCoreKernelTakesWhatItCanStageAndWhereItIsFaster) {
    alignas(16) static const float aligned[4] = {};
    const void* p = aligned;
    auto product = [&](cuda::MmaProduct::Weight weight, bool norm, cuda::MmaProduct::Epilogue epi, int n, int m,
                       int k) {
        return cuda::MmaProduct{.x = p,
                                .norm = norm ? aligned : nullptr,
                                .eps = 1e-5f,
                                .weight = weight,
                                .w = p,
                                .scale = aligned,
                                .out = nullptr,
                                .out_f32 = true,
                                .n = n,
                                .m = m,
                                .k = k,
                                .epilogue = epi};
    };
    using P = cuda::MmaProduct;
    cuda::set_gemv_mma(P::kBf16, 2);  // auto, the default
    cuda::set_gemv_mma(P::kF8, 2);
    // bf16: the normed gate|up below k 4096 at any n, normed products at 3-4 rows, o / down at
    // 3-4 rows where x fits in 96 KB (not the 8B's down at 4 rows).
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kSilu, 1, 16384, 2048)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kSilu, 1, 28672, 4096)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kSilu, 3, 28672, 4096)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kPlain, 2, 3072, 2048)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kPlain, 4, 3072, 2048)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 2, 2048, 2048)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 4, 2048, 2048)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 3, 4096, 14336)));   // 86 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 4, 4096, 14336)));  // 115 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kPlain, 4, 2048, 2048)));
    // At 5-8 rows: o / down where x fits in 96 KB, no normed product.
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 8, 2048, 2048)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 8, 2048, 8192)));  // 128 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kPlain, 8, 3072, 2048)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kBf16, true, P::kSilu, 5, 16384, 2048)));
    // FP8: every product whose x it can stage within 132 KB (2 bytes a value a token): the 8B's
    // down product to 4 rows, the 70B's normed products to 8.
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, false, P::kAdd, 4, 4096, 14336)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, false, P::kAdd, 2, 8192, 28672)));   // 70B down, 115 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, false, P::kAdd, 3, 8192, 28672)));  // 172 KB
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 4, 10240, 8192)));  // 64 KB
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 4, 6144, 4096)));
    // A normed x of 1-4 rows staged hi + lo (4 bytes a value), to 120 KB: the 70B's normed
    // products to 3 rows (at 4, 128 KB, cuBLASLt was faster).
    cuda::set_fp8_norm_lo(1);
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 3, 10240, 8192)));   // 96 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 4, 10240, 8192)));  // 128 KB
    cuda::set_fp8_norm_lo(-1);
    // Past 4 rows a normed x is staged hi alone, 2 bytes a value: to 8 rows of the 8B's and the
    // 70B's, and the 1B's down at 8 rows (128 KB); not the 8B's down past 4.
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 8, 6144, 4096)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 8, 10240, 8192)));
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kF8, false, P::kAdd, 8, 2048, 8192)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, false, P::kAdd, 5, 4096, 14336)));  // 140 KB
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 9, 6144, 4096)));
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kPlain, 1, 6144, 4096 + 16)));  // k % 64
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kAdd, 1, 6144, 4096)));         // no normed add
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kSilu, 1, 6145, 4096)));        // gate|up m odd
    P unaligned = product(P::kF8, false, P::kPlain, 1, 4096, 4096);
    unaligned.x = static_cast<const char*>(p) + 4;
    EXPECT_FALSE(cuda::gemv_mma_takes(unaligned));
    P no_scale = product(P::kF8, false, P::kPlain, 1, 4096, 4096);
    no_scale.scale = nullptr;
    EXPECT_FALSE(cuda::gemv_mma_takes(no_scale));
    // Past 4 rows only this kernel runs bf16 / FP8 products: one it does not take is a clear error
    // before any launch (x of 6 rows of 32,768 values is 384 KB).
    const cuda::GemvWeight f8w(static_cast<const uint8_t*>(p), aligned);
    try {
        cuda::gemv_add(static_cast<const cuda::bf16_t*>(p), f8w, nullptr, 6, 8, 32768, nullptr);
        ADD_FAILURE() << "gemv_add of 6 rows with k 32768 ran";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("only the tensor-core kernel runs it"), std::string::npos) << e.what();
    }
    // Switched on / off by hand.
    cuda::set_gemv_mma(P::kBf16, 1);
    EXPECT_TRUE(cuda::gemv_mma_takes(product(P::kBf16, false, P::kAdd, 1, 2048, 2048)));
    cuda::set_gemv_mma(P::kF8, 0);
    EXPECT_FALSE(cuda::gemv_mma_takes(product(P::kF8, true, P::kSilu, 1, 16384, 2048)));
    cuda::set_gemv_mma(P::kBf16, -1);
    cuda::set_gemv_mma(P::kF8, -1);
}

// The products a decode step runs, Llama 8B and 1B shapes (q|k|v normed, o add, gate|up normed
// silu, down add), FP8 and bf16 weights, n = 1..8: the tensor-core kernel (gemv_mma.cu) against
// gemv.cu's FMA kernels (n <= 4; past that the tensor-core kernel alone, where it takes the
// product), us a call in a CUDA graph over rotating weight copies (> 256 MB, so L2 holds none)
// and TB/s of the weight bytes. PG_GEMV_PERF=1 runs it.
TEST(CudaGemvPerf, DecodeProductsOnTensorCores) {
    PG_SKIP_WITHOUT_CUDA();
    if (!std::getenv("PG_GEMV_PERF")) GTEST_SKIP() << "a measurement: PG_GEMV_PERF=1 runs it";
    using cuda_test::DeviceBuffer;
    cudaStream_t stream;
    PG_CUDA_CHECK(cudaStreamCreate(&stream));
    struct Shape {
        const char* name;
        int m, k;
        bool norm, silu, add;
    };
    const Shape shapes[] = {
        {"8B q|k|v", 6144, 4096, true, false, false},   {"8B o", 4096, 4096, false, false, true},
        {"8B gate|up", 28672, 4096, true, true, false}, {"8B down", 4096, 14336, false, false, true},
        {"1B q|k|v", 3072, 2048, true, false, false},   {"1B o", 2048, 2048, false, false, true},
        {"1B gate|up", 16384, 2048, true, true, false}, {"1B down", 2048, 8192, false, false, true}};
    std::mt19937 rng(5);
    for (bool fp8 : {true, false}) {
        const auto kind = fp8 ? cuda::MmaProduct::kF8 : cuda::MmaProduct::kBf16;
        for (const Shape& sh : shapes) {
            const size_t bytes = static_cast<size_t>(sh.m) * sh.k * (fp8 ? 1 : 2);
            const int copies = static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / bytes + 1));
            std::vector<DeviceBuffer<uint8_t>> ws;
            std::vector<uint8_t> codes(bytes);
            for (int c = 0; c < copies; ++c) {
                for (size_t i = 0; i < bytes; ++i) {
                    uint8_t v = static_cast<uint8_t>(rng());
                    if (fp8 && (v & 0x7f) == 0x7f) v ^= 1;  // any e4m3 value but NaN (S.1111.111)
                    if (!fp8 && i % 2 == 1) v &= 0xbf;      // bf16 high byte: |value| < 2, finite
                    codes[i] = v;
                }
                ws.emplace_back(codes);
            }
            DeviceBuffer<float> scale(cuda_test::random_floats(sh.m, rng, 1e-3f, 2e-3f));
            constexpr int kRows = cuda::kMaxMmaRows;
            DeviceBuffer<float> x(cuda_test::random_floats(static_cast<size_t>(kRows) * sh.k, rng, -3.0f, 3.0f));
            DeviceBuffer<uint16_t> xb(
                cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(kRows) * sh.k, rng)));
            DeviceBuffer<float> g(cuda_test::random_floats(sh.k, rng, 0.5f, 1.5f)),
                out(static_cast<size_t>(kRows) * sh.m);
            for (int n = 1; n <= kRows; ++n) {
                std::printf("%s %-10s n %d m %5d k %5d (%5.1f MB):", fp8 ? "fp8 " : "bf16", sh.name, n, sh.m, sh.k,
                            bytes / 1e6);
                for (int mma : {0, 1}) {
                    cuda::set_gemv_mma(kind, mma);
                    if (n > cuda::kMaxGemvRows) {  // the tensor-core kernel alone, where it takes it
                        const cuda::MmaProduct probe{
                            .x = sh.norm ? static_cast<const void*>(x.get()) : static_cast<const void*>(xb.get()),
                            .norm = sh.norm ? g.get() : nullptr,
                            .eps = 1e-5f,
                            .weight = kind,
                            .w = ws[0].get(),
                            .scale = scale.get(),
                            .out = out.get(),
                            .out_f32 = false,
                            .n = n,
                            .m = sh.m,
                            .k = sh.k,
                            .epilogue = sh.silu  ? cuda::MmaProduct::kSilu
                                        : sh.add ? cuda::MmaProduct::kAdd
                                                 : cuda::MmaProduct::kPlain};
                        if (mma == 0 || !cuda::gemv_mma_takes(probe)) {
                            std::printf("  %s %6s", mma ? "mma" : "fma", "-");
                            continue;
                        }
                    }
                    int r = 0;
                    const double us = cuda_test::graph_us_per_call(stream, 2 * copies, [&] {
                        const uint8_t* wp = ws[r++ % copies].get();
                        const cuda::GemvWeight w = fp8 ? cuda::GemvWeight(wp, scale.get())
                                                       : cuda::GemvWeight(reinterpret_cast<const cuda::bf16_t*>(wp));
                        if (sh.norm && sh.silu)
                            cuda::gemv_norm_silu(x.get(), g.get(), 1e-5f, w, reinterpret_cast<cuda::bf16_t*>(out.get()),
                                                 n, sh.m, sh.k, stream);
                        else if (sh.norm)
                            cuda::gemv_norm(x.get(), g.get(), 1e-5f, w, out.get(), false, n, sh.m, sh.k, stream);
                        else
                            cuda::gemv_add(reinterpret_cast<const cuda::bf16_t*>(xb.get()), w, out.get(), n, sh.m, sh.k,
                                           stream);
                    });
                    std::printf("  %s %6.1f us %4.2f TB/s", mma ? "mma" : "fma", us, bytes / us / 1e6);
                }
                std::printf("\n");
            }
            cuda::set_gemv_mma(kind, -1);
        }
    }
    PG_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The same for the GGUF device layouts (gq8_32: Q8_0, gq8_16: Q6_K, gq4_32: Q4_0 / Q4_K) on the
// 8B shapes: random codes and finite random f16 factors (speed does not depend on the values),
// through CudaBackend::matmul as a decode step calls it. TB/s counts the layout's bytes (codes
// and factors); the limit a copy reaches on an H100 is ~3.0. The measurement to tune the GGUF
// decode products by (issue #23: the 8B Q4_K_M decoded at ~0.9 TB/s).
TEST(CudaGemvPerf, GgufLayoutsReport) {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    if (!std::getenv("PG_GEMV_PERF")) GTEST_SKIP() << "a measurement: PG_GEMV_PERF=1 runs it (~1 min)";
    CudaBackend b;
    const std::pair<int, int> shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    for (DType layout : {DType::GQ8_32, DType::GQ8_16, DType::GQ4_32, DType::GQ6_32}) {
        for (int n : {1, 4}) {
            for (auto [m, k] : shapes) {
                const size_t bytes = static_cast<size_t>(m) * dtype_row_bytes(layout, k);
                const int copies = static_cast<int>(std::max<size_t>(2, (size_t{256} << 20) / bytes + 1));
                std::vector<Tensor> raw, ws;
                for (int c = 0; c < copies; ++c) {
                    raw.push_back(b.allocate(DType::BF16, {static_cast<int64_t>((bytes + 1) / 2)}));
                    b.fill_random(raw.back(), 11 + c, -0.05f, 0.05f);  // as f16 bits: finite, |v| < 2
                    ws.push_back(Tensor(raw.back().data, layout, {m, k}, Device::CUDA));
                }
                Tensor x = b.allocate(DType::BF16, {n, k}), out = b.allocate(DType::F32, {n, m});
                b.fill_random(x, 3, -1.0f, 1.0f);
                std::printf("gemv %s n %d m %6d k %5d (%6.1f MB):", std::string(dtype_name(layout)).c_str(), n, m, k,
                            bytes / 1e6);
                time_configs(b, x, ws, out, bytes);
                for (Tensor& t : raw) b.release(t);
                b.release(x);
                b.release(out);
            }
        }
    }
}

}  // namespace
}  // namespace peregrine
