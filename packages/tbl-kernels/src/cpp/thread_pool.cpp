#include "thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "errors.hpp"

namespace tbl {
namespace {

int default_threads() {
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

// Everything a live pool owns. After fork() the child has none of the parent's
// threads and possibly a locked mutex, so the child abandons this object (leaks
// it on purpose) and starts a fresh one on its next call.
struct Pool {
    explicit Pool(int n_threads) : size(n_threads) {
        for (int i = 1; i < size; ++i) workers.emplace_back([this] { worker_loop(); });
    }
    ~Pool() {
        {
            std::lock_guard<std::mutex> lock(mu);
            stop = true;
        }
        cv_work.notify_all();
        for (auto& t : workers) t.join();
    }

    void run_chunks() {
        for (;;) {
            int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
            if (begin >= n) return;
            (*job)(begin, std::min(n, begin + grain));
        }
    }

    void worker_loop() {
        uint64_t seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(mu);
                cv_work.wait(lock, [&] { return stop || generation != seen; });
                if (stop) return;
                seen = generation;
            }
            run_chunks();
            {
                std::lock_guard<std::mutex> lock(mu);
                if (--active == 0) cv_done.notify_one();
            }
        }
    }

    void run(int64_t n_items, int64_t grain_items, const std::function<void(int64_t, int64_t)>& fn) {
        {
            std::lock_guard<std::mutex> lock(mu);
            job = &fn;
            n = n_items;
            grain = grain_items;
            next.store(0, std::memory_order_relaxed);
            active = static_cast<int>(workers.size());
            ++generation;
        }
        cv_work.notify_all();
        run_chunks();
        std::unique_lock<std::mutex> lock(mu);
        cv_done.wait(lock, [&] { return active == 0; });
        job = nullptr;
    }

    const int size;
    std::vector<std::thread> workers;
    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    uint64_t generation = 0;
    bool stop = false;
    int active = 0;
    const std::function<void(int64_t, int64_t)>* job = nullptr;
    int64_t n = 0, grain = 1;
    std::atomic<int64_t> next{0};
};

struct PoolHolder {
    std::mutex dispatch_mu;  // one kernel call at a time owns the pool
    std::unique_ptr<Pool> pool;
    std::atomic<int> requested{default_threads()};  // read without the lock by get_num_threads
};

PoolHolder* holder = new PoolHolder();  // replaced (old one leaked) in a forked child
std::once_flag atfork_once;

void on_fork_child() { holder = new PoolHolder(); }

}  // namespace

void set_num_threads(int n) {
    if (n < 1) throw ValueError("set_num_threads needs n >= 1, got " + std::to_string(n));
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
    std::lock_guard<std::mutex> lock(holder->dispatch_mu);
    if (n != holder->requested) {
        holder->pool.reset();  // joins the old workers
        holder->requested = n;
    }
}

int get_num_threads() { return holder->requested.load(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
    std::lock_guard<std::mutex> lock(holder->dispatch_mu);
    if (holder->requested <= 1 || n <= grain) {
        for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
        return;
    }
    if (!holder->pool) holder->pool = std::make_unique<Pool>(holder->requested);
    holder->pool->run(n, grain, fn);
}

}  // namespace tbl
