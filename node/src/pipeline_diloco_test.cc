// Issue 15's oracle at the level of a whole task: DiLoCo rounds whose units are each trained as a
// chain of pipeline stages (engine/pipeline.h) end bit-equal to `meshlearn diloco`
// (RunLocalDiloco), which trains every unit unsplit with the task's micro-batches. Everything but
// the units' training is the shared code (UnitWorkOf, PseudoGradient, ApplyRound).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {
namespace {

// A 3-block GPT on the GPL text (Debian's base-files, always installed), 2 micro-batches per step,
// 2 rounds x 2 replicas x 3 inner steps, 3 stages.
constexpr char kPipelineTask[] = R"(
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

// One unit as a pipeline replica: the stages of `cut`, from `global`, on the unit's batches
// (trainer->BatchForStep after StartUnit) at the unit's rate. Returns the trained weights in
// model order.
std::vector<float> TrainUnitInStages(engine::Trainer* trainer, const engine::PipelineCut& cut,
                                     const std::vector<float>& global, const UnitWork& work) {
  CHECK(trainer->StartUnit(work.stream, global, work.lr_scale).ok());
  const engine::TaskSpec& t = trainer->task();
  std::vector<std::unique_ptr<engine::Stage>> stages;
  for (int s = 0; s < cut.stages(); ++s) {
    Result<std::unique_ptr<engine::Stage>> st = engine::Stage::Create(
        t.model, engine::UnitOptimizerSpec(t.optimizer, work.lr_scale), cut, s, t.micro_batches);
    CHECK(st.ok()) << st.status().ToString();
    stages.push_back(std::move(*st));
  }
  std::map<std::string, const engine::Tensor*> whole;
  for (const engine::Param& p : trainer->state().model->params()) whole[p.name] = &p.value;
  for (std::unique_ptr<engine::Stage>& st : stages) {
    for (engine::Param& p : st->params()) p.value.vec() = whole.at(p.name)->vec();
  }
  stages.back()->SetTiedWeight(stages.front()->tied_weight_source());
  for (int64_t s = 0; s < work.inner_steps; ++s) {
    engine::RunPipelineStep(stages, trainer->BatchForStep(s),
                            engine::DropoutSeed(t.seed, work.stream));
  }
  std::map<std::string, const engine::Tensor*> trained;
  for (std::unique_ptr<engine::Stage>& st : stages) {
    for (const engine::Param& p : st->params()) trained[p.name] = &p.value;
  }
  std::vector<float> local;
  for (const engine::Param& p : trainer->state().model->params()) {
    const std::vector<float>& v = trained.at(p.name)->vec();
    local.insert(local.end(), v.begin(), v.end());
  }
  return local;
}

TEST(PipelineDilocoTest, ReplicasOfThreeStagesEndBitEqualToMeshlearnDiloco) {
  Result<ConfigFile> cfg = ConfigFile::Parse(kPipelineTask, "pipeline.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Result<engine::TaskSpec> task = engine::TaskSpec::Parse(kPipelineTask, "pipeline.toml", "/");
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *task);
  ASSERT_TRUE(data.ok()) << data.status().ToString();

  // meshlearn diloco: every unit unsplit, with the task's micro-batches.
  Result<std::unique_ptr<engine::Trainer>> ref = engine::Trainer::Create(*task, *data);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  LocalDilocoOptions opt;
  opt.eval_every_round = false;
  Result<LocalDilocoResult> want = RunLocalDiloco(ref->get(), *net, opt);
  ASSERT_TRUE(want.ok()) << want.status().ToString();

  // The same rounds with every unit a chain of stages.
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(*task, *data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  engine::Trainer* trainer = tr->get();
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(trainer->task(), static_cast<int>(net->stages), net->cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->stages(), 3);
  const protocol::TaskSpecView view = MakeTaskView(*trainer, *net);
  GlobalState state = InitialState(*trainer);
  const uint64_t samples = UnitSamples(*trainer, *net);
  for (uint32_t r = 0; r < net->rounds; ++r) {
    std::vector<std::vector<float>> deltas;
    for (uint32_t i = 0; i < net->units_per_round; ++i) {
      const UnitWork work = protocol::UnitWorkOf(*net, view.seed, view.id, r, i);
      const std::vector<float> local = TrainUnitInStages(trainer, *cut, state.weights, work);
      deltas.push_back(protocol::PseudoGradient(state.weights, local));
    }
    std::vector<RoundDelta> round;
    for (uint32_t i = 0; i < net->units_per_round; ++i) {
      round.push_back({.shard = i, .delta = deltas[i]});
    }
    ASSERT_TRUE(ApplyRound(&state, round, *net, view.id, r, samples).ok());
    EXPECT_EQ(HashFloats(state.weights), want->rounds[r].global_hash) << "round " << r;
  }
  EXPECT_EQ(HashFloats(state.weights), want->final_hash);
}

}  // namespace
}  // namespace meshlearn::node
