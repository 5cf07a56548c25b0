// The stage units whose files the ledger counts against their nodes' declared disk (not a public
// header; docs/ledger.md "Network training", step 2): NodeView::disk_held_bytes sums
// protocol::StageDiskBytes over a node's (network.cc StageDiskHeld), and node_work lists a node's
// (`stage_units`), so that the node deletes the stage files of every other unit it ran
// (node::PinKeeper's review): node and ledger count the same files.
#pragma once

#include <cstdint>

#include "meshlearn/ledger/state.h"

namespace meshlearn::ledger {

// Calls fn(unit) for every work unit of task `t` that the ledger records as its assignee's
// (assigned, committed or paid) in a round from `final_rounds` on, when `t` is an open pipeline
// task. A node keeps such a unit's files (its checkpoints and step tensors) until the round is
// final: its check and a challenge of it read them until then. A unit's earlier run on another
// node -- one it let expire, or one whose commit a re-run reset (ResetWorkUnit: no check,
// commitment or leaves of it stay, so nothing can dispute it) -- is not its node's any more, and
// that node deletes its files. Each later round holds units only while the one before it does.
// `unit_at(index)` is the task's unit at `index`: a pointer or an optional, testing false when
// there is none.
template <typename UnitAt, typename Fn>
void ForEachStageUnitHeld(const TaskRecord& t, uint32_t final_rounds, UnitAt&& unit_at, Fn&& fn) {
  if (t.status != TaskStatus::kOpen || !IsPipelineTask(t.params)) return;
  const uint32_t per_round = t.params.units_per_round;
  for (uint64_t first = uint64_t{final_rounds} * per_round; first < t.unit_count;
       first += per_round) {
    bool any = false;
    for (uint64_t index = first; index < first + per_round && index < t.unit_count; ++index) {
      const auto u = unit_at(static_cast<uint32_t>(index));
      if (!u || u->assignee == PublicKey{} ||
          (u->status != WorkUnitStatus::kAssigned && u->status != WorkUnitStatus::kCommitted &&
           u->status != WorkUnitStatus::kVerified)) {
        continue;
      }
      any = true;
      fn(*u);
    }
    if (!any) break;
  }
}

}  // namespace meshlearn::ledger
