#include "solver.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/verification.h"
#include "journal.h"

namespace meshlearn::node {

namespace {

std::string ProgressPath(const std::string& dir) { return JoinPath(dir, "progress.json"); }
std::string DonePath(const std::string& dir) { return JoinPath(dir, "done.json"); }
std::string CommitPath(const std::string& dir) { return JoinPath(dir, "commit.json"); }

}  // namespace

std::string Solver::Name(const UnitAssignment& a) const {
  return "unit " + a.task_id.ShortHex() + "/" + std::to_string(a.index) + " r" +
         std::to_string(a.round) + " s" + std::to_string(a.shard);
}

std::vector<const UnitAssignment*> Solver::Pending(const NodeWork& work) {
  std::vector<const UnitAssignment*> units;
  for (const UnitAssignment& u : work.units) {
    auto key = std::make_pair(u.task_id, u.index);
    if (commits_.count(key)) continue;
    if (committed_.erase(key) > 0) {
      // Our commit of this unit was included, yet it is assigned again: its round was re-run
      // (ReportUnavailable). The stored result is committed again (same weights, same bits)
      // without training.
      node_->Log("task " + u.task_id.ShortHex() + " unit " + std::to_string(u.index) +
                 ": assigned again after its round was re-run");
    }
    units.push_back(&u);
  }
  std::sort(units.begin(), units.end(), [](const UnitAssignment* a, const UnitAssignment* b) {
    return std::tie(a->deadline_height, a->task_id, a->index) <
           std::tie(b->deadline_height, b->task_id, b->index);
  });
  return units;
}

Solver::UnitState Solver::StateOf(const UnitAssignment& a) const {
  const auto key = std::make_pair(a.task_id, a.index);
  if (commits_.count(key)) return UnitState::kCommitting;
  if (committed_.count(key)) return UnitState::kCommitted;
  const std::string dir = node_->UnitDir(a.task_id, a.index);
  Result<journal::UnitDone> done = journal::ReadJournal<journal::UnitDone>(node_->env(), DonePath(dir));
  if (done.ok() && done->start_state == a.start_state) return UnitState::kTrained;
  Result<journal::UnitProgress> p =
      journal::ReadJournal<journal::UnitProgress>(node_->env(), ProgressPath(dir));
  if (p.ok() && p->start_state == a.start_state) return UnitState::kTraining;
  return UnitState::kNew;
}

bool Solver::OnOutcome(const TxOutcome& o) {
  for (auto it = commits_.begin(); it != commits_.end(); ++it) {
    if (it->second.txid != o.id) continue;
    if (o.ok) {
      ++node_->stats().commits_ok;
      committed_.insert(it->first);
      // The ledger took that secret: the next commit binds the one after it, even before the
      // next node_work says so (a unit that finishes while training paused for a replay commits
      // without a new node_work; it used to reuse the index and be refused).
      if (it->second.secret_index > 0) {
        next_secret_index_ = std::max(next_secret_index_, it->second.secret_index + 1);
      }
    } else {
      ++node_->stats().commits_failed;
    }
    commits_.erase(it);
    return true;
  }
  return false;
}

// ---- Running a unit ------------------------------------------------------------------------

Status Solver::Run(const UnitAssignment& a) {
  skipped_ = false;
  paused_ = false;
  const std::string dir = node_->UnitDir(a.task_id, a.index);
  // Trained before (a crash after the delta was stored, a failed commit, or its round re-ran):
  // commit again, with a new secret (and forced-error draw).
  if (StateOf(a) == UnitState::kTrained) {
    ML_ASSIGN_OR_RETURN(journal::UnitDone done,
                        journal::ReadJournal<journal::UnitDone>(node_->env(), DonePath(dir)));
    ML_RETURN_IF_ERROR(Commit(a, done));
    node_->Log(Name(a) + ": committing the stored result again");
    return Status::Ok();
  }
  const AgentOptions& options = node_->options();
  if (options.max_units > 0 && units_taken_ >= options.max_units) {
    skipped_ = true;
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(a.task_id));
  if (!FitsInMemory(a, *ctx)) {
    skipped_ = true;
    return Status::Ok();
  }
  const NetworkSpec& net = ctx->bundle.net;
  if (a.round >= net.rounds || a.shard >= net.units_per_round) {
    return InvalidArgument(Name(a) + ": round/shard outside the task's " +
                           std::to_string(net.rounds) + " x " +
                           std::to_string(net.units_per_round));
  }
  ML_ASSIGN_OR_RETURN(GlobalState start, node_->StartState(*ctx, a.task_id, a.start_state));
  const UnitWork work = protocol::UnitWorkOf(net, ctx->facts, a.round, a.shard);
  ML_RETURN_IF_ERROR(node_->book().AddUnit(a.task_id, a.index, a.round));  // before any file
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(dir));
  std::optional<UnitResume> resume = LoadProgress(a, work, dir);

  ++units_taken_;
  node_->Log(Name(a) +
             (resume ? ": resuming at step " + std::to_string(resume->step) : ": training") +
             " (" + std::to_string(net.inner_steps) + " steps)");
  Result<UnitOutcome> ran = Train(a, ctx, start, work, resume ? &*resume : nullptr);
  if (!ran.ok()) {
    if (paused_) {
      --units_taken_;  // the same unit, taken again when it resumes
      node_->Log(Name(a) + ": paused at a checkpoint (" + ran.status().message() + ")");
      return Status::Ok();
    }
    if (options.should_stop && options.should_stop()) crashed_ = true;  // stop Tick now
    return ran.status();
  }
  if (resume) ++node_->stats().units_resumed;
  return Finish(a, ctx, *ran);
}

uint64_t Solver::MemoryBytes() const {
  const AgentOptions& options = node_->options();
  const uint64_t registered_memory = options.capabilities.memory_bytes;
  return options.memory_limit_bytes > 0 ? std::min(options.memory_limit_bytes, registered_memory)
                                        : registered_memory;
}

uint64_t Solver::NeedBytes(const UnitAssignment& a, const TaskContext& ctx) {
  // The number the ledger placed the unit by: a stage unit's is its stage's (PlaceStages).
  const std::vector<uint64_t>& stage_needs = ctx.info.params.stage_memory_bytes;
  const bool staged = a.stage.has_value() && a.stage->stage < stage_needs.size();
  return staged ? stage_needs[a.stage->stage] : ctx.memory_need;
}

bool Solver::FitsInMemory(const UnitAssignment& a, const TaskContext& ctx) {
  const uint64_t registered_memory = node_->options().capabilities.memory_bytes;
  const uint64_t memory = MemoryBytes();
  const std::vector<uint64_t>& stage_needs = ctx.info.params.stage_memory_bytes;
  const bool staged = a.stage.has_value() && a.stage->stage < stage_needs.size();
  const uint64_t need = NeedBytes(a, ctx);
  if (need <= memory) return true;
  ++node_->stats().units_refused;
  std::string why = Name(a) + (staged ? " (stage " + std::to_string(a.stage->stage) + ")" : "") +
                    ": refused: needs " + std::to_string(need) +
                    " bytes of memory, this node can use " + std::to_string(memory) +
                    "; it expires at its deadline (block " + std::to_string(a.deadline_height) +
                    ") and goes to another node";
  if (refused_logged_[a.task_id] != why) node_->Log(why);
  refused_logged_[a.task_id] = why;
  if (memory < registered_memory && memory_reported_ != memory) {
    // The ledger still believes the registered memory: tell it, so that the scheduler stops
    // assigning this node units it cannot run.
    memory_reported_ = memory;
    reregister_ = true;  // the agent sends UpdateNode with the lower value
    node_->Log("reporting memory_bytes = " + std::to_string(memory) + " to the ledger (registered " +
               std::to_string(registered_memory) + ")");
  }
  return false;
}

std::optional<UnitResume> Solver::LoadProgress(const UnitAssignment& a, const UnitWork& work,
                                               const std::string& dir) {
  Result<journal::UnitProgress> p =
      journal::ReadJournal<journal::UnitProgress>(node_->env(), ProgressPath(dir));
  if (!p.ok() || p->start_state != a.start_state || p->stream != work.stream) return std::nullopt;
  Result<engine::TrainState> st = engine::LoadCheckpoint(node_->env(), JoinPath(dir, p->checkpoint));
  if (!st.ok()) {
    node_->Log(Name(a) + ": ignoring an unreadable checkpoint; starting over");
    return std::nullopt;
  }
  UnitResume r;
  r.step = p->step;
  r.loss_sum = std::bit_cast<double>(p->loss_sum_bits);
  r.state_hashes = std::move(p->hashes);
  r.state = std::move(*st);
  return r;
}

Result<UnitOutcome> Solver::Train(const UnitAssignment& a, TaskContext* ctx,
                                  const GlobalState& start, const UnitWork& work,
                                  UnitResume* resume) {
  const AgentOptions& options = node_->options();
  const NetworkSpec& net = ctx->bundle.net;
  const Clock* clock = node_->deps().clock;
  const std::string dir = node_->UnitDir(a.task_id, a.index);
  const std::string name = Name(a);
  const double factor = options.speed_factor;
  int64_t step_start = clock ? clock->MonotonicMicros() : 0;
  UnitRunOptions run;
  run.resume = resume;  // consumed by the run
  run.on_step = [&](int64_t step, float loss) {
    if (factor < 1.0 && options.sleep && clock) {
      int64_t took = clock->MonotonicMicros() - step_start;
      options.sleep(static_cast<int64_t>(static_cast<double>(took) * (1.0 / factor - 1.0)));
    }
    if (clock) step_start = clock->MonotonicMicros();
    if (step == net.inner_steps ||
        (net.checkpoint_interval > 0 && step % net.checkpoint_interval == 0)) {
      node_->Log(name + ": step " + std::to_string(step) + "/" + std::to_string(net.inner_steps) +
                 " loss " + std::to_string(loss));
    }
  };
  run.on_checkpoint = [&](int64_t step, engine::TrainState& state,
                          const std::vector<Hash256>& hashes, double loss_sum) -> Status {
    const std::string ckpt = "ckpt-" + std::to_string(step) + ".safetensors";
    ML_RETURN_IF_ERROR(engine::SaveCheckpoint(node_->env(), JoinPath(dir, ckpt), state));
    const journal::UnitProgress p{.start_state = a.start_state,
                                  .stream = work.stream,
                                  .step = step,
                                  .loss_sum_bits = std::bit_cast<uint64_t>(loss_sum),
                                  .checkpoint = ckpt,
                                  .hashes = hashes};
    ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), ProgressPath(dir), p));
    // Every checkpoint stays until the unit's round is final (PinKeeper): the verifier replays
    // k-step segments from them.
    if (options.after_checkpoint) {
      Status hook = options.after_checkpoint(a.task_id, a.index, step);
      if (!hook.ok()) {
        crashed_ = true;
        return hook;
      }
    }
    if (pause_ && step < net.inner_steps) {
      Status pause = pause_();
      if (!pause.ok()) {
        paused_ = true;
        return pause;
      }
    }
    return Status::Ok();
  };
  run.should_stop = options.should_stop;
  if (CheatsAsSolver(options.adversary)) return TrainAsAdversary(a, ctx, start, work, run);
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  UnitExecutor executor(trainer);
  return executor.Run(start.weights, work, run);
}

Result<UnitOutcome> Solver::TrainAsAdversary(const UnitAssignment& a, TaskContext* ctx,
                                             const GlobalState& start, const UnitWork& work,
                                             const UnitRunOptions& run) {
  const Adversary adversary = node_->options().adversary;
  AdversaryInputs in;
  std::vector<float> peer;
  if (adversary == Adversary::kCopy) {
    Result<std::vector<float>> got = PeerDelta(a, ctx->facts.num_params);
    if (got.ok()) peer = std::move(*got);
    node_->Log(Name(a) + ": adversary copy: " +
               (got.ok() ? std::string("copying another solver's delta")
                         : "nothing to copy (" + got.status().message() + "), running lazily"));
  }
  in.peer_delta = peer;
  auto earlier = last_outcome_.find(a.task_id);
  if (earlier != last_outcome_.end()) in.earlier = &earlier->second;
  in.last_round = a.round + 1 == ctx->bundle.net.rounds;
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  Result<UnitOutcome> ran = RunAdversaryUnit(adversary, trainer, start.weights, work, run, in);
  if (ran.ok() && adversary == Adversary::kStale) last_outcome_[a.task_id] = *ran;
  return ran;
}

Result<std::vector<float>> Solver::PeerDelta(const UnitAssignment& a, uint64_t num_params) {
  ML_ASSIGN_OR_RETURN(TaskInfo t, GetTask(node_->chain(), a.task_id, /*units=*/true));
  for (const UnitRecord& u : t.units) {
    if (u.round != a.round || u.index == a.index ||
        (u.status != ledger::WorkUnitStatus::kCommitted &&
         u.status != ledger::WorkUnitStatus::kVerified) ||
        u.assignee == node_->id() || u.result_hash.IsZero()) {
      continue;
    }
    Result<Bytes> blob = node_->FetchBlob(u.result_hash, {}, DeltaReason(a.task_id, a.round));
    if (!blob.ok()) continue;
    Result<std::vector<float>> d = DecodeDelta(*blob, num_params);
    if (d.ok()) return d;
  }
  return NotFound("no other solver has committed a unit of round " + std::to_string(a.round));
}

Status Solver::Finish(const UnitAssignment& a, TaskContext* ctx, const UnitOutcome& out) {
  const std::string dir = node_->UnitDir(a.task_id, a.index);
  // The final state (after step H) is kept and served like the other checkpoints, until the
  // round is final: with it anyone checks that the committed result is its delta
  // (docs/verification.md "Result binding"). Written before done.json, which marks the unit done.
  ML_ASSIGN_OR_RETURN(engine::Trainer * trainer, ctx->Trainer());
  ML_RETURN_IF_ERROR(engine::SaveCheckpoint(
      node_->env(),
      JoinPath(dir, "ckpt-" + std::to_string(ctx->bundle.net.inner_steps) + ".safetensors"),
      trainer->state()));
  ML_ASSIGN_OR_RETURN(net::BlobId delta_id, node_->deps().store->Put(EncodeDelta(out.delta)));
  ML_RETURN_IF_ERROR(node_->book().Add(delta_id.hash, DeltaReason(a.task_id, a.round)));
  const uint64_t loss_micros =
      std::isfinite(out.mean_loss) && out.mean_loss > 0
          ? static_cast<uint64_t>(std::llround(static_cast<double>(out.mean_loss) * 1e6))
          : 0;
  const journal::UnitDone done{.start_state = a.start_state,
                               .result = delta_id.hash,
                               .commitment = out.commitment,
                               .loss_micros = loss_micros,
                               .round = a.round,
                               .shard = a.shard,
                               .leaves = out.state_hashes};
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), DonePath(dir), done));
  ML_RETURN_IF_ERROR(Commit(a, done));
  ++node_->stats().units_completed;
  node_->Log(Name(a) + ": done, loss " + std::to_string(out.mean_loss) + ", delta " +
             delta_id.ShortHex() + " committed");
  return Status::Ok();
}

// ---- Committing and serving ----------------------------------------------------------------

Status Solver::Commit(const UnitAssignment& a, const journal::UnitDone& done) {
  const std::string dir = node_->UnitDir(a.task_id, a.index);
  if (done.leaves.empty()) return DataLoss(DonePath(dir) + " has no leaves");
  journal::UnitCommit commit{.commitment = done.commitment, .leaves = done.leaves};
  if (node_->VerificationOn()) {
    ML_RETURN_IF_ERROR(secrets_.Load());
    if (next_secret_index_ == 0) {
      return FailedPrecondition("the ledger's node_work gives no next_secret_index");
    }
    // The ledger binds the node's next secret to every commit, in order: ours in flight first.
    commit.secret_index = next_secret_index_ + commits_.size();
    if (commit.secret_index > protocol::kSecretChainLength) {
      return FailedPrecondition("this node used all " +
                                std::to_string(protocol::kSecretChainLength) +
                                " secrets of its chain; leave and rejoin to register a new one");
    }
    const Hash256 secret = secrets_.Element(commit.secret_index);
    const protocol::UnitId uid{a.task_id, a.round, a.shard};
    if (protocol::IsForcedError(secret, a.assignment_beacon, uid,
                                node_->chain_params().forced_error_per_million)) {
      // Truebit: a deliberately wrong commitment that honest verifiers must catch. The delta
      // stays honest; the true start leaf lets anyone check, once the secret is out, that the
      // error was the forced one.
      commit.forced = true;
      commit.commitment = protocol::ForcedCommitment(secret, uid, done.leaves[0], done.leaves.size());
      for (uint64_t i = 1; i < commit.leaves.size(); ++i) {
        commit.leaves[i] = protocol::ForcedLeaf(secret, uid, i);
      }
      ++node_->stats().forced_errors;
      node_->Log("unit " + a.task_id.ShortHex() + "/" + std::to_string(a.index) +
                 ": drawn for a forced error (secret " + std::to_string(commit.secret_index) +
                 "); committing the forced commitment");
    }
  }
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), CommitPath(dir), commit));
  ML_RETURN_IF_ERROR(Publish(a.task_id, a.index, commit));
  ML_ASSIGN_OR_RETURN(Hash256 txid, node_->tx().Send(ledger::CommitUnitTx{
                                        .task_id = a.task_id,
                                        .index = a.index,
                                        .node_id = node_->id(),
                                        .result_hash = done.result,
                                        .commitment = commit.commitment,
                                        .loss_micros = done.loss_micros,
                                        .secret_index = commit.secret_index,
                                        .leaves = commit.leaves}));
  commits_[std::make_pair(a.task_id, a.index)] = {txid, commit.secret_index};
  return Status::Ok();
}

Status Solver::Publish(const Hash256& task, uint32_t index, const journal::UnitCommit& commit) {
  UnitManifest m;
  m.task_id = task;
  m.index = index;
  m.leaves = commit.leaves;
  std::vector<std::string> paths;
  // A forced unit serves no checkpoint: none hashes to a forced leaf.
  if (!commit.forced) {
    const std::string dir = node_->UnitDir(task, index);
    Result<std::vector<std::string>> names = node_->env()->ListDir(dir);
    if (names.ok()) {
      for (const std::string& n : *names) {
        if (!n.starts_with("ckpt-") || !n.ends_with(".safetensors")) continue;
        const int64_t step = std::strtoll(n.c_str() + 5, nullptr, 10);
        Result<uint64_t> size = node_->env()->FileSize(JoinPath(dir, n));
        if (step <= 0 || !size.ok()) continue;
        m.checkpoints.push_back({.step = step, .size = *size});
        paths.push_back(JoinPath(dir, n));
      }
    }
  }
  node_->unit_service().Publish(std::move(m), std::move(paths));
  return Status::Ok();
}

void Solver::PlayCheck(const CheckAssignment& c) {
  if (!node_->unit_service().Serves(c.task_id, c.index)) {
    // After a restart: serve again what was committed.
    Result<journal::UnitCommit> commit = journal::ReadJournal<journal::UnitCommit>(
        node_->env(), CommitPath(node_->UnitDir(c.task_id, c.index)));
    if (commit.ok() && commit->commitment == c.commitment) {
      Status s = Publish(c.task_id, c.index, *commit);
      if (!s.ok()) node_->Log(CheckName(c) + ": cannot serve the committed leaves: " + s.message());
    }
  }
  if (c.stage == protocol::CheckStage::kCheckRevealVerdicts) RevealSecret(c, /*late=*/false);
  // Missed the reveal window (a crash, a long job) and a verifier's mismatch started a dispute:
  // the ledger still takes the secret, and a forced unit then settles as the forced error it is
  // (protocol::UnitCheck::OnSecretRevealed). Once; a secret already revealed is refused, which
  // changes nothing.
  const VerifyAction in_time = SecretAction(c, /*late=*/false);
  if (c.stage == protocol::CheckStage::kCheckDisputed && c.dispute &&
      c.dispute->defender == node_->id() &&
      (!outbox_->Sent(in_time) || outbox_->Failed(in_time))) {
    RevealSecret(c, /*late=*/true);
  }
}

VerifyAction Solver::SecretAction(const CheckAssignment& c, bool late) const {
  return {.dir = node_->VerifyDir(c),
          .kind = VerifyAction::Kind::kSecret,
          .detail = {c.secret_index, late ? 1u : 0u}};
}

void Solver::RevealSecret(const CheckAssignment& c, bool late) {
  const VerifyAction action = SecretAction(c, late);
  if (outbox_->Sent(action) || c.secret_index == 0 ||
      c.secret_index > protocol::kSecretChainLength) {
    return;
  }
  if (Status s = secrets_.Load(); !s.ok()) {
    if (!outbox_->Failed(action)) {
      node_->Log(CheckName(c) + ": cannot reveal the secret: " + s.message());
    }
    outbox_->GiveUp(action);
    return;
  }
  // The true state hash after step 0: the ledger checks a forced unit's commitment with it (a
  // forced unit's served leaves keep the true first one).
  Hash256 start_leaf;
  const std::string dir = node_->UnitDir(c.task_id, c.index);
  Result<journal::UnitCommit> commit =
      journal::ReadJournal<journal::UnitCommit>(node_->env(), CommitPath(dir));
  if (commit.ok() && !commit->leaves.empty()) {
    start_leaf = commit->leaves.front();
  } else if (Result<journal::UnitDone> done =
                 journal::ReadJournal<journal::UnitDone>(node_->env(), DonePath(dir));
             done.ok() && !done->leaves.empty()) {
    start_leaf = done->leaves.front();
  }
  ledger::RevealSecretTx tx{.task_id = c.task_id,
                            .index = c.index,
                            .node_id = node_->id(),
                            .secret = secrets_.Element(c.secret_index),
                            .start_leaf = start_leaf};
  // A stage unit drawn for a forced error reveals the forced step commits it committed, which the
  // ledger checks (the Stager kept them: docs/verification.md, "Forced errors for stage units").
  // Only when drawn: the ledger refuses them with any other secret.
  const std::string forced = ForcedStageCommitsPath(*node_, c.task_id, c.index, c.secret_index);
  const bool drawn = protocol::IsForcedError(tx.secret, c.assignment_beacon,
                                             protocol::UnitId{c.task_id, c.round, c.shard},
                                             node_->chain_params().forced_error_per_million);
  if (drawn && node_->env()->FileExists(forced)) {
    Result<std::string> bytes = node_->env()->ReadFile(forced);
    if (!bytes.ok()) {
      if (!outbox_->Failed(action)) {
        node_->Log(CheckName(c) + ": cannot reveal the secret: " + bytes.status().message());
      }
      outbox_->GiveUp(action);
      return;
    }
    tx.forced_commits.bytes.assign(bytes->begin(), bytes->end());
  }
  if (outbox_->Send(action, std::move(tx))) {
    ++node_->stats().secrets_revealed;
  }
}

}  // namespace meshlearn::node
