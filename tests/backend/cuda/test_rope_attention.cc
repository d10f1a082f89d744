// rope_cache_attention (the fused decode step: RoPE + KV-cache write + attention in one cluster
// kernel, attention_decode.cu) against the two ops it replaces, run apart on the same inputs:
// rope_and_cache_packed, then paged_attention. The caches after the call must be bit for bit the
// same (the fused kernel rotates with the same arithmetic and writes each (token, kv head) once);
// the outputs within bf16 tolerance (in practice the same bits: the same kernel code reads the
// same q and K/V values). Batches of 1..4 sequences, contexts 1..3000, head dims 64 / 128 / 256,
// GQA groups 1 / 4 / 8, neox and interleaved pairs, partial rotary dims (vector and scalar
// partner paths), yarn-style attention factors, padding sequences (slot -1, context 0), sliding
// windows, block sizes, a CUDA graph replayed over new batch contents, the CudaBackend op (fused
// and its fallbacks), and the time per call against the two kernels.
//
// Traps: the new token's cache slot starts as NaN, so a fused kernel that read the new key from
// the cache instead of its own registers / shared memory gives NaN; unused blocks and block
// tails are NaN, window-dropped table entries -1; outputs start as NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/batch.h"
#include "backend/cuda/attention_hooks.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "model/rope.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;

constexpr uint16_t kBf16NaN = 0x7fc0;

struct FusedCase {
    int num_heads = 32, num_kv_heads = 8, head_dim = 64;
    int block_size = 16;
    int window = 0;
    int rotary_dim = -1;  // -1: head_dim
    bool neox = true;
    float attention_factor = 1.0f;
    std::vector<int> ctxs;  // per sequence: tokens in the cache after the step; 0 = padding
    int rotary() const { return rotary_dim < 0 ? head_dim : rotary_dim; }
    std::string name() const {
        std::string s = "H" + std::to_string(num_heads) + "/KV" + std::to_string(num_kv_heads) + " D" +
                        std::to_string(head_dim) + " bs" + std::to_string(block_size) + " win" +
                        std::to_string(window) + " rot" + std::to_string(rotary()) + (neox ? " neox" : " interleaved") +
                        " af" + std::to_string(attention_factor).substr(0, 4) + " ctx";
        for (int c : ctxs) s += " " + std::to_string(c);
        return s;
    }
};

// Host copy of one decode batch: token s of sequence s at position ctx - 1.
struct HostBatch {
    int n = 0, stride = 0, num_blocks = 0, max_ctx = 0;
    std::vector<int32_t> positions, query_start, ctxs, tables, slots;
    std::vector<uint16_t> qkv, k_cache, v_cache;  // qkv [n, (H + 2 KVH) D]; caches [blocks, bs, KVH, D]
    std::vector<float> inv_freq;                  // [rotary / 2]
};

// min_blocks / min_stride: shapes to keep across batches (the graph test reuses buffers).
HostBatch make_batch(const FusedCase& c, std::mt19937& rng, int min_blocks = 0, int min_stride = 0) {
    HostBatch h;
    const int H = c.num_heads, KVH = c.num_kv_heads, D = c.head_dim, bs = c.block_size;
    h.n = static_cast<int>(c.ctxs.size());
    std::vector<int> first_block(h.n), nblk(h.n);
    int needed = 0;
    h.stride = min_stride;
    for (int s = 0; s < h.n; ++s) {
        const int ctx = c.ctxs[s];
        nblk[s] = (ctx + bs - 1) / bs;
        first_block[s] = c.window > 0 && ctx > 0 ? std::max(0, ctx - c.window) / bs : 0;
        needed += nblk[s] - first_block[s];
        h.stride = std::max(h.stride, nblk[s] + 1);
        h.max_ctx = std::max(h.max_ctx, ctx);
    }
    h.num_blocks = std::max(min_blocks, needed + 3);
    std::vector<int> ids(h.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    h.tables.assign(static_cast<size_t>(h.n) * h.stride, -1);
    const size_t slot_elems = static_cast<size_t>(KVH) * D;
    h.k_cache.assign(static_cast<size_t>(h.num_blocks) * bs * slot_elems, kBf16NaN);
    h.v_cache = h.k_cache;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    int next = 0;
    h.query_start.push_back(0);
    for (int s = 0; s < h.n; ++s) {
        const int ctx = c.ctxs[s];
        for (int j = first_block[s]; j < nblk[s]; ++j) {
            const int blk = ids[next++];
            h.tables[static_cast<size_t>(s) * h.stride + j] = blk;
            // Keys before the new one; the new token's slot and the block tail stay NaN.
            for (int o = 0; o < bs && j * bs + o < ctx - 1; ++o) {
                const size_t base = (static_cast<size_t>(blk) * bs + o) * slot_elems;
                for (size_t e = 0; e < slot_elems; ++e) {
                    h.k_cache[base + e] = f32_to_bf16(u(rng));
                    h.v_cache[base + e] = f32_to_bf16(u(rng));
                }
            }
        }
        const int pos = ctx > 0 ? ctx - 1 : 0;
        h.positions.push_back(pos);
        h.ctxs.push_back(ctx);
        h.query_start.push_back(s + 1);
        h.slots.push_back(ctx > 0 ? h.tables[static_cast<size_t>(s) * h.stride + pos / bs] * bs + pos % bs : -1);
    }
    h.qkv =
        cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(h.n) * (H + 2 * KVH) * D, rng, -1.5f, 1.5f));
    const int half = c.rotary() / 2;
    for (int i = 0; i < half; ++i)
        h.inv_freq.push_back(static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / c.rotary())));
    return h;
}

// Device copies of one batch: the batch arrays (shared by both paths) and, per path, its own
// qkv, caches and output.
struct DeviceState {
    DeviceBuffer<int32_t> positions, query_start, ctxs, tables, slots;
    DeviceBuffer<float> inv_freq;
    DeviceBuffer<uint16_t> qkv[2], k[2], v[2], out[2], q_out;
    DeviceBuffer<uint8_t> workspace;
    int n, max_ctx, stride;

    DeviceState(const FusedCase& c, const HostBatch& h)
        : positions(h.positions.size()),
          query_start(h.query_start.size()),
          ctxs(h.ctxs.size()),
          tables(h.tables.size()),
          slots(h.slots.size()),
          inv_freq(std::max<size_t>(h.inv_freq.size(), 1)),
          q_out(static_cast<size_t>(h.n) * c.num_heads * c.head_dim),
          workspace(cuda::attention_workspace_bytes(h.n, c.num_heads, c.head_dim)),
          n(h.n),
          max_ctx(h.max_ctx),
          stride(h.stride) {
        for (int i = 0; i < 2; ++i) {
            qkv[i] = DeviceBuffer<uint16_t>(h.qkv.size());
            k[i] = DeviceBuffer<uint16_t>(h.k_cache.size());
            v[i] = DeviceBuffer<uint16_t>(h.v_cache.size());
            out[i] = DeviceBuffer<uint16_t>(static_cast<size_t>(h.n) * c.num_heads * c.head_dim);
        }
        upload(h);
    }
    // New contents (same shapes); outputs poisoned.
    void upload(const HostBatch& h) {
        positions.upload(h.positions);
        query_start.upload(h.query_start);
        ctxs.upload(h.ctxs);
        tables.upload(h.tables);
        slots.upload(h.slots);
        if (!h.inv_freq.empty()) inv_freq.upload(h.inv_freq);
        for (int i = 0; i < 2; ++i) {
            qkv[i].upload(h.qkv);
            k[i].upload(h.k_cache);
            v[i].upload(h.v_cache);
            out[i].fill_bytes(0xff);
        }
        q_out.fill_bytes(0xff);
        max_ctx = h.max_ctx;
    }
    cuda::DeviceBatch batch(const FusedCase& c) const {
        cuda::DeviceBatch b;
        b.num_tokens = n;
        b.num_seqs = n;
        b.block_stride = stride;
        b.block_size = c.block_size;
        b.max_query_len = 1;
        b.max_context_len = max_ctx;
        b.positions = positions.get();
        b.query_start = query_start.get();
        b.context_lens = ctxs.get();
        b.block_tables = tables.get();
        b.slot_mapping = slots.get();
        return b;
    }
    float scale(const FusedCase& c) const { return 1.0f / std::sqrt(static_cast<float>(c.head_dim)); }
    // The attention's arguments of path i (no q, no workspace).
    cuda::AttentionArgs attention_args(const FusedCase& c, int i) const {
        cuda::AttentionArgs a;
        a.k_cache = k[i].get();
        a.v_cache = v[i].get();
        a.out = out[i].get();
        a.batch = batch(c);
        a.num_heads = c.num_heads;
        a.num_kv_heads = c.num_kv_heads;
        a.head_dim = c.head_dim;
        a.scale = scale(c);
        a.window = c.window;
        return a;
    }
    // Path 0: rope_and_cache_packed, then paged_attention.
    void run_apart(const FusedCase& c, cudaStream_t stream) {
        cuda::AttentionArgs a = attention_args(c, 0);
        cuda::rope_and_cache_packed(qkv[0].get(), q_out.get(), a.batch, inv_freq.get(), c.rotary(), c.attention_factor,
                                    c.neox, c.num_heads, c.num_kv_heads, c.head_dim, k[0].get(), v[0].get(), stream);
        a.q = q_out.get();
        a.workspace = workspace.get();
        a.workspace_bytes = workspace.size();
        cuda::paged_attention(a, stream);
    }
    // Path 1: the fused op.
    cuda::RopeCacheAttentionArgs fused_args(const FusedCase& c) const {
        cuda::RopeCacheAttentionArgs a;
        a.attn = attention_args(c, 1);
        a.qkv = qkv[1].get();
        a.inv_freq = inv_freq.get();
        a.rotary_dim = c.rotary();
        a.attention_factor = c.attention_factor;
        a.neox = c.neox;
        return a;
    }
};

int g_outputs = 0, g_outputs_bitwise = 0;  // over a test: output rows compared, and of them bit-equal

// Caches bit for bit; every output finite; real tokens within bf16 tolerance; padding rows zero.
void expect_same(const FusedCase& c, const HostBatch& h, DeviceState& d, const std::string& what) {
    const std::vector<uint16_t> k0 = d.k[0].download(), k1 = d.k[1].download();
    const std::vector<uint16_t> v0 = d.v[0].download(), v1 = d.v[1].download();
    size_t k_diff = 0, v_diff = 0;
    for (size_t i = 0; i < k0.size(); ++i) k_diff += k0[i] != k1[i], v_diff += v0[i] != v1[i];
    EXPECT_EQ(k_diff, 0u) << what << " " << c.name() << ": k cache elements that differ";
    EXPECT_EQ(v_diff, 0u) << what << " " << c.name() << ": v cache elements that differ";
    // The new tokens' slots were written (they started as NaN).
    const size_t slot_elems = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
    for (int s = 0; s < h.n; ++s) {
        if (h.slots[s] < 0) continue;
        const std::vector<uint16_t> ks(k1.begin() + h.slots[s] * slot_elems,
                                       k1.begin() + (h.slots[s] + 1) * slot_elems);
        EXPECT_EQ(cuda_test::count_nonfinite(ks), 0u) << what << " " << c.name() << ": slot of seq " << s;
    }

    const std::vector<float> ref = cuda_test::from_bf16(d.out[0].download());
    const std::vector<uint16_t> got_bits = d.out[1].download(), ref_bits = d.out[0].download();
    const std::vector<float> got = cuda_test::from_bf16(got_bits);
    const size_t row = static_cast<size_t>(c.num_heads) * c.head_dim;
    int failures = 0;
    for (int s = 0; s < h.n; ++s) {
        const std::vector<float> g(got.begin() + s * row, got.begin() + (s + 1) * row);
        const std::vector<float> r(ref.begin() + s * row, ref.begin() + (s + 1) * row);
        const size_t bad = cuda_test::count_nonfinite(g);
        const double err = cuda_test::rel_error(g, r);  // padding: both zero
        ++g_outputs;
        g_outputs_bitwise +=
            std::equal(got_bits.begin() + s * row, got_bits.begin() + (s + 1) * row, ref_bits.begin() + s * row);
        if (bad > 0 || !(err < 1e-2) || cuda_test::count_nonfinite(r) > 0) {
            if (++failures <= 5)
                ADD_FAILURE() << what << " " << c.name() << ": seq " << s << " (ctx " << h.ctxs[s] << "): rel error "
                              << err << ", non-finite " << bad << " of " << row;
        }
    }
    EXPECT_EQ(failures, 0) << what << " " << c.name();
}

// Both paths on fresh copies of one batch; `want_fused`: the fused kernel must take it.
void check_case(const FusedCase& c, uint32_t seed, bool want_fused = true) {
    std::mt19937 rng(seed);
    const HostBatch h = make_batch(c, rng);
    DeviceState d(c, h);
    const cuda::RopeCacheAttentionArgs a = d.fused_args(c);
    ASSERT_EQ(cuda::rope_cache_attention_supported(a), want_fused) << c.name();
    if (!want_fused) return;
    d.run_apart(c, nullptr);
    cuda::rope_cache_attention(a, nullptr);
    expect_same(c, h, d, "fused");
}

FusedCase make_case(int H, int KVH, int D, std::vector<int> ctxs, int rotary = -1, bool neox = true, int window = 0,
                    int bs = 16) {
    FusedCase c;
    c.num_heads = H, c.num_kv_heads = KVH, c.head_dim = D, c.rotary_dim = rotary, c.neox = neox, c.window = window;
    c.block_size = bs;
    c.ctxs = std::move(ctxs);
    return c;
}

void report_bitwise(const char* test) {
    std::printf("[ info ] %s: %d of %d output rows bit-identical to the two ops\n", test, g_outputs_bitwise, g_outputs);
    g_outputs = g_outputs_bitwise = 0;
}

// ---- correctness -----------------------------------------------------------------------------

// Batches of 1..4 sequences at contexts from one token (most splits empty) to 3000, GQA groups
// 1 / 4 / 8 at head dims 64 / 128, rope styles and partial rotary dims and windows in rotation.
TEST(CudaRopeAttention, MatchesTwoOps) {
    PG_SKIP_WITHOUT_CUDA();
    const int ctxs[] = {1, 2, 15, 16, 17, 100, 127, 128, 129, 256, 257, 1000, 2048, 3000};
    constexpr int kN = sizeof(ctxs) / sizeof(ctxs[0]);
    struct Heads {
        int h, kvh;
    };
    const Heads heads[] = {{8, 8}, {32, 8}, {64, 8}, {16, 2}};
    uint32_t seed = 5000;
    int variant = 0;
    for (const Heads& hd : heads)
        for (int D : {64, 128})
            for (int n = 1; n <= 4; ++n)
                for (int i = 0; i < kN; i += n) {  // every context once per batch size
                    std::vector<int> seq_ctx;
                    for (int j = 0; j < n; ++j) seq_ctx.push_back(ctxs[(i + j) % kN]);
                    ++variant;
                    const bool neox = variant % 2 == 0;
                    const int rotary = (variant / 2) % 2 == 0 ? D : D / 2;
                    const int window = variant % 3 == 2 ? 100 : 0;
                    FusedCase c = make_case(hd.h, hd.kvh, D, seq_ctx, rotary, neox, window);
                    if (variant % 5 == 4) c.attention_factor = 1.1f;  // yarn-style cos/sin scale
                    SCOPED_TRACE(c.name());
                    check_case(c, ++seed);
                }
    report_bitwise("MatchesTwoOps");
}

// 32 kv heads at 4 sequences (2 splits per cluster), head dim 256, 8 query heads a CTA (4-warp
// CTAs: 128 / 16 heads at 4 sequences leave fewer than 2 splits at 1, 2 or 4 heads a CTA), the
// Llama-3.2-1B shape at batch 1.
TEST(CudaRopeAttention, OtherShapes) {
    PG_SKIP_WITHOUT_CUDA();
    check_case(make_case(32, 32, 64, {700, 1, 33, 2000}), 1);
    check_case(make_case(32, 32, 128, {129, 3000, 16, 5}), 2);
    check_case(make_case(16, 2, 256, {2000}), 3);
    check_case(make_case(16, 2, 256, {17, 900, 1}), 4, true);
    check_case(make_case(4, 2, 256, {300, 4}, 256, false), 5);
    check_case(make_case(32, 8, 64, {128}), 6);
    check_case(make_case(32, 8, 64, {1024}), 7);
    check_case(make_case(128, 16, 256, {17, 900, 1, 300}), 8);
    report_bitwise("OtherShapes");
}

// Partial and odd rotary dims: neox with half % 8 != 0 takes the partners one by one; none at all.
TEST(CudaRopeAttention, RotaryDims) {
    PG_SKIP_WITHOUT_CUDA();
    uint32_t seed = 60;
    for (bool neox : {true, false})
        for (int rotary : {0, 8, 20, 24, 32, 48, 64}) {
            check_case(make_case(32, 8, 64, {300, 17}, rotary, neox), ++seed);
            check_case(make_case(16, 4, 128, {1, 1500, 64}, 2 * rotary, neox), ++seed);
        }
    report_bitwise("RotaryDims");
}

TEST(CudaRopeAttention, PaddingSequences) {
    PG_SKIP_WITHOUT_CUDA();
    check_case(make_case(32, 8, 64, {0}), 70);  // all padding: no cache write, zero output
    check_case(make_case(32, 8, 64, {0, 500, 0}), 71);
    check_case(make_case(32, 8, 64, {37, 0, 2999, 0}), 72);
    check_case(make_case(16, 2, 128, {0, 1}, 64, false), 73);
    report_bitwise("PaddingSequences");
}

TEST(CudaRopeAttention, SlidingWindow) {
    PG_SKIP_WITHOUT_CUDA();
    uint32_t seed = 80;
    for (int window : {1, 16, 100, 1000})
        for (int D : {64, 128}) {
            check_case(make_case(32, 8, D, {3000}, -1, true, window), ++seed);
            check_case(make_case(16, 4, D, {1, 17, 1500, 129}, -1, false, window), ++seed);
        }
    report_bitwise("SlidingWindow");
}

TEST(CudaRopeAttention, BlockSizes) {
    PG_SKIP_WITHOUT_CUDA();
    uint32_t seed = 90;
    for (int bs : {8, 32, 64, 256}) {
        check_case(make_case(32, 8, 64, {2000, 1, 333}, -1, true, 0, bs), ++seed);
        check_case(make_case(16, 4, 128, {bs, bs + 1}, -1, true, 100, bs), ++seed);
    }
    report_bitwise("BlockSizes");
}

// What the fused kernel does not take: more than 4 sequences, a prefill token, head dims outside
// 64 / 128 / 256, too many (sequence, kv head) units for a cluster, an odd rotary dim, a forced
// kernel choice.
TEST(CudaRopeAttention, Declines) {
    PG_SKIP_WITHOUT_CUDA();
    check_case(make_case(32, 8, 64, {5, 6, 7, 8, 9}), 100, false);
    check_case(make_case(8, 2, 32, {50}), 101, false);
    check_case(make_case(8, 2, 96, {50}), 102, false);
    check_case(make_case(256, 256, 64, {50, 60, 70, 80}), 103, false);
    check_case(make_case(32, 8, 64, {50}, 7), 104, false);
    std::mt19937 rng(105);
    const FusedCase c = make_case(32, 8, 64, {50, 60});
    const HostBatch h = make_batch(c, rng);
    DeviceState d(c, h);
    cuda::RopeCacheAttentionArgs a = d.fused_args(c);
    a.attn.batch.max_query_len = 2;
    EXPECT_FALSE(cuda::rope_cache_attention_supported(a));
    EXPECT_THROW(cuda::rope_cache_attention(a, nullptr), Error);
    a = d.fused_args(c);
    cuda::set_attention_kernel_choice(cuda::AttentionKernelChoice::SplitCombine);
    EXPECT_FALSE(cuda::rope_cache_attention_supported(a));
    cuda::set_attention_kernel_choice(cuda::AttentionKernelChoice::Auto);
    EXPECT_TRUE(cuda::rope_cache_attention_supported(a));
}

// ---- CUDA graphs -----------------------------------------------------------------------------

// Captured once at short contexts, replayed after the batch's device contents change: positions,
// context lengths (far past the captured ones), tables, slots, qkv and caches; a padding sequence.
TEST(CudaRopeAttention, GraphReplay) {
    PG_SKIP_WITHOUT_CUDA();
    for (int n = 1; n <= 4; ++n) {
        SCOPED_TRACE("n " + std::to_string(n));
        std::mt19937 rng(1400 + n);
        std::vector<int> small_ctx, big_ctx;
        for (int s = 0; s < n; ++s) {
            small_ctx.push_back(1 + static_cast<int>(rng() % 60));
            big_ctx.push_back(1 + static_cast<int>(rng() % 3000));
        }
        if (n > 1) big_ctx[n / 2] = 0;  // a padding sequence in the replay
        FusedCase small = make_case(32, 8, 64, small_ctx), big = make_case(32, 8, 64, big_ctx);
        small.rotary_dim = big.rotary_dim = 32;  // partial, as a check that nothing is baked in
        const HostBatch h_big = make_batch(big, rng);
        const HostBatch h_small = make_batch(small, rng, h_big.num_blocks, h_big.stride);
        ASSERT_EQ(h_small.num_blocks, h_big.num_blocks);
        ASSERT_EQ(h_small.stride, h_big.stride);

        DeviceState d(small, h_small);
        cudaStream_t stream;
        PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const cuda::RopeCacheAttentionArgs a = d.fused_args(small);
        ASSERT_TRUE(cuda::rope_cache_attention_supported(a));
        cuda_test::sync();
        d.run_apart(small, stream);
        cuda::rope_cache_attention(a, stream);  // eager first (as the backend does)
        PG_CUDA_CHECK(cudaStreamSynchronize(stream));
        expect_same(small, h_small, d, "eager");

        cudaGraph_t graph;
        cudaGraphExec_t exec;
        PG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        cuda::rope_cache_attention(a, stream);
        PG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

        for (const HostBatch* h : {&h_small, &h_big}) {
            const FusedCase& c = h == &h_small ? small : big;
            d.upload(*h);  // same buffers, new contents
            cuda_test::sync();
            d.run_apart(c, stream);
            PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_same(c, *h, d, h == &h_small ? "graph (same batch)" : "graph (new batch)");
        }
        PG_CUDA_CHECK(cudaGraphExecDestroy(exec));
        PG_CUDA_CHECK(cudaGraphDestroy(graph));
        PG_CUDA_CHECK(cudaStreamDestroy(stream));
    }
    report_bitwise("GraphReplay");
}

// ---- the backend op --------------------------------------------------------------------------

// CudaBackend::rope_cache_attention against rope_and_cache_packed + attention of the same backend
// (same step, separate caches): fused at 1..4 sequences, the fallback at 5 and in batch-invariant
// mode (there bit for bit: the same two ops).
TEST(CudaRopeAttention, BackendOp) {
    PG_SKIP_WITHOUT_CUDA();
    for (const bool invariant : {false, true}) {
        CudaOptions o;
        o.batch_invariant = invariant;
        o.graphs = false;
        CudaBackend b(o);
        for (int n : {1, 3, 5}) {
            SCOPED_TRACE(std::string(invariant ? "invariant" : "default") + " n " + std::to_string(n));
            std::mt19937 rng(1500 + n);
            std::vector<int> ctxs;
            for (int s = 0; s < n; ++s) ctxs.push_back(1 + static_cast<int>(rng() % 2000));
            const FusedCase c = make_case(32, 8, 64, ctxs);
            const HostBatch h = make_batch(c, rng);
            const int H = c.num_heads, KVH = c.num_kv_heads, D = c.head_dim;
            BatchInput batch;
            batch.token_ids.assign(n, 0);
            batch.positions = h.positions;
            batch.query_start = h.query_start;
            batch.context_lens = h.ctxs;
            batch.block_tables = h.tables;
            batch.max_blocks_per_seq = h.stride;
            batch.slot_mapping = h.slots;
            for (int s = 0; s < n; ++s) batch.logits_indices.push_back(s);
            RopeTable rope;
            rope.inv_freq = h.inv_freq;
            rope.rotary_dim = c.rotary();
            rope.style = RopeStyle::Neox;

            Tensor qkv = b.allocate(DType::BF16, {n, static_cast<int64_t>(H + 2 * KVH) * D});
            Tensor q[2], out[2], kc[2], vc[2];
            for (int i = 0; i < 2; ++i) {
                q[i] = b.allocate(DType::BF16, {n, static_cast<int64_t>(H) * D});
                out[i] = b.allocate(DType::BF16, {n, static_cast<int64_t>(H) * D});
                kc[i] = b.allocate(DType::BF16, {h.num_blocks, c.block_size, KVH, D});
                vc[i] = b.allocate(DType::BF16, {h.num_blocks, c.block_size, KVH, D});
                b.upload(h.k_cache.data(), kc[i]);
                b.upload(h.v_cache.data(), vc[i]);
            }
            b.upload(h.qkv.data(), qkv);
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            b.begin_step(batch);
            b.rope_and_cache_packed(qkv, q[0], batch, rope, D, KVH, kc[0], vc[0]);
            b.attention(q[0], kc[0], vc[0], batch, H, D, scale, 0, out[0]);
            b.rope_cache_attention(qkv, q[1], batch, rope, D, KVH, kc[1], vc[1], H, scale, 0, out[1]);
            std::vector<uint16_t> o[2], k[2];
            for (int i = 0; i < 2; ++i) {
                o[i].resize(static_cast<size_t>(out[i].numel()));
                k[i].resize(static_cast<size_t>(kc[i].numel()));
                b.download(out[i], o[i].data());
                b.download(kc[i], k[i].data());
            }
            EXPECT_EQ(k[0], k[1]);
            EXPECT_EQ(cuda_test::count_nonfinite(o[1]), 0u);
            EXPECT_LT(cuda_test::rel_error(cuda_test::from_bf16(o[1]), cuda_test::from_bf16(o[0])), 1e-2);
            if (invariant || n > 4) {
                EXPECT_EQ(o[0], o[1]);  // the fallback: the same two ops
            }
            for (Tensor* t : {&qkv, &q[0], &q[1], &out[0], &out[1], &kc[0], &kc[1], &vc[0], &vc[1]}) b.release(*t);
        }
    }
}

// ---- timing (prints only) --------------------------------------------------------------------

// Llama-3.2-1B decode (32 q heads, 8 kv heads, head_dim 64, rotary 64 neox, blocks of 16): time
// per call of rope_and_cache_packed + paged_attention ("apart") and of the fused op, each as a
// CUDA graph of 20 calls (programmatic dependent launch between them, as in a decode step).
TEST(CudaAttentionPerf, RopeCacheAttention) {
    PG_SKIP_WITHOUT_CUDA();
    constexpr int kCalls = 20;
    struct Shape {
        int seqs, ctx;
    };
    for (const Shape& sh : {Shape{1, 128}, Shape{1, 256}, Shape{1, 1024}, Shape{1, 4096}, Shape{4, 1024}}) {
        std::mt19937 rng(77);
        const FusedCase c = make_case(32, 8, 64, std::vector<int>(sh.seqs, sh.ctx));
        HostBatch h = make_batch(c, rng);
        for (uint16_t& x : h.k_cache) x = x == kBf16NaN ? 0 : x;  // the repeated calls read every slot
        for (uint16_t& x : h.v_cache) x = x == kBf16NaN ? 0 : x;
        DeviceState d(c, h);
        cudaStream_t stream;
        PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const cuda::RopeCacheAttentionArgs a = d.fused_args(c);
        ASSERT_TRUE(cuda::rope_cache_attention_supported(a));
        double us_apart = 0;
        for (int variant = 0; variant < 2; ++variant) {
            auto call = [&] {
                if (variant == 0)
                    d.run_apart(c, stream);
                else
                    cuda::rope_cache_attention(a, stream);
            };
            const double us = cuda_test::graph_us_per_call(stream, kCalls, call);
            if (variant == 0) us_apart = us;
            std::printf("[ perf ] rope+cache+attention b=%d ctx=%-5d %-6s %8.2f us/call%s\n", sh.seqs, sh.ctx,
                        variant == 0 ? "apart" : "fused", us,
                        variant > 0 ? (" (x" + std::to_string(us / us_apart).substr(0, 4) + ")").c_str() : "");
            EXPECT_EQ(cuda_test::count_nonfinite(d.out[variant].download()), 0u);
        }
        PG_CUDA_CHECK(cudaStreamDestroy(stream));
    }
}

}  // namespace
}  // namespace peregrine
