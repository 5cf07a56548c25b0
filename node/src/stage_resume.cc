#include "meshlearn/node/stage_resume.h"

#include <algorithm>
#include <string>
#include <utility>

#include "meshlearn/base/check.h"
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

// Stage `stage` (held steps 0..progress->commits.size()-1) back to step k's start: the state of
// its checkpoint of step k (its evidence's, published when it ran step k), which must hash to what
// its commit of step k claims it started from; its commits and losses of steps k.. dropped.
Status RollBackKeptStage(engine::Stage& stage, const StageEvidence* evidence,
                         const StageContext& ctx, uint64_t k, StageRunProgress* progress) {
  CHECK_LT(k, progress->commits.size());
  const StageStepRef ref{.task = ctx.task,
                         .round = ctx.round,
                         .replica = ctx.replica,
                         .stage = static_cast<uint32_t>(stage.index()),
                         .step = k};
  if (evidence == nullptr) {
    return FailedPrecondition("stage " + std::to_string(ref.stage) + " holds " +
                              std::to_string(progress->commits.size()) +
                              " steps and keeps no checkpoint of step " + std::to_string(k) +
                              " to roll back to; re-run from the round's start");
  }
  Result<engine::TrainState> loaded = evidence->PublishedCheckpointState(ref);
  if (!loaded.ok()) {
    return loaded.status().WithPrefix("rolling back from step " +
                                      std::to_string(progress->commits.size()));
  }
  engine::TrainState back = std::move(*loaded);
  const Hash256 want = progress->commits[k].state_before;
  if (back.step != static_cast<int64_t>(k) || engine::StateHash(back) != want) {
    return DataLoss("the checkpoint of " + ref.ToString() + " is at step " +
                    std::to_string(back.step) + " and not the state " + want.ShortHex() +
                    " its commit of the step started from; re-run from the round's start");
  }
  // The stage's state is replaced (the current one freed once the checkpoint's is in place).
  ML_RETURN_IF_ERROR(stage.Restore(std::move(back)));
  progress->commits.resize(k);
  progress->losses.resize(k);
  return Status::Ok();
}

}  // namespace

Result<KeptStageSteps> FetchKeptStageSteps(net::Transport* transport, const std::string& endpoint,
                                           const StageContext& ctx, uint32_t stage, uint32_t lost,
                                           uint64_t k, uint64_t max_tensor_bytes,
                                           uint64_t max_bytes) {
  KeptStageSteps out;
  uint64_t fetched = 0;
  for (uint64_t j = 0; j < k; ++j) {
    const StageStepRef ref{
        .task = ctx.task, .round = ctx.round, .replica = ctx.replica, .stage = stage, .step = j};
    Result<StageStepEvidence> ev =
        FetchStageStepSent(transport, endpoint, ref, lost, 30'000,
                           std::min(max_tensor_bytes, max_bytes - std::min(max_bytes, fetched)));
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
    for (const auto& [hash, bytes] : ev->blobs) fetched += bytes.size();
    if (fetched > max_bytes) {
      return ResourceExhausted(Resume(k) + "stage " + std::to_string(stage) + "'s node at " +
                               endpoint + " sent stage " + std::to_string(lost) + " " +
                               std::to_string(fetched) + " bytes by step " + std::to_string(j) +
                               ", over the " + std::to_string(max_bytes) +
                               " a resume fetches from one stage; re-run from the round's start");
    }
    out.sent.merge(ev->blobs);
    out.commits.push_back(std::move(ev->commit));
  }
  return out;
}

Result<RecomputedStage> RecomputeLostStage(
    engine::Stage& stage, const StageContext& ctx, uint32_t lost, const protocol::NodeId& earlier,
    const KeyPair& key, std::span<const engine::Batch> batches, uint64_t dropout_seed, uint64_t k,
    const std::map<uint32_t, KeptStageSteps>& kept, const StageRunHooks& hooks) {
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
  // The lost node's records the kept stages hold (what it sent them) are the lost stage's node's
  // of the chain before -- the node the ledger shows held the stage and let it expire, not one
  // the kept stages name -- and each is signed by it: a record another key signed is no record
  // of that run, whatever tensor it names.
  if (earlier == protocol::NodeId{}) {
    return PermissionDenied(Resume(k) + "the ledger shows no earlier node of stage " +
                            std::to_string(lost) + " whose records the kept stages hold");
  }
  for (const auto& [s, steps] : kept) {
    for (const StageStepCommit& c : steps.commits) {
      for (const StageTransfer& r : c.received) {
        if (r.key.from_stage != lost) continue;
        if (r.sender != earlier) {
          return PermissionDenied(Resume(k) + "kept stage " + std::to_string(s) + "'s record of " +
                                  r.key.ToString() + " is node " + r.sender.ShortHex() +
                                  "'s; the ledger's earlier node of stage " + std::to_string(lost) +
                                  " is " + earlier.ShortHex());
        }
        ML_RETURN_IF_ERROR(protocol::VerifyStageTransfer(r, r.sender)
                               .WithPrefix(Resume(k) + "kept stage " + std::to_string(s) +
                                           "'s record of the lost node"));
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

StageResumePoint StageResumePointOf(std::span<const uint64_t> held) {
  StageResumePoint none;
  uint32_t fresh = 0;
  uint64_t k = 0;
  for (uint32_t s = 0; s < held.size(); ++s) {
    if (held[s] == 0) {
      ++fresh;
      none.lost = s;
    } else if (k == 0 || held[s] < k) {
      k = held[s];  // the common step: a kept stage ahead of it rolls back there
    }
  }
  if (fresh != 1 || k == 0 || held.size() < 2) return {};
  return {.lost = none.lost, .k = k};
}

Result<uint64_t> StartStageRun(engine::Stage& stage, StagePlane& plane, const KeyPair& key,
                               net::Transport* transport, std::span<const std::string> endpoints,
                               std::span<const engine::Batch> batches, uint64_t dropout_seed,
                               const StageRunHooks& hooks, StageEvidence* evidence,
                               const StagePlaneOptions& options, bool ask,
                               const protocol::NodeId& earlier, StageRunProgress* progress) {
  const StageContext ctx = plane.context();
  const uint32_t me = static_cast<uint32_t>(stage.index());
  const uint32_t stages = ctx.stages();
  const uint64_t mine = progress->commits.size();
  CHECK_EQ(endpoints.size(), stages);
  // Fails the run: every stage that reads this node's decision re-runs from the round's start.
  auto fail = [&](const Status& why) -> Status {
    plane.DecideStart(0);
    return why;
  };
  if (!ask) {
    if (mine != 0) return fail(FailedPrecondition("holds " + std::to_string(mine) + " steps"));
    plane.DecideStart(0);
    return 0;
  }
  std::vector<uint64_t> held(stages, 0);
  held[me] = mine;
  for (uint32_t s = 0; s < stages && stages > 1; ++s) {
    if (s == me) continue;
    Result<StageResumeAnswer> a = plane.AskResume(s, options.step_deadline_ms, false);
    if (!a.ok()) {
      // An offer not read: no resume (a stage that holds steps cannot know that the others agree).
      if (mine == 0) {
        plane.DecideStart(0);
        return 0;
      }
      return fail(a.status().WithPrefix("the replica's offers: "));
    }
    held[s] = a->held;
  }
  const StageResumePoint at = StageResumePointOf(held);
  if (at.k == 0) {
    if (mine != 0) {
      std::string offers;
      for (uint64_t h : held) offers += (offers.empty() ? "" : ", ") + std::to_string(h);
      return fail(FailedPrecondition("the replica's stages hold " + offers +
                                     " steps: no resume; re-run from the round's start"));
    }
    plane.DecideStart(0);
    return 0;
  }
  if (at.lost == me) {
    // This node replaced stage `me`'s lost node: re-run its steps 0..k-1 from what the kept
    // stages sent it, each checked against its sender's record and its outputs against the lost
    // node's.
    std::map<uint32_t, KeptStageSteps> kept;
    for (uint32_t s = 0; s < stages; ++s) {
      if (s == me) continue;
      Result<KeptStageSteps> got = FetchKeptStageSteps(
          transport, endpoints[s], ctx, s, me, at.k, options.max_tensor_bytes, options.inbox_bytes);
      if (!got.ok()) return fail(got.status());
      kept[s] = std::move(*got);
    }
    progress->start = StageFlatParams(stage);
    Result<RecomputedStage> redone =
        RecomputeLostStage(stage, ctx, me, earlier, key, batches, dropout_seed, at.k, kept, hooks);
    if (!redone.ok()) return fail(redone.status());
    progress->commits = std::move(redone->commits);
    progress->losses = std::move(redone->losses);
    plane.DecideStart(at.k);
    return at.k;
  }
  // A kept stage: the lost stage's new node decides once it has re-run steps 0..k-1 alone.
  Result<StageResumeAnswer> decided = plane.AskResume(
      at.lost, options.step_deadline_ms * static_cast<int64_t>(at.k + 1), /*decided=*/true);
  if (!decided.ok()) return fail(decided.status().WithPrefix(Resume(at.k)));
  if (decided->start != at.k) {
    return fail(FailedPrecondition(
        Resume(at.k) + "stage " + std::to_string(at.lost) + "'s new node runs from step " +
        std::to_string(decided->start.value_or(0)) + "; re-run from the round's start"));
  }
  if (mine > at.k) {
    // This stage finished steps the lost node took part in that another kept stage did not (the
    // lost node sent it all of step k's tensors, not the other): back to step k's start, from its
    // own checkpoint of it, its steps k.. dropped.
    Status back = RollBackKeptStage(stage, evidence, ctx, at.k, progress);
    if (!back.ok()) return fail(back.WithPrefix(Resume(at.k)));
  }
  std::vector<StageStepCommit> theirs;
  for (uint64_t j = 0; j < at.k; ++j) {
    Result<StageStepCommit> c = FetchStageStepCommit(transport, endpoints[at.lost],
                                                     {.task = ctx.task,
                                                      .round = ctx.round,
                                                      .replica = ctx.replica,
                                                      .stage = at.lost,
                                                      .step = j});
    if (!c.ok()) return fail(c.status().WithPrefix(Resume(at.k) + "the new node's commits: "));
    theirs.push_back(std::move(*c));
  }
  Status swapped = SwapLostStageRecords(progress->commits, at.lost, theirs, ctx);
  if (!swapped.ok()) return fail(swapped.WithPrefix(Resume(at.k)));
  for (const StageStepCommit& c : progress->commits) {
    Status served = evidence->ServeCommit(c);
    if (!served.ok()) return fail(served.WithPrefix(Resume(at.k)));
  }
  plane.DecideStart(at.k);
  return at.k;
}

}  // namespace meshlearn::node
