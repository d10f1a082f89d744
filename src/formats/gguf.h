// A reader for GGUF v2/v3 files: metadata key/values and tensor infos parsed and validated up
// front, tensor data left in the memory map (no copies).
//
// File layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
// the metadata (string key, u32 value type, value), the tensor infos (string name, u32 n_dims,
// u64 ne[n_dims] innermost first, u32 ggml type, u64 offset), padding to `alignment`, then the
// data section. Strings are u64 length + bytes (no terminator); arrays are u32 element type,
// u64 count, elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace peregrine {

enum class GgufType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};

// "uint8", "float32", "string", "array", ...; "type N" for values outside the enum.
std::string_view gguf_type_name(GgufType t);
bool gguf_type_is_integer(GgufType t);  // UINT8..INT64, not BOOL
bool gguf_type_is_float(GgufType t);    // FLOAT32, FLOAT64

// One metadata value. Which members are meaningful depends on `type` (and `array_type`):
//   integer scalars: `i` (UINT64 values above INT64_MAX are kept as their bit pattern; see u64())
//   BOOL: `b`;  FLOAT32/FLOAT64: `f`;  STRING: `s`
//   ARRAY: `array_type` says which one of these holds the elements (the others stay empty):
//     integer or BOOL elements -> `ints` (same convention as `i`; bools are 0/1)
//     FLOAT32/FLOAT64 elements -> `floats`
//     STRING elements          -> `strings`
//     ARRAY elements           -> `array` (each element an ARRAY value itself)
// Large arrays (150k-token vocabularies) thus cost one vector, not one GgufValue per element.
struct GgufValue {
    GgufType type = GgufType::UINT8;

    int64_t i = 0;
    double f = 0.0;
    bool b = false;
    std::string s;

    GgufType array_type = GgufType::UINT8;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    std::vector<std::string> strings;
    std::vector<GgufValue> array;

    // Number of elements of an array (0 for scalars).
    size_t size() const;
    // The unsigned value of an integer scalar (the bit pattern of `i`).
    uint64_t u64() const { return static_cast<uint64_t>(i); }
    // "uint32", "string", "array of string", "array of array of int8", ...
    std::string type_str() const;
};

struct GgufTensorInfo {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;     // row-major, outermost first: GGUF's ne[] reversed ([rows, cols] for a matrix)
    uint64_t offset = 0;            // bytes, relative to the data section; a multiple of the alignment
    const uint8_t* data = nullptr;  // into the mapping
    size_t nbytes = 0;

    int64_t numel() const;
};

class GgufFile {
  public:
    // Maps the file, parses and validates the header, metadata and tensor infos, and checks that
    // every tensor's data lies inside the file. Throws Error naming the file (and the key or
    // tensor) for anything malformed or unsupported; never reads out of bounds.
    explicit GgufFile(const std::string& path);

    const std::string& path() const { return file_->path(); }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }      // general.alignment, or 32
    size_t data_offset() const { return data_offset_; }  // file offset of the data section
    size_t file_size() const { return file_->size(); }

    // --- metadata ---
    bool has(std::string_view key) const { return find(key) != nullptr; }
    const GgufValue* find(std::string_view key) const;              // nullptr when absent
    const std::vector<std::string>& keys() const { return keys_; }  // in file order

    // Typed getters. They throw Error("<path>: metadata key '<key>' missing") when the key is
    // absent and Error("<path>: metadata key '<key>' has type X, expected Y") on a type mismatch.
    std::string get_string(std::string_view key) const;
    int64_t get_int(std::string_view key) const;   // any integer type or bool; UINT64 must fit
    double get_float(std::string_view key) const;  // any float or integer type
    bool get_bool(std::string_view key) const;     // BOOL only
    std::vector<std::string> get_string_array(std::string_view key) const;
    std::vector<double> get_float_array(std::string_view key) const;  // any float or integer elements
    std::vector<int64_t> get_int_array(std::string_view key) const;   // integer or bool elements
    // The default only when the key is absent; a key of the wrong type still throws.
    int64_t get_int_or(std::string_view key, int64_t dflt) const;
    double get_float_or(std::string_view key, double dflt) const;
    std::string get_string_or(std::string_view key, std::string dflt) const;

    // --- tensors ---
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
    const GgufTensorInfo* find_tensor(std::string_view name) const;          // nullptr when absent
    // A view into the mapping (valid while this GgufFile lives); throws Error naming the file and
    // the tensor when it is missing.
    Tensor tensor(std::string_view name) const;

  private:
    const GgufValue& require(std::string_view key) const;
    [[noreturn]] void type_error(std::string_view key, const GgufValue& v, std::string_view expected) const;

    std::unique_ptr<MappedFile> file_;  // a pointer so that moving a GgufFile keeps `data` valid
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;

    std::vector<std::string> keys_;
    std::vector<GgufValue> values_;  // parallel to keys_
    std::map<std::string, size_t, std::less<>> key_index_;

    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace peregrine
