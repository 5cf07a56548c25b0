#include "meshlearn/ledger/shared_chain.h"

#include <chrono>

namespace meshlearn::ledger {

void SharedChain::PublishHeight(uint64_t height) {
  {
    std::lock_guard<std::mutex> lock(wait_mu_);
    height_.store(height);
  }
  cv_.notify_all();
}

uint64_t SharedChain::WaitAbove(uint64_t after, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(wait_mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
               [&] { return height_.load() > after || shutdown_.load(); });
  return height_.load();
}

void SharedChain::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(wait_mu_);
    shutdown_.store(true);
  }
  cv_.notify_all();
}

}  // namespace meshlearn::ledger
