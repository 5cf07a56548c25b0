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
// the 1-thread rate when 1 is in --threads. Since the machine may be shared, every line also
// says what the process got: "load1" (the 1-minute load average at the case's start), for mlp
// and cnn "meshlearn_cpus_used" (process CPU time over wall time; polling counts),
// "meshlearn_samples_per_cpu_sec" and "steal_s" (the host's steal time over the case), and on
// more than one thread "machine_scaling": the engine's GEMM run as two independent 1-thread
// copies at once against one copy alone, just before the case (~2 when both CPUs are this
// process's and separate cores; read "scaling" against it) and "core_round_trip_ns" (a cache
// line's trip between the two threads' cores and back: ~100 ns when the MLP scaled, ~340 ns when
// it did not). The gpt lines also give the ceiling set by the core: "fma_peak_gflops_per_thread"
// (12 independent FMA chains on one thread), "matmul_gflop_per_step" (the products' multiply-adds
// that no implementation can skip, x 2) and "fma_bound_tokens_per_sec" (every one of them at the
// peak on every thread, nothing else taking any time), with "meshlearn_share_of_fma_bound" and
// "ratio_bound" (the bound over PyTorch's rate: the highest ratio any fp32 implementation could
// show in this run). Nothing here is asserted; it is a measurement.
#include <immintrin.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/check.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/init.h"
#include "meshlearn/engine/kernels.h"
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

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// What the shared machine gave a case: the 1-minute load average at its start and the host's
// steal time (/proc/stat, all CPUs) over it; -1 where /proc does not say.
double LoadAverage1() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return -1;
  double l = -1;
  if (std::fscanf(f, "%lf", &l) != 1) l = -1;
  std::fclose(f);
  return l;
}

double StealSeconds() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return -1;
  unsigned long long v[8] = {};
  const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                              &v[3], &v[4], &v[5], &v[6], &v[7]);
  std::fclose(f);
  return got == 8 ? static_cast<double>(v[7]) / static_cast<double>(sysconf(_SC_CLK_TCK)) : -1;
}

// The machine's own 2-thread scaling at this moment, for the engine's hot loop: the same GEMM
// (LinearForward, 128 x 256 x 256, its operands in L2), one copy on one thread, then one copy
// on each of two threads at once, each with the kernels on one thread; 2 * t(one) / t(two). About
// 2 when both CPUs are free for this process and are separate cores; about 1 when another
// process holds one of them, or when the two vCPUs share one physical core's FMA pipes (SMT
// siblings on the host). A 2-thread training rate can only be judged against it. Leaves the
// kernel configuration at {path, threads}.
double MachineScaling(SimdPath path, int threads) {
  constexpr int64_t B = 128, C = 256, OC = 256;
  constexpr int kReps = 150;
  CHECK(SetKernelConfig({path, 1}).ok());
  auto timed = [] {
    std::vector<float> inp(B * C, 0.5f), w(OC * C, 0.25f), out(B * OC);
    LinearForward(out.data(), inp.data(), w.data(), nullptr, B, C, OC);  // warm the caches
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r)
      LinearForward(out.data(), inp.data(), w.data(), nullptr, B, C, OC);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double one = timed();
  // The wall time of both copies, from before the second thread starts to after it ends: two
  // copies that take turns on one CPU each time only their own run.
  const auto t0 = std::chrono::steady_clock::now();
  std::thread th(timed);
  timed();
  th.join();
  const double two = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(SetKernelConfig({path, threads}).ok());
  return 2.0 * one / two;
}

// The time for one cache line to go from one thread's core to the other's and back (two threads
// passing a counter), median of 9 blocks of 2,000 round trips, in nanoseconds. Every parallel
// region of a training step moves data this way (the job, a GEMM's output read by the next
// layer on the other thread, gradients written by one thread and updated by the other); on
// this shared VM it was 83-120 ns in the runs where the MLP scaled 1.66-1.76x and 326-352 ns in
// the runs where it scaled 0.95-1.02x (the two vCPUs then, presumably, on host cores that share
// no cache).
// Meaningless unless both threads hold a CPU (run under chrt, or check machine_scaling).
double CoreToCoreRoundTripNs() {
  alignas(64) std::atomic<int64_t> flag{0};
  std::atomic<bool> give_up{false};
  constexpr int64_t kTrips = 2000;
  constexpr int kBlocks = 9;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  // Waits for flag == want; false once either thread gave up. Yields the CPU every few thousand
  // polls: with both threads on one CPU under a real-time policy (the other CPU busy), a poller
  // that never yields would keep the thread it waits for off the CPU. Gives up at the deadline
  // (no second CPU for this process).
  auto wait_for = [&](int64_t want) {
    for (int polls = 1; flag.load(std::memory_order_acquire) != want; ++polls) {
      if (polls % 4096 == 0) {
        if (give_up.load(std::memory_order_relaxed)) return false;
        if (std::chrono::steady_clock::now() > deadline) {
          give_up = true;
          return false;
        }
        sched_yield();
      }
    }
    return true;
  };
  std::thread th([&] {
    for (int64_t i = 0; i < kTrips * kBlocks; ++i) {
      if (!wait_for(2 * i + 1)) return;
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::vector<double> ns;
  for (int blk = 0; blk < kBlocks; ++blk) {
    auto t0 = std::chrono::steady_clock::now();
    bool ok = true;
    for (int64_t i = blk * kTrips; i < (blk + 1) * kTrips && ok; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      ok = wait_for(2 * i + 2);
    }
    if (!ok) break;
    ns.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
        kTrips);
  }
  give_up = true;
  th.join();
  if (ns.empty()) return -1;  // the two threads never held two CPUs at once
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

// 12 independent chains of `iters` FMAs each on vectors V, in registers (named, not an array:
// GCC at -O2 kept an array in memory and ran at half the peak). One body for both widths,
// compiled for the target that has them.
#define MESHLEARN_FMA_CHAINS(V, FMA, SET1)                                                         \
  const V a = SET1(0.999999f), b = SET1(1e-7f);                                                    \
  V c0 = SET1(seed), c1 = SET1(seed + 1), c2 = SET1(seed + 2), c3 = SET1(seed + 3);                \
  V c4 = SET1(seed + 4), c5 = SET1(seed + 5), c6 = SET1(seed + 6), c7 = SET1(seed + 7);            \
  V c8 = SET1(seed + 8), c9 = SET1(seed + 9), c10 = SET1(seed + 10), c11 = SET1(seed + 11);        \
  for (int64_t i = 0; i < iters; ++i) {                                                            \
    c0 = FMA(c0, a, b), c1 = FMA(c1, a, b), c2 = FMA(c2, a, b), c3 = FMA(c3, a, b);                \
    c4 = FMA(c4, a, b), c5 = FMA(c5, a, b), c6 = FMA(c6, a, b), c7 = FMA(c7, a, b);                \
    c8 = FMA(c8, a, b), c9 = FMA(c9, a, b), c10 = FMA(c10, a, b), c11 = FMA(c11, a, b);            \
  }                                                                                                \
  const V sum = FMA(FMA(FMA(c0, c1, c2), FMA(c3, c4, c5), FMA(c6, c7, c8)), c9, FMA(c10, c11, a)); \
  float out[16] = {};                                                                              \
  std::memcpy(out, &sum, sizeof(V));                                                               \
  return out[0];
__attribute__((target("avx512f"))) float FmaChains512(int64_t iters, float seed) {
  MESHLEARN_FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps)
}
__attribute__((target("avx2,fma"))) float FmaChains256(int64_t iters, float seed) {
  MESHLEARN_FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps)
}
#undef MESHLEARN_FMA_CHAINS

// This core's fp32 multiply-add peak on one thread, in GFLOP/s (2 FLOPs a multiply-add): the FMA
// chains on the vectors the kernels use, best of 5 blocks of ~50 ms. A matrix product's
// multiply-adds run no faster than this, whatever the blocking; -1 on the scalar path.
double FmaPeakGflops(SimdPath path) {
  if (path == SimdPath::kScalar) return -1;
  const int lanes = path == SimdPath::kAvx512 ? 16 : 8;
  constexpr int64_t kIters = 10'000'000;
  double best = 0, sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    sink += path == SimdPath::kAvx512 ? FmaChains512(kIters, static_cast<float>(rep))
                                      : FmaChains256(kIters, static_cast<float>(rep));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * 12 * lanes * static_cast<double>(kIters) / secs / 1e9);
  }
  if (sink == 12345.0) std::fprintf(stderr, " ");  // keep the chains' results live
  return best;
}

// The multiply-adds of one token's training step in code-gpt-10m's matrix products, counting only
// what no implementation can skip: per block the four linear layers (12 C^2), the causal half of
// attention's two products (row t of T has t + 1 terms: (T + 1) C per token on average), the
// head's product with wte (V C); each three times (forward, input gradient, weight gradient).
double GptMatmulMacsPerToken(const GptSpec& g, int64_t T) {
  const double C = static_cast<double>(g.n_embd);
  const double per_block = 12.0 * C * C + static_cast<double>(T + 1) * C;
  return 3.0 * (static_cast<double>(g.n_layer) * per_block + static_cast<double>(g.vocab_size) * C);
}

struct CaseRun {
  double samples_per_sec = -1;
  double cpus_used = -1;  // the process's CPU time (all threads) over the wall time
  double samples_per_cpu_sec = -1;
};

// meshlearn on `model` ("mlp" | "cnn"); samples_per_sec -1 on error.
CaseRun MeshlearnSamplesPerSec(const std::string& src, const std::string& model, int steps) {
  CaseRun run;
  Result<TaskSpec> task =
      TaskSpec::Load(Env::Default(), src + "/examples/fashion-" + model + ".toml");
  if (!task.ok()) {
    std::fprintf(stderr, "error: %s\n", task.status().ToString().c_str());
    return run;
  }
  task->batch_size = 64;
  TaskData data;
  if (std::filesystem::exists(task->data.train_x)) {
    Result<TaskData> d = LoadTaskData(Env::Default(), *task);
    if (!d.ok()) {
      std::fprintf(stderr, "error: %s\n", d.status().ToString().c_str());
      return run;
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
    return run;
  }
  for (int i = 0; i < 20; ++i) (*tr)->Step();  // warm-up: arena, thread pool, caches
  const double cpu0 = ProcessCpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) (*tr)->Step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = ProcessCpuSeconds() - cpu0;
  run.samples_per_sec = steps * 64.0 / secs;
  run.cpus_used = cpu_secs / secs;
  run.samples_per_cpu_sec = steps * 64.0 / cpu_secs;
  return run;
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
  const double macs = GptMatmulMacsPerToken((*tr)->state().model->spec().gpt, 256);
  // Tokens per process-CPU-second (all threads): what a busy host's time slicing does not distort;
  // at 1 thread it is the rate the step would have on an idle core.
  nlohmann::json j = {{"tokens_per_sec", steps * 8.0 * 256.0 / secs},
                      {"tokens_per_cpu_sec", steps * 8.0 * 256.0 / cpu_secs},
                      {"peak_rss_mb", PeakRssMb()},
                      {"params", params},
                      {"matmul_macs_per_token", macs}};
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
  double fma_peak = 0;  // GFLOP/s on one thread, measured before the first gpt case's line
  for (const std::string& t : threads) {
    const int n = std::atoi(t.c_str());
    if (Status s = SetKernelConfig({*path, n}); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 2;
    }
    for (const std::string& b : benches) {
      if (b == "gpt") {
        const int gpt_steps = std::max(steps / 40, 3);
        const double load = LoadAverage1();
        const double machine = n > 1 ? MachineScaling(*path, n) : 1.0;
        const double round_trip = n > 1 ? CoreToCoreRoundTripNs() : 0.0;
        nlohmann::json child = RunJson(SelfExe() + " --gpt-child --threads=" + t +
                                       " --simd=" + simd + " --steps=" + std::to_string(gpt_steps));
        if (child.is_discarded() || !child.contains("tokens_per_sec")) {
          std::fprintf(stderr, "error: the gpt case failed (run %s --gpt-child --threads=%s)\n",
                       SelfExe().c_str(), t.c_str());
          return 1;
        }
        const double ml = child["tokens_per_sec"].get<double>();
        if (fma_peak == 0) fma_peak = FmaPeakGflops(*path);
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
                            {"meshlearn_peak_rss_mb", child["peak_rss_mb"]},
                            {"load1", load}};
        if (n > 1) {
          j["machine_scaling"] = machine;
          j["core_round_trip_ns"] = round_trip;
        }
        if (one_thread_rate.count(b)) j["scaling"] = ml / one_thread_rate[b];
        // The rate no fp32 implementation of these products can pass on this machine: every
        // multiply-add at the FMA peak of each thread, and nothing else taking any time.
        const double macs = child.value("matmul_macs_per_token", 0.0);
        double bound = -1;
        if (fma_peak > 0 && macs > 0) {
          bound = n * fma_peak * 1e9 / (2.0 * macs);
          j["fma_peak_gflops_per_thread"] = fma_peak;
          j["matmul_gflop_per_step"] = 2.0 * macs * 8.0 * 256.0 / 1e9;
          j["fma_bound_tokens_per_sec"] = bound;
          j["meshlearn_share_of_fma_bound"] = ml / bound;
        }
        if (pt > 0) {
          if (bound > 0) j["ratio_bound"] = bound / pt;
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
      const double load = LoadAverage1(), steal0 = StealSeconds();
      const double machine = n > 1 ? MachineScaling(*path, n) : 1.0;
      const double round_trip = n > 1 ? CoreToCoreRoundTripNs() : 0.0;
      const CaseRun run = MeshlearnSamplesPerSec(src, b, case_steps);
      const double steal = steal0 < 0 ? -1 : StealSeconds() - steal0;
      const double ml = run.samples_per_sec;
      if (ml < 0) return 1;
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
                          {"meshlearn_samples_per_sec", ml},
                          {"meshlearn_samples_per_cpu_sec", run.samples_per_cpu_sec},
                          {"meshlearn_cpus_used", run.cpus_used},
                          {"load1", load},
                          {"steal_s", steal}};
      if (n > 1) {
        j["machine_scaling"] = machine;
        j["core_round_trip_ns"] = round_trip;
      }
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
