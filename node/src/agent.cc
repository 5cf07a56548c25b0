#include "meshlearn/node/agent.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "meshlearn/base/check.h"
#include "meshlearn/base/home_layout.h"
#include "roles/aggregator.h"
#include "roles/disputes.h"
#include "roles/node_context.h"
#include "roles/pin_keeper.h"
#include "roles/solver.h"
#include "roles/stager.h"
#include "roles/verifier.h"
#include "roles/verify_job.h"
#include "roles/verify_outbox.h"
#include "roles/whistleblower.h"

namespace meshlearn::node {

namespace {

// AgentOptions::withhold_stage_evidence: the node's transport, but a request to its own endpoint
// is answered by `self` (the withheld stage evidence) instead of the endpoint's public router.
// Its answer is handed over at the next WaitUntil (never from inside SendAsync).
class SelfRoutedTransport final : public net::Transport {
 public:
  SelfRoutedTransport(net::Transport* inner, std::string endpoint, const net::Router* self)
      : inner_(inner), endpoint_(std::move(endpoint)), self_(self) {}

  void SendAsync(const std::string& endpoint, net::Request request,
                 net::ResponseCallback done) override {
    if (endpoint != endpoint_) {
      inner_->SendAsync(endpoint, std::move(request), std::move(done));
      return;
    }
    Result<Bytes> answer = self_->Dispatch(request);
    std::lock_guard<std::mutex> lock(mu_);
    ready_.emplace_back(std::move(done), std::move(answer));
  }

  void WaitUntil(const std::function<bool()>& done) override {
    std::vector<std::pair<net::ResponseCallback, Result<Bytes>>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready.swap(ready_);
    }
    for (auto& [callback, answer] : ready) callback(std::move(answer));
    if (!done()) inner_->WaitUntil(done);
  }

  // REQUIRES: no request in flight (NodeAgent::set_endpoint: before the first Tick).
  void set_endpoint(std::string endpoint) { endpoint_ = std::move(endpoint); }

 private:
  net::Transport* inner_;
  std::string endpoint_;
  const net::Router* self_;
  std::mutex mu_;
  std::vector<std::pair<net::ResponseCallback, Result<Bytes>>> ready_;
};

}  // namespace

NodeAgent::NodeAgent(AgentDeps deps, AgentOptions options)
    : deps_(std::move(deps)), options_(std::move(options)) {
  // The data dir is a home directory like any other (home_layout.h): the transaction journal
  // lives in outbox/, where `meshlearn --home <data_dir> wallet ...` keeps its own entries.
  const HomeLayout home(options_.data_dir);
  if (deps_.env == Env::Default()) init_status_ = MigrateHomeLayout(home);  // real disks only
  if (init_status_.ok() && deps_.env) init_status_ = deps_.env->CreateDirs(home.OutboxDir(), 0700);
  tx_ = std::make_unique<TxSender>(
      deps_.chain, deps_.key,
      TxSenderOptions{.env = deps_.env, .outbox_path = home.NodeDaemonJournal()});
  blob_service_ = std::make_unique<net::BlobService>(deps_.store);
  unit_service_ = std::make_unique<UnitService>(deps_.env);
  Result<std::unique_ptr<PinBook>> book =
      PinBook::Open(deps_.env, JoinPath(options_.data_dir, "pins.json"), deps_.store);
  if (book.ok()) {
    book_ = std::move(*book);
    // The operator's keep list is exactly options_.keep_blobs.
    std::set<Hash256> keep(options_.keep_blobs.begin(), options_.keep_blobs.end());
    Result<size_t> dropped = book_->Remove([&](const Hash256& id, const std::string& r) {
      return r == kKeepReason && !keep.count(id);
    });
    if (!dropped.ok()) init_status_ = dropped.status();
    for (const Hash256& id : keep) {
      if (init_status_.ok()) init_status_ = book_->Add(id, kKeepReason);
    }
  } else {
    init_status_ = book.status().WithPrefix("node data dir " + options_.data_dir);
  }
  options_.upload.on_complete = [this](const net::BlobId& id) -> Status {
    if (!book_) return Unavailable("this node is not ready to store uploads");
    return book_->Add(id.hash, kUploadPrefix + std::to_string(seen_height_.load()));
  };
  upload_service_ = std::make_unique<BlobUploadService>(deps_.store, options_.upload);
  options_.fetch.pin = false;  // the roles pin with a reason (PinBook)
  if (options_.withhold_stage_evidence && deps_.transport != nullptr) {
    withheld_router_ = std::make_unique<net::Router>();
    self_transport_ = std::make_unique<SelfRoutedTransport>(deps_.transport, options_.endpoint,
                                                            withheld_router_.get());
    deps_.transport = self_transport_.get();
  }
  if (options_.speed_factor <= 0 || options_.speed_factor > 1) options_.speed_factor = 1;
  node_ = std::make_unique<NodeContext>(deps_, options_, tx_.get(), book_.get(),
                                        unit_service_.get(), &stats_);
  outbox_ = std::make_unique<VerifyOutbox>(node_.get());
  solver_ = std::make_unique<Solver>(node_.get(), outbox_.get());
  if (options_.verification_poll_ms > 0) {
    solver_->set_pause([this] { return PauseForVerification(); });
  }
  aggregator_ = std::make_unique<Aggregator>(node_.get());
  stager_ = std::make_unique<Stager>(node_.get());
  // Before anything is served or trained: an earlier process's stage evidence is nobody's now.
  if (init_status_.ok()) init_status_ = stager_->DeleteEvidenceLeftovers();
  verifier_ = std::make_unique<Verifier>(node_.get(), outbox_.get());
  whistleblower_ = std::make_unique<Whistleblower>(node_.get(), outbox_.get());
  disputes_ = std::make_unique<Disputes>(node_.get(), outbox_.get());
  pins_ = std::make_unique<PinKeeper>(node_.get(), solver_.get(), stager_.get());
  if (CheatsAsSolver(options_.adversary)) {
    Log("!!! ADVERSARY MODE: this node cheats as a \"" +
        std::string(AdversaryName(options_.adversary)) +
        "\" solver (testing only); verifiers should catch and slash it !!!");
  } else if (CheatsAsVerifier(options_.adversary)) {
    Log("!!! ADVERSARY MODE: this node cheats as a \"" +
        std::string(AdversaryName(options_.adversary)) +
        "\" verifier: it approves units without replaying them (testing only); a forced error "
        "should slash it !!!");
  }
}

NodeAgent::~NodeAgent() = default;

void NodeAgent::set_endpoint(std::string endpoint) {
  CHECK(!ticked_) << "NodeAgent::set_endpoint after the first Tick";
  options_.endpoint = std::move(endpoint);  // node_ reads options_ by reference
  if (self_transport_) {
    static_cast<SelfRoutedTransport*>(self_transport_.get())->set_endpoint(options_.endpoint);
  }
}

void NodeAgent::RegisterServices(net::Router* router) {
  blob_service_->Register(router);
  upload_service_->Register(router);
  unit_service_->Register(router);
  stager_->Register(router, withheld_router_.get());
}

void NodeAgent::Log(const std::string& line) {
  if (options_.log) options_.log(line);
}

// ---- Membership ------------------------------------------------------------------------------

Status NodeAgent::EnsureRegistered(uint64_t height) {
  if (left_ || options_.late_challenger) return Status::Ok();
  if (!registered_) {
    if (tx_->HasInFlight(ledger::TxType::kRegisterNode) ||
        tx_->HasInFlight(ledger::TxType::kUpdateNode)) {
      return Status::Ok();
    }
    ledger::NodeCapabilities caps = options_.capabilities;
    caps.throughput =
        static_cast<uint64_t>(static_cast<double>(caps.throughput) * options_.speed_factor);
    if (solver_->memory_reported() > 0) {
      caps.memory_bytes = std::min(caps.memory_bytes, solver_->memory_reported());
    }
    ML_ASSIGN_OR_RETURN(std::optional<NodeInfo> me, GetNode(*deps_.chain, id()));
    if (!me || me->status == "unbonding") return RegisterOrRejoin(me, caps);
    was_active_ = was_active_ || me->status == "active";
    looked_ = true;
    if (!secret_chain_checked_) {
      secret_chain_checked_ = true;
      solver_->CheckSecretChain(*me);
    }
    // The accelerator is not compared: it is not measured, the operator states it.
    const ledger::NodeCapabilities& c = me->capabilities;
    const bool same = me->endpoint == options_.endpoint && me->price == options_.price &&
                      me->roles == options_.roles && c.throughput == caps.throughput &&
                      c.memory_bytes == caps.memory_bytes && c.latency_ms == caps.latency_ms &&
                      c.bandwidth_bytes_per_s == caps.bandwidth_bytes_per_s &&
                      c.cores == caps.cores && c.disk_bytes == caps.disk_bytes;
    if (!same && me->status == "active") {
      Log("updating node " + id().ShortHex() + ": endpoint " + options_.endpoint);
      ML_RETURN_IF_ERROR(tx_->Send(ledger::UpdateNodeTx{.node_id = id(),
                                                       .endpoint = options_.endpoint,
                                                       .roles = options_.roles,
                                                       .capabilities = caps,
                                                       .price = options_.price})
                             .status());
    }
    registered_ = true;
    last_heartbeat_sent_ = std::max(last_heartbeat_sent_, me->last_heartbeat_height);
  }
  Heartbeat(height);
  return Status::Ok();
}

Status NodeAgent::RegisterOrRejoin(const std::optional<NodeInfo>& me,
                                   const ledger::NodeCapabilities& caps) {
  // With verification, every (re-)registration starts a fresh secret chain (secret_chain.h).
  auto send_register = [&]() -> Status {
    Hash256 head;
    if (node_->VerificationOn()) {
      ML_ASSIGN_OR_RETURN(head, solver_->NewSecretEpoch());
      secret_chain_checked_ = false;
    }
    return tx_->Send(ledger::RegisterNodeTx{.node_id = id(),
                                            .endpoint = options_.endpoint,
                                            .roles = options_.roles,
                                            .capabilities = caps,
                                            .price = options_.price,
                                            .stake = options_.stake,
                                            .secret_head = head})
        .status();
  };
  if (!me) {
    Log("registering node " + id().ShortHex() + " at " + options_.endpoint + " (stake " +
        std::to_string(options_.stake) + ", price " + std::to_string(options_.price) + ")");
    return send_register();
  }
  // Unbonding: the node left (LeaveNode).
  const bool first_look = !looked_;
  looked_ = true;
  if (first_look && options_.rejoin) {
    Log("node " + id().ShortHex() + " left the network earlier; rejoining at " +
        options_.endpoint + " (RegisterNode, stake " + std::to_string(options_.stake) + ")");
    return send_register();
  }
  Log("node " + id().ShortHex() + " has left the network (its record is unbonding, after " +
      "LeaveNode): it takes no work. To come back, start it with rejoin (`meshlearn node " +
      "run --rejoin`): RegisterNode again, bonding a new stake of " +
      std::to_string(options_.stake));
  left_ = true;
  return Status::Ok();
}

void NodeAgent::Heartbeat(uint64_t height) {
  if (options_.heartbeat_every_blocks == 0 ||
      height < last_heartbeat_sent_ + options_.heartbeat_every_blocks ||
      tx_->HasInFlight(ledger::TxType::kHeartbeat)) {
    return;
  }
  Result<Hash256> hb = tx_->Send(ledger::HeartbeatTx{.node_id = id()});
  if (!hb.ok()) {
    Log("heartbeat not sent: " + hb.status().message());  // retried next block
    registered_ = false;  // re-read the record (did the node leave?)
  } else {
    last_heartbeat_sent_ = height;
  }
}

void NodeAgent::PollTransactions() {
  Status polled = tx_->Poll();
  if (!polled.ok()) Log("polling transactions: " + polled.message());
  HandleOutcomes();
}

void NodeAgent::HandleOutcomes() {
  for (const TxOutcome& o : tx_->TakeOutcomes()) {
    if (!o.ok && aggregator_->Overtaken(o)) {
      // A race, not a failure: another party's transaction re-ran the round first.
      ++stats_.aggregations_overtaken;
      Log(o.type + " " + o.id.ShortHex() + " overtaken: its round was re-run before it landed (" +
          o.reason + "); the round is aggregated again when it is ready");
    } else if (!o.ok) {
      ++stats_.tx_failed;
      Log(o.type + " " + o.id.ShortHex() + (o.included ? " failed: " : " refused: ") + o.reason);
    }
    if (o.type == "RegisterNode" && o.ok) {
      Log("registered node " + id().ToHex() + " in block " + std::to_string(o.height) +
          " (stake " + std::to_string(options_.stake) + ", endpoint " + options_.endpoint + ")");
    }
    // Re-read the node record next tick: registered now, or failed, or the node left.
    if (o.type == "RegisterNode" || (o.type == "Heartbeat" && !o.ok)) registered_ = false;
    // Each role takes the outcomes of its own transactions.
    (void)(solver_->OnOutcome(o) || stager_->OnOutcome(o) || outbox_->OnOutcome(o) ||
           aggregator_->OnOutcome(o));
  }
}

// ---- The tick --------------------------------------------------------------------------------

Result<TickReport> NodeAgent::Tick() {
  ticked_ = true;
  TickReport report;
  ML_ASSIGN_OR_RETURN(std::optional<NodeWork> work, Prepare(&report));
  if (replay_ran_at_ && report.height >= *replay_ran_at_) {
    // The blocks from the tick that ran a stage replay to this one: what the replay took (the
    // daemon ticks again at once after a job).
    stage_replay_blocks_ = std::max(stage_replay_blocks_, report.height - *replay_ran_at_);
  }
  replay_ran_at_.reset();
  if (!work) return report;
  ML_RETURN_IF_ERROR(RunOneJob(*work, &report));
  stats_.stage_held_bytes = std::max(stats_.stage_held_bytes,
                                     node_->StageDataBytes() + disputes_->StageValueBytes());
  return report;
}

Result<std::optional<NodeWork>> NodeAgent::Prepare(TickReport* report) {
  ML_RETURN_IF_ERROR(init_status_);
  if (!tx_->initialized()) ML_RETURN_IF_ERROR(tx_->Init());
  PollTransactions();

  ML_RETURN_IF_ERROR(node_->GenesisParams().status());
  ML_ASSIGN_OR_RETURN(NodeWork work, GetNodeWork(*deps_.chain, id()));
  node_->set_height(work.height);
  solver_->set_next_secret_index(work.next_secret_index);
  seen_height_.store(work.height);
  pins_->set_first_height(work.height);
  report->height = work.height;
  ML_RETURN_IF_ERROR(EnsureRegistered(work.height));
  if (pins_->Due()) {
    Status reviewed = pins_->ReviewPins(work);
    if (!reviewed.ok()) Log("blob clean-up: " + reviewed.message());  // retried next time
  }
  if (!registered_ && !left_ && !options_.late_challenger) return std::optional<NodeWork>();
  return std::optional<NodeWork>(std::move(work));
}

// One job per tick: a replay for a dispute move or a verdict (their windows are short; a move
// first, OrderUrgentJobs), else an aggregation (a round waits for it), else a whistleblower
// re-check, else a unit. Verification transactions that need no computation went out before. A
// node that left takes no new work but still plays the checks it is party to (reveals its secrets
// and verdicts, defends its units, finishes a verdict it was drawn for) until they settle: an
// honest node must not lose its stake for leaving (chaos seed 188). Whistleblower re-checks are
// not obligations: it drops them.
Status NodeAgent::RunOneJob(const NodeWork& work, TickReport* report) {
  // A late challenger is not a node: it only plays its late games, as a node that left plays
  // the checks it is party to.
  const bool takes_work = !left_ && !options_.late_challenger;
  std::vector<VerifyJob> urgent, later;
  PlayVerification(work, &urgent, &later);
  if (!takes_work) later.clear();
  const std::vector<const AggregationAssignment*> aggs = aggregator_->Pending(work);
  std::vector<const UnitAssignment*> units = solver_->Pending(work);
  std::erase_if(units, [](const UnitAssignment* u) { return u->stage.has_value(); });
  // An urgent stage replay goes first: a stage unit that would not fit beside it starts on a
  // later tick (seconds later: its neighbours wait that long), and one that already trains makes
  // the replay wait for it. Only a replay that can run now holds a unit back (not one whose last
  // run failed, waiting on a party that may never answer, nor one past its deadline).
  uint64_t replay_need = 0;
  for (const VerifyJob& j : urgent) {
    if (j.deadline > work.height && !verify_job_failed_at_.count(VerifyJobKey(j))) {
      replay_need = std::max(replay_need, StageReplayNeed(j));
    }
  }
  if (takes_work) RunStages(work, replay_need);
  const size_t due = urgent.size();
  std::erase_if(urgent, [&](const VerifyJob& j) { return WaitsForStageUnit(j, work.height); });
  std::erase_if(later, [&](const VerifyJob& j) { return WaitsForStageUnit(j, work.height); });
  if (urgent.size() < due) report->busy = true;  // a replay waits: look again soon

  if (!urgent.empty()) {
    const VerifyJob& job = urgent.front();
    if (StageReplayNeed(job) > 0) replay_ran_at_ = work.height;  // measured at the next tick
    Status s = RunVerifyJob(job);
    if (solver_->crashed()) return s;
    // Retried while its window lasts, after the urgent jobs that have not failed.
    if (!s.ok()) Log("verification: " + s.message());
    if (s.ok()) {
      verify_job_failed_at_.erase(VerifyJobKey(job));
    } else {
      verify_job_failed_at_[VerifyJobKey(job)] = work.height;
    }
    ++report->verifications_run;
    report->busy = urgent.size() < due || urgent.size() > 1 || !later.empty() || !aggs.empty() ||
                   !units.empty();
    return Status::Ok();
  }
  if (!takes_work) return Status::Ok();
  if (!aggs.empty()) {
    Status s = aggregator_->Run(*aggs.front());
    if (!s.ok()) {
      Log("aggregation of task " + aggs.front()->task_id.ShortHex() + " round " +
          std::to_string(aggs.front()->round) + " failed: " + s.message());
    } else {
      ++report->aggregations_run;
    }
    report->busy = aggs.size() > 1 || !later.empty() || !units.empty();
    return Status::Ok();
  }
  if (!later.empty()) {
    if (StageReplayNeed(later.front()) > 0) replay_ran_at_ = work.height;
    Status s = RunVerifyJob(later.front());
    if (!s.ok()) Log("verification: " + s.message());
    ++report->verifications_run;
    report->busy = later.size() > 1 || !units.empty();
    return Status::Ok();
  }
  for (const UnitAssignment* u : units) {
    Status s = solver_->Run(*u);
    if (solver_->TakeReregister()) registered_ = false;  // UpdateNode with the lower memory
    if (solver_->crashed()) return s;  // the crash hook: stop as a killed process would
    if (solver_->skipped()) continue;  // refused (memory) or over max_units: try the next
    if (!s.ok()) {
      Log("unit " + u->task_id.ShortHex() + "/" + std::to_string(u->index) + " failed: " +
          s.message());
    } else if (!solver_->paused()) {
      ++report->units_run;
    }
    // A paused unit resumes after the verification job that paused it.
    report->busy = units.size() > 1 || solver_->paused();
    break;
  }
  return Status::Ok();
}

// A pipeline stage unit runs on a thread of its own, beside its neighbours' (Stager): each tick
// commits the one that finished and starts the next, and goes on with the tick's one job.
void NodeAgent::RunStages(const NodeWork& work, uint64_t replay_need) {
  Status collected = stager_->Collect(work);
  if (!collected.ok()) Log(collected.message());  // run again while it stays assigned
  if (stager_->running()) return;
  stage_unit_need_ = 0;
  for (const UnitAssignment* u : stager_->Pending(work)) {
    // A stage this node's memory cannot hold is refused as a whole unit is (Solver::FitsInMemory,
    // by the stage's need the ledger placed it by): it expires and goes to another node.
    Result<TaskContext*> ctx = node_->GetTask(u->task_id);
    if (ctx.ok() && !solver_->FitsInMemory(*u, **ctx)) continue;
    const uint64_t need = ctx.ok() ? Solver::NeedBytes(*u, **ctx) : 0;
    if (replay_need > 0 && !FitsBeside(need, replay_need)) return;  // after the replay
    Status started = stager_->Start(*u);
    if (!started.ok()) {
      Log("stage unit " + u->task_id.ShortHex() + "/" + std::to_string(u->index) +
          " not started: " + started.message());
      continue;
    }
    if (stager_->running()) {
      stage_unit_need_ = need;
      return;
    }
  }
}

uint64_t NodeAgent::StageReplayNeed(const VerifyJob& job) {
  // A tile's witness of a stage step traces the step again with its operators' values
  // (Disputes::RunStepWitness): a stage replay too.
  const bool tile_witness = job.kind == VerifyJob::Kind::kWitness && job.check->dispute &&
                            job.check->dispute->has_referee && job.check->dispute->referee.tile;
  if (job.kind != VerifyJob::Kind::kVerdict && job.kind != VerifyJob::Kind::kWhistle &&
      job.kind != VerifyJob::Kind::kTrace && job.kind != VerifyJob::Kind::kRecheck &&
      !tile_witness) {
    return 0;
  }
  Result<TaskContext*> ctx = node_->GetTask(job.check->task_id);
  if (!ctx.ok()) return 0;
  const uint32_t stages = (*ctx)->bundle.net.stages;
  const std::vector<uint64_t>& needs = (*ctx)->info.params.stage_memory_bytes;
  if (stages < 2 || needs.size() != stages) return 0;
  return needs[job.check->shard % stages];
}

bool NodeAgent::FitsBeside(uint64_t unit_need, uint64_t replay_need) const {
  // A node that offers a limit (memory_limit_bytes) offers it to one stage at a time: the ledger
  // placed its stage unit by that stage's need alone, and a replay holds, besides its stage, the
  // task's data it reads for the steps' batches (a text corpus as tokens: tens of MB that no
  // stage need counts). Measured on the 10M GPT's devnet (docs/submitters.md): a first stage's
  // check beside a first stage's unit, 78 MB of stage needs under a 100 MiB limit, took the
  // node's peak from 116 MB to 163-175 MB.
  if (options_.memory_limit_bytes > 0) return false;
  return unit_need + replay_need <= solver_->MemoryBytes();
}

bool NodeAgent::stage_unit_running() const { return stager_->running() && !stager_->run_ended(); }

bool NodeAgent::WaitsForStageUnit(const VerifyJob& job, uint64_t height) {
  if (!stager_->running()) return false;
  const uint64_t need = StageReplayNeed(job);
  if (need == 0 || FitsBeside(stage_unit_need_, need)) return false;
  if (job.kind == VerifyJob::Kind::kTrace || job.kind == VerifyJob::Kind::kWitness) {
    // A stage unit runs for seconds, a dispute's turn for tens of them: the trace waits while
    // its turn leaves it the time its replays take (TraceWaitEnd). A tile's witness likewise (its
    // window is the referee's deadline). Measured on the 10M GPT's devnet before it waited: a
    // trace beside a stage unit took an honest challenger from 125 to 177 MB, over its 100 MiB
    // offer. Past the wait, the node stops its unit (it runs again after the move: a delay, where
    // a missed turn costs the stake) and the move's replay runs once the unit ended; when its
    // deadline is at hand, beside the unit rather than lose the turn.
    const uint64_t from = trace_wait_from_.emplace(VerifyJobKey(job), height).first->second;
    if (job.deadline <= height + kMoveSendBlocks) return false;
    if (height >= TraceWaitEnd(from, job.deadline, stage_replay_blocks_)) {
      stager_->StopForReplay(CheckName(*job.check) + "'s dispute move can wait no longer for it (" +
                             std::to_string(job.deadline - height) +
                             " blocks of its turn left; a stage replay of this node took up to " +
                             std::to_string(stage_replay_blocks_) + ")");
    }
  }
  if (replay_wait_logged_.insert(VerifyJobKey(job)).second) {
    Log(CheckName(*job.check) + ": its replay (" + std::to_string(need) +
        " bytes of stage) waits for this node's stage unit (" + std::to_string(stage_unit_need_) +
        " bytes) to end: the node offers " + std::to_string(solver_->MemoryBytes()) +
        " bytes to one stage at a time");
  }
  return true;
}

// ---- Verification ----------------------------------------------------------------------------

void NodeAgent::PlayVerification(const NodeWork& work, std::vector<VerifyJob>* urgent,
                                 std::vector<VerifyJob>* later) {
  std::set<std::string> live;
  for (const CheckAssignment& c : work.checks) {
    if (node_->Refused(c.task_id)) continue;
    live.insert(node_->VerifyDir(c));
    if (c.late) {
      // A late game on a unit of a final round: only its moves and witnesses (the check itself
      // settled long ago). The solver re-runs the unit from the round's start state to answer.
      disputes_->Play(c, urgent);
      continue;
    }
    if (c.solver == id()) solver_->PlayCheck(c);
    if (c.HasRole(CheckRole::kCheckRoleVerifier)) verifier_->Play(c, urgent);
    if (c.HasRole(CheckRole::kCheckRoleWhistleblower) &&
        c.stage == protocol::CheckStage::kCheckSettled) {
      whistleblower_->Play(c, later);
    }
    whistleblower_->PlayMerits(c, urgent);
    disputes_->Play(c, urgent);
  }
  OrderUrgentJobs(work.height, urgent, &verify_job_failed_at_);
  CleanVerifyDirs(live);
}

Status NodeAgent::PauseForVerification() {
  if (const Clock* clock = deps_.clock) {
    const int64_t now = clock->MonotonicMicros();
    if (now - last_verification_poll_us_ < options_.verification_poll_ms * 1000) {
      return Status::Ok();
    }
    last_verification_poll_us_ = now;
  }
  Result<NodeWork> work = GetNodeWork(*deps_.chain, id());
  if (!work.ok()) return Status::Ok();  // the chain is away: keep training
  PollTransactions();
  std::vector<VerifyJob> urgent, later;
  PlayVerification(*work, &urgent, &later);
  if (urgent.empty()) return Status::Ok();
  ++stats_.units_paused;
  return Unavailable("a verification replay is due by block " +
                 std::to_string(urgent.front().deadline));
}

Status NodeAgent::RunVerifyJob(const VerifyJob& job) {
  switch (job.kind) {
    case VerifyJob::Kind::kVerdict:
      return verifier_->RunVerdict(*job.check);
    case VerifyJob::Kind::kDispute:
      return disputes_->RunReplay(*job.check);
    case VerifyJob::Kind::kWhistle:
      return whistleblower_->Run(*job.check);
    case VerifyJob::Kind::kWitness:
      return disputes_->RunStepWitness(*job.check);
    case VerifyJob::Kind::kTrace:
      return disputes_->RunTrace(*job.check);
    case VerifyJob::Kind::kMerits:
      return whistleblower_->RunMerits(*job.check);
    case VerifyJob::Kind::kRecheck:
      return disputes_->RunServedRecheck(*job.check);
  }
  return Internal("unknown verification job");
}

void NodeAgent::CleanVerifyDirs(const std::set<std::string>& live) {
  const std::string root = node_->VerifyRoot();
  if (!verify_dirs_) {
    verify_dirs_.emplace();
    if (Result<std::vector<std::string>> names = deps_.env->ListDir(root); names.ok()) {
      for (const std::string& n : *names) verify_dirs_->insert(JoinPath(root, n));
    }
  }
  verify_dirs_->insert(live.begin(), live.end());
  for (auto it = verify_dirs_->begin(); it != verify_dirs_->end();) {
    if (live.count(*it)) {
      ++it;
      continue;
    }
    // The check is over (settled and its round final, or the round re-ran).
    const std::string dir = *it;
    if (Result<std::vector<std::string>> names = deps_.env->ListDir(dir); names.ok()) {
      for (const std::string& n : *names) (void)deps_.env->DeleteFile(JoinPath(dir, n));
    }
    whistleblower_->Forget(dir);
    disputes_->Forget(dir);
    outbox_->Forget(dir);
    it = verify_dirs_->erase(it);
  }
}

}  // namespace meshlearn::node
