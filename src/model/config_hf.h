// Hugging Face config.json (+ generation_config.json) → ModelConfig. The keys every
// architecture shares are read here; the architecture's read_hf hook (model/architecture.h)
// adds its own facts.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/model_config.h"

namespace peregrine {

// `dir` is a model folder. Throws Error naming the file and key on anything missing or unknown.
ModelConfig read_hf_config(const std::string& dir);

// The sampling defaults of a generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty; unset where absent). Throws Error naming the file and key.
ModelConfig::GenerationDefaults read_generation_defaults(const std::string& file);

// Typed access to a JSON object that names the file and key on failure, e.g.
// "<dir>/config.json: missing key 'hidden_size'".
class HfConfig {
  public:
    HfConfig(const nlohmann::json& object, std::string file) : j_(object), file_(std::move(file)) {}

    const nlohmann::json& json() const { return j_; }
    const std::string& file() const { return file_; }

    bool has(const char* key) const;  // present and not null
    int get_int(const char* key) const;
    int get_int(const char* key, int dflt) const;
    double get_num(const char* key) const;
    double get_num(const char* key, double dflt) const;
    bool get_bool(const char* key, bool dflt) const;
    // Whether `layer_types` lists each layer's attention kind (it then decides the windows).
    bool has_layer_types() const;

  private:
    const nlohmann::json& j_;
    std::string file_;
};

// Sliding-window rules for read_hf hooks, applied when config.json has no `layer_types` and
// sets `sliding_window`. Every layer gets the window (llama, mistral):
void hf_window_on_every_layer(const HfConfig& file, ModelConfig& config);
// Only when `use_sliding_window` is true, from layer `max_window_layers` on (qwen2, qwen3):
void hf_window_from_max_window_layers(const HfConfig& file, ModelConfig& config);

}  // namespace peregrine
