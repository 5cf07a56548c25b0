// A pipeline stage's dispute played to a tile on chain (issue 16; docs/verification.md "Pipeline
// stages", "The dispute"): a real replica of the tiny pipeline GPT (3 stages, 2 micro-batches,
// clipped AdamW, a data root over its token pages) trains its steps with RunStageStep; the
// verifier's mismatch on stage 1's step 1 carries the task bundle, so the dispute plays the
// operator and tile phases over the stage's plan (TileContextOf: PlanStageStepTiles), every move
// a transaction answered by both parties from their traced replay of the step (ReplayStageStep
// with a trace; AnswerTileQuery), and the ledger rules it: a tile by RefereeTile (RuleTile), an
// input operator or an agreed chain end from roots (RuleStageRoots, against the stage's
// committed commit). The genesis key's RuleDispute is refused throughout, whatever the stage's
// size.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/protocol/dispute.h"
#include "pipeline_test_util.h"

namespace meshlearn::ledger {
namespace stage_tile_chain_test {  // named: the tests build as unity translation units

using pipeline_testing::kGiB;
using pipeline_testing::kStages;
using pipeline_testing::PipelineRulingTest;
using pipeline_testing::TestStageEvidence;
using protocol::CheckStage;
using protocol::DisputeParty;
using protocol::DisputeQuery;
using protocol::DisputeStage;
using protocol::RefereeRoots;
using protocol::RefereeTask;

// One party's view of the disputed step: its trace (values kept), which it answers every move
// from. A liar's differs from the honest one at one operator.
struct Party {
  std::shared_ptr<const engine::OpTrace> trace;
};

// `honest` with operator `op`'s element `element` moved by `delta` (the liar's claim of that
// operator; the other operators as the honest run's).
std::shared_ptr<const engine::OpTrace> WithLie(const engine::OpTrace& honest, size_t op,
                                               size_t element, float delta) {
  auto out = std::make_shared<engine::OpTrace>();
  out->set_keep_values(true);
  for (size_t i = 0; i < honest.size(); ++i) {
    std::span<const float> v = honest.values(i);
    std::vector<float> values(v.begin(), v.end());
    if (i == op) values.at(element) += delta;
    out->Record(honest.name(i), values, honest.grid(i).rows, honest.grid(i).cols);
  }
  return out;
}

class StageTileChainTest : public PipelineRulingTest {
 protected:
  // The disputed stage (PipelineRulingTest's kCheat unless a test names another before its
  // dispute opens).
  uint32_t cheat_ = kCheat;

  // The step's batch (every stage of the replica draws it: the unit's work stream).
  engine::Batch BatchOf(uint64_t step) const { return StepBatch(step); }

  std::vector<protocol::NodeId> Chain() {
    std::vector<protocol::NodeId> chain;
    for (uint32_t st = 0; st < kStages; ++st) chain.push_back(Unit(st).assignee);
    return chain;
  }

  // A party's traced replay of the served step `ev` (what a dispute's party runs: the stage node
  // of its own checkpoint and received tensors, the verifier of the stage's served evidence).
  Party Trace(const TestStageEvidence& ev, StageReplayResult* found = nullptr) {
    Result<engine::TrainState> start = StageCheckpointState(ev.checkpoint);
    CHECK(start.ok()) << start.status().ToString();
    return TraceFrom(std::move(*start), ev.commit, ev.blobs, found);
  }
  // The same from the step's start state `start` and its received tensors `blobs`.
  Party TraceFrom(engine::TrainState start, const protocol::StageStepCommit& commit,
                  const std::map<Hash256, Bytes>& blobs, StageReplayResult* found = nullptr) {
    Result<StageReplaySetup> setup = StageReplaySetupOf(spec_, net_, work_.lr_scale, Chain());
    CHECK(setup.ok()) << setup.status().ToString();
    auto trace = std::make_shared<engine::OpTrace>();
    trace->set_keep_values(true);
    Result<StageReplayResult> r =
        ReplayStageStep(*setup, std::move(start), commit, blobs, BatchOf(commit.step),
                        engine::DropoutSeed(spec_.seed, work_.stream), nullptr, trace.get());
    CHECK(r.ok()) << r.status().ToString();
    if (found != nullptr) *found = *r;
    return Party{std::move(trace)};
  }

  // The chain's view of the disputed stage unit, as the ledger derives it.
  TileRuleContext Context() {
    Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(cheat_), bundle_, "test");
    CHECK(ctx.ok()) << ctx.status().ToString();
    return std::move(*ctx);
  }

  // The stages commit `leaves`, the round aggregates, and the verifier seals its verdicts: a
  // mismatch on stage cheat_'s step kLieStep (claiming `claim`), the other stages clean. Returns
  // them at the reveal.
  std::vector<Sealed> SealMismatch(const std::vector<std::vector<Hash256>>& leaves,
                                   const Hash256& claim) {
    std::vector<Transaction> txs;
    for (uint32_t st = 0; st < kStages; ++st) txs.push_back(Q(alice_, Commit(st, leaves[st])));
    StepOk(txs);
    Aggregate();
    std::vector<Sealed> verdicts;
    txs.clear();
    for (uint32_t i = 0; i < kStages; ++i) {
      verdicts.push_back(i == cheat_ ? Mismatch(cheat_, leaves[cheat_], kLieStep, claim)
                                     : Clean(i));
      txs.push_back(SealTx(i, verdicts.back()));
    }
    StepOk(txs);
    StepUntil(0, CheckStage::kCheckRevealVerdicts);
    return verdicts;
  }
  // Every verdict revealed, the mismatch with `bundle`, and the stages' secrets.
  void RevealAll(const std::vector<Sealed>& verdicts, const std::string& bundle) {
    std::vector<Transaction> txs;
    for (uint32_t i = 0; i < kStages; ++i) {
      txs.push_back(RevealTx(i, verdicts[i], i == cheat_ ? bundle : std::string()));
      txs.push_back(SecretTx(i));
    }
    StepOk(txs);
    StepUntil(cheat_, CheckStage::kCheckDisputed);
  }

  // The verifier's mismatch on stage cheat_'s step kLieStep (claiming `claim`) is revealed with
  // the task bundle: the dispute opens with the tile phase.
  // The stage's step kLieStep as it commits it into `leaves`, and its dispute opened with the
  // bundle: a lying stage commits a state after the step other than the honest one (what it claims
  // its wrong operator led to); the verifier's claim is a finding of its own either way (a lying
  // verifier claims one on the honest stage).
  void CommitAndDispute(std::vector<std::vector<Hash256>>& leaves, bool stage_lies,
                        TestStageEvidence* committed) {
    *committed = evidence_[cheat_][kLieStep];
    if (stage_lies) committed->commit.state_after = Blake2b("the liar's state after");
    leaves[cheat_][kLieStep] = protocol::StageStepLeaf(committed->commit);
    DisputeWithBundle(leaves, Blake2b("the verifier's finding"));
  }

  void DisputeWithBundle(const std::vector<std::vector<Hash256>>& leaves, const Hash256& claim) {
    RevealAll(SealMismatch(leaves, claim), bundle_);
    const protocol::DisputeGame g = *Check(cheat_).dispute();  // a copy: Check() is a value
    ASSERT_FALSE(g.config().operator_tiles.empty()) << "the stage's dispute plays the tile phase";
    ASSERT_EQ(g.config().num_operators, Context().plan.ops.size());
  }

  // Both parties answer every query from their traces (AnswerTileQuery, what a node answers), as
  // transactions, until the game reaches the referee or resolves; `silent` posts nothing once
  // the game is in `silent_at`.
  void Play(const Party& defender, const Party& challenger,
            std::optional<DisputeParty> silent = std::nullopt,
            DisputeStage silent_at = DisputeStage::kDisputeTiles) {
    const TileRuleContext ctx = Context();
    const engine::Batch batch = BatchOf(kLieStep);
    for (int turn = 0; turn < 80; ++turn) {
      if (!HasCheck(cheat_) || Check(cheat_).stage() != CheckStage::kCheckDisputed) return;
      const protocol::DisputeGame g = *Check(cheat_).dispute();
      if (g.stage() == DisputeStage::kDisputeReferee ||
          g.stage() == DisputeStage::kDisputeResolved) {
        return;
      }
      const DisputeQuery q = g.query();
      const bool quiet = silent.has_value() && q.stage == silent_at;
      std::vector<Transaction> txs;
      for (DisputeParty party : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
        if (quiet && *silent == party) continue;
        const Party& run = party == DisputeParty::kDefender ? defender : challenger;
        Result<DisputeMoveAnswer> a = AnswerTileQuery(ctx, q, g.config().agreed, *run.trace, batch);
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        const protocol::NodeId node =
            party == DisputeParty::kDefender ? g.config().defender : g.config().challenger;
        if (a->children) {
          txs.push_back(Q(alice_, DisputeChildrenTx{.task_id = task_id_,
                                                    .index = cheat_,
                                                    .node_id = node,
                                                    .position = q.position,
                                                    .left = a->left,
                                                    .right = a->right}));
        } else {
          txs.push_back(Q(alice_, DisputePostTx{.task_id = task_id_,
                                                .index = cheat_,
                                                .node_id = node,
                                                .position = q.position,
                                                .hash = a->hash}));
        }
      }
      StepOk(txs);
      if (quiet) {
        for (uint64_t i = 0; i <= g.config().response_blocks + 1; ++i) Step();
      }
    }
    ADD_FAILURE() << "the game did not end";
  }

  RefereeTask TaskNow() {
    EXPECT_EQ(Check(cheat_).stage(), CheckStage::kCheckDisputed);
    EXPECT_EQ(Check(cheat_).dispute()->stage(), DisputeStage::kDisputeReferee);
    return Check(cheat_).dispute()->referee_task();
  }

  Transaction RefereeTile(const Bytes& witness) {
    return Q(bob_,
             RefereeTileTx{
                 .task_id = task_id_, .index = cheat_, .bundle = {bundle_}, .witness = {witness}});
  }

  // A tile task's witness, built from `run`'s trace (anyone's: every input is agreed).
  Bytes TileWitnessOf(const Party& run, const RefereeTask& task) {
    Result<TileWitness> w =
        BuildTileWitness(Context(), task, *run.trace, BatchOf(kLieStep),
                         tokens() ? nullptr : &data_.train, tree_.get(), pages_.get());
    CHECK(w.ok()) << w.status().ToString();
    return EncodeTileWitness(*w);
  }

  // A roots task's witness from `run`'s trace and the stage's committed `commit`.
  StageRootsWitness RootsWitnessOf(const Party& run, const RefereeTask& task,
                                   const protocol::StageStepCommit& commit) {
    Result<engine::TrainState> st = StageCheckpointState(evidence_[cheat_][kLieStep].checkpoint);
    CHECK(st.ok());
    Result<StageRootsWitness> w =
        BuildStageRootsWitness(Context(), task, *run.trace, commit, st->seed, st->stream);
    CHECK(w.ok()) << w.status().ToString();
    return std::move(*w);
  }

  // Every transaction in `refusals` is refused, naming why; nothing is ruled.
  void ExpectRefused(const std::vector<std::pair<Transaction, std::string>>& refusals) {
    ExpectEachRefused(refusals);
    ASSERT_TRUE(HasCheck(cheat_));
    ASSERT_EQ(Check(cheat_).dispute()->stage(), DisputeStage::kDisputeReferee);
  }

  // The genesis key's word is refused, pointing at RefereeTile.
  Transaction GenesisRuling(const RefereeTask& task) {
    return Q(referee_,
             RuleDisputeTx{.task_id = task_id_, .index = cheat_, .output = task.challenger_output});
  }

  // After the ruling: the stage slashed and its round re-run, or the verifier slashed and the
  // round standing.
  void ExpectLoser(bool stage_lies, const PublicKey& stage_node) {
    for (int i = 0;
         i < 6 && HasCheck(cheat_) && Check(cheat_).stage() == CheckStage::kCheckDisputed; ++i) {
      Step();
    }
    for (int i = 0; i < 4; ++i) Step();
    if (stage_lies) {
      EXPECT_FALSE(HasCheck(cheat_)) << "fraud: the round re-runs";
      EXPECT_EQ(Task().verification.fraud, 1u);
      ExpectOnlyTheCheaterSlashed(stage_node);
    } else {
      ASSERT_TRUE(HasCheck(cheat_)) << "no fraud: the round stands";
      EXPECT_EQ(Task().verification.fraud, 0u);
      EXPECT_EQ(Node(stage_node).reputation.slashes, 0u);
      EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 1u);
    }
  }

  // Trains the replica and returns every stage's honest leaves.
  std::vector<std::vector<Hash256>> TrainHonestly(
      const std::function<void(TaskParams&)>& tweak = nullptr) {
    StartRuled(Hash256{}, tweak);
    Train();
    std::vector<std::vector<Hash256>> leaves;
    for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
    return leaves;
  }
};

int64_t OpNamed(const engine::TilePlan& plan, const std::string& name) {
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (plan.ops[j].name == name) return static_cast<int64_t>(j);
  }
  return -1;
}

// Each side lies at a tile of an operator the stage computes (micro-batch 1's MLP down projection
// of its block, whose input is two tiles wide): the game narrows to that tile and the ledger rules
// it from a footprint witness (RefereeTile), for the honest side; a witness with a wrong proof or
// a changed input tile is refused, and so are the genesis key's RuleDispute and a whole stage
// step's witness.
class StageTileLieTest : public StageTileChainTest, public ::testing::WithParamInterface<bool> {};

TEST_P(StageTileLieTest, ALieAtATileOfAComputedOperatorIsRuledOnChainByRefereeTile) {
  const bool stage_lies = GetParam();
  std::vector<std::vector<Hash256>> leaves = TrainHonestly();
  const Party honest = Trace(evidence_[cheat_][kLieStep]);
  const TileRuleContext ctx = Context();
  const int64_t op = OpNamed(ctx.plan, "mb1.h.1.fcproj");
  ASSERT_GE(op, 0);
  const Party liar{WithLie(*honest.trace, static_cast<size_t>(op), 5, 0.5f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  TestStageEvidence committed;
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, stage_lies, &committed));
  ASSERT_NO_FATAL_FAILURE(Play(stage_lies ? liar : honest, stage_lies ? honest : liar));
  const RefereeTask task = TaskNow();
  ASSERT_TRUE(task.tile) << "narrowed to a tile";
  EXPECT_EQ(task.operator_index, static_cast<uint32_t>(op + 1));
  const Bytes good = TileWitnessOf(honest, task);
  EXPECT_EQ(TileWitnessOf(liar, task), good) << "the liar's witness is the honest one's";
  EXPECT_LE(good.size(), kMaxTileWitnessBytes);
  std::printf("stage tile witness: %zu bytes, %u turns (%s at tile %llu of %s)\n", good.size(),
              Check(cheat_).dispute()->turns(), stage_lies ? "stage lies" : "verifier lies",
              static_cast<unsigned long long>(task.tile_index),
              ctx.plan.ops[static_cast<size_t>(op)].name.c_str());
  Result<TileWitness> w = DecodeTileWitness(good);
  ASSERT_TRUE(w.ok());
  ASSERT_FALSE(w->tiles.empty());
  TileWitness bad_proof = *w;
  auto proven = std::find_if(bad_proof.tiles.begin(), bad_proof.tiles.end(),
                             [](const TileWitnessTile& t) { return !t.proof.siblings.empty(); });
  ASSERT_NE(proven, bad_proof.tiles.end()) << "an input of several tiles";
  proven->proof.siblings[0] = Blake2b("not a sibling");
  TileWitness bad_values = *w;
  bad_values.tiles[0].values[0] += 1.0f;
  ExpectRefused({
      {GenesisRuling(task), "narrowed to one tile, which the ledger recomputes itself"},
      {RefereeTile(EncodeTileWitness(bad_proof)), "is not proven against its agreed output root"},
      {RefereeTile(EncodeTileWitness(bad_values)), "is not proven against its agreed output root"},
      {Q(alice_, RefereeStageStepTx{.task_id = task_id_, .index = cheat_, .witness = {}}),
       "is not about one whole stage step"},
  });
  StepOk({RefereeTile(good)});
  ExpectLoser(stage_lies, stage_node);
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, StageTileLieTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("StageLies") : std::string("VerifierLies");
                         });

// A lazy stage (it commits, for step 1, the state it started from) that answers the game from its
// honest trace of the step: the chain ends agree, so the ledger rules the step from the roots of
// the agreed chain end against the stage's committed commit (its state_after does not follow),
// and the stage loses. The same ruling for an honest stage and a verifier that answers honestly
// but claimed a finding: the commit follows, the stage wins. A roots witness of another commit,
// of roots that do not chain to the agreed end, or with another seed is refused; RuleDispute is.
// The stages are declared over the stage witness bound (8 MiB): RefereeStageStep could not rule
// them; the tile phase does, whatever the stage's size.
class StageChainEndTest : public StageTileChainTest, public ::testing::WithParamInterface<bool> {};

TEST_P(StageChainEndTest, AStageWhoseCommitDoesNotFollowFromTheAgreedChainEndLoses) {
  const bool stage_lies = GetParam();
  std::vector<std::vector<Hash256>> leaves = TrainHonestly([](TaskParams& p) {
    p.stage_memory_bytes = {8u << 20, 8u << 20, 8u << 20};
  });
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
  TestStageEvidence committed = evidence_[cheat_][kLieStep];
  if (stage_lies) committed.commit.state_after = committed.commit.state_before;  // lazy
  leaves[cheat_][kLieStep] = protocol::StageStepLeaf(committed.commit);
  StageReplayResult found;
  const Party honest = Trace(committed, &found);
  EXPECT_EQ(found.fault, stage_lies ? StageFault::kStageFaultState : StageFault::kStageFaultNone)
      << found.message;
  const PublicKey stage_node = Unit(cheat_).assignee;
  ASSERT_NO_FATAL_FAILURE(
      DisputeWithBundle(leaves, stage_lies ? StageFindingLeaf(leaves[cheat_][kLieStep], found)
                                           : Blake2b("a false finding")));
  ASSERT_NO_FATAL_FAILURE(Play(honest, honest));
  const RefereeTask task = TaskNow();
  ASSERT_EQ(task.roots, RefereeRoots::kRootsChainEnd);
  const StageRootsWitness good = RootsWitnessOf(honest, task, committed.commit);
  std::printf("stage chain-end roots witness: %zu bytes (%zu roots)\n",
              EncodeStageRootsWitness(good).size(), good.outputs.size());
  Result<StageRootsWitness> round_trip = DecodeStageRootsWitness(EncodeStageRootsWitness(good));
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
  EXPECT_EQ(*round_trip, good);
  auto with = [&](const std::function<void(StageRootsWitness&)>& edit) {
    StageRootsWitness w = good;
    edit(w);
    return RefereeTile(EncodeStageRootsWitness(w));
  };
  ExpectRefused({
      {GenesisRuling(task), "which the ledger rules itself from roots"},
      {with([&](StageRootsWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[cheat_][0].commit);
       }),
       "send the commit the stage node serves for the step"},
      {with([](StageRootsWitness& w) { w.outputs[3] = Blake2b("another root"); }),
       "not to the agreed C_"},
      {with([](StageRootsWitness& w) { w.outputs.pop_back(); }), "the agreed chain end needs all"},
      {with([](StageRootsWitness& w) { w.seed += 1; }), "do not give the commit's state_before"},
      {RefereeTile(EncodeTileWitness(TileWitness{.outputs = good.outputs})),
       "stage roots witness: starts with"},
      {Q(alice_, RefereeStageStepTx{.task_id = task_id_, .index = cheat_, .witness = {}}),
       "the dispute plays the tile phase; send RefereeTile"},
  });
  StepOk({RefereeTile(EncodeStageRootsWitness(good))});
  ExpectLoser(stage_lies, stage_node);
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, StageChainEndTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("StageLies") : std::string("VerifierLies");
                         });

// Each side lies about a received operator's root (micro-batch 0's activations from stage 0):
// the game ends at that input operator, and the ledger rules it from the tiled root its sender
// signed in the stage's committed record (RuleStageRoots, kRootsOperator), for the honest side.
// The same for an operator of the stage's state ("in.<name>"): its root from the k state roots,
// which must give the commit's state_before.
struct InputLie {
  const char* op;
  bool stage_lies;
};
class StageInputLieTest : public StageTileChainTest,
                          public ::testing::WithParamInterface<InputLie> {};

TEST_P(StageInputLieTest, ALieAtAnInputOperatorIsRuledFromTheCommittedRoots) {
  const InputLie lie = GetParam();
  std::vector<std::vector<Hash256>> leaves = TrainHonestly();
  const Party honest = Trace(evidence_[cheat_][kLieStep]);
  const TileRuleContext ctx = Context();
  const int64_t op = OpNamed(ctx.plan, lie.op);
  ASSERT_GE(op, 0);
  const Party liar{WithLie(*honest.trace, static_cast<size_t>(op), 0, 0.25f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  TestStageEvidence committed;
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, lie.stage_lies, &committed));
  ASSERT_NO_FATAL_FAILURE(Play(lie.stage_lies ? liar : honest, lie.stage_lies ? honest : liar));
  const RefereeTask task = TaskNow();
  ASSERT_EQ(task.roots, RefereeRoots::kRootsOperator);
  EXPECT_EQ(task.operator_index, static_cast<uint32_t>(op + 1));
  const StageRootsWitness good = RootsWitnessOf(honest, task, committed.commit);
  const bool received = ctx.plan.ops[static_cast<size_t>(op)].received;
  EXPECT_EQ(good.outputs.size(), received ? 0u : StateOperators(ctx.plan));
  // The liar's own roots do not give the committed state_before (a state operator), and a
  // received operator's witness carries no roots.
  StageRootsWitness liars = RootsWitnessOf(liar, task, committed.commit);
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {GenesisRuling(task), "which the ledger rules itself from roots"},
  };
  if (received) {
    liars.outputs.push_back(Blake2b("a root"));
    refusals.push_back({RefereeTile(EncodeStageRootsWitness(liars)), "from its record alone"});
  } else {
    refusals.push_back(
        {RefereeTile(EncodeStageRootsWitness(liars)), "do not give the commit's state_before"});
  }
  ExpectRefused(refusals);
  StepOk({RefereeTile(EncodeStageRootsWitness(good))});
  ExpectLoser(lie.stage_lies, stage_node);
}

INSTANTIATE_TEST_SUITE_P(EachInput, StageInputLieTest,
                         ::testing::Values(InputLie{"mb0.recv.activation", true},
                                           InputLie{"mb0.recv.activation", false},
                                           InputLie{"in.transformer.h.1.ln_1.weight", true},
                                           InputLie{"in.transformer.h.1.ln_1.weight", false}),
                         [](const ::testing::TestParamInfo<InputLie>& p) {
                           return std::string(p.param.op[0] == 'm' ? "Received" : "State") +
                                  (p.param.stage_lies ? "StageLies" : "VerifierLies");
                         });

// A stage silent in the tile phase (it posts nothing once the game is at its wrong operator's
// tiles) loses at the turn's deadline, as a unit's defender does.
TEST_F(StageTileChainTest, AStageSilentInTheTilePhaseLoses) {
  std::vector<std::vector<Hash256>> leaves = TrainHonestly();
  const Party honest = Trace(evidence_[cheat_][kLieStep]);
  const int64_t op = OpNamed(Context().plan, "mb0.h.1.fch");
  ASSERT_GE(op, 0);
  const Party liar{WithLie(*honest.trace, static_cast<size_t>(op), 3, 0.5f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  TestStageEvidence committed;
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, true, &committed));
  ASSERT_NO_FATAL_FAILURE(Play(liar, honest, DisputeParty::kDefender));
  ExpectLoser(true, stage_node);
}

// Over the stage witness bound only the tile phase rules a stage without the genesis key, so
// a mismatch without the task bundle is refused (MismatchNeedsBundle), and one with it plays the
// tile phase. A claim that the stage served nothing for the step is the exception: the verifier
// has nothing to trace the step from, so that claim is refused with the bundle and opens a dispute
// over the whole step without it (UnservedStageClaim).
class StageBundleTest : public StageTileChainTest, public ::testing::WithParamInterface<bool> {};

TEST_P(StageBundleTest, OverTheStageBoundAMismatchCarriesTheBundleButAnUnservedClaimDoesNot) {
  const bool unserved = GetParam();
  std::vector<std::vector<Hash256>> leaves = TrainHonestly([](TaskParams& p) {
    p.stage_memory_bytes = {8u << 20, 8u << 20, 8u << 20};
  });
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
  const Hash256 claim =
      unserved ? StageUnservedLeaf(leaves[cheat_][kLieStep]) : Blake2b("the verifier's finding");
  const std::vector<Sealed> verdicts = SealMismatch(leaves, claim);
  std::vector<Receipt> refused =
      Step({RevealTx(cheat_, verdicts[cheat_], unserved ? bundle_ : std::string())});
  EXPECT_FALSE(refused[0].ok);
  EXPECT_NE(refused[0].reason.find(unserved ? "send no bundle" : "bundle is empty"),
            std::string::npos)
      << refused[0].reason;
  ASSERT_NO_FATAL_FAILURE(RevealAll(verdicts, unserved ? std::string() : bundle_));
  EXPECT_EQ(Check(cheat_).dispute()->config().operator_tiles.empty(), unserved);
  if (unserved) {
    // The dispute is at the referee at once, waiting for the stage's evidence in pieces
    // (StageServeTest below); the genesis key rules no stage claim.
    const RefereeTask task = TaskNow();
    EXPECT_EQ(task.challenger_output, StageUnservedLeaf(task.defender_output));
    ExpectRefused({{GenesisRuling(task), "the genesis key rules none"}});
  }
}

INSTANTIATE_TEST_SUITE_P(EachClaim, StageBundleTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Unserved") : std::string("AFinding");
                         });

// A claim that a stage over the witness bound served nothing for its step, answered on chain by
// the stage's evidence in pieces (stage_serve.h, ServeStageEvidenceTx): piece 0 its committed
// commit and state roots, then every tile of its checkpoint and of the tensors it received, each
// proven against its root. No key rules it.
class StageServeTest : public StageTileChainTest {
 protected:
  // The replica trains honestly with stages of `stage_bytes` (over the witness bound) and the
  // verifier claims that stage cheat_ served nothing for step kLieStep: the dispute is at the
  // referee, waiting for the stage's pieces.
  // With `sender`, the verifier's reveal is sent by that key (the verifier node's own), which pays
  // the claim's serve bond, instead of the nodes' owner.
  void DisputeUnserved(uint64_t stage_bytes, const KeyPair* sender = nullptr) {
    std::vector<std::vector<Hash256>> leaves = TrainHonestly([&](TaskParams& p) {
      p.stage_memory_bytes = {stage_bytes, stage_bytes, stage_bytes};
    });
    ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
    ASSERT_EQ(leaves[cheat_][kLieStep], protocol::StageStepLeaf(Evidence().commit));
    const std::vector<Sealed> verdicts =
        SealMismatch(leaves, StageUnservedLeaf(leaves[cheat_][kLieStep]));
    if (sender == nullptr) {
      RevealAll(verdicts, std::string());
    } else {
      std::vector<Transaction> txs;
      for (uint32_t i = 0; i < kStages; ++i) {
        txs.push_back(i == cheat_ ? RevealBy(*sender, verdicts[i]) : RevealTx(i, verdicts[i]));
        txs.push_back(SecretTx(i));
      }
      StepOk(txs);
      StepUntil(cheat_, CheckStage::kCheckDisputed);
    }
    const RefereeTask task = TaskNow();
    ASSERT_EQ(task.challenger_output, StageUnservedLeaf(task.defender_output));
    stage_node_ = Unit(cheat_).assignee;
  }

  const TestStageEvidence& Evidence() const { return evidence_[cheat_][kLieStep]; }

  // The verifier's reveal of `v` on stage cheat_ (no bundle) signed by `sender`.
  Transaction RevealBy(const KeyPair& sender, const Sealed& v) {
    return Q(sender, RevealVerdictTx{.task_id = task_id_,
                                     .index = cheat_,
                                     .node_id = verifier_.public_key(),
                                     .verdict = static_cast<uint8_t>(v.verdict),
                                     .salt = v.salt,
                                     .claim = v.claim,
                                     .bundle = {}});
  }

  // Every piece of the stage's evidence, as its node builds them from what it holds (`ev`: what
  // it committed for step kLieStep, its honest evidence unless a test names another).
  std::vector<StageServePiece> Pieces(const TestStageEvidence* ev = nullptr) {
    const TestStageEvidence& e = ev == nullptr ? Evidence() : *ev;
    Result<std::vector<StageServePiece>> p =
        BuildStageServePieces(Context(), e.commit, e.checkpoint, e.blobs);
    CHECK(p.ok()) << p.status().ToString();
    return std::move(*p);
  }

  // A challenge of stage cheat_'s step kLieStep by the verifier (a whistleblower too unless
  // verifier_whistleblows_ is off) or by `by`, claiming `claim`, with the bundle or without.
  Transaction Challenge(const std::vector<Hash256>& leaves, const Hash256& claim, bool with_bundle,
                        const KeyPair* by = nullptr) {
    return Q(alice_, ChallengeUnitTx{.task_id = task_id_,
                                     .index = cheat_,
                                     .node_id = (by == nullptr ? verifier_ : *by).public_key(),
                                     .claim = Mismatch(cheat_, leaves, kLieStep, claim).claim,
                                     .bundle = {with_bundle ? bundle_ : std::string()}});
  }

  // The served ruling: the claim is answered, nobody slashed, the claimant counts a failure.
  void ExpectServedRuling(uint64_t verifier_failures_before) {
    ASSERT_FALSE(Task().verification.rulings.empty());
    const DisputeRuling r = Task().verification.rulings.back();
    EXPECT_EQ(r.tx, static_cast<uint16_t>(TxType::kServeStageEvidence));
    EXPECT_TRUE(r.defender_honest);
    EXPECT_TRUE(r.challenger_honest) << "a claim of availability answered shows nobody lied";
    EXPECT_NE(r.reason.find("the stage served step " + std::to_string(kLieStep + 1) +
                            "'s evidence on chain"),
              std::string::npos)
        << r.reason;
    for (int i = 0; i < 3 && HasCheck(cheat_) && Check(cheat_).stage() != CheckStage::kCheckSettled;
         ++i) {
      Step();
    }
    ASSERT_TRUE(HasCheck(cheat_));
    EXPECT_EQ(Check(cheat_).stage(), CheckStage::kCheckSettled);
    EXPECT_EQ(Check(cheat_).result(), protocol::CheckResult::kCheckClean) << Check(cheat_).reason();
    EXPECT_EQ(Task().verification.fraud, 0u);
    EXPECT_EQ(Node(stage_node_).reputation.slashes, 0u);
    EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);
    EXPECT_EQ(Node(verifier_.public_key()).reputation.failures, verifier_failures_before + 1);
  }

  Transaction Serve(uint32_t piece, const StageServePiece& p) {
    return Q(alice_, ServeStageEvidenceTx{.task_id = task_id_,
                                          .index = cheat_,
                                          .piece = piece,
                                          .bundle = {bundle_},
                                          .witness = {EncodeStageServePiece(p)}});
  }

  // The lazy stage's step kLieStep served and checked from its pieces (the test below). With
  // `stranger`, the aggregator and the claimant (for the wrong step) try the same finding first
  // and are refused unless the verifier whistleblows.
  void ServeALazyStepAndCheckIt(bool stranger = false) {
    std::vector<std::vector<Hash256>> leaves = TrainHonestly([](TaskParams& p) {
      p.stage_memory_bytes = {8u << 20, 8u << 20, 8u << 20};
    });
    ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
    TestStageEvidence committed = Evidence();
    committed.commit.state_after = committed.commit.state_before;  // lazy
    leaves[cheat_][kLieStep] = protocol::StageStepLeaf(committed.commit);
    RevealAll(SealMismatch(leaves, StageUnservedLeaf(leaves[cheat_][kLieStep])), std::string());
    stage_node_ = Unit(cheat_).assignee;
    const std::vector<StageServePiece> pieces = Pieces(&committed);
    const uint64_t failures = Node(verifier_.public_key()).reputation.failures;
    for (uint32_t p = 0; p < pieces.size(); ++p) StepOk({Serve(p, pieces[p])});
    ASSERT_NO_FATAL_FAILURE(ExpectServedRuling(failures));

    // The verifier's replay from the pieces alone.
    Result<engine::TrainState> shapes = StageCheckpointState(evidence_[cheat_][0].checkpoint);
    ASSERT_TRUE(shapes.ok()) << shapes.status().ToString();
    ASSERT_NE(engine::StateHash(*shapes), committed.commit.state_before);
    Result<StageServedEvidence> ev = AssembleStageServeEvidence(Context(), pieces, *shapes);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    EXPECT_EQ(ev->commit, committed.commit);
    EXPECT_FALSE(ev->blobs.empty()) << "stage 1 receives stage 0's activations";
    for (const auto& [hash, bytes] : ev->blobs) {
      ASSERT_EQ(committed.blobs.count(hash), 1u) << "a received tensor the stage did not hold";
      EXPECT_TRUE(bytes == committed.blobs.at(hash)) << "a received tensor, as the stage held it";
    }
    EXPECT_EQ(engine::StateHash(*shapes), committed.commit.state_before);
    StageReplayResult found;
    const Party honest = TraceFrom(std::move(*shapes), ev->commit, ev->blobs, &found);
    ASSERT_EQ(found.fault, StageFault::kStageFaultState) << found.message;
    // Served once, not again: only a finding with the bundle checks the step (one block: the
    // round's window is short).
    ASSERT_TRUE(Machine().Unfinal(Unit(cheat_).round));
    const Hash256 finding = StageFindingLeaf(leaves[cheat_][kLieStep], found);
    std::vector<Transaction> txs;
    if (stranger) {
      // Refused: a node that made no claim, and the claimant on a step that was not served.
      txs.push_back(Challenge(leaves[cheat_], finding, true, &agg_));
      txs.push_back(
          Q(alice_, ChallengeUnitTx{.task_id = task_id_,
                                    .index = cheat_,
                                    .node_id = verifier_.public_key(),
                                    .claim = Mismatch(cheat_, leaves[cheat_], kLieStep + 1,
                                                      Blake2b("another step's finding"))
                                                 .claim,
                                    .bundle = {bundle_}}));
    }
    txs.push_back(Challenge(leaves[cheat_], StageUnservedLeaf(leaves[cheat_][kLieStep]), false));
    txs.push_back(Challenge(leaves[cheat_], finding, true));
    const std::vector<Receipt> r = Step(txs);
    ASSERT_EQ(r.size(), txs.size());
    for (size_t i = 0; i + 1 < r.size(); ++i) {
      EXPECT_FALSE(r[i].ok) << i;
      // The claimant without the role sends no second claim that the stage served nothing
      // either; a whistleblower is told to replay the pieces.
      const bool refused_for_role = stranger;
      EXPECT_NE(r[i].reason.find(refused_for_role ? "is not an active whistleblower"
                                                  : "replay the step from those pieces"),
                std::string::npos)
          << r[i].reason;
    }
    ASSERT_TRUE(r.back().ok) << r.back().reason;
    ASSERT_EQ(Check(cheat_).stage(), CheckStage::kCheckDisputed);
    ASSERT_FALSE(Check(cheat_).dispute()->config().operator_tiles.empty()) << "the tile phase";
    ASSERT_NO_FATAL_FAILURE(Play(honest, honest));
    const RefereeTask task = TaskNow();
    ASSERT_EQ(task.roots, RefereeRoots::kRootsChainEnd);
    StepOk({RefereeTile(EncodeStageRootsWitness(RootsWitnessOf(honest, task, committed.commit)))});
    for (int i = 0; i < 6 && HasCheck(cheat_); ++i) Step();
    EXPECT_FALSE(HasCheck(cheat_)) << "fraud: the round re-runs";
    EXPECT_EQ(Task().verification.fraud, 1u);
    ExpectOnlyTheCheaterSlashed(stage_node_);
  }

  PublicKey stage_node_;
};

// The honest stage posts every piece within its window: each is recorded, the claim stays open
// until the last one, which answers it ("served": the stage is not slashed, nor is the claimant,
// which counts a failure; the check settles clean, the round standing). A second claim that the
// stage served nothing for that step is refused: its evidence is on chain. The genesis key's word
// is refused throughout.
TEST_F(StageServeTest, AStageOverTheBoundThatServesEveryPieceAnswersAnUnservedClaim) {
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kGiB));
  const std::vector<StageServePiece> pieces = Pieces();
  const uint32_t n = StageServePieceCount(Context().plan);
  ASSERT_EQ(pieces.size(), n);
  ASSERT_GE(n, 2u) << "piece 0 (the roots) and at least one of tiles";
  EXPECT_TRUE(pieces[0].tiles.empty());
  const RefereeTask task = TaskNow();
  ASSERT_NO_FATAL_FAILURE(ExpectRefused(
      {{GenesisRuling(task), "served nothing for the step is answered by its evidence"}}));
  for (uint32_t p = 0; p + 1 < n; ++p) {
    StepOk({Serve(p, pieces[p])});
    ASSERT_EQ(Check(cheat_).dispute()->stage(), DisputeStage::kDisputeReferee) << "piece " << p;
    const StageServeRecord rec = Unit(cheat_).serve;
    EXPECT_EQ(rec.pieces, n);
    EXPECT_EQ(rec.step, task.step);
    EXPECT_NE((rec.served[p / 8] >> (p % 8)) & 1, 0) << "piece " << p;
  }
  EXPECT_EQ(Check(cheat_).dispute()->query().deadline_height, Unit(cheat_).serve.window_end);
  ExpectRefused({{Serve(0, pieces[0]), "the piece is served already"}});
  const uint64_t failures = Node(verifier_.public_key()).reputation.failures;
  StepOk({Serve(n - 1, pieces[n - 1])});
  ASSERT_TRUE(HasCheck(cheat_));
  EXPECT_FALSE(Unit(cheat_).serve.open()) << "the record goes with the ruling";
  ASSERT_NO_FATAL_FAILURE(ExpectServedRuling(failures));
  ASSERT_TRUE(Machine().Unfinal(Unit(cheat_).round));
  ExpectEachRefused({{Challenge(Leaves(cheat_), StageUnservedLeaf(Leaves(cheat_)[kLieStep]), false),
                      "served step " + std::to_string(kLieStep + 1) + "'s evidence on chain"}});
}

// A stage that serves the evidence of a step it computed wrongly (lazy: it committed the state
// before the step as the state after it) answers the claim that it served nothing, but does not
// escape the step's check: the verifier puts the step's start state and received tensors back
// together from the pieces on chain (AssembleStageServeEvidence, into a state of the stage's
// shapes: its checkpoint of another step), replays the step, finds the fault and challenges it
// with the bundle; the tile phase narrows it to the commit's chain end, the ledger rules it from
// roots (RefereeTile), and the stage is slashed.
TEST_F(StageServeTest, AStageThatServesAStepItComputedWronglyIsStillCheckedFromThatEvidence) {
  ServeALazyStepAndCheckIt();
}

// The claimant of the served claim checks the step whatever its roles: a verifier without the
// whistleblower role sends the finding from the pieces (ledger/src/verification.cc
// ServedStageClaimant), while a node that neither whistleblows nor made the claim (the aggregator,
// active and staked) is refused the same challenge, as is the claimant's challenge of another
// step than the one served.
class StageServeClaimantTest : public StageServeTest {
 protected:
  StageServeClaimantTest() { verifier_whistleblows_ = false; }
};

TEST_F(StageServeClaimantTest, TheClaimantWithoutTheWhistleblowerRoleChecksTheServedStep) {
  ServeALazyStepAndCheckIt(/*stranger=*/true);
}

// Pieces that are not the whole evidence, or a state of other shapes, are not put together.
TEST_F(StageServeTest, AssemblingTheEvidenceRefusesMissingPiecesAndAStateOfOtherShapes) {
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kGiB));
  std::vector<StageServePiece> pieces = Pieces();
  Result<engine::TrainState> shapes = StageCheckpointState(Evidence().checkpoint);
  ASSERT_TRUE(shapes.ok());
  std::vector<StageServePiece> short_of_one(pieces.begin(), pieces.end() - 1);
  Result<StageServedEvidence> a = AssembleStageServeEvidence(Context(), short_of_one, *shapes);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("pieces; the stage step's evidence has"), std::string::npos)
      << a.status().ToString();
  std::vector<StageServePiece> moved = pieces;
  moved[1].tiles.at(0).values.at(0) += 1.0f;  // not what the commit's state_before commits to
  a = AssembleStageServeEvidence(Context(), moved, *shapes);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("does not hash to the commit's state_before"),
            std::string::npos)
      << a.status().ToString();
  Result<engine::TrainState> other = StageCheckpointState(evidence_[0][kLieStep].checkpoint);
  ASSERT_TRUE(other.ok());
  a = AssembleStageServeEvidence(Context(), pieces, *other);
  EXPECT_FALSE(a.ok()) << "stage 0's state is not stage " << cheat_ << "'s shapes";
}

// The window is set from the declared stage memory, the submitter's number; the first piece brings
// the bundle, so the plan's real piece count, and the window grows to the blocks those pieces need
// after the referee's deadline where the declaration gave fewer (a stage declared just over the
// bound has 3 pieces' room, one block), and never shrinks (1 GiB declared keeps its 86 blocks
// for an evidence of 2 pieces). The tiny GPT's evidence fits any declaration over the bound, so
// the ledger keeps its declared window here; the growth is ServeWindowEnd's, below.
TEST_F(StageServeTest, TheFirstPieceSetsTheWindowFromTheEvidencesPiecesNeverShorter) {
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kGiB));
  const std::vector<StageServePiece> pieces = Pieces();
  const uint32_t n = static_cast<uint32_t>(pieces.size());
  ASSERT_LT(ServePieceBlocks(n), ServeWindowBlocks(kGiB));
  Step();  // the serving window is open
  const uint64_t declared_end = Unit(cheat_).serve.window_end;
  const uint64_t deadline = declared_end - ServeWindowBlocks(kGiB);
  EXPECT_EQ(ServeWindowEnd(deadline, kGiB, 0), declared_end);
  StepOk({Serve(0, pieces[0])});
  EXPECT_EQ(Unit(cheat_).serve.pieces, n);
  EXPECT_EQ(Unit(cheat_).serve.window_end, declared_end) << "never shortened";
  EXPECT_EQ(Check(cheat_).dispute()->query().deadline_height, declared_end);
}

TEST(StageServeWindowTest, AnEvidenceLargerThanItsDeclarationGetsTheBlocksItsPiecesNeed) {
  constexpr uint64_t kJustOver = kMaxStageWitnessMemory + 1;
  ASSERT_EQ(ServeWindowBlocks(kJustOver), 1u) << "3 pieces' room";
  EXPECT_EQ(ServeWindowEnd(100, kJustOver, 0), 101u) << "before the first piece: the declaration";
  EXPECT_EQ(ServeWindowEnd(100, kJustOver, 3), 101u);
  EXPECT_EQ(ServeWindowEnd(100, kJustOver, 4), 102u) << "a fourth piece needs a second block";
  EXPECT_EQ(ServeWindowEnd(100, kJustOver, 40), 114u);
  EXPECT_EQ(ServeWindowEnd(100, kGiB, 2), 186u) << "never shorter than the declaration";
  EXPECT_EQ(ServeWindowEnd(100, kJustOver, UINT32_MAX), 100 + ServeWindowBlocks(UINT64_MAX))
      << "no more than the most pieces a record keeps";
}

// The window's growth on chain: the tiny GPT made wide (n_embd 256: its middle stage's state is
// 3 x 786k values, over 2,048 tiles) gives an evidence of more pieces than one block carries
// (kServePiecesPerBlock), declared just over the bound (one block's room). Its first piece brings
// the bundle, so the real piece count, and the window grows to the blocks those pieces need
// (ServeWindowEnd); the last pieces, posted after the declared window's end, are taken and answer
// the claim, where the declared window alone would have ruled against the stage.
class StageServeWideTest : public StageServeTest {
 protected:
  StageServeWideTest() {
    const std::string from = "n_embd = 16";
    const size_t at = bundle_.find(from);
    CHECK(at != std::string::npos);
    bundle_.replace(at, from.size(), "n_embd = 256");
  }
};

TEST_F(StageServeWideTest, AnEvidenceOfMorePiecesThanTheDeclarationsWindowGrowsItsWindow) {
  constexpr uint64_t kJustOver = kMaxStageWitnessMemory + 1;
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kJustOver));
  const std::vector<StageServePiece> pieces = Pieces();
  const uint32_t n = static_cast<uint32_t>(pieces.size());
  ASSERT_GT(n, kServePiecesPerBlock) << "the evidence fits the declaration's one block";
  ASSERT_EQ(ServeWindowBlocks(kJustOver), 1u);
  ASSERT_GT(ServePieceBlocks(n), ServeWindowBlocks(kJustOver));
  Step();  // the serving window is open
  const uint64_t declared_end = Unit(cheat_).serve.window_end;
  const uint64_t deadline = declared_end - ServeWindowBlocks(kJustOver);
  const uint64_t failures = Node(verifier_.public_key()).reputation.failures;
  StepOk({Serve(0, pieces[0])});
  const uint64_t grown = Unit(cheat_).serve.window_end;
  EXPECT_EQ(Unit(cheat_).serve.pieces, n);
  EXPECT_EQ(grown, ServeWindowEnd(deadline, kJustOver, n));
  EXPECT_EQ(grown, deadline + ServePieceBlocks(n));
  ASSERT_GT(grown, declared_end) << "the window grew";
  EXPECT_EQ(Check(cheat_).dispute()->query().deadline_height, grown);
  while (chain_->Height() < declared_end) {
    Step();
    ASSERT_EQ(Check(cheat_).dispute()->stage(), DisputeStage::kDisputeReferee) << "ruled early";
  }
  // Past the declared window's end, within the grown one: the rest of the pieces.
  std::vector<Transaction> rest;
  for (uint32_t p = 1; p < n; ++p) rest.push_back(Serve(p, pieces[p]));
  StepOk(rest);
  ASSERT_GT(chain_->Height(), declared_end);
  ASSERT_NO_FATAL_FAILURE(ExpectServedRuling(failures));
}

// A genesis with referee_blocks = 0 gives the referee no deadline; the serving window keeps its
// own bound (ServeWindowBlocks from the height the game reached the referee), so a stage that
// withholds a piece still loses at its end instead of holding its claim, and its round, forever.
class StageServeNoRefereeDeadlineTest : public StageServeTest {
 protected:
  StageServeNoRefereeDeadlineTest() { genesis_.params.referee_blocks = 0; }
};

TEST_F(StageServeNoRefereeDeadlineTest, AStageThatWithholdsAPieceStillLosesAtItsWindowsEnd) {
  constexpr uint64_t kStageBytes = 64u << 20;
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kStageBytes));
  const std::vector<StageServePiece> pieces = Pieces();
  std::vector<Transaction> txs;
  for (uint32_t p = 0; p + 1 < pieces.size(); ++p) txs.push_back(Serve(p, pieces[p]));
  StepOk(txs);
  const StageServeRecord rec = Unit(cheat_).serve;
  ASSERT_TRUE(rec.open());
  ASSERT_LE(rec.window_end, chain_->Height() + ServeWindowBlocks(kStageBytes) +
                                Check(cheat_).dispute()->config().response_blocks + 1);
  while (chain_->Height() < rec.window_end) {
    Step();
    ASSERT_TRUE(HasCheck(cheat_));
    ASSERT_EQ(Check(cheat_).stage(), CheckStage::kCheckDisputed) << "ruled early";
  }
  for (int i = 0; i < 5 && HasCheck(cheat_); ++i) Step();
  EXPECT_FALSE(HasCheck(cheat_)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  ExpectOnlyTheCheaterSlashed(stage_node_);
}

// A stage that withholds one piece: nothing is ruled while its serving window is open (the
// referee's deadline, extended by ServeWindowBlocks of the declared stage), and at the window's
// end it loses as a silent party: slashed, its round re-run; the verifier is not slashed.
TEST_F(StageServeTest, AStageOverTheBoundThatWithholdsAPieceLosesAtTheWindowsEnd) {
  // 64 MiB declared: 17 pieces' room, 6 blocks after the referee's deadline (1 GiB: 86).
  constexpr uint64_t kStageBytes = 64u << 20;
  ASSERT_EQ(ServeWindowBlocks(kStageBytes), 6u);
  ASSERT_EQ(ServeWindowBlocks(kGiB), 86u);
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kStageBytes));
  const std::vector<StageServePiece> pieces = Pieces();
  std::vector<Transaction> txs;
  for (uint32_t p = 0; p + 1 < pieces.size(); ++p) txs.push_back(Serve(p, pieces[p]));
  StepOk(txs);
  const StageServeRecord rec = Unit(cheat_).serve;
  ASSERT_TRUE(rec.open());
  EXPECT_EQ(Check(cheat_).dispute()->query().deadline_height, rec.window_end)
      << "the referee waits for the pieces";
  // The referee's own deadline (window_end - 6) passes without the game ending undecided.
  while (chain_->Height() < rec.window_end) {
    Step();
    ASSERT_TRUE(HasCheck(cheat_));
    ASSERT_EQ(Check(cheat_).stage(), CheckStage::kCheckDisputed) << "ruled early";
  }
  for (int i = 0; i < 5 && HasCheck(cheat_); ++i) Step();
  EXPECT_FALSE(HasCheck(cheat_)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  ExpectOnlyTheCheaterSlashed(stage_node_);
}

// The serve bond (docs/verification.md, "A stage claimed to have served nothing, over the witness
// bound", 3.): a claim that a stage over the bound served nothing posts the declared evidence's
// pieces x genesis params.serve_bond_per_piece, from the claim's sender (here the verifier node's
// own key, funded by a transfer, so that its balance shows the bond apart from the nodes' owner,
// alice). 1 GiB declared: 1 + 2 x 128 pieces of 8 MiB witnesses.
class StageServeBondTest : public StageServeTest {
 protected:
  static constexpr uint64_t kPieces1GiB = 257;
  static constexpr Amount kFunded = 100'000;
  Amount Bond(uint64_t pieces) const { return pieces * genesis_.params.serve_bond_per_piece; }
  void Fund() { StepOk({Q(referee_, TransferTx{.to = verifier_.public_key(), .amount = kFunded})}); }
};

TEST_F(StageServeBondTest, AServedClaimsBondPaysTheStageThatServedIt) {
  ASSERT_EQ(genesis_.params.serve_bond_per_piece, ChainParams::kDefaultServeBondPerPiece);
  ASSERT_EQ(ServeDeclaredPieces(kGiB), kPieces1GiB);
  ASSERT_NO_FATAL_FAILURE(Fund());
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kGiB, &verifier_));
  const Amount bond = Bond(kPieces1GiB);
  ASSERT_EQ(Unit(cheat_).serve_bonds.size(), 1u);
  EXPECT_EQ(Unit(cheat_).serve_bonds[0],
            (ServeBond{.claimant = verifier_.public_key(),
                       .payer = verifier_.public_key(),
                       .amount = bond}));
  EXPECT_EQ(Balance(verifier_), kFunded - bond);
  // The stage's owner (alice) sends the pieces, at no fee here; the last one is paid the bond.
  const Amount owner_before = Balance(alice_);
  const std::vector<StageServePiece> pieces = Pieces();
  for (uint32_t p = 0; p + 1 < pieces.size(); ++p) StepOk({Serve(p, pieces[p])});
  EXPECT_EQ(Unit(cheat_).serve_bonds.size(), 1u) << "held until every piece is in";
  const uint64_t failures = Node(verifier_.public_key()).reputation.failures;
  StepOk({Serve(static_cast<uint32_t>(pieces.size() - 1), pieces.back())});
  EXPECT_TRUE(Unit(cheat_).serve_bonds.empty());
  EXPECT_EQ(Balance(alice_), owner_before + bond);
  EXPECT_EQ(Balance(verifier_), kFunded - bond) << "the claimant's bond went to the stage";
  ASSERT_NO_FATAL_FAILURE(ExpectServedRuling(failures));
  EXPECT_EQ(Balance(verifier_), kFunded - bond) << "and stays there once the check settles";
}

TEST_F(StageServeBondTest, AStageRuledAgainstGivesTheClaimantItsBondBack) {
  constexpr uint64_t kStageBytes = 64u << 20;  // 17 pieces, 6 blocks after the referee's deadline
  ASSERT_EQ(ServeDeclaredPieces(kStageBytes), 17u);
  ASSERT_NO_FATAL_FAILURE(Fund());
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kStageBytes, &verifier_));
  EXPECT_EQ(Balance(verifier_), kFunded - Bond(17));
  const std::vector<StageServePiece> pieces = Pieces();
  std::vector<Transaction> txs;
  for (uint32_t p = 0; p + 1 < pieces.size(); ++p) txs.push_back(Serve(p, pieces[p]));
  StepOk(txs);
  const StageServeRecord rec = Unit(cheat_).serve;
  ASSERT_TRUE(rec.open());
  while (chain_->Height() < rec.window_end) {
    Step();
    ASSERT_EQ(Unit(cheat_).serve_bonds.size(), 1u) << "held while the window is open";
  }
  for (int i = 0; i < 5 && HasCheck(cheat_); ++i) Step();
  EXPECT_EQ(Task().verification.fraud, 1u);
  ExpectOnlyTheCheaterSlashed(stage_node_);
  EXPECT_TRUE(Unit(cheat_).serve_bonds.empty());
  EXPECT_EQ(Balance(verifier_), kFunded) << "the stage did not serve: the bond comes back";
}

TEST_F(StageServeBondTest, AClaimantThatCannotPayTheBondIsRefused) {
  // The verifier node's own key holds 1 token (its owner, carol, funds it: the checkers'
  // operator, PipelineVerificationTest::Q): an account, too poor for the bond.
  StepOk({Q(referee_, TransferTx{.to = verifier_.public_key(), .amount = 1})});
  std::vector<std::vector<Hash256>> leaves = TrainHonestly([&](TaskParams& p) {
    p.stage_memory_bytes = {kGiB, kGiB, kGiB};
  });
  const std::vector<Sealed> verdicts =
      SealMismatch(leaves, StageUnservedLeaf(leaves[cheat_][kLieStep]));
  const std::vector<Receipt> got = Step({RevealBy(verifier_, verdicts[cheat_])});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got[0].ok);
  for (const std::string& want :
       {std::string("posts a bond of ") + std::to_string(Bond(kPieces1GiB)),
        std::string("genesis params.serve_bond_per_piece"), std::string("insufficient funds"),
        std::string("fund the sender's account")}) {
    EXPECT_NE(got[0].reason.find(want), std::string::npos) << got[0].reason;
  }
  EXPECT_TRUE(Unit(cheat_).serve_bonds.empty());
  EXPECT_EQ(Balance(verifier_), 1u);
  EXPECT_EQ(Check(cheat_).stage(), CheckStage::kCheckRevealVerdicts) << "the reveal took nothing";
  // The verifier's owner can pay: the same claim, sent by it (Q signs a checker's transaction
  // as carol), is taken.
  StepOk({RevealBy(alice_, verdicts[cheat_])});
  ASSERT_EQ(Unit(cheat_).serve_bonds.size(), 1u);
  EXPECT_EQ(Unit(cheat_).serve_bonds[0].payer, carol_.public_key());
}

// A unit's serve bonds are its record's third optional tail: written only while held (a unit
// without one encodes as before), after a closed serving record where none is open, and a bond of
// nothing or a closed record without a bond after it does not decode.
TEST(StageServeWindowTest, AWorkUnitsServeBondsRoundTripOnlyWhileHeld) {
  WorkUnit u;
  u.index = 3;
  Encoder plain;
  EncodeWorkUnit(plain, u);
  u.serve_bonds.push_back(ServeBond{.claimant = testing::TestKey(1).public_key(),
                                     .payer = testing::TestKey(2).public_key(),
                                     .amount = 2'570});
  Encoder e;
  EncodeWorkUnit(e, u);
  const Bytes wire = e.Take();
  EXPECT_GT(wire.size(), plain.bytes().size());
  WorkUnit back;
  Decoder d(wire, "unit");
  ASSERT_TRUE(DecodeWorkUnit(d, &back).ok());
  EXPECT_EQ(back, u);
  // With a serving window open too.
  u.serve = StageServeRecord{.step = 2, .window_end = 40, .pieces = 3, .served = {0x05}};
  Encoder open;
  EncodeWorkUnit(open, u);
  const Bytes open_wire = open.Take();
  WorkUnit open_back;
  Decoder od(open_wire, "unit");
  ASSERT_TRUE(DecodeWorkUnit(od, &open_back).ok());
  EXPECT_EQ(open_back, u);
  // A bond of 0.
  WorkUnit zero = u;
  zero.serve_bonds[0].amount = 0;
  Encoder ze;
  EncodeWorkUnit(ze, zero);
  const Bytes zero_wire = ze.Take();
  WorkUnit out;
  Decoder zd(zero_wire, "unit");
  EXPECT_FALSE(DecodeWorkUnit(zd, &out).ok());
  // A closed record without a bond after it: the bond's bytes cut off.
  WorkUnit closed;
  closed.serve_bonds = u.serve_bonds;
  Encoder ce;
  EncodeWorkUnit(ce, closed);
  Bytes cut = ce.Take();
  cut.resize(cut.size() - (4 + 32 + 32 + 8));
  WorkUnit cut_out;
  Decoder cd(cut, "unit");
  EXPECT_FALSE(DecodeWorkUnit(cd, &cut_out).ok());
}

// Every piece that does not check out is refused, naming what is wrong, and records nothing: a
// tile whose values are not its proof's, a tile in the wrong place, a commit that is not the
// committed one, roots that do not give its state_before, a piece past the last, one piece's
// tiles in another's place.
TEST_F(StageServeTest, APieceThatDoesNotCheckOutIsRefusedAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(DisputeUnserved(kGiB));
  const std::vector<StageServePiece> pieces = Pieces();
  const uint32_t n = static_cast<uint32_t>(pieces.size());
  ASSERT_GE(pieces[1].tiles.size(), 2u);
  StageServePiece wrong_value = pieces[1];
  wrong_value.tiles[1].values.at(0) += 1.0f;
  StageServePiece wrong_tile = pieces[1];
  std::swap(wrong_tile.tiles[0], wrong_tile.tiles[1]);
  StageServePiece other_commit = pieces[0];
  protocol::StageStepCommit lie = Evidence().commit;
  lie.state_after = Blake2b("not the committed state after");
  other_commit.roots.commit = protocol::EncodeStageStepCommit(lie);
  StageServePiece wrong_root = pieces[0];
  wrong_root.roots.outputs.at(0) = Blake2b("not the weights' root");
  Step();  // the serving window is open
  const WorkUnit before = Unit(cheat_);
  ASSERT_TRUE(before.serve.open());
  ExpectRefused({
      {Serve(1, wrong_value), "is not proven against its root"},
      {Serve(1, wrong_tile), "the piece's tile 0 is tile 0 of operator"},
      {Serve(0, other_commit), "not the stage's committed leaf"},
      {Serve(0, wrong_root), "do not give the commit's state_before"},
      {Serve(n, pieces[0]), "the stage step's evidence has " + std::to_string(n) + " pieces"},
      {Serve(0, pieces[1]), "tiles; the piece is 0 tiles"},
  });
  const WorkUnit after = Unit(cheat_);
  EXPECT_EQ(after.check, before.check) << "nothing recorded";
  EXPECT_EQ(after.serve, before.serve);
  // The good pieces are still taken.
  StepOk({Serve(0, pieces[0]), Serve(1, pieces[1])});
}

// The serving window grows with the declared stage up to the largest declaration: the submitter
// sets stage_memory_bytes to any value, and one near UINT64_MAX once wrapped to a one-block
// window. It stops at the pieces a unit's record keeps (StageServeRecord::kMaxPieces).
TEST(StageServeWindowTest, GrowsWithTheDeclaredStageUpToTheMostPiecesARecordKeeps) {
  const uint64_t most =
      (StageServeRecord::kMaxPieces + kServePiecesPerBlock - 1) / kServePiecesPerBlock;
  EXPECT_EQ(ServeWindowBlocks(UINT64_MAX), most);
  EXPECT_EQ(ServeWindowBlocks(UINT64_MAX - kMaxWitnessBytes), most);
  EXPECT_GT(ServeWindowBlocks(UINT64_MAX), ServeWindowBlocks(kGiB));
  EXPECT_EQ(ServeWindowBlocks(kMaxWitnessBytes), 1u) << "3 pieces: one block";
  EXPECT_EQ(ServeWindowBlocks(kMaxWitnessBytes + 1), 2u) << "5 pieces: two blocks";
}

// A model's shapes may be any size (the plan allocates nothing), so a stage's evidence may have
// more pieces than a unit's record keeps a bit for: every piece of it is refused, before the
// ledger would keep a bitmap of up to 512 MiB that no work unit decodes.
TEST(StageServeWindowTest, AnEvidenceOfMorePiecesThanARecordKeepsIsRefused) {
  TileRuleContext ctx;
  engine::TileOp weights;
  weights.name = "in.w";
  weights.kind = engine::TileOpKind::kTileOpState;
  weights.grid = engine::TileGrid::For(int64_t{1} << 22, int64_t{1} << 22);  // 2^34 tiles
  ctx.plan.ops.push_back(weights);
  ASSERT_GT(StageServePieceCount(ctx.plan), StageServeRecord::kMaxPieces);
  RefereeTask task;
  task.step = 1;
  for (const uint32_t piece : {0u, 1u}) {
    const Status st =
        CheckStageServePiece(ctx, task, Hash256{}, StageSlot{}, 2, {}, piece, StageServePiece{});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << piece;
    EXPECT_NE(st.message().find("over the most a unit's record keeps"), std::string::npos)
        << st.message();
  }
  // Past a uint32's count it saturates rather than wrapping to a small one.
  engine::TileOp huge = weights;
  huge.grid = engine::TileGrid::For(int64_t{1} << 30, int64_t{1} << 30);  // 2^50 tiles
  ctx.plan.ops = {huge};
  EXPECT_EQ(StageServePieceCount(ctx.plan), UINT32_MAX);
}

// A work unit's serving record decodes only with a bit per piece and no more pieces than a record
// keeps: a count near UINT32_MAX once wrapped the bitmap's size to nothing.
TEST(StageServeWindowTest, AWorkUnitsServingRecordDecodesOnlyWithABitPerPiece) {
  WorkUnit u;
  u.serve = StageServeRecord{.step = 2, .window_end = 40, .pieces = 3, .served = {0x05}};
  Encoder e;
  EncodeWorkUnit(e, u);
  const Bytes good = e.Take();
  WorkUnit back;
  Decoder d(good, "unit");
  ASSERT_TRUE(DecodeWorkUnit(d, &back).ok());
  EXPECT_EQ(back, u);
  EXPECT_TRUE(back.serve.Has(0));
  EXPECT_FALSE(back.serve.Has(1));
  EXPECT_TRUE(back.serve.Has(2));
  // (pieces, bitmap bytes): a count whose old 32-bit (pieces + 7) / 8 wrapped to an empty bitmap,
  // and one more piece than a record keeps, with its full bitmap.
  const std::vector<std::pair<uint32_t, size_t>> bad = {
      {UINT32_MAX, 0},
      {UINT32_MAX - 6, 0},
      {StageServeRecord::kMaxPieces + 1,
       StageServeRecord::BitmapBytes(StageServeRecord::kMaxPieces + 1)}};
  for (const auto& [pieces, bytes] : bad) {
    WorkUnit w = u;
    w.serve.pieces = pieces;
    w.serve.served.assign(bytes, 0);
    Encoder we;
    EncodeWorkUnit(we, w);
    const Bytes wire = we.Take();
    WorkUnit out;
    Decoder wd(wire, "unit");
    EXPECT_FALSE(DecodeWorkUnit(wd, &out).ok()) << pieces;
  }
}

// Every tensor a stage sends is the output of the operator StageSentOperator names, tiled as the
// operator's output (its record's tiled root is that operator's root), and an honest step's
// commit follows from its roots (StageCommitFollowsFromRoots) for every stage of the replica; a
// commit with another state after the step, another sent root, or a sent record dropped does not.
TEST_F(StageTileChainTest, AnHonestCommitFollowsFromItsRootsAndEveryLieInItDoesNot) {
  TrainHonestly();
  for (uint32_t st = 0; st < kStages; ++st) {
    SCOPED_TRACE("stage " + std::to_string(st));
    const TestStageEvidence& ev = evidence_[st][kLieStep];
    const Party run = Trace(ev);
    Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(st), bundle_, "test");
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ASSERT_EQ(run.trace->size(), ctx->plan.ops.size());
    for (const protocol::StageTransfer& r : ev.commit.sent) {
      const int64_t op = StageSentOperator(ctx->plan, r.key);
      ASSERT_GE(op, 0) << r.key.ToString();
      EXPECT_EQ(r.tiles, run.trace->hash(static_cast<size_t>(op)))
          << r.key.ToString() << " as " << ctx->plan.ops[static_cast<size_t>(op)].name;
    }
    Result<engine::TrainState> start = StageCheckpointState(ev.checkpoint);
    ASSERT_TRUE(start.ok());
    const std::span<const Hash256> roots = run.trace->hashes();
    Status st_ok = StageCommitFollowsFromRoots(*ctx, ev.commit, start->seed, start->stream, roots);
    EXPECT_TRUE(st_ok.ok()) << st_ok.ToString();
    protocol::StageStepCommit other = ev.commit;
    other.state_after = ev.commit.state_before;
    EXPECT_FALSE(StageCommitFollowsFromRoots(*ctx, other, start->seed, start->stream, roots).ok());
    other = ev.commit;
    other.sent.back().tiles = Blake2b("another root");
    EXPECT_FALSE(StageCommitFollowsFromRoots(*ctx, other, start->seed, start->stream, roots).ok());
    other = ev.commit;
    other.sent.pop_back();
    EXPECT_FALSE(StageCommitFollowsFromRoots(*ctx, other, start->seed, start->stream, roots).ok());
    other = ev.commit;
    other.received.pop_back();
    EXPECT_FALSE(StageCommitFollowsFromRoots(*ctx, other, start->seed, start->stream, roots).ok());
  }
}

// The 10M GPT (examples/code-gpt-pipeline-devnet.toml: 6 blocks of 384, 2 sequences of 64
// tokens a step in 2 micro-batches, clipped AdamW, on the Python standard library corpus with a
// data root over its token pages) cut in 3 stages, each holding tens of MB of weights and
// moments, declared as such (far over the 4 MiB stage witness bound: no RefereeStageStep, and
// before the tile phase the genesis key ruled them). A stage lying at a tile of its MLP's down
// projection is ruled on chain by RefereeTile; a lazy stage answering from its honest trace by
// the roots of the agreed chain end. Slow (the corpus and four steps of the model; CMake).
class StageTileChain10mTest : public StageTileChainTest {
 protected:
  StageTileChain10mTest() {
    bundle_dir_ = std::string(MESHLEARN_SOURCE_DIR) + "/examples";
    Result<std::string> text =
        Env::Default()->ReadFile(bundle_dir_ + "/code-gpt-pipeline-devnet.toml");
    CHECK(text.ok()) << text.status().ToString();
    // One replica of the fixture's 3 stages and 4 inner steps.
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"rounds = 2", "rounds = 1"},
             {"units_per_round = 2", "units_per_round = 1"},
             {"inner_steps = 3", "inner_steps = 4"},
             {"stages = 4", "stages = 3"}}) {
      const size_t at = text->find(from);
      CHECK(at != std::string::npos) << from;
      text->replace(at, from.size(), to);
    }
    bundle_ = *text;
  }
  static void Over(TaskParams& p) { p.stage_memory_bytes = {64u << 20, 64u << 20, 64u << 20}; }
};

TEST_F(StageTileChain10mTest, AStageOverTheWitnessBoundIsRuledOnChainAtATile) {
  std::vector<std::vector<Hash256>> leaves = TrainHonestly(Over);
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
  const TileRuleContext ctx = Context();
  // A lie at tile 0 of micro-batch 1's down projection of the stage's first block.
  int64_t op = -1;
  for (size_t j = 0; j < ctx.plan.ops.size() && op < 0; ++j) {
    const std::string& n = ctx.plan.ops[j].name;
    if (n.starts_with("mb1.h.") && n.ends_with(".fcproj")) op = static_cast<int64_t>(j);
  }
  ASSERT_GE(op, 0);
  const Party honest = Trace(evidence_[cheat_][kLieStep]);
  const Party liar{WithLie(*honest.trace, static_cast<size_t>(op), 7, 0.5f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  TestStageEvidence committed;
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, true, &committed));
  ASSERT_NO_FATAL_FAILURE(Play(liar, honest));
  const RefereeTask task = TaskNow();
  ASSERT_TRUE(task.tile);
  EXPECT_EQ(task.operator_index, static_cast<uint32_t>(op + 1));
  const Bytes good = TileWitnessOf(honest, task);
  EXPECT_LE(good.size(), kMaxTileWitnessBytes);
  std::printf(
      "10M GPT stage %u (%zu operators): a lie at %s ruled by a %zu-byte RefereeTile "
      "after %u turns\n",
      cheat_, ctx.plan.ops.size(), ctx.plan.ops[static_cast<size_t>(op)].name.c_str(), good.size(),
      Check(cheat_).dispute()->turns());
  ExpectRefused({{GenesisRuling(task), "narrowed to one tile"}});
  StepOk({RefereeTile(good)});
  ExpectLoser(true, stage_node);
}

TEST_F(StageTileChain10mTest, ALazyStageOverTheWitnessBoundLosesToTheRootsOfItsChainEnd) {
  std::vector<std::vector<Hash256>> leaves = TrainHonestly(Over);
  TestStageEvidence committed = evidence_[cheat_][kLieStep];
  committed.commit.state_after = committed.commit.state_before;  // lazy
  leaves[cheat_][kLieStep] = protocol::StageStepLeaf(committed.commit);
  StageReplayResult found;
  const Party honest = Trace(committed, &found);
  ASSERT_EQ(found.fault, StageFault::kStageFaultState) << found.message;
  const PublicKey stage_node = Unit(cheat_).assignee;
  ASSERT_NO_FATAL_FAILURE(
      DisputeWithBundle(leaves, StageFindingLeaf(leaves[cheat_][kLieStep], found)));
  ASSERT_NO_FATAL_FAILURE(Play(honest, honest));
  const RefereeTask task = TaskNow();
  ASSERT_EQ(task.roots, RefereeRoots::kRootsChainEnd);
  const Bytes good = EncodeStageRootsWitness(RootsWitnessOf(honest, task, committed.commit));
  EXPECT_LE(good.size(), kMaxTileWitnessBytes);
  std::printf("10M GPT stage %u: the lazy stage ruled from a %zu-byte roots witness\n", cheat_,
              good.size());
  ExpectRefused({{GenesisRuling(task), "which the ledger rules itself from roots"}});
  StepOk({RefereeTile(good)});
  ExpectLoser(true, stage_node);
}

// ---- A sequential model's stages (issue 15's stage disputes, issue 16's tile phase): an MLP of
// the fashion MLP's layers (12 -> 16 -> 8 -> 4: linear, relu, linear, relu, linear) cut into a
// stage per linear layer ([0, 2, 4, 5]), or a small CNN (CnnStageBundle), 2 micro-batches, clipped
// AdamW, on 64 synthetic examples with a data root over them (engine::DataTree), trained by the
// replica's stages with RunStageStep. Its stages are declared over the stage witness bound, so
// RefereeStageStep could not rule them and only the tile phase does.

constexpr char kSeqStageBundle[] = R"([task]
name = "ledger-stage-mlp"
seed = 5
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
lr = 3e-3
grad_clip = 0.5
[train]
steps = 10
batch_size = 8
micro_batches = 2
[network]
rounds = 1
units_per_round = 1
inner_steps = 4
stages = 3
cut = [0, 2, 4, 5]
aggregation = "mean"
)";

// The same task with a small CNN of the fashion CNN's kinds (1 x 8 x 8 images: conv relu maxpool,
// conv relu maxpool, flatten linear), cut into a stage per convolution or linear layer.
std::string CnnStageBundle() {
  std::string b = kSeqStageBundle;
  const size_t from = b.find("[model]"), to = b.find("[optimizer]");
  b.replace(from, to - from,
            "[model]\ninput = [1, 8, 8]\n"
            "[[model.layers]]\nkind = \"conv2d\"\nout = 2\nkernel = 3\npad = 1\n"
            "[[model.layers]]\nkind = \"relu\"\n[[model.layers]]\nkind = \"maxpool2d\"\n"
            "kernel = 2\n"
            "[[model.layers]]\nkind = \"conv2d\"\nout = 2\nkernel = 3\npad = 1\n"
            "[[model.layers]]\nkind = \"relu\"\n[[model.layers]]\nkind = \"maxpool2d\"\n"
            "kernel = 2\n"
            "[[model.layers]]\nkind = \"flatten\"\n[[model.layers]]\nkind = \"linear\"\n"
            "out = 4\n");
  const std::string cut = "cut = [0, 2, 4, 5]";
  b.replace(b.find(cut), cut.size(), "cut = [0, 3, 6, 8]");
  return b;
}

class SeqStageTileChainTest : public StageTileChainTest {
 protected:
  static constexpr int64_t kExamples = 64;
  SeqStageTileChainTest() { UseModel(false); }
  // The MLP (12 features) or the CNN (1 x 8 x 8 images), and its examples, given (no files):
  // SetUp loads none and builds their tree. REQUIRES: before SetUp.
  void UseModel(bool cnn) {
    bundle_ = cnn ? CnnStageBundle() : std::string(kSeqStageBundle);
    const int64_t features = cnn ? 64 : 12;
    Rng rng(23);
    std::vector<float> x(static_cast<size_t>(kExamples * features));
    for (float& v : x) v = static_cast<float>(rng.UniformDouble()) * 2.0f - 1.0f;
    data_.train.x =
        cnn ? engine::Tensor({kExamples, 1, 8, 8}, x) : engine::Tensor({kExamples, features}, x);
    data_.train.y.resize(kExamples);
    for (int32_t& y : data_.train.y) y = static_cast<int32_t>(rng.Uniform(4));
    data_.train.num_classes = 4;
    data_.test = data_.train;
  }
  static void Over(TaskParams& p) { p.stage_memory_bytes = {8u << 20, 8u << 20, 8u << 20}; }
};

// Micro-batch 0's operator of the plan whose name ends with `suffix`; -1 if none.
int64_t OpEndingWith(const engine::TilePlan& plan, const std::string& suffix) {
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (plan.ops[j].name.ends_with(suffix)) return static_cast<int64_t>(j);
  }
  return -1;
}

// Stage `stage` (or its verifier) lies at one element of operator `op` (the first whose name ends
// so): its answers differ from the honest trace at that operator's root in the operator phase and
// at that tile in the tile phase; the other party answers every move from its honest trace.
struct SeqLie {
  uint32_t stage;
  const char* op;
  bool stage_lies;
  bool cnn = false;
};
class SeqStageTileLieTest : public SeqStageTileChainTest,
                            public ::testing::WithParamInterface<SeqLie> {
 protected:
  void SetUp() override {
    UseModel(GetParam().cnn);
    SeqStageTileChainTest::SetUp();
  }
};

// The game narrows to the lie's tile and the ledger recomputes it (RefereeTile: RuleTile) for the
// honest side, whichever side lied, at each stage of the MLP and of the CNN (a convolution of the
// pooled activations it received, and a linear layer after the flatten). The first stage's first
// layer reads the step's examples: its witness carries them, each proven against the task's data
// root (a changed example is refused).
TEST_P(SeqStageTileLieTest, ALieAtATileOfASequentialStageIsRuledOnChainByRefereeTile) {
  const SeqLie lie = GetParam();
  cheat_ = lie.stage;
  std::vector<std::vector<Hash256>> leaves = TrainHonestly(Over);
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, cheat_));
  const TileRuleContext ctx = Context();
  EXPECT_FALSE(ctx.plan.tokens);
  const int64_t op = OpEndingWith(ctx.plan, lie.op);
  ASSERT_GE(op, 0) << lie.op;
  const Party honest = Trace(evidence_[cheat_][kLieStep]);
  const Party liar{WithLie(*honest.trace, static_cast<size_t>(op), 3, 0.5f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  TestStageEvidence committed;
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, lie.stage_lies, &committed));
  ASSERT_NO_FATAL_FAILURE(Play(lie.stage_lies ? liar : honest, lie.stage_lies ? honest : liar));
  const RefereeTask task = TaskNow();
  ASSERT_TRUE(task.tile) << "narrowed to a tile";
  EXPECT_EQ(task.operator_index, static_cast<uint32_t>(op + 1));
  const Bytes good = TileWitnessOf(honest, task);
  EXPECT_EQ(TileWitnessOf(liar, task), good) << "the liar's witness is the honest one's";
  EXPECT_LE(good.size(), kMaxTileWitnessBytes);
  std::printf(
      "sequential stage %u: a lie at %s (%s) ruled at tile %llu by a %zu-byte witness "
      "after %u turns\n",
      cheat_, ctx.plan.ops[static_cast<size_t>(op)].name.c_str(),
      lie.stage_lies ? "stage lies" : "verifier lies",
      static_cast<unsigned long long>(task.tile_index), good.size(),
      Check(cheat_).dispute()->turns());
  Result<TileWitness> w = DecodeTileWitness(good);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {GenesisRuling(task), "narrowed to one tile, which the ledger recomputes itself"},
  };
  if (cheat_ == 0) {
    ASSERT_FALSE(w->examples.empty()) << "the first linear's tile reads the step's examples";
    TileWitness changed = *w;
    changed.examples[0].x[0] += 1.0f;
    refusals.push_back(
        {RefereeTile(EncodeTileWitness(changed)), "is not proven against the data root"});
  } else {
    EXPECT_TRUE(w->examples.empty()) << "a later stage reads no examples";
  }
  ExpectRefused(refusals);
  StepOk({RefereeTile(good)});
  ExpectLoser(lie.stage_lies, stage_node);
}

INSTANTIATE_TEST_SUITE_P(
    EachStageAndSide, SeqStageTileLieTest,
    ::testing::Values(SeqLie{0, "layers.0.out", true}, SeqLie{0, "layers.0.out", false},
                      SeqLie{1, "layers.2.out", true}, SeqLie{1, "layers.2.out", false},
                      SeqLie{2, "layers.4.out", true}, SeqLie{2, "layers.4.out", false},
                      SeqLie{0, "layers.0.out", true, true}, SeqLie{0, "layers.0.out", false, true},
                      SeqLie{1, "layers.3.out", true, true}, SeqLie{1, "layers.3.out", false, true},
                      SeqLie{2, "layers.7.out", true, true},
                      SeqLie{2, "layers.7.out", false, true}),
    [](const ::testing::TestParamInfo<SeqLie>& p) {
      return std::string(p.param.cnn ? "Cnn" : "Mlp") + "Stage" + std::to_string(p.param.stage) +
             (p.param.stage_lies ? "StageLies" : "VerifierLies");
    });

// The two whole steps the tile phase ends at from roots, on a sequential stage, each side lying: a
// lie at a received operator (the activations stage 0 sent) is ruled from the tiled root its
// sender signed in the stage's committed record; a lazy stage (its commit claims the state it
// started from) that answers the game from its honest trace agrees on every root, and its commit
// does not follow from the agreed chain end (RuleStageRoots). An honest stage against a verifier
// that answers honestly but claimed a finding wins by the same rule.
class SeqStageRootsTest : public SeqStageTileChainTest,
                          public ::testing::WithParamInterface<SeqLie> {};

TEST_P(SeqStageRootsTest, ASequentialStageIsRuledOnChainFromRoots) {
  const SeqLie lie = GetParam();
  const bool lazy = std::string(lie.op).empty();
  cheat_ = lie.stage;
  std::vector<std::vector<Hash256>> leaves = TrainHonestly(Over);
  TestStageEvidence committed = evidence_[cheat_][kLieStep];
  if (lie.stage_lies) {
    committed.commit.state_after =
        lazy ? committed.commit.state_before : Blake2b("the liar's state after");
  }
  leaves[cheat_][kLieStep] = protocol::StageStepLeaf(committed.commit);
  StageReplayResult found;
  const Party honest = Trace(committed, &found);
  const TileRuleContext ctx = Context();
  const int64_t op = lazy ? -1 : OpEndingWith(ctx.plan, lie.op);
  ASSERT_TRUE(lazy || op >= 0) << lie.op;
  const Party liar =
      lazy ? honest : Party{WithLie(*honest.trace, static_cast<size_t>(op), 0, 0.25f)};
  const PublicKey stage_node = Unit(cheat_).assignee;
  const Hash256 claim = lazy && lie.stage_lies ? StageFindingLeaf(leaves[cheat_][kLieStep], found)
                                               : Blake2b("the verifier's finding");
  ASSERT_NO_FATAL_FAILURE(DisputeWithBundle(leaves, claim));
  ASSERT_NO_FATAL_FAILURE(Play(lie.stage_lies ? liar : honest, lie.stage_lies ? honest : liar));
  const RefereeTask task = TaskNow();
  ASSERT_EQ(task.roots, lazy ? RefereeRoots::kRootsChainEnd : RefereeRoots::kRootsOperator);
  if (!lazy) {
    EXPECT_EQ(task.operator_index, static_cast<uint32_t>(op + 1));
  }
  const StageRootsWitness good = RootsWitnessOf(honest, task, committed.commit);
  std::printf("sequential stage %u: %s (%s) ruled from a %zu-byte roots witness\n", cheat_,
              lazy ? "a lazy commit" : ctx.plan.ops[static_cast<size_t>(op)].name.c_str(),
              lie.stage_lies ? "stage lies" : "verifier lies",
              EncodeStageRootsWitness(good).size());
  ExpectRefused({{GenesisRuling(task), "which the ledger rules itself from roots"}});
  StepOk({RefereeTile(EncodeStageRootsWitness(good))});
  ExpectLoser(lie.stage_lies, stage_node);
}

INSTANTIATE_TEST_SUITE_P(EachEndAndSide, SeqStageRootsTest,
                         ::testing::Values(SeqLie{2, "", true}, SeqLie{2, "", false},
                                           SeqLie{1, "recv.activation", true},
                                           SeqLie{1, "recv.activation", false}),
                         [](const ::testing::TestParamInfo<SeqLie>& p) {
                           return std::string(std::string(p.param.op).empty() ? "LazyStage"
                                                                              : "Received") +
                                  std::to_string(p.param.stage) +
                                  (p.param.stage_lies ? "StageLies" : "VerifierLies");
                         });

}  // namespace stage_tile_chain_test
}  // namespace meshlearn::ledger
