// A follower tracks a real sequencer over loopback HTTP, and refuses tampered blocks served by a
// malicious fake sequencer.
#include "meshlearn/ledger/follower.h"

#include <httplib.h>

#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "meshlearn/base/env.h"
#include "meshlearn/ledger/rpc_server.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;
using testing::TestLedger;

// A second chain from the same genesis, in its own directory.
struct FollowerSide {
  explicit FollowerSide(const Genesis& genesis) : dir(testing::TempDir()) {
    Result<std::unique_ptr<Chain>> c = Chain::Open(dir + "/chain.db", genesis);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    chain = std::move(c).value();
    shared = std::make_unique<SharedChain>(chain.get());
  }
  std::string dir;
  std::unique_ptr<Chain> chain;
  std::unique_ptr<SharedChain> shared;
};

void ProduceTransfers(TestLedger& t, int blocks) {
  for (int i = 0; i < blocks; ++i) {
    uint64_t nonce = t.shared->With([&](Chain& c) { return c.NextNonce(t.alice.public_key()); });
    ASSERT_TRUE(t.sequencer->Submit(t.Transfer(t.alice, t.bob, 100 + i, nonce)).ok());
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
}

TEST(Follower, TracksTheSequencer) {
  TestLedger seq;
  ProduceTransfers(seq, 3);
  RpcServer server(seq.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());

  FollowerSide f(seq.genesis);
  RpcClient upstream(server.url());
  Follower follower(f.shared.get(), &upstream, seq.seq_key.public_key(),
                    {.long_poll_ms = 200, .batch = 2});
  ASSERT_TRUE(follower.CheckUpstream().ok());
  Result<uint64_t> n = follower.SyncOnce();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(f.chain->StateHash(), seq.shared->With([](Chain& c) { return c.StateHash(); }));

  // Live: the follower long-polls and picks up new blocks as they come.
  Status run_status;
  std::thread runner([&] { run_status = follower.Run(); });
  ProduceTransfers(seq, 2);
  while (f.shared->height() < 5) f.shared->WaitAbove(f.shared->height(), 1000);
  follower.Stop();
  runner.join();
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
  EXPECT_EQ(f.chain->Height(), 5u);
  EXPECT_EQ(f.chain->StateHash(), seq.shared->With([](Chain& c) { return c.StateHash(); }));
  EXPECT_TRUE(f.chain->ReplayFromGenesis().ok());

  // The follower serves reads itself, and refuses writes.
  RpcService reads(f.shared.get(), nullptr, {}, {.role = "follower", .upstream = server.url()});
  json acct = reads.HandleRpc(testing::Request("get_account", {{"address", seq.bob.public_key().ToHex()}}));
  EXPECT_EQ(acct["result"]["balance"], seq.Balance(seq.bob));
  server.Stop();
}

TEST(Follower, RefusesAnotherGenesis) {
  TestLedger seq;
  RpcServer server(seq.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Genesis other = seq.genesis;
  other.chain_id = "another-chain";
  FollowerSide f(other);
  RpcClient upstream(server.url());
  Follower follower(f.shared.get(), &upstream, seq.seq_key.public_key());
  Status s = follower.CheckUpstream();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  server.Stop();
}

// Serves the honest chain's answers, except that get_blocks passes every block through
// `tamper` first: a sequencer that lies.
class FakeSequencer {
 public:
  FakeSequencer(RpcService* honest, std::function<void(Block&)> tamper)
      : honest_(honest), tamper_(std::move(tamper)) {
    server_.Post("/", [this](const httplib::Request& req, httplib::Response& res) {
      json request = json::parse(req.body);
      json answer = honest_->HandleRpc(request);
      if (request["method"] == "get_blocks" && answer.contains("result")) {
        for (json& hex : answer["result"]["blocks"]) {
          Block b = DecodeBlock(*HexDecode(hex.get<std::string>())).value();
          tamper_(b);
          hex = HexEncode(EncodeBlock(b));
        }
      }
      res.set_content(answer.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeSequencer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  RpcService* honest_;
  std::function<void(Block&)> tamper_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// Block 1 is honest; the tampering hits block 2. The follower must apply 1, refuse 2, keep
// its state at block 1 and keep the evidence.
void ExpectRefused(const std::function<void(TestLedger&, Block&)>& tamper, const char* what) {
  SCOPED_TRACE(what);
  TestLedger seq;
  ProduceTransfers(seq, 2);
  FakeSequencer fake(seq.rpc.get(), [&](Block& b) {
    if (b.header.height == 2) tamper(seq, b);
  });
  FollowerSide f(seq.genesis);
  RpcClient upstream(fake.url());
  Follower follower(f.shared.get(), &upstream, seq.seq_key.public_key(),
                    {.long_poll_ms = 100, .batch = 10, .evidence_dir = f.dir});
  ASSERT_TRUE(follower.CheckUpstream().ok());
  Result<uint64_t> n = follower.SyncOnce();
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kPermissionDenied) << n.status().ToString();
  EXPECT_NE(n.status().message().find("REFUSED block 2"), std::string::npos) << n.status().message();
  EXPECT_EQ(f.chain->Height(), 1u);
  Hash256 honest_at_1 = seq.shared->With([](Chain& c) { return c.GetBlock(1)->header.state_hash; });
  EXPECT_EQ(f.chain->StateHash(), honest_at_1);
  EXPECT_TRUE(Env::Default()->FileExists(f.dir + "/refused-block-2.hex"));
  // Run stops on it too, rather than retrying or skipping.
  Status run = follower.Run();
  EXPECT_EQ(run.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(f.chain->Height(), 1u);
}

TEST(Follower, RefusesChangedAmount) {
  ExpectRefused([](TestLedger&, Block& b) {
    std::get<TransferTx>(b.txs[0].payload).amount += 1;
  }, "amount changed, nothing re-signed");
}

TEST(Follower, RefusesChangedAmountEvenWhenEverythingIsResigned) {
  // The worst case: the sequencer (with the sender's key, say) rewrites the transfer and signs
  // everything again. Only re-execution catches it: the state hash no longer matches.
  ExpectRefused([](TestLedger& t, Block& b) {
    Transaction& tx = b.txs[0];
    std::get<TransferTx>(tx.payload).amount += 1;
    tx = SignTx(tx, t.alice);
    b.receipts[0].tx_id = TxId(tx);
    b.header.tx_root = TxRoot(b.txs);
    b.header.receipts_root = ReceiptsRoot(b.receipts);
    b.signature = t.seq_key.Sign(BlockHash(b.header).span());
  }, "amount changed and re-signed");
}

TEST(Follower, RefusesBadBlockSignature) {
  ExpectRefused([](TestLedger&, Block& b) { b.signature.bytes[3] ^= 0x40; }, "bad signature");
}

TEST(Follower, RefusesBlockSignedByAnotherKey) {
  ExpectRefused([](TestLedger&, Block& b) {
    KeyPair mallory = testing::KeyFromByte(66);
    b.header.sequencer = mallory.public_key();
    b.signature = mallory.Sign(BlockHash(b.header).span());
  }, "signed by another key");
}

TEST(Follower, RefusesWrongStateHash) {
  ExpectRefused([](TestLedger& t, Block& b) {
    b.header.state_hash.bytes[0] ^= 1;
    b.signature = t.seq_key.Sign(BlockHash(b.header).span());
  }, "state hash changed and re-signed");
}

}  // namespace
}  // namespace meshlearn::ledger
