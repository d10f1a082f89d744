#include "peregrine/version.h"

#include <string_view>

#include "core/cpu_features.h"
#include "core/error.h"

namespace peregrine {

const char* version() {
    return PG_VERSION;
}

std::string build_info() {
    const CpuFeatures& f = cpu_features();
    // What the processor has, then what the CPU backend runs: PEREGRINE_ISA may ask for less,
    // and AVX512-BF16 / VNNI are used only by the AVX-512 kernels.
    const CpuIsa isa = cpu_isa();
    const char* hw = f.avx512 ? "avx512" : f.avx2 ? "avx2" : "scalar";
    const bool vnni = isa == CpuIsa::Avx512 && f.avx512_vnni;
    std::string cpu = str_cat("cpu (kernels: avx512, avx2; this machine: ", hw, f.avx512_bf16 ? ", avx512-bf16" : "",
                              f.avx512_vnni ? ", avx512-vnni" : "", f.amx ? ", amx (no amx kernels)" : "",
                              "; in use: ", cpu_isa_name(isa), vnni ? " + vnni" : "",
                              cpu_bf16_kernels() ? " (bf16 with --dtype bfloat16)" : "",
                              std::string_view(cpu_isa_name(isa)) != hw ? " (PEREGRINE_ISA)" : "", ")");
#ifdef PG_WITH_CUDA
    const std::string cuda =
        "cuda (sm_90a: cuBLASLt bf16 GEMMs; own paged-attention, RMSNorm, RoPE, sampling kernels; CUDA graphs)";
#else
    const std::string cuda = "cuda (not compiled in)";
#endif
    return str_cat("peregrine ", version(), "\nbackends: ", cpu, ", ", cuda, "\n");
}

}  // namespace peregrine
