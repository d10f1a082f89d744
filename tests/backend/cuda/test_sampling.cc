// GPU sampling (src/backend/cuda/sampling.cu) against the CPU Sampler's semantics: greedy,
// penalties, the top-k / top-p / min-p candidate set, the draw's distribution, seeded
// reproducibility independent of the batch, and raw logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/sampling_row.h"
#include "engine/sampler.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda::SamplingRow;
using cuda_test::DeviceBuffer;

struct Penalties {
    std::vector<int32_t> offsets, tokens, counts;  // empty offsets: none
};

struct Result {
    std::vector<int32_t> tokens;
    std::vector<float> logprob;
    std::vector<int32_t> top_ids;
    std::vector<float> top_logprobs;
    std::vector<float> logits;  // the row after the call (penalties applied in place)
};

Result run_sample(const std::vector<float>& logits, int vocab, const std::vector<SamplingRow>& rows,
                  const Penalties& pen = {}, bool logprobs = false) {
    const int n = static_cast<int>(rows.size());
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<SamplingRow> d_rows(rows);
    DeviceBuffer<int32_t> d_off(pen.offsets), d_tok(pen.tokens), d_cnt(pen.counts);
    cuda::PenaltyArgs pa;
    if (!pen.offsets.empty()) {
        pa.offsets = d_off.get();
        pa.tokens = d_tok.get();
        pa.counts = d_cnt.get();
    }
    DeviceBuffer<int32_t> d_out(n), d_top_ids(static_cast<size_t>(n) * cuda::kMaxSampleLogprobs);
    DeviceBuffer<float> d_lp(n), d_top_lp(static_cast<size_t>(n) * cuda::kMaxSampleLogprobs);
    d_out.fill_bytes(0xff);
    d_lp.fill_bytes(0xff);
    d_top_ids.fill_bytes(0xff);
    d_top_lp.fill_bytes(0xff);
    DeviceBuffer<unsigned char> ws(std::max<size_t>(1, cuda::sample_workspace_bytes(n, vocab)));
    cuda::sample(d_logits.get(), n, vocab, d_rows.get(), pa, d_out.get(), logprobs ? d_lp.get() : nullptr,
                 logprobs ? d_top_ids.get() : nullptr, logprobs ? d_top_lp.get() : nullptr, ws.get(), nullptr);
    Result r;
    r.tokens = d_out.download();
    if (logprobs) {
        r.logprob = d_lp.download();
        r.top_ids = d_top_ids.download();
        r.top_logprobs = d_top_lp.download();
    }
    r.logits = d_logits.download();
    return r;
}

int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

SamplingRow greedy_row() {
    SamplingRow r;
    r.temperature = 0.0f;
    return r;
}

// The CPU Sampler's candidate set and probabilities (src/engine/sampler.cc) for processed
// logits: min_p / e^-30 floor, top_k by (logit desc, id asc), top_p prefix of that order.
std::map<int, double> reference_probs(const float* l, int vocab, const SamplingRow& p) {
    std::map<int, double> out;
    if (p.temperature < 1e-5f || p.top_k == 1) {
        out[argmax(l, vocab)] = 1.0;
        return out;
    }
    const float mx = l[argmax(l, vocab)];
    const float floor_logit = p.min_p > 0.0f ? mx + p.temperature * std::log(p.min_p) : mx - 30.0f * p.temperature;
    std::vector<int> cand;
    for (int i = 0; i < vocab; ++i)
        if (l[i] >= floor_logit) cand.push_back(i);
    std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return l[a] > l[b]; });
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) cand.resize(p.top_k);
    const float inv_t = 1.0f / p.temperature;
    std::vector<double> w(cand.size());
    double total = 0;
    for (size_t i = 0; i < cand.size(); ++i) total += w[i] = std::exp((l[cand[i]] - mx) * inv_t);
    size_t keep = cand.size();
    if (p.top_p < 1.0f) {
        double mass = 0;
        size_t cut = 0;
        for (; cut < cand.size() && mass < p.top_p * total; ++cut) mass += w[cut];
        keep = std::max<size_t>(cut, 1);
        total = 0;
        for (size_t i = 0; i < keep; ++i) total += w[i];
    }
    for (size_t i = 0; i < keep; ++i) out[cand[i]] = w[i] / total;
    return out;
}

// Draws `draws` tokens from one logits row (rows differ only in their Philox offset) and checks
// the frequencies against reference_probs with a chi-square bound; no token outside the set.
void check_distribution(const std::vector<float>& row_logits, const SamplingRow& params, int draws) {
    const int vocab = static_cast<int>(row_logits.size());
    const std::map<int, double> probs = reference_probs(row_logits.data(), vocab, params);
    std::map<int, int> hist;
    const int batch = std::clamp((1 << 26) / vocab, 1, 4096);  // rows per launch: <= 256 MB of logits
    for (int done = 0; done < draws; done += batch) {
        const int n = std::min(batch, draws - done);
        std::vector<float> logits;
        logits.reserve(static_cast<size_t>(n) * vocab);
        std::vector<SamplingRow> rows(n, params);
        for (int i = 0; i < n; ++i) {
            logits.insert(logits.end(), row_logits.begin(), row_logits.end());
            rows[i].offset = static_cast<uint64_t>(done + i);
        }
        for (int32_t t : run_sample(logits, vocab, rows).tokens) ++hist[t];
    }
    double chi2 = 0;
    int df = -1;
    for (const auto& [tok, count] : hist) ASSERT_TRUE(probs.count(tok)) << "token " << tok << " is outside the set";
    for (const auto& [tok, pr] : probs) {
        const double expect = pr * draws;
        const auto it = hist.find(tok);
        const double got = it == hist.end() ? 0 : it->second;
        if (expect < 1) {
            EXPECT_LE(got, 10) << "token " << tok;
            continue;
        }
        chi2 += (got - expect) * (got - expect) / expect;
        ++df;
    }
    // Far beyond the 1e-6 tail for these degrees of freedom, yet a real bias fails it.
    const double bound = df + 6.0 * std::sqrt(2.0 * std::max(df, 1)) + 12.0;
    EXPECT_LT(chi2, bound) << "df " << df << " kept " << probs.size();
}

// ---- greedy ----------------------------------------------------------------------------------

TEST(CudaSampling, GreedyIsTheFirstArgmax) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(11);
    for (int vocab : {7, 1000, 32001, 151936}) {
        const int n = 37;
        std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(n) * vocab, rng, -10.0f, 10.0f);
        std::vector<SamplingRow> rows(n, greedy_row());
        for (int r = 0; r < n; ++r) {
            float* l = logits.data() + static_cast<size_t>(r) * vocab;
            if (r % 3 == 0) {  // a tie: the lower id wins
                const int a = static_cast<int>(rng() % vocab), b = static_cast<int>(rng() % vocab);
                l[a] = l[b] = 20.0f;
            }
            if (r % 5 == 1) rows[r].top_k = 1, rows[r].temperature = 1.0f;  // top_k 1 is greedy
            if (r % 7 == 2) rows[r].temperature = 5e-6f;                    // below 1e-5: greedy
        }
        const Result res = run_sample(logits, vocab, rows);
        for (int r = 0; r < n; ++r)
            EXPECT_EQ(res.tokens[r], argmax(logits.data() + static_cast<size_t>(r) * vocab, vocab))
                << "vocab " << vocab << " row " << r;
    }
}

// The greedy rule is one (backend/sampling_row.h): the GPU and the CPU Sampler agree on which
// rows draw. At temperature 0, 1e-6 and top_k 1 both take the first of two equal maxima for
// every seed; at 1e-5 both draw between them.
TEST(CudaSampling, GreedyRuleMatchesTheCpuSampler) {
    PG_SKIP_WITHOUT_CUDA();
    const int vocab = 1000, seeds = 64;
    std::mt19937 rng(5);
    std::vector<float> row = cuda_test::random_floats(vocab, rng, -10.0f, 4.0f);
    row[3] = row[7] = 5.0f;
    Sampler cpu({});
    for (auto [t, k] : {std::pair{0.0f, 0}, {1e-6f, 0}, {1.0f, 1}, {1e-5f, 0}}) {
        SCOPED_TRACE(::testing::Message() << "temperature " << t << ", top_k " << k);
        std::vector<SamplingRow> rows(seeds);
        std::vector<float> logits;
        for (int s = 0; s < seeds; ++s) {
            rows[s].temperature = t;
            rows[s].top_k = k;
            rows[s].seed = 1000 + s;
            logits.insert(logits.end(), row.begin(), row.end());
        }
        SampleRow host_row;
        host_row.temperature = t;
        host_row.top_k = k;
        ASSERT_EQ(host_row.greedy(), rows[0].greedy());
        const Result gpu = run_sample(logits, vocab, rows);
        std::set<int32_t> gpu_drawn, cpu_drawn;
        for (int s = 0; s < seeds; ++s) {
            std::mt19937_64 gen(1000 + s);
            host_row.rng = &gen;
            gpu_drawn.insert(gpu.tokens[s]);
            cpu_drawn.insert(cpu.sample(row.data(), vocab, host_row, nullptr));
        }
        const std::set<int32_t> want = is_greedy(t, k) ? std::set<int32_t>{3} : std::set<int32_t>{3, 7};
        EXPECT_EQ(gpu_drawn, want);
        EXPECT_EQ(cpu_drawn, want);
    }
}

// The greedy fast path picks what sample() picks for a greedy row: ties, NaN, -inf, odd vocab
// sizes (rows at every alignment), vocabularies smaller than its chunk count.
TEST(CudaSampling, GreedyArgmaxFastPathMatchesSample) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(21);
    for (int vocab : {3, 31, 1000, 32003, 128256}) {
        const int n = 19;
        std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(n) * vocab, rng, -10.0f, 10.0f);
        for (int r = 0; r < n; ++r) {
            float* l = logits.data() + static_cast<size_t>(r) * vocab;
            if (r % 3 == 0) {  // a tie far apart: the lower id wins
                l[0] = 30.0f;
                l[vocab - 1] = 30.0f;
            }
            if (r % 4 == 1) l[static_cast<int>(rng() % vocab)] = std::nanf("");
            if (r % 5 == 2) std::fill(l, l + vocab, -INFINITY), l[vocab / 2] = -1.0f;
            if (r == 7) std::fill(l, l + vocab, -INFINITY);  // all -inf: the lowest id, as sample()
        }
        const Result ref = run_sample(logits, vocab, std::vector<SamplingRow>(n, greedy_row()));
        DeviceBuffer<float> d_logits(logits);
        DeviceBuffer<int32_t> d_out(n);
        d_out.fill_bytes(0xff);
        DeviceBuffer<unsigned char> ws(std::max<size_t>(1, cuda::sample_workspace_bytes(n, vocab)));
        int32_t* host = nullptr;  // pinned: the kernel writes the tokens there too
        ASSERT_EQ(cudaMallocHost(&host, n * sizeof(int32_t)), cudaSuccess);
        std::fill(host, host + n, -7);
        int32_t* host_dev = nullptr;
        ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_dev), host, 0), cudaSuccess);
        cuda::greedy_argmax(d_logits.get(), n, vocab, d_out.get(), host_dev, ws.get(), nullptr);
        const std::vector<int32_t> got = d_out.download();
        for (int r = 0; r < n; ++r) {
            EXPECT_EQ(got[r], ref.tokens[r]) << "vocab " << vocab << " row " << r;
            EXPECT_EQ(host[r], ref.tokens[r]) << "vocab " << vocab << " row " << r << " (host copy)";
        }
        cudaFreeHost(host);
    }
}

TEST(CudaSampling, NegativeInfinityAndNanAreNeverChosen) {
    PG_SKIP_WITHOUT_CUDA();
    const int vocab = 100;
    std::vector<float> row(vocab, -INFINITY);
    row[17] = -3.0f;
    row[50] = std::nanf("");
    row[60] = -3.5f;
    std::vector<SamplingRow> rows(64);
    for (int i = 0; i < 64; ++i) {
        rows[i].temperature = 1.0f;
        rows[i].offset = i;
        rows[i].top_p = i % 2 ? 0.999f : 1.0f;
    }
    rows[0] = greedy_row();
    std::vector<float> logits;
    for (int i = 0; i < 64; ++i) logits.insert(logits.end(), row.begin(), row.end());
    const Result res = run_sample(logits, vocab, rows);
    EXPECT_EQ(res.tokens[0], 17);
    for (int i = 1; i < 64; ++i) EXPECT_TRUE(res.tokens[i] == 17 || res.tokens[i] == 60) << res.tokens[i];
}

// ---- reproducibility ---------------------------------------------------------------------------

TEST(CudaSampling, SeededRowIgnoresTheBatchAroundIt) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(12);
    const int vocab = 32003;  // odd: rows start at different alignments
    const std::vector<float> mine = cuda_test::random_floats(vocab, rng, -5.0f, 5.0f);
    std::vector<SamplingRow> variants(4);
    variants[0].temperature = 0.8f;                            // whole vocabulary
    variants[1].temperature = 1.0f, variants[1].top_k = 50;    // top-k
    variants[2].temperature = 1.2f, variants[2].top_p = 0.9f;  // top-p
    variants[3].temperature = 0.7f, variants[3].top_k = 40, variants[3].min_p = 0.05f, variants[3].top_p = 0.95f;
    for (size_t v = 0; v < variants.size(); ++v) {
        SamplingRow p = variants[v];
        p.seed = 0xfeedull + v;
        std::set<int> distinct;
        for (uint64_t offset = 0; offset < 24; ++offset) {
            p.offset = offset;
            // Batch A: the row alone. Batch B: at position 5 of 9 among random rows of other params.
            const int a = run_sample(mine, vocab, {p}).tokens[0];
            std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(9) * vocab, rng, -5.0f, 5.0f);
            std::copy(mine.begin(), mine.end(), logits.begin() + 5 * vocab);
            std::vector<SamplingRow> rows(9);
            for (int i = 0; i < 9; ++i) {
                rows[i].temperature = 1.0f;
                rows[i].top_k = i * 10;
                rows[i].seed = rng();
                rows[i].offset = offset;
            }
            rows[5] = p;
            const Result b = run_sample(logits, vocab, rows);
            EXPECT_EQ(a, b.tokens[5]) << "variant " << v << " offset " << offset;
            EXPECT_EQ(a, run_sample(mine, vocab, {p}).tokens[0]) << "repeat";
            distinct.insert(a);
        }
        EXPECT_GE(distinct.size(), 3u) << "variant " << v << ": offsets should give different draws";
    }
}

// ---- distributions -------------------------------------------------------------------------------

std::vector<float> small_logits() {
    std::mt19937 rng(13);
    std::normal_distribution<float> d(0.0f, 1.5f);
    std::vector<float> l(40);
    for (float& x : l) x = d(rng);
    l[7] = l[3];  // an exact tie (top-k/top-p keep the lower id first)
    return l;
}

TEST(CudaSampling, TemperatureDistribution) {
    PG_SKIP_WITHOUT_CUDA();
    for (float t : {1.0f, 0.6f, 1.7f}) {
        SamplingRow p;
        p.temperature = t;
        p.seed = 99;
        SCOPED_TRACE(testing::Message() << "temperature " << t);
        check_distribution(small_logits(), p, 20480);
    }
}

TEST(CudaSampling, TopKTopPMinPDistribution) {
    PG_SKIP_WITHOUT_CUDA();
    struct Case {
        int top_k;
        float top_p, min_p, temperature;
    };
    for (const Case& c : {Case{5, 1.0f, 0.0f, 1.0f}, Case{12, 1.0f, 0.0f, 0.8f}, Case{0, 0.8f, 0.0f, 1.0f},
                          Case{0, 0.5f, 0.0f, 1.3f}, Case{0, 1.0f, 0.1f, 1.0f}, Case{0, 1.0f, 0.3f, 0.7f},
                          Case{8, 0.9f, 0.05f, 1.0f}, Case{20, 0.7f, 0.0f, 1.1f}, Case{0, 0.05f, 0.0f, 1.0f}}) {
        SamplingRow p;
        p.top_k = c.top_k;
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.temperature = c.temperature;
        p.seed = 7;
        SCOPED_TRACE(testing::Message() << "top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p << " T "
                                        << c.temperature);
        check_distribution(small_logits(), p, 20480);
    }
}

// A large vocabulary whose candidates are few (the usual shape): the histogram + collect path.
TEST(CudaSampling, LargeVocabularyDistribution) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(14);
    std::vector<float> l = cuda_test::random_floats(151936, rng, -20.0f, -8.0f);  // ~2% of the mass
    std::normal_distribution<float> d(4.0f, 1.0f);
    for (int i = 0; i < 30; ++i) l[rng() % l.size()] = d(rng);
    for (const auto& [k, pp] : {std::pair{10, 1.0f}, {0, 0.85f}, {25, 0.9f}}) {
        SamplingRow p;
        p.temperature = 1.0f;
        p.top_k = k;
        p.top_p = pp;
        p.seed = 5;
        SCOPED_TRACE(testing::Message() << "top_k " << k << " top_p " << pp);
        check_distribution(l, p, 8192);
    }
}

// Boundaries that do not fit in shared memory: a flat row with top_k 9000 (the boundary bin
// is resolved alone) and rows of exact ties (one bin: the radix-select fallback). Ties keep
// the lowest ids, as on the CPU.
TEST(CudaSampling, LargeCandidateSetsAndTies) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(15);
    const int vocab = 50000;
    {
        const std::vector<float> flat = cuda_test::random_floats(vocab, rng, 0.0f, 0.5f);
        SamplingRow p;
        p.temperature = 1.0f;
        p.top_k = 9000;
        const std::map<int, double> probs = reference_probs(flat.data(), vocab, p);
        ASSERT_EQ(probs.size(), 9000u);
        std::vector<float> logits;
        std::vector<SamplingRow> rows(256, p);
        for (int i = 0; i < 256; ++i) {
            logits.insert(logits.end(), flat.begin(), flat.end());
            rows[i].offset = i;
        }
        for (int32_t t : run_sample(logits, vocab, rows).tokens) EXPECT_TRUE(probs.count(t)) << t;
        rows.assign(256, p);
        for (int i = 0; i < 256; ++i) rows[i].top_k = 0, rows[i].top_p = 0.3f, rows[i].offset = i;
        const std::map<int, double> probs_p = reference_probs(flat.data(), vocab, rows[0]);
        for (int32_t t : run_sample(logits, vocab, rows).tokens) EXPECT_TRUE(probs_p.count(t)) << t;
    }
    {
        const std::vector<float> ties(vocab, 0.25f);
        std::vector<float> logits;
        std::vector<SamplingRow> rows(256);
        for (int i = 0; i < 256; ++i) {
            logits.insert(logits.end(), ties.begin(), ties.end());
            rows[i].temperature = 1.0f;
            rows[i].offset = i;
            if (i % 2 == 0)
                rows[i].top_k = 10000;  // ids [0, 10000)
            else
                rows[i].top_p = 0.25f;  // the first 12500 ids hold a quarter of the mass
        }
        const Result res = run_sample(logits, vocab, rows);
        double mean_k = 0, mean_p = 0;
        for (int i = 0; i < 256; ++i) {
            const int t = res.tokens[i];
            if (i % 2 == 0) {
                EXPECT_LT(t, 10000) << "row " << i;
                mean_k += t / 128.0;
            } else {
                EXPECT_LT(t, 12500) << "row " << i;
                mean_p += t / 128.0;
            }
            EXPECT_GE(t, 0);
        }
        // Uniform over the kept ids: means near 5000 and 6250 (sd of a mean of 128 ~ 260 / 320).
        EXPECT_NEAR(mean_k, 5000, 1500);
        EXPECT_NEAR(mean_p, 6250, 1800);
    }
}

// ---- penalties ----------------------------------------------------------------------------------

TEST(CudaSampling, PenaltiesFollowTheCpuFormula) {
    PG_SKIP_WITHOUT_CUDA();
    // As tests/unit/test_sampler.cc: output tokens 1, 1 and prompt token 5.
    const std::vector<float> base = {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, 2.9f, 0.0f, -2.0f};
    const int vocab = 8;
    std::vector<SamplingRow> rows(5, greedy_row());
    rows[0].frequency_penalty = 0.06f;  // 3.0 - 0.12 = 2.88 < 2.9: token 5
    rows[1].presence_penalty = 0.05f;   // 2.95 > 2.9: token 1
    rows[2].repetition_penalty = 2.0f;  // 1 -> 1.5, 5 -> 1.45: token 2
    rows[3].repetition_penalty = 2.0f;  // negative logit multiplied: 7 -> -4.0, and 3.0 -> 1.5
    rows[3].presence_penalty = 0.5f, rows[3].frequency_penalty = 0.25f;
    rows[4] = greedy_row();  // same logits, no penalty entries: token 1
    Penalties pen;
    pen.offsets = {0, 2, 4, 6, 9, 9};
    pen.tokens = {1, 5, 1, 5, 1, 5, 1, 5, 7};
    pen.counts = {2, 0, 2, 0, 2, 0, 2, 0, 3};
    std::vector<float> logits;
    for (int r = 0; r < 5; ++r) logits.insert(logits.end(), base.begin(), base.end());
    const Result res = run_sample(logits, vocab, rows, pen);
    EXPECT_EQ(res.tokens[0], 5);
    EXPECT_EQ(res.tokens[1], 1);
    EXPECT_EQ(res.tokens[2], 2);
    EXPECT_EQ(res.tokens[4], 1);
    // The processed row, value for value (the CPU Sampler's formula in f32).
    for (int r = 0; r < 5; ++r) {
        std::vector<float> w = base;
        const SamplingRow& p = rows[r];
        for (int j = pen.offsets[r]; j < pen.offsets[r + 1]; ++j) {
            float& x = w[pen.tokens[j]];
            if (p.repetition_penalty != 1.0f) x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
            if (pen.counts[j] > 0) x -= p.frequency_penalty * static_cast<float>(pen.counts[j]) + p.presence_penalty;
        }
        for (int i = 0; i < vocab; ++i) EXPECT_EQ(res.logits[r * vocab + i], w[i]) << "row " << r << " token " << i;
        EXPECT_EQ(res.tokens[r], argmax(w.data(), vocab)) << "row " << r;
    }
}

// ---- logprobs -------------------------------------------------------------------------------------

TEST(CudaSampling, LogprobsAreTheRawLogSoftmax) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(16);
    const int vocab = 32000, n = 12;
    std::vector<float> logits = cuda_test::random_floats(static_cast<size_t>(n) * vocab, rng, -8.0f, 8.0f);
    std::vector<SamplingRow> rows(n);
    Penalties pen;
    pen.offsets.push_back(0);
    for (int r = 0; r < n; ++r) {
        SamplingRow& p = rows[r];
        p.num_logprobs = r % 4 == 3 ? -1 : (r % 4) * 10;  // 0, 10, 20, none
        p.temperature = r < 6 ? 0.0f : 0.9f;
        p.top_k = r >= 6 ? 30 : 0;
        p.seed = r;
        if (r == 4 || r == 10) {  // penalties do not change the reported logprobs
            p.repetition_penalty = 1.3f;
            p.presence_penalty = 0.2f;
            for (int t = 0; t < 500; ++t) pen.tokens.push_back(t * 37), pen.counts.push_back(t % 3);
        }
        if (r == 5) {  // a low-ranked token pushed to the top: its raw logprob is reconstructed
            p.presence_penalty = -100.0f;
            pen.tokens.push_back(1234), pen.counts.push_back(1);
        }
        pen.offsets.push_back(static_cast<int32_t>(pen.tokens.size()));
    }
    const Result res = run_sample(logits, vocab, rows, pen, true);
    EXPECT_EQ(res.tokens[5], 1234);
    for (int r = 0; r < n; ++r) {
        const float* l = logits.data() + static_cast<size_t>(r) * vocab;
        const float mx = *std::max_element(l, l + vocab);
        double z = 0;
        for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(l[i] - mx));
        const double log_z = mx + std::log(z);
        const int num = rows[r].num_logprobs;
        if (num < 0) continue;
        const int tok = res.tokens[r];
        ASSERT_GE(tok, 0);
        EXPECT_NEAR(res.logprob[r], l[tok] - log_z, 1e-4) << "row " << r;
        std::vector<int> order(vocab);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 20, order.end(),
                          [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        for (int j = 0; j < cuda::kMaxSampleLogprobs; ++j) {
            const size_t at = static_cast<size_t>(r) * cuda::kMaxSampleLogprobs + j;
            if (j < num) {
                EXPECT_EQ(res.top_ids[at], order[j]) << "row " << r << " rank " << j;
                EXPECT_NEAR(res.top_logprobs[at], l[order[j]] - log_z, 1e-4) << "row " << r << " rank " << j;
            } else {
                EXPECT_EQ(res.top_ids[at], -1);
            }
        }
    }
}

// ---- a realistic batch ------------------------------------------------------------------------------

// 512 rows of a 152k vocabulary with mixed parameters: every token lies in its row's set, and
// the greedy rows are the argmax. Prints the kernel time (informational).
TEST(CudaSampling, FullBatchOfMixedRows) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(17);
    const int vocab = 151936, n = 512;
    std::normal_distribution<float> d(0.0f, 2.5f);
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    for (float& x : logits) x = d(rng);
    std::vector<SamplingRow> rows(n);
    for (int r = 0; r < n; ++r) {
        SamplingRow& p = rows[r];
        p.seed = 1000 + r;
        p.offset = r % 17;
        switch (r % 6) {
            case 0:
                p.temperature = 0.0f;
                break;
            case 1:
                p.temperature = 1.0f;
                break;
            case 2:
                p.temperature = 0.8f, p.top_k = 50;
                break;
            case 3:
                p.temperature = 1.0f, p.top_p = 0.9f;
                break;
            case 4:
                p.temperature = 0.7f, p.top_k = 100, p.top_p = 0.95f, p.min_p = 0.02f;
                break;
            case 5:
                p.temperature = 1.0f, p.min_p = 0.1f;
                break;
        }
    }
    const Result res = run_sample(logits, vocab, rows);
    for (int r = 0; r < n; ++r) {
        const float* l = logits.data() + static_cast<size_t>(r) * vocab;
        if (r >= 192 && rows[r].temperature != 0.0f) continue;  // the host reference is slow: a sample of rows
        if (rows[r].temperature == 0.0f) {
            EXPECT_EQ(res.tokens[r], argmax(l, vocab)) << "row " << r;
        } else if (rows[r].top_k > 0 || rows[r].top_p < 1.0f || rows[r].min_p > 0.0f) {
            const std::map<int, double> probs = reference_probs(l, vocab, rows[r]);
            EXPECT_TRUE(probs.count(res.tokens[r])) << "row " << r << " token " << res.tokens[r];
        } else {
            EXPECT_GE(res.tokens[r], 0);
            EXPECT_LT(res.tokens[r], vocab);
        }
    }

    // Timing: the same batch, logits restored before each call.
    DeviceBuffer<float> d_src(logits), d_logits(logits.size());
    DeviceBuffer<SamplingRow> d_rows(rows);
    DeviceBuffer<int32_t> d_out(n);
    cudaEvent_t start, stop;
    PG_CUDA_CHECK(cudaEventCreate(&start));
    PG_CUDA_CHECK(cudaEventCreate(&stop));
    float total_ms = 0;
    const int reps = 5;
    for (int i = 0; i < reps; ++i) {
        PG_CUDA_CHECK(cudaMemcpy(d_logits.get(), d_src.get(), logits.size() * 4, cudaMemcpyDeviceToDevice));
        PG_CUDA_CHECK(cudaEventRecord(start));
        cuda::sample(d_logits.get(), n, vocab, d_rows.get(), {}, d_out.get(), nullptr, nullptr, nullptr, nullptr,
                     nullptr);
        PG_CUDA_CHECK(cudaEventRecord(stop));
        PG_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        PG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (i > 0) total_ms += ms;
    }
    std::printf("[ timing   ] sample: %d rows x %d vocab (mixed params): %.3f ms\n", n, vocab, total_ms / (reps - 1));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
}

// Structured output's mask kernel (token_mask.cu) against the rule on the host, on random
// masks (dense, sparse, all-allowed words, a mask shorter than the vocabulary) over rows that
// are not in draw order; rows without a mask are untouched. Timed at the 1B's shape.
TEST(CudaSampling, TokenMasksMatchTheHostRule) {
    PG_SKIP_WITHOUT_CUDA();
    std::mt19937 rng(5);
    const int vocab = 128256, rows = 300, m = 256;
    const int words = (vocab + 31) / 32;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> d(0.0f, 2.0f);
    for (float& x : logits) x = d(rng);
    std::vector<uint32_t> masks(static_cast<size_t>(m) * words);
    std::vector<int32_t> which(m);
    for (int i = 0; i < m; ++i) {
        which[i] = (i * 7 + 3) % rows;  // distinct rows, out of order
        for (int w = 0; w < words; ++w) {
            uint32_t& x = masks[static_cast<size_t>(i) * words + w];
            switch (i % 4) {
                case 0:
                    x = static_cast<uint32_t>(rng());
                    break;  // dense
                case 1:
                    x = rng() % 64 == 0 ? 1u << (rng() % 32) : 0u;
                    break;  // sparse
                case 2:
                    x = rng() % 2 ? 0xffffffffu : static_cast<uint32_t>(rng());
                    break;
                case 3:
                    x = w < words - 100 ? static_cast<uint32_t>(rng()) : 0u;
                    break;
            }
        }
    }
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<uint32_t> d_masks(masks);
    DeviceBuffer<int32_t> d_which(which);
    cuda::apply_token_masks(d_logits.get(), vocab, d_masks.get(), d_which.get(), m, words, nullptr);
    const std::vector<float> got = d_logits.download();
    std::vector<int> mask_of(rows, -1);
    for (int i = 0; i < m; ++i) mask_of[which[i]] = i;
    size_t wrong = 0;
    for (int r = 0; r < rows; ++r)
        for (int t = 0; t < vocab; ++t) {
            const size_t at = static_cast<size_t>(r) * vocab + t;
            bool allowed = true;
            if (mask_of[r] >= 0) allowed = (masks[static_cast<size_t>(mask_of[r]) * words + t / 32] >> (t % 32)) & 1u;
            const float want = allowed ? logits[at] : -INFINITY;
            wrong += !(got[at] == want);
        }
    EXPECT_EQ(wrong, 0u);

    cudaEvent_t start, stop;
    PG_CUDA_CHECK(cudaEventCreate(&start));
    PG_CUDA_CHECK(cudaEventCreate(&stop));
    PG_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < 10; ++i)
        cuda::apply_token_masks(d_logits.get(), vocab, d_masks.get(), d_which.get(), m, words, nullptr);
    PG_CUDA_CHECK(cudaEventRecord(stop));
    PG_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("[ timing   ] apply_token_masks: %d rows x %d vocab: %.1f us\n", m, vocab, 100.0f * ms);
}

}  // namespace
}  // namespace peregrine
