#include "meshlearn/ledger/stage_replay.h"

#include <memory>
#include <string>
#include <utility>

#include "meshlearn/base/env.h"
#include "meshlearn/ledger/stage_step.h"

namespace meshlearn::ledger {

using protocol::StageStepCommit;
using protocol::StageTensorKey;
using protocol::StageTransfer;

Hash256 StageFindingLeaf(const Hash256& committed_leaf, const StageReplayResult& r) {
  if (r.ok()) return committed_leaf;
  return Hasher("meshlearn.pipeline.stage_finding.v1")
      .Update(committed_leaf)
      .UpdateU64(static_cast<uint64_t>(r.fault))
      .UpdateU64(static_cast<uint64_t>(r.micro_batch))
      .UpdateU64(static_cast<uint64_t>(r.key.kind))
      .UpdateU64(r.key.from_stage)
      .UpdateU64(r.key.to_stage)
      .Update(r.claimed)
      .Update(r.replayed)
      .Finish();
}

Hash256 StageUnservedLeaf(const Hash256& committed_leaf) {
  StageReplayResult r;
  r.fault = StageFault::kStageFaultUnserved;
  return StageFindingLeaf(committed_leaf, r);
}

Hash256 StageContinuityLeaf(const Hash256& committed_leaf) {
  StageReplayResult r;
  r.fault = StageFault::kStageFaultContinuity;
  return StageFindingLeaf(committed_leaf, r);
}

const char* StageFaultName(StageFault fault) {
  switch (fault) {
    case StageFault::kStageFaultNone:
      return "none";
    case StageFault::kStageFaultRecord:
      return "record";
    case StageFault::kStageFaultStart:
      return "start";
    case StageFault::kStageFaultMissing:
      return "missing";
    case StageFault::kStageFaultUnserved:
      return "unserved";
    case StageFault::kStageFaultInput:
      return "input";
    case StageFault::kStageFaultOutput:
      return "output";
    case StageFault::kStageFaultState:
      return "state";
    case StageFault::kStageFaultContinuity:
      return "continuity";
  }
  return "unknown";
}

namespace {

// Sets `r` to a finding about `c`'s step (and `key`'s micro-batch when given).
void StageReplayFind(StageReplayResult* r, const StageStepCommit& c, StageFault fault,
                     const StageTensorKey* key, const std::string& why) {
  r->fault = fault;
  r->replica = c.replica;
  r->stage = c.stage;
  r->step = c.step;
  if (key != nullptr) {
    r->key = *key;
    r->micro_batch = key->micro_batch;
  }
  r->message = "replica " + std::to_string(c.replica) + ", stage " + std::to_string(c.stage) +
               ", step " + std::to_string(c.step) +
               (r->micro_batch >= 0 ? ", micro-batch " + std::to_string(r->micro_batch) : "") +
               ": " + StageFaultName(fault) + ": " + why;
}

// Feeds the committed inputs and checks every output against the committed record.
class StageReplayLink final : public StageLink {
 public:
  // `through_outputs`: a sent tensor that differs from its record is the finding (the first one
  // kept), and the step goes on with the committed record, so that a traced replay records the
  // whole step (a dispute's party answers every operator from it).
  StageReplayLink(const StageStepCommit& commit, const std::map<Hash256, Bytes>& blobs,
                  StageReplayResult* result, bool through_outputs)
      : commit_(commit), blobs_(blobs), result_(result), through_outputs_(through_outputs) {}

  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    const StageTransfer* t = Find(commit_.received, key);
    if (t == nullptr) {
      return Fault(
          StageFault::kStageFaultMissing, key,
          "the commit lists no received record of " + key.ToString() + ", which the step needs");
    }
    auto blob = blobs_.find(t->tensor);
    if (blob == blobs_.end()) {
      return Fault(StageFault::kStageFaultUnserved, key,
                   "the received tensor " + t->tensor.ShortHex() + " (" + key.ToString() +
                       ") was not served");
    }
    if (blob->second.size() % 4 != 0) {
      return Fault(StageFault::kStageFaultInput, key,
                   "the received tensor of " + key.ToString() + " has " +
                       std::to_string(blob->second.size()) + " bytes, not whole float32s");
    }
    std::vector<float> values = StageTensorFromBytes(blob->second);
    Status st = CheckStageTensorValues(*t, values);
    if (!st.ok()) {
      result_->claimed = t->tensor;
      result_->replayed = engine::TensorHash(values);
      return Fault(
          StageFault::kStageFaultInput, key,
          "the tensor the stage used does not match the sender's signed record: " + st.message());
    }
    ++used_;
    *record = *t;
    return values;
  }

  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    const StageTransfer* t = Find(commit_.sent, key);
    if (t == nullptr) {
      return Fault(
          StageFault::kStageFaultMissing, key,
          "the commit lists no sent record of " + key.ToString() + ", which the step makes");
    }
    // Its hash, size and tiled root (a receiver's tile dispute proves its input tiles against it);
    // the values are hashed again only to name what the replay computed.
    if (!CheckStageTensorValues(*t, values).ok()) {
      if (through_outputs_ && !result_->ok()) return *t;  // a finding is kept already
      const Hash256 replayed = engine::TensorHash(values);
      result_->claimed = t->tensor;
      result_->replayed = replayed;
      if (through_outputs_) {
        StageReplayFind(result_, commit_, StageFault::kStageFaultOutput, &key,
                        "the stage sent " + t->tensor.ShortHex() + " as " + key.ToString() +
                            ", the replay computes " + replayed.ShortHex());
        ++used_;
        return *t;
      }
      return Fault(StageFault::kStageFaultOutput, key,
                   "the stage sent " + t->tensor.ShortHex() + " (" + std::to_string(t->bytes) +
                       " bytes) as " + key.ToString() + ", the replay computes " +
                       replayed.ShortHex() + " (" + std::to_string(4 * values.size()) + " bytes)");
    }
    ++used_;
    return *t;
  }

  size_t used() const { return used_; }

 private:
  static const StageTransfer* Find(const std::vector<StageTransfer>& list,
                                   const StageTensorKey& key) {
    for (const StageTransfer& t : list) {
      if (t.key == key) return &t;
    }
    return nullptr;
  }
  Status Fault(StageFault fault, const StageTensorKey& key, const std::string& why) {
    StageReplayFind(result_, commit_, fault, &key, why);
    return FailedPrecondition("replay stopped: " + result_->message);
  }

  const StageStepCommit& commit_;
  const std::map<Hash256, Bytes>& blobs_;
  StageReplayResult* result_;
  bool through_outputs_ = false;
  size_t used_ = 0;
};

}  // namespace

Result<StageReplayResult> ReplayStageStep(const StageReplaySetup& setup, engine::TrainState start,
                                          const StageStepCommit& commit,
                                          const std::map<Hash256, Bytes>& blobs,
                                          const engine::Batch& batch, uint64_t dropout_seed,
                                          engine::TrainState* after, engine::OpTrace* trace) {
  StageReplayResult r;
  r.replica = commit.replica;
  r.stage = commit.stage;
  r.step = commit.step;
  if (setup.chain.size() != static_cast<size_t>(setup.cut.stages()) ||
      commit.stages != setup.chain.size()) {
    return InvalidArgument("stage replay: the chain names " + std::to_string(setup.chain.size()) +
                           " nodes, the cut has " + std::to_string(setup.cut.stages()) +
                           " stages and the commit " + std::to_string(commit.stages));
  }
  // The records: shape, structure, signatures.
  Status st = protocol::ValidateStageStepCommit(commit);
  if (!st.ok()) {
    StageReplayFind(&r, commit, StageFault::kStageFaultRecord, nullptr, st.message());
    return r;
  }
  for (const std::vector<StageTransfer>* list : {&commit.received, &commit.sent}) {
    for (const StageTransfer& t : *list) {
      st = protocol::VerifyStageTransfer(t, setup.chain[t.key.from_stage]);
      if (!st.ok()) {
        StageReplayFind(&r, commit, StageFault::kStageFaultRecord, &t.key, st.message());
        return r;
      }
    }
  }
  // The stage at the step's start.
  // Built around `start` itself (Restore's checks): the stage's tensors are never held twice.
  Result<std::unique_ptr<engine::Stage>> created =
      engine::Stage::Create(setup.model, setup.optimizer, setup.cut, static_cast<int>(commit.stage),
                            setup.micro_batches, std::move(start));
  if (!created.ok()) return created.status().WithPrefix("stage replay: the checkpoint");
  std::unique_ptr<engine::Stage> stage = std::move(*created);
  const Hash256 before = engine::StateHash(stage->state());
  if (before != commit.state_before || static_cast<uint64_t>(stage->state().step) != commit.step) {
    r.claimed = commit.state_before;
    r.replayed = before;
    StageReplayFind(&r, commit, StageFault::kStageFaultStart, nullptr,
                    "the checkpoint (step " + std::to_string(stage->state().step) + ") hashes to " +
                        before.ShortHex() + ", the commit starts from " +
                        commit.state_before.ShortHex());
    return r;
  }
  StageContext ctx{commit.task,
                   commit.round,
                   commit.replica,
                   setup.chain,
                   StageTileCols(setup.model),
                   StageTileRows(setup.model, batch.size, setup.micro_batches)};
  StageReplayLink link(commit, blobs, &r, trace != nullptr);
  stage->set_op_trace(trace);
  Result<StageStepOutcome> out = RunStageStep(*stage, ctx, batch, dropout_seed, link);
  stage->set_op_trace(nullptr);
  if (!r.ok()) return r;  // the link's finding
  if (!out.ok()) {
    // The stage refused what it was sent (a signed tensor of the wrong size): the commit shows a
    // step that cannot have run.
    StageReplayFind(&r, commit, StageFault::kStageFaultInput, nullptr, out.status().message());
    return r;
  }
  if (link.used() != commit.received.size() + commit.sent.size()) {
    StageReplayFind(&r, commit, StageFault::kStageFaultMissing, nullptr,
                    "the commit lists " +
                        std::to_string(commit.received.size() + commit.sent.size()) +
                        " records, the step makes " + std::to_string(link.used()));
    return r;
  }
  if (out->commit.state_after != commit.state_after) {
    r.claimed = commit.state_after;
    r.replayed = out->commit.state_after;
    StageReplayFind(&r, commit, StageFault::kStageFaultState, nullptr,
                    "the state after the step is " + commit.state_after.ShortHex() +
                        " in the commit, " + out->commit.state_after.ShortHex() + " in the replay");
    return r;
  }
  if (protocol::StageStepLeaf(out->commit) != protocol::StageStepLeaf(commit)) {
    StageReplayFind(&r, commit, StageFault::kStageFaultRecord, nullptr,
                    "the records are not listed in the schedule's order");
    return r;
  }
  if (after != nullptr) *after = std::move(stage->state());
  return r;
}

Result<engine::TrainState> StageCheckpointState(ByteSpan checkpoint) {
  return engine::ReadCheckpoint(
      std::string_view(reinterpret_cast<const char*>(checkpoint.data()), checkpoint.size()),
      "stage.safetensors");
}

Result<Bytes> StageCheckpointBytes(engine::TrainState& state) {
  return ToBytes(engine::CheckpointBytes(state));
}

}  // namespace meshlearn::ledger
