#include "meshlearn/protocol/aggregate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "meshlearn/base/rng.h"

namespace meshlearn::protocol {
namespace {

using Rule = AggregationRule;
constexpr Rule kMean = Rule::kAggregationRuleWeightedMean;
constexpr Rule kTrimmed = Rule::kAggregationRuleTrimmedMean;
constexpr Rule kMedian = Rule::kAggregationRuleMedian;
constexpr Rule kClip = Rule::kAggregationRuleCenteredClip;
constexpr Rule kKrum = Rule::kAggregationRuleKrum;
constexpr Rule kAllRules[] = {kMean, kTrimmed, kMedian, kClip, kKrum};
constexpr Rule kRobustRules[] = {kTrimmed, kMedian, kClip, kKrum};

const TaskId kTask = Blake2b("agg-task");

// Owns the deltas that Contribution spans point into.
struct Deltas {
  std::vector<std::vector<float>> values;
  std::vector<uint64_t> samples;

  void Add(std::vector<float> v, uint64_t s = 1) {
    values.push_back(std::move(v));
    samples.push_back(s);
  }
  std::vector<Contribution> Contributions() const {
    std::vector<Contribution> out;
    for (size_t i = 0; i < values.size(); ++i) {
      out.push_back({UnitId{kTask, 0, static_cast<uint32_t>(i)}, samples[i], values[i]});
    }
    return out;
  }
};

AggregationConfig AggregationTestConfig(Rule rule) {
  AggregationConfig c;
  c.rule = rule;
  return c;
}

std::vector<float> Agg(const Deltas& d, const AggregationConfig& c) {
  auto contribs = d.Contributions();
  auto r = Aggregate(contribs, c);
  EXPECT_TRUE(r.ok()) << AggregationRuleName(c.rule) << ": " << r.status().ToString();
  return r.ok() ? r->delta : std::vector<float>{};
}

TEST(AggregateTest, RuleNamesRoundTrip) {
  for (Rule r : kAllRules) {
    auto parsed = ParseAggregationRule(AggregationRuleName(r));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, r);
  }
  auto bad = ParseAggregationRule("avg");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("trimmed_mean"), std::string::npos);
}

TEST(AggregateTest, WeightedMeanByHand) {
  Deltas d;
  d.Add({1, 2}, 1);
  d.Add({3, 4}, 3);
  // (1x1 + 3x3) / 4 = 2.5, (1x2 + 3x4) / 4 = 3.5
  EXPECT_EQ(Agg(d, AggregationTestConfig(kMean)), (std::vector<float>{2.5f, 3.5f}));
}

TEST(AggregateTest, TrimmedMeanByHand) {
  Deltas d;
  for (float v : {100.f, 2.f, 1.f, 4.f, 3.f}) d.Add({v, -v});
  AggregationConfig c = AggregationTestConfig(kTrimmed);
  c.trim_fraction = 0.2;  // k = 1 of 5 at each end
  // Column 0 sorted: 1 2 3 4 100 -> mean(2, 3, 4) = 3; column 1: -100 -4 -3 -2 -1 -> -3.
  EXPECT_EQ(Agg(d, c), (std::vector<float>{3.f, -3.f}));
  c.trim_fraction = 0.0;  // plain unweighted mean: 110 / 5 = 22
  EXPECT_EQ(Agg(d, c), (std::vector<float>{22.f, -22.f}));
}

TEST(AggregateTest, MedianByHand) {
  Deltas odd;
  for (float v : {5.f, 1.f, 3.f}) odd.Add({v});
  EXPECT_EQ(Agg(odd, AggregationTestConfig(kMedian)), std::vector<float>{3.f});
  Deltas even;
  for (float v : {10.f, 1.f, 3.f, 2.f}) even.Add({v});
  EXPECT_EQ(Agg(even, AggregationTestConfig(kMedian)), std::vector<float>{2.5f});
}

TEST(AggregateTest, CenteredClipByHand) {
  Deltas d;
  for (float v : {0.f, 1.f, 10.f}) d.Add({v});
  AggregationConfig c = AggregationTestConfig(kClip);
  c.clip_radius = 2.0;
  c.clip_iterations = 1;
  // Start at the median 1. Differences -1, 0, 9; the last is clipped to radius 2:
  // v = 1 + (-1 + 0 + 2) / 3 = 4/3.
  EXPECT_EQ(Agg(d, c), std::vector<float>{static_cast<float>(1.0 + 1.0 / 3.0)});
  // Second iteration from 4/3: differences -4/3, -1/3, 26/3 -> clipped 2: sum 1/3, v = 4/3 + 1/9.
  c.clip_iterations = 2;
  EXPECT_EQ(Agg(d, c),
            std::vector<float>{static_cast<float>((1.0 + 1.0 / 3.0) + (1.0 / 3.0) / 3.0)});
}

TEST(AggregateTest, KrumByHand) {
  Deltas d;
  for (float v : {0.f, 1.f, 2.f, 100.f, 101.f}) d.Add({v});
  AggregationConfig c = AggregationTestConfig(kKrum);
  c.krum_byzantine = 1;  // n = 5 >= 2f + 3; score over n - f - 2 = 2 nearest
  // Scores: 0 -> 1 + 4 = 5; 1 -> 1 + 1 = 2; 2 -> 1 + 4 = 5; 100 -> 1 + 9604; 101 -> 1 + 9801.
  auto contribs = d.Contributions();
  auto r = Aggregate(contribs, c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->delta, std::vector<float>{1.f});
  EXPECT_EQ(r->used, std::vector<UnitId>{contribs[1].unit});
  // Multi-Krum with 2: the best (1) and the first of the tie at 5 in canonical order (0).
  c.krum_select = 2;
  EXPECT_EQ(Agg(d, c), std::vector<float>{0.5f});
  // Too few contributions for the assumed f.
  c.krum_byzantine = 2;
  c.krum_select = 1;
  auto too_few = Aggregate(contribs, c);
  EXPECT_EQ(too_few.status().code(), StatusCode::kInvalidArgument);
}

TEST(AggregateTest, RejectsBadInput) {
  EXPECT_FALSE(Aggregate({}, AggregationTestConfig(kMean)).ok());
  Deltas d;
  d.Add({1, 2});
  d.Add({1, 2, 3});
  EXPECT_EQ(Aggregate(d.Contributions(), AggregationTestConfig(kMean)).status().code(),
            StatusCode::kInvalidArgument);
  Deltas dup;
  dup.Add({1});
  dup.Add({2});
  auto c = dup.Contributions();
  c[1].unit = c[0].unit;
  EXPECT_EQ(Aggregate(c, AggregationTestConfig(kMedian)).status().code(), StatusCode::kInvalidArgument);
  Deltas zero;
  zero.Add({1}, 0);
  EXPECT_FALSE(Aggregate(zero.Contributions(), AggregationTestConfig(kMean)).ok());
  AggregationConfig bad = AggregationTestConfig(kTrimmed);
  bad.trim_fraction = 0.5;
  EXPECT_FALSE(ValidateAggregationConfig(bad).ok());
  bad = AggregationTestConfig(kClip);
  bad.clip_iterations = 0;
  EXPECT_FALSE(ValidateAggregationConfig(bad).ok());
}

// Random deltas with some exact ties, zeros of both signs, and wide magnitudes.
Deltas RandomDeltas(uint64_t seed, size_t n, size_t dim) {
  Rng rng(seed);
  Deltas d;
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> v(dim);
    for (size_t j = 0; j < dim; ++j) {
      const uint64_t kind = rng.Uniform(10);
      if (kind == 0) {
        v[j] = (rng.Uniform(2) == 0) ? 0.0f : -0.0f;
      } else if (kind == 1) {
        v[j] = 0.25f;  // ties across contributions
      } else {
        v[j] = static_cast<float>((rng.UniformDouble() - 0.5) * (kind == 2 ? 1e6 : 1.0));
      }
    }
    d.Add(std::move(v), 1 + rng.Uniform(100));
  }
  return d;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(AggregateTest, PerTensorClipAndKrum) {
  // Two tensors of 2 values. Contribution 3 is an outlier only in tensor 1, contribution 0 only
  // in tensor 0; per tensor, Krum avoids each outlier where it is one.
  Deltas d;
  d.Add({100, 100, 1, 1});
  d.Add({1, 1, 1, 1});
  d.Add({1, 1, 1.1f, 1.1f});
  d.Add({1.1f, 1.1f, -100, -100});
  d.Add({1.2f, 1.2f, 1.2f, 1.2f});
  const std::vector<size_t> sizes = {2, 2};
  AggregationConfig c = AggregationTestConfig(kKrum);
  c.krum_byzantine = 1;
  auto contribs = d.Contributions();
  auto per = Aggregate(contribs, c, sizes);
  ASSERT_TRUE(per.ok()) << per.status().ToString();
  for (float x : per->delta) EXPECT_NEAR(x, 1.0, 0.25);
  // Tensor sizes that cut the delta into one piece are the same as none.
  const std::vector<size_t> whole = {4};
  auto one = Aggregate(contribs, c, whole);
  auto none = Aggregate(contribs, c);
  ASSERT_TRUE(one.ok() && none.ok());
  EXPECT_TRUE(BitwiseEqual(one->delta, none->delta));
  // Per-tensor clipping with a radius from each tensor's own distances keeps both outliers out.
  AggregationConfig clip = AggregationTestConfig(kClip);
  auto clipped = Aggregate(contribs, clip, sizes);
  ASSERT_TRUE(clipped.ok());
  for (float x : clipped->delta) EXPECT_NEAR(x, 1.0, 0.5);
  // Sizes must add up to the delta size.
  const std::vector<size_t> bad = {2, 3};
  EXPECT_EQ(Aggregate(contribs, c, bad).status().code(), StatusCode::kInvalidArgument);
  const std::vector<size_t> zero = {4, 0};
  EXPECT_EQ(Aggregate(contribs, c, zero).status().code(), StatusCode::kInvalidArgument);
}

TEST(AggregateTest, BitwiseIndependentOfInputOrder) {
  // 9 contributions sort columns by insertion sort, 40 by std::sort: same contract.
  for (size_t n : {size_t{9}, size_t{40}}) {
    const Deltas d = RandomDeltas(n, n, 257);
    const std::vector<Contribution> base = d.Contributions();
    for (Rule rule : kAllRules) {
      AggregationConfig c = AggregationTestConfig(rule);
      c.krum_select = rule == kKrum ? 3 : 1;
      auto ref = Aggregate(base, c);
      ASSERT_TRUE(ref.ok()) << ref.status().ToString();
      Rng rng(99);
      for (int perm = 0; perm < 10; ++perm) {
        std::vector<Contribution> shuffled = base;
        for (size_t i = shuffled.size() - 1; i > 0; --i) {
          std::swap(shuffled[i], shuffled[rng.Uniform(i + 1)]);
        }
        auto got = Aggregate(shuffled, c);
        ASSERT_TRUE(got.ok());
        EXPECT_TRUE(BitwiseEqual(ref->delta, got->delta))
            << AggregationRuleName(rule) << " differs under permutation " << perm;
        EXPECT_EQ(ref->used, got->used);
      }
    }
  }
}

// Pins the bits of every rule on a fixed input: a verifier on another CPU (ARM, another libc)
// must recompute the aggregate exactly. A change here is a protocol change.
TEST(AggregateTest, GoldenBits) {
  const Deltas d = RandomDeltas(3, 8, 100);
  std::string got;
  for (Rule rule : kAllRules) {
    const std::vector<float> out = Agg(d, AggregationTestConfig(rule));
    const Hash256 h =
        Blake2b(ByteSpan(reinterpret_cast<const uint8_t*>(out.data()), out.size() * 4));
    got += std::string(AggregationRuleName(rule)) + "=" + h.ShortHex() + " ";
  }
  EXPECT_EQ(got,
            "mean=529f285b18e2 trimmed_mean=ff4907268fff median=f48f3c39638f "
            "centered_clip=869e3c0f2c44 krum=39d6659aee85 ");
}

TEST(AggregateTest, NonFiniteContributionsAreRejectedByEveryRule) {
  const Deltas clean = RandomDeltas(2, 7, 64);
  Deltas dirty = clean;
  std::vector<float> nan_delta(64, 1.0f);
  nan_delta[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf_delta(64, -1.0f);
  inf_delta[3] = -std::numeric_limits<float>::infinity();
  dirty.Add(nan_delta);
  dirty.Add(inf_delta);
  for (Rule rule : kAllRules) {
    AggregationConfig c = AggregationTestConfig(rule);
    c.krum_byzantine = 1;
    auto want = Aggregate(clean.Contributions(), c);
    auto dirty_contribs = dirty.Contributions();
    auto got = Aggregate(dirty_contribs, c);
    ASSERT_TRUE(want.ok() && got.ok()) << AggregationRuleName(rule);
    EXPECT_TRUE(BitwiseEqual(want->delta, got->delta)) << AggregationRuleName(rule);
    EXPECT_EQ(got->rejected, (std::vector<UnitId>{dirty_contribs[7].unit, dirty_contribs[8].unit}));
    for (float x : got->delta) EXPECT_TRUE(std::isfinite(x));
  }
  Deltas all_bad;
  all_bad.Add(nan_delta);
  EXPECT_EQ(Aggregate(all_bad.Contributions(), AggregationTestConfig(kMedian)).status().code(),
            StatusCode::kFailedPrecondition);
}

// The robustness requirement: 8 solvers, 7 honest deltas near a common direction, one sending
// garbage. The robust rules stay close to the honest mean; the plain mean visibly does not.
enum class Garbage { kHuge, kSignFlipped, kNaN, kHugeRandom };

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t j = 0; j < want.size(); ++j) {
    const double e = static_cast<double>(got[j]) - want[j];
    err += e * e;
    norm += want[j] * want[j];
  }
  return std::sqrt(err / norm);
}

TEST(AggregateTest, RobustRulesResistOneGarbageSolverOfEight) {
  constexpr size_t kDim = 1000;
  Rng rng(2026);
  std::vector<double> direction(kDim);
  for (double& x : direction) x = rng.UniformDouble() * 2.0 - 1.0;
  Deltas honest;
  for (int i = 0; i < 7; ++i) {
    std::vector<float> v(kDim);
    for (size_t j = 0; j < kDim; ++j) {
      v[j] = static_cast<float>(direction[j] + (rng.UniformDouble() - 0.5) * 0.1);
    }
    honest.Add(std::move(v), 64);
  }
  std::vector<double> honest_mean(kDim, 0.0);
  for (const auto& v : honest.values) {
    for (size_t j = 0; j < kDim; ++j) honest_mean[j] += v[j] / 7.0;
  }

  for (Garbage g : {Garbage::kHuge, Garbage::kSignFlipped, Garbage::kNaN, Garbage::kHugeRandom}) {
    Deltas d = honest;
    std::vector<float> bad(kDim);
    for (size_t j = 0; j < kDim; ++j) {
      switch (g) {
        case Garbage::kHuge:
          bad[j] = 1e30f;
          break;
        case Garbage::kSignFlipped:
          bad[j] = -3.0f * d.values[0][j];
          break;
        case Garbage::kNaN:
          bad[j] = j % 2 ? std::numeric_limits<float>::quiet_NaN() : 1e30f;
          break;
        case Garbage::kHugeRandom:
          bad[j] = static_cast<float>((rng.UniformDouble() - 0.5) * 6e38);
          break;
      }
    }
    d.Add(bad, 64);
    const int garbage = static_cast<int>(g);
    for (Rule rule : kRobustRules) {
      const double err = RelativeError(Agg(d, AggregationTestConfig(rule)), honest_mean);
      EXPECT_LT(err, 0.1) << AggregationRuleName(rule) << " garbage kind " << garbage;
    }
    const std::vector<float> mean = Agg(d, AggregationTestConfig(kMean));
    const double mean_err = RelativeError(mean, honest_mean);
    if (g == Garbage::kNaN) {
      // Non-finite deltas are rejected before any rule runs, so even the mean survives NaN.
      EXPECT_LT(mean_err, 1e-6);
    } else {
      EXPECT_GT(mean_err, 0.4) << "garbage kind " << garbage;
    }
  }
}

TEST(AggregateTest, PseudoGradientAndOuterStepByHand) {
  const std::vector<float> global = {1.0f, -2.0f};
  const std::vector<float> local = {0.5f, -1.0f};
  const std::vector<float> g = PseudoGradient(global, local);
  EXPECT_EQ(g, (std::vector<float>{0.5f, -1.0f}));
  // In place, a part at a time (a pipeline stage's tensors): the same floats.
  std::vector<float> in_place = global;
  PseudoGradientInPlace(std::span<float>(in_place).first(1), std::span(local).first(1));
  PseudoGradientInPlace(std::span<float>(in_place).last(1), std::span(local).last(1));
  EXPECT_EQ(in_place, g);

  std::vector<float> w = global;
  std::vector<float> m(2, 0.0f);
  OuterOptimizerConfig c;  // lr 0.7, momentum 0.9, nesterov
  OuterStep(w, m, g, c);
  // m = 0.9 x 0 + 0.5 = 0.5; w = 1 - 0.7 x (0.5 + 0.9 x 0.5) = 1 - 0.665 = 0.335.
  EXPECT_EQ(m[0], 0.5f);
  EXPECT_FLOAT_EQ(w[0], 0.335f);
  // Second step with the same g: m = 0.45 + 0.5 = 0.95; w = 0.335 - 0.7 x (0.5 + 0.855).
  OuterStep(w, m, g, c);
  EXPECT_FLOAT_EQ(m[0], 0.95f);
  EXPECT_FLOAT_EQ(w[0], 0.335f - 0.7f * 1.355f);
  // Bitwise: the documented float expression, evaluated here the same way.
  float wr = 1.0f, mr = 0.0f;
  for (int i = 0; i < 2; ++i) {
    mr = 0.9f * mr + 0.5f;
    const float upd = 0.5f + 0.9f * mr;
    wr = wr - 0.7f * upd;
  }
  EXPECT_EQ(std::memcmp(&wr, &w[0], sizeof(float)), 0);
  // Coordinate 1: g = -1. m = -1, w = -2 - 0.7 x (-1 - 0.9) = -0.67, then m = -1.9, ...
  EXPECT_FLOAT_EQ(w[1], -2.0f + 0.7f * 1.9f + 0.7f * (1.0f + 0.9f * 1.9f));

  // Plain momentum (nesterov off): w -= lr x m.
  std::vector<float> w2 = {1.0f}, m2 = {0.0f}, g2 = {0.5f};
  c.nesterov = false;
  OuterStep(w2, m2, g2, c);
  EXPECT_FLOAT_EQ(w2[0], 1.0f - 0.35f);

  OuterOptimizerConfig bad;
  bad.momentum = 1.0f;
  EXPECT_FALSE(ValidateOuterOptimizerConfig(bad).ok());
  bad = {};
  bad.lr = 0.0f;
  EXPECT_FALSE(ValidateOuterOptimizerConfig(bad).ok());
}

}  // namespace
}  // namespace meshlearn::protocol
