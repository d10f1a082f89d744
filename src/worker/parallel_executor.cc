#include "worker/parallel_executor.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "core/error.h"
#include "worker/local_executor.h"
#include "worker/step_message.h"

namespace peregrine {

namespace {

// Seconds a rank other than 0 keeps serving after SIGINT / SIGTERM (serve drains for up to 30 s
// by default, then stops the group).
constexpr int kSignalGraceS = 40;

// The group join_model_group joined on rank 0, until create_executor takes it.
std::unique_ptr<RankGroup>& joined_group() {
    static std::unique_ptr<RankGroup> group;
    return group;
}

WorkerPlace place_of(RankGroup& g) {
    WorkerPlace p;
    p.connect = [&g](Backend& backend) { return g.connect(backend); };
    p.tp = g.tp();
    p.pp = {g.stage(), g.stages()};
    p.device_index = g.device_index();
    p.verbose = g.rank() == 0;
    return p;
}

// Every rank readies its worker the same way; the KV pool is the smallest any rank can hold.
// `block_bytes`: a KV block's bytes over every rank's slice.
std::unique_ptr<Worker> ready_worker(RankGroup& g, int64_t* block_bytes = nullptr) {
    auto w = std::make_unique<Worker>(g.config(), place_of(g));
    w->init_device();
    w->load_model();
    w->init_kv_cache(g.agree_min("kv-blocks", w->determine_kv_blocks()));
    // Each rank pins --kv-offload-memory for its own slice of every block; all keep as many
    // slots as the rank with the fewest, so a slot means the same block everywhere.
    if (g.config().kv_offload_memory > 0)
        w->init_host_kv_blocks(g.agree_min("host-kv-blocks", w->host_kv_blocks_for(g.config().kv_offload_memory)));
    const int64_t bytes = g.agree_sum("kv-block-bytes", static_cast<int64_t>(w->kv_block_bytes()));
    if (block_bytes) *block_bytes = bytes;
    w->warm_up();
    return w;
}

// SIGINT / SIGTERM reach every rank at once (Ctrl-C in a terminal, mpirun forwarding, a pod's
// termination): rank 0 drains and then stops the group, so another rank keeps serving it for a
// grace period and only then gives up.
void stop_later_on_signal(int rank) {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::thread([signals, rank] {
        int sig = 0;
        sigwait(&signals, &sig);
        std::fprintf(stderr, "rank %d: %s; waiting up to %d s for rank 0 to stop the group\n", rank, strsignal(sig),
                     kSignalGraceS);
        std::this_thread::sleep_for(std::chrono::seconds(kSignalGraceS));
        std::fprintf(stderr, "peregrine: rank %d: rank 0 did not stop the group; exiting\n", rank);
        std::fflush(nullptr);
        ::_exit(1);
    }).detach();
}

// Ranks other than 0: run what rank 0 sends until it says stop; then end the process.
[[noreturn]] void serve_rank(std::unique_ptr<RankGroup> g) {
    const int rank = g->rank();
    stop_later_on_signal(rank);
    try {
        std::unique_ptr<Worker> w = ready_worker(*g);
        std::string bytes;
        bool stopped = false;
        while (!stopped && g->recv_step(bytes)) {
            StepMessage m = decode_step(bytes);
            switch (m.op) {
                case StepMessage::kExecute:  // the logits stay where they are (rank 0 gets its own)
                    w->execute_on_device(m.batch);
                    break;
                case StepMessage::kCopyBlocks:
                    w->copy_blocks(m.copies);
                    break;
                case StepMessage::kOffload:
                    w->offload_blocks(m.copies);
                    break;
                case StepMessage::kOnload:
                    w->onload_blocks(m.copies);
                    break;
                case StepMessage::kStop:
                    stopped = true;
                    break;
            }
        }
        if (!stopped) fail("rank 0 closed the control channel without a stop (it exited or crashed)");
        w.reset();
        g->reap_children(10);
        g.reset();  // says goodbye to the store: rank 0 sees a clean exit
        std::fflush(nullptr);
        ::_exit(0);
    } catch (const std::exception& e) {
        // No goodbye: rank 0's store sees this rank drop and stops the group, naming it.
        std::fprintf(stderr, "peregrine: rank %d: %s\n", rank, e.what());
        std::fflush(nullptr);
        ::_exit(1);
    }
}

}  // namespace

void join_model_group(const EngineConfig& config) {
    if (joined_group()) return;
    std::unique_ptr<RankGroup> g = RankGroup::join(config);
    if (g->rank() != 0) serve_rank(std::move(g));
    joined_group() = std::move(g);
}

ParallelExecutor::ParallelExecutor(std::unique_ptr<RankGroup> group, std::unique_ptr<Worker> worker, size_t block_bytes)
    : group_(std::move(group)), worker_(std::move(worker)), block_bytes_(block_bytes) {}

std::unique_ptr<ParallelExecutor> ParallelExecutor::create(std::unique_ptr<RankGroup> group) {
    PG_CHECK(group && group->rank() == 0, "ParallelExecutor: rank 0 only");
    // A rank that dies while this one loads ends the group at once, not after the load.
    group->watch(nullptr);
    std::fprintf(stderr, "%s\n", group->describe().c_str());
    int64_t block_bytes = 0;
    std::unique_ptr<Worker> w = ready_worker(*group, &block_bytes);
    return std::unique_ptr<ParallelExecutor>(
        new ParallelExecutor(std::move(group), std::move(w), static_cast<size_t>(block_bytes)));
}

ParallelExecutor::~ParallelExecutor() {
    group_->stop_watching();  // the ranks' connections close from here on: that is no failure
    try {
        group_->send_step(encode_stop());
    } catch (const Error&) {
        // a rank already gone: nothing left to stop there
    }
    group_->reap_children(10);
}

int ParallelExecutor::vocab_size() const {
    return worker_->model_config().vocab_size;
}

int ParallelExecutor::max_model_len() const {
    return worker_->max_model_len();
}

int ParallelExecutor::num_kv_blocks() const {
    return worker_->num_kv_blocks();
}

int ParallelExecutor::block_size() const {
    return worker_->block_size();
}

int ParallelExecutor::num_host_kv_blocks() const {
    return worker_->num_host_kv_blocks();
}

size_t ParallelExecutor::kv_block_bytes() const {
    return block_bytes_;
}

std::string ParallelExecutor::kv_cache_dtype() const {  // every rank's (one EngineConfig)
    return std::string(dtype_name(worker_->kv_cache_dtype()));
}

// `message` to every other rank, then `mine` on rank 0's worker. A failed collective or a
// closed connection leaves the group unusable (the ranks no longer agree on which step they are
// in): the whole group stops.
void ParallelExecutor::in_step(const std::string& message, const std::function<void()>& mine) {
    try {
        group_->send_step(message);
        mine();
    } catch (const Error& e) {
        RankGroup::exit_group(group_->diagnose(e.what()));
    }
}

void ParallelExecutor::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (!pairs.empty()) in_step(encode_copy_blocks(pairs), [&] { worker_->copy_blocks(pairs); });
}

void ParallelExecutor::offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (!pairs.empty())
        in_step(encode_tier_copies(StepMessage::kOffload, pairs), [&] { worker_->offload_blocks(pairs); });
}

void ParallelExecutor::onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (!pairs.empty())
        in_step(encode_tier_copies(StepMessage::kOnload, pairs), [&] { worker_->onload_blocks(pairs); });
}

void ParallelExecutor::execute(const BatchInput& batch, std::vector<float>& logits) {
    in_step(encode_execute(batch), [&] { worker_->execute(batch, logits); });
}

bool ParallelExecutor::samples_on_device() const {
    return worker_->samples_on_device();
}

void ParallelExecutor::execute_on_device(const BatchInput& batch) {
    in_step(encode_execute(batch), [&] { worker_->execute_on_device(batch); });
}

void ParallelExecutor::launch_sampling(const std::vector<SampleRow>& rows) {
    worker_->launch_sampling(rows);
}

void ParallelExecutor::collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) {
    worker_->collect_samples(tokens, logprobs);
}

void ParallelExecutor::pool(const BatchInput& batch, std::vector<float>& out) {
    if (group_->stages() > 1) fail("embeddings are not served with pipeline parallelism");
    worker_->pool(batch, out);
}

BuiltExecutor create_executor(const EngineConfig& config) {
    BuiltExecutor b;
    if (config.parallel_size() <= 1) {
        auto local = LocalExecutor::create(config);
        b.worker = &local->worker();
        b.executor = std::move(local);
        return b;
    }
    join_model_group(config);
    auto parallel = ParallelExecutor::create(std::move(joined_group()));
    b.worker = &parallel->worker();
    b.executor = std::move(parallel);
    return b;
}

}  // namespace peregrine
