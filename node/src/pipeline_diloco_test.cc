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
#include "testing/pipeline_task.h"

namespace meshlearn::node {
namespace {

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
  for (std::unique_ptr<engine::Stage>& st : stages) CopyWholeParams(*trainer->state().model, *st);
  stages.back()->SetTiedWeight(stages.front()->tied_weight_source());
  for (int64_t s = 0; s < work.inner_steps; ++s) {
    engine::RunPipelineStep(stages, trainer->BatchForStep(s),
                            engine::DropoutSeed(t.seed, work.stream));
  }
  return GatherStageParams(stages);
}

TEST(PipelineDilocoTest, ReplicasOfThreeStagesEndBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  const NetworkSpec& net = o.net;
  const LocalDilocoResult& want = o.want;

  // The same rounds with every unit a chain of stages.
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(o.task, o.data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  engine::Trainer* trainer = tr->get();
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(trainer->task(), static_cast<int>(net.stages), net.cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->stages(), 3);
  const protocol::TaskSpecView view = MakeTaskView(*trainer, net);
  GlobalState state = InitialState(*trainer);
  const uint64_t samples = UnitSamples(*trainer, net);
  for (uint32_t r = 0; r < net.rounds; ++r) {
    std::vector<std::vector<float>> deltas;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      const UnitWork work = protocol::UnitWorkOf(net, view.seed, view.id, r, i);
      const std::vector<float> local = TrainUnitInStages(trainer, *cut, state.weights, work);
      deltas.push_back(protocol::PseudoGradient(state.weights, local));
    }
    std::vector<RoundDelta> round;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      round.push_back({.shard = i, .delta = deltas[i]});
    }
    ASSERT_TRUE(ApplyRound(&state, round, net, view.id, r, samples).ok());
    EXPECT_EQ(HashFloats(state.weights), want.rounds[r].global_hash) << "round " << r;
  }
  EXPECT_EQ(HashFloats(state.weights), want.final_hash);
}

}  // namespace
}  // namespace meshlearn::node
