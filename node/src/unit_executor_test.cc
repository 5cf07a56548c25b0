#include "meshlearn/node/unit_executor.h"

#include <gtest/gtest.h>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/backend.h"

namespace meshlearn::node {
namespace {

// A small MLP on Fashion-MNIST: real data, a few steps.
constexpr char kTask[] = R"(
[task]
name = "unit-test"
seed = 3
[data]
format = "idx"
train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
[model]
input = [784]
[[model.layers]]
kind = "linear"
out = 32
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 10
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 1
batch_size = 32
)";

class UnitExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<engine::TaskSpec> task = engine::TaskSpec::Parse(kTask, "unit-test.toml", ".");
    ASSERT_TRUE(task.ok()) << task.status().ToString();
    Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(Env::Default(), *task);
    ASSERT_TRUE(tr.ok()) << tr.status().ToString();
    trainer_ = tr->release();
  }
  static void TearDownTestSuite() { delete trainer_; }
  static engine::Trainer* trainer_;
};
engine::Trainer* UnitExecutorTest::trainer_ = nullptr;

TEST(HashedSteps, StartEveryKAndEnd) {
  EXPECT_EQ(HashedSteps(10, 4), (std::vector<int64_t>{0, 4, 8, 10}));
  EXPECT_EQ(HashedSteps(8, 4), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(HashedSteps(5, 0), (std::vector<int64_t>{0, 5}));
}

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
