#include "meshlearn/engine/backend.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "kernels_internal.h"
#include "meshlearn/base/cpu.h"

namespace meshlearn::engine {
namespace {

SimdPath BestSupported() {
  if (SimdPathSupported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  if (SimdPathSupported(SimdPath::kAvx2)) return SimdPath::kAvx2;
  return SimdPath::kScalar;
}

int DefaultThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

struct State {
  KernelConfig config;
  std::atomic<const internal::KernelTable*> table{nullptr};
};

const internal::KernelTable* TableFor(SimdPath p) {
#if defined(MESHLEARN_ENGINE_X86)
  if (p == SimdPath::kAvx512) return &internal::Avx512KernelTable();
  if (p == SimdPath::kAvx2) return &internal::Avx2KernelTable();
#endif
  (void)p;
  return &internal::ScalarKernelTable();
}

Result<KernelConfig> ConfigFromEnv() {
  KernelConfig config;
  config.simd = BestSupported();
  config.threads = DefaultThreads();
  if (const char* simd = std::getenv("MESHLEARN_SIMD"); simd != nullptr && *simd != '\0') {
    Result<SimdPath> p = ParseSimdPath(simd);
    if (!p.ok()) return p.status().WithPrefix("MESHLEARN_SIMD");
    config.simd = *p;
    if (!SimdPathSupported(config.simd)) {
      return FailedPrecondition("MESHLEARN_SIMD=" + std::string(simd) +
                                ": this CPU does not support it; use auto, scalar or avx2");
    }
  }
  if (const char* th = std::getenv("MESHLEARN_THREADS"); th != nullptr && *th != '\0') {
    char* end = nullptr;
    long v = std::strtol(th, &end, 10);
    if (end == th || *end != '\0' || v < 1 || v > 1024) {
      return InvalidArgument("MESHLEARN_THREADS must be an integer in [1, 1024], got '" +
                             std::string(th) + "'");
    }
    config.threads = static_cast<int>(v);
  }
  return config;
}

// Initialised on first use from the environment; an invalid environment falls back to the
// defaults with a message (ConfigureFromEnv() returns the error to callers that want it).
State& GlobalState() {
  static State* state = [] {
    auto* s = new State();
    Result<KernelConfig> c = ConfigFromEnv();
    if (c.ok()) {
      s->config = *c;
    } else {
      std::fprintf(stderr, "meshlearn engine: %s (using defaults)\n",
                   c.status().ToString().c_str());
      s->config.simd = BestSupported();
      s->config.threads = DefaultThreads();
    }
    s->table = TableFor(s->config.simd);
    return s;
  }();
  return *state;
}

}  // namespace

std::string_view SimdPathName(SimdPath p) {
  switch (p) {
    case SimdPath::kScalar:
      return "scalar";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Result<SimdPath> ParseSimdPath(std::string_view name) {
  if (name == "auto") return BestSupported();
  if (name == "scalar") return SimdPath::kScalar;
  if (name == "avx2") return SimdPath::kAvx2;
  if (name == "avx512") return SimdPath::kAvx512;
  return InvalidArgument("unknown SIMD path '" + std::string(name) +
                         "'; expected auto, scalar, avx2 or avx512");
}

bool SimdPathSupported(SimdPath p) {
#if defined(MESHLEARN_ENGINE_X86)
  const CpuFeatures& f = GetCpuFeatures();
  switch (p) {
    case SimdPath::kScalar:
      return true;
    case SimdPath::kAvx2:
      return f.avx2 && f.fma;
    case SimdPath::kAvx512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma;
  }
  return false;
#else
  return p == SimdPath::kScalar;
#endif
}

const KernelConfig& GetKernelConfig() { return GlobalState().config; }

Status SetKernelConfig(KernelConfig config) {
  if (!SimdPathSupported(config.simd)) {
    return FailedPrecondition("this CPU does not support the " +
                              std::string(SimdPathName(config.simd)) + " kernel path");
  }
  if (config.threads < 1) {
    return InvalidArgument("kernel threads must be >= 1, got " + std::to_string(config.threads));
  }
  State& s = GlobalState();
  s.config = config;
  s.table = TableFor(config.simd);
  return Status::Ok();
}

Status ConfigureFromEnv() {
  Result<KernelConfig> c = ConfigFromEnv();
  if (!c.ok()) return c.status();
  return SetKernelConfig(*c);
}

namespace internal {
const KernelTable& ActiveKernelTable() {
  return *GlobalState().table.load(std::memory_order_relaxed);
}
int ActiveThreads() { return GlobalState().config.threads; }
}  // namespace internal

}  // namespace meshlearn::engine
