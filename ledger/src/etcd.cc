#include "meshlearn/ledger/etcd.h"

#include <chrono>

#include <httplib.h>

namespace meshlearn::ledger {
namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// etcd's gateway writes int64 as a JSON string, and omits zero values.
Result<int64_t> Int(const nlohmann::json& j, const char* name) {
  if (!j.is_object() || !j.contains(name)) return int64_t{0};
  const nlohmann::json& v = j[name];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    int64_t out = 0;
    size_t used = 0;
    try {
      out = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == s.size() && !s.empty()) return out;
  }
  return Internal(std::string("etcd answered a non-integer ") + name + ": " + v.dump());
}

Result<std::string> Bytes64(const nlohmann::json& j, const char* name) {
  if (!j.contains(name)) return std::string();
  if (!j[name].is_string()) return Internal(std::string("etcd answered a non-string ") + name);
  return Base64Decode(j[name].get_ref<const std::string&>());
}

Result<EtcdKv> DecodeKv(const nlohmann::json& j) {
  if (!j.is_object()) return Internal("etcd answered a key-value that is not an object");
  EtcdKv kv;
  ML_ASSIGN_OR_RETURN(kv.key, Bytes64(j, "key"));
  ML_ASSIGN_OR_RETURN(kv.value, Bytes64(j, "value"));
  ML_ASSIGN_OR_RETURN(kv.create_revision, Int(j, "create_revision"));
  ML_ASSIGN_OR_RETURN(kv.mod_revision, Int(j, "mod_revision"));
  ML_ASSIGN_OR_RETURN(kv.lease, Int(j, "lease"));
  return kv;
}

Result<std::vector<EtcdKv>> DecodeKvs(const nlohmann::json& j) {
  std::vector<EtcdKv> out;
  if (!j.is_object() || !j.contains("kvs")) return out;
  if (!j["kvs"].is_array()) return Internal("etcd answered kvs that is not an array");
  for (const nlohmann::json& e : j["kvs"]) {
    ML_ASSIGN_OR_RETURN(EtcdKv kv, DecodeKv(e));
    out.push_back(std::move(kv));
  }
  return out;
}

}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.size() % 4 != 0)
    return Internal("etcd answered base64 whose length is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = value(c)) < 0) return Internal("etcd answered malformed base64");
    }
    uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += char(w >> 16);
    if (pad < 2) out += char((w >> 8) & 0xff);
    if (pad < 1) out += char(w & 0xff);
  }
  return out;
}

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list, std::string_view what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string ep(list.substr(start, comma - start));
    start = comma + 1;
    while (!ep.empty() && ep.back() == '/') ep.pop_back();
    size_t colon = ep.rfind(':');
    if (ep.rfind("http://", 0) != 0 || colon == std::string::npos || colon < 7 ||
        colon + 1 == ep.size() ||
        ep.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return InvalidArgument(std::string(what) + ": '" + ep +
                             "' is not an etcd endpoint http://HOST:PORT; give a comma-separated "
                             "list, e.g. http://127.0.0.1:2379,http://127.0.0.1:22379");
    }
    out.push_back(ep);
  }
  if (out.empty()) return InvalidArgument(std::string(what) + ": no etcd endpoint given");
  return out;
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, EtcdOptions options)
    : endpoints_(std::move(endpoints)), options_(options) {
  for (const std::string& ep : endpoints_) {
    auto c = std::make_unique<httplib::Client>(ep);
    c->set_connection_timeout(std::chrono::milliseconds(options_.timeout_ms));
    c->set_read_timeout(std::chrono::milliseconds(options_.timeout_ms));
    c->set_write_timeout(std::chrono::milliseconds(options_.timeout_ms));
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    http_.push_back(std::move(c));
  }
}

EtcdClient::~EtcdClient() = default;

Result<nlohmann::json> EtcdClient::Post(const std::string& path, const nlohmann::json& body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (http_.empty()) return InvalidArgument("etcd client: no endpoints");
  const std::string text = body.dump();
  const auto timeout =
      std::chrono::milliseconds(options_.timeout_ms + static_cast<int64_t>(text.size() / 1024));
  std::string unreachable;
  for (size_t tried = 0; tried < http_.size(); ++tried) {
    size_t i = (current_ + tried) % http_.size();
    http_[i]->set_read_timeout(timeout);
    http_[i]->set_write_timeout(timeout);
    httplib::Result r = http_[i]->Post(path, text, "application/json");
    if (!r) {
      unreachable +=
          (unreachable.empty() ? "" : "; ") + endpoints_[i] + ": " + httplib::to_string(r.error());
      continue;
    }
    current_ = i;
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Internal("etcd at " + endpoints_[i] + path + " answered HTTP " +
                      std::to_string(r->status) + " with something that is not JSON");
    }
    if (r->status != 200 || j.contains("error")) {
      std::string msg = "HTTP " + std::to_string(r->status);
      if (j.contains("message") && j["message"].is_string()) {
        msg = j["message"].get<std::string>();
      } else if (j.contains("error") && j["error"].is_string()) {
        msg = j["error"].get<std::string>();
      }
      if (msg.find("not found") != std::string::npos) return NotFound("etcd: " + msg);
      // "etcdserver: request timed out", "no leader": the cluster is between leaders.
      return Unavailable("etcd at " + endpoints_[i] + ": " + msg);
    }
    return j;
  }
  return Unavailable("cannot reach etcd (" + unreachable +
                     "); is the etcd cluster running? see docs/operators.md");
}

Result<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  nlohmann::json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  ML_ASSIGN_OR_RETURN(nlohmann::json j, Post("/v3/kv/put", body));
  return Int(j.value("header", nlohmann::json::object()), "revision");
}

Result<std::vector<EtcdKv>> EtcdClient::Range(const std::string& key, const std::string& range_end,
                                              int64_t limit) {
  nlohmann::json body = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) body["range_end"] = Base64Encode(range_end);
  if (limit > 0) body["limit"] = std::to_string(limit);
  ML_ASSIGN_OR_RETURN(nlohmann::json j, Post("/v3/kv/range", body));
  return DecodeKvs(j);
}

Result<int64_t> EtcdClient::Count(const std::string& key, const std::string& range_end) {
  nlohmann::json body = {{"key", Base64Encode(key)}, {"count_only", true}};
  if (!range_end.empty()) body["range_end"] = Base64Encode(range_end);
  ML_ASSIGN_OR_RETURN(nlohmann::json j, Post("/v3/kv/range", body));
  return Int(j, "count");
}

Result<std::optional<EtcdKv>> EtcdClient::Get(const std::string& key) {
  ML_ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, Range(key, ""));
  if (kvs.empty()) return std::optional<EtcdKv>();
  return std::optional<EtcdKv>(std::move(kvs.front()));
}

Status EtcdClient::Delete(const std::string& key) {
  return Post("/v3/kv/deleterange", {{"key", Base64Encode(key)}}).status();
}

Result<bool> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                             const std::vector<EtcdPut>& puts) {
  nlohmann::json cmp = nlohmann::json::array();
  for (const EtcdCompare& c : compares) {
    if (c.kind == EtcdCompare::Kind::kAbsent) {
      cmp.push_back({{"key", Base64Encode(c.key)},
                     {"target", "CREATE"},
                     {"result", "EQUAL"},
                     {"create_revision", "0"}});
    } else {
      cmp.push_back({{"key", Base64Encode(c.key)},
                     {"target", "VALUE"},
                     {"result", "EQUAL"},
                     {"value", Base64Encode(c.value)}});
    }
  }
  nlohmann::json ops = nlohmann::json::array();
  for (const EtcdPut& p : puts) {
    nlohmann::json put = {{"key", Base64Encode(p.key)}, {"value", Base64Encode(p.value)}};
    if (p.lease != 0) put["lease"] = std::to_string(p.lease);
    ops.push_back({{"request_put", std::move(put)}});
  }
  ML_ASSIGN_OR_RETURN(nlohmann::json j, Post("/v3/kv/txn", {{"compare", cmp}, {"success", ops}}));
  if (!j.contains("succeeded")) return false;  // the gateway omits false
  if (!j["succeeded"].is_boolean()) return Internal("etcd answered a non-boolean succeeded");
  return j["succeeded"].get<bool>();
}

Result<EtcdLease> EtcdClient::GrantLease(int64_t ttl_s) {
  ML_ASSIGN_OR_RETURN(nlohmann::json j, Post("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}));
  EtcdLease lease;
  ML_ASSIGN_OR_RETURN(lease.id, Int(j, "ID"));
  ML_ASSIGN_OR_RETURN(lease.ttl_s, Int(j, "TTL"));
  if (lease.id == 0 || lease.ttl_s <= 0) return Internal("etcd granted no lease: " + j.dump());
  return lease;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease_id) {
  // A streaming call in gRPC; over the gateway one request gets one {"result": ...}.
  ML_ASSIGN_OR_RETURN(nlohmann::json j,
                      Post("/v3/lease/keepalive", {{"ID", std::to_string(lease_id)}}));
  nlohmann::json result = j.value("result", nlohmann::json::object());
  ML_ASSIGN_OR_RETURN(int64_t ttl, Int(result, "TTL"));
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(lease_id) + " has expired");
  return ttl;
}

Status EtcdClient::RevokeLease(int64_t lease_id) {
  return Post("/v3/lease/revoke", {{"ID", std::to_string(lease_id)}}).status();
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace meshlearn::ledger
