// Placing pipeline stages by memory and speed (stage_placement.h): a stage only on a node that
// holds it, heavier stages on faster nodes, a placement whenever one exists (against exhaustive
// search), the same answer whatever the order of the nodes, and a clear error when none exists.
#include "meshlearn/protocol/stage_placement.h"

#include <algorithm>
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

Result<std::vector<std::vector<NodeId>>> Place(const std::vector<StageNeed>& stages,
                                               uint32_t replicas,
                                               const std::vector<NodeView>& nodes) {
  return PlaceStages(PlaceTask(), stages, replicas, nodes, kPlaceHeight, SchedulerParams{});
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

}  // namespace
}  // namespace meshlearn::protocol
