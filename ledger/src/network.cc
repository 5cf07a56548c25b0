// Network training: the ledger runs each open task's protocol::RoundStateMachine (kept encoded
// in TaskRecord::runtime) and the protocol's scheduler.
//
//   CommitUnit       a solver's result    -> RoundStateMachine::OnUnitCommitted, unit committed
//   CommitAggregate  an aggregator's state -> RoundStateMachine::OnAggregateCommitted
//   EndBlock         after every block's transactions (sequencer, follower, replay): expire,
//                    assign units and aggregators, pay finalized rounds, finish final tasks.
//
// Everything here is a deterministic function of the state, the height and the previous block
// hash: sorted maps, integer arithmetic, no clocks. See docs/ledger.md, "Network training".
#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "execute.h"
#include "meshlearn/base/log.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/unit_check.h"
#include "stage_disk.h"

namespace meshlearn::ledger {

protocol::TaskSpecView TaskSpecViewOf(const Hash256& task_id, const TaskParams& p,
                                      Amount price_cap) {
  protocol::TaskSpecView v;
  v.id = task_id;
  v.rounds = p.rounds;
  v.units_per_round = p.units_per_round;
  v.inner_steps = p.inner_steps;
  v.batch_size = p.batch_size;
  v.flops_per_sample = p.flops_per_sample;
  v.model_bytes = p.model_bytes;
  v.memory_required_bytes = p.memory_bytes;
  v.eval_memory_bytes = p.eval_memory_bytes;
  v.stages = std::max<uint32_t>(p.stages, 1);
  v.price_cap_per_gflop = price_cap;
  v.seed = p.seed;
  v.num_examples = p.num_examples;
  return v;
}

protocol::SchedulerParams SchedulerParamsOf(const Genesis& g) {
  protocol::SchedulerParams sp;
  sp.block_interval_ms = static_cast<uint64_t>(g.block_interval_ms);
  sp.liveness_blocks = g.params.liveness_blocks;
  sp.deadline_slack_permille = g.params.deadline_slack_permille;
  sp.min_deadline_blocks = g.params.min_deadline_blocks;
  return sp;
}

Amount UnitCost(const TaskRecord& t, Amount price_per_gflop) {
  return protocol::UnitCostTokens(TaskSpecViewOf(t.id, t.params, t.price_cap), price_per_gflop);
}

Result<protocol::RoundStateMachine> LoadMachine(const TaskRecord& t) {
  if (t.runtime.empty()) {
    return FailedPrecondition("task " + t.id.ShortHex() +
                              " has no round state (not a network task)");
  }
  Result<protocol::RoundStateMachine> m = protocol::RoundStateMachine::Decode(t.runtime);
  if (!m.ok()) return DataLoss("task " + t.id.ShortHex() + ": " + m.status().message());
  return m;
}

void SaveMachine(LedgerState& s, const Hash256& task_id, const protocol::RoundStateMachine& m) {
  Bytes enc = m.Encode();
  const TaskRecord* t = s.tasks.Find(task_id);
  if (t != nullptr && t->runtime == enc) return;  // an unchanged task stays clean
  if (TaskRecord* mt = s.tasks.FindMutable(task_id)) mt->runtime = std::move(enc);
}

Result<const TaskRecord*> OpenTaskFor(const LedgerState& s, const Hash256& task_id,
                                      std::string_view what) {
  const TaskRecord* t = s.tasks.Find(task_id);
  if (t == nullptr) return NotFound(std::string(what) + ": task " + task_id.ToHex() + " not found");
  if (t->status != TaskStatus::kOpen) {
    return FailedPrecondition(std::string(what) + ": task " + task_id.ShortHex() + " is " +
                              std::string(TaskStatusName(t->status)));
  }
  return t;
}

Status CheckNodeSender(const LedgerState& s, const PublicKey& node_id, const PublicKey& sender,
                       std::string_view what) {
  const NodeRecord* n = s.nodes.Find(node_id);
  if (n == nullptr) {
    return NotFound(std::string(what) + ": node " + node_id.ToHex() + " is not registered");
  }
  if (sender != node_id && sender != n->owner) {
    return PermissionDenied(std::string(what) + ": the sender must be node " + node_id.ShortHex() +
                            " itself or its owner " + n->owner.ShortHex());
  }
  return Status::Ok();
}

bool LinkedToCheater(const LedgerState& s, const PublicKey& cheater, const PublicKey& who) {
  if (who == cheater) return true;
  const NodeRecord* c = s.nodes.Find(cheater);
  if (c == nullptr) return false;
  if (who == c->owner) return true;
  const NodeRecord* n = s.nodes.Find(who);
  return n != nullptr && n->owner == c->owner;
}

void CountFailure(LedgerState& s, const PublicKey& node_id) {
  if (NodeRecord* n = s.nodes.FindMutable(node_id)) {
    n->reputation.failures++;
    n->reputation.clean_streak = 0;
  }
}

uint32_t UnitIndex(const TaskRecord& t, const protocol::UnitId& u) {
  return u.round * t.params.units_per_round + u.shard;
}

namespace {

using protocol::RoundStateMachine;

// Active nodes with `role`, in id order, as the scheduler sees them.
std::vector<protocol::NodeView> NodeViews(const LedgerState& s, uint32_t role,
                                          const std::map<PublicKey, uint64_t>& inflight) {
  std::vector<protocol::NodeView> out;
  for (const auto& [id, n] : s.nodes.rows()) {
    if ((n.roles & role) == 0 || n.status != NodeStatus::kActive) continue;
    protocol::NodeView v;
    v.id = id;
    v.memory_bytes = n.capabilities.memory_bytes;
    v.disk_bytes = n.capabilities.disk_bytes;
    v.throughput_flops = n.capabilities.throughput;
    v.latency_ms = n.capabilities.latency_ms;
    v.bandwidth_bytes_per_s = n.capabilities.bandwidth_bytes_per_s;
    v.price_per_gflop = n.price;
    v.last_heartbeat_height = n.last_heartbeat_height;
    v.reputation.completed = n.reputation.units_completed;
    v.reputation.verified_clean = n.reputation.units_verified_clean;
    v.reputation.clean_streak = n.reputation.clean_streak;
    v.reputation.failures = n.reputation.failures;
    v.reputation.slashes = n.reputation.slashes;
    v.status = protocol::NodeStatus::kNodeStatusActive;
    auto it = inflight.find(id);
    uint64_t q = it == inflight.end() ? 0 : it->second;
    v.inflight_units = static_cast<uint32_t>(std::min<uint64_t>(q, UINT32_MAX));
    v.links.reserve(n.links.size());
    for (const NodeLink& l : n.links) {
      v.links.push_back({l.peer, l.latency_ms, l.bandwidth_bytes_per_s});
    }
    out.push_back(std::move(v));
  }
  return out;
}

// The disk the files of each node's stage units take (NodeView::disk_held_bytes): the sum of
// protocol::StageDiskBytes of every stage unit of an open pipeline task that the ledger records
// as the node's in a round not yet final (ForEachStageUnitHeld, stage_disk.h). A node keeps a
// unit's files (its checkpoints and step tensors) while node_work lists the unit as its own
// (`stage_units`, the same units) and deletes them at its next pin review once it does not
// (node::PinKeeper, every block before it takes work: Stager::ReleaseEvidence): when rounds_settled
// passes the round, when the unit expired or went to another node before the node committed it,
// or when a re-run reset its commit and placed it elsewhere; a closed task's all at once. Its
// check settling does not free them: a round's units can be checked and challenged until the
// round is final. The task being placed, `placing`, counts from `placing_final` (its machine's
// final_rounds: this block's step 4 settles them, so the node has deleted their files before it
// sees the new unit). Saturates at UINT64_MAX.
std::map<PublicKey, uint64_t> StageDiskHeld(const LedgerState& s, const Hash256& placing,
                                            uint32_t placing_final) {
  std::map<PublicKey, uint64_t> held;
  for (const auto& [id, t] : s.tasks.rows()) {
    const uint32_t final_rounds =
        id == placing ? std::max(t.rounds_settled, placing_final) : t.rounds_settled;
    ForEachStageUnitHeld(
        t, final_rounds,
        [&](uint32_t index) {
          return s.units.Find({id, index});
        },
        [&](const WorkUnit& u) {
          const uint32_t stage = StageSlotOf(t.params, u.index).stage;
          const uint64_t bytes =
              protocol::StageDiskBytes(t.params.stage_memory_bytes[stage], t.params.inner_steps);
          uint64_t& sum = held[u.assignee];
          sum = bytes > UINT64_MAX - sum ? UINT64_MAX : sum + bytes;
        });
  }
  return held;
}

// Pays round `round` of a finalized task: each committed unit its cost at its assignment price,
// the aggregator one unit's cost at its price; never more than the escrow left.
Status SettleRound(LedgerState& s, const ChainParams& p, const Hash256& task_id, uint32_t round) {
  const TaskRecord* t = s.tasks.Find(task_id);
  const uint32_t per_round = t->params.units_per_round;
  for (uint32_t shard = 0; shard < per_round; ++shard) {
    uint32_t index = round * per_round + shard;
    const WorkUnit* u = s.units.Find({task_id, index});
    if (u == nullptr || u->status != WorkUnitStatus::kCommitted) continue;
    ML_RETURN_IF_ERROR(SettleAtAssignedPrice(s, p, task_id, index));
  }
  t = s.tasks.Find(task_id);
  if (round < t->round_results.size()) {
    const RoundResult& rr = t->round_results[round];
    const PublicKey aggregator = rr.aggregator;
    const NodeRecord* agg = s.nodes.Find(aggregator);
    if (agg != nullptr) {
      Amount amount = std::min(UnitCost(*t, rr.aggregator_price), t->escrow);
      PublicKey owner = agg->owner;
      ML_RETURN_IF_ERROR(PayFromEscrow(s, p, task_id, owner, amount));
      s.tasks.FindMutable(task_id)->round_results[round].aggregator_paid = amount;
      NodeEarnings& e = s.nodes.FindMutable(aggregator)->earnings;
      ML_RETURN_IF_ERROR(CheckedAdd(e.aggregation, amount, &e.aggregation, "node earnings"));
    }
  }
  return Status::Ok();
}

// A pipeline replica is one piece of work: its stages exchange activations and gradients every
// micro-batch, so one stage cannot train again alone once its neighbours have finished. So a
// replica with a pending stage (its deadline passed, or a check re-runs it) goes back to pending
// whole: its other stages, committed or still assigned, are pending again, unpaid and with no
// failure counted (they did nothing wrong; they are paid for the redo). A replica whose deadline
// passed (`expired`) also backs off: each of its stages' next deadline is twice as long (see
// PlaceStageUnits), so a replica slower than its nodes' estimates (cores shared with other
// nodes, slow links, a large start state to load) gets the time it needs on a later try instead
// of expiring for ever.
Status RerunPartialReplicas(LedgerState& s, const Hash256& task_id, RoundStateMachine& m,
                            std::span<const protocol::Assignment> expired,
                            std::map<PublicKey, uint64_t>& inflight) {
  const uint32_t stages = s.tasks.Find(task_id)->params.stages;
  std::set<uint32_t> replicas;
  for (const protocol::PendingUnit& u : m.PendingUnits()) replicas.insert(u.unit.shard / stages);
  std::vector<uint32_t> shards;
  for (const protocol::Assignment& a : m.OpenAssignments()) {
    if (replicas.count(a.unit.shard / stages) == 0) continue;
    shards.push_back(a.unit.shard);
    if (inflight[a.node] > 0) inflight[a.node]--;
  }
  for (const protocol::CommittedUnit& c : m.CommittedUnits()) {
    if (replicas.count(c.unit.shard / stages) != 0) shards.push_back(c.unit.shard);
  }
  if (!shards.empty()) {
    ML_RETURN_IF_ERROR(m.RerunUnits(shards, {}));
    const TaskRecord* t = s.tasks.Find(task_id);
    for (uint32_t shard : shards) {
      ResetWorkUnit(s.units.FindMutable({task_id, UnitIndex(*t, {task_id, m.round(), shard})}));
    }
  }
  std::set<uint32_t> late;
  for (const protocol::Assignment& a : expired) late.insert(a.unit.shard / stages);
  for (uint32_t r : late) {
    for (uint32_t stage = 0; stage < stages; ++stage) {
      ML_RETURN_IF_ERROR(m.BackOff({task_id, m.round(), r * stages + stage}));
    }
  }
  return Status::Ok();
}

// A pipeline stage held by a node that the chain itself shows gone -- it left (LeaveNode), or its
// last heartbeat is older than liveness_blocks -- cannot finish, and its replica's other stages
// cannot finish without it. Its unit expires now (OnUnitExpired: the node is charged the missed
// deadline, ApplyMissedDeadline, and barred from the unit) rather than at the replica's
// deadline, where every stage of the replica would be charged. RerunPartialReplicas then makes
// the replica pending whole, unpaid and uncharged, and `keep` gets each of its other stages'
// unit with its node where that node is not gone, so PlaceStageUnits keeps them there (with a
// fresh deadline, as any new assignment) and places only the gone stages on other nodes. A
// replica that misses its deadline while every node of it is live (one that withholds its stage
// while it heartbeats) is ruled as before: each of its stages is charged.
Status ExpireGoneStages(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& task_id,
                        RoundStateMachine& m, std::map<PublicKey, uint64_t>& inflight,
                        std::map<uint32_t, protocol::NodeId>* keep) {
  const uint32_t stages = s.tasks.Find(task_id)->params.stages;
  const protocol::SchedulerParams sp = SchedulerParamsOf(g);
  auto gone = [&](const PublicKey& id) {
    const NodeRecord* n = s.nodes.Find(id);
    return n == nullptr || n->status == NodeStatus::kUnbonding ||
           !protocol::HeartbeatLive(n->last_heartbeat_height, height, sp);
  };
  std::set<uint32_t> replicas;
  for (const protocol::Assignment& a : m.OpenAssignments()) {
    if (!gone(a.node)) continue;
    ML_RETURN_IF_ERROR(m.OnUnitExpired(a.unit).status());
    const uint32_t index = UnitIndex(*s.tasks.Find(task_id), a.unit);
    ML_RETURN_IF_ERROR(FailWorkUnit(s, task_id, index));
    ResetWorkUnit(s.units.FindMutable({task_id, index}));
    if (inflight[a.node] > 0) inflight[a.node]--;
    replicas.insert(a.unit.shard / stages);
  }
  for (const protocol::Assignment& a : m.OpenAssignments()) {
    if (replicas.count(a.unit.shard / stages) != 0) (*keep)[a.unit.shard] = a.node;
  }
  for (const protocol::CommittedUnit& c : m.CommittedUnits()) {
    if (replicas.count(c.unit.shard / stages) != 0 && !gone(c.node)) (*keep)[c.unit.shard] = c.node;
  }
  return Status::Ok();
}

// A pipeline task's pending stage units of the current round, placed on `nodes` (eligible
// solvers) with protocol::PlaceStages (docs/protocol.md, "Pipeline stage units"). A replica is
// placed whole (RerunPartialReplicas keeps every pending replica whole): a round whose every
// replica is pending (its start, a re-run) in one call, its R replicas x S stages, so the faster
// nodes take the heavier stages; otherwise each pending replica alone, in replica order, on
// nodes that hold no unit of the round. Nodes excluded from any unit of a replica take none of
// it, and a node holds at most one unit of a round. A node's deadline covers its queue as
// AssignUnits' does, for the whole unit's FLOPs; a replica's stages share the latest of their
// nodes' deadlines (a stage waits on its neighbours: a replica is as slow as its slowest stage),
// doubled per back-off of the replica (PendingUnit::backoffs). No placement: the units stay
// pending, and the next block tries again; when only the units' exclusions stand in the way
// (every node that could take them let one expire once), they are listed in `forgive`, to be
// open to those nodes again from the next block, as a unit every eligible solver excluded is (a
// cheater is jailed, so never eligible). A replica placed alone whose units `keep` names (the
// live stages of a replica that lost a node, ExpireGoneStages) keeps those stages on their nodes
// while the nodes are free, and only its other stages are placed (PlaceStages over those stages,
// with their boundaries' stage_boundary_bytes, and 0 between two that a kept stage separates);
// failing that, it is placed as any other. While some stage is kept, every pending replica is
// placed alone (a round of one replica too).
Result<std::vector<protocol::Assignment>> PlaceStageUnits(
    const TaskParams& p, const protocol::TaskSpecView& view,
    const std::vector<protocol::NodeView>& nodes, std::span<const protocol::PendingUnit> pending,
    const RoundStateMachine& m, uint64_t height, const protocol::SchedulerParams& sp,
    const std::map<PublicKey, uint64_t>& inflight, const std::map<uint32_t, protocol::NodeId>& keep,
    std::vector<protocol::UnitId>* forgive) {
  std::vector<protocol::StageNeed> needs(p.stages);
  for (uint32_t s = 0; s < p.stages; ++s) needs[s] = {p.stage_memory_bytes[s], p.stage_flops[s]};
  const std::span<const uint64_t> bytes = p.stage_boundary_bytes;
  std::map<PublicKey, const protocol::NodeView*> by_id;
  for (const protocol::NodeView& v : nodes) by_id[v.id] = &v;
  std::map<PublicKey, uint64_t> queued = inflight;
  std::vector<protocol::Assignment> out;
  // The pending replicas, each with its units (every stage, in stage order).
  std::map<uint32_t, std::vector<const protocol::PendingUnit*>> replicas;
  for (const protocol::PendingUnit& u : pending) replicas[u.unit.shard / p.stages].push_back(&u);
  for (const auto& [r, units] : replicas) {
    if (units.size() != p.stages) {
      return Internal("pipeline placement: replica " + std::to_string(r) + " of round " +
                      std::to_string(m.round()) + " has " + std::to_string(units.size()) + " of " +
                      std::to_string(p.stages) + " stages pending (a replica is placed whole)");
    }
  }
  auto excluded_from = [](const std::vector<const protocol::PendingUnit*>& units,
                          const PublicKey& node) {
    return std::ranges::any_of(units, [&](const protocol::PendingUnit* u) {
      return std::find(u->excluded.begin(), u->excluded.end(), node) != u->excluded.end();
    });
  };
  // Places replica `r` on `chain`: every stage gets the latest of the chain's nodes' deadlines
  // (each behind its queue), stretched 2^backoffs times.
  auto place = [&](uint32_t r, const std::vector<protocol::NodeId>& chain) {
    const std::vector<const protocol::PendingUnit*>& units = replicas.at(r);
    uint32_t backoffs = 0;
    for (const protocol::PendingUnit* u : units) backoffs = std::max(backoffs, u->backoffs);
    uint64_t deadline = 0;
    for (const protocol::NodeId& node : chain) {
      const uint64_t unit_ms = protocol::EstimatedUnitMs(*by_id.at(node), view, sp);
      deadline = std::max(deadline, protocol::DeadlineHeight(height, unit_ms, queued[node], sp));
    }
    const uint64_t blocks = deadline - height;
    deadline =
        blocks > (UINT64_MAX - height) >> backoffs ? UINT64_MAX : height + (blocks << backoffs);
    for (uint32_t s = 0; s < p.stages; ++s) {
      out.push_back({.unit = units[s]->unit,
                     .node = chain[s],
                     .assigned_height = height,
                     .deadline_height = deadline,
                     .price_per_gflop = by_id.at(chain[s])->price_per_gflop});
    }
    for (const protocol::NodeId& node : chain) queued[node]++;
  };
  auto forgive_replica = [&](const std::vector<const protocol::PendingUnit*>& units) {
    for (const protocol::PendingUnit* u : units) {
      if (!u->excluded.empty()) forgive->push_back(u->unit);
    }
  };
  // Kept stages (`keep`) are honoured replica by replica, below.
  if (replicas.size() == PipelineReplicas(p) && keep.empty()) {
    std::vector<protocol::NodeView> free;
    for (const protocol::NodeView& v : nodes) {
      const bool excluded = std::ranges::any_of(
          replicas, [&](const auto& rep) { return excluded_from(rep.second, v.id); });
      if (!excluded) free.push_back(v);
    }
    Result<std::vector<std::vector<protocol::NodeId>>> chains =
        protocol::PlaceStages(view, needs, bytes, PipelineReplicas(p), free, height, sp);
    if (!chains.ok()) {
      if (chains.status().code() != StatusCode::kFailedPrecondition) return chains.status();
      if (free.size() < nodes.size() &&
          protocol::PlaceStages(view, needs, bytes, PipelineReplicas(p), nodes, height, sp).ok()) {
        for (const auto& [r, units] : replicas) forgive_replica(units);
      }
      return out;  // not yet
    }
    for (uint32_t r = 0; r < chains->size(); ++r) place(r, (*chains)[r]);
    return out;
  }
  std::set<PublicKey> busy;
  for (const protocol::Assignment& a : m.OpenAssignments()) busy.insert(a.node);
  for (const protocol::CommittedUnit& c : m.CommittedUnits()) busy.insert(c.node);
  for (const auto& [r, units] : replicas) {
    std::vector<protocol::NodeView> idle, free;  // idle: no unit of the round; free: not excluded
    for (const protocol::NodeView& v : nodes) {
      if (busy.count(v.id) != 0) continue;
      idle.push_back(v);
      if (!excluded_from(units, v.id)) free.push_back(v);
    }
    // The stages `keep` names stay on their nodes (each must be free), the others go to the
    // free nodes left.
    std::vector<protocol::NodeId> chain(p.stages);
    std::vector<uint32_t> open;
    std::vector<protocol::StageNeed> open_needs;
    std::vector<uint64_t> open_bytes;  // between consecutive open stages
    bool kept = false;
    bool keepable = true;
    for (uint32_t st = 0; st < p.stages; ++st) {
      auto k = keep.find(units[st]->unit.shard);
      if (k == keep.end()) {
        // Open stages on either side of a kept one are no neighbours: nothing crosses between
        // them (0), so links do not pair them.
        if (!open.empty()) open_bytes.push_back(open.back() + 1 == st ? bytes[st - 1] : 0);
        open.push_back(st);
        open_needs.push_back(needs[st]);
        continue;
      }
      kept = true;
      keepable &=
          std::ranges::any_of(free, [&](const protocol::NodeView& v) { return v.id == k->second; });
      chain[st] = k->second;
    }
    if (kept && keepable) {
      std::vector<protocol::NodeView> others;
      for (const protocol::NodeView& v : free) {
        if (std::find(chain.begin(), chain.end(), v.id) == chain.end()) others.push_back(v);
      }
      Result<std::vector<std::vector<protocol::NodeId>>> rest =
          open.empty() ? Result<std::vector<std::vector<protocol::NodeId>>>(
                             std::vector<std::vector<protocol::NodeId>>{{}})
                       : protocol::PlaceStages(view, open_needs, open_bytes, 1, others, height, sp);
      if (!rest.ok() && rest.status().code() != StatusCode::kFailedPrecondition) {
        return rest.status();
      }
      if (rest.ok()) {
        for (size_t i = 0; i < open.size(); ++i) chain[open[i]] = (*rest)[0][i];
        place(r, chain);
        for (const protocol::NodeId& node : chain) busy.insert(node);
        continue;
      }
    }
    Result<std::vector<std::vector<protocol::NodeId>>> chains =
        protocol::PlaceStages(view, needs, bytes, 1, free, height, sp);
    if (!chains.ok()) {
      if (chains.status().code() != StatusCode::kFailedPrecondition) return chains.status();
      if (free.size() < idle.size() &&
          protocol::PlaceStages(view, needs, bytes, 1, idle, height, sp).ok()) {
        forgive_replica(units);
      }
      continue;  // not yet
    }
    place(r, (*chains)[0]);
    for (const protocol::NodeId& node : (*chains)[0]) busy.insert(node);
  }
  return out;
}

// One task's end-of-block step (docs/ledger.md, "Network training", steps 1-5).
Status AdvanceTask(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& seed,
                   const Hash256& task_id, RoundStateMachine& m,
                   std::map<PublicKey, uint64_t>& inflight, const AwaitingSecrets& awaiting) {
  const protocol::SchedulerParams sp = SchedulerParamsOf(g);
  // 0. Verification of the unfinal rounds' committed units (may rewind the task).
  if (g.params.verification) {
    ML_RETURN_IF_ERROR(DriveChecks(s, g, height, seed, task_id, m, awaiting));
  }
  // 1. Expiry: the unit is pending again (and never paid); the node's failure is counted. A
  // pipeline stage whose node is gone expires first (ExpireGoneStages), charged to that node alone.
  std::map<uint32_t, protocol::NodeId> keep;  // pipeline stages kept on their nodes
  if (IsPipelineTask(s.tasks.Find(task_id)->params)) {
    ML_RETURN_IF_ERROR(ExpireGoneStages(s, g, height, task_id, m, inflight, &keep));
  }
  ML_ASSIGN_OR_RETURN(protocol::RoundUpdate update, m.OnBlock(height));
  for (const protocol::Assignment& a : update.expired) {
    uint32_t index = UnitIndex(*s.tasks.Find(task_id), a.unit);
    ML_RETURN_IF_ERROR(FailWorkUnit(s, task_id, index));
    ResetWorkUnit(s.units.FindMutable({task_id, index}));
    if (inflight[a.node] > 0) inflight[a.node]--;
  }
  if (update.expired_aggregator) CountFailure(s, update.expired_aggregator->node);
  if (IsPipelineTask(s.tasks.Find(task_id)->params)) {
    ML_RETURN_IF_ERROR(RerunPartialReplicas(s, task_id, m, update.expired, inflight));
  }

  const TaskRecord* t = s.tasks.Find(task_id);
  const protocol::TaskSpecView view = TaskSpecViewOf(task_id, t->params, t->price_cap);
  // 2. Pending units -> solvers.
  std::vector<protocol::PendingUnit> pending = m.PendingUnits();
  if (!pending.empty()) {
    std::vector<protocol::NodeView> nodes = NodeViews(s, kRoleSolver, inflight);
    if (g.params.verification) {
      // A solver whose stake cannot cover the slash for cheating on a unit of this task would
      // risk less than it could gain (docs/verification.md, "Economics"): not eligible.
      std::erase_if(nodes, [&](const protocol::NodeView& v) {
        const NodeRecord* n = s.nodes.Find(v.id);
        return n == nullptr || n->stake < protocol::SlashAmount(UnitCost(*t, v.price_per_gflop),
                                                                g.params.slash_multiple);
      });
    }
    protocol::ScheduleResult r;
    if (IsPipelineTask(t->params)) {
      // A node's declared disk is offered net of its stage units' files (every task's).
      const std::map<PublicKey, uint64_t> held = StageDiskHeld(s, task_id, m.final_rounds());
      for (protocol::NodeView& v : nodes) {
        auto it = held.find(v.id);
        if (it != held.end()) v.disk_held_bytes = it->second;
      }
      std::vector<protocol::UnitId> forgive;
      ML_ASSIGN_OR_RETURN(r.assignments, PlaceStageUnits(t->params, view, nodes, pending, m, height,
                                                         sp, inflight, keep, &forgive));
      for (const protocol::UnitId& u : forgive) ML_RETURN_IF_ERROR(m.ForgiveExcluded(u));
    } else {
      ML_ASSIGN_OR_RETURN(r, protocol::AssignUnits(view, nodes, pending, seed, height, sp));
    }
    // A unit every eligible solver let expire once would wait forever: they may take it again
    // from the next block (a cheater is jailed, so never eligible).
    for (const protocol::PendingUnit& p : pending) {
      if (nodes.empty() || p.excluded.empty() ||
          std::find(r.unassigned.begin(), r.unassigned.end(), p.unit) == r.unassigned.end()) {
        continue;
      }
      const bool all_excluded = std::ranges::all_of(nodes, [&](const protocol::NodeView& v) {
        return std::find(p.excluded.begin(), p.excluded.end(), v.id) != p.excluded.end();
      });
      if (all_excluded) ML_RETURN_IF_ERROR(m.ForgiveExcluded(p.unit));
    }
    if (!r.assignments.empty()) {
      ML_RETURN_IF_ERROR(m.OnAssigned(r.assignments));
      for (const protocol::Assignment& a : r.assignments) {
        uint32_t index = UnitIndex(*s.tasks.Find(task_id), a.unit);
        ML_RETURN_IF_ERROR(AssignWorkUnit(s, task_id, index, a.node, a.deadline_height));
        WorkUnit* u = s.units.FindMutable({task_id, index});
        u->price = a.price_per_gflop;
        u->assignment_beacon = seed;  // the forced-error draw's beacon
        inflight[a.node]++;
      }
    }
  }
  // 3. Aggregator.
  if (m.NeedsAggregator()) {
    std::vector<protocol::NodeView> nodes = NodeViews(s, kRoleAggregator, inflight);
    Result<protocol::AggregatorAssignment> a = protocol::AssignAggregator(
        view, nodes, m.round(), m.AggregatorExcluded(), seed, height, sp);
    if (!a.ok() && a.status().code() == StatusCode::kUnavailable &&
        !m.AggregatorExcluded().empty()) {
      // Nobody but nodes that let this round's aggregation expire can take it (a pipeline task's
      // whole model often fits one node alone): they are forgiven, as a unit's solvers are above,
      // and the expiry stays on their record (CountFailure). Otherwise the round waits forever.
      Result<protocol::AggregatorAssignment> any =
          protocol::AssignAggregator(view, nodes, m.round(), {}, seed, height, sp);
      if (any.ok()) {
        ML_RETURN_IF_ERROR(m.ForgiveAggregatorExcluded());
        a = std::move(any);
      }
    }
    if (a.ok()) {
      ML_RETURN_IF_ERROR(m.OnAggregatorAssigned(*a));
      const NodeRecord* n = s.nodes.Find(a->node);
      Amount price = n ? n->price : 0;
      if (t->aggregator_price != price) s.tasks.FindMutable(task_id)->aggregator_price = price;
    } else if (a.status().code() != StatusCode::kUnavailable) {
      return a.status();
    }
  }
  SaveMachine(s, task_id, m);
  // 4. Pay every finalized round not yet paid.
  const uint32_t finalized = m.final_rounds();
  while (s.tasks.Find(task_id)->rounds_settled < finalized) {
    uint32_t round = s.tasks.Find(task_id)->rounds_settled;
    ML_RETURN_IF_ERROR(SettleRound(s, g.params, task_id, round));
    s.tasks.FindMutable(task_id)->rounds_settled = round + 1;
  }
  // 5. Done: record the final state and refund the rest.
  if (m.phase() == protocol::RoundPhase::kRoundPhaseFinal) {
    s.tasks.FindMutable(task_id)->final_state = m.round_weights();
    ML_RETURN_IF_ERROR(CloseTask(s, task_id, TaskStatus::kFinished, height));
  }
  return Status::Ok();
}

}  // namespace

Status ExecuteCommitUnit(ExecContext& ctx, const CommitUnitTx& tx) {
  constexpr std::string_view kWhat = "commit unit";
  ML_ASSIGN_OR_RETURN(const TaskRecord* t, OpenTaskFor(ctx.state, tx.task_id, kWhat));
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  if (tx.index >= t->unit_count) {
    return InvalidArgument("commit unit: index " + std::to_string(tx.index) + " is out of range; " +
                           "task " + tx.task_id.ShortHex() + " has " +
                           std::to_string(t->unit_count) + " units");
  }
  if (tx.result_hash.IsZero()) {
    return InvalidArgument("commit unit: result_hash is zero (store the delta blob first)");
  }
  if (IsPipelineTask(t->params)) {
    return InvalidArgument(
        "commit unit: task " + tx.task_id.ShortHex() +
        " is trained in pipeline stages (params.stages = " + std::to_string(t->params.stages) +
        "): commit each stage's result with CommitStage");
  }
  ML_ASSIGN_OR_RETURN(RoundStateMachine m, LoadMachine(*t));
  const uint32_t per_round = t->params.units_per_round;
  protocol::UnitId unit{tx.task_id, tx.index / per_round, tx.index % per_round};
  Status s = m.OnUnitCommitted(unit, tx.node_id, tx.result_hash, ctx.height);
  if (!s.ok()) return s.WithPrefix("commit unit");
  ML_RETURN_IF_ERROR(CommitWorkUnit(ctx.state, tx.task_id, tx.index, tx.result_hash));
  WorkUnit* u = ctx.state.units.FindMutable({tx.task_id, tx.index});
  u->commitment = tx.commitment;
  u->loss_micros = tx.loss_micros;
  if (ctx.params().verification) {
    const uint64_t leaves =
        protocol::SegmentCount(t->params.inner_steps, t->params.checkpoint_interval) + 1ull;
    if (tx.leaves.size() != leaves || MerkleRoot(tx.leaves) != tx.commitment) {
      return InvalidArgument("commit unit: leaves must be the " + std::to_string(leaves) +
                             " committed state hashes whose Merkle root is the commitment (got " +
                             std::to_string(tx.leaves.size()) + ")");
    }
    u->leaves = tx.leaves;
    ML_RETURN_IF_ERROR(OpenUnitCheck(ctx, tx.task_id, tx.index, tx.node_id, tx.secret_index, m));
  }
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

Status ExecuteCommitStage(ExecContext& ctx, const CommitStageTx& tx) {
  constexpr std::string_view kWhat = "commit stage";
  ML_ASSIGN_OR_RETURN(const TaskRecord* t, OpenTaskFor(ctx.state, tx.task_id, kWhat));
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  const TaskParams& p = t->params;
  const std::string task = "task " + tx.task_id.ShortHex();
  if (!IsPipelineTask(p)) {
    return InvalidArgument("commit stage: " + task +
                           " has no pipeline stages (params.stages = 1): commit its units with "
                           "CommitUnit");
  }
  if (tx.round >= p.rounds) {
    return InvalidArgument("commit stage: round " + std::to_string(tx.round) +
                           " is out of range; " + task + " has " + std::to_string(p.rounds) +
                           " rounds (0.." + std::to_string(p.rounds - 1) + ")");
  }
  const uint32_t replicas = PipelineReplicas(p);
  if (tx.replica >= replicas) {
    return InvalidArgument("commit stage: replica " + std::to_string(tx.replica) +
                           " is out of range; " + task + " has " + std::to_string(replicas) +
                           " replicas (0.." + std::to_string(replicas - 1) + ")");
  }
  if (tx.stage >= p.stages) {
    return InvalidArgument("commit stage: stage " + std::to_string(tx.stage) +
                           " is out of range; " + task + " has " + std::to_string(p.stages) +
                           " stages (0.." + std::to_string(p.stages - 1) + ")");
  }
  if (tx.result_hash.IsZero()) {
    return InvalidArgument(
        "commit stage: result_hash is zero (store the stage's delta blob first)");
  }
  if (tx.commitment.IsZero()) {
    return InvalidArgument(
        "commit stage: commitment is zero (the stage's StageCommitment over its steps' leaves)");
  }
  if (tx.loss_micros != 0 && tx.stage + 1 != p.stages) {
    return InvalidArgument("commit stage: loss_micros is " + std::to_string(tx.loss_micros) +
                           " from stage " + std::to_string(tx.stage) + "; only the last stage (" +
                           std::to_string(p.stages - 1) + ") computes the loss: send 0");
  }
  const uint32_t index = StageUnitIndex(p, {tx.round, tx.replica, tx.stage});
  const std::string slot = "stage " + std::to_string(tx.stage) + " of replica " +
                           std::to_string(tx.replica) + " in round " + std::to_string(tx.round) +
                           " of " + task;
  const WorkUnit* u = ctx.state.units.Find({tx.task_id, index});
  if (u == nullptr)
    return Internal("commit stage: " + slot + " has no unit " + std::to_string(index));
  if (u->status != WorkUnitStatus::kAssigned || u->assignee != tx.node_id) {
    return PermissionDenied(
        "commit stage: node " + tx.node_id.ShortHex() + " is not assigned " + slot + " (" +
        (u->status == WorkUnitStatus::kAssigned || u->status == WorkUnitStatus::kCommitted
             ? "its node is " + u->assignee.ShortHex() + ", unit " +
                   std::string(WorkUnitStatusName(u->status))
             : "the unit is " + std::string(WorkUnitStatusName(u->status))) +
        ")");
  }
  // The same node may hold the unit again after a re-placement (a kept stage of a replica that
  // lost a node, a round re-run): only the run of the current placement is its commit.
  if (tx.assignment_beacon != u->assignment_beacon) {
    return FailedPrecondition(
        "commit stage: assignment_beacon " + tx.assignment_beacon.ShortHex() +
        " is not the current placement of " + slot + ", placed with beacon " +
        u->assignment_beacon.ShortHex() +
        " (the unit was placed again since the run this commits, on another chain: that run is "
        "not committed; the new placement's run commits with node_work's assignment_beacon)");
  }
  ML_ASSIGN_OR_RETURN(RoundStateMachine m, LoadMachine(*t));
  protocol::UnitId unit{tx.task_id, tx.round, tx.replica * p.stages + tx.stage};
  Status s = m.OnUnitCommitted(unit, tx.node_id, tx.result_hash, ctx.height);
  if (!s.ok()) return s.WithPrefix("commit stage");
  ML_RETURN_IF_ERROR(CommitWorkUnit(ctx.state, tx.task_id, index, tx.result_hash));
  WorkUnit* mu = ctx.state.units.FindMutable({tx.task_id, index});
  mu->commitment = tx.commitment;
  mu->loss_micros = tx.loss_micros;
  mu->stage_commits = tx.commits;
  if (ctx.params().verification) {
    // One step leaf per inner step; the check runs over StageCheckLeaves (docs/verification.md,
    // "Pipeline stages").
    if (tx.leaves.size() != p.inner_steps ||
        protocol::StageCommitment(tx.leaves) != tx.commitment) {
      return InvalidArgument(
          "commit stage: leaves must be the stage's " + std::to_string(p.inner_steps) +
          " step leaves (StageStepLeaf of steps 0.." + std::to_string(p.inner_steps - 1) +
          ") whose StageCommitment is the commitment (got " + std::to_string(tx.leaves.size()) +
          ")");
    }
    mu->leaves = protocol::StageCheckLeaves(tx.leaves);
    ML_RETURN_IF_ERROR(
        OpenUnitCheck(ctx, tx.task_id, index, tx.node_id, tx.secret_index, m, kWhat));
  }
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

Status ExecuteCommitAggregate(ExecContext& ctx, const CommitAggregateTx& tx) {
  constexpr std::string_view kWhat = "commit aggregate";
  ML_ASSIGN_OR_RETURN(const TaskRecord* t, OpenTaskFor(ctx.state, tx.task_id, kWhat));
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  if (tx.state_hash.IsZero()) {
    return InvalidArgument("commit aggregate: state_hash is zero (store the state blob first)");
  }
  if (tx.test_accuracy_ppm > 1'000'000) {
    return InvalidArgument(
        "commit aggregate: test_accuracy_ppm must be <= 1000000 (parts per "
        "million: 1000000 is 100%), got " +
        std::to_string(tx.test_accuracy_ppm));
  }
  ML_ASSIGN_OR_RETURN(RoundStateMachine m, LoadMachine(*t));
  Result<protocol::RoundUpdate> update =
      m.OnAggregateCommitted(tx.round, tx.node_id, tx.state_hash, ctx.height);
  if (!update.ok()) return update.status().WithPrefix("commit aggregate");
  RoundResult rr;
  rr.state = tx.state_hash;
  rr.test_accuracy_ppm = tx.test_accuracy_ppm;
  rr.test_loss_micros = tx.test_loss_micros;
  rr.aggregator = tx.node_id;
  rr.committed_height = ctx.height;
  rr.aggregator_price = t->aggregator_price;
  TaskRecord* mt = ctx.state.tasks.FindMutable(tx.task_id);
  // One entry per round, in order (a re-run round replaces its entry).
  if (mt->round_results.size() > tx.round) mt->round_results.resize(tx.round);
  if (mt->round_results.size() != tx.round) {
    return Internal("commit aggregate: task " + tx.task_id.ShortHex() + " has " +
                    std::to_string(mt->round_results.size()) + " round results before round " +
                    std::to_string(tx.round));
  }
  mt->round_results.push_back(rr);
  // Finalized rounds (window 0: this one, at once) are paid by the block's end step.
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

Status ExecuteReportUnavailable(ExecContext& ctx, const ReportUnavailableTx& tx) {
  constexpr std::string_view kWhat = "report unavailable";
  ML_ASSIGN_OR_RETURN(const TaskRecord* t, OpenTaskFor(ctx.state, tx.task_id, kWhat));
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  ML_ASSIGN_OR_RETURN(RoundStateMachine m, LoadMachine(*t));
  if (!m.aggregator() || m.aggregator()->node != tx.node_id) {
    return PermissionDenied("report unavailable: node " + tx.node_id.ShortHex() +
                            " is not the assigned aggregator of task " + tx.task_id.ShortHex() +
                            " round " + std::to_string(m.round()));
  }
  const uint32_t per_round = t->params.units_per_round;
  if (tx.index >= t->unit_count || tx.index / per_round != m.round()) {
    return InvalidArgument("report unavailable: unit " + std::to_string(tx.index) +
                           " is not a unit of the round being aggregated (" +
                           std::to_string(m.round()) + ")");
  }
  const WorkUnit* u = ctx.state.units.Find({tx.task_id, tx.index});
  if (u == nullptr || u->status != WorkUnitStatus::kCommitted) {
    return FailedPrecondition("report unavailable: unit " + std::to_string(tx.index) +
                              " is not committed");
  }
  const PublicKey solver = u->assignee;
  std::vector<protocol::NodeId> exclude = {solver};
  ML_RETURN_IF_ERROR(m.RewindRound(exclude));
  ML_RETURN_IF_ERROR(FailWorkUnit(ctx.state, tx.task_id, tx.index));
  // Every unit of the round is pending again (they re-run from the same weights, with the same
  // results); none was paid yet (a round is paid when it is final).
  for (uint32_t shard = 0; shard < per_round; ++shard) {
    WorkUnit* w = ctx.state.units.FindMutable({tx.task_id, m.round() * per_round + shard});
    if (w != nullptr) ResetWorkUnit(w);
  }
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

void EndBlock(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& block_seed) {
  // Open network tasks in id order, with their machines; the nodes' in-flight units across all
  // of them (their queues lengthen new deadlines).
  std::vector<std::pair<Hash256, RoundStateMachine>> tasks;
  std::map<PublicKey, uint64_t> inflight;
  AwaitingSecrets awaiting;
  for (const auto& [id, t] : s.tasks.rows()) {
    if (t.status != TaskStatus::kOpen || t.runtime.empty()) continue;
    Result<RoundStateMachine> m = LoadMachine(t);
    if (!m.ok()) {
      ML_LOG_ERROR("ledger: end of block {}: {}", height, m.status().ToString());
      continue;
    }
    for (const protocol::Assignment& a : m->OpenAssignments()) inflight[a.node]++;
    if (g.params.verification) AddAwaitingSecrets(s, id, *m, awaiting);
    tasks.emplace_back(id, std::move(*m));
  }
  for (auto& [id, m] : tasks) {
    LedgerState::Mark mark = s.GetMark();
    Status st = AdvanceTask(s, g, height, block_seed, id, m, inflight, awaiting);
    if (!st.ok()) {
      // A bug, not an input: every replica fails the same way; leave the task as it was.
      s.RollbackTo(mark);
      ML_LOG_ERROR("ledger: end of block {}: task {}: {}", height, id.ShortHex(), st.ToString());
    }
  }
  // Late games (after the tasks' steps: a game ruled for its challenger may rewind a task, whose
  // machine the step above held), on open and finished tasks alike.
  std::vector<Hash256> late;
  for (const auto& [id, t] : s.tasks.rows()) {
    if (!t.verification.late_games.empty()) late.push_back(id);
  }
  for (const Hash256& id : late) {
    LedgerState::Mark mark = s.GetMark();
    Status st = DriveLateGames(s, g, height, id);
    if (!st.ok()) {
      s.RollbackTo(mark);
      ML_LOG_ERROR("ledger: end of block {}: task {}: late games: {}", height, id.ShortHex(),
                   st.ToString());
    }
  }
  ExpireProofCommits(s, height);
}

}  // namespace meshlearn::ledger
