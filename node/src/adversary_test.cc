// Each adversary mode commits a well-formed unit that an honest verifier's replay
// (ReplaySegment) of at least one of its segments, from the adversary's own checkpoints, does
// not reach; the same replay of honest work reaches every committed leaf.
#include "meshlearn/node/adversary.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/node/step_witness.h"
#include "testing/diloco_task.h"
#include "testing/sim_harness.h"
#include "testing/synthetic_task.h"
#include "testing/token_task.h"

namespace meshlearn::node {
namespace {

class AdversaryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    trainer_ = SmallFashionTrainer("adversary-test", 5, 16, 16);
    ASSERT_NE(trainer_, nullptr);
  }
  static void TearDownTestSuite() { delete trainer_; }

  // What a solver committed, with the checkpoints it serves.
  struct Committed {
    UnitOutcome outcome;
    MemEnv env;
  };

  std::unique_ptr<Committed> Solve(Adversary adv, std::span<const float> global,
                                   const UnitWork& work, const AdversaryInputs& in = {}) {
    auto c = std::make_unique<Committed>();
    UnitRunOptions opts;
    opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                             double) -> Status {
      return engine::SaveCheckpoint(&c->env, "ckpt-" + std::to_string(step), st);
    };
    Result<UnitOutcome> out = RunAdversaryUnit(adv, trainer_, global, work, opts, in);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    if (out.ok()) c->outcome = std::move(*out);
    // Well-formed, as the ledger sees it.
    const UnitOutcome& o = c->outcome;
    EXPECT_EQ(o.state_hashes.size(), HashedSteps(work.inner_steps, work.checkpoint_interval).size());
    EXPECT_EQ(o.commitment, MerkleRoot(o.state_hashes));
    EXPECT_EQ(o.delta.size(), global.size());
    EXPECT_EQ(o.delta_hash, HashFloats(o.delta));
    return c;
  }

  // The segments an honest replay catches: it fails on the served checkpoint (not the committed
  // leaf) or ends off the next committed leaf. Segments whose checkpoint the solver does not have
  // are skipped (segment 0 needs none).
  std::vector<uint32_t> CaughtSegments(const Committed& c, std::span<const float> global,
                                       const UnitWork& honest) {
    std::vector<uint32_t> caught;
    const std::vector<Hash256>& leaves = c.outcome.state_hashes;
    const std::vector<int64_t> steps = HashedSteps(honest.inner_steps, honest.checkpoint_interval);
    for (uint32_t seg = 0; seg + 1 < steps.size(); ++seg) {
      std::unique_ptr<engine::TrainState> start;
      if (seg > 0) {
        auto st = engine::LoadCheckpoint(const_cast<MemEnv*>(&c.env),
                                         "ckpt-" + std::to_string(steps[seg]));
        if (!st.ok()) continue;
        start = std::make_unique<engine::TrainState>(std::move(*st));
      }
      Result<SegmentReplay> r =
          ReplaySegment(trainer_, global, honest, seg, start.get(), &leaves[seg]);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
        caught.push_back(seg);
      } else if (r->end_hash != leaves[seg + 1]) {
        caught.push_back(seg);
      }
    }
    return caught;
  }

  static engine::Trainer* trainer_;
  static constexpr UnitWork kWork{.stream = 90, .inner_steps = 8, .checkpoint_interval = 4,
                                  .lr_scale = 1.0};
};
engine::Trainer* AdversaryTest::trainer_ = nullptr;

TEST(AdversaryNames, ParseAndName) {
  for (Adversary a :
       {Adversary::kNone, Adversary::kLazy, Adversary::kNoisy, Adversary::kWrongData,
        Adversary::kCopy, Adversary::kStale, Adversary::kRubberStamp, Adversary::kWrongResult,
        Adversary::kNoisyLast, Adversary::kTargeted, Adversary::kDrift, Adversary::kWrongExample}) {
    Result<Adversary> p = ParseAdversary(AdversaryName(a));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, a);
  }
  EXPECT_EQ(*ParseAdversary(""), Adversary::kNone);
  Result<Adversary> bad = ParseAdversary("sloppy");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"wrong_data\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("sloppy"), std::string::npos);
}

TEST_F(AdversaryTest, HonestWorkReplaysToEveryLeaf) {
  std::vector<float> global = trainer_->FlatParams();
  auto c = Solve(Adversary::kNone, global, kWork);
  EXPECT_TRUE(CaughtSegments(*c, global, kWork).empty());
}

TEST_F(AdversaryTest, LazyIsCaught) {
  std::vector<float> global = trainer_->FlatParams();
  auto c = Solve(Adversary::kLazy, global, kWork);
  // It skipped steps in both segments.
  EXPECT_EQ(CaughtSegments(*c, global, kWork), (std::vector<uint32_t>{0, 1}));
}

TEST_F(AdversaryTest, NoisyIsCaughtInTheSegmentOfItsNoise) {
  std::vector<float> global = trainer_->FlatParams();
  auto c = Solve(Adversary::kNoisy, global, kWork);
  // The noise comes after step H/2 = 4, at the end of segment 0; segment 1 is honest work from
  // the noisy state.
  EXPECT_EQ(CaughtSegments(*c, global, kWork), (std::vector<uint32_t>{0}));
}

TEST_F(AdversaryTest, NoisyLastIsHonestUntilTheLastRound) {
  std::vector<float> global = trainer_->FlatParams();
  auto honest = Solve(Adversary::kNone, global, kWork);
  auto early = Solve(Adversary::kNoisyLast, global, kWork, {.last_round = false});
  EXPECT_EQ(early->outcome.commitment, honest->outcome.commitment);
  EXPECT_EQ(early->outcome.delta_hash, honest->outcome.delta_hash);
  EXPECT_TRUE(CaughtSegments(*early, global, kWork).empty());
  auto last = Solve(Adversary::kNoisyLast, global, kWork, {.last_round = true});
  EXPECT_EQ(last->outcome.commitment, Solve(Adversary::kNoisy, global, kWork)->outcome.commitment);
  EXPECT_EQ(CaughtSegments(*last, global, kWork), (std::vector<uint32_t>{0}));
}

TEST_F(AdversaryTest, TargetedShiftsClassZeroInOneSegment) {
  std::vector<float> global = trainer_->FlatParams();
  auto honest = Solve(Adversary::kNone, global, kWork);
  auto c = Solve(Adversary::kTargeted, global, kWork);
  // The change comes after step H/2 = 4, at the end of segment 0; segment 1 is honest work
  // from the shifted state.
  EXPECT_EQ(CaughtSegments(*c, global, kWork), (std::vector<uint32_t>{0}));
  // Its delta moves the output layer's class-0 bias up by about the shift (the delta is
  // global - local); an honest unit's delta there is not that.
  const engine::Tensor* bias = nullptr;
  int64_t offset = 0, bias_offset = 0;
  for (engine::Param& p : trainer_->state().model->params()) {
    if (p.value.shape().size() == 1) {
      bias = &p.value;
      bias_offset = offset;
    }
    offset += p.value.size();
  }
  ASSERT_NE(bias, nullptr);
  const size_t i = static_cast<size_t>(bias_offset);
  EXPECT_NEAR(honest->outcome.delta[i] - c->outcome.delta[i], kTargetedShift, 0.02f);
}

// wrong_example trains honestly but for step H/2, which reads its batch forged: every state before
// it is the honest one, every state from it on differs, and a replay catches the segment holding
// it. Its trace of that step (what it claims in a dispute) reaches the state it committed, and
// the first operator whose output differs from the honest trace's is the first layer's forward,
// the operator that reads the batch's examples: the tile phase ends there.
TEST_F(AdversaryTest, WrongExampleLiesInOneStepsForwardWhereItReadsTheExamples) {
  std::vector<float> global = trainer_->FlatParams();
  UnitWork every = kWork;
  every.checkpoint_interval = 1;
  auto honest = Solve(Adversary::kNone, global, every);
  auto c = Solve(Adversary::kWrongExample, global, every);
  const int64_t forged = ForgedExampleStep(kWork.inner_steps);
  ASSERT_EQ(forged, 4);
  for (int64_t s = 0; s <= kWork.inner_steps; ++s) {
    EXPECT_EQ(c->outcome.state_hashes[s] == honest->outcome.state_hashes[s], s < forged)
        << "state after step " << s;
  }
  EXPECT_EQ(CaughtSegments(*Solve(Adversary::kWrongExample, global, kWork), global, kWork),
            (std::vector<uint32_t>{0}));

  const Hash256 agreed = honest->outcome.state_hashes[forged - 1];
  Result<TracedStep> lie =
      TraceDisputedStep(trainer_, global, kWork, forged, agreed, {}, ForgeExample);
  ASSERT_TRUE(lie.ok()) << lie.status().ToString();
  Result<TracedStep> truth = TraceDisputedStep(trainer_, global, kWork, forged, agreed);
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  EXPECT_EQ(lie->output, c->outcome.state_hashes[forged]);
  EXPECT_EQ(truth->output, honest->outcome.state_hashes[forged]);
  ASSERT_EQ(lie->trace->size(), truth->trace->size());
  size_t first = 0;
  while (first < truth->trace->size() && lie->trace->hash(first) == truth->trace->hash(first)) {
    ++first;
  }
  ASSERT_LT(first, truth->trace->size()) << "the forged step's trace is the honest one";
  const engine::TaskSpec& t = trainer_->task();
  Result<engine::TilePlan> plan =
      engine::PlanStepTiles(t.model, t.optimizer, t.batch_size, t.seq_len, t.micro_batches);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const engine::TileOp& op = plan->ops.at(first);
  EXPECT_EQ(op.kind, engine::TileOpKind::kTileOpLinear) << op.name;
  EXPECT_EQ(op.x, engine::kTileOperandBatch) << op.name << " does not read the examples";
}

TEST_F(AdversaryTest, WrongDataIsCaughtInEverySegment) {
  std::vector<float> global = trainer_->FlatParams();
  auto c = Solve(Adversary::kWrongData, global, kWork, {.other_stream = 91});
  EXPECT_EQ(c->outcome.state_hashes[0], Solve(Adversary::kNone, global, kWork)->outcome.state_hashes[0])
      << "its states are labelled with its own stream";
  EXPECT_EQ(CaughtSegments(*c, global, kWork), (std::vector<uint32_t>{0, 1}));
}

TEST_F(AdversaryTest, CopyCommitsThePeersDeltaAndIsCaught) {
  std::vector<float> global = trainer_->FlatParams();
  UnitWork peer_work = kWork;
  peer_work.stream = 92;
  auto peer = Solve(Adversary::kNone, global, peer_work);
  auto c = Solve(Adversary::kCopy, global, kWork, {.peer_delta = peer->outcome.delta});
  EXPECT_EQ(c->outcome.delta_hash, peer->outcome.delta_hash);
  EXPECT_FALSE(CaughtSegments(*c, global, kWork).empty());
  // The peer's own unit replays fine.
  EXPECT_TRUE(CaughtSegments(*peer, global, peer_work).empty());
  // Nothing to copy: lazy.
  auto alone = Solve(Adversary::kCopy, global, kWork);
  EXPECT_EQ(alone->outcome.commitment, Solve(Adversary::kLazy, global, kWork)->outcome.commitment);
  EXPECT_FALSE(CaughtSegments(*alone, global, kWork).empty());
}

TEST_F(AdversaryTest, StaleIsCaught) {
  // Round 0 from `global0`, honest; round 1 from the weights after it, stale.
  std::vector<float> global0 = trainer_->FlatParams();
  UnitWork r0 = kWork;
  r0.stream = 93;
  auto first = Solve(Adversary::kStale, global0, r0);  // no earlier result: lazy
  EXPECT_FALSE(CaughtSegments(*first, global0, r0).empty());
  auto honest0 = Solve(Adversary::kNone, global0, r0);
  std::vector<float> global1 = global0;
  for (size_t i = 0; i < global1.size(); ++i) global1[i] -= honest0->outcome.delta[i];
  auto c = Solve(Adversary::kStale, global1, kWork, {.earlier = &honest0->outcome});
  EXPECT_EQ(c->outcome.commitment, honest0->outcome.commitment);
  EXPECT_EQ(CaughtSegments(*c, global1, kWork), (std::vector<uint32_t>{0}));  // no checkpoints
}

// In the in-process network: the node logs that it cheats, and its commits are accepted as
// well-formed units (no node here is a verifier, so every unit goes unchecked; catching them is
// verification_sim_test.cc's). Node 0 is stale (every unit after its
// first re-commits that first result), node 1 copies when it can (its second unit of a round
// runs a block after the first units of the round were committed).
TEST(AdversaryAgentTest, CheatingNodesCommitWellFormedUnits) {
  MemEnv env;
  Result<std::string> toml =
      testing::WriteSyntheticTask(&env, "/data", 21, 480, 160, 32, 4, /*rounds=*/2, /*units=*/6,
                                  /*h=*/4, /*k=*/2);
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  std::vector<std::vector<std::string>> logs(3);
  testing::SimHarness sim(
      {.seed = 21,
       .nodes = 3,
       .task_toml = *toml,
       .log_sink = [&](int node, const std::string& line) { logs[node].push_back(line); },
       .agent_options =
           [](int node, AgentOptions& o) {
             if (node == 0) o.adversary = Adversary::kStale;
             if (node == 1) o.adversary = Adversary::kCopy;
           },
       .env = &env});
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  auto logged = [&](int node, const std::string& what) {
    for (const std::string& l : logs[node]) {
      if (l.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(logged(0, "ADVERSARY MODE") && logged(0, "\"stale\""));
  EXPECT_TRUE(logged(1, "ADVERSARY MODE") && logged(1, "\"copy\""));
  EXPECT_FALSE(logged(2, "ADVERSARY"));

  nlohmann::json task = sim.Task(true);
  EXPECT_EQ(task.value("status", std::string()), "finished") << task.dump();
  std::vector<nlohmann::json> stale;
  for (const nlohmann::json& u : task["units"]) {
    if (u.value("assignee", std::string()) == sim.node_key(0).public_key().ToHex()) {
      stale.push_back(u);
    }
  }
  ASSERT_FALSE(stale.empty()) << task.dump();
  for (const nlohmann::json& u : stale) {
    EXPECT_EQ(u.value("result_hash", std::string()), stale[0].value("result_hash", std::string()));
    EXPECT_EQ(u.value("commitment", std::string()), stale[0].value("commitment", std::string()));
  }
  EXPECT_GT(sim.agent(1)->stats().units_completed, 0u);
  EXPECT_TRUE(logged(1, "adversary copy:"));
  bool copied = false;  // same seed, same blocks: node 1 finds a committed delta to copy
  for (const nlohmann::json& u : task["units"]) {
    if (u.value("assignee", std::string()) != sim.node_key(1).public_key().ToHex()) continue;
    for (const nlohmann::json& v : task["units"]) {
      if (&v != &u && v.value("round", 0u) == u.value("round", 0u) &&
          v.value("result_hash", std::string()) == u.value("result_hash", std::string())) {
        copied = true;
      }
    }
  }
  EXPECT_TRUE(copied) << task.dump();
  EXPECT_TRUE(sim.Totals().Check().ok());
}

// The token form of the lie (a GPT, testing::WriteTinyGptTask): ForgeExample swaps the batch's
// first token for another token of the vocabulary, leaving the targets (the labels the loss
// reads) as they were; the forged step's state differs from the honest one, and the first
// operator of its trace that differs is `encoded`, the embedding lookup that reads the tokens:
// the operator a dispute over it ends at (VerificationSimTest.AForgedTokenIsCaughtAtTheEmbedding
// TileOfItsRow plays it live, FraudProofSimTest.ATokenLieIsPlayedLateToTheEmbeddingTileOfItsRow
// late).
TEST_F(AdversaryTest, WrongExampleSwapsATokenOfTheVocabularyThatTheEmbeddingReads) {
  MemEnv env;
  Result<std::string> toml = testing::WriteTinyGptTask(&env, "/gpt", 5, 1, 1, kWork.inner_steps,
                                                       kWork.checkpoint_interval);
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  ASSERT_TRUE(env.WriteFileAtomic("/gpt/task.toml", *toml).ok());
  Result<engine::TaskSpec> spec = engine::TaskSpec::Load(&env, "/gpt/task.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<engine::Trainer>> created = engine::Trainer::Create(&env, *spec);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  engine::Trainer* gpt = created->get();
  const engine::TaskSpec& t = gpt->task();
  ASSERT_TRUE(gpt->data().tokens);
  const int64_t vocab = t.model.gpt.vocab_size;
  ASSERT_GE(vocab, 2);

  // Every step's batch: the first token swapped for another one of the vocabulary, nothing else.
  for (int64_t step = 0; step < 8; ++step) {
    const engine::Batch honest = gpt->BatchForStep(step);
    engine::Batch forged = gpt->BatchForStep(step);
    ForgeExample(forged);
    ASSERT_EQ(forged.tokens.size(), honest.tokens.size());
    EXPECT_NE(forged.tokens[0], honest.tokens[0]) << "step " << step;
    EXPECT_GE(forged.tokens[0], 0) << "step " << step;
    EXPECT_LT(forged.tokens[0], vocab) << "step " << step << ": out of the vocabulary";
    EXPECT_TRUE(
        std::equal(forged.tokens.begin() + 1, forged.tokens.end(), honest.tokens.begin() + 1));
    EXPECT_EQ(forged.targets, honest.targets) << "step " << step;
  }

  std::vector<float> global = gpt->FlatParams();
  UnitWork every = kWork;
  every.checkpoint_interval = 1;
  Result<UnitOutcome> honest = RunAdversaryUnit(Adversary::kNone, gpt, global, every, {}, {});
  Result<UnitOutcome> lie = RunAdversaryUnit(Adversary::kWrongExample, gpt, global, every, {}, {});
  ASSERT_TRUE(honest.ok() && lie.ok());
  const int64_t forged = ForgedExampleStep(kWork.inner_steps);
  for (int64_t s = 0; s <= kWork.inner_steps; ++s) {
    EXPECT_EQ(lie->state_hashes[s] == honest->state_hashes[s], s < forged)
        << "state after step " << s;
  }
  const Hash256 agreed = honest->state_hashes[forged - 1];
  Result<TracedStep> forged_trace =
      TraceDisputedStep(gpt, global, kWork, forged, agreed, {}, ForgeExample);
  ASSERT_TRUE(forged_trace.ok()) << forged_trace.status().ToString();
  Result<TracedStep> truth = TraceDisputedStep(gpt, global, kWork, forged, agreed);
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  EXPECT_EQ(forged_trace->output, lie->state_hashes[forged]);
  EXPECT_EQ(truth->output, honest->state_hashes[forged]);
  ASSERT_EQ(forged_trace->trace->size(), truth->trace->size());
  size_t first = 0;
  while (first < truth->trace->size() &&
         forged_trace->trace->hash(first) == truth->trace->hash(first)) {
    ++first;
  }
  ASSERT_LT(first, truth->trace->size()) << "the forged step's trace is the honest one";
  Result<engine::TilePlan> plan =
      engine::PlanStepTiles(t.model, t.optimizer, t.batch_size, t.seq_len, t.micro_batches);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->ops.at(first).name, "encoded");
  EXPECT_EQ(plan->ops.at(first).kind, engine::TileOpKind::kTileOpEmbedding);
}

}  // namespace
}  // namespace meshlearn::node
