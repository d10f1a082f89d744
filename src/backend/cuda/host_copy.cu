// The KV host tier's copies (issue #21): many block-sized pieces between device KV blocks and
// pinned host memory in one kernel. cudaMemcpyAsync per piece (a layer's K or V of one block,
// 16 KB for the 1B shape) costs microseconds each in the driver and the copy engine: a step
// that moves a few hundred blocks made tens of thousands of them. Here each CTA copies pieces
// with 16-byte loads and stores, reading or writing host memory through its device alias (pinned
// memory is mapped under unified addressing), so a step's moves are one launch.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {

namespace {

__global__ void host_copy_kernel(const HostCopy* __restrict__ copies, int n) {
    for (int c = blockIdx.x; c < n; c += gridDim.x) {
        const HostCopy cp = copies[c];
        const int4* src = reinterpret_cast<const int4*>(cp.src);
        int4* dst = reinterpret_cast<int4*>(cp.dst);
        const uint32_t n16 = cp.bytes / 16;
        for (uint32_t i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = src[i];
    }
}

}  // namespace

void host_copies(const HostCopy* d_copies, int n, cudaStream_t stream, int max_ctas) {
    if (n <= 0) return;
    const int grid = n < max_ctas ? n : max_ctas;
    host_copy_kernel<<<grid, 256, 0, stream>>>(d_copies, n);
    check_launch("host_copies");
}

}  // namespace peregrine::cuda
