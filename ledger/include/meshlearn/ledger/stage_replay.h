// A verifier's (and the ledger's) replay of one pipeline stage's step (issue 15;
// docs/verification.md "Pipeline stages"). In the ledger's core beside RunStageStep (see
// stage_step.h for why); node/stage_replay.h re-exports it.
//
// A stage commits per step a protocol::StageStepCommit: its state hash before and after the step
// and the signed records of every tensor it received and sent. To check a sampled step, a
// verifier takes the stage's checkpoint of the step's start (it must hash to state_before), the
// tensors the stage received (fetched as blobs, each checked against its signed record's hash),
// and runs RunStageStep (stage_step.h) with a link that feeds those inputs and compares every
// tensor the replay sends with the hash the stage signed and sent. The first disagreement is the
// finding, narrowed to (replica, stage, step, micro-batch):
//
//   record   a record is malformed, listed out of the schedule's order, or its signature does not
//            verify against the chain's node of its sending stage (a forged input)
//   start    the checkpoint given does not hash to state_before
//   missing  the commit lacks a record the step needs, or lists one the step does not make
//   unserved the blob of a received tensor was not served
//   input    a received tensor does not match its signed record (the stage used something else
//            than what was sent)
//   output   a tensor the stage sent differs from the replay's (it computed wrong, or computed
//            right and sent something else: corrupted activations)
//   state    its state after the step differs from the replay's (a wrong update)
//   continuity  (not found by a replay) its state_before is not its previous step's state_after,
//            or at step 0 not its slice of the round's start state (RuleStageContinuity)
//
// A stage's replay needs nothing but its own commit, inputs and checkpoint: every stage of a
// replica can be checked alone, and an input proven wrong is the sender's fault (its own replay
// shows its output differs), never the receiver's.
//
//   ML_ASSIGN_OR_RETURN(StageReplayResult r,
//                       ReplayStageStep(setup, std::move(checkpoint), commit, blobs, batch, seed));
//   if (!r.ok()) LOG(WARNING) << r.message;   // "replica 0, stage 1, step 2, micro-batch 1: ..."
//
// Thread-safety: pure apart from the engine's kernels; call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::ledger {

enum class StageFault : uint8_t {
  kStageFaultNone = 0,
  kStageFaultRecord,
  kStageFaultStart,
  kStageFaultMissing,
  kStageFaultUnserved,
  kStageFaultInput,
  kStageFaultOutput,
  kStageFaultState,
  // Not a replay's: the step's state_before is not where the stage's previous step ended (step 0:
  // its slice of the round's start state). stage_referee.h, RuleStageContinuity.
  kStageFaultContinuity,
};
const char* StageFaultName(StageFault fault);

struct StageReplayResult {
  StageFault fault = StageFault::kStageFaultNone;
  uint32_t replica = 0;
  uint32_t stage = 0;
  uint64_t step = 0;
  int64_t micro_batch = -1;      // the micro-batch of the tensor at fault (-1: none, or per step)
  protocol::StageTensorKey key;  // the tensor at fault (input, output, missing, record)
  Hash256 claimed;               // what the stage committed (a tensor's hash, state_after)
  Hash256 replayed;              // what the replay computed
  std::string message;           // "replica R, stage s, step t[, micro-batch m]: <fault>: ..."
  bool ok() const { return fault == StageFault::kStageFaultNone; }
};

// What the task fixes about the stage: its model, inner optimizer, cut and micro-batches, and the
// replica's chain of nodes (chain[s] signs what stage s sends).
struct StageReplaySetup {
  engine::ModelSpec model;
  engine::OptimizerSpec optimizer;
  engine::PipelineCut cut;
  int64_t micro_batches = 1;
  std::vector<protocol::NodeId> chain;
};

// Replays `commit`'s step from `start` (the stage's state at the step's start, e.g.
// LoadCheckpoint of its checkpoint) on the step's `batch` with `dropout_seed`. `blobs`: the
// received tensors by their record's hash (StageTensorBytes encoding), as fetched from the stage.
// A finding (the result's fault) for anything the stage got wrong; a Status error only when the
// verifier's own inputs are unusable (a setup that does not fit the commit: a chain of another
// length, `start` of another model part).
// `start` becomes the replay's stage (engine::Stage::Create with it: no second copy of the
// stage's tensors). `after` (optional): on a clean replay, the stage's state after the step
// (moved out of the replay): a stage unit's result check starts from its last step's.
// `trace` (optional): the step's operator trace (engine::Stage::set_op_trace, following
// engine::PlanStageStepTiles), what a party of a stage dispute's tile phase answers from; a sent
// tensor that differs from its record is then the finding and the step runs on to its end, so
// the trace holds every operator.
Result<StageReplayResult> ReplayStageStep(const StageReplaySetup& setup, engine::TrainState start,
                                          const protocol::StageStepCommit& commit,
                                          const std::map<Hash256, Bytes>& blobs,
                                          const engine::Batch& batch, uint64_t dropout_seed,
                                          engine::TrainState* after = nullptr,
                                          engine::OpTrace* trace = nullptr);

// Where a stage unit's check says a replayed step ended (what a verifier claims, a
// MismatchClaim's replayed_end, and what a referee rules with): the committed step leaf
// (protocol::StageStepLeaf) when the replay found nothing, else a hash of that leaf and the
// finding (its fault, micro-batch, tensor key and replayed hash), so that every party replaying
// the same evidence derives the same value, and no finding equals the committed leaf. A stage
// that serves no evidence for the step, or a commit that is not its committed leaf, is the
// finding `unserved` with `replayed` zero (StageUnservedLeaf).
Hash256 StageFindingLeaf(const Hash256& committed_leaf, const StageReplayResult& r);
Hash256 StageUnservedLeaf(const Hash256& committed_leaf);
// The finding `continuity` (the step does not start where the stage's previous step ended), with
// `claimed` and `replayed` zero: like `unserved`, a claim names it from its solver_end alone
// (ContinuityStageClaim), so that its dispute is played over the whole step and ruled from the
// two commits (RuleStageContinuity), never from the step's replay, which runs clean.
Hash256 StageContinuityLeaf(const Hash256& committed_leaf);

// The training state in a stage checkpoint file's bytes (engine::ReadCheckpoint of them, read in
// place: no copy of the file), and back (engine::SaveCheckpoint's file): what a stage node serves
// and a witness carries as the step's start.
Result<engine::TrainState> StageCheckpointState(ByteSpan checkpoint);
Result<Bytes> StageCheckpointBytes(engine::TrainState& state);

}  // namespace meshlearn::ledger
