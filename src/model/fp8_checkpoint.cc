#include "model/fp8_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"

namespace peregrine {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// [br, bc] from a JSON array of two positive integers at `key` (for errors).
void read_block(const json& j, const std::string& where, const std::string& key, Fp8Format& f) {
    if (!j.is_array() || j.size() != 2 || !j[0].is_number_unsigned() || !j[1].is_number_unsigned() ||
        j[0].get<int64_t>() <= 0 || j[1].get<int64_t>() <= 0)
        fail(where, ": ", key, " must be two positive integers, got ", j.dump());
    f.block_rows = j[0].get<int64_t>();
    f.block_cols = j[1].get<int64_t>();
}

std::string str_or(const json& j, const char* key, const std::string& fallback) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// quant_method "fp8": one factor per tensor, or per block with weight_block_size.
Fp8Format read_vllm_fp8(const json& q, const std::string& where) {
    Fp8Format f;
    if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
        read_block(q["weight_block_size"], where, "quantization_config.weight_block_size", f);
        f.scale_suffix = "_scale_inv";
        f.description = str_cat("fp8, ", f.block_rows, "x", f.block_cols, " blocks (weight_scale_inv)");
    } else {
        f.scale_suffix = "_scale";
        f.per_tensor = true;
        f.description = "fp8, per-tensor (weight_scale)";
    }
    const std::string act = str_or(q, "activation_scheme", "dynamic");
    if (act != "dynamic" && act != "static")
        fail(where, ": quantization_config.activation_scheme '", act, "' (expected dynamic or static)");
    f.static_input_scales = act == "static";
    return f;
}

// quant_method "compressed-tensors", float-quantized: the weights of every config group.
Fp8Format read_compressed_tensors(const json& q, const std::string& where) {
    Fp8Format f;
    f.scale_suffix = "_scale";
    if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
        fail(where, ": quantization_config (compressed-tensors) needs an object 'config_groups'");
    std::string strategies;
    for (const auto& [group, g] : q["config_groups"].items()) {
        const std::string key = "quantization_config.config_groups." + group;
        // The format may be global or (newer compressed-tensors) per group.
        const std::string format = str_or(g, "format", str_or(q, "format", ""));
        // naive-quantized stores values in their own type too: FP8 where the weights are float.
        if (format != "float-quantized" && format != "naive-quantized")
            fail(where, ": ", key, ": compressed-tensors format '", format,
                 "' is not supported (only float-quantized FP8 weights load)");
        if (!g.contains("weights") || !g["weights"].is_object()) fail(where, ": ", key, ".weights must be an object");
        const json& w = g["weights"];
        const int bits = w.value("num_bits", 0);
        const std::string type = str_or(w, "type", "");
        if (bits != 8 || type != "float")
            fail(where, ": ", key, ".weights: num_bits ", bits, " type '", type,
                 "' is not supported (FP8 E4M3 weights are num_bits 8, type float)");
        const std::string strategy = str_or(w, "strategy", "");
        if (strategy == "tensor") {
            f.per_tensor = true;
        } else if (strategy == "channel") {
            f.per_channel = true;
        } else if (strategy == "block") {
            read_block(w.value("block_structure", json()), where, key + ".weights.block_structure", f);
        } else {
            fail(where, ": ", key, ".weights.strategy '", strategy,
                 "' is not supported (tensor, channel or block factors load)");
        }
        if (strategies.find(strategy) == std::string::npos) strategies += (strategies.empty() ? "" : "+") + strategy;
        if (g.contains("input_activations") && g["input_activations"].is_object() &&
            !g["input_activations"].value("dynamic", false))
            f.static_input_scales = true;
    }
    f.description = "compressed-tensors float-quantized, strategy " + strategies;
    f.kv_cache_scales = q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null();
    return f;
}

void check(bool ok, const std::string& where, const std::string& name, const Tensor& scale, const Tensor& w,
           const Fp8Format& f) {
    if (!ok)
        fail(where, ": tensor '", name, f.scale_suffix, "' has shape ", scale.shape_str(), " and dtype ",
             dtype_name(scale.dtype), ", which do not fit weight '", name, "' ", w.shape_str(), " (", f.description,
             ": f32/bf16/f16 of shape ",
             f.block_rows > 0 ? "[ceil(rows / block), ceil(cols / block)]"
                              : (f.per_channel ? (f.per_tensor ? "[1] or [rows, 1]" : "[rows, 1]") : "[1]"),
             ")");
}

// `values` [rows * cols] f32 as bf16 bytes in a new buffer of `bf16_bytes`; a [rows, cols] tensor.
Tensor bf16_copy(const Tensor& w, const std::vector<float>& values, std::vector<std::vector<uint8_t>>& bf16_bytes) {
    std::vector<uint8_t>& buf = bf16_bytes.emplace_back(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t h = f32_to_bf16(values[i]);
        std::memcpy(buf.data() + 2 * i, &h, 2);
    }
    Tensor out = w;
    out.dtype = DType::BF16;
    out.data = buf.data();
    out.scale = nullptr;
    return out;
}

}  // namespace

std::optional<Fp8Format> read_fp8_format(const std::string& dir) {
    const std::string where = (fs::path(dir) / "config.json").string();
    std::ifstream in(where);
    if (!in) return std::nullopt;  // read_hf_config has already said so
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        fail(where, ": invalid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return std::nullopt;
    const json& q = j["quantization_config"];
    const std::string method = q.is_object() ? str_or(q, "quant_method", "") : "";
    if (method == "fp8") return read_vllm_fp8(q, where);
    if (method == "compressed-tensors") return read_compressed_tensors(q, where);
    fail(where, ": quantization_config.quant_method '", method,
         "' is not supported (FP8 checkpoints load: quant_method fp8, or compressed-tensors float-quantized)");
}

std::string fp8_load_note(const Fp8Format& f) {
    std::string note = "fp8 checkpoint (" + f.description + ")";
    if (f.block_rows > 0)
        note += "; matrices whose blocks do not share a factor per row are dequantized to bf16 at load";
    if (f.static_input_scales) note += "; input_scale tensors ignored: activations are quantized per token at run time";
    if (f.kv_cache_scales) note += "; kv_cache_scheme ignored: the KV cache keeps its own dtype";
    return note;
}

Tensor resolve_fp8_weight(const Fp8Format& f, const std::string& where, const std::string& name, const Tensor& w,
                          const Tensor& scale, std::vector<std::vector<float>>& factors,
                          std::vector<std::vector<uint8_t>>& bf16_bytes) {
    if (scale.empty())
        fail(where, ": tensor '", name, "' is f8_e4m3 but its factors '", name, f.scale_suffix, "' are missing (",
             f.description, ")");
    if (w.ndim != 2) fail(where, ": f8_e4m3 tensor '", name, "' has shape ", w.shape_str(), " (matrices only)");
    const bool floating = scale.dtype == DType::F32 || scale.dtype == DType::BF16 || scale.dtype == DType::F16;
    const int64_t rows = w.rows(), cols = w.cols();
    const int64_t n = scale.numel();
    const bool one = f.per_tensor && n == 1 && scale.ndim <= 1;
    const bool per_row =
        f.per_channel && scale.shape[0] == rows && (scale.ndim == 1 || (scale.ndim == 2 && scale.shape[1] == 1));
    const int64_t brs = f.block_rows > 0 ? (rows + f.block_rows - 1) / f.block_rows : 0;
    const int64_t bcs = f.block_cols > 0 ? (cols + f.block_cols - 1) / f.block_cols : 0;
    const bool blocks = f.block_rows > 0 && scale.ndim == 2 && scale.shape[0] == brs && scale.shape[1] == bcs;
    check(floating && (one || per_row || blocks), where, name, scale, w, f);
    std::vector<float> s(static_cast<size_t>(n));
    dequantize_row(scale.dtype, scale.data, s.data(), n);

    // Per-row factors: exact for per-tensor and per-channel factors, and for block-wise ones
    // when each row block's factors agree across its columns.
    bool uniform = true;
    for (int64_t b = 0; b < brs && uniform; ++b)
        for (int64_t c = 1; c < bcs && uniform; ++c) uniform = s[b * bcs + c] == s[b * bcs];
    if (one || per_row || uniform) {
        std::vector<float> row_factor(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) row_factor[r] = s[one ? 0 : per_row ? r : (r / f.block_rows) * bcs];
        Tensor out = w;
        out.scale = factors.emplace_back(std::move(row_factor)).data();  // moving keeps the buffer
        return out;
    }
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
        const auto* codes = static_cast<const uint8_t*>(w.row(r));
        const float* block_factors = s.data() + (r / f.block_rows) * bcs;
        for (int64_t c = 0; c < cols; ++c)
            values[r * cols + c] = f8e4m3_to_f32(codes[c]) * block_factors[c / f.block_cols];
    }
    return bf16_copy(w, values, bf16_bytes);
}

Tensor fp8_to_bf16(const Tensor& w, std::vector<std::vector<uint8_t>>& bf16_bytes) {
    const int64_t rows = w.rows(), cols = w.cols();
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_tensor_row(w, r, values.data() + r * cols);
    return bf16_copy(w, values, bf16_bytes);
}

}  // namespace peregrine
