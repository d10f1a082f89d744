// The pooling an embedding model's folder asks for, in sentence-transformers' files: modules.json
// lists the modules in order (Transformer, Pooling, optionally Normalize, ...), the Pooling
// module's folder holds config.json with one pooling_mode_* flag set.
#pragma once

#include <optional>
#include <string>

#include "peregrine/engine_config.h"
#include "peregrine/engine_types.h"

namespace peregrine {

struct FolderPooling {
    std::optional<PoolingType> type;  // unset: modules.json names no Pooling module
    bool normalize = false;           // a sentence_transformers.models.Normalize module follows
};

// Unset when `dir` has no modules.json. Throws Error naming the file for unreadable JSON or a
// pooling mode other than last token, mean or cls (max, weighted mean, mean-sqrt-len).
std::optional<FolderPooling> read_folder_pooling(const std::string& dir);

// EngineConfig::task embed's pooling: config.pooling_type / normalize where set, else the
// folder's (read_folder_pooling of `model_dir`, may be empty), else last token for qwen3 (the
// Qwen3-Embedding models) and mean otherwise; normalised when config.normalize says so, else when
// the folder's modules.json lists Normalize, else (no modules.json) always. `source` says which
// decided the type.
PoolingParams resolve_pooling(const EngineConfig& config, const std::string& model_dir, const std::string& arch,
                              std::string* source);

}  // namespace peregrine
