#include "meshlearn/protocol/decompose.h"

#include <gtest/gtest.h>

#include <set>

namespace meshlearn::protocol {
namespace {

TaskSpecView SmallTask() {
  TaskSpecView t;
  t.id = Blake2b("task-1");
  t.rounds = 3;
  t.units_per_round = 4;
  t.inner_steps = 5;
  t.batch_size = 8;
  t.flops_per_sample = 1000;
  t.seed = 42;
  t.num_examples = 103;  // not a multiple of 4: shard sizes 26, 26, 26, 25
  return t;
}

TEST(DecomposeTest, ValidateNamesTheField) {
  TaskSpecView t = SmallTask();
  EXPECT_TRUE(ValidateDecomposition(t).ok());
  t.inner_steps = 0;
  Status s = ValidateDecomposition(t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inner_steps"), std::string::npos) << s.message();
  t = SmallTask();
  t.num_examples = 3;
  s = ValidateDecomposition(t);
  EXPECT_NE(s.message().find("units_per_round"), std::string::npos) << s.message();
}

TEST(DecomposeTest, ValidateTaskSpec) {
  TaskSpecView t = SmallTask();
  t.model_bytes = 4000;
  t.price_cap_per_gflop = 3;
  EXPECT_TRUE(ValidateTaskSpec(t).ok());
  TaskSpecView bad = t;
  bad.model_bytes = 4001;
  EXPECT_NE(ValidateTaskSpec(bad).message().find("model_bytes"), std::string::npos);
  bad = t;
  bad.flops_per_sample = 0;
  EXPECT_NE(ValidateTaskSpec(bad).message().find("flops_per_sample"), std::string::npos);
  bad = t;
  bad.price_cap_per_gflop = 0;
  EXPECT_NE(ValidateTaskSpec(bad).message().find("price_cap_per_gflop"), std::string::npos);
  bad = t;
  bad.rounds = 0;
  EXPECT_NE(ValidateTaskSpec(bad).message().find("rounds"), std::string::npos);
}

TEST(DecomposeTest, RoundUnitsAreCanonical) {
  const TaskSpecView t = SmallTask();
  std::vector<UnitId> units = RoundUnits(t, 2);
  ASSERT_EQ(units.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(units[i].task, t.id);
    EXPECT_EQ(units[i].round, 2u);
    EXPECT_EQ(units[i].shard, i);
    if (i > 0) {
      EXPECT_LT(units[i - 1], units[i]);
    }
  }
  EXPECT_EQ(units, RoundUnits(t, 2));
}

TEST(DecomposeTest, UnitKeysAndSeedsAreDistinctAndStable) {
  const TaskSpecView t = SmallTask();
  std::set<Hash256> keys;
  std::set<uint64_t> seeds;
  for (uint32_t r = 0; r < t.rounds; ++r) {
    for (const UnitId& u : RoundUnits(t, r)) {
      keys.insert(UnitKey(u));
      seeds.insert(UnitSeed(t.seed, u));
      EXPECT_EQ(UnitSeed(t.seed, u), UnitSeed(t.seed, u));
      EXPECT_NE(BatchSeed(t.seed, u, 0), BatchSeed(t.seed, u, 1));
      EXPECT_NE(UnitSeed(t.seed, u), UnitSeed(t.seed + 1, u));
    }
  }
  EXPECT_EQ(keys.size(), 12u);
  EXPECT_EQ(seeds.size(), 12u);
}

TEST(DecomposeTest, ShardsPartitionTheDataset) {
  const TaskSpecView t = SmallTask();
  uint64_t next = 0;
  for (const UnitId& u : RoundUnits(t, 0)) {
    ShardRange r = ShardOf(t, u);
    EXPECT_EQ(r.begin, next);
    EXPECT_TRUE(r.size() == 25 || r.size() == 26) << r.size();
    next = r.end;
  }
  EXPECT_EQ(next, t.num_examples);
  // The same shard in every round.
  EXPECT_EQ(ShardOf(t, {t.id, 0, 3}).begin, ShardOf(t, {t.id, 2, 3}).begin);
}

TEST(DecomposeTest, BatchesArePureFunctionsOfSeedUnitStep) {
  const TaskSpecView t = SmallTask();
  const UnitId u{t.id, 1, 2};
  const ShardRange range = ShardOf(t, u);
  std::vector<uint64_t> b0 = BatchIndices(t, u, 0);
  ASSERT_EQ(b0.size(), t.batch_size);
  for (uint64_t i : b0) {
    EXPECT_GE(i, range.begin);
    EXPECT_LT(i, range.end);
  }
  EXPECT_EQ(b0, BatchIndices(t, u, 0));
  EXPECT_NE(b0, BatchIndices(t, u, 1));
  EXPECT_NE(b0, BatchIndices(t, {t.id, 2, 2}, 0));  // same shard, other round
  TaskSpecView other = t;
  other.seed = 43;
  EXPECT_NE(b0, BatchIndices(other, u, 0));
}

// Pins the derivation: a verifier built from another version of the code must replay exactly the
// samples the solver used. If this changes, every committed unit becomes unverifiable.
TEST(DecomposeTest, GoldenBatch) {
  const TaskSpecView t = SmallTask();
  const UnitId u{t.id, 0, 0};
  std::vector<uint64_t> b = BatchIndices(t, u, 0);
  std::string got;
  for (uint64_t i : b) got += std::to_string(i) + ",";
  EXPECT_EQ(got, "14,25,8,14,21,15,18,12,") << "UnitSeed " << UnitSeed(t.seed, u);
}

TEST(DecomposeTest, UnitSamplesAndFlops) {
  TaskSpecView t = SmallTask();
  EXPECT_EQ(UnitSamples(t), 40u);
  EXPECT_EQ(UnitFlops(t), 40000u);
  t.flops_per_sample = UINT64_MAX / 2;
  EXPECT_EQ(UnitFlops(t), UINT64_MAX);  // saturates
}

}  // namespace
}  // namespace meshlearn::protocol
