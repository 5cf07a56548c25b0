// Internal: how transactions change the state.
//
// ExecuteBlockTx runs one transaction of a block: the admission check (signature, chain id,
// exact nonce, known sender, size), then the nonce bump, then the fee and the type's executor.
// If the executor (or the fee) fails, everything after the nonce bump is rolled back and the
// receipt carries the reason.
//
// Executors are generated from tx_types.h: for X(Name, tag, module) there must be
//   Status ExecuteName(ExecContext& ctx, const NameTx& tx);
// in ledger/src/<module>.cc. An executor validates its input and returns a non-OK Status
// (with a message naming the field and the fix) to fail the transaction; it may leave partial
// changes behind when it fails, the rollback removes them. Use the primitives below for every
// movement of tokens so that the books stay balanced and arithmetic stays checked.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "ledger_state.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::ledger {

struct ExecContext {
  LedgerState& state;
  const Genesis& genesis;
  uint64_t height;       // of the block being executed
  int64_t time_ms;       // of the block being executed (sequencer's clock, in the header)
  Hash256 block_seed;    // the previous block's hash: the only randomness execution may use
  const Transaction& tx;
  const Hash256& tx_id;

  const ChainParams& params() const { return genesis.params; }
};

#define ML_DECLARE_EXECUTOR_(Name, tag, module) \
  Status Execute##Name(ExecContext& ctx, const Name##Tx& tx);
MESHLEARN_LEDGER_TX_TYPES(ML_DECLARE_EXECUTOR_)
#undef ML_DECLARE_EXECUTOR_

// A transaction with its encoding and id, computed once per block pass. One buffer holds the
// signing domain tag followed by the encoding, so the signed message and the wire encoding are
// both views of it.
struct PreparedTx {
  explicit PreparedTx(const Transaction& t);
  const Transaction& tx;
  Bytes buffer;    // "meshlearn.tx.v1" + EncodeTx(tx)
  ByteSpan wire;   // EncodeTx(tx)
  ByteSpan signed_message;  // SigningBytes(tx)
  Hash256 id;      // TxId(tx)
};

// EncodeBlock(b), reusing the transactions' encodings (tx_wires[i] == EncodeTx(b.txs[i])).
Bytes EncodeBlockWithTxWires(const Block& b, const std::vector<ByteSpan>& tx_wires);

// Whether `tx` may enter a block at this point: size (and canonical field limits), chain id,
// signature, a known sender (or a faucet transaction with nonce 0 on a faucet chain) and
// nonce == the sender's next nonce (`exact_nonce`) or >= it (mempool). Changes nothing.
Status CheckAdmission(const LedgerState& state, const Genesis& genesis, const PreparedTx& p,
                      bool exact_nonce);

// Runs one transaction of a block. Returns the admission Status: when not OK the transaction
// is not part of the block and the state is untouched. When OK, *receipt says whether it
// succeeded.
Status ExecuteBlockTx(LedgerState& state, const Genesis& genesis, uint64_t height,
                      int64_t time_ms, const Hash256& block_seed, const PreparedTx& p,
                      uint32_t index, Receipt* receipt);

// Keys a transaction concerns (sender and every PublicKey field of its payload), sorted and
// distinct: the account history index.
std::vector<PublicKey> TxParties(const Transaction& tx);

// ---- Checked arithmetic. Overflow and underflow are clean failures, never wraps.
Status CheckedAdd(Amount a, Amount b, Amount* out, std::string_view what);
Status CheckedSub(Amount a, Amount b, Amount* out, std::string_view what);
// floor(amount * bps / 10000) without overflow. REQUIRES: bps <= 10000.
Amount BasisPoints(Amount amount, uint32_t bps);

// ---- Token primitives (accounts.cc). Each keeps the invariant.
// Adds to an account's balance, creating the account if new.
Status Credit(LedgerState& s, const PublicKey& to, Amount amount);
// Takes from a balance; FailedPrecondition "insufficient funds" if it is short.
Status Debit(LedgerState& s, const PublicKey& from, Amount amount, std::string_view what);
// Creates new tokens (faucet): minted and the balance grow together.
Status Mint(LedgerState& s, const PublicKey& to, Amount amount);
Status CreditTreasury(LedgerState& s, Amount amount);

// ---- Staking primitives (staking.cc).
// What node `n` still has bonded, so what a slash can reach: its stake plus its owner's unbonding
// entries for it that are not withdrawn (saturating).
Amount BondedStake(const LedgerState& s, const NodeRecord& n);
// Takes up to `amount` of node `n`'s bonded stake out of the node and its owner's unbonding
// entries (the stake first, then the entries furthest from release); returns what it took. The
// caller puts the tokens somewhere (the invariant). May invalidate `n`.
Amount TakeBondedStake(LedgerState& s, NodeRecord* n, Amount amount);
// Moves up to `amount` of a node's bonded stake (TakeBondedStake) out: slash_jackpot_bps of it
// to the jackpot, the rest to the treasury. Jails the node, counts the slash, resets its clean
// streak. *slashed gets what was taken (less than asked when the stake is short).
Status SlashNode(LedgerState& s, const ChainParams& p, const PublicKey& node_id, Amount amount,
                 Amount* slashed);
// Takes back from a proven cheater's bonded stake (TakeBondedStake) what it was paid for
// `amount` of tainted work in task `task_id`, adding what it took to *clawed and to the node's
// earnings.clawed_back: into the task's escrow (and budget) while the task is open, where it pays
// for the redo; else refunded to the task's submitter (budget and refunded grow).
Status ClawBack(LedgerState& s, const Hash256& task_id, const PublicKey& node_id, Amount amount,
                Amount* clawed);
// Pays from the jackpot pool to an account (forced-error rewards).
Status PayFromJackpot(LedgerState& s, const PublicKey& to, Amount amount);
// Starts unbonding `amount` of a node's stake to its owner, released at height + delay.
Status BeginUnbonding(LedgerState& s, const ChainParams& p, uint64_t height, NodeRecord* node,
                      Amount amount);

// ---- Task primitives (tasks.cc).
// Pays `amount` out of a task's escrow: treasury_cut_bps to the treasury, the rest to `to`.
Status PayFromEscrow(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                     const PublicKey& to, Amount amount);
// Ends an open task in the block at `height` (its closed_height): refunds the remaining escrow
// to the submitter; status `final_status`.
Status CloseTask(LedgerState& s, const Hash256& task_id, TaskStatus final_status, uint64_t height);
// Every serve bond still held on unit `index` (WorkUnit::serve_bonds) back to its payer: the
// claims it bonded ended without the stage serving them (verification.cc).
Status RefundServeBonds(LedgerState& s, const Hash256& task_id, uint32_t index);
// Work units: network.cc schedules and commits (verification is a later issue); these keep
// the records.
Status AddWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t* index);
Status AssignWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index,
                      const PublicKey& node_id, uint64_t deadline_height);
Status CommitWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index,
                      const Hash256& result_hash);
// Verified clean: pays `amount` (<= one unit's cost at the task's price cap) from escrow to
// the assignee's owner and credits the node's reputation.
Status SettleWorkUnit(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                      uint32_t index, Amount amount);
// Failed verification or deadline: counts a failure, resets the streak.
Status FailWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index);

// ---- Network training (network.cc): the ledger drives protocol::RoundStateMachine and the
// scheduler. See docs/ledger.md, "Network training".
protocol::SchedulerParams SchedulerParamsOf(const Genesis& genesis);
// Tokens one unit of `t` costs at `price_per_gflop` (protocol::UnitCostTokens).
Amount UnitCost(const TaskRecord& t, Amount price_per_gflop);
// What committed unit `u` of `t` is worth at its assignee's price (u.price): UnitCost, a stage
// unit its stage's share of it (StageUnitCost). Its solver's pay, its verifiers' pay and the
// slash of a cheater all come from it, so a stage's check is priced by the stage, not by the
// whole unit.
Amount AssignedUnitCost(const TaskRecord& t, const WorkUnit& u);
// Settles committed unit `index` at its assignee's price when assigned, never above the escrow
// left (SettleWorkUnit).
Status SettleAtAssignedPrice(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                             uint32_t index);
// A unit back to pending with no assignee, result or price (expiry, a re-run round). Its serve
// bonds stay until DriveChecks gives them back (RefundServeBonds): they are tokens, not a record.
void ResetWorkUnit(WorkUnit* u);
// The end-of-block step: after a block's transactions, before its state hash, on every path
// (sequencer, follower, replay). For every open task in id order: expire overdue assignments
// (failure counted, never paid), assign pending units and the aggregator, pay finalized rounds,
// finish a final task. A task whose step fails (a bug, not an input) is left as it was before
// the step, so the function cannot fail and every replica does the same.
void EndBlock(LedgerState& s, const Genesis& genesis, uint64_t height, const Hash256& block_seed);

// Shared by network.cc and verification.cc.
Result<protocol::RoundStateMachine> LoadMachine(const TaskRecord& t);
// Stores the machine back into the task if it changed (an unchanged task stays clean).
void SaveMachine(LedgerState& s, const Hash256& task_id, const protocol::RoundStateMachine& m);
// The open task `task_id`, for a transaction about it (`what` names the transaction).
Result<const TaskRecord*> OpenTaskFor(const LedgerState& s, const Hash256& task_id,
                                      std::string_view what);
// A node's transaction is signed by the node's own key or by its owner.
Status CheckNodeSender(const LedgerState& s, const PublicKey& node_id, const PublicKey& sender,
                       std::string_view what);
// Whether `who` (an account, or a node's key) is the cheater node `cheater`, its owner, or another
// node of that owner: a prover so linked to a cheater is paid no reward for proving it (the slash
// stays in the jackpot and the treasury), or cheating and then reporting oneself first would cost
// little (docs/verification.md, "Self-reports earn nothing"). A key the ledger cannot link to the
// owner is not caught by this; the bounty caps bound what it can get back.
bool LinkedToCheater(const LedgerState& s, const PublicKey& cheater, const PublicKey& who);
// Reputation: a failure, and the clean streak starts over.
void CountFailure(LedgerState& s, const PublicKey& node_id);
uint32_t UnitIndex(const TaskRecord& t, const protocol::UnitId& u);

// ---- Verification (verification.cc; docs/verification.md).
// CommitUnit (and CommitStage: `what` names the transaction in errors) on a chain with
// verification: binds the solver's next secret to the unit, opens the unit's check
// (WorkUnit::check) and holds the round's finality until it settles. A stage unit's check runs
// over its WorkUnit::leaves (protocol::StageCheckLeaves): one segment per step.
Status OpenUnitCheck(ExecContext& ctx, const Hash256& task_id, uint32_t index,
                     const PublicKey& solver, uint64_t secret_index,
                     protocol::RoundStateMachine& m, std::string_view what = "commit unit");
// Each solver's lowest secret index among its units whose checks still await verdicts
// (UnitCheck::AwaitsVerdicts), over every open task at the start of the end-of-block step: a
// later unit's check must not open its reveal window (where the solver reveals a secret that
// reveals every earlier one) before theirs. The checks below it open theirs in this block.
using AwaitingSecrets = std::map<PublicKey, uint64_t>;
void AddAwaitingSecrets(const LedgerState& s, const Hash256& task_id,
                      const protocol::RoundStateMachine& m, AwaitingSecrets& awaiting);
// The end-of-block step for the checks of one task's unfinal rounds, before the round machine's
// OnBlock: beacons, closed windows (early where nothing more can happen in them; `awaiting`),
// dispute deadlines and rulings; applies the effects (slash, pay, jackpot, reputation), rewinds
// the round on fraud or a forced error, and leaves exactly one finality hold per unsettled
// check.
Status DriveChecks(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& seed,
                   const Hash256& task_id, protocol::RoundStateMachine& m,
                   const AwaitingSecrets& awaiting);
// Late disputes (LateChallengeTx; docs/verification.md, "Over 8 MiB: a late dispute"); the least
// bond, LateChallengeMinBond, is in state.h (a challenger's node computes it too).
// The blocks of the chain's interval that `flops` take at `flops_per_second`: the whole
// milliseconds, plus one, over the interval, plus one (a turn that starts late in a block still
// gets the work's time). The one conversion of work into a turn's blocks.
uint64_t BlocksForFlops(const Genesis& g, uint64_t flops, uint64_t flops_per_second);
// The blocks of the chain's interval that `ms` milliseconds take: ms over the interval, plus one.
uint64_t BlocksForMs(const Genesis& g, uint64_t ms);
// Blocks each turn of a late game on a unit of `t` may take: the unit's work (UnitFlops) at a
// floor throughput of 1 GFLOP/s (BlocksForFlops), at least dispute_response_blocks.
uint64_t LateResponseBlocks(const Genesis& g, const TaskRecord& t);
// Blocks each dispute turn (and the merits window) of the check of unit `index` of a task with
// params `p` may take (UnitCheckConfig::dispute_response_blocks, set when the check opens): for a
// pipeline stage's unit, twice its stage's step (stage_flops) at a floor throughput of
// 100 MFLOP/s (BlocksForFlops), at most an hour (the declared stage_flops is not checked against
// the model), at least dispute_response_blocks, so an honest stage can trace its step under load
// within a turn; for any other unit, dispute_response_blocks.
uint64_t CheckResponseBlocks(const Genesis& g, const TaskParams& p, uint32_t index);
// The end-of-block step for the late games open on task `task_id` (any status): deadlines (a
// silent party loses, DisputeGame::OnBlock) and their settlement; a game whose unit was taken
// back meanwhile (a rewind, a ProveFraud) closes with the bond returned.
Status DriveLateGames(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& task_id);

// What keeps the matured unbonding entries of each node of `nodes` from being withdrawn at
// `height` (Withdraw; docs/ledger.md, "Unbonding"): a slash there takes the node's unbonding
// entries as well as its stake (TakeBondedStake), so Withdraw keeps an entry while a check that
// can still slash the node for a unit holds it (Holds). On an open task, in a round not yet final:
//   - a unit the node was assigned and has not committed yet (nor let expire): it holds the
//     entries unbonded since its assignment, which it was assigned against (a solver's stake must
//     cover a unit's slash when it is assigned), until it is committed and its check is over;
//   - a unit the node solved whose check is open -- not settled, or settled in a round not yet
//     final, which a whistleblower may still challenge (ChallengeUnit): as above, and also the
//     entries that matured after its commit;
//   - a unit whose check drew the node as a verifier (a rubber stamp or a false mismatch is
//     slashed by a dispute, a whistleblower's win or a ProveMerits until the round is final): the
//     entries that matured after the unit's commit (the draw is the block after it);
//   - a unit the node challenged as a whistleblower (ChallengeUnit: its stake is the bond, and
//     losing the dispute slashes it) while that dispute runs, its merits window included: the
//     entries that matured after the challenge; once the dispute settles it can no longer slash
//     the node, whatever the round;
// and on any task, a late game (LateChallenge) the node defends: every entry. (A late game's
// challenger is an account that posts its bond from its balance when it opens the game: no stake
// of its is at stake, nothing to hold.)
// Entries unbonded before a unit was assigned and matured before its commit are not held by it:
// the unit was assigned against the stake left bonded, so a solver that keeps working after an
// Unstake still gets the unstaked part once its earlier checks end. Returns, for each node held,
// the hold that keeps the most entries (the least holds_from; a late game first); a node without
// one is absent. One pass over the state, whatever the number of nodes (Withdraw makes one for
// all the nodes of its matured entries): the open late games and the units of every open task's
// rounds not yet final (the units DriveChecks visits at the end of every block), each read once.
struct StakeHold {
  Hash256 task_id;
  uint32_t index = 0;  // the unit under check
  uint32_t round = 0;
  std::string part;  // the node's part in the unit, for messages: "solved", "challenged", ...
  std::string why;   // "its check is disputed; the stake is released once ...", for messages
  uint64_t retry_height = 0;  // the earliest height at which the hold can have ended
  uint64_t holds_from = 0;    // the least release height of an entry it holds (0 for a late game)
  // Whether this hold keeps an entry that matured at `release_height`.
  bool Holds(uint64_t release_height) const { return release_height >= holds_from; }
};
std::map<PublicKey, StakeHold> OpenCheckHold(const LedgerState& s, const ChainParams& p,
                                             const std::set<PublicKey>& nodes, uint64_t height);
// Commit, then prove (proof_commits.cc; CommitProofTx). The bounty of a proof whose witness id
// is `witness_id`, executed in the block at `height`: the prover of the earliest commitment to
// it made at least one block before (ties: `sender`, the proof's own prover, if among them, else
// the first in key order); for a ProveResult or ProveMerits (`nodes_only`) only a registered
// node's counts, the bounty being a node's. nullopt when none: the proof still rules, the bounty
// stays in the jackpot. Drops every kept commitment to that witness (the proof is spent), each
// deposit back to the account that paid it.
std::optional<PublicKey> TakeProofCommitter(LedgerState& s, const Hash256& witness_id,
                                            const PublicKey& sender, uint64_t height,
                                            bool nodes_only);
// The end-of-block step: drops the commitments no proof after `height` can count any more, their
// deposits forfeited to the jackpot.
void ExpireProofCommits(LedgerState& s, uint64_t height);
// The commitment a new CommitProof evicts (its deposit forfeited): none while fewer than
// kMaxProofCommitments are kept, else the oldest kept (the first in key order among one block's).
// A scan of the kept table, as a proof's is.
std::optional<Hash256> ProofCommitToEvict(const LedgerState& s);

// Helpers for executors.
Result<NodeRecord*> OwnedNode(LedgerState& s, const PublicKey& node_id, const PublicKey& owner);

}  // namespace meshlearn::ledger
