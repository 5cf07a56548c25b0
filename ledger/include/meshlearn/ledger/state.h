// The records the ledger keeps: accounts, nodes, tasks, work units, and the chain-wide totals.
// These are plain values; the Chain (chain.h) owns the state and hands out copies.
//
// Tokens are integers in the smallest unit (uint64_t, never floats, never negative). Every
// record has one canonical encoding (base/encoding.h) which the state hash covers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {
class DisputeGame;
class UnitCheck;
}  // namespace meshlearn::protocol

namespace meshlearn::ledger {

using Amount = uint64_t;  // smallest token unit

// Stake on its way out: released to the balance by Withdraw once height >= release_height.
struct Unbonding {
  PublicKey node_id;
  Amount amount = 0;
  uint64_t release_height = 0;
  bool operator==(const Unbonding&) const = default;
};

struct Account {
  PublicKey key;
  Amount balance = 0;
  uint64_t nonce = 0;  // the nonce the next transaction from this account must carry
  std::vector<Unbonding> unbonding;  // in order of release_height (then insertion)
  bool operator==(const Account&) const = default;
};

// A prover's commitment to a proof it will send (CommitProofTx; docs/verification.md, "Commit,
// then prove"), kept by its hash: who sent it and in which block. Counts for proofs in the
// kProofCommitmentBlocks blocks after `height`, then is dropped. `deposit` (genesis
// params.proof_commit_deposit when it was made) is held from `payer`, the CommitProof's sender:
// back to it when a proof spends the commitment, to the jackpot when it expires or is evicted
// (a full table's new commitment evicts one: ProofCommitToEvict). Counted in Totals::escrow.
struct ProofCommit {
  Hash256 commitment;
  PublicKey prover;
  uint64_t height = 0;
  PublicKey payer;  // written only with a deposit (EncodeProofCommit)
  Amount deposit = 0;
  bool operator==(const ProofCommit&) const = default;
};

// Node roles: a bit set.
inline constexpr uint32_t kRoleSolver = 1u << 0;
inline constexpr uint32_t kRoleVerifier = 1u << 1;
inline constexpr uint32_t kRoleWhistleblower = 1u << 2;
inline constexpr uint32_t kRoleAggregator = 1u << 3;
inline constexpr uint32_t kAllRoles =
    kRoleSolver | kRoleVerifier | kRoleWhistleblower | kRoleAggregator;

// "solver,verifier" <-> bit set. Parse rejects unknown names and an empty list.
std::string RolesToString(uint32_t roles);
Result<uint32_t> ParseRoles(std::string_view comma_separated);

enum class NodeStatus : uint8_t {
  kActive = 0,
  kJailed = 1,     // slashed; gets no work until it re-registers (later issue)
  kUnbonding = 2,  // left the network; its stake is unbonding
};
std::string_view NodeStatusName(NodeStatus s);

// What a node can do, measured by `meshlearn node bench` and reported at registration.
// The scheduler (protocol/scheduler.h) reads memory, throughput, latency and bandwidth, and
// pipeline stage placement (protocol/stage_placement.h) the disk too; a node with throughput or
// bandwidth 0 gets no work.
struct NodeCapabilities {
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  std::string accelerator;  // "" for CPU only, e.g. "cuda:H100"
  uint64_t throughput = 0;  // training FLOP/s of the standard benchmark
  uint32_t latency_ms = 0;  // round-trip latency to the network
  uint64_t bandwidth_bytes_per_s = 0;  // sustained, both directions
  // The disk the node offers to its pipeline stage files (the evidence its stage units serve:
  // docs/node.md, "Stage tensors live in files"): node.toml's disk_limit_bytes, else its data
  // dir's free space when it started less a tenth (node::OfferedDiskBytes). The scheduler places
  // a stage only on a node whose disk holds the stage's protocol::StageDiskBytes. 0: none
  // declared (a record from before the field; RegisterNode and UpdateNode always carry it, so a
  // client from before it no longer decodes): its disk is not checked.
  uint64_t disk_bytes = 0;

  // The fields a node record held before disk_bytes: EncodeNode writes these in place and
  // disk_bytes in the record's optional tail, so that a record without it encodes as before.
  template <typename S, typename V>
  static void VisitMeasured(S& s, V&& v) {
    v("cores", s.cores);
    v("memory_bytes", s.memory_bytes);
    v("accelerator", s.accelerator);
    v("throughput", s.throughput);
    v("latency_ms", s.latency_ms);
    v("bandwidth_bytes_per_s", s.bandwidth_bytes_per_s);
  }
  // Transactions (RegisterNode, UpdateNode) and JSON carry every field.
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    VisitMeasured(s, v);
    v("disk_bytes", s.disk_bytes);
  }
  bool operator==(const NodeCapabilities&) const = default;
};

struct Reputation {
  uint64_t units_completed = 0;
  uint64_t units_verified_clean = 0;
  uint64_t clean_streak = 0;
  uint64_t failures = 0;
  uint64_t slashes = 0;
  uint64_t joined_height = 0;
  bool operator==(const Reputation&) const = default;
};

// What a node's work earned its owner and what it cost the node, by kind, over its life on the
// chain (a re-registration keeps it). Written where each payment is made (tasks.cc, network.cc,
// verification.cc), so it is the ledger's own record, not a sum of records that a re-run round
// resets: the sums over nodes equal the tasks' tallies (units: every settlement; aggregation:
// RoundResult::aggregator_paid; verification: VerificationTally::verifiers_paid; jackpot:
// VerificationTally::jackpot_paid). Escrow payments count before the treasury's cut, as the task
// counts them (the owner's balance got amount - treasury_cut_bps of it); the jackpot pays whole.
struct NodeEarnings {
  Amount units = 0;            // settled work units it solved (SettleWorkUnit)
  Amount aggregation = 0;      // rounds it aggregated, when the round settled
  Amount verification = 0;     // checks it replayed, when the check settled (ApplyEffects)
  Amount jackpot = 0;          // its share of jackpots: forced errors caught, challenges won
  uint64_t checks_paid = 0;    // verification payments, one per settled check it was paid for
  uint64_t jackpot_wins = 0;   // jackpot payments
  Amount slashed = 0;          // stake taken from it by slashes (to the jackpot and treasury)
  Amount clawed_back = 0;      // stake taken back for tainted rounds' pay (into the escrow)

  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("units", s.units);
    v("aggregation", s.aggregation);
    v("verification", s.verification);
    v("jackpot", s.jackpot);
    v("checks_paid", s.checks_paid);
    v("jackpot_wins", s.jackpot_wins);
    v("slashed", s.slashed);
    v("clawed_back", s.clawed_back);
  }
  bool operator==(const NodeEarnings&) const = default;
};

// A node is identified by its own ed25519 key (the key its daemon signs messages with), and
// owned by the account that registered it. One account may own many nodes.
// A link the node measured to a peer node and reported (ReportLinksTx); the scheduler reads it as
// a protocol::PeerLink (docs/protocol.md, "Pipeline stage placement"). Bounds: the protocol's
// kMaxNodeLinks, kMaxLinkLatencyMs, kMaxLinkBandwidthBytesPerS.
struct NodeLink {
  static constexpr uint32_t kMaxListLength = protocol::kMaxNodeLinks;  // a std::vector field
  PublicKey peer;
  uint32_t latency_ms = 0;             // round trip of the fastest push to the peer
  uint64_t bandwidth_bytes_per_s = 0;  // bytes its pushes moved per second
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("peer", s.peer);
    v("latency_ms", s.latency_ms);
    v("bandwidth_bytes_per_s", s.bandwidth_bytes_per_s);
  }
  bool operator==(const NodeLink&) const = default;
};

struct NodeRecord {
  PublicKey id;
  PublicKey owner;
  std::string endpoint;  // "http://host:port"
  uint32_t roles = 0;    // kRole* bits
  NodeCapabilities capabilities;
  Amount price = 0;  // asking price, tokens per 10^9 training FLOPs (protocol::UnitCostTokens)
  Amount stake = 0;  // bonded (unbonding stake moved to the owner's Account::unbonding)
  NodeStatus status = NodeStatus::kActive;
  Reputation reputation;
  uint64_t last_heartbeat_height = 0;
  // Forced-error secrets (protocol/verification.h): the deepest element of the node's secret
  // chain the ledger knows (the registered head, then the latest revealed secret), its index,
  // and how many units the node has committed (its n-th committed unit uses chain element n).
  Hash256 secret_anchor;
  uint64_t secret_anchor_index = 0;
  uint64_t secrets_committed = 0;
  NodeEarnings earnings;
  // Its last ReportLinks, sorted by peer; empty until it reports (then the record encodes as it
  // did before links existed: EncodeNode, which also keeps capabilities.disk_bytes in that tail).
  std::vector<NodeLink> links;
  bool operator==(const NodeRecord&) const = default;
};

enum class TaskStatus : uint8_t {
  kOpen = 0,       // escrowed, waiting for or running work
  kFinished = 1,   // all work settled; unspent escrow refunded
  kCancelled = 2,  // cancelled by the submitter; unspent escrow refunded
};
std::string_view TaskStatusName(TaskStatus s);

// The training parameters of a task (carried by SubmitTaskTx, kept in TaskRecord::params).
// The ledger checks them with protocol::ValidateTaskSpec and drives the task's rounds from
// them. Work unit index = round * units_per_round + shard; rounds x units_per_round <=
// kMaxTaskUnits.
struct TaskParams {
  uint32_t rounds = 0;               // outer (DiLoCo) rounds, R
  uint32_t units_per_round = 0;      // work units (= data shards) per round, S
  uint32_t inner_steps = 0;          // H: optimizer steps per unit
  uint32_t batch_size = 0;           // samples per inner step
  uint32_t checkpoint_interval = 0;  // k: a checkpoint every k inner steps
  uint64_t flops_per_sample = 0;     // training FLOPs per sample (forward + backward)
  uint64_t model_bytes = 0;          // float32 weights (and one delta)
  // A whole unit's memory need (node::UnitMemoryBytes, set by `task submit`); the scheduler places
  // units (and, with the round's state and deltas, aggregators) by protocol::RequiredMemoryBytes
  // of it. 0: none declared, the 5 x model_bytes fallback.
  uint64_t memory_bytes = 0;
  uint64_t num_examples = 0;         // dataset size
  uint64_t seed = 0;                 // task seed (data order, initialisation)
  Hash256 initial_state;             // blob id of the round-0 global state blob
  uint64_t verification_window_blocks = 0;  // 0: a round is final when its aggregate commits
  // Tolerance mode (protocol::ToleranceParams), both 0: exact mode (state hashes must match).
  uint32_t tolerance_rel_l2_ppm = 0;      // <= 1000000
  uint32_t tolerance_cosine_gap_ppb = 0;  // <= 1000000000
  // Merkle root over the training examples (engine::DataTree; num_examples leaves), set by the
  // submitter; every node checks it against the data it loads and refuses a task whose root is
  // wrong. With it the ledger itself rules a disputed tile (RefereeTileTx) or step
  // (RefereeStepTx). A token task (data_page_tokens > 0): the root over its train stream's pages
  // (engine::TokenPageTree; num_examples tokens), which proves the tokens a tile reads. Zero only
  // in tolerance mode or on a chain that does not verify: a verifying chain refuses an
  // exact-mode task without one (ValidateTaskTerms), whose disputes the genesis referee would
  // rule (docs/verification.md, "Who rules what").
  Hash256 data_root;
  // What the submitter bought (protocol::Assurance, protocol/verification.h PlanCheck): 0
  // economic, 1 full (every segment of every unit replayed), 2 target (target_escape_ppm: the
  // most likely one corrupted segment escapes its check, per 10^6). Not 0 on a verifying chain
  // only.
  uint8_t assurance = 0;
  uint32_t target_escape_ppm = 0;
  // Pipeline-parallel training (issue 15; docs/protocol.md, "Pipeline stage units"). stages = S >
  // 1 trains every replica of a round as a chain of S stage units on S nodes: units_per_round is
  // then replicas x S (PipelineReplicas), and unit index = round x units_per_round + replica x S +
  // stage (StageSlotOf, StageUnitIndex). stage_memory_bytes[s] and stage_flops[s] are what stage s
  // needs (engine::CutCosts of the task's cut: total bytes, training FLOPs of one step);
  // stage_boundary_bytes[s] (s = 0..S-2) is what one step moves between stages s and s+1, the
  // activations forward and their gradients back (engine::CutBoundaryBytes of the cut), in
  // (0, protocol::kMaxStageBoundaryBytes]. The ledger places the stages on nodes with
  // protocol::PlaceStages, pairing each boundary's nodes by the cost of moving those bytes.
  // stages = 1 with the three lists empty: no pipeline (every unit trains the whole model).
  uint32_t stages = 1;
  std::vector<uint64_t> stage_memory_bytes;
  std::vector<uint64_t> stage_flops;
  std::vector<uint64_t> stage_boundary_bytes;
  // 0: data_root is over examples (or zero). engine::kTokenPageTokens: a token task whose
  // data_root is over pages of that many tokens.
  uint32_t data_page_tokens = 0;
  // A pipeline task (stages > 1): what its round's aggregator holds of the whole model, which it
  // evaluates each new state with and trains nothing of: its weights and one evaluation
  // forward's activations (engine::EstimateEvaluationMemory, node::StageTermsOf; set by `task
  // submit`, compared by every node). protocol::AggregatorMemoryBytes counts it in place of
  // memory_bytes (a whole unit's training need: gradients and optimizer moments besides).
  // 0: none declared (a task without stages must declare none), the aggregator is placed by
  // memory_bytes.
  uint64_t eval_memory_bytes = 0;

  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("rounds", s.rounds);
    v("units_per_round", s.units_per_round);
    v("inner_steps", s.inner_steps);
    v("batch_size", s.batch_size);
    v("checkpoint_interval", s.checkpoint_interval);
    v("flops_per_sample", s.flops_per_sample);
    v("model_bytes", s.model_bytes);
    v("memory_bytes", s.memory_bytes);
    v("num_examples", s.num_examples);
    v("seed", s.seed);
    v("initial_state", s.initial_state);
    v("verification_window_blocks", s.verification_window_blocks);
    v("tolerance_rel_l2_ppm", s.tolerance_rel_l2_ppm);
    v("tolerance_cosine_gap_ppb", s.tolerance_cosine_gap_ppb);
    v("data_root", s.data_root);
    v("assurance", s.assurance);
    v("target_escape_ppm", s.target_escape_ppm);
    v("stages", s.stages);
    v("stage_memory_bytes", s.stage_memory_bytes);
    v("stage_flops", s.stage_flops);
    v("stage_boundary_bytes", s.stage_boundary_bytes);
    v("data_page_tokens", s.data_page_tokens);
    // A pipeline task's only (stages, visited above, decides it): a task without stages encodes
    // as before the field: its bytes, its id and every state hash holding it are unchanged.
    if (s.stages > 1) v("eval_memory_bytes", s.eval_memory_bytes);
  }
  bool operator==(const TaskParams&) const = default;
};
inline constexpr uint64_t kMaxTaskUnits = 100000;  // rounds x units_per_round

// ---- Pipeline tasks (TaskParams::stages > 1).
inline bool IsPipelineTask(const TaskParams& p) { return p.stages > 1; }
// The replicas of each round: units_per_round / stages (units_per_round for a task without
// stages; protocol::RoundReplicas of the task's view). REQUIRES: the params passed
// ValidateTaskTerms.
uint32_t PipelineReplicas(const TaskParams& p);
// The protocol's view of a task (the scheduler's and pricing's input): its params, id and price
// cap. Every figure derived from a task's params through protocol/ (a unit's memory, an
// aggregator's, a unit's cost) reads this view, on the ledger and in a report alike.
protocol::TaskSpecView TaskSpecViewOf(const Hash256& task_id, const TaskParams& params,
                                      Amount price_cap);
// Which (round, replica, stage) a unit index is, and back. For a task without stages, the replica
// is the unit's shard and the stage 0. REQUIRES: the params passed ValidateTaskTerms.
struct StageSlot {
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  bool operator==(const StageSlot&) const = default;
};
StageSlot StageSlotOf(const TaskParams& p, uint32_t index);
uint32_t StageUnitIndex(const TaskParams& p, const StageSlot& slot);
// What a unit of stage `stage` is paid out of one whole unit's cost `unit_cost` (the model's
// training FLOPs at a price): the stage's share of a step's training FLOPs, stage_flops[stage] /
// sum(stage_flops), rounded up, so a replica's S stages together cost one unit (plus at most S
// tokens of rounding), as the same training unpipelined would. `unit_cost` for a task without
// stages. REQUIRES: the params passed ValidateTaskTerms.
Amount StageUnitCost(const TaskParams& p, Amount unit_cost, uint32_t stage);

// What the aggregator of a finished round reported (CommitAggregate), and what it was paid.
struct RoundResult {
  Hash256 state;                   // blob id of the round's new global state
  uint32_t test_accuracy_ppm = 0;  // accuracy on the test set, parts per million
  uint64_t test_loss_micros = 0;   // mean test loss x 1e6
  PublicKey aggregator;            // node that committed it
  uint64_t committed_height = 0;
  Amount aggregator_price = 0;  // its price (per GFLOP) when it was assigned
  Amount aggregator_paid = 0;   // set when the round is settled
  bool operator==(const RoundResult&) const = default;
};

// A unit proven fraudulent after its round was final (ProveFraudTx; docs/verification.md, "Fraud
// proofs after the fact"): its segment `segment` does not replay to its committed end.
struct ProvenFraud {
  uint32_t round = 0;      // the round the unit's work went into (the task's rounds from it on
                           // were trained from a state it poisoned)
  uint32_t index = 0;      // the unit
  uint32_t segment = 0;    // the segment the ledger replayed
  PublicKey solver;        // the node that committed it
  PublicKey prover;        // the account that sent the proof
  uint64_t height = 0;     // the block that accepted the proof
  Amount slashed = 0;      // taken from the solver's stake and unbonding
  Amount clawed_back = 0;  // of what the unit was paid, back to the submitter
  // From the jackpot to the earliest committer to the proof's witness (TakeProofCommitter:
  // not necessarily `prover`, and not recorded here; the ledger's log names it) or, for a late
  // game, to its challenger; 0 when nobody committed (it stayed in the jackpot).
  Amount bounty = 0;
  // Whether the proof took the task back (it was open, or finished within its audit window:
  // docs/verification.md, "Fraud proofs after the fact"), and to which round: the first that
  // held a paid unit of the solver.
  bool rewound = false;
  uint32_t rewound_to = 0;
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("round", s.round);
    v("index", s.index);
    v("segment", s.segment);
    v("solver", s.solver);
    v("prover", s.prover);
    v("height", s.height);
    v("slashed", s.slashed);
    v("clawed_back", s.clawed_back);
    v("bounty", s.bounty);
    v("rewound", s.rewound);
    v("rewound_to", s.rewound_to);
  }
  bool operator==(const ProvenFraud&) const = default;
};

// A dispute the ledger ruled (docs/verification.md, "The referee"): one per executed RefereeStep,
// RefereeTile, RefereeStageStep or RuleDispute, recorded as it executes. Kept on the task because
// what a ruling decided is gone from the unit soon after: a ruling for the challenger re-runs the
// round in the same block, and the unit's check goes with it. Every ruling resolves its game, so
// the outcome is the game's.
struct DisputeRuling {
  uint16_t tx = 0;      // the ruling transaction's TxType: which referee ruled (RuleDispute
                        // is the genesis key's word; the others the ledger's own execution)
  Hash256 tx_id;        // the ruling transaction
  PublicKey sender;     // who sent it: a party, the referee service, anyone
  uint64_t height = 0;  // the block that executed it
  uint32_t index = 0;   // the disputed unit
  uint32_t round = 0;   // the unit's round
  uint64_t step = 0;    // the disputed step (1-based; the last of a tolerance segment)
  PublicKey defender;   // the unit's solver, or the verifier a whistleblower challenged
  PublicKey challenger;
  uint64_t witness_bytes = 0;  // 0 for RuleDispute, which carries none
  bool defender_honest = false;
  bool challenger_honest = false;
  std::string reason;  // the game's outcome: what the referee ruled, and whose output was wrong
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("tx", s.tx);
    v("tx_id", s.tx_id);
    v("sender", s.sender);
    v("height", s.height);
    v("index", s.index);
    v("round", s.round);
    v("step", s.step);
    v("defender", s.defender);
    v("challenger", s.challenger);
    v("witness_bytes", s.witness_bytes);
    v("defender_honest", s.defender_honest);
    v("challenger_honest", s.challenger_honest);
    v("reason", s.reason);
  }
  bool operator==(const DisputeRuling&) const = default;
};

// What verification did on a task (ledger/src/verification.cc): settled checks by result, and
// the tokens it moved. Kept on the task because a check that ends in a re-run is dropped with its
// round.
struct VerificationTally {
  uint64_t clean = 0;
  uint64_t unchecked = 0;
  uint64_t fraud = 0;
  uint64_t forced_error = 0;
  uint64_t abandoned = 0;
  uint64_t disputes = 0;         // dispute games played to the end (by ruling or deadline)
  Amount slashed = 0;            // stake taken from this task's cheaters and lazy verifiers
  Amount verifiers_paid = 0;     // from the escrow, before the treasury's cut
  Amount jackpot_paid = 0;       // to forced-error catchers and challengers that won
  Amount redo_escrow = 0;        // slashed stake added to the escrow for re-runs
  // Taint: final rounds a proven cheater's work was in, run again; and what it had been paid for
  // them, taken back from its stake into the escrow (docs/verification.md, "Taint").
  uint64_t rounds_rewound = 0;
  Amount clawed_back = 0;
  // Rounds in flight (genesis rounds_in_flight): rounds trained on top of a settling round that
  // then ran again (fraud, a forced error, an abandoned unit in it), dropped unpaid; the price
  // of not waiting for verification.
  uint64_t rounds_dropped = 0;
  // Units proven fraudulent after their round was final (ProveFraudTx), in proof order; at most
  // one per unit. Their slashes and claw-backs are also in `slashed` and `clawed_back`.
  std::vector<ProvenFraud> proven_frauds;
  // Times a fraud proof within the audit window reopened the finished task (its status open
  // again, its final state forgotten until it finishes again).
  uint64_t reopened = 0;
  // Every dispute the ledger ruled on the task, in execution order (one unit may have several:
  // its round re-ran, or a whistleblower disputed it again).
  std::vector<DisputeRuling> rulings;
  // The units with a late dispute open (WorkUnit::late), in opening order: what the end of each
  // block drives (their deadlines), whatever the task's status.
  std::vector<uint32_t> late_games;
  bool operator==(const VerificationTally&) const = default;
};

// Task id = TaskIdFor(submitter, nonce of the SubmitTask transaction): clients know it before
// the block.
struct TaskRecord {
  Hash256 id;
  PublicKey submitter;
  Hash256 spec_hash;  // content address of the task spec blob
  Amount budget = 0;  // escrowed at submission
  Amount escrow = 0;  // what is left of the budget
  Amount spent = 0;   // paid out (including the treasury cut); budget == escrow + spent + refunded
  Amount treasury_cut = 0;  // of spent, what the treasury kept (treasury_cut_bps of each payment)
  Amount refunded = 0;
  Amount price_cap = 0;  // most the submitter pays, tokens per 10^9 training FLOPs
  TaskStatus status = TaskStatus::kOpen;
  uint64_t created_height = 0;
  // The block that closed the task (finished or cancelled); 0 while open, and again once a fraud
  // proof reopens it. A finished task's audit window runs from here (AuditWindowEnd).
  uint64_t closed_height = 0;
  uint32_t unit_count = 0;  // work units (ids 0..unit_count-1); rounds x units_per_round
  std::string memo;
  // ---- Network training (docs/ledger.md, "Network training").
  TaskParams params;
  // protocol::RoundStateMachine::Encode(): the task's rounds, assignments and aggregator.
  Bytes runtime;
  Hash256 final_state;  // blob id of the final global state; zero until finished
  std::vector<RoundResult> round_results;  // [r] for every round whose aggregate committed
  uint32_t rounds_settled = 0;  // finalized rounds already paid (0..rounds)
  Amount aggregator_price = 0;  // the current aggregator's price (per GFLOP) at assignment
  VerificationTally verification;  // every settled check of the task, re-run rounds included
  bool operator==(const TaskRecord&) const = default;
};
Hash256 TaskIdFor(const PublicKey& submitter, uint64_t nonce);

// The last height at which a fraud proof (ProveFraudTx) reopens finished task `t` and rewinds
// it (docs/verification.md, "Fraud proofs after the fact"): closed_height + audit_window_blocks
// (the genesis parameter). 0 for a task that is open (a proof rewinds it anyway) or cancelled
// (never reopened). After it, a proof still slashes and claws back, and the model is final.
uint64_t AuditWindowEnd(const TaskRecord& t, uint64_t audit_window_blocks);

// The most a task can cost at `price_cap` (tokens per GFLOP): every unit (a stage unit its
// StageUnitCost), each of its `verifiers_per_unit` verifications (a verifier is paid at most that
// unit's cost, a stage unit's check at most its StageUnitCost) and every round's aggregation paid
// one unit's cost at the cap, i.e. for a task
// without stages rounds x (units_per_round x (1 + verifiers_per_unit) + 1) x unit cost
// (saturating). SubmitTask refuses a smaller budget (verifiers: the genesis verifiers_per_unit, 0
// without verification); clients check the same before publishing. `unit_cost` (optional)
// receives one unit's cost.
Amount MaxTaskCost(const TaskParams& params, Amount price_cap, Amount* unit_cost = nullptr,
                   uint32_t verifiers_per_unit = 0);

// How a check of SubmitTask names a field to the one who reads the error: the ledger says
// "params.checkpoint_interval" (and "budget", "price_cap"); a submitter's client says what the
// task file says, "network.checkpoint_interval". `field` is a TaskParams field name, or "budget"
// or "price_cap".
using TaskFieldNamer = std::function<std::string(std::string_view field)>;

// Every check SubmitTask makes of a task's terms (its params, budget and price cap) on a chain
// with verification on or off and `verifiers_per_unit` verifiers: all but the blob ids
// (spec_hash, params.initial_state), the sender's funds and the task id's freshness. SubmitTask
// runs it; a client runs it before it publishes anything (`task submit --dry-run`, `task quote`),
// with `name` mapping fields to the task file's keys. Empty `name`: the ledger's names.
Status ValidateTaskTerms(const TaskParams& params, Amount budget, Amount price_cap,
                         bool verification, uint32_t verifiers_per_unit,
                         const TaskFieldNamer& name = {});

enum class WorkUnitStatus : uint8_t {
  kPending = 0,    // created, not assigned
  kAssigned = 1,   // assigned to a solver, deadline running
  kCommitted = 2,  // the solver committed a result
  kVerified = 3,   // settled and paid
  kFailed = 4,     // failed verification or deadline
  kCancelled = 5,  // the task was cancelled
};
std::string_view WorkUnitStatusName(WorkUnitStatus s);

// Work unit index = round * units_per_round + shard.
// A stage's evidence served in pieces while a claim that it served nothing for a step waits at
// the referee, the stage being over the witness bound (stage_serve.h, ServeStageEvidenceTx): the
// ledger keeps which pieces it has seen, not their bytes (they are in the blocks). Open from the
// block the dispute reaches the referee until it is ruled; window_end 0 otherwise.
struct StageServeRecord {
  uint64_t step = 0;        // the referee task's (1-based) step
  uint64_t window_end = 0;  // the last height a piece is taken (the referee's deadline, extended)
  uint32_t pieces = 0;      // the evidence's pieces (StageServePieceCount); 0 before the first
  Bytes served;             // bit p (byte p / 8, bit p % 8) set once piece p is taken
  // The most pieces a record keeps: its bitmap stays within a megabyte, which DecodeWorkUnit
  // takes. An evidence of more (over 32 TiB of tiles) could not be posted in any serving window,
  // so CheckStageServePiece refuses its pieces rather than the ledger keeping such a bitmap.
  static constexpr uint32_t kMaxPieces = 8u << 20;
  // The bitmap's bytes for `pieces`, counted in 64 bits so that no count near UINT32_MAX wraps.
  static size_t BitmapBytes(uint32_t pieces) { return (size_t{pieces} + 7) / 8; }
  // Whether piece p is taken. REQUIRES: p < pieces.
  bool Has(uint32_t p) const { return ((served[p / 8] >> (p % 8)) & 1) != 0; }
  bool open() const { return window_end != 0; }
  bool operator==(const StageServeRecord&) const = default;
};

// The bond a claimant posted with its claim that a stage over the witness bound served nothing for
// a step (RevealVerdict or ChallengeUnit; docs/verification.md, "A stage claimed to have served
// nothing, over the witness bound"): the declared evidence's pieces x ChainParams::
// serve_bond_per_piece, taken from the claim's sender and held on the unit until its claim is
// answered. Paid to the stage's owner when the stage serves every piece (the claim answered
// "served"); back to `payer` when the stage is ruled against, and for a claim that ends any other
// way (its check settled or dropped, the task closed) without the stage serving it.
struct ServeBond {
  PublicKey claimant;  // the node that claimed (the dispute's challenger)
  PublicKey payer;     // the claim's sender, who paid the bond
  Amount amount = 0;   // > 0
  bool operator==(const ServeBond&) const = default;
};

// A late dispute on a paid unit of a final round (LateChallengeTx; docs/verification.md, "Over
// 8 MiB: a late dispute"): the game between the unit's solver and the challenger, kept on the unit
// while it is open, with the bond the challenger put up (held here, counted with the escrows in
// Totals). `game` is protocol::DisputeGame::Encode(); empty when no late game is open.
struct LateGame {
  PublicKey challenger;  // the LateChallenge's sender
  uint32_t segment = 0;
  Amount bond = 0;
  Bytes game;
  bool open() const { return !game.empty(); }
  bool operator==(const LateGame&) const = default;
};

struct WorkUnit {
  Hash256 task_id;
  uint32_t index = 0;
  WorkUnitStatus status = WorkUnitStatus::kPending;
  PublicKey assignee;  // node id; zero when unassigned
  uint64_t deadline_height = 0;
  Hash256 result_hash;  // blob id of the delta blob; zero until committed
  Amount paid = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  Hash256 commitment;        // Merkle root of the unit's checkpoint state hashes
  uint64_t loss_micros = 0;  // solver-reported mean training loss x 1e6 (display only)
  Amount price = 0;          // the assignee's price (per GFLOP) when the unit was assigned
  // ---- Verification (docs/verification.md).
  Hash256 assignment_beacon;  // block seed when assigned: the forced-error draw uses it
  uint64_t secret_index = 0;  // the solver's secret chain element for this commit
  std::vector<Hash256> leaves;  // the committed state hashes (MerkleRoot(leaves) == commitment)
  Bytes check;                // protocol::UnitCheck::Encode() while checked; empty otherwise
  // A stage unit's CommitStageTx::commits: the blob id of its step commits (zero: none named).
  // Encoded as an optional tail, so a unit without it encodes as before.
  Hash256 stage_commits;
  // Open while a stage over the witness bound serves its evidence (StageServeRecord). Encoded as a
  // second optional tail (after stage_commits, written zero when unset), only while open.
  StageServeRecord serve;
  // The bonds of the claims that this stage served nothing (ServeBond), one a claimant, in the
  // order posted. Encoded as a third optional tail (after stage_commits and serve, written zero
  // and closed when unset), only while one is held: every other unit encodes as before. Counted
  // in Totals::escrow.
  std::vector<ServeBond> serve_bonds;
  static constexpr uint32_t kMaxServeBonds = 1024;
  // Open while a late dispute runs on the unit (LateGame). Encoded as a fourth optional tail (after
  // stage_commits, serve and serve_bonds, each written zero when unset), only while open.
  LateGame late;
  bool operator==(const WorkUnit&) const = default;
};

// The least bond a late challenge (LateChallengeTx) on committed unit `u` puts up: the unit's
// cost at its solver's price (AssignedUnitCost), what the solver's re-run of the unit to answer
// the game is worth. Reads t.id, t.params, t.price_cap and u.index, u.price.
Amount LateChallengeMinBond(const TaskRecord& t, const WorkUnit& u);

// Where every token is. The invariant, checked after every block in tests and debug builds:
//   balances + staked + unbonding + escrow + treasury + jackpot == minted
struct Totals {
  Amount balances = 0;
  Amount staked = 0;     // bonded on nodes
  Amount unbonding = 0;  // leaving nodes, not yet withdrawn
  // Task budgets, claimants' serve bonds (WorkUnit::serve_bonds), open late games' bonds and
  // kept proof commitments' deposits (ProofCommit::deposit).
  Amount escrow = 0;
  Amount treasury = 0;
  Amount jackpot = 0;
  Amount minted = 0;
  // OK iff the invariant holds (sums computed without overflow).
  Status Check() const;
  bool operator==(const Totals&) const = default;
};

// Canonical encodings (state hash and SQLite rows) and JSON views (RPC).
void EncodeAccount(Encoder& e, const Account& a);
Status DecodeAccount(Decoder& d, Account* a);
void EncodeNode(Encoder& e, const NodeRecord& n);
Status DecodeNode(Decoder& d, NodeRecord* n);
void EncodeTask(Encoder& e, const TaskRecord& t);
// Reads to the end of `d`: a task record ends with an optional tail (EncodeTask).
Status DecodeTask(Decoder& d, TaskRecord* t);
void EncodeWorkUnit(Encoder& e, const WorkUnit& u);
Status DecodeWorkUnit(Decoder& d, WorkUnit* u);
void EncodeProofCommit(Encoder& e, const ProofCommit& c);
Status DecodeProofCommit(Decoder& d, ProofCommit* c);

nlohmann::json AccountToJson(const Account& a);
nlohmann::json NodeToJson(const NodeRecord& n);
// With `audit_window_blocks` (the genesis parameter, which the record does not hold) also
// "audit_window_end" (AuditWindowEnd).
nlohmann::json TaskToJson(const TaskRecord& t,
                          std::optional<uint64_t> audit_window_blocks = std::nullopt);
nlohmann::json WorkUnitToJson(const WorkUnit& u);
nlohmann::json TotalsToJson(const Totals& t);
// A unit's verification (WorkUnit::check): stage, result, verifiers, segments, deadlines, the
// dispute's current query or referee task (ledger/src/verification.cc).
nlohmann::json UnitCheckToJson(const protocol::UnitCheck& c);
// A dispute game's view (a check's "dispute", a late game's "game"): stage, parties, the current
// query, the referee task or the outcome.
nlohmann::json DisputeGameToJson(const protocol::DisputeGame& game);

}  // namespace meshlearn::ledger
