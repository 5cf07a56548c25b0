// The node's view of the ledger: a JSON-RPC caller with two implementations, typed helpers for
// the calls a node makes, and a transaction sender.
//
//   HttpChainClient chain("http://127.0.0.1:7700");     // a daemon, the CLI
//   InProcessChainClient chain(&rpc_service);            // whole-network simulations
//   ML_ASSIGN_OR_RETURN(NodeWork w, GetNodeWork(chain, node_key.public_key()));
//
//   TxSender tx(&chain, node_key, {.env = env, .outbox_path = dir + "/outbox"});
//   ML_RETURN_IF_ERROR(tx.Init());                      // chain id, next nonce, resend outbox
//   ML_ASSIGN_OR_RETURN(Hash256 id, tx.Send(ledger::HeartbeatTx{...}));   // does not block
//   ... later, once per block:  tx.Poll();  for (auto& o : tx.TakeOutcomes()) ...
//   // CLI style, blocking:
//   ML_ASSIGN_OR_RETURN(TxOutcome o, tx.SendAndWait(ledger::LeaveNodeTx{...}, 60000));
//
// Nonces: TxSender allocates them locally (next = the account's nonce at Init, then +1 per
// send), so several transactions can be in flight in one block. Every transaction in flight is
// kept, signed, in memory and (with an outbox path) on disk; Poll asks get_tx about each and
// sends the very same bytes again when the ledger does not know it (e.g. the sequencer
// restarted): the ledger executes one signed transaction at most once, so a resend never pays
// or commits twice. After a restart Init reloads the outbox and resends it.
//
// Thread-safety: ChainClient implementations are thread-safe. TxSender is thread-compatible.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc_answer.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/unit_check.h"

namespace meshlearn::ledger {
class RpcService;
}

namespace meshlearn::node {

class ChainClient {
 public:
  virtual ~ChainClient() = default;
  // The `result` of one JSON-RPC call; a JSON-RPC error becomes a Status with the server's
  // status code and message.
  virtual Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params) = 0;
  // "http://host:port" or "in-process", for messages.
  virtual std::string Describe() const = 0;
};

class HttpChainClient final : public ChainClient {
 public:
  explicit HttpChainClient(std::string url, ledger::RpcClientOptions options = {})
      : rpc_(std::move(url), options) {}
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params) override {
    return rpc_.Call(method, params);
  }
  std::string Describe() const override { return rpc_.url(); }
  ledger::RpcClient& rpc() { return rpc_; }

 private:
  ledger::RpcClient rpc_;
};

// Calls RpcService::HandleRpc directly. `wait_block` blocks on the chain's height like over
// HTTP, so a single-threaded simulation must not call it (it drives blocks itself).
class InProcessChainClient final : public ChainClient {
 public:
  explicit InProcessChainClient(ledger::RpcService* service) : service_(service) {}
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params) override;
  std::string Describe() const override { return "in-process ledger"; }

 private:
  ledger::RpcService* service_;
  std::atomic<int64_t> next_id_{1};
};

// Turns a JSON-RPC response object into its result or a Status (shared by both clients).
Result<nlohmann::json> RpcResultOrStatus(const nlohmann::json& response);

// ---- Typed reads -------------------------------------------------------------------------
//
// Every answer is decoded here, once, into the records below; nothing past this header reads
// the ledger's JSON. The task, unit and check records are strict: a field this node does not
// know, or one it needs that is missing, is a DataLoss error naming the method and the field
// ("ledger answer to get_task: result.params.inner_steps missing, got nothing"). Node and ledger
// ship together, so either means a ledger of another version, and a default would silently read
// a renamed field as 0. Stages, results, statuses and roles are the protocol's enums, parsed
// from the names the ledger writes (protocol::CheckStageName, ...); an unknown name is an error.

// get_genesis: the chain's genesis, parsed (ledger/genesis.h).
Result<ledger::Genesis> GetGenesis(ChainClient& chain);

struct ChainStatusInfo {
  std::string chain_id;
  uint64_t height = 0;
};
Result<ChainStatusInfo> GetChainStatus(ChainClient& chain);

// Long-poll: returns the height as soon as it is above `after`, or at the timeout (then the
// returned height may equal `after`). HTTP only (see InProcessChainClient).
Result<uint64_t> WaitForBlockAbove(ChainClient& chain, uint64_t after, int64_t timeout_ms);

struct NodeInfo {
  PublicKey id;
  PublicKey owner;
  std::string endpoint;
  uint32_t roles = 0;
  std::string status;  // "active" | "jailed" | "unbonding"
  uint64_t stake = 0;
  uint64_t price = 0;
  uint64_t last_heartbeat_height = 0;
  ledger::NodeCapabilities capabilities;
  // The deepest element of the node's secret chain the ledger knows, and its index.
  Hash256 secret_anchor;
  uint64_t secret_anchor_index = 0;
};
// nullopt when the ledger does not know the node.
Result<std::optional<NodeInfo>> GetNode(ChainClient& chain, const PublicKey& id);
// Every registered node (all pages).
Result<std::vector<NodeInfo>> ListNodes(ChainClient& chain);
// Endpoints of the active nodes, in registry order, without `self` ("" keeps all).
std::vector<std::string> ActiveEndpoints(const std::vector<NodeInfo>& nodes,
                                         const std::string& self = "");

// node_work (rpc.h): everything a node has to do now.
struct UnitAssignment {
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  uint64_t deadline_height = 0;
  Hash256 start_state;  // blob id of the global state the round trains from
  // The block seed at assignment: with the solver's secret it decides whether the unit is a
  // forced error (protocol::IsForcedError).
  Hash256 assignment_beacon;
  // A pipeline task's stage unit: its replica and stage, and the replica's chain as the ledger
  // placed it (chain[s] and endpoints[s]: stage s's node and where it serves; a zero node and ""
  // while that stage waits for a node). Absent for a unit of a task without stages.
  struct Stage {
    uint32_t replica = 0;
    uint32_t stage = 0;
    std::vector<PublicKey> chain;
    std::vector<std::string> endpoints;
    // The node that held this stage of the replica before in this round and let it expire (the
    // ledger's earlier assignee: RoundStateMachine::LastExcluded), zero for none: the node whose
    // records a resume recomputes (stage_resume.h).
    PublicKey earlier;
  };
  std::optional<Stage> stage;
};
struct AggregationInput {
  uint32_t index = 0;
  uint32_t shard = 0;
  PublicKey node;       // the committer (its endpoint serves the delta)
  Hash256 result_hash;  // blob id of the delta blob
  // A pipeline task's stage unit (zero otherwise): its commitment, and the blob id of its step
  // commits (zero: its CommitStage named none), as its unit record has them.
  Hash256 commitment;
  Hash256 stage_commits;
};
struct AggregationAssignment {
  Hash256 task_id;
  uint32_t round = 0;
  uint64_t deadline_height = 0;
  Hash256 start_state;
  std::vector<AggregationInput> units;
};
// A dispute on a checked unit (protocol/dispute.h), as node_work shows it.
struct DisputeView {
  protocol::DisputeStage stage = protocol::DisputeStage::kDisputeSteps;
  PublicKey defender;
  PublicKey challenger;
  uint64_t first_step = 0;
  uint64_t last_step = 0;
  Hash256 agreed;
  bool has_query = false;  // steps / operators / tiles / reduction: both parties post at `position`
  uint64_t position = 0;
  uint64_t query_deadline = 0;
  protocol::DisputeQuery query;  // the whole query (phases 3-4: operator, children, level, tile)
  uint32_t num_operators = 0;
  bool tile_phase = false;   // opened with the task bundle: narrows to one tile (RefereeTile)
  bool has_referee = false;  // referee stage: what the referee must compute
  protocol::RefereeTask referee;
};
// What a node is to a check (node_work "roles"; a node may be several).
enum class CheckRole : uint8_t {
  kCheckRoleSolver = 0,
  kCheckRoleVerifier,
  kCheckRoleChallenger,  // a challenger of the check's dispute that is not one of its verifiers
  kCheckRoleWhistleblower,
  // A checker (a verifier or whistleblower node) that is none of the above, listed a check whose
  // whistleblower's dispute awaits its merits (merits_deadline): it may show them (ProveMerits).
  kCheckRoleMerits,
};
std::string_view CheckRoleName(CheckRole r);

// A stage step served on chain (node_work "served"): the ServeStageEvidence that completed the
// step's evidence at `height` answered `challenger`'s claim that the stage served nothing for
// game step `step` (the stage's step step - 1; docs/verification.md, "A stage claimed to have
// served nothing, over the witness bound").
struct ServedStageStep {
  uint64_t step = 0;
  uint64_t height = 0;
  PublicKey challenger;
};

// A committed unit of the current round under verification that this node takes part in
// (node_work "checks"; docs/verification.md).
struct CheckAssignment {
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  Hash256 result_hash;
  Hash256 commitment;
  Hash256 assignment_beacon;
  uint64_t secret_index = 0;
  Hash256 start_state;
  std::string solver_endpoint;
  std::vector<Hash256> leaves;     // the committed state hashes, on chain with the commit
  std::vector<CheckRole> roles;
  protocol::CheckStage stage = protocol::CheckStage::kCheckAwaitingBeacon;
  protocol::CheckResult result = protocol::CheckResult::kCheckPending;
  std::string reason;  // why the check settled as it did ("" while pending)
  PublicKey solver;
  uint64_t commit_height = 0;
  uint64_t deadline_height = 0;  // of the current window
  std::vector<PublicKey> verifiers;
  std::vector<uint32_t> segments;  // drawn k-step segments to replay
  uint32_t num_segments = 0;
  std::optional<DisputeView> dispute;
  // While a whistleblower's dispute the solver lost by its silence awaits its merits
  // (protocol::UnitCheck::awaits_merits): the last height a ProveMerits may land in; else 0.
  uint64_t merits_deadline = 0;
  std::vector<ServedStageStep> served;  // a stage unit's steps served on chain in this run
  // A late dispute (LateChallengeTx) on a unit of a final round (node_work lists it with the
  // unit's `late` view; docs/verification.md, "Over 8 MiB: a late dispute"): `dispute` is the
  // late game, not the check's (the check settled long ago); the solver (role solver) defends
  // and the account that sent the LateChallenge (role challenger) challenges, each as in a
  // live dispute. Its files are the check's folder with "-late" (NodeContext::VerifyDir).
  bool late = false;
  uint32_t late_segment = 0;
  uint64_t late_bond = 0;

  bool HasRole(CheckRole role) const;
  // The served step of game step `step`, or nullptr.
  const ServedStageStep* ServedStep(uint64_t step) const;
};
// A stage unit the ledger counts as the node's against its declared disk (node_work's
// stage_units; ledger NodeView::disk_held_bytes).
struct HeldStageUnit {
  Hash256 task_id;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  auto operator<=>(const HeldStageUnit&) const = default;
};

struct NodeWork {
  uint64_t height = 0;
  std::vector<UnitAssignment> units;
  std::vector<AggregationAssignment> aggregations;
  std::vector<CheckAssignment> checks;
  // The stage units (of every open task) whose files the ledger counts against the node's disk:
  // assigned to it, committed or paid, in rounds not yet final. The node deletes the stage files
  // of its other runs (PinKeeper). Empty (nullopt) from a ledger that does not list them.
  std::optional<std::vector<HeldStageUnit>> stage_units;
  // The secret chain index the node's next CommitUnit must carry (one more per commit in
  // flight).
  uint64_t next_secret_index = 0;
};
Result<NodeWork> GetNodeWork(ChainClient& chain, const PublicKey& node);

// One page of a block's transactions (get_block_txs, rpc.h), of one type when `type` is not
// empty (a ledger::TxTypeName), from position `cursor`: each decoded (DecodeTx) with its
// position and its receipt's ok. next_cursor: where the next page starts (none after the last).
struct BlockTx {
  uint64_t position = 0;
  bool ok = false;
  ledger::Transaction tx;
};
struct BlockTxPage {
  std::vector<BlockTx> txs;
  std::optional<uint64_t> next_cursor;
};
Result<BlockTxPage> GetBlockTxs(ChainClient& chain, uint64_t height, std::string_view type,
                                uint64_t cursor);
Result<NodeWork> ParseNodeWork(const nlohmann::json& j);

// A work unit as get_task lists it (units=true; fields in ledger/rpc.h). Its check, when it has
// one, is not decoded here (node_work's "checks" carry the checks a node takes part in).
struct UnitRecord {
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  ledger::WorkUnitStatus status = ledger::WorkUnitStatus::kPending;
  PublicKey assignee;
  uint64_t deadline_height = 0;
  Hash256 result_hash;
  Hash256 commitment;
  uint64_t loss_micros = 0;
  uint64_t price = 0;
  uint64_t paid = 0;
  Hash256 assignment_beacon;
  uint64_t secret_index = 0;
  std::vector<Hash256> leaves;
  bool has_check = false;
  // A stage unit's step commits blob (zero on every other unit): the round's aggregator keeps it.
  Hash256 stage_commits;
};

// get_task (ledger::TaskToJson): the parts a node reads, typed. The other fields of the record
// (budget, round_results, ...) are known and skipped.
struct TaskInfo {
  Hash256 id;
  Hash256 spec_hash;  // blob id of the task bundle
  ledger::TaskStatus status = ledger::TaskStatus::kOpen;
  ledger::TaskParams params;
  // [r] = the state round r trains from, for every round up to the current one (settling
  // rounds' aggregates included); once the task is final the last is its final state.
  std::vector<Hash256> weights_history;
  uint32_t rounds_settled = 0;  // rounds [0, rounds_settled) are final (paid, no longer checked)
  Hash256 final_state;            // zero until finished
  // A finished task: the last height at which a fraud proof reopens and rewinds it (0 while
  // open, for a cancelled task, or from a record read without it: ledger::AuditWindowEnd).
  uint64_t audit_window_end = 0;
  // The units with a late game open (verification.late_games, LateChallengeTx): their solvers
  // answer from the round's start state, so the task's states are kept while it is not empty
  // (pin_keeper.h). Empty from a record read without it.
  std::vector<uint32_t> late_games;
  std::vector<UnitRecord> units;  // with units=true
};
Result<TaskInfo> GetTask(ChainClient& chain, const Hash256& id, bool units = false);
// Every task (list_tasks, all pages).
Result<std::vector<TaskInfo>> ListTasks(ChainClient& chain);
// The decoders behind GetTask / GetNodeWork, for answers read some other way (tests).
Result<TaskInfo> ParseTask(const ledger::RpcAnswer& a);
Result<ledger::TaskParams> ParseTaskParams(const ledger::RpcAnswer& params);

// ---- Sending transactions ------------------------------------------------------------------

struct TxOutcome {
  Hash256 id;
  std::string type;  // "CommitUnit", ...
  bool included = false;  // false: the ledger refused or dropped it (see reason)
  bool ok = false;        // included and executed successfully
  uint64_t height = 0;
  std::string reason;  // failure reason (receipt or refusal)
};

struct TxSenderOptions {
  Env* env = nullptr;        // for the outbox; null = no outbox
  std::string outbox_path;   // file holding the signed transactions in flight
  size_t max_in_flight = 32;
};

class TxSender {
 public:
  // `chain` must outlive the sender. The signer is the sender of every transaction.
  TxSender(ChainClient* chain, KeyPair signer, TxSenderOptions options = {});

  // Fetches the chain id and the account's nonce, loads the outbox and resends it. Call before
  // anything else; may be called again to retry after Unavailable.
  Status Init();
  bool initialized() const { return initialized_; }
  const std::string& chain_id() const { return chain_id_; }
  // The nonce the next Send will use.
  uint64_t next_nonce() const { return next_nonce_; }
  const PublicKey& sender() const { return signer_.public_key(); }

  // Signs `payload` with the next nonce and submits it without waiting (send_tx). Returns the
  // tx id. A ledger that cannot be reached leaves the tx in flight (Poll resends it); a refusal
  // (bad nonce, mempool full, ...) is an error and the nonce is re-read from the ledger.
  Result<Hash256> Send(ledger::TxPayload payload);
  // Asks about every transaction in flight; included ones leave (their outcome is queued for
  // TakeOutcomes), unknown ones are sent again.
  Status Poll();
  std::vector<TxOutcome> TakeOutcomes();

  size_t in_flight() const { return in_flight_.size(); }
  bool IsInFlight(const Hash256& id) const;
  // Type names of the transactions in flight ("Heartbeat", ...), for "one at a time" policies.
  bool HasInFlight(ledger::TxType type) const;

  // Send, then Poll every `poll_ms` (sleeping with `sleep`) until it is included or
  // `timeout_ms` passes (DeadlineExceeded; it stays in the outbox and is resent later).
  Result<TxOutcome> SendAndWait(ledger::TxPayload payload, int64_t timeout_ms,
                                const std::function<void(int64_t ms)>& sleep, int64_t poll_ms = 250);

 private:
  struct InFlight {
    ledger::Transaction tx;
    Bytes wire;
    Hash256 id;
  };
  Status Submit(const InFlight& f);  // send_tx, wait_ms 0
  Status SaveOutbox();
  Status Resync();

  ChainClient* chain_;
  KeyPair signer_;
  TxSenderOptions options_;
  bool initialized_ = false;
  std::string chain_id_;
  uint64_t next_nonce_ = 0;
  bool resync_ = false;
  std::map<uint64_t, InFlight> in_flight_;  // by nonce
  std::vector<TxOutcome> outcomes_;
};

}  // namespace meshlearn::node
