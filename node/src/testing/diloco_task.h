// Test helpers: the Fashion-MNIST MLP as a network task, and a trainer + spec built from it.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/network_task.h"

namespace meshlearn::node {

// The in-process reference of a network task file (RunLocalDiloco): the final weights a network
// running `toml` must reach bit for bit.
inline std::vector<float> LocalReference(Env* env, const std::string& toml) {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(toml, "ref.toml", "");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(toml, "ref.toml");
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  EXPECT_TRUE(net.ok());
  auto trainer = engine::Trainer::Create(env, *spec);
  EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
  Result<LocalDilocoResult> r = RunLocalDiloco(trainer->get(), *net, {.eval_every_round = false});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->final_weights : std::vector<float>{};
}

// Fashion-MNIST MLP 784-256-128-10 as a network task: inner AdamW at a constant rate (every unit
// restarts its inner optimizer, so warm-up schedules do not fit), DiLoCo outer Nesterov.
inline std::string MlpTask(int rounds, int units, int inner_steps, const std::string& rule) {
  return R"(
[task]
name = "fashion-mlp-diloco"
seed = 1
[data]
format = "idx"
train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
mean = 0.2860
std = 0.3530
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
init = "xavier"
[optimizer]
kind = "adamw"
lr = 1e-3
weight_decay = 0.0
[train]
steps = 1
batch_size = 64
[network]
rounds = )" + std::to_string(rounds) + "\nunits_per_round = " + std::to_string(units) +
         "\ninner_steps = " + std::to_string(inner_steps) +
         "\ninner_lr_final = 0.1\ncheckpoint_interval = " + std::to_string(std::min(10, inner_steps)) + "\naggregation = \"" + rule + "\"\n";
}

// A small Fashion-MNIST MLP 784-hidden-10 trainer (AdamW 1e-3) for tests of units, replays and
// adversaries; owned by the caller.
inline engine::Trainer* SmallFashionTrainer(const std::string& name, int seed, int hidden,
                                            int batch_size) {
  const std::string text = "[task]\nname = \"" + name + "\"\nseed = " + std::to_string(seed) + R"(
[data]
format = "idx"
train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
[model]
input = [784]
[[model.layers]]
kind = "linear"
out = )" + std::to_string(hidden) + R"(
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 10
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 1
batch_size = )" + std::to_string(batch_size) + "\n";
  Result<engine::TaskSpec> task = engine::TaskSpec::Parse(text, name + ".toml", ".");
  EXPECT_TRUE(task.ok()) << task.status().ToString();
  if (!task.ok()) return nullptr;
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(Env::Default(), *task);
  EXPECT_TRUE(tr.ok()) << tr.status().ToString();
  return tr.ok() ? tr->release() : nullptr;
}

struct DilocoSetup {
  std::unique_ptr<engine::Trainer> trainer;
  NetworkSpec net;
};

inline DilocoSetup Make(const std::string& text) {
  DilocoSetup s;
  Result<engine::TaskSpec> task = engine::TaskSpec::Parse(text, "diloco.toml", ".");
  EXPECT_TRUE(task.ok()) << task.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(text, "diloco.toml");
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  s.net = *net;
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(Env::Default(), *task);
  EXPECT_TRUE(tr.ok()) << tr.status().ToString();
  s.trainer = std::move(*tr);
  return s;
}

}  // namespace meshlearn::node
