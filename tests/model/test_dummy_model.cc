// `--load-format dummy` with layers made as they are placed (lazy_layers, what the worker loads):
// the same values as the eager load, and what placing copied (the CUDA backend's stacked q|k|v and
// gate|up, FP8 matrices) released layer by layer instead of living beside the placed copies.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/llama.h"
#include "model/loader.h"
#include "support/golden_util.h"
#include "support/parallel_steps.h"

namespace peregrine::testing {
namespace {

TEST(DummyModel, LazyLayersHoldTheEagerValues) {
    for (const std::string& path : {models_dir() + "/stories260K", data_dir() + "/qwen2-tiny"}) {
        SCOPED_TRACE(path);
        CpuBackend backend(1);
        const auto eager = load_dummy_model(path, backend, 7);
        const auto lazy = load_dummy_model(path, backend, 7, 0.02f, {}, {}, /*lazy_layers=*/true);
        for (const LayerWeights& l : lazy->weights.layers) EXPECT_TRUE(l.wq.empty() && l.attn_norm.empty());
        ASSERT_TRUE(lazy->make_layer && lazy->layer_placed);
        LlamaModel a(*eager, backend, {}), b(*lazy, backend, {});
        const std::vector<float> want = run_two_sequence_steps(a, backend), got = run_two_sequence_steps(b, backend);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
        // Layer 1 made again draws what the eager load drew.
        const LayerWeights l1 = lazy->make_layer(1);
        EXPECT_EQ(std::memcmp(l1.w_down.data, eager->weights.layers[1].w_down.data, l1.w_down.nbytes()), 0);
        lazy->layer_placed(l1, LayerWeights());  // nothing placed points into it: all released
    }
}

// layer_placed keeps what the placed layer points into (owned until the model goes) and releases
// the rest: a kept tensor stays readable, a released one is never touched again (the sanitizer
// run of the suite would see a use after free, a double free or a leak).
TEST(DummyModel, LazyLayerKeepsWhatThePlacedLayerPointsInto) {
    CpuBackend backend(1);
    const std::string path = data_dir() + "/qwen2-tiny";
    const auto eager = load_dummy_model(path, backend, 5);
    const auto lazy = load_dummy_model(path, backend, 5, 0.02f, {}, {}, /*lazy_layers=*/true);
    const LayerWeights made = lazy->make_layer(0);
    LayerWeights placed;  // as a backend that keeps wo and the norms and copies the rest
    placed.wo = made.wo;
    placed.attn_norm = made.attn_norm;
    placed.ffn_norm = made.ffn_norm;
    placed.w_gate_up = eager->weights.layers[0].w_gate;  // a tensor of another owner: not the made one's
    lazy->layer_placed(made, placed);
    const LayerWeights& want = eager->weights.layers[0];
    EXPECT_EQ(std::memcmp(made.wo.data, want.wo.data, want.wo.nbytes()), 0);
    EXPECT_EQ(std::memcmp(made.ffn_norm.data, want.ffn_norm.data, want.ffn_norm.nbytes()), 0);
    EXPECT_THROW(lazy->make_layer(lazy->config.num_layers), Error);
}

}  // namespace
}  // namespace peregrine::testing
