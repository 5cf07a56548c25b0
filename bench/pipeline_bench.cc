// Pipeline stages of code-gpt-10m (issue 15): the peak memory of one stage against the whole
// model, the bytes a step moves between stages, and the schedule's bubble.
//
//   build/bench/pipeline_bench [--stages=4] [--micro-batches=2] [--batch=8] [--seq-len=256]
//                              [--threads=1] [--steps=2]
//
// The whole model and each stage run in a fresh child process (--child=whole or --child=N) that
// builds only what it trains (Model::Create, or Stage::Create of stage N of the cut ChooseCut
// picks) and trains `steps` steps on synthetic tokens (a stage gets synthetic activations and
// activation gradients of the right shapes, as its neighbours would send), then prints its peak
// resident set. The parent prints one JSON line per case and a summary: each stage's peak against
// the whole model's and against 1/S of it plus the stage's activations (the bound), the
// bytes per step crossing stage boundaries (activations forward, their gradients back, the tied
// embedding's gradient and weight, the gradient-norm partial sums), and GPipe's theoretical bubble
// (S-1)/(M+S-1). In one process the stages run one after another, so no bubble is measured there.
//
//   build/bench/pipeline_bench --data-plane [--stages=2] [--micro-batches=4] [--steps=4] ...
//
// measures the bubble instead: the S stages run as the nodes of one replica in this process (a
// thread, a key, a data plane and a loopback HTTP server each: node/stage_plane.h), exchanging
// signed activations and gradients by HTTP push, each step node/stage_step.h's RunStageStep. Per
// stage it prints the seconds per step spent computing, waiting for a neighbour's tensor (the
// bubble) and pushing its own (the sender waits for the receiver's answer), and the bytes it
// sent; the summary has the measured bubble (the stages' mean share of a step spent waiting)
// against GPipe's (S-1)/(M+S-1). The first step (warm-up: first allocations, the tied weight's
// copy) is not counted. Each stage computes on one thread: with more stages than cores the stages
// also wait for a core, which the summary flags (`oversubscribed`), and the bubble measured then
// is not the schedule's.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/stage_plane.h"
#include "meshlearn/node/stage_step.h"

using namespace meshlearn;
using namespace meshlearn::engine;

namespace {

struct Options {
  int stages = 4;
  int64_t micro_batches = 2, batch = 8, seq_len = 256, steps = 2;
  int threads = 1;
  bool data_plane = false;
  std::string child;
};

double PeakRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

std::vector<float> Noise(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.UniformDouble() * 0.02 - 0.01);
  return v;
}

Result<TaskSpec> LoadTask(const Options& o) {
  ML_ASSIGN_OR_RETURN(TaskSpec t,
                      TaskSpec::Load(Env::Default(), std::string(MESHLEARN_SOURCE_DIR) +
                                                         "/examples/code-gpt-10m.toml"));
  t.model.gpt.vocab_size = 172;  // the corpus's; the bench draws synthetic tokens
  t.batch_size = o.batch;
  t.seq_len = o.seq_len;
  t.micro_batches = o.micro_batches;
  return t;
}

Batch TokenBatch(const TaskSpec& t, int64_t step) {
  Batch b;
  b.size = t.batch_size;
  b.seq_len = t.seq_len;
  Rng rng(100 + static_cast<uint64_t>(step));
  const uint64_t V = static_cast<uint64_t>(t.model.gpt.vocab_size);
  for (int64_t i = 0; i < t.batch_size * t.seq_len; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.Uniform(V)));
    b.targets.push_back(static_cast<int32_t>(rng.Uniform(V)));
  }
  return b;
}

int Child(const Options& o) {
  Status cfg = SetKernelConfig({GetKernelConfig().simd, o.threads});
  Result<TaskSpec> task = LoadTask(o);
  if (!cfg.ok() || !task.ok()) {
    std::fprintf(stderr, "error: %s\n", (cfg.ok() ? task.status() : cfg).ToString().c_str());
    return 1;
  }
  const TaskSpec& t = *task;
  nlohmann::json j = {{"case", o.child}};
  if (o.child == "whole") {
    TrainState st;
    Result<std::unique_ptr<Model>> m = Model::Create(t.model);
    if (!m.ok()) return 1;
    st.model = std::move(*m);
    st.model->Init(t.seed);
    st.optimizer = std::make_unique<Optimizer>(t.optimizer, st.model->params());
    for (int64_t s = 0; s < o.steps; ++s) {
      StepOnBatch(st, TokenBatch(t, s), 0, nullptr, t.micro_batches);
    }
    j["parameters"] = st.model->NumParameters();
  } else {
    const int index = std::atoi(o.child.c_str());
    Result<PipelineCut> cut =
        ChooseCut(t.model, t.optimizer, o.stages, t.batch_size, t.seq_len, t.micro_batches);
    if (!cut.ok()) {
      std::fprintf(stderr, "error: %s\n", cut.status().ToString().c_str());
      return 1;
    }
    Result<std::unique_ptr<Stage>> made =
        Stage::Create(t.model, t.optimizer, *cut, index, t.micro_batches);
    if (!made.ok()) {
      std::fprintf(stderr, "error: %s\n", made.status().ToString().c_str());
      return 1;
    }
    Stage& stage = **made;
    stage.state().model->Init(t.seed);
    const int64_t C = t.model.gpt.n_embd, V = t.model.gpt.vocab_size;
    const int64_t act = t.batch_size / t.micro_batches * t.seq_len * C;
    if (stage.state().model->tied_weight() != nullptr) stage.SetTiedWeight(Noise(V * C, 7));
    Result<std::vector<Batch>> micro = SplitBatch(TokenBatch(t, 0), t.micro_batches);
    if (!micro.ok()) return 1;
    for (int64_t s = 0; s < o.steps; ++s) {
      stage.BeginStep();
      ForwardOptions fo{.train = true, .step = static_cast<uint64_t>(s)};
      for (int64_t m = 0; m < t.micro_batches; ++m) {
        fo.micro_batch = static_cast<uint64_t>(m);
        Result<std::span<const float>> out =
            stage.Forward(m, (*micro)[static_cast<size_t>(m)],
                          stage.first() ? std::vector<float>() : Noise(act, 10 + m), fo);
        if (!out.ok()) {
          std::fprintf(stderr, "error: %s\n", out.status().ToString().c_str());
          return 1;
        }
      }
      for (int64_t m = 0; m < t.micro_batches; ++m) {
        Result<std::span<const float>> grad =
            stage.Backward(m, stage.last() ? std::vector<float>() : Noise(act, 20 + m));
        if (!grad.ok()) {
          std::fprintf(stderr, "error: %s\n", grad.status().ToString().c_str());
          return 1;
        }
      }
      if (stage.first()) stage.AddTiedHeadGrad(Noise(V * C, 30));
      stage.Update(s, std::sqrt(stage.SumGradSquares(0.0f)));
    }
    j["bounds"] = {cut->bounds[static_cast<size_t>(index)],
                   cut->bounds[static_cast<size_t>(index) + 1]};
    j["parameters"] = stage.state().model->NumParameters();
  }
  j["peak_rss_mb"] = PeakRssMb();
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// A stage's link to its neighbours that clocks the time spent in Receive (waiting for a
// neighbour's tensor: the bubble) and in Send (the push, until the receiver answered).
class ClockedLink : public node::StageLink {
 public:
  explicit ClockedLink(node::StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const protocol::StageTensorKey& key,
                                     protocol::StageTransfer* record) override {
    const auto t0 = std::chrono::steady_clock::now();
    Result<std::vector<float>> r = inner_->Receive(key, record);
    wait_s += Seconds(t0);
    return r;
  }
  Result<protocol::StageTransfer> Send(const protocol::StageTensorKey& key,
                                       std::span<const float> values) override {
    const auto t0 = std::chrono::steady_clock::now();
    Result<protocol::StageTransfer> r = inner_->Send(key, values);
    send_s += Seconds(t0);
    return r;
  }
  double wait_s = 0, send_s = 0;

 private:
  node::StageLink* inner_;
};

// One stage node of the data-plane run.
struct StageNode {
  net::Router router;
  std::unique_ptr<net::HttpTransport> transport;
  std::unique_ptr<node::StagePlane> plane;
  std::unique_ptr<net::HttpServer> server;  // declared last: stopped first (handlers use plane)
};

int DataPlane(const Options& o) {
  Status cfg = SetKernelConfig({GetKernelConfig().simd, 1});
  Result<TaskSpec> task = LoadTask(o);
  if (!cfg.ok() || !task.ok()) {
    std::fprintf(stderr, "error: %s\n", (cfg.ok() ? task.status() : cfg).ToString().c_str());
    return 1;
  }
  const TaskSpec& t = *task;
  if (o.stages < 2 || o.steps < 2) {
    std::fprintf(stderr, "error: --data-plane needs --stages >= 2 and --steps >= 2 (the first "
                         "step is warm-up)\n");
    return 2;
  }
  Result<PipelineCut> cut =
      ChooseCut(t.model, t.optimizer, o.stages, t.batch_size, t.seq_len, t.micro_batches);
  if (!cut.ok()) {
    std::fprintf(stderr, "error: %s\n", cut.status().ToString().c_str());
    return 1;
  }
  const int S = o.stages;
  node::StageContext ctx;
  ctx.task = Blake2b("pipeline_bench");
  std::vector<KeyPair> keys;
  for (int s = 0; s < S; ++s) {
    KeySeed seed{};
    seed.bytes[0] = static_cast<uint8_t>(s + 1);
    keys.push_back(KeyPair::FromSeed(seed));
    ctx.chain.push_back(keys.back().public_key());
  }
  std::vector<std::unique_ptr<Stage>> stages;
  std::vector<std::unique_ptr<StageNode>> nodes;
  std::vector<std::string> endpoints;
  for (int s = 0; s < S; ++s) {
    Result<std::unique_ptr<Stage>> made =
        Stage::Create(t.model, t.optimizer, *cut, s, t.micro_batches);
    if (!made.ok()) {
      std::fprintf(stderr, "error: %s\n", made.status().ToString().c_str());
      return 1;
    }
    (*made)->state().model->Init(t.seed);
    stages.push_back(std::move(*made));
    auto n = std::make_unique<StageNode>();
    n->transport = std::make_unique<net::HttpTransport>(net::HttpTransportOptions{.threads = 2});
    n->plane = std::make_unique<node::StagePlane>(ctx, s, keys[static_cast<size_t>(s)],
                                                  n->transport.get());
    n->plane->Register(&n->router);
    n->server = std::make_unique<net::HttpServer>(&n->router, net::HttpServerOptions{.threads = 4});
    Result<uint16_t> port = n->server->Start("127.0.0.1", 0);
    if (!port.ok()) {
      std::fprintf(stderr, "error: %s\n", port.status().ToString().c_str());
      return 1;
    }
    endpoints.push_back(n->server->endpoint());
    nodes.push_back(std::move(n));
  }
  for (auto& n : nodes) n->plane->SetChain(ctx.chain, endpoints);

  struct Clock {
    double step_s = 0, wait_s = 0, send_s = 0;
    uint64_t bytes_sent = 0;
    Status status = Status::Ok();
  };
  std::vector<Clock> clocks(static_cast<size_t>(S));
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      StageNode& n = *nodes[static_cast<size_t>(s)];
      Clock& c = clocks[static_cast<size_t>(s)];
      for (int64_t step = 0; step < o.steps; ++step) {
        n.plane->BeginStep(static_cast<uint64_t>(step));
        ClockedLink link(n.plane->link());
        const uint64_t sent_before = n.plane->stats().bytes_sent;
        const auto t0 = std::chrono::steady_clock::now();
        Result<node::StageStepOutcome> r = node::RunStageStep(
            *stages[static_cast<size_t>(s)], n.plane->context(), TokenBatch(t, step), 0, link);
        const double wall = Seconds(t0);
        if (!r.ok()) {
          c.status = r.status();
          return;
        }
        if (step == 0) continue;  // warm-up
        c.step_s += wall;
        c.wait_s += link.wait_s;
        c.send_s += link.send_s;
        c.bytes_sent += n.plane->stats().bytes_sent - sent_before;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const double counted = static_cast<double>(o.steps - 1);
  double bubble = 0, step_s = 0, bytes = 0;
  for (int s = 0; s < S; ++s) {
    const Clock& c = clocks[static_cast<size_t>(s)];
    if (!c.status.ok()) {
      std::fprintf(stderr, "error: stage %d: %s\n", s, c.status.ToString().c_str());
      return 1;
    }
    const nlohmann::json j = {{"case", "data_plane_stage"},
                              {"stage", s},
                              {"bounds", {cut->bounds[static_cast<size_t>(s)],
                                          cut->bounds[static_cast<size_t>(s) + 1]}},
                              {"step_s", c.step_s / counted},
                              {"compute_s", (c.step_s - c.wait_s - c.send_s) / counted},
                              {"wait_s", c.wait_s / counted},
                              {"send_s", c.send_s / counted},
                              {"bubble_fraction", c.wait_s / c.step_s},
                              {"bytes_sent_per_step", static_cast<double>(c.bytes_sent) / counted}};
    std::printf("%s\n", j.dump().c_str());
    bubble += c.wait_s / c.step_s / S;
    step_s = std::max(step_s, c.step_s / counted);
    bytes += static_cast<double>(c.bytes_sent) / counted;
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const nlohmann::json summary = {
      {"case", "data_plane"},
      {"stages", S},
      {"micro_batches", o.micro_batches},
      {"batch", t.batch_size},
      {"seq_len", t.seq_len},
      {"steps_counted", o.steps - 1},
      {"cut", cut->bounds},
      {"step_s", step_s},
      {"bytes_between_stages_per_step", bytes},
      {"bubble_fraction_measured", bubble},
      {"bubble_fraction_gpipe",
       static_cast<double>(S - 1) / static_cast<double>(o.micro_batches + S - 1)},
      {"cores", cores},
      {"oversubscribed", S > cores}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

nlohmann::json RunChild(const Options& o, const std::string& which) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::ostringstream cmd;
  cmd << self << " --child=" << which << " --stages=" << o.stages
      << " --micro-batches=" << o.micro_batches << " --batch=" << o.batch
      << " --seq-len=" << o.seq_len << " --threads=" << o.threads << " --steps=" << o.steps;
  FILE* p = popen(cmd.str().c_str(), "r");
  if (p == nullptr) return nlohmann::json::value_t::discarded;
  std::string last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) last = buf;
  if (pclose(p) != 0) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(last, nullptr, false);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::string(key).size();
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--stages=")) {
      o.stages = std::atoi(v);
    } else if (const char* v2 = value("--micro-batches=")) {
      o.micro_batches = std::atoll(v2);
    } else if (const char* v3 = value("--batch=")) {
      o.batch = std::atoll(v3);
    } else if (const char* v4 = value("--seq-len=")) {
      o.seq_len = std::atoll(v4);
    } else if (const char* v5 = value("--threads=")) {
      o.threads = std::atoi(v5);
    } else if (const char* v6 = value("--steps=")) {
      o.steps = std::atoll(v6);
    } else if (const char* v7 = value("--child=")) {
      o.child = v7;
    } else if (a == "--data-plane") {
      o.data_plane = true;
    } else {
      std::fprintf(stderr,
                   "usage: pipeline_bench [--data-plane] [--stages=4] [--micro-batches=2] "
                   "[--batch=8] [--seq-len=256] [--threads=1] [--steps=2]\n");
      return 2;
    }
  }
  if (!o.child.empty()) return Child(o);
  if (o.data_plane) return DataPlane(o);

  Result<TaskSpec> task = LoadTask(o);
  if (!task.ok()) {
    std::fprintf(stderr, "error: %s\n", task.status().ToString().c_str());
    return 1;
  }
  const TaskSpec& t = *task;
  Result<PipelineCut> cut =
      ChooseCut(t.model, t.optimizer, o.stages, t.batch_size, t.seq_len, t.micro_batches);
  if (!cut.ok()) {
    std::fprintf(stderr, "error: %s\n", cut.status().ToString().c_str());
    return 1;
  }
  Result<std::vector<StageCost>> costs =
      CutCosts(t.model, t.optimizer, *cut, t.batch_size, t.seq_len, t.micro_batches);
  if (!costs.ok()) return 1;
  nlohmann::json whole = RunChild(o, "whole");
  if (whole.is_discarded()) {
    std::fprintf(stderr, "error: the whole-model child failed\n");
    return 1;
  }
  std::printf("%s\n", whole.dump().c_str());
  const double whole_mb = whole["peak_rss_mb"].get<double>();
  for (int s = 0; s < o.stages; ++s) {
    nlohmann::json j = RunChild(o, std::to_string(s));
    if (j.is_discarded()) {
      std::fprintf(stderr, "error: the child of stage %d failed\n", s);
      return 1;
    }
    const double act_mb = (*costs)[static_cast<size_t>(s)].activation_bytes / (1024.0 * 1024.0);
    j["activation_estimate_mb"] = act_mb;
    j["ratio_to_whole"] = j["peak_rss_mb"].get<double>() / whole_mb;
    j["bound_mb"] = whole_mb / o.stages + act_mb;  // the issue's: 1/S of one node + activations
    j["within_bound"] = j["peak_rss_mb"].get<double>() <= whole_mb / o.stages + act_mb;
    std::printf("%s\n", j.dump().c_str());
  }
  // Activations and their gradients at each boundary (engine::CutBoundaryBytes, the ledger's
  // link cost of it), then the gradient-norm partial sums and the tied embedding's weight and
  // gradient.
  Result<std::vector<uint64_t>> boundary =
      CutBoundaryBytes(t.model, *cut, t.batch_size, t.seq_len, t.micro_batches);
  if (!boundary.ok()) return 1;
  const double C = static_cast<double>(t.model.gpt.n_embd), V = t.model.gpt.vocab_size;
  double bytes = (o.stages - 1) * 4.0 + (o.stages > 1 ? 2.0 * V * C * 4.0 : 0);
  for (uint64_t b : *boundary) bytes += static_cast<double>(b);
  nlohmann::json summary = {
      {"case", "summary"},
      {"stages", o.stages},
      {"micro_batches", o.micro_batches},
      {"cut", cut->bounds},
      {"bytes_between_stages_per_step", bytes},
      {"stage_boundary_bytes", *boundary},
      {"bubble_fraction_gpipe",
       static_cast<double>(o.stages - 1) / static_cast<double>(o.micro_batches + o.stages - 1)}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}
