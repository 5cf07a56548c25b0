#include "meshlearn/protocol/round_phase.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/scheduler.h"

namespace meshlearn::protocol {
namespace {

NodeId Id(uint8_t i) {
  NodeId id;
  id.bytes[0] = i;
  return id;
}

RoundMachineConfig RoundTestConfig(uint64_t window) {
  RoundMachineConfig c;
  c.task = Blake2b("round-task");
  c.rounds = 2;
  c.units_per_round = 3;
  c.verification_window_blocks = window;
  c.initial_weights = Blake2b("w0");
  c.start_height = 10;
  return c;
}

// A task of `rounds` rounds with 2 rounds in flight and a 5-block window.
RoundMachineConfig InFlightConfig(uint32_t rounds) {
  RoundMachineConfig c = RoundTestConfig(5);
  c.rounds = rounds;
  c.rounds_in_flight = 2;
  return c;
}

Assignment Assign(const RoundMachineConfig& c, uint32_t round, uint32_t shard, uint8_t node,
                  uint64_t height, uint64_t deadline) {
  return Assignment{UnitId{c.task, round, shard}, Id(node), height, deadline};
}

constexpr uint8_t kAggregator = 100;

// Assigns the aggregator (deadline 10 blocks after `height`) and commits the aggregate.
Result<RoundUpdate> CommitAggregate(RoundStateMachine& m, const RoundMachineConfig& c,
                                    uint32_t round, const Hash256& weights, uint64_t height) {
  if (m.NeedsAggregator()) {
    Status s = m.OnAggregatorAssigned(
        AggregatorAssignment{c.task, m.round(), Id(kAggregator), height, height + 10});
    if (!s.ok()) return s;
  }
  return m.OnAggregateCommitted(round, Id(kAggregator), weights, height);
}

// Assigns and commits every unit of the current round at `height`.
void RunRound(RoundStateMachine& m, const RoundMachineConfig& c, uint64_t height) {
  std::vector<Assignment> as;
  for (uint32_t s = 0; s < c.units_per_round; ++s) {
    as.push_back(Assign(c, m.round(), s, static_cast<uint8_t>(s + 1), height, height + 10));
  }
  ASSERT_TRUE(m.OnAssigned(as).ok());
  for (const Assignment& a : as) {
    ASSERT_TRUE(m.OnUnitCommitted(a.unit, a.node, Blake2b(a.unit.ToString()), height + 1).ok());
  }
}

TEST(RoundPhaseTest, FullLifecycleWithVerificationWindow) {
  const RoundMachineConfig c = RoundTestConfig(5);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round(), 0u);
  EXPECT_EQ(m->PendingUnits().size(), 3u);
  EXPECT_EQ(m->round_weights(), c.initial_weights);

  // Partial assignment stays in "assigning".
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 1, 10, 30)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  ASSERT_TRUE(
      m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 2, 10, 30), Assign(c, 0, 2, 3, 10, 30)})
          .ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseTraining);
  EXPECT_EQ(m->OpenAssignments().size(), 3u);

  for (uint32_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(m->OnBlock(11 + s).ok());
    const UnitId u{c.task, 0, s};
    ASSERT_TRUE(m->OnUnitCommitted(u, Id(static_cast<uint8_t>(s + 1)), Blake2b("r"), 11 + s).ok());
  }
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_EQ(m->CommittedUnits().size(), 3u);
  EXPECT_EQ(m->CommittedUnits()[1].node, Id(2));

  // An aggregate for the wrong round, or from a node that is not the aggregator, is refused.
  EXPECT_TRUE(m->NeedsAggregator());
  EXPECT_FALSE(m->OnAggregateCommitted(0, Id(kAggregator), Blake2b("w1"), 14).ok());
  ASSERT_TRUE(
      m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(kAggregator), 14, 30}).ok());
  EXPECT_FALSE(m->NeedsAggregator());
  EXPECT_FALSE(m->OnAggregateCommitted(1, Id(kAggregator), Blake2b("w1"), 14).ok());
  EXPECT_FALSE(m->OnAggregateCommitted(0, Id(1), Blake2b("w1"), 14).ok());
  auto up = CommitAggregate(*m, c, 0, Blake2b("w1"), 14);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->finalized_rounds.empty());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  EXPECT_EQ(m->window_end_height(), 19u);
  EXPECT_EQ(m->round_weights(), c.initial_weights);  // not final yet

  up = m->OnBlock(18);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->finalized_rounds.empty());
  up = m->OnBlock(19);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, std::vector<uint32_t>{0});
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round_weights(), Blake2b("w1"));
  EXPECT_EQ(m->PendingUnits()[0].unit, (UnitId{c.task, 1, 0}));

  RunRound(*m, c, 20);
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2"), 22).ok());
  up = m->OnBlock(27);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, std::vector<uint32_t>{1});
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  EXPECT_EQ(m->weights_history(),
            (std::vector<Hash256>{c.initial_weights, Blake2b("w1"), Blake2b("w2")}));
  EXPECT_TRUE(m->PendingUnits().empty());
  EXPECT_FALSE(m->OnUnitCommitted(UnitId{c.task, 1, 0}, Id(1), Blake2b("x"), 28).ok());
}

TEST(RoundPhaseTest, ZeroWindowFinalizesImmediately) {
  const RoundMachineConfig c = RoundTestConfig(0);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  auto up = CommitAggregate(*m, c, 0, Blake2b("w1"), 12);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, std::vector<uint32_t>{0});
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
}

TEST(RoundPhaseTest, ExpiryReassignsAndRefusesLateCommit) {
  const RoundMachineConfig c = RoundTestConfig(0);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(
      m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 1, 10, 20), Assign(c, 0, 1, 2, 10, 30),
                                            Assign(c, 0, 2, 3, 10, 30)})
          .ok());
  ASSERT_TRUE(m->OnBlock(20).ok());  // at the deadline: still open
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseTraining);
  auto up = m->OnBlock(21);
  ASSERT_TRUE(up.ok());
  ASSERT_EQ(up->expired.size(), 1u);
  EXPECT_EQ(up->expired[0].node, Id(1));
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].excluded, std::vector<NodeId>{Id(1)});

  // The late node's commit is refused (not paid), and it may not take the unit again.
  const UnitId u0{c.task, 0, 0};
  EXPECT_EQ(m->OnUnitCommitted(u0, Id(1), Blake2b("late"), 21).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 1, 21, 40)}).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 4, 21, 40)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseTraining);
  // A commit after the deadline (before the next block expired it) is refused too.
  EXPECT_FALSE(m->OnUnitCommitted(u0, Id(4), Blake2b("r"), 41).ok());
  EXPECT_TRUE(m->OnUnitCommitted(u0, Id(4), Blake2b("r"), 40).ok());
  // A commit from a node the unit is not assigned to is refused.
  EXPECT_FALSE(m->OnUnitCommitted(UnitId{c.task, 0, 1}, Id(3), Blake2b("r"), 25).ok());

  // Explicit expiry event.
  auto ex = m->OnUnitExpired(UnitId{c.task, 0, 2});
  ASSERT_TRUE(ex.ok());
  ASSERT_EQ(ex->expired.size(), 1u);
  EXPECT_EQ(ex->expired[0].node, Id(3));
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_FALSE(m->OnUnitExpired(UnitId{c.task, 0, 2}).ok());  // already pending

  // Heights never go back.
  EXPECT_FALSE(m->OnBlock(5).ok());
}

TEST(RoundPhaseTest, HoldKeepsTheWindowOpenAndRewindReruns) {
  const RoundMachineConfig c = RoundTestConfig(2);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  m->HoldFinality();
  auto up = m->OnBlock(20);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->finalized_rounds.empty());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);

  // Fraud proven: the round re-runs from the same weights without the cheater.
  ASSERT_TRUE(m->RewindRound(std::vector<NodeId>{Id(2)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round(), 0u);
  EXPECT_EQ(m->round_weights(), c.initial_weights);
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 3u);
  for (const auto& p : pending) EXPECT_EQ(p.excluded, std::vector<NodeId>{Id(2)});

  EXPECT_FALSE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 2, 21, 40)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  std::vector<Assignment> as;
  for (uint32_t s = 0; s < 3; ++s) as.push_back(Assign(c, 0, s, 9, 21, 40));
  ASSERT_TRUE(m->OnAssigned(as).ok());
  for (const Assignment& a : as) ASSERT_TRUE(m->OnUnitCommitted(a.unit, a.node, {}, 22).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1b"), 23).ok());
  ASSERT_TRUE(m->OnBlock(30).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);  // still held
  up = m->ReleaseFinality();
  ASSERT_TRUE(up.ok());
  // The window (2 blocks) runs again from the release at 30: whistleblowers' time.
  EXPECT_TRUE(up->finalized_rounds.empty());
  EXPECT_EQ(m->window_end_height(), 32u);
  ASSERT_TRUE(m->OnBlock(31).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  up = m->OnBlock(32);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, std::vector<uint32_t>{0});
  EXPECT_EQ(m->round_weights(), Blake2b("w1b"));
  EXPECT_FALSE(m->ReleaseFinality().ok());
}

// Taint: fraud in round 1 by a node whose work went into final round 0 takes the task back to
// round 0, from the initial weights, every unit pending without the cheater; the encoding keeps
// the rewound machine.
TEST(RoundPhaseTest, RewindToAnEarlierRoundForgetsTheLaterWeights) {
  const RoundMachineConfig c = RoundTestConfig(0);  // c.rounds = 2
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  ASSERT_TRUE(m->OnBlock(13).ok());
  ASSERT_EQ(m->round(), 1u);
  ASSERT_EQ(m->round_weights(), Blake2b("w1"));
  RunRound(*m, c, 14);
  EXPECT_FALSE(m->RewindTo(2, std::vector<NodeId>{Id(2)}).ok());  // after the current round
  ASSERT_TRUE(m->RewindTo(0, std::vector<NodeId>{Id(2)}).ok());
  EXPECT_EQ(m->round(), 0u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round_weights(), c.initial_weights);
  EXPECT_EQ(m->weights_history(), std::vector<Hash256>{c.initial_weights});
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 3u);
  for (const auto& p : pending) {
    EXPECT_EQ(p.unit.round, 0u);
    EXPECT_EQ(p.excluded, std::vector<NodeId>{Id(2)});
  }
  auto again = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->Encode(), m->Encode());
  // It trains forward again without the cheater: round 0 then round 1, to the end.
  EXPECT_FALSE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 2, 20, 30)}).ok());
  std::vector<Assignment> as;
  for (uint32_t s = 0; s < 3; ++s) as.push_back(Assign(c, 0, s, 9, 20, 30));
  ASSERT_TRUE(m->OnAssigned(as).ok());
  for (const Assignment& a : as) ASSERT_TRUE(m->OnUnitCommitted(a.unit, a.node, {}, 21).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1b"), 22).ok());
  ASSERT_TRUE(m->OnBlock(23).ok());
  EXPECT_EQ(m->round_weights(), Blake2b("w1b"));
  RunRound(*m, c, 24);
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2"), 26).ok());
  ASSERT_TRUE(m->OnBlock(27).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  EXPECT_FALSE(m->RewindTo(2, std::vector<NodeId>{Id(2)}).ok());  // there is no round 2
}

// A fraud proof within a finished task's audit window: the final task goes back to round 1
// (its last), the final weights forgotten, every unit pending without the cheater; it trains
// forward and is final again, with the new weights. Through the encoding too.
TEST(RoundPhaseTest, AFinalTaskRewindsAndTrainsToTheEndAgain) {
  const RoundMachineConfig c = RoundTestConfig(0);  // c.rounds = 2
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  for (uint32_t r = 0; r < 2; ++r) {
    RunRound(*m, c, 10 + 4 * r);
    ASSERT_TRUE(CommitAggregate(*m, c, r, Blake2b("w" + std::to_string(r + 1)), 12 + 4 * r).ok());
    ASSERT_TRUE(m->OnBlock(13 + 4 * r).ok());
  }
  ASSERT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  ASSERT_EQ(m->round_weights(), Blake2b("w2"));
  ASSERT_EQ(m->final_rounds(), 2u);
  EXPECT_FALSE(m->RewindTo(2, std::vector<NodeId>{Id(2)}).ok());
  ASSERT_TRUE(m->RewindTo(1, std::vector<NodeId>{Id(2)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->final_rounds(), 1u);
  EXPECT_TRUE(m->Unfinal(1));
  EXPECT_EQ(m->weights_history(), (std::vector<Hash256>{c.initial_weights, Blake2b("w1")}));
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 3u);
  for (const auto& p : pending) {
    EXPECT_EQ(p.unit.round, 1u);
    EXPECT_EQ(p.excluded, std::vector<NodeId>{Id(2)});
  }
  auto again = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->Encode(), m->Encode());
  std::vector<Assignment> as;
  for (uint32_t s = 0; s < 3; ++s) as.push_back(Assign(c, 1, s, 9, 30, 40));
  ASSERT_TRUE(m->OnAssigned(as).ok());
  for (const Assignment& a : as) ASSERT_TRUE(m->OnUnitCommitted(a.unit, a.node, {}, 31).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2b"), 32).ok());
  ASSERT_TRUE(m->OnBlock(33).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  EXPECT_EQ(m->round_weights(), Blake2b("w2b"));
  EXPECT_EQ(m->weights_history(),
            (std::vector<Hash256>{c.initial_weights, Blake2b("w1"), Blake2b("w2b")}));
}

// A forced error in one unit: only that unit re-runs; the others keep their commits; the
// aggregate already committed is dropped and the round aggregates again over the new result.
TEST(RoundPhaseTest, RerunUnitsKeepsTheOtherCommitsAndAggregatesAgain) {
  const RoundMachineConfig c = RoundTestConfig(2);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  m->HoldFinality();
  ASSERT_TRUE(m->OnBlock(20).ok());
  EXPECT_FALSE(m->RerunUnits(std::vector<uint32_t>{3}, {}).ok());  // no shard 3
  ASSERT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  ASSERT_TRUE(m->RerunUnits(std::vector<uint32_t>{1}, std::vector<NodeId>{Id(7)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round(), 0u);
  EXPECT_FALSE(m->aggregator().has_value());
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].unit.shard, 1u);
  EXPECT_EQ(pending[0].excluded, std::vector<NodeId>{Id(7)});
  EXPECT_EQ(m->CommittedUnits().size(), 2u);  // shards 0 and 2 keep their results
  // A round-trip of the machine in this state is exact.
  auto back = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), m->Encode());
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 8, 21, 40)}).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseTraining);
  ASSERT_TRUE(m->OnUnitCommitted(UnitId{c.task, 0, 1}, Id(8), Blake2b("honest"), 22).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1b"), 23).ok());
  ASSERT_TRUE(m->ReleaseFinality().ok());
  ASSERT_TRUE(m->OnBlock(25).ok());
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->weights_history()[1], Blake2b("w1b"));
}

// The machine and the scheduler together: pending units go through AssignUnits, an expired unit
// comes back with its late node excluded and lands elsewhere.
TEST(RoundPhaseTest, DrivesTheScheduler) {
  RoundMachineConfig c = RoundTestConfig(0);
  c.units_per_round = 6;
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  TaskSpecView t;
  t.id = c.task;
  t.rounds = c.rounds;
  t.units_per_round = c.units_per_round;
  t.inner_steps = 10;
  t.batch_size = 4;
  t.flops_per_sample = 1'000'000;
  t.model_bytes = 1000;
  t.price_cap_per_gflop = 1;
  t.num_examples = 600;
  std::vector<NodeView> nodes(3);
  for (uint8_t i = 0; i < 3; ++i) {
    nodes[i].id = Id(i + 1);
    nodes[i].memory_bytes = 1 << 20;
    nodes[i].throughput_flops = 1'000'000'000;
    nodes[i].bandwidth_bytes_per_s = 1'000'000;
    nodes[i].last_heartbeat_height = 10;
  }
  auto r = AssignUnits(t, nodes, m->PendingUnits(), Blake2b("b10"), 10);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(m->OnAssigned(r->assignments).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseTraining);
  const Assignment victim = r->assignments[0];
  for (const Assignment& a : r->assignments) {
    if (a.unit != victim.unit) {
      ASSERT_TRUE(m->OnUnitCommitted(a.unit, a.node, {}, 11).ok());
    }
  }
  auto up = m->OnBlock(victim.deadline_height + 1);
  ASSERT_TRUE(up.ok());
  ASSERT_EQ(up->expired.size(), 1u);
  for (NodeView& n : nodes) {
    n.last_heartbeat_height = victim.deadline_height;
    if (n.id == victim.node) ApplyMissedDeadline(n.reputation);
  }
  r = AssignUnits(t, nodes, m->PendingUnits(), Blake2b("b-next"), victim.deadline_height + 1);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->assignments.size(), 1u);
  EXPECT_NE(r->assignments[0].node, victim.node);
  ASSERT_TRUE(m->OnAssigned(r->assignments).ok());
  ASSERT_TRUE(
      m->OnUnitCommitted(victim.unit, r->assignments[0].node, {}, victim.deadline_height + 1).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAggregating);
}

TEST(RoundPhaseTest, ExpiredAggregatorIsReplaced) {
  const RoundMachineConfig c = RoundTestConfig(0);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  EXPECT_FALSE(m->OnAggregatorAssigned(AggregatorAssignment{c.task, 1, Id(50), 11, 20}).ok());
  ASSERT_TRUE(m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(50), 11, 20}).ok());
  EXPECT_FALSE(m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(51), 11, 20}).ok());
  ASSERT_TRUE(m->OnBlock(20).ok());
  auto up = m->OnBlock(21);
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE(up->expired_aggregator.has_value());
  EXPECT_EQ(up->expired_aggregator->node, Id(50));
  EXPECT_TRUE(m->NeedsAggregator());
  EXPECT_EQ(m->AggregatorExcluded(), std::vector<NodeId>{Id(50)});
  EXPECT_FALSE(m->OnAggregateCommitted(0, Id(50), Blake2b("late"), 21).ok());
  EXPECT_FALSE(m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(50), 21, 40}).ok());
  ASSERT_TRUE(m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(51), 21, 40}).ok());
  EXPECT_FALSE(m->OnAggregateCommitted(0, Id(51), Blake2b("w1"), 41).ok());  // after deadline
  up = m->OnAggregateCommitted(0, Id(51), Blake2b("w1"), 40);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, std::vector<uint32_t>{0});
  EXPECT_TRUE(m->AggregatorExcluded().empty());  // a new round starts clean
}

// Decode(Encode(m)) is m: same encoding, and it behaves the same from there on.
void ExpectRoundTrip(const RoundStateMachine& m) {
  const Bytes bytes = m.Encode();
  auto back = RoundStateMachine::Decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), bytes);
  EXPECT_EQ(back->phase(), m.phase());
  EXPECT_EQ(back->round(), m.round());
  EXPECT_EQ(back->weights_history(), m.weights_history());
  EXPECT_EQ(back->OpenAssignments(), m.OpenAssignments());
  EXPECT_EQ(back->PendingUnits().size(), m.PendingUnits().size());
}

TEST(RoundPhaseTest, EncodeDecodeRoundTripsThroughALifecycle) {
  const RoundMachineConfig c = RoundTestConfig(3);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  ExpectRoundTrip(*m);
  ASSERT_TRUE(
      m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 1, 10, 12), Assign(c, 0, 1, 2, 10, 30)})
          .ok());
  ExpectRoundTrip(*m);
  ASSERT_TRUE(m->OnBlock(13).ok());  // unit 0 expires: excluded list is non-empty
  ExpectRoundTrip(*m);
  ASSERT_TRUE(
      m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 3, 13, 30), Assign(c, 0, 2, 3, 13, 30)})
          .ok());
  for (uint32_t s = 0; s < 3; ++s) {
    const auto open = m->OpenAssignments();
    ASSERT_FALSE(open.empty());
    ASSERT_TRUE(m->OnUnitCommitted(open[0].unit, open[0].node, Blake2b("r"), 14).ok());
    ExpectRoundTrip(*m);
  }
  ASSERT_TRUE(
      m->OnAggregatorAssigned(AggregatorAssignment{c.task, 0, Id(kAggregator), 14, 20}).ok());
  ExpectRoundTrip(*m);
  ASSERT_TRUE(m->OnAggregateCommitted(0, Id(kAggregator), Blake2b("w1"), 15).ok());
  m->HoldFinality();
  ExpectRoundTrip(*m);
  ASSERT_TRUE(m->ReleaseFinality().ok());
  ASSERT_TRUE(m->OnBlock(18).ok());
  ExpectRoundTrip(*m);
  RunRound(*m, c, 20);
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2"), 22).ok());
  ASSERT_TRUE(m->OnBlock(25).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  ExpectRoundTrip(*m);
}

TEST(RoundPhaseTest, DecodeRejectsCorruptState) {
  const RoundMachineConfig c = RoundTestConfig(3);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 2, 10, 30)}).ok());
  const Bytes good = m->Encode();
  for (size_t len = 0; len < good.size(); ++len) {
    Bytes cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(len));
    EXPECT_FALSE(RoundStateMachine::Decode(cut).ok()) << "truncated to " << len;
  }
  Bytes trailing = good;
  trailing.push_back(0);
  EXPECT_FALSE(RoundStateMachine::Decode(trailing).ok());
  // The phase byte follows version, task, rounds, units, window, initial weights, start height.
  const size_t phase_at = 1 + 32 + 4 + 4 + 8 + 32 + 8;
  ASSERT_EQ(good[phase_at], static_cast<uint8_t>(RoundPhase::kRoundPhaseAssigning));
  for (uint8_t bad : {uint8_t{1}, uint8_t{2}, uint8_t{3}, uint8_t{4}, uint8_t{9}}) {
    Bytes b = good;
    b[phase_at] = bad;
    EXPECT_FALSE(RoundStateMachine::Decode(b).ok()) << "phase " << int{bad};
  }
  Bytes v = good;
  v[0] = 4;
  EXPECT_EQ(RoundStateMachine::Decode(v).status().code(), StatusCode::kDataLoss);
  v[0] = 3;  // version 3 carries back-offs after the settling rounds: missing here
  EXPECT_EQ(RoundStateMachine::Decode(v).status().code(), StatusCode::kDataLoss);
  // Version 1 (before rounds in flight) ends before rounds_in_flight and the settling count,
  // and still decodes, with no rounds in flight.
  Bytes v1(good.begin(), good.end() - 8);
  v1[0] = 1;
  auto old = RoundStateMachine::Decode(v1);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->Encode(), good);
}

// BackOff (a pipeline replica that ran past its deadline): counted per pending unit of the
// round, capped, shown in PendingUnits, encoded (version 3) only while one is non-zero, and gone
// with the round.
TEST(RoundPhaseTest, BackOffsAreCountedPerUnitAndEncodedOnlyWhileAnyIsSet) {
  const RoundMachineConfig c = RoundTestConfig(2);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 0, 1, 10, 12)}).ok());
  EXPECT_EQ(m->BackOff(UnitId{c.task, 0, 0}).code(), StatusCode::kFailedPrecondition)
      << "an assigned unit has its deadline";
  EXPECT_EQ(m->BackOff(UnitId{c.task, 1, 0}).code(), StatusCode::kFailedPrecondition)
      << "not a unit of the current round";
  EXPECT_EQ(m->Encode()[0], 2);
  ASSERT_TRUE(m->OnBlock(13).ok());  // unit 0 expires
  ASSERT_TRUE(m->BackOff(UnitId{c.task, 0, 0}).ok());
  std::vector<PendingUnit> pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 3u);
  EXPECT_EQ(pending[0].backoffs, 1u);
  EXPECT_EQ(pending[1].backoffs, 0u);
  const Bytes v3 = m->Encode();
  EXPECT_EQ(v3[0], 3);
  ExpectRoundTrip(*m);
  EXPECT_EQ(RoundStateMachine::Decode(v3)->PendingUnits()[0].backoffs, 1u);
  // Canonical: a version 3 whose back-offs are all zero is version 2's state written another way.
  Bytes zero = v3;
  std::fill(zero.end() - 12, zero.end(), 0);  // the three units' back-offs, last in the encoding
  EXPECT_EQ(RoundStateMachine::Decode(zero).status().code(), StatusCode::kDataLoss);
  for (uint32_t i = 0; i < RoundStateMachine::kMaxBackoffs + 3; ++i) {
    ASSERT_TRUE(m->BackOff(UnitId{c.task, 0, 0}).ok());
  }
  EXPECT_EQ(m->PendingUnits()[0].backoffs, RoundStateMachine::kMaxBackoffs);
  ExpectRoundTrip(*m);
  std::vector<Assignment> as;
  for (uint32_t s = 0; s < c.units_per_round; ++s) as.push_back(Assign(c, 0, s, 7, 20, 30));
  ASSERT_TRUE(m->OnAssigned(as).ok());
  for (const Assignment& a : as) ASSERT_TRUE(m->OnUnitCommitted(a.unit, a.node, Blake2b("r"), 21).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 22).ok());
  ASSERT_TRUE(m->OnBlock(25).ok());
  ASSERT_EQ(m->round(), 1u);
  EXPECT_EQ(m->PendingUnits()[0].backoffs, 0u) << "a new round starts without back-offs";
  EXPECT_EQ(m->Encode()[0], 2);
}

TEST(RoundPhaseTest, CreateRejectsEmptyTask) {
  RoundMachineConfig c = RoundTestConfig(0);
  c.rounds = 0;
  EXPECT_FALSE(RoundStateMachine::Create(c).ok());
  EXPECT_EQ(RoundPhaseName(RoundPhase::kRoundPhaseAwaitingVerificationWindow),
            "awaiting_verification_window");
}

// Rounds in flight: once round r's aggregate commits, round r+1 trains from it while r settles
// (its holds and window); rounds become final in order, and only final rounds are reported.
TEST(RoundPhaseTest, RoundsInFlightTrainWhileEarlierRoundsSettle) {
  const RoundMachineConfig c = InFlightConfig(4);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  m->HoldFinality();  // round 0's check is open
  auto up = CommitAggregate(*m, c, 0, Blake2b("w1"), 12);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_TRUE(up->finalized_rounds.empty());
  EXPECT_EQ(m->round(), 1u);  // started at once, from the settling aggregate
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(m->round_weights(), Blake2b("w1"));
  EXPECT_EQ(m->final_rounds(), 0u);
  EXPECT_TRUE(m->Unfinal(0));
  EXPECT_EQ(*m->HoldsOf(0), 1u);
  EXPECT_EQ(*m->HoldsOf(1), 0u);
  RunRound(*m, c, 13);
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2"), 15).ok());
  EXPECT_EQ(m->round(), 2u);  // two rounds settle now
  RunRound(*m, c, 16);
  ASSERT_TRUE(CommitAggregate(*m, c, 2, Blake2b("w3"), 18).ok());
  // The third aggregated round waits: rounds_in_flight = 2 are settling.
  EXPECT_EQ(m->round(), 2u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  EXPECT_FALSE(m->SetHolds(3, 1).ok());  // not a round of the task yet
  // Round 1's window has closed (15 + 5) but round 0 holds: nothing is final out of order.
  up = m->OnBlock(21);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->finalized_rounds.empty());
  auto back = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), m->Encode());
  // Round 0's check settles at 21: its window restarts (21 + 5); at 26 rounds 0 and 1 are final
  // and round 2 (with the hold it has) moves to the settling rounds, round 3 trains from w3.
  m->HoldFinality();
  up = m->SetHolds(0, 0);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(up->finalized_rounds.empty());
  up = m->OnBlock(26);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(m->final_rounds(), 2u);
  EXPECT_EQ(m->round(), 3u);
  EXPECT_EQ(m->weights_history(), (std::vector<Hash256>{c.initial_weights, Blake2b("w1"),
                                                        Blake2b("w2"), Blake2b("w3")}));
  EXPECT_FALSE(m->Unfinal(1));
  EXPECT_FALSE(m->HoldsOf(1).ok());
  EXPECT_EQ(*m->HoldsOf(2), 1u);
  ASSERT_TRUE(m->SetHolds(2, 0).ok());  // its window restarts: 26 + 5
  // The last round waits for the settling one before it, then for its own window.
  RunRound(*m, c, 27);
  ASSERT_TRUE(CommitAggregate(*m, c, 3, Blake2b("w4"), 29).ok());
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  up = m->OnBlock(34);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->finalized_rounds, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseFinal);
  EXPECT_EQ(m->final_rounds(), 4u);
  EXPECT_EQ(m->round_weights(), Blake2b("w4"));
}

// Fraud found in a settling round: the task goes back to it, and the round trained on top of it
// (and its weights) is dropped.
TEST(RoundPhaseTest, RewindIntoASettlingRoundDropsTheRoundsAfterIt) {
  const RoundMachineConfig c = InFlightConfig(4);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  RunRound(*m, c, 13);
  ASSERT_TRUE(CommitAggregate(*m, c, 1, Blake2b("w2"), 15).ok());
  ASSERT_TRUE(m->SetHolds(1, 2).ok());
  ASSERT_TRUE(m->OnBlock(17).ok());  // round 0's window (12 + 5) closed: final
  EXPECT_EQ(m->final_rounds(), 1u);
  EXPECT_EQ(m->round(), 2u);
  ASSERT_TRUE(m->RewindTo(1, std::vector<NodeId>{Id(2)}).ok());
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->final_rounds(), 1u);
  EXPECT_EQ(*m->HoldsOf(1), 0u);  // its checks went with it
  EXPECT_EQ(m->weights_history(), (std::vector<Hash256>{c.initial_weights, Blake2b("w1")}));
  EXPECT_EQ(m->PendingUnits().size(), 3u);
  auto back = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), m->Encode());
}

// rounds_in_flight = 0 is the strict order: round r+1 starts only when r is final.
TEST(RoundPhaseTest, NoRoundsInFlightWaitsForFinality) {
  RoundMachineConfig c = RoundTestConfig(5);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  EXPECT_EQ(m->round(), 0u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAwaitingVerificationWindow);
  ASSERT_TRUE(m->OnBlock(17).ok());
  EXPECT_EQ(m->round(), 1u);
  EXPECT_EQ(m->final_rounds(), 1u);
}

// A settling list the events could not produce is refused when decoding.
TEST(RoundPhaseTest, DecodeRefusesSettlingRoundsOutOfPlace) {
  const RoundMachineConfig c = InFlightConfig(4);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  Bytes enc = m->Encode();
  // rounds_in_flight 2, one settling round: round 0, window end 12 + 5 (little-endian).
  const Bytes entry = {2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0};
  auto at = std::search(enc.begin(), enc.end(), entry.begin(), entry.end());
  ASSERT_NE(at, enc.end());
  Bytes bad = enc;
  bad[static_cast<size_t>(at - enc.begin()) + 8] = 7;  // round 7 instead of 0
  EXPECT_FALSE(RoundStateMachine::Decode(bad).ok());
  Bytes uncommitted = enc;  // the settling round's first unit no longer committed
  uncommitted[static_cast<size_t>(at - enc.begin()) + entry.size() + 4 + 4] = 0;
  EXPECT_FALSE(RoundStateMachine::Decode(uncommitted).ok());
  ASSERT_TRUE(RoundStateMachine::Decode(enc).ok());
}

// A forced error in a settling round: the task goes back to that round, whose other units keep
// their commits; only the forced unit re-runs, and the round after it is dropped.
TEST(RoundPhaseTest, RerunUnitsOfASettlingRoundKeepsItsOtherCommits) {
  const RoundMachineConfig c = InFlightConfig(3);
  auto m = RoundStateMachine::Create(c);
  ASSERT_TRUE(m.ok());
  RunRound(*m, c, 10);
  ASSERT_TRUE(m->SetHolds(0, 3).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1"), 12).ok());
  RunRound(*m, c, 13);
  ASSERT_EQ(m->round(), 1u);
  EXPECT_FALSE(m->RerunUnitsOf(0, std::vector<uint32_t>{3}, {}).ok());  // no shard 3
  EXPECT_FALSE(m->RerunUnitsOf(2, std::vector<uint32_t>{0}, {}).ok());  // not a round yet
  ASSERT_TRUE(m->RerunUnitsOf(0, std::vector<uint32_t>{1}, std::vector<NodeId>{Id(7)}).ok());
  EXPECT_EQ(m->round(), 0u);
  EXPECT_EQ(m->phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(*m->HoldsOf(0), 3u);  // the other checks of the round are still open
  EXPECT_EQ(m->weights_history(), std::vector<Hash256>{c.initial_weights});
  auto pending = m->PendingUnits();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].unit, (UnitId{c.task, 0, 1}));
  EXPECT_EQ(pending[0].excluded, std::vector<NodeId>{Id(7)});
  EXPECT_EQ(m->CommittedUnits().size(), 2u);
  auto back = RoundStateMachine::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), m->Encode());
  ASSERT_TRUE(m->OnAssigned(std::vector<Assignment>{Assign(c, 0, 1, 8, 14, 40)}).ok());
  ASSERT_TRUE(m->OnUnitCommitted(UnitId{c.task, 0, 1}, Id(8), Blake2b("again"), 15).ok());
  ASSERT_TRUE(CommitAggregate(*m, c, 0, Blake2b("w1b"), 16).ok());
  EXPECT_EQ(m->round(), 1u);  // round 1 trains again, from the new aggregate
  EXPECT_EQ(m->round_weights(), Blake2b("w1b"));
}

}  // namespace
}  // namespace meshlearn::protocol
