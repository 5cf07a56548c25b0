// The step witness (node/step_witness.h): built from the unit's start or from the defender's
// checkpoint, it reproduces the trainer's step when executed as the ledger does, and every input
// it carries is checked (state, batch positions, data proofs); the data root a task declares.
#include "meshlearn/node/step_witness.h"

#include <cstdio>
#include <optional>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/task_model.h"
#include "testing/fashion_mlp.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node {
namespace {

constexpr int64_t kWitnessH = 8;
constexpr int64_t kWitnessK = 4;

class StepWitnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::string> toml = testing::WriteSyntheticTask(
        &env_, "/task", 7, 200, 40, 6, 3, /*rounds=*/1, /*units=*/1, kWitnessH, kWitnessK, "mean", /*hidden=*/8);
    ASSERT_TRUE(toml.ok()) << toml.status().ToString();
    ASSERT_TRUE(env_.WriteFileAtomic("/task/task.toml", *toml).ok());
    bundle_ = *toml;  // any text: the ledger checks it against spec_hash, the builder copies it
    spec_ = engine::TaskSpec::Load(&env_, "/task/task.toml").value();
    net_ = NetworkSpec::Load(&env_, "/task/task.toml").value();
    trainer_ = engine::Trainer::Create(&env_, spec_).value();
    facts_ = ComputeTaskFacts(*trainer_, net_);
    global_ = InitialState(*trainer_).weights;
    work_ = protocol::UnitWorkOf(net_, facts_, 0, 0);
    tree_ = std::make_unique<engine::DataTree>(trainer_->data().train);
  }

  // Every state hash 0..H of a run (honest or lazy).
  std::vector<Hash256> EveryStep(Adversary adv) {
    UnitWork w = work_;
    w.checkpoint_interval = 1;
    return RunAdversaryUnit(adv, trainer_.get(), global_, w, {}, {}).value().state_hashes;
  }

  // The state after step k of a run (honest or lazy), as its unit service would serve it.
  engine::TrainState CheckpointAtK(Adversary adv) {
    std::optional<engine::TrainState> ckpt;
    UnitRunOptions opts;
    opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                             double) -> Status {
      if (step != kWitnessK) return Status::Ok();
      ML_RETURN_IF_ERROR(engine::SaveCheckpoint(&env_, "/ckpt", st));
      ML_ASSIGN_OR_RETURN(ckpt, engine::LoadCheckpoint(&env_, "/ckpt"));
      return Status::Ok();
    };
    EXPECT_TRUE(RunAdversaryUnit(adv, trainer_.get(), global_, work_, opts, {}).ok());
    EXPECT_TRUE(ckpt.has_value());
    return std::move(*ckpt);
  }

  Result<BuiltStepWitness> Build(const protocol::RefereeTask& t, const DisputeStart& start = {}) {
    return BuildStepWitness(trainer_.get(), global_, work_, t, bundle_, *tree_, start);
  }
  Result<Hash256> Execute(int64_t step, const ledger::StepWitness& w, const Hash256& agreed) {
    return ExecuteStepWitness(*trainer_, work_, step, w, agreed, tree_->root());
  }

  MemEnv env_;
  std::string bundle_;
  engine::TaskSpec spec_;
  NetworkSpec net_;
  std::unique_ptr<engine::Trainer> trainer_;
  TaskFacts facts_;
  std::vector<float> global_;
  UnitWork work_;
  std::unique_ptr<engine::DataTree> tree_;
};

TEST_F(StepWitnessTest, FromTheUnitsStartItReproducesEveryStep) {
  const std::vector<Hash256> honest = EveryStep(Adversary::kNone);
  const std::vector<Hash256> lazy = EveryStep(Adversary::kLazy);
  for (int64_t s : {int64_t{1}, int64_t{3}, kWitnessK + 1, kWitnessH}) {
    SCOPED_TRACE("step " + std::to_string(s));
    const protocol::RefereeTask t{.step = static_cast<uint64_t>(s),
                                  .input = honest[s - 1],
                                  .defender_output = lazy[s],
                                  .challenger_output = honest[s]};
    Result<BuiltStepWitness> w = Build(t);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_FALSE(w->from_checkpoint);
    EXPECT_EQ(w->true_input, honest[s - 1]);
    EXPECT_EQ(w->output, honest[s]) << w->reason;
    EXPECT_EQ(w->true_output, honest[s]);
    EXPECT_EQ(w->witness.bundle, bundle_);
    // The batch of the step, each example proven against the data root at its index.
    const std::vector<int64_t> indices =
        engine::BatchIndices(spec_.seed, work_.stream, tree_->size(), spec_.batch_size, s - 1);
    ASSERT_EQ(w->witness.examples.size(), indices.size());
    for (size_t j = 0; j < indices.size(); ++j) {
      const ledger::StepWitnessExample& e = w->witness.examples[j];
      EXPECT_EQ(e.index, static_cast<uint64_t>(indices[j]));
      EXPECT_EQ(e.y, trainer_->data().train.y[indices[j]]);
      EXPECT_TRUE(MerkleVerify(tree_->root(), engine::ExampleLeaf(e.index, e.x, e.y), e.proof));
    }
    // Executed as the ledger does, from the agreed hash alone.
    Result<Hash256> out = Execute(s, w->witness, honest[s - 1]);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, honest[s]);
    // The wire form round-trips.
    Result<ledger::StepWitness> decoded =
        ledger::DecodeStepWitness(ledger::EncodeStepWitness(w->witness));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, w->witness);
  }
  // The reason says whose output the step gives.
  Result<BuiltStepWitness> w = Build(
      {.step = 2, .input = honest[1], .defender_output = lazy[2], .challenger_output = honest[2]});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_NE(w->reason.find("the challenger's output"), std::string::npos) << w->reason;
}

TEST_F(StepWitnessTest, EveryInputIsChecked) {
  const std::vector<Hash256> honest = EveryStep(Adversary::kNone);
  const int64_t s = 3;
  Result<BuiltStepWitness> built = Build({.step = s,
                                          .input = honest[s - 1],
                                          .defender_output = Blake2b("d"),
                                          .challenger_output = honest[s]});
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  const ledger::StepWitness& good = built->witness;
  auto refused = [&](const ledger::StepWitness& w, const std::string& why) {
    Result<Hash256> out = Execute(s, w, honest[s - 1]);
    EXPECT_FALSE(out.ok()) << why;
    if (!out.ok()) {
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << why;
      EXPECT_NE(out.status().message().find(why), std::string::npos) << out.status().message();
    }
  };
  ledger::StepWitness w = good;
  w.state[0] += 1e-3f;  // not the agreed state
  refused(w, "the agreed state after step 2");
  w = good;
  w.state.pop_back();  // not a state of this model
  refused(w, "");
  w = good;
  w.examples[1].x[0] += 1.0f;  // an example that is not the dataset's
  refused(w, "is not proven against the task's data_root");
  w = good;
  std::swap(w.examples[0], w.examples[1]);  // the batch out of order
  refused(w, "the batch draws index");
  w = good;
  w.examples.pop_back();
  refused(w, "examples, a batch of this task has");
  // Another data root, another agreed hash.
  EXPECT_FALSE(ExecuteStepWitness(*trainer_, work_, s, good, honest[s - 1], Blake2b("root")).ok());
  EXPECT_FALSE(Execute(s, good, honest[s]).ok());
  EXPECT_TRUE(Execute(s, good, honest[s - 1]).ok());
}

TEST_F(StepWitnessTest, AFalseAgreedStateComesFromTheDefendersCheckpoint) {
  // The lazy solver's checkpoint at k (its committed leaf), and the true transitions from it:
  // what a verifier replaying segment 1 from that checkpoint posts.
  const std::vector<Hash256> honest = EveryStep(Adversary::kNone);
  const std::vector<Hash256> lazy = EveryStep(Adversary::kLazy);
  engine::TrainState lazy_ckpt = CheckpointAtK(Adversary::kLazy);
  ASSERT_EQ(engine::StateHash(lazy_ckpt), lazy[kWitnessK]);
  ASSERT_NE(lazy[kWitnessK], honest[kWitnessK]);
  const int64_t s = kWitnessK + 2;
  const int64_t at[] = {s - 1, s};
  const std::vector<Hash256> from_ckpt =
      ReplayToSteps(trainer_.get(), global_, work_, kWitnessK, &lazy_ckpt, at).value();
  const protocol::RefereeTask t{.step = static_cast<uint64_t>(s),
                                .input = from_ckpt[0],
                                .defender_output = lazy[s],
                                .challenger_output = from_ckpt[1]};
  int loads = 0;
  auto loader = [&](int64_t step) -> Result<engine::TrainState> {
    ++loads;
    EXPECT_EQ(step, kWitnessK);
    return engine::LoadCheckpoint(&env_, "/lazy-ckpt");
  };
  ASSERT_TRUE(engine::SaveCheckpoint(&env_, "/lazy-ckpt", lazy_ckpt).ok());
  const DisputeStart start{.first_step = kWitnessK, .agreed = lazy[kWitnessK], .checkpoint = loader};
  Result<BuiltStepWitness> w = Build(t, start);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(loads, 1);
  EXPECT_TRUE(w->from_checkpoint);
  EXPECT_EQ(w->true_input, honest[s - 1]);
  EXPECT_EQ(w->true_output, honest[s]);
  EXPECT_EQ(w->output, t.challenger_output) << w->reason;
  EXPECT_NE(w->reason.find("the defender cheated before the dispute"), std::string::npos)
      << w->reason;
  EXPECT_EQ(*Execute(s, w->witness, t.input), t.challenger_output);

  // No way to fetch the checkpoint, or a dispute that starts at the unit's start: no witness.
  Result<BuiltStepWitness> none = Build(t, {.first_step = kWitnessK, .agreed = lazy[kWitnessK]});
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("is not the unit's true state"), std::string::npos)
      << none.status().message();
  EXPECT_EQ(Build(t, {.first_step = 0, .agreed = honest[0], .checkpoint = loader}).status().code(),
            StatusCode::kFailedPrecondition);
  // A served checkpoint that is not the committed leaf (the honest state for the lazy leaf).
  engine::TrainState honest_ckpt = CheckpointAtK(Adversary::kNone);
  ASSERT_TRUE(engine::SaveCheckpoint(&env_, "/honest-ckpt", honest_ckpt).ok());
  Result<BuiltStepWitness> other =
      Build(t, {.first_step = kWitnessK, .agreed = lazy[kWitnessK], .checkpoint = [&](int64_t) {
                  return engine::LoadCheckpoint(&env_, "/honest-ckpt");
                }});
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("committed leaf"), std::string::npos)
      << other.status().message();
  // A checkpoint that cannot be had.
  Result<BuiltStepWitness> gone =
      Build(t, {.first_step = kWitnessK, .agreed = lazy[kWitnessK], .checkpoint = [](int64_t) {
                  return Result<engine::TrainState>(Unavailable("connection refused"));
                }});
  EXPECT_EQ(gone.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gone.status().message().find("connection refused"), std::string::npos);
  // An agreed state reached neither way (invented).
  protocol::RefereeTask invented = t;
  invented.input = Blake2b("invented");
  Result<BuiltStepWitness> neither = Build(invented, start);
  EXPECT_EQ(neither.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(neither.status().message().find("nor the replay from the defender's checkpoint"),
            std::string::npos)
      << neither.status().message();
}

TEST_F(StepWitnessTest, RefusesWhatIsNotAnExactWholeStep) {
  const std::vector<Hash256> honest = EveryStep(Adversary::kNone);
  EXPECT_EQ(
      Build({.segment = true, .first_step = 0, .step = kWitnessK, .input = honest[0]}).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(Build({.whole_step = false, .step = 2, .operator_index = 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Build({.step = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Build({.step = kWitnessH + 1}).status().code(), StatusCode::kInvalidArgument);
}

// ---- The data root a task declares.

TEST_F(StepWitnessTest, TheTasksDataRootIsItsTrainingDatasTree) {
  EXPECT_FALSE(facts_.data_root.IsZero());
  EXPECT_EQ(facts_.data_root, tree_->root());
  EXPECT_EQ(TaskDataRoot(trainer_->data()), tree_->root());
  EXPECT_EQ(MakeTaskParams(facts_, net_, Blake2b("init")).data_root, facts_.data_root);
  // Token data: the tree over its train stream's pages.
  engine::TaskData tokens;
  tokens.tokens = true;
  tokens.train_tokens.tokens = {1, 2, 3};
  EXPECT_FALSE(TaskDataRoot(tokens).IsZero());
  EXPECT_EQ(TaskDataRoot(tokens), engine::TokenDataRoot(tokens.train_tokens.tokens));
}

TEST_F(StepWitnessTest, ANodeRefusesATaskWhoseDataRootIsNotItsData) {
  // The ledger's record as get_task gives it, from the facts the submitter computed.
  const ledger::TaskParams params = MakeTaskParams(facts_, net_, Blake2b("init"));
  ledger::TaskRecord record;
  record.params = params;
  nlohmann::json task = ledger::TaskToJson(record);
  ASSERT_EQ(task["params"].value("data_root", std::string()), facts_.data_root.ToHex());
  EXPECT_TRUE(CheckBundleMatchesLedger(facts_, net_, task).ok());
  // No root declared (zero, or a record without the field): nothing to check.
  task["params"]["data_root"] = Hash256{}.ToHex();
  EXPECT_TRUE(CheckBundleMatchesLedger(facts_, net_, task).ok());
  task["params"].erase("data_root");
  EXPECT_TRUE(CheckBundleMatchesLedger(facts_, net_, task).ok());
  // A root that is not the data's: refused, with both roots and the cause.
  const Hash256 wrong = Blake2b("another data set");
  task["params"]["data_root"] = wrong.ToHex();
  Status s = CheckBundleMatchesLedger(facts_, net_, task);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the submitter's data_root does not match the data in the bundle"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(wrong.ToHex()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(facts_.data_root.ToHex()), std::string::npos) << s.message();
  // A token task whose corpus is not the task's: this node's pages give another root.
  TaskFacts token_facts = facts_;
  token_facts.data_root = engine::TokenDataRoot(std::vector<int32_t>{1, 2, 3});
  token_facts.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
  task["params"]["data_page_tokens"] = engine::kTokenPageTokens;
  s = CheckBundleMatchesLedger(token_facts, net_, task);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("its corpus is not the task's"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(token_facts.data_root.ToHex()), std::string::npos) << s.message();
  // The right root, but declared over examples (data_page_tokens 0): refused by name.
  task["params"]["data_root"] = token_facts.data_root.ToHex();
  EXPECT_TRUE(CheckBundleMatchesLedger(token_facts, net_, task).ok());
  task["params"]["data_page_tokens"] = 0;
  s = CheckBundleMatchesLedger(token_facts, net_, task);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("data_page_tokens"), std::string::npos) << s.message();
  task["params"]["data_root"] = "not hex";
  EXPECT_FALSE(CheckBundleMatchesLedger(facts_, net_, task).ok());
}

// The witness of a real task, examples/fashion-mlp.toml (784-256-128-10 MLP, AdamW, batch 128),
// when Fashion-MNIST is installed: it must fit in one RefereeStepTx. Its size is printed for
// docs/verification.md ("Referee").
TEST(StepWitnessSizeTest, FashionMlpFitsInATransaction) {
  std::optional<testing::FashionMlp> fm = testing::LoadFashionMlp();
  if (!fm) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::kFashionMnistDir;
  auto& [path, spec, net, trainer] = *fm;
  Env* env = Env::Default();
  const TaskFacts facts = ComputeTaskFacts(*trainer, net);
  const std::vector<float> global = InitialState(*trainer).weights;
  const UnitWork work = protocol::UnitWorkOf(net, facts, 0, 0);
  const engine::DataTree tree(trainer->data().train);
  ASSERT_EQ(tree.root(), facts.data_root);
  const int64_t at[] = {0, 1};
  const std::vector<Hash256> h = ReplayToSteps(trainer.get(), global, work, 0, nullptr, at).value();
  const std::string bundle = env->ReadFile(path).value();  // a bundle's size: the same text
  Result<BuiltStepWitness> w = BuildStepWitness(
      trainer.get(), global, work,
      {.step = 1, .input = h[0], .defender_output = h[1], .challenger_output = Blake2b("x")},
      bundle, tree);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->output, h[1]);
  const Bytes wire = ledger::EncodeStepWitness(w->witness);
  size_t proof_bytes = 0;
  for (const ledger::StepWitnessExample& e : w->witness.examples) {
    proof_bytes += e.proof.siblings.size() * sizeof(Hash256);
  }
  std::printf(
      "fashion-mlp step witness: %zu bytes (state %zu floats = %zu bytes, %zu examples of %zu "
      "floats = %zu bytes, proofs %zu bytes, bundle %zu bytes)\n",
      wire.size(), w->witness.state.size(), 4 * w->witness.state.size(), w->witness.examples.size(),
      w->witness.examples[0].x.size(),
      4 * w->witness.examples.size() * w->witness.examples[0].x.size(), proof_bytes, bundle.size());
  EXPECT_EQ(w->witness.state.size(), 3 * facts.num_params);  // parameters + AdamW's two moments
  EXPECT_LT(wire.size(), ledger::kMaxWitnessBytes);
  // The bound `task submit` uses to decide whether the ledger can referee the task holds.
  const uint64_t bound = StepWitnessBound(trainer->task(), facts.num_params);
  EXPECT_GE(bound, wire.size());
  EXPECT_LE(bound, ledger::kMaxWitnessBytes);
}

// The fraud proof of examples/fashion-mlp.toml (inner_steps 100, checkpoint_interval 10): a
// segment witness holds the start state and ten batches; it fits one ProveFraud. A unit whose
// leaf 2 is not what segment 1 gives is proven in segment 1, from the true state after step 10.
TEST(StepWitnessSizeTest, FashionMlpSegmentWitnessFitsInATransaction) {
  std::optional<testing::FashionMlp> fm = testing::LoadFashionMlp();
  if (!fm) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::kFashionMnistDir;
  auto& [path, spec, net, trainer] = *fm;
  Env* env = Env::Default();
  const TaskFacts facts = ComputeTaskFacts(*trainer, net);
  const GlobalState start = InitialState(*trainer);
  const UnitWork work = protocol::UnitWorkOf(net, facts, 0, 0);
  ASSERT_EQ(work.inner_steps, 100);
  ASSERT_EQ(work.checkpoint_interval, 10);
  const engine::DataTree tree(trainer->data().train);
  const std::vector<int64_t> at = protocol::HashedSteps(work.inner_steps, work.checkpoint_interval);
  std::vector<Hash256> leaves =
      ReplayToSteps(trainer.get(), start.weights, work, 0, nullptr, at).value();
  const Hash256 true_end = leaves[2];
  leaves[2] = Blake2b("a perturbed trajectory");
  const std::string bundle = env->ReadFile(path).value();
  Result<BuiltSegmentWitness> w = BuildSegmentWitness(trainer.get(), EncodeGlobalState(start), work,
                                                      leaves, bundle, nullptr, &tree);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->segment, 1u);
  EXPECT_EQ(w->replayed_end, true_end);
  EXPECT_EQ(w->witness.examples.size(), 10u * static_cast<size_t>(spec.batch_size));
  EXPECT_EQ(w->witness.state.size(), 3 * facts.num_params);
  const Bytes wire = ledger::EncodeSegmentWitness(w->witness);
  std::printf("fashion-mlp segment witness (10 steps): %zu bytes (state %zu bytes, %zu examples)\n",
              wire.size(), 4 * w->witness.state.size(), w->witness.examples.size());
  EXPECT_LT(wire.size(), ledger::kMaxWitnessBytes);
  const uint64_t bound = SegmentWitnessBound(*trainer, facts.num_params, 10);
  EXPECT_GE(bound, wire.size());
  // An honest unit has nothing to prove.
  leaves[2] = true_end;
  EXPECT_EQ(BuildSegmentWitness(trainer.get(), EncodeGlobalState(start), work, leaves, bundle,
                                nullptr, &tree)
                .status()
                .code(),
            StatusCode::kNotFound);
}

// The fraud proof of a token task: examples/tiny-gpt.toml (a GPT on the GPL text) as a network task
// of 20 inner steps in segments of 10. Its segment witness holds the state and, step after step,
// the token pages each batch reads, proven against the data root over the stream's pages; the
// ledger's own replay of it (ledger::RunSegmentSteps, what ProveFraud runs) ends where the node's
// replay does, and it fits one ProveFraud within SegmentWitnessBound.
TEST(StepWitnessSizeTest, TinyGptSegmentWitnessProvesItsBatchesByTheirPages) {
  Env* env = Env::Default();
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/tiny-gpt.toml";
  Result<std::string> text = env->ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string bundle = *text +
                             "\n[network]\nrounds = 2\nunits_per_round = 2\ninner_steps = 20\n"
                             "checkpoint_interval = 10\n";
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle, "tiny-gpt.toml", "/");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(bundle, "tiny-gpt.toml");
  ASSERT_TRUE(cfg.ok());
  const protocol::NetworkSpec net = protocol::NetworkSpec::FromConfig(*cfg).value();
  std::unique_ptr<engine::Trainer> trainer = engine::Trainer::Create(env, *spec).value();
  ASSERT_TRUE(trainer->data().tokens);
  const TaskFacts facts = ComputeTaskFacts(*trainer, net);
  const GlobalState start = InitialState(*trainer);
  const UnitWork work = protocol::UnitWorkOf(net, facts, 0, 1);
  const std::vector<int64_t> at = protocol::HashedSteps(work.inner_steps, work.checkpoint_interval);
  std::vector<Hash256> leaves =
      ReplayToSteps(trainer.get(), start.weights, work, 0, nullptr, at).value();
  ASSERT_EQ(leaves.size(), 3u);
  const Hash256 true_end = leaves[2];
  leaves[2] = Blake2b("a perturbed trajectory");
  std::unique_ptr<engine::TokenPageTree> pages;
  std::unique_ptr<engine::DataTree> tree;
  EXPECT_EQ(EnsureDataProofs(trainer->data(), &pages, &tree), nullptr);
  ASSERT_NE(pages, nullptr);
  EXPECT_EQ(pages->root(), TaskDataRoot(trainer->data()));
  // Without the pages' tree there is nothing to prove the batches with.
  EXPECT_EQ(BuildSegmentWitness(trainer.get(), EncodeGlobalState(start), work, leaves, bundle,
                                nullptr, nullptr)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  Result<BuiltSegmentWitness> w = BuildSegmentWitness(trainer.get(), EncodeGlobalState(start), work,
                                                      leaves, bundle, pages.get(), nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->segment, 1u);
  EXPECT_EQ(w->replayed_end, true_end);
  EXPECT_TRUE(w->witness.examples.empty());
  size_t want = 0;
  for (int64_t s = 10; s < 20; ++s) {
    want += ledger::StepBatchPages(trainer->task(), work.stream, s, pages->num_tokens()).size();
  }
  EXPECT_EQ(w->witness.pages.size(), want);
  // The ledger's replay of the witness, from the committed state after step 10.
  engine::TrainState st =
      engine::StateFromFlat(trainer->task().model,
                            engine::UnitOptimizerSpec(trainer->task().optimizer, work.lr_scale),
                            w->witness.state, 10, trainer->task().seed, work.stream)
          .value();
  EXPECT_EQ(engine::StateHash(st), leaves[1]);
  Result<Hash256> end = ledger::RunSegmentSteps(
      trainer->task(), work.stream, static_cast<uint64_t>(pages->num_tokens()), pages->root(), st,
      10, w->witness.examples, w->witness.pages, "segment");
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(*end, true_end);
  const Bytes wire = ledger::EncodeSegmentWitness(w->witness);
  std::printf("tiny-gpt segment witness (10 steps): %zu bytes (state %zu bytes, %zu pages)\n",
              wire.size(), 4 * w->witness.state.size(), w->witness.pages.size());
  EXPECT_LT(wire.size(), ledger::kMaxWitnessBytes);
  EXPECT_GE(SegmentWitnessBound(*trainer, facts.num_params, 10), wire.size());
  // An honest unit has nothing to prove.
  leaves[2] = true_end;
  EXPECT_EQ(BuildSegmentWitness(trainer.get(), EncodeGlobalState(start), work, leaves, bundle,
                                pages.get(), nullptr)
                .status()
                .code(),
            StatusCode::kNotFound);
}

// The merits of a whistleblower's dispute (ProveMerits): the witness of the disputed segment, not
// the first that differs. A solver whose state after step 10 is not the true one (leaf 1 moved)
// and whose segment 1 does not follow from it either: BuildSegmentWitness proves segment 0;
// BuildSegmentWitnessOf proves segment 1 from the solver's own state at its start (what the
// whistleblower replayed it from), and the ledger's replay of it starts from the committed leaf 1
// and ends elsewhere than leaf 2. Without that state, or for a segment that follows from it,
// there is nothing to show.
TEST(StepWitnessSizeTest, TheMeritsWitnessOfTheDisputedSegmentStartsFromTheSolversState) {
  Env* env = Env::Default();
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/tiny-gpt.toml";
  Result<std::string> text = env->ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string bundle = *text +
                             "\n[network]\nrounds = 2\nunits_per_round = 2\ninner_steps = 20\n"
                             "checkpoint_interval = 10\n";
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle, "tiny-gpt.toml", "/");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(bundle, "tiny-gpt.toml");
  ASSERT_TRUE(cfg.ok());
  const protocol::NetworkSpec net = protocol::NetworkSpec::FromConfig(*cfg).value();
  std::unique_ptr<engine::Trainer> trainer = engine::Trainer::Create(env, *spec).value();
  const TaskFacts facts = ComputeTaskFacts(*trainer, net);
  const GlobalState start = InitialState(*trainer);
  const Bytes start_blob = EncodeGlobalState(start);
  const UnitWork work = protocol::UnitWorkOf(net, facts, 0, 1);
  std::unique_ptr<engine::TokenPageTree> pages;
  std::unique_ptr<engine::DataTree> tree;
  EnsureDataProofs(trainer->data(), &pages, &tree);
  ASSERT_NE(pages, nullptr);
  // The solver's state after step 10: the true one, one weight moved.
  const int64_t ten[] = {10};
  ASSERT_TRUE(ReplayToSteps(trainer.get(), start.weights, work, 0, nullptr, ten).ok());
  std::vector<float> flat = engine::FlatState(trainer->state());
  flat[0] += 0.25f;
  auto solver_state = [&] {
    return engine::StateFromFlat(
               trainer->task().model,
               engine::UnitOptimizerSpec(trainer->task().optimizer, work.lr_scale), flat, 10,
               trainer->task().seed, work.stream)
        .value();
  };
  engine::TrainState moved = solver_state();
  const std::vector<Hash256> true_leaves =
      ReplayToSteps(trainer.get(), start.weights, work, 0, nullptr,
                    protocol::HashedSteps(work.inner_steps, work.checkpoint_interval))
          .value();
  const std::vector<Hash256> leaves = {true_leaves[0], engine::StateHash(moved),
                                       Blake2b("a made-up end")};
  ASSERT_NE(leaves[1], true_leaves[1]);
  Result<BuiltSegmentWitness> first =
      BuildSegmentWitness(trainer.get(), start_blob, work, leaves, bundle, pages.get(), nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->segment, 0u);
  Result<BuiltSegmentWitness> w = BuildSegmentWitnessOf(trainer.get(), start_blob, work, leaves, 1,
                                                        &moved, bundle, pages.get(), nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->segment, 1u);
  EXPECT_EQ(w->committed_end, leaves[2]);
  EXPECT_EQ(w->witness.state, flat);
  // The ledger's replay of it (what ProveMerits runs), from the committed leaf 1.
  engine::TrainState st = solver_state();
  EXPECT_EQ(engine::StateHash(st), leaves[1]);
  Result<Hash256> end = ledger::RunSegmentSteps(
      trainer->task(), work.stream, static_cast<uint64_t>(pages->num_tokens()), pages->root(), st,
      10, w->witness.examples, w->witness.pages, "segment");
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(*end, w->replayed_end);
  EXPECT_NE(*end, leaves[2]);
  // Replayed from the unit's start, the segment does not start at the committed leaf 1.
  EXPECT_EQ(BuildSegmentWitnessOf(trainer.get(), start_blob, work, leaves, 1, nullptr, bundle,
                                  pages.get(), nullptr)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  // A segment that follows from its start has no merits to show.
  std::vector<Hash256> followed = leaves;
  followed[2] = *end;
  engine::TrainState again = solver_state();
  EXPECT_EQ(BuildSegmentWitnessOf(trainer.get(), start_blob, work, followed, 1, &again, bundle,
                                  pages.get(), nullptr)
                .status()
                .code(),
            StatusCode::kNotFound);
}

// A model whose step witness could not be posted is still submitted with its data root: a
// verifying chain refuses an exact-mode task without one (no genesis key rules its disputes).
TEST(StepWitnessSizeTest, AModelTooLargeToWitnessStillDeclaresItsDataRoot) {
  for (const int64_t hidden : {int64_t{8}, int64_t{12000}}) {
    MemEnv env;
    Result<std::string> toml = testing::WriteSyntheticTask(&env, "/task", 7, 200, 40, 64, 3, 1, 1,
                                                           kWitnessH, kWitnessK, "mean", hidden);
    ASSERT_TRUE(toml.ok()) << toml.status().ToString();
    ASSERT_TRUE(env.WriteFileAtomic("/task/task.toml", *toml).ok());
    engine::TaskSpec spec = engine::TaskSpec::Load(&env, "/task/task.toml").value();
    NetworkSpec net = NetworkSpec::Load(&env, "/task/task.toml").value();
    std::unique_ptr<engine::Trainer> trainer = engine::Trainer::Create(&env, spec).value();
    const TaskFacts facts = ComputeTaskFacts(*trainer, net);
    const bool fits =
        StepWitnessBound(trainer->task(), facts.num_params) <= ledger::kMaxWitnessBytes;
    EXPECT_EQ(fits, hidden == 8) << facts.num_params << " parameters";
    EXPECT_FALSE(facts.data_root.IsZero()) << facts.num_params << " parameters";
    EXPECT_EQ(facts.data_root, TaskDataRoot(trainer->data()));
  }
}

}  // namespace
}  // namespace meshlearn::node
