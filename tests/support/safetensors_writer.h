// Writes safetensors files for tests: tensors given as raw little-endian bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/half.h"

namespace peregrine::testing {

struct StTensor {
    std::string name;
    std::string dtype;  // as safetensors spells it: "F32", "BF16", "F16", "F8_E4M3"
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

inline StTensor st_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    StTensor t{name, "F32", std::move(shape), std::vector<uint8_t>(v.size() * 4)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
}

// `v` rounded to 16 bits: bf16 (f32_to_bf16) or f16 (f32_to_f16).
inline StTensor st_half(const std::string& name, const char* dtype, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
    StTensor t{name, dtype, std::move(shape), std::vector<uint8_t>(v.size() * 2)};
    const bool bf16 = std::string(dtype) == "BF16";
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
    return t;
}

inline void write_safetensors(const std::filesystem::path& path, const std::vector<StTensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    size_t offset = 0;
    for (const StTensor& t : tensors) {
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset += t.bytes.size();
    }
    const std::string h = header.dump();
    const uint64_t len = h.size();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << h;
    for (const StTensor& t : tensors)
        out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

}  // namespace peregrine::testing
