#include "meshlearn/node/network_task.h"

#include "meshlearn/node/task_bundle.h"

#include <gtest/gtest.h>

namespace meshlearn::node {
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
  EXPECT_EQ(s->aggregation.rule, protocol::AggregationRule::kAggregationRuleMedian);
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

// Regression: `task fetch` of a GPT task whose vocabulary comes from the data failed with
// "model.vocab_size must be >= 2 (or come from the data), got 0": the bundle's [model] has
// vocab_size 0. The state's size decides it.
TEST(ModelSpecForState, FindsTheVocabularyOfAGptFromItsWeights) {
  engine::ModelSpec spec;
  spec.kind = "gpt";
  spec.gpt = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 37};
  Result<std::unique_ptr<engine::Model>> m = engine::Model::Create(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint64_t n = static_cast<uint64_t>((*m)->NumParameters());
  spec.gpt.vocab_size = 0;  // from the data
  Result<engine::ModelSpec> got = ModelSpecForState(spec, n);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->gpt.vocab_size, 37);
  EXPECT_FALSE(ModelSpecForState(spec, n + 1).ok());
  spec.gpt.vocab_size = 12;  // given: kept as it is
  EXPECT_EQ(ModelSpecForState(spec, n)->gpt.vocab_size, 12);
}

TEST(NetworkSpec, MissingTable) {
  Result<ConfigFile> cfg = ConfigFile::Parse("[task]\nname = \"x\"\n", "task.toml");
  Result<NetworkSpec> s = NetworkSpec::FromConfig(*cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("add a [network] table"), std::string::npos);
}

}  // namespace
}  // namespace meshlearn::node

namespace meshlearn::node {
namespace {

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

}  // namespace
}  // namespace meshlearn::node
