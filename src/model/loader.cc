#include "model/loader.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/quant.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"
#include "model/registry.h"

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

class Builder {
  public:
    Builder(LoadedModel& m, const TensorSource& src, const LoadOptions& opt) : m_(m), src_(src), opt_(opt) {}

    // Every tensor of ModelWeights, found through the architecture's `names` for this layout.
    void build(const WeightNames& names) {
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
                const std::string name = names.in_layer(l, part);
                return matrix(name, src_.get(name, {rows, cols}));
            };
            auto vec = [&](const char* part, int64_t n, bool required) {
                const std::string name = names.in_layer(l, part);
                Tensor t = required ? src_.get(name, {n}) : src_.get_optional(name, {n});
                return t.empty() ? t : vector_f32(name, t);
            };
            L.attn_norm = vec(names.layer.attn_norm, H, true);
            L.wq = mat(names.layer.wq, Q, H);
            L.wk = mat(names.layer.wk, KV, H);
            L.wv = mat(names.layer.wv, KV, H);
            L.bq = vec(names.layer.bq, Q, c.attention_bias);
            L.bk = vec(names.layer.bk, KV, c.attention_bias);
            L.bv = vec(names.layer.bv, KV, c.attention_bias);
            L.q_norm = vec(names.layer.q_norm, D, c.qk_norm);
            L.k_norm = vec(names.layer.k_norm, D, c.qk_norm);
            L.wo = mat(names.layer.wo, H, Q);
            L.ffn_norm = vec(names.layer.ffn_norm, H, true);
            L.w_gate = mat(names.layer.w_gate, F, H);
            L.w_up = mat(names.layer.w_up, F, H);
            L.w_down = mat(names.layer.w_down, H, F);
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
        return m;
    }
    fail(path, ": not a model (expected a folder with config.json, a .safetensors file, or a GGUF file)");
}

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
    std::unique_ptr<LoadedModel> m = open_model_config(path);
    const Architecture& arch = architecture_named(m->config.arch);
    if (m->gguf) {
        GgufSource src(*m->gguf);
        Builder b(*m, src, options);
        for (const GgufTensorInfo& t : m->gguf->tensors()) b.total_bytes_ += t.nbytes;
        b.build(*arch.gguf_weights);
        return m;
    }
    m->safetensors = std::make_shared<SafetensorsSet>(SafetensorsSet::open_dir(m->path));
    SafetensorsSource src(*m->safetensors, m->path);
    Builder b(*m, src, options);
    for (const auto& [name, e] : m->safetensors->entries()) b.total_bytes_ += e.view.nbytes();
    b.build(*arch.hf_weights);
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
