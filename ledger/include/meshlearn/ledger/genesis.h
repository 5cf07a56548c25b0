// The genesis file: what a chain starts from. Every node of a network must load the same one;
// GenesisHash identifies it and Chain::Open refuses a database made from another.
//
// genesis.toml:
//   chain_id = "meshlearn-devnet"
//   genesis_time_ms = 0
//   block_interval_ms = 1000
//   sequencer = "<hex public key>"      # optional; if set, only this key may sign blocks
//   sequencers = ["<hex>", "<hex>"]     # optional: a replicated chain's candidates (every key
//                                       # that may sign blocks; `sequencer` must be one of them)
//   referee = "<hex public key>"        # optional; rules disputes (default: the sequencer)
//   faucet = true                       # devnets only
//   [params]                            # every key optional, defaults below
//   min_stake_solver = 1000
//   min_stake_verifier = 1000
//   min_stake_whistleblower = 1000
//   min_stake_aggregator = 1000
//   unbonding_delay_blocks = 100        # >= audit_window_blocks
//   audit_window_blocks = 100           # after a task's last round is final: time to audit it
//   treasury_cut_bps = 200              # of every payout from escrow, in basis points
//   slash_jackpot_bps = 5000            # share of slashed stake that goes to the jackpot pool
//   faucet_max_amount = 1000000000
//   liveness_blocks = 30                # scheduler: a node is live if its heartbeat is this recent
//   deadline_slack_permille = 2000      # scheduler: deadline = estimate x slack / 1000 ...
//   min_deadline_blocks = 5             # ... but at least this many blocks after assignment
//   verification = true                 # check committed units (docs/verification.md)
//   verify_trusted_after = 10           # every unit of a node with fewer clean units is checked
//   verify_floor_permille = 500         # ... then about 1/streak, never below this
//   verify_segments_per_check = 1       # k-step segments a verifier replays
//   forced_error_per_million = 15000    # Truebit forced errors
//   verifiers_per_unit = 1
//   verdict_commit_blocks = 5           # windows, in blocks
//   verdict_reveal_blocks = 5
//   dispute_response_blocks = 5         # each dispute turn
//   referee_blocks = 20                 # the referee's time to rule (0: no limit)
//   slash_multiple = 10                 # a slash takes this many times the unit's cost
//   rounds_in_flight = 2                # aggregated rounds that settle while later ones train
//   serve_bond_per_piece = 100          # a "served nothing" claim's bond, per evidence piece
//   proof_commit_deposit = 100          # held per kept CommitProof (docs/verification.md)
//   [[accounts]]
//   key = "<hex public key>"
//   balance = 1000000
//
//   ML_ASSIGN_OR_RETURN(Genesis g, LoadGenesis(Env::Default(), "genesis.toml"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::ledger {

inline constexpr uint32_t kMaxRoundsInFlight = 16;

struct ChainParams {
  Amount min_stake_solver = 1000;
  Amount min_stake_verifier = 1000;
  Amount min_stake_whistleblower = 1000;
  Amount min_stake_aggregator = 1000;
  // Stake on its way out stays slashable this long (Unstake/LeaveNode -> Withdraw).
  uint64_t unbonding_delay_blocks = 100;
  // How long after a task's last round is final it may still be audited and reopened (the
  // submitter's time to run `task audit --full`; docs/verification.md, "Fraud proofs after the
  // fact"). unbonding_delay_blocks must be at least this, so that a solver that unstakes the
  // moment its last unit is final is still bonded when a fraud proof (ProveFraudTx) arrives within
  // the window. A proof is accepted whenever the solver still has stake bonded, window or not.
  uint64_t audit_window_blocks = 100;
  uint32_t treasury_cut_bps = 200;   // <= 10000
  uint32_t slash_jackpot_bps = 5000;  // <= 10000
  Amount faucet_max_amount = 1'000'000'000;
  // Scheduler knobs (protocol::SchedulerParams): generous values let a loaded machine keep up.
  uint64_t liveness_blocks = 30;
  uint32_t deadline_slack_permille = 2000;  // >= 1000
  uint64_t min_deadline_blocks = 5;         // >= 1
  // ---- Verification (docs/verification.md). Off: committed units are accepted unchecked and
  // solvers need no secret chain (networks that predate verification, some tests).
  bool verification = true;
  // protocol::VerificationParams.
  uint64_t verify_trusted_after = protocol::VerificationParams{}.trusted_after;
  uint32_t verify_floor_permille = protocol::VerificationParams{}.floor_permille;  // 1..1000
  uint32_t verify_segments_per_check = protocol::VerificationParams{}.segments_per_check;
  uint32_t forced_error_per_million = protocol::VerificationParams{}.forced_error_per_million;
  uint32_t verifiers_per_unit = 1;      // 1..64
  uint64_t verdict_commit_blocks = 5;   // >= 1
  uint64_t verdict_reveal_blocks = 5;   // >= 1
  uint64_t dispute_response_blocks = 5; // >= 1: each dispute turn
  // Blocks the referee has to rule on a dispute; past them it ends undecided (nobody punished,
  // the unit re-run). 0: no limit.
  uint64_t referee_blocks = 20;
  // A slash takes slash_multiple x the unit's cost (protocol::SlashAmount), capped by the stake.
  uint32_t slash_multiple = 10;  // >= 1
  // Aggregated rounds of a task that may await finality (checks, verification window) while
  // the next round trains from their aggregate (protocol::RoundMachineConfig). 0: a round
  // starts only when the one before it is final. Fraud found in a settling round rewinds the
  // rounds after it, so more in flight risks more redone work for less waiting.
  uint32_t rounds_in_flight = 2;  // <= kMaxRoundsInFlight
  // ---- Added after the genesis encoding was fixed (VisitTail): each is in the genesis hash only
  // where it differs from its default, so a genesis that keeps the defaults hashes as before.
  // The bond a claim that a stage over the stage witness bound served nothing for a step posts, a
  // piece of the evidence the stage must then serve on chain (ServeStageEvidence): the declared
  // stage's pieces (ServeDeclaredPieces) x this, taken from the claim's sender (RevealVerdict,
  // ChallengeUnit; a sender that cannot pay is refused), paid to the stage's owner when it serves
  // every piece, back to the sender when it does not (ledger/state.h ServeBond). 0: no bond.
  Amount serve_bond_per_piece = kDefaultServeBondPerPiece;
  static constexpr Amount kDefaultServeBondPerPiece = 100;
  // The deposit a CommitProof holds from its sender while its commitment is kept: back to the
  // sender when a proof spends the commitment, to the jackpot when it expires unspent or is
  // evicted (docs/verification.md, "Commit, then prove": filling the kMaxProofCommitments table
  // with junk costs that table's deposits every kProofCommitmentBlocks). 0: no deposit.
  Amount proof_commit_deposit = kDefaultProofCommitDeposit;
  static constexpr Amount kDefaultProofCommitDeposit = 100;
  bool operator==(const ChainParams&) const = default;

  // Every field once, in canonical order: genesis hash, TOML, JSON.
  template <typename S, typename V>
  static void Visit(S& s, V&& v) {
    v("min_stake_solver", s.min_stake_solver);
    v("min_stake_verifier", s.min_stake_verifier);
    v("min_stake_whistleblower", s.min_stake_whistleblower);
    v("min_stake_aggregator", s.min_stake_aggregator);
    v("unbonding_delay_blocks", s.unbonding_delay_blocks);
    v("audit_window_blocks", s.audit_window_blocks);
    v("treasury_cut_bps", s.treasury_cut_bps);
    v("slash_jackpot_bps", s.slash_jackpot_bps);
    v("faucet_max_amount", s.faucet_max_amount);
    v("liveness_blocks", s.liveness_blocks);
    v("deadline_slack_permille", s.deadline_slack_permille);
    v("min_deadline_blocks", s.min_deadline_blocks);
    v("verification", s.verification);
    v("verify_trusted_after", s.verify_trusted_after);
    v("verify_floor_permille", s.verify_floor_permille);
    v("verify_segments_per_check", s.verify_segments_per_check);
    v("forced_error_per_million", s.forced_error_per_million);
    v("verifiers_per_unit", s.verifiers_per_unit);
    v("verdict_commit_blocks", s.verdict_commit_blocks);
    v("verdict_reveal_blocks", s.verdict_reveal_blocks);
    v("dispute_response_blocks", s.dispute_response_blocks);
    v("referee_blocks", s.referee_blocks);
    v("slash_multiple", s.slash_multiple);
    v("rounds_in_flight", s.rounds_in_flight);
  }
  // The fields added since (see above), hashed only where they differ from their defaults.
  template <typename S, typename V>
  static void VisitTail(S& s, V&& v) {
    v("serve_bond_per_piece", s.serve_bond_per_piece);
    v("proof_commit_deposit", s.proof_commit_deposit);
  }
  // Visit, then VisitTail: every field once, for TOML, JSON and the [params] reader.
  template <typename S, typename V>
  static void VisitAll(S& s, V&& v) {
    Visit(s, v);
    VisitTail(s, v);
  }

  // The stake a node with these roles must keep while active: the largest of the roles' minima.
  Amount MinStakeFor(uint32_t roles) const;
  protocol::VerificationParams Verification() const;
};

struct GenesisAccount {
  PublicKey key;
  Amount balance = 0;
  bool operator==(const GenesisAccount&) const = default;
};

struct Genesis {
  std::string chain_id = "meshlearn-devnet";
  int64_t genesis_time_ms = 0;
  int64_t block_interval_ms = 1000;
  PublicKey sequencer;  // all zero: any key may sequence (the follower passes its own)
  // The key whose RuleDispute transactions the ledger accepts: the referee that computes the
  // single step or operator a dispute narrowed to (docs/verification.md, "Referee"). All zero:
  // the sequencer key (and, when that is zero too, disputes that reach the referee stage are
  // decided by the response deadline only).
  PublicKey referee;
  // A replicated chain (`chain serve --cluster`, ledger/cluster.h): every key that may sign
  // blocks, one per sequencer candidate. Empty: `sequencer` alone. When set, `sequencer` is one
  // of them (it stays the referee's default).
  std::vector<PublicKey> sequencers;
  bool faucet = false;
  ChainParams params;
  std::vector<GenesisAccount> accounts;  // distinct keys
  bool operator==(const Genesis&) const = default;
};

// Checks chain id (1-64 chars of [A-Za-z0-9_.-]), interval > 0, bps <= 10000, distinct account
// keys, that the total balance fits in an Amount, and unbonding_delay_blocks >=
// audit_window_blocks.
// With `sequencers` set: `sequencer` among them, keys distinct and non-zero, at most
// kMaxSequencers.
Status ValidateGenesis(const Genesis& g);
inline constexpr size_t kMaxSequencers = 32;
// Whether `key` may sign this chain's blocks: one of `sequencers` when listed, else
// `sequencer`, else any key (a genesis that names none).
bool IsAuthorizedSequencer(const Genesis& g, const PublicKey& key);
// The keys allowed to sign blocks: `sequencers`, or {sequencer}, or {} (any key).
std::vector<PublicKey> AuthorizedSequencers(const Genesis& g);
Hash256 GenesisHash(const Genesis& g);  // over the canonical encoding

Result<Genesis> ParseGenesis(std::string_view toml_text, std::string name = "genesis.toml");
Result<Genesis> LoadGenesis(Env* env, const std::string& path);
std::string GenesisToToml(const Genesis& g);
Status WriteGenesis(Env* env, const std::string& path, const Genesis& g);
nlohmann::json GenesisToJson(const Genesis& g);

// ---- A chain directory (`meshlearn chain init` writes it, `chain serve` reads it):
//   <dir>/genesis.toml
//   <dir>/keys/sequencer.key.json   the sequencer's key, unencrypted, mode 0600
//   <dir>/chain.db                  made by `chain serve`
std::string ChainGenesisPath(const std::string& dir);
std::string ChainKeysDir(const std::string& dir);
std::string ChainDbPath(const std::string& dir);
inline constexpr char kSequencerKeyName[] = "sequencer";

// Creates the chain directory `dir` holding `g` and the sequencer's key, all or nothing: both
// files are written (and fsync'd) in a temporary sibling directory, which is then renamed to
// `dir`. Of several processes creating the same `dir` at once exactly one succeeds; the others
// get AlreadyExists and leave nothing behind, so genesis.toml and the key always agree. `dir`
// must not exist, or be an empty directory (it is replaced, mode 0700).
// A replicated chain's other candidates' keys (`candidates`, each in g.sequencers) are written
// beside it as keys/sequencer-2.key.json, sequencer-3, ... (CandidateKeyName).
// REQUIRES: g.sequencer == sequencer.public_key(). Real file system only (Env has no rename).
Status CreateChainDir(const std::string& dir, const Genesis& g, const KeyPair& sequencer,
                      const std::vector<KeyPair>& candidates = {});
// "sequencer" for candidate 0 (g.sequencer), "sequencer-2" for candidate 1, ...
std::string CandidateKeyName(size_t i);

// A devnet genesis: faucet on, each key funded with `balance_each`, small minimum stakes,
// a short unbonding delay and audit window (10 blocks each) so local tests move quickly, and
// generous scheduler knobs (liveness 60 blocks, slack 6000 permille, deadlines at least 20 blocks)
// so a loaded machine does not miss deadlines.
Genesis DevnetGenesis(const std::vector<PublicKey>& funded_keys, Amount balance_each,
                      std::string chain_id = "meshlearn-devnet");

}  // namespace meshlearn::ledger
