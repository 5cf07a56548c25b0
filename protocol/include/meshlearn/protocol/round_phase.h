// The per-task round state machine: where a task is in its rounds, driven by ledger events.
//
// Phases of a round (the task's phase is the current round's phase):
//
//   assigning ──(every unit has a solver)──> training ──(every unit committed)──> aggregating
//       ^   <──(an assignment expired: unit pending again)──┘                          │
//       │                                                            aggregate committed
//       │                                                                             v
//   next round <──(window closed, no hold)── awaiting_verification_window ──(last round)──> final
//       ^                                                │
//       └────(rounds_in_flight allows: the round settles while the next one trains)
//
// Pure and event-driven: no clock (heights come with the events), no I/O. The ledger keeps one
// machine per task in its state, feeds it the block's events in order, and acts on the returned
// RoundUpdate (penalise expired nodes, pay finalized rounds). Scheduling itself is AssignUnits in
// scheduler.h: the ledger calls it with PendingUnits() and feeds the result to OnAssigned().
//
// The verification window is the seam for the verification issue: a round becomes final only when
// `verification_window_blocks` blocks have passed since its aggregate was committed (0 = at
// once) and no hold is active (HoldFinality/ReleaseFinality, e.g. while a dispute is open).
// RewindRound re-runs the current round from its starting weights after fraud is proven;
// RerunUnits re-runs single units of it (a forced error, a unit whose solver vanished).
//
// Rounds in flight (`rounds_in_flight` > 0): verification costs compute, not wall time. Once a
// round's aggregate is committed, the next round starts from it at once, while the committed
// round *settles* (its checks run and its window closes) behind it; up to `rounds_in_flight`
// rounds settle at a time, and they become final in order. Nothing of a settling round is paid
// until it is final, and fraud found in a settling round r rewinds the task to r (RewindTo),
// a forced error or an abandoned unit in it re-runs that unit there (RerunUnitsOf), either way
// dropping the rounds trained on top of it. final_rounds() counts the final rounds;
// weights_history() holds the start weights of every round up to the current one, settling ones
// included.
//
//   Result<RoundStateMachine> m = RoundStateMachine::Create(config);
//   m->OnBlock(h);                                   // every block, first
//   auto pending = m->PendingUnits();                // -> AssignUnits -> m->OnAssigned(...)
//   m->OnUnitCommitted(unit, node, result_hash, h);  // commit transactions
//   if (m->NeedsAggregator())  // -> AssignAggregator(..., m->AggregatorExcluded(), ...)
//     m->OnAggregatorAssigned(aggregator);
//   m->OnAggregateCommitted(round, node, weights_hash, h);  // aggregator's transaction
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn {
class Encoder;
class Decoder;
}  // namespace meshlearn

namespace meshlearn::protocol {

enum class RoundPhase : uint8_t {
  kRoundPhaseAssigning = 0,               // some unit of the round has no solver
  kRoundPhaseTraining,                    // every unit has a solver; some not committed
  kRoundPhaseAggregating,                 // every unit committed; waiting for the aggregate
  kRoundPhaseAwaitingVerificationWindow,  // aggregate committed; waiting for finality
  kRoundPhaseFinal,                       // every round final: the task is done
};
std::string_view RoundPhaseName(RoundPhase phase);

struct RoundMachineConfig {
  TaskId task;
  uint32_t rounds = 0;
  uint32_t units_per_round = 0;
  uint64_t verification_window_blocks = 0;  // 0 = a round is final when its aggregate commits
  Hash256 initial_weights;                  // content hash of the task's initial weights
  uint64_t start_height = 0;                // height of the block that accepted the task
  // Aggregated rounds that may await finality while a later round trains (0: a round starts
  // only when the one before it is final).
  uint32_t rounds_in_flight = 0;
};

// What an event did, for the caller to act on.
struct RoundUpdate {
  // Assignments that passed their deadline without a commit: the units are pending again, the
  // nodes excluded from them. Apply ApplyMissedDeadline to each node; do not pay them.
  std::vector<Assignment> expired;
  // Rounds that became final in this event (pay their solvers and aggregator).
  std::vector<uint32_t> finalized_rounds;
  // The aggregator missed its deadline: penalise it (ApplyMissedDeadline), assign another.
  std::optional<AggregatorAssignment> expired_aggregator;
};

struct CommittedUnit {
  UnitId unit;
  NodeId node;
  Hash256 result;  // hash of the delta blob (and Merkle root, as the node defines it)
  uint64_t height = 0;
};

class RoundStateMachine {
 public:
  static Result<RoundStateMachine> Create(const RoundMachineConfig& config);

  RoundPhase phase() const { return phase_; }
  // The round in progress (== rounds once final).
  uint32_t round() const { return round_; }
  uint64_t height() const { return height_; }
  // Global weights the current round trains from (the newest aggregate, final or settling, or
  // the initial weights). weights_history()[r] are the weights round r started from, for every
  // round up to the current one; once the task is final the last entry is its final weights.
  const Hash256& round_weights() const { return weights_history_.back(); }
  const std::vector<Hash256>& weights_history() const { return weights_history_; }
  // Rounds [0, final_rounds()) are final (paid, no longer checked); rounds [final_rounds(),
  // round()) are settling.
  uint32_t final_rounds() const;
  // Whether `round` may still be checked or disputed: settling, or the current round.
  bool Unfinal(uint32_t round) const {
    return phase_ != RoundPhase::kRoundPhaseFinal && round >= final_rounds() && round <= round_;
  }
  // Height at which the current round's window closes (valid in the awaiting phase).
  uint64_t window_end_height() const { return window_end_; }

  // Units of the current round without a solver, sorted, with their excluded nodes.
  std::vector<PendingUnit> PendingUnits() const;
  // A pending unit every eligible solver is excluded from (each let it expire once) would never
  // be assigned again: the ledger forgives them, and the unit is open to all of them again.
  Status ForgiveExcluded(const UnitId& unit);
  // Doubles the next deadline of a pending unit of the current round (PendingUnit::backoffs; at
  // most kMaxBackoffs times): the ledger backs off a pipeline stage whose replica ran past its
  // deadline, so a replica slower than its nodes' estimates (shared cores, slow links) gets the
  // time it needs on a later try instead of expiring forever. The count lasts the round.
  static constexpr uint32_t kMaxBackoffs = 8;
  Status BackOff(const UnitId& unit);
  // Assignments of the current round not yet committed, sorted by unit.
  std::vector<Assignment> OpenAssignments() const;
  // The assignment of unit `shard` of round `round` while the round is unfinal (Unfinal) and the
  // unit assigned or committed in it; nullptr otherwise (pending, expired, re-run, final). Its
  // assigned_height is when its solver took it on: the ledger keeps the solver's stake unbonded
  // after that slashable until the unit's check is over (ledger::OpenCheckHold).
  const Assignment* AssignmentOf(uint32_t round, uint32_t shard) const;
  // Committed units of the current round, sorted by unit (what the aggregator fetches).
  std::vector<CommittedUnit> CommittedUnits() const;
  // The last node excluded from unit `shard` of the current round (a zero NodeId: none, or
  // forgiven since): while the unit is assigned after an expiry, the node that held it before and
  // let it expire (an expiry adds its node at the end). The node that replaces a lost pipeline
  // stage checks the records it recomputes against it (node/stage_resume.h).
  NodeId LastExcluded(uint32_t shard) const;

  // True in the aggregating phase while no aggregator is assigned (AssignAggregator, then
  // OnAggregatorAssigned).
  bool NeedsAggregator() const;
  // Nodes that let this round's aggregation expire; pass to AssignAggregator as `exclude`.
  const std::vector<NodeId>& AggregatorExcluded() const { return aggregator_excluded_; }
  // When every node able to aggregate the round let its aggregation expire once, the round would
  // wait forever (a pipeline task: often one node holds the whole model): the ledger forgives
  // them, as it forgives a unit's solvers (ForgiveExcluded), and the expiries stay on their
  // records. Only while an aggregator is needed.
  Status ForgiveAggregatorExcluded();
  const std::optional<AggregatorAssignment>& aggregator() const { return aggregator_; }

  // --- events ---------------------------------------------------------------------------------
  // A new block. Heights never decrease. Expires overdue assignments (deadline < height) and
  // closes the verification window when due.
  Result<RoundUpdate> OnBlock(uint64_t height);
  // Scheduler output. Each assignment must be for a pending unit of the current round and a
  // node not excluded from it; nothing changes if any is not.
  Status OnAssigned(std::span<const Assignment> assignments);
  // A solver's commit. Accepted only from the node the unit is assigned to, at or before its
  // deadline; a late or foreign commit is refused (and so not paid).
  Status OnUnitCommitted(const UnitId& unit, const NodeId& node, const Hash256& result,
                         uint64_t height);
  // Explicit expiry (e.g. the node deregistered): as if its deadline had passed.
  Result<RoundUpdate> OnUnitExpired(const UnitId& unit);
  // AssignAggregator output, in the aggregating phase, for the current round; refused when an
  // aggregator is already assigned or the node is excluded.
  Status OnAggregatorAssigned(const AggregatorAssignment& aggregator);
  // The assigned aggregator's commit of round `round`'s new global weights, at or before its
  // deadline.
  Result<RoundUpdate> OnAggregateCommitted(uint32_t round, const NodeId& aggregator,
                                           const Hash256& new_weights, uint64_t height);

  // --- persistence ----------------------------------------------------------------------------
  // Canonical encoding (base/encoding.h rules) of the whole machine, for ledger state: one
  // machine has exactly one encoding, so its hash can enter the state hash.
  Bytes Encode() const;
  // Inverse of Encode. Rejects truncated or trailing input and any state the events could not
  // have produced (unit of another round, phase inconsistent with the units, ...).
  static Result<RoundStateMachine> Decode(ByteSpan bytes);

  // --- seams for verification -----------------------------------------------------------------
  // While holds are active the window does not close (a dispute is open). Releasing the last
  // hold of an aggregated round restarts the window from the current height (whistleblowers get
  // the whole window after the last check settled).
  void HoldFinality() { ++holds_; }
  uint32_t holds() const { return holds_; }
  Result<RoundUpdate> ReleaseFinality();
  // The holds of any unfinal round (settling or current): the ledger keeps one per unsettled
  // check. Going to 0 restarts an aggregated round's window as ReleaseFinality does.
  Result<uint32_t> HoldsOf(uint32_t round) const;
  Result<RoundUpdate> SetHolds(uint32_t round, uint32_t holds);
  // Fraud proven in the current, not yet final round: every unit becomes pending again (the
  // given nodes excluded from all of them) and the round re-runs from round_weights().
  Status RewindRound(std::span<const NodeId> exclude);
  // Fraud proven by a node whose work also went into earlier rounds ("taint"), or anything that
  // changes a settling round's aggregate: the task goes back to round `round` (<= round()),
  // whose start weights become the current ones again; the later rounds' weights (final or
  // settling) are forgotten and every unit of `round` is pending, `exclude` barred from them.
  // round == round() is RewindRound. A final task may be rewound too (a fraud proof within its
  // audit window reopens it): any round < rounds, and the task trains forward from there.
  Status RewindTo(uint32_t round, std::span<const NodeId> exclude);
  // A forced error or an abandoned unit in the current, not yet final round: only `shards`
  // re-run (pending again, `exclude` barred from them); the round's other units keep their
  // commits. An aggregator assigned or an aggregate committed is dropped: the round aggregates
  // again, over the new results, once every unit is committed.
  Status RerunUnits(std::span<const uint32_t> shards, std::span<const NodeId> exclude);
  // RerunUnits for any unfinal round: in a settling round, the task goes back to it (its other
  // units keep their commits; the rounds after it are dropped) and only `shards` re-run.
  Status RerunUnitsOf(uint32_t round, std::span<const uint32_t> shards,
                      std::span<const NodeId> exclude);

 private:
  enum class UnitState : uint8_t { kPending, kAssigned, kCommitted };
  // An aggregated round waiting for finality while a later round trains.
  struct Unit {
    UnitState state = UnitState::kPending;
    Assignment assignment;
    Hash256 result;
    uint64_t commit_height = 0;
    std::vector<NodeId> excluded;
    uint32_t backoffs = 0;  // current round's units only (encoded from version 3)
  };
  struct Settling {
    uint32_t round = 0;
    uint64_t window_end = 0;
    uint32_t holds = 0;
    std::vector<Unit> units;  // every one committed
  };

  explicit RoundStateMachine(const RoundMachineConfig& config);
  static void PutUnits(Encoder& e, const std::vector<Unit>& units);
  static Status GetUnits(Decoder& d, uint32_t max, std::vector<Unit>* units);
  void StartRound();
  void RecomputePhase();
  Assignment Expire(Unit& u);
  void MaybeFinalize(RoundUpdate& update);
  bool MayStartNextRound() const;
  Result<Unit*> FindUnit(const UnitId& unit);

  RoundMachineConfig config_;
  RoundPhase phase_ = RoundPhase::kRoundPhaseAssigning;
  uint32_t round_ = 0;
  uint64_t height_ = 0;
  uint64_t window_end_ = 0;
  uint32_t holds_ = 0;
  Hash256 pending_weights_;  // aggregate of the current round, final when the window closes
  std::optional<AggregatorAssignment> aggregator_;
  std::vector<NodeId> aggregator_excluded_;
  std::vector<Hash256> weights_history_;
  std::vector<Unit> units_;         // index = shard
  std::vector<Settling> settling_;  // rounds [final_rounds(), round_), in order
};

}  // namespace meshlearn::protocol
