// The dispute game (protocol/dispute.h) played end to end on real training, down to one operator:
// an honest party and a liar train the same tiny classifier for 8 steps; the liar's computation
// goes wrong at one operator of one step. Each party answers every query from its own run (phase
// 1: its state hash after the queried step; phase 2: its chained operator hash C_j of the queried
// step, from the OpTrace it recorded while training that step), and the referee recomputes the
// single transition the game narrows to by replaying the step. protocol/src/dispute_test.cc
// checks the game on synthetic hashes; this checks that real op traces fit it: the game finds the
// first operator the engine saw differ, and the honest side wins whichever role it plays.
#include <bit>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/check.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/tensor.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/protocol/dispute.h"

namespace meshlearn::node {
namespace {

using engine::OpTrace;
using engine::Trainer;
using protocol::DisputeConfig;
using protocol::DisputeGame;
using protocol::DisputeOutcome;
using protocol::DisputeParty;
using protocol::DisputeQuery;
using protocol::DisputeStage;
using protocol::OperatorChainHash;
using protocol::RefereeTask;

constexpr char kMlp[] = R"(
[task]
name = "dispute-mlp"
seed = 11
[data]
format = "npy"
train_x = "unused"
train_y = "unused"
test_x = "unused"
test_y = "unused"
[model]
input = [12]
[[model.layers]]
kind = "linear"
out = 16
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 8
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 4
[optimizer]
kind = "adamw"
lr = 1e-2
[train]
steps = 8
batch_size = 8
)";

constexpr uint64_t kSteps = 8;    // the disputed segment is steps 1..8 (agreed: the start state)
constexpr uint64_t kLieStep = 5;  // the step inside which the liar's computation goes wrong

// Synthetic 4-class data, no files.
engine::TaskData SyntheticData() {
  engine::TaskData d;
  Rng rng(5);
  const int64_t n = 64;
  std::vector<float> x(static_cast<size_t>(n * 12));
  for (float& v : x) v = static_cast<float>(rng.UniformDouble()) - 0.5f;
  d.train.x = engine::Tensor({n, 12}, x);
  d.train.y.resize(n);
  for (int64_t i = 0; i < n; ++i) d.train.y[i] = static_cast<int32_t>(rng.Uniform(4));
  d.train.num_classes = 4;
  d.test = d.train;
  return d;
}

std::unique_ptr<Trainer> MakeTrainer() {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(kMlp, "dispute-mlp.toml", ".");
  CHECK(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, SyntheticData());
  CHECK(tr.ok()) << tr.status().ToString();
  return std::move(*tr);
}

OpTrace TraceStep(Trainer& tr) {
  OpTrace trace;
  tr.state().model->set_op_trace(&trace);
  tr.Step();
  tr.state().model->set_op_trace(nullptr);
  return trace;
}

// How the liar's step `lie_step` goes wrong. Every lie is a real computation whose trace the
// engine records; from the lie on, the liar keeps training from its own (wrong) state.
enum class Lie {
  kNone,
  // The step reads one weight of layers.2 off by 1e-3 (a memory fault, or a solver that skipped
  // work), and keeps it: the first differing operator is that weight in the step's recorded
  // input state (op_trace.h), the first computed one the forward output of layers.2.
  kCorruptedRead,
  // The step's update uses twice the learning rate (a lazy or careless solver): forward and
  // backward are right, the first differing operator is the first updated parameter.
  kWrongUpdate,
  // After the step, one Adam first moment is off in the state it hashes, while the operator
  // outputs it posts (the moment's included) are the honest ones.
  kOptimizerState,
};

// One party's run: what it answers the game from.
struct PartyRun {
  std::vector<Hash256> state;   // state[s]: StateHash after step s, s = 0..kSteps
  std::vector<OpTrace> traces;  // traces[s]: the operator outputs of step s (traces[0] empty)
};

PartyRun Train(Lie lie, uint64_t lie_step = kLieStep) {
  std::unique_ptr<Trainer> tr = MakeTrainer();
  engine::TrainState& st = tr->state();
  PartyRun run;
  run.state.push_back(engine::StateHash(st));
  run.traces.emplace_back();
  for (uint64_t s = 1; s <= kSteps; ++s) {
    const bool lying = s == lie_step;
    if (lying && lie == Lie::kCorruptedRead) st.model->params()[2].value.data()[5] += 1e-3f;
    if (lying && lie == Lie::kWrongUpdate) {
      // Swap in an optimizer at twice the rate carrying the same moments, step, swap back (with
      // the moments it produced).
      engine::OptimizerSpec fast = st.optimizer->spec();
      fast.lr *= 2;
      auto wrong = std::make_unique<engine::Optimizer>(fast, st.model->params());
      std::vector<engine::Optimizer::NamedState> from = st.optimizer->State();
      std::vector<engine::Optimizer::NamedState> to = wrong->State();
      for (size_t i = 0; i < from.size(); ++i) *to[i].tensor = *from[i].tensor;
      std::unique_ptr<engine::Optimizer> right = std::exchange(st.optimizer, std::move(wrong));
      run.traces.push_back(TraceStep(*tr));
      from = st.optimizer->State();
      to = right->State();
      for (size_t i = 0; i < from.size(); ++i) *to[i].tensor = *from[i].tensor;
      st.optimizer = std::move(right);
    } else {
      run.traces.push_back(TraceStep(*tr));
    }
    if (lying && lie == Lie::kOptimizerState) st.optimizer->State()[0].tensor->data()[0] += 1e-3f;
    run.state.push_back(engine::StateHash(st));
  }
  return run;
}

// C_j of step `step` in `run`: C_0 is the state the step starts from.
Hash256 ChainHash(const PartyRun& run, uint64_t step, uint64_t j) {
  const OpTrace& t = run.traces.at(step);
  CHECK(j <= t.size()) << "C_" << j << " of a step with " << t.size() << " operators";
  Hash256 c = run.state.at(step - 1);
  for (uint64_t op = 1; op <= j; ++op) c = OperatorChainHash(c, t.hash(op - 1));
  return c;
}

Hash256 Answer(const PartyRun& run, const DisputeQuery& q) {
  if (q.stage == DisputeStage::kDisputeSteps) return run.state.at(q.position);
  return ChainHash(run, q.step, q.position);
}

size_t IndexOf(const OpTrace& t, const std::string& name) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.name(i) == name) return i;
  }
  ADD_FAILURE() << "no operator " << name;
  return t.size();
}

uint32_t CeilLog2(uint64_t n) { return n <= 1 ? 0 : static_cast<uint32_t>(std::bit_width(n - 1)); }

// The referee: replays the task from its start to the state after task.step - 1 (as RuleWholeStep
// does: nothing the parties say is trusted), checks the task's input against the replay, and
// computes the disputed transition: C_j of the step (task.input must be C_{j-1}), or the state
// after the whole step (task.input must be the state before it).
Hash256 RefereeOutput(const RefereeTask& task) {
  std::unique_ptr<Trainer> tr = MakeTrainer();
  for (uint64_t s = 1; s < task.step; ++s) tr->Step();
  Hash256 before = engine::StateHash(tr->state());
  OpTrace trace = TraceStep(*tr);
  if (task.whole_step) {
    EXPECT_EQ(task.input, before) << "the agreed state is not the true state after step "
                                  << task.step - 1;
    return engine::StateHash(tr->state());
  }
  EXPECT_GE(task.operator_index, 1u);
  EXPECT_LE(task.operator_index, trace.size());
  Hash256 c = before;  // C_0
  for (uint32_t op = 1; op < task.operator_index; ++op)
    c = OperatorChainHash(c, trace.hash(op - 1));
  EXPECT_EQ(task.input, c) << "the agreed C_" << task.operator_index - 1 << " is not the true one";
  return OperatorChainHash(c, trace.hash(task.operator_index - 1));
}

struct Played {
  std::optional<uint64_t> phase2_step;  // the step phase 1 narrowed to
  std::optional<RefereeTask> task;      // what the referee was asked, if the game got there
  DisputeOutcome outcome;
  uint32_t turns = 0;
};

DisputeConfig Config(const PartyRun& defender, const PartyRun& challenger) {
  DisputeConfig c;
  c.unit = protocol::UnitId{Blake2b("dispute-mlp"), 0, 0};
  c.defender.bytes.fill(1);
  c.challenger.bytes.fill(2);
  c.first_step = 0;
  c.last_step = kSteps;
  c.agreed = defender.state[0];
  c.defender_claim = defender.state[kSteps];
  c.challenger_claim = challenger.state[kSteps];
  c.num_operators = static_cast<uint32_t>(defender.traces[1].size());
  c.response_blocks = 5;
  c.start_height = 100;
  return c;
}

// Plays the game to the end: both parties answer every query from their runs (one turn per
// block), except that `silent` posts nothing once phase 2 starts; the referee rules when asked.
// The game goes through its canonical encoding after every turn, as the ledger stores it.
Played Play(const PartyRun& defender, const PartyRun& challenger,
            std::optional<DisputeParty> silent = std::nullopt) {
  Played p;
  EXPECT_EQ(defender.state[0], challenger.state[0]);
  Result<DisputeGame> created = DisputeGame::Create(Config(defender, challenger));
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return p;
  DisputeGame g = std::move(*created);
  uint64_t height = g.config().start_height;
  while (g.stage() == DisputeStage::kDisputeSteps || g.stage() == DisputeStage::kDisputeOperators) {
    DisputeQuery q = g.query();
    if (q.stage == DisputeStage::kDisputeOperators && !p.phase2_step) {
      p.phase2_step = q.step;
      EXPECT_EQ(q.position, g.config().num_operators) << "phase 2 opens with the chain end C_n";
    }
    ++height;
    EXPECT_LE(height, q.deadline_height);
    const bool quiet = silent && q.stage == DisputeStage::kDisputeOperators;
    if (!(quiet && *silent == DisputeParty::kDefender)) {
      EXPECT_TRUE(g.Post(DisputeParty::kDefender, q.position, Answer(defender, q), height).ok());
    }
    if (!(quiet && *silent == DisputeParty::kChallenger)) {
      EXPECT_TRUE(
          g.Post(DisputeParty::kChallenger, q.position, Answer(challenger, q), height).ok());
    }
    if (quiet) {
      EXPECT_TRUE(g.OnBlock(q.deadline_height).ok());
      EXPECT_EQ(g.stage(), DisputeStage::kDisputeOperators) << "the deadline block still counts";
      height = q.deadline_height + 1;
      EXPECT_TRUE(g.OnBlock(height).ok());
      EXPECT_EQ(g.stage(), DisputeStage::kDisputeResolved);
    } else {
      EXPECT_TRUE(g.OnBlock(height).ok());
    }
    Bytes bytes = g.Encode();
    Result<DisputeGame> decoded = DisputeGame::Decode(bytes);
    EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
    if (!decoded.ok()) return p;
    EXPECT_EQ(decoded->Encode(), bytes);
    g = std::move(*decoded);
  }
  if (g.stage() == DisputeStage::kDisputeReferee) {
    p.task = g.referee_task();
    EXPECT_TRUE(g.Rule(RefereeOutput(*p.task)).ok());
  }
  EXPECT_EQ(g.stage(), DisputeStage::kDisputeResolved);
  p.outcome = g.outcome();
  p.turns = g.turns();
  return p;
}

// The turn bound documented on DisputeGame::turns().
uint32_t TurnBound(uint32_t num_operators) {
  return CeilLog2(kSteps) + 1 + CeilLog2(num_operators);
}

// Plays `lie` with the liar in each role; checks (a) the game narrows to the liar's step and to
// the first operator its trace differs at, (b) the referee's ruling makes the honest party win,
// (d) the turn bound.
void ExpectNarrowsToTheLie(Lie lie, uint64_t lie_step, const std::string& first_wrong_operator) {
  PartyRun honest = Train(Lie::kNone);
  PartyRun liar = Train(lie, lie_step);
  for (uint64_t s = 0; s < lie_step; ++s) ASSERT_EQ(honest.state[s], liar.state[s]) << s;
  ASSERT_NE(honest.state[kSteps], liar.state[kSteps]);
  const OpTrace& truth = honest.traces[lie_step];
  int64_t first = engine::FirstDifference(truth, liar.traces[lie_step]);
  ASSERT_GE(first, 0) << "the lie shows in no operator output of step " << lie_step;
  EXPECT_EQ(static_cast<size_t>(first), IndexOf(truth, first_wrong_operator));
  const uint32_t ops = static_cast<uint32_t>(truth.size());
  for (DisputeParty liar_role : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
    SCOPED_TRACE("liar: " + std::string(protocol::DisputePartyName(liar_role)) + ", step " +
                 std::to_string(lie_step));
    const bool defender_lies = liar_role == DisputeParty::kDefender;
    Played p = defender_lies ? Play(liar, honest) : Play(honest, liar);
    EXPECT_EQ(p.phase2_step, lie_step);
    ASSERT_TRUE(p.task.has_value());
    EXPECT_FALSE(p.task->whole_step);
    EXPECT_EQ(p.task->step, lie_step);
    EXPECT_EQ(p.task->operator_index, static_cast<uint32_t>(first + 1));  // 1-based
    const uint64_t j = p.task->operator_index;
    EXPECT_EQ(p.task->input, ChainHash(honest, lie_step, j - 1));
    EXPECT_EQ(p.task->input, ChainHash(liar, lie_step, j - 1));
    const Hash256& liar_output =
        defender_lies ? p.task->defender_output : p.task->challenger_output;
    const Hash256& honest_output =
        defender_lies ? p.task->challenger_output : p.task->defender_output;
    EXPECT_EQ(honest_output, ChainHash(honest, lie_step, j));
    EXPECT_EQ(liar_output, ChainHash(liar, lie_step, j));
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    EXPECT_FALSE(p.outcome.undecided);
    EXPECT_NE(p.outcome.reason.find("operator " + std::to_string(j) + " of step " +
                                    std::to_string(lie_step)),
              std::string::npos)
        << p.outcome.reason;
    EXPECT_GE(p.turns, 1u);
    EXPECT_LE(p.turns, TurnBound(ops));
  }
}

TEST(OperatorDisputeTest, ACorruptedReadIsNarrowedToTheWeightItRead) {
  ExpectNarrowsToTheLie(Lie::kCorruptedRead, kLieStep, "in.layers.2.weight");
}

TEST(OperatorDisputeTest, AWrongUpdateIsNarrowedToTheFirstUpdatedParameter) {
  ExpectNarrowsToTheLie(Lie::kWrongUpdate, kLieStep, "layers.0.weight");
}

TEST(OperatorDisputeTest, EveryStepOfTheSegment) {
  // The first and last steps are the bisection's edges.
  for (uint64_t s = 1; s <= kSteps; ++s) {
    ExpectNarrowsToTheLie(Lie::kCorruptedRead, s, "in.layers.2.weight");
  }
}

TEST(OperatorDisputeTest, ALieOnlyInTheOptimizerStateGoesToAWholeStepReferee) {
  // The trace records the moments after the update too, but this liar posts the honest trace
  // and lies in its state hash only, so C_n agrees while the state differs: the referee must run
  // the whole step (the state hash is not derived from the operator outputs).
  PartyRun honest = Train(Lie::kNone);
  PartyRun liar = Train(Lie::kOptimizerState);
  ASSERT_EQ(engine::FirstDifference(honest.traces[kLieStep], liar.traces[kLieStep]), -1);
  ASSERT_NE(honest.state[kLieStep], liar.state[kLieStep]);
  for (DisputeParty liar_role : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
    SCOPED_TRACE("liar: " + std::string(protocol::DisputePartyName(liar_role)));
    const bool defender_lies = liar_role == DisputeParty::kDefender;
    Played p = defender_lies ? Play(liar, honest) : Play(honest, liar);
    EXPECT_EQ(p.phase2_step, kLieStep);
    ASSERT_TRUE(p.task.has_value());
    EXPECT_TRUE(p.task->whole_step);
    EXPECT_EQ(p.task->step, kLieStep);
    EXPECT_EQ(p.task->input, honest.state[kLieStep - 1]);
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    // Phase 1, then the one C_n turn.
    EXPECT_EQ(p.turns, CeilLog2(kSteps) + 1);
  }
}

TEST(OperatorDisputeTest, APartySilentInPhaseTwoLoses) {
  // Whoever stops answering loses, the liar or the honest party: the game cannot tell a silent
  // honest party from a liar that gave up.
  PartyRun honest = Train(Lie::kNone);
  PartyRun liar = Train(Lie::kCorruptedRead);
  const uint32_t bound = TurnBound(static_cast<uint32_t>(honest.traces[1].size()));
  for (DisputeParty silent : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
    for (bool defender_lies : {true, false}) {
      SCOPED_TRACE(std::string(protocol::DisputePartyName(silent)) + " silent, " +
                   (defender_lies ? "defender" : "challenger") + " lies");
      Played p = defender_lies ? Play(liar, honest, silent) : Play(honest, liar, silent);
      EXPECT_EQ(p.phase2_step, kLieStep);
      EXPECT_FALSE(p.task.has_value()) << "no referee: the game ended at the missed deadline";
      EXPECT_EQ(p.outcome.defender_honest, silent != DisputeParty::kDefender);
      EXPECT_EQ(p.outcome.challenger_honest, silent != DisputeParty::kChallenger);
      EXPECT_EQ(p.outcome.reason,
                std::string(protocol::DisputePartyName(silent)) + " missed its turn");
      EXPECT_EQ(p.turns, CeilLog2(kSteps)) << "phase 1 complete, no phase 2 turn";
      EXPECT_LE(p.turns, bound);
    }
  }
}

}  // namespace
}  // namespace meshlearn::node
