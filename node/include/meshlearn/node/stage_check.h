// One step of a stage unit checked on a verifying chain (issue 15; docs/verification.md,
// "Pipeline stages"): what a verifier drawn for the stage unit and the genesis referee ruling its
// dispute both run, so that both derive the same value from the same evidence.
//
// The stage's step is replayed alone from what its node serves (stage_evidence.h: the step's
// commit, its checkpoint of the step's start, the tensors it received), on the step's batch of
// the replica's work (protocol::UnitWorkOf of (round, replica), as the Stager trains it), with
// ReplayStageStep. The result is StageFindingLeaf: the committed step leaf when the replay finds
// nothing, another hash naming the finding otherwise. A node that serves no evidence for the step
// (NotFound), or a commit whose StageStepLeaf is not the committed leaf, is the finding
// `unserved` (StageUnservedLeaf): a stage must show what it committed. Any other fetch error is
// returned (retried later): a verifier never claims a mismatch for a network fault.
//
//   StageCheckInput in{.trainer = trainer, .task = task_spec, .net = &net, .facts = &facts,
//                      .global = start.weights, .task_id = id, .round = r, .replica = rep,
//                      .stage = s, .chain = chain, .transport = transport, .endpoint = url};
//   ML_ASSIGN_OR_RETURN(StageStepCheck c, CheckStageStep(in, step, committed_leaf));
//   if (c.leaf != committed_leaf) ...   // a mismatch: c.message says what
//
// Thread-compatible: uses `trainer` (StartUnit, BatchForStep).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/stage_replay.h"
#include "meshlearn/node/task_bundle.h"

namespace meshlearn::node {

struct StageCheckInput {
  engine::Trainer* trainer = nullptr;  // the task's
  const NetworkSpec* net = nullptr;
  const TaskFacts* facts = nullptr;
  std::span<const float> global;  // the round's start weights
  protocol::TaskId task_id;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  std::vector<protocol::NodeId> chain;  // the replica's nodes, stage by stage
  net::Transport* transport = nullptr;
  std::string endpoint;  // the stage node's
};

struct StageStepCheck {
  Hash256 leaf;               // StageFindingLeaf (== the committed leaf: nothing found)
  StageReplayResult replay;   // the replay's finding (fault none when it ran clean)
  std::string message;        // what was found, for logs
};

Result<StageStepCheck> CheckStageStep(const StageCheckInput& in, uint64_t step,
                                      const Hash256& committed_leaf);

// The nodes of `replica`'s stages in `round`, from get_task's units (a zero id where a stage has
// no node). REQUIRES: net.stages > 1.
std::vector<protocol::NodeId> ReplicaChain(const std::vector<UnitRecord>& units, uint32_t stages,
                                           uint32_t round, uint32_t replica);

}  // namespace meshlearn::node
