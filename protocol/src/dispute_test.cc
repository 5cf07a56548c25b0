#include "meshlearn/protocol/dispute.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/merkle.h"
#include "meshlearn/base/rng.h"

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

// A claim that the defender served nothing for a step (a pipeline stage over the witness bound,
// ledger/stage_serve.h) is ruled by whether its evidence came on chain, and the outcome says so:
// served, nobody lied (both honest, not undecided: the claimant is not slashed); not served by the
// window's end, the defender loses. Each survives the encoding the ledger keeps.
TEST(DisputeTest, AServedClaimIsRuledByWhetherTheEvidenceCameOnChain) {
  for (const bool served : {true, false}) {
    Trace liar{.lie_step = 31};
    DisputeConfig c = DisputeTestConfig(liar, kTruth, 30, 31, /*ops=*/0);
    c.referee_blocks = 4;
    auto g = DisputeGame::Create(c);
    ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee);
    ASSERT_TRUE(g->ExtendRefereeDeadline(140).ok());
    ASSERT_TRUE(g->OnBlock(120).ok());
    ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee) << "the window extends the deadline";
    ASSERT_TRUE(g->RuleServed(served, 140).ok());
    ASSERT_EQ(g->stage(), DisputeStage::kDisputeResolved);
    const DisputeOutcome& o = g->outcome();
    EXPECT_FALSE(o.undecided);
    EXPECT_EQ(o.defender_honest, served);
    EXPECT_TRUE(o.challenger_honest);
    EXPECT_EQ(o.reason, served ? "the stage served step 31's evidence on chain: the claim that it "
                                 "served nothing is answered (the step is checked from that "
                                 "evidence)"
                               : "the stage did not serve step 31's evidence by its serving "
                                 "window's end (height 140)");
    EXPECT_EQ(g->RuleServed(served, 140).code(), StatusCode::kFailedPrecondition) << "ruled once";
    auto back = DisputeGame::Decode(g->Encode());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->outcome().reason, o.reason);
    EXPECT_EQ(back->outcome().defender_honest, served);
  }
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

// ---- Phases 3 and 4: one tile of one operator, one block of a reduction ----------------------

// A party's run whose operator outputs are tiled roots: operator j of step s has `tiles` tiles;
// a liar's tiles of operator lie_op of lie_step from tile lie_tile on are wrong (and everything
// after). With blocks > 0, a tile's partial sums S_1..S_{K-1}: a lying tile's differ from block
// lie_block + 1 on (S_K is the tile itself).
struct TiledTrace {
  uint64_t lie_step = UINT64_MAX;
  uint32_t lie_op = 1;
  uint64_t lie_tile = 0;
  uint32_t lie_block = 0;
  uint64_t tiles = 1;

  bool Lying(uint64_t s, uint32_t j, uint64_t t) const {
    return s > lie_step || (s == lie_step && (j > lie_op || (j == lie_op && t >= lie_tile)));
  }
  Hash256 State(uint64_t s) const {
    return Blake2b((s >= lie_step ? "lie state " : "state ") + std::to_string(s));
  }
  Hash256 Tile(uint64_t s, uint32_t j, uint64_t t) const {
    return Blake2b((Lying(s, j, t) ? "lie tile " : "tile ") + std::to_string(s) + "/" +
                   std::to_string(j) + "/" + std::to_string(t));
  }
  std::vector<Hash256> Tiles(uint64_t s, uint32_t j) const {
    std::vector<Hash256> v;
    for (uint64_t t = 0; t < tiles; ++t) v.push_back(Tile(s, j, t));
    return v;
  }
  Hash256 Chain(uint64_t s, uint64_t j) const {
    Hash256 c = State(s - 1);
    for (uint32_t op = 1; op <= j; ++op) c = OperatorChainHash(c, MerkleRoot(Tiles(s, op)));
    return c;
  }
  Hash256 Partial(uint64_t s, uint32_t j, uint64_t t, uint64_t k) const {
    const bool lying =
        Lying(s, j, t) && (s != lie_step || j != lie_op || t != lie_tile || k > lie_block);
    return Blake2b((lying ? "lie partial " : "partial ") + std::to_string(s) + "/" +
                   std::to_string(j) + "/" + std::to_string(t) + "/" + std::to_string(k));
  }
  // The two children of node `node` at `level` of operator j's tile tree (base/merkle.h's shape).
  std::pair<Hash256, Hash256> Children(uint64_t s, uint32_t j, uint32_t level,
                                       uint64_t node) const {
    std::vector<std::vector<Hash256>> levels(1);
    for (const Hash256& h : Tiles(s, j)) levels[0].push_back(MerkleLeafHash(h));
    while (levels.back().size() > 1) {
      const std::vector<Hash256>& l = levels.back();
      std::vector<Hash256> next;
      for (size_t i = 0; i + 1 < l.size(); i += 2) next.push_back(MerkleInnerHash(l[i], l[i + 1]));
      if (l.size() % 2 == 1) next.push_back(l.back());
      levels.push_back(std::move(next));
    }
    const std::vector<Hash256>& below = levels.at(level - 1);
    return {below.at(2 * node), below.at(2 * node + 1)};
  }
  Status Move(DisputeGame& g, DisputeParty p, uint64_t height) const {
    const DisputeQuery q = g.query();
    switch (q.stage) {
      case DisputeStage::kDisputeSteps:
        return g.Post(p, q.position, State(q.position), height);
      case DisputeStage::kDisputeOperators:
        return g.Post(p, q.position, Chain(q.step, q.position), height);
      case DisputeStage::kDisputeTiles:
        if (!q.children)
          return g.Post(p, q.position, MerkleRoot(Tiles(q.step, q.operator_index)), height);
        {
          auto [l, r] = Children(q.step, q.operator_index, q.level, q.position);
          return g.PostChildren(p, q.position, l, r, height);
        }
      case DisputeStage::kDisputeReduction:
        return g.Post(p, q.position, Partial(q.step, q.operator_index, q.tile, q.position), height);
      default:
        return FailedPrecondition("no move");
    }
  }
};

DisputeConfig TiledConfig(const TiledTrace& d, const TiledTrace& c, uint64_t tiles,
                          uint32_t blocks) {
  DisputeConfig cfg;
  cfg.unit = UnitId{Blake2b("task"), 0, 0};
  cfg.defender.bytes.fill(1);
  cfg.challenger.bytes.fill(2);
  cfg.first_step = 0;
  cfg.last_step = 8;
  cfg.agreed = TiledTrace{}.State(0);
  cfg.defender_claim = d.State(8);
  cfg.challenger_claim = c.State(8);
  cfg.num_operators = kOps;
  cfg.operator_tiles.assign(kOps, tiles);
  cfg.operator_tiles[0] = 0;  // the step's input state: no tiles
  cfg.operator_blocks.assign(kOps, blocks);
  cfg.response_blocks = 5;
  cfg.start_height = 100;
  return cfg;
}

struct TiledPlay {
  RefereeTask task;
  DisputeOutcome outcome;
  uint32_t turns = 0;
};

// Both answer every query until the game waits for the referee (no encoding round trip).
void MoveToReferee(DisputeGame& g, const TiledTrace& d, const TiledTrace& c) {
  uint64_t height = g.config().start_height;
  while (g.stage() != DisputeStage::kDisputeReferee) {
    ++height;
    ASSERT_TRUE(d.Move(g, DisputeParty::kDefender, height).ok());
    ASSERT_TRUE(c.Move(g, DisputeParty::kChallenger, height).ok());
  }
}

// Both answer every query (through the encoding, every turn); the referee computes the truth.
TiledPlay PlayTiled(DisputeGame g, const TiledTrace& d, const TiledTrace& c) {
  const TiledTrace truth{.tiles = d.tiles};
  uint64_t height = g.config().start_height;
  while (g.stage() != DisputeStage::kDisputeReferee &&
         g.stage() != DisputeStage::kDisputeResolved) {
    ++height;
    EXPECT_TRUE(d.Move(g, DisputeParty::kDefender, height).ok());
    EXPECT_TRUE(c.Move(g, DisputeParty::kChallenger, height).ok());
    Bytes wire = g.Encode();
    EXPECT_EQ(wire[0], g.referee_task().roots == RefereeRoots::kRootsNone ? 2 : 3);
    auto back = DisputeGame::Decode(wire);
    EXPECT_TRUE(back.ok()) << back.status().ToString();
    if (!back.ok()) return {};
    EXPECT_EQ(back->Encode(), wire);
    g = std::move(*back);
  }
  TiledPlay p;
  EXPECT_EQ(g.stage(), DisputeStage::kDisputeReferee);
  p.task = g.referee_task();
  const RefereeTask& t = p.task;
  Hash256 correct;
  if (t.whole_step && t.roots == RefereeRoots::kRootsOperator) {
    // The input state's operator, ruled from roots: the true C_j (RuleOperator).
    EXPECT_TRUE(g.RuleOperator(truth.Chain(t.step, t.operator_index)).ok());
    return TiledPlay{t, g.outcome(), g.turns()};
  } else if (t.whole_step && t.roots == RefereeRoots::kRootsChainEnd) {
    // The agreed chain end's roots give the state after the step (RuleChainEnd).
    EXPECT_TRUE(g.RuleChainEnd(truth.State(t.step)).ok());
    return TiledPlay{t, g.outcome(), g.turns()};
  } else if (t.whole_step) {
    correct = truth.State(t.step);
  } else if (t.reduction_blocks == 0 || t.block + 1 == t.reduction_blocks) {
    correct = MerkleLeafHash(truth.Tile(t.step, t.operator_index, t.tile_index));
  } else {
    correct = truth.Partial(t.step, t.operator_index, t.tile_index, t.block + 1);
  }
  EXPECT_TRUE(g.Rule(correct).ok());
  p.outcome = g.outcome();
  p.turns = g.turns();
  return p;
}

uint32_t Log2Up(uint64_t n) { return n <= 1 ? 0 : static_cast<uint32_t>(std::bit_width(n - 1)); }

TEST(DisputeTileTest, TheGameFindsTheFirstWrongTileInEveryTreeShape) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 8u, 13u, 33u}) {
    for (uint64_t t = 0; t < n; t += (n > 13 ? 7 : 1)) {
      for (bool defender_lies : {true, false}) {
        SCOPED_TRACE(std::to_string(n) + " tiles, lie at " + std::to_string(t));
        TiledTrace liar{.lie_step = 5, .lie_op = 9, .lie_tile = t, .tiles = n};
        TiledTrace honest{.tiles = n};
        const TiledTrace& d = defender_lies ? liar : honest;
        const TiledTrace& c = defender_lies ? honest : liar;
        auto g = DisputeGame::Create(TiledConfig(d, c, n, 0));
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        TiledPlay p = PlayTiled(std::move(*g), d, c);
        ASSERT_TRUE(p.task.tile);
        EXPECT_EQ(p.task.step, 5u);
        EXPECT_EQ(p.task.operator_index, 9u);
        EXPECT_EQ(p.task.tile_index, t);
        EXPECT_EQ(p.task.tile_count, n);
        EXPECT_EQ(p.task.input, honest.Chain(5, 8));
        EXPECT_EQ(p.task.state_input, honest.State(4));
        EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
        EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
        EXPECT_LE(p.turns, Log2Up(8) + 1 + Log2Up(kOps) + 1 + Log2Up(n));
      }
    }
  }
}

TEST(DisputeTileTest, TheReductionPhaseFindsTheFirstWrongBlock) {
  for (uint32_t k : {1u, 2u, 4u, 7u}) {
    for (uint32_t b = 0; b < k; ++b) {
      SCOPED_TRACE(std::to_string(k) + " blocks, lie from " + std::to_string(b));
      TiledTrace liar{.lie_step = 8, .lie_op = 16, .lie_tile = 3, .lie_block = b, .tiles = 5};
      TiledTrace honest{.tiles = 5};
      auto g = DisputeGame::Create(TiledConfig(liar, honest, 5, k));
      ASSERT_TRUE(g.ok());
      TiledPlay p = PlayTiled(std::move(*g), liar, honest);
      EXPECT_EQ(p.task.tile_index, 3u);
      EXPECT_EQ(p.task.reduction_blocks, k);
      EXPECT_EQ(p.task.block, b);
      EXPECT_EQ(p.task.partial_input, b == 0 ? Hash256{} : honest.Partial(8, 16, 3, b));
      EXPECT_FALSE(p.outcome.defender_honest) << p.outcome.reason;
      EXPECT_TRUE(p.outcome.challenger_honest);
      EXPECT_NE(p.outcome.reason.find("reduction block " + std::to_string(b)), std::string::npos)
          << p.outcome.reason;
    }
  }
}

// An operator without tiles (the step's input state, or one without a footprint) ends at the
// whole step, which the referee task also carries as that operator's C_{j-1} and both C_j, so
// the ledger can rule an input-state operator from roots (RuleOperator); a whole-step referee
// still rules it by the state after the step (Rule).
TEST(DisputeTileTest, AnOperatorWithoutTilesIsAWholeStepAlsoRuledByItsOperatorOutput) {
  for (bool defender_lies : {true, false}) {
    SCOPED_TRACE(defender_lies ? "defender lies" : "challenger lies");
    TiledTrace liar{.lie_step = 3, .lie_op = 1, .tiles = 4};  // op 1: the input state
    TiledTrace honest{.tiles = 4};
    const TiledTrace& d = defender_lies ? liar : honest;
    const TiledTrace& c = defender_lies ? honest : liar;
    auto g = DisputeGame::Create(TiledConfig(d, c, 4, 0));
    ASSERT_TRUE(g.ok());
    DisputeGame whole = *g;
    TiledPlay p = PlayTiled(std::move(*g), d, c);
    EXPECT_TRUE(p.task.whole_step);
    EXPECT_FALSE(p.task.tile);
    EXPECT_EQ(p.task.roots, RefereeRoots::kRootsOperator);
    EXPECT_EQ(p.task.step, 3u);
    EXPECT_EQ(p.task.operator_index, 1u);
    EXPECT_EQ(p.task.input, honest.State(2));
    EXPECT_EQ(p.task.operator_input, honest.State(2));  // C_0
    EXPECT_EQ(p.task.defender_operator_output, d.Chain(3, 1));
    EXPECT_EQ(p.task.challenger_operator_output, c.Chain(3, 1));
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    EXPECT_NE(p.outcome.reason.find("operator 1 of step 3 from the input state's roots"),
              std::string::npos)
        << p.outcome.reason;
    // The same game ruled by the whole step (RefereeStep, or the genesis referee where the ledger
    // does not rule it) by the state after it; RuleOperator only at the referee stage.
    EXPECT_EQ(whole.RuleOperator(Hash256{}).code(), StatusCode::kFailedPrecondition);
    ASSERT_NO_FATAL_FAILURE(MoveToReferee(whole, d, c));
    ASSERT_TRUE(whole.Rule(honest.State(3)).ok());
    EXPECT_EQ(whole.outcome().defender_honest, !defender_lies);
    EXPECT_EQ(whole.RuleOperator(honest.Chain(3, 1)).code(), StatusCode::kFailedPrecondition);
  }
}

// Operator chains that agree at C_n while the states after the step differ: a whole step whose
// referee task carries the agreed C_n (the state follows from the outputs it commits to).
TEST(DisputeTileTest, AgreedChainEndsAreAWholeStepCarryingTheChainEnd) {
  for (bool defender_lies : {true, false}) {
    SCOPED_TRACE(defender_lies ? "defender lies" : "challenger lies");
    TiledTrace liar{.lie_step = 4, .lie_op = kOps + 1, .tiles = 3};  // no operator of step 4
    TiledTrace honest{.tiles = 3};
    const TiledTrace& d = defender_lies ? liar : honest;
    const TiledTrace& c = defender_lies ? honest : liar;
    auto g = DisputeGame::Create(TiledConfig(d, c, 3, 0));
    ASSERT_TRUE(g.ok());
    DisputeGame whole = *g;
    TiledPlay p = PlayTiled(std::move(*g), d, c);
    EXPECT_TRUE(p.task.whole_step);
    EXPECT_EQ(p.task.roots, RefereeRoots::kRootsChainEnd);
    EXPECT_EQ(p.task.step, 4u);
    EXPECT_EQ(p.task.chain_end, honest.Chain(4, kOps));
    EXPECT_EQ(p.task.input, honest.State(3));
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    // Ruled from roots (RuleChainEnd), the reason says so: nobody recomputed the step.
    EXPECT_NE(p.outcome.reason.find("referee ruled step 4 from the roots of the agreed chain end"),
              std::string::npos)
        << p.outcome.reason;
    EXPECT_EQ(p.outcome.reason.find("recomputed"), std::string::npos) << p.outcome.reason;
    // The same game ruled by an executed whole step (Rule) reads as recomputed; RuleChainEnd only
    // at the referee stage, and only for a task with the chain end agreed.
    EXPECT_EQ(whole.RuleChainEnd(honest.State(4)).code(), StatusCode::kFailedPrecondition);
    ASSERT_NO_FATAL_FAILURE(MoveToReferee(whole, d, c));
    ASSERT_TRUE(whole.Rule(honest.State(4)).ok());
    EXPECT_EQ(whole.outcome().defender_honest, !defender_lies);
    EXPECT_NE(whole.outcome().reason.find("referee recomputed step 4"), std::string::npos)
        << whole.outcome().reason;
    EXPECT_EQ(whole.RuleChainEnd(honest.State(4)).code(), StatusCode::kFailedPrecondition);
  }
}

// RuleChainEnd rules nothing but a chain-end task: not an operator without tiles, not a tile.
TEST(DisputeTileTest, RuleChainEndIsRefusedForAnyOtherTask) {
  for (uint32_t lie_op : {1u, 5u}) {
    SCOPED_TRACE("lie at operator " + std::to_string(lie_op));
    TiledTrace liar{.lie_step = 3, .lie_op = lie_op, .lie_tile = 2, .tiles = 4};
    TiledTrace honest{.tiles = 4};
    auto g = DisputeGame::Create(TiledConfig(liar, honest, 4, 0));
    ASSERT_TRUE(g.ok());
    ASSERT_NO_FATAL_FAILURE(MoveToReferee(*g, liar, honest));
    EXPECT_NE(g->referee_task().roots, RefereeRoots::kRootsChainEnd);
    EXPECT_EQ(g->RuleChainEnd(honest.State(3)).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(g->stage(), DisputeStage::kDisputeReferee) << "nothing ruled";
  }
}

// A game whose referee task is ruled from roots encodes as version 3 (version 2 and the roots
// fields); it decodes to the same game, refuses truncation, an unknown roots kind, and a roots
// operator that has tiles.
TEST(DisputeTileTest, ARefereeTaskRuledFromRootsEncodesAsVersionThree) {
  for (uint32_t lie_op : {1u, kOps + 1}) {
    SCOPED_TRACE("lie at operator " + std::to_string(lie_op));
    TiledTrace liar{.lie_step = 3, .lie_op = lie_op, .tiles = 4};
    TiledTrace honest{.tiles = 4};
    auto g = DisputeGame::Create(TiledConfig(liar, honest, 4, 0));
    ASSERT_TRUE(g.ok());
    uint64_t height = 100;
    while (g->stage() != DisputeStage::kDisputeReferee) {
      ++height;
      EXPECT_EQ(g->Encode()[0], 2);
      ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
      ASSERT_TRUE(honest.Move(*g, DisputeParty::kChallenger, height).ok());
    }
    const Bytes v3 = g->Encode();
    ASSERT_EQ(v3[0], 3);
    auto back = DisputeGame::Decode(v3);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->Encode(), v3);
    EXPECT_EQ(back->referee_task().roots, g->referee_task().roots);
    EXPECT_EQ(back->referee_task().chain_end, g->referee_task().chain_end);
    EXPECT_EQ(back->referee_task().defender_operator_output,
              g->referee_task().defender_operator_output);
    for (size_t cut = 0; cut < v3.size(); cut += 7) {
      EXPECT_FALSE(DisputeGame::Decode(ByteSpan(v3.data(), cut)).ok()) << cut;
    }
    // The roots fields: kind (1), chain end, C_{j-1}, both C_j (4 x 32).
    const size_t kind = v3.size() - 4 * 32 - 1;
    for (uint8_t bad : {0, 3, 255}) {
      Bytes forged = v3;
      forged[kind] = bad;
      EXPECT_FALSE(DisputeGame::Decode(forged).ok()) << int{bad};
    }
    Bytes as_v2 = v3;
    as_v2[0] = 2;
    EXPECT_FALSE(DisputeGame::Decode(as_v2).ok()) << "trailing roots fields";
    // Ruled, it stays version 3.
    if (g->referee_task().roots == RefereeRoots::kRootsOperator) {
      ASSERT_TRUE(g->RuleOperator(honest.Chain(3, 1)).ok());
    } else {
      ASSERT_TRUE(g->Rule(honest.State(3)).ok());
    }
    const Bytes ruled = g->Encode();
    EXPECT_EQ(ruled[0], 3);
    ASSERT_TRUE(DisputeGame::Decode(ruled).ok());
    EXPECT_TRUE(DisputeGame::Decode(ruled)->outcome().challenger_honest);
  }
}

TEST(DisputeTileTest, TileMovesThatDoNotHashToTheirClaimsAreRefused) {
  TiledTrace liar{.lie_step = 2, .lie_op = 5, .lie_tile = 6, .tiles = 9};
  TiledTrace honest{.tiles = 9};
  auto g = DisputeGame::Create(TiledConfig(liar, honest, 9, 0));
  ASSERT_TRUE(g.ok());
  uint64_t height = 100;
  while (g->stage() != DisputeStage::kDisputeTiles) {
    ++height;
    ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
    ASSERT_TRUE(honest.Move(*g, DisputeParty::kChallenger, height).ok());
  }
  DisputeQuery q = g->query();
  EXPECT_FALSE(q.children);
  EXPECT_EQ(q.operator_index, 5u);
  // The honest root does not chain to the liar's C_5.
  EXPECT_EQ(
      g->Post(DisputeParty::kDefender, q.position, MerkleRoot(honest.Tiles(2, 5)), height).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      g->PostChildren(DisputeParty::kDefender, q.position, Hash256{}, Hash256{}, height).code(),
      StatusCode::kFailedPrecondition);
  ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
  ASSERT_TRUE(honest.Move(*g, DisputeParty::kChallenger, height).ok());
  q = g->query();
  ASSERT_TRUE(q.children);
  auto [l, r] = liar.Children(2, 5, q.level, q.position);
  EXPECT_EQ(g->PostChildren(DisputeParty::kDefender, q.position, r, l, height).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Post(DisputeParty::kDefender, q.position, l, height).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(g->PostChildren(DisputeParty::kDefender, q.position + 1, l, r, height).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(g->PostChildren(DisputeParty::kDefender, q.position, l, r, height).ok());
  EXPECT_EQ(g->PostChildren(DisputeParty::kDefender, q.position, l, r, height).code(),
            StatusCode::kAlreadyExists);
  // Silent at the children: the challenger loses.
  EXPECT_TRUE(g->OnBlock(q.deadline_height + 1).ok());
  EXPECT_EQ(g->stage(), DisputeStage::kDisputeResolved);
  EXPECT_TRUE(g->outcome().defender_honest);
  EXPECT_FALSE(g->outcome().challenger_honest);
}

TEST(DisputeTileTest, EncodingIsVersionOneWithoutTilesAndTwoWith) {
  Trace lazy{.lie_step = 3, .lie_op = 2};
  auto plain = DisputeGame::Create(DisputeTestConfig(lazy, kTruth, 0, 8));
  ASSERT_TRUE(plain.ok());
  Bytes v1 = plain->Encode();
  EXPECT_EQ(v1[0], 1) << "a game without the tile phase encodes as it always did";
  TiledTrace liar{.lie_step = 3, .lie_op = 2, .tiles = 4};
  auto tiled = DisputeGame::Create(TiledConfig(liar, TiledTrace{.tiles = 4}, 4, 2));
  ASSERT_TRUE(tiled.ok());
  Bytes v2 = tiled->Encode();
  EXPECT_EQ(v2[0], 2);
  ASSERT_TRUE(DisputeGame::Decode(v2).ok());
  for (size_t cut = 0; cut < v2.size(); cut += 11) {
    EXPECT_FALSE(DisputeGame::Decode(ByteSpan(v2.data(), cut)).ok()) << cut;
  }
  // A version-1 game cannot be in a tile stage: its stage byte follows the config (246 bytes).
  Bytes forged = v1;
  ASSERT_EQ(forged[246], static_cast<uint8_t>(DisputeStage::kDisputeSteps));
  ASSERT_TRUE(DisputeGame::Decode(forged).ok());
  forged[246] = static_cast<uint8_t>(DisputeStage::kDisputeTiles);
  EXPECT_FALSE(DisputeGame::Decode(forged).ok());
  // A children turn whose right child is missing (a forged state) is refused, not played.
  {
    TiledTrace honest{.tiles = 4};
    auto g = DisputeGame::Create(TiledConfig(liar, honest, 4, 2));
    ASSERT_TRUE(g.ok());
    uint64_t height = 100;
    while (!g->query().children) {
      ++height;
      ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
      ASSERT_TRUE(honest.Move(*g, DisputeParty::kChallenger, height).ok());
    }
    ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
    Bytes wire = g->Encode();
    ASSERT_TRUE(DisputeGame::Decode(wire).ok());
    // The tail: ... d_right (present, 33 bytes), c_right (absent, 1 byte), tile (8), referee
    // fields (1 + 8 + 8 + 4 + 4 + 32 + 32 = 89): drop d_right's hash and mark it absent.
    const size_t tail = 89 + 8 + 1;
    const size_t d_right = wire.size() - tail - 33;
    ASSERT_EQ(wire[d_right], 1);
    Bytes forged(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(d_right));
    forged.push_back(0);
    forged.insert(forged.end(), wire.end() - static_cast<std::ptrdiff_t>(tail), wire.end());
    auto back = DisputeGame::Decode(forged);
    ASSERT_FALSE(back.ok());
    EXPECT_NE(back.status().message().find("child"), std::string::npos) << back.status().message();
  }
  DisputeConfig bad = TiledConfig(liar, TiledTrace{.tiles = 4}, 4, 2);
  bad.operator_tiles.pop_back();
  EXPECT_FALSE(DisputeGame::Create(bad).ok());
  bad = TiledConfig(liar, TiledTrace{.tiles = 4}, 4, 2);
  bad.operator_blocks.pop_back();
  EXPECT_FALSE(DisputeGame::Create(bad).ok());
}

TEST(DisputeTileTest, MutatedEncodingsDecodeToPlayableGamesOrAreRefused) {
  // Every state of a tiled game, with random bytes changed: Decode refuses it, or the game it
  // gives answers every call without crashing (the ledger decodes games from its store).
  TiledTrace liar{.lie_step = 6, .lie_op = 7, .lie_tile = 5, .lie_block = 1, .tiles = 11};
  TiledTrace honest{.tiles = 11};
  auto g = DisputeGame::Create(TiledConfig(liar, honest, 11, 3));
  ASSERT_TRUE(g.ok());
  std::vector<Bytes> states;
  uint64_t height = 100;
  while (g->stage() != DisputeStage::kDisputeReferee) {
    ++height;
    ASSERT_TRUE(liar.Move(*g, DisputeParty::kDefender, height).ok());
    states.push_back(g->Encode());  // half a turn
    ASSERT_TRUE(honest.Move(*g, DisputeParty::kChallenger, height).ok());
    states.push_back(g->Encode());
  }
  // And the referee stage of the two games ruled from roots (version 3).
  for (uint32_t lie_op : {1u, kOps + 1}) {
    TiledTrace roots_liar{.lie_step = 2, .lie_op = lie_op, .tiles = 4};
    TiledTrace roots_honest{.tiles = 4};
    auto r = DisputeGame::Create(TiledConfig(roots_liar, roots_honest, 4, 0));
    ASSERT_TRUE(r.ok());
    ASSERT_NO_FATAL_FAILURE(MoveToReferee(*r, roots_liar, roots_honest));
    states.push_back(r->Encode());
  }
  Rng rng(99);
  int decoded = 0;
  for (const Bytes& state : states) {
    for (int i = 0; i < 300; ++i) {
      Bytes m = state;
      const int flips = 1 + static_cast<int>(rng.Uniform(3));
      for (int f = 0; f < flips; ++f) {
        m[rng.Uniform(m.size())] = static_cast<uint8_t>(rng.Uniform(256));
      }
      auto back = DisputeGame::Decode(m);
      if (!back.ok()) continue;
      ++decoded;
      DisputeGame& d = *back;
      for (DisputeParty p : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
        if (d.stage() == DisputeStage::kDisputeReferee ||
            d.stage() == DisputeStage::kDisputeResolved) {
          break;
        }
        const DisputeQuery q = d.query();
        const Hash256 h = Blake2b("random " + std::to_string(i));
        (void)(q.children ? d.PostChildren(p, q.position, h, h, q.deadline_height)
                          : d.Post(p, q.position, h, q.deadline_height));
      }
      (void)d.OnBlock(d.query().deadline_height + 1);
      if (d.stage() == DisputeStage::kDisputeReferee) {
        (void)(i % 2 == 0 ? d.Rule(Hash256{}) : d.RuleOperator(Hash256{}));
      }
      EXPECT_TRUE(DisputeGame::Decode(d.Encode()).ok());
    }
  }
  EXPECT_GT(decoded, 100);  // the mutations also reach the game, not only the decoder
}

}  // namespace
}  // namespace meshlearn::protocol
