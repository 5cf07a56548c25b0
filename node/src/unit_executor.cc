#include "meshlearn/node/unit_executor.h"

#include <algorithm>
#include <string>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"

namespace meshlearn::node {

Hash256 HashFloats(std::span<const float> v) {
  static_assert(std::endian::native == std::endian::little, "meshlearn assumes little-endian");
  Hasher h("meshlearn.floats.v1");
  h.UpdateU64(v.size());
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)));
  return h.Finish();
}

Result<UnitOutcome> UnitExecutor::Run(std::span<const float> global, const UnitWork& work,
                                      const StepCallback& on_step) {
  return Run(global, work, UnitRunOptions{.on_step = on_step});
}

namespace {

// Copies a checkpoint's parameters and optimizer state into the trainer's (fresh) unit state.
Status ApplyResume(engine::TrainState& dst, engine::TrainState& src) {
  if (!src.model || !src.optimizer) {
    return InvalidArgument("unit resume: the checkpoint has no model or no optimizer state");
  }
  std::vector<engine::Param>& dp = dst.model->params();
  std::vector<engine::Param>& sp = src.model->params();
  if (dp.size() != sp.size()) return InvalidArgument("unit resume: parameter count differs");
  for (size_t i = 0; i < dp.size(); ++i) {
    if (dp[i].name != sp[i].name || dp[i].value.size() != sp[i].value.size()) {
      return InvalidArgument("unit resume: parameter " + dp[i].name + " does not match");
    }
    std::copy(sp[i].value.data(), sp[i].value.data() + sp[i].value.size(), dp[i].value.data());
  }
  auto ds = dst.optimizer->State();
  auto ss = src.optimizer->State();
  if (ds.size() != ss.size()) return InvalidArgument("unit resume: optimizer state differs");
  for (size_t i = 0; i < ds.size(); ++i) {
    if (ds[i].name != ss[i].name || ds[i].tensor->size() != ss[i].tensor->size()) {
      return InvalidArgument("unit resume: optimizer state " + ds[i].name + " does not match");
    }
    std::copy(ss[i].tensor->data(), ss[i].tensor->data() + ss[i].tensor->size(),
              ds[i].tensor->data());
  }
  return Status::Ok();
}

}  // namespace

Result<UnitOutcome> UnitExecutor::Run(std::span<const float> global, const UnitWork& work,
                                      const UnitRunOptions& options) {
  if (work.inner_steps <= 0) {
    return InvalidArgument("unit inner_steps must be > 0, got " + std::to_string(work.inner_steps));
  }
  if (work.checkpoint_interval < 0) {
    return InvalidArgument("unit checkpoint_interval must be >= 0, got " +
                           std::to_string(work.checkpoint_interval));
  }
  ML_RETURN_IF_ERROR(trainer_->StartUnit(work.stream, global, work.lr_scale));

  UnitOutcome out;
  out.hashed_steps = HashedSteps(work.inner_steps, work.checkpoint_interval);
  size_t next_hash = 0;
  double loss_sum = 0;
  int64_t first = 0;
  if (options.resume != nullptr) {
    UnitResume& r = *options.resume;
    size_t pos = 0;
    while (pos < out.hashed_steps.size() && out.hashed_steps[pos] != r.step) ++pos;
    if (r.step <= 0 || r.step >= work.inner_steps || pos == out.hashed_steps.size() ||
        r.state_hashes.size() != pos + 1 || r.state.step != r.step ||
        r.state.stream != work.stream) {
      return InvalidArgument("unit resume: checkpoint at step " + std::to_string(r.step) +
                             " does not fit this unit (H=" + std::to_string(work.inner_steps) +
                             ", k=" + std::to_string(work.checkpoint_interval) + ")");
    }
    ML_RETURN_IF_ERROR(ApplyResume(trainer_->state(), r.state));
    trainer_->state().step = r.step;
    if (engine::StateHash(trainer_->state()) != r.state_hashes.back()) {
      return InvalidArgument("unit resume: the checkpoint's state hash differs from the one "
                             "recorded at step " + std::to_string(r.step));
    }
    out.state_hashes = r.state_hashes;
    next_hash = pos + 1;
    loss_sum = r.loss_sum;
    first = r.step;
  }
  for (int64_t s = first; s <= work.inner_steps; ++s) {
    if (s > first && next_hash < out.hashed_steps.size() && out.hashed_steps[next_hash] == s) {
      out.state_hashes.push_back(engine::StateHash(trainer_->state()));
      ++next_hash;
      if (options.on_checkpoint && s > 0 && s < work.inner_steps) {
        ML_RETURN_IF_ERROR(options.on_checkpoint(s, trainer_->state(), out.state_hashes, loss_sum));
      }
    } else if (s == 0) {
      out.state_hashes.push_back(engine::StateHash(trainer_->state()));
      ++next_hash;
    }
    if (s == work.inner_steps) break;
    if (options.should_stop && options.should_stop()) {
      return Unavailable("unit stopped at step " + std::to_string(s) + " of " +
                         std::to_string(work.inner_steps));
    }
    float loss = trainer_->Step();
    loss_sum += loss;
    if (options.on_step) options.on_step(s + 1, loss);
  }
  out.commitment = MerkleRoot(out.state_hashes);
  std::vector<float> local = trainer_->FlatParams();
  out.delta = protocol::PseudoGradient(global, local);
  out.delta_hash = HashFloats(out.delta);
  out.mean_loss = static_cast<float>(loss_sum / static_cast<double>(work.inner_steps));
  out.samples = static_cast<uint64_t>(work.inner_steps) *
                static_cast<uint64_t>(trainer_->samples_per_step());
  return out;
}

namespace {

// Puts the trainer at the start of a replay of `work` from the state after `first_step`: the
// unit's own start (first_step 0), else `start`, a state of this unit after that step.
Status StartReplay(engine::Trainer* trainer, std::span<const float> global, const UnitWork& work,
                   int64_t first_step, engine::TrainState* start, const std::string& what) {
  ML_RETURN_IF_ERROR(trainer->StartUnit(work.stream, global, work.lr_scale));
  if (first_step == 0) return Status::Ok();
  if (start == nullptr) {
    return InvalidArgument("replay: " + what + " starts at step " + std::to_string(first_step) +
                           " and needs the solver's checkpoint there");
  }
  if (start->step != first_step || start->stream != work.stream) {
    return InvalidArgument("replay: the checkpoint is of step " + std::to_string(start->step) +
                           " (stream " + std::to_string(start->stream) + "), " + what +
                           " starts at step " + std::to_string(first_step));
  }
  ML_RETURN_IF_ERROR(ApplyResume(trainer->state(), *start));
  trainer->state().step = first_step;
  return Status::Ok();
}

}  // namespace

Result<SegmentReplay> ReplaySegment(engine::Trainer* trainer, std::span<const float> global,
                                    const UnitWork& work, uint32_t segment,
                                    engine::TrainState* start, const Hash256* expected_start) {
  const std::vector<int64_t> steps = HashedSteps(work.inner_steps, work.checkpoint_interval);
  if (work.inner_steps <= 0 || segment + 1ull >= steps.size()) {
    return InvalidArgument("replay: segment " + std::to_string(segment) + " is out of range; " +
                           "the unit has " + std::to_string(steps.size() - 1) + " segments");
  }
  SegmentReplay r;
  r.first_step = steps[segment];
  r.last_step = steps[segment + 1];
  ML_RETURN_IF_ERROR(StartReplay(trainer, global, work, r.first_step, start,
                                 "segment " + std::to_string(segment)));
  r.start_hash = engine::StateHash(trainer->state());
  if (expected_start != nullptr && r.start_hash != *expected_start) {
    return FailedPrecondition("replay: the solver's state at step " +
                              std::to_string(r.first_step) +
                              " does not hash to its committed state " +
                              expected_start->ShortHex());
  }
  for (int64_t s = r.first_step; s < r.last_step; ++s) trainer->Step();
  r.end_hash = engine::StateHash(trainer->state());
  return r;
}

Result<std::vector<Hash256>> ReplayToSteps(engine::Trainer* trainer, std::span<const float> global,
                                           const UnitWork& work, int64_t from_step,
                                           engine::TrainState* start,
                                           std::span<const int64_t> steps) {
  if (work.inner_steps <= 0 || from_step < 0 || from_step > work.inner_steps) {
    return InvalidArgument("replay: from step " + std::to_string(from_step) +
                           " is outside the unit's " + std::to_string(work.inner_steps) +
                           " steps");
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] < from_step || steps[i] > work.inner_steps || (i > 0 && steps[i] < steps[i - 1])) {
      return InvalidArgument("replay: steps must be ascending in [" + std::to_string(from_step) +
                             ", " + std::to_string(work.inner_steps) + "]");
    }
  }
  ML_RETURN_IF_ERROR(StartReplay(trainer, global, work, from_step, start,
                                 "the replay from step " + std::to_string(from_step)));
  std::vector<Hash256> out;
  out.reserve(steps.size());
  int64_t s = from_step;
  for (int64_t want : steps) {
    for (; s < want; ++s) trainer->Step();
    out.push_back(engine::StateHash(trainer->state()));
  }
  return out;
}

Hash256 ResultOfFinalState(std::span<const float> global, engine::TrainState& final_state) {
  // The parameters in model order: engine::FlatState's first part, the ledger's layout.
  std::vector<float> params;
  params.reserve(global.size());
  for (const engine::Param& p : final_state.model->params()) {
    params.insert(params.end(), p.value.data(), p.value.data() + p.value.size());
  }
  return ledger::ResultBlobId(global, params);  // exactly what a ProveResult computes
}

ResultCheck CheckUnitResult(std::span<const float> global, engine::TrainState& final_state,
                            const Hash256& last_leaf, const Hash256& result_hash) {
  if (!final_state.model || engine::StateHash(final_state) != last_leaf) {
    return ResultCheck::kNotShown;
  }
  return ResultOfFinalState(global, final_state) == result_hash ? ResultCheck::kRight
                                                                : ResultCheck::kWrong;
}

}  // namespace meshlearn::node
