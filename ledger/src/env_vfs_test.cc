// The ledger's database on a MemEnv (env_vfs.h): a power cut at any write loses no block the
// chain acknowledged, and what survives is a consistent chain (its stored state hashes to its
// last block's state hash, and replays from genesis).
#include "env_vfs.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "meshlearn/base/rng.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

class PowerCut : public ::testing::Test {
 protected:
  PowerCut() : alice_(TestKey(1)), carol_(TestKey(3)), sequencer_(TestKey(100)) {
    genesis_ = DevnetGenesis({alice_.public_key()}, 1'000'000, "power-cut");
    EXPECT_TRUE(env_.CreateDirs("/chain").ok());
  }

  Result<std::unique_ptr<Chain>> Open() { return Chain::Open(&env_, "/chain/ledger.db", genesis_); }

  // One block that moves one token from alice to carol: carol's balance counts the blocks.
  Status Produce(Chain* c) {
    Transaction tx = BuildSignedTx(alice_, genesis_.chain_id, c->NextNonce(alice_.public_key()),
                                   TransferTx{.to = carol_.public_key(), .amount = 1});
    time_ms_ += 1000;
    return c->ProduceBlock({tx}, time_ms_, sequencer_).status();
  }

  void ExpectConsistent(Chain* c, uint64_t acknowledged) {
    EXPECT_GE(c->Height(), acknowledged);
    Result<Account> carol = c->GetAccount(carol_.public_key());
    EXPECT_EQ(carol.ok() ? carol->balance : 0, c->Height());
    EXPECT_TRUE(c->CheckInvariants().ok());
    Status replay = c->ReplayFromGenesis();
    EXPECT_TRUE(replay.ok()) << replay.ToString();
  }

  MemEnv env_;
  Genesis genesis_;
  KeyPair alice_, carol_, sequencer_;
  int64_t time_ms_ = 0;
};

// Every commit is synced before ProduceBlock returns (synchronous=FULL): a power cut between
// blocks keeps every one of them.
TEST_F(PowerCut, BetweenBlocksKeepsEveryBlock) {
  {
    auto c = Open();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(Produce(c->get()).ok());
    env_.CutPower();  // before the process closes the database: its close writes nothing
  }
  env_.RestorePower();
  auto c = Open();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->Height(), 12u);
  ExpectConsistent(c->get(), 12);
}

// The cut lands at a seeded write inside some block's commit (the disk fails from there on, then
// the power goes): the reopened chain holds every block acknowledged before it.
TEST_F(PowerCut, AtAnyWriteLosesNoAcknowledgedBlock) {
  Rng rng(2026);
  int cuts_mid_commit = 0;
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    uint64_t acknowledged = 0;
    {
      auto c = Open();
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      acknowledged = (*c)->Height();
      const int before = static_cast<int>(rng.Uniform(4));
      for (int i = 0; i < before; ++i) {
        ASSERT_TRUE(Produce(c->get()).ok());
        acknowledged = (*c)->Height();
      }
      env_.FailWritesAfter(static_cast<int64_t>(rng.Uniform(40)));
      for (int i = 0; i < 50; ++i) {
        if (!Produce(c->get()).ok()) {
          ++cuts_mid_commit;
          break;
        }
        acknowledged = (*c)->Height();
      }
      env_.CutPower();  // the close below (a checkpoint) writes nothing: the process is dead
    }
    env_.RestorePower();
    env_.FailWritesAfter(-1);
    auto c = Open();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ExpectConsistent(c->get(), acknowledged);
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("power cuts: 60, inside a block's commit: %d\n", cuts_mid_commit);
  EXPECT_GT(cuts_mid_commit, 30);  // the cut points do land inside commits, not only between
}

}  // namespace
}  // namespace meshlearn::ledger
