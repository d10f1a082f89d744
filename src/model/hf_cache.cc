#include "model/hf_cache.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace peregrine {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

// "org/name": two non-empty parts of letters, digits, '.', '_', '-' (the hub's rule), neither
// "." nor "..".
bool is_repo_id(const std::string& s) {
    const size_t slash = s.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() ||
        s.find('/', slash + 1) != std::string::npos)
        return false;
    for (char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/'))
            return false;
    const std::string org = s.substr(0, slash), name = s.substr(slash + 1);
    return org != "." && org != ".." && name != "." && name != "..";
}

// A snapshot that holds a model: a config.json or a GGUF file.
bool holds_model(const fs::path& dir) {
    std::error_code ec;
    if (fs::exists(dir / "config.json", ec)) return true;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".gguf") return true;
    return false;
}

}  // namespace

std::string hf_hub_cache_dir() {
    if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) return v;
    if (const std::string v = env("HF_HOME"); !v.empty()) return (fs::path(v) / "hub").string();
    if (const std::string v = env("XDG_CACHE_HOME"); !v.empty()) return (fs::path(v) / "huggingface" / "hub").string();
    return (fs::path(env("HOME")) / ".cache" / "huggingface" / "hub").string();
}

std::string resolve_model_path(const std::string& model) {
    std::error_code ec;
    if (model.empty() || fs::exists(model, ec) || !is_repo_id(model)) return model;
    const fs::path cache = hf_hub_cache_dir();
    const size_t slash = model.find('/');
    const fs::path repo = cache / ("models--" + model.substr(0, slash) + "--" + model.substr(slash + 1));
    const std::string how =
        str_cat("download it first (`hf download ", model, "`, or `huggingface-cli download ", model,
                "`), or pass a local folder or GGUF file: nothing is downloaded at run time");
    if (!fs::is_directory(repo / "snapshots", ec))
        fail("model '", model, "' is neither a local path nor in the Hugging Face cache (", cache.string(), "): ", how);
    fs::path snapshot;
    std::ifstream ref(repo / "refs" / "main");
    std::string hash;
    if (ref && std::getline(ref, hash) && !hash.empty() && fs::is_directory(repo / "snapshots" / hash, ec)) {
        snapshot = repo / "snapshots" / hash;
    } else {  // no refs/main (a revision fetched by hash): the newest snapshot
        fs::file_time_type newest{};
        for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
            if (e.is_directory() && (snapshot.empty() || e.last_write_time() > newest)) {
                snapshot = e.path();
                newest = e.last_write_time();
            }
    }
    if (snapshot.empty() || !holds_model(snapshot))
        fail("model '", model, "' is in the Hugging Face cache (", repo.string(),
             ") without a config.json or GGUF file in its snapshot: ", how);
    return snapshot.string();
}

}  // namespace peregrine
