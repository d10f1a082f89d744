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
#include "model/fp8_checkpoint.h"
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

// An f8_e4m3 weight comes with its factors (model/fp8_checkpoint.h), found by its name; the
// factor and input_scale tensors themselves are never asked for by name.
class SafetensorsSource final : public TensorSource {
  public:
    SafetensorsSource(const SafetensorsSet& set, std::string dir, const std::optional<Fp8Format>& fp8, LoadedModel& m)
        : set_(set), dir_(std::move(dir)), fp8_(fp8), m_(m) {}
    const std::string& file_for_errors() const override { return dir_; }
    Tensor find(const std::string& name) const override {
        const SafetensorsEntry* e = set_.find(name);
        if (!e || e->view.dtype != DType::F8_E4M3) return e ? e->view : Tensor();
        if (!fp8_)
            fail(dir_, ": tensor '", name,
                 "' is f8_e4m3 but config.json has no quantization_config saying where its factors are");
        const SafetensorsEntry* scale = set_.find(name + fp8_->scale_suffix);
        return resolve_fp8_weight(*fp8_, dir_, name, e->view, scale ? scale->view : Tensor(), m_.converted, m_.sliced);
    }

  private:
    const SafetensorsSet& set_;
    std::string dir_;
    const std::optional<Fp8Format>& fp8_;
    LoadedModel& m_;
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
    // `full`: the file's config, which every tensor's shape is checked against; m.config is the
    // rank's shard of it (the same with tensor parallel size 1).
    Builder(LoadedModel& m, const ModelConfig& full, const TensorSource& src, const LoadOptions& opt)
        : m_(m), full_(full), src_(src), opt_(opt) {}

    // Every tensor of ModelWeights, found through the architecture's `names` for this layout,
    // cut to the rank's slices (load_model in loader.h says which).
    void build(const WeightNames& names) {
        const ModelConfig& f = full_;
        const ModelConfig& c = m_.config;
        const int r = c.tp.rank;
        const int64_t H = f.hidden_size, F = f.intermediate_size, V = f.vocab_size;
        const int64_t Q = f.q_dim(), KV = f.kv_dim(), D = f.head_dim;
        // The rank's ranges: query rows, kv rows, intermediate rows, vocabulary rows.
        const int64_t q0 = r * int64_t{c.q_dim()}, qn = c.q_dim();
        const int64_t kv0 = int64_t{shard_kv_head(f, c.tp)} * D, kvn = c.kv_dim();
        const int64_t f0 = r * int64_t{c.intermediate_size}, fn = c.intermediate_size;
        const int64_t v0 = c.vocab_begin(), vn = c.vocab_rows();
        ModelWeights& w = m_.weights;
        w.embed = rows(dense(src_.get(names.embed, {V, H})), v0, vn);
        touch(w.embed);
        w.final_norm = vector_f32(names.final_norm, src_.get(names.final_norm, {H}));
        w.layers.resize(c.num_layers);
        const StageLayers mine = stage_layers(c.num_layers, opt_.pp.stage, opt_.pp.stages);
        for (int l = 0; l < c.num_layers; ++l) {
            if (!mine.contains(l)) continue;  // another pipeline stage's: never read
            LayerWeights& L = w.layers[l];
            // Column-parallel: the rank's block of output rows (a view).
            auto row_block = [&](const char* part, int64_t rows_full, int64_t begin, int64_t count) {
                const std::string name = names.in_layer(l, part);
                return matrix(name, rows(src_.get(name, {rows_full, H}), begin, count));
            };
            // Row-parallel: the rank's block of input columns (a copy).
            auto col_block = [&](const char* part, int64_t cols_full, int64_t begin, int64_t count) {
                const std::string name = names.in_layer(l, part);
                return columns(name, src_.get(name, {H, cols_full}), begin, count);
            };
            auto vec = [&](const char* part, int64_t n, bool required, int64_t begin, int64_t count) {
                const std::string name = names.in_layer(l, part);
                Tensor t = required ? src_.get(name, {n}) : src_.get_optional(name, {n});
                return t.empty() ? t : elements(name, t, begin, count);
            };
            L.attn_norm = vec(names.layer.attn_norm, H, true, 0, H);
            L.wq = row_block(names.layer.wq, Q, q0, qn);
            L.wk = row_block(names.layer.wk, KV, kv0, kvn);
            L.wv = row_block(names.layer.wv, KV, kv0, kvn);
            L.bq = vec(names.layer.bq, Q, f.attention_bias, q0, qn);
            L.bk = vec(names.layer.bk, KV, f.attention_bias, kv0, kvn);
            L.bv = vec(names.layer.bv, KV, f.attention_bias, kv0, kvn);
            L.q_norm = vec(names.layer.q_norm, D, f.qk_norm, 0, D);
            L.k_norm = vec(names.layer.k_norm, D, f.qk_norm, 0, D);
            L.wo = col_block(names.layer.wo, Q, q0, qn);
            L.ffn_norm = vec(names.layer.ffn_norm, H, true, 0, H);
            L.w_gate = row_block(names.layer.w_gate, F, f0, fn);
            L.w_up = row_block(names.layer.w_up, F, f0, fn);
            L.w_down = col_block(names.layer.w_down, F, f0, fn);
        }
        Tensor head = src_.get_optional(names.lm_head, {V, H});
        if (head.empty()) {
            if (!f.tie_word_embeddings && m_.format == "safetensors")
                fail(src_.file_for_errors(), ": missing tensor '", names.lm_head, "' (tie_word_embeddings is false)");
            w.lm_head = matrix(names.embed, w.embed);  // tied: the rank's vocabulary rows again
        } else {
            w.lm_head = matrix(names.lm_head, rows(dense(head), v0, vn));
        }
        std::string summary;
        for (const auto& [dtype, count] : dtype_counts_)
            summary += str_cat(summary.empty() ? "" : ", ", dtype, " x ", count);
        if (split_to_f32_ > 0)
            summary +=
                str_cat(" (", split_to_f32_, " column slices in f32: the split falls inside quantization blocks)");
        m_.weight_dtypes = summary;
        if (opt_.progress) opt_.progress(total_bytes_, total_bytes_);
    }

  private:
    // Rows [begin, begin + count) of matrix `t`: a view (rows are contiguous and hold whole
    // quantization blocks).
    static Tensor rows(const Tensor& t, int64_t begin, int64_t count) {
        if (begin == 0 && count == t.rows()) return t;
        PG_CHECK(t.ndim == 2 && begin >= 0 && begin + count <= t.rows(), t.shape_str(), " rows ", begin, "+", count);
        Tensor out = t;
        out.data = static_cast<char*>(t.data) + begin * t.row_bytes();
        out.shape[0] = count;
        if (t.scale) out.scale = t.scale + begin;  // f8_e4m3: the rows' factors
        return out;
    }

    // The embedding and LM head in bf16 where a checkpoint stores them in FP8 (rare): only the
    // layer matrices' products read FP8.
    Tensor dense(const Tensor& t) { return t.dtype == DType::F8_E4M3 ? fp8_to_bf16(t, m_.sliced) : t; }

    // Columns [begin, begin + count) of matrix `t` for the matmul: kept in t's dtype when the
    // backend reads it and the range falls on block boundaries (a strided copy of whole blocks,
    // row by row), else dequantized to f32 (only the blocks covering the range).
    Tensor columns(const std::string& name, const Tensor& t, int64_t begin, int64_t count) {
        if (begin == 0 && count == t.cols()) return matrix(name, t);
        PG_CHECK(t.ndim == 2 && begin >= 0 && begin + count <= t.cols(), t.shape_str(), " cols ", begin, "+", count);
        if (t.dtype == DType::I32) fail(src_.file_for_errors(), ": tensor '", name, "' has integer dtype");
        ++dtype_counts_[std::string(dtype_name(t.dtype))];
        const int64_t block = dtype_block_size(t.dtype);
        Tensor out = t;
        out.shape[1] = count;
        const bool readable = opt_.matmul_dtype_ok && opt_.matmul_dtype_ok(t.dtype);
        const bool whole_blocks = begin % block == 0 && count % block == 0;
        if (readable && whole_blocks) {
            const size_t skip = dtype_row_bytes(t.dtype, begin), keep = dtype_row_bytes(t.dtype, count);
            std::vector<uint8_t>& buf = m_.sliced.emplace_back(static_cast<size_t>(t.rows()) * keep);
            for (int64_t r = 0; r < t.rows(); ++r)
                std::memcpy(buf.data() + r * keep, static_cast<const uint8_t*>(t.row(r)) + skip, keep);
            out.data = buf.data();
            report(buf.size());
            return out;
        }
        if (readable) ++split_to_f32_;  // the backend would have read it whole, but not cut mid-block
        std::vector<float>& buf = m_.converted.emplace_back(static_cast<size_t>(t.rows() * count));
        dequantize_columns(t, begin, count, buf.data());
        out.dtype = DType::F32;
        out.data = buf.data();
        out.scale = nullptr;  // applied
        report(static_cast<size_t>(t.rows()) * dtype_row_bytes(t.dtype, count / block * block));
        return out;
    }

    // Elements [begin, begin + count) of vector `t`, in f32 (a view when it already is).
    Tensor elements(const std::string& name, const Tensor& t, int64_t begin, int64_t count) {
        if (begin == 0 && count == t.numel()) return vector_f32(name, t);
        PG_CHECK(t.ndim == 1 && begin >= 0 && begin + count <= t.numel(), t.shape_str(), " elements ", begin, "+",
                 count);
        if (t.dtype == DType::I32) fail(src_.file_for_errors(), ": tensor '", name, "' has integer dtype");
        Tensor out = t;
        out.shape[0] = count;
        if (t.dtype == DType::F32) {
            out.data = t.ptr<float>() + begin;
            return out;
        }
        std::vector<float>& buf = m_.converted.emplace_back(static_cast<size_t>(count));
        dequantize_columns(t, begin, count, buf.data());
        out.dtype = DType::F32;
        out.data = buf.data();
        return out;
    }

    // dst [t.rows(), count] f32 = columns [begin, begin + count) of `t`, dequantizing per row only
    // the blocks that cover them.
    static void dequantize_columns(const Tensor& t, int64_t begin, int64_t count, float* dst) {
        const int64_t block = dtype_block_size(t.dtype);
        const int64_t first = begin / block * block;
        const int64_t last = (begin + count + block - 1) / block * block;
        std::vector<float> span(static_cast<size_t>(last - first));
        for (int64_t r = 0; r < t.rows(); ++r) {
            dequantize_tensor_row(t, r, span.data(), first, last - first);
            std::memcpy(dst + r * count, span.data() + (begin - first), static_cast<size_t>(count) * sizeof(float));
        }
    }

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
        for (int64_t r = 0; r < t.rows(); ++r) dequantize_tensor_row(t, r, buf.data() + r * cols);
        Tensor out = t;
        out.dtype = DType::F32;
        out.data = buf.data();
        out.scale = nullptr;  // applied
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
    const ModelConfig& full_;
    const TensorSource& src_;
    const LoadOptions& opt_;
    size_t done_bytes_ = 0;
    std::map<std::string, int> dtype_counts_;
    int split_to_f32_ = 0;  // quantized column slices that had to become f32
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
    const ModelConfig full = m->config;
    m->config = shard_config(full, options.tp, m->path);
    // Progress counts what this rank reads: about 1/T of the file under tensor parallelism.
    const size_t ranks = static_cast<size_t>(options.tp.size);
    if (m->gguf) {
        GgufSource src(*m->gguf);
        Builder b(*m, full, src, options);
        for (const GgufTensorInfo& t : m->gguf->tensors()) b.total_bytes_ += t.nbytes;
        b.total_bytes_ /= ranks;
        b.build(*arch.gguf_weights);
        return m;
    }
    m->safetensors = std::make_shared<SafetensorsSet>(SafetensorsSet::open_dir(m->path));
    const std::optional<Fp8Format> fp8 = read_fp8_format(m->path);
    if (fp8) m->quantization = fp8_load_note(*fp8);
    SafetensorsSource src(*m->safetensors, m->path, fp8, *m);
    Builder b(*m, full, src, options);
    for (const auto& [name, e] : m->safetensors->entries()) b.total_bytes_ += e.view.nbytes();
    b.total_bytes_ /= ranks;
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
