#include "formats/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace peregrine {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& p) {
    std::ifstream in(p);
    if (!in) fail(p.string(), ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        fail(p.string(), ": invalid JSON: ", e.what());
    }
}

// Typed access that names the file and key on failure.
struct Reader {
    const json& j;
    std::string file;

    bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

    int get_int(const char* key) const {
        if (!has(key)) fail(file, ": missing key '", key, "'");
        if (!j[key].is_number_integer()) fail(file, ": key '", key, "' must be an integer");
        return j[key].get<int>();
    }
    int get_int(const char* key, int dflt) const { return has(key) ? get_int(key) : dflt; }
    double get_num(const char* key) const {
        if (!has(key)) fail(file, ": missing key '", key, "'");
        if (!j[key].is_number()) fail(file, ": key '", key, "' must be a number");
        return j[key].get<double>();
    }
    double get_num(const char* key, double dflt) const { return has(key) ? get_num(key) : dflt; }
    bool get_bool(const char* key, bool dflt) const {
        if (!has(key)) return dflt;
        if (!j[key].is_boolean()) fail(file, ": key '", key, "' must be true or false");
        return j[key].get<bool>();
    }
};

// eos_token_id may be an integer or a list of them.
std::vector<int> read_ids(const json& v, const std::string& file, const char* key) {
    std::vector<int> ids;
    if (v.is_number_integer()) {
        ids.push_back(v.get<int>());
    } else if (v.is_array()) {
        for (const auto& x : v) {
            if (!x.is_number_integer()) fail(file, ": '", key, "' must hold integers");
            ids.push_back(x.get<int>());
        }
    } else if (!v.is_null()) {
        fail(file, ": '", key, "' must be an integer or a list of integers");
    }
    return ids;
}

void read_rope(const Reader& top, ModelConfig& cfg) {
    RopeConfig& rope = cfg.rope;
    // transformers >= 5 writes `rope_parameters` (theta inside); older files `rope_theta` + `rope_scaling`.
    const json* params = nullptr;
    if (top.has("rope_parameters"))
        params = &top.j["rope_parameters"];
    else if (top.has("rope_scaling"))
        params = &top.j["rope_scaling"];
    rope.theta = top.get_num("rope_theta", 10000.0);
    if (!params) return;
    if (!params->is_object()) fail(top.file, ": rope parameters must be an object");
    const Reader p{*params, top.file + " (rope parameters)"};
    rope.theta = p.get_num("rope_theta", rope.theta);
    std::string type = "default";
    if (p.has("rope_type"))
        type = (*params)["rope_type"].get<std::string>();
    else if (p.has("type"))
        type = (*params)["type"].get<std::string>();
    const double partial = p.get_num("partial_rotary_factor", top.get_num("partial_rotary_factor", 1.0));
    rope.rotary_dim = static_cast<int>(cfg.head_dim * partial);
    if (type == "default") return;
    rope.factor = p.get_num("factor");
    if (type == "linear") {
        rope.scaling = RopeScaling::Linear;
    } else if (type == "llama3") {
        rope.scaling = RopeScaling::Llama3;
        rope.low_freq_factor = p.get_num("low_freq_factor");
        rope.high_freq_factor = p.get_num("high_freq_factor");
        rope.original_max_position = p.get_int("original_max_position_embeddings");
    } else if (type == "yarn") {
        rope.scaling = RopeScaling::Yarn;
        rope.original_max_position =
            p.get_int("original_max_position_embeddings", top.get_int("max_position_embeddings", 0));
        rope.beta_fast = p.get_num("beta_fast", 32.0);
        rope.beta_slow = p.get_num("beta_slow", 1.0);
        rope.attention_factor = p.get_num("attention_factor", -1.0);
        rope.mscale = p.get_num("mscale", 0.0);
        rope.mscale_all_dim = p.get_num("mscale_all_dim", 0.0);
        rope.truncate = p.get_bool("truncate", true);
    } else {
        fail(top.file, ": rope type '", type, "' is not supported (default, linear, llama3, yarn)");
    }
}

}  // namespace

ModelConfig read_hf_config(const std::string& dir) {
    const fs::path path = fs::path(dir) / "config.json";
    const json j = read_json(path);
    const Reader r{j, path.string()};
    ModelConfig cfg;

    std::string model_type = j.value("model_type", "");
    if (model_type.empty() && j.contains("architectures") && j["architectures"].is_array() &&
        !j["architectures"].empty())
        model_type = j["architectures"][0].get<std::string>();
    cfg.arch_name = model_type;
    if (model_type == "llama" || model_type == "LlamaForCausalLM")
        cfg.arch = Arch::Llama;
    else if (model_type == "mistral" || model_type == "MistralForCausalLM")
        cfg.arch = Arch::Mistral;
    else if (model_type == "qwen2" || model_type == "Qwen2ForCausalLM")
        cfg.arch = Arch::Qwen2;
    else if (model_type == "qwen3" || model_type == "Qwen3ForCausalLM")
        cfg.arch = Arch::Qwen3;
    else
        fail(path.string(), ": model_type '", model_type, "' is not supported (llama, mistral, qwen2, qwen3)");

    cfg.vocab_size = r.get_int("vocab_size");
    cfg.hidden_size = r.get_int("hidden_size");
    cfg.intermediate_size = r.get_int("intermediate_size");
    cfg.num_layers = r.get_int("num_hidden_layers");
    cfg.num_heads = r.get_int("num_attention_heads");
    cfg.num_kv_heads = r.get_int("num_key_value_heads", cfg.num_heads);
    if (cfg.num_heads <= 0) fail(path.string(), ": 'num_attention_heads' must be positive");
    cfg.head_dim = r.get_int("head_dim", cfg.hidden_size / cfg.num_heads);
    cfg.max_position_embeddings = r.get_int("max_position_embeddings", 4096);
    cfg.rms_norm_eps = static_cast<float>(r.get_num("rms_norm_eps", 1e-6));
    cfg.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
    const std::string act = j.value("hidden_act", "silu");
    if (act != "silu") fail(path.string(), ": hidden_act '", act, "' is not supported (silu)");

    cfg.attention_bias = cfg.arch == Arch::Qwen2 ? true : r.get_bool("attention_bias", false);
    cfg.qk_norm = cfg.arch == Arch::Qwen3;
    cfg.rope.rotary_dim = cfg.head_dim;
    read_rope(r, cfg);

    // Sliding windows: mistral applies `sliding_window` to every layer; qwen2/3 only when
    // `use_sliding_window`, from layer `max_window_layers` on; `layer_types` overrides both.
    int window = r.get_int("sliding_window", 0);
    std::vector<int>& lw = cfg.layer_window;
    lw.assign(cfg.num_layers, 0);
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
        const json& types = j["layer_types"];
        if (static_cast<int>(types.size()) != cfg.num_layers)
            fail(path.string(), ": 'layer_types' has ", types.size(), " entries for ", cfg.num_layers, " layers");
        for (int i = 0; i < cfg.num_layers; ++i) {
            const std::string t = types[i].get<std::string>();
            if (t == "sliding_attention")
                lw[i] = window;
            else if (t != "full_attention")
                fail(path.string(), ": layer type '", t, "' is not supported");
        }
        if (window <= 0 && std::find(types.begin(), types.end(), "sliding_attention") != types.end())
            fail(path.string(), ": 'layer_types' has sliding layers but 'sliding_window' is not set");
    } else if (window > 0) {
        if (cfg.arch == Arch::Qwen2 || cfg.arch == Arch::Qwen3) {
            if (r.get_bool("use_sliding_window", false)) {
                const int from = r.get_int("max_window_layers", 0);
                for (int i = from; i < cfg.num_layers; ++i) lw[i] = window;
            }
        } else {
            lw.assign(cfg.num_layers, window);
        }
    }

    cfg.bos_token_id =
        j.contains("bos_token_id") && j["bos_token_id"].is_number_integer() ? j["bos_token_id"].get<int>() : -1;
    if (j.contains("eos_token_id")) cfg.eos_token_ids = read_ids(j["eos_token_id"], path.string(), "eos_token_id");
    const fs::path gen = fs::path(dir) / "generation_config.json";
    if (fs::exists(gen)) {
        const json g = read_json(gen);
        if (g.contains("eos_token_id")) {
            std::vector<int> ids = read_ids(g["eos_token_id"], gen.string(), "eos_token_id");
            if (!ids.empty()) cfg.eos_token_ids = ids;
        }
        if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) cfg.bos_token_id = g["bos_token_id"];
        const Reader gr{g, gen.string()};
        auto& d = cfg.generation_defaults;
        if (gr.has("temperature")) d.temperature = static_cast<float>(gr.get_num("temperature"));
        if (gr.has("top_p")) d.top_p = static_cast<float>(gr.get_num("top_p"));
        if (gr.has("min_p")) d.min_p = static_cast<float>(gr.get_num("min_p"));
        if (gr.has("repetition_penalty")) d.repetition_penalty = static_cast<float>(gr.get_num("repetition_penalty"));
        if (gr.has("top_k")) d.top_k = gr.get_int("top_k");
    }
    cfg.validate(path.string());
    return cfg;
}

}  // namespace peregrine
