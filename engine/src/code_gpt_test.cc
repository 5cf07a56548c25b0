// The code-gpt examples: both task files parse and build GPTs of the stated sizes (fast), and
// code-gpt trains to well below the corpus's unigram entropy (TrainQualityTest.CodeGptLearnsPython,
// label "long": scripts/test.sh runs it with MESHLEARN_SLOW_TESTS=1).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/engine/hf_gpt2.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

const std::string kSourceDir = MESHLEARN_SOURCE_DIR;
// The corpus's distinct bytes (CorpusTest.PythonStdlibCorpus checks it on the real files).
constexpr int64_t kCorpusVocab = 172;

TaskSpec Example(const std::string& name) {
  Result<TaskSpec> t = TaskSpec::Load(Env::Default(), kSourceDir + "/examples/" + name);
  CHECK(t.ok()) << t.status().ToString();
  return *t;
}

int64_t Parameters(TaskSpec t) {
  EXPECT_EQ(t.model.gpt.vocab_size, 0);  // taken from the data
  t.model.gpt.vocab_size = kCorpusVocab;
  Result<std::unique_ptr<Model>> m = Model::Create(t.model);
  CHECK(m.ok()) << m.status().ToString();
  return (*m)->NumParameters();
}

TEST(CodeGptTest, ExamplesBuildModelsOfTheStatedSizes) {
  TaskSpec small = Example("code-gpt.toml");
  EXPECT_EQ(small.model.kind, "gpt");
  EXPECT_EQ(small.data.format, "text");
  EXPECT_EQ(small.data.text_root, "/usr/lib/python3.11");
  // 12 L C^2 (blocks) + 13 L C (norms, biases) + 2 C (ln_f) + (V + block_size) C (embeddings).
  EXPECT_EQ(Parameters(small), 12 * 6 * 128 * 128 + 13 * 6 * 128 + 2 * 128 + (172 + 128) * 128);
  EXPECT_EQ(Parameters(small), 1228288);  // "about 1-2M"

  TaskSpec big = Example("code-gpt-10m.toml");
  EXPECT_EQ(big.model.gpt.n_layer, 6);
  EXPECT_EQ(big.model.gpt.n_head, 6);
  EXPECT_EQ(big.model.gpt.n_embd, 384);
  EXPECT_EQ(big.model.gpt.block_size, 256);
  EXPECT_EQ(big.seq_len, 256);
  EXPECT_EQ(Parameters(big), 10811904);  // nanoGPT shakespeare-char: "10.65M" without wpe, V 65
  EXPECT_EQ(big.data.data_root, small.data.data_root);
  EXPECT_TRUE(CheckTrainingMemory([&] {
                TaskSpec t = big;
                t.model.gpt.vocab_size = kCorpusVocab;
                return t;
              }())
                  .ok());
}

bool HavePythonStdlib() {
  return std::filesystem::exists("/usr/lib/python3.11/asyncio/__init__.py");
}

// The unigram entropy of the training split, in nats: what a model that ignores context reaches.
double UnigramEntropy(const std::vector<int32_t>& tokens, int64_t V) {
  std::vector<double> count(static_cast<size_t>(V), 0.0);
  for (int32_t t : tokens) count[t] += 1;
  double h = 0, n = static_cast<double>(tokens.size());
  for (double c : count) {
    if (c > 0) h -= c / n * std::log(c / n);
  }
  return h;
}

// A GPT task's recipe as another framework needs it to train the same thing, written into `dir`
// while `trainer` trains `steps` steps from step 0: the step-0 weights in the Hugging Face layout
// (dir/init) and dir/recipe.safetensors with every step's batch ("batch_tokens",
// "batch_targets": steps x batch_size x seq_len), every step's learning rate ("lr", from
// LearningRateAt), the validation windows Evaluate takes ("val_tokens", "val_targets") and the
// optimizer's scalars and meshlearn's validation loss after training as metadata.
// tools/torch_recipe_train.py reads it.
struct RecipeRun {
  std::string error;  // empty on success
  double val_loss = 0, secs = 0;
  int64_t steps = 0;
  std::string state_hash, dir;
};

RecipeRun TrainWritingRecipe(Trainer& trainer, int64_t steps, const std::string& dir) {
  RecipeRun r;
  r.dir = dir;
  r.steps = steps;
  const TaskSpec& task = trainer.task();
  const TaskData& d = trainer.data();
  if (Status s = SaveHfGpt2(Env::Default(), dir + "/init", trainer.state(), d.vocab.chars);
      !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  const int64_t B = task.batch_size, T = task.seq_len, S = steps;
  std::vector<int32_t> tokens, targets;
  tokens.reserve(static_cast<size_t>(S * B * T));
  targets.reserve(static_cast<size_t>(S * B * T));
  std::vector<float> lr(static_cast<size_t>(S));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < S; ++s) {
    const Batch b = trainer.BatchForStep(s);  // what Step draws for this step
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
    targets.insert(targets.end(), b.targets.begin(), b.targets.end());
    lr[static_cast<size_t>(s)] = LearningRateAt(task.optimizer, s);
    trainer.Step();
    if ((s + 1) % 200 == 0) {
      std::printf("  %s: step %lld of %lld, %.0f s\n", task.name.c_str(),
                  static_cast<long long>(s + 1), static_cast<long long>(S),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
    }
  }
  r.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.val_loss = trainer.Evaluate().loss;
  r.state_hash = StateHash(trainer.state()).ShortHex();
  const int64_t n = EvalWindowCount(task, d);
  const Batch val = EvalWindows(task, d, 0, n);
  SafetensorsWriter w;
  w.AddI32("batch_tokens", {S, B, T}, tokens.data());
  w.AddI32("batch_targets", {S, B, T}, targets.data());
  w.AddF32("lr", {S}, lr.data());
  w.AddI32("val_tokens", {n, T}, val.tokens.data());
  w.AddI32("val_targets", {n, T}, val.targets.data());
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  const OptimizerSpec& o = task.optimizer;
  w.SetMetadata("beta1", num(o.beta1));
  w.SetMetadata("beta2", num(o.beta2));
  w.SetMetadata("eps", num(o.eps));
  w.SetMetadata("weight_decay", num(o.weight_decay));  // on tensors of rank >= 2 (AdamWDecays)
  w.SetMetadata("grad_clip", num(o.grad_clip));
  w.SetMetadata("val_loss", num(r.val_loss));  // meshlearn's, for the script's report
  if (Status s = w.Write(Env::Default(), dir + "/recipe.safetensors"); !s.ok()) {
    r.error = s.ToString();
  }
  return r;
}

// PyTorch's validation loss after training the recipe in `dir` (tools/torch_recipe_train.py on 2
// threads), or a negative value after a failure reported through gtest.
double TorchRecipeLoss(const std::string& dir) {
  const std::string out = dir + "/torch.json";
  const std::string cmd = "/usr/bin/python3 " + std::string(MESHLEARN_SOURCE_DIR) +
                          "/tools/torch_recipe_train.py " + dir + "/init --recipe " + dir +
                          "/recipe.safetensors --threads 2 --json > " + out;
  std::printf("  %s\n", cmd.c_str());
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  Result<std::string> text = Env::Default()->ReadFile(out);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  if (rc != 0 || !text.ok()) return -1;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("val_loss") && j["val_loss"].is_number()) << *text;
  if (!j.is_object() || !j.contains("val_loss") || !j["val_loss"].is_number()) return -1;
  return j["val_loss"].get<double>();
}

// tiny-gpt's first 60 steps (warm-up, clipping, weight decay), trained by both from the same
// weights on the same batches: their validation losses agreed to 1.5e-7 (2026-12-06), and a wrong
// piece of either step moves it by far more than two sets of kernels' rounding does (weight decay
// on every tensor instead of rank >= 2 only, in the script: 5.4e-4). Label "slow": needs
// python3-torch.
TEST(TrainQualityTest, TinyGptRecipeTrainsToPyTorchsLoss) {
  if (!testing::TorchAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch; install python3-torch to train "
                    "tiny-gpt's recipe in PyTorch (tools/torch_recipe_train.py)";
  }
  TaskSpec t = Example("tiny-gpt.toml");
  t.steps = 60;  // the schedule of these 60 steps: warm-up, then the start of the cosine
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), t);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  const RecipeRun r = TrainWritingRecipe(
      **tr, t.steps, std::string(MESHLEARN_BINARY_DIR) + "/engine_model_test_tiny_gpt");
  ASSERT_EQ(r.error, "");
  const double torch_loss = TorchRecipeLoss(r.dir);
  ASSERT_GT(torch_loss, 0);
  std::printf("  tiny-gpt's recipe, 60 steps: validation loss meshlearn %.9f, PyTorch %.9f\n",
              r.val_loss, torch_loss);
  EXPECT_NEAR(r.val_loss, torch_loss, 5e-5);
}

// code-gpt's recipe trained once per process: the two tests below run as one CTest entry
// (ONE_PROCESS in engine/CMakeLists.txt) and share it.
struct CodeGptRun : RecipeRun {
  double unigram = 0;
};

const CodeGptRun& TrainedCodeGpt() {
  static const CodeGptRun* const run = [] {
    auto* r = new CodeGptRun;
    TaskSpec t = Example("code-gpt.toml");
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), t);
    if (!tr.ok()) {
      r->error = tr.status().ToString();
      return r;
    }
    r->unigram =
        UnigramEntropy((*tr)->data().train_tokens.tokens, (*tr)->task().model.gpt.vocab_size);
    static_cast<RecipeRun&>(*r) = TrainWritingRecipe(
        **tr, t.steps, std::string(MESHLEARN_BINARY_DIR) + "/engine_model_test_code_gpt");
    return r;
  }();
  return *run;
}

TEST(TrainQualityTest, CodeGptLearnsPython) {
  if (!HavePythonStdlib()) {
    GTEST_SKIP() << "/usr/lib/python3.11 is not installed (Debian's libpython3.11-stdlib)";
  }
  const CodeGptRun& r = TrainedCodeGpt();
  ASSERT_EQ(r.error, "");
  std::printf(
      "  code-gpt: unigram entropy %.4f nats, val loss %.4f after %lld steps (%.0f s), "
      "state %s\n",
      r.unigram, r.val_loss, static_cast<long long>(r.steps), r.secs, r.state_hash.c_str());
  EXPECT_NEAR(r.unigram, 3.25, 0.05);
  EXPECT_LT(r.val_loss, 0.6 * r.unigram);
}

// The same recipe in PyTorch: tools/torch_recipe_train.py builds GPT-2 from meshlearn's step-0
// weights, trains it on meshlearn's batches with the recipe's AdamW, clipping and learning rates,
// and evaluates it on meshlearn's validation windows. meshlearn's loss must be at most 0.02 nats
// above PyTorch's (issue 14). The two differ only in rounding (PyTorch's sums and kernels are not
// meshlearn's), which 1,200 steps of training carry forward.
TEST(TrainQualityTest, CodeGptReachesPyTorchsLossOnTheSameRecipe) {
  if (!HavePythonStdlib()) {
    GTEST_SKIP() << "/usr/lib/python3.11 is not installed (Debian's libpython3.11-stdlib)";
  }
  if (!testing::TorchAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch; install python3-torch to train "
                    "code-gpt's recipe in PyTorch (tools/torch_recipe_train.py)";
  }
  const CodeGptRun& r = TrainedCodeGpt();
  ASSERT_EQ(r.error, "");
  const double torch_loss = TorchRecipeLoss(r.dir);
  ASSERT_GT(torch_loss, 0);
  std::printf(
      "  code-gpt's recipe: validation loss meshlearn %.4f, PyTorch %.4f (%+.4f nats); "
      "unigram entropy %.4f\n",
      r.val_loss, torch_loss, r.val_loss - torch_loss, r.unigram);
  EXPECT_LE(r.val_loss, torch_loss + 0.02);
  EXPECT_LT(torch_loss, 0.6 * r.unigram);  // the comparison is of two models that learned
}

}  // namespace
}  // namespace meshlearn::engine
