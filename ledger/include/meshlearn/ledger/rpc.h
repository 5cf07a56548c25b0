// The ledger's JSON-RPC 2.0 API, as a pure request -> response function (no sockets): the HTTP
// server (rpc_server.h) and the fuzzer feed it bytes, tests feed it JSON.
//
//   SharedChain shared(&chain);
//   Sequencer seq(&shared, key, clock);            // absent on a follower: sends are refused
//   RpcService rpc(&shared, &seq);
//   json answer = rpc.HandleRpc({{"jsonrpc","2.0"},{"id",1},{"method","chain_status"}});
//
// Methods (params are a JSON object; heights, amounts and nonces are JSON integers, keys,
// hashes and ids are lower-case hex):
//   chain_status      {}                                -> chain id, height, state hash, ...
//   send_tx           {tx: HEX, wait_ms?: N}            -> {tx_id, status, receipt?}
//                     The canonical signed bytes. Idempotent: sending a tx again returns its
//                     state (pending / included with its receipt) and never executes it twice.
//                     With wait_ms, answers once the tx's block is committed (or wait_ms passes).
//   get_tx            {id: HEX}                         -> {tx_id, status, height?, receipt?}
//                     status: pending | included | rejected (with error) | unknown
//   get_block         {height: N, raw?: bool}           -> the block (and its canonical hex)
//   get_blocks        {from: N, limit?: N}              -> {blocks: [HEX...]} for followers
//   get_block_txs     {height: N, type?: NAME, cursor?: N}
//                     -> {height, txs: [{position, tx_id, type, ok, tx: HEX}], next_cursor}:
//                     the block's transactions from position `cursor` (of `type` only, a
//                     TxTypeName such as "ServeStageEvidence", when given), as canonical bytes
//                     with their receipt's ok; a page holds at most max_page of them and
//                     max_block_txs_bytes of bytes (always one); next_cursor is where the next
//                     page starts, null after the last. What a node reads on-chain evidence
//                     from (a stage's served pieces) without the whole block.
//   get_account       {address: HEX}                    -> balance, nonce, stake, ...
//   get_node          {id: HEX}
//   get_task          {id: HEX, units?: bool}           -> the task (TaskToJson, state.h):
//                     id, submitter, spec_hash, budget, escrow, spent, refunded, price_cap,
//                     status, created_height, closed_height (the block that finished or
//                       cancelled it; 0 while open), audit_window_end (a finished task: the
//                       last height at which a fraud proof reopens it; else 0), unit_count,
//                       memo, rounds_settled, and
//                     "params" {rounds, units_per_round, inner_steps, batch_size,
//                       checkpoint_interval, flops_per_sample, model_bytes, memory_bytes,
//                       num_examples, seed, initial_state, verification_window_blocks},
//                     "phase" (assigning | training | aggregating |
//                       awaiting_verification_window | final), "round" (the round in
//                       progress, == rounds once final), "rounds_settled" (rounds final and
//                       paid; rounds [rounds_settled, round) are settling: aggregated, still
//                       checked, genesis rounds_in_flight), "weights_history" [state blob ids:
//                       [r] = what round r trains from, for every round up to "round"; once
//                       final the last is the final state],
//                     "aggregator" {node, round, deadline_height} | null, "final_state"
//                       (zero hex until finished), "round_results" [{round, state,
//                       test_accuracy_ppm, test_loss_micros, aggregator, committed_height,
//                       aggregator_price, aggregator_paid}];
//                     with units=true also "units" [{task_id, index, round, shard, status,
//                       assignee, deadline_height, result_hash, commitment, loss_micros, price,
//                       paid, assignment_beacon, secret_index, check}] (check: null, or
//                       {stage, result, reason, solver, commit_height, deadline_height,
//                       verifiers, segments, num_segments, merits_deadline? (only while a
//                       whistleblower's dispute its solver lost by silence awaits ProveMerits),
//                       dispute: null | {stage, defender,
//                       challenger, first_step, last_step, agreed, turns, query | referee |
//                       outcome}}) (status: pending | assigned | committed | verified | failed |
//                       cancelled; index = round * units_per_round + shard)
//   node_work         {id: node key HEX}                -> what the node must do now:
//                     {height, next_secret_index, stage_units, units: [{task_id, index, round,
//                       shard, deadline_height, start_state, spec_hash, assignment_beacon, stage?:
//                       {replica, stage, chain: [{node, endpoint}]}}],
//                       aggregations: [{task_id, round, deadline_height, start_state, spec_hash,
//                       units: [{index, shard, node, result_hash, commitment?,
//                       stage_commits?}]}],
//                       checks: [a unit JSON (as in get_task, with "check") plus roles
//                       (solver | verifier | challenger | whistleblower | merits: an active
//                       verifier or whistleblower node, none of the others, listed a check in
//                       its merits window, "merits_deadline", to show them), start_state,
//                       spec_hash, solver_endpoint, served?: [{step, height, challenger}]:
//                       the stage steps served on chain in this run, each by the
//                       ServeStageEvidence that completed it at `height`, answering
//                       `challenger`'s claim]}; start_state: blob id of the global state
//                     the round trains from. Commit by deadline_height (inclusive) with
//                     CommitUnit (secret_index = next_secret_index, one more per commit in
//                     flight) / CommitAggregate. checks: the units of the unfinal rounds
//                     (settling and current) under verification this node takes part in, each
//                     with its own round's start_state (docs/verification.md); and, of any
//                     task (open or finished), each unit of a final round with a late game
//                     open (LateChallengeTx, the unit JSON's "late") to its solver (role
//                     solver) and its challenger (role challenger: `id` may be any account's
//                     key). A pipeline
//                     task's unit has `stage`: its replica and stage, and the replica's chain
//                     as placed (per stage its node and endpoint; a zero node and "" while a
//                     stage waits for a node; docs/protocol.md "Pipeline stage units"). A
//                     pipeline task's aggregation inputs have `commitment` and
//                     `stage_commits` (HEX or null), as get_task's unit records.
//                     stage_units: [{task_id, round, replica, stage}], the node's stage units
//                     whose files the ledger counts against its declared disk (assigned,
//                     committed or paid, in a round not yet final, of an open task:
//                     NodeView::disk_held_bytes); the node deletes the files of its others.
//   referee_work      {}                                -> {height, disputes: [unit JSON with
//                       "check".dispute.referee, start_state, spec_hash]}: disputes waiting
//                     for the referee's RuleDispute
//   list_nodes        {cursor?, limit?}   list_tasks {cursor?, limit?}
//   account_history   {address: HEX, cursor?, limit?}   -> {items, next_cursor}
//   wait_block        {after: N, timeout_ms?: N}        -> {height, timed_out}: long-poll, answers
//                     as soon as height > after (or at the timeout)
//   get_genesis       {}                                -> {toml, genesis_hash}
//   faucet            {address: HEX, amount?: N}        -> like send_tx, paid by the chain's faucet
//
// Errors: {code, message, data: {status}}; `status` is a StatusCode name (rpc_client.h maps it
// back), the message says what to fix. Codes: the JSON-RPC standard ones, and kRpc* below.
// Limits: body size, nesting depth of the JSON, batch size, page size, long-poll time (per
// request, and in total per batch: later waits in a batch answer at once when it is spent) and
// the number of concurrent long-polls.
//
// Thread-safe: the HTTP server calls it from many threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "meshlearn/base/prometheus.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

class SharedChain;
class Sequencer;

enum RpcErrorCode : int {
  kRpcParseError = -32700,
  kRpcInvalidRequest = -32600,
  kRpcMethodNotFound = -32601,
  kRpcInvalidParams = -32602,
  kRpcInternalError = -32603,
  kRpcTxRejected = -32000,     // the transaction is invalid now (signature, nonce, funds, ...)
  kRpcNotFound = -32001,       // no such block, account, node, task or transaction
  kRpcReadOnly = -32002,       // a follower: send transactions to the sequencer
  kRpcLimitExceeded = -32003,  // body size, JSON depth, batch, rate, mempool or waiter limit
  kRpcUnavailable = -32004,    // shutting down; retry elsewhere or later
};

struct RpcLimits {
  // Room for one RefereeStep (its witness is the largest transaction), as hex in JSON.
  size_t max_body_bytes = 2 * kMaxLargeTxBytes + (64 << 10);
  int max_json_depth = 16;
  size_t max_batch = 100;
  int64_t max_page = 100;
  int64_t default_page = 20;
  // One long-poll (wait_block, send_tx's wait_ms), and all the long-polls of one batch together:
  // they share one deadline, so a batch of waits holds a server thread no longer than one.
  int64_t max_wait_ms = 30000;
  int max_waiters = 48;  // long-polls at once; keep below the server's thread count
  size_t max_blocks_per_call = 100;
  // get_block_txs: the transactions' bytes in one page (one transaction is always sent).
  uint64_t max_block_txs_bytes = kMaxLargeTxBytes;
};

// Extra facts a service states about itself in chain_status.
struct RpcServiceInfo {
  std::string role = "sequencer";  // or "follower", "candidate"
  std::string upstream = "";       // a follower's sequencer URL
  // A replicated sequencer's candidate (cluster.h): called before every read (each method but
  // chain_status, get_genesis, send_tx and faucet); an error is the answer, so a standby that
  // has not applied what etcd holds sends the client elsewhere instead of a stale state.
  std::function<Status()> read_barrier;
  // chain_status's "cluster": the leader, this candidate's takeovers.
  std::function<nlohmann::json()> cluster_status;
};

class RpcService {
 public:
  // `sequencer` may be null (a follower): send_tx and faucet then answer kRpcReadOnly.
  // Both must outlive the service.
  RpcService(SharedChain* chain, Sequencer* sequencer, RpcLimits limits = {},
             RpcServiceInfo info = {});

  // One request object or a batch (array); answers a response object or an array.
  nlohmann::json HandleRpc(const nlohmann::json& request);
  // Raw HTTP body in, response text out: checks size and depth before parsing.
  std::string HandleBody(std::string_view body);

  // Wakes long-polls and refuses new ones; called on shutdown.
  void Shutdown();

  const RpcLimits& limits() const { return limits_; }
  // Requests answered, keyed by {method, "ok" or the JSON-RPC error code}, for GET /metrics.
  const LabeledCounters& requests() const { return requests_; }
  SharedChain* chain() const { return chain_; }
  Sequencer* sequencer() const { return sequencer_; }

 private:
  // `wait_deadline_ms` (steady clock): when every long-poll of this request or batch must end.
  nlohmann::json HandleOne(const nlohmann::json& request, int64_t wait_deadline_ms);
  nlohmann::json AnswerOne(const nlohmann::json& request, int64_t wait_deadline_ms,
                           std::string* method_label);
  nlohmann::json Dispatch(const std::string& method, const nlohmann::json& params,
                          int64_t wait_deadline_ms);

  SharedChain* chain_;
  Sequencer* sequencer_;
  RpcLimits limits_;
  RpcServiceInfo info_;
  std::atomic<int> waiters_{0};
  LabeledCounters requests_;
};

// {"jsonrpc":"2.0","id":id,"error":{"code":..,"message":..,"data":{"status":..}}}
nlohmann::json RpcErrorResponse(const nlohmann::json& id, int code, const std::string& message,
                                StatusCode status);

// True when `text` nests arrays/objects deeper than `max_depth` (strings are skipped, so
// brackets inside them do not count). Linear, no recursion: safe on hostile input.
bool JsonTooDeep(std::string_view text, int max_depth);

}  // namespace meshlearn::ledger
