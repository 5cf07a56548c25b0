// Profiling a task's tolerance (docs/verification.md, "Tolerance mode"): how far apart two honest
// executions of the same unit end up when the kernels run differently. A task in tolerance mode
// accepts a verifier's replay when its distance to the committed state is within thresholds set
// from this measurement, so the submitter measures it before submitting.
//
//   ML_ASSIGN_OR_RETURN(ToleranceProfile p,
//                       ProfileTolerance(trainer, global, work, /*steps=*/10, a, b));
//   params.tolerance_rel_l2_ppm = p.params.max_rel_l2_ppm;
//
// On meshlearn's own engine every kernel configuration gives the same bits (the determinism
// contract), so the measured distance is 0 and the thresholds are the floors: tolerance mode is
// for engines and accelerators that do not make that promise.
#pragma once

#include <cstdint>
#include <span>

#include "meshlearn/base/status.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::node {

struct ToleranceProfile {
  protocol::StateDistance measured;  // between the two executions' parameters after `steps`
  protocol::ToleranceParams params;  // max(measured x safety_factor, floors), rounded up
};

struct ToleranceOptions {
  double safety_factor = 10;
  uint32_t floor_rel_l2_ppm = 1;       // 1e-6
  uint32_t floor_cosine_gap_ppb = 1;   // 1e-9
};

// Runs the first `steps` steps of `work` from `global` under kernel configuration `a`, then
// under `b`, and compares the parameters. Restores the process's kernel configuration.
Result<ToleranceProfile> ProfileTolerance(engine::Trainer* trainer, std::span<const float> global,
                                          const UnitWork& work, int64_t steps,
                                          const engine::KernelConfig& a,
                                          const engine::KernelConfig& b,
                                          const ToleranceOptions& options = {});

// The thresholds a measured distance gives (exposed for tests).
protocol::ToleranceParams ThresholdsFor(const protocol::StateDistance& measured,
                                        const ToleranceOptions& options);

}  // namespace meshlearn::node
