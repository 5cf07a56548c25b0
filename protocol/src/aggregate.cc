#include "meshlearn/protocol/aggregate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "meshlearn/base/check.h"

namespace meshlearn::protocol {
namespace {

// A strict total order on finite floats: by value, and -0 before +0, so sorting a column gives
// the same bits whatever order the values came in.
bool TotalLess(float a, float b) {
  if (a < b) return true;
  if (b < a) return false;
  return std::signbit(a) && !std::signbit(b);
}

// Sorts a column of one coordinate's values. Columns are short (one value per solver), where
// insertion sort beats std::sort severalfold; both give the same result under TotalLess.
void SortColumn(std::vector<float>& col) {
  if (col.size() > 32) {
    std::sort(col.begin(), col.end(), TotalLess);
    return;
  }
  for (size_t i = 1; i < col.size(); ++i) {
    const float x = col[i];
    size_t k = i;
    while (k > 0 && TotalLess(x, col[k - 1])) {
      col[k] = col[k - 1];
      --k;
    }
    col[k] = x;
  }
}

bool AllFinite(std::span<const float> v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// The contributions that enter a rule, in canonical order.
using Rows = std::vector<const Contribution*>;

std::vector<float> ToFloat(const std::vector<double>& v) {
  std::vector<float> out(v.size());
  for (size_t j = 0; j < v.size(); ++j) out[j] = static_cast<float>(v[j]);
  return out;
}

std::vector<float> WeightedMean(const Rows& rows, uint64_t total_samples) {
  const size_t d = rows[0]->delta.size();
  std::vector<double> acc(d, 0.0);
  for (const Contribution* c : rows) {
    const double w = static_cast<double>(c->samples);
    for (size_t j = 0; j < d; ++j) acc[j] += w * static_cast<double>(c->delta[j]);
  }
  const double total = static_cast<double>(total_samples);
  for (double& x : acc) x /= total;
  return ToFloat(acc);
}

std::vector<double> UnweightedMean(const Rows& rows) {
  const size_t d = rows[0]->delta.size();
  std::vector<double> acc(d, 0.0);
  for (const Contribution* c : rows) {
    for (size_t j = 0; j < d; ++j) acc[j] += static_cast<double>(c->delta[j]);
  }
  const double n = static_cast<double>(rows.size());
  for (double& x : acc) x /= n;
  return acc;
}

// Per coordinate: sort the column, mean of the values at sorted positions [k, n - k).
// k = 0 is the plain mean (in sorted order), k = (n - 1) / 2 with n odd is the median.
std::vector<double> TrimmedMeanDouble(const Rows& rows, size_t k) {
  const size_t n = rows.size();
  CHECK_LT(2 * k, n);
  const size_t d = rows[0]->delta.size();
  std::vector<double> out(d);
  std::vector<float> col(n);
  for (size_t j = 0; j < d; ++j) {
    for (size_t i = 0; i < n; ++i) col[i] = rows[i]->delta[j];
    SortColumn(col);
    double s = 0.0;
    for (size_t i = k; i < n - k; ++i) s += static_cast<double>(col[i]);
    out[j] = s / static_cast<double>(n - 2 * k);
  }
  return out;
}

std::vector<double> MedianDouble(const Rows& rows) {
  const size_t n = rows.size();
  // n odd: keep the middle value; n even: the mean of the two middle values.
  return TrimmedMeanDouble(rows, (n - 1) / 2);
}

double SquaredDistance(std::span<const float> a, std::span<const double> b) {
  double s = 0.0;
  for (size_t j = 0; j < a.size(); ++j) {
    const double t = static_cast<double>(a[j]) - b[j];
    s += t * t;
  }
  return s;
}

std::vector<float> CenteredClip(const Rows& rows, const AggregationConfig& config) {
  const size_t n = rows.size();
  const size_t d = rows[0]->delta.size();
  std::vector<double> v = MedianDouble(rows);
  double tau = config.clip_radius;
  if (tau <= 0.0) {
    // Auto radius: the median distance to the start point (lower middle when n is even), so at
    // least half of the contributions pass unclipped in the first iteration.
    std::vector<double> dist(n);
    for (size_t i = 0; i < n; ++i) dist[i] = std::sqrt(SquaredDistance(rows[i]->delta, v));
    std::sort(dist.begin(), dist.end());
    tau = dist[(n - 1) / 2];
  }
  std::vector<double> acc(d);
  for (uint32_t it = 0; it < config.clip_iterations; ++it) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (const Contribution* c : rows) {
      const double norm = std::sqrt(SquaredDistance(c->delta, v));
      const double scale = norm <= tau ? 1.0 : tau / norm;
      for (size_t j = 0; j < d; ++j) {
        acc[j] += scale * (static_cast<double>(c->delta[j]) - v[j]);
      }
    }
    for (size_t j = 0; j < d; ++j) v[j] += acc[j] / static_cast<double>(n);
  }
  return ToFloat(v);
}

Result<std::vector<size_t>> KrumSelect(const Rows& rows, const AggregationConfig& config) {
  const size_t n = rows.size();
  if (n == 1) return std::vector<size_t>{0};
  const int64_t f = config.krum_byzantine >= 0 ? config.krum_byzantine
                                               : (n >= 3 ? static_cast<int64_t>((n - 3) / 2) : 0);
  if (f > 0 && static_cast<int64_t>(n) < 2 * f + 3) {
    return InvalidArgument("aggregation: krum with krum_byzantine=" + std::to_string(f) +
                           " needs at least " + std::to_string(2 * f + 3) + " contributions, got " +
                           std::to_string(n) + "; lower krum_byzantine or add units");
  }
  const uint64_t select = config.krum_select;
  if (select > n - static_cast<size_t>(f)) {
    return InvalidArgument("aggregation: krum_select=" + std::to_string(select) +
                           " is more than n - f = " + std::to_string(n - static_cast<size_t>(f)));
  }
  // Pairwise squared distances, each computed once, coordinates in order.
  const size_t d = rows[0]->delta.size();
  std::vector<double> dist(n * n, 0.0);
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      double s = 0.0;
      for (size_t j = 0; j < d; ++j) {
        const double t =
            static_cast<double>(rows[a]->delta[j]) - static_cast<double>(rows[b]->delta[j]);
        s += t * t;
      }
      dist[a * n + b] = dist[b * n + a] = s;
    }
  }
  // Score = sum of the squared distances to the n - f - 2 nearest others (at least 1).
  const size_t neighbours = static_cast<size_t>(
      std::clamp<int64_t>(static_cast<int64_t>(n) - f - 2, 1, static_cast<int64_t>(n) - 1));
  std::vector<double> score(n);
  std::vector<double> row;
  for (size_t a = 0; a < n; ++a) {
    row.clear();
    for (size_t b = 0; b < n; ++b) {
      if (b != a) row.push_back(dist[a * n + b]);
    }
    std::sort(row.begin(), row.end());
    double s = 0.0;
    for (size_t t = 0; t < neighbours; ++t) s += row[t];
    score[a] = s;
  }
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  // Lowest scores first; ties go to the earlier unit in canonical order.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  idx.resize(select);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

std::string_view AggregationRuleName(AggregationRule rule) {
  switch (rule) {
    case AggregationRule::kAggregationRuleWeightedMean:
      return "mean";
    case AggregationRule::kAggregationRuleTrimmedMean:
      return "trimmed_mean";
    case AggregationRule::kAggregationRuleMedian:
      return "median";
    case AggregationRule::kAggregationRuleCenteredClip:
      return "centered_clip";
    case AggregationRule::kAggregationRuleKrum:
      return "krum";
  }
  return "unknown";
}

Result<AggregationRule> ParseAggregationRule(std::string_view name) {
  for (AggregationRule r :
       {AggregationRule::kAggregationRuleWeightedMean, AggregationRule::kAggregationRuleTrimmedMean,
        AggregationRule::kAggregationRuleMedian, AggregationRule::kAggregationRuleCenteredClip,
        AggregationRule::kAggregationRuleKrum}) {
    if (AggregationRuleName(r) == name) return r;
  }
  return InvalidArgument(
      "aggregation rule must be one of mean, trimmed_mean, median, "
      "centered_clip, krum; got \"" +
      std::string(name) + "\"");
}

Status ValidateAggregationConfig(const AggregationConfig& config) {
  if (!(config.trim_fraction >= 0.0 && config.trim_fraction < 0.5)) {
    return InvalidArgument("aggregation: trim_fraction must be in [0, 0.5), got " +
                           std::to_string(config.trim_fraction));
  }
  if (!(config.clip_radius >= 0.0) || !std::isfinite(config.clip_radius)) {
    return InvalidArgument("aggregation: clip_radius must be >= 0 (0 = automatic), got " +
                           std::to_string(config.clip_radius));
  }
  if (config.clip_iterations == 0) {
    return InvalidArgument("aggregation: clip_iterations must be >= 1, got 0");
  }
  if (config.krum_byzantine < -1) {
    return InvalidArgument("aggregation: krum_byzantine must be >= 0 (or -1 = automatic), got " +
                           std::to_string(config.krum_byzantine));
  }
  if (config.krum_select == 0)
    return InvalidArgument("aggregation: krum_select must be >= 1, got 0");
  return Status::Ok();
}

Result<AggregateResult> Aggregate(std::span<const Contribution> contributions,
                                  const AggregationConfig& config,
                                  std::span<const size_t> tensor_sizes) {
  ML_RETURN_IF_ERROR(ValidateAggregationConfig(config));
  if (contributions.empty()) return InvalidArgument("aggregation: no contributions");
  const size_t d = contributions[0].delta.size();
  if (!tensor_sizes.empty()) {
    size_t sum = 0;
    for (size_t s : tensor_sizes) {
      if (s == 0) return InvalidArgument("aggregation: a tensor of size 0 in tensor_sizes");
      sum += s;
    }
    if (sum != d) {
      return InvalidArgument("aggregation: tensor_sizes add up to " + std::to_string(sum) +
                             ", but the deltas have " + std::to_string(d) + " values");
    }
  }

  Rows sorted;
  sorted.reserve(contributions.size());
  for (const Contribution& c : contributions) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(),
            [](const Contribution* a, const Contribution* b) { return a->unit < b->unit; });

  AggregateResult result;
  Rows rows;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Contribution* c = sorted[i];
    if (i > 0 && sorted[i - 1]->unit == c->unit) {
      return InvalidArgument("aggregation: unit " + c->unit.ToString() + " contributed twice");
    }
    if (c->delta.size() != d) {
      return InvalidArgument("aggregation: unit " + c->unit.ToString() + " has a delta of " +
                             std::to_string(c->delta.size()) + " values, expected " +
                             std::to_string(d));
    }
    if (!AllFinite(c->delta)) {
      result.rejected.push_back(c->unit);
    } else {
      rows.push_back(c);
    }
  }
  if (rows.empty()) {
    return FailedPrecondition("aggregation: all " + std::to_string(sorted.size()) +
                              " contributions have NaN or Inf values");
  }
  const size_t n = rows.size();
  for (const Contribution* c : rows) result.used.push_back(c->unit);

  // Per-tensor centered clipping and Krum: the rule runs on each tensor's slice of the deltas on
  // its own (norms and distances per tensor), and the slices are concatenated. Coordinate-wise
  // rules give the same result either way.
  const bool per_tensor =
      tensor_sizes.size() > 1 && (config.rule == AggregationRule::kAggregationRuleCenteredClip ||
                                  config.rule == AggregationRule::kAggregationRuleKrum);
  if (per_tensor) {
    result.delta.reserve(d);
    std::vector<bool> selected_any(n, false);
    size_t offset = 0;
    std::vector<Contribution> slices(n);
    Rows slice_rows(n);
    for (size_t size : tensor_sizes) {
      for (size_t i = 0; i < n; ++i) {
        slices[i] = *rows[i];
        slices[i].delta = rows[i]->delta.subspan(offset, size);
        slice_rows[i] = &slices[i];
      }
      std::vector<float> part;
      if (config.rule == AggregationRule::kAggregationRuleCenteredClip) {
        part = CenteredClip(slice_rows, config);
      } else {
        ML_ASSIGN_OR_RETURN(std::vector<size_t> chosen, KrumSelect(slice_rows, config));
        Rows selected;
        for (size_t i : chosen) {
          selected.push_back(slice_rows[i]);
          selected_any[i] = true;
        }
        part = ToFloat(UnweightedMean(selected));
      }
      result.delta.insert(result.delta.end(), part.begin(), part.end());
      offset += size;
    }
    if (config.rule == AggregationRule::kAggregationRuleKrum) {
      result.used.clear();
      for (size_t i = 0; i < n; ++i) {
        if (selected_any[i]) result.used.push_back(rows[i]->unit);
      }
    }
    return result;
  }

  switch (config.rule) {
    case AggregationRule::kAggregationRuleWeightedMean: {
      uint64_t total = 0;
      for (const Contribution* c : rows) {
        if (c->samples > UINT64_MAX - total) {
          return InvalidArgument("aggregation: total samples overflow");
        }
        total += c->samples;
      }
      if (total == 0) return InvalidArgument("aggregation: weighted mean with zero total samples");
      result.delta = WeightedMean(rows, total);
      break;
    }
    case AggregationRule::kAggregationRuleTrimmedMean: {
      // floor() of a product of two exactly representable inputs: the same on every IEEE machine.
      size_t k = static_cast<size_t>(std::floor(config.trim_fraction * static_cast<double>(n)));
      if (2 * k >= n) k = (n - 1) / 2;
      result.delta = ToFloat(TrimmedMeanDouble(rows, k));
      break;
    }
    case AggregationRule::kAggregationRuleMedian:
      result.delta = ToFloat(MedianDouble(rows));
      break;
    case AggregationRule::kAggregationRuleCenteredClip:
      result.delta = CenteredClip(rows, config);
      break;
    case AggregationRule::kAggregationRuleKrum: {
      ML_ASSIGN_OR_RETURN(std::vector<size_t> chosen, KrumSelect(rows, config));
      Rows selected;
      result.used.clear();
      for (size_t i : chosen) {
        selected.push_back(rows[i]);
        result.used.push_back(rows[i]->unit);
      }
      result.delta = ToFloat(UnweightedMean(selected));
      break;
    }
  }
  return result;
}

std::vector<float> PseudoGradient(std::span<const float> global, std::span<const float> local) {
  std::vector<float> out(global.begin(), global.end());
  PseudoGradientInPlace(out, local);
  return out;
}

void PseudoGradientInPlace(std::span<float> global_then_delta, std::span<const float> local) {
  CHECK_EQ(global_then_delta.size(), local.size());
  for (size_t j = 0; j < local.size(); ++j) global_then_delta[j] = global_then_delta[j] - local[j];
}

Status ValidateOuterOptimizerConfig(const OuterOptimizerConfig& config) {
  if (!(config.lr > 0.0f) || !std::isfinite(config.lr)) {
    return InvalidArgument("task: outer_optimizer.lr must be > 0, got " +
                           std::to_string(config.lr));
  }
  if (!(config.momentum >= 0.0f && config.momentum < 1.0f)) {
    return InvalidArgument("task: outer_optimizer.momentum must be in [0, 1), got " +
                           std::to_string(config.momentum));
  }
  return Status::Ok();
}

void OuterStep(std::span<float> weights, std::span<float> momentum_buffer,
               std::span<const float> pseudo_gradient, const OuterOptimizerConfig& config) {
  CHECK_EQ(weights.size(), momentum_buffer.size());
  CHECK_EQ(weights.size(), pseudo_gradient.size());
  const float mu = config.momentum;
  const float lr = config.lr;
  for (size_t j = 0; j < weights.size(); ++j) {
    const float g = pseudo_gradient[j];
    const float m = mu * momentum_buffer[j] + g;
    momentum_buffer[j] = m;
    const float update = config.nesterov ? g + mu * m : m;
    weights[j] = weights[j] - lr * update;
  }
}

}  // namespace meshlearn::protocol
