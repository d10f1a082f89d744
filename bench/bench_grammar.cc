// Allowed-token mask cost on the Llama 3 vocabulary (128k tokens): per token at batch 1, and per
// step at batch 64 (64 independent matchers, each fills its mask and accepts one token), with
// the token cache warm (the steady state of a served schema), plus the cold cost (compile, and
// the first pass over a trajectory that fills the cache).
//
// Trajectories: each matcher replays token ids recorded from a random walk through the masks
// (uniform over allowed tokens, then preferring closing tokens so that the text ends), so the
// work is that of real constrained decoding, string contents included.
//
// usage: peregrine_bench_grammar [--benchmark_filter=...]; PG_GRAMMAR_VOCAB=path/to/tokenizer.json
// overrides the Llama 3 tokenizer from the test data.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tests/grammar/hf_vocab.h"

namespace {

using namespace peregrine::grammar;

const char* kWeather = R"({"type": "object", "properties": {
    "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "include_hourly": {"type": "boolean"}},
  "required": ["location", "unit"], "additionalProperties": false})";

const char* kOrder = R"({"type": "object", "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 60}, "email": {"type": "string", "format": "email"},
        "tier": {"enum": ["free", "pro", "enterprise"]}}, "required": ["name", "email"]},
    "items": {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0}, "notes": {"type": ["string", "null"]}},
        "required": ["sku", "quantity", "price"]}},
    "created": {"type": "string", "format": "date-time"},
    "tags": {"type": "array", "items": {"type": "string"}}},
  "required": ["order_id", "customer", "items"]})";

std::shared_ptr<const VocabIndex> vocab() {
    static auto v = [] {
        const char* path = std::getenv("PG_GRAMMAR_VOCAB");
        Vocabulary voc =
            path ? testing::load_hf_vocab(path, {"<|end_of_text|>", "<|eot_id|>"}) : testing::llama3_vocab();
        return std::make_shared<const VocabIndex>(std::move(voc));
    }();
    return v;
}

std::shared_ptr<const TokenizedGrammar> grammar_of(int which) {
    Grammar g = which == 0   ? compile_json_schema_text(kWeather)
                : which == 1 ? compile_json_schema_text(kOrder)
                             : compile_any_json_object();
    return std::make_shared<const TokenizedGrammar>(compile_grammar(g), vocab());
}
const char* kNames[] = {"weather_tool", "order_nested", "json_object"};

// A token trajectory through the grammar (ends with an EOS id).
std::vector<int32_t> trajectory(const std::shared_ptr<const TokenizedGrammar>& tg, uint32_t seed) {
    const Vocabulary& v = tg->vocab().vocab;
    std::mt19937 rng(seed);
    GrammarMatcher m(tg);
    std::vector<uint32_t> mask(v.mask_words());
    std::vector<int32_t> out, closers;
    for (char c : std::string("\"}],.0:1a"))
        for (size_t i = 0; i < v.size(); ++i)
            if (v.tokens[i] == std::string(1, c)) {
                closers.push_back(int32_t(i));
                break;
            }
    for (int step = 0; step < 2000 && !m.is_terminated(); ++step) {
        m.fill_next_token_bitmask(mask);
        std::vector<int32_t> ids;
        for (size_t w = 0; w < mask.size(); ++w)
            for (uint32_t b = mask[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
        int32_t pick = -1;
        if (step >= 60 && (rng() & 1)) {  // half the time: a closer may also be content
            if (m.is_completed()) pick = v.eos[0];
            for (size_t k = 0; pick < 0 && k < closers.size(); ++k)
                if (mask[size_t(closers[k]) >> 5] >> (closers[k] & 31) & 1) pick = closers[k];
        }
        if (pick < 0) {
            // Skip EOS while walking freely, so the text has some length.
            pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
            if (step < 60 && ids.size() > 1 && pick == v.eos[0]) pick = ids[0];
        }
        m.accept_token(pick);
        out.push_back(pick);
    }
    return out;
}

// Token budgets (fill_next_token_bitmask's tokens_left): none; roomy (max_tokens far away: the
// per-top check that leaves the mask as it is, what every request with room pays); tight (the
// trajectory's remaining tokens, fewer than its remaining bytes: the token-by-token mask on
// most steps, the worst case).
enum Budget { kNone = 0, kRoomy = 1, kTight = 2 };

struct Lane {
    std::unique_ptr<GrammarMatcher> m;
    std::vector<int32_t> traj;
    size_t at = 0;
    int budget = kNone;
    void step(std::vector<uint32_t>& mask) {
        if (at == traj.size()) {
            m->reset();
            at = 0;
        }
        const int64_t left = budget == kNone    ? GrammarMatcher::kNoBudget
                             : budget == kRoomy ? int64_t(1) << 20
                                                : int64_t(traj.size() - at);
        m->fill_next_token_bitmask(mask, left);
        benchmark::DoNotOptimize(mask.data());
        m->accept_token(traj[at++]);
    }
};

void run_batch(benchmark::State& state, int which, int batch, int budget = kNone) {
    auto tg = grammar_of(which);
    std::vector<Lane> lanes(static_cast<size_t>(batch));
    std::vector<uint32_t> mask(tg->vocab().vocab.mask_words());
    size_t total = 0;
    for (int i = 0; i < batch; ++i) {
        lanes[size_t(i)].m = std::make_unique<GrammarMatcher>(tg);
        lanes[size_t(i)].traj = trajectory(tg, uint32_t(100 + i % 16));
        total += lanes[size_t(i)].traj.size();
        lanes[size_t(i)].at = size_t(i * 7) % lanes[size_t(i)].traj.size();
        lanes[size_t(i)].budget = budget;
    }
    // Warm the cache: every lane's whole trajectory once.
    for (auto& l : lanes)
        for (size_t k = 0; k < l.traj.size(); ++k) l.step(mask);
    for (auto _ : state)
        for (auto& l : lanes) l.step(mask);
    state.SetItemsProcessed(int64_t(state.iterations()) * batch);
    state.counters["tokens_per_traj"] = double(total) / batch;
    state.SetLabel(std::string(kNames[which]) + (budget == kRoomy   ? " roomy budget"
                                                 : budget == kTight ? " tight budget"
                                                                    : ""));
}

void BM_MaskBatch1(benchmark::State& state) {
    run_batch(state, int(state.range(0)), 1, int(state.range(1)));
}
void BM_MaskBatch64(benchmark::State& state) {
    run_batch(state, int(state.range(0)), 64, int(state.range(1)));
}

// Cold: compile the schema, bind it to the vocabulary, and walk one trajectory with an empty
// token cache (each new grammar position pays one trie walk).
void BM_ColdCompileAndFirstPass(benchmark::State& state) {
    int which = int(state.range(0));
    auto traj = trajectory(grammar_of(which), 100);
    std::vector<uint32_t> mask(vocab()->vocab.mask_words());
    for (auto _ : state) {
        auto tg = grammar_of(which);
        GrammarMatcher m(tg);
        for (int32_t id : traj) {
            m.fill_next_token_bitmask(mask);
            m.accept_token(id);
        }
    }
    state.counters["tokens"] = double(traj.size());
    state.SetLabel(kNames[which]);
}

void BM_Compile(benchmark::State& state) {
    int which = int(state.range(0));
    vocab();
    for (auto _ : state) benchmark::DoNotOptimize(grammar_of(which));
    state.SetLabel(kNames[which]);
}

BENCHMARK(BM_MaskBatch1)->ArgsProduct({{0, 1, 2}, {kNone, kRoomy, kTight}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskBatch64)->ArgsProduct({{0, 1, 2}, {kNone, kRoomy, kTight}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Compile)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ColdCompileAndFirstPass)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
