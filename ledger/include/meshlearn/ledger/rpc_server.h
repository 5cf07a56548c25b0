// The HTTP face of the ledger's JSON-RPC: a thin layer over RpcService (see rpc.h) that adds the
// transport limits. All request logic is in RpcService::HandleBody, which tests call without
// sockets.
//
//   RpcServer server(&service, {.rate_limit = {.rate_per_second = 200}});
//   ML_RETURN_IF_ERROR(server.Start("127.0.0.1", 0));   // 0: an ephemeral port
//   std::cout << server.url();                          // "http://127.0.0.1:41234"
//   ...
//   server.Stop();                                      // wakes long-polls, joins the thread
//
// Requests: POST / (or /rpc) with a JSON-RPC 2.0 body. GET /health answers "ok".
// Limits: the body size (HTTP 413 with a JSON-RPC error), the request rate per client address
// (token bucket; HTTP 429), and what RpcService checks itself (JSON depth, batch size, waiters).
// Thread-safe; requests are served by a pool of `threads` threads (long-polls hold one each).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/ledger/rate_limit.h"

namespace httplib {
class Server;
}

namespace meshlearn::ledger {

class RpcService;

struct RpcServerOptions {
  RateLimitOptions rate_limit = {};
  // Room for one RefereeStep (its witness is the largest transaction), as hex in JSON.
  size_t max_body_bytes = 2 * kMaxLargeTxBytes + (64 << 10);
  int threads = 64;
};

class RpcServer {
 public:
  // `service` and `clock` must outlive the server.
  explicit RpcServer(RpcService* service, RpcServerOptions options = {},
                     Clock* clock = SystemClock::Default());
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Binds host:port and serves on a background thread. REQUIRES: not started.
  Status Start(const std::string& host, int port);
  // Idempotent.
  void Stop();

  int port() const { return port_; }
  std::string url() const;

 private:
  RpcService* service_;
  RpcServerOptions options_;
  Clock* clock_;
  RateLimiter limiter_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listening_done_{false};
  std::string host_;
  int port_ = 0;
};

// "127.0.0.1:7700" -> {"127.0.0.1", 7700}. Errors name the flag value and the expected form.
Result<std::pair<std::string, int>> ParseListenAddress(std::string_view text);

}  // namespace meshlearn::ledger
