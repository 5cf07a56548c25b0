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
// Requests: POST / (or /rpc) with a JSON-RPC 2.0 body. GET /health answers "ok"; GET /metrics
// the Prometheus text (metrics.h); GET / the dashboard page and GET /tasks/ID/model and
// /tasks/ID/audit.json the downloads it links (dashboard.h). Several
// requests on one connection (keep-alive, pipelined) are answered in order.
// Limits (docs/ledger.md, "RPC limits"): connections are held by net::HttpGate, which gives a
// request a thread only once its headers and body have arrived, each within a total deadline
// (a slow client costs a socket, never a thread: HTTP 408 when late); a Content-Length over
// `max_body_bytes` is answered 413 at once; the bodies in flight together stay within
// `body_budget_bytes` (HTTP 503 with Retry-After beyond it); the request rate per client
// address (token bucket; HTTP 429); and what RpcService checks itself (JSON depth, batch size,
// long-poll time per request and per batch, waiters).
// Thread-safe; requests are handled by `threads` threads (a long-poll holds one while it waits).
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
#include "meshlearn/net/http_gate.h"

namespace meshlearn::ledger {

class RpcService;

struct RpcServerOptions {
  RateLimitOptions rate_limit = {};
  // Room for one RefereeStep (its witness is the largest transaction), as hex in JSON.
  size_t max_body_bytes = 2 * kMaxLargeTxBytes + (64 << 10);
  // All request bodies being received or handled at once: room for three of the largest.
  size_t body_budget_bytes = 64 << 20;
  int threads = 64;
  size_t max_connections = 512;
  // From a request's first byte to the end of its headers, in total; and how long a kept-alive
  // connection may wait for its next request.
  int64_t head_timeout_ms = 5'000;
  int64_t idle_timeout_ms = 5'000;
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

  // Connections, body bytes in flight (and their peak), refusals: for tests and status.
  net::HttpGateStats gate_stats() const;

 private:
  RpcService* service_;
  RpcServerOptions options_;
  Clock* clock_;
  RateLimiter limiter_;
  std::unique_ptr<net::HttpGate> gate_;
  std::string host_;
  int port_ = 0;
};

// "127.0.0.1:7700" -> {"127.0.0.1", 7700}. Errors name the flag value and the expected form.
Result<std::pair<std::string, int>> ParseListenAddress(std::string_view text);

}  // namespace meshlearn::ledger
