// meshlearn train TASK.toml / meshlearn eval MODEL --task TASK.toml: deterministic training on this
// machine (the engine, engine/), with a progress bar, evaluation, a safetensors model, a resumable
// checkpoint and a JSON report whose state hash a verifier can reproduce bit for bit.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/hf_gpt2.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/unit_executor.h"

namespace meshlearn::cli {
namespace {

using engine::EvalResult;
using engine::TaskSpec;
using engine::Trainer;

struct TrainArgs {
  std::string task;
  int64_t steps = -1;
  std::string out;
  int64_t seed = -1;
  int64_t stream = -1;
  std::string resume;
  int64_t checkpoint_every = 0;
  int threads = 0;
  std::string simd;
  bool no_eval = false;
};

struct EvalArgs {
  std::string model;
  std::string task;
  int threads = 0;
  std::string simd;
};

// MESHLEARN_SIMD / MESHLEARN_THREADS, then --simd / --threads on top. Results never depend on it.
Status ConfigureKernels(const std::string& simd, int threads) {
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  engine::KernelConfig c = engine::GetKernelConfig();
  if (!simd.empty()) {
    Result<engine::SimdPath> p = engine::ParseSimdPath(simd);
    if (!p.ok()) return p.status().WithPrefix("--simd");
    c.simd = *p;
  }
  if (threads > 0) c.threads = threads;
  Status s = engine::SetKernelConfig(c);
  return s.ok() ? s : s.WithPrefix("--simd/--threads");
}

nlohmann::json KernelJson() {
  const engine::KernelConfig& c = engine::GetKernelConfig();
  return {{"simd", std::string(engine::SimdPathName(c.simd))}, {"threads", c.threads}};
}

Status RunTrain(GlobalOptions& g, const TrainArgs& a) {
  ML_RETURN_IF_ERROR(ConfigureKernels(a.simd, a.threads));
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(TaskSpec task, TaskSpec::Load(env, a.task));
  if (a.steps >= 0) {
    task.steps = a.steps;
    task.optimizer.total_steps = a.steps;
  }
  if (a.seed >= 0) task.seed = static_cast<uint64_t>(a.seed);
  if (a.stream >= 0) task.stream = static_cast<uint64_t>(a.stream);
  const std::string out =
      a.out.empty() ? JoinPath("out", task.name.empty() ? std::string("task") : task.name) : a.out;
  ML_RETURN_IF_ERROR(env->CreateDirs(out));

  ML_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> tr, Trainer::Create(env, task));
  const TaskSpec& t = tr->task();
  if (!a.resume.empty()) {
    // A checkpoint file, or a Hugging Face directory written from one (meshlearn export).
    Result<engine::LoadedModel> m = engine::LoadModel(env, a.resume);
    if (!m.ok()) return m.status().WithPrefix("--resume " + a.resume);
    Status s = tr->Resume(std::move(m->state));
    if (!s.ok()) return s.WithPrefix("--resume " + a.resume);
  }
  // A text task's vocabulary goes into the model and checkpoint files (generate, export).
  std::map<std::string, std::string> vocab_meta;
  if (!tr->data().vocab.chars.empty()) {
    vocab_meta[engine::kVocabMetadataKey] = engine::VocabToJson(tr->data().vocab.chars);
  }
  const std::string ckpt_path = JoinPath(out, "checkpoint.safetensors");
  const std::string model_path = JoinPath(out, "model.safetensors");
  const std::string report_path = JoinPath(out, "report.json");
  if (!g.json) {
    std::fprintf(stderr, "task %s: %lld params, %lld steps of %lld %s, kernels %s x%d threads\n",
                 t.name.c_str(), static_cast<long long>(tr->state().model->NumParameters()),
                 static_cast<long long>(t.steps), static_cast<long long>(t.batch_size),
                 tr->data().tokens ? "sequences" : "samples",
                 std::string(engine::SimdPathName(engine::GetKernelConfig().simd)).c_str(),
                 engine::GetKernelConfig().threads);
  }

  const int64_t first_step = tr->state().step;
  ProgressBar bar("train", t.steps, "step", !g.json);
  bar.Update(first_step);
  auto start = std::chrono::steady_clock::now();
  double loss_ema = 0, last_loss = 0;
  bool have_ema = false;
  while (tr->state().step < t.steps) {
    last_loss = tr->Step();
    if (!std::isfinite(last_loss)) {
      return FailedPrecondition(fmt::format(
          "{}: loss became {} at step {}; lower optimizer.lr or set optimizer.grad_clip", t.path,
          last_loss, tr->state().step - 1));
    }
    loss_ema = have_ema ? 0.95 * loss_ema + 0.05 * last_loss : last_loss;
    have_ema = true;
    const int64_t step = tr->state().step;
    if (a.checkpoint_every > 0 && step % a.checkpoint_every == 0 && step < t.steps) {
      ML_RETURN_IF_ERROR(engine::SaveCheckpoint(env, ckpt_path, tr->state(), vocab_meta));
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate =
        secs > 0 ? static_cast<double>((step - first_step) * t.batch_size) / secs : 0;
    bar.Update(step, fmt::format("loss {:.4f}  {:.0f} samples/s", loss_ema, rate));
  }
  const double train_secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t trained = tr->state().step - first_step;
  const double samples_per_sec =
      train_secs > 0 ? static_cast<double>(trained * t.batch_size) / train_secs : 0;
  bar.Finish(fmt::format("loss {:.4f}", loss_ema));

  EvalResult ev;
  if (!a.no_eval) ev = tr->Evaluate();
  const std::string hash = engine::StateHash(tr->state()).ToHex();
  ML_RETURN_IF_ERROR(engine::SaveCheckpoint(env, ckpt_path, tr->state(), vocab_meta));
  std::map<std::string, std::string> model_meta = vocab_meta;
  model_meta["task"] = t.name;
  model_meta["train_state_hash"] = hash;
  ML_RETURN_IF_ERROR(engine::SaveModel(env, model_path, tr->state(), model_meta));
  nlohmann::json report = {
      {"task", t.name},
      {"task_file", t.path},
      {"steps", tr->state().step},
      {"batch_size", t.batch_size},
      {"seed", t.seed},
      {"stream", t.stream},
      {"parameters", tr->state().model->NumParameters()},
      {"final_loss", last_loss},
      {"final_loss_ema", loss_ema},
      {"state_hash", hash},
      {"train_seconds", train_secs},
      {"samples_per_sec", samples_per_sec},
      {"kernels", KernelJson()},
      {"model", model_path},
      {"checkpoint", ckpt_path},
  };
  if (!tr->data().data_root.IsZero()) {
    report["data_root"] = tr->data().data_root.ToHex();
    report["corpus_files"] = tr->data().corpus_files;
    report["corpus_bytes"] = tr->data().corpus_bytes;
  }
  if (!a.no_eval) {
    report["test_loss"] = ev.loss;
    report["test_samples"] = ev.samples;
    if (ev.accuracy >= 0) report["test_accuracy"] = ev.accuracy;
  }
  ML_RETURN_IF_ERROR(WriteReportFile(report_path, report, {"task_file", "model", "checkpoint"}));
  g.Output(report, [&] {
    std::cout << fmt::format("trained {} steps in {} ({:.0f} samples/s)\n", trained,
                             ProgressBar::FormatDuration(train_secs), samples_per_sec);
    std::cout << fmt::format("final loss   {:.4f} (last batch {:.4f})\n", loss_ema, last_loss);
    if (!a.no_eval) {
      if (ev.accuracy >= 0) {
        std::cout << fmt::format("test         loss {:.4f}, accuracy {:.4f} ({} samples)\n",
                                 ev.loss, ev.accuracy, ev.samples);
      } else {
        std::cout << fmt::format("validation   loss {:.4f} ({} tokens)\n", ev.loss, ev.samples);
      }
    }
    std::cout << "state hash   " << hash << "\n";
    std::cout << "model        " << model_path << "\ncheckpoint   " << ckpt_path
              << "\nreport       " << report_path << "\n";
  });
  return Status::Ok();
}

Status RunEval(GlobalOptions& g, const EvalArgs& a) {
  ML_RETURN_IF_ERROR(ConfigureKernels(a.simd, a.threads));
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(TaskSpec task, TaskSpec::Load(env, a.task));
  // A meshlearn model or checkpoint file, or a Hugging Face GPT-2 directory (meshlearn export).
  ML_ASSIGN_OR_RETURN(engine::LoadedModel loaded, engine::LoadModel(env, a.model));
  engine::TrainState& st = loaded.state;
  ML_ASSIGN_OR_RETURN(engine::TaskData data, engine::LoadTaskData(env, task));
  if (st.model->spec().ToJson() != task.model.ToJson()) {
    return InvalidArgument(a.model + ": the model does not match " + a.task + "'s [model] (" +
                           st.model->spec().ToJson() + " vs " + task.model.ToJson() + ")");
  }
  EvalResult ev = engine::Evaluate(*st.model, task, data);
  // The weights hash: BLAKE2b over the weights in model order (node::HashFloats), the hash that
  // `task fetch`, `meshlearn diloco` and devnet's report.json print for the same weights. A file
  // written by `task fetch` also names the task's state (its blob id, as the ledger recorded it)
  // it came from.
  std::vector<float> weights;
  for (const engine::Param& p : st.model->params()) {
    weights.insert(weights.end(), p.value.data(), p.value.data() + p.value.size());
  }
  const std::string weights_hash = node::HashFloats(weights).ToHex();
  std::map<std::string, std::string> meta;
  if (Result<engine::SafetensorsFile> f = engine::SafetensorsFile::Read(
          env, loaded.hf ? JoinPath(a.model, engine::kHfModelFile) : a.model);
      f.ok()) {
    meta = f->metadata();
  }
  auto get = [&](const char* k) { return meta.count(k) ? meta.at(k) : std::string(); };
  const std::string origin_task = get("meshlearn.task"), origin_state = get("meshlearn.state"),
                    origin_round = get("meshlearn.round");
  const bool from_network = !origin_task.empty() || get("meshlearn.network") == "diloco";
  nlohmann::json j = {{"model", a.model},       {"task", task.name},
                      {"loss", ev.loss},        {"samples", ev.samples},
                      {"weights_hash", weights_hash}, {"kernels", KernelJson()}};
  // A network model has no optimizer step of its own (its rounds are the ledger's).
  if (!from_network) j["step"] = st.step;
  if (!origin_task.empty()) {
    j["task_id"] = origin_task;
    j["state"] = origin_state;
    int64_t round = -1;
    const auto [end, ec] = std::from_chars(origin_round.data(),
                                           origin_round.data() + origin_round.size(), round);
    if (ec == std::errc() && end == origin_round.data() + origin_round.size()) j["round"] = round;
  }
  if (ev.accuracy >= 0) j["accuracy"] = ev.accuracy;
  if (ev.accuracy < 0) j["perplexity"] = std::exp(ev.loss);
  g.Output(j, [&] {
    std::string what = from_network ? "" : fmt::format(" (step {})", st.step);
    if (!origin_task.empty()) {
      what = fmt::format(" (task {} round {})", origin_task.substr(0, 12), origin_round);
    }
    std::cout << fmt::format("{}{} on {}: loss {:.4f}", a.model, what, task.name, ev.loss);
    if (ev.accuracy >= 0) {
      std::cout << fmt::format(", accuracy {:.4f}", ev.accuracy);
    } else {
      std::cout << fmt::format(", perplexity {:.2f}", std::exp(ev.loss));
    }
    std::cout << fmt::format(" over {} {}\nweights hash {}\n", ev.samples,
                             ev.accuracy >= 0 ? "samples" : "tokens", weights_hash);
    if (!origin_task.empty()) {
      // `meshlearn task verify-model TASK FILE` checks it against the ledger (docs/submitters.md).
      std::cout << "state " << origin_state << " of task " << origin_task << "\n";
    }
  });
  return Status::Ok();
}

void AddTrain(CLI::App& root, GlobalOptions& g) {
  static TrainArgs a;
  CLI::App* cmd = root.add_subcommand("train", "Train a model from a task file, deterministically");
  cmd->add_option("task", a.task, "Task file (TOML): data, model, optimizer, steps")->required();
  cmd->add_option("--steps", a.steps, "Override [train].steps");
  cmd->add_option("--out", a.out, "Output directory (default out/<task name>)");
  cmd->add_option("--seed", a.seed, "Override [task].seed (init, data order, dropout)");
  cmd->add_option("--stream", a.stream, "Override [task].stream (work-unit id: which batches)");
  cmd->add_option("--resume", a.resume, "Continue from a checkpoint.safetensors of the same task");
  cmd->add_option("--checkpoint-every", a.checkpoint_every,
                  "Also write OUT/checkpoint.safetensors every N steps");
  cmd->add_option("--threads", a.threads, "Kernel threads (default $MESHLEARN_THREADS or all)");
  cmd->add_option("--simd", a.simd, "Kernel path: auto, scalar, avx2, avx512 ($MESHLEARN_SIMD)");
  cmd->add_flag("--no-eval", a.no_eval, "Skip the evaluation on the test split");
  cmd->footer(
      "Writes OUT/model.safetensors (parameters), OUT/checkpoint.safetensors (parameters +\n"
      "optimizer state, for --resume) and OUT/report.json (final loss, test accuracy, state hash,\n"
      "samples/s). The state hash is the same on every machine, thread count and SIMD path.\n"
      "Examples:\n"
      "  meshlearn train examples/fashion-mlp.toml\n"
      "  meshlearn train examples/fashion-cnn.toml --steps 500 --out /tmp/cnn\n"
      "  meshlearn --json train examples/code-gpt.toml --steps 30 --threads 1 --no-eval\n"
      "  meshlearn train examples/tiny-gpt.toml --threads 1 --simd scalar --json\n"
      "  meshlearn train examples/tiny-gpt.toml --steps 800 --resume "
      "out/tiny-gpt/checkpoint.safetensors\n"
      "  meshlearn eval out/fashion-mlp/model.safetensors --task examples/fashion-mlp.toml\n"
      "A text task's model carries its vocabulary: `meshlearn generate OUT/model.safetensors`\n"
      "samples from it, `meshlearn export OUT/checkpoint.safetensors --out DIR` writes the\n"
      "Hugging Face GPT-2 layout (train --resume DIR and eval DIR read it back).");
  cmd->callback([&g] { g.Exit(RunTrain(g, a)); });

  static EvalArgs e;
  CLI::App* ev = root.add_subcommand("eval", "Evaluate a trained model on a task's test split");
  ev->add_option("model", e.model,
                 "Model or checkpoint (.safetensors), or a Hugging Face GPT-2 directory")
      ->required();
  ev->add_option("--task", e.task, "Task file whose data (test split) to use")->required();
  ev->add_option("--threads", e.threads, "Kernel threads");
  ev->add_option("--simd", e.simd, "Kernel path: auto, scalar, avx2, avx512");
  ev->footer(
      "Examples:\n"
      "  meshlearn eval out/fashion-mlp/model.safetensors --task examples/fashion-mlp.toml\n"
      "  meshlearn --json eval out/tiny-gpt/model.safetensors --task examples/tiny-gpt.toml\n"
      "  meshlearn eval out/code-gpt/hf --task examples/code-gpt.toml");
  ev->callback([&g] { g.Exit(RunEval(g, e)); });
}

}  // namespace

MESHLEARN_COMMAND(30, AddTrain);

}  // namespace meshlearn::cli
