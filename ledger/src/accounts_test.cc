// Transfer and Faucet: success and failure paths.
#include "execute.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::ChainFixture;
using testing::TestKey;

class AccountsTest : public ChainFixture {};

TEST_F(AccountsTest, TransferMovesTokens) {
  Receipt r = Run(Tx(alice_, TransferTx{.to = bob_.public_key(), .amount = 250, .memo = "hi"}));
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(alice_), kFunds - 250);
  EXPECT_EQ(Balance(bob_), kFunds + 250);
  EXPECT_EQ(chain_->NextNonce(alice_.public_key()), 1u);
}

TEST_F(AccountsTest, TransferCreatesRecipient) {
  Receipt r = Run(Tx(alice_, TransferTx{.to = carol_.public_key(), .amount = 7}));
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(carol_), 7u);
  EXPECT_EQ(chain_->GetAccount(carol_.public_key())->nonce, 0u);
}

TEST_F(AccountsTest, InsufficientFundsFailsAndOnlyBumpsNonce) {
  Account before = *chain_->GetAccount(alice_.public_key());
  Totals totals = chain_->GetTotals();
  Receipt r = Run(Tx(alice_, TransferTx{.to = bob_.public_key(), .amount = kFunds + 1}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r.reason.find("insufficient funds"), std::string::npos) << r.reason;
  Account after = *chain_->GetAccount(alice_.public_key());
  EXPECT_EQ(after.nonce, before.nonce + 1);
  after.nonce = before.nonce;
  EXPECT_EQ(after, before);
  EXPECT_EQ(Balance(bob_), kFunds);
  EXPECT_EQ(chain_->GetTotals(), totals);
}

TEST_F(AccountsTest, ZeroAmountAndZeroRecipientFail) {
  Receipt r = Run(Tx(alice_, TransferTx{.to = bob_.public_key(), .amount = 0}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("amount must be > 0"), std::string::npos) << r.reason;
  r = Run(Tx(alice_, TransferTx{.to = PublicKey{}, .amount = 1}));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(Balance(alice_), kFunds);
}

TEST_F(AccountsTest, FeeGoesToTreasuryOnlyOnSuccess) {
  Receipt r = Run(Tx(alice_, TransferTx{.to = bob_.public_key(), .amount = 10}, /*fee=*/3));
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(alice_), kFunds - 13);
  EXPECT_EQ(chain_->GetTotals().treasury, 3u);
  r = Run(Tx(alice_, TransferTx{.to = bob_.public_key(), .amount = kFunds}, /*fee=*/3));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(Balance(alice_), kFunds - 13);
  EXPECT_EQ(chain_->GetTotals().treasury, 3u);
}

TEST_F(AccountsTest, FaucetMintsOnDevnet) {
  Totals t0 = chain_->GetTotals();
  Receipt r = Run(Tx(alice_, FaucetTx{.recipient = carol_.public_key(), .amount = 500}));
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(carol_), 500u);
  EXPECT_EQ(chain_->GetTotals().minted, t0.minted + 500);
}

TEST_F(AccountsTest, FaucetFromNewKeyCreatesItsAccount) {
  KeyPair dave = TestKey(4);
  Transaction tx = Tx(dave, FaucetTx{.recipient = dave.public_key(), .amount = 500});
  EXPECT_TRUE(chain_->CheckTx(tx).ok());
  Receipt r = Run(tx);
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(Balance(dave), 500u);
  EXPECT_EQ(chain_->NextNonce(dave.public_key()), 1u);
}

TEST_F(AccountsTest, FaucetOverLimitFails) {
  Receipt r = Run(Tx(alice_, FaucetTx{.recipient = alice_.public_key(),
                                      .amount = genesis_.params.faucet_max_amount + 1}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("over the limit"), std::string::npos) << r.reason;
  EXPECT_EQ(Balance(alice_), kFunds);
}

TEST_F(AccountsTest, FaucetDisabledOutsideDevnet) {
  genesis_.faucet = false;
  chain_.reset();
  testing::TempDir other;
  auto c = Chain::Open(other.File("x.db"), genesis_);
  ASSERT_TRUE(c.ok());
  chain_ = std::move(*c);
  Receipt r = Run(Tx(alice_, FaucetTx{.recipient = alice_.public_key(), .amount = 1}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("no faucet"), std::string::npos) << r.reason;
  // A new key cannot use the faucet to get an account either.
  KeyPair dave = TestKey(4);
  EXPECT_EQ(chain_->CheckTx(Tx(dave, FaucetTx{.recipient = dave.public_key(), .amount = 1}))
                .code(),
            StatusCode::kNotFound);
}

TEST_F(AccountsTest, OverflowingMintFailsCleanly) {
  genesis_.params.faucet_max_amount = UINT64_MAX;
  genesis_.accounts = {{alice_.public_key(), UINT64_MAX - 10}};
  chain_.reset();
  testing::TempDir other;
  auto c = Chain::Open(other.File("x.db"), genesis_);
  ASSERT_TRUE(c.ok());
  chain_ = std::move(*c);
  Hash256 before = chain_->StateHash();
  Receipt r = Run(Tx(alice_, FaucetTx{.recipient = bob_.public_key(), .amount = 11}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("overflows"), std::string::npos) << r.reason;
  EXPECT_EQ(chain_->GetTotals().minted, UINT64_MAX - 10);
  EXPECT_FALSE(chain_->GetAccount(bob_.public_key()).ok());
  EXPECT_NE(chain_->StateHash(), before);  // the nonce moved
  r = Run(Tx(alice_, FaucetTx{.recipient = bob_.public_key(), .amount = 10}));
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(chain_->GetTotals().minted, UINT64_MAX);
}

TEST(CheckedArithmeticTest, AddSubBasisPoints) {
  Amount out = 0;
  EXPECT_TRUE(CheckedAdd(1, 2, &out, "x").ok());
  EXPECT_EQ(out, 3u);
  EXPECT_FALSE(CheckedAdd(UINT64_MAX, 1, &out, "x").ok());
  EXPECT_FALSE(CheckedSub(1, 2, &out, "x").ok());
  EXPECT_EQ(BasisPoints(UINT64_MAX, 10000), UINT64_MAX);
  EXPECT_EQ(BasisPoints(10001, 5000), 5000u);
  EXPECT_EQ(BasisPoints(UINT64_MAX, 5000), UINT64_MAX / 2);
}

}  // namespace
}  // namespace meshlearn::ledger
