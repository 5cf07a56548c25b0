#include "meshlearn/ledger/rpc_server.h"

#include <chrono>
#include <charconv>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/log.h"
#include "meshlearn/ledger/rpc.h"

namespace meshlearn::ledger {
namespace {

constexpr const char* kJson = "application/json";

std::string TransportError(int code, const std::string& message) {
  return RpcErrorResponse(nullptr, code, message, StatusCode::kResourceExhausted).dump();
}

}  // namespace

RpcServer::RpcServer(RpcService* service, RpcServerOptions options, Clock* clock)
    : service_(service), options_(options), clock_(clock), limiter_(options.rate_limit) {}

RpcServer::~RpcServer() { Stop(); }

Status RpcServer::Start(const std::string& host, int port) {
  CHECK(!http_) << "RpcServer::Start called twice";
  http_ = std::make_unique<httplib::Server>();
  int threads = std::max(2, options_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // One byte over the limit is enough to know the body is too large; httplib answers 413 without
  // reading the rest, and the error handler below gives that answer a JSON-RPC body.
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(10, 0);
  http_->set_write_timeout(10, 0);
  // Stop() waits for idle keep-alive connections to time out, so keep that short; clients
  // reconnect transparently.
  http_->set_keep_alive_timeout(1);
  http_->set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT, which would let a second server bind the same
  // port and steal half the requests; a port in use must be an error instead.
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });

  size_t max_body = options_.max_body_bytes;
  http_->set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string body;
    if (res.status == 413) {
      body = TransportError(kRpcLimitExceeded,
                            "request body is larger than the server's limit of " +
                                std::to_string(max_body) + " bytes; send less per request");
    } else if (res.status == 404) {
      body = TransportError(kRpcInvalidRequest,
                            "no such path '" + req.path + "'; POST JSON-RPC requests to /");
    } else {
      body = TransportError(kRpcInvalidRequest, "HTTP error " + std::to_string(res.status));
    }
    res.set_content(body, kJson);
  });

  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (limiter_.Allow(req.remote_addr, clock_->MonotonicMicros())) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 429;
    res.set_content(
        RpcErrorResponse(nullptr, kRpcLimitExceeded,
                         "rate limit: more than " +
                             std::to_string(limiter_.options().rate_per_second) +
                             " requests/s from " + req.remote_addr +
                             "; slow down (the operator sets --rate-limit)",
                         StatusCode::kResourceExhausted)
            .dump(),
        kJson);
    return httplib::Server::HandlerResponse::Handled;
  });

  auto handle = [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(service_->HandleBody(req.body), kJson);
  };
  http_->Post("/", handle);
  http_->Post("/rpc", handle);
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });

  if (port == 0) {
    port_ = http_->bind_to_any_port(host);
    if (port_ <= 0) return Unavailable("cannot bind an ephemeral port on " + host);
  } else {
    if (!http_->bind_to_port(host, port)) {
      return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                         " (in use, or not a local address?); choose another --listen");
    }
    port_ = port;
  }
  host_ = host;
  listening_done_ = false;
  thread_ = std::thread([this] {
    http_->listen_after_bind();
    listening_done_ = true;
  });
  // httplib's stop() is a no-op until the listen loop runs; wait for it so that a Stop() right
  // after Start() cannot leave the thread listening forever.
  while (!http_->is_running() && !listening_done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ML_LOG_INFO("JSON-RPC listening on {}", url());
  return Status::Ok();
}

void RpcServer::Stop() {
  if (!http_) return;
  service_->Shutdown();  // long-polls return now instead of at their timeout
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string RpcServer::url() const { return "http://" + host_ + ":" + std::to_string(port_); }

Result<std::pair<std::string, int>> ParseListenAddress(std::string_view text) {
  size_t colon = text.rfind(':');
  auto bad = [&] {
    return InvalidArgument("--listen '" + std::string(text) +
                           "' is not HOST:PORT (e.g. 127.0.0.1:7700; port 0 picks a free one)");
  };
  if (colon == std::string_view::npos || colon == 0) return bad();
  std::string host(text.substr(0, colon));
  std::string_view port_text = text.substr(colon + 1);
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 ||
      port > 65535) {
    return bad();
  }
  return std::make_pair(host, port);
}

}  // namespace meshlearn::ledger
