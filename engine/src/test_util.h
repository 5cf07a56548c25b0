// Test helpers shared by the engine tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/rng.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/train.h"

namespace meshlearn::engine::testing {

// Whether Debian's python3 can import torch: the PyTorch cross-checks skip, saying so, without it.
inline bool TorchAvailable() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

// The pipeline tests' optimizer: AdamW clipping at a small norm, so clipping happens and the
// gradient norm's chain across a pipeline's stages matters.
inline OptimizerSpec ClippedAdamW() {
  OptimizerSpec o;
  o.kind = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.grad_clip = 0.05;
  return o;
}

inline std::vector<float> RandomVec(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * static_cast<float>(rng.UniformDouble());
  return v;
}

// A classification task's data for tests: n examples of shape `example` (e.g. {70} or
// {1, 28, 28}) drawn uniformly in [lo, hi) from Rng(seed), then their labels in [0, classes) from
// the same generator; the test split is the train split.
inline TaskData RandomTaskData(int64_t n, std::vector<int64_t> example, int classes, uint64_t seed,
                               float lo, float hi) {
  Rng rng(seed);
  int64_t numel = n;
  for (int64_t d : example) numel *= d;
  std::vector<float> x(static_cast<size_t>(numel));
  for (float& v : x) v = static_cast<float>(rng.UniformDouble()) * (hi - lo) + lo;
  std::vector<int64_t> shape = {n};
  shape.insert(shape.end(), example.begin(), example.end());
  TaskData d;
  d.train.x = Tensor(shape, x);
  d.train.y.resize(static_cast<size_t>(n));
  for (int32_t& y : d.train.y)
    y = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(classes)));
  d.train.num_classes = classes;
  d.test = d.train;
  return d;
}

// Whether a and b hold the same floats, bit for bit (no memcmp on an empty vector's null data).
inline bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b, std::string* why) {
  if (a.size() != b.size()) {
    *why = "size " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      *why = "index " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]);
      return false;
    }
  }
  return true;
}

// Every (SIMD path the CPU supports) x (threads 1, 2, 4) configuration.
inline std::vector<KernelConfig> AllConfigs() {
  std::vector<KernelConfig> out;
  for (SimdPath p : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!SimdPathSupported(p)) continue;
    for (int t : {1, 2, 4}) out.push_back(KernelConfig{p, t});
  }
  return out;
}

// Restores the kernel configuration at scope exit.
class ConfigGuard {
 public:
  ConfigGuard() : saved_(GetKernelConfig()) {}
  ~ConfigGuard() { (void)SetKernelConfig(saved_); }

 private:
  KernelConfig saved_;
};

}  // namespace meshlearn::engine::testing
