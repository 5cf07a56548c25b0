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
// Thread-safe (calls are serialised on one keep-alive connection); use one client per thread
// for parallelism.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

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
  // `url`: "http://host:port" (a trailing "/" or "/rpc" is accepted).
  explicit RpcClient(std::string url, RpcClientOptions options = {});
  ~RpcClient();
  RpcClient(const RpcClient&) = delete;
  RpcClient& operator=(const RpcClient&) = delete;

  const std::string& url() const { return url_; }

  // The `result` of a call.
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params);

  // One POST of a raw body, no retries: the HTTP status and body. For tests and fuzzing.
  Result<std::pair<int, std::string>> PostRaw(const std::string& body);

 private:
  std::string url_;
  std::string path_;
  RpcClientOptions options_;
  std::mutex mu_;
  std::unique_ptr<httplib::Client> http_;
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
std::string DefaultRpcUrl(const std::string& flag);

}  // namespace meshlearn::ledger
