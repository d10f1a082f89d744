// paged_attention (src/backend/cuda/attention*.cu) against CpuBackend::attention on the same
// bf16-rounded inputs: decode batches (split-KV), tensor-core prefill, chunked prefill, mixed
// batches, GQA ratios, head dims, sliding windows, block sizes, padding sequences, and a CUDA
// graph replayed over new batch contents. Every case also runs the generic kernel and the
// batch-invariant path (AttentionArgs::batch_invariant; its invariance: test_batch_invariant.cc),
// and batches of <= 4 sequences (decode: one cluster kernel) also the two-kernel split path.
//
// Traps: outputs start as NaN (every non-padding element must be written and finite); cache
// slots that no query may read (unused blocks, the tail of each sequence's last block, blocks
// wholly outside every window) hold NaN, and window-dropped table entries are -1.
//
// FP8 caches (CudaAttentionFp8): the same cases with the bf16 caches quantized by the host
// quantizer (core/kv_fp8.h; NaN slots get NaN codes and scales), every kernel reading the FP8
// caches, against the CPU on the values the FP8 caches read back as.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/batch.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attention_hooks.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "core/kv_fp8.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;

struct Seq {
    int qlen;  // query tokens this step (positions ctx - qlen .. ctx - 1)
    int ctx;   // cached tokens after this step; 0 = padding sequence
};

struct Case {
    int num_heads = 32, num_kv_heads = 8, head_dim = 64;
    int block_size = 16;
    int window = 0;
    std::vector<Seq> seqs;
    std::string name() const {
        return "H" + std::to_string(num_heads) + "/KV" + std::to_string(num_kv_heads) + " D" +
               std::to_string(head_dim) + " bs" + std::to_string(block_size) + " win" + std::to_string(window) +
               " seqs" + std::to_string(seqs.size());
    }
};

// Host copy of one batch: the CPU batch, f32 (bf16-exact) tensors and their bf16 bits.
struct Inputs {
    BatchInput batch;
    int num_blocks = 0, max_query_len = 0, max_context_len = 0;
    std::vector<float> q, k, v;  // q [T, H*D]; caches [num_blocks, bs, KVH, D]
    std::vector<uint16_t> q_bf, k_bf, v_bf;
    std::vector<uint8_t> k8, v8;  // FP8 caches (to_fp8), else empty
};

// Quantizes the caches into k8 / v8 (core/kv_fp8.h layout) and sets k / v to the values they
// read back as (the CPU reference's input). NaN-poisoned slots stay poison: NaN codes and scale.
void to_fp8(const Case& c, Inputs& in) {
    const int D = c.head_dim, KVH = c.num_kv_heads;
    const KvFp8Layout f{c.block_size, KVH, D};
    const int64_t slots = static_cast<int64_t>(in.num_blocks) * c.block_size;
    for (auto [vals, codes] : {std::pair{&in.k, &in.k8}, std::pair{&in.v, &in.v8}}) {
        codes->assign(static_cast<size_t>(slots / c.block_size * f.block_bytes()), 0);
        for (int64_t s = 0; s < slots; ++s) {
            for (int h = 0; h < KVH; ++h) {
                float* x = vals->data() + (s * KVH + h) * D;
                uint8_t* q = codes->data() + f.code_offset(s, h);
                uint16_t scale = 0x7fc0;  // NaN
                if (std::isnan(x[0])) {
                    std::fill(q, q + D, uint8_t{0x7f});
                } else {
                    kv_fp8_quantize_head(x, D, q, &scale);
                    kv_fp8_dequantize_head(q, scale, D, x);
                }
                std::memcpy(codes->data() + f.scale_offset(s, h), &scale, 2);
            }
        }
    }
}

constexpr uint16_t kBf16NaN = 0x7fc0;

// min_blocks / min_stride: shapes to keep across batches (the graph test reuses buffers).
Inputs make_inputs(const Case& c, std::mt19937& rng, int min_blocks = 0, int min_stride = 0) {
    Inputs in;
    const int H = c.num_heads, KVH = c.num_kv_heads, D = c.head_dim, bs = c.block_size;
    BatchInput& b = in.batch;
    b.query_start.push_back(0);
    for (const Seq& s : c.seqs) {
        for (int i = 0; i < s.qlen; ++i) b.positions.push_back(s.ctx == 0 ? 0 : s.ctx - s.qlen + i);
        b.query_start.push_back(b.query_start.back() + s.qlen);
        b.context_lens.push_back(s.ctx);
        in.max_query_len = std::max(in.max_query_len, s.qlen);
        in.max_context_len = std::max(in.max_context_len, s.ctx);
    }
    const int T = b.query_start.back();
    b.token_ids.assign(T, 0);
    b.slot_mapping.assign(T, -1);

    // Blocks each sequence keeps: [first_block, ceil(ctx / bs)), earlier ones dropped when the
    // window excludes them for every query token of the step.
    int stride = min_stride, needed = 0;
    std::vector<int> first_block(c.seqs.size()), nblk(c.seqs.size());
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        const Seq& sq = c.seqs[s];
        nblk[s] = (sq.ctx + bs - 1) / bs;
        int min_first = 0;
        if (c.window > 0 && sq.ctx > 0) min_first = std::max(0, sq.ctx - sq.qlen - c.window + 1);
        first_block[s] = min_first / bs;
        needed += nblk[s] - first_block[s];
        stride = std::max(stride, nblk[s] + 1);
    }
    in.num_blocks = std::max(min_blocks, needed + 3);  // + unused (poisoned) blocks
    b.max_blocks_per_seq = stride;
    std::vector<int> ids(in.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    b.block_tables.assign(static_cast<size_t>(c.seqs.size()) * stride, -1);
    const size_t slot_elems = static_cast<size_t>(KVH) * D;
    const size_t cache_elems = static_cast<size_t>(in.num_blocks) * bs * slot_elems;
    in.k_bf.assign(cache_elems, kBf16NaN);
    in.v_bf.assign(cache_elems, kBf16NaN);
    std::uniform_real_distribution<float> kv_dist(-1.0f, 1.0f);
    int next = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        for (int j = first_block[s]; j < nblk[s]; ++j) {
            const int blk = ids[next++];
            b.block_tables[s * stride + j] = blk;
            for (int o = 0; o < bs && j * bs + o < c.seqs[s].ctx; ++o) {  // the tail stays NaN
                const size_t base = (static_cast<size_t>(blk) * bs + o) * slot_elems;
                for (size_t e = 0; e < slot_elems; ++e) {
                    in.k_bf[base + e] = f32_to_bf16(kv_dist(rng));
                    in.v_bf[base + e] = f32_to_bf16(kv_dist(rng));
                }
            }
        }
    }
    in.k = cuda_test::from_bf16(in.k_bf);
    in.v = cuda_test::from_bf16(in.v_bf);
    in.q_bf = cuda_test::to_bf16(cuda_test::random_floats(static_cast<size_t>(T) * H * D, rng, -2.0f, 2.0f));
    in.q = cuda_test::from_bf16(in.q_bf);
    return in;
}

// The CPU reference: f32 [T, H*D].
std::vector<float> cpu_attention(const Case& c, const Inputs& in) {
    static CpuBackend cpu(0);
    const int T = in.batch.num_tokens(), H = c.num_heads, D = c.head_dim;
    std::vector<float> out(static_cast<size_t>(T) * H * D, 0.0f);
    Tensor q(const_cast<float*>(in.q.data()), DType::F32, {T, static_cast<int64_t>(H) * D});
    Tensor kc(const_cast<float*>(in.k.data()), DType::F32, {in.num_blocks, c.block_size, c.num_kv_heads, D});
    Tensor vc(const_cast<float*>(in.v.data()), DType::F32, {in.num_blocks, c.block_size, c.num_kv_heads, D});
    Tensor o(out.data(), DType::F32, {T, static_cast<int64_t>(H) * D});
    cpu.attention(q, kc, vc, in.batch, H, D, 1.0f / std::sqrt(static_cast<float>(D)), c.window, o);
    return out;
}

// Device copies of one batch (buffers sized at construction; `upload` refills them).
struct DeviceInputs {
    DeviceBuffer<uint16_t> q, k, v, out;
    DeviceBuffer<uint8_t> k8, v8;  // empty unless the inputs have FP8 caches
    DeviceBuffer<int32_t> positions, query_start, context_lens, block_tables;
    DeviceBuffer<uint8_t> workspace;

    DeviceInputs(const Case& c, const Inputs& in)
        : q(in.q_bf.size()),
          k(in.k_bf.size()),
          v(in.v_bf.size()),
          out(in.q_bf.size()),
          k8(in.k8.size()),
          v8(in.v8.size()),
          positions(std::max<size_t>(in.batch.positions.size(), 1)),
          query_start(in.batch.query_start.size()),
          context_lens(in.batch.context_lens.size()),
          block_tables(in.batch.block_tables.size()),
          workspace(cuda::attention_workspace_bytes(in.batch.num_tokens(), c.num_heads, c.head_dim)) {
        upload(in);
    }
    void upload(const Inputs& in) {
        q.upload(in.q_bf);
        k.upload(in.k_bf);
        v.upload(in.v_bf);
        k8.upload(in.k8);
        v8.upload(in.v8);
        positions.upload(in.batch.positions);
        query_start.upload(in.batch.query_start);
        context_lens.upload(in.batch.context_lens);
        block_tables.upload(in.batch.block_tables);
        out.fill_bytes(0xff);  // NaN poison
    }
    cuda::AttentionArgs args(const Case& c, const Inputs& in, bool batch_invariant = false) const {
        cuda::AttentionArgs a;
        a.q = q.get();
        a.k_cache = k.get();
        a.v_cache = v.get();
        if (!in.k8.empty()) {  // the bf16 caches stay set: the kernels must not read them
            a.k_fp8 = k8.get();
            a.v_fp8 = v8.get();
        }
        a.out = out.get();
        cuda::DeviceBatch& b = a.batch;
        b.num_tokens = in.batch.num_tokens();
        b.num_seqs = in.batch.num_seqs();
        b.block_stride = in.batch.max_blocks_per_seq;
        b.block_size = c.block_size;
        b.max_query_len = in.max_query_len;
        b.max_context_len = in.max_context_len;
        b.positions = positions.get();
        b.query_start = query_start.get();
        b.context_lens = context_lens.get();
        b.block_tables = block_tables.get();
        a.num_heads = c.num_heads;
        a.num_kv_heads = c.num_kv_heads;
        a.head_dim = c.head_dim;
        a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        a.window = c.window;
        a.workspace = workspace.get();
        a.workspace_bytes = workspace.size();
        a.batch_invariant = batch_invariant;
        return a;
    }
};

// Every token: finite; non-padding tokens within bf16 tolerance of the CPU (per token).
// `ref`: cpu_attention(c, in), computed here when not given.
void expect_matches(const Case& c, const Inputs& in, const std::vector<uint16_t>& got_bf, const std::string& what,
                    const std::vector<float>* ref_in = nullptr) {
    const std::vector<float> ref = ref_in != nullptr ? *ref_in : cpu_attention(c, in);
    const std::vector<float> got = cuda_test::from_bf16(got_bf);
    const size_t row = static_cast<size_t>(c.num_heads) * c.head_dim;
    int failures = 0;
    for (int s = 0; s < in.batch.num_seqs(); ++s) {
        for (int t = in.batch.query_start[s]; t < in.batch.query_start[s + 1]; ++t) {
            const std::vector<float> g(got.begin() + t * row, got.begin() + (t + 1) * row);
            const std::vector<float> r(ref.begin() + t * row, ref.begin() + (t + 1) * row);
            const size_t bad = cuda_test::count_nonfinite(g);
            const double err = in.batch.context_lens[s] == 0 ? 0.0 : cuda_test::rel_error(g, r);
            if (bad > 0 || !(err < 1e-2)) {
                if (++failures <= 5)
                    ADD_FAILURE() << what << " " << c.name() << ": seq " << s << " (ctx " << in.batch.context_lens[s]
                                  << ") token " << t << " pos " << in.batch.positions[t] << ": rel error " << err
                                  << ", non-finite " << bad << " of " << row;
            }
        }
    }
    EXPECT_EQ(failures, 0) << what << " " << c.name();
}

// Runs the case through the automatic kernel choice, the generic kernel, the invariant path and,
// for <= 4 sequences, the split + combine decode path the cluster kernel replaces there. fp8:
// over FP8 caches made from the case's bf16 ones.
void check_case(const Case& c, uint32_t seed, bool fp8 = false) {
    std::mt19937 rng(seed);
    Inputs in = make_inputs(c, rng);
    if (fp8) {
        to_fp8(c, in);
        // The bf16 caches on the device become NaN: a kernel that read them would fail.
        std::fill(in.k_bf.begin(), in.k_bf.end(), kBf16NaN);
        std::fill(in.v_bf.begin(), in.v_bf.end(), kBf16NaN);
    }
    DeviceInputs dev(c, in);
    const std::vector<float> ref = cpu_attention(c, in);
    for (int mode = 0; mode < 4; ++mode) {
        if (mode == 3 && c.seqs.size() > 4) break;
        const auto choice = mode == 1   ? cuda::AttentionKernelChoice::Generic
                            : mode == 3 ? cuda::AttentionKernelChoice::SplitCombine
                                        : cuda::AttentionKernelChoice::Auto;
        cuda::set_attention_kernel_choice(choice);
        dev.out.fill_bytes(0xff);
        cuda::paged_attention(dev.args(c, in, mode == 2), nullptr);
        const std::vector<uint16_t> got = dev.out.download();
        cuda::set_attention_kernel_choice(cuda::AttentionKernelChoice::Auto);
        static const char* const kModes[] = {"auto", "generic", "invariant", "split-combine"};
        expect_matches(c, in, got, std::string(kModes[mode]) + (fp8 ? " fp8" : ""), &ref);
    }
}

std::vector<Seq> decode_seqs(int n, int max_ctx, std::mt19937& rng) {
    std::uniform_int_distribution<int> d(1, max_ctx);
    std::vector<Seq> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back({1, d(rng)});
    return seqs;
}

Case make_case(int H, int KVH, int D, std::vector<Seq> seqs, int bs = 16, int window = 0) {
    Case c;
    c.num_heads = H, c.num_kv_heads = KVH, c.head_dim = D, c.block_size = bs, c.window = window;
    c.seqs = std::move(seqs);
    return c;
}

// ---- decode --------------------------------------------------------------------------------

TEST(CudaAttention, DecodeBatches) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(1);
    for (int n : {1, 3, 64, 256}) {
        check_case(make_case(32, 8, 64, decode_seqs(n, 3000, rng)), 100 + n);  // Llama-3.2-1B shape
        if (n <= 64) check_case(make_case(32, 8, 128, decode_seqs(n, 3000, rng)), 200 + n);
    }
}

// Batches of 1..4 sequences (the cluster kernel: one cluster of 2..6 split CTAs per sequence, kv
// head and head chunk) at contexts from one token (most splits empty) to several blocks per
// split, every GQA group size (1, 4, 8) at head dims 64 / 128, and a split count of 2 (32 kv
// heads at 4 seqs).
TEST(CudaAttention, DecodeSmallBatches) {
    PG_SKIP_WITHOUT_CUDA();
    const int ctxs[] = {1, 2, 15, 16, 17, 127, 129, 256, 257, 1000, 2048, 3000};
    constexpr int kN = sizeof(ctxs) / sizeof(ctxs[0]);
    struct Heads {
        int h, kvh;
    };
    const Heads heads[] = {{8, 8}, {32, 32}, {32, 8}, {64, 8}, {16, 2}};
    uint32_t seed = 2000;
    for (const Heads& hd : heads)
        for (int D : {64, 128})
            for (int n = 1; n <= 4; ++n)
                for (int i = 0; i < kN; i += n) {  // every context once per batch size
                    std::vector<Seq> seqs;
                    for (int j = 0; j < n; ++j) seqs.push_back({1, ctxs[(i + j) % kN]});
                    SCOPED_TRACE("n " + std::to_string(n) + " first ctx " + std::to_string(ctxs[i]));
                    check_case(make_case(hd.h, hd.kvh, D, seqs), ++seed);
                }
    // The other head dims once at batch 1 and 3; D 256 with all 8 heads of a group in a CTA
    // (4-warp cluster CTAs: 16 kv heads at 4 sequences leave < 2 splits with fewer heads a CTA).
    std::mt19937 rng(21);
    for (int D : {8, 16, 32, 256})
        for (int ratio : {1, 8}) {
            check_case(make_case(2 * ratio, 2, D, {{1, 2000}}), ++seed);
            check_case(make_case(2 * ratio, 2, D, decode_seqs(3, 2000, rng)), ++seed);
        }
    check_case(make_case(128, 16, 256, decode_seqs(4, 2000, rng)), ++seed);
}

TEST(CudaAttention, DecodeShortContexts) {
    PG_SKIP_WITHOUT_CUDA();
    std::vector<Seq> seqs;
    for (int ctx : {1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129}) seqs.push_back({1, ctx});
    check_case(make_case(32, 8, 64, seqs), 3);
    check_case(make_case(8, 8, 128, seqs), 4);
}

TEST(CudaAttention, DecodeHeadDimsAndGqa) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(5);
    for (int n : {2, 5}) {  // cluster kernel, split + combine
        for (int D : {8, 16, 32, 64, 80, 96, 128, 256}) {
            for (int ratio : {1, 4, 8}) {
                const int KVH = 2;
                check_case(make_case(KVH * ratio, KVH, D, decode_seqs(n, 700, rng)), 1000 * n + D * 10 + ratio);
            }
        }
    }
}

TEST(CudaAttention, DecodeOddGroups) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(6);
    check_case(make_case(14, 2, 64, decode_seqs(7, 900, rng)), 61);   // group 7 (Qwen2.5-0.5B)
    check_case(make_case(32, 2, 128, decode_seqs(4, 900, rng)), 62);  // group 16: 2 head chunks
    check_case(make_case(24, 2, 64, decode_seqs(3, 900, rng)), 63);   // group 12
    check_case(make_case(6, 3, 32, decode_seqs(300, 50, rng)), 64);   // many short sequences
}

TEST(CudaAttention, DecodeSlidingWindow) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(7);
    for (int window : {16, 100})
        for (int D : {32, 64, 128})
            for (int n : {3, 9})
                check_case(make_case(16, 4, D, decode_seqs(n, 1500, rng), 16, window), 70 + D + window + n);
}

TEST(CudaAttention, DecodeBlockSizes) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(8);
    for (int bs : {8, 16, 32, 64, 256}) {
        check_case(make_case(32, 8, 64, decode_seqs(6, 2000, rng), bs), 80 + bs);
        check_case(make_case(16, 4, 128, decode_seqs(2, 2000, rng), bs, 100), 81 + bs);
    }
}

TEST(CudaAttention, DecodePaddingSequences) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(9);
    for (int n : {1, 2, 40}) {  // cluster (4 sequences), split + combine (5), one CTA per sequence
        std::vector<Seq> seqs = decode_seqs(n, 1200, rng);
        seqs.push_back({1, 0});
        seqs.insert(seqs.begin(), Seq{1, 0});
        seqs.push_back({1, 0});
        check_case(make_case(32, 8, 64, seqs), 90 + n);
        check_case(make_case(8, 2, 32, seqs), 91 + n);
    }
}

// ---- prefill -------------------------------------------------------------------------------

TEST(CudaAttention, PrefillOneSequence512) {
    PG_SKIP_WITHOUT_CUDA();
    for (int D : {64, 128})
        for (int ratio : {1, 4, 8}) check_case(make_case(8 * ratio, 8, D, {{512, 512}}), 300 + D + ratio);
}

TEST(CudaAttention, ChunkedPrefill) {
    PG_SKIP_WITHOUT_CUDA();
    // Query tokens at positions 100..227 over a cache holding 0..227.
    for (int D : {32, 64, 128}) check_case(make_case(32, 8, D, {{128, 228}}), 400 + D);
    // Ragged chunks: not multiples of the 64-row tile, starts not block-aligned.
    check_case(make_case(32, 8, 64, {{2, 37}, {63, 300}, {65, 65}, {130, 1000}, {7, 7}}), 410);
    check_case(make_case(16, 2, 128, {{129, 2000}, {3, 5}, {64, 64}}), 411);
}

TEST(CudaAttention, PrefillHeadDims) {
    PG_SKIP_WITHOUT_CUDA();
    for (int D : {8, 16, 32, 64, 80, 96, 128, 256})
        for (int ratio : {1, 4}) check_case(make_case(4 * ratio, 4, D, {{100, 100}, {37, 300}}), 500 + D + ratio);
}

TEST(CudaAttention, PrefillSlidingWindow) {
    PG_SKIP_WITHOUT_CUDA();
    for (int window : {16, 100})
        for (int D : {32, 64, 128}) {
            check_case(make_case(16, 4, D, {{300, 300}}, 16, window), 600 + D + window);
            check_case(make_case(16, 4, D, {{128, 700}, {1, 500}, {70, 90}}, 32, window), 601 + D + window);
        }
}

TEST(CudaAttention, PrefillBlockSizes) {
    PG_SKIP_WITHOUT_CUDA();
    for (int bs : {8, 16, 32, 64, 128, 256})
        for (int D : {64, 128}) check_case(make_case(16, 8, D, {{200, 200}, {96, 420}}, bs), 700 + bs + D);
}

// ---- mixed batches -------------------------------------------------------------------------

TEST(CudaAttention, MixedBatches) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(11);
    for (int D : {32, 64, 128}) {
        for (int bs : {16, 32}) {
            std::vector<Seq> seqs = decode_seqs(20, 2500, rng);  // decodes first, as the scheduler does
            seqs.push_back({128, 228});                          // a chunked prefill
            seqs.push_back({300, 300});                          // a whole prompt
            seqs.push_back({1, 0});                              // padding
            seqs.push_back({17, 1017});
            check_case(make_case(32, 8, D, seqs, bs), 800 + D + bs);
            check_case(make_case(32, 8, D, seqs, bs, 100), 801 + D + bs);
        }
    }
}

// <= 4 sequences: the decode launch is the cluster kernel; the prefill sequences' clusters skip.
TEST(CudaAttention, MixedSmallBatches) {
    PG_SKIP_WITHOUT_CUDA();
    for (int D : {64, 128}) {
        check_case(make_case(32, 8, D, {{1, 700}, {100, 300}, {1, 2000}, {1, 1}}), 850 + D);
        check_case(make_case(32, 8, D, {{130, 1000}, {1, 129}}, 16, 100), 851 + D);
    }
}

TEST(CudaAttention, MixedManyDecodesOnePrompt) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(12);
    std::vector<Seq> seqs = decode_seqs(256, 1500, rng);
    seqs.push_back({512, 512});
    check_case(make_case(32, 8, 64, seqs), 900);
}

TEST(CudaAttention, PrefillPaddingSequence) {
    PG_SKIP_WITHOUT_CUDA();
    check_case(make_case(32, 8, 64, {{3, 0}, {100, 100}, {1, 0}, {65, 0}}), 950);
    check_case(make_case(8, 2, 128, {{80, 0}, {1, 1}}), 951);
}

// ---- FP8 caches ------------------------------------------------------------------------------
// Each kernel of each path over FP8 caches: decode (cluster, split + combine, one CTA a sequence),
// tensor-core prefill, generic head dims, windows, block sizes, padding, and the invariant path.

TEST(CudaAttentionFp8, Decode) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(31);
    for (int n : {1, 3, 64}) {
        check_case(make_case(32, 8, 64, decode_seqs(n, 3000, rng)), 3100 + n, true);
        check_case(make_case(32, 8, 128, decode_seqs(n, 3000, rng)), 3200 + n, true);
    }
    for (int D : {8, 16, 32, 80, 96, 256})
        for (int n : {2, 5}) check_case(make_case(8, 2, D, decode_seqs(n, 700, rng)), 3300 + D + n, true);
    std::vector<Seq> shorts;
    for (int ctx : {1, 2, 15, 16, 17, 63, 64, 65, 129}) shorts.push_back({1, ctx});
    check_case(make_case(32, 8, 64, shorts), 3400, true);
    check_case(make_case(14, 2, 64, decode_seqs(7, 900, rng)), 3401, true);   // group 7
    check_case(make_case(32, 2, 128, decode_seqs(4, 900, rng)), 3402, true);  // group 16: 2 head chunks
}

TEST(CudaAttentionFp8, DecodeWindowsBlockSizesPadding) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(32);
    for (int window : {16, 100})
        check_case(make_case(16, 4, 64, decode_seqs(9, 1500, rng), 16, window), 3500 + window, true);
    for (int bs : {4, 8, 32, 256}) check_case(make_case(32, 8, 64, decode_seqs(6, 2000, rng), bs), 3600 + bs, true);
    check_case(make_case(16, 1, 128, decode_seqs(3, 2000, rng), 4), 3650, true);  // 4 tokens x 1 kv head a block
    std::vector<Seq> seqs = decode_seqs(5, 1200, rng);
    seqs.insert(seqs.begin(), Seq{1, 0});
    seqs.push_back({1, 0});
    check_case(make_case(32, 8, 64, seqs), 3700, true);
}

TEST(CudaAttentionFp8, PrefillChunkedAndMixed) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(33);
    for (int D : {64, 128}) {
        check_case(make_case(32, 8, D, {{512, 512}}), 3800 + D, true);
        check_case(make_case(32, 8, D, {{2, 37}, {63, 300}, {65, 65}, {130, 1000}, {7, 7}}), 3801 + D, true);
        check_case(make_case(16, 4, D, {{128, 700}, {1, 500}, {70, 90}}, 32, 100), 3802 + D, true);
        check_case(make_case(16, 8, D, {{200, 200}, {96, 420}}, 128), 3803 + D, true);
        std::vector<Seq> mixed = decode_seqs(20, 2500, rng);
        mixed.push_back({128, 228});
        mixed.push_back({1, 0});
        mixed.push_back({17, 1017});
        check_case(make_case(32, 8, D, mixed), 3804 + D, true);
        check_case(make_case(32, 8, D, {{1, 700}, {100, 300}, {1, 2000}, {1, 1}}), 3805 + D, true);
    }
    for (int D : {8, 32, 80, 96, 256}) check_case(make_case(8, 4, D, {{100, 100}, {37, 300}}), 3900 + D, true);
}

// A case whose caches are not FP8-aligned (2 tokens x 1 kv head a block) is refused, not misread.
TEST(CudaAttentionFp8, RefusesMisalignedBlocks) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(34);
    Case c = make_case(4, 1, 64, {{1, 40}}, 2);
    Inputs in = make_inputs(c, rng);
    to_fp8(c, in);
    DeviceInputs dev(c, in);
    EXPECT_THROW(cuda::paged_attention(dev.args(c, in), nullptr), Error);
}

// ---- CUDA graphs ---------------------------------------------------------------------------

// A decode launch captured once is replayed after the batch's device contents change: the
// context lengths (far past the captured max_context_len), tables, positions, q and caches.
TEST(CudaAttention, DecodeGraphReplay) {
    PG_SKIP_WITHOUT_CUDA();
    for (const bool inv : {false, true})
        for (int n : {1, 4, 16, 64}) {  // split-KV: clusters (1, 4), + combine (16); one CTA per unit (64)
            SCOPED_TRACE(inv ? "batch-invariant" : "default");
            std::mt19937 rng(1300 + n);
            const Case small = make_case(32, 8, 64, decode_seqs(n, 60, rng));
            Case big = make_case(32, 8, 64, decode_seqs(n, 3000, rng));
            if (n > 1) big.seqs[n / 2].ctx = 0;  // a padding sequence in the replay
            const Inputs in_big = make_inputs(big, rng);
            const Inputs in_small =
                make_inputs(small, rng, in_big.num_blocks, in_big.batch.max_blocks_per_seq);  // same shapes
            ASSERT_EQ(in_small.num_blocks, in_big.num_blocks);
            ASSERT_EQ(in_small.batch.max_blocks_per_seq, in_big.batch.max_blocks_per_seq);

            DeviceInputs dev(small, in_small);
            cudaStream_t stream;
            PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
            const cuda::AttentionArgs args = dev.args(small, in_small, inv);
            cuda_test::sync();
            cuda::paged_attention(args, stream);  // eager first (as the backend does)
            expect_matches(small, in_small, dev.out.download(), "eager");

            cudaGraph_t graph;
            cudaGraphExec_t exec;
            PG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            cuda::paged_attention(args, stream);
            PG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

            dev.upload(in_small);
            cuda_test::sync();  // uploads and the poison went through the legacy default stream
            PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_matches(small, in_small, dev.out.download(), "graph (same batch)");

            dev.upload(in_big);  // new contents, same buffers
            cuda_test::sync();
            PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_matches(big, in_big, dev.out.download(), "graph (new batch)");

            PG_CUDA_CHECK(cudaGraphExecDestroy(exec));
            PG_CUDA_CHECK(cudaGraphDestroy(graph));
            PG_CUDA_CHECK(cudaStreamDestroy(stream));
        }
}

// ---- argument checks -----------------------------------------------------------------------

TEST(CudaAttention, RejectsBadArguments) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(14);
    const Case c = make_case(32, 8, 64, decode_seqs(5, 100, rng));
    const Inputs in = make_inputs(c, rng);
    DeviceInputs dev(c, in);
    cuda::AttentionArgs a = dev.args(c, in);
    a.num_kv_heads = 6;  // 32 % 6 != 0
    EXPECT_THROW(cuda::paged_attention(a, nullptr), Error);
    a = dev.args(c, in);
    a.batch.block_size = 24;
    EXPECT_THROW(cuda::paged_attention(a, nullptr), Error);
    a = dev.args(c, in);
    a.head_dim = 12;  // not a multiple of 8
    EXPECT_THROW(cuda::paged_attention(a, nullptr), Error);
    a = dev.args(c, in);
    a.workspace_bytes = 16;  // 5 sequences split the keys: partials need more
    EXPECT_THROW(cuda::paged_attention(a, nullptr), Error);
}

// Decode at <= 4 sequences merges its splits inside a cluster: no workspace at all.
TEST(CudaAttention, SmallDecodeNeedsNoWorkspace) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(15);
    const Case c = make_case(32, 8, 64, decode_seqs(3, 2000, rng));
    const Inputs in = make_inputs(c, rng);
    DeviceInputs dev(c, in);
    cuda::AttentionArgs a = dev.args(c, in);
    a.workspace = nullptr;
    a.workspace_bytes = 0;
    cuda::paged_attention(a, nullptr);
    expect_matches(c, in, dev.out.download(), "no workspace");
}

// ---- timing (prints only) -----------------------------------------------------------------

// Llama-3.2-1B attention shapes (32 q heads, 8 kv heads, head_dim 64, blocks of 16): time per
// call of paged_attention, default and batch-invariant (and for decode at <= 4 sequences the
// split + combine path the cluster kernel replaced, "2-kernel"), measured as a CUDA graph of
// 20 calls (as decode steps run), with the bandwidth of the K/V bytes a decode must read and
// the causal FLOP rate of a prefill. Ratios (xN) are to "default".
TEST(CudaAttentionPerf, Report) {
    PG_SKIP_WITHOUT_CUDA();
    constexpr int H = 32, KVH = 8, D = 64, bs = 16, kCalls = 20;
    struct Shape {
        const char* name;
        int seqs, qlen, ctx;
    };
    const Shape shapes[] = {{"decode b=1 ctx=128", 1, 1, 128},     {"decode b=1 ctx=256", 1, 1, 256},
                            {"decode b=1 ctx=1024", 1, 1, 1024},   {"decode b=1 ctx=2048", 1, 1, 2048},
                            {"decode b=1 ctx=8192", 1, 1, 8192},   {"decode b=4 ctx=1024", 4, 1, 1024},
                            {"decode b=32 ctx=1024", 32, 1, 1024}, {"decode b=256 ctx=1024", 256, 1, 1024},
                            {"decode b=64 ctx=4096", 64, 1, 4096}, {"prefill 1x512", 1, 512, 512},
                            {"prefill 8x512", 8, 512, 512},        {"prefill chunk 512 @ ctx 4096", 1, 512, 4096}};
    std::mt19937 rng(99);
    for (const Shape& sh : shapes) {
        const int nb = (sh.ctx + bs - 1) / bs, T = sh.seqs * sh.qlen;
        std::vector<int32_t> positions, query_start{0}, ctx(sh.seqs, sh.ctx), tables(static_cast<size_t>(sh.seqs) * nb);
        for (int s = 0; s < sh.seqs; ++s) {
            for (int i = 0; i < sh.qlen; ++i) positions.push_back(sh.ctx - sh.qlen + i);
            query_start.push_back(query_start.back() + sh.qlen);
        }
        std::iota(tables.begin(), tables.end(), 0);
        std::shuffle(tables.begin(), tables.end(), rng);
        const size_t cache = tables.size() * bs * KVH * D;
        DeviceBuffer<uint16_t> q(static_cast<size_t>(T) * H * D), out(static_cast<size_t>(T) * H * D), k(cache),
            v(cache);
        q.fill_bytes(0x3c), k.fill_bytes(0x3c), v.fill_bytes(0x3c);  // bf16 0x3c3c ≈ 0.0115
        DeviceBuffer<int32_t> d_pos(positions), d_qs(query_start), d_ctx(ctx), d_tab(tables);
        DeviceBuffer<uint8_t> ws(cuda::attention_workspace_bytes(T, H, D));
        cuda::AttentionArgs a;
        a.q = q.get(), a.k_cache = k.get(), a.v_cache = v.get(), a.out = out.get();
        a.batch.num_tokens = T, a.batch.num_seqs = sh.seqs, a.batch.block_stride = nb, a.batch.block_size = bs;
        a.batch.max_query_len = sh.qlen, a.batch.max_context_len = sh.ctx;
        a.batch.positions = d_pos.get(), a.batch.query_start = d_qs.get(), a.batch.context_lens = d_ctx.get();
        a.batch.block_tables = d_tab.get();
        a.num_heads = H, a.num_kv_heads = KVH, a.head_dim = D, a.scale = 0.125f;
        a.workspace = ws.get(), a.workspace_bytes = ws.size();

        cudaStream_t stream;
        PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        double us_default = 0;
        for (int variant = 0; variant < 3; ++variant) {  // default, invariant, 2-kernel
            if (variant == 2 && !(sh.qlen == 1 && sh.seqs <= 4)) break;
            const bool inv = variant == 1;
            a.batch_invariant = inv;
            cuda::set_attention_kernel_choice(variant == 2 ? cuda::AttentionKernelChoice::SplitCombine
                                                           : cuda::AttentionKernelChoice::Auto);
            const double us = cuda_test::graph_us_per_call(stream, kCalls, [&] { cuda::paged_attention(a, stream); });
            double kv_bytes = 0, flops = 0;
            for (int s = 0; s < sh.seqs; ++s) {
                kv_bytes += 2.0 * sh.ctx * KVH * D * 2;
                for (int i = 0; i < sh.qlen; ++i) flops += 4.0 * (sh.ctx - sh.qlen + i + 1) * H * D;
            }
            if (variant == 0) us_default = us;
            static const char* const kVariants[] = {"default", "invariant", "2-kernel"};
            std::printf("[ perf ] %-30s %-9s %9.2f us/call  %7.1f GB/s (K/V)  %7.2f TFLOP/s%s\n", sh.name,
                        kVariants[variant], us, kv_bytes / (us * 1e3), flops / (us * 1e6),
                        variant > 0 ? (" (x" + std::to_string(us / us_default).substr(0, 4) + ")").c_str() : "");
            EXPECT_EQ(cuda_test::count_nonfinite(out.download()), 0u) << sh.name;
        }
        cuda::set_attention_kernel_choice(cuda::AttentionKernelChoice::Auto);
        PG_CUDA_CHECK(cudaStreamDestroy(stream));
    }
}

}  // namespace
}  // namespace peregrine
