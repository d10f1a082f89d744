#include "model/loader.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/quant.h"
#include "formats/gguf.h"
#include "formats/gguf_config.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"

namespace peregrine {

namespace fs = std::filesystem;

LoadedModel::~LoadedModel() = default;

namespace {

// Looks tensors up by name in one file format and checks their shapes.
class TensorSource {
  public:
    virtual ~TensorSource() = default;
    virtual const std::string& file_for_errors() const = 0;
    // Empty tensor when absent.
    virtual Tensor find(const std::string& name) const = 0;

    Tensor get(const std::string& name, std::initializer_list<int64_t> shape) const {
        Tensor t = find(name);
        if (t.empty()) fail(file_for_errors(), ": missing tensor '", name, "'");
        check_shape(name, t, shape);
        return t;
    }
    Tensor get_optional(const std::string& name, std::initializer_list<int64_t> shape) const {
        Tensor t = find(name);
        if (!t.empty()) check_shape(name, t, shape);
        return t;
    }

  private:
    void check_shape(const std::string& name, const Tensor& t, std::initializer_list<int64_t> shape) const {
        Tensor want(nullptr, t.dtype, shape);
        bool same = want.ndim == t.ndim;
        for (int i = 0; same && i < t.ndim; ++i) same = want.shape[i] == t.shape[i];
        if (!same)
            fail(file_for_errors(), ": tensor '", name, "' has shape ", t.shape_str(), ", expected ", want.shape_str());
    }
};

class SafetensorsSource final : public TensorSource {
  public:
    SafetensorsSource(const SafetensorsSet& set, std::string dir) : set_(set), dir_(std::move(dir)) {}
    const std::string& file_for_errors() const override { return dir_; }
    Tensor find(const std::string& name) const override {
        const SafetensorsEntry* e = set_.find(name);
        return e ? e->view : Tensor();
    }

  private:
    const SafetensorsSet& set_;
    std::string dir_;
};

class GgufSource final : public TensorSource {
  public:
    explicit GgufSource(const GgufFile& g) : g_(g) {}
    const std::string& file_for_errors() const override { return g_.path(); }
    Tensor find(const std::string& name) const override { return g_.find_tensor(name) ? g_.tensor(name) : Tensor(); }

  private:
    const GgufFile& g_;
};

// Tensor names of the two layouts.
struct Names {
    std::string embed, final_norm, lm_head;
    std::function<std::string(int, const char*)> layer;  // (layer, canonical part) -> name
};

Names hf_names() {
    static const std::map<std::string, std::string> parts = {
        {"attn_norm", "input_layernorm.weight"},
        {"wq", "self_attn.q_proj.weight"},
        {"wk", "self_attn.k_proj.weight"},
        {"wv", "self_attn.v_proj.weight"},
        {"bq", "self_attn.q_proj.bias"},
        {"bk", "self_attn.k_proj.bias"},
        {"bv", "self_attn.v_proj.bias"},
        {"q_norm", "self_attn.q_norm.weight"},
        {"k_norm", "self_attn.k_norm.weight"},
        {"wo", "self_attn.o_proj.weight"},
        {"ffn_norm", "post_attention_layernorm.weight"},
        {"w_gate", "mlp.gate_proj.weight"},
        {"w_up", "mlp.up_proj.weight"},
        {"w_down", "mlp.down_proj.weight"},
    };
    return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            [](int l, const char* p) { return "model.layers." + std::to_string(l) + "." + parts.at(p); }};
}

Names gguf_names() {
    static const std::map<std::string, std::string> parts = {
        {"attn_norm", "attn_norm.weight"},
        {"wq", "attn_q.weight"},
        {"wk", "attn_k.weight"},
        {"wv", "attn_v.weight"},
        {"bq", "attn_q.bias"},
        {"bk", "attn_k.bias"},
        {"bv", "attn_v.bias"},
        {"q_norm", "attn_q_norm.weight"},
        {"k_norm", "attn_k_norm.weight"},
        {"wo", "attn_output.weight"},
        {"ffn_norm", "ffn_norm.weight"},
        {"w_gate", "ffn_gate.weight"},
        {"w_up", "ffn_up.weight"},
        {"w_down", "ffn_down.weight"},
    };
    return {"token_embd.weight", "output_norm.weight", "output.weight",
            [](int l, const char* p) { return "blk." + std::to_string(l) + "." + parts.at(p); }};
}

class Builder {
  public:
    Builder(LoadedModel& m, const TensorSource& src, const LoadOptions& opt) : m_(m), src_(src), opt_(opt) {}

    void build(const Names& names) {
        const ModelConfig& c = m_.config;
        const int64_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
        const int64_t Q = c.q_dim(), KV = c.kv_dim(), D = c.head_dim;
        ModelWeights& w = m_.weights;
        w.embed = src_.get(names.embed, {V, H});
        touch(w.embed);
        w.final_norm = vector_f32(names.final_norm, src_.get(names.final_norm, {H}));
        w.layers.resize(c.num_layers);
        for (int l = 0; l < c.num_layers; ++l) {
            LayerWeights& L = w.layers[l];
            auto mat = [&](const char* part, int64_t rows, int64_t cols) {
                const std::string name = names.layer(l, part);
                return matrix(name, src_.get(name, {rows, cols}));
            };
            auto vec = [&](const char* part, int64_t n, bool required) {
                const std::string name = names.layer(l, part);
                Tensor t = required ? src_.get(name, {n}) : src_.get_optional(name, {n});
                return t.empty() ? t : vector_f32(name, t);
            };
            L.attn_norm = vec("attn_norm", H, true);
            L.wq = mat("wq", Q, H);
            L.wk = mat("wk", KV, H);
            L.wv = mat("wv", KV, H);
            L.bq = vec("bq", Q, c.attention_bias);
            L.bk = vec("bk", KV, c.attention_bias);
            L.bv = vec("bv", KV, c.attention_bias);
            L.q_norm = vec("q_norm", D, c.qk_norm);
            L.k_norm = vec("k_norm", D, c.qk_norm);
            L.wo = mat("wo", H, Q);
            L.ffn_norm = vec("ffn_norm", H, true);
            L.w_gate = mat("w_gate", F, H);
            L.w_up = mat("w_up", F, H);
            L.w_down = mat("w_down", H, F);
        }
        Tensor head = src_.get_optional(names.lm_head, {V, H});
        if (head.empty()) {
            if (!c.tie_word_embeddings && m_.format == "safetensors")
                fail(src_.file_for_errors(), ": missing tensor '", names.lm_head, "' (tie_word_embeddings is false)");
            w.lm_head = matrix(names.embed, w.embed);  // tied
        } else {
            w.lm_head = matrix(names.lm_head, head);
        }
        std::string summary;
        for (const auto& [dtype, count] : dtype_counts_)
            summary += str_cat(summary.empty() ? "" : ", ", dtype, " x ", count);
        m_.weight_dtypes = summary;
        if (opt_.progress) opt_.progress(total_bytes_, total_bytes_);
    }

  private:
    // A matrix the matmul reads: kept in place when the backend reads its dtype, else f32.
    Tensor matrix(const std::string& name, const Tensor& t) {
        ++dtype_counts_[std::string(dtype_name(t.dtype))];
        if (opt_.matmul_dtype_ok && opt_.matmul_dtype_ok(t.dtype)) {
            touch(t);
            return t;
        }
        return to_f32(name, t);
    }
    Tensor vector_f32(const std::string& name, const Tensor& t) { return t.dtype == DType::F32 ? t : to_f32(name, t); }

    Tensor to_f32(const std::string& name, const Tensor& t) {
        if (t.dtype == DType::I32) fail(src_.file_for_errors(), ": tensor '", name, "' has integer dtype");
        std::vector<float>& buf = m_.converted.emplace_back(t.numel());
        const int64_t cols = t.cols();
        for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.dtype, t.row(r), buf.data() + r * cols, cols);
        Tensor out = t;
        out.dtype = DType::F32;
        out.data = buf.data();
        report(t.nbytes());
        return out;
    }

    // Pages a mapped tensor in now (one read per page) so that the first step does not stall
    // on disk, and reports progress.
    void touch(const Tensor& t) {
        const size_t n = t.nbytes();
        const volatile uint8_t* p = static_cast<const uint8_t*>(t.data);
        uint8_t sink = 0;
        for (size_t i = 0; i < n; i += 4096) sink ^= p[i];
        (void)sink;
        report(n);
    }
    void report(size_t bytes) {
        done_bytes_ += bytes;
        if (opt_.progress) opt_.progress(done_bytes_, total_bytes_);
    }

  public:
    size_t total_bytes_ = 0;

  private:
    LoadedModel& m_;
    const TensorSource& src_;
    const LoadOptions& opt_;
    size_t done_bytes_ = 0;
    std::map<std::string, int> dtype_counts_;
};

bool has_gguf_magic(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char magic[4] = {};
    const size_t n = std::fread(magic, 1, 4, f);
    std::fclose(f);
    return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

std::unique_ptr<LoadedModel> open_model_config(const std::string& path_in) {
    auto m = std::make_unique<LoadedModel>();
    std::error_code ec;
    if (!fs::exists(path_in, ec)) fail(path_in, ": no such file or directory");
    std::string path = path_in;
    if (fs::is_regular_file(path) && fs::path(path).extension() == ".safetensors") path = fs::path(path).parent_path();
    m->path = path;

    if (fs::is_directory(path)) {
        m->format = "safetensors";
        m->model_dir = path;
        m->config = read_hf_config(path);
        return m;
    }
    if (fs::path(path).extension() == ".gguf" || has_gguf_magic(path)) {
        m->format = "gguf";
        m->gguf = std::make_shared<GgufFile>(path);
        m->config = read_gguf_config(*m->gguf);
        ModelConfig& c = m->config;
        // Facts GGUF keeps in the tensor list rather than the metadata.
        c.attention_bias = m->gguf->find_tensor("blk.0.attn_q.bias") != nullptr;
        c.tie_word_embeddings = m->gguf->find_tensor("output.weight") == nullptr;
        if (m->gguf->find_tensor("rope_freqs.weight")) {
            Tensor t = m->gguf->tensor("rope_freqs.weight");
            if (t.dtype != DType::F32) fail(path, ": tensor 'rope_freqs.weight' must be f32");
            c.rope.freq_factors.assign(t.ptr<float>(), t.ptr<float>() + t.numel());
        }
        c.validate(path);
        return m;
    }
    fail(path, ": not a model (expected a folder with config.json, a .safetensors file, or a GGUF file)");
}

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
    std::unique_ptr<LoadedModel> m = open_model_config(path);
    if (m->gguf) {
        GgufSource src(*m->gguf);
        Builder b(*m, src, options);
        for (const GgufTensorInfo& t : m->gguf->tensors()) b.total_bytes_ += t.nbytes;
        b.build(gguf_names());
        return m;
    }
    m->safetensors = std::make_shared<SafetensorsSet>(SafetensorsSet::open_dir(m->path));
    SafetensorsSource src(*m->safetensors, m->path);
    Builder b(*m, src, options);
    for (const auto& [name, e] : m->safetensors->entries()) b.total_bytes_ += e.view.nbytes();
    b.build(hf_names());
    return m;
}

std::string default_model_path() {
    if (const char* env = std::getenv("PEREGRINE_MODELS")) return (fs::path(env) / "stories260K").string();
    std::vector<fs::path> candidates;
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = 0;
        const fs::path dir = fs::path(exe).parent_path();
        candidates = {dir / "models", dir.parent_path() / "models", dir.parent_path() / "share/peregrine/models"};
    }
    candidates.push_back(fs::path(PG_SOURCE_DIR) / "models");
    for (const fs::path& c : candidates) {
        std::error_code ec;
        if (fs::exists(c / "stories260K" / "config.json", ec)) return (c / "stories260K").string();
    }
    fail("the embedded model (models/stories260K) was not found next to the binary or in ", PG_SOURCE_DIR,
         "; pass --model PATH");
}

}  // namespace peregrine
