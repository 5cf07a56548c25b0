#include "node_context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "meshlearn/node/network_round.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/scheduler.h"

namespace meshlearn::node {

std::string TaskReason(const Hash256& t) { return "task:" + t.ToHex(); }
std::string StateReason(const Hash256& t) { return "state:" + t.ToHex(); }
std::string DeltaReason(const Hash256& t, uint32_t round) {
  return "delta:" + t.ToHex() + ":" + std::to_string(round);
}

std::string CheckName(const CheckAssignment& c) {
  return "check " + c.task_id.ShortHex() + "/" + std::to_string(c.index) + " r" +
         std::to_string(c.round) + " s" + std::to_string(c.shard);
}

std::string MemoryNote() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return "";
  uint64_t rss_kb = 0, hwm_kb = 0;
  char line[256];
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) rss_kb = std::strtoull(line + 6, nullptr, 10);
    if (std::strncmp(line, "VmHWM:", 6) == 0) hwm_kb = std::strtoull(line + 6, nullptr, 10);
  }
  std::fclose(f);
  if (rss_kb == 0) return "";
  return " (resident " + std::to_string(rss_kb / 1000) + " MB, peak " +
         std::to_string(hwm_kb / 1000) + " MB)";
}

NodeContext::NodeContext(const AgentDeps& deps, const AgentOptions& options, TxSender* tx,
                         PinBook* book, UnitService* unit_service, AgentStats* stats)
    : deps_(deps),
      options_(options),
      tx_(tx),
      book_(book),
      unit_service_(unit_service),
      stats_(stats),
      fetcher_(std::make_unique<net::Fetcher>(deps.transport, deps.store, options.fetch)) {}

void NodeContext::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

Result<const ledger::ChainParams*> NodeContext::GenesisParams() {
  if (!params_) {
    ML_ASSIGN_OR_RETURN(ledger::Genesis genesis, GetGenesis(*deps_.chain));
    params_ = genesis.params;
  }
  return &*params_;
}

std::string NodeContext::UnitDir(const Hash256& task, uint32_t index) const {
  return JoinPath(JoinPath(options_.data_dir, "units"), task.ToHex() + "-" + std::to_string(index));
}

std::string NodeContext::VerifyRoot() const { return JoinPath(options_.data_dir, "verify"); }

std::string NodeContext::VerifyDir(const CheckAssignment& c) const {
  return JoinPath(VerifyRoot(), c.task_id.ToHex() + "-" + std::to_string(c.index) + "-" +
                                    std::to_string(c.commit_height) + (c.late ? "-late" : ""));
}

std::string NodeContext::TaskDataDir(const Hash256& task) const {
  return JoinPath(JoinPath(JoinPath(options_.data_dir, "tasks"), task.ToHex()), "data");
}

Result<std::vector<std::string>> NodeContext::Providers(bool refresh) {
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

Result<Bytes> NodeContext::FetchBlob(const Hash256& id, const std::vector<std::string>& preferred,
                                     const std::string& reason) {
  ML_RETURN_IF_ERROR(HaveBlob(id, preferred, reason));
  net::BlobId bid{id};
  deps_.store->Hold(bid);
  Result<Bytes> out = deps_.store->Get(bid);
  deps_.store->Release(bid);
  return out;
}

Status NodeContext::HaveBlob(const Hash256& id, const std::vector<std::string>& preferred,
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
  return reason.empty() ? Status::Ok() : book_->Add(id, reason);
}

Result<GlobalState> NodeContext::StartState(const TaskContext& ctx, const Hash256& task,
                                            const Hash256& start_state) {
  ML_ASSIGN_OR_RETURN(Bytes bytes, FetchBlob(start_state, {}, StateReason(task)));
  return DecodeGlobalState(bytes, ctx.facts.num_params);
}

Result<GlobalWeightsReader> NodeContext::StartWeights(const TaskContext& ctx, const Hash256& task,
                                                      const Hash256& start_state) {
  ML_RETURN_IF_ERROR(HaveBlob(start_state, {}, StateReason(task)));
  return BlobWeightsReader(deps_.store, net::BlobId{start_state}, ctx.facts.num_params);
}

Result<std::shared_ptr<const engine::TaskData>> TaskContext::Data() {
  if (!data_) {
    engine::TaskSpec spec = task;  // LoadTaskData completes a model; `task` already is
    ML_ASSIGN_OR_RETURN(engine::TaskData data, engine::LoadTaskData(env, spec));
    data_ = std::make_shared<const engine::TaskData>(std::move(data));
  }
  return data_;
}

void TaskContext::ReleaseData() {
  if (!data_tree && !token_pages) data_.reset();
}

void TaskContext::ReleaseStageData() {
  if (bundle.net.stages <= 1 || has_whole_model()) return;
  token_pages.reset();
  data_tree.reset();
  ReleaseData();
}

uint64_t TaskContext::DataBytes() const {
  if (!data_) return 0;
  const engine::TaskData& d = *data_;
  return (d.train_tokens.tokens.size() + d.val_tokens.tokens.size() + d.train.y.size() +
          d.test.y.size()) *
             sizeof(int32_t) +
         static_cast<uint64_t>(d.train.x.size() + d.test.x.size()) * sizeof(float);
}

Result<engine::Trainer*> TaskContext::Trainer() {
  if (!trainer_) {
    ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, Data());
    ML_ASSIGN_OR_RETURN(trainer_, engine::Trainer::Create(task, std::move(data)));
    if (builds) ++*builds;
    if (log) log("task " + id.ShortHex() + ": built the whole model's trainer" + MemoryNote());
  }
  return trainer_.get();
}

Result<engine::Evaluator*> TaskContext::Evaluator() {
  if (!evaluator_) {
    ML_ASSIGN_OR_RETURN(std::shared_ptr<const engine::TaskData> data, Data());
    ML_ASSIGN_OR_RETURN(evaluator_, engine::Evaluator::Create(task, std::move(data)));
    if (log) {
      log("task " + id.ShortHex() + ": built the whole model's evaluator (its " +
          std::to_string(facts.num_params) + " weights, no gradients or optimizer moments)" +
          MemoryNote());
    }
  }
  return evaluator_.get();
}

uint64_t NodeContext::StageDataBytes() const {
  uint64_t bytes = 0;
  for (const auto& [id, ctx] : tasks_) {
    if (ctx->bundle.net.stages > 1 && !ctx->has_whole_model()) bytes += ctx->DataBytes();
  }
  return bytes;
}

Result<TaskContext*> NodeContext::GetTask(const Hash256& task_id) {
  auto it = tasks_.find(task_id);
  if (it != tasks_.end()) return it->second.get();
  // A task refused once (its bundle disagrees with the ledger) stays refused: do not fetch and
  // parse its bundle again every tick.
  if (auto r = refused_.find(task_id); r != refused_.end()) return r->second;
  auto ctx = std::make_unique<TaskContext>();
  ctx->id = task_id;
  ML_ASSIGN_OR_RETURN(ctx->info, node::GetTask(*deps_.chain, task_id));
  ML_ASSIGN_OR_RETURN(Bytes bundle_bytes, FetchBlob(ctx->info.spec_hash, {}, TaskReason(task_id)));
  std::string text(AsStringView(bundle_bytes));
  const std::string data_dir = TaskDataDir(task_id);
  ML_RETURN_IF_ERROR(deps_.env->CreateDirs(data_dir));
  auto resolver = [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
    std::string path = JoinPath(data_dir, id.ToHex());
    if (deps_.env->FileExists(path)) return path;
    ML_ASSIGN_OR_RETURN(Bytes data, FetchBlob(id.hash, {}, TaskReason(task_id)));
    Log("task " + task_id.ShortHex() + ": fetched data." + key + " (" +
        std::to_string(data.size()) + " bytes)");
    ML_RETURN_IF_ERROR(deps_.env->WriteFileAtomic(path, AsStringView(data)));
    return path;
  };
  ML_ASSIGN_OR_RETURN(ctx->bundle, LoadBundle(text, resolver));
  // The data and the facts, without the whole model: a stage node never builds it (the roles
  // that need it call ctx->Trainer()).
  ctx->task = ctx->bundle.task;
  ML_ASSIGN_OR_RETURN(engine::TaskData data, engine::LoadTaskData(deps_.env, ctx->task));
  ctx->builds = &stats_->whole_models_built;
  ctx->log = [this](const std::string& line) { Log(line); };
  ctx->env = deps_.env;
  ML_ASSIGN_OR_RETURN(ctx->facts, ComputeTaskFacts(ctx->task, data, ctx->bundle.net));
  // A pipeline task's stage node reads the data again for each stage unit's batches and holds
  // none between them (TaskContext::ReleaseData); any other task's roles keep it.
  if (ctx->bundle.net.stages <= 1) {
    ctx->data_ = std::make_shared<const engine::TaskData>(std::move(data));
  }
  if (Status match = CheckBundleMatchesLedger(ctx->facts, ctx->bundle.net, ctx->info.params);
      !match.ok()) {
    Status refused = match.WithPrefix("task " + task_id.ShortHex());
    Log(refused.message());
    refused_.emplace(task_id, refused);
    return refused;
  }
  // A pipeline task's units are stage units (docs/protocol.md, "Pipeline stage units"): the
  // Stager runs them, the Aggregator applies their rounds stage by stage. The ledger places a
  // stage only on a node whose memory holds it (params.stage_memory_bytes).
  // A whole unit's need: the scheduler's number (protocol::RequiredMemoryBytes of the ledger's
  // params), which the bundle check above found equal to the bundle's own (UnitMemoryBytes) when
  // the task declares one.
  protocol::TaskSpecView view;
  view.model_bytes = ctx->facts.model_bytes;
  view.memory_required_bytes = ctx->info.params.memory_bytes;
  ctx->memory_need = protocol::RequiredMemoryBytes(view);
  Log("task " + task_id.ShortHex() + ": loaded (" + std::to_string(ctx->facts.num_params) +
      " parameters, " + std::to_string(ctx->bundle.net.rounds) + " rounds x " +
      std::to_string(ctx->bundle.net.units_per_round) + " units)" + MemoryNote());
  TaskContext* raw = ctx.get();
  tasks_[task_id] = std::move(ctx);
  return raw;
}

}  // namespace meshlearn::node
