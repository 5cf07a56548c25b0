#include "meshlearn/ledger/rpc_client.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <httplib.h>

#include "meshlearn/base/hex.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/rpc_answer.h"

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

}  // namespace

RpcClient::RpcClient(std::string url, RpcClientOptions options) : options_(options) {
  size_t start = 0;
  for (;;) {
    size_t comma = url.find(',', start);
    std::string one = url.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto [base, path] = SplitUrl(one);
    Endpoint e{one, path, std::make_unique<httplib::Client>(base)};
    e.http->set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
    e.http->set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
    e.http->set_write_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
    e.http->set_keep_alive(true);
    e.http->set_tcp_nodelay(true);
    endpoints_.push_back(std::move(e));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

RpcClient::~RpcClient() = default;

const std::string& RpcClient::url() const { return endpoints_[current_.load()].url; }

Result<std::pair<int, std::string>> RpcClient::PostRaw(const std::string& body) {
  return PostTo(current_.load(), body);
}

Result<std::pair<int, std::string>> RpcClient::PostTo(size_t i, const std::string& body) {
  std::lock_guard<std::mutex> lock(mu_);
  Endpoint& e = endpoints_[i];
  if (!e.http->is_valid()) {
    return InvalidArgument("RPC URL '" + e.url + "' is not http://HOST:PORT (several: comma-separated)");
  }
  httplib::Result r = e.http->Post(e.path, body, "application/json");
  if (!r) {
    return Unavailable("cannot reach the ledger at " + e.url + ": " + httplib::to_string(r.error()) +
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
  Status last = Unavailable("no attempt");
  const size_t n = endpoints_.size();
  for (int attempt = 0;; ++attempt) {
    // One round of the endpoints, from the one that answered last.
    const size_t first = current_.load();
    for (size_t k = 0; k < n; ++k) {
      size_t i = (first + k) % n;
      bool later = false;
      Result<nlohmann::json> r = CallOn(i, method, body, &later);
      if (!later) {
        current_.store(i);
        return r;
      }
      last = r.status();
    }
    if (attempt >= options_.retries) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
    backoff *= 2;
  }
  return last;
}

Result<nlohmann::json> RpcClient::CallOn(size_t i, const std::string& method,
                                         const std::string& body, bool* later) {
  *later = false;
  const std::string& url = endpoints_[i].url;
  Result<std::pair<int, std::string>> answer = PostTo(i, body);
  if (!answer.ok()) {
    *later = answer.status().code() == StatusCode::kUnavailable;
    return answer.status();
  }
  // 429 (rate limit) and 503 (the server's body budget or connection limit) say "later".
  if (answer->first == 429 || answer->first == 503) *later = true;
  nlohmann::json response = nlohmann::json::parse(answer->second, nullptr, /*allow_exceptions=*/false);
  if (response.is_discarded() || !response.is_object()) {
    return Unavailable(url + " answered HTTP " + std::to_string(answer->first) +
                       " with something that is not JSON-RPC; is it a meshlearn ledger?");
  }
  if (response.contains("error")) {
    // The error's shape is checked too: a wrong one is still an error, never an abort.
    RpcAnswer e(method, response["error"], "error");
    Result<std::string> given = e.Str("message", "");
    std::string message = given.ok() ? *given : "";
    if (message.empty()) message = method + ": the ledger at " + url + " answered an error";
    StatusCode code = StatusCode::kInternal;
    Result<RpcAnswer> data = e.ObjectOrNull("data");
    if (data.ok()) {
      Result<std::string> name = data->Str("status", "");
      if (name.ok() && !name->empty()) code = ErrorCodeFromName(*name);
    }
    // A candidate that is not the leader (or a ledger shutting down): another endpoint may
    // answer. With one endpoint the caller decides, as before.
    if (code == StatusCode::kUnavailable && endpoints_.size() > 1) *later = true;
    return Status(code, message);
  }
  if (!response.contains("result")) {
    return Unavailable(url + " answered " + method + " without a result or an error");
  }
  return std::move(response["result"]);
}

std::string DefaultRpcUrl(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("MESHLEARN_RPC"); env && *env) return env;
  return "http://127.0.0.1:7700";
}

}  // namespace meshlearn::ledger

namespace meshlearn::ledger {

Result<std::string> FetchChainId(RpcClient& rpc) {
  ML_ASSIGN_OR_RETURN(nlohmann::json st, rpc.Call("chain_status", nlohmann::json::object()));
  return RpcAnswer("chain_status", st).Str("chain_id");
}

Result<uint64_t> FetchNextNonce(RpcClient& rpc, const PublicKey& sender) {
  ML_ASSIGN_OR_RETURN(nlohmann::json a, rpc.Call("get_account", {{"address", sender.ToHex()}}));
  return RpcAnswer("get_account", a).U64("nonce");
}

Result<nlohmann::json> SendTxAndWait(RpcClient& rpc, const Transaction& tx, int64_t timeout_ms,
                                     const std::function<void(int64_t)>& progress) {
  using Steady = std::chrono::steady_clock;
  const std::string hex = HexEncode(EncodeTx(tx));
  const Hash256 id = TxId(tx);
  const auto start = Steady::now();
  auto waited_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - start).count();
  };
  for (;;) {
    int64_t left = timeout_ms - waited_ms();
    if (left <= 0) {
      return DeadlineExceeded("transaction " + id.ToHex() + " was not included within " +
                              std::to_string(timeout_ms / 1000) +
                              "s; it may still be: check with `meshlearn wallet tx " + id.ToHex() +
                              "`");
    }
    // Short waits so progress is reported; each resend of the same bytes is a no-op on the
    // ledger while the transaction is pending.
    int64_t wait = std::min<int64_t>(left, 1000);
    Result<nlohmann::json> r = rpc.Call("send_tx", {{"tx", hex}, {"wait_ms", wait}});
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kUnavailable) return r.status();
      // Unreachable after the client's own retries; keep trying until the deadline.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(left, 500)));
    } else {
      RpcAnswer a("send_tx", *r);
      ML_ASSIGN_OR_RETURN(std::string status, a.Str("status"));
      if (status == "included") {
        // get_tx adds the transaction itself to the receipt.
        // Another endpoint may answer it (failover) and not have that block yet: only its
        // "included" replaces send_tx's own.
        Result<nlohmann::json> full = rpc.Call("get_tx", {{"id", id.ToHex()}});
        if (full.ok()) {
          Result<std::string> st = RpcAnswer("get_tx", *full).Str("status");
          if (st.ok() && *st == "included") return *full;
        }
        return *r;
      }
      if (status == "rejected") {
        ML_ASSIGN_OR_RETURN(RpcAnswer e, a.ObjectOrNull("error"));
        Result<std::string> why = e.Str("message", "no reason given");
        return FailedPrecondition("the ledger dropped transaction " + id.ShortHex() + ": " +
                                  (why.ok() ? *why : std::string("no reason given")));
      }
    }
    if (progress) progress(waited_ms());
  }
}

}  // namespace meshlearn::ledger
