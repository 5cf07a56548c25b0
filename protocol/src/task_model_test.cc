#include "meshlearn/protocol/task_model.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/hash.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::protocol {
namespace {

Result<NetworkSpec> Parse(const std::string& network_table) {
  Result<ConfigFile> cfg = ConfigFile::Parse("[network]\n" + network_table, "task.toml");
  if (!cfg.ok()) return cfg.status();
  return NetworkSpec::FromConfig(*cfg);
}

TEST(NetworkSpec, ParsesAndDefaults) {
  Result<NetworkSpec> s = Parse("rounds = 3\nunits_per_round = 4\ninner_steps = 50\n"
                                "checkpoint_interval = 10\naggregation = \"median\"\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rounds, 3u);
  EXPECT_EQ(s->units_per_round, 4u);
  EXPECT_EQ(s->inner_steps, 50u);
  EXPECT_EQ(s->checkpoint_interval, 10u);
  EXPECT_EQ(s->aggregation.rule, AggregationRule::kAggregationRuleMedian);
  EXPECT_FLOAT_EQ(s->outer.lr, 0.7f);
  EXPECT_FLOAT_EQ(s->outer.momentum, 0.9f);
  EXPECT_TRUE(s->outer.nesterov);
}

// Regression: a file without checkpoint_interval gave k = 0, which `task submit --dry-run`
// called valid and the ledger refused after the upload. Its documented default is inner_steps.
TEST(NetworkSpec, CheckpointIntervalDefaultsToInnerSteps) {
  Result<NetworkSpec> s = Parse("rounds = 3\nunits_per_round = 4\ninner_steps = 20\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->checkpoint_interval, 20u);
  Result<NetworkSpec> zero =
      Parse("rounds = 3\nunits_per_round = 4\ninner_steps = 20\ncheckpoint_interval = 0\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("network.checkpoint_interval must be >= 1, got 0"),
            std::string::npos)
      << zero.status().message();
}

TEST(NetworkSpec, BadValuesNameTheKey) {
  struct Case {
    const char* table;
    const char* expect;
  } cases[] = {
      {"rounds = 0\nunits_per_round = 1\ninner_steps = 1\n", "network.rounds must be >= 1, got 0"},
      {"rounds = 1\nunits_per_round = 1\n", "network.inner_steps is missing"},
      {"rounds = 1\nunits_per_round = 1\ninner_steps = 5\ncheckpoint_interval = 6\n",
       "network.checkpoint_interval must be <= 5, got 6"},
      {"rounds = 1\nunits_per_round = 1\ninner_steps = 5\naggregation = \"avg\"\n",
       "network.aggregation must be one of mean, trimmed_mean"},
      {"rounds = 1\nunits_per_round = 1\ninner_steps = 5\nouter_lr = -1\n",
       "network.outer_lr must be > 0, got -1"},
      {"rounds = 1\nunits_per_round = 1\ninner_steps = 5\nrouns = 2\n",
       "unknown key 'network.rouns' (did you mean 'rounds'?)"},
  };
  for (const Case& c : cases) {
    Result<NetworkSpec> s = Parse(c.table);
    ASSERT_FALSE(s.ok()) << c.table;
    EXPECT_NE(s.status().message().find(c.expect), std::string::npos)
        << s.status().message() << "\nexpected: " << c.expect;
    EXPECT_EQ(s.status().message().rfind("task.toml: ", 0), 0u) << s.status().message();
  }
}

TEST(NetworkSpec, MissingTable) {
  Result<ConfigFile> cfg = ConfigFile::Parse("[task]\nname = \"x\"\n", "task.toml");
  Result<NetworkSpec> s = NetworkSpec::FromConfig(*cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("add a [network] table"), std::string::npos);
}

TEST(NetworkSpec, EachMissingRequiredKeyIsNamed) {
  const char* required[] = {"rounds", "units_per_round", "inner_steps"};
  for (const char* key : required) {
    std::string table;
    for (const char* other : required) {
      if (std::string(other) != key) table += std::string(other) + " = 4\n";
    }
    Result<NetworkSpec> s = Parse(table);
    ASSERT_FALSE(s.ok()) << table;
    EXPECT_NE(s.status().message().find("network." + std::string(key) + " is missing"),
              std::string::npos)
        << s.status().message();
  }
}

TEST(NetworkSpec, AnUnknownKeyIsNamedEvenWithNoNearName) {
  Result<NetworkSpec> s =
      Parse("rounds = 1\nunits_per_round = 1\ninner_steps = 5\npipeline_stages = 2\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("network.pipeline_stages"), std::string::npos)
      << s.status().message();
}

// Issue 15: pipeline stages and an optional explicit cut. The checks against the model (the
// last bound, stages <= layers) are the engine's (engine::TaskPipelineCut, pipeline_test.cc).
TEST(NetworkSpec, PipelineStagesAndCut) {
  const std::string base = "rounds = 1\nunits_per_round = 2\ninner_steps = 5\n";
  Result<NetworkSpec> plain = Parse(base);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->stages, 1u);
  EXPECT_TRUE(plain->cut.empty());
  Result<NetworkSpec> s = Parse(base + "stages = 4\ncut = [0, 1, 3, 5, 6]\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->stages, 4u);
  EXPECT_EQ(s->cut, (std::vector<int64_t>{0, 1, 3, 5, 6}));
  struct Case {
    std::string table;
    const char* expect;
  } cases[] = {
      {base + "stages = 0\n", "network.stages must be >= 1, got 0"},
      {base + "stages = 3\ncut = [0, 2, 4]\n",
       "network.cut lists 3 bounds but network.stages = 3 needs 4"},
      {base + "stages = 2\ncut = [1, 2, 4]\n", "network.cut must start at 0"},
      {base + "stages = 3\ncut = [0, 2, 2, 6]\n",
       "network.cut bound 2 (2) must be greater than bound 1 (2)"},
      {base + "cut = [0, 3, 6]\n", "network.cut lists 3 bounds but network.stages = 1 needs 2"},
  };
  for (const Case& c : cases) {
    Result<NetworkSpec> bad = Parse(c.table);
    ASSERT_FALSE(bad.ok()) << c.table;
    EXPECT_NE(bad.status().message().find(c.expect), std::string::npos)
        << bad.status().message() << "\nexpected: " << c.expect;
  }
}

TEST(NetworkSpec, InnerLrDecaysLinearlyAcrossRounds) {
  NetworkSpec s;
  s.rounds = 5;
  s.inner_lr_final = 0.2;
  EXPECT_EQ(s.InnerLrScale(0), 1.0);
  EXPECT_DOUBLE_EQ(s.InnerLrScale(2), 0.6);
  EXPECT_DOUBLE_EQ(s.InnerLrScale(4), 0.2);
  s.rounds = 1;
  EXPECT_EQ(s.InnerLrScale(0), 1.0);
}

TEST(UnitWorkOf, IsTheUnitsStreamHKAndRoundRate) {
  Result<NetworkSpec> net = Parse("rounds = 3\nunits_per_round = 2\ninner_steps = 12\n"
                                  "checkpoint_interval = 5\ninner_lr_final = 0.5\n");
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const Hash256 content = Hasher("test.content").Finish();
  const UnitWork w = UnitWorkOf(*net, 42, content, 2, 1);
  EXPECT_EQ(w.stream, UnitSeed(42, UnitId{content, 2, 1}));
  EXPECT_EQ(w.inner_steps, 12);
  EXPECT_EQ(w.checkpoint_interval, 5);
  EXPECT_EQ(w.lr_scale, 0.5);
  const TaskFacts facts{.seed = 42, .content_id = content};
  const UnitWork same = UnitWorkOf(*net, facts, 2, 1);
  EXPECT_EQ(same.stream, w.stream);
  EXPECT_NE(UnitWorkOf(*net, facts, 2, 0).stream, w.stream);
  EXPECT_EQ(UnitWorkOf(*net, facts, 0, 1).lr_scale, 1.0);
}

TEST(HashedSteps, StartEveryKAndEnd) {
  EXPECT_EQ(HashedSteps(10, 4), (std::vector<int64_t>{0, 4, 8, 10}));
  EXPECT_EQ(HashedSteps(8, 4), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(HashedSteps(5, 0), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(HashedSteps(5, 5), HashedSteps(5, 0));
}

// The segment boundaries the ledger's dispute uses (SegmentStepsOf) are the ones the unit hashed
// (HashedSteps), and there are SegmentCount of them.
TEST(SegmentStepsOf, AreConsecutiveHashedSteps) {
  for (uint64_t h : {1u, 5u, 8u, 10u, 63u}) {
    for (uint64_t k = 0; k <= h; ++k) {
      const std::vector<int64_t> steps =
          HashedSteps(static_cast<int64_t>(h), static_cast<int64_t>(k));
      ASSERT_EQ(steps.size(), SegmentCount(h, k) + 1u) << "H=" << h << " k=" << k;
      for (uint32_t j = 0; j < SegmentCount(h, k); ++j) {
        const SegmentSteps seg = SegmentStepsOf(h, k, j);
        EXPECT_EQ(seg.first_step, static_cast<uint64_t>(steps[j])) << h << " " << k << " " << j;
        EXPECT_EQ(seg.last_step, static_cast<uint64_t>(steps[j + 1])) << h << " " << k << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace meshlearn::protocol
