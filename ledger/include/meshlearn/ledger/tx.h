// Signed transactions: the only way ledger state changes.
//
// A Transaction names its chain (no replay across networks), its sender and the sender's next
// nonce (no replay within the chain), a fee (may be 0) and one typed payload; the sender signs
// it with ed25519. The payload types are listed once, in tx_types.h.
//
//   Transaction tx = BuildSignedTx(alice, "meshlearn-devnet", /*nonce=*/0,
//                                  TransferTx{.to = bob.public_key(), .amount = 100});
//   Bytes wire = EncodeTx(tx);                 // what goes over RPC
//   ML_ASSIGN_OR_RETURN(Transaction back, DecodeTx(wire));
//   Hash256 id = TxId(back);                   // == TxId(tx)
//   nlohmann::json view = TxToJson(tx);        // for explorers and the CLI
//
// Encoding (canonical, base/encoding.h):
//   u8 version(=1) | string chain_id | pubkey sender | u64 nonce | u64 fee | u16 type tag |
//   payload fields in Visit order | signature
// The signature covers SigningBytes(tx): a domain tag and everything before the signature.
// DecodeTx refuses inputs over kMaxTxBytes, truncated inputs, unknown tags, over-long fields
// and trailing bytes. All functions here are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx_types.h"

namespace meshlearn::ledger {

inline constexpr size_t kMaxTxBytes = 16 * 1024;       // a whole encoded transaction
// A RefereeStep, a ProveResult or a ProveFraud carries a witness (the training state of a small
// model and one batch of examples, or a global state): the only transactions allowed past
// kMaxTxBytes.
inline constexpr size_t kMaxWitnessBytes = 8u << 20;
inline constexpr size_t kMaxLargeTxBytes = kMaxWitnessBytes + kMaxTxBytes;
// A RefereeTile's witness (one tile's inputs: referee_tile.h) is bounded by the tile rule's design
// (issue 16: 256 KiB whatever the model's size), its transaction by that plus a bundle.
inline constexpr size_t kMaxTileWitnessBytes = 256 * 1024;
// The task bundle a transaction may carry (BundleField): the TOML text of a task, a few KiB.
inline constexpr uint32_t kMaxBundleBytes = 12 * 1024;
inline constexpr size_t kMaxTileTxBytes = kMaxTileWitnessBytes + kMaxBundleBytes + kMaxTxBytes;
inline constexpr uint32_t kMaxChainIdLength = 64;
inline constexpr uint32_t kMaxStringFieldLength = 1024;  // endpoint, memo, accelerator, ...
inline constexpr uint8_t kTxVersion = 1;
inline constexpr uint32_t kMaxHashListLength = 64;  // a std::vector<Hash256> field (Merkle path)
// A std::vector<uint64_t> field (TaskParams' per-stage needs: protocol::kMaxPipelineStages).
inline constexpr uint32_t kMaxU64ListLength = 256;

enum class TxType : uint16_t {
#define ML_TX_ENUM_(Name, tag, module) k##Name = tag,
  MESHLEARN_LEDGER_TX_TYPES(ML_TX_ENUM_)
#undef ML_TX_ENUM_
};
// "Transfer", "RegisterNode", ...; "Unknown" for a value not in the list.
std::string_view TxTypeName(TxType t);
Result<TxType> TxTypeFromName(std::string_view name);
// The transactions that rule a dispute at the referee stage, each kept as a DisputeRuling
// (state.h) once executed: the ledger's own executions and the genesis key's word.
inline bool IsRulingTx(TxType t) {
  return t == TxType::kRefereeStep || t == TxType::kRefereeTile || t == TxType::kRefereeStageStep ||
         t == TxType::kRuleDispute || t == TxType::kServeStageEvidence;
}

// ---- Payloads. Each lists its fields once, in Visit, which drives encoding and JSON. Field
// types understood by Visit: uint8/16/32/64_t, int64_t, bool, std::string (<=
// kMaxStringFieldLength), PublicKey, Hash256, std::vector<Hash256> (<= kMaxHashListLength),
// std::vector<uint64_t> (<= kMaxU64ListLength), std::vector of a struct with a Visit and a
// kMaxListLength (NodeLink),
// WitnessField, BundleField, and structs with a Visit (NodeCapabilities, TaskParams,
// MerkleProofField, MismatchClaimField).

// A task bundle's text (blob id == the task's spec_hash; at most kMaxBundleBytes, UTF-8; a JSON
// string): what lets the ledger derive a disputed step's operator and tile plan
// (docs/verification.md, "Tiles"). Empty: none given.
struct BundleField {
  std::string text;
  bool operator==(const BundleField&) const = default;
};

// Moves `amount` from the sender's balance to `to` (creating `to` if new).
struct TransferTx {
  static constexpr TxType kType = TxType::kTransfer;
  PublicKey to;
  Amount amount = 0;
  std::string memo;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("to", s.to);
    v("amount", s.amount);
    v("memo", s.memo);
  }
  bool operator==(const TransferTx&) const = default;
};

// Devnets only (genesis faucet = true): mints `amount` (<= params.faucet_max_amount) to
// `recipient`. The sender may be a new key (its account is created with nonce 0).
struct FaucetTx {
  static constexpr TxType kType = TxType::kFaucet;
  PublicKey recipient;
  Amount amount = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("recipient", s.recipient);
    v("amount", s.amount);
  }
  bool operator==(const FaucetTx&) const = default;
};

// Bonds `amount` from the sender's balance onto a node the sender owns.
struct StakeTx {
  static constexpr TxType kType = TxType::kStake;
  PublicKey node_id;
  Amount amount = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
    v("amount", s.amount);
  }
  bool operator==(const StakeTx&) const = default;
};

// Starts unbonding `amount` of a node's stake; Withdraw releases it after
// params.unbonding_delay_blocks. An active node must keep its roles' minimum stake.
struct UnstakeTx {
  static constexpr TxType kType = TxType::kUnstake;
  PublicKey node_id;
  Amount amount = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
    v("amount", s.amount);
  }
  bool operator==(const UnstakeTx&) const = default;
};

// Moves every matured unbonding entry of the sender to its balance. Fails if none matured.
struct WithdrawTx {
  static constexpr TxType kType = TxType::kWithdraw;
  template <typename S, typename V>
  static void Visit(S&, V&&) {}
  bool operator==(const WithdrawTx&) const = default;
};

// Registers a node owned by the sender and bonds `stake` (>= the minimum of its roles).
struct RegisterNodeTx {
  static constexpr TxType kType = TxType::kRegisterNode;
  PublicKey node_id;
  std::string endpoint;
  uint32_t roles = 0;
  NodeCapabilities capabilities;
  Amount price = 0;
  Amount stake = 0;
  // Head of the node's forced-error secret chain (protocol::SecretChainElement(seed, 0)).
  // Required for a solver on a chain with verification on.
  Hash256 secret_head;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
    v("endpoint", s.endpoint);
    v("roles", s.roles);
    v("capabilities", s.capabilities);
    v("price", s.price);
    v("stake", s.stake);
    v("secret_head", s.secret_head);
  }
  bool operator==(const RegisterNodeTx&) const = default;
};

// Replaces a node's endpoint, roles, capabilities and price (owner only, active nodes only).
struct UpdateNodeTx {
  static constexpr TxType kType = TxType::kUpdateNode;
  PublicKey node_id;
  std::string endpoint;
  uint32_t roles = 0;
  NodeCapabilities capabilities;
  Amount price = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
    v("endpoint", s.endpoint);
    v("roles", s.roles);
    v("capabilities", s.capabilities);
    v("price", s.price);
  }
  bool operator==(const UpdateNodeTx&) const = default;
};

// Records that the node is online at this height (owner only).
struct HeartbeatTx {
  static constexpr TxType kType = TxType::kHeartbeat;
  PublicKey node_id;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
  }
  bool operator==(const HeartbeatTx&) const = default;
};

// The node leaves: status becomes unbonding and all its stake starts unbonding.
struct LeaveNodeTx {
  static constexpr TxType kType = TxType::kLeaveNode;
  PublicKey node_id;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
  }
  bool operator==(const LeaveNodeTx&) const = default;
};

// The node's measured links to peers it exchanged stage data with (node::MeasuredLinks), for
// placing consecutive pipeline stages on well-connected nodes (protocol::PlaceStages). Sent by
// the node or its owner; replaces the node's earlier report (empty: withdraws it). Each peer a
// registered node other than itself, at most once; at most protocol::kMaxNodeLinks links;
// latency_ms <= protocol::kMaxLinkLatencyMs; bandwidth in [1, kMaxLinkBandwidthBytesPerS].
struct ReportLinksTx {
  static constexpr TxType kType = TxType::kReportLinks;
  PublicKey node_id;
  std::vector<NodeLink> links;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("node_id", s.node_id);
    v("links", s.links);
  }
  bool operator==(const ReportLinksTx&) const = default;
};

// Posts a training task and escrows `budget` from the sender's balance. The task id is
// TaskIdFor(sender, nonce). spec_hash: blob id of the task bundle; price_cap: the most the
// submitter pays, tokens per 10^9 training FLOPs. The params are checked with
// protocol::ValidateTaskSpec before any money moves; all rounds x units_per_round work units
// are created at once.
struct SubmitTaskTx {
  static constexpr TxType kType = TxType::kSubmitTask;
  Hash256 spec_hash;
  Amount budget = 0;
  Amount price_cap = 0;
  std::string memo;
  TaskParams params;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("spec_hash", s.spec_hash);
    v("budget", s.budget);
    v("price_cap", s.price_cap);
    v("memo", s.memo);
    v("params", s.params);
  }
  bool operator==(const SubmitTaskTx&) const = default;
};

// Cancels an open task (submitter only) and refunds the escrow not yet spent.
struct CancelTaskTx {
  static constexpr TxType kType = TxType::kCancelTask;
  Hash256 task_id;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
  }
  bool operator==(const CancelTaskTx&) const = default;
};

// A solver's result for work unit `index` (= round * units_per_round + shard) of a task. Sender:
// the node's own key or its owner. Accepted only from the unit's assignee, at or before its
// deadline. result_hash: blob id of the delta blob; commitment: Merkle root of the unit's
// checkpoint state hashes; loss_micros: mean training loss x 1e6 (display only).
struct CommitUnitTx {
  static constexpr TxType kType = TxType::kCommitUnit;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  Hash256 result_hash;
  Hash256 commitment;
  uint64_t loss_micros = 0;
  // With verification: the node's secret chain element bound to this commit, which must be the
  // next one (NodeRecord::secrets_committed + 1); it decides, with the unit's assignment beacon,
  // whether the unit is a forced error. Ignored without verification.
  uint64_t secret_index = 0;
  // With verification: the committed leaves themselves (the state hashes after steps 0, k, 2k,
  // ..., H; MerkleRoot(leaves) == commitment), so that a verifier can always prove a claim
  // against them even if the solver serves nothing.
  std::vector<Hash256> leaves;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("result_hash", s.result_hash);
    v("commitment", s.commitment);
    v("loss_micros", s.loss_micros);
    v("secret_index", s.secret_index);
    v("leaves", s.leaves);
  }
  bool operator==(const CommitUnitTx&) const = default;
};

// The aggregator's new global state for round `round` of a task. Sender: the node's own key or
// its owner. Accepted only from the round's assigned aggregator, at or before its deadline.
// state_hash: blob id of the new global state blob; test metrics as the aggregator measured.
struct CommitAggregateTx {
  static constexpr TxType kType = TxType::kCommitAggregate;
  Hash256 task_id;
  uint32_t round = 0;
  PublicKey node_id;
  Hash256 state_hash;
  uint32_t test_accuracy_ppm = 0;
  uint64_t test_loss_micros = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("round", s.round);
    v("node_id", s.node_id);
    v("state_hash", s.state_hash);
    v("test_accuracy_ppm", s.test_accuracy_ppm);
    v("test_loss_micros", s.test_loss_micros);
  }
  bool operator==(const CommitAggregateTx&) const = default;
};

// The assigned aggregator of a round could not fetch unit `index`'s committed delta from
// anyone (its solver died before anybody copied it). Units are deterministic, so the round is
// re-run without that solver: every unit of the round is pending again, the solver is excluded
// from them, counts a failure and is never paid for the unit. Only the round's assigned
// aggregator may report, only for a committed unit of the round it aggregates.
struct ReportUnavailableTx {
  static constexpr TxType kType = TxType::kReportUnavailable;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;  // the reporting aggregator
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
  }
  bool operator==(const ReportUnavailableTx&) const = default;
};

// A pipeline stage node's result (issue 15; docs/protocol.md, "Pipeline stage units"): stage
// `stage` of replica `replica` in round `round` of a task with TaskParams::stages > 1 (its unit
// StageUnitIndex). Sender: the node's own key or its owner. Accepted only from the node the ledger
// placed on that stage, at or before its deadline, in the round being trained. result_hash: blob
// id of the stage's delta blob (its parameters' delta over the H steps); commitment: the stage's
// protocol::StageCommitment, the Merkle root over its steps' StageStepLeaf (the stage's state
// hashes before and after each step, and the signed transfers it received and sent that step);
// loss_micros: the last stage's mean training loss x 1e6 (display only; 0 from other stages).
// A task without stages takes CommitUnit, a pipeline task only CommitStage.
// With verification, as CommitUnit: secret_index, the node's next secret chain element, and
// leaves, the stage's H step leaves themselves (StageStepLeaf of steps 0..H-1;
// StageCommitment(leaves) == commitment), over which the ledger opens the stage unit's check
// (protocol::StageCheckLeaves: one check "segment" per step). Both ignored without verification.
// commits: the blob id of the stage's step commits (protocol::EncodeStageStepCommits of its H
// StageStepCommits: the signed records and two state hashes a step, no tensors), which the nodes
// that keep the round's deltas keep as long as those, so that the run's commits stay public past
// the round (docs/verification.md, "An audit of a pipeline task"); zero: not kept. The ledger
// records it on the unit (WorkUnit::stage_commits) and does not fetch it.
// assignment_beacon: the placement the stage ran on, the unit's WorkUnit::assignment_beacon as
// node_work listed it (the beacon of the block that placed it). A unit placed again (its
// replica's deadline passed, a node of it was lost, its round re-ran) gets the new block's beacon,
// even where the same node keeps the stage: a commit of the earlier placement's run, sent before
// the re-placement and landing after it, is refused (its step records are signed by the earlier
// chain, which the unit's check would judge against the new one).
struct CommitStageTx {
  static constexpr TxType kType = TxType::kCommitStage;
  Hash256 task_id;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  PublicKey node_id;
  Hash256 result_hash;
  Hash256 commitment;
  uint64_t loss_micros = 0;
  uint64_t secret_index = 0;
  std::vector<Hash256> leaves;
  Hash256 commits;
  Hash256 assignment_beacon;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("round", s.round);
    v("replica", s.replica);
    v("stage", s.stage);
    v("node_id", s.node_id);
    v("result_hash", s.result_hash);
    v("commitment", s.commitment);
    v("loss_micros", s.loss_micros);
    v("secret_index", s.secret_index);
    v("leaves", s.leaves);
    v("commits", s.commits);
    v("assignment_beacon", s.assignment_beacon);
  }
  bool operator==(const CommitStageTx&) const = default;
};

// ---- Verification (docs/verification.md, ledger/src/verification.cc). Every one names a
// committed unit (task_id, index) under check and the node acting (sender: the node's key or its
// owner). Windows are in blocks and are set by genesis params.

// A Merkle inclusion proof (base/merkle.h) as a transaction field.
struct MerkleProofField {
  uint64_t index = 0;
  uint64_t leaf_count = 0;
  std::vector<Hash256> siblings;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("index", s.index);
    v("leaf_count", s.leaf_count);
    v("siblings", s.siblings);
  }
  bool operator==(const MerkleProofField&) const = default;
};

// protocol::MismatchClaim: segment `segment` of the solver's commitment does not replay to its
// committed end; `start`/`solver_end` are committed leaves (with proofs), `replayed_end` what
// the claimant's replay produced.
struct MismatchClaimField {
  uint32_t segment = 0;
  Hash256 start;
  MerkleProofField start_proof;
  Hash256 solver_end;
  MerkleProofField end_proof;
  Hash256 replayed_end;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("segment", s.segment);
    v("start", s.start);
    v("start_proof", s.start_proof);
    v("solver_end", s.solver_end);
    v("end_proof", s.end_proof);
    v("replayed_end", s.replayed_end);
  }
  bool operator==(const MismatchClaimField&) const = default;
};

// A drawn verifier's sealed verdict: protocol::VerdictCommitment(verdict, salt, node, unit,
// evidence). Only in the unit's commit window.
struct CommitVerdictTx {
  static constexpr TxType kType = TxType::kCommitVerdict;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  Hash256 commitment;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("commitment", s.commitment);
  }
  bool operator==(const CommitVerdictTx&) const = default;
};

// Opens a committed verdict in the reveal window. verdict: 1 clean, 2 mismatch (then `claim` is
// the evidence; it is ignored for clean). A mismatch may carry the task's `bundle` (an exact-mode
// task): the ledger derives the step's tile plan from it (TilePhaseOf, referee_tile.h) and the
// dispute the mismatch opens narrows to one tile of one operator (RefereeTile rules it); without
// it the dispute plays whole steps. Refused with a bundle that is not the task's, on a clean
// verdict, or for a tolerance-mode task.
struct RevealVerdictTx {
  static constexpr TxType kType = TxType::kRevealVerdict;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  uint8_t verdict = 0;
  Hash256 salt;
  MismatchClaimField claim;
  BundleField bundle;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("verdict", s.verdict);
    v("salt", s.salt);
    v("claim", s.claim);
    v("bundle", s.bundle);
  }
  bool operator==(const RevealVerdictTx&) const = default;
};

// Bytes of at most kMaxWitnessBytes, hex in JSON: a RefereeStepTx's witness (EncodeStepWitness),
// and the other witnesses and encoded lists that may be longer than kMaxTxBytes.
struct WitnessField {
  Bytes bytes;
  bool operator==(const WitnessField&) const = default;
};

// The solver reveals the secret chain element of this unit (WorkUnit::secret_index) in the
// reveal window; start_leaf: its committed state hash after step 0 (checked only when the secret
// says the unit was a forced error). forced_commits: empty, except for a pipeline stage unit the
// secret draws for a forced error, which carries the stage's H step commits
// (protocol::EncodeStageStepCommits), each in the forced form (protocol::ForceStageStepStates),
// so that the ledger can check the form it cannot derive from chain data (docs/verification.md,
// "Forced errors for stage units"). May be longer than kMaxTxBytes (kMaxLargeTxBytes): a step
// commit holds the step's signed records, 240 bytes each.
struct RevealSecretTx {
  static constexpr TxType kType = TxType::kRevealSecret;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  Hash256 secret;
  Hash256 start_leaf;
  WitnessField forced_commits;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("secret", s.secret);
    v("start_leaf", s.start_leaf);
    v("forced_commits", s.forced_commits);
  }
  bool operator==(const RevealSecretTx&) const = default;
};

// A party's move in the unit's dispute: its hash at the current query's position (a state hash
// after step `position` in phase 1, the operator chain hash C_position in phase 2, the disputed
// operator's output root at phase 3's opening, TileHash(S_position) in phase 4).
struct DisputePostTx {
  static constexpr TxType kType = TxType::kDisputePost;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  uint64_t position = 0;
  Hash256 hash;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("position", s.position);
    v("hash", s.hash);
  }
  bool operator==(const DisputePostTx&) const = default;
};

// Phase 3 of the unit's dispute (protocol/dispute.h): a party's two children `left`, `right` of
// the disputed Merkle node (query level, `position`) over the operator's output tiles; refused
// unless they hash to the party's own node.
struct DisputeChildrenTx {
  static constexpr TxType kType = TxType::kDisputeChildren;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  uint64_t position = 0;
  Hash256 left;
  Hash256 right;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("position", s.position);
    v("left", s.left);
    v("right", s.right);
  }
  bool operator==(const DisputeChildrenTx&) const = default;
};

// A whistleblower challenges a unit settled clean or unchecked, before its round is final: a
// dispute between the solver and the whistleblower (whose stake is its bond). `bundle`: as in
// RevealVerdictTx (the dispute narrows to a tile).
struct ChallengeUnitTx {
  static constexpr TxType kType = TxType::kChallengeUnit;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  MismatchClaimField claim;
  BundleField bundle;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("claim", s.claim);
    v("bundle", s.bundle);
  }
  bool operator==(const ChallengeUnitTx&) const = default;
};

// A whistleblower's dispute the solver lost only by missing its turn shows nothing about its
// work, so the check waits `dispute_response_blocks` more blocks for its merits
// (protocol::UnitCheck::awaits_merits): in that window a whistleblower node `node_id` (any but
// the solver, not only the one that challenged) sends the SegmentWitness of the disputed segment
// `segment` (what ProveFraudTx carries; the ledger replays it with ExecuteSegmentWitness). If
// the segment does not replay to the solver's committed end, the check settles as fraud on the
// merits: the solver and the verifiers that called the unit clean are slashed, and the earliest
// node that committed to the witness a block or more before (CommitProofTx; none: nobody) gets
// the bounty (the whole of it only when it is the whistleblower that challenged). Refused,
// changing nothing, outside the window, for another segment, or when
// the segment replays to its committed end. For a unit whose segments the ledger replays from a
// witness (exact mode, a data root, not a token task nor a pipeline stage); for the others the
// window closes into a loss by silence alone (docs/verification.md, "Whistleblowers'
// incentives"). May be longer than kMaxTxBytes (kMaxLargeTxBytes).
struct ProveMeritsTx {
  static constexpr TxType kType = TxType::kProveMerits;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  uint32_t segment = 0;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("segment", s.segment);
    v("witness", s.witness);
  }
  bool operator==(const ProveMeritsTx&) const = default;
};

// The referee's result for a dispute in the referee stage: the correct output hash of the single
// step or operator the game narrowed to (protocol::RefereeTask), or, for a task in tolerance
// mode (a whole segment), `tolerance_verdict` 1 = the defender's committed end state is within
// the task's tolerance of the referee's replay, 2 = it is not (0 in exact mode). Sender: the
// genesis referee.
struct RuleDisputeTx {
  static constexpr TxType kType = TxType::kRuleDispute;
  Hash256 task_id;
  uint32_t index = 0;
  Hash256 output;
  uint8_t tolerance_verdict = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("output", s.output);
    v("tolerance_verdict", s.tolerance_verdict);
  }
  bool operator==(const RuleDisputeTx&) const = default;
};

// The witness of one training step, for a dispute whose game narrowed to a whole step (exact
// mode): everything the ledger needs to compute that step itself (engine/step_replay.h). Posted
// by anyone (in practice a party of the dispute or a referee service) as RefereeStepTx; the ledger
// checks every input against what is on chain, runs the step and rules with its own output.
struct StepWitnessExample {
  uint64_t index = 0;     // dataset index (must be the batch's index at its position)
  std::vector<float> x;   // the example as the engine trains on it (normalised)
  int32_t y = 0;          // class id
  MerkleProof proof;      // of engine::ExampleLeaf(index, x, y) against the task's data_root
  bool operator==(const StepWitnessExample&) const = default;
};
// One page of a token task's train stream (engine::TokenPageTree), proven against the data root:
// how a witness proves the tokens a step reads (RefereeTile's tile, RefereeStageStep's and
// ProveFraud's batches).
struct TileWitnessPage {
  uint64_t page = 0;
  std::vector<int32_t> tokens;
  MerkleProof proof;
  bool operator==(const TileWitnessPage&) const = default;
};
struct StepWitness {
  std::string bundle;                        // the task bundle text (blob id == spec_hash)
  std::vector<float> state;                  // engine::FlatState of the agreed state (step - 1)
  std::vector<StepWitnessExample> examples;  // the batch of the step, in batch order
  bool operator==(const StepWitness&) const = default;
};
Bytes EncodeStepWitness(const StepWitness& w);
// Refuses truncated or trailing bytes and sizes over kMaxWitnessBytes (InvalidArgument).
Result<StepWitness> DecodeStepWitness(ByteSpan bytes);

// The ledger rules a dispute in the referee stage whose task is one whole training step (exact
// mode, a task with a data_root): `witness` (EncodeStepWitness) is checked against the chain (the
// bundle against spec_hash, the state against the agreed hash, each example against data_root at
// the batch's index) and the step is executed; DisputeGame::Rule gets the ledger's own output.
// Sender: anyone. May be longer than kMaxTxBytes (kMaxLargeTxBytes).
struct RefereeStepTx {
  static constexpr TxType kType = TxType::kRefereeStep;
  Hash256 task_id;
  uint32_t index = 0;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("witness", s.witness);
  }
  bool operator==(const RefereeStepTx&) const = default;
};

// The ledger rules a dispute in the referee stage whose task is one tile of one operator (or one
// reduction block of it; protocol::RefereeTask::tile): `bundle` is the task's (checked against
// spec_hash; it gives the step's plan, the unit's optimizer and its batches), `witness` an
// encoded TileWitness (ledger/referee_tile.h, at most kMaxTileWitnessBytes): the footprint's
// input tiles and examples, each proven against an agreed commitment. The ledger recomputes the
// tile (RuleTile) and DisputeGame::Rule gets its output. Sender: anyone. No key is trusted.
struct RefereeTileTx {
  static constexpr TxType kType = TxType::kRefereeTile;
  Hash256 task_id;
  uint32_t index = 0;
  BundleField bundle;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("bundle", s.bundle);
    v("witness", s.witness);
  }
  bool operator==(const RefereeTileTx&) const = default;
};

// The ledger rules a dispute in the referee stage on one step of a pipeline stage unit (issue 15;
// docs/verification.md "Pipeline stages"): `witness` (ledger/stage_referee.h,
// EncodeStageStepWitness; at most kMaxWitnessBytes) is the whole stage step -- the task bundle,
// the stage's committed StageStepCommit (its leaf must be the disputed step's committed leaf), its
// checkpoint of the step's start (hashing to state_before), every tensor it received (each
// matching its signed record) and the step's batch proven against the data root. The ledger
// replays the step (ReplayStageStep, every record's signature against the replica's chain) and
// DisputeGame::Rule gets StageFindingLeaf: the party whose leaf it is wins. Sender: anyone. No key
// is trusted. May be longer than kMaxTxBytes (kMaxLargeTxBytes).
struct RefereeStageStepTx {
  static constexpr TxType kType = TxType::kRefereeStageStep;
  Hash256 task_id;
  uint32_t index = 0;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("witness", s.witness);
  }
  bool operator==(const RefereeStageStepTx&) const = default;
};

// One piece of a pipeline stage's step evidence (issue 16; ledger/stage_serve.h), posted while a
// claim that the stage served nothing for the step waits at the referee, on a stage over the
// stage witness bound (ServesStageEvidence): piece 0 the committed commit and the stage state's
// roots, piece p > 0 kServeTilesPerPiece tiles of its checkpoint's and received tensors, each
// proven against its root. `bundle` is the task's (the ledger derives the stage's plan from it,
// as for RefereeTile). The ledger checks the piece alone (CheckStageServePiece) and records it
// in the unit's StageServeRecord; the piece that completes the evidence rules the claim served
// (DisputeGame::RuleServed: nobody slashed; the step is then checked from the evidence on chain).
// A piece missing when the serving window ends (ServeWindowBlocks after the referee's deadline,
// grown to the evidence's real piece count by its first piece) rules against the stage. Sender: anyone
// (the stage's node in practice; the sender pays its fee). May be longer than kMaxTxBytes
// (kMaxLargeTxBytes).
struct ServeStageEvidenceTx {
  static constexpr TxType kType = TxType::kServeStageEvidence;
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t piece = 0;
  BundleField bundle;
  WitnessField witness;  // EncodeStageServePiece
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("piece", s.piece);
    v("bundle", s.bundle);
    v("witness", s.witness);
  }
  bool operator==(const ServeStageEvidenceTx&) const = default;
};

// The witness that a unit's committed result is not what its own committed final state gives:
// the task bundle (blob id == spec_hash), the round's start state blob (blob id == the round's
// start state on chain) and the solver's final training state (engine::FlatState after step H,
// hashing to the unit's last committed leaf). The ledger computes the delta (start weights -
// final parameters), its delta blob id (protocol/state_blob.h) and compares it with the unit's
// result_hash.
struct ResultWitness {
  std::string bundle;
  Bytes start_state;          // the global state blob the round started from
  std::vector<float> state;   // engine::FlatState of the state after step H
  bool operator==(const ResultWitness&) const = default;
};
Bytes EncodeResultWitness(const ResultWitness& w);
Result<ResultWitness> DecodeResultWitness(ByteSpan bytes);

// Anyone (a registered node `node_id` of the sender: verifiers check every result they replay,
// whistleblowers sample) shows that unit `index`'s result_hash is not the delta of the state
// its last leaf commits to, until the unit's round is final: the unit is fraud at once (the
// solver slashed, the round re-run, and the earliest node that committed to the witness a
// block or more before rewarded from the jackpot: CommitProofTx, not necessarily `node_id`;
// none: nobody). Refused, changing nothing, when the witness does not check out or the result is
// right.
struct ProveResultTx {
  static constexpr TxType kType = TxType::kProveResult;
  Hash256 task_id;
  uint32_t index = 0;
  PublicKey node_id;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("node_id", s.node_id);
    v("witness", s.witness);
  }
  bool operator==(const ProveResultTx&) const = default;
};

// The witness that segment `segment` of a unit whose round is final does not replay to its
// committed end (ProveFraudTx; docs/verification.md, "Fraud proofs after the fact"): everything
// the ledger needs to re-execute the segment's steps itself, each input checked against the chain.
//   - bundle: the task bundle text (blob id == spec_hash);
//   - the segment's start: for segment 0 `start_state`, the global state blob the round started
//     from (blob id == the round's start on chain; the unit starts from its weights with a fresh
//     optimizer, as every solver does), `state` empty; for a later segment `state`, the
//     engine::FlatState after step segment x k, which must hash to the unit's committed leaf
//     `segment`, `start_state` empty;
//   - examples: the batches of the segment's steps, step after step, each batch in batch order
//     (engine::BatchIndices), each example proven against the task's data_root. Batches are a
//     pure function of (task seed, unit stream, step), so no intermediate state is needed.
//   - pages, in place of examples for a token task (a data root over its token pages,
//     params.data_page_tokens): step after step, the pages that step's batch reads
//     (StepBatchPages: engine::TokenPagesOfRows of every row, increasing), each proven against
//     the data root, as a RefereeStageStep's batch is.
// Encoded with magic v1 without pages (every classification witness's bytes as before), v2 with.
struct SegmentWitness {
  std::string bundle;
  Bytes start_state;
  std::vector<float> state;
  std::vector<StepWitnessExample> examples;
  std::vector<TileWitnessPage> pages;
  bool operator==(const SegmentWitness&) const = default;
};
Bytes EncodeSegmentWitness(const SegmentWitness& w);
// Refuses truncated or trailing bytes and sizes over kMaxWitnessBytes (InvalidArgument).
Result<SegmentWitness> DecodeSegmentWitness(ByteSpan bytes);

// Anyone (the sender: any account) proves after the fact that unit `index` of a task committed a
// segment its replay does not reach: the ledger re-executes segment `segment` from the witness
// (SegmentWitness) and compares the end state's hash with the committed leaf segment + 1.
// Accepted only for a paid unit whose round is final (before that the dispute path applies:
// verdicts, ChallengeUnit) and while the solver's stake is bonded (on the node, or unbonding and
// not withdrawn), once per unit. Then the solver is slashed (stake, then unbonding) and jailed,
// what it was paid for the unit is clawed back to the submitter, the earliest prover that
// committed to the witness a block or more before (CommitProofTx; none: nobody, whoever sent
// it) gets a bounty from the jackpot, and the task's record marks the unit's round
// (VerificationTally::proven_frauds).
// Refused, changing nothing, when the witness does not check out or the segment replays to its
// committed end. May be longer than kMaxTxBytes (kMaxLargeTxBytes).
// A pipeline stage's unit: `segment` is the step (as in its check), and `witness` is the
// StageStepWitness of that step (stage_referee.h, what RefereeStageStep carries); the ledger
// replays it (RuleStageStepWitness) and compares the finding leaf with the committed step leaf.
// Only for a stage the ledger rules from a witness (LedgerRulesStageStep).
struct ProveFraudTx {
  static constexpr TxType kType = TxType::kProveFraud;
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t segment = 0;
  WitnessField witness;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("segment", s.segment);
    v("witness", s.witness);
  }
  bool operator==(const ProveFraudTx&) const = default;
};

// A fraud proof after the fact played as a dispute game, for a unit whose segment witness does
// not fit a ProveFraud (over kMaxWitnessBytes: a model over about 500k parameters with AdamW;
// docs/verification.md, "Over 8 MiB: a late dispute"). Accepted on ProveFraud's terms (a paid unit
// of a final round, an exact-mode task with a data root, not a pipeline stage, the solver's stake
// still bonded, not proven already) and while no late game is open on the unit. `end`: the state
// hash the challenger's replay of segment `segment` reaches instead of the committed leaf
// segment + 1. The ledger opens a DisputeGame on the unit (WorkUnit::late): the solver (defender,
// bound by its committed leaves `segment` and segment + 1) against the sender (challenger; its
// moves are DisputePost / DisputeChildren with node_id = the sender's key), played and ruled as a
// live dispute is (RefereeStep, RefereeTile, silence loses), each turn's deadline sized by the
// unit's work (LateResponseBlocks). `bundle`: the task's bundle (blob id == spec_hash), whose
// plan gives the game its tile phase; required where a mismatch needs it (MismatchNeedsBundle).
// `bond` (at least LateChallengeMinBond: the unit's cost, what the solver's re-run is worth)
// leaves the sender's balance while the game runs. Ruled for the challenger: ProveFraud's effects
// and the bond back; for the solver (or unruled by the referee's deadline): the bond pays the
// solver's owner the unit's cost and the rest goes to the jackpot.
struct LateChallengeTx {
  static constexpr TxType kType = TxType::kLateChallenge;
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t segment = 0;
  Hash256 end;
  Amount bond = 0;
  BundleField bundle;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("task_id", s.task_id);
    v("index", s.index);
    v("segment", s.segment);
    v("end", s.end);
    v("bond", s.bond);
    v("bundle", s.bundle);
  }
  bool operator==(const LateChallengeTx&) const = default;
};

// A prover's commitment to a proof it is about to send (docs/verification.md, "Commit, then
// prove"): `commitment` = ProofCommitment(ProofWitnessId(proof), prover), `prover` the key the
// proof's bounty is for: the sender itself (a ProveFraud's), or a node of the sender's (a
// ProveResult's or ProveMerits', which a node's owner may send for it). A ProveFraud,
// ProveResult or ProveMerits is public once sent, so a copier could send the same witness under
// its own key first; the ledger pays a proof's bounty only to the earliest prover whose
// commitment to that witness is at least one block older than the proof, which a copier's, made
// after the proof it copied was public, never is. Kept kProofCommitmentBlocks blocks, then
// dropped (EndBlock). Holds genesis params.proof_commit_deposit from the sender: back when a
// proof spends the commitment, to the jackpot when it expires or is evicted (a chain holding
// kMaxProofCommitments evicts the oldest kept). Refused: an all-zero
// commitment, one already kept (a replay), a prover neither the sender nor a node it owns, a
// prover holding kMaxProofCommitmentsPerProver, a sender that cannot pay the deposit.
struct CommitProofTx {
  static constexpr TxType kType = TxType::kCommitProof;
  Hash256 commitment;
  PublicKey prover;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("commitment", s.commitment);
    v("prover", s.prover);
  }
  bool operator==(const CommitProofTx&) const = default;
};

namespace internal {
template <typename Ignored, typename... T>
struct VariantOfRest {
  using type = std::variant<T...>;
};
}  // namespace internal

// One of the payload structs above, in tx_types.h order.
#define ML_TX_ALTERNATIVE_(Name, tag, module) , Name##Tx
using TxPayload =
    internal::VariantOfRest<void MESHLEARN_LEDGER_TX_TYPES(ML_TX_ALTERNATIVE_)>::type;
#undef ML_TX_ALTERNATIVE_

TxType PayloadType(const TxPayload& p);
// The longest encoded transaction of type `t`: kMaxTxBytes, kMaxLargeTxBytes for the four that
// carry a whole-state witness (RefereeStep, RefereeStageStep, ProveResult, ProveFraud,
// ProveMerits), for
// ServeStageEvidence (a piece of a stage's evidence) and for RevealSecret (a drawn stage's forced
// step commits), kMaxTileTxBytes for RefereeTile.
size_t MaxTxBytes(TxType t);

struct Transaction {
  std::string chain_id;
  PublicKey sender;
  uint64_t nonce = 0;
  Amount fee = 0;  // paid to the treasury when the transaction succeeds
  TxPayload payload;
  Signature signature;
  bool operator==(const Transaction&) const = default;
};

Bytes EncodeTx(const Transaction& tx);
// Refuses inputs over MaxTxBytes of their type, truncated or trailing bytes, unknown types, bad
// fields.
// Does NOT check the signature (see VerifyTxSignature).
Result<Transaction> DecodeTx(ByteSpan wire);

// ---- Commit, then prove (CommitProofTx). A commitment counts for proofs in the
// kProofCommitmentBlocks blocks after its own, and is dropped after them: commitments do not
// pile up, and the two bounds keep the ledger's scan of them (once per proof) short. The chain's
// bound never refuses a commitment: a new one evicts the oldest kept.
inline constexpr uint64_t kProofCommitmentBlocks = 256;
inline constexpr uint32_t kMaxProofCommitmentsPerProver = 16;
inline constexpr uint32_t kMaxProofCommitments = 4096;
// What a proof shows, without who sends it: its type, unit, segment and witness bytes (BLAKE2b).
// The one derivation the ledger (which pays the bounty) and the provers (node roles, `task audit
// --prove`) share.
Hash256 ProofWitnessId(const ProveFraudTx& tx);
Hash256 ProofWitnessId(const ProveResultTx& tx);
Hash256 ProofWitnessId(const ProveMeritsTx& tx);
// The same for a payload; nullopt for a payload that is not one of the three proofs.
std::optional<Hash256> ProofWitnessIdOf(const TxPayload& payload);
// What CommitProofTx carries: BLAKE2b(witness id, prover), `prover` the key that will send the
// proof and be paid (its node key for ProveResult and ProveMerits).
Hash256 ProofCommitment(const Hash256& witness_id, const PublicKey& prover);

// The domain tag that starts every signed message of a transaction, so that a transaction's
// signature can never be taken for a signature over any other kind of message.
inline constexpr std::string_view kTxDomain = "meshlearn.tx.v1";
// The bytes the sender signs: kTxDomain + the encoding without signature.
Bytes SigningBytes(const Transaction& tx);
// Id = BLAKE2b over the full encoding (signature included). ed25519 as libsodium checks it is
// not malleable, so a transaction has one id.
Hash256 TxId(const Transaction& tx);
// The same id from the encoding (EncodeTx's output), without re-encoding.
Hash256 TxIdOfEncoded(ByteSpan wire);
bool VerifyTxSignature(const Transaction& tx);

// Sets tx.sender to the signer's key and fills tx.signature.
Transaction SignTx(Transaction tx, const KeyPair& signer);
// Builds and signs in one step: the usual way clients make a transaction.
Transaction BuildSignedTx(const KeyPair& signer, std::string chain_id, uint64_t nonce,
                          TxPayload payload, Amount fee = 0);

// JSON views. TxToJson gives {"id","chain_id","sender","nonce","fee","type","payload":{...},
// "signature"}; keys and hashes are hex, amounts are JSON integers, roles a bit set.
// PayloadFromJson reads {"type": "Transfer", ...fields} (the CLI builds payloads this way);
// TxFromJson reads TxToJson's output back (the "id" is ignored).
nlohmann::json PayloadToJson(const TxPayload& p);
Result<TxPayload> PayloadFromJson(const nlohmann::json& j);
nlohmann::json TxToJson(const Transaction& tx);
Result<Transaction> TxFromJson(const nlohmann::json& j);

}  // namespace meshlearn::ledger
