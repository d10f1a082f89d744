// FP8 checkpoints (model/fp8_checkpoint.h) on the GPU, made at test time from the bf16 fixtures
// (tests/support/fp8_fixture.h): the layer matrices stay FP8 on the device (codes and row
// factors copied, q|k|v and gate|up stacked with their factors), and the logits follow the same
// weights dequantized by the test; batch-invariant mode converts them to bf16 with the factors
// applied, bit for bit what the dequantized reference becomes.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cuda/cuda_backend.h"
#include "support/cuda_test_util.h"
#include "support/fp8_fixture.h"
#include "support/golden_util.h"

namespace peregrine {
namespace {

namespace fs = std::filesystem;
using testing::Fp8Layout;
using testing::TestModel;

TEST(CudaFp8Checkpoint, KeepsFp8AndFollowsDequantizedWeights) {
    PG_SKIP_WITHOUT_CUDA();
    const fs::path tmp = fs::temp_directory_path() / ("pg-fp8-ckpt-" + std::to_string(::getpid()));
    // llama3-tiny places q|k|v stacked (place_stacked), qwen3-tiny apart (qk-norm).
    for (const char* model : {"llama3-tiny", "qwen3-tiny"}) {
        const fs::path src = fs::path(testing::data_dir()) / model;
        const auto golden = testing::read_json_file((src / "golden.json").string());
        const std::vector<int32_t> ids = golden["prompt_ids"].get<std::vector<int32_t>>();
        for (Fp8Layout layout : {Fp8Layout::CompressedChannel, Fp8Layout::Fp8Tensor}) {
            SCOPED_TRACE(std::string(model) + " layout " + std::to_string(static_cast<int>(layout)));
            const testing::Fp8Fixture fx = testing::make_fp8_fixture(src, tmp / model, layout);
            TestModel ref(fx.reference.string(), std::make_unique<CudaBackend>());  // dequantized, as bf16
            TestModel q(fx.quantized.string(), std::make_unique<CudaBackend>());
            // One byte a layer-matrix element instead of two (plus 4 bytes a row of factors).
            EXPECT_LT(q.backend->weight_bytes(), ref.backend->weight_bytes() * 0.8);
            for (int chunk : {0, 1}) {  // cuBLASLt FP8 GEMMs, then the decode kernel
                const testing::LogitStats s =
                    testing::compare_logits(ref.all_logits(ids, chunk), q.all_logits(ids, chunk), ref.vocab());
                std::printf("fp8 checkpoint %s layout %d chunk %d: mean KL %.3g vs dequantized, max |diff| %.3g\n",
                            model, static_cast<int>(layout), chunk, s.mean_kl, s.max_abs_diff);
                EXPECT_LE(s.mean_kl, 5e-3) << "chunk " << chunk;
            }
            // Batch-invariant products are bf16 only: the FP8 matrices become bf16 at placement
            // (convert_rows_into, factors applied), the same bits as the reference's f32 values.
            CudaOptions inv;
            inv.batch_invariant = true;
            TestModel ref_inv(fx.reference.string(), std::make_unique<CudaBackend>(inv));
            TestModel q_inv(fx.quantized.string(), std::make_unique<CudaBackend>(inv));
            EXPECT_EQ(q_inv.all_logits(ids), ref_inv.all_logits(ids));
        }
    }
    fs::remove_all(tmp);
}

}  // namespace
}  // namespace peregrine
