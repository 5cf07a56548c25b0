#include "meshlearn/protocol/stage_placement.h"

#include <algorithm>
#include <map>
#include <string>

namespace meshlearn::protocol {
namespace {

struct PlaceSlot {
  uint32_t replica = 0;
  uint32_t stage = 0;
  StageNeed need;
};

// Whether the slots' memory needs can all be met by distinct nodes of `memories`: sorted both
// largest first, the i-th largest need must fit the i-th largest node (a node that fits a need
// fits every smaller one, so matching in that order loses nothing).
bool PlaceFeasible(std::vector<uint64_t> needs, std::vector<uint64_t> memories) {
  if (needs.size() > memories.size()) return false;
  std::sort(needs.rbegin(), needs.rend());
  std::sort(memories.rbegin(), memories.rend());
  for (size_t i = 0; i < needs.size(); ++i) {
    if (memories[i] < needs[i]) return false;
  }
  return true;
}

// `node`'s reported link to `peer`, or null. node.links is sorted by peer.
const PeerLink* ReportedLink(const NodeView& node, const NodeId& peer) {
  auto it = std::lower_bound(node.links.begin(), node.links.end(), peer,
                             [](const PeerLink& l, const NodeId& p) { return l.peer < p; });
  return it != node.links.end() && it->peer == peer ? &*it : nullptr;
}

// Pairs the nodes of each stage s >= 1 with the replicas' stage s-1 nodes by link cost (see the
// top of stage_placement.h). `by_id` holds every placed node.
void PairStagesByLinks(const std::map<NodeId, const NodeView*>& by_id,
                       std::vector<std::vector<NodeId>>& chains) {
  const size_t replicas = chains.size();
  for (size_t s = 1; s < chains[0].size(); ++s) {
    bool reported = false;
    for (size_t a = 0; a < replicas && !reported; ++a) {
      for (size_t b = 0; b < replicas && !reported; ++b) {
        const NodeView& from = *by_id.at(chains[a][s - 1]);
        const NodeView& to = *by_id.at(chains[b][s]);
        reported = ReportedLink(from, to.id) != nullptr || ReportedLink(to, from.id) != nullptr;
      }
    }
    if (!reported) continue;  // nothing measured across this boundary: the order stays
    struct Pair {
      uint64_t cost;
      size_t replica;  // whose stage s-1 node sends
      size_t node;     // which of the stage's nodes (by its replica before pairing) receives
    };
    std::vector<Pair> pairs;
    for (size_t r = 0; r < replicas; ++r) {
      for (size_t j = 0; j < replicas; ++j) {
        pairs.push_back(
            {StageLinkCostUs(*by_id.at(chains[r][s - 1]), *by_id.at(chains[j][s])), r, j});
      }
    }
    std::sort(pairs.begin(), pairs.end(), [&](const Pair& a, const Pair& b) {
      if (a.cost != b.cost) return a.cost < b.cost;
      if (a.replica != b.replica) return chains[a.replica][s - 1] < chains[b.replica][s - 1];
      return chains[a.node][s] < chains[b.node][s];
    });
    std::vector<NodeId> paired(replicas);
    std::vector<bool> sender_done(replicas, false), node_done(replicas, false);
    for (const Pair& p : pairs) {
      if (sender_done[p.replica] || node_done[p.node]) continue;
      paired[p.replica] = chains[p.node][s];
      sender_done[p.replica] = node_done[p.node] = true;
    }
    for (size_t r = 0; r < replicas; ++r) chains[r][s] = paired[r];
  }
}

}  // namespace

uint64_t StageLinkCostUs(const NodeView& from, const NodeView& to) {
  uint64_t latency_ms = 0, bandwidth = 0;
  if (const PeerLink* l = ReportedLink(from, to.id)) {
    latency_ms = l->latency_ms;
    bandwidth = l->bandwidth_bytes_per_s;
  } else if (const PeerLink* back = ReportedLink(to, from.id)) {
    latency_ms = back->latency_ms;
    bandwidth = back->bandwidth_bytes_per_s;
  } else {
    latency_ms = uint64_t{from.latency_ms} + to.latency_ms;
    bandwidth = std::min(from.bandwidth_bytes_per_s, to.bandwidth_bytes_per_s);
  }
  bandwidth = std::max<uint64_t>(bandwidth, 1);
  // Neither term overflows: latency < 2^33 ms, and kStageLinkCostBytes x 10^6 < 2^41.
  return latency_ms * 1000 + (kStageLinkCostBytes * 1'000'000 + bandwidth - 1) / bandwidth;
}

Result<std::vector<std::vector<NodeId>>> PlaceStages(
    const TaskSpecView& task, std::span<const StageNeed> stages, uint32_t replicas,
    std::span<const NodeView> nodes, uint64_t height, const SchedulerParams& params) {
  if (stages.empty() || replicas == 0) {
    return InvalidArgument("stage placement: " + std::to_string(stages.size()) + " stages x " +
                           std::to_string(replicas) + " replicas: both must be at least 1");
  }
  // Eligibility as the scheduler's, with the smallest stage as the memory floor.
  TaskSpecView floor = task;
  floor.memory_required_bytes = stages[0].memory_bytes;
  for (const StageNeed& s : stages) {
    floor.memory_required_bytes = std::min(floor.memory_required_bytes, s.memory_bytes);
  }
  floor.memory_required_bytes = std::max<uint64_t>(floor.memory_required_bytes, 1);
  std::vector<const NodeView*> free;
  for (const NodeView& n : nodes) {
    if (CheckEligibility(n, floor, height, params) == Eligibility::kEligibilityOk) {
      free.push_back(&n);
    }
  }
  // Fastest first; then the smaller memory; then the id (a total order: no input order matters).
  std::sort(free.begin(), free.end(), [](const NodeView* a, const NodeView* b) {
    if (a->throughput_flops != b->throughput_flops)
      return a->throughput_flops > b->throughput_flops;
    if (a->memory_bytes != b->memory_bytes) return a->memory_bytes < b->memory_bytes;
    return a->id < b->id;
  });
  std::vector<PlaceSlot> slots;
  for (uint32_t r = 0; r < replicas; ++r) {
    for (uint32_t s = 0; s < stages.size(); ++s) slots.push_back({r, s, stages[s]});
  }
  std::sort(slots.begin(), slots.end(), [](const PlaceSlot& a, const PlaceSlot& b) {
    if (a.need.flops != b.need.flops) return a.need.flops > b.need.flops;
    if (a.need.memory_bytes != b.need.memory_bytes) {
      return a.need.memory_bytes > b.need.memory_bytes;
    }
    if (a.stage != b.stage) return a.stage < b.stage;
    return a.replica < b.replica;
  });

  auto memories_of = [](const std::vector<const NodeView*>& v) {
    std::vector<uint64_t> m;
    m.reserve(v.size());
    for (const NodeView* n : v) m.push_back(n->memory_bytes);
    return m;
  };
  auto needs_of = [&](size_t from) {
    std::vector<uint64_t> m;
    m.reserve(slots.size() - from);
    for (size_t i = from; i < slots.size(); ++i) m.push_back(slots[i].need.memory_bytes);
    return m;
  };
  if (!PlaceFeasible(needs_of(0), memories_of(free))) {
    // Name the largest need that cannot be met: the first i where the i-th largest need exceeds
    // the i-th largest node (or the nodes run out).
    std::vector<PlaceSlot> by_need = slots;
    std::stable_sort(by_need.begin(), by_need.end(), [](const PlaceSlot& a, const PlaceSlot& b) {
      return a.need.memory_bytes > b.need.memory_bytes;
    });
    std::vector<uint64_t> mem = memories_of(free);
    std::sort(mem.rbegin(), mem.rend());
    size_t i = 0;
    while (i < by_need.size() && i < mem.size() && mem[i] >= by_need[i].need.memory_bytes) ++i;
    const PlaceSlot& bad = by_need[std::min(i, by_need.size() - 1)];
    const uint64_t need = bad.need.memory_bytes;
    size_t holders = 0, wanting = 0;
    for (uint64_t m : mem) holders += m >= need ? 1 : 0;
    for (const PlaceSlot& s : slots) wanting += s.need.memory_bytes >= need ? 1 : 0;
    return FailedPrecondition(
        "stage placement: stage " + std::to_string(bad.stage) + " needs " + std::to_string(need) +
        " bytes of memory; " + std::to_string(holders) + " of the " + std::to_string(free.size()) +
        " eligible nodes hold that much, and " + std::to_string(wanting) + " stage slots (" +
        std::to_string(replicas) + " replicas) need at least that much: add nodes with " +
        std::to_string(need) +
        " bytes or more, run fewer replicas, or cut the model into more stages (network.stages)");
  }

  std::vector<std::vector<NodeId>> chains(replicas, std::vector<NodeId>(stages.size()));
  std::map<NodeId, const NodeView*> by_id;
  for (const NodeView* n : free) by_id[n->id] = n;
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::vector<uint64_t> rest = needs_of(i + 1);
    bool placed = false;
    for (size_t j = 0; j < free.size() && !placed; ++j) {
      if (free[j]->memory_bytes < slots[i].need.memory_bytes) continue;
      std::vector<const NodeView*> left = free;
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(j));
      if (!PlaceFeasible(rest, memories_of(left))) continue;
      chains[slots[i].replica][slots[i].stage] = free[j]->id;
      free = std::move(left);
      placed = true;
    }
    // Feasible before this slot, so some fitting node keeps the rest feasible.
    if (!placed) return Internal("stage placement: no node for a feasible slot");
  }
  PairStagesByLinks(by_id, chains);
  return chains;
}

}  // namespace meshlearn::protocol
