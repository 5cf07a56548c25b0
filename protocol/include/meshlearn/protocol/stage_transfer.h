// Signed stage transfers and a pipeline stage's per-step commitment (issue 15; docs/verification.md
// "Pipeline stages").
//
// A pipeline replica is a chain of S stage nodes (engine/pipeline.h). Every tensor one stage sends
// another -- an activation forward, an activation gradient backward, and the few end-of-step
// values -- travels with a StageTransfer: the record of where it belongs (task, round, replica,
// the two stages, step, micro-batch, kind), the tensor's content address (engine::TensorHash) and
// byte size, signed by the sender's node key. So a receiver cannot claim to have received
// something else (it must show the sender's signature over the hash of what it used), and a
// sender cannot deny what it sent (its signature is on the hash of what it sent).
//
// The record also carries the tensor's tiled root (engine/tile.h: the Merkle root over its 32 x 32
// tiles, viewed as rows of `tile_cols` floats: a GPT's boundary tensors are rows of n_embd), so one
// tile of what a stage received can be proven alone against its sender's signature: the tile
// phase of a stage dispute (engine/tile_rule.h, PlanStageStepTiles: the received tensors are
// inputs of the stage's step) reads a received tensor's tiles, never the whole tensor.
//
// A stage's step commits, as a unit's steps do, the state hash chain (its StateHash before and
// after the step) plus the transfer records it received and sent, in the schedule's order:
//
//   leaf(step) = BLAKE2b("meshlearn.pipeline.stage_step.v1", task, round, replica, stage, stages,
//                        step, state_before, state_after,
//                        MerkleRoot(ids of the received records), MerkleRoot(ids of the sent))
//   id(record) = BLAKE2b("meshlearn.pipeline.transfer_id.v2", EncodeStageTransfer(record))
//
// and a stage's run of H steps commits MerkleRoot(leaf(0), ..., leaf(H-1)) like a unit's leaves.
// A verifier replays one step from the stage's checkpoint of state_before and its received
// tensors (node/stage_replay.h), and compares the hashes it sends and its state_after.
//
//   StageTransfer t = SignStageTransfer(key, TensorHash(values), 4 * values.size(), node_key);
//   Bytes wire = EncodeStageTransfer(t);
//   ML_ASSIGN_OR_RETURN(StageTransfer got, DecodeStageTransfer(wire));        // shape checked
//   ML_RETURN_IF_ERROR(VerifyStageTransfer(got, expected_sender));            // signature
//   ML_RETURN_IF_ERROR(CheckReceivedTensor(got, TensorHash(received), 4 * received.size()));
//
// All functions are pure and thread-safe; the tensor hash itself is the engine's (protocol/ sees
// only hashes).
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/task_model.h"  // kMaxPipelineStages
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

// What crosses a stage boundary. The first five are engine::TransferKind's (same numbers); the
// gradient total is what the last stage sends every other stage once it has summed the squares
// (in one process every stage reads the sum; across nodes it has to be sent).
enum class StageTensorKind : uint8_t {
  kStageTensorActivation = 0,      // s -> s+1, per micro-batch (forward)
  kStageTensorActivationGrad = 1,  // s+1 -> s, per micro-batch (backward)
  kStageTensorTiedHeadGrad = 2,    // S-1 -> 0, end of step: the GPT head's wte gradient
  kStageTensorGradSquares = 3,     // s -> s+1, end of step: the running sum of squares (1 float)
  kStageTensorTiedWeight = 4,      // 0 -> S-1, start of step: wte for the GPT head
  kStageTensorGradTotal = 5,       // S-1 -> s < S-1, end of step: the whole sum (1 float)
};
inline constexpr uint8_t kStageTensorKindCount = 6;
const char* StageTensorKindName(StageTensorKind kind);
// True for the kinds sent once per micro-batch (micro_batch >= 0); the others carry -1.
bool StageTensorPerMicroBatch(StageTensorKind kind);

// Bounds on what a record may claim (decode refuses more; stages: kMaxPipelineStages).
inline constexpr int64_t kMaxMicroBatches = 1 << 16;
inline constexpr uint64_t kMaxStageTensorBytes = 4ull << 30;  // 1 Gi floats

// Where a tensor belongs. The step of a start-of-step transfer (the tied weight) is the step that
// uses it.
struct StageTensorKey {
  TaskId task;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stages = 0;  // S of the replica's chain
  uint32_t from_stage = 0;
  uint32_t to_stage = 0;
  uint64_t step = 0;         // 0-based inner step (the stages' counter before the step)
  int64_t micro_batch = -1;  // >= 0 exactly for the per-micro-batch kinds
  StageTensorKind kind = StageTensorKind::kStageTensorActivation;

  auto operator<=>(const StageTensorKey&) const = default;
  bool operator==(const StageTensorKey&) const = default;
  // "replica 1, step 3, micro-batch 0: activation stage 0 -> 1" (the task and round are the
  // caller's context).
  std::string ToString() const;
};

// The key's shape: stages in [1, kMaxPipelineStages], both stages below it, the pair and the
// micro-batch right for the kind (see StageTensorKind). InvalidArgument naming what is wrong.
Status ValidateStageTensorKey(const StageTensorKey& key);

struct StageTransfer {
  StageTensorKey key;
  Hash256 tensor;      // engine::TensorHash of the values sent
  uint64_t bytes = 0;  // 4 x the number of floats
  // The tensor's tiled root (engine::TensorRoot) in the grid of its view as rows of tile_cols
  // floats (engine::StageTensorGrid; 0, or a width that does not divide it: one row).
  uint32_t tile_cols = 0;
  Hash256 tiles;
  NodeId sender;        // the node of stage key.from_stage
  Signature signature;  // sender's, over StageTransferSigningBytes

  bool operator==(const StageTransfer&) const = default;

  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task", s.key.task);
    v("round", s.key.round);
    v("replica", s.key.replica);
    v("stages", s.key.stages);
    v("from_stage", s.key.from_stage);
    v("to_stage", s.key.to_stage);
    v("step", s.key.step);
    v("micro_batch", s.key.micro_batch);
    v("kind", s.key.kind);
    v("tensor", s.tensor);
    v("bytes", s.bytes);
    v("tile_cols", s.tile_cols);
    v("tiles", s.tiles);
    v("sender", s.sender);
    v("signature", s.signature);
  }
};

// The bytes the sender signs: a domain tag and every field but the signature.
Bytes StageTransferSigningBytes(const StageTransfer& t);
// A record of `key` for a tensor of `tensor_hash` and `bytes`, signed by `sender`.
// REQUIRES: ValidateStageTensorKey(key) is ok, bytes % 4 == 0.
StageTransfer SignStageTransfer(const StageTensorKey& key, const Hash256& tensor_hash,
                                uint64_t bytes, const KeyPair& sender);
// The same with the tensor's tiled root `tiles` in rows of `tile_cols` floats (what a stage signs:
// ledger::SignStageTensor computes both hashes; the form above leaves tiles zero, for records
// whose tensor no test opens by tile).
StageTransfer SignStageTransfer(const StageTensorKey& key, const Hash256& tensor_hash,
                                const Hash256& tiles, uint32_t tile_cols, uint64_t bytes,
                                const KeyPair& sender);

// The canonical encoding (base/encoding.h, fields in Visit order). Decode checks the key's shape
// and the size (a multiple of 4, at most kMaxStageTensorBytes; 4 for the sums) too, not the
// signature.
Bytes EncodeStageTransfer(const StageTransfer& t);
inline constexpr size_t kStageTransferWireBytes =
    32 + 4 * 5 + 8 + 8 + 1 + 32 + 8 + 4 + 32 + 32 + 64;
Result<StageTransfer> DecodeStageTransfer(ByteSpan wire);

// The record's shape (as decode checks it), its sender is `expected_sender` (the node the
// replica's chain gives stage key.from_stage), and the signature verifies. PermissionDenied for a
// wrong sender or a bad signature, InvalidArgument for a bad shape; the message names the key.
Status VerifyStageTransfer(const StageTransfer& t, const NodeId& expected_sender);

// What a receiver checks of the tensor it got against the (verified) record: the hash and the
// byte size. InvalidArgument naming the key and both hashes (or sizes).
Status CheckReceivedTensor(const StageTransfer& t, const Hash256& got_hash, uint64_t got_bytes);
// And its tiled root (the received values' engine::TensorRoot in the record's tile_cols grid):
// InvalidArgument naming the key and both roots.
Status CheckReceivedTiles(const StageTransfer& t, const Hash256& got_tiles);

// The content address of a record (its signature included).
Hash256 StageTransferId(const StageTransfer& t);

// ---- A stage's step commitment.

inline constexpr uint32_t kMaxStageStepTransfers = 4 * kMaxMicroBatches + 8;

struct StageStepCommit {
  TaskId task;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  uint32_t stages = 0;
  uint64_t step = 0;
  Hash256 state_before;                 // engine::StateHash of the stage before the step
  Hash256 state_after;                  // and after it
  std::vector<StageTransfer> received;  // in the schedule's order
  std::vector<StageTransfer> sent;      // in the schedule's order

  bool operator==(const StageStepCommit&) const = default;
};

// The step's leaf (top of file).
Hash256 StageStepLeaf(const StageStepCommit& c);
// MerkleRoot over the leaves of steps 0..H-1 of a stage's run.
Hash256 StageCommitment(const std::vector<Hash256>& leaves);

// What a stage unit's check (protocol::UnitCheck, on chain) is run over: H + 1 leaves, the
// stage's commitment first, then StageStepLeaf of steps 0..H-1, so that "segment" t of the check
// is step t and a mismatch claim proves step t's leaf (its end) against
// StageCheckCommitment(step_leaves), the check's commitment, with UnitCheck's claim rules
// unchanged. Leaf 0 binds the check to the commitment the stage signed; it is never disputed (a
// claim's start is agreed). Every party -- the ledger opening the check, a verifier building its
// claim -- derives them here.
std::vector<Hash256> StageCheckLeaves(const std::vector<Hash256>& step_leaves);
Hash256 StageCheckCommitment(const std::vector<Hash256>& step_leaves);

// Encoding of a commit (what a stage serves a verifier): the header fields, then the received
// and the sent records (count-prefixed, each EncodeStageTransfer). Decode checks every record's
// shape and ValidateStageStepCommit's structure.
Bytes EncodeStageStepCommit(const StageStepCommit& c);
Result<StageStepCommit> DecodeStageStepCommit(ByteSpan wire);

// The commit's structure: every record belongs to (task, round, replica, stages, step) -- the
// tied weight's records to the step too -- every received record is addressed to `stage` and
// every sent one comes from it, no key twice. InvalidArgument naming the record at fault.
Status ValidateStageStepCommit(const StageStepCommit& c);

// Every record's signature against its sending stage's node: chain[s] is the node of stage s
// (chain.size() == stages). The sent records must be signed by chain[stage]. The first failure,
// naming its key.
Status VerifyStageStepSignatures(const StageStepCommit& c, const std::vector<NodeId>& chain);

// ---- Forced errors for stage units (docs/verification.md, "Forced errors for stage units").

// A stage unit drawn for a forced error (IsForcedError with the secret its CommitStage binds)
// trains and sends honestly: its neighbours' steps are signed over what it sent, so the forced
// error must not touch a tensor. Only its state hashes are forced, in place: each step keeps its
// signed records, step 0's state_before stays the true start, and every later state k (step
// k-1's state_after, step k's state_before) becomes ForcedLeaf(secret, unit, k). No state hashes
// to a forced one, so a verifier that fetches a step's checkpoint and hashes it (step 0: replays
// it) finds the forced error, exactly a forced unit's property. `commits` are steps 0..H-1, in
// step order; `unit` is the stage unit (its shard replica * stages + stage).
void ForceStageStepStates(const Hash256& secret, const UnitId& unit,
                          std::vector<StageStepCommit>& commits);

// Whether a drawn stage's commits have that form: commit j names the unit (task, round, replica
// and stage, unit.shard == replica * stages + stage) and step j, and carries the forced states
// above. InvalidArgument naming the first step and field that does not.
Status CheckForcedStageForm(const Hash256& secret, const UnitId& unit,
                            const std::vector<StageStepCommit>& commits);

// A stage run's H step commits, in step order: a count, then each EncodeStageStepCommit
// length-prefixed. Two uses: the blob a CommitStage names (CommitStageTx::commits), kept public
// past the round for an audit of the task (docs/verification.md, "An audit of a pipeline task"),
// and the forced commits a drawn stage reveals with its secret (RevealSecretTx::forced_commits).
// Decode refuses more than `max_count` commits, truncated or trailing bytes, and a commit
// DecodeStageStepCommit refuses, naming its position; what the commits must name (task, round,
// step...) is each caller's check.
Bytes EncodeStageStepCommits(const std::vector<StageStepCommit>& commits);
Result<std::vector<StageStepCommit>> DecodeStageStepCommits(ByteSpan wire, uint32_t max_count);

}  // namespace meshlearn::protocol
