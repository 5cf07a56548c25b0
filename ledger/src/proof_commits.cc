// Commit, then prove (docs/verification.md, "Commit, then prove"): a ProveFraud, ProveResult or
// ProveMerits is public once sent, and a copier could send the same witness under its own key
// first. So a prover commits first (CommitProofTx: BLAKE2b(witness id, prover), nothing about
// the proof readable from it), and the proof's bounty goes to the earliest prover whose
// commitment to its witness is at least one block older than the proof: a copier commits only
// after the proof it copied was public, so its commitment is never the earliest.
//
//   CommitProof   keeps {commitment, prover, height, payer, deposit} (LedgerState::
//                 proof_commits), the deposit (params.proof_commit_deposit) held from the sender;
//                 on a full table it first evicts one (ProofCommitToEvict), forfeiting its deposit
//   a proof       TakeProofCommitter: its bounty's payee, the commitments to its witness dropped
//                 and their deposits given back to their payers
//   EndBlock      ExpireProofCommits: a commitment kProofCommitmentBlocks blocks old is dropped,
//                 its deposit forfeited to the jackpot
//
// Why a full table evicts rather than refuses, and why a deposit (docs/verification.md, "Bounded
// storage"): refusing let 256 accounts x 16 junk commitments, renewed every
// kProofCommitmentBlocks for their fees, lock every honest prover out (its proof then ruled, its
// bounty paid to nobody). Now a commitment is never refused for the chain's bound, and the one
// evicted is the oldest kept: pushing a commitment out takes as many new ones as are older than
// it, whoever keeps it and however many it keeps (evicting the oldest of the prover keeping the
// most, the first rule, let single-commitment accounts push a prover with two out for two
// deposits). Every junk commitment's deposit ends in the jackpot (expired or evicted: no proof
// spends it), so holding the table costs kMaxProofCommitments deposits per
// kProofCommitmentBlocks, and pushing one honest commitment out in the block between its
// CommitProof and its proof costs as many deposits as the table keeps older than it.
#include <algorithm>
#include <optional>
#include <string>

#include "execute.h"

namespace meshlearn::ledger {
namespace {

// The last height whose proofs count commitment `c`: a block's proofs run before its EndBlock,
// whose ExpireProofCommits then drops `c`, so a proof in this block still counts it and one
// after it never does.
uint64_t LastCountingHeight(const ProofCommit& c) { return c.height + kProofCommitmentBlocks; }

// Drops kept commitment `key`, its deposit back to its payer (`refund`: a proof spent it) or to
// the jackpot (it expired or was evicted unspent). The deposit was counted in Totals::escrow, so
// neither move can overflow while the ledger's invariant holds.
void ReleaseProofCommit(LedgerState& s, const Hash256& key, bool refund) {
  const ProofCommit* c = s.proof_commits.Find(key);
  CHECK(c != nullptr);
  const PublicKey payer = c->payer;
  const Amount deposit = c->deposit;
  s.proof_commits.Erase(key);
  if (deposit == 0) return;
  Status st = Status::Ok();
  if (refund) {
    st = Credit(s, payer, deposit);
  } else {
    Globals* g = s.MutableGlobals();
    st = CheckedAdd(g->jackpot, deposit, &g->jackpot, "jackpot");
  }
  CHECK(st.ok()) << "proof commitment " << key.ShortHex() << ": " << st.ToString();
}

}  // namespace

std::optional<Hash256> ProofCommitToEvict(const LedgerState& s) {
  if (s.proof_commits.rows().size() < kMaxProofCommitments) return std::nullopt;
  // The oldest; in one block, the first in key order (rows are in key order, `<` keeps the first).
  const ProofCommit* oldest = nullptr;
  for (const auto& [k, c] : s.proof_commits.rows()) {
    if (oldest == nullptr || c.height < oldest->height) oldest = &c;
  }
  CHECK(oldest != nullptr);
  return oldest->commitment;
}

Status ExecuteCommitProof(ExecContext& ctx, const CommitProofTx& tx) {
  LedgerState& s = ctx.state;
  if (tx.commitment == Hash256{}) {
    return InvalidArgument(
        "commit proof: the commitment is all zeros; send ledger::ProofCommitment(witness id, "
        "prover) of the proof you will send");
  }
  if (tx.prover != ctx.tx.sender) {
    ML_RETURN_IF_ERROR(CheckNodeSender(s, tx.prover, ctx.tx.sender, "commit proof"));
  }
  if (const ProofCommit* kept = s.proof_commits.Find(tx.commitment)) {
    return AlreadyExists("commit proof: commitment " + tx.commitment.ShortHex() +
                         " was made at height " + std::to_string(kept->height) +
                         " already (a replay counts nothing: the first one stands)");
  }
  uint32_t mine = 0;
  for (const auto& [k, c] : s.proof_commits.rows()) mine += c.prover == tx.prover;
  if (mine >= kMaxProofCommitmentsPerProver) {
    return ResourceExhausted("commit proof: prover " + tx.prover.ShortHex() + " keeps " +
                             std::to_string(mine) +
                             " commitments, the most one key may; send "
                             "their proofs, or wait for them to expire");
  }
  const Amount deposit = ctx.params().proof_commit_deposit;
  if (Status st = Debit(s, ctx.tx.sender, deposit, "the deposit"); !st.ok()) {
    return st.WithPrefix("commit proof: a commitment holds a deposit of " +
                         std::to_string(deposit) +
                         " (genesis params.proof_commit_deposit), back when its proof spends it; "
                         "fund the sender's account first");
  }
  if (std::optional<Hash256> evicted = ProofCommitToEvict(s)) {
    ReleaseProofCommit(s, *evicted, /*refund=*/false);
  }
  s.proof_commits.Put(tx.commitment, ProofCommit{.commitment = tx.commitment,
                                                 .prover = tx.prover,
                                                 .height = ctx.height,
                                                 .payer = ctx.tx.sender,
                                                 .deposit = deposit});
  return Status::Ok();
}

std::optional<PublicKey> TakeProofCommitter(LedgerState& s, const Hash256& witness_id,
                                            const PublicKey& sender, uint64_t height,
                                            bool nodes_only) {
  std::optional<ProofCommit> best;
  std::vector<Hash256> spent;
  for (const auto& [k, c] : s.proof_commits.rows()) {
    if (ProofCommitment(witness_id, c.prover) != c.commitment) continue;
    spent.push_back(k);
    // At least one block older than the proof, and not expired.
    if (c.height >= height || LastCountingHeight(c) < height) continue;
    if (nodes_only && s.nodes.Find(c.prover) == nullptr) continue;
    if (!best || c.height < best->height ||
        (c.height == best->height && c.prover == sender && best->prover != sender)) {
      best = c;
    }
  }
  for (const Hash256& k : spent) ReleaseProofCommit(s, k, /*refund=*/true);
  if (!best) return std::nullopt;
  return best->prover;
}

void ExpireProofCommits(LedgerState& s, uint64_t height) {
  std::vector<Hash256> expired;
  for (const auto& [k, c] : s.proof_commits.rows()) {
    if (LastCountingHeight(c) <= height) expired.push_back(k);
  }
  for (const Hash256& k : expired) ReleaseProofCommit(s, k, /*refund=*/false);
}

}  // namespace meshlearn::ledger
