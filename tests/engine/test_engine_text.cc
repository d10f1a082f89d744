// Engine outputs with the real tokenizer: streamed text equals the decoded tokens, and stop
// strings that span token boundaries end the output before them, never leaking.
#include <gtest/gtest.h>
#include <algorithm>

#include <chrono>
#include <thread>

#include "engine/engine_core.h"
#include "engine/engine_loop.h"
#include "engine/tokenizer_text.h"
#include "support/golden_util.h"
#include "worker/local_executor.h"

namespace peregrine::testing {
namespace {

struct Collected {
    std::string text;
    std::vector<int32_t> ids;
    FinishReason finish = FinishReason::None;
    std::string stop_reason;
    int completion_tokens = -1;  // the usage the request ended with
};

// Through the engine thread, the text made on this (the consumer's) thread. `read_after`:
// wait before the first read, so that the engine runs ahead of the text.
Collected run_one(TestModel& m, std::shared_ptr<const Tokenizer> tok, Request r,
                  std::chrono::milliseconds read_after = std::chrono::milliseconds(0)) {
    CoreConfig cfg;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineLoop engine(cfg, LocalExecutor::over(*m.backend, *m.model, 64, 16), std::make_shared<TokenizerText>(tok));
    const std::shared_ptr<RequestStream> stream = engine.submit(std::move(r));
    std::this_thread::sleep_for(read_after);
    Collected c;
    for (RequestOutput o; stream->next(o);) {
        c.text += o.text;
        c.ids.insert(c.ids.end(), o.token_ids.begin(), o.token_ids.end());
        if (o.finish != FinishReason::None) {
            c.finish = o.finish;
            c.stop_reason = o.stop_reason;
        }
        if (o.usage) c.completion_tokens = o.usage->completion_tokens;
    }
    return c;
}

Request once_upon(int max_tokens) {
    Request r;
    r.id = "story";
    r.prompt_ids = {1, 403, 407, 261, 378};
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    return r;
}

TEST(EngineText, StreamedTextIsTheDecodedContinuation) {
    TestModel m(models_dir() + "/stories260K");
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(models_dir() + "/stories260K"));
    const Collected c = run_one(m, tok, once_upon(20));
    EXPECT_EQ(c.finish, FinishReason::Length);
    EXPECT_EQ(c.text.rfind(", there was a little girl named Lily. She loved", 0), 0u) << c.text;
    std::vector<int32_t> all = {1, 403, 407, 261, 378};
    all.insert(all.end(), c.ids.begin(), c.ids.end());
    EXPECT_EQ("Once upon a time" + c.text, tok->decode(all));
}

TEST(EngineText, StopStringAcrossTokensEndsBeforeIt) {
    TestModel m(models_dir() + "/stories260K");
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(models_dir() + "/stories260K"));
    Request r = once_upon(40);
    r.sampling.stop = {"xyz", "girl na"};  // "girl named" is the tokens ▁g ir l ▁named
    const Collected c = run_one(m, tok, r);
    EXPECT_EQ(c.finish, FinishReason::Stop);
    EXPECT_EQ(c.stop_reason, "girl na");
    EXPECT_EQ(c.text, ", there was a little ");
    // A stop token id ends the output too, reported by its id.
    Request t = once_upon(40);
    t.sampling.stop_token_ids = {395};  // ▁named
    const Collected d = run_one(m, tok, t);
    EXPECT_EQ(d.finish, FinishReason::Stop);
    EXPECT_EQ(d.stop_reason, "395");
    EXPECT_EQ(d.text, ", there was a little girl");
}

// The text runs on the consumer's thread: the engine has drawn past the stop string before
// the consumer sees it. Those tokens never reach the consumer nor the usage.
TEST(EngineText, TokensDrawnAfterAStopStringAreDropped) {
    TestModel m(models_dir() + "/stories260K");
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(models_dir() + "/stories260K"));
    Request r = once_upon(60);
    r.sampling.stop = {"girl na"};
    const Collected c = run_one(m, tok, r, std::chrono::milliseconds(300));
    EXPECT_EQ(c.finish, FinishReason::Stop);
    EXPECT_EQ(c.stop_reason, "girl na");
    EXPECT_EQ(c.text, ", there was a little ");
    const Collected plain = run_one(m, tok, once_upon(60));
    // The ids end with the token that completed the stop string (▁named), as in a run alone.
    ASSERT_LT(c.ids.size(), plain.ids.size());
    EXPECT_EQ(c.ids, std::vector<int32_t>(plain.ids.begin(), plain.ids.begin() + c.ids.size()));
    EXPECT_EQ(c.ids.back(), 395);
    EXPECT_EQ(c.completion_tokens, static_cast<int>(c.ids.size()));
}

// n > 1: a stop string ends only its own choice; each choice's text stops before it.
TEST(EngineText, StopStringEndsOnlyItsChoice) {
    TestModel m(models_dir() + "/stories260K");
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(models_dir() + "/stories260K"));
    CoreConfig cfg;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineLoop engine(cfg, LocalExecutor::over(*m.backend, *m.model, 64, 16), std::make_shared<TokenizerText>(tok));
    Request r = once_upon(30);
    r.sampling.n = 3;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 7;
    r.sampling.stop = {" the"};
    const std::shared_ptr<RequestStream> stream = engine.submit(std::move(r));
    std::vector<std::string> text(3);
    std::vector<int> ids(3, 0), finishes(3, 0);
    int completion = -1, longest = -1;
    for (RequestOutput o; stream->next(o);) {
        text[o.index] += o.text;
        ids[o.index] += static_cast<int>(o.token_ids.size());
        if (o.finish != FinishReason::None) ++finishes[o.index];
        if (o.usage) completion = o.usage->completion_tokens, longest = o.usage->max_choice_tokens;
    }
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(finishes[i], 1) << "choice " << i;
        EXPECT_EQ(text[i].find(" the"), std::string::npos) << text[i];
    }
    EXPECT_EQ(completion, ids[0] + ids[1] + ids[2]);
    EXPECT_EQ(longest, *std::max_element(ids.begin(), ids.end()));  // the metric's max_num_generation_tokens
}

// skip_special_tokens off keeps a special token's text (tool-call markers such as Llama 3.1's
// <|python_tag|> are special tokens; this Llama 3 vocabulary's <|start_header_id|> stands in).
TEST(EngineText, SkipSpecialTokensChoosesWhetherSpecialTokensAreText) {
    const auto tok = std::make_shared<const Tokenizer>(
        Tokenizer::from_tokenizer_json(std::string(PG_TOKENIZER_DATA_DIR) + "/llama3/tokenizer.json"));
    const std::vector<int32_t> tag = tok->encode("<|start_header_id|>", false, /*parse_special=*/true);
    ASSERT_EQ(tag.size(), 1u);
    ASSERT_TRUE(tok->is_special(tag[0]));
    const std::vector<int32_t> body = tok->encode("{\"name\": \"f\"}", false);
    const TokenizerText text(tok);
    for (const bool skip : {true, false}) {
        auto choice = text.start({}, {}, skip);
        std::string out;
        std::string stop;
        out += choice->push(tag[0], &stop);
        for (int32_t id : body) out += choice->push(id, &stop);
        out += choice->flush();
        EXPECT_EQ(out, skip ? "{\"name\": \"f\"}" : "<|start_header_id|>{\"name\": \"f\"}");
    }
}

}  // namespace
}  // namespace peregrine::testing
