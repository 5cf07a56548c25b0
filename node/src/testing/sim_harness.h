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
//
// For chaos workloads (chaos_test.cc): link parameters for the whole network (network().
// SetAllLinks), a skewed clock per node, nodes that start late (a late joiner: Restart starts
// it), agents whose Tick fails with a simulated crash killed in place (kill_on_crash) instead of
// failing the Step, the ledger itself restarted from its database (RestartLedger: the mempool
// is lost, every acknowledged block stays), and every RPC answer seen by an observer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/net/http_transport.h"
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
  // The node's clock runs `clock_skew_ms` ahead of (negative: behind) the network's virtual
  // time, at `clock_rate` times its speed (SkewedClock).
  int64_t clock_skew_ms = 0;
  double clock_rate = 1.0;
  // Not started by Setup (it does not wait for its registration): Restart(i) starts it.
  bool start_late = false;
};

// A node's own clock: virtual time seen through an offset and a rate, as a machine whose clock
// is set wrong and drifts. Both readings stay monotonic in the base clock (rate > 0).
class SkewedClock final : public Clock {
 public:
  SkewedClock(const Clock* base, int64_t skew_ms, double rate)
      : base_(base), skew_ms_(skew_ms), rate_(rate) {}
  int64_t NowMillis() const override {
    return static_cast<int64_t>(static_cast<double>(base_->NowMillis()) * rate_) + skew_ms_;
  }
  int64_t MonotonicMicros() const override {
    return static_cast<int64_t>(static_cast<double>(base_->MonotonicMicros()) * rate_);
  }

 private:
  const Clock* base_;
  int64_t skew_ms_;
  double rate_;
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
  // Whether node `node` sits out this Step: its agent is not ticked (its servers and stage
  // threads go on), as a process that stalls for a while; it sends nothing meanwhile, e.g. a
  // reveal a test holds back. Null: every live agent ticks.
  std::function<bool(int node)> skip_tick;
  // Changes the submitted params (tests of a submitter whose bundle and params disagree).
  std::function<void(ledger::TaskParams& params)> tweak_params;
  // Changes the genesis before the chain is created (verification parameters, ...).
  std::function<void(ledger::Genesis& genesis)> tweak_genesis;
  // Runs a RefereeService (node/referee.h) after every block with a referee key genesis names.
  bool referee = false;
  // false: genesis names no referee (the sequencer's key rules RuleDispute) and the service's key
  // is an ordinary funded account: enough for RefereeStep, the ledger executing the step.
  bool referee_in_genesis = true;
  // Every link of the simulated network at start (network().SetAllLinks changes them later).
  net::LinkParams link{.latency_us = 2000, .bandwidth_bytes_per_sec = 1e9};
  // An agent whose Tick fails with a status containing "simulated crash" (an after_checkpoint
  // hook playing kill -9) is killed where it stands and the Step goes on with the other nodes;
  // crashed() lists them. false: the Step returns the error (the caller kills the node).
  bool kill_on_crash = false;
  // The ledger's database in a MemEnv of its own (not a folder under /tmp), so RestartLedger can
  // cut its power (MemEnv::CutPower: SQLite loses what it had not synced).
  bool ledger_in_memory = false;
  // The agents serve on loopback HTTP (net::HttpServer on 127.0.0.1, an HttpTransport each, the
  // server's address as endpoint) instead of the simulated network, for roles with threads of
  // their own (pipeline stage units), which the one-threaded SimNetwork cannot carry. Give a
  // thread-safe `env` (Env::Default()). Kill stops the node's server with its agent; Restart is
  // not for this mode (the node would serve on another port than the one it registered).
  bool http = false;
  // Prefix of the harness's paths in `env` (nodes, submitter, referee): with a real Env, a
  // TestDir.
  std::string root;
  // Sees every ledger call of every party (agents, submitter, referee) and its answer.
  std::function<void(const std::string& method, const nlohmann::json& params,
                     const Result<nlohmann::json>& answer)>
      on_rpc;
};

class SimHarness {
 public:
  explicit SimHarness(SimOptions options);
  ~SimHarness();

  // Chain, network, agents; ticks until every node is registered; bundles the task, pushes its
  // blobs to two nodes and submits it.
  Status Setup();
  // Produces blocks until the task is finished (or max_blocks more blocks), waiting `pause`
  // after each: a pipeline task's stage units train on the agents' own threads, which need
  // wall-clock time between blocks to reach their next step.
  Status RunUntilFinished(uint64_t max_blocks,
                          std::chrono::milliseconds pause = std::chrono::milliseconds(0));
  // One block and one Tick of every live agent.
  Status Step();
  // One Tick of every live agent and no block, as a node's timer ticks between blocks: a test
  // that waits for something the stage threads do in wall-clock time (a step deadline) before
  // something the ledger does after a number of blocks (a node replaced) ticks so, and the
  // ledger cannot act first.
  Status TickAll();

  // The node's network goes -- its server stops, the simulated net drops its messages -- while its
  // process runs on: what other nodes see of a kill -9. Kill(i) cuts it first. A test that holds
  // one of the node's threads cuts it, lets the thread go and then kills it: the thread's last
  // send may leave, but no answer reaches the node (a Kill alone waits for that thread).
  void Cut(int i);
  void Kill(int i);
  Status Restart(int i, std::function<void(AgentOptions&)> tweak = nullptr);
  bool alive(int i) const { return agents_[i] != nullptr; }
  // Nodes killed by a simulated crash since the last call (kill_on_crash), in Tick order.
  std::vector<int> TakeCrashed() { return std::exchange(crashed_, {}); }
  // The ledger process dies and starts again on its database: its mempool is lost (clients
  // resend what they have in flight), its blocks are not. Agents keep their client. With
  // power_cut (REQUIRES: ledger_in_memory) the machine loses power too: whatever SQLite had not
  // synced is gone, and every acknowledged block must still be there.
  Status RestartLedger(bool power_cut = false);
  // Starts an agent for `key` that is an account, not a node (AgentOptions::late_challenger: it
  // registers nothing and plays the late games its key challenged), ticked by every Step from
  // now on like the nodes; returns its index (agent(i), store(i)). `key` must be funded (e.g.
  // the submitter's) and send nothing else meanwhile: the agent keeps its own nonces. `tweak`
  // changes its AgentOptions (e.g. an adversary mode that lies as a challenger, adversary.h).
  Result<int> AddLateChallenger(const KeyPair& key,
                                std::function<void(AgentOptions&)> tweak = nullptr);
  // A transaction sender signing with another funded account's `key` (a second challenger), on
  // the harness's ledger, initialised.
  Result<std::unique_ptr<TxSender>> SenderFor(const KeyPair& key);
  // The submitter's key (funded at genesis).
  const KeyPair& submitter_key() const { return submitter_; }
  // The submitter's transaction sender (e.g. to cancel the task).
  TxSender& submitter_tx() { return *submitter_tx_; }
  // Sends `payload` with submitter_tx() and steps (at most 5 blocks) until its outcome.
  Result<TxOutcome> SendAsSubmitter(ledger::TxPayload payload);
  // A fraud proof as `task audit --prove` sends it with the submitter's key: its CommitProof
  // (docs/verification.md, "Commit, then prove"), then, once that is in a block, the proof.
  // The proof's outcome; the commitment's when that failed.
  Result<TxOutcome> ProveAsSubmitter(ledger::ProveFraudTx proof);

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
  Status OpenLedger();
  class LedgerClient;

  SimOptions options_;
  std::unique_ptr<MemEnv> own_env_;
  Env* env_;
  std::unique_ptr<MemEnv> ledger_env_;  // ledger_in_memory
  std::string chain_dir_;
  FakeClock clock_;
  KeyPair seq_key_, submitter_;
  std::vector<KeyPair> node_keys_;
  ledger::Genesis genesis_;
  std::unique_ptr<ledger::Chain> chain_;
  std::unique_ptr<ledger::SharedChain> shared_;
  std::unique_ptr<ledger::Sequencer> sequencer_;
  std::unique_ptr<ledger::RpcService> rpc_;
  std::unique_ptr<InProcessChainClient> rpc_client_;
  std::unique_ptr<LedgerClient> client_;  // forwards to rpc_client_ (survives RestartLedger)
  std::vector<std::unique_ptr<SkewedClock>> clocks_;
  std::vector<int> crashed_;
  std::unique_ptr<net::SimNetwork> net_;
  std::vector<std::unique_ptr<net::BlobStore>> stores_;
  std::vector<std::unique_ptr<net::Router>> routers_;
  std::vector<AgentOptions> agent_opts_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  // options_.http: each agent's server and transport, and the submitter's transport.
  std::vector<std::unique_ptr<net::HttpServer>> servers_;
  std::vector<std::unique_ptr<net::HttpTransport>> http_transports_;
  std::unique_ptr<net::HttpTransport> submitter_http_;
  std::unique_ptr<net::BlobStore> submitter_store_;
  std::unique_ptr<TxSender> submitter_tx_;
  KeyPair referee_key_;
  std::unique_ptr<net::BlobStore> referee_store_;
  // In `http` mode: the referee reaches the agents' endpoints (a stage's evidence) over it.
  std::unique_ptr<net::HttpTransport> referee_http_;
  std::unique_ptr<TxSender> referee_tx_;
  std::unique_ptr<RefereeService> referee_;
  TaskBundle bundle_;
  Hash256 task_id_;
};

}  // namespace meshlearn::node::testing
