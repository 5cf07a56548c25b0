// Aggregation of a round's pseudo-gradients and the DiLoCo outer optimizer step (DESIGN.md step 5).
//
// Each solver of round r trains H inner steps from the round's global weights and reports its
// pseudo-gradient delta_i = global - local_i. The aggregator combines the deltas with the task's
// rule and applies the outer optimizer:
//
//   Result<AggregateResult> agg = Aggregate(contributions, config);   // any input order
//   if (!agg.ok()) return agg.status();
//   OuterStep(global_weights, outer_momentum, agg->delta, outer_config); // new global weights
//
// Determinism: anyone can recompute the aggregate bit for bit. Contributions are first put in
// canonical order (sorted by unit id), every sum runs sequentially in that order in double
// precision, per-coordinate order statistics sort with a total order (-0 before +0), and the only
// non-arithmetic function used is sqrt (correctly rounded by IEEE 754). No threads, no libm
// transcendentals; the build has -ffp-contract=off, so no hidden FMAs.
//
// Non-finite input: a contribution with any NaN or Inf coordinate is rejected by every rule
// (listed in AggregateResult::rejected) before aggregation, so it can never poison the result.
// Finite garbage (huge or sign-flipped deltas) is what separates the rules: the weighted mean
// follows it, the robust rules (trimmed mean, median, centered clipping, Krum) do not as long as
// garbage senders are a minority (Krum: n >= 2f + 3).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

enum class AggregationRule : uint8_t {
  kAggregationRuleWeightedMean = 0,  // sum(samples_i x delta_i) / sum(samples_i)
  kAggregationRuleTrimmedMean,       // per coordinate: drop k lowest and k highest, mean the rest
  kAggregationRuleMedian,            // per coordinate median (mean of the two middles if n even)
  kAggregationRuleCenteredClip,      // Karimireddy et al. 2021, started from the median
  kAggregationRuleKrum,              // Blanchard et al. 2017; multi-Krum when krum_select > 1
};
// Task-file names: "mean", "trimmed_mean", "median", "centered_clip", "krum".
std::string_view AggregationRuleName(AggregationRule rule);
Result<AggregationRule> ParseAggregationRule(std::string_view name);

struct AggregationConfig {
  AggregationRule rule = AggregationRule::kAggregationRuleWeightedMean;
  // Trimmed mean: k = floor(trim_fraction x n) values dropped at each end. In [0, 0.5).
  double trim_fraction = 0.125;
  // Centered clipping: radius tau; 0 = the median of the contributions' distances to the start
  // point (the coordinate median). Iterations >= 1.
  double clip_radius = 0.0;
  uint32_t clip_iterations = 3;
  // Krum: assumed number of Byzantine contributions f; -1 = floor((n - 3) / 2), the most Krum
  // tolerates. krum_select = how many best-scored deltas are averaged (1 = classic Krum).
  int32_t krum_byzantine = -1;
  uint32_t krum_select = 1;
};

// One solver's result. `delta` must stay alive during Aggregate.
struct Contribution {
  UnitId unit;
  uint64_t samples = 0;  // weight for the weighted mean (robust rules weigh every unit equally)
  std::span<const float> delta;
};

struct AggregateResult {
  std::vector<float> delta;      // the aggregated pseudo-gradient
  std::vector<UnitId> used;      // units that entered the rule (Krum: the selected ones), sorted
  std::vector<UnitId> rejected;  // units rejected for a NaN/Inf coordinate, sorted
};

// Checks a config for a rule (ranges), independent of the contributions.
Status ValidateAggregationConfig(const AggregationConfig& config);

// Combines the contributions. The result does not depend on their order.
// `tensor_sizes` (optional) cuts the flat deltas into consecutive tensors (sizes add up to the
// delta size); centered clipping and Krum then run per tensor (norms, distances and the Krum
// choice per tensor; `used` lists units Krum chose for any tensor). The coordinate-wise rules
// ignore it. Empty = one tensor.
// Errors: no contributions, duplicate unit ids, deltas of different sizes, bad tensor_sizes,
// zero total samples (mean), every contribution rejected, a config out of range, too few
// contributions for the rule (Krum with n < 2f + 3).
Result<AggregateResult> Aggregate(std::span<const Contribution> contributions,
                                  const AggregationConfig& config,
                                  std::span<const size_t> tensor_sizes = {});

// delta = global - local: the pseudo-gradient a solver reports after its inner steps.
// REQUIRES: global.size() == local.size().
std::vector<float> PseudoGradient(std::span<const float> global, std::span<const float> local);
// The same in place: `global_then_delta` holds global and becomes global - local, a part at a
// time if the caller likes (a pipeline stage's parameters, one tensor after another, with no copy
// of them). REQUIRES: global_then_delta.size() == local.size().
void PseudoGradientInPlace(std::span<float> global_then_delta, std::span<const float> local);

// DiLoCo's outer optimizer: SGD with Nesterov momentum (the PyTorch formulation, dampening 0):
//   m <- momentum x m + g
//   w <- w - lr x (g + momentum x m)          (nesterov)
//   w <- w - lr x m                           (nesterov = false)
// computed per element in float, in that order of operations. DiLoCo uses lr 0.7, momentum 0.9.
struct OuterOptimizerConfig {
  float lr = 0.7f;
  float momentum = 0.9f;
  bool nesterov = true;
};
Status ValidateOuterOptimizerConfig(const OuterOptimizerConfig& config);

// Applies one outer step in place. `momentum_buffer` starts as zeros and is part of the task
// state (carried from round to round). REQUIRES: all three spans have the same size.
void OuterStep(std::span<float> weights, std::span<float> momentum_buffer,
               std::span<const float> pseudo_gradient, const OuterOptimizerConfig& config);

}  // namespace meshlearn::protocol
