#include "referee_step.h"

#include <string>
#include <vector>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::ledger {

namespace {

// The task and unit replay parameters a witness's bundle gives, checked against the chain.
struct UnitReplay {
  engine::TaskSpec spec;
  uint64_t stream = 0;
  double lr_scale = 1.0;
};

Result<UnitReplay> LoadUnitReplay(const TaskRecord& t, const WorkUnit& unit,
                                  const std::string& bundle, const std::string& where) {
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
  // The unit, exactly as a solver trains it.
  UnitReplay r;
  r.spec = std::move(*spec);
  const protocol::UnitWork work = protocol::UnitWorkOf(
      *net, r.spec.seed, engine::TaskContentId(r.spec), unit.round, unit.shard);
  r.stream = work.stream;
  r.lr_scale = work.lr_scale;
  return r;
}

// The unit's training state after `step` from `flat` (FlatState's layout), checked to hash to
// `expected` (`what` names it in the error).
Result<engine::TrainState> CheckedState(const engine::TaskSpec& spec, double lr_scale,
                                        uint64_t stream, std::span<const float> flat,
                                        int64_t step, const Hash256& expected,
                                        const std::string& where, const std::string& what) {
  Result<engine::TrainState> st = engine::StateFromFlat(
      spec.model, engine::UnitOptimizerSpec(spec.optimizer, lr_scale), flat, step, spec.seed,
      stream);
  if (!st.ok()) return InvalidArgument(where + ": witness state: " + st.status().message());
  const Hash256 h = engine::StateHash(*st);
  if (h != expected) {
    return InvalidArgument(where + ": the witness state hashes to " + h.ShortHex() + ", " + what +
                           " is " + expected.ShortHex());
  }
  return st;
}

}  // namespace

Result<Hash256> RunStepWitness(const engine::TaskSpec& spec, uint64_t stream, double lr_scale,
                               uint64_t num_examples, const Hash256& data_root, uint64_t step,
                               const Hash256& agreed, const StepWitness& w,
                               const std::string& where) {
  if (spec.data.format != "idx" && spec.data.format != "npy") {
    return FailedPrecondition(where + ": a '" + spec.data.format +
                              "' task; only classification tasks are refereed on chain");
  }
  if (step == 0) return InvalidArgument(where + ": step 0 is the unit's start, not a step");
  const int64_t before = static_cast<int64_t>(step) - 1;
  ML_ASSIGN_OR_RETURN(engine::TrainState state,
                      CheckedState(spec, lr_scale, stream, w.state, before, agreed, where,
                                   "the agreed state after step " + std::to_string(before)));
  engine::TrainState* st = &state;
  // The batch: the examples the unit's sampler draws at this step, each proven in the data.
  const int64_t batch = spec.batch_size;
  if (w.examples.size() != static_cast<size_t>(batch)) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.examples.size()) +
                           " examples, a batch of this task has " + std::to_string(batch));
  }
  const std::vector<int64_t> indices = engine::BatchIndices(
      spec.seed, stream, static_cast<int64_t>(num_examples), batch, before);
  engine::Shape shape = spec.model.input;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t classes = st->model->NumOutputs();
  engine::ClassificationData data;
  shape.insert(shape.begin(), batch);
  data.x = engine::Tensor(shape);
  data.num_classes = classes;
  data.y.reserve(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const StepWitnessExample& e = w.examples[i];
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
  engine::StepOnBatch(*st, engine::MakeClassificationBatch(data, order),
                      engine::DropoutSeed(spec.seed, stream));
  return engine::StateHash(*st);
}

Result<Hash256> ExecuteRefereeStepWitness(const TaskRecord& t, const WorkUnit& unit,
                                          const protocol::RefereeTask& task,
                                          const StepWitness& w) {
  const std::string where = "referee step (task " + t.id.ShortHex() + ", unit " +
                            std::to_string(unit.index) + ", step " + std::to_string(task.step) + ")";
  const TaskParams& p = t.params;
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, w.bundle, where));
  return RunStepWitness(r.spec, r.stream, r.lr_scale, p.num_examples, p.data_root, task.step,
                        task.input, w, where);
}

Result<Hash256> ExecuteResultWitness(const TaskRecord& t, const WorkUnit& unit,
                                     const ResultWitness& w) {
  const std::string where = "prove result (task " + t.id.ShortHex() + ", unit " +
                            std::to_string(unit.index) + ")";
  if (unit.leaves.empty()) {
    return FailedPrecondition(where + ": the unit has no committed leaves");
  }
  ML_ASSIGN_OR_RETURN(UnitReplay r, LoadUnitReplay(t, unit, w.bundle, where));
  // The round's start weights: the blob the chain names for the unit's round.
  const Hash256 start_id = unit.round == 0 ? t.params.initial_state
                                           : t.round_results.at(unit.round - 1).state;
  const BlobId given = BuildManifest(w.start_state).id();
  if (given.hash != start_id) {
    return InvalidArgument(where + ": the witness's start state has blob id " + given.ShortHex() +
                           ", round " + std::to_string(unit.round) + " started from " +
                           start_id.ShortHex());
  }
  Result<protocol::GlobalState> start = protocol::DecodeGlobalState(w.start_state);
  if (!start.ok()) return InvalidArgument(where + ": " + start.status().message());
  ML_ASSIGN_OR_RETURN(engine::TrainState st,
                      CheckedState(r.spec, r.lr_scale, r.stream, w.state,
                                   static_cast<int64_t>(t.params.inner_steps),
                                   unit.leaves.back(), where, "the unit's last committed leaf"));
  const size_t n = static_cast<size_t>(st.model->NumParameters());
  if (start->weights.size() != n) {
    return InvalidArgument(where + ": the start state holds " +
                           std::to_string(start->weights.size()) + " weights, the model has " +
                           std::to_string(n));
  }
  // FlatState puts the parameters first, in model order: the layout of weights and deltas.
  return ResultBlobId(start->weights, std::span<const float>(w.state.data(), n));
}

Hash256 DeltaBlobId(std::span<const float> delta) {
  return BuildManifest(protocol::EncodeDelta(delta)).id().hash;
}

Hash256 ResultBlobId(std::span<const float> global, std::span<const float> params) {
  return DeltaBlobId(protocol::PseudoGradient(global, params));
}

}  // namespace meshlearn::ledger
