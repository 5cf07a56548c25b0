#include "meshlearn/ledger/genesis.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

TEST(GenesisTest, WriteThenLoadGivesTheSameGenesis) {
  MemEnv env;
  Genesis g = DevnetGenesis({TestKey(1).public_key(), TestKey(2).public_key()}, 500, "dev-1");
  g.sequencer = TestKey(3).public_key();
  g.params.treasury_cut_bps = 123;
  ASSERT_TRUE(WriteGenesis(&env, "/g.toml", g).ok());
  auto back = LoadGenesis(&env, "/g.toml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  EXPECT_EQ(GenesisHash(*back), GenesisHash(g));
  EXPECT_EQ(GenesisToJson(g)["genesis_hash"], GenesisHash(g).ToHex());
}

TEST(GenesisTest, MinimalFileUsesDefaults) {
  auto g = ParseGenesis("chain_id = \"x\"\n");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->block_interval_ms, 1000);
  EXPECT_FALSE(g->faucet);
  EXPECT_EQ(g->params, ChainParams{});
  EXPECT_TRUE(g->accounts.empty());
}

TEST(GenesisTest, ErrorsNameTheProblem) {
  auto expect_error = [](const std::string& text, const std::string& part) {
    auto g = ParseGenesis(text, "genesis.toml");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(part), std::string::npos) << g.status().ToString();
  };
  std::string key = TestKey(1).public_key().ToHex();
  expect_error("chain_idd = \"x\"\n", "chain_idd");
  expect_error("chain_id = \"bad id\"\n", "chain_id");
  expect_error("chain_id = \"x\"\nblock_interval_ms = 0\n", "block_interval_ms");
  expect_error("chain_id = \"x\"\n[params]\ntreasury_cut_bps = 10001\n", "treasury_cut_bps");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"zz\"\nbalance = 1\n", "key");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"" + key + "\"\nbalance = -1\n", "balance");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"" + key + "\"\nbalance = 1\n[[accounts]]\nkey = \"" +
                   key + "\"\nbalance = 2\n",
               "twice");
}

TEST(GenesisTest, TotalBalanceMustFit) {
  Genesis g = DevnetGenesis({TestKey(1).public_key(), TestKey(2).public_key()}, UINT64_MAX / 2 + 1);
  EXPECT_FALSE(ValidateGenesis(g).ok());
}

TEST(GenesisTest, HashDependsOnEverything) {
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 5);
  Hash256 h = GenesisHash(g);
  Genesis g2 = g;
  g2.params.unbonding_delay_blocks++;
  EXPECT_NE(GenesisHash(g2), h);
  g2 = g;
  g2.faucet = false;
  EXPECT_NE(GenesisHash(g2), h);
  g2 = g;
  g2.chain_id = "other";
  EXPECT_NE(GenesisHash(g2), h);
}

}  // namespace
}  // namespace meshlearn::ledger
