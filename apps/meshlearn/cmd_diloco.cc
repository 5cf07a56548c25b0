// meshlearn diloco TASK.toml: runs a network task's DiLoCo rounds inside this one process — every
// unit of every round in turn, the task's aggregation rule, the outer optimizer — exactly what the
// network computes. It is the reference a devnet's final model must equal, the baseline for
// network speed-ups, and a bench for aggregation rules against garbage-sending solvers.
#include <unistd.h>

#include <cmath>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::cli {
namespace {

struct DilocoArgs {
  std::string task;
  std::string out;
  int64_t rounds = 0;
  std::string aggregation;
  std::string garbage = "none";
  int64_t garbage_units = 0;
};

Status RunDiloco(GlobalOptions& g, const DilocoArgs& a, nlohmann::json* report) {
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Load(env, a.task));
  ML_ASSIGN_OR_RETURN(protocol::NetworkSpec net, protocol::NetworkSpec::FromConfig(cfg));
  if (a.rounds > 0) net.rounds = static_cast<uint32_t>(a.rounds);
  if (!a.aggregation.empty()) {
    Result<protocol::AggregationRule> rule = protocol::ParseAggregationRule(a.aggregation);
    if (!rule.ok()) return rule.status().WithPrefix("--aggregation");
    net.aggregation.rule = *rule;
  }
  node::LocalDilocoOptions opt;
  Result<node::GarbageKind> garbage = node::ParseGarbageKind(a.garbage);
  if (!garbage.ok()) return garbage.status().WithPrefix("--garbage");
  opt.garbage = *garbage;
  if (a.garbage_units < 0 || a.garbage_units > net.units_per_round) {
    return InvalidArgument("--garbage-units must be in [0, units_per_round=" +
                           std::to_string(net.units_per_round) + "], got " +
                           std::to_string(a.garbage_units));
  }
  opt.garbage_units = static_cast<uint32_t>(a.garbage_units);

  ML_ASSIGN_OR_RETURN(engine::TaskSpec task, engine::TaskSpec::Load(env, a.task));
  ML_ASSIGN_OR_RETURN(std::unique_ptr<engine::Trainer> trainer, engine::Trainer::Create(env, task));
  // A pipeline task (network.stages > 1) trains here unsplit, with its micro-batches: by the
  // engine's pipeline contract (engine/pipeline.h) that is, bit for bit, what its stages compute.
  ML_ASSIGN_OR_RETURN(
      engine::PipelineCut cut,
      engine::TaskPipelineCut(trainer->task(), static_cast<int>(net.stages), net.cut));
  const engine::TaskSpec& tk = trainer->task();
  ML_ASSIGN_OR_RETURN(std::vector<engine::StageCost> stage_costs,
                      engine::CutCosts(tk.model, tk.optimizer, cut, tk.batch_size, tk.seq_len,
                                       tk.micro_batches));
  nlohmann::json pipeline = {{"stages", net.stages},
                             {"replicas", net.units_per_round},
                             {"micro_batches", tk.micro_batches},
                             {"cut", cut.bounds}};
  nlohmann::json per_stage = nlohmann::json::array();
  for (const engine::StageCost& c : stage_costs) {
    per_stage.push_back({{"parameters", c.parameters},
                         {"flops_per_step", c.flops},
                         {"param_bytes", c.param_bytes},
                         {"optimizer_bytes", c.optimizer_bytes},
                         {"activation_bytes", c.activation_bytes}});
  }
  pipeline["per_stage"] = per_stage;
  if (net.stages > 1 && !g.json) {
    std::cout << fmt::format("pipeline: {} stages x {} replicas, {} micro-batches, cut [{}] "
                             "(trained unsplit here: the pipeline's result)\n",
                             net.stages, net.units_per_round, tk.micro_batches,
                             fmt::join(cut.bounds, ", "))
              << std::flush;
  }

  const int64_t total_units = int64_t{net.rounds} * net.units_per_round;
  ProgressBar bar("diloco", total_units, "units", !g.json);
  std::string last_status;
  opt.on_unit = [&](uint32_t r, uint32_t i) {
    bar.Update(int64_t{r} * net.units_per_round + i + 1, last_status);
  };
  nlohmann::json rounds = nlohmann::json::array();
  opt.on_round = [&](const node::RoundReport& rr) {
    // Rounds are numbered from 0, as the ledger and `task status` number them.
    last_status = rr.eval.accuracy >= 0
                      ? fmt::format("round {} loss {:.4f} acc {:.4f}", rr.round, rr.eval.loss,
                                    rr.eval.accuracy)
                      : fmt::format("round {} loss {:.4f}", rr.round, rr.eval.loss);
    rounds.push_back({{"round", rr.round},
                      {"train_loss", rr.train_loss},
                      {"test_loss", rr.eval.loss},
                      {"test_accuracy", rr.eval.accuracy},
                      {"rejected_units", rr.rejected_units},
                      {"global_hash", rr.global_hash.ToHex()}});
  };
  const int64_t t0 = SystemClock::Default()->MonotonicMicros();
  ML_ASSIGN_OR_RETURN(node::LocalDilocoResult r, node::RunLocalDiloco(trainer.get(), net, opt));
  const double seconds = static_cast<double>(SystemClock::Default()->MonotonicMicros() - t0) / 1e6;
  bar.Finish(last_status);

  const node::RoundReport& last = r.rounds.back();
  *report = {{"task", a.task},
             {"rounds", net.rounds},
             {"units_per_round", net.units_per_round},
             {"inner_steps", net.inner_steps},
             {"aggregation", std::string(protocol::AggregationRuleName(net.aggregation.rule))},
             {"garbage", a.garbage},
             {"garbage_units", a.garbage_units},
             {"test_accuracy", last.eval.accuracy},
             {"test_loss", last.eval.loss},
             {"final_weights_hash", r.final_hash.ToHex()},
             {"seconds", seconds},
             {"per_round", rounds},
             {"pipeline", pipeline}};
  std::string model;
  if (!a.out.empty()) {
    ML_RETURN_IF_ERROR(env->CreateDirs(a.out));
    ML_RETURN_IF_ERROR(trainer->SetFlatParams(r.final_weights));
    model = JoinPath(a.out, "model.safetensors");
    ML_RETURN_IF_ERROR(engine::SaveModel(env, model, trainer->state(),
                                         {{"meshlearn.network", "diloco"},
                                          {"meshlearn.weights_hash", r.final_hash.ToHex()}}));
    (*report)["model"] = model;
  }
  // The whole model trained on one node: the figure a devnet measures a pipeline's stage nodes
  // against (docs/submitters.md, "A stage node's memory"). Read here, by the process itself:
  // the devnet that spawns it would read its own memory at the fork in wait4's ru_maxrss.
  (*report)["peak_rss_bytes"] = PeakRssBytes(getpid());
  if (!model.empty()) {
    ML_RETURN_IF_ERROR(WriteReportFile(JoinPath(a.out, "report.json"), *report, {"model"}));
  }
  return Status::Ok();
}

void AddDiloco(CLI::App& root, GlobalOptions& g) {
  static DilocoArgs a;
  CLI::App* cmd = root.add_subcommand(
      "diloco", "Run a network task's DiLoCo rounds in this process (the network's reference)");
  cmd->add_option("task", a.task, "Task file with a [network] table")->required();
  cmd->add_option("--out", a.out, "Directory for model.safetensors and report.json");
  cmd->add_option("--rounds", a.rounds, "Override network.rounds");
  cmd->add_option("--aggregation", a.aggregation,
                  "Override network.aggregation: mean, trimmed_mean, median, centered_clip, krum");
  cmd->add_option("--garbage", a.garbage, "What malicious units send: none, huge, nan, signflip")
      ->capture_default_str();
  cmd->add_option("--garbage-units", a.garbage_units, "How many units per round send garbage")
      ->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  meshlearn diloco examples/fashion-mlp.toml --out out/diloco\n"
      "  meshlearn diloco examples/fashion-mlp.toml --aggregation median --garbage huge "
      "--garbage-units 1\n"
      "  meshlearn --json diloco examples/fashion-mlp.toml --rounds 2");
  cmd->callback([&g] {
    nlohmann::json report;
    Status s = RunDiloco(g, a, &report);
    if (!s.ok()) return g.Exit(s);
    g.Output(report, [&] {
      const double acc = report["test_accuracy"].get<double>();
      const double loss = report["test_loss"].get<double>();
      // The task's metric: a language model has no accuracy (its perplexity instead).
      const std::string metric =
          acc >= 0 ? fmt::format("test accuracy {:.4f}, loss {:.4f}", acc, loss)
                   : fmt::format("test loss {:.4f}, perplexity {:.2f}", loss, std::exp(loss));
      std::cout << fmt::format(
          "{} rounds x {} units x {} steps, {}: {} in {:.1f}s\n"
          "weights hash {}\n",
          report["rounds"].get<int>(), report["units_per_round"].get<int>(),
          report["inner_steps"].get<int>(), report["aggregation"].get<std::string>(), metric,
          report["seconds"].get<double>(), report["final_weights_hash"].get<std::string>());
      if (report.contains("model")) std::cout << "model: " << report["model"].get<std::string>() << "\n";
    });
  });
}

}  // namespace

MESHLEARN_COMMAND(35, AddDiloco);

}  // namespace meshlearn::cli
