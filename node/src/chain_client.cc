#include "meshlearn/node/chain_client.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "meshlearn/base/hex.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/rpc_answer.h"

namespace meshlearn::node {

using nlohmann::json;

namespace {

using ledger::RpcAnswer;

// Reads one record of a known shape. Fields(a, {every field the record has}) fails on a field
// not in the list (a ledger of another version); each Read fails on a field of the wrong type
// and skips an absent one; Done fails on the first listed field that is absent, so what is there
// is checked first. The first error sticks, and every error names the method and the field.
class Fields {
 public:
  Fields(const RpcAnswer& a, std::vector<std::string_view> known)
      : a_(a), known_(std::move(known)) {
    status_ = a.IsObject();
    if (!status_.ok()) return;
    for (auto it = a.raw().begin(); it != a.raw().end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) == known_.end()) {
        status_ = a.Bad(it.key(), "is not a field this node knows (a ledger of another version?)");
        return;
      }
    }
  }

  template <typename T>
  Fields& Read(std::string_view key, T* out) {
    if (!Present(key)) return *this;
    if constexpr (std::is_same_v<T, uint32_t>) {
      Take(a_.U32(key), out);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      Take(a_.U64(key), out);
    } else if constexpr (std::is_same_v<T, std::string>) {
      Take(a_.Str(key), out);
    } else if constexpr (std::is_same_v<T, bool>) {
      Take(a_.Bool(key), out);
    } else if constexpr (std::is_same_v<T, Hash256>) {
      Take(a_.Hash(key), out);
    } else if constexpr (std::is_same_v<T, PublicKey>) {
      Take(a_.Key(key), out);
    } else if constexpr (std::is_same_v<T, std::vector<Hash256>>) {
      Result<RpcAnswer> list = a_.Array(key);
      if (!list.ok()) return Fail(list.status());
      out->clear();
      for (size_t i = 0; i < list->size() && status_.ok(); ++i) {
        Result<Hash256> h = list->At(i).Hash();
        if (h.ok()) out->push_back(*h);
        else status_ = h.status();
      }
    } else {
      static_assert(sizeof(T) == 0, "no reader for this field type");
    }
    return *this;
  }

  // A hash that may be null (then `out` is left as it is).
  Fields& ReadHashOrNull(std::string_view key, Hash256* out) {
    if (Present(key) && !a_.raw().at(std::string(key)).is_null()) Read(key, out);
    return *this;
  }

  // A field holding one of an enum's names (name(E(0)) .. name(E(count - 1))).
  template <typename E>
  Fields& ReadEnum(std::string_view key, E* out, std::string_view (*name)(E), int count) {
    if (!Present(key)) return *this;
    std::string s;
    if (!Read(key, &s).ok()) return *this;
    std::string names;
    for (int i = 0; i < count; ++i) {
      if (name(static_cast<E>(i)) == s) {
        *out = static_cast<E>(i);
        return *this;
      }
      names += std::string(i ? ", " : "") + std::string(name(static_cast<E>(i)));
    }
    return Fail(a_.Bad(key, "is not a name this node knows (one of " + names + ")"));
  }

  // A nested object (absent: an error now), an array (absent: empty, and Done fails), or an
  // object that may be null (absent: null, and Done fails).
  Result<RpcAnswer> Object(std::string_view key) {
    if (status_.ok() && !a_.raw().contains(key)) Fail(a_.Bad(key, "missing"));
    if (!status_.ok()) return status_;
    return Check(a_.Object(key));
  }
  Result<RpcAnswer> Array(std::string_view key) {
    if (!status_.ok()) return status_;
    if (!a_.raw().contains(key)) return RpcAnswer(a_.method(), EmptyArray(), a_.path());
    return Check(a_.Array(key));
  }
  Result<RpcAnswer> ObjectOrNull(std::string_view key) {
    if (!status_.ok()) return status_;
    return Check(a_.ObjectOrNull(key));
  }

  // A listed field the record may lack (Done does not ask for it).
  Fields& Optional(std::string_view key) {
    std::erase(known_, key);
    return *this;
  }
  Fields& Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return *this;
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  Status Done() {
    for (std::string_view k : known_) {
      if (status_.ok() && !a_.raw().contains(k)) status_ = a_.Bad(k, "missing");
    }
    return status_;
  }

 private:
  static const json& EmptyArray() {
    static const json* empty = new json(json::array());
    return *empty;
  }
  bool Present(std::string_view key) const { return status_.ok() && a_.raw().contains(key); }
  template <typename T>
  void Take(Result<T> r, T* out) {
    if (r.ok()) *out = std::move(*r);
    else status_ = r.status();
  }
  Result<RpcAnswer> Check(Result<RpcAnswer> r) {
    if (!r.ok()) status_ = r.status();
    return r;
  }

  RpcAnswer a_;  // a view: small, and safe to build from a temporary
  std::vector<std::string_view> known_;
  Status status_;
};

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
  if (j.Has("capabilities")) {
    ML_ASSIGN_OR_RETURN(RpcAnswer c, j.Object("capabilities"));
    ledger::NodeCapabilities& caps = n.capabilities;
    ML_ASSIGN_OR_RETURN(caps.cores, c.U32("cores", 0));
    ML_ASSIGN_OR_RETURN(caps.memory_bytes, c.U64("memory_bytes", 0));
    ML_ASSIGN_OR_RETURN(caps.accelerator, c.Str("accelerator", ""));
    ML_ASSIGN_OR_RETURN(caps.throughput, c.U64("throughput", 0));
    ML_ASSIGN_OR_RETURN(caps.latency_ms, c.U32("latency_ms", 0));
    ML_ASSIGN_OR_RETURN(caps.bandwidth_bytes_per_s, c.U64("bandwidth_bytes_per_s", 0));
    ML_ASSIGN_OR_RETURN(caps.disk_bytes, c.U64("disk_bytes", 0));
  }
  if (j.Has("secret_anchor")) {
    ML_ASSIGN_OR_RETURN(n.secret_anchor, j.Hash("secret_anchor"));
  }
  ML_ASSIGN_OR_RETURN(n.secret_anchor_index, j.U64("secret_anchor_index", 0));
  return n;
}

// The fields of a unit JSON (ledger::WorkUnitToJson), which node_work's checks extend.
const std::vector<std::string_view> kUnitFields = {
    "task_id",     "index", "round", "shard",        "status", "assignee",
    "deadline_height", "result_hash", "commitment", "loss_micros", "price",  "paid",
    "assignment_beacon", "secret_index", "leaves", "check",
    // A stage unit's step commits blob (null otherwise): an audit reads it, and the round's
    // aggregator keeps it with the task's states.
    "stage_commits",
    // A stage serving its evidence on chain (only while its window is open), the serve bonds of
    // claims that it served nothing (only while held), and a late dispute on the unit (only while
    // open): the ledger's, not read here.
    "serve", "serve_bonds", "late"};

std::vector<std::string_view> Plus(std::vector<std::string_view> a,
                                   std::initializer_list<std::string_view> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Status ReadUnitFields(Fields& f, UnitRecord* u) {
  f.Read("task_id", &u->task_id).Read("index", &u->index).Read("round", &u->round);
  f.Read("shard", &u->shard);
  f.ReadEnum("status", &u->status, &ledger::WorkUnitStatusName, 6);
  f.Read("assignee", &u->assignee).Read("deadline_height", &u->deadline_height);
  f.Read("result_hash", &u->result_hash).Read("commitment", &u->commitment);
  f.Read("loss_micros", &u->loss_micros).Read("price", &u->price).Read("paid", &u->paid);
  f.Read("assignment_beacon", &u->assignment_beacon).Read("secret_index", &u->secret_index);
  f.Read("leaves", &u->leaves).ReadHashOrNull("stage_commits", &u->stage_commits);
  f.Optional("serve").Optional("serve_bonds").Optional("late");
  return f.status();
}

Result<UnitRecord> ParseUnit(const RpcAnswer& a) {
  UnitRecord u;
  Fields f(a, kUnitFields);
  ML_RETURN_IF_ERROR(ReadUnitFields(f, &u));
  ML_ASSIGN_OR_RETURN(RpcAnswer check, f.ObjectOrNull("check"));
  u.has_check = check.raw().is_object();
  ML_RETURN_IF_ERROR(f.Done());
  return u;
}

Status ParseDispute(const RpcAnswer& d, DisputeView* v) {
  Fields f(d, {"stage", "defender", "challenger", "first_step", "last_step", "agreed", "turns",
               "num_operators", "tile_phase", "query", "referee", "outcome"});
  f.ReadEnum("stage", &v->stage, &protocol::DisputeStageName, 6);
  f.Optional("num_operators").Optional("tile_phase");
  f.Read("num_operators", &v->num_operators).Read("tile_phase", &v->tile_phase);
  f.Read("defender", &v->defender).Read("challenger", &v->challenger);
  f.Read("first_step", &v->first_step).Read("last_step", &v->last_step);
  f.Read("agreed", &v->agreed);
  uint64_t turns = 0;
  f.Read("turns", &turns).Optional("query").Optional("referee").Optional("outcome");
  ML_RETURN_IF_ERROR(f.status());
  // One of query (steps, operators, tiles, reduction), referee (referee) or outcome (resolved).
  const bool asks = v->stage == protocol::DisputeStage::kDisputeSteps ||
                    v->stage == protocol::DisputeStage::kDisputeOperators ||
                    v->stage == protocol::DisputeStage::kDisputeTiles ||
                    v->stage == protocol::DisputeStage::kDisputeReduction;
  if (asks) {
    ML_ASSIGN_OR_RETURN(RpcAnswer q, f.Object("query"));
    Fields qf(q, {"stage", "position", "step", "deadline_height", "operator_index", "children",
                  "level", "tile"});
    protocol::DisputeQuery& query = v->query;
    query.stage = v->stage;
    qf.Optional("stage").Optional("operator_index").Optional("children").Optional("level");
    qf.Optional("tile");
    qf.Read("position", &query.position).Read("step", &query.step);
    qf.Read("deadline_height", &query.deadline_height);
    qf.Read("operator_index", &query.operator_index).Read("children", &query.children);
    qf.Read("level", &query.level).Read("tile", &query.tile);
    ML_RETURN_IF_ERROR(qf.Done());
    v->position = query.position;
    v->query_deadline = query.deadline_height;
    v->has_query = true;
  } else if (v->stage == protocol::DisputeStage::kDisputeReferee) {
    ML_ASSIGN_OR_RETURN(RpcAnswer r, f.Object("referee"));
    Fields rf(r, {"whole_step", "segment", "first_step", "step", "operator_index", "input",
                  "defender_output", "challenger_output", "tile", "tile_index", "tile_count",
                  "reduction_blocks", "block", "state_input", "partial_input", "roots",
                  "chain_end", "operator_input", "defender_operator_output",
                  "challenger_operator_output"});
    protocol::RefereeTask& t = v->referee;
    rf.Read("whole_step", &t.whole_step).Read("segment", &t.segment);
    rf.Read("first_step", &t.first_step).Read("step", &t.step);
    rf.Read("operator_index", &t.operator_index).Read("input", &t.input);
    rf.Read("defender_output", &t.defender_output);
    rf.Read("challenger_output", &t.challenger_output);
    rf.Optional("tile").Optional("tile_index").Optional("tile_count");
    rf.Optional("reduction_blocks").Optional("block").Optional("state_input");
    rf.Optional("partial_input");
    rf.Read("tile", &t.tile).Read("tile_index", &t.tile_index).Read("tile_count", &t.tile_count);
    rf.Read("reduction_blocks", &t.reduction_blocks).Read("block", &t.block);
    rf.Read("state_input", &t.state_input).Read("partial_input", &t.partial_input);
    // A whole step of the tile phase ruled from roots (protocol::RefereeRoots).
    uint32_t roots = 0;
    rf.Optional("roots").Optional("chain_end").Optional("operator_input");
    rf.Optional("defender_operator_output").Optional("challenger_operator_output");
    rf.Read("roots", &roots).Read("chain_end", &t.chain_end);
    rf.Read("operator_input", &t.operator_input);
    rf.Read("defender_operator_output", &t.defender_operator_output);
    rf.Read("challenger_operator_output", &t.challenger_operator_output);
    ML_RETURN_IF_ERROR(rf.Done());
    if (roots > static_cast<uint32_t>(protocol::RefereeRoots::kRootsOperator)) {
      return InvalidArgument("dispute.referee.roots " + std::to_string(roots) + " is unknown");
    }
    t.roots = static_cast<protocol::RefereeRoots>(roots);
    v->has_referee = true;
  } else {
    ML_ASSIGN_OR_RETURN(RpcAnswer o, f.Object("outcome"));
    Fields of(o, {"defender_honest", "challenger_honest", "reason"});
    bool honest = false;
    std::string reason;
    of.Read("defender_honest", &honest).Read("challenger_honest", &honest);
    of.Read("reason", &reason);
    ML_RETURN_IF_ERROR(of.Done());
  }
  return f.Done();
}

// One entry of node_work "checks": a unit JSON whose "check" is set, plus "roles",
// "start_state", "spec_hash", "solver_endpoint" (ledger/rpc.h).
Result<CheckAssignment> ParseCheck(const RpcAnswer& u) {
  CheckAssignment a;
  Fields f(u,
           Plus(kUnitFields, {"roles", "start_state", "spec_hash", "solver_endpoint", "served"}));
  f.Optional("served");  // only a stage unit with a step served on chain
  // The check first: it is what the node acts on.
  ML_ASSIGN_OR_RETURN(RpcAnswer c, f.Object("check"));
  Fields cf(c, {"stage", "result", "reason", "solver", "commit_height", "deadline_height",
                "verifiers", "segments", "num_segments", "merits_deadline", "dispute"});
  cf.Optional("merits_deadline").Read("merits_deadline", &a.merits_deadline);
  cf.ReadEnum("stage", &a.stage, &protocol::CheckStageName, 5);
  cf.ReadEnum("result", &a.result, &protocol::CheckResultName, 6);
  cf.Read("reason", &a.reason).Read("solver", &a.solver);
  cf.Read("commit_height", &a.commit_height).Read("deadline_height", &a.deadline_height);
  cf.Read("num_segments", &a.num_segments);
  ML_RETURN_IF_ERROR(cf.status());
  ML_ASSIGN_OR_RETURN(RpcAnswer verifiers, cf.Array("verifiers"));
  for (size_t i = 0; i < verifiers.size(); ++i) {
    ML_ASSIGN_OR_RETURN(PublicKey k, verifiers.At(i).Key());
    a.verifiers.push_back(k);
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer segments, cf.Array("segments"));
  for (size_t i = 0; i < segments.size(); ++i) {
    ML_ASSIGN_OR_RETURN(uint64_t segment, segments.At(i).U64());
    if (segment >= a.num_segments) {
      return segments.At(i).Bad("", "must be below num_segments " +
                                        std::to_string(a.num_segments));
    }
    a.segments.push_back(static_cast<uint32_t>(segment));
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer d, cf.ObjectOrNull("dispute"));
  if (d.raw().is_object()) {
    DisputeView v;
    ML_RETURN_IF_ERROR(ParseDispute(d, &v));
    a.dispute = std::move(v);
  }
  ML_RETURN_IF_ERROR(cf.Done());
  if (u.Has("late")) {  // a late game: its dispute is the one this node plays
    ML_ASSIGN_OR_RETURN(RpcAnswer late, f.Object("late"));
    Fields lf(late, {"challenger", "segment", "bond", "game"});
    PublicKey challenger;
    lf.Read("challenger", &challenger).Read("segment", &a.late_segment);
    lf.Read("bond", &a.late_bond);
    ML_RETURN_IF_ERROR(lf.status());
    ML_ASSIGN_OR_RETURN(RpcAnswer game, lf.Object("game"));
    DisputeView v;
    ML_RETURN_IF_ERROR(ParseDispute(game, &v));
    ML_RETURN_IF_ERROR(lf.Done());
    if (v.challenger != challenger) {
      return late.Bad("challenger", "is not the challenger of its game " + v.challenger.ToHex());
    }
    // A move's job is ranked by its turn's deadline (the check's own is long past).
    if (v.has_query) a.deadline_height = v.query_deadline;
    a.dispute = std::move(v);
    a.late = true;
  }

  UnitRecord unit;
  ML_RETURN_IF_ERROR(ReadUnitFields(f, &unit));
  a.task_id = unit.task_id;
  a.index = unit.index;
  a.round = unit.round;
  a.shard = unit.shard;
  a.result_hash = unit.result_hash;
  a.commitment = unit.commitment;
  a.assignment_beacon = unit.assignment_beacon;
  a.secret_index = unit.secret_index;
  a.leaves = std::move(unit.leaves);
  std::string spec_hash;
  f.Read("start_state", &a.start_state).Read("spec_hash", &spec_hash);
  f.Read("solver_endpoint", &a.solver_endpoint);
  ML_ASSIGN_OR_RETURN(RpcAnswer roles, f.Array("roles"));
  for (size_t i = 0; i < roles.size(); ++i) {
    CheckRole role = CheckRole::kCheckRoleSolver;
    ML_ASSIGN_OR_RETURN(std::string name, roles.At(i).Str());
    bool known = false;
    for (int r = 0; r <= static_cast<int>(CheckRole::kCheckRoleMerits) && !known; ++r) {
      if (CheckRoleName(static_cast<CheckRole>(r)) == name) {
        role = static_cast<CheckRole>(r);
        known = true;
      }
    }
    if (!known) {
      return roles.At(i).Bad("",
                             "is not a role this node knows (solver, verifier, challenger, "
                             "whistleblower, merits)");
    }
    a.roles.push_back(role);
  }
  if (u.Has("served")) {
    ML_ASSIGN_OR_RETURN(RpcAnswer served, f.Array("served"));
    for (size_t i = 0; i < served.size(); ++i) {
      const RpcAnswer entry = served.At(i);
      Fields sf(entry, {"step", "height", "challenger"});
      ServedStageStep s;
      sf.Read("step", &s.step).Read("height", &s.height).Read("challenger", &s.challenger);
      ML_RETURN_IF_ERROR(sf.Done());
      if (s.step == 0 || s.step >= a.leaves.size()) {
        return entry.Bad("step", "must be a step of the unit's " +
                                     std::to_string(a.leaves.size()) + " leaves");
      }
      a.served.push_back(s);
    }
  }
  ML_RETURN_IF_ERROR(f.Done());
  return a;
}

}  // namespace

const ServedStageStep* CheckAssignment::ServedStep(uint64_t step) const {
  for (const ServedStageStep& s : served) {
    if (s.step == step) return &s;
  }
  return nullptr;
}

std::string_view CheckRoleName(CheckRole r) {
  switch (r) {
    case CheckRole::kCheckRoleSolver: return "solver";
    case CheckRole::kCheckRoleVerifier: return "verifier";
    case CheckRole::kCheckRoleChallenger: return "challenger";
    case CheckRole::kCheckRoleWhistleblower: return "whistleblower";
    case CheckRole::kCheckRoleMerits: return "merits";
  }
  return "unknown";
}

Result<ledger::TaskParams> ParseTaskParams(const RpcAnswer& a) {
  std::vector<std::string_view> names;
  ledger::TaskParams every;  // a pipeline task's: every field a task's params may carry
  every.stages = 2;
  ledger::TaskParams::Visit(every, [&](const char* key, auto&) { names.push_back(key); });
  ledger::TaskParams p;
  Status unknown = a.IsObject();
  for (auto it = a.raw().begin(); unknown.ok() && it != a.raw().end(); ++it) {
    if (std::find(names.begin(), names.end(), it.key()) == names.end()) {
      unknown = a.Bad(it.key(), "is not a field this node knows (a ledger of another version?)");
    }
  }
  ML_RETURN_IF_ERROR(unknown);
  Status s;
  ledger::TaskParams::Visit(p, [&](const char* key, auto& field) {
    if (!s.ok()) return;
    if (!a.raw().contains(key)) {
      s = a.Bad(key, "missing");
      return;
    }
    using T = std::remove_reference_t<decltype(field)>;
    if constexpr (std::is_same_v<T, Hash256>) {
      Result<Hash256> r = a.Hash(key);
      if (r.ok()) field = *r;
      else s = r.status();
    } else if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
      Result<RpcAnswer> list = a.Array(key);
      if (!list.ok()) {
        s = list.status();
        return;
      }
      field.clear();
      for (size_t i = 0; i < list->size() && s.ok(); ++i) {
        Result<uint64_t> r = list->At(i).U64();
        if (r.ok()) field.push_back(*r);
        else s = r.status();
      }
    } else {
      static_assert(std::is_unsigned_v<T>, "a TaskParams field type with no reader");
      Result<uint64_t> r = a.U64(key);
      if (!r.ok()) {
        s = r.status();
      } else if (*r > std::numeric_limits<T>::max()) {
        s = a.Bad(key, "is out of range");
      } else {
        field = static_cast<T>(*r);
      }
    }
  });
  ML_RETURN_IF_ERROR(s);
  return p;
}

Result<TaskInfo> ParseTask(const RpcAnswer& a) {
  TaskInfo t;
  Fields f(a, {"id", "submitter", "spec_hash", "budget", "escrow", "spent", "treasury_cut",
               "refunded", "price_cap", "status", "created_height", "closed_height",
               "audit_window_end", "unit_count", "memo", "params", "phase", "round",
               "weights_history", "aggregator", "final_state", "round_results",
               "rounds_settled", "verification", "units"});
  f.Read("spec_hash", &t.spec_hash);
  // get_task and list_tasks answer it (the ledger knows its audit window); a bare TaskToJson
  // does not.
  f.Optional("audit_window_end").Read("audit_window_end", &t.audit_window_end);
  f.ReadEnum("status", &t.status, &ledger::TaskStatusName, 3);
  f.Read("id", &t.id).Read("final_state", &t.final_state);
  f.Read("weights_history", &t.weights_history).Read("rounds_settled", &t.rounds_settled);
  ML_ASSIGN_OR_RETURN(RpcAnswer params, f.Object("params"));
  ML_ASSIGN_OR_RETURN(t.params, ParseTaskParams(params));
  if (a.Has("verification")) {  // a bare TaskToJson has it; the late games only where open
    ML_ASSIGN_OR_RETURN(RpcAnswer v, f.Object("verification"));
    if (v.Has("late_games")) {
      ML_ASSIGN_OR_RETURN(RpcAnswer late, v.Array("late_games"));
      for (size_t i = 0; i < late.size(); ++i) {
        ML_ASSIGN_OR_RETURN(uint64_t index, late.At(i).U64());
        if (index > UINT32_MAX) return late.At(i).Bad("", "is not a unit index");
        t.late_games.push_back(static_cast<uint32_t>(index));
      }
    }
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer units, f.Optional("units").Array("units"));  // with units=true
  for (size_t i = 0; i < units.size(); ++i) {
    ML_ASSIGN_OR_RETURN(UnitRecord u, ParseUnit(units.At(i)));
    t.units.push_back(std::move(u));
  }
  // The other fields (budget, round_results, ...) are not read by a node, but Done asks for them
  // all the same: a ledger that drops one is of another version.
  ML_RETURN_IF_ERROR(f.Done());
  return t;
}

bool CheckAssignment::HasRole(CheckRole role) const {
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
      if (name.ok() && !name->empty()) code = ErrorCodeFromName(*name);
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

Result<ledger::Genesis> GetGenesis(ChainClient& chain) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("get_genesis", json::object()));
  ML_ASSIGN_OR_RETURN(std::string toml, RpcAnswer("get_genesis", j).Str("toml"));
  return ledger::ParseGenesis(toml, "the ledger's genesis");
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
  Fields f(a, {"height", "units", "aggregations", "checks", "stage_units", "next_secret_index"});
  f.Optional("stage_units");
  f.Read("height", &w.height);
  if (f.ok() && a.raw().contains("stage_units")) {
    ML_ASSIGN_OR_RETURN(RpcAnswer held, f.Array("stage_units"));
    w.stage_units.emplace();
    for (size_t i = 0; i < held.size(); ++i) {
      HeldStageUnit x;
      Fields hf(held.At(i), {"task_id", "round", "replica", "stage"});
      hf.Read("task_id", &x.task_id).Read("round", &x.round);
      hf.Read("replica", &x.replica).Read("stage", &x.stage);
      ML_RETURN_IF_ERROR(hf.Done());
      w.stage_units->push_back(x);
    }
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer checks, f.Array("checks"));
  for (size_t i = 0; i < checks.size(); ++i) {
    ML_ASSIGN_OR_RETURN(CheckAssignment x, ParseCheck(checks.At(i)));
    w.checks.push_back(std::move(x));
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer units, f.Array("units"));
  for (size_t i = 0; i < units.size(); ++i) {
    RpcAnswer u = units.At(i);
    UnitAssignment x;
    Hash256 spec_hash;
    Fields uf(u, {"task_id", "index", "round", "shard", "deadline_height", "start_state",
                  "spec_hash", "assignment_beacon", "stage"});
    uf.Optional("stage");
    uf.Read("task_id", &x.task_id).Read("index", &x.index).Read("round", &x.round);
    uf.Read("shard", &x.shard).Read("deadline_height", &x.deadline_height);
    uf.Read("start_state", &x.start_state).Read("spec_hash", &spec_hash);
    uf.Read("assignment_beacon", &x.assignment_beacon);
    if (uf.ok() && u.raw().contains("stage")) {
      ML_ASSIGN_OR_RETURN(RpcAnswer st, uf.Object("stage"));
      UnitAssignment::Stage stage;
      Fields sf(st, {"replica", "stage", "chain", "earlier"});
      sf.Read("replica", &stage.replica).Read("stage", &stage.stage);
      sf.Read("earlier", &stage.earlier);
      ML_ASSIGN_OR_RETURN(RpcAnswer chain, sf.Array("chain"));
      for (size_t k = 0; k < chain.size(); ++k) {
        Fields cf(chain.At(k), {"node", "endpoint"});
        PublicKey node;
        std::string endpoint;
        cf.Read("node", &node).Read("endpoint", &endpoint);
        ML_RETURN_IF_ERROR(cf.Done());
        stage.chain.push_back(node);
        stage.endpoints.push_back(std::move(endpoint));
      }
      ML_RETURN_IF_ERROR(sf.Done());
      if (stage.stage >= stage.chain.size()) {
        return st.Bad("stage", "is not a stage of the chain listed (" +
                                   std::to_string(stage.chain.size()) + " stages)");
      }
      x.stage = std::move(stage);
    }
    ML_RETURN_IF_ERROR(uf.Done());
    w.units.push_back(x);
  }
  ML_ASSIGN_OR_RETURN(RpcAnswer aggregations, f.Array("aggregations"));
  for (size_t i = 0; i < aggregations.size(); ++i) {
    RpcAnswer g = aggregations.At(i);
    AggregationAssignment x;
    Hash256 spec_hash;
    Fields gf(g, {"task_id", "round", "deadline_height", "start_state", "spec_hash", "units"});
    gf.Read("task_id", &x.task_id).Read("round", &x.round);
    gf.Read("deadline_height", &x.deadline_height).Read("start_state", &x.start_state);
    gf.Read("spec_hash", &spec_hash);
    ML_ASSIGN_OR_RETURN(RpcAnswer inputs, gf.Array("units"));
    for (size_t k = 0; k < inputs.size(); ++k) {
      AggregationInput in;
      Fields inf(inputs.At(k),
                 {"index", "shard", "node", "result_hash", "commitment", "stage_commits"});
      inf.Optional("commitment").Optional("stage_commits");  // a pipeline task's inputs only
      inf.Read("index", &in.index).Read("shard", &in.shard).Read("node", &in.node);
      inf.Read("result_hash", &in.result_hash).Read("commitment", &in.commitment);
      inf.ReadHashOrNull("stage_commits", &in.stage_commits);
      ML_RETURN_IF_ERROR(inf.Done());
      x.units.push_back(in);
    }
    ML_RETURN_IF_ERROR(gf.Done());
    w.aggregations.push_back(std::move(x));
  }
  f.Read("next_secret_index", &w.next_secret_index);
  ML_RETURN_IF_ERROR(f.Done());
  return w;
}

Result<NodeWork> GetNodeWork(ChainClient& chain, const PublicKey& node) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("node_work", {{"id", node.ToHex()}}));
  return ParseNodeWork(j);
}

Result<BlockTxPage> GetBlockTxs(ChainClient& chain, uint64_t height, std::string_view type,
                                uint64_t cursor) {
  json params = {{"height", height}, {"cursor", cursor}};
  if (!type.empty()) params["type"] = std::string(type);
  ML_ASSIGN_OR_RETURN(json j, chain.Call("get_block_txs", params));
  const RpcAnswer a("get_block_txs", j);
  BlockTxPage page;
  ML_ASSIGN_OR_RETURN(RpcAnswer txs, a.Array("txs"));
  for (size_t i = 0; i < txs.size(); ++i) {
    const RpcAnswer x = txs.At(i);
    BlockTx t;
    ML_ASSIGN_OR_RETURN(t.position, x.U64("position"));
    ML_ASSIGN_OR_RETURN(t.ok, x.Bool("ok"));
    ML_ASSIGN_OR_RETURN(std::string hex, x.Str("tx"));
    Result<Bytes> wire = HexDecode(hex);
    if (!wire.ok()) return x.Bad("tx", wire.status().message());
    Result<ledger::Transaction> tx = ledger::DecodeTx(*wire);
    if (!tx.ok()) return x.Bad("tx", tx.status().message());
    t.tx = std::move(*tx);
    if (!page.txs.empty() && t.position <= page.txs.back().position) {
      return x.Bad("position", "must follow the previous transaction's");
    }
    page.txs.push_back(std::move(t));
  }
  if (a.Has("next_cursor")) {
    ML_ASSIGN_OR_RETURN(uint64_t next, a.U64("next_cursor"));
    if (next <= cursor) return a.Bad("next_cursor", "must be past the cursor asked for");
    page.next_cursor = next;
  }
  return page;
}

Result<TaskInfo> GetTask(ChainClient& chain, const Hash256& id, bool units) {
  json params = {{"id", id.ToHex()}};
  if (units) params["units"] = true;
  ML_ASSIGN_OR_RETURN(json j, chain.Call("get_task", params));
  ML_ASSIGN_OR_RETURN(TaskInfo t, ParseTask(RpcAnswer("get_task", j)));
  if (t.id != id) return RpcAnswer("get_task", j).Bad("id", "is not the task asked for");
  return t;
}

Result<std::vector<TaskInfo>> ListTasks(ChainClient& chain) {
  std::vector<TaskInfo> out;
  uint64_t cursor = 0;
  for (int page = 0; page < 100000; ++page) {
    ML_ASSIGN_OR_RETURN(json j, chain.Call("list_tasks", {{"cursor", cursor}, {"limit", 100}}));
    RpcAnswer a("list_tasks", j);
    ML_ASSIGN_OR_RETURN(RpcAnswer items, a.Array("items"));
    for (size_t i = 0; i < items.size(); ++i) {
      ML_ASSIGN_OR_RETURN(TaskInfo t, ParseTask(items.At(i)));
      out.push_back(std::move(t));
    }
    if (!a.Has("next_cursor")) break;
    ML_ASSIGN_OR_RETURN(uint64_t next, a.U64("next_cursor"));
    if (next <= cursor) return a.Bad("next_cursor", "must move forward");
    cursor = next;
  }
  return out;
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
