// A small GGUF v3 writer for tests that build whole model files: metadata key/values of the
// types llama.cpp's converter writes and tensors with their raw data, laid out as gguf-py's
// GGUFWriter does (header, metadata, tensor infos, padding to the alignment, data section with
// every tensor's data starting on an aligned offset).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

namespace peregrine::testing {

// GGML tensor type ids as written in a GGUF tensor info.
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, BF16 = 30 };

class GgufBuilder {
  public:
    void kv_u32(std::string_view k, uint32_t v) { key(k, GgufType::UINT32).put(v); }
    void kv_i32(std::string_view k, int32_t v) { key(k, GgufType::INT32).put(v); }
    void kv_f32(std::string_view k, float v) { key(k, GgufType::FLOAT32).put(v); }
    void kv_bool(std::string_view k, bool v) { key(k, GgufType::BOOL).put<uint8_t>(v ? 1 : 0); }
    void kv_str(std::string_view k, std::string_view v) { key(k, GgufType::STRING).str(v); }
    void kv_str_array(std::string_view k, const std::vector<std::string>& v) {
        key(k, GgufType::ARRAY).put<uint32_t>(static_cast<uint32_t>(GgufType::STRING)).put<uint64_t>(v.size());
        for (const std::string& s : v) str(s);
    }
    void kv_f32_array(std::string_view k, const std::vector<float>& v) {
        key(k, GgufType::ARRAY).put<uint32_t>(static_cast<uint32_t>(GgufType::FLOAT32)).put<uint64_t>(v.size());
        for (float f : v) put(f);
    }
    void kv_i32_array(std::string_view k, const std::vector<int32_t>& v) {
        key(k, GgufType::ARRAY).put<uint32_t>(static_cast<uint32_t>(GgufType::INT32)).put<uint64_t>(v.size());
        for (int32_t i : v) put(i);
    }

    // `ne` in GGUF's order: innermost (contiguous) dimension first, so [cols, rows] for a matrix.
    void tensor(std::string_view name, GgmlType type, const std::vector<uint64_t>& ne, std::vector<uint8_t> data) {
        tensors_.push_back({std::string(name), type, ne, std::move(data)});
    }
    void tensor_f32(std::string_view name, const std::vector<uint64_t>& ne, const std::vector<float>& v) {
        std::vector<uint8_t> bytes(v.size() * sizeof(float));
        std::memcpy(bytes.data(), v.data(), bytes.size());
        tensor(name, GgmlType::F32, ne, std::move(bytes));
    }

    // Writes the whole file; throws Error when it cannot.
    void write(const std::string& path, size_t alignment = 32) const {
        GgufBuilder out;
        out.raw("GGUF", 4).put<uint32_t>(3).put<uint64_t>(tensors_.size()).put<uint64_t>(n_kv_);
        out.raw(meta_.data(), meta_.size());
        uint64_t offset = 0;
        for (const Entry& t : tensors_) {
            out.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
            for (uint64_t d : t.ne) out.put<uint64_t>(d);
            out.put<uint32_t>(static_cast<uint32_t>(t.type)).put<uint64_t>(offset);
            offset = align(offset + t.data.size(), alignment);
        }
        out.pad(alignment);
        for (const Entry& t : tensors_) out.raw(t.data.data(), t.data.size()).pad(alignment);
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(out.meta_.data()), static_cast<std::streamsize>(out.meta_.size()));
        if (!f.good()) fail(path, ": cannot write the GGUF file");
    }

  private:
    struct Entry {
        std::string name;
        GgmlType type;
        std::vector<uint64_t> ne;
        std::vector<uint8_t> data;
    };

    static uint64_t align(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

    template <typename T>
    GgufBuilder& put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        meta_.insert(meta_.end(), p, p + sizeof(T));
        return *this;
    }
    GgufBuilder& raw(const void* p, size_t n) {
        meta_.insert(meta_.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
        return *this;
    }
    GgufBuilder& str(std::string_view s) {
        put<uint64_t>(s.size());
        return raw(s.data(), s.size());
    }
    // Starts one metadata entry.
    GgufBuilder& key(std::string_view k, GgufType t) {
        ++n_kv_;
        str(k);
        return put<uint32_t>(static_cast<uint32_t>(t));
    }
    GgufBuilder& pad(size_t alignment) {
        while (meta_.size() % alignment) meta_.push_back(0);
        return *this;
    }

    std::vector<uint8_t> meta_;  // the metadata key/values (or, while writing, the whole file)
    uint64_t n_kv_ = 0;
    std::vector<Entry> tensors_;
};

}  // namespace peregrine::testing
