// Micro-batched steps and pipeline stages (pipeline.h): the pipeline's parameters after N steps
// equal, bit for bit, the unsplit model's micro-batched training (the issue-15 oracle), for the
// MLP, the CNN and the GPT at several cuts and thread counts; M = 1 is today's step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

// Small models with every layer kind the stages cut between: dropout (masks per micro-batch),
// layernorm, conv/pool/flatten, and the GPT's tied embedding.
constexpr char kPipeMlp[] = R"(
input = [12]
[[model.layers]]
kind = "linear"
out = 16
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "dropout"
p = 0.25
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "linear"
out = 10
[[model.layers]]
kind = "gelu"
[[model.layers]]
kind = "linear"
out = 4
)";

constexpr char kPipeCnn[] = R"(
input = [1, 8, 8]
[[model.layers]]
kind = "conv2d"
out = 4
kernel = 3
pad = 1
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 5
)";

constexpr char kPipeGpt[] = R"(
kind = "gpt"
n_layer = 4
n_head = 2
n_embd = 16
block_size = 8
vocab_size = 11
)";

ModelSpec PipeParseModel(const char* toml) {
  Result<ModelSpec> spec = ModelSpec::FromToml(std::string("[model]\n") + toml, "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}

constexpr uint64_t kPipeSeed = 7;
constexpr uint64_t kPipeDropoutSeed = 99;

// The batch of step `step`: a pure function of (model, step), from Philox.
Batch PipeBatch(const Model& m, int64_t batch, int64_t step) {
  const ModelSpec& spec = m.spec();
  Batch b = m.EmptyBatch(batch, spec.kind == "gpt" ? spec.gpt.block_size : 0);
  Rng rng(1000 + static_cast<uint64_t>(step));
  const int64_t classes = m.NumOutputs();
  for (float& x : b.inputs.vec()) x = static_cast<float>(rng.UniformDouble() * 2.0 - 1.0);
  for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(classes)));
  for (int32_t& t : b.targets) {
    t = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(classes)));
  }
  return b;
}

TrainState PipeState(const ModelSpec& spec) {
  TrainState st;
  Result<std::unique_ptr<Model>> m = Model::Create(spec);
  CHECK(m.ok()) << m.status().ToString();
  st.model = std::move(*m);
  st.model->Init(kPipeSeed);
  st.optimizer = std::make_unique<Optimizer>(testing::ClippedAdamW(), st.model->params());
  st.seed = kPipeSeed;
  return st;
}

// Today's training step (StepOnBatch) for `steps` steps; returns the state's flat hash (the bits
// of every parameter and moment, in the form pinned before the tiled commitment: checkpoint.h).
std::string PipeTrainedHash(const ModelSpec& spec, int64_t batch, int64_t steps) {
  TrainState st = PipeState(spec);
  for (int64_t s = 0; s < steps; ++s) {
    StepOnBatch(st, PipeBatch(*st.model, batch, s), kPipeDropoutSeed);
  }
  return FlatStateHash(st).ToHex();
}

// The state hashes today's step gives these models (recorded before micro-batches and stages
// were added): the model refactor into parts must not change a bit.
TEST(MicroBatchTest, TodaysStepIsPinned) {
  testing::ConfigGuard guard;
  ASSERT_TRUE(SetKernelConfig({SimdPath::kScalar, 1}).ok());
  const std::string mlp = PipeTrainedHash(PipeParseModel(kPipeMlp), 8, 3);
  const std::string cnn = PipeTrainedHash(PipeParseModel(kPipeCnn), 4, 3);
  const std::string gpt = PipeTrainedHash(PipeParseModel(kPipeGpt), 4, 3);
  EXPECT_EQ(mlp, "207f5070913e4ec6d8aee98566281450d6e87ea9b2d396ef19d07f20b5a5891d");
  EXPECT_EQ(cnn, "e809b03364401f701571f5818efbe988eef756626b27257e8897c18f19ebe44f");
  EXPECT_EQ(gpt, "d0d9472ceab27000965b05d25daaa5e346549adad7b9845f1275f81c2ce3a69c");
}

// The gradient of M micro-batches is the gradient of the batch mean: close to one pass over the
// whole batch (not bit-equal: the sums are cut differently).
TEST(MicroBatchTest, AccumulatedGradientIsTheBatchMeansGradient) {
  for (const char* toml : {kPipeCnn, kPipeGpt}) {
    TrainState st = PipeState(PipeParseModel(toml));
    Model& m = *st.model;
    Batch batch = PipeBatch(m, 8, 0);
    m.ZeroGrad();
    const float full_loss = m.Forward(batch, ForwardOptions{.train = true});
    m.Backward();
    std::vector<std::vector<float>> full;
    for (const Param& p : m.params()) full.push_back(p.grad.vec());

    const int64_t M = 4;
    Result<std::vector<Batch>> parts = SplitBatch(batch, M);
    ASSERT_TRUE(parts.ok()) << parts.status().ToString();
    m.ZeroGrad();
    Tensor head(m.params()[0].value.shape());
    BackwardOptions bopts{.dloss = MicroBatchLossScale(M),
                          .tied_head_grad = m.tied_head() ? head.data() : nullptr};
    float loss = 0;
    for (const Batch& part : *parts) {
      loss += m.Forward(part, ForwardOptions{.train = true});
      m.Backward(bopts);
    }
    if (m.tied_head()) AddTiedHeadGrad(m.params()[0].grad, head.vec());
    EXPECT_NEAR(loss / M, full_loss, 1e-5 * std::fabs(full_loss));
    for (size_t i = 0; i < full.size(); ++i) {
      double diff = 0, norm = 0;
      for (size_t k = 0; k < full[i].size(); ++k) {
        diff += std::pow(double(full[i][k]) - m.params()[i].grad[static_cast<int64_t>(k)], 2);
        norm += std::pow(double(full[i][k]), 2);
      }
      EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm) + 1e-9) << m.params()[i].name;
    }
  }
}

TEST(MicroBatchTest, MicroBatchesThatDoNotDivideTheBatchAreRefused) {
  TrainState st = PipeState(PipeParseModel(kPipeMlp));
  Result<std::vector<Batch>> parts = SplitBatch(PipeBatch(*st.model, 8, 0), 3);
  ASSERT_FALSE(parts.ok());
  EXPECT_NE(parts.status().message().find("divide the batch size (8)"), std::string::npos)
      << parts.status().message();

  const std::string task = std::string(R"(
[data]
format = "npy"
train_x = "x"
train_y = "y"
test_x = "x"
test_y = "y"
[model]
)") + kPipeMlp + R"(
[optimizer]
kind = "sgd"
lr = 0.1
[train]
steps = 1
batch_size = 12
micro_batches = 5
)";
  Result<TaskSpec> t = TaskSpec::Parse(task, "x.toml", "/tmp");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("train.micro_batches"), std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("must divide train.batch_size (12)"), std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("2, 3, 4, 6"), std::string::npos) << t.status().message();
  Result<TaskSpec> ok = TaskSpec::Parse(
      task.substr(0, task.find("micro_batches")) + "micro_batches = 4\n", "x.toml", "/tmp");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->micro_batches, 4);
}

// ---- Stages.

std::vector<std::unique_ptr<Stage>> PipeStages(const ModelSpec& spec, std::vector<int64_t> bounds,
                                               int64_t M) {
  Result<PipelineCut> cut = MakeCut(spec, std::move(bounds));
  CHECK(cut.ok()) << cut.status().ToString();
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < cut->stages(); ++s) {
    Result<std::unique_ptr<Stage>> st = Stage::Create(spec, testing::ClippedAdamW(), *cut, s, M);
    CHECK(st.ok()) << st.status().ToString();
    stages.push_back(std::move(*st));
  }
  InitPipeline(stages, kPipeSeed);
  return stages;
}

// Every float of a training state (parameters, then optimizer state) by name.
void PipeCollect(TrainState& st, std::map<std::string, const Tensor*>* out) {
  for (const Param& p : st.model->params()) (*out)[p.name] = &p.value;
  for (const Optimizer::NamedState& s : st.optimizer->State()) (*out)[s.name] = s.tensor;
}

// Trains the unsplit model (StepOnBatch with M micro-batches) and the pipeline `bounds` for
// `steps` steps on the same batches; every parameter, moment and loss must be bit-equal.
void ExpectPipelineEqualsOracle(const ModelSpec& spec, int64_t batch, std::vector<int64_t> bounds,
                                int64_t M, int64_t steps) {
  TrainState oracle = PipeState(spec);
  std::vector<std::unique_ptr<Stage>> stages = PipeStages(spec, bounds, M);
  std::string cut_name;
  for (int64_t b : bounds) cut_name += std::to_string(b) + " ";
  const std::string what = spec.kind + " cut [ " + cut_name + "] M=" + std::to_string(M) +
                           " threads=" + std::to_string(GetKernelConfig().threads);
  for (int64_t s = 0; s < steps; ++s) {
    Batch b = PipeBatch(*oracle.model, batch, s);
    float norm = 0;
    const float loss = StepOnBatch(oracle, b, kPipeDropoutSeed, &norm, M);
    PipelineStepResult r = RunPipelineStep(stages, b, kPipeDropoutSeed);
    EXPECT_EQ(std::memcmp(&loss, &r.loss, 4), 0)
        << what << " step " << s << ": loss " << loss << " vs " << r.loss;
    EXPECT_EQ(std::memcmp(&norm, &r.grad_norm, 4), 0) << what << " step " << s;
  }
  std::map<std::string, const Tensor*> want, got;
  PipeCollect(oracle, &want);
  for (const std::unique_ptr<Stage>& st : stages) {
    PipeCollect(st->state(), &got);
    EXPECT_EQ(st->state().step, steps);
  }
  ASSERT_EQ(want.size(), got.size()) << what;
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no stage holds " << name;
    std::string why;
    EXPECT_TRUE(testing::BitEqual(t->vec(), got[name]->vec(), &why))
        << what << ": " << name << " " << why;
  }
  if (spec.kind == "gpt" && stages.size() > 1) {  // the head's copy of wte follows the update
    std::string why;
    EXPECT_TRUE(testing::BitEqual(stages.back()->state().model->tied_weight()->vec(),
                                  want["transformer.wte.weight"]->vec(), &why))
        << what << ": the last stage's wte copy " << why;
  }
}

void ExpectCutsEqualOracle(const char* toml, int64_t batch,
                           const std::vector<std::vector<int64_t>>& cuts) {
  testing::ConfigGuard guard;
  for (int threads : {1, 2}) {
    ASSERT_TRUE(SetKernelConfig({GetKernelConfig().simd, threads}).ok());
    for (const std::vector<int64_t>& cut : cuts) {
      // M = 4: with 2 the accumulation order could not show (0 + a) + b == (0 + b) + a.
      for (int64_t M : {1, 2, 4})
        ExpectPipelineEqualsOracle(PipeParseModel(toml), batch, cut, M, 3);
    }
  }
}

TEST(PipelineTest, MlpStagesEqualTheMicroBatchedModel) {
  // 7 layers: linear relu dropout layernorm linear gelu linear. Cuts after the dropout, before
  // the layernorm, between a linear and its activation.
  ExpectCutsEqualOracle(kPipeMlp, 8,
                        {{0, 7}, {0, 3, 7}, {0, 1, 4, 7}, {0, 2, 3, 5, 7}, {0, 4, 5, 6, 7}});
}

TEST(PipelineTest, CnnStagesEqualTheMicroBatchedModel) {
  // conv relu maxpool flatten linear: a stage that starts with the flatten, one of only a pool.
  ExpectCutsEqualOracle(kPipeCnn, 4, {{0, 5}, {0, 3, 5}, {0, 1, 2, 4, 5}, {0, 2, 3, 5}});
}

TEST(PipelineTest, GptStagesEqualTheMicroBatchedModel) {
  // 4 blocks; embeddings in stage 0, ln_f and the tied head in the last.
  ExpectCutsEqualOracle(kPipeGpt, 4, {{0, 4}, {0, 2, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}});
}

// M = 1 through the pipeline is today's step: the pinned hash of TodaysStepIsPinned.
TEST(PipelineTest, OneMicroBatchIsTodaysStep) {
  testing::ConfigGuard guard;
  ASSERT_TRUE(SetKernelConfig({SimdPath::kScalar, 1}).ok());
  const ModelSpec spec = PipeParseModel(kPipeGpt);
  std::vector<std::unique_ptr<Stage>> stages = PipeStages(spec, {0, 1, 3, 4}, 1);
  TrainState st = PipeState(spec);  // only for the batches
  for (int64_t s = 0; s < 3; ++s)
    RunPipelineStep(stages, PipeBatch(*st.model, 4, s), kPipeDropoutSeed);
  // Reassemble the whole state from the stages in model order and hash it.
  std::map<std::string, const Tensor*> got;
  for (const std::unique_ptr<Stage>& stage : stages) PipeCollect(stage->state(), &got);
  for (Param& p : st.model->params()) p.value.vec() = got[p.name]->vec();
  for (const Optimizer::NamedState& n : st.optimizer->State()) n.tensor->vec() = got[n.name]->vec();
  st.step = 3;
  EXPECT_EQ(FlatStateHash(st).ToHex(),
            "d0d9472ceab27000965b05d25daaa5e346549adad7b9845f1275f81c2ce3a69c");
}

// CutBoundaryBytes (the ledger's link cost of each boundary, from the spec alone) is what a
// step's activations and their gradients really move across each boundary, for every model kind
// and a GPT at seq_len 0 (block_size, as its batches run).
TEST(PipelineTest, CutBoundaryBytesAreTheActivationsAndGradientsAStepSends) {
  struct Case {
    const char* toml;
    std::vector<int64_t> bounds;
    int64_t batch, M;
  };
  for (const Case& c : {Case{kPipeMlp, {0, 2, 5, 7}, 4, 2}, Case{kPipeCnn, {0, 2, 4, 5}, 6, 3},
                        Case{kPipeGpt, {0, 1, 3, 4}, 4, 2}, Case{kPipeGpt, {0, 2, 4}, 4, 1}}) {
    const ModelSpec spec = PipeParseModel(c.toml);
    TrainState st = PipeState(spec);
    std::vector<std::unique_ptr<Stage>> stages = PipeStages(spec, c.bounds, c.M);
    PipelineStepResult r =
        RunPipelineStep(stages, PipeBatch(*st.model, c.batch, 0), kPipeDropoutSeed);
    std::vector<uint64_t> sent(c.bounds.size() - 2, 0);
    for (const Transfer& t : r.transfers) {
      if (t.kind == TransferKind::kTransferActivation ||
          t.kind == TransferKind::kTransferActivationGrad) {
        sent[static_cast<size_t>(std::min(t.from, t.to))] += 4 * static_cast<uint64_t>(t.floats);
      }
    }
    Result<std::vector<uint64_t>> want =
        CutBoundaryBytes(spec, PipelineCut{c.bounds}, c.batch, 0, c.M);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(*want, sent) << spec.kind << " cut of " << c.bounds.size() - 1 << " stages";
  }
  const ModelSpec gpt = PipeParseModel(kPipeGpt);
  Result<std::vector<uint64_t>> gpt_bytes =
      CutBoundaryBytes(gpt, PipelineCut{{0, 1, 3, 4}}, 4, 0, 2);
  ASSERT_TRUE(gpt_bytes.ok());
  // (B, T, C) = (4, 8, 16) floats each way: 2 x 4 x 512 bytes.
  EXPECT_EQ(*gpt_bytes, (std::vector<uint64_t>{4096, 4096}));
  EXPECT_FALSE(CutBoundaryBytes(gpt, PipelineCut{{0, 1, 3, 4}}, 4, 0, 3).ok());
  EXPECT_FALSE(CutBoundaryBytes(gpt, PipelineCut{{0, 3, 1, 4}}, 4, 0, 2).ok());
}

TEST(PipelineTest, TransfersAreListedAndContentAddressed) {
  const ModelSpec spec = PipeParseModel(kPipeGpt);
  TrainState st = PipeState(spec);
  const int64_t M = 2;
  std::vector<std::unique_ptr<Stage>> a = PipeStages(spec, {0, 1, 3, 4}, M);
  std::vector<std::unique_ptr<Stage>> b = PipeStages(spec, {0, 1, 3, 4}, M);
  const Batch batch = PipeBatch(*st.model, 4, 0);
  PipelineStepResult ra = RunPipelineStep(a, batch, kPipeDropoutSeed);
  PipelineStepResult rb = RunPipelineStep(b, batch, kPipeDropoutSeed);
  std::map<TransferKind, int> count;
  for (const Transfer& t : ra.transfers) ++count[t.kind];
  EXPECT_EQ(count[TransferKind::kTransferActivation], M * 2);
  EXPECT_EQ(count[TransferKind::kTransferActivationGrad], M * 2);
  EXPECT_EQ(count[TransferKind::kTransferTiedHeadGrad], 1);
  EXPECT_EQ(count[TransferKind::kTransferGradSquares], 2);
  EXPECT_EQ(count[TransferKind::kTransferTiedWeight], 1);
  ASSERT_EQ(ra.transfers.size(), rb.transfers.size());
  std::set<std::string> hashes;
  for (size_t i = 0; i < ra.transfers.size(); ++i) {
    const Transfer& t = ra.transfers[i];
    EXPECT_EQ(t.hash, rb.transfers[i].hash) << "transfer " << i << " is not deterministic";
    hashes.insert(t.hash.ToHex());
    if (t.kind == TransferKind::kTransferActivation) {
      EXPECT_EQ(t.to, t.from + 1);
      EXPECT_EQ(t.floats, 2 * 8 * 16);  // (B/M, T, C)
    }
    if (t.kind == TransferKind::kTransferActivationGrad) {
      EXPECT_EQ(t.to, t.from - 1);
    }
  }
  EXPECT_EQ(hashes.size(), ra.transfers.size()) << "every tensor sent differs";
  // The hash covers every bit.
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const Hash256 h = TensorHash(v);
  v[1] = std::nextafter(v[1], 3.0f);
  EXPECT_NE(TensorHash(v), h);
  EXPECT_NE(TensorHash(std::span<const float>(v.data(), 2)), TensorHash(v));
}

// What a stage receives comes from a peer: a wrong size, an unknown micro-batch or a gradient
// for a micro-batch that had no forward pass is refused, and nothing runs.
TEST(PipelineTest, StagesRefuseTensorsOfTheWrongSize) {
  const ModelSpec spec = PipeParseModel(kPipeGpt);
  std::vector<std::unique_ptr<Stage>> stages = PipeStages(spec, {0, 2, 4}, 2);
  TrainState st = PipeState(spec);
  Result<std::vector<Batch>> micro = SplitBatch(PipeBatch(*st.model, 4, 0), 2);
  ASSERT_TRUE(micro.ok());
  Stage& second = *stages[1];
  second.BeginStep();
  const ForwardOptions opts{.train = true};
  Result<std::span<const float>> short_input =
      second.Forward(0, (*micro)[0], std::vector<float>(2 * 8 * 16 - 1), opts);
  ASSERT_FALSE(short_input.ok());
  EXPECT_NE(short_input.status().message().find(
                "stage 1, micro-batch 0: the input activations have 255 floats, the stage takes "
                "256"),
            std::string::npos)
      << short_input.status().message();
  EXPECT_FALSE(second.Forward(2, (*micro)[0], std::vector<float>(256), opts).ok());
  Result<std::span<const float>> early = second.Backward(0, {});
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().message().find("has no forward pass this step"), std::string::npos);
  Stage& first = *stages[0];
  first.BeginStep();
  ASSERT_TRUE(first.Forward(0, (*micro)[0], {}, opts).ok());
  Result<std::span<const float>> bad_grad = first.Backward(0, std::vector<float>(7));
  ASSERT_FALSE(bad_grad.ok());
  EXPECT_NE(bad_grad.status().message().find("the output gradient has 7 floats, the stage's "
                                             "output 256"),
            std::string::npos)
      << bad_grad.status().message();
  // The refused calls changed nothing: the stage still trains as its oracle (the tests above).
  for (const Param& p : first.params()) {
    for (float g : p.grad.vec()) ASSERT_EQ(g, 0.0f) << p.name;
  }
}

// A stage's checkpoint (its part's tensors and optimizer state) resumes the pipeline bit for bit:
// 2 steps, save every stage, restore them into fresh stages, 2 more steps = 4 straight steps.
TEST(PipelineTest, StagesResumeFromTheirCheckpoints) {
  const std::string dir = TestDir("pipeline-ckpt");
  for (const char* toml : {kPipeGpt, kPipeMlp}) {
    const ModelSpec spec = PipeParseModel(toml);
    const std::vector<int64_t> bounds =
        spec.kind == "gpt" ? std::vector<int64_t>{0, 1, 3, 4} : std::vector<int64_t>{0, 3, 5, 7};
    const int64_t M = 2, batch = spec.kind == "gpt" ? 4 : 8;
    TrainState batches = PipeState(spec);
    std::vector<std::unique_ptr<Stage>> straight = PipeStages(spec, bounds, M);
    std::vector<std::unique_ptr<Stage>> first = PipeStages(spec, bounds, M);
    for (int64_t s = 0; s < 2; ++s) {
      const Batch b = PipeBatch(*batches.model, batch, s);
      RunPipelineStep(straight, b, kPipeDropoutSeed);
      RunPipelineStep(first, b, kPipeDropoutSeed);
    }
    std::vector<std::unique_ptr<Stage>> resumed = PipeStages(spec, bounds, M);
    for (size_t i = 0; i < first.size(); ++i) {
      const std::string path = dir + "/" + spec.kind + std::to_string(i) + ".safetensors";
      ASSERT_TRUE(SaveCheckpoint(Env::Default(), path, first[i]->state()).ok());
      Result<TrainState> back = LoadCheckpoint(Env::Default(), path);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(StateHash(*back), StateHash(first[i]->state())) << "stage " << i;
      ASSERT_TRUE(resumed[i]->Restore(std::move(*back)).ok());
    }
    // Another stage's file is refused, naming both parts.
    Result<TrainState> other =
        LoadCheckpoint(Env::Default(), dir + "/" + spec.kind + "0.safetensors");
    ASSERT_TRUE(other.ok());
    Status wrong = resumed[1]->Restore(std::move(*other));
    EXPECT_NE(wrong.message().find("the saved state holds [0, "), std::string::npos)
        << wrong.message();
    ShareTiedWeight(resumed);
    for (int64_t s = 2; s < 4; ++s) {
      const Batch b = PipeBatch(*batches.model, batch, s);
      RunPipelineStep(straight, b, kPipeDropoutSeed);
      RunPipelineStep(resumed, b, kPipeDropoutSeed);
    }
    for (size_t i = 0; i < straight.size(); ++i) {
      EXPECT_EQ(resumed[i]->state().step, 4);
      EXPECT_EQ(StateHash(resumed[i]->state()), StateHash(straight[i]->state()))
          << spec.kind << " stage " << i;
    }
  }
}

ModelSpec PipeExampleGpt(const std::string& name) {
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/" + name;
  Result<ConfigFile> cfg = ConfigFile::Load(Env::Default(), path);
  CHECK(cfg.ok()) << cfg.status().ToString();
  Result<ConfigFile> table = cfg->GetTable("model");
  CHECK(table.ok());
  Result<ModelSpec> spec = ModelSpec::FromConfig(*table);
  CHECK(spec.ok()) << spec.status().ToString();
  spec->gpt.vocab_size = 172;  // the corpus's (docs/engine.md)
  return *spec;
}

ModelSpec PipeTenMillionGpt() { return PipeExampleGpt("code-gpt-10m.toml"); }

// The example GPTs at their real widths (code-gpt: 6 x 128; code-gpt-10m: 6 x 384 with 6 heads),
// on short sequences: one step of 3 and 4 stages with 2 micro-batches equals the oracle's.
TEST(PipelineTest, ExampleGptsAtTheirRealWidths) {
  testing::ConfigGuard guard;
  ASSERT_TRUE(SetKernelConfig({GetKernelConfig().simd, 2}).ok());
  for (const char* name : {"code-gpt.toml", "code-gpt-10m.toml"}) {
    ModelSpec spec = PipeExampleGpt(name);
    spec.gpt.block_size = 16;  // the sequences of PipeBatch; the same ops at every length
    // Both cuts for the small one; the 10.8M one, which dominates the time (most of all under
    // ASan), once in its 4 stages.
    if (name == std::string("code-gpt.toml"))
      ExpectPipelineEqualsOracle(spec, 2, {0, 2, 4, 6}, 2, 1);
    ExpectPipelineEqualsOracle(spec, 2, {0, 1, 3, 5, 6}, 2, 1);
  }
}

// ---- Cuts.

TEST(CutTest, BadCutsAreRefusedNamingTheBoundAndTheFix) {
  const ModelSpec gpt = PipeTenMillionGpt();
  struct Case {
    std::vector<int64_t> bounds;
    std::string message;
  };
  for (const Case& c :
       std::vector<Case>{{{0, 3, 3, 6},
                          "bound 2 (3) must be greater than bound 1 (3): every stage holds at "
                          "least one of the model's blocks (model.n_layer)"},
                         {{0, 2, 7},
                          "must start at 0 and end at 6 (the model's blocks (model.n_layer)), got "
                          "[0, ..., 7]"},
                         {{1, 6}, "must start at 0"},
                         {{6}, "a cut lists S + 1 bounds from 0 to 6"}}) {
    Result<PipelineCut> cut = MakeCut(gpt, c.bounds, "x.toml: network.cut");
    ASSERT_FALSE(cut.ok());
    EXPECT_NE(cut.status().message().find("x.toml: network.cut: "), std::string::npos);
    EXPECT_NE(cut.status().message().find(c.message), std::string::npos) << cut.status().message();
  }
  OptimizerSpec adamw;
  Result<PipelineCut> seven = ChooseCut(gpt, adamw, 7, 8, 256, 2);
  ASSERT_FALSE(seven.ok());
  EXPECT_NE(seven.status().message().find("stages (7) must be between 1 and the 6 blocks"),
            std::string::npos)
      << seven.status().message();
  Result<PipelineCut> odd = ChooseCut(gpt, adamw, 4, 8, 256, 3);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("micro_batches (3)"), std::string::npos);
}

// One derivation: the layers' costs add up to the whole model's parameters, FLOPs (the task's
// flops_per_sample formula for a GPT: 6 N T + 12 L T^2 C) and activation estimate.
TEST(CutTest, LayerCostsAddUpToTheModel) {
  const ModelSpec gpt = PipeTenMillionGpt();
  Result<std::vector<LayerCost>> layers = LayerCosts(gpt, 256);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  ASSERT_EQ(layers->size(), 6u);
  int64_t params = 0;
  uint64_t flops = 0;
  double acts = 0;
  for (const LayerCost& l : *layers) {
    params += l.parameters;
    flops += l.flops;
    acts += l.activation_floats;
  }
  EXPECT_EQ(params, 10'811'904);  // docs/engine.md
  const uint64_t N = 10'811'904, T = 256, L = 6, C = 384;
  EXPECT_EQ(flops, 6 * N * T + 12 * L * T * T * C);
  Result<uint64_t> per_sample = TrainingFlopsPerSample(gpt, 256);
  ASSERT_TRUE(per_sample.ok());
  EXPECT_EQ(*per_sample, flops);
  Result<MemoryEstimate> mem = EstimateMemory(gpt, 8, 256, "adamw", false);
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(mem->activations, 4.0 * 8 * acts);
  // A sequential model: at least 6 x parameters (the MLP's biases have no products).
  const ModelSpec mlp = PipeParseModel(kPipeMlp);
  Result<uint64_t> mlp_flops = TrainingFlopsPerSample(mlp, 0);
  ASSERT_TRUE(mlp_flops.ok());
  EXPECT_EQ(*mlp_flops, 6u * (12 * 16 + 16 + 2 * 16 + 16 * 10 + 10 + 10 * 4 + 4));
}

// The issue's cut: the 10M GPT (6 blocks) in 4 stages. The chosen cut has the smallest largest
// stage of every possible cut (all 10 enumerated), and its stages hold the model between them.
TEST(CutTest, ChooseCutBalancesTheTenMillionGptInFourStages) {
  const ModelSpec gpt = PipeTenMillionGpt();
  OptimizerSpec adamw;
  const int64_t batch = 8, T = 256, M = 2;
  Result<PipelineCut> cut = ChooseCut(gpt, adamw, 4, batch, T, M);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  auto largest = [&](const PipelineCut& c) {
    Result<std::vector<StageCost>> costs = CutCosts(gpt, adamw, c, batch, T, M);
    CHECK(costs.ok());
    uint64_t most = 0;
    for (const StageCost& s : *costs) most = std::max(most, s.flops);
    return most;
  };
  uint64_t best = UINT64_MAX;
  int cuts = 0;
  for (int64_t a = 1; a < 6; ++a) {
    for (int64_t b = a + 1; b < 6; ++b) {
      for (int64_t c = b + 1; c < 6; ++c) {
        best = std::min(best, largest(PipelineCut{{0, a, b, c, 6}}));
        ++cuts;
      }
    }
  }
  EXPECT_EQ(cuts, 10);
  EXPECT_EQ(largest(*cut), best);
  // Blocks 1-4 are the light ones (block 0 carries the embeddings, block 5 ln_f and the head):
  // the two stages of two blocks take them.
  EXPECT_EQ(cut->bounds, (std::vector<int64_t>{0, 1, 3, 5, 6}));

  Result<std::vector<StageCost>> costs = CutCosts(gpt, adamw, *cut, batch, T, M);
  ASSERT_TRUE(costs.ok());
  Result<MemoryEstimate> whole = EstimateMemory(gpt, batch, T, "adamw", false);
  ASSERT_TRUE(whole.ok());
  int64_t params = 0;
  double largest_bytes = 0;
  std::printf("  code-gpt-10m, 4 stages, batch %lld x %lld tokens, %lld micro-batches:\n",
              static_cast<long long>(batch), static_cast<long long>(T), static_cast<long long>(M));
  for (size_t s = 0; s < costs->size(); ++s) {
    const StageCost& c = (*costs)[s];
    params += c.parameters;
    largest_bytes = std::max(largest_bytes, c.param_bytes + c.optimizer_bytes);
    std::printf(
        "  stage %zu: blocks [%lld, %lld) %lld parameters, %.1f GFLOP/step, weights+grads "
        "%s, optimizer %s, activations %s\n",
        s, static_cast<long long>(cut->bounds[s]), static_cast<long long>(cut->bounds[s + 1]),
        static_cast<long long>(c.parameters), static_cast<double>(c.flops) / 1e9,
        FormatBytes(c.param_bytes).c_str(), FormatBytes(c.optimizer_bytes).c_str(),
        FormatBytes(c.activation_bytes).c_str());
  }
  std::printf("  whole model: weights+grads %s, optimizer %s, activations %s\n",
              FormatBytes(whole->parameters + whole->gradients).c_str(),
              FormatBytes(whole->optimizer).c_str(), FormatBytes(whole->activations).c_str());
  EXPECT_EQ(params, whole->num_parameters);
  // Each stage's weights, gradients and moments: at most a third of the whole model's (2 of 6
  // blocks, or one block with the embeddings or the head).
  EXPECT_LT(largest_bytes, (whole->parameters + whole->gradients + whole->optimizer) / 3.0);
}

// ChooseCut against every cut of every stage count, enumerated: the smallest (largest FLOPs,
// largest bytes, sum of squared FLOPs, bounds) in that order, of the cuts whose every stage holds
// parameters; none, and ChooseCut's error, for more stages than the model has layers with them.
void ExpectChooseCutIsTheBestOfAll(const ModelSpec& spec, int64_t batch, int64_t seq_len,
                                   int64_t M) {
  OptimizerSpec adamw;
  const int64_t n = CutLayerCount(spec);
  for (int S = 1; S <= n; ++S) {
    using Key = std::tuple<uint64_t, uint64_t, long double, std::vector<int64_t>>;
    std::optional<Key> best;
    std::vector<int64_t> bounds(static_cast<size_t>(S) + 1, 0);
    // Every increasing choice of the S - 1 inner bounds from 1..n-1.
    std::function<void(int, int64_t)> walk = [&](int k, int64_t lo) {
      if (k == S) {
        bounds[static_cast<size_t>(S)] = n;
        Result<std::vector<StageCost>> c =
            CutCosts(spec, adamw, PipelineCut{bounds}, batch, seq_len, M);
        CHECK(c.ok());
        uint64_t f = 0, b = 0;
        long double sq = 0;
        for (const StageCost& st : *c) {
          if (st.parameters == 0) return;
          f = std::max(f, st.flops);
          b = std::max(b, static_cast<uint64_t>(std::ceil(st.total_bytes())));
          sq += static_cast<long double>(st.flops) * static_cast<long double>(st.flops);
        }
        Key key{f, b, sq, bounds};
        if (!best || key < *best) best = key;
        return;
      }
      for (int64_t v = lo; v <= n - (S - k); ++v) {
        bounds[static_cast<size_t>(k)] = v;
        walk(k + 1, v + 1);
      }
    };
    walk(1, 1);
    Result<PipelineCut> cut = ChooseCut(spec, adamw, S, batch, seq_len, M);
    if (!best) {
      ASSERT_FALSE(cut.ok()) << spec.kind << " S=" << S;
      EXPECT_NE(cut.status().message().find("with parameters of the model"), std::string::npos)
          << cut.status().message();
      continue;
    }
    ASSERT_TRUE(cut.ok()) << cut.status().ToString();
    EXPECT_EQ(cut->bounds, std::get<3>(*best)) << spec.kind << " S=" << S;
  }
}

TEST(CutTest, ChooseCutIsTheBestOfEveryCut) {
  ExpectChooseCutIsTheBestOfAll(PipeParseModel(kPipeMlp), 8, 0, 2);
  ExpectChooseCutIsTheBestOfAll(PipeParseModel(kPipeCnn), 4, 0, 1);
  ExpectChooseCutIsTheBestOfAll(PipeTenMillionGpt(), 8, 256, 2);
}

// The task file's view: network.stages / network.cut against the task's model, errors naming
// the key; examples/code-gpt-pipeline.toml's cut is the one ChooseCut picks.
TEST(CutTest, TaskPipelineCutNamesTheTaskFileAndTheKey) {
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/code-gpt-pipeline.toml";
  Result<TaskSpec> task = TaskSpec::Load(Env::Default(), path);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->micro_batches, 2);
  task->model.gpt.vocab_size = 172;  // from the corpus (Trainer::Create fills it in)
  Result<PipelineCut> chosen = TaskPipelineCut(*task, 4, {});
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(chosen->bounds, (std::vector<int64_t>{0, 1, 3, 5, 6}));
  Result<std::string> text = Env::Default()->ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("cut = [0, 1, 3, 5, 6]"), std::string::npos);

  Result<PipelineCut> seven = TaskPipelineCut(*task, 7, {});
  ASSERT_FALSE(seven.ok());
  EXPECT_NE(seven.status().message().find(
                "code-gpt-pipeline.toml: network.stages: stages (7) must be between 1 and the 6 "
                "blocks (model.n_layer) of the model"),
            std::string::npos)
      << seven.status().message();
  Result<PipelineCut> past = TaskPipelineCut(*task, 2, {0, 3, 7});
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("code-gpt-pipeline.toml: network.cut: the bounds must "
                                         "start at 0 and end at 6"),
            std::string::npos)
      << past.status().message();
}

// A stage without parameters trains nothing and its disputes could only go to a key
// (docs/verification.md, "Who rules what"): a task file's cut that makes one is refused, naming the
// stage, its layers and a cut that works; a chosen cut never makes one, and more stages than the
// model has layers with parameters are refused.
TEST(CutTest, TaskPipelineCutRefusesAStageWithoutParameters) {
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-mlp.toml";
  Result<TaskSpec> task = TaskSpec::Load(Env::Default(), path);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  // [linear] [relu] [linear relu linear]: stage 1 is the lone relu.
  Result<PipelineCut> lone = TaskPipelineCut(*task, 3, {0, 1, 2, 5});
  ASSERT_FALSE(lone.ok());
  EXPECT_EQ(lone.status().code(), StatusCode::kInvalidArgument);
  Result<PipelineCut> chosen = TaskPipelineCut(*task, 3, {});
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  std::string bounds;
  for (int64_t b : chosen->bounds) bounds += (bounds.empty() ? "" : ", ") + std::to_string(b);
  EXPECT_NE(lone.status().message().find(
                "fashion-mlp.toml: network.cut: stage 1 holds layers [1, 2) (model.layers[1] "
                "(relu)), none with parameters"),
            std::string::npos)
      << lone.status().message();
  EXPECT_NE(lone.status().message().find("move a bound so that stage 1 holds a layer with "
                                         "parameters (a linear, conv2d or layernorm), e.g. "
                                         "network.cut = [" +
                                         bounds + "]"),
            std::string::npos)
      << lone.status().message();
  EXPECT_TRUE(TaskPipelineCut(*task, 3, chosen->bounds).ok());
  Result<std::vector<StageCost>> costs =
      CutCosts(task->model, task->optimizer, *chosen, task->batch_size, 0, task->micro_batches);
  ASSERT_TRUE(costs.ok());
  for (const StageCost& c : *costs) EXPECT_GT(c.parameters, 0);
  // Four stages of a model with three layers with parameters: no cut works, so the fix is fewer
  // stages.
  Result<PipelineCut> four = TaskPipelineCut(*task, 4, {0, 1, 2, 4, 5});
  ASSERT_FALSE(four.ok());
  EXPECT_NE(four.status().message().find("stage 1 holds layers [1, 2)"), std::string::npos)
      << four.status().message();
  EXPECT_NE(four.status().message().find("use fewer stages (stages (4) must be at most the 3 "
                                         "layers with parameters of the model"),
            std::string::npos)
      << four.status().message();
  Result<PipelineCut> auto_four = TaskPipelineCut(*task, 4, {});
  ASSERT_FALSE(auto_four.ok());
  EXPECT_NE(auto_four.status().message().find(
                "fashion-mlp.toml: network.stages: stages (4) must be at most the 3 layers with "
                "parameters of the model"),
            std::string::npos)
      << auto_four.status().message();
}

// What `meshlearn diloco` computes for one unit of a task with micro-batches (Trainer::StartUnit,
// then Trainer::Step with train.micro_batches, on the unit's own batches and rate) is what the
// unit's pipeline computes from the same weights, batches and rate: the oracle at the level of a
// DiLoCo unit, on real data (the tiny GPT on the GPL text; the Fashion-MNIST MLP when installed).
void ExpectUnitEqualsItsPipeline(TaskSpec task, std::vector<int64_t> bounds, int64_t steps) {
  Result<TaskData> data = LoadTaskData(Env::Default(), task);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(task, *data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  Trainer& trainer = **tr;
  const std::vector<float> start = trainer.FlatParams();
  const uint64_t stream = 12345;
  const double lr_scale = 0.5;
  ASSERT_TRUE(trainer.StartUnit(stream, start, lr_scale).ok());
  // The pipeline: the unit's inner optimizer, its starting weights, its batches.
  const TaskSpec& t = trainer.task();
  Result<PipelineCut> cut = MakeCut(t.model, std::move(bounds));
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < cut->stages(); ++s) {
    Result<std::unique_ptr<Stage>> st =
        Stage::Create(t.model, UnitOptimizerSpec(t.optimizer, lr_scale), *cut, s, t.micro_batches);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    stages.push_back(std::move(*st));
  }
  std::map<std::string, const Tensor*> whole;
  for (const Param& p : trainer.state().model->params()) whole[p.name] = &p.value;
  for (std::unique_ptr<Stage>& st : stages) {
    for (Param& p : st->params()) p.value.vec() = whole.at(p.name)->vec();
    st->state().seed = t.seed;
    st->state().stream = stream;
  }
  if (t.model.kind == "gpt" && stages.size() > 1) {
    stages.back()->SetTiedWeight(stages.front()->tied_weight_source());
  }
  for (int64_t s = 0; s < steps; ++s) {
    const Batch b = trainer.BatchForStep(s);
    const float want = trainer.Step();
    PipelineStepResult r = RunPipelineStep(stages, b, DropoutSeed(t.seed, stream));
    EXPECT_EQ(std::memcmp(&want, &r.loss, 4), 0) << "step " << s;
  }
  std::map<std::string, const Tensor*> want, got;
  PipeCollect(trainer.state(), &want);
  for (std::unique_ptr<Stage>& st : stages) PipeCollect(st->state(), &got);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) {
    std::string why;
    EXPECT_TRUE(testing::BitEqual(tensor->vec(), got.at(name)->vec(), &why)) << name << " " << why;
  }
}

TEST(PipelineTest, DilocoUnitOfTheTinyGptEqualsItsPipeline) {
  Result<TaskSpec> t =
      TaskSpec::Load(Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/tiny-gpt.toml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  t->batch_size = 4;
  t->seq_len = 32;
  t->micro_batches = 4;
  ExpectUnitEqualsItsPipeline(*t, {0, 1, 2}, 3);
}

TEST(PipelineTest, DilocoUnitOfTheFashionMlpEqualsItsPipeline) {
  const std::string path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-mlp.toml";
  Result<TaskSpec> t = TaskSpec::Load(Env::Default(), path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  if (!Env::Default()->FileSize(t->data.train_x).ok()) {
    GTEST_SKIP() << "Fashion-MNIST not installed (dataset-fashion-mnist)";
  }
  t->batch_size = 24;
  t->micro_batches = 3;
  ExpectUnitEqualsItsPipeline(*t, {0, 2, 4, CutLayerCount(t->model)}, 3);
}

}  // namespace
}  // namespace meshlearn::engine
