// Shared helpers of the CUDA kernel tests: skip without a GPU, device buffers, bf16 <-> f32,
// random inputs and error norms. Header-only; every test binary may include it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/half.h"

namespace peregrine::cuda_test {

// True when a CUDA device is usable (clears the error a failed query leaves behind).
inline bool has_cuda_device() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return count > 0;
}

// First statement of every GPU test.
#define PG_SKIP_WITHOUT_CUDA()                                                            \
    do {                                                                                  \
        if (!::peregrine::cuda_test::has_cuda_device()) GTEST_SKIP() << "no CUDA device"; \
    } while (0)

// Owns `n` elements of device memory (cudaMalloc'd, so 256-byte aligned).
template <typename T>
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) : n_(n) {
        if (n_ > 0) PG_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(T)));
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
        o.ptr_ = nullptr;
        o.n_ = 0;
    }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(n_, o.n_);
        return *this;
    }

    T* get() const { return ptr_; }
    size_t size() const { return n_; }

    void upload(const std::vector<T>& host) {
        PG_CHECK(host.size() <= n_, "upload of ", host.size(), " elements into ", n_);
        if (!host.empty())
            PG_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    // Synchronous: waits for the device first (so kernel errors surface here).
    std::vector<T> download() const {
        PG_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<T> host(n_);
        if (n_ > 0) PG_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    // Every byte set to `byte` (0xFF makes f32 and bf16 NaNs: a poison to catch unwritten outputs).
    void fill_bytes(int byte) {
        if (n_ > 0) PG_CUDA_CHECK(cudaMemset(ptr_, byte, n_ * sizeof(T)));
    }

  private:
    T* ptr_ = nullptr;
    size_t n_ = 0;
};

inline void sync() {
    PG_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- bf16 ----------------------------------------------------------------------------------
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
    return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(x[i]);
    return out;
}
// Rounds every value to the nearest bf16 (what a bf16 input really holds).
inline std::vector<float> round_bf16(const std::vector<float>& x) {
    return from_bf16(to_bf16(x));
}

// e4m3 codes of x [rows, cols] with one factor a row, as cuda::quantize_rows_e4m3 makes them:
// factor amax / 448, code = f32_to_f8e4m3(x * (448 / amax)); an all-zero row gets factor 0.
inline std::vector<uint8_t> quantize_e4m3(const std::vector<float>& x, int64_t rows, int64_t cols,
                                          std::vector<float>& scale) {
    std::vector<uint8_t> q(x.size());
    scale.assign(static_cast<size_t>(rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x.data() + r * cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
        const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
        scale[static_cast<size_t>(r)] = amax / 448.0f;
        for (int64_t c = 0; c < cols; ++c) q[static_cast<size_t>(r * cols + c)] = f32_to_f8e4m3(row[c] * inv);
    }
    return q;
}

// Random GGUF blocks of type t (Q8_0, Q4_0, Q4_K, Q6_K) for a [rows, cols] matrix, as the file
// would hold them: random codes, positive f16 super-block scales around the size real ones have
// (values ~1e-2), random 6-bit sub-block scales and mins (Q4_K), random int8 sub-block scales (Q6_K).
inline std::vector<uint8_t> random_gguf_blocks(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
    std::vector<uint8_t> b(static_cast<size_t>(rows) * dtype_row_bytes(t, cols));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    std::uniform_real_distribution<float> d(0.5e-3f, 2e-3f);
    auto put_f16 = [&](size_t at, float v) {
        const uint16_t h = f32_to_f16(v);
        std::memcpy(b.data() + at, &h, 2);
    };
    const size_t bytes = static_cast<size_t>(dtype_block_bytes(t)), blocks = b.size() / bytes;
    for (size_t i = 0; i < blocks; ++i) {
        const size_t at = i * bytes;
        if (t == DType::Q8_0 || t == DType::Q4_0) put_f16(at, d(rng) * (t == DType::Q8_0 ? 1.0f : 8.0f));
        if (t == DType::Q4_K) put_f16(at, d(rng) * 0.5f), put_f16(at + 2, d(rng) * 0.5f);
        if (t == DType::Q6_K) put_f16(at + bytes - 2, d(rng) * 0.1f);
    }
    return b;
}

// ---- random inputs and comparisons ------------------------------------------------------------
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    return x;
}

// ||a - ref|| / ||ref|| over all elements (a NaN anywhere makes it NaN, which fails any `<`).
inline double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
    PG_CHECK(a.size() == ref.size(), "rel_error of ", a.size(), " vs ", ref.size(), " elements");
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - ref[i];
        num += d * d;
        den += static_cast<double>(ref[i]) * ref[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Number of non-finite values: a poisoned (0xFF) output element that was never written is NaN.
template <typename T>
size_t count_nonfinite(const std::vector<T>& x) {
    size_t bad = 0;
    for (const T& v : x) {
        float f;
        if constexpr (sizeof(T) == 2)
            f = bf16_to_f32(v);
        else
            f = static_cast<float>(v);
        if (!std::isfinite(f)) ++bad;
    }
    return bad;
}

// Microseconds per call of `call` (which launches on `stream`): one warm-up call, then
// `calls` calls captured in one CUDA graph and the graph replayed 5 times between events, so
// launch overhead and programmatic launch behave as in a recorded decode step.
inline double graph_us_per_call(cudaStream_t stream, int calls, const std::function<void()>& call) {
    sync();
    call();
    PG_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    PG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) call();
    PG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    cudaEvent_t e0, e1;
    PG_CUDA_CHECK(cudaEventCreate(&e0));
    PG_CUDA_CHECK(cudaEventCreate(&e1));
    PG_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int r = 0; r < 5; ++r) PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PG_CUDA_CHECK(cudaEventRecord(e1, stream));
    PG_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    PG_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    PG_CUDA_CHECK(cudaEventDestroy(e0));
    PG_CUDA_CHECK(cudaEventDestroy(e1));
    PG_CUDA_CHECK(cudaGraphExecDestroy(exec));
    PG_CUDA_CHECK(cudaGraphDestroy(graph));
    return 1000.0 * ms / (5 * calls);
}

}  // namespace peregrine::cuda_test
