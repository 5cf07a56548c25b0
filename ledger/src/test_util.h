// Internal test helpers for the ledger: deterministic keys, a chain in a temporary directory,
// and block production that checks the books after every block.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fields.h"
#include "meshlearn/ledger/chain.h"

namespace meshlearn::ledger::testing {

inline KeyPair TestKey(uint8_t i) {
  KeySeed s;
  s.bytes.fill(i);
  s.bytes[31] = 0x5a;
  return KeyPair::FromSeed(s);
}

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ledger_test_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The chain parameters of the verification tests' chains: verification on, short windows (so a
// test steps through a check in a few blocks), no forced errors, one verifier a unit, nodes live
// for the whole test.
inline void SetVerifyingTestParams(ChainParams& p) {
  p.verification = true;
  p.liveness_blocks = 1000;
  p.min_deadline_blocks = 4;
  p.verdict_commit_blocks = 2;
  p.verdict_reveal_blocks = 2;
  p.dispute_response_blocks = 2;
  p.forced_error_per_million = 0;
  p.verifiers_per_unit = 1;
}

// The price per GFLOP the network tests give every node, and what one unit of TestTaskParams
// (32 GFLOP) then costs.
inline constexpr Amount kTestPrice = 10;
inline constexpr Amount kTestUnitCost = 32 * kTestPrice;

// Valid parameters of a small network task (2 rounds x 3 units; one unit is 4 x 8 samples of
// 10^9 FLOPs = 32 GFLOP, so it costs 32 x the price per GFLOP). Its data root is over no real
// examples (a verifying chain refuses an exact-mode task without one: ValidateTaskTerms); a test
// that replays a batch sets the root of its data.
inline TaskParams TestTaskParams() {
  return TaskParams{.rounds = 2,
                    .units_per_round = 3,
                    .inner_steps = 4,
                    .batch_size = 8,
                    .checkpoint_interval = 2,
                    .flops_per_sample = 1'000'000'000,
                    .model_bytes = 4000,
                    .memory_bytes = 0,
                    .num_examples = 300,
                    .seed = 7,
                    .initial_state = Blake2b("initial state"),
                    .verification_window_blocks = 0,
                    .data_root = Blake2b("examples")};
}

class ChainFixture : public ::testing::Test {
 protected:
  static constexpr Amount kFunds = 1'000'000;

  ChainFixture()
      : alice_(TestKey(1)), bob_(TestKey(2)), carol_(TestKey(3)), sequencer_(TestKey(100)) {
    genesis_ = DevnetGenesis({alice_.public_key(), bob_.public_key()}, kFunds, "test-chain");
  }

  void SetUp() override { Reopen(); }

  void Reopen() {
    chain_.reset();
    auto c = Chain::Open(dir_.File("ledger.db"), genesis_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    chain_ = std::move(*c);
  }

  Transaction Tx(const KeyPair& from, TxPayload p, Amount fee = 0) {
    return BuildSignedTx(from, genesis_.chain_id, chain_->NextNonce(from.public_key()),
                         std::move(p), fee);
  }

  // Produces one block, checks the invariant, returns it.
  Block Produce(std::vector<Transaction> txs, std::vector<RejectedTx>* rejected = nullptr) {
    time_ms_ += 1000;
    auto b = chain_->ProduceBlock(std::move(txs), time_ms_, sequencer_, rejected);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    Status inv = chain_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv.ToString();
    return b.ok() ? *b : Block{};
  }

  // Produces a block with one transaction that must be included; returns its receipt.
  Receipt Run(const Transaction& tx) {
    std::vector<RejectedTx> rejected;
    Block b = Produce({tx}, &rejected);
    EXPECT_TRUE(rejected.empty()) << rejected[0].status.ToString();
    EXPECT_EQ(b.receipts.size(), 1u);
    return b.receipts.empty() ? Receipt{} : b.receipts[0];
  }

  Amount Balance(const KeyPair& k) {
    auto a = chain_->GetAccount(k.public_key());
    return a.ok() ? a->balance : 0;
  }

  TempDir dir_;
  Genesis genesis_;
  KeyPair alice_, bob_, carol_, sequencer_;
  std::unique_ptr<Chain> chain_;
  int64_t time_ms_ = 0;
};

// A chain with a follower: every block is applied to the follower, which must reach the same
// state hash and keep the invariant (network_test.cc, verification_test.cc). Derived fixtures set
// genesis_ in their constructor.
class FollowedChainFixture : public ChainFixture {
 protected:
  void SetUp() override {
    ChainFixture::SetUp();
    auto f = Chain::Open(follower_dir_.File("follower.db"), genesis_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    follower_ = std::move(*f);
  }

  // A transaction with the sender's next nonce, counting the ones already queued for this block.
  Transaction Q(const KeyPair& from, TxPayload p) {
    uint64_t nonce = chain_->NextNonce(from.public_key()) + queued_[from.public_key()]++;
    return BuildSignedTx(from, genesis_.chain_id, nonce, std::move(p));
  }

  // Produces a block (the fixture checks the invariant), applies it to the follower and checks
  // that both states agree. Returns the receipts.
  std::vector<Receipt> Step(std::vector<Transaction> txs = {}) {
    queued_.clear();
    std::vector<RejectedTx> rejected;
    Block b = Produce(std::move(txs), &rejected);
    EXPECT_TRUE(rejected.empty()) << rejected[0].status.ToString();
    Status s = follower_->ApplyBlock(b, sequencer_.public_key());
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(follower_->StateHash(), chain_->StateHash());
    EXPECT_TRUE(follower_->CheckInvariants().ok());
    return b.receipts;
  }

  // Sends each of `refusals` in a block of its own and expects it refused, its reason containing
  // the paired text: the bad inputs a test lists, each turned away alone.
  void ExpectEachRefused(const std::vector<std::pair<Transaction, std::string>>& refusals) {
    for (const auto& [tx, why] : refusals) {
      std::vector<Receipt> r = Step({tx});
      EXPECT_FALSE(r[0].ok) << why;
      EXPECT_NE(r[0].reason.find(why), std::string::npos) << r[0].reason;
    }
  }

  std::map<PublicKey, uint64_t> queued_;
  TempDir follower_dir_;
  std::unique_ptr<Chain> follower_;
};

// The ruling record (state.h DisputeRuling) that ruling transaction `tx`, executed in block
// `height`, leaves with the fields the transaction and its block decide; the caller fills in the
// unit, the parties and the outcome.
inline DisputeRuling RulingBy(const Transaction& tx, uint64_t height) {
  return DisputeRuling{.tx = static_cast<uint16_t>(PayloadType(tx.payload)),
                       .tx_id = TxId(tx),
                       .sender = tx.sender,
                       .height = height};
}

// Expects the task's record to keep exactly the rulings `want`, compared as JSON so that a
// failure shows every field of both.
inline void ExpectRulings(const TaskRecord& task, const std::vector<DisputeRuling>& want) {
  auto as_json = [](const std::vector<DisputeRuling>& rs) {
    nlohmann::json a = nlohmann::json::array();
    for (const DisputeRuling& r : rs) {
      nlohmann::json j = nlohmann::json::object();
      DisputeRuling::Visit(r, internal::FieldToJson{j});
      a.push_back(std::move(j));
    }
    return a;
  };
  EXPECT_EQ(as_json(task.verification.rulings).dump(1), as_json(want).dump(1));
}

}  // namespace meshlearn::ledger::testing
