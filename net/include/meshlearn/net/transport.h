// Transport: typed request/response messaging between nodes, with one real implementation over
// HTTP (http_transport.h) and one simulated in memory on virtual time (sim_transport.h).
//
// A request names a method ("blob.chunk") and carries an opaque body, which each service encodes
// with base/encoding.h and decodes with limits (see blob_service.h). A server side is a Router:
// one handler per method, each with its own request size limit. A handler returns the response
// body or a Status; the Status (code and message) travels back to the caller, prefixed with the
// peer's endpoint. Transport failures come back as Unavailable (peer unreachable, connection
// broken) or DeadlineExceeded (no answer within the request's timeout).
//
//   Router router;
//   router.Register("echo", [](const Request& r) -> Result<Bytes> { return r.body; },
//                   /*max_request_bytes=*/1024);
//   ... serve `router` with an HttpServer or a SimNode ...
//   Result<Bytes> reply = transport->Send(peer_endpoint, Request{"echo", ToBytes("hi")});
//
// Endpoints are strings: "127.0.0.1:8080" for HTTP, a node name for the simulation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn::net {

inline constexpr size_t kMaxMethodLength = 64;
inline constexpr size_t kDefaultMaxResponseBytes = 8u << 20;  // 8 MiB

struct Request {
  std::string method;
  Bytes body;
  // The caller gives up after this long (virtual time in the simulation) with DeadlineExceeded.
  int64_t timeout_ms = 30'000;
  // Larger responses are refused (ResourceExhausted) without being buffered whole.
  size_t max_response_bytes = kDefaultMaxResponseBytes;
};

using ResponseCallback = std::function<void(Result<Bytes>)>;
using Handler = std::function<Result<Bytes>(const Request&)>;

// Method name -> handler. Register everything before serving; after that Dispatch may be called
// from several threads at once (it only reads), and handlers must be thread-safe for HTTP.
class Router {
 public:
  // REQUIRES: `method` is not registered yet and is a valid method name (ValidateMethod).
  void Register(std::string method, Handler handler, size_t max_request_bytes);
  // Unknown method -> NotFound; body over the method's limit -> ResourceExhausted; otherwise the
  // handler's answer.
  Result<Bytes> Dispatch(const Request& request) const;
  // The largest request any method accepts (servers refuse bigger bodies before reading them).
  size_t max_request_bytes() const { return max_request_bytes_; }

 private:
  struct Entry {
    Handler handler;
    size_t max_request_bytes;
  };
  std::map<std::string, Entry, std::less<>> handlers_;
  size_t max_request_bytes_ = 0;
};

// Method names: 1..kMaxMethodLength characters from [a-z0-9._-].
Status ValidateMethod(std::string_view method);

// The client side. Thread-safety: HttpTransport is thread-safe; a SimNode's transport must be
// used from the thread that runs its SimNetwork.
class Transport {
 public:
  virtual ~Transport() = default;

  // Sends `request` to `endpoint`; `done` is called exactly once with the response or an error,
  // never from inside SendAsync itself. Where it runs depends on the transport: a worker thread
  // (HTTP) or the simulation's event loop.
  virtual void SendAsync(const std::string& endpoint, Request request, ResponseCallback done) = 0;

  // Blocks until `done()` is true, letting asynchronous work progress: HTTP waits for callbacks
  // to complete; the simulation runs its event loop (and returns early if it runs out of events,
  // so check `done()` afterwards). `done` is evaluated on the calling thread.
  virtual void WaitUntil(const std::function<bool()>& done) = 0;

  // Synchronous form: SendAsync + WaitUntil.
  // REQUIRES (HTTP): not called from a transport callback or a handler served by the same
  // process's worker pool while all of its workers may be busy; use SendAsync there.
  Result<Bytes> Send(const std::string& endpoint, Request request);
};

}  // namespace meshlearn::net
