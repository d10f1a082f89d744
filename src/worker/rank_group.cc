#include "worker/rank_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/backend.h"
#ifdef PG_WITH_CUDA
#include "backend/cuda/peer_communicator.h"
#endif
#include "core/error.h"
#include "core/exit_status.h"
#include "dist/control_channel.h"
#include "dist/launch_env.h"
#include "dist/nccl_communicator.h"
#include "dist/shm_communicator.h"
#include "dist/socket_io.h"
#include "dist/tcp_store.h"
#include "worker/worker.h"

namespace peregrine {

namespace {

// Loading a 70B model can take minutes on a slow disk: rendezvous waits that span a load are
// long, and a rank that dies meanwhile is noticed through its closed connection instead.
constexpr std::chrono::minutes kGroupTimeout{30};
// A rank that stops answering inside a collective (alive but stuck) for this long breaks the group.
constexpr double kCollectiveTimeoutS = 300;

std::string host_name() {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    return name;
}

// Distinguishes two machines (or VMs) that share a host name; containers of one machine share
// it, and their host names differ.
std::string boot_id() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    return id;
}

// What every rank must agree on to run one model together.
std::string fingerprint(const EngineConfig& c) {
    return str_cat("model=", c.model, " load_format=", c.load_format, " dummy_seed=", c.dummy_seed,
                   " device=", c.device, " dtype=", c.dtype, " block_size=", c.block_size,
                   " kv_cache_memory=", c.kv_cache_memory, " kv_cache_dtype=", c.kv_cache_dtype,
                   " max_num_seqs=", c.max_num_seqs, " max_num_batched_tokens=", c.max_num_batched_tokens,
                   " tp=", c.tensor_parallel_size, " pp=", c.pipeline_parallel_size, " enforce_eager=", c.enforce_eager,
                   " batch_invariant=", c.batch_invariant, " quantization=", c.quantization,
                   " fp8_lm_head=", c.fp8_lm_head, " disable_custom_all_reduce=", c.disable_custom_all_reduce);
}

}  // namespace

std::unique_ptr<RankGroup> RankGroup::join(const EngineConfig& config) {
    config.validate();
    PG_CHECK(config.parallel_size() > 1, "RankGroup::join: a group of one");
    LaunchFlags flags;
    if (config.nnodes > 0) flags.nnodes = config.nnodes;
    if (config.node_rank >= 0) flags.node_rank = config.node_rank;
    if (!config.master_addr.empty()) flags.master_addr = config.master_addr;
    if (config.master_port > 0) flags.master_port = config.master_port;
    const LaunchEnv launch = resolve_launch_env(flags, current_environment());

    std::unique_ptr<RankGroup> g(new RankGroup());
    g->config_ = config;
    g->tp_size_ = config.tensor_parallel_size;
    g->pp_size_ = config.pipeline_parallel_size;
    g->launched_ = launch.world_size;
    const int world = g->size();
    if (world % launch.world_size != 0)
        fail("tensor-parallel size ", g->tp_size_, " x pipeline-parallel size ", g->pp_size_, " = ", world,
             " ranks do not divide among ", launch.world_size, " hosts (", launch.source, ")");
    const int per_host = world / launch.world_size;
    if (config.threads <= 0)
        g->config_.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / per_host);
    // Every rank of this host pins --kv-offload-memory for its slice of the host tier.
    if (config.kv_offload_memory > 0) {
        const int64_t physical = host_memory_bytes();
        if (physical > 0 && config.kv_offload_memory > physical / per_host)
            fail("--kv-offload-memory ", config.kv_offload_memory, " bytes x ", per_host,
                 " ranks on this host is more than its memory (", physical,
                 " bytes): each rank pins that much for its slice of the host tier");
    }

    // A group within this one launched process needs no known port: an ephemeral one, so that
    // groups started side by side on one host do not collide (unless a port was asked for).
    LaunchEnv where = launch;
    if (launch.world_size == 1 && config.master_port == 0 && !std::getenv("PEREGRINE_MASTER_PORT"))
        where.master_port = pick_free_port("rendezvous store");

    // This host's other ranks, before any thread exists in this process.
    int local = 0;
    const pid_t parent = ::getpid();
    std::fflush(nullptr);
    for (int i = 1; i < per_host; ++i) {
        const pid_t pid = ::fork();
        if (pid < 0) fail("could not start rank ", launch.rank * per_host + i, ": fork: ", std::strerror(errno));
        if (pid == 0) {
            // Dies with the process that forked it (signals: see serve_rank).
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(1);
            local = i;
            g->children_.clear();
            g->child_ranks_.clear();
            break;
        }
        g->children_.push_back(pid);
        g->child_ranks_.push_back(launch.rank * per_host + i);
    }
    g->rank_ = launch.rank * per_host + local;
    // Only now: asking whether a GPU is there initializes CUDA, and a process forked after that
    // cannot use it ("initialization error" in the child).
    g->cuda_ = worker_uses_cuda(config);
    // GPUs of a host in launch order: several launched processes on one host (mpirun -np N on a
    // single machine) take consecutive blocks of per_host GPUs.
    // `--device cuda:K` moves the block to start at GPU K (a data-parallel replica's group).
    g->device_index_ = std::max(0, cuda_device_index(config.device)) + launch.local_rank * per_host + local;

    TcpStore::Options so;
    so.master_addr = where.master_addr;
    so.master_port = where.master_port;
    so.rank = g->rank_;
    so.world_size = world;
    so.timeout = kGroupTimeout;
    g->store_ = std::make_unique<TcpStore>(so);
    g->store_->check_fingerprint(fingerprint(config));

    // Where every rank runs: names ranks in messages; the CPU communicator needs one host.
    const std::string here = host_name() + "\n" + boot_id();
    g->store_->set(str_cat("where/", g->rank_), str_cat(::getpid(), "\n", here));
    for (int r = 0; r < world; ++r) {
        const std::string w = g->store_->get(str_cat("where/", r));
        const size_t nl = w.find('\n');
        const std::string host = w.substr(nl + 1);
        g->where_.push_back(str_cat("pid ", w.substr(0, nl), " on ", host.substr(0, host.find('\n'))));
        if (r == 0 || host != here) ++g->hosts_;
        if (host != here && !g->cuda_)
            fail("rank ", r, " runs on another host (", g->where_.back(), ") than rank ", g->rank_,
                 ": the CPU backend's communicator is one host's shared memory");
    }

    // CUDA: the NCCL groups join once the backend exists (connect). CPU: one name for this
    // group's shared-memory segments, chosen by rank 0.
    if (g->cuda_) {
        g->open_control(launch.master_addr);
        return g;
    }
    if (g->rank_ == 0)
        g->store_->set("shm/name",
                       str_cat("pg-", ::getpid(), "-", std::chrono::steady_clock::now().time_since_epoch().count()));
    const std::string shm = g->store_->get("shm/name");
    const TensorParallel tp = g->tp();
    if (g->tp_size_ > 1) {
        auto c = ShmCommunicator::create(str_cat(shm, "-tp", g->stage()), tp.rank, tp.size, 600);
        c->set_timeout(kCollectiveTimeoutS);
        g->tp_comm_ = std::move(c);
    }
    if (g->pp_size_ > 1) {
        auto c = ShmCommunicator::create(str_cat(shm, "-pp", tp.rank), g->stage(), g->pp_size_, 600);
        c->set_timeout(kCollectiveTimeoutS);
        g->pp_comm_ = std::move(c);
    }

    g->open_control(launch.master_addr);
    return g;
}

void RankGroup::open_control(const std::string& master_addr) {
    if (rank_ == 0)
        leader_ = std::make_unique<ControlLeader>(*store_, kGroupTimeout);
    else
        follower_ = std::make_unique<ControlFollower>(*store_, master_addr, kGroupTimeout);
}

ModelParallel RankGroup::connect(Backend& backend) {
    if (!cuda_ || tp_comm_ || pp_comm_) return comms();
    PG_CHECK(backend.native_stream(), "RankGroup::connect: a CUDA group needs the CUDA backend");
    // NCCL groups: one per stage for tensor parallelism, one per tensor-parallel column for the
    // pipeline; each group's first rank draws its id. Every rank joins its stage's group first,
    // so no rank waits in a column's join while another waits in a stage's.
    const TensorParallel t = tp();
    auto join_nccl = [&](const std::string& key, int rank, int size) {
        if (rank == 0) store_->set(key, NcclCommunicator::new_id().bytes());
        const NcclId id = NcclId::from_bytes(store_->get(key));
        return NcclCommunicator::create(id, rank, size, backend.device_index(), backend.native_stream());
    };
    if (tp_size_ > 1) tp_comm_ = join_nccl(str_cat("nccl/tp", stage()), t.rank, t.size);
    if (pp_size_ > 1) pp_comm_ = join_nccl(str_cat("nccl/pp", t.rank), stage(), pp_size_);
        // Small collectives over peer memory where every rank is on this host (hosts_ is 1 on every
        // rank alike, so all ranks make the exchange or none does).
#ifdef PG_WITH_CUDA
    if (tp_comm_ && hosts_ == 1 && !config_.disable_custom_all_reduce) {
        const std::string base = str_cat("peer/tp", stage(), "/");
        backend.make_current();
        tp_comm_ = PeerCommunicator::wrap(std::move(tp_comm_), backend.device_index(), backend.native_stream(),
                                          [&](const std::string& round, const std::string& mine) {
                                              store_->set(str_cat(base, round, "/", t.rank), mine);
                                              std::vector<std::string> all;
                                              for (int r = 0; r < t.size; ++r)
                                                  all.push_back(store_->get(str_cat(base, round, "/", r)));
                                              return all;
                                          });
        if (rank_ == 0 && dynamic_cast<PeerCommunicator*>(tp_comm_.get()))
            std::fprintf(stderr,
                         "  tensor parallel: f32 collectives up to %zu KiB through peer memory, larger through NCCL\n",
                         cuda::PeerCollectives::kSlotBytes >> 10);
    }
#endif
    return comms();
}

RankGroup::~RankGroup() {
    stop_watching();
}

std::string RankGroup::describe() const {
    return str_cat("tensor parallel ", tp_size_, " x pipeline parallel ", pp_size_, ": ", size(), " ranks, ", launched_,
                   " launched process", launched_ == 1 ? "" : "es", " on ", hosts_, " host", hosts_ == 1 ? "" : "s",
                   cuda_ ? str_cat(" (NCCL, GPU ", device_index_, " for rank 0)")
                         : str_cat(" (shared-memory collectives, ", config_.threads, " threads each)"));
}

std::string RankGroup::who(int rank) const {
    return rank >= 0 && rank < static_cast<int>(where_.size()) ? str_cat("rank ", rank, " (", where_[rank], ")")
                                                               : str_cat("rank ", rank);
}

int RankGroup::agree_min(const std::string& key, int value) {
    return static_cast<int>(agree(str_cat("min/", key), value, [](int64_t a, int64_t b) { return std::min(a, b); }));
}

int64_t RankGroup::agree_sum(const std::string& key, int64_t value) {
    return agree(str_cat("sum/", key), value, [](int64_t a, int64_t b) { return a + b; });
}

int64_t RankGroup::agree(const std::string& key, int64_t value, int64_t (*op)(int64_t, int64_t)) {
    store_->set(str_cat(key, "/", rank_), std::to_string(value));
    if (rank_ == 0) {
        int64_t m = value;
        for (int r = 1; r < size(); ++r) m = op(m, std::stoll(store_->get(str_cat(key, "/", r))));
        store_->set(key, std::to_string(m));
    }
    return std::stoll(store_->get(key));
}

void RankGroup::send_step(const std::string& message) {
    PG_CHECK(leader_, "send_step: rank 0 only");
    leader_->send(message);
}

bool RankGroup::recv_step(std::string& message) {
    PG_CHECK(follower_, "recv_step: ranks other than 0");
    return follower_->recv(message);
}

std::string RankGroup::reaped_child() {
    for (size_t i = 0; i < children_.size(); ++i) {
        int status = 0;
        if (children_[i] > 0 && ::waitpid(children_[i], &status, WNOHANG) == children_[i]) {
            children_[i] = -1;
            return str_cat(who(child_ranks_[i]), " ", exit_status_text(status));
        }
    }
    return "";
}

std::string RankGroup::failure() {
    std::string failed = reaped_child();
    if (!failed.empty()) return failed;
    failed = store_->failure();
    if (failed.empty() && leader_) {
        const int r = leader_->closed_rank();
        if (r >= 0) failed = str_cat(who(r), " closed its connection to rank 0 (it exited or crashed)");
    }
    if (failed.empty()) return "";
    // A dead process's sockets close before the kernel makes it reapable, so a socket can report
    // the loss first. When the rank is a child of this process, its exit status (signal, code)
    // says more: give it up to 500 ms to appear.
    for (int i = 0; i < 20; ++i) {
        const std::string reaped = reaped_child();
        if (!reaped.empty()) return reaped;
        if (std::none_of(children_.begin(), children_.end(), [](pid_t p) { return p > 0; })) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return failed;
}

void RankGroup::watch(std::function<void(const std::string&)> on_failure) {
    PG_CHECK(leader_ && !watching_, "watch: rank 0, once");
    if (!on_failure) on_failure = [](const std::string& m) { exit_group(m); };
    watching_ = true;
    watcher_ = std::thread([this, on_failure] {
        while (watching_) {
            const std::string failed = failure();
            if (!failed.empty()) {
                on_failure(failed);
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    });
}

void RankGroup::stop_watching() {
    watching_ = false;
    if (watcher_.joinable()) watcher_.join();
}

std::string RankGroup::diagnose(const std::string& error) {
    stop_watching();
    for (int i = 0; i < 20; ++i) {
        const std::string failed = failure();
        if (!failed.empty()) return failed;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return error;
}

void RankGroup::exit_group(const std::string& message) {
    std::fprintf(stderr, "peregrine: %s; stopping the group\n", message.c_str());
    std::fflush(stderr);
    ::_exit(1);  // this host's forked ranks die with this process (PR_SET_PDEATHSIG)
}

void RankGroup::reap_children(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (pid_t& pid : children_) {
        while (pid > 0) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
            } else if (std::chrono::steady_clock::now() >= deadline) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, &status, 0);
                pid = -1;
            } else {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        }
    }
}

}  // namespace peregrine
