#include "meshlearn/protocol/verification.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "meshlearn/base/merkle.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/draw.h"

namespace meshlearn::protocol {
namespace {

// An Rng keyed by (domain, beacon, unit): every purpose gets its own independent stream.
Rng DrawRng(std::string_view domain, const Hash256& beacon, const UnitId& unit) {
  return Rng(FirstU64(Hasher(domain).Update(beacon).Update(UnitKey(unit)).Finish()));
}

}  // namespace

Status ValidateVerificationParams(const VerificationParams& params) {
  if (params.floor_permille == 0 || params.floor_permille > 1000) {
    return InvalidArgument("verification: floor_permille must be in [1, 1000], got " +
                           std::to_string(params.floor_permille) +
                           " (0 would let a trusted node go unchecked forever)");
  }
  if (params.segments_per_check == 0) {
    return InvalidArgument("verification: segments_per_check must be >= 1, got 0");
  }
  if (params.forced_error_per_million > 1'000'000) {
    return InvalidArgument("verification: forced_error_per_million must be <= 1000000, got " +
                           std::to_string(params.forced_error_per_million));
  }
  return Status::Ok();
}

uint32_t VerificationProbabilityPermille(const Reputation& rep, const VerificationParams& params) {
  if (rep.slashes > 0 || rep.verified_clean < params.trusted_after || rep.clean_streak == 0) {
    return 1000;
  }
  uint64_t p = (1000 + rep.clean_streak - 1) / rep.clean_streak;  // ceil(1000 / streak)
  return static_cast<uint32_t>(std::clamp<uint64_t>(p, params.floor_permille, 1000));
}

bool SelectedForVerification(const Hash256& beacon, const UnitId& unit,
                             uint32_t probability_permille) {
  if (probability_permille >= 1000) return true;
  Rng rng = DrawRng("meshlearn.verify.select", beacon, unit);
  return rng.Uniform(1000) < probability_permille;
}

uint32_t SegmentCount(uint64_t inner_steps, uint64_t checkpoint_interval) {
  if (checkpoint_interval == 0 || inner_steps == 0) return 1;
  return static_cast<uint32_t>((inner_steps + checkpoint_interval - 1) / checkpoint_interval);
}

std::vector<uint32_t> SegmentsToReplay(const Hash256& beacon, const UnitId& unit,
                                       uint32_t num_segments, const VerificationParams& params) {
  uint32_t want = std::min(params.segments_per_check, num_segments);
  std::vector<uint32_t> pool(num_segments);
  for (uint32_t i = 0; i < num_segments; ++i) pool[i] = i;
  // Partial Fisher-Yates: the first `want` entries are a uniform sample without replacement.
  Rng rng = DrawRng("meshlearn.verify.segments", beacon, unit);
  for (uint32_t i = 0; i < want; ++i) {
    uint32_t j = i + static_cast<uint32_t>(rng.Uniform(num_segments - i));
    std::swap(pool[i], pool[j]);
  }
  pool.resize(want);
  std::sort(pool.begin(), pool.end());
  return pool;
}

std::string_view AssuranceName(Assurance a) {
  switch (a) {
    case Assurance::kAssuranceEconomic: return "economic";
    case Assurance::kAssuranceFull: return "full";
    case Assurance::kAssuranceTarget: return "target";
  }
  return "unknown";
}

Status ValidateAssurance(uint8_t kind, uint32_t target_escape_ppm, std::string_view kind_name,
                         std::string_view target_name) {
  if (kind > static_cast<uint8_t>(Assurance::kAssuranceTarget)) {
    return InvalidArgument(std::string(kind_name) +
                           " must be 0 (economic), 1 (full) or 2 (target), got " +
                           std::to_string(kind));
  }
  const bool target = kind == static_cast<uint8_t>(Assurance::kAssuranceTarget);
  if (target && (target_escape_ppm == 0 || target_escape_ppm >= 1'000'000)) {
    return InvalidArgument(std::string(target_name) + " must be in [1, 999999] with " +
                           std::string(kind_name) + " = target, got " +
                           std::to_string(target_escape_ppm) + " (0 would be full: say full)");
  }
  if (!target && target_escape_ppm != 0) {
    return InvalidArgument(std::string(target_name) + " is " + std::to_string(target_escape_ppm) +
                           " but " + std::string(kind_name) + " is " +
                           std::string(AssuranceName(static_cast<Assurance>(kind))) +
                           "; a target belongs to assurance target only");
  }
  return Status::Ok();
}

CheckPlan PlanCheck(const AssuranceLevel& level, const Reputation& rep, uint32_t num_segments,
                    const VerificationParams& params) {
  const uint64_t s = std::max<uint32_t>(num_segments, 1);
  CheckPlan plan{.probability_permille = VerificationProbabilityPermille(rep, params),
                 .segments = static_cast<uint32_t>(std::min<uint64_t>(params.segments_per_check, s))};
  if (level.kind == Assurance::kAssuranceFull) return {.probability_permille = 1000,
                                                        .segments = static_cast<uint32_t>(s)};
  if (level.kind != Assurance::kAssuranceTarget) return plan;
  // Caught with probability p r / (1000 S) >= need / 10^6  <=>  p r 1000 >= need S.
  const uint64_t need = 1'000'000 - std::min<uint64_t>(level.target_escape_ppm, 999'999);
  auto enough = [&] {
    return uint64_t{plan.probability_permille} * plan.segments * 1000 >= need * s;
  };
  if (enough()) return plan;
  // Caught with probability p r / (1000 S): only the product p r matters, so the cheapest plan is
  // the smallest product p r >= need S / 1000 with p <= 1000 and r <= S (not always "raise p
  // first": 46 permille x 64 segments costs less than 1000 x 3 where 40 per mille is needed).
  const uint64_t work = (need * s + 999) / 1000;
  CheckPlan best{.probability_permille = 1000, .segments = static_cast<uint32_t>(s)};
  for (uint64_t r = plan.segments; r <= s; ++r) {
    const uint64_t p = std::max<uint64_t>((work + r - 1) / r, plan.probability_permille);
    if (p > 1000) continue;
    if (p * r < uint64_t{best.probability_permille} * best.segments) {
      best = {.probability_permille = static_cast<uint32_t>(p), .segments = static_cast<uint32_t>(r)};
    }
  }
  return best;
}

uint32_t SegmentEscapePpm(const CheckPlan& plan, uint32_t num_segments) {
  const uint64_t s = std::max<uint32_t>(num_segments, 1);
  const uint64_t caught =
      std::min<uint64_t>(uint64_t{plan.probability_permille} * plan.segments * 1000 / s, 1'000'000);
  return static_cast<uint32_t>(1'000'000 - caught);
}

Hash256 SecretCommitment(const Hash256& secret) {
  // The domain hashed in once, and its state copied: a node's secret chain is 65,536
  // commitments, and setting up the domain was a fifth of each.
  static const Hasher domain("meshlearn.forced.commit");
  Hasher h = domain;
  return h.Update(secret).Finish();
}

bool IsForcedError(const Hash256& secret, const Hash256& beacon, const UnitId& unit,
                   uint32_t per_million) {
  if (per_million == 0) return false;
  Hash256 h = Hasher("meshlearn.forced.draw").Update(secret).Update(beacon).Update(UnitKey(unit))
                  .Finish();
  return Rng(FirstU64(h)).Uniform(1'000'000) < per_million;
}

Hash256 SecretChainElement(const Hash256& seed, uint64_t index) {
  Hash256 x = Hasher("meshlearn.forced.chain").Update(seed).Finish();  // x_L
  for (uint64_t i = kSecretChainLength; i > index; --i) x = SecretCommitment(x);
  return x;
}

Status CheckSecretInChain(const Hash256& secret, const Hash256& anchor, uint64_t distance) {
  if (distance == 0 || distance > kMaxSecretDistance) {
    return InvalidArgument("secret reveal: the secret is " + std::to_string(distance) +
                           " links below the last known one; must be 1.." +
                           std::to_string(kMaxSecretDistance));
  }
  Hash256 x = secret;
  for (uint64_t i = 0; i < distance; ++i) x = SecretCommitment(x);
  if (x != anchor) {
    return PermissionDenied("secret reveal: the secret does not hash to the solver's registered "
                            "secret chain (" + std::to_string(distance) + " links)");
  }
  return Status::Ok();
}

Hash256 ForcedLeaf(const Hash256& secret, const UnitId& unit, uint64_t leaf) {
  return Hasher("meshlearn.forced.leaf").Update(secret).Update(UnitKey(unit)).UpdateU64(leaf)
      .Finish();
}

Hash256 ForcedCommitment(const Hash256& secret, const UnitId& unit, const Hash256& start_leaf,
                         uint64_t num_leaves) {
  std::vector<Hash256> leaves;
  leaves.reserve(num_leaves);
  leaves.push_back(start_leaf);
  for (uint64_t i = 1; i < num_leaves; ++i) leaves.push_back(ForcedLeaf(secret, unit, i));
  return MerkleRoot(leaves);
}

StateDistance Distance(std::span<const float> a, std::span<const float> b) {
  double diff = 0, aa = 0, bb = 0, ab = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = a[i], y = b[i];
    diff += (x - y) * (x - y);
    aa += x * x;
    bb += y * y;
    ab += x * y;
  }
  StateDistance d;
  if (bb > 0) d.rel_l2 = std::sqrt(diff) / std::sqrt(bb);
  else d.rel_l2 = aa > 0 ? INFINITY : 0;
  if (aa > 0 && bb > 0) d.cosine = ab / (std::sqrt(aa) * std::sqrt(bb));
  else d.cosine = (aa == 0 && bb == 0) ? 1 : 0;
  return d;
}

bool WithinTolerance(const StateDistance& d, const ToleranceParams& t) {
  if (t.exact()) return d.rel_l2 == 0 && d.cosine >= 1;
  return d.rel_l2 <= t.max_rel_l2_ppm * 1e-6 && 1.0 - d.cosine <= t.max_cosine_gap_ppb * 1e-9;
}

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kVerdictClean:
      return "clean";
    case Verdict::kVerdictMismatch:
      return "mismatch";
  }
  return "unknown";
}

Hash256 MismatchEvidence(uint32_t segment, const Hash256& replayed_end) {
  return Hasher("meshlearn.verdict.evidence").UpdateU64(segment).Update(replayed_end).Finish();
}

Hash256 VerdictCommitment(Verdict verdict, const Hash256& salt, const NodeId& verifier,
                          const UnitId& unit, const Hash256& evidence) {
  return Hasher("meshlearn.verdict")
      .UpdateU64(static_cast<uint64_t>(verdict))
      .Update(salt)
      .Update(verifier.span())
      .Update(UnitKey(unit))
      .Update(evidence)
      .Finish();
}

Status CheckVerdictReveal(const Hash256& commitment, Verdict verdict, const Hash256& salt,
                          const NodeId& verifier, const UnitId& unit, const Hash256& evidence) {
  if (verdict != Verdict::kVerdictClean && verdict != Verdict::kVerdictMismatch) {
    return InvalidArgument("verdict reveal: unknown verdict " +
                           std::to_string(static_cast<int>(verdict)));
  }
  if (VerdictCommitment(verdict, salt, verifier, unit, evidence) != commitment) {
    return PermissionDenied("verdict reveal: (verdict, salt, evidence) does not open the commitment of " +
                            verifier.ShortHex() + " for unit " + unit.ToString());
  }
  return Status::Ok();
}

}  // namespace meshlearn::protocol
