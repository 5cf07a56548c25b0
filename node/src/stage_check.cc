#include "meshlearn/node/stage_check.h"

#include <optional>
#include <utility>
#include <variant>

#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

engine::Batch StageStepBatch(const StageCheckInput& in, uint64_t step) {
  const UnitWork work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  return engine::DataStream(*in.task, *in.data, work.stream)
      .BatchForStep(static_cast<int64_t>(step));
}

namespace {

StageStepRef RefOf(const StageCheckInput& in, uint64_t step) {
  return {.task = in.task_id,
          .round = in.round,
          .replica = in.replica,
          .stage = in.stage,
          .step = step};
}

// Step ref.step's batch: drawn beforehand (StageCheckInput::batches), or now from the data.
Result<engine::Batch> BatchOfStep(const StageCheckInput& in, const StageStepRef& ref) {
  if (in.batches != nullptr) {
    const auto it = in.batches->find(ref.step);
    if (it != in.batches->end()) return it->second;
  }
  if (in.data == nullptr) {
    return FailedPrecondition(ref.ToString() +
                              ": its batch was not drawn and the task's data is "
                              "not given (StageCheckInput::batches, data)");
  }
  return StageStepBatch(in, ref.step);
}

// What a replay of step ref.step starts from, from the stage node: its served commit and received
// tensors, the replica's work as the Stager trains it (its batches, inner rate and dropout
// stream), the step's batch, the replay's setup, and the checkpoint's state, loaded as it is
// fetched (its bytes are never held beside the state; one that does not load is left in `start`).
struct StageStepStart {
  StageStepEvidence ev;
  UnitWork work;
  engine::Batch batch;
  ledger::StageReplaySetup setup;
  Result<engine::TrainState> start = engine::TrainState{};
};

// NotFound, unprefixed, when the node does not serve the step's records or its checkpoint, or
// when its served commit is not `committed_leaf` (when given: checked before the checkpoint is
// fetched); other fetch errors prefixed with what was fetched.
Result<StageStepStart> FetchStageStepStart(const StageCheckInput& in, const StageStepRef& ref,
                                           const Hash256* committed_leaf) {
  StageStepStart out;
  if (in.on_chain != nullptr && in.on_chain->step == ref.step) {
    // Served on chain: nothing is fetched from the stage node.
    const OnChainStageStep& c = *in.on_chain;
    if (committed_leaf != nullptr && protocol::StageStepLeaf(c.commit) != *committed_leaf) {
      return NotFound("the commit served on chain is not the committed step leaf " +
                      committed_leaf->ShortHex());
    }
    out.ev.commit = c.commit;
    out.ev.blobs = c.blobs;
    out.ev.checkpoint_bytes = c.checkpoint.size();
    out.work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
    ML_ASSIGN_OR_RETURN(out.batch, BatchOfStep(in, ref));
    ML_ASSIGN_OR_RETURN(out.setup,
                        ledger::StageReplaySetupOf(*in.task, *in.net, out.work.lr_scale, in.chain));
    out.start = StageCheckpointState(c.checkpoint);
    return out;
  }
  Result<StageStepEvidence> ev = FetchStageStepRecords(in.transport, in.endpoint, ref);
  if (!ev.ok() && ev.status().code() != StatusCode::kNotFound) {
    return ev.status().WithPrefix(ref.ToString() + ": fetching its evidence");
  }
  if (!ev.ok()) return ev.status();
  if (committed_leaf != nullptr && protocol::StageStepLeaf(ev->commit) != *committed_leaf) {
    return NotFound("the served commit is not the committed step leaf " +
                    committed_leaf->ShortHex());
  }
  out.ev = std::move(*ev);
  out.work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  if (ref.step >= static_cast<uint64_t>(out.work.inner_steps)) {
    return InvalidArgument(ref.ToString() + ": the step is outside the unit's " +
                           std::to_string(out.work.inner_steps) + " steps");
  }
  ML_ASSIGN_OR_RETURN(out.batch, BatchOfStep(in, ref));
  ML_ASSIGN_OR_RETURN(out.setup,
                      ledger::StageReplaySetupOf(*in.task, *in.net, out.work.lr_scale, in.chain));
  Status fetched = FetchStageCheckpointState(in.transport, in.endpoint, ref,
                                             out.ev.checkpoint_bytes, &out.start);
  if (!fetched.ok() && fetched.code() != StatusCode::kNotFound) {
    return fetched.WithPrefix(ref.ToString() + ": fetching its checkpoint");
  }
  if (!fetched.ok()) return fetched;
  return out;
}

// The stage's served evidence of step `step`, whose commit must be the committed leaf: what a
// ledger transaction over the step (`what`: its witness, its pieces) is built from.
// FailedPrecondition when the stage serves none or another commit.
Result<StageStepEvidence> FetchCommittedEvidence(const StageCheckInput& in, uint64_t step,
                                                 const Hash256& committed_leaf,
                                                 const std::string& what) {
  const StageStepRef ref = RefOf(in, step);
  Result<StageStepEvidence> ev = FetchStageStepEvidence(in.transport, in.endpoint, ref);
  if (!ev.ok() && ev.status().code() == StatusCode::kNotFound) {
    return FailedPrecondition(ref.ToString() +
                              ": the stage node serves no evidence for the step; " + what +
                              " can be built: " + ev.status().message());
  }
  if (!ev.ok()) return ev.status().WithPrefix(ref.ToString() + ": fetching its evidence");
  if (protocol::StageStepLeaf(ev->commit) != committed_leaf) {
    return FailedPrecondition(ref.ToString() +
                              ": the served commit is not the committed step leaf " +
                              committed_leaf.ShortHex() + "; " + what + " can be built");
  }
  return ev;
}

}  // namespace

Result<StageStepCheck> CheckStageStep(const StageCheckInput& in, uint64_t step,
                                      const Hash256& committed_leaf, StageStepEnd* end) {
  const StageStepRef ref = RefOf(in, step);
  auto unserved = [&](const std::string& why) {
    StageStepCheck out;
    out.leaf = StageUnservedLeaf(committed_leaf);
    out.replay.fault = StageFault::kStageFaultUnserved;
    out.message = ref.ToString() + ": unserved: " + why;
    return out;
  };
  // A step the node does not serve, or no longer serves, is unserved; a checkpoint that does not
  // load is the `start` finding (JudgeStageStep).
  Result<StageStepStart> got = FetchStageStepStart(in, ref, &committed_leaf);
  if (!got.ok() && got.status().code() == StatusCode::kNotFound) {
    return unserved(got.status().message());
  }
  ML_RETURN_IF_ERROR(got.status());
  StageStepStart& f = *got;
  engine::TrainState after;
  Result<StageStepCheck> c = ledger::JudgeStageStep(
      f.setup, f.ev.commit, std::move(f.start), f.ev.blobs, f.batch,
      engine::DropoutSeed(in.task->seed, f.work.stream), committed_leaf, end ? &after : nullptr);
  if (!c.ok()) return c.status().WithPrefix(ref.ToString());
  if (end != nullptr && c->leaf == committed_leaf) {
    end->commit = std::move(f.ev.commit);
    end->state = std::move(after);
  }
  return c;
}

Result<ledger::RefereeStageStepTx> BuildStageStepTx(const StageCheckInput& in,
                                                    const std::string& bundle, uint32_t index,
                                                    uint64_t step, const Hash256& committed_leaf,
                                                    std::unique_ptr<engine::TokenPageTree>* pages,
                                                    std::unique_ptr<engine::DataTree>* tree) {
  ML_ASSIGN_OR_RETURN(StageStepEvidence ev,
                      FetchCommittedEvidence(in, step, committed_leaf, "no witness"));
  const UnitWork work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  const engine::ClassificationData* train = EnsureDataProofs(*in.data, pages, tree);
  ML_ASSIGN_OR_RETURN(
      ledger::StageStepWitness w,
      ledger::BuildStageStepWitness(bundle, ev.commit, ev.checkpoint, ev.blobs, *in.task,
                                    work.stream, pages->get(), train, tree->get()));
  return ledger::RefereeStageStepTx{
      .task_id = in.task_id, .index = index, .witness = {ledger::EncodeStageStepWitness(w)}};
}

Result<std::vector<ledger::ServeStageEvidenceTx>> BuildStageServeTxs(
    const StageCheckInput& in, const ledger::TileRuleContext& ctx, const std::string& bundle,
    uint32_t index, uint64_t step, const Hash256& committed_leaf) {
  ML_ASSIGN_OR_RETURN(StageStepEvidence ev,
                      FetchCommittedEvidence(in, step, committed_leaf, "no piece"));
  ML_ASSIGN_OR_RETURN(std::vector<ledger::StageServePiece> pieces,
                      ledger::BuildStageServePieces(ctx, ev.commit, ev.checkpoint, ev.blobs));
  std::vector<ledger::ServeStageEvidenceTx> txs;
  for (size_t p = 0; p < pieces.size(); ++p) {
    txs.push_back(
        ledger::ServeStageEvidenceTx{.task_id = in.task_id,
                                     .index = index,
                                     .piece = static_cast<uint32_t>(p),
                                     .bundle = {bundle},
                                     .witness = {ledger::EncodeStageServePiece(pieces[p])}});
  }
  return txs;
}

Result<Hash256> StageStartSliceHash(const StageCheckInput& in, const GlobalWeightsReader& global) {
  ML_ASSIGN_OR_RETURN(
      engine::PipelineCut cut,
      engine::TaskPipelineCut(*in.task, static_cast<int>(in.net->stages), in.net->cut));
  const UnitWork work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  ML_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Stage> stage,
      StageFromGlobal(*in.task, cut, static_cast<int>(in.stage), global, work.lr_scale));
  return engine::StateHash(stage->state());
}

namespace {

// The commit the stage node serves for `step`, when it is `committed_leaf`'s; NotFound (its
// message saying why) when it serves none or another.
Result<protocol::StageStepCommit> ServedCommit(const StageCheckInput& in, uint64_t step,
                                               const Hash256& committed_leaf) {
  const StageStepRef ref = RefOf(in, step);
  Result<StageStepEvidence> ev = FetchStageStepRecords(in.transport, in.endpoint, ref);
  if (!ev.ok() && ev.status().code() != StatusCode::kNotFound) {
    return ev.status().WithPrefix(ref.ToString() + ": fetching its commit");
  }
  if (!ev.ok()) return ev.status();
  if (protocol::StageStepLeaf(ev->commit) != committed_leaf) {
    return NotFound(ref.ToString() + ": the served commit is not the committed step leaf " +
                    committed_leaf.ShortHex());
  }
  return std::move(ev->commit);
}

}  // namespace

Result<std::vector<ledger::StageServePiece>> ReadServedStagePieces(
    ChainClient& chain, const ledger::TileRuleContext& ctx, const protocol::TaskId& task,
    uint32_t index, const Hash256& committed_leaf, uint64_t from_height, uint64_t to_height) {
  const uint32_t count = ledger::StageServePieceCount(ctx.plan);
  if (count > ledger::StageServeRecord::kMaxPieces) {
    return InvalidArgument("an evidence of " + std::to_string(count) +
                           " pieces, which no chain takes");
  }
  std::vector<std::optional<ledger::StageServePiece>> found(count);
  uint32_t have = 0;
  const std::string type(ledger::TxTypeName(ledger::TxType::kServeStageEvidence));
  for (uint64_t h = to_height; h >= from_height && h > 0 && have < count; --h) {
    std::optional<uint64_t> cursor = 0;
    while (cursor && have < count) {
      ML_ASSIGN_OR_RETURN(BlockTxPage page, GetBlockTxs(chain, h, type, *cursor));
      cursor = page.next_cursor;
      for (const BlockTx& t : page.txs) {
        const auto* tx = std::get_if<ledger::ServeStageEvidenceTx>(&t.tx.payload);
        if (!t.ok || tx == nullptr || tx->task_id != task || tx->index != index ||
            tx->piece >= count || found[tx->piece].has_value()) {
          continue;
        }
        Result<ledger::StageServePiece> piece = ledger::DecodeStageServePiece(tx->witness.bytes);
        if (!piece.ok()) continue;
        Result<protocol::StageStepCommit> commit =
            protocol::DecodeStageStepCommit(piece->roots.commit);
        // Another step's evidence of the unit (a step served in another dispute).
        if (!commit.ok() || protocol::StageStepLeaf(*commit) != committed_leaf) continue;
        found[tx->piece] = std::move(*piece);
        ++have;
      }
    }
  }
  if (have < count) {
    std::string missing;
    for (uint32_t p = 0; p < count; ++p) {
      if (!found[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    return NotFound("pieces " + missing + " of the " + std::to_string(count) +
                    " of the stage step of leaf " + committed_leaf.ShortHex() +
                    " served on chain are not in blocks " + std::to_string(from_height) + ".." +
                    std::to_string(to_height));
  }
  std::vector<ledger::StageServePiece> pieces;
  pieces.reserve(count);
  for (std::optional<ledger::StageServePiece>& p : found) pieces.push_back(std::move(*p));
  return pieces;
}

Result<OnChainStageStep> AssembleOnChainStageStep(const ledger::TileRuleContext& ctx,
                                                  std::span<const ledger::StageServePiece> pieces,
                                                  uint64_t step, engine::TrainState& shapes) {
  ML_ASSIGN_OR_RETURN(ledger::StageServedEvidence ev,
                      ledger::AssembleStageServeEvidence(ctx, pieces, shapes));
  if (ev.commit.step != step) {
    return InvalidArgument("the stage's pieces on chain are of step " +
                           std::to_string(ev.commit.step) + ", not " + std::to_string(step));
  }
  OnChainStageStep out{.step = step, .commit = std::move(ev.commit), .blobs = std::move(ev.blobs)};
  ML_ASSIGN_OR_RETURN(out.checkpoint, StageCheckpointBytes(shapes));
  return out;
}

Result<StageStepCheck> CheckStageContinuity(const StageCheckInput& in, uint64_t step,
                                            std::span<const Hash256> leaves,
                                            const Hash256& start_slice) {
  const StageStepRef ref = RefOf(in, step);
  if (step + 1 >= leaves.size()) {
    return InvalidArgument(ref.ToString() + ": the check has no leaf for the step");
  }
  const Hash256& committed = leaves[step + 1];
  StageStepCheck out;
  out.leaf = committed;
  // A finding: `leaf` the claim's replayed end, on step `at` of the stage.
  auto finding = [&](const Hash256& leaf, StageFault fault, uint64_t at, std::string message) {
    out.leaf = leaf;
    out.replay.fault = fault;
    out.replay.replica = in.replica;
    out.replay.stage = in.stage;
    out.replay.step = at;
    out.message = std::move(message);
    out.replay.message = out.message;
    return out;
  };
  Result<protocol::StageStepCommit> commit = ServedCommit(in, step, committed);
  if (!commit.ok() && commit.status().code() == StatusCode::kNotFound) {
    return finding(StageUnservedLeaf(committed), StageFault::kStageFaultUnserved, step,
                   ref.ToString() + ": unserved: " + commit.status().message());
  }
  ML_RETURN_IF_ERROR(commit.status());
  Hash256 expected = start_slice;
  std::string from = "its slice of the round's start state";
  if (step > 0) {
    // Step t-1's commit is the one thing this check reads beside step t's: a stage that served
    // step t but withheld that commit would escape the check. So not serving it is the finding
    // `unserved` on step t-1, which the ledger rules as any unserved step (UnservedStageClaim):
    // an honest stage serves both, or shows the commit in the witness it posts.
    Result<protocol::StageStepCommit> previous = ServedCommit(in, step - 1, leaves[step]);
    if (!previous.ok() && previous.status().code() == StatusCode::kNotFound) {
      return finding(StageUnservedLeaf(leaves[step]), StageFault::kStageFaultUnserved, step - 1,
                     RefOf(in, step - 1).ToString() + ": unserved (read to check step " +
                         std::to_string(step) + "'s continuity): " + previous.status().message());
    }
    ML_RETURN_IF_ERROR(previous.status());
    expected = previous->state_after;
    from = "step " + std::to_string(step - 1) + "'s state_after";
  }
  if (commit->state_before == expected) return out;
  out.replay.claimed = commit->state_before;
  out.replay.replayed = expected;
  return finding(ledger::StageContinuityLeaf(committed), StageFault::kStageFaultContinuity, step,
                 ref.ToString() + ": continuity: the step starts from " +
                     commit->state_before.ShortHex() + ", not " + from + " " + expected.ShortHex());
}

Result<ledger::StageContinuityWitness> BuildStageContinuityWitness(
    const StageCheckInput& in, uint64_t step, const Hash256& committed_leaf,
    const std::string& bundle, const Bytes& start_state, const GlobalWeightsReader* global) {
  const StageStepRef ref = RefOf(in, step);
  auto unserved = [&](const Status& s) {
    return FailedPrecondition(ref.ToString() +
                              ": no continuity witness can be built: " + s.message());
  };
  Result<protocol::StageStepCommit> commit = ServedCommit(in, step, committed_leaf);
  if (!commit.ok() && commit.status().code() == StatusCode::kNotFound) {
    return unserved(commit.status());
  }
  ML_RETURN_IF_ERROR(commit.status());
  ledger::StageContinuityWitness w;
  w.commit = protocol::EncodeStageStepCommit(*commit);
  Hash256 expected;
  if (step > 0) {
    // The ledger checks it against the committed leaf of step - 1.
    Result<StageStepEvidence> ev =
        FetchStageStepRecords(in.transport, in.endpoint, RefOf(in, step - 1));
    if (!ev.ok() && ev.status().code() == StatusCode::kNotFound) return unserved(ev.status());
    ML_RETURN_IF_ERROR(ev.status());
    expected = ev->commit.state_after;
    w.previous = protocol::EncodeStageStepCommit(ev->commit);
  } else {
    if (global == nullptr) {
      return FailedPrecondition(ref.ToString() +
                                ": step 0's witness needs the round's start "
                                "weights");
    }
    ML_ASSIGN_OR_RETURN(expected, StageStartSliceHash(in, *global));
    w.bundle = bundle;
    w.start_state = start_state;
  }
  if (commit->state_before == expected) {
    return FailedPrecondition(ref.ToString() + ": the step starts where it should (" +
                              expected.ShortHex() + "); no continuity witness");
  }
  return w;
}

Result<TracedStageStep> TraceStageStep(const StageCheckInput& in, uint64_t step, bool keep_values) {
  const StageStepRef ref = RefOf(in, step);
  Result<StageStepStart> got = FetchStageStepStart(in, ref, nullptr);
  if (!got.ok() && got.status().code() == StatusCode::kNotFound) {
    return FailedPrecondition(ref.ToString() +
                              ": the stage node does not serve the step; "
                              "nothing to trace: " +
                              got.status().message());
  }
  ML_RETURN_IF_ERROR(got.status());
  StageStepStart& f = *got;
  Result<engine::TrainState>& start = f.start;
  if (!start.ok()) {
    return FailedPrecondition(
        ref.ToString() +
        ": its checkpoint does not load; nothing to trace: " + start.status().message());
  }
  TracedStageStep out;
  out.seed = start->seed;
  out.stream = start->stream;
  out.trace = std::make_shared<engine::OpTrace>();
  out.trace->set_keep_values(keep_values);
  Result<ledger::StageReplayResult> r = ledger::ReplayStageStep(
      f.setup, std::move(*start), f.ev.commit, f.ev.blobs, f.batch,
      engine::DropoutSeed(in.task->seed, f.work.stream), nullptr, out.trace.get());
  if (!r.ok()) return r.status().WithPrefix(ref.ToString() + ": tracing it");
  if (out.trace->size() == 0) {
    // The replay stopped before the step ran (a record not signed by the chain, a checkpoint that
    // is not the commit's start): there is no trace to answer or witness from.
    return FailedPrecondition(ref.ToString() +
                              ": the replay stopped before the step: " + r->message);
  }
  out.commit = std::move(f.ev.commit);
  out.batch = std::move(f.batch);
  return out;
}

Result<ledger::RefereeTileTx> BuildStageTileTx(
    const ledger::TileRuleContext& ctx, const protocol::RefereeTask& task,
    const TracedStageStep& traced, const engine::TaskData& data, const protocol::TaskId& task_id,
    uint32_t index, const std::string& bundle, std::unique_ptr<engine::TokenPageTree>* pages,
    std::unique_ptr<engine::DataTree>* tree) {
  Bytes witness;
  if (task.tile) {
    // The footprint's examples or token pages, proven against the task's data root.
    const engine::ClassificationData* train = EnsureDataProofs(data, pages, tree);
    ML_ASSIGN_OR_RETURN(ledger::TileWitness w,
                        ledger::BuildTileWitness(ctx, task, *traced.trace, traced.batch, train,
                                                 tree->get(), pages->get()));
    witness = ledger::EncodeTileWitness(w);
  } else {
    // The roots are ruled against the stage's committed commit: the served one must be it.
    if (protocol::StageStepLeaf(traced.commit) != task.defender_output) {
      return FailedPrecondition("the served commit of step " + std::to_string(traced.commit.step) +
                                " is not the committed step leaf " +
                                task.defender_output.ShortHex() +
                                "; the ledger would refuse its roots witness");
    }
    ML_ASSIGN_OR_RETURN(ledger::StageRootsWitness w,
                        ledger::BuildStageRootsWitness(ctx, task, *traced.trace, traced.commit,
                                                       traced.seed, traced.stream));
    witness = ledger::EncodeStageRootsWitness(w);
  }
  if (witness.size() > ledger::kMaxTileWitnessBytes) {
    return FailedPrecondition("the stage's " +
                              std::string(task.tile ? "tile witness" : "roots witness") + " is " +
                              std::to_string(witness.size()) + " bytes, over " +
                              std::to_string(ledger::kMaxTileWitnessBytes));
  }
  return ledger::RefereeTileTx{
      .task_id = task_id, .index = index, .bundle = {bundle}, .witness = {std::move(witness)}};
}

Result<std::vector<protocol::NodeId>> ReplicaRunChain(const std::vector<UnitRecord>& units,
                                                      uint32_t stages, uint32_t index,
                                                      const Hash256& beacon) {
  const UnitRecord* unit = nullptr;
  for (const UnitRecord& u : units) {
    if (u.index == index) unit = &u;
  }
  if (unit == nullptr) {
    return NotFound("replica chain: get_task lists no unit " + std::to_string(index));
  }
  const uint32_t replica = unit->shard / stages;
  std::vector<ledger::StagePlacement> placed(stages);
  for (const UnitRecord& u : units) {
    if (u.round == unit->round && u.shard / stages == replica) {
      placed[u.shard % stages] = {u.assignee, u.assignment_beacon};
    }
  }
  return ledger::ReplicaRunChain(placed, unit->shard % stages, beacon);
}

Result<std::vector<protocol::NodeId>> ReplicaRunChain(const std::vector<UnitRecord>& units,
                                                      uint32_t stages, uint32_t index) {
  for (const UnitRecord& u : units) {
    if (u.index == index) return ReplicaRunChain(units, stages, index, u.assignment_beacon);
  }
  return NotFound("replica chain: get_task lists no unit " + std::to_string(index));
}

}  // namespace meshlearn::node
