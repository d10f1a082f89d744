// How a child process ended, from waitpid's status, for messages ("exited with status 1",
// "killed by signal 9").
#pragma once

#include <sys/wait.h>

#include <string>

namespace peregrine {

inline std::string exit_status_text(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "stopped";
}

}  // namespace peregrine
