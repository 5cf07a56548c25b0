// A small etcd v3 client over etcd's JSON gateway (HTTP POST /v3/kv/range, /v3/kv/put,
// /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values are
// base64 in JSON, 64-bit integers are JSON strings). It speaks through cpp-httplib, as the
// ledger's own RPC client does: no gRPC, no new dependency. The replicated sequencer
// (cluster.h) is its user.
//
//   ML_ASSIGN_OR_RETURN(std::vector<std::string> eps, ParseEtcdEndpoints(flag, "--cluster"));
//   EtcdClient etcd(eps);
//   ML_ASSIGN_OR_RETURN(EtcdLease lease, etcd.GrantLease(2));
//   ML_ASSIGN_OR_RETURN(bool won, etcd.Txn({EtcdCompare::Absent("leader")},
//                                          {{"leader", "me", lease.id}}));
//
// Endpoints: a call goes to the endpoint that answered last; one that does not answer (refused,
// reset, timed out) is skipped for the next, each once per call. A timeout means "unknown":
// a Put or Txn that timed out may still have been applied (the caller reads back; cluster.cc
// does). Errors: Unavailable when no endpoint answered, NotFound for an unknown lease, Internal
// for an answer that does not decode, etcd's own message otherwise.
//
// Thread-safe (calls are serialised); use one client per thread for parallelism.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/status.h"

namespace httplib {
class Client;
}

namespace meshlearn::ledger {

// "http://127.0.0.1:2379,http://127.0.0.1:22379" -> the list. Each must be http://HOST:PORT;
// `what` names the input in errors (e.g. "--cluster").
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list, std::string_view what);

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // as granted (etcd may raise a small TTL to its minimum)
};

// One comparison of a transaction.
struct EtcdCompare {
  enum class Kind { kAbsent, kValueEquals };
  Kind kind = Kind::kAbsent;
  std::string key;
  std::string value;
  static EtcdCompare Absent(std::string key) { return {Kind::kAbsent, std::move(key), {}}; }
  static EtcdCompare ValueEquals(std::string key, std::string value) {
    return {Kind::kValueEquals, std::move(key), std::move(value)};
  }
};

struct EtcdPut {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0: none
};

// The largest request a chain's etcd must accept: a block of kMaxBlockBytes travels base64-encoded
// (4/3) in a JSON transaction, with room for the keys and the JSON around it. etcd's own default
// (1.5 MB) refuses a block holding one Fashion-MNIST step witness (3.3 MB). LocalEtcdCluster starts
// its members with it; an operator's etcd needs `--max-request-bytes` at least this
// (docs/operators.md).
inline constexpr int64_t kEtcdMaxRequestBytes = (int64_t{64} << 20) / 3 * 4 + (int64_t{1} << 20);

struct EtcdOptions {
  // Per HTTP request; keep it well under a lease's TTL so a leader that cannot reach etcd
  // learns it before its lease runs out.
  // A large request (a block with a step witness) gets 1 ms more per KB it sends: etcd took 0.2 s
  // for 4.4 MB and 1.6 s for 27 MB on loopback.
  int64_t timeout_ms = 500;
};

class EtcdClient {
 public:
  explicit EtcdClient(std::vector<std::string> endpoints, EtcdOptions options = {});
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // The store's revision after the put.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // The value at `key`, or nullopt.
  Result<std::optional<EtcdKv>> Get(const std::string& key);
  // Keys in [key, range_end), in key order, at most `limit` (0: all).
  Result<std::vector<EtcdKv>> Range(const std::string& key, const std::string& range_end,
                                    int64_t limit = 0);
  // How many keys are in [key, range_end) (etcd's count_only range: no values travel).
  Result<int64_t> Count(const std::string& key, const std::string& range_end);
  Status Delete(const std::string& key);

  // If every comparison holds, applies `puts` atomically and returns true; else false and
  // nothing changed.
  Result<bool> Txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdPut>& puts);

  Result<EtcdLease> GrantLease(int64_t ttl_s);
  // Renews the lease; returns its TTL now. NotFound if it expired or was revoked.
  Result<int64_t> KeepAlive(int64_t lease_id);
  // Ends the lease and deletes its keys (NotFound if it already ended).
  Status RevokeLease(int64_t lease_id);

  // The end of the range of keys starting with `prefix` (etcd's prefix convention).
  static std::string PrefixEnd(const std::string& prefix);

 private:
  // POSTs `body` to `path` on the endpoints in turn; the decoded answer of the first that
  // answers HTTP 200, or etcd's error.
  Result<nlohmann::json> Post(const std::string& path, const nlohmann::json& body);

  std::vector<std::string> endpoints_;
  EtcdOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> http_;
  size_t current_ = 0;
};

// Base64 (RFC 4648, with padding), as etcd's gateway writes bytes.
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

}  // namespace meshlearn::ledger
