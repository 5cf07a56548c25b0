#include "meshlearn/node/unit_executor.h"

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/protocol/aggregate.h"

namespace meshlearn::node {

std::vector<int64_t> HashedSteps(int64_t inner_steps, int64_t k) {
  std::vector<int64_t> steps = {0};
  if (k > 0) {
    for (int64_t s = k; s < inner_steps; s += k) steps.push_back(s);
  }
  if (inner_steps > 0) steps.push_back(inner_steps);
  return steps;
}

Hash256 HashFloats(std::span<const float> v) {
  static_assert(std::endian::native == std::endian::little, "meshlearn assumes little-endian");
  Hasher h("meshlearn.floats.v1");
  h.UpdateU64(v.size());
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)));
  return h.Finish();
}

Result<UnitOutcome> UnitExecutor::Run(std::span<const float> global, const UnitWork& work,
                                      const StepCallback& on_step) {
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
  for (int64_t s = 0; s <= work.inner_steps; ++s) {
    if (next_hash < out.hashed_steps.size() && out.hashed_steps[next_hash] == s) {
      out.state_hashes.push_back(engine::StateHash(trainer_->state()));
      ++next_hash;
    }
    if (s == work.inner_steps) break;
    float loss = trainer_->Step();
    loss_sum += loss;
    if (on_step) on_step(s + 1, loss);
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

}  // namespace meshlearn::node
