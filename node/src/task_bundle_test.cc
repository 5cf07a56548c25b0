#include "meshlearn/node/task_bundle.h"

#include <memory>

#include <gtest/gtest.h>

#include "meshlearn/engine/model.h"

namespace meshlearn::node {
namespace {

// Regression: `task fetch` of a GPT task whose vocabulary comes from the data failed with
// "model.vocab_size must be >= 2 (or come from the data), got 0": the bundle's [model] has
// vocab_size 0. The state's size decides it.
TEST(ModelSpecForState, FindsTheVocabularyOfAGptFromItsWeights) {
  engine::ModelSpec spec;
  spec.kind = "gpt";
  spec.gpt = {.n_layer = 1, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 37};
  Result<std::unique_ptr<engine::Model>> m = engine::Model::Create(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint64_t n = static_cast<uint64_t>((*m)->NumParameters());
  spec.gpt.vocab_size = 0;  // from the data
  Result<engine::ModelSpec> got = ModelSpecForState(spec, n);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->gpt.vocab_size, 37);
  EXPECT_FALSE(ModelSpecForState(spec, n + 1).ok());
  spec.gpt.vocab_size = 12;  // given: kept as it is
  EXPECT_EQ(ModelSpecForState(spec, n)->gpt.vocab_size, 12);
}

}  // namespace
}  // namespace meshlearn::node
