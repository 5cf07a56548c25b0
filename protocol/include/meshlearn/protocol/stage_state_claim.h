// A stage's signed claim of its state at a step's start (issue 15; docs/networking.md "Checkpoint
// replication", docs/protocol.md "The resume step").
//
// A pipeline replica resumes after a lost stage node from a step k > 0 only if the lost stage's
// checkpoint of step k's start outlives its node, and if whoever restores it can check it. So at
// a step's end a stage sends its checkpoint of the next step's start to a neighbour stage's node
// (its keeper, StageCheckpointKeeper), with this claim: the state hash of that checkpoint and
// where it belongs (task, round, replica, the chain's length, stage, step), signed by the stage's
// node. The keeper checks the signature against the replica's chain and the checkpoint against
// the hash before it keeps a byte, and the new node of a replaced stage restores from a
// checkpoint that hashes to what the lost node signed: the state its own run would have reached.
//
//   StageStateClaim c = SignStageStateClaim({task, round, replica, stages, stage, step},
//                                           engine::StateHash(state), node_key);
//   ML_ASSIGN_OR_RETURN(StageStateClaim got, DecodeStageStateClaim(EncodeStageStateClaim(c)));
//   ML_RETURN_IF_ERROR(VerifyStageStateClaim(got, chain[got.stage]));
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

struct StageStateClaim {
  Hash256 task;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stages = 0;  // the chain's length
  uint32_t stage = 0;
  uint64_t step = 0;  // the state is step `step`'s start (after steps 0..step-1)
  Hash256 state;      // engine::StateHash of the checkpoint
  NodeId sender;      // the node of `stage`
  Signature signature;

  bool operator==(const StageStateClaim&) const = default;
};

// The stage that keeps stage `stage`'s checkpoints in a chain of `stages` (>= 2): the next one,
// and the last stage's the one before it. The keeper takes a tensor of every later step of the
// stage's, so a checkpoint sent before that step's first tensor is held wherever the step began.
uint32_t StageCheckpointKeeper(uint32_t stage, uint32_t stages);

// The bytes the sender signs: a domain tag and every field but the signature.
Bytes StageStateClaimSigningBytes(const StageStateClaim& c);
// `c` (its signature and sender ignored) with state hash `state`, signed by `sender`.
StageStateClaim SignStageStateClaim(StageStateClaim c, const Hash256& state, const KeyPair& sender);
// The canonical encoding (fields in declaration order); decode checks the shape (stages in
// [2, kMaxPipelineStages], stage below it), not the signature.
Bytes EncodeStageStateClaim(const StageStateClaim& c);
Result<StageStateClaim> DecodeStageStateClaim(ByteSpan wire);
// The claim's shape, its sender is `expected_sender` (the chain's node of c.stage), and the
// signature verifies. PermissionDenied for a wrong sender or a bad signature.
Status VerifyStageStateClaim(const StageStateClaim& c, const NodeId& expected_sender);
// "stage S of replica R, round N, step K" for messages.
std::string StageStateClaimName(const StageStateClaim& c);

}  // namespace meshlearn::protocol
