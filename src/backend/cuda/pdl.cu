#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char* v = std::getenv("PEREGRINE_PDL");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return on;
}

// SM count of the current device, queried once per device (132 on an H100 SXM).
int sm_count() {
    static std::atomic<int> cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 132;  // no device: only sizes are computed, nothing runs
    }
    std::atomic<int>& slot = cached[dev & 63];
    int v = slot.load(std::memory_order_relaxed);
    if (v > 0) return v;
    PG_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    slot.store(v, std::memory_order_relaxed);
    return v;
}

}  // namespace peregrine::cuda
