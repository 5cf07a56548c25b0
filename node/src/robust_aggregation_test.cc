// The robust aggregation rules against a garbage-sending solver, end to end on Fashion-MNIST.
// Slow (five trainings to the accuracy target): labelled "slow", release runs only.
#include <gtest/gtest.h>

#include <cstdio>

#include "meshlearn/node/local_diloco.h"
#include "testing/diloco_task.h"

namespace meshlearn::node {
namespace {

// Issue: with one of 8 solvers sending garbage, the robust rules still reach the MLP target
// (>= 0.88 test accuracy) and the plain mean visibly does not.
class RobustAggregation : public ::testing::TestWithParam<std::string> {};

// 20 rounds x 8 units x 100 inner steps x batch 64 (about 17 epochs of compute, 2,000 sequential
// steps). Measured with one huge-garbage sender: median 0.882 and multi-Krum 0.880 after 16
// rounds, so 20 leaves a margin; the mean falls to ~0.15.
constexpr int kTargetRounds = 20, kTargetUnits = 8, kTargetInner = 100;

TEST_P(RobustAggregation, OneGarbageSenderOfEight) {
  const std::string rule = GetParam();
  std::string text = MlpTask(kTargetRounds, kTargetUnits, kTargetInner, rule);
  // Multi-Krum: average the 5 best-scored deltas (classic Krum keeps one, a single solver's
  // progress per round).
  if (rule == "krum") text += "krum_select = 5\n";
  DilocoSetup s = Make(text);
  LocalDilocoOptions opt;
  opt.garbage_units = 1;
  opt.garbage = GarbageKind::kGarbageHuge;
  opt.eval_every_round = false;
  LocalDilocoResult r = *RunLocalDiloco(s.trainer.get(), s.net, opt);
  double acc = r.rounds.back().eval.accuracy;
  std::printf("rule %s: test accuracy %.4f after %d rounds with 1/%d garbage senders\n",
              rule.c_str(), acc, kTargetRounds, kTargetUnits);
  if (rule == "mean") {
    EXPECT_LT(acc, 0.5) << "the plain mean should be wrecked by a garbage sender";
  } else {
    EXPECT_GE(acc, 0.88) << rule;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, RobustAggregation,
                         ::testing::Values("mean", "trimmed_mean", "median", "centered_clip",
                                           "krum"));

}  // namespace
}  // namespace meshlearn::node
