// Stake, Unstake, Withdraw, and the slashing / jackpot primitives.
#include "execute.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::ChainFixture;
using testing::TestKey;

class StakingTest : public ChainFixture {
 protected:
  void SetUp() override {
    ChainFixture::SetUp();
    Receipt r = Run(Tx(alice_, RegisterNodeTx{.node_id = node_.public_key(),
                                               .endpoint = "http://n:1",
                                               .roles = kRoleSolver,
                                               .stake = 100,
                                               .secret_head = Blake2b("head")}));
    ASSERT_TRUE(r.ok) << r.reason;
  }
  KeyPair node_ = TestKey(60);
};

TEST_F(StakingTest, StakeAddsToNode) {
  ASSERT_TRUE(Run(Tx(alice_, StakeTx{.node_id = node_.public_key(), .amount = 50})).ok);
  EXPECT_EQ(chain_->GetNode(node_.public_key())->stake, 150u);
  EXPECT_EQ(Balance(alice_), kFunds - 150);
}

TEST_F(StakingTest, StakeFailures) {
  Receipt r = Run(Tx(alice_, StakeTx{.node_id = node_.public_key(), .amount = kFunds}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("insufficient funds"), std::string::npos);
  EXPECT_FALSE(Run(Tx(alice_, StakeTx{.node_id = node_.public_key(), .amount = 0})).ok);
  r = Run(Tx(bob_, StakeTx{.node_id = node_.public_key(), .amount = 5}));
  EXPECT_EQ(r.code, StatusCode::kPermissionDenied);
  r = Run(Tx(alice_, StakeTx{.node_id = TestKey(61).public_key(), .amount = 5}));
  EXPECT_EQ(r.code, StatusCode::kNotFound);
  EXPECT_EQ(chain_->GetNode(node_.public_key())->stake, 100u);
  EXPECT_EQ(Balance(alice_), kFunds - 100);
}

TEST_F(StakingTest, UnstakeWaitsForTheDelayThenWithdraws) {
  ASSERT_TRUE(Run(Tx(alice_, StakeTx{.node_id = node_.public_key(), .amount = 50})).ok);
  ASSERT_TRUE(Run(Tx(alice_, UnstakeTx{.node_id = node_.public_key(), .amount = 30})).ok);
  uint64_t release = chain_->Height() + genesis_.params.unbonding_delay_blocks;
  EXPECT_EQ(chain_->GetNode(node_.public_key())->stake, 120u);
  EXPECT_EQ(chain_->GetTotals().unbonding, 30u);
  Amount before = Balance(alice_);
  Receipt r = Run(Tx(alice_, WithdrawTx{}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("next release at height " + std::to_string(release)), std::string::npos)
      << r.reason;
  while (chain_->Height() + 1 < release) Produce({});
  r = Run(Tx(alice_, WithdrawTx{}));
  ASSERT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(alice_), before + 30);
  EXPECT_TRUE(chain_->GetAccount(alice_.public_key())->unbonding.empty());
  r = Run(Tx(alice_, WithdrawTx{}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("nothing is unbonding"), std::string::npos) << r.reason;
}

TEST_F(StakingTest, UnstakeFailures) {
  Receipt r = Run(Tx(alice_, UnstakeTx{.node_id = node_.public_key(), .amount = 1}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("LeaveNode"), std::string::npos) << r.reason;
  r = Run(Tx(alice_, UnstakeTx{.node_id = node_.public_key(), .amount = 101}));
  EXPECT_FALSE(r.ok);
  r = Run(Tx(bob_, UnstakeTx{.node_id = node_.public_key(), .amount = 1}));
  EXPECT_EQ(r.code, StatusCode::kPermissionDenied);
  EXPECT_EQ(chain_->GetNode(node_.public_key())->stake, 100u);
}

// The primitives on a bare state: the books stay balanced.
class StakingPrimitivesTest : public ::testing::Test {
 protected:
  StakingPrimitivesTest() {
    genesis_ = DevnetGenesis({owner_.public_key()}, 1000, "prim");
    state_ = LedgerState::FromGenesis(genesis_);
    NodeRecord n;
    n.id = node_.public_key();
    n.owner = owner_.public_key();
    n.roles = kRoleSolver;
    n.stake = 400;
    state_.nodes.Put(n.id, n);
    EXPECT_TRUE(Debit(state_, owner_.public_key(), 400, "stake").ok());
    EXPECT_TRUE(state_.ComputeTotals().Check().ok());
  }
  KeyPair owner_ = TestKey(70), node_ = TestKey(71);
  Genesis genesis_;
  LedgerState state_;
};

TEST_F(StakingPrimitivesTest, SlashSplitsBetweenJackpotAndTreasury) {
  Amount slashed = 0;
  ASSERT_TRUE(SlashNode(state_, genesis_.params, node_.public_key(), 101, &slashed).ok());
  EXPECT_EQ(slashed, 101u);
  const NodeRecord* n = state_.nodes.Find(node_.public_key());
  EXPECT_EQ(n->stake, 299u);
  EXPECT_EQ(n->status, NodeStatus::kJailed);
  EXPECT_EQ(n->reputation.slashes, 1u);
  EXPECT_EQ(state_.g().jackpot, 50u);  // 5000 bps of 101, rounded down
  EXPECT_EQ(state_.g().treasury, 51u);
  EXPECT_TRUE(state_.ComputeTotals().Check().ok());
  // More than the stake: takes what there is.
  ASSERT_TRUE(SlashNode(state_, genesis_.params, node_.public_key(), 10'000, &slashed).ok());
  EXPECT_EQ(slashed, 299u);
  EXPECT_EQ(state_.nodes.Find(node_.public_key())->stake, 0u);
  EXPECT_TRUE(state_.ComputeTotals().Check().ok());
  EXPECT_FALSE(SlashNode(state_, genesis_.params, owner_.public_key(), 1, &slashed).ok());
}

TEST_F(StakingPrimitivesTest, JackpotPaysOutWhatItHolds) {
  Amount slashed = 0;
  ASSERT_TRUE(SlashNode(state_, genesis_.params, node_.public_key(), 100, &slashed).ok());
  EXPECT_FALSE(PayFromJackpot(state_, owner_.public_key(), 51).ok());
  ASSERT_TRUE(PayFromJackpot(state_, owner_.public_key(), 50).ok());
  EXPECT_EQ(state_.g().jackpot, 0u);
  EXPECT_EQ(state_.accounts.Find(owner_.public_key())->balance, 650u);
  EXPECT_TRUE(state_.ComputeTotals().Check().ok());
}

TEST_F(StakingPrimitivesTest, RollbackRestoresEverything) {
  Hash256 before = state_.Hash();
  LedgerState::Mark m = state_.GetMark();
  Amount slashed = 0;
  ASSERT_TRUE(SlashNode(state_, genesis_.params, node_.public_key(), 100, &slashed).ok());
  ASSERT_TRUE(Credit(state_, TestKey(72).public_key(), 5).ok());
  EXPECT_NE(state_.Hash(), before);
  state_.RollbackTo(m);
  EXPECT_EQ(state_.Hash(), before);
}

}  // namespace
}  // namespace meshlearn::ledger
