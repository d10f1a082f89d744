// The decode products' entry points (cuda_kernels.h: gemv, gemv_silu, gemv_norm, gemv_norm_silu,
// gemv_add) and the bf16 / FP8 products; the kernels are in gemv_kernels.cuh (which says how
// they work), the GGUF layouts' products in gemv_gguf.cu (two files, so that each compiles in
// about half the time).
#include "backend/cuda/gemv_kernels.cuh"

namespace peregrine::cuda {

namespace {

void check_args(const char* what, int n, int k, const void* x, GemvWeight w) {
    if (!gemv_supported(n, k, x, w.data, max_gemv_rows(w.kind)) || k % w.k_multiple() != 0 ||
        (w.kind == GemvWeight::kF8 && w.scale == nullptr) || (w.kind > GemvWeight::kF8 && w.factors == nullptr))
        fail(what, ": unsupported shape n ", n, " k ", k, " or misaligned operands");
}

// A product of bf16 or FP8 weights here (past kMaxGemvRows rows on the tensor-core kernel
// alone), of the GGUF layouts in gemv_gguf.cu.
template <int EPI, bool NORM>
void run(const void* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int n, int m, int k,
         cudaStream_t stream) {
    if (w.kind > GemvWeight::kF8) return gguf_gemv_rows<EPI, NORM>(x, norm, eps, w, out, out_f32, n, m, k, stream);
    const Args a = make_args(x, norm, eps, w, out, out_f32, m, k);
    if (n > kMaxGemvRows) {
        if (!gemv_mma(mma_product<EPI>(a, w.kind == GemvWeight::kF8, n), stream))
            fail("decode product of ", n, " rows (k ", k, "): past ", kMaxGemvRows,
                 " rows only the tensor-core kernel runs it, and it does not take this one");
        return;
    }
    if (w.kind == GemvWeight::kF8) return dispatch_n<EPI, NORM, kF8>(a, n, stream);
    dispatch_n<EPI, NORM, kBf16>(a, n, stream);
}

}  // namespace

void set_gemv_config(int rows, int depth) {
    g_rows = rows;
    g_depth = depth;
}

void set_gguf_gemv_persistent(int mode) {
    g_gguf_persistent = mode;
}

int max_gemv_rows(GemvWeight::Kind) {
    return kMaxMmaRows;
}

// H200, decode tok/s, our products / cuBLASLt's at n = 2, 3, 4 (2026-11-28, one call): 8B bf16
// 486.5 / 460.1, 515.3 / 660.8, 685.5 / 878.2; 8B FP8 533.8 / 420.4, 479.0 / 702.4, 637.9 /
// 937.3; 1B bf16 n = 2 2,114.9 / 1,935.9, n = 4 3,130.3 / 3,845.1.
// GGUF layouts: 4 (gguf_gemm past that). H200, 8B Q4_K_M decode tok/s at 5 / 8 rows, slices of 4
// / gguf_gemm: 514.6 / 887.8, 823.1 / 1,395.0 (2026-11-28). PEREGRINE_GGUF_GEMV_MAX_ROWS (1..8).
int gemv_rows_chosen(GemvWeight::Kind kind) {
    static const int plain = std::clamp(env_int("PEREGRINE_GEMV_MAX_ROWS", 2), 1, kMaxGemvRows);
    static const int gguf = std::clamp(env_int("PEREGRINE_GGUF_GEMV_MAX_ROWS", kMaxGemvRows), 1, 8);
    return kind > GemvWeight::kF8 ? gguf : plain;
}

bool gemv_supported(int n, int k, const void* x, const void* w, int max_rows) {
    return n >= 1 && n <= max_rows && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void gemv(const bf16_t* x, GemvWeight w, void* out, bool out_f32, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv", n, k, x, w);
    run<kPlain, false>(x, nullptr, 0.0f, w, out, out_f32, n, m, k, stream);
    check_launch("gemv");
}

void gemv_silu(const bf16_t* x, GemvWeight w_gate_up, bf16_t* out, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv_silu", n, k, x, w_gate_up);
    if (m % 2 != 0) fail("gemv_silu: ", m, " rows is not gate | up");
    run<kSilu, false>(x, nullptr, 0.0f, w_gate_up, out, false, n, m, k, stream);
    check_launch("gemv_silu");
}

void gemv_norm(const float* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int n, int m, int k,
               cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv_norm", n, k, x, w);
    check_args("gemv_norm", n, k, norm, w);
    run<kPlain, true>(x, norm, eps, w, out, out_f32, n, m, k, stream);
    check_launch("gemv_norm");
}

void gemv_norm_silu(const float* x, const float* norm, float eps, GemvWeight w_gate_up, bf16_t* out, int n, int m,
                    int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv_norm_silu", n, k, x, w_gate_up);
    check_args("gemv_norm_silu", n, k, norm, w_gate_up);
    if (m % 2 != 0) fail("gemv_norm_silu: ", m, " rows is not gate | up");
    run<kSilu, true>(x, norm, eps, w_gate_up, out, false, n, m, k, stream);
    check_launch("gemv_norm_silu");
}

void gemv_add(const bf16_t* x, GemvWeight w, float* out, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv_add", n, k, x, w);
    run<kAdd, false>(x, nullptr, 0.0f, w, out, true, n, m, k, stream);
    check_launch("gemv_add");
}

}  // namespace peregrine::cuda
