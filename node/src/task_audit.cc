#include "meshlearn/node/task_audit.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/stage_step.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

using nlohmann::json;

Result<FraudProofSend> FraudProofFor(const json& task, const AuditUnit& u,
                                     const BuiltSegmentWitness& w, const BlobGetter& get,
                                     uint64_t max_witness_bytes) {
  const std::string what = "unit " + std::to_string(u.index) + ": fraud proof";
  Result<TaskInfo> info = ParseTask(ledger::RpcAnswer("get_task", task));
  if (!info.ok()) return info.status().WithPrefix(what);
  FraudProofSend out;
  Bytes witness = ledger::EncodeSegmentWitness(w.witness);
  out.witness_bytes = witness.size();
  if (witness.size() <= max_witness_bytes) {
    out.tx = ledger::ProveFraudTx{
        .task_id = info->id, .index = u.index, .segment = w.segment, .witness = {std::move(witness)}};
    return out;
  }
  // Over the bound: the late game, on the unit as the ledger holds it.
  const json* unit = nullptr;
  if (task.contains("units") && task["units"].is_array()) {
    for (const json& j : task["units"]) {
      if (j.value("index", UINT32_MAX) == u.index) unit = &j;
    }
  }
  if (unit == nullptr) return InvalidArgument(what + ": the task record lists no such unit");
  ledger::TaskRecord t;
  t.id = info->id;
  t.params = info->params;
  t.price_cap = task.value("price_cap", ledger::Amount{0});
  ledger::WorkUnit wu;
  wu.task_id = t.id;
  wu.index = u.index;
  wu.price = unit->value("price", ledger::Amount{0});
  if (w.segment + 1 >= u.leaves.size()) {
    return InvalidArgument(what + ": segment " + std::to_string(w.segment) + " has no leaf");
  }
  const ledger::MismatchClaimField claim{.segment = w.segment,
                                         .start = u.leaves[w.segment],
                                         .start_proof = {},
                                         .solver_end = u.leaves[w.segment + 1],
                                         .end_proof = {},
                                         .replayed_end = w.replayed_end};
  std::string bundle;
  if (ledger::MismatchNeedsBundle(t.params, u.index, claim)) {
    Result<Bytes> text = get(info->spec_hash);
    if (!text.ok()) return text.status().WithPrefix(what + ": the task bundle (the tile phase)");
    bundle = std::string(AsStringView(*text));
  }
  out.late = true;
  out.bond = ledger::LateChallengeMinBond(t, wu);
  out.tx = ledger::LateChallengeTx{.task_id = t.id,
                                   .index = u.index,
                                   .segment = w.segment,
                                   .end = w.replayed_end,
                                   .bond = out.bond,
                                   .bundle = {std::move(bundle)}};
  return out;
}

std::string_view AuditCheckName(AuditCheck check) {
  switch (check) {
    case AuditCheck::kAuditCheckPass:
      return "pass";
    case AuditCheck::kAuditCheckFail:
      return "fail";
    case AuditCheck::kAuditCheckFetched:
      return "fetched";
    case AuditCheck::kAuditCheckSkipped:
      return "skipped";
  }
  return "?";
}

std::string_view StageFraudProofName(StageFraudProof::Kind kind) {
  switch (kind) {
    case StageFraudProof::kStep:
      return "step";
    case StageFraudProof::kContinuity:
      return "continuity";
    case StageFraudProof::kRecord:
      return "record";
  }
  return "?";
}

namespace {

Result<Hash256> HashField(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    return DataLoss(where + " has no " + key + " (not a get_task answer?)");
  }
  Result<Hash256> h = Hash256::FromHex(j[key].get<std::string>(), key);
  if (!h.ok()) return h.status().WithPrefix(where);
  return h;
}

std::string Short(const Hash256& h) { return h.ShortHex(); }

std::string UnitName(const AuditUnit& u) {
  if (u.stage >= 0) {
    return "round " + std::to_string(u.round) + " replica " + std::to_string(u.replica) +
           " stage " + std::to_string(u.stage) + " (unit " + std::to_string(u.index) + ", node " +
           u.assignee.substr(0, 16) + ")";
  }
  return "round " + std::to_string(u.round) + " unit " + std::to_string(u.index) + " (shard " +
         std::to_string(u.shard) + ", node " + u.assignee.substr(0, 16) + ")";
}

// A record as the re-run can reproduce it: everything but who signed it.
std::string RecordDiff(const protocol::StageTransfer& got, const protocol::StageTransfer& want) {
  if (got.key != want.key)
    return "is " + got.key.ToString() + ", the re-run's " + want.key.ToString();
  if (got.tensor != want.tensor || got.bytes != want.bytes) {
    return "holds tensor " + got.tensor.ShortHex() + " (" + std::to_string(got.bytes) +
           " bytes), the re-run's " + want.tensor.ShortHex() + " (" + std::to_string(want.bytes) +
           " bytes)";
  }
  if (got.tile_cols != want.tile_cols || got.tiles != want.tiles) {
    return "holds tiled root " + got.tiles.ShortHex() + " in rows of " +
           std::to_string(got.tile_cols) + ", the re-run's " + want.tiles.ShortHex() +
           " in rows of " + std::to_string(want.tile_cols);
  }
  return "";
}

// Where a stage's committed step differs from the re-run's. kForeign: the commit is of another
// step; kStart: its state before the step, compared first (every earlier step agreed with the
// re-run, so the step does not start where its previous step ended, or step 0 where the round's
// start state does: the continuity finding, proven from the commits alone, whatever the step
// received); kReceived: a record it received (its sender's step is at fault, or the record is not
// what was sent); kOwn: what it sent or its state after the step, from what the re-run agrees it
// started from and received: a step witness proves it.
struct StepDiff {
  enum Kind { kNone, kForeign, kReceived, kStart, kOwn } kind = kNone;
  std::string what;
};

StepDiff CompareStageStep(const protocol::StageStepCommit& got,
                          const protocol::StageStepCommit& want) {
  if (got.task != want.task || got.round != want.round || got.replica != want.replica ||
      got.stage != want.stage || got.stages != want.stages || got.step != want.step) {
    return {StepDiff::kForeign, "the commit is of another task, round, replica, stage or step"};
  }
  if (got.state_before != want.state_before) {
    return {StepDiff::kStart, "state_before " + got.state_before.ShortHex() + ", the re-run's " +
                                  want.state_before.ShortHex() +
                                  " (it does not start where its previous step ended)"};
  }
  if (got.received.size() != want.received.size()) {
    return {StepDiff::kReceived, "it received " + std::to_string(got.received.size()) +
                                     " records, the re-run " +
                                     std::to_string(want.received.size())};
  }
  for (size_t i = 0; i < got.received.size(); ++i) {
    std::string d = RecordDiff(got.received[i], want.received[i]);
    if (!d.empty()) {
      return {StepDiff::kReceived, "received record " + std::to_string(i) + " " + d +
                                       " (what its sender's step sent differs)"};
    }
  }
  if (got.sent.size() != want.sent.size()) {
    return {StepDiff::kOwn, "it sent " + std::to_string(got.sent.size()) + " records, the re-run " +
                                std::to_string(want.sent.size())};
  }
  for (size_t i = 0; i < got.sent.size(); ++i) {
    std::string d = RecordDiff(got.sent[i], want.sent[i]);
    if (!d.empty()) return {StepDiff::kOwn, "sent record " + std::to_string(i) + " " + d};
  }
  if (got.state_after != want.state_after) {
    return {StepDiff::kOwn, "state_after " + got.state_after.ShortHex() + ", the re-run's " +
                                want.state_after.ShortHex()};
  }
  return {};
}

// A stage's link in the audit's re-run that keeps the tensors the stage received in the step,
// by their hashes (a step witness's received tensors).
class KeepingLink final : public StageLink {
 public:
  explicit KeepingLink(StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const protocol::StageTensorKey& key,
                                     protocol::StageTransfer* record) override {
    Result<std::vector<float>> v = inner_->Receive(key, record);
    if (v.ok()) received[record->tensor] = StageTensorBytes(*v);
    return v;
  }
  Result<protocol::StageTransfer> Send(const protocol::StageTensorKey& key,
                                       std::span<const float> values) override {
    return inner_->Send(key, values);
  }
  std::map<Hash256, Bytes> received;  // this step's

 private:
  StageLink* inner_;
};

bool Contributes(const AuditUnit& u) { return u.status == "committed" || u.status == "verified"; }

// The state a round's units train from, as the audit holds it.
struct StartState {
  GlobalState state;
  bool recomputed = false;  // else: the recorded blob, fetched
};

class Auditor {
 public:
  Auditor(Env* env, const json& task, const BlobGetter& get, const AuditOptions& o)
      : env_(env), task_(task), get_(get), o_(o) {}

  Result<AuditReport> Run() {
    ML_RETURN_IF_ERROR(ParseRecord());
    ML_RETURN_IF_ERROR(LoadTask());
    if (!bundle_mismatch_.empty()) {
      r_.pass = false;
      r_.first_mismatch = bundle_mismatch_;
      return std::move(r_);
    }
    InitialLink();
    ML_RETURN_IF_ERROR(Plan());
    ML_RETURN_IF_ERROR(Execute());
    Verdict();
    return std::move(r_);
  }

 private:
  Status ParseRecord() {
    if (!task_.is_object()) return DataLoss("the task record is not a JSON object");
    ML_ASSIGN_OR_RETURN(r_.task_id, HashField(task_, "id", "task"));
    const std::string where = "task " + r_.task_id.ToHex();
    r_.status = task_.value("status", std::string());
    r_.full = o_.full;
    r_.seed = o_.seed;
    if (r_.status == "open") {
      return FailedPrecondition(where +
                                " is still open; audit it once it is finished (`meshlearn "
                                "task watch " +
                                r_.task_id.ToHex() + "` follows it)");
    }
    if (!task_.contains("params") || !task_["params"].is_object()) {
      return DataLoss(where + ": the record has no params");
    }
    const json& p = task_["params"];
    r_.rounds = p.value("rounds", 0u);
    r_.units_per_round = p.value("units_per_round", 0u);
    r_.inner_steps = p.value("inner_steps", 0u);
    r_.stages = std::max(p.value("stages", 1u), 1u);
    ML_ASSIGN_OR_RETURN(initial_recorded_, HashField(p, "initial_state", where + " params"));
    ML_ASSIGN_OR_RETURN(spec_hash_, HashField(task_, "spec_hash", where));
    const json results = task_.value("round_results", json::array());
    for (const json& rr : results) {
      ML_ASSIGN_OR_RETURN(Hash256 s, HashField(rr, "state", where + " round_results"));
      round_states_.push_back(s);
    }
    r_.rounds_audited = static_cast<uint32_t>(round_states_.size());
    if (round_states_.empty()) {
      return FailedPrecondition(where + " is " + r_.status +
                                " without a finished round: there is "
                                "nothing to audit");
    }
    if (r_.status == "finished") {
      ML_ASSIGN_OR_RETURN(final_recorded_, HashField(task_, "final_state", where));
    }
    for (const json& h : task_.value("weights_history", json::array())) {
      if (!h.is_string()) return DataLoss(where + ": weights_history holds a non-string");
      ML_ASSIGN_OR_RETURN(Hash256 w, Hash256::FromHex(h.get<std::string>(), "weights_history"));
      history_.push_back(w);
    }
    if (const auto v = task_.find("verification"); v != task_.end() && v->is_object()) {
      r_.proven_frauds = v->value("proven_frauds", json::array());
      r_.fraud_rounds = v->value("fraud_rounds", json::array());
    }
    if (!task_.contains("units") || !task_["units"].is_array()) {
      return DataLoss(where + ": the record has no units (ask get_task with units = true)");
    }
    for (const json& ju : task_["units"]) {
      AuditUnit u;
      u.index = ju.value("index", 0u);
      u.round = ju.value("round", 0u);
      u.shard = ju.value("shard", 0u);
      if (u.round >= r_.rounds_audited) continue;  // a cancelled task's unfinished round
      u.assignee = ju.value("assignee", std::string());
      u.status = ju.value("status", std::string());
      if (r_.stages > 1) {
        u.replica = static_cast<int32_t>(u.shard / r_.stages);
        u.stage = static_cast<int32_t>(u.shard % r_.stages);
      }
      if (Contributes(u)) {
        ML_ASSIGN_OR_RETURN(u.commitment, HashField(ju, "commitment", where + " unit"));
        ML_ASSIGN_OR_RETURN(u.result, HashField(ju, "result_hash", where + " unit"));
        for (const json& h : ju.value("leaves", json::array())) {
          if (!h.is_string()) return DataLoss(where + " unit: leaves holds a non-string");
          ML_ASSIGN_OR_RETURN(Hash256 leaf, Hash256::FromHex(h.get<std::string>(), "leaves"));
          u.leaves.push_back(leaf);
        }
        if (const auto c = ju.find("stage_commits"); c != ju.end() && c->is_string()) {
          ML_ASSIGN_OR_RETURN(u.stage_commits,
                              Hash256::FromHex(c->get<std::string>(), "stage_commits"));
        }
      } else {
        u.note = "status " + u.status + ": not part of its round's aggregate";
      }
      r_.units.push_back(u);
    }
    std::sort(r_.units.begin(), r_.units.end(),
              [](const AuditUnit& a, const AuditUnit& b) { return a.index < b.index; });
    return Status::Ok();
  }

  Status LoadTask() {
    Result<Bytes> bundle = get_(spec_hash_);
    if (!bundle.ok()) {
      return bundle.status().WithPrefix(
          "the task bundle " + spec_hash_.ToHex() +
          " (spec_hash) could not be had (nodes let go "
          "of a closed task's blobs after release_after_blocks; its submitter still has them)");
    }
    ML_RETURN_IF_ERROR(env_->CreateDirs(o_.work_dir));
    auto resolver = [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
      const std::string path = JoinPath(o_.work_dir, id.ToHex());
      if (env_->FileExists(path)) return path;
      Result<Bytes> data = get_(id.hash);
      if (!data.ok()) return data.status().WithPrefix("data." + key + " (blob " + id.ToHex() + ")");
      ML_RETURN_IF_ERROR(env_->WriteFileAtomic(path, AsStringView(*data)));
      return path;
    };
    bundle_text_ = std::string(AsStringView(*bundle));
    ML_ASSIGN_OR_RETURN(LoadedBundle b, LoadBundle(AsStringView(*bundle), resolver));
    net_ = b.net;
    r_.task_name = b.task.name;
    ML_ASSIGN_OR_RETURN(trainer_, engine::Trainer::Create(env_, b.task));
    facts_ = ComputeTaskFacts(*trainer_, net_);
    if (Status s = CheckBundleMatchesLedger(facts_, net_, task_); !s.ok()) {
      bundle_mismatch_ = "task bundle: " + s.message();
      return Status::Ok();
    }
    if (r_.stages > 1) {
      ML_ASSIGN_OR_RETURN(
          engine::PipelineCut cut,
          engine::TaskPipelineCut(trainer_->task(), static_cast<int>(net_.stages), net_.cut));
      cut_ = std::make_unique<engine::PipelineCut>(std::move(cut));
      ML_ASSIGN_OR_RETURN(layout_, StageLayoutOf(trainer_->task().model, *cut_));
    }
    return Status::Ok();
  }

  // The recorded state round `r` trained from: the initial state, else round r-1's result.
  Hash256 RecordedStart(uint32_t r) const {
    return r == 0 ? initial_recorded_ : round_states_[r - 1];
  }

  Result<GlobalState> FetchState(const Hash256& id) {
    ML_ASSIGN_OR_RETURN(Bytes blob, get_(id));
    return DecodeGlobalState(blob, facts_.num_params);
  }

  void InitialLink() {
    initial_ = InitialState(*trainer_);  // before any unit runs: the trainer's own init
    AuditState s{.name = "initial",
                 .round = -1,
                 .recorded = initial_recorded_,
                 .computed = StateBlobId(initial_)};
    s.check = s.computed == s.recorded ? AuditCheck::kAuditCheckPass : AuditCheck::kAuditCheckFail;
    // Round 0's weights: the task's data.init_weights file when it names one, else its seed.
    const std::string origin = trainer_->task().data.init_weights.empty()
                                   ? std::string("the task's seed")
                                   : std::string("the task's init_weights");
    if (s.check == AuditCheck::kAuditCheckFail) {
      s.note = origin + " gives " + s.computed.ToHex() + ", not the recorded initial state";
    } else {
      s.note = "= the initial weights of " + origin;
    }
    r_.chain.push_back(s);
    // The ledger's own record of what each round trained from must match its round results.
    for (uint32_t r = 0; r < history_.size() && r <= r_.rounds_audited; ++r) {
      const Hash256 want = r == 0 ? initial_recorded_ : round_states_[r - 1];
      if (history_[r] != want && ledger_mismatch_.empty()) {
        ledger_mismatch_ = "ledger record: weights_history[" + std::to_string(r) +
                           "] = " + history_[r].ToHex() + " but " +
                           (r == 0 ? std::string("params.initial_state")
                                   : "round_results[" + std::to_string(r - 1) + "].state") +
                           " = " + want.ToHex();
      }
    }
  }

  std::vector<AuditUnit*> Contributors(uint32_t round) {
    std::vector<AuditUnit*> out;
    for (AuditUnit& u : r_.units) {
      if (u.round == round && Contributes(u)) out.push_back(&u);
    }
    return out;
  }

  Status Plan() {
    const uint32_t n = r_.rounds_audited;
    whole_.assign(n, o_.full);
    if (o_.full) {
      for (uint32_t r = 0; r < n; ++r) units_total_ += Contributors(r).size();
      return Status::Ok();
    }
    std::vector<AuditUnit*> candidates;
    for (AuditUnit& u : r_.units) {
      if (Contributes(u)) candidates.push_back(&u);
    }
    const size_t k = std::min<size_t>(o_.sample, candidates.size());
    Rng rng(o_.seed, 0x617564);       // "aud"
    for (size_t i = 0; i < k; ++i) {  // partial Fisher-Yates: k distinct units
      size_t j = i + static_cast<size_t>(rng.Uniform(candidates.size() - i));
      std::swap(candidates[i], candidates[j]);
      candidates[i]->sampled = true;
    }
    r_.sample = static_cast<uint32_t>(k);
    if (r_.stages > 1) {
      // A stage is re-run with its whole replica: every stage of a sampled one's replica is
      // compared too.
      std::set<std::pair<uint32_t, int32_t>> replicas;
      for (size_t i = 0; i < k; ++i)
        replicas.insert({candidates[i]->round, candidates[i]->replica});
      for (AuditUnit& u : r_.units) {
        if (Contributes(u) && replicas.count({u.round, u.replica})) u.sampled = true;
      }
    }
    std::set<uint32_t> rounds;
    for (size_t i = 0; i < k; ++i) rounds.insert(candidates[i]->round);
    // Each sampled round needs its recorded start state: fetched, or rebuilt from an earlier one.
    for (uint32_t r : rounds) {
      uint32_t q = r;
      while (q > 0 && !whole_[q - 1] && !fetched_.count(q)) {
        Result<GlobalState> s = FetchState(RecordedStart(q));
        if (s.ok()) {
          fetched_[q] = std::move(*s);
          break;
        }
        whole_[q - 1] = true;
        --q;
      }
      if (q < r && o_.log) {
        o_.log("round " + std::to_string(r) + "'s start state " + Short(RecordedStart(r)) +
               " is not served by any node any more: re-executing round" +
               (q + 1 < r ? "s " + std::to_string(q) + ".." : " ") + std::to_string(r - 1) +
               " from " +
               (q == 0 ? std::string("the initial state")
                       : "round " + std::to_string(q) + "'s start state") +
               " to rebuild it");
      }
    }
    uint64_t rebuild = 0;
    for (uint32_t r = 0; r < n; ++r) {
      for (AuditUnit* u : Contributors(r)) {
        if (whole_[r] || u->sampled) ++units_total_;
        if (whole_[r] && !u->sampled) ++rebuild;
      }
    }
    if (rebuild > o_.max_rebuild_units) {
      uint64_t all = 0;
      for (uint32_t r = 0; r < n; ++r) all += Contributors(r).size();
      return FailedPrecondition(
          "no node serves the start states of the sampled units' rounds any more; rebuilding them "
          "re-executes " +
          std::to_string(rebuild) + " units besides the " + std::to_string(k) +
          " sampled, over --max-rebuild-units " + std::to_string(o_.max_rebuild_units) +
          "; raise it, or run --full (" + std::to_string(all) + " units)");
    }
    return Status::Ok();
  }

  void Progress(uint64_t steps_in_unit, const std::string& status) {
    if (!o_.on_progress) return;
    o_.on_progress({.steps_done = units_done_ * net_.inner_steps + steps_in_unit,
                    .steps_total = units_total_ * net_.inner_steps,
                    .units_done = units_done_,
                    .units_total = units_total_,
                    .status = status});
  }

  // Re-executes `u` from `start` and compares; keeps the delta when the round is recomputed.
  Status RunUnit(AuditUnit& u, const GlobalState& start, std::vector<float>* delta) {
    const std::string label =
        "round " + std::to_string(u.round) + " unit " + std::to_string(u.index);
    UnitExecutor ex(trainer_.get());
    const UnitWork work = protocol::UnitWorkOf(net_, facts_, u.round, u.shard);
    Progress(0, label);
    ML_ASSIGN_OR_RETURN(UnitOutcome out, ex.Run(start.weights, work, [&](int64_t step, float) {
      Progress(static_cast<uint64_t>(step), label);
    }));
    ++units_done_;
    ++r_.units_executed;
    u.replayed_commitment = out.commitment;
    u.replayed_result = ledger::DeltaBlobId(out.delta);
    const bool c_ok = u.replayed_commitment == u.commitment;
    const bool d_ok = u.replayed_result == u.result;
    u.check = c_ok && d_ok ? AuditCheck::kAuditCheckPass : AuditCheck::kAuditCheckFail;
    if (!c_ok) {
      u.note = "commitment recorded " + u.commitment.ToHex() + ", re-executed " +
               u.replayed_commitment.ToHex();
    }
    if (!d_ok) {
      u.note += std::string(u.note.empty() ? "" : "; ") + "delta recorded " + u.result.ToHex() +
                ", re-executed " + u.replayed_result.ToHex();
    }
    if (delta) *delta = std::move(out.delta);
    if (!c_ok && o_.on_fraud) ML_RETURN_IF_ERROR(Prove(u, start, work));
    return Status::Ok();
  }

  // The fraud proof of unit `u`, whose commitment did not replay from `start`.
  Status Prove(AuditUnit& u, const GlobalState& start, const UnitWork& work) {
    EnsureDataProofs(trainer_->data(), &pages_, &tree_);
    Result<BuiltSegmentWitness> w =
        BuildSegmentWitness(trainer_.get(), EncodeGlobalState(start), work, u.leaves, bundle_text_,
                            pages_.get(), tree_.get());
    if (!w.ok()) {
      // Leaves that agree with the replay under a commitment that does not (the record is
      // inconsistent) or none recorded: nothing the ledger could re-execute.
      u.proof = {{"sent", false}, {"error", w.status().message()}};
      return Status::Ok();
    }
    u.fraud_segment = static_cast<int32_t>(w->segment);
    u.proof = o_.on_fraud(u, *w);
    return Status::Ok();
  }

  // Round r from `start`: its units (all of them, or the sampled ones), then, for a recomputed
  // round, its aggregate. Returns the state round r+1 starts from, when the audit has it.
  Result<std::optional<StartState>> RunRound(uint32_t r, std::optional<StartState> start) {
    const bool whole = whole_[r];
    AuditState link{.name = "round " + std::to_string(r),
                    .round = static_cast<int32_t>(r),
                    .recorded = round_states_[r]};
    // What the round's aggregate is recomputed from (RoundDelta points into `deltas`), or why it
    // cannot be.
    std::vector<std::vector<float>> deltas;
    std::vector<RoundDelta> in;
    std::string missing;
    if (r_.stages > 1) {
      ML_RETURN_IF_ERROR(RunReplicas(r, start, whole, &deltas, &in, &missing));
    } else {
      ML_RETURN_IF_ERROR(RunUnits(r, start, whole, &deltas, &in, &missing));
    }
    std::optional<StartState> next;
    if (whole && !start) link.note = "not recomputed: its start state could not be had";
    if (whole && start) {
      if (!missing.empty()) {
        link.note = "not recomputed: " + missing;
      } else {
        GlobalState s = start->state;
        Result<protocol::AggregateResult> agg =
            ApplyRound(&s, in, net_, facts_.content_id, r, UnitSamples(*trainer_, net_));
        if (!agg.ok()) {
          link.check = AuditCheck::kAuditCheckFail;
          link.note = "the round's deltas do not aggregate: " + agg.status().message();
        } else {
          link.computed = StateBlobId(s);
          if (link.computed == link.recorded) {
            link.check = AuditCheck::kAuditCheckPass;
            link.note = "recomputed from " + std::to_string(in.size()) + " deltas";
            next = StartState{std::move(s), true};
          } else {
            link.check = AuditCheck::kAuditCheckFail;
            link.note =
                "recorded " + link.recorded.ToHex() + ", recomputed " + link.computed.ToHex();
          }
        }
      }
    }
    return FinishRound(r, whole, std::move(link), std::move(next));
  }

  // A round's units (not stages): each re-executed when it is run, then, for a recomputed round,
  // the deltas it aggregates (`in`, pointing into `deltas`) or why there are none (`missing`).
  Status RunUnits(uint32_t r, const std::optional<StartState>& start, bool whole,
                  std::vector<std::vector<float>>* deltas_out, std::vector<RoundDelta>* in_out,
                  std::string* missing_out) {
    std::vector<AuditUnit*> units = Contributors(r);
    std::vector<std::vector<float>>& deltas = *deltas_out;
    deltas.assign(units.size(), {});
    for (size_t i = 0; i < units.size(); ++i) {
      AuditUnit& u = *units[i];
      if (!whole && !u.sampled) {
        u.note = "not sampled";
        continue;
      }
      if (!start) {
        u.note = "its round's start state " + RecordedStart(r).ToHex() +
                 " could not be had (no node serves it and it could not be recomputed)";
        continue;
      }
      ML_RETURN_IF_ERROR(RunUnit(u, start->state, whole ? &deltas[i] : nullptr));
    }
    if (whole && start) {
      // The network aggregated what the solvers committed: a unit that did not replay contributed
      // its recorded delta, so use that blob if anyone still serves it.
      std::string& missing = *missing_out;
      std::vector<RoundDelta>& in = *in_out;
      for (size_t i = 0; i < units.size(); ++i) {
        AuditUnit& u = *units[i];
        if (u.check != AuditCheck::kAuditCheckPass) {
          Result<Bytes> blob = get_(u.result);
          if (!blob.ok()) {
            missing = "unit " + std::to_string(u.index) + "'s committed delta " + Short(u.result) +
                      " is not what its work gives and no node serves it";
            break;
          }
          Result<std::vector<float>> d = DecodeDelta(*blob, facts_.num_params);
          if (!d.ok()) continue;  // the aggregator leaves an undecodable delta out
          deltas[i] = std::move(*d);
        }
        in.push_back({.shard = u.shard, .delta = deltas[i]});
      }
    }
    return Status::Ok();
  }

  // The stage units of a pipeline round: each replica with a unit to run is re-run whole
  // (RunReplica), then, for a recomputed round, each replica's delta in model order (its stages'
  // re-run deltas, or the recorded blob of a stage whose delta differs) or why there are none.
  Status RunReplicas(uint32_t r, const std::optional<StartState>& start, bool whole,
                     std::vector<std::vector<float>>* deltas, std::vector<RoundDelta>* in,
                     std::string* missing) {
    std::map<int32_t, std::vector<AuditUnit*>> replicas;  // replica -> its units by stage
    for (AuditUnit* u : Contributors(r)) replicas[u->replica].push_back(u);
    deltas->reserve(replicas.size());  // `in` points into it
    for (auto& [p, units] : replicas) {
      std::sort(units.begin(), units.end(),
                [](const AuditUnit* a, const AuditUnit* b) { return a->stage < b->stage; });
      const bool run = whole || std::any_of(units.begin(), units.end(),
                                            [](const AuditUnit* u) { return u->sampled; });
      std::string skip;
      if (!run) {
        skip = "not sampled";
      } else if (!start) {
        skip = "its round's start state " + RecordedStart(r).ToHex() +
               " could not be had (no node serves it and it could not be recomputed)";
      } else if (units.size() != r_.stages) {
        skip = "only " + std::to_string(units.size()) + " of the replica's " +
               std::to_string(r_.stages) + " stages are committed: it is not re-run";
      }
      if (!skip.empty()) {
        for (AuditUnit* u : units) u->note = skip;
        if (whole && missing->empty()) *missing = "replica " + std::to_string(p) + ": " + skip;
        continue;
      }
      ML_ASSIGN_OR_RETURN(std::vector<std::vector<float>> stage_deltas,
                          RunReplica(r, static_cast<uint32_t>(p), units, start->state));
      if (!whole || !missing->empty()) continue;
      // The network aggregated what the stages committed: a stage whose delta is not the re-run's
      // contributed its recorded one.
      for (AuditUnit* u : units) {
        if (u->replayed_result == u->result) continue;
        const size_t s = static_cast<size_t>(u->stage);
        Result<Bytes> blob = get_(u->result);
        if (!blob.ok()) {
          *missing = UnitName(*u) + "'s committed delta " + Short(u->result) +
                     " is not what its work gives and no node serves it";
          break;
        }
        Result<std::vector<float>> d = DecodeDelta(*blob, layout_.StageSize(s));
        if (!d.ok()) {
          // No honest stage commits such a result, and the round's aggregator reports it (the
          // round re-runs without the stage's node, Aggregator::ApplyStages): a final round that
          // holds it was aggregated from something else than its stages' deltas.
          const std::string why = "its committed delta " + Short(u->result) + " does not decode (" +
                                  d.status().message() +
                                  "): the stage's fault, which its round's aggregator reports";
          u->note += std::string(u->note.empty() ? "" : "; ") + why;
          *missing = UnitName(*u) + ": " + why;
          break;
        }
        stage_deltas[s] = std::move(*d);
      }
      if (!missing->empty()) continue;
      ML_ASSIGN_OR_RETURN(std::vector<float> whole_delta, GatherStageFlats(layout_, stage_deltas));
      deltas->push_back(std::move(whole_delta));
      in->push_back({.shard = static_cast<uint32_t>(p), .delta = deltas->back()});
    }
    return Status::Ok();
  }

  // The committed step commits of stage unit `u` (the blob its CommitStage named), checked
  // against its record (CheckStageCommits, the check the round's aggregator made before keeping
  // the blob). Errors name what is missing or wrong.
  Result<std::vector<protocol::StageStepCommit>> CommittedSteps(const AuditUnit& u) {
    if (u.stage_commits.IsZero()) {
      return NotFound(
          "its CommitStage named no step commits (stage_commits is null): there is "
          "nothing to compare its steps with");
    }
    Result<Bytes> blob = get_(u.stage_commits);
    if (!blob.ok()) {
      return NotFound("its step commits blob " + u.stage_commits.ToHex() +
                      " is not served by any node: " + blob.status().message());
    }
    Result<std::vector<protocol::StageStepCommit>> c =
        CheckStageCommits(*blob, {.task_id = r_.task_id,
                                  .round = u.round,
                                  .replica = static_cast<uint32_t>(u.replica),
                                  .stage = static_cast<uint32_t>(u.stage),
                                  .stages = r_.stages,
                                  .inner_steps = net_.inner_steps,
                                  .commitment = u.commitment});
    if (!c.ok()) return c.status().WithPrefix("its step commits blob " + u.stage_commits.ToHex());
    return c;
  }

  // Replica `p` of round `r` from `start`, its stages in one process (one thread each, linked in
  // memory; the records are signed with keys of the audit's own, since only what they hash is
  // compared), every step of each stage compared with its committed commit. Returns each stage's
  // delta (start - end, its params() order), and sets each unit's replayed result and check.
  Result<std::vector<std::vector<float>>> RunReplica(uint32_t r, uint32_t p,
                                                     const std::vector<AuditUnit*>& units,
                                                     const GlobalState& start) {
    const engine::TaskSpec& task = trainer_->task();
    const uint32_t S = r_.stages;
    const UnitWork work = protocol::UnitWorkOf(net_, facts_, r, p);
    const std::string label = "round " + std::to_string(r) + " replica " + std::to_string(p);
    std::vector<std::unique_ptr<engine::Stage>> stages;
    std::vector<std::vector<float>> begin;
    for (uint32_t s = 0; s < S; ++s) {
      ML_ASSIGN_OR_RETURN(
          std::unique_ptr<engine::Stage> st,
          StageFromGlobal(task, *cut_, static_cast<int>(s), start.weights, work.lr_scale));
      begin.push_back(StageFlatParams(*st));
      stages.push_back(std::move(st));
    }
    std::vector<std::optional<std::vector<protocol::StageStepCommit>>> committed(S);
    std::vector<std::string> notes(S);
    for (uint32_t s = 0; s < S; ++s) {
      Result<std::vector<protocol::StageStepCommit>> c = CommittedSteps(*units[s]);
      if (c.ok()) {
        committed[s] = std::move(*c);
      } else {
        notes[s] = c.status().message();
      }
    }
    StageContext ctx;
    ctx.task = r_.task_id;
    ctx.round = r;
    ctx.replica = p;
    ctx.tile_cols = ledger::StageTileCols(task.model);
    ctx.tile_rows = ledger::StageTileRows(task.model, task.batch_size, task.micro_batches);
    std::vector<KeyPair> keys;
    for (uint32_t s = 0; s < S; ++s) {
      keys.push_back(KeyPair::Generate());
      ctx.chain.push_back(keys.back().public_key());
    }
    MemoryStageNetwork links(ctx, std::move(keys));
    std::vector<std::unique_ptr<KeepingLink>> keeping;
    for (uint32_t s = 0; s < S; ++s) {
      keeping.push_back(std::make_unique<KeepingLink>(links.link(static_cast<int>(s))));
    }
    engine::DataStream stream(task, trainer_->data(), work.stream);
    const uint64_t dropout_seed = engine::DropoutSeed(task.seed, work.stream);
    std::vector<int64_t> first_diff(S, -1);
    const bool proving = static_cast<bool>(o_.on_stage_fraud);
    Progress(0, label);
    for (uint64_t t = 0; t < net_.inner_steps; ++t) {
      const engine::Batch batch = stream.BatchForStep(static_cast<int64_t>(t));
      // The step's start, kept only where it may become a witness this step.
      std::vector<Bytes> checkpoint(S);
      for (uint32_t s = 0; s < S; ++s) {
        keeping[s]->received.clear();
        if (proving && committed[s] && first_diff[s] < 0) {
          ML_ASSIGN_OR_RETURN(checkpoint[s], ledger::StageCheckpointBytes(stages[s]->state()));
        }
      }
      std::vector<Result<StageStepOutcome>> out(S, Internal("not run"));
      std::vector<std::thread> threads;
      for (uint32_t s = 0; s < S; ++s) {
        threads.emplace_back(
            [&, s] { out[s] = RunStageStep(*stages[s], ctx, batch, dropout_seed, *keeping[s]); });
      }
      for (std::thread& th : threads) th.join();
      for (uint32_t s = 0; s < S; ++s) {
        if (!out[s].ok()) {
          return out[s].status().WithPrefix(label + " stage " + std::to_string(s) + " step " +
                                            std::to_string(t) + " (the audit's re-run)");
        }
        AuditUnit& u = *units[s];
        if (!committed[s]) continue;
        ++u.steps_compared;
        ++r_.stage_steps_compared;
        if (first_diff[s] >= 0) continue;
        const protocol::StageStepCommit& c = (*committed[s])[t];
        const StepDiff d = CompareStageStep(c, out[s]->commit);
        if (d.kind == StepDiff::kNone) continue;
        first_diff[s] = static_cast<int64_t>(t);
        u.fraud_segment = static_cast<int32_t>(t);
        notes[s] = "step " + std::to_string(t) + ": " + d.what;
        if (!proving) continue;
        if (d.kind == StepDiff::kStart) {
          ProveContinuity(u, *committed[s], t, start);
        } else if (d.kind == StepDiff::kOwn) {
          ProveStage(u, c, checkpoint[s], keeping[s]->received, work);
        } else if (d.kind == StepDiff::kReceived) {
          ProveRecord(u, units, committed, c, out[s]->commit, first_diff, notes);
        } else {
          u.proof = {
              {"sent", false},
              {"error", "its commit is of another step: nothing the ledger can rule it against"}};
        }
      }
      Progress((t + 1) * S, label);
    }
    std::vector<std::vector<float>> deltas(S);
    for (uint32_t s = 0; s < S; ++s) {
      AuditUnit& u = *units[s];
      deltas[s] = protocol::PseudoGradient(begin[s], StageFlatParams(*stages[s]));
      u.replayed_result = ledger::DeltaBlobId(deltas[s]);
      const bool d_ok = u.replayed_result == u.result;
      u.check = d_ok && committed[s] && first_diff[s] < 0 ? AuditCheck::kAuditCheckPass
                                                          : AuditCheck::kAuditCheckFail;
      u.note = notes[s];
      if (!d_ok) {
        u.note += std::string(u.note.empty() ? "" : "; ") + "delta recorded " + u.result.ToHex() +
                  ", re-executed " + u.replayed_result.ToHex();
      }
      ++units_done_;
      ++r_.units_executed;
    }
    return deltas;
  }

  // The ProveFraud witness of stage unit `u`'s step `commit`, the first that differs from the
  // re-run by its own fault: the re-run's checkpoint of the step's start and the tensors it
  // received are what the commit must start from and have received.
  void ProveStage(AuditUnit& u, const protocol::StageStepCommit& commit, const Bytes& checkpoint,
                  const std::map<Hash256, Bytes>& received, const UnitWork& work) {
    const engine::ClassificationData* train = EnsureDataProofs(trainer_->data(), &pages_, &tree_);
    Result<ledger::StageStepWitness> w =
        ledger::BuildStageStepWitness(bundle_text_, commit, checkpoint, received, trainer_->task(),
                                      work.stream, pages_.get(), train, tree_.get());
    if (!w.ok()) {
      u.proof = {{"sent", false}, {"error", w.status().message()}};
      return;
    }
    stage_proofs_.insert(u.index);
    u.proof = o_.on_stage_fraud(
        u, {.kind = StageFraudProof::kStep, .witness = ledger::EncodeStageStepWitness(*w)});
  }

  // Stage unit `u`'s committed step `c` received a record the re-run (`rerun`) did not send. A
  // record its sender's committed commit of the step lists as sent is the sender's fault (its own
  // step differs, found there); one its sender (its stage's node, units[from]->assignee) signed
  // but did not commit is the sender's too, proven against the sender's unit from the two commits
  // (ledger::StageRecordWitness with `other` this commit), the sender's unit named at this step
  // (`first_diff`, `notes`) since its own commit may agree with the re-run everywhere; one its
  // sender did not sign the stage made up, proven from its commit alone (StageRecordWitness).
  void ProveRecord(
      AuditUnit& u, const std::vector<AuditUnit*>& units,
      const std::vector<std::optional<std::vector<protocol::StageStepCommit>>>& committed,
      const protocol::StageStepCommit& c, const protocol::StageStepCommit& rerun,
      std::vector<int64_t>& first_diff, std::vector<std::string>& notes) {
    // Every differing record is looked at: one its sender's commit lists points at the sender's
    // own step, and another may still be a fault of the record itself.
    json named;
    for (size_t i = 0; i < c.received.size(); ++i) {
      const protocol::StageTransfer& r = c.received[i];
      if (i < rerun.received.size() && RecordDiff(r, rerun.received[i]).empty()) continue;
      const std::string name =
          "received record " + std::to_string(i) + " (" + r.key.ToString() + ")";
      const uint32_t from = r.key.from_stage;
      if (from >= units.size()) {
        u.proof = {{"sent", false}, {"error", name + " names no stage of the replica"}};
        return;
      }
      bool listed = false;
      if (committed[from] && c.step < committed[from]->size()) {
        for (const protocol::StageTransfer& s : (*committed[from])[c.step].sent) {
          listed = listed || (RecordDiff(s, r).empty() && s.sender == r.sender);
        }
      }
      if (listed) {
        if (named.is_null()) {
          named = {{"sent", false},
                   {"error", name + " is what its sender's commit lists as sent: the sender's "
                                    "step is at fault, not this stage"}};
        }
        continue;
      }
      Result<PublicKey> sender = PublicKey::FromHex(units[from]->assignee, "assignee");
      if (sender.ok() && protocol::VerifyStageTransfer(r, *sender).ok()) {
        ProveSentRecord(u, *units[from], committed[from], c, static_cast<uint32_t>(i), name,
                        first_diff[from], notes[from]);
        return;
      }
      ledger::StageRecordWitness w{.commit = protocol::EncodeStageStepCommit(c),
                                   .record = static_cast<uint32_t>(i)};
      stage_proofs_.insert(u.index);
      u.proof = o_.on_stage_fraud(
          u, {.kind = StageFraudProof::kRecord, .witness = ledger::EncodeStageRecordWitness(w)});
      return;
    }
    u.proof = !named.is_null() ? named
                               : json{{"sent", false},
                                      {"error", "no received record differs from the re-run's"}};
  }

  // Received record `i` of stage unit `receiver`'s committed step `c` is signed by its sender's
  // node, whose committed commit of the step does not list it among what it sent: the sender
  // (`sender`, with its committed commits `sender_commits`, its first differing step and note
  // `first_diff` and `note`) signed a tensor it did not commit. It is named at this step and,
  // once per unit, proven (ledger::StageRecordWitness: its commit, the record, the receiver's
  // commit as other); the receiver is named as having received it, not proven.
  void ProveSentRecord(AuditUnit& receiver, AuditUnit& sender,
                       const std::optional<std::vector<protocol::StageStepCommit>>& sender_commits,
                       const protocol::StageStepCommit& c, uint32_t i, const std::string& name,
                       int64_t& first_diff, std::string& note) {
    const std::string what = "it signed " + name + " of stage " + std::to_string(c.stage) +
                             " (tensor " + c.received[i].tensor.ToHex() +
                             "), which its commit does not list among what it sent";
    const int64_t t = static_cast<int64_t>(c.step);
    if (first_diff < 0 || first_diff == t) {
      first_diff = t;
      note = "step " + std::to_string(t) + ": " + what;
    } else {
      note += "; step " + std::to_string(t) + ": " + what;
    }
    const std::string fault = name + " is signed by its sender (unit " +
                              std::to_string(sender.index) +
                              "), whose commit does not list it: the sender's fault";
    if (!sender_commits || c.step >= sender_commits->size()) {
      receiver.proof = {{"sent", false},
                        {"error", fault + "; its step commits could not be had, so it is "
                                          "not proven"}};
      return;
    }
    if (!stage_proofs_.insert(sender.index).second) {
      receiver.proof = {{"sent", false},
                        {"error", fault + ", whose unit a proof was built for already"}};
      return;
    }
    receiver.proof = {{"sent", false}, {"error", fault + ", proven against the sender's unit"}};
    sender.fraud_segment = static_cast<int32_t>(t);
    ledger::StageRecordWitness w{
        .commit = protocol::EncodeStageStepCommit((*sender_commits)[c.step]),
        .record = i,
        .other = protocol::EncodeStageStepCommit(c)};
    sender.proof = o_.on_stage_fraud(
        sender, {.kind = StageFraudProof::kRecord, .witness = ledger::EncodeStageRecordWitness(w)});
  }

  // The ProveFraud witness of stage unit `u`'s step `t`, which does not start where its previous
  // step ended: its committed commits alone (`commits`), or for step 0 its commit, the bundle and
  // the round's start state `start` (the ledger derives the stage's slice of it).
  void ProveContinuity(AuditUnit& u, const std::vector<protocol::StageStepCommit>& commits,
                       uint64_t t, const GlobalState& start) {
    ledger::StageContinuityWitness w{.commit = protocol::EncodeStageStepCommit(commits[t])};
    if (t > 0) {
      w.previous = protocol::EncodeStageStepCommit(commits[t - 1]);
    } else {
      w.bundle = bundle_text_;
      w.start_state = EncodeGlobalState(start);
    }
    stage_proofs_.insert(u.index);
    u.proof = o_.on_stage_fraud(u, {.kind = StageFraudProof::kContinuity,
                                    .witness = ledger::EncodeStageContinuityWitness(w)});
  }

  // The chain link of round r, and the state round r + 1 starts from when the audit has it.
  Result<std::optional<StartState>> FinishRound(uint32_t r, bool whole, AuditState link,
                                                std::optional<StartState> next) {
    if (!next && r + 1 < r_.rounds_audited) {
      // Go on from the recorded state if a node still has it (checks later rounds on their own).
      auto f = fetched_.find(r + 1);
      if (f != fetched_.end()) {
        next = StartState{std::move(f->second), false};
        fetched_.erase(f);
      } else if (whole || NeedsStart(r + 1)) {
        Result<GlobalState> s = FetchState(round_states_[r]);
        if (s.ok()) next = StartState{std::move(*s), false};
      }
      if (next && link.check == AuditCheck::kAuditCheckSkipped) {
        link.check = AuditCheck::kAuditCheckFetched;
        link.note +=
            std::string(link.note.empty() ? "" : "; ") + "served by a node, not recomputed";
      }
    }
    if (link.check == AuditCheck::kAuditCheckSkipped && link.note.empty()) {
      link.note = "not recomputed (sampled audit)";
    }
    r_.chain.push_back(link);
    return next;
  }

  // Whether round r has anything to run.
  bool NeedsStart(uint32_t r) {
    if (r >= r_.rounds_audited) return false;
    if (whole_[r]) return true;
    for (AuditUnit* u : Contributors(r)) {
      if (u->sampled) return true;
    }
    return false;
  }

  Status Execute() {
    std::optional<StartState> start;
    if (r_.chain[0].check == AuditCheck::kAuditCheckPass) {
      start = StartState{initial_, true};
    } else if (NeedsStart(0)) {
      Result<GlobalState> s = FetchState(initial_recorded_);  // check round 0 from what it used
      if (s.ok()) start = StartState{std::move(*s), false};
    }
    for (uint32_t r = 0; r < r_.rounds_audited; ++r) {
      ML_ASSIGN_OR_RETURN(start, RunRound(r, std::move(start)));
    }
    if (r_.status == "finished") {
      const AuditState& last = r_.chain.back();
      AuditState f{.name = "final",
                   .round = last.round,
                   .recorded = final_recorded_,
                   .computed = last.computed,
                   .check = last.check};
      if (final_recorded_ != last.recorded) {
        final_mismatch_ = true;
        f.check = AuditCheck::kAuditCheckFail;
        f.note = "final_state " + final_recorded_.ToHex() + " is not the last round's state " +
                 last.recorded.ToHex();
      } else {
        f.note = "= " + last.name + "'s state";
      }
      r_.chain.push_back(f);
    }
    Progress(0, "done");
    return Status::Ok();
  }

  void Verdict() {
    auto fail = [&](const std::string& what) {
      if (r_.first_mismatch.empty()) r_.first_mismatch = what;
    };
    const AuditState& init = r_.chain[0];
    if (init.check == AuditCheck::kAuditCheckFail) {
      fail("initial state: recorded " + init.recorded.ToHex() + ", " + init.note);
    }
    if (!ledger_mismatch_.empty()) fail(ledger_mismatch_);
    for (uint32_t r = 0; r < r_.rounds_audited; ++r) {
      for (const AuditUnit& u : r_.units) {
        if (u.round == r && u.check == AuditCheck::kAuditCheckFail)
          fail(UnitName(u) + ": " + u.note);
      }
      const AuditState& s = r_.chain[r + 1];
      if (s.check == AuditCheck::kAuditCheckFail) fail(s.name + " state: " + s.note);
    }
    if (final_mismatch_) fail(r_.chain.back().note);
    r_.pass = r_.first_mismatch.empty();
  }

  Env* env_;
  const json& task_;
  const BlobGetter& get_;
  const AuditOptions& o_;
  AuditReport r_;
  Hash256 spec_hash_, initial_recorded_, final_recorded_;
  std::vector<Hash256> round_states_;  // round_results[r].state
  std::vector<Hash256> history_;       // weights_history
  NetworkSpec net_;
  TaskFacts facts_;
  std::unique_ptr<engine::Trainer> trainer_;
  // Built for the first fraud proof: a classification task's examples, a token task's pages.
  std::unique_ptr<engine::DataTree> tree_;
  std::unique_ptr<engine::TokenPageTree> pages_;
  std::unique_ptr<engine::PipelineCut> cut_;      // a pipeline task's
  StageLayout layout_;
  std::string bundle_text_;
  GlobalState initial_;
  std::string bundle_mismatch_, ledger_mismatch_;
  std::vector<bool> whole_;                  // rounds re-executed completely
  std::map<uint32_t, GlobalState> fetched_;  // round -> its recorded start state, fetched
  std::set<uint32_t> stage_proofs_;          // stage units a proof was built for: one each
  uint64_t units_total_ = 0, units_done_ = 0;
  bool final_mismatch_ = false;
};

json HashOrNull(const Hash256& h) { return h.IsZero() ? json(nullptr) : json(h.ToHex()); }

}  // namespace

Result<AuditReport> AuditTaskRecord(Env* env, const json& task, const BlobGetter& get,
                                    const AuditOptions& options) {
  if (options.work_dir.empty()) return InvalidArgument("audit: work_dir is required");
  if (!options.full && options.sample == 0) {
    return InvalidArgument("--sample must be at least 1 (or use --full)");
  }
  Auditor a(env, task, get, options);
  return a.Run();
}

Result<AuditReport> AuditTask(Env* env, ChainClient& chain, const Hash256& task_id,
                              const BlobGetter& get, const AuditOptions& options) {
  Result<json> task = chain.Call("get_task", {{"id", task_id.ToHex()}, {"units", true}});
  if (!task.ok()) {
    if (task.status().code() == StatusCode::kNotFound) {
      return NotFound("task " + task_id.ToHex() + " is not on the ledger at " + chain.Describe() +
                      "; check the id (`meshlearn task status ID`) and --rpc");
    }
    return task.status();
  }
  return AuditTaskRecord(env, *task, get, options);
}

json AuditReportToJson(const AuditReport& r) {
  json chain = json::array();
  for (const AuditState& s : r.chain) {
    chain.push_back({{"name", s.name},
                     {"round", s.round < 0 ? json(nullptr) : json(s.round)},
                     {"recorded", HashOrNull(s.recorded)},
                     {"computed", HashOrNull(s.computed)},
                     {"check", std::string(AuditCheckName(s.check))},
                     {"note", s.note}});
  }
  json units = json::array();
  for (const AuditUnit& u : r.units) {
    units.push_back({{"index", u.index},
                     {"round", u.round},
                     {"shard", u.shard},
                     {"assignee", u.assignee},
                     {"status", u.status},
                     {"commitment", HashOrNull(u.commitment)},
                     {"result_hash", HashOrNull(u.result)},
                     {"replayed_commitment", HashOrNull(u.replayed_commitment)},
                     {"replayed_result_hash", HashOrNull(u.replayed_result)},
                     {"sampled", u.sampled},
                     {"check", std::string(AuditCheckName(u.check))},
                     {"note", u.note},
                     {"fraud_segment", u.fraud_segment < 0 ? json(nullptr) : json(u.fraud_segment)},
                     {"proof", u.proof}});
    if (u.stage >= 0) {
      units.back()["replica"] = u.replica;
      units.back()["stage"] = u.stage;
      units.back()["stage_commits"] = HashOrNull(u.stage_commits);
      units.back()["steps_compared"] = u.steps_compared;
    }
  }
  return {{"task_id", r.task_id.ToHex()},
          {"task", r.task_name},
          {"status", r.status},
          {"rounds", r.rounds},
          {"rounds_audited", r.rounds_audited},
          {"units_per_round", r.units_per_round},
          {"inner_steps", r.inner_steps},
          {"stages", r.stages},
          {"stage_steps_compared", r.stage_steps_compared},
          {"mode", r.full ? "full" : "sample"},
          {"seed", r.full ? json(nullptr) : json(r.seed)},
          {"sample", r.full ? json(nullptr) : json(r.sample)},
          {"units_executed", r.units_executed},
          {"verdict", r.pass ? "PASS" : "FAIL"},
          {"first_mismatch", r.pass ? json(nullptr) : json(r.first_mismatch)},
          {"proven_frauds", r.proven_frauds},
          {"fraud_rounds", r.fraud_rounds},
          {"chain", chain},
          {"units", units}};
}

}  // namespace meshlearn::node
