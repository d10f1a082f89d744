#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/unfused_blocks.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/kv_fp8.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace peregrine {

namespace {
uint8_t* align64(uint8_t* p) {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

void check_f32(const Tensor& t, const char* what) {
    PG_CHECK(t.dtype == DType::F32 && t.device == Device::CPU, what, " must be an f32 CPU tensor");
}
}  // namespace

CpuPrecision cpu_precision_from_name(const std::string& name) {
    if (name == "float32") return CpuPrecision::Float32;
    // auto stays float32: bf16 inputs move logits by up to ~1e-2, which flips the argmax at
    // near-ties of the golden fixtures (qwen2-tiny has top-2 gaps of 5e-4). See docs/PERFORMANCE.md.
    if (name == "auto") return CpuPrecision::Float32;
    if (name == "bfloat16") {
        if (!cpu_bf16_kernels()) fail("--dtype bfloat16 needs a CPU with AVX512-BF16; use float32 or auto");
        return CpuPrecision::BFloat16;
    }
    fail("unknown dtype '", name, "' (auto, float32, bfloat16)");
}

const char* cpu_precision_name(CpuPrecision p) {
    return p == CpuPrecision::BFloat16 ? "bfloat16" : "float32";
}

CpuBackend::CpuBackend(int num_threads, CpuPrecision precision)
    : pool_(std::make_unique<ThreadPool>(num_threads)), precision_(precision) {
    switch (cpu_isa()) {
        case CpuIsa::Avx512:
            kernels_ = cpu_features().avx512_vnni ? &cpu::kernels_avx512() : &cpu::kernels_avx512_no_vnni();
            break;
        case CpuIsa::Avx2:
            kernels_ = &cpu::kernels_avx2();
            break;
        default:
            fail("the CPU backend needs AVX2 with FMA and F16C, which this CPU lacks");
    }
    PG_CHECK(precision_ == CpuPrecision::Float32 || kernels_->matmul_bf16_rows, "bf16 precision without AVX512-BF16");
}

CpuBackend::~CpuBackend() {
    scratch_.clear();
}

int CpuBackend::num_threads() const {
    return pool_->num_threads();
}

std::string CpuBackend::name() const {
    return str_cat("cpu (", kernels_->name, ", ", pool_->num_threads(), " threads, ",
                   precision_ == CpuPrecision::BFloat16 ? "bf16 x bf16 matmuls for bf16 weights" : "f32 activations",
                   "; quantized weights: ", kernels_->qmatmul_name, ")");
}

Tensor CpuBackend::allocate(DType dtype, std::initializer_list<int64_t> shape) {
    Tensor t(nullptr, dtype, shape, Device::CPU);
    const size_t bytes = std::max<size_t>(64, (t.nbytes() + 63) / 64 * 64);
    t.data = std::aligned_alloc(64, bytes);
    if (!t.data) fail("out of memory allocating ", bytes, " bytes");
    std::memset(t.data, 0, bytes);
    return t;
}

void CpuBackend::release(Tensor& t) {
    std::free(t.data);
    t.data = nullptr;
}

void CpuBackend::upload(const void* src, const Tensor& dst) {
    std::memcpy(dst.data, src, dst.nbytes());
}
void CpuBackend::download(const Tensor& src, void* dst) {
    std::memcpy(dst, src.data, src.nbytes());
}

bool CpuBackend::supports_weight_dtype(DType t) const {
    return cpu::matmul_supports(t) || cpu::qmatmul_supports(t);
}

void CpuBackend::begin_step(const BatchInput& batch) {
    scratch_.reserve(batch.num_tokens(), std::max<int64_t>(static_cast<int64_t>(batch.logits_indices.size()), 1));
}

void CpuBackend::attention_block(const Tensor& residual, const LayerWeights& w, const AttentionParams& p,
                                 const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) {
    unfused::attention_block(*this, scratch_, residual, w, p, batch, k_cache, v_cache);
}

void CpuBackend::mlp_block(const Tensor& residual, const LayerWeights& w, float norm_eps, Communicator* tp) {
    unfused::mlp_block(*this, scratch_, residual, w, norm_eps, tp);
}

void CpuBackend::logits(const Tensor& residual, const Tensor& final_norm, float norm_eps, const Tensor& lm_head,
                        const BatchInput& batch, const Tensor& out) {
    unfused::logits(*this, scratch_, residual, final_norm, norm_eps, lm_head, batch, out);
}

void CpuBackend::embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out, int32_t vocab_begin) {
    check_f32(out, "embedding output");
    const int64_t dim = table.cols();
    PG_CHECK(out.cols() == dim && out.rows() >= n);
    for (int64_t i = 0; i < n; ++i) {
        PG_CHECK(ids[i] >= 0, "token id ", ids[i], " out of range");
        const int64_t row = int64_t{ids[i]} - vocab_begin;
        float* dst = out.ptr<float>() + i * dim;
        if (row >= 0 && row < table.rows())
            dequantize_row(table.dtype, table.row(row), dst, dim);
        else
            std::fill(dst, dst + dim, 0.0f);
    }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps, const Tensor& out) {
    check_f32(x, "rms_norm input");
    check_f32(weight, "rms_norm weight");
    const int64_t dim = x.cols(), rows = x.rows();
    PG_CHECK(weight.numel() == dim && out.cols() == dim && out.rows() == rows);
    const float* w = weight.ptr<float>();
    pool_->parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
                const float* in = x.ptr<float>() + r * dim;
                float* o = out.ptr<float>() + r * dim;
                if (!residual.empty()) {
                    float* res = residual.ptr<float>() + r * dim;
                    for (int64_t i = 0; i < dim; ++i) res[i] += in[i];
                    in = res;
                }
                double ss = 0;
                for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(in[i]) * in[i];
                const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
                for (int64_t i = 0; i < dim; ++i) o[i] = w[i] * (in[i] * inv);
            }
        },
        1, rows * dim * 4);
}

void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, bool exact) {
    check_f32(x, "matmul input");
    check_f32(out, "matmul output");
    PG_CHECK(supports_weight_dtype(w.dtype), "matmul weights of dtype ", dtype_name(w.dtype));
    PG_CHECK(w.cols() == x.cols() && out.rows() == x.rows() && out.cols() == w.rows(), "matmul shapes x ",
             x.shape_str(), " w ", w.shape_str(), " out ", out.shape_str());
    if (!bias.empty()) PG_CHECK(bias.dtype == DType::F32 && bias.numel() == w.rows());
    const cpu::MatmulArgs a{x.ptr<float>(),
                            x.rows(),
                            x.cols(),
                            w.data,
                            w.dtype,
                            w.row_bytes(),
                            bias.empty() ? nullptr : bias.ptr<float>(),
                            out.ptr<float>(),
                            w.rows()};
    // Split the weight rows into pieces that threads take in turn (each output is computed the
    // same way whichever thread takes its piece); tiles of rows stay within one piece.
    if (cpu::qmatmul_supports(w.dtype)) {
        // Quantized weights always meet 8-bit activations (as in llama.cpp), `exact` included:
        // the weights are the coarser side already.
        const size_t stride = act_row_bytes(a.k);
        const size_t bytes = static_cast<size_t>(a.n) * stride;
        if (x_q8_.size() < bytes + 64) x_q8_.resize(bytes + 64);
        uint8_t* xq = align64(x_q8_.data());
        const cpu::Kernels& kern = *kernels_;
        pool_->parallel_for(
            a.n,
            [&](int64_t begin, int64_t end) {
                kern.quantize_acts(w.dtype, a.x + begin * a.k, end - begin, a.k, xq + begin * stride);
            },
            1, a.n * a.k * 4);
        const size_t scratch_bytes = cpu::qmatmul_scratch_bytes(a.k);
        pool_->parallel_for_dynamic(
            a.m,
            [&](int64_t begin, int64_t end) {
                // Per thread, grown once: the unpacked weight panel of the prefill kernels.
                thread_local std::vector<uint8_t> scratch;
                if (scratch.size() < scratch_bytes + 64) scratch.resize(scratch_bytes + 64);
                kern.qmatmul_rows(a, xq, begin, end, align64(scratch.data()));
            },
            kern.qmatmul_align(a), a.n * a.m * a.k / 4);
        return;
    }
    if (precision_ == CpuPrecision::BFloat16 && w.dtype == DType::BF16 && !exact) {
        const size_t count = static_cast<size_t>(a.n * a.k);
        if (x_bf16_.size() < count) x_bf16_.resize(count);
        kernels_->to_bf16(a.x, x_bf16_.data(), static_cast<int64_t>(count));
        const uint16_t* xb = x_bf16_.data();
        pool_->parallel_for(
            a.m, [&](int64_t begin, int64_t end) { kernels_->matmul_bf16_rows(a, xb, begin, end); }, 4,
            a.n * a.m * a.k);
        return;
    }
    // Ranges of 16 rows: the prefill GEMM reduces 16 rows' accumulators at once.
    pool_->parallel_for_dynamic(
        a.m, [&](int64_t begin, int64_t end) { kernels_->matmul_rows(a, begin, end); }, 16, a.n * a.m * a.k);
}

void CpuBackend::matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& product) {
    matmul(x, w, Tensor(), product);
    add(product, residual);
}

void CpuBackend::rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                                const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache) {
    const int64_t n = q.rows();
    const int num_q_heads = static_cast<int>(q.cols() / head_dim);
    const int num_kv_heads = static_cast<int>(k.cols() / head_dim);
    const int half = rope.rotary_dim / 2;
    const int64_t kv_dim = k.cols();
    const int64_t num_slots = k_cache.dim(0) * k_cache.dim(1);
    const bool fp8 = k_cache.dtype == DType::F8_E4M3;
    PG_CHECK(k_cache.dtype == v_cache.dtype && k_cache.shape == v_cache.shape && k_cache.dim(2) == num_kv_heads &&
                 k_cache.cols() == (fp8 ? kv_fp8_cols(head_dim) : head_dim) && (fp8 || k_cache.dtype == DType::F32),
             "rope_and_cache: caches ", dtype_name(k_cache.dtype), " ", k_cache.shape_str(), " for ", num_kv_heads,
             " kv heads of ", head_dim);
    const KvFp8Layout f8 = fp8 ? kv_fp8_layout(k_cache) : KvFp8Layout{};
    const int64_t rope_work = n * (half * 40 + (q.cols() + k.cols()) * 4);
    pool_->parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
            thread_local std::vector<float> cs;
            cs.resize(2 * half);
            for (int64_t t = begin; t < end; ++t) {
                // Angles as Hugging Face forms them: f32 position times f32 inverse frequency.
                const float pos = static_cast<float>(batch.positions[t]);
                for (int i = 0; i < half; ++i) {
                    const double angle = static_cast<double>(pos * rope.inv_freq[i]);
                    cs[i] = static_cast<float>(std::cos(angle)) * rope.attention_factor;
                    cs[half + i] = static_cast<float>(std::sin(angle)) * rope.attention_factor;
                }
                auto rotate = [&](float* head) {
                    for (int i = 0; i < half; ++i) {
                        const int a = rope.style == RopeStyle::Neox ? i : 2 * i;
                        const int b = rope.style == RopeStyle::Neox ? i + half : 2 * i + 1;
                        const float x0 = head[a], x1 = head[b], c = cs[i], s = cs[half + i];
                        head[a] = x0 * c - x1 * s;
                        head[b] = x1 * c + x0 * s;
                    }
                };
                for (int h = 0; h < num_q_heads; ++h) rotate(q.ptr<float>() + t * q.cols() + h * head_dim);
                for (int h = 0; h < num_kv_heads; ++h) rotate(k.ptr<float>() + t * kv_dim + h * head_dim);
                const int32_t slot = batch.slot_mapping[t];
                PG_CHECK(slot >= 0 && slot < num_slots, "slot ", slot, " out of range");
                if (fp8) {  // each head quantized with its own scale (core/kv_fp8.h)
                    for (int h = 0; h < num_kv_heads; ++h) {
                        for (const auto& [src, cache] : {std::pair{k, k_cache}, std::pair{v, v_cache}}) {
                            uint8_t* base = cache.ptr<uint8_t>();
                            kv_fp8_quantize_head(src.ptr<float>() + t * kv_dim + static_cast<int64_t>(h) * head_dim,
                                                 head_dim, base + f8.code_offset(slot, h),
                                                 reinterpret_cast<uint16_t*>(base + f8.scale_offset(slot, h)));
                        }
                    }
                    continue;
                }
                std::memcpy(k_cache.ptr<float>() + slot * kv_dim, k.ptr<float>() + t * kv_dim, kv_dim * sizeof(float));
                std::memcpy(v_cache.ptr<float>() + slot * kv_dim, v.ptr<float>() + t * kv_dim, kv_dim * sizeof(float));
            }
        },
        1, rope_work);
}

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                           int num_heads, int head_dim, float scale, int window, const Tensor& out) {
    const int64_t n = q.rows();
    const int num_kv_heads = static_cast<int>(k_cache.dim(2));
    const int group = num_heads / num_kv_heads;
    const int block_size = static_cast<int>(k_cache.dim(1));
    const int64_t kv_dim = static_cast<int64_t>(num_kv_heads) * head_dim;
    const bool fp8 = k_cache.dtype == DType::F8_E4M3;
    PG_CHECK(k_cache.dtype == v_cache.dtype && k_cache.shape == v_cache.shape &&
                 k_cache.cols() == (fp8 ? kv_fp8_cols(head_dim) : head_dim) && (fp8 || k_cache.dtype == DType::F32),
             "attention: caches ", dtype_name(k_cache.dtype), " ", k_cache.shape_str(), " for head_dim ", head_dim);
    const KvFp8Layout f8 = fp8 ? kv_fp8_layout(k_cache) : KvFp8Layout{};
    if (seq_of_.size() < static_cast<size_t>(n)) seq_of_.resize(n);  // grown once, not per step
    int32_t* seq_of = seq_of_.data();
    int64_t pairs = 0;  // (query, key) pairs, ignoring the window: a bound on the work
    for (int s = 0; s < batch.num_seqs(); ++s) {
        for (int t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) seq_of[t] = s;
        pairs += static_cast<int64_t>(batch.query_start[s + 1] - batch.query_start[s]) * batch.context_lens[s];
    }
    const cpu::Kernels& kern = *kernels_;
    // One work item = one token and one kv head, with the query heads that share it.
    pool_->parallel_for(
        n * num_kv_heads,
        [&](int64_t begin, int64_t end) {
            thread_local std::vector<float> scores, keys, values;
            for (int64_t item = begin; item < end; ++item) {
                const int64_t t = item / num_kv_heads;
                const int kvh = static_cast<int>(item % num_kv_heads);
                const int s = seq_of[t];
                const int pos = batch.positions[t];
                cpu::AttentionArgs a;
                a.q = q.ptr<float>() + t * q.cols() + static_cast<int64_t>(kvh) * group * head_dim;
                a.out = out.ptr<float>() + t * out.cols() + static_cast<int64_t>(kvh) * group * head_dim;
                a.k_cache = k_cache.ptr<float>();
                a.v_cache = v_cache.ptr<float>();
                a.kv_dim = kv_dim;
                a.head_offset = static_cast<int64_t>(kvh) * head_dim;
                a.table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
                a.block_size = block_size;
                a.head_dim = head_dim;
                a.group = group;
                a.scale = scale;
                a.last = std::min(pos, batch.context_lens[s] - 1);
                a.first = window > 0 ? std::max(0, pos - window + 1) : 0;
                if (a.last < a.first) {
                    std::memset(a.out, 0, sizeof(float) * group * head_dim);
                    continue;
                }
                scores.resize(static_cast<size_t>(group) * (a.last - a.first + 1));
                a.scratch = scores.data();
                if (fp8) {
                    // The head's keys and values [first, last], dequantized in order into rows of
                    // head_dim: the same kernel then reads them as one block holding them all.
                    const int len = a.last - a.first + 1;
                    keys.resize(static_cast<size_t>(len) * head_dim);
                    values.resize(keys.size());
                    const uint8_t* kb = k_cache.ptr<uint8_t>();
                    const uint8_t* vb = v_cache.ptr<uint8_t>();
                    for (int j = 0; j < len; ++j) {
                        const int pos = a.first + j;
                        const int64_t slot =
                            static_cast<int64_t>(a.table[pos / block_size]) * block_size + pos % block_size;
                        const int64_t co = f8.code_offset(slot, kvh), so = f8.scale_offset(slot, kvh);
                        uint16_t ks, vs;
                        std::memcpy(&ks, kb + so, 2);
                        std::memcpy(&vs, vb + so, 2);
                        kv_fp8_dequantize_head(kb + co, ks, head_dim, keys.data() + static_cast<int64_t>(j) * head_dim);
                        kv_fp8_dequantize_head(vb + co, vs, head_dim,
                                               values.data() + static_cast<int64_t>(j) * head_dim);
                    }
                    static const int32_t kOneBlock = 0;
                    a.k_cache = keys.data();
                    a.v_cache = values.data();
                    a.kv_dim = head_dim;
                    a.head_offset = 0;
                    a.table = &kOneBlock;
                    a.block_size = len;  // positions [0, len) all in block 0
                    a.first = 0;
                    a.last = len - 1;
                }
                kern.attention(a);
            }
        },
        1, pairs * num_heads * head_dim * 2);
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
    const int64_t total = gate.numel();
    PG_CHECK(up.numel() == total && out.numel() == total);
    const float* g = gate.ptr<float>();
    const float* u = up.ptr<float>();
    float* o = out.ptr<float>();
    const cpu::Kernels& kern = *kernels_;
    pool_->parallel_for(
        total, [&](int64_t begin, int64_t end) { kern.silu_mul(g + begin, u + begin, o + begin, end - begin); }, 64,
        total * 16);
}

void CpuBackend::add(const Tensor& x, const Tensor& out) {
    check_f32(x, "add input");
    check_f32(out, "add output");
    const int64_t total = x.numel();
    PG_CHECK(out.numel() == total, "add: ", x.shape_str(), " to ", out.shape_str());
    const float* a = x.ptr<float>();
    float* o = out.ptr<float>();
    pool_->parallel_for(
        total,
        [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) o[i] += a[i];
        },
        64, total * 8);
}

void CpuBackend::copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t rows,
                              int64_t cols) {
    PG_CHECK(src.dtype == dst.dtype && src_col + cols <= src.cols() && dst_col + cols <= dst.cols() &&
             rows <= src.rows() && rows <= dst.rows());
    const size_t es = dtype_row_bytes(src.dtype, 1);
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<char*>(dst.data) + (r * dst.cols() + dst_col) * es,
                    static_cast<const char*>(src.data) + (r * src.cols() + src_col) * es, cols * es);
}

void CpuBackend::copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    const size_t block_bytes = cache.nbytes() / cache.dim(0);
    char* base = cache.ptr<char>();
    for (const auto& [src, dst] : pairs) {
        PG_CHECK(src >= 0 && dst >= 0 && src < cache.dim(0) && dst < cache.dim(0) && src != dst);
        std::memcpy(base + dst * block_bytes, base + src * block_bytes, block_bytes);
    }
}

void CpuBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out) {
    const int64_t dim = x.cols();
    PG_CHECK(out.cols() == dim && out.rows() >= static_cast<int64_t>(rows.size()));
    for (size_t i = 0; i < rows.size(); ++i)
        std::memmove(out.ptr<float>() + i * dim, x.ptr<float>() + rows[i] * dim, dim * sizeof(float));
}

}  // namespace peregrine
