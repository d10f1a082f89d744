// FP8 checkpoints (model/fp8_checkpoint.h) made at test time from the bf16 fixtures in the
// build tree (tests/support/fp8_fixture.h): the loader's tensors and factors, the CPU backend's
// logits against the same weights dequantized by the test and loaded as plain f32 / bf16, and
// against the transformers golden logits; malformed checkpoints fail naming the tensor or key.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "support/fp8_fixture.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

namespace fs = std::filesystem;

// Generated checkpoints live in the build tree, next to the unpacked tokenizer fixtures.
fs::path fixture_dir(const std::string& name) {
    return fs::path(PG_TOKENIZER_DATA_DIR).parent_path() / "fp8-checkpoints" / name;
}

std::unique_ptr<LoadedModel> load(const fs::path& dir, bool fp8_readable, TensorParallel tp = {}) {
    LoadOptions opt;
    // fp8_readable: as the CUDA backend (F8_E4M3 kept); else as the CPU backend (f32).
    opt.matmul_dtype_ok = [fp8_readable](DType t) { return t == DType::BF16 || (fp8_readable && t == DType::F8_E4M3); };
    opt.tp = tp;
    return load_model(dir.string(), opt);
}

// (a) The loader's view of each layout: F8 codes in place with per-row factors (a per-tensor
// factor repeated, a row block's factor on each of its rows), row-sliced with their factors
// under tensor parallelism; f32 with the factor applied for a backend that does not read FP8;
// bf16 where block factors vary along a row.
TEST(Fp8Checkpoint, LoaderAttachesRowFactors) {
    const fs::path src = fs::path(data_dir()) / "llama3-tiny";
    for (Fp8Layout layout :
         {Fp8Layout::CompressedChannel, Fp8Layout::CompressedTensor, Fp8Layout::Fp8Tensor, Fp8Layout::Fp8RowBlock}) {
        SCOPED_TRACE(static_cast<int>(layout));
        const Fp8Fixture fx = make_fp8_fixture(src, fixture_dir("loader"), layout);
        const std::string gate = "model.layers.1.mlp.gate_proj.weight";
        const std::vector<float>& want = fx.factors.at(gate);
        // gate_proj has 160 rows: 1 factor (per tensor), 160 (per channel) or 10 (16-row blocks).
        auto factor_of_row = [&](int64_t r) { return want[r * want.size() / 160]; };

        auto m = load(fx.quantized, true);
        EXPECT_NE(m->quantization.find("fp8 checkpoint"), std::string::npos) << m->quantization;
        // Static activation factors are read by nobody, and the log says so.
        EXPECT_EQ(m->quantization.find("input_scale tensors ignored") != std::string::npos,
                  layout == Fp8Layout::CompressedChannel)
            << m->quantization;
        EXPECT_NE(m->weight_dtypes.find("f8_e4m3 x 14"), std::string::npos) << m->weight_dtypes;
        const Tensor& w = m->weights.layers[1].w_gate;
        ASSERT_EQ(w.dtype, DType::F8_E4M3);
        ASSERT_NE(w.scale, nullptr);
        ASSERT_EQ(w.rows(), 160);
        for (int64_t r = 0; r < w.rows(); ++r) ASSERT_EQ(w.scale[r], factor_of_row(r)) << r;
        EXPECT_EQ(m->weights.embed.dtype, DType::BF16);
        EXPECT_EQ(m->weights.layers[0].attn_norm.scale, nullptr);

        // Rank 1 of 2: gate rows [80, 160) and their factors; down_proj's columns [80, 160)
        // (a copy) with all of its rows' factors.
        auto half = load(fx.quantized, true, {1, 2});
        const Tensor& g1 = half->weights.layers[1].w_gate;
        ASSERT_EQ(g1.rows(), 80);
        EXPECT_EQ(std::memcmp(g1.data, static_cast<const uint8_t*>(w.data) + 80 * 64, 80 * 64), 0);
        for (int64_t r = 0; r < 80; ++r) ASSERT_EQ(g1.scale[r], factor_of_row(80 + r)) << r;
        const Tensor& d1 = half->weights.layers[1].w_down;
        ASSERT_EQ(d1.dtype, DType::F8_E4M3);
        ASSERT_EQ(d1.cols(), 80);
        EXPECT_EQ(d1.scale[0], m->weights.layers[1].w_down.scale[0]);
        EXPECT_EQ(static_cast<const uint8_t*>(d1.data)[0],
                  static_cast<const uint8_t*>(m->weights.layers[1].w_down.data)[80]);

        // Not FP8-readable: f32 = code value * factor, as the reference folder holds it.
        auto cpu = load(fx.quantized, false);
        auto ref = load(fx.reference, false);
        const Tensor& wc = cpu->weights.layers[1].w_gate;
        ASSERT_EQ(wc.dtype, DType::F32);
        EXPECT_EQ(wc.scale, nullptr);
        for (int64_t i = 0; i < wc.numel(); ++i)
            ASSERT_EQ(wc.ptr<float>()[i], ref->weights.layers[1].w_gate.ptr<float>()[i]) << i;
        EXPECT_EQ(wc.ptr<float>()[0], f8e4m3_to_f32(static_cast<const uint8_t*>(w.data)[0]) * factor_of_row(0));
        // Column slices for a backend without FP8: factors applied too.
        auto cpu_half = load(fx.quantized, false, {1, 2});
        EXPECT_EQ(cpu_half->weights.layers[1].w_down.ptr<float>()[0], ref->weights.layers[1].w_down.ptr<float>()[80]);
    }
    // 16 x 16 blocks: factors differ along a row, so the matrix is dequantized to bf16.
    const Fp8Fixture fx = make_fp8_fixture(src, fixture_dir("loader"), Fp8Layout::Fp8Block);
    auto m = load(fx.quantized, true);
    EXPECT_EQ(m->weights.layers[1].w_gate.dtype, DType::BF16);
    EXPECT_EQ(m->weights.layers[1].w_gate.scale, nullptr);
    EXPECT_NE(m->quantization.find("16x16 blocks"), std::string::npos) << m->quantization;
}

// (b) On the CPU backend each layout gives the logits of its reference folder (the test's own
// dequantization, read by the unchanged f32 / bf16 path) to within float summation noise, and
// stays near the transformers golden logits of the bf16 model. Measured here on llama3-tiny and
// qwen3-tiny: mean KL 1.8e-4 to 5.3e-4 nats against the golden (bound 2e-3), per layout and model.
TEST(Fp8Checkpoint, CpuLogitsMatchDequantizedReference) {
    for (const char* model : {"llama3-tiny", "qwen3-tiny"}) {
        const fs::path src = fs::path(data_dir()) / model;
        const auto golden = read_json_file((src / "golden.json").string());
        const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
        const std::vector<float> golden_logits = read_f32_file((src / "logits.f32").string());
        for (Fp8Layout layout :
             {Fp8Layout::CompressedChannel, Fp8Layout::CompressedTensor, Fp8Layout::Fp8Tensor, Fp8Layout::Fp8Block}) {
            SCOPED_TRACE(std::string(model) + " layout " + std::to_string(static_cast<int>(layout)));
            const Fp8Fixture fx = make_fp8_fixture(src, fixture_dir(model), layout);
            TestModel fp8(fx.quantized.string());
            TestModel ref(fx.reference.string());
            const std::vector<float> ours = fp8.all_logits(prompt);
            const LogitStats vs_ref = compare_logits(ref.all_logits(prompt), ours, fp8.vocab());
            EXPECT_LE(vs_ref.max_abs_diff, 1e-5);
            EXPECT_EQ(vs_ref.argmax_mismatches, 0u);
            const LogitStats vs_golden = compare_logits(golden_logits, ours, fp8.vocab());
            EXPECT_LE(vs_golden.mean_kl, 2e-3);
            EXPECT_GT(vs_golden.mean_kl, 0.0);  // FP8 is not the bf16 model
            std::printf("%s layout %d: vs golden mean KL %.3g, max |diff| %.3g, argmax agree %.3f\n", model,
                        static_cast<int>(layout), vs_golden.mean_kl, vs_golden.max_abs_diff, vs_golden.argmax_agree);
        }
    }
}

// Against checkpoints made by torch / transformers (scripts/make-fp8-fixture.py on the device
// machine, 2026-11-26: torch 2.11, transformers 5.17; tests/data/fp8-checkpoints.tar.xz, unpacked
// into the build folder): compressed-tensors per-channel FP8 of llama3-tiny and qwen3-tiny, each
// with transformers' float32 logits of the dequantized weights. PG_FP8_FIXTURE_DIR names another
// such folder instead. Tolerances as the bf16 fixtures' golden test (the same arithmetic in
// another order).
TEST(Fp8Checkpoint, MatchesTransformersFixture) {
    std::vector<fs::path> dirs;
    if (const char* dir = std::getenv("PG_FP8_FIXTURE_DIR")) {
        dirs.emplace_back(dir);
    } else {
        for (const char* m : {"llama3-tiny", "qwen3-tiny"}) dirs.push_back(fs::path(PG_FP8_CHECKPOINTS_DIR) / m);
    }
    for (const fs::path& dir : dirs) {
        SCOPED_TRACE(dir.string());
        ASSERT_TRUE(fs::exists(dir / "logits.f32")) << "missing fixture (tests/data/fp8-checkpoints.tar.xz)";
        const std::vector<int32_t> prompt =
            read_json_file((dir / "golden.json").string())["prompt_ids"].get<std::vector<int32_t>>();
        TestModel m(dir.string());
        EXPECT_NE(m.loaded->weight_dtypes.find("f8_e4m3 x "), std::string::npos) << m.loaded->weight_dtypes;
        const LogitStats st =
            compare_logits(read_f32_file((dir / "logits.f32").string()), m.all_logits(prompt), m.vocab());
        std::printf("%s vs transformers: max |diff| %.3g, mean KL %.3g\n", dir.filename().c_str(), st.max_abs_diff,
                    st.mean_kl);
        EXPECT_LE(st.max_abs_diff, 1e-3);
        EXPECT_EQ(st.argmax_mismatches, 0u);
    }
}

// The error of load_model on `dir`, or "" when it loads.
std::string load_error(const fs::path& dir) {
    try {
        load(dir, false);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    edit(c);
    std::ofstream(dir / "config.json") << c.dump(2);
}

// Rewrites dir/model.safetensors with `edit` applied to its tensors.
void edit_tensors(const fs::path& dir, const std::function<void(std::vector<StTensor>&)>& edit) {
    std::vector<StTensor> tensors;
    {
        const SafetensorsSet set = SafetensorsSet::open_dir(dir.string());
        for (const auto& [name, e] : set.entries()) {
            static const std::map<DType, const char*> names = {
                {DType::F32, "F32"}, {DType::BF16, "BF16"}, {DType::F16, "F16"}, {DType::F8_E4M3, "F8_E4M3"}};
            const auto* p = static_cast<const uint8_t*>(e.view.data);
            tensors.push_back({name,
                               names.at(e.view.dtype),
                               {e.view.shape.begin(), e.view.shape.begin() + e.view.ndim},
                               std::vector<uint8_t>(p, p + e.view.nbytes())});
        }
    }
    edit(tensors);
    write_safetensors(dir / "model.safetensors", tensors);
}

// (c) Malformed checkpoints: each error names the tensor or the config key.
TEST(Fp8Checkpoint, MalformedCheckpointsNameTheTensor) {
    const fs::path src = fs::path(data_dir()) / "llama3-tiny";
    const std::string q = "model.layers.0.self_attn.q_proj.weight";
    auto fresh = [&](Fp8Layout layout) { return make_fp8_fixture(src, fixture_dir("bad"), layout).quantized; };
    auto expect_error = [](const fs::path& dir, const std::vector<std::string>& parts) {
        const std::string e = load_error(dir);
        ASSERT_FALSE(e.empty());
        for (const std::string& p : parts) EXPECT_NE(e.find(p), std::string::npos) << e;
    };
    EXPECT_EQ(load_error(fresh(Fp8Layout::CompressedChannel)), "");

    // A weight without its factors.
    fs::path dir = fresh(Fp8Layout::CompressedChannel);
    edit_tensors(dir, [&](auto& t) { std::erase_if(t, [&](const StTensor& x) { return x.name == q + "_scale"; }); });
    expect_error(dir, {"'" + q + "'", q + "_scale", "missing", "strategy channel"});

    // Factors of the wrong shape: per channel [rows + 1, 1]; block factors of a vLLM
    // per-tensor checkpoint; one factor per row under strategy tensor.
    // A fresh checkpoint of `layout` whose factor tensor `name` is f32 ones of `shape`.
    auto with_factors = [&](Fp8Layout layout, const std::string& name, std::vector<int64_t> shape) {
        const fs::path d = fresh(layout);
        int64_t n = 1;
        for (int64_t s : shape) n *= s;
        edit_tensors(d, [&](auto& t) {
            for (StTensor& x : t)
                if (x.name == name) x = st_f32(name, shape, std::vector<float>(static_cast<size_t>(n), 1.0f));
        });
        return d;
    };
    expect_error(with_factors(Fp8Layout::CompressedChannel, q + "_scale", {65, 1}),
                 {q + "_scale", "[65, 1]", "[64, 64]"});
    expect_error(with_factors(Fp8Layout::CompressedTensor, q + "_scale", {64, 1}),
                 {q + "_scale", "[64, 1]", "strategy tensor"});
    dir = with_factors(Fp8Layout::Fp8Block, q + "_scale_inv", {4, 3});
    expect_error(dir, {q + "_scale_inv", "[4, 3]", "16x16 blocks"});

    // Unsupported declarations: group-wise factors, 4-bit packs, another method, FP8 without a
    // quantization_config.
    dir = fresh(Fp8Layout::CompressedChannel);
    edit_config(dir,
                [](auto& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"; });
    expect_error(dir, {"config_groups.group_0.weights.strategy", "'group'"});
    dir = fresh(Fp8Layout::CompressedChannel);
    edit_config(dir, [](auto& c) { c["quantization_config"]["format"] = "pack-quantized"; });
    expect_error(dir, {"'pack-quantized'", "float-quantized"});
    dir = fresh(Fp8Layout::CompressedChannel);
    edit_config(dir, [](auto& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4; });
    expect_error(dir, {"config_groups.group_0.weights", "num_bits 4"});
    dir = fresh(Fp8Layout::Fp8Tensor);
    edit_config(dir, [](auto& c) { c["quantization_config"]["quant_method"] = "awq"; });
    expect_error(dir, {"quant_method 'awq'"});
    dir = fresh(Fp8Layout::Fp8Tensor);
    edit_config(dir, [](auto& c) { c.erase("quantization_config"); });
    expect_error(dir, {"'model.", "f8_e4m3", "no quantization_config"});
}

}  // namespace
}  // namespace peregrine::testing
