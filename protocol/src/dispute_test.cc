#include "meshlearn/protocol/dispute.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace meshlearn::protocol {
namespace {

constexpr uint32_t kOps = 16;

// A party's view of a training run: state hashes after each step and, inside each step, the
// hashes of its operators' outputs. An honest party reports the true run; a liar deviates from
// step `lie_step` on, starting inside that step at operator `lie_op` (0: only the final state
// update differs).
struct Trace {
  uint64_t lie_step = UINT64_MAX;
  uint32_t lie_op = 1;

  Hash256 State(uint64_t step) const {
    if (step >= lie_step) return Blake2b("lie state " + std::to_string(step));
    return Blake2b("state " + std::to_string(step));
  }
  Hash256 OpOutput(uint64_t step, uint32_t op) const {
    bool lying = step > lie_step || (step == lie_step && lie_op != 0 && op >= lie_op);
    return Blake2b((lying ? "lie op " : "op ") + std::to_string(step) + "/" + std::to_string(op));
  }
  // C_j of step `step`: C_0 is the state after step - 1.
  Hash256 Chain(uint64_t step, uint64_t j) const {
    Hash256 c = State(step - 1);
    for (uint32_t op = 1; op <= j; ++op) c = OperatorChainHash(c, OpOutput(step, op));
    return c;
  }
  Hash256 Answer(const DisputeGame& g) const {
    DisputeQuery q = g.query();
    if (q.stage == DisputeStage::kDisputeSteps) return State(q.position);
    return Chain(q.step, q.position);
  }
};

const Trace kTruth{};

DisputeConfig DisputeTestConfig(const Trace& defender, const Trace& challenger, uint64_t first,
                     uint64_t last, uint32_t ops = kOps) {
  DisputeConfig c;
  c.unit = UnitId{Blake2b("task"), 2, 1};
  c.defender.bytes.fill(1);
  c.challenger.bytes.fill(2);
  c.first_step = first;
  c.last_step = last;
  c.agreed = kTruth.State(first);
  c.defender_claim = defender.State(last);
  c.challenger_claim = challenger.State(last);
  c.num_operators = ops;
  c.response_blocks = 5;
  c.start_height = 100;
  return c;
}

// Plays the game to the end, both parties answering from their traces every turn, and the
// referee computing the truth.
DisputeOutcome Play(DisputeGame& g, const Trace& defender, const Trace& challenger,
                    RefereeTask* task = nullptr) {
  uint64_t height = g.config().start_height;
  while (g.stage() == DisputeStage::kDisputeSteps || g.stage() == DisputeStage::kDisputeOperators) {
    DisputeQuery q = g.query();
    ++height;
    EXPECT_LE(height, q.deadline_height);
    EXPECT_TRUE(g.Post(DisputeParty::kDefender, q.position, defender.Answer(g), height).ok());
    EXPECT_TRUE(g.Post(DisputeParty::kChallenger, q.position, challenger.Answer(g), height).ok());
  }
  EXPECT_EQ(g.stage(), DisputeStage::kDisputeReferee);
  RefereeTask t = g.referee_task();
  if (task) *task = t;
  // The referee recomputes the single transition from the agreed input: the truth.
  Hash256 correct = t.whole_step ? kTruth.State(t.step)
                                 : OperatorChainHash(t.input, kTruth.OpOutput(t.step, t.operator_index));
  EXPECT_TRUE(g.Rule(correct).ok());
  EXPECT_EQ(g.stage(), DisputeStage::kDisputeResolved);
  return g.outcome();
}

TEST(DisputeTest, LyingDefenderLosesAtTheFirstWrongOperator) {
  Trace lazy{.lie_step = 37, .lie_op = 5};
  auto g = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 0, 100));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  RefereeTask t;
  DisputeOutcome o = Play(*g, lazy, kTruth, &t);
  EXPECT_FALSE(t.whole_step);
  EXPECT_EQ(t.step, 37u);
  EXPECT_EQ(t.operator_index, 5u);
  EXPECT_EQ(t.input, kTruth.Chain(37, 4));
  EXPECT_FALSE(o.defender_honest);
  EXPECT_TRUE(o.challenger_honest);
  EXPECT_NE(o.reason.find("defender's output is wrong"), std::string::npos) << o.reason;
  // log2(100) -> 7 step turns, 1 turn for the chain end, log2(16) = 4 operator turns.
  EXPECT_LE(g->turns(), 7u + 1u + 4u);
}

TEST(DisputeTest, LyingChallengerLoses) {
  Trace liar{.lie_step = 3, .lie_op = 16};
  auto g = DisputeGame::Create(DisputeTestConfig(kTruth, liar, 0, 100));
  ASSERT_TRUE(g.ok());
  RefereeTask t;
  DisputeOutcome o = Play(*g, kTruth, liar, &t);
  EXPECT_EQ(t.step, 3u);
  EXPECT_EQ(t.operator_index, 16u);
  EXPECT_TRUE(o.defender_honest);
  EXPECT_FALSE(o.challenger_honest);
}

TEST(DisputeTest, EveryLiePositionIsFoundExactly) {
  for (uint64_t step : {1u, 2u, 10u, 11u, 19u, 20u}) {
    for (uint32_t op : {1u, 2u, 7u, 16u}) {
      Trace liar{.lie_step = step, .lie_op = op};
      auto g = DisputeGame::Create(DisputeTestConfig(liar, kTruth, 0, 20));
      ASSERT_TRUE(g.ok());
      RefereeTask t;
      DisputeOutcome o = Play(*g, liar, kTruth, &t);
      EXPECT_EQ(t.step, step);
      EXPECT_EQ(t.operator_index, op);
      EXPECT_FALSE(o.defender_honest);
      EXPECT_TRUE(o.challenger_honest);
    }
  }
}

TEST(DisputeTest, WithoutOperatorHashesTheRefereeRunsOneStep) {
  Trace lazy{.lie_step = 42, .lie_op = 3};
  auto g = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 30, 60, /*ops=*/0));
  ASSERT_TRUE(g.ok());
  RefereeTask t;
  DisputeOutcome o = Play(*g, lazy, kTruth, &t);
  EXPECT_TRUE(t.whole_step);
  EXPECT_EQ(t.step, 42u);
  EXPECT_EQ(t.input, kTruth.State(41));
  EXPECT_FALSE(o.defender_honest);
  EXPECT_TRUE(o.challenger_honest);
}

TEST(DisputeTest, SameOperatorOutputsButDifferentStateGoesToTheWholeStep) {
  // lie_op = 0: every operator output is true, only the state update is wrong.
  Trace liar{.lie_step = 8, .lie_op = 0};
  auto g = DisputeGame::Create(DisputeTestConfig(liar, kTruth, 0, 16));
  ASSERT_TRUE(g.ok());
  RefereeTask t;
  DisputeOutcome o = Play(*g, liar, kTruth, &t);
  EXPECT_TRUE(t.whole_step);
  EXPECT_EQ(t.step, 8u);
  EXPECT_FALSE(o.defender_honest);
  EXPECT_TRUE(o.challenger_honest);
}

TEST(DisputeTest, AdjacentStepsSkipPhaseOne) {
  Trace liar{.lie_step = 5, .lie_op = 9};
  auto g = DisputeGame::Create(DisputeTestConfig(liar, kTruth, 4, 5));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->stage(), DisputeStage::kDisputeOperators);
  EXPECT_EQ(g->query().position, kOps);  // the chain end first
  RefereeTask t;
  DisputeOutcome o = Play(*g, liar, kTruth, &t);
  EXPECT_EQ(t.operator_index, 9u);
  EXPECT_FALSE(o.defender_honest);
}

TEST(DisputeTest, APartyThatStopsAnsweringLoses) {
  Trace lazy{.lie_step = 37, .lie_op = 5};
  for (int silent = 0; silent < 3; ++silent) {  // 0: defender, 1: challenger, 2: both
    auto g = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 0, 100));
    ASSERT_TRUE(g.ok());
    DisputeQuery q = g->query();
    if (silent == 1) {  // only the challenger is silent
      ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, lazy.State(q.position), 101).ok());
    }
    if (silent == 0) {  // only the defender is silent
      ASSERT_TRUE(
          g->Post(DisputeParty::kChallenger, q.position, kTruth.State(q.position), 101).ok());
    }
    ASSERT_TRUE(g->OnBlock(q.deadline_height).ok());
    EXPECT_NE(g->stage(), DisputeStage::kDisputeResolved) << "the deadline block itself is in time";
    ASSERT_TRUE(g->OnBlock(q.deadline_height + 1).ok());
    ASSERT_EQ(g->stage(), DisputeStage::kDisputeResolved);
    EXPECT_EQ(g->outcome().defender_honest, silent == 1);
    EXPECT_EQ(g->outcome().challenger_honest, silent == 0);
    EXPECT_NE(g->outcome().reason.find("missed"), std::string::npos);
  }
}

TEST(DisputeTest, BadMovesAreRefusedAndChangeNothing) {
  Trace lazy{.lie_step = 37, .lie_op = 5};
  auto g = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 0, 100));
  ASSERT_TRUE(g.ok());
  DisputeQuery q = g->query();
  Bytes before = g->Encode();
  EXPECT_EQ(g->Post(DisputeParty::kDefender, q.position + 1, Blake2b("x"), 101).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Post(DisputeParty::kDefender, q.position, Blake2b("x"), q.deadline_height + 1).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(g->Rule(Blake2b("x")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(g->Encode(), before);
  ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, lazy.State(q.position), 101).ok());
  EXPECT_EQ(g->Post(DisputeParty::kDefender, q.position, lazy.State(q.position), 101).code(),
            StatusCode::kAlreadyExists);
}

TEST(DisputeTest, CreateRefusesNonsense) {
  Trace lazy{.lie_step = 3};
  DisputeConfig c = DisputeTestConfig(lazy, kTruth, 10, 10);
  EXPECT_FALSE(DisputeGame::Create(c).ok());
  c = DisputeTestConfig(kTruth, kTruth, 0, 10);
  EXPECT_FALSE(DisputeGame::Create(c).ok());  // equal claims
  c = DisputeTestConfig(lazy, kTruth, 0, 10);
  c.response_blocks = 0;
  EXPECT_FALSE(DisputeGame::Create(c).ok());
  c = DisputeTestConfig(lazy, kTruth, 0, 10);
  c.challenger = c.defender;
  EXPECT_FALSE(DisputeGame::Create(c).ok());
}

TEST(DisputeTest, EncodeDecodeMidGameContinuesIdentically) {
  Trace lazy{.lie_step = 61, .lie_op = 11};
  auto g = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 0, 100));
  ASSERT_TRUE(g.ok());
  uint64_t height = 100;
  for (int turn = 0; turn < 9; ++turn) {  // into phase 2
    DisputeQuery q = g->query();
    ++height;
    ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, lazy.Answer(*g), height).ok());
    ASSERT_TRUE(g->Post(DisputeParty::kChallenger, q.position, kTruth.Answer(*g), height).ok());
    Bytes wire = g->Encode();
    auto back = DisputeGame::Decode(wire);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->Encode(), wire);
    *g = std::move(*back);
  }
  EXPECT_EQ(g->stage(), DisputeStage::kDisputeOperators);
  DisputeOutcome o = Play(*g, lazy, kTruth);
  EXPECT_FALSE(o.defender_honest);
  Bytes wire = g->Encode();
  for (size_t cut = 0; cut < wire.size(); cut += 7) {
    EXPECT_FALSE(DisputeGame::Decode(ByteSpan(wire.data(), cut)).ok()) << cut;
  }
  Bytes extra = wire;
  extra.push_back(0);
  EXPECT_FALSE(DisputeGame::Decode(extra).ok());
}

TEST(DisputeTest, ToleranceModeGoesStraightToTheRefereeOverTheSegment) {
  // Across hardware without bitwise reproducibility hashes never agree: nothing to bisect.
  Trace off{.lie_step = 31};
  for (bool within : {true, false}) {
    DisputeConfig c = DisputeTestConfig(off, kTruth, 30, 40);
    c.tolerance = true;
    auto g = DisputeGame::Create(c);
    ASSERT_TRUE(g.ok());
    ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee);
    const RefereeTask& t = g->referee_task();
    EXPECT_TRUE(t.segment);
    EXPECT_EQ(t.first_step, 30u);
    EXPECT_EQ(t.step, 40u);
    EXPECT_EQ(t.input, kTruth.State(30));
    EXPECT_FALSE(g->Post(DisputeParty::kDefender, 35, off.State(35), 101).ok());
    EXPECT_EQ(g->Rule(kTruth.State(40)).code(), StatusCode::kInvalidArgument);
    auto back = DisputeGame::Decode(g->Encode());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->Encode(), g->Encode());
    ASSERT_TRUE(back->RuleTolerance(within).ok());
    EXPECT_EQ(back->outcome().defender_honest, within);
    EXPECT_EQ(back->outcome().challenger_honest, !within);
    EXPECT_FALSE(back->RuleTolerance(within).ok());  // resolved
  }
  // An exact-mode game refuses a tolerance ruling.
  auto exact = DisputeGame::Create(DisputeTestConfig(off, kTruth, 30, 31, /*ops=*/0));
  ASSERT_EQ(exact->stage(), DisputeStage::kDisputeReferee);
  EXPECT_EQ(exact->RuleTolerance(true).code(), StatusCode::kFailedPrecondition);
}

TEST(DisputeTest, AnAbsentRefereeLeavesTheGameUndecided) {
  Trace liar{.lie_step = 31};
  DisputeConfig c = DisputeTestConfig(liar, kTruth, 30, 31, /*ops=*/0);
  c.referee_blocks = 4;
  auto g = DisputeGame::Create(c);
  ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee);
  ASSERT_TRUE(g->OnBlock(104).ok());
  EXPECT_EQ(g->stage(), DisputeStage::kDisputeReferee);  // still in time
  ASSERT_TRUE(g->OnBlock(105).ok());
  ASSERT_EQ(g->stage(), DisputeStage::kDisputeResolved);
  EXPECT_TRUE(g->outcome().undecided);
  EXPECT_TRUE(g->outcome().defender_honest);
  EXPECT_TRUE(g->outcome().challenger_honest);
  EXPECT_FALSE(g->Rule(kTruth.State(31)).ok());  // too late
  auto back = DisputeGame::Decode(g->Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->outcome().undecided);
  // Without a limit the referee may take its time.
  c.referee_blocks = 0;
  auto patient = DisputeGame::Create(c);
  ASSERT_TRUE(patient->OnBlock(100000).ok());
  EXPECT_EQ(patient->stage(), DisputeStage::kDisputeReferee);
}

}  // namespace
}  // namespace meshlearn::protocol
