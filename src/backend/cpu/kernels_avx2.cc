// AVX2 + FMA + F16C kernels: the fallback for CPUs without AVX-512.
#define PG_KERNEL_AVX2 1
#define PG_KERNEL_NS avx2
#define PG_KERNEL_NAME "avx2"
#include "backend/cpu/kernels_impl.h"

namespace peregrine::cpu {
const Kernels& kernels_avx2() {
    return avx2::table();
}

bool matmul_supports(DType t) {
    return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::Q8_0;
}

bool qmatmul_supports(DType t) {
    return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K || t == DType::Q6_K;
}

size_t qmatmul_scratch_bytes(int64_t k) {
    // A panel of 16 weight rows: k bytes each, plus two f32 per row per sub-block of 16.
    return static_cast<size_t>(16 * k + 2 * 4 * 16 * (k / 16) + 64);
}
}  // namespace peregrine::cpu
