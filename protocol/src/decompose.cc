#include "meshlearn/protocol/decompose.h"

#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/draw.h"

namespace meshlearn::protocol {
namespace {

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}

}  // namespace

std::string UnitId::ToString() const {
  return task.ShortHex() + "/r" + std::to_string(round) + "/s" + std::to_string(shard);
}

Status ValidateDecomposition(const TaskSpecView& task) {
  if (task.rounds == 0) return InvalidArgument("task: rounds must be > 0, got 0");
  if (task.units_per_round == 0) {
    return InvalidArgument("task: units_per_round must be > 0, got 0");
  }
  if (task.inner_steps == 0) return InvalidArgument("task: inner_steps (H) must be > 0, got 0");
  if (task.batch_size == 0) return InvalidArgument("task: batch_size must be > 0, got 0");
  if (task.num_examples < task.units_per_round) {
    return InvalidArgument(
        "task: the dataset has " + std::to_string(task.num_examples) +
        " examples, fewer than units_per_round=" + std::to_string(task.units_per_round) +
        "; lower units_per_round or use a larger dataset");
  }
  return Status::Ok();
}

Status ValidateTaskSpec(const TaskSpecView& task) {
  ML_RETURN_IF_ERROR(ValidateDecomposition(task));
  if (task.model_bytes == 0 || task.model_bytes % 4 != 0) {
    return InvalidArgument("task: model_bytes must be a positive multiple of 4 (float32), got " +
                           std::to_string(task.model_bytes));
  }
  if (task.flops_per_sample == 0) {
    return InvalidArgument(
        "task: flops_per_sample must be > 0 (about 6 x parameters for a dense net), got 0");
  }
  if (task.price_cap_per_gflop == 0) {
    return InvalidArgument(
        "task: price_cap_per_gflop must be > 0, got 0; no solver works for free");
  }
  return Status::Ok();
}

std::vector<UnitId> RoundUnits(const TaskSpecView& task, uint32_t round) {
  CHECK_LT(round, task.rounds);
  std::vector<UnitId> units;
  units.reserve(task.units_per_round);
  for (uint32_t i = 0; i < task.units_per_round; ++i) units.push_back({task.id, round, i});
  return units;
}

Hash256 UnitKey(const UnitId& unit) {
  Hasher h("meshlearn.unit");
  h.Update(unit.task).UpdateU64(unit.round).UpdateU64(unit.shard);
  return h.Finish();
}

uint64_t UnitSeed(uint64_t task_seed, const UnitId& unit) {
  Hasher h("meshlearn.unit_seed");
  h.UpdateU64(task_seed).Update(UnitKey(unit));
  return FirstU64(h.Finish());
}

double InnerLrScale(uint32_t rounds, double inner_lr_final, uint32_t round) {
  if (rounds <= 1) return 1.0;
  return 1.0 - (1.0 - inner_lr_final) * static_cast<double>(round) / static_cast<double>(rounds - 1);
}

uint64_t BatchSeed(uint64_t task_seed, const UnitId& unit, uint64_t step) {
  Hasher h("meshlearn.batch_seed");
  h.UpdateU64(task_seed).Update(UnitKey(unit)).UpdateU64(step);
  return FirstU64(h.Finish());
}

ShardRange ShardOf(const TaskSpecView& task, const UnitId& unit) {
  CHECK_GT(task.units_per_round, 0u);
  CHECK_LT(unit.shard, task.units_per_round);
  const uint64_t s = task.units_per_round;
  const uint64_t base = task.num_examples / s;
  const uint64_t extra = task.num_examples % s;
  const uint64_t i = unit.shard;
  ShardRange r;
  r.begin = i * base + (i < extra ? i : extra);
  r.end = r.begin + base + (i < extra ? 1 : 0);
  return r;
}

std::vector<uint64_t> BatchIndices(const TaskSpecView& task, const UnitId& unit, uint64_t step) {
  const ShardRange range = ShardOf(task, unit);
  CHECK_GT(range.size(), 0u) << "shard " << unit.ToString() << " is empty";
  Rng rng(BatchSeed(task.seed, unit, step));
  std::vector<uint64_t> out(task.batch_size);
  for (auto& idx : out) idx = range.begin + rng.Uniform(range.size());
  return out;
}

uint64_t UnitSamples(const TaskSpecView& task) {
  return static_cast<uint64_t>(task.inner_steps) * task.batch_size;
}

uint64_t UnitFlops(const TaskSpecView& task) {
  return SaturatingMul(UnitSamples(task), task.flops_per_sample);
}

}  // namespace meshlearn::protocol
