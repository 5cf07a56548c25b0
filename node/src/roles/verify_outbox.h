// The verification transactions of a node's roles, each sent at most once per check (not a
// public header): a secret reveal, a verdict's commitment and reveal, a challenge, a dispute
// post, a step witness, a result proof, a dispute's merits.
//
// A proof (ProveResult, ProveMerits) goes out committed first (SendProof; docs/verification.md,
// "Commit, then prove"): its CommitProof, then the proof itself once the commitment is in a
// block, so that a copier of the public proof cannot take its bounty.
//
// An action is sent once; a failed receipt lets it be sent again, up to kMaxVerifyAttempts
// attempts in all, then it is given up (as is one whose witness could not be built). A sent
// action leaves a marker file in the check's directory ("sent-<kind>[-<detail>...]"): after a
// restart the outbox (TxSender) resends the transaction if it is still in flight, so the marker
// keeps the role from sending it again. Forget(dir) drops everything about a check that is over.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/ledger/tx.h"
#include "node_context.h"

namespace meshlearn::node {

inline constexpr int kMaxVerifyAttempts = 3;

// One verification transaction of one check: the check (its directory), what is sent, and what
// tells two of a kind apart (the secret's index, the witnessed step, a dispute post's first
// step, last step, position and deadline).
struct VerifyAction {
  enum class Kind : uint8_t {
    kSecret,
    kCommit,
    kReveal,
    kChallenge,
    kWitness,
    kProve,
    kPost,
    kMerits,       // ProveMerits
    kCommitProof,  // a proof's CommitProof; detail: the proof's, then the proof's kind
  };
  std::string dir;
  Kind kind = Kind::kSecret;
  std::vector<uint64_t> detail;
  auto operator<=>(const VerifyAction&) const = default;
};
std::string_view VerifyActionKindName(VerifyAction::Kind k);

class VerifyOutbox {
 public:
  explicit VerifyOutbox(NodeContext* node) : node_(node) {}

  // Sends `payload` for `action` unless it is done (sent, or given up); true when sent now.
  bool Send(const VerifyAction& action, ledger::TxPayload payload);
  // Sent (in flight or included).
  bool Sent(const VerifyAction& action) const { return sent_.count(action) > 0; }
  // Commit, then prove: sends the CommitProof of `proof` (ledger::ProofCommitment of its witness
  // id and this node's key), keeps `proof`, and sends it when the commitment's receipt says it is
  // in a block (OnOutcome). A commitment sent before a restart (its marker) is taken as made: the
  // proof goes at once. A commitment refused kMaxVerifyAttempts times: the proof goes without one
  // (it still rules; its bounty stays in the jackpot). True when the proof was sent now, or kept to
  // go after the commitment sent now.
  // REQUIRES: `proof` is a ProveResult or ProveMerits (ledger::ProofWitnessIdOf).
  bool SendProof(const VerifyAction& action, ledger::TxPayload proof);
  // Whether `action` needs nothing more: sent, given up, or a proof kept until its commitment is
  // in a block. Callers check it before building a multi-MB witness.
  bool Done(const VerifyAction& action) const;
  // Whether an attempt failed (for logging a reason once).
  bool Failed(const VerifyAction& action) const { return failed_.count(action) > 0; }
  // No more attempts (its inputs are missing, or its witness cannot be built).
  void GiveUp(const VerifyAction& action) { failed_[action] = kMaxVerifyAttempts; }

  // A transaction outcome; true when it was one of ours.
  bool OnOutcome(const TxOutcome& o);
  // The check of `dir` is over.
  void Forget(const std::string& dir);

 private:
  NodeContext* node_;
  std::map<Hash256, VerifyAction> txs_;  // tx id -> action
  std::set<VerifyAction> sent_;          // sent (in flight or done)
  std::map<VerifyAction, int> failed_;   // failed attempts
  // Proofs waiting for their commitment's block, by the proof's action.
  std::map<VerifyAction, ledger::TxPayload> pending_proofs_;
};

}  // namespace meshlearn::node
