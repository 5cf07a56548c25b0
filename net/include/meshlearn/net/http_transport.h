// Transport over HTTP/1.1 (cpp-httplib). A request is `POST /ml/v1/<method>` with the body as
// application/octet-stream; a success is 200 with the response body; a handler error is 400 with
// the header X-Ml-Status: <numeric StatusCode> and the message as the body, turned back into the
// same Status on the caller's side. Bodies are size-limited on both sides: the server refuses
// requests larger than its Router accepts before reading them, the client stops reading a response
// larger than Request::max_response_bytes.
//
//   Router router;  BlobService service(&store);  service.Register(&router);
//   HttpServer server(&router);
//   ML_ASSIGN_OR_RETURN(uint16_t port, server.Start("127.0.0.1", 0));   // 0: ephemeral port
//   HttpTransport client;
//   Result<Bytes> r = client.Send(server.endpoint(), Request{"blob.manifest", body});
//
// Thread-safety: HttpServer's Start/Stop are not to be called concurrently with each other; the
// Router's handlers run on the server's worker threads, several at once. HttpTransport is
// thread-safe; callbacks run on its worker threads (never inside SendAsync).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "meshlearn/net/http_gate.h"
#include "meshlearn/net/transport.h"

namespace meshlearn::net {

class HttpGate;

// Splits "host:port" (an optional "http://" prefix is accepted). InvalidArgument on anything else.
Status ParseHostPort(std::string_view endpoint, std::string* host, uint16_t* port);

struct HttpServerOptions {
  // Requests handled at once. Connections are held by net::HttpGate (http_gate.h), which gives a
  // request a worker only once it has fully arrived, so idle and slow peers hold none.
  int threads = 32;
  size_t max_connections = 512;
  // From a request's first byte to the end of its headers, in total.
  int64_t head_timeout_ms = 5'000;
  // An idle keep-alive connection is closed after this long.
  int64_t keep_alive_timeout_ms = 5'000;
  // Request bodies being received or handled at once, in total (HTTP 503 beyond).
  size_t body_budget_bytes = 256 << 20;
  // When set, GET /metrics answers what it returns (the Prometheus text format, base/prometheus.h);
  // called on a server thread.
  std::function<std::string()> metrics;
};

class HttpServer {
 public:
  // `router` must outlive the server and not change while it runs.
  explicit HttpServer(const Router* router, HttpServerOptions options = {});
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0 picks a free one) and serves on background threads. Returns the bound
  // port. Unavailable if the address cannot be bound. REQUIRES: not started.
  Result<uint16_t> Start(const std::string& host, uint16_t port);
  // Stops accepting, waits for the listener thread. Idempotent.
  void Stop();
  // "host:port" once started.
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const { return port_; }
  // Connections and requests so far (zeros before Start).
  HttpGateStats gate_stats() const;

 private:
  const Router* router_;
  HttpServerOptions options_;
  std::unique_ptr<HttpGate> gate_;
  std::string host_;
  uint16_t port_ = 0;
};

struct HttpTransportOptions {
  int threads = 8;  // concurrent requests in flight
  // Keep-alive connections cached per worker; beyond this the least recently used one is closed.
  size_t max_cached_connections = 16;
  int64_t connect_timeout_ms = 5'000;
};

class HttpTransport final : public Transport {
 public:
  explicit HttpTransport(HttpTransportOptions options = {});
  // Fails the requests still queued with Unavailable and joins the workers (waiting for the
  // requests in flight to finish or time out).
  ~HttpTransport() override;

  void SendAsync(const std::string& endpoint, Request request, ResponseCallback done) override;
  void WaitUntil(const std::function<bool()>& done) override;

 private:
  struct Job {
    std::string endpoint;
    Request request;
    ResponseCallback done;
  };
  void WorkerLoop();

  HttpTransportOptions options_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  // Separate from queue_mu_ so that a WaitUntil predicate may take the caller's locks while a
  // callback holding those locks calls SendAsync.
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
};

}  // namespace meshlearn::net
