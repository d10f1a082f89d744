// What the llama-like architectures (llama, mistral, qwen2, qwen3) share: the tensor names of
// both layouts and the one decoder body that runs them (model/llama.h). An architecture of
// this family is a file next to this one whose entry points here.
#pragma once

#include <memory>

#include "model/loader.h"
#include "model/model.h"
#include "model/weight_names.h"

namespace peregrine {

class Backend;
class Communicator;
struct ModelParallel;

// transformers' names: "model.layers.<i>.self_attn.q_proj.weight", ...
extern const WeightNames kLlamaHfWeights;
// llama.cpp's names: "blk.<i>.attn_q.weight", ...
extern const WeightNames kLlamaGgufWeights;

// LlamaModel over `loaded` (which must outlive it); its config's flags (attention_bias, qk_norm,
// layer windows, rope) select what each layer does.
std::unique_ptr<Model> build_llama_decoder(const LoadedModel& loaded, Backend& backend, const ModelParallel& par);

}  // namespace peregrine
