// The CUDA backend's products: which kernel takes each (the decode kernels, gemv_mma.cu's
// tensor-core kernel, cuBLASLt, the batch-invariant GEMM), FP8 activations quantized on the way,
// and the cached cuBLASLt plans.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/backend_helpers.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gguf.h"
#include "backend/cuda/gemv_mma.h"
#include "core/env.h"

namespace peregrine {

void CudaBackend::ensure_fp8_buffers(int64_t input, int64_t rows, int64_t product) {
    // Each buffer grows alone: an x already quantized into f8_input_ stays put while the
    // product buffer grows under it.
    auto grow = [&](Tensor& t, DType dtype, int64_t n) {
        if (t.numel() >= n) return;
        PG_CHECK(!capturing(), "CUDA backend: an FP8 product larger than any before while recording a graph");
        clear_graphs();  // recordings hold the old addresses
        if (!t.empty()) release(t);
        t = allocate(dtype, {n});
    };
    grow(f8_input_, DType::F8_E4M3, input);
    grow(f8_scale_, DType::F32, rows);
    grow(f8_product_, DType::BF16, product);
}

bool CudaBackend::fp8_pair(const Tensor& x, const Tensor& w) {
    return x.dtype == DType::F8_E4M3 && w.dtype == DType::F8_E4M3 && x.scale != nullptr;
}

Tensor CudaBackend::fp8_activation(int64_t n, int64_t k) {
    ensure_fp8_buffers(n * k, n, 0);
    Tensor t(f8_input_.data, DType::F8_E4M3, {n, k}, Device::CUDA);
    t.scale = f8_scale_.ptr<float>();
    return t;
}

Tensor CudaBackend::norm_e4m3(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w) {
    if (w.dtype != DType::F8_E4M3 || options_.batch_invariant || x.ndim != 2 || norm_weight.dtype != DType::F32 ||
        norm_weight.numel() != x.cols() || (x.dtype != DType::F32 && x.dtype != DType::BF16))
        return Tensor();
    const int64_t n = x.rows(), k = x.cols();
    const Tensor x8 = fp8_activation(n, k);
    if (!cuda::rms_norm_e4m3(x.data, x.dtype == DType::F32, nullptr, norm_weight.ptr<float>(), eps,
                             static_cast<uint8_t*>(x8.data), const_cast<float*>(x8.scale), static_cast<int>(n),
                             static_cast<int>(k), stream_))
        return Tensor();
    return x8;
}

Tensor CudaBackend::silu_e4m3(const Tensor& gate_up, const Tensor& w) {
    if (w.dtype != DType::F8_E4M3 || options_.batch_invariant || gate_up.dtype != DType::BF16 || gate_up.ndim != 2)
        return Tensor();
    const int64_t n = gate_up.rows(), f = gate_up.cols() / 2;
    const Tensor g8 = fp8_activation(n, f);
    if (!cuda::silu_rows_e4m3(bf(gate_up), static_cast<uint8_t*>(g8.data), const_cast<float*>(g8.scale), n, f, stream_))
        return Tensor();
    return g8;
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, bool exact) {
    (void)exact;  // bf16 inputs with f32 accumulation in every mode
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    PG_CHECK(w.cols() == k && out.rows() == n && out.cols() == m, "matmul shapes: x ", x.shape_str(), " w ",
             w.shape_str(), " out ", out.shape_str());
    PG_CHECK((x.dtype == DType::BF16 || fp8_pair(x, w)) && is_product_weight(w),
             "CUDA matmul takes bf16 inputs (or f8_e4m3 ones for f8_e4m3 weights) and bf16, f8_e4m3 or GGUF-layout "
             "weights");
    if (n == 0) return;
    if (fp8_pair(x, w)) {
        cublas_matmul(x, w, out);
    } else if (options_.batch_invariant) {
        // One k order per element whatever n is (tensor cores, no split-K across CTAs).
        cuda::gemm_invariant(bf(x), bf(w), out.data, out.dtype == DType::F32, static_cast<int>(n), static_cast<int>(m),
                             static_cast<int>(k), stream_);
    } else if (use_gemv(x, w) || use_gemv_fp8(x, w)) {
        // Batch-1..2 decode (GGUF layouts: to 4 rows; FP8: to 8 on tensor cores): our
        // weight-streaming kernels beat cuBLASLt's skinny tiles (cuda::gemv_rows_chosen).
        cuda::gemv(bf(x), gemv_weight(w), out.data, out.dtype == DType::F32, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), stream_);
    } else {
        cublas_matmul(x, w, out);
    }
    if (!bias.empty()) {
        PG_CHECK(out.dtype == DType::BF16 && bias.dtype == DType::F32 && bias.numel() == m);
        cuda::add_bias(bf(out), bias.ptr<float>(), n, m, stream_);
    }
}

bool CudaBackend::use_gemv(const Tensor& x, const Tensor& w) const {
    // Batch-invariant mode keeps every product on one kernel for all n.
    return options_.gemv && !options_.batch_invariant && x.dtype == DType::BF16 && is_product_weight(w) &&
           cuda::gemv_supported(static_cast<int>(x.rows()), static_cast<int>(x.cols()), x.data, w.data,
                                cuda::gemv_rows_chosen(gemv_kind(w.dtype)));
}

void CudaBackend::matmul_silu(const Tensor& x, const Tensor& w_gate_up, const Tensor& out, const Tensor& scratch) {
    const int64_t n = x.rows(), k = x.cols(), m = w_gate_up.rows();
    if (!use_gemv(x, w_gate_up)) {
        matmul(x, w_gate_up, Tensor(), scratch);
        silu_mul_packed(scratch, out);
        return;
    }
    PG_CHECK(w_gate_up.cols() == k && out.rows() == n && 2 * out.cols() == m && out.dtype == DType::BF16,
             "matmul_silu shapes: x ", x.shape_str(), " w ", w_gate_up.shape_str(), " out ", out.shape_str());
    cuda::gemv_silu(bf(x), gemv_weight(w_gate_up), bf(out), static_cast<int>(n), static_cast<int>(m),
                    static_cast<int>(k), stream_);
}

namespace {
// Whether gemv_mma.cu's tensor-core kernel takes this product (bf16 / FP8 weights only; norm:
// the RMSNorm weight of a normed product or nullptr).
bool mma_takes(const Tensor& x, const float* norm, const Tensor& w, cuda::MmaProduct::Epilogue epilogue) {
    if (!(w.dtype == DType::BF16 || w.dtype == DType::F8_E4M3)) return false;
    return cuda::gemv_mma_takes({.x = x.data,
                                 .norm = norm,
                                 .eps = 0.0f,
                                 .weight = w.dtype == DType::F8_E4M3 ? cuda::MmaProduct::kF8 : cuda::MmaProduct::kBf16,
                                 .w = w.data,
                                 .scale = w.scale,
                                 .out = nullptr,
                                 .out_f32 = false,
                                 .n = static_cast<int>(x.rows()),
                                 .m = static_cast<int>(w.rows()),
                                 .k = static_cast<int>(x.cols()),
                                 .epilogue = epilogue});
}

// The most rows of a normed or non-normed product the backend hands the tensor-core kernel:
// cuda::kMaxMmaRows (8), or fewer by PEREGRINE_GEMV_NORM_MAX_ROWS / PEREGRINE_GEMV_ADD_MAX_ROWS.
int mma_max_rows(bool norm) {
    static const int rows[2] = {
        std::clamp(env_int("PEREGRINE_GEMV_ADD_MAX_ROWS", cuda::kMaxMmaRows), 1, cuda::kMaxMmaRows),
        std::clamp(env_int("PEREGRINE_GEMV_NORM_MAX_ROWS", cuda::kMaxMmaRows), 1, cuda::kMaxMmaRows)};
    return rows[norm ? 1 : 0];
}

// A non-normed product (bf16 x, to mma_max_rows(false) rows) for the tensor-core kernel.
bool mma_unnormed(const CudaOptions& o, const Tensor& x, const Tensor& w, cuda::MmaProduct::Epilogue epilogue) {
    return o.gemv && !o.batch_invariant && x.dtype == DType::BF16 && x.rows() <= mma_max_rows(false) &&
           mma_takes(x, nullptr, w, epilogue);
}
}  // namespace

// A plain FP8 product of 3-8 rows (the FP8 LM head, a tensor-parallel rank's o / down) on the
// tensor-core kernel, x kept bf16, as the o / down products with their residual (use_gemv_add)
// rather than a quantize pass + cuBLASLt's FP8 tiles; bounded as they are.
bool CudaBackend::use_gemv_fp8(const Tensor& x, const Tensor& w) const {
    return w.dtype == DType::F8_E4M3 && mma_unnormed(options_, x, w, cuda::MmaProduct::kPlain);
}

bool CudaBackend::use_gemv_norm(const Tensor& x, const Tensor& norm_weight, const Tensor& w) const {
    if (!options_.gemv || options_.batch_invariant || x.dtype != DType::F32 || !is_product_weight(w) ||
        norm_weight.dtype != DType::F32 || norm_weight.numel() != x.cols() ||
        reinterpret_cast<uintptr_t>(norm_weight.data) % 16 != 0)
        return false;
    const int n = static_cast<int>(x.rows()), k = static_cast<int>(x.cols());
    if (cuda::gemv_supported(n, k, x.data, w.data, cuda::gemv_rows_chosen(gemv_kind(w.dtype)))) return true;
    // Normed bf16 / FP8 products of 3-4 rows that gemv_mma.cu's tensor-core kernel takes (x staged
    // once for all rows) run faster there than as a norm pass + cuBLASLt. H200, decode tok/s at
    // batch 3 (steps padded to 4 rows), cuBLASLt / tensor-core kernel (2026-11-29, three rounds):
    // 1B bf16 2,882.6 / 2,912.9, 2,871.3 / 2,957.0, 2,863.3 / 2,979.4; 8B bf16 646.0 / 675.0,
    // 647.7 / 674.7, 667.0 / 671.8; 8B FP8 703.1 / 725.3; batch 4: 1B 3,886.7 / 3,948.7, 8B 882.9 /
    // 897.5.
    // And FP8 of 5-8 rows (a batch-8 step; x staged hi alone): with o / down there too, 1B FP8
    // 6,035.4 -> 6,154.2, 8B FP8 even (session 31; bf16 of 5-8 rows: gemv_mma.cu's bf16_auto says
    // no). PEREGRINE_GEMV_NORM_MAX_ROWS=2 | 4 keeps more rows on cuBLASLt.
    return n <= mma_max_rows(true) && mma_takes(x, norm_weight.ptr<float>(), w, cuda::MmaProduct::kPlain);
}

void CudaBackend::norm_matmul(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                              const Tensor& bias, const Tensor& out, const Tensor& normed) {
    if (!use_gemv_norm(x, norm_weight, w)) {
        if (const Tensor x8 = norm_e4m3(x, norm_weight, eps, w); !x8.empty()) {
            matmul(x8, w, bias, out);
            return;
        }
        rms_norm(x, Tensor(), norm_weight, eps, normed);
        matmul(normed, w, bias, out);
        return;
    }
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    PG_CHECK(w.cols() == k && out.rows() == n && out.cols() == m, "norm_matmul shapes: x ", x.shape_str(), " w ",
             w.shape_str(), " out ", out.shape_str());
    cuda::gemv_norm(x.ptr<float>(), norm_weight.ptr<float>(), eps, gemv_weight(w), out.data, out.dtype == DType::F32,
                    static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), stream_);
    if (!bias.empty()) {
        PG_CHECK(out.dtype == DType::BF16 && bias.dtype == DType::F32 && bias.numel() == m);
        cuda::add_bias(bf(out), bias.ptr<float>(), n, m, stream_);
    }
}

void CudaBackend::norm_matmul_silu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w_gate_up,
                                   const Tensor& out, const Tensor& normed, const Tensor& scratch) {
    if (!use_gemv_norm(x, norm_weight, w_gate_up)) {
        if (w_gate_up.dtype == DType::F8_E4M3) {  // norm_matmul quantizes the input in the norm
            norm_matmul(x, norm_weight, eps, w_gate_up, Tensor(), scratch, normed);
            silu_mul_packed(scratch, out);
            return;
        }
        rms_norm(x, Tensor(), norm_weight, eps, normed);
        matmul_silu(normed, w_gate_up, out, scratch);
        return;
    }
    const int64_t n = x.rows(), k = x.cols(), m = w_gate_up.rows();
    PG_CHECK(w_gate_up.cols() == k && out.rows() == n && 2 * out.cols() == m && out.dtype == DType::BF16,
             "norm_matmul_silu shapes: x ", x.shape_str(), " w ", w_gate_up.shape_str(), " out ", out.shape_str());
    cuda::gemv_norm_silu(x.ptr<float>(), norm_weight.ptr<float>(), eps, gemv_weight(w_gate_up), bf(out),
                         static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), stream_);
}

// The o / down products (+ residual): to 2 rows on the decode kernels (use_gemv); at 3-8 rows
// on the tensor-core kernel where it takes them (FP8: where it stages the x; bf16: where x fits
// in 96 KB, gemv_mma.cu's bf16_auto), else cuBLASLt. H200, decode tok/s at batch 4,
// cuBLASLt / tensor-core kernel (2026-11-29, two rounds): 8B FP8 954.3 / 1,016.6, 959.4 / 1,016.9
// (1,214.4 once the 8B's down fits the staging limit, gemv_mma.cu); 1B FP8 3,105.6 / 4,608.1,
// 3,120.0 / 4,618.0: cuBLASLt's FP8 path pays a quantize pass and tiles made for more rows.
// Likewise at 5-8 rows (a batch-8 step), 4 / 8 rows here (session 31, tok/s): 1B FP8 5,747.6 /
// 6,035.4 (7,158 once its down fits the staging limit), 8B FP8 1,824.2 / 1,906.9, 1B bf16
// 6,702.2 / 7,020.5, 8B bf16 1,647.5 / 1,689.8. PEREGRINE_GEMV_ADD_MAX_ROWS=2 | 4 keeps more rows
// on cuBLASLt.
bool CudaBackend::use_gemv_add(const Tensor& x, const Tensor& w) const {
    return use_gemv(x, w) || mma_unnormed(options_, x, w, cuda::MmaProduct::kAdd);
}

void CudaBackend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& scratch) {
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    PG_CHECK(w.cols() == k && residual.rows() == n && residual.cols() == m && residual.dtype == DType::F32 &&
                 (x.dtype == DType::BF16 || fp8_pair(x, w)) && is_product_weight(w),
             "matmul_add shapes: x ", x.shape_str(), " w ", w.shape_str(), " residual ", residual.shape_str());
    if (n == 0) return;
    if (use_gemv_add(x, w)) {
        cuda::gemv_add(bf(x), gemv_weight(w), residual.ptr<float>(), static_cast<int>(n), static_cast<int>(m),
                       static_cast<int>(k), stream_);
    } else if (!options_.batch_invariant) {
        cublas_matmul(x, w, residual, 1.0f, scratch);  // cuBLASLt adds into D = C (beta 1)
    } else {
        matmul(x, w, Tensor(), scratch);
        add(scratch, residual);
    }
}

void CudaBackend::cublas_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta,
                                const Tensor& tune_out) {
    PG_CHECK(beta == 0.0f || !tune_out.empty(), "cublas_matmul: accumulating needs a scratch to time candidates in");
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    if (w.dtype == DType::F8_E4M3) {
        fp8_matmul(x, w, out, beta, tune_out.empty() ? out : tune_out);
        return;
    }
    if (dtype_is_gpu_layout(w.dtype)) {
        gguf_matmul(x, w, out, beta, tune_out.empty() ? out : tune_out);
        return;
    }
    lt_matmul(w.data, x.data, false, n, m, k, out.data, out.dtype, beta, tune_out.empty() ? out.data : tune_out.data);
}

void CudaBackend::fp8_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta, const Tensor& tune) {
    PG_CHECK(w.scale != nullptr, "f8_e4m3 weight ", w.shape_str(), " without row factors");
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    // Rows of x a fallback GEMM takes at a time bound its bf16 buffer (2048 x 28,672 x 2 bytes =
    // 117 MB for the 8B shape's gate | up) whatever the step's token count.
    constexpr int64_t kRowsPerGemm = 2048;
    const int64_t rows = std::min(n, kRowsPerGemm);
    // x as codes and per-row factors: given so (fp8_activation), or quantized here into
    // f8_input_ (growing the buffers moves them: quantize after).
    const bool given = x.dtype == DType::F8_E4M3;
    PG_CHECK(!given || x.scale != nullptr, "an f8_e4m3 x ", x.shape_str(), " without row factors");
    auto quantize_x = [&](int64_t product) {
        ensure_fp8_buffers(given ? 0 : n * k, given ? 0 : n, product);
        if (!given)
            cuda::quantize_rows_e4m3(bf(x), static_cast<uint8_t*>(f8_input_.data), f8_scale_.ptr<float>(), n, k,
                                     stream_);
    };
    auto x_codes = [&] { return static_cast<const uint8_t*>(given ? x.data : f8_input_.data); };
    auto x_scale = [&] { return given ? x.scale : f8_scale_.ptr<float>(); };
    // One GEMM with both factor vectors (outer-vector scaling) where this cuBLASLt has it.
    if (fp8_outer_vectors_) {
        quantize_x(0);
        if (lt_matmul(w.data, x_codes(), true, n, m, k, out.data, out.dtype, beta, tune.data, w.scale, x_scale()))
            return;
        fp8_outer_vectors_ = false;
    }
    // Else unit-factor GEMMs into a bf16 buffer and a factor pass.
    quantize_x(rows * m);
    const size_t out_row = dtype_row_bytes(out.dtype, m);
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int64_t nn = std::min(rows, n - r0);
        lt_matmul(w.data, x_codes() + r0 * k, true, nn, m, k, f8_product_.data, DType::BF16, 0.0f, f8_product_.data);
        cuda::scale_fp8_product(f8_product_.ptr<cuda::bf16_t>(), w.scale, x_scale() + r0,
                                static_cast<char*>(out.data) + r0 * out_row, out.dtype == DType::F32, beta != 0.0f, nn,
                                m, stream_);
    }
}

bool CudaBackend::lt_matmul(const void* w, const void* x, bool fp8, int64_t n, int64_t m, int64_t k, void* out,
                            DType out_dtype, float beta, void* tune, const float* w_scale, const float* x_scale,
                            int64_t ldd) {
    const bool outer = w_scale != nullptr;
    if (ldd == 0) ldd = m;
    const auto key =
        std::make_tuple(n, m, k, static_cast<int>(out_dtype) | (fp8 ? 0x100 : 0) | (outer ? 0x200 : 0), ldd);
    // Outer-vector factors: D[i, j] *= w_scale[i] * x_scale[j]. The heuristic wants the pointers
    // set (it found nothing without them); they change with every weight, so every call sets them.
    auto set_factors = [&](cublasLtMatmulDesc_t desc) {
        PG_LT_CHECK(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
        PG_LT_CHECK(
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
    };
    auto it = gemms_.find(key);
    if (it == gemms_.end()) {
        PG_CHECK(!capturing(), "CUDA backend: new GEMM shape while recording a graph");
        // Row-major out[n, m] = x[n, k] · w[m, k]ᵀ is column-major D[m, n] = Wᵀ-op(A)[m, k] · B[k, n]
        // with A = w seen column-major as [k, m] (ld k) and B = x seen as [k, n] (ld k). FP8 needs
        // exactly this "TN" form on Hopper.
        auto g = std::make_unique<Gemm>();
        PG_LT_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
        PG_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
        PG_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
        // FP8: fast accumulation (the tensor cores' own accumulator through the k loop, not
        // promoted to f32 every few steps), as the FP8 GEMMs of vLLM and TensorRT-LLM run;
        // PEREGRINE_FP8_FAST_ACCUM=0 turns it off.
        static const bool fast_accum = !env_equals("PEREGRINE_FP8_FAST_ACCUM", "0");
        if (fp8 && fast_accum) {
            const int8_t on = 1;
            PG_LT_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
        }
        if (outer) {
            const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            PG_LT_CHECK(
                cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
            PG_LT_CHECK(
                cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
            set_factors(g->desc);
        }
        const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        PG_LT_CHECK(cublasLtMatrixLayoutCreate(&g->a, in_type, k, m, k));
        PG_LT_CHECK(cublasLtMatrixLayoutCreate(&g->b, in_type, k, n, k));
        PG_LT_CHECK(cublasLtMatrixLayoutCreate(&g->d, cuda_type(out_dtype), m, n, ldd));
        cublasLtMatmulPreference_t pref = nullptr;
        PG_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        PG_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &lt_workspace_bytes_, sizeof(lt_workspace_bytes_)));
        constexpr int kCandidates = 8;
        cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(lt_), g->desc, g->a, g->b, g->d, g->d, pref,
                                                                 kCandidates, results, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
            if (outer) return false;  // the caller applies the factors itself
            fail("cuBLASLt: no algorithm for a ", n, "x", k, " by ", m, "x", k, fp8 ? " fp8" : " bf16", " matmul into ",
                 dtype_name(out_dtype));
        }
        g->algo = results[0].algo;
        // Decode-sized products (the shapes CUDA graphs replay, all met in the warm-up) are timed
        // once on the real operands and the fastest candidate kept: the heuristic's first pick
        // for a skinny product is often not the fastest (split-K choices especially). A shape
        // first met later (a mixed step's token count) is not: timing 8 candidates waits for the
        // device inside that step, ~ms a shape, which a cold server's first requests paid.
        static const bool tune_always = env_equals("PEREGRINE_GEMM_TUNE", "always");
        static const bool log_new = env_equals("PEREGRINE_GEMM_LOG", "1");
        if (log_new && warm_up_over_)
            std::fprintf(stderr, "gemm: new shape n=%lld m=%lld k=%lld%s after the warm-up\n",
                         static_cast<long long>(n), static_cast<long long>(m), static_cast<long long>(k),
                         fp8 ? " fp8" : "");
        if (n <= 256 && found > 1 && (!warm_up_over_ || tune_always)) {
            cudaEvent_t e0, e1;
            PG_CUDA_CHECK(cudaEventCreate(&e0));
            PG_CUDA_CHECK(cudaEventCreate(&e1));
            const float alpha = 1.0f, zero = 0.0f;
            float best = 1e30f;
            for (int i = 0; i < found; ++i) {
                auto run = [&] {
                    return cublasLtMatmul(lt_handle(lt_), g->desc, &alpha, w, g->a, x, g->b, &zero, tune, g->d, tune,
                                          g->d, &results[i].algo, lt_workspace_, lt_workspace_bytes_, stream_);
                };
                if (run() != CUBLAS_STATUS_SUCCESS) continue;
                PG_CUDA_CHECK(cudaEventRecord(e0, stream_));
                for (int r = 0; r < 5; ++r) run();
                PG_CUDA_CHECK(cudaEventRecord(e1, stream_));
                PG_CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                PG_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (ms < best) {
                    best = ms;
                    g->algo = results[i].algo;
                }
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        it = gemms_.emplace(key, std::move(g)).first;
    }
    const Gemm& g = *it->second;
    if (outer) set_factors(g.desc);
    const float alpha = 1.0f;
    PG_LT_CHECK(cublasLtMatmul(lt_handle(lt_), g.desc, &alpha, w, g.a, x, g.b, &beta, out, g.d, out, g.d, &g.algo,
                               lt_workspace_, lt_workspace_bytes_, stream_));
    return true;
}

}  // namespace peregrine
