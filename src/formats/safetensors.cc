#include "formats/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace peregrine {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool parse_dtype(const std::string& s, DType* out) {
    if (s == "F32")
        *out = DType::F32;
    else if (s == "F16")
        *out = DType::F16;
    else if (s == "BF16")
        *out = DType::BF16;
    else if (s == "I32")
        *out = DType::I32;
    else if (s == "F8_E4M3")  // FP8 checkpoints' weights; their factors are other tensors (model/fp8_checkpoint.h)
        *out = DType::F8_E4M3;
    else
        return false;
    return true;
}

}  // namespace

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
    SafetensorsSet set;
    set.add_file(path);
    return set;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
    SafetensorsSet set;
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(single)) {
        set.add_file(single.string());
        return set;
    }
    if (!fs::exists(index)) fail(dir, ": no model.safetensors or model.safetensors.index.json");
    std::ifstream in(index);
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        fail(index.string(), ": invalid JSON: ", e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail(index.string(), ": missing object 'weight_map'");
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) fail(index.string(), ": weight_map['", name, "'] is not a string");
        shards.insert(file.get<std::string>());
    }
    for (const auto& shard : shards) set.add_file((fs::path(dir) / shard).string());
    for (auto& [name, file] : j["weight_map"].items()) {
        if (!set.find(name))
            fail(index.string(), ": tensor '", name, "' listed but not found in ", file.get<std::string>());
    }
    return set;
}

void SafetensorsSet::add_file(const std::string& path) {
    auto file = std::make_unique<MappedFile>(path);
    const uint8_t* base = file->data();
    const size_t size = file->size();
    if (size < 8) fail(path, ": truncated safetensors file (", size, " bytes)");
    uint64_t header_len;
    std::memcpy(&header_len, base, 8);
    if (header_len > size - 8)
        fail(path, ": header length ", header_len, " runs past the end of the file (", size, " bytes)");
    json header;
    try {
        header = json::parse(base + 8, base + 8 + header_len);
    } catch (const json::exception& e) {
        fail(path, ": invalid safetensors header: ", e.what());
    }
    if (!header.is_object()) fail(path, ": safetensors header is not a JSON object");
    const size_t data_start = 8 + header_len;
    const size_t data_size = size - data_start;
    for (auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        auto bad = [&](const std::string& why) { fail(path, ": tensor '", name, "': ", why); };
        if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
            bad("needs dtype, shape and data_offsets");
        DType dtype;
        const std::string dts = info["dtype"].is_string() ? info["dtype"].get<std::string>() : "?";
        if (!parse_dtype(dts, &dtype)) bad("unsupported dtype " + dts + " (supported: F32, F16, BF16, F8_E4M3, I32)");
        const json& shape = info["shape"];
        if (!shape.is_array() || shape.size() > Tensor::kMaxDims) bad("shape must be an array of at most 4 dims");
        Tensor t;
        t.dtype = dtype;
        uint64_t numel = 1;
        for (const auto& d : shape) {
            if (!d.is_number_unsigned()) bad("shape holds a non-integer");
            t.shape[t.ndim++] = d.get<int64_t>();
            numel *= d.get<uint64_t>();
        }
        const json& off = info["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            bad("data_offsets must be [begin, end]");
        const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        if (b > e || e > data_size)
            bad(str_cat("data [", b, ", ", e, ") runs past the end of the file (", data_size,
                        " data bytes): truncated?"));
        if (e - b != numel * dtype_block_bytes(dtype))
            bad(str_cat("holds ", e - b, " bytes but shape ", t.shape_str(), " of ", dtype_name(dtype), " needs ",
                        numel * dtype_block_bytes(dtype)));
        t.data = const_cast<uint8_t*>(base + data_start + b);
        if (entries_.count(name)) bad("appears in more than one file");
        entries_[name] = SafetensorsEntry{t, file.get()};
    }
    files_.push_back(std::move(file));
}

const SafetensorsEntry* SafetensorsSet::find(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace peregrine
