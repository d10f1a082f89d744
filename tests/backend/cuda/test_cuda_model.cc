// The whole model on the GPU against the golden fixtures (transformers for the HF models,
// llama.cpp for quant-tiny), and the engine on the GPU: a crowd of greedy requests gives the
// tokens each gives alone (batch-invariant mode), with and without CUDA graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sampler.h"
#include "engine/engine_core.h"
#include "engine/structured_output.h"
#include "support/engine_runs.h"
#include "support/golden_util.h"
#include "tokenizer/tokenizer.h"
#include "worker/executor.h"
#include "worker/local_executor.h"

namespace peregrine::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device"

// The golden TestModel on a CudaBackend.
struct GpuModel : TestModel {
    explicit GpuModel(const std::string& path, bool graphs = true, bool batch_invariant = false)
        : TestModel(path, make_backend(graphs, batch_invariant)) {}
    static std::unique_ptr<Backend> make_backend(bool graphs, bool batch_invariant) {
        CudaOptions o;
        o.graphs = graphs;
        o.batch_invariant = batch_invariant;
        return std::make_unique<CudaBackend>(o);
    }
    CudaBackend& cuda() { return static_cast<CudaBackend&>(*backend); }
};

struct Case {
    const char* name;
    std::string model;
    std::string logits;  // golden logits file
    std::string golden;  // golden.json (prompt_ids, greedy_ids)
    double max_kl;
    double max_flip_gap = 0.02;  // bf16 activations flip only near-ties
};

std::vector<Case> cases() {
    const std::string m = models_dir(), d = data_dir();
    std::vector<Case> out = {
        {"stories260K_hf", m + "/stories260K", m + "/stories260K/logits.f32", m + "/stories260K/golden.json", 1e-3},
        {"stories260K_gguf", d + "/stories260K.gguf", m + "/stories260K/logits.f32", m + "/stories260K/golden.json",
         1e-3},
        {"llama3_tiny", d + "/llama3-tiny", d + "/llama3-tiny/logits.f32", d + "/llama3-tiny/golden.json", 1e-3},
        {"qwen2_tiny", d + "/qwen2-tiny", d + "/qwen2-tiny/logits.f32", d + "/qwen2-tiny/golden.json", 1e-3},
        {"qwen3_tiny", d + "/qwen3-tiny", d + "/qwen3-tiny/logits.f32", d + "/qwen3-tiny/golden.json", 1e-3},
        // Trained (wider logits): its bf16 path flips 2 of 256 at gaps <= 0.022 (H200, 2026-11-28).
        {"text_trained", d + "/text-trained", d + "/text-trained/logits.f32", d + "/text-trained/golden.json", 1e-3,
         0.05},
    };
    // The GGUF types stay quantized on the GPU (core/gpu_quant.h layouts): against llama.cpp's
    // logits of the same file, within issue #23's bounds (q4_0's golden was made again without
    // llama.cpp's faulty AMX path, so it is held to its own file like the others).
    const std::pair<const char*, double> quant[] = {
        {"bf16", 1e-3}, {"q8_0", 1e-4}, {"q6_k", 5e-4}, {"q4_k", 2e-3}, {"q4_0", 5e-2}};
    for (const auto& [t, kl] : quant) {
        const std::string base = d + "/quant-tiny/qt-" + t;
        out.push_back({t, base + ".gguf", base + ".logits.f32", base + ".golden.json", kl});
    }
    return out;
}

// The largest gap, in the reference's own logits, between the reference's argmax and ours at a
// position where the two differ: bf16 activations may flip near-ties, never clear winners.
double worst_flip_gap(const std::vector<float>& ref, const std::vector<float>& ours, int vocab) {
    double worst = 0;
    for (size_t r = 0; r < ref.size() / vocab; ++r) {
        const float* a = ref.data() + r * vocab;
        const float* b = ours.data() + r * vocab;
        const int am = static_cast<int>(std::max_element(a, a + vocab) - a);
        const int bm = static_cast<int>(std::max_element(b, b + vocab) - b);
        if (am != bm) worst = std::max(worst, static_cast<double>(a[am] - a[bm]));
    }
    return worst;
}

// Every fixture: mean KL within bound, flips only on near-ties, and argmax agreement >= 99% over
// the positions of all fixtures together.
TEST(GpuGolden, FixturesWithinBf16Tolerance) {
    SKIP_WITHOUT_GPU();
    size_t positions = 0, mismatches = 0;
    for (const Case& c : cases()) {
        SCOPED_TRACE(c.name);
        GpuModel g(c.model);
        const auto golden = read_json_file(c.golden);
        const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
        const std::vector<float> ref = read_f32_file(c.logits);
        // Whole prompt at once, chunked prefill over cached blocks, and (GGUF files) one token a
        // step: the decode products that read the quantized layouts in registers.
        const bool gguf = c.model.ends_with(".gguf");
        for (int chunk : {0, 7, 1}) {
            if (chunk == 1 && !gguf) continue;
            const std::vector<float> ours = g.all_logits(prompt, chunk);
            ASSERT_EQ(ref.size(), ours.size());
            const LogitStats s = compare_logits(ref, ours, g.vocab());
            const double gap = worst_flip_gap(ref, ours, g.vocab());
            std::printf(
                "gpu %-16s chunk %d: mean KL %.3g, argmax agreement %.4f (%zu of %zu differ, reference gap "
                "<= %.3g), max |dlogit| %.3g\n",
                c.name, chunk, s.mean_kl, s.argmax_agree, s.argmax_mismatches, ref.size() / g.vocab(), gap,
                s.max_abs_diff);
            EXPECT_LE(s.mean_kl, c.max_kl);
            EXPECT_LE(gap, c.max_flip_gap) << "an argmax flipped where the reference's top two are far apart";
            if (chunk == 0) {
                positions += ref.size() / g.vocab();
                mismatches += s.argmax_mismatches;
            }
        }
    }
    const double agree = 1.0 - static_cast<double>(mismatches) / positions;
    std::printf("gpu golden: argmax agreement %.4f over %zu positions of all fixtures (%zu differ)\n", agree, positions,
                mismatches);
    EXPECT_GE(agree, 0.99);
}

// The quant-tiny GGUF types the GPU keeps quantized, a fixture's path without its extension, and
// its golden prompt.
constexpr const char* kKeptGgufTypes[] = {"q8_0", "q6_k", "q4_k", "q4_0"};
std::string quant_tiny(const char* type) {
    return data_dir() + "/quant-tiny/qt-" + type;
}
std::vector<int32_t> golden_prompt(const std::string& base) {
    return read_json_file(base + ".golden.json")["prompt_ids"].get<std::vector<int32_t>>();
}
// Two GGUF paths' logits that differ only in summation order: printed, then no argmax change and
// every logit within 1e-2.
void expect_same_gguf_logits(const std::vector<float>& want, const std::vector<float>& got, int64_t vocab,
                             const std::string& what) {
    SCOPED_TRACE(what);
    const LogitStats s = compare_logits(want, got, vocab);
    std::printf("gguf %s: mean KL %.3g, max |dlogit| %.3g\n", what.c_str(), s.mean_kl, s.max_abs_diff);
    EXPECT_EQ(s.argmax_mismatches, 0u);
    EXPECT_LE(s.max_abs_diff, 1e-2);
}

// A dequantize buffer smaller than the largest GGUF matrix: dequantized products run in row chunks
// (each filling its column band of the output); the logits of every quant-tiny prompt stay those
// of the whole-matrix products (same values a pass, cuBLASLt may sum in another order).
TEST(GpuGolden, GgufProductsInRowChunks) {
    SKIP_WITHOUT_GPU();
    for (const char* t : kKeptGgufTypes) {
        SCOPED_TRACE(t);
        const std::string base = quant_tiny(t);
        const std::vector<int32_t> prompt = golden_prompt(base);
        GpuModel whole(base + ".gguf");
        CudaOptions o;
        o.gguf_scratch_elements = 200 * 256;
        o.gguf_gemm_max_rows = 0;  // every product past the decode kernels dequantizes
        TestModel chunked(base + ".gguf", std::make_unique<CudaBackend>(o));
        const int64_t k = chunked.loaded->config.hidden_size;
        const int64_t head = static_cast<int64_t>(chunked.vocab()) * k;
        ASSERT_LT(static_cast<CudaBackend&>(*chunked.backend).gguf_scratch_elements(), head)
            << "the buffer holds the head: nothing would be chunked";
        expect_same_gguf_logits(whole.all_logits(prompt), chunked.all_logits(prompt), whole.vocab(),
                                std::string(t) + " in row chunks");
    }
}

// Prompts past 64 tokens with gguf_gemm taking every product (token tiles of 64;
// CudaOptions::gguf_gemm_max_rows) give the logits of the default path past 64 rows (the matrix
// dequantized to bf16, then cuBLASLt): the same values rounded the same way, summed in another
// order. The golden prompt three times (192 tokens) in one step, and in chunks of 100.
TEST(GpuGolden, GgufTokenTilesMatchDequantized) {
    SKIP_WITHOUT_GPU();
    for (const char* t : kKeptGgufTypes) {
        SCOPED_TRACE(t);
        const std::string base = quant_tiny(t);
        const std::vector<int32_t> once = golden_prompt(base);
        std::vector<int32_t> prompt;
        for (int r = 0; r < 3; ++r) prompt.insert(prompt.end(), once.begin(), once.end());
        CudaOptions o;
        o.gguf_gemm_max_rows = 0;
        TestModel dequantized(base + ".gguf", std::make_unique<CudaBackend>(o));
        const std::vector<float> want = dequantized.all_logits(prompt);
        o.gguf_gemm_max_rows = 1 << 20;
        TestModel tiled(base + ".gguf", std::make_unique<CudaBackend>(o));
        for (int chunk : {0, 100})
            expect_same_gguf_logits(want, tiled.all_logits(prompt, chunk), tiled.vocab(),
                                    std::string(t) + " token tiles (chunk " + std::to_string(chunk) + ")");
    }
}

TEST(GpuModel, StoriesGreedyMatchesTransformers) {
    SKIP_WITHOUT_GPU();
    for (bool graphs : {true, false}) {
        GpuModel g(models_dir() + "/stories260K", graphs);
        const auto golden = read_json_file(models_dir() + "/stories260K/golden.json");
        const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
        const auto want = golden["greedy_ids"].get<std::vector<int>>();
        EXPECT_EQ(g.greedy(prompt, static_cast<int>(want.size())), want) << (graphs ? "graphs" : "eager");
    }
}

// Issue #7's criterion, in batch-invariant mode (asserted); the default kernels' count is printed
// for comparison (their products and attention depend on the batch shape).
TEST(GpuEngine, CrowdOf64MatchesAlone) {
    SKIP_WITHOUT_GPU();
    for (bool invariant : {true, false})
        for (bool graphs : {true, false}) {
            GpuModel g(models_dir() + "/stories260K", graphs, invariant);
            const std::vector<Request> reqs = random_greedy_requests(64, 99);
            const TokensById solo = run_alone(g, reqs);
            int differ = 0;
            for (int budget : {2048, 32}) {
                const auto got = run_crowd(g, reqs, budget, 512, 5);
                for (const Request& r : reqs) {
                    differ += got.at(r.id) != solo.at(r.id);
                    if (invariant) {
                        EXPECT_EQ(got.at(r.id), solo.at(r.id))
                            << r.id << " budget " << budget << (graphs ? " graphs" : "");
                    }
                }
            }
            std::printf("gpu crowd (%s, %s): %d of 128 request runs differ from alone; %d graphs recorded\n",
                        invariant ? "batch-invariant" : "default kernels", graphs ? "graphs" : "eager", differ,
                        g.cuda().num_graphs());
        }
}

// Async scheduling on the GPU: each step is queued before the previous one's draws come back,
// its sequences taking them from the sampler's device buffer (graphs and eager). Same tokens
// as waiting for every step, greedy and seeded sampling alike (batch-invariant kernels: the
// two runs may group sequences into different batches).
TEST(GpuEngine, AsyncSchedulingMatchesWaiting) {
    SKIP_WITHOUT_GPU();
    for (bool graphs : {true, false}) {
        GpuModel g(models_dir() + "/stories260K", graphs, true);
        CudaSampler sampler(g.cuda(), 64, g.vocab());
        std::vector<Request> reqs = random_greedy_requests(48, 7);
        for (size_t i = 0; i < reqs.size(); i += 3) {
            reqs[i].sampling.temperature = 0.8f;
            reqs[i].sampling.top_p = 0.9f;
            reqs[i].sampling.seed = 1000 + i;
        }
        for (size_t i = 1; i < reqs.size(); i += 4) reqs[i].sampling.ignore_eos = false;
        TokensById got[2];
        for (int async : {0, 1}) {
            auto ex_exec = LocalExecutor::over(*g.backend, *g.model, 512, 16, &sampler);
            LocalExecutor& ex = *ex_exec;
            CoreConfig cfg;
            cfg.async_scheduling = async;
            cfg.scheduler.max_num_seqs = 64;
            cfg.scheduler.max_num_batched_tokens = 256;
            cfg.eos_token_ids = g.loaded->config.eos_token_ids;
            EngineCore core(cfg, ex);
            std::mt19937 rng(3);
            size_t next = 0;
            while (next < reqs.size() || core.has_unfinished()) {
                for (int k = rng() % 4; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
                for (const RequestOutput& o : core.step())
                    got[async][o.request_id].insert(got[async][o.request_id].end(), o.token_ids.begin(),
                                                    o.token_ids.end());
            }
            EXPECT_EQ(core.block_manager().num_used(), 0);
        }
        for (const Request& r : reqs) EXPECT_EQ(got[1].at(r.id), got[0].at(r.id)) << r.id << (graphs ? " graphs" : "");
    }
}

// The KV host tier on the GPU (issue #21): a device pool of 24 blocks, far less than 8 shared
// prefixes of 3-5 blocks, sends the prefixes through pinned host memory and back; with the
// copies overlapped (a cache tensor's copies waited for where its layer first touches it) and
// async scheduling on, greedy tokens equal a 512-block pool's, graphs and eager, and host hits
// happen. Batch-invariant kernels: the two runs batch differently.
TEST(GpuEngine, HostTierMatchesALargePool) {
    SKIP_WITHOUT_GPU();
    for (bool graphs : {true, false}) {
        GpuModel g(models_dir() + "/stories260K", graphs, true);
        CudaSampler sampler(g.cuda(), 64, g.vocab());
        std::mt19937 rng(21);
        std::vector<std::vector<int32_t>> prefixes(8);
        for (auto& p : prefixes) {
            p.push_back(1);
            for (int j = 1 + static_cast<int>(rng() % 32); j < 80; ++j)
                p.push_back(3 + static_cast<int32_t>(rng() % 500));
        }
        std::vector<Request> reqs;
        for (int i = 0; i < 48; ++i) {
            Request r;
            r.id = "t" + std::to_string(i);
            r.prompt_ids = prefixes[(i * 5) % 8];
            for (int j = 0; j < 1 + i % 7; ++j) r.prompt_ids.push_back(3 + static_cast<int32_t>(rng() % 500));
            r.sampling.temperature = 0.0f;
            r.sampling.max_tokens = 8 + i % 9;
            r.sampling.ignore_eos = true;
            reqs.push_back(r);
        }
        TokensById got[2];
        EngineStats tier_stats;
        for (int tier : {0, 1}) {
            auto ex = LocalExecutor::over(*g.backend, *g.model, tier ? 24 : 512, 16, &sampler, tier ? 4 << 20 : 0);
            CoreConfig cfg;
            cfg.async_scheduling = true;
            cfg.scheduler.max_num_seqs = 4;
            cfg.scheduler.max_num_batched_tokens = 256;
            cfg.eos_token_ids = g.loaded->config.eos_token_ids;
            EngineCore core(cfg, *ex);
            size_t next = 0;
            while (next < reqs.size() || core.has_unfinished()) {
                for (int k = 0; k < 2 && next < reqs.size(); ++k) core.add_request(reqs[next++]);
                for (const RequestOutput& o : core.step())
                    got[tier][o.request_id].insert(got[tier][o.request_id].end(), o.token_ids.begin(),
                                                   o.token_ids.end());
            }
            if (tier) tier_stats = core.stats();
        }
        for (const Request& r : reqs) EXPECT_EQ(got[1].at(r.id), got[0].at(r.id)) << r.id << (graphs ? " graphs" : "");
        EXPECT_GT(tier_stats.kv_onloaded_blocks, 0u);
        EXPECT_GT(tier_stats.kv_offloaded_blocks, 0u);
        std::printf("gpu host tier (%s): %llu blocks out, %llu back\n", graphs ? "graphs" : "eager",
                    static_cast<unsigned long long>(tier_stats.kv_offloaded_blocks),
                    static_cast<unsigned long long>(tier_stats.kv_onloaded_blocks));
    }
}

// Structured output on the GPU (issue #22): constrained draws masked by the CUDA sampler
// (token_mask.cu) with async scheduling on give the same greedy tokens as the host sampler
// applying the same masks to downloaded logits, for a JSON schema and a regex, beside
// unconstrained requests in the same batches.
TEST(GpuEngine, ConstrainedDrawsOnTheDeviceMatchTheHost) {
    SKIP_WITHOUT_GPU();
    GpuModel g(models_dir() + "/stories260K", true, true);
    const Tokenizer tok = Tokenizer::load(models_dir() + "/stories260K");
    GrammarCache grammars(tok, g.loaded->config.eos_token_ids);
    StructuredOutput schema, regex;
    schema.kind = StructuredOutput::Kind::JsonSchema;
    schema.spec = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
        "n": {"type": "integer"}}, "required": ["name", "n"]})";
    regex.kind = StructuredOutput::Kind::Regex;
    regex.spec = "(yes|no|maybe), [a-z ]{4,30}\\.";
    std::vector<Request> reqs = random_greedy_requests(96, 11);
    for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].sampling.max_tokens = 48;
        if (i % 3 == 0) reqs[i].sampling.structured = schema;
        if (i % 3 == 1) reqs[i].sampling.structured = regex;
    }
    CudaSampler sampler(g.cuda(), 128, g.vocab());
    TokensById got[2];
    for (int device : {0, 1}) {
        auto ex = LocalExecutor::over(*g.backend, *g.model, 512, 16, device ? &sampler : nullptr);
        CoreConfig cfg;
        cfg.async_scheduling = true;
        cfg.scheduler.max_num_seqs = 128;
        cfg.eos_token_ids = g.loaded->config.eos_token_ids;
        EngineCore core(cfg, *ex);
        for (const Request& r : reqs)
            core.add_request(r, r.sampling.structured.kind == StructuredOutput::Kind::None
                                    ? nullptr
                                    : grammars.get(r.sampling.structured));
        while (core.has_unfinished())
            for (const RequestOutput& o : core.step())
                got[device][o.request_id].insert(got[device][o.request_id].end(), o.token_ids.begin(),
                                                 o.token_ids.end());
        if (device) {
            EXPECT_GT(core.stats().steps, 0u);
        }
    }
    for (const Request& r : reqs) EXPECT_EQ(got[1].at(r.id), got[0].at(r.id)) << r.id;
    const std::string text = tok.decode(got[1].at(reqs[0].id));
    EXPECT_EQ(text.front(), '{') << text;
}

}  // namespace
}  // namespace peregrine::testing
