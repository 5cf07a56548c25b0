#include "meshlearn/ledger/sequencer.h"

#include <gtest/gtest.h>

#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestLedger;

TEST(Sequencer, OrdersBySenderThenNonce) {
  TestLedger t;
  // Submitted out of order: bob before alice, nonce 1 before nonce 0.
  Transaction a1 = t.Transfer(t.alice, t.bob, 2, 1);
  Transaction b0 = t.Transfer(t.bob, t.alice, 3, 0);
  Transaction a0 = t.Transfer(t.alice, t.bob, 1, 0);
  ASSERT_TRUE(t.sequencer->Submit(a1).ok());
  ASSERT_TRUE(t.sequencer->Submit(b0).ok());
  ASSERT_TRUE(t.sequencer->Submit(a0).ok());
  Result<Block> b = t.sequencer->ProduceOnce();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->txs.size(), 3u);
  bool alice_first = t.alice.public_key() < t.bob.public_key();
  const Transaction& first = alice_first ? a0 : b0;
  EXPECT_EQ(b->txs[0], first);
  if (alice_first) {
    EXPECT_EQ(b->txs[1], a1);
    EXPECT_EQ(b->txs[2], b0);
  } else {
    EXPECT_EQ(b->txs[1], a0);
    EXPECT_EQ(b->txs[2], a1);
  }
  for (const Receipt& r : b->receipts) EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(t.sequencer->mempool_size(), 0u);
}

TEST(Sequencer, NonceGapWaitsForTheMissingTx) {
  TestLedger t;
  Transaction a1 = t.Transfer(t.alice, t.bob, 2, 1);
  ASSERT_TRUE(t.sequencer->Submit(a1).ok());
  Result<Block> b = t.sequencer->ProduceOnce();
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->txs.empty());
  EXPECT_EQ(t.sequencer->Lookup(TxId(a1)).state, TxState::kPending);
  ASSERT_TRUE(t.sequencer->Submit(t.Transfer(t.alice, t.bob, 1, 0)).ok());
  b = t.sequencer->ProduceOnce();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->txs.size(), 2u);
  EXPECT_EQ(t.sequencer->Lookup(TxId(a1)).state, TxState::kIncluded);
}

TEST(Sequencer, FarFutureNonceAndFullMempoolAreRefused) {
  TestLedger t;
  Sequencer small(t.shared.get(), t.seq_key, &t.clock, {.max_mempool = 2, .max_nonce_gap = 4});
  Result<TxStatusInfo> far = small.Submit(t.Transfer(t.alice, t.bob, 1, 100));
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(small.Submit(t.Transfer(t.alice, t.bob, 1, 0)).ok());
  ASSERT_TRUE(small.Submit(t.Transfer(t.alice, t.bob, 1, 1)).ok());
  Result<TxStatusInfo> full = small.Submit(t.Transfer(t.bob, t.alice, 1, 0));
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("mempool is full"), std::string::npos);
}

TEST(Sequencer, ResendsNeverPayTwice) {
  TestLedger t;
  Transaction tx = t.Transfer(t.alice, t.bob, 1000, 0);
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 3; ++i) {
      Result<TxStatusInfo> st = t.sequencer->Submit(tx);
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      EXPECT_EQ(st->state, round == 0 ? TxState::kPending : TxState::kIncluded);
    }
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  EXPECT_EQ(t.Balance(t.alice), TestLedger::kFunds - 1000);
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 1000);
}

TEST(Sequencer, LoopProducesBlocksAndWaitForAcknowledges) {
  TestLedger t(/*block_interval_ms=*/10);
  Sequencer seq(t.shared.get(), t.seq_key, SystemClock::Default());
  seq.Start();
  Transaction tx = t.Transfer(t.alice, t.bob, 5, 0);
  ASSERT_TRUE(seq.Submit(tx).ok());
  TxStatusInfo done = seq.WaitFor(TxId(tx), 60000);
  seq.Stop();
  ASSERT_EQ(done.state, TxState::kIncluded);
  ASSERT_TRUE(done.receipt.has_value());
  EXPECT_TRUE(done.receipt->ok);
  // Acknowledged means durable: the receipt is in the chain's store.
  EXPECT_TRUE(t.shared->With([&](Chain& c) { return c.GetReceipt(TxId(tx)).ok(); }));
}

TEST(Sequencer, StaleNonceIsDroppedWithAReason) {
  TestLedger t;
  // Two different transactions with nonce 0 cannot both be pending; simulate one that was
  // admitted before another with the same nonce got in through a second sequencer instance.
  Sequencer other(t.shared.get(), t.seq_key, &t.clock);
  Transaction x = t.Transfer(t.alice, t.bob, 1, 0);
  Transaction y = t.Transfer(t.alice, t.bob, 2, 0);
  ASSERT_TRUE(t.sequencer->Submit(x).ok());
  ASSERT_TRUE(other.Submit(y).ok());
  ASSERT_TRUE(other.ProduceOnce().ok());
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  TxStatusInfo st = t.sequencer->Lookup(TxId(x));
  EXPECT_EQ(st.state, TxState::kRejected);
  EXPECT_NE(st.error.message().find("was used by another transaction"), std::string::npos);
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 2);
}

}  // namespace
}  // namespace meshlearn::ledger
