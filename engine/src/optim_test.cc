#include "meshlearn/engine/optim.h"

#include <bit>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/kernels.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

std::vector<Param> OneParam(std::vector<float> w, std::vector<float> g, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(w.size())};
  std::vector<Param> ps;
  ps.push_back(Param{"w", Tensor(shape, w), Tensor(shape, g)});
  return ps;
}

TEST(OptimTest, AdamFirstStepMovesByLr) {
  OptimizerSpec s;
  s.kind = "adamw";
  s.lr = 0.1;
  auto ps = OneParam({1.0f, -2.0f}, {0.5f, -3.0f});
  Optimizer opt(s, ps);
  opt.Step(ps, 0);
  // First Adam step: m_hat = g, v_hat = g^2, update = lr * g / (|g| + eps) ~ lr * sign(g).
  EXPECT_NEAR(ps[0].value[0], 0.9f, 1e-6);
  EXPECT_NEAR(ps[0].value[1], -1.9f, 1e-6);
}

TEST(OptimTest, AdamMatchesPyTorchFormulaOverSteps) {
  OptimizerSpec s;
  s.kind = "adamw";
  s.lr = 0.01;
  s.weight_decay = 0.1;
  auto ps = OneParam({1.0f, 2.0f, 3.0f, 4.0f}, {0, 0, 0, 0}, {2, 2});
  Optimizer opt(s, ps);
  double w = 1.0, m = 0, v = 0;
  for (int t = 1; t <= 5; ++t) {
    float g = 0.1f * t;
    ps[0].grad[0] = g;
    opt.Step(ps, t - 1);
    w = w * (1 - 0.01 * 0.1);
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
    w -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
    EXPECT_NEAR(ps[0].value[0], w, 1e-6) << "t=" << t;
  }
}

TEST(OptimTest, SgdNesterov) {
  OptimizerSpec s;
  s.kind = "sgd";
  s.lr = 0.5;
  s.momentum = 0.9;
  s.nesterov = true;
  auto ps = OneParam({1.0f}, {1.0f});
  Optimizer opt(s, ps);
  opt.Step(ps, 0);  // buf = 1, d = 1 + 0.9 = 1.9
  EXPECT_FLOAT_EQ(ps[0].value[0], 1.0f - 0.5f * 1.9f);
  opt.Step(ps, 1);  // buf = 1.9, d = 1 + 1.71 = 2.71
  EXPECT_FLOAT_EQ(ps[0].value[0], 1.0f - 0.5f * 1.9f - 0.5f * 2.71f);
}

TEST(OptimTest, SgdPlainMomentum) {
  OptimizerSpec s;
  s.kind = "sgd";
  s.lr = 1.0;
  s.momentum = 0.5;
  auto ps = OneParam({0.0f}, {1.0f});
  Optimizer opt(s, ps);
  opt.Step(ps, 0);
  opt.Step(ps, 1);
  EXPECT_FLOAT_EQ(ps[0].value[0], -1.0f - 1.5f);
}

TEST(OptimTest, CosineScheduleWithWarmup) {
  OptimizerSpec s;
  s.lr = 1.0;
  s.schedule = "cosine";
  s.warmup_steps = 10;
  s.min_lr = 0.1;
  s.total_steps = 110;
  Optimizer opt(s, {});
  EXPECT_FLOAT_EQ(opt.LearningRate(0), 0.1f);
  EXPECT_FLOAT_EQ(opt.LearningRate(9), 1.0f);
  EXPECT_FLOAT_EQ(opt.LearningRate(10), 1.0f);
  EXPECT_NEAR(opt.LearningRate(60), 0.55f, 1e-6);
  EXPECT_NEAR(opt.LearningRate(110), 0.1f, 1e-6);
  EXPECT_NEAR(opt.LearningRate(500), 0.1f, 1e-6);
}

TEST(OptimTest, GradClipping) {
  OptimizerSpec s;
  s.kind = "sgd";
  s.lr = 1.0;
  s.grad_clip = 1.0;
  auto ps = OneParam({0.0f, 0.0f}, {3.0f, 4.0f});
  Optimizer opt(s, ps);
  float norm = opt.Step(ps, 0);
  EXPECT_FLOAT_EQ(norm, 5.0f);
  EXPECT_NEAR(ps[0].value[0], -0.6f, 1e-6);
  EXPECT_NEAR(ps[0].value[1], -0.8f, 1e-6);
}

// The global norm's sum of squares, computed in one parallel region over every gradient, is the
// chain of each gradient's SumSquaresTree in parameter order, bit for bit on every SIMD path and
// thread count; its block partials are each gradient's AppendSquareBlockPartials laid end to end.
TEST(OptimTest, SumGradSquaresIsTheChainOfEachGradientsTree) {
  std::vector<Param> ps;
  int salt = 0;
  for (int64_t n : {0, 1, 1025, 9000, 8 * 1024, 70001, 3}) {
    std::vector<float> g = testing::RandomVec(n, 60 + salt++);
    ps.push_back(Param{"p" + std::to_string(n), Tensor({n}), Tensor({n}, g)});
  }
  float want = 0.25f;
  std::vector<float> want_partials;
  for (const Param& p : ps) {
    want = want + ref::SumSquaresTree(p.grad.data(), p.grad.size());
    AppendSquareBlockPartials(p.grad.data(), p.grad.size(), &want_partials);
  }
  testing::ConfigGuard guard;
  for (const KernelConfig& c : testing::AllConfigs()) {
    ASSERT_TRUE(SetKernelConfig(c).ok());
    EXPECT_EQ(std::bit_cast<uint32_t>(SumGradSquares(ps, 0.25f)), std::bit_cast<uint32_t>(want))
        << SimdPathName(c.simd) << " x" << c.threads;
    std::string why;
    EXPECT_TRUE(testing::BitEqual(GradSquareBlockPartials(ps), want_partials, &why)) << why;
  }
}

TEST(OptimTest, SpecErrorsNameTheKey) {
  Result<ConfigFile> c = ConfigFile::Parse("kind = \"adamw\"\nlr = -1\n", "task.toml");
  ASSERT_TRUE(c.ok());
  Result<OptimizerSpec> s = OptimizerSpec::FromConfig(*c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("lr"), std::string::npos) << s.status().message();
  c = ConfigFile::Parse("kind = \"sgd\"\nlr = 0.1\nmomentun = 0.9\n", "task.toml");
  s = OptimizerSpec::FromConfig(*c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("momentum"), std::string::npos) << s.status().message();
  c = ConfigFile::Parse("kind = \"sgd\"\nlr = 0.1\nnesterov = true\n", "task.toml");
  s = OptimizerSpec::FromConfig(*c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("needs momentum"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace meshlearn::engine
