#include "meshlearn/node/step_witness.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/merkle.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::node {
namespace {

// Floats per training example (the training tensor is (N, ...)).
int64_t ExampleFloats(const engine::ClassificationData& train) {
  return train.size() == 0 ? 0 : train.x.size() / train.size();
}

// The examples of the batch at 0-based step index `step` of `work`, in batch order, each with
// its proof in `tree`.
std::vector<ledger::StepWitnessExample> BatchExamples(const engine::Trainer& trainer,
                                                      const UnitWork& work,
                                                      const engine::DataTree& tree, int64_t step) {
  const engine::ClassificationData& train = trainer.data().train;
  const int64_t per = ExampleFloats(train);
  const std::vector<int64_t> indices = engine::BatchIndices(
      trainer.task().seed, work.stream, train.size(), trainer.task().batch_size, step);
  std::vector<ledger::StepWitnessExample> out;
  out.reserve(indices.size());
  for (int64_t i : indices) {
    const float* x = train.x.data() + i * per;
    out.push_back({.index = static_cast<uint64_t>(i),
                   .x = std::vector<float>(x, x + per),
                   .y = train.y[static_cast<size_t>(i)],
                   .proof = tree.Prove(i)});
  }
  return out;
}

// Brings `trainer` to the agreed state after step - 1 of the dispute (the top of
// node/step_witness.h: the unit's start, else the defender's checkpoint), filling what `out`
// records about it. FailedPrecondition when neither reaches `input`.
Status ReachAgreedState(engine::Trainer* trainer, std::span<const float> global,
                        const UnitWork& work, int64_t step, const Hash256& input,
                        const DisputeStart& start, BuiltStepWitness* out) {
  // 1. From the unit's start.
  const int64_t before[] = {step - 1};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                      ReplayToSteps(trainer, global, work, 0, nullptr, before));
  out->true_input = h[0];
  if (out->true_input == input) {
    out->reason =
        "the agreed state after step " + std::to_string(step - 1) + " is the unit's true state";
  } else {
    trainer->Step();
    out->true_output = engine::StateHash(trainer->state());
    const std::string not_true = "the agreed state after step " + std::to_string(step - 1) + " (" +
                                 input.ShortHex() + ") is not the unit's true state (" +
                                 out->true_input.ShortHex() + ")";
    // 2. From the defender's checkpoint at the dispute's first step.
    if (start.first_step <= 0 || start.first_step >= step || !start.checkpoint) {
      return FailedPrecondition("step witness: " + not_true +
                                (start.first_step <= 0
                                     ? ", and the dispute starts at the unit's start"
                                     : ", and the defender's checkpoint cannot be fetched") +
                                "; no witness can be built (the dispute ends undecided)");
    }
    Result<engine::TrainState> ckpt = start.checkpoint(start.first_step);
    if (!ckpt.ok()) {
      return FailedPrecondition(
          "step witness: " + not_true + "; the defender's checkpoint at step " +
          std::to_string(start.first_step) + " could not be had: " + ckpt.status().message());
    }
    if (const Hash256 got = engine::StateHash(*ckpt); got != start.agreed) {
      return FailedPrecondition("step witness: " + not_true +
                                "; the defender's checkpoint at step " +
                                std::to_string(start.first_step) + " hashes to " + got.ShortHex() +
                                ", not to its committed leaf " + start.agreed.ShortHex());
    }
    ML_ASSIGN_OR_RETURN(h, ReplayToSteps(trainer, global, work, start.first_step, &*ckpt, before));
    if (h[0] != input) {
      return FailedPrecondition("step witness: " + not_true +
                                ", nor the replay from the defender's checkpoint at step " +
                                std::to_string(start.first_step) + " (" + h[0].ShortHex() +
                                "); no witness can be built (the dispute ends undecided)");
    }
    out->from_checkpoint = true;
    out->reason = not_true + "; it is the defender's checkpoint at step " +
                  std::to_string(start.first_step) + " replayed to step " +
                  std::to_string(step - 1) + " (the defender cheated before the dispute)";
  }

  return Status::Ok();
}

}  // namespace

Hash256 TaskDataRoot(const engine::TaskData& data) {
  if (data.tokens) return engine::TokenDataRoot(data.train_tokens.tokens);
  if (data.train.size() == 0) return Hash256{};
  return engine::DataTree(data.train).root();
}

uint64_t StepWitnessBound(const engine::TaskSpec& task, uint64_t num_params) {
  const uint64_t state = 4 * static_cast<uint64_t>(engine::FlatStateSize(
                                 static_cast<int64_t>(num_params), task.optimizer));
  uint64_t example = 8 + 4 + 4 + 8 + 8 + 4 + 32 * 64;  // index, sizes, y, proof (<= 64 levels)
  int64_t numel = 1;
  for (int64_t d : task.model.input) numel *= d;
  example += 4 * static_cast<uint64_t>(numel);
  const uint64_t margin = 64 << 10;  // the bundle text, headers
  return state + static_cast<uint64_t>(task.batch_size) * example + margin;
}

Result<Hash256> ExecuteStepWitness(const engine::Trainer& trainer, const UnitWork& work,
                                   int64_t step, const ledger::StepWitness& witness,
                                   const Hash256& agreed, const Hash256& data_root) {
  if (trainer.data().tokens) {
    return InvalidArgument("step witness: a token task has no per-example data root");
  }
  if (step < 1 || step > work.inner_steps) {
    return InvalidArgument("step witness: step " + std::to_string(step) + " is outside 1.." +
                           std::to_string(work.inner_steps));
  }
  // The ledger's own computation (RefereeStepTx), on this node's copy of the task.
  return ledger::RunStepWitness(trainer.task(), work.stream, work.lr_scale,
                                static_cast<uint64_t>(trainer.data().train.size()), data_root,
                                static_cast<uint64_t>(step), agreed, witness, "step witness");
}

Result<BuiltStepWitness> BuildStepWitness(engine::Trainer* trainer, std::span<const float> global,
                                          const UnitWork& work, const protocol::RefereeTask& task,
                                          std::string_view bundle, const engine::DataTree& tree,
                                          const DisputeStart& start) {
  if (task.segment || !task.whole_step) {
    return InvalidArgument(
        "step witness: only an exact-mode whole step has one (tolerance segments and "
        "operator-level tasks are ruled otherwise)");
  }
  if (trainer->data().tokens) {
    return InvalidArgument(
        "step witness: a token task has no per-example data root; the genesis "
        "referee rules its disputes (RuleDisputeTx)");
  }
  if (tree.size() != trainer->data().train.size()) {
    return InvalidArgument("step witness: the data tree has " + std::to_string(tree.size()) +
                           " leaves, the training set " +
                           std::to_string(trainer->data().train.size()) + " examples");
  }
  const int64_t step = static_cast<int64_t>(task.step);
  if (step < 1 || step > work.inner_steps) {
    return InvalidArgument("step witness: step " + std::to_string(task.step) + " is outside 1.." +
                           std::to_string(work.inner_steps));
  }
  BuiltStepWitness out;
  ML_RETURN_IF_ERROR(ReachAgreedState(trainer, global, work, step, task.input, start, &out));
  // The trainer is at the agreed state after step - 1.
  engine::TrainState& st = trainer->state();
  out.witness.bundle = std::string(bundle);
  out.witness.state = engine::FlatState(st);
  out.witness.examples = BatchExamples(*trainer, work, tree, st.step);
  // The output the ledger will compute, and the trainer's own step: they must agree, or the
  // witness does not describe this step (a bug, never a party's fault).
  ML_ASSIGN_OR_RETURN(
      out.output, ExecuteStepWitness(*trainer, work, step, out.witness, task.input, tree.root()));
  trainer->Step();
  const Hash256 stepped = engine::StateHash(trainer->state());
  if (stepped != out.output) {
    return Internal("step witness: the witness of step " + std::to_string(step) + " gives " +
                    out.output.ShortHex() + " but the trainer's step gives " + stepped.ShortHex());
  }
  if (!out.from_checkpoint) out.true_output = out.output;
  const bool d = task.defender_output == out.output, c = task.challenger_output == out.output;
  out.reason += ": step " + std::to_string(step) + " from it gives " + out.output.ShortHex() +
                (d   ? ", the defender's output"
                 : c ? ", the challenger's output"
                     : ", neither output (both lose)");
  return out;
}

const engine::ClassificationData* EnsureDataProofs(const engine::TaskData& data,
                                                   std::unique_ptr<engine::TokenPageTree>* pages,
                                                   std::unique_ptr<engine::DataTree>* tree) {
  if (data.tokens) {
    if (*pages == nullptr)
      *pages = std::make_unique<engine::TokenPageTree>(data.train_tokens.tokens);
    return nullptr;
  }
  if (*tree == nullptr) *tree = std::make_unique<engine::DataTree>(data.train);
  return &data.train;
}

Result<TracedStep> TraceDisputedStep(engine::Trainer* trainer, std::span<const float> global,
                                     const UnitWork& work, int64_t step, const Hash256& input,
                                     const DisputeStart& start,
                                     const std::function<void(engine::Batch&)>& alter_batch) {
  if (step < 1 || step > work.inner_steps) {
    return InvalidArgument("traced step: step " + std::to_string(step) + " is outside 1.." +
                           std::to_string(work.inner_steps));
  }
  BuiltStepWitness where;
  ML_RETURN_IF_ERROR(ReachAgreedState(trainer, global, work, step, input, start, &where));
  // The trainer is at the agreed state after step - 1: the step exactly as Trainer::Step runs it,
  // with the trace attached.
  engine::TrainState& st = trainer->state();
  TracedStep out;
  out.step = step;
  out.input = input;
  out.trace = std::make_shared<engine::OpTrace>();
  out.trace->set_keep_values(true);
  out.batch = trainer->BatchForStep(st.step);
  if (alter_batch) alter_batch(out.batch);
  st.model->set_op_trace(out.trace.get());
  engine::StepOnBatch(st, out.batch, engine::DropoutSeed(trainer->task().seed, work.stream),
                      nullptr, trainer->task().micro_batches);
  st.model->set_op_trace(nullptr);
  out.output = engine::StateHashOfTracedStep(st, *out.trace);
  return out;
}

uint64_t SegmentWitnessBound(const engine::Trainer& trainer, uint64_t num_params, uint64_t steps) {
  // One step's bound holds the state, one batch and the margin; each further step one batch.
  const uint64_t one = StepWitnessBound(trainer.task(), num_params);
  const uint64_t state = 4 * static_cast<uint64_t>(engine::FlatStateSize(
                                 static_cast<int64_t>(num_params), trainer.task().optimizer));
  const uint64_t margin = 64 << 10;
  if (trainer.data().tokens) {
    // A token task's batch is the pages its windows read: a window of T + 1 tokens touches at
    // most ceil(T / P) + 1 pages of P tokens, and no step reads more pages than the stream has.
    // A page: its index, its tokens and its proof (<= 64 levels).
    const engine::TaskSpec& t = trainer.task();
    const uint64_t P = static_cast<uint64_t>(engine::kTokenPageTokens);
    const uint64_t n = trainer.data().train_tokens.tokens.size();
    const uint64_t per_window = (static_cast<uint64_t>(t.seq_len) + P - 1) / P + 1;
    const uint64_t pages =
        std::min(static_cast<uint64_t>(t.batch_size) * per_window, (n + P - 1) / P);
    const uint64_t page = 8 + 4 + 4 * P + 8 + 8 + 4 + 32 * 64;
    return state + steps * pages * page + margin;
  }
  const uint64_t batch = one - state - margin;
  return one + (steps > 0 ? steps - 1 : 0) * batch;
}

namespace {

// The proofs a segment witness needs: a token task's pages, a classification task's examples.
Status CheckSegmentProofs(const engine::Trainer& trainer, const engine::TokenPageTree* pages,
                          const engine::DataTree* tree) {
  if (trainer.data().tokens ? pages != nullptr : tree != nullptr) return Status::Ok();
  return InvalidArgument(
      std::string("segment witness: give the proofs of the task's batches (") +
      (trainer.data().tokens ? "a token task: its TokenPageTree" : "its examples' DataTree") + ")");
}

// The unit's segment count, checked against its `leaves`.
Result<uint32_t> SegmentsOf(const UnitWork& work, std::span<const Hash256> leaves) {
  const uint32_t segments = protocol::SegmentCount(static_cast<uint64_t>(work.inner_steps),
                                                   static_cast<uint64_t>(work.checkpoint_interval));
  if (leaves.size() != segments + 1ull) {
    return InvalidArgument("segment witness: the unit has " + std::to_string(leaves.size()) +
                           " committed leaves; its " + std::to_string(segments) +
                           " segments need " + std::to_string(segments + 1));
  }
  return segments;
}

// Segment j of `work` run from the state `trainer` holds at its start (which hashes to leaves[j]):
// its witness when it does not end on leaves[j + 1], else nullopt. Steps the trainer through the
// segment either way.
std::optional<BuiltSegmentWitness> RunSegmentForWitness(engine::Trainer* trainer,
                                                        ByteSpan start_blob, const UnitWork& work,
                                                        std::span<const Hash256> leaves, uint32_t j,
                                                        std::string_view bundle,
                                                        const engine::TokenPageTree* pages,
                                                        const engine::DataTree* tree) {
  const protocol::SegmentSteps seg = protocol::SegmentStepsOf(
      static_cast<uint64_t>(work.inner_steps), static_cast<uint64_t>(work.checkpoint_interval), j);
  std::vector<float> flat;
  if (j > 0) flat = engine::FlatState(trainer->state());
  for (uint64_t s = seg.first_step; s < seg.last_step; ++s) trainer->Step();
  const Hash256 end = engine::StateHash(trainer->state());
  if (end == leaves[j + 1]) return std::nullopt;
  BuiltSegmentWitness out{
      .segment = j, .witness = {}, .committed_end = leaves[j + 1], .replayed_end = end};
  out.witness.bundle = std::string(bundle);
  if (j == 0) {
    out.witness.start_state.assign(start_blob.begin(), start_blob.end());
  } else {
    out.witness.state = std::move(flat);
  }
  for (uint64_t s = seg.first_step; s < seg.last_step; ++s) {
    if (pages != nullptr) {
      for (ledger::TileWitnessPage& p : ledger::ProvenPages(
               *pages, ledger::StepBatchPages(trainer->task(), work.stream, static_cast<int64_t>(s),
                                              pages->num_tokens()))) {
        out.witness.pages.push_back(std::move(p));
      }
      continue;
    }
    for (ledger::StepWitnessExample& e :
         BatchExamples(*trainer, work, *tree, static_cast<int64_t>(s))) {
      out.witness.examples.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace

Result<BuiltSegmentWitness> BuildSegmentWitness(engine::Trainer* trainer, ByteSpan start_blob,
                                                const UnitWork& work,
                                                std::span<const Hash256> leaves,
                                                std::string_view bundle,
                                                const engine::TokenPageTree* pages,
                                                const engine::DataTree* tree) {
  ML_RETURN_IF_ERROR(CheckSegmentProofs(*trainer, pages, tree));
  ML_ASSIGN_OR_RETURN(const uint32_t segments, SegmentsOf(work, leaves));
  Result<protocol::GlobalState> start = protocol::DecodeGlobalState(start_blob);
  if (!start.ok()) return start.status().WithPrefix("segment witness: the round's start state");
  // The replay from the unit's true start, one segment at a time (ReplayToSteps: the hashes
  // every party computes).
  const int64_t zero[] = {0};
  ML_RETURN_IF_ERROR(ReplayToSteps(trainer, start->weights, work, 0, nullptr, zero).status());
  for (uint32_t j = 0; j < segments; ++j) {
    std::optional<BuiltSegmentWitness> w =
        RunSegmentForWitness(trainer, start_blob, work, leaves, j, bundle, pages, tree);
    if (w) return std::move(*w);
  }
  return NotFound(
      "segment witness: every segment of the unit replays to its committed leaf; "
      "there is no fraud to prove");
}

Result<BuiltSegmentWitness> BuildSegmentWitnessOf(
    engine::Trainer* trainer, ByteSpan start_blob, const UnitWork& work,
    std::span<const Hash256> leaves, uint32_t segment, engine::TrainState* at_start,
    std::string_view bundle, const engine::TokenPageTree* pages, const engine::DataTree* tree) {
  ML_RETURN_IF_ERROR(CheckSegmentProofs(*trainer, pages, tree));
  ML_ASSIGN_OR_RETURN(const uint32_t segments, SegmentsOf(work, leaves));
  if (segment >= segments) {
    return InvalidArgument("segment witness: segment " + std::to_string(segment) +
                           " is out of range: the unit has " + std::to_string(segments));
  }
  Result<protocol::GlobalState> start = protocol::DecodeGlobalState(start_blob);
  if (!start.ok()) return start.status().WithPrefix("segment witness: the round's start state");
  const int64_t first = static_cast<int64_t>(
      protocol::SegmentStepsOf(static_cast<uint64_t>(work.inner_steps),
                               static_cast<uint64_t>(work.checkpoint_interval), segment)
          .first_step);
  // Segment 0 starts from the round's state (fresh moments), whatever `at_start` says.
  const bool from_state = segment > 0 && at_start != nullptr;
  const int64_t at[] = {first};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                      ReplayToSteps(trainer, start->weights, work, from_state ? first : 0,
                                    from_state ? at_start : nullptr, at));
  if (h[0] != leaves[segment]) {
    return FailedPrecondition(
        "segment witness: the state after step " + std::to_string(first) + " (" +
        std::string(from_state ? "the given state"
                               : "replayed from "
                                 "the unit's start") +
        ") hashes to " + h[0].ShortHex() + ", not the committed leaf " + std::to_string(segment) +
        " " + leaves[segment].ShortHex() + " the ledger starts the segment from");
  }
  std::optional<BuiltSegmentWitness> w =
      RunSegmentForWitness(trainer, start_blob, work, leaves, segment, bundle, pages, tree);
  if (!w) {
    return NotFound("segment witness: segment " + std::to_string(segment) +
                    " replays to its committed leaf " + leaves[segment + 1].ShortHex() +
                    "; there is nothing to show");
  }
  return std::move(*w);
}

}  // namespace meshlearn::node
