// The submitter's side of a network task, shared by `meshlearn task ...` (cmd_task.cc, where it
// is defined) and `meshlearn devnet` (cmd_devnet.cc):
//
//   ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(env, "examples/fashion-mlp.toml", store));
//   ML_ASSIGN_OR_RETURN(SubmittedTask s, SubmitPreparedTask(rpc, key, t, store, {}));
//   ML_ASSIGN_OR_RETURN(nlohmann::json task, GetTask(rpc, s.task_id, /*units=*/true));
//   TaskProgress p = ProgressOf(task, TaskMetricOf(t.task));
//
// PrepareTask validates everything (the engine TaskSpec, the [network] table, the protocol's
// decomposition rules, budget and price cap) before anything is published or escrowed; its
// errors name the file, the key and the fix.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/node/network_task.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/protocol/types.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::cli {

struct PreparedTask {
  std::string path;
  engine::TaskSpec task;
  node::NetworkSpec net;
  node::TaskFacts facts;
  ledger::TaskParams params;   // initial_state filled by StoreTaskBlobs
  protocol::TaskSpecView view;  // for costs and estimates
  uint64_t unit_flops = 0;
  uint64_t total_units = 0;
  uint64_t cost_at_cap = 0;  // every unit and every round's aggregation at the price cap
  // Tolerance mode: the distance two kernel configurations gave when profiled (node/tolerance.h).
  protocol::StateDistance tolerance_measured;
  std::unique_ptr<engine::Trainer> trainer;  // round 0's weights; the reference's trainer
};

// Loads and validates the task file (loads its data: num_examples and round 0's weights), with
// the ledger's own checks of SubmitTask (CheckTaskTerms) for a chain of default parameters.
Result<PreparedTask> PrepareTask(Env* env, const std::string& path);

// The task file's name of a ledger TaskParams field ("checkpoint_interval" ->
// "network.checkpoint_interval", "batch_size" -> "train.batch_size"): how a submitter reads the
// ledger's checks.
std::string TaskFileKey(std::string_view field);

// ledger::ValidateTaskTerms on t's params, budget and price cap for a chain with `chain`:
// every check SubmitTask makes but the blob ids and the funds. Errors name the file and its keys.
Status CheckTaskTerms(const PreparedTask& t, const ledger::ChainParams& chain);

// The chain's genesis (get_genesis), decoded.
Result<ledger::Genesis> FetchGenesis(ledger::RpcClient& rpc);

struct TaskBlobs {
  node::TaskBundle bundle;
  net::BlobId initial_state;
  std::vector<net::BlobId> all;  // bundle, data files, initial state: what must be published
  uint64_t bytes = 0;
};
// Stores the bundle, the data files and the initial state blob in `store` (pinned) and fills
// t->params.initial_state.
Result<TaskBlobs> StoreTaskBlobs(Env* env, PreparedTask* t, net::BlobStore* store);

struct SubmitOptions {
  std::string memo;
  int replicas = 2;  // nodes each blob is pushed to
  int64_t timeout_ms = 60000;
  std::function<void(const std::string&)> log;  // human progress lines (may be empty)
};

struct SubmittedTask {
  Hash256 task_id;
  std::string tx_id;
  uint64_t height = 0;
  std::vector<std::string> pushed_to;  // endpoints
  uint64_t pushed_bytes = 0;
  std::vector<net::BlobId> blobs;  // published: bundle, data files, initial state
};

// Checks the balance, publishes the task's blobs to `replicas` registered nodes (PushBlob),
// sends SubmitTask signed by `key` and waits for its block.
Result<SubmittedTask> SubmitPreparedTask(ledger::RpcClient& rpc, const KeyPair& key,
                                         PreparedTask* t, net::BlobStore* store,
                                         const SubmitOptions& options);

// get_task {id, units}.
Result<nlohmann::json> GetTask(ledger::RpcClient& rpc, const Hash256& id, bool units);

// Where a task's tokens went: one vocabulary for money, the same in every command's console and
// JSON output (task status, watch, fetch, audit, devnet's report.json) and in docs/submitters.md.
//   budget     = what was escrowed, plus slashed stake the ledger added for re-runs
//   spent      = paid_to_solvers + paid_to_verifiers + paid_to_aggregators: what left the escrow
//   treasury_cut = of spent, what the treasury kept (genesis treasury_cut_bps of each payment);
//                the nodes' owners received spent - treasury_cut
//   refunded   = returned to the submitter when the task closed; escrow = still held
//   budget     == spent + refunded + escrow
// paid_to_solvers is the sum of the units' `paid`; a node's owner earns, from this task, each of
// its payments less the treasury's cut of it.
struct TaskMoney {
  uint64_t budget = 0;
  uint64_t added_from_slashes = 0;  // part of budget: slashed stake added for re-runs
  uint64_t spent = 0;
  uint64_t paid_to_solvers = 0;
  uint64_t paid_to_verifiers = 0;
  uint64_t paid_to_aggregators = 0;
  uint64_t treasury_cut = 0;
  uint64_t to_nodes = 0;  // spent - treasury_cut
  uint64_t refunded = 0;
  uint64_t escrow = 0;
};
// From get_task's answer (with or without units). The one place these numbers are computed.
TaskMoney MoneyOf(const nlohmann::json& task);
// {"budget", "spent", "paid_to_solvers", "paid_to_verifiers", "paid_to_aggregators",
//  "treasury_cut", "to_nodes", "refunded", "escrow", "added_from_slashes"}
nlohmann::json MoneyJson(const TaskMoney& m);
// "spent 27 = solvers 12 + verifiers 12 + aggregators 3 (treasury cut 0); refunded 99973"
std::string MoneyLine(const TaskMoney& m);

// What `task status` / `task watch` / devnet show, from get_task's answer.
//
// Rounds are numbered from 0 everywhere, as the ledger records them (unit index = round x
// units_per_round + shard): `task status`, `watch`, `fetch`, `audit`, report.json. Counts
// (rounds_done, "rounds 2/3 done") count from 1.
//
// The metric is the task's, decided by its kind (TaskMetricOf), never guessed from the numbers: a
// classifier's aggregators report test accuracy and loss; a language model's only loss (shown
// with its perplexity, exp(loss)). Where the task's spec cannot be read (its bundle is on no
// reachable node), the metric is kUnknown and only the loss is shown.
enum class TaskMetric { kUnknown, kAccuracy, kLoss };
// kAccuracy for labelled data (data.format idx or npy), kLoss for a language model (text, tokens).
// `task status` and `watch` read the spec from the task's bundle (its spec_hash).
TaskMetric TaskMetricOf(const engine::TaskSpec& task);

struct TaskProgress {
  std::string status;  // open | finished | cancelled
  std::string phase;   // the round machine's phase while open; empty once closed
  uint32_t rounds = 0, round = 0, units_per_round = 0;  // round: the current one (0-based)
  uint64_t units_total = 0, units_committed = 0, units_assigned = 0, units_paid = 0;
  uint64_t rounds_done = 0;  // rounds whose aggregate committed (a count)
  TaskMetric metric = TaskMetric::kUnknown;
  // Of the last finished round; -1: none yet (last_accuracy: also -1 unless kAccuracy).
  double last_accuracy = -1, last_test_loss = -1, last_train_loss = -1;
  uint64_t budget = 0, spent = 0, escrow = 0, refunded = 0;  // = money's
  TaskMoney money;
  std::string final_state;  // hex, empty until finished
  bool done() const { return status != "open"; }
  // "open (training)", "finished", "cancelled"
  std::string StatusText() const;
};
TaskProgress ProgressOf(const nlohmann::json& task, TaskMetric metric);
// "rounds 1/3 done, units 6/12 (2 assigned) train loss 0.61 test acc 0.8123 spent 20/100000"
std::string ProgressLine(const TaskProgress& p);
// The last finished round's metric: "test accuracy 0.8842, loss 0.3310" (classifier), "test loss
// 2.3100, perplexity 10.07" (language model), "test loss 0.3310" (unknown); "no round finished
// yet".
std::string MetricText(const TaskProgress& p);
// A round result's metric the same way (one entry of get_task's round_results).
std::string RoundMetricText(const nlohmann::json& round_result, TaskMetric metric);
// {"test_accuracy" (classifiers only), "test_loss", "test_perplexity" (LMs only), "train_loss"}
nlohmann::json MetricJson(const TaskProgress& p);

// A task id from what a user typed: 64 hex digits, or any unique prefix of the id of a task on
// the ledger (list_tasks). No match, or several (named in the error), is an error.
Result<Hash256> ResolveTaskId(ledger::RpcClient& rpc, const std::string& typed);
// The syntax ResolveTaskId wants (1..64 hex digits), checked without the ledger.
Status CheckTaskIdText(const std::string& typed);

// Endpoints of the registered active nodes (list_nodes).
Result<std::vector<std::string>> NodeEndpoints(ledger::RpcClient& rpc);

// Fetches `id` into `store` from the registered nodes and returns its bytes.
Result<Bytes> FetchBlob(ledger::RpcClient& rpc, net::BlobStore* store, const net::BlobId& id,
                        uint64_t* wire_bytes = nullptr);

// Where a model file's weights come from, written into its metadata (meshlearn.task,
// meshlearn.state = the ledger's state id, meshlearn.round) so that `meshlearn eval` can say it
// and `meshlearn task verify-model` can check it against the ledger.
struct ModelOrigin {
  std::string task_id;  // hex
  std::string state;    // hex: the global state blob id the ledger recorded
  int64_t round = -1;   // the (0-based) round whose aggregate it is
};

// Writes a model file at `path` from a global state blob, with the model of `task` (a GPT's
// vocabulary taken from the data is read back from the state's size). *weights_hash: the
// weights hash, node::HashFloats over the weights in model order; the file's metadata carries it
// as meshlearn.weights_hash, and `meshlearn eval` prints the same hash of any model file.
Status WriteModel(Env* env, const engine::TaskSpec& task, ByteSpan state_blob,
                  const std::string& path, Hash256* weights_hash, const ModelOrigin& origin = {});

// Waits until the task is no longer open, calling `on_progress` on every change.
Result<nlohmann::json> WatchTask(ledger::RpcClient& rpc, const Hash256& id, int64_t timeout_ms,
                                 const std::function<void(const nlohmann::json&)>& on_progress,
                                 const std::function<bool()>& stop = {});

}  // namespace meshlearn::cli
