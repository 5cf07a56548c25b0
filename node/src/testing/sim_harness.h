// A whole network in one process: a ledger (Chain + Sequencer on a FakeClock, RpcService called
// in process), a net::SimNetwork, N NodeAgents and a submitter, all driven block by block from
// one thread with one seed. Same seed and options -> same blocks, same final state.
//
//   SimHarness sim({.seed = 7, .nodes = 3, .task_toml = toml});
//   ASSERT_OK(sim.Setup());          // registers the nodes, pushes the blobs, submits the task
//   ASSERT_OK(sim.RunUntilFinished(/*max_blocks=*/400));
//   GlobalState final = *sim.FinalState();
//
// Per block: the clock moves one block interval, the sequencer produces a block, the token
// invariant is checked, then every live agent Ticks once (in node order), then the referee (if
// any) rules the disputes waiting for it. Faults: Kill(i) drops an agent (as kill -9 would: its
// data dir and blob store stay), Restart(i) builds a new agent on the same data dir.
//
// The chain is DevnetGenesis (verification as devnets have it); tweak_genesis changes it, e.g.
// to turn verification off or force every unit to be a forced error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/net/sim_transport.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/referee.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"

namespace meshlearn::node::testing {

struct SimNodeOptions {
  double speed_factor = 1.0;
  uint64_t memory_bytes = 8ull << 30;  // registered
  uint64_t memory_limit_bytes = 0;     // AgentOptions::memory_limit_bytes (real memory)
  uint64_t blob_quota_bytes = 0;       // the node's BlobStore quota (0: none)
  uint32_t roles = ledger::kRoleSolver | ledger::kRoleAggregator;
};

struct SimOptions {
  uint64_t seed = 1;
  int nodes = 3;
  std::string task_toml;  // data paths inside `env` (the harness's MemEnv unless given)
  std::vector<SimNodeOptions> node_options;  // per node; missing entries: defaults
  int64_t block_interval_ms = 1000;
  uint64_t throughput = 1'000'000'000;  // reported FLOP/s of every node (x speed factor)
  ledger::Amount price = 1;
  bool log = false;  // agent logs to stderr
  // Every agent log line with its node index (in addition to `log`).
  std::function<void(int node, const std::string& line)> log_sink;
  // Applied to every node's AgentOptions at Setup (tests tune clean-up here).
  std::function<void(int node, AgentOptions& options)> agent_options;
  Env* env = nullptr;
  // Called after every block with its height (tests inject faults here).
  std::function<void(uint64_t height)> on_block;
  // Changes the submitted params (tests of a submitter whose bundle and params disagree).
  std::function<void(ledger::TaskParams& params)> tweak_params;
  // Changes the genesis before the chain is created (verification parameters, ...).
  std::function<void(ledger::Genesis& genesis)> tweak_genesis;
  // Runs a RefereeService (node/referee.h) after every block with a referee key genesis names.
  bool referee = false;
  // false: genesis names no referee (the sequencer's key rules RuleDispute) and the service's key
  // is an ordinary funded account: enough for RefereeStep, the ledger executing the step.
  bool referee_in_genesis = true;
};

class SimHarness {
 public:
  explicit SimHarness(SimOptions options);
  ~SimHarness();

  // Chain, network, agents; ticks until every node is registered; bundles the task, pushes its
  // blobs to two nodes and submits it.
  Status Setup();
  // Produces blocks until the task is finished (or max_blocks more blocks).
  Status RunUntilFinished(uint64_t max_blocks);
  // One block and one Tick of every live agent.
  Status Step();

  void Kill(int i);
  Status Restart(int i, std::function<void(AgentOptions&)> tweak = nullptr);

  uint64_t height();
  const Hash256& task_id() const { return task_id_; }
  nlohmann::json Call(const std::string& method, const nlohmann::json& params);
  nlohmann::json Task(bool units = true);
  // The final global state (fetched from the nodes by the submitter).
  Result<GlobalState> FinalState();
  NodeAgent* agent(int i) { return agents_[i].get(); }
  net::BlobStore* store(int i) { return stores_[i].get(); }
  AgentOptions& agent_options(int i) { return agent_opts_[i]; }
  const KeyPair& node_key(int i) const { return node_keys_[i]; }
  net::SimNetwork& network() { return *net_; }
  Env* env() { return env_; }
  const TaskBundle& bundle() const { return bundle_; }
  ledger::Totals Totals();
  const ledger::Genesis& genesis() const { return genesis_; }
  RefereeService* referee() { return referee_.get(); }

 private:
  Status MakeAgent(int i);

  SimOptions options_;
  std::unique_ptr<MemEnv> own_env_;
  Env* env_;
  std::string chain_dir_;
  FakeClock clock_;
  KeyPair seq_key_, submitter_;
  std::vector<KeyPair> node_keys_;
  ledger::Genesis genesis_;
  std::unique_ptr<ledger::Chain> chain_;
  std::unique_ptr<ledger::SharedChain> shared_;
  std::unique_ptr<ledger::Sequencer> sequencer_;
  std::unique_ptr<ledger::RpcService> rpc_;
  std::unique_ptr<InProcessChainClient> client_;
  std::unique_ptr<net::SimNetwork> net_;
  std::vector<std::unique_ptr<net::BlobStore>> stores_;
  std::vector<std::unique_ptr<net::Router>> routers_;
  std::vector<AgentOptions> agent_opts_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<net::BlobStore> submitter_store_;
  std::unique_ptr<TxSender> submitter_tx_;
  KeyPair referee_key_;
  std::unique_ptr<net::BlobStore> referee_store_;
  std::unique_ptr<TxSender> referee_tx_;
  std::unique_ptr<RefereeService> referee_;
  TaskBundle bundle_;
  Hash256 task_id_;
};

}  // namespace meshlearn::node::testing
