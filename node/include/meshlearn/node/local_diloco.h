// DiLoCo training of a network task inside one process, without a ledger or a network: every
// round runs its units one after another on one trainer, aggregates their pseudo-gradients with
// the task's rule and applies the outer optimizer. It computes exactly what the network computes
// (same unit streams, same aggregation, same outer step), so it is
//  * the reference a devnet's final model hash is compared with,
//  * the baseline for "devnet time to target accuracy",
//  * the harness for robust-aggregation experiments (garbage deltas injected per unit).
//
//   ML_ASSIGN_OR_RETURN(LocalDilocoResult r, RunLocalDiloco(trainer.get(), net, {}));
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/network_task.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::node {

// What a malicious solver sends instead of its honest pseudo-gradient.
enum class GarbageKind {
  kGarbageNone = 0,
  kGarbageHuge,      // every coordinate +-1e6 (random signs)
  kGarbageNaN,       // the honest delta with NaN in every 7th coordinate
  kGarbageSignFlip,  // -10 x the honest delta
};
std::string_view GarbageKindName(GarbageKind kind);
Result<GarbageKind> ParseGarbageKind(std::string_view name);

// Rewrites `delta` in place as a garbage sender would (deterministic: seeded by `seed`).
void MakeGarbage(GarbageKind kind, uint64_t seed, std::vector<float>& delta);

struct RoundReport {
  uint32_t round = 0;
  float train_loss = 0;        // mean over the round's honest units
  engine::EvalResult eval;     // of the new global weights
  Hash256 global_hash;         // HashFloats(new global weights)
  uint32_t rejected_units = 0; // contributions the rule rejected (NaN/Inf)
};

struct LocalDilocoOptions {
  // The last `garbage_units` units of every round send garbage of this kind.
  uint32_t garbage_units = 0;
  GarbageKind garbage = GarbageKind::kGarbageNone;
  // Evaluate the global weights after every round (else only after the last).
  bool eval_every_round = true;
  std::function<void(const RoundReport&)> on_round;
  std::function<void(uint32_t round, uint32_t unit)> on_unit;
};

struct LocalDilocoResult {
  std::vector<RoundReport> rounds;
  std::vector<float> final_weights;
  Hash256 final_hash;
};

// The protocol's view of a network task (ids, counts) derived from the task files: from the task
// (its model complete, as LoadTaskData leaves it) and its data, or from a trainer's.
protocol::TaskSpecView MakeTaskView(const engine::TaskSpec& task, const engine::TaskData& data,
                                    const NetworkSpec& net);
protocol::TaskSpecView MakeTaskView(const engine::Trainer& trainer, const NetworkSpec& net);

// Runs all rounds. The trainer's initial parameters (its task seed) are round 0's weights.
Result<LocalDilocoResult> RunLocalDiloco(engine::Trainer* trainer, const NetworkSpec& net,
                                         const LocalDilocoOptions& options);

}  // namespace meshlearn::node
