#include "core/thread_pool.h"

#include "core/error.h"

namespace peregrine {

namespace {
// Spins this many polls (tens of microseconds) before sleeping on the futex: a decode step
// issues hundreds of small jobs back to back, and waking a sleeping thread costs several
// microseconds; but when the cores are oversubscribed, spinning longer only steals time from
// the thread being waited for.
constexpr int kSpinPolls = 2000;

inline void cpu_relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
    if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    num_threads_ = num_threads;
    for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    if (num_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(num_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(0, num_threads_);
    int left = pending_.load(std::memory_order_acquire);
    for (int spin = 0; left != 0 && spin < kSpinPolls; ++spin) {
        cpu_relax();
        left = pending_.load(std::memory_order_acquire);
    }
    while (left != 0) {
        pending_.wait(left, std::memory_order_acquire);
        left = pending_.load(std::memory_order_acquire);
    }
    job_ = nullptr;
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = generation_.load(std::memory_order_acquire);
        for (int spin = 0; gen == seen && spin < kSpinPolls; ++spin) {
            cpu_relax();
            gen = generation_.load(std::memory_order_acquire);
        }
        if (gen == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            continue;
        }
        seen = gen;
        if (stop_.load()) return;
        (*job_)(index, num_threads_);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

}  // namespace peregrine
