// A follower tracks a real sequencer over loopback HTTP, and refuses tampered blocks served by a
// malicious fake sequencer.
#include "meshlearn/ledger/follower.h"

#include <httplib.h>

#include <functional>
#include <map>
#include <mutex>
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

// Serves the honest chain's answers rewritten by `rewrite(method, answer)` (while it is set):
// a ledger whose answers have the wrong shape. Counts the calls per method.
class RewritingLedger {
 public:
  using Rewrite = std::function<void(const std::string& method, json& answer)>;
  RewritingLedger(RpcService* honest, Rewrite rewrite) : honest_(honest), rewrite_(std::move(rewrite)) {
    server_.Post("/", [this](const httplib::Request& req, httplib::Response& res) {
      json request = json::parse(req.body);
      json answer = honest_->HandleRpc(request);
      std::string method = request["method"].get<std::string>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_[method];
        if (rewrite_) rewrite_(method, answer);
      }
      res.set_content(answer.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~RewritingLedger() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int calls(const std::string& method) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[method];
  }
  void set_rewrite(Rewrite rewrite) {
    std::lock_guard<std::mutex> lock(mu_);
    rewrite_ = std::move(rewrite);
  }

 private:
  RpcService* honest_;
  std::mutex mu_;
  Rewrite rewrite_;
  std::map<std::string, int> calls_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// Hostile input: a running follower aborted (uncaught nlohmann::type_error) when get_blocks
// answered "height":"x". Every answer it decodes is checked: a wrong shape is an error naming
// the method and the field, and a running follower keeps going and retries.
TEST(Follower, WrongShapedAnswersAreRetriedNotFatal) {
  TestLedger seq;
  ProduceTransfers(seq, 2);
  RewritingLedger fake(seq.rpc.get(), [](const std::string& method, json& answer) {
    if (method == "get_blocks") answer["result"]["height"] = "x";
    if (method == "wait_block") answer["result"] = "soon";
  });
  FollowerSide f(seq.genesis);
  RpcClient upstream(fake.url(), {.retries = 0});
  Follower follower(f.shared.get(), &upstream, seq.seq_key.public_key(),
                    {.long_poll_ms = 50, .batch = 10, .retry_ms = 10});
  ASSERT_TRUE(follower.CheckUpstream().ok());
  Result<uint64_t> n = follower.SyncOnce();
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable) << n.status().ToString();
  EXPECT_NE(n.status().message().find("get_blocks"), std::string::npos) << n.status().message();
  EXPECT_NE(n.status().message().find("result.height"), std::string::npos) << n.status().message();

  Status run_status = Internal("not run");
  std::thread runner([&] { run_status = follower.Run(); });
  // It keeps asking (bounded wait: at most 30 s), through every wrong shape in turn.
  const std::vector<std::function<void(const std::string&, json&)>> shapes = {
      [](const std::string& m, json& a) { if (m == "get_blocks") a["result"]["height"] = "x"; },
      [](const std::string& m, json& a) { if (m == "get_blocks") a["result"] = 7; },
      [](const std::string& m, json& a) { if (m == "get_blocks") a["result"]["blocks"] = {1, 2}; },
      [](const std::string& m, json& a) { if (m == "get_blocks") a["result"]["blocks"] = "all"; },
      [](const std::string& m, json& a) { if (m == "get_blocks") a["error"] = 5; },
      [](const std::string& m, json& a) {
        if (m == "get_blocks") a = {{"jsonrpc", "2.0"}, {"id", 1}, {"error", {{"message", 5}, {"data", "x"}}}};
      },
  };
  for (const auto& shape : shapes) {
    fake.set_rewrite(shape);
    int before = fake.calls("get_blocks");
    for (int i = 0; i < 3000 && fake.calls("get_blocks") < before + 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(fake.calls("get_blocks"), before + 2);
  }
  EXPECT_EQ(f.chain->Height(), 0u);
  // Honest answers again: it catches up.
  fake.set_rewrite(nullptr);
  for (int i = 0; i < 3000 && f.shared->height() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  follower.Stop();
  runner.join();
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
  EXPECT_EQ(f.chain->Height(), 2u);
}

// The client side of the same: RpcClient's envelope and SendTxAndWait decode with checks.
TEST(Follower, RpcClientRefusesWrongShapesWithoutAborting) {
  TestLedger seq;
  RewritingLedger fake(seq.rpc.get(), [](const std::string& method, json& answer) {
    if (method == "chain_status") answer["result"]["chain_id"] = 5;
    if (method == "get_account") answer["result"]["nonce"] = "x";
    if (method == "send_tx") answer["result"] = {{"status", 3}};
  });
  RpcClient rpc(fake.url(), {.retries = 0});
  Result<std::string> chain_id = FetchChainId(rpc);
  ASSERT_FALSE(chain_id.ok());
  EXPECT_NE(chain_id.status().message().find("chain_status: result.chain_id"), std::string::npos)
      << chain_id.status().message();
  Result<uint64_t> nonce = FetchNextNonce(rpc, seq.alice.public_key());
  ASSERT_FALSE(nonce.ok());
  EXPECT_NE(nonce.status().message().find("get_account: result.nonce"), std::string::npos)
      << nonce.status().message();
  Result<json> sent = SendTxAndWait(rpc, seq.Transfer(seq.alice, seq.bob, 1, 0), 5000);
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().message().find("send_tx: result.status"), std::string::npos)
      << sent.status().message();
  fake.set_rewrite([](const std::string&, json& answer) {
    answer = {{"jsonrpc", "2.0"}, {"id", 1}, {"error", "broken"}};
  });
  Result<json> st = rpc.Call("chain_status", json::object());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("chain_status"), std::string::npos) << st.status().message();
}

}  // namespace
}  // namespace meshlearn::ledger
