// A whole task in one process, FoundationDB style: a simulated set of solvers on virtual block
// time drives the round state machine, the scheduler, aggregation and the DiLoCo outer step on a
// small linear-regression task. Solvers "train" with plain float SGD on the batches that
// BatchIndices gives them. Faults: a half-speed node, a node that goes offline mid-task (its units
// expire and are reassigned), a node that joins mid-task, and optionally a garbage solver.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "meshlearn/base/rng.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"

namespace meshlearn::protocol {
namespace {

constexpr size_t kDim = 16;

struct Dataset {
  std::vector<std::array<float, kDim>> x;
  std::vector<float> y;
};

Dataset MakeDataset(uint64_t seed, size_t n) {
  Rng rng(seed);
  std::array<float, kDim> w_true;
  for (float& w : w_true) w = static_cast<float>(rng.UniformDouble() * 2 - 1);
  Dataset d;
  d.x.resize(n);
  d.y.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float dot = 0;
    for (size_t j = 0; j < kDim; ++j) {
      d.x[i][j] = static_cast<float>(rng.UniformDouble() * 2 - 1);
      dot += w_true[j] * d.x[i][j];
    }
    d.y[i] = dot + static_cast<float>((rng.UniformDouble() - 0.5) * 0.01);
  }
  return d;
}

double Loss(const Dataset& d, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < d.y.size(); ++i) {
    double dot = 0;
    for (size_t j = 0; j < kDim; ++j) dot += static_cast<double>(w[j]) * d.x[i][j];
    s += (dot - d.y[i]) * (dot - d.y[i]);
  }
  return s / static_cast<double>(d.y.size());
}

// H steps of SGD on the unit's batches; returns the pseudo-gradient global - local.
std::vector<float> TrainUnit(const TaskSpecView& task, const Dataset& d, const UnitId& unit,
                             const std::vector<float>& global) {
  std::vector<float> w = global;
  const float lr = 0.1f;
  for (uint32_t step = 0; step < task.inner_steps; ++step) {
    std::array<float, kDim> grad{};
    for (uint64_t i : BatchIndices(task, unit, step)) {
      float dot = 0;
      for (size_t j = 0; j < kDim; ++j) dot += w[j] * d.x[i][j];
      const float err = dot - d.y[i];
      for (size_t j = 0; j < kDim; ++j) grad[j] += 2.0f * err * d.x[i][j];
    }
    for (size_t j = 0; j < kDim; ++j) w[j] -= lr * grad[j] / static_cast<float>(task.batch_size);
  }
  return PseudoGradient(global, w);
}

Hash256 HashWeights(const std::vector<float>& w) {
  return Blake2b(ByteSpan(reinterpret_cast<const uint8_t*>(w.data()), w.size() * sizeof(float)));
}

struct SimNode {
  NodeView view;
  uint64_t join_height = 0;
  uint64_t offline_from = UINT64_MAX;
  bool garbage = false;
  uint64_t busy_until = 0;
  int units_committed = 0;
  int units_assigned = 0;
  bool online(uint64_t h) const { return h >= join_height && h < offline_from; }
};

struct SimResult {
  double initial_loss = 0;
  double final_loss = 0;
  uint64_t final_height = 0;
  Hash256 final_weights;
  std::vector<Assignment> log;
  std::vector<SimNode> nodes;
  int expired_units = 0;
  int expired_aggregators = 0;
  bool finished = false;
};

enum : size_t { kHalfSpeed = 1, kFlaky = 3, kGarbage = 4, kJoiner = 6 };

SimResult Simulate(AggregationRule rule, bool with_garbage) {
  TaskSpecView task;
  task.id = Blake2b("simulated-task");
  task.rounds = 12;
  task.units_per_round = 8;
  task.inner_steps = 20;
  task.batch_size = 16;
  task.flops_per_sample = 10'000'000;  // 3.2 GFLOP per unit: 4 blocks at 1 GFLOP/s
  task.model_bytes = kDim * 4;
  task.price_cap_per_gflop = 10;
  task.seed = 5;
  task.num_examples = 2048;
  const Dataset data = MakeDataset(task.seed, task.num_examples);

  std::vector<SimNode> nodes(7);
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeView& v = nodes[i].view;
    v.id.bytes[0] = static_cast<uint8_t>(i + 1);
    v.memory_bytes = 1 << 20;
    v.throughput_flops = 1'000'000'000;
    v.latency_ms = 10;
    v.bandwidth_bytes_per_s = 10'000'000;
    v.price_per_gflop = 1;
  }
  nodes[kHalfSpeed].view.throughput_flops /= 2;
  nodes[kFlaky].offline_from = 15;
  nodes[kGarbage].garbage = with_garbage;
  nodes[kJoiner].join_height = 40;

  RoundMachineConfig mc;
  mc.task = task.id;
  mc.rounds = task.rounds;
  mc.units_per_round = task.units_per_round;
  mc.verification_window_blocks = 2;
  std::vector<float> weights(kDim, 0.0f), momentum(kDim, 0.0f);
  mc.initial_weights = HashWeights(weights);
  auto machine = RoundStateMachine::Create(mc);
  CHECK(machine.ok());
  RoundStateMachine& m = *machine;

  SchedulerParams params;
  AggregationConfig agg;
  agg.rule = rule;
  // Robust rules count units, not nodes: the garbage node gets about 1.5 of the 8 units of a
  // round, sometimes 2, so the trimmed mean must drop 2 per side (Krum's automatic f is 2).
  agg.trim_fraction = 0.25;
  const OuterOptimizerConfig outer;

  SimResult out;
  out.initial_loss = Loss(data, weights);
  std::map<UnitId, uint64_t> finish_at;  // open units and the height their node finishes them
  std::map<UnitId, std::vector<float>> deltas;
  auto node_of = [&](const NodeId& id) -> SimNode& {
    return *std::find_if(nodes.begin(), nodes.end(),
                         [&](const SimNode& n) { return n.view.id == id; });
  };

  for (uint64_t h = 1; h < 1000 && m.phase() != RoundPhase::kRoundPhaseFinal; ++h) {
    for (SimNode& n : nodes) {
      if (n.online(h)) n.view.last_heartbeat_height = h;
    }
    auto up = m.OnBlock(h);
    CHECK(up.ok());
    for (const Assignment& a : up->expired) {
      ApplyMissedDeadline(node_of(a.node).view.reputation);
      finish_at.erase(a.unit);
      ++out.expired_units;
    }
    if (up->expired_aggregator) {
      ApplyMissedDeadline(node_of(up->expired_aggregator->node).view.reputation);
      ++out.expired_aggregators;
    }

    // Solvers whose unit is done commit it.
    for (const Assignment& a : m.OpenAssignments()) {
      auto it = finish_at.find(a.unit);
      SimNode& n = node_of(a.node);
      if (it == finish_at.end() || it->second != h || !n.online(h)) continue;
      std::vector<float> delta = TrainUnit(task, data, a.unit, weights);
      if (n.garbage) {
        for (float& x : delta) x *= -10.0f;
      }
      CHECK(m.OnUnitCommitted(a.unit, a.node, HashWeights(delta), h).ok());
      deltas[a.unit] = std::move(delta);
      finish_at.erase(it);
      n.busy_until = std::max(n.busy_until, h);
      ++n.units_committed;
      ++n.view.reputation.completed;
    }

    if (m.phase() == RoundPhase::kRoundPhaseAssigning) {
      std::vector<NodeView> views;
      for (SimNode& n : nodes) n.view.inflight_units = 0;
      for (const Assignment& a : m.OpenAssignments()) ++node_of(a.node).view.inflight_units;
      for (const SimNode& n : nodes) {
        if (h >= n.join_height) views.push_back(n.view);  // registered
      }
      auto r = AssignUnits(task, views, m.PendingUnits(), Blake2b("block" + std::to_string(h)), h,
                           params);
      CHECK(r.ok());
      CHECK(m.OnAssigned(r->assignments).ok());
      for (const Assignment& a : r->assignments) {
        SimNode& n = node_of(a.node);
        const uint64_t blocks = (EstimatedUnitMs(n.view, task, params) + 999) / 1000;
        const uint64_t start = std::max(h, n.busy_until);
        n.busy_until = start + blocks;
        finish_at[a.unit] = n.busy_until;
        ++n.units_assigned;
        out.log.push_back(a);
      }
    }

    if (m.NeedsAggregator()) {
      std::vector<NodeView> views;
      for (const SimNode& n : nodes) {
        if (h >= n.join_height) views.push_back(n.view);
      }
      auto a = AssignAggregator(task, views, m.round(), m.AggregatorExcluded(),
                                Blake2b("agg" + std::to_string(h)), h, params);
      CHECK(a.ok());
      CHECK(m.OnAggregatorAssigned(*a).ok());
    } else if (m.aggregator() && m.aggregator()->assigned_height < h &&
               m.phase() == RoundPhase::kRoundPhaseAggregating &&
               node_of(m.aggregator()->node).online(h)) {
      std::vector<Contribution> contribs;
      for (const CommittedUnit& c : m.CommittedUnits()) {
        contribs.push_back({c.unit, UnitSamples(task), deltas.at(c.unit)});
      }
      auto result = Aggregate(contribs, agg);
      CHECK(result.ok());
      OuterStep(weights, momentum, result->delta, outer);
      CHECK(m.OnAggregateCommitted(m.round(), m.aggregator()->node, HashWeights(weights), h).ok());
    }
    out.final_height = h;
  }
  out.finished = m.phase() == RoundPhase::kRoundPhaseFinal;
  out.final_loss = Loss(data, weights);
  out.final_weights = HashWeights(weights);
  CHECK(!out.finished || m.weights_history().back() == out.final_weights);
  out.nodes = nodes;
  return out;
}

TEST(SimulationTest, TaskCompletesWithFaultsAndIsDeterministic) {
  const SimResult a = Simulate(AggregationRule::kAggregationRuleWeightedMean, false);
  ASSERT_TRUE(a.finished) << "stopped at height " << a.final_height;
  EXPECT_LT(a.final_loss, a.initial_loss * 1e-3)
      << "initial " << a.initial_loss << " final " << a.final_loss;

  // The offline node's units expired, were reassigned, and cost it reputation.
  EXPECT_GT(a.expired_units, 0);
  EXPECT_GT(a.nodes[kFlaky].view.reputation.failures, 0u);
  // The joiner got work once it joined.
  EXPECT_GT(a.nodes[kJoiner].units_committed, 0);
  for (const Assignment& as : a.log) {
    if (as.node == a.nodes[kJoiner].view.id) {
      EXPECT_GE(as.assigned_height, 40u);
    }
  }
  // The half-speed node did about half the units of a full-speed node that was there throughout.
  double full = 0;
  for (size_t i : {size_t{0}, size_t{2}, size_t{4}, size_t{5}}) full += a.nodes[i].units_committed;
  full /= 4;
  const double ratio = a.nodes[kHalfSpeed].units_committed / full;
  EXPECT_GT(ratio, 0.3) << a.nodes[kHalfSpeed].units_committed << " vs " << full;
  EXPECT_LT(ratio, 0.7) << a.nodes[kHalfSpeed].units_committed << " vs " << full;

  // Same seed, same run: bit for bit.
  const SimResult b = Simulate(AggregationRule::kAggregationRuleWeightedMean, false);
  EXPECT_EQ(a.final_weights, b.final_weights);
  EXPECT_EQ(a.log, b.log);
}

TEST(SimulationTest, RobustRulesTrainThroughAGarbageSolver) {
  const SimResult mean = Simulate(AggregationRule::kAggregationRuleWeightedMean, true);
  for (AggregationRule rule :
       {AggregationRule::kAggregationRuleTrimmedMean, AggregationRule::kAggregationRuleMedian,
        AggregationRule::kAggregationRuleCenteredClip, AggregationRule::kAggregationRuleKrum}) {
    const SimResult robust = Simulate(rule, true);
    ASSERT_TRUE(robust.finished) << AggregationRuleName(rule);
    EXPECT_LT(robust.final_loss, robust.initial_loss * 1e-2)
        << AggregationRuleName(rule) << " final " << robust.final_loss;
    EXPECT_LT(robust.final_loss * 100, mean.final_loss)
        << AggregationRuleName(rule) << " " << robust.final_loss << " vs mean " << mean.final_loss;
  }
}

}  // namespace
}  // namespace meshlearn::protocol
