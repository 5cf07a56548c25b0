#include "meshlearn/protocol/stage_transfer.h"

#include <set>
#include <string>
#include <type_traits>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::protocol {
namespace {

// v2: the record carries the tensor's tiled root (tile_cols, tiles).
constexpr char kSigningDomain[] = "meshlearn.pipeline.transfer.v2";
constexpr char kIdDomain[] = "meshlearn.pipeline.transfer_id.v2";
constexpr char kLeafDomain[] = "meshlearn.pipeline.stage_step.v1";

// Visit-driven encoding: every field of StageTransfer is named once, in its Visit.
struct StagePutField {
  Encoder* e;
  void operator()(const char*, const Hash256& v) { e->PutHash(v); }
  void operator()(const char*, const PublicKey& v) { e->PutPublicKey(v); }
  void operator()(const char*, const Signature& v) { e->PutSignature(v); }
  void operator()(const char*, const uint32_t& v) { e->PutU32(v); }
  void operator()(const char*, const uint64_t& v) { e->PutU64(v); }
  void operator()(const char*, const int64_t& v) { e->PutI64(v); }
  void operator()(const char*, const StageTensorKind& v) { e->PutU8(static_cast<uint8_t>(v)); }
};

struct StageGetField {
  Decoder* d;
  Status* st;
  template <typename T>
  void operator()(const char* name, T& v) {
    if (st->ok()) *st = Get(name, v);
  }
  Status Get(const char* name, Hash256& v) { return d->GetHash(&v, name); }
  Status Get(const char* name, PublicKey& v) { return d->GetPublicKey(&v, name); }
  Status Get(const char* name, Signature& v) { return d->GetSignature(&v, name); }
  Status Get(const char* name, uint32_t& v) { return d->GetU32(&v, name); }
  Status Get(const char* name, uint64_t& v) { return d->GetU64(&v, name); }
  Status Get(const char* name, int64_t& v) { return d->GetI64(&v, name); }
  Status Get(const char* name, StageTensorKind& v) {
    uint8_t k = 0;
    ML_RETURN_IF_ERROR(d->GetU8(&k, name));
    if (k >= kStageTensorKindCount) {
      return InvalidArgument(std::string(name) + " " + std::to_string(k) +
                             " is not a stage tensor kind (0.." +
                             std::to_string(kStageTensorKindCount - 1) + ")");
    }
    v = static_cast<StageTensorKind>(k);
    return Status::Ok();
  }
};

void PutTransferFields(Encoder& e, const StageTransfer& t, bool with_signature) {
  StagePutField put{&e};
  StageTransfer::Visit(t, [&](const char* name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Signature>) {
      if (!with_signature) return;
    }
    put(name, v);
  });
}

Status DecodeTransferFields(Decoder& d, StageTransfer* t) {
  Status st = Status::Ok();
  StageTransfer::Visit(*t, StageGetField{&d, &st});
  if (!st.ok()) return st;
  ML_RETURN_IF_ERROR(ValidateStageTensorKey(t->key));
  const bool sum = t->key.kind == StageTensorKind::kStageTensorGradSquares ||
                   t->key.kind == StageTensorKind::kStageTensorGradTotal;
  if (sum ? t->bytes != 4 : (t->bytes % 4 != 0 || t->bytes > kMaxStageTensorBytes)) {
    return InvalidArgument(t->key.ToString() + ": bytes " + std::to_string(t->bytes) +
                           (sum ? " must be 4 (one float32)"
                                : " must be a multiple of 4 (float32) and at most " +
                                      std::to_string(kMaxStageTensorBytes)));
  }
  return Status::Ok();
}

}  // namespace

const char* StageTensorKindName(StageTensorKind kind) {
  switch (kind) {
    case StageTensorKind::kStageTensorActivation:
      return "activation";
    case StageTensorKind::kStageTensorActivationGrad:
      return "activation_grad";
    case StageTensorKind::kStageTensorTiedHeadGrad:
      return "tied_head_grad";
    case StageTensorKind::kStageTensorGradSquares:
      return "grad_squares";
    case StageTensorKind::kStageTensorTiedWeight:
      return "tied_weight";
    case StageTensorKind::kStageTensorGradTotal:
      return "grad_total";
  }
  return "unknown";
}

bool StageTensorPerMicroBatch(StageTensorKind kind) {
  return kind == StageTensorKind::kStageTensorActivation ||
         kind == StageTensorKind::kStageTensorActivationGrad;
}

std::string StageTensorKey::ToString() const {
  std::string s = "replica " + std::to_string(replica) + ", step " + std::to_string(step);
  if (micro_batch >= 0) s += ", micro-batch " + std::to_string(micro_batch);
  return s + ": " + StageTensorKindName(kind) + " stage " + std::to_string(from_stage) + " -> " +
         std::to_string(to_stage);
}

Status ValidateStageTensorKey(const StageTensorKey& k) {
  auto bad = [&](const std::string& why) { return InvalidArgument(k.ToString() + ": " + why); };
  if (k.stages < 1 || k.stages > kMaxPipelineStages) {
    return bad("stages " + std::to_string(k.stages) + " must be in [1, " +
               std::to_string(kMaxPipelineStages) + "]");
  }
  if (k.from_stage >= k.stages || k.to_stage >= k.stages) {
    return bad("both stages must be below the chain's " + std::to_string(k.stages));
  }
  if (StageTensorPerMicroBatch(k.kind)) {
    if (k.micro_batch < 0 || k.micro_batch >= kMaxMicroBatches) {
      return bad("micro_batch " + std::to_string(k.micro_batch) + " must be in [0, " +
                 std::to_string(kMaxMicroBatches) + ")");
    }
  } else if (k.micro_batch != -1) {
    return bad("micro_batch must be -1 (a once-per-step tensor), got " +
               std::to_string(k.micro_batch));
  }
  const uint32_t last = k.stages - 1;
  switch (k.kind) {
    case StageTensorKind::kStageTensorActivation:
    case StageTensorKind::kStageTensorGradSquares:
      if (k.to_stage != k.from_stage + 1) return bad("goes from a stage to the next one");
      break;
    case StageTensorKind::kStageTensorActivationGrad:
      if (k.from_stage != k.to_stage + 1) return bad("goes from a stage to the previous one");
      break;
    case StageTensorKind::kStageTensorTiedHeadGrad:
      if (k.stages < 2 || k.from_stage != last || k.to_stage != 0) {
        return bad("goes from the last stage to stage 0 of a chain of two or more");
      }
      break;
    case StageTensorKind::kStageTensorTiedWeight:
      if (k.stages < 2 || k.from_stage != 0 || k.to_stage != last) {
        return bad("goes from stage 0 to the last stage of a chain of two or more");
      }
      break;
    case StageTensorKind::kStageTensorGradTotal:
      if (k.from_stage != last || k.to_stage >= last) {
        return bad("goes from the last stage to an earlier one");
      }
      break;
  }
  return Status::Ok();
}

Bytes StageTransferSigningBytes(const StageTransfer& t) {
  Encoder e;
  e.PutString(kSigningDomain);
  PutTransferFields(e, t, /*with_signature=*/false);
  return e.Take();
}

StageTransfer SignStageTransfer(const StageTensorKey& key, const Hash256& tensor_hash,
                                uint64_t bytes, const KeyPair& sender) {
  return SignStageTransfer(key, tensor_hash, Hash256(), 0, bytes, sender);
}

StageTransfer SignStageTransfer(const StageTensorKey& key, const Hash256& tensor_hash,
                                const Hash256& tiles, uint32_t tile_cols, uint64_t bytes,
                                const KeyPair& sender) {
  CHECK(ValidateStageTensorKey(key).ok()) << ValidateStageTensorKey(key).ToString();
  CHECK_EQ(bytes % 4, 0u);
  StageTransfer t;
  t.key = key;
  t.tensor = tensor_hash;
  t.bytes = bytes;
  t.tile_cols = tile_cols;
  t.tiles = tiles;
  t.sender = sender.public_key();
  t.signature = sender.Sign(StageTransferSigningBytes(t));
  return t;
}

Bytes EncodeStageTransfer(const StageTransfer& t) {
  Encoder e;
  PutTransferFields(e, t, /*with_signature=*/true);
  return e.Take();
}

Result<StageTransfer> DecodeStageTransfer(ByteSpan wire) {
  Decoder d(wire, "stage transfer");
  StageTransfer t;
  ML_RETURN_IF_ERROR(DecodeTransferFields(d, &t));
  ML_RETURN_IF_ERROR(d.Finish());
  return t;
}

Status VerifyStageTransfer(const StageTransfer& t, const NodeId& expected_sender) {
  ML_RETURN_IF_ERROR(ValidateStageTensorKey(t.key));
  if (t.sender != expected_sender) {
    return PermissionDenied(t.key.ToString() + ": sent by node " + t.sender.ShortHex() +
                            ", but stage " + std::to_string(t.key.from_stage) +
                            " of the replica is node " + expected_sender.ShortHex());
  }
  if (!Verify(t.sender, StageTransferSigningBytes(t), t.signature)) {
    return PermissionDenied(t.key.ToString() + ": the signature of node " + t.sender.ShortHex() +
                            " does not verify (a forged or altered record)");
  }
  return Status::Ok();
}

Status CheckReceivedTensor(const StageTransfer& t, const Hash256& got_hash, uint64_t got_bytes) {
  if (got_bytes != t.bytes) {
    return InvalidArgument(t.key.ToString() + ": the tensor received has " +
                           std::to_string(got_bytes) + " bytes, the signed record says " +
                           std::to_string(t.bytes));
  }
  if (got_hash != t.tensor) {
    return InvalidArgument(t.key.ToString() + ": the tensor received hashes to " +
                           got_hash.ShortHex() + ", the signed record says " + t.tensor.ShortHex());
  }
  return Status::Ok();
}

Status CheckReceivedTiles(const StageTransfer& t, const Hash256& got_tiles) {
  if (got_tiles != t.tiles) {
    return InvalidArgument(t.key.ToString() + ": the tensor received has the tiled root " +
                           got_tiles.ShortHex() + " (rows of " + std::to_string(t.tile_cols) +
                           " floats), the signed record says " + t.tiles.ShortHex());
  }
  return Status::Ok();
}

Hash256 StageTransferId(const StageTransfer& t) {
  Hasher h(kIdDomain);
  h.Update(EncodeStageTransfer(t));
  return h.Finish();
}

// ---- Step commitments.

namespace {

Hash256 StageRecordsRoot(const std::vector<StageTransfer>& records) {
  std::vector<Hash256> ids;
  ids.reserve(records.size());
  for (const StageTransfer& t : records) ids.push_back(StageTransferId(t));
  return MerkleRoot(ids);
}

std::string StageCommitName(const StageStepCommit& c) {
  return "replica " + std::to_string(c.replica) + ", stage " + std::to_string(c.stage) + ", step " +
         std::to_string(c.step);
}

}  // namespace

Hash256 StageStepLeaf(const StageStepCommit& c) {
  Hasher h(kLeafDomain);
  h.Update(c.task);
  h.UpdateU64(c.round).UpdateU64(c.replica).UpdateU64(c.stage).UpdateU64(c.stages);
  h.UpdateU64(c.step);
  h.Update(c.state_before).Update(c.state_after);
  h.Update(StageRecordsRoot(c.received)).Update(StageRecordsRoot(c.sent));
  return h.Finish();
}

Hash256 StageCommitment(const std::vector<Hash256>& leaves) { return MerkleRoot(leaves); }

std::vector<Hash256> StageCheckLeaves(const std::vector<Hash256>& step_leaves) {
  std::vector<Hash256> out;
  out.reserve(step_leaves.size() + 1);
  out.push_back(StageCommitment(step_leaves));
  out.insert(out.end(), step_leaves.begin(), step_leaves.end());
  return out;
}

Hash256 StageCheckCommitment(const std::vector<Hash256>& step_leaves) {
  return MerkleRoot(StageCheckLeaves(step_leaves));
}

Bytes EncodeStageStepCommit(const StageStepCommit& c) {
  Encoder e;
  e.PutHash(c.task).PutU32(c.round).PutU32(c.replica).PutU32(c.stage).PutU32(c.stages);
  e.PutU64(c.step).PutHash(c.state_before).PutHash(c.state_after);
  for (const std::vector<StageTransfer>* list : {&c.received, &c.sent}) {
    e.PutU32(static_cast<uint32_t>(list->size()));
    for (const StageTransfer& t : *list) PutTransferFields(e, t, /*with_signature=*/true);
  }
  return e.Take();
}

Result<StageStepCommit> DecodeStageStepCommit(ByteSpan wire) {
  Decoder d(wire, "stage step commit");
  StageStepCommit c;
  ML_RETURN_IF_ERROR(d.GetHash(&c.task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.round, "round"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.replica, "replica"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.stage, "stage"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.stages, "stages"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.step, "step"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.state_before, "state_before"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.state_after, "state_after"));
  for (auto [list, name] : {std::pair{&c.received, "received"}, std::pair{&c.sent, "sent"}}) {
    uint32_t n = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&n, name, kMaxStageStepTransfers, kStageTransferWireBytes));
    list->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      Status st = DecodeTransferFields(d, &(*list)[i]);
      if (!st.ok()) {
        return st.WithPrefix("stage step commit: " + std::string(name) + " record " +
                             std::to_string(i));
      }
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());
  ML_RETURN_IF_ERROR(ValidateStageStepCommit(c));
  return c;
}

Status ValidateStageStepCommit(const StageStepCommit& c) {
  const std::string name = StageCommitName(c);
  if (c.stages < 1 || c.stages > kMaxPipelineStages || c.stage >= c.stages) {
    return InvalidArgument(name + ": stage must be below stages (" + std::to_string(c.stages) +
                           ", at most " + std::to_string(kMaxPipelineStages) + ")");
  }
  std::set<StageTensorKey> seen;
  for (bool received : {true, false}) {
    for (const StageTransfer& t : received ? c.received : c.sent) {
      const StageTensorKey& k = t.key;
      ML_RETURN_IF_ERROR(ValidateStageTensorKey(k).WithPrefix(name));
      if (k.task != c.task || k.round != c.round || k.replica != c.replica ||
          k.stages != c.stages || k.step != c.step) {
        return InvalidArgument(name + ": record " + k.ToString() + " of round " +
                               std::to_string(k.round) +
                               " belongs to another task, round, "
                               "replica, chain or step");
      }
      if (received ? k.to_stage != c.stage : k.from_stage != c.stage) {
        return InvalidArgument(name + ": " + (received ? "received" : "sent") + " record " +
                               k.ToString() + " is not " + (received ? "to" : "from") +
                               " this stage");
      }
      if (!seen.insert(k).second) {
        return InvalidArgument(name + ": record " + k.ToString() + " is listed twice");
      }
    }
  }
  return Status::Ok();
}

Status VerifyStageStepSignatures(const StageStepCommit& c, const std::vector<NodeId>& chain) {
  if (chain.size() != c.stages) {
    return InvalidArgument(StageCommitName(c) + ": the chain names " +
                           std::to_string(chain.size()) + " nodes for " + std::to_string(c.stages) +
                           " stages");
  }
  for (const std::vector<StageTransfer>* list : {&c.received, &c.sent}) {
    for (const StageTransfer& t : *list) {
      ML_RETURN_IF_ERROR(VerifyStageTransfer(t, chain[t.key.from_stage]));
    }
  }
  return Status::Ok();
}

void ForceStageStepStates(const Hash256& secret, const UnitId& unit,
                          std::vector<StageStepCommit>& commits) {
  for (size_t j = 0; j < commits.size(); ++j) {
    if (j > 0) commits[j].state_before = ForcedLeaf(secret, unit, j);
    commits[j].state_after = ForcedLeaf(secret, unit, j + 1);
  }
}

Status CheckForcedStageForm(const Hash256& secret, const UnitId& unit,
                            const std::vector<StageStepCommit>& commits) {
  // The form is ForceStageStepStates': each commit's states are compared with what it writes.
  std::vector<StageStepCommit> forced = commits;
  ForceStageStepStates(secret, unit, forced);
  for (size_t j = 0; j < commits.size(); ++j) {
    const StageStepCommit& c = commits[j];
    const std::string at = "forced stage commit of step " + std::to_string(j) + ": ";
    if (c.task != unit.task || c.round != unit.round ||
        uint64_t{c.replica} * c.stages + c.stage != unit.shard || c.step != j) {
      return InvalidArgument(at + "names " + StageCommitName(c) + ", not unit " + unit.ToString() +
                             " step " + std::to_string(j));
    }
    if (c.state_before != forced[j].state_before) {
      return InvalidArgument(at + "state_before " + c.state_before.ShortHex() +
                             " is not the forced state ForcedLeaf(secret, unit, " +
                             std::to_string(j) + ")");
    }
    if (c.state_after != forced[j].state_after) {
      return InvalidArgument(at + "state_after " + c.state_after.ShortHex() +
                             " is not the forced state ForcedLeaf(secret, unit, " +
                             std::to_string(j + 1) + ")");
    }
  }
  return Status::Ok();
}

Bytes EncodeStageStepCommits(const std::vector<StageStepCommit>& commits) {
  Encoder e;
  e.PutU32(static_cast<uint32_t>(commits.size()));
  for (const StageStepCommit& c : commits) e.PutBytes(EncodeStageStepCommit(c));
  return e.Take();
}

Result<std::vector<StageStepCommit>> DecodeStageStepCommits(ByteSpan wire, uint32_t max_count) {
  Decoder d(wire, "stage step commits");
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "commits", max_count, 4));
  std::vector<StageStepCommit> commits;
  commits.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    Bytes one;
    ML_RETURN_IF_ERROR(d.GetBytes(&one, "commit " + std::to_string(i)));
    Result<StageStepCommit> c = DecodeStageStepCommit(one);
    if (!c.ok()) return c.status().WithPrefix("stage step commits: commit " + std::to_string(i));
    commits.push_back(std::move(*c));
  }
  ML_RETURN_IF_ERROR(d.Finish());
  return commits;
}

}  // namespace meshlearn::protocol
