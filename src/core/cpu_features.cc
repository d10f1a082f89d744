#include "core/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace peregrine {

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = [] {
        CpuFeatures c;
#if defined(__x86_64__)
        __builtin_cpu_init();
        c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
        c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
        c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
        // CPUID.(EAX=7, ECX=0):EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE (GCC 12 has no names for them).
        unsigned a = 0, b = 0, cx = 0, d = 0;
        if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) c.amx = (d >> 22 & 1) && (d >> 24 & 1);
#endif
        return c;
    }();
    return f;
}

CpuIsa cpu_isa() {
    static const CpuIsa isa = [] {
        const CpuFeatures& f = cpu_features();
        CpuIsa best = f.avx512 ? CpuIsa::Avx512 : f.avx2 ? CpuIsa::Avx2 : CpuIsa::Scalar;
        if (const char* want = std::getenv("PEREGRINE_ISA")) {
            if (std::strcmp(want, "avx2") == 0 && f.avx2) best = CpuIsa::Avx2;
            if (std::strcmp(want, "scalar") == 0) best = CpuIsa::Scalar;
        }
        return best;
    }();
    return isa;
}

bool cpu_bf16_kernels() {
    return cpu_isa() == CpuIsa::Avx512 && cpu_features().avx512_bf16;
}

const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::Avx512:
            return "avx512";
        case CpuIsa::Avx2:
            return "avx2";
        case CpuIsa::Scalar:
            return "scalar";
    }
    return "?";
}

}  // namespace peregrine
