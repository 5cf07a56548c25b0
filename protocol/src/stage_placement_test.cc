// Placing pipeline stages by memory and speed (stage_placement.h): a stage only on a node that
// holds it, heavier stages on faster nodes, a placement whenever one exists (against exhaustive
// search), the same answer whatever the order of the nodes, and a clear error when none exists;
// then reported links pair consecutive stages at the least total cost (against exhaustive search
// of every chaining).
#include "meshlearn/protocol/stage_placement.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/rng.h"

namespace meshlearn::protocol {
namespace {

constexpr uint64_t kPlaceHeight = 100;

TaskSpecView PlaceTask() {
  TaskSpecView t;
  t.id = Blake2b("placement task");
  t.price_cap_per_gflop = 10;
  return t;
}

NodeView PlaceNode(uint32_t i, uint64_t memory, uint64_t flops) {
  NodeView n;
  n.id.bytes.fill(0);
  n.id.bytes[0] = static_cast<uint8_t>(i);
  n.id.bytes[1] = static_cast<uint8_t>(i >> 8);
  n.memory_bytes = memory;
  n.throughput_flops = flops;
  n.bandwidth_bytes_per_s = 1'000'000'000;
  n.price_per_gflop = 5;
  n.last_heartbeat_height = kPlaceHeight - 1;
  return n;
}

// What each boundary moves when a test does not say: 1 MiB, the constant the link cost used
// before the task's own bytes were on the chain.
constexpr uint64_t kPlaceBoundaryBytes = 1u << 20;

// `bytes`: per boundary; empty: kPlaceBoundaryBytes at each.
Result<std::vector<std::vector<NodeId>>> Place(const std::vector<StageNeed>& stages,
                                               uint32_t replicas,
                                               const std::vector<NodeView>& nodes,
                                               std::vector<uint64_t> bytes = {}) {
  if (bytes.empty() && !stages.empty()) bytes.assign(stages.size() - 1, kPlaceBoundaryBytes);
  return PlaceStages(PlaceTask(), stages, bytes, replicas, nodes, kPlaceHeight, SchedulerParams{});
}

// Every slot filled by a distinct node whose memory holds its stage.
void PlaceExpectValid(const std::vector<std::vector<NodeId>>& chains,
                      const std::vector<StageNeed>& stages, const std::vector<NodeView>& nodes) {
  std::map<NodeId, const NodeView*> by_id;
  for (const NodeView& n : nodes) by_id[n.id] = &n;
  std::set<NodeId> used;
  for (const std::vector<NodeId>& chain : chains) {
    ASSERT_EQ(chain.size(), stages.size());
    for (size_t s = 0; s < chain.size(); ++s) {
      ASSERT_TRUE(by_id.count(chain[s])) << "a node that is not in the list";
      EXPECT_GE(by_id[chain[s]]->memory_bytes, stages[s].memory_bytes) << "stage " << s;
      EXPECT_TRUE(used.insert(chain[s]).second) << "a node placed twice";
    }
  }
}

TEST(StagePlacementTest, HeavierStagesGoToFasterNodes) {
  const std::vector<StageNeed> stages = {{100, 10}, {100, 30}, {100, 20}};
  const std::vector<NodeView> nodes = {PlaceNode(1, 1000, 100), PlaceNode(2, 1000, 300),
                                       PlaceNode(3, 1000, 200), PlaceNode(4, 1000, 50)};
  Result<std::vector<std::vector<NodeId>>> r = Place(stages, 1, nodes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0][1], nodes[1].id);  // the heaviest stage: the fastest node
  EXPECT_EQ((*r)[0][2], nodes[2].id);
  EXPECT_EQ((*r)[0][0], nodes[0].id);  // the slowest node (4) is left out
}

TEST(StagePlacementTest, AStageGoesOnlyToANodeThatHoldsIt) {
  // Stage 0 is light but big (the GPT's embeddings); only nodes 5 and 6 hold it, and node 5 is
  // the fastest: it must still go to stage 0 of one replica, not to the heavier stage 1.
  const std::vector<StageNeed> stages = {{900, 10}, {100, 50}, {100, 20}};
  const std::vector<NodeView> nodes = {PlaceNode(1, 200, 100),  PlaceNode(2, 200, 90),
                                       PlaceNode(3, 200, 80),   PlaceNode(4, 200, 70),
                                       PlaceNode(5, 1000, 500), PlaceNode(6, 950, 10)};
  Result<std::vector<std::vector<NodeId>>> r = Place(stages, 2, nodes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  PlaceExpectValid(*r, stages, nodes);
  std::set<NodeId> stage0 = {(*r)[0][0], (*r)[1][0]};
  EXPECT_EQ(stage0, (std::set<NodeId>{nodes[4].id, nodes[5].id}));
  // The heavier stage 1 gets the fastest of the small nodes, one per replica.
  std::set<NodeId> stage1 = {(*r)[0][1], (*r)[1][1]};
  EXPECT_EQ(stage1, (std::set<NodeId>{nodes[0].id, nodes[1].id}));
}

TEST(StagePlacementTest, IneligibleNodesAreLeftOutAndNodeOrderDoesNotMatter) {
  const std::vector<StageNeed> stages = {{100, 10}, {100, 20}};
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 100), PlaceNode(2, 1000, 900),
                                 PlaceNode(3, 1000, 800), PlaceNode(4, 1000, 50),
                                 PlaceNode(5, 50, 1000)};  // too small for any stage
  nodes[1].status = NodeStatus::kNodeStatusJailed;
  nodes[2].last_heartbeat_height = 1;  // stale
  Result<std::vector<std::vector<NodeId>>> r = Place(stages, 1, nodes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0][1], nodes[0].id);
  EXPECT_EQ((*r)[0][0], nodes[3].id);
  std::vector<NodeView> reversed(nodes.rbegin(), nodes.rend());
  Result<std::vector<std::vector<NodeId>>> again = Place(stages, 1, reversed);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *r);
}

TEST(StagePlacementTest, NoPlacementIsAnErrorNamingTheStageAndTheFix) {
  const std::vector<StageNeed> stages = {{900, 10}, {100, 50}};
  const std::vector<NodeView> nodes = {PlaceNode(1, 1000, 100), PlaceNode(2, 200, 100),
                                       PlaceNode(3, 200, 100), PlaceNode(4, 200, 100)};
  Result<std::vector<std::vector<NodeId>>> r = Place(stages, 2, nodes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("stage 0 needs 900 bytes of memory; 1 of the 4 eligible "
                                      "nodes hold that much, and 2 stage slots (2 replicas)"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("cut the model into more stages"), std::string::npos);
  EXPECT_FALSE(Place({}, 1, nodes).ok());
  EXPECT_FALSE(Place(stages, 0, nodes).ok());
}

// A node that declares a disk (NodeView::disk_bytes) gets a stage only if the disk holds the
// stage's files for its H steps (StageDiskBytes: H x the stage's memory need); one that
// declares none (0) is not checked.
TEST(StagePlacementTest, AStageGoesOnlyToANodeWhoseDeclaredDiskHoldsItsFiles) {
  TaskSpecView task = PlaceTask();
  task.inner_steps = 50;
  const std::vector<StageNeed> stages = {{100, 10}};
  EXPECT_EQ(StageDiskBytes(100, 50), 5000u);
  EXPECT_EQ(StageDiskBytes(100, 0), 100u);
  EXPECT_EQ(StageDiskBytes(UINT64_MAX / 2, 3), UINT64_MAX);
  // The fastest node's disk holds 49 steps of the stage's files: it is passed over for the next,
  // whose disk holds 50 exactly.
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 500), PlaceNode(2, 1000, 100),
                                 PlaceNode(3, 1000, 50)};
  nodes[0].disk_bytes = 4999;
  nodes[1].disk_bytes = 5000;
  EXPECT_EQ(StageHoldBytes(nodes[0], 50), 99u);
  EXPECT_EQ(StageHoldBytes(nodes[1], 50), 100u);
  EXPECT_EQ(StageHoldBytes(nodes[2], 50), 1000u);  // none declared: its memory
  Result<std::vector<std::vector<NodeId>>> r =
      PlaceStages(task, stages, {}, 1, nodes, kPlaceHeight, SchedulerParams{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0][0], nodes[1].id);
  // Without node 2, the node that declares no disk takes it.
  r = PlaceStages(task, stages, {}, 1, std::vector<NodeView>{nodes[0], nodes[2]}, kPlaceHeight,
                  SchedulerParams{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0][0], nodes[2].id);
  // With node 1 alone there is no placement, and the error names the disk the stage needs.
  r = PlaceStages(task, stages, {}, 1, std::vector<NodeView>{nodes[0]}, kPlaceHeight,
                  SchedulerParams{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("stage 0 needs 100 bytes of memory; 0 of the"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("5000 bytes or more of disk for the stage's files"),
            std::string::npos)
      << r.status().ToString();
}

// A node keeps the files of every stage unit it holds until the unit's round is final, so its
// declared disk is offered net of them (NodeView::disk_held_bytes, the ledger's sum): a node
// whose disk holds one unit's files but not two, holding one, gets no second; once the first's
// files stop counting, it does. The refusal names it with its figures.
TEST(StagePlacementTest, ANodesDiskIsOfferedNetOfTheStageUnitsItHolds) {
  TaskSpecView task = PlaceTask();
  task.inner_steps = 50;
  const std::vector<StageNeed> stages = {{100, 10}};
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 500)};
  nodes[0].disk_bytes = 2 * StageDiskBytes(100, 50) - 1;  // one unit's files, not two
  nodes[0].disk_held_bytes = StageDiskBytes(100, 50);     // it holds one
  EXPECT_EQ(StageHoldBytes(nodes[0], 50), 99u);
  Result<std::vector<std::vector<NodeId>>> r =
      PlaceStages(task, stages, {}, 1, nodes, kPlaceHeight, SchedulerParams{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(
                "0 of the 0 eligible nodes hold that much, and 1 stage slots (1 replicas) need at "
                "least that much; 1 node(s) whose memory holds it are short of disk for its files "
                "(node " +
                nodes[0].id.ShortHex() +
                " declares 9999 bytes of disk, 5000 of them held by the files of the stage units "
                "it holds): add nodes"),
            std::string::npos)
      << r.status().ToString();
  // Held files that take the whole disk, or more (a smaller disk declared since), leave nothing.
  nodes[0].disk_held_bytes = 20000;
  EXPECT_EQ(StageHoldBytes(nodes[0], 50), 0u);
  // The first unit's files no longer count: it takes the stage.
  nodes[0].disk_held_bytes = 0;
  EXPECT_EQ(StageHoldBytes(nodes[0], 50), 199u);
  r = PlaceStages(task, stages, {}, 1, nodes, kPlaceHeight, SchedulerParams{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0][0], nodes[0].id);
  // A node that declares no disk is not checked, whatever it holds.
  nodes[0].disk_bytes = 0;
  nodes[0].disk_held_bytes = 20000;
  EXPECT_EQ(StageHoldBytes(nodes[0], 50), 1000u);
}

// Exhaustive search: is there any assignment of distinct nodes to the slots that fits memory?
bool PlaceBruteForce(const std::vector<uint64_t>& needs, const std::vector<uint64_t>& memories,
                     std::vector<bool>& used, size_t slot) {
  if (slot == needs.size()) return true;
  for (size_t j = 0; j < memories.size(); ++j) {
    if (used[j] || memories[j] < needs[slot]) continue;
    used[j] = true;
    const bool ok = PlaceBruteForce(needs, memories, used, slot + 1);
    used[j] = false;
    if (ok) return true;
  }
  return false;
}

TEST(StagePlacementTest, PlacesWheneverExhaustiveSearchCan) {
  Rng rng(15);
  int placed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t S = 1 + rng.Uniform(3);
    const uint32_t R = 1 + static_cast<uint32_t>(rng.Uniform(2));
    const size_t N = rng.Uniform(8);
    std::vector<StageNeed> stages;
    for (size_t s = 0; s < S; ++s) stages.push_back({1 + rng.Uniform(10), rng.Uniform(5)});
    std::vector<NodeView> nodes;
    for (size_t i = 0; i < N; ++i) {
      nodes.push_back(
          PlaceNode(static_cast<uint32_t>(i + 1), 1 + rng.Uniform(10), 1 + rng.Uniform(4)));
    }
    std::vector<uint64_t> needs, memories;
    for (uint32_t r = 0; r < R; ++r) {
      for (const StageNeed& s : stages) needs.push_back(s.memory_bytes);
    }
    for (const NodeView& n : nodes) memories.push_back(n.memory_bytes);
    std::vector<bool> used(N, false);
    const bool possible = PlaceBruteForce(needs, memories, used, 0);
    Result<std::vector<std::vector<NodeId>>> r = Place(stages, R, nodes);
    ASSERT_EQ(r.ok(), possible) << "trial " << trial << ": " << r.status().ToString();
    if (r.ok()) {
      ++placed;
      PlaceExpectValid(*r, stages, nodes);
    }
  }
  EXPECT_GT(placed, 50);
  EXPECT_LT(placed, 350);  // both outcomes are exercised
}

// Gives `from` a reported link to `to` (kept sorted by peer, as the ledger keeps them).
void PlaceLink(NodeView& from, const NodeView& to, uint32_t latency_ms, uint64_t bandwidth) {
  from.links.push_back({to.id, latency_ms, bandwidth});
  std::sort(from.links.begin(), from.links.end(),
            [](const PeerLink& a, const PeerLink& b) { return a.peer < b.peer; });
}

// The nodes of each stage, whatever replica they serve.
std::vector<std::set<NodeId>> PlaceStageSets(const std::vector<std::vector<NodeId>>& chains) {
  std::vector<std::set<NodeId>> sets(chains.empty() ? 0 : chains[0].size());
  for (const std::vector<NodeId>& chain : chains) {
    for (size_t s = 0; s < chain.size(); ++s) sets[s].insert(chain[s]);
  }
  return sets;
}

// Each stage's (throughput, memory) pairs, sorted: what the memory and speed rules decide.
std::vector<std::vector<std::pair<uint64_t, uint64_t>>> PlaceStageClasses(
    const std::vector<std::vector<NodeId>>& chains, const std::vector<NodeView>& nodes) {
  std::map<NodeId, const NodeView*> by_id;
  for (const NodeView& n : nodes) by_id[n.id] = &n;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> out(chains.empty() ? 0
                                                                             : chains[0].size());
  for (const std::vector<NodeId>& chain : chains) {
    for (size_t s = 0; s < chain.size(); ++s) {
      out[s].push_back({by_id.at(chain[s])->throughput_flops, by_id.at(chain[s])->memory_bytes});
    }
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

TEST(StagePlacementTest, LinksChooseAmongNodesTheRulesFindEqual) {
  // One replica of two stages. Node 1 is the fastest (stage 0, the heavier); nodes 2 and 3 are
  // equal, so without links stage 1 takes node 2 (the smaller id). Node 4 is slower and node 5
  // as fast as 2 and 3 but with more memory: the rules rank both below them.
  const std::vector<StageNeed> stages = {{100, 20}, {100, 10}};
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 300), PlaceNode(2, 1000, 200),
                                 PlaceNode(3, 1000, 200), PlaceNode(4, 1000, 100),
                                 PlaceNode(5, 2000, 200)};
  for (NodeView& n : nodes) n.latency_ms = 10;  // an unreported link: 20 ms (both registered)
  Result<std::vector<std::vector<NodeId>>> plain = Place(stages, 1, nodes);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_EQ(*plain, (std::vector<std::vector<NodeId>>{{nodes[0].id, nodes[1].id}}));
  // Node 1 measured fast links to 3, 4 and 5 and a slow one to 2: stage 1 goes to node 3, its
  // equal; never to 4 (slower) or 5 (more memory), whatever their links.
  PlaceLink(nodes[0], nodes[1], 90, 1'000'000'000);
  PlaceLink(nodes[0], nodes[2], 5, 1'000'000'000);
  PlaceLink(nodes[0], nodes[3], 1, 1'000'000'000);
  PlaceLink(nodes[0], nodes[4], 1, 1'000'000'000);
  Result<std::vector<std::vector<NodeId>>> linked = Place(stages, 1, nodes);
  ASSERT_TRUE(linked.ok());
  EXPECT_EQ(*linked, (std::vector<std::vector<NodeId>>{{nodes[0].id, nodes[2].id}}));
  // Two replicas of three equal stages on six equal nodes: without links 1 -> 3 -> 5 and
  // 2 -> 4 -> 6. Node 1 measured a fast link to node 6 (placed on stage 2) and node 2 one to
  // node 5: stage 1 takes 6 and 5, and stage 2, whose nodes those were, takes 3 and 4.
  std::vector<NodeView> six;
  for (uint32_t i = 1; i <= 6; ++i) {
    six.push_back(PlaceNode(i, 1000, 100));
    six.back().latency_ms = 10;
  }
  const std::vector<StageNeed> three = {{100, 10}, {100, 10}, {100, 10}};
  Result<std::vector<std::vector<NodeId>>> before = Place(three, 2, six);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(*before, (std::vector<std::vector<NodeId>>{{six[0].id, six[2].id, six[4].id},
                                                       {six[1].id, six[3].id, six[5].id}}));
  PlaceLink(six[0], six[5], 1, 1'000'000'000);
  PlaceLink(six[1], six[4], 1, 1'000'000'000);
  Result<std::vector<std::vector<NodeId>>> after = Place(three, 2, six);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, (std::vector<std::vector<NodeId>>{{six[0].id, six[5].id, six[2].id},
                                                      {six[1].id, six[4].id, six[3].id}}));
  std::vector<NodeView> reversed(six.rbegin(), six.rend());
  EXPECT_EQ(*Place(three, 2, reversed), *after);
}

TEST(StagePlacementTest, ReportedLinksPairConsecutiveStages) {
  // Two replicas of two equal stages on four equal nodes: without links replica 0 gets nodes 1
  // (stage 0) and 3 (stage 1), replica 1 nodes 2 and 4 (the id order).
  const std::vector<StageNeed> stages = {{100, 10}, {100, 10}};
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 100), PlaceNode(2, 1000, 100),
                                 PlaceNode(3, 1000, 100), PlaceNode(4, 1000, 100)};
  for (NodeView& n : nodes) n.latency_ms = 10;  // an unreported link: 20 ms (both registered)
  Result<std::vector<std::vector<NodeId>>> before = Place(stages, 2, nodes);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const std::vector<std::vector<NodeId>> today = {{nodes[0].id, nodes[2].id},
                                                  {nodes[1].id, nodes[3].id}};
  EXPECT_EQ(*before, today);
  // Node 1 measured a fast link to node 4, and node 3 (a receiver) one to node 2: the chains
  // follow them, 1 -> 4 and 2 -> 3.
  PlaceLink(nodes[0], nodes[3], 1, 1'000'000'000);
  PlaceLink(nodes[2], nodes[1], 2, 1'000'000'000);
  Result<std::vector<std::vector<NodeId>>> after = Place(stages, 2, nodes);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const std::vector<std::vector<NodeId>> linked = {{nodes[0].id, nodes[3].id},
                                                   {nodes[1].id, nodes[2].id}};
  EXPECT_EQ(*after, linked);
  // The same answer whatever the order of the nodes.
  std::vector<NodeView> reversed(nodes.rbegin(), nodes.rend());
  Result<std::vector<std::vector<NodeId>>> again = Place(stages, 2, reversed);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *after);
  // A slow reported link loses to the registered estimate of an unreported one (10 ms + 10 ms
  // at 1 GB/s): node 1's link to node 4 now takes 50 ms, so node 1 pairs with node 3 again.
  nodes[0].links.clear();
  nodes[2].links.clear();
  PlaceLink(nodes[0], nodes[3], 50, 1'000'000'000);
  Result<std::vector<std::vector<NodeId>>> slow = Place(stages, 2, nodes);
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(*slow, today);
}

TEST(StagePlacementTest, PairingMinimisesTheBoundarysTotalNotItsCheapestLink) {
  // Two replicas of two equal stages on four equal nodes (replica 0: 1 -> 3, replica 1: 2 -> 4
  // without links). The cheapest link, 1 -> 3 (1 ms), would leave 2 -> 4 (100 ms): 101 ms in
  // all. Pairing 1 -> 4 and 2 -> 3 (2 ms each) costs 4 ms, so the boundary takes that, though
  // its best link goes unused.
  const std::vector<StageNeed> stages = {{100, 10}, {100, 10}};
  std::vector<NodeView> nodes = {PlaceNode(1, 1000, 100), PlaceNode(2, 1000, 100),
                                 PlaceNode(3, 1000, 100), PlaceNode(4, 1000, 100)};
  PlaceLink(nodes[0], nodes[2], 1, 1'000'000'000);
  PlaceLink(nodes[0], nodes[3], 2, 1'000'000'000);
  PlaceLink(nodes[1], nodes[2], 2, 1'000'000'000);
  PlaceLink(nodes[1], nodes[3], 100, 1'000'000'000);
  Result<std::vector<std::vector<NodeId>>> r = Place(stages, 2, nodes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<std::vector<NodeId>> best = {{nodes[0].id, nodes[3].id},
                                                 {nodes[1].id, nodes[2].id}};
  EXPECT_EQ(*r, best);
  // Equal totals keep the order placed: with every link 5 ms, replica 0 keeps node 3.
  for (NodeView& n : nodes) n.links.clear();
  for (size_t from = 0; from < 2; ++from) {
    for (size_t to = 2; to < 4; ++to) PlaceLink(nodes[from], nodes[to], 5, 1'000'000'000);
  }
  Result<std::vector<std::vector<NodeId>>> tied = Place(stages, 2, nodes);
  ASSERT_TRUE(tied.ok());
  const std::vector<std::vector<NodeId>> placed = {{nodes[0].id, nodes[2].id},
                                                   {nodes[1].id, nodes[3].id}};
  EXPECT_EQ(*tied, placed);
}

TEST(StagePlacementTest, LinkCostUsesTheReportThenTheReverseThenTheRegisteredFigures) {
  NodeView a = PlaceNode(1, 1000, 100), b = PlaceNode(2, 1000, 100);
  a.latency_ms = 3;
  b.latency_ms = 4;
  b.bandwidth_bytes_per_s = 1u << 20;  // the smaller: 1 MiB/s, so the transfer is 1 s
  EXPECT_EQ(StageLinkCostUs(a, b, 1u << 20), 7'000u + 1'000'000u);
  PlaceLink(b, a, 2, 2u << 20);  // the reverse direction's report
  EXPECT_EQ(StageLinkCostUs(a, b, 1u << 20), 2'000u + 500'000u);
  PlaceLink(a, b, 1, 4u << 20);  // the sender's own report wins
  EXPECT_EQ(StageLinkCostUs(a, b, 1u << 20), 1'000u + 250'000u);
  // The transfer is the boundary's bytes over the bandwidth, rounded up: 100 MiB take 25 s,
  // 1 byte one microsecond, none nothing.
  EXPECT_EQ(StageLinkCostUs(a, b, 100u << 20), 1'000u + 25'000'000u);
  EXPECT_EQ(StageLinkCostUs(a, b, 1), 1'000u + 1u);
  EXPECT_EQ(StageLinkCostUs(a, b, 0), 1'000u);
  // The largest boundary over the slowest link stops at kMaxStageTransferUs, and the fastest
  // registered bandwidth (near 2^64) does not overflow the rounding.
  a.links.clear();
  b.links.clear();
  b.bandwidth_bytes_per_s = 1;
  EXPECT_EQ(StageLinkCostUs(a, b, kMaxStageBoundaryBytes), 7'000u + kMaxStageTransferUs);
  a.bandwidth_bytes_per_s = b.bandwidth_bytes_per_s = UINT64_MAX;
  EXPECT_EQ(StageLinkCostUs(a, b, kMaxStageBoundaryBytes), 7'000u + 1u);
}

TEST(StagePlacementTest, EachBoundaryWeighsItsLinksByTheBytesItMoves) {
  // Two replicas of three stages on six nodes of distinct speeds: without links replica 0 gets
  // nodes 1 -> 3 -> 5, replica 1 nodes 2 -> 4 -> 6. At both boundaries the straight pairs (1-3,
  // 2-4; 3-5, 4-6) are near but slow (1 ms, 10 MB/s), the crossed ones (1-4, 2-3; 3-6, 4-5) far
  // but fast (50 ms, 1 GB/s).
  const std::vector<StageNeed> stages = {{100, 30}, {100, 20}, {100, 10}};
  std::vector<NodeView> nodes;
  for (uint32_t i = 1; i <= 6; ++i) nodes.push_back(PlaceNode(i, 1000, (7 - i) * 100));
  auto ids = [&](std::vector<size_t> chain) {
    std::vector<NodeId> out;
    for (size_t i : chain) out.push_back(nodes[i - 1].id);
    return out;
  };
  Result<std::vector<std::vector<NodeId>>> plain = Place(stages, 2, nodes);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_EQ(*plain, (std::vector<std::vector<NodeId>>{ids({1, 3, 5}), ids({2, 4, 6})}));
  for (auto [from, to] : {std::pair{1, 3}, {2, 4}, {3, 5}, {4, 6}}) {
    PlaceLink(nodes[from - 1], nodes[to - 1], 1, 10'000'000);
  }
  for (auto [from, to] : {std::pair{1, 4}, {2, 3}, {3, 6}, {4, 5}}) {
    PlaceLink(nodes[from - 1], nodes[to - 1], 50, 1'000'000'000);
  }
  // 1 MiB at both boundaries (the old constant): bandwidth rules both (a straight pair 1 ms +
  // 104.9 ms, a crossed one 50 ms + 1 ms), so both cross: 1 -> 4 -> 5 and 2 -> 3 -> 6.
  Result<std::vector<std::vector<NodeId>>> mib = Place(stages, 2, nodes);
  ASSERT_TRUE(mib.ok());
  EXPECT_EQ(*mib, (std::vector<std::vector<NodeId>>{ids({1, 4, 5}), ids({2, 3, 6})}));
  // The task's own bytes: 1 KiB across the first boundary (latency rules: straight, 1.1 ms
  // against 50 ms), 100 MiB across the second (bandwidth rules: crossed, 0.15 s against 10.5 s).
  Result<std::vector<std::vector<NodeId>>> own = Place(stages, 2, nodes, {1u << 10, 100u << 20});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, (std::vector<std::vector<NodeId>>{ids({1, 3, 6}), ids({2, 4, 5})}));
  // The other way round: crossed, then straight.
  Result<std::vector<std::vector<NodeId>>> swapped =
      Place(stages, 2, nodes, {100u << 20, 1u << 10});
  ASSERT_TRUE(swapped.ok());
  EXPECT_EQ(*swapped, (std::vector<std::vector<NodeId>>{ids({1, 4, 6}), ids({2, 3, 5})}));
  // A boundary across which nothing is sent keeps the order of the memory and speed rules there.
  Result<std::vector<std::vector<NodeId>>> none = Place(stages, 2, nodes, {0, 100u << 20});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, (std::vector<std::vector<NodeId>>{ids({1, 3, 6}), ids({2, 4, 5})}));
  // One count per boundary, each at most kMaxStageBoundaryBytes.
  Result<std::vector<std::vector<NodeId>>> short_list = Place(stages, 2, nodes, {1u << 10});
  ASSERT_FALSE(short_list.ok());
  EXPECT_NE(short_list.status().message().find("3 stages need 2 boundary byte counts, got 1"),
            std::string::npos)
      << short_list.status().ToString();
  Result<std::vector<std::vector<NodeId>>> huge =
      Place(stages, 2, nodes, {1, kMaxStageBoundaryBytes + 1});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("boundary 1 moves"), std::string::npos)
      << huge.status().ToString();
}

TEST(StagePlacementTest, LinksOffTheChainsLeaveThePlacementAsItWas) {
  // Links between nodes of the same stage, or to a node left out, pair nothing: the chains stay
  // the placement without links.
  const std::vector<StageNeed> stages = {{100, 30}, {100, 20}, {100, 10}};
  std::vector<NodeView> nodes;
  for (uint32_t i = 1; i <= 7; ++i) nodes.push_back(PlaceNode(i, 1000, 100 * i));
  // Registered figures that would pair the stages otherwise were they used without a report:
  // nodes 5 and 6 are far from the network, so the cheapest estimate is 7 -> 4.
  nodes[4].latency_ms = 50;
  nodes[5].latency_ms = 50;
  Result<std::vector<std::vector<NodeId>>> plain = Place(stages, 2, nodes);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  // The slowest node (1) is left out; the fastest of each stage's two serves replica 0: 7 -> 5
  // -> 3 and 6 -> 4 -> 2, as before links existed.
  const std::vector<std::vector<NodeId>> today = {{nodes[6].id, nodes[4].id, nodes[2].id},
                                                  {nodes[5].id, nodes[3].id, nodes[1].id}};
  ASSERT_EQ(*plain, today);
  PlaceLink(nodes[6], nodes[5], 1, 1'000'000'000);  // same stage
  PlaceLink(nodes[1], nodes[0], 1, 1'000'000'000);  // to the node left out
  PlaceLink(nodes[0], nodes[4], 1, 1'000'000'000);  // from it
  Result<std::vector<std::vector<NodeId>>> linked = Place(stages, 2, nodes);
  ASSERT_TRUE(linked.ok());
  EXPECT_EQ(*linked, *plain);
}

TEST(StagePlacementTest, LinksKeepEveryStagesClassesAndPlaceWheneverExhaustiveSearchCan) {
  Rng rng(1515);
  int placed = 0, moved = 0, chosen = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t S = 1 + rng.Uniform(3);
    const uint32_t R = 1 + static_cast<uint32_t>(rng.Uniform(3));
    const size_t N = rng.Uniform(10);
    std::vector<StageNeed> stages;
    for (size_t s = 0; s < S; ++s) stages.push_back({1 + rng.Uniform(10), rng.Uniform(5)});
    std::vector<NodeView> nodes;
    for (size_t i = 0; i < N; ++i) {
      // Few memories and speeds, so nodes the rules find equal are common.
      nodes.push_back(
          PlaceNode(static_cast<uint32_t>(i + 1), 3 + 3 * rng.Uniform(3), 1 + rng.Uniform(2)));
      nodes.back().latency_ms = static_cast<uint32_t>(rng.Uniform(20));
    }
    std::vector<NodeView> linked = nodes;
    for (NodeView& from : linked) {
      for (const NodeView& to : nodes) {
        if (to.id != from.id && rng.Uniform(3) == 0) {
          PlaceLink(from, to, static_cast<uint32_t>(rng.Uniform(40)), 1 + rng.Uniform(1u << 22));
        }
      }
    }
    std::vector<uint64_t> needs, memories;
    for (uint32_t r = 0; r < R; ++r) {
      for (const StageNeed& s : stages) needs.push_back(s.memory_bytes);
    }
    for (const NodeView& n : nodes) memories.push_back(n.memory_bytes);
    std::vector<bool> used(N, false);
    const bool possible = PlaceBruteForce(needs, memories, used, 0);
    Result<std::vector<std::vector<NodeId>>> plain = Place(stages, R, nodes);
    Result<std::vector<std::vector<NodeId>>> r = Place(stages, R, linked);
    ASSERT_EQ(r.ok(), possible) << "trial " << trial << ": " << r.status().ToString();
    ASSERT_EQ(plain.ok(), possible) << "trial " << trial;
    if (!r.ok()) continue;
    ++placed;
    PlaceExpectValid(*r, stages, nodes);
    // Links choose which replica a stage's node serves, and which nodes serve it only among
    // nodes the memory and speed rules find equal: every stage has the same throughputs and
    // memories as without links. Replica r's first stage stays where it was.
    EXPECT_EQ(PlaceStageClasses(*r, nodes), PlaceStageClasses(*plain, nodes)) << "trial " << trial;
    for (uint32_t k = 0; k < R; ++k) EXPECT_EQ((*r)[k][0], (*plain)[k][0]) << "trial " << trial;
    moved += *r != *plain ? 1 : 0;
    chosen += PlaceStageSets(*r) != PlaceStageSets(*plain) ? 1 : 0;
    std::vector<NodeView> reversed(linked.rbegin(), linked.rend());
    Result<std::vector<std::vector<NodeId>>> again = Place(stages, R, reversed);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *r) << "trial " << trial;
  }
  EXPECT_GT(placed, 50);
  EXPECT_GT(moved, 10);  // links did reorder chains in some trials
  EXPECT_GT(chosen, 4);  // and chose other (equal) nodes for a stage in some (8 of 400)
}

// Whether any link is reported between a node of stage s-1 and one of stage s.
bool PlaceBoundaryReported(const std::map<NodeId, const NodeView*>& by_id,
                           const std::vector<std::vector<NodeId>>& chains, size_t s) {
  for (const std::vector<NodeId>& a : chains) {
    for (const std::vector<NodeId>& b : chains) {
      for (const auto& [x, y] : {std::pair{a[s - 1], b[s]}, std::pair{b[s], a[s - 1]}}) {
        for (const PeerLink& l : by_id.at(x)->links) {
          if (l.peer == y) return true;
        }
      }
    }
  }
  return false;
}

TEST(StagePlacementTest, PairingIsTheSmallestMinimumOfExhaustiveSearchOverTheWholeChain) {
  // Every way to chain the stages' nodes (stage 0 stays with its replica; each later stage's R
  // nodes in any order: (R!)^(S-1) chains), against the placement: its total link cost over the
  // boundaries where a link is reported is the minimum, and among the minima it is the first in
  // the order of the enumeration (each boundary's receivers listed by replica, the placed order
  // first), i.e. the documented tie-break. A boundary without reports keeps the order placed.
  Rng rng(63);
  int checked = 0, moved = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t S = 2 + rng.Uniform(2);
    const uint32_t R = 2 + static_cast<uint32_t>(rng.Uniform(3));
    std::vector<StageNeed> stages;
    for (size_t s = 0; s < S; ++s) stages.push_back({1 + rng.Uniform(4), rng.Uniform(3)});
    std::vector<NodeView> nodes;
    const size_t N = S * R + rng.Uniform(3);
    for (size_t i = 0; i < N; ++i) {
      nodes.push_back(
          PlaceNode(static_cast<uint32_t>(i + 1), 4 + rng.Uniform(3), 1 + rng.Uniform(3)));
      // A throughput of its own, so no two nodes are equal for the memory and speed rules and
      // links only pair (their choice among equal nodes: LinksChooseAmongNodesTheRulesFindEqual).
      nodes.back().throughput_flops = nodes.back().throughput_flops * 100 + i;
      nodes.back().latency_ms = static_cast<uint32_t>(rng.Uniform(4));
      nodes.back().bandwidth_bytes_per_s = 1u << 20;
    }
    const Result<std::vector<std::vector<NodeId>>> plain = Place(stages, R, nodes);
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    // Few distinct costs, so ties are common and the tie-break is exercised.
    for (NodeView& from : nodes) {
      for (const NodeView& to : nodes) {
        if (to.id != from.id && rng.Uniform(3) == 0) {
          PlaceLink(from, to, static_cast<uint32_t>(rng.Uniform(4)), (1 + rng.Uniform(2)) << 20);
        }
      }
    }
    // Each boundary moves its own bytes (none, 1 KiB, 1 MiB or 100 MiB), so latency rules some
    // boundaries and bandwidth others.
    std::vector<uint64_t> bytes;
    for (size_t s = 1; s < S; ++s) {
      const uint64_t sizes[] = {0, 1u << 10, 1u << 20, 100u << 20};
      bytes.push_back(sizes[rng.Uniform(4)]);
    }
    const Result<std::vector<std::vector<NodeId>>> r = Place(stages, R, nodes, bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::map<NodeId, const NodeView*> by_id;
    for (const NodeView& n : nodes) by_id[n.id] = &n;
    std::vector<bool> reported(S, false);
    for (size_t s = 1; s < S; ++s) {
      reported[s] = bytes[s - 1] != 0 && PlaceBoundaryReported(by_id, *plain, s);
    }
    auto total = [&](const std::vector<std::vector<NodeId>>& chains) {
      uint64_t sum = 0;
      for (size_t s = 1; s < S; ++s) {
        if (!reported[s]) continue;
        for (const std::vector<NodeId>& c : chains) {
          sum += StageLinkCostUs(*by_id.at(c[s - 1]), *by_id.at(c[s]), bytes[s - 1]);
        }
      }
      return sum;
    };
    // Enumerate the permutations of every reported boundary, the first boundary outermost.
    std::vector<std::vector<size_t>> perm(S);
    for (size_t s = 1; s < S; ++s) {
      for (size_t j = 0; j < R; ++j) perm[s].push_back(j);
    }
    std::vector<std::vector<NodeId>> best;
    uint64_t best_cost = 0;
    std::function<void(size_t)> enumerate = [&](size_t s) {
      if (s == S) {
        std::vector<std::vector<NodeId>> chains = *plain;
        for (size_t b = 1; b < S; ++b) {
          for (size_t k = 0; k < R; ++k) chains[k][b] = (*plain)[perm[b][k]][b];
        }
        const uint64_t cost = total(chains);
        if (best.empty() || cost < best_cost) {
          best = chains;
          best_cost = cost;
        }
        return;
      }
      std::sort(perm[s].begin(), perm[s].end());
      do {
        enumerate(s + 1);
      } while (reported[s] && std::next_permutation(perm[s].begin(), perm[s].end()));
    };
    enumerate(1);
    EXPECT_EQ(total(*r), best_cost) << "trial " << trial;
    EXPECT_EQ(*r, best) << "trial " << trial;
    ++checked;
    moved += *r != *plain ? 1 : 0;
  }
  EXPECT_EQ(checked, 300);
  EXPECT_GT(moved, 30);  // links did reorder chains
}

}  // namespace
}  // namespace meshlearn::protocol
