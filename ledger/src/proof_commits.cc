// Commit, then prove (docs/verification.md, "Commit, then prove"): a ProveFraud, ProveResult or
// ProveMerits is public once sent, and a copier could send the same witness under its own key
// first. So a prover commits first (CommitProofTx: BLAKE2b(witness id, prover), nothing about
// the proof readable from it), and the proof's bounty goes to the earliest prover whose
// commitment to its witness is at least one block older than the proof: a copier commits only
// after the proof it copied was public, so its commitment is never the earliest.
//
//   CommitProof   keeps {commitment, prover, height} (LedgerState::proof_commits)
//   a proof       TakeProofCommitter: its bounty's payee, the commitments to its witness dropped
//   EndBlock      ExpireProofCommits: a commitment kProofCommitmentBlocks blocks old is dropped
#include <string>

#include "execute.h"

namespace meshlearn::ledger {
namespace {

// The last height whose proofs count commitment `c`: a block's proofs run before its EndBlock,
// whose ExpireProofCommits then drops `c`, so a proof in this block still counts it and one
// after it never does.
uint64_t LastCountingHeight(const ProofCommit& c) { return c.height + kProofCommitmentBlocks; }

}  // namespace

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
  if (s.proof_commits.rows().size() >= kMaxProofCommitments) {
    return ResourceExhausted("commit proof: the chain keeps " +
                             std::to_string(kMaxProofCommitments) +
                             " commitments already; retry after some expire (each is kept " +
                             std::to_string(kProofCommitmentBlocks) + " blocks)");
  }
  uint32_t mine = 0;
  for (const auto& [k, c] : s.proof_commits.rows()) mine += c.prover == tx.prover;
  if (mine >= kMaxProofCommitmentsPerProver) {
    return ResourceExhausted("commit proof: prover " + tx.prover.ShortHex() + " keeps " +
                             std::to_string(mine) +
                             " commitments, the most one key may; send "
                             "their proofs, or wait for them to expire");
  }
  s.proof_commits.Put(
      tx.commitment,
      ProofCommit{.commitment = tx.commitment, .prover = tx.prover, .height = ctx.height});
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
  for (const Hash256& k : spent) s.proof_commits.Erase(k);
  if (!best) return std::nullopt;
  return best->prover;
}

void ExpireProofCommits(LedgerState& s, uint64_t height) {
  std::vector<Hash256> expired;
  for (const auto& [k, c] : s.proof_commits.rows()) {
    if (LastCountingHeight(c) <= height) expired.push_back(k);
  }
  for (const Hash256& k : expired) s.proof_commits.Erase(k);
}

}  // namespace meshlearn::ledger
