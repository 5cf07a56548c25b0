// Accounts: balances, transfers, the devnet faucet, and the token primitives every other module
// moves money with.
#include "execute.h"

namespace meshlearn::ledger {

Status Credit(LedgerState& s, const PublicKey& to, Amount amount) {
  if (Account* a = s.accounts.FindMutable(to)) {
    if (a->balance > UINT64_MAX - amount) {  // the message is built only on failure
      return CheckedAdd(a->balance, amount, &a->balance, "balance of " + to.ShortHex());
    }
    a->balance += amount;
    return Status::Ok();
  }
  Account fresh;
  fresh.key = to;
  fresh.balance = amount;
  s.accounts.Put(to, std::move(fresh));
  return Status::Ok();
}

Status Debit(LedgerState& s, const PublicKey& from, Amount amount, std::string_view what) {
  const Account* a = s.accounts.Find(from);
  Amount have = a ? a->balance : 0;
  if (have < amount) {
    return FailedPrecondition("insufficient funds for " + std::string(what) + ": need " +
                              std::to_string(amount) + ", balance of " + from.ShortHex() +
                              " is " + std::to_string(have));
  }
  s.accounts.FindMutable(from)->balance -= amount;
  return Status::Ok();
}

Status Mint(LedgerState& s, const PublicKey& to, Amount amount) {
  Globals* g = s.MutableGlobals();
  ML_RETURN_IF_ERROR(CheckedAdd(g->minted, amount, &g->minted, "total minted"));
  return Credit(s, to, amount);
}

Status CreditTreasury(LedgerState& s, Amount amount) {
  Globals* g = s.MutableGlobals();
  return CheckedAdd(g->treasury, amount, &g->treasury, "treasury");
}

Status ExecuteTransfer(ExecContext& ctx, const TransferTx& tx) {
  if (tx.amount == 0) return InvalidArgument("transfer: amount must be > 0");
  if (tx.to == PublicKey{}) return InvalidArgument("transfer: recipient 'to' is the zero key");
  ML_RETURN_IF_ERROR(Debit(ctx.state, ctx.tx.sender, tx.amount, "transfer"));
  return Credit(ctx.state, tx.to, tx.amount);
}

Status ExecuteFaucet(ExecContext& ctx, const FaucetTx& tx) {
  if (!ctx.genesis.faucet) {
    return FailedPrecondition("faucet: this chain has no faucet (genesis faucet = false)");
  }
  if (tx.amount == 0) return InvalidArgument("faucet: amount must be > 0");
  if (tx.amount > ctx.params().faucet_max_amount) {
    return InvalidArgument("faucet: amount " + std::to_string(tx.amount) + " is over the limit of " +
                           std::to_string(ctx.params().faucet_max_amount));
  }
  if (tx.recipient == PublicKey{}) return InvalidArgument("faucet: recipient is the zero key");
  return Mint(ctx.state, tx.recipient, tx.amount);
}

}  // namespace meshlearn::ledger
