// Tasks and work units: escrow in, payments out, refunds. network.cc adds the
// transactions that schedule, commit and verify work units on top of the primitives here.
#include <algorithm>

#include "execute.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::ledger {

namespace {

Result<TaskRecord*> OpenTask(LedgerState& s, const Hash256& task_id, std::string_view what) {
  const TaskRecord* t = s.tasks.Find(task_id);
  if (t == nullptr) return NotFound(std::string(what) + ": task " + task_id.ToHex() + " not found");
  if (t->status != TaskStatus::kOpen) {
    return FailedPrecondition(std::string(what) + ": task " + task_id.ShortHex() + " is " +
                              std::string(TaskStatusName(t->status)));
  }
  return s.tasks.FindMutable(task_id);
}

Result<WorkUnit*> Unit(LedgerState& s, const Hash256& task_id, uint32_t index,
                       std::string_view what) {
  WorkUnit* u = s.units.FindMutable({task_id, index});
  if (u == nullptr) {
    return NotFound(std::string(what) + ": work unit " + std::to_string(index) + " of task " +
                    task_id.ShortHex() + " not found");
  }
  return u;
}

}  // namespace

Status PayFromEscrow(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                     const PublicKey& to, Amount amount) {
  ML_ASSIGN_OR_RETURN(TaskRecord * t, OpenTask(s, task_id, "pay from escrow"));
  ML_RETURN_IF_ERROR(CheckedSub(t->escrow, amount, &t->escrow, "escrow of task " + task_id.ShortHex()));
  ML_RETURN_IF_ERROR(CheckedAdd(t->spent, amount, &t->spent, "task spent"));
  Amount cut = BasisPoints(amount, p.treasury_cut_bps);
  ML_RETURN_IF_ERROR(CheckedAdd(t->treasury_cut, cut, &t->treasury_cut, "task treasury cut"));
  ML_RETURN_IF_ERROR(CreditTreasury(s, cut));
  return Credit(s, to, amount - cut);
}

Status CloseTask(LedgerState& s, const Hash256& task_id, TaskStatus final_status, uint64_t height) {
  ML_ASSIGN_OR_RETURN(TaskRecord * t, OpenTask(s, task_id, "close task"));
  Amount refund = t->escrow;
  t->escrow = 0;
  t->closed_height = height;
  ML_RETURN_IF_ERROR(CheckedAdd(t->refunded, refund, &t->refunded, "task refunded"));
  t->status = final_status;
  PublicKey submitter = t->submitter;
  // Units not yet settled will never be paid now, and the claims on them will not be answered.
  for (uint32_t i = 0; i < t->unit_count; ++i) {
    ML_RETURN_IF_ERROR(RefundServeBonds(s, task_id, i));
    const WorkUnit* u = s.units.Find({task_id, i});
    if (u == nullptr || u->status == WorkUnitStatus::kVerified ||
        u->status == WorkUnitStatus::kFailed || u->status == WorkUnitStatus::kCancelled) {
      continue;
    }
    s.units.FindMutable({task_id, i})->status = WorkUnitStatus::kCancelled;
  }
  return Credit(s, submitter, refund);
}

Status AddWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t* index) {
  ML_ASSIGN_OR_RETURN(TaskRecord * t, OpenTask(s, task_id, "add work unit"));
  if (t->unit_count == UINT32_MAX) return ResourceExhausted("add work unit: too many units");
  WorkUnit u;
  u.task_id = task_id;
  u.index = t->unit_count++;
  s.units.Put({task_id, u.index}, u);
  if (index) *index = u.index;
  return Status::Ok();
}

Status AssignWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index,
                      const PublicKey& node_id, uint64_t deadline_height) {
  const NodeRecord* n = s.nodes.Find(node_id);
  if (n == nullptr || n->status != NodeStatus::kActive) {
    return FailedPrecondition("assign work unit: node " + node_id.ShortHex() + " is not active");
  }
  ML_ASSIGN_OR_RETURN(WorkUnit * u, Unit(s, task_id, index, "assign work unit"));
  if (u->status != WorkUnitStatus::kPending && u->status != WorkUnitStatus::kFailed) {
    return FailedPrecondition("assign work unit: unit " + std::to_string(index) + " is " +
                              std::string(WorkUnitStatusName(u->status)));
  }
  u->status = WorkUnitStatus::kAssigned;
  u->assignee = node_id;
  u->deadline_height = deadline_height;
  u->result_hash = Hash256{};
  return Status::Ok();
}

Status CommitWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index,
                      const Hash256& result_hash) {
  ML_ASSIGN_OR_RETURN(WorkUnit * u, Unit(s, task_id, index, "commit work unit"));
  if (u->status != WorkUnitStatus::kAssigned) {
    return FailedPrecondition("commit work unit: unit " + std::to_string(index) + " is " +
                              std::string(WorkUnitStatusName(u->status)));
  }
  u->status = WorkUnitStatus::kCommitted;
  u->result_hash = result_hash;
  return Status::Ok();
}

Status SettleWorkUnit(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                      uint32_t index, Amount amount) {
  const TaskRecord* t = s.tasks.Find(task_id);
  if (t == nullptr) return NotFound("settle work unit: task " + task_id.ToHex() + " not found");
  Amount cap = UnitCost(*t, t->price_cap);
  if (amount > cap) {
    return InvalidArgument("settle work unit: payment " + std::to_string(amount) +
                           " is over one unit's cost at the task's price cap, " +
                           std::to_string(cap));
  }
  ML_ASSIGN_OR_RETURN(WorkUnit * u, Unit(s, task_id, index, "settle work unit"));
  if (u->status != WorkUnitStatus::kCommitted) {
    return FailedPrecondition("settle work unit: unit " + std::to_string(index) + " is " +
                              std::string(WorkUnitStatusName(u->status)));
  }
  u->status = WorkUnitStatus::kVerified;
  u->paid = amount;
  PublicKey node_id = u->assignee;
  NodeRecord* n = s.nodes.FindMutable(node_id);
  if (n == nullptr) return NotFound("settle work unit: assignee node is not registered");
  n->reputation.units_completed++;
  if (!p.verification) {  // with verification, a clean check credits these (verification.cc)
    n->reputation.units_verified_clean++;
    n->reputation.clean_streak++;
  }
  ML_RETURN_IF_ERROR(CheckedAdd(n->earnings.units, amount, &n->earnings.units, "node earnings"));
  return PayFromEscrow(s, p, task_id, n->owner, amount);
}

Status FailWorkUnit(LedgerState& s, const Hash256& task_id, uint32_t index) {
  ML_ASSIGN_OR_RETURN(WorkUnit * u, Unit(s, task_id, index, "fail work unit"));
  if (u->status != WorkUnitStatus::kAssigned && u->status != WorkUnitStatus::kCommitted) {
    return FailedPrecondition("fail work unit: unit " + std::to_string(index) + " is " +
                              std::string(WorkUnitStatusName(u->status)));
  }
  u->status = WorkUnitStatus::kFailed;
  if (NodeRecord* n = s.nodes.FindMutable(u->assignee)) {
    n->reputation.failures++;
    n->reputation.clean_streak = 0;
  }
  return Status::Ok();
}

Amount MaxTaskCost(const TaskParams& params, Amount price_cap, Amount* unit_cost,
                   uint32_t verifiers_per_unit) {
  const Amount unit = protocol::UnitCostTokens(TaskSpecViewOf(Hash256{}, params, price_cap),
                                               price_cap);
  if (unit_cost != nullptr) *unit_cost = unit;
  // One round: its units (a replica's stages each their share), their verifications and the
  // aggregation; saturating.
  const auto add = [](Amount a, Amount b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
  const auto mul = [](Amount a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; };
  Amount replica = 0;  // a replica's stages (one unit without stages)
  for (uint32_t stage = 0; stage < std::max<uint32_t>(params.stages, 1); ++stage) {
    replica = add(replica, StageUnitCost(params, unit, stage));
  }
  // Every unit's work and, per verifier, its check (paid at most the unit's own cost: a stage
  // check its stage's share, AssignedUnitCost).
  const Amount work = mul(replica, PipelineReplicas(params));
  Amount round = add(unit, work);
  round = add(round, mul(work, verifiers_per_unit));
  return mul(round, params.rounds);
}

Amount AssignedUnitCost(const TaskRecord& t, const WorkUnit& u) {
  return StageUnitCost(t.params, UnitCost(t, u.price), StageSlotOf(t.params, u.index).stage);
}

Status SettleAtAssignedPrice(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                             uint32_t index) {
  const TaskRecord* t = s.tasks.Find(task_id);
  const WorkUnit* u = s.units.Find({task_id, index});
  if (t == nullptr || u == nullptr) {
    return NotFound("settle work unit: unit " + std::to_string(index) + " of task " +
                    task_id.ShortHex() + " not found");
  }
  return SettleWorkUnit(s, p, task_id, index, std::min(AssignedUnitCost(*t, *u), t->escrow));
}

void ResetWorkUnit(WorkUnit* u) {
  u->status = WorkUnitStatus::kPending;
  u->assignee = PublicKey{};
  u->deadline_height = 0;
  u->result_hash = Hash256{};
  u->commitment = Hash256{};
  u->loss_micros = 0;
  u->price = 0;
  u->assignment_beacon = Hash256{};
  u->secret_index = 0;
  u->check.clear();
  u->leaves.clear();
  u->stage_commits = Hash256{};
  u->serve = StageServeRecord{};
}

namespace {

// The pipeline fields of a task's terms (TaskParams::stages and the per-stage needs).
template <typename Namer>
Status ValidatePipelineTerms(const TaskParams& p, bool verification, const Namer& name) {
  if (p.stages == 0 || p.stages > protocol::kMaxPipelineStages) {
    return InvalidArgument(name("stages") + " must be in [1, " +
                           std::to_string(protocol::kMaxPipelineStages) + "] (1: no pipeline), got " +
                           std::to_string(p.stages));
  }
  if (!IsPipelineTask(p)) {
    if (!p.stage_memory_bytes.empty() || !p.stage_flops.empty()) {
      return InvalidArgument(name("stage_memory_bytes") + " and " + name("stage_flops") +
                             " must be empty for a task without stages (" + name("stages") +
                             " = 1); set " + name("stages") + " to their length");
    }
    if (!p.stage_boundary_bytes.empty()) {
      return InvalidArgument(name("stage_boundary_bytes") +
                             " must be empty for a task without stages (" + name("stages") +
                             " = 1): a task of S stages lists its S-1 boundaries");
    }
    if (p.eval_memory_bytes != 0) {
      return InvalidArgument(name("eval_memory_bytes") + " = " +
                             std::to_string(p.eval_memory_bytes) +
                             " must be 0 for a task without stages (" + name("stages") +
                             " = 1): its aggregator evaluates with the trainer its units train "
                             "with (memory_bytes)");
    }
    return Status::Ok();
  }
  if (p.units_per_round % p.stages != 0) {
    return InvalidArgument(name("units_per_round") + " = " + std::to_string(p.units_per_round) +
                           " must be replicas x " + name("stages") + " = replicas x " +
                           std::to_string(p.stages) + " (one unit per stage of every replica)");
  }
  if (p.stage_memory_bytes.size() != p.stages || p.stage_flops.size() != p.stages) {
    return InvalidArgument(name("stage_memory_bytes") + " and " + name("stage_flops") +
                           " must hold one entry per stage (" + std::to_string(p.stages) +
                           "), got " + std::to_string(p.stage_memory_bytes.size()) + " and " +
                           std::to_string(p.stage_flops.size()));
  }
  for (uint32_t s = 0; s < p.stages; ++s) {
    if (p.stage_memory_bytes[s] == 0 || p.stage_flops[s] == 0) {
      return InvalidArgument(name("stage_memory_bytes") + "[" + std::to_string(s) + "] and " +
                             name("stage_flops") + "[" + std::to_string(s) +
                             "] must be > 0 (engine::CutCosts of the stage)");
    }
  }
  // What each boundary moves is the link cost protocol::PlaceStages pairs its nodes by; its
  // bound keeps that cost's arithmetic in 64 bits.
  if (p.stage_boundary_bytes.size() + 1 != p.stages) {
    return InvalidArgument(name("stage_boundary_bytes") + " must hold one entry per boundary " +
                           "between consecutive stages (" + name("stages") +
                           " - 1 = " + std::to_string(p.stages - 1) + "), got " +
                           std::to_string(p.stage_boundary_bytes.size()) +
                           ": the bytes a step moves across each (engine::CutBoundaryBytes)");
  }
  for (uint32_t b = 0; b + 1 < p.stages; ++b) {
    const uint64_t bytes = p.stage_boundary_bytes[b];
    if (bytes == 0 || bytes > protocol::kMaxStageBoundaryBytes) {
      return InvalidArgument(
          name("stage_boundary_bytes") + "[" + std::to_string(b) + "] = " + std::to_string(bytes) +
          " must be in [1, " + std::to_string(protocol::kMaxStageBoundaryBytes) +
          "]: the bytes a step moves between stages " + std::to_string(b) + " and " +
          std::to_string(b + 1) + " (engine::CutBoundaryBytes of the task's cut)");
    }
  }
  if (verification) {
    // Each stage unit's check runs over its H step leaves and the commitment
    // (protocol::StageCheckLeaves), which must fit in a CommitStage; a stage step replays exactly.
    if (p.inner_steps + 1ull > kMaxHashListLength) {
      return InvalidArgument(name("inner_steps") + " = " + std::to_string(p.inner_steps) +
                             " with " + name("stages") + " = " + std::to_string(p.stages) +
                             ": a stage unit commits one leaf per step, and at most " +
                             std::to_string(kMaxHashListLength - 1) +
                             " fit in a CommitStage on a verifying chain; lower " +
                             name("inner_steps"));
    }
    if (p.tolerance_rel_l2_ppm != 0 || p.tolerance_cosine_gap_ppb != 0) {
      return InvalidArgument(name("stages") + " = " + std::to_string(p.stages) +
                             ": a stage step is replayed exactly; tolerance mode (" +
                             name("tolerance_rel_l2_ppm") + ", " + name("tolerance_cosine_gap_ppb") +
                             ") is not for pipeline tasks: set both to 0");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateTaskTerms(const TaskParams& p, Amount budget, Amount price_cap, bool verification,
                         uint32_t verifiers_per_unit, const TaskFieldNamer& namer) {
  auto name = [&](std::string_view field) {
    if (namer) return namer(field);
    if (field == "budget" || field == "price_cap") return std::string(field);
    return "params." + std::string(field);
  };
  if (budget == 0) return InvalidArgument(name("budget") + " must be > 0");
  if (price_cap == 0) {
    return InvalidArgument(name("price_cap") +
                           " must be > 0 (tokens per 10^9 training FLOPs); no node works for free");
  }
  Status valid = protocol::ValidateTaskSpec(TaskSpecViewOf(Hash256{}, p, price_cap));
  if (!valid.ok()) return InvalidArgument("params: " + valid.message());
  const uint64_t units = static_cast<uint64_t>(p.rounds) * p.units_per_round;
  if (units > kMaxTaskUnits) {
    return InvalidArgument(name("rounds") + " x " + name("units_per_round") + " is " +
                           std::to_string(units) + ", over the limit of " +
                           std::to_string(kMaxTaskUnits) + "; use fewer rounds or units");
  }
  if (p.checkpoint_interval == 0 || p.checkpoint_interval > p.inner_steps) {
    return InvalidArgument(name("checkpoint_interval") + " must be in [1, " +
                           name("inner_steps") + " = " + std::to_string(p.inner_steps) +
                           "], got " + std::to_string(p.checkpoint_interval));
  }
  const uint64_t states = protocol::SegmentCount(p.inner_steps, p.checkpoint_interval) + 1ull;
  if (verification && states > kMaxHashListLength) {
    return InvalidArgument(name("inner_steps") + " / " + name("checkpoint_interval") + " gives " +
                           std::to_string(states) + " committed states per unit; at most " +
                           std::to_string(kMaxHashListLength) +
                           " fit in a commit on a verifying chain: raise " +
                           name("checkpoint_interval"));
  }
  ML_RETURN_IF_ERROR(ValidatePipelineTerms(p, verification, name));
  if (p.data_page_tokens != 0 &&
      (p.data_page_tokens != engine::kTokenPageTokens || p.data_root.IsZero())) {
    return InvalidArgument(name("data_page_tokens") + " must be 0 (data_root over examples) or " +
                           std::to_string(engine::kTokenPageTokens) +
                           " with a data_root over the token pages (engine::TokenPageTree), got " +
                           std::to_string(p.data_page_tokens) +
                           (p.data_root.IsZero() ? " and no data_root" : ""));
  }
  if (p.tolerance_rel_l2_ppm > 1'000'000 || p.tolerance_cosine_gap_ppb > 1'000'000'000) {
    return InvalidArgument(name("tolerance_rel_l2_ppm") + " must be <= 1000000 and " +
                           name("tolerance_cosine_gap_ppb") +
                           " <= 1000000000 (0 and 0: exact mode)");
  }
  // The ledger rules an exact-mode dispute itself only from the batch it can prove against the
  // task's data root (a tile's examples or token pages, a whole step's examples): a task
  // without one would leave its disputes to the genesis key, so a verifying chain refuses it.
  if (verification && p.tolerance_rel_l2_ppm == 0 && p.tolerance_cosine_gap_ppb == 0 &&
      p.data_root.IsZero()) {
    return InvalidArgument(
        name("data_root") + " is zero: an exact-mode task (" + name("tolerance_rel_l2_ppm") +
        " and " + name("tolerance_cosine_gap_ppb") +
        " both 0) on a verifying chain has its disputes ruled by the ledger against its data "
        "root; declare data_root, the Merkle root over the task's examples/token pages; "
        "`meshlearn task submit` computes it from the bundle's data");
  }
  ML_RETURN_IF_ERROR(protocol::ValidateAssurance(p.assurance, p.target_escape_ppm, name("assurance"),
                                                 name("target_escape_ppm")));
  if (!verification && p.assurance != 0) {
    return InvalidArgument(
        name("assurance") + " is " +
        std::string(protocol::AssuranceName(static_cast<protocol::Assurance>(p.assurance))) +
        " but this chain does not verify work (genesis verification = false): nothing would be "
        "replayed; use assurance economic or a verifying chain");
  }
  // The escrow must cover the most the task can cost (an expired unit is paid once, to the node
  // that commits it), so no node ever works on a unit the escrow cannot pay.
  Amount unit_cost = 0;
  const uint32_t verifiers = verification ? verifiers_per_unit : 0;
  const Amount most = MaxTaskCost(p, price_cap, &unit_cost, verifiers);
  if (budget < most) {
    return InvalidArgument(
        name("budget") + " = " + std::to_string(budget) +
        " is below the most this task can cost, " + std::to_string(most) + " = " +
        name("rounds") + " x (" + name("units_per_round") + " x (1 solver + " +
        std::to_string(verifiers) + " verifier" + (verifiers == 1 ? "" : "s") +
        ") + 1 aggregation) x " + std::to_string(unit_cost) + " tokens a unit" +
        (IsPipelineTask(p) ? " (a stage unit's solver its stage's share of the unit)" : "") +
        " at " +
        name("price_cap") + " " + std::to_string(price_cap) + "; raise " + name("budget") +
        " or lower " + name("price_cap") + " (" + name("budget") + " must be at least " +
        std::to_string(most) + ")");
  }
  return Status::Ok();
}

Status ExecuteSubmitTask(ExecContext& ctx, const SubmitTaskTx& tx) {
  if (tx.spec_hash.IsZero()) {
    return InvalidArgument(
        "submit task: spec_hash is zero (store the task bundle as a blob first)");
  }
  const TaskParams& p = tx.params;
  if (p.initial_state.IsZero()) {
    return InvalidArgument(
        "submit task: params.initial_state is zero (store the round-0 global state as a blob "
        "first)");
  }
  Status terms = ValidateTaskTerms(p, tx.budget, tx.price_cap, ctx.params().verification,
                                   ctx.params().verifiers_per_unit);
  if (!terms.ok()) return terms.WithPrefix("submit task");
  const uint64_t units = static_cast<uint64_t>(p.rounds) * p.units_per_round;
  Hash256 id = TaskIdFor(ctx.tx.sender, ctx.tx.nonce);
  if (ctx.state.tasks.Find(id) != nullptr) {
    return AlreadyExists("submit task: task " + id.ToHex() + " exists");
  }
  protocol::RoundMachineConfig config{.task = id,
                                      .rounds = p.rounds,
                                      .units_per_round = p.units_per_round,
                                      .verification_window_blocks = p.verification_window_blocks,
                                      .initial_weights = p.initial_state,
                                      .start_height = ctx.height,
                                      .rounds_in_flight = ctx.params().rounds_in_flight};
  Result<protocol::RoundStateMachine> machine = protocol::RoundStateMachine::Create(config);
  if (!machine.ok()) return InvalidArgument("submit task: " + machine.status().message());
  ML_RETURN_IF_ERROR(Debit(ctx.state, ctx.tx.sender, tx.budget, "task budget"));
  TaskRecord t;
  t.id = id;
  t.submitter = ctx.tx.sender;
  t.spec_hash = tx.spec_hash;
  t.budget = tx.budget;
  t.escrow = tx.budget;
  t.price_cap = tx.price_cap;
  t.created_height = ctx.height;
  t.memo = tx.memo;
  t.params = p;
  t.runtime = machine->Encode();
  t.unit_count = static_cast<uint32_t>(units);
  for (uint32_t r = 0; r < p.rounds; ++r) {
    for (uint32_t shard = 0; shard < p.units_per_round; ++shard) {
      WorkUnit u;
      u.task_id = id;
      u.index = r * p.units_per_round + shard;
      u.round = r;
      u.shard = shard;
      ctx.state.units.Put({id, u.index}, std::move(u));
    }
  }
  ctx.state.tasks.Put(id, std::move(t));
  return Status::Ok();
}

namespace {

// Whether a committed unit's check settled with a result that is paid: clean or unchecked.
bool SurvivedVerification(const WorkUnit& u) {
  if (u.check.empty()) return false;
  Result<protocol::UnitCheck> c = protocol::UnitCheck::Decode(u.check);
  return c.ok() && c->stage() == protocol::CheckStage::kCheckSettled &&
         (c->result() == protocol::CheckResult::kCheckClean ||
          c->result() == protocol::CheckResult::kCheckUnchecked);
}

}  // namespace

Status ExecuteCancelTask(ExecContext& ctx, const CancelTaskTx& tx) {
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  if (t == nullptr) return NotFound("cancel task: task " + tx.task_id.ToHex() + " not found");
  if (t->submitter != ctx.tx.sender) {
    return PermissionDenied("cancel task: only the submitter " + t->submitter.ShortHex() +
                            " may cancel task " + tx.task_id.ShortHex());
  }
  // Work already committed is paid before the refund: its results are published, so cancelling
  // must not be a way to get them for free. On a verifying chain only work that survived
  // verification is, as at a round's settlement: a unit whose check has not settled clean or
  // unchecked (still running, in dispute, fraud) is not paid, else a cheat committed just before
  // a cancel would be paid unchecked (found by the chaos workload, seed 46).
  if (t->status == TaskStatus::kOpen) {
    const uint32_t count = t->unit_count;
    for (uint32_t i = 0; i < count; ++i) {
      const WorkUnit* u = ctx.state.units.Find({tx.task_id, i});
      if (u == nullptr || u->status != WorkUnitStatus::kCommitted) continue;
      if (ctx.params().verification && !SurvivedVerification(*u)) continue;
      ML_RETURN_IF_ERROR(SettleAtAssignedPrice(ctx.state, ctx.params(), tx.task_id, i));
    }
  }
  return CloseTask(ctx.state, tx.task_id, TaskStatus::kCancelled, ctx.height);
}

}  // namespace meshlearn::ledger
