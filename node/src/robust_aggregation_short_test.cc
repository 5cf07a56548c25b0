// The short, default version of robust_aggregation_test.cc (the full one trains to the accuracy
// target and is labelled "slow": MESHLEARN_SLOW_TESTS=1 scripts/test.sh runs it). Three rounds of
// 8 units on Fashion-MNIST with one garbage sender: every robust rule stays within a few points
// of honest training while the plain mean is wrecked at once.
#include <gtest/gtest.h>

#include <cstdio>

#include "meshlearn/node/local_diloco.h"
#include "testing/diloco_task.h"

namespace meshlearn::node {
namespace {

constexpr int kRounds = 3, kUnits = 8, kInner = 50;

double Accuracy(const std::string& rule, bool garbage) {
  std::string text = MlpTask(kRounds, kUnits, kInner, rule);
  if (rule == "krum") text += "krum_select = 5\n";
  DilocoSetup s = Make(text);
  LocalDilocoOptions opt;
  opt.eval_every_round = false;
  if (garbage) {
    opt.garbage_units = 1;
    opt.garbage = GarbageKind::kGarbageHuge;
  }
  Result<LocalDilocoResult> r = RunLocalDiloco(s.trainer.get(), s.net, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->rounds.back().eval.accuracy : 0.0;
}

TEST(RobustAggregationShort, RobustRulesTrackHonestTrainingTheMeanDoesNot) {
  const double honest = Accuracy("mean", false);
  std::printf("honest mean, no garbage: %.4f\n", honest);
  ASSERT_GT(honest, 0.7);
  const double wrecked = Accuracy("mean", true);
  std::printf("mean, 1/%d huge-garbage senders: %.4f\n", kUnits, wrecked);
  EXPECT_LT(wrecked, 0.5) << "the plain mean should be wrecked by a garbage sender";
  for (const char* rule : {"trimmed_mean", "median", "centered_clip", "krum"}) {
    const double acc = Accuracy(rule, true);
    std::printf("%s, 1/%d huge-garbage senders: %.4f\n", rule, kUnits, acc);
    EXPECT_GT(acc, honest - 0.02) << rule;
  }
}

}  // namespace
}  // namespace meshlearn::node
