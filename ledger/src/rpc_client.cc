#include "meshlearn/ledger/rpc_client.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <httplib.h>

#include "meshlearn/ledger/rpc.h"

namespace meshlearn::ledger {
namespace {

// Splits "http://h:p/path" into the base and the path ("/" when none).
std::pair<std::string, std::string> SplitUrl(const std::string& url) {
  size_t scheme = url.find("://");
  size_t start = scheme == std::string::npos ? 0 : scheme + 3;
  size_t slash = url.find('/', start);
  if (slash == std::string::npos) return {url, "/"};
  return {url.substr(0, slash), url.substr(slash)};
}

StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

}  // namespace

RpcClient::RpcClient(std::string url, RpcClientOptions options)
    : url_(std::move(url)), options_(options) {
  auto [base, path] = SplitUrl(url_);
  path_ = path;
  http_ = std::make_unique<httplib::Client>(base);
  http_->set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
  http_->set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  http_->set_write_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  http_->set_keep_alive(true);
  http_->set_tcp_nodelay(true);
}

RpcClient::~RpcClient() = default;

Result<std::pair<int, std::string>> RpcClient::PostRaw(const std::string& body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!http_->is_valid()) return InvalidArgument("RPC URL '" + url_ + "' is not http://HOST:PORT");
  httplib::Result r = http_->Post(path_, body, "application/json");
  if (!r) {
    return Unavailable("cannot reach the ledger at " + url_ + ": " + httplib::to_string(r.error()) +
                       " (is `meshlearn chain serve` running there? see --rpc)");
  }
  return std::make_pair(r->status, r->body);
}

Result<nlohmann::json> RpcClient::Call(const std::string& method, const nlohmann::json& params) {
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
  }
  std::string body =
      nlohmann::json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}}.dump();
  int64_t backoff = options_.retry_backoff_ms;
  Result<std::pair<int, std::string>> answer = Unavailable("no attempt");
  for (int attempt = 0;; ++attempt) {
    answer = PostRaw(body);
    if (answer.ok() && answer->first != 429) break;
    if (attempt >= options_.retries) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
    backoff *= 2;
  }
  if (!answer.ok()) return answer.status();
  nlohmann::json response = nlohmann::json::parse(answer->second, nullptr, /*allow_exceptions=*/false);
  if (response.is_discarded() || !response.is_object()) {
    return Unavailable(url_ + " answered HTTP " + std::to_string(answer->first) +
                       " with something that is not JSON-RPC; is it a meshlearn ledger?");
  }
  if (response.contains("error")) {
    const nlohmann::json& e = response["error"];
    std::string message = e.value("message", std::string("unknown error"));
    StatusCode code = StatusCode::kInternal;
    if (e.contains("data") && e["data"].is_object() && e["data"].contains("status") &&
        e["data"]["status"].is_string()) {
      code = CodeFromName(e["data"]["status"].get<std::string>());
    }
    return Status(code, message);
  }
  if (!response.contains("result")) {
    return Unavailable(url_ + " answered without a result or an error");
  }
  return std::move(response["result"]);
}

std::string DefaultRpcUrl(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("MESHLEARN_RPC"); env && *env) return env;
  return "http://127.0.0.1:7700";
}

}  // namespace meshlearn::ledger
