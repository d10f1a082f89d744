#include "cli/data_parallel.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/stop_signals.h"
#include "cli/tls_flags.h"
#include "core/error.h"
#include "core/exit_status.h"
#include "dist/socket_io.h"
#include "router/router_server.h"
#include "worker/worker.h"

extern char** environ;

namespace peregrine::cli {

namespace {

// Flags the parent sets per replica, or keeps for its front (TLS: the replicas serve plain HTTP on
// loopback), each with one value, dropped from the command line.
bool replaced_flag(const std::string& arg) {
    for (const char* f : {"--data-parallel-size", "--port", "--host", "--device", "--threads",
                          "--gpu-memory-utilization", "--kv-events-endpoint", "--kv-events-replay-endpoint",
                          "--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certs", "--ssl-cert-reqs"}) {
        if (arg == f) return true;
    }
    return false;
}

bool replaced_flag_with_value(const std::string& arg) {
    const size_t eq = arg.find('=');
    return eq != std::string::npos && replaced_flag(arg.substr(0, eq));
}

struct Replica {
    std::vector<std::string> args;
    int port = 0;
    pid_t pid = -1;
    int restarts = 0;
};

// Copies a replica's stderr to ours, each line prefixed "replica I: " (so that its own "ready"
// line is not taken for the router's), until the replica closes it.
void relay_lines(int fd, int index) {
    std::thread([fd, index] {
        std::string pending;
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(fd, buf, sizeof(buf));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            pending.append(buf, static_cast<size_t>(n));
            for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1))
                std::fprintf(stderr, "replica %d: %.*s\n", index, static_cast<int>(nl), pending.data());
        }
        if (!pending.empty()) std::fprintf(stderr, "replica %d: %s\n", index, pending.c_str());
        ::close(fd);
    }).detach();
}

pid_t spawn(const std::vector<std::string>& args, int index) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) fail("serve --data-parallel-size: pipe: ", errno_text(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // The replica takes SIGINT / SIGTERM normally (this process blocked them for sigwait).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    if (rc != 0) {
        ::close(pipe_fds[0]);
        fail("serve --data-parallel-size: cannot start a replica: ", errno_text(rc));
    }
    relay_lines(pipe_fds[0], index);
    return pid;
}

}  // namespace

std::string shift_endpoint_port(const std::string& endpoint, int by) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon + 1 >= endpoint.size()) return endpoint;
    const std::string port = endpoint.substr(colon + 1);
    if (port.find_first_not_of("0123456789") != std::string::npos) return endpoint;
    return endpoint.substr(0, colon + 1) + std::to_string(std::stoi(port) + by);
}

int run_data_parallel(const DataParallelOptions& o) {
    const sigset_t signals = block_stop_signals();

    // The replicas' devices.
    const bool cuda = worker_uses_cuda(o.engine);
    const int gpus = cuda ? worker_gpu_count() : 0;
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    // Ranks of each replica's model-parallel group (tensor x pipeline parallel; 1 without).
    const int group = o.engine.parallel_size();
    // CPU threads a rank (--threads is per rank).
    const int cpu_threads = o.engine.threads > 0 ? o.engine.threads : std::max(1, cores / (o.size * group));
    if (cuda && group > 1 && gpus < o.size * group)
        fail("--data-parallel-size ", o.size, " with ", group, " ranks a replica needs ", o.size * group,
             " GPUs (one a rank); this host has ", gpus);
    std::vector<std::string> base;
    for (size_t i = 0; i < original_args().size(); ++i) {
        const std::string& a = original_args()[i];
        if (replaced_flag(a)) {
            ++i;  // and its value
            continue;
        }
        if (!replaced_flag_with_value(a)) base.push_back(a);
    }
    std::vector<Replica> replicas(o.size);
    std::vector<std::string> urls;
    for (int i = 0; i < o.size; ++i) {
        Replica& r = replicas[i];
        r.port = pick_free_port("serve --data-parallel-size");
        r.args = base;
        for (const std::string& a : {std::string("--data-parallel-size"), std::string("1"), std::string("--host"),
                                     std::string("127.0.0.1"), std::string("--port"), std::to_string(r.port)})
            r.args.push_back(a);
        if (!cuda) {
            r.args.insert(r.args.end(), {"--device", "cpu", "--threads", std::to_string(cpu_threads)});
        } else if (gpus >= o.size * group) {  // replica i's group: GPUs [i * group, (i + 1) * group)
            r.args.insert(r.args.end(), {"--device", "cuda:" + std::to_string(i * group), "--gpu-memory-utilization",
                                         std::to_string(o.engine.gpu_memory_utilization)});
        } else {
            r.args.insert(r.args.end(),
                          {"--device", o.engine.device == "auto" ? "cuda" : o.engine.device, "--gpu-memory-utilization",
                           std::to_string(o.engine.gpu_memory_utilization / o.size)});
        }
        if (!o.kv_events_endpoint.empty())
            r.args.insert(r.args.end(), {"--kv-events-endpoint", shift_endpoint_port(o.kv_events_endpoint, i)});
        if (!o.kv_events_replay_endpoint.empty())
            r.args.insert(r.args.end(),
                          {"--kv-events-replay-endpoint", shift_endpoint_port(o.kv_events_replay_endpoint, i)});
        urls.push_back("http://127.0.0.1:" + std::to_string(r.port));
    }
    const std::string where =
        !cuda ? str_cat("CPU, ", cpu_threads, " threads a rank")
        : gpus >= o.size * group
            ? (group > 1 ? str_cat(group, " GPUs each") : std::string("one GPU each"))
            : str_cat("sharing a GPU, ", o.engine.gpu_memory_utilization / o.size, " of its memory each");
    std::fprintf(stderr, "data parallel: %d replicas%s (%s)\n", o.size,
                 group > 1 ? str_cat(" of ", group, " ranks").c_str() : "", where.c_str());
    std::mutex mu;  // replicas' pids
    // Replicas sharing one GPU start one after another: each sizes its KV cache from what it
    // took itself, which a neighbour allocating at the same moment would blur.
    const bool one_by_one = cuda && gpus < o.size;
    for (size_t i = 0; i < replicas.size(); ++i) {
        replicas[i].pid = spawn(replicas[i].args, static_cast<int>(i));
        if (!one_by_one) continue;
        int status = 0;
        while (!router::RouterService::health_ok(urls[i], 1.0)) {
            if (::waitpid(replicas[i].pid, &status, WNOHANG) == replicas[i].pid) {
                std::fprintf(stderr, "error: replica %zu %s while starting\n", i, exit_status_text(status).c_str());
                for (size_t k = 0; k < i; ++k) ::kill(replicas[k].pid, SIGTERM);
                for (size_t k = 0; k < i; ++k) ::waitpid(replicas[k].pid, &status, 0);
                return 1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    }

    router::RouterOptions ro;
    ro.backends = urls;
    ro.policy = "cache-aware";
    ro.api_keys = o.api_keys;
    ro.health_interval_s = 0.5;
    ro.model_name = o.model_name;
    auto service = std::make_shared<router::RouterService>(ro);
    service->start();

    // A replica that dies is started again (its port stays, so the router readmits it).
    std::atomic<bool> stopping{false}, ready{false};
    std::thread supervisor([&] {
        while (!stopping) {
            for (size_t i = 0; i < replicas.size(); ++i) {
                std::lock_guard lock(mu);
                Replica& r = replicas[i];
                int status = 0;
                if (r.pid > 0 && ::waitpid(r.pid, &status, WNOHANG) == r.pid) {
                    if (stopping) break;
                    std::fprintf(stderr, "replica %zu (pid %d) %s; %s\n", i, static_cast<int>(r.pid),
                                 exit_status_text(status).c_str(), ready ? "starting it again" : "stopping");
                    if (!ready) {  // a replica that cannot start will not start the second time either
                        r.pid = -1;
                        ::kill(::getpid(), SIGTERM);
                        return;
                    }
                    ++r.restarts;
                    try {
                        r.pid = spawn(r.args, static_cast<int>(i));
                    } catch (const Error& e) {  // no process to start: the router keeps it ejected
                        std::fprintf(stderr, "replica %zu: %s\n", i, e.what());
                        r.pid = -1;
                    }
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });

    int code = 0;
    std::unique_ptr<server::HttpServer> http;
    // Ready once every replica answers /health (or a signal came first).
    for (;;) {
        if (service->healthy_replicas() == o.size) break;
        timespec ts{0, 100'000'000};
        if (sigtimedwait(&signals, nullptr, &ts) > 0) {
            code = 1;
            break;
        }
    }
    if (code == 0) {
        ready = true;
        http = start_router_front(service, o.front);
        std::fprintf(stderr, "ready: serving '%s' at %s/v1 (data parallel %d)\n", o.model_name.c_str(),
                     base_url(o.front.tls, o.front.host, http->port()).c_str(), o.size);
        std::fflush(stderr);
        wait_and_drain(signals, *service, o.shutdown_timeout_s);
        std::fprintf(stderr, "shutting down\n");
        http->stop();
    } else {
        std::fprintf(stderr, "stopping before every replica was ready\n");
    }
    stopping = true;
    supervisor.join();
    service->stop();
    for (Replica& r : replicas)
        if (r.pid > 0) ::kill(r.pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (Replica& r : replicas) {
        while (r.pid > 0) {
            int status = 0;
            if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
                r.pid = -1;
            } else if (std::chrono::steady_clock::now() > deadline) {
                ::kill(r.pid, SIGKILL);
                ::waitpid(r.pid, &status, 0);
                r.pid = -1;
            } else {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
    }
    return code;
}

}  // namespace peregrine::cli
