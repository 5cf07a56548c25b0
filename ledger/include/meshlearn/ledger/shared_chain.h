// SharedChain: one Chain shared by the threads of a ledger service (the HTTP server's pool, the
// sequencer's block loop, the follower's sync loop).
//
// Chain is not thread-safe; every use goes through With(), which holds one mutex. The height
// is also published in an atomic so long-polls ("wait for a block above h") wait on a
// condition variable without touching the Chain.
//
//   SharedChain shared(chain.get());
//   uint64_t h = shared.With([](Chain& c) { return c.Height(); });
//   shared.WaitAbove(h, /*timeout_ms=*/20000);   // returns early when a block commits
//
// Whoever commits a block through With() must call PublishHeight afterwards.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "meshlearn/ledger/chain.h"

namespace meshlearn::ledger {

class SharedChain {
 public:
  // `chain` must outlive this object.
  explicit SharedChain(Chain* chain) : chain_(chain), height_(chain->Height()) {}

  template <typename F>
  decltype(auto) With(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(*chain_);
  }

  // The last published height; no lock.
  uint64_t height() const { return height_.load(); }

  // Publishes a newly committed height and wakes every waiter.
  void PublishHeight(uint64_t height);

  // Waits until height() > after, `timeout_ms` passes, or Shutdown(). Returns height().
  uint64_t WaitAbove(uint64_t after, int64_t timeout_ms);

  // Wakes all waiters now and makes later waits return at once.
  void Shutdown();
  bool shutting_down() const { return shutdown_.load(); }

 private:
  Chain* chain_;
  std::mutex mu_;
  std::mutex wait_mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> height_;
  std::atomic<bool> shutdown_{false};
};

}  // namespace meshlearn::ledger
