// The long-running commands (serve, router) take SIGINT / SIGTERM with sigwait on the main
// thread: block them in every thread (call before starting any), ignore SIGPIPE (a peer that
// closed is an error code, not a crash), and return the set to wait on.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace peregrine::cli {

inline sigset_t block_stop_signals() {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    return signals;
}

}  // namespace peregrine::cli
