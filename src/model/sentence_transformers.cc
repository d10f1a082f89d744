#include "model/sentence_transformers.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace peregrine {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const fs::path& file) {
    std::ifstream in(file);
    if (!in) fail("cannot read ", file.string());
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded()) fail(file.string(), " is not valid JSON");
    return j;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

PoolingType pooling_mode(const fs::path& file) {
    const json c = read_json(file);
    auto on = [&](const char* key) { return c.contains(key) && c[key].is_boolean() && c[key].get<bool>(); };
    if (on("pooling_mode_lasttoken")) return PoolingType::Last;
    if (on("pooling_mode_mean_tokens")) return PoolingType::Mean;
    if (on("pooling_mode_cls_token")) return PoolingType::Cls;
    for (const char* other :
         {"pooling_mode_max_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_mean_sqrt_len_tokens"})
        if (on(other))
            fail(file.string(), " asks for ", other, ", which is not supported (last token, mean or cls); ",
                 "pass --pooling-type to choose one");
    fail(file.string(), " sets no pooling mode (pooling_mode_lasttoken, _mean_tokens or _cls_token)");
}

}  // namespace

std::optional<FolderPooling> read_folder_pooling(const std::string& dir) {
    if (dir.empty()) return std::nullopt;
    const fs::path modules = fs::path(dir) / "modules.json";
    std::error_code ec;
    if (!fs::exists(modules, ec)) return std::nullopt;
    const json list = read_json(modules);
    if (!list.is_array()) fail(modules.string(), " is not a list of modules");
    FolderPooling out;
    for (const json& m : list) {
        const std::string type = m.value("type", "");
        if (ends_with(type, ".Pooling")) {
            out.type = pooling_mode(fs::path(dir) / m.value("path", "") / "config.json");
        } else if (ends_with(type, ".Normalize")) {
            out.normalize = true;
        }
    }
    return out;
}

PoolingParams resolve_pooling(const EngineConfig& config, const std::string& model_dir, const std::string& arch,
                              std::string* source) {
    const std::optional<FolderPooling> folder = read_folder_pooling(model_dir);
    PoolingParams p;
    if (!config.pooling_type.empty()) {
        p.type = config.pooling_type == "mean"  ? PoolingType::Mean
                 : config.pooling_type == "cls" ? PoolingType::Cls
                                                : PoolingType::Last;
        *source = "--pooling-type";
    } else if (folder && folder->type) {
        p.type = *folder->type;
        *source = "modules.json";
    } else {
        p.type = arch == "qwen3" ? PoolingType::Last : PoolingType::Mean;
        *source = "default for " + arch;
    }
    // A folder with modules.json normalises exactly when it lists a Normalize module.
    p.normalize = config.normalize >= 0 ? config.normalize == 1 : folder ? folder->normalize : true;
    return p;
}

}  // namespace peregrine
