// `peregrine tokenize` / `detokenize` / `generate --prompt` through the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct RunResult {
    int exit_code;  // -1 when killed by a signal
    std::string out;
};

// Runs the binary from / with `args`; stdin from `input` when given (through a file).
RunResult run(const std::string& args, const std::string* input = nullptr, bool merge_stderr = false) {
    std::string cmd = "cd / && " + std::string(PG_BINARY) + " " + args;
    std::string tmp;
    if (input) {
        char name[] = "/tmp/peregrine-tokcli-XXXXXX";
        const int fd = ::mkstemp(name);
        FILE* f = ::fdopen(fd, "wb");
        std::fwrite(input->data(), 1, input->size(), f);
        std::fclose(f);
        tmp = name;
        cmd += " < " + tmp;
    }
    cmd += merge_stderr ? " 2>&1" : " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    if (!tmp.empty()) std::remove(tmp.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kFixtures = PG_TOKENIZER_DATA_DIR;

TEST(TokenizerCli, TokenizeRawJsonAndStdin) {
    const std::string gpt2 = "--tokenizer " + kFixtures + "/ggml-vocab-gpt-2.gguf";
    auto r = run("tokenize --raw " + gpt2 + " 'Hello world'");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, "15496 995\n");
    r = run("tokenize --raw --json " + gpt2 + " 'Hello world'");
    EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse(R"({"ids": [15496, 995]})"));
    const std::string text = " Hello\n\nworld 🦙";
    r = run("tokenize --raw " + gpt2 + " -", &text);
    EXPECT_EQ(r.exit_code, 0);
    ASSERT_FALSE(r.out.empty());
    // And back, byte for byte (no newline added).
    std::string ids = r.out.substr(0, r.out.size() - 1);
    for (char& c : ids)
        if (c == ' ') c = ',';
    r = run("detokenize " + gpt2 + " " + ids);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, text);
}

TEST(TokenizerCli, DefaultAddsBosAndParsesSpecials) {
    // The embedded model (stories260K, a folder): BOS by its tokenizer_config.json.
    auto r = run("tokenize 'Once upon a time'");
    EXPECT_EQ(r.out, "1 403 407 261 378\n");
    r = run("tokenize --raw 'Once upon a time'");
    EXPECT_EQ(r.out, "403 407 261 378\n");
    const std::string spm = "--tokenizer " + kFixtures + "/ggml-vocab-llama-spm.gguf";
    r = run("tokenize " + spm + " '<s>Hi'");  // special text parsed by default
    EXPECT_EQ(r.out.substr(0, 4), "1 1 ");
    r = run("tokenize --raw " + spm + " '<s>Hi'");  // --raw: plain text
    EXPECT_NE(r.out.substr(0, 2), "1 ");
    r = run("detokenize --keep-special 1,403,407 ");
    EXPECT_EQ(r.out, "<s> Once upon");
}

TEST(TokenizerCli, ErrorsExitOne) {
    auto r = run("tokenize --tokenizer /nonexistent/tokenizer.json hi", nullptr, true);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.out.find("error: /nonexistent/tokenizer.json"), std::string::npos) << r.out;
    r = run("detokenize 1,99999", nullptr, true);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.out.find("outside the vocabulary"), std::string::npos) << r.out;
    r = run("detokenize 1,x", nullptr, true);
    EXPECT_EQ(r.exit_code, 1);
}

TEST(TokenizerCli, GenerateFromTextPrompt) {
    auto r = run("generate --prompt 'Once upon a time' --max-tokens 8 --temperature 0 --json --threads 1");
    ASSERT_EQ(r.exit_code, 0);
    const auto last = r.out.substr(r.out.rfind('{'));
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j["prompt_ids"], nlohmann::json::parse("[1, 403, 407, 261, 378]"));
    EXPECT_FALSE(j["text"].get<std::string>().empty());
    // The same continuation as from the ids.
    auto r2 = run("generate --prompt-ids 1,403,407,261,378 --max-tokens 8 --temperature 0 --json --threads 1");
    ASSERT_EQ(r2.exit_code, 0);
    EXPECT_EQ(nlohmann::json::parse(r2.out.substr(r2.out.rfind('{')))["ids"], j["ids"]);
}

}  // namespace
