// meshlearn task audit ID [--full] [--sample N] [--seed S]: fetches a finished task's record from
// the ledger and its bundle and data from the nodes, re-executes its units (all of them with
// --full, else a seeded random sample) and checks every recorded hash, printing the chain from the
// initial weights to the final model and a verdict (node/task_audit.h does the work;
// docs/submitters.md "Audit a task"). It hangs under `meshlearn task`, which cmd_task.cc creates.
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "meshlearn/base/progress.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/task_audit.h"
#include "meshlearn/node/task_bundle.h"
#include "task_client.h"

namespace meshlearn::cli {
namespace {

using nlohmann::json;
using node::AuditCheck;

struct AuditArgs {
  std::string id;
  std::string rpc;
  std::string task_file;
  bool full = false;
  uint32_t sample = 3;
  std::optional<uint64_t> seed;
  uint64_t max_rebuild_units = 100;
};

// Rounds with more re-executed units than this print only their failures and a count.
constexpr size_t kMaxUnitLinesPerRound = 16;

const char* Mark(AuditCheck c) {
  switch (c) {
    case AuditCheck::kAuditCheckPass:
      return "✓";
    case AuditCheck::kAuditCheckFail:
      return "✗";
    case AuditCheck::kAuditCheckFetched:
      return "·";
    case AuditCheck::kAuditCheckSkipped:
      return "-";
  }
  return "?";
}

std::string Hex16(const Hash256& h) {
  return h.IsZero() ? std::string(16, '-') : h.ToHex().substr(0, 16);
}

void PrintReport(const node::AuditReport& r, double seconds) {
  std::cout << fmt::format("audit of task {}\n  {}: {} rounds x {} units x {} steps, {}",
                           r.task_id.ToHex(), r.task_name, r.rounds, r.units_per_round,
                           r.inner_steps, r.status);
  if (r.rounds_audited < r.rounds) std::cout << fmt::format(" after {} rounds", r.rounds_audited);
  std::cout << "\n";
  if (r.full) {
    std::cout << fmt::format("  full re-execution: {} units in {}\n\n", r.units_executed,
                             ProgressBar::FormatDuration(seconds));
  } else {
    std::cout << fmt::format(
        "  sample of {} units, seed {} (repeat it with --seed {}); {} units "
        "re-executed in {}\n\n",
        r.sample, r.seed, r.seed, r.units_executed, ProgressBar::FormatDuration(seconds));
  }
  if (r.chain.empty()) {  // nothing could be re-executed (the bundle disagrees with the ledger)
    std::cout << "FAIL: " << r.first_mismatch << "\n";
    return;
  }
  auto state_line = [](const node::AuditState& s) {
    std::cout << fmt::format("  {:<9} {}  {}  {}\n", s.name, Hex16(s.recorded), Mark(s.check),
                             s.note);
  };
  state_line(r.chain[0]);
  for (uint32_t round = 0; round < r.rounds_audited; ++round) {
    std::vector<const node::AuditUnit*> ran;
    for (const node::AuditUnit& u : r.units) {
      if (u.round == round && !u.replayed_commitment.IsZero()) ran.push_back(&u);
    }
    size_t quiet = 0;
    for (const node::AuditUnit* u : ran) {
      const bool c_ok = u->replayed_commitment == u->commitment;
      const bool d_ok = u->replayed_result == u->result;
      if (ran.size() > kMaxUnitLinesPerRound && c_ok && d_ok) {
        ++quiet;
        continue;
      }
      std::cout << fmt::format(
          "      unit {:<4} shard {:<3} node {}  commitment {} {}  delta {} {}{}\n", u->index,
          u->shard, u->assignee.substr(0, 12), Hex16(u->commitment), c_ok ? "✓" : "✗",
          Hex16(u->result), d_ok ? "✓" : "✗", u->sampled && !r.full ? "  (sampled)" : "");
      if (!c_ok || !d_ok) std::cout << "        " << u->note << "\n";
    }
    if (quiet > 0) std::cout << fmt::format("      {} more units ✓\n", quiet);
    state_line(r.chain[round + 1]);
  }
  if (r.chain.size() > r.rounds_audited + 1) state_line(r.chain.back());
  std::cout << "\n";
  if (!r.pass) {
    std::cout << "FAIL: " << r.first_mismatch << "\n";
  } else if (r.full) {
    std::cout << fmt::format(
        "PASS: {} units re-executed; every commitment, delta and state from "
        "the initial weights to the {} reproduced bit for bit\n",
        r.units_executed, r.status == "finished" ? "final model" : "last round");
  } else {
    std::cout << fmt::format(
        "PASS (sample): the {} sampled units reproduce their commitments and "
        "deltas{}; states marked · or - were not recomputed (--full checks "
        "everything)\n",
        r.sample, r.units_executed > r.sample ? ", and so do the rounds rebuilt for them" : "");
  }
}

Status RunAudit(GlobalOptions& g, const AuditArgs& a) {
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  Env* env = Env::Default();
  if (!a.full && a.sample == 0)
    return InvalidArgument("--sample must be at least 1 (or use --full)");
  const std::string url = ledger::DefaultRpcUrl(a.rpc);
  node::HttpChainClient chain(url);
  // A malformed id is refused before any network; a prefix needs the ledger's list of tasks.
  ML_RETURN_IF_ERROR(CheckTaskIdText(a.id));
  if (Result<json> up = chain.Call("chain_status", json::object()); !up.ok()) {
    if (up.status().code() != StatusCode::kUnavailable) return up.status();
    return Unavailable(up.status().message() +
                       "; is the ledger running? Pass its URL with --rpc "
                       "(or set $MESHLEARN_RPC)");
  }
  ML_ASSIGN_OR_RETURN(Hash256 id, ResolveTaskId(chain.rpc(), a.id));
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, g.Home().BlobsDir()));
  if (!a.task_file.empty()) {
    // The task file and its data, from this machine: the audit then needs nothing from the
    // nodes but the states it does not recompute.
    ML_ASSIGN_OR_RETURN(node::TaskBundle b, node::MakeBundle(env, a.task_file, store.get()));
    ML_ASSIGN_OR_RETURN(json t, GetTask(chain.rpc(), id, false));
    if (b.id.ToHex() != t.value("spec_hash", std::string())) {
      return InvalidArgument(fmt::format(
          "--task {} is not this task's file: its bundle is {} but the task's spec_hash is {}",
          a.task_file, b.id.ToHex(), t.value("spec_hash", std::string())));
    }
  }
  node::AuditOptions o;
  o.full = a.full;
  o.sample = a.sample;
  // Six digits: easy to type back; an audit's sample need not be unpredictable.
  o.seed = a.seed ? *a.seed : std::random_device{}() % 1'000'000;
  o.max_rebuild_units = a.max_rebuild_units;
  o.work_dir = JoinPath(JoinPath(g.Home().AuditDir(), id.ToHex()), "data");
  std::unique_ptr<ProgressBar> bar;  // its total is known once the audit has planned
  o.on_progress = [&](const node::AuditProgress& p) {
    if (!bar)
      bar = std::make_unique<ProgressBar>("audit", static_cast<int64_t>(p.steps_total), "steps",
                                          !g.json);
    bar->Update(static_cast<int64_t>(p.steps_done),
                fmt::format("{} ({}/{} units)", p.status, p.units_done, p.units_total));
  };
  if (!g.json) o.log = [](const std::string& s) { std::cerr << s << std::endl; };
  auto get = [&](const Hash256& h) { return FetchBlob(chain.rpc(), store.get(), net::BlobId{h}); };
  const auto t0 = std::chrono::steady_clock::now();
  ML_ASSIGN_OR_RETURN(node::AuditReport r, node::AuditTask(env, chain, id, get, o));
  if (bar) bar->Finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json j = node::AuditReportToJson(r);
  j["seconds"] = seconds;
  // Where the task's tokens went, in the words of every task command (task_client.h TaskMoney).
  TaskMoney money;
  if (Result<json> t = GetTask(chain.rpc(), id, false); t.ok()) {
    money = MoneyOf(*t);
    j["money"] = MoneyJson(money);
  }
  g.Output(j, [&] {
    PrintReport(r, seconds);
    if (j.contains("money")) std::cout << MoneyLine(money) << "\n";
  });
  if (!r.pass) g.exit_code = 1;
  return Status::Ok();
}

void AddTaskAudit(CLI::App& root, GlobalOptions& g) {
  static AuditArgs a;
  CLI::App* task = root.get_subcommand("task");  // cmd_task.cc (order 40)
  CLI::App* c = task->add_subcommand(
      "audit", "Re-execute a finished task's units and check every recorded hash (PASS/FAIL)");
  c->add_option("id", a.id, "Task id: the 64 hex digits or any unique prefix")->required();
  c->add_flag("--full", a.full, "Re-execute every unit of every round from the initial weights");
  c->add_option("--sample", a.sample, "Without --full: how many random units to re-execute")
      ->capture_default_str();
  c->add_option("--seed", a.seed,
                "Seed of the sample (printed by every sampled audit; default random)");
  c->add_option("--max-rebuild-units", a.max_rebuild_units,
                "Without --full: the most units re-executed only to rebuild start states no node "
                "serves any more")
      ->capture_default_str();
  c->add_option("--task", a.task_file,
                "The task file, if you have it and its data: nothing of the task is fetched");
  c->add_option("--rpc", a.rpc, "Ledger RPC URL (default $MESHLEARN_RPC or http://127.0.0.1:7700)");
  c->footer(
      "Examples:\n"
      "  meshlearn task audit 3f2a... --full                  # everything, initial weights to "
      "final model\n"
      "  meshlearn task audit 3f2a...                         # 3 random units; prints its seed\n"
      "  meshlearn task audit 3f2a... --sample 10 --seed 42   # repeat a sample\n"
      "  meshlearn --json task audit 3f2a... --full --rpc http://127.0.0.1:7700\n"
      "  meshlearn task audit 3f2a... --full --task my-task.toml   # bundle and data from here\n"
      "Exit status 0 on PASS, 1 on FAIL (the first mismatch is named) or on an error.\n"
      "A sampled unit needs its round's start state: fetched from the nodes, else rebuilt by\n"
      "re-executing the rounds before it (at most --max-rebuild-units units). See\n"
      "docs/submitters.md \"Audit a task\".");
  c->callback([&g] { g.Exit(RunAudit(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(41, AddTaskAudit);

}  // namespace meshlearn::cli
