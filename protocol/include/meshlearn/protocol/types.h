// Plain input and output records of the protocol algorithms. The ledger fills them from its state
// (node registry, task table, reputation table) and the node fills them from what it observes;
// the algorithms in protocol/ never read the ledger, a clock, a file or a socket themselves.
//
// Money is always an integer number of tokens; heights are block heights; sizes are bytes; rates
// are per second. No floating point appears in these records, so everything the scheduler
// computes from them is integer arithmetic and replays identically on every follower.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"

namespace meshlearn::protocol {

// A node (solver) is identified by its ed25519 public key, as in the ledger's node registry.
using NodeId = PublicKey;
// A task is identified by the hash of its SubmitTask transaction (or any 32-byte id the ledger
// assigns; the protocol only needs it to be unique and stable).
using TaskId = Hash256;

// Counters the ledger keeps per node. Only the ledger changes them (after verification, on a
// missed deadline, on a slash); the scheduler reads them to weight nodes.
struct Reputation {
  uint64_t completed = 0;       // units committed before their deadline
  uint64_t verified_clean = 0;  // units that a verifier re-executed and found equal
  uint64_t clean_streak = 0;    // consecutive clean verifications (reset by any failure)
  uint64_t failures = 0;        // missed deadlines (and other non-fraud failures)
  uint64_t slashes = 0;         // proven fraud

  bool operator==(const Reputation&) const = default;
};

enum class NodeStatus : uint8_t {
  kNodeStatusActive = 0,  // registered, staked, may receive work
  kNodeStatusJailed,      // temporarily barred (e.g. after a slash)
  kNodeStatusExiting,     // unbonding; finishes its work but gets none new
  kNodeStatusOffline,     // deregistered or marked offline by the ledger
};

// The most links one node reports (ledger ReportLinksTx; NodeView::links): a pipeline node
// measures only the neighbours of the stage units it ran, two a unit, so 64 covers the last 32
// units' worth of distinct neighbours while keeping a report a few KiB (the ledger's 16 KiB
// transaction limit) and the node's ledger record small.
inline constexpr uint32_t kMaxNodeLinks = 64;

// The bounds of a reported link: a round trip over a minute is a broken link, not a slow one
// (no stage step waits that long for a tensor), and 10^12 bytes/s (1 TB/s) is above any network
// link a node could have (NVLink 4 is 0.9 TB/s); either is a measurement in the wrong units.
inline constexpr uint32_t kMaxLinkLatencyMs = 60'000;
inline constexpr uint64_t kMaxLinkBandwidthBytesPerS = 1'000'000'000'000;

// One link a node measured to a peer and reported (docs/protocol.md, "Pipeline stage
// placement"): the round trip of the fastest data-plane push to it, in whole milliseconds, and
// the bytes per second its pushes moved (node::MeasuredLinks derives both).
struct PeerLink {
  NodeId peer;
  uint32_t latency_ms = 0;             // <= kMaxLinkLatencyMs
  uint64_t bandwidth_bytes_per_s = 0;  // in [1, kMaxLinkBandwidthBytesPerS]
  bool operator==(const PeerLink&) const = default;
};

// What the scheduler knows about one solver.
struct NodeView {
  NodeId id;
  uint64_t memory_bytes = 0;  // memory available for training
  // Disk offered to pipeline stage files (NodeCapabilities::disk_bytes); 0: none declared, not
  // checked. Only stage placement reads it (StageHoldBytes: PlaceStages, and `task quote`'s
  // count of the nodes that can take a stage).
  uint64_t disk_bytes = 0;
  // Of disk_bytes, what the files of the stage units it already holds take
  // (protocol::StageDiskBytes of each; the ledger sums its units of rounds not yet final:
  // docs/ledger.md, "Network training"), so not offered to another; 0 when it holds none.
  // Only StageHoldBytes reads it.
  uint64_t disk_held_bytes = 0;
  uint64_t throughput_flops = 0;       // FLOP/s measured by the standard benchmark
  uint32_t latency_ms = 0;             // reported round-trip latency to the network
  uint64_t bandwidth_bytes_per_s = 0;  // reported sustained bandwidth (both directions)
  uint64_t price_per_gflop = 0;        // tokens asked per 10^9 training FLOPs
  uint64_t last_heartbeat_height = 0;  // height of the block that carried its last heartbeat
  Reputation reputation;
  NodeStatus status = NodeStatus::kNodeStatusActive;
  // Units already assigned to this node and not yet committed or expired (from earlier
  // assignments). New units queue behind them, so their deadlines are later.
  uint32_t inflight_units = 0;
  // The links it last reported, sorted by peer (at most kMaxNodeLinks); empty when it never
  // reported any. Only PlaceStages reads them.
  std::vector<PeerLink> links;
};

// The parts of a task the decomposition and the scheduler need.
struct TaskSpecView {
  TaskId id;
  uint32_t rounds = 0;           // outer (DiLoCo) rounds
  uint32_t units_per_round = 0;  // work units (= data shards) per round
  uint32_t inner_steps = 0;      // H: optimizer steps each unit runs from the round's weights
  uint32_t batch_size = 0;       // samples per inner step
  // Training FLOPs for one sample, forward + backward (about 6 x parameters for a dense net).
  uint64_t flops_per_sample = 0;
  uint64_t model_bytes = 0;  // size of the weights (and of a delta), float32
  // Memory a solver needs for a whole unit: the submitter's engine estimate (node::
  // UnitMemoryBytes, carried as TaskParams::memory_bytes). 0 = none declared: the
  // 5 x model_bytes fallback (see RequiredMemoryBytes).
  uint64_t memory_required_bytes = 0;
  // Pipeline stages per replica (units_per_round = replicas x stages); 1: every unit trains the
  // whole model. The aggregator's estimates read it (RoundReplicas: a round's deltas add up to
  // units_per_round / stages whole deltas).
  uint32_t stages = 1;
  // A pipeline task's aggregator's evaluator: the whole model's weights and one evaluation
  // forward's activations (TaskParams::eval_memory_bytes). 0: none declared; AggregatorMemoryBytes
  // then counts memory_required_bytes, a whole unit's training need.
  uint64_t eval_memory_bytes = 0;
  uint64_t price_cap_per_gflop = 0;  // highest price_per_gflop the submitter accepts
  uint64_t seed = 0;                 // task seed: data order, initialisation
  uint64_t num_examples = 0;         // dataset size (samples, or token windows)
};

// One work unit: H inner steps on shard `shard` of round `round`, from the round's global weights.
struct UnitId {
  TaskId task;
  uint32_t round = 0;
  uint32_t shard = 0;

  // Canonical order: task, then round, then shard. Aggregation and scheduling sort by it.
  auto operator<=>(const UnitId&) const = default;
  std::string ToString() const;  // "3f2a9c01b4de/r2/s5"
};

// A unit given to a node. The node must commit its result at or before `deadline_height`.
struct Assignment {
  UnitId unit;
  NodeId node;
  uint64_t assigned_height = 0;
  uint64_t deadline_height = 0;
  // The node's price when the unit was assigned: what the unit pays if it is committed in time
  // and survives verification (UnitCostTokens), whatever the node asks later.
  uint64_t price_per_gflop = 0;

  bool operator==(const Assignment&) const = default;
};

// The node that aggregates round `round` of a task and commits its new global weights by
// `deadline_height`.
struct AggregatorAssignment {
  TaskId task;
  uint32_t round = 0;
  NodeId node;
  uint64_t assigned_height = 0;
  uint64_t deadline_height = 0;

  bool operator==(const AggregatorAssignment&) const = default;
};

// A unit waiting for a solver, and the nodes that may not take it (they let it expire before).
// `backoffs`: how many times the ledger doubled the unit's next deadline in this round
// (RoundStateMachine::BackOff; a pipeline stage's replica that ran past its deadline).
struct PendingUnit {
  UnitId unit;
  std::vector<NodeId> excluded;
  uint32_t backoffs = 0;
};

}  // namespace meshlearn::protocol
