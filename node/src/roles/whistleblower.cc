#include "whistleblower.h"

#include "disputes.h"
#include "journal.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/protocol/draw.h"
#include "meshlearn/protocol/task_model.h"
#include "records.h"
#include "segment_checker.h"
#include "verifier.h"

namespace meshlearn::node {

Whistleblower::DrawState Whistleblower::StateOf(const CheckAssignment& c) const {
  const std::string dir = node_->VerifyDir(c);
  if (checked_.count(dir)) return DrawState::kChecked;
  if (drawn_.count(dir)) return DrawState::kDrawn;
  if (passed_.count(dir)) return DrawState::kPassed;
  return DrawState::kUndrawn;
}

void Whistleblower::Play(const CheckAssignment& c, std::vector<VerifyJob>* later) {
  const DrawState state = StateOf(c);
  if (state == DrawState::kPassed || state == DrawState::kChecked) return;
  const std::string dir = node_->VerifyDir(c);
  if (state == DrawState::kUndrawn) {
    const KeySeed& seed = node_->key().seed();
    const double draw = protocol::WhistleSampleDraw(ByteSpan(seed.bytes.data(), seed.bytes.size()),
                                                    c.task_id, c.index, c.commit_height);
    const bool drawn = !CheatsAsVerifier(node_->options().adversary) &&
                       draw < node_->options().whistleblower_sample && c.num_segments > 0;
    (drawn ? drawn_ : passed_).insert(dir);
    if (!drawn) return;
  }
  later->push_back({VerifyJob::Kind::kWhistle, &c, UINT64_MAX});
}

Status Whistleblower::Run(const CheckAssignment& c) {
  const std::string dir = node_->VerifyDir(c);
  drawn_.erase(dir);
  checked_.insert(dir);  // one re-check per unit, whatever happens
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(dir));
  const KeySeed& seed = node_->key().seed();
  const uint32_t segment =
      protocol::WhistleSegment(ByteSpan(seed.bytes.data(), seed.bytes.size()), c.task_id, c.index,
                               c.commit_height, c.num_segments);
  // A stage unit (a pipeline task): its step replayed alone from what the stage node serves.
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  SegmentFinding f;
  if (ctx->bundle.net.stages > 1) {
    ML_ASSIGN_OR_RETURN(f, CheckStageSteps(*node_, c, {segment}));
  } else {
    ML_ASSIGN_OR_RETURN(f, CheckSegments(*node_, c, {segment}, dir));
  }
  ++node_->stats().replays;
  if (f.result == ResultCheck::kWrong) {
    // One computation settles it: no dispute needed.
    ProveResult(*node_, *outbox_, c);
    return Status::Ok();
  }
  if (!f.mismatch) {
    node_->Log(CheckName(c) + ": whistleblower re-check of segment " + std::to_string(segment) +
               ": clean");
    return Status::Ok();
  }
  const journal::ChallengeRecord record{.finding = f.Record()};
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), JoinPath(dir, "challenge.json"), record));
  ML_ASSIGN_OR_RETURN(ledger::MismatchClaimField claim, ClaimOf(record.finding));
  // The task bundle, when the ledger requires it or can narrow the dispute to one tile.
  Result<std::string> bundle = MismatchBundle(*node_, c, claim);
  if (!bundle.ok()) return bundle.status().WithPrefix(CheckName(c) + ": challenge");
  (void)NoteServeBond(*node_, c, claim);
  node_->Log(CheckName(c) + ": whistleblower: segment " + std::to_string(f.segment) +
             " of solver " + c.solver.ShortHex() + " replays to " + f.replayed_end.ShortHex() +
             ", committed " + f.solver_end.ShortHex() + "; challenging the " +
             std::string(protocol::CheckResultName(c.result)) + " unit");
  if (outbox_->Send({.dir = dir, .kind = VerifyAction::Kind::kChallenge},
                    ledger::ChallengeUnitTx{.task_id = c.task_id,
                                            .index = c.index,
                                            .node_id = node_->id(),
                                            .claim = std::move(claim),
                                            .bundle = {std::move(*bundle)}})) {
    ++node_->stats().challenges;
  }
  return Status::Ok();
}

namespace {

// The ProveMerits of the dispute of check `c` (one per check: a dispute that ends in a merits
// window settles the check).
VerifyAction MeritsAction(const std::string& dir, const DisputeView& d) {
  return {.dir = dir, .kind = VerifyAction::Kind::kMerits, .detail = {d.first_step, d.last_step}};
}

}  // namespace

void Whistleblower::PlayMerits(const CheckAssignment& c, std::vector<VerifyJob>* urgent) {
  if (c.merits_deadline == 0 || !c.dispute) return;
  const bool challenger = c.dispute->challenger == node_->id();
  // Another checker the ledger lists the window to (CheckRole::kCheckRoleMerits: not the solver,
  // not one of the unit's verifiers, which called it clean and would slash themselves) replays
  // the disputed segment itself; a rubber stamp replays nothing.
  if (!challenger &&
      (!c.HasRole(CheckRole::kCheckRoleMerits) || CheatsAsVerifier(node_->options().adversary))) {
    return;
  }
  const std::string dir = node_->VerifyDir(c);
  if (outbox_->Done(MeritsAction(dir, *c.dispute))) return;
  Result<TaskContext*> ctx = node_->GetTask(c.task_id);
  if (!ctx.ok() || ledger::ProveMeritsRefusal((*ctx)->info.params) != nullptr) return;
  if (challenger && !node_->env()->FileExists(JoinPath(dir, "challenge.json"))) {
    return;  // not our finding
  }
  urgent->push_back({VerifyJob::Kind::kMerits, &c, c.merits_deadline});
}

Status Whistleblower::RunMerits(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const std::string dir = node_->VerifyDir(c);
  const VerifyAction action = MeritsAction(dir, d);
  if (outbox_->Done(action)) return Status::Ok();
  auto give_up = [&](const std::string& why) {
    node_->Log(CheckName(c) + ": no merits to show for the solver's silence: " + why);
    outbox_->GiveUp(action);
    return Status::Ok();
  };
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  const UnitWork work = protocol::UnitWorkOf(ctx->bundle.net, ctx->facts, c.round, c.shard);
  journal::Finding f;
  if (d.challenger == node_->id()) {
    Result<journal::ChallengeRecord> record = journal::ReadJournal<journal::ChallengeRecord>(
        node_->env(), JoinPath(dir, "challenge.json"));
    if (!record.ok()) return give_up(record.status().message());
    f = record->finding;
  } else {
    // Another node's dispute: replay its segment as the whistleblower did (from the solver's
    // checkpoint at its start, else from the unit's start), once; a clean replay has no merits.
    std::optional<uint32_t> segment;
    for (uint32_t s = 0; s < c.num_segments && !segment; ++s) {
      const protocol::SegmentSteps st =
          protocol::SegmentStepsOf(static_cast<uint64_t>(work.inner_steps),
                                   static_cast<uint64_t>(work.checkpoint_interval), s);
      if (st.first_step == d.first_step && st.last_step == d.last_step) segment = s;
    }
    if (!segment) {
      return give_up("steps " + std::to_string(d.first_step) + ".." + std::to_string(d.last_step) +
                     " are no segment of the unit");
    }
    ML_RETURN_IF_ERROR(node_->env()->CreateDirs(dir));
    Result<SegmentFinding> found = CheckSegments(*node_, c, {*segment}, dir);
    if (!found.ok()) return give_up(found.status().message());
    ++node_->stats().replays;
    f = found->Record();
    if (!f.mismatch) return give_up("segment " + std::to_string(*segment) + " replays clean");
  }
  const protocol::SegmentSteps steps =
      protocol::SegmentStepsOf(static_cast<uint64_t>(work.inner_steps),
                               static_cast<uint64_t>(work.checkpoint_interval), f.segment);
  if (!f.mismatch || steps.first_step != d.first_step || steps.last_step != d.last_step) {
    return give_up("the challenge journaled here is not this dispute's (segment " +
                   std::to_string(f.segment) + ")");
  }
  // The segment starts from the state the challenge replayed it from: the solver's checkpoint
  // (it hashes to the committed leaf), else the unit replayed from the round's start.
  std::optional<engine::TrainState> at_start;
  if (!f.checkpoint.empty() && node_->env()->FileExists(f.checkpoint)) {
    Result<engine::TrainState> st = engine::LoadCheckpoint(node_->env(), f.checkpoint);
    if (st.ok() && st->step == static_cast<int64_t>(steps.first_step)) at_start = std::move(*st);
  }
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, c.task_id, c.start_state));
  ML_ASSIGN_OR_RETURN(Bytes bundle, node_->FetchBlob(ctx->info.spec_hash, {}, ""));
  ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, ctx->Data());
  EnsureDataProofs(*data, &ctx->token_pages, &ctx->data_tree);
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  Result<BuiltSegmentWitness> w = BuildSegmentWitnessOf(
      trainer, EncodeGlobalState(start), work, c.leaves, f.segment, at_start ? &*at_start : nullptr,
      AsStringView(bundle), ctx->token_pages.get(), ctx->data_tree.get());
  if (!w.ok()) return give_up(w.status().message());
  Bytes witness = ledger::EncodeSegmentWitness(w->witness);
  const std::string shown = "segment " + std::to_string(f.segment) + " replays to " +
                            w->replayed_end.ShortHex() + ", committed " +
                            w->committed_end.ShortHex();
  node_->Log(CheckName(c) + ": the solver fell silent in " +
             (d.challenger == node_->id() ? std::string("this node's dispute")
                                          : "the dispute of " + d.challenger.ShortHex()) +
             "; showing its merits: " + shown + " (ProveMerits, " + std::to_string(witness.size()) +
             " bytes)");
  if (outbox_->SendProof(action, ledger::ProveMeritsTx{.task_id = c.task_id,
                                                       .index = c.index,
                                                       .node_id = node_->id(),
                                                       .segment = f.segment,
                                                       .witness = {std::move(witness)}})) {
    ++node_->stats().merits_shown;
  }
  return Status::Ok();
}

}  // namespace meshlearn::node
