#include "segment_checker.h"

#include <algorithm>
#include <map>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/node/referee.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

journal::Finding SegmentFinding::Record() const {
  journal::Finding r;
  r.leaves = leaves;
  r.mismatch = mismatch;
  r.result_wrong = result == ResultCheck::kWrong;
  if (mismatch) {
    r.segment = segment;
    r.replayed_end = replayed_end;
    r.checkpoint = checkpoint;
  }
  return r;
}

namespace {

// One check of one unit: its inputs, fetched once, and what it found so far.
class SegmentChecker {
 public:
  SegmentChecker(NodeContext& node, const CheckAssignment& c, const std::string& dir)
      : node_(node), c_(c), dir_(dir) {}

  // The task, the round's start state, the unit's work and the solver's manifest; the leaves
  // checked against the commitment.
  Status Setup();
  Result<SegmentFinding> Run(const std::vector<uint32_t>& segments);

 private:
  std::string CheckpointPath(int64_t step) const {
    return JoinPath(dir_, "ckpt-" + std::to_string(step) + ".safetensors");
  }
  // The solver's checkpoint at `step`: fetched from its unit service and written to the check's
  // directory (a dispute replays from it later); FetchCheckpoint loads it too.
  Result<std::string> FetchCheckpointFile(int64_t step);
  Result<engine::TrainState> FetchCheckpoint(int64_t step);
  // Replays segment j from the solver's checkpoint at its start (which must hash to leaf j) and
  // returns the state hash it ends on.
  Result<Hash256> ReplayFromCheckpoint(uint32_t j);
  // Segment j in exact mode / tolerance mode: true when it is a mismatch (recorded in f_).
  Result<bool> ExactSegment(uint32_t j);
  Result<bool> ToleranceSegment(uint32_t j);
  // The solver's end state of segment j as parameters, comparable with `ours` (which it may
  // rewrite, at H, to the same form); nullopt when the solver does not show it.
  Result<std::optional<std::vector<float>>> SolverEnd(uint32_t j, std::vector<float>* ours);
  void Mismatch(uint32_t seg, const Hash256& replayed, std::string checkpoint);
  // Result binding, after every segment replayed clean.
  Status CheckResult();

  NodeContext& node_;
  const CheckAssignment& c_;
  const std::string& dir_;
  TaskContext* ctx_ = nullptr;
  engine::Trainer* trainer_ = nullptr;
  GlobalState start_;
  UnitWork work_;
  std::vector<int64_t> steps_;
  UnitManifest manifest_;
  protocol::ToleranceParams tolerance_;
  SegmentFinding f_;
};

Status SegmentChecker::Setup() {
  ML_ASSIGN_OR_RETURN(ctx_, node_.GetTask(c_.task_id));
  ML_ASSIGN_OR_RETURN(trainer_, ctx_->Trainer());
  ML_ASSIGN_OR_RETURN(start_, node_.StartState(*ctx_, c_.task_id, c_.start_state));
  work_ = protocol::UnitWorkOf(ctx_->bundle.net, ctx_->facts, c_.round, c_.shard);
  steps_ = HashedSteps(work_.inner_steps, work_.checkpoint_interval);
  if (steps_.size() != c_.num_segments + 1ull) {
    return FailedPrecondition(CheckName(c_) + ": the ledger counts " +
                              std::to_string(c_.num_segments) + " segments, the task bundle " +
                              std::to_string(steps_.size() - 1));
  }
  // The leaves are what a claim proves against the commitment. They are on chain with the
  // commit, so a solver that serves nothing cannot hide them; its checkpoints come from its unit
  // service (without them the segments are replayed from the unit's start).
  std::vector<Hash256> leaves = c_.leaves;
  Result<UnitManifest> served =
      FetchUnitManifest(node_.deps().transport, c_.solver_endpoint, c_.task_id, c_.index);
  if (served.ok()) {
    manifest_ = std::move(*served);
  } else {
    node_.Log(CheckName(c_) + ": the solver serves no manifest (" + served.status().message() +
              "); replaying from the unit's start");
  }
  if (leaves.empty()) leaves = manifest_.leaves;  // a ledger that does not carry them
  if (leaves.size() != steps_.size() || MerkleRoot(leaves) != c_.commitment) {
    return FailedPrecondition(CheckName(c_) + ": the committed leaves do not hash to the commitment " +
                              c_.commitment.ShortHex());
  }
  f_.leaves = std::move(leaves);
  // Tolerance mode (a task for hardware without bitwise reproducibility): a segment is clean
  // when the replay's end state is within the task's tolerance of the solver's committed one.
  tolerance_.max_rel_l2_ppm = ctx_->info.params.tolerance_rel_l2_ppm;
  tolerance_.max_cosine_gap_ppb = ctx_->info.params.tolerance_cosine_gap_ppb;
  return Status::Ok();
}

Result<std::string> SegmentChecker::FetchCheckpointFile(int64_t step) {
  ML_ASSIGN_OR_RETURN(Bytes ckpt, FetchUnitCheckpoint(node_.deps().transport, c_.solver_endpoint,
                                                      manifest_, step));
  const std::string path = CheckpointPath(step);
  ML_RETURN_IF_ERROR(node_.env()->WriteFileAtomic(path, AsStringView(ckpt)));
  return path;
}

Result<engine::TrainState> SegmentChecker::FetchCheckpoint(int64_t step) {
  ML_ASSIGN_OR_RETURN(std::string path, FetchCheckpointFile(step));
  return engine::LoadCheckpoint(node_.env(), path);
}

Result<Hash256> SegmentChecker::ReplayFromCheckpoint(uint32_t j) {
  ML_ASSIGN_OR_RETURN(engine::TrainState st, FetchCheckpoint(steps_[j]));
  ML_ASSIGN_OR_RETURN(SegmentReplay r,
                      ReplaySegment(trainer_, start_.weights, work_, j, &st, &f_.leaves[j]));
  return r.end_hash;
}

void SegmentChecker::Mismatch(uint32_t seg, const Hash256& replayed, std::string checkpoint) {
  f_.mismatch = true;
  f_.segment = seg;
  f_.start = f_.leaves[seg];
  f_.solver_end = f_.leaves[seg + 1];
  f_.replayed_end = replayed;
  f_.checkpoint = std::move(checkpoint);
}

Result<bool> SegmentChecker::ExactSegment(uint32_t j) {
  if (j > 0) {
    // From the solver's checkpoint at the segment's start, which must hash to its leaf.
    Result<Hash256> end = ReplayFromCheckpoint(j);
    if (end.ok()) {
      if (*end == f_.leaves[j + 1]) return false;
      Mismatch(j, *end, CheckpointPath(steps_[j]));
      return true;
    }
    node_.Log(CheckName(c_) + ": segment " + std::to_string(j) +
              ": the solver's checkpoint is not usable (" + end.status().message() +
              "); replaying from the unit's start");
  }
  // From the unit's start (always available): every committed leaf up to the segment's end.
  std::vector<int64_t> upto(steps_.begin(), steps_.begin() + j + 2);
  ML_ASSIGN_OR_RETURN(std::vector<Hash256> hashes,
                      ReplayToSteps(trainer_, start_.weights, work_, 0, nullptr, upto));
  for (size_t i = 1; i < hashes.size(); ++i) {
    if (hashes[i] != f_.leaves[i]) {
      Mismatch(static_cast<uint32_t>(i - 1), hashes[i], "");
      return true;
    }
  }
  return false;
}

Result<std::optional<std::vector<float>>> SegmentChecker::SolverEnd(uint32_t j,
                                                                    std::vector<float>* ours) {
  std::optional<std::vector<float>> theirs;
  if (steps_[j + 1] < work_.inner_steps) {
    // A state the solver does not show is a mismatch; one that cannot be fetched now is an
    // error (retried), never a claim.
    Result<std::string> path = FetchCheckpointFile(steps_[j + 1]);
    if (!path.ok() && path.status().code() != StatusCode::kNotFound) return path.status();
    if (!path.ok()) return theirs;
    Result<engine::TrainState> st = engine::LoadCheckpoint(node_.env(), *path);
    if (st.ok() && engine::StateHash(*st) == f_.leaves[j + 1]) theirs = StateParams(*st);
    return theirs;
  }
  // At H: the committed delta, compared as the referee does (referee.h).
  ML_ASSIGN_OR_RETURN(Bytes blob, node_.FetchBlob(c_.result_hash, {c_.solver_endpoint}, ""));
  Result<std::vector<float>> delta = DecodeDelta(blob, ctx_->facts.num_params);
  if (delta.ok()) {
    theirs = EndParamsOfDelta(start_.weights, *delta);
    *ours = EndParamsOfDelta(start_.weights, protocol::PseudoGradient(start_.weights, *ours));
  }
  return theirs;
}

Result<bool> SegmentChecker::ToleranceSegment(uint32_t j) {
  // The replay starts from the solver's checkpoint (it hashes to its own leaf on any hardware)
  // or from the unit's start.
  std::string path;
  Hash256 end;
  bool replayed = false;
  if (j > 0) {
    Result<Hash256> from_checkpoint = ReplayFromCheckpoint(j);
    replayed = from_checkpoint.ok();
    if (replayed) {
      end = *from_checkpoint;
      path = CheckpointPath(steps_[j]);
    } else {
      node_.Log(CheckName(c_) + ": segment " + std::to_string(j) +
                ": the solver's checkpoint is not usable (" +
                from_checkpoint.status().message() + "); replaying from the unit's start");
    }
  }
  if (!replayed) {
    const int64_t to[] = {steps_[j + 1]};
    ML_ASSIGN_OR_RETURN(std::vector<Hash256> h,
                        ReplayToSteps(trainer_, start_.weights, work_, 0, nullptr, to));
    end = h[0];
  }
  if (end == f_.leaves[j + 1]) return false;  // bit-equal
  std::vector<float> ours = trainer_->FlatParams();
  ML_ASSIGN_OR_RETURN(std::optional<std::vector<float>> theirs, SolverEnd(j, &ours));
  if (theirs && theirs->size() == ours.size() &&
      protocol::WithinTolerance(protocol::Distance(*theirs, ours), tolerance_)) {
    return false;
  }
  Mismatch(j, end, path);
  return true;
}

Status SegmentChecker::CheckResult() {
  // Result binding (docs/verification.md "Result binding"): the committed result must be the
  // delta of the state the last leaf commits to. That state is this replay's own when it ended
  // at H, else the solver's checkpoint at H, else a replay of the last segment (from the
  // solver's checkpoint at its start, or from the unit's start). One that does not hash to the
  // last leaf says nothing (a forced error's last leaf is a ForcedLeaf; a wrong checkpoint is
  // the segment checks' business).
  const Hash256& last_leaf = f_.leaves.back();
  std::optional<engine::TrainState> shown;
  engine::TrainState* final_state = nullptr;
  if (trainer_->state().model && trainer_->state().step == work_.inner_steps &&
      engine::StateHash(trainer_->state()) == last_leaf) {
    final_state = &trainer_->state();
  } else if (Result<engine::TrainState> st = FetchCheckpoint(work_.inner_steps);
             st.ok() && engine::StateHash(*st) == last_leaf) {
    shown = std::move(*st);
    final_state = &*shown;
  } else {
    const uint32_t j = c_.num_segments - 1;
    std::optional<engine::TrainState> from;
    if (j > 0) {
      Result<engine::TrainState> at = FetchCheckpoint(steps_[j]);
      if (at.ok() && engine::StateHash(*at) == f_.leaves[j]) from = std::move(*at);
    }
    const int64_t to[] = {work_.inner_steps};
    Status replayed = ReplayToSteps(trainer_, start_.weights, work_, from ? steps_[j] : 0,
                                    from ? &*from : nullptr, to)
                          .status();
    if (replayed.ok() && engine::StateHash(trainer_->state()) == last_leaf) {
      final_state = &trainer_->state();
    }
  }
  if (final_state == nullptr) {
    node_.Log(CheckName(c_) + ": result check skipped: no state hashing to the last committed leaf " +
              last_leaf.ShortHex() + " could be had");
    return Status::Ok();
  }
  f_.result = CheckUnitResult(start_.weights, *final_state, last_leaf, c_.result_hash);
  ++node_.stats().results_checked;
  if (f_.result == ResultCheck::kWrong) {
    ML_RETURN_IF_ERROR(
        engine::SaveCheckpoint(node_.env(), JoinPath(dir_, "final.safetensors"), *final_state));
  }
  return Status::Ok();
}

Result<SegmentFinding> SegmentChecker::Run(const std::vector<uint32_t>& segments) {
  std::vector<uint32_t> sorted = segments;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t j : sorted) {
    if (j >= c_.num_segments) continue;
    ML_ASSIGN_OR_RETURN(bool bad, tolerance_.exact() ? ExactSegment(j) : ToleranceSegment(j));
    if (bad) break;
  }
  // After a segment mismatch the dispute decides the unit: no result check (and no
  // multi-megabyte proof) is needed.
  if (!f_.mismatch) ML_RETURN_IF_ERROR(CheckResult());
  return f_;
}

}  // namespace

Result<SegmentFinding> CheckSegments(NodeContext& node, const CheckAssignment& c,
                                     const std::vector<uint32_t>& segments,
                                     const std::string& dir) {
  SegmentChecker checker(node, c, dir);
  ML_RETURN_IF_ERROR(checker.Setup());
  return checker.Run(segments);
}

Result<SegmentFinding> CheckStageSteps(NodeContext& node, const CheckAssignment& c,
                                       const std::vector<uint32_t>& steps) {
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node.GetTask(c.task_id));
  const NetworkSpec& net = ctx->bundle.net;
  const uint32_t stages = net.stages;
  if (stages < 2) return InvalidArgument(CheckName(c) + ": not a stage unit");
  SegmentFinding f;
  const std::vector<Hash256> step_leaves(c.leaves.begin() + (c.leaves.empty() ? 0 : 1),
                                         c.leaves.end());
  if (c.leaves.size() < 2 || c.leaves.front() != c.commitment ||
      protocol::StageCommitment(step_leaves) != c.commitment) {
    return FailedPrecondition(CheckName(c) + ": the committed step leaves do not hash to the "
                              "stage's commitment " + c.commitment.ShortHex());
  }
  f.leaves = c.leaves;
  // The chain that ran the checked run: the replica's units placed with the check's beacon
  // (ledger::ReplicaRunChain, as the ledger rules a stage dispute). The replica's current nodes
  // are not it once the replica was placed again (a stage's deadline passed): then the check is
  // withdrawn (the ledger cleared it with the units), and the run's records -- signed by nodes
  // the replica no longer has -- are judged by no one: judged against the new chain they would
  // look forged, a mismatch against an honest stage.
  auto run_chain = [&]() -> Result<std::vector<protocol::NodeId>> {
    ML_ASSIGN_OR_RETURN(TaskInfo info, GetTask(node.chain(), c.task_id, /*units=*/true));
    Result<std::vector<protocol::NodeId>> chain =
        ReplicaRunChain(info.units, stages, c.index, c.assignment_beacon);
    if (!chain.ok()) {
      return FailedPrecondition(CheckName(c) +
                                ": withdrawn, nothing judged: " + chain.status().message());
    }
    return chain;
  };
  ML_ASSIGN_OR_RETURN(std::vector<protocol::NodeId> chain, run_chain());
  // Only the stage checked is built (from each step's checkpoint, loaded as it is fetched), never
  // the whole model: the steps' batches come from the task's data (read now, dropped before the
  // first replay, as a stage unit does), and the result check reads the stage's slices of the
  // round's start weights from the state blob's chunks that hold them (never the whole state).
  ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, ctx->Data());
  struct DropData {
    TaskContext* ctx;
    ~DropData() { ctx->ReleaseData(); }
  } drop_data{ctx};
  StageCheckInput in{.task = &ctx->task,
                     .data = data.get(),
                     .net = &net,
                     .facts = &ctx->facts,
                     .task_id = c.task_id,
                     .round = c.round,
                     .replica = c.shard / stages,
                     .stage = c.shard % stages,
                     .chain = chain,
                     .transport = node.deps().transport,
                     .endpoint = c.solver_endpoint};
  // The stage's last step: where its committed result must come from. Replayed below when it was
  // not drawn, and paid for (protocol::StageStepsReplayed: the ledger pays the steps replayed).
  const uint32_t last = static_cast<uint32_t>(f.leaves.size() - 2);
  // The steps' batches (a few sequences) are drawn now and the task's data dropped before any
  // replay: a check holds the stage's state and its activations, not the corpus beside them.
  std::map<uint64_t, engine::Batch> batches;
  for (uint32_t t : steps) {
    if (t + 1ull < f.leaves.size()) batches.emplace(t, StageStepBatch(in, t));
  }
  batches.emplace(last, StageStepBatch(in, last));
  in.batches = &batches;
  in.data = nullptr;
  data.reset();
  ctx->ReleaseData();
  // Step 0 must start from the stage's slice of the round's start state (CheckStageContinuity):
  // its hash, when step 0 is drawn.
  Hash256 start_slice;
  if (std::find(steps.begin(), steps.end(), 0u) != steps.end()) {
    ML_ASSIGN_OR_RETURN(GlobalWeightsReader global,
                        node.StartWeights(*ctx, c.task_id, c.start_state));
    ML_ASSIGN_OR_RETURN(start_slice, StageStartSliceHash(in, global));
  }
  StageStepEnd end;
  bool ended = false;
  for (uint32_t t : steps) {
    if (t + 1ull >= f.leaves.size()) {
      return InvalidArgument(CheckName(c) + ": step " + std::to_string(t) + " is out of range");
    }
    const Hash256 committed = f.leaves[t + 1];
    // First where the step starts (its replay cannot see that), then the step itself. The
    // continuity check's finding may be on the step before (its commit not served): the claim is
    // on the step the finding names.
    ML_ASSIGN_OR_RETURN(StageStepCheck r, CheckStageContinuity(in, t, f.leaves, start_slice));
    uint64_t at = t;
    if (r.leaf == committed) {
      ML_ASSIGN_OR_RETURN(r, CheckStageStep(in, t, committed, t == last ? &end : nullptr));
    } else {
      at = r.replay.step;
    }
    if (r.leaf == committed) {
      ended |= t == last;
      continue;
    }
    // The evidence was fetched after the chain was read: if the replica was placed again
    // meanwhile, the node may serve its new run's step (another leaf, `unserved`), which says
    // nothing of the checked run. The run is still the replica's now, after the fetch, or the
    // finding is dropped with the withdrawn check.
    ML_RETURN_IF_ERROR(run_chain().status());
    node.Log(CheckName(c) + ": " + r.message);
    f.mismatch = true;
    f.segment = static_cast<uint32_t>(at);
    f.start = f.leaves[at];
    f.solver_end = f.leaves[at + 1];
    f.replayed_end = r.leaf;
    break;
  }
  if (f.mismatch) return f;  // the dispute decides
  // Result binding (docs/verification.md "Pipeline stages", "Stage adversaries"): the stage's
  // state after its last step (replayed now if it was not drawn) against its committed result.
  if (!ended) {
    Result<StageStepCheck> r = CheckStageStep(in, last, f.leaves[last + 1], &end);
    ended = r.ok() && r->leaf == f.leaves[last + 1];
    if (!ended) {
      node.Log(CheckName(c) + ": result not checked: its last step does not replay clean (" +
               (r.ok() ? r->message : r.status().message()) + ")");
    }
  }
  if (!ended) return f;
  // The replayed state itself (no bytes round trip), hashed as its delta is computed.
  Result<GlobalWeightsReader> start = node.StartWeights(*ctx, c.task_id, c.start_state);
  Result<Hash256> result =
      !start.ok() ? Result<Hash256>(start.status())
                  : ledger::StageResultBlobId(ctx->task.model, start->size, start->read, end.state);
  if (!result.ok()) {
    node.Log(CheckName(c) + ": result not checked: " + result.status().message());
    return f;
  }
  if (*result == c.result_hash) {
    f.result = ResultCheck::kRight;
    return f;
  }
  ML_RETURN_IF_ERROR(run_chain().status());  // as for a step's finding: not a withdrawn check's
  // Wrong: what ProveResult sends (the stage's last commit and its state after it), kept in the
  // check's directory so that a restart proves it too.
  const std::string dir = node.VerifyDir(c);
  ML_RETURN_IF_ERROR(node.env()->CreateDirs(dir));
  ML_RETURN_IF_ERROR(
      node.env()->WriteFileAtomic(JoinPath(dir, kStageFinalCommitFile),
                                  AsStringView(protocol::EncodeStageStepCommit(end.commit))));
  ML_RETURN_IF_ERROR(
      engine::SaveCheckpoint(node.env(), JoinPath(dir, kStageFinalStateFile), end.state));
  node.Log(CheckName(c) + ": its result " + c.result_hash.ShortHex() +
           " is not the delta of its state after its last step (" + result->ShortHex() + ")");
  f.result = ResultCheck::kWrong;
  return f;
}

}  // namespace meshlearn::node
