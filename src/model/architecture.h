// One model architecture: the names files give it, the facts of its config, where its tensors
// are, and what runs it. Each is defined in src/model/arch/<name>.cc and registered by one line
// in src/model/registry.cc.
#pragma once

#include <array>
#include <memory>

#include "model/weight_names.h"

namespace peregrine {

class Backend;
class Communicator;
class HfConfig;
class Model;
struct ModelParallel;
struct GgufConfig;
struct LoadedModel;
struct ModelConfig;

struct Architecture {
    // The name in messages, in ModelConfig::arch and in the load summary, e.g. "qwen2".
    const char* name;
    // How files name it: config.json's `model_type` (or, without one, `architectures[0]`) and
    // GGUF's `general.architecture`. Slots left out are null.
    std::array<const char*, 4> hf_names;
    std::array<const char*, 4> gguf_names;

    // What this architecture adds to the keys every architecture shares (model/config_hf.cc,
    // model/config_gguf.cc read those first; the config is validated after). Null: nothing.
    void (*read_hf)(const HfConfig& file, ModelConfig& config);
    void (*read_gguf)(const GgufConfig& file, ModelConfig& config);

    // Tensor names in each layout.
    const WeightNames* hf_weights;
    const WeightNames* gguf_weights;

    // The forward pass over `loaded`'s weights, which `backend` places; `loaded` must outlive it.
    std::unique_ptr<Model> (*build)(const LoadedModel& loaded, Backend& backend, const ModelParallel& par);
};

}  // namespace peregrine
