// Structured output through the engine on the embedded model (stories260K, which knows no
// JSON): every draw is masked by the request's grammar, so the text is always a sentence of
// it, greedy or sampled; a grammar that cannot compile is refused at submit, naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_loop.h"
#include "engine/structured_output.h"
#include "engine/tokenizer_text.h"
#include "support/fake_executor.h"
#include "support/golden_util.h"
#include "worker/local_executor.h"

namespace peregrine::testing {
namespace {

struct Generated {
    std::string text;
    std::vector<int32_t> ids;
    FinishReason finish = FinishReason::None;
};

class StructuredOutputTest : public ::testing::Test {
  protected:
    StructuredOutputTest()
        : m_(models_dir() + "/stories260K"),
          tok_(std::make_shared<const Tokenizer>(Tokenizer::load(models_dir() + "/stories260K"))) {
        CoreConfig cfg;
        cfg.eos_token_ids = m_.loaded->config.eos_token_ids;
        engine_ = std::make_unique<EngineLoop>(cfg, LocalExecutor::over(*m_.backend, *m_.model, 256, 16),
                                               std::make_shared<TokenizerText>(tok_), ModelInfo{}, tok_);
    }

    Request request(StructuredOutput::Kind kind, std::string spec, float temperature, uint64_t seed) {
        Request r;
        r.id = "so-" + std::to_string(next_++);
        r.prompt_ids = {1, 403, 407, 261, 378};  // "Once upon a time"
        r.sampling.temperature = temperature;
        r.sampling.seed = seed;
        r.sampling.max_tokens = 400;
        r.sampling.structured.kind = kind;
        r.sampling.structured.spec = std::move(spec);
        return r;
    }

    Generated run(Request r) {
        const std::shared_ptr<RequestStream> stream = engine_->submit(std::move(r));
        Generated out;
        for (RequestOutput o; stream->next(o);) {
            out.text += o.text;
            out.ids.insert(out.ids.end(), o.token_ids.begin(), o.token_ids.end());
            if (o.finish != FinishReason::None) out.finish = o.finish;
        }
        return out;
    }

    TestModel m_;
    std::shared_ptr<const Tokenizer> tok_;
    std::unique_ptr<EngineLoop> engine_;
    int next_ = 0;
};

TEST_F(StructuredOutputTest, JsonSchemaTextParsesAndFits) {
    const std::string schema = R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["name", "age", "mood"], "additionalProperties": false})";
    for (float temperature : {0.0f, 1.0f}) {
        for (uint64_t seed = 1; seed <= 4; ++seed) {
            const Generated r = run(request(StructuredOutput::Kind::JsonSchema, schema, temperature, seed));
            SCOPED_TRACE("temperature " + std::to_string(temperature) + ", seed " + std::to_string(seed) + ": " +
                         r.text);
            EXPECT_EQ(r.finish, FinishReason::Stop);
            const nlohmann::json j = nlohmann::json::parse(r.text, nullptr, false);
            ASSERT_TRUE(j.is_object());
            ASSERT_TRUE(j.contains("name") && j["name"].is_string());
            EXPECT_LE(j["name"].get<std::string>().size(), 12u);
            ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer());
            EXPECT_GE(j["age"].get<int>(), 0);
            EXPECT_LE(j["age"].get<int>(), 120);
            ASSERT_TRUE(j.contains("mood"));
            EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad");
            for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "mood" || k == "tags");
            if (j.contains("tags")) {
                EXPECT_LE(j["tags"].size(), 3u);
            }
            if (temperature == 0.0f) break;  // greedy: the seed changes nothing
        }
    }
}

TEST_F(StructuredOutputTest, JsonObjectRegexChoiceAndGrammar) {
    // Any object: the model would go on adding members; the budget closes the object before
    // max_tokens, so every answer is a whole one.
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        const Generated obj = run(request(StructuredOutput::Kind::JsonObject, "", 1.0f, seed));
        EXPECT_EQ(obj.finish, FinishReason::Stop) << obj.text;
        EXPECT_TRUE(nlohmann::json::parse(obj.text, nullptr, false).is_object()) << obj.text;
    }
    const Generated re = run(request(StructuredOutput::Kind::Regex, R"([A-Z][a-z]{2,8} (is|was) \d{1,3})", 1.0f, 7));
    EXPECT_TRUE(std::regex_match(re.text, std::regex(R"([A-Z][a-z]{2,8} (is|was) \d{1,3})"))) << re.text;
    const Generated choice = run(request(StructuredOutput::Kind::Choice, R"(["yes", "no", "maybe later"])", 1.0f, 7));
    EXPECT_TRUE(choice.text == "yes" || choice.text == "no" || choice.text == "maybe later") << choice.text;
    const Generated g = run(
        request(StructuredOutput::Kind::Grammar, R"g(root ::= "(" [0-9]{1,3} ("+" [0-9]{1,3}){0,4} ")")g", 1.0f, 7));
    EXPECT_TRUE(std::regex_match(g.text, std::regex(R"(\([0-9]{1,3}(\+[0-9]{1,3}){0,4}\))"))) << g.text;
}

// max_tokens bounds the grammar: a schema with an unbounded string (which this model, knowing no
// JSON, fills until the budget) still ends with EOS within max_tokens, as valid JSON and "stop",
// from the shortest document + EOS up; and a request with room sees the unbudgeted masks: with
// max_tokens = its text's bytes + 1 (every completion then fits even one byte a token) it
// yields the very same tokens as with 400.
TEST_F(StructuredOutputTest, TheBudgetClosesTheStructureAndLeavesRoomAlone) {
    const std::string schema = R"({"type": "object", "properties": {"story": {"type": "string"},
        "n": {"type": "integer", "exclusiveMinimum": 0}}, "required": ["story", "n"], "additionalProperties": false})";
    const size_t shortest = std::string(R"({"story":"","n":1})").size();
    for (float temperature : {0.0f, 1.0f}) {
        for (size_t budget : {shortest + 1, shortest + 2, shortest + 7, size_t(40), size_t(100)}) {
            Request r = request(StructuredOutput::Kind::JsonSchema, schema, temperature, budget);
            r.sampling.max_tokens = int(budget);
            const Generated g = run(std::move(r));
            SCOPED_TRACE("temperature " + std::to_string(temperature) + ", max_tokens " + std::to_string(budget) +
                         ": " + g.text);
            EXPECT_EQ(g.finish, FinishReason::Stop);
            EXPECT_LE(g.ids.size(), budget);
            const nlohmann::json j = nlohmann::json::parse(g.text, nullptr, false);
            ASSERT_TRUE(j.is_object());
            EXPECT_TRUE(j.contains("story") && j["story"].is_string());
            ASSERT_TRUE(j.contains("n") && j["n"].is_number_integer());
            EXPECT_GT(j["n"].get<int64_t>(), 0);
        }
    }
    const std::vector<std::pair<StructuredOutput::Kind, std::string>> roomy = {
        {StructuredOutput::Kind::Regex, R"([A-Z][a-z]{2,8} (is|was) \d{1,3})"},
        {StructuredOutput::Kind::Choice, R"(["yes", "no", "maybe later"])"},
        {StructuredOutput::Kind::JsonSchema,
         R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]})"},
    };
    for (const auto& [kind, spec] : roomy) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
            const Generated free = run(request(kind, spec, 1.0f, seed));
            ASSERT_EQ(free.finish, FinishReason::Stop) << free.text;
            Request r = request(kind, spec, 1.0f, seed);
            r.sampling.max_tokens = int(free.text.size()) + 1;
            const Generated tight = run(std::move(r));
            EXPECT_EQ(tight.ids, free.ids) << spec << ": " << tight.text << " vs " << free.text;
            EXPECT_EQ(tight.finish, FinishReason::Stop) << tight.text;
        }
    }
}

// n > 1: each choice forks the grammar's state with the prompt and follows its own draws.
TEST_F(StructuredOutputTest, EachOfNChoicesFollowsTheGrammar) {
    Request r = request(StructuredOutput::Kind::Regex, "(cat|dog|bird)-[0-9]{2}", 1.0f, 11);
    r.sampling.n = 4;
    const std::shared_ptr<RequestStream> stream = engine_->submit(std::move(r));
    std::vector<std::string> text(4);
    for (RequestOutput o; stream->next(o);) text[static_cast<size_t>(o.index)] += o.text;
    for (const std::string& t : text) EXPECT_TRUE(std::regex_match(t, std::regex("(cat|dog|bird)-[0-9]{2}"))) << t;
}

// min_tokens cannot hold a choice open once the grammar can only end.
TEST_F(StructuredOutputTest, MinTokensYieldsToACompleteGrammar) {
    Request r = request(StructuredOutput::Kind::Choice, R"(["yes", "no"])", 1.0f, 3);
    r.sampling.min_tokens = 50;
    const Generated g = run(std::move(r));
    EXPECT_TRUE(g.text == "yes" || g.text == "no") << g.text;
    EXPECT_EQ(g.finish, FinishReason::Stop);
    const auto& eos = m_.loaded->config.eos_token_ids;
    ASSERT_FALSE(g.ids.empty());
    EXPECT_NE(std::find(eos.begin(), eos.end(), g.ids.back()), eos.end()) << "ended by token " << g.ids.back();
}

TEST_F(StructuredOutputTest, BadGrammarIsRefusedAtSubmitNamingTheField) {
    Request r = request(StructuredOutput::Kind::JsonSchema, R"({"type": "object", "not": {}})", 0, 1);
    r.sampling.structured.field = "guided_json";
    try {
        run(std::move(r));
        FAIL() << "accepted";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("'guided_json' json_schema: ", 0), 0u) << msg;
        EXPECT_NE(msg.find("'not'"), std::string::npos) << msg;
    }
    // The engine goes on serving.
    const Generated ok = run(request(StructuredOutput::Kind::Choice, R"(["a", "b"])", 0, 1));
    EXPECT_TRUE(ok.text == "a" || ok.text == "b");
}

// A device sampler applies the masks (GPU: token_mask.cu), so constrained draws keep async
// scheduling: on the fake executor's device mode the next step is queued before the draws are
// back (tokens fed from the "device"), the masks are filled once they are, and the tokens equal
// those of host sampling. A constrained draw that wants logprobs goes back to the host.
TEST(StructuredOutputAsync, MasksDoNotStopTheOverlap) {
    const Tokenizer tok = Tokenizer::load(models_dir() + "/stories260K");
    GrammarCache grammars(tok, {2});
    StructuredOutput so;
    so.kind = StructuredOutput::Kind::Regex;
    so.spec = "[a-z]{3,8}( [a-z]{2,8}){2,6}\\.";
    const auto grammar = grammars.get(so);
    auto run = [&](bool device, bool logprobs, size_t& fed, size_t& host_steps) {
        FakeExecutor ex(256, 4, 512);
        if (device) ex.enable_device_sampling(64);
        CoreConfig cfg;
        cfg.eos_token_ids = {2};
        cfg.scheduler.max_num_seqs = 16;
        EngineCore core(cfg, ex);
        for (int i = 0; i < 12; ++i) {
            Request r;
            r.id = "r" + std::to_string(i);
            r.prompt_ids = {1, 403, 407, static_cast<int32_t>(261 + i)};
            r.sampling.temperature = i % 2 ? 1.0f : 0.0f;
            r.sampling.seed = 100 + i;
            r.sampling.max_tokens = 40;
            r.sampling.logprobs = logprobs && i == 5 ? 2 : -1;
            r.sampling.structured = so;
            core.add_request(r, grammar);
        }
        std::map<std::string, std::vector<int32_t>> out;
        while (core.has_unfinished())
            for (const RequestOutput& o : core.step())
                out[o.request_id].insert(out[o.request_id].end(), o.token_ids.begin(), o.token_ids.end());
        fed = ex.fed_;
        host_steps = core.stats().steps;
        return out;
    };
    size_t fed_host = 0, fed_device = 0, fed_lp = 0, steps = 0;
    const auto host = run(false, false, fed_host, steps);
    const auto device = run(true, false, fed_device, steps);
    EXPECT_EQ(device, host);
    EXPECT_EQ(fed_host, 0u);
    EXPECT_GT(fed_device, 100u);  // nearly every decode token came from the in-flight draws
    for (const auto& [id, ids] : device) {
        const std::string text = tok.decode(ids);
        EXPECT_TRUE(std::regex_match(text, std::regex("[a-z]{3,8}( [a-z]{2,8}){2,6}\\."))) << id << ": " << text;
    }
    const auto with_lp = run(true, true, fed_lp, steps);
    EXPECT_EQ(with_lp, host);
    EXPECT_LT(fed_lp, fed_device / 2);  // the logprobs request holds steps on the host while it lives
}

}  // namespace
}  // namespace peregrine::testing
