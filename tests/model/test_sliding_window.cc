// Sliding-window attention (mistral, qwen2 with use_sliding_window): a query at position p
// sees keys in (p - window, p]. Checked through the whole model and on the attention op.
#include <gtest/gtest.h>

#include <random>

#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

constexpr int kWindow = 16;

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n);
    ids[0] = 1;
    for (int i = 1; i < n; ++i) ids[i] = 3 + static_cast<int32_t>(rng() % 500);
    return ids;
}

std::vector<float> last_logits(TestModel& m, const std::vector<int32_t>& ids) {
    std::vector<float> all = m.all_logits(ids);
    return std::vector<float>(all.end() - m.vocab(), all.end());
}

TEST(SlidingWindow, TokensOutsideTheWindowDoNotMatter) {
    TestModel m(models_dir() + "/stories260K", 2, [](ModelConfig& c) { c.layer_window.assign(c.num_layers, kWindow); });
    const int layers = m.loaded->config.num_layers;
    const int n = 120;
    const int last = n - 1;
    // Each layer reaches window - 1 positions further back, so the last position depends on
    // positions >= last - layers * (window - 1) and on nothing before.
    const int reach = last - layers * (kWindow - 1);
    ASSERT_GT(reach, 10);
    const std::vector<int32_t> base = random_tokens(n, 7);
    const std::vector<float> ref = last_logits(m, base);

    std::vector<int32_t> far = base;
    for (int i = 1; i < reach; ++i) far[i] = 3 + (far[i] + 101) % 500;
    EXPECT_EQ(last_logits(m, far), ref) << "changing positions 1.." << reach - 1 << " changed the last logits";

    std::vector<int32_t> near = base;
    near[last - 3] = 3 + (near[last - 3] + 101) % 500;
    EXPECT_NE(last_logits(m, near), ref) << "changing a token inside the window changed nothing";

    // Without the window, far tokens do matter: the test above is not vacuous.
    TestModel full(models_dir() + "/stories260K");
    EXPECT_NE(last_logits(full, far), last_logits(full, base));
}

TEST(SlidingWindow, DecodeStepsMatchOnePass) {
    TestModel m(models_dir() + "/stories260K", 2, [](ModelConfig& c) { c.layer_window.assign(c.num_layers, kWindow); });
    const std::vector<int32_t> ids = random_tokens(60, 11);
    EXPECT_EQ(m.all_logits(ids, 1), m.all_logits(ids));
    EXPECT_EQ(m.all_logits(ids, 7), m.all_logits(ids));
}

// The attention op alone: one query at position p over keys 0..p with one head.
TEST(SlidingWindow, AttentionOpMasksExactlyTheWindow) {
    CpuBackend be(1);
    const int head_dim = 4, block_size = 4, num_blocks = 8, ctx = 30;
    Tensor kc = be.allocate(DType::F32, {num_blocks, block_size, 1, head_dim});
    Tensor vc = be.allocate(DType::F32, {num_blocks, block_size, 1, head_dim});
    BatchInput b;
    b.token_ids = {0};
    b.positions = {ctx - 1};
    b.query_start = {0, 1};
    b.context_lens = {ctx};
    b.max_blocks_per_seq = num_blocks;
    for (int i = 0; i < num_blocks; ++i) b.block_tables.push_back((i * 3) % num_blocks);  // a permutation
    b.slot_mapping = {0};
    // Key j equals the query direction, value j is one-hot in dim 0 scaled by j: the output's
    // dim 0 is then the mean of the visible key indices.
    for (int j = 0; j < ctx; ++j) {
        const int slot = b.block_tables[j / block_size] * block_size + j % block_size;
        for (int d = 0; d < head_dim; ++d) {
            kc.ptr<float>()[slot * head_dim + d] = 1.0f;
            vc.ptr<float>()[slot * head_dim + d] = d == 0 ? static_cast<float>(j) : 0.0f;
        }
    }
    std::vector<float> q(head_dim, 1.0f), out(head_dim);
    Tensor qt(q.data(), DType::F32, {1, head_dim}), ot(out.data(), DType::F32, {1, head_dim});
    be.attention(qt, kc, vc, b, 1, head_dim, 1.0f, 0, ot);
    EXPECT_NEAR(out[0], (ctx - 1) / 2.0, 1e-4);  // all 30 keys
    be.attention(qt, kc, vc, b, 1, head_dim, 1.0f, 5, ot);
    EXPECT_NEAR(out[0], (25 + 29) / 2.0, 1e-4);  // keys 25..29
    be.attention(qt, kc, vc, b, 1, head_dim, 1.0f, 1, ot);
    EXPECT_NEAR(out[0], 29.0, 1e-4);  // only itself
    be.release(kc);
    be.release(vc);
}

}  // namespace
}  // namespace peregrine::testing
