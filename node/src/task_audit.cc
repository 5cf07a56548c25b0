#include "meshlearn/node/task_audit.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "meshlearn/base/rng.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

using nlohmann::json;

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
  return "round " + std::to_string(u.round) + " unit " + std::to_string(u.index) + " (shard " +
         std::to_string(u.shard) + ", node " + u.assignee.substr(0, 16) + ")";
}

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
    if (const uint32_t stages = p.value("stages", 1u); stages > 1) {
      // A stage unit's commitment is the root of its step leaves, each over the signed tensors
      // its neighbours sent: re-executing it as a whole-model unit fails every unit falsely,
      // and re-running the replica gives no commit its nodes signed (docs/verification.md,
      // "Pipeline stages", "Not built yet").
      return FailedPrecondition(
          where + " is trained in pipeline stages (params.stages = " + std::to_string(stages) +
          "): the audit does not re-execute stage units yet; a stage's false step is proven "
          "with ProveFraud from its step's evidence (ledger::BuildStageStepWitness)");
    }
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
      if (Contributes(u)) {
        ML_ASSIGN_OR_RETURN(u.commitment, HashField(ju, "commitment", where + " unit"));
        ML_ASSIGN_OR_RETURN(u.result, HashField(ju, "result_hash", where + " unit"));
        for (const json& h : ju.value("leaves", json::array())) {
          if (!h.is_string()) return DataLoss(where + " unit: leaves holds a non-string");
          ML_ASSIGN_OR_RETURN(Hash256 leaf, Hash256::FromHex(h.get<std::string>(), "leaves"));
          u.leaves.push_back(leaf);
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
    if (trainer_->data().tokens) {
      u.proof = {{"sent", false},
                 {"error", "a token task's segments are not replayed by the ledger yet (its data "
                           "root proves the tokens of a disputed tile, not a segment)"}};
      return Status::Ok();
    }
    if (!tree_) tree_ = std::make_unique<engine::DataTree>(trainer_->data().train);
    Result<BuiltSegmentWitness> w = BuildSegmentWitness(trainer_.get(), EncodeGlobalState(start),
                                                        work, u.leaves, bundle_text_, *tree_);
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
    std::vector<AuditUnit*> units = Contributors(r);
    const bool whole = whole_[r];
    AuditState link{.name = "round " + std::to_string(r),
                    .round = static_cast<int32_t>(r),
                    .recorded = round_states_[r]};
    std::vector<std::vector<float>> deltas(units.size());
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
    std::optional<StartState> next;
    if (whole && !start) link.note = "not recomputed: its start state could not be had";
    if (whole && start) {
      // The network aggregated what the solvers committed: a unit that did not replay contributed
      // its recorded delta, so use that blob if anyone still serves it.
      std::string missing;
      std::vector<RoundDelta> in;
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
  std::unique_ptr<engine::DataTree> tree_;  // built for the first fraud proof
  std::string bundle_text_;
  GlobalState initial_;
  std::string bundle_mismatch_, ledger_mismatch_;
  std::vector<bool> whole_;                  // rounds re-executed completely
  std::map<uint32_t, GlobalState> fetched_;  // round -> its recorded start state, fetched
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
  }
  return {{"task_id", r.task_id.ToHex()},
          {"task", r.task_name},
          {"status", r.status},
          {"rounds", r.rounds},
          {"rounds_audited", r.rounds_audited},
          {"units_per_round", r.units_per_round},
          {"inner_steps", r.inner_steps},
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
