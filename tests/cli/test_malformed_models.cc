// Bad model files through the real binary: each must end in a clear message naming the file
// and the tensor or key, and exit code 1 (not a signal, not garbage output).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/cpu_features.h"

namespace {

namespace fs = std::filesystem;

struct RunResult {
    int exit_code;  // -1 when killed by a signal
    std::string output;
};

RunResult run_binary(const std::string& args, const std::string& env = "") {
    // From / so that nothing relative to the source tree or the build folder helps.
    const std::string cmd = "cd / && " + env + " " + std::string(PG_BINARY) + " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const fs::path& p, const std::string& s) {
    std::ofstream out(p, std::ios::binary);
    out << s;
}

class MalformedModel : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("peregrine-malformed-" + std::to_string(::getpid()) + "-" +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // A copy of the embedded HF model whose config.json is edited by `edit`.
    fs::path hf_copy(const std::function<void(nlohmann::json&)>& edit) {
        const fs::path src = fs::path(PG_MODELS_DIR) / "stories260K";
        const fs::path dst = dir_ / "model";
        fs::create_directories(dst);
        for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
            fs::copy_file(src / f, dst / f);
        nlohmann::json cfg = nlohmann::json::parse(read_file(src / "config.json"));
        edit(cfg);
        write_file(dst / "config.json", cfg.dump(2));
        return dst;
    }

    RunResult generate(const fs::path& model) {
        return run_binary("generate --model '" + model.string() +
                          "' --prompt-ids 1,403 --max-tokens 4 --temperature 0");
    }

    void expect_error(const RunResult& r, std::initializer_list<std::string> needles) {
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
        for (const auto& s : needles)
            EXPECT_NE(r.output.find(s), std::string::npos) << "missing '" << s << "' in: " << r.output;
    }

    fs::path dir_;
};

TEST_F(MalformedModel, ValidModelRuns) {
    const RunResult r = generate(hf_copy([](nlohmann::json&) {}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(MalformedModel, TruncatedGguf) {
    const std::string full = read_file(fs::path(PG_TEST_DATA_DIR) / "stories260K.gguf");
    // Cut inside the metadata, inside the tensor infos and inside the tensor data.
    for (size_t len : {size_t{3}, size_t{20}, size_t{5000}, full.size() / 2, full.size() - 1}) {
        const fs::path p = dir_ / ("cut" + std::to_string(len) + ".gguf");
        write_file(p, full.substr(0, len));
        const RunResult r = generate(p);
        expect_error(r, {p.string()});
    }
}

TEST_F(MalformedModel, BadGgufMagic) {
    std::string bytes = read_file(fs::path(PG_TEST_DATA_DIR) / "stories260K.gguf");
    bytes.replace(0, 4, "GGUX");
    const fs::path p = dir_ / "bad.gguf";
    write_file(p, bytes);
    expect_error(generate(p), {p.string(), "magic"});
}

TEST_F(MalformedModel, UnknownGgufArchitecture) {
    std::string bytes = read_file(fs::path(PG_TEST_DATA_DIR) / "stories260K.gguf");
    const std::string key = "general.architecture";
    const size_t at = bytes.find(key);
    ASSERT_NE(at, std::string::npos);
    // key, u32 type, u64 length, then the value "llama": overwrite it with another 5 letters.
    const size_t value = at + key.size() + 4 + 8;
    ASSERT_EQ(bytes.substr(value, 5), "llama");
    bytes.replace(value, 5, "bloom");
    const fs::path p = dir_ / "bloom.gguf";
    write_file(p, bytes);
    expect_error(generate(p), {p.string(), "general.architecture 'bloom' is not supported"});
}

TEST_F(MalformedModel, TensorShapeMismatch) {
    const fs::path m = hf_copy([](nlohmann::json& c) { c["intermediate_size"] = 170; });
    expect_error(generate(m), {"model.layers.0.mlp.gate_proj.weight", "[172, 64]", "expected [170, 64]"});
}

TEST_F(MalformedModel, MissingTensor) {
    const fs::path m = hf_copy([](nlohmann::json& c) { c["num_hidden_layers"] = 6; });
    expect_error(generate(m), {"missing tensor 'model.layers.5.input_layernorm.weight'"});
}

TEST_F(MalformedModel, MissingConfigKey) {
    const fs::path m = hf_copy([](nlohmann::json& c) { c.erase("hidden_size"); });
    expect_error(generate(m), {"config.json", "missing key 'hidden_size'"});
}

TEST_F(MalformedModel, UnknownArchitecture) {
    const fs::path m = hf_copy([](nlohmann::json& c) { c["model_type"] = "gpt_neox"; });
    expect_error(generate(m), {"config.json", "model_type 'gpt_neox' is not supported"});
}

TEST_F(MalformedModel, UnsupportedRopeType) {
    const fs::path m = hf_copy([](nlohmann::json& c) {
        c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
    });
    expect_error(generate(m), {"config.json", "rope type 'longrope' is not supported"});
}

TEST_F(MalformedModel, TruncatedSafetensors) {
    const fs::path m = hf_copy([](nlohmann::json&) {});
    const std::string bytes = read_file(m / "model.safetensors");
    write_file(m / "model.safetensors", bytes.substr(0, bytes.size() - 1000));
    expect_error(generate(m), {"model.safetensors", "truncated"});
}

TEST_F(MalformedModel, UnsupportedSafetensorsDtype) {
    const fs::path m = hf_copy([](nlohmann::json&) {});
    // A well-formed file whose one tensor is F64.
    const std::string header = R"({"model.embed_tokens.weight":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
    std::string bytes(8, '\0');
    const uint64_t len = header.size();
    std::memcpy(bytes.data(), &len, 8);
    bytes += header + std::string(16, '\0');
    write_file(m / "model.safetensors", bytes);
    expect_error(generate(m), {"model.safetensors", "model.embed_tokens.weight", "unsupported dtype F64"});
}

TEST_F(MalformedModel, NotAModel) {
    const fs::path p = dir_ / "notes.txt";
    write_file(p, "hello");
    expect_error(generate(p), {p.string(), "not a model"});
    expect_error(generate(dir_ / "absent"), {"no such file"});
}

TEST(Cli, PromptIdsOutsideTheVocabulary) {
    const RunResult r = run_binary("generate --prompt-ids 1,9999 --max-tokens 2");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("9999 is outside the vocabulary"), std::string::npos) << r.output;
}

TEST(Cli, VersionListsBackends) {
    const RunResult r = run_binary("--version");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.output.find("peregrine 0."), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("backends: cpu"), std::string::npos) << r.output;
    // The kernel set in use is this process's (same environment).
    EXPECT_NE(r.output.find(std::string("in use: ") + peregrine::cpu_isa_name(peregrine::cpu_isa())), std::string::npos)
        << r.output;
}

// PEREGRINE_ISA=avx2 on an AVX-512 machine: --version says the AVX2 kernels are in use, and
// that the environment chose them, and no bf16 (AVX-512 kernels only).
TEST(Cli, VersionShowsTheKernelsInUse) {
    const peregrine::CpuFeatures& f = peregrine::cpu_features();
    if (!f.avx512 || !f.avx2) GTEST_SKIP() << "needs a CPU with AVX-512";
    const RunResult r = run_binary("--version", "PEREGRINE_ISA=avx2");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.output.find("this machine: avx512"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("in use: avx2 (PEREGRINE_ISA)"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("--dtype bfloat16"), std::string::npos) << r.output;
}

TEST(Cli, GenerateJsonFromAnotherDirectory) {
    // The embedded model is found from any working directory.
    const RunResult r = run_binary("generate --prompt-ids 1,403,407,261,378 --max-tokens 9 --temperature 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string last = r.output.substr(r.output.rfind("\n{") + 1);
    const auto j = nlohmann::json::parse(last.substr(0, last.find('\n')));
    EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 403, 407, 261, 378}));
    EXPECT_EQ(j["ids"], nlohmann::json({432, 383, 286, 261, 376, 298, 315, 421, 395}));
    EXPECT_EQ(j["text"], ", there was a little girl named");
}

}  // namespace
