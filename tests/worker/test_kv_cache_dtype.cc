// --kv-cache-dtype: what each name means on each backend, the errors for the rest, and the
// pool an FP8 cache gets from the same memory (issue #23: at least 1.9x the tokens of bf16).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "model/kv_cache.h"
#include "peregrine/engine_config.h"
#include "worker/worker.h"

namespace peregrine {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(KvCacheDtype, NamesOnEachBackend) {
    EXPECT_EQ(kv_cache_dtype_from_name("auto", DType::F32), DType::F32);
    EXPECT_EQ(kv_cache_dtype_from_name("auto", DType::BF16), DType::BF16);
    EXPECT_EQ(kv_cache_dtype_from_name("bf16", DType::BF16), DType::BF16);
    EXPECT_EQ(kv_cache_dtype_from_name("bfloat16", DType::BF16), DType::BF16);
    for (DType native : {DType::F32, DType::BF16}) {
        EXPECT_EQ(kv_cache_dtype_from_name("fp8", native), DType::F8_E4M3);
        EXPECT_EQ(kv_cache_dtype_from_name("fp8_e4m3", native), DType::F8_E4M3);
    }
    const std::string cpu_bf16 = error_of([] { kv_cache_dtype_from_name("bf16", DType::F32); });
    EXPECT_NE(cpu_bf16.find("f32 (auto) or fp8"), std::string::npos) << cpu_bf16;
    const std::string unknown = error_of([] { kv_cache_dtype_from_name("fp8_e5m2", DType::BF16); });
    EXPECT_NE(unknown.find("auto, bf16 or fp8 (fp8_e4m3), got 'fp8_e5m2'"), std::string::npos) << unknown;
}

TEST(KvCacheDtype, ConfigValidationNamesTheAllowedValues) {
    EngineConfig c;
    for (const char* ok : {"auto", "bf16", "fp8", "fp8_e4m3"}) {
        c.kv_cache_dtype = ok;
        c.validate();
    }
    c.kv_cache_dtype = "int8";
    const std::string e = error_of([&] { c.validate(); });
    EXPECT_NE(e.find("kv_cache_dtype must be auto, bf16 or fp8 (fp8_e4m3), got 'int8'"), std::string::npos) << e;
}

TEST(KvCacheDtype, CpuWorkerRefusesBf16BeforeLoading) {
    EngineConfig c;
    c.device = "cpu";
    c.threads = 1;
    c.kv_cache_dtype = "bf16";
    Worker w(c);
    const std::string e = error_of([&] { w.init_device(); });
    EXPECT_NE(e.find("--kv-cache-dtype bf16"), std::string::npos) << e;
}

// A dummy-weight llama of the given head shape in a temporary folder (config.json only).
struct ShapeModel {
    std::filesystem::path dir;
    ShapeModel(int head_dim, int kv_heads) {
        dir = std::filesystem::temp_directory_path() /
              ("pg_kv_dtype_" + std::to_string(::getpid()) + "_" + std::to_string(head_dim));
        std::filesystem::create_directories(dir);
        std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": )"
                                           << kv_heads << R"(, "head_dim": )" << head_dim
                                           << R"(, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
            "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})";
    }
    ~ShapeModel() { std::filesystem::remove_all(dir); }
};

// The pool's blocks for a fixed --kv-cache-memory on the CPU backend.
int pool_blocks(const std::string& model, const std::string& dtype, int64_t bytes, size_t* block_bytes) {
    EngineConfig c;
    c.device = "cpu";
    c.threads = 1;
    c.model = model;
    c.load_format = "dummy";
    c.kv_cache_memory = bytes;
    c.kv_cache_dtype = dtype;
    Worker w(c);
    w.init_device();
    w.load_model();
    const int blocks = w.determine_kv_blocks();
    w.init_kv_cache(blocks);
    *block_bytes = w.kv_block_bytes();
    return blocks;
}

TEST(KvCacheDtype, Fp8PoolHoldsAtLeast19TimesTheTokensOfBf16) {
    const int64_t bytes = int64_t{48} << 20;
    for (const int head_dim : {64, 128}) {
        ShapeModel m(head_dim, 2);
        size_t f32_block = 0, fp8_block = 0;
        const int f32_blocks = pool_blocks(m.dir.string(), "auto", bytes, &f32_block);
        const int fp8_blocks = pool_blocks(m.dir.string(), "fp8", bytes, &fp8_block);
        // bf16 (the CUDA backend's auto) by the same arithmetic: 2 bytes per value.
        const size_t bf16_block = f32_block / 2;
        const double vs_f32 = static_cast<double>(fp8_blocks) / f32_blocks;
        const double vs_bf16 = static_cast<double>(bf16_block) / static_cast<double>(fp8_block);
        std::printf(
            "head_dim %d: %zu bytes a block (fp8) against %zu (bf16) and %zu (f32); %d blocks against %d "
            "(f32): %.3fx, %.3fx bf16's\n",
            head_dim, fp8_block, bf16_block, f32_block, fp8_blocks, f32_blocks, vs_f32, vs_bf16);
        EXPECT_EQ(fp8_block, size_t{2} * 2 * 16 * 2 * (head_dim + 2));  // layers x K,V x block x heads x bytes
        EXPECT_GE(vs_f32, 3.8);
        EXPECT_GE(vs_bf16, 1.9);
        EXPECT_EQ(fp8_blocks, static_cast<int>(bytes / static_cast<int64_t>(fp8_block)));
    }
}

}  // namespace
}  // namespace peregrine
