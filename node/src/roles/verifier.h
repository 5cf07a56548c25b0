// The verifier role (not a public header; docs/node.md "Verifier"; docs/verification.md): for a
// check that drew this node, replays the drawn segments (segment_checker.h), commits a verdict
// (commit-reveal), reveals it, and proves a wrong result.
//
// One check, by its journal <data_dir>/verify/<T>-<i>-<h>/verdict.json (records.h VerdictRecord)
// and the outbox's markers (verify_outbox.h):
//
//   kToReplay ──replay (a job)──▶ kDecided ──CommitVerdict──▶ kCommitted ──reveal window──▶
//   (commit window,               (verdict.json: verdict,     (sent-commit)   RevealVerdict ──▶ kRevealed
//    no journal)                   salt, claim)                                (sent-reveal)
//   a result found wrong (kDecided onwards): ProveResult, once (sent-prove)
//
// A restart in the commit window sends a decided verdict's commitment if it did not go out; in
// the reveal window it reveals from the journal (the salt is derived from the node key, the same
// after a restart). A mismatch goes on as a dispute (disputes.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "node_context.h"
#include "records.h"
#include "verify_job.h"
#include "verify_outbox.h"

namespace meshlearn::node {

class Verifier {
 public:
  enum class VerdictState : uint8_t { kToReplay, kDecided, kCommitted, kRevealed };

  Verifier(NodeContext* node, VerifyOutbox* outbox) : node_(node), outbox_(outbox) {}

  VerdictState StateOf(const CheckAssignment& c) const;
  // This tick's part of a check the node verifies: a replay job in the commit window, the
  // commitment or the reveal when decided, a result proof when found wrong.
  void Play(const CheckAssignment& c, std::vector<VerifyJob>* urgent);
  // The replay job: decide the verdict, journal it, commit it.
  Status RunVerdict(const CheckAssignment& c);

 private:
  std::string JournalPath(const CheckAssignment& c) const;
  void RevealVerdict(const CheckAssignment& c);

  NodeContext* node_;
  VerifyOutbox* outbox_;
};

// The claim a mismatch finding proves against the commitment.
Result<ledger::MismatchClaimField> ClaimOf(const journal::Finding& f);

// The serve bond a mismatch `claim` on check `c` posts from this node's account with the claim
// (RevealVerdict, ChallengeUnit): ledger::ServeBondOf at the chain's serve_bond_per_piece, for a
// claim that a stage over the stage witness bound served nothing; 0 for every other claim. The
// ledger takes it with the claim (paid to the stage if it then serves its evidence on chain, back
// to this node if not) and refuses a claim this node cannot pay; logged here, so that a refusal
// for funds reads next to its cause.
ledger::Amount NoteServeBond(NodeContext& node, const CheckAssignment& c,
                             const ledger::MismatchClaimField& claim);

// Result binding: sends ProveResult for a check whose result was found wrong (the final state
// kept in its directory), once. Verifier and whistleblower.
void ProveResult(NodeContext& node, VerifyOutbox& outbox, const CheckAssignment& c);

}  // namespace meshlearn::node
