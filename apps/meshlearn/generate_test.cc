// `meshlearn generate` and `meshlearn export` as a user runs them: deterministic text for a seed,
// the Hugging Face directory read back by generate, eval and train --resume bit for bit, and
// clear errors naming the option or the file.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using nlohmann::json;

const std::string kSrc = MESHLEARN_SOURCE_DIR;

// One tiny GPT for every test here: 30 steps of examples/tiny-gpt.toml (a few seconds), trained
// once per process.
const std::string& TrainedDir() {
  static const std::string dir = [] {
    std::string d = meshlearn::process_test::TempDir("generate");
    CmdResult r = Meshlearn(
        "--json train " + kSrc + "/examples/tiny-gpt.toml --steps 30 --out " + d + "/run --no-eval",
        d, false);
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  return dir;
}

json Generate(const std::string& model, const std::string& args) {
  CmdResult r = Meshlearn("--json generate " + model + " " + args, TrainedDir(), false);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? json::parse(r.out) : json();
}

TEST(Generate, TheSameSeedGivesTheSameText) {
  const std::string model = TrainedDir() + "/run/model.safetensors";
  json a = Generate(model, "--prompt 'The ' --tokens 60 --seed 7");
  json b = Generate(model, "--prompt 'The ' --tokens 60 --seed 7");
  json c = Generate(model, "--prompt 'The ' --tokens 60 --seed 8");
  ASSERT_TRUE(a.contains("text")) << a.dump();
  EXPECT_EQ(a["token_ids"].size(), 60u);
  EXPECT_EQ(a["text"], b["text"]);
  EXPECT_EQ(a["token_ids"], b["token_ids"]);
  EXPECT_NE(a["token_ids"], c["token_ids"]);
  EXPECT_EQ(a["seed"], 7);
  // Human output: the prompt, then the same continuation.
  CmdResult h =
      Meshlearn("generate " + model + " --prompt 'The ' --tokens 60 --seed 7", TrainedDir(), false);
  ASSERT_EQ(h.code, 0) << h.out;
  EXPECT_EQ(h.out, "The " + a["text"].get<std::string>() + "\n");
  // Greedy is the same whatever the seed; the thread count changes nothing.
  EXPECT_EQ(
      Generate(model, "--prompt 'The ' --tokens 30 --temperature 0 --seed 1")["text"],
      Generate(model, "--prompt 'The ' --tokens 30 --temperature 0 --seed 2 --threads 1")["text"]);
  CmdResult help = Meshlearn("generate --help", TrainedDir());
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Examples:"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--top-k"), std::string::npos) << help.out;
}

TEST(Generate, BadInputsNameTheOption) {
  const std::string model = TrainedDir() + "/run/model.safetensors";
  struct Case {
    std::string args, want;
  };
  for (const Case& k : std::vector<Case>{
           {"--prompt 'The ' --tokens 0", "--tokens must be >= 1, got 0"},
           {"--prompt 'The ' --tokens -3", "--tokens must be >= 1"},
           {"--prompt 'The ' --temperature -0.5", "--temperature must be >= 0"},
           {"--prompt 'The ' --top-k -1", "--top-k must be >= 0, got -1"},
           {"--prompt ''", "--prompt must not be empty"},
           {"--prompt 'The ~'", "--prompt: '~' at position 4 is not in the model's vocabulary"},
           {"--prompt \"$(printf '\\001')\"",
            "--prompt: byte 0x01 at position 0 is not in the model's "
            "vocabulary"},
       }) {
    CmdResult r = Meshlearn("generate " + model + " " + k.args, TrainedDir());
    EXPECT_EQ(r.code, 1) << k.args << ": " << r.out;
    EXPECT_NE(r.out.find(k.want), std::string::npos) << "want '" << k.want << "' in: " << r.out;
  }
  // A missing model, and a file that is not a model.
  CmdResult missing = Meshlearn("generate /nonexistent.safetensors --prompt x", TrainedDir());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("/nonexistent.safetensors"), std::string::npos) << missing.out;
  CmdResult report =
      Meshlearn("generate " + TrainedDir() + "/run/report.json --prompt x", TrainedDir());
  EXPECT_EQ(report.code, 1);
  EXPECT_NE(report.out.find("report.json"), std::string::npos) << report.out;
  // A model that is not a GPT.
  if (std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    const std::string mlp = TrainedDir() + "/mlp";
    ASSERT_EQ(
        Meshlearn("train " + kSrc + "/examples/fashion-mlp.toml --steps 1 --no-eval --out " + mlp,
                  TrainedDir())
            .code,
        0);
    CmdResult r = Meshlearn("generate " + mlp + "/model.safetensors --prompt x", TrainedDir());
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("a sequential model; generate needs a GPT"), std::string::npos) << r.out;
  }
}

TEST(Export, TheHuggingFaceDirectoryReadsBackBitForBit) {
  const std::string run = TrainedDir() + "/run";
  const std::string hf = TrainedDir() + "/hf";
  CmdResult ex = Meshlearn("--json export " + run + "/checkpoint.safetensors --out " + hf,
                           TrainedDir(), false);
  ASSERT_EQ(ex.code, 0) << ex.out;
  json e = json::parse(ex.out);
  EXPECT_EQ(e["files"].size(), 4u);  // with optimizer.safetensors
  for (const char* f :
       {"model.safetensors", "config.json", "vocab.json", "optimizer.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(hf + "/" + f)) << f;
  }
  json config = json::parse(ReadText(hf + "/config.json"));
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["n_layer"], 2);

  // generate: the same text from the directory as from the model file.
  EXPECT_EQ(Generate(hf, "--prompt 'The ' --tokens 50 --seed 3")["text"],
            Generate(run + "/model.safetensors", "--prompt 'The ' --tokens 50 --seed 3")["text"]);
  // eval: the same loss and weights.
  CmdResult a = Meshlearn("--json eval " + hf + " --task " + kSrc + "/examples/tiny-gpt.toml",
                          TrainedDir(), false);
  CmdResult b = Meshlearn(
      "--json eval " + run + "/model.safetensors --task " + kSrc + "/examples/tiny-gpt.toml",
      TrainedDir(), false);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(json::parse(a.out)["loss"], json::parse(b.out)["loss"]);
  EXPECT_EQ(json::parse(a.out)["weights_hash"], json::parse(b.out)["weights_hash"]);
  // train --resume DIR: the state read back from the directory (weights and AdamW moments) is
  // the one trained, bit for bit. (Continuing from it is HfGpt2Test.ResumingFromTheLayout...:
  // here --steps would change the cosine schedule's length, which resume refuses.)
  CmdResult resumed =
      Meshlearn("--json train " + kSrc + "/examples/tiny-gpt.toml --steps 30 " +
                    "--no-eval --resume " + hf + " --out " + TrainedDir() + "/resumed",
                TrainedDir(), false);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(json::parse(resumed.out)["state_hash"],
            json::parse(ReadText(run + "/report.json"))["state_hash"]);

  // A broken config.json is named with its field.
  std::ofstream(hf + "/config.json") << "{\"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4}";
  CmdResult bad = Meshlearn("generate " + hf + " --prompt 'The '", TrainedDir());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find(hf + "/config.json: field 'vocab_size': missing"), std::string::npos)
      << bad.out;
}

}  // namespace
