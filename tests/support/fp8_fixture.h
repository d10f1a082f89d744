// FP8 checkpoints made at test time from a bf16 fixture folder (tests/data/<model>), in the
// forms Hugging Face publishes (src/model/fp8_checkpoint.h), each with a reference folder
// holding the same weights dequantized here by plain arithmetic (value * factor), which the
// existing loader reads as ordinary f32 / bf16 tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/quant.h"
#include "formats/safetensors.h"
#include "support/safetensors_writer.h"

namespace peregrine::testing {

enum class Fp8Layout {
    CompressedChannel,  // compressed-tensors, strategy channel: bf16 weight_scale [rows, 1], static input_scale [1]
    CompressedTensor,   // compressed-tensors, strategy tensor: f32 weight_scale [1], dynamic activations
    Fp8Tensor,          // quant_method fp8 (vLLM): f32 weight_scale [] (one factor a tensor)
    Fp8Block,           // quant_method fp8, weight_block_size [16, 16]: f32 weight_scale_inv [rows/16, cols/16]
    Fp8RowBlock,        // quant_method fp8, weight_block_size [16, 4096]: one factor per 16 rows (exactly per-row)
};

struct Fp8Fixture {
    std::filesystem::path quantized;  // config.json with quantization_config, F8_E4M3 layer matrices
    std::filesystem::path reference;  // the same values dequantized: f32 (bf16 for Fp8Block)
    // Per quantized weight name: its factors as written ([row blocks, column blocks], row-major).
    std::map<std::string, std::vector<float>> factors;
};

// Layer matrices: "...layers.N....*_proj.weight".
inline bool is_layer_matrix(const std::string& name) {
    return name.find(".layers.") != std::string::npos && name.size() > 12 &&
           name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

// Writes `dir`/fp8 and `dir`/ref from the bf16 model folder `src`.
inline Fp8Fixture make_fp8_fixture(const std::filesystem::path& src, const std::filesystem::path& dir,
                                   Fp8Layout layout) {
    namespace fs = std::filesystem;
    using json = nlohmann::json;
    Fp8Fixture fx;
    fx.quantized = dir / "fp8";
    fx.reference = dir / "ref";
    for (const fs::path& d : {fx.quantized, fx.reference}) {
        fs::remove_all(d);
        fs::create_directories(d);
        for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"})
            if (fs::exists(src / f)) fs::copy_file(src / f, d / f);
    }
    json config = json::parse(std::ifstream(src / "config.json"));
    fs::copy_file(src / "config.json", fx.reference / "config.json");
    json group = {{"targets", {"Linear"}},
                  {"weights", {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", false}}}};
    json q;
    switch (layout) {
        case Fp8Layout::CompressedChannel:
        case Fp8Layout::CompressedTensor: {
            const bool channel = layout == Fp8Layout::CompressedChannel;
            group["weights"]["strategy"] = channel ? "channel" : "tensor";
            group["input_activations"] = {
                {"num_bits", 8}, {"type", "float"}, {"dynamic", !channel}, {"strategy", channel ? "tensor" : "token"}};
            q = {{"quant_method", "compressed-tensors"},
                 {"format", "float-quantized"},
                 {"quantization_status", "compressed"},
                 {"config_groups", {{"group_0", group}}},
                 {"ignore", {"lm_head"}}};
            break;
        }
        case Fp8Layout::Fp8Tensor:
            q = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
            break;
        case Fp8Layout::Fp8Block:
        case Fp8Layout::Fp8RowBlock:
            q = {{"quant_method", "fp8"},
                 {"activation_scheme", "dynamic"},
                 {"weight_block_size", {16, layout == Fp8Layout::Fp8Block ? 16 : 4096}}};
            break;
    }
    config["quantization_config"] = q;
    std::ofstream(fx.quantized / "config.json") << config.dump(2);

    const SafetensorsSet set = SafetensorsSet::open_dir(src.string());
    std::vector<StTensor> fp8, ref;
    for (const auto& [name, e] : set.entries()) {
        const Tensor& t = e.view;
        std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
        std::vector<float> x(static_cast<size_t>(t.numel()));
        dequantize_row(t.dtype, t.data, x.data(), t.numel());
        if (!is_layer_matrix(name)) {
            StTensor copy{name, t.dtype == DType::BF16 ? "BF16" : "F32", shape,
                          std::vector<uint8_t>(static_cast<const uint8_t*>(t.data),
                                               static_cast<const uint8_t*>(t.data) + t.nbytes())};
            fp8.push_back(copy);
            ref.push_back(copy);
            continue;
        }
        const int64_t rows = t.rows(), cols = t.cols();
        // One factor per block of br x bc elements: per channel [1, cols], per tensor the whole.
        int64_t br = rows, bc = cols;
        if (layout == Fp8Layout::CompressedChannel) br = 1;
        if (layout == Fp8Layout::Fp8Block) br = bc = 16;
        if (layout == Fp8Layout::Fp8RowBlock) br = 16, bc = 4096;
        const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
        std::vector<float> factor(static_cast<size_t>(nbr * nbc));
        for (int64_t b = 0; b < nbr * nbc; ++b) {
            const int64_t r0 = b / nbc * br, c0 = b % nbc * bc;
            float amax = 0.0f;
            for (int64_t r = r0; r < std::min(rows, r0 + br); ++r)
                for (int64_t c = c0; c < std::min(cols, c0 + bc); ++c)
                    amax = std::max(amax, std::fabs(x[r * cols + c]));
            factor[b] = amax > 0.0f ? amax / 448.0f : 1.0f;
            // A bf16 factor tensor holds the factor rounded: quantize against that one.
            if (layout == Fp8Layout::CompressedChannel) factor[b] = bf16_to_f32(f32_to_bf16(factor[b]));
        }
        StTensor codes{name, "F8_E4M3", shape, std::vector<uint8_t>(x.size())};
        std::vector<float> deq(x.size());
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                const float f = factor[(r / br) * nbc + c / bc];
                const uint8_t code = f32_to_f8e4m3(x[r * cols + c] / f);
                codes.bytes[r * cols + c] = code;
                deq[r * cols + c] = f8e4m3_to_f32(code) * f;
            }
        fp8.push_back(codes);
        switch (layout) {
            case Fp8Layout::CompressedChannel:
                fp8.push_back(st_half(name + "_scale", "BF16", {rows, 1}, factor));
                fp8.push_back(st_f32(name.substr(0, name.size() - 6) + "input_scale", {1}, {0.01f}));
                break;
            case Fp8Layout::CompressedTensor:
                fp8.push_back(st_f32(name + "_scale", {1}, factor));
                break;
            case Fp8Layout::Fp8Tensor:
                fp8.push_back(st_f32(name + "_scale", {}, factor));
                break;
            case Fp8Layout::Fp8Block:
            case Fp8Layout::Fp8RowBlock:
                fp8.push_back(st_f32(name + "_scale_inv", {nbr, nbc}, factor));
                break;
        }
        fx.factors[name] = factor;
        // Non-uniform blocks load as bf16 (fp8_checkpoint.h): the reference rounds the same way.
        ref.push_back(layout == Fp8Layout::Fp8Block ? st_half(name, "BF16", shape, deq) : st_f32(name, shape, deq));
    }
    write_safetensors(fx.quantized / "model.safetensors", fp8);
    write_safetensors(fx.reference / "model.safetensors", ref);
    return fx;
}

}  // namespace peregrine::testing
