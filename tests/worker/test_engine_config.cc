// EngineConfig's device defaults (issue #25, defect 8): a GPU of >= 70 GiB gets vLLM's larger
// step (1024 sequences, 8192 tokens, more tokens for a small model: issue #26); smaller GPUs and
// the CPU keep 256 / 2048; values given on the command line are never replaced.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "peregrine/engine_config.h"
#include "worker/worker.h"

namespace peregrine {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

TEST(EngineConfigDefaults, ByDeviceMemory) {
    EngineConfig h100;
    h100.apply_device_defaults(80 * kGiB);
    EXPECT_EQ(h100.max_num_seqs, 1024);
    EXPECT_EQ(h100.max_num_batched_tokens, 8192);

    EngineConfig l4;
    l4.apply_device_defaults(24 * kGiB);
    EXPECT_EQ(l4.max_num_seqs, 256);
    EXPECT_EQ(l4.max_num_batched_tokens, 2048);

    EngineConfig cpu;
    cpu.apply_device_defaults(0);
    EXPECT_EQ(cpu.max_num_seqs, 256);
    EXPECT_EQ(cpu.max_num_batched_tokens, 2048);
}

TEST(EngineConfigDefaults, GivenValuesStay) {
    EngineConfig c;
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 512;
    c.apply_device_defaults(141 * kGiB);
    EXPECT_EQ(c.max_num_seqs, 64);
    EXPECT_EQ(c.max_num_batched_tokens, 512);
    c.max_num_batched_tokens = 0;
    c.apply_device_defaults(141 * kGiB);
    EXPECT_EQ(c.max_num_batched_tokens, 8192);
}

// The big GPU's token budget grows for models with fewer product weights a GPU: the 8B (~6.98e9
// in its 32 layers) keeps 8192, the 1B (~0.97e9) gets 32768 (the cap), a 3B-sized 2.8e9 16384;
// a given budget, a small GPU and the CPU are left alone.
TEST(EngineConfigDefaults, SmallerModelsGetLargerStepsOnABigGpu) {
    auto tokens = [](size_t device, int given, int64_t weights) {
        EngineConfig c;
        c.max_num_batched_tokens = given;
        c.apply_device_defaults(device);
        c.apply_model_defaults(weights);
        return c.max_num_batched_tokens;
    };
    const int64_t w8b = 32 * (4096LL * (2 * 4096 + 2 * 1024) + 3LL * 4096 * 14336);
    const int64_t w1b = 16 * (2048LL * (2 * 2048 + 2 * 512) + 3LL * 2048 * 8192);
    EXPECT_EQ(tokens(80 * kGiB, 0, w8b), 8192);
    EXPECT_EQ(tokens(80 * kGiB, 0, w1b), 32768);
    EXPECT_EQ(tokens(141 * kGiB, 0, 2'800'000'000), 16384);
    EXPECT_EQ(tokens(80 * kGiB, 0, 100'000), 32768);
    EXPECT_EQ(tokens(80 * kGiB, 0, 70'000'000'000), 8192);
    EXPECT_EQ(tokens(80 * kGiB, 512, w1b), 512);
    EXPECT_EQ(tokens(24 * kGiB, 0, w1b), 2048);
    EXPECT_EQ(tokens(0, 0, w1b), 2048);
    // Applied once: a second model figure does not move it again.
    EngineConfig c;
    c.apply_device_defaults(80 * kGiB);
    c.apply_model_defaults(w1b);
    c.apply_model_defaults(w8b);
    EXPECT_EQ(c.max_num_batched_tokens, 32768);
}

TEST(EngineConfigDefaults, ACpuWorkerRunsTheCpuDefaults) {
    EngineConfig c;
    c.device = "cpu";
    c.threads = 1;
    c.validate();  // 0 = by the device is valid
    Worker w(c);
    w.init_device();
    EXPECT_EQ(w.config().max_num_seqs, 256);
    EXPECT_EQ(w.config().max_num_batched_tokens, 2048);
    c.max_num_seqs = -1;
    EXPECT_THROW(c.validate(), Error);
}

// CUDA-only load options are refused on the CPU backend with a message naming the flag.
TEST(EngineConfigDefaults, CpuRefusesCudaOnlyWeightOptions) {
    for (int which = 0; which < 2; ++which) {
        EngineConfig c;
        c.device = "cpu";
        c.threads = 1;
        if (which == 0) c.quantization = "fp8";
        if (which == 1) c.dequantize_gguf = true;
        Worker w(c);
        try {
            w.init_device();
            ADD_FAILURE() << "accepted on the CPU: option " << which;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(which == 0 ? "--quantization fp8" : "--dequantize-gguf"),
                      std::string::npos)
                << e.what();
        }
    }
}

// --fp8-lm-head quantizes the head with the layers: without --quantization fp8 it is refused.
TEST(EngineConfigDefaults, Fp8LmHeadNeedsFp8Layers) {
    EngineConfig c;
    c.fp8_lm_head = true;
    try {
        c.validate();
        ADD_FAILURE() << "--fp8-lm-head accepted without --quantization fp8";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs --quantization fp8"), std::string::npos) << e.what();
    }
    c.quantization = "fp8";
    c.validate();
}

}  // namespace
}  // namespace peregrine
