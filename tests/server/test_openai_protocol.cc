// The request parser (JSON → engine parameters, 400s naming the field) and the stream pump.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "engine/engine_loop.h"
#include "engine/sampler.h"
#include "peregrine/engine.h"
#include "server/api_error.h"
#include "server/openai/completion_request.h"
#include "server/stream_pump.h"
#include "support/fake_executor.h"

namespace peregrine::server {
namespace {

CompletionParams parse(const char* json, Endpoint ep = Endpoint::Completions) {
    return parse_completion_params(Json::parse(json), ep);
}

// The parameter a rejected request names.
std::string rejected_param(const char* json, Endpoint ep = Endpoint::Completions) {
    try {
        parse(json, ep);
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400) << json;
        return e.param();
    }
    ADD_FAILURE() << "accepted: " << json;
    return "";
}

// A field the server does not honour is refused by name (issue #25), never accepted and ignored.
TEST(OpenAiProtocol, FieldsNotHonouredAreRefused) {
    EXPECT_EQ(rejected_param(R"({"prompt": "Hi", "unknown": {"a": 1}})"), "unknown");
    EXPECT_EQ(rejected_param(R"({"prompt": "Hi", "messages": []})"), "messages");
    EXPECT_EQ(
        rejected_param(R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", Endpoint::ChatCompletions),
        "echo");
    EXPECT_EQ(rejected_param(R"({"prompt": "Hi", "store": true})"), "store");
    EXPECT_EQ(rejected_param(R"({"prompt": "Hi", "service_tier": "flex"})"), "service_tier");
    EXPECT_EQ(rejected_param(R"({"prompt": "Hi", "chat_template": "x"})"), "chat_template");
    const CompletionParams p = parse(R"({"messages": [{"role": "user", "content": "x"}], "store": false,
        "metadata": {"k": "v"}, "service_tier": "auto", "safety_identifier": "u", "chat_template": "{{ 1 }}"})",
                                     Endpoint::ChatCompletions);
    EXPECT_EQ(p.chat_template, "{{ 1 }}");
}

TEST(OpenAiProtocol, RequestsStartFromTheModelDefaults) {
    SamplingParams defaults;
    defaults.temperature = 0.6f;
    defaults.top_k = 20;
    const CompletionParams p =
        parse_completion_params(Json::parse(R"({"prompt": "Hi", "top_k": 5})"), Endpoint::Completions, {}, defaults);
    EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
    EXPECT_EQ(p.sampling.top_k, 5);
}

TEST(OpenAiProtocol, CompletionDefaultsAndFields) {
    CompletionParams p = parse(R"({"prompt": "Hi"})");
    ASSERT_EQ(p.prompts.size(), 1u);
    EXPECT_TRUE(p.prompts[0].is_text);
    EXPECT_EQ(p.sampling.max_tokens, 16);
    EXPECT_FALSE(p.max_tokens_given);
    EXPECT_EQ(p.sampling.logprobs, -1);
    EXPECT_TRUE(p.add_special_tokens);

    p = parse(R"({"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 5, "temperature": 0, "top_p": 0.5,
                  "top_k": -1, "min_p": 0.1, "presence_penalty": 1, "frequency_penalty": -1,
                  "repetition_penalty": 1.2, "logit_bias": {"7": 2.5}, "seed": 3, "n": 2, "stop": "x",
                  "stop_token_ids": [9], "ignore_eos": true, "min_tokens": 1, "stream": true,
                  "stream_options": {"include_usage": true}, "echo": true, "logprobs": 2, "priority": -1,
                  "cache_salt": "s", "user": "u", "prompt_cache_key": "conv-7"})");
    EXPECT_EQ(p.model, "m");
    ASSERT_EQ(p.prompts.size(), 2u);
    EXPECT_EQ(p.prompts[0].ids, (std::vector<int32_t>{1, 2}));
    const SamplingParams& s = p.sampling;
    EXPECT_EQ(s.max_tokens, 5);
    EXPECT_EQ(s.temperature, 0.0f);
    EXPECT_EQ(s.top_p, 0.5f);
    EXPECT_EQ(s.top_k, 0);
    EXPECT_FLOAT_EQ(s.min_p, 0.1f);
    EXPECT_EQ(s.presence_penalty, 1.0f);
    EXPECT_EQ(s.frequency_penalty, -1.0f);
    EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
    ASSERT_EQ(s.logit_bias.size(), 1u);
    EXPECT_EQ(s.logit_bias[0].first, 7);
    EXPECT_EQ(s.seed, 3u);
    EXPECT_EQ(s.n, 2);
    EXPECT_EQ(s.stop, std::vector<std::string>{"x"});
    EXPECT_EQ(s.stop_token_ids, std::vector<int32_t>{9});
    EXPECT_TRUE(s.ignore_eos);
    EXPECT_EQ(s.min_tokens, 1);
    EXPECT_TRUE(p.stream && p.include_usage && p.echo);
    EXPECT_EQ(s.logprobs, 2);
    EXPECT_EQ(p.priority, -1);
    EXPECT_EQ(p.cache_salt, "s");
    EXPECT_EQ(p.prompt_cache_key, "conv-7");
    EXPECT_EQ(parse(R"({"prompt": "x"})").prompt_cache_key, "") << "anonymous";
}

TEST(OpenAiProtocol, ChatFields) {
    CompletionParams p = parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                   {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null}],
                                   "max_completion_tokens": 4, "max_tokens": 9, "logprobs": true, "top_logprobs": 3})",
                               Endpoint::ChatCompletions);
    EXPECT_EQ(p.messages[0]["content"], "ab");
    EXPECT_EQ(p.messages[1]["content"], "");
    EXPECT_EQ(p.sampling.max_tokens, 4);  // max_completion_tokens wins
    EXPECT_TRUE(p.chat_logprobs);
    EXPECT_EQ(p.sampling.logprobs, 3);
    EXPECT_FALSE(p.add_special_tokens);
    EXPECT_TRUE(p.add_generation_prompt);
    p = parse(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::ChatCompletions);
    EXPECT_GT(p.sampling.max_tokens, 1 << 20);  // the context left
    EXPECT_EQ(p.sampling.logprobs, -1);
}

// vLLM's prompt_logprobs; echo with logprobs asks the engine for the prompt's too.
TEST(OpenAiProtocol, PromptLogprobs) {
    CompletionParams p = parse(R"({"prompt": "a"})");
    EXPECT_EQ(p.prompt_logprobs, -1);
    EXPECT_EQ(p.sampling.prompt_logprobs, -1);
    p = parse(R"({"prompt": "a", "logprobs": 3})");
    EXPECT_EQ(p.sampling.prompt_logprobs, -1);  // no echo: the prompt's are not shown
    p = parse(R"({"prompt": "a", "echo": true, "logprobs": 3, "prompt_logprobs": 1})");
    EXPECT_EQ(p.prompt_logprobs, 1);
    EXPECT_EQ(p.sampling.prompt_logprobs, 3);  // the deeper of the two
    p = parse(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 2})", Endpoint::ChatCompletions);
    EXPECT_EQ(p.prompt_logprobs, 2);
    EXPECT_EQ(p.sampling.prompt_logprobs, 2);
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})"), "prompt_logprobs");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "prompt_logprobs": 21})"), "prompt_logprobs");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "prompt_logprobs": -1})"), "prompt_logprobs");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "prompt_logprobs": "2"})"), "prompt_logprobs");
}

TEST(OpenAiProtocol, RejectsNamingTheParameter) {
    EXPECT_EQ(rejected_param(R"({})"), "prompt");
    EXPECT_EQ(rejected_param(R"({"prompt": []})"), "prompt");
    EXPECT_EQ(rejected_param(R"({"prompt": [1, -2]})"), "prompt");
    EXPECT_EQ(rejected_param(R"({"prompt": [[1], "a", 3]})"), "prompt");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "max_tokens": -1})"), "max_tokens");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "max_tokens": 0})"), "max_tokens");  // only with echo
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "temperature": "1"})"), "temperature");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "temperature": -0.5})"), "temperature");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "n": 1.5})"), "n");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "n": 129})"), "n");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "stop": ["x", ""]})"), "stop");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "logit_bias": {"1": 200}})"), "logit_bias");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "logprobs": true})"), "logprobs");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "logprobs": 21})"), "logprobs");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "suffix": "b"})"), "suffix");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "stream_options": 1})"), "stream_options");
    EXPECT_EQ(rejected_param(R"({"prompt": "a", "min_tokens": 5, "max_tokens": 4})"), "min_tokens");
    parse(R"({"prompt": "a", "min_tokens": 4, "max_tokens": 4})");
    parse(R"({"prompt": "a", "min_tokens": 40})");  // max_tokens left out: the engine's default applies
    EXPECT_EQ(rejected_param(R"({"messages": []})", Endpoint::ChatCompletions), "messages");
    EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                             Endpoint::ChatCompletions),
              "messages");
    EXPECT_EQ(
        rejected_param(R"({"messages": [{"role": "user", "content": "a"}], "tools": [{}]})", Endpoint::ChatCompletions),
        "tools");
    EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": "a"}],
                                 "response_format": {"type": "json_schema"}})",
                             Endpoint::ChatCompletions),
              "response_format");
    // Accepted: an empty tools list, response_format text.
    parse(R"({"messages": [{"role": "user", "content": "a"}], "tools": [], "response_format": {"type": "text"}})",
          Endpoint::ChatCompletions);
}

TEST(OpenAiProtocol, ErrorBody) {
    ApiError e(404, "no such model", "model", "model_not_found");
    const auto body = e.body();
    EXPECT_EQ(body["error"]["type"], "not_found_error");
    EXPECT_EQ(body["error"]["param"], "model");
    EXPECT_EQ(body["error"]["code"], "model_not_found");
    EXPECT_TRUE(ApiError(400, "x").body()["error"]["param"].is_null());
}

TEST(StreamPump, DeliversEveryOutputInOrderThenDoneOnce) {
    // 300 concurrent requests through a real Engine on the fake model, read by one pump thread.
    Engine engine(
        std::make_unique<EngineLoop>(CoreConfig{}, std::make_unique<testing::FakeExecutor>(4096, 4, 97, 512), nullptr));
    StreamPump pump(std::chrono::microseconds(200));
    constexpr int kJobs = 300;
    struct Seen {
        std::vector<int32_t> tokens;
        int done = 0;
        bool usage = false;
    };
    std::vector<Seen> seen(kJobs);
    std::mutex mu;
    std::condition_variable cv;
    int num_done = 0;
    for (int j = 0; j < kJobs; ++j) {
        Request r;
        r.id = "r" + std::to_string(j);
        r.prompt_ids = {1, 2, 3, static_cast<int32_t>(j % 90)};
        r.sampling.max_tokens = 20;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = 0;
        pump.add({engine.submit(r)}, [&, j](std::vector<RequestOutput>&& outs, bool done) {
            std::lock_guard<std::mutex> lock(mu);
            for (const auto& o : outs) {
                seen[j].tokens.insert(seen[j].tokens.end(), o.token_ids.begin(), o.token_ids.end());
                seen[j].usage |= o.usage.has_value();
            }
            if (done) {
                ++seen[j].done;
                ++num_done;
                cv.notify_all();
            }
        });
    }
    {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return num_done == kJobs; }));
    }
    for (int j = 0; j < kJobs; ++j) {
        EXPECT_EQ(seen[j].tokens.size(), 20u) << j;
        EXPECT_EQ(seen[j].done, 1) << j;
        EXPECT_TRUE(seen[j].usage) << j;
        // Same prompt, greedy: the same tokens.
        if (j >= 90) {
            EXPECT_EQ(seen[j].tokens, seen[j - 90].tokens) << j;
        }
    }
    EXPECT_EQ(pump.num_jobs(), 0u);
    pump.stop();
}

}  // namespace
}  // namespace peregrine::server
