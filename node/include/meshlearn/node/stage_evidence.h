// What a stage node serves so that a verifier can replay one of its steps (issue 15;
// docs/verification.md "Pipeline stages"): the step's commit, the stage's checkpoint of the step's
// start, and every tensor it received that step, by its content address (engine::TensorHash).
//
// Methods (bodies in the canonical encoding, every field checked on decode):
//   "stage.step"   {task, round, replica, stage, step}
//                  -> {commit: EncodeStageStepCommit, checkpoint_bytes: u64}
//   "stage.slice"  {task, round, replica, stage, step, part: 0 checkpoint | 1 tensor,
//                   tensor: hash (part 1), offset, length <= kMaxStageSlice}
//                  -> bytes [offset, offset + length) of the checkpoint file or the tensor's
//                     raw float32 bytes
//
// The verifier trusts nothing it fetches: the commit must decode and be the step it asked for,
// its signatures are checked by the replay, a checkpoint must hash to state_before, a tensor must
// match its sender's signed record (ReplayStageStep: `start`, `input`); a tensor the stage does
// not serve is left out, which the replay reports as `unserved`.
//
//   StageEvidence evidence;
//   evidence.Register(&router);                                  // beside "stage.push"
//   evidence.Publish(outcome.commit, plane.received(), checkpoint_bytes);   // after each step
//   ...
//   ML_ASSIGN_OR_RETURN(StageStepEvidence ev, FetchStageStepEvidence(transport, endpoint, ref));
//   ML_ASSIGN_OR_RETURN(engine::TrainState start, StageCheckpointState(ev.checkpoint));
//   ML_ASSIGN_OR_RETURN(StageReplayResult r,
//                       ReplayStageStep(setup, std::move(start), ev.commit, ev.blobs, batch,
//                       seed));
//
// Thread-safety: StageEvidence is thread-safe (its handlers run on HTTP worker threads).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::node {

inline constexpr char kMethodStageStep[] = "stage.step";
inline constexpr char kMethodStageSlice[] = "stage.slice";
inline constexpr uint64_t kMaxStageSlice = 4u << 20;

// Which stage step.
struct StageStepRef {
  protocol::TaskId task;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  uint64_t step = 0;
  auto operator<=>(const StageStepRef&) const = default;
  bool operator==(const StageStepRef&) const = default;
  std::string ToString() const;  // "replica 1, stage 2, step 3"
};
StageStepRef StageStepRefOf(const protocol::StageStepCommit& commit);

class StageEvidence {
 public:
  // Registers "stage.step" and "stage.slice".
  void Register(net::Router* router);
  // Serves the step of `commit` (replacing what was served for it): `received`, the tensors the
  // stage received that step by hash (StageTensorBytes; StagePlane::received()), and
  // `checkpoint`, its checkpoint file of the step's start.
  void Publish(const protocol::StageStepCommit& commit, std::map<Hash256, Bytes> received,
               Bytes checkpoint);
  // Stops serving a step (its round is final).
  void Withdraw(const StageStepRef& ref);
  // Stops serving every step of `task` in a round before `round` (rounds [0, round) are final;
  // UINT32_MAX: the whole task), and frees what they held. Returns the steps withdrawn.
  size_t WithdrawRoundsBefore(const protocol::TaskId& task, uint32_t round);
  // The bytes the steps served hold (commits, checkpoints and received tensors).
  uint64_t bytes() const;

 private:
  struct Entry {
    Bytes commit;
    std::map<Hash256, Bytes> tensors;
    Bytes checkpoint;
  };
  Result<Bytes> HandleStep(const net::Request& r) const;
  Result<Bytes> HandleSlice(const net::Request& r) const;

  mutable std::mutex mu_;
  std::map<StageStepRef, Entry> steps_;
};

struct StageStepEvidence {
  protocol::StageStepCommit commit;
  std::map<Hash256, Bytes> blobs;  // the received tensors served, by the records' hashes
  Bytes checkpoint;
};

// The evidence of `ref` from the stage node at `endpoint`: the commit (decoded and validated, and
// of `ref`), the checkpoint (at most kMaxEncodedLength bytes), and the tensor of every received
// record (its size bounded by the record's; one the node does not have is left out). NotFound
// when the node serves no such step; transport errors as they come.
Result<StageStepEvidence> FetchStageStepEvidence(net::Transport* transport,
                                                 const std::string& endpoint,
                                                 const StageStepRef& ref,
                                                 int64_t timeout_ms = 30'000);

// The training state in a checkpoint file's bytes, and back (ledger/stage_replay.h: the ledger
// loads a stage's checkpoint to rule its step).
using ledger::StageCheckpointBytes;
using ledger::StageCheckpointState;

}  // namespace meshlearn::node
