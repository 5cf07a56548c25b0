#include "meshlearn/node/bench.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/task_bundle.h"

namespace meshlearn::node {

namespace {

constexpr char kBenchTask[] = R"(
[task]
name = "meshlearn-standard-bench"
seed = 1
[data]
format = "idx"
train_images = "none"
train_labels = "none"
test_images = "none"
test_labels = "none"
[model]
input = [784]
[[model.layers]]
kind = "linear"
out = 256
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 128
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 10
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 1000000
batch_size = 64
)";

}  // namespace

uint64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
}

uint32_t OnlineCores() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

Result<uint64_t> FreeDiskBytes(const std::string& path) {
  struct statvfs fs;
  if (::statvfs(path.c_str(), &fs) != 0) {
    const int err = errno;
    return Unavailable("cannot measure the free disk of " + path + ": " + std::strerror(err));
  }
  return static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize);
}

Result<uint64_t> OfferedDiskBytes(uint64_t limit, uint64_t free_bytes, const std::string& data_dir,
                                  const std::string& what) {
  if (limit == 0) return std::max<uint64_t>(free_bytes - free_bytes / 10, 1);
  if (limit > free_bytes) {
    return FailedPrecondition(
        what + " = " + std::to_string(limit) + " bytes is more disk than the data dir " +
        data_dir + " has free (" + std::to_string(free_bytes) +
        " bytes): the ledger would place pipeline stages whose files cannot be written. Lower " +
        what + " to at most " + std::to_string(free_bytes) +
        " (0: nine tenths of the free space), or free space on that disk");
  }
  return limit;
}

ledger::NodeCapabilities BenchResult::ToCapabilities() const {
  return {.cores = cores,
          .memory_bytes = memory_bytes,
          .accelerator = "",
          .throughput = flops_per_s,
          .latency_ms = latency_ms,
          .bandwidth_bytes_per_s = bandwidth_bytes_per_s};
}

nlohmann::json BenchResult::ToJson() const {
  return {{"throughput", flops_per_s},   {"memory_bytes", memory_bytes},
          {"cores", cores},              {"latency_ms", latency_ms},
          {"bandwidth_bytes_per_s", bandwidth_bytes_per_s},
          {"steps", steps},              {"seconds", seconds},
          {"workload", "mlp 784-256-128-10 adamw batch 64"}};
}

Result<BenchResult> RunStandardBench(const BenchOptions& options) {
  ML_ASSIGN_OR_RETURN(engine::TaskSpec spec, engine::TaskSpec::Parse(kBenchTask, "bench", ""));
  const int64_t n = 1024;
  engine::TaskData data;
  std::vector<float> x(static_cast<size_t>(n * 784));
  Rng rng(1, 2);
  for (float& v : x) v = static_cast<float>(rng.UniformDouble()) - 0.5f;
  data.train.x = engine::Tensor({n, 784}, x);
  data.train.y.resize(n);
  for (int64_t i = 0; i < n; ++i) data.train.y[i] = static_cast<int32_t>(rng.Uniform(10));
  data.train.num_classes = 10;
  data.test = data.train;
  ML_ASSIGN_OR_RETURN(auto trainer, engine::Trainer::Create(spec, std::move(data)));
  const uint64_t per_sample =
      EstimateFlopsPerSample(trainer->task(), trainer->FlatParams().size());
  trainer->Step();  // warm-up (allocations)
  auto start = std::chrono::steady_clock::now();
  BenchResult r;
  for (;;) {
    trainer->Step();
    ++r.steps;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r.steps >= 5 && r.seconds >= options.seconds) break;
  }
  r.flops_per_s = static_cast<uint64_t>(static_cast<double>(r.steps) *
                                        static_cast<double>(trainer->samples_per_step()) *
                                        static_cast<double>(per_sample) / r.seconds);
  r.memory_bytes = PhysicalMemoryBytes();
  r.cores = OnlineCores();
  r.latency_ms = options.latency_ms;
  r.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
  return r;
}

}  // namespace meshlearn::node
