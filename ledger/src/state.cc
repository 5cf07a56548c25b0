#include "meshlearn/ledger/state.h"

#include <set>

#include "execute.h"
#include "fields.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/unit_check.h"

namespace meshlearn::ledger {

namespace {

struct RoleName {
  uint32_t bit;
  const char* name;
};
constexpr RoleName kRoleNames[] = {{kRoleSolver, "solver"},
                                   {kRoleVerifier, "verifier"},
                                   {kRoleWhistleblower, "whistleblower"},
                                   {kRoleAggregator, "aggregator"}};

}  // namespace

std::string RolesToString(uint32_t roles) {
  std::string out;
  for (const RoleName& r : kRoleNames) {
    if (roles & r.bit) {
      if (!out.empty()) out += ",";
      out += r.name;
    }
  }
  return out;
}

Result<uint32_t> ParseRoles(std::string_view list) {
  uint32_t roles = 0;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string_view name = list.substr(start, end - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    bool found = false;
    for (const RoleName& r : kRoleNames) {
      if (name == r.name) {
        roles |= r.bit;
        found = true;
      }
    }
    if (!found) {
      return InvalidArgument("roles: unknown role '" + std::string(name) +
                             "' (known: solver, verifier, whistleblower, aggregator)");
    }
    start = end + 1;
  }
  if (roles == 0) return InvalidArgument("roles: give at least one role");
  return roles;
}

std::string_view NodeStatusName(NodeStatus s) {
  switch (s) {
    case NodeStatus::kActive: return "active";
    case NodeStatus::kJailed: return "jailed";
    case NodeStatus::kUnbonding: return "unbonding";
  }
  return "unknown";
}

std::string_view TaskStatusName(TaskStatus s) {
  switch (s) {
    case TaskStatus::kOpen: return "open";
    case TaskStatus::kFinished: return "finished";
    case TaskStatus::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string_view WorkUnitStatusName(WorkUnitStatus s) {
  switch (s) {
    case WorkUnitStatus::kPending: return "pending";
    case WorkUnitStatus::kAssigned: return "assigned";
    case WorkUnitStatus::kCommitted: return "committed";
    case WorkUnitStatus::kVerified: return "verified";
    case WorkUnitStatus::kFailed: return "failed";
    case WorkUnitStatus::kCancelled: return "cancelled";
  }
  return "unknown";
}

Hash256 TaskIdFor(const PublicKey& submitter, uint64_t nonce) {
  Hasher h("meshlearn.task.v1");
  h.Update(submitter.span());
  h.UpdateU64(nonce);
  return h.Finish();
}

uint32_t PipelineReplicas(const TaskParams& p) {
  // The protocol's count, so the ledger's replicas and the aggregator's estimates agree.
  return protocol::RoundReplicas(TaskSpecViewOf(Hash256{}, p, 0));
}

Amount StageUnitCost(const TaskParams& p, Amount unit_cost, uint32_t stage) {
  if (!IsPipelineTask(p)) return unit_cost;
  __extension__ typedef unsigned __int128 U128;
  U128 total = 0;
  for (uint64_t f : p.stage_flops) total += f;
  const U128 part = static_cast<U128>(unit_cost) * p.stage_flops.at(stage);  // < 2^128
  return static_cast<Amount>(part / total + (part % total != 0 ? 1 : 0));  // <= unit_cost: stage_flops[stage] <= total
}

StageSlot StageSlotOf(const TaskParams& p, uint32_t index) {
  const uint32_t per_round = p.units_per_round == 0 ? 1 : p.units_per_round;
  const uint32_t stages = IsPipelineTask(p) ? p.stages : 1;
  const uint32_t within = index % per_round;
  return {index / per_round, within / stages, within % stages};
}

uint32_t StageUnitIndex(const TaskParams& p, const StageSlot& slot) {
  const uint32_t stages = IsPipelineTask(p) ? p.stages : 1;
  return slot.round * p.units_per_round + slot.replica * stages + slot.stage;
}

Status Totals::Check() const {
  uint64_t sum = 0;
  bool overflow = false;
  for (Amount part : {balances, staked, unbonding, escrow, treasury, jackpot}) {
    overflow |= __builtin_add_overflow(sum, part, &sum);
  }
  if (overflow || sum != minted) {
    return Internal("ledger invariant broken: balances " + std::to_string(balances) +
                    " + staked " + std::to_string(staked) + " + unbonding " +
                    std::to_string(unbonding) + " + escrow " + std::to_string(escrow) +
                    " + treasury " + std::to_string(treasury) + " + jackpot " +
                    std::to_string(jackpot) + (overflow ? " overflows" : " = " + std::to_string(sum)) +
                    ", minted " + std::to_string(minted));
  }
  return Status::Ok();
}

// ---- Encodings. Field order is part of the state hash: append, never reorder.

void EncodeAccount(Encoder& e, const Account& a) {
  e.PutPublicKey(a.key).PutU64(a.balance).PutU64(a.nonce);
  e.PutU32(static_cast<uint32_t>(a.unbonding.size()));
  for (const Unbonding& u : a.unbonding) {
    e.PutPublicKey(u.node_id).PutU64(u.amount).PutU64(u.release_height);
  }
}

Status DecodeAccount(Decoder& d, Account* a) {
  ML_RETURN_IF_ERROR(d.GetPublicKey(&a->key, "key"));
  ML_RETURN_IF_ERROR(d.GetU64(&a->balance, "balance"));
  ML_RETURN_IF_ERROR(d.GetU64(&a->nonce, "nonce"));
  uint32_t n;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "unbonding", 1u << 20, 48));
  a->unbonding.resize(n);
  for (Unbonding& u : a->unbonding) {
    ML_RETURN_IF_ERROR(d.GetPublicKey(&u.node_id, "unbonding.node_id"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.amount, "unbonding.amount"));
    ML_RETURN_IF_ERROR(d.GetU64(&u.release_height, "unbonding.release_height"));
  }
  return Status::Ok();
}

void EncodeProofCommit(Encoder& e, const ProofCommit& c) {
  e.PutHash(c.commitment).PutPublicKey(c.prover).PutU64(c.height);
  // A tail only with a deposit: a commitment without one (a chain whose params.
  // proof_commit_deposit is 0, or one kept before deposits) encodes and hashes as before.
  if (c.deposit != 0) e.PutPublicKey(c.payer).PutU64(c.deposit);
}

Status DecodeProofCommit(Decoder& d, ProofCommit* c) {
  ML_RETURN_IF_ERROR(d.GetHash(&c->commitment, "commitment"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c->prover, "prover"));
  ML_RETURN_IF_ERROR(d.GetU64(&c->height, "height"));
  if (d.remaining() == 0) return Status::Ok();
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c->payer, "payer"));
  ML_RETURN_IF_ERROR(d.GetU64(&c->deposit, "deposit"));
  if (c->deposit == 0) return DataLoss("proof commitment: a payer with a zero deposit");
  return Status::Ok();
}

template <typename E>
static Status GetEnum(Decoder& d, E* out, uint8_t max, std::string_view field) {
  uint8_t v;
  ML_RETURN_IF_ERROR(d.GetU8(&v, field));
  if (v > max) {
    return DataLoss(std::string(field) + ": unknown value " + std::to_string(v));
  }
  *out = static_cast<E>(v);
  return Status::Ok();
}

void EncodeNode(Encoder& e, const NodeRecord& n) {
  e.PutPublicKey(n.id).PutPublicKey(n.owner).PutString(n.endpoint).PutU32(n.roles);
  NodeCapabilities::VisitMeasured(n.capabilities, internal::FieldEncoder{e});
  e.PutU64(n.price).PutU64(n.stake).PutU8(static_cast<uint8_t>(n.status));
  const Reputation& r = n.reputation;
  e.PutU64(r.units_completed).PutU64(r.units_verified_clean).PutU64(r.clean_streak);
  e.PutU64(r.failures).PutU64(r.slashes).PutU64(r.joined_height);
  e.PutU64(n.last_heartbeat_height);
  e.PutHash(n.secret_anchor).PutU64(n.secret_anchor_index).PutU64(n.secrets_committed);
  NodeEarnings::Visit(n.earnings, internal::FieldEncoder{e});
  // Written only once the node reported links (ReportLinksTx) or declared its disk: a node that
  // did neither encodes as before either existed, so databases written then still load and the
  // state hash of a chain without them is unchanged. The links come first (their count then
  // written even if 0), the disk after them, only when declared.
  const uint64_t disk = n.capabilities.disk_bytes;
  if (!n.links.empty() || disk != 0) internal::FieldEncoder{e}("links", n.links);
  if (disk != 0) e.PutU64(disk);
}

Status DecodeNode(Decoder& d, NodeRecord* n) {
  ML_RETURN_IF_ERROR(d.GetPublicKey(&n->id, "id"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&n->owner, "owner"));
  ML_RETURN_IF_ERROR(d.GetString(&n->endpoint, "endpoint", kMaxStringFieldLength));
  ML_RETURN_IF_ERROR(d.GetU32(&n->roles, "roles"));
  internal::FieldDecoder fd{d, Status::Ok()};
  NodeCapabilities::VisitMeasured(n->capabilities, fd);
  ML_RETURN_IF_ERROR(fd.status);
  ML_RETURN_IF_ERROR(d.GetU64(&n->price, "price"));
  ML_RETURN_IF_ERROR(d.GetU64(&n->stake, "stake"));
  ML_RETURN_IF_ERROR(GetEnum(d, &n->status, 2, "status"));
  Reputation& r = n->reputation;
  ML_RETURN_IF_ERROR(d.GetU64(&r.units_completed, "units_completed"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.units_verified_clean, "units_verified_clean"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.clean_streak, "clean_streak"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.failures, "failures"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.slashes, "slashes"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.joined_height, "joined_height"));
  ML_RETURN_IF_ERROR(d.GetU64(&n->last_heartbeat_height, "last_heartbeat_height"));
  ML_RETURN_IF_ERROR(d.GetHash(&n->secret_anchor, "secret_anchor"));
  ML_RETURN_IF_ERROR(d.GetU64(&n->secret_anchor_index, "secret_anchor_index"));
  ML_RETURN_IF_ERROR(d.GetU64(&n->secrets_committed, "secrets_committed"));
  internal::FieldDecoder ed{d, Status::Ok()};
  NodeEarnings::Visit(n->earnings, ed);
  ML_RETURN_IF_ERROR(ed.status);
  // The record's optional tail (EncodeNode): the links, present exactly when the node has links
  // or a declared disk, then the disk, present exactly when declared, so each record still has
  // one encoding. A node record is the last thing its decoder holds.
  if (d.remaining() > 0) {
    internal::FieldDecoder ld{d, Status::Ok()};
    ld("links", n->links);
    ML_RETURN_IF_ERROR(ld.status);
    if (d.remaining() > 0) {
      ML_RETURN_IF_ERROR(d.GetU64(&n->capabilities.disk_bytes, "capabilities.disk_bytes"));
      if (n->capabilities.disk_bytes == 0) {
        return DataLoss("node: capabilities.disk_bytes is written only when declared (not 0)");
      }
    } else if (n->links.empty()) {
      return DataLoss("node: links are written only when there are some or a disk follows");
    }
  }
  return Status::Ok();
}

void EncodeTask(Encoder& e, const TaskRecord& t) {
  e.PutHash(t.id).PutPublicKey(t.submitter).PutHash(t.spec_hash);
  e.PutU64(t.budget).PutU64(t.escrow).PutU64(t.spent).PutU64(t.refunded).PutU64(t.price_cap);
  e.PutU8(static_cast<uint8_t>(t.status)).PutU64(t.created_height).PutU32(t.unit_count);
  e.PutString(t.memo);
  TaskParams::Visit(t.params, internal::FieldEncoder{e});
  e.PutBytes(t.runtime).PutHash(t.final_state);
  e.PutU32(static_cast<uint32_t>(t.round_results.size()));
  for (const RoundResult& r : t.round_results) {
    e.PutHash(r.state).PutU32(r.test_accuracy_ppm).PutU64(r.test_loss_micros);
    e.PutPublicKey(r.aggregator).PutU64(r.committed_height).PutU64(r.aggregator_price);
    e.PutU64(r.aggregator_paid);
  }
  e.PutU32(t.rounds_settled).PutU64(t.aggregator_price);
  const VerificationTally& v = t.verification;
  e.PutU64(v.clean).PutU64(v.unchecked).PutU64(v.fraud).PutU64(v.forced_error);
  e.PutU64(v.abandoned).PutU64(v.disputes).PutU64(v.slashed).PutU64(v.verifiers_paid);
  e.PutU64(v.jackpot_paid).PutU64(v.redo_escrow);
  e.PutU64(t.treasury_cut);
  e.PutU64(v.rounds_rewound).PutU64(v.clawed_back).PutU64(v.rounds_dropped);
  e.PutU32(static_cast<uint32_t>(v.proven_frauds.size()));
  for (const ProvenFraud& f : v.proven_frauds) ProvenFraud::Visit(f, internal::FieldEncoder{e});
  // Written only once set (the task closed, a proof reopened it, a dispute was ruled): a task
  // without any encodes as before they existed, so databases written then still load and such a
  // task's record (hence the state hash, the block hashes and the beacons drawn from them) is
  // unchanged. The rulings come last, after a tail that is then written even if both are 0.
  // The late games open come after the rulings (their count then written even if 0), only while
  // one is open.
  if (t.closed_height == 0 && v.reopened == 0 && v.rulings.empty() && v.late_games.empty()) return;
  e.PutU64(t.closed_height).PutU64(v.reopened);
  if (v.rulings.empty() && v.late_games.empty()) return;
  e.PutU32(static_cast<uint32_t>(v.rulings.size()));
  for (const DisputeRuling& r : v.rulings) DisputeRuling::Visit(r, internal::FieldEncoder{e});
  if (v.late_games.empty()) return;
  e.PutU32(static_cast<uint32_t>(v.late_games.size()));
  for (uint32_t index : v.late_games) e.PutU32(index);
}

Status DecodeTask(Decoder& d, TaskRecord* t) {
  ML_RETURN_IF_ERROR(d.GetHash(&t->id, "id"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&t->submitter, "submitter"));
  ML_RETURN_IF_ERROR(d.GetHash(&t->spec_hash, "spec_hash"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->budget, "budget"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->escrow, "escrow"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->spent, "spent"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->refunded, "refunded"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->price_cap, "price_cap"));
  ML_RETURN_IF_ERROR(GetEnum(d, &t->status, 2, "status"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->created_height, "created_height"));
  ML_RETURN_IF_ERROR(d.GetU32(&t->unit_count, "unit_count"));
  ML_RETURN_IF_ERROR(d.GetString(&t->memo, "memo", kMaxStringFieldLength));
  internal::FieldDecoder fd{d, Status::Ok()};
  TaskParams::Visit(t->params, fd);
  ML_RETURN_IF_ERROR(fd.status);
  ML_RETURN_IF_ERROR(d.GetBytes(&t->runtime, "runtime"));
  ML_RETURN_IF_ERROR(d.GetHash(&t->final_state, "final_state"));
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "round_results", 1u << 24, 32 + 4 + 8 + 32 + 8 + 8 + 8));
  t->round_results.resize(n);
  for (RoundResult& r : t->round_results) {
    ML_RETURN_IF_ERROR(d.GetHash(&r.state, "round_results.state"));
    ML_RETURN_IF_ERROR(d.GetU32(&r.test_accuracy_ppm, "round_results.test_accuracy_ppm"));
    ML_RETURN_IF_ERROR(d.GetU64(&r.test_loss_micros, "round_results.test_loss_micros"));
    ML_RETURN_IF_ERROR(d.GetPublicKey(&r.aggregator, "round_results.aggregator"));
    ML_RETURN_IF_ERROR(d.GetU64(&r.committed_height, "round_results.committed_height"));
    ML_RETURN_IF_ERROR(d.GetU64(&r.aggregator_price, "round_results.aggregator_price"));
    ML_RETURN_IF_ERROR(d.GetU64(&r.aggregator_paid, "round_results.aggregator_paid"));
  }
  ML_RETURN_IF_ERROR(d.GetU32(&t->rounds_settled, "rounds_settled"));
  ML_RETURN_IF_ERROR(d.GetU64(&t->aggregator_price, "aggregator_price"));
  VerificationTally& v = t->verification;
  for (auto [field, name] : {std::pair{&v.clean, "verification.clean"},
                             {&v.unchecked, "verification.unchecked"},
                             {&v.fraud, "verification.fraud"},
                             {&v.forced_error, "verification.forced_error"},
                             {&v.abandoned, "verification.abandoned"},
                             {&v.disputes, "verification.disputes"},
                             {&v.slashed, "verification.slashed"},
                             {&v.verifiers_paid, "verification.verifiers_paid"},
                             {&v.jackpot_paid, "verification.jackpot_paid"},
                             {&v.redo_escrow, "verification.redo_escrow"}}) {
    ML_RETURN_IF_ERROR(d.GetU64(field, name));
  }
  ML_RETURN_IF_ERROR(d.GetU64(&t->treasury_cut, "treasury_cut"));
  ML_RETURN_IF_ERROR(d.GetU64(&v.rounds_rewound, "verification.rounds_rewound"));
  ML_RETURN_IF_ERROR(d.GetU64(&v.clawed_back, "verification.clawed_back"));
  ML_RETURN_IF_ERROR(d.GetU64(&v.rounds_dropped, "verification.rounds_dropped"));
  uint32_t frauds = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&frauds, "verification.proven_frauds",
                                static_cast<uint32_t>(kMaxTaskUnits),
                                4 * 3 + 32 * 2 + 8 * 4 + 1 + 4));
  v.proven_frauds.resize(frauds);
  for (ProvenFraud& f : v.proven_frauds) {
    internal::FieldDecoder fd{d, Status::Ok()};
    ProvenFraud::Visit(f, fd);
    ML_RETURN_IF_ERROR(fd.status);
  }
  // The record's optional tail (EncodeTask): present exactly when one of them is set, so each
  // record still has one encoding. A task record is the last thing its decoder holds.
  if (d.remaining() == 0) return Status::Ok();
  ML_RETURN_IF_ERROR(d.GetU64(&t->closed_height, "closed_height"));
  ML_RETURN_IF_ERROR(d.GetU64(&v.reopened, "verification.reopened"));
  if (d.remaining() > 0) {
    uint32_t rulings = 0;
    // The least a ruling takes: its fixed fields and an empty reason's length.
    ML_RETURN_IF_ERROR(
        d.GetCount(&rulings, "verification.rulings", 1u << 24, 2 + 32 * 4 + 8 * 3 + 4 * 2 + 2 + 4));
    v.rulings.resize(rulings);
    for (DisputeRuling& r : v.rulings) {
      internal::FieldDecoder fd{d, Status::Ok()};
      DisputeRuling::Visit(r, fd);
      ML_RETURN_IF_ERROR(fd.status);
      if (!IsRulingTx(static_cast<TxType>(r.tx))) {
        return DataLoss("task: verification.rulings: tx type " + std::to_string(r.tx) +
                        " is no ruling transaction");
      }
    }
    if (d.remaining() > 0) {
      uint32_t late = 0;
      ML_RETURN_IF_ERROR(
          d.GetCount(&late, "verification.late_games", static_cast<uint32_t>(kMaxTaskUnits), 4));
      if (late == 0) return DataLoss("task: verification.late_games is written only when open");
      v.late_games.resize(late);
      for (uint32_t& index : v.late_games) {
        ML_RETURN_IF_ERROR(d.GetU32(&index, "verification.late_games"));
      }
    } else if (rulings == 0) {
      return DataLoss("task: verification.rulings is written only when it has one");
    }
  } else if (t->closed_height == 0 && v.reopened == 0) {
    return DataLoss("task: closed_height and verification.reopened are written only when set");
  }
  return Status::Ok();
}

void EncodeWorkUnit(Encoder& e, const WorkUnit& u) {
  e.PutHash(u.task_id).PutU32(u.index).PutU8(static_cast<uint8_t>(u.status));
  e.PutPublicKey(u.assignee).PutU64(u.deadline_height).PutHash(u.result_hash).PutU64(u.paid);
  e.PutU32(u.round).PutU32(u.shard).PutHash(u.commitment).PutU64(u.loss_micros).PutU64(u.price);
  e.PutHash(u.assignment_beacon).PutU64(u.secret_index).PutBytes(u.check);
  e.PutU32(static_cast<uint32_t>(u.leaves.size()));
  for (const Hash256& h : u.leaves) e.PutHash(h);
  // Only a committed stage unit that named its commits has the tail: every other unit's bytes,
  // hence the state hash, are what they were before the field. A stage serving its evidence has a
  // second one (stage_commits first, zero when unset), only while its window is open.
  // A claimant's serve bond, a third (serve written closed when it is), only while one is held; a
  // late game (a fourth, only while open) writes the three before it (zero when unset).
  const bool bonds = !u.serve_bonds.empty();
  const bool late = u.late.open();
  if (!u.stage_commits.IsZero() || u.serve.open() || bonds || late) e.PutHash(u.stage_commits);
  if (u.serve.open() || bonds || late) {
    e.PutU64(u.serve.step).PutU64(u.serve.window_end).PutU32(u.serve.pieces);
    e.PutBytes(u.serve.served);
  }
  if (bonds || late) {
    e.PutU32(static_cast<uint32_t>(u.serve_bonds.size()));
    for (const ServeBond& b : u.serve_bonds) {
      e.PutPublicKey(b.claimant).PutPublicKey(b.payer).PutU64(b.amount);
    }
  }
  if (late) {
    e.PutPublicKey(u.late.challenger).PutU32(u.late.segment).PutU64(u.late.bond);
    e.PutBytes(u.late.game);
  }
}

Status DecodeWorkUnit(Decoder& d, WorkUnit* u) {
  ML_RETURN_IF_ERROR(d.GetHash(&u->task_id, "task_id"));
  ML_RETURN_IF_ERROR(d.GetU32(&u->index, "index"));
  ML_RETURN_IF_ERROR(GetEnum(d, &u->status, 5, "status"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&u->assignee, "assignee"));
  ML_RETURN_IF_ERROR(d.GetU64(&u->deadline_height, "deadline_height"));
  ML_RETURN_IF_ERROR(d.GetHash(&u->result_hash, "result_hash"));
  ML_RETURN_IF_ERROR(d.GetU64(&u->paid, "paid"));
  ML_RETURN_IF_ERROR(d.GetU32(&u->round, "round"));
  ML_RETURN_IF_ERROR(d.GetU32(&u->shard, "shard"));
  ML_RETURN_IF_ERROR(d.GetHash(&u->commitment, "commitment"));
  ML_RETURN_IF_ERROR(d.GetU64(&u->loss_micros, "loss_micros"));
  ML_RETURN_IF_ERROR(d.GetU64(&u->price, "price"));
  ML_RETURN_IF_ERROR(d.GetHash(&u->assignment_beacon, "assignment_beacon"));
  ML_RETURN_IF_ERROR(d.GetU64(&u->secret_index, "secret_index"));
  ML_RETURN_IF_ERROR(d.GetBytes(&u->check, "check", 1u << 20));
  uint32_t leaves = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&leaves, "leaves", kMaxHashListLength, 32));
  u->leaves.resize(leaves);
  for (Hash256& h : u->leaves) ML_RETURN_IF_ERROR(d.GetHash(&h, "leaves"));
  if (d.remaining() > 0) {
    ML_RETURN_IF_ERROR(d.GetHash(&u->stage_commits, "stage_commits"));
    if (d.remaining() > 0) {
      ML_RETURN_IF_ERROR(d.GetU64(&u->serve.step, "serve.step"));
      ML_RETURN_IF_ERROR(d.GetU64(&u->serve.window_end, "serve.window_end"));
      ML_RETURN_IF_ERROR(d.GetU32(&u->serve.pieces, "serve.pieces"));
      ML_RETURN_IF_ERROR(d.GetBytes(&u->serve.served, "serve.served",
                                    StageServeRecord::BitmapBytes(StageServeRecord::kMaxPieces)));
      if (d.remaining() > 0) {
        uint32_t bonds = 0;
        ML_RETURN_IF_ERROR(d.GetCount(&bonds, "serve_bonds", WorkUnit::kMaxServeBonds, 72));
        u->serve_bonds.resize(bonds);
        for (ServeBond& b : u->serve_bonds) {
          ML_RETURN_IF_ERROR(d.GetPublicKey(&b.claimant, "serve_bonds.claimant"));
          ML_RETURN_IF_ERROR(d.GetPublicKey(&b.payer, "serve_bonds.payer"));
          ML_RETURN_IF_ERROR(d.GetU64(&b.amount, "serve_bonds.amount"));
          if (b.amount == 0) return DataLoss("work unit: a serve bond of 0 is not held");
        }
        if (d.remaining() > 0) {  // a late game: the tails before it written, zero when unset
          ML_RETURN_IF_ERROR(d.GetPublicKey(&u->late.challenger, "late.challenger"));
          ML_RETURN_IF_ERROR(d.GetU32(&u->late.segment, "late.segment"));
          ML_RETURN_IF_ERROR(d.GetU64(&u->late.bond, "late.bond"));
          ML_RETURN_IF_ERROR(d.GetBytes(&u->late.game, "late.game", 1u << 20));
          if (!u->late.open()) return DataLoss("work unit: late is written only while open");
        } else if (bonds == 0) {
          return DataLoss(
              "work unit: serve_bonds is written only when held or a late game follows");
        }
      }
      // Closed (all zero) only when a bond or a late game follows.
      const bool closed = !u->serve.open() && u->serve.step == 0 && u->serve.pieces == 0 &&
                          u->serve.served.empty() && (!u->serve_bonds.empty() || u->late.open());
      if (!closed && (!u->serve.open() || u->serve.pieces > StageServeRecord::kMaxPieces ||
                      u->serve.served.size() != StageServeRecord::BitmapBytes(u->serve.pieces))) {
        return DataLoss("work unit: serve is written only while open, with a bit per piece");
      }
    } else if (u->stage_commits.IsZero()) {
      return DataLoss("work unit: stage_commits is written only when set");
    }
  }
  return Status::Ok();
}

// ---- JSON views.

nlohmann::json AccountToJson(const Account& a) {
  nlohmann::json unbonding = nlohmann::json::array();
  for (const Unbonding& u : a.unbonding) {
    unbonding.push_back({{"node_id", u.node_id.ToHex()},
                         {"amount", u.amount},
                         {"release_height", u.release_height}});
  }
  return {{"key", a.key.ToHex()},
          {"balance", a.balance},
          {"nonce", a.nonce},
          {"unbonding", std::move(unbonding)}};
}

nlohmann::json NodeToJson(const NodeRecord& n) {
  nlohmann::json caps = nlohmann::json::object();
  NodeCapabilities::Visit(n.capabilities, internal::FieldToJson{caps});
  nlohmann::json earnings = nlohmann::json::object();
  NodeEarnings::Visit(n.earnings, internal::FieldToJson{earnings});
  nlohmann::json links = nlohmann::json::object();
  internal::FieldToJson{links}("links", n.links);
  const Reputation& r = n.reputation;
  return {{"id", n.id.ToHex()},
          {"owner", n.owner.ToHex()},
          {"endpoint", n.endpoint},
          {"roles", n.roles},
          {"role_names", RolesToString(n.roles)},
          {"capabilities", std::move(caps)},
          {"price", n.price},
          {"stake", n.stake},
          {"status", std::string(NodeStatusName(n.status))},
          {"reputation",
           {{"units_completed", r.units_completed},
            {"units_verified_clean", r.units_verified_clean},
            {"clean_streak", r.clean_streak},
            {"failures", r.failures},
            {"slashes", r.slashes},
            {"joined_height", r.joined_height}}},
          {"last_heartbeat_height", n.last_heartbeat_height},
          {"secret_anchor", n.secret_anchor.ToHex()},
          {"secret_anchor_index", n.secret_anchor_index},
          {"secrets_committed", n.secrets_committed},
          {"earnings", std::move(earnings)},
          {"links", std::move(links["links"])}};
}

uint64_t AuditWindowEnd(const TaskRecord& t, uint64_t audit_window_blocks) {
  if (t.status != TaskStatus::kFinished) return 0;
  return t.closed_height > UINT64_MAX - audit_window_blocks ? UINT64_MAX
                                                            : t.closed_height + audit_window_blocks;
}

nlohmann::json TaskToJson(const TaskRecord& t, std::optional<uint64_t> audit_window_blocks) {
  nlohmann::json params = nlohmann::json::object();
  TaskParams::Visit(t.params, internal::FieldToJson{params});
  nlohmann::json results = nlohmann::json::array();
  for (size_t r = 0; r < t.round_results.size(); ++r) {
    const RoundResult& rr = t.round_results[r];
    results.push_back({{"round", r},
                       {"state", rr.state.ToHex()},
                       {"test_accuracy_ppm", rr.test_accuracy_ppm},
                       {"test_loss_micros", rr.test_loss_micros},
                       {"aggregator", rr.aggregator.ToHex()},
                       {"committed_height", rr.committed_height},
                       {"aggregator_price", rr.aggregator_price},
                       {"aggregator_paid", rr.aggregator_paid}});
  }
  // Proven frauds, and the rounds they mark (distinct, ascending).
  nlohmann::json frauds = nlohmann::json::array();
  std::set<uint32_t> marked;
  for (const ProvenFraud& f : t.verification.proven_frauds) {
    nlohmann::json j = nlohmann::json::object();
    ProvenFraud::Visit(f, internal::FieldToJson{j});
    frauds.push_back(std::move(j));
    marked.insert(f.round);
  }
  nlohmann::json fraud_rounds(std::vector<uint32_t>(marked.begin(), marked.end()));
  // Rulings, with what follows from their fields: the transaction's name, whom the ruling was
  // for, and a stage unit's place in its round.
  nlohmann::json rulings = nlohmann::json::array();
  for (const DisputeRuling& r : t.verification.rulings) {
    nlohmann::json j = nlohmann::json::object();
    DisputeRuling::Visit(r, internal::FieldToJson{j});
    j["tx"] = std::string(TxTypeName(static_cast<TxType>(r.tx)));
    // Both honest: a claim of availability answered (a stage served its evidence on chain:
    // ServeStageEvidence), which shows neither party wrong.
    j["for"] = r.defender_honest && r.challenger_honest   ? "both"
               : r.defender_honest == r.challenger_honest ? "neither"
               : r.defender_honest                        ? "defender"
                                                          : "challenger";
    if (IsPipelineTask(t.params)) {
      const StageSlot slot = StageSlotOf(t.params, r.index);
      j["stage"] = slot.stage;
      j["replica"] = slot.replica;
    }
    rulings.push_back(std::move(j));
  }
  nlohmann::json phase = nullptr, round = nullptr, aggregator = nullptr;
  nlohmann::json history = nlohmann::json::array();
  if (!t.runtime.empty()) {
    auto m = protocol::RoundStateMachine::Decode(t.runtime);
    if (m.ok()) {
      phase = std::string(protocol::RoundPhaseName(m->phase()));
      round = m->round();
      for (const Hash256& h : m->weights_history()) history.push_back(h.ToHex());
      if (m->aggregator()) {
        aggregator = {{"node", m->aggregator()->node.ToHex()},
                      {"round", m->aggregator()->round},
                      {"deadline_height", m->aggregator()->deadline_height}};
      }
    }
  }
  nlohmann::json j = {{"id", t.id.ToHex()},
                      {"submitter", t.submitter.ToHex()},
                      {"spec_hash", t.spec_hash.ToHex()},
                      {"budget", t.budget},
                      {"escrow", t.escrow},
                      {"spent", t.spent},
                      {"treasury_cut", t.treasury_cut},
                      {"refunded", t.refunded},
                      {"price_cap", t.price_cap},
                      {"status", std::string(TaskStatusName(t.status))},
                      {"created_height", t.created_height},
                      {"closed_height", t.closed_height},
                      {"unit_count", t.unit_count},
                      {"memo", t.memo},
                      {"params", std::move(params)},
                      {"phase", std::move(phase)},
                      {"round", std::move(round)},
                      {"weights_history", std::move(history)},
                      {"aggregator", std::move(aggregator)},
                      {"final_state", t.final_state.ToHex()},
                      {"round_results", std::move(results)},
                      {"rounds_settled", t.rounds_settled},
                      {"verification",
                       {{"clean", t.verification.clean},
                        {"unchecked", t.verification.unchecked},
                        {"fraud", t.verification.fraud},
                        {"forced_error", t.verification.forced_error},
                        {"abandoned", t.verification.abandoned},
                        {"disputes", t.verification.disputes},
                        {"slashed", t.verification.slashed},
                        {"verifiers_paid", t.verification.verifiers_paid},
                        {"jackpot_paid", t.verification.jackpot_paid},
                        {"redo_escrow", t.verification.redo_escrow},
                        {"rounds_rewound", t.verification.rounds_rewound},
                        {"clawed_back", t.verification.clawed_back},
                        {"rounds_dropped", t.verification.rounds_dropped},
                        {"reopened", t.verification.reopened},
                        {"proven_frauds", std::move(frauds)},
                        {"fraud_rounds", std::move(fraud_rounds)},
                        {"rulings", std::move(rulings)},
                        // The units with a late game open (LateChallengeTx), in opening order.
                        {"late_games", t.verification.late_games}}}};
  if (audit_window_blocks) j["audit_window_end"] = AuditWindowEnd(t, *audit_window_blocks);
  return j;
}

nlohmann::json WorkUnitToJson(const WorkUnit& u) {
  nlohmann::json check = nullptr;
  if (!u.check.empty()) {
    Result<protocol::UnitCheck> c = protocol::UnitCheck::Decode(u.check);
    check = c.ok() ? UnitCheckToJson(*c) : nlohmann::json{{"error", c.status().message()}};
  }
  nlohmann::json j = {{"task_id", u.task_id.ToHex()},
                       {"index", u.index},
                       {"round", u.round},
                       {"shard", u.shard},
                       {"status", std::string(WorkUnitStatusName(u.status))},
                       {"assignee", u.assignee.ToHex()},
                       {"deadline_height", u.deadline_height},
                       {"result_hash", u.result_hash.ToHex()},
                       {"commitment", u.commitment.ToHex()},
                       {"loss_micros", u.loss_micros},
                       {"price", u.price},
                       {"paid", u.paid},
                       {"assignment_beacon", u.assignment_beacon.ToHex()},
                       {"secret_index", u.secret_index},
                       {"leaves", [&] {
                          nlohmann::json a = nlohmann::json::array();
                          for (const Hash256& h : u.leaves) a.push_back(h.ToHex());
                          return a;
                        }()},
                       {"stage_commits", u.stage_commits.IsZero()
                                             ? nlohmann::json(nullptr)
                                             : nlohmann::json(u.stage_commits.ToHex())},
                       {"check", std::move(check)}};
  if (!u.serve_bonds.empty()) {  // only while held, as encoded
    nlohmann::json bonds = nlohmann::json::array();
    for (const ServeBond& b : u.serve_bonds) {
      bonds.push_back({{"claimant", b.claimant.ToHex()},
                       {"payer", b.payer.ToHex()},
                       {"amount", b.amount}});
    }
    j["serve_bonds"] = std::move(bonds);
  }
  // A stage serving its evidence (StageServeRecord): only while open, so that every other unit's
  // view is as before.
  if (u.serve.open()) {
    nlohmann::json served = nlohmann::json::array();
    for (uint32_t p = 0; p < u.serve.pieces; ++p) {
      if (u.serve.Has(p)) served.push_back(p);
    }
    j["serve"] = {{"step", u.serve.step},
                  {"window_end", u.serve.window_end},
                  {"pieces", u.serve.pieces},
                  {"served", std::move(served)}};
  }
  // A late dispute (LateGame): only while open, as serve.
  if (u.late.open()) {
    Result<protocol::DisputeGame> g = protocol::DisputeGame::Decode(u.late.game);
    j["late"] = {
        {"challenger", u.late.challenger.ToHex()},
        {"segment", u.late.segment},
        {"bond", u.late.bond},
        {"game", g.ok() ? DisputeGameToJson(*g) : nlohmann::json{{"error", g.status().message()}}}};
  }
  return j;
}

nlohmann::json TotalsToJson(const Totals& t) {
  return {{"balances", t.balances}, {"staked", t.staked},     {"unbonding", t.unbonding},
          {"escrow", t.escrow},     {"treasury", t.treasury}, {"jackpot", t.jackpot},
          {"minted", t.minted}};
}

}  // namespace meshlearn::ledger
