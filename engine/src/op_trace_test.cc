// Per-operator output hashes of a training step (op_trace.h): deterministic, complete, and the
// first difference names the first operator that computed something different.
#include "meshlearn/engine/op_trace.h"

#include <gtest/gtest.h>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/train.h"

namespace meshlearn::engine {
namespace {

constexpr char kMlp[] = R"(
[task]
name = "trace-mlp"
seed = 7
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
steps = 10
batch_size = 8
)";

// Synthetic 4-class data: enough for a few steps, no files.
TaskData SyntheticData() {
  TaskData d;
  Rng rng(3);
  const int64_t n = 64;
  std::vector<float> x(static_cast<size_t>(n * 12));
  for (float& v : x) v = static_cast<float>(rng.UniformDouble()) - 0.5f;
  d.train.x = Tensor({n, 12}, x);
  d.train.y.resize(n);
  for (int64_t i = 0; i < n; ++i) d.train.y[i] = static_cast<int32_t>(rng.Uniform(4));
  d.train.num_classes = 4;
  d.test = d.train;
  return d;
}

std::unique_ptr<Trainer> MakeTrainer() {
  Result<TaskSpec> spec = TaskSpec::Parse(kMlp, "trace-mlp.toml", ".");
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

size_t IndexOf(const OpTrace& t, const std::string& name) {
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.name(i) == name) return i;
  }
  ADD_FAILURE() << "no operator " << name;
  return t.size();
}

TEST(OpTraceTest, RecordsEveryOperatorInAFixedOrder) {
  auto a = MakeTrainer();
  OpTrace t = TraceStep(*a);
  // The input state (6 parameters, 6 + 6 Adam moments), 5 layer outputs, loss, logits grad, 4
  // activation grads (none for the data), 6 parameter grads, 6 updated parameters, and the 6 + 6
  // Adam moments after the update.
  ASSERT_EQ(t.size(), 18u + 5 + 1 + 1 + 4 + 6 + 6 + 12);
  EXPECT_EQ(t.name(0), "in.layers.0.weight");
  EXPECT_EQ(t.name(6), "in.optim.m.layers.0.weight");
  EXPECT_EQ(t.name(17), "in.optim.v.layers.4.bias");
  EXPECT_EQ(t.name(18), "layers.0.out");
  EXPECT_EQ(t.name(23), "loss");
  EXPECT_EQ(t.name(24), "logits.grad");
  // Each output is committed as its tiled root, in its rows x cols grid.
  EXPECT_EQ(t.grid(18), TileGrid::For(8, 16));  // batch 8 x 16 features
  EXPECT_EQ(t.grid(23), TileGrid::For(8, 1));   // per-sample losses: a column, 32 rows a tile
  EXPECT_EQ(t.name(t.size() - 13), "layers.4.bias");
  EXPECT_EQ(t.name(t.size() - 12), "optim.m.layers.0.weight");
  EXPECT_EQ(t.name(t.size() - 1), "optim.v.layers.4.bias");
  // The state the step leaves behind is its last 18 outputs, in the input state's order.
  for (size_t i = 0; i < 18; ++i) EXPECT_EQ("in." + t.name(t.size() - 18 + i), t.name(i));
  auto b = MakeTrainer();
  OpTrace u = TraceStep(*b);
  EXPECT_EQ(FirstDifference(t, u), -1);
  EXPECT_EQ(t.hashes(), u.hashes());
}

// The state hash commits to the tensors' tiled roots (checkpoint.h): the hash before a step
// follows from the trace's first outputs (the input state) and the hash after it from its last
// ones (every parameter and moment after the update), so a tile of either state is provable
// against the agreed state hash.
TEST(OpTraceTest, TheStateHashesBeforeAndAfterAStepFollowFromItsOperatorOutputs) {
  auto a = MakeTrainer();
  TrainState& st = a->state();
  const Hash256 before = StateHash(st);
  const int64_t step = st.step;
  OpTrace t = TraceStep(*a);
  const size_t k = StateTensorRoots(st).size();
  ASSERT_EQ(k, 18u);
  const std::vector<Hash256> in(t.hashes().begin(), t.hashes().begin() + k);
  const std::vector<Hash256> out(t.hashes().end() - k, t.hashes().end());
  EXPECT_EQ(StateHashOfRoots(step, st.seed, st.stream, in), before);
  EXPECT_EQ(StateHashOfRoots(step + 1, st.seed, st.stream, out), StateHash(st));
  EXPECT_EQ(StateTensorRoots(st), out);
  // Every committed input matters: the step, the seed, the stream and each tensor's root.
  std::vector<Hash256> other = out;
  other[17].bytes[0] ^= 1;
  EXPECT_NE(StateHashOfRoots(step + 1, st.seed, st.stream, other), StateHash(st));
  EXPECT_NE(StateHashOfRoots(step, st.seed, st.stream, out), StateHash(st));
  EXPECT_NE(StateHashOfRoots(step + 1, st.seed + 1, st.stream, out), StateHash(st));
  EXPECT_NE(StateHashOfRoots(step + 1, st.seed, st.stream + 1, out), StateHash(st));
  // One changed moment element changes the hash (the moments are committed, not only weights);
  // the weights-only hash does not see it.
  // A file's stored hash is accepted in the tiled form or in the flat form older checkpoints hold.
  EXPECT_TRUE(StateHashMatches(st, StateHash(st).ToHex()));
  EXPECT_TRUE(StateHashMatches(st, FlatStateHash(st).ToHex()));
  EXPECT_NE(StateHash(st), FlatStateHash(st));
  EXPECT_FALSE(StateHashMatches(st, ModelStateHash(st).ToHex()));
  const Hash256 model_hash = ModelStateHash(st);
  const Hash256 full = StateHash(st);
  st.optimizer->State()[7].tensor->data()[3] += 1e-6f;
  EXPECT_NE(StateHash(st), full);
  EXPECT_EQ(ModelStateHash(st), model_hash);
}

TEST(OpTraceTest, TracingDoesNotChangeTheComputation) {
  auto a = MakeTrainer();
  auto b = MakeTrainer();
  for (int s = 0; s < 3; ++s) {
    TraceStep(*a);
    b->Step();
  }
  EXPECT_EQ(StateHash(a->state()), StateHash(b->state()));
}

TEST(OpTraceTest, FirstDifferenceIsTheFirstOperatorThatReadsAChangedWeight) {
  auto honest = MakeTrainer();
  auto cheat = MakeTrainer();
  // A changed weight of the third linear layer (layers.4): the step's input state records it
  // first; of the computed outputs, everything before its forward output is identical, its
  // output is the first difference.
  cheat->state().model->params()[4].value.data()[3] += 1e-3f;
  OpTrace t = TraceStep(*honest);
  OpTrace u = TraceStep(*cheat);
  EXPECT_EQ(FirstDifference(t, u), static_cast<int64_t>(IndexOf(t, "in.layers.4.weight")));
  const size_t first_computed = IndexOf(t, "layers.0.out");
  size_t first = t.size();
  for (size_t i = first_computed; i < t.size(); ++i) {
    if (t.hash(i) != u.hash(i)) {
      first = i;
      break;
    }
  }
  EXPECT_EQ(first, IndexOf(t, "layers.4.out"));
}

TEST(OpTraceTest, AWrongUpdateShowsOnlyInTheLastOperators) {
  // Same forward and backward, a different optimizer (a lazy or noisy solver's update): the
  // first difference is the first updated parameter.
  auto honest = MakeTrainer();
  std::string other = kMlp;
  other.replace(other.find("lr = 1e-2"), 9, "lr = 2e-2");
  Result<TaskSpec> spec2 = TaskSpec::Parse(other, "trace-mlp.toml", ".");
  ASSERT_TRUE(spec2.ok());
  auto cheat = std::move(*Trainer::Create(*spec2, SyntheticData()));
  OpTrace t = TraceStep(*honest);
  OpTrace u = TraceStep(*cheat);
  EXPECT_EQ(FirstDifference(t, u), static_cast<int64_t>(IndexOf(t, "layers.0.weight")));
}

TEST(OpTraceTest, FirstDifferenceOfPrefixes) {
  OpTrace a, b;
  std::vector<float> v = {1, 2, 3};
  a.Record("x", v);
  b.Record("x", v);
  EXPECT_EQ(FirstDifference(a, b), -1);
  b.Record("y", v);
  EXPECT_EQ(FirstDifference(a, b), 1);
  a.Record("y", std::vector<float>{1, 2, 4});
  EXPECT_EQ(FirstDifference(a, b), 1);
  OpTrace c;
  c.Record("x", std::vector<float>{1, 2, 5});
  EXPECT_EQ(FirstDifference(a, c), 0);
  // The commitment is the tiled root of the values; the operator's name is fixed by its position
  // in the model's order, not hashed.
  OpTrace d;
  d.Record("z", v);
  EXPECT_EQ(d.hash(0), TensorRoot(v, TileGrid::For(1, 3)));
}

}  // namespace
}  // namespace meshlearn::engine
