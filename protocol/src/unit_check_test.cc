#include "meshlearn/protocol/unit_check.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "meshlearn/base/encoding.h"

namespace meshlearn::protocol {
namespace {

NodeId NodeOfByte(uint8_t b) {
  NodeId n;
  n.bytes.fill(b);
  return n;
}

const NodeId kSolver = NodeOfByte(1);
const NodeId kV1 = NodeOfByte(2), kV2 = NodeOfByte(3), kV3 = NodeOfByte(4), kWhistle = NodeOfByte(9);
const Hash256 kSecret = Blake2b("solver secret 17");

// The replay of one segment from a state: an honest run's next leaf is Replay(previous).
Hash256 Replay(const Hash256& from) { return Hasher("replay").Update(from).Finish(); }

// What the solver's committed states are: 0 honest, 1 lazy (they do not follow from each other),
// 2 a forced error (verification.h ForcedCommitment). Tests pass `true`/`false` for lazy.
constexpr int kForced = 2;
const UnitId kUnit{Blake2b("task"), 3, 1};

// Leaves after steps 0, 5, 10, 15, 20 (H = 20, k = 5: 4 segments).
std::vector<Hash256> Leaves(int work) {
  std::vector<Hash256> l = {Blake2b("global weights")};
  for (int i = 0; i < 4; ++i) {
    if (work == kForced) {
      l.push_back(ForcedLeaf(kSecret, kUnit, static_cast<uint64_t>(i) + 1));
    } else {
      l.push_back(work ? Hasher("lazy").Update(l.back()).Finish() : Replay(l.back()));
    }
  }
  return l;
}
const Hash256 kStart = Leaves(0)[0];

UnitCheckConfig CheckTestConfig(int work, uint64_t forced_per_million = 0) {
  UnitCheckConfig c;
  c.unit = kUnit;
  c.solver = kSolver;
  c.result = Blake2b("delta");
  c.commitment = MerkleRoot(Leaves(work));
  c.inner_steps = 20;
  c.checkpoint_interval = 5;
  c.num_operators = 8;
  c.secret_anchor = SecretCommitment(kSecret);
  c.secret_distance = 1;
  c.forced_error_per_million = forced_per_million;
  c.assignment_beacon = Blake2b("assignment block");
  c.commit_height = 100;
  c.commit_blocks = 3;
  c.reveal_blocks = 3;
  c.dispute_response_blocks = 2;
  c.verifiers_per_unit = 2;
  return c;
}

MismatchClaim ClaimFor(int lazy, uint32_t segment, const Hash256* replayed = nullptr) {
  std::vector<Hash256> l = Leaves(lazy);
  MismatchClaim c;
  c.segment = segment;
  c.start = l[segment];
  c.start_proof = MerkleProve(l, segment);
  c.solver_end = l[segment + 1];
  c.end_proof = MerkleProve(l, segment + 1);
  c.replayed_end = replayed ? *replayed : Replay(l[segment]);
  return c;
}

struct Verifier {
  NodeId id;
  Verdict verdict;
  Hash256 salt;
};

// Selection with both verifiers drawn from three candidates at probability 1.
UnitCheck Selected(const UnitCheckConfig& cfg) {
  auto c = UnitCheck::Create(cfg);
  CHECK(c.ok()) << c.status().ToString();
  std::vector<NodeId> candidates = {kV1, kV2, kV3, kSolver};
  auto fx = c->OnBeacon(Blake2b("block 101"), 1000, candidates, VerificationParams{}, 101);
  CHECK(fx.ok()) << fx.status().ToString();
  return std::move(*c);
}

// The evidence a verdict commits to: for a mismatch, the claim RunWindows reveals.
Hash256 EvidenceOf(Verdict v, int lazy, const UnitCheck& c) {
  if (v != Verdict::kVerdictMismatch) return Hash256{};
  MismatchClaim claim = ClaimFor(lazy, c.segments()[0]);
  return MismatchEvidence(claim.segment, claim.replayed_end);
}

Hash256 EvidenceOf(const MismatchClaim& m) { return MismatchEvidence(m.segment, m.replayed_end); }

// Commits at 102, reveals at 105 (the reveal window is 105..107), secret revealed at 106: with
// everything revealed, the reveal window closes early, at block 106 (a dispute starts there).
CheckEffects RunWindows(UnitCheck& c, int lazy, const std::vector<Verdict>& verdicts,
                        bool reveal_secret = true) {
  for (size_t i = 0; i < c.verifiers().size() && i < verdicts.size(); ++i) {
    Hash256 salt = Blake2b("salt " + std::to_string(i));
    EXPECT_TRUE(c.OnVerdictCommitted(c.verifiers()[i],
                                     VerdictCommitment(verdicts[i], salt, c.verifiers()[i],
                                                       c.config().unit,
                                                       EvidenceOf(verdicts[i], lazy, c)),
                                     102).ok());
  }
  CheckEffects all;
  auto merge = [&](const CheckEffects& fx) {
    all.slash.insert(all.slash.end(), fx.slash.begin(), fx.slash.end());
    all.failures.insert(all.failures.end(), fx.failures.begin(), fx.failures.end());
    all.jackpot_winners.insert(all.jackpot_winners.end(), fx.jackpot_winners.begin(),
                               fx.jackpot_winners.end());
    all.pay_verifiers.insert(all.pay_verifiers.end(), fx.pay_verifiers.begin(),
                             fx.pay_verifiers.end());
    all.rewarded.insert(all.rewarded.end(), fx.rewarded.begin(), fx.rewarded.end());
    all.solver_clean |= fx.solver_clean;
    all.rerun_unit |= fx.rerun_unit;
    all.settled |= fx.settled;
  };
  for (uint64_t h = 102; h <= 105; ++h) merge(*c.OnBlock(h, false));  // the commit window closes
  EXPECT_EQ(c.stage(), CheckStage::kCheckRevealVerdicts);
  for (size_t i = 0; i < c.verifiers().size() && i < verdicts.size(); ++i) {
    Hash256 salt = Blake2b("salt " + std::to_string(i));
    MismatchClaim claim = ClaimFor(lazy, c.segments()[0]);
    Status s = c.OnVerdictRevealed(c.verifiers()[i], verdicts[i], salt,
                                   verdicts[i] == Verdict::kVerdictMismatch ? &claim : nullptr, 105);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  if (reveal_secret) {
    EXPECT_TRUE(c.OnSecretRevealed(kSecret, kStart, 106).ok());
  }
  for (uint64_t h = 106; h <= 108 && c.stage() == CheckStage::kCheckRevealVerdicts; ++h) {
    merge(*c.OnBlock(h, false));  // the reveal window closes
  }
  return all;
}

bool Has(const std::vector<NodeId>& v, const NodeId& n) {
  return std::find(v.begin(), v.end(), n) != v.end();
}

// The check's dispute at block *h: the defender posts its first answer and the challenger never
// does. Plays blocks until the dispute's deadline has passed or the check left that challenger's
// dispute; returns the effects of that block, and *h is the next block.
CheckEffects ChallengerFallsSilent(UnitCheck& c, uint64_t* h) {
  const NodeId challenger = c.dispute()->config().challenger;
  const DisputeQuery q = c.mutable_dispute()->query();
  EXPECT_TRUE(
      c.mutable_dispute()->Post(DisputeParty::kDefender, q.position, Blake2b("t"), *h).ok());
  CheckEffects effects;
  for (; *h <= q.deadline_height + 1; ++*h) {
    effects = *c.OnBlock(*h, false);
    if (c.stage() != CheckStage::kCheckDisputed || c.dispute()->config().challenger != challenger) {
      break;
    }
  }
  ++*h;
  return effects;
}

// The check's dispute at block h: the challenger posts its first answer and the defender never
// does. Plays at most 10 blocks until the check ends; returns the effects of the last one.
CheckEffects DefenderFallsSilent(UnitCheck& c, uint64_t h) {
  const DisputeQuery q = c.mutable_dispute()->query();
  EXPECT_TRUE(
      c.mutable_dispute()->Post(DisputeParty::kChallenger, q.position, Blake2b("t"), h).ok());
  CheckEffects effects;
  for (const uint64_t end = h + 10; c.stage() == CheckStage::kCheckDisputed && h <= end; ++h) {
    effects = *c.OnBlock(h, false);
  }
  return effects;
}

// Full or target assurance (wait_for_verifier): a pool holding only the solver draws nobody and
// the check keeps waiting for a later beacon; once there is a verifier, the draw happens. Without
// it the same pool is accepted unchecked.
TEST(UnitCheckTest, AnEmptyPoolWaitsForAVerifierWhenTheTaskBoughtReplays) {
  auto c = UnitCheck::Create(CheckTestConfig(false));
  ASSERT_TRUE(c.ok());
  const std::vector<NodeId> only_solver = {kSolver};
  auto fx = c->OnBeacon(Blake2b("b101"), 1000, only_solver, {}, 101, /*wait_for_verifier=*/true);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_FALSE(fx->settled);
  EXPECT_EQ(c->stage(), CheckStage::kCheckAwaitingBeacon);
  EXPECT_TRUE(c->verifiers().empty());
  const std::vector<NodeId> with_v1 = {kSolver, kV1};
  ASSERT_TRUE(c->OnBeacon(Blake2b("b140"), 1000, with_v1, {}, 140, true).ok());
  EXPECT_EQ(c->stage(), CheckStage::kCheckCommitVerdicts);
  EXPECT_EQ(c->verifiers(), std::vector<NodeId>{kV1});

  auto economic = UnitCheck::Create(CheckTestConfig(false));
  ASSERT_TRUE(economic.ok());
  ASSERT_TRUE(economic->OnBeacon(Blake2b("b101"), 1000, only_solver, {}, 101).ok());
  EXPECT_EQ(economic->stage(), CheckStage::kCheckCommitVerdicts);  // the unchecked path
  EXPECT_TRUE(economic->verifiers().empty());
}

// A window closes at the block where nothing more can happen in it, not at its deadline: the
// commit window once every verifier committed (and no earlier secret of the solver is still
// sealed), the reveal window once every verdict and the secret are in.
TEST(UnitCheckTest, WindowsCloseEarlyOnceEverythingIsIn) {
  UnitCheck c = Selected(CheckTestConfig(false));  // commit window 102..104
  ASSERT_EQ(c.verifiers().size(), 2u);
  const NodeId v0 = c.verifiers()[0], v1 = c.verifiers()[1];
  const Hash256 s0 = Blake2b("s0"), s1 = Blake2b("s1");
  auto commit = [&](const NodeId& v, const Hash256& salt, uint64_t h) {
    return c.OnVerdictCommitted(
        v, VerdictCommitment(Verdict::kVerdictClean, salt, v, c.config().unit), h);
  };
  ASSERT_TRUE(commit(v0, s0, 102).ok());
  ASSERT_TRUE(c.OnBlock(102, true).ok());
  EXPECT_EQ(c.stage(), CheckStage::kCheckCommitVerdicts);  // v1 has not committed
  ASSERT_TRUE(commit(v1, s1, 103).ok());
  UnitCheck sealed = c;  // an earlier secret of the solver still awaits verdicts
  ASSERT_TRUE(sealed.OnBlock(103, false).ok());
  EXPECT_EQ(sealed.stage(), CheckStage::kCheckCommitVerdicts);
  EXPECT_EQ(sealed.OnSecretRevealed(kSecret, kStart, 104).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.OnBlock(103, true).ok());
  ASSERT_EQ(c.stage(), CheckStage::kCheckRevealVerdicts);
  EXPECT_EQ(c.deadline_height(), 106u);  // a full reveal window from the early close
  EXPECT_EQ(commit(v0, s0, 104).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.OnVerdictRevealed(v0, Verdict::kVerdictClean, s0, nullptr, 104).ok());
  ASSERT_TRUE(c.OnVerdictRevealed(v1, Verdict::kVerdictClean, s1, nullptr, 104).ok());
  CheckEffects fx = *c.OnBlock(104, true);
  EXPECT_FALSE(fx.settled);  // the secret is missing
  ASSERT_TRUE(c.OnSecretRevealed(kSecret, kStart, 105).ok());
  fx = *c.OnBlock(105, true);
  EXPECT_TRUE(fx.settled);
  EXPECT_EQ(c.result(), CheckResult::kCheckClean) << c.reason();
  EXPECT_EQ(fx.pay_verifiers.size(), 2u);
  EXPECT_TRUE(fx.failures.empty());

  // Not selected: nobody commits, so the reveal window opens at the first block.
  auto u = UnitCheck::Create(CheckTestConfig(false));
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE(u->OnBeacon(Blake2b("b"), 0, std::vector<NodeId>{kV1}, {}, 101).ok());
  ASSERT_TRUE(u->OnBlock(102, true).ok());
  ASSERT_EQ(u->stage(), CheckStage::kCheckRevealVerdicts);
  ASSERT_TRUE(u->OnSecretRevealed(kSecret, kStart, 103).ok());
  fx = *u->OnBlock(103, true);
  EXPECT_TRUE(fx.settled);
  EXPECT_EQ(u->result(), CheckResult::kCheckUnchecked);
}

TEST(UnitCheckTest, UnselectedUnitIsAcceptedUnchecked) {
  auto c = UnitCheck::Create(CheckTestConfig(false));
  ASSERT_TRUE(c.ok());
  std::vector<NodeId> candidates = {kV1, kV2};
  ASSERT_TRUE(c->OnBeacon(Blake2b("b"), 0, candidates, {}, 101).ok());
  EXPECT_TRUE(c->verifiers().empty());
  // Its secret is revealed in the same window as a checked unit's (after the commit window).
  EXPECT_EQ(c->stage(), CheckStage::kCheckCommitVerdicts);
  EXPECT_EQ(c->OnSecretRevealed(kSecret, kStart, 102).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->OnBlock(105, false).ok());
  EXPECT_EQ(c->stage(), CheckStage::kCheckRevealVerdicts);
  ASSERT_TRUE(c->OnSecretRevealed(kSecret, kStart, 105).ok());
  auto fx = c->OnBlock(108, false);
  ASSERT_TRUE(fx.ok());
  EXPECT_TRUE(fx->settled);
  EXPECT_EQ(c->result(), CheckResult::kCheckUnchecked);
  EXPECT_TRUE(fx->slash.empty());
  EXPECT_FALSE(fx->solver_clean);
}

TEST(UnitCheckTest, HonestWorkIsCleanAndVerifiersArePaid) {
  UnitCheck c = Selected(CheckTestConfig(false));
  ASSERT_EQ(c.verifiers().size(), 2u);
  EXPECT_FALSE(Has(c.verifiers(), kSolver));
  ASSERT_EQ(c.segments().size(), 1u);
  CheckEffects fx = RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  EXPECT_EQ(c.result(), CheckResult::kCheckClean) << c.reason();
  EXPECT_TRUE(fx.solver_clean);
  EXPECT_TRUE(fx.slash.empty());
  EXPECT_EQ(fx.pay_verifiers.size(), 2u);
}

TEST(UnitCheckTest, LazySolverLosesTheDisputeAndTheRubberStampIsSlashedWithIt) {
  UnitCheck c = Selected(CheckTestConfig(true));
  // verifiers()[0] replays honestly and finds the mismatch; [1] approves without running.
  CheckEffects fx = RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed) << c.reason();
  const NodeId honest = c.verifiers()[0], stamp = c.verifiers()[1];
  DisputeGame* g = c.mutable_dispute();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->config().first_step, uint64_t{c.segments()[0]} * 5);
  EXPECT_EQ(g->config().defender, kSolver);
  EXPECT_EQ(g->config().challenger, honest);
  // The lazy solver cannot defend its claim and stops answering; the challenger posts.
  DisputeQuery q = g->query();
  ASSERT_TRUE(g->Post(DisputeParty::kChallenger, q.position, Blake2b("true"), 107).ok());
  CheckEffects end;
  for (uint64_t h = 107; h <= q.deadline_height + 1 && c.stage() == CheckStage::kCheckDisputed; ++h) {
    end = *c.OnBlock(h, false);
  }
  ASSERT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(Has(end.slash, kSolver));
  EXPECT_TRUE(Has(end.slash, stamp));
  EXPECT_FALSE(Has(end.slash, honest));
  EXPECT_TRUE(Has(end.rewarded, honest));
  EXPECT_TRUE(end.rerun_unit);
  EXPECT_FALSE(end.solver_clean);
  (void)fx;
}

TEST(UnitCheckTest, LyingVerifierLosesAndTheHonestSolverIsNeverSlashed) {
  // A verifier claims honest work replays to a made-up state.
  UnitCheck d = Selected(CheckTestConfig(false));
  Hash256 salt = Blake2b("liar salt");
  const NodeId liar = d.verifiers()[0];
  Hash256 fake = Blake2b("made up");
  MismatchClaim claim = ClaimFor(false, d.segments()[0], &fake);
  ASSERT_TRUE(d.OnVerdictCommitted(liar, VerdictCommitment(Verdict::kVerdictMismatch, salt, liar,
                                                           d.config().unit, EvidenceOf(claim)),
                                   102).ok());
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(d.OnBlock(h, false).ok());
  ASSERT_TRUE(d.OnVerdictRevealed(liar, Verdict::kVerdictMismatch, salt, &claim, 105).ok());
  ASSERT_TRUE(d.OnSecretRevealed(kSecret, kStart, 105).ok());
  ASSERT_TRUE(d.OnBlock(106, false).ok());  // everything is revealed: the window closes early
  ASSERT_EQ(d.stage(), CheckStage::kCheckDisputed);
  // Play the game with the referee: the solver answers truthfully, the liar with its story;
  // here the referee's ruling is the solver's claim at the final transition.
  DisputeGame* g = d.mutable_dispute();
  uint64_t h = 107;
  while (g->stage() == DisputeStage::kDisputeSteps || g->stage() == DisputeStage::kDisputeOperators) {
    DisputeQuery q = g->query();
    Hash256 truth = Hasher("t").UpdateU64(q.stage == DisputeStage::kDisputeSteps).UpdateU64(q.position).Finish();
    ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, truth, h).ok());
    ASSERT_TRUE(g->Post(DisputeParty::kChallenger, q.position,
                        q.position == 0 ? truth : Blake2b("lie"), h).ok());
    ++h;
  }
  ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee);
  ASSERT_TRUE(g->Rule(g->referee_task().defender_output).ok());
  auto fx = d.OnDisputeResolved(h);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(d.result(), CheckResult::kCheckClean);
  EXPECT_TRUE(Has(fx->slash, liar));
  EXPECT_FALSE(Has(fx->slash, kSolver));
  EXPECT_TRUE(fx->solver_clean);
}

TEST(UnitCheckTest, ForcedErrorCatchesTheRubberStampAndSparesTheSolver) {
  // Every unit is a forced error: the solver committed deliberately wrong states.
  UnitCheck c = Selected(CheckTestConfig(kForced, 1'000'000));
  const NodeId honest = c.verifiers()[0], stamp = c.verifiers()[1];
  CheckEffects fx = RunWindows(c, kForced, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckForcedError) << c.reason();
  EXPECT_TRUE(Has(fx.slash, stamp));
  EXPECT_FALSE(Has(fx.slash, honest));
  EXPECT_FALSE(Has(fx.slash, kSolver));
  EXPECT_TRUE(Has(fx.jackpot_winners, honest));
  EXPECT_TRUE(fx.rerun_unit);
}

TEST(UnitCheckTest, AResultShownWrongIsFraudAtAnyStageUntilTheUnitReruns) {
  // Settled clean (the verifiers replayed segments; the delta was never theirs to replay).
  UnitCheck c = Selected(CheckTestConfig(false));
  RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.result(), CheckResult::kCheckClean);
  EXPECT_EQ(c.OnResultDisproved(kSolver, 120).status().code(), StatusCode::kInvalidArgument);
  Result<CheckEffects> fx = c.OnResultDisproved(kWhistle, 120);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_EQ(fx->slash, std::vector<NodeId>{kSolver});  // the verifiers approved their segment only
  // A bounty (capped by what the solver's slash took), not a nominal slash's reward.
  EXPECT_TRUE(fx->rewarded.empty());
  EXPECT_EQ(fx->bounty, kWhistle);
  EXPECT_FALSE(fx->bounty_by_silence);
  EXPECT_TRUE(fx->rerun_unit && fx->settled);
  EXPECT_FALSE(fx->solver_clean);
  // Once the unit re-runs there is nothing left to disprove.
  EXPECT_EQ(c.OnResultDisproved(kV1, 121).status().code(), StatusCode::kFailedPrecondition);
  // Mid-check and mid-dispute: settles at once, the open verdicts and the game are void.
  UnitCheck open = Selected(CheckTestConfig(true));
  fx = open.OnResultDisproved(kV2, 102);
  ASSERT_TRUE(fx.ok());
  EXPECT_EQ(open.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(fx->pay_verifiers.empty() && fx->failures.empty());
  UnitCheck disputed = Selected(CheckTestConfig(true));
  RunWindows(disputed, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(disputed.stage(), CheckStage::kCheckDisputed);
  ASSERT_TRUE(disputed.OnResultDisproved(kV1, 110).ok());
  EXPECT_FALSE(disputed.dispute().has_value());
  EXPECT_EQ(disputed.result(), CheckResult::kCheckFraud);
  Result<UnitCheck> back = UnitCheck::Decode(disputed.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->Encode(), disputed.Encode());
  // A forced error already re-runs the unit.
  UnitCheck forced = Selected(CheckTestConfig(kForced, 1'000'000));
  RunWindows(forced, kForced, {Verdict::kVerdictMismatch, Verdict::kVerdictMismatch});
  ASSERT_EQ(forced.result(), CheckResult::kCheckForcedError);
  EXPECT_EQ(forced.OnResultDisproved(kV1, 120).status().code(), StatusCode::kFailedPrecondition);
}

TEST(UnitCheckTest, ASolverThatHidesItsSecretLosesTheUnitButIsNotSlashed) {
  // An honest solver that crashed after committing looks the same: no slash, a failure, re-run.
  UnitCheck c = Selected(CheckTestConfig(false));
  CheckEffects fx = RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean},
                               /*reveal_secret=*/false);
  EXPECT_EQ(c.result(), CheckResult::kCheckAbandoned);
  EXPECT_TRUE(fx.slash.empty());
  EXPECT_TRUE(Has(fx.failures, kSolver));
  EXPECT_TRUE(fx.rerun_unit);
  EXPECT_EQ(fx.pay_verifiers.size(), 2u);
}

TEST(UnitCheckTest, HidingTheSecretDoesNotDodgeADispute) {
  UnitCheck c = Selected(CheckTestConfig(true));
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean},
             /*reveal_secret=*/false);
  EXPECT_EQ(c.stage(), CheckStage::kCheckDisputed);
}

// An honest solver drawn for a forced error that crashed through its reveal window: the
// verifiers' mismatch starts a dispute it cannot win (its leaves are forced by design). Its late
// secret, during the dispute, settles the check as the forced error it is: nobody slashed, the
// catchers rewarded, the solver a failure for being late (chaos seed 50 with rounds in flight).
// A late secret of a unit that was not forced leaves the dispute to decide.
TEST(UnitCheckTest, ALateSecretDuringTheDisputeSettlesAForcedError) {
  UnitCheck c = Selected(CheckTestConfig(kForced, 1'000'000));
  const NodeId catcher = c.verifiers()[0], stamp = c.verifiers()[1];
  RunWindows(c, kForced, {Verdict::kVerdictMismatch, Verdict::kVerdictClean},
             /*reveal_secret=*/false);
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  ASSERT_TRUE(c.OnSecretRevealed(kSecret, kStart, 110).ok());
  EXPECT_EQ(c.OnSecretRevealed(kSecret, kStart, 110).code(), StatusCode::kAlreadyExists);
  Result<CheckEffects> fx = c.OnBlock(111, false);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckForcedError) << c.reason();
  EXPECT_FALSE(c.dispute().has_value());
  EXPECT_FALSE(Has(fx->slash, kSolver));
  EXPECT_TRUE(Has(fx->slash, stamp));
  EXPECT_TRUE(Has(fx->jackpot_winners, catcher));
  EXPECT_TRUE(Has(fx->failures, kSolver));
  EXPECT_TRUE(fx->rerun_unit && fx->settled);
  Result<UnitCheck> back = UnitCheck::Decode(c.Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), c.Encode());

  UnitCheck lazy = Selected(CheckTestConfig(true));
  RunWindows(lazy, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean},
             /*reveal_secret=*/false);
  ASSERT_EQ(lazy.stage(), CheckStage::kCheckDisputed);
  ASSERT_TRUE(lazy.OnSecretRevealed(kSecret, kStart, 110).ok());
  // Not forced: the game goes on, and the silent defender loses it at its deadline.
  for (uint64_t h = 110; h < 130 && lazy.stage() == CheckStage::kCheckDisputed; ++h) {
    ASSERT_TRUE(lazy.OnBlock(h, false).ok());
  }
  EXPECT_EQ(lazy.result(), CheckResult::kCheckFraud) << lazy.reason();
}

// Selected, and both verifiers silent: each counts a failure, and the unit is not accepted
// unchecked (nobody replayed it: chaos seed 9) but runs again; its solver is not at fault.
TEST(UnitCheckTest, SilentVerifiersCountFailuresAndTheUnitRunsAgain) {
  UnitCheck c = Selected(CheckTestConfig(false));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  Hash256 salt = Blake2b("s");
  // a commits but never reveals; b never commits.
  ASSERT_TRUE(c.OnVerdictCommitted(a, VerdictCommitment(Verdict::kVerdictClean, salt, a, c.config().unit), 102).ok());
  CheckEffects all;
  for (uint64_t h = 102; h <= 108; ++h) {
    CheckEffects fx = *c.OnBlock(h, false);
    if (h == 105) {
      ASSERT_TRUE(c.OnSecretRevealed(kSecret, kStart, h).ok());
    }
    all.failures.insert(all.failures.end(), fx.failures.begin(), fx.failures.end());
    all.rerun_unit |= fx.rerun_unit;
    all.pay_verifiers.insert(all.pay_verifiers.end(), fx.pay_verifiers.begin(),
                             fx.pay_verifiers.end());
  }
  EXPECT_TRUE(Has(all.failures, a));
  EXPECT_TRUE(Has(all.failures, b));
  EXPECT_FALSE(Has(all.failures, kSolver));
  EXPECT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckAbandoned) << c.reason();
  EXPECT_TRUE(all.rerun_unit);
  EXPECT_TRUE(all.pay_verifiers.empty());
}

TEST(UnitCheckTest, ABlindMismatchCannotRevealACopiedClaim) {
  // A lazy verifier commits "mismatch" without replaying, hoping to copy another verifier's
  // claim once it is published: its commitment does not bind that claim, so the reveal fails.
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId lazy = c.verifiers()[1];
  Hash256 salt = Blake2b("salt");
  ASSERT_TRUE(c.OnVerdictCommitted(lazy, VerdictCommitment(Verdict::kVerdictMismatch, salt, lazy,
                                                           c.config().unit), 102).ok());
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(c.OnBlock(h, false).ok());
  MismatchClaim copied = ClaimFor(true, c.segments()[0]);
  EXPECT_EQ(c.OnVerdictRevealed(lazy, Verdict::kVerdictMismatch, salt, &copied, 105).code(),
            StatusCode::kPermissionDenied);
}

TEST(UnitCheckTest, BadRevealsAreRefused) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId v = c.verifiers()[0];
  Hash256 salt = Blake2b("salt");
  MismatchClaim claim = ClaimFor(true, c.segments()[0]);
  ASSERT_TRUE(c.OnVerdictCommitted(v, VerdictCommitment(Verdict::kVerdictMismatch, salt, v,
                                                        c.config().unit, EvidenceOf(claim)),
                                   102).ok());
  // Too early: the commit window is open (copying would be possible).
  EXPECT_EQ(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &claim, 102).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.OnSecretRevealed(kSecret, kStart, 102).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.OnVerdictCommitted(NodeOfByte(77), Blake2b("x"), 102).code(), StatusCode::kPermissionDenied);
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(c.OnBlock(h, false).ok());
  EXPECT_FALSE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, Blake2b("wrong"), &claim, 105).ok());
  EXPECT_FALSE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, nullptr, 105).ok());
  MismatchClaim bad = claim;
  bad.solver_end = Blake2b("not committed");
  EXPECT_FALSE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &bad, 105).ok());
  // A claim about another segment than the committed evidence does not open the commitment.
  MismatchClaim other = ClaimFor(true, (c.segments()[0] + 1) % 4);
  EXPECT_FALSE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &other, 105).ok());
  EXPECT_EQ(c.OnSecretRevealed(Blake2b("not the secret"), kStart, 105).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &claim, 105).ok());
  EXPECT_EQ(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &claim, 105).code(),
            StatusCode::kAlreadyExists);
}

TEST(UnitCheckTest, WhistleblowerChallengesACleanVerdict) {
  // Lazy work approved by rubber stamps only.
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.result(), CheckResult::kCheckClean);
  MismatchClaim claim = ClaimFor(true, 3);  // any segment may be challenged
  EXPECT_FALSE(c.OnChallenge(kSolver, claim, 110).ok());
  MismatchClaim bad = claim;
  bad.start = Blake2b("x");
  EXPECT_FALSE(c.OnChallenge(kWhistle, bad, 110).ok());
  ASSERT_TRUE(c.OnChallenge(kWhistle, claim, 110).ok());
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  DisputeGame* g = c.mutable_dispute();
  EXPECT_EQ(g->config().challenger, kWhistle);
  // Both play to the referee, which rules the solver's step wrong.
  uint64_t h = 111;
  while (g->stage() == DisputeStage::kDisputeSteps || g->stage() == DisputeStage::kDisputeOperators) {
    DisputeQuery q = g->query();
    Hash256 truth = Hasher("t").UpdateU64(q.stage == DisputeStage::kDisputeSteps).UpdateU64(q.position).Finish();
    ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position,
                        q.position == 0 ? truth : Blake2b("lazy"), h).ok());
    ASSERT_TRUE(g->Post(DisputeParty::kChallenger, q.position, truth, h).ok());
    ++h;
  }
  ASSERT_EQ(g->stage(), DisputeStage::kDisputeReferee);
  ASSERT_TRUE(g->Rule(g->referee_task().challenger_output).ok());
  Result<CheckEffects> fx = c.OnDisputeResolved(h);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(Has(fx->slash, kSolver));
  EXPECT_TRUE(Has(fx->slash, a));
  EXPECT_TRUE(Has(fx->slash, b));
  EXPECT_EQ(fx->bounty, kWhistle);  // won by a ruling: the whole bounty
  EXPECT_FALSE(fx->bounty_by_silence);
  EXPECT_FALSE(Has(fx->slash, kWhistle));
}

// Chaos seed 561: a lying whistleblower challenged honest work settled clean and the solver,
// killed mid-dispute, missed its turn. The solver loses by its silence, but nothing was ruled
// about its work, so the verifier that called it clean is not slashed.
TEST(UnitCheckTest, ASolverSilentInAWhistleblowerDisputeCostsItsVerifiersNothing) {
  UnitCheck c = Selected(CheckTestConfig(false));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.result(), CheckResult::kCheckClean);
  Hash256 fake = Blake2b("a replay that never happened");
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(false, 2, &fake), 110).ok());
  const CheckEffects fx = DefenderFallsSilent(c, 111);
  ASSERT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(Has(fx.slash, kSolver));  // it lost by the rules
  EXPECT_FALSE(Has(fx.slash, a));
  EXPECT_FALSE(Has(fx.slash, b));
  EXPECT_TRUE(fx.rerun_unit);
  // A win by silence alone is paid only what the solver's slash put into the jackpot (the
  // ledger's share), so a whistleblower and a solver in league gain nothing by it.
  EXPECT_EQ(fx.bounty, kWhistle);
  EXPECT_TRUE(fx.bounty_by_silence);
  EXPECT_TRUE(fx.rewarded.empty());
}

// The check's whistleblower dispute at block h: the whistleblower posts its first answer and the
// solver never does. Plays blocks until the solver's silent loss opens the merits window; returns
// the next block.
uint64_t SolverFallsSilentUntilMerits(UnitCheck& c, uint64_t h) {
  const DisputeQuery q = c.mutable_dispute()->query();
  EXPECT_TRUE(
      c.mutable_dispute()->Post(DisputeParty::kChallenger, q.position, Blake2b("t"), h).ok());
  for (const uint64_t end = h + 10; !c.awaits_merits() && h <= end; ++h) {
    const CheckEffects fx = *c.OnBlock(h, false);
    EXPECT_FALSE(fx.settled);
    EXPECT_TRUE(fx.slash.empty());
  }
  return h;
}

// A lazy solver caught by a whistleblower falls silent on purpose to spare the verifiers that
// approved its unit without replaying. Its silence no longer settles the check: in the merits
// window the whistleblower shows the disputed segment false (the ledger's replay of its
// witness), and the rubber stamps are slashed with the solver; the whistleblower gets the bounty.
TEST(UnitCheckTest, ALazySolverFallingSilentCannotSpareItsRubberStampsOnceTheMeritsAreShown) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.result(), CheckResult::kCheckClean);
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 2), 110).ok());
  const uint64_t h = SolverFallsSilentUntilMerits(c, 111);
  ASSERT_TRUE(c.awaits_merits());
  EXPECT_EQ(c.stage(), CheckStage::kCheckDisputed);  // the round stays held
  EXPECT_EQ(c.merits_deadline(), h - 1 + c.config().dispute_response_blocks);
  // The window is kept between blocks.
  Result<UnitCheck> stored = UnitCheck::Decode(c.Encode());
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->Encode(), c.Encode());
  EXPECT_EQ(stored->merits_deadline(), c.merits_deadline());
  c = std::move(*stored);
  // Another segment, or the solver itself, is refused, changing nothing.
  EXPECT_EQ(c.OnMeritsShown(kWhistle, 1, h).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.OnMeritsShown(kSolver, 2, h).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.awaits_merits());
  Result<CheckEffects> fx = c.OnMeritsShown(kWhistle, 2, h);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_TRUE(fx->settled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_FALSE(c.awaits_merits());
  EXPECT_TRUE(Has(fx->slash, kSolver));
  EXPECT_TRUE(Has(fx->slash, a));
  EXPECT_TRUE(Has(fx->slash, b));
  EXPECT_FALSE(Has(fx->slash, kWhistle));
  EXPECT_EQ(fx->bounty, kWhistle);
  EXPECT_FALSE(fx->bounty_by_silence);
  EXPECT_TRUE(fx->rerun_unit);
  EXPECT_EQ(c.OnMeritsShown(kWhistle, 2, h).status().code(), StatusCode::kFailedPrecondition);
}

// A whistleblower in league with a lazy solver challenges its unit first and lets it fall
// silent, so that the rubber stamps keep their stake and an honest whistleblower can no longer
// challenge the unit. Any other node may show the merits in the window: the stamps are slashed
// and the bounty is the prover's, not the accomplice's (the jackpot's share of the solver's slash:
// the whole of it only to the whistleblower that challenged).
TEST(UnitCheckTest, AnAccompliceWhistleblowerCannotShieldTheRubberStampsOfItsSolver) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  const NodeId honest = NodeOfByte(10);
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 1), 110).ok());
  SolverFallsSilentUntilMerits(c, 111);
  ASSERT_TRUE(c.awaits_merits());
  Result<CheckEffects> fx = c.OnMeritsShown(honest, 1, c.merits_deadline());  // its last block
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_TRUE(Has(fx->slash, kSolver));
  EXPECT_TRUE(Has(fx->slash, a));
  EXPECT_TRUE(Has(fx->slash, b));
  EXPECT_EQ(fx->bounty, honest);
  EXPECT_TRUE(fx->bounty_by_silence);
  EXPECT_FALSE(Has(fx->slash, kWhistle));  // its claim was true
}

// A lazy solver caught by an honest whistleblower falls silent on purpose and shows its own
// merits from a second node (its own, under another owner key): with the whole bounty it would
// get back all its slash took, its fraud free and the whistleblower's bounty its own. Only the
// whistleblower that challenged gets the whole bounty; any other prover the jackpot's share.
TEST(UnitCheckTest, ASilentSolverShowingItsOwnMeritsFromASecondNodeGetsOnlyTheJackpotsShare) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId second = NodeOfByte(11);
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 1), 110).ok());
  const uint64_t h = SolverFallsSilentUntilMerits(c, 111);
  ASSERT_TRUE(c.awaits_merits());
  UnitCheck by_whistleblower = c;
  Result<CheckEffects> fx = c.OnMeritsShown(second, 1, h);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_TRUE(Has(fx->slash, kSolver));
  EXPECT_EQ(fx->bounty, second);
  EXPECT_TRUE(fx->bounty_by_silence);
  // The same merits shown by the whistleblower that challenged: the whole bounty.
  fx = by_whistleblower.OnMeritsShown(kWhistle, 1, h);
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  EXPECT_EQ(fx->bounty, kWhistle);
  EXPECT_FALSE(fx->bounty_by_silence);
}

// The merits window closes: the check settles at the next block as a loss by silence alone (the
// seed-561 case), and a late showing is refused.
TEST(UnitCheckTest, TheMeritsWindowClosesIntoALossBySilenceAlone) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId a = c.verifiers()[0];
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 0), 110).ok());
  SolverFallsSilentUntilMerits(c, 111);
  const uint64_t last = c.merits_deadline();
  CheckEffects fx = *c.OnBlock(last, false);
  EXPECT_FALSE(fx.settled);
  ASSERT_TRUE(c.awaits_merits());
  EXPECT_EQ(c.OnMeritsShown(kWhistle, 0, last + 1).status().code(), StatusCode::kDeadlineExceeded);
  fx = *c.OnBlock(last + 1, false);
  EXPECT_TRUE(fx.settled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_EQ(fx.slash, std::vector<NodeId>{kSolver});
  EXPECT_FALSE(Has(fx.slash, a));
  EXPECT_EQ(fx.bounty, kWhistle);
  EXPECT_TRUE(fx.bounty_by_silence);
  EXPECT_FALSE(c.awaits_merits());
  // Settled checks encode without the window's trailer.
  Result<UnitCheck> back = UnitCheck::Decode(c.Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), c.Encode());
  EXPECT_FALSE(back->awaits_merits());
}

// Where the ledger cannot rule the unit on its merits (a pipeline stage, tolerance mode, no data
// root, a state over the witness bound: ledger::ProveMeritsRefusal), a solver's silence in a
// whistleblower's dispute opens no merits window, which would hold the round for nothing: the
// check settles at the block the solver's turn ends, as the window's end would (the solver
// slashed alone, the whistleblower paid the jackpot's share of its slash).
TEST(UnitCheckTest, ASilentSolverWhoseMeritsCannotBeShownLosesAtOnce) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId a = c.verifiers()[0], b = c.verifiers()[1];
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 1), 110).ok());
  const DisputeQuery q = c.mutable_dispute()->query();
  ASSERT_TRUE(
      c.mutable_dispute()->Post(DisputeParty::kChallenger, q.position, Blake2b("t"), 111).ok());
  CheckEffects fx;
  uint64_t h = 111;
  for (; !fx.settled && h <= q.deadline_height + 1; ++h) {
    fx = *c.OnBlock(h, false, Merits::kMeritsNotShowable);
    EXPECT_FALSE(c.awaits_merits()) << "height " << h;
  }
  ASSERT_TRUE(fx.settled) << c.reason();
  EXPECT_EQ(h - 1, q.deadline_height + 1);  // the first block after the solver's turn
  EXPECT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_EQ(fx.slash, std::vector<NodeId>{kSolver});
  EXPECT_FALSE(Has(fx.slash, a));
  EXPECT_FALSE(Has(fx.slash, b));
  EXPECT_EQ(fx.bounty, kWhistle);
  EXPECT_TRUE(fx.bounty_by_silence);
  EXPECT_TRUE(fx.rerun_unit);
  EXPECT_NE(c.reason().find("its merits cannot be shown on chain"), std::string::npos)
      << c.reason();
  EXPECT_EQ(c.OnMeritsShown(kWhistle, 1, h).status().code(), StatusCode::kFailedPrecondition);
}

// A merits deadline on a check without a whistleblower's resolved dispute is refused; an empty
// silent-loss list with nothing after it too.
TEST(UnitCheckTest, AMeritsWindowIsEncodedOnlyOnAWhistleblowersResolvedDispute) {
  UnitCheck c = Selected(CheckTestConfig(true));
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckSettled);
  const Bytes plain = c.Encode();
  for (bool with_deadline : {true, false}) {
    Encoder e;
    e.PutU32(0);
    if (with_deadline) e.PutU64(120);
    Bytes tampered = plain;
    const Bytes tail = e.Take();
    tampered.insert(tampered.end(), tail.begin(), tail.end());
    EXPECT_FALSE(UnitCheck::Decode(tampered).ok()) << with_deadline;
  }
}

// A stored merits window whose dispute the solver won (a hostile or damaged state: the game's
// bytes swapped for those of a game the whistleblower lost by its silence) is refused: showing
// the merits would slash the verifiers of a unit its solver defended.
TEST(UnitCheckTest, AMeritsWindowOnADisputeTheSolverWonIsRefused) {
  UnitCheck c = Selected(CheckTestConfig(true));
  RunWindows(c, true, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(true, 1), 110).ok());
  UnitCheck won = c;  // the solver posts, the whistleblower never does: the solver wins
  const DisputeQuery q = won.mutable_dispute()->query();
  ASSERT_TRUE(
      won.mutable_dispute()->Post(DisputeParty::kDefender, q.position, Blake2b("s"), 111).ok());
  SolverFallsSilentUntilMerits(c, 111);
  ASSERT_TRUE(c.awaits_merits());
  for (uint64_t h = 111; won.stage() != CheckStage::kCheckSettled && h < 140; ++h) {
    ASSERT_TRUE(won.OnBlock(h, false).ok());
  }
  ASSERT_EQ(won.result(), CheckResult::kCheckClean);
  ASSERT_TRUE(won.dispute().has_value());
  ASSERT_TRUE(won.dispute()->outcome().defender_honest);
  auto field = [](const Bytes& game) {
    Encoder e;
    e.PutBytes(game);
    return e.Take();
  };
  const Bytes lost = field(c.dispute()->Encode()), kept = field(won.dispute()->Encode());
  Bytes bytes = c.Encode();
  auto at = std::search(bytes.begin(), bytes.end(), lost.begin(), lost.end());
  ASSERT_NE(at, bytes.end());
  at = bytes.erase(at, at + static_cast<std::ptrdiff_t>(lost.size()));
  bytes.insert(at, kept.begin(), kept.end());
  Result<UnitCheck> back = UnitCheck::Decode(bytes);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("a dispute the solver won"), std::string::npos)
      << back.status().ToString();
  // The untouched window decodes.
  EXPECT_TRUE(UnitCheck::Decode(c.Encode()).ok());
}

TEST(UnitCheckTest, AFailedWhistleblowerChallengePaysAndSlashesNoVerifierAgain) {
  // Honest work settled clean (both verifiers paid, the solver's streak credited); a
  // whistleblower's challenge fails. Only the whistleblower loses: the verifiers are not paid a
  // second time and the solver's streak is not credited twice.
  UnitCheck c = Selected(CheckTestConfig(false));
  RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  ASSERT_EQ(c.result(), CheckResult::kCheckClean);
  Hash256 fake = Blake2b("made up");
  ASSERT_TRUE(c.OnChallenge(kWhistle, ClaimFor(false, 2, &fake), 110).ok());
  DisputeGame* g = c.mutable_dispute();
  DisputeQuery q = g->query();
  ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, Blake2b("t"), 111).ok());
  CheckEffects fx;
  for (uint64_t h = 111; c.stage() == CheckStage::kCheckDisputed && h < 120; ++h) {
    fx = *c.OnBlock(h, false);
  }
  EXPECT_EQ(c.result(), CheckResult::kCheckClean);
  EXPECT_TRUE(fx.settled);
  EXPECT_EQ(fx.slash, std::vector<NodeId>{kWhistle});
  EXPECT_TRUE(fx.pay_verifiers.empty());
  EXPECT_FALSE(fx.solver_clean);
  EXPECT_FALSE(fx.rerun_unit);
}

TEST(UnitCheckTest, AColludingVerifierCannotShieldACheatInAnotherSegment) {
  // Two segments are replayed. The solver cheated in one; its accomplice, drawn first, claims a
  // mismatch in the other (honest) segment and loses that dispute on purpose. The honest
  // verifier's claim is not refuted by it: it gets its own dispute, and the cheat is caught.
  UnitCheckConfig cfg = CheckTestConfig(false);
  VerificationParams params;
  params.segments_per_check = 2;
  const Hash256 beacon = Blake2b("block 101");
  std::vector<uint32_t> segs = SegmentsToReplay(beacon, cfg.unit, 4, params);
  ASSERT_EQ(segs.size(), 2u);
  const uint32_t honest_seg = segs[0], cheat_seg = segs[1];
  std::vector<Hash256> l = {Blake2b("global weights")};
  for (uint32_t i = 0; i < 4; ++i) {
    l.push_back(i == cheat_seg ? Hasher("lazy").Update(l.back()).Finish() : Replay(l.back()));
  }
  cfg.commitment = MerkleRoot(l);
  auto made = UnitCheck::Create(cfg);
  ASSERT_TRUE(made.ok());
  UnitCheck c = std::move(*made);
  std::vector<NodeId> candidates = {kV1, kV2, kV3};
  ASSERT_TRUE(c.OnBeacon(beacon, 1000, candidates, params, 101).ok());
  ASSERT_EQ(c.segments(), segs);
  const NodeId accomplice = c.verifiers()[0], honest = c.verifiers()[1];
  auto claim = [&](uint32_t seg, const Hash256& replayed) {
    MismatchClaim m;
    m.segment = seg;
    m.start = l[seg];
    m.start_proof = MerkleProve(l, seg);
    m.solver_end = l[seg + 1];
    m.end_proof = MerkleProve(l, seg + 1);
    m.replayed_end = replayed;
    return m;
  };
  MismatchClaim fake = claim(honest_seg, Blake2b("made up"));
  MismatchClaim real = claim(cheat_seg, Replay(l[cheat_seg]));
  const Hash256 s1 = Blake2b("s1"), s2 = Blake2b("s2");
  ASSERT_TRUE(c.OnVerdictCommitted(accomplice, VerdictCommitment(Verdict::kVerdictMismatch, s1,
                                                                 accomplice, cfg.unit,
                                                                 EvidenceOf(fake)), 102).ok());
  ASSERT_TRUE(c.OnVerdictCommitted(honest, VerdictCommitment(Verdict::kVerdictMismatch, s2,
                                                             honest, cfg.unit, EvidenceOf(real)),
                                   102).ok());
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(c.OnBlock(h, false).ok());
  ASSERT_TRUE(c.OnVerdictRevealed(accomplice, Verdict::kVerdictMismatch, s1, &fake, 105).ok());
  ASSERT_TRUE(c.OnVerdictRevealed(honest, Verdict::kVerdictMismatch, s2, &real, 105).ok());
  ASSERT_TRUE(c.OnSecretRevealed(kSecret, kStart, 105).ok());
  ASSERT_TRUE(c.OnBlock(106, false).ok());  // everything is revealed: the window closes early
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  ASSERT_EQ(c.dispute()->config().challenger, accomplice);
  // The accomplice stops answering: the solver wins the first dispute.
  uint64_t h = 107;
  const CheckEffects first = ChallengerFallsSilent(c, &h);
  EXPECT_TRUE(Has(first.slash, accomplice));
  EXPECT_FALSE(Has(first.slash, honest));
  EXPECT_FALSE(first.settled);
  // The second dispute: the honest verifier against the solver, in the cheated segment.
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  EXPECT_EQ(c.dispute()->config().challenger, honest);
  EXPECT_EQ(c.dispute()->config().first_step, uint64_t{cheat_seg} * 5);
  const CheckEffects second = DefenderFallsSilent(c, h);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(Has(second.slash, kSolver));
  EXPECT_TRUE(Has(second.rewarded, honest));
  EXPECT_FALSE(Has(second.slash, honest));
  EXPECT_FALSE(Has(second.pay_verifiers, accomplice));  // slashed already, not paid
  EXPECT_TRUE(second.rerun_unit);
}

// Two verifiers claim the same (true) mismatch in one segment of a lazy solver's unit. The first,
// the challenger, goes silent: the solver wins that dispute by default, which refutes nothing. The
// silent challenger alone is slashed; the other claim gets its own dispute in the same segment and
// catches the cheat (chaos seed 57 slashed an honest verifier here). The check survives an
// encode/decode between the two disputes, and the silent one is never paid.
TEST(UnitCheckTest, AChallengersSilenceRefutesNoOtherClaimInItsSegment) {
  UnitCheck c = Selected(CheckTestConfig(true));
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictMismatch});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed) << c.reason();
  const NodeId silent = c.verifiers()[0], honest = c.verifiers()[1];
  ASSERT_EQ(c.dispute()->config().challenger, silent);
  const uint64_t first_step = c.dispute()->config().first_step;
  uint64_t h = 107;
  const CheckEffects first = ChallengerFallsSilent(c, &h);
  EXPECT_TRUE(Has(first.slash, silent));
  EXPECT_FALSE(Has(first.slash, honest));
  EXPECT_FALSE(Has(first.slash, kSolver));
  EXPECT_FALSE(first.settled);
  EXPECT_FALSE(first.solver_clean);
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  EXPECT_EQ(c.dispute()->config().challenger, honest);
  EXPECT_EQ(c.dispute()->config().first_step, first_step);  // the same segment
  // What the ledger stores between blocks keeps the silent loss.
  Result<UnitCheck> stored = UnitCheck::Decode(c.Encode());
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->Encode(), c.Encode());
  c = std::move(*stored);
  const CheckEffects second = DefenderFallsSilent(c, h);
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud);
  EXPECT_TRUE(Has(second.slash, kSolver));
  EXPECT_TRUE(Has(second.rewarded, honest));
  EXPECT_FALSE(Has(second.slash, honest));
  EXPECT_FALSE(Has(second.slash, silent));         // slashed once, in the first dispute
  EXPECT_FALSE(Has(second.pay_verifiers, silent));  // and never paid
  EXPECT_TRUE(second.rerun_unit);
}

// Both parties post a different hash every turn from block *h until the check's dispute is at the
// referee (a game without operator hashes ends at one whole step); *h is then the next block.
void PlayToTheReferee(UnitCheck& c, uint64_t* h) {
  for (int turn = 0; turn < 20 && c.dispute()->stage() != DisputeStage::kDisputeReferee; ++turn) {
    const uint64_t p = c.mutable_dispute()->query().position;
    const std::string at = std::to_string(p);
    ASSERT_TRUE(c.mutable_dispute()->Post(DisputeParty::kDefender, p, Blake2b("d" + at), *h).ok());
    ASSERT_TRUE(
        c.mutable_dispute()->Post(DisputeParty::kChallenger, p, Blake2b("c" + at), *h).ok());
    ++*h;
  }
  ASSERT_EQ(c.dispute()->stage(), DisputeStage::kDisputeReferee);
}

// A claim that the solver served nothing for a step, answered by its evidence on chain
// (DisputeGame::RuleServed: a pipeline stage over the witness bound), shows nobody wrong: the
// claimant counts a failure, is neither slashed nor paid, and its claim refutes nothing, so the
// other verifier's claim in the segment gets its own dispute; the solver is not slashed, and the
// check that settles clean on served claims alone does not credit its streak (the step is checked
// from the evidence afterwards). The stored check keeps the served claimant's slot.
TEST(UnitCheckTest, AServedClaimSlashesNobodyAndRefutesNoOtherClaimInItsSegment) {
  UnitCheckConfig cfg = CheckTestConfig(true);
  cfg.num_operators = 0;
  UnitCheck c = Selected(cfg);
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictMismatch});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed) << c.reason();
  const NodeId first = c.verifiers()[0], second = c.verifiers()[1];
  ASSERT_EQ(c.dispute()->config().challenger, first);
  const uint64_t first_step = c.dispute()->config().first_step;
  uint64_t h = 107;
  ASSERT_NO_FATAL_FAILURE(PlayToTheReferee(c, &h));
  ASSERT_TRUE(c.mutable_dispute()->RuleServed(true, h).ok());
  const CheckEffects one = *c.OnBlock(h++, false);
  EXPECT_TRUE(Has(one.failures, first));
  EXPECT_TRUE(one.slash.empty());
  EXPECT_FALSE(one.settled);
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  EXPECT_EQ(c.dispute()->config().challenger, second);
  EXPECT_EQ(c.dispute()->config().first_step, first_step);  // the same segment
  Result<UnitCheck> stored = UnitCheck::Decode(c.Encode());
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  c = std::move(*stored);
  ASSERT_NO_FATAL_FAILURE(PlayToTheReferee(c, &h));
  ASSERT_TRUE(c.mutable_dispute()->RuleServed(true, h).ok());
  const CheckEffects two = *c.OnBlock(h, false);
  EXPECT_TRUE(two.settled);
  EXPECT_EQ(c.result(), CheckResult::kCheckClean) << c.reason();
  EXPECT_NE(c.reason().find("served step"), std::string::npos) << c.reason();
  EXPECT_TRUE(Has(two.failures, second));
  EXPECT_TRUE(two.slash.empty());
  EXPECT_TRUE(two.pay_verifiers.empty());
  EXPECT_FALSE(two.solver_clean);
  EXPECT_FALSE(two.rerun_unit);
}

// A check that never had a silent challenger encodes exactly as before the silent-loss list
// existed (no trailer), and a trailer naming a slot out of range or twice is refused.
TEST(UnitCheckTest, TheSilentLossListIsEncodedOnlyWhenThereIsOne) {
  UnitCheck c = Selected(CheckTestConfig(true));
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictMismatch});
  const Bytes plain = c.Encode();
  Result<UnitCheck> back = UnitCheck::Decode(plain);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), plain);
  for (const std::vector<uint32_t>& bad :
       std::vector<std::vector<uint32_t>>{{1, 7}, {2, 0, 0}, {0}}) {
    Encoder e;
    for (uint32_t x : bad) e.PutU32(x);
    Bytes tampered = plain;
    const Bytes tail = e.Take();
    tampered.insert(tampered.end(), tail.begin(), tail.end());
    EXPECT_FALSE(UnitCheck::Decode(tampered).ok()) << bad.size();
  }
}

TEST(UnitCheckTest, AVerifierThatWithholdsItsRevealOnAForcedErrorIsSlashed) {
  // The secret is revealed in the verdicts' reveal window, so a verifier that committed "clean"
  // without replaying could watch for it and stay silent when the unit is forced.
  UnitCheck c = Selected(CheckTestConfig(kForced, 1'000'000));
  const NodeId catcher = c.verifiers()[0], silent = c.verifiers()[1];
  const Hash256 s1 = Blake2b("s1"), s2 = Blake2b("s2");
  MismatchClaim caught = ClaimFor(kForced, c.segments()[0]);
  ASSERT_TRUE(c.OnVerdictCommitted(catcher, VerdictCommitment(Verdict::kVerdictMismatch, s1,
                                                              catcher, c.config().unit,
                                                              EvidenceOf(caught)), 102).ok());
  ASSERT_TRUE(c.OnVerdictCommitted(silent, VerdictCommitment(Verdict::kVerdictClean, s2, silent,
                                                             c.config().unit), 102).ok());
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(c.OnBlock(h, false).ok());
  ASSERT_TRUE(c.OnSecretRevealed(kSecret, kStart, 105).ok());
  MismatchClaim claim = ClaimFor(kForced, c.segments()[0]);
  ASSERT_TRUE(c.OnVerdictRevealed(catcher, Verdict::kVerdictMismatch, s1, &claim, 106).ok());
  CheckEffects fx;
  for (uint64_t h = 106; h <= 108; ++h) {
    CheckEffects e = *c.OnBlock(h, false);
    if (e.settled) fx = e;
  }
  EXPECT_EQ(c.result(), CheckResult::kCheckForcedError);
  EXPECT_TRUE(Has(fx.slash, silent));
  EXPECT_TRUE(Has(fx.jackpot_winners, catcher));
  EXPECT_FALSE(Has(fx.slash, catcher));
  EXPECT_FALSE(Has(fx.slash, kSolver));
}

TEST(UnitCheckTest, EncodeDecodeAtEveryStage) {
  UnitCheck c = Selected(CheckTestConfig(true));
  auto roundtrip = [](const UnitCheck& u) {
    Bytes w = u.Encode();
    auto back = UnitCheck::Decode(w);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->Encode(), w);
    for (size_t cut = 0; cut < w.size(); cut += 13) {
      EXPECT_FALSE(UnitCheck::Decode(ByteSpan(w.data(), cut)).ok());
    }
  };
  roundtrip(c);
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  roundtrip(c);
  auto u = UnitCheck::Create(CheckTestConfig(false));
  ASSERT_TRUE(u.ok());
  roundtrip(*u);
}

// The tile plan set on a check goes into every dispute it opens (a version 2 game), survives the
// encoding (version 2 only with it), is set once, and is refused in tolerance mode.
TEST(UnitCheckTest, TheTilePhaseGoesIntoTheDisputeItOpens) {
  UnitCheck c = Selected(CheckTestConfig(true));
  const Bytes v1 = c.Encode();
  EXPECT_EQ(v1[0], 1);
  const std::vector<uint64_t> tiles = {0, 4, 4, 1, 0, 2, 2, 9};
  const std::vector<uint32_t> blocks = {0, 0, 3, 0, 0, 0, 2, 0};
  EXPECT_EQ(c.SetTilePhase(8, {1, 2}, blocks).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SetTilePhase(0, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(c.has_tile_phase());
  ASSERT_TRUE(c.SetTilePhase(8, tiles, blocks).ok());
  EXPECT_TRUE(c.SetTilePhase(8, tiles, blocks).ok());  // the same plan again
  std::vector<uint64_t> other = tiles;
  other[1] = 5;
  EXPECT_EQ(c.SetTilePhase(8, other, blocks).code(), StatusCode::kAlreadyExists);
  Bytes v2 = c.Encode();
  EXPECT_EQ(v2[0], 2);
  Result<UnitCheck> back = UnitCheck::Decode(v2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Encode(), v2);
  EXPECT_EQ(back->config().operator_tiles, tiles);
  c = std::move(*back);
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  EXPECT_EQ(c.dispute()->config().operator_tiles, tiles);
  EXPECT_EQ(c.dispute()->config().operator_blocks, blocks);
  EXPECT_EQ(c.dispute()->Encode()[0], 2);
  // Tolerance mode bisects nothing.
  UnitCheckConfig tol = CheckTestConfig(false);
  tol.tolerance = true;
  Result<UnitCheck> t = UnitCheck::Create(tol);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->SetTilePhase(8, tiles, blocks).code(), StatusCode::kFailedPrecondition);
  // A version 2 encoding whose plan does not match its operators is refused.
  UnitCheckConfig few = CheckTestConfig(true);
  few.num_operators = 3;
  Result<UnitCheck> f = UnitCheck::Create(few);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->SetTilePhase(3, {1, 1, 1}, {0, 0, 0}).ok());
  Bytes enc = f->Encode();
  // num_operators sits before the plan; make it disagree with the plan's length.
  const size_t at = 1 + 32 + 4 + 4 + 32 + 32 + 32 + 8 + 8;
  ASSERT_EQ(enc[at], 3);
  enc[at] = 4;
  EXPECT_FALSE(UnitCheck::Decode(enc).ok());
}

TEST(UnitCheckTest, PayAndSlashAmounts) {
  EXPECT_EQ(VerifierPay(1000, 1, 4), 250u);
  EXPECT_EQ(VerifierPay(1000, 4, 4), 1000u);
  EXPECT_EQ(VerifierPay(3, 1, 4), 1u);  // at least one token
  EXPECT_EQ(VerifierPay(UINT64_MAX, 3, 3), UINT64_MAX);
  EXPECT_EQ(SlashAmount(1000, 10), 10000u);
  EXPECT_EQ(SlashAmount(UINT64_MAX / 2, 10), UINT64_MAX);
}

// A stage check replays its drawn steps and, to bind the result, the stage's last step: the
// verifier is paid for that one too when it was not drawn, and never twice when it was.
TEST(UnitCheckTest, AStageCheckIsPaidForTheLastStepItReplaysToBindTheResult) {
  const uint32_t kSteps = 10;
  const std::vector<uint32_t> early = {2, 5};      // the last step (9) not drawn
  const std::vector<uint32_t> with_last = {2, 9};  // drawn
  const std::vector<uint32_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(StageStepsReplayed(early, kSteps), 3u);
  EXPECT_EQ(StageStepsReplayed(with_last, kSteps), 2u);
  EXPECT_EQ(StageStepsReplayed(all, kSteps), kSteps);
  EXPECT_EQ(StageStepsReplayed({}, kSteps), 1u);  // a result check alone still replays one step
  EXPECT_EQ(StageStepsReplayed(std::vector<uint32_t>{9, 9}, kSteps), 1u);
  EXPECT_EQ(StageStepsReplayed(early, 0), 0u);
  // The pay of a unit of cost 1000: 3 of 10 steps, not the 2 drawn.
  EXPECT_EQ(VerifierPay(1000, StageStepsReplayed(early, kSteps), kSteps), 300u);
  EXPECT_EQ(VerifierPay(1000, StageStepsReplayed(with_last, kSteps), kSteps), 200u);
  EXPECT_EQ(VerifierPay(1000, StageStepsReplayed(all, kSteps), kSteps), 1000u);  // never more
}

TEST(UnitCheckTest, ASolverThatIgnoresItsForcedErrorCannotGetHonestVerifiersSlashed) {
  // Drawn for a forced error, the solver commits its honest work instead: honest verifiers call
  // it clean. The revealed secret shows the commitment is not the forced one: the solver is the
  // one that broke the protocol, the verifiers are paid.
  UnitCheck c = Selected(CheckTestConfig(false, 1'000'000));
  CheckEffects fx = RunWindows(c, false, {Verdict::kVerdictClean, Verdict::kVerdictClean});
  EXPECT_EQ(c.result(), CheckResult::kCheckFraud) << c.reason();
  EXPECT_TRUE(Has(fx.slash, kSolver));
  EXPECT_EQ(fx.slash.size(), 1u);
  EXPECT_EQ(fx.pay_verifiers.size(), 2u);
  EXPECT_TRUE(fx.rerun_unit);
}

TEST(UnitCheckTest, AMismatchMayNameASegmentThatWasNotDrawn) {
  // The solver served no checkpoint matching its commitment, so the verifier replayed from the
  // unit's start and found the first wrong segment elsewhere.
  UnitCheck c = Selected(CheckTestConfig(true));
  const NodeId v = c.verifiers()[0];
  const uint32_t other_segment = (c.segments()[0] + 1) % 4;
  MismatchClaim claim = ClaimFor(true, other_segment);
  Hash256 salt = Blake2b("salt");
  ASSERT_TRUE(c.OnVerdictCommitted(v, VerdictCommitment(Verdict::kVerdictMismatch, salt, v,
                                                        c.config().unit, EvidenceOf(claim)),
                                   102).ok());
  for (uint64_t h = 102; h <= 105; ++h) ASSERT_TRUE(c.OnBlock(h, false).ok());
  EXPECT_TRUE(c.OnVerdictRevealed(v, Verdict::kVerdictMismatch, salt, &claim, 105).ok());
}

TEST(UnitCheckTest, AnUndecidedDisputeRerunsTheUnitAndPunishesNobody) {
  UnitCheckConfig cfg = CheckTestConfig(true);
  cfg.referee_blocks = 3;
  cfg.num_operators = 0;  // the game ends at a whole step
  UnitCheck c = Selected(cfg);
  RunWindows(c, true, {Verdict::kVerdictMismatch, Verdict::kVerdictClean});
  ASSERT_EQ(c.stage(), CheckStage::kCheckDisputed);
  // Both parties play every turn; the referee never rules.
  uint64_t h = 106;
  while (c.dispute()->stage() == DisputeStage::kDisputeSteps) {
    const DisputeQuery q = c.dispute()->query();
    ++h;
    const uint32_t seg = c.segments()[0];
    ASSERT_TRUE(c.mutable_dispute()->Post(DisputeParty::kDefender, q.position,
                                           Blake2b("d" + std::to_string(q.position)), h).ok());
    ASSERT_TRUE(c.mutable_dispute()->Post(DisputeParty::kChallenger, q.position,
                                           Blake2b("c" + std::to_string(q.position + seg)), h).ok());
  }
  ASSERT_EQ(c.dispute()->stage(), DisputeStage::kDisputeReferee);
  CheckEffects fx;
  for (int i = 0; i < 6 && c.stage() != CheckStage::kCheckSettled; ++i) fx = *c.OnBlock(++h, false);
  ASSERT_EQ(c.stage(), CheckStage::kCheckSettled);
  EXPECT_EQ(c.result(), CheckResult::kCheckAbandoned) << c.reason();
  EXPECT_TRUE(fx.slash.empty());
  EXPECT_TRUE(fx.failures.empty());
  EXPECT_TRUE(fx.rerun_unit);
}

}  // namespace
}  // namespace meshlearn::protocol
