// End to end through GGUF: tests/data/llama3-tiny (a Hugging Face folder, llama3 rope scaling,
// bf16 weights) converted here the way llama.cpp's convert_hf_to_gguf.py does for the `llama`
// architecture, then loaded by Peregrine and held to transformers' logits and greedy tokens.
//
// Two things in that conversion change numbers, and the test shows that both matter:
//   - q_proj / k_proj rows permuted from Hugging Face's rotate-half order into Meta's
//     interleaved-pair order (which Peregrine rotates as pairs (2i, 2i+1) for this arch);
//   - llama3 rope scaling carried as the `rope_freqs.weight` tensor of per-pair factors
//     (Peregrine divides the inverse frequencies by them), with no scaling keys in the metadata.
// The same file without the permutation, or without rope_freqs, must not match.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "core/half.h"
#include "formats/safetensors.h"
#include "model/config_hf.h"
#include "model/rope.h"
#include "support/gguf_writer.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

struct ConvertOptions {
    bool permute_qk = true;  // Meta's interleaved q/k row order, as llama.cpp writes it
    bool rope_freqs = true;  // the llama3 `rope_freqs.weight` tensor
};

// llama.cpp's LlamaModel.generate_extra_tensors for rope_type llama3, in float32 as it runs in
// torch: inv_freq = 1 / theta^(2i/d); wavelen = 2π / inv_freq; factor 1 below
// old_ctx/high_freq_factor, `factor` above old_ctx/low_freq_factor, and in between
// 1 / ((1 - smooth) / factor + smooth) with smooth = (old_ctx/wavelen - low) / (high - low).
std::vector<float> llama3_rope_factors(const nlohmann::json& cfg) {
    const nlohmann::json& rs = cfg.at("rope_scaling");
    const int dim = cfg.at("head_dim").get<int>();
    const double theta = cfg.at("rope_theta").get<double>();
    const float factor = rs.at("factor").get<float>();
    const float low = rs.at("low_freq_factor").get<float>();
    const float high = rs.at("high_freq_factor").get<float>();
    const float old_ctx = rs.at("original_max_position_embeddings").get<float>();
    const float low_freq_wavelen = old_ctx / low;
    const float high_freq_wavelen = old_ctx / high;
    std::vector<float> out;
    for (int i = 0; i < dim / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
        const float freq = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
        const float wavelen = static_cast<float>(2 * std::numbers::pi) / freq;
        if (wavelen < high_freq_wavelen) {
            out.push_back(1.0f);
        } else if (wavelen > low_freq_wavelen) {
            out.push_back(factor);
        } else {
            const float smooth = (old_ctx / wavelen - low) / (high - low);
            out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
        }
    }
    return out;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    return {p, p + t.nbytes()};
}

// convert_hf_to_gguf.py's LlamaModel.permute: per head, rows [first half; second half] of
// rotate-half order become interleaved pairs: new row 2i + j = old row j * head_dim/2 + i.
std::vector<uint8_t> permute_to_interleaved(const Tensor& t, int head_dim) {
    const std::vector<uint8_t> in = bytes_of(t);
    std::vector<uint8_t> out(in.size());
    const size_t row = t.row_bytes();
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < t.rows() / head_dim; ++h)
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j)
                std::memcpy(out.data() + (h * head_dim + 2 * i + j) * row,
                            in.data() + (h * head_dim + j * half + i) * row, row);
    return out;
}

std::vector<float> to_f32(const Tensor& t) {
    std::vector<float> v(t.numel());
    if (t.dtype == DType::F32) {
        std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    } else {
        PG_CHECK(t.dtype == DType::BF16);
        for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(t.ptr<uint16_t>()[i]);
    }
    return v;
}

// HF tensor name -> GGUF name (llama.cpp's tensor map for the llama arch).
std::string gguf_name(const std::string& hf) {
    static const std::map<std::string, std::string> top = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                           {"model.norm.weight", "output_norm.weight"},
                                                           {"lm_head.weight", "output.weight"}};
    static const std::map<std::string, std::string> parts = {
        {"input_layernorm.weight", "attn_norm.weight"},    {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},      {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    if (auto it = top.find(hf); it != top.end()) return it->second;
    const std::string prefix = "model.layers.";
    PG_CHECK(hf.rfind(prefix, 0) == 0, "unexpected tensor ", hf);
    const size_t dot = hf.find('.', prefix.size());
    return "blk." + hf.substr(prefix.size(), dot - prefix.size()) + "." + parts.at(hf.substr(dot + 1));
}

// One HF tensor as the converter writes it: 1-D tensors (norms) as f32, matrices in their own
// dtype, q/k rows optionally permuted into Meta's order, dimensions innermost first.
struct GgufTensorData {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
};

GgufTensorData as_gguf_tensor(const std::string& hf_name, const Tensor& t, int head_dim, bool permute_qk) {
    GgufTensorData out{gguf_name(hf_name), GgmlType::F32, {}, {}};
    for (int d = t.ndim - 1; d >= 0; --d) out.ne.push_back(static_cast<uint64_t>(t.shape[d]));
    if (t.ndim == 1) {
        const std::vector<float> v = to_f32(t);
        out.data.resize(v.size() * sizeof(float));
        std::memcpy(out.data.data(), v.data(), out.data.size());
        return out;
    }
    PG_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, hf_name);
    out.type = t.dtype == DType::BF16 ? GgmlType::BF16 : GgmlType::F32;
    const bool qk =
        hf_name.find("q_proj.weight") != std::string::npos || hf_name.find("k_proj.weight") != std::string::npos;
    out.data = qk && permute_qk ? permute_to_interleaved(t, head_dim) : bytes_of(t);
    return out;
}

// Writes `hf_dir` as a GGUF v3 file of the `llama` arch at `out`.
void convert(const std::string& hf_dir, const std::string& out, const ConvertOptions& opt) {
    const nlohmann::json cfg = read_json_file(hf_dir + "/config.json");
    const nlohmann::json tok = read_json_file(hf_dir + "/tokenizer.json");
    const int head_dim = cfg.at("head_dim").get<int>();
    const int vocab = cfg.at("vocab_size").get<int>();

    GgufBuilder g;
    g.kv_str("general.architecture", "llama");
    g.kv_str("general.name", "llama3-tiny");
    g.kv_u32("general.file_type", 32);  // LLAMA_FTYPE_MOSTLY_BF16
    g.kv_u32("llama.context_length", cfg.at("max_position_embeddings").get<uint32_t>());
    g.kv_u32("llama.embedding_length", cfg.at("hidden_size").get<uint32_t>());
    g.kv_u32("llama.block_count", cfg.at("num_hidden_layers").get<uint32_t>());
    g.kv_u32("llama.feed_forward_length", cfg.at("intermediate_size").get<uint32_t>());
    g.kv_u32("llama.attention.head_count", cfg.at("num_attention_heads").get<uint32_t>());
    g.kv_u32("llama.attention.head_count_kv", cfg.at("num_key_value_heads").get<uint32_t>());
    g.kv_f32("llama.rope.freq_base", cfg.at("rope_theta").get<float>());
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", cfg.at("rms_norm_eps").get<float>());
    g.kv_u32("llama.attention.key_length", static_cast<uint32_t>(head_dim));
    g.kv_u32("llama.attention.value_length", static_cast<uint32_t>(head_dim));
    g.kv_u32("llama.vocab_size", static_cast<uint32_t>(vocab));
    g.kv_u32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));

    // The vocabulary in llama.cpp's `llama` (SentencePiece-style) form: tokens in id order, token
    // types (normal, unknown, control, byte); the scores are placeholders.
    std::vector<std::string> tokens(vocab);
    std::vector<int32_t> types(vocab, 1);  // normal
    for (const auto& [text, id] : tok.at("model").at("vocab").items()) {
        tokens.at(id.get<size_t>()) = text;
        if (text.size() == 6 && text.rfind("<0x", 0) == 0) types[id.get<size_t>()] = 6;  // byte
    }
    for (const auto& added : tok.at("added_tokens"))
        if (added.at("special").get<bool>()) types.at(added.at("id").get<size_t>()) = 3;  // control
    types.at(0) = 2;                                                                      // <unk>: unknown
    g.kv_str("tokenizer.ggml.model", "llama");
    g.kv_str_array("tokenizer.ggml.tokens", tokens);
    g.kv_f32_array("tokenizer.ggml.scores", std::vector<float>(vocab, -1000.0f));
    g.kv_i32_array("tokenizer.ggml.token_type", types);
    g.kv_u32("tokenizer.ggml.bos_token_id", cfg.at("bos_token_id").get<uint32_t>());
    g.kv_u32("tokenizer.ggml.eos_token_id", cfg.at("eos_token_id").get<uint32_t>());
    g.kv_u32("tokenizer.ggml.unknown_token_id", 0);
    g.kv_bool("tokenizer.ggml.add_bos_token", true);
    g.kv_bool("tokenizer.ggml.add_eos_token", false);

    if (opt.rope_freqs) {
        const std::vector<float> f = llama3_rope_factors(cfg);
        g.tensor_f32("rope_freqs.weight", {f.size()}, f);
    }
    const SafetensorsSet st = SafetensorsSet::open_dir(hf_dir);
    for (const auto& [name, e] : st.entries()) {
        GgufTensorData t = as_gguf_tensor(name, e.view, head_dim, opt.permute_qk);
        g.tensor(t.name, t.type, t.ne, std::move(t.data));
    }
    g.write(out);
}

class TempDir {
  public:
    TempDir() {
        std::string tmpl = ::testing::TempDir() + "pg_gguf_conv_XXXXXX";
        PG_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
        dir_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    std::string file(const std::string& name) const { return dir_ + "/" + name; }

  private:
    std::string dir_;
};

TEST(GgufConversion, Llama3TinyMatchesTransformersOnlyWithPermutedQkAndRopeFreqs) {
    const std::string hf = data_dir() + "/llama3-tiny";
    const auto golden = read_json_file(hf + "/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int> want_greedy = golden["greedy_ids"].get<std::vector<int>>();
    const std::vector<float> ref = read_f32_file(hf + "/logits.f32");
    TempDir tmp;

    // --- the file as llama.cpp's converter writes it ---
    const std::string path = tmp.file("llama3-tiny.gguf");
    convert(hf, path, {});
    if (HasFatalFailure()) return;
    TestModel m(path);
    const ModelConfig& c = m.loaded->config;
    ASSERT_EQ(m.loaded->format, "gguf");
    EXPECT_EQ(c.arch, "llama");
    EXPECT_EQ(c.rope.style, RopeStyle::Interleaved);
    EXPECT_EQ(c.rope.scaling, RopeScaling::None);  // llama3 scaling only through rope_freqs
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.rope.freq_factors, llama3_rope_factors(read_json_file(hf + "/config.json")));

    // The inverse frequencies the two routes reach: HF's llama3 formula (HF folder) and
    // theta^(-2i/d) / rope_freqs (GGUF).
    const RopeTable from_hf = make_rope_table(read_hf_config(hf).rope);
    const RopeTable from_gguf = make_rope_table(c.rope);
    ASSERT_EQ(from_hf.inv_freq.size(), from_gguf.inv_freq.size());
    double max_rel = 0;
    for (size_t i = 0; i < from_hf.inv_freq.size(); ++i) {
        const double rel = std::fabs(static_cast<double>(from_gguf.inv_freq[i]) - from_hf.inv_freq[i]) /
                           std::fabs(static_cast<double>(from_hf.inv_freq[i]));
        std::printf("  pair %zu: rope_freqs %.9g, inv_freq HF %.9g, GGUF %.9g (rel diff %.3g)\n", i,
                    c.rope.freq_factors[i], from_hf.inv_freq[i], from_gguf.inv_freq[i], rel);
        max_rel = std::max(max_rel, rel);
    }
    EXPECT_LE(max_rel, 1e-6);  // a few float ulps at most

    ASSERT_EQ(ref.size(), prompt.size() * m.vocab());
    const LogitStats s = compare_logits(ref, m.all_logits(prompt), m.vocab());
    std::printf("converted: max |dlogit| %.3g, mean KL %.3g, argmax mismatches %zu/%zu\n", s.max_abs_diff, s.mean_kl,
                s.argmax_mismatches, prompt.size());
    EXPECT_LE(s.max_abs_diff, 1e-3);
    EXPECT_EQ(s.argmax_mismatches, 0u);
    EXPECT_LE(s.mean_kl, 1e-6);
    EXPECT_EQ(m.greedy(prompt, static_cast<int>(want_greedy.size())), want_greedy);

    // --- negative controls: each mechanism on its own is needed ---
    struct Control {
        const char* what;
        ConvertOptions opt;
    };
    for (const Control& ctl : {Control{"q/k rows left in HF order", {.permute_qk = false, .rope_freqs = true}},
                               Control{"no rope_freqs tensor", {.permute_qk = true, .rope_freqs = false}}}) {
        const std::string p = tmp.file(std::string("control-") + (ctl.opt.permute_qk ? "a" : "b") + ".gguf");
        convert(hf, p, ctl.opt);
        if (HasFatalFailure()) return;
        TestModel bad(p);
        EXPECT_EQ(bad.loaded->config.rope.freq_factors.empty(), !ctl.opt.rope_freqs) << ctl.what;
        const LogitStats b = compare_logits(ref, bad.all_logits(prompt), bad.vocab());
        std::printf("control (%s): max |dlogit| %.3g, mean KL %.3g, argmax mismatches %zu/%zu\n", ctl.what,
                    b.max_abs_diff, b.mean_kl, b.argmax_mismatches, prompt.size());
        EXPECT_GT(b.max_abs_diff, 1e-2) << ctl.what;
    }
}

// The tensor conversion above against llama.cpp's own: stories260K.gguf is llama.cpp's file of
// the weights in models/stories260K (f32), so every tensor converted here from that folder must
// equal the one in the file, bytes and shape, q/k permutation included.
TEST(GgufConversion, TensorsMatchLlamaCppOnStories260K) {
    const std::string hf = models_dir() + "/stories260K";
    const int head_dim = read_json_file(hf + "/config.json").at("head_dim").get<int>();
    const SafetensorsSet st = SafetensorsSet::open_dir(hf);
    const GgufFile ref(data_dir() + "/stories260K.gguf");
    size_t compared = 0, permuted = 0;
    for (const auto& [name, e] : st.entries()) {
        const GgufTensorData t = as_gguf_tensor(name, e.view, head_dim, true);
        const GgufTensorInfo* info = ref.find_tensor(t.name);
        ASSERT_NE(info, nullptr) << t.name;
        EXPECT_EQ(info->dtype, t.type == GgmlType::BF16 ? DType::BF16 : DType::F32) << t.name;
        EXPECT_EQ(info->shape, std::vector<int64_t>(t.ne.rbegin(), t.ne.rend())) << t.name;
        ASSERT_EQ(info->nbytes, t.data.size()) << t.name;
        EXPECT_EQ(std::memcmp(info->data, t.data.data(), t.data.size()), 0) << t.name;
        // ...and the unpermuted q/k rows must differ, or the check above proves nothing.
        if (t.name.find("attn_q") != std::string::npos || t.name.find("attn_k") != std::string::npos) {
            EXPECT_NE(std::memcmp(info->data, e.view.data, t.data.size()), 0) << t.name;
            ++permuted;
        }
        ++compared;
    }
    EXPECT_EQ(compared, ref.tensors().size());
    EXPECT_EQ(permuted, 10u);
}

}  // namespace
}  // namespace peregrine::testing
