// Test helpers: a tiny synthetic classification task (npy files) that trains in milliseconds, so
// whole-network tests can run dozens of nodes in one process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/base/status.h"

namespace meshlearn::node::testing {

// A .npy (format 1.0) file of little-endian float32 (descr "<f4") or int32 ("<i4") values.
inline std::string NpyBytes(const std::string& descr, const std::vector<int64_t>& shape,
                            const void* data, size_t bytes) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i) sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  sh += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(1);
  out += static_cast<char>(0);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

// Writes train/test npy files under `dir`: x in R^dim, y = argmax of a random linear map (plus
// noise), so a small MLP learns it. Returns the task TOML (absolute data paths) with a [network]
// table; k = 0 leaves checkpoint_interval out (its default: inner_steps).
inline Result<std::string> WriteSyntheticTask(Env* env, const std::string& dir, uint64_t seed,
                                              int64_t n_train, int64_t n_test, int64_t dim,
                                              int64_t classes, uint32_t rounds, uint32_t units,
                                              uint32_t inner_steps, uint32_t k,
                                              const std::string& aggregation = "mean",
                                              int64_t hidden = 16) {
  ML_RETURN_IF_ERROR(env->CreateDirs(dir));
  Rng rng(seed, 7);
  std::vector<float> w(static_cast<size_t>(dim * classes));
  for (float& v : w) v = static_cast<float>(rng.Uniform(2001)) / 1000.0f - 1.0f;
  auto make = [&](int64_t n, const std::string& x_name, const std::string& y_name) -> Status {
    std::vector<float> x(static_cast<size_t>(n * dim));
    std::vector<int32_t> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < dim; ++d) {
        x[i * dim + d] = static_cast<float>(rng.Uniform(2001)) / 1000.0f - 1.0f;
      }
      int32_t best = 0;
      float best_v = -1e30f;
      for (int64_t c = 0; c < classes; ++c) {
        float s = 0;
        for (int64_t d = 0; d < dim; ++d) s += w[c * dim + d] * x[i * dim + d];
        if (s > best_v) best_v = s, best = static_cast<int32_t>(c);
      }
      y[i] = best;
    }
    ML_RETURN_IF_ERROR(env->WriteFileAtomic(
        JoinPath(dir, x_name), NpyBytes("<f4", {n, dim}, x.data(), x.size() * 4)));
    return env->WriteFileAtomic(JoinPath(dir, y_name),
                                NpyBytes("<i4", {n}, y.data(), y.size() * 4));
  };
  ML_RETURN_IF_ERROR(make(n_train, "train_x.npy", "train_y.npy"));
  ML_RETURN_IF_ERROR(make(n_test, "test_x.npy", "test_y.npy"));
  return "# synthetic test task\n[task]\nname = \"synthetic\"\nseed = " + std::to_string(seed) +
         "\n\n[data]\nformat = \"npy\"\ntrain_x = \"" + JoinPath(dir, "train_x.npy") +
         "\"  # features\ntrain_y = \"" + JoinPath(dir, "train_y.npy") + "\"\ntest_x = \"" +
         JoinPath(dir, "test_x.npy") + "\"\ntest_y = \"" + JoinPath(dir, "test_y.npy") +
         "\"\n\n[model]\ninput = [" + std::to_string(dim) +
         "]\n[[model.layers]]\nkind = \"linear\"\nout = " + std::to_string(hidden) + "\n[[model.layers]]\nkind = \"relu\"\n"
         "[[model.layers]]\nkind = \"linear\"\nout = " + std::to_string(classes) +
         "\n\n[optimizer]\nkind = \"adamw\"\nlr = 0.01\nweight_decay = 0.0\n\n[train]\nsteps = 1\n"
         "batch_size = 16\neval_batch_size = 256\n\n[network]\nrounds = " + std::to_string(rounds) +
         "\nunits_per_round = " + std::to_string(units) + "\ninner_steps = " +
         std::to_string(inner_steps) +
         // k = 0: leave the key out, so it takes its default (inner_steps); an explicit 0 is
         // refused.
         (k == 0 ? std::string() : "\ncheckpoint_interval = " + std::to_string(k)) +
         "\naggregation = \"" + aggregation + "\"\ninner_lr_final = 0.5\nbudget = 100000000\n"
         "price_cap = 1000\n";
}

}  // namespace meshlearn::node::testing
