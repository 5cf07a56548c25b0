#include "disputes.h"

#include <optional>

#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/protocol/task_model.h"
#include "journal.h"
#include "records.h"

namespace meshlearn::node {

namespace {

using Kind = VerifyAction::Kind;

bool Queried(const CheckAssignment& c, const PublicKey& me) {
  return c.dispute && c.dispute->has_query &&
         c.dispute->stage == protocol::DisputeStage::kDisputeSteps &&
         (c.dispute->defender == me || c.dispute->challenger == me);
}

}  // namespace

std::string Disputes::JournalPath(const CheckAssignment& c) const {
  return JoinPath(node_->VerifyDir(c), "dispute-" + std::to_string(c.dispute->first_step) + "-" +
                                           std::to_string(c.dispute->last_step) + ".json");
}

Disputes::RangeState Disputes::StateOf(const CheckAssignment& c) {
  const std::string key = JournalPath(c);
  if (!hashes_.count(key)) {
    // After a restart: the range replayed before.
    Result<journal::DisputeHashes> d =
        journal::ReadJournal<journal::DisputeHashes>(node_->env(), key);
    if (d.ok() && d->hashes.size() == c.dispute->last_step - c.dispute->first_step + 1) {
      hashes_[key] = std::move(d->hashes);
    }
  }
  return hashes_.count(key) ? RangeState::kReplayed : RangeState::kToReplay;
}

void Disputes::Play(const CheckAssignment& c, std::vector<VerifyJob>* urgent) {
  const PublicKey& me = node_->id();
  if (Queried(c, me)) {
    if (StateOf(c) == RangeState::kReplayed) {
      PostMove(c);
    } else {
      urgent->push_back({VerifyJob::Kind::kDispute, &c, c.dispute->query_deadline});
    }
  }
  // At the referee: a party that is not cheating posts the step's witness (the ledger rules).
  if (c.dispute && c.dispute->has_referee && c.dispute->referee.whole_step &&
      !c.dispute->referee.segment &&
      (c.dispute->challenger == me ||
       (c.dispute->defender == me && !CheatsAsSolver(node_->options().adversary))) &&
      // Not again once sent or given up: building a witness replays the unit to the step.
      !outbox_->Done({.dir = node_->VerifyDir(c),
                      .kind = Kind::kWitness,
                      .detail = {c.dispute->referee.step}})) {
    urgent->push_back({VerifyJob::Kind::kWitness, &c, c.deadline_height});
  }
}

void Disputes::Forget(const std::string& dir) {
  for (auto h = hashes_.begin(); h != hashes_.end();) {
    h = h->first.starts_with(dir + "/") ? hashes_.erase(h) : std::next(h);
  }
}

std::string Disputes::TrustedCheckpoint(const CheckAssignment& c) const {
  const DisputeView& d = *c.dispute;
  if (d.defender == node_->id()) {
    return JoinPath(node_->UnitDir(c.task_id, c.index),
                    "ckpt-" + std::to_string(d.first_step) + ".safetensors");
  }
  // The agreed state may be the defender's own (false) checkpoint at the dispute's first step:
  // the challenger replayed its segment from it.
  std::string checkpoint;
  const std::string dir = node_->VerifyDir(c);
  Env* env = node_->env();
  if (Result<journal::VerdictRecord> v =
          journal::ReadJournal<journal::VerdictRecord>(env, JoinPath(dir, "verdict.json"));
      v.ok() && v->finding.mismatch) {
    checkpoint = v->finding.checkpoint;
  }
  if (Result<journal::ChallengeRecord> v =
          journal::ReadJournal<journal::ChallengeRecord>(env, JoinPath(dir, "challenge.json"));
      v.ok() && v->finding.mismatch) {
    checkpoint = v->finding.checkpoint;
  }
  return checkpoint;
}

Status Disputes::RunReplay(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const bool defender = d.defender == node_->id();
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(node_->VerifyDir(c)));
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, c.task_id, c.start_state));
  const UnitWork work = protocol::UnitWorkOf(ctx->bundle.net, ctx->facts, c.round, c.shard);
  // Start from a state this node trusts at the disputed segment's start.
  const std::string checkpoint = d.first_step > 0 ? TrustedCheckpoint(c) : std::string();
  std::optional<engine::TrainState> state;
  if (!checkpoint.empty() && node_->env()->FileExists(checkpoint)) {
    Result<engine::TrainState> st = engine::LoadCheckpoint(node_->env(), checkpoint);
    if (st.ok() && st->step == static_cast<int64_t>(d.first_step)) state = std::move(*st);
  }
  std::vector<int64_t> steps;
  for (uint64_t s = d.first_step; s <= d.last_step; ++s) steps.push_back(static_cast<int64_t>(s));
  std::vector<Hash256> hashes;
  const Adversary adversary = node_->options().adversary;
  if (defender && CheatsAsSolver(adversary)) {
    // A cheating solver defends with its own states (adversary.h): its unit run again with a
    // state hash after every step, so the game reaches the ledger, which rules against it.
    UnitWork every = work;
    every.checkpoint_interval = 1;
    AdversaryInputs in;
    in.last_round = c.round + 1 == ctx->bundle.net.rounds;  // as the solver told it (noisy_last)
    ML_ASSIGN_OR_RETURN(UnitOutcome out, RunAdversaryUnit(adversary, ctx->trainer.get(),
                                                          start.weights, every, {}, in));
    for (int64_t s : steps) {
      if (s >= static_cast<int64_t>(out.state_hashes.size())) {
        return Internal("dispute: the adversary's run has no state after step " +
                        std::to_string(s));
      }
      hashes.push_back(out.state_hashes[static_cast<size_t>(s)]);
    }
  } else {
    ML_ASSIGN_OR_RETURN(hashes, ReplayToSteps(ctx->trainer.get(), start.weights, work,
                                              state ? static_cast<int64_t>(d.first_step) : 0,
                                              state ? &*state : nullptr, steps));
  }
  if (hashes.front() != d.agreed) {
    node_->Log(CheckName(c) + ": dispute: this node's state after step " +
               std::to_string(d.first_step) + " is " + hashes.front().ShortHex() +
               ", the agreed one " + d.agreed.ShortHex());
  }
  const std::string key = JournalPath(c);
  ML_RETURN_IF_ERROR(
      journal::WriteJournal(node_->env(), key, journal::DisputeHashes{.hashes = hashes}));
  hashes_[key] = std::move(hashes);
  node_->Log(CheckName(c) + ": dispute over steps " + std::to_string(d.first_step) + ".." +
             std::to_string(d.last_step) + " as the " + (defender ? "defender" : "challenger") +
             ": replayed");
  PostMove(c);
  return Status::Ok();
}

void Disputes::PostMove(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  auto it = hashes_.find(JournalPath(c));
  if (it == hashes_.end() || d.position < d.first_step ||
      d.position - d.first_step >= it->second.size()) {
    return;
  }
  const VerifyAction action{.dir = node_->VerifyDir(c),
                            .kind = Kind::kPost,
                            .detail = {d.first_step, d.last_step, d.position, d.query_deadline}};
  if (outbox_->Send(action, ledger::DisputePostTx{.task_id = c.task_id,
                                                  .index = c.index,
                                                  .node_id = node_->id(),
                                                  .position = d.position,
                                                  .hash = it->second[d.position - d.first_step]})) {
    ++node_->stats().dispute_posts;
  }
}

Status Disputes::RunStepWitness(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const VerifyAction action{
      .dir = node_->VerifyDir(c), .kind = Kind::kWitness, .detail = {d.referee.step}};
  if (outbox_->Done(action)) return Status::Ok();
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  // Only a task with a data root on the ledger is refereed by the ledger itself.
  if (ctx->info.params.data_root.IsZero()) return Status::Ok();
  if (!ctx->data_tree) {
    if (ctx->trainer->data().tokens) return Status::Ok();
    ctx->data_tree = std::make_unique<engine::DataTree>(ctx->trainer->data().train);
  }
  ML_ASSIGN_OR_RETURN(Bytes bundle, node_->FetchBlob(ctx->info.spec_hash, {}, ""));
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, c.task_id, c.start_state));
  const UnitWork work = protocol::UnitWorkOf(ctx->bundle.net, ctx->facts, c.round, c.shard);
  const std::string checkpoint = TrustedCheckpoint(c);
  DisputeStart from{.first_step = static_cast<int64_t>(d.first_step), .agreed = d.agreed};
  if (!checkpoint.empty()) {
    Env* env = node_->env();
    from.checkpoint = [env, checkpoint](int64_t step) -> Result<engine::TrainState> {
      ML_ASSIGN_OR_RETURN(engine::TrainState st, engine::LoadCheckpoint(env, checkpoint));
      if (st.step != step) {
        return NotFound("checkpoint " + checkpoint + " is of step " + std::to_string(st.step));
      }
      return st;
    };
  }
  Result<BuiltStepWitness> w = BuildStepWitness(ctx->trainer.get(), start.weights, work, d.referee,
                                                AsStringView(bundle), *ctx->data_tree, from);
  if (!w.ok()) {
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": no witness for step " + std::to_string(d.referee.step) + ": " +
                 w.status().message());
    }
    outbox_->GiveUp(action);
    return Status::Ok();
  }
  Bytes witness = ledger::EncodeStepWitness(w->witness);
  node_->Log(CheckName(c) + ": the dispute narrowed to step " + std::to_string(d.referee.step) +
             "; posting its witness (RefereeStep, " + std::to_string(witness.size()) +
             " bytes): the ledger computes " + w->output.ShortHex());
  outbox_->Send(action, ledger::RefereeStepTx{.task_id = c.task_id,
                                              .index = c.index,
                                              .witness = {std::move(witness)}});
  return Status::Ok();
}

}  // namespace meshlearn::node
