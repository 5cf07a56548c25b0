#include "meshlearn/protocol/scheduler.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/decompose.h"

namespace meshlearn::protocol {
namespace {

// 128-bit intermediates keep products like FLOPs x 1000 exact. __extension__ silences
// -Wpedantic; GCC and Clang on every 64-bit target we build for provide the type.
__extension__ typedef unsigned __int128 U128;

uint64_t Saturate(U128 v) { return v > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(v); }

uint64_t MulDivCeil(uint64_t a, uint64_t b, uint64_t c) {
  CHECK_GT(c, 0u);
  const U128 p = static_cast<U128>(a) * b;
  return Saturate((p + c - 1) / c);
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

uint64_t ScheduleSeed(std::string_view domain, const Hash256& block_hash, const TaskId& task,
                      uint64_t height, uint64_t extra = 0) {
  Hasher h(domain);
  h.Update(block_hash).Update(task).UpdateU64(height).UpdateU64(extra);
  const Hash256 d = h.Finish();
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | d.bytes[static_cast<size_t>(i)];
  return v;
}

bool IsExcluded(const PendingUnit& unit, const NodeId& node) {
  return std::find(unit.excluded.begin(), unit.excluded.end(), node) != unit.excluded.end();
}

// Scaling keeps the total weight below 2^62 so prefix sums and Rng::Uniform stay in 64 bits.
constexpr uint64_t kMaxTotalWeight = uint64_t{1} << 62;
constexpr uint64_t kRateScale = uint64_t{1} << 32;
// Draws before falling back to a scan when a drawn node is excluded from a unit.
constexpr int kMaxRedraws = 64;

}  // namespace

std::string_view EligibilityName(Eligibility e) {
  switch (e) {
    case Eligibility::kEligibilityOk:
      return "ok";
    case Eligibility::kEligibilityNotActive:
      return "not active (jailed, exiting or offline)";
    case Eligibility::kEligibilityStaleHeartbeat:
      return "no recent heartbeat";
    case Eligibility::kEligibilityInsufficientMemory:
      return "not enough memory for the task";
    case Eligibility::kEligibilityOverPriceCap:
      return "price above the task's price cap";
    case Eligibility::kEligibilityNoThroughput:
      return "throughput or bandwidth not reported";
    case Eligibility::kEligibilityLowReputation:
      return "reputation below the floor";
  }
  return "unknown";
}

uint64_t RequiredMemoryBytes(const TaskSpecView& task) {
  if (task.memory_required_bytes != 0) return task.memory_required_bytes;
  return Saturate(static_cast<U128>(task.model_bytes) * 5);
}

uint32_t RoundReplicas(const TaskSpecView& task) {
  return task.units_per_round / std::max<uint32_t>(task.stages, 1);
}

uint64_t AggregatorMemoryBytes(const TaskSpecView& task) {
  // The terms are the header's: the model it evaluates with, the state (2), the round's deltas,
  // the largest transient (3).
  const uint64_t model = task.stages > 1 && task.eval_memory_bytes != 0 ? task.eval_memory_bytes
                                                                        : RequiredMemoryBytes(task);
  const uint64_t deltas = RoundReplicas(task);
  const U128 held = (static_cast<U128>(deltas) + 2 + 3) * task.model_bytes;
  return Saturate(static_cast<U128>(model) + held);
}

uint32_t ReputationPermille(const Reputation& rep) {
  constexpr uint64_t kPrior = 4;
  const uint64_t completed = std::min<uint64_t>(rep.completed, uint64_t{1} << 40);
  const uint64_t failures = std::min<uint64_t>(rep.failures, uint64_t{1} << 40);
  const uint64_t completion = 1000 * (completed + kPrior) / (completed + failures + kPrior);
  const uint64_t bonus = 10 * std::min<uint64_t>(rep.clean_streak, 20);
  const uint64_t slashes = std::min<uint64_t>(rep.slashes, uint64_t{1} << 40);
  const uint64_t score = completion * (1000 + bonus) / 1000 / (1 + 2 * slashes);
  return static_cast<uint32_t>(score);
}

bool HeartbeatLive(uint64_t last_heartbeat_height, uint64_t height, const SchedulerParams& params) {
  // A heartbeat "from the future" cannot be in ledger state; treat it as stale rather than
  // trusting it.
  return last_heartbeat_height <= height &&
         height - last_heartbeat_height <= params.liveness_blocks;
}

namespace {

// CheckEligibility with the node's reputation computed by the caller (it is needed again for the
// weight, and its divisions dominate the per-node cost at 10^4 nodes).
Eligibility CheckEligibilityWithReputation(const NodeView& node, const TaskSpecView& task,
                                           uint64_t height, const SchedulerParams& params,
                                           uint32_t reputation_permille) {
  if (node.status != NodeStatus::kNodeStatusActive) return Eligibility::kEligibilityNotActive;
  if (!HeartbeatLive(node.last_heartbeat_height, height, params)) {
    return Eligibility::kEligibilityStaleHeartbeat;
  }
  if (node.memory_bytes < RequiredMemoryBytes(task)) {
    return Eligibility::kEligibilityInsufficientMemory;
  }
  if (node.price_per_gflop > task.price_cap_per_gflop) {
    return Eligibility::kEligibilityOverPriceCap;
  }
  if (node.throughput_flops == 0 || node.bandwidth_bytes_per_s == 0) {
    return Eligibility::kEligibilityNoThroughput;
  }
  if (reputation_permille < params.min_reputation_permille) {
    return Eligibility::kEligibilityLowReputation;
  }
  return Eligibility::kEligibilityOk;
}

uint64_t WeightFrom(uint64_t unit_ms, uint32_t reputation_permille) {
  const uint64_t rate = std::max<uint64_t>(1, kRateScale / unit_ms);
  return rate * std::max<uint32_t>(1, reputation_permille);  // <= 2^32 x 1200 < 2^43
}

}  // namespace

Eligibility CheckEligibility(const NodeView& node, const TaskSpecView& task, uint64_t height,
                             const SchedulerParams& params) {
  return CheckEligibilityWithReputation(node, task, height, params,
                                        ReputationPermille(node.reputation));
}

uint64_t EstimatedUnitMs(const NodeView& node, const TaskSpecView& task,
                         const SchedulerParams& params) {
  CHECK_GT(node.throughput_flops, 0u);
  CHECK_GT(node.bandwidth_bytes_per_s, 0u);
  const uint64_t compute_ms = MulDivCeil(UnitFlops(task), 1000, node.throughput_flops);
  const uint64_t latency_ms = static_cast<uint64_t>(params.round_trips_per_unit) * node.latency_ms;
  const uint64_t transfer_bytes = Saturate(static_cast<U128>(task.model_bytes) * 2);
  const uint64_t transfer_ms = MulDivCeil(transfer_bytes, 1000, node.bandwidth_bytes_per_s);
  return std::max<uint64_t>(1, SaturatingAdd(SaturatingAdd(compute_ms, latency_ms), transfer_ms));
}

uint64_t SchedulingWeight(const NodeView& node, const TaskSpecView& task,
                          const SchedulerParams& params) {
  return WeightFrom(EstimatedUnitMs(node, task, params), ReputationPermille(node.reputation));
}

uint64_t DeadlineHeight(uint64_t height, uint64_t unit_ms, uint64_t queue_position,
                        const SchedulerParams& params) {
  CHECK_GT(params.block_interval_ms, 0u);
  const U128 total_ms = static_cast<U128>(unit_ms) * (static_cast<U128>(queue_position) + 1);
  const U128 slack_ms = total_ms * params.deadline_slack_permille;  // x1000
  const U128 per_block = static_cast<U128>(params.block_interval_ms) * 1000;
  const uint64_t blocks = Saturate((slack_ms + per_block - 1) / per_block);
  return SaturatingAdd(height, std::max(params.min_deadline_blocks, blocks));
}

Result<ScheduleResult> AssignUnits(const TaskSpecView& task, std::span<const NodeView> nodes,
                                   std::span<const PendingUnit> pending, const Hash256& block_hash,
                                   uint64_t height, const SchedulerParams& params) {
  ML_RETURN_IF_ERROR(ValidateDecomposition(task));
  if (params.block_interval_ms == 0) {
    return InvalidArgument("scheduler: block_interval_ms must be > 0, got 0");
  }

  // Eligible nodes in canonical (id) order, as parallel arrays: the passes below touch only the
  // small arrays they need. One pass over `nodes` reads each node once (at 10^4 nodes they no
  // longer fit in L2, so a separate pass to check the order would double the memory traffic).
  std::vector<uint64_t> cand_weight, cand_unit_ms, cand_queued, cand_price;
  std::vector<NodeId> cand_id;  // copied so the final pass does not read the nodes again
  cand_price.reserve(nodes.size());
  cand_id.reserve(nodes.size());
  cand_weight.reserve(nodes.size());
  cand_unit_ms.reserve(nodes.size());
  cand_queued.reserve(nodes.size());
  auto consider = [&](uint32_t idx) {
    const NodeView& n = nodes[idx];
    const uint32_t rep = ReputationPermille(n.reputation);
    if (CheckEligibilityWithReputation(n, task, height, params, rep) !=
        Eligibility::kEligibilityOk) {
      return;
    }
    const uint64_t unit_ms = EstimatedUnitMs(n, task, params);
    cand_weight.push_back(WeightFrom(unit_ms, rep));
    cand_unit_ms.push_back(unit_ms);
    cand_queued.push_back(n.inflight_units);
    cand_price.push_back(n.price_per_gflop);
    cand_id.push_back(n.id);
  };
  // Fast path: nodes come strictly ascending by id (the ledger's registry order).
  bool nodes_sorted = true;
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    if (i > 0 && !(nodes[i - 1].id < nodes[i].id)) {
      nodes_sorted = false;
      break;
    }
    consider(i);
  }
  if (!nodes_sorted) {
    cand_weight.clear();
    cand_unit_ms.clear();
    cand_queued.clear();
    cand_price.clear();
    cand_id.clear();
    std::vector<uint32_t> order(nodes.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return nodes[a].id < nodes[b].id; });
    for (size_t i = 1; i < order.size(); ++i) {
      if (nodes[order[i - 1]].id == nodes[order[i]].id) {
        return InvalidArgument("scheduler: node " + nodes[order[i]].id.ShortHex() +
                               " appears twice in the node list");
      }
    }
    for (uint32_t idx : order) consider(idx);
  }
  const size_t nc = cand_id.size();

  ScheduleResult result;
  result.eligible_nodes = nc;
  const uint64_t m = pending.size();
  if (m == 0) return result;

  // Pending units are read once, in the final pass below, which also validates them: of this
  // task, in range, and in canonical order (round, shard) strictly ascending, as the ledger keeps
  // them. Input in any other order takes the slow path at the end: sort a copy and start over.
  bool unsorted = false;
  auto check_unit = [&](size_t k) -> Status {
    const UnitId& u = pending[k].unit;
    if (u.task != task.id) {
      return InvalidArgument("scheduler: unit " + u.ToString() + " belongs to another task than " +
                             task.id.ShortHex());
    }
    if (u.round >= task.rounds || u.shard >= task.units_per_round) {
      return InvalidArgument("scheduler: unit " + u.ToString() + " is outside the task's " +
                             std::to_string(task.rounds) + " rounds x " +
                             std::to_string(task.units_per_round) + " shards");
    }
    if (k > 0) {
      const UnitId& prev = pending[k - 1].unit;
      if (!(prev.round < u.round || (prev.round == u.round && prev.shard < u.shard))) {
        unsorted = true;
      }
    }
    return Status::Ok();
  };

  if (nc == 0) {
    for (size_t k = 0; k < m && !unsorted; ++k) {
      ML_RETURN_IF_ERROR(check_unit(k));
      result.unassigned.push_back(pending[k].unit);
    }
  } else {
    Rng rng(ScheduleSeed("meshlearn.schedule", block_hash, task.id, height));
    // Lay the candidates end to end in a shuffled order (Fisher-Yates), so that which nodes get
    // the rounding remainder varies from block to block and is not tied to the order of ids.
    std::vector<uint32_t> perm(nc);
    std::iota(perm.begin(), perm.end(), 0u);
    for (size_t i = nc - 1; i > 0; --i) std::swap(perm[i], perm[rng.Uniform(i + 1)]);

    U128 total128 = 0;
    for (uint64_t w : cand_weight) total128 += w;
    int shift = 0;
    while ((total128 >> shift) >= kMaxTotalWeight) ++shift;
    for (uint64_t& w : cand_weight) w = std::max<uint64_t>(1, w >> shift);
    std::vector<uint64_t> prefix_end(nc);  // cumulative weight through perm[i]
    uint64_t total = 0;
    for (size_t i = 0; i < nc; ++i) {
      total += cand_weight[perm[i]];
      prefix_end[i] = total;
    }

    // Systematic sampling: point k = floor((u + k x total) / m) for one uniform u in [0, total).
    // The points are increasing and spaced total/m apart, so one merge walk over the prefix sums
    // deals all m units; candidate i receives floor or ceil of m x weight_i / total.
    const uint64_t u0 = rng.Uniform(total);
    std::vector<uint32_t> dealt(nc, 0);
    size_t pos = 0;
    for (uint64_t k = 0; k < m; ++k) {
      const uint64_t point = static_cast<uint64_t>((static_cast<U128>(k) * total + u0) / m);
      while (prefix_end[pos] <= point) ++pos;
      ++dealt[perm[pos]];
    }

    auto excluded = [&](const PendingUnit& p, size_t cand) {
      return !p.excluded.empty() && IsExcluded(p, cand_id[cand]);
    };
    // A weighted redraw for a unit whose dealt node is excluded from it.
    auto draw = [&](const PendingUnit& p) -> int64_t {
      for (int attempt = 0; attempt < kMaxRedraws; ++attempt) {
        const uint64_t r = rng.Uniform(total);
        const size_t j = static_cast<size_t>(
            std::upper_bound(prefix_end.begin(), prefix_end.end(), r) - prefix_end.begin());
        if (!excluded(p, perm[j])) return perm[j];
      }
      // Nearly every eligible node is excluded: the first one that is not, in shuffled order.
      for (size_t j = 0; j < nc; ++j) {
        if (!excluded(p, perm[j])) return perm[j];
      }
      return -1;
    };

    // Units in canonical order go to the candidates in id order, dealt[i] units to candidate i.
    result.assignments.reserve(m);
    size_t cand = 0;
    for (uint64_t k = 0; k < m && !unsorted; ++k) {
      ML_RETURN_IF_ERROR(check_unit(k));
      while (dealt[cand] == 0) ++cand;
      --dealt[cand];
      const PendingUnit& p = pending[k];
      int64_t j = static_cast<int64_t>(cand);
      if (excluded(p, cand)) j = draw(p);
      if (j < 0) {
        result.unassigned.push_back(p.unit);
        continue;
      }
      const size_t c = static_cast<size_t>(j);
      Assignment a;
      a.unit = p.unit;
      a.node = cand_id[c];
      a.assigned_height = height;
      a.deadline_height = DeadlineHeight(height, cand_unit_ms[c], cand_queued[c], params);
      a.price_per_gflop = cand_price[c];
      ++cand_queued[c];
      result.assignments.push_back(a);
    }
  }
  if (!unsorted) return result;

  // Slow path: the pending units were not in canonical order. Validate them all, sort a copy,
  // refuse duplicates, and schedule the sorted copy (which takes the fast path).
  for (size_t k = 0; k < m; ++k) ML_RETURN_IF_ERROR(check_unit(k));
  std::vector<PendingUnit> sorted(pending.begin(), pending.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const PendingUnit& a, const PendingUnit& b) { return a.unit < b.unit; });
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k - 1].unit == sorted[k].unit) {
      return InvalidArgument("scheduler: unit " + sorted[k].unit.ToString() + " is pending twice");
    }
  }
  return AssignUnits(task, nodes, sorted, block_hash, height, params);
}

uint64_t EstimatedAggregationMs(const NodeView& node, const TaskSpecView& task,
                                const SchedulerParams& params) {
  CHECK_GT(node.throughput_flops, 0u);
  CHECK_GT(node.bandwidth_bytes_per_s, 0u);
  const uint64_t units = RoundReplicas(task);  // whole deltas
  const uint64_t bytes = Saturate(static_cast<U128>(units + 1) * task.model_bytes);
  const uint64_t transfer_ms = MulDivCeil(bytes, 1000, node.bandwidth_bytes_per_s);
  const uint64_t latency_ms = static_cast<uint64_t>(params.round_trips_per_unit) * node.latency_ms;
  const uint64_t flops =
      Saturate(static_cast<U128>(units) * (task.model_bytes / 4) * kAggregationFlopsPerValue);
  const uint64_t compute_ms = MulDivCeil(flops, 1000, node.throughput_flops);
  return std::max<uint64_t>(1, SaturatingAdd(SaturatingAdd(transfer_ms, latency_ms), compute_ms));
}

Result<AggregatorAssignment> AssignAggregator(const TaskSpecView& task,
                                              std::span<const NodeView> nodes, uint32_t round,
                                              std::span<const NodeId> exclude,
                                              const Hash256& block_hash, uint64_t height,
                                              const SchedulerParams& params) {
  ML_RETURN_IF_ERROR(ValidateDecomposition(task));
  if (params.block_interval_ms == 0) {
    return InvalidArgument("scheduler: block_interval_ms must be > 0, got 0");
  }
  // Eligible as a solver is, but holding what an aggregator holds.
  TaskSpecView aggregating = task;
  aggregating.memory_required_bytes = std::max<uint64_t>(AggregatorMemoryBytes(task), 1);
  if (round >= task.rounds) {
    return InvalidArgument("scheduler: round " + std::to_string(round) + " is outside the task's " +
                           std::to_string(task.rounds) + " rounds");
  }
  // Canonical order by id (one O(n) check when already sorted), as in AssignUnits.
  std::vector<uint32_t> order(nodes.size());
  std::iota(order.begin(), order.end(), 0u);
  auto id_less = [&](uint32_t a, uint32_t b) { return nodes[a].id < nodes[b].id; };
  if (!std::is_sorted(order.begin(), order.end(), id_less)) {
    std::sort(order.begin(), order.end(), id_less);
  }
  std::vector<uint32_t> cand;
  std::vector<uint64_t> weight;
  U128 total128 = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const NodeView& n = nodes[order[i]];
    if (i > 0 && nodes[order[i - 1]].id == n.id) {
      return InvalidArgument("scheduler: node " + n.id.ShortHex() +
                             " appears twice in the node list");
    }
    if (CheckEligibility(n, aggregating, height, params) != Eligibility::kEligibilityOk) continue;
    if (std::find(exclude.begin(), exclude.end(), n.id) != exclude.end()) continue;
    const uint64_t rate =
        std::max<uint64_t>(1, kRateScale / EstimatedAggregationMs(n, task, params));
    const uint64_t w = rate * std::max<uint32_t>(1, ReputationPermille(n.reputation));
    cand.push_back(order[i]);
    weight.push_back(w);
    total128 += w;
  }
  if (cand.empty()) {
    return Unavailable("scheduler: no eligible aggregator for round " + std::to_string(round) +
                       " of task " + task.id.ShortHex());
  }
  int shift = 0;
  while ((total128 >> shift) >= kMaxTotalWeight) ++shift;
  uint64_t total = 0;
  for (uint64_t& w : weight) {
    w = std::max<uint64_t>(1, w >> shift);
    total += w;
  }
  Rng rng(ScheduleSeed("meshlearn.aggregator", block_hash, task.id, height, round));
  uint64_t r = rng.Uniform(total);
  size_t j = 0;
  while (r >= weight[j]) r -= weight[j++];
  const NodeView& chosen = nodes[cand[j]];
  AggregatorAssignment a;
  a.task = task.id;
  a.round = round;
  a.node = chosen.id;
  a.assigned_height = height;
  a.deadline_height =
      DeadlineHeight(height, EstimatedAggregationMs(chosen, task, params), 0, params);
  return a;
}

std::vector<Assignment> OverdueAssignments(std::span<const Assignment> open, uint64_t height) {
  std::vector<Assignment> out;
  for (const Assignment& a : open) {
    if (a.deadline_height < height) out.push_back(a);
  }
  return out;
}

uint64_t UnitCostTokens(const TaskSpecView& task, uint64_t price_per_gflop) {
  return MulDivCeil(UnitFlops(task), price_per_gflop, 1'000'000'000);
}

void ApplyMissedDeadline(Reputation& rep) {
  ++rep.failures;
  rep.clean_streak = 0;
}

}  // namespace meshlearn::protocol
