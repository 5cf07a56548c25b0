#include "meshlearn/protocol/round_phase.h"

#include <algorithm>
#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"

namespace meshlearn::protocol {
namespace {

// 1: no rounds in flight; 2 adds rounds_in_flight and the settling rounds (1 still decodes); 3
// adds the current units' back-offs, and is written only when one is non-zero (a machine without
// any encodes as version 2, exactly as before back-offs existed).
constexpr uint8_t kRoundPhaseEncodingVersion = 2;
constexpr uint8_t kRoundPhaseBackoffVersion = 3;
// Bounds for decoding: more nodes than this excluded from one unit is not a state we produce.
constexpr uint32_t kMaxExcluded = 1u << 20;
constexpr uint32_t kMaxUnitsPerRound = 1u << 24;

void PutNodes(Encoder& e, const std::vector<NodeId>& nodes) {
  e.PutU32(static_cast<uint32_t>(nodes.size()));
  for (const NodeId& n : nodes) e.PutPublicKey(n);
}

Status GetNodes(Decoder& d, std::vector<NodeId>* nodes, std::string_view field) {
  uint32_t count = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&count, field, kMaxExcluded, PublicKey::kSize));
  nodes->resize(count);
  for (NodeId& n : *nodes) ML_RETURN_IF_ERROR(d.GetPublicKey(&n, field));
  return Status::Ok();
}

UnitId UnitOf(const TaskId& task, uint32_t round, size_t shard) {
  return UnitId{task, round, static_cast<uint32_t>(shard)};
}

}  // namespace

void RoundStateMachine::PutUnits(Encoder& e, const std::vector<Unit>& units) {
  e.PutU32(static_cast<uint32_t>(units.size()));
  for (const Unit& u : units) {
    e.PutU8(static_cast<uint8_t>(u.state));
    e.PutHash(u.assignment.unit.task).PutU32(u.assignment.unit.round);
    e.PutU32(u.assignment.unit.shard).PutPublicKey(u.assignment.node);
    e.PutU64(u.assignment.assigned_height).PutU64(u.assignment.deadline_height);
    e.PutU64(u.assignment.price_per_gflop);
    e.PutHash(u.result).PutU64(u.commit_height);
    PutNodes(e, u.excluded);
  }
}

Status RoundStateMachine::GetUnits(Decoder& d, uint32_t max, std::vector<Unit>* units) {
  uint32_t count = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&count, "units", max, 1));
  units->resize(count);
  for (Unit& u : *units) {
    uint8_t state = 0;
    ML_RETURN_IF_ERROR(d.GetU8(&state, "unit.state"));
    if (state > static_cast<uint8_t>(UnitState::kCommitted)) {
      return DataLoss("round state: invalid unit state " + std::to_string(state));
    }
    u.state = static_cast<UnitState>(state);
    ML_RETURN_IF_ERROR(d.GetHash(&u.assignment.unit.task, "unit.task"));
    ML_RETURN_IF_ERROR(d.GetU32(&u.assignment.unit.round, "unit.round"));
    ML_RETURN_IF_ERROR(d.GetU32(&u.assignment.unit.shard, "unit.shard"));
    ML_RETURN_IF_ERROR(d.GetPublicKey(&u.assignment.node, "unit.node"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.assignment.assigned_height, "unit.assigned_height"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.assignment.deadline_height, "unit.deadline_height"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.assignment.price_per_gflop, "unit.price_per_gflop"));
    ML_RETURN_IF_ERROR(d.GetHash(&u.result, "unit.result"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.commit_height, "unit.commit_height"));
    ML_RETURN_IF_ERROR(GetNodes(d, &u.excluded, "unit.excluded"));
  }
  return Status::Ok();
}

std::string_view RoundPhaseName(RoundPhase phase) {
  switch (phase) {
    case RoundPhase::kRoundPhaseAssigning:
      return "assigning";
    case RoundPhase::kRoundPhaseTraining:
      return "training";
    case RoundPhase::kRoundPhaseAggregating:
      return "aggregating";
    case RoundPhase::kRoundPhaseAwaitingVerificationWindow:
      return "awaiting_verification_window";
    case RoundPhase::kRoundPhaseFinal:
      return "final";
  }
  return "unknown";
}

Result<RoundStateMachine> RoundStateMachine::Create(const RoundMachineConfig& config) {
  if (config.rounds == 0) return InvalidArgument("task: rounds must be > 0, got 0");
  if (config.units_per_round == 0) {
    return InvalidArgument("task: units_per_round must be > 0, got 0");
  }
  return RoundStateMachine(config);
}

RoundStateMachine::RoundStateMachine(const RoundMachineConfig& config)
    : config_(config), height_(config.start_height) {
  weights_history_.push_back(config.initial_weights);
  StartRound();
}

void RoundStateMachine::StartRound() {
  units_.assign(config_.units_per_round, Unit{});
  window_end_ = 0;
  pending_weights_ = Hash256{};
  aggregator_.reset();
  aggregator_excluded_.clear();
  phase_ = RoundPhase::kRoundPhaseAssigning;
}

bool RoundStateMachine::NeedsAggregator() const {
  return phase_ == RoundPhase::kRoundPhaseAggregating && !aggregator_.has_value();
}

void RoundStateMachine::RecomputePhase() {
  if (phase_ == RoundPhase::kRoundPhaseAwaitingVerificationWindow ||
      phase_ == RoundPhase::kRoundPhaseFinal) {
    return;
  }
  bool any_pending = false, any_assigned = false;
  for (const Unit& u : units_) {
    any_pending |= u.state == UnitState::kPending;
    any_assigned |= u.state == UnitState::kAssigned;
  }
  phase_ = any_pending    ? RoundPhase::kRoundPhaseAssigning
           : any_assigned ? RoundPhase::kRoundPhaseTraining
                          : RoundPhase::kRoundPhaseAggregating;
}

std::vector<PendingUnit> RoundStateMachine::PendingUnits() const {
  std::vector<PendingUnit> out;
  if (phase_ == RoundPhase::kRoundPhaseFinal) return out;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (units_[i].state == UnitState::kPending) {
      out.push_back({UnitOf(config_.task, round_, i), units_[i].excluded, units_[i].backoffs});
    }
  }
  return out;
}

std::vector<Assignment> RoundStateMachine::OpenAssignments() const {
  std::vector<Assignment> out;
  for (const Unit& u : units_) {
    if (u.state == UnitState::kAssigned) out.push_back(u.assignment);
  }
  return out;
}

const Assignment* RoundStateMachine::AssignmentOf(uint32_t round, uint32_t shard) const {
  if (!Unfinal(round)) return nullptr;
  const std::vector<Unit>* units = &units_;
  if (round < round_) {
    const auto it = std::find_if(settling_.begin(), settling_.end(),
                                 [&](const Settling& s) { return s.round == round; });
    if (it == settling_.end()) return nullptr;
    units = &it->units;
  }
  if (shard >= units->size() || (*units)[shard].state == UnitState::kPending) return nullptr;
  return &(*units)[shard].assignment;
}

NodeId RoundStateMachine::LastExcluded(uint32_t shard) const {
  if (shard >= units_.size() || units_[shard].excluded.empty()) return NodeId{};
  return units_[shard].excluded.back();
}

std::vector<CommittedUnit> RoundStateMachine::CommittedUnits() const {
  std::vector<CommittedUnit> out;
  for (const Unit& u : units_) {
    if (u.state == UnitState::kCommitted) {
      out.push_back({u.assignment.unit, u.assignment.node, u.result, u.commit_height});
    }
  }
  return out;
}

Result<RoundStateMachine::Unit*> RoundStateMachine::FindUnit(const UnitId& unit) {
  if (phase_ == RoundPhase::kRoundPhaseFinal) {
    return FailedPrecondition("task " + config_.task.ShortHex() + " is final; unit " +
                              unit.ToString() + " is not open");
  }
  if (unit.task != config_.task || unit.round != round_ || unit.shard >= units_.size()) {
    return FailedPrecondition("unit " + unit.ToString() + " is not a unit of the current round " +
                              std::to_string(round_) + " of task " + config_.task.ShortHex());
  }
  return &units_[unit.shard];
}

Status RoundStateMachine::ForgiveExcluded(const UnitId& unit) {
  ML_ASSIGN_OR_RETURN(Unit * u, FindUnit(unit));
  if (u->state != UnitState::kPending) {
    return FailedPrecondition("unit " + unit.ToString() + " is not pending");
  }
  u->excluded.clear();
  return Status::Ok();
}

Status RoundStateMachine::ForgiveAggregatorExcluded() {
  if (!NeedsAggregator()) {
    return FailedPrecondition("task " + config_.task.ShortHex() + " round " +
                              std::to_string(round_) + " needs no aggregator");
  }
  aggregator_excluded_.clear();
  return Status::Ok();
}

Status RoundStateMachine::BackOff(const UnitId& unit) {
  ML_ASSIGN_OR_RETURN(Unit * u, FindUnit(unit));
  if (u->state != UnitState::kPending) {
    return FailedPrecondition("unit " + unit.ToString() + " is not pending");
  }
  u->backoffs = std::min(u->backoffs + 1, kMaxBackoffs);
  return Status::Ok();
}

Assignment RoundStateMachine::Expire(Unit& u) {
  CHECK(u.state == UnitState::kAssigned);
  Assignment a = u.assignment;
  u.state = UnitState::kPending;
  if (std::find(u.excluded.begin(), u.excluded.end(), a.node) == u.excluded.end()) {
    u.excluded.push_back(a.node);
  }
  u.assignment = Assignment{};
  return a;
}

uint32_t RoundStateMachine::final_rounds() const {
  if (phase_ == RoundPhase::kRoundPhaseFinal) return config_.rounds;
  return round_ - static_cast<uint32_t>(settling_.size());
}

// The current round is aggregated, is not the last, and fewer than rounds_in_flight rounds are
// settling: it may settle behind the next round.
bool RoundStateMachine::MayStartNextRound() const {
  return phase_ == RoundPhase::kRoundPhaseAwaitingVerificationWindow &&
         round_ + 1 < config_.rounds && settling_.size() < config_.rounds_in_flight;
}

// Rounds become final in order: the oldest settling round first, then the current one (only
// when nothing settles before it). An aggregated current round moves to the settling rounds
// when rounds_in_flight allows, and the next round starts from its aggregate.
void RoundStateMachine::MaybeFinalize(RoundUpdate& update) {
  for (;;) {
    if (!settling_.empty()) {
      const Settling& oldest = settling_.front();
      if (oldest.holds == 0 && height_ >= oldest.window_end) {
        update.finalized_rounds.push_back(oldest.round);
        settling_.erase(settling_.begin());
        continue;
      }
    } else if (phase_ == RoundPhase::kRoundPhaseAwaitingVerificationWindow && holds_ == 0 &&
               height_ >= window_end_) {
      update.finalized_rounds.push_back(round_);
      weights_history_.push_back(pending_weights_);
      ++round_;
      if (round_ == config_.rounds) {
        units_.clear();
        aggregator_.reset();
        aggregator_excluded_.clear();
        pending_weights_ = Hash256{};
        phase_ = RoundPhase::kRoundPhaseFinal;
        return;
      }
      StartRound();
      continue;
    }
    if (MayStartNextRound()) {
      settling_.push_back(
          {.round = round_, .window_end = window_end_, .holds = holds_, .units = units_});
      weights_history_.push_back(pending_weights_);
      ++round_;
      holds_ = 0;
      StartRound();
      continue;
    }
    return;
  }
}

Result<RoundUpdate> RoundStateMachine::OnBlock(uint64_t height) {
  if (height < height_) {
    return InvalidArgument("round machine: block height went back from " + std::to_string(height_) +
                           " to " + std::to_string(height));
  }
  height_ = height;
  RoundUpdate update;
  if (phase_ == RoundPhase::kRoundPhaseTraining || phase_ == RoundPhase::kRoundPhaseAssigning) {
    for (Unit& u : units_) {
      if (u.state == UnitState::kAssigned && u.assignment.deadline_height < height) {
        update.expired.push_back(Expire(u));
      }
    }
    RecomputePhase();
  }
  if (phase_ == RoundPhase::kRoundPhaseAggregating && aggregator_ &&
      aggregator_->deadline_height < height) {
    update.expired_aggregator = aggregator_;
    aggregator_excluded_.push_back(aggregator_->node);
    aggregator_.reset();
  }
  MaybeFinalize(update);
  return update;
}

Status RoundStateMachine::OnAggregatorAssigned(const AggregatorAssignment& aggregator) {
  if (!NeedsAggregator() || aggregator.task != config_.task || aggregator.round != round_) {
    return FailedPrecondition(
        "aggregator for round " + std::to_string(aggregator.round) + " not expected: task " +
        config_.task.ShortHex() + " is in round " + std::to_string(round_) + ", phase " +
        std::string(RoundPhaseName(phase_)) + (aggregator_ ? ", aggregator already assigned" : ""));
  }
  if (std::find(aggregator_excluded_.begin(), aggregator_excluded_.end(), aggregator.node) !=
      aggregator_excluded_.end()) {
    return FailedPrecondition("node " + aggregator.node.ShortHex() +
                              " let this round's aggregation expire and may not take it again");
  }
  if (aggregator.deadline_height < height_) {
    return InvalidArgument("aggregator deadline " + std::to_string(aggregator.deadline_height) +
                           " is before the current height " + std::to_string(height_));
  }
  aggregator_ = aggregator;
  return Status::Ok();
}

Status RoundStateMachine::OnAssigned(std::span<const Assignment> assignments) {
  // Validate everything first so that a bad batch changes nothing.
  std::vector<uint32_t> seen;
  for (const Assignment& a : assignments) {
    ML_ASSIGN_OR_RETURN(Unit * u, FindUnit(a.unit));
    if (u->state != UnitState::kPending) {
      return FailedPrecondition("unit " + a.unit.ToString() + " is not pending");
    }
    if (std::find(seen.begin(), seen.end(), a.unit.shard) != seen.end()) {
      return InvalidArgument("unit " + a.unit.ToString() + " assigned twice in one batch");
    }
    seen.push_back(a.unit.shard);
    if (std::find(u->excluded.begin(), u->excluded.end(), a.node) != u->excluded.end()) {
      return FailedPrecondition("node " + a.node.ShortHex() + " let unit " + a.unit.ToString() +
                                " expire before and may not take it again");
    }
    if (a.deadline_height < height_) {
      return InvalidArgument("assignment of unit " + a.unit.ToString() + " has deadline " +
                             std::to_string(a.deadline_height) + " before the current height " +
                             std::to_string(height_));
    }
  }
  for (const Assignment& a : assignments) {
    Unit& u = units_[a.unit.shard];
    u.state = UnitState::kAssigned;
    u.assignment = a;
  }
  RecomputePhase();
  return Status::Ok();
}

Status RoundStateMachine::OnUnitCommitted(const UnitId& unit, const NodeId& node,
                                          const Hash256& result, uint64_t height) {
  ML_ASSIGN_OR_RETURN(Unit * u, FindUnit(unit));
  if (u->state != UnitState::kAssigned || u->assignment.node != node) {
    return FailedPrecondition("unit " + unit.ToString() + " is not assigned to node " +
                              node.ShortHex() + " (expired, reassigned or already committed)");
  }
  if (height > u->assignment.deadline_height) {
    return FailedPrecondition("commit of unit " + unit.ToString() + " at height " +
                              std::to_string(height) + " is after its deadline " +
                              std::to_string(u->assignment.deadline_height));
  }
  u->state = UnitState::kCommitted;
  u->result = result;
  u->commit_height = height;
  RecomputePhase();
  return Status::Ok();
}

Result<RoundUpdate> RoundStateMachine::OnUnitExpired(const UnitId& unit) {
  ML_ASSIGN_OR_RETURN(Unit * u, FindUnit(unit));
  if (u->state != UnitState::kAssigned) {
    return FailedPrecondition("unit " + unit.ToString() + " is not assigned, cannot expire");
  }
  RoundUpdate update;
  update.expired.push_back(Expire(*u));
  RecomputePhase();
  return update;
}

Result<RoundUpdate> RoundStateMachine::OnAggregateCommitted(uint32_t round,
                                                            const NodeId& aggregator,
                                                            const Hash256& new_weights,
                                                            uint64_t height) {
  if (phase_ != RoundPhase::kRoundPhaseAggregating || round != round_) {
    return FailedPrecondition("aggregate for round " + std::to_string(round) + " of task " +
                              config_.task.ShortHex() + " not expected: the task is in round " +
                              std::to_string(round_) + ", phase " +
                              std::string(RoundPhaseName(phase_)));
  }
  if (!aggregator_ || aggregator_->node != aggregator) {
    return FailedPrecondition("node " + aggregator.ShortHex() + " is not the aggregator of round " +
                              std::to_string(round_) + " of task " + config_.task.ShortHex());
  }
  if (height > aggregator_->deadline_height) {
    return FailedPrecondition("aggregate of round " + std::to_string(round_) + " at height " +
                              std::to_string(height) + " is after its deadline " +
                              std::to_string(aggregator_->deadline_height));
  }
  if (height < height_) {
    return InvalidArgument("aggregate commit height " + std::to_string(height) +
                           " is before the current height " + std::to_string(height_));
  }
  height_ = height;
  pending_weights_ = new_weights;
  window_end_ = height + config_.verification_window_blocks;
  phase_ = RoundPhase::kRoundPhaseAwaitingVerificationWindow;
  RoundUpdate update;
  MaybeFinalize(update);
  return update;
}

Result<RoundUpdate> RoundStateMachine::ReleaseFinality() {
  if (holds_ == 0) return FailedPrecondition("round machine: ReleaseFinality without a hold");
  return SetHolds(round_, holds_ - 1);
}

Result<uint32_t> RoundStateMachine::HoldsOf(uint32_t round) const {
  if (!Unfinal(round)) {
    return FailedPrecondition("round " + std::to_string(round) + " of task " +
                              config_.task.ShortHex() + " is not open (final rounds " +
                              std::to_string(final_rounds()) + ", current " +
                              std::to_string(round_) + ")");
  }
  if (round == round_) return holds_;
  return settling_[round - final_rounds()].holds;
}

Result<RoundUpdate> RoundStateMachine::SetHolds(uint32_t round, uint32_t holds) {
  ML_ASSIGN_OR_RETURN(uint32_t before, HoldsOf(round));
  const bool current = round == round_;
  uint32_t& h = current ? holds_ : settling_[round - final_rounds()].holds;
  uint64_t& window_end = current ? window_end_ : settling_[round - final_rounds()].window_end;
  h = holds;
  // The last hold of an aggregated round (its last check settled): the window runs again from
  // here, so whistleblowers always get verification_window_blocks to challenge what settled.
  const bool aggregated = !current || phase_ == RoundPhase::kRoundPhaseAwaitingVerificationWindow;
  if (before > 0 && holds == 0 && aggregated) {
    window_end = std::max(window_end, height_ + config_.verification_window_blocks);
  }
  RoundUpdate update;
  MaybeFinalize(update);
  return update;
}

Bytes RoundStateMachine::Encode() const {
  Encoder e;
  const bool backoffs =
      std::any_of(units_.begin(), units_.end(), [](const Unit& u) { return u.backoffs != 0; });
  e.PutU8(backoffs ? kRoundPhaseBackoffVersion : kRoundPhaseEncodingVersion);
  e.PutHash(config_.task).PutU32(config_.rounds).PutU32(config_.units_per_round);
  e.PutU64(config_.verification_window_blocks).PutHash(config_.initial_weights);
  e.PutU64(config_.start_height);
  e.PutU8(static_cast<uint8_t>(phase_)).PutU32(round_).PutU64(height_).PutU64(window_end_);
  e.PutU32(holds_).PutHash(pending_weights_);
  e.PutBool(aggregator_.has_value());
  if (aggregator_) {
    e.PutHash(aggregator_->task).PutU32(aggregator_->round).PutPublicKey(aggregator_->node);
    e.PutU64(aggregator_->assigned_height).PutU64(aggregator_->deadline_height);
  }
  PutNodes(e, aggregator_excluded_);
  e.PutU32(static_cast<uint32_t>(weights_history_.size()));
  for (const Hash256& h : weights_history_) e.PutHash(h);
  PutUnits(e, units_);
  e.PutU32(config_.rounds_in_flight);
  e.PutU32(static_cast<uint32_t>(settling_.size()));
  for (const Settling& r : settling_) {
    e.PutU32(r.round).PutU64(r.window_end).PutU32(r.holds);
    PutUnits(e, r.units);
  }
  if (backoffs) {
    for (const Unit& u : units_) e.PutU32(u.backoffs);
  }
  return e.Take();
}

Result<RoundStateMachine> RoundStateMachine::Decode(ByteSpan bytes) {
  Decoder d(bytes, "round state");
  uint8_t version = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "version"));
  if (version != 1 && version != kRoundPhaseEncodingVersion &&
      version != kRoundPhaseBackoffVersion) {
    return DataLoss("round state: unknown encoding version " + std::to_string(version));
  }
  RoundMachineConfig c;
  ML_RETURN_IF_ERROR(d.GetHash(&c.task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.rounds, "rounds"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.units_per_round, "units_per_round"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.verification_window_blocks, "verification_window_blocks"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.initial_weights, "initial_weights"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.start_height, "start_height"));
  if (c.units_per_round > kMaxUnitsPerRound) {
    return DataLoss("round state: units_per_round " + std::to_string(c.units_per_round) +
                    " is out of range");
  }
  ML_ASSIGN_OR_RETURN(RoundStateMachine m, Create(c));

  uint8_t phase = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&phase, "phase"));
  if (phase > static_cast<uint8_t>(RoundPhase::kRoundPhaseFinal)) {
    return DataLoss("round state: invalid phase " + std::to_string(phase));
  }
  m.phase_ = static_cast<RoundPhase>(phase);
  ML_RETURN_IF_ERROR(d.GetU32(&m.round_, "round"));
  ML_RETURN_IF_ERROR(d.GetU64(&m.height_, "height"));
  ML_RETURN_IF_ERROR(d.GetU64(&m.window_end_, "window_end"));
  ML_RETURN_IF_ERROR(d.GetU32(&m.holds_, "holds"));
  ML_RETURN_IF_ERROR(d.GetHash(&m.pending_weights_, "pending_weights"));
  bool has_aggregator = false;
  ML_RETURN_IF_ERROR(d.GetBool(&has_aggregator, "has_aggregator"));
  if (has_aggregator) {
    AggregatorAssignment a;
    ML_RETURN_IF_ERROR(d.GetHash(&a.task, "aggregator.task"));
    ML_RETURN_IF_ERROR(d.GetU32(&a.round, "aggregator.round"));
    ML_RETURN_IF_ERROR(d.GetPublicKey(&a.node, "aggregator.node"));
    ML_RETURN_IF_ERROR(d.GetU64(&a.assigned_height, "aggregator.assigned_height"));
    ML_RETURN_IF_ERROR(d.GetU64(&a.deadline_height, "aggregator.deadline_height"));
    m.aggregator_ = a;
  }
  ML_RETURN_IF_ERROR(GetNodes(d, &m.aggregator_excluded_, "aggregator_excluded"));
  uint32_t history = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&history, "weights_history", c.rounds + 1, Hash256::kSize));
  m.weights_history_.resize(history);
  for (Hash256& h : m.weights_history_) ML_RETURN_IF_ERROR(d.GetHash(&h, "weights_history"));
  ML_RETURN_IF_ERROR(GetUnits(d, c.units_per_round, &m.units_));
  if (version >= 2) {
    ML_RETURN_IF_ERROR(d.GetU32(&m.config_.rounds_in_flight, "rounds_in_flight"));
    uint32_t settling = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&settling, "settling", m.config_.rounds_in_flight, 16));
    m.settling_.resize(settling);
    for (Settling& r : m.settling_) {
      ML_RETURN_IF_ERROR(d.GetU32(&r.round, "settling.round"));
      ML_RETURN_IF_ERROR(d.GetU64(&r.window_end, "settling.window_end"));
      ML_RETURN_IF_ERROR(d.GetU32(&r.holds, "settling.holds"));
      ML_RETURN_IF_ERROR(GetUnits(d, c.units_per_round, &r.units));
    }
  }
  if (version == kRoundPhaseBackoffVersion) {
    bool any = false;
    for (Unit& u : m.units_) {
      ML_RETURN_IF_ERROR(d.GetU32(&u.backoffs, "unit.backoffs"));
      if (u.backoffs > kMaxBackoffs) {
        return DataLoss("round state: unit back-offs " + std::to_string(u.backoffs) +
                        " above the most, " + std::to_string(kMaxBackoffs));
      }
      any |= u.backoffs != 0;
    }
    if (!any) {
      return DataLoss(
          "round state: version 3 without a back-off (not canonical: that is version 2)");
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());

  // Only states the events can produce.
  const bool final = m.phase_ == RoundPhase::kRoundPhaseFinal;
  for (size_t i = 0; i < m.settling_.size(); ++i) {
    const Settling& r = m.settling_[i];
    if (final || r.round + (m.settling_.size() - i) != m.round_) {
      return DataLoss(
          "round state: settling rounds must be the ones just before the current "
          "round " +
          std::to_string(m.round_));
    }
    if (r.units.size() != c.units_per_round) {
      return DataLoss("round state: settling round " + std::to_string(r.round) + " has " +
                      std::to_string(r.units.size()) + " units");
    }
    for (size_t shard = 0; shard < r.units.size(); ++shard) {
      if (r.units[shard].state != UnitState::kCommitted ||
          r.units[shard].assignment.unit != UnitOf(c.task, r.round, shard)) {
        return DataLoss("round state: settling round " + std::to_string(r.round) + " unit " +
                        std::to_string(shard) + " is not its committed unit");
      }
    }
  }
  if (final != (m.round_ == c.rounds) || m.round_ > c.rounds ||
      m.weights_history_.size() != size_t{m.round_} + 1 ||
      m.units_.size() != (final ? 0 : c.units_per_round)) {
    return DataLoss("round state: round " + std::to_string(m.round_) + ", phase " +
                    std::string(RoundPhaseName(m.phase_)) + " and " +
                    std::to_string(m.units_.size()) + " units are inconsistent");
  }
  for (size_t i = 0; i < m.units_.size(); ++i) {
    const Unit& u = m.units_[i];
    if (u.state != UnitState::kPending && u.assignment.unit != UnitOf(c.task, m.round_, i)) {
      return DataLoss("round state: unit " + std::to_string(i) + " holds an assignment of " +
                      u.assignment.unit.ToString());
    }
  }
  if (m.aggregator_ && (m.aggregator_->task != c.task || m.aggregator_->round != m.round_)) {
    return DataLoss("round state: the aggregator is for another round");
  }
  if (m.phase_ == RoundPhase::kRoundPhaseAwaitingVerificationWindow) {
    for (const Unit& u : m.units_) {
      if (u.state != UnitState::kCommitted) {
        return DataLoss("round state: awaiting the verification window with uncommitted units");
      }
    }
  }
  if (m.aggregator_ && m.phase_ != RoundPhase::kRoundPhaseAggregating &&
      m.phase_ != RoundPhase::kRoundPhaseAwaitingVerificationWindow) {
    return DataLoss("round state: an aggregator is assigned in phase " +
                    std::string(RoundPhaseName(m.phase_)));
  }
  const RoundPhase stored = m.phase_;
  m.RecomputePhase();
  if (m.phase_ != stored) {
    return DataLoss("round state: phase " + std::string(RoundPhaseName(stored)) +
                    " does not match the units' states");
  }
  return m;
}

Status RoundStateMachine::RewindRound(std::span<const NodeId> exclude) {
  if (phase_ == RoundPhase::kRoundPhaseFinal) {
    return FailedPrecondition("task " + config_.task.ShortHex() + " is final; nothing to rewind");
  }
  for (Unit& u : units_) {
    u.state = UnitState::kPending;
    u.assignment = Assignment{};
    u.result = Hash256{};
    u.commit_height = 0;
    for (const NodeId& n : exclude) {
      if (std::find(u.excluded.begin(), u.excluded.end(), n) == u.excluded.end()) {
        u.excluded.push_back(n);
      }
    }
  }
  for (const NodeId& n : exclude) {
    if (std::find(aggregator_excluded_.begin(), aggregator_excluded_.end(), n) ==
        aggregator_excluded_.end()) {
      aggregator_excluded_.push_back(n);
    }
  }
  window_end_ = 0;
  pending_weights_ = Hash256{};
  aggregator_.reset();
  phase_ = RoundPhase::kRoundPhaseAssigning;
  return Status::Ok();
}

Status RoundStateMachine::RewindTo(uint32_t round, std::span<const NodeId> exclude) {
  // A final task has no current round (round_ == rounds): any of its rounds may be rewound.
  const bool final = phase_ == RoundPhase::kRoundPhaseFinal;
  if (round > round_ || (final && round >= config_.rounds)) {
    return InvalidArgument("rewind: round " + std::to_string(round) + " of task " +
                           config_.task.ShortHex() + " is after the " +
                           (final ? "last round " + std::to_string(config_.rounds - 1)
                                  : "current round " + std::to_string(round_)));
  }
  if (round < round_) {
    round_ = round;
    weights_history_.resize(round + 1);
    std::erase_if(settling_, [&](const Settling& r) { return r.round >= round; });
    holds_ = 0;
    StartRound();
  }
  return RewindRound(exclude);
}

Status RoundStateMachine::RerunUnitsOf(uint32_t round, std::span<const uint32_t> shards,
                                       std::span<const NodeId> exclude) {
  if (round == round_) return RerunUnits(shards, exclude);
  if (!Unfinal(round)) {
    return FailedPrecondition("re-run: round " + std::to_string(round) + " of task " +
                              config_.task.ShortHex() + " is not open (final rounds " +
                              std::to_string(final_rounds()) + ", current " +
                              std::to_string(round_) + ")");
  }
  for (uint32_t shard : shards) {
    if (shard >= config_.units_per_round) {
      return InvalidArgument("re-run: shard " + std::to_string(shard) + " of task " +
                             config_.task.ShortHex() + " is out of range (" +
                             std::to_string(config_.units_per_round) + " units per round)");
    }
  }
  // Back to the settling round, with its units as they were committed.
  auto at = std::find_if(settling_.begin(), settling_.end(),
                         [&](const Settling& r) { return r.round == round; });
  Settling back = std::move(*at);
  settling_.erase(at, settling_.end());
  round_ = round;
  weights_history_.resize(round + 1);
  StartRound();
  units_ = std::move(back.units);
  holds_ = back.holds;
  return RerunUnits(shards, exclude);
}

Status RoundStateMachine::RerunUnits(std::span<const uint32_t> shards,
                                     std::span<const NodeId> exclude) {
  if (phase_ == RoundPhase::kRoundPhaseFinal) {
    return FailedPrecondition("task " + config_.task.ShortHex() + " is final; nothing to re-run");
  }
  for (uint32_t shard : shards) {
    if (shard >= units_.size()) {
      return InvalidArgument("re-run: shard " + std::to_string(shard) + " of task " +
                             config_.task.ShortHex() + " is out of range (" +
                             std::to_string(units_.size()) + " units per round)");
    }
  }
  for (uint32_t shard : shards) {
    Unit& u = units_[shard];
    u.state = UnitState::kPending;
    u.assignment = Assignment{};
    u.result = Hash256{};
    u.commit_height = 0;
    for (const NodeId& n : exclude) {
      if (std::find(u.excluded.begin(), u.excluded.end(), n) == u.excluded.end()) {
        u.excluded.push_back(n);
      }
    }
  }
  window_end_ = 0;
  pending_weights_ = Hash256{};
  aggregator_.reset();
  phase_ = RoundPhase::kRoundPhaseAssigning;
  return Status::Ok();
}

}  // namespace meshlearn::protocol
