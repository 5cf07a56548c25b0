// The replicated sequencer in one process: candidates (each its own SQLite chain, sequencer and
// ClusterCandidate) on a real etcd on loopback. Election, the commit rule, a handover, a
// deposed leader that cannot commit, and a block in etcd that does not verify. Skipped, saying
// so, without the etcd binary. The multi-process kill/pause/partition test is
// cluster_chaos_test.cc.
#include "meshlearn/ledger/cluster.h"

#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "etcd_test_util.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::KeyFromByte;

struct Candidate {
  Candidate(const Genesis& g, const std::string& dir, const KeyPair& key,
            const std::vector<std::string>& etcd, int64_t read_wait_ms = 2000) {
    Result<std::unique_ptr<Chain>> c = Chain::Open(dir + "/chain.db", g);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    chain = std::move(c).value();
    shared = std::make_unique<SharedChain>(chain.get());
    seq = std::make_unique<Sequencer>(shared.get(), key, SystemClock::Default());
    cand = std::make_unique<ClusterCandidate>(
        shared.get(), seq.get(),
        ClusterOptions{.etcd = etcd,
                       .advertise_url = "http://" + key.public_key().ShortHex(),
                       .lease_ttl_s = 1,
                       .poll_ms = 10,
                       .evidence_dir = dir,
                       .read_wait_ms = read_wait_ms});
  }
  void Start() {
    EXPECT_TRUE(cand->CheckEtcd().ok());
    seq->Start();
    run = std::thread([this] { result = cand->Run(); });
  }
  void Stop() {
    if (!run.joinable()) return;
    cand->Stop();
    run.join();
    seq->Stop();
  }
  ~Candidate() { Stop(); }

  std::unique_ptr<Chain> chain;
  std::unique_ptr<SharedChain> shared;
  std::unique_ptr<Sequencer> seq;
  std::unique_ptr<ClusterCandidate> cand;
  std::thread run;
  Status result;
};

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string bin = testing::FindEtcd();
    if (bin.empty()) GTEST_SKIP() << "no etcd binary (apt-get install etcd-server); skipped";
    dir_ = testing::TempDir();
    std::string error;
    ASSERT_TRUE(etcd_.Start(bin, 1, dir_, &error)) << error;
    genesis_ = DevnetGenesis({alice_.public_key(), bob_.public_key()}, 1'000'000, "cluster-test");
    genesis_.block_interval_ms = 20;
    genesis_.sequencer = keys_[0].public_key();
    for (const KeyPair& k : keys_) genesis_.sequencers.push_back(k.public_key());
  }

  std::unique_ptr<Candidate> MakeCandidate(int i, int64_t read_wait_ms = 2000) {
    std::string d = dir_ + "/cand" + std::to_string(i);
    std::filesystem::create_directories(d);
    return std::make_unique<Candidate>(genesis_, d, keys_[i], etcd_.ClientUrlList(), read_wait_ms);
  }

  // Waits (up to 20 s) until one of `cs` leads; its index, or -1.
  static int WaitLeader(const std::vector<Candidate*>& cs) {
    for (int t = 0; t < 2000; ++t) {
      for (size_t i = 0; i < cs.size(); ++i) {
        if (cs[i]->cand->leading()) return static_cast<int>(i);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  // Submits a transfer to the leader and waits until it is included; its height.
  uint64_t TransferVia(Candidate& leader, uint64_t nonce, Amount amount) {
    Transaction tx =
        BuildSignedTx(alice_, genesis_.chain_id, nonce,
                      TransferTx{.to = bob_.public_key(), .amount = amount, .memo = ""});
    Result<TxStatusInfo> st = leader.seq->Submit(tx);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    TxStatusInfo done = leader.seq->WaitFor(TxId(tx), 10000);
    EXPECT_EQ(done.state, TxState::kIncluded);
    return done.receipt ? done.receipt->height : 0;
  }

  static void WaitHeight(Candidate& c, uint64_t h) {
    for (int t = 0; t < 2000 && c.shared->height() < h; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::string dir_;
  testing::EtcdCluster etcd_;
  KeyPair alice_ = KeyFromByte(1), bob_ = KeyFromByte(2);
  std::vector<KeyPair> keys_ = {KeyFromByte(9), KeyFromByte(10), KeyFromByte(11)};
  Genesis genesis_;
};

TEST_F(ClusterTest, OneLeadsTheOthersFollowAndAHandoverLosesNothing) {
  auto a = MakeCandidate(0), b = MakeCandidate(1);
  a->Start();
  b->Start();
  std::vector<Candidate*> cs = {a.get(), b.get()};
  int l = WaitLeader(cs);
  ASSERT_GE(l, 0) << "nobody was elected";
  Candidate& leader = *cs[l];
  Candidate& other = *cs[1 - l];
  EXPECT_FALSE(other.cand->leading());
  // The follower refuses transactions, naming the leader (clients fail over on Unavailable).
  Transaction tx = BuildSignedTx(alice_, genesis_.chain_id, 0,
                                 TransferTx{.to = bob_.public_key(), .amount = 1, .memo = ""});
  Result<TxStatusInfo> refused = other.seq->Submit(tx);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();

  uint64_t h1 = TransferVia(leader, 0, 10);
  uint64_t h2 = TransferVia(leader, 1, 20);
  EXPECT_GT(h2, h1);
  // Every block the leader committed is in etcd, and the follower applied it (verified).
  EtcdClient etcd(etcd_.ClientUrlList());
  std::string prefix = ClusterCandidate::Prefix(genesis_);
  Result<std::optional<EtcdKv>> kv = etcd.Get(ClusterCandidate::BlockKey(prefix, h2));
  ASSERT_TRUE(kv.ok() && kv->has_value());
  Bytes local = leader.shared->With([&](Chain& c) { return EncodeBlock(*c.GetBlock(h2)); });
  EXPECT_EQ((*kv)->value, std::string(local.begin(), local.end()));
  WaitHeight(other, h2);
  ASSERT_GE(other.shared->height(), h2);

  // The leader stops (revoking its lease): the other takes over at the next height.
  leader.Stop();
  uint64_t stopped_at = leader.shared->height();
  std::vector<Candidate*> rest = {&other};
  ASSERT_EQ(WaitLeader(rest), 0) << "the follower did not take over";
  EXPECT_GE(other.shared->height(), stopped_at)
      << "the new leader did not resume at etcd's last block";
  uint64_t h3 = TransferVia(other, 2, 30);
  EXPECT_GT(h3, stopped_at);
  ASSERT_FALSE(other.cand->takeovers().empty());
  // Both histories agree where they overlap, and replay from genesis.
  Hash256 at_stop_a =
      leader.shared->With([&](Chain& c) { return c.GetBlock(stopped_at)->header.state_hash; });
  Hash256 at_stop_b =
      other.shared->With([&](Chain& c) { return c.GetBlock(stopped_at)->header.state_hash; });
  EXPECT_EQ(at_stop_a, at_stop_b);
  Status replay = other.shared->With([](Chain& c) { return c.ReplayFromGenesis(); });
  EXPECT_TRUE(replay.ok()) << replay.ToString();
  EXPECT_EQ(other.shared->With([&](Chain& c) { return c.GetAccount(bob_.public_key())->balance; }),
            1'000'000u + 60);
  other.Stop();
  EXPECT_TRUE(other.result.ok()) << other.result.ToString();
}

// Read-after-apply: a client that fails over to a standby reads the next nonce there (`task
// submit`, a node's TxSender). A standby that has not applied the leader's latest block must not
// answer with the nonce before it: it waits until it has applied what etcd holds, or answers
// Unavailable (the client asks another candidate). The standby here does not run at first, so
// it cannot catch up: the stale answer is there to be given, and is not.
TEST_F(ClusterTest, AStandbyAnswersReadsOnlyAfterApplyingWhatEtcdHolds) {
  auto a = MakeCandidate(0);
  auto b = MakeCandidate(1, /*read_wait_ms=*/300);
  a->Start();
  std::vector<Candidate*> cs = {a.get()};
  ASSERT_EQ(WaitLeader(cs), 0);
  const uint64_t h = TransferVia(*a, 0, 7);
  ASSERT_GT(h, 0u);
  auto service = [](Candidate& c) {
    return std::make_unique<RpcService>(
        c.shared.get(), c.seq.get(), RpcLimits{},
        RpcServiceInfo{.role = "candidate",
                       .read_barrier = [&c] { return c.cand->CatchUp(); },
                       .cluster_status = [&c] { return c.cand->StatusJson(); }});
  };
  auto nonce_request = nlohmann::json{{"jsonrpc", "2.0"},
                                      {"id", 1},
                                      {"method", "get_account"},
                                      {"params", {{"address", alice_.public_key().ToHex()}}}};
  // The leader answers at once, with the nonce after the transfer.
  nlohmann::json on_a = service(*a)->HandleRpc(nonce_request);
  ASSERT_TRUE(on_a.contains("result")) << on_a.dump();
  EXPECT_EQ(on_a["result"]["nonce"], 1) << on_a.dump();
  // The standby's own state still says nonce 0 (the scenario is real) ...
  ASSERT_LT(b->shared->height(), h);
  EXPECT_EQ(b->shared->With([&](Chain& c) { return c.GetAccount(alice_.public_key())->nonce; }),
            0u);
  // ... but it does not answer with it: Unavailable, so a client moves on.
  auto b_service = service(*b);
  nlohmann::json stale = b_service->HandleRpc(nonce_request);
  ASSERT_TRUE(stale.contains("error"))
      << "a standby answered from a state etcd has passed: " << stale.dump();
  EXPECT_EQ(stale["error"]["data"]["status"], "Unavailable") << stale.dump();
  EXPECT_NE(stale["error"]["message"].get<std::string>().find("behind etcd"), std::string::npos)
      << stale.dump();
  // chain_status is the candidate's own view, answered whatever its height, with the cluster.
  nlohmann::json st = b_service->HandleRpc({{"jsonrpc", "2.0"},
                                            {"id", 2},
                                            {"method", "chain_status"},
                                            {"params", nlohmann::json::object()}});
  ASSERT_TRUE(st.contains("result")) << st.dump();
  EXPECT_EQ(st["result"]["role"], "candidate");
  EXPECT_FALSE(st["result"]["cluster"]["leading"].get<bool>()) << st.dump();
  // Once it runs, the same read waits for the block and answers the nonce after the transfer. Its
  // wait is short (300 ms) and the leader keeps producing, so on a loaded machine a read may still
  // find it behind: Unavailable, which a client retries (RpcClient), as this does.
  b->Start();
  nlohmann::json fresh = b_service->HandleRpc(nonce_request);
  for (int attempt = 0;
       attempt < 200 && fresh.contains("error") &&
       fresh["error"]["message"].get<std::string>().find("behind etcd") != std::string::npos;
       ++attempt) {
    fresh = b_service->HandleRpc(nonce_request);
  }
  ASSERT_TRUE(fresh.contains("result")) << fresh.dump();
  EXPECT_EQ(fresh["result"]["nonce"], 1) << fresh.dump();
  EXPECT_GE(b->shared->height(), h);
  // The leader's chain_status names it and counts its takeover.
  nlohmann::json la = service(*a)->HandleRpc({{"jsonrpc", "2.0"},
                                              {"id", 3},
                                              {"method", "chain_status"},
                                              {"params", nlohmann::json::object()}});
  ASSERT_TRUE(la.contains("result")) << la.dump();
  const nlohmann::json& cl = la["result"]["cluster"];
  EXPECT_TRUE(cl["leading"].get<bool>()) << la.dump();
  EXPECT_EQ(cl["leader"], keys_[0].public_key().ToHex()) << la.dump();
  EXPECT_EQ(cl["takeover_count"], 1) << la.dump();
}

TEST_F(ClusterTest, ADeposedLeaderCannotCommit) {
  auto a = MakeCandidate(0);
  a->Start();
  std::vector<Candidate*> cs = {a.get()};
  ASSERT_EQ(WaitLeader(cs), 0);
  TransferVia(*a, 0, 5);
  // Another candidate takes the leader key behind its back (as after its lease ran out).
  EtcdClient etcd(etcd_.ClientUrlList());
  std::string prefix = ClusterCandidate::Prefix(genesis_);
  ASSERT_TRUE(etcd.Put(prefix + "leader", R"({"key":"someone else"})").ok());
  // Its next block fails the compare-and-swap: not committed locally, and it steps down.
  for (int t = 0; t < 2000 && a->cand->leading(); ++t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(a->cand->leading());
  uint64_t h = a->shared->height();
  Result<std::vector<EtcdKv>> blocks =
      etcd.Range(prefix + "blocks/", EtcdClient::PrefixEnd(prefix + "blocks/"));
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(blocks->size(), h) << "the local chain holds a block etcd does not";
  Transaction tx = BuildSignedTx(alice_, genesis_.chain_id, 1,
                                 TransferTx{.to = bob_.public_key(), .amount = 1, .memo = ""});
  EXPECT_EQ(a->seq->Submit(tx).status().code(), StatusCode::kUnavailable);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(a->shared->height(), h) << "a deposed leader produced a block";
}

TEST_F(ClusterTest, ABlockInEtcdThatDoesNotVerifyIsRefusedNotApplied) {
  // A block signed by a key the genesis does not list, at height 1.
  std::string other_dir = dir_ + "/rogue";
  std::filesystem::create_directories(other_dir);
  Genesis rogue_genesis = genesis_;
  Result<std::unique_ptr<Chain>> rogue = Chain::Open(other_dir + "/chain.db", rogue_genesis);
  ASSERT_TRUE(rogue.ok());
  // Chain::ProduceBlock refuses an unlisted key, so sign a listed block over again.
  Result<Block> b = (*rogue)->ProduceBlock({}, 1'700'000'000'000, keys_[0]);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  KeyPair mallory = KeyFromByte(66);
  b->header.sequencer = mallory.public_key();
  b->signature = mallory.Sign(BlockHash(b->header).span());
  Bytes wire = EncodeBlock(*b);
  EtcdClient etcd(etcd_.ClientUrlList());
  std::string prefix = ClusterCandidate::Prefix(genesis_);
  ASSERT_TRUE(
      etcd.Put(ClusterCandidate::BlockKey(prefix, 1), std::string(wire.begin(), wire.end())).ok());

  auto a = MakeCandidate(1);
  a->Start();
  a->run.join();  // Run ends by itself on a refused block
  EXPECT_EQ(a->result.code(), StatusCode::kPermissionDenied) << a->result.ToString();
  EXPECT_NE(a->result.message().find("REFUSED block 1"), std::string::npos) << a->result.message();
  EXPECT_NE(a->result.message().find("not a sequencer key of this chain's genesis"),
            std::string::npos)
      << a->result.message();
  EXPECT_EQ(a->shared->height(), 0u);
  EXPECT_FALSE(a->cand->leading());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/cand1/refused-block-1.hex"));
  a->seq->Stop();
}

TEST_F(ClusterTest, ABlockWithAWrongStateHashIsRefused) {
  std::string other_dir = dir_ + "/liar";
  std::filesystem::create_directories(other_dir);
  Result<std::unique_ptr<Chain>> liar = Chain::Open(other_dir + "/chain.db", genesis_);
  ASSERT_TRUE(liar.ok());
  Result<Block> b = (*liar)->ProduceBlock({}, 1'700'000'000'000, keys_[2]);
  ASSERT_TRUE(b.ok());
  b->header.state_hash.bytes[0] ^= 1;  // signed by an authorized key, but a lie
  b->signature = keys_[2].Sign(BlockHash(b->header).span());
  Bytes wire = EncodeBlock(*b);
  EtcdClient etcd(etcd_.ClientUrlList());
  ASSERT_TRUE(etcd.Put(ClusterCandidate::BlockKey(ClusterCandidate::Prefix(genesis_), 1),
                       std::string(wire.begin(), wire.end()))
                  .ok());
  auto a = MakeCandidate(0);
  a->Start();
  a->run.join();
  EXPECT_EQ(a->result.code(), StatusCode::kPermissionDenied) << a->result.ToString();
  EXPECT_NE(a->result.message().find("state hash"), std::string::npos) << a->result.message();
  EXPECT_EQ(a->shared->height(), 0u);
  a->seq->Stop();
}

TEST_F(ClusterTest, ALocalChainEtcdDoesNotHoldIsRefusedAtStart) {
  std::string d = dir_ + "/cand0";
  std::filesystem::create_directories(d);
  {
    Result<std::unique_ptr<Chain>> c = Chain::Open(d + "/chain.db", genesis_);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->ProduceBlock({}, 1'700'000'000'000, keys_[0]).ok());
  }
  auto a = MakeCandidate(0);
  Status s = a->cand->CheckEtcd();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("holds no block 1"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace meshlearn::ledger
