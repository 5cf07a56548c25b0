// The vocabulary stored with a GPT, the Hugging Face GPT-2 layout (hf_gpt2.h) read back bit for
// bit, its refusals of malformed files, and deterministic sampling (generate.h).
#include "meshlearn/engine/hf_gpt2.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/generate.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

using nlohmann::json;

// A small text task in a MemEnv, with bytes >= 0x80 in its vocabulary (UTF-8 text).
std::unique_ptr<Trainer> SmallGpt(MemEnv* env) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) +
            "  # \xc3\xa9t\xc3\xa9\n";
  }
  CHECK(env->CreateDirs("/t").ok());
  CHECK(env->WriteFileAtomic("/t/text.txt", text).ok());
  const std::string toml =
      "[task]\nname = \"small\"\nseed = 3\n[data]\nformat = \"text\"\npath = \"text.txt\"\n"
      "[model]\nkind = \"gpt\"\nn_layer = 2\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
      "[optimizer]\nkind = \"adamw\"\nlr = 1e-2\nweight_decay = 0.1\ngrad_clip = 1.0\n"
      "schedule = \"cosine\"\nwarmup_steps = 2\n[train]\nsteps = 6\nbatch_size = 4\n";
  Result<TaskSpec> t = TaskSpec::Parse(toml, "/t/small.toml", "/t");
  CHECK(t.ok()) << t.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(env, *t);
  CHECK(tr.ok()) << tr.status().ToString();
  return std::move(*tr);
}

std::vector<uint8_t> VocabOf(const Trainer& tr) { return tr.data().vocab.chars; }

TEST(HfGpt2Test, RoundTripIsBitForBitAndTransposesConv1D) {
  MemEnv env;
  std::unique_ptr<Trainer> tr = SmallGpt(&env);
  for (int i = 0; i < 3; ++i) tr->Step();
  const Hash256 before = StateHash(tr->state());
  ASSERT_TRUE(SaveHfGpt2(&env, "/hf", tr->state(), VocabOf(*tr)).ok());

  Result<LoadedModel> m = LoadModel(&env, "/hf");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->hf);
  ASSERT_TRUE(m->state.optimizer);
  EXPECT_EQ(StateHash(m->state), before);
  EXPECT_EQ(m->state.step, 3);
  EXPECT_EQ(m->state.seed, 3u);
  EXPECT_EQ(m->vocab, VocabOf(*tr));
  EXPECT_GT(m->vocab.back(), 0x7f);  // the é bytes are in the vocabulary

  // The file holds Hugging Face names and Conv1D [in, out] layouts.
  Result<SafetensorsFile> f = SafetensorsFile::Read(&env, "/hf/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const int64_t C = 16;
  for (const auto& [name, rows, cols] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"transformer.h.1.attn.c_attn.weight", C, 3 * C},
           {"transformer.h.1.attn.c_proj.weight", C, C},
           {"transformer.h.1.mlp.c_fc.weight", C, 4 * C},
           {"transformer.h.1.mlp.c_proj.weight", 4 * C, C}}) {
    Result<Tensor> hf = f->GetF32(name, {rows, cols});
    ASSERT_TRUE(hf.ok()) << hf.status().ToString();
    const Param* p = nullptr;
    for (const Param& q : tr->state().model->params()) {
      if (q.name == name) p = &q;
    }
    ASSERT_NE(p, nullptr) << name;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        ASSERT_EQ(std::memcmp(hf->data() + i * cols + j, p->value.data() + j * rows + i, 4), 0)
            << name;
      }
    }
  }
  EXPECT_TRUE(f->Has("transformer.wte.weight"));
  EXPECT_TRUE(f->Has("transformer.wpe.weight"));
  EXPECT_TRUE(f->Has("transformer.ln_f.bias"));
  EXPECT_FALSE(f->Has("lm_head.weight"));  // tied

  Result<std::string> config = env.ReadFile("/hf/config.json");
  ASSERT_TRUE(config.ok());
  json c = json::parse(*config);
  EXPECT_EQ(c["vocab_size"], static_cast<int64_t>(VocabOf(*tr).size()));
  EXPECT_EQ(c["n_positions"], 16);
  EXPECT_EQ(c["n_embd"], 16);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);
  Result<std::string> vocab = env.ReadFile("/hf/vocab.json");
  ASSERT_TRUE(vocab.ok());
  json v = json::parse(*vocab);
  ASSERT_EQ(v.size(), VocabOf(*tr).size());
  EXPECT_EQ(v[0], "\n");
  EXPECT_EQ(v.back(), "\xc3\x83");  // byte 0xc3 is the character U+00C3, written in UTF-8
}

TEST(HfGpt2Test, ResumingFromTheLayoutContinuesBitForBit) {
  MemEnv env;
  std::unique_ptr<Trainer> straight = SmallGpt(&env);
  for (int i = 0; i < 6; ++i) straight->Step();

  std::unique_ptr<Trainer> first = SmallGpt(&env);
  for (int i = 0; i < 3; ++i) first->Step();
  ASSERT_TRUE(SaveHfGpt2(&env, "/hf", first->state(), VocabOf(*first)).ok());
  std::unique_ptr<Trainer> second = SmallGpt(&env);
  Result<LoadedModel> m = LoadModel(&env, "/hf");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(second->Resume(std::move(m->state)).ok());
  for (int i = 0; i < 3; ++i) second->Step();
  EXPECT_EQ(StateHash(second->state()), StateHash(straight->state()));

  // A model without optimizer state: no optimizer.safetensors (a stale one is removed).
  TrainState bare;
  bare.model = std::move(first->state().model);
  bare.step = 3;
  bare.seed = 3;
  ASSERT_TRUE(SaveHfGpt2(&env, "/hf", bare, VocabOf(*first)).ok());
  EXPECT_FALSE(env.FileExists("/hf/optimizer.safetensors"));
  Result<LoadedModel> b = LoadModel(&env, "/hf");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE(b->state.optimizer);
  EXPECT_EQ(ModelStateHash(b->state), ModelStateHash(bare));
}

TEST(HfGpt2Test, AMeshlearnModelFileCarriesItsVocabulary) {
  MemEnv env;
  std::unique_ptr<Trainer> tr = SmallGpt(&env);
  ASSERT_TRUE(SaveModel(&env, "/m.safetensors", tr->state(),
                        {{kVocabMetadataKey, VocabToJson(VocabOf(*tr))}})
                  .ok());
  Result<LoadedModel> m = LoadModel(&env, "/m.safetensors");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->hf);
  EXPECT_EQ(m->vocab, VocabOf(*tr));
  EXPECT_FALSE(VocabFromJson("[1, 1]", "x").ok());
  EXPECT_FALSE(VocabFromJson("[256]", "x").ok());
  EXPECT_FALSE(VocabFromJson("{}", "x").ok());
}

// Writes a good layout to /hf, lets `edit` break one file, and returns LoadModel's error.
std::string ErrorAfter(const std::function<void(MemEnv&)>& edit) {
  MemEnv env;
  std::unique_ptr<Trainer> tr = SmallGpt(&env);
  tr->Step();
  CHECK(SaveHfGpt2(&env, "/hf", tr->state(), VocabOf(*tr)).ok());
  edit(env);
  Result<LoadedModel> m = LoadModel(&env, "/hf");
  return m.ok() ? std::string("loaded") : m.status().message();
}

void EditJson(MemEnv& env, const std::string& path, const std::function<void(json&)>& f) {
  json j = json::parse(env.ReadFile(path).value());
  f(j);
  CHECK(env.WriteFileAtomic(path, j.dump()).ok());
}

// Rewrites model.safetensors with `f` applied to its tensors (name -> tensor).
void EditTensors(MemEnv& env, const std::function<void(std::map<std::string, Tensor>&)>& f) {
  SafetensorsFile file = SafetensorsFile::Read(&env, "/hf/model.safetensors").value();
  std::map<std::string, Tensor> ts;
  for (const auto& [name, e] : file.entries()) ts[name] = file.GetF32(name).value();
  f(ts);
  SafetensorsWriter w;
  for (const auto& [k, v] : file.metadata()) {
    if (k != "meshlearn.state_hash") w.SetMetadata(k, v);
  }
  for (const auto& [name, t] : ts) w.AddF32(name, t);
  CHECK(w.Write(&env, "/hf/model.safetensors").ok());
  CHECK(env.DeleteFile("/hf/optimizer.safetensors").ok());
}

TEST(HfGpt2Test, MalformedFilesAreRefusedNamingTheFileAndField) {
  struct Case {
    std::function<void(MemEnv&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](MemEnv& e) { EditJson(e, "/hf/config.json", [](json& j) { j.erase("n_head"); }); },
       "/hf/config.json: field 'n_head': missing"},
      {[](MemEnv& e) { EditJson(e, "/hf/config.json", [](json& j) { j["n_embd"] = "16"; }); },
       "/hf/config.json: field 'n_embd': must be an integer, got \"16\""},
      {[](MemEnv& e) { EditJson(e, "/hf/config.json", [](json& j) { j["n_layer"] = 0; }); },
       "/hf/config.json: field 'n_layer': must be in [1, 256], got 0"},
      {[](MemEnv& e) { EditJson(e, "/hf/config.json", [](json& j) { j["n_head"] = 3; }); },
       "/hf/config.json: field 'n_head': must divide n_embd"},
      {[](MemEnv& e) {
         EditJson(e, "/hf/config.json", [](json& j) { j["activation_function"] = "relu"; });
       },
       "/hf/config.json: field 'activation_function': must be \"gelu_new\""},
      {[](MemEnv& e) {
         EditJson(e, "/hf/config.json", [](json& j) { j["layer_norm_epsilon"] = 1e-6; });
       },
       "/hf/config.json: field 'layer_norm_epsilon': must be 1e-05"},
      {[](MemEnv& e) { EditJson(e, "/hf/config.json", [](json& j) { j["n_inner"] = 7; }); },
       "/hf/config.json: field 'n_inner'"},
      {[](MemEnv& e) {
         EditJson(e, "/hf/config.json", [](json& j) { j["tie_word_embeddings"] = false; });
       },
       "/hf/config.json: field 'tie_word_embeddings'"},
      {[](MemEnv& e) { CHECK(e.WriteFileAtomic("/hf/config.json", "{\"n_embd\": 1").ok()); },
       "/hf/config.json: not a JSON object"},
      {[](MemEnv& e) { CHECK(e.WriteFileAtomic("/hf/vocab.json", "{}").ok()); },
       "/hf/vocab.json: not a JSON array"},
      {[](MemEnv& e) { EditJson(e, "/hf/vocab.json", [](json& j) { j[2] = "ab"; }); },
       "/hf/vocab.json: entry 2: must be one character U+0000..U+00FF"},
      {[](MemEnv& e) { EditJson(e, "/hf/vocab.json", [](json& j) { j[2] = "\xe2\x82\xac"; }); },
       "/hf/vocab.json: entry 2: must be one character"},
      {[](MemEnv& e) { EditJson(e, "/hf/vocab.json", [](json& j) { j[2] = 7; }); },
       "/hf/vocab.json: entry 2: must be a string"},
      {[](MemEnv& e) { EditJson(e, "/hf/vocab.json", [](json& j) { j[2] = j[1]; }); },
       "/hf/vocab.json: entry 2: \" \" appears twice"},
      {[](MemEnv& e) { EditJson(e, "/hf/vocab.json", [](json& j) { j.push_back("~~"); }); },
       "/hf/vocab.json: "},
      {[](MemEnv& e) { EditTensors(e, [](auto& ts) { ts.erase("transformer.h.1.ln_2.bias"); }); },
       "/hf/model.safetensors: missing tensor 'transformer.h.1.ln_2.bias'"},
      {[](MemEnv& e) {
         EditTensors(e, [](auto& ts) {
           ts["transformer.h.0.mlp.c_fc.weight"] = Tensor({64, 16});  // meshlearn's [out, in]
         });
       },
       "/hf/model.safetensors: tensor 'transformer.h.0.mlp.c_fc.weight' has shape (64, 16), "
       "expected (16, 64)"},
      {[](MemEnv& e) {
         EditTensors(e, [](auto& ts) { ts["transformer.h.2.ln_1.bias"] = Tensor({16}); });
       },
       "/hf/model.safetensors: unexpected tensor 'transformer.h.2.ln_1.bias'"},
      {[](MemEnv& e) {
         EditTensors(e, [](auto& ts) {
           ts["lm_head.weight"] = Tensor(ts["transformer.wte.weight"].shape());
         });
       },
       "/hf/model.safetensors: tensor 'lm_head.weight' differs from 'transformer.wte.weight'"},
      {[](MemEnv& e) {
         std::string b = e.ReadFile("/hf/model.safetensors").value();
         CHECK(e.WriteFileAtomic("/hf/model.safetensors", b.substr(0, b.size() - 4)).ok());
       },
       "/hf/model.safetensors: "},
      {[](MemEnv& e) {
         SafetensorsFile f = SafetensorsFile::Read(&e, "/hf/model.safetensors").value();
         SafetensorsWriter w;
         for (const auto& [k, v] : f.metadata()) w.SetMetadata(k, v);
         for (const auto& [name, en] : f.entries()) {
           Tensor t = f.GetF32(name).value();
           if (name == "transformer.wpe.weight") t[0] += 1.0f;
           w.AddF32(name, t);
         }
         CHECK(w.Write(&e, "/hf/model.safetensors").ok());
       },
       "/hf/model.safetensors: __metadata__.meshlearn.state_hash is"},
      {[](MemEnv& e) { CHECK(e.DeleteFile("/hf/model.safetensors").ok()); },
       "/hf/model.safetensors"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string err = ErrorAfter(cases[i].edit);
    EXPECT_NE(err.find(cases[i].want), std::string::npos)
        << "case " << i << ": want '" << cases[i].want << "' in: " << err;
  }
  // The causal-mask buffers older transformers versions save, and a tied lm_head, are accepted.
  EXPECT_EQ(ErrorAfter([](MemEnv& e) {
              EditTensors(e, [](auto& ts) {
                ts["transformer.h.0.attn.bias"] = Tensor({1, 1, 16, 16});
                ts["transformer.h.1.attn.masked_bias"] = Tensor({1});
                ts["lm_head.weight"] = ts["transformer.wte.weight"];
              });
            }),
            "loaded");
}

// ---- Sampling

std::vector<int32_t> Sample(Model& m, const SampleOptions& o, int64_t limit) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  Result<std::vector<int32_t>> r = SampleTokens(m, prompt, limit, o);
  CHECK(r.ok()) << r.status().ToString();
  return *r;
}

TEST(GenerateTest, TheSameSeedGivesTheSameTokensOnEveryKernelPath) {
  MemEnv env;
  std::unique_ptr<Trainer> tr = SmallGpt(&env);
  for (int i = 0; i < 6; ++i) tr->Step();
  Model& m = *tr->state().model;
  const int64_t V = m.spec().gpt.vocab_size;
  SampleOptions o{.tokens = 40, .temperature = 1.0, .top_k = 0, .seed = 11};
  const std::vector<int32_t> a = Sample(m, o, V);
  ASSERT_EQ(a.size(), 40u);  // longer than block_size 16: the context is cropped
  testing::ConfigGuard guard;
  for (const KernelConfig& c : testing::AllConfigs()) {
    ASSERT_TRUE(SetKernelConfig(c).ok());
    EXPECT_EQ(Sample(m, o, V), a) << SimdPathName(c.simd) << " x" << c.threads;
  }
  o.seed = 12;
  EXPECT_NE(Sample(m, o, V), a);
  // top_k 1 and temperature 0 are both greedy; a limit keeps ids below it.
  SampleOptions greedy{.tokens = 20, .temperature = 0.0, .top_k = 0, .seed = 1};
  SampleOptions top1{.tokens = 20, .temperature = 0.7, .top_k = 1, .seed = 99};
  EXPECT_EQ(Sample(m, greedy, V), Sample(m, top1, V));
  for (int32_t id : Sample(m, SampleOptions{.tokens = 50, .temperature = 2.0, .seed = 5}, 5)) {
    EXPECT_LT(id, 5);
  }
}

TEST(GenerateTest, BadOptionsAreRefusedNamingTheOption) {
  MemEnv env;
  std::unique_ptr<Trainer> tr = SmallGpt(&env);
  Model& m = *tr->state().model;
  const std::vector<int32_t> p = {1};
  auto err = [&](SampleOptions o, std::vector<int32_t> prompt, int64_t limit = 1000) {
    Result<std::vector<int32_t>> r = SampleTokens(m, prompt, limit, o);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(err({.tokens = 0}, p).find("--tokens"), std::string::npos);
  EXPECT_NE(err({.tokens = 1, .temperature = -1}, p).find("--temperature"), std::string::npos);
  EXPECT_NE(err({.tokens = 1, .top_k = -1}, p).find("--top-k"), std::string::npos);
  EXPECT_NE(err({.tokens = 1}, {}).find("--prompt"), std::string::npos);
  EXPECT_NE(err({.tokens = 1}, {3}, 3).find("outside [0, 3)"), std::string::npos);
  ModelSpec mlp;
  mlp.input = {4};
  mlp.layers = {LayerSpec{.kind = "linear", .out = 2}};
  std::unique_ptr<Model> seq = Model::Create(mlp).value();
  Result<std::vector<int32_t>> r = SampleTokens(*seq, p, 2, SampleOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs a GPT model"), std::string::npos);
}

// ---- PyTorch (label "slow"): tools/hf_gpt2_check.py rebuilds GPT-2 from the exported directory.

TEST(HfGpt2CheckTest, PyTorchReproducesTheLossAndLogits) {
  if (!testing::TorchAvailable()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch; install python3-torch to run "
                    "tools/hf_gpt2_check.py against meshlearn's loss and logits";
  }
  Result<TaskSpec> t =
      TaskSpec::Load(Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/tiny-gpt.toml");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), *t);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  for (int i = 0; i < 60; ++i) (*tr)->Step();
  const std::string dir = std::string(MESHLEARN_BINARY_DIR) + "/engine_model_test_hf";
  ASSERT_TRUE(SaveHfGpt2(Env::Default(), dir + "/model", (*tr)->state(), VocabOf(**tr)).ok());
  // The validation windows exactly as Evaluate takes them, and meshlearn's loss over them.
  const TaskSpec& task = (*tr)->task();
  const TaskData& d = (*tr)->data();
  Model& m = *(*tr)->state().model;
  const EvalResult ev = Evaluate(m, task, d);
  const int64_t T = task.seq_len;
  const int64_t n = EvalWindowCount(task, d);
  Batch windows = EvalWindows(task, d, 0, n);
  ASSERT_EQ(ev.samples, n * T);
  Batch prompt = MakeTokenBatch(d.val_tokens, {7}, 40);
  m.Forward(prompt, ForwardOptions{});
  TensorView lg = m.logits();
  SafetensorsWriter w;
  w.AddI32("tokens", {n, T}, windows.tokens.data());
  w.AddI32("targets", {n, T}, windows.targets.data());
  w.AddI32("prompt", {40}, prompt.tokens.data());
  w.AddF32("prompt_logits", lg.shape(), lg.data());
  char loss[64];
  std::snprintf(loss, sizeof(loss), "%.17g", ev.loss);
  w.SetMetadata("val_loss", loss);
  ASSERT_TRUE(w.Write(Env::Default(), dir + "/fixture.safetensors").ok());
  const std::string cmd = "/usr/bin/python3 " + std::string(MESHLEARN_SOURCE_DIR) +
                          "/tools/hf_gpt2_check.py " + dir + "/model --fixture " + dir +
                          "/fixture.safetensors";
  std::printf("  %s\n", cmd.c_str());
  std::fflush(stdout);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace meshlearn::engine
