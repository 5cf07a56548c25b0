#include "meshlearn/node/chain_client.h"

#include <algorithm>

#include "meshlearn/base/hex.h"
#include "meshlearn/ledger/rpc.h"

namespace meshlearn::node {

using nlohmann::json;

namespace {

StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

Status Bad(const std::string& what, const json& j) {
  std::string s = j.dump();
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return DataLoss("ledger answer: " + what + " in " + s);
}

Result<Hash256> HashField(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) return Bad(std::string("no string \"") + key + "\"", j);
  return Hash256::FromHex(j[key].get<std::string>(), key);
}
Result<PublicKey> KeyField(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) return Bad(std::string("no string \"") + key + "\"", j);
  return PublicKey::FromHex(j[key].get<std::string>(), key);
}
Result<uint64_t> U64Field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) {
    if (j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0) {
      return j[key].get<uint64_t>();
    }
    return Bad(std::string("no unsigned integer \"") + key + "\"", j);
  }
  return j[key].get<uint64_t>();
}
Result<uint32_t> U32Field(const json& j, const char* key) {
  ML_ASSIGN_OR_RETURN(uint64_t v, U64Field(j, key));
  if (v > 0xffffffffu) return Bad(std::string("\"") + key + "\" out of range", j);
  return static_cast<uint32_t>(v);
}

Result<NodeInfo> ParseNode(const json& j) {
  NodeInfo n;
  ML_ASSIGN_OR_RETURN(n.id, KeyField(j, "id"));
  ML_ASSIGN_OR_RETURN(n.owner, KeyField(j, "owner"));
  n.endpoint = j.value("endpoint", std::string());
  n.roles = j.value("roles", 0u);
  n.status = j.value("status", std::string());
  n.stake = j.value("stake", uint64_t{0});
  n.price = j.value("price", uint64_t{0});
  n.last_heartbeat_height = j.value("last_heartbeat_height", uint64_t{0});
  return n;
}

// One entry of node_work "checks": a unit JSON with "check", "roles", "start_state",
// "solver_endpoint" (ledger/rpc.h).
Result<CheckAssignment> ParseCheck(const json& u) {
  CheckAssignment a;
  ML_ASSIGN_OR_RETURN(a.task_id, HashField(u, "task_id"));
  ML_ASSIGN_OR_RETURN(a.index, U32Field(u, "index"));
  ML_ASSIGN_OR_RETURN(a.round, U32Field(u, "round"));
  ML_ASSIGN_OR_RETURN(a.shard, U32Field(u, "shard"));
  ML_ASSIGN_OR_RETURN(a.result_hash, HashField(u, "result_hash"));
  ML_ASSIGN_OR_RETURN(a.commitment, HashField(u, "commitment"));
  ML_ASSIGN_OR_RETURN(a.assignment_beacon, HashField(u, "assignment_beacon"));
  ML_ASSIGN_OR_RETURN(a.secret_index, U64Field(u, "secret_index"));
  ML_ASSIGN_OR_RETURN(a.start_state, HashField(u, "start_state"));
  a.solver_endpoint = u.value("solver_endpoint", std::string());
  if (u.contains("leaves") && u["leaves"].is_array()) {
    for (const json& l : u["leaves"]) {
      if (!l.is_string()) return Bad("a leaf that is not a string", u);
      ML_ASSIGN_OR_RETURN(Hash256 h, Hash256::FromHex(l.get<std::string>(), "leaves"));
      a.leaves.push_back(h);
    }
  }
  if (u.contains("roles") && u["roles"].is_array()) {
    for (const json& r : u["roles"]) {
      if (r.is_string()) a.roles.push_back(r.get<std::string>());
    }
  }
  if (!u.contains("check") || !u["check"].is_object()) return Bad("no object \"check\"", u);
  const json& c = u["check"];
  a.stage = c.value("stage", std::string());
  a.result = c.value("result", std::string());
  ML_ASSIGN_OR_RETURN(a.solver, KeyField(c, "solver"));
  ML_ASSIGN_OR_RETURN(a.commit_height, U64Field(c, "commit_height"));
  ML_ASSIGN_OR_RETURN(a.deadline_height, U64Field(c, "deadline_height"));
  ML_ASSIGN_OR_RETURN(a.num_segments, U32Field(c, "num_segments"));
  if (c.contains("verifiers") && c["verifiers"].is_array()) {
    for (const json& v : c["verifiers"]) {
      if (!v.is_string()) return Bad("a verifier that is not a string", c);
      ML_ASSIGN_OR_RETURN(PublicKey k, PublicKey::FromHex(v.get<std::string>(), "verifier"));
      a.verifiers.push_back(k);
    }
  }
  if (c.contains("segments") && c["segments"].is_array()) {
    for (const json& s : c["segments"]) {
      if (!s.is_number_unsigned() || s.get<uint64_t>() >= a.num_segments) {
        return Bad("a segment out of range", c);
      }
      a.segments.push_back(s.get<uint32_t>());
    }
  }
  if (c.contains("dispute") && c["dispute"].is_object()) {
    const json& d = c["dispute"];
    DisputeView v;
    v.stage = d.value("stage", std::string());
    ML_ASSIGN_OR_RETURN(v.defender, KeyField(d, "defender"));
    ML_ASSIGN_OR_RETURN(v.challenger, KeyField(d, "challenger"));
    ML_ASSIGN_OR_RETURN(v.first_step, U64Field(d, "first_step"));
    ML_ASSIGN_OR_RETURN(v.last_step, U64Field(d, "last_step"));
    ML_ASSIGN_OR_RETURN(v.agreed, HashField(d, "agreed"));
    if (d.contains("query") && d["query"].is_object()) {
      v.has_query = true;
      ML_ASSIGN_OR_RETURN(v.position, U64Field(d["query"], "position"));
      ML_ASSIGN_OR_RETURN(v.query_deadline, U64Field(d["query"], "deadline_height"));
    }
    if (d.contains("referee") && d["referee"].is_object()) {
      const json& r = d["referee"];
      v.has_referee = true;
      v.referee.whole_step = r.value("whole_step", false);
      v.referee.segment = r.value("segment", false);
      ML_ASSIGN_OR_RETURN(v.referee.first_step, U64Field(r, "first_step"));
      ML_ASSIGN_OR_RETURN(v.referee.step, U64Field(r, "step"));
      v.referee.operator_index = r.value("operator_index", 0u);
      ML_ASSIGN_OR_RETURN(v.referee.input, HashField(r, "input"));
      ML_ASSIGN_OR_RETURN(v.referee.defender_output, HashField(r, "defender_output"));
      ML_ASSIGN_OR_RETURN(v.referee.challenger_output, HashField(r, "challenger_output"));
    }
    a.dispute = std::move(v);
  }
  return a;
}

}  // namespace

bool CheckAssignment::HasRole(std::string_view role) const {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

Result<json> RpcResultOrStatus(const json& response) {
  if (!response.is_object()) return DataLoss("ledger answer is not a JSON object");
  if (response.contains("error")) {
    const json& e = response["error"];
    StatusCode code = StatusCode::kInternal;
    if (e.is_object() && e.contains("data") && e["data"].is_object() &&
        e["data"].contains("status") && e["data"]["status"].is_string()) {
      code = CodeFromName(e["data"]["status"].get<std::string>());
    }
    std::string msg = e.is_object() ? e.value("message", std::string("ledger error")) : "ledger error";
    return Status(code, msg);
  }
  if (!response.contains("result")) return DataLoss("ledger answer has no result");
  return response["result"];
}

Result<json> InProcessChainClient::Call(const std::string& method, const json& params) {
  json req = json::object();
  req["jsonrpc"] = "2.0";
  req["id"] = next_id_.fetch_add(1);
  req["method"] = method;
  req["params"] = params.is_null() ? json::object() : params;
  return RpcResultOrStatus(service_->HandleRpc(req));
}

Result<ChainStatusInfo> GetChainStatus(ChainClient& chain) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("chain_status", json::object()));
  ChainStatusInfo s;
  s.chain_id = j.value("chain_id", std::string());
  ML_ASSIGN_OR_RETURN(s.height, U64Field(j, "height"));
  if (s.chain_id.empty()) return Bad("no chain_id", j);
  return s;
}

Result<uint64_t> WaitForBlockAbove(ChainClient& chain, uint64_t after, int64_t timeout_ms) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("wait_block", {{"after", after}, {"timeout_ms", timeout_ms}}));
  return U64Field(j, "height");
}

Result<std::optional<NodeInfo>> GetNode(ChainClient& chain, const PublicKey& id) {
  Result<json> j = chain.Call("get_node", {{"id", id.ToHex()}});
  if (!j.ok()) {
    if (j.status().code() == StatusCode::kNotFound) return std::optional<NodeInfo>();
    return j.status();
  }
  ML_ASSIGN_OR_RETURN(NodeInfo n, ParseNode(*j));
  return std::optional<NodeInfo>(std::move(n));
}

Result<std::vector<NodeInfo>> ListNodes(ChainClient& chain) {
  std::vector<NodeInfo> out;
  json cursor = 0;
  for (int page = 0; page < 100000; ++page) {
    ML_ASSIGN_OR_RETURN(json j, chain.Call("list_nodes", {{"cursor", cursor}, {"limit", 100}}));
    if (!j.contains("items") || !j["items"].is_array()) return Bad("no items", j);
    for (const json& n : j["items"]) {
      ML_ASSIGN_OR_RETURN(NodeInfo info, ParseNode(n));
      out.push_back(std::move(info));
    }
    if (!j.contains("next_cursor") || j["next_cursor"].is_null()) break;
    cursor = j["next_cursor"];
  }
  return out;
}

std::vector<std::string> ActiveEndpoints(const std::vector<NodeInfo>& nodes,
                                         const std::string& self) {
  std::vector<std::string> out;
  for (const NodeInfo& n : nodes) {
    if (n.status == "active" && !n.endpoint.empty() && n.endpoint != self) {
      out.push_back(n.endpoint);
    }
  }
  return out;
}

Result<NodeWork> ParseNodeWork(const json& j) {
  NodeWork w;
  ML_ASSIGN_OR_RETURN(w.height, U64Field(j, "height"));
  if (j.contains("units") && j["units"].is_array()) {
    for (const json& u : j["units"]) {
      UnitAssignment a;
      ML_ASSIGN_OR_RETURN(a.task_id, HashField(u, "task_id"));
      ML_ASSIGN_OR_RETURN(a.index, U32Field(u, "index"));
      ML_ASSIGN_OR_RETURN(a.round, U32Field(u, "round"));
      ML_ASSIGN_OR_RETURN(a.shard, U32Field(u, "shard"));
      ML_ASSIGN_OR_RETURN(a.deadline_height, U64Field(u, "deadline_height"));
      ML_ASSIGN_OR_RETURN(a.start_state, HashField(u, "start_state"));
      if (u.contains("assignment_beacon")) {
        ML_ASSIGN_OR_RETURN(a.assignment_beacon, HashField(u, "assignment_beacon"));
      }
      w.units.push_back(a);
    }
  }
  if (j.contains("aggregations") && j["aggregations"].is_array()) {
    for (const json& g : j["aggregations"]) {
      AggregationAssignment a;
      ML_ASSIGN_OR_RETURN(a.task_id, HashField(g, "task_id"));
      ML_ASSIGN_OR_RETURN(a.round, U32Field(g, "round"));
      ML_ASSIGN_OR_RETURN(a.deadline_height, U64Field(g, "deadline_height"));
      ML_ASSIGN_OR_RETURN(a.start_state, HashField(g, "start_state"));
      if (g.contains("units") && g["units"].is_array()) {
        for (const json& u : g["units"]) {
          AggregationInput in;
          ML_ASSIGN_OR_RETURN(in.index, U32Field(u, "index"));
          ML_ASSIGN_OR_RETURN(in.shard, U32Field(u, "shard"));
          ML_ASSIGN_OR_RETURN(in.node, KeyField(u, "node"));
          ML_ASSIGN_OR_RETURN(in.result_hash, HashField(u, "result_hash"));
          a.units.push_back(in);
        }
      }
      w.aggregations.push_back(std::move(a));
    }
  }
  if (j.contains("checks") && j["checks"].is_array()) {
    for (const json& c : j["checks"]) {
      ML_ASSIGN_OR_RETURN(CheckAssignment a, ParseCheck(c));
      w.checks.push_back(std::move(a));
    }
  }
  if (j.contains("next_secret_index")) {
    ML_ASSIGN_OR_RETURN(w.next_secret_index, U64Field(j, "next_secret_index"));
  }
  return w;
}

Result<NodeWork> GetNodeWork(ChainClient& chain, const PublicKey& node) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("node_work", {{"id", node.ToHex()}}));
  return ParseNodeWork(j);
}

Result<TaskInfo> GetTask(ChainClient& chain, const Hash256& id, bool units) {
  json params = {{"id", id.ToHex()}};
  if (units) params["units"] = true;
  ML_ASSIGN_OR_RETURN(json j, chain.Call("get_task", params));
  TaskInfo t;
  t.id = id;
  ML_ASSIGN_OR_RETURN(t.spec_hash, HashField(j, "spec_hash"));
  t.status = j.value("status", std::string());
  if (j.contains("final_state") && j["final_state"].is_string()) {
    ML_ASSIGN_OR_RETURN(t.final_state, HashField(j, "final_state"));
  }
  t.raw = std::move(j);
  return t;
}

// ---- TxSender --------------------------------------------------------------------------------

TxSender::TxSender(ChainClient* chain, KeyPair signer, TxSenderOptions options)
    : chain_(chain), signer_(std::move(signer)), options_(std::move(options)) {}

Status TxSender::Resync() {
  ML_ASSIGN_OR_RETURN(json acct, chain_->Call("get_account", {{"address", sender().ToHex()}}));
  uint64_t nonce = acct.value("nonce", uint64_t{0});
  uint64_t next = nonce;
  for (const auto& [n, f] : in_flight_) next = std::max(next, n + 1);
  next_nonce_ = next;
  resync_ = false;
  return Status::Ok();
}

Status TxSender::Init() {
  ML_ASSIGN_OR_RETURN(ChainStatusInfo st, GetChainStatus(*chain_));
  chain_id_ = st.chain_id;
  if (!initialized_ && options_.env && !options_.outbox_path.empty() &&
      options_.env->FileExists(options_.outbox_path)) {
    ML_ASSIGN_OR_RETURN(std::string text, options_.env->ReadFile(options_.outbox_path));
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.empty()) continue;
      Result<Bytes> wire = HexDecode(line, "outbox");
      if (!wire.ok()) continue;  // a damaged line cannot be resent
      Result<ledger::Transaction> tx = ledger::DecodeTx(*wire);
      if (!tx.ok() || tx->sender != sender() || tx->chain_id != chain_id_) continue;
      InFlight f{*tx, *wire, ledger::TxIdOfEncoded(*wire)};
      in_flight_[tx->nonce] = std::move(f);
    }
  }
  ML_RETURN_IF_ERROR(Resync());
  initialized_ = true;
  for (const auto& [n, f] : in_flight_) {
    Status s = Submit(f);
    (void)s;  // Poll sorts out what happened
  }
  return Status::Ok();
}

Status TxSender::SaveOutbox() {
  if (!options_.env || options_.outbox_path.empty()) return Status::Ok();
  std::string text;
  for (const auto& [n, f] : in_flight_) text += HexEncode(f.wire) + "\n";
  return options_.env->WriteFileAtomic(options_.outbox_path, text, 0600);
}

Status TxSender::Submit(const InFlight& f) {
  return chain_->Call("send_tx", {{"tx", HexEncode(f.wire)}}).status();
}

bool TxSender::IsInFlight(const Hash256& id) const {
  for (const auto& [n, f] : in_flight_) {
    if (f.id == id) return true;
  }
  return false;
}

bool TxSender::HasInFlight(ledger::TxType type) const {
  for (const auto& [n, f] : in_flight_) {
    if (ledger::PayloadType(f.tx.payload) == type) return true;
  }
  return false;
}

Result<Hash256> TxSender::Send(ledger::TxPayload payload) {
  if (!initialized_) ML_RETURN_IF_ERROR(Init());
  if (resync_ && in_flight_.empty()) ML_RETURN_IF_ERROR(Resync());
  if (in_flight_.size() >= options_.max_in_flight) {
    return ResourceExhausted("too many transactions in flight (" +
                             std::to_string(in_flight_.size()) + "); wait for a block");
  }
  ledger::Transaction tx = ledger::BuildSignedTx(signer_, chain_id_, next_nonce_, payload);
  InFlight f{tx, ledger::EncodeTx(tx), ledger::TxId(tx)};
  Status s = Submit(f);
  // Another client of the same key (e.g. `node leave` next to the daemon) holds this nonce in
  // the mempool: take the next one.
  for (int bump = 0; bump < 16 && !s.ok() && s.code() == StatusCode::kFailedPrecondition &&
                     s.message().find("already taken") != std::string::npos;
       ++bump) {
    ++next_nonce_;
    tx = ledger::BuildSignedTx(signer_, chain_id_, next_nonce_, payload);
    f = InFlight{tx, ledger::EncodeTx(tx), ledger::TxId(tx)};
    s = Submit(f);
  }
  if (!s.ok() && s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) {
    // Refused outright: the nonce is unused. Re-read it in case it was wrong.
    resync_ = true;
    if (in_flight_.empty()) (void)Resync();
    return s.WithPrefix(std::string(ledger::TxTypeName(ledger::PayloadType(tx.payload))));
  }
  ++next_nonce_;
  Hash256 id = f.id;
  in_flight_[tx.nonce] = std::move(f);
  ML_RETURN_IF_ERROR(SaveOutbox());
  return id;
}

Status TxSender::Poll() {
  if (in_flight_.empty()) return Status::Ok();
  bool changed = false;
  Status last;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& f = it->second;
    Result<json> j = chain_->Call("get_tx", {{"id", f.id.ToHex()}});
    if (!j.ok()) {
      last = j.status();
      ++it;
      continue;
    }
    std::string status = j->value("status", std::string());
    TxOutcome o;
    o.id = f.id;
    o.type = std::string(ledger::TxTypeName(ledger::PayloadType(f.tx.payload)));
    if (status == "included") {
      json r = j->value("receipt", json::object());
      o.included = true;
      o.ok = r.value("ok", false);
      o.height = j->value("height", uint64_t{0});
      o.reason = r.value("reason", std::string());
      outcomes_.push_back(o);
      it = in_flight_.erase(it);
      changed = true;
      continue;
    }
    if (status == "rejected") {
      o.reason = j->contains("error") ? (*j)["error"].value("message", std::string("rejected"))
                                      : "rejected";
      outcomes_.push_back(o);
      it = in_flight_.erase(it);
      resync_ = true;
      changed = true;
      continue;
    }
    if (status == "unknown") {
      // The ledger lost it (restart) or never got it: the same bytes again.
      Status s = Submit(f);
      if (!s.ok() && s.code() != StatusCode::kUnavailable &&
          s.code() != StatusCode::kDeadlineExceeded && s.code() != StatusCode::kResourceExhausted) {
        o.reason = s.message();
        outcomes_.push_back(o);
        it = in_flight_.erase(it);
        resync_ = true;
        changed = true;
        continue;
      }
    }
    ++it;
  }
  if (resync_ && in_flight_.empty()) (void)Resync();
  if (changed) ML_RETURN_IF_ERROR(SaveOutbox());
  return last;
}

std::vector<TxOutcome> TxSender::TakeOutcomes() {
  std::vector<TxOutcome> out;
  out.swap(outcomes_);
  return out;
}

Result<TxOutcome> TxSender::SendAndWait(ledger::TxPayload payload, int64_t timeout_ms,
                                        const std::function<void(int64_t)>& sleep,
                                        int64_t poll_ms) {
  ML_ASSIGN_OR_RETURN(Hash256 id, Send(std::move(payload)));
  for (int64_t waited = 0;; waited += poll_ms) {
    (void)Poll();
    std::vector<TxOutcome> got = TakeOutcomes();
    std::optional<TxOutcome> mine;
    for (TxOutcome& o : got) {
      if (o.id == id) mine = o;
      else outcomes_.push_back(o);
    }
    if (mine) {
      if (!mine->included) return FailedPrecondition(mine->type + " refused: " + mine->reason);
      return *mine;
    }
    if (waited >= timeout_ms) {
      return DeadlineExceeded("transaction " + id.ShortHex() + " not included after " +
                              std::to_string(timeout_ms) + " ms; it stays queued and is resent");
    }
    sleep(poll_ms);
  }
}

}  // namespace meshlearn::node
