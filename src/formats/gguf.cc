#include "formats/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

#include "core/error.h"

namespace peregrine {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr size_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are rejected
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr size_t kMaxReserve = size_t{1} << 20;  // elements reserved before any has been read

uint64_t sat_add(uint64_t a, uint64_t b) {
    return a > kU64Max - b ? kU64Max : a + b;
}
uint64_t sat_mul(uint64_t a, uint64_t b) {
    return b != 0 && a > kU64Max / b ? kU64Max : a * b;
}

bool valid_type(uint32_t t) {
    return t <= static_cast<uint32_t>(GgufType::FLOAT64);
}

// Bytes of one scalar element; 0 for STRING and ARRAY (variable length).
size_t scalar_size(GgufType t) {
    switch (t) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::BOOL:
            return 1;
        case GgufType::UINT16:
        case GgufType::INT16:
            return 2;
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::FLOAT32:
            return 4;
        case GgufType::UINT64:
        case GgufType::INT64:
        case GgufType::FLOAT64:
            return 8;
        case GgufType::STRING:
        case GgufType::ARRAY:
            return 0;
    }
    return 0;
}

// The fewest bytes one array element of type t can take (a string: its length; an array: type + count).
size_t min_element_size(GgufType t) {
    if (t == GgufType::STRING) return 8;
    if (t == GgufType::ARRAY) return 12;
    return scalar_size(t);
}

// ggml's type ids and names, for error messages about the ones Peregrine does not load.
std::string_view ggml_type_name(uint32_t id) {
    static constexpr std::string_view kNames[] = {
        "f32",
        "f16",
        "q4_0",
        "q4_1",
        "q4_2 (removed)",
        "q4_3 (removed)",
        "q5_0",
        "q5_1",
        "q8_0",
        "q8_1",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "q8_k",
        "iq2_xxs",
        "iq2_xs",
        "iq3_xxs",
        "iq1_s",
        "iq4_nl",
        "iq3_s",
        "iq2_s",
        "iq4_xs",
        "i8",
        "i16",
        "i32",
        "i64",
        "f64",
        "iq1_m",
        "bf16",
        "q4_0_4_4",
        "q4_0_4_8",
        "q4_0_8_8",
        "tq1_0",
        "tq2_0",
        "iq4_nl_4_4",
        "iq4_nl_4_8",
        "iq4_nl_8_8",
        "mxfp4",
    };
    if (id < std::size(kNames)) return kNames[id];
    return "unknown";
}

bool ggml_type_to_dtype(uint32_t id, DType* out) {
    switch (id) {
        case 0:
            *out = DType::F32;
            return true;
        case 1:
            *out = DType::F16;
            return true;
        case 2:
            *out = DType::Q4_0;
            return true;
        case 8:
            *out = DType::Q8_0;
            return true;
        case 12:
            *out = DType::Q4_K;
            return true;
        case 14:
            *out = DType::Q6_K;
            return true;
        case 30:
            *out = DType::BF16;
            return true;
        default:
            return false;
    }
}

// A bounds-checked little-endian cursor over the mapped bytes. `context` names what is being
// read ("header", "metadata key 'x'", "tensor 'y'") for error messages.
class Reader {
  public:
    Reader(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}

    const std::string& path() const { return path_; }
    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }
    void set_context(std::string c) { context_ = std::move(c); }
    const std::string& context() const { return context_; }

    void need(uint64_t n) const {
        if (n > remaining()) {
            fail(path_, ": truncated: ", context_, " needs ", n, " bytes at offset ", pos_, " but the file has ",
                 size_);
        }
    }

    template <typename T>
    T read() {
        need(sizeof(T));
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string() {
        const uint64_t len = read<uint64_t>();
        if (len > size_) fail(path_, ": ", context_, ": string length ", len, " exceeds the file size ", size_);
        need(len);
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += static_cast<size_t>(len);
        return s;
    }

    // An array or table count, checked against what the rest of the file could possibly hold.
    uint64_t read_count(std::string_view what, size_t min_item_bytes) {
        const uint64_t n = read<uint64_t>();
        if (min_item_bytes > 0 && n > remaining() / min_item_bytes) {
            fail(path_, ": ", context_, ": ", what, " count ", n, " is impossible in a file of ", size_, " bytes");
        }
        return n;
    }

    GgufType read_type() {
        const uint32_t t = read<uint32_t>();
        if (!valid_type(t)) fail(path_, ": ", context_, " has unknown value type ", t);
        return static_cast<GgufType>(t);
    }

  private:
    const std::string& path_;
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    std::string context_ = "header";
};

int64_t read_int_scalar(Reader& r, GgufType t) {
    switch (t) {
        case GgufType::UINT8:
            return r.read<uint8_t>();
        case GgufType::INT8:
            return r.read<int8_t>();
        case GgufType::UINT16:
            return r.read<uint16_t>();
        case GgufType::INT16:
            return r.read<int16_t>();
        case GgufType::UINT32:
            return r.read<uint32_t>();
        case GgufType::INT32:
            return r.read<int32_t>();
        case GgufType::UINT64:
            return static_cast<int64_t>(r.read<uint64_t>());  // bit pattern
        case GgufType::INT64:
            return r.read<int64_t>();
        case GgufType::BOOL:
            return r.read<uint8_t>() != 0;
        default:
            break;
    }
    PG_CHECK(false, "not an integer type: ", gguf_type_name(t));
}

void read_value(Reader& r, GgufType type, GgufValue& out, int depth);

void read_array(Reader& r, GgufValue& out, int depth) {
    if (depth >= kMaxArrayDepth) {
        fail(r.path(), ": ", r.context(), ": arrays nested more than ", kMaxArrayDepth, " deep");
    }
    const GgufType et = r.read_type();
    out.array_type = et;
    const uint64_t n = r.read_count("array element", min_element_size(et));
    const auto count = static_cast<size_t>(n);
    // The count is bounded by the bytes left, but a corrupt one could still ask for far more memory
    // than the file holds (a string costs 8 bytes on disk, 32 in memory): reserve only so much up front.
    const size_t reserve = std::min<size_t>(count, kMaxReserve);
    if (et == GgufType::STRING) {
        out.strings.reserve(reserve);
        for (size_t k = 0; k < count; ++k) out.strings.push_back(r.read_string());
    } else if (et == GgufType::ARRAY) {
        out.array.reserve(std::min<size_t>(count, 1024));
        for (size_t k = 0; k < count; ++k) read_value(r, GgufType::ARRAY, out.array.emplace_back(), depth + 1);
    } else if (et == GgufType::FLOAT32) {
        out.floats.reserve(reserve);
        for (size_t k = 0; k < count; ++k) out.floats.push_back(r.read<float>());
    } else if (et == GgufType::FLOAT64) {
        out.floats.reserve(reserve);
        for (size_t k = 0; k < count; ++k) out.floats.push_back(r.read<double>());
    } else {
        out.ints.reserve(reserve);
        for (size_t k = 0; k < count; ++k) out.ints.push_back(read_int_scalar(r, et));
    }
}

void read_value(Reader& r, GgufType type, GgufValue& out, int depth) {
    out.type = type;
    switch (type) {
        case GgufType::FLOAT32:
            out.f = r.read<float>();
            return;
        case GgufType::FLOAT64:
            out.f = r.read<double>();
            return;
        case GgufType::BOOL:
            out.b = r.read<uint8_t>() != 0;
            out.i = out.b;
            return;
        case GgufType::STRING:
            out.s = r.read_string();
            return;
        case GgufType::ARRAY:
            read_array(r, out, depth);
            return;
        default:
            out.i = read_int_scalar(r, type);
            return;
    }
}

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
    return s + "]";
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::UINT8:
            return "uint8";
        case GgufType::INT8:
            return "int8";
        case GgufType::UINT16:
            return "uint16";
        case GgufType::INT16:
            return "int16";
        case GgufType::UINT32:
            return "uint32";
        case GgufType::INT32:
            return "int32";
        case GgufType::FLOAT32:
            return "float32";
        case GgufType::BOOL:
            return "bool";
        case GgufType::STRING:
            return "string";
        case GgufType::ARRAY:
            return "array";
        case GgufType::UINT64:
            return "uint64";
        case GgufType::INT64:
            return "int64";
        case GgufType::FLOAT64:
            return "float64";
    }
    return "unknown";
}

bool gguf_type_is_integer(GgufType t) {
    switch (t) {
        case GgufType::UINT8:
        case GgufType::INT8:
        case GgufType::UINT16:
        case GgufType::INT16:
        case GgufType::UINT32:
        case GgufType::INT32:
        case GgufType::UINT64:
        case GgufType::INT64:
            return true;
        default:
            return false;
    }
}

bool gguf_type_is_float(GgufType t) {
    return t == GgufType::FLOAT32 || t == GgufType::FLOAT64;
}

size_t GgufValue::size() const {
    if (type != GgufType::ARRAY) return 0;
    switch (array_type) {
        case GgufType::STRING:
            return strings.size();
        case GgufType::ARRAY:
            return array.size();
        case GgufType::FLOAT32:
        case GgufType::FLOAT64:
            return floats.size();
        default:
            return ints.size();
    }
}

std::string GgufValue::type_str() const {
    if (type != GgufType::ARRAY) return std::string(gguf_type_name(type));
    return str_cat("array of ", gguf_type_name(array_type));
}

int64_t GgufTensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
    const std::string& p = file_->path();
    const size_t size = file_->size();
    Reader r(p, file_->data(), size);

    // --- header ---
    if (size < 4 || r.read<uint32_t>() != kGgufMagic) fail(p, ": not a GGUF file (bad magic)");
    version_ = r.read<uint32_t>();
    if (version_ != 2 && version_ != 3) {
        const uint32_t swapped =
            (version_ >> 24) | ((version_ >> 8) & 0xFF00u) | ((version_ << 8) & 0xFF0000u) | (version_ << 24);
        if (swapped >= 1 && swapped <= 3) {
            fail(p, ": big-endian GGUF files are not supported");
        }
        fail(p, ": GGUF version ", version_, " is not supported (only versions 2 and 3)");
    }
    // A tensor info is at least 24 bytes (name length, n_dims, type, offset); a key/value at least 13.
    const uint64_t n_tensors = r.read_count("tensor", 24);
    const uint64_t n_kv = r.read_count("metadata key/value", 13);

    // --- metadata ---
    keys_.reserve(std::min<size_t>(n_kv, 4096));
    values_.reserve(std::min<size_t>(n_kv, 4096));
    for (uint64_t k = 0; k < n_kv; ++k) {
        r.set_context(str_cat("metadata key #", k));
        std::string key = r.read_string();
        r.set_context(str_cat("metadata key '", key, "'"));
        if (key_index_.count(key)) fail(p, ": duplicate metadata key '", key, "'");
        GgufValue v;
        read_value(r, r.read_type(), v, 0);
        key_index_.emplace(key, keys_.size());
        keys_.push_back(std::move(key));
        values_.push_back(std::move(v));
    }

    if (const GgufValue* a = find("general.alignment")) {
        if (!gguf_type_is_integer(a->type)) type_error("general.alignment", *a, "integer");
        const uint64_t al = a->u64();
        if (a->i <= 0 || !std::has_single_bit(al) || al > (uint64_t{1} << 30)) {
            const std::string shown = a->type == GgufType::UINT64 ? str_cat(a->u64()) : str_cat(a->i);
            fail(p, ": metadata key 'general.alignment' is ", shown, ", not a power of two (at most 2^30)");
        }
        alignment_ = static_cast<size_t>(al);
    }

    // --- tensor infos ---
    tensors_.reserve(std::min<size_t>(n_tensors, 1u << 16));
    for (uint64_t k = 0; k < n_tensors; ++k) {
        r.set_context(str_cat("tensor info #", k));
        GgufTensorInfo t;
        t.name = r.read_string();
        r.set_context(str_cat("tensor '", t.name, "'"));
        const uint32_t n_dims = r.read<uint32_t>();
        if (n_dims == 0 || n_dims > static_cast<uint32_t>(Tensor::kMaxDims)) {
            fail(p, ": tensor '", t.name, "' has ", n_dims, " dimensions (1 to ", Tensor::kMaxDims, " supported)");
        }
        t.shape.resize(n_dims);
        uint64_t numel = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = r.read<uint64_t>();
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                fail(p, ": tensor '", t.name, "' has dimension ", ne, ", which is out of range");
            }
            t.shape[n_dims - 1 - d] = static_cast<int64_t>(ne);  // ne[0] is innermost: last in our shape
            numel = sat_mul(numel, ne);
        }
        if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            fail(p, ": tensor '", t.name, "' has shape ", shape_str(t.shape), ", too many elements");
        }
        const uint32_t type = r.read<uint32_t>();
        if (!ggml_type_to_dtype(type, &t.dtype)) {
            fail(p, ": tensor '", t.name, "' has ggml type ", type, " (", ggml_type_name(type),
                 "), which Peregrine does not support");
        }
        t.offset = r.read<uint64_t>();

        const int64_t bs = dtype_block_size(t.dtype);
        if (t.shape.back() % bs != 0) {
            fail(p, ": tensor '", t.name, "' has shape ", shape_str(t.shape),
                 ": its last dimension is not a multiple of the ", dtype_name(t.dtype), " block size ", bs);
        }
        if (t.offset % alignment_ != 0) {
            fail(p, ": tensor '", t.name, "' has data offset ", t.offset, ", not a multiple of the alignment ",
                 alignment_);
        }
        t.nbytes = static_cast<size_t>(
            sat_mul(numel / static_cast<uint64_t>(bs), static_cast<uint64_t>(dtype_block_bytes(t.dtype))));
        if (tensor_index_.count(t.name)) fail(p, ": duplicate tensor '", t.name, "'");
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    // --- data section ---
    const uint64_t end_of_infos = r.pos();
    data_offset_ = static_cast<size_t>(sat_add(end_of_infos, alignment_ - 1) / alignment_ * alignment_);
    for (GgufTensorInfo& t : tensors_) {
        const uint64_t begin = sat_add(data_offset_, t.offset);
        const uint64_t end = sat_add(begin, t.nbytes);
        if (end > size) {
            fail(p, ": truncated: tensor '", t.name, "' needs bytes [", begin, ", ", end, ") but the file has ", size);
        }
        t.data = file_->data() + begin;
    }
}

const GgufValue* GgufFile::find(std::string_view key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &values_[it->second];
}

const GgufValue& GgufFile::require(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) fail(path(), ": metadata key '", key, "' missing");
    return *v;
}

void GgufFile::type_error(std::string_view key, const GgufValue& v, std::string_view expected) const {
    fail(path(), ": metadata key '", key, "' has type ", v.type_str(), ", expected ", expected);
}

std::string GgufFile::get_string(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufType::STRING) type_error(key, v, "string");
    return v.s;
}

int64_t GgufFile::get_int(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type == GgufType::BOOL) return v.b ? 1 : 0;
    if (!gguf_type_is_integer(v.type)) type_error(key, v, "integer");
    if (v.type == GgufType::UINT64 && v.i < 0) {
        fail(path(), ": metadata key '", key, "' holds ", v.u64(), ", which overflows int64");
    }
    return v.i;
}

double GgufFile::get_float(std::string_view key) const {
    const GgufValue& v = require(key);
    if (gguf_type_is_float(v.type)) return v.f;
    if (v.type == GgufType::UINT64) return static_cast<double>(v.u64());
    if (gguf_type_is_integer(v.type)) return static_cast<double>(v.i);
    type_error(key, v, "float");
}

bool GgufFile::get_bool(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufType::BOOL) type_error(key, v, "bool");
    return v.b;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufType::ARRAY || v.array_type != GgufType::STRING) type_error(key, v, "array of string");
    return v.strings;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type == GgufType::ARRAY && gguf_type_is_float(v.array_type)) return v.floats;
    if (v.type != GgufType::ARRAY || !gguf_type_is_integer(v.array_type)) type_error(key, v, "numeric array");
    std::vector<double> out(v.ints.size());
    for (size_t k = 0; k < out.size(); ++k) {
        out[k] = v.array_type == GgufType::UINT64 ? static_cast<double>(static_cast<uint64_t>(v.ints[k]))
                                                  : static_cast<double>(v.ints[k]);
    }
    return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufType::ARRAY || !(gguf_type_is_integer(v.array_type) || v.array_type == GgufType::BOOL)) {
        type_error(key, v, "integer array");
    }
    if (v.array_type == GgufType::UINT64) {
        for (int64_t x : v.ints) {
            if (x < 0) {
                fail(path(), ": metadata key '", key, "' holds ", static_cast<uint64_t>(x), ", which overflows int64");
            }
        }
    }
    return v.ints;
}

int64_t GgufFile::get_int_or(std::string_view key, int64_t dflt) const {
    return has(key) ? get_int(key) : dflt;
}

double GgufFile::get_float_or(std::string_view key, double dflt) const {
    return has(key) ? get_float(key) : dflt;
}

std::string GgufFile::get_string_or(std::string_view key, std::string dflt) const {
    return has(key) ? get_string(key) : std::move(dflt);
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::tensor(std::string_view name) const {
    const GgufTensorInfo* info = find_tensor(name);
    if (!info) fail(path(), ": tensor '", name, "' missing");
    Tensor t;
    t.data = const_cast<uint8_t*>(info->data);  // Tensor is a mutable view type; the mapping is read-only
    t.dtype = info->dtype;
    t.device = Device::CPU;
    t.ndim = static_cast<int>(info->shape.size());
    for (int d = 0; d < t.ndim; ++d) t.shape[d] = info->shape[d];
    return t;
}

}  // namespace peregrine
