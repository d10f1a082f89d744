// AVX-512 kernels (compiled with -mavx512f/bw/vl/dq/bf16/vnni); used only when the CPU has them
// (the int8 path needs VNNI too: kernels_avx512_no_vnni swaps in AVX2's where it is missing).
#define PG_KERNEL_AVX512 1
#define PG_KERNEL_NS avx512
#define PG_KERNEL_NAME "avx512"
#include "backend/cpu/kernels_impl.h"

namespace peregrine::cpu {
const Kernels& kernels_avx512() {
    return avx512::table();
}

const Kernels& kernels_avx512_no_vnni() {
    static const Kernels k = [] {
        Kernels t = avx512::table();
        const Kernels& fallback = kernels_avx2();
        t.quantize_acts = fallback.quantize_acts;
        t.qmatmul_rows = fallback.qmatmul_rows;
        t.qmatmul_align = fallback.qmatmul_align;
        t.qmatmul_name = fallback.qmatmul_name;
        return t;
    }();
    return k;
}
}  // namespace peregrine::cpu
