#include "aggregator.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "journal.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/aggregate.h"
#include "records.h"

namespace meshlearn::node {

namespace {

std::string JournalPath(const NodeContext& node, const AggregationAssignment& a) {
  return JoinPath(JoinPath(node.options().data_dir, "aggregates"),
                  a.task_id.ToHex() + "-" + std::to_string(a.round) + ".json");
}

std::string Name(const AggregationAssignment& a) {
  return "aggregate " + a.task_id.ShortHex() + " r" + std::to_string(a.round);
}

// The journal of `a`'s round when it aggregated exactly a's inputs from a's start state (a round
// that re-ran, after fraud, a forced error or an unavailable delta, has other inputs).
Result<journal::AggregateDone> Journaled(const NodeContext& node, const AggregationAssignment& a) {
  ML_ASSIGN_OR_RETURN(journal::AggregateDone d, journal::ReadJournal<journal::AggregateDone>(
                                                    node.env(), JournalPath(node, a)));
  bool same = d.start_state == a.start_state && d.input_indices.size() == a.units.size() &&
              d.input_results.size() == a.units.size();
  for (size_t i = 0; same && i < a.units.size(); ++i) {
    same = d.input_indices[i] == a.units[i].index && d.input_results[i] == a.units[i].result_hash;
  }
  if (!same) return NotFound("the journal is of other inputs");
  return d;
}

// The bytes of `state`'s optimizer state tensors (AdamW's m and v).
uint64_t MomentBytes(engine::TrainState& state) {
  uint64_t bytes = 0;
  if (state.optimizer == nullptr) return bytes;
  for (const engine::Optimizer::NamedState& s : state.optimizer->State()) {
    bytes += static_cast<uint64_t>(s.tensor->size()) * sizeof(float);
  }
  return bytes;
}

// The bytes of `state`'s model's gradients.
uint64_t GradientBytes(const engine::TrainState& state) {
  uint64_t bytes = 0;
  if (state.model == nullptr) return bytes;
  for (const engine::Param& p : state.model->params()) {
    bytes += static_cast<uint64_t>(p.grad.size()) * sizeof(float);
  }
  return bytes;
}

}  // namespace

std::vector<const AggregationAssignment*> Aggregator::Pending(const NodeWork& work) {
  std::vector<const AggregationAssignment*> aggs;
  for (const AggregationAssignment& a : work.aggregations) {
    auto key = std::make_pair(a.task_id, a.round);
    if (commits_.count(key)) continue;
    if (committed_.erase(key) > 0) {
      // Our aggregate of this round was included, yet we are asked again: the round was re-run
      // (fraud, a forced error, an unavailable delta) and its inputs changed.
      node_->Log("task " + a.task_id.ShortHex() + " round " + std::to_string(a.round) +
                 ": aggregating again after the round was re-run");
    }
    aggs.push_back(&a);
  }
  return aggs;
}

Aggregator::RoundState Aggregator::StateOf(const AggregationAssignment& a) const {
  const auto key = std::make_pair(a.task_id, a.round);
  if (commits_.count(key)) return RoundState::kCommitting;
  if (committed_.count(key)) return RoundState::kCommitted;
  Result<journal::AggregateDone> d = Journaled(*node_, a);
  if (d.ok() && node_->deps().store->HasBlob(net::BlobId{d->state})) return RoundState::kAggregated;
  return RoundState::kNew;
}

bool Aggregator::Overtaken(const TxOutcome& o) {
  if (o.ok) return false;
  for (const auto& [key, c] : commits_) {
    if (c.tx != o.id) continue;
    Result<TaskInfo> t = GetTask(node_->chain(), key.first, /*units=*/true);
    if (!t.ok()) return false;  // cannot tell: counted as a failure
    for (const AggregationInput& in : c.inputs) {
      auto u = std::find_if(t->units.begin(), t->units.end(),
                            [&](const UnitRecord& r) { return r.index == in.index; });
      if (u == t->units.end() || u->round != key.second ||
          u->status != ledger::WorkUnitStatus::kCommitted || u->result_hash != in.result_hash) {
        return true;
      }
    }
    return false;
  }
  return false;
}

bool Aggregator::OnOutcome(const TxOutcome& o) {
  for (auto it = commits_.begin(); it != commits_.end(); ++it) {
    if (it->second.tx != o.id) continue;
    if (o.ok) {
      ++node_->stats().aggregations_ok;
      committed_.insert(it->first);
    }
    commits_.erase(it);
    return true;
  }
  return false;
}

Status Aggregator::Run(const AggregationAssignment& a) {
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(a.task_id));
  Aggregate agg;
  if (StateOf(a) == RoundState::kAggregated) {
    ML_ASSIGN_OR_RETURN(journal::AggregateDone d, Journaled(*node_, a));
    agg = Aggregate{.state = d.state, .accuracy_ppm = d.accuracy_ppm, .loss_micros = d.loss_micros};
    ML_RETURN_IF_ERROR(node_->book().Add(agg.state, StateReason(a.task_id)));
  } else {
    ML_ASSIGN_OR_RETURN(agg, Compute(a, ctx));
  }
  ML_ASSIGN_OR_RETURN(Hash256 txid, node_->tx().Send(ledger::CommitAggregateTx{
                                        .task_id = a.task_id,
                                        .round = a.round,
                                        .node_id = node_->id(),
                                        .state_hash = agg.state,
                                        .test_accuracy_ppm = agg.accuracy_ppm,
                                        .test_loss_micros = agg.loss_micros}));
  commits_[std::make_pair(a.task_id, a.round)] = InFlight{.tx = txid, .inputs = a.units};
  ++node_->stats().aggregations;
  return Status::Ok();
}

Status Aggregator::FetchDeltas(const AggregationAssignment& a, TaskContext* ctx,
                               std::vector<std::vector<float>>* deltas,
                               std::vector<protocol::UnitId>* ids) {
  ML_RETURN_IF_ERROR(node_->Providers(true).status());
  std::map<PublicKey, std::string> endpoint_of;
  for (const NodeInfo& ni : node_->nodes()) endpoint_of[ni.id] = ni.endpoint;
  deltas->reserve(a.units.size());
  for (const AggregationInput& in : a.units) {
    ML_ASSIGN_OR_RETURN(Bytes fetched, FetchInput(a, in, in.result_hash, endpoint_of));
    Result<std::vector<float>> d = DecodeDelta(fetched, ctx->facts.num_params);
    if (!d.ok()) {
      ++node_->stats().bad_deltas;
      node_->Log(Name(a) + ": leaving out unit " + std::to_string(in.index) + " of node " +
                 in.node.ShortHex() + ": " + d.status().message());
      continue;
    }
    deltas->push_back(std::move(*d));
    ids->push_back(protocol::UnitId{ctx->facts.content_id, a.round, in.shard});
  }
  return Status::Ok();
}

Status Aggregator::ApplyStages(const AggregationAssignment& a, TaskContext* ctx, GlobalState* state,
                               size_t* replicas) {
  const NetworkSpec& net = ctx->bundle.net;
  const ledger::TaskParams& params = ctx->info.params;
  const engine::TaskSpec& task = ctx->task;
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(task, static_cast<int>(net.stages), net.cut));
  // Where the stages' parameters sit in the model's flat vector: from the spec alone, since
  // building the stages would hold a second whole model (their weights and optimizer moments).
  ML_ASSIGN_OR_RETURN(StageLayout layout, StageLayoutOf(task.model, cut));
  ML_RETURN_IF_ERROR(node_->Providers(true).status());
  std::map<PublicKey, std::string> endpoint_of;
  for (const NodeInfo& ni : node_->nodes()) endpoint_of[ni.id] = ni.endpoint;
  // replica -> its stages' deltas; a replica with a stage not among the inputs is left out.
  std::map<uint32_t, std::vector<std::optional<std::vector<float>>>> by_replica;
  for (const AggregationInput& in : a.units) {
    const ledger::StageSlot slot = ledger::StageSlotOf(params, in.index);
    if (slot.round != a.round || slot.stage >= net.stages) {
      return InvalidArgument(Name(a) + ": input unit " + std::to_string(in.index) +
                             " is not a stage unit of round " + std::to_string(a.round));
    }
    // The blob lives until the end of this iteration: one at a time beside the decoded deltas.
    ML_ASSIGN_OR_RETURN(Bytes fetched, FetchInput(a, in, in.result_hash, endpoint_of));
    auto& stages = by_replica[slot.replica];
    stages.resize(net.stages);
    Result<std::vector<float>> d = DecodeDelta(fetched, layout.StageSize(slot.stage));
    Status malformed = d.status().WithPrefix("its delta " + in.result_hash.ShortHex());
    if (malformed.ok()) {
      ML_RETURN_IF_ERROR(KeepStageCommits(a, in, slot, net, endpoint_of, &malformed));
    }
    if (!malformed.ok()) {
      // An honest stage's result is its delta and its commits check: this one is the stage's
      // node's fault. Leaving its replica out would pay the round's every stage for a replica
      // the model never got (and a round whose every replica had one would never aggregate):
      // the round re-runs without the node instead.
      ++node_->stats().bad_deltas;
      ReportMalformed(a, in, slot, malformed);
      return FailedPrecondition(Name(a) + ": replica " + std::to_string(slot.replica) + " stage " +
                                std::to_string(slot.stage) + " (unit " + std::to_string(in.index) +
                                ", node " + in.node.ShortHex() + "): " + malformed.message() +
                                "; reported, no aggregate committed: the round re-runs without "
                                "the node");
    }
    stages[slot.stage] = std::move(*d);
  }
  std::vector<uint32_t> shards;
  std::vector<std::vector<std::vector<float>>> deltas;  // [replica][stage]
  for (auto& [replica, stages] : by_replica) {
    if (!std::all_of(stages.begin(), stages.end(), [](const auto& d) { return d.has_value(); })) {
      continue;
    }
    shards.push_back(replica);
    std::vector<std::vector<float>> flat;
    for (auto& d : stages) flat.push_back(std::move(*d));
    deltas.push_back(std::move(flat));
  }
  *replicas = shards.size();
  const uint64_t samples = UnitSamples(task, net);
  const protocol::AggregationRule rule = net.aggregation.rule;
  if (rule != protocol::AggregationRule::kAggregationRuleCenteredClip &&
      rule != protocol::AggregationRule::kAggregationRuleKrum) {
    // Stage by stage, ApplyRound's round: the one derivation `meshlearn diloco` uses.
    return ApplyStageRound(state, layout, shards, deltas, net, ctx->facts.content_id, a.round,
                           samples);
  }
  // The rules over whole deltas (norms, distances): each replica's stage deltas gathered in model
  // order are its unsplit unit's delta, bit for bit. Each replica's stage deltas are freed once
  // gathered, so that the round's deltas are held once, not twice.
  std::vector<std::vector<float>> wholes;  // RoundDelta holds a span: they must outlive it
  for (std::vector<std::vector<float>>& stages : deltas) {
    ML_ASSIGN_OR_RETURN(std::vector<float> w, GatherStageFlats(layout, stages));
    wholes.push_back(std::move(w));
    std::vector<std::vector<float>>().swap(stages);
  }
  std::vector<RoundDelta> round;
  for (size_t i = 0; i < wholes.size(); ++i)
    round.push_back({.shard = shards[i], .delta = wholes[i]});
  return ApplyRound(state, round, net, ctx->facts.content_id, a.round, samples).status();
}

Result<Aggregator::Aggregate> Aggregator::Compute(const AggregationAssignment& a,
                                                  TaskContext* ctx) {
  const NetworkSpec& net = ctx->bundle.net;
  ML_ASSIGN_OR_RETURN(GlobalState state, node_->StartState(*ctx, a.task_id, a.start_state));
  if (ledger::IsPipelineTask(ctx->info.params)) {
    size_t replicas = 0;
    ML_RETURN_IF_ERROR(ApplyStages(a, ctx, &state, &replicas));
    return Finish(
        a, ctx, state,
        std::to_string(replicas) + " replicas of " + std::to_string(net.stages) + " stages");
  }
  // The round's deltas and the rule's result are freed before Finish encodes the new state
  // (protocol::AggregatorMemoryBytes counts them or the state's blob, not both).
  size_t applied = 0;
  {
    std::vector<std::vector<float>> deltas;
    std::vector<protocol::UnitId> ids;
    ML_RETURN_IF_ERROR(FetchDeltas(a, ctx, &deltas, &ids));
    std::vector<protocol::Contribution> contributions;
    ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
    const uint64_t samples = UnitSamples(*trainer, net);
    for (size_t i = 0; i < deltas.size(); ++i) {
      contributions.push_back({.unit = ids[i], .samples = samples, .delta = deltas[i]});
    }
    ML_ASSIGN_OR_RETURN(protocol::AggregateResult result,
                        protocol::Aggregate(contributions, net.aggregation));
    if (!result.rejected.empty()) {
      node_->Log(Name(a) + ": the rule rejected " + std::to_string(result.rejected.size()) +
                 " contributions with NaN/Inf");
    }
    protocol::OuterStep(state.weights, state.momentum, result.delta, net.outer);
    applied = contributions.size();
  }
  return Finish(a, ctx, state, std::to_string(applied) + " deltas");
}

Result<Aggregator::Aggregate> Aggregator::Finish(const AggregationAssignment& a, TaskContext* ctx,
                                                 const GlobalState& state,
                                                 const std::string& inputs) {
  engine::EvalResult eval;
  if (ledger::IsPipelineTask(ctx->info.params)) {
    // A pipeline task's aggregator trains nothing of the whole model (its stage units and their
    // replays build their stages): it evaluates with the weights alone, never the whole model's
    // trainer (its gradients and optimizer moments, three times the weights with AdamW), so the
    // node is placed by its stage's need, not the whole model's training state.
    ML_ASSIGN_OR_RETURN(engine::Evaluator * evaluator, ctx->Evaluator());
    ML_RETURN_IF_ERROR(evaluator->SetFlatParams(state.weights));
    eval = evaluator->Evaluate();
  } else {
    ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
    ML_RETURN_IF_ERROR(trainer->SetFlatParams(state.weights));
    eval = trainer->Evaluate();
  }
  // What the node holds of the whole model's training state after aggregating: its trainer's,
  // if any role built one (none on a pipeline task's aggregator).
  engine::TrainState* held = nullptr;
  if (ctx->has_trainer()) held = &(*ctx->Trainer())->state();
  node_->stats().whole_model_moments_bytes = held ? MomentBytes(*held) : 0;
  node_->stats().whole_model_gradient_bytes = held ? GradientBytes(*held) : 0;
  Aggregate agg;
  agg.accuracy_ppm =
      eval.accuracy >= 0 ? static_cast<uint32_t>(std::llround(eval.accuracy * 1e6)) : 0;
  agg.loss_micros = std::isfinite(eval.loss) && eval.loss > 0
                        ? static_cast<uint64_t>(std::llround(eval.loss * 1e6))
                        : 0;
  ML_ASSIGN_OR_RETURN(net::BlobId sid, node_->deps().store->Put(EncodeGlobalState(state)));
  ML_RETURN_IF_ERROR(node_->book().Add(sid.hash, StateReason(a.task_id)));
  agg.state = sid.hash;
  journal::AggregateDone d{.start_state = a.start_state,
                           .state = agg.state,
                           .accuracy_ppm = agg.accuracy_ppm,
                           .loss_micros = agg.loss_micros};
  for (const AggregationInput& in : a.units) {
    d.input_indices.push_back(in.index);
    d.input_results.push_back(in.result_hash);
  }
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(JoinPath(node_->options().data_dir, "aggregates")));
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), JournalPath(*node_, a), d));
  node_->Log(Name(a) + ": " + inputs + ", test accuracy " + std::to_string(eval.accuracy) +
             " loss " + std::to_string(eval.loss) + ", state " + agg.state.ShortHex());
  return agg;
}

Result<Bytes> Aggregator::FetchInput(const AggregationAssignment& a, const AggregationInput& in,
                                     const Hash256& blob,
                                     const std::map<PublicKey, std::string>& endpoint_of) {
  std::vector<std::string> preferred;
  if (auto it = endpoint_of.find(in.node); it != endpoint_of.end()) preferred.push_back(it->second);
  Result<Bytes> fetched = node_->FetchBlob(blob, preferred, /*reason=*/"");
  if (!fetched.ok()) ReportIfUnavailable(a.task_id, in.index, in.result_hash, fetched.status());
  return fetched;
}

Status Aggregator::KeepStageCommits(const AggregationAssignment& a, const AggregationInput& in,
                                    const ledger::StageSlot& slot, const NetworkSpec& net,
                                    const std::map<PublicKey, std::string>& endpoint_of,
                                    Status* malformed) {
  const Hash256& commits = in.stage_commits;
  if (commits.IsZero()) {
    *malformed = DataLoss("its CommitStage named no step commits");
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(Bytes blob, FetchInput(a, in, commits, endpoint_of));
  *malformed = CheckStageCommits(blob, {.task_id = a.task_id,
                                        .round = a.round,
                                        .replica = slot.replica,
                                        .stage = slot.stage,
                                        .stages = net.stages,
                                        .inner_steps = net.inner_steps,
                                        .commitment = in.commitment})
                   .status()
                   .WithPrefix("its step commits blob " + commits.ShortHex());
  if (!malformed->ok()) return Status::Ok();
  return node_->book().Add(commits, StateReason(a.task_id));
}

void Aggregator::ReportMalformed(const AggregationAssignment& a, const AggregationInput& in,
                                 const ledger::StageSlot& slot, const Status& why) {
  Report(a.task_id, in.index, in.result_hash,
         "replica " + std::to_string(slot.replica) + " stage " + std::to_string(slot.stage) +
             " of node " + in.node.ShortHex() + ": " + why.message());
}

void Aggregator::Report(const Hash256& task_id, uint32_t index, const Hash256& result,
                        const std::string& why) {
  const auto key = std::make_tuple(task_id, index, result);
  if (reported_.count(key)) return;
  Result<Hash256> txid = node_->tx().Send(
      ledger::ReportUnavailableTx{.task_id = task_id, .index = index, .node_id = node_->id()});
  if (!txid.ok()) {
    node_->Log("reporting unit " + std::to_string(index) +
               " unavailable failed: " + txid.status().message());
    return;
  }
  reported_.insert(key);
  node_->Log("task " + task_id.ShortHex() + " unit " + std::to_string(index) + ": " + why +
             "; reported unavailable, the round re-runs without its solver");
}

void Aggregator::ReportIfUnavailable(const Hash256& task_id, uint32_t index, const Hash256& result,
                                     const Status& why) {
  const uint32_t tries = ++fetch_failures_[std::make_pair(task_id, index)];
  if (tries < std::max<uint32_t>(node_->options().report_unavailable_after, 1)) return;
  Report(task_id, index, result,
         "its delta could not be fetched from anyone after " + std::to_string(tries) + " tries (" +
             why.message() + ")");
}

}  // namespace meshlearn::node
