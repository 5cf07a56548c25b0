#include "meshlearn/node/stage_unit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::node {

void CopyWholeParams(const engine::Model& whole, engine::Stage& stage) {
  std::map<std::string, const engine::Tensor*> by_name;
  for (const engine::Param& p : whole.params()) by_name[p.name] = &p.value;
  for (engine::Param& p : stage.params()) p.value.vec() = by_name.at(p.name)->vec();
}

std::vector<float> StageFlatParams(engine::Stage& stage) {
  size_t n = 0;
  for (const engine::Param& p : stage.params()) n += p.value.vec().size();
  std::vector<float> flat;
  flat.reserve(n);
  for (const engine::Param& p : stage.params()) {
    flat.insert(flat.end(), p.value.vec().begin(), p.value.vec().end());
  }
  return flat;
}

size_t StageLayout::StageSize(size_t s) const {
  size_t n = 0;
  for (const Range& r : stages.at(s)) n += r.size;
  return n;
}

namespace {

Result<StageLayout> LayoutOfParts(const engine::ModelSpec& spec,
                                  std::span<const engine::ModelPart> parts) {
  ML_ASSIGN_OR_RETURN(std::vector<engine::PlannedParam> whole, engine::PlanParams(spec));
  std::map<std::string, StageLayout::Range> by_name;
  StageLayout layout;
  for (const engine::PlannedParam& p : whole) {
    const size_t n = static_cast<size_t>(engine::NumElements(p.shape));
    by_name[p.name] = {.offset = static_cast<size_t>(p.offset), .size = n};
    layout.whole_size += n;
  }
  std::set<std::string> placed;
  for (size_t s = 0; s < parts.size(); ++s) {
    ML_ASSIGN_OR_RETURN(std::vector<engine::PlannedParam> own, engine::PlanParams(spec, parts[s]));
    std::vector<StageLayout::Range>& ranges = layout.stages.emplace_back();
    for (const engine::PlannedParam& p : own) {
      auto it = by_name.find(p.name);
      if (it == by_name.end() || !placed.insert(p.name).second) {
        return InvalidArgument(
            "stage layout: stage " + std::to_string(s) + "'s parameter " + p.name +
            (it == by_name.end() ? " is not in the model" : " is in an earlier stage too"));
      }
      ranges.push_back(it->second);
    }
  }
  for (const engine::PlannedParam& p : whole) {
    if (!placed.count(p.name)) {
      return InvalidArgument("stage layout: parameter " + p.name + " is in no stage");
    }
  }
  return layout;
}

}  // namespace

Result<StageLayout> StageLayoutOf(const engine::ModelSpec& spec, const engine::PipelineCut& cut) {
  std::vector<engine::ModelPart> parts;
  for (int s = 0; s < cut.stages(); ++s) parts.push_back(cut.part(s));
  return LayoutOfParts(spec, parts);
}

Result<StageLayout> StageLayoutOf(std::span<const std::unique_ptr<engine::Stage>> stages) {
  if (stages.empty()) return InvalidArgument("stage layout: no stages");
  std::vector<engine::ModelPart> parts;
  for (const std::unique_ptr<engine::Stage>& st : stages)
    parts.push_back(st->state().model->part());
  return LayoutOfParts(stages.front()->state().model->spec(), parts);
}

Result<std::vector<float>> GatherStageFlats(const StageLayout& layout,
                                            std::span<const std::vector<float>> flats) {
  if (layout.stages.size() != flats.size()) {
    return InvalidArgument("gather stage deltas: " + std::to_string(flats.size()) +
                           " stage vectors for " + std::to_string(layout.stages.size()) +
                           " stages");
  }
  std::vector<float> out(layout.whole_size);
  for (size_t s = 0; s < flats.size(); ++s) {
    if (flats[s].size() != layout.StageSize(s)) {
      return InvalidArgument("gather stage deltas: stage " + std::to_string(s) + " holds " +
                             std::to_string(layout.StageSize(s)) + " parameters, its vector " +
                             std::to_string(flats[s].size()));
    }
    size_t at = 0;
    for (const StageLayout::Range& r : layout.stages[s]) {
      std::copy_n(flats[s].begin() + static_cast<std::ptrdiff_t>(at), r.size,
                  out.begin() + static_cast<std::ptrdiff_t>(r.offset));
      at += r.size;
    }
  }
  return out;
}

std::vector<float> GatherStageParams(std::span<const std::unique_ptr<engine::Stage>> stages) {
  Result<StageLayout> layout = StageLayoutOf(stages);
  CHECK(layout.ok()) << layout.status().ToString();
  std::vector<std::vector<float>> flats;
  for (const std::unique_ptr<engine::Stage>& st : stages) flats.push_back(StageFlatParams(*st));
  Result<std::vector<float>> out = GatherStageFlats(*layout, flats);
  CHECK(out.ok()) << out.status().ToString();
  return std::move(*out);
}

Status ApplyStageRound(GlobalState* state, const StageLayout& layout,
                       std::span<const uint32_t> shards,
                       std::span<const std::vector<std::vector<float>>> deltas,
                       const NetworkSpec& net, const Hash256& content_id, uint32_t round,
                       uint64_t samples_per_unit, size_t chunk_values) {
  const protocol::AggregationRule rule = net.aggregation.rule;
  if (chunk_values == 0) return InvalidArgument("stage-by-stage aggregation: chunks of 0 values");
  if (rule == protocol::AggregationRule::kAggregationRuleCenteredClip ||
      rule == protocol::AggregationRule::kAggregationRuleKrum) {
    return InvalidArgument("stage-by-stage aggregation: rule " +
                           std::string(protocol::AggregationRuleName(rule)) +
                           " takes norms or distances over the whole delta; gather the replicas' "
                           "whole deltas (GatherStageFlats) and use ApplyRound");
  }
  if (shards.size() != deltas.size()) {
    return InvalidArgument("stage-by-stage aggregation: " + std::to_string(deltas.size()) +
                           " replicas' deltas for " + std::to_string(shards.size()) + " shards");
  }
  if (state->weights.size() != layout.whole_size || state->momentum.size() != layout.whole_size) {
    return InvalidArgument("stage-by-stage aggregation: a state of " +
                           std::to_string(state->weights.size()) + " weights and " +
                           std::to_string(state->momentum.size()) + " momenta for a model of " +
                           std::to_string(layout.whole_size));
  }
  const size_t stages = layout.stages.size();
  std::vector<size_t> kept;  // replicas whose every stage delta is finite
  for (size_t i = 0; i < deltas.size(); ++i) {
    if (deltas[i].size() != stages) {
      return InvalidArgument("stage-by-stage aggregation: replica " + std::to_string(shards[i]) +
                             " has " + std::to_string(deltas[i].size()) + " stage deltas for " +
                             std::to_string(stages) + " stages");
    }
    bool finite = true;
    for (size_t s = 0; s < stages; ++s) {
      if (deltas[i][s].size() != layout.StageSize(s)) {
        return InvalidArgument("stage-by-stage aggregation: replica " + std::to_string(shards[i]) +
                               "'s stage " + std::to_string(s) + " delta has " +
                               std::to_string(deltas[i][s].size()) + " values, the stage " +
                               std::to_string(layout.StageSize(s)));
      }
      for (float v : deltas[i][s]) finite = finite && std::isfinite(v);
    }
    if (finite) kept.push_back(i);
  }
  if (kept.empty()) {
    return FailedPrecondition("stage-by-stage aggregation: all " + std::to_string(deltas.size()) +
                              " replicas have NaN or Inf values");
  }
  // Every check is made: from here `state` changes a chunk of a parameter at a time. The rules
  // here are coordinate-wise (each value of the result is a function of that coordinate's values
  // alone) and the outer step elementwise, so applying the round to any cut of the coordinates
  // gives the same bits as to the whole; a chunk bounds what the rule allocates (its accumulator
  // and result, a few times the chunk) and what is copied out of `state`, whatever the model.
  for (size_t s = 0; s < stages; ++s) {
    size_t at = 0;  // where the range starts in the stage's delta
    for (const StageLayout::Range& r : layout.stages[s]) {
      for (size_t c = 0; c < r.size; c += chunk_values) {
        const size_t n = std::min(chunk_values, r.size - c);
        const auto begin = static_cast<std::ptrdiff_t>(r.offset + c);
        const auto end = begin + static_cast<std::ptrdiff_t>(n);
        GlobalState chunk{.weights = std::vector<float>(state->weights.begin() + begin,
                                                        state->weights.begin() + end),
                          .momentum = std::vector<float>(state->momentum.begin() + begin,
                                                         state->momentum.begin() + end)};
        std::vector<RoundDelta> round_deltas;
        for (size_t i : kept) {
          round_deltas.push_back(
              {.shard = shards[i],
               .delta = std::span<const float>(deltas[i][s]).subspan(at + c, n)});
        }
        Result<protocol::AggregateResult> agg =
            ApplyRound(&chunk, round_deltas, net, content_id, round, samples_per_unit);
        if (!agg.ok()) return agg.status().WithPrefix("stage " + std::to_string(s));
        std::copy(chunk.weights.begin(), chunk.weights.end(), state->weights.begin() + begin);
        std::copy(chunk.momentum.begin(), chunk.momentum.end(), state->momentum.begin() + begin);
      }
      at += r.size;
    }
  }
  return Status::Ok();
}

namespace {

// A stage's need in whole bytes (its CutCosts estimate rounded up): stage_memory_bytes and
// UnitMemoryBytes.
uint64_t NeedBytes(const engine::StageCost& c) {
  return static_cast<uint64_t>(std::ceil(c.total_bytes()));
}

}  // namespace

Result<uint64_t> UnitMemoryBytes(const engine::TaskSpec& task) {
  ML_ASSIGN_OR_RETURN(engine::PipelineCut whole,
                      engine::MakeCut(task.model, {0, engine::CutLayerCount(task.model)}));
  ML_ASSIGN_OR_RETURN(std::vector<engine::StageCost> costs,
                      engine::CutCosts(task.model, task.optimizer, whole, task.batch_size,
                                       task.seq_len, task.micro_batches));
  return NeedBytes(costs.at(0));
}

Result<StageTerms> StageTermsOf(const engine::TaskSpec& task, const NetworkSpec& net) {
  StageTerms terms;
  if (net.stages <= 1) return terms;
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(task, static_cast<int>(net.stages), net.cut));
  ML_ASSIGN_OR_RETURN(std::vector<engine::StageCost> costs,
                      engine::CutCosts(task.model, task.optimizer, cut, task.batch_size,
                                       task.seq_len, task.micro_batches));
  ML_ASSIGN_OR_RETURN(
      terms.boundary_bytes,
      engine::CutBoundaryBytes(task.model, cut, task.batch_size, task.seq_len, task.micro_batches));
  const size_t stages = costs.size();
  for (size_t s = 0; s < stages; ++s) {
    // A copy of every tensor the stage received and sent in a step, which its node's plane holds
    // beside the stage until the step's evidence writes them to files (StageEvidence::Publish):
    // the boundaries on either side (each boundary's bytes are the activations one way and their
    // gradients the other), and a GPT's tied weight and its head gradient between stages 0 and
    // S-1 (the one-float sums are left out).
    uint64_t step_tensors =
        (s > 0 ? terms.boundary_bytes[s - 1] : 0) + (s + 1 < stages ? terms.boundary_bytes[s] : 0);
    if (s == 0 || s + 1 == stages) step_tensors += engine::TiedWeightAndGradBytes(task.model);
    terms.step_tensor_bytes.push_back(step_tensors);
    terms.memory_bytes.push_back(NeedBytes(costs[s]) + step_tensors);
    terms.flops.push_back(costs[s].flops);
  }
  ML_ASSIGN_OR_RETURN(engine::MemoryEstimate eval, engine::EstimateEvaluationMemory(task));
  terms.eval_memory_bytes = static_cast<uint64_t>(std::ceil(eval.total()));
  return terms;
}

Status AddPipelineTerms(const engine::TaskSpec& task, const NetworkSpec& net,
                        ledger::TaskParams* params) {
  if (net.stages <= 1) return Status::Ok();
  ML_ASSIGN_OR_RETURN(StageTerms terms, StageTermsOf(task, net));
  params->stage_memory_bytes = std::move(terms.memory_bytes);
  params->stage_flops = std::move(terms.flops);
  params->stage_boundary_bytes = std::move(terms.boundary_bytes);
  params->eval_memory_bytes = terms.eval_memory_bytes;
  return Status::Ok();
}

Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       std::span<const float> global,
                                                       double lr_scale) {
  return StageFromGlobal(task, cut, stage, WeightsReader(global), lr_scale);
}

Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       const GlobalWeightsReader& global,
                                                       double lr_scale) {
  return ledger::StageFromGlobal(task, cut, stage, global.size, global.read, lr_scale);
}

namespace {

// wrong_data on a later stage: micro-batch 0's received activations are micro-batch 1's and the
// other way round. The records returned (and so committed) are the right ones, and the plane
// holds (and so serves) every tensor it received: the step's commit is well-formed and signed,
// only what the stage computed from it is not.
class SwappedActivationsLink final : public ledger::StageLink {
 public:
  explicit SwappedActivationsLink(ledger::StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const protocol::StageTensorKey& key,
                                     protocol::StageTransfer* record) override {
    if (key.kind != protocol::StageTensorKind::kStageTensorActivation || key.micro_batch > 1) {
      return inner_->Receive(key, record);
    }
    if (key.micro_batch == 1) {
      *record = record1_;
      return std::move(values0_);
    }
    ML_ASSIGN_OR_RETURN(values0_, inner_->Receive(key, record));
    protocol::StageTensorKey k1 = key;
    k1.micro_batch = 1;
    return inner_->Receive(k1, &record1_);
  }
  Result<protocol::StageTransfer> Send(const protocol::StageTensorKey& key,
                                       std::span<const float> values) override {
    return inner_->Send(key, values);
  }

 private:
  ledger::StageLink* inner_;
  std::vector<float> values0_;       // micro-batch 0's activations, used for micro-batch 1
  protocol::StageTransfer record1_;  // micro-batch 1's record, committed in its place
};

}  // namespace

void SetStageAdversary(Adversary adv, const UnitWork& work, StageRunHooks* hooks) {
  switch (adv) {
    case Adversary::kLazy:
      hooks->lazy_commit = true;
      break;
    case Adversary::kNoisy:
      hooks->perturb_after = PoisonAfterSteps(work.inner_steps);
      hooks->perturb_stream = work.stream;
      break;
    case Adversary::kDrift:
      hooks->perturb_after = PoisonAfterSteps(work.inner_steps);
      hooks->perturb_stream = work.stream;
      hooks->perturb_uncommitted = true;
      break;
    case Adversary::kWrongData:
      hooks->wrong_data_step = PoisonAfterSteps(work.inner_steps) - 1;
      break;
    case Adversary::kWrongResult:
      hooks->negate_result = true;
      break;
    default:
      break;
  }
}

Result<StageUnitOutcome> RunStageUnit(engine::Stage& stage, StagePlane& plane,
                                      std::span<const engine::Batch> batches, uint64_t dropout_seed,
                                      const StageRunHooks& hooks, StageRunProgress* progress) {
  StageRunProgress local;
  StageRunProgress& run = progress != nullptr ? *progress : local;
  if (run.commits.size() != run.losses.size() || run.commits.size() > batches.size() ||
      (run.start.empty() && !run.commits.empty())) {
    return InvalidArgument("a stage unit's run continued from " +
                           std::to_string(run.commits.size()) + " step commits and " +
                           std::to_string(run.losses.size()) + " losses (" +
                           (run.start.empty() ? "no" : "a") + " start) of " +
                           std::to_string(batches.size()) + " steps");
  }
  if (run.start.empty()) run.start = StageFlatParams(stage);
  StageUnitOutcome out;
  for (size_t i = run.commits.size(); i < batches.size(); ++i) {
    if (hooks.checkpoint) {
      ML_RETURN_IF_ERROR(hooks.checkpoint(static_cast<uint64_t>(i), stage.state()));
    }
    plane.BeginStep(static_cast<uint64_t>(i));
    // The step's start outlives this node at its keeper, sent before the step's first tensor
    // (docs/networking.md "Checkpoint replication").
    ML_RETURN_IF_ERROR(plane.KeepCheckpoint(static_cast<uint64_t>(i), stage.state()));
    const engine::Batch* batch = &batches[i];
    ledger::StageLink* link = plane.link();
    std::optional<SwappedActivationsLink> swapped;
    if (static_cast<int64_t>(i) == hooks.wrong_data_step) {
      if (stage.first()) {
        if (batches.size() < 2) {
          return InvalidArgument(
              "adversary wrong_data on the first stage trains a step on "
              "another step's batch: the unit needs inner_steps >= 2");
        }
        batch = &batches[(i + 1) % batches.size()];
      } else {
        if (stage.micro_batches() < 2) {
          return InvalidArgument("adversary wrong_data on stage " + std::to_string(stage.index()) +
                                 " swaps two micro-batches' activations: the task needs "
                                 "micro_batches >= 2");
        }
        swapped.emplace(link);
        link = &*swapped;
      }
    }
    ML_ASSIGN_OR_RETURN(StageStepOutcome step,
                        RunStageStep(stage, plane.context(), *batch, dropout_seed, *link));
    if (hooks.lazy_commit) step.commit.state_after = step.commit.state_before;
    if (hooks.perturb_after > 0 && static_cast<int64_t>(i) + 1 == hooks.perturb_after) {
      PerturbParams(stage.params(), hooks.perturb_stream);
      if (!hooks.perturb_uncommitted) step.commit.state_after = engine::StateHash(stage.state());
    }
    if (hooks.publish) {
      // The tensors it sent too, with keep_sent (else none): what the node that replaces a lost
      // neighbour re-runs that neighbour's steps from (stage_resume.h). Moved out of the plane:
      // the step's evidence writes them to files, and memory holds no second copy.
      ML_RETURN_IF_ERROR(hooks.publish(step.commit, plane.TakeStepTensors()));
    }
    run.losses.push_back(step.loss);
    run.commits.push_back(std::move(step.commit));
  }
  double loss_sum = 0;
  for (float l : run.losses) loss_sum += l;
  if (stage.last() && !batches.empty()) {
    out.mean_loss = static_cast<float>(loss_sum / static_cast<double>(batches.size()));
  }
  // A run that ends is spent: its start and commits move into the outcome.
  out.commits = std::move(run.commits);
  for (const protocol::StageStepCommit& c : out.commits) {
    out.leaves.push_back(protocol::StageStepLeaf(c));
  }
  // The pseudo-gradient start - end, computed in place over the start's copy a tensor at a time:
  // the end weights are read where they are, never copied.
  out.delta = std::move(run.start);
  size_t at = 0;
  for (const engine::Param& p : stage.params()) {
    const std::vector<float>& end = p.value.vec();
    CHECK_LE(at + end.size(), out.delta.size());
    protocol::PseudoGradientInPlace(std::span<float>(out.delta).subspan(at, end.size()), end);
    at += end.size();
  }
  CHECK_EQ(at, out.delta.size());
  if (hooks.negate_result) {
    for (float& d : out.delta) d = -d;
  }
  if (hooks.malformed_result && !out.delta.empty()) out.delta.pop_back();
  out.result_hash = ledger::DeltaBlobId(out.delta);
  out.commitment = protocol::StageCommitment(out.leaves);
  return out;
}

Result<std::vector<protocol::StageStepCommit>> CheckStageCommits(ByteSpan blob,
                                                                 const StageCommitsOf& unit) {
  Result<std::vector<protocol::StageStepCommit>> c = protocol::DecodeStageStepCommits(
      blob, static_cast<uint32_t>(std::min<uint64_t>(unit.inner_steps, UINT32_MAX)));
  if (!c.ok()) return DataLoss("does not decode: " + c.status().message());
  if (c->size() != unit.inner_steps) {
    return DataLoss("holds " + std::to_string(c->size()) + " step commits; the task has " +
                    std::to_string(unit.inner_steps) + " inner steps");
  }
  std::vector<Hash256> leaves;
  for (const protocol::StageStepCommit& s : *c) {
    if (s.step != leaves.size()) {
      return DataLoss("commit " + std::to_string(leaves.size()) + " is of step " +
                      std::to_string(s.step));
    }
    if (s.task != unit.task_id || s.round != unit.round || s.replica != unit.replica ||
        s.stage != unit.stage || s.stages != unit.stages) {
      return DataLoss("step " + std::to_string(s.step) + "'s commit is of round " +
                      std::to_string(s.round) + " replica " + std::to_string(s.replica) +
                      " stage " + std::to_string(s.stage) + " of " + std::to_string(s.stages) +
                      " (or another task)");
    }
    leaves.push_back(protocol::StageStepLeaf(s));
  }
  if (const Hash256 root = protocol::StageCommitment(leaves); root != unit.commitment) {
    return DataLoss("is not what it committed: their StageCommitment is " + root.ToHex() +
                    ", its commitment " + unit.commitment.ToHex());
  }
  return std::move(*c);
}

namespace {

// Whether `op` reads operator `k`'s output.
bool ReadsOperator(const engine::TileOp& op, int64_t k) {
  if (op.x == k || op.w == k || op.b == k || op.v == k || op.clip_norm == k) return true;
  return std::find(op.sources.begin(), op.sources.end(), k) != op.sources.end();
}

}  // namespace

Result<engine::OpTrace> CorruptSentTrace(
    const engine::TilePlan& plan, const engine::OpTrace& honest,
    const protocol::StageStepCommit& commit,
    const std::function<bool(const protocol::StageTensorKey&)>& corrupt) {
  std::set<int64_t> faulty;
  for (const protocol::StageTransfer& t : commit.sent) {
    if (!corrupt(t.key)) continue;
    const int64_t k = ledger::StageSentOperator(plan, t.key);
    if (k < 0 || static_cast<size_t>(k) >= honest.size()) {
      return FailedPrecondition("a faulty kernel's trace: the plan has no operator for the sent " +
                                t.key.ToString());
    }
    for (size_t j = static_cast<size_t>(k) + 1; j < plan.ops.size(); ++j) {
      if (ReadsOperator(plan.ops[j], k)) {
        return FailedPrecondition("a faulty kernel's trace: " + plan.ops[j].name + " reads " +
                                  plan.ops[static_cast<size_t>(k)].name +
                                  ", which the stage sent (" + t.key.ToString() +
                                  "): the rest of the step would differ too");
      }
    }
    faulty.insert(k);
  }
  engine::OpTrace out;
  out.set_keep_values(true);
  for (size_t i = 0; i < honest.size(); ++i) {
    const std::span<const float> v = honest.values(i);
    const engine::TileGrid& g = honest.grid(i);
    if (faulty.count(static_cast<int64_t>(i))) {
      out.Record(honest.name(i), CorruptedStageTensor(v), g.rows, g.cols);
    } else {
      out.Record(honest.name(i), v, g.rows, g.cols);
    }
  }
  return out;
}

void StageHost::Register(net::Router* router, uint64_t max_push_bytes) {
  router->Register(
      kMethodStagePush, [this](const net::Request& r) { return HandlePush(r); },
      static_cast<size_t>(max_push_bytes));
  router->Register(
      kMethodStageKeep, [this](const net::Request& r) { return HandleKeep(r); }, kMaxEncodedLength);
  router->Register(
      kMethodStageKept, [this](const net::Request& r) { return HandleKept(r); }, 256);
  router->Register(
      kMethodStageResume, [this](const net::Request& r) { return HandleResume(r); },
      Hash256::kSize + 16);
}

std::unique_ptr<StageHost::Attachment> StageHost::Attach(StagePlane* plane) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(plane_ == nullptr) << "a stage host runs one stage unit at a time";
  plane_ = plane;
  return std::unique_ptr<Attachment>(new Attachment(this));
}

StageHost::Attachment::~Attachment() {
  std::lock_guard<std::mutex> lock(host_->mu_);
  // The run's plane goes with its run; what it keeps for its neighbours stays with the node.
  for (auto& [stage, k] : host_->plane_->kept()) host_->KeepLocked(std::move(k));
  host_->plane_ = nullptr;
}

void StageHost::KeepLocked(KeptCheckpoint k) {
  const protocol::StageStateClaim& c = k.claim;
  const KeptKey key{c.task, c.round, c.replica, c.stage};
  auto it = kept_.find(key);
  if (it == kept_.end() || it->second.claim.step <= c.step) kept_[key] = std::move(k);
}

std::optional<KeptCheckpoint> StageHost::Kept(const Hash256& task, uint32_t round, uint32_t replica,
                                              uint32_t stage) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<KeptCheckpoint> out;
  auto it = kept_.find({task, round, replica, stage});
  if (it != kept_.end()) out = it->second;
  if (plane_ != nullptr) {
    const StageContext ctx = plane_->context();
    if (ctx.task == task && ctx.round == round && ctx.replica == replica) {
      std::map<uint32_t, KeptCheckpoint> now = plane_->kept();
      auto p = now.find(stage);
      if (p != now.end() && (!out || out->claim.step <= p->second.claim.step)) {
        out = std::move(p->second);
      }
    }
  }
  return out;
}

size_t StageHost::WithdrawKeptBefore(const Hash256& task, uint32_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::erase_if(kept_, [&](const auto& kv) {
    return std::get<0>(kv.first) == task && std::get<1>(kv.first) < round;
  });
}

uint64_t StageHost::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [key, k] : kept_) n += k.checkpoint.size();
  return n;
}

namespace {

Bytes EncodeKeptRequest(const Hash256& task, uint32_t round, uint32_t replica, uint32_t stage) {
  Encoder e;
  e.PutHash(task).PutU32(round).PutU32(replica).PutU32(stage);
  return e.Take();
}

}  // namespace

Result<Bytes> StageHost::HandleKept(const net::Request& request) const {
  Decoder d(request.body, "stage.kept request");
  Hash256 task;
  uint32_t round = 0, replica = 0, stage = 0;
  ML_RETURN_IF_ERROR(d.GetHash(&task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&round, "round"));
  ML_RETURN_IF_ERROR(d.GetU32(&replica, "replica"));
  ML_RETURN_IF_ERROR(d.GetU32(&stage, "stage"));
  ML_RETURN_IF_ERROR(d.Finish());
  std::optional<KeptCheckpoint> k = Kept(task, round, replica, stage);
  if (!k) {
    return NotFound("stage.kept: this node keeps no checkpoint of stage " + std::to_string(stage) +
                    " of replica " + std::to_string(replica) + ", round " + std::to_string(round) +
                    " of task " + task.ShortHex());
  }
  Encoder e;
  e.PutBytes(protocol::EncodeStageStateClaim(k->claim));
  e.PutBytes(k->checkpoint);
  return e.Take();
}

Result<KeptCheckpoint> FetchKeptCheckpoint(net::Transport* transport, const std::string& endpoint,
                                           const Hash256& task, uint32_t round, uint32_t replica,
                                           uint32_t stages, uint32_t stage,
                                           const protocol::NodeId& signer) {
  net::Request req;
  req.method = kMethodStageKept;
  req.body = EncodeKeptRequest(task, round, replica, stage);
  ML_ASSIGN_OR_RETURN(Bytes answer, transport->Send(endpoint, std::move(req)));
  const std::string from = "stage.kept from " + endpoint;
  Decoder d(answer, from);
  Bytes claim_bytes;
  KeptCheckpoint k;
  ML_RETURN_IF_ERROR(d.GetBytes(&claim_bytes, "claim", 4096));
  ML_RETURN_IF_ERROR(d.GetBytes(&k.checkpoint, "checkpoint"));
  ML_RETURN_IF_ERROR(d.Finish());
  Result<protocol::StageStateClaim> claim = protocol::DecodeStageStateClaim(claim_bytes);
  if (!claim.ok()) return claim.status().WithPrefix(from);
  k.claim = std::move(*claim);
  const protocol::StageStateClaim& c = k.claim;
  if (c.task != task || c.round != round || c.replica != replica || c.stages != stages ||
      c.stage != stage) {
    return InvalidArgument(from + ": a claim of " + protocol::StageStateClaimName(c) + " (task " +
                           c.task.ShortHex() + ", " + std::to_string(c.stages) +
                           " stages), not of the stage asked for");
  }
  Status checked = CheckKeptCheckpoint(k, signer);
  if (!checked.ok()) return checked.WithPrefix(from);
  return k;
}

Result<Bytes> StageHost::HandlePush(const net::Request& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (plane_ == nullptr) {
    return Unavailable("stage.push: this node runs no stage unit yet (retry)");
  }
  return plane_->HandlePush(request);
}

Result<Bytes> StageHost::HandleResume(const net::Request& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (plane_ == nullptr) {
    return Unavailable("stage.resume: this node runs no stage unit yet (retry)");
  }
  return plane_->HandleResume(request);
}

Result<Bytes> StageHost::HandleKeep(const net::Request& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (plane_ == nullptr) {
    return Unavailable("stage.keep: this node runs no stage unit yet (retry)");
  }
  return plane_->HandleKeep(request);
}

}  // namespace meshlearn::node
