// Training throughput (samples/s) of the Fashion-MNIST example models, meshlearn vs PyTorch CPU,
// measured in the same run with the same model, batch size (64), optimizer (Adam) and thread count.
//
//   train_bench [--benchmarks=mlp,cnn] [--threads=1,2] [--steps=200] [--simd=auto]
//
// PyTorch runs in a child process (tools/torch_train_bench.py under /usr/bin/python3); meshlearn
// trains the example task (examples/fashion-{mlp,cnn}.toml with batch_size 64; real data when
// Fashion-MNIST is installed, random inputs otherwise). Prints one JSON line per case:
//   {"bench":"train_mlp","threads":1,"batch":64,"meshlearn_samples_per_sec":...,
//    "torch_samples_per_sec":...,"ratio":...}
// ratio = meshlearn / torch (target >= 1.0), torch being the faster of PyTorch as installed and
// PyTorch with OPENBLAS_CORETYPE forced. Nothing here is asserted; it is a measurement.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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

double TorchSamplesPerSec(const std::string& src, const std::string& model, int threads, int steps,
                          const std::string& env_prefix = "") {
  const std::string cmd = env_prefix + "/usr/bin/python3 " + src +
                          "/tools/torch_train_bench.py --model " + model + " --threads " +
                          std::to_string(threads) + " --batch 64 --steps " + std::to_string(steps) +
                          " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return -1;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("samples_per_sec")) return -1;
  return j["samples_per_sec"].get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> benches = {"mlp", "cnn"};
  std::vector<std::string> threads = {"1", "2"};
  int steps = 200;
  std::string simd = "auto";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--benchmarks=", 0) == 0)
      benches = SplitList(a.substr(13));
    else if (a.rfind("--threads=", 0) == 0)
      threads = SplitList(a.substr(10));
    else if (a.rfind("--steps=", 0) == 0)
      steps = std::atoi(a.c_str() + 8);
    else if (a.rfind("--simd=", 0) == 0)
      simd = a.substr(7);
    else {
      std::fprintf(stderr,
                   "usage: train_bench [--benchmarks=mlp,cnn] [--threads=1,2] [--steps=200] "
                   "[--simd=auto|scalar|avx2|avx512]\n");
      return 2;
    }
  }
  const std::string src = SourceDir();
  Result<SimdPath> path = ParseSimdPath(simd);
  if (!path.ok()) {
    std::fprintf(stderr, "error: --simd: %s\n", path.status().message().c_str());
    return 2;
  }
  for (const std::string& t : threads) {
    const int n = std::atoi(t.c_str());
    if (Status s = SetKernelConfig({*path, n}); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 2;
    }
    for (const std::string& b : benches) {
      const int case_steps = b == "cnn" ? std::max(steps / 4, 10) : steps;
      double ml = MeshlearnSamplesPerSec(src, b, case_steps);
      // Debian's PyTorch uses the system BLAS; OpenBLAS's DYNAMIC_ARCH may pick slow SSE3 kernels
      // on a VM (see engine/KERNELS.md). Measure it as installed and with the core type forced,
      // and compare against the faster of the two.
      double pt_default = TorchSamplesPerSec(src, b, n, case_steps);
      double pt_tuned =
          TorchSamplesPerSec(src, b, n, case_steps,
                             SimdPathSupported(SimdPath::kAvx512) ? "OPENBLAS_CORETYPE=SkylakeX "
                                                                  : "OPENBLAS_CORETYPE=Haswell ");
      double pt = std::max(pt_default, pt_tuned);
      nlohmann::json j = {{"bench", "train_" + b},
                          {"threads", n},
                          {"batch", 64},
                          {"optimizer", "adam"},
                          {"simd", std::string(SimdPathName(*path))},
                          {"steps", case_steps},
                          {"meshlearn_samples_per_sec", ml}};
      if (pt > 0) {
        j["torch_samples_per_sec"] = pt;
        j["torch_default_blas_samples_per_sec"] = pt_default;
        j["torch_openblas_coretype_samples_per_sec"] = pt_tuned;
        j["ratio"] = ml / pt;
      } else {
        j["torch_samples_per_sec"] = nullptr;
        j["note"] = "PyTorch baseline unavailable (/usr/bin/python3 with torch)";
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
