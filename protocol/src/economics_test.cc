#include "meshlearn/protocol/economics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>

namespace meshlearn::protocol {
namespace {

// Statistical bounds. A simulated rate of N independent trials with probability x has standard
// error sqrt(x (1 - x) / N); every Monte-Carlo assertion below allows 4 standard errors, which a
// correct formula exceeds with probability about 6e-5 (normal approximation). The seeds are fixed,
// so the test is deterministic; the bound is what makes its pass say the formula is right.
constexpr double kSigmas = 4;
constexpr uint64_t kTasks = 10'000;  // per pattern: 120,000 units of a 12-unit solver

double StdErr(double x, double n) { return std::sqrt(x * (1 - x) / n); }

const CheatPattern kLazy{.faked_fraction = 1.0};
const CheatPattern kSpread10{.faked_fraction = 0.1, .spread = CheatSpread::kCheatSpreadSteps};
const CheatPattern kSegment10{.faked_fraction = 0.1, .spread = CheatSpread::kCheatSpreadSegments};

std::string Name(const CheatPattern& c) {
  if (c.faked_fraction >= 1) return "lazy";
  return std::to_string(c.faked_fraction) +
         (c.spread == CheatSpread::kCheatSpreadSteps ? " spread" : " in segments");
}

TEST(EconomicsTest, DetectionEqualsAnExhaustiveCount) {
  // H = 7, k = 3: segments of 3, 3 and 1 steps. Count, over every set of n faked steps (or
  // segments) and every r replayed segments, the cases where a replayed segment holds a fake.
  const TaskShape shape{.units_per_solver = 1, .inner_steps = 7, .checkpoint_interval = 3};
  auto segment_of = [](int step) { return step / 3; };
  for (uint32_t r = 1; r <= 3; ++r) {
    VerificationParams params;
    params.segments_per_check = r;
    for (uint64_t n = 1; n <= 7; ++n) {
      const CheatPattern spread{.faked_fraction = n / 7.0};
      ASSERT_EQ(FakedSteps(spread, 7), n);
      int cases = 0, caught = 0, seg_cases = 0, seg_caught = 0;
      const int bad_segments = static_cast<int>(std::min<uint64_t>(3, (n + 2) / 3));
      for (int replay = 0; replay < 8; ++replay) {
        if (std::popcount(static_cast<unsigned>(replay)) != static_cast<int>(r)) continue;
        for (int fakes = 0; fakes < 128; ++fakes) {
          if (std::popcount(static_cast<unsigned>(fakes)) != static_cast<int>(n)) continue;
          bool hit = false;
          for (int s = 0; s < 7; ++s) hit |= (fakes >> s & 1) && (replay >> segment_of(s) & 1);
          ++cases;
          caught += hit;
        }
        for (int bad = 0; bad < 8; ++bad) {
          if (std::popcount(static_cast<unsigned>(bad)) != bad_segments) continue;
          ++seg_cases;
          seg_caught += (bad & replay) != 0;
        }
      }
      EXPECT_NEAR(DetectionIfChecked(params, shape, spread), double(caught) / cases, 1e-12)
          << "r=" << r << " n=" << n;
      const CheatPattern packed{.faked_fraction = n / 7.0,
                                .spread = CheatSpread::kCheatSpreadSegments};
      EXPECT_NEAR(DetectionIfChecked(params, shape, packed), double(seg_caught) / seg_cases, 1e-12)
          << "r=" << r << " n=" << n;
    }
  }
  EXPECT_EQ(DetectionIfChecked(VerificationParams{}, shape, CheatPattern{}), 0.0);
}

TEST(EconomicsTest, FormulasAtTheDefaultShape) {
  const VerificationParams params;
  const TaskShape shape;  // examples/fashion-mlp.toml, 4 solvers: U = 12, H = 100, k = 10
  const double p = params.floor_permille / 1000.0;
  EXPECT_EQ(SteadyStatePermille(params), params.floor_permille);
  EXPECT_DOUBLE_EQ(VerifierOverhead(SteadyStatePermille(params), params, shape), p * 1 / 10);
  EXPECT_DOUBLE_EQ(DetectionIfChecked(params, shape, kLazy), 1.0);
  EXPECT_DOUBLE_EQ(DetectionIfChecked(params, shape, kSegment10), 0.1);
  double none = 1;  // C(90, 10) / C(100, 10)
  for (int i = 0; i < 10; ++i) none *= (90.0 - i) / (100.0 - i);
  EXPECT_NEAR(DetectionIfChecked(params, shape, kSpread10), 1 - none, 1e-12);

  for (const CheatPattern& c : {kLazy, kSpread10, kSegment10}) {
    EconomicsReport r = AnalyzeEconomics(params, kDefaultSlashMultiple, shape, c);
    const double d = p * r.detect_if_checked;
    EXPECT_DOUBLE_EQ(r.detect_per_unit, d) << Name(c);
    EXPECT_NEAR(r.escape_task, std::pow(1 - d, 12), 1e-12) << Name(c);
    // At the floor p is constant, so the exact recursion agrees with the closed forms.
    SolverOutlook o =
        AnalyzeSolver(params, kDefaultSlashMultiple, shape, c, SteadyStateReputation());
    EXPECT_NEAR(o.escape, r.escape_task, 1e-12) << Name(c);
    EXPECT_NEAR(o.expected_cheated, (1 - std::pow(1 - d, 12)) / d, 1e-9) << Name(c);
    EXPECT_NEAR(r.gain_task, r.gain_per_unit * o.expected_cheated, 1e-9) << Name(c);
    EXPECT_NEAR(r.gain_per_unit, r.saved_share - d * (1 + kDefaultSlashMultiple), 1e-12);
  }
  // A new node is checked always for its first trusted_after units.
  TaskShape first{.units_per_solver = static_cast<uint32_t>(params.trusted_after)};
  EXPECT_DOUBLE_EQ(NewNodeOverhead(params, first), 0.1);
}

TEST(EconomicsTest, MinDeterringSlashMultiple) {
  EXPECT_EQ(MinDeterringSlashMultiple(0.1, 0.05), 2u);  // M = 1 breaks even: not a deterrent
  EXPECT_EQ(MinDeterringSlashMultiple(1.0, 0.5), 2u);
  EXPECT_EQ(MinDeterringSlashMultiple(0.1, 0.335), 0u);
  EXPECT_EQ(MinDeterringSlashMultiple(0.0, 0.1), 0u);
  EXPECT_EQ(MinDeterringSlashMultiple(0.1, 0.0), UINT32_MAX);
}

// The targets of issue 6 at the default parameters, for the task shape of
// examples/fashion-mlp.toml: verifiers spend under 10% of the solvers' compute, a solver faking
// 10% of its steps gets through a task with probability under 1%, and no cheating pattern pays.
TEST(EconomicsTest, DefaultsMeetTheTargets) {
  const VerificationParams params;
  ASSERT_TRUE(ValidateVerificationParams(params).ok());
  const TaskShape shape;
  EconomicsReport r = AnalyzeEconomics(params, kDefaultSlashMultiple, shape, kSpread10);
  EXPECT_LT(r.overhead + r.forced_error_rerun, 0.10);
  EXPECT_LT(r.new_node_overhead, 0.10);
  EXPECT_LT(r.escape_task, 0.01);
  // p (1 + M) > 1: every pattern loses money, however it spreads its fakes.
  EXPECT_GT(r.check_permille / 1000.0 * (1 + kDefaultSlashMultiple), 1.0);
  for (const CheatPattern& c :
       {kLazy, kSpread10, kSegment10, CheatPattern{.faked_fraction = 0.01},
        CheatPattern{.faked_fraction = 0.01, .spread = CheatSpread::kCheatSpreadSegments}}) {
    EconomicsReport e = AnalyzeEconomics(params, kDefaultSlashMultiple, shape, c);
    EXPECT_LT(e.gain_per_unit, 0) << Name(c);
    EXPECT_LT(e.gain_task, 0) << Name(c);
    EXPECT_LE(e.min_slash_multiple, kDefaultSlashMultiple) << Name(c);
  }
}

TEST(EconomicsTest, ARubberStampVerifierLosesMoneyAtTheDefaults) {
  VerificationParams params;
  const TaskShape shape;
  // r/S = 1/10 of a unit saved per check; caught by a forced error with probability f.
  EXPECT_LT(RubberStampGainPerCheck(params, kDefaultSlashMultiple, shape), 0);
  params.forced_error_per_million = 5000;  // 0.5%: approving blind would pay
  EXPECT_NEAR(RubberStampGainPerCheck(params, kDefaultSlashMultiple, shape),
              0.1 - 0.005 * 10.1, 1e-12);
  EXPECT_GT(RubberStampGainPerCheck(params, kDefaultSlashMultiple, shape), 0);
}

// A cheater that built a long clean record first (the lowest check probability, the floor),
// simulated with the real draws over kTasks tasks per pattern.
TEST(EconomicsSimulationTest, CheaterIsCaughtAsOftenAsComputed) {
  const VerificationParams params;
  const TaskShape shape;
  uint64_t seed = 1;
  for (const CheatPattern& c : {kLazy, kSpread10, kSegment10}) {
    SCOPED_TRACE(Name(c));
    const EconomicsReport r = AnalyzeEconomics(params, kDefaultSlashMultiple, shape, c);
    const SimulatedSolver s = SimulateSolver(params, kDefaultSlashMultiple, shape, c,
                                             SteadyStateReputation(), kTasks, seed++);
    ASSERT_EQ(s.tasks, kTasks);
    ASSERT_GT(s.cheated_checked, 1000u);
    // (a) Detection: of a checked cheating unit, of any cheating unit, of a whole task.
    const double q = double(s.cheated_caught) / s.cheated_checked;
    EXPECT_NEAR(q, r.detect_if_checked,
                kSigmas * StdErr(r.detect_if_checked, s.cheated_checked) + 1e-12);
    const double d = double(s.cheated_caught) / s.cheated;
    EXPECT_NEAR(d, r.detect_per_unit, kSigmas * StdErr(r.detect_per_unit, s.cheated));
    const double escape = double(s.tasks_escaped) / s.tasks;
    EXPECT_NEAR(escape, r.escape_task, kSigmas * StdErr(r.escape_task, s.tasks));
    // (b) Expected value: negative as computed, and the simulated mean agrees. The task gains are
    // independent, so the standard error of their mean is their sample deviation / sqrt(N).
    const double mean = s.gain_sum / s.tasks;
    const double sd = std::sqrt(std::max(0.0, s.gain_sq_sum / s.tasks - mean * mean));
    const double se = sd / std::sqrt(double(s.tasks));
    EXPECT_LT(r.gain_task, 0);
    EXPECT_NEAR(mean, r.gain_task, kSigmas * se);
    EXPECT_LT(mean + kSigmas * se, 0) << "cheating pays in the simulation";
    // Replayed compute: all units of the task are counted, those after a catch too.
    EXPECT_GT(s.replayed_steps, 0u);
  }
}

// (c) An honest solver is never flagged: new (checked always, then 1/streak down to the floor)
// and long-lived. Its checks and replayed compute match the computed overhead.
TEST(EconomicsSimulationTest, HonestSolverIsNeverFlaggedAndCostsWhatWasComputed) {
  const VerificationParams params;
  const TaskShape shape;
  const uint64_t tasks = 5'000;
  {
    const SimulatedSolver s = SimulateSolver(params, kDefaultSlashMultiple, shape, CheatPattern{},
                                             Reputation{}, tasks, 7);
    EXPECT_EQ(s.units_flagged, 0u);
    EXPECT_EQ(s.cheated, 0u);
    EXPECT_EQ(s.tasks_escaped, tasks);
    const SolverOutlook o =
        AnalyzeSolver(params, kDefaultSlashMultiple, shape, CheatPattern{}, Reputation{});
    EXPECT_NEAR(o.escape, 1.0, 1e-12);
    EXPECT_EQ(o.gain, 0.0);
    // Checks per task: U units, each checked or not, so the per-task count has a variance of at
    // most U^2 / 4 (whatever the dependence between units); the bound on its mean's error
    // follows.
    const double mean_checks = double(s.units_checked) / tasks;
    const double se = shape.units_per_solver / 2.0 / std::sqrt(double(tasks));
    EXPECT_NEAR(mean_checks, o.expected_checks, kSigmas * se);
    // With one segment of equal length replayed per check, replayed / solver steps is the
    // overhead exactly per check, so it carries the same relative error.
    const double overhead = double(s.replayed_steps) / s.solver_steps;
    EXPECT_NEAR(overhead, NewNodeOverhead(params, shape),
                kSigmas * se / shape.units_per_solver * VerifierOverhead(1000, params, shape));
  }
  {
    const SimulatedSolver s = SimulateSolver(params, kDefaultSlashMultiple, shape, CheatPattern{},
                                             SteadyStateReputation(), tasks, 8);
    EXPECT_EQ(s.units_flagged, 0u);
    const double p = SteadyStatePermille(params) / 1000.0;
    EXPECT_NEAR(double(s.units_checked) / s.units, p, kSigmas * StdErr(p, s.units));
    const double overhead = double(s.replayed_steps) / s.solver_steps;
    EXPECT_NEAR(overhead, VerifierOverhead(SteadyStatePermille(params), params, shape),
                kSigmas * StdErr(p, s.units) * VerifierOverhead(1000, params, shape));
  }
}

TEST(EconomicsSimulationTest, SameSeedSameRun) {
  const VerificationParams params;
  const TaskShape shape;
  const SimulatedSolver a =
      SimulateSolver(params, 3, shape, kSpread10, SteadyStateReputation(), 500, 42);
  const SimulatedSolver b =
      SimulateSolver(params, 3, shape, kSpread10, SteadyStateReputation(), 500, 42);
  EXPECT_EQ(a.cheated_caught, b.cheated_caught);
  EXPECT_EQ(a.units_checked, b.units_checked);
  EXPECT_EQ(a.gain_sum, b.gain_sum);
  const SimulatedSolver c =
      SimulateSolver(params, 3, shape, kSpread10, SteadyStateReputation(), 500, 43);
  EXPECT_NE(a.units_checked, c.units_checked);
}

}  // namespace
}  // namespace meshlearn::protocol
