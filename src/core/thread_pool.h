// A fixed pool of worker threads shared by every CPU op. The calling thread takes part as
// worker 0, so a pool of N threads starts N-1 OS threads. Not reentrant: one job at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace peregrine {

class ThreadPool {
  public:
    // num_threads <= 0 means one per online core.
    explicit ThreadPool(int num_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return num_threads_; }

    // Calls fn(thread_index, num_threads) once on every thread and returns when all are done.
    void run(const std::function<void(int, int)>& fn);

    // Work (in rough multiply-adds) below which a job runs on the calling thread alone: waking
    // another thread costs microseconds, far more when the cores are oversubscribed.
    static constexpr int64_t kMinParallelWork = 1 << 15;

    // Splits [0, n) into one contiguous range per thread; fn(begin, end) per non-empty range.
    // Ranges start at multiples of `align` so that threads do not split a tile. `work` is the
    // job's total cost; small jobs run inline.
    template <typename F>
    void parallel_for(int64_t n, F&& fn, int64_t align = 1, int64_t work = INT64_MAX) {
        if (n <= 0) return;
        const int64_t units = (n + align - 1) / align;
        if (num_threads_ == 1 || units == 1 || work < kMinParallelWork) {
            fn(int64_t{0}, n);
            return;
        }
        run([&](int t, int nt) {
            const int64_t per = (units + nt - 1) / nt;
            const int64_t begin = std::min(n, t * per * align);
            const int64_t end = std::min(n, (t + 1) * per * align);
            if (begin < end) fn(begin, end);
        });
    }

    // Like parallel_for, but [0, n) is cut into about `pieces_per_thread` pieces per thread
    // (multiples of `align`) that threads take in turn from a shared counter: a thread slowed
    // by the machine (or by its share of memory bandwidth) takes fewer pieces instead of
    // holding the others up. Which thread runs a piece must not matter to fn.
    template <typename F>
    void parallel_for_dynamic(int64_t n, F&& fn, int64_t align = 1, int64_t work = INT64_MAX,
                              int pieces_per_thread = 8) {
        if (n <= 0) return;
        const int64_t units = (n + align - 1) / align;
        if (num_threads_ == 1 || units == 1 || work < kMinParallelWork) {
            fn(int64_t{0}, n);
            return;
        }
        const int64_t pieces = std::min<int64_t>(units, int64_t{num_threads_} * pieces_per_thread);
        const int64_t per = (units + pieces - 1) / pieces * align;
        std::atomic<int64_t> next{0};
        run([&](int, int) {
            for (int64_t begin; (begin = next.fetch_add(per, std::memory_order_relaxed)) < n;)
                fn(begin, std::min(n, begin + per));
        });
    }

  private:
    void worker(int index);

    int num_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace peregrine
