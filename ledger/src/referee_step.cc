#include "referee_step.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/stage_step.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::ledger {

Result<TaskBundleSpec> ParseTaskBundle(const TaskRecord& t, const std::string& bundle,
                                       const std::string& where) {
  // The task: the bundle the submitter published.
  const BlobId bundle_id = BuildManifest(AsBytes(bundle)).id();
  if (bundle_id.hash != t.spec_hash) {
    return InvalidArgument(where + ": the witness's bundle has blob id " + bundle_id.ShortHex() +
                           ", the task's spec_hash is " + t.spec_hash.ShortHex() +
                           "; send the task's own bundle text");
  }
  const std::string bundle_name = "task bundle " + t.spec_hash.ShortHex();
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle, bundle_name, "");
  if (!spec.ok()) return FailedPrecondition(where + ": " + spec.status().message());
  // The bundle's [network] table, through the parser every node uses: the ledger derives the
  // unit from the same NetworkSpec, not from a reading of its own.
  Result<ConfigFile> cfg = ConfigFile::Parse(bundle, bundle_name);
  if (!cfg.ok()) return FailedPrecondition(where + ": " + cfg.status().message());
  Result<protocol::NetworkSpec> net = protocol::NetworkSpec::FromConfig(*cfg);
  if (!net.ok()) return FailedPrecondition(where + ": " + net.status().message());
  // A GPT whose vocabulary the bundle leaves to its data: the one the task's weights were made
  // with (params.model_bytes), as every node has it after loading the data. Every ruling that
  // builds or plans the model from the bundle sees the same model the nodes train.
  Result<engine::ModelSpec> model = ModelSpecForState(spec->model, t.params.model_bytes / 4);
  if (!model.ok()) return FailedPrecondition(where + ": " + model.status().message());
  spec->model = std::move(*model);
  return TaskBundleSpec{std::move(*spec), std::move(*net)};
}

namespace {

// The task and unit replay parameters a witness's bundle gives, checked against the chain.
struct UnitReplay {
  engine::TaskSpec spec;
  protocol::NetworkSpec net;
  uint64_t stream = 0;
  double lr_scale = 1.0;
};

Result<UnitReplay> LoadUnitReplay(const TaskRecord& t, const WorkUnit& unit,
                                  const std::string& bundle, const std::string& where) {
  ML_ASSIGN_OR_RETURN(TaskBundleSpec b, ParseTaskBundle(t, bundle, where));
  // The unit, exactly as a solver trains it. A stage unit trains its replica's work: every stage
  // of a replica draws the same batches (as the Stager and RuleStageStepWitness draw them).
  UnitReplay r;
  r.spec = std::move(b.spec);
  r.net = std::move(b.net);
  const uint32_t shard =
      IsPipelineTask(t.params) ? StageSlotOf(t.params, unit.index).replica : unit.shard;
  const protocol::UnitWork work =
      protocol::UnitWorkOf(r.net, r.spec.seed, engine::TaskContentId(r.spec), unit.round, shard);
  r.stream = work.stream;
  r.lr_scale = work.lr_scale;
  return r;
}

// The tile plan of stage `stage`'s step of the task `r` replays: PlanStageStepTiles of the task's
// cut (an error for a cut that does not fit, or that makes a stage without parameters: the
// engine refuses it, TaskPipelineCut, so every stage has state to rule its chain end from).
Result<engine::TilePlan> StageStepPlan(const UnitReplay& r, const engine::OptimizerSpec& optimizer,
                                       uint32_t stage) {
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(r.spec, static_cast<int>(r.net.stages), r.net.cut));
  return engine::PlanStageStepTiles(r.spec.model, optimizer, cut.part(static_cast<int>(stage)),
                                    r.spec.batch_size, r.spec.seq_len, r.spec.micro_batches);
}

// The unit's training state after `step` from `flat` (FlatState's layout), checked to hash to
// `expected` (`what` names it in the error).
Result<engine::TrainState> CheckedState(const engine::TaskSpec& spec, double lr_scale,
                                        uint64_t stream, std::span<const float> flat, int64_t step,
                                        const Hash256& expected, const std::string& where,
                                        const std::string& what) {
  Result<engine::TrainState> st =
      engine::StateFromFlat(spec.model, engine::UnitOptimizerSpec(spec.optimizer, lr_scale), flat,
                            step, spec.seed, stream);
  if (!st.ok()) return InvalidArgument(where + ": witness state: " + st.status().message());
  const Hash256 h = engine::StateHash(*st);
  if (h != expected) {
    return InvalidArgument(where + ": the witness state hashes to " + h.ShortHex() + ", " + what +
                           " is " + expected.ShortHex());
  }
  return st;
}

// The global state round `round` of `t` started from, given as its blob `blob`: its blob id must
// be the one the chain names (round 0: params.initial_state; else round round - 1's aggregate).
Result<protocol::GlobalState> RoundStart(const TaskRecord& t, uint32_t round, ByteSpan blob,
                                         const std::string& where) {
  if (round > t.round_results.size()) {
    return FailedPrecondition(where + ": round " + std::to_string(round) +
                              " has no recorded start state");
  }
  const Hash256 start_id = round == 0 ? t.params.initial_state : t.round_results[round - 1].state;
  const BlobId given = BuildManifest(blob).id();
  if (given.hash != start_id) {
    return InvalidArgument(where + ": the witness's start state has blob id " + given.ShortHex() +
                           ", round " + std::to_string(round) + " started from " +
                           start_id.ShortHex());
  }
  Result<protocol::GlobalState> start = protocol::DecodeGlobalState(blob);
  if (!start.ok()) return InvalidArgument(where + ": " + start.status().message());
  return start;
}

}  // namespace

// The batch of the step after `before` steps (0-based step index `before`), from `examples` (the
// witness's examples of that step): one per batch position, each the index the unit's sampler
// draws there (BatchIndices), each proven against `data_root`.
Result<engine::Batch> WitnessBatch(const engine::TaskSpec& spec, uint64_t stream, int64_t classes,
                                   uint64_t num_examples, const Hash256& data_root, int64_t before,
                                   std::span<const StepWitnessExample> examples,
                                   const std::string& where) {
  const int64_t batch = spec.batch_size;
  if (examples.size() != static_cast<size_t>(batch)) {
    return InvalidArgument(where + ": the witness has " + std::to_string(examples.size()) +
                           " examples, a batch of this task has " + std::to_string(batch));
  }
  const std::vector<int64_t> indices =
      engine::BatchIndices(spec.seed, stream, static_cast<int64_t>(num_examples), batch, before);
  engine::Shape shape = spec.model.input;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  engine::ClassificationData data;
  shape.insert(shape.begin(), batch);
  data.x = engine::Tensor(shape);
  data.num_classes = classes;
  data.y.reserve(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const StepWitnessExample& e = examples[i];
    const std::string ex = where + ": example " + std::to_string(i);
    if (e.index != static_cast<uint64_t>(indices[i])) {
      return InvalidArgument(ex + " is dataset index " + std::to_string(e.index) +
                             ", the batch draws index " + std::to_string(indices[i]) + " there");
    }
    if (e.x.size() != static_cast<size_t>(numel) || e.y < 0 || e.y >= classes) {
      return InvalidArgument(ex + " has " + std::to_string(e.x.size()) + " values and class " +
                             std::to_string(e.y) + "; the model takes " + std::to_string(numel) +
                             " values and " + std::to_string(classes) + " classes");
    }
    if (e.proof.index != e.index || e.proof.leaf_count != num_examples ||
        !MerkleVerify(data_root, engine::ExampleLeaf(e.index, e.x, e.y), e.proof)) {
      return InvalidArgument(ex + " (index " + std::to_string(e.index) +
                             ") is not proven against the task's data_root " +
                             data_root.ShortHex() + " (" + std::to_string(num_examples) +
                             " examples)");
    }
    std::copy(e.x.begin(), e.x.end(), data.x.data() + i * numel);
    data.y.push_back(e.y);
  }
  std::vector<int64_t> order(batch);
  for (int64_t i = 0; i < batch; ++i) order[i] = i;
  return engine::MakeClassificationBatch(data, order);
}

namespace {

Status CheckClassification(const engine::TaskSpec& spec, const std::string& where) {
  if (IsTokenTask(spec)) {
    return FailedPrecondition(where + ": a '" + spec.data.format +
                              "' task; only classification tasks are refereed on chain");
  }
  return Status::Ok();
}

}  // namespace

Result<Hash256> RunStepWitness(const engine::TaskSpec& spec, uint64_t stream, double lr_scale,
                               uint64_t num_examples, const Hash256& data_root, uint64_t step,
                               const Hash256& agreed, const StepWitness& w,
                               const std::string& where) {
  ML_RETURN_IF_ERROR(CheckClassification(spec, where));
  if (step == 0) return InvalidArgument(where + ": step 0 is the unit's start, not a step");
  const int64_t before = static_cast<int64_t>(step) - 1;
  ML_ASSIGN_OR_RETURN(engine::TrainState state,
                      CheckedState(spec, lr_scale, stream, w.state, before, agreed, where,
                                   "the agreed state after step " + std::to_string(before)));
  // The batch: the examples the unit's sampler draws at this step, each proven in the data.
  ML_ASSIGN_OR_RETURN(engine::Batch batch,
                      WitnessBatch(spec, stream, state.model->NumOutputs(), num_examples, data_root,
                                   before, w.examples, where));
  engine::StepOnBatch(state, batch, engine::DropoutSeed(spec.seed, stream), nullptr,
                      spec.micro_batches);
  return engine::StateHash(state);
}

bool IsTokenTask(const engine::TaskSpec& spec) {
  return spec.data.format != "idx" && spec.data.format != "npy";
}

std::vector<int64_t> StepBatchPages(const engine::TaskSpec& spec, uint64_t stream, int64_t before,
                                    int64_t num_tokens) {
  // Every row of the batch: B sequences of T tokens.
  const int64_t rows = spec.batch_size * spec.seq_len;
  std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  for (int64_t i = 0; i < rows; ++i) all[static_cast<size_t>(i)] = i;
  return engine::TokenPagesOfRows(spec.seed, stream, before, spec.batch_size, spec.seq_len,
                                  num_tokens, all);
}

std::vector<TileWitnessPage> ProvenPages(const engine::TokenPageTree& tree,
                                         std::span<const int64_t> want) {
  std::vector<TileWitnessPage> out;
  out.reserve(want.size());
  for (int64_t p : want) {
    const std::span<const int32_t> tokens = tree.Page(p);
    out.push_back({.page = static_cast<uint64_t>(p),
                   .tokens = std::vector<int32_t>(tokens.begin(), tokens.end()),
                   .proof = tree.Prove(p)});
  }
  return out;
}

Result<engine::Batch> WitnessTokenBatch(const engine::TaskSpec& spec, uint64_t stream,
                                        uint64_t num_tokens, const Hash256& data_root,
                                        int64_t before, std::span<const TileWitnessPage> pages,
                                        const std::string& where) {
  const int64_t T = spec.seq_len, n = static_cast<int64_t>(num_tokens);
  if (T < 1 || n < T + 1) {
    return InvalidArgument(where + ": the task's token stream has " + std::to_string(n) +
                           " tokens, fewer than a window of " + std::to_string(T + 1));
  }
  const std::vector<int64_t> want = StepBatchPages(spec, stream, before, n);
  ML_RETURN_IF_ERROR(CheckWitnessPages(pages, want, n, data_root, where, "the step's batch"));
  // The pages a window reads are consecutive, so laid end to end (all full but the stream's
  // last) they give each window's tokens at its start's offset within them.
  engine::TokenData compact;
  for (const TileWitnessPage& p : pages) {
    compact.tokens.insert(compact.tokens.end(), p.tokens.begin(), p.tokens.end());
  }
  std::vector<int64_t> starts =
      engine::WindowStarts(spec.seed, stream, before, spec.batch_size, n, T);
  for (int64_t& s : starts) {
    const int64_t page = s / engine::kTokenPageTokens;
    const int64_t i = std::lower_bound(want.begin(), want.end(), page) - want.begin();
    s = i * engine::kTokenPageTokens + s % engine::kTokenPageTokens;
  }
  return engine::MakeTokenBatch(compact, starts, T);
}

Result<Hash256> RunSegmentSteps(const engine::TaskSpec& spec, uint64_t stream,
                                uint64_t num_examples, const Hash256& data_root,
                                engine::TrainState& state, uint64_t steps,
                                std::span<const StepWitnessExample> examples,
                                std::span<const TileWitnessPage> pages, const std::string& where) {
  if (IsTokenTask(spec)) {
    if (!examples.empty()) {
      return InvalidArgument(where +
                             ": the witness has examples; a token task's batches are proven by "
                             "their token pages");
    }
    const int64_t n = static_cast<int64_t>(num_examples);
    if (spec.seq_len < 1 || n < spec.seq_len + 1) {
      return InvalidArgument(where + ": the task's token stream has " + std::to_string(n) +
                             " tokens, fewer than a window of " + std::to_string(spec.seq_len + 1));
    }
    // Each step's pages, step after step: their count first, so a witness of the wrong length
    // is refused before any step runs.
    std::vector<size_t> first(steps + 1, 0);
    for (uint64_t i = 0; i < steps; ++i) {
      first[i + 1] =
          first[i] + StepBatchPages(spec, stream, state.step + static_cast<int64_t>(i), n).size();
    }
    if (pages.size() != first[steps]) {
      return InvalidArgument(where + ": the witness has " + std::to_string(pages.size()) +
                             " token pages; the batches of the segment's " + std::to_string(steps) +
                             " steps read " + std::to_string(first[steps]));
    }
    for (uint64_t i = 0; i < steps; ++i) {
      const int64_t before = state.step;
      ML_ASSIGN_OR_RETURN(engine::Batch b,
                          WitnessTokenBatch(spec, stream, num_examples, data_root, before,
                                            pages.subspan(first[i], first[i + 1] - first[i]),
                                            where + ": step " + std::to_string(before + 1)));
      engine::StepOnBatch(state, b, engine::DropoutSeed(spec.seed, stream), nullptr,
                          spec.micro_batches);
    }
    return engine::StateHash(state);
  }
  if (!pages.empty()) {
    return InvalidArgument(where +
                           ": the witness has token pages; a classification task's batches are "
                           "proven by their examples");
  }
  const size_t batch = static_cast<size_t>(spec.batch_size);
  if (examples.size() != steps * batch) {
    return InvalidArgument(where + ": the witness has " + std::to_string(examples.size()) +
                           " examples; " + std::to_string(steps) + " steps of batch " +
                           std::to_string(batch) + " take " + std::to_string(steps * batch));
  }
  const int64_t classes = state.model->NumOutputs();
  for (uint64_t i = 0; i < steps; ++i) {
    const int64_t before = state.step;
    ML_ASSIGN_OR_RETURN(engine::Batch b,
                        WitnessBatch(spec, stream, classes, num_examples, data_root, before,
                                     examples.subspan(i * batch, batch),
                                     where + ": step " + std::to_string(before + 1)));
    engine::StepOnBatch(state, b, engine::DropoutSeed(spec.seed, stream), nullptr,
                        spec.micro_batches);
  }
  return engine::StateHash(state);
}

Result<Hash256> ExecuteRefereeStepWitness(const TaskRecord& t, const WorkUnit& unit,
                                          const protocol::RefereeTask& task, const StepWitness& w) {
  const std::string where = "referee step (task " + t.id.ShortHex() + ", unit " +
                            std::to_string(unit.index) + ", step " + std::to_string(task.step) +
                            ")";
  const TaskParams& p = t.params;
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, w.bundle, where));
  return RunStepWitness(r.spec, r.stream, r.lr_scale, p.num_examples, p.data_root, task.step,
                        task.input, w, where);
}

uint64_t MaxUnitStateBytes(const TaskParams& p) {
  // The weights and at most two moments (AdamW's), each of model_bytes.
  constexpr uint64_t kCopies = 3;
  return p.model_bytes > UINT64_MAX / kCopies ? UINT64_MAX : kCopies * p.model_bytes;
}

bool DisputeNeedsBundle(const TaskParams& p) {
  // (A task's terms refuse data_page_tokens without a data root: tasks.cc.)
  if (p.data_root.IsZero() || IsPipelineTask(p) || p.tolerance_rel_l2_ppm != 0 ||
      p.tolerance_cosine_gap_ppb != 0) {
    return false;
  }
  return p.data_page_tokens != 0 || MaxUnitStateBytes(p) > kMaxStepWitnessState;
}

const char* SegmentReplayRefusal(const TaskParams& p) {
  if (p.tolerance_rel_l2_ppm != 0 || p.tolerance_cosine_gap_ppb != 0) {
    return "verified in tolerance mode, where replays need not match hashes bit for bit; only "
           "exact-mode units can be proven";
  }
  if (p.data_root.IsZero()) {
    return "without a data root, so the ledger cannot check a replay's batches";
  }
  return nullptr;
}

const char* ProveMeritsRefusal(const TaskParams& p) {
  if (IsPipelineTask(p)) {
    return "a pipeline task, whose segments (stage steps) the ledger does not replay from a "
           "segment witness";
  }
  if (const char* why = SegmentReplayRefusal(p); why != nullptr) return why;
  if (MaxUnitStateBytes(p) > kMaxStepWitnessState) {
    return "a task whose unit state (weights and optimizer moments) may be over the half of a "
           "witness a segment's start state has (kMaxStepWitnessState), so its segment witness "
           "may not fit a transaction";
  }
  return nullptr;
}

bool UnservedStageClaim(const TaskParams& p, const MismatchClaimField& claim) {
  return IsPipelineTask(p) && claim.replayed_end == StageUnservedLeaf(claim.solver_end);
}

bool ContinuityStageClaim(const TaskParams& p, const MismatchClaimField& claim) {
  return IsPipelineTask(p) && claim.replayed_end == StageContinuityLeaf(claim.solver_end);
}

bool MismatchNeedsBundle(const TaskParams& p, uint32_t index, const MismatchClaimField& claim) {
  if (!IsPipelineTask(p)) return DisputeNeedsBundle(p);
  return !p.data_root.IsZero() && p.tolerance_rel_l2_ppm == 0 && p.tolerance_cosine_gap_ppb == 0 &&
         !LedgerRulesStageStep(p, StageSlotOf(p, index).stage) && !UnservedStageClaim(p, claim) &&
         !ContinuityStageClaim(p, claim);
}

Result<TileRuleContext> TileContextOf(const TaskRecord& t, const WorkUnit& unit,
                                      const std::string& bundle, const std::string& where) {
  if (t.params.tolerance_rel_l2_ppm != 0 || t.params.tolerance_cosine_gap_ppb != 0) {
    return FailedPrecondition(where + ": task " + t.id.ShortHex() +
                              " is verified in tolerance mode: its disputes are not bisected, "
                              "there is no tile phase; send no bundle");
  }
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, bundle, where));
  const bool tokens = IsTokenTask(r.spec);
  if (!tokens && t.params.data_page_tokens != 0) {
    return FailedPrecondition(where + ": task " + t.id.ShortHex() +
                              " reads examples, but its data root is declared over token pages "
                              "(params.data_page_tokens); send no bundle (whole steps)");
  }
  if (!tokens && t.params.data_root.IsZero()) {
    return FailedPrecondition(where + ": task " + t.id.ShortHex() +
                              " has no data root, so the ledger cannot check the examples a "
                              "first layer's tile reads; send no bundle (whole steps)");
  }
  // From the spec's shapes alone (PlanStepTiles allocates nothing): a model of any size, trained
  // in the task's micro-batches (the plan follows their gradient order, tile_rule.h). A stage
  // unit's step is its stage's (PlanStageStepTiles over the task's cut: a GPT's or a sequential
  // model's).
  const engine::OptimizerSpec optimizer = engine::UnitOptimizerSpec(r.spec.optimizer, r.lr_scale);
  Result<engine::TilePlan> plan =
      IsPipelineTask(t.params)
          ? StageStepPlan(r, optimizer, StageSlotOf(t.params, unit.index).stage)
          : engine::PlanStepTiles(r.spec.model, optimizer, r.spec.batch_size, r.spec.seq_len,
                                  r.spec.micro_batches);
  if (!plan.ok()) return FailedPrecondition(where + ": " + plan.status().message());
  TileRuleContext ctx;
  ctx.plan = std::move(*plan);
  ctx.seed = r.spec.seed;
  ctx.stream = r.stream;
  // A dropout tile's mask: the unit's seed as its trainer draws it, from the task and the unit.
  ctx.plan.dropout_seed = engine::DropoutSeed(ctx.seed, ctx.stream);
  ctx.num_examples = t.params.num_examples;
  ctx.data_root = t.params.data_root;
  if (tokens && t.params.data_page_tokens != engine::kTokenPageTokens) {
    // No root over the token pages: the operators that read the batch's tokens stay with the
    // whole step.
    ctx.data_root = Hash256{};
    TokenOpsOpaque(&ctx.plan,
                   "the task has no data root over its token pages "
                   "(params.data_page_tokens = 0), so the tokens a tile reads cannot "
                   "be proven");
  }
  return ctx;
}

Result<Hash256> ExecuteResultWitness(const TaskRecord& t, const WorkUnit& unit,
                                     const ResultWitness& w) {
  const std::string where =
      "prove result (task " + t.id.ShortHex() + ", unit " + std::to_string(unit.index) + ")";
  if (unit.leaves.empty()) {
    return FailedPrecondition(where + ": the unit has no committed leaves");
  }
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, w.bundle, where));
  ML_ASSIGN_OR_RETURN(protocol::GlobalState start, RoundStart(t, unit.round, w.start_state, where));
  ML_ASSIGN_OR_RETURN(engine::TrainState st,
                      CheckedState(r.spec, r.lr_scale, r.stream, w.state,
                                   static_cast<int64_t>(t.params.inner_steps), unit.leaves.back(),
                                   where, "the unit's last committed leaf"));
  const size_t n = static_cast<size_t>(st.model->NumParameters());
  if (start.weights.size() != n) {
    return InvalidArgument(where + ": the start state holds " +
                           std::to_string(start.weights.size()) + " weights, the model has " +
                           std::to_string(n));
  }
  // FlatState puts the parameters first, in model order: the layout of weights and deltas.
  return ResultBlobId(start.weights, std::span<const float>(w.state.data(), n));
}

Result<Hash256> ExecuteStageResultWitness(const TaskRecord& t, const WorkUnit& unit,
                                          const StageResultWitness& w) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  const std::string where =
      "prove result (task " + t.id.ShortHex() + ", unit " + std::to_string(unit.index) +
      ": replica " + std::to_string(slot.replica) + ", stage " + std::to_string(slot.stage) + ")";
  if (unit.leaves.size() < 2) {
    return FailedPrecondition(where + ": the stage unit has no committed step leaves");
  }
  ML_ASSIGN_OR_RETURN(TaskBundleSpec b, ParseTaskBundle(t, w.bundle, where));
  ML_ASSIGN_OR_RETURN(protocol::GlobalState start, RoundStart(t, unit.round, w.start_state, where));
  Result<protocol::StageStepCommit> commit = protocol::DecodeStageStepCommit(w.commit);
  if (!commit.ok()) return InvalidArgument(where + ": commit: " + commit.status().message());
  const Hash256 leaf = protocol::StageStepLeaf(*commit);
  const uint64_t last_step = t.params.inner_steps == 0 ? 0 : t.params.inner_steps - 1;
  if (leaf != unit.leaves.back() || commit->task != t.id || commit->round != slot.round ||
      commit->replica != slot.replica || commit->stage != slot.stage ||
      commit->stages != t.params.stages || commit->step != last_step) {
    return InvalidArgument(where + ": the witness's commit (leaf " + leaf.ShortHex() + ", step " +
                           std::to_string(commit->step) +
                           ") is not the stage's last committed step (leaf " +
                           unit.leaves.back().ShortHex() + ", step " + std::to_string(last_step) +
                           "); send the commit the stage node serves for its last step");
  }
  Result<engine::TrainState> st = StageCheckpointState(w.state);
  if (!st.ok()) {
    return InvalidArgument(where + ": state: " + st.status().message() +
                           "; send the stage's checkpoint after its last step");
  }
  const Hash256 got = engine::StateHash(*st);
  if (got != commit->state_after) {
    return InvalidArgument(where + ": the state hashes to " + got.ShortHex() +
                           ", the stage's last step ends at " + commit->state_after.ShortHex() +
                           "; send the stage's checkpoint after its last step");
  }
  Result<Hash256> id = StageResultBlobId(b.spec.model, start.weights, *st);
  if (!id.ok()) return InvalidArgument(where + ": " + id.status().message());
  return id;
}

Result<Hash256> ExecuteSegmentWitness(const TaskRecord& t, const WorkUnit& unit, uint32_t segment,
                                      const SegmentWitness& w) {
  const std::string where = "prove fraud (task " + t.id.ShortHex() + ", unit " +
                            std::to_string(unit.index) + ", segment " + std::to_string(segment) +
                            ")";
  const TaskParams& p = t.params;
  const uint32_t segments = protocol::SegmentCount(p.inner_steps, p.checkpoint_interval);
  if (segment >= segments) {
    return InvalidArgument(where + ": the unit has " + std::to_string(segments) + " segments (0.." +
                           std::to_string(segments - 1) + ")");
  }
  if (unit.leaves.size() != segments + 1ull) {
    return FailedPrecondition(where + ": the unit has " + std::to_string(unit.leaves.size()) +
                              " committed leaves, not " + std::to_string(segments + 1));
  }
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, w.bundle, where));
  // A token task's batches are proven by pages of its train stream: only where its data root is
  // over them (TaskParams::data_page_tokens), and a classification task's only where it is not.
  if (IsTokenTask(r.spec) !=
      (p.data_page_tokens == static_cast<uint32_t>(engine::kTokenPageTokens))) {
    return FailedPrecondition(
        where + ": the task " + (IsTokenTask(r.spec) ? "trains on tokens" : "reads examples") +
        ", but its data root is " +
        (p.data_page_tokens == 0
             ? "over examples"
             : "over token pages of " + std::to_string(p.data_page_tokens) + " tokens") +
        " (params.data_page_tokens); its batches cannot be proven");
  }
  const protocol::SegmentSteps steps =
      protocol::SegmentStepsOf(p.inner_steps, p.checkpoint_interval, segment);
  engine::TrainState state;
  if (segment == 0) {
    // The unit's true start, from the chain's record of the round: a solver that committed a
    // false leaf 0 is caught here too (its segment 0 does not end where the true start leads).
    if (!w.state.empty()) {
      return InvalidArgument(where +
                             ": segment 0 starts from the round's start state; send it "
                             "as start_state and leave state empty");
    }
    ML_ASSIGN_OR_RETURN(protocol::GlobalState start,
                        RoundStart(t, unit.round, w.start_state, where));
    std::vector<float> flat(start.weights);
    const int64_t size =
        engine::FlatStateSize(static_cast<int64_t>(start.weights.size()), r.spec.optimizer);
    flat.resize(static_cast<size_t>(std::max<int64_t>(size, 0)), 0.0f);  // fresh moments: zero
    Result<engine::TrainState> st =
        engine::StateFromFlat(r.spec.model, engine::UnitOptimizerSpec(r.spec.optimizer, r.lr_scale),
                              flat, 0, r.spec.seed, r.stream);
    if (!st.ok()) return InvalidArgument(where + ": start state: " + st.status().message());
    state = std::move(*st);
  } else {
    if (!w.start_state.empty()) {
      return InvalidArgument(where +
                             ": a later segment starts from the committed state after "
                             "step " +
                             std::to_string(steps.first_step) +
                             "; send it as state and leave start_state empty");
    }
    ML_ASSIGN_OR_RETURN(
        state, CheckedState(r.spec, r.lr_scale, r.stream, w.state,
                            static_cast<int64_t>(steps.first_step), unit.leaves[segment], where,
                            "the unit's committed leaf " + std::to_string(segment)));
  }
  return RunSegmentSteps(r.spec, r.stream, p.num_examples, p.data_root, state,
                         steps.last_step - steps.first_step, w.examples, w.pages, where);
}

Hash256 DeltaBlobId(std::span<const float> delta) {
  return BuildManifest(protocol::EncodeDelta(delta)).id().hash;
}

Hash256 ResultBlobId(std::span<const float> global, std::span<const float> params) {
  return DeltaBlobId(protocol::PseudoGradient(global, params));
}

Result<engine::ModelSpec> ModelSpecForState(const engine::ModelSpec& spec, uint64_t num_weights) {
  if (spec.kind != "gpt" || spec.gpt.vocab_size != 0) return spec;
  // From the shapes alone: nothing is allocated (the bundle is the submitter's text).
  auto count = [&](int64_t vocab) -> Result<int64_t> {
    engine::ModelSpec probe = spec;
    probe.gpt.vocab_size = vocab;
    return engine::CountParameters(probe);
  };
  ML_ASSIGN_OR_RETURN(int64_t at2, count(2));
  ML_ASSIGN_OR_RETURN(int64_t at3, count(3));
  const int64_t per_token = at3 - at2;
  const int64_t n = static_cast<int64_t>(num_weights);
  if (per_token <= 0 || n < at2 || (n - at2) % per_token != 0) {
    return InvalidArgument(
        "model.vocab_size comes from the data, and no vocabulary gives a GPT of " +
        std::to_string(num_weights) + " parameters");
  }
  engine::ModelSpec out = spec;
  out.gpt.vocab_size = 2 + (n - at2) / per_token;
  return out;
}

namespace {

// Stage unit `unit`'s commit of step `at` as a witness gives it (`bytes`; `field` names it): it
// must decode and be the unit's committed step (its StageStepLeaf the committed leaf at + 1, of
// this task, round, replica, stage and step). InvalidArgument prefixed by `where` otherwise.
Result<protocol::StageStepCommit> CommittedStageStep(const TaskRecord& t, const WorkUnit& unit,
                                                     uint64_t at, const Bytes& bytes,
                                                     std::string_view field,
                                                     const std::string& where) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  Result<protocol::StageStepCommit> c = protocol::DecodeStageStepCommit(bytes);
  if (!c.ok()) {
    return InvalidArgument(where + ": " + std::string(field) + ": " + c.status().message());
  }
  if (at + 1 >= unit.leaves.size()) {
    return InvalidArgument(where + ": " + std::string(field) + ": unit " +
                           std::to_string(unit.index) + " committed no leaf for step " +
                           std::to_string(at));
  }
  const Hash256 leaf = protocol::StageStepLeaf(*c);
  if (leaf != unit.leaves[at + 1] || c->task != t.id || c->round != slot.round ||
      c->replica != slot.replica || c->stage != slot.stage || c->stages != t.params.stages ||
      c->step != at) {
    return InvalidArgument(where + ": " + std::string(field) + " (leaf " + leaf.ShortHex() +
                           ", step " + std::to_string(c->step) +
                           ") is not the stage's committed step " + std::to_string(at) + " (leaf " +
                           unit.leaves[at + 1].ShortHex() +
                           "); send the commit the stage node serves for it");
  }
  return c;
}

// Whether two records name the same tensor the same way (everything but the signature).
bool SameRecord(const protocol::StageTransfer& a, const protocol::StageTransfer& b) {
  return a.key == b.key && a.tensor == b.tensor && a.bytes == b.bytes &&
         a.tile_cols == b.tile_cols && a.tiles == b.tiles && a.sender == b.sender;
}

}  // namespace

Result<StageStepCheck> RuleStageContinuity(const TaskRecord& t, const WorkUnit& unit, uint64_t step,
                                           const Hash256& committed_leaf,
                                           const StageContinuityWitness& w, std::string_view what) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  const std::string where = StageStepWhere(what, t, unit, step, "continuity");
  if (step + 1 >= unit.leaves.size() || unit.leaves[step + 1] != committed_leaf) {
    return InvalidArgument(where + ": the stage did not commit leaf " + committed_leaf.ShortHex() +
                           " for the step");
  }
  ML_ASSIGN_OR_RETURN(protocol::StageStepCommit commit,
                      CommittedStageStep(t, unit, step, w.commit, "commit", where));
  Hash256 expected;
  std::string from;
  if (step > 0) {
    if (!w.bundle.empty() || !w.start_state.empty()) {
      return InvalidArgument(where +
                             ": the witness carries a bundle or a start state; a later "
                             "step's continuity is ruled from the previous step's commit alone");
    }
    ML_ASSIGN_OR_RETURN(protocol::StageStepCommit previous,
                        CommittedStageStep(t, unit, step - 1, w.previous, "previous", where));
    expected = previous.state_after;
    from = "step " + std::to_string(step - 1) + "'s state_after";
  } else {
    if (!w.previous.empty()) {
      return InvalidArgument(where +
                             ": the witness carries a previous commit; step 0 has none "
                             "(send the bundle and the round's start state)");
    }
    ML_ASSIGN_OR_RETURN(TaskBundleSpec b, ParseTaskBundle(t, w.bundle, where));
    ML_ASSIGN_OR_RETURN(protocol::GlobalState start,
                        RoundStart(t, unit.round, w.start_state, where));
    ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                        engine::TaskPipelineCut(b.spec, static_cast<int>(b.net.stages), b.net.cut));
    const protocol::UnitWork work = protocol::UnitWorkOf(
        b.net, b.spec.seed, engine::TaskContentId(b.spec), slot.round, slot.replica);
    const std::span<const float> weights = start.weights;
    Result<std::unique_ptr<engine::Stage>> stage = StageFromGlobal(
        b.spec, cut, static_cast<int>(slot.stage), weights.size(),
        [weights](uint64_t offset, std::span<float> out) {
          std::copy_n(weights.begin() + static_cast<std::ptrdiff_t>(offset), out.size(),
                      out.begin());
          return Status::Ok();
        },
        work.lr_scale);
    if (!stage.ok()) return InvalidArgument(where + ": " + stage.status().message());
    expected = engine::StateHash((*stage)->state());
    from = "the stage's slice of the round's start state";
  }
  if (commit.state_before == expected) {
    return FailedPrecondition(where + ": the step starts from " + expected.ShortHex() + ", " +
                              from +
                              "; nothing to rule (a wrong step is ruled from its replay's "
                              "witness, StageStepWitness)");
  }
  StageStepCheck out;
  out.replay.fault = StageFault::kStageFaultContinuity;
  out.replay.replica = slot.replica;
  out.replay.stage = slot.stage;
  out.replay.step = step;
  out.replay.claimed = commit.state_before;
  out.replay.replayed = expected;
  out.leaf = StageContinuityLeaf(committed_leaf);
  out.message = where + ": the step starts from " + commit.state_before.ShortHex() + ", not " +
                from + " " + expected.ShortHex();
  out.replay.message = out.message;
  return out;
}

Result<StageStepCheck> RuleStageRecord(const TaskRecord& t, const WorkUnit& unit, uint64_t step,
                                       std::span<const WorkUnit* const> replica,
                                       const std::vector<protocol::NodeId>& chain,
                                       const StageRecordWitness& w, std::string_view what) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  const std::string where = StageStepWhere(what, t, unit, step, "record");
  if (replica.size() != t.params.stages || chain.size() != t.params.stages) {
    return FailedPrecondition(where + ": the replica's units or chain are not one a stage");
  }
  ML_ASSIGN_OR_RETURN(protocol::StageStepCommit commit,
                      CommittedStageStep(t, unit, step, w.commit, "commit", where));
  StageStepCheck out;
  out.replay.fault = StageFault::kStageFaultRecord;
  out.replay.replica = slot.replica;
  out.replay.stage = slot.stage;
  out.replay.step = step;
  if (w.other.empty()) {
    // The proven stage is the receiver: its record must be its sender's signature.
    if (w.record >= commit.received.size()) {
      return InvalidArgument(where + ": record " + std::to_string(w.record) +
                             " is out of range; the commit lists " +
                             std::to_string(commit.received.size()) + " received records");
    }
    const protocol::StageTransfer& r = commit.received[w.record];
    if (r.key.to_stage != slot.stage || r.key.from_stage >= chain.size()) {
      return InvalidArgument(where + ": received record " + std::to_string(w.record) + " (" +
                             r.key.ToString() + ") is not one sent to this stage");
    }
    const Status signed_by = protocol::VerifyStageTransfer(r, chain[r.key.from_stage]);
    if (signed_by.ok()) {
      return FailedPrecondition(where + ": received record " + std::to_string(w.record) + " (" +
                                r.key.ToString() + ") is signed by its sender " +
                                chain[r.key.from_stage].ShortHex() +
                                "; nothing to prove (a record its sender signed and did not "
                                "commit is the sender's: send the receiver's commit as other)");
    }
    out.replay.key = r.key;
    out.replay.claimed = r.tensor;
    out.message = where + ": received record " + std::to_string(w.record) + " (" +
                  r.key.ToString() + ") is not its sender's: " + signed_by.message();
  } else {
    // The proven stage is the sender: the receiver's record carries its signature, and its own
    // commit must list it among what it sent.
    Result<protocol::StageStepCommit> other = protocol::DecodeStageStepCommit(w.other);
    if (!other.ok()) return InvalidArgument(where + ": other: " + other.status().message());
    const uint32_t to = other->stage;
    if (to >= t.params.stages || to == slot.stage || replica[to] == nullptr) {
      return InvalidArgument(where + ": other is the commit of stage " + std::to_string(to) +
                             ", not another stage of the replica");
    }
    ML_ASSIGN_OR_RETURN(*other, CommittedStageStep(t, *replica[to], step, w.other, "other", where));
    if (w.record >= other->received.size()) {
      return InvalidArgument(where + ": record " + std::to_string(w.record) +
                             " is out of range; other lists " +
                             std::to_string(other->received.size()) + " received records");
    }
    const protocol::StageTransfer& r = other->received[w.record];
    if (r.key.from_stage != slot.stage || r.key.to_stage != to) {
      return InvalidArgument(where + ": other's received record " + std::to_string(w.record) +
                             " (" + r.key.ToString() + ") is not one this stage sent it");
    }
    const Status signed_by = protocol::VerifyStageTransfer(r, chain[slot.stage]);
    if (!signed_by.ok()) {
      return FailedPrecondition(where + ": other's received record " + std::to_string(w.record) +
                                " is not this stage's signature (" + signed_by.message() +
                                "); nothing to prove against it (the receiver made it up: "
                                "prove the receiver's unit with other empty)");
    }
    for (const protocol::StageTransfer& s : commit.sent) {
      if (SameRecord(s, r)) {
        return FailedPrecondition(where + ": the stage's commit lists record " + r.key.ToString() +
                                  " among what it sent; nothing to prove (a wrong tensor is "
                                  "its step's: send its StageStepWitness)");
      }
    }
    out.replay.key = r.key;
    out.replay.claimed = r.tensor;
    out.message = where + ": the stage signed record " + r.key.ToString() + " (tensor " +
                  r.tensor.ShortHex() + "), which stage " + std::to_string(to) +
                  " received, and its commit does not list it among what it sent";
  }
  out.replay.message = out.message;
  out.leaf = StageFindingLeaf(unit.leaves[step + 1], out.replay);
  return out;
}

}  // namespace meshlearn::ledger
