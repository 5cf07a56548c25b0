// What every role of a node shares (not a public header): its key, files, transaction sender,
// pin book and stats; the tasks it has loaded (bundle, data, facts, and the whole model's trainer
// for the roles that need it); fetching a blob from the
// network; the chain's genesis parameters; the height of the current tick. NodeAgent owns one
// and hands it to each role (solver.h, aggregator.h, verifier.h, whistleblower.h, disputes.h,
// pin_keeper.h), which keep their own state and journals.
//
// Thread-compatible: the agent's one Tick thread uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/pin_book.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/node/unit_service.h"

namespace meshlearn::node {

// A task the node works on: its bundle, data and facts, loaded once; the whole model's trainer
// built when a role first needs it.
struct TaskContext {
  Hash256 id;
  TaskInfo info;
  LoadedBundle bundle;
  // The task as the engine runs it (the bundle's, its model completed from the data: a GPT's
  // vocabulary). Every role reads it; a pipeline stage node needs nothing more than it and the
  // data (it draws its batches with engine::DataStream and builds only its stage: Stager).
  engine::TaskSpec task;
  TaskFacts facts;
  uint64_t memory_need = 0;
  // The tree over the training examples, built when a step witness is first needed.
  std::unique_ptr<engine::DataTree> data_tree;
  // A token task's page tree (its data root), built when a tile witness first reads tokens.
  std::unique_ptr<engine::TokenPageTree> token_pages;

  // The whole model's trainer (every weight, gradient and optimizer moment: the whole model's
  // training state), built from `task` and `data` on the first call and kept: for the roles that
  // train, replay or evaluate the whole model (Solver, Aggregator, the verifiers, Disputes). A
  // node that only runs stage units never calls it. Errors: engine::Trainer::Create's (e.g. a
  // model that does not fit in memory).
  Result<engine::Trainer*> Trainer();
  bool has_trainer() const { return trainer_ != nullptr; }
  // The whole model to evaluate states with (engine::Evaluator: its weights alone, no gradient
  // and no optimizer moment), built from `task` and `data` on the first call and kept: for a
  // pipeline task's aggregator, which evaluates each round's state and trains nothing (a
  // trainer would hold three times the weights with AdamW). Not counted in `builds`.
  Result<engine::Evaluator*> Evaluator();
  // Whether this node built the whole model (a trainer or an evaluator), which keeps its own
  // reference to the task's data: a pipeline task's aggregator, or a node that replays whole
  // units. Its data is that model's, not a stage node's left beside its stage units.
  bool has_whole_model() const { return trainer_ != nullptr || evaluator_ != nullptr; }

  // The task's data (engine::LoadTaskData of `task`'s files: its examples, or a text corpus as
  // tokens, training and validation), read on the first call and kept until ReleaseData. The same
  // files give the same data: nothing computed from it depends on when it was read.
  Result<std::shared_ptr<const engine::TaskData>> Data();
  // Drops the data when nothing of this context reads it in place (data_tree and token_pages
  // do): a pipeline task's stage node holds no data between its units (GetTask reads it for the
  // facts, a stage unit for its batches: tens of MB for a text corpus that a middle stage never
  // reads). The trainer keeps its own reference.
  void ReleaseData();
  // A pipeline task's stage node (no whole model built) after a verification job: drops the
  // proof trees a witness built (token_pages, data_tree: they read the data in place) and the
  // data. A dispute's job reads the data for a step's batch or proofs, and what it kept would sit
  // beside the node's next stage unit (NodeContext::StageDataBytes). Nothing otherwise.
  void ReleaseStageData();
  // The bytes of the data held now (its examples or tokens; 0 when none is).
  uint64_t DataBytes() const;

  // Counts the trainers built (AgentStats::whole_models_built) and logs each; set by
  // NodeContext::GetTask. `env` reads the task's files (Data).
  uint64_t* builds = nullptr;
  std::function<void(const std::string&)> log;
  Env* env = nullptr;

 private:
  friend class NodeContext;  // GetTask keeps the data it read for the facts
  std::shared_ptr<const engine::TaskData> data_;
  std::unique_ptr<engine::Trainer> trainer_;
  std::unique_ptr<engine::Evaluator> evaluator_;
};

// PinBook reasons (agent.h, "Blobs the node keeps").
std::string TaskReason(const Hash256& t);
std::string StateReason(const Hash256& t);
std::string DeltaReason(const Hash256& t, uint32_t round);

// "check 3f2a9c01/7 r1 s2", for log lines.
std::string CheckName(const CheckAssignment& c);

// " (resident 212 MB, peak 305 MB)": this process's memory now and at its peak (VmRSS and VmHWM
// of /proc/self/status), for log lines; "" where it cannot be read.
std::string MemoryNote();

class NodeContext {
 public:
  // Everything must outlive the context.
  NodeContext(const AgentDeps& deps, const AgentOptions& options, TxSender* tx, PinBook* book,
              UnitService* unit_service, AgentStats* stats);

  const AgentDeps& deps() const { return deps_; }
  const AgentOptions& options() const { return options_; }
  Env* env() const { return deps_.env; }
  ChainClient& chain() const { return *deps_.chain; }
  TxSender& tx() const { return *tx_; }
  PinBook& book() const { return *book_; }
  UnitService& unit_service() const { return *unit_service_; }
  AgentStats& stats() const { return *stats_; }
  const PublicKey& id() const { return deps_.key.public_key(); }
  const KeyPair& key() const { return deps_.key; }
  void Log(const std::string& line) const;

  // The height node_work answered at this tick.
  uint64_t height() const { return height_; }
  void set_height(uint64_t h) { height_ = h; }

  // The chain's genesis parameters (read once), and whether verification is on.
  Result<const ledger::ChainParams*> GenesisParams();
  bool VerificationOn() const { return params_ && params_->verification; }
  const ledger::ChainParams& chain_params() const { return *params_; }

  // The task, loaded once (its bundle and data fetched and pinned "task:<T>"). A task whose
  // bundle disagrees with the ledger is refused, logged once, and stays refused.
  Result<TaskContext*> GetTask(const Hash256& task_id);
  bool Refused(const Hash256& task_id) const { return refused_.count(task_id) > 0; }
  // Drops a closed task's context (pin_keeper.h).
  void ForgetTask(const Hash256& task_id) { tasks_.erase(task_id); }
  // What the loaded pipeline tasks whose whole model (trainer or evaluator) this node never built
  // hold of their data (TaskContext::DataBytes): a stage node reads it for a job and drops it, so
  // what is held between ticks would sit beside the next stage unit (AgentStats::stage_held_bytes).
  uint64_t StageDataBytes() const;

  // The blob's bytes, fetched first from `preferred`, then from every registered node. With a
  // non-empty `reason` the blob is pinned for it (PinBook).
  Result<Bytes> FetchBlob(const Hash256& id, const std::vector<std::string>& preferred,
                          const std::string& reason);
  // The same without reading it: the blob is in the node's store (fetched if it was not), pinned
  // for `reason` when it is not empty.
  Status HaveBlob(const Hash256& id, const std::vector<std::string>& preferred,
                  const std::string& reason);
  // Endpoints of the other nodes, active ones first; the registry is read once per height
  // (`refresh`: now).
  Result<std::vector<std::string>> Providers(bool refresh);
  const std::vector<NodeInfo>& nodes() const { return nodes_; }

  // The round's start state of a unit, decoded; or its weights alone, read in parts from the
  // state blob (pinned for the task) as they are asked for: a stage unit's start, which needs
  // only its stage's slices.
  Result<GlobalState> StartState(const TaskContext& ctx, const Hash256& task,
                                 const Hash256& start_state);
  Result<GlobalWeightsReader> StartWeights(const TaskContext& ctx, const Hash256& task,
                                           const Hash256& start_state);

  // Directories: a unit's checkpoints and journals, a check's files, a task's data files.
  std::string UnitDir(const Hash256& task, uint32_t index) const;
  std::string VerifyRoot() const;
  std::string VerifyDir(const CheckAssignment& c) const;
  std::string TaskDataDir(const Hash256& task) const;

 private:
  const AgentDeps& deps_;
  const AgentOptions& options_;
  TxSender* tx_;
  PinBook* book_;
  UnitService* unit_service_;
  AgentStats* stats_;
  std::unique_ptr<net::Fetcher> fetcher_;
  uint64_t height_ = 0;
  std::optional<ledger::ChainParams> params_;
  std::map<Hash256, std::unique_ptr<TaskContext>> tasks_;
  std::map<Hash256, Status> refused_;  // bundle inconsistent with the ledger's params
  uint64_t providers_height_ = UINT64_MAX;
  std::vector<NodeInfo> nodes_;
};

}  // namespace meshlearn::node
