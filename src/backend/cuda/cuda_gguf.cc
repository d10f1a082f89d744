// GGUF layer matrices on the GPU: repacked at placement into the device layouts of
// core/gpu_quant.h (16-byte chunks of codes, f16 factors per block), read by the decode
// products in registers; larger products by gguf_gemm (tensor cores, the codes unpacked in
// registers), or past CudaOptions::gguf_gemm_max_rows the matrix dequantized to bf16 for cuBLASLt.
#include "backend/cuda/cuda_gguf.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gguf_gemm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/gpu_quant.h"

namespace peregrine {

cuda::GemvWeight gguf_gemv_weight(const Tensor& w, int64_t first_row) {
    PG_CHECK(dtype_is_gpu_layout(w.dtype) && w.ndim == 2, "not a GGUF device-layout matrix: ", w.shape_str());
    PG_CHECK(first_row >= 0 && first_row <= w.rows(), "row ", first_row, " of ", w.shape_str());
    const auto kind = gemv_kind(w.dtype);
    const size_t code_bytes = gpu_code_bytes(w.dtype, w.cols()), factor_bytes = gpu_factor_bytes(w.dtype, w.cols());
    const char* codes = w.ptr<char>();
    return cuda::GemvWeight(kind, codes + first_row * code_bytes,
                            codes + w.rows() * code_bytes + first_row * factor_bytes);
}

cuda::GemvWeight::Kind gemv_kind(DType dtype) {
    switch (dtype) {
        case DType::F8_E4M3:
            return cuda::GemvWeight::kF8;
        case DType::GQ8_32:
            return cuda::GemvWeight::kI8B32;
        case DType::GQ8_16:
            return cuda::GemvWeight::kI8B16;
        case DType::GQ6_32:
            return cuda::GemvWeight::kU6;
        case DType::GQ4_32:
            return cuda::GemvWeight::kU4;
        default:
            return cuda::GemvWeight::kBf16;
    }
}

bool CudaBackend::keeps_gguf(const std::vector<Tensor>& parts) const {
    if (!options_.gguf_quantized || options_.batch_invariant || parts.empty()) return false;
    for (const Tensor& p : parts)
        if (p.empty() || p.device != Device::CPU || p.ndim != 2 || !has_gpu_layout(p.dtype) ||
            p.cols() != parts[0].cols() || gpu_layout_of(p.dtype) != gpu_layout_of(parts[0].dtype))
            return false;
    return parts[0].cols() % 32 == 0;
}

// Q6_K's device layout: GQ6_32 (7 bits a value; H100, 8B Q4_K_M batch-1 decode 395.6 -> 406.5
// tok/s, 2026-11-27), or with PEREGRINE_Q6K_LAYOUT=int8 GQ8_16 (int8 codes, 9 bits a value; the
// same values).
namespace {
DType q6_k_layout() {
    static const DType t = env_equals("PEREGRINE_Q6K_LAYOUT", "int8") ? DType::GQ8_16 : DType::GQ6_32;
    return t;
}
}  // namespace

Tensor CudaBackend::place_gguf(const std::vector<Tensor>& parts, bool product) {
    const DType layout = parts[0].dtype == DType::Q6_K ? q6_k_layout() : gpu_layout_of(parts[0].dtype);
    const int64_t k = parts[0].cols();
    int64_t rows = 0;
    for (const Tensor& p : parts) rows += p.rows();
    Tensor dev(nullptr, layout, {rows, k}, Device::CUDA);
    allocate_weight(dev);  // rows x (code + factor bytes): the codes of every row, then the factors
    const size_t code_bytes = gpu_code_bytes(layout, k), factor_bytes = gpu_factor_bytes(layout, k);
    char* codes = dev.ptr<char>();
    char* factors = codes + rows * code_bytes;
    ensure_stage();
    const int64_t per_stage = static_cast<int64_t>(stage_bytes_ / (code_bytes + factor_bytes));
    PG_CHECK(per_stage > 0, "GGUF weight row too long for the staging buffer");
    int64_t at = 0;  // first row of the current part in `dev`
    for (const Tensor& p : parts) {
        for (int64_t r0 = 0; r0 < p.rows(); r0 += per_stage) {
            const int64_t n = std::min(per_stage, p.rows() - r0);
            auto* stage_codes = static_cast<uint8_t*>(stage_);
            uint8_t* stage_factors = stage_codes + n * code_bytes;
            repack_rows(p, r0, n, stage_codes, stage_factors, layout);
            PG_CUDA_CHECK(cudaMemcpyAsync(codes + (at + r0) * code_bytes, stage_codes, n * code_bytes,
                                          cudaMemcpyHostToDevice, stream_));
            PG_CUDA_CHECK(cudaMemcpyAsync(factors + (at + r0) * factor_bytes, stage_factors, n * factor_bytes,
                                          cudaMemcpyHostToDevice, stream_));
            synchronize();  // the stage is refilled next
        }
        at += p.rows();
    }
    // Larger products dequantize into one bf16 buffer: the matrix, or whole row chunks of it
    // (gguf_matmul) where it is larger than the cap.
    const int64_t want = std::min(rows * k, std::max(k, options_.gguf_scratch_elements / k * k));
    if (product && gguf_scratch_.numel() < want) {
        if (!gguf_scratch_.empty()) release(gguf_scratch_);
        gguf_scratch_ = allocate(DType::BF16, {want});
    }
    return dev;
}

Tensor CudaBackend::place_layer_matrix(const std::vector<Tensor>& parts, bool product) {
    if (parts.size() == 1 && parts[0].empty()) return parts[0];
    if (keeps_gguf(parts)) {
        if (parts.size() > 1) return place_gguf(parts, product);
        if (auto it = placed_.find(parts[0].data); it != placed_.end()) return it->second;
        return placed_[parts[0].data] = place_gguf(parts, product);
    }
    return parts.size() == 1 ? place_weight(parts[0], true) : place_stacked(parts, true);
}

namespace {
// The most rows gguf_gemm takes: the option, PEREGRINE_GGUF_GEMM_MAX_ROWS, else one token tile
// (more dequantize for cuBLASLt; H200, the 8B shapes: at 64 rows gguf_gemm is 1.19-1.90x as fast
// as dequantize + cuBLASLt, at 128 0.62-0.88x; PERFORMANCE.md).
int gguf_gemm_max_rows(int option) {
    if (option >= 0) return option;
    static const int env = [] {
        const int v = env_int("PEREGRINE_GGUF_GEMM_MAX_ROWS", -1);
        return v >= 0 ? v : env_equals("PEREGRINE_GGUF_GEMM", "0") ? 0 : cuda::kGgufGemmMaxRows;
    }();
    return env;
}
}  // namespace

void CudaBackend::gguf_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta, const Tensor& tune) {
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    PG_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16, "GGUF product into ", dtype_name(out.dtype));
    const cuda::GemvWeight gw = gguf_gemv_weight(w);
    if (n <= gguf_gemm_max_rows(options_.gguf_gemm_max_rows) &&
        cuda::gguf_gemm_supported(gw, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), x.data)) {
        // Its f32 partial sums (split k, few CTAs) live in the dequantize buffer, unused here.
        cuda::gguf_gemm(x.ptr<cuda::bf16_t>(), gw, out.data, out.dtype == DType::F32, beta, static_cast<int>(n),
                        static_cast<int>(m), static_cast<int>(k), gguf_scratch_.ptr<float>(),
                        static_cast<size_t>(gguf_scratch_.numel()) / 2, stream_);
        return;
    }
    // Rows a pass: all of them, or as many whole rows as the buffer holds (a multiple of 128,
    // keeping cuBLASLt's tiles whole), each pass filling its column band of out (ld m).
    int64_t per = gguf_scratch_.numel() / k;
    if (per < m && per >= 128) per -= per % 128;
    PG_CHECK(per > 0, "GGUF product ", w.shape_str(), " larger than its dequantize buffer");
    const size_t elem = dtype_row_bytes(out.dtype, 1);
    for (int64_t r0 = 0; r0 < m; r0 += per) {
        const int64_t rows = std::min(per, m - r0);
        cuda::dequantize_weight(gguf_gemv_weight(w, r0), gguf_scratch_.ptr<cuda::bf16_t>(), static_cast<int>(rows),
                                static_cast<int>(k), stream_);
        lt_matmul(gguf_scratch_.data, x.data, false, n, rows, k, static_cast<char*>(out.data) + r0 * elem, out.dtype,
                  beta, static_cast<char*>(tune.data) + r0 * elem, nullptr, nullptr, m);
    }
}

}  // namespace peregrine
