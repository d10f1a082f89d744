// GGUF layer matrices on the GPU: repacked at placement into the device layouts of
// core/gpu_quant.h (16-byte chunks of codes, f16 factors per block), read by the decode
// products in registers; larger products dequantize the matrix to bf16 for cuBLASLt.
#include "backend/cuda/cuda_gguf.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "core/gpu_quant.h"

namespace peregrine {

cuda::GemvWeight gguf_gemv_weight(const Tensor& w) {
    PG_CHECK(dtype_is_gpu_layout(w.dtype) && w.ndim == 2, "not a GGUF device-layout matrix: ", w.shape_str());
    const auto kind = w.dtype == DType::GQ8_32   ? cuda::GemvWeight::kI8B32
                      : w.dtype == DType::GQ8_16 ? cuda::GemvWeight::kI8B16
                                                 : cuda::GemvWeight::kU4;
    const char* codes = w.ptr<char>();
    return cuda::GemvWeight(kind, codes, codes + w.rows() * gpu_code_bytes(w.dtype, w.cols()));
}

bool CudaBackend::keeps_gguf(const std::vector<Tensor>& parts) const {
    if (!options_.gguf_quantized || options_.batch_invariant || parts.empty()) return false;
    for (const Tensor& p : parts)
        if (p.empty() || p.device != Device::CPU || p.ndim != 2 || !has_gpu_layout(p.dtype) ||
            p.cols() != parts[0].cols() || gpu_layout_of(p.dtype) != gpu_layout_of(parts[0].dtype))
            return false;
    return parts[0].cols() % 32 == 0;
}

Tensor CudaBackend::place_gguf(const std::vector<Tensor>& parts, bool product) {
    const DType layout = gpu_layout_of(parts[0].dtype);
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
            repack_rows(p, r0, n, stage_codes, stage_factors);
            PG_CUDA_CHECK(cudaMemcpyAsync(codes + (at + r0) * code_bytes, stage_codes, n * code_bytes,
                                          cudaMemcpyHostToDevice, stream_));
            PG_CUDA_CHECK(cudaMemcpyAsync(factors + (at + r0) * factor_bytes, stage_factors, n * factor_bytes,
                                          cudaMemcpyHostToDevice, stream_));
            synchronize();  // the stage is refilled next
        }
        at += p.rows();
    }
    // Larger products dequantize into one bf16 buffer: big enough for the largest matrix.
    if (product && gguf_scratch_.numel() < rows * k) {
        if (!gguf_scratch_.empty()) release(gguf_scratch_);
        gguf_scratch_ = allocate(DType::BF16, {rows * k});
    }
    return dev;
}

Tensor CudaBackend::place_layer_matrix(const std::vector<Tensor>& parts) {
    if (parts.size() == 1 && parts[0].empty()) return parts[0];
    if (keeps_gguf(parts)) {
        if (parts.size() > 1) return place_gguf(parts);
        if (auto it = placed_.find(parts[0].data); it != placed_.end()) return it->second;
        return placed_[parts[0].data] = place_gguf(parts);
    }
    return parts.size() == 1 ? place_weight(parts[0], true) : place_stacked(parts, true);
}

Tensor CudaBackend::place_embedding(const Tensor& host, bool tied_head) {
    if (!keeps_gguf({host})) return place_weight(host, true);
    if (auto it = placed_.find(host.data); it != placed_.end()) return it->second;
    return placed_[host.data] = place_gguf({host}, tied_head);
}

void CudaBackend::gguf_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta, const Tensor& tune) {
    const int64_t n = x.rows(), k = x.cols(), m = w.rows();
    PG_CHECK(gguf_scratch_.numel() >= m * k, "GGUF product ", w.shape_str(), " larger than its dequantize buffer");
    cuda::dequantize_weight(gguf_gemv_weight(w), gguf_scratch_.ptr<cuda::bf16_t>(), static_cast<int>(m),
                            static_cast<int>(k), stream_);
    lt_matmul(gguf_scratch_.data, x.data, false, n, m, k, out.data, out.dtype, beta, tune.data);
}

}  // namespace peregrine
