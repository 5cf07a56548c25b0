// The pipeline fixtures ledger_test's stage tests share (pipeline_stage_test.cc,
// stage_tile_chain_test.cc, stage_tile_test.cc): a task of one replica of three stage units of the
// fashion MLP on a verifying chain (PipelineVerificationTest), and a real replica of the tiny
// pipeline GPT trained with RunStageStep whose evidence a dispute is ruled from
// (PipelineRulingTest).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include "execute.h"
#include "meshlearn/base/blob.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_step.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "test_util.h"

namespace meshlearn::ledger::pipeline_testing {

using protocol::RoundPhase;
using protocol::RoundStateMachine;
using testing::FollowedChainFixture;
using testing::kTestPrice;
using testing::kTestUnitCost;
using testing::TestKey;
using testing::TestTaskParams;

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint32_t kStages = 3;
constexpr uint32_t kReplicas = 2;

// Three stages: the first the heaviest in FLOPs, the last the largest in memory.
inline TaskParams PipelineParams() {
  TaskParams p = TestTaskParams();
  p.units_per_round = kReplicas * kStages;
  p.num_examples = 600;
  p.stages = kStages;
  p.stage_memory_bytes = {3 * kGiB, 1 * kGiB, 5 * kGiB};
  p.stage_flops = {30'000'000'000, 20'000'000'000, 10'000'000'000};
  p.stage_boundary_bytes = {1u << 20, 1u << 20};
  return p;
}

// A real sequential model's pipeline task bundle: examples/fashion-mlp.toml's model (784-256-128-
// 10: linear, relu, linear, relu, linear) cut at `cut` (its [network] table's list, kStages + 1
// layer indices) into kStages stages, one round of kStages units of 4 steps. The ledger plans a
// stage of it from the bundle (TileContextOf), unless the cut makes a stage without parameters,
// which the engine refuses (engine::TaskPipelineCut).
inline std::string FashionMlpPipelineBundle(const std::string& cut) {
  Result<std::string> text =
      Env::Default()->ReadFile(std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-mlp.toml");
  CHECK(text.ok()) << text.status().ToString();
  return text->substr(0, text->find("[network]")) +
         "[network]\nrounds = 1\nunits_per_round = 3\ninner_steps = 4\nstages = 3\ncut = " + cut +
         "\naggregation = \"mean\"\n";
}

// ---- Stage units on a verifying chain (docs/verification.md, "Pipeline stages"): CommitStage
// opens the unit's check with OpenUnitCheck over protocol::StageCheckLeaves (one segment per
// step), and the check runs as a unit's: the beacon draws the steps and a verifier (never a node
// of the replica), verdicts are committed and revealed, a mismatch on a step is disputed and
// ruled, and ApplyEffects slashes, pays and re-runs.
class PipelineVerificationTest : public FollowedChainFixture {
 protected:
  static constexpr Amount kStake = 100'000;
  static constexpr uint32_t kSlashMultiple = 10;
  static constexpr uint32_t kSteps = 4;

  PipelineVerificationTest() : referee_(TestKey(8)), verifier_(TestKey(40)), agg_(TestKey(41)) {
    genesis_ = DevnetGenesis(
        {alice_.public_key(), bob_.public_key(), referee_.public_key(), carol_.public_key()},
        kFunds, "verify-chain");
    testing::SetVerifyingTestParams(genesis_.params);
    genesis_.params.slash_multiple = kSlashMultiple;
    genesis_.referee = referee_.public_key();
    checkers_.insert(verifier_.public_key());
    // Four nodes hold a stage (one more than a replica needs: the re-run's spare); the verifier
    // node also has the solver role but too little memory for any stage.
    for (uint8_t i = 0; i < 4; ++i) stagers_.push_back(TestKey(static_cast<uint8_t>(30 + i)));
  }

  static Hash256 Secret(const PublicKey& node, uint64_t i) {
    return protocol::SecretChainElement(Blake2b("secret seed " + node.ToHex()), i);
  }

  // Alice runs the stages (and the aggregator); the checking nodes (checkers_: the verifier, and
  // any a test adds) are another operator's, carol's: the ledger pays no reward for catching a
  // stage to a node of its own owner (LinkedToCheater). So a transaction the tests sign as alice
  // for a checker (its registration included, which makes carol its owner) is carol's.
  Transaction Q(const KeyPair& from, TxPayload p) {
    const bool checker = std::visit(
        [&](const auto& tx) {
          if constexpr (requires { tx.node_id; }) {
            return checkers_.count(tx.node_id) > 0;
          } else {
            return false;
          }
        },
        p);
    return FollowedChainFixture::Q(checker && &from == &alice_ ? carol_ : from, std::move(p));
  }

  RegisterNodeTx Reg(const KeyPair& node, uint32_t roles, uint64_t memory) {
    return RegisterNodeTx{.node_id = node.public_key(),
                          .endpoint = "http://node:1",
                          .roles = roles,
                          .capabilities = {.cores = 4,
                                           .memory_bytes = memory,
                                           .throughput = 1'000'000'000'000,
                                           .latency_ms = 1,
                                           .bandwidth_bytes_per_s = 1'000'000'000},
                          .price = kTestPrice,
                          .stake = kStake,
                          .secret_head = Secret(node.public_key(), 0)};
  }

  void StepOk(std::vector<Transaction> txs) {
    for (const Receipt& r : Step(std::move(txs))) EXPECT_TRUE(r.ok) << r.reason;
  }

  // One round of one replica of three stages, H = 4 steps, of the task bundle_. `tweak` edits the
  // task's params (default: TestTaskParams' data root over no real examples, stages of 1 GiB: over
  // the stage witness bound, so a mismatch must carry the bundle and the dispute plays the tile
  // phase, MismatchNeedsBundle).
  void Start(const std::function<void(TaskParams&)>& tweak = nullptr) {
    const Hash256 spec_hash = BuildManifest(AsBytes(bundle_)).id().hash;
    std::vector<Transaction> regs;
    for (const KeyPair& k : stagers_) regs.push_back(Q(alice_, Reg(k, kRoleSolver, 4 * kGiB)));
    // The verifier node has the solver role only while no stage fits its memory.
    const uint32_t verifier_roles = kRoleVerifier |
                                    (verifier_whistleblows_ ? kRoleWhistleblower : 0) |
                                    (tweak ? 0 : kRoleSolver);
    regs.push_back(Q(alice_, Reg(verifier_, verifier_roles, kGiB / 2)));
    regs.push_back(Q(alice_, Reg(agg_, kRoleAggregator, kGiB)));
    StepOk(regs);
    TaskParams p = PipelineParams();
    p.rounds = 1;
    p.units_per_round = kStages;
    p.inner_steps = kSteps;
    p.checkpoint_interval = kSteps;
    p.stage_memory_bytes = {kGiB, kGiB, kGiB};
    p.verification_window_blocks = 2;
    if (tweak) tweak(p);
    const Amount budget = MaxTaskCost(p, 20, nullptr, genesis_.params.verifiers_per_unit);
    Transaction submit = Q(
        bob_, SubmitTaskTx{.spec_hash = spec_hash, .budget = budget, .price_cap = 20, .params = p});
    task_id_ = TaskIdFor(bob_.public_key(), submit.nonce);
    StepOk({submit});
  }

  TaskRecord Task() { return chain_->GetTask(task_id_).value(); }
  WorkUnit Unit(uint32_t index) { return chain_->GetWorkUnit(task_id_, index).value(); }
  NodeRecord Node(const PublicKey& id) { return chain_->GetNode(id).value(); }
  protocol::UnitCheck Check(uint32_t stage) {
    return protocol::UnitCheck::Decode(Unit(stage).check).value();
  }
  bool HasCheck(uint32_t stage) { return !Unit(stage).check.empty(); }
  // `cheater` is slashed once and jailed; no other stage node, nor the verifier, is slashed.
  void ExpectOnlyTheCheaterSlashed(const PublicKey& cheater) {
    EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
    EXPECT_EQ(Node(cheater).status, NodeStatus::kJailed);
    for (const KeyPair& k : stagers_) {
      if (k.public_key() == cheater) continue;
      EXPECT_EQ(Node(k.public_key()).reputation.slashes, 0u);
    }
    EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);
  }

  // Stage `stage`'s step leaves (what a stage node's StageUnitOutcome::leaves would be); a
  // cheating stage's differ from step `from` on.
  static std::vector<Hash256> StepLeaves(uint32_t stage, bool cheat = false, uint64_t from = 0) {
    std::vector<Hash256> out;
    for (uint64_t t = 0; t < kSteps; ++t) {
      const bool bad = cheat && t >= from;
      out.push_back(
          Hasher(bad ? "cheated step" : "true step").UpdateU64(stage).UpdateU64(t).Finish());
    }
    return out;
  }
  // The commit of unit `stage` (an index of round 0: replica index / kStages, stage index %
  // kStages; one replica's are its stages).
  CommitStageTx Commit(uint32_t stage, const std::vector<Hash256>& leaves) {
    const WorkUnit u = Unit(stage);
    return CommitStageTx{.task_id = task_id_,
                         .round = 0,
                         .replica = stage / kStages,
                         .stage = stage % kStages,
                         .node_id = u.assignee,
                         .result_hash = Blake2b("stage delta " + std::to_string(stage)),
                         .commitment = protocol::StageCommitment(leaves),
                         .loss_micros = 0,
                         .secret_index = Node(u.assignee).secrets_committed + 1,
                         .leaves = leaves,
                         .assignment_beacon = u.assignment_beacon};
  }

  // A verifier's verdict on stage unit `stage`, sealed now and opened later.
  struct Sealed {
    protocol::Verdict verdict;
    Hash256 salt;
    MismatchClaimField claim;
  };
  // A mismatch on step `step`: the claim proves the committed step leaf against the check's
  // leaves (StageCheckLeaves of what the stage committed).
  Sealed Mismatch(uint32_t stage, const std::vector<Hash256>& committed, uint32_t step,
                  const Hash256& replayed) {
    const std::vector<Hash256> leaves = protocol::StageCheckLeaves(committed);
    auto proof = [&](uint64_t i) {
      MerkleProof p = MerkleProve(leaves, i);
      return MerkleProofField{.index = p.index, .leaf_count = p.leaf_count, .siblings = p.siblings};
    };
    return Sealed{protocol::Verdict::kVerdictMismatch, Blake2b("salt " + std::to_string(stage)),
                  MismatchClaimField{.segment = step,
                                     .start = leaves[step],
                                     .start_proof = proof(step),
                                     .solver_end = leaves[step + 1],
                                     .end_proof = proof(step + 1),
                                     .replayed_end = replayed}};
  }
  Sealed Clean(uint32_t stage) {
    return Sealed{protocol::Verdict::kVerdictClean, Blake2b("salt " + std::to_string(stage)), {}};
  }
  // `by`: the verifier node that seals (default verifier_).
  Transaction SealTx(uint32_t stage, const Sealed& v, const KeyPair* by = nullptr) {
    const PublicKey verifier = (by == nullptr ? verifier_ : *by).public_key();
    const Hash256 evidence = v.verdict == protocol::Verdict::kVerdictMismatch
                                 ? protocol::MismatchEvidence(v.claim.segment, v.claim.replayed_end)
                                 : Hash256{};
    return Q(alice_, CommitVerdictTx{
                         .task_id = task_id_,
                         .index = stage,
                         .node_id = verifier,
                         .commitment = protocol::VerdictCommitment(
                             v.verdict, v.salt, verifier, Check(stage).config().unit, evidence)});
  }
  // The verifier's reveal of `v` (a mismatch's with `bundle`; `by` as SealTx's).
  Transaction RevealTx(uint32_t stage, const Sealed& v, const std::string& bundle = "",
                       const KeyPair* by = nullptr) {
    return Q(alice_, RevealVerdictTx{.task_id = task_id_,
                                     .index = stage,
                                     .node_id = (by == nullptr ? verifier_ : *by).public_key(),
                                     .verdict = static_cast<uint8_t>(v.verdict),
                                     .salt = v.salt,
                                     .claim = v.claim,
                                     .bundle = {bundle}});
  }
  Transaction SecretTx(uint32_t stage) {
    const WorkUnit u = Unit(stage);
    return Q(alice_, RevealSecretTx{.task_id = task_id_,
                                    .index = stage,
                                    .node_id = u.assignee,
                                    .secret = Secret(u.assignee, u.secret_index)});
  }
  void StepUntil(uint32_t stage, protocol::CheckStage want, int limit = 10) {
    for (int i = 0; i < limit && HasCheck(stage) && Check(stage).stage() != want; ++i) Step();
    ASSERT_TRUE(HasCheck(stage)) << "the round re-ran";
    ASSERT_EQ(Check(stage).stage(), want) << protocol::CheckStageName(Check(stage).stage());
  }
  // The verifier's clean verdicts on the round's first replica (units [0, kStages)), sealed, then
  // revealed with the stages' secrets.
  void EveryStageVerifiedClean() {
    std::vector<Sealed> clean;
    std::vector<Transaction> txs;
    for (uint32_t st = 0; st < kStages; ++st) {
      clean.push_back(Clean(st));
      txs.push_back(SealTx(st, clean.back()));
    }
    StepOk(txs);
    StepUntil(0, protocol::CheckStage::kCheckRevealVerdicts);
    txs.clear();
    for (uint32_t st = 0; st < kStages; ++st) {
      txs.push_back(RevealTx(st, clean[st]));
      txs.push_back(SecretTx(st));
    }
    StepOk(txs);
  }
  // The verifier's verdicts on units [0, units) of the round: clean, but `mismatch` on unit
  // `cheat` (revealed with `bundle`); sealed, then revealed with the stages' secrets, until
  // `cheat`'s dispute opens.
  void VerdictsUntilDisputed(uint32_t units, uint32_t cheat, const Sealed& mismatch,
                             const std::string& bundle = "") {
    std::vector<Sealed> verdicts;
    std::vector<Transaction> txs;
    for (uint32_t i = 0; i < units; ++i) {
      verdicts.push_back(i == cheat ? mismatch : Clean(i));
      txs.push_back(SealTx(i, verdicts.back()));
    }
    StepOk(txs);
    StepUntil(0, protocol::CheckStage::kCheckRevealVerdicts);
    txs.clear();
    for (uint32_t i = 0; i < units; ++i) {
      txs.push_back(RevealTx(i, verdicts[i], i == cheat ? bundle : std::string()));
      txs.push_back(SecretTx(i));
    }
    StepOk(txs);
    StepUntil(cheat, protocol::CheckStage::kCheckDisputed);
  }
  // The same, the mismatch without the bundle, until the dispute is at the referee (one step is
  // one segment: at once), for the whole step.
  void VerdictsUntilReferee(uint32_t units, uint32_t cheat, const Sealed& mismatch) {
    ASSERT_NO_FATAL_FAILURE(VerdictsUntilDisputed(units, cheat, mismatch));
    ASSERT_EQ(Check(cheat).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  }
  // In stage `stage`'s dispute, played over its tile plan: the verifier answers the operator
  // phase's opening query (the step's chain end C_n; the ledger checks no posted hash before a
  // ruling, so a stand-in for its run's), and the stage, which cannot defend its step, posts
  // nothing: it loses at the turn's deadline, as a unit's defender does.
  void StageSilentInTheTilePhase(uint32_t stage) {
    ASSERT_TRUE(HasCheck(stage) && Check(stage).dispute().has_value()) << "no dispute to play";
    const protocol::DisputeGame g = *Check(stage).dispute();  // a copy: Check() is a value
    ASSERT_FALSE(g.config().operator_tiles.empty()) << "the stage's dispute plays the tile phase";
    const protocol::DisputeQuery q = g.query();
    ASSERT_EQ(q.stage, protocol::DisputeStage::kDisputeOperators);
    StepOk({Q(alice_, DisputePostTx{.task_id = task_id_,
                                    .index = stage,
                                    .node_id = verifier_.public_key(),
                                    .position = q.position,
                                    .hash = Blake2b("the verifier's chain end")})});
    for (uint64_t i = 0; i <= g.config().response_blocks + 1 && HasCheck(stage) &&
                         Check(stage).stage() == protocol::CheckStage::kCheckDisputed;
         ++i) {
      Step();
    }
  }
  void Aggregate() {
    for (int i = 0; i < 10 && !Machine().aggregator(); ++i) Step();
    ASSERT_TRUE(Machine().aggregator().has_value());
    StepOk({Q(alice_, CommitAggregateTx{.task_id = task_id_,
                                        .round = Machine().round(),
                                        .node_id = agg_.public_key(),
                                        .state_hash = Blake2b("aggregate")})});
  }
  RoundStateMachine Machine() { return RoundStateMachine::Decode(Task().runtime).value(); }
  // Commits every stage of the round (`cheat`: that stage's leaves are wrong from step 1 on).
  void CommitStages(int cheat = -1) {
    std::vector<Transaction> txs;
    for (uint32_t st = 0; st < kStages; ++st) {
      txs.push_back(Q(alice_, Commit(st, StepLeaves(st, static_cast<int>(st) == cheat, 1))));
    }
    StepOk(txs);
  }

  KeyPair referee_, verifier_, agg_;
  // Whether verifier_ has the whistleblower role too (set before Start).
  bool verifier_whistleblows_ = true;
  std::vector<KeyPair> stagers_;
  std::set<PublicKey> checkers_;  // carol's nodes (Q)
  Hash256 task_id_;
  // The task's bundle: the fashion MLP cut into a linear layer a stage, each with parameters
  // (a stage fixture sets another in its constructor).
  std::string bundle_ = FashionMlpPipelineBundle("[0, 2, 4, 5]");
};

// ---- The ledger rules a stage dispute itself (RefereeStageStep; ledger/stage_referee.h): a
// real replica of the tiny pipeline GPT (3 stages on the GPL text, a data root over its token
// pages) trains its steps with RunStageStep; the stage whose step-1 commit claims it did not
// update (lazy) is disputed, and the ledger replays the step from the witness the verifier
// builds from the stage's evidence. Every bad witness is refused, naming what is wrong.

constexpr char kRulingBundle[] = R"([task]
name = "ledger-stage-ruling"
seed = 3
[data]
format = "text"
path = "/usr/share/common-licenses/GPL-3"
[model]
kind = "gpt"
n_layer = 3
n_head = 2
n_embd = 16
block_size = 16
[optimizer]
kind = "adamw"
lr = 3e-3
weight_decay = 0.1
grad_clip = 0.5
[train]
steps = 10
batch_size = 4
micro_batches = 2
[network]
rounds = 1
units_per_round = 1
inner_steps = 4
stages = 3
aggregation = "mean"
)";

// The stages of one replica in one process (node::MemoryStageNetwork's job; ledger_test does not
// link node/): a mailbox per key, a Receive waits for its tensor.
class TestStageNetwork {
 public:
  TestStageNetwork(StageContext ctx, std::vector<const KeyPair*> keys)
      : ctx_(std::move(ctx)), keys_(std::move(keys)) {
    for (size_t s = 0; s < keys_.size(); ++s) links_.emplace_back(this, static_cast<uint32_t>(s));
  }
  StageLink* link(uint32_t s) { return &links_[s]; }
  // Every tensor sent, by its hash (StageTensorBytes).
  std::map<Hash256, Bytes> sent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }

 private:
  class Link final : public StageLink {
   public:
    Link(TestStageNetwork* net, uint32_t stage) : net_(net), stage_(stage) {}
    Result<std::vector<float>> Receive(const protocol::StageTensorKey& key,
                                       protocol::StageTransfer* record) override {
      std::unique_lock<std::mutex> lock(net_->mu_);
      net_->cv_.wait(lock, [&] { return net_->boxes_.count(key) > 0; });
      auto box = net_->boxes_.extract(key);
      lock.unlock();
      ML_RETURN_IF_ERROR(CheckStageTensor(box.mapped().first, box.mapped().second, net_->ctx_));
      *record = box.mapped().first;
      return std::move(box.mapped().second);
    }
    Result<protocol::StageTransfer> Send(const protocol::StageTensorKey& key,
                                         std::span<const float> values) override {
      protocol::StageTransfer r =
          SignStageTensor(key, values, *net_->keys_[stage_], net_->ctx_.TileColsOf(values.size()));
      {
        std::lock_guard<std::mutex> lock(net_->mu_);
        net_->boxes_[key] = {r, std::vector<float>(values.begin(), values.end())};
        net_->sent_[r.tensor] = StageTensorBytes(values);
      }
      net_->cv_.notify_all();
      return r;
    }

   private:
    TestStageNetwork* net_;
    uint32_t stage_;
  };
  StageContext ctx_;
  std::vector<const KeyPair*> keys_;
  std::vector<Link> links_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<protocol::StageTensorKey, std::pair<protocol::StageTransfer, std::vector<float>>> boxes_;
  std::map<Hash256, Bytes> sent_;
};

// What one stage node serves for one step (node::StageStepEvidence).
struct TestStageEvidence {
  protocol::StageStepCommit commit;
  Bytes checkpoint;
  std::map<Hash256, Bytes> blobs;
};

class PipelineRulingTest : public PipelineVerificationTest {
 protected:
  static constexpr uint32_t kCheat = 1;
  static constexpr uint64_t kLieStep = 1;

  // The task's bundle (bundle_) is the tiny pipeline GPT on the GPL text unless a test names
  // another, and bundle_dir_ the directory its data paths are relative to (set before SetUp runs:
  // in the constructor).
  PipelineRulingTest() { bundle_ = kRulingBundle; }
  std::string bundle_dir_ = "/";

  void SetUp() override {
    PipelineVerificationTest::SetUp();
    Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle_, "ruling.toml", bundle_dir_);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec_ = *spec;
    // A test that gives its own examples (a classification task, data_.train, set in its
    // constructor) loads no files.
    if (data_.train.size() == 0) {
      Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), spec_);
      ASSERT_TRUE(data.ok()) << data.status().ToString();
      data_ = std::move(*data);
    }
    // The data root: a token task's over its pages, a classification task's over its examples.
    if (tokens()) {
      pages_ = std::make_unique<engine::TokenPageTree>(data_.train_tokens.tokens);
    } else {
      tree_ = std::make_unique<engine::DataTree>(data_.train);
    }
    Result<ConfigFile> cfg = ConfigFile::Parse(bundle_, "ruling.toml");
    ASSERT_TRUE(cfg.ok());
    Result<protocol::NetworkSpec> net = protocol::NetworkSpec::FromConfig(*cfg);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    net_ = *net;
    work_ = protocol::UnitWorkOf(net_, spec_.seed, engine::TaskContentId(spec_), 0, 0);
  }

  bool tokens() const { return spec_.data.format != "idx" && spec_.data.format != "npy"; }

  // The batch of step `step` (every stage of the replica draws it: the unit's work stream), a
  // token task's windows or a classification task's examples.
  engine::Batch StepBatch(uint64_t step) const {
    if (tokens()) {
      return engine::MakeTokenBatch(
          data_.train_tokens,
          engine::WindowStarts(
              spec_.seed, work_.stream, static_cast<int64_t>(step), spec_.batch_size,
              static_cast<int64_t>(data_.train_tokens.tokens.size()), spec_.seq_len),
          spec_.seq_len);
    }
    return engine::MakeClassificationBatch(
        data_.train, engine::BatchIndices(spec_.seed, work_.stream, data_.train.size(),
                                          spec_.batch_size, static_cast<int64_t>(step)));
  }

  // The replica's stages as a round starts them: every stage of `setup`, initialised as one model
  // from the task's seed (Train's InitPipeline).
  std::vector<std::unique_ptr<engine::Stage>> InitialStages(const StageReplaySetup& setup) {
    std::vector<std::unique_ptr<engine::Stage>> stages;
    for (uint32_t st = 0; st < kStages; ++st) {
      Result<std::unique_ptr<engine::Stage>> stage = engine::Stage::Create(
          setup.model, setup.optimizer, setup.cut, static_cast<int>(st), setup.micro_batches);
      CHECK(stage.ok()) << stage.status().ToString();
      stages.push_back(std::move(*stage));
    }
    engine::InitPipeline(stages, spec_.seed);
    return stages;
  }

  // The whole model's weights the replica's stages start from (Train's InitPipeline), in the
  // model's params() order: the round's start weights a result proof slices.
  std::vector<float> WholeStart() {
    Result<StageReplaySetup> setup = StageReplaySetupOf(spec_, net_, work_.lr_scale, {});
    CHECK(setup.ok()) << setup.status().ToString();
    std::vector<std::unique_ptr<engine::Stage>> stages = InitialStages(*setup);
    std::map<std::string, const engine::Tensor*> by_name;
    for (auto& stage : stages) {
      for (const engine::Param& p : stage->params()) by_name[p.name] = &p.value;
    }
    Result<std::vector<engine::PlannedParam>> shapes = engine::PlanParams(setup->model);
    CHECK(shapes.ok());
    std::vector<float> whole;
    for (const engine::PlannedParam& p : *shapes) {
      const std::vector<float>& v = by_name.at(p.name)->vec();
      whole.insert(whole.end(), v.begin(), v.end());
    }
    return whole;
  }

  // Submits the task with its bundle and data root; stages small enough for a witness.
  // `initial_state`: the round's start state blob id (zero: the fixture's placeholder).
  // `tweak` (optional) then edits the params (a stage's declared memory).
  void StartRuled(const Hash256& initial_state = Hash256{},
                  const std::function<void(TaskParams&)>& tweak = nullptr) {
    const Hash256 root = tokens() ? pages_->root() : tree_->root();
    const uint64_t examples =
        static_cast<uint64_t>(tokens() ? pages_->num_tokens() : tree_->size());
    Result<std::unique_ptr<engine::Model>> whole = engine::Model::Create(spec_.model);
    ASSERT_TRUE(whole.ok());
    const uint64_t model_bytes = 4 * static_cast<uint64_t>((*whole)->NumParameters());
    Start([&](TaskParams& p) {
      p.data_root = root;
      p.num_examples = examples;
      p.data_page_tokens = tokens() ? static_cast<uint32_t>(engine::kTokenPageTokens) : 0;
      // A classification task's batch as its bundle's (the GPT fixtures keep the 4 they had).
      p.batch_size = tokens() ? 4 : static_cast<uint32_t>(spec_.batch_size);
      p.model_bytes = model_bytes;  // the vocabulary the bundle leaves to the data
      p.stage_memory_bytes = {1u << 20, 1u << 20, 1u << 20};
      if (!initial_state.IsZero()) p.initial_state = initial_state;
      if (tweak) tweak(p);
    });
  }

  const KeyPair* KeyOf(const PublicKey& id) {
    for (const KeyPair& k : stagers_) {
      if (k.public_key() == id) return &k;
    }
    return nullptr;
  }

  // Trains the placed replica's kSteps steps with RunStageStep, as its Stagers would: every
  // stage's evidence of every step, [stage][step].
  void Train() {
    // Tiled as a stage node tiles what it sends (StageTileCols, StageTileRows): its records carry
    // the roots the receivers' stage plans commit their inputs to.
    StageContext ctx{task_id_,
                     0,
                     0,
                     {},
                     StageTileCols(spec_.model),
                     StageTileRows(spec_.model, spec_.batch_size, spec_.micro_batches)};
    std::vector<const KeyPair*> keys;
    for (uint32_t st = 0; st < kStages; ++st) {
      ctx.chain.push_back(Unit(st).assignee);
      keys.push_back(KeyOf(ctx.chain.back()));
      ASSERT_NE(keys.back(), nullptr);
    }
    Result<StageReplaySetup> setup = StageReplaySetupOf(spec_, net_, work_.lr_scale, ctx.chain);
    ASSERT_TRUE(setup.ok()) << setup.status().ToString();
    std::vector<std::unique_ptr<engine::Stage>> stages = InitialStages(*setup);
    TestStageNetwork net(ctx, keys);
    evidence_.assign(kStages, std::vector<TestStageEvidence>(kSteps));
    for (uint64_t t = 0; t < kSteps; ++t) {
      const engine::Batch batch = StepBatch(t);
      std::vector<Result<StageStepOutcome>> out(kStages, InvalidArgument("not run"));
      std::vector<std::thread> threads;
      for (uint32_t st = 0; st < kStages; ++st) {
        Result<Bytes> cp = StageCheckpointBytes(stages[st]->state());
        ASSERT_TRUE(cp.ok());
        evidence_[st][t].checkpoint = *cp;
        threads.emplace_back([&, st] {
          out[st] = RunStageStep(*stages[st], ctx, batch,
                                 engine::DropoutSeed(spec_.seed, work_.stream), *net.link(st));
        });
      }
      for (std::thread& th : threads) th.join();
      for (uint32_t st = 0; st < kStages; ++st) {
        ASSERT_TRUE(out[st].ok()) << out[st].status().ToString();
        evidence_[st][t].commit = out[st]->commit;
      }
    }
    // Each stage's checkpoint after its last step (what a result proof carries).
    final_.clear();
    for (uint32_t st = 0; st < kStages; ++st) {
      Result<Bytes> cp = StageCheckpointBytes(stages[st]->state());
      ASSERT_TRUE(cp.ok());
      final_.push_back(*cp);
    }
    // What each stage received, by hash (what its node serves): every tensor sent.
    const std::map<Hash256, Bytes> sent = net.sent();
    for (uint32_t st = 0; st < kStages; ++st) {
      for (uint64_t t = 0; t < kSteps; ++t) {
        for (const protocol::StageTransfer& r : evidence_[st][t].commit.received) {
          evidence_[st][t].blobs[r.tensor] = sent.at(r.tensor);
        }
      }
    }
  }

  std::vector<Hash256> Leaves(uint32_t stage) {
    std::vector<Hash256> out;
    for (uint64_t t = 0; t < kSteps; ++t) {
      out.push_back(protocol::StageStepLeaf(evidence_[stage][t].commit));
    }
    return out;
  }

  // Commits every stage's `leaves`, aggregates, and has the verifier claim `claim` for step
  // kLieStep of stage kCheat (clean for the others), until that dispute is at the referee.
  void CommitAndDispute(const std::vector<std::vector<Hash256>>& leaves, const Hash256& claim) {
    std::vector<Transaction> txs;
    for (uint32_t st = 0; st < kStages; ++st) txs.push_back(Q(alice_, Commit(st, leaves[st])));
    StepOk(txs);
    Aggregate();
    VerdictsUntilReferee(kStages, kCheat, Mismatch(kCheat, leaves[kCheat], kLieStep, claim));
  }

  engine::TaskSpec spec_;
  engine::TaskData data_;
  std::unique_ptr<engine::TokenPageTree> pages_;  // a token task's
  std::unique_ptr<engine::DataTree> tree_;        // a classification task's
  protocol::NetworkSpec net_;
  protocol::UnitWork work_;
  std::vector<std::vector<TestStageEvidence>> evidence_;
  std::vector<Bytes> final_;  // [stage]: its checkpoint after step kSteps - 1
};

}  // namespace meshlearn::ledger::pipeline_testing
