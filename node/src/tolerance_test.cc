#include "meshlearn/node/tolerance.h"

#include <gtest/gtest.h>

#include "testing/diloco_task.h"

namespace meshlearn::node {
namespace {

TEST(ToleranceTest, OurEngineProfilesToZeroDistanceAndTheFloors) {
  std::unique_ptr<engine::Trainer> trainer(SmallFashionTrainer("tolerance-test", 3, 32, 32));
  ASSERT_NE(trainer, nullptr);
  std::vector<float> global = trainer->FlatParams();
  UnitWork work{.stream = 5, .inner_steps = 6, .checkpoint_interval = 3};
  engine::KernelConfig scalar{.simd = engine::SimdPath::kScalar, .threads = 1};
  engine::KernelConfig best{.simd = *engine::ParseSimdPath("auto"), .threads = 2};
  const engine::KernelConfig before = engine::GetKernelConfig();
  Result<ToleranceProfile> p = ProfileTolerance(trainer.get(), global, work, 4, scalar, best);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // The determinism contract: another SIMD path and thread count give the same bits.
  EXPECT_EQ(p->measured.rel_l2, 0);
  EXPECT_EQ(p->measured.cosine, 1);
  EXPECT_EQ(p->params.max_rel_l2_ppm, 1u);
  EXPECT_EQ(p->params.max_cosine_gap_ppb, 1u);
  EXPECT_EQ(engine::GetKernelConfig().simd, before.simd);  // restored
  EXPECT_EQ(engine::GetKernelConfig().threads, before.threads);
  EXPECT_FALSE(ProfileTolerance(trainer.get(), global, work, 7, scalar, best).ok());
}

TEST(ToleranceTest, ThresholdsAreTheMeasuredDistanceTimesTheSafetyFactor) {
  protocol::StateDistance measured{.rel_l2 = 3e-6, .cosine = 1 - 2e-9};
  protocol::ToleranceParams t = ThresholdsFor(measured, {});
  EXPECT_EQ(t.max_rel_l2_ppm, 30u);
  // 1 - cosine is not exact in double near 1: 20 ppb, give or take the last bit's round-up.
  EXPECT_GE(t.max_cosine_gap_ppb, 20u);
  EXPECT_LE(t.max_cosine_gap_ppb, 21u);
  EXPECT_TRUE(protocol::WithinTolerance(measured, t));
  // Ten times further than anything honest hardware did: refused.
  EXPECT_FALSE(protocol::WithinTolerance({.rel_l2 = 3.1e-5, .cosine = 1}, t));
}

}  // namespace
}  // namespace meshlearn::node
