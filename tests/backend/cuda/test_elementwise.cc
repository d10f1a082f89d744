// The elementwise CUDA kernels (src/backend/cuda/elementwise.cu) against the CPU backend on the
// same inputs rounded to bf16. Outputs are poisoned (NaN bytes) first, so an element a kernel
// forgets to write fails the check.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "model/rope.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::from_bf16;
using cuda_test::random_floats;
using cuda_test::rel_error;
using cuda_test::round_bf16;
using cuda_test::to_bf16;

constexpr double kBf16Tol = 1e-2;  // relative L2 error of a bf16 result (typically ~3e-3)

CpuBackend& cpu() {
    static CpuBackend backend(1);
    return backend;
}

Tensor host_f32(std::vector<float>& v, int64_t rows, int64_t cols) {
    return Tensor(v.data(), DType::F32, {rows, cols});
}

// ---- embedding -------------------------------------------------------------------------------

TEST(CudaElementwise, EmbeddingMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(1);
    for (int hidden : {8, 64, 100, 4096}) {
        const int vocab = 300, n = 37;
        const std::vector<uint16_t> table = to_bf16(random_floats(static_cast<size_t>(vocab) * hidden, rng));
        std::vector<int32_t> ids(n);
        for (int& id : ids) id = static_cast<int>(rng() % vocab);
        ids[3] = ids[4];  // a repeated id

        std::vector<float> ref(static_cast<size_t>(n) * hidden);
        cpu().embedding(Tensor(const_cast<uint16_t*>(table.data()), DType::BF16, {vocab, hidden}), ids.data(), n,
                        host_f32(ref, n, hidden), 0);

        DeviceBuffer<uint16_t> d_table(table);
        DeviceBuffer<int32_t> d_ids(ids);
        DeviceBuffer<float> d_out(ref.size());
        d_out.fill_bytes(0xff);
        cuda::embedding(d_table.get(), d_ids.get(), nullptr, n, hidden, 0, vocab, d_out.get(), nullptr);
        EXPECT_EQ(d_out.download(), ref) << "hidden " << hidden;  // bf16 -> f32 is exact
    }
}

// Vocabulary-parallel: a rank holding rows [begin, begin + rows) of the vocabulary gives zeros
// for every other id (fed draws included), as the CPU does.
TEST(CudaElementwise, EmbeddingOfAVocabularySlice) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(4);
    const int hidden = 64, begin = 100, rows = 50;
    const std::vector<uint16_t> slice = to_bf16(random_floats(static_cast<size_t>(rows) * hidden, rng));
    const std::vector<int32_t> ids = {0, 99, 100, 120, 149, 150, 299, 100};
    const int n = static_cast<int>(ids.size());
    std::vector<float> ref(static_cast<size_t>(n) * hidden);
    cpu().embedding(Tensor(const_cast<uint16_t*>(slice.data()), DType::BF16, {rows, hidden}), ids.data(), n,
                    host_f32(ref, n, hidden), begin);
    for (int i = 0; i < hidden; ++i) EXPECT_EQ(ref[i], 0.0f);  // id 0: not this rank's
    DeviceBuffer<uint16_t> d_table(slice);
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_out(ref.size());
    d_out.fill_bytes(0xff);
    cuda::embedding(d_table.get(), d_ids.get(), nullptr, n, hidden, begin, rows, d_out.get(), nullptr);
    EXPECT_EQ(d_out.download(), ref);
    // A fed draw (id -1) of 120 is this rank's row 20; of 7, another rank's.
    for (int drawn : {120, 7}) {
        DeviceBuffer<int32_t> d_feed(std::vector<int32_t>{drawn});
        DeviceBuffer<int32_t> d_one(std::vector<int32_t>{-1});
        DeviceBuffer<float> d_row(hidden);
        cuda::embedding(d_table.get(), d_one.get(), d_feed.get(), 1, hidden, begin, rows, d_row.get(), nullptr);
        const std::vector<float> row = d_row.download();
        for (int i = 0; i < hidden; ++i)
            ASSERT_EQ(row[i], drawn == 120 ? bf16_to_f32(slice[20 * hidden + i]) : 0.0f) << drawn;
    }
}

TEST(CudaElementwise, EmbeddingNegativeIdGivesZeros) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(2);
    const int hidden = 64;
    DeviceBuffer<uint16_t> d_table(to_bf16(random_floats(4 * hidden, rng)));
    DeviceBuffer<int32_t> d_ids(std::vector<int32_t>{-1, 2});
    DeviceBuffer<float> d_out(2 * hidden);
    d_out.fill_bytes(0xff);
    cuda::embedding(d_table.get(), d_ids.get(), nullptr, 2, hidden, 0, 4, d_out.get(), nullptr);
    const std::vector<float> out = d_out.download();
    for (int i = 0; i < hidden; ++i) EXPECT_EQ(out[i], 0.0f);
    EXPECT_EQ(cuda_test::count_nonfinite(out), 0u);
}

// Async scheduling: id -1 - j takes the previous step's draw j from the feed buffer.
TEST(CudaElementwise, EmbeddingTakesFedDraws) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(3);
    const int hidden = 64, vocab = 5;
    const std::vector<uint16_t> table = to_bf16(random_floats(vocab * hidden, rng));
    DeviceBuffer<uint16_t> d_table(table);
    DeviceBuffer<int32_t> d_feed(std::vector<int32_t>{4, 1, 3});
    DeviceBuffer<int32_t> d_ids(std::vector<int32_t>{-3, 2, -1, -2});
    DeviceBuffer<float> d_out(4 * hidden);
    cuda::embedding(d_table.get(), d_ids.get(), d_feed.get(), 4, hidden, 0, vocab, d_out.get(), nullptr);
    const std::vector<float> out = d_out.download();
    const int want[4] = {3, 2, 4, 1};
    for (int r = 0; r < 4; ++r)
        for (int i = 0; i < hidden; ++i)
            ASSERT_EQ(out[r * hidden + i], bf16_to_f32(table[want[r] * hidden + i])) << "row " << r;
}

// ---- rms_norm --------------------------------------------------------------------------------

struct NormCase {
    int rows, dim;
};

void check_rms_norm(const NormCase& c, bool x_f32, bool out_f32, bool with_residual, bool alias, std::mt19937& rng) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " dim " << c.dim << " x_f32 " << x_f32 << " out_f32 "
                                    << out_f32 << " residual " << with_residual << " alias " << alias);
    const size_t count = static_cast<size_t>(c.rows) * c.dim;
    const float eps = 1e-6f;
    std::vector<float> x = random_floats(count, rng, -2.0f, 2.0f);
    if (!x_f32) x = round_bf16(x);
    std::vector<float> weight = random_floats(c.dim, rng, 0.5f, 1.5f);
    std::vector<float> residual = random_floats(count, rng, -3.0f, 3.0f);

    // CPU reference (f32 activations).
    std::vector<float> ref_res = residual, ref_out(count), x_cpu = x;
    cpu().rms_norm(host_f32(x_cpu, c.rows, c.dim), with_residual ? host_f32(ref_res, c.rows, c.dim) : Tensor(),
                   host_f32(weight, 1, c.dim), eps, host_f32(ref_out, c.rows, c.dim));

    DeviceBuffer<float> d_w(weight), d_res(residual);
    DeviceBuffer<float> d_x32, d_out32;
    DeviceBuffer<uint16_t> d_x16, d_out16;
    void* d_x;
    if (x_f32) {
        d_x32 = DeviceBuffer<float>(x);
        d_x = d_x32.get();
    } else {
        d_x16 = DeviceBuffer<uint16_t>(to_bf16(x));
        d_x = d_x16.get();
    }
    void* d_out;
    if (alias) {
        d_out = d_x;
    } else if (out_f32) {
        d_out32 = DeviceBuffer<float>(count);
        d_out32.fill_bytes(0xff);
        d_out = d_out32.get();
    } else {
        d_out16 = DeviceBuffer<uint16_t>(count);
        d_out16.fill_bytes(0xff);
        d_out = d_out16.get();
    }
    cuda::rms_norm(d_x, x_f32, with_residual ? d_res.get() : nullptr, d_w.get(), eps, d_out, out_f32, c.rows, c.dim,
                   nullptr);

    std::vector<float> out;
    if (out_f32)
        out = alias ? d_x32.download() : d_out32.download();
    else
        out = from_bf16(alias ? d_x16.download() : d_out16.download());
    EXPECT_EQ(cuda_test::count_nonfinite(out), 0u);
    const double err = rel_error(out, ref_out);
    EXPECT_LT(err, out_f32 ? 1e-5 : kBf16Tol);
    if (with_residual) {
        EXPECT_EQ(d_res.download(), ref_res);  // the same f32 additions
    } else {
        EXPECT_EQ(d_res.download(), residual);  // untouched
    }
}

TEST(CudaElementwise, RmsNormMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(3);
    // Small rows (grouped lanes), odd sizes (scalar path), CTA rows, and a streamed long row.
    const NormCase cases[] = {{1, 8},    {37, 64},  {33, 128}, {3, 100},  {5, 1000},
                              {4, 2048}, {2, 4096}, {3, 5120}, {2, 8192}, {1, 40000}};
    for (const NormCase& c : cases)
        for (int x_f32 = 0; x_f32 < 2; ++x_f32)
            for (int out_f32 = 0; out_f32 < 2; ++out_f32)
                for (int res = 0; res < 2; ++res) check_rms_norm(c, x_f32, out_f32, res, false, rng);
}

TEST(CudaElementwise, RmsNormOutAliasesX) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(4);
    for (const NormCase& c : {NormCase{40, 128}, NormCase{3, 4096}, NormCase{2, 40000}})
        for (int f32 = 0; f32 < 2; ++f32)
            for (int res = 0; res < 2; ++res) check_rms_norm(c, f32, f32, res, true, rng);
}

// ---- rope + cache ----------------------------------------------------------------------------

struct RopeCase {
    int head_dim, num_heads, num_kv_heads, rotary_dim;
    RopeStyle style;
    RopeScaling scaling;
};

RopeConfig make_config(const RopeCase& c) {
    RopeConfig rc;
    rc.rotary_dim = c.rotary_dim;
    rc.style = c.style;
    rc.scaling = c.scaling;
    switch (c.scaling) {
        case RopeScaling::Llama3:
            rc.theta = 500000.0;
            rc.factor = 8.0;
            rc.original_max_position = 8192;
            rc.low_freq_factor = 1.0;
            rc.high_freq_factor = 4.0;
            break;
        case RopeScaling::Yarn:
            rc.theta = 1000000.0;
            rc.factor = 4.0;
            rc.original_max_position = 32768;
            break;
        default:
            rc.theta = 10000.0;
    }
    return rc;
}

void check_rope(const RopeCase& c, std::mt19937& rng) {
    SCOPED_TRACE(testing::Message() << "head_dim " << c.head_dim << " heads " << c.num_heads << "/" << c.num_kv_heads
                                    << " rotary " << c.rotary_dim << " neox " << (c.style == RopeStyle::Neox)
                                    << " scaling " << static_cast<int>(c.scaling));
    const RopeTable table = make_rope_table(make_config(c));
    const int n = 23, block_size = 16, num_blocks = 5;
    const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
    const int64_t cache_elems = static_cast<int64_t>(num_blocks) * block_size * kv_dim;

    std::vector<float> q = round_bf16(random_floats(n * q_dim, rng));
    std::vector<float> k = round_bf16(random_floats(n * kv_dim, rng));
    std::vector<float> v = round_bf16(random_floats(n * kv_dim, rng));
    std::vector<float> cache_init_k = round_bf16(random_floats(cache_elems, rng, -5.0f, 5.0f));
    std::vector<float> cache_init_v = round_bf16(random_floats(cache_elems, rng, -5.0f, 5.0f));

    // Positions: small, mid and large (100000); slots: distinct, a few tokens padding (-1).
    std::vector<int32_t> positions(n), slots(n);
    std::vector<int32_t> perm(num_blocks * block_size);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < n; ++t) {
        positions[t] = t < 3 ? t : t < 6 ? 100000 - t : static_cast<int32_t>(rng() % 40000);
        slots[t] = (t % 7 == 5) ? -1 : perm[t];
    }

    // CPU: padding tokens write to scratch slots past the real cache.
    const int scratch_blocks = (n + block_size - 1) / block_size;
    std::vector<float> cpu_kc(cache_init_k), cpu_vc(cache_init_v);
    cpu_kc.resize(static_cast<size_t>(num_blocks + scratch_blocks) * block_size * kv_dim);
    cpu_vc.resize(cpu_kc.size());
    BatchInput batch;
    batch.positions = positions;
    batch.slot_mapping = slots;
    for (int t = 0; t < n; ++t)
        if (slots[t] < 0) batch.slot_mapping[t] = num_blocks * block_size + t;
    std::vector<float> ref_q = q, ref_k = k, v_cpu = v;
    cpu().rope_and_cache(
        host_f32(ref_q, n, q_dim), host_f32(ref_k, n, kv_dim), host_f32(v_cpu, n, kv_dim), batch, table, c.head_dim,
        Tensor(cpu_kc.data(), DType::F32, {num_blocks + scratch_blocks, block_size, c.num_kv_heads, c.head_dim}),
        Tensor(cpu_vc.data(), DType::F32, {num_blocks + scratch_blocks, block_size, c.num_kv_heads, c.head_dim}));
    cpu_kc.resize(cache_elems);
    cpu_vc.resize(cache_elems);

    DeviceBuffer<uint16_t> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v));
    DeviceBuffer<uint16_t> d_kc(to_bf16(cache_init_k)), d_vc(to_bf16(cache_init_v));
    DeviceBuffer<float> d_inv(table.inv_freq);
    DeviceBuffer<int32_t> d_pos(positions), d_slots(slots);
    cuda::DeviceBatch db;
    db.num_tokens = n;
    db.num_seqs = 1;
    db.block_size = block_size;
    db.positions = d_pos.get();
    db.slot_mapping = d_slots.get();
    cuda::rope_and_cache(d_q.get(), d_k.get(), d_v.get(), db, d_inv.get(), table.rotary_dim, table.attention_factor,
                         table.style == RopeStyle::Neox, c.num_heads, c.num_kv_heads, c.head_dim, d_kc.get(),
                         d_vc.get(), nullptr);

    const std::vector<float> gq = from_bf16(d_q.download()), gk = from_bf16(d_k.download());
    const std::vector<float> gkc = from_bf16(d_kc.download()), gvc = from_bf16(d_vc.download());
    EXPECT_LT(rel_error(gq, ref_q), kBf16Tol);
    EXPECT_LT(rel_error(gk, ref_k), kBf16Tol);
    EXPECT_LT(rel_error(gkc, cpu_kc), kBf16Tol);
    EXPECT_EQ(gvc, cpu_vc);  // v is copied bit for bit; untouched slots keep their values
    // Dims past rotary_dim are untouched, bit for bit.
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < c.num_heads; ++h)
            for (int d = c.rotary_dim; d < c.head_dim; ++d) {
                const int64_t i = t * q_dim + h * c.head_dim + d;
                ASSERT_EQ(gq[i], q[i]) << "token " << t << " head " << h << " dim " << d;
            }
    // Cache slots nobody wrote keep their old values, bit for bit.
    std::vector<bool> written(num_blocks * block_size, false);
    for (int s : slots)
        if (s >= 0) written[s] = true;
    for (int s = 0; s < num_blocks * block_size; ++s) {
        if (written[s]) continue;
        for (int64_t e = 0; e < kv_dim; ++e)
            ASSERT_EQ(gkc[s * kv_dim + e], cache_init_k[s * kv_dim + e]) << "slot " << s;
    }
    // Per element, the rotated values are the CPU's rounded to bf16 (within one bf16 step).
    for (size_t i = 0; i < gq.size(); ++i)
        ASSERT_NEAR(gq[i], ref_q[i], std::abs(ref_q[i]) * 8e-3f + 1e-6f) << "q element " << i;
}

TEST(CudaElementwise, RopeAndCacheMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(5);
    for (int hd : {8, 16, 32, 64, 128})
        for (RopeStyle style : {RopeStyle::Neox, RopeStyle::Interleaved})
            for (int partial = 0; partial < 2; ++partial) {
                const int rotary = partial ? hd / 2 : hd;
                check_rope({hd, 4, 4, rotary, style, RopeScaling::None}, rng);    // MHA
                check_rope({hd, 8, 2, rotary, style, RopeScaling::Llama3}, rng);  // GQA 4:1
                check_rope({hd, 6, 1, rotary, style, RopeScaling::Yarn}, rng);    // MQA, yarn attention factor
            }
    // Odd sizes: head_dim 80 / 96 (widths 8 and 16 pairs), rotary 24 of 64 (qwen-style partial).
    check_rope({80, 4, 2, 80, RopeStyle::Neox, RopeScaling::None}, rng);
    check_rope({96, 4, 2, 96, RopeStyle::Interleaved, RopeScaling::None}, rng);
    check_rope({64, 4, 2, 24, RopeStyle::Neox, RopeScaling::None}, rng);
    check_rope({64, 4, 2, 20, RopeStyle::Interleaved, RopeScaling::None}, rng);
    check_rope({256, 2, 1, 64, RopeStyle::Neox, RopeScaling::None}, rng);
}

// ---- silu_mul, gather, copy_blocks, add_bias, fill --------------------------------------------

TEST(CudaElementwise, SiluMulMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(6);
    for (auto [n, dim] : {std::pair{1, 8}, {7, 100}, {33, 1376}, {5, 14336}, {3, 13}})
        for (int alias = 0; alias < 2; ++alias) {
            SCOPED_TRACE(testing::Message() << "n " << n << " dim " << dim << " alias " << alias);
            const size_t count = static_cast<size_t>(n) * dim;
            std::vector<float> g = round_bf16(random_floats(count, rng, -8.0f, 8.0f));
            std::vector<float> u = round_bf16(random_floats(count, rng, -2.0f, 2.0f));
            std::vector<float> ref(count);
            cpu().silu_mul(host_f32(g, n, dim), host_f32(u, n, dim), host_f32(ref, n, dim));
            DeviceBuffer<uint16_t> d_g(to_bf16(g)), d_u(to_bf16(u)), d_o(count);
            d_o.fill_bytes(0xff);
            uint16_t* out = alias ? d_g.get() : d_o.get();
            cuda::silu_mul(d_g.get(), d_u.get(), out, n, dim, nullptr);
            const std::vector<float> got = from_bf16(alias ? d_g.download() : d_o.download());
            EXPECT_EQ(cuda_test::count_nonfinite(got), 0u);
            EXPECT_LT(rel_error(got, ref), kBf16Tol);
        }
}

TEST(CudaElementwise, GatherRowsMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(7);
    for (int dim : {8, 64, 100, 4096}) {
        const int m = 50, n = 17;
        std::vector<float> x = round_bf16(random_floats(static_cast<size_t>(m) * dim, rng));
        std::vector<int32_t> rows(n);
        for (int& r : rows) r = static_cast<int>(rng() % m);
        rows[1] = rows[0];
        std::vector<float> ref(static_cast<size_t>(n) * dim);
        cpu().gather_rows(host_f32(x, m, dim), rows, host_f32(ref, n, dim));
        DeviceBuffer<uint16_t> d_x(to_bf16(x)), d_out(ref.size());
        DeviceBuffer<int32_t> d_rows(rows);
        d_out.fill_bytes(0xff);
        cuda::gather_rows(d_x.get(), d_rows.get(), n, dim, d_out.get(), nullptr);
        EXPECT_EQ(from_bf16(d_out.download()), ref) << "dim " << dim;
    }
}

TEST(CudaElementwise, CopyBlocksMatchesCpu) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(8);
    for (int head_dim : {64, 5}) {  // 5: block_elems not a multiple of 8 (scalar path)
        const int num_blocks = 12, block_size = 16, kv_heads = 3;
        const int64_t block_elems = static_cast<int64_t>(block_size) * kv_heads * head_dim;
        std::vector<float> cache = round_bf16(random_floats(num_blocks * block_elems, rng));
        const std::vector<std::pair<int32_t, int32_t>> pairs = {{0, 5}, {3, 7}, {3, 8}, {11, 1}};
        std::vector<float> ref = cache;
        cpu().copy_blocks(Tensor(ref.data(), DType::F32, {num_blocks, block_size, kv_heads, head_dim}), pairs);
        std::vector<int32_t> flat;
        for (auto [s, d] : pairs) flat.push_back(s), flat.push_back(d);
        DeviceBuffer<uint16_t> d_cache(to_bf16(cache));
        DeviceBuffer<int32_t> d_pairs(flat);
        cuda::copy_blocks(d_cache.get(), d_pairs.get(), static_cast<int>(pairs.size()), block_elems, nullptr);
        EXPECT_EQ(from_bf16(d_cache.download()), ref) << "head_dim " << head_dim;
    }
}

TEST(CudaElementwise, AddBias) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(9);
    for (auto [n, m] : {std::pair{5, 64}, {3, 100}, {9, 4096}}) {
        const std::vector<uint16_t> x = to_bf16(random_floats(static_cast<size_t>(n) * m, rng));
        const std::vector<float> bias = random_floats(m, rng);
        std::vector<uint16_t> ref(x.size());
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < m; ++j) ref[i * m + j] = f32_to_bf16(bf16_to_f32(x[i * m + j]) + bias[j]);
        DeviceBuffer<uint16_t> d_x(x);
        DeviceBuffer<float> d_b(bias);
        cuda::add_bias(d_x.get(), d_b.get(), n, m, nullptr);
        EXPECT_EQ(d_x.download(), ref) << "m " << m;
    }
}

TEST(CudaElementwise, FillRandomEqualsCpuDummyWeights) {
    PG_SKIP_WITHOUT_CUDA();
    const int64_t n = 100003;
    const uint64_t seed = 0x1234abcdull;
    DeviceBuffer<float> d_f(n);
    DeviceBuffer<uint16_t> d_h(n);
    d_f.fill_bytes(0xff);
    d_h.fill_bytes(0xff);
    cuda::fill_random_f32(d_f.get(), n, seed, -0.25f, 0.75f, nullptr);
    cuda::fill_random_bf16(d_h.get(), n, seed + 1, 0.02f, nullptr);
    const std::vector<float> f = d_f.download();
    const std::vector<uint16_t> h = d_h.download();
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(f[i], uniform_hash(seed, i, -0.25f, 0.75f)) << i;
        ASSERT_EQ(h[i], f32_to_bf16(uniform_hash(seed + 1, i, -0.02f, 0.02f))) << i;
    }
}

TEST(CudaElementwise, EmptyLaunchesAreNoOps) {
    PG_SKIP_WITHOUT_CUDA();
    cuda::embedding(nullptr, nullptr, nullptr, 0, 64, 0, 0, nullptr, nullptr);
    cuda::rms_norm(nullptr, true, nullptr, nullptr, 1e-6f, nullptr, true, 0, 64, nullptr);
    cuda::DeviceBatch db;
    cuda::rope_and_cache(nullptr, nullptr, nullptr, db, nullptr, 64, 1.0f, true, 4, 4, 64, nullptr, nullptr, nullptr);
    cuda::silu_mul(nullptr, nullptr, nullptr, 0, 64, nullptr);
    cuda::gather_rows(nullptr, nullptr, 0, 64, nullptr, nullptr);
    cuda::copy_blocks(nullptr, nullptr, 0, 1024, nullptr);
    cuda::fill_random_bf16(nullptr, 0, 1, 1.0f, nullptr);
    cuda::fill_random_f32(nullptr, 0, 1, 0.0f, 1.0f, nullptr);
    cuda::add_bias(nullptr, nullptr, 0, 64, nullptr);
    cuda_test::sync();
}

}  // namespace
}  // namespace peregrine
