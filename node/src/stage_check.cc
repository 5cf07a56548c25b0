#include "meshlearn/node/stage_check.h"

#include <utility>

#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

Result<StageStepCheck> CheckStageStep(const StageCheckInput& in, uint64_t step,
                                      const Hash256& committed_leaf) {
  const StageStepRef ref{.task = in.task_id,
                         .round = in.round,
                         .replica = in.replica,
                         .stage = in.stage,
                         .step = step};
  StageStepCheck out;
  Result<StageStepEvidence> ev = FetchStageStepEvidence(in.transport, in.endpoint, ref);
  if (!ev.ok() && ev.status().code() != StatusCode::kNotFound) {
    return ev.status().WithPrefix(ref.ToString() + ": fetching its evidence");
  }
  if (!ev.ok() || protocol::StageStepLeaf(ev->commit) != committed_leaf) {
    out.leaf = StageUnservedLeaf(committed_leaf);
    out.replay.fault = StageFault::kStageFaultUnserved;
    out.message = ref.ToString() + ": unserved: " +
                  (ev.ok() ? "the served commit is not the committed step leaf " +
                                 committed_leaf.ShortHex()
                           : ev.status().message());
    return out;
  }
  // The replica's work as the Stager trains it: its batches, inner rate and dropout stream.
  const engine::TaskSpec& task = in.trainer->task();
  const UnitWork work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  if (step >= static_cast<uint64_t>(work.inner_steps)) {
    return InvalidArgument(ref.ToString() + ": the step is outside the unit's " +
                           std::to_string(work.inner_steps) + " steps");
  }
  ML_RETURN_IF_ERROR(in.trainer->StartUnit(work.stream, in.global, work.lr_scale));
  const engine::Batch batch = in.trainer->BatchForStep(static_cast<int64_t>(step));
  StageReplaySetup setup;
  setup.model = task.model;
  setup.optimizer = engine::UnitOptimizerSpec(task.optimizer, work.lr_scale);
  ML_ASSIGN_OR_RETURN(setup.cut, engine::TaskPipelineCut(task, static_cast<int>(in.net->stages),
                                                         in.net->cut));
  setup.micro_batches = task.micro_batches;
  setup.chain = in.chain;
  Result<engine::TrainState> start = StageCheckpointState(ev->checkpoint);
  if (!start.ok()) {
    // A checkpoint that does not load cannot hash to state_before: the stage's `start` fault.
    out.replay.fault = StageFault::kStageFaultStart;
    out.replay.replica = in.replica;
    out.replay.stage = in.stage;
    out.replay.step = step;
    out.replay.claimed = ev->commit.state_before;
    out.leaf = StageFindingLeaf(committed_leaf, out.replay);
    out.message = ref.ToString() + ": start: its checkpoint does not load (" +
                  start.status().message() + ")";
    return out;
  }
  ML_ASSIGN_OR_RETURN(out.replay,
                      ReplayStageStep(setup, std::move(*start), ev->commit, ev->blobs, batch,
                                      engine::DropoutSeed(task.seed, work.stream)));
  out.leaf = StageFindingLeaf(committed_leaf, out.replay);
  out.message = out.replay.ok() ? ref.ToString() + ": replays to its committed leaf"
                                : out.replay.message;
  return out;
}

std::vector<protocol::NodeId> ReplicaChain(const std::vector<UnitRecord>& units, uint32_t stages,
                                           uint32_t round, uint32_t replica) {
  std::vector<protocol::NodeId> chain(stages);
  for (const UnitRecord& u : units) {
    if (u.round == round && u.shard / stages == replica) chain[u.shard % stages] = u.assignee;
  }
  return chain;
}

}  // namespace meshlearn::node
