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
}  // namespace peregrine::cpu
