// `peregrine chat-template`, black box: byte-exact output on a fixture case, the raised message on
// stderr with a non-zero exit, syntax errors with line and column.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
    int status = -1;
    std::string out;
};

// Runs the binary; stdout only, or stdout + stderr.
Result run(const std::string& args, bool with_stderr = false) {
    const std::string cmd = "cd / && " + std::string(PG_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
    Result r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

std::string temp_file(const std::string& name, const std::string& content) {
    const auto path = std::filesystem::temp_directory_path() / ("pg_ct_" + std::to_string(::getpid()) + "_" + name);
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
}

const std::string kTemplates = std::string(PG_TEST_DATA_DIR) + "/chat-templates/templates/";

TEST(ChatTemplateCli, RendersAFixtureCaseByteForByte) {
    // The first tool_call case for Llama 3.2 (strftime_now given the fixtures' date)
    std::ifstream f(std::string(PG_TEST_DATA_DIR) + "/chat-templates/cases.jsonl");
    std::string line;
    nlohmann::ordered_json c;
    while (std::getline(f, line)) {
        c = nlohmann::ordered_json::parse(line);
        if (c["template"] == "meta-llama-Llama-3.2-3B-Instruct.jinja" && c["conversation"] == "tool_call") break;
    }
    ASSERT_EQ(c["conversation"], "tool_call");
    const std::string ctx = temp_file("ctx.json", c["context"].dump());
    const Result r = run("chat-template --template " + kTemplates + "meta-llama-Llama-3.2-3B-Instruct.jinja" +
                         " --context-json " + ctx + " --date 2026-11-21");
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.out, c["expected"].get<std::string>());
    std::filesystem::remove(ctx);
}

TEST(ChatTemplateCli, MessagesAndFlags) {
    const std::string tmpl =
        temp_file("t.jinja",
                  "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                  "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}{{ enable_thinking }}\n");
    const Result r = run("chat-template --template " + tmpl +
                         " --messages '[{\"role\": \"user\", \"content\": \"hi\"}]' --add-generation-prompt"
                         " --bos-token '<s>' --eos-token '' --vars '{\"enable_thinking\": false}'");
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.out, "<s>[user]hi[assistant]False");  // the template's one trailing newline is dropped, as Jinja does
    std::filesystem::remove(tmpl);
}

TEST(ChatTemplateCli, RaiseExceptionGoesToStderr) {
    const std::string tmpl = temp_file("r.jinja", "partial{{ raise_exception('Only user and assistant roles!') }}");
    const Result r = run("chat-template --template " + tmpl + " --messages '[]'", true);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.out, "Only user and assistant roles!\n");
    std::filesystem::remove(tmpl);
}

TEST(ChatTemplateCli, SyntaxErrorNamesLineAndColumn) {
    const std::string tmpl = temp_file("s.jinja", "ok\n{% for m in messages %}\n{{ m.content }");
    const Result r = run("chat-template --template " + tmpl + " --messages '[]'", true);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("s.jinja:3:1: syntax error: missing '}}'"), std::string::npos) << r.out;
    std::filesystem::remove(tmpl);
}

}  // namespace
