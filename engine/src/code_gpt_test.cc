// The code-gpt examples: both task files parse and build GPTs of the stated sizes (fast), and
// code-gpt trains to well below the corpus's unigram entropy (TrainQualityTest.CodeGptLearnsPython,
// label "long": scripts/test.sh runs it with MESHLEARN_SLOW_TESTS=1).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "meshlearn/engine/train.h"

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

TEST(TrainQualityTest, CodeGptLearnsPython) {
  if (!HavePythonStdlib()) {
    GTEST_SKIP() << "/usr/lib/python3.11 is not installed (Debian's libpython3.11-stdlib)";
  }
  TaskSpec t = Example("code-gpt.toml");
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), t);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  const TaskData& d = (*tr)->data();
  const double unigram = UnigramEntropy(d.train_tokens.tokens, (*tr)->task().model.gpt.vocab_size);
  const auto start = std::chrono::steady_clock::now();
  while ((*tr)->state().step < t.steps) (*tr)->Step();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EvalResult after = (*tr)->Evaluate();
  std::printf(
      "  code-gpt: unigram entropy %.4f nats, val loss %.4f after %lld steps (%.0f s), "
      "state %s\n",
      unigram, after.loss, static_cast<long long>(t.steps), secs,
      StateHash((*tr)->state()).ShortHex().c_str());
  EXPECT_NEAR(unigram, 3.25, 0.05);
  EXPECT_LT(after.loss, 0.6 * unigram);
}

}  // namespace
}  // namespace meshlearn::engine
