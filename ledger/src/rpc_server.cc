#include "meshlearn/ledger/rpc_server.h"

#include <chrono>
#include <charconv>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/log.h"
#include "meshlearn/base/prometheus.h"
#include "meshlearn/ledger/dashboard.h"
#include "meshlearn/ledger/metrics.h"
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
  CHECK(!gate_) << "RpcServer::Start called twice";
  size_t max_body = options_.max_body_bytes;
  net::HttpGateOptions gate_options;
  gate_options.workers = std::max(2, options_.threads);
  gate_options.max_connections = options_.max_connections;
  gate_options.head_timeout_ms = options_.head_timeout_ms;
  gate_options.idle_timeout_ms = options_.idle_timeout_ms;
  gate_options.max_body_bytes = max_body;
  gate_options.body_budget_bytes = std::max(options_.body_budget_bytes, max_body);
  // The gate's own answers (413, 408, 503, ...) are JSON-RPC errors like every other.
  gate_options.refusal_content_type = kJson;
  gate_options.refusal_body = [](int http_status, const std::string& message) {
    int code = http_status == 400 || http_status == 411 ? kRpcInvalidRequest : kRpcLimitExceeded;
    StatusCode status = http_status == 503   ? StatusCode::kUnavailable
                        : http_status == 408 ? StatusCode::kDeadlineExceeded
                        : code == kRpcInvalidRequest ? StatusCode::kInvalidArgument
                                                     : StatusCode::kResourceExhausted;
    if (http_status == 503) code = kRpcUnavailable;
    return RpcErrorResponse(nullptr, code, message, status).dump();
  };
  gate_ = std::make_unique<net::HttpGate>(std::move(gate_options));
  httplib::Server& http = gate_->server();
  http.set_read_timeout(10, 0);
  http.set_write_timeout(10, 0);

  http.set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
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

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
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
  http.Post("/", handle);
  http.Post("/rpc", handle);
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(LedgerMetricsText(*service_), PrometheusText::kContentType);
  });
  // The dashboard (dashboard.h): a page that reads this server's JSON-RPC from the browser. It
  // loads nothing from elsewhere, which the policy makes a rule: its own inline script and style,
  // requests to this origin only.
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'; img-src data: blob:; base-uri 'none'; form-action 'none'; "
                   "frame-ancestors 'none'");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(DashboardHtml()), "text/html; charset=utf-8");
  });
  // The files the dashboard's task view links (dashboard.h): a task's final model, fetched from
  // the nodes and served only if it is the blob the ledger recorded, and its record as JSON.
  http.Get(R"(/tasks/.*)", [sources = DashboardSourcesOf(service_)](const httplib::Request& req,
                                                                    httplib::Response& res) {
    DashboardFile f = ServeTaskFile(req.path, sources);
    res.status = f.http_status;
    if (!f.filename.empty()) {
      res.set_header("Content-Disposition", "attachment; filename=\"" + f.filename + "\"");
    }
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(std::move(f.body), f.content_type);
  });

  Result<int> bound = gate_->Start(host, port);
  if (!bound.ok()) {
    gate_.reset();
    if (port == 0) return Unavailable("cannot bind an ephemeral port on " + host);
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                       " (in use, or not a local address?); choose another --listen");
  }
  port_ = *bound;
  host_ = host;
  ML_LOG_INFO("JSON-RPC listening on {}", url());
  return Status::Ok();
}

void RpcServer::Stop() {
  if (!gate_) return;
  service_->Shutdown();  // long-polls return now instead of at their timeout
  gate_->Stop();
}

net::HttpGateStats RpcServer::gate_stats() const {
  return gate_ ? gate_->stats() : net::HttpGateStats{};
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
