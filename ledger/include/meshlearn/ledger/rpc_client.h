// A JSON-RPC client for the ledger's HTTP API, with timeouts and retries. Used by the CLI, the
// follower and (later) nodes.
//
//   RpcClient rpc("http://127.0.0.1:7700");
//   ML_ASSIGN_OR_RETURN(nlohmann::json st, rpc.Call("chain_status", {}));
//
// Retries: a call that did not get an HTTP answer (refused, reset, timed out), or got 429 or 503
// ("later": rate limit, the server's body budget), is retried `retries` times with doubling
// backoff, and then fails with Unavailable (or the server's error). Every method of the API
// is idempotent -- send_tx too, because a transaction is identified by its hash and its nonce --
// so retrying a send after a timeout never pays twice. A JSON-RPC error answer is not retried;
// it becomes a Status whose code is the server's (error.data.status) and whose message is the
// server's message. The answer's shape is checked, never trusted (rpc_answer.h): decode results
// with RpcAnswer too.
//
// Failover: `url` may list several endpoints, comma-separated ("http://a:7700,http://b:7700": the
// candidates of a replicated sequencer, cluster.h). A call goes to the endpoint that answered
// last; one that gives no HTTP answer, 429/503, or a JSON-RPC error with status Unavailable (a
// candidate that is not the leader) is left for the next, round the list, and only after a whole
// round fails does the call back off and count a retry. With one endpoint nothing changes.
//
// Thread-safe (calls are serialised on one keep-alive connection); use one client per thread
// for parallelism.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/status.h"
#include "meshlearn/ledger/tx.h"

namespace httplib {
class Client;
}

namespace meshlearn::ledger {

struct RpcClientOptions {
  int64_t connect_timeout_ms = 3000;
  // Must exceed the longest long-poll a caller asks for (wait_block's timeout_ms).
  int64_t read_timeout_ms = 45000;
  int retries = 3;
  int64_t retry_backoff_ms = 200;
};

class RpcClient {
 public:
  // `url`: "http://host:port" (a trailing "/" or "/rpc" is accepted), or several, comma-separated.
  explicit RpcClient(std::string url, RpcClientOptions options = {});
  ~RpcClient();
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  // The endpoint in use (the one that answered last).
  const std::string& url() const;
  // Every endpoint, as given.
  size_t endpoint_count() const { return endpoints_.size(); }

  // The `result` of a call.
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params);

  // One POST of a raw body to the endpoint in use, no retries: the HTTP status and body. For
  // tests and fuzzing.
  Result<std::pair<int, std::string>> PostRaw(const std::string& body);

 private:
  struct Endpoint {
    std::string url;
    std::string path;
    std::unique_ptr<httplib::Client> http;
  };
  Result<std::pair<int, std::string>> PostTo(size_t endpoint, const std::string& body);
  // One call on one endpoint; `later` says whether another endpoint (or a retry) may do better.
  Result<nlohmann::json> CallOn(size_t endpoint, const std::string& method,
                                const std::string& body, bool* later);

  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
  RpcClientOptions options_;
  std::mutex mu_;
  int64_t next_id_ = 1;
};

// ---- Helpers for clients that send transactions (the CLI's wallet, nodes).

// The chain id and the sender's next nonce, as the ledger at `rpc` sees them now.
Result<std::string> FetchChainId(RpcClient& rpc);
Result<uint64_t> FetchNextNonce(RpcClient& rpc, const PublicKey& sender);

// Sends `tx` and waits until its block is committed: returns get_tx's answer (status
// "included", with the receipt; the receipt may say the tx failed). While it is pending the same
// bytes are sent again -- idempotent, never paid twice. Errors: the ledger's refusal (bad nonce,
// funds, signature...), DeadlineExceeded after `timeout_ms`, Unavailable if unreachable.
// `progress` (optional) is called about once a second with the milliseconds waited so far.
Result<nlohmann::json> SendTxAndWait(RpcClient& rpc, const Transaction& tx, int64_t timeout_ms,
                                     const std::function<void(int64_t)>& progress = {});

// The RPC endpoint to use: `flag` if set, else $MESHLEARN_RPC, else http://127.0.0.1:7700.
// Either may be a comma-separated list (failover, above).
std::string DefaultRpcUrl(const std::string& flag);

}  // namespace meshlearn::ledger
