// Staking: bonding tokens to nodes, unbonding with a delay, withdrawing, and slashing.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "execute.h"

namespace meshlearn::ledger {

Status BeginUnbonding(LedgerState& s, const ChainParams& p, uint64_t height, NodeRecord* node,
                      Amount amount) {
  ML_RETURN_IF_ERROR(CheckedSub(node->stake, amount, &node->stake, "unstake"));
  Account* owner = s.accounts.FindMutable(node->owner);
  if (owner == nullptr) {
    Account fresh;
    fresh.key = node->owner;
    s.accounts.Put(node->owner, fresh);
    owner = s.accounts.FindMutable(node->owner);
  }
  Unbonding u;
  u.node_id = node->id;
  u.amount = amount;
  ML_RETURN_IF_ERROR(
      CheckedAdd(height, p.unbonding_delay_blocks, &u.release_height, "unbonding release height"));
  owner->unbonding.push_back(u);
  return Status::Ok();
}

Amount BondedStake(const LedgerState& s, const NodeRecord& n) {
  Amount total = n.stake;
  if (const Account* owner = s.accounts.Find(n.owner)) {
    for (const Unbonding& u : owner->unbonding) {
      if (u.node_id == n.id) total = total > UINT64_MAX - u.amount ? UINT64_MAX : total + u.amount;
    }
  }
  return total;
}

Amount TakeBondedStake(LedgerState& s, NodeRecord* n, Amount amount) {
  Amount take = std::min(amount, n->stake);
  n->stake -= take;
  if (take == amount) return take;
  const Account* owner = s.accounts.Find(n->owner);
  if (owner == nullptr) return take;
  bool has_unbonding = false;
  for (const Unbonding& u : owner->unbonding) has_unbonding |= u.node_id == n->id && u.amount > 0;
  if (!has_unbonding) return take;  // leave an unchanged account clean
  Account* m = s.accounts.FindMutable(n->owner);
  // The entries furthest from release first: what was about to be released goes last.
  for (auto it = m->unbonding.rbegin(); it != m->unbonding.rend() && take < amount; ++it) {
    if (it->node_id != n->id) continue;
    const Amount part = std::min(amount - take, it->amount);
    it->amount -= part;
    take += part;
  }
  std::erase_if(m->unbonding,
                [&](const Unbonding& u) { return u.node_id == n->id && u.amount == 0; });
  return take;
}

Status SlashNode(LedgerState& s, const ChainParams& p, const PublicKey& node_id, Amount amount,
                 Amount* slashed) {
  NodeRecord* n = s.nodes.FindMutable(node_id);
  if (n == nullptr) return NotFound("slash: node " + node_id.ToHex() + " is not registered");
  const Amount take = TakeBondedStake(s, n, amount);
  n = s.nodes.FindMutable(node_id);
  n->status = NodeStatus::kJailed;
  n->reputation.slashes++;
  n->reputation.clean_streak = 0;
  Amount to_jackpot = BasisPoints(take, p.slash_jackpot_bps);
  Globals* g = s.MutableGlobals();
  ML_RETURN_IF_ERROR(CheckedAdd(g->jackpot, to_jackpot, &g->jackpot, "jackpot"));
  ML_RETURN_IF_ERROR(CheckedAdd(g->treasury, take - to_jackpot, &g->treasury, "treasury"));
  if (slashed) *slashed = take;
  return Status::Ok();
}

Status ClawBack(LedgerState& s, const Hash256& task_id, const PublicKey& node_id, Amount amount,
                Amount* clawed) {
  NodeRecord* n = s.nodes.FindMutable(node_id);
  if (n == nullptr || amount == 0) return Status::Ok();
  const Amount take = TakeBondedStake(s, n, amount);
  if (take == 0) return Status::Ok();
  n = s.nodes.FindMutable(node_id);
  ML_RETURN_IF_ERROR(
      CheckedAdd(n->earnings.clawed_back, take, &n->earnings.clawed_back, "node earnings"));
  TaskRecord* t = s.tasks.FindMutable(task_id);
  ML_RETURN_IF_ERROR(CheckedAdd(t->budget, take, &t->budget, "task budget"));
  if (t->status == TaskStatus::kOpen) {
    // It pays for the redo.
    ML_RETURN_IF_ERROR(CheckedAdd(t->escrow, take, &t->escrow, "task escrow"));
  } else {
    // The task is closed: straight back to the submitter (budget == escrow + spent + refunded).
    ML_RETURN_IF_ERROR(CheckedAdd(t->refunded, take, &t->refunded, "task refunded"));
    const PublicKey submitter = t->submitter;
    ML_RETURN_IF_ERROR(Credit(s, submitter, take));
  }
  *clawed += take;
  return Status::Ok();
}

Status PayFromJackpot(LedgerState& s, const PublicKey& to, Amount amount) {
  Globals* g = s.MutableGlobals();
  ML_RETURN_IF_ERROR(CheckedSub(g->jackpot, amount, &g->jackpot, "jackpot payout"));
  return Credit(s, to, amount);
}

Status ExecuteStake(ExecContext& ctx, const StakeTx& tx) {
  if (tx.amount == 0) return InvalidArgument("stake: amount must be > 0");
  ML_ASSIGN_OR_RETURN(NodeRecord * n, OwnedNode(ctx.state, tx.node_id, ctx.tx.sender));
  if (n->status == NodeStatus::kUnbonding) {
    return FailedPrecondition("stake: node " + tx.node_id.ShortHex() +
                              " has left; register it again first");
  }
  ML_RETURN_IF_ERROR(CheckedAdd(n->stake, tx.amount, &n->stake, "node stake"));
  return Debit(ctx.state, ctx.tx.sender, tx.amount, "stake");
}

Status ExecuteUnstake(ExecContext& ctx, const UnstakeTx& tx) {
  if (tx.amount == 0) return InvalidArgument("unstake: amount must be > 0");
  ML_ASSIGN_OR_RETURN(NodeRecord * n, OwnedNode(ctx.state, tx.node_id, ctx.tx.sender));
  if (n->status != NodeStatus::kActive) {
    return FailedPrecondition("unstake: node " + tx.node_id.ShortHex() + " is " +
                              std::string(NodeStatusName(n->status)) +
                              "; only an active node can unstake");
  }
  if (tx.amount > n->stake) {
    return FailedPrecondition("unstake: amount " + std::to_string(tx.amount) +
                              " is more than the node's stake " + std::to_string(n->stake));
  }
  Amount min = ctx.params().MinStakeFor(n->roles);
  if (n->stake - tx.amount < min) {
    return FailedPrecondition("unstake: would leave " + std::to_string(n->stake - tx.amount) +
                              ", below the minimum stake " + std::to_string(min) +
                              " of its roles; use LeaveNode to unstake everything");
  }
  return BeginUnbonding(ctx.state, ctx.params(), ctx.height, n, tx.amount);
}

Status ExecuteWithdraw(ExecContext& ctx, const WithdrawTx&) {
  const Account* a = ctx.state.accounts.Find(ctx.tx.sender);
  if (a == nullptr) return FailedPrecondition("withdraw: nothing is unbonding");
  // A matured entry of a node whose units are still under check stays: a slash there must still
  // reach it (OpenCheckHold). One pass over the state for all the nodes of the matured entries,
  // however many they are.
  std::set<PublicKey> nodes;
  for (const Unbonding& u : a->unbonding) {
    if (u.release_height <= ctx.height) nodes.insert(u.node_id);
  }
  const std::map<PublicKey, StakeHold> holds =
      nodes.empty() ? std::map<PublicKey, StakeHold>{}
                    : OpenCheckHold(ctx.state, ctx.params(), nodes, ctx.height);
  auto held = [&](const Unbonding& u) -> const StakeHold* {
    auto it = holds.find(u.node_id);
    return it != holds.end() && it->second.Holds(u.release_height) ? &it->second : nullptr;
  };
  Amount released = 0, kept = 0;
  const Unbonding* first_kept = nullptr;
  uint64_t next_release = UINT64_MAX;
  for (const Unbonding& u : a->unbonding) {
    if (u.release_height > ctx.height) {
      next_release = std::min(next_release, u.release_height);
    } else if (held(u) != nullptr) {
      ML_RETURN_IF_ERROR(CheckedAdd(kept, u.amount, &kept, "withdraw"));
      if (first_kept == nullptr) first_kept = &u;
    } else {
      ML_RETURN_IF_ERROR(CheckedAdd(released, u.amount, &released, "withdraw"));
    }
  }
  if (released == 0) {
    if (first_kept != nullptr) {
      const StakeHold& h = *held(*first_kept);
      return FailedPrecondition(
          "withdraw: " + std::to_string(kept) + " matured but stays slashable: node " +
          first_kept->node_id.ShortHex() + " " + h.part + " unit " + std::to_string(h.index) +
          " of task " + h.task_id.ShortHex() + " and " + h.why + ": retry at height " +
          std::to_string(h.retry_height) + " or later");
    }
    if (next_release == UINT64_MAX) return FailedPrecondition("withdraw: nothing is unbonding");
    return FailedPrecondition("withdraw: nothing has matured yet; next release at height " +
                              std::to_string(next_release));
  }
  Account* m = ctx.state.accounts.FindMutable(ctx.tx.sender);
  std::erase_if(m->unbonding, [&](const Unbonding& u) {
    return u.release_height <= ctx.height && held(u) == nullptr;
  });
  return CheckedAdd(m->balance, released, &m->balance, "balance");
}

}  // namespace meshlearn::ledger
