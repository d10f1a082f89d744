#include "model/config_hf.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/registry.h"

namespace peregrine {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool HfConfig::has(const char* key) const {
    return j_.contains(key) && !j_[key].is_null();
}

int HfConfig::get_int(const char* key) const {
    if (!has(key)) fail(file_, ": missing key '", key, "'");
    if (!j_[key].is_number_integer()) fail(file_, ": key '", key, "' must be an integer");
    return j_[key].get<int>();
}

int HfConfig::get_int(const char* key, int dflt) const {
    return has(key) ? get_int(key) : dflt;
}

double HfConfig::get_num(const char* key) const {
    if (!has(key)) fail(file_, ": missing key '", key, "'");
    if (!j_[key].is_number()) fail(file_, ": key '", key, "' must be a number");
    return j_[key].get<double>();
}

double HfConfig::get_num(const char* key, double dflt) const {
    return has(key) ? get_num(key) : dflt;
}

bool HfConfig::get_bool(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j_[key].is_boolean()) fail(file_, ": key '", key, "' must be true or false");
    return j_[key].get<bool>();
}

bool HfConfig::has_layer_types() const {
    return j_.contains("layer_types") && j_["layer_types"].is_array();
}

void hf_window_on_every_layer(const HfConfig& file, ModelConfig& config) {
    const int window = file.get_int("sliding_window", 0);
    if (file.has_layer_types() || window <= 0) return;
    config.layer_window.assign(config.num_layers, window);
}

void hf_window_from_max_window_layers(const HfConfig& file, ModelConfig& config) {
    const int window = file.get_int("sliding_window", 0);
    if (file.has_layer_types() || window <= 0 || !file.get_bool("use_sliding_window", false)) return;
    const int from = std::max(file.get_int("max_window_layers", 0), 0);
    for (int i = from; i < config.num_layers; ++i) config.layer_window[i] = window;
}

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

void read_rope(const HfConfig& top, ModelConfig& cfg) {
    RopeConfig& rope = cfg.rope;
    // transformers >= 5 writes `rope_parameters` (theta inside); older files `rope_theta` + `rope_scaling`.
    const json* params = nullptr;
    if (top.has("rope_parameters"))
        params = &top.json()["rope_parameters"];
    else if (top.has("rope_scaling"))
        params = &top.json()["rope_scaling"];
    rope.theta = top.get_num("rope_theta", 10000.0);
    if (!params) return;
    if (!params->is_object()) fail(top.file(), ": rope parameters must be an object");
    const HfConfig p{*params, top.file() + " (rope parameters)"};
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
        fail(top.file(), ": rope type '", type, "' is not supported (default, linear, llama3, yarn)");
    }
}

// `layer_types` names each layer "sliding_attention" (window `sliding_window`) or
// "full_attention"; without it every layer starts full and the architecture's rule decides.
void read_layer_types(const HfConfig& r, ModelConfig& cfg) {
    const int window = r.get_int("sliding_window", 0);
    std::vector<int>& lw = cfg.layer_window;
    lw.assign(cfg.num_layers, 0);
    if (!r.has_layer_types()) return;
    const json& types = r.json()["layer_types"];
    if (static_cast<int>(types.size()) != cfg.num_layers)
        fail(r.file(), ": 'layer_types' has ", types.size(), " entries for ", cfg.num_layers, " layers");
    for (int i = 0; i < cfg.num_layers; ++i) {
        const std::string t = types[i].get<std::string>();
        if (t == "sliding_attention")
            lw[i] = window;
        else if (t != "full_attention")
            fail(r.file(), ": layer type '", t, "' is not supported");
    }
    if (window <= 0 && std::find(types.begin(), types.end(), "sliding_attention") != types.end())
        fail(r.file(), ": 'layer_types' has sliding layers but 'sliding_window' is not set");
}

ModelConfig::GenerationDefaults generation_defaults_of(const json& g, const std::string& file) {
    const HfConfig gr{g, file};
    ModelConfig::GenerationDefaults d;
    if (gr.has("temperature")) d.temperature = static_cast<float>(gr.get_num("temperature"));
    if (gr.has("top_p")) d.top_p = static_cast<float>(gr.get_num("top_p"));
    if (gr.has("min_p")) d.min_p = static_cast<float>(gr.get_num("min_p"));
    if (gr.has("repetition_penalty")) d.repetition_penalty = static_cast<float>(gr.get_num("repetition_penalty"));
    if (gr.has("top_k")) d.top_k = gr.get_int("top_k");
    return d;
}

void read_generation_config(const fs::path& gen, ModelConfig& cfg) {
    const json g = read_json(gen);
    if (g.contains("eos_token_id")) {
        std::vector<int> ids = read_ids(g["eos_token_id"], gen.string(), "eos_token_id");
        if (!ids.empty()) cfg.eos_token_ids = ids;
    }
    if (g.contains("bos_token_id") && g["bos_token_id"].is_number_integer()) cfg.bos_token_id = g["bos_token_id"];
    cfg.generation_defaults = generation_defaults_of(g, gen.string());
}

}  // namespace

ModelConfig::GenerationDefaults read_generation_defaults(const std::string& file) {
    return generation_defaults_of(read_json(file), file);
}

ModelConfig read_hf_config(const std::string& dir) {
    const fs::path path = fs::path(dir) / "config.json";
    const json j = read_json(path);
    const HfConfig r{j, path.string()};
    ModelConfig cfg;

    std::string model_type = j.value("model_type", "");
    if (model_type.empty() && j.contains("architectures") && j["architectures"].is_array() &&
        !j["architectures"].empty())
        model_type = j["architectures"][0].get<std::string>();
    const Architecture& arch = detect_architecture(ModelFormat::HuggingFace, model_type, path.string());
    cfg.arch = arch.name;

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
    cfg.attention_bias = r.get_bool("attention_bias", false);
    cfg.rope.rotary_dim = cfg.head_dim;
    read_rope(r, cfg);
    if (cfg.num_layers < 0) fail(path.string(), ": 'num_hidden_layers' must be positive, got ", cfg.num_layers);
    read_layer_types(r, cfg);
    if (arch.read_hf) arch.read_hf(r, cfg);

    cfg.bos_token_id =
        j.contains("bos_token_id") && j["bos_token_id"].is_number_integer() ? j["bos_token_id"].get<int>() : -1;
    if (j.contains("eos_token_id")) cfg.eos_token_ids = read_ids(j["eos_token_id"], path.string(), "eos_token_id");
    const fs::path gen = fs::path(dir) / "generation_config.json";
    if (fs::exists(gen)) read_generation_config(gen, cfg);
    cfg.validate(path.string());
    return cfg;
}

}  // namespace peregrine
