// The referee (node/referee.h): its step computation against the executor's committed leaves,
// its ruling rule, and a whole dispute on an in-process ledger with verification on -- a solver
// and a verifier play the bisection game by hand (one of them lying) until the referee stage,
// and RefereeService rules so that the honest side wins.
#include "meshlearn/node/referee.h"

#include <stdlib.h>

#include <functional>
#include <memory>
#include <optional>

#include <gtest/gtest.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node {
namespace {

using nlohmann::json;

constexpr int64_t kH = 8;
constexpr int64_t kK = 4;

// The synthetic task (trains in milliseconds): 1 round x 1 unit x H=8, k=4 (segments [0,4] and
// [4,8]), written to `env` under /task; returns the TOML's path.
std::string WriteTask(Env* env) {
  Result<std::string> toml =
      testing::WriteSyntheticTask(env, "/task", 5, 256, 64, 8, 3,
                                  /*rounds=*/1, /*units=*/1, kH, kK, "mean", /*hidden=*/8);
  EXPECT_TRUE(toml.ok()) << toml.status().ToString();
  EXPECT_TRUE(env->WriteFileAtomic("/task/task.toml", *toml).ok());
  return "/task/task.toml";
}

struct LocalTask {
  engine::TaskSpec spec;
  NetworkSpec net;
  std::unique_ptr<engine::Trainer> trainer;
  TaskFacts facts;
  GlobalState initial;

  UnitWork Work(uint32_t round, uint32_t shard) const {
    return UnitWork{
        .stream = protocol::UnitSeed(facts.seed, protocol::UnitId{facts.content_id, round, shard}),
        .inner_steps = net.inner_steps,
        .checkpoint_interval = net.checkpoint_interval,
        .lr_scale = net.InnerLrScale(round)};
  }
};

std::unique_ptr<LocalTask> LoadLocalTask(Env* env, const std::string& path) {
  auto t = std::make_unique<LocalTask>();
  t->spec = engine::TaskSpec::Load(env, path).value();
  t->net = NetworkSpec::Load(env, path).value();
  t->trainer = engine::Trainer::Create(env, t->spec).value();
  t->facts = ComputeTaskFacts(*t->trainer, t->net);
  t->initial = InitialState(*t->trainer);
  return t;
}

// Every state hash 0..H of a run (honest or lazy): the run with k = 1 hashes every step, and
// neither the honest executor nor the lazy adversary depends on k otherwise.
std::vector<Hash256> EveryStep(engine::Trainer* trainer, std::span<const float> global,
                               UnitWork work, Adversary adv) {
  work.checkpoint_interval = 1;
  Result<UnitOutcome> out = RunAdversaryUnit(adv, trainer, global, work, {}, {});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out->state_hashes;
}

class RefereeComputeTest : public ::testing::Test {
 protected:
  void SetUp() override { task_ = LoadLocalTask(&env_, WriteTask(&env_)); }
  MemEnv env_;
  std::unique_ptr<LocalTask> task_;
};

TEST_F(RefereeComputeTest, StateHashAfterStepIsTheCommittedLeaf) {
  const UnitWork work = task_->Work(0, 0);
  std::span<const float> global = task_->initial.weights;
  UnitExecutor ex(task_->trainer.get());
  std::optional<engine::TrainState> ckpt;  // the honest state after step k
  UnitRunOptions opts;
  opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                           double) -> Status {
    if (step == kK) {
      ML_RETURN_IF_ERROR(engine::SaveCheckpoint(&env_, "/ckpt", st));
      ML_ASSIGN_OR_RETURN(ckpt, engine::LoadCheckpoint(&env_, "/ckpt"));
    }
    return Status::Ok();
  };
  Result<UnitOutcome> out = ex.Run(global, work, opts);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->hashed_steps, (std::vector<int64_t>{0, 4, 8}));
  // The last leaf (step H) and every intermediate hashed step.
  Result<Hash256> last = StateHashAfterStep(task_->trainer.get(), global, work, kH);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, out->state_hashes.back());
  for (size_t i = 0; i < out->hashed_steps.size(); ++i) {
    EXPECT_EQ(*StateHashAfterStep(task_->trainer.get(), global, work, out->hashed_steps[i]),
              out->state_hashes[i])
        << "step " << out->hashed_steps[i];
  }
  // Unhashed steps agree with a run that hashes every step, and the replay from the solver's
  // checkpoint reaches the same states as the one from the start.
  const std::vector<Hash256> all = EveryStep(task_->trainer.get(), global, work, Adversary::kNone);
  ASSERT_EQ(all.size(), static_cast<size_t>(kH + 1));
  EXPECT_EQ(*StateHashAfterStep(task_->trainer.get(), global, work, 3), all[3]);
  ASSERT_TRUE(ckpt.has_value());
  const int64_t later[] = {4, 5, 7, 8};
  Result<std::vector<Hash256>> from_ckpt =
      ReplayToSteps(task_->trainer.get(), global, work, kK, &*ckpt, later);
  ASSERT_TRUE(from_ckpt.ok()) << from_ckpt.status().ToString();
  EXPECT_EQ(*from_ckpt, (std::vector<Hash256>{all[4], all[5], all[7], all[8]}));
  // Out of range, and steps before the checkpoint.
  EXPECT_FALSE(StateHashAfterStep(task_->trainer.get(), global, work, kH + 1).ok());
  const int64_t before[] = {3};
  EXPECT_FALSE(ReplayToSteps(task_->trainer.get(), global, work, kK, &*ckpt, before).ok());
}

TEST_F(RefereeComputeTest, RulesForTheTrueTransitionOrAgainstAFalseAgreedState) {
  const UnitWork work = task_->Work(0, 0);
  std::span<const float> global = task_->initial.weights;
  const std::vector<Hash256> honest =
      EveryStep(task_->trainer.get(), global, work, Adversary::kNone);
  const std::vector<Hash256> lazy = EveryStep(task_->trainer.get(), global, work, Adversary::kLazy);
  ASSERT_EQ(lazy[1], honest[1]);  // lazy runs step 1, skips step 2
  ASSERT_NE(lazy[2], honest[2]);
  // True agreed input: the true output wins, whichever side posted it.
  protocol::RefereeTask t{.whole_step = true,
                          .step = 2,
                          .input = honest[1],
                          .defender_output = lazy[2],
                          .challenger_output = honest[2]};
  Result<RefereeRuling> r = RuleWholeStep(task_->trainer.get(), global, work, t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->input_true);
  EXPECT_EQ(r->output, honest[2]);
  std::swap(t.defender_output, t.challenger_output);
  EXPECT_EQ(RuleWholeStep(task_->trainer.get(), global, work, t)->output, honest[2]);
  // Both wrong: the true output matches neither.
  t.defender_output = lazy[2];
  t.challenger_output = Blake2b("invented");
  r = RuleWholeStep(task_->trainer.get(), global, work, t);
  EXPECT_EQ(r->output, honest[2]);
  EXPECT_NE(r->reason.find("neither"), std::string::npos) << r->reason;
  // A false agreed input (the lazy state after step 3): the defender agreed to it, the
  // challenger's output stands.
  t = {.whole_step = true,
       .step = 4,
       .input = lazy[3],
       .defender_output = lazy[4],
       .challenger_output = Blake2b("relative")};
  r = RuleWholeStep(task_->trainer.get(), global, work, t);
  EXPECT_FALSE(r->input_true);
  EXPECT_EQ(r->true_input, honest[3]);
  EXPECT_EQ(r->output, t.challenger_output);
  // Refused: operator-level tasks, step 0 and steps past H.
  EXPECT_FALSE(RuleWholeStep(task_->trainer.get(), global, work,
                             {.whole_step = false, .step = 2, .operator_index = 1})
                   .ok());
  EXPECT_FALSE(RuleWholeStep(task_->trainer.get(), global, work, {.step = 0}).ok());
  EXPECT_EQ(RuleWholeStep(task_->trainer.get(), global, work,
                          {.segment = true, .first_step = 0, .step = kK})
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_FALSE(RuleWholeStep(task_->trainer.get(), global, work, {.step = kH + 1}).ok());
}

TEST(RefereeWork, ParsesTheLedgersJson) {
  const Hash256 a = Blake2b("a"), b = Blake2b("b"), c = Blake2b("c");
  const PublicKey d = KeyPair::FromSeed(KeySeed{}).public_key();
  json j = {{"height", 9},
            {"disputes",
             {{{"task_id", a.ToHex()},
               {"index", 3},
               {"round", 1},
               {"shard", 1},
               {"start_state", b.ToHex()},
               {"spec_hash", c.ToHex()},
               {"check",
                {{"dispute",
                  {{"defender", d.ToHex()},
                   {"challenger", d.ToHex()},
                   {"referee",
                    {{"whole_step", true},
                     {"step", 7},
                     {"operator_index", 0},
                     {"input", a.ToHex()},
                     {"defender_output", b.ToHex()},
                     {"challenger_output", c.ToHex()}}}}}}}}}}};
  Result<std::vector<RefereeDispute>> w = ParseRefereeWork(j);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->size(), 1u);
  const RefereeDispute& x = (*w)[0];
  EXPECT_EQ(x.task_id, a);
  EXPECT_EQ(x.index, 3u);
  EXPECT_EQ(x.round, 1u);
  EXPECT_EQ(x.start_state, b);
  EXPECT_EQ(x.spec_hash, c);
  EXPECT_EQ(x.task.step, 7u);
  EXPECT_EQ(x.task.challenger_output, c);
  j["disputes"][0]["check"]["dispute"].erase("referee");
  EXPECT_FALSE(ParseRefereeWork(j).ok());
}

// ---- A dispute on a ledger, to the referee's ruling.

KeyPair TestKeyPair(const std::string& who) {
  Hash256 d = Blake2b("referee test key " + who);
  KeySeed s;
  std::copy(d.bytes.begin(), d.bytes.end(), s.bytes.begin());
  return KeyPair::FromSeed(s);
}

enum class Liar { kSolverSegment0, kSolverLaterSegment, kVerifier };

class RefereeChainTest : public ::testing::TestWithParam<Liar> {
 protected:
  RefereeChainTest()
      : clock_(1'700'000'000'000),
        seq_(TestKeyPair("sequencer")),
        submitter_(TestKeyPair("submitter")),
        solver_(TestKeyPair("solver")),
        verifier_(TestKeyPair("verifier")) {}

  ~RefereeChainTest() override {
    senders_.clear();
    rpc_.reset();
    sequencer_.reset();
    shared_.reset();
    chain_.reset();
    if (!dir_.empty()) (void)!system(("rm -rf '" + dir_ + "'").c_str());
  }

  void SetUp() override {
    local_ = LoadLocalTask(&env_, WriteTask(&env_));
    // The referee's key needs an account to send transactions (send_tx refuses others).
    genesis_ = ledger::DevnetGenesis(
        {submitter_.public_key(), solver_.public_key(), verifier_.public_key(), seq_.public_key()},
        1'000'000'000'000ull, "referee-test");
    ledger::ChainParams& p = genesis_.params;
    p.verification = true;
    p.forced_error_per_million = 0;
    p.verdict_commit_blocks = 2;
    p.verdict_reveal_blocks = 2;
    p.dispute_response_blocks = 3;
    p.min_deadline_blocks = 50;
    genesis_.sequencer = seq_.public_key();  // referee: zero, so the sequencer's key rules
    genesis_.genesis_time_ms = clock_.NowMillis();
    char tmpl[] = "/tmp/meshlearn-referee-XXXXXX";
    dir_ = mkdtemp(tmpl);
    chain_ = ledger::Chain::Open(dir_ + "/chain.db", genesis_).value();
    shared_ = std::make_unique<ledger::SharedChain>(chain_.get());
    sequencer_ = std::make_unique<ledger::Sequencer>(shared_.get(), seq_, &clock_);
    rpc_ = std::make_unique<ledger::RpcService>(shared_.get(), sequencer_.get());
    client_ = std::make_unique<InProcessChainClient>(rpc_.get());
    for (const KeyPair* k : {&submitter_, &solver_, &verifier_, &seq_}) {
      auto s = std::make_unique<TxSender>(client_.get(), *k);
      ASSERT_TRUE(s->Init().ok());
      senders_[k->public_key()] = std::move(s);
    }
    store_ = net::BlobStore::Open(&env_, "/submitter/blobs").value();
  }

  // One block; every party's transactions must succeed.
  void Step() {
    clock_.AdvanceMillis(genesis_.block_interval_ms);
    ASSERT_TRUE(sequencer_->ProduceOnce().ok());
    ASSERT_TRUE(shared_->With([](ledger::Chain& c) { return c.CheckInvariants(); }).ok());
    for (auto& [key, s] : senders_) {
      if (key == seq_.public_key()) continue;  // the referee service takes its own outcomes
      ASSERT_TRUE(s->Poll().ok());
      for (const TxOutcome& o : s->TakeOutcomes()) EXPECT_TRUE(o.ok) << o.type << ": " << o.reason;
    }
  }
  void Send(const KeyPair& from, ledger::TxPayload p) {
    ASSERT_TRUE(senders_.at(from.public_key())->Send(std::move(p)).ok());
  }

  ledger::RegisterNodeTx Register(const KeyPair& node, uint32_t roles) {
    return ledger::RegisterNodeTx{.node_id = node.public_key(),
                                  .endpoint = "in-process",
                                  .roles = roles,
                                  .capabilities = {.cores = 1,
                                                   .memory_bytes = 8ull << 30,
                                                   .throughput = 1'000'000'000,
                                                   .latency_ms = 2,
                                                   .bandwidth_bytes_per_s = 1'000'000'000},
                                  .price = 1,
                                  .stake = genesis_.params.MinStakeFor(roles),
                                  .secret_head = protocol::SecretChainElement(SecretSeed(), 0)};
  }
  static Hash256 SecretSeed() { return Blake2b("the solver's secret seed"); }

  Result<Bytes> GetBlob(const Hash256& id) { return store_->Get(net::BlobId{id}); }

  protocol::UnitCheck Check() {
    return shared_->With([&](ledger::Chain& c) {
      return protocol::UnitCheck::Decode(c.GetWorkUnit(task_id_, index_).value().check).value();
    });
  }
  bool HasCheck() {
    return shared_->With(
        [&](ledger::Chain& c) { return !c.GetWorkUnit(task_id_, index_).value().check.empty(); });
  }
  ledger::NodeRecord Node(const KeyPair& k) {
    return shared_->With([&](ledger::Chain& c) { return c.GetNode(k.public_key()).value(); });
  }

  // Registers the solver and the verifier, publishes and submits the task, waits for the
  // solver's assignment.
  void Start() {
    Send(solver_, Register(solver_, ledger::kRoleSolver));
    Send(verifier_, Register(verifier_, ledger::kRoleVerifier));
    Step();
    TaskBundle bundle = MakeBundle(&env_, "/task/task.toml", store_.get()).value();
    net::BlobId init = store_->Put(EncodeGlobalState(local_->initial)).value();
    ledger::TaskParams params = MakeTaskParams(local_->facts, local_->net, init.hash);
    task_id_ = ledger::TaskIdFor(submitter_.public_key(),
                                 senders_.at(submitter_.public_key())->next_nonce());
    Send(submitter_, ledger::SubmitTaskTx{.spec_hash = bundle.id.hash,
                                          .budget = local_->net.budget,
                                          .price_cap = local_->net.price_cap,
                                          .memo = "referee test",
                                          .params = params});
    for (int i = 0; i < 10 && !assignment_; ++i) {
      Step();
      NodeWork w = GetNodeWork(*client_, solver_.public_key()).value();
      if (!w.units.empty()) assignment_ = w.units[0];
    }
    ASSERT_TRUE(assignment_.has_value());
    index_ = assignment_->index;
    EXPECT_EQ(assignment_->start_state, init.hash);
  }

  // Steps until the check is in `stage` (or gone).
  void StepUntil(protocol::CheckStage stage, int limit = 10) {
    for (int i = 0; i < limit && HasCheck() && Check().stage() != stage; ++i) Step();
    ASSERT_TRUE(HasCheck());
    ASSERT_EQ(Check().stage(), stage) << protocol::CheckStageName(Check().stage());
  }

  static ledger::MerkleProofField ProofField(const std::vector<Hash256>& leaves, uint64_t i) {
    MerkleProof p = MerkleProve(leaves, i);
    return {.index = p.index, .leaf_count = p.leaf_count, .siblings = p.siblings};
  }

  MemEnv env_;
  FakeClock clock_;
  KeyPair seq_, submitter_, solver_, verifier_;
  std::unique_ptr<LocalTask> local_;
  ledger::Genesis genesis_;
  std::string dir_;
  std::unique_ptr<ledger::Chain> chain_;
  std::unique_ptr<ledger::SharedChain> shared_;
  std::unique_ptr<ledger::Sequencer> sequencer_;
  std::unique_ptr<ledger::RpcService> rpc_;
  std::unique_ptr<InProcessChainClient> client_;
  std::map<PublicKey, std::unique_ptr<TxSender>> senders_;
  std::unique_ptr<net::BlobStore> store_;
  Hash256 task_id_;
  std::optional<UnitAssignment> assignment_;
  uint32_t index_ = 0;
};

TEST_P(RefereeChainTest, TheHonestSideWins) {
  const Liar liar = GetParam();
  const bool solver_lies = liar != Liar::kVerifier;
  ASSERT_NO_FATAL_FAILURE(Start());
  engine::Trainer* tr = local_->trainer.get();
  std::span<const float> global = local_->initial.weights;
  const UnitWork work = local_->Work(assignment_->round, assignment_->shard);

  // The solver's unit: honest, or lazy (its checkpoint after step k kept for the verifier).
  std::optional<engine::TrainState> ckpt;
  UnitRunOptions opts;
  opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                           double) -> Status {
    if (step == kK) {
      ML_RETURN_IF_ERROR(engine::SaveCheckpoint(&env_, "/solver-ckpt", st));
      ML_ASSIGN_OR_RETURN(ckpt, engine::LoadCheckpoint(&env_, "/solver-ckpt"));
    }
    return Status::Ok();
  };
  const Adversary solver_mode = solver_lies ? Adversary::kLazy : Adversary::kNone;
  UnitOutcome out = RunAdversaryUnit(solver_mode, tr, global, work, opts, {}).value();
  const std::vector<Hash256>& leaves = out.state_hashes;  // steps 0, 4, 8
  const std::vector<Hash256> honest = EveryStep(tr, global, work, Adversary::kNone);
  const std::vector<Hash256> solver_states = EveryStep(tr, global, work, solver_mode);
  ASSERT_TRUE(ckpt.has_value());
  Send(solver_, ledger::CommitUnitTx{.task_id = task_id_,
                                     .index = index_,
                                     .node_id = solver_.public_key(),
                                     .result_hash = out.delta_hash,
                                     .commitment = out.commitment,
                                     .loss_micros = 1,
                                     .secret_index = 1});
  Step();
  ASSERT_NO_FATAL_FAILURE(StepUntil(protocol::CheckStage::kCheckCommitVerdicts));
  ASSERT_EQ(Check().verifiers().at(0), verifier_.public_key());

  // The verifier's claim and the hashes it will post:
  //   kSolverSegment0      segment 0 replayed from the unit's start: the true states;
  //   kSolverLaterSegment  segment 1 replayed from the solver's (lazy) checkpoint at step k:
  //                        true transitions from a false state;
  //   kVerifier            segment 1 of honest work, with invented states.
  const uint32_t segment = liar == Liar::kSolverSegment0 ? 0 : 1;
  std::function<Hash256(uint64_t)> verifier_states;
  if (liar == Liar::kSolverSegment0) {
    verifier_states = [&](uint64_t s) { return honest[s]; };
  } else if (liar == Liar::kSolverLaterSegment) {
    verifier_states = [&, tr, global, work](uint64_t s) {
      const int64_t at[] = {static_cast<int64_t>(s)};
      return ReplayToSteps(tr, global, work, kK, &*ckpt, at).value()[0];
    };
  } else {
    verifier_states = [&](uint64_t s) {
      return s <= static_cast<uint64_t>(kK) ? honest[s] : Hasher("invented").UpdateU64(s).Finish();
    };
  }
  auto solver_posts = [&](uint64_t s) { return solver_states[s]; };
  const uint64_t seg_end = (segment + 1) * kK;
  const Hash256 replayed_end = verifier_states(seg_end);
  ASSERT_NE(replayed_end, leaves[segment + 1]);
  const Hash256 salt = Blake2b("salt");
  const protocol::UnitId uid = Check().config().unit;
  Send(verifier_, ledger::CommitVerdictTx{
                      .task_id = task_id_,
                      .index = index_,
                      .node_id = verifier_.public_key(),
                      .commitment = protocol::VerdictCommitment(
                          protocol::Verdict::kVerdictMismatch, salt, verifier_.public_key(), uid,
                          protocol::MismatchEvidence(segment, replayed_end))});
  Step();
  ASSERT_NO_FATAL_FAILURE(StepUntil(protocol::CheckStage::kCheckRevealVerdicts));
  Send(verifier_,
       ledger::RevealVerdictTx{.task_id = task_id_,
                               .index = index_,
                               .node_id = verifier_.public_key(),
                               .verdict = static_cast<uint8_t>(protocol::Verdict::kVerdictMismatch),
                               .salt = salt,
                               .claim = {.segment = segment,
                                         .start = leaves[segment],
                                         .start_proof = ProofField(leaves, segment),
                                         .solver_end = leaves[segment + 1],
                                         .end_proof = ProofField(leaves, segment + 1),
                                         .replayed_end = replayed_end}});
  Send(solver_, ledger::RevealSecretTx{.task_id = task_id_,
                                       .index = index_,
                                       .node_id = solver_.public_key(),
                                       .secret = protocol::SecretChainElement(SecretSeed(), 1),
                                       .start_leaf = leaves[0]});
  Step();
  ASSERT_NO_FATAL_FAILURE(StepUntil(protocol::CheckStage::kCheckDisputed));

  // Both parties post every turn until the game reaches the referee.
  for (int turn = 0; turn < 10; ++turn) {
    const protocol::UnitCheck c = Check();
    const protocol::DisputeGame& g = *c.dispute();
    if (g.stage() != protocol::DisputeStage::kDisputeSteps) break;
    const uint64_t pos = g.query().position;
    Send(solver_, ledger::DisputePostTx{.task_id = task_id_,
                                        .index = index_,
                                        .node_id = solver_.public_key(),
                                        .position = pos,
                                        .hash = solver_posts(pos)});
    Send(verifier_, ledger::DisputePostTx{.task_id = task_id_,
                                          .index = index_,
                                          .node_id = verifier_.public_key(),
                                          .position = pos,
                                          .hash = verifier_states(pos)});
    Step();
  }
  ASSERT_EQ(Check().dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  const protocol::RefereeTask task = Check().dispute()->referee_task();

  // The referee: the sequencer's key (genesis.referee is zero), blobs from the submitter.
  std::vector<std::string> log;
  RefereeService referee(client_.get(), senders_.at(seq_.public_key()).get(),
                         [&](const Hash256& id) { return GetBlob(id); },
                         {.env = &env_, .work_dir = "/referee", .log = [&](const std::string& l) {
                            log.push_back(l);
                          }});
  Result<std::vector<RefereeRecord>> sent = referee.Poll();
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  ASSERT_EQ(sent->size(), 1u) << ::testing::PrintToString(log);
  const RefereeRuling& ruling = (*sent)[0].ruling;
  EXPECT_EQ((*sent)[0].dispute.task.step, task.step);
  EXPECT_EQ(ruling.true_input, honest[task.step - 1]);
  EXPECT_EQ(ruling.true_output, honest[task.step]);
  EXPECT_EQ(ruling.input_true, liar != Liar::kSolverLaterSegment) << ruling.reason;
  if (solver_lies) {
    EXPECT_EQ(ruling.output, task.challenger_output) << ruling.reason;
  } else {
    EXPECT_EQ(ruling.output, task.defender_output) << ruling.reason;
  }
  // In flight: a second pass sends nothing more.
  EXPECT_TRUE(referee.Poll()->empty());
  Step();
  EXPECT_TRUE(referee.Poll()->empty());
  ASSERT_EQ(referee.rulings().size(), 1u);
  EXPECT_TRUE(referee.rulings()[0].ok) << referee.rulings()[0].error;

  for (int i = 0; i < 5 && HasCheck() && Check().stage() != protocol::CheckStage::kCheckSettled;
       ++i) {
    Step();
  }
  const ledger::NodeRecord s = Node(solver_), v = Node(verifier_);
  if (solver_lies) {
    EXPECT_FALSE(HasCheck());  // fraud: the round re-runs without the cheater
    EXPECT_EQ(s.reputation.slashes, 1u);
    EXPECT_EQ(v.reputation.slashes, 0u);
  } else {
    ASSERT_TRUE(HasCheck());
    EXPECT_EQ(Check().result(), protocol::CheckResult::kCheckClean) << Check().reason();
    EXPECT_EQ(s.reputation.slashes, 0u);
    EXPECT_EQ(v.reputation.slashes, 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, RefereeChainTest,
                         ::testing::Values(Liar::kSolverSegment0, Liar::kSolverLaterSegment,
                                           Liar::kVerifier),
                         [](const auto& info) {
                           switch (info.param) {
                             case Liar::kSolverSegment0:
                               return "LazySolverSegment0";
                             case Liar::kSolverLaterSegment:
                               return "LazySolverFromItsCheckpoint";
                             default:
                               return "LyingVerifier";
                           }
                         });

}  // namespace
}  // namespace meshlearn::node
