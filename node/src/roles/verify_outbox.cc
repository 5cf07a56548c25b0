#include "verify_outbox.h"

namespace meshlearn::node {

namespace {

// The file in the check's directory that says an action's transaction was sent:
// "sent-<kind>[-<detail>_<detail>...]".
std::string MarkerOf(const VerifyAction& action) {
  std::string name = "sent-" + std::string(VerifyActionKindName(action.kind));
  for (size_t i = 0; i < action.detail.size(); ++i) {
    name += (i == 0 ? "-" : "_") + std::to_string(action.detail[i]);
  }
  return JoinPath(action.dir, name);
}

// The CommitProof action of proof action `proof`, and back.
VerifyAction CommitActionOf(const VerifyAction& proof) {
  VerifyAction commit{
      .dir = proof.dir, .kind = VerifyAction::Kind::kCommitProof, .detail = proof.detail};
  commit.detail.push_back(static_cast<uint64_t>(proof.kind));
  return commit;
}
VerifyAction ProofActionOf(const VerifyAction& commit) {
  VerifyAction proof{.dir = commit.dir,
                     .kind = static_cast<VerifyAction::Kind>(commit.detail.back()),
                     .detail = commit.detail};
  proof.detail.pop_back();
  return proof;
}

}  // namespace

std::string_view VerifyActionKindName(VerifyAction::Kind k) {
  using Kind = VerifyAction::Kind;
  switch (k) {
    case Kind::kSecret: return "secret";
    case Kind::kCommit: return "commit";
    case Kind::kReveal: return "reveal";
    case Kind::kChallenge: return "challenge";
    case Kind::kWitness: return "witness";
    case Kind::kProve: return "prove";
    case Kind::kPost: return "post";
    case Kind::kMerits: return "merits";
    case Kind::kCommitProof:
      return "commitproof";
  }
  return "unknown";
}

bool VerifyOutbox::Done(const VerifyAction& action) const {
  if (sent_.count(action) || pending_proofs_.count(action)) return true;
  auto failed = failed_.find(action);
  return failed != failed_.end() && failed->second >= kMaxVerifyAttempts;
}

bool VerifyOutbox::Send(const VerifyAction& action, ledger::TxPayload payload) {
  if (Done(action)) return false;
  Env* env = node_->env();
  const std::string marker = MarkerOf(action);
  if (env->FileExists(marker)) {  // sent before a restart
    sent_.insert(action);
    return false;
  }
  const std::string type(ledger::TxTypeName(ledger::PayloadType(payload)));
  Result<Hash256> txid = node_->tx().Send(std::move(payload));
  if (!txid.ok()) {
    node_->Log(type + " not sent: " + txid.status().message());
    ++failed_[action];
    return false;
  }
  sent_.insert(action);
  txs_[*txid] = action;
  // Best effort: without the marker a restarted node sends it again, which the ledger refuses.
  if (env->CreateDirs(action.dir).ok()) (void)env->WriteFileAtomic(marker, "");
  return true;
}

bool VerifyOutbox::SendProof(const VerifyAction& action, ledger::TxPayload proof) {
  if (sent_.count(action)) return false;
  pending_proofs_.erase(action);
  if (Done(action)) return false;
  const VerifyAction commit = CommitActionOf(action);
  for (const auto& [id, a] : txs_) {
    if (a == commit) {  // in flight: OnOutcome sends the proof
      pending_proofs_.emplace(action, std::move(proof));
      return false;
    }
  }
  if (Sent(commit)) return Send(action, std::move(proof));  // in a block, or before a restart
  if (Done(commit)) {
    node_->Log(std::string(ledger::TxTypeName(ledger::PayloadType(proof))) +
               ": its commitment was refused; sending it without one (its bounty stays in the "
               "jackpot)");
    return Send(action, std::move(proof));
  }
  const std::optional<Hash256> witness_id = ledger::ProofWitnessIdOf(proof);
  CHECK(witness_id.has_value()) << "SendProof of a payload that is no proof";
  const bool sent_now = Send(
      commit, ledger::CommitProofTx{.commitment = ledger::ProofCommitment(*witness_id, node_->id()),
                                    .prover = node_->id()});
  if (!sent_now && Sent(commit)) return Send(action, std::move(proof));  // its marker: a restart
  if (!sent_now) return false;
  pending_proofs_.emplace(action, std::move(proof));
  return true;
}

bool VerifyOutbox::OnOutcome(const TxOutcome& o) {
  auto it = txs_.find(o.id);
  if (it == txs_.end()) return false;
  const VerifyAction action = it->second;
  txs_.erase(it);
  if (!o.ok) {
    sent_.erase(action);  // may be sent again (Send caps the attempts)
    ++failed_[action];
    (void)node_->env()->DeleteFile(MarkerOf(action));
  }
  if (action.kind == VerifyAction::Kind::kCommitProof) {
    // The commitment is in a block (its proof goes now, a block later at least), or refused
    // (SendProof sends it again, or the proof without it once its attempts are spent).
    const VerifyAction proof = ProofActionOf(action);
    auto p = pending_proofs_.find(proof);
    if (p != pending_proofs_.end()) {
      ledger::TxPayload payload = std::move(p->second);
      pending_proofs_.erase(p);
      SendProof(proof, std::move(payload));
    }
  }
  return true;
}

void VerifyOutbox::Forget(const std::string& dir) {
  for (auto s = sent_.begin(); s != sent_.end();) {
    s = s->dir == dir ? sent_.erase(s) : std::next(s);
  }
  for (auto f = failed_.begin(); f != failed_.end();) {
    f = f->first.dir == dir ? failed_.erase(f) : std::next(f);
  }
  for (auto p = pending_proofs_.begin(); p != pending_proofs_.end();) {
    p = p->first.dir == dir ? pending_proofs_.erase(p) : std::next(p);
  }
}

}  // namespace meshlearn::node
