// Per-client request rate limiting for the RPC server: one token bucket per client address.
//
//   RateLimiter limiter({.rate_per_second = 200, .burst = 400});
//   if (!limiter.Allow(req.remote_addr, clock->MonotonicMicros())) return Http429();
//
// Time is passed in (monotonic microseconds), so tests drive it without sleeping. Thread-safe.
// The table of clients is bounded: when it is full, buckets that have refilled completely (idle
// clients) are dropped, and if none has, the oldest is.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace meshlearn::ledger {

struct RateLimitOptions {
  double rate_per_second = 200;  // sustained requests per second per client; <= 0 disables
  double burst = 400;            // bucket size: requests allowed at once after idling
  size_t max_clients = 10000;    // size of the table of buckets
};

class RateLimiter {
 public:
  explicit RateLimiter(RateLimitOptions options);

  // Takes one token from `client`'s bucket; false when it is empty.
  bool Allow(const std::string& client, int64_t now_micros);

  const RateLimitOptions& options() const { return options_; }

 private:
  struct Bucket {
    double tokens;
    int64_t last_micros;
  };
  void Evict(int64_t now_micros);

  RateLimitOptions options_;
  std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace meshlearn::ledger
