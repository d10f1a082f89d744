// The registry: every architecture Peregrine runs (model/architecture.h), found by the name a
// file gives it, and the forward pass built from a loaded model.
#pragma once

#include <memory>
#include <string>

#include "model/architecture.h"
#include "model/loader.h"
#include "model/model.h"

namespace peregrine {

class Backend;

// Where an architecture's name was read.
enum class ModelFormat {
    HuggingFace,  // config.json's `model_type`, or `architectures[0]` without one
    Gguf,         // `general.architecture`
};

// The one architecture detection, for both formats. Throws Error
// "<file>: <key> '<name>' is not supported (llama, mistral, ...)" when no entry knows `name`.
const Architecture& detect_architecture(ModelFormat format, const std::string& name, const std::string& file);

// The entry called `name` (ModelConfig::arch, as detection set it); throws Error when none is.
const Architecture& architecture_named(const std::string& name);

// The forward pass of `loaded`'s architecture on `backend` (which places the weights).
// `loaded` must outlive the result; so must the groups of `par` (model.h: the tensor-parallel
// group `loaded` was sharded for, the pipeline stages).
std::unique_ptr<Model> create_model(const LoadedModel& loaded, Backend& backend, const ModelParallel& par = {});

}  // namespace peregrine
