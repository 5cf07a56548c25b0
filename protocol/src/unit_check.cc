#include "meshlearn/protocol/unit_check.h"

#include <algorithm>
#include <set>
#include <utility>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/draw.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::protocol {
namespace {

constexpr uint8_t kUnitCheckEncodingVersion = 1;
constexpr uint8_t kUnitCheckEncodingVersionTiles = 2;  // with the tile phase
constexpr uint32_t kMaxVerifiers = 64;
constexpr uint32_t kMaxSegments = 1u << 20;
constexpr uint32_t kMaxReason = 256;
// The most operators a step's tile plan may list (the 10M GPT has 477).
constexpr uint32_t kMaxTileOperators = 1u << 12;

void Append(std::vector<NodeId>& to, const NodeId& n) {
  if (std::find(to.begin(), to.end(), n) == to.end()) to.push_back(n);
}

}  // namespace

std::string_view CheckStageName(CheckStage s) {
  switch (s) {
    case CheckStage::kCheckAwaitingBeacon:
      return "awaiting_beacon";
    case CheckStage::kCheckCommitVerdicts:
      return "commit_verdicts";
    case CheckStage::kCheckRevealVerdicts:
      return "reveal_verdicts";
    case CheckStage::kCheckDisputed:
      return "disputed";
    case CheckStage::kCheckSettled:
      return "settled";
  }
  return "unknown";
}

std::string_view CheckResultName(CheckResult r) {
  switch (r) {
    case CheckResult::kCheckPending:
      return "pending";
    case CheckResult::kCheckUnchecked:
      return "unchecked";
    case CheckResult::kCheckClean:
      return "clean";
    case CheckResult::kCheckFraud:
      return "fraud";
    case CheckResult::kCheckForcedError:
      return "forced_error";
    case CheckResult::kCheckAbandoned:
      return "abandoned";
  }
  return "unknown";
}

uint64_t VerifierPay(uint64_t unit_cost, uint32_t segments_replayed, uint32_t num_segments) {
  if (num_segments == 0) return 1;
  // unit_cost x replayed / segments without overflow (replayed <= segments).
  uint64_t whole = unit_cost / num_segments * segments_replayed;
  uint64_t part = unit_cost % num_segments * segments_replayed / num_segments;
  return std::max<uint64_t>(1, whole + part);
}

uint32_t StageStepsReplayed(std::span<const uint32_t> steps, uint32_t inner_steps) {
  if (inner_steps == 0) return 0;
  std::set<uint32_t> replayed;
  for (uint32_t t : steps) {
    if (t < inner_steps) replayed.insert(t);
  }
  replayed.insert(inner_steps - 1);  // the result binding's step
  return static_cast<uint32_t>(replayed.size());
}

uint64_t SlashAmount(uint64_t unit_cost, uint32_t slash_multiple) {
  if (unit_cost != 0 && slash_multiple > UINT64_MAX / unit_cost) return UINT64_MAX;
  return std::max<uint64_t>(1, unit_cost * slash_multiple);
}

Result<UnitCheck> UnitCheck::Create(const UnitCheckConfig& c) {
  if (c.inner_steps == 0) return InvalidArgument("unit check: inner_steps must be > 0");
  if (c.verifiers_per_unit == 0 || c.verifiers_per_unit > kMaxVerifiers) {
    return InvalidArgument("unit check: verifiers_per_unit must be in [1, " +
                           std::to_string(kMaxVerifiers) + "], got " +
                           std::to_string(c.verifiers_per_unit));
  }
  if (c.commit_blocks == 0 || c.reveal_blocks == 0 || c.dispute_response_blocks == 0) {
    return InvalidArgument("unit check: commit, reveal and dispute windows must be >= 1 block");
  }
  if (c.result.IsZero()) return InvalidArgument("unit check: the committed result is zero");
  if (SegmentCount(c.inner_steps, c.checkpoint_interval) > kMaxSegments) {
    return InvalidArgument("unit check: too many segments; raise checkpoint_interval");
  }
  return UnitCheck(c);
}

DisputeConfig UnitCheck::DisputeOver(const NodeId& challenger, uint32_t segment,
                                     const Hash256& start, const Hash256& solver_end,
                                     const Hash256& replayed_end, uint64_t height) const {
  DisputeConfig dc;
  dc.unit = config_.unit;
  dc.defender = config_.solver;
  dc.challenger = challenger;
  const SegmentSteps steps =
      SegmentStepsOf(config_.inner_steps, config_.checkpoint_interval, segment);
  dc.first_step = steps.first_step;
  dc.last_step = steps.last_step;
  dc.agreed = start;
  dc.defender_claim = solver_end;
  dc.challenger_claim = replayed_end;
  dc.num_operators = config_.num_operators;
  dc.response_blocks = config_.dispute_response_blocks;
  dc.start_height = height;
  dc.tolerance = config_.tolerance;
  dc.referee_blocks = config_.referee_blocks;
  dc.operator_tiles = config_.operator_tiles;
  dc.operator_blocks = config_.operator_blocks;
  return dc;
}

int UnitCheck::VerifierIndex(const NodeId& n) const {
  for (size_t i = 0; i < verifiers_.size(); ++i) {
    if (verifiers_[i] == n) return static_cast<int>(i);
  }
  return -1;
}

Result<CheckEffects> UnitCheck::OnBeacon(const Hash256& beacon, uint32_t probability_permille,
                                         std::span<const NodeId> candidates,
                                         const VerificationParams& params, uint64_t height,
                                         bool wait_for_verifier) {
  if (stage_ != CheckStage::kCheckAwaitingBeacon) {
    return FailedPrecondition("unit check: " + config_.unit.ToString() + " already has its beacon");
  }
  ML_RETURN_IF_ERROR(ValidateVerificationParams(params));
  CheckEffects fx;
  std::vector<NodeId> pool;
  for (const NodeId& n : candidates) {
    if (n != config_.solver) pool.push_back(n);
  }
  std::sort(pool.begin(), pool.end());
  pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
  if (pool.empty() && wait_for_verifier) return fx;  // still awaiting a beacon with a verifier
  const bool selected =
      !pool.empty() && SelectedForVerification(beacon, config_.unit, probability_permille);
  if (selected) {
    // Partial Fisher-Yates over the sorted candidates, keyed by the beacon.
    Rng rng(FirstU64(Hasher("meshlearn.verify.assign").Update(beacon)
                         .Update(UnitKey(config_.unit)).Finish()));
    const size_t want = std::min<size_t>(config_.verifiers_per_unit, pool.size());
    for (size_t i = 0; i < want; ++i) {
      size_t j = i + static_cast<size_t>(rng.Uniform(pool.size() - i));
      std::swap(pool[i], pool[j]);
    }
    verifiers_.assign(pool.begin(), pool.begin() + static_cast<ptrdiff_t>(want));
    slots_.assign(want, VerdictSlot{});
    segments_ = SegmentsToReplay(beacon, config_.unit,
                                 SegmentCount(config_.inner_steps, config_.checkpoint_interval),
                                 params);
    stage_ = CheckStage::kCheckCommitVerdicts;
    deadline_ = height + config_.commit_blocks;
  } else {
    // Not checked; the solver still reveals its secret (a forced error must be re-run), in the
    // same window as a checked unit's: reveal windows then open in commit order, so revealing a
    // later secret (which reveals every earlier one) never happens while an earlier unit's
    // verdicts can still be committed.
    stage_ = CheckStage::kCheckCommitVerdicts;
    deadline_ = height + config_.commit_blocks;
  }
  return fx;
}

Status UnitCheck::OnVerdictCommitted(const NodeId& verifier, const Hash256& commitment,
                                     uint64_t height) {
  if (stage_ != CheckStage::kCheckCommitVerdicts) {
    return FailedPrecondition("verdict commit for " + config_.unit.ToString() +
                              ": the commit window is not open (stage " +
                              std::string(CheckStageName(stage_)) + ")");
  }
  if (height > deadline_) return DeadlineExceeded("verdict commit: the commit window closed");
  int i = VerifierIndex(verifier);
  if (i < 0) {
    return PermissionDenied("verdict commit: node " + verifier.ShortHex() +
                            " is not a verifier of " + config_.unit.ToString());
  }
  if (slots_[static_cast<size_t>(i)].commitment) {
    return AlreadyExists("verdict commit: node " + verifier.ShortHex() + " already committed");
  }
  slots_[static_cast<size_t>(i)].commitment = commitment;
  return Status::Ok();
}

Status UnitCheck::OnVerdictRevealed(const NodeId& verifier, Verdict verdict, const Hash256& salt,
                                    const MismatchClaim* claim, uint64_t height) {
  if (stage_ != CheckStage::kCheckRevealVerdicts) {
    return FailedPrecondition("verdict reveal for " + config_.unit.ToString() +
                              ": the reveal window is not open (stage " +
                              std::string(CheckStageName(stage_)) + ")");
  }
  if (height > deadline_) return DeadlineExceeded("verdict reveal: the reveal window closed");
  int i = VerifierIndex(verifier);
  if (i < 0) {
    return PermissionDenied("verdict reveal: node " + verifier.ShortHex() +
                            " is not a verifier of " + config_.unit.ToString());
  }
  VerdictSlot& slot = slots_[static_cast<size_t>(i)];
  if (!slot.commitment) {
    return FailedPrecondition("verdict reveal: node " + verifier.ShortHex() +
                              " committed no verdict in time");
  }
  if (slot.verdict) return AlreadyExists("verdict reveal: node " + verifier.ShortHex() +
                                         " already revealed");
  if (verdict == Verdict::kVerdictMismatch && claim == nullptr) {
    return InvalidArgument("verdict reveal: a mismatch must carry its claim (segment, "
                           "committed states with proofs, replayed state)");
  }
  const Hash256 evidence = verdict == Verdict::kVerdictMismatch
                               ? MismatchEvidence(claim->segment, claim->replayed_end)
                               : Hash256{};
  ML_RETURN_IF_ERROR(
      CheckVerdictReveal(*slot.commitment, verdict, salt, verifier, config_.unit, evidence));
  VerdictSlot checked = slot;
  if (verdict == Verdict::kVerdictMismatch) {
    const uint64_t leaves = SegmentCount(config_.inner_steps, config_.checkpoint_interval) + 1ull;
    if (claim->start_proof.index != claim->segment ||
        claim->end_proof.index != claim->segment + 1ull ||
        claim->start_proof.leaf_count != leaves || claim->end_proof.leaf_count != leaves ||
        !MerkleVerify(config_.commitment, claim->start, claim->start_proof) ||
        !MerkleVerify(config_.commitment, claim->solver_end, claim->end_proof)) {
      return InvalidArgument("verdict reveal: the claim's states are not the solver's committed "
                             "states of segment " + std::to_string(claim->segment));
    }
    if (claim->replayed_end == claim->solver_end) {
      return InvalidArgument("verdict reveal: the replayed state equals the committed one; "
                             "that is a clean verdict");
    }
    checked.segment = claim->segment;
    checked.start = claim->start;
    checked.solver_end = claim->solver_end;
    checked.replayed_end = claim->replayed_end;
  }
  checked.verdict = verdict;
  slot = checked;
  return Status::Ok();
}

Status UnitCheck::CheckSecretReveal(const Hash256& secret, uint64_t height) const {
  const bool late = stage_ == CheckStage::kCheckDisputed && !whistleblower_;
  if (stage_ != CheckStage::kCheckRevealVerdicts && !late) {
    return FailedPrecondition("secret reveal for " + config_.unit.ToString() +
                              ": only in the reveal window, after the verdicts are committed, "
                              "or during a verifier's dispute (stage " +
                              std::string(CheckStageName(stage_)) + ")");
  }
  if (!late && height > deadline_) {
    return DeadlineExceeded("secret reveal: the reveal window closed");
  }
  if (secret_) return AlreadyExists("secret reveal: already revealed");
  return CheckSecretInChain(secret, config_.secret_anchor, config_.secret_distance);
}

bool UnitCheck::DrawsForcedError(const Hash256& secret) const {
  return IsForcedError(secret, config_.assignment_beacon, config_.unit,
                       static_cast<uint32_t>(config_.forced_error_per_million));
}

Status UnitCheck::OnSecretRevealed(const Hash256& secret, const Hash256& start_leaf,
                                   uint64_t height) {
  ML_RETURN_IF_ERROR(CheckSecretReveal(secret, height));
  secret_ = secret;
  forced_ = DrawsForcedError(secret);
  const uint64_t leaves = SegmentCount(config_.inner_steps, config_.checkpoint_interval) + 1ull;
  forced_form_ok_ =
      forced_ && ForcedCommitment(secret, config_.unit, start_leaf, leaves) == config_.commitment;
  return Status::Ok();
}

Status UnitCheck::OnStageSecretRevealed(
    const Hash256& secret, const std::function<Result<bool>(bool drawn)>& forced_form,
    uint64_t height) {
  ML_RETURN_IF_ERROR(CheckSecretReveal(secret, height));
  const bool drawn = DrawsForcedError(secret);
  ML_ASSIGN_OR_RETURN(const bool form_ok, forced_form(drawn));
  secret_ = secret;
  forced_ = drawn;
  forced_form_ok_ = drawn && form_ok;
  return Status::Ok();
}

Status UnitCheck::StartDispute(size_t slot, uint64_t height) {
  const VerdictSlot& s = slots_[slot];
  ML_ASSIGN_OR_RETURN(DisputeGame g,
                      DisputeGame::Create(DisputeOver(verifiers_[slot], s.segment, s.start,
                                                      s.solver_end, s.replayed_end, height)));
  dispute_ = std::move(g);
  challenger_ = static_cast<int>(slot);
  stage_ = CheckStage::kCheckDisputed;
  reason_ = "verifier " + verifiers_[slot].ShortHex() + " found a mismatch in segment " +
            std::to_string(s.segment);
  return Status::Ok();
}

bool UnitCheck::RefutedBefore(size_t slot, size_t upto) const {
  for (size_t k = 0; k < upto && k < slots_.size(); ++k) {
    if (slots_[k].verdict == Verdict::kVerdictMismatch && !slots_[k].lost_by_silence &&
        slots_[k].segment == slots_[slot].segment) {
      return true;
    }
  }
  return false;
}

void UnitCheck::SplitVerdicts(std::vector<size_t>* clean, std::vector<size_t>* mismatch) const {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].verdict) {
      (*slots_[i].verdict == Verdict::kVerdictClean ? clean : mismatch)->push_back(i);
    }
  }
}

CheckEffects UnitCheck::Resolve(uint64_t height) {
  CheckEffects fx;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].commitment && !slots_[i].verdict) {
      Append(fx.failures, verifiers_[i]);  // committed, never revealed
    }
  }
  std::vector<size_t> clean, mismatch;
  SplitVerdicts(&clean, &mismatch);
  auto settle = [&](CheckResult r, std::string why) {
    stage_ = CheckStage::kCheckSettled;
    result_ = r;
    reason_ = std::move(why);
    fx.settled = true;
  };
  if (!secret_) {
    // A claimed mismatch is disputed anyway: hiding the secret must not dodge the game.
    if (!mismatch.empty() && StartDispute(mismatch.front(), height).ok()) return fx;
    Append(fx.failures, config_.solver);
    for (size_t i : clean) Append(fx.pay_verifiers, verifiers_[i]);
    fx.rerun_unit = true;
    settle(CheckResult::kCheckAbandoned, "the solver did not reveal its secret in time");
    return fx;
  }
  if (forced_) {
    SettleForced(clean, mismatch, fx);
    return fx;
  }
  if (!mismatch.empty() && StartDispute(mismatch.front(), height).ok()) return fx;
  if (clean.empty() && verifiers_.empty()) {
    settle(CheckResult::kCheckUnchecked, "not selected for verification");
    return fx;
  }
  if (clean.empty()) {
    // Selected, and every verifier stayed silent (each counted a failure when its window
    // closed). Accepting the unit would pay, and aggregate, work nobody replayed — a cheater
    // whose verifiers keep quiet would be paid the same way (chaos seed 9) — so it runs again,
    // with a check of its own. The solver is not at fault: no failure, nobody excluded.
    fx.rerun_unit = true;
    settle(CheckResult::kCheckAbandoned,
           "selected for verification, but no verifier revealed a verdict: the unit runs again");
    return fx;
  }
  for (size_t i : clean) Append(fx.pay_verifiers, verifiers_[i]);
  fx.solver_clean = true;
  settle(CheckResult::kCheckClean, std::to_string(clean.size()) + " verifier(s) replayed " +
                                       std::to_string(segments_.size()) + " segment(s): equal");
  return fx;
}

void UnitCheck::SettleForced(const std::vector<size_t>& clean, const std::vector<size_t>& mismatch,
                             CheckEffects& fx) {
  stage_ = CheckStage::kCheckSettled;
  fx.settled = true;
  fx.rerun_unit = true;
  if (!forced_form_ok_) {
    // Drawn for a forced error but committed something else (typically its honest work, to get
    // honest verifiers slashed for calling it clean): a protocol violation by the solver.
    Append(fx.slash, config_.solver);
    for (size_t i : clean) Append(fx.pay_verifiers, verifiers_[i]);
    for (size_t i : mismatch) Append(fx.pay_verifiers, verifiers_[i]);
    result_ = CheckResult::kCheckFraud;
    reason_ = "the solver was drawn for a forced error and did not commit it";
    return;
  }
  for (size_t i : clean) Append(fx.slash, verifiers_[i]);  // approved work it never ran
  for (size_t i : mismatch) Append(fx.jackpot_winners, verifiers_[i]);
  // A verifier that committed and then kept its verdict back is slashed like one that called
  // it clean: the solver's secret is revealed in the same window, so otherwise a verifier
  // could commit "clean" unread and withhold the reveal exactly when the unit is forced.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].commitment && !slots_[i].verdict) Append(fx.slash, verifiers_[i]);
  }
  result_ = CheckResult::kCheckForcedError;
  reason_ = "forced error: " + std::to_string(mismatch.size()) + " verifier(s) caught it, " +
            std::to_string(clean.size()) + " approved it";
}

bool UnitCheck::AwaitsVerdicts() const {
  if (stage_ == CheckStage::kCheckAwaitingBeacon) return true;
  return stage_ == CheckStage::kCheckCommitVerdicts &&
         !std::ranges::all_of(slots_, [](const VerdictSlot& v) { return v.commitment.has_value(); });
}

Result<CheckEffects> UnitCheck::OnBlock(uint64_t height, bool earlier_verdicts_in, Merits merits) {
  CheckEffects fx;
  if (stage_ == CheckStage::kCheckCommitVerdicts && height > deadline_) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].commitment) Append(fx.failures, verifiers_[i]);
    }
    stage_ = CheckStage::kCheckRevealVerdicts;
    deadline_ += config_.reveal_blocks;
  } else if (stage_ == CheckStage::kCheckCommitVerdicts && earlier_verdicts_in &&
             !AwaitsVerdicts()) {
    stage_ = CheckStage::kCheckRevealVerdicts;  // every verdict is in: reveals from the next block
    deadline_ = height + config_.reveal_blocks;
    return fx;
  }
  const bool all_revealed =
      secret_ && std::ranges::all_of(slots_, [](const VerdictSlot& v) {
        return !v.commitment || v.verdict.has_value();
      });
  if (stage_ == CheckStage::kCheckRevealVerdicts && (height > deadline_ || all_revealed)) {
    CheckEffects r = Resolve(height);
    for (const NodeId& n : fx.failures) Append(r.failures, n);
    return r;
  }
  if (stage_ == CheckStage::kCheckDisputed && secret_ && forced_ && !whistleblower_) {
    // The secret came late, during the dispute its absence started: a forced unit's leaves are
    // forced by design, so the dispute is moot and the check settles as Resolve would have.
    std::vector<size_t> clean, mismatch;
    SplitVerdicts(&clean, &mismatch);
    dispute_.reset();
    challenger_ = -1;
    SettleForced(clean, mismatch, fx);
    Append(fx.failures, config_.solver);  // it revealed late
    reason_ += " (the secret came late, during the dispute)";
    return fx;
  }
  if (stage_ == CheckStage::kCheckDisputed && merits_deadline_) {
    if (height > *merits_deadline_) {
      // Nobody showed the merits: the solver lost by its silence alone (OnDisputeResolved).
      fx = SettleWhistleblowerWin(/*on_merits=*/false, *whistleblower_);
      reason_ = "whistleblower dispute: the solver fell silent; no merits shown by height " +
                std::to_string(height - 1);
    }
    return fx;
  }
  if (stage_ == CheckStage::kCheckDisputed) {
    ML_RETURN_IF_ERROR(dispute_->OnBlock(height));
    if (dispute_->stage() == DisputeStage::kDisputeResolved) {
      return OnDisputeResolved(height, merits);
    }
  }
  return fx;
}

Result<CheckEffects> UnitCheck::OnDisputeResolved(uint64_t height, Merits merits) {
  if (stage_ != CheckStage::kCheckDisputed || !dispute_ ||
      dispute_->stage() != DisputeStage::kDisputeResolved) {
    return FailedPrecondition("unit check: no resolved dispute for " + config_.unit.ToString());
  }
  const DisputeOutcome& o = dispute_->outcome();
  CheckEffects fx;
  if (o.undecided) {
    // No ruling: nobody was shown to lie. A challenged unit keeps its clean settlement; a unit
    // under a verifier's dispute is re-run (its result was never shown honest), nobody punished.
    fx.settled = true;
    stage_ = CheckStage::kCheckSettled;
    reason_ = "dispute undecided: " + o.reason;
    if (whistleblower_) {
      result_ = CheckResult::kCheckClean;
    } else {
      result_ = CheckResult::kCheckAbandoned;
      fx.rerun_unit = true;
    }
    return fx;
  }
  if (whistleblower_) {
    // The verifiers' verdicts were paid (or slashed) when the check first settled; a challenge
    // only adds what it proves. A solver that missed its turn loses, but its silence shows
    // nothing about its work: settling now would either slash the verifiers that called it clean
    // on a made-up claim against a solver that crashed or colludes (chaos seed 561), or let a
    // lazy solver spare its rubber stamps by falling silent on purpose. So the merits window
    // opens: the claim may still be shown on the merits (OnMeritsShown), else only the solver
    // pays (OnBlock at the window's end).
    if (!o.defender_honest && o.defender_silent && merits == Merits::kMeritsNotShowable) {
      // Nobody can show this unit's merits on chain (the ledger replays none of its segments):
      // a window would hold the round for nothing. It settles as the window's end would.
      fx = SettleWhistleblowerWin(/*on_merits=*/false, *whistleblower_);
      reason_ = "whistleblower dispute: " + o.reason +
                "; the solver lost by its silence alone (its merits cannot be shown on chain)";
      return fx;
    }
    if (!o.defender_honest && o.defender_silent) {
      merits_deadline_ = height + config_.dispute_response_blocks;
      reason_ = "whistleblower dispute: " + o.reason + "; its merits may be shown until height " +
                std::to_string(*merits_deadline_);
      return fx;
    }
    const NodeId wb = *whistleblower_;
    reason_ = "whistleblower dispute: " + o.reason;
    if (!o.defender_honest) return SettleWhistleblowerWin(/*on_merits=*/true, wb);
    // The solver's streak was credited (or not) when the check first settled; not again.
    fx.settled = true;
    stage_ = CheckStage::kCheckSettled;
    result_ = CheckResult::kCheckClean;
    if (o.challenger_honest) {
      // Served (DisputeGame::RuleServed): the claim of availability is answered and shows
      // nobody's work wrong; the whistleblower counts a failure, not a slash (its stake is not the
      // price of a bad link). The step is checked from the evidence on chain by a new challenge.
      Append(fx.failures, wb);
      return fx;
    }
    Append(fx.slash, wb);
    return fx;
  }
  const size_t ci = static_cast<size_t>(challenger_);
  const NodeId challenger = verifiers_[ci];
  if (!o.defender_honest) {
    Append(fx.slash, config_.solver);
    for (size_t i = 0; i < slots_.size(); ++i) {
      // Every verifier that called the work clean approved something wrong.
      if (slots_[i].verdict == Verdict::kVerdictClean) Append(fx.slash, verifiers_[i]);
      // Mismatches in segments an earlier dispute refuted were slashed then, as was a challenger
      // that lost by its silence.
      if (slots_[i].verdict == Verdict::kVerdictMismatch && i != ci && !RefutedBefore(i, ci) &&
          !slots_[i].lost_by_silence) {
        Append(fx.pay_verifiers, verifiers_[i]);
      }
    }
    if (o.challenger_honest) {
      Append(fx.rewarded, challenger);
      Append(fx.pay_verifiers, challenger);
    } else {
      Append(fx.slash, challenger);
    }
    fx.rerun_unit = true;
    fx.settled = true;
    stage_ = CheckStage::kCheckSettled;
    result_ = CheckResult::kCheckFraud;
    reason_ = "dispute: " + o.reason;
    return fx;
  }
  // The solver's segment replays to its committed state: every mismatch claimed in that segment
  // was wrong. A mismatch in another segment is not refuted by it and gets its own dispute. A
  // challenger that lost by missing its turn proved nothing about its segment: it alone is
  // slashed, and the next claim in the segment gets its own dispute (chaos seed 57: an honest
  // verifier was slashed because an adversary that claimed the same mismatch went silent).
  const std::string reason = "dispute: " + o.reason;
  // A claim that the solver served nothing, answered by its evidence on chain
  // (DisputeGame::RuleServed: both honest), refutes nothing about the segment either: the
  // claimant counts a failure, not a slash (an honest verifier behind a bad link must not lose
  // its stake for what the stage then published), and every other claim in the segment gets its
  // own dispute. The step itself is checked from the evidence on chain afterwards (a challenge
  // with the task bundle: docs/verification.md), so the solver's streak is not credited.
  const bool served = o.challenger_honest;
  if (served) {
    slots_[ci].lost_by_silence = true;
    Append(fx.failures, challenger);
  } else if (o.challenger_silent) {
    slots_[ci].lost_by_silence = true;
    Append(fx.slash, challenger);
  } else {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].verdict == Verdict::kVerdictMismatch && !slots_[i].lost_by_silence &&
          slots_[i].segment == slots_[ci].segment) {
        Append(fx.slash, verifiers_[i]);
      }
    }
  }
  for (size_t j = ci + 1; j < slots_.size(); ++j) {
    if (slots_[j].verdict == Verdict::kVerdictMismatch && !RefutedBefore(j, ci + 1) &&
        StartDispute(j, height).ok()) {
      return fx;
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].verdict == Verdict::kVerdictClean) Append(fx.pay_verifiers, verifiers_[i]);
  }
  fx.solver_clean = !served;
  fx.settled = true;
  stage_ = CheckStage::kCheckSettled;
  result_ = CheckResult::kCheckClean;
  reason_ = reason;
  return fx;
}

CheckEffects UnitCheck::SettleWhistleblowerWin(bool on_merits, const std::optional<NodeId>& payee) {
  const DisputeOutcome& o = dispute_->outcome();
  CheckEffects fx;
  Append(fx.slash, config_.solver);
  for (size_t i = 0; i < slots_.size() && on_merits; ++i) {
    // Shown wrong on the merits (a ruling, or the disputed segment replayed): they approved
    // something wrong.
    if (slots_[i].verdict == Verdict::kVerdictClean) Append(fx.slash, verifiers_[i]);
  }
  if (!o.challenger_honest) Append(fx.slash, *whistleblower_);  // it missed its turn, or lied
  if (payee && std::find(fx.slash.begin(), fx.slash.end(), *payee) == fx.slash.end()) {
    fx.bounty = payee;
    fx.bounty_by_silence = !on_merits;
  }
  fx.rerun_unit = true;
  fx.settled = true;
  stage_ = CheckStage::kCheckSettled;
  result_ = CheckResult::kCheckFraud;
  merits_deadline_.reset();
  return fx;
}

Result<CheckEffects> UnitCheck::OnMeritsShown(const NodeId& prover, uint32_t segment,
                                              uint64_t height, const std::optional<NodeId>& payee) {
  if (stage_ != CheckStage::kCheckDisputed || !merits_deadline_) {
    return FailedPrecondition("merits of " + config_.unit.ToString() +
                              ": no whistleblower's dispute awaits its merits (stage " +
                              std::string(CheckStageName(stage_)) +
                              "); they are shown only after the solver lost it by its silence");
  }
  if (height > *merits_deadline_) {
    return DeadlineExceeded("merits of " + config_.unit.ToString() +
                            ": the window closed at height " + std::to_string(*merits_deadline_));
  }
  if (prover == config_.solver) {
    return InvalidArgument("merits: a solver cannot show its own unit false");
  }
  const SegmentSteps steps =
      SegmentStepsOf(config_.inner_steps, config_.checkpoint_interval, segment);
  const DisputeConfig& dc = dispute_->config();
  if (steps.first_step != dc.first_step || steps.last_step != dc.last_step) {
    return InvalidArgument("merits of " + config_.unit.ToString() + ": segment " +
                           std::to_string(segment) + " is not the disputed one (steps " +
                           std::to_string(dc.first_step) + ".." + std::to_string(dc.last_step) +
                           "); show the segment the whistleblower claimed");
  }
  const NodeId whistleblower = *whistleblower_;
  CheckEffects fx = SettleWhistleblowerWin(/*on_merits=*/true, payee);
  // Shown by another node than the whistleblower that challenged: only the jackpot's share of
  // the solver's slash, as for a win by silence. Else the solver, silent on purpose, would show
  // its own merits from a second node (under another owner key if need be) and get back all its
  // slash took: its fraud would cost it nothing, and the whistleblower's bounty would be its.
  if (fx.bounty && *fx.bounty != whistleblower) fx.bounty_by_silence = true;
  reason_ = "whistleblower dispute: the solver fell silent; segment " + std::to_string(segment) +
            " shown false by " + prover.ShortHex() + " at height " + std::to_string(height);
  return fx;
}

Status UnitCheck::OnChallenge(const NodeId& whistleblower, const MismatchClaim& claim,
                              uint64_t height) {
  if (stage_ != CheckStage::kCheckSettled ||
      (result_ != CheckResult::kCheckClean && result_ != CheckResult::kCheckUnchecked)) {
    return FailedPrecondition("challenge of " + config_.unit.ToString() +
                              ": only a unit settled clean or unchecked can be challenged (it is " +
                              std::string(CheckResultName(result_)) + ")");
  }
  if (whistleblower == config_.solver) {
    return InvalidArgument("challenge: a solver cannot challenge its own unit");
  }
  const uint64_t segments = SegmentCount(config_.inner_steps, config_.checkpoint_interval);
  if (claim.segment >= segments || claim.start_proof.index != claim.segment ||
      claim.end_proof.index != claim.segment + 1ull ||
      claim.start_proof.leaf_count != segments + 1 || claim.end_proof.leaf_count != segments + 1 ||
      !MerkleVerify(config_.commitment, claim.start, claim.start_proof) ||
      !MerkleVerify(config_.commitment, claim.solver_end, claim.end_proof)) {
    return InvalidArgument("challenge: the claim's states are not the solver's committed states "
                           "of segment " + std::to_string(claim.segment));
  }
  ML_ASSIGN_OR_RETURN(DisputeGame g,
                      DisputeGame::Create(DisputeOver(whistleblower, claim.segment, claim.start,
                                                      claim.solver_end, claim.replayed_end,
                                                      height)));
  dispute_ = std::move(g);
  whistleblower_ = whistleblower;
  challenger_ = -1;
  stage_ = CheckStage::kCheckDisputed;
  result_ = CheckResult::kCheckPending;
  reason_ = "whistleblower " + whistleblower.ShortHex() + " challenged segment " +
            std::to_string(claim.segment);
  return Status::Ok();
}

Result<CheckEffects> UnitCheck::OnResultDisproved(const NodeId& prover, uint64_t height,
                                                  const std::optional<NodeId>& payee) {
  if (stage_ == CheckStage::kCheckSettled && result_ != CheckResult::kCheckClean &&
      result_ != CheckResult::kCheckUnchecked) {
    return FailedPrecondition("result of " + config_.unit.ToString() + ": the unit is already "
                              "being re-run (" + std::string(CheckResultName(result_)) + ")");
  }
  if (prover == config_.solver) {
    return InvalidArgument("result: a solver cannot disprove its own unit");
  }
  CheckEffects fx;
  Append(fx.slash, config_.solver);
  // A bounty, capped by what the solver's slash took (ApplyEffects): a solver whose stake an
  // earlier slash emptied, with a second node of its own disproving a result it made wrong on
  // purpose, would otherwise be paid a whole slash from the jackpot per unit.
  fx.bounty = payee;
  fx.rerun_unit = true;
  fx.settled = true;
  dispute_.reset();
  whistleblower_.reset();
  merits_deadline_.reset();
  challenger_ = -1;
  stage_ = CheckStage::kCheckSettled;
  result_ = CheckResult::kCheckFraud;
  reason_ = "the committed result is not the delta of the committed final state (shown by " +
            prover.ShortHex() + " at height " + std::to_string(height) + ")";
  return fx;
}

Status UnitCheck::SetTilePhase(uint32_t num_operators, std::vector<uint64_t> operator_tiles,
                               std::vector<uint32_t> operator_blocks) {
  if (num_operators == 0 || num_operators > kMaxTileOperators ||
      operator_tiles.size() != num_operators || operator_blocks.size() != num_operators) {
    return InvalidArgument("tile phase for " + config_.unit.ToString() + ": " +
                           std::to_string(operator_tiles.size()) + " tile counts and " +
                           std::to_string(operator_blocks.size()) + " block counts for " +
                           std::to_string(num_operators) + " operators (1.." +
                           std::to_string(kMaxTileOperators) + ", one of each per operator)");
  }
  if (config_.tolerance) {
    return FailedPrecondition("tile phase for " + config_.unit.ToString() +
                              ": a tolerance-mode unit is not bisected; its disputes go to the "
                              "referee whole");
  }
  if (!config_.operator_tiles.empty()) {
    if (config_.num_operators == num_operators && config_.operator_tiles == operator_tiles &&
        config_.operator_blocks == operator_blocks) {
      return Status::Ok();
    }
    return AlreadyExists("tile phase for " + config_.unit.ToString() +
                         ": a different plan was set already");
  }
  config_.num_operators = num_operators;
  config_.operator_tiles = std::move(operator_tiles);
  config_.operator_blocks = std::move(operator_blocks);
  return Status::Ok();
}

Bytes UnitCheck::Encode() const {
  Encoder e;
  const UnitCheckConfig& c = config_;
  const bool v2 = !c.operator_tiles.empty();
  e.PutU8(v2 ? kUnitCheckEncodingVersionTiles : kUnitCheckEncodingVersion);
  e.PutHash(c.unit.task).PutU32(c.unit.round).PutU32(c.unit.shard).PutPublicKey(c.solver);
  e.PutHash(c.result).PutHash(c.commitment).PutU64(c.inner_steps).PutU64(c.checkpoint_interval);
  e.PutU32(c.num_operators).PutHash(c.secret_anchor).PutU64(c.secret_distance);
  e.PutU64(c.forced_error_per_million);
  e.PutHash(c.assignment_beacon).PutU64(c.commit_height).PutU64(c.commit_blocks);
  e.PutU64(c.reveal_blocks).PutU64(c.dispute_response_blocks).PutU32(c.verifiers_per_unit);
  e.PutBool(c.tolerance).PutU64(c.referee_blocks);
  if (v2) {
    e.PutU32(static_cast<uint32_t>(c.operator_tiles.size()));
    for (uint64_t t : c.operator_tiles) e.PutU64(t);
    e.PutU32(static_cast<uint32_t>(c.operator_blocks.size()));
    for (uint32_t b : c.operator_blocks) e.PutU32(b);
  }
  e.PutU8(static_cast<uint8_t>(stage_)).PutU8(static_cast<uint8_t>(result_)).PutString(reason_);
  e.PutU32(static_cast<uint32_t>(verifiers_.size()));
  for (size_t i = 0; i < verifiers_.size(); ++i) {
    const VerdictSlot& s = slots_[i];
    e.PutPublicKey(verifiers_[i]);
    e.PutBool(s.commitment.has_value());
    if (s.commitment) e.PutHash(*s.commitment);
    e.PutU8(s.verdict ? static_cast<uint8_t>(*s.verdict) : 0);
    e.PutU32(s.segment).PutHash(s.start).PutHash(s.solver_end).PutHash(s.replayed_end);
  }
  e.PutU32(static_cast<uint32_t>(segments_.size()));
  for (uint32_t s : segments_) e.PutU32(s);
  e.PutU64(deadline_);
  e.PutBool(secret_.has_value());
  if (secret_) e.PutHash(*secret_);
  e.PutBool(forced_).PutBool(forced_form_ok_);
  e.PutBool(dispute_.has_value());
  if (dispute_) e.PutBytes(dispute_->Encode());
  e.PutI64(challenger_);
  e.PutBool(whistleblower_.has_value());
  if (whistleblower_) e.PutPublicKey(*whistleblower_);
  // The challengers that lost by silence, only when there are any or the merits window follows
  // (then the list may be empty); then the merits window's deadline, only while it is open. A
  // check with neither encodes exactly as before (state hashes unchanged).
  std::vector<uint32_t> silent;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].lost_by_silence) silent.push_back(static_cast<uint32_t>(i));
  }
  if (!silent.empty() || merits_deadline_) {
    e.PutU32(static_cast<uint32_t>(silent.size()));
    for (uint32_t i : silent) e.PutU32(i);
  }
  if (merits_deadline_) e.PutU64(*merits_deadline_);
  return e.Take();
}

Result<UnitCheck> UnitCheck::Decode(ByteSpan bytes) {
  Decoder d(bytes);
  uint8_t version = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "check.version"));
  if (version != kUnitCheckEncodingVersion && version != kUnitCheckEncodingVersionTiles) {
    return InvalidArgument("unit check: unknown encoding version " + std::to_string(version));
  }
  UnitCheckConfig c;
  ML_RETURN_IF_ERROR(d.GetHash(&c.unit.task, "check.unit.task"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.unit.round, "check.unit.round"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.unit.shard, "check.unit.shard"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c.solver, "check.solver"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.result, "check.result"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.commitment, "check.commitment"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.inner_steps, "check.inner_steps"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.checkpoint_interval, "check.checkpoint_interval"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.num_operators, "check.num_operators"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.secret_anchor, "check.secret_anchor"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.secret_distance, "check.secret_distance"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.forced_error_per_million, "check.forced_error_per_million"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.assignment_beacon, "check.assignment_beacon"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.commit_height, "check.commit_height"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.commit_blocks, "check.commit_blocks"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.reveal_blocks, "check.reveal_blocks"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.dispute_response_blocks, "check.dispute_response_blocks"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.verifiers_per_unit, "check.verifiers_per_unit"));
  ML_RETURN_IF_ERROR(d.GetBool(&c.tolerance, "check.tolerance"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.referee_blocks, "check.referee_blocks"));
  if (version == kUnitCheckEncodingVersionTiles) {
    uint32_t n = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&n, "check.operator_tiles", kMaxTileOperators, 8));
    c.operator_tiles.resize(n);
    for (uint64_t& t : c.operator_tiles) ML_RETURN_IF_ERROR(d.GetU64(&t, "check.operator_tiles"));
    ML_RETURN_IF_ERROR(d.GetCount(&n, "check.operator_blocks", kMaxTileOperators, 4));
    c.operator_blocks.resize(n);
    for (uint32_t& b : c.operator_blocks) ML_RETURN_IF_ERROR(d.GetU32(&b, "check.operator_blocks"));
    if (c.operator_tiles.empty() || c.operator_tiles.size() != c.num_operators ||
        c.operator_blocks.size() != c.operator_tiles.size()) {
      return InvalidArgument(
          "unit check: version 2 needs one tile count and one block count "
          "per operator");
    }
  }
  ML_ASSIGN_OR_RETURN(UnitCheck u, Create(c));
  uint8_t stage = 0, result = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&stage, "check.stage"));
  ML_RETURN_IF_ERROR(d.GetU8(&result, "check.result_kind"));
  if (stage > static_cast<uint8_t>(CheckStage::kCheckSettled) ||
      result > static_cast<uint8_t>(CheckResult::kCheckAbandoned)) {
    return InvalidArgument("unit check: unknown stage or result");
  }
  u.stage_ = static_cast<CheckStage>(stage);
  u.result_ = static_cast<CheckResult>(result);
  ML_RETURN_IF_ERROR(d.GetString(&u.reason_, "check.reason", kMaxReason));
  uint32_t nv = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&nv, "check.verifiers", kMaxVerifiers, 32));
  u.verifiers_.resize(nv);
  u.slots_.resize(nv);
  for (uint32_t i = 0; i < nv; ++i) {
    VerdictSlot& s = u.slots_[i];
    ML_RETURN_IF_ERROR(d.GetPublicKey(&u.verifiers_[i], "check.verifier"));
    bool has = false;
    ML_RETURN_IF_ERROR(d.GetBool(&has, "check.verdict_commitment"));
    if (has) {
      Hash256 h;
      ML_RETURN_IF_ERROR(d.GetHash(&h, "check.verdict_commitment"));
      s.commitment = h;
    }
    uint8_t v = 0;
    ML_RETURN_IF_ERROR(d.GetU8(&v, "check.verdict"));
    if (v > 2) return InvalidArgument("unit check: unknown verdict " + std::to_string(v));
    if (v != 0) s.verdict = static_cast<Verdict>(v);
    ML_RETURN_IF_ERROR(d.GetU32(&s.segment, "check.segment"));
    ML_RETURN_IF_ERROR(d.GetHash(&s.start, "check.start"));
    ML_RETURN_IF_ERROR(d.GetHash(&s.solver_end, "check.solver_end"));
    ML_RETURN_IF_ERROR(d.GetHash(&s.replayed_end, "check.replayed_end"));
  }
  uint32_t ns = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&ns, "check.segments", kMaxSegments, 4));
  u.segments_.resize(ns);
  for (uint32_t& s : u.segments_) ML_RETURN_IF_ERROR(d.GetU32(&s, "check.segment"));
  ML_RETURN_IF_ERROR(d.GetU64(&u.deadline_, "check.deadline"));
  bool has_secret = false;
  ML_RETURN_IF_ERROR(d.GetBool(&has_secret, "check.secret"));
  if (has_secret) {
    Hash256 h;
    ML_RETURN_IF_ERROR(d.GetHash(&h, "check.secret"));
    u.secret_ = h;
  }
  ML_RETURN_IF_ERROR(d.GetBool(&u.forced_, "check.forced"));
  ML_RETURN_IF_ERROR(d.GetBool(&u.forced_form_ok_, "check.forced_form_ok"));
  bool has_dispute = false;
  ML_RETURN_IF_ERROR(d.GetBool(&has_dispute, "check.dispute"));
  if (has_dispute) {
    Bytes g;
    ML_RETURN_IF_ERROR(d.GetBytes(&g, "check.dispute", 1u << 16));
    ML_ASSIGN_OR_RETURN(DisputeGame game, DisputeGame::Decode(g));
    u.dispute_ = std::move(game);
  }
  int64_t ch = 0;
  ML_RETURN_IF_ERROR(d.GetI64(&ch, "check.challenger"));
  if (ch < -1 || ch >= static_cast<int64_t>(nv)) {
    return InvalidArgument("unit check: challenger index out of range");
  }
  u.challenger_ = static_cast<int>(ch);
  bool has_wb = false;
  ML_RETURN_IF_ERROR(d.GetBool(&has_wb, "check.whistleblower"));
  if (has_wb) {
    PublicKey k;
    ML_RETURN_IF_ERROR(d.GetPublicKey(&k, "check.whistleblower"));
    u.whistleblower_ = k;
  }
  if (d.remaining() > 0) {  // the challengers that lost by silence, the merits window (Encode)
    uint32_t n = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&n, "check.lost_by_silence", nv, 4));
    for (uint32_t k = 0; k < n; ++k) {
      uint32_t i = 0;
      ML_RETURN_IF_ERROR(d.GetU32(&i, "check.lost_by_silence"));
      if (i >= nv || u.slots_[i].lost_by_silence) {
        return InvalidArgument("unit check: lost_by_silence slot " + std::to_string(i) +
                               " is out of range or repeated");
      }
      u.slots_[i].lost_by_silence = true;
    }
    if (d.remaining() > 0) {
      uint64_t deadline = 0;
      ML_RETURN_IF_ERROR(d.GetU64(&deadline, "check.merits_deadline"));
      u.merits_deadline_ = deadline;
    }
    if (n == 0 && !u.merits_deadline_) {
      return InvalidArgument("unit check: an empty lost_by_silence list is not encoded");
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());
  if (u.stage_ == CheckStage::kCheckDisputed &&
      (!u.dispute_ || (u.challenger_ < 0 && !u.whistleblower_))) {
    return InvalidArgument("unit check: disputed without a dispute");
  }
  if (u.merits_deadline_ && (u.stage_ != CheckStage::kCheckDisputed || !u.whistleblower_ ||
                             u.dispute_->stage() != DisputeStage::kDisputeResolved)) {
    return InvalidArgument(
        "unit check: a merits window without a resolved whistleblower's dispute");
  }
  if (u.merits_deadline_ && u.dispute_->outcome().defender_honest) {
    // OnMeritsShown would slash the verifiers of a unit whose solver won its dispute.
    return InvalidArgument("unit check: a merits window on a dispute the solver won");
  }
  return u;
}

}  // namespace meshlearn::protocol
