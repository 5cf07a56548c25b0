#include "meshlearn/node/chain_client.h"

#include <algorithm>

#include "meshlearn/base/hex.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/rpc_answer.h"

namespace meshlearn::node {

using nlohmann::json;

namespace {

StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

using ledger::RpcAnswer;

Result<NodeInfo> ParseNode(const RpcAnswer& j) {
  NodeInfo n;
  ML_ASSIGN_OR_RETURN(n.id, j.Key("id"));
  ML_ASSIGN_OR_RETURN(n.owner, j.Key("owner"));
  ML_ASSIGN_OR_RETURN(n.endpoint, j.Str("endpoint", ""));
  ML_ASSIGN_OR_RETURN(n.roles, j.U32("roles", 0));
  ML_ASSIGN_OR_RETURN(n.status, j.Str("status", ""));
  ML_ASSIGN_OR_RETURN(n.stake, j.U64("stake", 0));
  ML_ASSIGN_OR_RETURN(n.price, j.U64("price", 0));
  ML_ASSIGN_OR_RETURN(n.last_heartbeat_height, j.U64("last_heartbeat_height", 0));
  return n;
}

// An optional array field: absent or null is empty; anything but an array is an error.
Result<RpcAnswer> OptionalArray(const RpcAnswer& j, std::string_view key) {
  static const json* empty = new json(json::array());
  if (!j.Has(key)) return RpcAnswer(j.method(), *empty, j.path() + "." + std::string(key));
  return j.Array(key);
}

// One entry of node_work "checks": a unit JSON with "check", "roles", "start_state",
// "solver_endpoint" (ledger/rpc.h).
Result<CheckAssignment> ParseCheck(const RpcAnswer& u) {
  CheckAssignment a;
  ML_ASSIGN_OR_RETURN(a.task_id, u.Hash("task_id"));
  ML_ASSIGN_OR_RETURN(a.index, u.U32("index"));
  ML_ASSIGN_OR_RETURN(a.round, u.U32("round"));
  ML_ASSIGN_OR_RETURN(a.shard, u.U32("shard"));
  ML_ASSIGN_OR_RETURN(a.result_hash, u.Hash("result_hash"));
  ML_ASSIGN_OR_RETURN(a.commitment, u.Hash("commitment"));
  ML_ASSIGN_OR_RETURN(a.assignment_beacon, u.Hash("assignment_beacon"));
  ML_ASSIGN_OR_RETURN(a.secret_index, u.U64("secret_index"));
  ML_ASSIGN_OR_RETURN(a.start_state, u.Hash("start_state"));
  ML_ASSIGN_OR_RETURN(a.solver_endpoint, u.Str("solver_endpoint", ""));
  ML_ASSIGN_OR_RETURN(RpcAnswer leaves, OptionalArray(u, "leaves"));
  for (size_t i = 0; i < leaves.size(); ++i) {
    ML_ASSIGN_OR_RETURN(Hash256 h, leaves.At(i).Hash());
    a.leaves.push_back(h);
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer roles, OptionalArray(u, "roles"));
  for (size_t i = 0; i < roles.size(); ++i) {
    ML_ASSIGN_OR_RETURN(std::string r, roles.At(i).Str());
    a.roles.push_back(std::move(r));
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer c, u.Object("check"));
  ML_ASSIGN_OR_RETURN(a.stage, c.Str("stage", ""));
  ML_ASSIGN_OR_RETURN(a.result, c.Str("result", ""));
  ML_ASSIGN_OR_RETURN(a.solver, c.Key("solver"));
  ML_ASSIGN_OR_RETURN(a.commit_height, c.U64("commit_height"));
  ML_ASSIGN_OR_RETURN(a.deadline_height, c.U64("deadline_height"));
  ML_ASSIGN_OR_RETURN(a.num_segments, c.U32("num_segments"));
  ML_ASSIGN_OR_RETURN(RpcAnswer verifiers, OptionalArray(c, "verifiers"));
  for (size_t i = 0; i < verifiers.size(); ++i) {
    ML_ASSIGN_OR_RETURN(PublicKey k, verifiers.At(i).Key());
    a.verifiers.push_back(k);
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer segments, OptionalArray(c, "segments"));
  for (size_t i = 0; i < segments.size(); ++i) {
    ML_ASSIGN_OR_RETURN(uint64_t segment, segments.At(i).U64());
    if (segment >= a.num_segments) {
      return segments.At(i).Bad("", "must be below num_segments " +
                                        std::to_string(a.num_segments));
    }
    a.segments.push_back(static_cast<uint32_t>(segment));
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer d, c.ObjectOrNull("dispute"));
  if (d.raw().is_object()) {
    DisputeView v;
    ML_ASSIGN_OR_RETURN(v.stage, d.Str("stage", ""));
    ML_ASSIGN_OR_RETURN(v.defender, d.Key("defender"));
    ML_ASSIGN_OR_RETURN(v.challenger, d.Key("challenger"));
    ML_ASSIGN_OR_RETURN(v.first_step, d.U64("first_step"));
    ML_ASSIGN_OR_RETURN(v.last_step, d.U64("last_step"));
    ML_ASSIGN_OR_RETURN(v.agreed, d.Hash("agreed"));
    ML_ASSIGN_OR_RETURN(RpcAnswer q, d.ObjectOrNull("query"));
    if (q.raw().is_object()) {
      v.has_query = true;
      ML_ASSIGN_OR_RETURN(v.position, q.U64("position"));
      ML_ASSIGN_OR_RETURN(v.query_deadline, q.U64("deadline_height"));
    }
    ML_ASSIGN_OR_RETURN(RpcAnswer r, d.ObjectOrNull("referee"));
    if (r.raw().is_object()) {
      v.has_referee = true;
      ML_ASSIGN_OR_RETURN(v.referee.whole_step, r.Bool("whole_step", false));
      ML_ASSIGN_OR_RETURN(v.referee.segment, r.Bool("segment", false));
      ML_ASSIGN_OR_RETURN(v.referee.first_step, r.U64("first_step"));
      ML_ASSIGN_OR_RETURN(v.referee.step, r.U64("step"));
      ML_ASSIGN_OR_RETURN(v.referee.operator_index, r.U32("operator_index", 0));
      ML_ASSIGN_OR_RETURN(v.referee.input, r.Hash("input"));
      ML_ASSIGN_OR_RETURN(v.referee.defender_output, r.Hash("defender_output"));
      ML_ASSIGN_OR_RETURN(v.referee.challenger_output, r.Hash("challenger_output"));
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
    RpcAnswer e("a call", response["error"], "error");
    StatusCode code = StatusCode::kInternal;
    Result<RpcAnswer> data = e.ObjectOrNull("data");
    if (data.ok()) {
      Result<std::string> name = data->Str("status", "");
      if (name.ok() && !name->empty()) code = CodeFromName(*name);
    }
    Result<std::string> msg = e.Str("message", "ledger error");
    return Status(code, msg.ok() ? *msg : "ledger error");
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
  RpcAnswer a("chain_status", j);
  ChainStatusInfo s;
  ML_ASSIGN_OR_RETURN(s.chain_id, a.Str("chain_id"));
  ML_ASSIGN_OR_RETURN(s.height, a.U64("height"));
  if (s.chain_id.empty()) return a.Bad("chain_id", "must not be empty");
  return s;
}

Result<uint64_t> WaitForBlockAbove(ChainClient& chain, uint64_t after, int64_t timeout_ms) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("wait_block", {{"after", after}, {"timeout_ms", timeout_ms}}));
  return RpcAnswer("wait_block", j).U64("height");
}

Result<std::optional<NodeInfo>> GetNode(ChainClient& chain, const PublicKey& id) {
  Result<json> j = chain.Call("get_node", {{"id", id.ToHex()}});
  if (!j.ok()) {
    if (j.status().code() == StatusCode::kNotFound) return std::optional<NodeInfo>();
    return j.status();
  }
  ML_ASSIGN_OR_RETURN(NodeInfo n, ParseNode(RpcAnswer("get_node", *j)));
  return std::optional<NodeInfo>(std::move(n));
}

Result<std::vector<NodeInfo>> ListNodes(ChainClient& chain) {
  std::vector<NodeInfo> out;
  uint64_t cursor = 0;
  for (int page = 0; page < 100000; ++page) {
    ML_ASSIGN_OR_RETURN(json j, chain.Call("list_nodes", {{"cursor", cursor}, {"limit", 100}}));
    RpcAnswer a("list_nodes", j);
    ML_ASSIGN_OR_RETURN(RpcAnswer items, a.Array("items"));
    for (size_t i = 0; i < items.size(); ++i) {
      ML_ASSIGN_OR_RETURN(NodeInfo info, ParseNode(items.At(i)));
      out.push_back(std::move(info));
    }
    if (!a.Has("next_cursor")) break;
    ML_ASSIGN_OR_RETURN(uint64_t next, a.U64("next_cursor"));
    if (next <= cursor) return a.Bad("next_cursor", "must move forward");
    cursor = next;
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
  RpcAnswer a("node_work", j);
  NodeWork w;
  ML_ASSIGN_OR_RETURN(w.height, a.U64("height"));
  ML_ASSIGN_OR_RETURN(RpcAnswer units, OptionalArray(a, "units"));
  for (size_t i = 0; i < units.size(); ++i) {
    RpcAnswer u = units.At(i);
    UnitAssignment x;
    ML_ASSIGN_OR_RETURN(x.task_id, u.Hash("task_id"));
    ML_ASSIGN_OR_RETURN(x.index, u.U32("index"));
    ML_ASSIGN_OR_RETURN(x.round, u.U32("round"));
    ML_ASSIGN_OR_RETURN(x.shard, u.U32("shard"));
    ML_ASSIGN_OR_RETURN(x.deadline_height, u.U64("deadline_height"));
    ML_ASSIGN_OR_RETURN(x.start_state, u.Hash("start_state"));
    if (u.Has("assignment_beacon")) {
      ML_ASSIGN_OR_RETURN(x.assignment_beacon, u.Hash("assignment_beacon"));
    }
    w.units.push_back(x);
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer aggregations, OptionalArray(a, "aggregations"));
  for (size_t i = 0; i < aggregations.size(); ++i) {
    RpcAnswer g = aggregations.At(i);
    AggregationAssignment x;
    ML_ASSIGN_OR_RETURN(x.task_id, g.Hash("task_id"));
    ML_ASSIGN_OR_RETURN(x.round, g.U32("round"));
    ML_ASSIGN_OR_RETURN(x.deadline_height, g.U64("deadline_height"));
    ML_ASSIGN_OR_RETURN(x.start_state, g.Hash("start_state"));
    ML_ASSIGN_OR_RETURN(RpcAnswer inputs, OptionalArray(g, "units"));
    for (size_t k = 0; k < inputs.size(); ++k) {
      RpcAnswer u = inputs.At(k);
      AggregationInput in;
      ML_ASSIGN_OR_RETURN(in.index, u.U32("index"));
      ML_ASSIGN_OR_RETURN(in.shard, u.U32("shard"));
      ML_ASSIGN_OR_RETURN(in.node, u.Key("node"));
      ML_ASSIGN_OR_RETURN(in.result_hash, u.Hash("result_hash"));
      x.units.push_back(in);
    }
    w.aggregations.push_back(std::move(x));
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer checks, OptionalArray(a, "checks"));
  for (size_t i = 0; i < checks.size(); ++i) {
    ML_ASSIGN_OR_RETURN(CheckAssignment x, ParseCheck(checks.At(i)));
    w.checks.push_back(std::move(x));
  }
  ML_ASSIGN_OR_RETURN(w.next_secret_index, a.U64("next_secret_index", 0));
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
  RpcAnswer a("get_task", j);
  TaskInfo t;
  t.id = id;
  ML_ASSIGN_OR_RETURN(t.spec_hash, a.Hash("spec_hash"));
  ML_ASSIGN_OR_RETURN(t.status, a.Str("status", ""));
  if (a.Has("final_state")) {
    ML_ASSIGN_OR_RETURN(t.final_state, a.Hash("final_state"));
  }
  t.raw = std::move(j);
  return t;
}

// ---- TxSender --------------------------------------------------------------------------------

TxSender::TxSender(ChainClient* chain, KeyPair signer, TxSenderOptions options)
    : chain_(chain), signer_(std::move(signer)), options_(std::move(options)) {}

Status TxSender::Resync() {
  ML_ASSIGN_OR_RETURN(json acct, chain_->Call("get_account", {{"address", sender().ToHex()}}));
  ML_ASSIGN_OR_RETURN(uint64_t nonce, RpcAnswer("get_account", acct).U64("nonce", 0));
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
    // A get_tx answer that does not decode leaves the transaction in flight: asked again next
    // Poll, and reported as this Poll's error.
    RpcAnswer a("get_tx", *j);
    Result<std::string> status = a.Str("status");
    if (!status.ok()) {
      last = status.status();
      ++it;
      continue;
    }
    TxOutcome o;
    o.id = f.id;
    o.type = std::string(ledger::TxTypeName(ledger::PayloadType(f.tx.payload)));
    if (*status == "included") {
      Result<RpcAnswer> receipt = a.Object("receipt");
      Result<bool> ok = receipt.ok() ? receipt->Bool("ok") : Result<bool>(receipt.status());
      Result<uint64_t> height = a.U64("height", 0);
      Result<std::string> reason =
          receipt.ok() ? receipt->Str("reason", "") : Result<std::string>(receipt.status());
      for (const Status& s : {ok.status(), height.status(), reason.status()}) {
        if (!s.ok()) last = s;
      }
      if (!ok.ok() || !height.ok() || !reason.ok()) {
        ++it;
        continue;
      }
      o.included = true;
      o.ok = *ok;
      o.height = *height;
      o.reason = *reason;
      outcomes_.push_back(o);
      it = in_flight_.erase(it);
      changed = true;
      continue;
    }
    if (*status == "rejected") {
      Result<RpcAnswer> error = a.ObjectOrNull("error");
      Result<std::string> why = error.ok() ? error->Str("message", "rejected")
                                           : Result<std::string>(std::string("rejected"));
      o.reason = why.ok() ? *why : "rejected";
      outcomes_.push_back(o);
      it = in_flight_.erase(it);
      resync_ = true;
      changed = true;
      continue;
    }
    if (*status == "unknown") {
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
