// Models named as Hugging Face repo ids ("org/name", as `vllm serve org/name`), found in the
// local Hugging Face cache: nothing is downloaded at run time.
#pragma once

#include <string>

namespace peregrine {

// The Hugging Face hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
std::string hf_hub_cache_dir();

// `model` unchanged when it is a local path (or empty, or not of the form org/name); else the
// snapshot folder of that repo in the cache (the revision refs/main names, else the newest
// snapshot). Throws Error saying how to download it when the repo is not in the cache.
std::string resolve_model_path(const std::string& model);

}  // namespace peregrine
