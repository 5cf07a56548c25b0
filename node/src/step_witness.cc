#include "meshlearn/node/step_witness.h"

#include <utility>
#include <vector>

#include "meshlearn/base/merkle.h"
#include "meshlearn/ledger/step_witness.h"

namespace meshlearn::node {
namespace {

// Floats per training example (the training tensor is (N, ...)).
int64_t ExampleFloats(const engine::ClassificationData& train) {
  return train.size() == 0 ? 0 : train.x.size() / train.size();
}

}  // namespace

Hash256 TaskDataRoot(const engine::TaskData& data) {
  if (data.tokens || data.train.size() == 0) return Hash256{};
  return engine::DataTree(data.train).root();
}

uint64_t StepWitnessBound(const engine::Trainer& trainer, uint64_t num_params) {
  const engine::TaskSpec& task = trainer.task();
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
  // 1. From the unit's start.
  const int64_t before[] = {step - 1};
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                      ReplayToSteps(trainer, global, work, 0, nullptr, before));
  out.true_input = h[0];
  if (out.true_input == task.input) {
    out.reason =
        "the agreed state after step " + std::to_string(step - 1) + " is the unit's true state";
  } else {
    trainer->Step();
    out.true_output = engine::StateHash(trainer->state());
    const std::string not_true = "the agreed state after step " + std::to_string(step - 1) + " (" +
                                 task.input.ShortHex() + ") is not the unit's true state (" +
                                 out.true_input.ShortHex() + ")";
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
    if (h[0] != task.input) {
      return FailedPrecondition("step witness: " + not_true +
                                ", nor the replay from the defender's checkpoint at step " +
                                std::to_string(start.first_step) + " (" + h[0].ShortHex() +
                                "); no witness can be built (the dispute ends undecided)");
    }
    out.from_checkpoint = true;
    out.reason = not_true + "; it is the defender's checkpoint at step " +
                 std::to_string(start.first_step) + " replayed to step " +
                 std::to_string(step - 1) + " (the defender cheated before the dispute)";
  }

  // The trainer is at the agreed state after step - 1.
  engine::TrainState& st = trainer->state();
  out.witness.bundle = std::string(bundle);
  out.witness.state = engine::FlatState(st);
  const engine::ClassificationData& train = trainer->data().train;
  const int64_t per = ExampleFloats(train);
  const std::vector<int64_t> indices = engine::BatchIndices(
      trainer->task().seed, work.stream, train.size(), trainer->task().batch_size, st.step);
  out.witness.examples.reserve(indices.size());
  for (int64_t i : indices) {
    const float* x = train.x.data() + i * per;
    out.witness.examples.push_back({.index = static_cast<uint64_t>(i),
                                    .x = std::vector<float>(x, x + per),
                                    .y = train.y[static_cast<size_t>(i)],
                                    .proof = tree.Prove(i)});
  }
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

}  // namespace meshlearn::node
