// Which blobs and files the node keeps (not a public header; agent.h "Blobs the node keeps"):
// reviews the pins every gc_every_blocks, adopts uploads an open task uses, releases a closed
// task's blobs and files release_after_blocks after it closed and not before its audit window
// closed (until then a fraud proof may reopen it and rewind it to any round: every round's start
// state stays), forgets the closed mark of a task reopened, and deletes a unit's checkpoints
// and deltas once its round is final. A task with a late game open on one of its units
// (TaskInfo::late_games) is not released until the game is ruled.
//
// Its state is the pin book (<data_dir>/pins.json, pin_book.h): reasons per blob, the units with
// files and the height each closed task was first seen closed; a restart goes on from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>

#include "node_context.h"
#include "solver.h"
#include "stager.h"

namespace meshlearn::node {

inline constexpr char kUploadPrefix[] = "upload:";
inline constexpr char kKeepReason[] = "keep";

class PinKeeper {
 public:
  PinKeeper(NodeContext* node, Solver* solver, Stager* stager)
      : node_(node), solver_(solver), stager_(stager) {}

  // The height of the agent's first tick: uploads pinned before it count from it.
  void set_first_height(uint64_t h) {
    if (first_height_ == 0) first_height_ = h;
  }
  // Whether a review is due at this height.
  bool Due() const {
    return node_->height() >= last_review_height_ + std::max<uint64_t>(node_->options().gc_every_blocks, 1);
  }
  // One get_task per task the node holds something of. `work`: node_work at this height (its
  // stage_units: the stage units whose files the node keeps, Stager::ReleaseEvidence).
  Status ReviewPins(const NodeWork& work);

 private:
  Status AdoptUploads();
  Status ReleaseTask(const Hash256& task, const Hash256& final_state);
  void DeleteUnitFiles(const Hash256& task, uint32_t index);

  NodeContext* node_;
  Solver* solver_;
  Stager* stager_;  // its stage steps' evidence goes with the rounds' deltas
  uint64_t first_height_ = 0;
  uint64_t last_review_height_ = 0;
  std::set<Hash256> late_hold_logged_;  // tasks kept past their release for a late game
};

}  // namespace meshlearn::node
