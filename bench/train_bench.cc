// Training throughput of the example models, meshlearn vs PyTorch CPU, measured in the same run
// with the same model, batch size, optimizer and thread count.
//
//   train_bench [--benchmarks=mlp,cnn,gpt] [--threads=1,2] [--steps=200] [--simd=auto]
//               [--torch=0|1]
//   train_bench --benchmarks=gpt --threads=1,2 --steps=400   # gpt runs steps/40 = 10 steps
//
// mlp, cnn: examples/fashion-{mlp,cnn}.toml with batch_size 64 and Adam (real data when
// Fashion-MNIST is installed, random inputs otherwise); samples/s.
// gpt: examples/code-gpt-10m.toml (10.8M parameters, AdamW, clipping) at batch 8 x 256 tokens on
// its Python-stdlib corpus; tokens/s, and the peak resident set (RSS) of a process that does
// nothing but this training (a fresh child process of this binary, so that the other cases and
// the bench itself do not count), against PyTorch's peak RSS for the same model and batch.
// PyTorch runs in a child process (tools/torch_train_bench.py under /usr/bin/python3).
// Prints one JSON line per case, e.g.
//   {"bench":"train_mlp","threads":1,"batch":64,"meshlearn_samples_per_sec":...,
//    "torch_samples_per_sec":...,"ratio":...}
// ratio = meshlearn / torch, torch being the faster of PyTorch as installed and PyTorch with
// OPENBLAS_CORETYPE forced; per thread count also "scaling" = this count's meshlearn rate over
// the 1-thread rate when 1 is in --threads. Nothing here is asserted; it is a measurement.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/init.h"
#include "meshlearn/engine/train.h"

#include "bench_util.h"

namespace {

using namespace meshlearn;
using namespace meshlearn::engine;

using bench::SplitList;

std::string SourceDir() {
  // The bench runs from the build tree or the source tree; find examples/ from either.
  for (std::string d : {std::string("."), std::string(".."), std::string(MESHLEARN_SOURCE_DIR)}) {
    if (std::filesystem::exists(d + "/examples/fashion-mlp.toml")) return d;
  }
  return MESHLEARN_SOURCE_DIR;
}

// Returns samples/s of meshlearn on `model` ("mlp" | "cnn"), or -1 on error.
double MeshlearnSamplesPerSec(const std::string& src, const std::string& model, int steps) {
  Result<TaskSpec> task =
      TaskSpec::Load(Env::Default(), src + "/examples/fashion-" + model + ".toml");
  if (!task.ok()) {
    std::fprintf(stderr, "error: %s\n", task.status().ToString().c_str());
    return -1;
  }
  task->batch_size = 64;
  TaskData data;
  if (std::filesystem::exists(task->data.train_x)) {
    Result<TaskData> d = LoadTaskData(Env::Default(), *task);
    if (!d.ok()) {
      std::fprintf(stderr, "error: %s\n", d.status().ToString().c_str());
      return -1;
    }
    data = std::move(*d);
  } else {  // random inputs of the same shape
    const int64_t n = 10000;
    data.train.x = Tensor({n, 1, 28, 28});
    FillNormal(data.train.x.data(), data.train.x.size(), 1.0f, 1, 0);
    data.train.y.resize(n);
    for (int64_t i = 0; i < n; ++i) data.train.y[i] = static_cast<int32_t>(i % 10);
    data.train.num_classes = 10;
    if (model == "mlp") data.train.x = Tensor({n, 784}, std::move(data.train.x.vec()));
  }
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*task, std::move(data));
  if (!tr.ok()) {
    std::fprintf(stderr, "error: %s\n", tr.status().ToString().c_str());
    return -1;
  }
  for (int i = 0; i < 20; ++i) (*tr)->Step();  // warm-up: arena, thread pool, caches
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) (*tr)->Step();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return steps * 64.0 / secs;
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double PeakRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

// Runs `cmd` and parses its last output line as JSON; a discarded value on failure.
nlohmann::json RunJson(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return nlohmann::json::value_t::discarded;
  std::string out, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return nlohmann::json::value_t::discarded;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) last = line;
  }
  return nlohmann::json::parse(last, nullptr, false);
}

// The GPT case inside a fresh process (--gpt-child): code-gpt-10m at batch 8 x 256, `steps` timed
// steps after 2 warm-up steps; prints {"tokens_per_sec":..., "peak_rss_mb":..., "params":...}.
int GptChild(const std::string& src, int steps) {
  Result<TaskSpec> task = TaskSpec::Load(Env::Default(), src + "/examples/code-gpt-10m.toml");
  if (!task.ok()) {
    std::fprintf(stderr, "error: %s\n", task.status().ToString().c_str());
    return 1;
  }
  task->batch_size = 8;
  task->seq_len = 256;
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), *task);
  if (!tr.ok()) {
    std::fprintf(stderr, "error: %s\n", tr.status().ToString().c_str());
    return 1;
  }
  for (int i = 0; i < 2; ++i) (*tr)->Step();  // warm-up: arena, thread pool, caches
  const double cpu0 = ProcessCpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) (*tr)->Step();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = ProcessCpuSeconds() - cpu0;
  int64_t params = 0;
  for (const Param& p : (*tr)->state().model->params()) params += p.value.size();
  // Tokens per process-CPU-second (all threads): what a busy host's time slicing does not distort;
  // at 1 thread it is the rate the step would have on an idle core.
  nlohmann::json j = {{"tokens_per_sec", steps * 8.0 * 256.0 / secs},
                      {"tokens_per_cpu_sec", steps * 8.0 * 256.0 / cpu_secs},
                      {"peak_rss_mb", PeakRssMb()},
                      {"params", params}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// PyTorch's rate for `model` (samples/s; tokens/s for gpt), and its peak RSS (MB) in *rss_mb.
double TorchRate(const std::string& src, const std::string& model, int threads, int steps,
                 const std::string& env_prefix, double* rss_mb) {
  const bool gpt = model == "gpt";
  const std::string cmd = env_prefix + "/usr/bin/python3 " + src +
                          "/tools/torch_train_bench.py --model " + model + " --threads " +
                          std::to_string(threads) +
                          (gpt ? " --batch 8 --seq-len 256 --warmup 2" : " --batch 64") +
                          " --steps " + std::to_string(steps) + " 2>/dev/null";
  nlohmann::json j = RunJson(cmd);
  const char* key = gpt ? "tokens_per_sec" : "samples_per_sec";
  if (j.is_discarded() || !j.contains(key)) return -1;
  if (rss_mb != nullptr && j.contains("peak_rss_mb")) *rss_mb = j["peak_rss_mb"].get<double>();
  return j[key].get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> benches = {"mlp", "cnn"};
  std::vector<std::string> threads = {"1", "2"};
  int steps = 200;
  std::string simd = "auto";
  bool torch = true, gpt_child = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--gpt-child")
      gpt_child = true;
    else if (a.rfind("--benchmarks=", 0) == 0)
      benches = SplitList(a.substr(13));
    else if (a.rfind("--threads=", 0) == 0)
      threads = SplitList(a.substr(10));
    else if (a.rfind("--steps=", 0) == 0)
      steps = std::atoi(a.c_str() + 8);
    else if (a.rfind("--simd=", 0) == 0)
      simd = a.substr(7);
    else if (a == "--torch=0" || a == "--torch=1")
      torch = a == "--torch=1";
    else {
      std::fprintf(stderr,
                   "usage: train_bench [--benchmarks=mlp,cnn,gpt] [--threads=1,2] [--steps=200] "
                   "[--simd=auto|scalar|avx2|avx512] [--torch=0|1]\n"
                   "  e.g. train_bench --benchmarks=gpt --threads=1,2 --steps=400\n");
      return 2;
    }
  }
  for (const std::string& b : benches) {
    if (b != "mlp" && b != "cnn" && b != "gpt") {
      std::fprintf(stderr, "error: --benchmarks: unknown case '%s'; use mlp, cnn or gpt\n",
                   b.c_str());
      return 2;
    }
  }
  for (const std::string& t : threads) {
    const int n = std::atoi(t.c_str());
    if (n < 1 || n > 256) {
      std::fprintf(stderr, "error: --threads: '%s' is not a thread count in 1..256\n", t.c_str());
      return 2;
    }
  }
  if (steps < 1) {
    std::fprintf(stderr, "error: --steps must be >= 1\n");
    return 2;
  }
  const std::string src = SourceDir();
  Result<SimdPath> path = ParseSimdPath(simd);
  if (!path.ok()) {
    std::fprintf(stderr, "error: --simd: %s\n", path.status().message().c_str());
    return 2;
  }
  if (gpt_child) {
    if (Status s = SetKernelConfig({*path, std::atoi(threads.at(0).c_str())}); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 2;
    }
    return GptChild(src, steps);
  }
  std::map<std::string, double> one_thread_rate;  // case -> meshlearn rate at 1 thread
  for (const std::string& t : threads) {
    const int n = std::atoi(t.c_str());
    if (Status s = SetKernelConfig({*path, n}); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 2;
    }
    for (const std::string& b : benches) {
      if (b == "gpt") {
        const int gpt_steps = std::max(steps / 40, 3);
        nlohmann::json child = RunJson(SelfExe() + " --gpt-child --threads=" + t +
                                       " --simd=" + simd + " --steps=" + std::to_string(gpt_steps));
        if (child.is_discarded() || !child.contains("tokens_per_sec")) {
          std::fprintf(stderr, "error: the gpt case failed (run %s --gpt-child --threads=%s)\n",
                       SelfExe().c_str(), t.c_str());
          return 1;
        }
        const double ml = child["tokens_per_sec"].get<double>();
        double rss_default = -1, rss_tuned = -1;
        double pt_default = torch ? TorchRate(src, b, n, gpt_steps, "", &rss_default) : -1;
        double pt_tuned =
            torch ? TorchRate(src, b, n, gpt_steps,
                              SimdPathSupported(SimdPath::kAvx512) ? "OPENBLAS_CORETYPE=SkylakeX "
                                                                   : "OPENBLAS_CORETYPE=Haswell ",
                              &rss_tuned)
                  : -1;
        const double pt = std::max(pt_default, pt_tuned);
        const double pt_rss = pt_tuned > pt_default ? rss_tuned : rss_default;
        if (n == 1) one_thread_rate[b] = ml;
        nlohmann::json j = {{"bench", "train_gpt"},
                            {"model", "code-gpt-10m"},
                            {"params", child["params"]},
                            {"threads", n},
                            {"batch", 8},
                            {"seq_len", 256},
                            {"optimizer", "adamw"},
                            {"simd", std::string(SimdPathName(*path))},
                            {"steps", gpt_steps},
                            {"meshlearn_tokens_per_sec", ml},
                            {"meshlearn_tokens_per_cpu_sec", child["tokens_per_cpu_sec"]},
                            {"meshlearn_peak_rss_mb", child["peak_rss_mb"]}};
        if (one_thread_rate.count(b)) j["scaling"] = ml / one_thread_rate[b];
        if (pt > 0) {
          j["torch_tokens_per_sec"] = pt;
          j["torch_default_blas_tokens_per_sec"] = pt_default;
          j["torch_openblas_coretype_tokens_per_sec"] = pt_tuned;
          j["ratio"] = ml / pt;
          j["torch_peak_rss_mb"] = pt_rss;
          j["rss_ratio"] = child["peak_rss_mb"].get<double>() / pt_rss;
        } else {
          j["torch_tokens_per_sec"] = nullptr;
          if (torch) j["note"] = "PyTorch baseline unavailable (/usr/bin/python3 with torch)";
        }
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
        continue;
      }
      const int case_steps = b == "cnn" ? std::max(steps / 4, 10) : steps;
      double ml = MeshlearnSamplesPerSec(src, b, case_steps);
      if (n == 1) one_thread_rate[b] = ml;
      // Debian's PyTorch uses the system BLAS; OpenBLAS's DYNAMIC_ARCH may pick slow SSE3 kernels
      // on a VM (see engine/KERNELS.md). Measure it as installed and with the core type forced,
      // and compare against the faster of the two.
      double pt_default = torch ? TorchRate(src, b, n, case_steps, "", nullptr) : -1;
      double pt_tuned =
          torch ? TorchRate(src, b, n, case_steps,
                            SimdPathSupported(SimdPath::kAvx512) ? "OPENBLAS_CORETYPE=SkylakeX "
                                                                 : "OPENBLAS_CORETYPE=Haswell ",
                            nullptr)
                : -1;
      double pt = std::max(pt_default, pt_tuned);
      nlohmann::json j = {{"bench", "train_" + b},
                          {"threads", n},
                          {"batch", 64},
                          {"optimizer", "adam"},
                          {"simd", std::string(SimdPathName(*path))},
                          {"steps", case_steps},
                          {"meshlearn_samples_per_sec", ml}};
      if (one_thread_rate.count(b)) j["scaling"] = ml / one_thread_rate[b];
      if (pt > 0) {
        j["torch_samples_per_sec"] = pt;
        j["torch_default_blas_samples_per_sec"] = pt_default;
        j["torch_openblas_coretype_samples_per_sec"] = pt_tuned;
        j["ratio"] = ml / pt;
      } else {
        j["torch_samples_per_sec"] = nullptr;
        if (torch) j["note"] = "PyTorch baseline unavailable (/usr/bin/python3 with torch)";
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
