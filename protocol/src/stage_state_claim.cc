#include "meshlearn/protocol/stage_state_claim.h"

#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/protocol/task_model.h"  // kMaxPipelineStages

namespace meshlearn::protocol {
namespace {

constexpr char kClaimSigningDomain[] = "meshlearn.pipeline.state_claim.v1";

void PutClaimFields(Encoder& e, const StageStateClaim& c) {
  e.PutHash(c.task);
  e.PutU32(c.round);
  e.PutU32(c.replica);
  e.PutU32(c.stages);
  e.PutU32(c.stage);
  e.PutU64(c.step);
  e.PutHash(c.state);
  e.PutPublicKey(c.sender);
}

Status ValidateClaimShape(const StageStateClaim& c) {
  if (c.stages < 2 || c.stages > kMaxPipelineStages || c.stage >= c.stages) {
    return InvalidArgument("stage state claim: stage " + std::to_string(c.stage) + " of " +
                           std::to_string(c.stages) + " stages (a chain of 2.." +
                           std::to_string(kMaxPipelineStages) + ", the stage below its length)");
  }
  return Status::Ok();
}

}  // namespace

uint32_t StageCheckpointKeeper(uint32_t stage, uint32_t stages) {
  CHECK_GE(stages, 2u);
  CHECK_LT(stage, stages);
  return stage + 1 < stages ? stage + 1 : stage - 1;
}

std::string StageStateClaimName(const StageStateClaim& c) {
  return "stage " + std::to_string(c.stage) + " of replica " + std::to_string(c.replica) +
         ", round " + std::to_string(c.round) + ", step " + std::to_string(c.step);
}

Bytes StageStateClaimSigningBytes(const StageStateClaim& c) {
  Encoder e;
  e.PutString(kClaimSigningDomain);
  PutClaimFields(e, c);
  return e.Take();
}

StageStateClaim SignStageStateClaim(StageStateClaim c, const Hash256& state,
                                    const KeyPair& sender) {
  c.state = state;
  c.sender = sender.public_key();
  c.signature = sender.Sign(StageStateClaimSigningBytes(c));
  return c;
}

Bytes EncodeStageStateClaim(const StageStateClaim& c) {
  Encoder e;
  PutClaimFields(e, c);
  e.PutSignature(c.signature);
  return e.Take();
}

Result<StageStateClaim> DecodeStageStateClaim(ByteSpan wire) {
  Decoder d(wire, "stage state claim");
  StageStateClaim c;
  ML_RETURN_IF_ERROR(d.GetHash(&c.task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.round, "round"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.replica, "replica"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.stages, "stages"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.stage, "stage"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.step, "step"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.state, "state"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c.sender, "sender"));
  ML_RETURN_IF_ERROR(d.GetSignature(&c.signature, "signature"));
  ML_RETURN_IF_ERROR(d.Finish());
  ML_RETURN_IF_ERROR(ValidateClaimShape(c));
  return c;
}

Status VerifyStageStateClaim(const StageStateClaim& c, const NodeId& expected_sender) {
  ML_RETURN_IF_ERROR(ValidateClaimShape(c));
  if (c.sender != expected_sender) {
    return PermissionDenied("the state claim of " + StageStateClaimName(c) + " is signed by node " +
                            c.sender.ShortHex() + ", but the chain's node of stage " +
                            std::to_string(c.stage) + " is " + expected_sender.ShortHex());
  }
  if (!Verify(c.sender, StageStateClaimSigningBytes(c), c.signature)) {
    return PermissionDenied("the state claim of " + StageStateClaimName(c) +
                            ": the signature of node " + c.sender.ShortHex() +
                            " does not verify (a forged or altered claim)");
  }
  return Status::Ok();
}

}  // namespace meshlearn::protocol
