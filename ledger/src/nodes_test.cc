// RegisterNode, UpdateNode, Heartbeat, ReportLinks, LeaveNode.
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::ChainFixture;
using testing::TestKey;

class NodesTest : public ChainFixture {
 protected:
  RegisterNodeTx Reg(const KeyPair& node, Amount stake = 100) {
    return RegisterNodeTx{.node_id = node.public_key(),
                          .endpoint = "http://127.0.0.1:7000",
                          .roles = kRoleSolver | kRoleVerifier,
                          .capabilities = {.cores = 8,
                                           .memory_bytes = 16ull << 30,
                                           .accelerator = "",
                                           .throughput = 1234},
                          .price = 5,
                          .stake = stake,
                          .secret_head = Blake2b("secret chain head")};
  }
  KeyPair node1_ = TestKey(50);
  KeyPair node2_ = TestKey(51);
};

TEST_F(NodesTest, RegisterBondsStakeAndRecordsEverything) {
  Produce({});  // height 1, so joined_height is 2
  Receipt r = Run(Tx(alice_, Reg(node1_, 150)));
  ASSERT_TRUE(r.ok) << r.reason;
  auto n = chain_->GetNode(node1_.public_key());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->owner, alice_.public_key());
  EXPECT_EQ(n->stake, 150u);
  EXPECT_EQ(n->status, NodeStatus::kActive);
  EXPECT_EQ(n->capabilities.throughput, 1234u);
  EXPECT_EQ(n->reputation.joined_height, 2u);
  EXPECT_EQ(n->last_heartbeat_height, 2u);
  EXPECT_EQ(Balance(alice_), kFunds - 150);
  EXPECT_EQ(chain_->GetTotals().staked, 150u);
}

TEST_F(NodesTest, OneAccountOwnsSeveralNodes) {
  EXPECT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  EXPECT_TRUE(Run(Tx(alice_, Reg(node2_))).ok);
  auto nodes = chain_->ListNodes(0, 10);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].owner, alice_.public_key());
  EXPECT_EQ(nodes[1].owner, alice_.public_key());
  EXPECT_EQ(chain_->ListNodes(1, 10).size(), 1u);
  EXPECT_EQ(chain_->ListNodes(2, 10).size(), 0u);
  EXPECT_EQ(chain_->ListNodes(0, 1).size(), 1u);
}

TEST_F(NodesTest, RegisterFailures) {
  Receipt r = Run(Tx(alice_, Reg(node1_, 99)));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("below the minimum"), std::string::npos) << r.reason;
  RegisterNodeTx bad = Reg(node1_);
  bad.roles = 0;
  EXPECT_FALSE(Run(Tx(alice_, bad)).ok);
  bad = Reg(node1_);
  bad.roles = 1u << 7;
  EXPECT_FALSE(Run(Tx(alice_, bad)).ok);
  bad = Reg(node1_);
  bad.endpoint = "";
  EXPECT_FALSE(Run(Tx(alice_, bad)).ok);
  bad = Reg(node1_, kFunds + 1);
  r = Run(Tx(alice_, bad));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("insufficient funds"), std::string::npos) << r.reason;
  EXPECT_FALSE(chain_->GetNode(node1_.public_key()).ok());
  EXPECT_EQ(Balance(alice_), kFunds);
  // Registered once; a second registration (even by another account) is refused.
  EXPECT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  r = Run(Tx(bob_, Reg(node1_)));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, StatusCode::kAlreadyExists);
  EXPECT_EQ(Balance(bob_), kFunds);
}

TEST_F(NodesTest, UpdateNode) {
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  UpdateNodeTx u{.node_id = node1_.public_key(),
                 .endpoint = "http://10.0.0.1:9000",
                 .roles = kRoleAggregator,
                 .capabilities = {.cores = 2, .memory_bytes = 1, .accelerator = "cuda:H200",
                                  .throughput = 9},
                 .price = 11};
  Receipt r = Run(Tx(alice_, u));
  ASSERT_TRUE(r.ok) << r.reason;
  auto n = chain_->GetNode(node1_.public_key());
  EXPECT_EQ(n->endpoint, "http://10.0.0.1:9000");
  EXPECT_EQ(n->roles, kRoleAggregator);
  EXPECT_EQ(n->capabilities.accelerator, "cuda:H200");
  EXPECT_EQ(n->price, 11u);
  // Not the owner.
  r = Run(Tx(bob_, u));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, StatusCode::kPermissionDenied);
  // Unknown node.
  u.node_id = node2_.public_key();
  r = Run(Tx(alice_, u));
  EXPECT_EQ(r.code, StatusCode::kNotFound);
}

TEST_F(NodesTest, UpdateNeedsStakeForNewRoles) {
  genesis_.params.min_stake_aggregator = 500;
  testing::TempDir other;
  chain_ = std::move(*Chain::Open(other.File("x.db"), genesis_));
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_, 100))).ok);
  Receipt r = Run(Tx(alice_, UpdateNodeTx{.node_id = node1_.public_key(),
                                          .endpoint = "http://x:1",
                                          .roles = kRoleAggregator}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("below the minimum"), std::string::npos) << r.reason;
}

TEST_F(NodesTest, Heartbeat) {
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  Produce({});
  Produce({});
  Receipt r = Run(Tx(alice_, HeartbeatTx{.node_id = node1_.public_key()}));
  ASSERT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->last_heartbeat_height, chain_->Height());
  EXPECT_FALSE(Run(Tx(bob_, HeartbeatTx{.node_id = node1_.public_key()})).ok);
  EXPECT_FALSE(Run(Tx(alice_, HeartbeatTx{.node_id = node2_.public_key()})).ok);
}

TEST_F(NodesTest, LeaveUnbondsEverythingAndCanComeBack) {
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_, 300))).ok);
  ASSERT_TRUE(Run(Tx(alice_, LeaveNodeTx{.node_id = node1_.public_key()})).ok);
  auto n = chain_->GetNode(node1_.public_key());
  EXPECT_EQ(n->status, NodeStatus::kUnbonding);
  EXPECT_EQ(n->stake, 0u);
  auto a = chain_->GetAccount(alice_.public_key());
  ASSERT_EQ(a->unbonding.size(), 1u);
  EXPECT_EQ(a->unbonding[0].amount, 300u);
  EXPECT_EQ(a->unbonding[0].release_height, chain_->Height() + genesis_.params.unbonding_delay_blocks);
  EXPECT_EQ(chain_->GetTotals().unbonding, 300u);
  // Leaving twice, heartbeating or staking after leaving fail.
  EXPECT_FALSE(Run(Tx(alice_, LeaveNodeTx{.node_id = node1_.public_key()})).ok);
  EXPECT_FALSE(Run(Tx(alice_, HeartbeatTx{.node_id = node1_.public_key()})).ok);
  EXPECT_FALSE(Run(Tx(alice_, StakeTx{.node_id = node1_.public_key(), .amount = 5})).ok);
  // Someone else cannot take the id; the owner can come back and keeps the record.
  EXPECT_FALSE(Run(Tx(bob_, Reg(node1_))).ok);
  Receipt r = Run(Tx(alice_, Reg(node1_, 100)));
  ASSERT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->status, NodeStatus::kActive);
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->reputation.joined_height, 1u);
}

NodeLink Link(const KeyPair& peer, uint32_t latency_ms, uint64_t bandwidth) {
  return NodeLink{
      .peer = peer.public_key(), .latency_ms = latency_ms, .bandwidth_bytes_per_s = bandwidth};
}

Bytes EncodedNode(const NodeRecord& n) {
  Encoder e;
  EncodeNode(e, n);
  return e.Take();
}

TEST_F(NodesTest, ReportLinksIsStoredSortedReplacesTheLastReportAndSurvivesAReopen) {
  KeyPair node3 = TestKey(52);
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  ASSERT_TRUE(Run(Tx(alice_, Reg(node2_))).ok);
  ASSERT_TRUE(Run(Tx(alice_, Reg(node3))).ok);
  const Bytes before = EncodedNode(*chain_->GetNode(node1_.public_key()));
  const std::vector<NodeLink> sent = {Link(node3, 7, 5'000'000), Link(node2_, 2, 125'000'000)};
  Receipt r = Run(Tx(alice_, ReportLinksTx{.node_id = node1_.public_key(), .links = sent}));
  ASSERT_TRUE(r.ok) << r.reason;
  std::vector<NodeLink> sorted = sent;
  std::sort(sorted.begin(), sorted.end(),
            [](const NodeLink& a, const NodeLink& b) { return a.peer < b.peer; });
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->links, sorted);
  nlohmann::json j = NodeToJson(*chain_->GetNode(node1_.public_key()));
  ASSERT_EQ(j["links"].size(), 2u);
  EXPECT_EQ(j["links"][0]["peer"], sorted[0].peer.ToHex());
  // The database holds them (the record's optional tail).
  Reopen();
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->links, sorted);
  // A report replaces the last one (the node itself may send it, as its owner may; its account
  // must exist to hold its nonce).
  ASSERT_TRUE(Run(Tx(alice_, TransferTx{.to = node1_.public_key(), .amount = 10})).ok);
  r = Run(Tx(node1_,
             ReportLinksTx{.node_id = node1_.public_key(), .links = {Link(node3, 1, 9'000'000)}}));
  ASSERT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->links,
            (std::vector<NodeLink>{Link(node3, 1, 9'000'000)}));
  // An empty report withdraws them: the record encodes exactly as before it ever reported (a
  // chain whose nodes never report keeps the state hash it had before links existed).
  ASSERT_TRUE(Run(Tx(alice_, ReportLinksTx{.node_id = node1_.public_key()})).ok);
  EXPECT_TRUE(chain_->GetNode(node1_.public_key())->links.empty());
  EXPECT_EQ(EncodedNode(*chain_->GetNode(node1_.public_key())), before);
  // The scheduler sees them (network.cc's NodeViews) only through the record: checked in
  // pipeline_stage_test.cc.
}

TEST_F(NodesTest, ANodeRecordWithAnEmptyLinksTailIsRefused) {
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  NodeRecord n = *chain_->GetNode(node1_.public_key());
  Encoder e;
  EncodeNode(e, n);
  e.PutU32(0);  // a links tail with no links: a second encoding of the same record
  Bytes bytes = e.Take();
  Decoder d(bytes);
  NodeRecord back;
  Status s = DecodeNode(d, &back);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  // With links it round-trips.
  n.links = {Link(node2_, 3, 10)};
  Bytes with = EncodedNode(n);
  Decoder d2(with);
  NodeRecord back2;
  ASSERT_TRUE(DecodeNode(d2, &back2).ok());
  EXPECT_EQ(back2, n);
}

// The disk a node declares (capabilities.disk_bytes, which stage placement reads) goes in the
// record's optional tail, after the links (their count then written even if 0): a record that
// declares none encodes exactly as before the field (databases written then still load, state
// hashes of chains without it are unchanged), and a tail that writes 0 is a second encoding.
TEST_F(NodesTest, ADeclaredDiskIsTheRecordsTailAndARecordWithoutOneEncodesAsBefore) {
  RegisterNodeTx reg = Reg(node1_);
  reg.capabilities.disk_bytes = 7ull << 30;
  ASSERT_TRUE(Run(Tx(alice_, reg)).ok);
  NodeRecord n = *chain_->GetNode(node1_.public_key());
  EXPECT_EQ(n.capabilities.disk_bytes, 7ull << 30);
  EXPECT_EQ(NodeToJson(n)["capabilities"]["disk_bytes"], 7ull << 30);
  NodeRecord none = n;
  none.capabilities.disk_bytes = 0;
  Encoder tail;
  tail.PutU32(0).PutU64(7ull << 30);  // no links, then the disk
  // The declared record is the undeclared one and the tail: the disk is nowhere else.
  Bytes want = EncodedNode(none);
  const Bytes tail_bytes = tail.Take();
  want.insert(want.end(), tail_bytes.begin(), tail_bytes.end());
  EXPECT_EQ(EncodedNode(n), want);
  // With links the tail holds them, then the disk; both round-trip.
  n.links = {Link(node2_, 3, 10)};
  for (const NodeRecord& r : {n, none}) {
    Bytes bytes = EncodedNode(r);
    Decoder d(bytes);
    NodeRecord back;
    ASSERT_TRUE(DecodeNode(d, &back).ok());
    EXPECT_EQ(back, r);
  }
  // A tail that writes a disk of 0 is refused.
  Encoder zero;
  EncodeNode(zero, none);
  zero.PutU32(0).PutU64(0);
  Bytes zero_bytes = zero.Take();
  Decoder dz(zero_bytes);
  NodeRecord back;
  Status s = DecodeNode(dz, &back);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("disk_bytes"), std::string::npos) << s.ToString();
  // UpdateNode declares another disk; the record keeps it across a reopen.
  UpdateNodeTx update{.node_id = node1_.public_key(),
                      .endpoint = reg.endpoint,
                      .roles = reg.roles,
                      .capabilities = reg.capabilities,
                      .price = reg.price};
  update.capabilities.disk_bytes = 3ull << 30;
  ASSERT_TRUE(Run(Tx(alice_, update)).ok);
  Reopen();
  EXPECT_EQ(chain_->GetNode(node1_.public_key())->capabilities.disk_bytes, 3ull << 30);
}

TEST_F(NodesTest, ReportLinksRefusesEachBadInputNamingIt) {
  KeyPair stranger = TestKey(53);
  ASSERT_TRUE(Run(Tx(alice_, Reg(node1_))).ok);
  ASSERT_TRUE(Run(Tx(alice_, Reg(node2_))).ok);
  auto refused = [&](const KeyPair& from, std::vector<NodeLink> links, const std::string& want) {
    Receipt r = Run(Tx(from, ReportLinksTx{.node_id = node1_.public_key(), .links = links}));
    EXPECT_FALSE(r.ok) << want;
    EXPECT_NE(r.reason.find(want), std::string::npos) << r.reason;
  };
  refused(bob_, {Link(node2_, 1, 1)}, "the sender must be node");
  refused(alice_, {Link(node2_, 1, 1), Link(node1_, 1, 1)},
          "links[1] is to node " + node1_.public_key().ShortHex() + " itself");
  refused(alice_, {Link(stranger, 1, 1)},
          "links[0].peer " + stranger.public_key().ToHex() + " is not a registered node");
  refused(alice_, {Link(node2_, 1, 0)}, "links[0].bandwidth_bytes_per_s is 0");
  refused(alice_, {Link(node2_, 1, protocol::kMaxLinkBandwidthBytesPerS + 1)},
          "links[0].bandwidth_bytes_per_s 1000000000001 is above 1000000000000");
  refused(alice_, {Link(node2_, protocol::kMaxLinkLatencyMs + 1, 1)},
          "links[0].latency_ms 60001 is above 60000");
  refused(alice_, {Link(node2_, 1, 5), Link(node2_, 2, 6)},
          "peer " + node2_.public_key().ShortHex() + " appears more than once");
  std::vector<NodeLink> many(protocol::kMaxNodeLinks + 1, Link(node2_, 1, 1));
  refused(alice_, many, "65 links, at most 64");
  EXPECT_TRUE(chain_->GetNode(node1_.public_key())->links.empty());
  // A node that left reports nothing.
  ASSERT_TRUE(Run(Tx(alice_, LeaveNodeTx{.node_id = node1_.public_key()})).ok);
  refused(alice_, {Link(node2_, 1, 1)}, "has left");
}

}  // namespace
}  // namespace meshlearn::ledger
