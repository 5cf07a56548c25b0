// Chain: admission, blocks, durability, replay and the follower path.
#include "meshlearn/ledger/chain.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::ChainFixture;
using testing::TempDir;
using testing::TestKey;

class ChainTest : public ChainFixture {
 protected:
  // Checks that `tx` is refused by CheckTx and left out of a block with the same reason,
  // and that the state does not change at all (not even a nonce).
  void ExpectRefused(const Transaction& tx, StatusCode code, const std::string& reason_part) {
    Status s = chain_->CheckTx(tx);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(reason_part), std::string::npos) << s.ToString();
    Hash256 before = chain_->StateHash();
    uint64_t height = chain_->Height();
    std::vector<RejectedTx> rejected;
    Block b = Produce({tx}, &rejected);
    EXPECT_TRUE(b.txs.empty());
    ASSERT_EQ(rejected.size(), 1u);
    EXPECT_EQ(rejected[0].tx_id, TxId(tx));
    EXPECT_NE(rejected[0].status.message().find(reason_part), std::string::npos)
        << rejected[0].status.ToString();
    EXPECT_EQ(chain_->Height(), height + 1);
    EXPECT_EQ(chain_->StateHash(), before);
  }
  Transaction Pay(const KeyPair& from, Amount amount) {
    return Tx(from, TransferTx{.to = carol_.public_key(), .amount = amount});
  }
};

TEST_F(ChainTest, FreshChainStartsAtGenesis) {
  EXPECT_EQ(chain_->Height(), 0u);
  EXPECT_EQ(chain_->LastBlockHash(), GenesisHash(genesis_));
  EXPECT_EQ(chain_->GetTotals().minted, 2 * kFunds);
  EXPECT_TRUE(chain_->CheckInvariants().ok());
  EXPECT_EQ(chain_->GetBlock(1).status().code(), StatusCode::kNotFound);
}

TEST_F(ChainTest, InvalidSignatureRefused) {
  Transaction tx = Pay(alice_, 5);
  tx.signature.bytes[0] ^= 1;
  ExpectRefused(tx, StatusCode::kPermissionDenied, "signature");
  tx = Pay(alice_, 5);
  std::get<TransferTx>(tx.payload).amount = 6;  // changed after signing
  ExpectRefused(tx, StatusCode::kPermissionDenied, "signature");
}

TEST_F(ChainTest, WrongChainIdRefused) {
  Transaction tx = BuildSignedTx(alice_, "other-chain", 0,
                                 TransferTx{.to = carol_.public_key(), .amount = 5});
  ExpectRefused(tx, StatusCode::kInvalidArgument, "chain 'other-chain'");
}

TEST_F(ChainTest, ReplayedNonceRefused) {
  Transaction tx = Pay(alice_, 5);
  ASSERT_TRUE(Run(tx).ok);
  ExpectRefused(tx, StatusCode::kInvalidArgument, "already used");
  EXPECT_EQ(Balance(carol_), 5u);
}

TEST_F(ChainTest, SkippedNonceWaitsInMempoolButNotInBlock) {
  Transaction tx = BuildSignedTx(alice_, genesis_.chain_id, 1,
                                 TransferTx{.to = carol_.public_key(), .amount = 5});
  EXPECT_TRUE(chain_->CheckTx(tx).ok());  // a mempool may hold it until nonce 0 arrives
  Hash256 before = chain_->StateHash();
  std::vector<RejectedTx> rejected;
  Block b = Produce({tx}, &rejected);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].status.message().find("skips ahead"), std::string::npos);
  EXPECT_EQ(chain_->StateHash(), before);
  // In order, both go in.
  b = Produce({Pay(alice_, 1), tx});
  EXPECT_EQ(b.txs.size(), 2u);
  EXPECT_EQ(Balance(carol_), 6u);
}

TEST_F(ChainTest, OversizeTxRefused) {
  Transaction tx = Tx(alice_, TransferTx{.to = carol_.public_key(), .amount = 1,
                                         .memo = std::string(kMaxStringFieldLength + 1, 'x')});
  ExpectRefused(tx, StatusCode::kInvalidArgument, "over the limit");
  // Under the field limit but many fields cannot exceed kMaxTxBytes either: DecodeTx refuses
  // anything longer.
  Bytes big(kMaxTxBytes + 1, 0);
  EXPECT_EQ(DecodeTx(big).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(ChainTest, InvalidUtf8Refused) {
  // A transaction built in-process can hold any bytes; it must not enter a block that
  // followers could not decode (or print as JSON).
  Transaction tx = Tx(alice_, TransferTx{.to = carol_.public_key(), .amount = 1, .memo = "\xff"});
  ExpectRefused(tx, StatusCode::kInvalidArgument, "UTF-8");
}

TEST_F(ChainTest, UnknownAccountRefused) {
  KeyPair dave = TestKey(9);
  ExpectRefused(Pay(dave, 1), StatusCode::kNotFound, "has no account");
}

TEST_F(ChainTest, FeeAboveBalanceRefusedByMempool) {
  Transaction tx = Tx(alice_, TransferTx{.to = carol_.public_key(), .amount = 1}, kFunds + 1);
  EXPECT_EQ(chain_->CheckTx(tx).code(), StatusCode::kFailedPrecondition);
}

TEST_F(ChainTest, ManyTransactionsInOrder) {
  std::vector<Transaction> txs;
  for (int i = 0; i < 20; ++i) {
    txs.push_back(BuildSignedTx(alice_, genesis_.chain_id, i,
                                TransferTx{.to = carol_.public_key(), .amount = 1}));
    txs.push_back(BuildSignedTx(bob_, genesis_.chain_id, i,
                                TransferTx{.to = carol_.public_key(), .amount = 2}));
  }
  Block b = Produce(txs);
  EXPECT_EQ(b.txs.size(), 40u);
  EXPECT_EQ(Balance(carol_), 60u);
  for (uint32_t i = 0; i < b.receipts.size(); ++i) {
    EXPECT_EQ(b.receipts[i].index, i);
    EXPECT_EQ(b.receipts[i].height, b.header.height);
  }
  EXPECT_EQ(b.header.tx_root, TxRoot(b.txs));
  EXPECT_TRUE(VerifyBlockSignature(b));
}

TEST_F(ChainTest, TimeMustNotGoBackwards) {
  Produce({});
  EXPECT_FALSE(chain_->ProduceBlock({}, time_ms_ - 1, sequencer_).ok());
  EXPECT_TRUE(chain_->ProduceBlock({}, time_ms_, sequencer_).ok());
}

TEST_F(ChainTest, OnlyTheGenesisSequencerProduces) {
  genesis_.sequencer = sequencer_.public_key();
  TempDir other;
  chain_ = std::move(*Chain::Open(other.File("x.db"), genesis_));
  EXPECT_EQ(chain_->ProduceBlock({}, 1, alice_).status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(chain_->ProduceBlock({}, 1, sequencer_).ok());
}

TEST_F(ChainTest, ReceiptsAndHistory) {
  Transaction t1 = Pay(alice_, 5);
  Run(t1);
  Transaction t2 = Tx(bob_, TransferTx{.to = alice_.public_key(), .amount = kFunds * 2});
  Run(t2);  // fails: insufficient funds
  auto r1 = chain_->GetReceipt(TxId(t1));
  ASSERT_TRUE(r1.ok());
  EXPECT_TRUE(r1->ok);
  EXPECT_EQ(r1->height, 1u);
  auto r2 = chain_->GetReceipt(TxId(t2));
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2->ok);
  EXPECT_EQ(r2->height, 2u);
  EXPECT_NE(r2->reason.find("insufficient"), std::string::npos);
  auto rec = chain_->GetTransaction(TxId(t1));
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->tx, t1);
  EXPECT_EQ(chain_->GetReceipt(Blake2b("x")).status().code(), StatusCode::kNotFound);

  auto alice_hist = chain_->ListAccountTxs(alice_.public_key(), 0, 10);
  ASSERT_EQ(alice_hist.size(), 2u);  // sent t1, received (failed) t2
  EXPECT_EQ(alice_hist[0].tx, t2);   // newest first
  EXPECT_EQ(alice_hist[1].tx, t1);
  EXPECT_EQ(chain_->ListAccountTxs(alice_.public_key(), 1, 10).size(), 1u);
  EXPECT_EQ(chain_->ListAccountTxs(carol_.public_key(), 0, 10).size(), 1u);
  EXPECT_EQ(chain_->ListAccountTxs(TestKey(77).public_key(), 0, 10).size(), 0u);
}

// The history and transaction indexes keep recent blocks in memory and flush them to SQLite in
// batches (store.h); lookups must see both halves, in order, before and after a reopen.
TEST_F(ChainTest, HistoryAcrossIndexFlushesAndReopens) {
  constexpr int kBlocks = 300;  // more than one flush (every 256 blocks at most)
  std::vector<Transaction> sent;
  for (int i = 0; i < kBlocks; ++i) {
    sent.push_back(Pay(alice_, 1));
    Run(sent.back());
  }
  auto check = [&] {
    for (int i : {0, 1, 200, 255, 256, 299}) {
      auto rec = chain_->GetTransaction(TxId(sent[i]));
      ASSERT_TRUE(rec.ok()) << i << ": " << rec.status().ToString();
      EXPECT_EQ(rec->tx, sent[i]);
      EXPECT_EQ(rec->receipt.height, static_cast<uint64_t>(i + 1));
    }
    std::vector<TxRecord> all;
    for (uint64_t offset = 0; offset < kBlocks + 10; offset += 7) {
      auto page = chain_->ListAccountTxs(alice_.public_key(), offset, 7);
      all.insert(all.end(), page.begin(), page.end());
    }
    ASSERT_EQ(all.size(), static_cast<size_t>(kBlocks));
    for (int i = 0; i < kBlocks; ++i) EXPECT_EQ(all[i].tx, sent[kBlocks - 1 - i]) << i;
    EXPECT_EQ(chain_->ListAccountTxs(carol_.public_key(), 0, 1000).size(),
              static_cast<size_t>(kBlocks));
    EXPECT_TRUE(chain_->ListAccountTxs(TestKey(77).public_key(), 0, 10).empty());
    EXPECT_EQ(chain_->GetTransaction(Blake2b("x")).status().code(), StatusCode::kNotFound);
  };
  check();
  Reopen();  // the blocks after the last flush are re-indexed from the store
  check();
  sent.push_back(Pay(alice_, 1));
  Run(sent.back());
  EXPECT_EQ(chain_->ListAccountTxs(alice_.public_key(), 0, 1)[0].tx, sent.back());
}

// A database written before the compact index layout (txs/account_txs tables) gets its indexes
// rebuilt from its blocks on open.
TEST_F(ChainTest, OldIndexLayoutIsRebuiltOnOpen) {
  std::vector<Transaction> sent;
  for (int i = 0; i < 4; ++i) {
    sent.push_back(Pay(i % 2 ? bob_ : alice_, 1));
    Run(sent.back());
  }
  chain_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir_.File("ledger.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "DELETE FROM tx_index; DELETE FROM account_history; "
                         "DELETE FROM account_ids; DELETE FROM meta WHERE key = 'indexed'; "
                         "CREATE TABLE txs(id BLOB PRIMARY KEY, height, idx); "
                         "CREATE TABLE account_txs(account, height, idx);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Reopen();
  for (const Transaction& tx : sent) {
    auto rec = chain_->GetTransaction(TxId(tx));
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->tx, tx);
  }
  auto hist = chain_->ListAccountTxs(alice_.public_key(), 0, 10);
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_EQ(hist[0].tx, sent[2]);
  EXPECT_EQ(chain_->ListAccountTxs(carol_.public_key(), 0, 10).size(), 4u);
  Reopen();  // migrated once: the old tables are gone
  EXPECT_EQ(chain_->ListAccountTxs(carol_.public_key(), 0, 10).size(), 4u);
}

TEST_F(ChainTest, RestartResumesAtLastBlockWithSameState) {
  for (int i = 0; i < 5; ++i) Produce({Pay(alice_, 1), Pay(bob_, 2)});
  Hash256 state = chain_->StateHash();
  Hash256 last = chain_->LastBlockHash();
  Reopen();
  EXPECT_EQ(chain_->Height(), 5u);
  EXPECT_EQ(chain_->StateHash(), state);
  EXPECT_EQ(chain_->LastBlockHash(), last);
  EXPECT_EQ(Balance(carol_), 15u);
  Produce({Pay(alice_, 1)});
  EXPECT_EQ(chain_->Height(), 6u);
  EXPECT_TRUE(chain_->ReplayFromGenesis().ok());
}

TEST_F(ChainTest, ReopenWithOtherGenesisRefused) {
  Produce({});
  chain_.reset();
  Genesis other = genesis_;
  other.accounts[0].balance += 1;
  auto c = Chain::Open(dir_.File("ledger.db"), other);
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("different genesis"), std::string::npos)
      << c.status().ToString();
}

TEST_F(ChainTest, ReplayFromGenesisMatches) {
  KeyPair node = TestKey(40);
  Run(Tx(alice_, RegisterNodeTx{.node_id = node.public_key(), .endpoint = "http://a:1",
                                .roles = kRoleSolver, .stake = 200,
                                .secret_head = Blake2b("head")}));
  Run(Tx(bob_, SubmitTaskTx{.spec_hash = Blake2b("s"), .budget = 900, .price_cap = 9,
                            .params = testing::TestTaskParams()}));
  Run(Tx(alice_, UnstakeTx{.node_id = node.public_key(), .amount = 50}));
  std::vector<RejectedTx> rejected;
  Produce({Tx(carol_, TransferTx{.to = bob_.public_key(), .amount = 1})}, &rejected);
  EXPECT_EQ(rejected.size(), 1u);  // carol has no account yet
  Run(Tx(alice_, FaucetTx{.recipient = carol_.public_key(), .amount = 99}));
  Hash256 replayed;
  Status s = chain_->ReplayFromGenesis(&replayed);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(replayed, chain_->StateHash());
}

// A follower replays the sequencer's blocks into its own database.
class FollowerTest : public ChainTest {
 protected:
  void SetUp() override {
    ChainTest::SetUp();
    auto f = Chain::Open(follower_dir_.File("follower.db"), genesis_);
    ASSERT_TRUE(f.ok());
    follower_ = std::move(*f);
  }
  TempDir follower_dir_;
  std::unique_ptr<Chain> follower_;
};

TEST_F(FollowerTest, AppliesBlocksToTheSameState) {
  for (int i = 0; i < 3; ++i) {
    Block b = Produce({Pay(alice_, 3), Tx(bob_, TransferTx{.to = alice_.public_key(),
                                                           .amount = kFunds * 9})});
    Status s = follower_->ApplyBlock(b, sequencer_.public_key());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(follower_->StateHash(), chain_->StateHash());
    EXPECT_TRUE(follower_->CheckInvariants().ok());
  }
  // Through the wire encoding, too.
  Block b = Produce({Pay(alice_, 1)});
  auto decoded = DecodeBlock(EncodeBlock(b));
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(follower_->ApplyBlock(*decoded, sequencer_.public_key()).ok());
  EXPECT_EQ(follower_->Height(), 4u);
  EXPECT_TRUE(follower_->ReplayFromGenesis().ok());
}

TEST_F(FollowerTest, RefusesTamperedBlocks) {
  Block good = Produce({Pay(alice_, 10)});
  Hash256 state = follower_->StateHash();
  auto expect_refused = [&](const Block& b, const std::string& why) {
    Status s = follower_->ApplyBlock(b, sequencer_.public_key());
    EXPECT_FALSE(s.ok()) << why;
    EXPECT_EQ(follower_->Height(), 0u) << why;
    EXPECT_EQ(follower_->StateHash(), state) << why;
  };
  auto resign = [&](Block b) {
    b.signature = sequencer_.Sign(BlockHash(b.header).span());
    return b;
  };

  // Changed amount: the transaction no longer matches its signature or the tx root.
  Block b = good;
  std::get<TransferTx>(b.txs[0].payload).amount = 1000;
  expect_refused(b, "changed amount");
  // Changed amount, re-signed by the sender and with a fixed-up tx root, re-signed by the
  // sequencer: execution gives another state, so the state hash refuses it.
  b = good;
  std::get<TransferTx>(b.txs[0].payload).amount = 11;
  b.txs[0] = SignTx(b.txs[0], alice_);
  b.header.tx_root = TxRoot(b.txs);
  b.receipts[0].tx_id = TxId(b.txs[0]);
  b.header.receipts_root = ReceiptsRoot(b.receipts);
  expect_refused(resign(b), "changed amount, consistent roots");
  // Bad signature.
  b = good;
  b.signature.bytes[5] ^= 0x40;
  expect_refused(b, "bad signature");
  // Signed by someone else.
  b = good;
  b.header.sequencer = alice_.public_key();
  b.signature = alice_.Sign(BlockHash(b.header).span());
  expect_refused(b, "wrong sequencer");
  // Wrong state hash (validly signed).
  b = good;
  b.header.state_hash.bytes[0] ^= 1;
  expect_refused(resign(b), "wrong state hash");
  // Wrong receipts (validly signed).
  b = good;
  b.receipts[0].ok = false;
  b.receipts[0].code = StatusCode::kInternal;
  b.header.receipts_root = ReceiptsRoot(b.receipts);
  expect_refused(resign(b), "wrong receipts");
  // Wrong previous hash / height.
  b = good;
  b.header.prev_hash.bytes[0] ^= 1;
  expect_refused(resign(b), "wrong prev hash");
  b = good;
  b.header.height = 2;
  expect_refused(resign(b), "wrong height");
  // A transaction that is not admissible (replayed nonce inside one block).
  b = good;
  b.txs.push_back(b.txs[0]);
  b.receipts.push_back(b.receipts[0]);
  b.header.tx_root = TxRoot(b.txs);
  expect_refused(resign(b), "replayed tx");

  // Nothing was persisted: the follower still accepts the good block, also after a restart.
  follower_.reset();
  follower_ = std::move(*Chain::Open(follower_dir_.File("follower.db"), genesis_));
  EXPECT_EQ(follower_->Height(), 0u);
  Status s = follower_->ApplyBlock(good, sequencer_.public_key());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(follower_->StateHash(), chain_->StateHash());
}

TEST_F(ChainTest, CrashAtAnyInstantLosesNoCommittedBlock) {
  // A child process produces blocks as fast as it can and reports each committed height; we
  // SIGKILL it after a while. The reopened database must hold at least every reported block,
  // and replay from genesis to the same state.
  chain_.reset();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    auto c = Chain::Open(dir_.File("ledger.db"), genesis_);
    if (!c.ok()) _exit(2);
    for (uint64_t i = 0;; ++i) {
      Transaction tx = BuildSignedTx(alice_, genesis_.chain_id, i,
                                     TransferTx{.to = carol_.public_key(), .amount = 1});
      if (!(*c)->ProduceBlock({tx}, static_cast<int64_t>(i), sequencer_).ok()) _exit(3);
      uint64_t h = (*c)->Height();
      if (write(fds[1], &h, sizeof(h)) != sizeof(h)) _exit(4);
    }
  }
  close(fds[1]);
  uint64_t reported = 0;
  for (int i = 0; i < 25; ++i) {
    ASSERT_EQ(read(fds[0], &reported, sizeof(reported)), static_cast<ssize_t>(sizeof(reported)));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  Reopen();
  EXPECT_GE(chain_->Height(), reported);
  EXPECT_EQ(Balance(carol_), chain_->Height());
  EXPECT_TRUE(chain_->CheckInvariants().ok());
  Status s = chain_->ReplayFromGenesis();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace meshlearn::ledger
