#include "meshlearn/protocol/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "meshlearn/protocol/decompose.h"

namespace meshlearn::protocol {
namespace {

constexpr uint64_t kHeight = 1000;

NodeId Id(uint32_t i) {
  NodeId id;
  id.bytes[0] = static_cast<uint8_t>(i >> 24);
  id.bytes[1] = static_cast<uint8_t>(i >> 16);
  id.bytes[2] = static_cast<uint8_t>(i >> 8);
  id.bytes[3] = static_cast<uint8_t>(i);
  return id;
}

// 50 steps x 32 samples x 1 MFLOP = 1.6 GFLOP per unit; 1 KB model, so transfer is ~1 ms.
TaskSpecView Task(uint32_t units = 8) {
  TaskSpecView t;
  t.id = Blake2b("sched-task");
  t.rounds = 100;
  t.units_per_round = units;
  t.inner_steps = 50;
  t.batch_size = 32;
  t.flops_per_sample = 1'000'000;
  t.model_bytes = 1000;
  t.memory_required_bytes = 1 << 20;
  t.price_cap_per_gflop = 10;
  t.seed = 7;
  t.num_examples = 1 << 16;
  return t;
}

NodeView Node(uint32_t i, uint64_t flops = 1'000'000'000) {
  NodeView n;
  n.id = Id(i);
  n.memory_bytes = 1 << 30;
  n.throughput_flops = flops;
  n.latency_ms = 0;
  n.bandwidth_bytes_per_s = 1'000'000'000;
  n.price_per_gflop = 5;
  n.last_heartbeat_height = kHeight - 1;
  return n;
}

std::vector<PendingUnit> Pending(const TaskSpecView& t, uint32_t round) {
  std::vector<PendingUnit> out;
  for (const UnitId& u : RoundUnits(t, round)) out.push_back({u, {}});
  return out;
}

Hash256 BlockHash(uint64_t i) { return Blake2b("block-" + std::to_string(i)); }

std::map<NodeId, int> CountByNode(const std::vector<Assignment>& as) {
  std::map<NodeId, int> c;
  for (const Assignment& a : as) ++c[a.node];
  return c;
}

TEST(SchedulerTest, SameInputsSameAssignments) {
  const TaskSpecView t = Task(16);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 10; ++i) nodes.push_back(Node(i, 1'000'000'000 + i * 100'000'000));
  const auto pending = Pending(t, 0);
  auto a = AssignUnits(t, nodes, pending, BlockHash(1), kHeight);
  auto b = AssignUnits(t, nodes, pending, BlockHash(1), kHeight);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->assignments, b->assignments);
  EXPECT_EQ(a->assignments.size(), 16u);
  EXPECT_TRUE(a->unassigned.empty());

  // Input order does not matter.
  std::vector<NodeView> reversed(nodes.rbegin(), nodes.rend());
  std::vector<PendingUnit> pending_rev(pending.rbegin(), pending.rend());
  auto c = AssignUnits(t, reversed, pending_rev, BlockHash(1), kHeight);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(a->assignments, c->assignments);

  // Another block's randomness deals differently (with overwhelming probability).
  bool any_differs = false;
  for (uint64_t blk = 2; blk < 10 && !any_differs; ++blk) {
    auto d = AssignUnits(t, nodes, pending, BlockHash(blk), kHeight);
    ASSERT_TRUE(d.ok());
    any_differs = d->assignments != a->assignments;
  }
  EXPECT_TRUE(any_differs);
}

TEST(SchedulerTest, AssignmentsAreSortedAndComplete) {
  const TaskSpecView t = Task(32);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 5; ++i) nodes.push_back(Node(i));
  auto r = AssignUnits(t, nodes, Pending(t, 3), BlockHash(0), kHeight);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->assignments.size(), 32u);
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(r->assignments[i].price_per_gflop, 5u);  // locked at assignment
    EXPECT_EQ(r->assignments[i].unit, (UnitId{t.id, 3, static_cast<uint32_t>(i)}));
    EXPECT_EQ(r->assignments[i].assigned_height, kHeight);
    EXPECT_GT(r->assignments[i].deadline_height, kHeight);
  }
  EXPECT_EQ(r->eligible_nodes, 5u);
}

TEST(SchedulerTest, MemoryFitIsRespected) {
  const TaskSpecView t = Task(16);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 6; ++i) nodes.push_back(Node(i));
  nodes[2].memory_bytes = t.memory_required_bytes - 1;
  nodes[4].memory_bytes = 0;
  EXPECT_EQ(CheckEligibility(nodes[2], t, kHeight, {}),
            Eligibility::kEligibilityInsufficientMemory);
  for (uint64_t blk = 0; blk < 50; ++blk) {
    auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(blk), kHeight);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->eligible_nodes, 4u);
    for (const Assignment& a : r->assignments) {
      EXPECT_NE(a.node, nodes[2].id);
      EXPECT_NE(a.node, nodes[4].id);
    }
  }
  // Without an explicit requirement, 5 x model_bytes is needed.
  TaskSpecView est = t;
  est.memory_required_bytes = 0;
  est.model_bytes = 1000;
  EXPECT_EQ(RequiredMemoryBytes(est), 5000u);
}

TEST(SchedulerTest, OfflineJailedAndStaleNodesGetNoWork) {
  const TaskSpecView t = Task(16);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 6; ++i) nodes.push_back(Node(i));
  nodes[0].status = NodeStatus::kNodeStatusJailed;
  nodes[1].status = NodeStatus::kNodeStatusOffline;
  nodes[2].status = NodeStatus::kNodeStatusExiting;
  nodes[3].last_heartbeat_height = kHeight - 31;  // liveness_blocks = 30
  nodes[5].last_heartbeat_height = kHeight - 30;  // still live
  const SchedulerParams params;
  EXPECT_EQ(CheckEligibility(nodes[0], t, kHeight, params), Eligibility::kEligibilityNotActive);
  EXPECT_EQ(CheckEligibility(nodes[3], t, kHeight, params),
            Eligibility::kEligibilityStaleHeartbeat);
  EXPECT_EQ(CheckEligibility(nodes[5], t, kHeight, params), Eligibility::kEligibilityOk);
  for (uint64_t blk = 0; blk < 20; ++blk) {
    auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(blk), kHeight, params);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->eligible_nodes, 2u);
    for (const Assignment& a : r->assignments) {
      EXPECT_TRUE(a.node == nodes[4].id || a.node == nodes[5].id);
    }
  }
}

TEST(SchedulerTest, PriceCapIsRespected) {
  const TaskSpecView t = Task(16);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 4; ++i) nodes.push_back(Node(i));
  nodes[1].price_per_gflop = t.price_cap_per_gflop + 1;
  nodes[2].price_per_gflop = t.price_cap_per_gflop;  // at the cap is fine
  EXPECT_EQ(CheckEligibility(nodes[1], t, kHeight, {}), Eligibility::kEligibilityOverPriceCap);
  for (uint64_t blk = 0; blk < 20; ++blk) {
    auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(blk), kHeight);
    ASSERT_TRUE(r.ok());
    for (const Assignment& a : r->assignments) EXPECT_NE(a.node, nodes[1].id);
  }
}

TEST(SchedulerTest, NoEligibleNodeLeavesUnitsPending) {
  const TaskSpecView t = Task(4);
  std::vector<NodeView> nodes = {Node(0)};
  nodes[0].status = NodeStatus::kNodeStatusJailed;
  auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(0), kHeight);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->assignments.empty());
  EXPECT_EQ(r->unassigned.size(), 4u);
}

// A node at half the throughput of the others gets about half as many units. Systematic sampling
// gives every node floor or ceil of its exact share in each assignment, so over 300 assignments
// the ratio is within a percent or two of 0.5; the band below is many standard deviations wide.
TEST(SchedulerTest, HalfSpeedNodeGetsAboutHalfTheUnits) {
  for (uint32_t units : {10u, 2u}) {
    const TaskSpecView t = Task(units);
    std::vector<NodeView> nodes;
    for (uint32_t i = 0; i < 8; ++i) nodes.push_back(Node(i));
    nodes[5].throughput_flops /= 2;
    std::map<NodeId, int> total;
    const int kAssignments = units == 10 ? 300 : 2000;
    for (int blk = 0; blk < kAssignments; ++blk) {
      auto r = AssignUnits(t, nodes, Pending(t, blk % t.rounds), BlockHash(blk), kHeight);
      ASSERT_TRUE(r.ok());
      for (const auto& [node, c] : CountByNode(r->assignments)) total[node] += c;
    }
    double full_sum = 0;
    for (uint32_t i = 0; i < 8; ++i) {
      if (i != 5) full_sum += total[nodes[i].id];
    }
    const double full_mean = full_sum / 7.0;
    const double ratio = total[nodes[5].id] / full_mean;
    EXPECT_GT(ratio, 0.4) << "units=" << units << " half=" << total[nodes[5].id]
                          << " full mean=" << full_mean;
    EXPECT_LT(ratio, 0.6) << "units=" << units << " half=" << total[nodes[5].id]
                          << " full mean=" << full_mean;
    // Every full-speed node is within 20% of the full-speed mean.
    for (uint32_t i = 0; i < 8; ++i) {
      if (i == 5) continue;
      EXPECT_NEAR(total[nodes[i].id] / full_mean, 1.0, 0.2) << "node " << i;
    }
  }
}

TEST(SchedulerTest, FasterNodesGetProportionallyMore) {
  const TaskSpecView t = Task(7);
  // Throughputs 1x, 2x, 4x: shares 1/7, 2/7, 4/7 of 7 units = exactly 1, 2, 4 every time.
  std::vector<NodeView> nodes = {Node(0, 1'000'000'000), Node(1, 2'000'000'000),
                                 Node(2, 4'000'000'000)};
  for (auto& n : nodes) n.bandwidth_bytes_per_s = UINT64_MAX / 2;  // transfer ~0
  TaskSpecView big = t;
  big.flops_per_sample = 100'000'000;  // 160 s per unit at 1 GFLOP/s: rounding is negligible
  for (uint64_t blk = 0; blk < 20; ++blk) {
    auto r = AssignUnits(big, nodes, Pending(big, 0), BlockHash(blk), kHeight);
    ASSERT_TRUE(r.ok());
    auto c = CountByNode(r->assignments);
    EXPECT_EQ(c[nodes[0].id], 1);
    EXPECT_EQ(c[nodes[1].id], 2);
    EXPECT_EQ(c[nodes[2].id], 4);
  }
}

TEST(SchedulerTest, ExpiredUnitIsReassignedToSomeoneElseAndCostsReputation) {
  const TaskSpecView t = Task(6);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 4; ++i) nodes.push_back(Node(i));
  auto first = AssignUnits(t, nodes, Pending(t, 0), BlockHash(1), kHeight);
  ASSERT_TRUE(first.ok());
  const Assignment late = first->assignments[2];

  // Nothing is overdue at the deadline itself; one block later it is.
  std::vector<Assignment> open = {late};
  EXPECT_TRUE(OverdueAssignments(open, late.deadline_height).empty());
  std::vector<Assignment> overdue = OverdueAssignments(open, late.deadline_height + 1);
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], late);

  // The ledger applies the penalty to the late node's reputation.
  auto late_node = std::find_if(nodes.begin(), nodes.end(),
                                [&](const NodeView& n) { return n.id == late.node; });
  ASSERT_NE(late_node, nodes.end());
  late_node->reputation.completed = 10;
  late_node->reputation.clean_streak = 5;
  const uint32_t before = ReputationPermille(late_node->reputation);
  ApplyMissedDeadline(late_node->reputation);
  EXPECT_EQ(late_node->reputation.failures, 1u);
  EXPECT_EQ(late_node->reputation.clean_streak, 0u);
  EXPECT_LT(ReputationPermille(late_node->reputation), before);

  // Reassignment never picks the late node, whatever the block randomness.
  std::vector<PendingUnit> again = {{late.unit, {late.node}}};
  for (uint64_t blk = 0; blk < 200; ++blk) {
    auto r = AssignUnits(t, nodes, again, BlockHash(blk), late.deadline_height + 1);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->assignments.size(), 1u);
    EXPECT_EQ(r->assignments[0].unit, late.unit);
    EXPECT_NE(r->assignments[0].node, late.node);
  }
  // If every eligible node is excluded the unit stays pending.
  std::vector<PendingUnit> all_excluded = {{late.unit, {}}};
  for (const NodeView& n : nodes) all_excluded[0].excluded.push_back(n.id);
  auto none = AssignUnits(t, nodes, all_excluded, BlockHash(0), kHeight);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->assignments.empty());
  EXPECT_EQ(none->unassigned, std::vector<UnitId>{late.unit});
}

TEST(SchedulerTest, JoinerGetsWorkFromTheNextAssignment) {
  const TaskSpecView t = Task(16);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 4; ++i) nodes.push_back(Node(i * 2));
  auto before = AssignUnits(t, nodes, Pending(t, 0), BlockHash(1), kHeight);
  ASSERT_TRUE(before.ok());
  NodeView joiner = Node(3);  // sorts between existing ids
  joiner.last_heartbeat_height = kHeight + 1;
  for (const Assignment& a : before->assignments) EXPECT_NE(a.node, joiner.id);
  nodes.push_back(joiner);
  for (uint64_t blk = 0; blk < 20; ++blk) {
    auto after = AssignUnits(t, nodes, Pending(t, 1), BlockHash(100 + blk), kHeight + 1);
    ASSERT_TRUE(after.ok());
    EXPECT_GE(CountByNode(after->assignments)[joiner.id], 3);  // share 16/5 = 3.2
  }
}

TEST(SchedulerTest, LowReputationIsExcludedAndWeighsLess) {
  Reputation fresh;
  EXPECT_EQ(ReputationPermille(fresh), 1000u);
  Reputation good{
      .completed = 96, .verified_clean = 50, .clean_streak = 30, .failures = 0, .slashes = 0};
  EXPECT_EQ(ReputationPermille(good), 1200u);  // 1000 x 1.2 (streak bonus capped at 20)
  Reputation flaky{
      .completed = 4, .verified_clean = 0, .clean_streak = 0, .failures = 2, .slashes = 0};
  EXPECT_EQ(ReputationPermille(flaky), 800u);  // 1000 x 8 / 10
  Reputation slashed{
      .completed = 0, .verified_clean = 0, .clean_streak = 0, .failures = 0, .slashes = 1};
  EXPECT_EQ(ReputationPermille(slashed), 333u);
  Reputation hopeless{
      .completed = 0, .verified_clean = 0, .clean_streak = 0, .failures = 40, .slashes = 0};
  EXPECT_EQ(ReputationPermille(hopeless), 90u);  // 1000 x 4 / 44

  const TaskSpecView t = Task(8);
  NodeView n = Node(1);
  n.reputation = hopeless;
  EXPECT_EQ(CheckEligibility(n, t, kHeight, {}), Eligibility::kEligibilityLowReputation);
  NodeView a = Node(2), b = Node(3);
  b.reputation = flaky;
  EXPECT_EQ(SchedulingWeight(b, t, {}) * 10, SchedulingWeight(a, t, {}) * 8);
}

TEST(SchedulerTest, UnitCost) {
  TaskSpecView t = Task(8);  // 1.6 GFLOP per unit
  EXPECT_EQ(UnitCostTokens(t, 5), 8u);
  EXPECT_EQ(UnitCostTokens(t, 1), 2u);  // 1.6 rounds up
  EXPECT_EQ(UnitCostTokens(t, 0), 0u);
  t.flops_per_sample = UINT64_MAX;
  EXPECT_EQ(UnitCostTokens(t, UINT64_MAX), UINT64_MAX);  // saturates
}

TEST(SchedulerTest, EstimateAndDeadlineFormulas) {
  const TaskSpecView t = Task(8);
  NodeView n = Node(0);
  n.latency_ms = 20;
  n.bandwidth_bytes_per_s = 1'000'000;  // 2 x 1000 bytes -> 2 ms
  SchedulerParams p;
  // 1.6e9 FLOP / 1e9 FLOP/s = 1600 ms, + 2 round trips x 20 ms, + 2 ms.
  EXPECT_EQ(EstimatedUnitMs(n, t, p), 1642u);
  // slack 2x, 1 s blocks: ceil(1642 x 2 / 1000) = 4 blocks, but at least 5.
  EXPECT_EQ(DeadlineHeight(100, 1642, 0, p), 105u);
  EXPECT_EQ(DeadlineHeight(100, 1642, 2, p), 100u + 10);  // ceil(3 x 3284 / 1000) = 10
  p.min_deadline_blocks = 0;
  EXPECT_EQ(DeadlineHeight(100, 1642, 0, p), 104u);
}

TEST(SchedulerTest, DeadlinesCoverTheNodesQueue) {
  const TaskSpecView t = Task(12);
  std::vector<NodeView> nodes = {Node(0), Node(1)};
  nodes[1].inflight_units = 3;
  SchedulerParams p;
  p.min_deadline_blocks = 0;
  auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(3), kHeight, p);
  ASSERT_TRUE(r.ok());
  const uint64_t unit_ms = EstimatedUnitMs(nodes[0], t, p);
  std::map<NodeId, std::vector<uint64_t>> deadlines;
  for (const Assignment& a : r->assignments) deadlines[a.node].push_back(a.deadline_height);
  ASSERT_EQ(deadlines[nodes[0].id].size(), 6u);
  ASSERT_EQ(deadlines[nodes[1].id].size(), 6u);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(deadlines[nodes[0].id][k], DeadlineHeight(kHeight, unit_ms, k, p));
    EXPECT_EQ(deadlines[nodes[1].id][k], DeadlineHeight(kHeight, unit_ms, 3 + k, p));
  }
}

TEST(SchedulerTest, RejectsBadInput) {
  const TaskSpecView t = Task(4);
  std::vector<NodeView> dup = {Node(1), Node(1)};
  auto r = AssignUnits(t, dup, Pending(t, 0), BlockHash(0), kHeight);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  std::vector<NodeView> nodes = {Node(1)};
  auto pending = Pending(t, 0);
  pending.push_back(pending[0]);
  r = AssignUnits(t, nodes, pending, BlockHash(0), kHeight);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  std::vector<PendingUnit> foreign = {{UnitId{Blake2b("other"), 0, 0}, {}}};
  r = AssignUnits(t, nodes, foreign, BlockHash(0), kHeight);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  std::vector<PendingUnit> out_of_range = {{UnitId{t.id, t.rounds, 0}, {}}};
  r = AssignUnits(t, nodes, out_of_range, BlockHash(0), kHeight);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, AggregatorSelection) {
  const TaskSpecView t = Task(8);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 4; ++i) nodes.push_back(Node(i));
  nodes[0].status = NodeStatus::kNodeStatusJailed;
  nodes[3].bandwidth_bytes_per_s = 2'250'000;  // 9 x 1000 bytes take 4 ms
  SchedulerParams p;
  // 9 x 1000 bytes at 1e9 B/s -> 1 ms; 8 x 250 x 64 FLOP at 1e9 FLOP/s -> 1 ms.
  EXPECT_EQ(EstimatedAggregationMs(nodes[1], t, p), 2u);

  auto a = AssignAggregator(t, nodes, 3, {}, BlockHash(1), kHeight, p);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = AssignAggregator(t, nodes, 3, {}, BlockHash(1), kHeight, p);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->round, 3u);
  EXPECT_EQ(a->task, t.id);
  EXPECT_EQ(a->deadline_height, kHeight + p.min_deadline_blocks);

  std::map<NodeId, int> count;
  const std::vector<NodeId> exclude = {nodes[2].id};
  for (uint64_t blk = 0; blk < 600; ++blk) {
    auto r = AssignAggregator(t, nodes, 0, exclude, BlockHash(blk), kHeight, p);
    ASSERT_TRUE(r.ok());
    ++count[r->node];
  }
  EXPECT_EQ(count[nodes[0].id], 0);  // jailed
  EXPECT_EQ(count[nodes[2].id], 0);  // excluded
  // Node 1: 2 ms per aggregation; node 3: 4 + 1 = 5 ms -> weights 5 : 2, shares 0.71 : 0.29.
  EXPECT_GT(count[nodes[1].id], 360);
  EXPECT_LT(count[nodes[1].id], 500);

  const std::vector<NodeId> everyone = {nodes[1].id, nodes[2].id, nodes[3].id};
  auto none = AssignAggregator(t, nodes, 0, everyone, BlockHash(0), kHeight, p);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(AssignAggregator(t, nodes, t.rounds, {}, BlockHash(0), kHeight, p).status().code(),
            StatusCode::kInvalidArgument);
}

// A pipeline round's R x S stage deltas are each their stage's slice of the model, R whole deltas
// together: its aggregator downloads and combines what an unsplit round of R units gives, so its
// estimate is that round's. A task without stages is estimated from its units as before.
TEST(SchedulerTest, APipelineRoundIsEstimatedAsAnUnsplitRoundOfItsReplicas) {
  NodeView n = Node(1, 1'000'000);  // 1e6 FLOP/s
  n.bandwidth_bytes_per_s = 1'000'000;
  const SchedulerParams p;
  const TaskSpecView unsplit = Task(2);
  TaskSpecView piped = Task(8);  // 2 replicas x 4 stages
  piped.stages = 4;
  EXPECT_EQ(RoundReplicas(unsplit), 2u);
  EXPECT_EQ(RoundReplicas(piped), 2u);
  EXPECT_EQ(RoundReplicas(Task(8)), 8u);
  // (2 + 1) x 1000 bytes at 1e6 B/s -> 3 ms; 2 x 250 x 64 FLOP at 1e6 FLOP/s -> 32 ms.
  EXPECT_EQ(EstimatedAggregationMs(n, unsplit, p), 35u);
  EXPECT_EQ(EstimatedAggregationMs(n, piped, p), EstimatedAggregationMs(n, unsplit, p));
  // Without stages, 8 units: 9 x 1000 bytes -> 9 ms; 8 x 250 x 64 FLOP -> 128 ms.
  EXPECT_EQ(EstimatedAggregationMs(n, Task(8), p), 137u);
  // The memory counts the same deltas: the pipeline task's is the unsplit one's.
  EXPECT_EQ(AggregatorMemoryBytes(piped), AggregatorMemoryBytes(unsplit));
}

// An aggregator builds the whole model (a whole unit's need) and holds the round's state, its
// deltas and at most 3 x model_bytes more at a time: a node that holds a unit, or a pipeline
// stage, but not that is never drawn.
TEST(SchedulerTest, AnAggregatorNeedsTheWholeModelTheStateAndTheRoundsDeltas) {
  TaskSpecView t = Task(8);  // unit need 1 MiB, model 1000 bytes
  EXPECT_EQ(AggregatorMemoryBytes(t), (1u << 20) + (8 + 5) * 1000u);
  TaskSpecView piped = t;  // 2 replicas x 4 stages: two whole deltas a round
  piped.stages = 4;
  EXPECT_EQ(AggregatorMemoryBytes(piped), (1u << 20) + (2 + 5) * 1000u);
  TaskSpecView undeclared = t;  // the 5 x model_bytes fallback for the unit
  undeclared.memory_required_bytes = 0;
  EXPECT_EQ(AggregatorMemoryBytes(undeclared), 5000u + 13 * 1000u);

  for (const TaskSpecView& task : {t, piped}) {
    std::vector<NodeView> nodes;
    for (uint32_t i = 0; i < 3; ++i) nodes.push_back(Node(i));
    nodes[0].memory_bytes = AggregatorMemoryBytes(task);      // holds it exactly
    nodes[1].memory_bytes = AggregatorMemoryBytes(task) - 1;  // a unit fits, aggregating not
    nodes[2].memory_bytes = RequiredMemoryBytes(task);
    ASSERT_EQ(CheckEligibility(nodes[1], task, kHeight, {}), Eligibility::kEligibilityOk);
    for (uint64_t blk = 0; blk < 50; ++blk) {
      auto a = AssignAggregator(task, nodes, 0, {}, BlockHash(blk), kHeight, {});
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      EXPECT_EQ(a->node, nodes[0].id) << "block " << blk;
    }
    nodes[0].memory_bytes -= 1;
    EXPECT_EQ(AssignAggregator(task, nodes, 0, {}, BlockHash(0), kHeight, {}).status().code(),
              StatusCode::kUnavailable);
  }
}

// A pipeline task's aggregator trains nothing of the whole model: it evaluates with the weights
// alone (eval_memory_bytes: the weights and one evaluation forward's activations), so the bound
// counts that in place of a whole unit's training need, and a node that holds the evaluator, the
// round's deltas and state but not the whole model's training state is now drawn.
TEST(SchedulerTest, APipelineAggregatorIsPlacedByItsEvaluatorNotAWholeTrainer) {
  TaskSpecView piped = Task(8);  // unit need 1 MiB, model 1000 bytes; 2 replicas x 4 stages
  piped.stages = 4;
  const uint64_t old_bound = AggregatorMemoryBytes(piped);  // none declared: the unit's need
  EXPECT_EQ(old_bound, (1u << 20) + (2 + 5) * 1000u);
  piped.eval_memory_bytes = 300'000;  // the weights and one evaluation forward
  EXPECT_EQ(AggregatorMemoryBytes(piped), 300'000u + (2 + 5) * 1000u);
  // What the trainer cost: the unit's need beyond the evaluator's.
  EXPECT_EQ(old_bound - AggregatorMemoryBytes(piped), (1u << 20) - 300'000u);
  // A task without stages evaluates with its units' trainer: its eval_memory_bytes (which the
  // ledger refuses for it) would not count.
  TaskSpecView unsplit = Task(8);
  unsplit.eval_memory_bytes = 300'000;
  EXPECT_EQ(AggregatorMemoryBytes(unsplit), (1u << 20) + (8 + 5) * 1000u);

  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 3; ++i) nodes.push_back(Node(i));
  nodes[0].memory_bytes = old_bound - 1;                     // between the new and the old bound
  nodes[1].memory_bytes = AggregatorMemoryBytes(piped) - 1;  // short of the evaluator's round
  nodes[2].memory_bytes = piped.eval_memory_bytes;           // the evaluator alone
  for (uint64_t blk = 0; blk < 50; ++blk) {
    auto a = AssignAggregator(piped, nodes, 0, {}, BlockHash(blk), kHeight, {});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->node, nodes[0].id) << "block " << blk;
  }
  nodes[0].memory_bytes = AggregatorMemoryBytes(piped) - 1;
  EXPECT_EQ(AssignAggregator(piped, nodes, 0, {}, BlockHash(0), kHeight, {}).status().code(),
            StatusCode::kUnavailable);
}

// Pins the assignment algorithm: followers replaying old blocks must deal the same units. If a
// change to AssignUnits alters this, it is a consensus change (a new ledger version).
TEST(SchedulerTest, GoldenAssignments) {
  const TaskSpecView t = Task(24);
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 9; ++i) {
    nodes.push_back(Node(i, 500'000'000 + uint64_t{i} * 250'000'000));
    nodes.back().latency_ms = 5 * i;
    nodes.back().reputation.completed = i;
    nodes.back().reputation.failures = i % 3;
  }
  auto r = AssignUnits(t, nodes, Pending(t, 4), BlockHash(42), kHeight);
  ASSERT_TRUE(r.ok());
  std::string got;
  for (const Assignment& a : r->assignments) {
    got +=
        std::to_string(a.node.bytes[3]) + ":" + std::to_string(a.deadline_height - kHeight) + ",";
  }
  EXPECT_EQ(got,
            "0:7,1:5,1:9,2:5,3:5,3:6,3:8,4:5,4:5,5:5,5:5,5:6,6:5,6:5,6:6,6:7,7:5,7:5,7:5,7:7,8:5,8:"
            "5,8:5,8:6,");
}

TEST(SchedulerTest, TenThousandNodesHeterogeneous) {
  TaskSpecView t = Task(1000);
  t.rounds = 1;
  std::vector<NodeView> nodes;
  for (uint32_t i = 0; i < 10'000; ++i) {
    NodeView n = Node(i, 100'000'000 + uint64_t{i % 97} * 50'000'000);
    n.latency_ms = i % 200;
    n.bandwidth_bytes_per_s = 1'000'000 + uint64_t{i % 13} * 10'000'000;
    n.reputation.completed = i % 50;
    n.reputation.failures = i % 7;
    if (i % 10 == 0) n.status = NodeStatus::kNodeStatusOffline;
    nodes.push_back(n);
  }
  auto r = AssignUnits(t, nodes, Pending(t, 0), BlockHash(5), kHeight);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->assignments.size(), 1000u);
  EXPECT_EQ(r->eligible_nodes, 9000u);
  for (const Assignment& a : r->assignments) {
    const uint32_t i = uint32_t{a.node.bytes[0]} << 24 | uint32_t{a.node.bytes[1]} << 16 |
                       uint32_t{a.node.bytes[2]} << 8 | a.node.bytes[3];
    EXPECT_NE(i % 10, 0u) << "offline node " << i << " got a unit";
  }
}

}  // namespace
}  // namespace meshlearn::protocol
