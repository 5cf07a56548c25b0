// Test helpers for pipeline tasks (issue 15): the task whose DiLoCo rounds the pipeline tests run
// as chains of stages and its oracle (`meshlearn diloco`). The weight copies between a whole model
// and its stages are the library's (stage_unit.h).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/stage_unit.h"  // CopyWholeParams, GatherStageParams

namespace meshlearn::node {

// A 3-block GPT on the GPL text (Debian's base-files, always installed), 2 micro-batches per step,
// 2 rounds x 2 replicas x 3 inner steps, 3 stages.
inline constexpr char kPipelineGptTask[] = R"(
[task]
name = "pipeline-diloco"
seed = 3
[data]
format = "text"
path = "/usr/share/common-licenses/GPL-3"
[model]
kind = "gpt"
n_layer = 3
n_head = 2
n_embd = 16
block_size = 16
[optimizer]
kind = "adamw"
lr = 3e-3
weight_decay = 0.1
grad_clip = 0.5
[train]
steps = 10
batch_size = 4
micro_batches = 2
[network]
rounds = 2
units_per_round = 2
inner_steps = 3
stages = 3
aggregation = "mean"
inner_lr_final = 0.5
)";

// kPipelineGptTask loaded, with what `meshlearn diloco` (RunLocalDiloco: every unit unsplit, with
// the task's micro-batches) computes for it: what a pipeline run of it must equal bit for bit.
struct PipelineOracle {
  NetworkSpec net;
  engine::TaskSpec task;
  engine::TaskData data;
  LocalDilocoResult want;
};

// Fills `out` (gtest fatal failures on error: call through ASSERT_NO_FATAL_FAILURE).
inline void LoadPipelineOracle(PipelineOracle* out) {
  Result<ConfigFile> cfg = ConfigFile::Parse(kPipelineGptTask, "pipeline.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Result<engine::TaskSpec> task = engine::TaskSpec::Parse(kPipelineGptTask, "pipeline.toml", "/");
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *task);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  Result<std::unique_ptr<engine::Trainer>> ref = engine::Trainer::Create(*task, *data);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  LocalDilocoOptions opt;
  opt.eval_every_round = false;
  Result<LocalDilocoResult> want = RunLocalDiloco(ref->get(), *net, opt);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  out->net = std::move(*net);
  out->task = std::move(*task);
  out->data = std::move(*data);
  out->want = std::move(*want);
}

}  // namespace meshlearn::node
