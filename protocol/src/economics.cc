#include "meshlearn/protocol/economics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/draw.h"
#include "meshlearn/protocol/unit_check.h"

namespace meshlearn::protocol {
namespace {

// The unit's segment layout: S segments of k steps, the last of l.
struct Layout {
  uint64_t steps = 0;     // H
  uint64_t interval = 0;  // k (H when the unit is one segment)
  uint32_t segments = 1;  // S
  uint64_t last = 0;      // l
  uint32_t replayed = 1;  // r
};

Layout MakeLayout(const VerificationParams& params, const TaskShape& shape) {
  Layout l;
  l.steps = shape.inner_steps;
  l.segments = SegmentCount(shape.inner_steps, shape.checkpoint_interval);
  l.interval = l.segments == 1 ? shape.inner_steps : shape.checkpoint_interval;
  l.last = l.steps - (l.segments - 1) * l.interval;
  l.replayed = std::min(params.segments_per_check, l.segments);
  return l;
}

// C(total - drawn_from, n) / C(total, n): none of n distinct uniform draws from `total` items
// falls among `drawn_from` given ones.
double NoneAmong(uint64_t total, uint64_t drawn_from, uint64_t n) {
  if (n == 0) return 1;
  if (drawn_from + n > total) return 0;
  double h = 1;
  for (uint64_t i = 0; i < n; ++i) {
    h *= static_cast<double>(total - drawn_from - i) / static_cast<double>(total - i);
  }
  return h;
}

// SlashAmount in unit costs: the real rule, at a cost large enough that its 1-token minimum and
// integer rounding do not matter.
double SlashInUnitCosts(uint32_t slash_multiple) {
  constexpr uint64_t kCost = 1'000'000;
  return static_cast<double>(SlashAmount(kCost, slash_multiple)) / static_cast<double>(kCost);
}

Reputation WithCleanChecks(Reputation rep, uint64_t clean) {
  rep.verified_clean += clean;
  rep.clean_streak += clean;
  return rep;
}

}  // namespace

uint64_t FakedSteps(const CheatPattern& cheat, uint64_t inner_steps) {
  const double f = std::clamp(cheat.faked_fraction, 0.0, 1.0);
  const double steps = std::ceil(f * static_cast<double>(inner_steps) - 1e-9);
  return std::min<uint64_t>(inner_steps, static_cast<uint64_t>(std::max(0.0, steps)));
}

double DetectionIfChecked(const VerificationParams& params, const TaskShape& shape,
                          const CheatPattern& cheat) {
  const Layout l = MakeLayout(params, shape);
  const uint64_t n = FakedSteps(cheat, l.steps);
  if (n == 0) return 0;
  if (cheat.spread == CheatSpread::kCheatSpreadSegments) {
    const uint64_t bad = std::min<uint64_t>(l.segments, (n + l.interval - 1) / l.interval);
    return 1 - NoneAmong(l.segments, bad, l.replayed);
  }
  const double with_last = static_cast<double>(l.replayed) / l.segments;
  const double clean = (1 - with_last) * NoneAmong(l.steps, l.replayed * l.interval, n) +
                       with_last * NoneAmong(l.steps, (l.replayed - 1) * l.interval + l.last, n);
  return 1 - clean;
}

Reputation SteadyStateReputation() {
  Reputation rep;
  rep.completed = 1'000'000;
  rep.verified_clean = 1'000'000;
  rep.clean_streak = 1'000'000;
  return rep;
}

uint32_t SteadyStatePermille(const VerificationParams& params) {
  return VerificationProbabilityPermille(SteadyStateReputation(), params);
}

double VerifierOverhead(uint32_t check_permille, const VerificationParams& params,
                        const TaskShape& shape) {
  const Layout l = MakeLayout(params, shape);
  return check_permille / 1000.0 * shape.verifiers_per_unit * l.replayed / l.segments;
}

SolverOutlook AnalyzeSolver(const VerificationParams& params, uint32_t slash_multiple,
                            const TaskShape& shape, const CheatPattern& cheat,
                            const Reputation& start) {
  const bool cheats = FakedSteps(cheat, shape.inner_steps) > 0;
  const double q = DetectionIfChecked(params, shape, cheat);
  const uint32_t units = shape.units_per_solver;
  // alive[i]: probability that the solver is not caught yet and passed i checks in this task.
  std::vector<double> alive(units + 1, 0.0), next(units + 1, 0.0);
  alive[0] = 1;
  double caught = 0;
  SolverOutlook out;
  for (uint32_t u = 0; u < units; ++u) {
    std::fill(next.begin(), next.end(), 0.0);
    out.expected_checks += caught;  // a slashed node is checked always
    double caught_now = 0;
    for (uint32_t i = 0; i <= u; ++i) {
      if (alive[i] == 0) continue;
      const double p = VerificationProbabilityPermille(WithCleanChecks(start, i), params) / 1000.0;
      const double detect = cheats ? q : 0.0;
      out.expected_checks += alive[i] * p;
      if (cheats) out.expected_cheated += alive[i];
      next[i] += alive[i] * (1 - p);
      next[i + 1] += alive[i] * p * (1 - detect);
      caught_now += alive[i] * p * detect;
    }
    caught += caught_now;
    std::swap(alive, next);
  }
  out.escape = 0;
  for (double a : alive) out.escape += a;
  if (cheats) {
    const double saved = static_cast<double>(FakedSteps(cheat, shape.inner_steps)) /
                         static_cast<double>(shape.inner_steps);
    out.gain = saved * out.expected_cheated - (1 + SlashInUnitCosts(slash_multiple)) * caught;
  }
  return out;
}

double NewNodeOverhead(const VerificationParams& params, const TaskShape& shape) {
  if (shape.units_per_solver == 0) return 0;
  SolverOutlook honest = AnalyzeSolver(params, 0, shape, CheatPattern{}, Reputation{});
  return VerifierOverhead(1000, params, shape) * honest.expected_checks / shape.units_per_solver;
}

uint32_t MinDeterringSlashMultiple(double saved_share, double detect_per_unit) {
  if (detect_per_unit <= 0) return std::numeric_limits<uint32_t>::max();
  double m = std::max(0.0, std::floor(saved_share / detect_per_unit - 1));
  // The same expression as the gain, so the answer agrees with it at a boundary.
  while (saved_share - detect_per_unit * (1 + m) >= 0) m += 1;
  return m >= std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max()
                                                   : static_cast<uint32_t>(m);
}

double RubberStampGainPerCheck(const VerificationParams& params, uint32_t slash_multiple,
                               const TaskShape& shape) {
  const Layout l = MakeLayout(params, shape);
  const double replay = static_cast<double>(l.replayed) / static_cast<double>(l.segments);
  const double f = params.forced_error_per_million / 1e6;
  return replay - f * (replay + slash_multiple);
}

EconomicsReport AnalyzeEconomics(const VerificationParams& params, uint32_t slash_multiple,
                                 const TaskShape& shape, const CheatPattern& cheat) {
  const Layout l = MakeLayout(params, shape);
  EconomicsReport r;
  r.segments = l.segments;
  r.segments_replayed = l.replayed;
  r.check_permille = SteadyStatePermille(params);
  r.saved_share = shape.inner_steps == 0
                      ? 0.0
                      : static_cast<double>(FakedSteps(cheat, shape.inner_steps)) /
                            static_cast<double>(shape.inner_steps);
  r.detect_if_checked = DetectionIfChecked(params, shape, cheat);
  r.detect_per_unit = r.check_permille / 1000.0 * r.detect_if_checked;
  r.escape_task = std::pow(1 - r.detect_per_unit, shape.units_per_solver);
  r.gain_per_unit = r.saved_share - r.detect_per_unit * (1 + SlashInUnitCosts(slash_multiple));
  r.gain_task = AnalyzeSolver(params, slash_multiple, shape, cheat, SteadyStateReputation()).gain;
  r.min_slash_multiple = MinDeterringSlashMultiple(r.saved_share, r.detect_per_unit);
  r.overhead = VerifierOverhead(r.check_permille, params, shape);
  r.new_node_overhead = NewNodeOverhead(params, shape);
  r.forced_error_rerun = params.forced_error_per_million / 1e6;
  return r;
}

SimulatedSolver SimulateSolver(const VerificationParams& params, uint32_t slash_multiple,
                               const TaskShape& shape, const CheatPattern& cheat,
                               const Reputation& start, uint64_t tasks, uint64_t seed) {
  const Layout l = MakeLayout(params, shape);
  const uint64_t faked = FakedSteps(cheat, l.steps);
  const double saved = l.steps == 0 ? 0.0 : static_cast<double>(faked) / l.steps;
  const double slash = SlashInUnitCosts(slash_multiple);
  SimulatedSolver sim;
  std::vector<uint64_t> pool;
  std::vector<bool> bad(l.segments);
  std::vector<Hash256> leaves(l.segments + 1);
  auto honest_end = [](const Hash256& start_leaf, uint32_t segment) {
    return Hasher("meshlearn.econ.honest").Update(start_leaf).UpdateU64(segment).Finish();
  };
  for (uint64_t t = 0; t < tasks; ++t) {
    Reputation rep = start;
    bool caught = false;
    double gain = 0;
    const TaskId task = Hasher("meshlearn.econ.task").UpdateU64(seed).UpdateU64(t).Finish();
    Rng cheat_rng(FirstU64(Hasher("meshlearn.econ.cheat").UpdateU64(seed).UpdateU64(t).Finish()));
    for (uint32_t u = 0; u < shape.units_per_solver; ++u) {
      const UnitId unit{task, u, 0};
      const Hash256 beacon =
          Hasher("meshlearn.econ.beacon").UpdateU64(seed).UpdateU64(t).UpdateU64(u).Finish();
      // Which segments carry a faked step.
      std::fill(bad.begin(), bad.end(), false);
      const bool cheating = faked > 0 && !caught;
      if (cheating) {
        const bool by_segment = cheat.spread == CheatSpread::kCheatSpreadSegments;
        const uint64_t items = by_segment ? l.segments : l.steps;
        const uint64_t draws =
            by_segment ? std::min<uint64_t>(l.segments, (faked + l.interval - 1) / l.interval)
                       : faked;
        pool.resize(items);
        for (uint64_t i = 0; i < items; ++i) pool[i] = i;
        for (uint64_t i = 0; i < draws; ++i) {  // partial Fisher-Yates
          std::swap(pool[i], pool[i + cheat_rng.Uniform(items - i)]);
          bad[by_segment ? pool[i] : pool[i] / l.interval] = true;
        }
        ++sim.cheated;
        gain += saved;
      }
      ++sim.units;
      sim.solver_steps += l.steps;
      rep.completed += 1;
      const uint32_t p = VerificationProbabilityPermille(rep, params);
      if (!SelectedForVerification(beacon, unit, p)) continue;
      ++sim.units_checked;
      if (cheating) ++sim.cheated_checked;
      // The committed leaves: an honest segment ends at honest_end(start), a faked one elsewhere.
      // Only the leaves up to the last replayed segment's end are needed.
      const std::vector<uint32_t> replayed = SegmentsToReplay(beacon, unit, l.segments, params);
      leaves[0] = Hasher("meshlearn.econ.start").Update(beacon).Finish();
      const uint32_t needed = replayed.empty() ? 0 : replayed.back() + 1;
      for (uint32_t j = 0; j < needed; ++j) {
        leaves[j + 1] = bad[j] ? Hasher("meshlearn.econ.faked").Update(leaves[j]).Finish()
                               : honest_end(leaves[j], j);
      }
      bool flagged = false;
      for (uint32_t j : replayed) {
        const uint64_t first = uint64_t{j} * l.interval;
        sim.replayed_steps +=
            shape.verifiers_per_unit * (std::min(first + l.interval, l.steps) - first);
        if (honest_end(leaves[j], j) != leaves[j + 1]) flagged = true;
      }
      if (flagged) {
        ++sim.units_flagged;
        if (cheating) ++sim.cheated_caught;
        caught = true;
        gain -= 1 + slash;
        rep.slashes += 1;
        rep.clean_streak = 0;
      } else {
        rep.verified_clean += 1;
        rep.clean_streak += 1;
      }
    }
    ++sim.tasks;
    if (!caught) ++sim.tasks_escaped;
    sim.gain_sum += gain;
    sim.gain_sq_sum += gain * gain;
  }
  return sim;
}

}  // namespace meshlearn::protocol
