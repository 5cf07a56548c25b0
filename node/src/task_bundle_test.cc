#include "meshlearn/node/task_bundle.h"

#include <memory>

#include <gtest/gtest.h>

#include "meshlearn/engine/model.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/node/state_blob.h"
#include "testing/synthetic_task.h"

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

// data.init_weights (engine/train.h): the file is published as a blob of the bundle, so the
// bundle's id (the task's spec_hash on the ledger) commits to the initial weights; a node that
// loads the bundle starts from exactly those weights, and the round-0 state
// (params.initial_state) is theirs.
TEST(TaskBundleTest, InitWeightsAreABlobOfTheBundleAndRoundZerosWeights) {
  MemEnv env;
  Result<std::string> toml =
      testing::WriteSyntheticTask(&env, "/sub/data", 3, 64, 32, 8, 4, 2, 2, 3, 1);
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  ASSERT_TRUE(env.WriteFileAtomic("/sub/plain.toml", *toml).ok());
  // Weights unlike the seed's: the same model from another seed.
  Result<engine::TaskSpec> plain = engine::TaskSpec::Load(&env, "/sub/plain.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto seed_trainer = engine::Trainer::Create(&env, *plain);
  ASSERT_TRUE(seed_trainer.ok()) << seed_trainer.status().ToString();
  auto write_weights = [&](const std::string& path, uint64_t seed) {
    engine::Model& m = *(*seed_trainer)->state().model;
    std::vector<float> keep = (*seed_trainer)->FlatParams();
    m.Init(seed);
    engine::SafetensorsWriter w;
    for (const engine::Param& p : m.params()) w.AddF32(p.name, p.value);
    std::vector<float> flat;
    for (const engine::Param& p : m.params()) {
      flat.insert(flat.end(), p.value.data(), p.value.data() + p.value.size());
    }
    EXPECT_TRUE(w.Write(&env, path).ok());
    EXPECT_TRUE((*seed_trainer)->SetFlatParams(keep).ok());
    return flat;
  };
  const std::vector<float> w99 = write_weights("/sub/init.safetensors", 99);
  const std::vector<float> w98 = write_weights("/sub/other.safetensors", 98);
  ASSERT_NE(w99, (*seed_trainer)->FlatParams());
  auto with_init = [&](const std::string& task, const std::string& weights) {
    std::string t = *toml;
    const size_t data = t.find("[data]\n");
    EXPECT_NE(data, std::string::npos);
    t.insert(data + 7, "init_weights = \"" + weights + "\"\n");
    EXPECT_TRUE(env.WriteFileAtomic(task, t).ok());
  };
  with_init("/sub/task.toml", "init.safetensors");  // relative to the task file's folder
  with_init("/sub/other.toml", "other.safetensors");

  auto store = net::BlobStore::Open(&env, "/sub/blobs");
  ASSERT_TRUE(store.ok());
  Result<TaskBundle> b = MakeBundle(&env, "/sub/task.toml", store->get());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->files.size(), 5u);
  const BundleDataFile& init = b->files.back();
  EXPECT_EQ(init.key, "init_weights");
  EXPECT_EQ(init.path, "/sub/init.safetensors");
  Result<std::string> init_bytes = env.ReadFile("/sub/init.safetensors");
  ASSERT_TRUE(init_bytes.ok());
  Result<net::BlobId> init_id = (*store)->Put(AsBytes(*init_bytes));  // content-addressed
  ASSERT_TRUE(init_id.ok());
  EXPECT_EQ(init.id, *init_id);
  EXPECT_TRUE((*store)->IsPinned(init.id));
  EXPECT_NE(b->text.find("init_weights = \"blob:" + init.id.ToHex() + "\""), std::string::npos)
      << b->text;
  Result<std::vector<std::pair<std::string, net::BlobId>>> blobs = BundleDataBlobs(b->text);
  ASSERT_TRUE(blobs.ok());
  ASSERT_EQ(blobs->size(), 5u);
  EXPECT_EQ(blobs->back(), std::make_pair(std::string("init_weights"), init.id));

  // The commitment: other weights, or none, give another bundle id (spec_hash).
  Result<TaskBundle> other = MakeBundle(&env, "/sub/other.toml", store->get());
  Result<TaskBundle> none = MakeBundle(&env, "/sub/plain.toml", store->get());
  ASSERT_TRUE(other.ok() && none.ok());
  EXPECT_NE(other->id, b->id);
  EXPECT_NE(none->id, b->id);
  EXPECT_EQ(none->files.size(), 4u);

  // A node: the resolver fetches the weights like the data; its trainer starts from them.
  ASSERT_TRUE(env.CreateDirs("/node").ok());
  std::vector<std::string> keys;
  Result<LoadedBundle> loaded = LoadBundle(
      b->text, [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
        keys.push_back(key);
        ML_ASSIGN_OR_RETURN(Bytes data, (*store)->Get(id));
        std::string path = "/node/" + id.ToHex();
        ML_RETURN_IF_ERROR(env.WriteFileAtomic(path, AsStringView(data)));
        return path;
      });
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(keys.size(), 5u);
  EXPECT_EQ(keys.back(), "init_weights");
  EXPECT_EQ(loaded->task.data.init_weights, "/node/" + init.id.ToHex());
  auto trainer = engine::Trainer::Create(&env, loaded->task);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  EXPECT_EQ((*trainer)->FlatParams(), w99);
  EXPECT_EQ(InitialState(**trainer).weights, w99);
  EXPECT_NE(w98, w99);

  // A bundle naming the weights by a plain path is refused like a data file.
  std::string plain_path = b->text;
  plain_path.replace(plain_path.find("init_weights = \"blob:") + 16, 5, "file:");
  Result<std::vector<std::pair<std::string, net::BlobId>>> refused = BundleDataBlobs(plain_path);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("data.init_weights"), std::string::npos)
      << refused.status().message();
  // A task whose weights file is missing cannot be bundled; the error names the key.
  with_init("/sub/missing.toml", "gone.safetensors");
  Result<TaskBundle> missing = MakeBundle(&env, "/sub/missing.toml", store->get());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("data.init_weights"), std::string::npos)
      << missing.status().message();
}

}  // namespace
}  // namespace meshlearn::node
