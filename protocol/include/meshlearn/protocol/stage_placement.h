// Placing pipeline stages on nodes by memory and speed (issue 15; docs/protocol.md "Pipeline
// stage placement").
//
// A pipeline task runs R replicas, each a chain of S stages; stage s needs `memory_bytes` (its
// parameters, gradients, optimizer state and the activations of M micro-batches in flight:
// engine::CutCosts total_bytes) and does `flops` per step. PlaceStages picks the node of every
// (replica, stage) slot, a deterministic function of its inputs (integers only, no randomness),
// so every follower of the chain computes the same chains:
//
//   * eligible nodes: the scheduler's CheckEligibility (active, live heartbeat, price, reported
//     throughput, reputation) with the smallest stage's memory as the task's need;
//   * a slot goes only to a node whose memory_bytes holds its stage, and a node takes one slot;
//   * heavier stages first (FLOPs, then memory, then stage, then replica): each takes the fastest
//     node left (throughput_flops; then the smaller memory, keeping larger nodes for the stages
//     that need them; then the node id) among those whose choice still lets every remaining slot
//     be filled -- so faster nodes get the heavier stages, and a placement is found whenever one
//     exists (checked against exhaustive search in the tests).
//
//   std::vector<StageNeed> needs = ...;   // per stage, from CutCosts
//   Result<std::vector<std::vector<NodeId>>> chains =
//       PlaceStages(task, needs, /*replicas=*/2, nodes, height, params);
//   // (*chains)[r][s]: the node of stage s of replica r
//
// Not yet: link latency and bandwidth between consecutive stages (nodes do not measure or
// report their links yet), and placing more than one stage on a node.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/status.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

struct StageNeed {
  uint64_t memory_bytes = 0;  // what a node must hold to run the stage
  uint64_t flops = 0;         // training FLOPs of one step of the stage
};

// The chains: result[r][s] is the node of stage s of replica r (see the top of the file).
// InvalidArgument for no stages or no replicas; FailedPrecondition when no placement exists,
// naming the stage that cannot be placed, its memory, how many eligible nodes hold that much
// against how many slots need it, and the fix.
Result<std::vector<std::vector<NodeId>>> PlaceStages(
    const TaskSpecView& task, std::span<const StageNeed> stages, uint32_t replicas,
    std::span<const NodeView> nodes, uint64_t height, const SchedulerParams& params);

}  // namespace meshlearn::protocol
