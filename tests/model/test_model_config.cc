// config.json variants → ModelConfig, and the rope tables every scaling kind produces.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config_hf.h"
#include "model/registry.h"
#include "model/rope.h"

namespace peregrine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class HfConfigTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("pg-config-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    ModelConfig read(json cfg) {
        json base = {{"model_type", "llama"},    {"vocab_size", 100},      {"hidden_size", 64},
                     {"intermediate_size", 128}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                     {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5}};
        base.update(cfg);
        std::ofstream(dir_ / "config.json") << base.dump();
        return read_hf_config(dir_.string());
    }

    fs::path dir_;
};

TEST_F(HfConfigTest, Defaults) {
    const ModelConfig c = read(json::object());
    EXPECT_EQ(c.arch, "llama");
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.rope.rotary_dim, 16);
    EXPECT_EQ(c.rope.theta, 10000.0);
    EXPECT_EQ(c.rope.scaling, RopeScaling::None);
    EXPECT_EQ(c.layer_window, std::vector<int>(4, 0));
    EXPECT_FALSE(c.attention_bias);
    EXPECT_FALSE(c.qk_norm);
}

TEST_F(HfConfigTest, ClassicRopeScalingAndNewRopeParameters) {
    const json scaling = {{"rope_type", "llama3"},
                          {"factor", 8.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
    const ModelConfig classic = read({{"rope_theta", 500000.0}, {"rope_scaling", scaling}});
    json params = scaling;
    params["rope_theta"] = 500000.0;
    const ModelConfig v5 = read({{"rope_parameters", params}});
    for (const ModelConfig* c : {&classic, &v5}) {
        EXPECT_EQ(c->rope.theta, 500000.0);
        EXPECT_EQ(c->rope.scaling, RopeScaling::Llama3);
        EXPECT_EQ(c->rope.factor, 8.0);
        EXPECT_EQ(c->rope.original_max_position, 8192);
    }
    // The legacy "type" key and rope_type "default" inside rope_parameters.
    EXPECT_EQ(read({{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}).rope.scaling, RopeScaling::Linear);
    EXPECT_EQ(read({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}}}).rope.theta, 1e6);
}

TEST_F(HfConfigTest, SlidingWindows) {
    EXPECT_EQ(read({{"model_type", "mistral"}, {"sliding_window", 4096}}).layer_window, std::vector<int>(4, 4096));
    EXPECT_EQ(read({{"model_type", "mistral"}, {"sliding_window", nullptr}}).layer_window, std::vector<int>(4, 0));
    // qwen2 ignores sliding_window unless use_sliding_window, then from max_window_layers on.
    EXPECT_EQ(read({{"model_type", "qwen2"}, {"sliding_window", 32}}).layer_window, std::vector<int>(4, 0));
    EXPECT_EQ(
        read({{"model_type", "qwen2"}, {"sliding_window", 32}, {"use_sliding_window", true}, {"max_window_layers", 2}})
            .layer_window,
        (std::vector<int>{0, 0, 32, 32}));
    EXPECT_EQ(read({{"sliding_window", 8},
                    {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}})
                  .layer_window,
              (std::vector<int>{8, 0, 8, 0}));
}

TEST_F(HfConfigTest, QwenFlagsAndEos) {
    const ModelConfig q2 = read({{"model_type", "qwen2"}, {"eos_token_id", json::array({7, 9})}});
    EXPECT_TRUE(q2.attention_bias);
    EXPECT_EQ(q2.eos_token_ids, (std::vector<int>{7, 9}));
    const ModelConfig q3 = read({{"model_type", "qwen3"}, {"head_dim", 32}});
    EXPECT_TRUE(q3.qk_norm);
    EXPECT_EQ(q3.q_dim(), 128);  // heads x head_dim need not equal hidden
    std::ofstream(dir_ / "generation_config.json") << R"({"eos_token_id": [3, 4], "temperature": 0.6, "top_k": 20})";
    const ModelConfig g = read({{"eos_token_id", 2}});
    EXPECT_EQ(g.eos_token_ids, (std::vector<int>{3, 4}));
    EXPECT_FLOAT_EQ(*g.generation_defaults.temperature, 0.6f);
    EXPECT_EQ(*g.generation_defaults.top_k, 20);
    EXPECT_FALSE(g.generation_defaults.top_p.has_value());
}

TEST_F(HfConfigTest, Errors) {
    EXPECT_THROW(read({{"num_attention_heads", 3}}), Error);  // 2 kv heads do not divide 3
    EXPECT_THROW(read({{"hidden_act", "gelu"}}), Error);
    EXPECT_THROW(read({{"vocab_size", "100"}}), Error);
    EXPECT_THROW(read({{"rope_scaling", {{"rope_type", "yarn"}}}}), Error);  // no factor
    std::ofstream(dir_ / "config.json") << "{not json";
    EXPECT_THROW(read_hf_config(dir_.string()), Error);
}

TEST_F(HfConfigTest, ArchitectureByModelTypeOrClassName) {
    EXPECT_EQ(read({{"model_type", "qwen3"}}).arch, "qwen3");
    EXPECT_EQ(read({{"model_type", ""}, {"architectures", {"MistralForCausalLM"}}}).arch, "mistral");
    try {
        read({{"model_type", "gpt_neox"}});
        FAIL() << "gpt_neox was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), (dir_ / "config.json").string() +
                                             ": model_type 'gpt_neox' is not supported (llama, mistral, qwen2, qwen3)");
    }
}

// Detection is one function for both formats; each entry names its weights in both layouts.
TEST(ModelRegistry, DetectsEveryArchitectureInBothFormats) {
    for (const char* name : {"llama", "mistral", "qwen2", "qwen3"}) {
        const Architecture& hf = detect_architecture(ModelFormat::HuggingFace, name, "config.json");
        EXPECT_EQ(&detect_architecture(ModelFormat::Gguf, name, "m.gguf"), &hf);
        EXPECT_EQ(&architecture_named(name), &hf);
        EXPECT_STREQ(hf.name, name);
        ASSERT_NE(hf.hf_weights, nullptr);
        ASSERT_NE(hf.gguf_weights, nullptr);
        ASSERT_NE(hf.build, nullptr);
    }
    EXPECT_STREQ(detect_architecture(ModelFormat::HuggingFace, "Qwen2ForCausalLM", "config.json").name, "qwen2");
    EXPECT_EQ(architecture_named("llama").hf_weights->in_layer(3, architecture_named("llama").hf_weights->layer.wq),
              "model.layers.3.self_attn.q_proj.weight");
    EXPECT_EQ(
        architecture_named("qwen3").gguf_weights->in_layer(0, architecture_named("qwen3").gguf_weights->layer.k_norm),
        "blk.0.attn_k_norm.weight");
    try {
        detect_architecture(ModelFormat::Gguf, "bloom", "m.gguf");
        FAIL() << "bloom was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "m.gguf: general.architecture 'bloom' is not supported (llama, mistral, qwen2, qwen3)");
    }
    // Hugging Face class names are not GGUF names.
    EXPECT_THROW(detect_architecture(ModelFormat::Gguf, "LlamaForCausalLM", "m.gguf"), Error);
    EXPECT_THROW(architecture_named("bloom"), Error);
}

constexpr double kPi = 3.14159265358979323846;

TEST(RopeTable, NoneAndLinear) {
    RopeConfig r;
    r.rotary_dim = 8;
    r.theta = 10000;
    const RopeTable t = make_rope_table(r);
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(t.inv_freq[i], 1.0 / std::pow(10000.0, 2.0 * i / 8));
    r.scaling = RopeScaling::Linear;
    r.factor = 4;
    const RopeTable lin = make_rope_table(r);
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(lin.inv_freq[i], t.inv_freq[i] / 4);
    EXPECT_EQ(lin.attention_factor, 1.0f);
}

TEST(RopeTable, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
    RopeConfig r;
    r.rotary_dim = 64;
    r.theta = 500000;
    r.scaling = RopeScaling::Llama3;
    r.factor = 8;
    r.low_freq_factor = 1;
    r.high_freq_factor = 4;
    r.original_max_position = 8192;
    RopeConfig plain = r;
    plain.scaling = RopeScaling::None;
    const RopeTable t = make_rope_table(r), base = make_rope_table(plain);
    for (int i = 0; i < 32; ++i) {
        const double wavelen = 2 * kPi / base.inv_freq[i];
        if (wavelen < 8192 / 4.0)
            EXPECT_EQ(t.inv_freq[i], base.inv_freq[i]) << i;
        else if (wavelen > 8192)
            EXPECT_FLOAT_EQ(t.inv_freq[i], base.inv_freq[i] / 8) << i;
        else
            EXPECT_TRUE(t.inv_freq[i] < base.inv_freq[i] && t.inv_freq[i] > base.inv_freq[i] / 8) << i;
    }
}

TEST(RopeTable, YarnBlendsAndScalesAttention) {
    RopeConfig r;
    r.rotary_dim = 128;
    r.theta = 1000000;
    r.scaling = RopeScaling::Yarn;
    r.factor = 4;
    r.original_max_position = 32768;
    RopeConfig plain = r;
    plain.scaling = RopeScaling::None;
    const RopeTable t = make_rope_table(r), base = make_rope_table(plain);
    EXPECT_FLOAT_EQ(t.attention_factor, static_cast<float>(0.1 * std::log(4.0) + 1.0));
    // Dims below the correction range keep their frequency, dims above are divided by factor.
    const double low = std::floor(128 * std::log(32768 / (32 * 2 * kPi)) / (2 * std::log(1e6)));
    const double high = std::ceil(128 * std::log(32768 / (1 * 2 * kPi)) / (2 * std::log(1e6)));
    for (int i = 0; i < 64; ++i) {
        if (i <= low)
            EXPECT_FLOAT_EQ(t.inv_freq[i], base.inv_freq[i]) << i;
        else if (i >= high)
            EXPECT_FLOAT_EQ(t.inv_freq[i], base.inv_freq[i] / 4) << i;
        else
            EXPECT_TRUE(t.inv_freq[i] < base.inv_freq[i] && t.inv_freq[i] > base.inv_freq[i] / 4) << i;
    }
    r.attention_factor = 1.5;  // an explicit value wins
    EXPECT_FLOAT_EQ(make_rope_table(r).attention_factor, 1.5f);
}

TEST(RopeTable, GgufFreqFactorsDivide) {
    RopeConfig r;
    r.rotary_dim = 4;
    r.freq_factors = {1.0f, 8.0f};
    const RopeTable t = make_rope_table(r);
    EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
    EXPECT_FLOAT_EQ(t.inv_freq[1], 0.01f / 8);
}

}  // namespace
}  // namespace peregrine
