#include "meshlearn/node/referee.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "meshlearn/base/check.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/node/unit_service.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

using nlohmann::json;

namespace {

// The chain's view of the disputed unit for the tile phase (ledger::TileContextOf), from the task
// bundle this service loaded.
Result<ledger::TileRuleContext> DisputeTileContext(const RefereeDispute& d,
                                                   const std::string& bundle_text,
                                                   const ledger::TaskParams& params) {
  ledger::TaskRecord record;
  record.id = d.task_id;
  record.spec_hash = d.spec_hash;
  record.params = params;
  ledger::WorkUnit unit;
  unit.task_id = d.task_id;
  unit.index = d.index;
  unit.round = d.round;
  unit.shard = d.shard;
  return ledger::TileContextOf(record, unit, bundle_text, "tile witness");
}

// Whose output the ledger's `output` for tile or roots task `task` is ("the defender's output",
// ...), and `*ruled` the ruling in the task's own terms (RuleDisputeTx::output, a report's "for"):
// `output`, or for an operator of the input (kRootsOperator, whose output is a C_j) the state
// claim of the party whose C_j the roots give.
std::string TileRulingSide(const protocol::RefereeTask& task, const Hash256& output,
                           Hash256* ruled) {
  const bool by_operator = task.roots == protocol::RefereeRoots::kRootsOperator;
  const Hash256& d_out = by_operator ? task.defender_operator_output : task.defender_output;
  const Hash256& c_out = by_operator ? task.challenger_operator_output : task.challenger_output;
  *ruled = output;
  if (by_operator) {
    *ruled = output == d_out   ? task.defender_output
             : output == c_out ? task.challenger_output
                               : output;
  }
  return output == d_out   ? "the defender's output"
         : output == c_out ? "the challenger's output"
                           : "neither output (both lose)";
}

}  // namespace

Result<Hash256> StateHashAfterStep(engine::Trainer* trainer, std::span<const float> global,
                                   const UnitWork& work, int64_t step) {
  const int64_t steps[] = {step};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                      ReplayToSteps(trainer, global, work, 0, nullptr, steps));
  return h[0];
}

Result<RefereeRuling> RuleWholeStep(engine::Trainer* trainer, std::span<const float> global,
                                    const UnitWork& work, const protocol::RefereeTask& task) {
  if (task.segment) {
    return FailedPrecondition("referee: a tolerance-mode segment (steps " +
                              std::to_string(task.first_step) + ".." + std::to_string(task.step) +
                              ") needs the defender's committed end state, which this referee does "
                              "not fetch yet; only exact-mode whole steps");
  }
  if (!task.whole_step) {
    return InvalidArgument("referee: operator " + std::to_string(task.operator_index) +
                           " of step " + std::to_string(task.step) +
                           ": operator-level rulings are not played on this chain "
                           "(num_operators = 0); only whole steps");
  }
  if (task.step < 1 || task.step > static_cast<uint64_t>(work.inner_steps)) {
    return InvalidArgument("referee: step " + std::to_string(task.step) + " is outside 1.." +
                           std::to_string(work.inner_steps));
  }
  // One replay gives both ends of the step.
  const int64_t step = static_cast<int64_t>(task.step);
  const int64_t steps[] = {step - 1, step};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                      ReplayToSteps(trainer, global, work, 0, nullptr, steps));
  RefereeRuling r;
  r.true_input = h[0];
  r.true_output = h[1];
  r.input_true = task.input == r.true_input;
  const std::string at = "step " + std::to_string(task.step);
  if (r.input_true) {
    r.output = r.true_output;
    const bool d = task.defender_output == r.output, c = task.challenger_output == r.output;
    r.reason = at + " from the true state: " +
               (d   ? "the defender's output is the true one"
                : c ? "the challenger's output is the true one"
                    : "neither output is the true one (both lose)");
  } else {
    r.output = task.challenger_output;
    r.reason = at + ": the agreed state after step " + std::to_string(task.step - 1) + " (" +
               task.input.ShortHex() + ") is not the unit's true state (" +
               r.true_input.ShortHex() +
               "): the defender committed or agreed to a false state; ruling for the challenger";
  }
  return r;
}

// ---- Tolerance mode ------------------------------------------------------------------------

namespace {

std::string Ppm(double rel_l2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g ppm", rel_l2 * 1e6);
  return buf;
}

std::string Ppb(double gap) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g ppb", gap * 1e9);
  return buf;
}

}  // namespace

std::vector<float> StateParams(const engine::TrainState& st) {
  std::vector<float> flat;
  for (const engine::Param& p : st.model->params()) {
    flat.insert(flat.end(), p.value.data(), p.value.data() + p.value.size());
  }
  return flat;
}

std::vector<float> EndParamsOfDelta(std::span<const float> global, std::span<const float> delta) {
  CHECK_EQ(global.size(), delta.size());
  std::vector<float> out(global.size());
  for (size_t i = 0; i < global.size(); ++i) out[i] = global[i] - delta[i];
  return out;
}

RefereeRuling JudgeTolerance(const std::vector<float>* defender, std::span<const float> truth,
                             const protocol::ToleranceParams& tolerance) {
  RefereeRuling r;
  r.tolerance_verdict = 2;
  const std::string limits = "the task's tolerance (" + Ppm(tolerance.max_rel_l2_ppm * 1e-6) +
                             " relative L2, " + Ppb(tolerance.max_cosine_gap_ppb * 1e-9) +
                             " cosine gap)";
  if (defender == nullptr) {
    r.reason = "the defender did not show its committed end state: outside " + limits;
    return r;
  }
  r.defender_shown = true;
  if (defender->size() != truth.size()) {
    r.reason = "the defender's end state has " + std::to_string(defender->size()) +
               " parameters, the model " + std::to_string(truth.size()) + ": outside " + limits;
    return r;
  }
  r.distance = protocol::Distance(*defender, truth);
  const bool within = protocol::WithinTolerance(r.distance, tolerance);
  r.tolerance_verdict = within ? 1 : 2;
  r.reason = "the defender's end state is " + Ppm(r.distance.rel_l2) + " relative L2, " +
             Ppb(1.0 - r.distance.cosine) +
             " cosine gap from the replay: " + (within ? "within " : "outside ") + limits;
  return r;
}

Result<RefereeRuling> RuleSegment(engine::Trainer* trainer, std::span<const float> global,
                                  const UnitWork& work, const protocol::RefereeTask& task,
                                  const DefenderEndState& defender,
                                  const protocol::ToleranceParams& tolerance) {
  if (!task.segment) {
    return InvalidArgument("referee: step " + std::to_string(task.step) +
                           " is an exact-mode task; RuleWholeStep rules it");
  }
  const uint64_t h = static_cast<uint64_t>(work.inner_steps);
  if (task.step < 1 || task.step > h || task.first_step >= task.step) {
    return InvalidArgument("referee: segment " + std::to_string(task.first_step) + ".." +
                           std::to_string(task.step) + " is not a range inside 0.." +
                           std::to_string(h));
  }
  // Both ends from the unit's start; the trainer is left at the state after `step`.
  const int64_t steps[] = {static_cast<int64_t>(task.first_step), static_cast<int64_t>(task.step)};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> hashes,
                      ReplayToSteps(trainer, global, work, 0, nullptr, steps));
  std::vector<float> truth = trainer->FlatParams();
  // What the defender showed, as end parameters.
  std::optional<std::vector<float>> shown;
  std::string missing = defender.missing;
  if (defender.checkpoint != nullptr) {
    const Hash256 got = engine::StateHash(*defender.checkpoint);
    if (got != task.defender_output) {
      missing = "its state at step " + std::to_string(task.step) + " hashes to " + got.ShortHex() +
                ", not to its committed leaf " + task.defender_output.ShortHex();
    } else {
      shown = StateParams(*defender.checkpoint);
    }
  } else if (defender.delta != nullptr) {
    if (task.step != h) {
      missing =
          "a delta stands for the end state of step H only, not step " + std::to_string(task.step);
    } else if (defender.delta->size() != truth.size()) {
      missing = "its delta has " + std::to_string(defender.delta->size()) + " values, the model " +
                std::to_string(truth.size());
    } else {
      shown = EndParamsOfDelta(global, *defender.delta);
      truth = EndParamsOfDelta(global, protocol::PseudoGradient(global, truth));
    }
  }
  RefereeRuling r = JudgeTolerance(shown ? &*shown : nullptr, truth, tolerance);
  r.true_input = hashes[0];
  r.true_output = hashes[1];
  r.input_true = task.input == r.true_input;
  r.output = r.true_output;
  r.reason = "steps " + std::to_string(task.first_step) + ".." + std::to_string(task.step) +
             " replayed from the unit's start: " + r.reason +
             (shown || missing.empty() ? "" : " (" + missing + ")") + "; ruling for the " +
             (r.tolerance_verdict == 1 ? "defender" : "challenger");
  return r;
}

// ---- referee_work ------------------------------------------------------------------------

namespace {

Result<Hash256> HashAt(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    return InvalidArgument(where + ": missing " + key);
  }
  return Hash256::FromHex(j[key].get<std::string>(), where + "." + key);
}

Result<PublicKey> KeyAt(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) {
    return InvalidArgument(where + ": missing " + key);
  }
  return PublicKey::FromHex(j[key].get<std::string>(), where + "." + key);
}

}  // namespace

Result<std::vector<RefereeDispute>> ParseRefereeWork(const json& j) {
  if (!j.is_object() || !j.contains("disputes") || !j["disputes"].is_array()) {
    return InvalidArgument("referee_work: no disputes array");
  }
  std::vector<RefereeDispute> out;
  for (const json& u : j["disputes"]) {
    RefereeDispute d;
    const std::string where = "referee_work unit " + std::to_string(u.value("index", 0u));
    ML_ASSIGN_OR_RETURN(d.task_id, HashAt(u, "task_id", where));
    d.index = u.value("index", 0u);
    d.round = u.value("round", 0u);
    d.shard = u.value("shard", 0u);
    ML_ASSIGN_OR_RETURN(d.start_state, HashAt(u, "start_state", where));
    ML_ASSIGN_OR_RETURN(d.spec_hash, HashAt(u, "spec_hash", where));
    if (!u.contains("check") || !u["check"].is_object() || !u["check"].contains("dispute") ||
        !u["check"]["dispute"].is_object()) {
      return InvalidArgument(where + ": no check.dispute");
    }
    const json& dj = u["check"]["dispute"];
    ML_ASSIGN_OR_RETURN(d.defender, KeyAt(dj, "defender", where));
    ML_ASSIGN_OR_RETURN(d.challenger, KeyAt(dj, "challenger", where));
    if (u.contains("result_hash")) {
      ML_ASSIGN_OR_RETURN(d.result_hash, HashAt(u, "result_hash", where));
    }
    d.first_step = dj.value("first_step", uint64_t{0});
    if (dj.contains("agreed")) {
      ML_ASSIGN_OR_RETURN(d.agreed, HashAt(dj, "agreed", where + " check.dispute"));
    }
    if (!dj.contains("referee") || !dj["referee"].is_object()) {
      return InvalidArgument(where + ": check.dispute has no referee task");
    }
    const json& r = dj["referee"];
    d.task.whole_step = r.value("whole_step", true);
    d.task.segment = r.value("segment", false);
    d.task.first_step = r.value("first_step", uint64_t{0});
    d.task.step = r.value("step", uint64_t{0});
    d.task.operator_index = r.value("operator_index", 0u);
    d.task.tile = r.value("tile", false);
    d.task.tile_index = r.value("tile_index", uint64_t{0});
    d.task.tile_count = r.value("tile_count", uint64_t{0});
    d.task.reduction_blocks = r.value("reduction_blocks", 0u);
    d.task.block = r.value("block", 0u);
    if (d.task.tile) {
      ML_ASSIGN_OR_RETURN(d.task.state_input, HashAt(r, "state_input", where));
      ML_ASSIGN_OR_RETURN(d.task.partial_input, HashAt(r, "partial_input", where));
    }
    const int roots = r.value("roots", 0);
    if (roots == static_cast<int>(protocol::RefereeRoots::kRootsChainEnd) ||
        roots == static_cast<int>(protocol::RefereeRoots::kRootsOperator)) {
      d.task.roots = static_cast<protocol::RefereeRoots>(roots);
      ML_ASSIGN_OR_RETURN(d.task.chain_end, HashAt(r, "chain_end", where));
      ML_ASSIGN_OR_RETURN(d.task.operator_input, HashAt(r, "operator_input", where));
      ML_ASSIGN_OR_RETURN(d.task.defender_operator_output,
                          HashAt(r, "defender_operator_output", where));
      ML_ASSIGN_OR_RETURN(d.task.challenger_operator_output,
                          HashAt(r, "challenger_operator_output", where));
    } else if (roots != 0) {
      return InvalidArgument(where + ": referee.roots " + std::to_string(roots) + " is unknown");
    }
    ML_ASSIGN_OR_RETURN(d.task.input, HashAt(r, "input", where));
    ML_ASSIGN_OR_RETURN(d.task.defender_output, HashAt(r, "defender_output", where));
    ML_ASSIGN_OR_RETURN(d.task.challenger_output, HashAt(r, "challenger_output", where));
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<RefereeDispute>> GetRefereeWork(ChainClient& chain) {
  ML_ASSIGN_OR_RETURN(json j, chain.Call("referee_work", json::object()));
  return ParseRefereeWork(j);
}

// ---- RefereeService ------------------------------------------------------------------------

struct RefereeService::TaskTrainer {
  std::string bundle_text;  // the spec_hash blob: a step witness carries it
  LoadedBundle bundle;
  std::unique_ptr<engine::Trainer> trainer;
  TaskFacts facts;
  std::unique_ptr<engine::DataTree> tree;        // built for the first step witness
  std::unique_ptr<engine::TokenPageTree> pages;  // a token task's, for the first tile witness
  uint64_t last_use = 0;
};

RefereeService::RefereeService(ChainClient* chain, TxSender* tx, RefereeBlobSource get,
                               RefereeOptions options)
    : chain_(chain), tx_(tx), get_(std::move(get)), options_(std::move(options)) {
  CHECK(options_.env != nullptr);
  CHECK(!options_.work_dir.empty());
}

RefereeService::~RefereeService() = default;

void RefereeService::Log(const std::string& line) {
  if (options_.log) options_.log("referee: " + line);
}

Result<RefereeService::TaskTrainer*> RefereeService::TrainerFor(const Hash256& spec_hash) {
  auto it = trainers_.find(spec_hash);
  if (it != trainers_.end()) {
    it->second->last_use = ++use_clock_;
    return it->second.get();
  }
  Result<Bytes> text = get_(spec_hash);
  if (!text.ok()) return text.status().WithPrefix("task bundle " + spec_hash.ShortHex());
  const std::string dir = JoinPath(options_.work_dir, spec_hash.ToHex());
  ML_RETURN_IF_ERROR(options_.env->CreateDirs(dir));
  auto resolver = [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
    const std::string path = JoinPath(dir, id.ToHex());
    if (options_.env->FileExists(path)) return path;
    Result<Bytes> data = get_(id.hash);
    if (!data.ok())
      return data.status().WithPrefix("data." + key + " (blob " + id.ShortHex() + ")");
    ML_RETURN_IF_ERROR(options_.env->WriteFileAtomic(path, AsStringView(*data)));
    return path;
  };
  auto t = std::make_unique<TaskTrainer>();
  t->bundle_text = std::string(AsStringView(*text));
  ML_ASSIGN_OR_RETURN(t->bundle, LoadBundle(t->bundle_text, resolver));
  ML_ASSIGN_OR_RETURN(t->trainer, engine::Trainer::Create(options_.env, t->bundle.task));
  t->facts = ComputeTaskFacts(*t->trainer, t->bundle.net);
  t->last_use = ++use_clock_;
  Log("loaded task bundle " + spec_hash.ShortHex() + " (" + t->bundle.task.name + ", " +
      std::to_string(t->facts.num_params) + " parameters)");
  while (options_.max_cached_tasks > 0 && trainers_.size() >= options_.max_cached_tasks) {
    auto oldest = trainers_.begin();
    for (auto i = trainers_.begin(); i != trainers_.end(); ++i) {
      if (i->second->last_use < oldest->second->last_use) oldest = i;
    }
    trainers_.erase(oldest);
  }
  TaskTrainer* raw = t.get();
  trainers_[spec_hash] = std::move(t);
  return raw;
}

Result<RefereeService::Computed> RefereeService::Compute(const RefereeDispute& d) {
  ML_ASSIGN_OR_RETURN(TaskTrainer * t, TrainerFor(d.spec_hash));
  const NetworkSpec& net = t->bundle.net;
  // A pipeline task's round has units_per_round replicas x stages units.
  const uint64_t per_round = uint64_t{net.units_per_round} * std::max<uint32_t>(net.stages, 1);
  if (d.round >= net.rounds || d.shard >= per_round) {
    return InvalidArgument("referee: unit " + std::to_string(d.index) + " (round " +
                           std::to_string(d.round) + ", shard " + std::to_string(d.shard) +
                           ") is outside the task's " + std::to_string(net.rounds) + " x " +
                           std::to_string(net.units_per_round));
  }
  // The bundle must be the task the ledger records (its data root among the rest): a referee
  // never works on a task whose data is not what the submitter declared.
  ML_ASSIGN_OR_RETURN(TaskInfo info, GetTask(*chain_, d.task_id));
  if (Status match = CheckBundleMatchesLedger(t->facts, net, info.params); !match.ok()) {
    refused_[d.task_id] = match.message();
    return match.WithPrefix("task " + d.task_id.ToHex());
  }
  // A stage unit's step is replayed from what the stage node serves: no start state to fetch.
  if (net.stages > 1) return ComputeStageStep(d, t);
  const ledger::TaskParams& params = info.params;
  Result<Bytes> state_bytes = get_(d.start_state);
  if (!state_bytes.ok()) {
    return state_bytes.status().WithPrefix("round " + std::to_string(d.round) + " start state " +
                                           d.start_state.ShortHex());
  }
  ML_ASSIGN_OR_RETURN(GlobalState start, DecodeGlobalState(*state_bytes, t->facts.num_params));
  // The unit's work exactly as the solver trained it.
  const UnitWork work = protocol::UnitWorkOf(net, t->facts, d.round, d.shard);
  if (d.task.segment) {
    ML_ASSIGN_OR_RETURN(RefereeRuling r, ComputeSegment(d, t, params, start.weights, work));
    ledger::RuleDisputeTx tx{.task_id = d.task_id,
                             .index = d.index,
                             .output = r.output,
                             .tolerance_verdict = r.tolerance_verdict};
    return Computed{.ruling = std::move(r), .tx = tx};
  }
  if (d.task.tile) return ComputeTileWitness(d, t, params, start.weights, work);
  // A whole step of the tile phase the ledger rules from roots (the chain end agreed, an operator
  // of the step's input state): a witness of operator output roots, whatever the model's size.
  if (d.task.roots != protocol::RefereeRoots::kRootsNone) {
    ML_ASSIGN_OR_RETURN(ledger::TileRuleContext ctx, DisputeTileContext(d, t->bundle_text, params));
    if (ledger::RulesFromRoots(ctx.plan, d.task)) {
      return ComputeTileWitness(d, t, params, start.weights, work);
    }
  }
  // A whole step of a task with a data root over examples (the ledger's record;
  // CheckBundleMatchesLedger made sure it is the data's): the ledger executes it from our witness.
  // A token task's root (over pages) serves its tiles only: its whole step is ruled here.
  const Hash256 data_root = params.data_root;
  if (d.task.whole_step && !data_root.IsZero() && params.data_page_tokens == 0) {
    return ComputeStepWitness(d, t, start.weights, work);
  }
  ML_ASSIGN_OR_RETURN(RefereeRuling r,
                      RuleWholeStep(t->trainer.get(), start.weights, work, d.task));
  ledger::RuleDisputeTx tx{.task_id = d.task_id, .index = d.index, .output = r.output};
  return Computed{.ruling = std::move(r), .tx = tx};
}

Result<RefereeService::Computed> RefereeService::ComputeStageStep(const RefereeDispute& d,
                                                                  TaskTrainer* t) {
  const NetworkSpec& net = t->bundle.net;
  const uint32_t stages = net.stages;
  // A stage unit's check has one segment per step (protocol::StageCheckLeaves): the dispute is
  // about step task.step - 1 of the stage, whose committed leaf is the defender's output.
  if ((!d.task.whole_step && !d.task.tile) || d.task.step == 0) {
    return InvalidArgument("referee: the dispute on stage unit " + std::to_string(d.index) +
                           " is not about one whole step or a tile of one");
  }
  if (d.task.challenger_output == ledger::StageContinuityLeaf(d.task.defender_output)) {
    // Nothing to replay: the claim is proven from the stage's commits by whoever holds them
    // (the parties' RunStageContinuityWitness), or it loses by the deadline.
    return FailedPrecondition(
        "referee: a continuity claim (the step does not start where the previous one ended) is "
        "the claimant's to prove with a StageContinuityWitness; nothing to rule");
  }
  if (options_.transport == nullptr) {
    return FailedPrecondition("referee: no transport to fetch the stage's evidence from");
  }
  ML_ASSIGN_OR_RETURN(TaskInfo info, GetTask(*chain_, d.task_id, /*units=*/true));
  if (!d.task.tile && d.task.roots == protocol::RefereeRoots::kRootsNone &&
      !ledger::LedgerRulesStageStep(info.params, d.shard % stages)) {
    // Over the witness bound a whole stage step is a claim that the stage served nothing: the
    // stage's evidence in pieces answers it (ServeStageEvidence, which the parties post), or the
    // stage loses at its serving window's end. The genesis key rules no stage claim.
    return FailedPrecondition(
        "referee: a whole step of a stage over the witness bound is a claim that the stage "
        "served nothing, answered by the stage's evidence in pieces (ServeStageEvidence); the "
        "genesis key rules no stage claim");
  }
  ML_ASSIGN_OR_RETURN(std::optional<NodeInfo> node, GetNode(*chain_, d.defender));
  if (!node.has_value()) {
    return NotFound("referee: the stage's node " + d.defender.ShortHex() + " is not registered");
  }
  const uint32_t replica = d.shard / stages;
  // The chain of the disputed run, derived as the ledger rules it (the unit in dispute is its
  // replica's current run).
  Result<std::vector<protocol::NodeId>> chain = ReplicaRunChain(info.units, stages, d.index);
  if (!chain.ok()) return chain.status().WithPrefix("referee");
  StageCheckInput in{.task = &t->trainer->task(),
                     .data = &t->trainer->data(),
                     .net = &net,
                     .facts = &t->facts,
                     .task_id = d.task_id,
                     .round = d.round,
                     .replica = replica,
                     .stage = d.shard % stages,
                     .chain = std::move(*chain),
                     .transport = options_.transport,
                     .endpoint = node->endpoint};
  if (d.task.tile || d.task.roots != protocol::RefereeRoots::kRootsNone) {
    return ComputeStageTile(d, t, info, in);
  }
  ML_ASSIGN_OR_RETURN(StageStepCheck c,
                      CheckStageStep(in, d.task.step - 1, d.task.defender_output));
  RefereeRuling r;
  r.output = c.leaf;
  r.true_output = c.leaf;
  r.input_true = true;
  r.reason = c.leaf == d.task.defender_output
                 ? "the stage's step replays to its committed leaf: " + c.message
                 : "the stage's step does not replay to its committed leaf: " + c.message;
  // Within the witness bound (over it, returned above): the ledger replays the step itself from
  // the witness (RefereeStageStep), the same JudgeStageStep as CheckStageStep above, so it rules
  // with r.output; the genesis key is refused for it.
  ML_ASSIGN_OR_RETURN(ledger::RefereeStageStepTx tx,
                      BuildStageStepTx(in, t->bundle_text, d.index, d.task.step - 1,
                                       d.task.defender_output, &t->pages, &t->tree));
  r.ledger_executes = true;
  r.witness_bytes = tx.witness.bytes.size();
  r.reason = "stage step " + std::to_string(d.task.step - 1) +
             " for the ledger to replay (witness of " + std::to_string(r.witness_bytes) +
             " bytes): " + r.reason;
  return Computed{.ruling = std::move(r), .tx = std::move(tx)};
}

Result<RefereeService::Computed> RefereeService::ComputeStageTile(const RefereeDispute& d,
                                                                  TaskTrainer* t,
                                                                  const TaskInfo& info,
                                                                  const StageCheckInput& in) {
  // The game played the tile phase over the stage's plan (its mismatch carried the bundle): the
  // ledger rules the tile, or the roots against the stage's committed commit, for any stage size.
  ML_ASSIGN_OR_RETURN(ledger::TileRuleContext ctx,
                      DisputeTileContext(d, t->bundle_text, info.params));
  ML_ASSIGN_OR_RETURN(TracedStageStep traced,
                      TraceStageStep(in, d.task.step - 1, /*keep_values=*/d.task.tile));
  ML_ASSIGN_OR_RETURN(ledger::RefereeTileTx tx,
                      BuildStageTileTx(ctx, d.task, traced, t->trainer->data(), d.task_id, d.index,
                                       t->bundle_text, &t->pages, &t->tree));
  // The output the ledger will compute from it (its own rules, on this copy of the task).
  Result<Hash256> output = Hash256{};
  if (d.task.tile) {
    ML_ASSIGN_OR_RETURN(ledger::TileWitness w, ledger::DecodeTileWitness(tx.witness.bytes));
    output = ledger::RuleTile(ctx, d.task, w);
  } else {
    ML_ASSIGN_OR_RETURN(ledger::StageRootsWitness w,
                        ledger::DecodeStageRootsWitness(tx.witness.bytes));
    output =
        ledger::RuleStageRoots(ctx, d.task, d.task_id, ledger::StageSlotOf(info.params, d.index),
                               info.params.stages, in.chain, w);
  }
  if (!output.ok()) return output.status().WithPrefix("referee: the stage's witness");
  RefereeRuling r;
  r.input_true = true;
  r.ledger_executes = true;
  r.tile = true;
  r.witness_bytes = tx.witness.bytes.size();
  const std::string side = TileRulingSide(d.task, *output, &r.output);
  r.true_output = r.output;
  r.reason = (d.task.tile ? "tile " + std::to_string(d.task.tile_index) + " of " +
                                ctx.plan.ops.at(d.task.operator_index - 1).name + " (block " +
                                std::to_string(d.task.block) + ")"
              : d.task.roots == protocol::RefereeRoots::kRootsChainEnd
                  ? std::string("the agreed chain end")
                  : "input operator " + std::to_string(d.task.operator_index) + " (" +
                        ctx.plan.ops.at(d.task.operator_index - 1).name + ")") +
             " of stage step " + std::to_string(d.task.step - 1) + " for the ledger to rule (" +
             (d.task.tile ? "a tile's witness" : "the committed commit and roots") + ", " +
             std::to_string(r.witness_bytes) + " bytes): " + side;
  return Computed{.ruling = std::move(r), .tx = std::move(tx)};
}

Result<RefereeService::Computed> RefereeService::ComputeStepWitness(const RefereeDispute& d,
                                                                    TaskTrainer* t,
                                                                    std::span<const float> global,
                                                                    const UnitWork& work) {
  if (t->tree == nullptr) {
    t->tree = std::make_unique<engine::DataTree>(t->trainer->data().train);
  }
  DisputeStart start{.first_step = static_cast<int64_t>(d.first_step), .agreed = d.agreed};
  if (CanFetchCheckpoints()) {
    start.checkpoint = [this, &d](int64_t step) { return LoadDefenderCheckpoint(d, step); };
  }
  ML_ASSIGN_OR_RETURN(
      BuiltStepWitness built,
      BuildStepWitness(t->trainer.get(), global, work, d.task, t->bundle_text, *t->tree, start));
  ledger::RefereeStepTx tx{.task_id = d.task_id, .index = d.index};
  tx.witness.bytes = ledger::EncodeStepWitness(built.witness);
  if (tx.witness.bytes.size() > ledger::kMaxWitnessBytes) {
    // Counted like any witness that cannot be built: given up after state_fetch_passes.
    return FailedPrecondition("the witness of step " + std::to_string(d.task.step) + " is " +
                              std::to_string(tx.witness.bytes.size()) +
                              " bytes, over the ledger's limit of " +
                              std::to_string(ledger::kMaxWitnessBytes) +
                              " (the model's training state is too large to post)");
  }
  RefereeRuling r;
  r.output = built.output;
  r.true_input = built.true_input;
  r.true_output = built.true_output;
  r.input_true = d.task.input == built.true_input;
  r.ledger_executes = true;
  r.from_checkpoint = built.from_checkpoint;
  r.witness_bytes = tx.witness.bytes.size();
  r.reason = "step " + std::to_string(d.task.step) + " for the ledger to execute (witness of " +
             std::to_string(r.witness_bytes) + " bytes): " + built.reason;
  return Computed{.ruling = std::move(r), .tx = std::move(tx)};
}

Result<RefereeService::Computed> RefereeService::ComputeTileWitness(
    const RefereeDispute& d, TaskTrainer* t, const ledger::TaskParams& params,
    std::span<const float> global, const UnitWork& work) {
  ML_ASSIGN_OR_RETURN(ledger::TileRuleContext ctx, DisputeTileContext(d, t->bundle_text, params));
  DisputeStart start{.first_step = static_cast<int64_t>(d.first_step), .agreed = d.agreed};
  if (CanFetchCheckpoints()) {
    start.checkpoint = [this, &d](int64_t step) { return LoadDefenderCheckpoint(d, step); };
  }
  // A tile task names the step's input state (C_0) as state_input; a whole step ruled from
  // roots as its input.
  const bool roots = !d.task.tile;
  ML_ASSIGN_OR_RETURN(
      TracedStep traced,
      TraceDisputedStep(t->trainer.get(), global, work, static_cast<int64_t>(d.task.step),
                        roots ? d.task.input : d.task.state_input, start));
  const engine::ClassificationData* train =
      EnsureDataProofs(t->trainer->data(), &t->pages, &t->tree);
  ML_ASSIGN_OR_RETURN(ledger::TileWitness w,
                      ledger::BuildTileWitness(ctx, d.task, *traced.trace, traced.batch, train,
                                               t->tree.get(), t->pages.get()));
  // The output the ledger will compute from it (its own rule, on this copy of the task).
  ML_ASSIGN_OR_RETURN(Hash256 output,
                      roots ? ledger::RuleRoots(ctx, d.task, w) : ledger::RuleTile(ctx, d.task, w));
  ledger::RefereeTileTx tx{.task_id = d.task_id, .index = d.index};
  tx.bundle.text = t->bundle_text;
  tx.witness.bytes = ledger::EncodeTileWitness(w);
  if (tx.witness.bytes.size() > ledger::kMaxTileWitnessBytes) {
    return FailedPrecondition(
        "the witness of " +
        (roots ? std::string("roots") : "tile " + std::to_string(d.task.tile_index)) + " is " +
        std::to_string(tx.witness.bytes.size()) + " bytes, over " +
        std::to_string(ledger::kMaxTileWitnessBytes));
  }
  RefereeRuling r;
  r.output = output;
  r.true_input = traced.input;
  r.true_output = traced.output;
  r.input_true = true;
  r.ledger_executes = true;
  r.tile = true;
  r.witness_bytes = tx.witness.bytes.size();
  const bool by_operator = d.task.roots == protocol::RefereeRoots::kRootsOperator;
  const std::string side = TileRulingSide(d.task, output, &r.output);
  if (roots) {
    r.reason =
        std::string(by_operator ? "operator " + std::to_string(d.task.operator_index) + " (" +
                                      ctx.plan.ops.at(d.task.operator_index - 1).name +
                                      ", the step's input state)"
                                : "the state after the agreed operator outputs") +
        " of step " + std::to_string(d.task.step) +
        " for the ledger to rule from roots (witness of " + std::to_string(r.witness_bytes) +
        " bytes): " + side;
    return Computed{.ruling = std::move(r), .tx = std::move(tx)};
  }
  const std::string& op = ctx.plan.ops.at(d.task.operator_index - 1).name;
  r.reason = "tile " + std::to_string(d.task.tile_index) + " of " + op + " (block " +
             std::to_string(d.task.block) + ") of step " + std::to_string(d.task.step) +
             " for the ledger to recompute (witness of " + std::to_string(r.witness_bytes) +
             " bytes): " + side;
  return Computed{.ruling = std::move(r), .tx = std::move(tx)};
}

RefereeService::Key RefereeService::KeyOf(const RefereeDispute& d) {
  return Key{d.task_id,
             d.index,
             d.task.step,
             d.task.input,
             d.task.defender_output,
             d.task.challenger_output};
}

bool RefereeService::CanFetchCheckpoints() const {
  return options_.fetch_checkpoint || options_.transport != nullptr;
}

Result<Bytes> RefereeService::FetchCheckpoint(const RefereeDispute& d, int64_t step) {
  if (options_.fetch_checkpoint) return options_.fetch_checkpoint(d, step);
  CHECK(options_.transport != nullptr);
  ML_ASSIGN_OR_RETURN(std::optional<NodeInfo> node, GetNode(*chain_, d.defender));
  if (!node || node->endpoint.empty()) {
    return Unavailable("the defender " + d.defender.ShortHex() + " has no endpoint on the chain");
  }
  ML_ASSIGN_OR_RETURN(UnitManifest m,
                      FetchUnitManifest(options_.transport, node->endpoint, d.task_id, d.index));
  return FetchUnitCheckpoint(options_.transport, node->endpoint, m, step);
}

Result<engine::TrainState> RefereeService::LoadDefenderCheckpoint(const RefereeDispute& d,
                                                                  int64_t step) {
  ML_ASSIGN_OR_RETURN(Bytes bytes, FetchCheckpoint(d, step));
  const std::string path =
      JoinPath(options_.work_dir, "defender-" + d.task_id.ToHex() + "-" + std::to_string(d.index) +
                                      "-" + std::to_string(step) + ".safetensors");
  ML_RETURN_IF_ERROR(options_.env->WriteFileAtomic(path, AsStringView(bytes)));
  Result<engine::TrainState> st = engine::LoadCheckpoint(options_.env, path);
  (void)options_.env->DeleteFile(path);
  if (!st.ok()) return st.status().WithPrefix("its checkpoint at step " + std::to_string(step));
  return st;
}

Result<RefereeRuling> RefereeService::ComputeSegment(const RefereeDispute& d, TaskTrainer* t,
                                                     const ledger::TaskParams& params,
                                                     std::span<const float> global,
                                                     const UnitWork& work) {
  if (!CanFetchCheckpoints()) {
    return FailedPrecondition(
        "a tolerance-mode dispute needs the defender's checkpoints; this "
        "referee has no transport (RefereeOptions::transport)");
  }
  const protocol::ToleranceParams tolerance{.max_rel_l2_ppm = params.tolerance_rel_l2_ppm,
                                            .max_cosine_gap_ppb = params.tolerance_cosine_gap_ppb};
  const int64_t step = static_cast<int64_t>(d.task.step);
  // The defender's end state: its checkpoint at `step`, or at step H its committed delta.
  DefenderEndState shown;
  std::optional<engine::TrainState> ckpt;
  std::vector<float> delta;
  Status fetched = [&]() -> Status {
    if (step == work.inner_steps) {
      Result<Bytes> blob = get_(d.result_hash);
      if (!blob.ok()) return blob.status().WithPrefix("its delta blob " + d.result_hash.ShortHex());
      ML_ASSIGN_OR_RETURN(delta, DecodeDelta(*blob, t->facts.num_params));
      shown.delta = &delta;
      return Status::Ok();
    }
    ML_ASSIGN_OR_RETURN(ckpt, LoadDefenderCheckpoint(d, step));
    shown.checkpoint = &*ckpt;
    return Status::Ok();
  }();
  if (!fetched.ok()) {
    const int failures = ++fetch_failures_[KeyOf(d)];
    if (failures < options_.state_fetch_passes) {
      return Unavailable("the defender's end state (pass " + std::to_string(failures) + " of " +
                         std::to_string(options_.state_fetch_passes) + "): " + fetched.message());
    }
    shown.missing = fetched.message();
  }
  fetch_failures_.erase(KeyOf(d));
  return RuleSegment(t->trainer.get(), global, work, d.task, shown, tolerance);
}

Result<std::vector<RefereeRecord>> RefereeService::Poll() {
  // Outcomes of rulings in flight.
  Status polled = tx_->Poll();
  if (!polled.ok()) Log("tx poll: " + polled.message());
  for (const TxOutcome& o : tx_->TakeOutcomes()) {
    auto it = in_flight_.find(o.id);
    if (it == in_flight_.end()) continue;
    RefereeRecord& r = rulings_[it->second];
    r.included = o.included;
    r.ok = o.ok;
    r.error = o.ok ? "" : o.reason;
    Log("task " + r.dispute.task_id.ShortHex() + " unit " + std::to_string(r.dispute.index) +
        ": ruling " +
        (o.ok ? "executed in block " + std::to_string(o.height) : "refused: " + o.reason));
    for (auto p = pending_.begin(); p != pending_.end(); ++p) {
      if (p->second == o.id) {
        pending_.erase(p);
        break;
      }
    }
    in_flight_.erase(it);
  }

  ML_ASSIGN_OR_RETURN(std::vector<RefereeDispute> work, GetRefereeWork(*chain_));
  std::vector<RefereeRecord> sent;
  for (const RefereeDispute& d : work) {
    const Key key = KeyOf(d);
    if (pending_.count(key) || given_up_.count(key) || refused_.count(d.task_id)) continue;
    const std::string name = "task " + d.task_id.ShortHex() + " unit " + std::to_string(d.index);
    auto known = computed_.find(key);  // computed before, but the send failed
    Result<Computed> computed =
        known != computed_.end() ? Result<Computed>(known->second) : Compute(d);
    if (!computed.ok()) {
      if (auto r = refused_.find(d.task_id); r != refused_.end()) {
        Log("refusing task " + d.task_id.ToHex() + " (never ruled): " + r->second);
        continue;
      }
      // A step witness that cannot be built: the agreed state is reached neither from the
      // unit's start nor from the defender's checkpoint (or that cannot be fetched).
      if ((d.task.whole_step || d.task.tile) && !d.task.segment &&
          computed.status().code() == StatusCode::kFailedPrecondition &&
          ++fetch_failures_[key] >= options_.state_fetch_passes) {
        fetch_failures_.erase(key);
        given_up_.insert(key);
        Log(name + ": giving up (the dispute ends undecided at the referee deadline): " +
            computed.status().message());
        continue;
      }
      Log(name + ": cannot rule yet: " + computed.status().message());
      continue;
    }
    fetch_failures_.erase(key);
    computed_[key] = *computed;
    const RefereeRuling& ruling = computed->ruling;
    // The transaction's own name (ledger::TxTypeName), so the record says what was sent.
    const std::string tx_type(ledger::TxTypeName(ledger::PayloadType(computed->tx)));
    Result<Hash256> id = tx_->Send(computed->tx);
    if (!id.ok()) {
      Log(name + ": sending " + tx_type + " failed: " + id.status().message());
      continue;
    }
    Log(name + " (defender " + d.defender.ShortHex() + ", challenger " + d.challenger.ShortHex() +
        "): " + tx_type + ": " + ruling.reason + "; output " + ruling.output.ShortHex());
    RefereeRecord rec{.dispute = d, .ruling = ruling, .tx_type = tx_type, .tx_id = *id};
    computed_.erase(key);
    pending_[key] = *id;
    in_flight_[*id] = rulings_.size();
    rulings_.push_back(rec);
    sent.push_back(std::move(rec));
  }
  return sent;
}

}  // namespace meshlearn::node
