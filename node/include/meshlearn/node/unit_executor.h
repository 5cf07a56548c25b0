// Executes one work unit: H inner optimizer steps from the round's global weights, the same
// computation for the solver that is paid for it and the verifier that replays it.
//
// A unit is a pure function of (task, global weights, unit stream): the batches and dropout
// masks of inner step s come from (task seed, unit stream, s), and the inner optimizer starts
// from zeroed state at step 0. The executor records the training-state hash after step 0 (the
// starting point), after every k-th step and after the last step; the Merkle root over those
// hashes is the unit's commitment, so a verifier can later replay any k-step segment and compare.
//
//   UnitExecutor ex(trainer.get());
//   ML_ASSIGN_OR_RETURN(UnitOutcome out, ex.Run(global, {.stream = s, .inner_steps = 50,
//                                                        .checkpoint_interval = 10}));
//   // out.delta = global - local (the pseudo-gradient), out.commitment = Merkle root
//
// Thread-compatible: one Run at a time per executor (the trainer is shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/network_task.h"

namespace meshlearn::node {

// UnitWork (what a unit trains: stream, H, k, lr scale) and HashedSteps (the steps whose states
// it hashes) are the protocol's task model (protocol/task_model.h): protocol::UnitWorkOf builds
// the work of a unit for every party.
using protocol::HashedSteps;

struct UnitOutcome {
  // State hashes after step 0, k, 2k, ..., and H (H is included once even if k divides it).
  std::vector<int64_t> hashed_steps;
  std::vector<Hash256> state_hashes;
  Hash256 commitment;         // MerkleRoot(state_hashes)
  std::vector<float> delta;   // global - local, in model parameter order
  Hash256 delta_hash;         // BLAKE2b over the delta's little-endian float bytes
  float mean_loss = 0;        // mean training loss over the unit's steps
  uint64_t samples = 0;       // inner_steps x batch size
};

// Called after every inner step (progress bars, kill-and-resume tests).
using StepCallback = std::function<void(int64_t step, float loss)>;

// Called at every hashed step s with 0 < s < H (every k-th step), after its state hash was
// recorded: `hashes` are the state hashes so far (the last one is step s's), `loss_sum` the sum
// of the step losses so far (double, accumulated in step order). A node saves a checkpoint here;
// an error stops the unit and is returned by Run.
using CheckpointCallback = std::function<Status(int64_t step, engine::TrainState& state,
                                                const std::vector<Hash256>& hashes,
                                                double loss_sum)>;

// Where a unit that was interrupted continues: what a CheckpointCallback saw at `step`.
// Continuing gives bit for bit the outcome of an uninterrupted run.
struct UnitResume {
  int64_t step = 0;
  std::vector<Hash256> state_hashes;
  double loss_sum = 0;
  engine::TrainState state;  // parameters and optimizer state at `step` (LoadCheckpoint)
};

struct UnitRunOptions {
  StepCallback on_step;
  CheckpointCallback on_checkpoint;
  UnitResume* resume = nullptr;  // consumed (its tensors are copied into the trainer)
  // Checked before every step; true stops the unit with Unavailable (a daemon shutting down;
  // the last checkpoint is where it resumes).
  std::function<bool()> should_stop;
};

class UnitExecutor {
 public:
  // `trainer` must outlive the executor; its data and model spec define the task.
  explicit UnitExecutor(engine::Trainer* trainer) : trainer_(trainer) {}

  // REQUIRES: global.size() == number of model parameters; work.inner_steps > 0.
  Result<UnitOutcome> Run(std::span<const float> global, const UnitWork& work,
                          const StepCallback& on_step = nullptr);
  // The same with checkpoint and resume hooks. A resume must come from a run of the same unit
  // (same global weights, stream, lr_scale): its step must be a hashed step below H and its
  // tensors must match the model; otherwise InvalidArgument.
  Result<UnitOutcome> Run(std::span<const float> global, const UnitWork& work,
                          const UnitRunOptions& options);

 private:
  engine::Trainer* trainer_;
};

// What a verifier computes (docs/verification.md): segment `segment` of a unit replayed from the
// solver's state at its start. Segment j runs from the state after step j*k to the state after
// min((j+1)*k, H); segment 0 starts from the unit's own start (the round's global weights, fresh
// optimizer), so it needs no checkpoint (`start` may be null).
struct SegmentReplay {
  int64_t first_step = 0;  // the state the replay started from is the one after this step
  int64_t last_step = 0;   // ... and it ends after this step
  Hash256 start_hash;      // StateHash of the start state
  Hash256 end_hash;        // StateHash after the replay: the committed leaf segment+1 if honest
};
// Errors: a segment out of range; a start state of another unit or step; a start state whose
// hash is not `expected_start` (when given: the committed leaf) -- the solver served a checkpoint
// that is not the one it committed, which is itself a mismatch.
Result<SegmentReplay> ReplaySegment(engine::Trainer* trainer, std::span<const float> global,
                                    const UnitWork& work, uint32_t segment,
                                    engine::TrainState* start,
                                    const Hash256* expected_start = nullptr);

// The state hashes of a unit at the given steps, replayed from the state after `from_step`:
// `start` is that state (a checkpoint of this unit; null when from_step == 0, the unit's own
// start). `steps` are ascending, in [from_step, H]; hashes[i] is the state hash after steps[i].
// What a verifier falls back to when the solver serves no usable checkpoint (from step 0, the
// hashes at segment ends), what both parties of a dispute post (every step of a segment), and
// what the referee computes (node/referee.h).
Result<std::vector<Hash256>> ReplayToSteps(engine::Trainer* trainer, std::span<const float> global,
                                           const UnitWork& work, int64_t from_step,
                                           engine::TrainState* start,
                                           std::span<const int64_t> steps);

// Result binding (docs/verification.md "Result binding"): the result a unit's final state gives,
// the blob id of the delta blob EncodeDelta(global - the state's parameters). A unit's CommitUnit
// result_hash must be it; the ledger computes the same for a ProveResult
// (ledger/src/referee_step.cc, ExecuteResultWitness), so any mismatch here is provable there.
Hash256 ResultOfFinalState(std::span<const float> global, engine::TrainState& final_state);

// The verifier's cheap result check of a committed unit from a state claimed to be its final one
// (the verifier's own replay up to H, or the solver's served checkpoint at H):
//   kNotShown  `final_state` does not hash to the committed last leaf: nothing can be said (a
//              wrong or missing checkpoint is the segment checks' business);
//   kRight     the committed result is the delta of the committed final state;
//   kWrong     it is not: provable on chain (ledger::ProveResultTx).
enum class ResultCheck : uint8_t { kNotShown, kRight, kWrong };
ResultCheck CheckUnitResult(std::span<const float> global, engine::TrainState& final_state,
                            const Hash256& last_leaf, const Hash256& result_hash);

// BLAKE2b over the little-endian bytes of a float vector (the id of a delta or of weights).
Hash256 HashFloats(std::span<const float> v);

}  // namespace meshlearn::node
