// settle_max_model_len: the context an engine serves, from --max-model-len, the model's context
// and the KV cache's size (vLLM's rules, issue #25).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "worker/worker.h"

namespace peregrine {
namespace {

std::string error_of(int requested, int model_len, int64_t kv_tokens) {
    try {
        settle_max_model_len(requested, model_len, kv_tokens, 1280, false);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(MaxModelLen, DefaultIsTheContextLoweredToTheKvCache) {
    EXPECT_EQ(settle_max_model_len(0, 4096, 1 << 20, 1280, false), 4096);
    EXPECT_EQ(settle_max_model_len(0, 4096, 64, 1280, false), 64);
}

TEST(MaxModelLen, ExplicitMustFitBoth) {
    EXPECT_EQ(settle_max_model_len(1000, 4096, 1024, 1280, false), 1000);
    EXPECT_EQ(settle_max_model_len(1024, 4096, 1024, 1280, false), 1024);
    const std::string kv = error_of(4096, 4096, 64);
    for (const char* part : {"--max-model-len 4096", "5.00 MiB", "0.08 MiB", "(64 tokens)",
                             "largest max model length is 64", "--kv-cache-memory", "--gpu-memory-utilization"})
        EXPECT_NE(kv.find(part), std::string::npos) << part << " in " << kv;
    EXPECT_NE(error_of(8192, 4096, 1 << 20).find("longer than the model's context (4096"), std::string::npos);
}

}  // namespace
}  // namespace peregrine
