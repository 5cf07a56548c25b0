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
//   * a slot goes only to a node whose memory_bytes holds its stage and whose declared disk,
//     less what the files of the stage units it holds take (disk_held_bytes), holds the stage's
//     files (StageHoldBytes: a node's memory, or less where that disk is the smaller offer), and
//     a node takes one slot; in every rule below a node's memory is its StageHoldBytes;
//   * heavier stages first (FLOPs, then memory, then stage, then replica): each takes the fastest
//     node left (throughput_flops; then the smaller memory, keeping larger nodes for the stages
//     that need them; then the node id) among those whose choice still lets every remaining slot
//     be filled -- so faster nodes get the heavier stages, and a placement is found whenever one
//     exists (checked against exhaustive search in the tests);
//   * then links (issue 15: nodes report what they measured, NodeView::links): the R nodes of a
//     stage are interchangeable (same need), so which replica each serves is free, and nodes
//     with equal throughput_flops and memory_bytes are interchangeable for the rules above (only
//     the id orders them), so which of them serve a stage is free too. At every boundary s-1 ->
//     s (s >= 1), given the replicas' stage s-1 nodes, the stage s nodes (its placed ones, or
//     free nodes equal to them: the R with the cheapest reported links from stage s-1 nodes;
//     each class of equal nodes keeping its count) are chosen and matched to the replicas so
//     that the boundary's total link cost (StageLinkCostUs of the bytes the task moves across
//     that boundary, summed over the R pairs) is the least
//     possible: an exact assignment (Hungarian algorithm, O(n^3) in the n <= 3R candidates; a
//     tie-break of at most O(n^4)), not the cheapest link first. Among choices of
//     equal total, replica 0 takes the first candidate (the placed nodes in replica order, then
//     the placement order) that still allows the least total, then replica 1, and so on, so
//     equal links keep the placement. Were every stage's nodes fixed, any pairing at each
//     boundary makes R chains and minimising boundary by boundary would be the minimum over the
//     whole chain; choosing nodes too, it is stage s given stage s-1 (the whole chain would be a
//     quadratic assignment). A boundary across which no node reported any link (or across which
//     nothing is sent: boundary_bytes 0) keeps the order
//     above (a node an earlier stage took replaced by the first free node equal to it), so
//     without reports the placement is exactly what it was before links existed. Every stage's
//     throughputs and memories never change, so the guarantees above hold.
//
//   std::vector<StageNeed> needs = ...;   // per stage, from CutCosts
//   std::vector<uint64_t> bytes = ...;    // per boundary, from CutBoundaryBytes
//   Result<std::vector<std::vector<NodeId>>> chains =
//       PlaceStages(task, needs, bytes, /*replicas=*/2, nodes, height, params);
//   // (*chains)[r][s]: the node of stage s of replica r
//
// Not yet: placing more than one stage on a node, and choosing nodes and pairs over the whole
// chain at once.
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

// The disk a node fills with the files of one stage unit that needs `memory_bytes`
// (StageNeed::memory_bytes: TaskParams::stage_memory_bytes, node::StageTermsOf) and trains
// `inner_steps` steps (H): inner_steps x memory_bytes, saturating at UINT64_MAX. Its stage
// evidence (docs/node.md, "Stage tensors live in files") is, each step, a checkpoint of the
// stage's weights and optimizer moments and the tensors it received and sent
// (StageTerms::step_tensor_bytes), all kept until the round is final; both are parts of the
// stage's memory need (engine::CutCosts' total holds the weights and moments beside their
// gradients and the activations; step_tensor_bytes is added to it), so H x the need bounds
// them, with the gradients and activations to spare. The bound is one unit's: a node's files of
// a round stay until that round is final (node::PinKeeper's ReleaseEvidence; a cancelled task's
// when the node sees it closed), beside its next units', so a node's disk is offered net of the
// units it holds (NodeView::disk_held_bytes: the ledger's sum of this over them).
uint64_t StageDiskBytes(uint64_t memory_bytes, uint32_t inner_steps);
// What `node` holds of a stage of a task of `inner_steps` steps: its memory_bytes, or, when it
// declared a disk (NodeView::disk_bytes, not 0) whose part not held by the files of its other
// stage units (disk_bytes - disk_held_bytes, 0 when they take it all) holds less than
// inner_steps x that, that part / inner_steps. So a node holds a stage's need m
// (StageHoldBytes >= m) exactly when its memory holds m and the disk its stage units leave
// StageDiskBytes(m, inner_steps): disk and memory needs are proportional, and PlaceStages
// places by this one figure. inner_steps 0 counts as 1.
uint64_t StageHoldBytes(const NodeView& node, uint32_t inner_steps);

// The most bytes a step may move across one stage boundary (TaskParams::stage_boundary_bytes;
// PlaceStages refuses more): 1 TiB, far beyond any model's activations (GPT-3's, a batch of 512 x
// 2048 tokens of 12288 floats each way, are 96 GiB), and small enough that bytes x 10^6 stays
// below 2^60 in StageLinkCostUs.
inline constexpr uint64_t kMaxStageBoundaryBytes = uint64_t{1} << 40;
// The transfer term of StageLinkCostUs stops at 2^43 microseconds (about 100 days for one step's
// tensors): links that slow are alike unusable, and the cost stays below 2^44 (MinCostPairing's
// bound).
inline constexpr uint64_t kMaxStageTransferUs = uint64_t{1} << 43;

// Cost of the link that carries a step's `bytes` (TaskParams::stage_boundary_bytes of the
// boundary: activations forward and their gradients back) from `from` to `to`, in microseconds:
//   latency_ms x 1000 + min(ceil(bytes x 10^6 / bandwidth_bytes_per_s), kMaxStageTransferUs)
// with `from`'s reported link to `to`, else `to`'s reported link to `from` (a link is as fast
// both ways), else an estimate from their registered figures: the sum of their latencies to
// the network and the smaller of their bandwidths (at least 1 byte/s). So a boundary that moves
// little is ranked by latency, one that moves much by bandwidth. REQUIRES: bytes <=
// kMaxStageBoundaryBytes.
uint64_t StageLinkCostUs(const NodeView& from, const NodeView& to, uint64_t bytes);

// The chains: result[r][s] is the node of stage s of replica r (see the top of the file).
// `boundary_bytes[s]` (s = 0..S-2): what one step moves between stages s and s+1, the link cost's
// bytes at that boundary (TaskParams::stage_boundary_bytes); 0: nothing crosses it (stages placed
// around ones kept elsewhere, which are not neighbours in the task's chain), so links do not
// choose there and the order of the memory and speed rules stays. InvalidArgument for no stages
// or no replicas, or boundary_bytes not S-1 entries of at most kMaxStageBoundaryBytes;
// FailedPrecondition when no placement exists, naming the stage that cannot be placed, its
// memory and disk, how many eligible nodes hold that much against how many slots need it, and the
// fix.
Result<std::vector<std::vector<NodeId>>> PlaceStages(
    const TaskSpecView& task, std::span<const StageNeed> stages,
    std::span<const uint64_t> boundary_bytes, uint32_t replicas, std::span<const NodeView> nodes,
    uint64_t height, const SchedulerParams& params);

}  // namespace meshlearn::protocol
