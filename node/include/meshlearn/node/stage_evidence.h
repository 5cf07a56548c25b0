// What a stage node serves so that a verifier can replay one of its steps (issue 15;
// docs/verification.md "Pipeline stages"): the step's commit, the stage's checkpoint of the step's
// start, and every tensor it received that step, by its content address (engine::TensorHash) --
// and, when its plane keeps them (StagePlaneOptions::keep_sent), every tensor it sent, which the
// node that replaces a lost neighbour re-runs that neighbour's steps from (stage_resume.h).
//
// Methods (bodies in the canonical encoding, every field checked on decode):
//   "stage.step"   {task, round, replica, stage, step}
//                  -> {commit: EncodeStageStepCommit, checkpoint_bytes: u64}
//   "stage.slice"  {task, round, replica, stage, step, part: 0 checkpoint | 1 tensor,
//                   tensor: hash (part 1), offset, length <= kMaxStageSlice}
//                  -> bytes [offset, offset + length) of the checkpoint file or the tensor's
//                     raw float32 bytes
//
// The checkpoints (a stage's weights and both AdamW moments, tens of MB a step) are files, one a
// step, in the evidence's folder (a node's HomeLayout::StageEvidenceDir), written straight from
// the stage's tensors (engine::WriteCheckpoint: no copy of them in memory) and read a slice at a
// time as verifiers ask. Each write has a file name of its own, never written again, and is served
// only once complete (Publish, after the step; until then what was served for the step, if
// anything, stays served): a reader sees a whole file or none, as with a rename.
//
// The tensors a step received and sent (activations and their gradients: 6 MB a boundary a step
// for the 10M GPT, so hundreds of MB over a round's steps) are files too, content-addressed in the
// same folder: "tensor-<TensorHash hex>.f32", the raw float32 bytes, written whole by Publish
// before the step is served (as a checkpoint file: a reader sees a whole file or none), and
// shared by every served step that lists the hash (counted; the file goes with the last). A
// verifier's slice is read from the file, which must have the size it was written with: a file
// gone or of another size is an error naming the file (DataLoss). Its content is not hashed
// again when served: the verifier checks every tensor against its sender's signed record anyway
// (a stage that serves other floats than it got is the replay's `input` finding, whatever
// changed them). So the node's memory holds the commits and one step's tensors (the plane's,
// until the step's Publish), whatever the round's steps.
//
// A step's files are deleted when it is withdrawn or replaced (a sent tensor's also by DropSent,
// when the unit's run ended whole), and a node deletes every file an earlier process left when it
// starts (DeleteLeftovers, from the NodeAgent's constructor: a restart serves nothing of what it
// trained before; a file cut short by a crash goes with them), not at its first stage step, which
// may never come.
//
// The verifier trusts nothing it fetches: the commit must decode and be the step it asked for,
// its signatures are checked by the replay, a checkpoint must hash to state_before, a tensor must
// match its sender's signed record (ReplayStageStep: `start`, `input`); a tensor the stage does
// not serve is left out, which the replay reports as `unserved`.
//
//   StageEvidence evidence(env, home.StageEvidenceDir());
//   evidence.Register(&router);                                  // beside "stage.push"
//   ML_RETURN_IF_ERROR(evidence.SaveCheckpoint(ref, stage.state()));   // before each step
//   ML_RETURN_IF_ERROR(evidence.Publish(outcome.commit, plane.received()));   // after it
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
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/env.h"
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
  // Checkpoint files live in `dir` (created on the first write), read and written through `env`,
  // which the stage unit's thread and the HTTP handlers' threads use at once: Env::Default() (a
  // MemEnv is thread-compatible only).
  StageEvidence(Env* env, std::string dir) : env_(env), dir_(std::move(dir)) {}

  // Registers "stage.step" and "stage.slice".
  void Register(net::Router* router);
  // Deletes every file in the folder: what an earlier process left (nothing serves it now). A
  // node calls it when it starts, before it serves or trains anything; a folder that does not
  // exist yet is fine. Errors name the folder or the file.
  Status DeleteLeftovers();
  // Writes `state`, the stage's state at the start of step `ref`, as that step's checkpoint file
  // (engine::WriteCheckpoint). It is served from Publish of the step's commit on, replacing what
  // was served for the step (a run of the same unit before); until then that stays served. The
  // folder is created on the first call. Errors name the file.
  Status SaveCheckpoint(const StageStepRef& ref, engine::TrainState& state);
  // Serves the step of `commit`, whose checkpoint SaveCheckpoint wrote (replacing what was served
  // for it, and deleting its file): `received`, the tensors the stage received that step by hash
  // (StageTensorBytes; StagePlane::received()), and any it sent (StagePlane::sent()), each
  // written to its tensor file (unless a served step holds it already) before the step is served
  // and freed as it is written (the file is named by the key: the plane's keys are the tensors'
  // TensorHash).
  // FailedPrecondition when no checkpoint of the step was saved since its last Publish (nothing
  // written); a write's error naming the file (nothing of the step served anew).
  Status Publish(const protocol::StageStepCommit& commit, std::map<Hash256, Bytes> received);
  // Serves `commit` in place of the commit published for its step, keeping the step's checkpoint
  // and received tensors: a stage drawn for a forced error serves its forced commits
  // (protocol::ForceStageStepStates: the same records, forced states) beside its real
  // checkpoints, which cannot hash to a forced state (docs/verification.md, "Forced errors for
  // stage units"). FailedPrecondition when the step is not published.
  Status ServeCommit(const protocol::StageStepCommit& commit);
  // Stops serving the tensors the stage sent in every published step of `unit`'s stage unit
  // (its step is not read), keeping those it received, which its verifiers replay from: once the
  // unit's run has ended whole, no neighbour resumes from them (stage_resume.h). The bytes freed.
  uint64_t DropSent(const StageStepRef& unit);
  // Stops serving a step (its round is final) and deletes its file.
  void Withdraw(const StageStepRef& ref);
  // Stops serving every step of `task` in a round before `round` (rounds [0, round) are final;
  // UINT32_MAX: the whole task), and deletes their files. Returns the steps withdrawn.
  size_t WithdrawRoundsBefore(const protocol::TaskId& task, uint32_t round);
  // The same of every step of `task` that `drop` is true of (its published and its pending
  // checkpoint alike). `drop` runs with the evidence's lock held: it must not call back into it.
  size_t WithdrawIf(const protocol::TaskId& task,
                    const std::function<bool(const StageStepRef&)>& drop);
  // The bytes of the steps served: commits (in memory: memory_bytes()), checkpoint files and
  // tensor files (on disk: checkpoint_file_bytes() and tensor_file_bytes(), a tensor counted once
  // however many steps list it).
  uint64_t bytes() const;
  uint64_t memory_bytes() const;
  uint64_t checkpoint_file_bytes() const;
  uint64_t tensor_file_bytes() const;
  // The file a tensor of the served steps is in (whether or not it still exists on disk); NotFound
  // when no served step lists `tensor`.
  Result<std::string> TensorFile(const Hash256& tensor) const;
  // The checkpoint file served for a step, or else the one SaveCheckpoint wrote for its next
  // Publish; NotFound when there is neither.
  Result<std::string> CheckpointFile(const StageStepRef& ref) const;
  // The state in the checkpoint file served for a published step (engine::ReadCheckpoint of the
  // file, read a piece at a time into the state: never the file in memory): a kept stage that
  // finished a step more than the replica resumes at rolls back to that step's start from it
  // (stage_resume.h). NotFound when the step is not published; DataLoss naming the file when it
  // does not load or does not hash to its state_hash.
  Result<engine::TrainState> PublishedCheckpointState(const StageStepRef& ref) const;
  // The same of the checkpoint SaveCheckpoint wrote for the step since its last Publish (not
  // served: the start of a step that failed): a failed run held for a resume whose stage was
  // freed from memory is loaded from its failed step's (the Stager's Held). NotFound when there is
  // none; DataLoss as above.
  Result<engine::TrainState> PendingCheckpointState(const StageStepRef& ref) const;

 private:
  struct Checkpoint {
    std::string file;    // empty: none
    uint64_t bytes = 0;  // its size when written
  };
  struct Entry {
    // What is served, once Publish gave the step's commit.
    bool published = false;
    Bytes commit;
    std::map<Hash256, uint64_t> tensors;  // received and sent, by hash: their sizes (files_)
    Checkpoint checkpoint;
    // Written for the step's next Publish (a run of the step under way); what is served stays
    // served until then.
    Checkpoint pending;
  };
  // A tensor file and the served steps that list it.
  struct TensorFileRef {
    uint64_t bytes = 0;
    uint64_t refs = 0;
  };
  std::string TensorPath(const Hash256& tensor) const;
  // The state in checkpoint file `c` of step `ref` (read without mu_).
  Result<engine::TrainState> ReadCheckpointFile(const StageStepRef& ref, const Checkpoint& c) const;
  // Deletes an entry's checkpoint files and drops its tensors. REQUIRES: mu_ held.
  void DeleteFiles(const Entry& e);
  // One served step no longer lists each of `tensors`: a file no step lists is deleted.
  // REQUIRES: mu_ held.
  void ReleaseTensors(const std::map<Hash256, uint64_t>& tensors);
  Result<Bytes> HandleStep(const net::Request& r) const;
  Result<Bytes> HandleSlice(const net::Request& r) const;

  Env* const env_;
  const std::string dir_;
  mutable std::mutex mu_;
  bool created_ = false;  // the folder exists (the first SaveCheckpoint made it)
  uint64_t writes_ = 0;   // checkpoint files written: each a name of its own
  std::map<StageStepRef, Entry> steps_;
  std::map<Hash256, TensorFileRef> files_;  // every tensor file, by its tensor's hash
};

struct StageStepEvidence {
  protocol::StageStepCommit commit;
  std::map<Hash256, Bytes> blobs;  // the received tensors served, by the records' hashes
  Bytes checkpoint;                // empty from FetchStageStepRecords
  uint64_t checkpoint_bytes = 0;   // the checkpoint's size, as the node declares it
};

// The evidence of `ref` from the stage node at `endpoint`: the commit (decoded and validated, and
// of `ref`), the checkpoint (at most kMaxEncodedLength bytes), and the tensor of every received
// record (its size bounded by the record's; one the node does not have is left out). NotFound
// when the node serves no such step; transport errors as they come.
Result<StageStepEvidence> FetchStageStepEvidence(net::Transport* transport,
                                                 const std::string& endpoint,
                                                 const StageStepRef& ref,
                                                 int64_t timeout_ms = 30'000);
// The same with, in place of the received tensors, the tensors of the commit's sent records
// addressed to stage `to_stage`, which a stage serves when it published them (a plane with
// StagePlaneOptions::keep_sent): what the node that replaces a lost stage `to_stage` re-runs its
// steps from (stage_resume.h). One the node does not serve is left out; no checkpoint.
// ResourceExhausted, before any tensor is fetched, when a record declares more than
// `max_tensor_bytes` (what is fetched is reserved at its declared size).
Result<StageStepEvidence> FetchStageStepSent(net::Transport* transport, const std::string& endpoint,
                                             const StageStepRef& ref, uint32_t to_stage,
                                             int64_t timeout_ms = 30'000,
                                             uint64_t max_tensor_bytes = UINT64_MAX);
// Only the step's commit (decoded, validated and of `ref`): what a kept stage swaps the lost
// stage's records from (stage_resume.h). Errors as FetchStageStepEvidence's.
Result<protocol::StageStepCommit> FetchStageStepCommit(net::Transport* transport,
                                                       const std::string& endpoint,
                                                       const StageStepRef& ref,
                                                       int64_t timeout_ms = 30'000);
// The same without the checkpoint's bytes (ev.checkpoint stays empty; ev.checkpoint_bytes is its
// declared size): a verifier loads it with FetchStageCheckpointState instead, as it comes.
Result<StageStepEvidence> FetchStageStepRecords(net::Transport* transport,
                                                const std::string& endpoint,
                                                const StageStepRef& ref,
                                                int64_t timeout_ms = 30'000);

// The stage's checkpoint of step `ref` (`size` bytes: StageStepEvidence::checkpoint_bytes)
// loaded as it is fetched: engine::ReadCheckpoint over "stage.slice" reads, a slice (at most
// kMaxStageSlice bytes) in memory at a time, each tensor's bytes copied straight into the state
// (never the file, nor the state twice). `*state` is the state, or why the checkpoint does not
// load (the stage's `start` fault: a file that does not parse, does not hash to its state_hash,
// or is shorter than its node declared). The returned Status is a fetch that failed (NotFound:
// the node no longer serves the step; transport errors as they come): nothing is judged then.
Status FetchStageCheckpointState(net::Transport* transport, const std::string& endpoint,
                                 const StageStepRef& ref, uint64_t size,
                                 Result<engine::TrainState>* state, int64_t timeout_ms = 30'000);

// The training state in a checkpoint file's bytes, and back (ledger/stage_replay.h: the ledger
// loads a stage's checkpoint to rule its step).
using ledger::StageCheckpointBytes;
using ledger::StageCheckpointState;

}  // namespace meshlearn::node
