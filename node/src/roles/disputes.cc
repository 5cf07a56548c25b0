#include "disputes.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "journal.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/step_witness.h"
#include "meshlearn/protocol/task_model.h"
#include "records.h"
#include "verifier.h"

namespace meshlearn::node {

namespace {

using Kind = VerifyAction::Kind;

bool Queried(const CheckAssignment& c, const PublicKey& me) {
  return c.dispute && c.dispute->has_query &&
         c.dispute->stage == protocol::DisputeStage::kDisputeSteps &&
         (c.dispute->defender == me || c.dispute->challenger == me);
}

// A query of phases 2-4 (a dispute with the tile phase) to this node.
bool TileQueried(const CheckAssignment& c, const PublicKey& me) {
  return c.dispute && c.dispute->has_query &&
         c.dispute->stage != protocol::DisputeStage::kDisputeSteps &&
         (c.dispute->defender == me || c.dispute->challenger == me);
}

// The marker of a step this node cannot trace (given up: it stays silent).
VerifyAction TraceAction(const std::string& dir, uint64_t step) {
  return {.dir = dir, .kind = Kind::kPost, .detail = {step, UINT64_MAX}};
}

// What a dispute's job of a pipeline task read of its data (a step's batch, a witness's proofs)
// is dropped however the job returns (TaskContext::ReleaseStageData): kept, it would sit beside
// the stage unit the node's next tick may start.
struct DisputeDataDrop {
  TaskContext* ctx;
  ~DisputeDataDrop() {
    if (ctx != nullptr) ctx->ReleaseStageData();
  }
};

}  // namespace

VerifyAction WitnessAction(const std::string& dir, const DisputeView& d,
                           std::initializer_list<uint64_t> what) {
  VerifyAction a{.dir = dir, .kind = Kind::kWitness, .detail = what};
  for (size_t i = 0; i < PublicKey::kSize; i += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, d.challenger.bytes.data() + i, sizeof(word));
    a.detail.push_back(word);
  }
  return a;
}

Result<ledger::TileRuleContext> TileContextFor(NodeContext& node, const CheckAssignment& c,
                                               std::string* bundle, bool to_open) {
  if (to_open && !node.options().tile_disputes) {
    return FailedPrecondition("tile disputes are off (AgentOptions::tile_disputes)");
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node.GetTask(c.task_id));
  ML_ASSIGN_OR_RETURN(Bytes text, node.FetchBlob(ctx->info.spec_hash, {}, ""));
  if (text.size() > ledger::kMaxBundleBytes) {
    return FailedPrecondition("the task bundle is " + std::to_string(text.size()) +
                              " bytes, over the " + std::to_string(ledger::kMaxBundleBytes) +
                              " a transaction's bundle field holds");
  }
  ledger::TaskRecord t;
  t.id = c.task_id;
  t.spec_hash = ctx->info.spec_hash;
  t.params = ctx->info.params;
  ledger::WorkUnit u;
  u.task_id = c.task_id;
  u.index = c.index;
  u.round = c.round;
  u.shard = c.shard;
  *bundle = std::string(AsStringView(text));
  return ledger::TileContextOf(t, u, *bundle, CheckName(c) + ": tile phase");
}

Result<std::string> MismatchBundle(NodeContext& node, const CheckAssignment& c,
                                   const ledger::MismatchClaimField& claim) {
  Result<TaskContext*> loaded = node.GetTask(c.task_id);
  // Not loaded: as before, no bundle (the ledger refuses the mismatch if it needs one).
  if (!loaded.ok()) return std::string();
  const TaskContext* ctx = *loaded;
  // A stage that served nothing: this node could not trace the step to answer a tile phase.
  if (ledger::UnservedStageClaim(ctx->info.params, claim)) return std::string();
  // A claim that the step does not start where the previous one ended: ruled from the two
  // commits, over the whole step (the tile phase's traces would all agree).
  if (ledger::ContinuityStageClaim(ctx->info.params, claim)) return std::string();
  // A stage's step (a GPT's or a sequential model's) is played to a tile over its stage's plan
  // (TileContextOf plans it).
  std::string bundle;
  if (!ledger::MismatchNeedsBundle(ctx->info.params, c.index, claim)) {
    return TileContextFor(node, c, &bundle, /*to_open=*/true).ok() ? bundle : std::string();
  }
  ML_ASSIGN_OR_RETURN(Bytes text, node.FetchBlob(ctx->info.spec_hash, {}, ""));
  if (text.size() > ledger::kMaxBundleBytes) {
    return FailedPrecondition("the task bundle is " + std::to_string(text.size()) +
                              " bytes, over the " + std::to_string(ledger::kMaxBundleBytes) +
                              " a transaction's bundle field holds, and the ledger requires it "
                              "with this mismatch (ledger::MismatchNeedsBundle)");
  }
  return std::string(AsStringView(text));
}

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
  // A step this node claimed served nothing, served on chain since: checked from the pieces
  // before the round is final (its verification window restarted when the claim settled).
  if (RecheckDue(c) != nullptr) {
    urgent->push_back({VerifyJob::Kind::kRecheck, &c, c.deadline_height});
  }
  if (Queried(c, me)) {
    if (StateOf(c) == RangeState::kReplayed) {
      PostMove(c);
    } else {
      urgent->push_back({VerifyJob::Kind::kDispute, &c, c.dispute->query_deadline});
    }
  }
  if (TileQueried(c, me)) {
    auto it = traces_.find(TraceKey(c, c.dispute->query.step));
    if (it != traces_.end() && !WaitsForValues(c, it->second)) {
      PostTileMove(c);
    } else if (!outbox_->Done(TraceAction(node_->VerifyDir(c), c.dispute->query.step))) {
      // Not traced yet, or a stage's step whose move needs its operators' values: traced (again)
      // by a job, a stage replay that waits for the node's own stage unit as any does
      // (NodeAgent::WaitsForStageUnit).
      urgent->push_back({VerifyJob::Kind::kTrace, &c, c.dispute->query_deadline});
    }
  }
  // At the referee with one tile: a party that is not cheating posts the tile's witness.
  const Adversary adversary = node_->options().adversary;
  if (c.dispute && c.dispute->has_referee && c.dispute->referee.tile &&
      ((c.dispute->challenger == me && !LiesInDisputes(adversary, false)) ||
       (c.dispute->defender == me && !LiesInDisputes(adversary, true)))) {
    const protocol::RefereeTask& t = c.dispute->referee;
    if (!outbox_->Done(WitnessAction(node_->VerifyDir(c), *c.dispute,
                                     {t.step, t.operator_index, t.tile_index, t.block}))) {
      urgent->push_back({VerifyJob::Kind::kWitness, &c, c.deadline_height});
    }
  }
  // At the referee: a party that is not cheating posts the step's witness (the ledger rules).
  // A claim that a stage served nothing is answered by its evidence whoever defends: a cheating
  // stage serves it too, its lie being in what it committed, which the pieces then show
  // (RunServedRecheck), and withholding them would lose it the claim at once.
  const bool unserved_claim = c.dispute && c.dispute->has_referee && c.dispute->referee.step > 0 &&
                              c.dispute->referee.challenger_output ==
                                  ledger::StageUnservedLeaf(c.dispute->referee.defender_output);
  if (c.dispute && c.dispute->has_referee && c.dispute->referee.whole_step &&
      !c.dispute->referee.segment &&
      ((c.dispute->challenger == me && !LiesInDisputes(adversary, false)) ||
       (c.dispute->defender == me && (!LiesInDisputes(adversary, true) || unserved_claim))) &&
      // Not again once sent or given up: building a witness replays the unit to the step.
      !outbox_->Done(WitnessAction(node_->VerifyDir(c), *c.dispute, {c.dispute->referee.step})) &&
      // (Only a claim that the stage served nothing has pieces: the dispute on the same step
      // that follows its served ruling, by the same claimant, posts its own witness.)
      !(unserved_claim && EvidenceServed(c))) {
    urgent->push_back({VerifyJob::Kind::kWitness, &c, c.deadline_height});
  }
}

void Disputes::Forget(const std::string& dir) {
  for (auto h = hashes_.begin(); h != hashes_.end();) {
    h = h->first.starts_with(dir + "/") ? hashes_.erase(h) : std::next(h);
  }
  for (auto t = traces_.begin(); t != traces_.end();) {
    t = t->first.starts_with(dir + "/") ? traces_.erase(t) : std::next(t);
  }
  for (auto p = serve_pieces_.begin(); p != serve_pieces_.end();) {
    p = p->first.starts_with(dir + "/") ? serve_pieces_.erase(p) : std::next(p);
  }
  for (auto o = on_chain_.begin(); o != on_chain_.end();) {
    o = o->first.starts_with(dir + "/") ? on_chain_.erase(o) : std::next(o);
  }
}

VerifyAction Disputes::RecheckAction(const CheckAssignment& c, const ServedStageStep& s) const {
  return {.dir = node_->VerifyDir(c), .kind = Kind::kChallenge, .detail = {s.step, s.height}};
}

const ServedStageStep* Disputes::RecheckDue(const CheckAssignment& c) const {
  if (c.stage != protocol::CheckStage::kCheckSettled ||
      (c.result != protocol::CheckResult::kCheckClean &&
       c.result != protocol::CheckResult::kCheckUnchecked)) {
    return nullptr;
  }
  for (const ServedStageStep& s : c.served) {
    if (s.challenger == node_->id() && !outbox_->Done(RecheckAction(c, s))) return &s;
  }
  return nullptr;
}

Result<const OnChainStageStep*> Disputes::OnChainStepOf(const CheckAssignment& c, TaskContext* ctx,
                                                        const StageCheckInput& in, uint64_t step) {
  const ServedStageStep* s = c.ServedStep(step);
  if (s == nullptr) return static_cast<const OnChainStageStep*>(nullptr);
  const std::string key = JoinPath(node_->VerifyDir(c), "on-chain-" + std::to_string(step));
  if (auto it = on_chain_.find(key); it != on_chain_.end()) return it->second.get();
  std::string bundle;
  ML_ASSIGN_OR_RETURN(ledger::TileRuleContext tc, TileContextFor(*node_, c, &bundle, false));
  // The pieces lie between the unit's commit and the ruling (the block of the last one).
  ML_ASSIGN_OR_RETURN(std::vector<ledger::StageServePiece> pieces,
                      ReadServedStagePieces(node_->chain(), tc, c.task_id, c.index,
                                            c.leaves.at(step), c.commit_height, s->height));
  // Put back together in a stage of its shapes: built from the round's start weights.
  ML_ASSIGN_OR_RETURN(GlobalWeightsReader global,
                      node_->StartWeights(*ctx, c.task_id, c.start_state));
  ML_ASSIGN_OR_RETURN(
      engine::PipelineCut cut,
      engine::TaskPipelineCut(*in.task, static_cast<int>(in.net->stages), in.net->cut));
  const UnitWork work = protocol::UnitWorkOf(*in.net, *in.facts, in.round, in.replica);
  ML_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Stage> shapes,
      StageFromGlobal(*in.task, cut, static_cast<int>(in.stage), global, work.lr_scale));
  Result<OnChainStageStep> got = AssembleOnChainStageStep(tc, pieces, step - 1, shapes->state());
  if (!got.ok()) return got.status().WithPrefix(CheckName(c) + ": its pieces on chain");
  node_->Log(CheckName(c) + ": stage step " + std::to_string(step - 1) +
             ": read its evidence served on chain (blocks " + std::to_string(c.commit_height) +
             ".." + std::to_string(s->height) + ")");
  auto it = on_chain_.emplace(key, std::make_unique<const OnChainStageStep>(std::move(*got))).first;
  return it->second.get();
}

std::string Disputes::RecheckPath(const CheckAssignment& c, const ServedStageStep& s) const {
  return JoinPath(node_->VerifyDir(c),
                  "recheck-" + std::to_string(s.step) + "-" + std::to_string(s.height) + ".json");
}

Result<journal::ServedRecheck> Disputes::KeptRecheck(const CheckAssignment& c,
                                                     const ServedStageStep& s) const {
  const std::string path = RecheckPath(c, s);
  Result<journal::ServedRecheck> kept =
      journal::ReadJournal<journal::ServedRecheck>(node_->env(), path);
  if (!kept.ok()) return kept.status();
  // Another step's, another ruling's or another commitment's record under this name is no
  // finding of this step: it is checked again.
  if (kept->step != s.step || kept->height != s.height || kept->finding.leaves != c.leaves ||
      (kept->finding.mismatch && kept->finding.segment != s.step - 1)) {
    return DataLoss(path + ": not the recheck of step " + std::to_string(s.step - 1) +
                    " served at height " + std::to_string(s.height) + " of these leaves");
  }
  return kept;
}

Status Disputes::RunServedRecheck(const CheckAssignment& c) {
  const ServedStageStep* s = RecheckDue(c);
  if (s == nullptr) return Status::Ok();
  const VerifyAction action = RecheckAction(c, *s);
  const uint64_t step = s->step - 1;  // the stage's step
  auto give_up = [&](const std::string& why) {
    node_->Log(CheckName(c) + ": stage step " + std::to_string(step) +
               " served on chain: not checked: " + why);
    outbox_->GiveUp(action);
    return Status::Ok();
  };
  // What a recheck before a restart found: kept, it is not replayed again (a clean step stays
  // clean; a finding not sent yet is sent now). A record that does not read back as this step's
  // (corrupt, another version) is as good as none: the step is checked again and the record
  // rewritten, which costs one replay and loses nothing.
  Result<journal::ServedRecheck> kept = KeptRecheck(c, *s);
  if (!kept.ok() && kept.status().code() != StatusCode::kNotFound) {
    node_->Log(CheckName(c) + ": stage step " + std::to_string(step) + ": " +
               kept.status().message() + "; checking the served step again");
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  if (ctx->bundle.net.stages < 2) return give_up("not a stage unit");
  journal::ServedRecheck record;
  if (kept.ok()) {
    record = std::move(*kept);
    node_->Log(CheckName(c) + ": stage step " + std::to_string(step) +
               " served on chain: its recheck before a restart found it " +
               (record.finding.mismatch ? "wrong" : "clean") + " (" + RecheckPath(c, *s) + ")");
  } else {
    // Like every other stage job: the data it reads for the step's batch is dropped when it ends.
    const DisputeDataDrop drop_data{ctx};
    std::shared_ptr<const engine::TaskData> data;
    Result<StageCheckInput> in = StageInputOf(c, ctx, &data);
    if (!in.ok()) return give_up(in.status().message());
    ML_ASSIGN_OR_RETURN(in->on_chain, OnChainStepOf(c, ctx, *in, s->step));
    const Hash256& committed = c.leaves.at(s->step);
    ML_ASSIGN_OR_RETURN(StageStepCheck r, CheckStageStep(*in, step, committed));
    ++node_->stats().replays;
    record.step = s->step;
    record.height = s->height;
    record.finding.leaves = c.leaves;
    if (r.leaf == committed) {
      node_->Log(CheckName(c) + ": stage step " + std::to_string(step) +
                 " served on chain replays clean from its pieces");
    } else {
      record.finding.mismatch = true;
      record.finding.segment = static_cast<uint32_t>(step);
      record.finding.replayed_end = r.leaf;
      node_->Log(CheckName(c) + ": stage step " + std::to_string(step) +
                 " served on chain does not replay from its pieces (" + r.message + ")");
    }
    ML_RETURN_IF_ERROR(node_->env()->CreateDirs(action.dir));
    ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), RecheckPath(c, *s), record));
    if (const auto& hook = node_->options().after_served_recheck) {
      ML_RETURN_IF_ERROR(hook(c.task_id, c.index, record.finding.mismatch));
    }
  }
  if (!record.finding.mismatch) {
    outbox_->GiveUp(action);  // done: nothing to send
    return Status::Ok();
  }
  // The challenge's own record, as a whistleblower's (its merits, the dispute's trusted start).
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), JoinPath(action.dir, "challenge.json"),
                                           journal::ChallengeRecord{.finding = record.finding}));
  ML_ASSIGN_OR_RETURN(ledger::MismatchClaimField claim, ClaimOf(record.finding));
  Result<std::string> bundle = MismatchBundle(*node_, c, claim);
  if (!bundle.ok()) return give_up(bundle.status().message());
  node_->Log(CheckName(c) + ": stage step " + std::to_string(step) +
             " served on chain: challenging it (ChallengeUnit with the task bundle)");
  if (outbox_->Send(action, ledger::ChallengeUnitTx{.task_id = c.task_id,
                                                    .index = c.index,
                                                    .node_id = node_->id(),
                                                    .claim = std::move(claim),
                                                    .bundle = {std::move(*bundle)}})) {
    ++node_->stats().challenges;
  }
  return Status::Ok();
}

std::string Disputes::TraceKey(const CheckAssignment& c, uint64_t step) const {
  return JoinPath(node_->VerifyDir(c), "trace-" + std::to_string(step));
}

VerifyAction Disputes::TileMoveAction(const CheckAssignment& c) const {
  const DisputeView& d = *c.dispute;
  const protocol::DisputeQuery& q = d.query;
  return {.dir = node_->VerifyDir(c),
          .kind = Kind::kPost,
          .detail = {d.first_step, d.last_step, q.position, q.deadline_height,
                     100 + static_cast<uint64_t>(q.stage), q.level, q.operator_index}};
}

bool Disputes::WaitsForValues(const CheckAssignment& c, const TraceEntry& e) const {
  return e.stage.has_value() && !e.step.trace->keep_values() &&
         c.dispute->query.stage != protocol::DisputeStage::kDisputeOperators &&
         !outbox_->Done(TileMoveAction(c));
}

void Disputes::DropStageValues(TraceEntry* e) {
  if (!e->stage.has_value() || !e->step.trace->keep_values()) return;
  // Appended to a trace that keeps no values, the names, roots and grids move and the values are
  // freed (engine::OpTrace::Append).
  auto roots = std::make_shared<engine::OpTrace>();
  roots->Append(std::move(*e->step.trace));
  e->step.trace = roots;
  e->stage->trace = std::move(roots);
}

uint64_t Disputes::StageValueBytes() const {
  uint64_t bytes = 0;
  for (const auto& [key, e] : traces_) {
    if (!e.stage.has_value() || !e.step.trace->keep_values()) continue;
    for (size_t i = 0; i < e.step.trace->size(); ++i) {
      bytes += e.step.trace->values(i).size() * sizeof(float);
    }
  }
  return bytes;
}

std::string Disputes::ServeKey(const CheckAssignment& c) const {
  return JoinPath(node_->VerifyDir(c), "serve-" + std::to_string(c.dispute->referee.step) + "-" +
                                           c.dispute->challenger.ToHex());
}

bool Disputes::EvidenceServed(const CheckAssignment& c) const {
  const auto it = serve_pieces_.find(ServeKey(c));
  if (it == serve_pieces_.end()) return false;
  for (uint32_t p = 0; p < it->second; ++p) {
    if (!outbox_->Done(WitnessAction(node_->VerifyDir(c), *c.dispute,
                                     {c.dispute->referee.step, uint64_t{p} + 1}))) {
      return false;
    }
  }
  return true;
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
  if (LiesInDisputes(adversary, defender)) {
    // A cheating solver defends with its own states (adversary.h): its unit run again with a
    // state hash after every step, so the game reaches the ledger, which rules against it (and a
    // wrong_example challenger claims its forged run of the challenged unit the same way).
    UnitWork every = work;
    every.checkpoint_interval = 1;
    AdversaryInputs in;
    in.last_round = c.round + 1 == ctx->bundle.net.rounds;  // as the solver told it (noisy_last)
    ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
    ML_ASSIGN_OR_RETURN(UnitOutcome out,
                        RunAdversaryUnit(adversary, trainer, start.weights, every, {}, in));
    for (int64_t s : steps) {
      if (s >= static_cast<int64_t>(out.state_hashes.size())) {
        return Internal("dispute: the adversary's run has no state after step " +
                        std::to_string(s));
      }
      hashes.push_back(out.state_hashes[static_cast<size_t>(s)]);
    }
  } else {
    ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
    ML_ASSIGN_OR_RETURN(hashes, ReplayToSteps(trainer, start.weights, work,
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
  if (d.stage != protocol::DisputeStage::kDisputeSteps) return;  // phases 2-4: PostTileMove
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

Status Disputes::RunTrace(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const uint64_t step = d.has_referee ? d.referee.step : d.query.step;
  const std::string key = TraceKey(c, step);
  if (traces_.count(key)) {
    PostTileMove(c);
    return Status::Ok();
  }
  const VerifyAction action = TraceAction(node_->VerifyDir(c), step);
  if (outbox_->Done(action)) return Status::Ok();
  auto give_up = [&](const std::string& why) {
    node_->Log(CheckName(c) + ": dispute at step " + std::to_string(step) +
               ": no operator trace, silent from here: " + why);
    outbox_->GiveUp(action);
    return Status::Ok();
  };
  TraceEntry entry;
  // (Whatever this node's own tile_disputes: the dispute plays the tile phase, so it answers.)
  Result<ledger::TileRuleContext> tc = TileContextFor(*node_, c, &entry.bundle, false);
  if (!tc.ok()) return give_up(tc.status().message());
  entry.ctx = std::move(*tc);
  ML_ASSIGN_OR_RETURN(TaskContext * task, node_->GetTask(c.task_id));
  if (task->bundle.net.stages > 1) {
    // A pipeline stage's step: traced from what the stage node serves, no range replayed.
    Status traced = TraceStage(c, task, step, &entry, /*keep_values=*/false);
    if (traced.code() == StatusCode::kFailedPrecondition) return give_up(traced.message());
    ML_RETURN_IF_ERROR(traced);
    traces_[key] = std::move(entry);
    node_->Log(CheckName(c) + ": stage dispute at step " + std::to_string(step - 1) +
               ": traced it from the stage's served evidence (" +
               std::to_string(traces_[key].step.trace->size()) + " operators)");
    PostTileMove(c);
    return Status::Ok();
  }
  // The state the step starts from, as this node holds it: its own replay of the range.
  if (StateOf(c) != RangeState::kReplayed) ML_RETURN_IF_ERROR(RunReplay(c));
  const std::vector<Hash256>& hashes = hashes_.at(JournalPath(c));
  if (step <= d.first_step || step > d.last_step) {
    return give_up("step " + std::to_string(step) + " is outside the dispute's range");
  }
  const Hash256 input = hashes[step - 1 - d.first_step];
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, c.task_id, c.start_state));
  const UnitWork work = protocol::UnitWorkOf(ctx->bundle.net, ctx->facts, c.round, c.shard);
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  // A cheating party claims what its own run did (adversary.h): a lazy solver skipped the step,
  // so its parameters after it are the ones before; a wrong_example party (either side) read the
  // step's batch forged; the others have no trace to show.
  const Adversary adversary = node_->options().adversary;
  const bool lies = LiesInDisputes(adversary, d.defender == node_->id());
  if (lies && adversary != Adversary::kLazy && adversary != Adversary::kWrongExample) {
    return give_up("the " + std::string(AdversaryName(adversary)) + " solver has no step to show");
  }
  std::function<void(engine::Batch&)> forge;
  if (lies && adversary == Adversary::kWrongExample &&
      static_cast<int64_t>(step) == ForgedExampleStep(work.inner_steps)) {
    forge = ForgeExample;
  }
  Result<TracedStep> traced = TraceDisputedStep(
      trainer, start.weights, work, static_cast<int64_t>(step), input, StartOf(c), forge);
  if (!traced.ok()) return give_up(traced.status().message());
  if (lies && adversary == Adversary::kLazy) {
    traced->trace =
        std::make_shared<engine::OpTrace>(SkippedUpdateTrace(entry.ctx.plan, *traced->trace));
  }
  entry.step = std::move(*traced);
  traces_[key] = std::move(entry);
  node_->Log(CheckName(c) + ": dispute narrowed to step " + std::to_string(step) +
             ": replayed it with its operator trace (" +
             std::to_string(traces_[key].step.trace->size()) + " operators)");
  PostTileMove(c);
  return Status::Ok();
}

void Disputes::PostTileMove(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  if (!d.has_query || d.stage == protocol::DisputeStage::kDisputeSteps) return;
  const std::string key = TraceKey(c, d.query.step);
  auto it = traces_.find(key);
  if (it == traces_.end()) return;
  const protocol::DisputeQuery& q = d.query;
  const VerifyAction action = TileMoveAction(c);
  if (outbox_->Done(action)) return;
  // A stage step's operator values are kept for this move only: held between ticks they would sit
  // beside the node's next stage unit (several times the stage's state), so the next query that
  // needs them traces the step again (Play).
  struct DropValues {
    Disputes* self;
    TraceEntry* e;
    ~DropValues() { self->DropStageValues(e); }
  } drop_values{this, &it->second};
  if (q.stage != protocol::DisputeStage::kDisputeOperators) {
    if (Status kept = KeepStageValues(c, key, q.step); !kept.ok()) {
      node_->Log(CheckName(c) + ": no move for the dispute's query yet: " + kept.message());
      return;
    }
  }
  const TraceEntry& e = it->second;
  Result<ledger::DisputeMoveAnswer> a =
      ledger::AnswerTileQuery(e.ctx, q, e.step.input, *e.step.trace, e.step.batch);
  if (!a.ok()) {
    node_->Log(CheckName(c) + ": no move for the dispute's query: " + a.status().message());
    outbox_->GiveUp(action);
    return;
  }
  bool sent = false;
  if (a->children) {
    sent = outbox_->Send(action, ledger::DisputeChildrenTx{.task_id = c.task_id,
                                                           .index = c.index,
                                                           .node_id = node_->id(),
                                                           .position = q.position,
                                                           .left = a->left,
                                                           .right = a->right});
  } else {
    sent = outbox_->Send(action, ledger::DisputePostTx{.task_id = c.task_id,
                                                       .index = c.index,
                                                       .node_id = node_->id(),
                                                       .position = q.position,
                                                       .hash = a->hash});
  }
  if (sent) ++node_->stats().dispute_posts;
}

Status Disputes::RunTileWitness(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  const protocol::RefereeTask& t = d.referee;
  const VerifyAction action =
      WitnessAction(node_->VerifyDir(c), d, {t.step, t.operator_index, t.tile_index, t.block});
  if (outbox_->Done(action)) return Status::Ok();
  auto give_up = [&](const std::string& why) {
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": no witness for " +
                 (t.tile ? "tile " + std::to_string(t.tile_index) + " of operator " +
                               std::to_string(t.operator_index)
                         : "the roots of step " + std::to_string(t.step)) +
                 ": " + why);
    }
    outbox_->GiveUp(action);
    return Status::Ok();
  };
  const std::string key = TraceKey(c, t.step);
  if (!traces_.count(key)) {
    // After a restart (or a game that reached the referee at once): trace the step again.
    ML_RETURN_IF_ERROR(RunTrace(c));
    if (!traces_.count(key)) return give_up("the step could not be traced");
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  if (traces_.at(key).stage.has_value()) {
    // The witness is built once: neither the step's values nor the data it read stay.
    const DisputeDataDrop drop_data{ctx};
    TraceEntry& e = traces_.at(key);
    if (t.tile) {
      Status kept = KeepStageValues(c, key, t.step);
      if (kept.code() == StatusCode::kFailedPrecondition) return give_up(kept.message());
      ML_RETURN_IF_ERROR(kept);
    }
    Status posted = PostStageTile(c, e, ctx, action);
    DropStageValues(&e);
    return posted;
  }
  const TraceEntry& e = traces_.at(key);
  ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, ctx->Data());
  const engine::ClassificationData* train =
      EnsureDataProofs(*data, &ctx->token_pages, &ctx->data_tree);
  Result<ledger::TileWitness> w = ledger::BuildTileWitness(
      e.ctx, t, *e.step.trace, e.step.batch, train, ctx->data_tree.get(), ctx->token_pages.get());
  if (!w.ok()) return give_up(w.status().message());
  Bytes witness = ledger::EncodeTileWitness(*w);
  if (witness.size() > ledger::kMaxTileWitnessBytes) {
    return give_up("its witness is " + std::to_string(witness.size()) + " bytes, over " +
                   std::to_string(ledger::kMaxTileWitnessBytes));
  }
  const size_t bytes = witness.size();
  if (!t.tile) {
    node_->Log(CheckName(c) + ": the dispute ended at step " + std::to_string(t.step) +
               ", which follows from roots; posting its witness (RefereeTile, " +
               std::to_string(bytes) + " bytes of operator output roots)");
  } else {
    node_->Log(CheckName(c) + ": the dispute narrowed to tile " + std::to_string(t.tile_index) +
               " of operator " + std::to_string(t.operator_index) + " (" +
               e.ctx.plan.ops.at(t.operator_index - 1).name + ", block " + std::to_string(t.block) +
               ") of step " + std::to_string(t.step) + "; posting its witness (RefereeTile, " +
               std::to_string(bytes) + " bytes)");
  }
  if (outbox_->Send(action, ledger::RefereeTileTx{.task_id = c.task_id,
                                                  .index = c.index,
                                                  .bundle = {e.bundle},
                                                  .witness = {std::move(witness)}})) {
    ++node_->stats().tile_witnesses;
    node_->stats().tile_witness_bytes =
        std::max<uint64_t>(node_->stats().tile_witness_bytes, bytes);
  }
  return Status::Ok();
}

Status Disputes::PostStageTile(const CheckAssignment& c, const TraceEntry& e, TaskContext* ctx,
                               const VerifyAction& action) {
  const protocol::RefereeTask& t = c.dispute->referee;
  // Only a tile's footprint reads the data (its token pages or examples, proven); a roots witness
  // is the served commit and the trace's roots.
  static const engine::TaskData kNoData;
  std::shared_ptr<const engine::TaskData> data;
  if (t.tile) {
    ML_ASSIGN_OR_RETURN(data, ctx->Data());
  }
  Result<ledger::RefereeTileTx> tx =
      BuildStageTileTx(e.ctx, t, *e.stage, data ? *data : kNoData, c.task_id, c.index, e.bundle,
                       &ctx->token_pages, &ctx->data_tree);
  if (!tx.ok()) {
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": no witness for the stage's step " +
                 std::to_string(e.stage->commit.step) + ": " + tx.status().message());
    }
    outbox_->GiveUp(action);
    return Status::Ok();
  }
  const size_t bytes = tx->witness.bytes.size();
  node_->Log(CheckName(c) + ": the stage dispute ended at " +
             (t.tile ? "tile " + std::to_string(t.tile_index) + " of operator " +
                           std::to_string(t.operator_index) + " (" +
                           e.ctx.plan.ops.at(t.operator_index - 1).name + ", block " +
                           std::to_string(t.block) + ")"
                     : std::string(t.roots == protocol::RefereeRoots::kRootsChainEnd
                                       ? "the agreed chain end"
                                       : "input operator " + std::to_string(t.operator_index))) +
             " of stage step " + std::to_string(e.stage->commit.step) +
             "; posting its witness (RefereeTile, " + std::to_string(bytes) + " bytes" +
             (t.tile ? "" : " of the committed commit and roots") + ")");
  if (outbox_->Send(action, std::move(*tx))) {
    ++node_->stats().tile_witnesses;
    node_->stats().tile_witness_bytes =
        std::max<uint64_t>(node_->stats().tile_witness_bytes, bytes);
  }
  return Status::Ok();
}

DisputeStart Disputes::StartOf(const CheckAssignment& c) const {
  const DisputeView& d = *c.dispute;
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
  return from;
}

Result<StageCheckInput> Disputes::StageInputOf(const CheckAssignment& c, TaskContext* ctx,
                                               std::shared_ptr<const engine::TaskData>* data) {
  const uint32_t stages = ctx->bundle.net.stages;
  ML_ASSIGN_OR_RETURN(TaskInfo info, GetTask(node_->chain(), c.task_id, /*units=*/true));
  // The chain of the disputed run (the check's placement), as the ledger rules it.
  Result<std::vector<protocol::NodeId>> chain =
      ReplicaRunChain(info.units, stages, c.index, c.assignment_beacon);
  if (!chain.ok()) return chain.status().WithPrefix(CheckName(c));
  // The step's batch and its proof come from the data (kept while the page tree or data tree
  // built from it is); the whole model is never built. Without `data` none is read: a stage node
  // holds none between its units (TaskContext::ReleaseData), and reading a text corpus again
  // beside a stage it trains took a middle stage's node past the memory it offers.
  if (data != nullptr) {
    ML_ASSIGN_OR_RETURN(*data, ctx->Data());
  }
  return StageCheckInput{.task = &ctx->task,
                         .data = data != nullptr ? data->get() : nullptr,
                         .net = &ctx->bundle.net,
                         .facts = &ctx->facts,
                         .task_id = c.task_id,
                         .round = c.round,
                         .replica = c.shard / stages,
                         .stage = c.shard % stages,
                         .chain = std::move(*chain),
                         .transport = node_->deps().transport,
                         .endpoint = c.solver_endpoint};
}

Status Disputes::TraceStage(const CheckAssignment& c, TaskContext* ctx, uint64_t step,
                            TraceEntry* entry, bool keep_values) {
  // A stage unit's check has one leaf per step after its start (protocol::StageCheckLeaves): the
  // game's step s is the stage's step s - 1.
  if (step == 0) return FailedPrecondition("the game's step 0 is the stage's start, not a step");
  // The step's batch is drawn and the task's data dropped before the replay, as a verifier's check
  // does (CheckStageSteps): a trace holds the stage's state and activations, not the corpus.
  const DisputeDataDrop drop_data{ctx};
  std::map<uint64_t, engine::Batch> batches;
  StageCheckInput in;
  {
    std::shared_ptr<const engine::TaskData> data;
    ML_ASSIGN_OR_RETURN(in, StageInputOf(c, ctx, &data));
    batches.emplace(step - 1, StageStepBatch(in, step - 1));
    in.batches = &batches;
    in.data = nullptr;
  }
  ctx->ReleaseStageData();
  // A step the stage served on chain is traced from its pieces there, by every party: what the
  // stage node serves over the data plane may be nothing.
  ML_ASSIGN_OR_RETURN(in.on_chain, OnChainStepOf(c, ctx, in, step));
  // Testing only: a stage node with a faulty kernel defends its step as it computed it
  // (AgentOptions::corrupt_sent_in_trace), which takes the values of the operators it sent.
  const AgentOptions& options = node_->options();
  const bool faulty = c.dispute->defender == node_->id() && options.corrupt_sent_in_trace &&
                      options.stage_plane.corrupt_sent;
  ML_ASSIGN_OR_RETURN(TracedStageStep traced, TraceStageStep(in, step - 1, keep_values || faulty));
  if (faulty) {
    ML_ASSIGN_OR_RETURN(engine::OpTrace lie,
                        CorruptSentTrace(entry->ctx.plan, *traced.trace, traced.commit,
                                         options.stage_plane.corrupt_sent));
    traced.trace = std::make_shared<engine::OpTrace>(std::move(lie));
  }
  // Both parties answer from the stage's served step, whoever defends: a cheating stage's lie is
  // in what it committed and served, which its own trace shows as the verifier's does (but for a
  // faulty kernel's, above).
  entry->step = TracedStep{.step = static_cast<int64_t>(step),
                           .input = c.dispute->agreed,
                           .trace = traced.trace,
                           .batch = traced.batch};
  entry->stage = std::move(traced);
  return Status::Ok();
}

Status Disputes::KeepStageValues(const CheckAssignment& c, const std::string& key, uint64_t step) {
  TraceEntry& e = traces_.at(key);
  if (!e.stage.has_value() || e.step.trace->keep_values()) return Status::Ok();
  ML_ASSIGN_OR_RETURN(TaskContext * task, node_->GetTask(c.task_id));
  ML_RETURN_IF_ERROR(TraceStage(c, task, step, &e, /*keep_values=*/true));
  node_->Log(CheckName(c) + ": stage dispute at step " + std::to_string(step - 1) +
             ": traced it again, keeping its operators' values for this move of the tile phase");
  return Status::Ok();
}

Status Disputes::RunStageStepWitness(const CheckAssignment& c, TaskContext* ctx,
                                     const VerifyAction& action) {
  const DisputeView& d = *c.dispute;
  const uint32_t stages = ctx->bundle.net.stages;
  if (d.has_referee && d.referee.whole_step && d.referee.step > 0 &&
      d.referee.challenger_output == ledger::StageContinuityLeaf(d.referee.defender_output)) {
    return RunStageContinuityWitness(c, ctx, action);
  }
  if (!ledger::LedgerRulesStageStep(ctx->info.params, c.shard % stages)) {
    // Over the witness bound the one whole stage step played is a claim that the stage served
    // nothing: its evidence goes on chain in pieces. Any other ends undecided (no key rules it).
    if (d.has_referee && d.referee.whole_step && d.referee.step > 0 &&
        d.referee.challenger_output == ledger::StageUnservedLeaf(d.referee.defender_output)) {
      return RunStageServeEvidence(c, ctx);
    }
    return Status::Ok();
  }
  if (!d.has_referee || !d.referee.whole_step || d.referee.step == 0) return Status::Ok();
  ML_ASSIGN_OR_RETURN(Bytes bundle, node_->FetchBlob(ctx->info.spec_hash, {}, ""));
  const DisputeDataDrop drop_data{ctx};
  std::shared_ptr<const engine::TaskData> data;
  ML_ASSIGN_OR_RETURN(StageCheckInput in, StageInputOf(c, ctx, &data));
  Result<ledger::RefereeStageStepTx> tx =
      BuildStageStepTx(in, std::string(AsStringView(bundle)), c.index, d.referee.step - 1,
                       d.referee.defender_output, &ctx->token_pages, &ctx->data_tree);
  if (!tx.ok()) {
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": no witness for stage step " +
                 std::to_string(d.referee.step - 1) + ": " + tx.status().message());
    }
    outbox_->GiveUp(action);
    return Status::Ok();
  }
  node_->Log(CheckName(c) + ": the dispute is on stage step " + std::to_string(d.referee.step - 1) +
             "; posting its witness (RefereeStageStep, " +
             std::to_string(tx->witness.bytes.size()) + " bytes)");
  outbox_->Send(action, std::move(*tx));
  return Status::Ok();
}

Status Disputes::RunStageServeEvidence(const CheckAssignment& c, TaskContext* ctx) {
  const DisputeView& d = *c.dispute;
  const uint64_t step = d.referee.step - 1;
  std::string bundle;
  ML_ASSIGN_OR_RETURN(ledger::TileRuleContext tc, TileContextFor(*node_, c, &bundle, false));
  // One action a piece (the step, then the piece + 1), each sent once: the evidence is built
  // again only while a piece still waits.
  const uint32_t pieces = ledger::StageServePieceCount(tc.plan);
  serve_pieces_[ServeKey(c)] = pieces;
  auto action_of = [&](uint32_t piece) {
    return WitnessAction(node_->VerifyDir(c), d, {d.referee.step, uint64_t{piece} + 1});
  };
  bool waiting = false;
  for (uint32_t p = 0; p < pieces && !waiting; ++p) waiting = !outbox_->Done(action_of(p));
  if (!waiting) return Status::Ok();
  const DisputeDataDrop drop_data{ctx};
  std::shared_ptr<const engine::TaskData> data;
  ML_ASSIGN_OR_RETURN(StageCheckInput in, StageInputOf(c, ctx, &data));
  Result<std::vector<ledger::ServeStageEvidenceTx>> txs =
      BuildStageServeTxs(in, tc, bundle, c.index, step, d.referee.defender_output);
  if (!txs.ok()) {
    // The stage's own node holds its evidence: a failure here is passing (a blob store busy, a
    // restart mid-write), and giving up would lose the claim at the window's end. It tries again
    // on a later tick while the window lasts.
    if (d.defender == node_->id()) {
      return txs.status().WithPrefix(CheckName(c) + ": evidence pieces for stage step " +
                                     std::to_string(step));
    }
    // The claimant cannot fetch what the stage does not serve: an honest claim, which the
    // stage loses at its window's end.
    if (!outbox_->Failed(action_of(0))) {
      node_->Log(CheckName(c) + ": no evidence pieces for stage step " + std::to_string(step) +
                 ": " + txs.status().message());
    }
    for (uint32_t p = 0; p < pieces; ++p) outbox_->GiveUp(action_of(p));
    return Status::Ok();
  }
  uint64_t bytes = 0;
  uint32_t sent = 0;
  for (ledger::ServeStageEvidenceTx& tx : *txs) {
    const uint32_t p = tx.piece;
    bytes += tx.witness.bytes.size();
    if (outbox_->Send(action_of(p), std::move(tx))) ++sent;
  }
  if (sent > 0) {
    node_->Log(CheckName(c) + ": the claim is that stage step " + std::to_string(step) +
               " served nothing; posting its evidence (ServeStageEvidence, " +
               std::to_string(sent) + " of " + std::to_string(pieces) + " pieces, " +
               std::to_string(bytes) + " bytes in all)");
  }
  return Status::Ok();
}

Status Disputes::RunStageContinuityWitness(const CheckAssignment& c, TaskContext* ctx,
                                           const VerifyAction& action) {
  const DisputeView& d = *c.dispute;
  const uint64_t step = d.referee.step - 1;
  // The witness is two commits (or a commit and the round's start): no batch, so no data.
  ML_ASSIGN_OR_RETURN(StageCheckInput in, StageInputOf(c, ctx, /*data=*/nullptr));
  std::string bundle;
  Bytes start_state;
  std::optional<GlobalWeightsReader> global;
  if (step == 0) {
    // Step 0 starts from the stage's slice of the round's start state: the witness carries that
    // state and the bundle, for the ledger to derive the slice.
    ML_ASSIGN_OR_RETURN(Bytes text, node_->FetchBlob(ctx->info.spec_hash, {}, ""));
    bundle = std::string(AsStringView(text));
    ML_ASSIGN_OR_RETURN(start_state, node_->FetchBlob(c.start_state, {}, StateReason(c.task_id)));
    ML_ASSIGN_OR_RETURN(global, node_->StartWeights(*ctx, c.task_id, c.start_state));
  }
  Result<ledger::StageContinuityWitness> w = BuildStageContinuityWitness(
      in, step, d.referee.defender_output, bundle, start_state, global ? &*global : nullptr);
  if (!w.ok()) {
    // An honest stage's steps agree: nothing to post (the claimant loses by the deadline).
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": no continuity witness for stage step " + std::to_string(step) +
                 ": " + w.status().message());
    }
    outbox_->GiveUp(action);
    return Status::Ok();
  }
  ledger::RefereeStageStepTx tx{.task_id = c.task_id,
                                .index = c.index,
                                .witness = {ledger::EncodeStageContinuityWitness(*w)}};
  node_->Log(CheckName(c) + ": the dispute is on where stage step " + std::to_string(step) +
             " starts; posting its continuity witness (RefereeStageStep, " +
             std::to_string(tx.witness.bytes.size()) + " bytes)");
  outbox_->Send(action, std::move(tx));
  return Status::Ok();
}

Status Disputes::RunStepWitness(const CheckAssignment& c) {
  const DisputeView& d = *c.dispute;
  if (d.has_referee && d.referee.tile) return RunTileWitness(c);
  if (d.has_referee && d.referee.roots != protocol::RefereeRoots::kRootsNone) {
    // A whole step the ledger rules from roots (the chain end agreed, an operator of the input
    // state): a RefereeTile with the operator output roots of this node's trace of the step,
    // whatever the model's size. An operator without a footprint goes on to the whole step.
    const std::string key = TraceKey(c, d.referee.step);
    if (!traces_.count(key)) ML_RETURN_IF_ERROR(RunTrace(c));
    auto it = traces_.find(key);
    // A stage step's roots task: its input operators (received or of the state) and its chain
    // end are all ruled from the committed commit's roots (ledger::RuleStageRoots).
    if (it != traces_.end() &&
        (it->second.stage.has_value() || ledger::RulesFromRoots(it->second.ctx.plan, d.referee))) {
      return RunTileWitness(c);
    }
  }
  const VerifyAction action = WitnessAction(node_->VerifyDir(c), d, {d.referee.step});
  if (outbox_->Done(action)) return Status::Ok();
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  // A pipeline stage's step: the ledger replays it from the whole stage step's witness
  // (RefereeStageStep), when the task has a data root and the stage fits a witness.
  if (ctx->bundle.net.stages > 1) return RunStageStepWitness(c, ctx, action);
  // Only a task with a data root over examples on the ledger has its whole steps refereed by the
  // ledger itself.
  if (ctx->info.params.data_root.IsZero() || ctx->info.params.data_page_tokens != 0) {
    return Status::Ok();
  }
  if (!ctx->data_tree) {
    ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, ctx->Data());
    if (data->tokens) return Status::Ok();
    ctx->data_tree = std::make_unique<engine::DataTree>(data->train);
  }
  ML_ASSIGN_OR_RETURN(Bytes bundle, node_->FetchBlob(ctx->info.spec_hash, {}, ""));
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, c.task_id, c.start_state));
  const UnitWork work = protocol::UnitWorkOf(ctx->bundle.net, ctx->facts, c.round, c.shard);
  const DisputeStart from = StartOf(c);
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  Result<BuiltStepWitness> w = BuildStepWitness(trainer, start.weights, work, d.referee,
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
  outbox_->Send(action,
                ledger::RefereeStepTx{
                    .task_id = c.task_id, .index = c.index, .witness = {std::move(witness)}});
  return Status::Ok();
}

}  // namespace meshlearn::node
