// Runs one test of this test binary again in `size` processes (the ranks of a multi-process
// test): posix_spawn, not fork, so each is a fresh process that holds no CUDA context yet. Each
// rank gets the caller's environment plus what `env(rank)` adds ("NAME=value" entries).
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

extern char** environ;

namespace peregrine::testing {

// Runs `--gtest_filter=TEST` in `size` ranks and waits for them; returns how many failed (a
// rank that could not start counts as failed).
inline int run_self_ranks(const std::string& test, int size, const std::function<std::vector<std::string>(int)>& env) {
    char exe[4096];
    const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0) return size;
    exe[len] = 0;
    std::string filter = "--gtest_filter=" + test;
    char* argv[] = {exe, filter.data(), nullptr};
    std::vector<pid_t> pids;
    int failed = 0;
    for (int r = 0; r < size; ++r) {
        std::vector<std::string> vars;
        for (char** e = environ; *e; ++e) vars.push_back(*e);
        for (std::string& v : env(r)) vars.push_back(std::move(v));
        std::vector<char*> envp;
        for (std::string& v : vars) envp.push_back(v.data());
        envp.push_back(nullptr);
        pid_t pid = 0;
        if (::posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data()) == 0)
            pids.push_back(pid);
        else
            ++failed;
    }
    for (pid_t pid : pids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    return failed;
}

}  // namespace peregrine::testing
