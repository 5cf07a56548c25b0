#include "meshlearn/protocol/stage_placement.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
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

// The minimum-total assignment of senders to receivers for the square `cost` matrix (cost[r][j]:
// sender r to receiver j), the lexicographically smallest among equal totals: sender 0 takes the
// smallest receiver index that still allows a minimum total, then sender 1, and so on. result[r]
// is sender r's receiver. The Hungarian algorithm (O(R^3)) gives a minimum and its dual
// potentials; the pairings of minimum total are exactly the perfect matchings of the edges the
// potentials make tight (complementary slackness), and the smallest of those is found sender by
// sender: a smaller tight receiver j replaces sender r's current one when an alternating path
// through the unfixed senders hands r's receiver to j's sender (O(R^2) per try, O(R^4) at worst).
std::vector<size_t> MinCostPairing(const std::vector<std::vector<uint64_t>>& cost) {
  const size_t n = cost.size();
  // Costs are below 2^44 (StageLinkCostUs: latency < 2^43 us, two registered 32-bit figures in ms
  // summed; transfer at most kMaxStageTransferUs = 2^43 us), or 2^58 for
  // a pair ChooseStagesByLinks forbids (never needed: every candidate stays reachable at a real
  // cost), so for n below 2^14 (ChooseStagesByLinks: at most 3R) the potentials, at most n real
  // costs, and every reduced cost stay below kInf.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0), min_v(n + 1);
  std::vector<size_t> owner(n + 1, 0), way(n + 1, 0);  // 1-based; owner[j]: receiver j's sender
  auto c = [&](size_t i, size_t j) { return static_cast<int64_t>(cost[i - 1][j - 1]); };
  for (size_t i = 1; i <= n; ++i) {
    owner[0] = i;
    size_t j0 = 0;
    std::fill(min_v.begin(), min_v.end(), kInf);
    std::vector<bool> used(n + 1, false);
    do {
      used[j0] = true;
      const size_t i0 = owner[j0];
      int64_t delta = kInf;
      size_t j1 = 0;
      for (size_t j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const int64_t reduced = c(i0, j) - u[i0] - v[j];
        if (reduced < min_v[j]) {
          min_v[j] = reduced;
          way[j] = j0;
        }
        if (min_v[j] < delta) {
          delta = min_v[j];
          j1 = j;
        }
      }
      for (size_t j = 0; j <= n; ++j) {
        if (used[j]) {
          u[owner[j]] += delta;
          v[j] -= delta;
        } else {
          min_v[j] -= delta;
        }
      }
      j0 = j1;
    } while (owner[j0] != 0);
    do {
      const size_t j1 = way[j0];
      owner[j0] = owner[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  // 0-based: the tight edges, the current matching both ways.
  auto tight = [&](size_t r, size_t j) { return c(r + 1, j + 1) == u[r + 1] + v[j + 1]; };
  std::vector<size_t> to(n), from(n);
  for (size_t j = 1; j <= n; ++j) {
    to[owner[j] - 1] = j - 1;
    from[j - 1] = owner[j] - 1;
  }
  std::vector<bool> fixed(n, false);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < to[r]; ++j) {
      if (!tight(r, j) || fixed[from[j]]) continue;
      // An alternating path from j's sender to r's receiver, through unfixed senders other than
      // r, each taking a tight receiver whose sender moves on.
      const size_t start = from[j], goal = to[r];
      std::vector<size_t> came(n, n);  // receiver -> the sender that takes it on the path
      std::vector<size_t> queue = {start};
      std::vector<bool> seen(n, false);
      seen[start] = true;
      bool found = false;
      for (size_t q = 0; q < queue.size() && !found; ++q) {
        const size_t x = queue[q];
        for (size_t k = 0; k < n && !found; ++k) {
          if (k == j || came[k] != n || !tight(x, k)) continue;
          came[k] = x;
          if (k == goal) {
            found = true;
          } else if (!fixed[from[k]] && from[k] != r && !seen[from[k]]) {
            seen[from[k]] = true;
            queue.push_back(from[k]);
          }
        }
      }
      if (!found) continue;
      // Walk back from r's receiver: each sender on the path takes the receiver it reached.
      for (size_t k = goal;;) {
        const size_t x = came[k];
        const size_t previous = to[x];
        to[x] = k;
        from[k] = x;
        if (x == start) break;
        k = previous;
      }
      to[r] = j;
      from[j] = r;
      break;
    }
    fixed[r] = true;
  }
  return to;
}

// Whether the memory and speed rules see `a` and `b` as the same: equal throughput and memory
// (only the id orders them).
bool SameClass(const NodeView& a, const NodeView& b) {
  return a.throughput_flops == b.throughput_flops && a.memory_bytes == b.memory_bytes;
}

// Chooses and pairs the nodes of each stage s >= 1 by link cost (see the top of
// stage_placement.h). `order`: every eligible node in the placement order; `by_id`: the same;
// `boundary_bytes[s-1]`: what a step moves between stages s-1 and s.
void ChooseStagesByLinks(const std::vector<const NodeView*>& order,
                         const std::map<NodeId, const NodeView*>& by_id,
                         std::span<const uint64_t> boundary_bytes,
                         std::vector<std::vector<NodeId>>& chains) {
  const size_t replicas = chains.size();
  const size_t stages = chains[0].size();
  std::set<NodeId> taken, placed;  // taken: by the stages chosen so far
  for (const std::vector<NodeId>& chain : chains) {
    taken.insert(chain[0]);
    placed.insert(chain.begin(), chain.end());
  }
  for (size_t s = 1; s < stages; ++s) {
    const uint64_t bytes = boundary_bytes[s - 1];
    auto linked = [&](const NodeView& n) {
      return std::ranges::any_of(chains, [&](const std::vector<NodeId>& chain) {
        const NodeView& from = *by_id.at(chain[s - 1]);
        return ReportedLink(from, n.id) != nullptr || ReportedLink(n, from.id) != nullptr;
      });
    };
    // The stage's classes (one node each) and how many of its nodes each has.
    std::vector<const NodeView*> classes;
    std::vector<size_t> wanted;
    auto class_of = [&](const NodeView& n) {
      for (size_t c = 0; c < classes.size(); ++c) {
        if (SameClass(*classes[c], n)) return c;
      }
      return classes.size();
    };
    for (const std::vector<NodeId>& chain : chains) {
      const NodeView& n = *by_id.at(chain[s]);
      const size_t c = class_of(n);
      if (c == classes.size()) {
        classes.push_back(&n);
        wanted.push_back(0);
      }
      ++wanted[c];
    }
    // The candidates: the stage's placed nodes an earlier stage did not take (in replica order),
    // then free nodes of the same classes, in the placement order: those that fill a class short
    // of nodes (an earlier stage took some of its placed ones), nodes placed on no stage first,
    // and the R with the cheapest reported link from a stage s-1 node (then the placement
    // order), so at most 3R candidates. A node a later stage was placed on may be taken: that
    // stage then fills its class the same way (there are enough: the stages before it took
    // exactly their counts of each class).
    std::vector<const NodeView*> candidates, more;
    std::vector<size_t> have(classes.size(), 0);
    std::set<NodeId> listed;
    auto list = [&](const NodeView* n, std::vector<const NodeView*>& into) {
      into.push_back(n);
      listed.insert(n->id);
      ++have[class_of(*n)];
    };
    for (const std::vector<NodeId>& chain : chains) {
      if (taken.count(chain[s]) == 0) list(by_id.at(chain[s]), candidates);
    }
    for (const bool placed_elsewhere : {false, true}) {
      for (const NodeView* n : order) {
        const size_t c = class_of(*n);
        if (c == classes.size() || taken.count(n->id) != 0 || listed.count(n->id) != 0) continue;
        if ((placed.count(n->id) != 0) == placed_elsewhere && have[c] < wanted[c]) list(n, more);
      }
    }
    struct Linked {
      uint64_t cost;  // its cheapest reported link from a stage s-1 node
      size_t rank;    // its place in the placement order
      const NodeView* node;
    };
    std::vector<Linked> linked_nodes;
    for (size_t i = 0; i < order.size(); ++i) {
      const NodeView& n = *order[i];
      if (class_of(n) == classes.size() || taken.count(n.id) != 0 || listed.count(n.id) != 0) {
        continue;
      }
      uint64_t cost = UINT64_MAX;
      for (const std::vector<NodeId>& chain : chains) {
        const NodeView& from = *by_id.at(chain[s - 1]);
        if (ReportedLink(from, n.id) != nullptr || ReportedLink(n, from.id) != nullptr) {
          cost = std::min(cost, StageLinkCostUs(from, n, bytes));
        }
      }
      if (cost != UINT64_MAX) linked_nodes.push_back({cost, i, &n});
    }
    std::sort(linked_nodes.begin(), linked_nodes.end(), [](const Linked& a, const Linked& b) {
      return a.cost != b.cost ? a.cost < b.cost : a.rank < b.rank;
    });
    linked_nodes.resize(std::min(linked_nodes.size(), replicas));
    for (const Linked& l : linked_nodes) list(l.node, more);
    std::map<NodeId, size_t> rank;
    for (size_t i = 0; i < order.size(); ++i) rank[order[i]->id] = i;
    std::sort(more.begin(), more.end(), [&](const NodeView* a, const NodeView* b) {
      return rank.at(a->id) < rank.at(b->id);
    });
    candidates.insert(candidates.end(), more.begin(), more.end());
    std::vector<NodeId> chosen(replicas);
    if (bytes == 0 ||
        !std::ranges::any_of(candidates, [&](const NodeView* n) { return linked(*n); })) {
      // Nothing measured (or nothing sent) across this boundary: the order stays, a node an
      // earlier stage took replaced by the first free candidate of its class.
      std::set<NodeId> used;
      for (size_t r = 0; r < replicas; ++r) {
        if (taken.count(chains[r][s]) == 0) used.insert(chosen[r] = chains[r][s]);
      }
      for (size_t r = 0; r < replicas; ++r) {
        if (taken.count(chains[r][s]) == 0) continue;
        for (const NodeView* n : candidates) {
          if (used.count(n->id) == 0 && SameClass(*n, *by_id.at(chains[r][s]))) {
            used.insert(chosen[r] = n->id);
            break;
          }
        }
      }
    } else {
      // Rows: the replicas' stage s-1 nodes, then for each class one row per candidate beyond
      // its wanted count, which takes only that class's candidates at no cost (the candidates
      // left out). So the replicas take exactly `wanted` nodes of each class, at the least total.
      // kForbidden exceeds any total of real costs (under 2^44 each, R < 2^13, see MinCostPairing).
      constexpr uint64_t kForbidden = uint64_t{1} << 58;
      std::vector<std::vector<uint64_t>> cost;
      for (size_t r = 0; r < replicas; ++r) {
        const NodeView& from = *by_id.at(chains[r][s - 1]);
        std::vector<uint64_t> row;
        for (const NodeView* n : candidates) row.push_back(StageLinkCostUs(from, *n, bytes));
        cost.push_back(std::move(row));
      }
      for (size_t c = 0; c < classes.size(); ++c) {
        for (size_t k = wanted[c]; k < have[c]; ++k) {
          std::vector<uint64_t> row;
          for (const NodeView* n : candidates) row.push_back(class_of(*n) == c ? 0 : kForbidden);
          cost.push_back(std::move(row));
        }
      }
      const std::vector<size_t> pairing = MinCostPairing(cost);
      for (size_t r = 0; r < replicas; ++r) chosen[r] = candidates[pairing[r]]->id;
    }
    for (size_t r = 0; r < replicas; ++r) {
      chains[r][s] = chosen[r];
      taken.insert(chosen[r]);
    }
  }
}

}  // namespace

uint64_t StageLinkCostUs(const NodeView& from, const NodeView& to, uint64_t bytes) {
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
  // Nothing overflows: latency < 2^33 ms, bytes x 10^6 < 2^60 (kMaxStageBoundaryBytes), and the
  // rounding up adds the remainder's one rather than bandwidth - 1 (a registered bandwidth may be
  // near 2^64).
  const uint64_t scaled = bytes * 1'000'000;
  const uint64_t transfer = scaled / bandwidth + (scaled % bandwidth != 0 ? 1 : 0);
  return latency_ms * 1000 + std::min(transfer, kMaxStageTransferUs);
}

uint64_t StageDiskBytes(uint64_t memory_bytes, uint32_t inner_steps) {
  const uint64_t steps = std::max<uint64_t>(inner_steps, 1);
  return memory_bytes > UINT64_MAX / steps ? UINT64_MAX : memory_bytes * steps;
}

uint64_t StageHoldBytes(const NodeView& node, uint32_t inner_steps) {
  if (node.disk_bytes == 0) return node.memory_bytes;  // none declared: not checked
  // What its stage units' files leave of it (they may take it all: a node declared a smaller
  // disk since, or was placed before the ledger counted them).
  const uint64_t left =
      node.disk_bytes > node.disk_held_bytes ? node.disk_bytes - node.disk_held_bytes : 0;
  return std::min(node.memory_bytes, left / std::max<uint64_t>(inner_steps, 1));
}

Result<std::vector<std::vector<NodeId>>> PlaceStages(
    const TaskSpecView& task, std::span<const StageNeed> stages,
    std::span<const uint64_t> boundary_bytes, uint32_t replicas, std::span<const NodeView> declared,
    uint64_t height, const SchedulerParams& params) {
  if (stages.empty() || replicas == 0) {
    return InvalidArgument("stage placement: " + std::to_string(stages.size()) + " stages x " +
                           std::to_string(replicas) + " replicas: both must be at least 1");
  }
  if (boundary_bytes.size() + 1 != stages.size()) {
    return InvalidArgument(
        "stage placement: " + std::to_string(stages.size()) + " stages need " +
        std::to_string(stages.size() - 1) + " boundary byte counts, got " +
        std::to_string(boundary_bytes.size()) +
        ": give one per cut between consecutive stages (engine::CutBoundaryBytes "
        "of the task's cut)");
  }
  for (size_t b = 0; b < boundary_bytes.size(); ++b) {
    if (boundary_bytes[b] > kMaxStageBoundaryBytes) {
      return InvalidArgument("stage placement: boundary " + std::to_string(b) + " moves " +
                             std::to_string(boundary_bytes[b]) + " bytes a step, over " +
                             std::to_string(kMaxStageBoundaryBytes) +
                             ": cut the model at other layers (network.cut), or train a smaller "
                             "batch or shorter sequences (train.batch_size, train.seq_len)");
    }
  }
  // Every rule below sees a node's memory as what it holds of a stage (StageHoldBytes: its
  // declared disk counted).
  std::vector<NodeView> nodes(declared.begin(), declared.end());
  for (NodeView& n : nodes) n.memory_bytes = StageHoldBytes(n, task.inner_steps);
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
    // A node "holds that much" when its memory holds the stage and its declared disk, less the
    // files of the stage units it holds, the stage's files (StageHoldBytes). The nodes eligible
    // by their memory alone that hold it in memory but not its files on disk are named (the
    // first 3, in the order given: the ledger's is by id), with their figures.
    const uint64_t disk_need = StageDiskBytes(need, task.inner_steps);
    std::string short_of_disk;
    size_t disk_short = 0;
    for (const NodeView& d : declared) {
      if (d.memory_bytes < need || StageHoldBytes(d, task.inner_steps) >= need ||
          CheckEligibility(d, floor, height, params) != Eligibility::kEligibilityOk) {
        continue;
      }
      if (++disk_short > 3) continue;
      short_of_disk += std::string(disk_short == 1 ? " (" : "; ") + "node " + d.id.ShortHex() +
                       " declares " + std::to_string(d.disk_bytes) + " bytes of disk, " +
                       std::to_string(d.disk_held_bytes) +
                       " of them held by the files of the stage units it holds";
    }
    if (disk_short > 3) short_of_disk += "; " + std::to_string(disk_short - 3) + " more";
    if (disk_short != 0) {
      short_of_disk = "; " + std::to_string(disk_short) +
                      " node(s) whose memory holds it are short of disk for its files" +
                      short_of_disk + ")";
    }
    return FailedPrecondition(
        "stage placement: stage " + std::to_string(bad.stage) + " needs " + std::to_string(need) +
        " bytes of memory; " + std::to_string(holders) + " of the " + std::to_string(free.size()) +
        " eligible nodes hold that much, and " + std::to_string(wanting) + " stage slots (" +
        std::to_string(replicas) + " replicas) need at least that much" + short_of_disk +
        ": add nodes with " + std::to_string(need) + " bytes or more, and " +
        std::to_string(disk_need) +
        " bytes or more of disk for the stage's files where they declare one (node.toml "
        "disk_limit_bytes; a node's files of a round are deleted when the round is final), run "
        "fewer replicas, or cut the model into more stages "
        "(network.stages)");
  }

  std::vector<std::vector<NodeId>> chains(replicas, std::vector<NodeId>(stages.size()));
  const std::vector<const NodeView*> order = free;
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
  ChooseStagesByLinks(order, by_id, boundary_bytes, chains);
  return chains;
}

}  // namespace meshlearn::protocol
