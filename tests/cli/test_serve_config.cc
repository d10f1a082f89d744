// Configuration layers (command line > PEREGRINE_* environment > TOML file > defaults): the
// parser and the layering on a CLI11 app, then `peregrine serve` through the real binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cli/config.h"

namespace {

using peregrine::cli::add_config_layers;
using peregrine::cli::env_var_name;
using peregrine::cli::parse_toml;
using peregrine::cli::TomlValue;

// A temporary file holding `text`, removed at scope exit.
struct TempFile {
    std::string path;
    explicit TempFile(const std::string& text) {
        char name[] = "/tmp/peregrine-config-XXXXXX";
        const int fd = ::mkstemp(name);
        ::close(fd);
        path = name;
        std::ofstream(path) << text;
    }
    ~TempFile() { std::remove(path.c_str()); }
};

// Sets an environment variable for the scope.
struct ScopedEnv {
    std::string name;
    ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
        ::setenv(name.c_str(), value.c_str(), 1);
    }
    ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

TEST(TomlConfig, ParsesScalarsArraysAndComments) {
    const auto e = parse_toml(
        "# comment\n"
        "port = 8_000   # trailing comment\n"
        "host = \"0.0.0.0\"\n"
        "api-key = [\"k1\", 'k#2',\n"
        "  \"k\\\"3\\u00e9\",  # in an array\n"
        "]\n"
        "ratio = -1.5e3\n"
        "access-log = true\n",
        "t.toml");
    ASSERT_EQ(e.size(), 5u);
    EXPECT_EQ(e[0].key, "port");
    EXPECT_EQ(e[0].value.kind, TomlValue::Kind::Integer);
    EXPECT_EQ(e[0].value.text, "8000");
    EXPECT_EQ(e[1].value.kind, TomlValue::Kind::String);
    EXPECT_EQ(e[1].value.text, "0.0.0.0");
    ASSERT_EQ(e[2].value.kind, TomlValue::Kind::Array);
    ASSERT_EQ(e[2].value.items.size(), 3u);
    EXPECT_EQ(e[2].value.items[1].text, "k#2");
    EXPECT_EQ(e[2].value.items[2].text, "k\"3\xc3\xa9");
    EXPECT_EQ(e[3].value.kind, TomlValue::Kind::Float);
    EXPECT_EQ(e[3].line, 7);
    EXPECT_EQ(e[4].value.kind, TomlValue::Kind::Boolean);
}

TEST(TomlConfig, RejectsMalformedInput) {
    for (const char* bad : {"port = abc\n", "port 8000\n", "[serve]\nport = 1\n", "host = \"x\n", "a.b = 1\n",
                            "port = 1 2\n", "k = [1, [2]]\n", "k = [1, 2\n", "k =\n"}) {
        EXPECT_THROW(parse_toml(bad, "bad.toml"), CLI::ConfigError) << bad;
    }
    try {
        parse_toml("\n\nport = abc\n", "bad.toml");
        FAIL();
    } catch (const CLI::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("bad.toml:3"), std::string::npos) << e.what();
        EXPECT_EQ(e.get_exit_code(), 1);
    }
}

TEST(TomlConfig, EnvVarName) {
    EXPECT_EQ(env_var_name("api-key"), "PEREGRINE_API_KEY");
    EXPECT_EQ(env_var_name("max-num-seqs"), "PEREGRINE_MAX_NUM_SEQS");
}

struct TestArgs {
    int port = 8000;
    std::string host = "127.0.0.1";
    std::vector<std::string> keys;
    int64_t memory = 0;
    bool access_log = false;
    double timeout = 10;
};

// Parses `argv` with a `serve`-like subcommand that has the config layers.
TestArgs parse(std::vector<std::string> argv) {
    CLI::App app;
    TestArgs a;
    CLI::App* cmd = app.add_subcommand("serve");
    cmd->add_option("--port", a.port)->check(CLI::Range(0, 65535));
    cmd->add_option("--host", a.host);
    cmd->add_option("--api-key", a.keys);
    cmd->add_option("--kv-cache-memory", a.memory);
    cmd->add_flag("--access-log,!--no-access-log", a.access_log);
    cmd->add_option("--shutdown-timeout", a.timeout);
    add_config_layers(cmd, "PGTEST_");
    argv.insert(argv.begin(), {"peregrine", "serve"});
    std::vector<const char*> c;
    for (const std::string& s : argv) c.push_back(s.c_str());
    app.parse(static_cast<int>(c.size()), c.data());
    return a;
}

TEST(ConfigLayers, FileEnvAndCommandLinePrecedence) {
    TempFile f(
        "port = 9000\nhost = \"0.0.0.0\"\napi-key = [\"k1\", \"k2\"]\nkv-cache-memory = 1073741824\n"
        "no-access-log = false\nshutdown-timeout = 3\n");
    TestArgs a = parse({"--config", f.path});
    EXPECT_EQ(a.port, 9000);
    EXPECT_EQ(a.host, "0.0.0.0");
    EXPECT_EQ(a.keys, (std::vector<std::string>{"k1", "k2"}));
    EXPECT_EQ(a.memory, int64_t{1} << 30);
    EXPECT_TRUE(a.access_log);
    EXPECT_EQ(a.timeout, 3.0);

    {
        ScopedEnv port("PGTEST_PORT", "9100");
        ScopedEnv keys("PGTEST_API_KEY", "e1, e2,e3");
        a = parse({"--config", f.path});
        EXPECT_EQ(a.port, 9100);
        EXPECT_EQ(a.keys, (std::vector<std::string>{"e1", "e2", "e3"}));
        EXPECT_EQ(a.host, "0.0.0.0");
        a = parse({"--config", f.path, "--port", "9200", "--api-key", "c1"});
        EXPECT_EQ(a.port, 9200);
        EXPECT_EQ(a.keys, (std::vector<std::string>{"c1"}));
    }
    {
        ScopedEnv config("PGTEST_CONFIG", f.path);
        EXPECT_EQ(parse({}).port, 9000);
    }
    a = parse({});  // defaults
    EXPECT_EQ(a.port, 8000);
    EXPECT_TRUE(a.keys.empty());
    EXPECT_FALSE(a.access_log);
}

// The error message of parsing with `file_text` as the config file (empty when it parses).
std::string config_error(const std::string& file_text) {
    TempFile f(file_text);
    try {
        parse({"--config", f.path});
    } catch (const CLI::ParseError& e) {
        EXPECT_EQ(e.get_exit_code(), 1) << e.what();
        return e.what();
    }
    return "";
}

TEST(ConfigLayers, ClearErrors) {
    std::string e = config_error("port = 1\nprot = 2\n");
    EXPECT_NE(e.find(":2: unknown key 'prot'"), std::string::npos) << e;
    EXPECT_NE(e.find("/tmp/peregrine-config-"), std::string::npos) << e;
    e = config_error("port = \"8000\"\n");
    EXPECT_NE(e.find("port: expected an integer, got a string"), std::string::npos) << e;
    e = config_error("host = 5\n");
    EXPECT_NE(e.find("expected a string"), std::string::npos) << e;
    e = config_error("port = [1, 2]\n");
    EXPECT_NE(e.find("expected a single value"), std::string::npos) << e;
    e = config_error("port = 70000\n");
    EXPECT_NE(e.find("port"), std::string::npos) << e;
    e = config_error("access-log = 1\n");
    EXPECT_NE(e.find("expected a boolean"), std::string::npos) << e;
    e = config_error("port = 1\nport = 2\n");
    EXPECT_NE(e.find("repeats line 1"), std::string::npos) << e;
    EXPECT_EQ(config_error("shutdown-timeout = 2\n"), "");  // an integer is a fine float

    ScopedEnv port("PGTEST_PORT", "eighty");
    try {
        parse({});
        FAIL();
    } catch (const CLI::ParseError& err) {
        EXPECT_NE(std::string(err.what()).find("PGTEST_PORT: expected an integer, got 'eighty'"), std::string::npos)
            << err.what();
        EXPECT_EQ(err.get_exit_code(), 1);
    }
    try {
        parse({"--config", "/nonexistent/peregrine.toml", "--port", "1"});
        FAIL();
    } catch (const CLI::ParseError& err) {
        EXPECT_NE(std::string(err.what()).find("/nonexistent/peregrine.toml"), std::string::npos) << err.what();
    }
}

// --- through the binary ------------------------------------------------------------------------

struct ServeResult {
    std::string ready_line;  // empty when the process exited first
    std::string output;      // stderr up to the ready line, or all of it
    int exit_code = -1;      // when it exited by itself
};

// Starts `peregrine serve ARGS` with `env` added, reads stderr until the ready line, then
// stops the server with SIGTERM.
ServeResult serve(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], STDERR_FILENO);
        ::close(fds[0]);
        ::close(fds[1]);
        for (const std::string& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
        std::vector<char*> argv{const_cast<char*>(PG_BINARY), const_cast<char*>("serve")};
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(PG_BINARY, argv.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    ServeResult r;
    FILE* err = ::fdopen(fds[0], "r");
    char line[4096];
    while (std::fgets(line, sizeof(line), err)) {
        r.output += line;
        if (std::string(line).rfind("ready: ", 0) == 0) {
            r.ready_line = line;
            break;
        }
    }
    if (!r.ready_line.empty()) ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::fclose(err);
    if (r.ready_line.empty() && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    return r;
}

TEST(ServeConfig, FileThenEnvironmentThenCommandLine) {
    TempFile f("served-model-name = \"from-file\"\nport = 0\nmax-num-seqs = 8\napi-key = [\"k1\", \"k2\"]\n");
    ServeResult r = serve({"--config", f.path});
    EXPECT_NE(r.ready_line.find("ready: serving 'from-file' at http://127.0.0.1:"), std::string::npos) << r.output;
    EXPECT_NE(r.ready_line.find("(2 API keys)"), std::string::npos) << r.output;

    r = serve({"--config", f.path}, {"PEREGRINE_SERVED_MODEL_NAME=from-env", "PEREGRINE_API_KEY=a,b,c"});
    EXPECT_NE(r.ready_line.find("ready: serving 'from-env'"), std::string::npos) << r.output;
    EXPECT_NE(r.ready_line.find("(3 API keys)"), std::string::npos) << r.output;

    r = serve({"--config", f.path, "--served-model-name", "from-cli", "--port", "0"},
              {"PEREGRINE_SERVED_MODEL_NAME=from-env"});
    EXPECT_NE(r.ready_line.find("ready: serving 'from-cli'"), std::string::npos) << r.output;
}

TEST(ServeConfig, BadFileExitsOne) {
    TempFile f("port = 0\nmax-num-sequences = 8\n");
    ServeResult r = serve({"--config", f.path});
    EXPECT_TRUE(r.ready_line.empty());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(f.path + ":2: unknown key 'max-num-sequences'"), std::string::npos) << r.output;

    TempFile g("port = \"zero\"\n");
    r = serve({"--config", g.path});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("expected an integer, got a string"), std::string::npos) << r.output;
}

}  // namespace
