// meshlearn generate MODEL --prompt TEXT: samples text from a trained GPT, deterministically for a
// given seed (engine/generate.h), so a submitter sees what the network trained.
// meshlearn export MODEL --out DIR: writes a GPT in the Hugging Face GPT-2 layout (hf_gpt2.h).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/generate.h"
#include "meshlearn/engine/hf_gpt2.h"
#include "meshlearn/engine/train.h"

namespace meshlearn::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int threads = 0;
};

struct ExportArgs {
  std::string model;
  std::string out;
  std::string task;
};

// `bytes` as UTF-8 for JSON: every invalid sequence becomes U+FFFD (the exact bytes are the
// token ids next to it).
std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= bytes.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    }
    if (ok && len == 3) {
      const unsigned char c1 = static_cast<unsigned char>(bytes[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // overlong, surrogates
    }
    if (ok && len == 4) {
      const unsigned char c1 = static_cast<unsigned char>(bytes[i + 1]);
      ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

Status RunGenerate(GlobalOptions& g, const GenerateArgs& a) {
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  if (a.threads > 0) {
    engine::KernelConfig c = engine::GetKernelConfig();
    c.threads = a.threads;
    ML_RETURN_IF_ERROR(engine::SetKernelConfig(c));
  }
  // Options first: a mistyped option is reported before a large model is read.
  if (a.tokens <= 0) return InvalidArgument(fmt::format("--tokens must be >= 1, got {}", a.tokens));
  if (!(a.temperature >= 0.0) || !std::isfinite(a.temperature)) {
    return InvalidArgument(fmt::format(
        "--temperature must be >= 0 (0 = always the likeliest), got {}", a.temperature));
  }
  if (a.top_k < 0) return InvalidArgument(fmt::format("--top-k must be >= 0, got {}", a.top_k));
  if (a.prompt.empty()) return InvalidArgument("--prompt must not be empty");
  Env* env = Env::Default();
  Result<engine::LoadedModel> loaded = engine::LoadModel(env, a.model);
  if (!loaded.ok()) return loaded.status();
  engine::Model& model = *loaded->state.model;
  if (model.spec().kind != "gpt") {
    return InvalidArgument(a.model + ": a " + model.spec().kind +
                           " model; generate needs a GPT (model.kind = \"gpt\")");
  }
  const std::vector<uint8_t>& vocab = loaded->vocab;
  if (vocab.empty()) {
    return InvalidArgument(a.model +
                           ": the model has no vocabulary (trained on token files, or written "
                           "before models stored one); generate needs a model trained on text");
  }
  int32_t id_of[256];
  std::fill(std::begin(id_of), std::end(id_of), -1);
  for (size_t i = 0; i < vocab.size(); ++i) id_of[vocab[i]] = static_cast<int32_t>(i);
  std::vector<int32_t> prompt;
  for (size_t i = 0; i < a.prompt.size(); ++i) {
    const auto b = static_cast<unsigned char>(a.prompt[i]);
    if (id_of[b] < 0) {
      const std::string shown = b >= 0x20 && b < 0x7f ? fmt::format("'{}'", static_cast<char>(b))
                                                      : fmt::format("byte 0x{:02x}", b);
      return InvalidArgument(fmt::format(
          "--prompt: {} at position {} is not in the model's vocabulary ({} characters); use "
          "characters of the text it was trained on",
          shown, i, vocab.size()));
    }
    prompt.push_back(id_of[b]);
  }
  engine::SampleOptions o{
      .tokens = a.tokens, .temperature = a.temperature, .top_k = a.top_k, .seed = a.seed};
  ML_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      engine::SampleTokens(model, prompt, static_cast<int64_t>(vocab.size()), o));
  std::string text;
  for (int32_t id : ids) text.push_back(static_cast<char>(vocab[id]));
  nlohmann::json j = {{"model", a.model},        {"prompt", Utf8Lossy(a.prompt)},
                      {"text", Utf8Lossy(text)}, {"token_ids", ids},
                      {"tokens", a.tokens},      {"temperature", a.temperature},
                      {"top_k", a.top_k},        {"seed", a.seed}};
  g.Output(j, [&] { std::cout << a.prompt << text << std::endl; });
  return Status::Ok();
}

Status RunExport(GlobalOptions& g, const ExportArgs& a) {
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(engine::LoadedModel m, engine::LoadModel(env, a.model));
  if (m.state.model->spec().kind != "gpt") {
    return InvalidArgument(a.model + ": a " + m.state.model->spec().kind +
                           " model; the Hugging Face GPT-2 layout is for GPT models");
  }
  std::vector<uint8_t> vocab = m.vocab;
  if (!a.task.empty()) {
    // The vocabulary of the task's text (for a model written before models stored one).
    ML_ASSIGN_OR_RETURN(engine::TaskSpec task, engine::TaskSpec::Load(env, a.task));
    ML_ASSIGN_OR_RETURN(engine::TaskData data, engine::LoadTaskData(env, task));
    if (data.vocab.chars.empty()) return InvalidArgument("--task " + a.task + ": not a text task");
    if (!vocab.empty() && vocab != data.vocab.chars) {
      return InvalidArgument("--task " + a.task + ": its vocabulary differs from the one " +
                             a.model + " stores");
    }
    vocab = data.vocab.chars;
  }
  if (vocab.empty() && m.state.model->spec().gpt.vocab_size > 256) {
    return InvalidArgument(a.model +
                           ": no stored vocabulary; pass --task with the text task "
                           "it was trained on");
  }
  Status s = engine::SaveHfGpt2(env, a.out, m.state, vocab);
  if (!s.ok()) return s.WithPrefix("--out " + a.out);
  const bool with_optimizer = m.state.optimizer != nullptr;
  nlohmann::json j = {
      {"model", a.model},
      {"out", a.out},
      {"files", with_optimizer
                    ? std::vector<std::string>{engine::kHfModelFile, engine::kHfConfigFile,
                                               engine::kHfVocabFile, engine::kHfOptimizerFile}
                    : std::vector<std::string>{engine::kHfModelFile, engine::kHfConfigFile,
                                               engine::kHfVocabFile}},
      {"step", m.state.step},
      {"parameters", m.state.model->NumParameters()},
      {"vocab_size", m.state.model->spec().gpt.vocab_size},
      {"state_hash", with_optimizer ? engine::StateHash(m.state).ToHex()
                                    : engine::ModelStateHash(m.state).ToHex()}};
  g.Output(j, [&] {
    std::cout << fmt::format(
        "wrote {} (Hugging Face GPT-2: model.safetensors, config.json, "
        "vocab.json{}) from {}, step {}\n",
        a.out, with_optimizer ? ", optimizer.safetensors" : "", a.model, m.state.step);
  });
  return Status::Ok();
}

void AddGenerate(CLI::App& root, GlobalOptions& g) {
  static GenerateArgs a;
  CLI::App* cmd = root.add_subcommand("generate", "Sample text from a trained GPT");
  cmd->add_option("model", a.model,
                  "A GPT trained on text: model or checkpoint .safetensors, or a Hugging Face "
                  "GPT-2 directory")
      ->required();
  cmd->add_option("--prompt", a.prompt, "Text to continue (characters of the model's vocabulary)")
      ->required();
  OwnRange(cmd->add_option("--tokens", a.tokens, "How many characters to generate"))
      ->capture_default_str();
  cmd->add_option("--temperature", a.temperature,
                  "Softmax temperature; 0 = always the likeliest character")
      ->capture_default_str();
  OwnRange(cmd->add_option("--top-k", a.top_k, "Sample among the K likeliest only; 0 = all"))
      ->capture_default_str();
  cmd->add_option("--seed", a.seed, "Sampling seed: the same seed gives the same text")
      ->capture_default_str();
  cmd->add_option("--threads", a.threads, "Kernel threads (the text does not depend on it)");
  cmd->footer(
      "Prints the prompt and its continuation. The text is a pure function of the model, the\n"
      "prompt and the options, on every machine (docs/engine.md, \"Generating text\"). --json\n"
      "prints {text, token_ids, ...}.\n"
      "Examples:\n"
      "  meshlearn generate out/code-gpt/model.safetensors --prompt \"def \" --tokens 300\n"
      "  meshlearn generate out/code-gpt/hf --prompt \"import \" --temperature 0.8 --top-k 10 "
      "--seed 7\n"
      "  meshlearn --json generate out/tiny-gpt/model.safetensors --prompt \"The \" --seed 1");
  cmd->callback([&g] { g.Exit(RunGenerate(g, a)); });

  static ExportArgs e;
  CLI::App* ex = root.add_subcommand(
      "export", "Write a trained GPT in the Hugging Face GPT-2 layout (safetensors + config.json)");
  ex->add_option("model", e.model, "Model or checkpoint (.safetensors) of a GPT")->required();
  ex->add_option("--out", e.out, "Directory to write")->required();
  ex->add_option("--task", e.task,
                 "Text task whose vocabulary to write (for a model that stores none)");
  ex->footer(
      "Writes DIR/model.safetensors (GPT2LMHeadModel names, Conv1D [in, out] weights),\n"
      "DIR/config.json (GPT2Config) and DIR/vocab.json (token id -> character); from a\n"
      "checkpoint also DIR/optimizer.safetensors, so `meshlearn train TASK --resume DIR`\n"
      "continues bit for bit. transformers.GPT2LMHeadModel.from_pretrained(DIR) loads it;\n"
      "tools/hf_gpt2_check.py checks PyTorch's loss and logits against meshlearn's.\n"
      "Examples:\n"
      "  meshlearn export out/code-gpt/checkpoint.safetensors --out out/code-gpt/hf\n"
      "  meshlearn eval out/code-gpt/hf --task examples/code-gpt.toml\n"
      "  meshlearn generate out/code-gpt/hf --prompt \"def \" --seed 1");
  ex->callback([&g] { g.Exit(RunExport(g, e)); });
}

}  // namespace

MESHLEARN_COMMAND(32, AddGenerate);

}  // namespace meshlearn::cli
