// Test helper: examples/fashion-mlp.toml loaded as the size and cost tests of real witnesses use
// it (the task file, its engine spec, its network spec and a trainer on its data), or nothing
// when Fashion-MNIST is not installed; the caller then skips, visibly:
//
//   std::optional<testing::FashionMlp> fm = testing::LoadFashionMlp();
//   if (!fm) GTEST_SKIP() << "Fashion-MNIST not installed at " << testing::kFashionMnistDir;
//   auto& [path, spec, net, trainer] = *fm;
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "meshlearn/base/env.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node::testing {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist/";

struct FashionMlp {
  std::string path;  // examples/fashion-mlp.toml in the source tree
  engine::TaskSpec spec;
  protocol::NetworkSpec net;
  std::unique_ptr<engine::Trainer> trainer;
};

inline std::optional<FashionMlp> LoadFashionMlp() {
  Env* env = Env::Default();
  if (!env->FileExists(std::string(kFashionMnistDir) + "train-images-idx3-ubyte.gz")) {
    return std::nullopt;
  }
  FashionMlp t;
  t.path = std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-mlp.toml";
  t.spec = engine::TaskSpec::Load(env, t.path).value();
  t.net = protocol::NetworkSpec::Load(env, t.path).value();
  t.trainer = engine::Trainer::Create(env, t.spec).value();
  return t;
}

}  // namespace meshlearn::node::testing
