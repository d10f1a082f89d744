// Error checks for CUDA runtime calls and kernel launches: both throw peregrine::Error.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace peregrine::cuda {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
    if (e != cudaSuccess) fail("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorString(e));
}

// After a kernel launch: reports bad launch configurations (and earlier asynchronous errors).
inline void check_launch(const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) fail("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(e));
}

}  // namespace peregrine::cuda

#define PG_CUDA_CHECK(expr) ::peregrine::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
