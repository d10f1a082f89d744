// AVX-512 kernels (compiled with -mavx512f/bw/vl/dq/bf16); used only when the CPU has them.
#define PG_KERNEL_AVX512 1
#define PG_KERNEL_NS avx512
#define PG_KERNEL_NAME "avx512"
#include "backend/cpu/kernels_impl.h"

namespace peregrine::cpu {
const Kernels& kernels_avx512() {
    return avx512::table();
}
}  // namespace peregrine::cpu
