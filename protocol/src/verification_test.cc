#include "meshlearn/protocol/verification.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "meshlearn/base/merkle.h"

namespace meshlearn::protocol {
namespace {

UnitId Unit(uint32_t round, uint32_t shard) { return UnitId{Blake2b("task"), round, shard}; }

Reputation Trusted(uint64_t streak) {
  Reputation r;
  r.verified_clean = 100;
  r.completed = 100;
  r.clean_streak = streak;
  return r;
}

TEST(VerificationTest, ProbabilityIsOneForNewAndSlashedNodes) {
  VerificationParams p;
  EXPECT_EQ(VerificationProbabilityPermille(Reputation{}, p), 1000u);
  Reputation almost = Trusted(50);
  almost.verified_clean = p.trusted_after - 1;
  EXPECT_EQ(VerificationProbabilityPermille(almost, p), 1000u);
  Reputation slashed = Trusted(50);
  slashed.slashes = 1;
  EXPECT_EQ(VerificationProbabilityPermille(slashed, p), 1000u);
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(0), p), 1000u);
}

TEST(VerificationTest, ProbabilityFallsAsOneOverStreakToTheFloor) {
  VerificationParams p;
  p.floor_permille = 50;
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(1), p), 1000u);
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(4), p), 250u);
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(3), p), 334u);  // ceil(1000 / 3)
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(20), p), 50u);
  EXPECT_EQ(VerificationProbabilityPermille(Trusted(1000000), p), 50u);  // never below the floor
}

TEST(VerificationTest, SelectionFrequencyMatchesTheProbability) {
  Hash256 beacon = Blake2b("block 17");
  for (uint32_t p : {50u, 250u, 700u}) {
    int selected = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) selected += SelectedForVerification(beacon, Unit(i / 100, i % 100), p);
    double rate = static_cast<double>(selected) / n;
    EXPECT_NEAR(rate, p / 1000.0, 0.02) << "p=" << p;
  }
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(SelectedForVerification(beacon, Unit(0, i), 1000));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(SelectedForVerification(beacon, Unit(0, i), 0));
}

TEST(VerificationTest, SelectionDependsOnTheBeaconAndIsDeterministic) {
  int same = 0;
  for (uint32_t i = 0; i < 1000; ++i) {
    bool a = SelectedForVerification(Blake2b("beacon a"), Unit(1, i), 500);
    EXPECT_EQ(a, SelectedForVerification(Blake2b("beacon a"), Unit(1, i), 500));
    same += a == SelectedForVerification(Blake2b("beacon b"), Unit(1, i), 500);
  }
  // Independent draws agree about half the time; a selection that ignored the beacon would
  // agree always.
  EXPECT_GT(same, 400);
  EXPECT_LT(same, 600);
}

TEST(VerificationTest, SegmentsAreDistinctSortedAndCoverEverySegment) {
  EXPECT_EQ(SegmentCount(100, 10), 10u);
  EXPECT_EQ(SegmentCount(101, 10), 11u);
  EXPECT_EQ(SegmentCount(100, 0), 1u);
  EXPECT_EQ(SegmentCount(5, 10), 1u);
  VerificationParams p;
  p.segments_per_check = 3;
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < 200; ++i) {
    std::vector<uint32_t> s = SegmentsToReplay(Blake2b("b"), Unit(0, i), 10, p);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
    EXPECT_EQ(std::set<uint32_t>(s.begin(), s.end()).size(), 3u);
    for (uint32_t x : s) {
      EXPECT_LT(x, 10u);
      seen.insert(x);
    }
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(SegmentsToReplay(Blake2b("b"), Unit(0, 0), 2, p).size(), 2u);  // capped
}

TEST(VerificationTest, ForcedErrorsFollowTheRateAndNeedTheSecret) {
  Hash256 secret = Blake2b("solver secret");
  Hash256 beacon = Blake2b("assignment block");
  int forced = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) forced += IsForcedError(secret, beacon, Unit(i / 1000, i % 1000), 10000);
  EXPECT_NEAR(forced / static_cast<double>(n), 0.01, 0.002);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(IsForcedError(secret, beacon, Unit(0, i), 0));
  // Another secret gives other units: knowing the beacon alone does not predict them.
  int differ = 0;
  for (int i = 0; i < 2000; ++i) {
    differ += IsForcedError(secret, beacon, Unit(0, i), 500000) !=
              IsForcedError(Blake2b("other secret"), beacon, Unit(0, i), 500000);
  }
  EXPECT_GT(differ, 800);
  EXPECT_NE(SecretCommitment(secret), SecretCommitment(Blake2b("other secret")));
  EXPECT_NE(SecretCommitment(secret), secret);
  // A forced commitment keeps the true start and replaces every later leaf; it depends on the
  // secret and the unit, so nobody else can forge one before the secret is revealed.
  Hash256 start = Blake2b("start state");
  Hash256 forced_root = ForcedCommitment(secret, Unit(0, 1), start, 5);
  EXPECT_EQ(forced_root, MerkleRoot({start, ForcedLeaf(secret, Unit(0, 1), 1),
                                ForcedLeaf(secret, Unit(0, 1), 2), ForcedLeaf(secret, Unit(0, 1), 3),
                                ForcedLeaf(secret, Unit(0, 1), 4)}));
  EXPECT_NE(forced_root, ForcedCommitment(secret, Unit(0, 2), start, 5));
  EXPECT_NE(forced_root, ForcedCommitment(Blake2b("other secret"), Unit(0, 1), start, 5));
  EXPECT_NE(forced_root, ForcedCommitment(secret, Unit(0, 1), Blake2b("other start"), 5));
}

TEST(VerificationTest, SecretChainRevealsOnlyDownward) {
  const Hash256 seed = Blake2b("node seed");
  const Hash256 head = SecretChainElement(seed, 0);
  const Hash256 x3 = SecretChainElement(seed, 3);
  EXPECT_EQ(SecretCommitment(SecretChainElement(seed, 1)), head);
  EXPECT_TRUE(CheckSecretInChain(x3, head, 3).ok());
  EXPECT_TRUE(CheckSecretInChain(x3, SecretChainElement(seed, 2), 1).ok());
  EXPECT_EQ(CheckSecretInChain(x3, head, 2).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckSecretInChain(Blake2b("guess"), head, 3).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckSecretInChain(x3, x3, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckSecretInChain(x3, head, kMaxSecretDistance + 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_NE(SecretChainElement(Blake2b("another seed"), 0), head);
}

TEST(VerificationTest, VerdictRevealMustOpenTheCommitment) {
  PublicKey v1;
  v1.bytes.fill(1);
  PublicKey v2;
  v2.bytes.fill(2);
  Hash256 salt = Blake2b("salt");
  Hash256 c = VerdictCommitment(Verdict::kVerdictClean, salt, v1, Unit(0, 0));
  EXPECT_TRUE(CheckVerdictReveal(c, Verdict::kVerdictClean, salt, v1, Unit(0, 0)).ok());
  EXPECT_FALSE(CheckVerdictReveal(c, Verdict::kVerdictMismatch, salt, v1, Unit(0, 0)).ok());
  EXPECT_FALSE(CheckVerdictReveal(c, Verdict::kVerdictClean, Blake2b("x"), v1, Unit(0, 0)).ok());
  // Copying another verifier's commitment does not let the copier reveal it.
  EXPECT_FALSE(CheckVerdictReveal(c, Verdict::kVerdictClean, salt, v2, Unit(0, 0)).ok());
  EXPECT_FALSE(CheckVerdictReveal(c, Verdict::kVerdictClean, salt, v1, Unit(0, 1)).ok());
  EXPECT_EQ(CheckVerdictReveal(c, static_cast<Verdict>(7), salt, v1, Unit(0, 0)).code(),
            StatusCode::kInvalidArgument);
}

TEST(VerificationTest, ParamsAreValidated) {
  EXPECT_TRUE(ValidateVerificationParams({}).ok());
  VerificationParams p;
  p.floor_permille = 0;
  EXPECT_FALSE(ValidateVerificationParams(p).ok());
  p = {};
  p.segments_per_check = 0;
  EXPECT_FALSE(ValidateVerificationParams(p).ok());
  p = {};
  p.forced_error_per_million = 1'000'001;
  EXPECT_FALSE(ValidateVerificationParams(p).ok());
}

TEST(VerificationTest, ToleranceComparesStatesByRelativeL2AndCosine) {
  std::vector<float> b = {1, 2, 3, 4};
  std::vector<float> a = b;
  StateDistance same = Distance(a, b);
  EXPECT_EQ(same.rel_l2, 0);
  EXPECT_DOUBLE_EQ(same.cosine, 1);
  ToleranceParams exact;
  EXPECT_TRUE(exact.exact());
  EXPECT_TRUE(WithinTolerance(same, exact));
  a[3] = 4.0001f;  // a last-bit-scale difference: relative L2 ~ 1.8e-5
  StateDistance near = Distance(a, b);
  EXPECT_GT(near.rel_l2, 1e-5);
  EXPECT_LT(near.rel_l2, 2e-5);
  EXPECT_FALSE(WithinTolerance(near, exact));
  EXPECT_TRUE(WithinTolerance(near, {.max_rel_l2_ppm = 100, .max_cosine_gap_ppb = 1000}));
  EXPECT_FALSE(WithinTolerance(near, {.max_rel_l2_ppm = 10, .max_cosine_gap_ppb = 1000}));
  // Same direction, twice as long: cosine 1, but the L2 test catches it.
  std::vector<float> twice = {2, 4, 6, 8};
  StateDistance scaled = Distance(twice, b);
  EXPECT_NEAR(scaled.cosine, 1, 1e-12);
  EXPECT_NEAR(scaled.rel_l2, 1, 1e-12);
  EXPECT_FALSE(WithinTolerance(scaled, {.max_rel_l2_ppm = 1000, .max_cosine_gap_ppb = 1000000}));
  // Opposite direction fails the cosine test.
  std::vector<float> neg = {-1, -2, -3, -4};
  EXPECT_LT(Distance(neg, b).cosine, 0);
  std::vector<float> zero(4, 0.0f);
  EXPECT_TRUE(WithinTolerance(Distance(zero, zero), exact));
}

// ---- Assurance levels.

TEST(AssuranceTest, EconomicIsTheReputationRateAndFullReplaysEverySegment) {
  VerificationParams p;  // floor 500, one segment a check
  const AssuranceLevel economic;
  const AssuranceLevel full{.kind = Assurance::kAssuranceFull};
  // A trusted node at the floor, a unit of 10 segments: half its units, one segment each, so one
  // corrupted segment escapes with 1 - 0.5 x 1/10 = 95% (the noisy solver).
  CheckPlan e = PlanCheck(economic, Trusted(50), 10, p);
  EXPECT_EQ(e.probability_permille, 500u);
  EXPECT_EQ(e.segments, 1u);
  EXPECT_EQ(SegmentEscapePpm(e, 10), 950'000u);
  // A new node: every unit, still one segment.
  EXPECT_EQ(SegmentEscapePpm(PlanCheck(economic, Reputation{}, 10, p), 10), 900'000u);
  for (const Reputation& rep : {Reputation{}, Trusted(1), Trusted(50)}) {
    CheckPlan f = PlanCheck(full, rep, 10, p);
    EXPECT_EQ(f.probability_permille, 1000u);
    EXPECT_EQ(f.segments, 10u);
    EXPECT_EQ(SegmentEscapePpm(f, 10), 0u);
  }
  // One segment a unit: economic at the floor catches it half the time, full always.
  EXPECT_EQ(SegmentEscapePpm(PlanCheck(economic, Trusted(50), 1, p), 1), 500'000u);
  EXPECT_EQ(SegmentEscapePpm(PlanCheck(full, Trusted(50), 1, p), 1), 0u);
}

TEST(AssuranceTest, TargetIsTheCheapestPlanThatMeetsIt) {
  VerificationParams p;
  for (uint32_t target : {1u, 10'000u, 50'000u, 100'000u, 500'000u, 940'000u, 960'000u, 999'999u}) {
    for (uint32_t segments : {1u, 3u, 10u, 64u}) {
      for (const Reputation& rep : {Reputation{}, Trusted(2), Trusted(50)}) {
        const AssuranceLevel level{.kind = Assurance::kAssuranceTarget, .target_escape_ppm = target};
        const CheckPlan plan = PlanCheck(level, rep, segments, p);
        const CheckPlan economic = PlanCheck(AssuranceLevel{}, rep, segments, p);
        SCOPED_TRACE(testing::Message() << "target " << target << " S " << segments << " streak "
                                        << rep.clean_streak);
        EXPECT_LE(SegmentEscapePpm(plan, segments), target);
        // Never less than economic checks.
        EXPECT_GE(plan.probability_permille * plan.segments,
                  economic.probability_permille * economic.segments);
        EXPECT_GE(plan.segments, 1u);
        EXPECT_LE(plan.segments, segments);
        EXPECT_GE(plan.probability_permille, economic.probability_permille);
        EXPECT_GE(plan.segments, economic.segments);
        // Cheapest among the plans that check at least as often and as much as economic (a new
        // node's every unit stays checked: that is what stops a lazy solver): any cheaper one
        // misses the target.
        if (plan.probability_permille * plan.segments >
            economic.probability_permille * economic.segments) {
          const uint64_t work = uint64_t{plan.probability_permille} * plan.segments;
          for (uint32_t r = economic.segments; r <= segments; ++r) {
            const uint32_t pr = static_cast<uint32_t>(std::min<uint64_t>((work - 1) / r, 1000));
            if (pr < economic.probability_permille) continue;
            EXPECT_GT(SegmentEscapePpm({.probability_permille = pr, .segments = r}, segments),
                      target)
                << "p " << pr << " r " << r << " costs less and meets the target";
          }
        }
      }
    }
  }
  // At the defaults (trusted, S = 10): 1% needs 99% of the units replayed whole; 50% needs every
  // unit and 5 of its 10 segments (or half the units whole: the same work; fewer segments win).
  const CheckPlan one = PlanCheck({.kind = Assurance::kAssuranceTarget, .target_escape_ppm = 10'000},
                                  Trusted(50), 10, p);
  EXPECT_EQ(one.probability_permille, 990u);
  EXPECT_EQ(one.segments, 10u);
  const CheckPlan half = PlanCheck(
      {.kind = Assurance::kAssuranceTarget, .target_escape_ppm = 500'000}, Trusted(50), 10, p);
  EXPECT_EQ(half.probability_permille, 1000u);
  EXPECT_EQ(half.segments, 5u);
}

TEST(AssuranceTest, ValidateNamesTheField) {
  EXPECT_TRUE(ValidateAssurance(0, 0).ok());
  EXPECT_TRUE(ValidateAssurance(1, 0).ok());
  EXPECT_TRUE(ValidateAssurance(2, 10'000).ok());
  Status bad_kind = ValidateAssurance(3, 0);
  EXPECT_NE(bad_kind.message().find("assurance must be"), std::string::npos) << bad_kind.ToString();
  for (uint32_t t : {0u, 1'000'000u}) {
    Status s = ValidateAssurance(2, t);
    EXPECT_NE(s.message().find("target_escape_ppm must be in [1, 999999]"), std::string::npos) << s.ToString();
  }
  Status stray = ValidateAssurance(1, 5);
  EXPECT_NE(stray.message().find("target belongs to assurance target"), std::string::npos) << stray.ToString();
  EXPECT_EQ(AssuranceName(Assurance::kAssuranceFull), "full");
}

}  // namespace
}  // namespace meshlearn::protocol
