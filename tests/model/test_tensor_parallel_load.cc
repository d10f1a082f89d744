// Megatron-style sharded loading (LoadOptions::tp, shard_config): every rank of T = 2 and 4
// loads only its slices, and the slices of all ranks put back together equal the one-rank load
// element for element (quantized tensors compared dequantized), on every fixture whose heads
// allow it: HF safetensors (f32, bf16, q/k/v biases, qk-norm, untied head), GGUF f32 with
// interleaved q/k rows, and GGUF q8_0 / q4_0 / q4_k / q6_k / bf16.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/quant.h"
#include "model/loader.h"
#include "model/model_config.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

// `t` ([rows, cols], any dtype) as f32, row-major.
std::vector<float> dequantized(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.dtype, t.row(r), out.data() + r * t.cols(), t.cols());
    return out;
}

// Rows [begin, begin + count) of a row-major f32 matrix with `cols` columns.
std::vector<float> row_range(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t count) {
    return {m.begin() + begin * cols, m.begin() + (begin + count) * cols};
}

// Columns [begin, begin + count) of a row-major f32 matrix [rows, cols].
std::vector<float> col_range(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t begin, int64_t count) {
    std::vector<float> out;
    for (int64_t r = 0; r < rows; ++r)
        out.insert(out.end(), m.begin() + r * cols + begin, m.begin() + r * cols + begin + count);
    return out;
}

// A vector [n] seen as the matrix [n, 1], so that biases are checked as the rows they go with.
Tensor as_column(const Tensor& t) {
    return Tensor(t.data, t.dtype, {t.numel(), 1});
}

// Bitwise equality (the slices are the same values, no arithmetic between).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<LoadedModel> load(const std::string& path, Backend& backend, TensorParallel tp,
                                  bool keep_file_dtypes = true) {
    LoadOptions opt;
    if (keep_file_dtypes) {
        opt.matmul_dtype_ok = [&backend](DType t) { return backend.supports_weight_dtype(t); };
    } else {
        opt.matmul_dtype_ok = [](DType t) { return t == DType::F32; };
    }
    opt.tp = tp;
    return load_model(path, opt);
}

struct Fixture {
    std::string name;
    std::string path;
};

std::vector<Fixture> fixtures() {
    const std::string d = data_dir();
    return {
        {"stories260K_hf", models_dir() + "/stories260K"},
        {"stories260K_gguf", d + "/stories260K.gguf"},
        {"llama3_tiny", d + "/llama3-tiny"},
        {"qwen2_tiny", d + "/qwen2-tiny"},
        {"qwen3_tiny", d + "/qwen3-tiny"},
        {"qt_bf16", d + "/quant-tiny/qt-bf16.gguf"},
        {"qt_q8_0", d + "/quant-tiny/qt-q8_0.gguf"},
        {"qt_q4_0", d + "/quant-tiny/qt-q4_0.gguf"},
        {"qt_q4_k", d + "/quant-tiny/qt-q4_k.gguf"},
        {"qt_q6_k", d + "/quant-tiny/qt-q6_k.gguf"},
    };
}

// The config checks of one rank against the full config.
void expect_shard_config(const ModelConfig& full, const ModelConfig& c, TensorParallel tp) {
    const int T = tp.size;
    EXPECT_EQ(c.tp.rank, tp.rank);
    EXPECT_EQ(c.tp.size, T);
    EXPECT_EQ(c.num_heads, full.num_heads / T);
    EXPECT_EQ(c.num_kv_heads, T <= full.num_kv_heads ? full.num_kv_heads / T : 1);
    EXPECT_EQ(c.intermediate_size, full.intermediate_size / T);
    EXPECT_EQ(c.vocab_size, full.vocab_size);
    EXPECT_EQ(c.hidden_size, full.hidden_size);
    EXPECT_EQ(c.head_dim, full.head_dim);
    EXPECT_EQ(c.num_layers, full.num_layers);
    EXPECT_EQ(c.vocab_begin(), tp.rank * (full.vocab_size / T));
    EXPECT_EQ(c.vocab_end(), tp.rank == T - 1 ? full.vocab_size : (tp.rank + 1) * (full.vocab_size / T));
    // The rank's query heads all read the kv heads it holds.
    const int group = full.num_heads / full.num_kv_heads;
    const int first_q = tp.rank * c.num_heads, last_q = first_q + c.num_heads - 1;
    EXPECT_EQ(first_q / group, shard_kv_head(full, tp));
    EXPECT_EQ(last_q / group, shard_kv_head(full, tp) + c.num_kv_heads - 1);
}

// Checks every tensor of the T ranks of `path` against its one-rank load.
void check_sharded_load(const std::string& path, int T, bool keep_file_dtypes = true) {
    SCOPED_TRACE(path + " T=" + std::to_string(T));
    CpuBackend backend(1);
    const std::unique_ptr<LoadedModel> one = load(path, backend, {}, keep_file_dtypes);
    const ModelConfig& f = one->config;
    EXPECT_EQ(f.tp.size, 1);
    EXPECT_EQ(f.vocab_begin(), 0);
    EXPECT_EQ(f.vocab_end(), f.vocab_size);
    std::vector<std::unique_ptr<LoadedModel>> ranks;
    for (int r = 0; r < T; ++r) {
        ranks.push_back(load(path, backend, {r, T}, keep_file_dtypes));
        expect_shard_config(f, ranks.back()->config, {r, T});
    }
    const int64_t H = f.hidden_size, D = f.head_dim, V = f.vocab_size;

    // Column-parallel (split by output rows): the ranks' rows, in rank order, are the whole.
    auto rows_put_back = [&](const char* what, const Tensor& whole, auto get) {
        SCOPED_TRACE(what);
        std::vector<float> joined;
        for (int r = 0; r < T; ++r) {
            const Tensor& part = get(*ranks[r]);
            EXPECT_EQ(part.dtype, whole.dtype);
            EXPECT_EQ(part.cols(), whole.cols());
            const std::vector<float> v = dequantized(part);
            joined.insert(joined.end(), v.begin(), v.end());
        }
        EXPECT_TRUE(same_bits(joined, dequantized(whole)));
    };
    // Row-parallel (split by input columns).
    auto cols_put_back = [&](const char* what, const Tensor& whole, auto get) {
        SCOPED_TRACE(what);
        const std::vector<float> w = dequantized(whole);
        const int64_t n = whole.cols() / T;
        for (int r = 0; r < T; ++r) {
            const Tensor& part = get(*ranks[r]);
            ASSERT_EQ(part.rows(), whole.rows());
            ASSERT_EQ(part.cols(), n);
            // Kept in the file's dtype when the split falls on whole blocks, else f32.
            const bool whole_blocks = n % dtype_block_size(whole.dtype) == 0;
            EXPECT_EQ(part.dtype, whole_blocks ? whole.dtype : DType::F32) << dtype_name(whole.dtype);
            EXPECT_TRUE(same_bits(dequantized(part), col_range(w, whole.rows(), whole.cols(), r * n, n)));
        }
    };
    // Kv heads: each rank's rows are the rows of the heads shard_kv_head names, and together
    // the ranks hold every kv head.
    auto kv_rows = [&](const char* what, const Tensor& whole, auto get) {
        SCOPED_TRACE(what);
        const std::vector<float> w = dequantized(whole);
        std::vector<bool> held(static_cast<size_t>(f.num_kv_heads), false);
        for (int r = 0; r < T; ++r) {
            const Tensor& part = get(*ranks[r]);
            const int first = shard_kv_head(f, {r, T}), n = ranks[r]->config.num_kv_heads;
            EXPECT_EQ(part.dtype, whole.dtype);
            EXPECT_EQ(part.rows(), n * D);
            EXPECT_TRUE(same_bits(dequantized(part), row_range(w, whole.cols(), first * D, n * D)));
            for (int h = first; h < first + n; ++h) held[static_cast<size_t>(h)] = true;
        }
        for (int h = 0; h < f.num_kv_heads; ++h) EXPECT_TRUE(held[static_cast<size_t>(h)]) << "kv head " << h;
    };
    auto replicated = [&](const char* what, const Tensor& whole, auto get) {
        SCOPED_TRACE(what);
        for (int r = 0; r < T; ++r) EXPECT_TRUE(same_bits(dequantized(get(*ranks[r])), dequantized(whole)));
    };

    rows_put_back("embed", one->weights.embed, [](const LoadedModel& m) -> const Tensor& { return m.weights.embed; });
    rows_put_back("lm_head", one->weights.lm_head,
                  [](const LoadedModel& m) -> const Tensor& { return m.weights.lm_head; });
    for (int r = 0; r < T; ++r) {
        const ModelWeights& w = ranks[r]->weights;
        EXPECT_EQ(w.embed.rows(), ranks[r]->config.vocab_end() - ranks[r]->config.vocab_begin());
        EXPECT_EQ(w.embed.cols(), H);
        // Tied heads are the same rows of the same memory as the embedding.
        if (one->weights.lm_head.data == one->weights.embed.data) {
            EXPECT_EQ(w.lm_head.data, w.embed.data);
        }
    }
    EXPECT_EQ(one->weights.embed.rows(), V);
    replicated("final_norm", one->weights.final_norm,
               [](const LoadedModel& m) -> const Tensor& { return m.weights.final_norm; });

    for (int l = 0; l < f.num_layers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        const LayerWeights& L = one->weights.layers[l];
#define PG_PART(field) [l](const LoadedModel& m) -> const Tensor& { return m.weights.layers[l].field; }
        rows_put_back("wq", L.wq, PG_PART(wq));
        kv_rows("wk", L.wk, PG_PART(wk));
        kv_rows("wv", L.wv, PG_PART(wv));
        rows_put_back("w_gate", L.w_gate, PG_PART(w_gate));
        rows_put_back("w_up", L.w_up, PG_PART(w_up));
        cols_put_back("wo", L.wo, PG_PART(wo));
        cols_put_back("w_down", L.w_down, PG_PART(w_down));
        replicated("attn_norm", L.attn_norm, PG_PART(attn_norm));
        replicated("ffn_norm", L.ffn_norm, PG_PART(ffn_norm));
        if (f.attention_bias) {
#define PG_BIAS(field) [l](const LoadedModel& m) { return as_column(m.weights.layers[l].field); }
            rows_put_back("bq", as_column(L.bq), PG_BIAS(bq));
            kv_rows("bk", as_column(L.bk), PG_BIAS(bk));
            kv_rows("bv", as_column(L.bv), PG_BIAS(bv));
#undef PG_BIAS
        } else {
            EXPECT_TRUE(ranks[0]->weights.layers[l].bq.empty());
        }
        if (f.qk_norm) {
            replicated("q_norm", L.q_norm, PG_PART(q_norm));
            replicated("k_norm", L.k_norm, PG_PART(k_norm));
        }
#undef PG_PART
    }

    // What a rank copies: its wo and w_down column slices (in `sliced` when kept in the file's
    // dtype, in `converted` when they became f32) and what the one-rank load converts as well;
    // every other matrix is a view of the mapping.
    for (int r = 0; r < T; ++r) {
        const LoadedModel& m = *ranks[r];
        auto in = [](const void* p, const auto& buffers) {
            for (const auto& b : buffers)
                if (p >= static_cast<const void*>(b.data()) && p < static_cast<const void*>(b.data() + b.size()))
                    return true;
            return false;
        };
        size_t sliced = 0, slices_there = 0, converted_slices = 0;
        for (const std::vector<uint8_t>& b : m.sliced) sliced += b.size();
        for (const LayerWeights& L : m.weights.layers) {
            for (const Tensor* t : {&L.wo, &L.w_down}) {
                EXPECT_TRUE(in(t->data, m.sliced) || in(t->data, m.converted));
                if (in(t->data, m.sliced)) slices_there += t->nbytes();
                if (in(t->data, m.converted)) ++converted_slices;
            }
            for (const Tensor* t : {&L.wq, &L.wk, &L.wv, &L.w_gate, &L.w_up}) EXPECT_FALSE(in(t->data, m.sliced));
        }
        EXPECT_EQ(sliced, slices_there);
        // A backend reading only f32 gets no slice in a quantized or bf16 dtype (the fixtures
        // of that test have none in f32).
        if (!keep_file_dtypes) {
            EXPECT_TRUE(m.sliced.empty());
        }
        // Where the one-rank load copies nothing (f32 files), neither does a rank beyond its
        // column slices.
        if (one->converted.empty()) {
            EXPECT_EQ(m.converted.size(), converted_slices);
        }
    }
}

class TensorParallelLoad : public ::testing::TestWithParam<Fixture> {};

TEST_P(TensorParallelLoad, RanksPutBackTogetherEqualTheWholeT2) {
    check_sharded_load(GetParam().path, 2);
}

TEST_P(TensorParallelLoad, RanksPutBackTogetherEqualTheWholeT4) {
    check_sharded_load(GetParam().path, 4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelLoad, ::testing::ValuesIn(fixtures()),
                         [](const ::testing::TestParamInfo<Fixture>& info) { return info.param.name; });

// A backend that reads only f32: column slices of quantized and bf16 tensors become f32 from
// the blocks that cover them, whatever the block boundaries.
TEST(TensorParallelLoadTest, ConvertsSlicesWhenTheMatmulReadsOnlyF32) {
    check_sharded_load(data_dir() + "/quant-tiny/qt-q4_k.gguf", 2, false);
    check_sharded_load(data_dir() + "/quant-tiny/qt-q8_0.gguf", 4, false);
    check_sharded_load(data_dir() + "/llama3-tiny", 2, false);
}

// The quantized column split: q8_0 / q4_0 (blocks of 32) stay quantized for T = 2 and 4 on
// quant-tiny (wo 256 columns, w_down 768); q4_k / q6_k (256) only where the split keeps whole
// super-blocks, and the load log says how many slices became f32.
TEST(TensorParallelLoadTest, QuantizedColumnSlicesStayQuantizedOnBlockBoundaries) {
    CpuBackend backend(1);
    const std::string d = data_dir() + "/quant-tiny/qt-";
    {
        auto m = load(d + "q8_0.gguf", backend, {1, 4});
        EXPECT_EQ(m->weights.layers[0].wo.dtype, DType::Q8_0);
        EXPECT_EQ(m->weights.layers[0].w_down.dtype, DType::Q8_0);
        EXPECT_EQ(m->weights.layers[0].wo.cols(), 64);
        EXPECT_EQ(m->weights.layers[0].w_down.cols(), 192);
        EXPECT_EQ(m->weight_dtypes.find("f32 ("), std::string::npos) << m->weight_dtypes;
    }
    {
        auto m = load(d + "q6_k.gguf", backend, {0, 2});
        EXPECT_EQ(m->weights.layers[0].wo.dtype, DType::F32);      // 128 columns: half a super-block
        EXPECT_EQ(m->weights.layers[0].w_down.dtype, DType::F32);  // 384: one and a half
        EXPECT_EQ(m->weights.layers[0].wq.dtype, DType::Q6_K);     // rows: always a view
        EXPECT_NE(m->weight_dtypes.find("column slices in f32"), std::string::npos) << m->weight_dtypes;
    }
    {
        // A backend that reads no q6_k converts every matrix anyway: nothing to point out.
        auto m = load(d + "q6_k.gguf", backend, {0, 2}, false);
        EXPECT_EQ(m->weights.layers[0].wq.dtype, DType::F32);
        EXPECT_EQ(m->weight_dtypes.find("column slices in f32"), std::string::npos) << m->weight_dtypes;
    }
}

// GGUF llama files keep q/k rows in interleaved-pair order within each head; slicing by whole
// heads gives each rank the same heads as the Hugging Face folder (rows permuted back per head).
TEST(TensorParallelLoadTest, GgufInterleavedRowsSliceByTheSameHeads) {
    CpuBackend backend(1);
    for (int T : {2, 4}) {
        for (int r = 0; r < T; ++r) {
            auto hf = load(models_dir() + "/stories260K", backend, {r, T});
            auto gg = load(data_dir() + "/stories260K.gguf", backend, {r, T});
            const int64_t D = hf->config.head_dim;
            for (int l = 0; l < hf->config.num_layers; ++l) {
                for (const auto& [a, b] : {std::pair{&hf->weights.layers[l].wq, &gg->weights.layers[l].wq},
                                           std::pair{&hf->weights.layers[l].wk, &gg->weights.layers[l].wk}}) {
                    ASSERT_EQ(a->rows(), b->rows());
                    const std::vector<float> hv = dequantized(*a), gv = dequantized(*b);
                    const int64_t cols = a->cols();
                    // GGUF row h*D + 2i + j = HF row h*D + j*D/2 + i.
                    for (int64_t h = 0; h < a->rows() / D; ++h)
                        for (int64_t i = 0; i < D / 2; ++i)
                            for (int64_t j = 0; j < 2; ++j)
                                ASSERT_TRUE(std::memcmp(&gv[(h * D + 2 * i + j) * cols],
                                                        &hv[(h * D + j * D / 2 + i) * cols], cols * sizeof(float)) == 0)
                                    << "T=" << T << " rank " << r << " layer " << l << " head " << h;
                }
            }
        }
    }
}

ModelConfig small_config(int heads, int kv_heads, int intermediate, int vocab = 100) {
    ModelConfig c;
    c.vocab_size = vocab;
    c.hidden_size = 64;
    c.intermediate_size = intermediate;
    c.num_layers = 1;
    c.num_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = 16;
    return c;
}

std::string shard_error(const ModelConfig& c, TensorParallel tp) {
    try {
        shard_config(c, tp);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(TensorParallelConfig, RefusesSplitsThatDoNotDivide) {
    EXPECT_EQ(shard_error(small_config(12, 4, 96), {0, 8}),
              "num_attention_heads (12) is not divisible by the tensor parallel size (8)");
    EXPECT_EQ(shard_error(small_config(8, 4, 172), {0, 8}),
              "intermediate_size (172) is not divisible by the tensor parallel size (8)");
    EXPECT_NE(shard_error(small_config(12, 3, 96), {0, 2})
                  .find("num_key_value_heads (3) and the tensor parallel "
                        "size (2) do not divide one another"),
              std::string::npos);
    EXPECT_NE(shard_error(small_config(8, 8, 96), {2, 2}).find("rank 2 is outside [0, 2)"), std::string::npos);
    EXPECT_NE(shard_error(small_config(8, 8, 96), {0, 0}).find("at least 1, got 0"), std::string::npos);
    EXPECT_EQ(shard_error(small_config(8, 8, 96), {1, 4}), "");
}

TEST(TensorParallelConfig, ReplicatesKvHeadsWhenRanksOutnumberThem) {
    // 8 query heads, 2 kv heads (groups of 4), 8 ranks: one query head each; ranks 0-3 read kv
    // head 0, ranks 4-7 kv head 1.
    const ModelConfig full = small_config(8, 2, 64);
    for (int r = 0; r < 8; ++r) {
        const ModelConfig c = shard_config(full, {r, 8});
        EXPECT_EQ(c.num_heads, 1);
        EXPECT_EQ(c.num_kv_heads, 1);
        EXPECT_EQ(c.intermediate_size, 8);
        EXPECT_EQ(shard_kv_head(full, {r, 8}), r / 4);
    }
    // 4 ranks over 4 kv heads: one each, no replication.
    const ModelConfig four = small_config(8, 4, 64);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(shard_kv_head(four, {r, 4}), r);
    EXPECT_EQ(shard_kv_head(four, {1, 2}), 2);
}

TEST(TensorParallelConfig, VocabularyRowsLastRankTakesTheRemainder) {
    const ModelConfig full = small_config(4, 4, 64, 10);
    const int begins[] = {0, 2, 4, 6}, ends[] = {2, 4, 6, 10};
    for (int r = 0; r < 4; ++r) {
        const ModelConfig c = shard_config(full, {r, 4});
        EXPECT_EQ(c.vocab_size, 10);
        EXPECT_EQ(c.vocab_begin(), begins[r]);
        EXPECT_EQ(c.vocab_end(), ends[r]);
    }
    EXPECT_EQ(full.vocab_begin(), 0);
    EXPECT_EQ(full.vocab_end(), 10);
}

TEST(TensorParallelLoadTest, ErrorsNameThePathAndTheNumbers) {
    CpuBackend backend(1);
    try {
        load(data_dir() + "/llama3-tiny", backend, {0, 3});
        FAIL() << "T = 3 loaded";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("llama3-tiny"), std::string::npos) << msg;
        EXPECT_NE(msg.find("num_attention_heads (4) is not divisible by the tensor parallel size (3)"),
                  std::string::npos)
            << msg;
    }
    try {
        load(models_dir() + "/stories260K", backend, {0, 8});
        FAIL() << "T = 8 loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("intermediate_size (172)"), std::string::npos) << e.what();
    }
    EXPECT_THROW(load_dummy_model(data_dir() + "/llama3-tiny", backend, 0, 0.02f, {0, 3}), Error);
}

// The dummy format allocates the rank's shapes only; the replicated norms agree with the
// one-rank dummy load (same seeds), the sharded tensors differ between ranks.
TEST(TensorParallelLoadTest, DummyLoadAllocatesTheRankShapes) {
    CpuBackend backend(1);
    const std::string path = data_dir() + "/qwen2-tiny";
    auto one = load_dummy_model(path, backend, 7);
    auto r0 = load_dummy_model(path, backend, 7, 0.02f, {0, 4});
    auto r3 = load_dummy_model(path, backend, 7, 0.02f, {3, 4});
    const ModelConfig& f = one->config;
    for (const auto* m : {r0.get(), r3.get()}) {
        const ModelConfig& c = m->config;
        expect_shard_config(f, c, c.tp);
        const ModelWeights& w = m->weights;
        EXPECT_EQ(w.embed.rows(), c.vocab_end() - c.vocab_begin());
        EXPECT_EQ(w.lm_head.rows(), c.vocab_end() - c.vocab_begin());
        for (const LayerWeights& L : w.layers) {
            EXPECT_EQ(L.wq.rows(), c.q_dim());
            EXPECT_EQ(L.wk.rows(), c.kv_dim());
            EXPECT_EQ(L.wv.rows(), c.kv_dim());
            EXPECT_EQ(L.bq.numel(), c.q_dim());
            EXPECT_EQ(L.bk.numel(), c.kv_dim());
            EXPECT_EQ(L.wo.cols(), c.q_dim());
            EXPECT_EQ(L.wo.rows(), f.hidden_size);
            EXPECT_EQ(L.w_gate.rows(), c.intermediate_size);
            EXPECT_EQ(L.w_up.rows(), c.intermediate_size);
            EXPECT_EQ(L.w_down.cols(), c.intermediate_size);
            EXPECT_EQ(L.attn_norm.numel(), f.hidden_size);
        }
    }
    auto f32 = [](const Tensor& t) { return dequantized(t); };
    EXPECT_TRUE(same_bits(f32(r0->weights.final_norm), f32(one->weights.final_norm)));
    EXPECT_TRUE(same_bits(f32(r3->weights.layers[1].ffn_norm), f32(one->weights.layers[1].ffn_norm)));
    EXPECT_FALSE(same_bits(f32(r0->weights.layers[0].wq), f32(r3->weights.layers[0].wq)));
}

}  // namespace
}  // namespace peregrine::testing
