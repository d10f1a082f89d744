// The GGUF reader (formats/gguf.h): the real fixtures, files written from scratch here (every
// metadata type, v2 and v3), malformed files (each must throw peregrine::Error, never crash),
// and the quantized fixtures' tensors dequantized against the bf16 fixture.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"
#include "formats/gguf.h"

#ifndef PG_TEST_DATA_DIR
#define PG_TEST_DATA_DIR "tests/data"
#endif

namespace peregrine {
namespace {

// The fixtures: $PEREGRINE_TEST_DATA if set, else the directory CMake passes in.
std::string data_path(const std::string& rel) {
    const char* env = std::getenv("PEREGRINE_TEST_DATA");
    return std::string(env && *env ? env : PG_TEST_DATA_DIR) + "/" + rel;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const uint8_t* data, size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
    ASSERT_TRUE(out.good()) << path;
}

// Builds GGUF bytes field by field, so tests can write valid files and deliberately broken ones.
class GgufWriter {
  public:
    std::vector<uint8_t> bytes;

    template <typename T>
    GgufWriter& put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), p, p + sizeof(T));
        return *this;
    }
    GgufWriter& raw(const void* p, size_t n) {
        bytes.insert(bytes.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
        return *this;
    }
    GgufWriter& str(std::string_view s) {
        put<uint64_t>(s.size());
        return raw(s.data(), s.size());
    }
    GgufWriter& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        raw("GGUF", 4);
        put<uint32_t>(version);
        put<uint64_t>(n_tensors);
        return put<uint64_t>(n_kv);
    }
    GgufWriter& key(std::string_view k, GgufType t) {
        str(k);
        return put<uint32_t>(static_cast<uint32_t>(t));
    }
    GgufWriter& kv_u32(std::string_view k, uint32_t v) { return key(k, GgufType::UINT32).put(v); }
    GgufWriter& kv_str(std::string_view k, std::string_view v) { return key(k, GgufType::STRING).str(v); }
    GgufWriter& array_header(GgufType elem, uint64_t n) {
        put<uint32_t>(static_cast<uint32_t>(elem));
        return put<uint64_t>(n);
    }
    // ne is GGUF's order: innermost (contiguous) dimension first.
    GgufWriter& tensor_info(std::string_view name, const std::vector<uint64_t>& ne, uint32_t ggml_type,
                            uint64_t offset) {
        str(name);
        put<uint32_t>(static_cast<uint32_t>(ne.size()));
        for (uint64_t d : ne) put<uint64_t>(d);
        put<uint32_t>(ggml_type);
        return put<uint64_t>(offset);
    }
    GgufWriter& pad(size_t alignment) {
        while (bytes.size() % alignment) bytes.push_back(0);
        return *this;
    }
};

class TempDir {
  public:
    TempDir() {
        std::string tmpl = ::testing::TempDir() + "pg_gguf_XXXXXX";
        PG_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
        dir_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    std::string file(const std::string& name) const { return dir_ + "/" + name; }
    std::string write(const std::string& name, const std::vector<uint8_t>& b) const {
        const std::string p = file(name);
        write_bytes(p, b.data(), b.size());
        return p;
    }

  private:
    std::string dir_;
};

// Expects GgufFile(path) to throw Error mentioning the path and `what`.
void expect_error(const std::string& path, const std::string& what) {
    try {
        GgufFile f(path);
        ADD_FAILURE() << path << ": parsed without error, expected '" << what << "'";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
    }
}

// A file with one tensor named "w" and `data_bytes` bytes of data after the padding.
std::vector<uint8_t> one_tensor_file(const std::vector<uint64_t>& ne, uint32_t ggml_type, uint64_t offset,
                                     size_t data_bytes, const std::string& name = "w") {
    GgufWriter w;
    w.header(3, 1, 1).kv_str("general.architecture", "llama");
    w.tensor_info(name, ne, ggml_type, offset).pad(32);
    w.bytes.resize(w.bytes.size() + data_bytes, 0);
    return w.bytes;
}

// ==== the real fixtures ======================================================================

TEST(GgufRead, Stories260K) {
    const std::string path = data_path("stories260K.gguf");
    GgufFile f(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_offset() % 32, 0u);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("llama.block_count"), 5);
    EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
    EXPECT_EQ(f.get_int("llama.attention.head_count"), 8);
    EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 4);
    EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.rope.freq_base")), 10000.0f);
    EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
    EXPECT_EQ(f.get_float("llama.block_count"), 5.0);  // integers read as floats too
    EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
    EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_eos_token"));
    EXPECT_EQ(f.get_int("tokenizer.ggml.add_bos_token"), 1);

    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 512u);
    EXPECT_EQ(tokens[0], "<unk>");
    EXPECT_EQ(tokens[1], "<s>");
    EXPECT_EQ(tokens[2], "</s>");
    EXPECT_EQ(tokens[3], "<0x00>");
    EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").size(), 512u);
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    ASSERT_EQ(types.size(), 512u);
    EXPECT_EQ(f.get_float_array("tokenizer.ggml.token_type").size(), 512u);  // ints are numeric too
    EXPECT_EQ(f.find("tokenizer.ggml.tokens")->type_str(), "array of string");

    ASSERT_FALSE(f.keys().empty());
    EXPECT_EQ(f.keys().front(), "general.architecture");
    EXPECT_EQ(f.keys().size(), 23u);
    for (const auto& k : f.keys()) EXPECT_TRUE(f.has(k)) << k;
    EXPECT_FALSE(f.has("no.such.key"));
    EXPECT_EQ(f.find("no.such.key"), nullptr);

    EXPECT_EQ(f.tensors().size(), 2u + 9u * 5u);
    const GgufTensorInfo* info = f.find_tensor("token_embd.weight");
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, DType::F32);
    EXPECT_EQ(info->shape, (std::vector<int64_t>{512, 64}));
    EXPECT_EQ(info->nbytes, 512u * 64u * 4u);
    EXPECT_EQ(info->offset, 0u);

    const Tensor t = f.tensor("token_embd.weight");
    EXPECT_EQ(t.ndim, 2);
    EXPECT_EQ(t.dim(0), 512);
    EXPECT_EQ(t.dim(1), 64);
    EXPECT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(t.device, Device::CPU);
    EXPECT_EQ(t.nbytes(), info->nbytes);
    EXPECT_EQ(t.data, static_cast<const void*>(info->data));

    // The view reads the same bytes as the file at data_offset + offset.
    const auto bytes = read_bytes(path);
    ASSERT_GE(bytes.size(), f.data_offset() + info->nbytes);
    EXPECT_EQ(std::memcmp(t.data, bytes.data() + f.data_offset() + info->offset, info->nbytes), 0);

    const GgufTensorInfo* k = f.find_tensor("blk.0.attn_k.weight");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->shape, (std::vector<int64_t>{32, 64}));  // [rows = kv dim, cols = embedding]
    const GgufTensorInfo* norm = f.find_tensor("output_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(f.tensor("output_norm.weight").ndim, 1);
    for (const auto& ti : f.tensors()) {
        EXPECT_EQ(ti.offset % f.alignment(), 0u) << ti.name;
        EXPECT_EQ(f.find_tensor(ti.name), &ti);
    }
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST(GgufRead, TypedGetterErrors) {
    const std::string path = data_path("stories260K.gguf");
    GgufFile f(path);
    auto expect_msg = [&](const std::function<void()>& fn, const std::string& want) {
        try {
            fn();
            ADD_FAILURE() << "no error, expected: " << want;
        } catch (const Error& e) {
            EXPECT_EQ(std::string(e.what()), path + ": " + want);
        }
    };
    expect_msg([&] { f.get_int("llama.nope"); }, "metadata key 'llama.nope' missing");
    expect_msg([&] { f.get_int("general.architecture"); },
               "metadata key 'general.architecture' has type string, expected integer");
    expect_msg([&] { f.get_string("llama.block_count"); },
               "metadata key 'llama.block_count' has type uint32, expected string");
    expect_msg([&] { f.get_bool("llama.block_count"); },
               "metadata key 'llama.block_count' has type uint32, expected bool");
    expect_msg([&] { f.get_float("tokenizer.ggml.tokens"); },
               "metadata key 'tokenizer.ggml.tokens' has type array of string, expected float");
    expect_msg([&] { f.get_string_array("tokenizer.ggml.scores"); },
               "metadata key 'tokenizer.ggml.scores' has type array of float32, expected array of string");
    expect_msg([&] { f.get_int_array("tokenizer.ggml.scores"); },
               "metadata key 'tokenizer.ggml.scores' has type array of float32, expected integer array");
    expect_msg([&] { f.get_float_array("tokenizer.ggml.tokens"); },
               "metadata key 'tokenizer.ggml.tokens' has type array of string, expected numeric array");
    expect_msg([&] { f.get_int("llama.rope.freq_base"); },
               "metadata key 'llama.rope.freq_base' has type float32, expected integer");
    expect_msg([&] { f.tensor("blk.9.attn_q.weight"); }, "tensor 'blk.9.attn_q.weight' missing");

    // Defaults apply only to absent keys; a present key of the wrong type still throws.
    EXPECT_EQ(f.get_int_or("llama.nope", 7), 7);
    EXPECT_EQ(f.get_int_or("llama.block_count", 7), 5);
    EXPECT_EQ(f.get_float_or("llama.nope", 0.5), 0.5);
    EXPECT_EQ(f.get_float_or("llama.block_count", 0.5), 5.0);
    EXPECT_EQ(f.get_string_or("llama.nope", "x"), "x");
    EXPECT_EQ(f.get_string_or("general.name", "x"), "stories260K");
    EXPECT_THROW(f.get_int_or("general.architecture", 1), Error);
    EXPECT_THROW(f.get_float_or("general.architecture", 1.0), Error);
    EXPECT_THROW(f.get_string_or("llama.block_count", "x"), Error);
}

TEST(GgufRead, QuantTinyQ4KHasQ4KAndQ6K) {
    GgufFile f(data_path("quant-tiny/qt-q4_k.gguf"));
    std::set<DType> seen;
    for (const auto& t : f.tensors()) {
        seen.insert(t.dtype);
        EXPECT_EQ(t.nbytes, dtype_row_bytes(t.dtype, t.shape.back()) * static_cast<size_t>(t.numel() / t.shape.back()));
    }
    EXPECT_TRUE(seen.count(DType::Q4_K));
    EXPECT_TRUE(seen.count(DType::Q6_K));
    EXPECT_TRUE(seen.count(DType::F32));
    const Tensor q = f.tensor("blk.0.attn_q.weight");
    EXPECT_EQ(q.dtype, DType::Q4_K);
    EXPECT_EQ(q.dim(0), 256);
    EXPECT_EQ(q.dim(1), 256);
    EXPECT_EQ(q.row_bytes(), 144u);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->dtype, DType::Q6_K);
    EXPECT_EQ(f.get_int("general.quantization_version"), 2);
}

// ==== files written from scratch ==============================================================

struct Written {
    std::vector<uint8_t> bytes;
    std::vector<std::string> keys;
};

// Every metadata value type, a nested array, and three tensors (f32, f16, q8_0).
Written every_type_file(uint32_t version) {
    Written out;
    GgufWriter w;
    const uint64_t n_kv = 23;
    w.header(version, 3, n_kv);
    auto key = [&](std::string_view k, GgufType t) -> GgufWriter& {
        out.keys.emplace_back(k);
        return w.key(k, t);
    };
    key("t.u8", GgufType::UINT8).put<uint8_t>(200);
    key("t.i8", GgufType::INT8).put<int8_t>(-100);
    key("t.u16", GgufType::UINT16).put<uint16_t>(60000);
    key("t.i16", GgufType::INT16).put<int16_t>(-30000);
    key("t.u32", GgufType::UINT32).put<uint32_t>(4000000000u);
    key("t.i32", GgufType::INT32).put<int32_t>(-2000000000);
    key("t.f32", GgufType::FLOAT32).put<float>(1.5f);
    key("t.bool", GgufType::BOOL).put<uint8_t>(1);
    key("t.bool_false", GgufType::BOOL).put<uint8_t>(0);
    key("t.str", GgufType::STRING).str("h\xC3\xA9llo, world");
    key("t.empty_str", GgufType::STRING).str("");
    key("t.u64", GgufType::UINT64).put<uint64_t>((uint64_t{1} << 63) + 5);
    key("t.u64_small", GgufType::UINT64).put<uint64_t>(123456789012ull);
    key("t.i64", GgufType::INT64).put<int64_t>(-(int64_t{1} << 40));
    key("t.f64", GgufType::FLOAT64).put<double>(0.1);
    key("t.arr_u8", GgufType::ARRAY).array_header(GgufType::UINT8, 3).put<uint8_t>(1).put<uint8_t>(2).put<uint8_t>(255);
    key("t.arr_i8", GgufType::ARRAY).array_header(GgufType::INT8, 2).put<int8_t>(-1).put<int8_t>(-128);
    key("t.arr_str", GgufType::ARRAY).array_header(GgufType::STRING, 3).str("a").str("").str("ccc");
    key("t.arr_f32", GgufType::ARRAY).array_header(GgufType::FLOAT32, 2).put<float>(0.25f).put<float>(-2.0f);
    key("t.arr_f64", GgufType::ARRAY).array_header(GgufType::FLOAT64, 1).put<double>(1e300);
    key("t.arr_bool", GgufType::ARRAY).array_header(GgufType::BOOL, 2).put<uint8_t>(1).put<uint8_t>(0);
    // [["x", "y"], ["z"], []]: an array of arrays of strings.
    key("t.nested", GgufType::ARRAY).array_header(GgufType::ARRAY, 3);
    w.array_header(GgufType::STRING, 2).str("x").str("y");
    w.array_header(GgufType::STRING, 1).str("z");
    w.array_header(GgufType::STRING, 0);
    key("t.arr_i64", GgufType::ARRAY).array_header(GgufType::INT64, 2).put<int64_t>(-5).put<int64_t>(int64_t{1} << 50);
    PG_CHECK(out.keys.size() == n_kv);

    // Tensors: "a" f32 [2, 3] (ne = {3, 2}), "b" f16 [4], "c" q8_0 [2, 32]; data laid out at 32-byte offsets.
    w.tensor_info("a", {3, 2}, 0, 0);
    w.tensor_info("b", {4}, 1, 32);
    w.tensor_info("c", {32, 2}, 8, 64);
    w.pad(32);
    for (int i = 0; i < 6; ++i) w.put<float>(static_cast<float>(i) - 2.5f);
    w.pad(32);
    for (float v : {1.0f, -0.5f, 65504.0f, 0.0f}) w.put<uint16_t>(f32_to_f16(v));
    w.pad(32);
    float x[64];
    // Block b holds q * 2^-4 * (b + 1) with q = -127 first, so d = (b + 1) / 16 and every value is exact.
    for (int i = 0; i < 64; ++i) {
        x[i] = static_cast<float>(i % 32 == 0 ? -127 : i % 32 - 16) / 16.0f * static_cast<float>(1 + i / 32);
    }
    uint8_t q[68];
    quantize_row_q8_0(x, q, 64);
    w.raw(q, sizeof q);
    out.bytes = w.bytes;
    return out;
}

TEST(GgufWrite, EveryValueTypeV2AndV3) {
    TempDir tmp;
    for (uint32_t version : {2u, 3u}) {
        SCOPED_TRACE(version);
        const Written wr = every_type_file(version);
        const std::string path = tmp.write("every_v" + std::to_string(version) + ".gguf", wr.bytes);
        GgufFile f(path);
        EXPECT_EQ(f.version(), version);
        EXPECT_EQ(f.keys(), wr.keys);

        EXPECT_EQ(f.get_int("t.u8"), 200);
        EXPECT_EQ(f.get_int("t.i8"), -100);
        EXPECT_EQ(f.get_int("t.u16"), 60000);
        EXPECT_EQ(f.get_int("t.i16"), -30000);
        EXPECT_EQ(f.get_int("t.u32"), 4000000000LL);
        EXPECT_EQ(f.get_int("t.i32"), -2000000000LL);
        EXPECT_EQ(f.get_float("t.f32"), 1.5);
        EXPECT_EQ(f.find("t.f32")->type, GgufType::FLOAT32);
        EXPECT_TRUE(f.get_bool("t.bool"));
        EXPECT_FALSE(f.get_bool("t.bool_false"));
        EXPECT_EQ(f.get_string("t.str"), "h\xC3\xA9llo, world");
        EXPECT_EQ(f.get_string("t.empty_str"), "");
        EXPECT_THROW(f.get_int("t.u64"), Error);  // 2^63 + 5 does not fit in int64
        EXPECT_EQ(f.find("t.u64")->u64(), (uint64_t{1} << 63) + 5);
        EXPECT_EQ(f.get_float("t.u64"), std::ldexp(1.0, 63));
        EXPECT_EQ(f.get_int("t.u64_small"), 123456789012LL);
        EXPECT_EQ(f.get_int("t.i64"), -(int64_t{1} << 40));
        EXPECT_EQ(f.get_float("t.f64"), 0.1);
        EXPECT_EQ(f.get_float("t.i8"), -100.0);
        EXPECT_THROW(f.get_float("t.bool"), Error);

        EXPECT_EQ(f.get_int_array("t.arr_u8"), (std::vector<int64_t>{1, 2, 255}));
        EXPECT_EQ(f.get_int_array("t.arr_i8"), (std::vector<int64_t>{-1, -128}));
        EXPECT_EQ(f.get_float_array("t.arr_i8"), (std::vector<double>{-1.0, -128.0}));
        EXPECT_EQ(f.get_string_array("t.arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
        EXPECT_EQ(f.get_float_array("t.arr_f32"), (std::vector<double>{0.25, -2.0}));
        EXPECT_EQ(f.get_float_array("t.arr_f64"), (std::vector<double>{1e300}));
        EXPECT_EQ(f.get_int_array("t.arr_bool"), (std::vector<int64_t>{1, 0}));
        EXPECT_EQ(f.get_int_array("t.arr_i64"), (std::vector<int64_t>{-5, int64_t{1} << 50}));
        EXPECT_THROW(f.get_int_array("t.arr_f32"), Error);
        EXPECT_THROW(f.get_string_array("t.nested"), Error);

        const GgufValue* nested = f.find("t.nested");
        ASSERT_NE(nested, nullptr);
        EXPECT_EQ(nested->type, GgufType::ARRAY);
        EXPECT_EQ(nested->array_type, GgufType::ARRAY);
        EXPECT_EQ(nested->type_str(), "array of array");
        ASSERT_EQ(nested->size(), 3u);
        EXPECT_EQ(nested->array[0].array_type, GgufType::STRING);
        EXPECT_EQ(nested->array[0].strings, (std::vector<std::string>{"x", "y"}));
        EXPECT_EQ(nested->array[1].strings, (std::vector<std::string>{"z"}));
        EXPECT_EQ(nested->array[2].size(), 0u);

        ASSERT_EQ(f.tensors().size(), 3u);
        EXPECT_EQ(f.tensors()[0].name, "a");
        EXPECT_EQ(f.tensors()[2].name, "c");
        const Tensor a = f.tensor("a");
        EXPECT_EQ(a.ndim, 2);
        EXPECT_EQ(a.dim(0), 2);
        EXPECT_EQ(a.dim(1), 3);
        float av[6];
        dequantize_row(a.dtype, a.data, av, 6);
        for (int i = 0; i < 6; ++i) EXPECT_EQ(av[i], static_cast<float>(i) - 2.5f);
        const Tensor b = f.tensor("b");
        EXPECT_EQ(b.dtype, DType::F16);
        float bv[4];
        dequantize_row(b.dtype, b.data, bv, 4);
        EXPECT_EQ(bv[0], 1.0f);
        EXPECT_EQ(bv[1], -0.5f);
        EXPECT_EQ(bv[2], 65504.0f);
        const Tensor c = f.tensor("c");
        EXPECT_EQ(c.dtype, DType::Q8_0);
        EXPECT_EQ(c.dim(0), 2);
        EXPECT_EQ(c.dim(1), 32);
        EXPECT_EQ(c.nbytes(), 68u);
        float cv[64];
        dequantize_row(c.dtype, c.row(1), cv, 32);  // row 1: q / 8
        for (int j = 0; j < 32; ++j) EXPECT_EQ(cv[j], static_cast<float>(j == 0 ? -127 : j - 16) / 8.0f) << j;
    }
}

TEST(GgufWrite, CustomAlignment) {
    TempDir tmp;
    GgufWriter w;
    w.header(3, 2, 1);
    w.kv_u32("general.alignment", 64);
    w.tensor_info("x", {8}, 0, 0);
    w.tensor_info("y", {8}, 0, 64);
    w.pad(64);
    const size_t data_at = w.bytes.size();
    for (int i = 0; i < 16; ++i) w.put<float>(static_cast<float>(i));  // x: 0..7, then 32 bytes of padding
    for (int i = 0; i < 8; ++i) w.put<float>(100.0f + static_cast<float>(i));
    GgufFile f(tmp.write("align64.gguf", w.bytes));
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.data_offset(), data_at);
    EXPECT_EQ(f.data_offset() % 64, 0u);
    float y[8];
    dequantize_row(DType::F32, f.tensor("y").data, y, 8);
    EXPECT_EQ(y[0], 100.0f);
    EXPECT_EQ(y[7], 107.0f);

    // Offsets must be multiples of the file's alignment, not just of 32.
    GgufWriter bad;
    bad.header(3, 1, 1).kv_u32("general.alignment", 64).tensor_info("x", {8}, 0, 32).pad(64);
    bad.bytes.resize(bad.bytes.size() + 64, 0);
    expect_error(tmp.write("misaligned64.gguf", bad.bytes),
                 "tensor 'x' has data offset 32, not a multiple of the alignment 64");

    for (uint32_t al : {0u, 3u, 48u}) {
        GgufWriter b;
        b.header(3, 0, 1).kv_u32("general.alignment", al);
        expect_error(tmp.write("badalign.gguf", b.bytes), "general.alignment");
    }
    GgufWriter s;
    s.header(3, 0, 1).kv_str("general.alignment", "32");
    expect_error(tmp.write("stralign.gguf", s.bytes),
                 "metadata key 'general.alignment' has type string, expected integer");
}

TEST(GgufWrite, NoTensorsAndEmptyArrays) {
    TempDir tmp;
    GgufWriter w;
    w.header(3, 0, 2);
    w.key("e", GgufType::ARRAY).array_header(GgufType::INT32, 0);
    w.key("s", GgufType::ARRAY).array_header(GgufType::STRING, 0);
    GgufFile f(tmp.write("empty.gguf", w.bytes));
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_TRUE(f.get_int_array("e").empty());
    EXPECT_TRUE(f.get_float_array("e").empty());
    EXPECT_TRUE(f.get_string_array("s").empty());
}

// ==== malformed files =========================================================================

TEST(GgufMalformed, BadMagicAndVersions) {
    TempDir tmp;
    auto good = one_tensor_file({32}, 0, 0, 128);
    auto b = good;
    b[0] = 'X';
    expect_error(tmp.write("magic.gguf", b), "not a GGUF file (bad magic)");
    expect_error(tmp.write("empty.gguf", {}), "not a GGUF file (bad magic)");
    expect_error(tmp.write("short.gguf", {'G', 'G'}), "not a GGUF file (bad magic)");
    for (uint32_t v : {0u, 1u, 4u, 1000u}) {
        b = good;
        std::memcpy(&b[4], &v, 4);
        expect_error(tmp.write("version.gguf", b), "GGUF version " + std::to_string(v) + " is not supported");
    }
    b = good;
    const uint8_t be3[4] = {0, 0, 0, 3};
    std::memcpy(&b[4], be3, 4);
    expect_error(tmp.write("bigendian.gguf", b), "big-endian");
    expect_error(tmp.write("noversion.gguf", {'G', 'G', 'U', 'F', 3}), "truncated");
    expect_error("/nonexistent/dir/model.gguf", "cannot open");
}

TEST(GgufMalformed, TruncatedStories260K) {
    TempDir tmp;
    const std::string src = data_path("stories260K.gguf");
    const auto bytes = read_bytes(src);
    ASSERT_GT(bytes.size(), 100000u);
    const size_t data_offset = GgufFile(src).data_offset();
    // Inside the magic, version, counts, keys, the token array, the tensor infos, the padding and the data.
    const size_t cuts[] = {0,
                           3,
                           4,
                           7,
                           16,
                           23,
                           24,
                           100,
                           1000,
                           5000,
                           data_offset - 40,
                           data_offset - 1,
                           data_offset,
                           data_offset + 1000,
                           bytes.size() / 2,
                           bytes.size() - 1};
    for (size_t cut : cuts) {
        SCOPED_TRACE(cut);
        const std::string p = tmp.file("cut.gguf");
        write_bytes(p, bytes.data(), cut);
        EXPECT_THROW(GgufFile f(p), Error);
    }
}

TEST(GgufMalformed, EveryPrefixOfASmallFileThrows) {
    TempDir tmp;
    const auto bytes = every_type_file(3).bytes;  // the last tensor's data ends at end of file
    const std::string p = tmp.file("prefix.gguf");
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
        write_bytes(p, bytes.data(), cut);
        try {
            GgufFile f(p);
            ADD_FAILURE() << "prefix of " << cut << " bytes parsed";
        } catch (const Error& e) {
            ASSERT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        }
    }
}

TEST(GgufMalformed, TensorErrors) {
    TempDir tmp;
    expect_error(tmp.write("q4_1.gguf", one_tensor_file({64, 4}, 3, 0, 1024, "blk.0.attn_q.weight")),
                 "tensor 'blk.0.attn_q.weight' has ggml type 3 (q4_1), which Peregrine does not support");
    expect_error(tmp.write("q5_k.gguf", one_tensor_file({256}, 13, 0, 1024)), "has ggml type 13 (q5_k)");
    expect_error(tmp.write("t999.gguf", one_tensor_file({256}, 999, 0, 1024)), "has ggml type 999 (unknown)");

    // 32 f32 = 128 bytes, but only 100 present after the padding.
    auto b = one_tensor_file({32}, 0, 0, 100, "out.weight");
    const std::string eof = tmp.write("eof.gguf", b);
    const size_t data_at = b.size() - 100;
    expect_error(eof, str_cat("truncated: tensor 'out.weight' needs bytes [", data_at, ", ", data_at + 128,
                              ") but the file has ", b.size()));
    // A huge offset must not wrap around.
    expect_error(tmp.write("offset.gguf", one_tensor_file({32}, 0, uint64_t{1} << 62, 128)), "truncated: tensor 'w'");
    expect_error(tmp.write("offset2.gguf", one_tensor_file({32}, 0, ~uint64_t{31}, 128)), "truncated: tensor 'w'");
    // Dimensions whose product overflows or is huge.
    expect_error(tmp.write("huge.gguf", one_tensor_file({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 0)),
                 "too many elements");
    expect_error(tmp.write("huge2.gguf", one_tensor_file({uint64_t{1} << 62, 1}, 0, 0, 0)), "truncated: tensor 'w'");
    expect_error(tmp.write("neg.gguf", one_tensor_file({~uint64_t{0}}, 0, 0, 0)), "out of range");

    expect_error(tmp.write("dims5.gguf", one_tensor_file({2, 2, 2, 2, 2}, 0, 0, 128)), "tensor 'w' has 5 dimensions");
    expect_error(tmp.write("dims0.gguf", one_tensor_file({}, 0, 0, 128)), "tensor 'w' has 0 dimensions");
    expect_error(tmp.write("block.gguf", one_tensor_file({48, 2}, 8, 0, 1024)),
                 "not a multiple of the q8_0 block size 32");
    expect_error(tmp.write("block_k.gguf", one_tensor_file({128}, 12, 0, 1024)),
                 "not a multiple of the q4_k block size 256");
    expect_error(tmp.write("misaligned.gguf", one_tensor_file({8}, 0, 16, 128)),
                 "tensor 'w' has data offset 16, not a multiple of the alignment 32");

    GgufWriter d;
    d.header(3, 2, 0).tensor_info("same", {8}, 0, 0).tensor_info("same", {8}, 0, 32).pad(32);
    d.bytes.resize(d.bytes.size() + 64, 0);
    expect_error(tmp.write("dup.gguf", d.bytes), "duplicate tensor 'same'");

    // A 4-D tensor with a zero dimension is fine (and has no bytes).
    GgufFile ok(tmp.write("zero.gguf", one_tensor_file({32, 0, 2, 2}, 8, 0, 0)));
    EXPECT_EQ(ok.tensor("w").ndim, 4);
    EXPECT_EQ(ok.find_tensor("w")->nbytes, 0u);
    EXPECT_EQ(ok.find_tensor("w")->shape, (std::vector<int64_t>{2, 2, 0, 32}));
}

TEST(GgufMalformed, MetadataErrors) {
    TempDir tmp;
    {
        GgufWriter w;
        w.header(3, 0, 2).kv_u32("a", 1).key("b", static_cast<GgufType>(13)).put<uint32_t>(0);
        expect_error(tmp.write("type.gguf", w.bytes), "metadata key 'b' has unknown value type 13");
    }
    {
        GgufWriter w;
        w.header(3, 0, 1).key("arr", GgufType::ARRAY).array_header(static_cast<GgufType>(77), 1).put<uint32_t>(0);
        expect_error(tmp.write("arrtype.gguf", w.bytes), "metadata key 'arr' has unknown value type 77");
    }
    {
        GgufWriter w;
        w.header(3, 0, 2).kv_u32("a", 1).kv_u32("a", 2);
        expect_error(tmp.write("dupkey.gguf", w.bytes), "duplicate metadata key 'a'");
    }
    {
        GgufWriter w;
        w.header(3, 0, 1).key("s", GgufType::STRING).put<uint64_t>(uint64_t{1} << 60);
        w.bytes.resize(w.bytes.size() + 64, 'x');
        expect_error(tmp.write("strlen.gguf", w.bytes), "metadata key 's': string length 1152921504606846976 exceeds");
    }
    {
        GgufWriter w;
        w.header(3, 0, 1).key("s", GgufType::STRING).put<uint64_t>(30).raw("abc", 3);
        expect_error(tmp.write("strshort.gguf", w.bytes), "truncated: metadata key 's' needs 30 bytes at offset 45");
    }
    {
        GgufWriter w;
        w.put<uint64_t>(~uint64_t{0});  // a key length of 2^64 - 1
        w.bytes.resize(w.bytes.size() + 16, 0);
        GgufWriter h;
        h.header(3, 0, 1).raw(w.bytes.data(), w.bytes.size());
        expect_error(tmp.write("keylen.gguf", h.bytes), "metadata key #0: string length");
    }
    {
        GgufWriter w;
        w.header(3, 0, 1).key("arr", GgufType::ARRAY).array_header(GgufType::UINT32, uint64_t{1} << 61);
        w.bytes.resize(w.bytes.size() + 64, 0);
        expect_error(tmp.write("arrcount.gguf", w.bytes), "metadata key 'arr': array element count");
    }
    {
        GgufWriter w;
        w.header(3, 0, 1).key("arr", GgufType::ARRAY).array_header(GgufType::STRING, uint64_t{1} << 40);
        expect_error(tmp.write("arrcount2.gguf", w.bytes), "array element count 1099511627776 is impossible");
    }
    {
        GgufWriter w;
        w.header(3, uint64_t{1} << 50, 0);
        expect_error(tmp.write("ntensors.gguf", w.bytes), "tensor count");
        GgufWriter k;
        k.header(3, 0, ~uint64_t{0});
        expect_error(tmp.write("nkv.gguf", k.bytes), "metadata key/value count");
    }
    {
        // Arrays nested 100 deep: rejected with an error, not a stack overflow.
        GgufWriter w;
        w.header(3, 0, 1).key("deep", GgufType::ARRAY);
        for (int i = 0; i < 100; ++i) w.array_header(GgufType::ARRAY, 1);
        w.array_header(GgufType::UINT8, 0);
        expect_error(tmp.write("deep.gguf", w.bytes), "nested more than");
    }
}

TEST(GgufMalformed, RandomCorruptionNeverCrashes) {
    // Flip bytes in the header, metadata and tensor infos of a valid file: each result must either
    // parse or throw Error (ASan/UBSan builds catch any out-of-bounds read).
    TempDir tmp;
    const Written wr = every_type_file(3);
    GgufFile clean(tmp.write("clean.gguf", wr.bytes));
    const size_t meta_end = clean.data_offset();
    std::mt19937 rng(2024);
    const std::string p = tmp.file("fuzz.gguf");
    int parsed = 0, rejected = 0;
    for (int iter = 0; iter < 800; ++iter) {
        auto b = wr.bytes;
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < flips; ++k) {
            const size_t at = rng() % meta_end;
            b[at] = (rng() % 4 == 0) ? 0xFF : static_cast<uint8_t>(b[at] ^ (1u << (rng() % 8)));
        }
        if (rng() % 8 == 0) b.resize(rng() % b.size());
        write_bytes(p, b.data(), b.size());
        try {
            GgufFile f(p);
            for (const auto& t : f.tensors()) {
                ASSERT_LE(f.data_offset() + t.offset + t.nbytes, f.file_size()) << t.name;
                unsigned sum = 0;  // touch every byte the reader vouched for
                for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
                (void)sum;
            }
            ++parsed;
        } catch (const Error&) {
            ++rejected;
        }
    }
    EXPECT_GT(rejected, 0);
    EXPECT_GT(parsed, 0);  // flips inside string contents still parse
}

// ==== quantized fixtures against bf16 =========================================================

// mean |a - b| / mean |b| over n values.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff += std::fabs(static_cast<double>(a[i]) - b[i]);
        mag += std::fabs(static_cast<double>(b[i]));
    }
    return diff / mag;
}

std::vector<float> dequantize_tensor(const GgufTensorInfo& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, t.data, out.data(), t.numel());
    return out;
}

// Deliberately wrong decoders: each is a plausible misreading of a layout.
std::vector<float> wrong_q4_k_swapped_nibbles(const GgufTensorInfo& t) {
    std::vector<uint8_t> b(t.data, t.data + t.nbytes);
    for (size_t blk = 0; blk < b.size() / sizeof(BlockQ4_K); ++blk) {
        uint8_t* qs = &b[blk * sizeof(BlockQ4_K) + offsetof(BlockQ4_K, qs)];
        for (int i = 0; i < kQK_K / 2; ++i) qs[i] = static_cast<uint8_t>((qs[i] >> 4) | (qs[i] << 4));
    }
    std::vector<float> out(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, b.data(), out.data(), t.numel());
    return out;
}

std::vector<float> wrong_q4_k_min_sign(const GgufTensorInfo& t) {
    // x = d * sc * q + dmin * m instead of - dmin * m: flip the sign bit of dmin.
    std::vector<uint8_t> b(t.data, t.data + t.nbytes);
    for (size_t blk = 0; blk < b.size() / sizeof(BlockQ4_K); ++blk) b[blk * sizeof(BlockQ4_K) + 3] ^= 0x80;
    std::vector<float> out(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, b.data(), out.data(), t.numel());
    return out;
}

std::vector<float> wrong_q4_0_interleaved(const GgufTensorInfo& t) {
    // Element 2j in the low nibble of byte j and element 2j + 1 in its high nibble.
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (size_t blk = 0; blk < t.nbytes / sizeof(BlockQ4_0); ++blk) {
        BlockQ4_0 b;
        std::memcpy(&b, t.data + blk * sizeof b, sizeof b);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 16; ++j) {
            out[blk * 32 + 2 * j] = d * static_cast<float>((b.qs[j] & 0xF) - 8);
            out[blk * 32 + 2 * j + 1] = d * static_cast<float>((b.qs[j] >> 4) - 8);
        }
    }
    return out;
}

std::vector<float> wrong_q6_k_swapped_ql_halves(const GgufTensorInfo& t) {
    std::vector<uint8_t> b(t.data, t.data + t.nbytes);
    for (size_t blk = 0; blk < b.size() / sizeof(BlockQ6_K); ++blk) {
        uint8_t* ql = &b[blk * sizeof(BlockQ6_K)];
        for (int h = 0; h < 2; ++h) {
            for (int l = 0; l < 32; ++l) std::swap(ql[64 * h + l], ql[64 * h + 32 + l]);
        }
    }
    std::vector<float> out(static_cast<size_t>(t.numel()));
    dequantize_row(t.dtype, b.data(), out.data(), t.numel());
    return out;
}

std::vector<float> wrong_q8_0_unsigned(const GgufTensorInfo& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (size_t blk = 0; blk < t.nbytes / sizeof(BlockQ8_0); ++blk) {
        BlockQ8_0 b;
        std::memcpy(&b, t.data + blk * sizeof b, sizeof b);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 32; ++j) out[blk * 32 + j] = d * static_cast<float>(static_cast<uint8_t>(b.qs[j]));
    }
    return out;
}

// Bounds on mean |quantized - bf16| / mean |bf16| per tensor. The fixture weights are uniform
// random; measured: q8_0 0.33%, q6_k 1.14%, q4_k 4.7%, q4_0 5.6%. Any misplaced element makes the
// error ~100%.
double error_bound(DType t) {
    switch (t) {
        case DType::Q8_0:
            return 0.006;
        case DType::Q6_K:
            return 0.02;
        case DType::Q4_K:
            return 0.07;
        case DType::Q4_0:
            return 0.08;
        default:
            return 0.0;  // f32 tensors must match exactly
    }
}

TEST(GgufDequant, QuantizedFixturesMatchBf16) {
    GgufFile ref(data_path("quant-tiny/qt-bf16.gguf"));
    std::map<DType, int> checked;
    std::map<DType, int> wrong_checked;
    for (const char* name : {"qt-q8_0.gguf", "qt-q4_0.gguf", "qt-q4_k.gguf", "qt-q6_k.gguf"}) {
        GgufFile f(data_path(std::string("quant-tiny/") + name));
        for (const GgufTensorInfo& t : f.tensors()) {
            SCOPED_TRACE(std::string(name) + " " + t.name + " " + std::string(dtype_name(t.dtype)));
            const GgufTensorInfo* r = ref.find_tensor(t.name);
            ASSERT_NE(r, nullptr);
            ASSERT_EQ(r->shape, t.shape);
            const auto want = dequantize_tensor(*r);
            const auto got = dequantize_tensor(t);
            const double err = rel_error(got, want);
            if (t.dtype == DType::F32) {
                EXPECT_EQ(got, want);
                continue;
            }
            EXPECT_LT(err, error_bound(t.dtype));
            ++checked[t.dtype];

            // Row by row too: dequantizing one row at a time from Tensor::row() gives the same values.
            const Tensor view = f.tensor(t.name);
            std::vector<float> row(static_cast<size_t>(view.cols()));
            for (int64_t i = 0; i < view.rows(); i += 37) {
                dequantize_row(view.dtype, view.row(i), row.data(), view.cols());
                ASSERT_EQ(0, std::memcmp(row.data(), got.data() + i * view.cols(), row.size() * sizeof(float)));
            }

            // The same comparison must fail for a wrong layout.
            const double bound = error_bound(t.dtype);
            switch (t.dtype) {
                case DType::Q8_0:
                    EXPECT_GT(rel_error(wrong_q8_0_unsigned(t), want), bound);
                    break;
                case DType::Q4_0:
                    EXPECT_GT(rel_error(wrong_q4_0_interleaved(t), want), bound);
                    break;
                case DType::Q4_K:
                    EXPECT_GT(rel_error(wrong_q4_k_swapped_nibbles(t), want), bound);
                    EXPECT_GT(rel_error(wrong_q4_k_min_sign(t), want), bound);
                    break;
                case DType::Q6_K:
                    EXPECT_GT(rel_error(wrong_q6_k_swapped_ql_halves(t), want), bound);
                    break;
                default:
                    break;
            }
            ++wrong_checked[t.dtype];
        }
    }
    for (DType d : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
        EXPECT_GT(checked[d], 0) << dtype_name(d);
        EXPECT_GT(wrong_checked[d], 0) << dtype_name(d);
    }
}

}  // namespace
}  // namespace peregrine
