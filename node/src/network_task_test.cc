#include "meshlearn/node/network_task.h"

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
