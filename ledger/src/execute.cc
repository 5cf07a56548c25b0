#include "execute.h"

#include <algorithm>

#include "fields.h"

namespace meshlearn::ledger {

namespace {

// Collects the PublicKey fields of a payload.
struct KeyCollector {
  std::vector<PublicKey>& out;
  void operator()(const char*, const PublicKey& k) { out.push_back(k); }
  template <internal::HasVisit T>
  void operator()(const char*, const T& v) {
    T::Visit(v, *this);
  }
  template <typename T>
  void operator()(const char*, const T&) {}
};

Status Dispatch(ExecContext& ctx) {
  return std::visit(
      [&](const auto& p) -> Status {
        using T = std::decay_t<decltype(p)>;
#define ML_DISPATCH_(Name, tag, module) \
  if constexpr (std::is_same_v<T, Name##Tx>) return Execute##Name(ctx, p);
        MESHLEARN_LEDGER_TX_TYPES(ML_DISPATCH_)
#undef ML_DISPATCH_
      },
      ctx.tx.payload);
}

// The limits DecodeTx applies, checked on the struct (an in-process Transaction can hold
// anything; a block must only carry what every follower can decode).
struct LimitChecker {
  Status status;
  void operator()(const char* n, const std::string& v) {
    if (status.ok() && v.size() > kMaxStringFieldLength) {
      status = InvalidArgument(std::string("transaction: field '") + n + "' is " +
                               std::to_string(v.size()) + " bytes, over the limit of " +
                               std::to_string(kMaxStringFieldLength));
    }
    if (status.ok() && !internal::IsValidUtf8(v)) {
      status = InvalidArgument(std::string("transaction: field '") + n + "' is not valid UTF-8");
    }
  }
  template <internal::HasVisit T>
  void operator()(const char*, const T& v) {
    T::Visit(v, *this);
  }
  template <typename T>
  void operator()(const char*, const T&) {}
};

// Receipts carry at most kMaxReasonLength bytes, cut on a UTF-8 character boundary.
std::string Truncate(std::string s) {
  if (s.size() <= kMaxReasonLength) return s;
  size_t cut = kMaxReasonLength;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;
  s.resize(cut);
  return s;
}

}  // namespace

Status CheckedAdd(Amount a, Amount b, Amount* out, std::string_view what) {
  if (__builtin_add_overflow(a, b, out)) {
    return InvalidArgument(std::string(what) + ": " + std::to_string(a) + " + " +
                           std::to_string(b) + " overflows a 64-bit amount");
  }
  return Status::Ok();
}

Status CheckedSub(Amount a, Amount b, Amount* out, std::string_view what) {
  if (b > a) {
    return FailedPrecondition(std::string(what) + ": " + std::to_string(b) + " is more than " +
                              std::to_string(a));
  }
  *out = a - b;
  return Status::Ok();
}

Amount BasisPoints(Amount amount, uint32_t bps) {
  DCHECK(bps <= 10000);
  // amount = q * 10000 + r; amount * bps / 10000 = q * bps + r * bps / 10000, no overflow.
  Amount q = amount / 10000, r = amount % 10000;
  return q * bps + r * bps / 10000;
}

PreparedTx::PreparedTx(const Transaction& t) : tx(t) {
  Bytes enc = EncodeTx(t);
  buffer.reserve(kTxDomain.size() + enc.size());
  buffer.insert(buffer.end(), kTxDomain.begin(), kTxDomain.end());
  buffer.insert(buffer.end(), enc.begin(), enc.end());
  wire = ByteSpan(buffer).subspan(kTxDomain.size());
  signed_message = ByteSpan(buffer).first(buffer.size() - Signature::kSize);
  id = TxIdOfEncoded(wire);
}

Status CheckAdmission(const LedgerState& state, const Genesis& genesis, const PreparedTx& p,
                      bool exact_nonce) {
  const Transaction& tx = p.tx;
  if (const size_t limit = MaxTxBytes(PayloadType(tx.payload)); p.wire.size() > limit) {
    return ResourceExhausted("transaction is " + std::to_string(p.wire.size()) +
                             " bytes, over the limit of " + std::to_string(limit));
  }
  if (tx.chain_id != genesis.chain_id) {
    return InvalidArgument("transaction is for chain '" + tx.chain_id + "', this is '" +
                           genesis.chain_id + "'");
  }
  LimitChecker limits{Status::Ok()};
  std::visit([&](const auto& v) { std::decay_t<decltype(v)>::Visit(v, limits); }, tx.payload);
  ML_RETURN_IF_ERROR(limits.status);
  DCHECK(Bytes(p.signed_message.begin(), p.signed_message.end()) == SigningBytes(tx));
  if (!Verify(tx.sender, p.signed_message, tx.signature)) {
    return PermissionDenied("transaction signature does not verify for sender " +
                            tx.sender.ToHex());
  }
  const Account* a = state.accounts.Find(tx.sender);
  uint64_t next = a ? a->nonce : 0;
  if (a == nullptr) {
    bool faucet = genesis.faucet && std::holds_alternative<FaucetTx>(tx.payload);
    if (!faucet) {
      return NotFound("sender " + tx.sender.ToHex() +
                      " has no account (it must receive tokens first)");
    }
  }
  if (tx.nonce < next) {
    return InvalidArgument("nonce " + std::to_string(tx.nonce) + " was already used; sender's " +
                           "next nonce is " + std::to_string(next));
  }
  if (exact_nonce && tx.nonce != next) {
    return InvalidArgument("nonce " + std::to_string(tx.nonce) + " skips ahead; sender's next " +
                           "nonce is " + std::to_string(next));
  }
  return Status::Ok();
}

Status ExecuteBlockTx(LedgerState& state, const Genesis& genesis, uint64_t height,
                      int64_t time_ms, const Hash256& block_seed, const PreparedTx& p,
                      uint32_t index, Receipt* receipt) {
  ML_RETURN_IF_ERROR(CheckAdmission(state, genesis, p, /*exact_nonce=*/true));
  const Transaction& tx = p.tx;
  const Hash256& id = p.id;
  // The nonce is consumed whatever happens next.
  if (Account* a = state.accounts.FindMutable(tx.sender)) {
    a->nonce++;
  } else {
    Account fresh;
    fresh.key = tx.sender;
    fresh.nonce = 1;
    state.accounts.Put(tx.sender, std::move(fresh));
  }
  LedgerState::Mark mark = state.GetMark();
  ExecContext ctx{state, genesis, height, time_ms, block_seed, tx, id};
  Status s = Status::Ok();
  if (tx.fee > 0) {
    s = Debit(state, tx.sender, tx.fee, "fee");
    if (s.ok()) s = CreditTreasury(state, tx.fee);
  }
  if (s.ok()) s = Dispatch(ctx);
  if (!s.ok()) state.RollbackTo(mark);
  receipt->tx_id = id;
  receipt->height = height;
  receipt->index = index;
  receipt->ok = s.ok();
  receipt->code = s.code();
  receipt->reason = Truncate(s.message());
  return Status::Ok();
}

std::vector<PublicKey> TxParties(const Transaction& tx) {
  std::vector<PublicKey> keys{tx.sender};
  std::visit(
      [&](const auto& p) { std::decay_t<decltype(p)>::Visit(p, KeyCollector{keys}); },
      tx.payload);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

Result<NodeRecord*> OwnedNode(LedgerState& s, const PublicKey& node_id, const PublicKey& owner) {
  const NodeRecord* n = s.nodes.Find(node_id);
  if (n == nullptr) return NotFound("node " + node_id.ToHex() + " is not registered");
  if (n->owner != owner) {
    return PermissionDenied("node " + node_id.ToHex() + " is owned by " + n->owner.ToHex() +
                            ", not by the sender");
  }
  return s.nodes.FindMutable(node_id);
}

}  // namespace meshlearn::ledger
