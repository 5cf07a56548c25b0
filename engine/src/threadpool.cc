#include "meshlearn/engine/threadpool.h"

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
      next_chunk_ = 0;
      done_chunks_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    t_in_parallel = true;
    RunChunks();
    t_in_parallel = false;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_chunks_ == job_chunks_ && active_ == 0; });
    job_fn_ = nullptr;
  }

 private:
  void EnsureWorkers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }

  // Claims and runs chunks of the current job until none are left.
  void RunChunks() {
    for (;;) {
      int64_t i;
      ParallelFn fn;
      void* ctx;
      int64_t n, chunks;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (job_fn_ == nullptr || next_chunk_ >= job_chunks_) return;
        i = next_chunk_++;
        fn = job_fn_;
        ctx = job_ctx_;
        n = job_n_;
        chunks = job_chunks_;
      }
      fn(ctx, n * i / chunks, n * (i + 1) / chunks);
      bool all_done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        all_done = ++done_chunks_ == job_chunks_;
      }
      if (all_done) done_cv_.notify_all();
    }
  }

  void WorkerLoop() {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        ++active_;
      }
      internal::SetCanonicalFpEnv();  // workers only ever run kernel chunks
      RunChunks();
      {
        std::lock_guard<std::mutex> lock(mu_);
        --active_;
      }
      done_cv_.notify_all();
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  ParallelFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t done_chunks_ = 0;
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
