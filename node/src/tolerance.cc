#include "meshlearn/node/tolerance.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace meshlearn::node {
namespace {

Result<std::vector<float>> RunSteps(engine::Trainer* trainer, std::span<const float> global,
                                    const UnitWork& work, int64_t steps,
                                    const engine::KernelConfig& config) {
  ML_RETURN_IF_ERROR(engine::SetKernelConfig(config));
  ML_RETURN_IF_ERROR(trainer->StartUnit(work.stream, global, work.lr_scale));
  for (int64_t s = 0; s < steps; ++s) trainer->Step();
  return trainer->FlatParams();
}

uint32_t CeilTo(double value, double scale, uint32_t floor) {
  const double v = std::ceil(value * scale);
  if (!(v < 4e9)) return UINT32_MAX;
  return std::max(floor, static_cast<uint32_t>(v));
}

}  // namespace

protocol::ToleranceParams ThresholdsFor(const protocol::StateDistance& measured,
                                        const ToleranceOptions& options) {
  protocol::ToleranceParams t;
  t.max_rel_l2_ppm =
      std::min<uint32_t>(1'000'000, CeilTo(measured.rel_l2 * options.safety_factor, 1e6,
                                           options.floor_rel_l2_ppm));
  t.max_cosine_gap_ppb =
      std::min<uint32_t>(1'000'000'000, CeilTo((1.0 - measured.cosine) * options.safety_factor,
                                               1e9, options.floor_cosine_gap_ppb));
  return t;
}

Result<ToleranceProfile> ProfileTolerance(engine::Trainer* trainer, std::span<const float> global,
                                          const UnitWork& work, int64_t steps,
                                          const engine::KernelConfig& a,
                                          const engine::KernelConfig& b,
                                          const ToleranceOptions& options) {
  if (steps <= 0 || steps > work.inner_steps) {
    return InvalidArgument("tolerance profile: steps must be in [1, inner_steps = " +
                           std::to_string(work.inner_steps) + "], got " + std::to_string(steps));
  }
  const engine::KernelConfig saved = engine::GetKernelConfig();
  Result<std::vector<float>> first = RunSteps(trainer, global, work, steps, a);
  Result<std::vector<float>> second =
      first.ok() ? RunSteps(trainer, global, work, steps, b) : first.status();
  Status restore = engine::SetKernelConfig(saved);
  ML_RETURN_IF_ERROR(first.status());
  ML_RETURN_IF_ERROR(second.status());
  ML_RETURN_IF_ERROR(restore);
  ToleranceProfile p;
  p.measured = protocol::Distance(*second, *first);
  p.params = ThresholdsFor(p.measured, options);
  return p;
}

}  // namespace meshlearn::node
