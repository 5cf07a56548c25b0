#include "meshlearn/node/unit_executor.h"

#include <gtest/gtest.h>

#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "testing/diloco_task.h"

namespace meshlearn::node {
namespace {

// A small MLP on Fashion-MNIST: real data, a few steps.
class UnitExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    trainer_ = SmallFashionTrainer("unit-test", 3, 32, 32);
    ASSERT_NE(trainer_, nullptr);
  }
  static void TearDownTestSuite() { delete trainer_; }
  static engine::Trainer* trainer_;
};
engine::Trainer* UnitExecutorTest::trainer_ = nullptr;

TEST_F(UnitExecutorTest, SameInputsSameBitsDifferentStreamDifferentResult) {
  std::vector<float> global = trainer_->FlatParams();
  UnitExecutor ex(trainer_);
  UnitWork work{.stream = 11, .inner_steps = 6, .checkpoint_interval = 2};
  UnitOutcome a = *ex.Run(global, work);
  UnitOutcome b = *ex.Run(global, work);
  EXPECT_EQ(a.state_hashes, b.state_hashes);
  EXPECT_EQ(a.delta_hash, b.delta_hash);
  EXPECT_EQ(a.commitment, MerkleRoot(a.state_hashes));
  EXPECT_EQ(a.state_hashes.size(), 4u);  // steps 0, 2, 4, 6
  EXPECT_EQ(a.samples, 6u * 32u);

  UnitOutcome c = *ex.Run(global, {.stream = 12, .inner_steps = 6, .checkpoint_interval = 2});
  EXPECT_EQ(c.state_hashes[0].IsZero(), false);
  EXPECT_NE(c.delta_hash, a.delta_hash);
  // The trainer's own weights are not the global weights any more, but the unit's start is.
  EXPECT_NE(c.state_hashes[0], a.state_hashes[0]);  // the stream is part of the state hash
}

TEST_F(UnitExecutorTest, ThreadCountDoesNotChangeTheResult) {
  std::vector<float> global = trainer_->FlatParams();
  UnitExecutor ex(trainer_);
  UnitWork work{.stream = 5, .inner_steps = 4, .checkpoint_interval = 2};
  engine::KernelConfig saved = engine::GetKernelConfig();
  ASSERT_TRUE(engine::SetKernelConfig({.simd = saved.simd, .threads = 1}).ok());
  UnitOutcome one = *ex.Run(global, work);
  ASSERT_TRUE(engine::SetKernelConfig({.simd = saved.simd, .threads = 3}).ok());
  UnitOutcome three = *ex.Run(global, work);
  ASSERT_TRUE(engine::SetKernelConfig(saved).ok());
  EXPECT_EQ(one.commitment, three.commitment);
  EXPECT_EQ(one.delta_hash, three.delta_hash);
}

TEST_F(UnitExecutorTest, RejectsBadWork) {
  std::vector<float> global = trainer_->FlatParams();
  UnitExecutor ex(trainer_);
  EXPECT_FALSE(ex.Run(global, {.stream = 1, .inner_steps = 0}).ok());
  std::vector<float> wrong(global.size() - 1);
  Result<UnitOutcome> r = ex.Run(wrong, {.stream = 1, .inner_steps = 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("parameters"), std::string::npos);
}

}  // namespace
}  // namespace meshlearn::node

namespace meshlearn::node {
namespace {

// Runs a unit with checkpoints saved (into a MemEnv) at every hashed step, as a solver does.
struct SolverRun {
  UnitOutcome outcome;
  MemEnv env;
  std::vector<int64_t> saved_steps;
};

std::unique_ptr<SolverRun> RunAndCheckpoint(engine::Trainer* trainer,
                                            std::span<const float> global, const UnitWork& work) {
  auto run = std::make_unique<SolverRun>();
  UnitExecutor ex(trainer);
  UnitRunOptions opts;
  opts.on_checkpoint = [&](int64_t step, engine::TrainState& st, const std::vector<Hash256>&,
                           double) -> Status {
    run->saved_steps.push_back(step);
    return engine::SaveCheckpoint(&run->env, "ckpt-" + std::to_string(step), st);
  };
  Result<UnitOutcome> out = ex.Run(global, work, opts);
  CHECK(out.ok()) << out.status().ToString();
  run->outcome = std::move(*out);
  return run;
}

class ReplayTest : public UnitExecutorTest {};

TEST_F(ReplayTest, EverySegmentOfHonestWorkReplaysToItsCommittedState) {
  std::vector<float> global = trainer_->FlatParams();
  const UnitWork work{.stream = 77, .inner_steps = 10, .checkpoint_interval = 4, .lr_scale = 1.0};
  auto solver = RunAndCheckpoint(trainer_, global, work);
  const std::vector<Hash256>& leaves = solver->outcome.state_hashes;
  ASSERT_EQ(leaves.size(), 4u);  // after steps 0, 4, 8, 10
  for (uint32_t seg = 0; seg < 3; ++seg) {
    std::unique_ptr<engine::TrainState> start;
    if (seg > 0) {
      auto st = engine::LoadCheckpoint(&solver->env, "ckpt-" + std::to_string(seg * 4));
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      start = std::make_unique<engine::TrainState>(std::move(*st));
    }
    Result<SegmentReplay> r = ReplaySegment(trainer_, global, work, seg, start.get(), &leaves[seg]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->first_step, int64_t{seg} * 4);
    EXPECT_EQ(r->last_step, seg == 2 ? 10 : int64_t{seg + 1} * 4);
    EXPECT_EQ(r->end_hash, leaves[seg + 1]) << "segment " << seg;
  }
}

TEST_F(ReplayTest, WorkWithWrongHyperparametersIsCaughtInEverySegment) {
  // A solver that cuts corners (here: a different inner learning rate, as a lazy or noisy
  // solver would) commits states that an honest replay from its own checkpoints does not reach.
  std::vector<float> global = trainer_->FlatParams();
  const UnitWork honest{.stream = 78, .inner_steps = 8, .checkpoint_interval = 4, .lr_scale = 1.0};
  UnitWork cheat = honest;
  cheat.lr_scale = 0.5;
  auto solver = RunAndCheckpoint(trainer_, global, cheat);
  const std::vector<Hash256>& leaves = solver->outcome.state_hashes;
  for (uint32_t seg = 0; seg < 2; ++seg) {
    std::unique_ptr<engine::TrainState> start;
    if (seg > 0) {
      auto st = engine::LoadCheckpoint(&solver->env, "ckpt-4");
      ASSERT_TRUE(st.ok());
      start = std::make_unique<engine::TrainState>(std::move(*st));
    }
    Result<SegmentReplay> r = ReplaySegment(trainer_, global, honest, seg, start.get(), &leaves[seg]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_NE(r->end_hash, leaves[seg + 1]) << "segment " << seg;
  }
}

TEST_F(ReplayTest, ACheckpointThatIsNotTheCommittedStateIsRefused) {
  std::vector<float> global = trainer_->FlatParams();
  const UnitWork work{.stream = 79, .inner_steps = 8, .checkpoint_interval = 4, .lr_scale = 1.0};
  auto solver = RunAndCheckpoint(trainer_, global, work);
  auto st = engine::LoadCheckpoint(&solver->env, "ckpt-4");
  ASSERT_TRUE(st.ok());
  Hash256 wrong = Blake2b("not the committed state");
  EXPECT_EQ(ReplaySegment(trainer_, global, work, 1, &*st, &wrong).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReplaySegment(trainer_, global, work, 0, &*st, nullptr).ok(), true);  // ignored
  EXPECT_FALSE(ReplaySegment(trainer_, global, work, 1, nullptr).ok());  // needs a checkpoint
  EXPECT_FALSE(ReplaySegment(trainer_, global, work, 2, &*st).ok());     // out of range
  auto st0 = engine::LoadCheckpoint(&solver->env, "ckpt-4");
  ASSERT_TRUE(st0.ok());
  UnitWork other = work;
  other.stream = 80;
  EXPECT_FALSE(ReplaySegment(trainer_, global, other, 1, &*st0).ok());  // another unit's state
}

}  // namespace
}  // namespace meshlearn::node
