// The whole model on the GPU with an FP8 KV cache (--kv-cache-dtype fp8) against the same model
// with the bf16 cache over the golden prompts, whole, in chunks and one token a step (the decode
// kernels): mean KL <= 1e-3, no argmax flip where the top two are 0.05 apart, and the argmax
// agreement over all positions printed (issue #23's figure); and batch-invariant mode stays
// batch-invariant with an FP8 cache (a token's quantization is its own).
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "support/engine_runs.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

#define SKIP_WITHOUT_GPU() \
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device"

std::unique_ptr<Backend> cuda_backend(bool batch_invariant, bool fp8) {
    CudaOptions o;
    o.batch_invariant = batch_invariant;
    auto b = std::make_unique<CudaBackend>(o);
    if (fp8) b->set_kv_cache_dtype(DType::F8_E4M3);
    return b;
}

TEST(GpuFp8Kv, AgreesWithBf16KvOnTheGoldenPrompts) {
    SKIP_WITHOUT_GPU();
    const std::string m = models_dir(), d = data_dir();
    const std::pair<const char*, std::string> models[] = {{"stories260K", m + "/stories260K"},
                                                          {"llama3_tiny", d + "/llama3-tiny"},
                                                          {"qwen2_tiny", d + "/qwen2-tiny"},
                                                          {"qwen3_tiny", d + "/qwen3-tiny"}};
    for (const bool invariant : {false, true}) {
        size_t positions = 0, mismatches = 0;
        for (const auto& [name, path] : models) {
            const auto golden = read_json_file(path + "/golden.json");
            const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
            TestModel bf16(path, cuda_backend(invariant, false)), fp8(path, cuda_backend(invariant, true));
            ASSERT_EQ(fp8.model->kv_cache_shape(1, 16).dtype, DType::F8_E4M3);
            for (int chunk : {0, 7, 1}) {
                const std::vector<float> ref = bf16.all_logits(prompt, chunk);
                const std::vector<float> got = fp8.all_logits(prompt, chunk);
                const LogitStats s = compare_logits(ref, got, bf16.vocab());
                const Decisive dec = decisive(ref, got, bf16.vocab(), 0.05);
                std::printf(
                    "gpu fp8 kv %-12s %s chunk %d: argmax agreement %.4f (%zu of %zu differ, reference gap <= "
                    "%.3g), mean KL %.3g; %zu of %zu positions with a gap >= 0.05 differ\n",
                    name, invariant ? "invariant" : "default", chunk, s.argmax_agree, s.argmax_mismatches,
                    prompt.size(), dec.worst_flip_gap, s.mean_kl, dec.flips, dec.positions);
                EXPECT_LE(s.mean_kl, 1e-3) << name << " chunk " << chunk;
                EXPECT_GT(s.max_abs_diff, 0.0) << name << ": the FP8 cache changed nothing (not in use?)";
                EXPECT_EQ(dec.flips, 0u) << name << " chunk " << chunk << ": a flip where the top two are 0.05 apart";
                positions += prompt.size();
                mismatches += s.argmax_mismatches;
            }
        }
        // Issue #23's figure, printed: these fixtures' random weights leave many near-ties (the CPU
        // against its f32 cache: 0.972 over the same prompts, every flip at a top-two gap <= 0.016).
        std::printf("gpu fp8 kv (%s): argmax agreement %.4f over %zu positions\n", invariant ? "invariant" : "default",
                    1.0 - static_cast<double>(mismatches) / positions, positions);
    }
}

// Issue #23's ">= 99% argmax agreement against bf16 KV" on the trained fixture (64-wide heads:
// the tensor-core FP8 decode kernel; tests/data/README.md) over its 8 held-out passages, in
// chunks of 16 (prefill over cached FP8 blocks) and one token a step (the decode kernels).
// Measured on an H200 (2026-11-28): 0.9746 / 0.9766, mean KL 2.9e-3 / 3.1e-3; transformers with
// the same E4M3 round trip of its keys and values gives 0.9771 and 2.74e-3 against f32
// (scripts/fp8-reference.py), the CPU backend the same. Below the 99%: the format's
// error on keys (Fp8KvLogits.TextTrainedModelAgreesOnHeldOutText). The bounds hold that level.
TEST(GpuFp8Kv, TextTrainedModelAgreesOnHeldOutText) {
    SKIP_WITHOUT_GPU();
    const std::string path = data_dir() + "/text-trained";
    TestModel bf16(path, cuda_backend(false, false)), fp8(path, cuda_backend(false, true));
    for (int chunk : {16, 1}) {
        std::printf("gpu fp8 kv, chunk %d: ", chunk);
        const HeldOutAgreement h = text_trained_agreement(
            [&](const std::vector<int32_t>& ids) { return bf16.all_logits(ids, chunk); },
            [&](const std::vector<int32_t>& ids) { return fp8.all_logits(ids, chunk); }, bf16.vocab());
        EXPECT_GE(h.agree(), 0.965) << "chunk " << chunk;
        EXPECT_LE(h.mean_kl, 4e-3) << "chunk " << chunk;
    }
}

// Batch-invariant kernels over an FP8 cache: a crowd's tokens are each request's alone.
TEST(GpuFp8Kv, BatchInvariantCrowdMatchesAlone) {
    SKIP_WITHOUT_GPU();
    TestModel g(models_dir() + "/stories260K", cuda_backend(true, true));
    const std::vector<Request> reqs = random_greedy_requests(48, 7);
    const TokensById solo = run_alone(g, reqs);
    for (int budget : {2048, 32}) {
        const TokensById crowd = run_crowd(g, reqs, budget, 512, 5);
        for (const Request& r : reqs) EXPECT_EQ(crowd.at(r.id), solo.at(r.id)) << r.id << " budget " << budget;
    }
}

}  // namespace
}  // namespace peregrine::testing
