// Logits and greedy continuations against Hugging Face transformers (float32, eager) for the
// HF fixtures and the GGUF copy of stories260K, and against llama.cpp for quant-tiny.
#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

struct Fixture {
    const char* name;
    std::string model;          // what load_model opens
    std::string golden;         // folder with golden.json + logits.f32
    double bf16_max_kl = 1e-5;  // Bfloat16ModeWithinKlBound
};

std::vector<Fixture> fixtures() {
    return {
        {"stories260K_hf", models_dir() + "/stories260K", models_dir() + "/stories260K"},
        {"stories260K_gguf", data_dir() + "/stories260K.gguf", models_dir() + "/stories260K"},
        {"llama3_tiny", data_dir() + "/llama3-tiny", data_dir() + "/llama3-tiny"},
        {"qwen2_tiny", data_dir() + "/qwen2-tiny", data_dir() + "/qwen2-tiny"},
        {"qwen3_tiny", data_dir() + "/qwen3-tiny", data_dir() + "/qwen3-tiny"},
        // Trained: logits spread wider than the random fixtures', so bf16 inputs move them more
        // (the GPU's bf16 path: mean KL 4.0e-5 against this golden on an H200, 2026-11-28; the CPU's
        // bf16 mode was not measured on it: no AVX512-BF16 on the machine that added it).
        {"text_trained", data_dir() + "/text-trained", data_dir() + "/text-trained", 1e-4},
    };
}

void PrintTo(const Fixture& f, std::ostream* os) {
    *os << f.name;
}

class GoldenTest : public ::testing::TestWithParam<Fixture> {};

TEST_P(GoldenTest, LogitsMatchTransformersInFloat32) {
    const Fixture& f = GetParam();
    const auto golden = read_json_file(f.golden + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<float> ref = read_f32_file(f.golden + "/logits.f32");
    TestModel m(f.model);
    ASSERT_EQ(ref.size(), prompt.size() * m.vocab());
    const LogitStats s = compare_logits(ref, m.all_logits(prompt), m.vocab());
    EXPECT_LE(s.max_abs_diff, 1e-3) << f.name;
    EXPECT_EQ(s.argmax_mismatches, 0u) << f.name;
    EXPECT_LE(s.mean_kl, 1e-6) << f.name;
}

LogitStats run_in_mode(const Fixture& f, CpuPrecision precision) {
    const auto golden = read_json_file(f.golden + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<float> ref = read_f32_file(f.golden + "/logits.f32");
    TestModel m(f.model, 2, {}, precision);
    const LogitStats s = compare_logits(ref, m.all_logits(prompt), m.vocab());
    std::printf("%s (%s): mean KL %.3g, argmax agreement %.4f, max |dlogit| %.3g\n", f.name,
                cpu_precision_name(precision), s.mean_kl, s.argmax_agree, s.max_abs_diff);
    return s;
}

// The default mode (`--dtype auto`), held to the fast-mode tolerance.
TEST_P(GoldenTest, DefaultModeWithinFastTolerance) {
    const LogitStats s = run_in_mode(GetParam(), cpu_precision_from_name("auto"));
    EXPECT_GE(s.argmax_agree, 0.99) << GetParam().name;
    EXPECT_LE(s.mean_kl, 1e-3) << GetParam().name;
}

// `--dtype bfloat16`: the KL bound holds, but the fixtures' random weights leave top-2 gaps
// as small as 5e-4, and bf16 inputs flip one of qwen2-tiny's 40 argmaxes; that is why auto
// is not bfloat16 yet.
TEST_P(GoldenTest, Bfloat16ModeWithinKlBound) {
    if (!cpu_bf16_kernels()) GTEST_SKIP() << "no AVX512-BF16 kernels in use";
    const LogitStats s = run_in_mode(GetParam(), CpuPrecision::BFloat16);
    EXPECT_GE(s.argmax_agree, 0.95) << GetParam().name;
    EXPECT_LE(s.mean_kl, GetParam().bf16_max_kl) << GetParam().name;
}

TEST_P(GoldenTest, GreedyContinuationMatches) {
    const Fixture& f = GetParam();
    const auto golden = read_json_file(f.golden + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int> want = golden["greedy_ids"].get<std::vector<int>>();
    TestModel m(f.model);
    EXPECT_EQ(m.greedy(prompt, static_cast<int>(want.size())), want) << f.name;
}

// Prefill in chunks attends over the earlier chunks through the paged cache; with f32
// activations the result is bitwise the same as one pass.
TEST_P(GoldenTest, ChunkedPrefillIsBitwiseIdentical) {
    const Fixture& f = GetParam();
    const auto golden = read_json_file(f.golden + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    TestModel m(f.model);
    const std::vector<float> whole = m.all_logits(prompt);
    for (int chunk : {1, 3, 16}) EXPECT_EQ(m.all_logits(prompt, chunk), whole) << f.name << " chunk " << chunk;
}

// One thread and two give the same bits: work is split by output rows, never by reduction.
TEST_P(GoldenTest, ThreadCountDoesNotChangeResults) {
    const Fixture& f = GetParam();
    const auto golden = read_json_file(f.golden + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    TestModel one(f.model, 1), two(f.model, 2);
    EXPECT_EQ(one.all_logits(prompt), two.all_logits(prompt)) << f.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Golden, StoriesTellsOfLily) {
    TestModel m(models_dir() + "/stories260K");
    const std::vector<int> ids = m.greedy({1, 403, 407, 261, 378}, 60);
    std::string text;
    const auto tok = read_json_file(models_dir() + "/stories260K/tokenizer.json");
    std::vector<std::string> inv(512);
    for (auto& [s, id] : tok["model"]["vocab"].items()) inv[id.get<int>()] = s;
    for (int id : ids) text += inv[id];
    EXPECT_NE(text.find("little\xe2\x96\x81girl\xe2\x96\x81named\xe2\x96\x81Lily"), std::string::npos) << text;
}

// quant-tiny: llama.cpp's logits for its own GGUF files (f16 KV cache, 8-bit activations in
// quantized dot products), so the bounds are on the distributions. Each file is also held to
// the bf16 file's golden within llama.cpp's own distance for that type (fixtures README): a
// wrong block layout or scale lands at 1e-2 or more on both.
struct QuantCase {
    const char* type;
    double max_kl_vs_llama_cpp;
    double max_kl_vs_bf16;  // llama.cpp's own KL of this type against bf16, with 2x headroom
};

class QuantTinyTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(QuantTinyTest, KlAgainstLlamaCpp) {
    const QuantCase& c = GetParam();
    const std::string base = data_dir() + "/quant-tiny/qt-" + c.type;
    const auto golden = read_json_file(base + ".golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    TestModel m(base + ".gguf");
    const std::vector<float> ours = m.all_logits(prompt);
    const std::vector<float> ref = read_f32_file(base + ".logits.f32");
    ASSERT_EQ(ref.size(), ours.size());
    const LogitStats s = compare_logits(ref, ours, m.vocab());
    const LogitStats b = compare_logits(read_f32_file(data_dir() + "/quant-tiny/qt-bf16.logits.f32"), ours, m.vocab());
    std::printf("qt-%s: mean KL vs llama.cpp %.3g (argmax agreement %.3f), vs the bf16 golden %.3g\n", c.type,
                s.mean_kl, s.argmax_agree, b.mean_kl);
    EXPECT_LE(s.mean_kl, c.max_kl_vs_llama_cpp) << c.type;
    EXPECT_LE(b.mean_kl, c.max_kl_vs_bf16) << c.type;
}

INSTANTIATE_TEST_SUITE_P(Files, QuantTinyTest,
                         ::testing::Values(QuantCase{"bf16", 1e-3, 1e-5}, QuantCase{"q8_0", 1e-3, 2 * 8.9e-6},
                                           QuantCase{"q6_k", 1e-3, 2 * 5.6e-5}, QuantCase{"q4_k", 1e-3, 2 * 5.4e-4},
                                           QuantCase{"q4_0", 1e-3, 2 * 6.3e-4}),
                         [](const auto& info) { return std::string(info.param.type); });

}  // namespace
}  // namespace peregrine::testing
