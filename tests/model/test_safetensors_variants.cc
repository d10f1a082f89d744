// A Hugging Face folder in other storage forms: f16 tensors in two shards behind
// model.safetensors.index.json, from qwen3-tiny's bf16 weights. Same golden logits.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/half.h"
#include "core/quant.h"
#include "formats/safetensors.h"
#include "support/golden_util.h"
#include "support/safetensors_writer.h"

namespace peregrine::testing {
namespace {

namespace fs = std::filesystem;

TEST(SafetensorsVariants, ShardedF16MatchesGolden) {
    const fs::path src = fs::path(data_dir()) / "qwen3-tiny";
    const fs::path dst = fs::temp_directory_path() / ("pg-sharded-" + std::to_string(::getpid()));
    fs::remove_all(dst);
    fs::create_directories(dst);
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json"}) fs::copy_file(src / f, dst / f);

    const SafetensorsSet set = SafetensorsSet::open_dir(src.string());
    std::vector<StTensor> shard[2];
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    int i = 0;
    for (const auto& [name, e] : set.entries()) {
        const int s = i++ % 2;
        std::vector<float> f(e.view.numel());
        dequantize_row(e.view.dtype, e.view.data, f.data(), e.view.numel());
        shard[s].push_back(st_half(name, "F16", {e.view.shape.begin(), e.view.shape.begin() + e.view.ndim}, f));
        index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
    }
    for (int s = 0; s < 2; ++s)
        write_safetensors(dst / ("model-0000" + std::to_string(s + 1) + "-of-00002.safetensors"), shard[s]);
    std::ofstream(dst / "model.safetensors.index.json") << index.dump();

    const auto golden = read_json_file((src / "golden.json").string());
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    TestModel m(dst.string());
    EXPECT_EQ(m.loaded->weight_dtypes.find("f16"), 0u) << m.loaded->weight_dtypes;
    const LogitStats st = compare_logits(read_f32_file((src / "logits.f32").string()), m.all_logits(prompt), m.vocab());
    EXPECT_LE(st.max_abs_diff, 1e-3);
    EXPECT_EQ(st.argmax_mismatches, 0u);
    EXPECT_EQ(m.greedy(prompt, 32), golden["greedy_ids"].get<std::vector<int>>());

    // A shard listed in the index but absent is an error naming it.
    fs::remove(dst / "model-00002-of-00002.safetensors");
    EXPECT_THROW(TestModel bad(dst.string()), Error);
    fs::remove_all(dst);
}

}  // namespace
}  // namespace peregrine::testing
