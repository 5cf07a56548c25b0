#include "meshlearn/node/stage_resume.h"

#include <string>
#include <utility>

#include "meshlearn/node/stage_evidence.h"

namespace meshlearn::node {

namespace {

using protocol::StageStepCommit;
using protocol::StageTensorKey;
using protocol::StageTransfer;

const StageTransfer* FindRecord(const std::vector<StageTransfer>& records,
                                const StageTensorKey& key) {
  for (const StageTransfer& r : records) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

// Whether two records name the same tensor: its hash, size and tiled root.
bool SameTensor(const StageTransfer& a, const StageTransfer& b) {
  return a.tensor == b.tensor && a.bytes == b.bytes && a.tile_cols == b.tile_cols &&
         a.tiles == b.tiles;
}

std::string Resume(uint64_t k) { return "resume at step " + std::to_string(k) + ": "; }

// The lost stage's link while it re-runs steps 0..k-1: what it receives is what the kept stages
// sent (their records and tensors), what it sends is checked against what the lost node sent
// them and signed by the new node. Keeps the step's received tensors for the step's evidence.
class ResumeLink final : public StageLink {
 public:
  ResumeLink(const StageContext& ctx, uint64_t k, const KeyPair& key,
             const std::map<uint32_t, KeptStageSteps>& kept)
      : ctx_(ctx), k_(k), key_(key), kept_(kept) {}

  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    const KeptStageSteps& from = kept_.at(key.from_stage);
    const StageTransfer* r = FindRecord(from.commits.at(key.step).sent, key);
    if (r == nullptr) {
      return FailedPrecondition(Resume(k_) + "stage " + std::to_string(key.from_stage) +
                                "'s commit of step " + std::to_string(key.step) +
                                " holds no record of " + key.ToString());
    }
    auto t = from.sent.find(r->tensor);
    if (t == from.sent.end()) {
      return FailedPrecondition(Resume(k_) + "stage " + std::to_string(key.from_stage) +
                                "'s node no longer holds the tensor " + r->tensor.ShortHex() +
                                " of " + key.ToString() + "; re-run from the round's start");
    }
    if (t->second.size() % 4 != 0) {
      return DataLoss(Resume(k_) + "stage " + std::to_string(key.from_stage) + "'s tensor of " +
                      key.ToString() + " is " + std::to_string(t->second.size()) +
                      " bytes, not whole floats");
    }
    std::vector<float> values = StageTensorFromBytes(t->second);
    ML_RETURN_IF_ERROR(CheckStageTensor(*r, values, ctx_).WithPrefix(Resume(k_)));
    received_[r->tensor] = t->second;
    *record = *r;
    return values;
  }

  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    auto to = kept_.find(key.to_stage);
    if (to == kept_.end()) {
      return InvalidArgument(Resume(k_) + "no kept stage " + std::to_string(key.to_stage) +
                             " for " + key.ToString());
    }
    const StageTransfer* lost = FindRecord(to->second.commits.at(key.step).received, key);
    if (lost == nullptr) {
      return FailedPrecondition(Resume(k_) + "stage " + std::to_string(key.to_stage) +
                                "'s commit of step " + std::to_string(key.step) +
                                " holds no record of " + key.ToString() + " from the lost node");
    }
    StageTransfer mine = SignStageTensor(key, values, key_, ctx_.TileColsOf(values.size()));
    if (!SameTensor(mine, *lost)) {
      return DataLoss(Resume(k_) + "the recomputed " + key.ToString() + " is tensor " +
                      mine.tensor.ShortHex() + " (" + std::to_string(mine.bytes) +
                      " bytes); the lost node sent " + lost->tensor.ShortHex() + " (" +
                      std::to_string(lost->bytes) + " bytes); re-run from the round's start");
    }
    return mine;
  }

  // The tensors received since the last call, by hash.
  std::map<Hash256, Bytes> TakeReceived() { return std::exchange(received_, {}); }

 private:
  const StageContext& ctx_;
  const uint64_t k_;
  const KeyPair& key_;
  const std::map<uint32_t, KeptStageSteps>& kept_;
  std::map<Hash256, Bytes> received_;
};

}  // namespace

Result<KeptStageSteps> FetchKeptStageSteps(net::Transport* transport, const std::string& endpoint,
                                           const StageContext& ctx, uint32_t stage, uint32_t lost,
                                           uint64_t k) {
  KeptStageSteps out;
  for (uint64_t j = 0; j < k; ++j) {
    const StageStepRef ref{
        .task = ctx.task, .round = ctx.round, .replica = ctx.replica, .stage = stage, .step = j};
    Result<StageStepEvidence> ev = FetchStageStepSent(transport, endpoint, ref, lost);
    if (ev.status().code() == StatusCode::kNotFound) {
      return FailedPrecondition(Resume(k) + "stage " + std::to_string(stage) + "'s node at " +
                                endpoint + " serves no commit of " + ref.ToString() +
                                "; re-run from the round's start");
    }
    if (!ev.ok()) return ev.status().WithPrefix(Resume(k) + "fetching " + ref.ToString());
    for (const StageTransfer& t : ev->commit.sent) {
      if (t.key.to_stage == lost && ev->blobs.count(t.tensor) == 0) {
        return FailedPrecondition(Resume(k) + "stage " + std::to_string(stage) + "'s node at " +
                                  endpoint + " no longer holds the tensor of " + t.key.ToString() +
                                  "; re-run from the round's start");
      }
    }
    out.sent.merge(ev->blobs);
    out.commits.push_back(std::move(ev->commit));
  }
  return out;
}

Result<RecomputedStage> RecomputeLostStage(engine::Stage& stage, const StageContext& ctx,
                                           uint32_t lost, const KeyPair& key,
                                           std::span<const engine::Batch> batches,
                                           uint64_t dropout_seed, uint64_t k,
                                           const std::map<uint32_t, KeptStageSteps>& kept,
                                           const StageRunHooks& hooks) {
  const uint32_t stages = ctx.stages();
  if (lost >= stages || static_cast<uint32_t>(stage.index()) != lost) {
    return InvalidArgument(Resume(k) + "stage " + std::to_string(stage.index()) +
                           " is not the lost stage " + std::to_string(lost) + " of a chain of " +
                           std::to_string(stages));
  }
  if (ctx.chain[lost] != key.public_key()) {
    return InvalidArgument(Resume(k) + "the new chain places " + ctx.chain[lost].ShortHex() +
                           " on stage " + std::to_string(lost) + ", not this node's key");
  }
  if (stage.state().step != 0) {
    return InvalidArgument(Resume(k) + "the stage to re-run is at step " +
                           std::to_string(stage.state().step) + ", not the round's start");
  }
  if (k > batches.size()) {
    return InvalidArgument(Resume(k) + "past the unit's " + std::to_string(batches.size()) +
                           " steps");
  }
  for (uint32_t s = 0; s < stages; ++s) {
    if (s == lost) continue;
    auto it = kept.find(s);
    if (it == kept.end() || it->second.commits.size() != k) {
      return InvalidArgument(Resume(k) + "kept stage " + std::to_string(s) + " gives " +
                             (it == kept.end()
                                  ? std::string("nothing")
                                  : std::to_string(it->second.commits.size()) + " step commits") +
                             ", not steps 0.." + std::to_string(k) + "-1");
    }
    for (uint64_t j = 0; j < k; ++j) {
      const StageStepCommit& c = it->second.commits[j];
      if (c.step != j || c.stage != s || c.stages != stages || c.task != ctx.task ||
          c.round != ctx.round || c.replica != ctx.replica) {
        return InvalidArgument(Resume(k) + "kept stage " + std::to_string(s) + "'s commit " +
                               std::to_string(j) + " is not its step " + std::to_string(j) +
                               " of this replica");
      }
    }
  }
  ResumeLink link(ctx, k, key, kept);
  RecomputedStage out;
  for (uint64_t j = 0; j < k; ++j) {
    if (hooks.checkpoint) ML_RETURN_IF_ERROR(hooks.checkpoint(j, stage.state()));
    ML_ASSIGN_OR_RETURN(StageStepOutcome step,
                        RunStageStep(stage, ctx, batches[j], dropout_seed, link));
    std::map<Hash256, Bytes> received = link.TakeReceived();
    if (hooks.publish) ML_RETURN_IF_ERROR(hooks.publish(step.commit, std::move(received)));
    out.losses.push_back(step.loss);
    out.commits.push_back(std::move(step.commit));
  }
  return out;
}

Status SwapLostStageRecords(std::vector<StageStepCommit>& commits, uint32_t lost,
                            std::span<const StageStepCommit> recomputed, const StageContext& ctx) {
  if (lost >= ctx.stages()) {
    return InvalidArgument("swap of stage " + std::to_string(lost) + "'s records: not a stage of " +
                           "a chain of " + std::to_string(ctx.stages()));
  }
  std::vector<StageStepCommit> swapped = commits;
  for (StageStepCommit& c : swapped) {
    const StageStepCommit* redone = nullptr;
    for (const StageStepCommit& r : recomputed) {
      if (r.step == c.step) redone = &r;
    }
    for (StageTransfer& old : c.received) {
      if (old.key.from_stage != lost) continue;
      const StageTransfer* mine = redone == nullptr ? nullptr : FindRecord(redone->sent, old.key);
      if (mine == nullptr) {
        return FailedPrecondition("swap of stage " + std::to_string(lost) +
                                  "'s records: the new node's commits hold no record of " +
                                  old.key.ToString());
      }
      if (!SameTensor(*mine, old)) {
        return DataLoss("swap of stage " + std::to_string(lost) + "'s records: the new node's " +
                        old.key.ToString() + " is tensor " + mine->tensor.ShortHex() +
                        ", the lost node's " + old.tensor.ShortHex());
      }
      ML_RETURN_IF_ERROR(protocol::VerifyStageTransfer(*mine, ctx.chain[lost])
                             .WithPrefix("swap of stage " + std::to_string(lost) + "'s records"));
      old = *mine;
    }
  }
  commits = std::move(swapped);
  return Status::Ok();
}

}  // namespace meshlearn::node
