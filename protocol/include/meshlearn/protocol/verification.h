// Which work gets checked, and the secrets that keep solvers and verifiers honest (DESIGN.md,
// "One task, end to end", steps 6 and 8). Pure functions of their inputs: the ledger evaluates
// them when it builds a block and every follower gets the same answers.
//
// Randomness. Every draw here is keyed by a `beacon`: the hash of a block produced AFTER the
// thing being checked was committed (the ledger passes the hash of the block that follows the
// commit). A solver cannot know, when it commits, whether its unit will be checked or which of
// its k-step segments will be replayed.
//
//   uint32_t p = VerificationProbabilityPermille(node_reputation, params);
//   if (SelectedForVerification(beacon, unit, p)) {
//     std::vector<uint32_t> segs = SegmentsToReplay(beacon, unit, num_segments, params);
//   }
//
// Forced errors (Truebit): before its work a solver commits SecretCommitment(secret). Once the
// assignment's beacon exists, IsForcedError(secret, beacon, unit, rate) says whether this unit
// must carry a deliberately wrong result. Only the solver (who knows the secret) can evaluate it
// before it reveals the secret, after the verdicts are in; verifiers who called a forced error
// clean lose stake, those who caught it share the jackpot, and the solver is not punished.
//
// Verdicts are committed, then revealed (VerdictCommitment), so verifiers cannot copy each other.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

struct VerificationParams {
  // Adaptive sampling (BOINC-style): every unit of a node with fewer than `trusted_after`
  // verified-clean units is checked; after that the probability is about 1 / clean_streak, never
  // below `floor_permille`. A node with slashes is checked always.
  uint64_t trusted_after = 10;
  // 50% (above 1 / streak once the probation is over: a trusted node's units are checked half
  // the time). With one segment of ten replayed, verifiers then spend 5% of the solvers' compute
  // and a solver faking 10% of its steps escapes a 12-unit task with probability 0.75%
  // (economics.h, docs/verification.md "Economics"); at 5% it escaped with 66%.
  uint32_t floor_permille = 500;
  // Segments replayed per checked unit (capped by the unit's segment count).
  uint32_t segments_per_check = 1;
  // Forced errors per 10^6 units (Truebit's "jackpot" frequency). 0 disables them.
  // 1.5%: a rubber-stamp verifier saving a 1/10-unit replay must expect to lose more to a
  // forced error than it saves (economics.h RubberStampGainPerCheck: f > 0.99% at M = 10).
  uint32_t forced_error_per_million = 15000;
};
Status ValidateVerificationParams(const VerificationParams& params);

// Probability (permille, 1..1000) that a unit of a node with reputation `rep` is verified:
//   1000                          if rep.slashes > 0 or rep.verified_clean < trusted_after
//   max(floor, ceil(1000 / streak)) otherwise (streak >= 1)
uint32_t VerificationProbabilityPermille(const Reputation& rep, const VerificationParams& params);

// Whether `unit` is checked: one uniform draw in [0, 1000) from (beacon, unit) is below
// `probability_permille`.
bool SelectedForVerification(const Hash256& beacon, const UnitId& unit,
                             uint32_t probability_permille);

// The segments (0 .. num_segments-1) of a checked unit to replay: min(segments_per_check,
// num_segments) distinct indices drawn from (beacon, unit), sorted. Segment j replays from the
// state hashed after step j*k to the one after step min((j+1)*k, H).
std::vector<uint32_t> SegmentsToReplay(const Hash256& beacon, const UnitId& unit,
                                       uint32_t num_segments, const VerificationParams& params);

// Number of k-step segments of a unit of H steps (ceil(H / k); 1 when k == 0).
uint32_t SegmentCount(uint64_t inner_steps, uint64_t checkpoint_interval);

// ---- Assurance: what a submitter buys (the task's [network] `assurance`; docs/submitters.md).
// A check replays `segments` of a unit's S segments with probability `probability_permille`, so
// one corrupted segment (a poisoner's single perturbation) is caught with probability
// p r / S and escapes with 1 - p r / S:
//   economic  the reputation-driven rate above and `segments_per_check`: cheating to save
//             compute loses money (economics.h), but a single corrupted segment mostly escapes
//             (at the defaults 1 - 0.5 x 1/10 = 95% for a trusted node);
//   full      every unit, every segment (p = 1000, r = S): nothing escapes a check;
//   target    the cheapest p and r (least p x r) with 1 - p r / S <= target_escape_ppm / 10^6
//             (never below what economic would check).
enum class Assurance : uint8_t {
  kAssuranceEconomic = 0,
  kAssuranceFull = 1,
  kAssuranceTarget = 2,
};
std::string_view AssuranceName(Assurance a);  // "economic" | "full" | "target"
struct AssuranceLevel {
  Assurance kind = Assurance::kAssuranceEconomic;
  uint32_t target_escape_ppm = 0;  // target: 1..999999 (10^6 x the escape probability); else 0
};
// InvalidArgument naming the field (`kind_name`, `target_name`: how the caller's reader spells
// them) for a byte that is no Assurance, a target out of range, a target given with another kind.
Status ValidateAssurance(uint8_t kind, uint32_t target_escape_ppm,
                         std::string_view kind_name = "assurance",
                         std::string_view target_name = "target_escape_ppm");
struct CheckPlan {
  uint32_t probability_permille = 0;  // SelectedForVerification
  uint32_t segments = 0;              // segments a check replays (SegmentsToReplay), 1..S
};
// How a unit of a solver with reputation `rep` and `num_segments` segments is checked under
// `level`: the one derivation the ledger (which draws) and `task quote` (which prices) use.
CheckPlan PlanCheck(const AssuranceLevel& level, const Reputation& rep, uint32_t num_segments,
                    const VerificationParams& params);
// 10^6 x the probability that one corrupted segment of a unit checked by `plan` escapes its
// check: 10^6 - floor(10^6 p r / (1000 S)).
uint32_t SegmentEscapePpm(const CheckPlan& plan, uint32_t num_segments);

// ---- Forced errors.
// A node's secrets form a hash chain fixed before it does any work: x_L from a private seed,
// x_{i-1} = SecretCommitment(x_i); it registers the head x_0. Its i-th committed unit (i >= 1, in
// commit order) uses x_i, revealed after that unit's verdicts are committed. Revealing x_i
// reveals every x_j with j < i, never one with j > i.
Hash256 SecretCommitment(const Hash256& secret);
inline constexpr uint64_t kSecretChainLength = 1u << 16;  // units one registration can commit
// x_index of the chain grown from `seed` (index 0 = the head), for index <= kSecretChainLength.
Hash256 SecretChainElement(const Hash256& seed, uint64_t index);
// OK iff applying SecretCommitment `distance` times (1..kMaxSecretDistance) to `secret` gives
// `anchor`, i.e. `secret` sits `distance` links below a chain element already known.
inline constexpr uint64_t kMaxSecretDistance = 4096;
Status CheckSecretInChain(const Hash256& secret, const Hash256& anchor, uint64_t distance);
// Whether the solver must commit a wrong result for `unit`, given the beacon of its assignment.
bool IsForcedError(const Hash256& secret, const Hash256& beacon, const UnitId& unit,
                   uint32_t per_million);
// What a forced error commits. Every committed state after the start is replaced:
// leaf 0 stays the true start state, leaf i >= 1 becomes ForcedLeaf(secret, unit, i), so every
// k-step segment a verifier replays ends somewhere else than the committed leaf, and the
// commitment is ForcedCommitment(...) over `num_leaves` = SegmentCount + 1 leaves. When the
// secret is revealed anyone can check that a forced unit really carried its error (a solver
// that commits honest work when forced could otherwise get honest verifiers slashed). The
// delta (the unit's result) stays honest, so the round's aggregate is not harmed.
Hash256 ForcedLeaf(const Hash256& secret, const UnitId& unit, uint64_t leaf);
Hash256 ForcedCommitment(const Hash256& secret, const UnitId& unit, const Hash256& start_leaf,
                         uint64_t num_leaves);

// ---- Tolerance mode (per task), for hardware without bitwise reproducibility.
// Exact mode (the default, both fields 0) compares state hashes. In tolerance mode a verifier
// compares its replayed end state with the solver's committed one (whose hash must still be the
// committed leaf) and calls it clean when the relative L2 distance ||a - b|| / ||b|| is at most
// max_rel_l2_ppm / 10^6 AND the cosine similarity is at least 1 - max_cosine_gap_ppb / 10^9.
// The thresholds are profiled when the task is submitted (ProfileTolerance in node/).
struct ToleranceParams {
  uint32_t max_rel_l2_ppm = 0;
  uint32_t max_cosine_gap_ppb = 0;
  bool exact() const { return max_rel_l2_ppm == 0 && max_cosine_gap_ppb == 0; }
};
struct StateDistance {
  double rel_l2 = 0;  // ||a - b|| / ||b||, 0 when both are zero
  double cosine = 1;  // <a, b> / (||a|| ||b||), 1 when both are zero
};
// In double precision, summed in index order: every machine computes the same distance.
// REQUIRES: a.size() == b.size().
StateDistance Distance(std::span<const float> a, std::span<const float> b);
bool WithinTolerance(const StateDistance& d, const ToleranceParams& t);

// ---- Commit-reveal verdicts.
enum class Verdict : uint8_t {
  kVerdictClean = 1,     // replayed hashes equal the committed ones
  kVerdictMismatch = 2,  // a replayed hash differs: opens a dispute
};
std::string_view VerdictName(Verdict v);
// What a mismatch verdict commits to besides the verdict: the segment and the state hash the
// verifier's replay produced. Binding it into the commitment stops a lazy verifier from
// committing "mismatch" blind and revealing a copy of another verifier's published claim.
Hash256 MismatchEvidence(uint32_t segment, const Hash256& replayed_end);
// Binds the verdict (and, for a mismatch, its evidence; zero for clean) to the verifier, the unit
// and a random salt; revealed later with the salt.
Hash256 VerdictCommitment(Verdict verdict, const Hash256& salt, const NodeId& verifier,
                          const UnitId& unit, const Hash256& evidence = Hash256{});
// OK iff (verdict, salt, evidence) opens `commitment` for this verifier and unit.
Status CheckVerdictReveal(const Hash256& commitment, Verdict verdict, const Hash256& salt,
                          const NodeId& verifier, const UnitId& unit,
                          const Hash256& evidence = Hash256{});

}  // namespace meshlearn::protocol
