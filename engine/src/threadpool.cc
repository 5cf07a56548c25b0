#include "meshlearn/engine/threadpool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels_internal.h"
#include "meshlearn/base/check.h"

namespace meshlearn::engine {
namespace {

// True on pool workers and on a caller while it runs a job: a nested ParallelFor runs inline.
thread_local bool t_in_parallel = false;

// How long a worker keeps polling for the next job, and the caller for the end of its job, before
// sleeping on a condition variable. A training step runs many parallel regions a few microseconds
// apart; a futex sleep and wake-up between each (tens of microseconds on a VM) made a second thread
// no faster than one on the Fashion MLP. Polling stops after this long, so an idle pool sleeps.
constexpr std::chrono::microseconds kSpin{200};
// For the first kSpinAlone of it a thread only polls; after that it yields its CPU between polls
// (sched_yield returns at once when nothing else is runnable there). On a machine with more
// runnable threads than CPUs, a worker polling through the caller's serial part of a step (the
// loss, the batch, a small GEMM) took CPU time from the caller, and the caller polling at a join
// took it from a worker that had been preempted in the middle of its chunk.
constexpr std::chrono::microseconds kSpinAlone{20};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls pred() for up to kSpin; returns its last value.
template <typename Pred>
bool SpinUntil(const Pred& pred) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (pred()) return true;
    CpuRelax();
    if (i % 64 == 0) {
      const auto spent = std::chrono::steady_clock::now() - t0;
      if (spent > kSpin) return pred();
      if (spent > kSpinAlone) sched_yield();
    }
  }
}

class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // Each thread takes mu_ twice per region when it runs one chunk: the caller to publish the job
  // and claim chunk 0, a worker to wake and claim a chunk, and each to finish its chunk and claim
  // the next (or, a worker, leave the job) in one critical section. A region is a few
  // microseconds of work in a training step, and every lock moves mu_'s cache line between the
  // cores; five locks a thread was the old count.
  void Run(int64_t n, int threads, ParallelFn fn, void* ctx) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // concurrent callers take turns
    EnsureWorkers(threads - 1);
    const int64_t chunks = n < threads ? n : threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_fn_ = fn;
      job_ctx_ = ctx;
      job_n_ = n;
      job_chunks_ = chunks;
      next_chunk_ = 1;  // chunk 0 is the caller's
      done_chunks_ = 0;
      ++generation_;
    }
    if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
    t_in_parallel = true;
    RunChunks(0, /*worker=*/false);
    t_in_parallel = false;
    // Every chunk done and no worker inside the job: a worker that wakes later finds no chunk to
    // claim, and the next Run may replace the job.
    if (SpinUntil([&] {
          return done_chunks_.load(std::memory_order_acquire) == chunks &&
                 active_.load(std::memory_order_acquire) == 0;
        })) {
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_ = true;
    done_cv_.wait(lock, [&] { return done_chunks_ == job_chunks_ && active_ == 0; });
    caller_sleeping_ = false;
  }

 private:
  void EnsureWorkers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }

  // Runs chunk i of the current job, which this thread has claimed, then claims and runs chunks
  // until none are left; a worker leaves the job (active_) when it finds none. The job's fields
  // do not change while a chunk is unfinished or a worker is active, so they are read unlocked
  // after the claim.
  void RunChunks(int64_t i, bool worker) {
    const ParallelFn fn = job_fn_;
    void* const ctx = job_ctx_;
    const int64_t n = job_n_, chunks = job_chunks_;
    while (i >= 0) {
      fn(ctx, n * i / chunks, n * (i + 1) / chunks);
      bool notify;
      {
        std::lock_guard<std::mutex> lock(mu_);
        notify = ++done_chunks_ == job_chunks_ && caller_sleeping_;
        i = next_chunk_ < job_chunks_ ? next_chunk_++ : -1;
        if (i < 0 && worker) {
          --active_;
          notify = caller_sleeping_;
        }
      }
      if (notify) done_cv_.notify_all();
    }
  }

  void WorkerLoop() {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
      int64_t i = -1;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        --sleepers_;
        if (stop_) return;
        seen = generation_;
        if (next_chunk_ < job_chunks_) {  // else the caller (or another worker) ran them all
          i = next_chunk_++;
          ++active_;
        }
      }
      if (i < 0) continue;
      internal::SetCanonicalFpEnv();  // workers only ever run kernel chunks
      RunChunks(i, /*worker=*/true);
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  // Written under mu_; atomic so that spinning threads may read them without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};
  std::atomic<int> sleepers_{0};  // workers waiting on cv_
  bool caller_sleeping_ = false;  // the caller waits on done_cv_
  ParallelFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunks_ = 0;
  int64_t next_chunk_ = 0;
  std::atomic<int64_t> done_chunks_{0};
};

ThreadPool& Pool() {
  static ThreadPool* pool = new ThreadPool();  // never destroyed: workers may outlive statics
  return *pool;
}

struct Scratch {
  float* data = nullptr;
  int64_t size = 0;
  ~Scratch() { std::free(data); }
};

}  // namespace

void ParallelForRaw(int64_t n, int threads, ParallelFn fn, void* ctx) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1 || t_in_parallel) {
    fn(ctx, 0, n);
    return;
  }
  Pool().Run(n, threads, fn, ctx);
}

float* ScratchBuffer(int slot, int64_t n) {
  thread_local Scratch scratch[8];
  CHECK(slot >= 0 && slot < 8) << "slot=" << slot;
  Scratch& s = scratch[slot];
  if (n < 16) n = 16;
  if (s.size < n) {
    std::free(s.data);
    int64_t bytes = ((n * 4 + 63) / 64) * 64;
    s.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    CHECK(s.data != nullptr) << "out of memory allocating " << bytes << " bytes";
    s.size = n;
  }
  return s.data;
}

}  // namespace meshlearn::engine
