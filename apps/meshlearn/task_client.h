// The submitter's side of a network task, shared by `meshlearn task ...` (cmd_task.cc, where it
// is defined) and `meshlearn devnet` (cmd_devnet.cc):
//
//   ML_ASSIGN_OR_RETURN(PreparedTask t, PrepareTask(env, "examples/fashion-mlp.toml", store));
//   ML_ASSIGN_OR_RETURN(SubmittedTask s, SubmitPreparedTask(rpc, key, t, store, {}));
//   ML_ASSIGN_OR_RETURN(nlohmann::json task, GetTask(rpc, s.task_id, /*units=*/true));
//   ML_ASSIGN_OR_RETURN(TaskProgress p, ProgressOf(task));
//
// PrepareTask validates everything (the engine TaskSpec, the [network] table, the protocol's
// decomposition rules, budget and price cap) before anything is published or escrowed; its
// errors name the file, the key and the fix.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
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

// Loads and validates the task file (loads its data: num_examples and round 0's weights).
Result<PreparedTask> PrepareTask(Env* env, const std::string& path);

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

// What `task status` / `task watch` / devnet show, from get_task's answer.
struct TaskProgress {
  std::string status;  // open | finished | cancelled
  std::string phase;
  uint32_t rounds = 0, round = 0, units_per_round = 0;
  uint64_t units_total = 0, units_committed = 0, units_assigned = 0, units_paid = 0;
  uint64_t rounds_done = 0;
  double last_accuracy = -1, last_test_loss = -1, last_train_loss = -1;
  uint64_t budget = 0, spent = 0, escrow = 0, refunded = 0;
  std::string final_state;  // hex, empty until finished
  bool done() const { return status != "open"; }
};
TaskProgress ProgressOf(const nlohmann::json& task);
std::string ProgressLine(const TaskProgress& p);

// Endpoints of the registered active nodes (list_nodes).
Result<std::vector<std::string>> NodeEndpoints(ledger::RpcClient& rpc);

// Fetches `id` into `store` from the registered nodes and returns its bytes.
Result<Bytes> FetchBlob(ledger::RpcClient& rpc, net::BlobStore* store, const net::BlobId& id,
                        uint64_t* wire_bytes = nullptr);

// Writes `out_dir`/model.safetensors from a global state blob, with the model of `task`.
Status WriteModel(Env* env, const engine::TaskSpec& task, ByteSpan state_blob,
                  const std::string& path, Hash256* weights_hash);

// Waits until the task is no longer open, calling `on_progress` on every change.
Result<nlohmann::json> WatchTask(ledger::RpcClient& rpc, const Hash256& id, int64_t timeout_ms,
                                 const std::function<void(const nlohmann::json&)>& on_progress,
                                 const std::function<bool()>& stop = {});

}  // namespace meshlearn::cli
