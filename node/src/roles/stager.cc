#include "stager.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "meshlearn/engine/step_replay.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/stage_resume.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/verification.h"
#include "secrets.h"

namespace meshlearn::node {

Stager::~Stager() {
  // A node that stops (its daemon shuts down, or a test kills it) stops its stage at once rather
  // than at the step's deadline: its neighbours see it gone either way.
  if (run_ && run_->plane) run_->plane->Cancel();
  if (run_ && run_->thread.joinable()) run_->thread.join();
}

Stager::Key Stager::KeyOf(const UnitAssignment& a) {
  return {a.task_id, a.index, a.assignment_beacon};
}

std::string Stager::Name(const UnitAssignment& a) {
  return "stage unit " + a.task_id.ShortHex() + "/" + std::to_string(a.index) + " r" +
         std::to_string(a.round) + " replica " + std::to_string(a.stage->replica) + " stage " +
         std::to_string(a.stage->stage);
}

std::vector<const UnitAssignment*> Stager::Pending(const NodeWork& work) const {
  std::vector<const UnitAssignment*> out;
  for (const UnitAssignment& u : work.units) {
    if (!u.stage) continue;
    const Key key = KeyOf(u);
    if (commits_.count(key) || committed_.count(key)) continue;
    if (run_ && run_->a.task_id == u.task_id && run_->a.index == u.index) continue;
    out.push_back(&u);
  }
  return out;
}

Status Stager::Start(const UnitAssignment& a) {
  CHECK(a.stage.has_value() && !running());
  const UnitAssignment::Stage& slot = *a.stage;
  for (size_t s = 0; s < slot.chain.size(); ++s) {
    if (slot.chain[s] == protocol::NodeId{} || slot.endpoints[s].empty()) {
      return Status::Ok();  // a stage of the chain waits for a node: started when it has one
    }
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(a.task_id));
  const NetworkSpec& net = ctx->bundle.net;
  if (a.round >= net.rounds || slot.replica >= net.units_per_round || slot.stage >= net.stages ||
      slot.chain.size() != net.stages) {
    return InvalidArgument(Name(a) + ": round/replica/stage outside the task's " +
                           std::to_string(net.rounds) + " rounds x " +
                           std::to_string(net.units_per_round) + " replicas x " +
                           std::to_string(net.stages) + " stages");
  }
  if (slot.chain[slot.stage] != node_->id()) {
    return InvalidArgument(Name(a) + ": the unit's chain places node " +
                           slot.chain[slot.stage].ShortHex() + " on its stage, not this node");
  }
  // The replica trains what the unsplit unit of shard `replica` would (its stream, inner rate,
  // batches): protocol::UnitWorkOf, the one derivation `meshlearn diloco` uses.
  const UnitWork work = protocol::UnitWorkOf(net, ctx->facts, a.round, slot.replica);
  const engine::TaskSpec& task = ctx->task;
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(task, static_cast<int>(net.stages), net.cut));
  auto run = std::make_unique<Run>();
  run->a = a;
  run->ctx = ctx;
  // A resume is tried on an assignment's first run only: a run after it failed trains from the
  // round's start, so that stages that disagreed once converge there (stage_resume.h).
  run->ask = started_.count(KeyOf(a)) == 0;
  std::optional<Held> held = std::exchange(held_, std::nullopt);
  if (held && run->ask && ResumesOn(*held, a)) {
    run->kept = true;
    run->stage = std::move(held->stage);  // null when it was freed: loaded below
    run->progress = std::move(held->progress);
  } else if (held && !(held->a.task_id == a.task_id && held->a.index == a.index &&
                       KeyOf(held->a) != KeyOf(a))) {
    // Not resumed by this run, and not made void by it (another assignment of its unit that does
    // not resume from it trains the unit from the round's start): a run of the same assignment
    // again, on the chain its run failed on (a step deadline that fired while its lost neighbour
    // was not yet replaced: a fresh assignment that replaces it resumes from the held steps), or
    // another unit's run. Kept, its stage freed before this run's is built: its stage at the
    // failed step's start is that step's checkpoint in the evidence, loaded when a run resumes
    // from it (as the run's start weights are built again then).
    held->stage.reset();
    held->progress.start = {};
    held_ = std::move(held);
  }
  held.reset();  // not this assignment's: freed before the stage is built again
  // Only the stage is built, never the whole model (its trainer: ctx->Trainer()): the unit's
  // batches come from its data stream, and the stage's weights from their slices of the round's
  // global weights, read from the state blob's chunks that hold them (neither the whole state nor
  // the outer momentum, which only an aggregator needs, is ever in memory). Everything is taken
  // here, on the tick thread, before the unit's thread starts.
  {
    // The data is read for the batches and not held while the stage trains (ReleaseData: a
    // middle stage reads no token of it, the first and last only their few batches).
    ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, ctx->Data());
    engine::DataStream stream(task, *data, work.stream);
    for (int64_t s = 0; s < work.inner_steps; ++s) run->batches.push_back(stream.BatchForStep(s));
  }
  ctx->ReleaseData();
  if (!run->stage) {
    ML_ASSIGN_OR_RETURN(GlobalWeightsReader start,
                        node_->StartWeights(*ctx, a.task_id, a.start_state));
    ML_ASSIGN_OR_RETURN(
        run->stage, StageFromGlobal(task, cut, static_cast<int>(slot.stage), start, work.lr_scale));
  }
  if (run->kept && run->progress.start.empty()) {
    // A held run whose stage was freed: its start weights are the stage just built, and its stage
    // at the failed step's start that step's checkpoint. One that does not load (withdrawn, or
    // not the state its last step ended in) resumes nothing: the run offers no steps.
    Status loaded = LoadHeldStage(*run);
    if (!loaded.ok()) {
      node_->Log(Name(a) + ": its held steps are not resumed: " + loaded.message());
      run->kept = false;
      run->progress = {};
    }
  }
  run->dropout_seed = engine::DropoutSeed(task.seed, work.stream);
  StageContext sc;
  sc.task = a.task_id;
  sc.round = a.round;
  sc.replica = slot.replica;
  sc.chain = slot.chain;
  sc.tile_cols = ledger::StageTileCols(task.model);
  sc.tile_rows = ledger::StageTileRows(task.model, task.batch_size, task.micro_batches);
  // No checkpoint replication on the network: the replica's resume at the step where it lost a
  // node recomputes the lost stage from its neighbours' tensors and reads no kept checkpoint
  // (docs/protocol.md, "The resume step", says why), and a keeper holds its neighbour's
  // checkpoint in memory beside its own stage (tens of MB for a 10M GPT stage), which the
  // ledger's placement by stage_memory_bytes does not count.
  // The tensors a stage sends are kept and served with its steps' evidence (keep_sent) while the
  // run lasts, beside those it received: what the node that replaces a lost neighbour re-runs
  // that neighbour's steps from. The plane holds one step's (StageTerms::step_tensor_bytes,
  // counted in stage_memory_bytes); the evidence keeps them in files (StageEvidence::Publish).
  StagePlaneOptions plane_options = node_->options().stage_plane;
  plane_options.checkpoint_every = 0;
  plane_options.keep_sent = true;
  run->plane = std::make_unique<StagePlane>(sc, static_cast<int>(slot.stage), node_->key(),
                                            node_->deps().transport, plane_options);
  run->plane->SetChain(slot.chain, slot.endpoints);
  // What the run holds at its start, answered to its neighbours ("stage.resume") from the moment
  // its plane is attached.
  run->plane->OfferResume(run->progress.commits.size());
  run->attached = host_.Attach(run->plane.get());
  started_.insert(KeyOf(a));
  // The chain is named so that a run on a replaced node's new chain can be told from its stale
  // one in the log.
  std::string chain;
  for (const protocol::NodeId& n : slot.chain) chain += (chain.empty() ? "" : " ") + n.ShortHex();
  node_->Log(Name(a) + ": training " + std::to_string(work.inner_steps) +
             " steps with its neighbours (chain " + chain + ")" +
             (run->kept ? ", holding steps 0.." + std::to_string(run->progress.commits.size() - 1) +
                              " of its run before"
                        : "") +
             MemoryNote());
  Run* r = run.get();
  run_ = std::move(run);
  // Every step's evidence is served as it ends (StageEvidence: a verifier of the stage unit
  // replays from it): its start's checkpoint is written to a file before the step.
  StageRunHooks hooks;
  StageEvidence* evidence = &evidence_;
  const StageStepRef at{
      .task = a.task_id, .round = a.round, .replica = slot.replica, .stage = slot.stage};
  hooks.checkpoint = [evidence, at](uint64_t step, engine::TrainState& state) {
    StageStepRef ref = at;
    ref.step = step;
    return evidence->SaveCheckpoint(ref, state);
  };
  hooks.publish = [evidence](const protocol::StageStepCommit& commit,
                             std::map<Hash256, Bytes> received) {
    return evidence->Publish(commit, std::move(received));
  };
  SetStageAdversary(node_->options().adversary, work, &hooks);
  hooks.malformed_result = node_->options().malformed_stage_result;
  r->thread = std::thread([r, hooks = std::move(hooks), evidence, plane_options,
                           key = &node_->key(), transport = node_->deps().transport,
                           endpoints = slot.endpoints, earlier = slot.earlier] {
    const auto t0 = std::chrono::steady_clock::now();
    // The step it trains from: the replica's resume, agreed with its neighbours (stage_resume.h).
    Result<uint64_t> from =
        StartStageRun(*r->stage, *r->plane, *key, transport, endpoints, r->batches, r->dropout_seed,
                      hooks, evidence, plane_options, r->ask, earlier, &r->progress);
    if (from.ok()) {
      r->from = *from;
      r->out = RunStageUnit(*r->stage, *r->plane, r->batches, r->dropout_seed, hooks, &r->progress);
      r->whole = r->out.ok();
    } else {
      r->out = from.status().WithPrefix("no resume");
      r->progress = {};  // a resume tried and not made: its next run is from the round's start
    }
    // A failed run's plane stays attached until the next tick collects it; until then it answers
    // pushes Unavailable, so that its neighbours retry them into the unit's next run instead of
    // having this one take them and drop them with it.
    if (!r->out.ok()) r->plane->Cancel();
    r->run_us = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    r->done.store(true, std::memory_order_release);
  });
  return Status::Ok();
}

Status Stager::LoadHeldStage(Run& run) {
  const uint64_t k = run.progress.commits.size();
  CHECK_GT(k, 0u);
  const StageStepRef ref{.task = run.a.task_id,
                         .round = run.a.round,
                         .replica = run.a.stage->replica,
                         .stage = run.a.stage->stage,
                         .step = k};
  ML_ASSIGN_OR_RETURN(engine::TrainState state, evidence_.PendingCheckpointState(ref));
  const Hash256 want = run.progress.commits[k - 1].state_after;
  if (state.step != static_cast<int64_t>(k) || engine::StateHash(state) != want) {
    return DataLoss("the checkpoint of " + ref.ToString() + " is at step " +
                    std::to_string(state.step) + " and not the state " + want.ShortHex() +
                    " its step " + std::to_string(k - 1) + " ended in");
  }
  std::vector<float> start = StageFlatParams(*run.stage);
  ML_RETURN_IF_ERROR(run.stage->Restore(std::move(state)));
  run.progress.start = std::move(start);
  return Status::Ok();
}

bool Stager::ResumesOn(const Held& held, const UnitAssignment& a) {
  const UnitAssignment& b = held.a;
  if (!a.stage || !b.stage || a.task_id != b.task_id || a.index != b.index || a.round != b.round ||
      a.start_state != b.start_state || a.stage->replica != b.stage->replica ||
      a.stage->stage != b.stage->stage || a.stage->chain.size() != b.stage->chain.size()) {
    return false;
  }
  uint32_t replaced = 0;
  for (size_t s = 0; s < a.stage->chain.size(); ++s) {
    if (a.stage->chain[s] == b.stage->chain[s]) continue;
    if (s == a.stage->stage) return false;
    ++replaced;
  }
  return replaced == 1;
}

void Stager::StopForReplay(const std::string& why) {
  if (!run_ || run_->cancelled) return;
  node_->Log(Name(run_->a) + ": stopping it: " + why);
  run_->plane->Cancel();
  run_->cancelled = true;
  run_->stopped_for_replay = true;
}

Status Stager::Collect(const NodeWork& work) {
  // A held run whose unit is no longer this node's: nothing resumes from it, nor from the tensors
  // it sent (its received ones stay served until the pin review deletes them: its round final, or
  // the unit no longer in node_work's stage_units; ReleaseEvidence).
  if (held_ && std::none_of(work.units.begin(), work.units.end(), [&](const UnitAssignment& u) {
        return u.task_id == held_->a.task_id && u.index == held_->a.index;
      })) {
    DropHeld();
  }
  // Whether the run's assignment (its beacon: the placement its chain is of) is still this
  // node's: a unit placed again (its replica's deadline passed, or its round re-ran after a stage
  // was caught cheating) is another assignment, on another chain, even where this node keeps the
  // same stage.
  const bool assigned =
      run_ && std::any_of(work.units.begin(), work.units.end(),
                          [&](const UnitAssignment& u) { return KeyOf(u) == KeyOf(run_->a); });
  if (run_ && !run_->done.load(std::memory_order_acquire) && !run_->cancelled && !assigned) {
    // Stopped now rather than at its next step deadline: the node has other stage units to run.
    node_->Log(Name(run_->a) + ": no longer assigned to this node; stopping it");
    run_->plane->Cancel();
    run_->cancelled = true;
  }
  if (!run_ || !run_->done.load(std::memory_order_acquire)) return Status::Ok();
  run_->thread.join();
  std::unique_ptr<Run> run = std::move(run_);
  if (run->out.ok() && !assigned) {
    // A run that ended whole after its unit was placed again is not committed: its step records
    // are signed by the chain it ran on, whose placement the ledger no longer holds (CommitStage
    // names it, assignment_beacon: the ledger refuses it). Not sending it spares the refusal;
    // the ledger's check covers a commit sent before a re-placement that lands after it (a
    // verifier and the ledger's referee judge a unit's records against its current chain,
    // ReplicaRunChain). Where the node keeps the stage, its new assignment runs on the new chain.
    run->out = FailedPrecondition(
        "it ended after the unit was placed again (another assignment, on another chain): not "
        "committed");
  }
  run->attached.reset();                              // pushes for a later unit are not this one's
  const StagePlaneStats plane = run->plane->stats();  // what the run did, committed or not
  AgentStats& st = node_->stats();
  st.stage_bytes_sent += plane.bytes_sent;
  st.stage_wait_us += plane.wait_us;
  st.stage_run_us += run->run_us;
  st.stage_evidence_bytes = evidence_.bytes();
  const uint64_t done = run->out.ok() ? run->out->commits.size() : run->progress.commits.size();
  st.stage_steps_trained += done - std::min(done, run->from);
  if (run->from > 0) {
    ++st.stage_resumes;
    if (!run->kept) st.stage_steps_recomputed += run->from;
    node_->Log(Name(run->a) + ": resumed at step " + std::to_string(run->from) +
               (run->kept ? " (kept its steps before it, their lost neighbour's records swapped "
                            "for its new node's)"
                          : " (re-ran the lost node's steps before it from its neighbours' "
                            "tensors)"));
  }
  // A failed run's pushes measured the links as well as a committed one's.
  ReportLinks(plane, run->a);
  // The stage (weights, gradients, moments), its batches and its plane's tensors are done with
  // (its steps' evidence is served from files): freed before the delta blob is built beside the
  // delta. A failed run that trained steps keeps its stage and steps while the unit is assigned
  // here: a fresh assignment that replaced a lost neighbour resumes from them (ResumesOn).
  run->plane.reset();
  // A run of a held run's unit that trained a step (its evidence replaced the held steps') or
  // ended whole makes the held one void; one that trained none (on the chain the held run failed
  // on, its lost neighbour not yet replaced) leaves it held.
  if (held_ && held_->a.task_id == run->a.task_id && held_->a.index == run->a.index &&
      (run->whole || !run->progress.commits.empty())) {
    held_.reset();
  }
  if (!run->out.ok() && !run->stopped_for_replay && !run->progress.commits.empty() &&
      run->progress.commits.size() < run->batches.size()) {
    held_ = Held{.a = run->a, .stage = std::move(run->stage), .progress = std::move(run->progress)};
  }
  run->stage.reset();
  run->batches = {};
  if (!run->out.ok()) {
    // Nothing of the unit is stored or committed: it runs again while assigned.
    return run->out.status().WithPrefix(Name(run->a) + " failed (nothing committed)");
  }
  // A run that ended whole is resumed by no neighbour (a replica re-run after it runs from the
  // round's start): the tensors it sent are no longer served, only those it received, which its
  // verifiers replay from. So the evidence folder holds one run's sent tensors at a time.
  evidence_.DropSent({.task = run->a.task_id,
                      .round = run->a.round,
                      .replica = run->a.stage->replica,
                      .stage = run->a.stage->stage});
  st.stage_evidence_bytes = evidence_.bytes();
  return Commit(*run, work);
}

Status Stager::Commit(const Run& run, const NodeWork& work) {
  const UnitAssignment& a = run.a;
  const StageUnitOutcome& out = *run.out;
  ML_ASSIGN_OR_RETURN(net::BlobId delta_id, node_->deps().store->Put(EncodeDelta(out.delta)));
  if (delta_id.hash != out.result_hash) {
    return Internal(Name(a) + ": the stored delta blob " + delta_id.hash.ShortHex() +
                    " is not the outcome's result " + out.result_hash.ShortHex());
  }
  ML_RETURN_IF_ERROR(node_->book().Add(delta_id.hash, DeltaReason(a.task_id, a.round)));
  const bool last = a.stage->stage + 1 == a.stage->chain.size();
  const uint64_t loss_micros =
      last && std::isfinite(out.mean_loss) && out.mean_loss > 0
          ? static_cast<uint64_t>(std::llround(static_cast<double>(out.mean_loss) * 1e6))
          : 0;
  ledger::CommitStageTx tx{.task_id = a.task_id,
                           .round = a.round,
                           .replica = a.stage->replica,
                           .stage = a.stage->stage,
                           .node_id = node_->id(),
                           .result_hash = delta_id.hash,
                           .commitment = out.commitment,
                           .loss_micros = loss_micros,
                           .assignment_beacon = a.assignment_beacon};
  // The step commits it commits to: its real ones, or their forced form (ForceIfDrawn).
  std::vector<protocol::StageStepCommit> commits = out.commits;
  if (node_->VerificationOn()) {
    // The ledger opens the stage unit's check over its step leaves (docs/verification.md,
    // "Pipeline stages"); the secret is revealed by the Solver's PlayCheck, as a unit's.
    if (work.next_secret_index == 0) {
      return FailedPrecondition(Name(a) + ": the ledger's node_work gives no next_secret_index");
    }
    // The ledger's next index, unless node_work was read before a commit it has since
    // confirmed; one more per commit in flight. A commit that failed used none.
    tx.secret_index =
        std::max(work.next_secret_index, confirmed_secret_index_ + 1) + commits_.size();
    tx.leaves = out.leaves;
    ML_RETURN_IF_ERROR(ForceIfDrawn(a, commits, tx));
  }
  // The steps' commits stay public past the round for an audit of the task (docs/verification.md,
  // "An audit of a pipeline task"): kept with the task's global states, until the task is
  // released after its audit window, not with the round's delta, which goes when the round is
  // final.
  ML_ASSIGN_OR_RETURN(net::BlobId commits_id,
                      node_->deps().store->Put(protocol::EncodeStageStepCommits(commits)));
  ML_RETURN_IF_ERROR(node_->book().Add(commits_id.hash, StateReason(a.task_id)));
  tx.commits = commits_id.hash;
  const uint64_t secret_index = tx.secret_index;
  ML_ASSIGN_OR_RETURN(Hash256 txid, node_->tx().Send(std::move(tx)));
  commits_[KeyOf(a)] = InFlight{.txid = txid, .secret_index = secret_index};
  ++node_->stats().units_completed;
  node_->Log(Name(a) + ": committed delta " + delta_id.hash.ShortHex() + " (CommitStage)" +
             MemoryNote());
  return Status::Ok();
}

Status Stager::ForceIfDrawn(const UnitAssignment& a,
                            std::vector<protocol::StageStepCommit>& commits,
                            ledger::CommitStageTx& tx) {
  if (tx.secret_index > protocol::kSecretChainLength) {
    return FailedPrecondition("this node used all " + std::to_string(protocol::kSecretChainLength) +
                              " secrets of its chain; leave and rejoin to register a new one");
  }
  // The chain of the node's current epoch, read again each time (the Solver's may have started a
  // new one since).
  SolverSecrets secrets(node_);
  ML_RETURN_IF_ERROR(secrets.Load());
  const Hash256 secret = secrets.Element(tx.secret_index);
  const protocol::UnitId uid{a.task_id, a.round, a.shard};
  const std::string path = ForcedStageCommitsPath(*node_, a.task_id, a.index, tx.secret_index);
  if (!protocol::IsForcedError(secret, a.assignment_beacon, uid,
                               node_->chain_params().forced_error_per_million)) {
    // What an earlier commit of the unit with this secret left (a CommitStage refused, then the
    // unit placed again) is not this commit's.
    if (node_->env()->FileExists(path)) (void)node_->env()->DeleteFile(path);
    return Status::Ok();
  }
  if (commits.size() != tx.leaves.size()) {
    return Internal(Name(a) + ": " + std::to_string(commits.size()) + " step commits for " +
                    std::to_string(tx.leaves.size()) + " leaves");
  }
  // The tensors it sent stay honest (its neighbours' steps are signed over them): only the states
  // its commits claim are forced.
  protocol::ForceStageStepStates(secret, uid, commits);
  // The unit's directory is recorded before its first file, as the Solver records its units: the
  // pin review deletes it once the unit's round is final (its check, and so the reveal that reads
  // the file, settled before), or when the task is released.
  ML_RETURN_IF_ERROR(node_->book().AddUnit(a.task_id, a.index, a.round));
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(node_->UnitDir(a.task_id, a.index), 0700));
  const Bytes encoded = protocol::EncodeStageStepCommits(commits);
  ML_RETURN_IF_ERROR(node_->env()->WriteFileAtomic(path, AsStringView(encoded), 0600));
  tx.leaves.clear();
  for (const protocol::StageStepCommit& c : commits) {
    ML_RETURN_IF_ERROR(evidence_.ServeCommit(c));
    tx.leaves.push_back(protocol::StageStepLeaf(c));
  }
  tx.commitment = protocol::StageCommitment(tx.leaves);
  ++node_->stats().forced_errors;
  node_->Log(Name(a) + ": drawn for a forced error (secret " + std::to_string(tx.secret_index) +
             "); committing and serving its steps with the forced states");
  return Status::Ok();
}

void Stager::ReportLinks(const StagePlaneStats& plane, const UnitAssignment& a) {
  const std::vector<ledger::NodeLink> measured = MeasuredLinks(plane, a.stage->chain);
  if (!measured.empty()) ++link_runs_;
  for (const ledger::NodeLink& l : measured) links_[l.peer] = {link_runs_, l};
  while (links_.size() > protocol::kMaxNodeLinks) {
    links_.erase(std::min_element(links_.begin(), links_.end(), [](const auto& x, const auto& y) {
      return x.second.first != y.second.first ? x.second.first < y.second.first : x.first < y.first;
    }));
  }
  if (measured.empty() || node_->tx().HasInFlight(ledger::TxType::kReportLinks)) return;
  ledger::ReportLinksTx tx{.node_id = node_->id()};
  for (const auto& [peer, l] : links_) tx.links.push_back(l.second);  // sorted by peer
  const size_t count = tx.links.size();
  Result<Hash256> sent = node_->tx().Send(std::move(tx));
  if (!sent.ok()) {
    node_->Log(Name(a) + ": links not reported: " + sent.status().message());  // next unit
    return;
  }
  node_->Log(Name(a) + ": reported " + std::to_string(count) + " measured link(s) (ReportLinks)");
}

void Stager::DropHeld() {
  if (!held_) return;
  const UnitAssignment& a = held_->a;
  evidence_.DropSent(
      {.task = a.task_id, .round = a.round, .replica = a.stage->replica, .stage = a.stage->stage});
  node_->stats().stage_evidence_bytes = evidence_.bytes();
  held_.reset();
}

void Stager::ReleaseEvidence(const Hash256& task, uint32_t finalized,
                             const std::vector<HeldStageUnit>* held) {
  // A step goes when its round is final, or when the ledger no longer counts its unit as this
  // node's.
  auto drop = [&](uint32_t round, uint32_t replica, uint32_t stage) {
    if (round < finalized) return true;
    if (held == nullptr) return false;
    const HeldStageUnit unit{.task_id = task, .round = round, .replica = replica, .stage = stage};
    return std::find(held->begin(), held->end(), unit) == held->end();
  };
  // A held run that goes: no replica of it resumes (its files go with the others below).
  if (held_ && held_->a.task_id == task &&
      drop(held_->a.round, held_->a.stage->replica, held_->a.stage->stage)) {
    held_.reset();
  }
  const size_t freed = evidence_.WithdrawIf(
      task, [&](const StageStepRef& ref) { return drop(ref.round, ref.replica, ref.stage); });
  // Its neighbours' checkpoints of final rounds too: no replica of a final round resumes.
  host_.WithdrawKeptBefore(task, finalized);
  node_->stats().stage_evidence_bytes = evidence_.bytes();
  if (freed != 0) {
    node_->Log("task " + task.ShortHex() + ": no longer serving " + std::to_string(freed) +
               " stage step(s) of its final rounds or of units no longer this node's");
  }
}

bool Stager::OnOutcome(const TxOutcome& o) {
  for (auto it = commits_.begin(); it != commits_.end(); ++it) {
    if (it->second.txid != o.id) continue;
    if (o.ok) {
      ++node_->stats().commits_ok;
      committed_.insert(it->first);
      confirmed_secret_index_ = std::max(confirmed_secret_index_, it->second.secret_index);
    } else {
      ++node_->stats().commits_failed;
    }
    commits_.erase(it);
    return true;
  }
  return false;
}

}  // namespace meshlearn::node
