// Test hook of the paged-attention launcher (plain C++: tests include it from .cc files).
#pragma once

namespace peregrine::cuda {

enum class AttentionKernelChoice {
    Auto,          // the fast kernels where they apply (decode / tensor-core prefill), else generic
    Generic,       // the generic f32 kernel for every batch (to check it against the CPU, too)
    SplitCombine,  // as Auto, but decode at <= 4 sequences through partials + the combine kernel
                   // (the path before the cluster kernel, for checks and timing comparisons)
};

// Process-wide; meant for tests only (not synchronised with launches on other threads).
void set_attention_kernel_choice(AttentionKernelChoice choice);

}  // namespace peregrine::cuda
