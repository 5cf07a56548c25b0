#include "meshlearn/net/http_transport.h"

#include <httplib.h>

#include <charconv>
#include <chrono>
#include <map>

#include "meshlearn/base/log.h"
#include "meshlearn/base/prometheus.h"
#include "meshlearn/net/http_gate.h"

namespace meshlearn::net {
namespace {

constexpr char kPathPrefix[] = "/ml/v1/";
constexpr char kStatusHeader[] = "X-Ml-Status";

void SetTimeout(httplib::Client* c, int64_t ms, bool connect) {
  if (ms < 0) ms = 0;
  time_t sec = static_cast<time_t>(ms / 1000);
  time_t usec = static_cast<time_t>((ms % 1000) * 1000);
  if (connect) {
    c->set_connection_timeout(sec, usec);
  } else {
    c->set_read_timeout(sec, usec);
    c->set_write_timeout(sec, usec);
  }
}

}  // namespace

Status ParseHostPort(std::string_view endpoint, std::string* host, uint16_t* port) {
  std::string_view e = endpoint;
  if (e.substr(0, 7) == "http://") e.remove_prefix(7);
  size_t colon = e.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == e.size()) {
    return InvalidArgument("endpoint '" + std::string(endpoint) + "' must be host:port");
  }
  unsigned value = 0;
  std::string_view p = e.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (ec != std::errc() || ptr != p.data() + p.size() || value == 0 || value > 65535) {
    return InvalidArgument("endpoint '" + std::string(endpoint) + "': port must be 1..65535");
  }
  *host = std::string(e.substr(0, colon));
  *port = static_cast<uint16_t>(value);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Server

HttpServer::HttpServer(const Router* router, HttpServerOptions options)
    : router_(router), options_(options) {}

HttpServer::~HttpServer() { Stop(); }

Result<uint16_t> HttpServer::Start(const std::string& host, uint16_t port) {
  CHECK(gate_ == nullptr) << "HttpServer started twice";
  HttpGateOptions gate_options;
  gate_options.workers = options_.threads;
  gate_options.max_connections = options_.max_connections;
  gate_options.head_timeout_ms = options_.head_timeout_ms;
  gate_options.idle_timeout_ms = options_.keep_alive_timeout_ms;
  gate_options.max_body_bytes = router_->max_request_bytes();
  gate_options.body_budget_bytes =
      std::max(options_.body_budget_bytes, router_->max_request_bytes());
  gate_ = std::make_unique<HttpGate>(std::move(gate_options));
  httplib::Server& s = gate_->server();
  const Router* router = router_;
  s.Post(R"(/ml/v1/([a-z0-9._-]{1,64}))",
         [router](const httplib::Request& req, httplib::Response& res) {
           Request r;
           r.method = req.matches[1];
           r.body.assign(req.body.begin(), req.body.end());
           Result<Bytes> out = router->Dispatch(r);
           if (out.ok()) {
             res.status = 200;
             res.set_content(std::string(AsStringView(*out)), "application/octet-stream");
           } else {
             res.status = 400;
             res.set_header(kStatusHeader, std::to_string(static_cast<int>(out.status().code())));
             res.set_content(out.status().message(), "text/plain");
           }
         });
  if (options_.metrics) {
    s.Get("/metrics", [metrics = options_.metrics](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics(), PrometheusText::kContentType);
    });
  }
  Result<int> bound = gate_->Start(host, port);
  if (!bound.ok()) {
    gate_.reset();
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                       " (address in use or not local?)");
  }
  host_ = host;
  port_ = static_cast<uint16_t>(*bound);
  return port_;
}

HttpGateStats HttpServer::gate_stats() const { return gate_ ? gate_->stats() : HttpGateStats{}; }

void HttpServer::Stop() {
  if (gate_ == nullptr) return;
  gate_->Stop();
  gate_.reset();
}

// ---------------------------------------------------------------------------------------------
// Client

HttpTransport::HttpTransport(HttpTransportOptions options) : options_(options) {
  CHECK_GT(options_.threads, 0);
  for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

HttpTransport::~HttpTransport() {
  std::deque<Job> left;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  queue_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  for (Job& j : left) j.done(Unavailable("request to " + j.endpoint + ": transport shut down"));
}

void HttpTransport::SendAsync(const std::string& endpoint, Request request, ResponseCallback done) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(Job{endpoint, std::move(request), std::move(done)});
  }
  queue_cv_.notify_one();
}

void HttpTransport::WaitUntil(const std::function<bool()>& done) {
  std::unique_lock<std::mutex> lock(wait_mu_);
  wait_cv_.wait(lock, done);
}

void HttpTransport::WorkerLoop() {
  // One keep-alive connection per peer per worker, the least recently used closed beyond
  // max_cached_connections.
  struct Cached {
    std::unique_ptr<httplib::Client> client;
    uint64_t last_use = 0;
  };
  std::map<std::string, Cached> clients;
  uint64_t uses = 0;
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Result<Bytes> result = [&]() -> Result<Bytes> {
      ML_RETURN_IF_ERROR(ValidateMethod(job.request.method));
      std::string host;
      uint16_t port = 0;
      ML_RETURN_IF_ERROR(ParseHostPort(job.endpoint, &host, &port));
      auto cached = clients.find(job.endpoint);
      if (cached == clients.end() && clients.size() >= options_.max_cached_connections) {
        auto oldest = clients.begin();
        for (auto it = clients.begin(); it != clients.end(); ++it) {
          if (it->second.last_use < oldest->second.last_use) oldest = it;
        }
        clients.erase(oldest);
      }
      Cached& entry = clients[job.endpoint];
      entry.last_use = ++uses;
      std::unique_ptr<httplib::Client>& client = entry.client;
      if (client == nullptr) {
        client = std::make_unique<httplib::Client>(host, port);
        client->set_keep_alive(true);
        client->set_tcp_nodelay(true);
        SetTimeout(client.get(), options_.connect_timeout_ms, /*connect=*/true);
      }
      SetTimeout(client.get(), job.request.timeout_ms, /*connect=*/false);

      httplib::Request req;
      req.method = "POST";
      req.path = std::string(kPathPrefix) + job.request.method;
      req.headers.emplace("Content-Type", "application/octet-stream");
      req.body.assign(job.request.body.begin(), job.request.body.end());
      std::string body;
      bool too_big = false;
      size_t limit = job.request.max_response_bytes;
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (body.size() + n > limit) {
          too_big = true;
          return false;
        }
        body.append(data, n);
        return true;
      };
      httplib::Response res;
      httplib::Error err = httplib::Error::Success;
      bool sent = client->send(req, res, err);
      std::string peer = "peer " + job.endpoint;
      if (too_big) {
        client.reset();  // the connection holds an unread body
        return ResourceExhausted(peer + ": response to " + job.request.method +
                                 " exceeds the limit of " + std::to_string(limit) + " bytes");
      }
      if (!sent) {
        client.reset();
        return Unavailable(peer + ": " + job.request.method +
                           " failed: " + httplib::to_string(err));
      }
      if (res.status == 200) return ToBytes(body);
      if (res.has_header(kStatusHeader)) {
        int code = std::atoi(res.get_header_value(kStatusHeader).c_str());
        if (code <= 0 || code > static_cast<int>(StatusCode::kInternal)) {
          code = static_cast<int>(StatusCode::kInternal);
        }
        if (body.size() > 4096) body.resize(4096);
        return Status(static_cast<StatusCode>(code), peer + ": " + body);
      }
      if (res.status == 413) {
        return ResourceExhausted(peer + ": " + job.request.method + " request of " +
                                 std::to_string(job.request.body.size()) + " bytes is too large");
      }
      return Unavailable(peer + ": " + job.request.method + " got HTTP " +
                         std::to_string(res.status));
    }();
    job.done(std::move(result));
    { std::lock_guard<std::mutex> lock(wait_mu_); }
    wait_cv_.notify_all();
  }
}

}  // namespace meshlearn::net
