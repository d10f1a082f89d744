// Embeddings through the engine (Request::pooling) against sentence-transformers' vectors for
// the fixture models (tests/data/embeddings, see tests/data/README.md): each case's folder is
// built under the temporary folder (the fixture model's files plus the case's modules.json and
// pooling config) and served by Engine::create with task embed, as `serve --task embed` does.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

#include <unistd.h>

#include "engine/pooling.h"
#include "model/sentence_transformers.h"
#include "peregrine/engine.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

namespace fs = std::filesystem;

// The bounds every case meets against the golden rows (see the README's embeddings section):
// float32 on both sides, our CPU kernels' summation order against torch's.
constexpr double kMinCosine = 1.0 - 1e-4;
constexpr double kMaxAbsDiff = 5e-6;  // seen: 7.2e-7 at most (qwen2-tiny raw), AVX-512

struct Case {
    const char* name;  // the folder under tests/data/embeddings and the golden's stem
    PoolingType type;
    bool normalize;
    // The golden's token ids are what tokenizer.json gives (ours must equal them). Not so for
    // qwen2-tiny: transformers 5 builds its Qwen2 tokenizer class for model_type qwen2 (a byte-level
    // split) instead of the file's Metaspace pipeline, which we follow; its vectors are checked
    // from the golden ids only.
    bool hf_tokenizes_as_file = true;
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.name;
}

// This process's scratch folder under the system's temporary folder, removed at exit: not the
// working directory (the source tree when the binary is run from there), and one a process, since
// ctest runs tests that share a case name as parallel processes.
const fs::path& scratch_root() {
    static const struct Root {
        fs::path path = fs::temp_directory_path() / ("peregrine-test-embeddings-" + std::to_string(::getpid()));
        ~Root() {
            std::error_code ec;
            fs::remove_all(path, ec);
        }
    } root;
    return root.path;
}

// The fixture model's files with the case's sentence-transformers files laid over them (copies:
// the repository holds the weights once).
std::string build_case_folder(const std::string& name, const std::string& model) {
    const fs::path dir = scratch_root() / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(fs::path(data_dir()) / model))
        if (e.is_regular_file()) fs::copy_file(e.path(), dir / e.path().filename());
    fs::copy(fs::path(data_dir()) / "embeddings" / name, dir, fs::copy_options::recursive);
    return dir.string();
}

struct Golden {
    std::vector<std::string> inputs;
    std::vector<std::vector<int32_t>> token_ids;
    std::vector<std::vector<float>> embeddings;
    std::string model;
};

Golden read_golden(const std::string& name) {
    const auto j = read_json_file(data_dir() + "/embeddings/" + name + ".golden.json");
    return {j["inputs"].get<std::vector<std::string>>(), j["token_ids"].get<std::vector<std::vector<int32_t>>>(),
            j["embeddings"].get<std::vector<std::vector<float>>>(), j["model"].get<std::string>()};
}

std::unique_ptr<Engine> embed_engine(const std::string& folder, int max_batched_tokens = 0,
                                     const std::function<void(EngineConfig&)>& edit = {}) {
    EngineConfig c;
    c.model = folder;
    c.device = "cpu";
    c.threads = 2;
    c.task = "embed";
    c.kv_cache_memory = 16 << 20;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = max_batched_tokens;
    if (edit) edit(c);
    return Engine::create(c);
}

// Submits every prompt at once (they share steps) and returns their vectors in order.
std::vector<std::vector<float>> embed_all(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                          int dimensions = 0) {
    static int next_id = 0;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& ids : prompts) {
        Request r;
        r.id = "embd-" + std::to_string(next_id++);
        r.prompt_ids = ids;
        r.pooling = engine.model().pooling;
        r.pooling->dimensions = dimensions;
        streams.push_back(engine.submit(std::move(r)));
    }
    std::vector<std::vector<float>> out;
    for (auto& s : streams) {
        RequestOutput o;
        std::vector<float> v;
        int outputs = 0;
        while (s->next(o)) {
            ++outputs;
            EXPECT_EQ(o.finish, FinishReason::Stop);
            EXPECT_TRUE(o.usage.has_value());
            if (o.usage) {
                EXPECT_EQ(o.usage->completion_tokens, 0);
            }
            v = o.embedding;
        }
        EXPECT_EQ(outputs, 1);
        out.push_back(std::move(v));
    }
    return out;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
}

struct Agreement {
    double min_cosine = 1, max_abs_diff = 0;
};

Agreement compare(const std::vector<std::vector<float>>& ours, const std::vector<std::vector<float>>& ref) {
    Agreement a;
    EXPECT_EQ(ours.size(), ref.size());
    for (size_t i = 0; i < ours.size() && i < ref.size(); ++i) {
        EXPECT_EQ(ours[i].size(), ref[i].size()) << "row " << i;
        if (ours[i].size() != ref[i].size()) continue;
        a.min_cosine =
            std::min(a.min_cosine, dot(ours[i], ref[i]) / std::sqrt(dot(ours[i], ours[i]) * dot(ref[i], ref[i])));
        for (size_t c = 0; c < ref[i].size(); ++c)
            a.max_abs_diff = std::max(a.max_abs_diff, static_cast<double>(std::fabs(ours[i][c] - ref[i][c])));
    }
    return a;
}

class EmbeddingGolden : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        golden_ = read_golden(GetParam().name);
        folder_ = build_case_folder(GetParam().name, golden_.model);
    }
    Golden golden_;
    std::string folder_;
};

TEST_P(EmbeddingGolden, FolderPoolingIsRead) {
    const std::optional<FolderPooling> f = read_folder_pooling(folder_);
    ASSERT_TRUE(f && f->type);
    EXPECT_EQ(*f->type, GetParam().type);
    EXPECT_EQ(f->normalize, GetParam().normalize);
}

// Texts tokenized by us (the ids must be the Hugging Face tokenizer's), then the vectors.
TEST_P(EmbeddingGolden, TextsMatchSentenceTransformers) {
    auto engine = embed_engine(folder_);
    ASSERT_TRUE(engine->model().pooling);
    EXPECT_EQ(engine->model().pooling->type, GetParam().type);
    EXPECT_EQ(engine->model().pooling->normalize, GetParam().normalize);
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& text : golden_.inputs) ids.push_back(engine->tokenize(text));
    if (!GetParam().hf_tokenizes_as_file) {
        EXPECT_NE(ids, golden_.token_ids) << "the tokenizers agree now: set hf_tokenizes_as_file";
        GTEST_SKIP() << "Hugging Face's tokenizer for this fixture does not follow its tokenizer.json";
    }
    EXPECT_EQ(ids, golden_.token_ids);
    const Agreement a = compare(embed_all(*engine, ids), golden_.embeddings);
    std::printf("%s: min cosine 1 - %.3g, max |diff| %.3g\n", GetParam().name, 1 - a.min_cosine, a.max_abs_diff);
    EXPECT_GE(a.min_cosine, kMinCosine);
    EXPECT_LE(a.max_abs_diff, kMaxAbsDiff);
}

// The golden token ids as given, batched together, one at a time, and prefilled in chunks of 7
// tokens (several steps per prompt): the same vectors.
TEST_P(EmbeddingGolden, IdsBatchedAloneAndChunkedAgree) {
    auto engine = embed_engine(folder_);
    const auto batched = embed_all(*engine, golden_.token_ids);
    const Agreement a = compare(batched, golden_.embeddings);
    std::printf("%s (golden ids): min cosine 1 - %.3g, max |diff| %.3g\n", GetParam().name, 1 - a.min_cosine,
                a.max_abs_diff);
    EXPECT_GE(a.min_cosine, kMinCosine);
    EXPECT_LE(a.max_abs_diff, kMaxAbsDiff);
    std::vector<std::vector<float>> alone;
    for (const auto& ids : golden_.token_ids) alone.push_back(embed_all(*engine, {ids})[0]);
    EXPECT_LE(compare(alone, batched).max_abs_diff, 1e-6);
    auto chunked_engine = embed_engine(folder_, 7);
    const auto chunked = embed_all(*chunked_engine, golden_.token_ids);
    EXPECT_LE(compare(chunked, batched).max_abs_diff, 1e-6);
    // Once more on the same engine: prefix-cache hits (last-token pooling may take them) change nothing.
    EXPECT_LE(compare(embed_all(*engine, golden_.token_ids), batched).max_abs_diff, 1e-6);
}

TEST_P(EmbeddingGolden, NormsFollowTheNormalizeModule) {
    auto engine = embed_engine(folder_);
    for (const auto& v : embed_all(*engine, golden_.token_ids)) {
        const double norm = std::sqrt(dot(v, v));
        if (GetParam().normalize)
            EXPECT_NEAR(norm, 1.0, 1e-5);
        else
            EXPECT_GT(std::fabs(norm - 1.0), 1e-2) << "a raw vector of norm " << norm;
    }
}

// Matryoshka: the first N values of the full vector (before its normalisation), re-normalised
// when the model normalises.
TEST_P(EmbeddingGolden, DimensionsTruncateThenNormalise) {
    auto engine = embed_engine(folder_);
    const int dims = 16;
    const auto cut = embed_all(*engine, golden_.token_ids, dims);
    std::vector<std::vector<float>> want;
    for (const auto& g : golden_.embeddings) {
        std::vector<float> v(g.begin(), g.begin() + dims);
        if (GetParam().normalize) {
            const double n = std::sqrt(dot(v, v));
            for (float& x : v) x = static_cast<float>(x / n);
        }
        want.push_back(v);
    }
    const Agreement a = compare(cut, want);
    EXPECT_GE(a.min_cosine, kMinCosine);
    EXPECT_LE(a.max_abs_diff, 10 * kMaxAbsDiff);
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbeddingGolden,
                         ::testing::Values(Case{"qwen3-tiny-last", PoolingType::Last, true},
                                           Case{"llama3-tiny-mean", PoolingType::Mean, true},
                                           Case{"qwen2-tiny-mean-raw", PoolingType::Mean, false, false}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                             std::string n = i.param.name;
                             for (char& ch : n)
                                 if (ch == '-') ch = '_';
                             return n;
                         });

// The pooling flags win over the folder; with no modules.json: last for qwen3, mean otherwise.
TEST(EmbeddingPooling, FlagsThenFolderThenArchitecture) {
    const std::string folder = build_case_folder("qwen2-tiny-mean-raw", "qwen2-tiny");
    EngineConfig c;
    std::string source;
    PoolingParams p = resolve_pooling(c, folder, "qwen2", &source);
    EXPECT_EQ(p.type, PoolingType::Mean);
    EXPECT_FALSE(p.normalize);
    EXPECT_EQ(source, "modules.json");
    c.pooling_type = "cls";
    c.normalize = 1;
    p = resolve_pooling(c, folder, "qwen2", &source);
    EXPECT_EQ(p.type, PoolingType::Cls);
    EXPECT_TRUE(p.normalize);
    p = resolve_pooling(EngineConfig{}, data_dir() + "/qwen3-tiny", "qwen3", &source);
    EXPECT_EQ(p.type, PoolingType::Last);
    EXPECT_TRUE(p.normalize);
    p = resolve_pooling(EngineConfig{}, data_dir() + "/llama3-tiny", "llama", &source);
    EXPECT_EQ(p.type, PoolingType::Mean);
}

// A flag that contradicts the folder gives a different vector (the comparison above can fail).
TEST(EmbeddingPooling, AnotherPoolingDoesNotMatchTheGolden) {
    const Golden g = read_golden("llama3-tiny-mean");
    const std::string folder = build_case_folder("llama3-tiny-mean", g.model);
    for (const char* type : {"last", "cls"}) {
        auto engine = embed_engine(folder, 0, [&](EngineConfig& c) { c.pooling_type = type; });
        EXPECT_LT(compare(embed_all(*engine, g.token_ids), g.embeddings).min_cosine, 0.99) << type;
    }
}

TEST(EmbeddingPooling, PositionsPerChunk) {
    using P = std::pair<int, int>;
    EXPECT_EQ(pooled_positions(PoolingType::Mean, 4, 8, 10), P(4, 8));
    EXPECT_EQ(pooled_positions(PoolingType::Last, 4, 8, 10), P(8, 8));
    EXPECT_EQ(pooled_positions(PoolingType::Last, 8, 10, 10), P(9, 10));
    EXPECT_EQ(pooled_positions(PoolingType::Cls, 0, 4, 10), P(0, 1));
    EXPECT_EQ(pooled_positions(PoolingType::Cls, 4, 8, 10), P(8, 8));
    const std::vector<float> v = finish_embedding({3, 4, 12}, 2, {PoolingType::Mean, true, 2});
    ASSERT_EQ(v.size(), 2u);
    EXPECT_FLOAT_EQ(v[0], 0.6f);
    EXPECT_FLOAT_EQ(v[1], 0.8f);
    EXPECT_EQ(finish_embedding({3, 4}, 2, {PoolingType::Mean, false, 0}), (std::vector<float>{1.5f, 2.0f}));
}

// An embedding request may fill the context (nothing is generated after it), not exceed it.
TEST(EmbeddingPooling, InputUpToTheContext) {
    const Golden g = read_golden("qwen3-tiny-last");
    const std::string folder = build_case_folder("qwen3-tiny-last", g.model);
    auto engine = embed_engine(folder, 0, [](EngineConfig& c) { c.max_model_len = 32; });
    std::vector<int32_t> ids(32, 300);
    EXPECT_EQ(embed_all(*engine, {ids})[0].size(), 64u);
    ids.push_back(300);
    Request r;
    r.id = "too-long";
    r.prompt_ids = ids;
    r.pooling = engine->model().pooling;
    EXPECT_THROW(engine->submit(r), Error);
}

}  // namespace
}  // namespace peregrine::testing
