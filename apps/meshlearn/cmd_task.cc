// meshlearn task submit|status|watch|fetch|cancel|quote: the submitter's commands (see
// docs/submitters.md). The shared pieces (task_client.h) are also what `meshlearn devnet` uses.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <numeric>
#include <thread>
#include <type_traits>

#include <fmt/format.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/blob_push.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/tolerance.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "task_client.h"

namespace meshlearn::cli {

using nlohmann::json;

// ---- Shared (task_client.h) ------------------------------------------------------------------

namespace {

// Tolerance mode: the thresholds the task file gives, or, where it gives 0, profiled now by
// running the first unit's first segment under two kernel configurations (node/tolerance.h).
Status SetTolerance(Env* env, const std::string& path, PreparedTask* t) {
  ledger::TaskParams& p = t->params;
  p.tolerance_rel_l2_ppm = t->net.tolerance_rel_l2_ppm;
  p.tolerance_cosine_gap_ppb = t->net.tolerance_cosine_gap_ppb;
  if (p.tolerance_rel_l2_ppm != 0 && p.tolerance_cosine_gap_ppb != 0) return Status::Ok();
  // The first unit, as its solver will train it; the profile replays its first segment.
  const protocol::UnitWork work = protocol::UnitWorkOf(t->net, t->facts, 0, 0);
  const int64_t k = work.checkpoint_interval;
  std::vector<float> global = t->trainer->FlatParams();
  // A trainer of its own: the task's trainer keeps round 0's weights untouched.
  ML_ASSIGN_OR_RETURN(std::unique_ptr<engine::Trainer> probe,
                      engine::Trainer::Create(env, t->task));
  engine::KernelConfig a{.simd = engine::SimdPath::kScalar, .threads = 1};
  engine::KernelConfig b = engine::GetKernelConfig();
  Result<node::ToleranceProfile> prof = node::ProfileTolerance(probe.get(), global, work, k, a, b);
  if (!prof.ok()) return prof.status().WithPrefix(path + ": profiling the tolerance");
  if (p.tolerance_rel_l2_ppm == 0) p.tolerance_rel_l2_ppm = prof->params.max_rel_l2_ppm;
  if (p.tolerance_cosine_gap_ppb == 0) {
    p.tolerance_cosine_gap_ppb = prof->params.max_cosine_gap_ppb;
  }
  t->tolerance_measured = prof->measured;
  return Status::Ok();
}

}  // namespace

Result<PreparedTask> PrepareTask(Env* env, const std::string& path) {
  PreparedTask t;
  t.path = path;
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Load(env, path));
  if (!cfg.Has("network")) {
    return InvalidArgument(path + ": no [network] table; a network task needs one (rounds, "
                           "units_per_round, inner_steps, budget, price_cap: see "
                           "docs/submitters.md)");
  }
  ML_ASSIGN_OR_RETURN(t.net, protocol::NetworkSpec::FromConfig(cfg));
  if (t.net.budget == 0) {
    return InvalidArgument(path + ": network.budget is 0; set it to the tokens to escrow "
                           "(`meshlearn task quote " + path + "` estimates the cost)");
  }
  if (t.net.price_cap == 0) {
    return InvalidArgument(path + ": network.price_cap is 0; set the most you pay per 10^9 "
                           "training FLOPs (e.g. price_cap = 100)");
  }
  if (uint64_t{t.net.rounds} * t.net.units_per_round > ledger::kMaxTaskUnits) {
    return InvalidArgument(fmt::format(
        "{}: network.rounds x network.units_per_round = {} is over the ledger's limit {}; "
        "use fewer rounds or units", path, uint64_t{t.net.rounds} * t.net.units_per_round,
        ledger::kMaxTaskUnits));
  }
  ML_ASSIGN_OR_RETURN(t.task, engine::TaskSpec::Load(env, path));
  ML_ASSIGN_OR_RETURN(t.trainer, engine::Trainer::Create(env, t.task));
  // Exact mode: the ledger rules a dispute at one tile of one operator of the step's tile plan
  // (docs/verification.md), so a model whose plan it would refuse (a layer with a block past the
  // 256 KiB witness bound) is refused here, naming the layer, not after its first dispute.
  // The trainer's spec, whose model has what the data decides (a text task's vocab_size).
  if (!t.net.tolerance_mode) {
    const engine::TaskSpec& resolved = t.trainer->task();
    Result<engine::TilePlan> plan =
        engine::PlanStepTiles(resolved.model, resolved.optimizer, resolved.batch_size,
                              resolved.seq_len, resolved.micro_batches);
    if (!plan.ok()) return plan.status().WithPrefix(path);
  }
  t.facts = node::ComputeTaskFacts(*t.trainer, t.net);
  // The one derivation of the ledger's params from the file (initial_state: StoreTaskBlobs). It
  // carries data_root, the Merkle root over the training examples (a token task's: over its
  // token pages, data_page_tokens): nodes refuse a task whose data does not give it, and the
  // ledger executes a disputed step (RefereeStepTx) or tile (RefereeTileTx) against it.
  t.params = node::MakeTaskParams(t.facts, t.net, Hash256{});
  ledger::TaskParams& p = t.params;
  // A pipeline task (issue 15): its stages' needs for the ledger's placement; errors name the
  // task file and network.stages or network.cut (engine::TaskPipelineCut), so no prefix here: it
  // read "task.toml: task.toml: network.cut: ...".
  if (t.net.stages > 1) {
    ML_RETURN_IF_ERROR(node::AddPipelineTerms(t.trainer->task(), t.net, &p));
  }
  if (t.net.tolerance_mode) ML_RETURN_IF_ERROR(SetTolerance(env, path, &t));
  t.view = node::MakeTaskView(*t.trainer, t.net);
  t.view.flops_per_sample = p.flops_per_sample;
  t.view.model_bytes = p.model_bytes;
  t.view.memory_required_bytes = p.memory_bytes;  // node::UnitMemoryBytes (MakeTaskParams)
  t.view.eval_memory_bytes = p.eval_memory_bytes;  // a pipeline's (AddPipelineTerms)
  Status v = protocol::ValidateTaskSpec(t.view);
  if (!v.ok()) return v.WithPrefix(path);
  t.total_units = uint64_t{t.net.rounds} * p.units_per_round;  // R x S for a pipeline task
  t.unit_flops = protocol::UnitFlops(t.view);
  // The ledger's own rules, for a chain with the default parameters (SubmitPreparedTask and
  // `task quote` check again against the chain's genesis).
  ledger::ChainParams chain;
  t.cost_at_cap = ledger::MaxTaskCost(p, t.net.price_cap, nullptr,
                                      chain.verification ? chain.verifiers_per_unit : 0);
  ML_RETURN_IF_ERROR(CheckTaskTerms(t, chain));
  return t;
}

std::string TaskFileKey(std::string_view field) {
  if (field == "batch_size") return "train.batch_size";
  if (field == "seed") return "task.seed";
  // Computed from the model and the data, not written in the file.
  if (field == "flops_per_sample" || field == "model_bytes" || field == "memory_bytes" ||
      field == "num_examples" || field == "initial_state" || field == "data_root" ||
      field == "data_page_tokens") {
    return "the task's " + std::string(field);
  }
  return "network." + std::string(field);
}

Status CheckTaskTerms(const PreparedTask& t, const ledger::ChainParams& chain) {
  Status s = ledger::ValidateTaskTerms(t.params, t.net.budget, t.net.price_cap, chain.verification,
                                       chain.verifiers_per_unit, TaskFileKey);
  return s.WithPrefix(t.path);
}

Result<ledger::Genesis> FetchGenesis(ledger::RpcClient& rpc) {
  ML_ASSIGN_OR_RETURN(json g, rpc.Call("get_genesis", json::object()));
  if (!g.contains("toml") || !g["toml"].is_string()) {
    return DataLoss("get_genesis answered without its toml text");
  }
  return ledger::ParseGenesis(g["toml"].get<std::string>(), "the ledger's genesis");
}

Result<TaskBlobs> StoreTaskBlobs(Env* env, PreparedTask* t, net::BlobStore* store) {
  TaskBlobs b;
  ML_ASSIGN_OR_RETURN(b.bundle, node::MakeBundle(env, t->path, store));
  b.all.push_back(b.bundle.id);
  b.bytes += b.bundle.text.size();
  for (const node::BundleDataFile& f : b.bundle.files) {
    b.all.push_back(f.id);
    b.bytes += f.size;
  }
  node::GlobalState s0 = node::InitialState(*t->trainer);
  Bytes blob = node::EncodeGlobalState(s0);
  ML_ASSIGN_OR_RETURN(b.initial_state, store->Put(blob));
  ML_RETURN_IF_ERROR(store->Pin(b.initial_state));
  b.all.push_back(b.initial_state);
  b.bytes += blob.size();
  t->params.initial_state = b.initial_state.hash;
  return b;
}

Result<std::vector<std::string>> NodeEndpoints(ledger::RpcClient& rpc) {
  ML_ASSIGN_OR_RETURN(json page, rpc.Call("list_nodes", {{"limit", 100}}));
  std::vector<std::string> out;
  for (const json& n : page.value("items", json::array())) {
    if (n.value("status", "") != "active") continue;
    std::string ep = n.value("endpoint", "");
    if (ep.rfind("http://", 0) == 0) ep = ep.substr(7);
    if (!ep.empty()) out.push_back(ep);
  }
  return out;
}

Result<SubmittedTask> SubmitPreparedTask(ledger::RpcClient& rpc, const KeyPair& key,
                                         PreparedTask* t, net::BlobStore* store,
                                         const SubmitOptions& o) {
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  // Everything that can be checked is checked before anything is published or escrowed.
  ML_ASSIGN_OR_RETURN(json acct, rpc.Call("get_account", {{"address", key.public_key().ToHex()}}));
  const uint64_t balance = acct.value("balance", uint64_t{0});
  if (balance < t->net.budget) {
    return FailedPrecondition(fmt::format(
        "the budget {} (network.budget) is more than the balance {} of {}; lower the budget or "
        "fund the account (`meshlearn wallet faucet` on a devnet)", t->net.budget, balance,
        key.public_key().ShortHex()));
  }
  // The chain's own parameters (verifiers per unit, verification on or off) decide the most a
  // task can cost: the same checks SubmitTask will make, before the upload.
  ML_ASSIGN_OR_RETURN(ledger::Genesis genesis, FetchGenesis(rpc));
  ML_RETURN_IF_ERROR(CheckTaskTerms(*t, genesis.params));
  ML_ASSIGN_OR_RETURN(std::vector<std::string> endpoints, NodeEndpoints(rpc));
  if (endpoints.empty()) {
    return FailedPrecondition("no active node is registered on " + rpc.url() +
                              "; a task needs nodes to hold its blobs and train it (start one "
                              "with `meshlearn node run`)");
  }
  ML_ASSIGN_OR_RETURN(TaskBlobs blobs, StoreTaskBlobs(Env::Default(), t, store));
  SubmittedTask out;
  out.blobs = blobs.all;
  net::HttpTransport transport;
  // Replication: each blob goes to `replicas` nodes (rotating, so the load spreads).
  const size_t replicas = std::min<size_t>(std::max(1, o.replicas), endpoints.size());
  for (size_t i = 0; i < replicas; ++i) out.pushed_to.push_back(endpoints[i]);
  log(fmt::format("publishing {} blobs ({:.1f} MB) to {} node(s)", blobs.all.size(),
                  static_cast<double>(blobs.bytes) / 1e6, out.pushed_to.size()));
  for (const net::BlobId& id : blobs.all) {
    for (const std::string& ep : out.pushed_to) {
      ML_ASSIGN_OR_RETURN(node::PushStats st, node::PushBlob(&transport, store, id, {ep}));
      out.pushed_bytes += st.bytes_sent;
    }
  }
  ML_ASSIGN_OR_RETURN(std::string chain_id, ledger::FetchChainId(rpc));
  ML_ASSIGN_OR_RETURN(uint64_t nonce, ledger::FetchNextNonce(rpc, key.public_key()));
  ledger::SubmitTaskTx sub;
  sub.spec_hash = blobs.bundle.id.hash;
  sub.budget = t->net.budget;
  sub.price_cap = t->net.price_cap;
  sub.memo = o.memo;
  sub.params = t->params;
  ledger::Transaction tx = ledger::BuildSignedTx(key, chain_id, nonce, sub);
  out.tx_id = ledger::TxId(tx).ToHex();
  ML_ASSIGN_OR_RETURN(json done, ledger::SendTxAndWait(rpc, tx, o.timeout_ms));
  const json receipt = done.value("receipt", json::object());
  if (!receipt.value("ok", false)) {
    return FailedPrecondition("SubmitTask was refused: " +
                              receipt.value("reason", std::string("no reason given")));
  }
  out.height = done.value("height", uint64_t{0});
  out.task_id = ledger::TaskIdFor(key.public_key(), nonce);
  return out;
}

Result<json> GetTask(ledger::RpcClient& rpc, const Hash256& id, bool units) {
  return rpc.Call("get_task", {{"id", id.ToHex()}, {"units", units}});
}

TaskMoney MoneyOf(const json& j) {
  TaskMoney m;
  m.budget = j.value("budget", uint64_t{0});
  m.spent = j.value("spent", uint64_t{0});
  m.treasury_cut = j.value("treasury_cut", uint64_t{0});
  m.refunded = j.value("refunded", uint64_t{0});
  m.escrow = j.value("escrow", uint64_t{0});
  const json v = j.value("verification", json::object());
  m.paid_to_verifiers = v.value("verifiers_paid", uint64_t{0});
  m.added_from_slashes = v.value("redo_escrow", uint64_t{0});
  for (const json& r : j.value("round_results", json::array())) {
    m.paid_to_aggregators += r.value("aggregator_paid", uint64_t{0});
  }
  // Every payment from the escrow is a unit's (its `paid`), a round's aggregation or a
  // verification (ledger PayFromEscrow's three callers); the units' share is what is left.
  const uint64_t others = m.paid_to_verifiers + m.paid_to_aggregators;
  m.paid_to_solvers = m.spent >= others ? m.spent - others : 0;
  m.to_nodes = m.spent >= m.treasury_cut ? m.spent - m.treasury_cut : 0;
  return m;
}

json MoneyJson(const TaskMoney& m) {
  return {{"budget", m.budget},
          {"spent", m.spent},
          {"paid_to_solvers", m.paid_to_solvers},
          {"paid_to_verifiers", m.paid_to_verifiers},
          {"paid_to_aggregators", m.paid_to_aggregators},
          {"treasury_cut", m.treasury_cut},
          {"to_nodes", m.to_nodes},
          {"refunded", m.refunded},
          {"escrow", m.escrow},
          {"added_from_slashes", m.added_from_slashes}};
}

std::string MoneyLine(const TaskMoney& m) {
  std::string s = fmt::format(
      "spent {} = solvers {} + verifiers {} + aggregators {} (treasury cut {}, to nodes {})",
      m.spent, m.paid_to_solvers, m.paid_to_verifiers, m.paid_to_aggregators, m.treasury_cut,
      m.to_nodes);
  if (m.refunded > 0 || m.escrow == 0) s += fmt::format("; refunded {}", m.refunded);
  if (m.escrow > 0) s += fmt::format("; in escrow {}", m.escrow);
  s += fmt::format(" of budget {}", m.budget);
  if (m.added_from_slashes > 0) {
    s += fmt::format(" ({} of it slashed stake added for re-runs)", m.added_from_slashes);
  }
  return s;
}

TaskMetric TaskMetricOf(const engine::TaskSpec& task) {
  // Labels make accuracy (engine EvalResult::accuracy); token data has only a loss.
  return task.data.format == "idx" || task.data.format == "npy" ? TaskMetric::kAccuracy
                                                                : TaskMetric::kLoss;
}

TaskProgress ProgressOf(const json& j, TaskMetric metric) {
  TaskProgress p;
  p.metric = metric;
  p.status = j.value("status", "");
  if (p.status == "open" && j.contains("phase") && j["phase"].is_string()) {
    p.phase = j["phase"].get<std::string>();
  }
  const json params = j.value("params", json::object());
  p.rounds = params.value("rounds", 0u);
  p.units_per_round = params.value("units_per_round", 0u);
  p.round = j.contains("round") && j["round"].is_number() ? j["round"].get<uint32_t>() : 0;
  p.units_total = j.value("unit_count", uint64_t{0});
  p.money = MoneyOf(j);
  p.budget = p.money.budget;
  p.spent = p.money.spent;
  p.escrow = p.money.escrow;
  p.refunded = p.money.refunded;
  const json results = j.value("round_results", json::array());
  p.rounds_done = results.size();
  if (!results.empty()) {
    if (p.metric == TaskMetric::kAccuracy) {
      p.last_accuracy = results.back().value("test_accuracy_ppm", 0u) / 1e6;
    }
    p.last_test_loss = results.back().value("test_loss_micros", uint64_t{0}) / 1e6;
  }
  double loss_sum = 0;
  uint32_t loss_n = 0, loss_round = 0;
  for (const json& u : j.value("units", json::array())) {
    const std::string s = u.value("status", "");
    // A unit without a loss (0: a pipeline stage before the last, which computes none) is left
    // out of the mean, not counted as a zero loss.
    const uint64_t loss_micros = u.value("loss_micros", uint64_t{0});
    if (s == "committed" || s == "verified") ++p.units_committed;
    if ((s == "committed" || s == "verified") && loss_micros > 0) {
      const uint32_t r = u.value("round", 0u);
      if (r > loss_round || loss_n == 0) {
        if (r > loss_round) loss_sum = 0, loss_n = 0;
        loss_round = r;
      }
      if (r == loss_round) loss_sum += static_cast<double>(loss_micros) / 1e6, ++loss_n;
    }
    if (s == "assigned") ++p.units_assigned;
    if (u.value("paid", uint64_t{0}) > 0) ++p.units_paid;
  }
  if (loss_n > 0) p.last_train_loss = loss_sum / loss_n;
  const std::string fs = j.value("final_state", "");
  if (fs.find_first_not_of('0') != std::string::npos) p.final_state = fs;
  return p;
}

std::string TaskProgress::StatusText() const {
  // A closed task's round machine stays in whatever phase it was in (a cancelled task's often
  // "awaiting_verification_window"): only an open task's phase says anything.
  if (status != "open" || phase.empty()) return status;
  std::string ph = phase;
  for (char& c : ph) c = c == '_' ? ' ' : c;
  return status + " (round " + std::to_string(round) + ": " + ph + ")";
}

std::string ProgressLine(const TaskProgress& p) {
  std::string s = fmt::format("rounds {}/{} done, units {}/{} ({} assigned)", p.rounds_done,
                              p.rounds, p.units_committed, p.units_total, p.units_assigned);
  if (p.last_train_loss >= 0) s += fmt::format(" train loss {:.4f}", p.last_train_loss);
  if (p.metric == TaskMetric::kAccuracy && p.last_accuracy >= 0) {
    s += fmt::format(" test acc {:.4f}", p.last_accuracy);
  } else if (p.last_test_loss >= 0) {
    s += fmt::format(" test loss {:.4f}", p.last_test_loss);
  }
  s += fmt::format(" spent {}/{}", p.spent, p.budget);
  return s;
}

namespace {
std::string MetricTextOf(TaskMetric metric, double accuracy, double loss) {
  switch (metric) {
    case TaskMetric::kAccuracy:
      return fmt::format("test accuracy {:.4f}, loss {:.4f}", accuracy, loss);
    case TaskMetric::kLoss:
      return fmt::format("test loss {:.4f}, perplexity {:.2f}", loss, std::exp(loss));
    case TaskMetric::kUnknown:
      break;
  }
  return fmt::format("test loss {:.4f}", loss);
}
}  // namespace

std::string RoundMetricText(const json& r, TaskMetric metric) {
  return MetricTextOf(metric, r.value("test_accuracy_ppm", 0u) / 1e6,
                      r.value("test_loss_micros", uint64_t{0}) / 1e6);
}

std::string MetricText(const TaskProgress& p) {
  if (p.rounds_done == 0) return "no round finished yet";
  return MetricTextOf(p.metric, p.last_accuracy, p.last_test_loss);
}

json MetricJson(const TaskProgress& p) {
  json j = json::object();
  if (p.rounds_done > 0) {
    if (p.metric == TaskMetric::kAccuracy) j["test_accuracy"] = p.last_accuracy;
    j["test_loss"] = p.last_test_loss;
    if (p.metric == TaskMetric::kLoss) j["test_perplexity"] = std::exp(p.last_test_loss);
  }
  if (p.last_train_loss >= 0) j["train_loss"] = p.last_train_loss;
  return j;
}

Status CheckTaskIdText(const std::string& typed) { return CheckIdText("task id", typed); }

Result<Hash256> ResolveTaskId(ledger::RpcClient& rpc, const std::string& typed) {
  ML_ASSIGN_OR_RETURN(std::string hex,
                      ResolveIdPrefix("task", typed, "on " + rpc.url(), [&](const IdVisitor& each) {
                        return ForEachListedId(rpc, "list_tasks", json::object(), each);
                      }));
  return Hash256::FromHex(hex, "task id");
}

Result<Bytes> FetchBlob(ledger::RpcClient& rpc, net::BlobStore* store, const net::BlobId& id,
                        uint64_t* wire_bytes) {
  if (!store->HasBlob(id)) {
    ML_ASSIGN_OR_RETURN(std::vector<std::string> endpoints, NodeEndpoints(rpc));
    if (endpoints.empty()) return Unavailable("no active node to fetch blob " + id.ToHex() + " from");
    net::HttpTransport transport;
    net::Fetcher fetcher(&transport, store, {.pin = true});
    ML_ASSIGN_OR_RETURN(net::FetchStats st, fetcher.Fetch(id, endpoints));
    if (wire_bytes) *wire_bytes += st.wire_bytes;
  }
  return store->Get(id);
}

Status WriteModel(Env* env, const engine::TaskSpec& task, ByteSpan state_blob,
                  const std::string& path, Hash256* weights_hash, const ModelOrigin& origin) {
  ML_ASSIGN_OR_RETURN(node::GlobalState s, node::DecodeGlobalState(state_blob));
  engine::TrainState st;
  ML_ASSIGN_OR_RETURN(engine::ModelSpec spec, node::ModelSpecForState(task.model, s.weights.size()));
  ML_ASSIGN_OR_RETURN(st.model, engine::Model::Create(spec));
  st.seed = task.seed;
  if (static_cast<uint64_t>(st.model->NumParameters()) != s.weights.size()) {
    return DataLoss(fmt::format("the state blob has {} weights but the task's model has {}",
                                s.weights.size(), st.model->NumParameters()));
  }
  size_t off = 0;
  for (engine::Param& p : st.model->params()) {
    std::copy(s.weights.begin() + static_cast<std::ptrdiff_t>(off),
              s.weights.begin() + static_cast<std::ptrdiff_t>(off + p.value.size()), p.value.data());
    off += static_cast<size_t>(p.value.size());
  }
  const Hash256 wh = node::HashFloats(s.weights);
  if (weights_hash) *weights_hash = wh;
  std::map<std::string, std::string> meta = {{"meshlearn.network", "diloco"},
                                             {"meshlearn.weights_hash", wh.ToHex()}};
  if (!origin.task_id.empty()) meta["meshlearn.task"] = origin.task_id;
  if (!origin.state.empty()) meta["meshlearn.state"] = origin.state;
  if (origin.round >= 0) meta["meshlearn.round"] = std::to_string(origin.round);
  return engine::SaveModel(env, path, st, meta);
}

Result<json> WatchTask(ledger::RpcClient& rpc, const Hash256& id, int64_t timeout_ms,
                       const std::function<void(const json&)>& on_progress,
                       const std::function<bool()>& stop) {
  const int64_t t0 = SystemClock::Default()->MonotonicMicros();
  std::string last;
  while (true) {
    ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
    // Only to notice changes: any metric shows the loss.
    std::string key = ProgressLine(ProgressOf(j, TaskMetric::kUnknown));
    if (key != last) {
      last = key;
      if (on_progress) on_progress(j);
    }
    if (j.value("status", "open") != "open") return j;
    if (stop && stop()) return Unavailable("stopped while watching task " + id.ToHex());
    if (timeout_ms > 0 && (SystemClock::Default()->MonotonicMicros() - t0) / 1000 > timeout_ms) {
      return DeadlineExceeded(fmt::format("task {} is still open after {} s; `meshlearn task "
                                          "watch {}` continues", id.ToHex(), timeout_ms / 1000,
                                          id.ToHex()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// ---- Commands --------------------------------------------------------------------------------

namespace {

struct TaskArgs {
  std::string file;
  std::string id;
  std::string key;
  std::string rpc;
  std::string passphrase_file;
  std::string memo;
  std::string out;
  int replicas = 2;
  int64_t timeout_s = 0;
  bool dry_run = false;
};


// "--rpc URL" when the user gave one: every follow-up command printed must run as printed.
std::string RpcFlag(const TaskArgs& a) { return a.rpc.empty() ? "" : " --rpc " + a.rpc; }

Result<KeyPair> LoadKey(GlobalOptions& g, const TaskArgs& a) {
  if (a.key.empty()) return InvalidArgument("--key NAME is required: the key that signs and pays");
  KeyStore store(Env::Default(), g.KeysDir());
  ML_ASSIGN_OR_RETURN(std::string pass, ReadPassphrase(a.passphrase_file, false, !g.json));
  return store.Load(a.key, pass);
}

json ParamsJson(const ledger::TaskParams& p) {
  json j = json::object();
  ledger::TaskParams::Visit(p, [&](const char* name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Hash256>) {
      j[name] = v.ToHex();
    } else {
      j[name] = v;
    }
  });
  return j;
}

namespace {

// What the ledger's scheduler asks of an aggregator of the task: protocol::AggregatorMemoryBytes
// of the view it builds from the params (ledger TaskSpecViewOf: a pipeline task's units are its
// replicas' stages).
uint64_t AggregatorMemory(const PreparedTask& t) {
  return protocol::AggregatorMemoryBytes(ledger::TaskSpecViewOf(Hash256{}, t.params, 0));
}

}  // namespace

json PreparedJson(const PreparedTask& t) {
  return {{"file", t.path},
          {"rounds", t.net.rounds},
          {"units_per_round", t.net.units_per_round},
          {"inner_steps", t.net.inner_steps},
          {"checkpoint_interval", t.params.checkpoint_interval},
          {"batch_size", t.params.batch_size},
          {"parameters", t.facts.num_params},
          {"model_bytes", t.params.model_bytes},
          {"flops_per_sample", t.params.flops_per_sample},
          // Memory a node needs (bytes): for a whole unit (params.memory_bytes, the engine's
          // estimate: node::UnitMemoryBytes), for each pipeline stage, and to aggregate.
          {"memory_bytes", protocol::RequiredMemoryBytes(t.view)},
          {"stage_memory_bytes", t.params.stage_memory_bytes},
          {"aggregator_memory_bytes", AggregatorMemory(t)},
          {"unit_gflops", static_cast<double>(t.unit_flops) / 1e9},
          {"units", t.total_units},
          {"budget", t.net.budget},
          {"price_cap", t.net.price_cap},
          {"cost_at_price_cap", t.cost_at_cap},
          // What SubmitTask will carry (initial_state is zero until the blobs are stored).
          {"params", ParamsJson(t.params)},
          {"verification", t.net.tolerance_mode ? "tolerance" : "exact"},
          {"tolerance_rel_l2_ppm", t.params.tolerance_rel_l2_ppm},
          {"tolerance_cosine_gap_ppb", t.params.tolerance_cosine_gap_ppb},
          {"tolerance_measured", {{"rel_l2", t.tolerance_measured.rel_l2},
                                  {"cosine", t.tolerance_measured.cosine}}}};
}

// The chain's genesis when a ledger answers (no retries: a dry run or a quote must not hang on
// a ledger that is not there).
Result<ledger::Genesis> ReachableGenesis(const TaskArgs& a) {
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc), {.retries = 0});
  return FetchGenesis(rpc);
}

Status RunSubmit(GlobalOptions& g, const TaskArgs& a) {
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(env, a.file));
  if (a.dry_run) {
    json j = PreparedJson(t);
    // PrepareTask ran the ledger's checks for a chain of default parameters; a reachable ledger's
    // own parameters (verifiers per unit) are checked too.
    std::string against = "default chain parameters (no ledger answered at " +
                          ledger::DefaultRpcUrl(a.rpc) + ")";
    if (Result<ledger::Genesis> gen = ReachableGenesis(a); gen.ok()) {
      ML_RETURN_IF_ERROR(CheckTaskTerms(t, gen->params));
      against = "the chain at " + ledger::DefaultRpcUrl(a.rpc);
      j["checked_against"] = ledger::DefaultRpcUrl(a.rpc);
    } else {
      j["checked_against"] = "defaults";
    }
    j["valid"] = true;
    g.Output(j, [&] {
      std::cout << a.file << " is valid (SubmitTask's checks, for " << against << "): "
                << t.total_units << " units of "
                << fmt::format("{:.1f}", static_cast<double>(t.unit_flops) / 1e9)
                << " GFLOP; at most " << t.cost_at_cap << " tokens at the price cap (budget "
                << t.net.budget << ")\n";
      std::cout << "memory a node needs: " << protocol::RequiredMemoryBytes(t.view)
                << " bytes for a whole unit";
      for (size_t s = 0; s < t.params.stage_memory_bytes.size(); ++s) {
        std::cout << (s == 0 ? ", stages " : " / ") << t.params.stage_memory_bytes[s];
      }
      std::cout << ", " << AggregatorMemory(t) << " to aggregate\n";
      if (t.net.tolerance_mode) {
        std::cout << fmt::format(
            "tolerance mode: relative L2 <= {} ppm, cosine gap <= {} ppb (two kernel "
            "configurations differed by {:.3g} L2, {:.3g} cosine gap)\n",
            t.params.tolerance_rel_l2_ppm, t.params.tolerance_cosine_gap_ppb,
            t.tolerance_measured.rel_l2, 1 - t.tolerance_measured.cosine);
      }
    });
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadKey(g, a));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, g.Home().BlobsDir()));
  SubmitOptions o;
  o.memo = a.memo.empty() ? t.task.name : a.memo;
  o.replicas = a.replicas;
  if (!g.json) o.log = [](const std::string& s) { std::cerr << s << std::endl; };
  ML_ASSIGN_OR_RETURN(SubmittedTask s, SubmitPreparedTask(rpc, key, &t, store.get(), o));
  json j = PreparedJson(t);
  j["task_id"] = s.task_id.ToHex();
  j["tx"] = s.tx_id;
  j["height"] = s.height;
  j["pushed_to"] = s.pushed_to;
  j["pushed_bytes"] = s.pushed_bytes;
  g.Output(j, [&] {
    const std::string id = s.task_id.ToHex();
    std::cout << "task " << id << " submitted in block " << s.height << " (" << t.total_units
              << " units, budget " << t.net.budget << " escrowed)\n"
              << "watch it: meshlearn task watch " << id.substr(0, 12) << RpcFlag(a) << "\n";
  });
  return Status::Ok();
}

Result<engine::TaskSpec> TaskSpecFromBundle(ledger::RpcClient& rpc, net::BlobStore* store,
                                            const std::string& spec_hash);  // below, by fetch

// The metric of a task on the ledger (get_task's answer), from its bundle: read from the home's
// blob store or fetched from the nodes. Where no node serves it, kUnknown (the loss only), said
// on stderr (not with --json, whose output is one document).
TaskMetric MetricFromBundle(const GlobalOptions& g, ledger::RpcClient& rpc, const json& task) {
  Result<std::unique_ptr<net::BlobStore>> store =
      net::BlobStore::Open(Env::Default(), g.Home().BlobsDir());
  Result<engine::TaskSpec> spec =
      store.ok() ? TaskSpecFromBundle(rpc, store->get(), task.value("spec_hash", ""))
                 : Result<engine::TaskSpec>(store.status());
  if (!spec.ok()) {
    if (!g.json) {  // --json: the metric object itself says it (no test_accuracy, no perplexity)
      std::cerr << "warning: cannot read the task's spec (" << spec.status().message()
                << "); showing its test loss only\n";
    }
    return TaskMetric::kUnknown;
  }
  return TaskMetricOf(*spec);
}

// Prints a task's rounds, 0-based like every record of them, with the task's metric.
void PrintRounds(const json& task, const TaskProgress& p) {
  for (const json& r : task.value("round_results", json::array())) {
    std::cout << fmt::format("  round {:>3}: {}\n", r.value("round", 0u),
                             RoundMetricText(r, p.metric));
  }
}

Status RunStatus(GlobalOptions& g, const TaskArgs& a) {
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(rpc, a.id));
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
  TaskProgress p = ProgressOf(j, MetricFromBundle(g, rpc, j));
  j["money"] = MoneyJson(p.money);
  j["metric"] = MetricJson(p);
  g.Output(j, [&] {
    std::cout << "task " << id.ToHex() << ": " << p.StatusText() << "\n"
              << ProgressLine(p) << "\n"
              << MoneyLine(p.money) << "\n";
    if (!p.final_state.empty()) std::cout << "final state: " << p.final_state << "\n";
    // Until its audit window closes a finished task's model may still change: a fraud proof
    // reopens the task (docs/submitters.md, "Watch").
    const uint64_t audit_end = j.value("audit_window_end", uint64_t{0});
    if (p.status == "finished" && audit_end != 0) {
      std::cout << "audit window: until block " << audit_end
                << " a fraud proof reopens the task and the final state can change\n";
    }
    const json v = j.value("verification", json::object());
    if (const uint64_t reopened = v.value("reopened", uint64_t{0}); reopened > 0) {
      std::string to;
      for (const json& f : v.value("proven_frauds", json::array())) {
        if (f.value("rewound", false)) to = std::to_string(f.value("rewound_to", 0u));
      }
      std::cout << "reopened " << reopened << "x by a fraud proof after it finished (last back to"
                << " round " << to << "): the rounds ran again without the cheater\n";
    }
    // The disputes the ledger ruled, as its record keeps them (the units' checks may be gone).
    for (const json& r : v.value("rulings", json::array())) {
      std::cout << fmt::format(
          "ruling on unit {} step {} by {} (witness {} bytes) from {} in block "
          "{}: for the {} ({})\n",
          r.value("index", 0u), r.value("step", uint64_t{0}), r.value("tx", std::string()),
          r.value("witness_bytes", uint64_t{0}), r.value("sender", std::string()).substr(0, 12),
          r.value("height", uint64_t{0}), r.value("for", std::string()),
          r.value("reason", std::string()));
    }
    PrintRounds(j, p);
  });
  return Status::Ok();
}

Status RunWatch(GlobalOptions& g, const TaskArgs& a) {
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(rpc, a.id));
  ML_ASSIGN_OR_RETURN(json first, GetTask(rpc, id, true));
  const TaskMetric metric = MetricFromBundle(g, rpc, first);
  const TaskProgress p0 = ProgressOf(first, metric);
  json last = first;
  if (!p0.done()) {
    // The bar counts the units committed while it watches, so its rate and ETA are measured
    // over real elapsed time (not the units done before `watch` started).
    const int64_t base = static_cast<int64_t>(p0.units_committed);
    ProgressBar bar("task", static_cast<int64_t>(p0.units_total) - base, "new units", !g.json);
    Result<json> watched = WatchTask(rpc, id, a.timeout_s * 1000, [&](const json& j) {
      TaskProgress p = ProgressOf(j, metric);
      bar.Update(static_cast<int64_t>(p.units_committed) - base, ProgressLine(p));
      if (g.json) {
        json line = {{"status", p.status},
                     {"rounds_done", p.rounds_done},
                     {"round", p.round},
                     {"units_committed", p.units_committed},
                     {"units_assigned", p.units_assigned},
                     {"spent", p.spent}};
        line.update(MetricJson(p));
        std::cout << line.dump() << std::endl;
      }
    });
    if (!watched.ok()) {
      bar.Finish();
      if (watched.status().code() != StatusCode::kDeadlineExceeded) return watched.status();
      return DeadlineExceeded(fmt::format("task {} is still open after {} s; `meshlearn task "
                                          "watch {}{}` continues", id.ToHex(), a.timeout_s,
                                          id.ToHex().substr(0, 12), RpcFlag(a)));
    }
    last = *watched;
    bar.Finish(ProgressLine(ProgressOf(last, metric)));
  }
  TaskProgress p = ProgressOf(last, metric);
  if (g.json) {
    last["money"] = MoneyJson(p.money);
    last["metric"] = MetricJson(p);
    std::cout << last.dump() << std::endl;
  } else {
    std::cout << "task " << id.ToHex() << " " << p.StatusText() << ": " << MetricText(p) << "\n"
              << MoneyLine(p.money) << "\n";
    if (p.rounds_done > 0) {
      std::cout << "fetch it: meshlearn task fetch " << id.ToHex().substr(0, 12) << RpcFlag(a)
                << " --out task-" << id.ToHex().substr(0, 12) << "\n";
    }
  }
  return Status::Ok();
}

// The task spec of a task from its bundle (model only: data paths stay "blob:..."), with what
// the bundle's data decided at submission: a vocabulary taken from the data (model.vocab_size =
// 0 in the file) is the one the task's initial state was made with, read back from its size.
Result<engine::TaskSpec> TaskSpecFromBundle(ledger::RpcClient& rpc, net::BlobStore* store,
                                            const std::string& spec_hash) {
  ML_ASSIGN_OR_RETURN(Hash256 sh, Hash256::FromHex(spec_hash, "spec_hash"));
  ML_ASSIGN_OR_RETURN(Bytes bundle, FetchBlob(rpc, store, net::BlobId{sh}));
  return engine::TaskSpec::Parse(std::string(bundle.begin(), bundle.end()), "bundle.toml", ".");
}

// The state a fetch takes: the final one, or the latest finished round's; and that round.
struct StateChoice {
  std::string state_hex;
  int64_t round = -1;  // 0-based round whose aggregate it is
};
Result<StateChoice> ChooseState(const json& j, const TaskProgress& p, const std::string& id) {
  const json rr = j.value("round_results", json::array());
  if (rr.empty()) {
    return FailedPrecondition("task " + id + " has no finished round yet (" + ProgressLine(p) +
                              "); try again later");
  }
  StateChoice c;
  c.round = static_cast<int64_t>(rr.size()) - 1;
  c.state_hex = p.final_state.empty() ? rr.back().value("state", "") : p.final_state;
  return c;
}

Status RunFetch(GlobalOptions& g, const TaskArgs& a) {
  Env* env = Env::Default();
  if (a.out.empty()) return InvalidArgument("--out DIR is required");
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(rpc, a.id));
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
  TaskProgress p = ProgressOf(j, TaskMetric::kUnknown);  // the task's metric once its spec is read
  ML_ASSIGN_OR_RETURN(StateChoice c, ChooseState(j, p, id.ToHex()));
  if (p.final_state.empty() && !g.json) {
    std::cerr << "task is " << p.StatusText() << "; fetching round " << c.round << "'s state\n";
  }
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, g.Home().BlobsDir()));
  ML_ASSIGN_OR_RETURN(engine::TaskSpec task, TaskSpecFromBundle(rpc, store.get(), j.value("spec_hash", "")));
  p = ProgressOf(j, TaskMetricOf(task));
  ML_ASSIGN_OR_RETURN(Hash256 sid, Hash256::FromHex(c.state_hex, "state"));
  uint64_t wire = 0;
  ML_ASSIGN_OR_RETURN(Bytes blob, FetchBlob(rpc, store.get(), net::BlobId{sid}, &wire));
  ML_RETURN_IF_ERROR(env->CreateDirs(a.out));
  const std::string model = JoinPath(a.out, "model.safetensors");
  Hash256 wh;
  ML_RETURN_IF_ERROR(WriteModel(env, task, blob, model, &wh,
                                ModelOrigin{.task_id = id.ToHex(), .state = c.state_hex,
                                            .round = c.round}));
  json report = {{"task_id", id.ToHex()},
                 {"status", p.status},
                 {"rounds_done", p.rounds_done},
                 {"round", c.round},
                 {"units", p.units_total},
                 {"units_paid", p.units_paid},
                 {"metric", MetricJson(p)},
                 {"money", MoneyJson(p.money)},
                 {"state", c.state_hex},
                 {"weights_hash", wh.ToHex()},
                 {"model", model},
                 {"weights_history", j.value("weights_history", json::array())},
                 {"round_results", j.value("round_results", json::array())}};
  ML_RETURN_IF_ERROR(WriteReportFile(JoinPath(a.out, "report.json"), report, {"model"}));
  g.Output(report, [&] {
    std::cout << "model:  " << model << " (round " << c.round << ": " << MetricText(p) << ")\n"
              << "        " << (p.final_state.empty() ? "state " : "final state ") << c.state_hex
              << ", weights hash " << wh.ToHex() << "\n"
              << "report: " << JoinPath(a.out, "report.json") << "\n"
              << "check it: meshlearn task verify-model " << id.ToHex().substr(0, 12) << " "
              << model << RpcFlag(a) << "\n";
  });
  return Status::Ok();
}

// Ties a model file to the ledger's record: the weights in FILE must be those of a global state
// the ledger recorded for the task (the final one, or the round the file says it is), fetched by
// its id (a content address: whoever serves it serves the recorded state).
Status RunVerifyModel(GlobalOptions& g, const TaskArgs& a) {
  Env* env = Env::Default();
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(rpc, a.id));
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, false));
  TaskProgress p = ProgressOf(j, TaskMetric::kUnknown);  // its states and status, not its metric
  ML_ASSIGN_OR_RETURN(engine::TrainState st, engine::LoadCheckpoint(env, a.file));
  std::vector<float> weights;
  for (const engine::Param& prm : st.model->params()) {
    weights.insert(weights.end(), prm.value.data(), prm.value.data() + prm.value.size());
  }
  const Hash256 file_hash = node::HashFloats(weights);
  // Which recorded state: the one the file names (task fetch writes it), else the final state.
  ML_ASSIGN_OR_RETURN(engine::SafetensorsFile sf, engine::SafetensorsFile::Read(env, a.file));
  std::string want = sf.metadata().count("meshlearn.state") ? sf.metadata().at("meshlearn.state")
                                                            : p.final_state;
  int64_t round = -1;
  const json rr = j.value("round_results", json::array());
  for (size_t r = 0; r < rr.size(); ++r) {
    if (rr[r].value("state", "") == want) round = static_cast<int64_t>(r);
  }
  if (want.empty() || round < 0) {
    return FailedPrecondition(
        want.empty() ? "task " + id.ToHex() + " has no final state yet (" + p.StatusText() + ")"
                     : a.file + " names state " + want + ", which task " + id.ToHex() +
                           " never recorded");
  }
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, g.Home().BlobsDir()));
  ML_ASSIGN_OR_RETURN(Hash256 sid, Hash256::FromHex(want, "state"));
  ML_ASSIGN_OR_RETURN(Bytes blob, FetchBlob(rpc, store.get(), net::BlobId{sid}));
  ML_ASSIGN_OR_RETURN(node::GlobalState s, node::DecodeGlobalState(blob));
  const Hash256 recorded = node::HashFloats(s.weights);
  const bool match = recorded == file_hash;
  const bool is_final = want == p.final_state;
  json out = {{"task_id", id.ToHex()},   {"file", a.file},
              {"state", want},           {"round", round},
              {"final", is_final},       {"weights_hash", file_hash.ToHex()},
              {"recorded_weights_hash", recorded.ToHex()}, {"match", match}};
  if (!match) {
    if (g.json) std::cout << out.dump() << std::endl;
    return DataLoss(fmt::format(
        "{} does not hold the weights of task {}'s round {} state {}: weights hash {}, the "
        "recorded state's {}", a.file, id.ToHex(), round, want, file_hash.ToHex(),
        recorded.ToHex()));
  }
  g.Output(out, [&] {
    std::cout << "OK: " << a.file << " holds the weights of task " << id.ToHex() << "'s "
              << (is_final ? "final state" : "round " + std::to_string(round) + " state")
              << " " << want << " (round " << round << ")\nweights hash " << file_hash.ToHex()
              << "\n";
  });
  return Status::Ok();
}

Status RunCancel(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadKey(g, a));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(rpc, a.id));
  ML_ASSIGN_OR_RETURN(std::string chain_id, ledger::FetchChainId(rpc));
  ML_ASSIGN_OR_RETURN(uint64_t nonce, ledger::FetchNextNonce(rpc, key.public_key()));
  ledger::Transaction tx =
      ledger::BuildSignedTx(key, chain_id, nonce, ledger::CancelTaskTx{.task_id = id});
  ML_ASSIGN_OR_RETURN(json done, ledger::SendTxAndWait(rpc, tx, 60000));
  const json receipt = done.value("receipt", json::object());
  if (!receipt.value("ok", false)) {
    return FailedPrecondition("CancelTask was refused: " +
                              receipt.value("reason", std::string("no reason given")));
  }
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, false));
  const TaskMoney m = MoneyOf(j);
  j["money"] = MoneyJson(m);
  g.Output(j, [&] {
    std::cout << "task " << id.ToHex() << " cancelled; " << MoneyLine(m) << "\n";
  });
  return Status::Ok();
}

// What a task is expected to cost and take on a network: every payment the ledger makes from
// the escrow (ledger PayFromEscrow: units, verifications, aggregations), the treasury's cut of
// each, and the blocks a round waits for. See docs/submitters.md, "Check and price it".
struct QuoteNode {
  uint64_t price = 0;  // per GFLOP
  uint64_t unit_ms = 0;
  protocol::Reputation rep;
};

struct TaskQuote {
  uint64_t unit_cost = 0;  // at the mean solver price
  double checks = 0;       // expected verified units (each by verifiers_per_unit verifiers)
  double to_solvers = 0, to_verifiers = 0, to_aggregators = 0, treasury_cut = 0;
  double spent() const { return to_solvers + to_verifiers + to_aggregators; }
  double seconds = 0;
  uint64_t blocks_per_round = 0;
};

TaskQuote QuoteTask(const PreparedTask& t, const ledger::Genesis& gen,
                    const std::vector<QuoteNode>& nodes, uint64_t price) {
  const ledger::ChainParams& cp = gen.params;
  TaskQuote q;
  q.unit_cost = protocol::UnitCostTokens(t.view, price);
  // A stage unit's segments are its steps (ledger verification.cc, CheckConfig), and its check
  // replays the last one as well to bind the result (protocol::StageStepsReplayed).
  const bool staged = t.params.stages > 1;
  const uint32_t segments =
      staged ? t.params.inner_steps
             : protocol::SegmentCount(t.params.inner_steps, t.params.checkpoint_interval);
  // The most a check of `drawn` segments replays: for a stage, drawn steps that miss the last.
  auto replays = [&](uint32_t drawn) {
    if (!staged) return drawn;
    std::vector<uint32_t> first(std::min(drawn, segments));
    std::iota(first.begin(), first.end(), 0u);
    return protocol::StageStepsReplayed(first, segments);
  };
  uint32_t replayed = replays(std::min(cp.verify_segments_per_check, segments));
  auto cut = [&](uint64_t amount) {
    // ledger BasisPoints: floor(amount x bps / 10000) of each payment.
    return static_cast<double>(amount / 10000 * cp.treasury_cut_bps +
                               amount % 10000 * cp.treasury_cut_bps / 10000);
  };
  const double v = cp.verification ? cp.verifiers_per_unit : 0;
  // The units go round the eligible nodes; how often and how much of each is replayed follows
  // the task's assurance and its node's reputation as the task goes (a new node's units are all
  // checked), exactly as the ledger draws it (protocol::PlanCheck).
  if (cp.verification && !nodes.empty()) {
    const protocol::VerificationParams vp = cp.Verification();
    std::vector<protocol::Reputation> reps;
    std::vector<double> clean;
    for (const QuoteNode& n : nodes) reps.push_back(n.rep), clean.push_back(0);
    for (uint64_t u = 0; u < t.total_units; ++u) {
      const size_t i = u % nodes.size();
      const protocol::CheckPlan plan = protocol::PlanCheck(t.net.assurance, reps[i], segments, vp);
      const double p = plan.probability_permille / 1000.0;
      const uint64_t pay = protocol::VerifierPay(q.unit_cost, replays(plan.segments), segments);
      replayed = std::max(replayed, replays(plan.segments));
      q.checks += p;
      q.to_verifiers += p * v * static_cast<double>(pay);
      q.treasury_cut += p * v * cut(pay);
      clean[i] += p;  // an honest unit that is checked is clean: the streak grows
      const uint64_t whole = static_cast<uint64_t>(clean[i]);
      reps[i].verified_clean = nodes[i].rep.verified_clean + whole;
      reps[i].clean_streak = nodes[i].rep.clean_streak + whole;
    }
    // A forced error re-runs its unit, which is checked again (the forced one is not paid), at
    // about the mean pay of a check.
    const double reruns = static_cast<double>(t.total_units) * cp.forced_error_per_million / 1e6;
    if (q.checks > 0) {
      q.to_verifiers *= 1 + reruns / q.checks;
      q.treasury_cut *= 1 + reruns / q.checks;
    }
    q.checks += reruns;
  }
  const double units = static_cast<double>(t.total_units);
  const double rounds = t.net.rounds;
  q.to_solvers = units * static_cast<double>(q.unit_cost);
  q.to_aggregators = rounds * static_cast<double>(q.unit_cost);
  q.treasury_cut += (units + rounds) * cut(q.unit_cost);
  // Time: a round's units run in parallel over the nodes, then wait for blocks: assignment,
  // commit, the verdicts' commit and reveal (each verifier replays `replayed` segments of a
  // unit), the aggregator's assignment and commit, the verification window, and settlement.
  uint64_t slowest = 1;
  for (const QuoteNode& n : nodes) slowest = std::max(slowest, n.unit_ms);
  const uint64_t per_node = nodes.empty() ? t.net.units_per_round
                                          : (t.net.units_per_round + nodes.size() - 1) /
                                                nodes.size();
  const uint64_t block_ms = static_cast<uint64_t>(std::max<int64_t>(1, gen.block_interval_ms));
  auto blocks = [&](uint64_t ms) { return (ms + block_ms - 1) / block_ms; };
  const uint64_t train = 2 + blocks(per_node * slowest) + 2 + 1;
  uint64_t settle = t.net.verification_window_blocks + 1;
  if (cp.verification) settle += 2 + blocks(slowest * replayed / std::max(1u, segments));
  q.blocks_per_round = train + settle;
  // Rounds in flight (genesis rounds_in_flight = k): a round trains while up to k earlier ones
  // settle, so rounds start every max(train, (train + settle) / (k + 1)) blocks and only the
  // last round's settling adds to the end.
  const uint64_t k = cp.verification ? cp.rounds_in_flight : 0;
  const uint64_t pace = std::max(train, (train + settle + k) / (k + 1));
  const double total_blocks = (rounds - 1) * static_cast<double>(pace) + static_cast<double>(train + settle);
  q.seconds = total_blocks * static_cast<double>(block_ms) / 1000.0;
  return q;
}

Status RunQuote(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(Env::Default(), a.file));
  json j = PreparedJson(t);
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc), {.retries = 0});
  Result<ledger::Genesis> gen = FetchGenesis(rpc);
  std::vector<QuoteNode> eligible;
  json nodes = json::array();
  std::string note;
  if (gen.ok()) {
    // The chain's own SubmitTask checks (its verifiers per unit decide the least budget).
    ML_RETURN_IF_ERROR(CheckTaskTerms(t, gen->params));
    protocol::SchedulerParams sp;
    sp.block_interval_ms = static_cast<uint64_t>(gen->block_interval_ms);
    sp.liveness_blocks = gen->params.liveness_blocks;
    sp.deadline_slack_permille = gen->params.deadline_slack_permille;
    sp.min_deadline_blocks = gen->params.min_deadline_blocks;
    Result<json> page = rpc.Call("list_nodes", {{"limit", 100}});
    if (!page.ok()) return page.status().WithPrefix("list_nodes");
    for (const json& n : page->value("items", json::array())) {
      if (!n.is_object() || n.value("status", "") != "active") continue;
      if ((n.value("roles", 0u) & ledger::kRoleSolver) == 0) continue;
      protocol::NodeView v;
      const json caps = n.value("capabilities", json::object());
      v.memory_bytes = caps.value("memory_bytes", uint64_t{0});
      v.disk_bytes = caps.value("disk_bytes", uint64_t{0});
      v.throughput_flops = caps.value("throughput", uint64_t{0});
      v.latency_ms = caps.value("latency_ms", 0u);
      v.bandwidth_bytes_per_s = caps.value("bandwidth_bytes_per_s", uint64_t{0});
      v.price_per_gflop = n.value("price", uint64_t{0});
      if (v.throughput_flops == 0 || v.bandwidth_bytes_per_s == 0) continue;
      if (v.price_per_gflop > t.net.price_cap) continue;
      // The least a node must hold to take a unit: a whole unit's need, or the lightest stage's
      // (the ledger's PlaceStages floor, against what the node holds of a stage: its declared
      // disk counted, StageHoldBytes).
      const uint64_t need = t.params.stages > 1
                                ? *std::min_element(t.params.stage_memory_bytes.begin(),
                                                    t.params.stage_memory_bytes.end())
                                : protocol::RequiredMemoryBytes(t.view);
      const uint64_t holds = t.params.stages > 1
                                 ? protocol::StageHoldBytes(v, t.params.inner_steps)
                                 : v.memory_bytes;
      if (holds < need) continue;
      QuoteNode q{.price = v.price_per_gflop, .unit_ms = protocol::EstimatedUnitMs(v, t.view, sp)};
      const json rep = n.value("reputation", json::object());
      q.rep.completed = rep.value("units_completed", uint64_t{0});
      q.rep.verified_clean = rep.value("units_verified_clean", uint64_t{0});
      q.rep.clean_streak = rep.value("clean_streak", uint64_t{0});
      q.rep.failures = rep.value("failures", uint64_t{0});
      q.rep.slashes = rep.value("slashes", uint64_t{0});
      eligible.push_back(q);
      nodes.push_back({{"id", n.value("id", "")},
                       {"price", q.price},
                       {"unit_cost", protocol::UnitCostTokens(t.view, q.price)},
                       {"unit_ms", q.unit_ms}});
    }
    if (eligible.empty()) note = "no registered node can take this task (price cap, memory, benchmark)";
  } else {
    note = "ledger unreachable (" + gen.status().message() + "): cost at the price cap only";
  }
  j["eligible_nodes"] = nodes;
  // What the assurance buys: the most likely one corrupted segment (a poisoner's single
  // perturbation) escapes its unit's check, for the least checked solver (a trusted node with a
  // long clean streak; a new node is checked more), by the chain's rules (the defaults when no
  // ledger answers). Whistleblowers and audits only add to the checks.
  const ledger::ChainParams chain_params = gen.ok() ? gen->params : ledger::ChainParams{};
  const uint32_t segments =
      protocol::SegmentCount(t.params.inner_steps, t.params.checkpoint_interval);
  protocol::Reputation trusted;
  trusted.verified_clean = trusted.completed = chain_params.Verification().trusted_after;
  trusted.clean_streak = 1'000'000;
  const protocol::CheckPlan least =
      protocol::PlanCheck(t.net.assurance, trusted, segments, chain_params.Verification());
  const double escape =
      chain_params.verification ? protocol::SegmentEscapePpm(least, segments) / 1e6 : 1.0;
  j["assurance"] = {{"level", protocol::AssuranceName(t.net.assurance.kind)},
                    {"segments_per_unit", segments},
                    {"least_check_probability", least.probability_permille / 1000.0},
                    {"least_segments_replayed", least.segments},
                    {"escape_probability", escape}};
  if (t.net.assurance.kind == protocol::Assurance::kAssuranceTarget) {
    j["assurance"]["target_escape_probability"] = t.net.assurance.target_escape_ppm / 1e6;
  }
  TaskQuote expected, lo, hi;
  if (!eligible.empty()) {
    uint64_t min_price = UINT64_MAX, max_price = 0, sum = 0;
    for (const QuoteNode& n : eligible) {
      min_price = std::min(min_price, n.price);
      max_price = std::max(max_price, n.price);
      sum += n.price;
    }
    const uint64_t mean = (sum + eligible.size() / 2) / eligible.size();
    expected = QuoteTask(t, *gen, eligible, mean);
    lo = QuoteTask(t, *gen, eligible, min_price);
    hi = QuoteTask(t, *gen, eligible, max_price);
    auto whole = [](double x) { return static_cast<uint64_t>(std::llround(x)); };
    j["expected"] = {{"spent", whole(expected.spent())},
                     {"paid_to_solvers", whole(expected.to_solvers)},
                     {"paid_to_verifiers", whole(expected.to_verifiers)},
                     {"paid_to_aggregators", whole(expected.to_aggregators)},
                     {"treasury_cut", whole(expected.treasury_cut)},
                     {"to_nodes", whole(expected.spent() - expected.treasury_cut)},
                     {"verified_units", expected.checks}};
    j["cost"] = whole(expected.spent());
    j["cost_min"] = whole(lo.spent());
    j["cost_max"] = whole(hi.spent());
    j["estimated_seconds"] = expected.seconds;
    j["blocks_per_round"] = expected.blocks_per_round;
    j["block_interval_ms"] = gen->block_interval_ms;
  } else {
    j["note"] = note;
  }
  g.Output(j, [&] {
    std::cout << fmt::format(
        "{}: {} rounds x {} units x {} steps x batch {} = {:.1f} GFLOP a unit ({} params)\n",
        a.file, t.net.rounds, t.net.units_per_round, t.net.inner_steps, t.params.batch_size,
        static_cast<double>(t.unit_flops) / 1e9, t.facts.num_params);
    std::cout << "at the price cap (" << t.net.price_cap << "/GFLOP) at most " << t.cost_at_cap
              << " tokens; budget " << t.net.budget << "\n";
    if (j.contains("cost")) {
      const json& e = j["expected"];
      std::cout << fmt::format(
          "{} eligible node(s): expected spend {} tokens (range {}..{}) = solvers {} + verifiers "
          "{} ({:.1f} verified units) + aggregators {}; the treasury keeps {} of it, the nodes "
          "get {}\nabout {} ({} blocks of {} ms a round)\n",
          eligible.size(), j["cost"].get<uint64_t>(), j["cost_min"].get<uint64_t>(),
          j["cost_max"].get<uint64_t>(), e["paid_to_solvers"].get<uint64_t>(),
          e["paid_to_verifiers"].get<uint64_t>(), expected.checks,
          e["paid_to_aggregators"].get<uint64_t>(), e["treasury_cut"].get<uint64_t>(),
          e["to_nodes"].get<uint64_t>(), ProgressBar::FormatDuration(expected.seconds),
          expected.blocks_per_round, gen->block_interval_ms);
    } else {
      std::cout << note << "\n";
    }
    std::cout << fmt::format(
        "assurance {}: a checked unit replays {} of its {} segment(s) (a trusted solver's units "
        "are checked with probability {:.3g}); one corrupted segment escapes with probability "
        "{:.4g}\n",
        protocol::AssuranceName(t.net.assurance.kind), least.segments, segments,
        least.probability_permille / 1000.0, escape);
  });
  return Status::Ok();
}

void AddCommon(CLI::App* c, TaskArgs& a, bool sends) {
  c->add_option("--rpc", a.rpc, "Ledger RPC URL (default $MESHLEARN_RPC or http://127.0.0.1:7700)");
  if (sends) {
    c->add_option("--key", a.key, "Key that signs and pays (see `meshlearn keys list`)");
    c->add_option("--passphrase-file", a.passphrase_file, "Read the key's passphrase from this file");
  }
}

void AddTask(CLI::App& root, GlobalOptions& g) {
  static TaskArgs a;
  CLI::App* task = root.add_subcommand("task", "Submit a training task to the network and follow it");
  task->require_subcommand(1);
  task->footer(
      "Examples:\n"
      "  meshlearn task quote examples/fashion-mlp.toml\n"
      "  meshlearn task submit examples/fashion-mlp.toml --key alice\n"
      "  meshlearn task watch 3f2a...\n"
      "  meshlearn task fetch 3f2a... --out out/mlp\n"
      "  meshlearn task audit 3f2a... --full\n"
      "See docs/submitters.md.");

  CLI::App* sub = task->add_subcommand("submit", "Validate, publish and submit a task file (escrows its budget)");
  sub->add_option("file", a.file, "Task file with a [network] table")->required();
  sub->add_option("--memo", a.memo, "Free text stored with the task (default: the task name)");
  sub->add_option("--replicas", a.replicas, "Nodes each blob is pushed to")->capture_default_str();
  sub->add_flag("--dry-run", a.dry_run, "Only validate the file (nothing is published or escrowed)");
  AddCommon(sub, a, true);
  sub->footer("Examples:\n"
              "  meshlearn task submit examples/fashion-mlp.toml --key alice\n"
              "  meshlearn task submit my-task.toml --dry-run\n"
              "  meshlearn --json task submit examples/fashion-cnn.toml --key alice --rpc http://127.0.0.1:7700\n"
              "The whole file is checked before anything is published or escrowed.");
  sub->callback([&g] { g.Exit(RunSubmit(g, a)); });

  CLI::App* st = task->add_subcommand("status", "Show a task's progress");
  st->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix (e.g. the 12 printed)")->required();
  AddCommon(st, a, false);
  st->footer("Examples:\n  meshlearn task status 3f2a...\n  meshlearn --json task status 3f2a...");
  st->callback([&g] { g.Exit(RunStatus(g, a)); });

  CLI::App* w = task->add_subcommand("watch", "Follow a task live until it finishes");
  w->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix (e.g. the 12 printed)")->required();
  w->add_option("--timeout", a.timeout_s, "Give up after this many seconds (0: never)")->capture_default_str();
  AddCommon(w, a, false);
  w->footer("Examples:\n  meshlearn task watch 3f2a...\n"
            "  meshlearn --json task watch 3f2a...   # one JSON line per change, then the task");
  w->callback([&g] { g.Exit(RunWatch(g, a)); });

  CLI::App* f = task->add_subcommand("fetch", "Download a task's final model and report");
  f->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix (e.g. the 12 printed)")->required();
  f->add_option("--out", a.out, "Directory for model.safetensors and report.json")->required();
  AddCommon(f, a, false);
  f->footer("Examples:\n  meshlearn task fetch 3f2a... --out out/mlp\n"
            "  meshlearn eval out/mlp/model.safetensors --task examples/fashion-mlp.toml");
  f->callback([&g] { g.Exit(RunFetch(g, a)); });

  CLI::App* vm = task->add_subcommand(
      "verify-model", "Check that a model file holds the weights of a state the ledger recorded");
  vm->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix")->required();
  vm->add_option("file", a.file, "Model file (task fetch's model.safetensors)")->required();
  AddCommon(vm, a, false);
  vm->footer("Fetches the state the file names (meshlearn.state, written by task fetch; else the\n"
             "task's final state) by its ledger id and compares its weights with the file's.\n"
             "Examples:\n  meshlearn task verify-model 3f2a9c01d4e7 out/mlp/model.safetensors");
  vm->callback([&g] { g.Exit(RunVerifyModel(g, a)); });

  CLI::App* c = task->add_subcommand("cancel", "Cancel an open task; the unspent budget is refunded");
  c->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix (e.g. the 12 printed)")->required();
  AddCommon(c, a, true);
  c->footer("Examples:\n  meshlearn task cancel 3f2a... --key alice");
  c->callback([&g] { g.Exit(RunCancel(g, a)); });

  CLI::App* q = task->add_subcommand("quote", "Estimate a task's cost and time from the registered nodes");
  q->add_option("file", a.file, "Task file with a [network] table")->required();
  AddCommon(q, a, false);
  q->footer("Examples:\n  meshlearn task quote examples/fashion-mlp.toml\n"
            "  meshlearn --json task quote examples/fashion-cnn.toml --rpc http://127.0.0.1:7700");
  q->callback([&g] { g.Exit(RunQuote(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(40, AddTask);

}  // namespace meshlearn::cli
