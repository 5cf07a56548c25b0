// meshlearn task submit|status|watch|fetch|cancel|quote: the submitter's commands (see
// docs/submitters.md). The shared pieces (task_client.h) are also what `meshlearn devnet` uses.
#include <chrono>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/blob_push.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/tolerance.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/scheduler.h"
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
  const uint32_t k = t->net.checkpoint_interval == 0 ? t->net.inner_steps
                                                     : t->net.checkpoint_interval;
  node::UnitWork work{.stream = protocol::UnitSeed(t->facts.seed,
                                                   protocol::UnitId{t->facts.content_id, 0, 0}),
                      .inner_steps = t->net.inner_steps,
                      .checkpoint_interval = k,
                      .lr_scale = t->net.InnerLrScale(0)};
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
  ML_ASSIGN_OR_RETURN(t.net, node::NetworkSpec::FromConfig(cfg));
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
  t.facts = node::ComputeTaskFacts(*t.trainer, t.net);
  ledger::TaskParams& p = t.params;
  p.rounds = t.net.rounds;
  p.units_per_round = t.net.units_per_round;
  p.inner_steps = t.net.inner_steps;
  p.batch_size = t.facts.batch_size;
  p.checkpoint_interval = t.net.checkpoint_interval;
  p.flops_per_sample = t.facts.flops_per_sample;
  p.model_bytes = t.facts.model_bytes;
  p.memory_bytes = 0;
  p.num_examples = t.facts.num_examples;
  p.seed = t.facts.seed;
  p.verification_window_blocks = t.net.verification_window_blocks;
  // The Merkle root over the training examples (zero for a token task): nodes refuse a task whose
  // data does not give it, and the ledger executes a disputed step against it (RefereeStepTx).
  p.data_root = t.facts.data_root;
  if (t.net.tolerance_mode) ML_RETURN_IF_ERROR(SetTolerance(env, path, &t));
  t.view = node::MakeTaskView(*t.trainer, t.net);
  t.view.flops_per_sample = p.flops_per_sample;
  t.view.model_bytes = p.model_bytes;
  Status v = protocol::ValidateTaskSpec(t.view);
  if (!v.ok()) return v.WithPrefix(path);
  t.total_units = uint64_t{t.net.rounds} * t.net.units_per_round;
  t.unit_flops = protocol::UnitFlops(t.view);
  ledger::Amount unit_cost = 0;
  // The ledger's own rule, for a chain with the default verifiers per unit (the ledger refuses
  // with the amount it needs when its genesis says otherwise).
  t.cost_at_cap = ledger::MaxTaskCost(p, t.net.price_cap, &unit_cost,
                                      ledger::ChainParams{}.verifiers_per_unit);
  // The ledger refuses a budget below the most the task can cost (no node works unpaid).
  if (t.net.budget < t.cost_at_cap) {
    return InvalidArgument(fmt::format(
        "{}: network.budget = {} is below the most this task can cost, {} = rounds x "
        "(units_per_round x (1 solver + 1 verifier) + 1 aggregation) x {} tokens a unit at "
        "price_cap {}; raise "
        "network.budget to at least {} or lower network.price_cap", path, t.net.budget,
        t.cost_at_cap, unit_cost, t.net.price_cap, t.cost_at_cap));
  }
  return t;
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

TaskProgress ProgressOf(const json& j) {
  TaskProgress p;
  p.status = j.value("status", "");
  p.phase = j["phase"].is_string() ? j["phase"].get<std::string>() : "";
  const json params = j.value("params", json::object());
  p.rounds = params.value("rounds", 0u);
  p.units_per_round = params.value("units_per_round", 0u);
  p.round = j["round"].is_number() ? j["round"].get<uint32_t>() : 0;
  p.units_total = j.value("unit_count", uint64_t{0});
  p.budget = j.value("budget", uint64_t{0});
  p.spent = j.value("spent", uint64_t{0});
  p.escrow = j.value("escrow", uint64_t{0});
  p.refunded = j.value("refunded", uint64_t{0});
  const json results = j.value("round_results", json::array());
  p.rounds_done = results.size();
  if (!results.empty()) {
    p.last_accuracy = results.back().value("test_accuracy_ppm", 0u) / 1e6;
    p.last_test_loss = results.back().value("test_loss_micros", uint64_t{0}) / 1e6;
  }
  double loss_sum = 0;
  uint32_t loss_n = 0, loss_round = 0;
  for (const json& u : j.value("units", json::array())) {
    const std::string s = u.value("status", "");
    if (s == "committed" || s == "verified") {
      ++p.units_committed;
      const uint32_t r = u.value("round", 0u);
      if (r > loss_round || loss_n == 0) {
        if (r > loss_round) loss_sum = 0, loss_n = 0;
        loss_round = r;
      }
      if (r == loss_round) loss_sum += u.value("loss_micros", uint64_t{0}) / 1e6, ++loss_n;
    }
    if (s == "assigned") ++p.units_assigned;
    if (u.value("paid", uint64_t{0}) > 0) ++p.units_paid;
  }
  if (loss_n > 0) p.last_train_loss = loss_sum / loss_n;
  const std::string fs = j.value("final_state", "");
  if (fs.find_first_not_of('0') != std::string::npos) p.final_state = fs;
  return p;
}

std::string ProgressLine(const TaskProgress& p) {
  std::string s = fmt::format("round {}/{} units {}/{} ({} assigned)",
                              std::min(p.rounds_done + (p.done() ? 0 : 1), uint64_t{p.rounds}),
                              p.rounds, p.units_committed, p.units_total, p.units_assigned);
  if (p.last_train_loss >= 0) s += fmt::format(" loss {:.4f}", p.last_train_loss);
  if (p.last_accuracy >= 0) s += fmt::format(" acc {:.4f}", p.last_accuracy);
  s += fmt::format(" spent {}/{}", p.spent, p.budget);
  return s;
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
                  const std::string& path, Hash256* weights_hash) {
  ML_ASSIGN_OR_RETURN(node::GlobalState s, node::DecodeGlobalState(state_blob));
  engine::TrainState st;
  ML_ASSIGN_OR_RETURN(st.model, engine::Model::Create(task.model));
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
  if (weights_hash) *weights_hash = node::HashFloats(s.weights);
  return engine::SaveModel(env, path, st, {{"meshlearn.network", "diloco"}});
}

Result<json> WatchTask(ledger::RpcClient& rpc, const Hash256& id, int64_t timeout_ms,
                       const std::function<void(const json&)>& on_progress,
                       const std::function<bool()>& stop) {
  const int64_t t0 = SystemClock::Default()->MonotonicMicros();
  std::string last;
  while (true) {
    ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
    std::string key = ProgressLine(ProgressOf(j));
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

std::string BlobDir(const GlobalOptions& g) { return JoinPath(g.home, "blobs"); }

Result<Hash256> ParseTaskId(const std::string& s) {
  return Hash256::FromHex(s, "task id");
}

Result<KeyPair> LoadKey(GlobalOptions& g, const TaskArgs& a) {
  if (a.key.empty()) return InvalidArgument("--key NAME is required: the key that signs and pays");
  KeyStore store(Env::Default(), g.KeysDir());
  ML_ASSIGN_OR_RETURN(std::string pass, ReadPassphrase(a.passphrase_file, false, !g.json));
  return store.Load(a.key, pass);
}

json PreparedJson(const PreparedTask& t) {
  return {{"file", t.path},
          {"rounds", t.net.rounds},
          {"units_per_round", t.net.units_per_round},
          {"inner_steps", t.net.inner_steps},
          {"batch_size", t.params.batch_size},
          {"parameters", t.facts.num_params},
          {"model_bytes", t.params.model_bytes},
          {"flops_per_sample", t.params.flops_per_sample},
          {"unit_gflops", static_cast<double>(t.unit_flops) / 1e9},
          {"units", t.total_units},
          {"budget", t.net.budget},
          {"price_cap", t.net.price_cap},
          {"cost_at_price_cap", t.cost_at_cap},
          {"verification", t.net.tolerance_mode ? "tolerance" : "exact"},
          {"tolerance_rel_l2_ppm", t.params.tolerance_rel_l2_ppm},
          {"tolerance_cosine_gap_ppb", t.params.tolerance_cosine_gap_ppb},
          {"tolerance_measured", {{"rel_l2", t.tolerance_measured.rel_l2},
                                  {"cosine", t.tolerance_measured.cosine}}}};
}

Status RunSubmit(GlobalOptions& g, const TaskArgs& a) {
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(env, a.file));
  if (a.dry_run) {
    json j = PreparedJson(t);
    j["valid"] = true;
    g.Output(j, [&] {
      std::cout << a.file << " is valid: " << t.total_units << " units of "
                << fmt::format("{:.1f}", static_cast<double>(t.unit_flops) / 1e9)
                << " GFLOP; at most " << t.cost_at_cap << " tokens at the price cap (budget "
                << t.net.budget << ")\n";
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
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, BlobDir(g)));
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
    std::cout << "task " << s.task_id.ToHex() << " submitted in block " << s.height << " ("
              << t.total_units << " units, budget " << t.net.budget << " escrowed)\n"
              << "watch it: meshlearn task watch " << s.task_id.ToHex() << "\n";
  });
  return Status::Ok();
}

Status RunStatus(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(Hash256 id, ParseTaskId(a.id));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
  TaskProgress p = ProgressOf(j);
  g.Output(j, [&] {
    std::cout << "task " << a.id << ": " << p.status << (p.phase.empty() ? "" : " (" + p.phase + ")")
              << "\n" << ProgressLine(p) << "\n";
    if (!p.final_state.empty()) std::cout << "final state: " << p.final_state << "\n";
    for (const json& r : j.value("round_results", json::array())) {
      std::cout << fmt::format("  round {:>3}: test accuracy {:.4f}, loss {:.4f}\n",
                               r.value("round", 0) + 1, r.value("test_accuracy_ppm", 0u) / 1e6,
                               r.value("test_loss_micros", uint64_t{0}) / 1e6);
    }
  });
  return Status::Ok();
}

Status RunWatch(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(Hash256 id, ParseTaskId(a.id));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(json first, GetTask(rpc, id, false));
  TaskProgress p0 = ProgressOf(first);
  ProgressBar bar("task", static_cast<int64_t>(p0.units_total), "units", !g.json);
  ML_ASSIGN_OR_RETURN(json last, WatchTask(rpc, id, a.timeout_s * 1000, [&](const json& j) {
    TaskProgress p = ProgressOf(j);
    bar.Update(static_cast<int64_t>(p.units_committed), ProgressLine(p));
    if (g.json) std::cout << json{{"round", p.rounds_done}, {"units_committed", p.units_committed},
                                  {"units_assigned", p.units_assigned},
                                  {"test_accuracy", p.last_accuracy}, {"spent", p.spent}}.dump()
                          << std::endl;
  }));
  TaskProgress p = ProgressOf(last);
  bar.Finish(ProgressLine(p));
  if (g.json) {
    std::cout << last.dump() << std::endl;
  } else {
    std::cout << "task " << a.id << " " << p.status << ": test accuracy "
              << fmt::format("{:.4f}", p.last_accuracy) << ", spent " << p.spent << ", refunded "
              << p.refunded << "\n";
    if (!p.final_state.empty()) std::cout << "fetch it: meshlearn task fetch " << a.id << " --out DIR\n";
  }
  return Status::Ok();
}

// The task spec of a task from its bundle (model only: data paths stay "blob:...").
Result<engine::TaskSpec> TaskSpecFromBundle(ledger::RpcClient& rpc, net::BlobStore* store,
                                            const std::string& spec_hash) {
  ML_ASSIGN_OR_RETURN(Hash256 sh, Hash256::FromHex(spec_hash, "spec_hash"));
  ML_ASSIGN_OR_RETURN(Bytes bundle, FetchBlob(rpc, store, net::BlobId{sh}));
  return engine::TaskSpec::Parse(std::string(bundle.begin(), bundle.end()), "bundle.toml", ".");
}

Status RunFetch(GlobalOptions& g, const TaskArgs& a) {
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(Hash256 id, ParseTaskId(a.id));
  if (a.out.empty()) return InvalidArgument("--out DIR is required");
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
  ML_ASSIGN_OR_RETURN(json j, GetTask(rpc, id, true));
  TaskProgress p = ProgressOf(j);
  std::string state_hex = p.final_state;
  if (state_hex.empty()) {
    const json rr = j.value("round_results", json::array());
    if (rr.empty()) {
      return FailedPrecondition("task " + a.id + " has no finished round yet (" +
                                ProgressLine(p) + "); try again later");
    }
    state_hex = rr.back().value("state", "");
    if (!g.json) std::cerr << "task is " << p.status << "; fetching round " << rr.size() << "'s state\n";
  }
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, BlobDir(g)));
  ML_ASSIGN_OR_RETURN(engine::TaskSpec task, TaskSpecFromBundle(rpc, store.get(), j.value("spec_hash", "")));
  ML_ASSIGN_OR_RETURN(Hash256 sid, Hash256::FromHex(state_hex, "state"));
  uint64_t wire = 0;
  ML_ASSIGN_OR_RETURN(Bytes blob, FetchBlob(rpc, store.get(), net::BlobId{sid}, &wire));
  ML_RETURN_IF_ERROR(env->CreateDirs(a.out));
  const std::string model = JoinPath(a.out, "model.safetensors");
  Hash256 wh;
  ML_RETURN_IF_ERROR(WriteModel(env, task, blob, model, &wh));
  json report = {{"task_id", a.id},
                 {"status", p.status},
                 {"rounds", p.rounds_done},
                 {"units", p.units_total},
                 {"units_paid", p.units_paid},
                 {"test_accuracy", p.last_accuracy},
                 {"test_loss", p.last_test_loss},
                 {"spent", p.spent},
                 {"refunded", p.refunded},
                 {"state_blob", state_hex},
                 {"final_weights_hash", wh.ToHex()},
                 {"model", model},
                 {"weights_history", j.value("weights_history", json::array())},
                 {"round_results", j.value("round_results", json::array())}};
  ML_RETURN_IF_ERROR(env->WriteFileAtomic(JoinPath(a.out, "report.json"), report.dump(2) + "\n"));
  g.Output(report, [&] {
    std::cout << "model:  " << model << " (test accuracy " << fmt::format("{:.4f}", p.last_accuracy)
              << ")\nreport: " << JoinPath(a.out, "report.json") << "\n";
  });
  return Status::Ok();
}

Status RunCancel(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(Hash256 id, ParseTaskId(a.id));
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadKey(g, a));
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc));
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
  g.Output(j, [&] {
    std::cout << "task " << a.id << " cancelled; refunded " << j.value("refunded", uint64_t{0})
              << " (spent " << j.value("spent", uint64_t{0}) << ")\n";
  });
  return Status::Ok();
}

Status RunQuote(GlobalOptions& g, const TaskArgs& a) {
  ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(Env::Default(), a.file));
  json j = PreparedJson(t);
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc), {.retries = 0});
  Result<json> page = rpc.Call("list_nodes", {{"limit", 100}});
  protocol::SchedulerParams sp;
  json nodes = json::array();
  uint64_t min_price = UINT64_MAX, max_price = 0;
  double units_per_ms = 0;  // all eligible nodes together
  if (page.ok()) {
    for (const json& n : page->value("items", json::array())) {
      if (n.value("status", "") != "active") continue;
      protocol::NodeView v;
      const json caps = n.value("capabilities", json::object());
      v.memory_bytes = caps.value("memory_bytes", uint64_t{0});
      v.throughput_flops = caps.value("throughput", uint64_t{0});
      v.latency_ms = caps.value("latency_ms", 0u);
      v.bandwidth_bytes_per_s = caps.value("bandwidth_bytes_per_s", uint64_t{0});
      v.price_per_gflop = n.value("price", uint64_t{0});
      if (v.throughput_flops == 0 || v.bandwidth_bytes_per_s == 0) continue;
      if (v.price_per_gflop > t.net.price_cap) continue;
      if (v.memory_bytes < protocol::RequiredMemoryBytes(t.view)) continue;
      const uint64_t ms = protocol::EstimatedUnitMs(v, t.view, sp);
      min_price = std::min(min_price, v.price_per_gflop);
      max_price = std::max(max_price, v.price_per_gflop);
      units_per_ms += 1.0 / static_cast<double>(ms);
      nodes.push_back({{"id", n.value("id", "")},
                       {"price", v.price_per_gflop},
                       {"unit_cost", protocol::UnitCostTokens(t.view, v.price_per_gflop)},
                       {"unit_ms", ms}});
    }
  }
  j["eligible_nodes"] = nodes;
  if (!nodes.empty()) {
    const uint64_t n_pay = t.total_units + t.net.rounds;
    j["cost_min"] = protocol::UnitCostTokens(t.view, min_price) * n_pay;
    j["cost_max"] = protocol::UnitCostTokens(t.view, max_price) * n_pay;
    // A round's units run in parallel across nodes; rounds run one after another.
    const double round_ms = std::max(static_cast<double>(t.net.units_per_round) / units_per_ms,
                                     1.0 / (units_per_ms / static_cast<double>(nodes.size())));
    j["estimated_seconds"] = round_ms * t.net.rounds / 1000.0;
  } else {
    j["note"] = page.ok() ? "no registered node can take this task (price cap, memory, benchmark)"
                          : "ledger unreachable (" + page.status().message() +
                                "): cost at the price cap only";
  }
  g.Output(j, [&] {
    std::cout << fmt::format(
        "{}: {} rounds x {} units x {} steps x batch {} = {:.1f} GFLOP a unit ({} params)\n",
        a.file, t.net.rounds, t.net.units_per_round, t.net.inner_steps, t.params.batch_size,
        static_cast<double>(t.unit_flops) / 1e9, t.facts.num_params);
    std::cout << "at the price cap (" << t.net.price_cap << "/GFLOP): " << t.cost_at_cap
              << " tokens; budget " << t.net.budget << "\n";
    if (j.contains("cost_min")) {
      std::cout << nodes.size() << " eligible node(s): cost " << j["cost_min"] << ".."
                << j["cost_max"] << " tokens, about "
                << ProgressBar::FormatDuration(j["estimated_seconds"].get<double>()) << "\n";
    } else {
      std::cout << j["note"].get<std::string>() << "\n";
    }
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
  st->add_option("id", a.id, "Task id (hex)")->required();
  AddCommon(st, a, false);
  st->footer("Examples:\n  meshlearn task status 3f2a...\n  meshlearn --json task status 3f2a...");
  st->callback([&g] { g.Exit(RunStatus(g, a)); });

  CLI::App* w = task->add_subcommand("watch", "Follow a task live until it finishes");
  w->add_option("id", a.id, "Task id (hex)")->required();
  w->add_option("--timeout", a.timeout_s, "Give up after this many seconds (0: never)")->capture_default_str();
  AddCommon(w, a, false);
  w->footer("Examples:\n  meshlearn task watch 3f2a...\n"
            "  meshlearn --json task watch 3f2a...   # one JSON line per change, then the task");
  w->callback([&g] { g.Exit(RunWatch(g, a)); });

  CLI::App* f = task->add_subcommand("fetch", "Download a task's final model and report");
  f->add_option("id", a.id, "Task id (hex)")->required();
  f->add_option("--out", a.out, "Directory for model.safetensors and report.json")->required();
  AddCommon(f, a, false);
  f->footer("Examples:\n  meshlearn task fetch 3f2a... --out out/mlp\n"
            "  meshlearn eval out/mlp/model.safetensors --task examples/fashion-mlp.toml");
  f->callback([&g] { g.Exit(RunFetch(g, a)); });

  CLI::App* c = task->add_subcommand("cancel", "Cancel an open task; the unspent budget is refunded");
  c->add_option("id", a.id, "Task id (hex)")->required();
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
