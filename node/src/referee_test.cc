// The referee (node/referee.h): its step computation against the executor's committed leaves,
// its ruling rule, and a whole dispute on an in-process ledger with verification on -- a solver
// and a verifier play the bisection game by hand (one of them lying) until the referee stage,
// and RefereeService rules so that the honest side wins.
#include "meshlearn/node/referee.h"

#include <stdlib.h>

#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include <gtest/gtest.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/step_witness.h"
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
    return protocol::UnitWorkOf(net, facts, round, shard);
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

// ---- Tolerance mode.

TEST(RefereeTolerance, JudgesEndParametersAgainstTheTasksThresholds) {
  std::vector<float> truth(1000);
  for (size_t i = 0; i < truth.size(); ++i) truth[i] = 0.1f * static_cast<float>(i % 17) - 0.7f;
  const protocol::ToleranceParams tol{.max_rel_l2_ppm = 10, .max_cosine_gap_ppb = 100};
  // The same state: distance 0, within.
  RefereeRuling r = JudgeTolerance(&truth, truth, tol);
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  EXPECT_TRUE(r.defender_shown);
  EXPECT_EQ(r.distance.rel_l2, 0);
  // Slightly off (about 2 ppm relative L2, as other hardware would end): within.
  std::vector<float> near = truth;
  for (size_t i = 0; i < near.size(); i += 2) near[i] *= 1 + 4e-6f;
  r = JudgeTolerance(&near, truth, tol);
  EXPECT_GT(r.distance.rel_l2, 1e-6);
  EXPECT_LT(r.distance.rel_l2, 10e-6);
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  EXPECT_NE(r.reason.find("within"), std::string::npos) << r.reason;
  // Grossly off (1%): outside.
  std::vector<float> far = truth;
  for (float& x : far) x *= 1.01f;
  far[3] += 0.5f;
  r = JudgeTolerance(&far, truth, tol);
  EXPECT_GT(r.distance.rel_l2, 1e-2);
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  EXPECT_NE(r.reason.find("outside"), std::string::npos) << r.reason;
  // Nothing shown, a state of another size, NaN: outside.
  r = JudgeTolerance(nullptr, truth, tol);
  EXPECT_EQ(r.tolerance_verdict, 2);
  EXPECT_FALSE(r.defender_shown);
  const std::vector<float> shorter(truth.begin(), truth.end() - 1);
  EXPECT_EQ(JudgeTolerance(&shorter, truth, tol).tolerance_verdict, 2);
  std::vector<float> nan = truth;
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(JudgeTolerance(&nan, truth, tol).tolerance_verdict, 2);
  // Exact thresholds (0, 0) accept only the same parameters.
  EXPECT_EQ(JudgeTolerance(&truth, truth, {}).tolerance_verdict, 1);
  EXPECT_EQ(JudgeTolerance(&near, truth, {}).tolerance_verdict, 2);
}

TEST_F(RefereeComputeTest, RulesASegmentOnTheDefendersCommittedEndState) {
  const UnitWork work = task_->Work(0, 0);
  std::span<const float> global = task_->initial.weights;
  engine::Trainer* tr = task_->trainer.get();
  // The honest and the lazy unit, each with its checkpoint after step k.
  auto run = [&](Adversary adv, const std::string& ckpt_path) {
    UnitRunOptions opts;
    opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                             double) -> Status {
      return step == kK ? engine::SaveCheckpoint(&env_, ckpt_path, st) : Status::Ok();
    };
    Result<UnitOutcome> out = RunAdversaryUnit(adv, tr, global, work, opts, {});
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return *out;
  };
  const UnitOutcome honest = run(Adversary::kNone, "/honest-ckpt");
  const UnitOutcome lazy = run(Adversary::kLazy, "/lazy-ckpt");
  auto load = [&](const std::string& path) { return engine::LoadCheckpoint(&env_, path).value(); };
  const protocol::ToleranceParams tol{.max_rel_l2_ppm = 10, .max_cosine_gap_ppb = 1000};
  auto rule = [&](const protocol::RefereeTask& t, const DefenderEndState& d) {
    Result<RefereeRuling> r = RuleSegment(tr, global, work, t, d, tol);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : RefereeRuling{};
  };

  // Segment 0 (steps 0..k), judged on the defender's checkpoint at k.
  protocol::RefereeTask seg0{.segment = true,
                             .first_step = 0,
                             .step = kK,
                             .input = honest.state_hashes[0],
                             .defender_output = honest.state_hashes[1],
                             .challenger_output = Blake2b("replayed elsewhere")};
  engine::TrainState st = load("/honest-ckpt");
  RefereeRuling r = rule(seg0, {.checkpoint = &st});
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  EXPECT_EQ(r.distance.rel_l2, 0);
  EXPECT_EQ(r.true_input, honest.state_hashes[0]);
  EXPECT_EQ(r.true_output, honest.state_hashes[1]);
  EXPECT_EQ(r.output, r.true_output);
  // The honest state nudged by about 1 ppm, committed as such (its own leaf): within.
  for (engine::Param& p : st.model->params()) {
    for (int64_t i = 0; i < p.value.size(); i += 2) p.value.data()[i] *= 1 + 2e-6f;
  }
  seg0.defender_output = engine::StateHash(st);
  r = rule(seg0, {.checkpoint = &st});
  EXPECT_GT(r.distance.rel_l2, 0);
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  // Grossly off: outside.
  for (engine::Param& p : st.model->params()) {
    for (int64_t i = 0; i < p.value.size(); ++i)
      p.value.data()[i] = p.value.data()[i] * 1.1f + 0.01f;
  }
  seg0.defender_output = engine::StateHash(st);
  r = rule(seg0, {.checkpoint = &st});
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  EXPECT_TRUE(r.defender_shown);
  // The lazy solver's own committed state (it skipped a step): outside.
  engine::TrainState lazy_st = load("/lazy-ckpt");
  seg0.defender_output = lazy.state_hashes[1];
  r = rule(seg0, {.checkpoint = &lazy_st});
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  EXPECT_TRUE(r.defender_shown);
  // A served state that is not the committed one (the honest state for the lazy leaf), or
  // nothing: the defender cannot show its state.
  engine::TrainState honest_st = load("/honest-ckpt");
  r = rule(seg0, {.checkpoint = &honest_st});
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  EXPECT_FALSE(r.defender_shown);
  EXPECT_NE(r.reason.find("committed leaf"), std::string::npos) << r.reason;
  r = rule(seg0, {.missing = "its unit service did not answer"});
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  EXPECT_NE(r.reason.find("did not answer"), std::string::npos) << r.reason;

  // Segment 1 ends at H: judged on the committed delta (end = global - delta).
  protocol::RefereeTask seg1{.segment = true,
                             .first_step = kK,
                             .step = kH,
                             .input = honest.state_hashes[1],
                             .defender_output = honest.state_hashes[2],
                             .challenger_output = Blake2b("replayed elsewhere")};
  r = rule(seg1, {.delta = &honest.delta});
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  EXPECT_EQ(r.distance.rel_l2, 0);
  EXPECT_EQ(r.true_output, honest.state_hashes[2]);
  std::vector<float> nudged = honest.delta;
  for (float& x : nudged) x *= 1 + 1e-5f;
  r = rule(seg1, {.delta = &nudged});
  EXPECT_GT(r.distance.rel_l2, 0);
  EXPECT_EQ(r.tolerance_verdict, 1) << r.reason;
  seg1.defender_output = lazy.state_hashes[2];
  r = rule(seg1, {.delta = &lazy.delta});
  EXPECT_EQ(r.tolerance_verdict, 2) << r.reason;
  // A delta stands for step H only.
  EXPECT_EQ(rule(seg0, {.delta = &honest.delta}).tolerance_verdict, 2);
  // Refused: an exact-mode task, a range outside the unit.
  EXPECT_FALSE(RuleSegment(tr, global, work, {.step = 2}, {}, tol).ok());
  EXPECT_FALSE(
      RuleSegment(tr, global, work, {.segment = true, .first_step = 4, .step = kH + 4}, {}, tol)
          .ok());
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

class RefereeChainFixture : public ::testing::Test {
 protected:
  RefereeChainFixture()
      : clock_(1'700'000'000'000),
        seq_(TestKeyPair("sequencer")),
        submitter_(TestKeyPair("submitter")),
        solver_(TestKeyPair("solver")),
        verifier_(TestKeyPair("verifier")),
        anyone_(TestKeyPair("anyone")) {}

  ~RefereeChainFixture() override {
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
    // `anyone_`: an account genesis does not name as referee (a RefereeStep needs no key).
    genesis_ =
        ledger::DevnetGenesis({submitter_.public_key(), solver_.public_key(),
                               verifier_.public_key(), seq_.public_key(), anyone_.public_key()},
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
    dir_ = TestDir("referee");
    chain_ = ledger::Chain::Open(dir_ + "/chain.db", genesis_).value();
    shared_ = std::make_unique<ledger::SharedChain>(chain_.get());
    sequencer_ = std::make_unique<ledger::Sequencer>(shared_.get(), seq_, &clock_);
    rpc_ = std::make_unique<ledger::RpcService>(shared_.get(), sequencer_.get());
    client_ = std::make_unique<InProcessChainClient>(rpc_.get());
    for (const KeyPair* k : {&submitter_, &solver_, &verifier_, &seq_, &anyone_}) {
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
      // The referee service takes its own outcomes.
      if (key == seq_.public_key() || key == anyone_.public_key()) continue;
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

  // Registers the solver and the verifier, publishes and submits the task (in tolerance mode when
  // `tolerance` is not exact; `tweak` changes the params), waits for the solver's assignment.
  void Start(const protocol::ToleranceParams& tolerance = {},
             const std::function<void(ledger::TaskParams&)>& tweak = nullptr) {
    Send(solver_, Register(solver_, ledger::kRoleSolver));
    Send(verifier_, Register(verifier_, ledger::kRoleVerifier));
    Step();
    TaskBundle bundle = MakeBundle(&env_, "/task/task.toml", store_.get()).value();
    bundle_id_ = bundle.id.hash;
    net::BlobId init = store_->Put(EncodeGlobalState(local_->initial)).value();
    ledger::TaskParams params = MakeTaskParams(local_->facts, local_->net, init.hash);
    params.tolerance_rel_l2_ppm = tolerance.max_rel_l2_ppm;
    params.tolerance_cosine_gap_ppb = tolerance.max_cosine_gap_ppb;
    if (tweak) tweak(params);
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

  // The solver commits (`leaves`, `result_hash`); the (only) verifier commits and reveals a
  // mismatch in `segment` ending at `replayed_end`; steps until the unit is disputed.
  // With `bundle` (the task bundle's text) the dispute plays the tile phase.
  void CommitAndDispute(const std::vector<Hash256>& leaves, const Hash256& result_hash,
                        uint32_t segment, const Hash256& replayed_end,
                        const std::string& bundle = "") {
    Send(solver_, ledger::CommitUnitTx{.task_id = task_id_,
                                       .index = index_,
                                       .node_id = solver_.public_key(),
                                       .result_hash = result_hash,
                                       .commitment = MerkleRoot(leaves),
                                       .loss_micros = 1,
                                       .secret_index = 1,
                                       .leaves = leaves});
    Step();
    ASSERT_NO_FATAL_FAILURE(StepUntil(protocol::CheckStage::kCheckCommitVerdicts));
    ASSERT_EQ(Check().verifiers().at(0), verifier_.public_key());
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
    Send(verifier_, ledger::RevealVerdictTx{
                        .task_id = task_id_,
                        .index = index_,
                        .node_id = verifier_.public_key(),
                        .verdict = static_cast<uint8_t>(protocol::Verdict::kVerdictMismatch),
                        .salt = salt,
                        .claim = {.segment = segment,
                                  .start = leaves[segment],
                                  .start_proof = ProofField(leaves, segment),
                                  .solver_end = leaves[segment + 1],
                                  .end_proof = ProofField(leaves, segment + 1),
                                  .replayed_end = replayed_end},
                        .bundle = {bundle}});
    Send(solver_, ledger::RevealSecretTx{.task_id = task_id_,
                                         .index = index_,
                                         .node_id = solver_.public_key(),
                                         .secret = protocol::SecretChainElement(SecretSeed(), 1),
                                         .start_leaf = leaves[0]});
    Step();
    ASSERT_NO_FATAL_FAILURE(StepUntil(protocol::CheckStage::kCheckDisputed));
  }

  // Steps until the check settles (or is gone: fraud re-runs the round without the cheater).
  void StepUntilSettled() {
    for (int i = 0; i < 5 && HasCheck() && Check().stage() != protocol::CheckStage::kCheckSettled;
         ++i) {
      Step();
    }
  }

  MemEnv env_;
  FakeClock clock_;
  KeyPair seq_, submitter_, solver_, verifier_, anyone_;
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
  Hash256 bundle_id_;  // the task bundle's blob (its spec_hash)
  std::optional<UnitAssignment> assignment_;
  uint32_t index_ = 0;
};

// An exact-mode dispute played by hand to the referee stage.
struct PlayedDispute {
  std::vector<Hash256> honest;  // every state hash 0..H of the honest unit
  protocol::RefereeTask task;   // the referee stage's task
  uint64_t first_step = 0;      // the disputed segment's first step
};

class RefereeExactFixture : public RefereeChainFixture {
 protected:
  // The solver commits its unit (lazy when `liar` is a solver; its checkpoint after step k is
  // saved as /solver-ckpt for its "unit service"), the verifier claims a mismatch and both post
  // every turn until the game reaches the referee.
  //   kSolverSegment0      segment 0 replayed from the unit's start: the true states;
  //   kSolverLaterSegment  segment 1 replayed from the solver's (lazy) checkpoint at step k:
  //                        true transitions from a false state;
  //   kVerifier            segment 1 of honest work, with invented states.
  void PlayToReferee(Liar liar, PlayedDispute* out) {
    const bool solver_lies = liar != Liar::kVerifier;
    engine::Trainer* tr = local_->trainer.get();
    std::span<const float> global = local_->initial.weights;
    const UnitWork work = local_->Work(assignment_->round, assignment_->shard);
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
    UnitOutcome unit = RunAdversaryUnit(solver_mode, tr, global, work, opts, {}).value();
    const std::vector<Hash256>& leaves = unit.state_hashes;  // steps 0, 4, 8
    out->honest = EveryStep(tr, global, work, Adversary::kNone);
    const std::vector<Hash256> solver_states = EveryStep(tr, global, work, solver_mode);
    ASSERT_TRUE(ckpt.has_value());

    const uint32_t segment = liar == Liar::kSolverSegment0 ? 0 : 1;
    out->first_step = segment * kK;
    const std::vector<Hash256>& honest = out->honest;
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
        return s <= static_cast<uint64_t>(kK) ? honest[s]
                                              : Hasher("invented").UpdateU64(s).Finish();
      };
    }
    auto solver_posts = [&](uint64_t s) { return solver_states[s]; };
    const uint64_t seg_end = (segment + 1) * kK;
    ASSERT_NO_FATAL_FAILURE(
        CommitAndDispute(leaves, unit.delta_hash, segment, verifier_states(seg_end)));

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
    out->task = Check().dispute()->referee_task();
  }

  // The solver's "unit service": its checkpoint after step k (nothing else), and the steps asked.
  RefereeCheckpointSource SolverCheckpoints(std::vector<int64_t>* asked) {
    return [this, asked](const RefereeDispute& d, int64_t step) -> Result<Bytes> {
      EXPECT_EQ(d.defender, solver_.public_key());
      asked->push_back(step);
      if (step != kK) return NotFound("no checkpoint at step " + std::to_string(step));
      ML_ASSIGN_OR_RETURN(std::string bytes, env_.ReadFile("/solver-ckpt"));
      return ToBytes(bytes);
    };
  }

  // Steps until the check settles and checks who was slashed.
  void ExpectHonestSideWon(bool solver_lies) {
    StepUntilSettled();
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
};

// The referee is the ledger itself, from a step witness (the task's data root proves the step's
// examples; the service's key is an ordinary account). An exact-mode task without a data root,
// whose whole steps the genesis referee would rule, never gets on chain
// (AnExactModeTaskWithoutADataRootIsRefusedAtSubmission).
class RefereeChainTest : public RefereeExactFixture, public ::testing::WithParamInterface<Liar> {};

TEST_P(RefereeChainTest, TheHonestSideWins) {
  const Liar liar = GetParam();
  const bool solver_lies = liar != Liar::kVerifier;
  ASSERT_NO_FATAL_FAILURE(Start({}, [&](ledger::TaskParams& p) {
    EXPECT_EQ(p.data_root, local_->facts.data_root);  // MakeTaskParams sets it
    EXPECT_FALSE(p.data_root.IsZero());
  }));
  PlayedDispute played;
  ASSERT_NO_FATAL_FAILURE(PlayToReferee(liar, &played));
  const std::vector<Hash256>& honest = played.honest;
  const protocol::RefereeTask& task = played.task;

  // The referee: for a step witness any funded key, not genesis.referee (zero: the sequencer's);
  // blobs from the submitter; the solver's checkpoint from its "unit service".
  const KeyPair& referee_key = anyone_;
  std::vector<std::string> log;
  std::vector<int64_t> asked;
  RefereeService referee(client_.get(), senders_.at(referee_key.public_key()).get(),
                         [&](const Hash256& id) { return GetBlob(id); },
                         {.env = &env_,
                          .work_dir = "/referee",
                          .log = [&](const std::string& l) { log.push_back(l); },
                          .fetch_checkpoint = SolverCheckpoints(&asked)});
  Result<std::vector<RefereeRecord>> sent = referee.Poll();
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  ASSERT_EQ(sent->size(), 1u) << ::testing::PrintToString(log);
  const RefereeRuling& ruling = (*sent)[0].ruling;
  EXPECT_EQ((*sent)[0].dispute.task.step, task.step);
  EXPECT_EQ((*sent)[0].dispute.first_step, played.first_step);
  EXPECT_EQ(ruling.true_input, honest[task.step - 1]);
  EXPECT_EQ(ruling.true_output, honest[task.step]);
  EXPECT_EQ(ruling.input_true, liar != Liar::kSolverLaterSegment) << ruling.reason;
  if (solver_lies) {
    EXPECT_EQ(ruling.output, task.challenger_output) << ruling.reason;
  } else {
    EXPECT_EQ(ruling.output, task.defender_output) << ruling.reason;
  }
  EXPECT_TRUE(ruling.ledger_executes);
  EXPECT_EQ((*sent)[0].tx_type, "RefereeStep");
  EXPECT_GT(ruling.witness_bytes, 0u);
  // Only a defender that cheated before the dispute is asked for its checkpoint (at the
  // disputed segment's start), which then gives the agreed state.
  EXPECT_EQ(ruling.from_checkpoint, liar == Liar::kSolverLaterSegment) << ruling.reason;
  EXPECT_EQ(asked,
            liar == Liar::kSolverLaterSegment ? std::vector<int64_t>{kK} : std::vector<int64_t>{});
  // In flight: a second pass sends nothing more.
  EXPECT_TRUE(referee.Poll()->empty());
  Step();
  EXPECT_TRUE(referee.Poll()->empty());
  ASSERT_EQ(referee.rulings().size(), 1u);
  EXPECT_TRUE(referee.rulings()[0].ok) << referee.rulings()[0].error;
  ASSERT_NO_FATAL_FAILURE(ExpectHonestSideWon(solver_lies));
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, RefereeChainTest,
                         ::testing::Values(Liar::kSolverSegment0, Liar::kSolverLaterSegment,
                                           Liar::kVerifier),
                         [](const auto& info) -> std::string {
                           switch (info.param) {
                             case Liar::kSolverSegment0:
                               return "LazySolverSegment0";
                             case Liar::kSolverLaterSegment:
                               return "LazySolverFromItsCheckpoint";
                             default:
                               return "LyingVerifier";
                           }
                         });

// No exact-mode dispute is left to the genesis referee for lack of a data root: the node-made
// params of the same task with their data root taken out (MakeTaskParams always sets it; a
// hand-made SubmitTask need not) are refused at submission, and the submitter's sender hears
// how to fix them. No task exists, so no dispute over one can reach the referee.
TEST_F(RefereeExactFixture, AnExactModeTaskWithoutADataRootIsRefusedAtSubmission) {
  TaskBundle bundle = MakeBundle(&env_, "/task/task.toml", store_.get()).value();
  net::BlobId init = store_->Put(EncodeGlobalState(local_->initial)).value();
  ledger::TaskParams params = MakeTaskParams(local_->facts, local_->net, init.hash);
  ASSERT_FALSE(params.data_root.IsZero());
  params.data_root = Hash256{};
  TxSender& submitter = *senders_.at(submitter_.public_key());
  task_id_ = ledger::TaskIdFor(submitter_.public_key(), submitter.next_nonce());
  Send(submitter_, ledger::SubmitTaskTx{.spec_hash = bundle.id.hash,
                                        .budget = local_->net.budget,
                                        .price_cap = local_->net.price_cap,
                                        .memo = "referee test",
                                        .params = params});
  clock_.AdvanceMillis(genesis_.block_interval_ms);
  ASSERT_TRUE(sequencer_->ProduceOnce().ok());
  ASSERT_TRUE(submitter.Poll().ok());
  const std::vector<TxOutcome> outcomes = submitter.TakeOutcomes();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].type, "SubmitTask");
  EXPECT_TRUE(outcomes[0].included);
  EXPECT_FALSE(outcomes[0].ok);
  EXPECT_NE(outcomes[0].reason.find("params.data_root is zero: an exact-mode task"),
            std::string::npos)
      << outcomes[0].reason;
  EXPECT_NE(outcomes[0].reason.find("`meshlearn task submit` computes it from the bundle's data"),
            std::string::npos)
      << outcomes[0].reason;
  EXPECT_FALSE(shared_->With([&](ledger::Chain& c) { return c.GetTask(task_id_).ok(); }));
}

// The agreed state is the lazy solver's false checkpoint, and nobody can show it: no witness can
// be built, the service gives up after state_fetch_passes passes and the dispute ends undecided
// at the referee deadline (nobody slashed, the unit neither clean nor fraud).
TEST_F(RefereeExactFixture, AWitnessNobodyCanBuildLeavesTheDisputeUndecided) {
  ASSERT_NO_FATAL_FAILURE(Start());
  PlayedDispute played;
  ASSERT_NO_FATAL_FAILURE(PlayToReferee(Liar::kSolverLaterSegment, &played));
  std::vector<std::string> log;
  int fetches = 0;
  RefereeOptions ro{
      .env = &env_, .work_dir = "/referee", .log = [&](const std::string& l) { log.push_back(l); }};
  ro.state_fetch_passes = 2;
  ro.fetch_checkpoint = [&](const RefereeDispute&, int64_t) -> Result<Bytes> {
    ++fetches;
    return Unavailable("connection refused");
  };
  RefereeService referee(
      client_.get(), senders_.at(anyone_.public_key()).get(),
      [&](const Hash256& id) { return GetBlob(id); }, ro);
  for (int pass = 0; pass < 4; ++pass) {
    Result<std::vector<RefereeRecord>> sent = referee.Poll();
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_TRUE(sent->empty());
  }
  EXPECT_EQ(fetches, 2);  // then given up
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("giving up"), std::string::npos) << log.back();
  EXPECT_NE(log.back().find("is not the unit's true state"), std::string::npos) << log.back();
  // After referee_blocks (20) the game ends undecided: the unit is re-run (its check leaves).
  for (int i = 0; i < 40 && HasCheck() && Check().stage() != protocol::CheckStage::kCheckSettled;
       ++i) {
    ASSERT_EQ(Check().dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
    Step();
  }
  if (HasCheck()) {
    EXPECT_EQ(Check().result(), protocol::CheckResult::kCheckAbandoned) << Check().reason();
    EXPECT_NE(Check().reason().find("undecided"), std::string::npos) << Check().reason();
  }
  EXPECT_TRUE(referee.rulings().empty());
  EXPECT_EQ(Node(solver_).reputation.slashes, 0u);
  EXPECT_EQ(Node(verifier_).reputation.slashes, 0u);
}

// The two whole steps the tile phase ends at that follow from roots, played on a real chain with
// the task bundle: a solver that trained honestly but committed a wrong state after step k (a
// state hash that does not follow from the operator outputs it shows: both post the same chain,
// the chain ends agree), or one that shows a wrong root of an input-state operator of step k. The
// service posts a RefereeTile with the step's operator output roots (not a step witness, whatever
// the model's size; no key); the ledger rules from roots for the verifier.
class RefereeRootsTest : public RefereeExactFixture, public ::testing::WithParamInterface<bool> {};

TEST_P(RefereeRootsTest, AWholeStepThatFollowsFromRootsIsRuledByARefereeTileOfRoots) {
  const bool input_state_lie = GetParam();
  constexpr size_t kLiedOperator = 3;  // an "in.<name>" operator (1-based)
  ASSERT_NO_FATAL_FAILURE(Start());
  engine::Trainer* tr = local_->trainer.get();
  std::span<const float> global = local_->initial.weights;
  const UnitWork work = local_->Work(assignment_->round, assignment_->shard);
  const std::vector<Hash256> honest = EveryStep(tr, global, work, Adversary::kNone);
  const Hash256 wrong = Hasher("a state that is not the step's").Finish();
  const std::vector<Hash256> leaves = {honest[0], wrong, honest[kH]};
  const std::string bundle(AsStringView(GetBlob(bundle_id_).value()));
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, Blake2b("delta"), 0, honest[kK], bundle));
  ASSERT_TRUE(Check().has_tile_phase());
  auto posts = [&](bool solver, uint64_t s) { return solver && s == kK ? wrong : honest[s]; };
  ledger::TaskRecord record =
      shared_->With([&](ledger::Chain& c) { return c.GetTask(task_id_).value(); });
  ledger::WorkUnit unit =
      shared_->With([&](ledger::Chain& c) { return c.GetWorkUnit(task_id_, index_).value(); });
  Result<ledger::TileRuleContext> ctx = ledger::TileContextOf(record, unit, bundle, "test");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  ASSERT_EQ(ctx->plan.ops[kLiedOperator - 1].kind, engine::TileOpKind::kTileOpState);
  std::optional<TracedStep> traced;
  for (int turn = 0; turn < 20; ++turn) {
    const protocol::DisputeGame g = *Check().dispute();
    if (g.stage() == protocol::DisputeStage::kDisputeReferee) break;
    ASSERT_TRUE(g.stage() == protocol::DisputeStage::kDisputeSteps ||
                g.stage() == protocol::DisputeStage::kDisputeOperators)
        << protocol::DisputeStageName(g.stage());
    const protocol::DisputeQuery q = g.query();
    for (bool solver : {true, false}) {
      Hash256 h;
      if (q.stage == protocol::DisputeStage::kDisputeSteps) {
        h = posts(solver, q.position);
      } else {
        // Both answer the operator phase from the same (honest) trace of the step; the input-state
        // liar with one "in.<name>" root changed.
        if (!traced) {
          Result<TracedStep> t = TraceDisputedStep(tr, global, work, static_cast<int64_t>(q.step),
                                                   honest[q.step - 1]);
          ASSERT_TRUE(t.ok()) << t.status().ToString();
          traced = std::move(*t);
        }
        Result<ledger::DisputeMoveAnswer> a =
            ledger::AnswerTileQuery(*ctx, q, honest[q.step - 1], *traced->trace, traced->batch);
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        h = a->hash;
        if (solver && input_state_lie && q.position >= kLiedOperator) {
          h = honest[q.step - 1];
          for (size_t j = 0; j < q.position; ++j) {
            Hash256 out = traced->trace->hash(j);
            if (j + 1 == kLiedOperator) out.bytes[0] ^= 1;
            h = protocol::OperatorChainHash(h, out);
          }
        }
      }
      const KeyPair& key = solver ? solver_ : verifier_;
      Send(key, ledger::DisputePostTx{.task_id = task_id_,
                                      .index = index_,
                                      .node_id = key.public_key(),
                                      .position = q.position,
                                      .hash = h});
    }
    Step();
  }
  const protocol::RefereeTask task = Check().dispute()->referee_task();
  ASSERT_EQ(Check().dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  EXPECT_EQ(task.step, static_cast<uint64_t>(kK));
  EXPECT_EQ(task.roots, input_state_lie ? protocol::RefereeRoots::kRootsOperator
                                        : protocol::RefereeRoots::kRootsChainEnd);
  if (input_state_lie) {
    EXPECT_EQ(task.operator_index, kLiedOperator);
  }
  // The service: any funded key (no genesis key is involved).
  std::vector<std::string> log;
  RefereeService referee(client_.get(), senders_.at(anyone_.public_key()).get(),
                         [&](const Hash256& id) { return GetBlob(id); },
                         {.env = &env_,
                          .work_dir = "/referee",
                          .log = [&](const std::string& l) { log.push_back(l); }});
  Result<std::vector<RefereeRecord>> sent = referee.Poll();
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  ASSERT_EQ(sent->size(), 1u) << ::testing::PrintToString(log);
  const RefereeRecord& rec = (*sent)[0];
  EXPECT_EQ(rec.tx_type, "RefereeTile") << rec.ruling.reason;
  EXPECT_EQ(rec.dispute.task.roots, task.roots);
  EXPECT_EQ(rec.dispute.task.chain_end, task.chain_end);
  EXPECT_EQ(rec.dispute.task.operator_input, task.operator_input);
  EXPECT_EQ(rec.dispute.task.defender_operator_output, task.defender_operator_output);
  EXPECT_EQ(rec.dispute.task.challenger_operator_output, task.challenger_operator_output);
  // The ruling in the task's own terms: the verifier's claim of the state after the step.
  EXPECT_EQ(rec.ruling.output, honest[kK]) << rec.ruling.reason;
  EXPECT_EQ(rec.ruling.output, task.challenger_output) << rec.ruling.reason;
  EXPECT_TRUE(rec.ruling.ledger_executes);
  EXPECT_GT(rec.ruling.witness_bytes, 0u);
  EXPECT_LE(rec.ruling.witness_bytes, ledger::kMaxTileWitnessBytes);
  EXPECT_NE(rec.ruling.reason.find("from roots"), std::string::npos) << rec.ruling.reason;
  EXPECT_NE(rec.ruling.reason.find("the challenger's output"), std::string::npos)
      << rec.ruling.reason;
  std::printf("[ roots    ] %s\n", rec.ruling.reason.c_str());
  Step();
  EXPECT_TRUE(referee.Poll()->empty());  // the ruling landed: nothing more to send
  ASSERT_EQ(referee.rulings().size(), 1u);
  EXPECT_TRUE(referee.rulings()[0].ok) << referee.rulings()[0].error;
  ASSERT_NO_FATAL_FAILURE(ExpectHonestSideWon(/*solver_lies=*/true));
}

INSTANTIATE_TEST_SUITE_P(EachCase, RefereeRootsTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "InputStateOperator" : "ChainEndAgreed";
});

// A submitter whose declared data_root is not the root of the data in its bundle: the referee
// service refuses the task (logs it once, naming the task and both roots) and never rules.
TEST_F(RefereeExactFixture, RefusesATaskWhoseDataRootIsNotItsData) {
  const Hash256 wrong = Blake2b("not the data root");
  ASSERT_NO_FATAL_FAILURE(Start({}, [&](ledger::TaskParams& p) { p.data_root = wrong; }));
  PlayedDispute played;
  ASSERT_NO_FATAL_FAILURE(PlayToReferee(Liar::kSolverSegment0, &played));
  std::vector<std::string> log;
  RefereeService referee(client_.get(), senders_.at(anyone_.public_key()).get(),
                         [&](const Hash256& id) { return GetBlob(id); },
                         {.env = &env_, .work_dir = "/referee", .log = [&](const std::string& l) {
                            log.push_back(l);
                          }});
  for (int pass = 0; pass < 3; ++pass) {
    Result<std::vector<RefereeRecord>> sent = referee.Poll();
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_TRUE(sent->empty());
  }
  EXPECT_TRUE(referee.rulings().empty());
  std::vector<std::string> refusals;
  for (const std::string& l : log) {
    if (l.find("refusing task") != std::string::npos) refusals.push_back(l);
  }
  ASSERT_EQ(refusals.size(), 1u) << ::testing::PrintToString(log);
  EXPECT_NE(refusals[0].find(task_id_.ToHex()), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find("the submitter's data_root does not match the data in the bundle"),
            std::string::npos)
      << refusals[0];
  EXPECT_NE(refusals[0].find(wrong.ToHex()), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[0].find(local_->facts.data_root.ToHex()), std::string::npos) << refusals[0];
}

// ---- A tolerance-mode dispute on a ledger: straight to the referee over the whole segment.

enum class ToleranceCase {
  kHonestSegment0,     // the verifier lies; judged on the solver's checkpoint at k
  kLazySegment0,       // the solver lies; its checkpoint at k is outside tolerance
  kHonestLastSegment,  // the verifier lies; judged at H on the solver's committed delta
  kLazyLastSegment,    // the solver lies; its delta is outside tolerance
  kSilentSegment0,     // an honest solver whose unit service never answers: it cannot show
};

class RefereeToleranceChainTest : public RefereeChainFixture,
                                  public ::testing::WithParamInterface<ToleranceCase> {};

TEST_P(RefereeToleranceChainTest, TheRefereeJudgesTheDefendersEndState) {
  const ToleranceCase tc = GetParam();
  const bool lazy = tc == ToleranceCase::kLazySegment0 || tc == ToleranceCase::kLazyLastSegment;
  const bool solver_loses = lazy || tc == ToleranceCase::kSilentSegment0;
  const uint32_t segment =
      tc == ToleranceCase::kHonestLastSegment || tc == ToleranceCase::kLazyLastSegment ? 1 : 0;
  ASSERT_NO_FATAL_FAILURE(Start({.max_rel_l2_ppm = 10, .max_cosine_gap_ppb = 1000}));
  engine::Trainer* tr = local_->trainer.get();
  std::span<const float> global = local_->initial.weights;
  const UnitWork work = local_->Work(assignment_->round, assignment_->shard);
  UnitRunOptions opts;
  opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                           double) -> Status {
    return step == kK ? engine::SaveCheckpoint(&env_, "/solver-ckpt", st) : Status::Ok();
  };
  UnitOutcome out =
      RunAdversaryUnit(lazy ? Adversary::kLazy : Adversary::kNone, tr, global, work, opts, {})
          .value();
  const net::BlobId delta = store_->Put(EncodeDelta(out.delta)).value();
  // The verifier's replay (other hardware, it says) ends elsewhere.
  ASSERT_NO_FATAL_FAILURE(
      CommitAndDispute(out.state_hashes, delta.hash, segment, Blake2b("replayed elsewhere")));
  const protocol::UnitCheck disputed = Check();
  ASSERT_EQ(disputed.dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  const protocol::RefereeTask task = disputed.dispute()->referee_task();
  ASSERT_TRUE(task.segment);
  EXPECT_EQ(task.first_step, segment * kK);
  EXPECT_EQ(task.step, (segment + 1) * kK);

  std::vector<std::string> log;
  auto log_line = [&](const std::string& l) { log.push_back(l); };
  // A referee that cannot fetch checkpoints does not rule (the dispute would end undecided).
  {
    RefereeService blind(client_.get(), senders_.at(seq_.public_key()).get(),
                         [&](const Hash256& id) { return GetBlob(id); },
                         {.env = &env_, .work_dir = "/blind", .log = log_line});
    Result<std::vector<RefereeRecord>> none = blind.Poll();
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_TRUE(none->empty());
    ASSERT_FALSE(log.empty());
    EXPECT_NE(log.back().find("transport"), std::string::npos) << log.back();
  }

  std::vector<int64_t> served;
  RefereeOptions ro{.env = &env_, .work_dir = "/referee", .log = log_line};
  ro.state_fetch_passes = 2;
  ro.fetch_checkpoint = [&](const RefereeDispute& d, int64_t step) -> Result<Bytes> {
    EXPECT_EQ(d.defender, solver_.public_key());
    served.push_back(step);
    if (tc == ToleranceCase::kSilentSegment0) return Unavailable("connection refused");
    if (step != kK) return NotFound("no checkpoint at step " + std::to_string(step));
    ML_ASSIGN_OR_RETURN(std::string bytes, env_.ReadFile("/solver-ckpt"));
    return ToBytes(bytes);
  };
  RefereeService referee(
      client_.get(), senders_.at(seq_.public_key()).get(),
      [&](const Hash256& id) { return GetBlob(id); }, ro);
  Result<std::vector<RefereeRecord>> sent = referee.Poll();
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  if (tc == ToleranceCase::kSilentSegment0) {
    EXPECT_TRUE(sent->empty());  // one failed fetch: tried again next pass
    sent = referee.Poll();
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  }
  ASSERT_EQ(sent->size(), 1u) << ::testing::PrintToString(log);
  const RefereeRuling& ruling = (*sent)[0].ruling;
  EXPECT_EQ(ruling.tolerance_verdict, solver_loses ? 2 : 1) << ruling.reason;
  EXPECT_EQ(ruling.defender_shown, tc != ToleranceCase::kSilentSegment0) << ruling.reason;
  // Checkpoints are fetched below H only; at H the committed delta stands for the state.
  std::vector<int64_t> want;
  if (segment == 0) want.assign(tc == ToleranceCase::kSilentSegment0 ? 2 : 1, kK);
  EXPECT_EQ(served, want);
  Step();
  EXPECT_TRUE(referee.Poll()->empty());
  ASSERT_EQ(referee.rulings().size(), 1u);
  EXPECT_TRUE(referee.rulings()[0].ok) << referee.rulings()[0].error;

  StepUntilSettled();
  const ledger::NodeRecord s = Node(solver_), v = Node(verifier_);
  if (solver_loses) {
    EXPECT_FALSE(HasCheck());
    EXPECT_EQ(s.reputation.slashes, 1u);
    EXPECT_EQ(v.reputation.slashes, 0u);
  } else {
    ASSERT_TRUE(HasCheck());
    EXPECT_EQ(Check().result(), protocol::CheckResult::kCheckClean) << Check().reason();
    EXPECT_EQ(s.reputation.slashes, 0u);
    EXPECT_EQ(v.reputation.slashes, 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(EachCase, RefereeToleranceChainTest,
                         ::testing::Values(ToleranceCase::kHonestSegment0,
                                           ToleranceCase::kLazySegment0,
                                           ToleranceCase::kHonestLastSegment,
                                           ToleranceCase::kLazyLastSegment,
                                           ToleranceCase::kSilentSegment0),
                         [](const auto& info) {
                           switch (info.param) {
                             case ToleranceCase::kHonestSegment0:
                               return "HonestSolverSegment0";
                             case ToleranceCase::kLazySegment0:
                               return "LazySolverSegment0";
                             case ToleranceCase::kHonestLastSegment:
                               return "HonestSolverLastSegment";
                             case ToleranceCase::kLazyLastSegment:
                               return "LazySolverLastSegment";
                             default:
                               return "SilentSolver";
                           }
                         });

}  // namespace
}  // namespace meshlearn::node
