// Engine outputs with the real tokenizer: streamed text equals the decoded tokens, and stop
// strings that span token boundaries end the output before them, never leaking.
#include <gtest/gtest.h>

#include "engine/engine_core.h"
#include "engine/tokenizer_text.h"
#include "golden/golden_util.h"

namespace peregrine::testing {
namespace {

struct Collected {
    std::string text;
    std::vector<int32_t> ids;
    FinishReason finish = FinishReason::None;
    std::string stop_reason;
};

Collected run_one(TestModel& m, std::shared_ptr<const Tokenizer> tok, Request r) {
    LlamaExecutor ex(*m.model, *m.backend, 64, 16);
    EngineConfig cfg;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineCore core(cfg, ex, std::make_shared<TokenizerText>(tok));
    core.add_request(std::move(r));
    Collected c;
    while (core.has_unfinished())
        for (const RequestOutput& o : core.step()) {
            c.text += o.text;
            c.ids.insert(c.ids.end(), o.token_ids.begin(), o.token_ids.end());
            if (o.finish != FinishReason::None) {
                c.finish = o.finish;
                c.stop_reason = o.stop_reason;
            }
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

}  // namespace
}  // namespace peregrine::testing
