#include "meshlearn/ledger/rate_limit.h"

#include <algorithm>

namespace meshlearn::ledger {

RateLimiter::RateLimiter(RateLimitOptions options) : options_(options) {
  if (options_.burst < 1) options_.burst = 1;
  if (options_.max_clients < 1) options_.max_clients = 1;
}

bool RateLimiter::Allow(const std::string& client, int64_t now_micros) {
  if (options_.rate_per_second <= 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buckets_.find(client);
  if (it == buckets_.end()) {
    if (buckets_.size() >= options_.max_clients) Evict(now_micros);
    it = buckets_.emplace(client, Bucket{options_.burst, now_micros}).first;
  }
  Bucket& b = it->second;
  // Monotonic time never goes back, but a caller mixing clocks must not mint tokens.
  int64_t elapsed = std::max<int64_t>(0, now_micros - b.last_micros);
  // Multiply before dividing: 100 ms at 10/s must give exactly one token.
  b.tokens = std::min(options_.burst,
                      b.tokens + static_cast<double>(elapsed) * options_.rate_per_second / 1e6);
  b.last_micros = std::max(b.last_micros, now_micros);
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

void RateLimiter::Evict(int64_t now_micros) {
  // A bucket that would be full by now belongs to an idle client: forgetting it loses nothing.
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    double refilled = it->second.tokens +
                      static_cast<double>(std::max<int64_t>(0, now_micros - it->second.last_micros)) *
                          options_.rate_per_second / 1e6;
    it = refilled >= options_.burst ? buckets_.erase(it) : std::next(it);
  }
  if (buckets_.size() < options_.max_clients) return;
  auto oldest = std::min_element(buckets_.begin(), buckets_.end(), [](const auto& a, const auto& b) {
    return a.second.last_micros < b.second.last_micros;
  });
  buckets_.erase(oldest);
}

}  // namespace meshlearn::ledger
