// validate(SamplingParams): each rule names its field as the OpenAI API spells it, with a
// message that names the value; bounds that depend on the engine come from SamplingLimits.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "peregrine/engine_types.h"

namespace peregrine {
namespace {

SamplingLimits engine_limits() {
    SamplingLimits l;
    l.vocab_size = 512;
    l.max_num_seqs = 8;
    return l;
}

// The single error of `edit` applied to valid parameters.
FieldError only_error(const std::function<void(SamplingParams&)>& edit,
                      const SamplingLimits& limits = engine_limits()) {
    SamplingParams p;
    edit(p);
    const std::vector<FieldError> errors = validate(p, limits);
    EXPECT_EQ(errors.size(), 1u);
    return errors.empty() ? FieldError{} : errors.front();
}

TEST(SamplingParams, DefaultsAndTypicalValuesAreValid) {
    EXPECT_TRUE(validate(SamplingParams{}, engine_limits()).empty());
    EXPECT_TRUE(validate(SamplingParams{}, SamplingLimits{}).empty());
    SamplingParams p;
    p.n = 8;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.top_k = 40;
    p.min_p = 1.0f;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.logit_bias = {{0, -100.0f}, {511, 100.0f}};
    p.stop = {"\n"};
    p.min_tokens = 16;
    p.max_tokens = 16;
    p.logprobs = 20;
    EXPECT_TRUE(validate(p, engine_limits()).empty());
}

TEST(SamplingParams, EachFieldNamesItselfAndTheValue) {
    struct Case {
        std::function<void(SamplingParams&)> edit;
        const char* field;
        const char* message;
    };
    const Case cases[] = {
        {[](SamplingParams& p) { p.n = 0; }, "n", "'n' must be between 1 and 128, got 0"},
        {[](SamplingParams& p) { p.n = 129; }, "n", "'n' must be between 1 and 128, got 129"},
        {[](SamplingParams& p) { p.n = 9; }, "n", "n (9) is more than the engine runs at once (max_num_seqs 8)"},
        {[](SamplingParams& p) { p.temperature = -1; }, "temperature", "'temperature' must be at least 0, got -1"},
        {[](SamplingParams& p) { p.top_p = 2; }, "top_p", "'top_p' must be in (0, 1], got 2"},
        {[](SamplingParams& p) { p.top_p = 0; }, "top_p", "'top_p' must be in (0, 1], got 0"},
        {[](SamplingParams& p) { p.top_k = -1; }, "top_k", "'top_k' must be at least 0 (0 = no limit), got -1"},
        {[](SamplingParams& p) { p.min_p = 1.5f; }, "min_p", "'min_p' must be in [0, 1], got 1.5"},
        {[](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty",
         "'repetition_penalty' must be > 0, got 0"},
        {[](SamplingParams& p) { p.presence_penalty = 3; }, "presence_penalty",
         "'presence_penalty' must be in [-2, 2], got 3"},
        {[](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty",
         "'frequency_penalty' must be in [-2, 2], got -2.5"},
        {[](SamplingParams& p) {
             p.logit_bias = {{512, 1.0f}};
         },
         "logit_bias", "'logit_bias' token id 512 is outside the vocabulary (0..511)"},
        {[](SamplingParams& p) {
             p.logit_bias = {{3, 200.0f}};
         },
         "logit_bias", "'logit_bias' values must be in [-100, 100], got 200"},
        {[](SamplingParams& p) { p.stop = {""}; }, "stop", "'stop' strings must not be empty"},
        {[](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens", "'min_tokens' must be at least 0, got -1"},
        {[](SamplingParams& p) { p.min_tokens = 5, p.max_tokens = 4; }, "min_tokens",
         "'min_tokens' (5) must not exceed 'max_tokens' (4)"},
        {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens", "'max_tokens' must be at least 1, got 0"},
        {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs", "'logprobs' must be between 0 and 20, got 21"},
        {[](SamplingParams& p) { p.logprobs = -2; }, "logprobs", "'logprobs' must be between 0 and 20, got -2"},
    };
    for (const Case& c : cases) {
        const FieldError e = only_error(c.edit);
        EXPECT_EQ(e.field, c.field) << c.message;
        EXPECT_EQ(e.message, c.message);
    }
}

TEST(SamplingParams, NonFiniteFloatsAreRefused) {
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    constexpr float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.temperature = nan; }).field, "temperature");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.temperature = inf; }).field, "temperature");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.top_p = nan; }).field, "top_p");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.min_p = nan; }).field, "min_p");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.repetition_penalty = inf; }).field, "repetition_penalty");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.presence_penalty = nan; }).field, "presence_penalty");
    EXPECT_EQ(only_error([&](SamplingParams& p) { p.logit_bias = {{1, nan}}; }).field, "logit_bias");
}

TEST(SamplingParams, EngineBoundsComeFromTheLimits) {
    SamplingParams p;
    p.n = 100;
    p.logit_bias = {{100000, 1.0f}};
    p.stop = {"x"};
    p.logprobs = 20;
    EXPECT_TRUE(validate(p, SamplingLimits{}).empty());  // no vocabulary or max_num_seqs known: unchecked

    SamplingLimits no_text = engine_limits();
    no_text.max_num_seqs = 0;
    no_text.vocab_size = 0;
    no_text.has_tokenizer = false;
    const std::vector<FieldError> errors = validate(p, no_text);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].field, "stop");
    EXPECT_EQ(errors[0].message, "'stop' strings need a tokenizer");

    SamplingLimits few = engine_limits();
    few.max_logprobs = 5;
    few.max_n = 4;
    p = SamplingParams{};
    p.logprobs = 6;
    p.n = 5;
    const std::vector<FieldError> two = validate(p, few);
    ASSERT_EQ(two.size(), 2u);  // every bad field, in the struct's order
    EXPECT_EQ(two[0].message, "'n' must be between 1 and 4, got 5");
    EXPECT_EQ(two[1].message, "'logprobs' must be between 0 and 5, got 6");
}

}  // namespace
}  // namespace peregrine
