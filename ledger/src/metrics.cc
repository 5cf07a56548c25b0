#include "meshlearn/ledger/metrics.h"

#include <array>
#include <map>

#include "meshlearn/base/prometheus.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

namespace meshlearn::ledger {
namespace {

// What a scrape reads from the chain, under its lock; written out after it is released.
struct ChainFacts {
  uint64_t height = 0;
  int64_t last_block_time_ms = 0;
  Totals totals;
  std::map<std::string, uint64_t> tasks_by_status, units_by_status, nodes_by_status;
  VerificationTally verification;  // summed over every task
  Amount spent = 0, refunded = 0, treasury_cut = 0;
};

// Every record, a page at a time (ListTasks and ListNodes are paged for the RPC).
template <typename List, typename F>
void ForEachPaged(List list, F f) {
  constexpr uint64_t kPage = 1000;
  for (uint64_t offset = 0;; offset += kPage) {
    auto page = list(offset, kPage);
    for (const auto& r : page) f(r);
    if (page.size() < kPage) return;
  }
}

ChainFacts ReadFacts(SharedChain* shared) {
  return shared->With([](Chain& c) {
    ChainFacts f;
    f.height = c.Height();
    f.last_block_time_ms = c.LastBlockTime();
    f.totals = c.GetTotals();
    for (TaskStatus s : {TaskStatus::kOpen, TaskStatus::kFinished, TaskStatus::kCancelled}) {
      f.tasks_by_status[std::string(TaskStatusName(s))] = 0;
    }
    for (NodeStatus s : {NodeStatus::kActive, NodeStatus::kJailed, NodeStatus::kUnbonding}) {
      f.nodes_by_status[std::string(NodeStatusName(s))] = 0;
    }
    for (WorkUnitStatus s : {WorkUnitStatus::kPending, WorkUnitStatus::kAssigned,
                             WorkUnitStatus::kCommitted, WorkUnitStatus::kVerified,
                             WorkUnitStatus::kFailed, WorkUnitStatus::kCancelled}) {
      f.units_by_status[std::string(WorkUnitStatusName(s))] = 0;
    }
    ForEachPaged([&](uint64_t o, uint64_t n) { return c.ListTasks(o, n); },
                 [&](const TaskRecord& t) {
                   ++f.tasks_by_status[std::string(TaskStatusName(t.status))];
                   f.spent += t.spent;
                   f.refunded += t.refunded;
                   f.treasury_cut += t.treasury_cut;
                   const VerificationTally& v = t.verification;
                   f.verification.clean += v.clean;
                   f.verification.unchecked += v.unchecked;
                   f.verification.fraud += v.fraud;
                   f.verification.forced_error += v.forced_error;
                   f.verification.abandoned += v.abandoned;
                   f.verification.disputes += v.disputes;
                   f.verification.slashed += v.slashed;
                   f.verification.verifiers_paid += v.verifiers_paid;
                   f.verification.jackpot_paid += v.jackpot_paid;
                   for (const WorkUnit& u : c.ListWorkUnits(t.id)) {
                     ++f.units_by_status[std::string(WorkUnitStatusName(u.status))];
                   }
                 });
    ForEachPaged([&](uint64_t o, uint64_t n) { return c.ListNodes(o, n); },
                 [&](const NodeRecord& n) { ++f.nodes_by_status[std::string(NodeStatusName(n.status))]; });
    return f;
  });
}

void ByLabel(PrometheusText& out, const char* name, const char* help, const char* label,
             const std::map<std::string, uint64_t>& values, const char* type = "gauge") {
  out.Family(name, type, help);
  for (const auto& [k, v] : values) out.Sample(name, {{label, k}}, v);
}

}  // namespace

std::string LedgerMetricsText(const RpcService& service) {
  const ChainFacts f = ReadFacts(service.chain());
  PrometheusText out;
  out.Family("meshlearn_chain_height", "gauge", "Height of the last committed block.")
      .Sample("meshlearn_chain_height", {}, f.height);
  out.Family("meshlearn_chain_last_block_time_seconds", "gauge",
             "Time of the last committed block (Unix seconds, the sequencer's clock).")
      .Sample("meshlearn_chain_last_block_time_seconds", {},
              static_cast<double>(f.last_block_time_ms) / 1000.0);
  out.Family("meshlearn_tokens", "gauge",
             "Where the supply sits: balances, staked, unbonding, escrow, treasury, jackpot; "
             "minted is the total (the books balance: their sum equals minted).");
  for (const auto& [where, amount] :
       std::array<std::pair<const char*, Amount>, 7>{{{"balances", f.totals.balances},
                                                      {"staked", f.totals.staked},
                                                      {"unbonding", f.totals.unbonding},
                                                      {"escrow", f.totals.escrow},
                                                      {"treasury", f.totals.treasury},
                                                      {"jackpot", f.totals.jackpot},
                                                      {"minted", f.totals.minted}}}) {
    out.Sample("meshlearn_tokens", {{"where", where}}, amount);
  }
  ByLabel(out, "meshlearn_tasks", "Tasks by status.", "status", f.tasks_by_status);
  ByLabel(out, "meshlearn_work_units", "Work units of every task by status.", "status",
          f.units_by_status);
  ByLabel(out, "meshlearn_nodes", "Registered nodes by status.", "status", f.nodes_by_status);
  ByLabel(out, "meshlearn_checks_settled_total",
          "Verification checks the ledger settled, by result (every task, re-run rounds included).",
          "result",
          {{"clean", f.verification.clean},
           {"unchecked", f.verification.unchecked},
           {"fraud", f.verification.fraud},
           {"forced_error", f.verification.forced_error},
           {"abandoned", f.verification.abandoned}},
          "counter");
  out.Family("meshlearn_disputes_total", "counter", "Dispute games played to the end.")
      .Sample("meshlearn_disputes_total", {}, f.verification.disputes);
  out.Family("meshlearn_slashed_tokens_total", "counter",
             "Stake taken from cheaters and lazy verifiers.")
      .Sample("meshlearn_slashed_tokens_total", {}, f.verification.slashed);
  ByLabel(out, "meshlearn_task_tokens_total",
          "Tokens tasks paid out of escrow (spent; of it, the treasury's cut and what verifiers "
          "were paid) and refunded to submitters.",
          "kind",
          {{"spent", f.spent},
           {"treasury_cut", f.treasury_cut},
           {"verifiers_paid", f.verification.verifiers_paid},
           {"jackpot_paid", f.verification.jackpot_paid},
           {"refunded", f.refunded}},
          "counter");
  if (Sequencer* seq = service.sequencer()) {
    out.Family("meshlearn_block_interval_seconds", "gauge",
               "The sequencer's target time between blocks.")
        .Sample("meshlearn_block_interval_seconds", {},
                static_cast<double>(seq->block_interval_ms()) / 1000.0);
    out.Family("meshlearn_blocks_produced_total", "counter",
               "Blocks this sequencer produced since it started.")
        .Sample("meshlearn_blocks_produced_total", {}, seq->blocks_produced());
    out.Family("meshlearn_mempool_transactions", "gauge", "Transactions waiting for a block.")
        .Sample("meshlearn_mempool_transactions", {},
                static_cast<uint64_t>(seq->mempool_size()));
    out.Family("meshlearn_transactions_total", "counter",
               "Submitted transactions by outcome (admitted, already_included, refused at "
               "submission, dropped from a block) and reason (a status code).");
    for (const auto& [labels, n] : seq->tx_outcomes().Snapshot()) {
      out.Sample("meshlearn_transactions_total", {{"outcome", labels[0]}, {"reason", labels[1]}},
                 n);
    }
  }
  out.Family("meshlearn_rpc_requests_total", "counter",
             "JSON-RPC requests answered, by method and outcome (ok or the error code).");
  for (const auto& [labels, n] : service.requests().Snapshot()) {
    out.Sample("meshlearn_rpc_requests_total", {{"method", labels[0]}, {"code", labels[1]}}, n);
  }
  return out.text();
}

}  // namespace meshlearn::ledger
