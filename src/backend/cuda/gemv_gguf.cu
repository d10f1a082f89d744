// The GGUF layouts' decode products (gemv_kernels.cuh's kernels for the int8, 4-bit and 6-bit
// device layouts of core/gpu_quant.h), their dequantization to bf16 for prefill GEMMs, and the
// embedding lookup of a GGUF-layout table.
#include "backend/cuda/gemv_kernels.cuh"

namespace peregrine::cuda {

namespace {

template <int EPI, bool NORM>
void dispatch(const Args& a, GemvWeight::Kind kind, int n, cudaStream_t stream) {
    switch (kind) {
        case GemvWeight::kI8B32:
            return dispatch_n<EPI, NORM, kI8B32>(a, n, stream);
        case GemvWeight::kI8B16:
            return dispatch_n<EPI, NORM, kI8B16>(a, n, stream);
        case GemvWeight::kU4:
            return dispatch_n<EPI, NORM, kU4>(a, n, stream);
        case GemvWeight::kU6:
            return dispatch_n<EPI, NORM, kU6>(a, n, stream);
        default:
            fail("gguf_gemv_rows: not a GGUF-layout weight");
    }
}

// Products of more than kMaxGemvRows rows (GGUF layouts) in slices of kMaxGemvRows rows of x and
// out, each a launch that reads the whole weight.
template <int EPI, bool NORM>
void dispatch_rows(const Args& a, GemvWeight::Kind kind, int n, cudaStream_t stream) {
    const size_t x_row = static_cast<size_t>(a.k) * (NORM ? 4 : 2);  // f32 residual, else bf16
    const size_t out_row = EPI == kSilu ? size_t{2} * (a.m / 2) : static_cast<size_t>(a.m) * (a.out_f32 ? 4 : 2);
    for (int r0 = 0; r0 < n; r0 += kMaxGemvRows) {
        Args s = a;
        s.x = static_cast<const char*>(a.x) + static_cast<size_t>(r0) * x_row;
        s.out = static_cast<char*>(a.out) + static_cast<size_t>(r0) * out_row;
        dispatch<EPI, NORM>(s, kind, std::min(kMaxGemvRows, n - r0), stream);
    }
}

}  // namespace

template <int EPI, bool NORM>
void gguf_gemv_rows(const void* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int n, int m,
                    int k, cudaStream_t stream) {
    dispatch_rows<EPI, NORM>(make_args(x, norm, eps, w, out, out_f32, m, k), w.kind, n, stream);
}
template void gguf_gemv_rows<kPlain, false>(const void*, const float*, float, GemvWeight, void*, bool, int, int, int,
                                            cudaStream_t);
template void gguf_gemv_rows<kSilu, false>(const void*, const float*, float, GemvWeight, void*, bool, int, int, int,
                                           cudaStream_t);
template void gguf_gemv_rows<kAdd, false>(const void*, const float*, float, GemvWeight, void*, bool, int, int, int,
                                          cudaStream_t);
template void gguf_gemv_rows<kPlain, true>(const void*, const float*, float, GemvWeight, void*, bool, int, int, int,
                                           cudaStream_t);
template void gguf_gemv_rows<kSilu, true>(const void*, const float*, float, GemvWeight, void*, bool, int, int, int,
                                          cudaStream_t);

namespace {
// One thread per 16-byte chunk of codes: its values, unpacked as the decode kernel does, as bf16.
// Chunk i's values are 16-byte pieces i*P .. i*P+P-1 of out (rows are whole chunks, back to
// back), so a CTA's are one contiguous span: staged in shared memory and stored coalesced (a
// thread storing its own P pieces wrote at a 16*P-byte stride across the warp; H200, 8B Q4_K_M
// decode at batch 16 / 32 / 64, every step dequantizing: 1,044.8 / 2,069.4 / 4,081.6 -> 1,515.0 /
// 2,985.1 / 5,860.1 tok/s).
constexpr int kDequantThreads = 256;
template <int W>
__global__ void __launch_bounds__(kDequantThreads) dequantize_kernel(const Args a, bf16_t* out) {
    using WC = WeightChunk<W>;
    constexpr int P = WC::kPieces;
    __shared__ uint4 stage[kDequantThreads * P];
    const int chunks = a.k / (8 * P);
    const int64_t total = static_cast<int64_t>(a.m) * chunks;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kDequantThreads;
    if (const int64_t i = first + threadIdx.x; i < total) {
        const auto chunk = WC::load(a, static_cast<int>(i / chunks), static_cast<int>(i % chunks));
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float f[8];
            WC::unpack(chunk, p, f);
            uint4 v;
            uint32_t* w = &v.x;
#pragma unroll
            for (int e = 0; e < 4; ++e) w[e] = to_bf16(f[2 * e]) | static_cast<uint32_t>(to_bf16(f[2 * e + 1])) << 16;
            stage[threadIdx.x * P + p] = v;
        }
    }
    __syncthreads();
    const int pieces = static_cast<int>(std::min<int64_t>(kDequantThreads, total - first)) * P;
    uint4* dst = reinterpret_cast<uint4*>(out) + first * P;
    for (int j = threadIdx.x; j < pieces; j += kDequantThreads) dst[j] = stage[j];
}

// One CTA per token: row ids[i] (or the feed's draw) of a GGUF-layout table in f32, zeros for an
// id outside [vocab_begin, vocab_begin + m).
template <int W>
__global__ void gguf_embedding_kernel(const Args a, const int32_t* __restrict__ ids, const int32_t* feed,
                                      int vocab_begin, float* __restrict__ out) {
    using WC = WeightChunk<W>;
    constexpr int P = WC::kPieces;
    pdl_launch_dependents();
    pdl_wait();
    const int64_t row = blockIdx.x;
    int32_t id = ids[row];
    if (id < 0 && feed) id = feed[-1 - id];  // written by the previous step's sampler
    id = id >= vocab_begin && id - vocab_begin < a.m ? id - vocab_begin : -1;
    float4* dst = reinterpret_cast<float4*>(out + row * a.k);
    for (int c = threadIdx.x; c < a.k / (8 * P); c += blockDim.x) {
        const auto chunk = id >= 0 ? WC::load(a, id, c) : typename WC::Chunk{};
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float f[8] = {};
            if (id >= 0) WC::unpack(chunk, p, f);
            dst[2 * (c * P + p)] = make_float4(f[0], f[1], f[2], f[3]);
            dst[2 * (c * P + p) + 1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    }
}
}  // namespace

namespace {
// Calls f(std::integral_constant<int, W>{}) with the WeightChunk kind of GGUF-layout weight w,
// after checking that w is one and that k (a row's values) is a whole number of its chunks.
template <typename F>
void with_gguf_kind(const char* what, GemvWeight w, int k, F&& f) {
    if (w.kind <= GemvWeight::kF8 || w.factors == nullptr || k % w.k_multiple() != 0)
        fail(what, ": not a GGUF-layout weight, or ", k, " values a row not a multiple of its chunk");
    switch (w.kind) {
        case GemvWeight::kI8B32:
            return f(std::integral_constant<int, kI8B32>{});
        case GemvWeight::kI8B16:
            return f(std::integral_constant<int, kI8B16>{});
        case GemvWeight::kU6:
            return f(std::integral_constant<int, kU6>{});
        default:
            return f(std::integral_constant<int, kU4>{});
    }
}
}  // namespace

void gguf_embedding(GemvWeight w, const int32_t* ids, const int32_t* feed, int n, int hidden, int vocab_begin,
                    int vocab_rows, float* out, cudaStream_t stream) {
    if (n <= 0) return;
    const Args a = make_args(nullptr, nullptr, 0.0f, w, out, true, vocab_rows, hidden);
    with_gguf_kind("gguf_embedding", w, hidden, [&](auto kind) {
        launch_pdl(gguf_embedding_kernel<decltype(kind)::value>, dim3(static_cast<unsigned>(n)), dim3(128), 0, stream,
                   a, ids, feed, vocab_begin, out);
    });
    check_launch("gguf_embedding");
}

void dequantize_weight(GemvWeight w, bf16_t* out, int m, int k, cudaStream_t stream) {
    if (m <= 0) return;
    const Args a = make_args(nullptr, nullptr, 0.0f, w, out, false, m, k);
    with_gguf_kind("dequantize_weight", w, k, [&](auto kind) {
        constexpr int W = decltype(kind)::value;
        const int64_t threads = static_cast<int64_t>(m) * (k / (8 * WeightChunk<W>::kPieces));  // one a chunk
        dequantize_kernel<W>
            <<<static_cast<unsigned>((threads + kDequantThreads - 1) / kDequantThreads), kDequantThreads, 0, stream>>>(
                a, out);
    });
    check_launch("dequantize_weight");
}

}  // namespace peregrine::cuda
