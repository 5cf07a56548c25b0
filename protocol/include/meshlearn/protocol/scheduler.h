// Scheduling: which solver trains which work unit, and by when (DESIGN.md step 3).
//
// AssignUnits is a deterministic function of (task, node views, pending units, block hash,
// height): the ledger calls it when it builds a block, and every follower that replays the block
// gets the same assignments. All arithmetic is integer; the only randomness is an Rng seeded from
// the block hash and the task id.
//
// Rules (docs/protocol.md has the formulas):
//   * eligible = active status, heartbeat within `liveness_blocks`, memory >= the task's need,
//     price <= the task's cap, throughput and bandwidth reported, reputation >= the floor;
//   * weight = (1 / estimated unit time) x reputation; the estimated time is
//     FLOPs / throughput + round trips x latency + 2 x model bytes / bandwidth, so a node twice
//     as fast gets about twice the units;
//   * units are dealt by systematic sampling over a shuffled order (one random offset, equally
//     spaced points on the cumulative weights): every node gets floor or ceil of its exact share
//     units x weight / total, in O(nodes + units);
//   * each assignment's deadline covers the node's queue (units already in flight plus the ones
//     dealt before it in this call), times a slack factor;
//   * a unit a node let expire is never dealt to that node again (PendingUnit::excluded).
//
//   SchedulerParams params;
//   Result<ScheduleResult> r = AssignUnits(task, nodes, pending, block.hash, block.height, params);
//   for (const Assignment& a : r->assignments) ...;  // record in ledger state
//   ...
//   for (const Assignment& a : OverdueAssignments(open, height)) {
//     ApplyMissedDeadline(reputation_of(a.node));    // and: not paid
//     pending.push_back({a.unit, {a.node}});          // reassigned at the next AssignUnits
//   }
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

struct SchedulerParams {
  uint64_t block_interval_ms = 1000;  // converts estimated times into block heights
  // A node is live if its last heartbeat is at most this many blocks old.
  uint64_t liveness_blocks = 30;
  // Deadline = estimate x slack (permille: 2000 = twice the estimate) ...
  uint32_t deadline_slack_permille = 2000;
  // ... but never fewer than this many blocks after assignment.
  uint64_t min_deadline_blocks = 5;
  // Nodes whose ReputationPermille is below this get no work.
  uint32_t min_reputation_permille = 100;
  // Network round trips per unit (fetch weights, commit result), each costing latency_ms.
  uint32_t round_trips_per_unit = 2;
};

// Why a node can or cannot receive units of a task. Shown to operators ("why no work?").
enum class Eligibility : uint8_t {
  kEligibilityOk = 0,
  kEligibilityNotActive,       // jailed, exiting or offline
  kEligibilityStaleHeartbeat,  // no heartbeat within liveness_blocks
  kEligibilityInsufficientMemory,
  kEligibilityOverPriceCap,
  kEligibilityNoThroughput,  // throughput or bandwidth not reported (0)
  kEligibilityLowReputation,
};
std::string_view EligibilityName(Eligibility e);

Eligibility CheckEligibility(const NodeView& node, const TaskSpecView& task, uint64_t height,
                             const SchedulerParams& params);

// Whether a node whose last heartbeat was at `last_heartbeat_height` is live at `height`: that
// heartbeat is at most `liveness_blocks` old (one "from the future" cannot be in ledger state and
// is not trusted). The eligibility rule's heartbeat test; the ledger also replaces a pipeline
// stage held by a node that is no longer live (docs/protocol.md, "Pipeline stage units").
bool HeartbeatLive(uint64_t last_heartbeat_height, uint64_t height, const SchedulerParams& params);

// Memory a solver needs for a whole unit: task.memory_required_bytes when set -- what `task
// submit` computes with the engine (node::UnitMemoryBytes: engine::CutCosts of the whole model as
// one stage, the formula a pipeline stage's need comes from) and every node checks against the
// bundle. Only a task that declares none (memory_required_bytes = 0: a task submitted without
// it) falls back to 5 x model_bytes (weights, gradients, two Adam moments, and the round's global
// weights to form the delta; activations not counted). Saturating.
uint64_t RequiredMemoryBytes(const TaskSpecView& task);

// The replicas of a round of `task`: units_per_round / stages (units_per_round for a task without
// stages). It is also how many whole-model deltas a round's units add up to, since a pipeline
// replica's stage deltas are each its stage's slice of the model and together one whole delta.
// ledger::PipelineReplicas is this for a task's params.
uint32_t RoundReplicas(const TaskSpecView& task);

// Memory an aggregator needs beyond its idle process (node/src/roles/aggregator.cc), an upper
// bound of what a round holds at once, term by term (M = model_bytes, R = RoundReplicas):
//   the model            what it evaluates the new state with, kept between rounds: for a task
//                        without stages the whole model's trainer its units train with, a whole
//                        unit's need (RequiredMemoryBytes); for a pipeline task, which it trains
//                        nothing of, an engine::Evaluator, the weights and one evaluation
//                        forward's activations (eval_memory_bytes; RequiredMemoryBytes when it
//                        declares none);
//   2 M                  the round's global state, weights and outer momentum;
//   R M                  the round's deltas, decoded (a pipeline replica's stage deltas are one
//                        whole delta together);
//   3 M                  the largest of what is held for a while beside those: for a task without
//                        stages the rule's working set over the whole model (protocol::Aggregate
//                        accumulates in doubles, 2 M, and returns a float delta, M); the state's
//                        blob (2 M), fetched and decoded at the start of the round and encoded at
//                        its end (the deltas are freed by then); a pipeline task's stage blob
//                        being decoded (under M) and the few chunks node::ApplyStageRound applies
//                        at a time.
// So the model + (R + 5) M. Saturating. A pipeline task, whose stages fit nodes that
// cannot hold the whole model, is aggregated only by a node that holds its weights, the round's
// deltas and state (not its training state: no node trains the whole model): AssignAggregator
// draws only among nodes whose memory_bytes holds this. StageLedgerTest.TheAggregatorsPeakIsWithinTheBound
// (node/src/stage_test.cc) measures the peak of a pipeline round in process against it.
uint64_t AggregatorMemoryBytes(const TaskSpecView& task);

// Reputation as a multiplier in permille (1000 = neutral, new node):
//   completion = 1000 x (completed + 4) / (completed + failures + 4)   (4 = prior of a new node)
//   bonus      = 10 x min(clean_streak, 20)                            (up to +20%)
//   score      = completion x (1000 + bonus) / 1000 / (1 + 2 x slashes)
// Range [0, 1200].
uint32_t ReputationPermille(const Reputation& rep);

// Estimated wall time of one unit on `node`, in milliseconds (>= 1):
//   ceil(UnitFlops x 1000 / throughput) + round_trips x latency + ceil(2 x model_bytes x 1000 /
//   bandwidth). REQUIRES: throughput_flops > 0 and bandwidth_bytes_per_s > 0.
uint64_t EstimatedUnitMs(const NodeView& node, const TaskSpecView& task,
                         const SchedulerParams& params);

// Relative share of units: (2^32 / EstimatedUnitMs) x ReputationPermille, >= 1 for an eligible
// node. Only ratios between nodes matter.
uint64_t SchedulingWeight(const NodeView& node, const TaskSpecView& task,
                          const SchedulerParams& params);

// Deadline of a unit that is `queue_position`-th (0-based) in the node's queue, assigned at
// `height`: height + max(min_deadline_blocks,
//                        ceil((queue_position + 1) x unit_ms x slack / 1000 / block_interval_ms)).
uint64_t DeadlineHeight(uint64_t height, uint64_t unit_ms, uint64_t queue_position,
                        const SchedulerParams& params);

struct ScheduleResult {
  // Sorted by unit id.
  std::vector<Assignment> assignments;
  // Units no eligible node could take (no eligible node, or all of them excluded). They stay
  // pending; the next AssignUnits tries again (new nodes join, heartbeats resume).
  std::vector<UnitId> unassigned;
  uint64_t eligible_nodes = 0;
};

// Deals `pending` units to `nodes` for the block at `height` whose hash is `block_hash`.
// The result does not depend on the order of `nodes` or `pending`: both are put in canonical
// order (by id) first — in O(n) when the caller already passes nodes sorted by id, as the
// ledger's registry does. Errors: duplicate node ids or unit ids, a unit of another task, an
// invalid task.
Result<ScheduleResult> AssignUnits(const TaskSpecView& task, std::span<const NodeView> nodes,
                                   std::span<const PendingUnit> pending, const Hash256& block_hash,
                                   uint64_t height, const SchedulerParams& params = {});

// Estimated wall time for `node` to aggregate one round, in milliseconds (>= 1): download every
// unit's delta, combine them, upload the new weights. With R = RoundReplicas(task) (a pipeline
// round's R x S stage deltas are R whole deltas, so it costs what an unsplit round of R units
// does):
//   ceil((R + 1) x model_bytes x 1000 / bandwidth) + round_trips x latency
//   + ceil(R x (model_bytes / 4) x kAggregationFlopsPerValue x 1000 / throughput).
// REQUIRES: throughput_flops > 0 and bandwidth_bytes_per_s > 0.
inline constexpr uint64_t kAggregationFlopsPerValue = 64;  // generous: sorts, Krum distances
uint64_t EstimatedAggregationMs(const NodeView& node, const TaskSpecView& task,
                                const SchedulerParams& params);

// Picks the aggregator of round `round`: one eligible node (same rules as for solvers, with
// AggregatorMemoryBytes for the memory) not in `exclude`, drawn with weight (2^32 /
// EstimatedAggregationMs) x reputation from the block's randomness; deadline as DeadlineHeight with
// queue position 0. Unavailable when no node qualifies (retry at a later block).
Result<AggregatorAssignment> AssignAggregator(const TaskSpecView& task,
                                              std::span<const NodeView> nodes, uint32_t round,
                                              std::span<const NodeId> exclude,
                                              const Hash256& block_hash, uint64_t height,
                                              const SchedulerParams& params = {});

// Assignments whose deadline has passed at `height` (deadline_height < height), in the order
// given. The unit is reassigned and the node penalised; a commit for it is no longer accepted.
std::vector<Assignment> OverdueAssignments(std::span<const Assignment> open, uint64_t height);

// Tokens one unit costs at `price_per_gflop`: ceil(UnitFlops x price / 10^9), saturating.
uint64_t UnitCostTokens(const TaskSpecView& task, uint64_t price_per_gflop);

// The reputation cost of a missed deadline: one more failure, and the clean streak ends.
void ApplyMissedDeadline(Reputation& rep);

}  // namespace meshlearn::protocol
