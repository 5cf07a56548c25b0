// Decomposition of a training task into rounds and work units (DESIGN.md, "One task, end to end",
// step 2), and the data each unit trains on.
//
// A task of R rounds and S units per round has R x S units; unit (r, i) runs H inner optimizer
// steps on data shard i, starting from the global weights of round r. Everything here is a pure
// function of the task spec, so a solver, a verifier and the ledger derive the same unit ids, the
// same shard and the same batch of every step without exchanging a list of indices.
//
//   std::vector<UnitId> units = RoundUnits(task, /*round=*/0);
//   ShardRange range = ShardOf(task, units[3]);
//   std::vector<uint64_t> batch = BatchIndices(task, units[3], /*step=*/7);  // batch_size indices
#pragma once

#include <cstdint>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

// Checks that a task can be decomposed: rounds, units_per_round, inner_steps, batch_size and
// num_examples > 0 and at least one example per shard. Errors name the field and the fix.
Status ValidateDecomposition(const TaskSpecView& task);

// Everything the protocol needs from a task spec, for SubmitTask to refuse a bad spec before any
// money moves: ValidateDecomposition, plus model_bytes > 0 and a multiple of 4 (float32),
// flops_per_sample > 0 and price_cap_per_gflop > 0. (The aggregation and outer-optimizer
// settings have their own Validate* in aggregate.h.)
Status ValidateTaskSpec(const TaskSpecView& task);

// The S unit ids of round `round`, in canonical order (shard 0 .. S-1).
// REQUIRES: round < task.rounds.
std::vector<UnitId> RoundUnits(const TaskSpecView& task, uint32_t round);

// A stable 32-byte key for a unit: BLAKE2b over ("meshlearn.unit", task, round, shard). Use it to
// name a unit in transactions, blobs and logs.
Hash256 UnitKey(const UnitId& unit);

// Seed of all randomness inside a unit (its batches, dropout): a pure function of
// (task seed, unit id). Different units get unrelated seeds.
uint64_t UnitSeed(uint64_t task_seed, const UnitId& unit);

// The inner learning-rate factor of round `round` of `rounds`: 1 in round 0, falling linearly to
// `inner_lr_final` in the last round (the [network] table's inner_lr_final; exact in double for
// integer ratios). Every party that replays a unit (solver, verifier, the ledger) uses this.
double InnerLrScale(uint32_t rounds, double inner_lr_final, uint32_t round);

// Seed of the batch of inner step `step` of `unit`: a pure function of (task seed, unit, step).
uint64_t BatchSeed(uint64_t task_seed, const UnitId& unit, uint64_t step);

// The examples of data shard `shard`: the dataset [0, num_examples) is cut into
// units_per_round contiguous ranges whose sizes differ by at most one (the first
// num_examples % S shards get one more). Every round uses the same shards; the batches differ.
struct ShardRange {
  uint64_t begin = 0;  // first example index
  uint64_t end = 0;    // one past the last
  uint64_t size() const { return end - begin; }
};
ShardRange ShardOf(const TaskSpecView& task, const UnitId& unit);

// The batch_size example indices of inner step `step` (0 .. H-1) of `unit`: drawn uniformly with
// replacement from the unit's shard by Rng(BatchSeed(...)). Indices are absolute dataset indices
// (for token files: window start positions, interpreted by the data loader).
// REQUIRES: ValidateDecomposition(task).ok().
std::vector<uint64_t> BatchIndices(const TaskSpecView& task, const UnitId& unit, uint64_t step);

// Samples one unit trains on: inner_steps x batch_size.
uint64_t UnitSamples(const TaskSpecView& task);
// Training FLOPs of one unit: samples x flops_per_sample (saturating at UINT64_MAX).
uint64_t UnitFlops(const TaskSpecView& task);

}  // namespace meshlearn::protocol
