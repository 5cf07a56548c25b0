#include "meshlearn/node/agent.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "meshlearn/base/home_layout.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/scheduler.h"
#include "agent_internal.h"

namespace meshlearn::node {

using agent_internal::ReadJson;
using agent_internal::StateReason;
using agent_internal::TaskShort;
using nlohmann::json;

namespace {

uint64_t DoubleBits(double d) { return std::bit_cast<uint64_t>(d); }
double BitsDouble(uint64_t b) { return std::bit_cast<double>(b); }

std::string TaskReason(const Hash256& t) { return "task:" + t.ToHex(); }
std::string DeltaReason(const Hash256& t, uint32_t round) {
  return "delta:" + t.ToHex() + ":" + std::to_string(round);
}
std::string KeepFinalReason(const Hash256& t) { return "keep-final:" + t.ToHex(); }
constexpr char kUploadPrefix[] = "upload:";
constexpr char kKeepReason[] = "keep";


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
  options_.fetch.pin = false;
  fetcher_ = std::make_unique<net::Fetcher>(deps_.transport, deps_.store, options_.fetch);
  if (options_.speed_factor <= 0 || options_.speed_factor > 1) options_.speed_factor = 1;
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

void NodeAgent::RegisterServices(net::Router* router) {
  blob_service_->Register(router);
  upload_service_->Register(router);
  unit_service_->Register(router);
}

void NodeAgent::Log(const std::string& line) {
  if (options_.log) options_.log(line);
}

std::string NodeAgent::UnitDir(const Hash256& task, uint32_t index) const {
  return JoinPath(JoinPath(options_.data_dir, "units"), task.ToHex() + "-" + std::to_string(index));
}

Result<std::vector<std::string>> NodeAgent::Providers(bool refresh) {
  if (refresh || providers_height_ != height_) {
    ML_ASSIGN_OR_RETURN(nodes_, ListNodes(*deps_.chain));
    providers_height_ = height_;
  }
  // Active nodes first, then those that left or are jailed: a node that left keeps running and
  // serving while it unbonds, and may hold the only copy of a blob, e.g. the last aggregate it
  // committed (chaos seed 3: every unit of the next round failed to fetch its start state).
  std::vector<std::string> out = ActiveEndpoints(nodes_, options_.endpoint);
  for (const NodeInfo& n : nodes_) {
    if (n.status != "active" && !n.endpoint.empty() && n.endpoint != options_.endpoint) {
      out.push_back(n.endpoint);
    }
  }
  return out;
}

Result<Bytes> NodeAgent::FetchBlob(const Hash256& id, const std::vector<std::string>& preferred,
                                   const std::string& reason) {
  net::BlobId bid{id};
  if (!deps_.store->HasBlob(bid)) {
    std::vector<std::string> providers = preferred;
    ML_ASSIGN_OR_RETURN(std::vector<std::string> all, Providers(false));
    for (const std::string& p : all) {
      if (std::find(providers.begin(), providers.end(), p) == providers.end()) providers.push_back(p);
    }
    providers.erase(std::remove(providers.begin(), providers.end(), options_.endpoint),
                    providers.end());
    if (providers.empty()) {
      return Unavailable("blob " + id.ShortHex() + " is not here and no other node is registered");
    }
    Result<net::FetchStats> st = fetcher_->Fetch(bid, providers);
    if (!st.ok()) return st.status().WithPrefix("fetch blob " + id.ShortHex());
  }
  deps_.store->Hold(bid);
  Status pinned = reason.empty() ? Status::Ok() : book_->Add(id, reason);
  Result<Bytes> out = pinned.ok() ? deps_.store->Get(bid) : Result<Bytes>(pinned);
  deps_.store->Release(bid);
  return out;
}

Result<NodeAgent::TaskContext*> NodeAgent::GetTaskContext(const Hash256& task_id) {
  auto it = tasks_.find(task_id);
  if (it != tasks_.end()) return it->second.get();
  // A task refused once (its bundle disagrees with the ledger) stays refused: do not fetch and
  // parse its bundle again every tick.
  if (auto r = refused_tasks_.find(task_id); r != refused_tasks_.end()) return r->second;
  auto ctx = std::make_unique<TaskContext>();
  ctx->id = task_id;
  ML_ASSIGN_OR_RETURN(ctx->info, GetTask(*deps_.chain, task_id));
  ML_ASSIGN_OR_RETURN(Bytes bundle_bytes, FetchBlob(ctx->info.spec_hash, {}, TaskReason(task_id)));
  std::string text(AsStringView(bundle_bytes));
  const std::string data_dir =
      JoinPath(JoinPath(JoinPath(options_.data_dir, "tasks"), task_id.ToHex()), "data");
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(data_dir));
  auto resolver = [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
    std::string path = JoinPath(data_dir, id.ToHex());
    if (deps_.env->FileExists(path)) return path;
    ML_ASSIGN_OR_RETURN(Bytes data, FetchBlob(id.hash, {}, TaskReason(task_id)));
    Log("task " + TaskShort(task_id) + ": fetched data." + key + " (" +
        std::to_string(data.size()) + " bytes)");
    ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, AsStringView(data)));
    return path;
  };
  ML_ASSIGN_OR_RETURN(ctx->bundle, LoadBundle(text, resolver));
  ML_ASSIGN_OR_RETURN(ctx->trainer, engine::Trainer::Create(deps_.env, ctx->bundle.task));
  ctx->facts = ComputeTaskFacts(*ctx->trainer, ctx->bundle.net);
  if (Status match = CheckBundleMatchesLedger(ctx->facts, ctx->bundle.net, ctx->info.params);
      !match.ok()) {
    Status refused = match.WithPrefix("task " + TaskShort(task_id));
    Log(refused.message());
    refused_tasks_.emplace(task_id, refused);
    return refused;
  }
  protocol::TaskSpecView view;
  view.model_bytes = ctx->facts.model_bytes;
  view.memory_required_bytes = ctx->info.params.memory_bytes;
  ctx->memory_need = protocol::RequiredMemoryBytes(view);
  Log("task " + TaskShort(task_id) + ": loaded (" + std::to_string(ctx->facts.num_params) +
      " parameters, " + std::to_string(ctx->bundle.net.rounds) + " rounds x " +
      std::to_string(ctx->bundle.net.units_per_round) + " units)");
  TaskContext* raw = ctx.get();
  tasks_[task_id] = std::move(ctx);
  return raw;
}

Status NodeAgent::EnsureRegistered(uint64_t height) {
  if (left_) return Status::Ok();
  ledger::NodeCapabilities caps = options_.capabilities;
  caps.throughput = static_cast<uint64_t>(static_cast<double>(caps.throughput) * options_.speed_factor);
  if (memory_reported_ > 0) caps.memory_bytes = std::min(caps.memory_bytes, memory_reported_);
  if (!registered_) {
    if (tx_->HasInFlight(ledger::TxType::kRegisterNode) || tx_->HasInFlight(ledger::TxType::kUpdateNode)) {
      return Status::Ok();
    }
    ML_ASSIGN_OR_RETURN(std::optional<NodeInfo> me, GetNode(*deps_.chain, id()));
    // With verification, every (re-)registration starts a fresh secret chain (secret_chain.h).
    auto register_tx = [&]() -> Result<ledger::RegisterNodeTx> {
      Hash256 head;
      if (VerificationOn()) {
        ML_RETURN_IF_ERROR(NewSecretEpoch());
        head = secrets_->head();
      }
      return ledger::RegisterNodeTx{.node_id = id(),
                                    .endpoint = options_.endpoint,
                                    .roles = options_.roles,
                                    .capabilities = caps,
                                    .price = options_.price,
                                    .stake = options_.stake,
                                    .secret_head = head};
    };
    if (!me) {
      Log("registering node " + id().ShortHex() + " at " + options_.endpoint + " (stake " +
          std::to_string(options_.stake) + ", price " + std::to_string(options_.price) + ")");
      ML_ASSIGN_OR_RETURN(ledger::RegisterNodeTx rt, register_tx());
      ML_RETURN_IF_ERROR(tx_->Send(rt).status());
      return Status::Ok();
    }
    const bool first_look = !looked_;
    looked_ = true;
    if (me->status == "unbonding") {
      if (first_look && options_.rejoin) {
        Log("node " + id().ShortHex() + " left the network earlier; rejoining at " +
            options_.endpoint + " (RegisterNode, stake " + std::to_string(options_.stake) + ")");
        ML_ASSIGN_OR_RETURN(ledger::RegisterNodeTx rt, register_tx());
        ML_RETURN_IF_ERROR(tx_->Send(rt).status());
        return Status::Ok();
      }
      Log("node " + id().ShortHex() + " has left the network (its record is unbonding, after " +
          "LeaveNode): it takes no work. To come back, start it with rejoin (`meshlearn node " +
          "run --rejoin`): RegisterNode again, bonding a new stake of " +
          std::to_string(options_.stake));
      left_ = true;
      return Status::Ok();
    }
    was_active_ = was_active_ || me->status == "active";
    if (!secret_chain_checked_) CheckSecretChain(*me);
    // The accelerator is not compared: it is not measured, the operator states it.
    const ledger::NodeCapabilities& c = me->capabilities;
    const bool same = me->endpoint == options_.endpoint && me->price == options_.price &&
                      me->roles == options_.roles && c.throughput == caps.throughput &&
                      c.memory_bytes == caps.memory_bytes && c.latency_ms == caps.latency_ms &&
                      c.bandwidth_bytes_per_s == caps.bandwidth_bytes_per_s &&
                      c.cores == caps.cores;
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
  if (options_.heartbeat_every_blocks > 0 &&
      height >= last_heartbeat_sent_ + options_.heartbeat_every_blocks &&
      !tx_->HasInFlight(ledger::TxType::kHeartbeat)) {
    Result<Hash256> hb = tx_->Send(ledger::HeartbeatTx{.node_id = id()});
    if (!hb.ok()) {
      Log("heartbeat not sent: " + hb.status().message());  // retried next block
      registered_ = false;  // re-read the record (did the node leave?)
    } else {
      last_heartbeat_sent_ = height;
    }
  }
  return Status::Ok();
}

void NodeAgent::HandleOutcomes() {
  for (const TxOutcome& o : tx_->TakeOutcomes()) {
    if (!o.ok) {
      ++stats_.tx_failed;
      Log(o.type + " " + o.id.ShortHex() + (o.included ? " failed: " : " refused: ") + o.reason);
    }
    if (o.type == "RegisterNode" && o.ok) {
      Log("registered node " + id().ToHex() + " in block " + std::to_string(o.height) +
          " (stake " + std::to_string(options_.stake) + ", endpoint " + options_.endpoint + ")");
    }
    // Re-read the node record next tick: registered now, or failed, or the node left.
    if (o.type == "RegisterNode" || (o.type == "Heartbeat" && !o.ok)) registered_ = false;
    for (auto it = unit_commits_.begin(); it != unit_commits_.end(); ++it) {
      if (it->second != o.id) continue;
      if (o.ok) {
        ++stats_.commits_ok;
        units_done_ok_.insert(it->first);
      } else {
        ++stats_.commits_failed;
      }
      unit_commits_.erase(it);
      break;
    }
    if (auto v = verify_txs_.find(o.id); v != verify_txs_.end()) {
      if (!o.ok) VerifyTxFailed(v->second);
      verify_txs_.erase(v);
    }
    for (auto it = agg_commits_.begin(); it != agg_commits_.end(); ++it) {
      if (it->second != o.id) continue;
      if (o.ok) {
        ++stats_.aggregations_ok;
        aggs_done_ok_.insert(it->first);
      }
      agg_commits_.erase(it);
      break;
    }
  }
}

Result<TickReport> NodeAgent::Tick() {
  TickReport report;
  ML_RETURN_IF_ERROR(init_status_);
  if (!tx_->initialized()) ML_RETURN_IF_ERROR(tx_->Init());
  Status polled = tx_->Poll();
  if (!polled.ok()) Log("polling transactions: " + polled.message());
  HandleOutcomes();

  ML_RETURN_IF_ERROR(GenesisParams().status());
  ML_ASSIGN_OR_RETURN(NodeWork work, GetNodeWork(*deps_.chain, id()));
  height_ = work.height;
  next_secret_index_ = work.next_secret_index;
  seen_height_.store(work.height);
  if (first_height_ == 0) first_height_ = work.height;
  report.height = work.height;
  ML_RETURN_IF_ERROR(EnsureRegistered(work.height));
  if (height_ >= last_review_height_ + std::max<uint64_t>(options_.gc_every_blocks, 1)) {
    Status reviewed = ReviewPins();
    if (!reviewed.ok()) Log("blob clean-up: " + reviewed.message());  // retried next time
  }
  if (!registered_ && !left_) return report;

  // Verification transactions that need no computation go out at once; replays are jobs. A node
  // that left takes no new work but still plays the checks it is party to (reveals its secrets
  // and verdicts, defends its units, finishes a verdict it was drawn for) until they settle: an
  // honest node must not lose its stake for leaving (chaos seed 188: a node left with a unit
  // drawn for a forced error in verification, never revealed its secret, and lost the dispute
  // by silence). Whistleblower re-checks are not obligations: it drops them.
  std::vector<VerifyJob> urgent, later;
  PlayVerification(work, &urgent, &later);
  if (left_) later.clear();

  // Aggregations before units: a round waits for them.
  std::vector<const AggregationAssignment*> aggs;
  for (const AggregationAssignment& a : work.aggregations) {
    auto key = std::make_pair(a.task_id, a.round);
    if (agg_commits_.count(key)) continue;
    if (aggs_done_ok_.erase(key) > 0) {
      // Our aggregate of this round was included, yet we are asked again: the round was re-run
      // (fraud, a forced error, an unavailable delta) and its inputs changed.
      Log("task " + TaskShort(a.task_id) + " round " + std::to_string(a.round) +
          ": aggregating again after the round was re-run");
    }
    aggs.push_back(&a);
  }
  std::vector<const UnitAssignment*> units;
  for (const UnitAssignment& u : work.units) {
    auto key = std::make_pair(u.task_id, u.index);
    if (unit_commits_.count(key)) continue;
    if (units_done_ok_.erase(key) > 0) {
      // Our commit of this unit was included, yet it is assigned again: its round was re-run
      // (ReportUnavailable). The stored result is committed again below (same weights, same
      // bits) without training.
      Log("task " + TaskShort(u.task_id) + " unit " + std::to_string(u.index) +
          ": assigned again after its round was re-run");
    }
    units.push_back(&u);
  }
  std::sort(units.begin(), units.end(), [](const UnitAssignment* a, const UnitAssignment* b) {
    return std::tie(a->deadline_height, a->task_id, a->index) <
           std::tie(b->deadline_height, b->task_id, b->index);
  });

  if (!urgent.empty()) {
    Status s = RunVerifyJob(urgent.front());
    if (crashed_) return s;
    if (!s.ok()) Log("verification: " + s.message());  // retried next tick while its window lasts
    ++report.verifications_run;
    report.busy = urgent.size() > 1 || !later.empty() || !aggs.empty() || !units.empty();
    return report;
  }
  if (left_) return report;
  if (!aggs.empty()) {
    Status s = RunAggregation(*aggs.front());
    if (!s.ok()) {
      Log("aggregation of task " + TaskShort(aggs.front()->task_id) + " round " +
          std::to_string(aggs.front()->round) + " failed: " + s.message());
    } else {
      ++report.aggregations_run;
    }
    report.busy = aggs.size() > 1 || !later.empty() || !units.empty();
    return report;
  }
  if (!later.empty()) {
    Status s = RunVerifyJob(later.front());
    if (!s.ok()) Log("verification: " + s.message());
    ++report.verifications_run;
    report.busy = later.size() > 1 || !units.empty();
    return report;
  }
  for (const UnitAssignment* u : units) {
    skipped_ = false;
    Status s = RunUnit(*u);
    if (crashed_) return s;  // the crash hook: stop as a killed process would
    if (skipped_) continue;  // refused (memory) or over max_units: nothing ran, try the next
    if (!s.ok()) {
      Log("unit " + TaskShort(u->task_id) + "/" + std::to_string(u->index) + " failed: " +
          s.message());
    } else {
      ++report.units_run;
    }
    report.busy = units.size() > 1;
    break;
  }
  return report;
}

Status NodeAgent::RunUnit(const UnitAssignment& a) {
  const std::string dir = UnitDir(a.task_id, a.index);
  const std::string done_path = JoinPath(dir, "done.json");
  const std::string name = "unit " + TaskShort(a.task_id) + "/" + std::to_string(a.index) + " r" +
                           std::to_string(a.round) + " s" + std::to_string(a.shard);

  // Finished before (a crash after the delta was stored, a failed commit, or its round re-ran):
  // commit again, with a new secret (and forced-error draw).
  if (deps_.env->FileExists(done_path)) {
    ML_ASSIGN_OR_RETURN(json d, ReadJson(deps_.env, done_path));
    if (d.value("start_state", std::string()) == a.start_state.ToHex() && d.contains("leaves")) {
      ML_RETURN_IF_ERROR(SendCommit(a, d));
      Log(name + ": committing the stored result again");
      return Status::Ok();
    }
  }

  if (options_.max_units > 0 && units_taken_ >= options_.max_units) {
    skipped_ = true;
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, GetTaskContext(a.task_id));
  const uint64_t registered_memory = options_.capabilities.memory_bytes;
  const uint64_t memory = options_.memory_limit_bytes > 0
                              ? std::min(options_.memory_limit_bytes, registered_memory)
                              : registered_memory;
  if (ctx->memory_need > memory) {
    ++stats_.units_refused;
    std::string why = name + ": refused: needs " + std::to_string(ctx->memory_need) +
                      " bytes of memory, this node can use " + std::to_string(memory) +
                      "; it expires at its deadline (block " + std::to_string(a.deadline_height) +
                      ") and goes to another node";
    if (refused_logged_[a.task_id] != why) Log(why);
    refused_logged_[a.task_id] = why;
    if (memory < registered_memory && memory_reported_ != memory) {
      // The ledger still believes the registered memory: tell it, so that the scheduler stops
      // assigning this node units it cannot run.
      memory_reported_ = memory;
      registered_ = false;  // EnsureRegistered sends UpdateNode with the lower value
      Log("reporting memory_bytes = " + std::to_string(memory) + " to the ledger (registered " +
          std::to_string(registered_memory) + ")");
    }
    skipped_ = true;
    return Status::Ok();
  }
  const NetworkSpec& net = ctx->bundle.net;
  if (a.round >= net.rounds || a.shard >= net.units_per_round) {
    return InvalidArgument(name + ": round/shard outside the task's " + std::to_string(net.rounds) +
                           " x " + std::to_string(net.units_per_round));
  }
  ML_ASSIGN_OR_RETURN(Bytes state_bytes, FetchBlob(a.start_state, {}, StateReason(a.task_id)));
  ML_ASSIGN_OR_RETURN(GlobalState start, DecodeGlobalState(state_bytes, ctx->facts.num_params));

  const UnitWork work = WorkOf(*ctx, a.round, a.shard);

  ML_RETURN_IF_ERROR(book_->AddUnit(a.task_id, a.index, a.round));  // before any file of it
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(dir));
  const std::string progress_path = JoinPath(dir, "progress.json");
  std::optional<UnitResume> resume;
  if (deps_.env->FileExists(progress_path)) {
    Result<json> p = ReadJson(deps_.env, progress_path);
    if (p.ok() && p->value("start_state", std::string()) == a.start_state.ToHex() &&
        p->value("stream", uint64_t{0}) == work.stream) {
      UnitResume r;
      r.step = p->value("step", int64_t{0});
      r.loss_sum = BitsDouble(p->value("loss_sum_bits", uint64_t{0}));
      bool good = true;
      for (const json& h : p->value("hashes", json::array())) {
        Result<Hash256> hh = Hash256::FromHex(h.get<std::string>());
        if (!hh.ok()) good = false;
        else r.state_hashes.push_back(*hh);
      }
      Result<engine::TrainState> st =
          engine::LoadCheckpoint(deps_.env, JoinPath(dir, p->value("checkpoint", std::string())));
      if (good && st.ok()) {
        r.state = std::move(*st);
        resume = std::move(r);
      } else {
        Log(name + ": ignoring an unreadable checkpoint; starting over");
      }
    }
  }

  ++units_taken_;
  Log(name + (resume ? ": resuming at step " + std::to_string(resume->step) : ": training") +
      " (" + std::to_string(net.inner_steps) + " steps)");
  const double factor = options_.speed_factor;
  int64_t step_start = deps_.clock ? deps_.clock->MonotonicMicros() : 0;
  UnitRunOptions run;
  run.resume = resume ? &*resume : nullptr;
  run.on_step = [&](int64_t step, float loss) {
    if (factor < 1.0 && options_.sleep && deps_.clock) {
      int64_t took = deps_.clock->MonotonicMicros() - step_start;
      options_.sleep(static_cast<int64_t>(static_cast<double>(took) * (1.0 / factor - 1.0)));
    }
    if (deps_.clock) step_start = deps_.clock->MonotonicMicros();
    if (step == net.inner_steps || (net.checkpoint_interval > 0 && step % net.checkpoint_interval == 0)) {
      Log(name + ": step " + std::to_string(step) + "/" + std::to_string(net.inner_steps) +
          " loss " + std::to_string(loss));
    }
  };
  run.on_checkpoint = [&](int64_t step, engine::TrainState& state, const std::vector<Hash256>& hashes,
                          double loss_sum) -> Status {
    const std::string ckpt = "ckpt-" + std::to_string(step) + ".safetensors";
    ML_RETURN_IF_ERROR(engine::SaveCheckpoint(deps_.env, JoinPath(dir, ckpt), state));
    json p = {{"start_state", a.start_state.ToHex()}, {"stream", work.stream}, {"step", step},
              {"loss_sum_bits", DoubleBits(loss_sum)}, {"checkpoint", ckpt},
              {"hashes", json::array()}};
    for (const Hash256& h : hashes) p["hashes"].push_back(h.ToHex());
    ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(progress_path, p.dump()));
    // Every checkpoint stays until the unit's round is final (ReviewPins): the verifier replays
    // k-step segments from them.
    if (options_.after_checkpoint) {
      Status hook = options_.after_checkpoint(a.task_id, a.index, step);
      if (!hook.ok()) {
        crashed_ = true;
        return hook;
      }
    }
    return Status::Ok();
  };
  run.should_stop = options_.should_stop;
  Result<UnitOutcome> ran = Unavailable("not run");
  if (!CheatsAsSolver(options_.adversary)) {
    UnitExecutor executor(ctx->trainer.get());
    ran = executor.Run(start.weights, work, run);
  } else {
    AdversaryInputs in;
    std::vector<float> peer;
    if (options_.adversary == Adversary::kCopy) {
      Result<std::vector<float>> got = PeerDelta(a, ctx->facts.num_params);
      if (got.ok()) peer = std::move(*got);
      Log(name + ": adversary copy: " +
          (got.ok() ? std::string("copying another solver's delta")
                    : "nothing to copy (" + got.status().message() + "), running lazily"));
    }
    in.peer_delta = peer;
    auto earlier = last_outcome_.find(a.task_id);
    if (earlier != last_outcome_.end()) in.earlier = &earlier->second;
    in.last_round = a.round + 1 == ctx->bundle.net.rounds;
    ran = RunAdversaryUnit(options_.adversary, ctx->trainer.get(), start.weights, work, run, in);
    if (ran.ok() && options_.adversary == Adversary::kStale) last_outcome_[a.task_id] = *ran;
  }
  if (!ran.ok()) {
    if (options_.should_stop && options_.should_stop()) crashed_ = true;  // stop Tick now
    return ran.status();
  }
  UnitOutcome out = std::move(*ran);
  if (resume) ++stats_.units_resumed;
  // The final state (after step H) is kept and served like the other checkpoints, until the
  // round is final: with it anyone checks that the committed result is its delta
  // (docs/verification.md "Result binding"). Written before done.json, which marks the unit done.
  ML_RETURN_IF_ERROR(engine::SaveCheckpoint(
      deps_.env, JoinPath(dir, "ckpt-" + std::to_string(net.inner_steps) + ".safetensors"),
      ctx->trainer->state()));

  Bytes delta = EncodeDelta(out.delta);
  ML_ASSIGN_OR_RETURN(net::BlobId delta_id, deps_.store->Put(delta));
  ML_RETURN_IF_ERROR(book_->Add(delta_id.hash, DeltaReason(a.task_id, a.round)));
  const uint64_t loss_micros =
      std::isfinite(out.mean_loss) && out.mean_loss > 0
          ? static_cast<uint64_t>(std::llround(static_cast<double>(out.mean_loss) * 1e6))
          : 0;
  json d = {{"start_state", a.start_state.ToHex()}, {"result", delta_id.ToHex()},
            {"commitment", out.commitment.ToHex()}, {"loss_micros", loss_micros},
            {"round", a.round}, {"shard", a.shard}, {"leaves", json::array()}};
  for (const Hash256& h : out.state_hashes) d["leaves"].push_back(h.ToHex());
  ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(done_path, d.dump()));
  ML_RETURN_IF_ERROR(SendCommit(a, d));
  ++stats_.units_completed;
  Log(name + ": done, loss " + std::to_string(out.mean_loss) + ", delta " + delta_id.ShortHex() +
      " committed");
  return Status::Ok();
}

Result<std::vector<float>> NodeAgent::PeerDelta(const UnitAssignment& a, uint64_t num_params) {
  ML_ASSIGN_OR_RETURN(TaskInfo t, GetTask(*deps_.chain, a.task_id, /*units=*/true));
  for (const UnitRecord& u : t.units) {
    if (u.round != a.round || u.index == a.index ||
        (u.status != ledger::WorkUnitStatus::kCommitted &&
         u.status != ledger::WorkUnitStatus::kVerified) ||
        u.assignee == id() || u.result_hash.IsZero()) {
      continue;
    }
    Result<Bytes> blob = FetchBlob(u.result_hash, {}, DeltaReason(a.task_id, a.round));
    if (!blob.ok()) continue;
    Result<std::vector<float>> d = DecodeDelta(*blob, num_params);
    if (d.ok()) return d;
  }
  return NotFound("no other solver has committed a unit of round " + std::to_string(a.round));
}

void NodeAgent::ReportIfUnavailable(const Hash256& task_id, uint32_t index, const Status& why) {
  const auto key = std::make_pair(task_id, index);
  const uint32_t tries = ++delta_fetch_failures_[key];
  if (tries < std::max<uint32_t>(options_.report_unavailable_after, 1) ||
      reported_unavailable_.count(key)) {
    return;
  }
  Result<Hash256> txid = tx_->Send(
      ledger::ReportUnavailableTx{.task_id = task_id, .index = index, .node_id = id()});
  if (!txid.ok()) {
    Log("reporting unit " + std::to_string(index) + " unavailable failed: " +
        txid.status().message());
    return;
  }
  reported_unavailable_.insert(key);
  Log("task " + TaskShort(task_id) + " unit " + std::to_string(index) + ": its delta could not "
      "be fetched from anyone after " + std::to_string(tries) + " tries (" + why.message() +
      "); reported unavailable, the round re-runs without its solver");
}

Status NodeAgent::RunAggregation(const AggregationAssignment& a) {
  const auto key = std::make_pair(a.task_id, a.round);
  const std::string name = "aggregate " + TaskShort(a.task_id) + " r" + std::to_string(a.round);
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, GetTaskContext(a.task_id));
  const NetworkSpec& net = ctx->bundle.net;
  const uint64_t n = ctx->facts.num_params;
  const std::string done_path = JoinPath(JoinPath(options_.data_dir, "aggregates"),
                                         a.task_id.ToHex() + "-" + std::to_string(a.round) + ".json");
  Hash256 state_id;
  uint32_t acc_ppm = 0;
  uint64_t loss_micros = 0;
  bool have = false;
  // What was aggregated: a round that re-ran (fraud, a forced error) has other inputs.
  json inputs = json::array();
  for (const AggregationInput& in : a.units) {
    inputs.push_back(std::to_string(in.index) + ":" + in.result_hash.ToHex());
  }
  if (deps_.env->FileExists(done_path)) {
    ML_ASSIGN_OR_RETURN(json d, ReadJson(deps_.env, done_path));
    if (d.value("start_state", std::string()) == a.start_state.ToHex() &&
        d.value("inputs", json::array()) == inputs) {
      ML_ASSIGN_OR_RETURN(state_id, Hash256::FromHex(d.value("state", std::string())));
      acc_ppm = d.value("accuracy_ppm", 0u);
      loss_micros = d.value("loss_micros", uint64_t{0});
      have = deps_.store->HasBlob(net::BlobId{state_id});
      if (have) ML_RETURN_IF_ERROR(book_->Add(state_id, StateReason(a.task_id)));
    }
  }
  if (!have) {
    ML_ASSIGN_OR_RETURN(Bytes state_bytes, FetchBlob(a.start_state, {}, StateReason(a.task_id)));
    ML_ASSIGN_OR_RETURN(GlobalState state, DecodeGlobalState(state_bytes, n));
    ML_ASSIGN_OR_RETURN(std::vector<std::string> all, Providers(true));
    (void)all;
    std::map<PublicKey, std::string> endpoint_of;
    for (const NodeInfo& ni : nodes_) endpoint_of[ni.id] = ni.endpoint;

    std::vector<std::vector<float>> deltas;
    std::vector<protocol::UnitId> ids;
    deltas.reserve(a.units.size());
    for (const AggregationInput& in : a.units) {
      std::vector<std::string> preferred;
      if (endpoint_of.count(in.node)) preferred.push_back(endpoint_of[in.node]);
      Result<Bytes> fetched = FetchBlob(in.result_hash, preferred, /*reason=*/"");
      if (!fetched.ok()) {
        ReportIfUnavailable(a.task_id, in.index, fetched.status());
        return fetched.status();
      }
      Bytes blob = std::move(*fetched);
      Result<std::vector<float>> d = DecodeDelta(blob, n);
      if (!d.ok()) {
        ++stats_.bad_deltas;
        Log(name + ": leaving out unit " + std::to_string(in.index) + " of node " +
            in.node.ShortHex() + ": " + d.status().message());
        continue;
      }
      deltas.push_back(std::move(*d));
      ids.push_back(protocol::UnitId{ctx->facts.content_id, a.round, in.shard});
    }
    std::vector<protocol::Contribution> contributions;
    const uint64_t samples =
        static_cast<uint64_t>(net.inner_steps) * ctx->trainer->samples_per_step();
    for (size_t i = 0; i < deltas.size(); ++i) {
      contributions.push_back({.unit = ids[i], .samples = samples, .delta = deltas[i]});
    }
    ML_ASSIGN_OR_RETURN(protocol::AggregateResult agg,
                        protocol::Aggregate(contributions, net.aggregation));
    if (!agg.rejected.empty()) {
      Log(name + ": the rule rejected " + std::to_string(agg.rejected.size()) +
          " contributions with NaN/Inf");
    }
    protocol::OuterStep(state.weights, state.momentum, agg.delta, net.outer);
    ML_RETURN_IF_ERROR(ctx->trainer->SetFlatParams(state.weights));
    engine::EvalResult eval = ctx->trainer->Evaluate();
    acc_ppm = eval.accuracy >= 0 ? static_cast<uint32_t>(std::llround(eval.accuracy * 1e6)) : 0;
    loss_micros = std::isfinite(eval.loss) && eval.loss > 0
                      ? static_cast<uint64_t>(std::llround(eval.loss * 1e6))
                      : 0;
    ML_ASSIGN_OR_RETURN(net::BlobId sid, deps_.store->Put(EncodeGlobalState(state)));
    ML_RETURN_IF_ERROR(book_->Add(sid.hash, StateReason(a.task_id)));
    state_id = sid.hash;
    ML_RETURN_IF_ERROR(deps_.env->CreateDirs(JoinPath(options_.data_dir, "aggregates")));
    json d = {{"start_state", a.start_state.ToHex()}, {"state", state_id.ToHex()},
              {"accuracy_ppm", acc_ppm}, {"loss_micros", loss_micros}, {"inputs", inputs}};
    ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(done_path, d.dump()));
    Log(name + ": " + std::to_string(contributions.size()) + " deltas, test accuracy " +
        std::to_string(eval.accuracy) + " loss " + std::to_string(eval.loss) + ", state " +
        state_id.ShortHex());
  }
  ML_ASSIGN_OR_RETURN(Hash256 txid, tx_->Send(ledger::CommitAggregateTx{.task_id = a.task_id,
                                                                       .round = a.round,
                                                                       .node_id = id(),
                                                                       .state_hash = state_id,
                                                                       .test_accuracy_ppm = acc_ppm,
                                                                       .test_loss_micros = loss_micros}));
  agg_commits_[key] = txid;
  ++stats_.aggregations;
  return Status::Ok();
}

// ---- Blob clean-up ---------------------------------------------------------------------------

void NodeAgent::DeleteUnitFiles(const Hash256& task, uint32_t index) {
  const std::string dir = UnitDir(task, index);
  unit_service_->Withdraw(task, index);
  Result<std::vector<std::string>> names = deps_.env->ListDir(dir);
  if (!names.ok()) return;  // never created (the unit was refused before its first file)
  for (const std::string& n : *names) (void)deps_.env->DeleteFile(JoinPath(dir, n));
  ++stats_.unit_dirs_deleted;
}

Status NodeAgent::AdoptUploads() {
  std::map<Hash256, uint64_t> uploads;  // blob -> earliest upload height
  for (const auto& [id, reasons] : book_->Snapshot()) {
    for (const std::string& r : reasons) {
      if (!r.starts_with(kUploadPrefix)) continue;
      uint64_t h = std::strtoull(r.c_str() + std::strlen(kUploadPrefix), nullptr, 10);
      if (h == 0) h = first_height_;  // uploaded before this agent's first Tick
      auto [it, inserted] = uploads.emplace(id, h);
      if (!inserted) it->second = std::min(it->second, h);
    }
  }
  if (uploads.empty()) return Status::Ok();
  std::set<Hash256> adopted;
  ML_ASSIGN_OR_RETURN(std::vector<TaskInfo> tasks, ListTasks(*deps_.chain));
  for (const TaskInfo& t : tasks) {
    if (t.status != ledger::TaskStatus::kOpen) continue;
    if (uploads.count(t.spec_hash)) {
      ML_RETURN_IF_ERROR(book_->Add(t.spec_hash, TaskReason(t.id)));
      adopted.insert(t.spec_hash);
      // Its data blobs (uploaded with it, or fetched later) belong to the task too.
      Result<Bytes> bundle = deps_.store->Get(net::BlobId{t.spec_hash});
      if (bundle.ok()) {
        Result<std::vector<std::pair<std::string, net::BlobId>>> data =
            BundleDataBlobs(AsStringView(*bundle));
        if (data.ok()) {
          for (const auto& [key, id] : *data) {
            ML_RETURN_IF_ERROR(book_->Add(id.hash, TaskReason(t.id)));
            adopted.insert(id.hash);
          }
        }
      }
      Log("task " + TaskShort(t.id) + ": keeping the bundle and data pushed to this node "
          "while the task is open");
    }
    const Hash256& init = t.params.initial_state;
    if (uploads.count(init)) {
      ML_RETURN_IF_ERROR(book_->Add(init, StateReason(t.id)));
      adopted.insert(init);
    }
  }
  const uint64_t grace = options_.upload_grace_blocks;
  ML_ASSIGN_OR_RETURN(size_t freed, book_->Remove([&](const Hash256& id, const std::string& r) {
    if (!r.starts_with(kUploadPrefix)) return false;
    uint64_t h = std::strtoull(r.c_str() + std::strlen(kUploadPrefix), nullptr, 10);
    if (h == 0) h = first_height_;
    return adopted.count(id) > 0 || h + grace <= height_;
  }));
  stats_.blobs_unpinned += freed;
  return Status::Ok();
}

Status NodeAgent::ReleaseTask(const Hash256& task, const Hash256& final_state) {
  const bool keep_final = options_.keep_final_states && !final_state.IsZero() &&
                          deps_.store->HasBlob(net::BlobId{final_state});
  if (keep_final) ML_RETURN_IF_ERROR(book_->Add(final_state, KeepFinalReason(task)));
  ML_ASSIGN_OR_RETURN(size_t freed, book_->Remove([&](const Hash256&, const std::string& r) {
    std::string kind;
    Hash256 t;
    return PinBook::ParseTaskReason(r, &kind, &t) && t == task && kind != "keep-final";
  }));
  stats_.blobs_unpinned += freed;
  std::vector<PinBook::UnitKey> units;
  for (const auto& [k, round] : book_->Units()) {
    if (k.first != task) continue;
    DeleteUnitFiles(k.first, k.second);
    units.push_back(k);
  }
  ML_RETURN_IF_ERROR(book_->RemoveUnits(units));
  // The data files written from the task's data blobs, and the aggregation records.
  const std::string data_dir =
      JoinPath(JoinPath(JoinPath(options_.data_dir, "tasks"), task.ToHex()), "data");
  if (Result<std::vector<std::string>> names = deps_.env->ListDir(data_dir); names.ok()) {
    for (const std::string& n : *names) (void)deps_.env->DeleteFile(JoinPath(data_dir, n));
  }
  const std::string agg_dir = JoinPath(options_.data_dir, "aggregates");
  if (Result<std::vector<std::string>> names = deps_.env->ListDir(agg_dir); names.ok()) {
    for (const std::string& n : *names) {
      if (n.starts_with(task.ToHex() + "-")) (void)deps_.env->DeleteFile(JoinPath(agg_dir, n));
    }
  }
  tasks_.erase(task);
  refused_logged_.erase(task);
  ML_RETURN_IF_ERROR(book_->ForgetTask(task));
  Log("task " + TaskShort(task) + " closed: released " + std::to_string(freed) + " blobs and " +
      std::to_string(units.size()) + " unit directories" +
      (keep_final ? " (final state " + final_state.ShortHex() + " kept)" : std::string()));
  return Status::Ok();
}

Status NodeAgent::ReviewPins() {
  last_review_height_ = height_;
  ML_RETURN_IF_ERROR(AdoptUploads());
  const std::map<PinBook::UnitKey, uint32_t> units = book_->Units();
  for (const Hash256& task : book_->Tasks({"keep-final"})) {
    Result<TaskInfo> info = GetTask(*deps_.chain, task);
    if (!info.ok() && info.status().code() != StatusCode::kNotFound) return info.status();
    const bool gone = !info.ok();  // unknown to this ledger (e.g. a devnet started afresh)
    const std::vector<Hash256> history = gone ? std::vector<Hash256>{} : info->weights_history;
    const Hash256 final_state = gone ? Hash256{} : info->final_state;
    if (gone || info->status != ledger::TaskStatus::kOpen) {
      uint64_t seen = book_->ClosedSeen(task);
      if (seen == 0) {
        seen = height_;
        ML_RETURN_IF_ERROR(book_->SetClosedSeen(task, seen));
        Log("task " + TaskShort(task) + " is " +
            (gone ? "unknown to the ledger" : std::string(ledger::TaskStatusName(info->status))) +
            ": its blobs are released in " + std::to_string(options_.release_after_blocks) +
            " blocks");
      }
      if (height_ >= seen + options_.release_after_blocks) {
        ML_RETURN_IF_ERROR(ReleaseTask(task, final_state));
        continue;
      }
    }
    // Rounds [0, finalized) are final. SEAM (verification): weights_history grows only when a
    // round's verification window has closed, so deltas and checkpoints of a round that can
    // still be checked or disputed stay.
    const uint32_t finalized = history.empty() ? 0 : static_cast<uint32_t>(history.size() - 1);
    std::set<Hash256> old_states(history.begin(), history.end());
    if (!history.empty()) {
      old_states.erase(history.front());  // the initial state
      old_states.erase(history.back());   // the current round's (or the final) weights
    }
    old_states.erase(final_state);
    ML_ASSIGN_OR_RETURN(size_t freed, book_->Remove([&](const Hash256& id, const std::string& r) {
      std::string kind;
      Hash256 t;
      if (!PinBook::ParseTaskReason(r, &kind, &t) || t != task) return false;
      if (kind == "delta") {
        uint32_t round = static_cast<uint32_t>(std::strtoul(r.c_str() + r.rfind(':') + 1, nullptr, 10));
        return round < finalized;
      }
      return kind == "state" && old_states.count(id) > 0;
    }));
    stats_.blobs_unpinned += freed;
    std::vector<PinBook::UnitKey> done;
    for (const auto& [k, round] : units) {
      if (k.first != task || round >= finalized) continue;
      DeleteUnitFiles(k.first, k.second);
      done.push_back(k);
    }
    ML_RETURN_IF_ERROR(book_->RemoveUnits(done));
  }
  return Status::Ok();
}

}  // namespace meshlearn::node
