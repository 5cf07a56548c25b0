#include "meshlearn/ledger/rpc.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iterator>
#include <limits>
#include <optional>

#include "meshlearn/base/hex.h"
#include "meshlearn/base/log.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/unit_check.h"
#include "stage_disk.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;

int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Every method Dispatch answers.
constexpr std::string_view kMethods[] = {
    "chain_status", "send_tx",      "get_tx",       "get_block",  "get_blocks",  "get_block_txs",
    "get_account",  "get_node",     "get_task",     "node_work",  "referee_work",
    "list_nodes",   "list_tasks",   "account_history", "wait_block", "get_genesis"};

// An error answer, thrown inside this file only (HandleOne catches it) so the handlers read as
// straight-line code.
struct RpcError {
  int code;
  std::string message;
  StatusCode status;
};

[[noreturn]] void Fail(int code, std::string message, StatusCode status) {
  throw RpcError{code, std::move(message), status};
}
[[noreturn]] void BadParam(const std::string& message) {
  Fail(kRpcInvalidParams, message, StatusCode::kInvalidArgument);
}

int RpcCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound: return kRpcNotFound;
    case StatusCode::kResourceExhausted: return kRpcLimitExceeded;
    case StatusCode::kUnavailable: return kRpcUnavailable;
    case StatusCode::kInternal:
    case StatusCode::kDataLoss: return kRpcInternalError;
    default: return kRpcTxRejected;
  }
}

[[noreturn]] void FailStatus(const Status& s, int code) { Fail(code, s.message(), s.code()); }

// Typed access to params, with errors that name the parameter and what it should be.
class Params {
 public:
  Params(const std::string& method, const json& p) : method_(method), p_(p) {}

  bool Has(const char* name) const { return p_.contains(name) && !p_[name].is_null(); }

  uint64_t U64(const char* name) const {
    if (!Has(name)) BadParam(Where(name) + " is required (a non-negative integer)");
    const json& v = p_[name];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      BadParam(Where(name) + " must be a non-negative integer, got " + Short(v));
    }
    return v.get<uint64_t>();
  }
  uint64_t U64(const char* name, uint64_t def) const { return Has(name) ? U64(name) : def; }

  bool Bool(const char* name, bool def) const {
    if (!Has(name)) return def;
    if (!p_[name].is_boolean()) BadParam(Where(name) + " must be true or false, got " + Short(p_[name]));
    return p_[name].get<bool>();
  }

  std::string Str(const char* name) const {
    if (!Has(name)) BadParam(Where(name) + " is required (a string)");
    if (!p_[name].is_string()) BadParam(Where(name) + " must be a string, got " + Short(p_[name]));
    return p_[name].get<std::string>();
  }

  PublicKey Key(const char* name) const {
    Result<PublicKey> k = PublicKey::FromHex(Str(name), Where(name));
    if (!k.ok()) BadParam(k.status().message());
    return *k;
  }
  Hash256 Hash(const char* name) const {
    Result<Hash256> h = Hash256::FromHex(Str(name), Where(name));
    if (!h.ok()) BadParam(h.status().message());
    return *h;
  }

  // Every key must be one of `known`: a typo is an error, not silently ignored.
  void Only(std::initializer_list<const char*> known) const {
    for (auto it = p_.begin(); it != p_.end(); ++it) {
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
        BadParam(method_ + ": unknown parameter '" + it.key() + "' (known: " +
                 (list.empty() ? "none" : list) + ")");
      }
    }
  }

 private:
  std::string Where(const char* name) const { return method_ + ": params." + name; }
  static std::string Short(const json& v) {
    std::string s = v.dump();
    return s.size() > 40 ? s.substr(0, 40) + "..." : s;
  }
  const std::string& method_;
  const json& p_;
};

struct Page {
  uint64_t offset;
  uint64_t limit;
};

Page GetPage(const Params& p, const RpcLimits& limits) {
  uint64_t limit = p.U64("limit", limits.default_page);
  if (limit == 0 || limit > static_cast<uint64_t>(limits.max_page)) {
    BadParam("params.limit must be 1.." + std::to_string(limits.max_page) + ", got " +
             std::to_string(limit));
  }
  return {p.U64("cursor", 0), limit};
}

json PageResult(json items, const Page& page) {
  size_t n = items.size();
  json next = n == page.limit ? json(page.offset + n) : json(nullptr);
  return {{"items", std::move(items)}, {"next_cursor", next}};
}

template <typename T>
T OrFail(Result<T> r) {
  if (!r.ok()) FailStatus(r.status(), RpcCodeFor(r.status()));
  return std::move(r).value();
}

}  // namespace

json RpcErrorResponse(const json& id, int code, const std::string& message, StatusCode status) {
  return {{"jsonrpc", "2.0"},
          {"id", id},
          {"error",
           {{"code", code},
            {"message", message},
            {"data", {{"status", std::string(StatusCodeName(status))}}}}}};
}

bool JsonTooDeep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

RpcService::RpcService(SharedChain* chain, Sequencer* sequencer, RpcLimits limits,
                       RpcServiceInfo info)
    : chain_(chain), sequencer_(sequencer), limits_(limits), info_(std::move(info)) {}

void RpcService::Shutdown() { chain_->Shutdown(); }

std::string RpcService::HandleBody(std::string_view body) {
  if (body.size() > limits_.max_body_bytes) {
    return RpcErrorResponse(nullptr, kRpcLimitExceeded,
                            "request body is " + std::to_string(body.size()) +
                                " bytes, over the limit of " +
                                std::to_string(limits_.max_body_bytes) + "; send less per request",
                            StatusCode::kResourceExhausted)
        .dump();
  }
  if (JsonTooDeep(body, limits_.max_json_depth)) {
    return RpcErrorResponse(nullptr, kRpcLimitExceeded,
                            "request JSON nests deeper than " +
                                std::to_string(limits_.max_json_depth) + " levels; flatten it",
                            StatusCode::kResourceExhausted)
        .dump();
  }
  json request = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) {
    return RpcErrorResponse(nullptr, kRpcParseError,
                            "request body is not valid JSON; send a JSON-RPC 2.0 object like "
                            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"chain_status\"}",
                            StatusCode::kInvalidArgument)
        .dump();
  }
  // Invalid UTF-8 in a string we echo back would make dump() throw; replace it instead.
  return HandleRpc(request).dump(-1, ' ', false, json::error_handler_t::replace);
}

json RpcService::HandleRpc(const json& request) {
  const int64_t wait_deadline_ms = SteadyNowMs() + limits_.max_wait_ms;
  if (!request.is_array()) return HandleOne(request, wait_deadline_ms);
  if (request.empty()) {
    return RpcErrorResponse(nullptr, kRpcInvalidRequest, "empty batch: send at least one request",
                            StatusCode::kInvalidArgument);
  }
  if (request.size() > limits_.max_batch) {
    return RpcErrorResponse(nullptr, kRpcLimitExceeded,
                            "batch of " + std::to_string(request.size()) +
                                " requests is over the limit of " +
                                std::to_string(limits_.max_batch) + "; split it",
                            StatusCode::kResourceExhausted);
  }
  json out = json::array();
  for (const json& r : request) out.push_back(HandleOne(r, wait_deadline_ms));
  return out;
}

json RpcService::HandleOne(const json& request, int64_t wait_deadline_ms) {
  // For GET /metrics: a method this service has (else "unknown", or "invalid" when the request
  // has none), so a client cannot grow the label set.
  std::string method_label = "invalid";
  json answer = AnswerOne(request, wait_deadline_ms, &method_label);
  const json* error = answer.contains("error") ? &answer["error"] : nullptr;
  requests_.Add({method_label, error ? std::to_string(error->value("code", 0)) : "ok"});
  return answer;
}

json RpcService::AnswerOne(const json& request, int64_t wait_deadline_ms,
                           std::string* method_label) {
  json id = nullptr;
  try {
    if (!request.is_object()) {
      Fail(kRpcInvalidRequest, "a request must be a JSON object with jsonrpc, id, method, params",
           StatusCode::kInvalidArgument);
    }
    if (request.contains("id")) {
      const json& rid = request["id"];
      if (rid.is_string() || rid.is_number() || rid.is_null()) id = rid;
      else Fail(kRpcInvalidRequest, "id must be a string, a number or null", StatusCode::kInvalidArgument);
    }
    if (!request.contains("jsonrpc") || request["jsonrpc"] != "2.0") {
      Fail(kRpcInvalidRequest, "jsonrpc must be \"2.0\"", StatusCode::kInvalidArgument);
    }
    if (!request.contains("method") || !request["method"].is_string()) {
      Fail(kRpcInvalidRequest, "method must be a string (e.g. \"chain_status\")",
           StatusCode::kInvalidArgument);
    }
    json params = json::object();
    if (request.contains("params") && !request["params"].is_null()) {
      params = request["params"];
      if (!params.is_object()) {
        Fail(kRpcInvalidParams, "params must be an object of named parameters",
             StatusCode::kInvalidArgument);
      }
    }
    const std::string& method = request["method"].get_ref<const std::string&>();
    *method_label = std::find(std::begin(kMethods), std::end(kMethods), method) !=
                            std::end(kMethods)
                        ? method
                        : "unknown";
    json result = Dispatch(method, params, wait_deadline_ms);
    return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
  } catch (const RpcError& e) {
    return RpcErrorResponse(id, e.code, e.message, e.status);
  } catch (const std::exception& e) {
    // A bug, not bad input: say so, and keep serving.
    ML_LOG_ERROR("rpc: internal error: {}", e.what());
    return RpcErrorResponse(id, kRpcInternalError, std::string("internal error: ") + e.what(),
                            StatusCode::kInternal);
  }
}

json RpcService::Dispatch(const std::string& method, const json& params,
                          int64_t wait_deadline_ms) {
  Params p(method, params);
  // What is left of this request's (or batch's) long-poll time.
  auto wait_left_ms = [&](uint64_t asked) {
    int64_t left = std::max<int64_t>(0, wait_deadline_ms - SteadyNowMs());
    return std::min<int64_t>(left, static_cast<int64_t>(asked));
  };

  // Read-after-apply on a replicated chain's standby (cluster.h). chain_status is the
  // candidate's own view (answered even when etcd is not reachable); send_tx and faucet are not
  // reads (a standby refuses them).
  if (info_.read_barrier && method != "chain_status" && method != "get_genesis" &&
      method != "send_tx" && method != "faucet") {
    Status ready = info_.read_barrier();
    if (!ready.ok()) FailStatus(ready.WithPrefix(method), kRpcUnavailable);
  }

  if (method == "chain_status") {
    p.Only({});
    json j = chain_->With([&](Chain& c) {
      const Genesis& g = c.genesis();
      return json{{"chain_id", g.chain_id},
                  {"genesis_hash", c.genesis_hash().ToHex()},
                  {"height", c.Height()},
                  {"state_hash", c.StateHash().ToHex()},
                  {"last_block_hash", c.LastBlockHash().ToHex()},
                  {"last_block_time_ms", c.LastBlockTime()},
                  {"block_interval_ms", g.block_interval_ms},
                  {"sequencer", g.sequencer.ToHex()},
                  {"faucet", g.faucet},
                  {"totals", TotalsToJson(c.GetTotals())}};
    });
    j["role"] = info_.role;
    if (!info_.upstream.empty()) j["upstream"] = info_.upstream;
    if (info_.cluster_status) j["cluster"] = info_.cluster_status();
    if (sequencer_) {
      j["mempool"] = sequencer_->mempool_size();
      j["sequencer_key"] = sequencer_->public_key().ToHex();
    }
    return j;
  }

  if (method == "send_tx") {
    p.Only({"tx", "wait_ms"});
    std::string hex = p.Str("tx");
    if (hex.size() > 2 * kMaxLargeTxBytes) {
      Fail(kRpcLimitExceeded,
           "send_tx: params.tx is " + std::to_string(hex.size() / 2) +
               " bytes, over the transaction limit of " + std::to_string(kMaxLargeTxBytes),
           StatusCode::kResourceExhausted);
    }
    Result<Bytes> bytes = HexDecode(hex, "send_tx: params.tx");
    if (!bytes.ok()) BadParam(bytes.status().message() + " (the canonical transaction as hex)");
    Result<Transaction> tx = DecodeTx(*bytes);
    if (!tx.ok() && tx.status().code() == StatusCode::kResourceExhausted) {
      Fail(kRpcLimitExceeded, "send_tx: params.tx: " + tx.status().message(),
           StatusCode::kResourceExhausted);
    }
    if (!tx.ok()) BadParam("send_tx: params.tx does not decode: " + tx.status().message());
    uint64_t wait_ms = p.U64("wait_ms", 0);
    if (wait_ms > static_cast<uint64_t>(limits_.max_wait_ms)) {
      BadParam("send_tx: params.wait_ms must be <= " + std::to_string(limits_.max_wait_ms));
    }
    if (!sequencer_) {
      Fail(kRpcReadOnly,
           "this ledger node is a read-only follower" +
               (info_.upstream.empty() ? std::string() : " of " + info_.upstream) +
               "; send transactions to the sequencer",
           StatusCode::kFailedPrecondition);
    }
    if (!VerifyTxSignature(*tx)) {
      Fail(kRpcTxRejected,
           "send_tx: bad signature: the transaction was not signed by its sender " +
               tx->sender.ToHex() + " (or was changed after signing)",
           StatusCode::kPermissionDenied);
    }
    Result<TxStatusInfo> st = sequencer_->Submit(*tx);
    if (!st.ok()) FailStatus(st.status().WithPrefix("send_tx"), RpcCodeFor(st.status()));
    wait_ms = static_cast<uint64_t>(wait_left_ms(wait_ms));
    if (wait_ms > 0 && st->state == TxState::kPending) {
      if (waiters_.fetch_add(1) >= limits_.max_waiters) {
        // The tx is admitted; only the wait is refused. The client polls get_tx instead.
        waiters_.fetch_sub(1);
        return TxStatusToJson(*st);
      }
      TxStatusInfo done = sequencer_->WaitFor(st->tx_id, static_cast<int64_t>(wait_ms));
      waiters_.fetch_sub(1);
      return TxStatusToJson(done);
    }
    return TxStatusToJson(*st);
  }

  if (method == "get_tx") {
    p.Only({"id"});
    Hash256 id = p.Hash("id");
    TxStatusInfo info = sequencer_ ? sequencer_->Lookup(id) : LookupCommitted(chain_, id);
    json j = TxStatusToJson(info);
    if (info.state == TxState::kIncluded) {
      Result<TxRecord> rec = chain_->With([&](Chain& c) { return c.GetTransaction(id); });
      if (rec.ok()) j["tx"] = TxToJson(rec->tx);
    }
    return j;
  }

  if (method == "get_block") {
    p.Only({"height", "raw"});
    uint64_t h = p.U64("height");
    bool raw = p.Bool("raw", false);
    Block b = OrFail(chain_->With([&](Chain& c) -> Result<Block> {
      if (h == 0 || h > c.Height()) {
        return NotFound("get_block: no block at height " + std::to_string(h) +
                        "; blocks are 1.." + std::to_string(c.Height()));
      }
      return c.GetBlock(h);
    }));
    json j = BlockToJson(b);
    if (raw) j["raw"] = HexEncode(EncodeBlock(b));
    return j;
  }

  if (method == "get_block_txs") {
    // One block's transactions as their canonical bytes, optionally of one type, a page at a
    // time: at most max_block_txs_bytes of them (always one, whatever its size: a transaction is
    // at most kMaxLargeTxBytes) and max_page entries. What a node reads evidence posted on chain
    // from (a stage's ServeStageEvidence pieces) without get_block's whole block as JSON.
    p.Only({"height", "type", "cursor"});
    const uint64_t h = p.U64("height");
    std::optional<TxType> type;
    if (p.Has("type")) {
      Result<TxType> t = TxTypeFromName(p.Str("type"));
      if (!t.ok()) BadParam("get_block_txs: params.type: " + t.status().message());
      type = *t;
    }
    const uint64_t cursor = p.U64("cursor", 0);
    Block b = OrFail(chain_->With([&](Chain& c) -> Result<Block> {
      if (h == 0 || h > c.Height()) {
        return NotFound("get_block_txs: no block at height " + std::to_string(h) +
                        "; blocks are 1.." + std::to_string(c.Height()));
      }
      return c.GetBlock(h);
    }));
    if (cursor > b.txs.size()) {
      BadParam("get_block_txs: params.cursor must be 0.." + std::to_string(b.txs.size()) +
               " (the block's transactions), got " + std::to_string(cursor));
    }
    json txs = json::array();
    uint64_t bytes = 0;
    uint64_t next = cursor;
    for (; next < b.txs.size(); ++next) {
      const Transaction& tx = b.txs[next];
      if (type && PayloadType(tx.payload) != *type) continue;
      if (txs.size() >= static_cast<size_t>(limits_.max_page)) break;
      Bytes wire = EncodeTx(tx);
      if (!txs.empty() && bytes + wire.size() > limits_.max_block_txs_bytes) break;
      bytes += wire.size();
      txs.push_back({{"position", next},
                     {"tx_id", TxId(tx).ToHex()},
                     {"type", std::string(TxTypeName(PayloadType(tx.payload)))},
                     {"ok", next < b.receipts.size() && b.receipts[next].ok},
                     {"tx", HexEncode(wire)}});
    }
    return {{"height", h},
            {"txs", std::move(txs)},
            {"next_cursor", next < b.txs.size() ? json(next) : json(nullptr)}};
  }

  if (method == "get_blocks") {
    p.Only({"from", "limit"});
    uint64_t from = p.U64("from");
    uint64_t limit = p.U64("limit", limits_.max_blocks_per_call);
    if (from == 0) BadParam("get_blocks: params.from must be >= 1 (the first block)");
    if (limit == 0 || limit > limits_.max_blocks_per_call) {
      BadParam("get_blocks: params.limit must be 1.." + std::to_string(limits_.max_blocks_per_call));
    }
    json blocks = json::array();
    uint64_t height = 0;
    Status s = chain_->With([&](Chain& c) -> Status {
      height = c.Height();
      for (uint64_t h = from; h <= height && h < from + limit; ++h) {
        Result<Block> b = c.GetBlock(h);
        if (!b.ok()) return b.status();
        blocks.push_back(HexEncode(EncodeBlock(*b)));
      }
      return Status::Ok();
    });
    if (!s.ok()) FailStatus(s, kRpcInternalError);
    return {{"from", from}, {"height", height}, {"blocks", std::move(blocks)}};
  }

  if (method == "get_account") {
    p.Only({"address"});
    PublicKey key = p.Key("address");
    Result<Account> a = chain_->With([&](Chain& c) { return c.GetAccount(key); });
    if (!a.ok() && a.status().code() == StatusCode::kNotFound) {
      // An account that never received anything: report it empty, the way wallets show it.
      Account empty;
      empty.key = key;
      json j = AccountToJson(empty);
      j["exists"] = false;
      return j;
    }
    json j = AccountToJson(OrFail(std::move(a)));
    j["exists"] = true;
    return j;
  }

  if (method == "get_node") {
    p.Only({"id"});
    PublicKey id = p.Key("id");
    return NodeToJson(OrFail(chain_->With([&](Chain& c) { return c.GetNode(id); })));
  }

  if (method == "get_task") {
    p.Only({"id", "units"});
    Hash256 id = p.Hash("id");
    bool units = p.Bool("units", false);
    json j;
    chain_->With([&](Chain& c) {
      TaskRecord t = OrFail(c.GetTask(id));
      j = TaskToJson(t, c.genesis().params.audit_window_blocks);
      if (units) {
        j["units"] = json::array();
        for (const WorkUnit& u : c.ListWorkUnits(id)) j["units"].push_back(WorkUnitToJson(u));
      }
    });
    return j;
  }

  if (method == "node_work") {
    p.Only({"id"});
    PublicKey node = p.Key("id");
    json units = json::array(), aggregations = json::array(), checks = json::array();
    json stage_units = json::array();
    uint64_t height = 0;
    uint64_t next_secret_index = 0;
    chain_->With([&](Chain& c) {
      height = c.Height();
      Result<NodeRecord> me = c.GetNode(node);
      const bool whistleblower = me.ok() && (me->roles & kRoleWhistleblower) != 0;
      // Any active checker may show the merits of a whistleblower's dispute its solver fell
      // silent in (ProveMerits), not only the whistleblower that challenged.
      const bool checker = me.ok() && me->status == NodeStatus::kActive &&
                           (me->roles & (kRoleWhistleblower | kRoleVerifier)) != 0;
      if (me.ok()) next_secret_index = me->secrets_committed + 1;
      for (const TaskRecord& t : c.ListTasks(0, UINT64_MAX)) {
        // Late disputes (LateChallengeTx) on units of final rounds, of an open or a finished
        // task alike: listed as checks with the unit's `late` view, to its solver (role solver,
        // the defender) and to its challenger (role challenger: any account, the one that sent
        // the LateChallenge), which both play the game as a live dispute's parties do.
        std::optional<Result<protocol::RoundStateMachine>> late_m;  // decoded once, if needed
        for (uint32_t index : t.verification.late_games) {
          Result<WorkUnit> wu = c.GetWorkUnit(t.id, index);
          if (!wu.ok() || !wu->late.open() || wu->check.empty()) continue;
          auto g = protocol::DisputeGame::Decode(wu->late.game);
          if (!late_m) late_m = protocol::RoundStateMachine::Decode(t.runtime);
          const Result<protocol::RoundStateMachine>& m = *late_m;
          if (!g.ok() || !m.ok() || wu->round >= m->weights_history().size()) continue;
          const bool defender = g->config().defender == node;
          if (!defender && g->config().challenger != node) continue;
          json j = WorkUnitToJson(*wu);
          j["roles"] = json::array({defender ? "solver" : "challenger"});
          j["start_state"] = m->weights_history()[wu->round].ToHex();
          j["spec_hash"] = t.spec_hash.ToHex();
          Result<NodeRecord> solver = c.GetNode(g->config().defender);
          j["solver_endpoint"] = solver.ok() ? solver->endpoint : "";
          checks.push_back(std::move(j));
        }
        if (t.status != TaskStatus::kOpen || t.runtime.empty()) continue;
        // The stage units whose files the ledger counts against this node's disk: the node
        // deletes those of its other runs (node::PinKeeper).
        ForEachStageUnitHeld(
            t, t.rounds_settled,
            [&](uint32_t index) {
              Result<WorkUnit> w = c.GetWorkUnit(t.id, index);
              return w.ok() ? std::optional<WorkUnit>(std::move(*w)) : std::nullopt;
            },
            [&](const WorkUnit& u) {
              if (u.assignee != node) return;
              const StageSlot slot = StageSlotOf(t.params, u.index);
              stage_units.push_back({{"task_id", t.id.ToHex()},
                                     {"round", slot.round},
                                     {"replica", slot.replica},
                                     {"stage", slot.stage}});
            });
        auto m = protocol::RoundStateMachine::Decode(t.runtime);
        if (!m.ok()) continue;
        const uint32_t per_round = t.params.units_per_round;
        const std::string start = m->round_weights().ToHex();
        for (const protocol::Assignment& a : m->OpenAssignments()) {
          if (a.node != node) continue;
          const uint32_t index = a.unit.round * per_round + a.unit.shard;
          Result<WorkUnit> wu = c.GetWorkUnit(t.id, index);
          json unit = {{"task_id", t.id.ToHex()},
                       {"index", index},
                       {"round", a.unit.round},
                       {"shard", a.unit.shard},
                       {"deadline_height", a.deadline_height},
                       {"start_state", start},
                       {"spec_hash", t.spec_hash.ToHex()},
                       {"assignment_beacon",
                        wu.ok() ? wu->assignment_beacon.ToHex() : Hash256{}.ToHex()}};
          if (IsPipelineTask(t.params)) {
            // The replica's chain as the ledger placed it: every stage's node and endpoint (a
            // stage whose node expired: a zero node and no endpoint until it is placed again).
            const StageSlot slot = StageSlotOf(t.params, index);
            json chain = json::array();
            for (uint32_t st = 0; st < t.params.stages; ++st) {
              Result<WorkUnit> w =
                  c.GetWorkUnit(t.id, StageUnitIndex(t.params, {slot.round, slot.replica, st}));
              const bool placed = w.ok() && (w->status == WorkUnitStatus::kAssigned ||
                                             w->status == WorkUnitStatus::kCommitted);
              Result<NodeRecord> n = placed ? c.GetNode(w->assignee) : Result<NodeRecord>(
                                                                           NotFound("unplaced"));
              chain.push_back({{"node", placed ? w->assignee.ToHex() : PublicKey{}.ToHex()},
                               {"endpoint", n.ok() ? n->endpoint : std::string()}});
            }
            // The node that held this stage before and let it expire (zero: none): the node
            // whose records a resume of the replica recomputes (node/stage_resume.h).
            unit["stage"] = {{"replica", slot.replica},
                             {"stage", slot.stage},
                             {"chain", std::move(chain)},
                             {"earlier", m->LastExcluded(a.unit.shard).ToHex()}};
          }
          units.push_back(std::move(unit));
        }
        const auto& agg = m->aggregator();
        if (agg && agg->node == node &&
            m->phase() == protocol::RoundPhase::kRoundPhaseAggregating) {
          json committed = json::array();
          for (const protocol::CommittedUnit& u : m->CommittedUnits()) {
            const uint32_t index = u.unit.round * per_round + u.unit.shard;
            json in = {{"index", index},
                       {"shard", u.unit.shard},
                       {"node", u.node.ToHex()},
                       {"result_hash", u.result.ToHex()}};
            if (IsPipelineTask(t.params)) {
              // What the aggregator checks a stage unit's step commits blob against, and the
              // blob it keeps, with the input they belong to: no get_task to learn them (as
              // `stage` on a unit, only a pipeline task's inputs have them).
              Result<WorkUnit> wu = c.GetWorkUnit(t.id, index);
              const bool has = wu.ok() && !wu->stage_commits.IsZero();
              in["commitment"] = wu.ok() ? wu->commitment.ToHex() : Hash256{}.ToHex();
              in["stage_commits"] = has ? json(wu->stage_commits.ToHex()) : json(nullptr);
            }
            committed.push_back(std::move(in));
          }
          aggregations.push_back({{"task_id", t.id.ToHex()},
                                  {"round", agg->round},
                                  {"deadline_height", agg->deadline_height},
                                  {"start_state", start},
                                  {"spec_hash", t.spec_hash.ToHex()},
                                  {"units", std::move(committed)}});
        }
        if (m->phase() == protocol::RoundPhase::kRoundPhaseFinal) continue;
        // Verification of the unfinal rounds (the settling ones and the current one): the units
        // this node solves, verifies or disputes, and (for a whistleblower) the settled ones it
        // may re-check.
        for (uint32_t index = m->final_rounds() * per_round;
             index < (m->round() + 1) * per_round; ++index) {
          Result<WorkUnit> wu = c.GetWorkUnit(t.id, index);
          if (!wu.ok() || wu->check.empty()) continue;
          auto check = protocol::UnitCheck::Decode(wu->check);
          if (!check.ok()) continue;
          std::vector<std::string> roles;
          if (check->config().solver == node) roles.push_back("solver");
          for (const protocol::NodeId& v : check->verifiers()) {
            if (v == node) roles.push_back("verifier");
          }
          if (const auto& d = check->dispute()) {
            if (d->config().challenger == node && check->config().solver != node &&
                std::find(check->verifiers().begin(), check->verifiers().end(), node) ==
                    check->verifiers().end()) {
              roles.push_back("challenger");
            }
          }
          const bool settled = check->stage() == protocol::CheckStage::kCheckSettled;
          const bool challengeable =
              settled && (check->result() == protocol::CheckResult::kCheckClean ||
                          check->result() == protocol::CheckResult::kCheckUnchecked);
          if (whistleblower && challengeable && check->config().solver != node) {
            roles.push_back("whistleblower");
          }
          if (checker && roles.empty() && check->awaits_merits()) roles.push_back("merits");
          if (roles.empty() || (settled && !challengeable)) continue;
          json j = WorkUnitToJson(*wu);
          j["roles"] = roles;
          j["start_state"] = m->weights_history()[wu->round].ToHex();
          j["spec_hash"] = t.spec_hash.ToHex();
          Result<NodeRecord> solver = c.GetNode(check->config().solver);
          j["solver_endpoint"] = solver.ok() ? solver->endpoint : "";
          // A stage's steps served on chain in this run (ServeStageEvidence rulings): the
          // claimant checks each from its pieces (get_block_txs), and every party of a later
          // dispute on the step can trace it from them.
          json served = json::array();
          for (const DisputeRuling& r : t.verification.rulings) {
            // This run's only: a re-run of the unit commits again, after an earlier run's ruling.
            if (r.index == index && r.round == wu->round &&
                r.height >= check->config().commit_height &&
                r.tx == static_cast<uint16_t>(TxType::kServeStageEvidence)) {
              served.push_back({{"step", r.step},
                                {"height", r.height},
                                {"challenger", r.challenger.ToHex()}});
            }
          }
          if (!served.empty()) j["served"] = std::move(served);
          checks.push_back(std::move(j));
        }
      }
    });
    return {{"height", height},
            {"units", std::move(units)},
            {"aggregations", std::move(aggregations)},
            {"checks", std::move(checks)},
            {"stage_units", std::move(stage_units)},
            {"next_secret_index", next_secret_index}};
  }

  if (method == "referee_work") {
    p.Only({});
    json disputes = json::array();
    uint64_t height = 0;
    chain_->With([&](Chain& c) {
      height = c.Height();
      for (const TaskRecord& t : c.ListTasks(0, UINT64_MAX)) {
        if (t.status != TaskStatus::kOpen || t.runtime.empty()) continue;
        for (const WorkUnit& u : c.ListWorkUnits(t.id)) {
          if (u.check.empty()) continue;
          auto check = protocol::UnitCheck::Decode(u.check);
          if (!check.ok() || !check->dispute() ||
              check->stage() != protocol::CheckStage::kCheckDisputed ||
              check->dispute()->stage() != protocol::DisputeStage::kDisputeReferee) {
            continue;
          }
          json j = WorkUnitToJson(u);
          auto m = protocol::RoundStateMachine::Decode(t.runtime);
          j["start_state"] = m.ok() && u.round < m->weights_history().size()
                                 ? m->weights_history()[u.round].ToHex()
                                 : "";
          j["spec_hash"] = t.spec_hash.ToHex();
          disputes.push_back(std::move(j));
        }
      }
    });
    return {{"height", height}, {"disputes", std::move(disputes)}};
  }

  if (method == "list_nodes") {
    p.Only({"cursor", "limit"});
    Page page = GetPage(p, limits_);
    json items = json::array();
    for (const NodeRecord& n :
         chain_->With([&](Chain& c) { return c.ListNodes(page.offset, page.limit); })) {
      items.push_back(NodeToJson(n));
    }
    return PageResult(std::move(items), page);
  }

  if (method == "list_tasks") {
    p.Only({"cursor", "limit"});
    Page page = GetPage(p, limits_);
    json items = json::array();
    const uint64_t audit_window =
        chain_->With([&](Chain& c) { return c.genesis().params.audit_window_blocks; });
    for (const TaskRecord& t :
         chain_->With([&](Chain& c) { return c.ListTasks(page.offset, page.limit); })) {
      items.push_back(TaskToJson(t, audit_window));
    }
    return PageResult(std::move(items), page);
  }

  if (method == "account_history") {
    p.Only({"address", "cursor", "limit"});
    PublicKey key = p.Key("address");
    Page page = GetPage(p, limits_);
    json items = json::array();
    for (const TxRecord& r : chain_->With(
             [&](Chain& c) { return c.ListAccountTxs(key, page.offset, page.limit); })) {
      json tx = TxToJson(r.tx);
      tx["receipt"] = ReceiptToJson(r.receipt);
      items.push_back(std::move(tx));
    }
    return PageResult(std::move(items), page);
  }

  if (method == "wait_block") {
    p.Only({"after", "timeout_ms"});
    uint64_t after = p.U64("after");
    uint64_t timeout = p.U64("timeout_ms", 10000);
    if (timeout > static_cast<uint64_t>(limits_.max_wait_ms)) {
      BadParam("wait_block: params.timeout_ms must be <= " + std::to_string(limits_.max_wait_ms));
    }
    if (chain_->shutting_down()) {
      Fail(kRpcUnavailable, "the ledger service is shutting down; retry later",
           StatusCode::kUnavailable);
    }
    const int64_t wait = wait_left_ms(timeout);
    if (wait == 0) {  // the batch's wait is spent: answer now
      uint64_t h = chain_->height();
      return {{"height", h}, {"timed_out", h <= after}};
    }
    if (waiters_.fetch_add(1) >= limits_.max_waiters) {
      waiters_.fetch_sub(1);
      Fail(kRpcLimitExceeded,
           "too many clients are waiting for blocks (" + std::to_string(limits_.max_waiters) +
               "); retry in a second",
           StatusCode::kResourceExhausted);
    }
    uint64_t h = chain_->WaitAbove(after, wait);
    waiters_.fetch_sub(1);
    return {{"height", h}, {"timed_out", h <= after}};
  }

  if (method == "get_genesis") {
    p.Only({});
    return chain_->With([](Chain& c) {
      return json{{"toml", GenesisToToml(c.genesis())},
                  {"genesis_hash", c.genesis_hash().ToHex()},
                  {"genesis", GenesisToJson(c.genesis())}};
    });
  }

  std::string methods;
  for (std::string_view m : kMethods) methods += (methods.empty() ? "" : ", ") + std::string(m);
  Fail(kRpcMethodNotFound,
       "unknown method '" + (method.size() > 64 ? method.substr(0, 64) + "..." : method) +
           "'; methods: " + methods,
       StatusCode::kNotFound);
}

}  // namespace meshlearn::ledger
