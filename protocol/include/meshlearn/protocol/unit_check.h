// The verification of one committed work unit, from selection to settlement (DESIGN.md, "One task,
// end to end", steps 6-9): a pure, event-driven state machine the ledger keeps per committed unit.
//
//   committed ──(next block: beacon)──> not selected ─────────────────────────────┐
//       │                                                                          │
//       └──> selected: verifiers assigned ──> commit phase ──> reveal phase ──┬──> settled
//                                                                             │
//                                            a mismatch verdict ──> disputed ─┘ (game outcome)
//
// Selection and segments come from the beacon, the hash of the block after the commit
// (verification.h). Verifiers commit their verdict, then reveal it (commit-reveal). In the same
// reveal window the solver reveals the secret of this unit (a hash chain registered with the node:
// SecretCommitment(secret) must equal the node's previous head), which says whether the unit was a
// forced error. Resolution, when the reveal window closes:
//
//   forced error   verifiers that called it clean approved work they never ran: slashed; those
//                  that caught it share the jackpot; the solver is not punished and must commit
//                  the honest result (the unit is re-run correctly);
//   a mismatch     a dispute (dispute.h) between the solver and the first verifier (in verifier
//                  order) that revealed a mismatch; finality is held until it resolves. If the
//                  solver wins, the mismatches claimed in that segment are slashed and the next
//                  claim in another segment gets its own dispute;
//   all clean      the solver's clean streak grows; the verifiers are paid for what they replayed.
//
// Besides the segments, a unit's result (its delta blob) is bound to its last leaf: anyone who
// shows that the delta is not global - the parameters of the state hashing to the last leaf
// settles the check as fraud at once (OnResultDisproved; the ledger computes it, ProveResult).
//
// A verifier that does not commit or reveal in time counts a failure and is not paid; on a
// forced error, one that committed and did not reveal is slashed like one that approved it (it
// saw the secret before its reveal was due). A solver that does not reveal its secret in time
// is treated as having cheated (its unit fails).
// A whistleblower may challenge a unit settled clean through the same dispute game until the
// task's round is final; if the solver loses, the verifiers that approved it are slashed too;
// if the whistleblower loses, only it is slashed (the verifiers were settled already). A solver
// that loses only by missing its turn showed nothing about its work: the merits window opens
// (awaits_merits()), in which a whistleblower may show the disputed segment false on the merits
// (OnMeritsShown: the ledger replays its witness); then the approving verifiers are slashed and
// the bounty is paid (to the earliest committer to the witness, OnMeritsShown's `payee`). At
// the window's end without it, only the solver is slashed, the approving verifiers keep their
// stake and the whistleblower's bounty is only what the solver's slash put into the jackpot
// (CheckEffects::bounty_by_silence).
//
// Everything is decided here; the ledger applies the returned CheckEffects (slash, pay, fail).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/types.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::protocol {

enum class CheckStage : uint8_t {
  kCheckAwaitingBeacon = 0,  // committed; selection happens at the next block
  kCheckCommitVerdicts,      // verifiers commit their verdicts
  kCheckRevealVerdicts,      // verifiers reveal; the solver reveals its secret
  kCheckDisputed,            // a dispute game is running
  kCheckSettled,             // outcome() is final
};
std::string_view CheckStageName(CheckStage s);

enum class CheckResult : uint8_t {
  kCheckPending = 0,
  kCheckUnchecked,     // not selected: accepted unchecked (the solver's streak is unchanged)
  kCheckClean,         // replayed and equal (or the challenger lost its dispute)
  kCheckFraud,         // the solver lost a dispute, or did not reveal its secret
  kCheckForcedError,   // a forced error: re-run the unit honestly; the solver is not punished
  kCheckAbandoned,     // the solver did not reveal its secret and nobody claimed a mismatch, or
                       // the unit was selected and no verifier revealed a verdict: it re-runs
                       // (it crashed, or hid a forced error): re-run without it, unpaid, a
                       // failure, not a slash
};
std::string_view CheckResultName(CheckResult r);

struct UnitCheckConfig {
  UnitId unit;
  NodeId solver;
  Hash256 result;           // the committed result (delta blob id)
  Hash256 commitment;       // Merkle root of the unit's state hashes (node::UnitExecutor)
  uint64_t inner_steps = 0;          // H
  uint64_t checkpoint_interval = 0;  // k: leaves are the states after steps 0, k, 2k, ..., H
  uint32_t num_operators = 0;        // recorded operators per step (engine::OpTrace), for disputes
  // The solver's secret for this unit sits `secret_distance` links below `secret_anchor`, the
  // deepest element of its secret chain the ledger knew when the unit was committed
  // (verification.h, CheckSecretInChain).
  Hash256 secret_anchor;
  uint64_t secret_distance = 1;
  uint64_t forced_error_per_million = 0;
  // The beacon of the unit's assignment (the forced-error draw uses it; the solver knew its
  // secret before that block existed).
  Hash256 assignment_beacon;
  uint64_t commit_height = 0;
  uint64_t commit_blocks = 10;  // verdict commit window, from selection
  uint64_t reveal_blocks = 10;  // verdict and secret reveal window, after the commit window
  uint64_t dispute_response_blocks = 10;
  uint32_t verifiers_per_unit = 1;
  bool tolerance = false;  // the task verifies in tolerance mode: disputes go to the referee
  uint64_t referee_blocks = 0;  // DisputeConfig::referee_blocks (0: the referee has no deadline)
  // The tile phase of every dispute of this check (DisputeConfig::operator_tiles and
  // operator_blocks, with num_operators): empty until SetTilePhase, then the step's plan as the
  // ledger derived it from the task bundle the opening transaction carried. A check without it
  // encodes as it always did (version 1); with it as version 2.
  std::vector<uint64_t> operator_tiles;
  std::vector<uint32_t> operator_blocks;
};

// A verifier's evidence that segment `segment` does not replay to the committed state: the two
// committed leaves around it, with their inclusion proofs in the solver's commitment, and the
// state hash the verifier's replay produced.
struct MismatchClaim {
  uint32_t segment = 0;
  Hash256 start;  // committed state hash at the segment's start (the replay started from it)
  MerkleProof start_proof;
  Hash256 solver_end;  // committed state hash at the segment's end
  MerkleProof end_proof;
  Hash256 replayed_end;  // what the verifier computed (!= solver_end)
};

// What the ledger must do after an event.
struct CheckEffects {
  std::vector<NodeId> slash;           // lose stake (fraud, lazy approval of a forced error)
  std::vector<NodeId> jackpot_winners; // caught a forced error: share the jackpot
  std::vector<NodeId> failures;        // missed a deadline: reputation failure, not paid
  std::vector<NodeId> pay_verifiers;   // replayed and revealed honestly: paid for the replay
  std::vector<NodeId> rewarded;        // won a dispute: rewarded from the slashed stake
  // A whistleblower's dispute won against the solver: `bounty` is paid from the jackpot, never
  // more than what this event's slash of the solver took (a solver and a whistleblower in league
  // gain nothing by it); won by the solver's silence alone (`bounty_by_silence`), only the part of
  // that slash that went into the jackpot (docs/verification.md, "Whistleblowers' incentives");
  // so too when the merits were shown by another node than the whistleblower that challenged
  // (OnMeritsShown).
  std::optional<NodeId> bounty;
  bool bounty_by_silence = false;
  bool solver_clean = false;           // credit the solver's clean streak
  bool rerun_unit = false;             // forced error or fraud: the unit must be run again
  bool settled = false;                // this event settled the check
};

// Whether the ledger can rule the disputed segment of a check's unit on its merits
// (ProveMerits: it replays the segment from a witness). The ledger decides it from the task
// (ledger::ProveMeritsRefusal) and tells OnBlock: a whistleblower's dispute its solver lost by
// silence waits in the merits window only where the merits can be shown; elsewhere the window
// would hold the round for nothing, and the loss by silence alone settles at once.
enum class Merits : uint8_t {
  kMeritsShowable = 0,
  kMeritsNotShowable,
};

class UnitCheck {
 public:
  static Result<UnitCheck> Create(const UnitCheckConfig& config);

  const UnitCheckConfig& config() const { return config_; }
  CheckStage stage() const { return stage_; }
  CheckResult result() const { return result_; }
  const std::string& reason() const { return reason_; }
  // Valid once selected.
  const std::vector<NodeId>& verifiers() const { return verifiers_; }
  const std::vector<uint32_t>& segments() const { return segments_; }
  uint64_t deadline_height() const { return deadline_; }
  const std::optional<DisputeGame>& dispute() const { return dispute_; }
  DisputeGame* mutable_dispute() { return dispute_ ? &*dispute_ : nullptr; }

  // The block after the commit: `beacon` is that block's seed (the hash of the block holding
  // the commit). `probability_permille` comes from VerificationProbabilityPermille(solver's
  // reputation). `candidates`: verifier nodes able to check (sorted by id; the solver is
  // skipped); verifiers_per_unit of them are drawn from the beacon. No candidate: the unit is
  // accepted unchecked, unless `wait_for_verifier` (the task bought full or target assurance,
  // which promise a replay by a node other than the solver): then nothing changes and the check
  // waits in kCheckAwaitingBeacon for a later block's beacon with a candidate, holding its round.
  Result<CheckEffects> OnBeacon(const Hash256& beacon, uint32_t probability_permille,
                                std::span<const NodeId> candidates,
                                const VerificationParams& params, uint64_t height,
                                bool wait_for_verifier = false);
  Status OnVerdictCommitted(const NodeId& verifier, const Hash256& commitment, uint64_t height);
  // A mismatch verdict must carry its claim (checked against the commitment: the proofs must
  // verify, the replayed end must differ). The claim may name any segment: a verifier replays
  // the drawn ones, and when the solver cannot serve a checkpoint that hashes to a committed
  // leaf, it replays from the unit's start and claims the first segment whose end differs.
  Status OnVerdictRevealed(const NodeId& verifier, Verdict verdict, const Hash256& salt,
                           const MismatchClaim* claim, uint64_t height);
  // The solver's secret for this unit (checked against config.secret_anchor). `start_leaf` is
  // the true state hash after step 0; it is needed only when the secret says the unit was a
  // forced error, to check that the solver really committed ForcedCommitment (a forced unit
  // committed any other way is fraud: honest verifiers that called it clean were right).
  // Also accepted late, while the dispute a verifier's mismatch started in its absence runs: a
  // forced error then settles as one at the next block (the solver counts a failure for being
  // late, nobody is slashed for the forced leaves), so an honest solver that crashed through
  // its reveal window is not slashed for its forced commitment; any other secret leaves the
  // dispute to decide.
  Status OnSecretRevealed(const Hash256& secret, const Hash256& start_leaf, uint64_t height);
  // A pipeline stage unit's secret: its check runs over its step leaves, not a state chain, so
  // the ledger checks the forced form itself, from the H step commits the stage reveals with the
  // secret (docs/verification.md, "Forced errors for stage units"). Once the secret checks out
  // as above, `forced_form(drawn)` is called with whether it draws the unit for a forced error
  // and says whether the stage committed the forced form (read only when drawn); its error
  // refuses the reveal, changing nothing.
  Status OnStageSecretRevealed(const Hash256& secret,
                               const std::function<Result<bool>(bool drawn)>& forced_form,
                               uint64_t height);
  // The revealed secret drew the unit for a forced error (whatever it then committed).
  bool forced() const { return forced_; }
  // Every block: closes windows (effects of missed deadlines and the resolution). A window
  // also closes early, at the block where nothing more can happen in it, so a check costs the
  // time its parties take, not the windows' length:
  //   the commit window, once every verifier has committed (at once for a unit not selected)
  //   and `earlier_verdicts_in`: no unit of the same solver with an earlier secret
  //   AwaitsVerdicts(). Revealing this unit's secret reveals every earlier one (they hash
  //   forward from it), so reveal windows must open in secret order, as the fixed windows make
  //   them;
  //   the reveal window, once the secret and every committed verdict are revealed.
  // `merits`: whether a whistleblower's dispute the solver loses by silence at this block opens
  // the merits window (OnDisputeResolved).
  Result<CheckEffects> OnBlock(uint64_t height, bool earlier_verdicts_in,
                               Merits merits = Merits::kMeritsShowable);
  // Whether verdicts are still to be committed (before the beacon, or a drawn verifier has not
  // committed): the solver's secret, and every later one, must stay unrevealed.
  bool AwaitsVerdicts() const;
  // The dispute resolved (the ledger drives the game and its referee; see dispute.h), at
  // `height`. A solver that wins refutes the mismatches claimed in that segment only: a mismatch
  // another verifier claimed in a different segment opens the next dispute (at `height`), so a
  // colluding verifier cannot shield a cheat by losing a dispute on a segment that was honest.
  // A whistleblower's dispute lost by the solver's silence opens the merits window only with
  // kMeritsShowable; with kMeritsNotShowable it settles at once, as the window's end would.
  Result<CheckEffects> OnDisputeResolved(uint64_t height, Merits merits = Merits::kMeritsShowable);
  // A whistleblower challenges a unit settled clean or unchecked (the ledger allows it until
  // the unit's round is final): a dispute between the solver and the whistleblower. If the
  // solver loses by a ruling, every verifier that revealed "clean" is slashed with it. If it
  // loses only by missing its turn, the check stays disputed through the merits window
  // (`dispute_response_blocks` more blocks, awaits_merits()) and settles as fraud by
  // OnMeritsShown or at the window's end (OnBlock: the solver slashed, nobody else); where the
  // merits cannot be shown (Merits::kMeritsNotShowable), at once as at the window's end.
  Status OnChallenge(const NodeId& whistleblower, const MismatchClaim& claim, uint64_t height);
  // Whether a whistleblower's dispute was lost by the solver's silence and the merits window is
  // open (until merits_deadline(), inclusive).
  bool awaits_merits() const { return merits_deadline_.has_value(); }
  uint64_t merits_deadline() const { return merits_deadline_.value_or(0); }
  // The ledger replayed segment `segment` from `prover`'s witness (ProveMeritsTx) and it does not
  // reach the solver's committed end: the whistleblower's claim is shown on the merits. The
  // segment must be the disputed one; any node but the solver may show it (a whistleblower in
  // league with a lazy solver cannot shield the solver's rubber stamps by letting it fall
  // silent). Settles as fraud: the solver and every verifier that revealed "clean" slashed,
  // `payee` paid the bounty (the ledger's earliest committer to the witness, which a copier of
  // `prover`'s proof never is; nullopt: nobody, it stays in the jackpot; a whistleblower that
  // itself missed its turn is slashed, unpaid): the whole bounty only when `payee` is the
  // whistleblower that challenged, to any other payee only the jackpot's share of the solver's
  // slash (bounty_by_silence), so that a silent solver showing its own merits from a second node
  // does not get its slash back. The overload without `payee` pays `prover`.
  // FailedPrecondition outside the window, DeadlineExceeded after it, InvalidArgument for
  // another segment or the solver itself.
  Result<CheckEffects> OnMeritsShown(const NodeId& prover, uint32_t segment, uint64_t height,
                                     const std::optional<NodeId>& payee);
  Result<CheckEffects> OnMeritsShown(const NodeId& prover, uint32_t segment, uint64_t height) {
    return OnMeritsShown(prover, segment, height, prover);
  }
  // The step's tile plan (DisputeConfig's num_operators, operator_tiles, operator_blocks), for
  // the disputes this check opens from now on (a dispute already running keeps its own). Set
  // once: a second call must give the same plan (AlreadyExists otherwise). InvalidArgument for
  // sizes that do not match or no operators; FailedPrecondition in tolerance mode (no bisection).
  // Also on a settled check: a whistleblower's challenge opens a dispute on one.
  Status SetTilePhase(uint32_t num_operators, std::vector<uint64_t> operator_tiles,
                      std::vector<uint32_t> operator_blocks);
  bool has_tile_phase() const { return !config_.operator_tiles.empty(); }
  // The ledger has shown that the committed result is not what the solver's own committed final
  // state gives (result != the delta of the state that hashes to the last leaf: ProveResult).
  // No game is needed: it is one computation over committed data. At any stage until the round
  // is final (the ledger checks that), unless the unit is already being re-run: the check
  // settles as fraud (the solver slashed, `payee` paid the bounty, never more than the slash
  // took; the unit re-run). Verdicts still open are void (verifiers replay segments; the result
  // is everyone's to check), a running dispute is dropped. A forced-error unit cannot be
  // disproved this way: its last leaf is a
  // ForcedLeaf, which no state hashes to.
  // `payee`: who gets the bounty (as OnMeritsShown's; the overload without it pays `prover`).
  Result<CheckEffects> OnResultDisproved(const NodeId& prover, uint64_t height,
                                         const std::optional<NodeId>& payee);
  Result<CheckEffects> OnResultDisproved(const NodeId& prover, uint64_t height) {
    return OnResultDisproved(prover, height, prover);
  }

  Bytes Encode() const;
  static Result<UnitCheck> Decode(ByteSpan bytes);

 private:
  explicit UnitCheck(const UnitCheckConfig& config) : config_(config) {}
  int VerifierIndex(const NodeId& n) const;
  // OnSecretRevealed's checks (the window, a first reveal, the secret in the solver's chain).
  Status CheckSecretReveal(const Hash256& secret, uint64_t height) const;
  // Whether `secret` draws this unit for a forced error (IsForcedError with the unit's
  // assignment beacon and rate).
  bool DrawsForcedError(const Hash256& secret) const;
  // The dispute of `challenger` against the solver over segment `segment`.
  DisputeConfig DisputeOver(const NodeId& challenger, uint32_t segment, const Hash256& start,
                            const Hash256& solver_end, const Hash256& replayed_end,
                            uint64_t height) const;
  CheckEffects Resolve(uint64_t height);
  // The slots that revealed a verdict, by verdict.
  void SplitVerdicts(std::vector<size_t>* clean, std::vector<size_t>* mismatch) const;
  // Resolve's settlement of a revealed forced error (or of a forced unit committed otherwise).
  void SettleForced(const std::vector<size_t>& clean, const std::vector<size_t>& mismatch,
                    CheckEffects& fx);
  // Opens the dispute between the solver and the verifier of `slot` (its mismatch claim).
  Status StartDispute(size_t slot, uint64_t height);
  // Whether a verifier of slots [0, upto) claimed a mismatch in the segment `slot` claims and
  // did not lose its dispute by silence alone: in slot order, every such segment has already been
  // refuted by a dispute the solver won on the merits.
  bool RefutedBefore(size_t slot, size_t upto) const;
  // Settles a whistleblower's dispute the solver lost: the solver slashed, the verifiers that
  // called the unit clean too when the loss was shown `on_merits`, the whistleblower when it
  // missed its turn; `payee` gets the bounty unless it is slashed here.
  CheckEffects SettleWhistleblowerWin(bool on_merits, const std::optional<NodeId>& payee);

  struct VerdictSlot {
    std::optional<Hash256> commitment;
    std::optional<Verdict> verdict;
    // For a mismatch: the claim without its proofs (already checked).
    uint32_t segment = 0;
    Hash256 start, solver_end, replayed_end;
    // This verifier was the challenger and lost by missing its turn: slashed for that, but its
    // silence refutes no other verifier's claim in the segment, which gets its own dispute. Also
    // set, without the slash, for a claim that the solver served nothing which the solver
    // answered by serving its evidence on chain (DisputeGame::RuleServed): it refutes nothing.
    bool lost_by_silence = false;
  };

  UnitCheckConfig config_;
  CheckStage stage_ = CheckStage::kCheckAwaitingBeacon;
  CheckResult result_ = CheckResult::kCheckPending;
  std::string reason_;
  std::vector<NodeId> verifiers_;
  std::vector<VerdictSlot> slots_;
  std::vector<uint32_t> segments_;
  uint64_t deadline_ = 0;
  std::optional<Hash256> secret_;
  bool forced_ = false;
  bool forced_form_ok_ = false;  // a forced unit committed ForcedCommitment
  std::optional<DisputeGame> dispute_;
  int challenger_ = -1;  // slot index of the verifier in the dispute; -1: a whistleblower's
  std::optional<NodeId> whistleblower_;
  // Set while a whistleblower's dispute lost by the solver's silence awaits its merits: the last
  // height at which OnMeritsShown is accepted. Encoded as a trailer only when set.
  std::optional<uint64_t> merits_deadline_;
};

// The verifiers' pay and slash amounts, in tokens, for a unit whose training costs
// `unit_cost` tokens at the solver's price:
//   a verifier replays `segments_replayed` of `num_segments` segments and is paid that share of
//   the unit's cost (at least 1 token);
//   a slash takes `slash_multiple` times the unit's cost (capped by the stake by the ledger), so
//   a cheater loses more than the unit could ever pay.
uint64_t VerifierPay(uint64_t unit_cost, uint32_t segments_replayed, uint32_t num_segments);
// The steps a check of a pipeline stage unit replays (its segments are its `inner_steps` steps):
// the drawn `steps`, and the stage's last step when it was not drawn, which the check replays
// anyway to bind the stage's committed result to its state after that step (node
// CheckStageSteps, docs/verification.md "Pipeline stages"). Distinct steps, each counted once;
// at most inner_steps. What a stage check's verifier is paid for: VerifierPay(unit_cost,
// StageStepsReplayed(drawn, H), H), where the ledger passes the stage's cost (its
// StageUnitCost) as unit_cost.
uint32_t StageStepsReplayed(std::span<const uint32_t> steps, uint32_t inner_steps);
uint64_t SlashAmount(uint64_t unit_cost, uint32_t slash_multiple);

}  // namespace meshlearn::protocol
