#include "ledger_state.h"

#include "meshlearn/base/encoding.h"

namespace meshlearn::ledger {

LedgerState LedgerState::FromGenesis(const Genesis& gen) {
  LedgerState s;
  Globals g;
  for (const GenesisAccount& a : gen.accounts) {
    Account acc;
    acc.key = a.key;
    acc.balance = a.balance;
    s.accounts.LoadRow(a.key, acc);
    CHECK(!__builtin_add_overflow(g.minted, a.balance, &g.minted)) << "ValidateGenesis first";
  }
  s.globals.LoadRow(0, g);
  return s;
}

const Globals& LedgerState::g() const {
  const Globals* g = globals.Find(0);
  CHECK(g != nullptr);
  return *g;
}

Globals* LedgerState::MutableGlobals() {
  Globals* g = globals.FindMutable(0);
  CHECK(g != nullptr);
  return g;
}

LedgerState::Mark LedgerState::GetMark() const {
  return {accounts.JournalSize(), nodes.JournalSize(),   tasks.JournalSize(),
          units.JournalSize(),    globals.JournalSize(), proof_commits.JournalSize()};
}

void LedgerState::RollbackTo(const Mark& m) {
  accounts.RollbackTo(m.accounts);
  nodes.RollbackTo(m.nodes);
  tasks.RollbackTo(m.tasks);
  units.RollbackTo(m.units);
  globals.RollbackTo(m.globals);
  proof_commits.RollbackTo(m.proof_commits);
}

void LedgerState::ClearJournal() {
  accounts.ClearJournal();
  nodes.ClearJournal();
  tasks.ClearJournal();
  units.ClearJournal();
  globals.ClearJournal();
  proof_commits.ClearJournal();
}

void LedgerState::ClearDirty() {
  accounts.ClearDirty();
  nodes.ClearDirty();
  tasks.ClearDirty();
  units.ClearDirty();
  globals.ClearDirty();
  proof_commits.ClearDirty();
}

void LedgerState::MarkAllDirty() {
  accounts.MarkAllDirty();
  nodes.MarkAllDirty();
  tasks.MarkAllDirty();
  units.MarkAllDirty();
  globals.MarkAllDirty();
  proof_commits.MarkAllDirty();
}

Bytes LedgerState::EncodeGlobals(const Globals& g) {
  Encoder e;
  e.PutU64(g.treasury).PutU64(g.jackpot).PutU64(g.minted);
  return e.Take();
}

Status LedgerState::DecodeGlobals(ByteSpan b, Globals* g) {
  Decoder d(b, "globals");
  ML_RETURN_IF_ERROR(d.GetU64(&g->treasury, "treasury"));
  ML_RETURN_IF_ERROR(d.GetU64(&g->jackpot, "jackpot"));
  ML_RETURN_IF_ERROR(d.GetU64(&g->minted, "minted"));
  return d.Finish();
}

Hash256 LedgerState::Hash() const {
  // One encoder reused for every row: each row is length-prefixed into the hash so that row
  // boundaries are unambiguous.
  Hasher h("meshlearn.state.v1");
  Encoder e;
  auto flush = [&] {
    h.UpdateU64(e.size());
    h.Update(e.bytes());
  };
  h.UpdateU64(static_cast<uint64_t>(StateTable::kGlobals));
  e = Encoder();
  e.PutRaw(EncodeGlobals(g()));
  flush();
  h.UpdateU64(static_cast<uint64_t>(StateTable::kAccounts)).UpdateU64(accounts.rows().size());
  for (const auto& [k, a] : accounts.rows()) {
    e = Encoder();
    EncodeAccount(e, a);
    flush();
  }
  h.UpdateU64(static_cast<uint64_t>(StateTable::kNodes)).UpdateU64(nodes.rows().size());
  for (const auto& [k, n] : nodes.rows()) {
    e = Encoder();
    EncodeNode(e, n);
    flush();
  }
  h.UpdateU64(static_cast<uint64_t>(StateTable::kTasks)).UpdateU64(tasks.rows().size());
  for (const auto& [k, t] : tasks.rows()) {
    e = Encoder();
    EncodeTask(e, t);
    flush();
  }
  h.UpdateU64(static_cast<uint64_t>(StateTable::kUnits)).UpdateU64(units.rows().size());
  for (const auto& [k, u] : units.rows()) {
    e = Encoder();
    EncodeWorkUnit(e, u);
    flush();
  }
  // Only while some are kept: a chain that never had one (or has none now) hashes as before
  // the table existed.
  if (!proof_commits.rows().empty()) {
    h.UpdateU64(static_cast<uint64_t>(StateTable::kProofCommits))
        .UpdateU64(proof_commits.rows().size());
    for (const auto& [k, c] : proof_commits.rows()) {
      e = Encoder();
      EncodeProofCommit(e, c);
      flush();
    }
  }
  return h.Finish();
}

Totals LedgerState::ComputeTotals() const {
  // Saturating sums: an overflow here already breaks the invariant, and Totals::Check reports
  // the mismatch rather than wrapping silently.
  auto add = [](Amount& into, Amount v) {
    if (__builtin_add_overflow(into, v, &into)) into = UINT64_MAX;
  };
  Totals t;
  for (const auto& [k, a] : accounts.rows()) {
    add(t.balances, a.balance);
    for (const Unbonding& u : a.unbonding) add(t.unbonding, u.amount);
  }
  for (const auto& [k, n] : nodes.rows()) add(t.staked, n.stake);
  // Bonds held on units count with the escrows. Read only where they can be (this runs every
  // block: no scan of every unit ever made): a late challenge's on the units its task lists
  // (LateGame), claimants' serve bonds (ServeBond) on an open task's units (a task's close gives
  // them back).
  for (const auto& [k, task] : tasks.rows()) {
    add(t.escrow, task.escrow);
    for (uint32_t index : task.verification.late_games) {
      if (const WorkUnit* u = units.Find({k, index})) add(t.escrow, u->late.bond);
    }
    if (task.status != TaskStatus::kOpen) continue;
    for (uint32_t index = 0; index < task.unit_count; ++index) {
      const WorkUnit* u = units.Find({k, index});
      if (u == nullptr) continue;
      for (const ServeBond& b : u->serve_bonds) add(t.escrow, b.amount);
    }
  }
  // Proof commitments' deposits: at most kMaxProofCommitments rows.
  for (const auto& [k, c] : proof_commits.rows()) add(t.escrow, c.deposit);
  t.treasury = g().treasury;
  t.jackpot = g().jackpot;
  t.minted = g().minted;
  return t;
}

}  // namespace meshlearn::ledger
