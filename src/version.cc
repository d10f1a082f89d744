#include "peregrine/version.h"

#include "core/cpu_features.h"
#include "core/error.h"

namespace peregrine {

const char* version() {
    return PG_VERSION;
}

std::string build_info() {
    const CpuFeatures& f = cpu_features();
    std::string cpu = str_cat("cpu (kernels: avx512, avx2; this machine: ", cpu_isa_name(cpu_isa()),
                              f.avx512_bf16 ? ", avx512-bf16" : "", f.amx ? ", amx" : "", ")");
#ifdef PG_WITH_CUDA
    const std::string cuda = "cuda (sm_90a: cuBLASLt bf16 GEMMs; own paged-attention, RMSNorm, RoPE, sampling kernels; CUDA graphs)";
#else
    const std::string cuda = "cuda (not compiled in)";
#endif
    return str_cat("peregrine ", version(), "\nbackends: ", cpu, ", ", cuda, "\n");
}

}  // namespace peregrine
