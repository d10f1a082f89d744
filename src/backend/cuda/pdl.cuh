// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
// kernel before it on the stream is still running, once every CTA of that one has called
// pdl_launch_dependents (or exited). Its CTAs then sit resident, doing whatever needs no
// earlier result (weight prefetch, index math), and pdl_wait blocks until the previous grid has
// completed and its writes are visible. That hides the launch and ramp of each of the ~165
// kernels of a decode step behind the tail of the one before.
//
// The rule every kernel launched with launch_pdl keeps: no read of anything an earlier kernel
// writes, and no write at all, before pdl_wait(). (Waiting makes the previous grid complete,
// and that grid waited for its own predecessor, so everything enqueued earlier is done.)
// Weights and other data written before the step began may be read before the wait.
// pdl_wait is a no-op in a kernel launched without the attribute.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace peregrine::cuda {

__device__ __forceinline__ void pdl_wait() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Lets the next kernel on the stream start launching; call early (it implies nothing about
// this kernel's writes: the dependent still waits for completion in pdl_wait).
__device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// SM count of the current device, queried once per device (132 on an H100 SXM; 132 without a
// device, where only sizes are computed).
int sm_count();

// Whether launch_pdl sets the attribute (PEREGRINE_PDL=0 turns it off, for comparisons).
bool pdl_enabled();

namespace detail {
// cudaLaunchKernelEx with the PDL attribute (on or off per pdl_enabled) and, where `cluster` is
// given, thread-block clusters of that shape (set whether or not PDL is on).
template <typename... KernelArgs, typename... Args>
void launch_ex(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, const dim3* cluster, size_t smem,
               cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
    if (cluster != nullptr) {
        attr[1].id = cudaLaunchAttributeClusterDimension;
        attr[1].val.clusterDim.x = cluster->x;
        attr[1].val.clusterDim.y = cluster->y;
        attr[1].val.clusterDim.z = cluster->z;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = cluster != nullptr ? 2 : 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
}  // namespace detail

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
// The caller checks the launch (check_launch) as for <<<>>>.
template <typename... KernelArgs, typename... Args>
void launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
    detail::launch_ex(kernel, grid, block, nullptr, smem, stream, std::forward<Args>(args)...);
}

// launch_pdl with the CTAs grouped into thread-block clusters of `cluster` CTAs (each grid
// dimension a multiple of it; at most 8 CTAs in all stays portable). The cluster shape applies
// with PEREGRINE_PDL=0 too.
template <typename... KernelArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                        cudaStream_t stream, Args&&... args) {
    detail::launch_ex(kernel, grid, block, &cluster, smem, stream, std::forward<Args>(args)...);
}

}  // namespace peregrine::cuda
