#include "meshlearn/node/task_bundle.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "meshlearn/base/hash.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/network_round.h"
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

// A text corpus (engine/corpus.h: root, files, data_root) ships as one blob of its text, the
// files concatenated in the listing's order: the bundle names it as data.path and keeps no corpus
// key, and a node that loads the bundle trains on exactly the tokens the submitter's corpus gives.
// A corpus file changed after its listing was made cannot be bundled (the error names data.root).
TEST(TaskBundleTest, ACorpusShipsAsOneBlobOfItsTextAndGivesTheSameTokens) {
  MemEnv env;
  std::string a, b;
  for (int i = 0; i < 60; ++i) a += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
  for (int i = 0; i < 40; ++i) b += "class C" + std::to_string(i) + ":\n    pass  # {}[]\n";
  ASSERT_TRUE(env.CreateDirs("/sub/corpus/pkg").ok());
  ASSERT_TRUE(env.WriteFileAtomic("/sub/corpus/a.py", a).ok());
  ASSERT_TRUE(env.WriteFileAtomic("/sub/corpus/pkg/b.py", b).ok());
  const std::string listing = Blake2b(AsBytes(a)).ToHex() + "  a.py\n" +
                              Blake2b(AsBytes(b)).ToHex() + "  pkg/b.py\n";
  ASSERT_TRUE(env.WriteFileAtomic("/sub/corpus.files", listing).ok());
  const std::string task = std::string(R"([task]
name = "corpus-bundle"
seed = 5
[data]
format = "text"
root = "corpus"
files = "corpus.files"
data_root = ")") + Blake2b(AsBytes(listing)).ToHex() + R"("
val_fraction = 0.1
[model]
kind = "gpt"
n_layer = 1
n_head = 2
n_embd = 8
block_size = 8
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 4
batch_size = 2
[network]
rounds = 1
units_per_round = 1
inner_steps = 2
budget = 1000
price_cap = 100
)";
  ASSERT_TRUE(env.WriteFileAtomic("/sub/task.toml", task).ok());
  auto store = net::BlobStore::Open(&env, "/sub/blobs");
  ASSERT_TRUE(store.ok());
  Result<TaskBundle> bundle = MakeBundle(&env, "/sub/task.toml", store->get());
  ASSERT_TRUE(bundle.ok()) << bundle.status().ToString();
  ASSERT_EQ(bundle->files.size(), 1u);
  const BundleDataFile& f = bundle->files[0];
  EXPECT_EQ(f.key, "path");
  EXPECT_EQ(f.size, a.size() + b.size());
  Result<Bytes> blob = (*store)->Get(f.id);
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(AsStringView(*blob), a + b);  // the listing's order, nothing between
  EXPECT_TRUE((*store)->IsPinned(f.id));
  EXPECT_NE(bundle->text.find("path = \"blob:" + f.id.ToHex() + "\""), std::string::npos)
      << bundle->text;
  for (const char* key : {"root =", "files =", "data_root ="}) {
    EXPECT_EQ(bundle->text.find(key), std::string::npos) << key << "\n" << bundle->text;
  }
  EXPECT_NE(bundle->text.find("val_fraction = 0.1"), std::string::npos);  // the rest stays

  ASSERT_TRUE(env.CreateDirs("/node").ok());
  Result<LoadedBundle> loaded = LoadBundle(
      bundle->text, [&](const net::BlobId& id, const std::string&) -> Result<std::string> {
        ML_ASSIGN_OR_RETURN(Bytes data, (*store)->Get(id));
        const std::string path = "/node/" + id.ToHex();
        ML_RETURN_IF_ERROR(env.WriteFileAtomic(path, AsStringView(data)));
        return path;
      });
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Result<engine::TaskSpec> original = engine::TaskSpec::Load(&env, "/sub/task.toml");
  ASSERT_TRUE(original.ok()) << original.status().ToString();
  Result<engine::TaskData> want = engine::LoadTaskData(&env, *original);
  Result<engine::TaskData> got = engine::LoadTaskData(&env, loaded->task);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->vocab.chars, want->vocab.chars);
  EXPECT_EQ(got->train_tokens.tokens, want->train_tokens.tokens);
  EXPECT_EQ(got->val_tokens.tokens, want->val_tokens.tokens);
  EXPECT_EQ(loaded->task.model.gpt.vocab_size, original->model.gpt.vocab_size);

  // The task's data root is the page tree over its train tokens (TaskDataRoot): the same from the
  // bundle's one blob as from the submitter's corpus, so a node loading the bundle accepts the
  // params the submitter declared; a node whose corpus differs by one token refuses them.
  Result<NetworkSpec> net = NetworkSpec::Load(&env, "/sub/task.toml");
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Result<std::unique_ptr<engine::Trainer>> submitter = engine::Trainer::Create(*original, *want);
  Result<std::unique_ptr<engine::Trainer>> node = engine::Trainer::Create(loaded->task, *got);
  ASSERT_TRUE(submitter.ok() && node.ok());
  const TaskFacts declared = ComputeTaskFacts(**submitter, *net);
  EXPECT_EQ(declared.data_root, engine::TokenDataRoot(want->train_tokens.tokens));
  EXPECT_EQ(declared.data_page_tokens, static_cast<uint32_t>(engine::kTokenPageTokens));
  const ledger::TaskParams params = MakeTaskParams(declared, *net, Blake2b("init"));
  EXPECT_EQ(params.data_root, declared.data_root);
  EXPECT_EQ(params.data_page_tokens, declared.data_page_tokens);
  EXPECT_TRUE(CheckBundleMatchesLedger(ComputeTaskFacts(**node, *net), *net, params).ok());
  engine::TaskData other = *got;
  other.train_tokens.tokens[7] = (other.train_tokens.tokens[7] + 1) % 2;
  Result<std::unique_ptr<engine::Trainer>> third = engine::Trainer::Create(loaded->task, other);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  Status refused = CheckBundleMatchesLedger(ComputeTaskFacts(**third, *net), *net, params);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("its corpus is not the task's"), std::string::npos)
      << refused.message();

  // A file edited after the listing was made: refused, naming the key and the file.
  ASSERT_TRUE(env.WriteFileAtomic("/sub/corpus/pkg/b.py", b + "# edited\n").ok());
  Result<TaskBundle> changed = MakeBundle(&env, "/sub/task.toml", store->get());
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.status().message().find("data.root"), std::string::npos)
      << changed.status().message();
  EXPECT_NE(changed.status().message().find("pkg/b.py"), std::string::npos)
      << changed.status().message();
}

// RewriteCorpusAsFile turns the corpus keys of [data] into one path, and leaves other tables'
// keys of the same names alone.
TEST(TaskBundleTest, RewriteCorpusAsFileTouchesOnlyTheDataTable) {
  const std::string toml =
      "[task]\nroot = \"keep\"\n[data]\nformat = \"text\"\nroot = \"/r\"\n  files = \"x.files\"\n"
      "data_root = \"ab\"\nval_fraction = 0.1\n[other]\nfiles = \"keep\"\n";
  Result<std::string> out = RewriteCorpusAsFile(toml, "blob:12");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out,
            "[task]\nroot = \"keep\"\n[data]\nformat = \"text\"\npath = \"blob:12\"\n"
            "val_fraction = 0.1\n[other]\nfiles = \"keep\"\n");
  Result<std::string> none = RewriteCorpusAsFile("[data]\nformat = \"text\"\n", "blob:12");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("data.files"), std::string::npos);
}

}  // namespace
}  // namespace meshlearn::node
