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
  }
  return "unknown";
}

bool VerifyOutbox::Done(const VerifyAction& action) const {
  if (sent_.count(action)) return true;
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

bool VerifyOutbox::OnOutcome(const TxOutcome& o) {
  auto it = txs_.find(o.id);
  if (it == txs_.end()) return false;
  if (!o.ok) {
    sent_.erase(it->second);  // may be sent again (Send caps the attempts)
    ++failed_[it->second];
    (void)node_->env()->DeleteFile(MarkerOf(it->second));
  }
  txs_.erase(it);
  return true;
}

void VerifyOutbox::Forget(const std::string& dir) {
  for (auto s = sent_.begin(); s != sent_.end();) {
    s = s->dir == dir ? sent_.erase(s) : std::next(s);
  }
  for (auto f = failed_.begin(); f != failed_.end();) {
    f = f->first.dir == dir ? failed_.erase(f) : std::next(f);
  }
}

}  // namespace meshlearn::node
