// Batch invariance on the GPU (issue #7: a crowd of greedy requests gives the tokens each gives
// alone). gemm_invariant against a double-precision reference, and bitwise against itself: a row
// alone vs the same row inside batches of many sizes, at different offsets, under every kernel
// plan and through the unaligned path. paged_attention with batch_invariant: a query token's
// output bitwise the same alone and among others, whole prompt vs chunked prefill (chunks of 7,
// a last chunk of 1), decode vs prefill, partitions split across CTAs vs folded in one.
// GemmInvariantPerf.Report times gemm_invariant next to gemv and cuBLASLt.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/kv_fp8.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { PG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s); }
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16(u(rng));
    return v;
}

// ---- gemm_invariant ------------------------------------------------------------------------------

// out [n, m] as raw bits (f32 bits, or bf16 bits widened), computed from x rows on the device.
// x_shift: x starts that many elements past a 256-byte boundary (1: the unaligned path).
std::vector<uint32_t> gemm_bits(const std::vector<uint16_t>& x, int n, const DeviceBuffer<uint16_t>& w, int m, int k,
                                bool out_f32, cudaStream_t st, int x_shift = 0) {
    DeviceBuffer<uint16_t> dx(static_cast<size_t>(n) * k + 8);
    PG_CUDA_CHECK(cudaMemcpy(dx.get() + x_shift, x.data(), static_cast<size_t>(n) * k * 2, cudaMemcpyHostToDevice));
    const size_t elems = static_cast<size_t>(n) * m;
    std::vector<uint32_t> bits(elems);
    if (out_f32) {
        DeviceBuffer<float> out(elems);
        out.fill_bytes(0xff);
        cuda_test::sync();  // the poison runs on the legacy stream, which `st` does not wait for
        cuda::gemm_invariant(dx.get() + x_shift, w.get(), out.get(), true, n, m, k, st);
        PG_CUDA_CHECK(cudaStreamSynchronize(st));
        const std::vector<float> h = out.download();
        std::memcpy(bits.data(), h.data(), elems * 4);
    } else {
        DeviceBuffer<uint16_t> out(elems);
        out.fill_bytes(0xff);
        cuda_test::sync();
        cuda::gemm_invariant(dx.get() + x_shift, w.get(), out.get(), false, n, m, k, st);
        PG_CUDA_CHECK(cudaStreamSynchronize(st));
        const std::vector<uint16_t> h = out.download();
        for (size_t i = 0; i < elems; ++i) bits[i] = h[i];
    }
    return bits;
}

float bits_value(uint32_t b, bool out_f32) {
    if (!out_f32) return bf16_to_f32(static_cast<uint16_t>(b));
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

TEST(GemmInvariant, MatchesDoubleReference) {
    PG_SKIP_WITHOUT_CUDA();
    Stream st;
    std::mt19937 rng(17);
    struct Shape {
        int n, m, k;
    };
    const Shape shapes[] = {{1, 2048, 2048}, {3, 517, 64},     {5, 3, 8192},  {7, 131, 172},
                            {16, 300, 520},  {17, 64, 40},     {63, 200, 96}, {200, 384, 1024},
                            {300, 77, 2056}, {1000, 257, 512}, {2, 1, 1},     {9, 33, 8200}};
    for (const Shape& sh : shapes) {
        const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(sh.n) * sh.k, rng, 1.0f);
        const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(sh.m) * sh.k, rng, 0.05f);
        DeviceBuffer<uint16_t> dw(w);
        // Reference on up to 20000 elements (all of the small products).
        std::vector<std::pair<int, int>> picks;
        const int64_t total = static_cast<int64_t>(sh.n) * sh.m;
        if (total <= 20000) {
            for (int i = 0; i < sh.n; ++i)
                for (int r = 0; r < sh.m; ++r) picks.push_back({i, r});
        } else {
            std::uniform_int_distribution<int> di(0, sh.n - 1), dr(0, sh.m - 1);
            for (int j = 0; j < 20000; ++j) picks.push_back({di(rng), dr(rng)});
        }
        std::vector<double> ref(picks.size());
        for (size_t j = 0; j < picks.size(); ++j) {
            double acc = 0;
            const uint16_t* xr = x.data() + static_cast<size_t>(picks[j].first) * sh.k;
            const uint16_t* wr = w.data() + static_cast<size_t>(picks[j].second) * sh.k;
            for (int c = 0; c < sh.k; ++c) acc += static_cast<double>(bf16_to_f32(xr[c])) * bf16_to_f32(wr[c]);
            ref[j] = acc;
        }
        for (bool out_f32 : {true, false}) {
            const std::vector<uint32_t> got = gemm_bits(x, sh.n, dw, sh.m, sh.k, out_f32, st.s);
            size_t bad = 0;
            for (uint32_t b : got) bad += !std::isfinite(bits_value(b, out_f32));
            double err = 0, norm = 0;
            for (size_t j = 0; j < picks.size(); ++j) {
                const double d =
                    bits_value(got[static_cast<size_t>(picks[j].first) * sh.m + picks[j].second], out_f32) - ref[j];
                err += d * d;
                norm += ref[j] * ref[j];
            }
            const std::string what = "n " + std::to_string(sh.n) + " m " + std::to_string(sh.m) + " k " +
                                     std::to_string(sh.k) + (out_f32 ? " f32" : " bf16");
            EXPECT_EQ(bad, 0u) << what << ": unwritten or non-finite outputs";
            EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), out_f32 ? 1e-5 : 8e-3) << what;
        }
    }
}

TEST(GemmInvariant, RejectsNonPositiveK) {
    PG_SKIP_WITHOUT_CUDA();
    DeviceBuffer<uint16_t> x(16), w(16);
    DeviceBuffer<float> out(16);
    EXPECT_THROW(cuda::gemm_invariant(x.get(), w.get(), out.get(), true, 1, 1, 0, nullptr), Error);
}

// A row's output alone (n = 1) is bitwise the row's output inside batches of every size, at
// several offsets, under every plan, f32 and bf16, aligned and not.
TEST(GemmInvariant, RowsMatchAlone) {
    PG_SKIP_WITHOUT_CUDA();
    Stream st;
    std::mt19937 rng(23);
    const int batch_sizes[] = {1, 2, 3, 4, 5, 8, 16, 17, 63, 64, 200, 300, 1000};
    const std::pair<int, int> shapes[] = {{2048, 2048}, {131, 172}, {1000, 520}, {384, 4104}};
    constexpr int kPool = 1100;
    for (auto [m, k] : shapes) {
        const std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(kPool) * k, rng, 1.0f);
        DeviceBuffer<uint16_t> dw(random_bf16(static_cast<size_t>(m) * k, rng, 0.05f));
        DeviceBuffer<uint16_t> dpool(pool);
        for (bool out_f32 : {true, false}) {
            // Every pool row alone, into its own row of one buffer.
            DeviceBuffer<float> alone32(static_cast<size_t>(kPool) * m);
            DeviceBuffer<uint16_t> alone16(static_cast<size_t>(kPool) * m);
            for (int i = 0; i < kPool; ++i) {
                void* dst = out_f32 ? static_cast<void*>(alone32.get() + static_cast<size_t>(i) * m)
                                    : static_cast<void*>(alone16.get() + static_cast<size_t>(i) * m);
                cuda::gemm_invariant(dpool.get() + static_cast<size_t>(i) * k, dw.get(), dst, out_f32, 1, m, k, st.s);
            }
            PG_CUDA_CHECK(cudaStreamSynchronize(st.s));
            std::vector<uint32_t> alone(static_cast<size_t>(kPool) * m);
            if (out_f32) {
                const auto h = alone32.download();
                std::memcpy(alone.data(), h.data(), alone.size() * 4);
            } else {
                const auto h = alone16.download();
                for (size_t i = 0; i < h.size(); ++i) alone[i] = h[i];
            }
            auto check = [&](int n, int off, cuda::GemmInvariantPlan plan, int shift, const char* what) {
                cuda::set_gemm_invariant_plan(plan);
                const std::vector<uint16_t> x(pool.begin() + static_cast<size_t>(off) * k,
                                              pool.begin() + static_cast<size_t>(off + n) * k);
                const std::vector<uint32_t> got = gemm_bits(x, n, dw, m, k, out_f32, st.s, shift);
                cuda::set_gemm_invariant_plan(cuda::GemmInvariantPlan::Auto);
                int differ = 0;
                for (int r = 0; r < n; ++r)
                    differ += !std::equal(got.begin() + static_cast<size_t>(r) * m,
                                          got.begin() + static_cast<size_t>(r + 1) * m,
                                          alone.begin() + static_cast<size_t>(off + r) * m);
                EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << n << " rows differ from alone; n " << n
                                     << " offset " << off << " m " << m << " k " << k << " plan "
                                     << static_cast<int>(plan) << (out_f32 ? " f32" : " bf16");
            };
            for (int n : batch_sizes)
                for (int off : {0, 1, 37, kPool - n}) check(n, off, cuda::GemmInvariantPlan::Auto, 0, "auto");
            for (int n : {3, 16, 64, 200})
                for (int plan = 0; plan <= static_cast<int>(cuda::GemmInvariantPlan::TiledWideK64); ++plan)
                    check(n, 5, static_cast<cuda::GemmInvariantPlan>(plan), 0, "forced plan");
            for (int n : {1, 4, 63, 300}) check(n, 11, cuda::GemmInvariantPlan::Auto, 1, "unaligned x");
        }
    }
}

// ---- timing (prints only) -----------------------------------------------------------------------

// Times per call of gemm_invariant (automatic plan and the forced ones), gemv (n <= 4) and
// cuBLASLt (as the backend plans it: timed candidates for n <= 256), each as a CUDA graph of
// calls over rotating weight copies (> 128 MB in all, so decode products stream from HBM).
TEST(GemmInvariantPerf, Report) {
    PG_SKIP_WITHOUT_CUDA();
    CudaOptions lt_opts;
    lt_opts.gemv = false;
    CudaBackend lt(lt_opts);  // cuBLASLt for every n
    cudaStream_t st = lt.stream();
    struct Shape {
        int m, k;
        std::vector<int> ns;
    };
    const std::vector<int> decode_ns = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    const Shape shapes[] = {
        {3072, 2048, decode_ns}, {2048, 2048, decode_ns},    {16384, 2048, decode_ns},
        {2048, 8192, decode_ns}, {128256, 2048, {1, 4, 64}}, {6144, 4096, {1, 4}},
        {4096, 4096, {1, 4}},    {28672, 4096, {1, 4}},      {4096, 14336, {1, 4}},
    };
    auto time_graph = [&](int calls, const std::function<void(int)>& call) {
        call(0);  // eager first: plans, attributes
        PG_CUDA_CHECK(cudaStreamSynchronize(st));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        PG_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls; ++i) call(i);
        PG_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        PG_CUDA_CHECK(cudaGraphLaunch(exec, st));
        cudaEvent_t e0, e1;
        PG_CUDA_CHECK(cudaEventCreate(&e0));
        PG_CUDA_CHECK(cudaEventCreate(&e1));
        PG_CUDA_CHECK(cudaEventRecord(e0, st));
        constexpr int kReps = 3;
        for (int r = 0; r < kReps; ++r) PG_CUDA_CHECK(cudaGraphLaunch(exec, st));
        PG_CUDA_CHECK(cudaEventRecord(e1, st));
        PG_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        PG_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return 1000.0 * ms / (kReps * calls);
    };
    auto report = [&](int n, int m, int k, const std::vector<Tensor>& ws, Tensor& x, Tensor& out) {
        const double bytes = 2.0 * m * k, flops = 2.0 * n * m * k;
        const int copies = static_cast<int>(ws.size());
        const int calls = n >= 1024 ? 3 : std::max(copies, 20);
        auto inv = [&](int i) {
            cuda::gemm_invariant(x.ptr<uint16_t>(), ws[i % copies].ptr<uint16_t>(), out.data, false, n, m, k, st);
        };
        const double t_inv = time_graph(calls, inv);
        std::printf("[ perf ] gemm n %5d m %6d k %5d: invariant %9.1f us (%5.2f TB/s, %6.1f TFLOP/s)", n, m, k, t_inv,
                    bytes / t_inv / 1e6, flops / t_inv / 1e6);
        using P = cuda::GemmInvariantPlan;
        std::vector<P> plans;
        if (n <= 16) plans = {P::SkinnyR1, P::Sliced8, P::Sliced16};
        if (n > 16 && n <= 64) plans = {P::Sliced16, P::Sliced32, P::Sliced64, P::Sliced64W, P::Tiled64};
        if (n > 64 && n <= 256) plans = {P::Sliced32, P::Sliced64, P::Sliced64W, P::Tiled64, P::Tiled128, P::TiledWide};
        if (n > 256) plans = {P::Sliced64W, P::Tiled128, P::TiledWide, P::TiledWide4, P::TiledWideK64};
        for (cuda::GemmInvariantPlan plan : plans) {
            cuda::set_gemm_invariant_plan(plan);
            static const char* const names[] = {"skinny1",   "skinny2",    "sliced8",      "sliced16", "sliced32",
                                                "sliced64",  "sliced64w",  "tiled32",      "tiled64",  "tiled128",
                                                "tiledwide", "tiledwide4", "tiledwide-k64"};
            std::printf(" %s %.1f", names[static_cast<int>(plan)], time_graph(calls, inv));
        }
        cuda::set_gemm_invariant_plan(cuda::GemmInvariantPlan::Auto);
        if (n <= cuda::kMaxGemvRows) {
            const double t = time_graph(calls, [&](int i) {
                cuda::gemv(x.ptr<uint16_t>(), ws[i % copies].ptr<uint16_t>(), out.data, false, n, m, k, st);
            });
            std::printf(" | gemv %.1f us (invariant/gemv %.2f)", t, t_inv / t);
        }
        const double t_lt = time_graph(calls, [&](int i) { lt.matmul(x, ws[i % copies], Tensor(), out); });
        std::printf(" | cuBLASLt %.1f us (%6.1f TFLOP/s; invariant/cuBLASLt %.2f)\n", t_lt, flops / t_lt / 1e6,
                    t_inv / t_lt);
    };
    for (const Shape& sh : shapes) {
        const size_t bytes = static_cast<size_t>(sh.m) * sh.k * 2;
        const int copies = static_cast<int>(std::min<size_t>(32, std::max<size_t>(2, (size_t{128} << 20) / bytes + 1)));
        std::vector<Tensor> ws;
        for (int c = 0; c < copies; ++c) {
            ws.push_back(lt.allocate(DType::BF16, {sh.m, sh.k}));
            lt.fill_random(ws.back(), 11 + c, -0.05f, 0.05f);
        }
        for (int n : sh.ns) {
            Tensor x = lt.allocate(DType::BF16, {n, sh.k}), out = lt.allocate(DType::BF16, {n, sh.m});
            lt.fill_random(x, 3, -1.0f, 1.0f);
            report(n, sh.m, sh.k, ws, x, out);
            lt.release(x);
            lt.release(out);
        }
        for (Tensor& t : ws) lt.release(t);
    }
    // Prefill: n = 1024 and 8192 on the 1B shapes (the lm_head only at 8192).
    const std::tuple<int, int, int> big[] = {{1024, 2048, 2048},  {1024, 16384, 2048}, {1024, 2048, 8192},
                                             {8192, 2048, 2048},  {8192, 16384, 2048}, {8192, 2048, 8192},
                                             {8192, 128256, 2048}};
    for (auto [n, m, k] : big) {
        std::vector<Tensor> ws{lt.allocate(DType::BF16, {m, k})};
        lt.fill_random(ws[0], 5, -0.05f, 0.05f);
        Tensor x = lt.allocate(DType::BF16, {n, k}), out = lt.allocate(DType::BF16, {n, m});
        lt.fill_random(x, 3, -1.0f, 1.0f);
        report(n, m, k, ws, x, out);
        lt.release(x);
        lt.release(out);
        lt.release(ws[0]);
    }
}

// ---- attention ---------------------------------------------------------------------------------

// A deterministic world of sequences: q, k, v of (sequence, position, head, dim) are fixed hash
// values, so the same token sees the same numbers in any batch and any block layout.
uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
uint16_t hval(uint64_t salt, int seq, int pos, int head, int dim, float scale) {
    const uint64_t h = mix(salt ^ mix((static_cast<uint64_t>(seq) << 40) ^ (static_cast<uint64_t>(pos) << 18) ^
                                      (static_cast<uint64_t>(head) << 9) ^ static_cast<uint64_t>(dim)));
    const float u = static_cast<float>(h >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
    return f32_to_bf16((2.0f * u - 1.0f) * scale);
}

struct AttnShape {
    int H = 32, KVH = 8, D = 64, block_size = 16, window = 0;
    bool fp8 = false;  // FP8 caches (core/kv_fp8.h), quantized from the bf16 ones
    std::string name() const {
        return "H" + std::to_string(H) + "/KV" + std::to_string(KVH) + " D" + std::to_string(D) + " win" +
               std::to_string(window) + (fp8 ? " fp8" : "");
    }
};

// bf16 caches [blocks, bs, KVH, D] -> the FP8 cache of the same values (core/kv_fp8.h layout).
std::vector<uint8_t> fp8_cache(const std::vector<uint16_t>& bf, int bs, int KVH, int D) {
    const KvFp8Layout f{bs, KVH, D};
    const int64_t slots = static_cast<int64_t>(bf.size()) / (int64_t{KVH} * D);
    std::vector<uint8_t> out(static_cast<size_t>(slots / bs * f.block_bytes()));
    std::vector<float> x(D);
    for (int64_t s = 0; s < slots; ++s)
        for (int h = 0; h < KVH; ++h) {
            for (int d = 0; d < D; ++d) x[d] = bf16_to_f32(bf[(s * KVH + h) * D + d]);
            uint16_t scale = 0;
            kv_fp8_quantize_head(x.data(), D, out.data() + f.code_offset(s, h), &scale);
            std::memcpy(out.data() + f.scale_offset(s, h), &scale, 2);
        }
    return out;
}
struct Entry {
    int seq, qlen, ctx;  // query tokens at positions ctx - qlen .. ctx - 1
};
using TokenKey = std::pair<int, int>;  // (sequence, position)

// Runs one batch through paged_attention (batch_invariant) and returns each query token's output
// row [H * D] (bf16 bits). Block ids are shuffled by `layout_seed`.
std::map<TokenKey, std::vector<uint16_t>> run_attention(const AttnShape& a, const std::vector<Entry>& batch,
                                                        uint32_t layout_seed, cudaStream_t st) {
    const int bs = a.block_size, row = a.H * a.D, slot = a.KVH * a.D;
    std::vector<int32_t> positions, query_start{0}, ctx;
    int stride = 1, blocks = 0;
    for (const Entry& e : batch) {
        for (int i = 0; i < e.qlen; ++i) positions.push_back(e.ctx - e.qlen + i);
        query_start.push_back(query_start.back() + e.qlen);
        ctx.push_back(e.ctx);
        stride = std::max(stride, (e.ctx + bs - 1) / bs);
        blocks += (e.ctx + bs - 1) / bs;
    }
    const int T = query_start.back();
    std::vector<int> ids(blocks + 1);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 rng(layout_seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> tables(batch.size() * stride, -1);
    std::vector<uint16_t> kc(static_cast<size_t>(blocks + 1) * bs * slot, 0), vc(kc.size(), 0);
    std::vector<uint16_t> q(static_cast<size_t>(T) * row);
    int next = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
        const Entry& e = batch[s];
        for (int j = 0; j < (e.ctx + bs - 1) / bs; ++j) tables[s * stride + j] = ids[next++];
        for (int p = 0; p < e.ctx; ++p) {
            const size_t base = (static_cast<size_t>(tables[s * stride + p / bs]) * bs + p % bs) * slot;
            for (int h = 0; h < a.KVH; ++h)
                for (int d = 0; d < a.D; ++d) {
                    kc[base + h * a.D + d] = hval(1, e.seq, p, h, d, 1.0f);
                    vc[base + h * a.D + d] = hval(2, e.seq, p, h, d, 1.0f);
                }
        }
        for (int i = 0; i < e.qlen; ++i)
            for (int h = 0; h < a.H; ++h)
                for (int d = 0; d < a.D; ++d)
                    q[static_cast<size_t>(query_start[s] + i) * row + h * a.D + d] =
                        hval(3, e.seq, e.ctx - e.qlen + i, h, d, 2.0f);
    }
    DeviceBuffer<uint16_t> dq(q), dk(kc), dv(vc), dout(q.size());
    DeviceBuffer<uint8_t> dk8, dv8;
    if (a.fp8) {
        dk8 = DeviceBuffer<uint8_t>(fp8_cache(kc, bs, a.KVH, a.D));
        dv8 = DeviceBuffer<uint8_t>(fp8_cache(vc, bs, a.KVH, a.D));
    }
    DeviceBuffer<int32_t> dpos(positions), dqs(query_start), dctx(ctx), dtab(tables);
    DeviceBuffer<uint8_t> ws(cuda::attention_workspace_bytes(T, a.H, a.D));
    dout.fill_bytes(0xff);
    cuda::AttentionArgs args;
    args.q = dq.get(), args.k_cache = dk.get(), args.v_cache = dv.get(), args.out = dout.get();
    args.k_fp8 = dk8.get(), args.v_fp8 = dv8.get();  // null: bf16
    cuda::DeviceBatch& b = args.batch;
    b.num_tokens = T, b.num_seqs = static_cast<int>(batch.size()), b.block_stride = stride, b.block_size = bs;
    b.max_query_len = 0, b.max_context_len = 0;
    for (const Entry& e : batch) b.max_query_len = std::max(b.max_query_len, e.qlen);
    for (const Entry& e : batch) b.max_context_len = std::max(b.max_context_len, e.ctx);
    b.positions = dpos.get(), b.query_start = dqs.get(), b.context_lens = dctx.get(), b.block_tables = dtab.get();
    args.num_heads = a.H, args.num_kv_heads = a.KVH, args.head_dim = a.D;
    args.scale = 1.0f / std::sqrt(static_cast<float>(a.D));
    args.window = a.window;
    args.workspace = ws.get(), args.workspace_bytes = ws.size();
    args.batch_invariant = true;
    cuda_test::sync();
    cuda::paged_attention(args, st);
    PG_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> out = dout.download();
    std::map<TokenKey, std::vector<uint16_t>> rows;
    for (size_t s = 0; s < batch.size(); ++s)
        for (int i = 0; i < batch[s].qlen; ++i) {
            const size_t t = query_start[s] + i;
            rows[{batch[s].seq, batch[s].ctx - batch[s].qlen + i}] =
                std::vector<uint16_t>(out.begin() + t * row, out.begin() + (t + 1) * row);
        }
    return rows;
}

// Every token of `got` present in `want` has the same bits (and is finite).
void expect_same(const std::map<TokenKey, std::vector<uint16_t>>& want,
                 const std::map<TokenKey, std::vector<uint16_t>>& got, const std::string& what) {
    int compared = 0, differ = 0;
    for (const auto& [key, bits] : got) {
        const auto it = want.find(key);
        if (it == want.end()) continue;
        ++compared;
        EXPECT_EQ(cuda_test::count_nonfinite(bits), 0u) << what << " seq " << key.first << " pos " << key.second;
        if (bits != it->second && ++differ <= 3)
            ADD_FAILURE() << what << ": seq " << key.first << " pos " << key.second << " differs";
    }
    EXPECT_GT(compared, 0) << what;
    EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << compared << " tokens differ";
}

std::vector<AttnShape> attn_shapes() {
    std::vector<AttnShape> v;
    AttnShape a;
    a.H = 8, a.KVH = 2, a.D = 64;  // group 4 (Llama-3 ratio), tensor cores
    v.push_back(a);
    a.H = 14, a.KVH = 2, a.D = 128;  // group 7 (Qwen2.5-0.5B ratio), 9 tokens per tile
    v.push_back(a);
    a.H = 4, a.KVH = 4, a.D = 64, a.window = 100;  // group 1, sliding window
    v.push_back(a);
    a.H = 8, a.KVH = 4, a.D = 32, a.window = 0;  // generic kernel
    v.push_back(a);
    for (size_t i = 0; i < 4; ++i) {  // the same over FP8 caches
        AttnShape f = v[i];
        f.fp8 = true;
        v.push_back(f);
    }
    return v;
}

// The same decode token and the same prefill chunk alone and among 1..64 others (decodes and
// prefill chunks of varied contexts), at the front, middle and back of the batch.
TEST(AttentionInvariant, SameTokenAnyBatch) {
    PG_SKIP_WITHOUT_CUDA();
    Stream st;
    for (const AttnShape& a : attn_shapes()) {
        SCOPED_TRACE(a.name());
        const Entry dec{0, 1, 1500}, pre{1, 100, 900};
        auto want = run_attention(a, {dec}, 1, st.s);
        const auto want_pre = run_attention(a, {pre}, 2, st.s);
        want.insert(want_pre.begin(), want_pre.end());
        std::mt19937 rng(31);
        for (int others : {1, 7, 31, 64}) {
            std::vector<Entry> batch;
            for (int i = 0; i < others; ++i) {
                const int c = 1 + static_cast<int>(rng() % 3000);
                const int q = rng() % 4 == 0 ? 1 + static_cast<int>(rng() % std::min(c, 150)) : 1;
                batch.push_back({10 + i, q, c});
            }
            for (int where : {0, others / 2, others}) {
                std::vector<Entry> b2 = batch;
                b2.insert(b2.begin() + where, dec);
                b2.insert(b2.begin() + std::min<int>(where + 1, static_cast<int>(b2.size())), pre);
                expect_same(want, run_attention(a, b2, 100 + where, st.s),
                            "among " + std::to_string(others) + " at " + std::to_string(where));
            }
        }
    }
}

// A prompt whole, in chunks of 7 (a last chunk of 1 token), and its last token as a decode step.
TEST(AttentionInvariant, ChunkedPrefillAndDecode) {
    PG_SKIP_WITHOUT_CUDA();
    Stream st;
    for (const AttnShape& a : attn_shapes()) {
        SCOPED_TRACE(a.name());
        for (int len : {71, 603}) {  // 7 k + 1; 603 crosses partitions at 256 and 512
            const auto whole = run_attention(a, {{5, len, len}}, 3, st.s);
            ASSERT_EQ(whole.size(), static_cast<size_t>(len));
            std::map<TokenKey, std::vector<uint16_t>> chunked;
            for (int done = 0; done < len;) {
                const int q = std::min(7, len - done);
                std::vector<Entry> b{{5, q, done + q}};
                if (done % 14 == 0) b.push_back({6, 1, 40 + done});  // a companion now and then
                const auto got = run_attention(a, b, 7 + done, st.s);
                for (const auto& [key, bits] : got)
                    if (key.first == 5) chunked[key] = bits;
                done += q;
            }
            expect_same(whole, chunked, "chunks of 7 vs whole prompt of " + std::to_string(len));
            expect_same(whole, run_attention(a, {{5, 1, len}}, 9, st.s), "decode vs prefill, last token");
        }
    }
}

// A long-context decode token alone (its partitions split across CTAs) and behind 64 others of
// the same length (the partial slots run out: its partitions fold in one CTA).
TEST(AttentionInvariant, SplitAndFoldedPartitionsAgree) {
    PG_SKIP_WITHOUT_CUDA();
    Stream st;
    for (const AttnShape& a : attn_shapes()) {
        SCOPED_TRACE(a.name());
        const Entry target{0, 1, 4000};
        const auto alone = run_attention(a, {target}, 1, st.s);
        std::vector<Entry> crowd;
        for (int i = 0; i < 64; ++i) crowd.push_back({20 + i, 1, 4000 - i});
        crowd.push_back(target);
        expect_same(alone, run_attention(a, crowd, 2, st.s), "behind 64 long decodes");
        std::vector<Entry> mixed{{7, 300, 2300}, target, {8, 64, 64}};  // prompt chunks around it
        expect_same(alone, run_attention(a, mixed, 3, st.s), "between prefill chunks");
    }
}

}  // namespace
}  // namespace peregrine
