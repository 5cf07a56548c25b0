#include "meshlearn/node/local_diloco.h"

#include "testing/diloco_task.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

namespace meshlearn::node {
namespace {

TEST(GarbageKinds, ParseAndApply) {
  EXPECT_EQ(*ParseGarbageKind("huge"), GarbageKind::kGarbageHuge);
  EXPECT_FALSE(ParseGarbageKind("loud").ok());
  std::vector<float> d = {1, -2, 3, 4, 5, 6, 7, 8};
  std::vector<float> flip = d;
  MakeGarbage(GarbageKind::kGarbageSignFlip, 1, flip);
  EXPECT_EQ(flip[1], 20.0f);
  std::vector<float> nan = d;
  MakeGarbage(GarbageKind::kGarbageNaN, 1, nan);
  EXPECT_TRUE(std::isnan(nan[0]) && std::isnan(nan[7]) && !std::isnan(nan[1]));
  std::vector<float> huge = d;
  MakeGarbage(GarbageKind::kGarbageHuge, 1, huge);
  for (float x : huge) EXPECT_EQ(std::fabs(x), 1e6f);
}

TEST(LocalDiloco, SameSeedSameFinalHashAndLossFalls) {
  std::string text = MlpTask(/*rounds=*/3, /*units=*/2, /*inner_steps=*/10, "mean");
  DilocoSetup a = Make(text);
  // The second trainer is built from the same task text, reading the data the first loaded (in
  // place: `a` outlives it). Decoding Fashion-MNIST twice was half the test's time; the runs'
  // determinism is what it checks.
  DilocoSetup b{.trainer = nullptr, .net = a.net};
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(text, "diloco.toml", ".");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<engine::Trainer>> tb = engine::Trainer::Create(
      *spec, std::shared_ptr<const engine::TaskData>(std::shared_ptr<void>(), &a.trainer->data()));
  ASSERT_TRUE(tb.ok()) << tb.status().ToString();
  b.trainer = std::move(*tb);
  LocalDilocoResult ra = *RunLocalDiloco(a.trainer.get(), a.net, {});
  // Of the second run only the final hash is read: it evaluates after its last round alone (an
  // evaluation reads the weights, so the hash must not differ for it either).
  LocalDilocoResult rb = *RunLocalDiloco(b.trainer.get(), b.net, {.eval_every_round = false});
  EXPECT_EQ(ra.final_hash, rb.final_hash);
  ASSERT_EQ(ra.rounds.size(), 3u);
  EXPECT_LT(ra.rounds.back().eval.loss, ra.rounds.front().eval.loss);
  EXPECT_GT(ra.rounds.back().eval.accuracy, 0.5);
}

TEST(LocalDiloco, NaNSenderIsRejectedNotAveraged) {
  DilocoSetup s = Make(MlpTask(1, 3, 5, "mean"));
  LocalDilocoOptions opt;
  opt.garbage_units = 1;
  opt.garbage = GarbageKind::kGarbageNaN;
  LocalDilocoResult r = *RunLocalDiloco(s.trainer.get(), s.net, opt);
  EXPECT_EQ(r.rounds[0].rejected_units, 1u);
  for (float w : r.final_weights) ASSERT_TRUE(std::isfinite(w));
}

}  // namespace
}  // namespace meshlearn::node
