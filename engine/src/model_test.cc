#include "meshlearn/engine/model.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/init.h"
#include "meshlearn/engine/safetensors.h"

namespace meshlearn::engine {
namespace {

Result<ModelSpec> SpecFrom(const std::string& toml) {
  return ModelSpec::FromToml(toml, "task.toml");
}

std::unique_ptr<Model> MustCreate(const std::string& toml, uint64_t seed = 1) {
  Result<ModelSpec> s = SpecFrom(toml);
  CHECK(s.ok()) << s.status().ToString();
  Result<std::unique_ptr<Model>> m = Model::Create(*s);
  CHECK(m.ok()) << m.status().ToString();
  (*m)->Init(seed);
  return std::move(*m);
}

const char kCnn[] = R"(
[model]
input = [2, 8, 8]
[[model.layers]]
kind = "conv2d"
out = 3
kernel = 3
pad = 1
[[model.layers]]
kind = "gelu"
[[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "conv2d"
out = 4
kernel = 3
stride = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "linear"
out = 6
init = "xavier"
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 5
init = "normal"
init_std = 0.5
)";

const char kGpt[] = R"(
[model]
kind = "gpt"
n_layer = 2
n_head = 2
n_embd = 8
block_size = 6
vocab_size = 11
)";

void FillBatch(Batch& b, int64_t classes) {
  for (int64_t i = 0; i < b.inputs.size(); ++i) b.inputs[i] = NormalSample(9, 9, i);
  for (size_t i = 0; i < b.targets.size(); ++i)
    b.targets[i] = static_cast<int32_t>((i * 7 + 3) % classes);
  for (size_t i = 0; i < b.tokens.size(); ++i)
    b.tokens[i] = static_cast<int32_t>((i * 5 + 1) % classes);
}

float kFiniteDifferenceStep = 3e-3f;

// Central differences on a few entries of every parameter against Backward().
void CheckGradients(Model& m, const Batch& b) {
  m.ZeroGrad();
  m.Forward(b, ForwardOptions{.train = true});
  m.Backward();
  for (Param& p : m.params()) {
    for (int64_t i = 0; i < p.value.size(); i += std::max<int64_t>(1, p.value.size() / 5)) {
      const float w = p.value[i];
      const float h = kFiniteDifferenceStep;
      p.value[i] = w + h;
      double lp = m.Forward(b, ForwardOptions{});
      p.value[i] = w - h;
      double lm = m.Forward(b, ForwardOptions{});
      p.value[i] = w;
      double num = (lp - lm) / (2 * h);
      double ana = p.grad[i];
      EXPECT_NEAR(ana, num, 2e-3 + 0.05 * std::fabs(num)) << p.name << "[" << i << "]";
    }
  }
}

TEST(TensorTest, ViewsAndArena) {
  Tensor t({2, 3, 4});
  for (int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
  TensorView f = t.view().Flatten2d();
  EXPECT_EQ(f.shape(), (Shape{2, 12}));
  EXPECT_EQ(f.data(), t.data());  // a view, not a copy
  EXPECT_EQ(t.view().Reshape({24}).size(), 24);
  EXPECT_EQ(ShapeToString(t.shape()), "(2, 3, 4)");
  Arena arena;
  TensorView a = arena.Alloc({3});
  TensorView b = arena.AllocZeroed({5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_NE(a.data(), b.data());
  for (int64_t i = 0; i < b.size(); ++i) EXPECT_EQ(b.data()[i], 0.0f);
  const int64_t cap = arena.capacity_bytes();
  arena.Reset();
  EXPECT_EQ(arena.Alloc({3}).data(), a.data());  // memory is reused after Reset
  arena.Alloc({int64_t{5} << 20});               // larger than a block: grows
  EXPECT_GT(arena.capacity_bytes(), cap);
}

TEST(ModelTest, SequentialGradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> m = MustCreate(kCnn);
  Batch b = m->EmptyBatch(3);
  FillBatch(b, m->NumOutputs());
  CheckGradients(*m, b);
}

TEST(ModelTest, GptGradientsMatchFiniteDifferences) {
  std::unique_ptr<Model> m = MustCreate(kGpt);
  Batch b = m->EmptyBatch(2, 5);
  FillBatch(b, 11);
  CheckGradients(*m, b);
}

TEST(ModelTest, ParameterNamesFollowPyTorch) {
  std::unique_ptr<Model> m = MustCreate(kCnn);
  EXPECT_EQ(m->params()[0].name, "layers.0.weight");
  EXPECT_EQ(m->params()[0].value.shape(), (Shape{3, 2, 3, 3}));
  EXPECT_EQ(m->params()[1].name, "layers.0.bias");
  std::unique_ptr<Model> g = MustCreate(kGpt);
  EXPECT_EQ(g->params()[0].name, "transformer.wte.weight");
  EXPECT_EQ(g->params()[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(g->params()[4].value.shape(), (Shape{24, 8}));
  EXPECT_EQ(g->params().back().name, "transformer.ln_f.bias");
}

TEST(ModelTest, InitIsDeterministicAndSeeded) {
  std::unique_ptr<Model> a = MustCreate(kCnn, 5), b = MustCreate(kCnn, 5), c = MustCreate(kCnn, 6);
  EXPECT_EQ(a->params()[0].value.vec(), b->params()[0].value.vec());
  EXPECT_NE(a->params()[0].value.vec(), c->params()[0].value.vec());
  EXPECT_EQ(a->params()[1].value.vec(), std::vector<float>(3, 0.0f));  // biases start at zero
}

TEST(ModelTest, SpecJsonRoundTrip) {
  Result<ModelSpec> s = SpecFrom(kCnn);
  ASSERT_TRUE(s.ok());
  Result<ModelSpec> back = ModelSpec::FromJson(s->ToJson(), "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), s->ToJson());
}

void ExpectSpecError(const std::string& toml, const std::string& needle) {
  Result<ModelSpec> s = SpecFrom(toml);
  Status st = s.ok() ? Model::Create(*s).status() : s.status();
  ASSERT_FALSE(st.ok()) << "accepted; expected an error with: " << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ModelTest, SpecErrorsAreClear) {
  ExpectSpecError("[model]\ninput = [4]\n[[model.layers]]\nkind = \"linaer\"\nout = 2\n", "linaer");
  ExpectSpecError(
      "[model]\ninput = [4]\n[[model.layers]]\nkind = \"linear\"\nout = 2\nbais = true\n", "bias");
  ExpectSpecError("[model]\ninput = [1, 4, 4]\n[[model.layers]]\nkind = \"linear\"\nout = 2\n",
                  "add a layer with kind = \"flatten\"");
  ExpectSpecError("[model]\ninput = [2, 2]\n[[model.layers]]\nkind = \"relu\"\n",
                  "end with a linear layer");
  ExpectSpecError(
      "[model]\ninput = [1, 4, 4]\n[[model.layers]]\nkind = \"conv2d\"\nout = 2\nkernel = 9\n",
      "larger than the padded input");
  ExpectSpecError("[model]\ninput = [4]\n", "layers");
  ExpectSpecError(
      "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 3\nn_embd = 8\nblock_size = 4\nvocab_size = "
      "5\n",
      "divisible by n_head");
  ExpectSpecError("[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 4\n",
                  "vocab_size");
}

TEST(ModelTest, SavedModelLoadsBackAndPredictsIdentically) {
  std::unique_ptr<Model> m = MustCreate(kCnn);
  Batch b = m->EmptyBatch(4);
  FillBatch(b, m->NumOutputs());
  m->Forward(b, ForwardOptions{});
  TensorView lg = m->logits();
  std::vector<float> before(lg.data(), lg.data() + lg.size());
  TrainState st;
  st.model = std::move(m);
  st.step = 3;
  st.seed = 1;
  MemEnv env;
  ASSERT_TRUE(SaveModel(&env, "/m.safetensors", st).ok());
  Result<TrainState> back = LoadCheckpoint(&env, "/m.safetensors");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, 3);
  back->model->Forward(b, ForwardOptions{});
  TensorView lg2 = back->model->logits();
  ASSERT_EQ(lg2.size(), static_cast<int64_t>(before.size()));
  EXPECT_EQ(0, std::memcmp(lg2.data(), before.data(), before.size() * 4));
  EXPECT_EQ(StateHash(*back), StateHash(st));
}

TEST(ModelTest, MalformedCheckpointMetadataIsRefused) {
  MemEnv env;
  auto write = [&](const std::string& step, const std::string& model_json) {
    SafetensorsWriter w;
    w.SetMetadata("format", kModelFormat);
    w.SetMetadata("step", step);
    w.SetMetadata("seed", "1");
    w.SetMetadata("stream", "0");
    w.SetMetadata("model", model_json);
    CHECK(w.Write(&env, "/m.safetensors").ok());
  };
  Result<ModelSpec> spec = SpecFrom(kGpt);
  ASSERT_TRUE(spec.ok());
  write("12x", spec->ToJson());
  Result<TrainState> st = LoadCheckpoint(&env, "/m.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("__metadata__.step must be a decimal integer"),
            std::string::npos)
      << st.status().message();
  write("99999999999999999999", spec->ToJson());
  st = LoadCheckpoint(&env, "/m.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("out of range"), std::string::npos) << st.status().message();
  write("1", "{\"kind\": \"gpt\"}");
  st = LoadCheckpoint(&env, "/m.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("bad model spec"), std::string::npos)
      << st.status().message();
  write("1", spec->ToJson());  // well-formed metadata, but no tensors
  st = LoadCheckpoint(&env, "/m.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("missing tensor 'transformer.wte.weight'"),
            std::string::npos)
      << st.status().message();
}

}  // namespace
}  // namespace meshlearn::engine
