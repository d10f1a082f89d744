// What the CPU we run on can do, read once at start.
#pragma once

#include <string>

namespace peregrine {

enum class CpuIsa { Scalar, Avx2, Avx512 };

struct CpuFeatures {
    bool avx2 = false;    // with FMA and F16C
    bool avx512 = false;  // F, BW, VL, DQ
    bool avx512_bf16 = false;
    bool avx512_vnni = false;  // vpdpbusd: the int8 path of quantized weights
    bool amx = false;
};

const CpuFeatures& cpu_features();

// The best kernel set this CPU runs, unless PEREGRINE_ISA=avx2|scalar asks for a lower one.
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

// Whether the kernels in use multiply bf16 pairs (vdpbf16ps: `--dtype bfloat16`): the AVX-512
// set on a CPU with AVX512-BF16.
bool cpu_bf16_kernels();

}  // namespace peregrine
