// The front of every HTTP server in meshlearn (the ledger's JSON-RPC server, the nodes' blob
// server): cpp-httplib parses, routes and answers requests, but a connection holds no thread
// until a whole request -- headers and body -- has arrived within its deadlines.
//
// Why: cpp-httplib gives each connection a worker thread from accept to close and bounds only
// each single read (so a client sending one header line every few seconds holds a worker for as
// long as it likes; 80 such clients froze a 64-thread server), creates a new read buffer per
// request (pipelined requests were lost), reads any Content-Length it is given, and has no bound
// on the body bytes all connections hold together. The gate fixes these for every server at once:
//
//   - One thread polls every connection that is between requests or still receiving one. Idle
//     and slow connections cost a socket and at most `max_head_bytes`, never a thread.
//   - Deadlines are per request, in total: `head_timeout_ms` from a request's first byte to the
//     end of its headers; `body_timeout_ms` plus the body's size at `min_body_bytes_per_s` for
//     the body; `idle_timeout_ms` for a kept-alive connection waiting for its next request;
//     `write_timeout_ms` for writing one answer. A late request is answered 408 and closed.
//   - A Content-Length over `max_body_bytes` is answered 413 at once, before any body byte is
//     read; a body without Content-Length (chunked) 411; headers over `max_head_bytes` 431.
//   - The bodies being received or handled reserve their Content-Length from one budget,
//     `body_budget_bytes`; a request that would go over it is answered 503 with Retry-After.
//     Bodies up to `small_body_bytes` may use the whole budget, larger ones all but
//     `small_reserve_bytes`, so small requests are still served while large ones fill it.
//     After a large body the process returns freed memory to the system (malloc_trim).
//   - At most `max_connections` connections are open; the next one is answered 503 and closed.
//   - A complete request goes to one of `workers` threads, which runs cpp-httplib's request
//     processing on the buffered bytes; bytes after it (a pipelined request) stay buffered and
//     are answered next, in order.
//   - Refusals are written by the gate itself (`refusal_body` gives their body), the connection
//     is half-closed and the rest of what the client sends is read and dropped for up to 2 s, so
//     a client still writing its body sees the answer instead of a reset.
//
//   HttpGate gate({.workers = 64, .max_body_bytes = 1 << 20});
//   gate.server().Post("/", handler);                 // routes and handlers as usual
//   ML_ASSIGN_OR_RETURN(int port, gate.Start("127.0.0.1", 0));
//   ...
//   gate.Stop();   // closes the listener and every connection; waits for running handlers
//
// Thread-safety: configure server() before Start(); Start/Stop from one thread; stats() from any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "meshlearn/base/status.h"

namespace httplib {
class Server;
}

namespace meshlearn::net {

struct HttpGateOptions {
  int workers = 32;  // requests handled at once (a long-poll holds one while it waits)
  size_t max_connections = 512;
  size_t max_head_bytes = 16 << 10;  // request line and headers
  int64_t head_timeout_ms = 5'000;
  int64_t idle_timeout_ms = 5'000;
  int64_t body_timeout_ms = 10'000;
  size_t min_body_bytes_per_s = 256 << 10;
  int64_t write_timeout_ms = 10'000;
  size_t max_body_bytes = 16 << 20;
  size_t body_budget_bytes = 64 << 20;
  size_t small_body_bytes = 64 << 10;
  size_t small_reserve_bytes = 4 << 20;
  // Content type and body of an answer the gate writes itself; `message` says what is wrong.
  std::string refusal_content_type = "text/plain";
  std::function<std::string(int http_status, const std::string& message)> refusal_body;
};

struct HttpGateStats {
  size_t connections = 0;            // open now
  size_t body_bytes_in_flight = 0;   // reserved by requests being received or handled now
  size_t peak_body_bytes_in_flight = 0;
  uint64_t requests = 0;             // handed to a worker
  uint64_t refused_too_large = 0;    // 413
  uint64_t refused_busy = 0;         // 503: body budget or connection limit
  uint64_t timed_out = 0;            // 408: head or body late
};

class HttpGate {
 public:
  explicit HttpGate(HttpGateOptions options);
  ~HttpGate();  // Stop()s
  HttpGate(const HttpGate&) = delete;
  HttpGate& operator=(const HttpGate&) = delete;

  // Routes, pre-routing and error handlers, payload limits: set before Start().
  httplib::Server& server();

  // Binds host:port (0: a free port; SO_REUSEADDR only, so a port in use is an error) and serves
  // on background threads. Returns the port. Unavailable if it cannot bind.
  // REQUIRES: not started.
  Result<int> Start(const std::string& host, int port);
  // Idempotent. Handlers still running are waited for (wake long-polls before calling this).
  void Stop();

  HttpGateStats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshlearn::net
