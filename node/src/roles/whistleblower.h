// The whistleblower role (not a public header; docs/node.md "Whistleblower"): re-checks one
// segment of a sample of the units settled clean or unchecked in a round not final yet, and
// challenges one that does not replay (ChallengeUnit).
//
// One settled check:
//
//   kUndrawn ──draw──▶ kPassed   (not in the sample: WhistleSampleDraw >= whistleblower_sample,
//      │                          or the node rubber-stamps as a verifier)
//      └─────────────▶ kDrawn ──re-check (a job, when nothing urgent waits)──▶ kChecked
//                                   mismatch: challenge.json (ChallengeRecord), ChallengeUnit,
//                                   then the dispute (disputes.h); a wrong result: ProveResult
//
// A dispute this node challenged whose solver lost by its silence alone shows nothing about the
// unit: the ledger waits for its merits (CheckAssignment::merits_deadline). The node shows them
// (a job, once): the witness of the disputed segment from the state its challenge replayed it
// from (node/step_witness.h BuildSegmentWitnessOf), sent as ProveMerits; the ledger replays it,
// and the verifiers that called the unit clean are slashed with the solver
// (docs/verification.md, "A solver silent in a whistleblower's dispute"). Any other checker node
// the ledger lists the window to (CheckRole::kCheckRoleMerits) shows them as well, replaying the
// disputed segment itself, so a challenger that crashed or keeps them back shields nobody.
//
// The draw and the segment are protocol/draw.h's, hashes of the node key and the unit: a
// restarted node draws the same units, and re-checks a drawn one again (its re-check is not
// journaled; the challenge's marker keeps it from challenging twice).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "node_context.h"
#include "verify_job.h"
#include "verify_outbox.h"

namespace meshlearn::node {

class Whistleblower {
 public:
  enum class DrawState : uint8_t { kUndrawn, kPassed, kDrawn, kChecked };

  Whistleblower(NodeContext* node, VerifyOutbox* outbox) : node_(node), outbox_(outbox) {}

  DrawState StateOf(const CheckAssignment& c) const;
  // A settled check this node may re-check: drawn into `later`, once per check.
  void Play(const CheckAssignment& c, std::vector<VerifyJob>* later);
  Status Run(const CheckAssignment& c);
  // A check in its merits window whose dispute this node challenged (the challenge's finding
  // journaled here), or that the ledger lists to it as another checker (kCheckRoleMerits; not for
  // a rubber stamp): the ProveMerits job into `urgent` (by the window's last height) until sent or
  // given up, where the ledger rules a unit's merits (ledger::ProveMeritsRefusal).
  void PlayMerits(const CheckAssignment& c, std::vector<VerifyJob>* urgent);
  // Builds the disputed segment's witness (another node's dispute: after replaying the segment,
  // CheckSegments) and sends ProveMerits (once; given up, with the reason logged, when the
  // witness cannot be built or does not show the segment false).
  Status RunMerits(const CheckAssignment& c);
  // The check of `dir` is over.
  void Forget(const std::string& dir) {
    passed_.erase(dir);
    drawn_.erase(dir);
    checked_.erase(dir);
  }

 private:
  NodeContext* node_;
  VerifyOutbox* outbox_;
  std::set<std::string> passed_, drawn_, checked_;  // check dirs
};

}  // namespace meshlearn::node
