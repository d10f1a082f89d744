// EngineConfig's device defaults (issue #25, defect 8): a GPU of >= 70 GiB gets vLLM's larger
// step (1024 sequences, 8192 tokens); smaller GPUs and the CPU keep 256 / 2048; values given on
// the command line are never replaced.
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

}  // namespace
}  // namespace peregrine
