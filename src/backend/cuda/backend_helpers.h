// Helpers the CUDA backend's sources share (cuda_backend.cc, cuda_products.cc): cuBLASLt
// handles and types, typed views of tensors, a product weight as the decode kernels take it.
// Internal to src/backend/cuda.
#pragma once

#include <cublasLt.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gguf.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"

namespace peregrine {

#define PG_LT_CHECK(expr)                                                                               \
    do {                                                                                                \
        const cublasStatus_t st_ = (expr);                                                              \
        if (st_ != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error ", static_cast<int>(st_), " in " #expr); \
    } while (0)

inline cublasLtHandle_t lt_handle(void* p) {
    return static_cast<cublasLtHandle_t>(p);
}

inline cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::F32:
            return CUDA_R_32F;
        case DType::BF16:
            return CUDA_R_16BF;
        case DType::F16:
            return CUDA_R_16F;
        case DType::F8_E4M3:
            return CUDA_R_8F_E4M3;
        default:
            fail("CUDA backend: no matmul type for ", dtype_name(t));
    }
}

inline cuda::bf16_t* bf(const Tensor& t) {
    PG_CHECK(t.dtype == DType::BF16, "expected a bf16 tensor, got ", dtype_name(t.dtype));
    return t.ptr<cuda::bf16_t>();
}

// A product's weight for the decode kernels: bf16, e4m3 with its row factors, or a GGUF layout.
inline cuda::GemvWeight gemv_weight(const Tensor& w) {
    if (w.dtype == DType::F8_E4M3) {
        PG_CHECK(w.scale != nullptr, "f8_e4m3 weight ", w.shape_str(), " without row factors");
        return cuda::GemvWeight(w.ptr<uint8_t>(), w.scale);
    }
    if (dtype_is_gpu_layout(w.dtype)) return gguf_gemv_weight(w);
    return cuda::GemvWeight(bf(w));
}

inline bool is_product_weight(const Tensor& w) {
    return w.dtype == DType::BF16 || w.dtype == DType::F8_E4M3 || dtype_is_gpu_layout(w.dtype);
}

// A cached cuBLASLt plan for one (n, m, k, out dtype): lt_matmul makes it, ~CudaBackend frees it.
struct CudaBackend::Gemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Gemm() {
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

}  // namespace peregrine
