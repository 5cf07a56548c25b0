#include "whistleblower.h"

#include "disputes.h"
#include "journal.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/protocol/draw.h"
#include "records.h"
#include "segment_checker.h"
#include "verifier.h"

namespace meshlearn::node {

Whistleblower::DrawState Whistleblower::StateOf(const CheckAssignment& c) const {
  const std::string dir = node_->VerifyDir(c);
  if (checked_.count(dir)) return DrawState::kChecked;
  if (drawn_.count(dir)) return DrawState::kDrawn;
  if (passed_.count(dir)) return DrawState::kPassed;
  return DrawState::kUndrawn;
}

void Whistleblower::Play(const CheckAssignment& c, std::vector<VerifyJob>* later) {
  const DrawState state = StateOf(c);
  if (state == DrawState::kPassed || state == DrawState::kChecked) return;
  const std::string dir = node_->VerifyDir(c);
  if (state == DrawState::kUndrawn) {
    const KeySeed& seed = node_->key().seed();
    const double draw = protocol::WhistleSampleDraw(ByteSpan(seed.bytes.data(), seed.bytes.size()),
                                                    c.task_id, c.index, c.commit_height);
    const bool drawn = !CheatsAsVerifier(node_->options().adversary) &&
                       draw < node_->options().whistleblower_sample && c.num_segments > 0;
    (drawn ? drawn_ : passed_).insert(dir);
    if (!drawn) return;
  }
  later->push_back({VerifyJob::Kind::kWhistle, &c, UINT64_MAX});
}

Status Whistleblower::Run(const CheckAssignment& c) {
  const std::string dir = node_->VerifyDir(c);
  drawn_.erase(dir);
  checked_.insert(dir);  // one re-check per unit, whatever happens
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(dir));
  const KeySeed& seed = node_->key().seed();
  const uint32_t segment =
      protocol::WhistleSegment(ByteSpan(seed.bytes.data(), seed.bytes.size()), c.task_id, c.index,
                               c.commit_height, c.num_segments);
  // A stage unit (a pipeline task): its step replayed alone from what the stage node serves.
  ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
  SegmentFinding f;
  if (ctx->bundle.net.stages > 1) {
    ML_ASSIGN_OR_RETURN(f, CheckStageSteps(*node_, c, {segment}));
  } else {
    ML_ASSIGN_OR_RETURN(f, CheckSegments(*node_, c, {segment}, dir));
  }
  ++node_->stats().replays;
  if (f.result == ResultCheck::kWrong) {
    // One computation settles it: no dispute needed.
    ProveResult(*node_, *outbox_, c);
    return Status::Ok();
  }
  if (!f.mismatch) {
    node_->Log(CheckName(c) + ": whistleblower re-check of segment " + std::to_string(segment) +
               ": clean");
    return Status::Ok();
  }
  const journal::ChallengeRecord record{.finding = f.Record()};
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), JoinPath(dir, "challenge.json"), record));
  ML_ASSIGN_OR_RETURN(ledger::MismatchClaimField claim, ClaimOf(record.finding));
  // The task bundle, when the ledger requires it or can narrow the dispute to one tile.
  Result<std::string> bundle = MismatchBundle(*node_, c, claim);
  if (!bundle.ok()) return bundle.status().WithPrefix(CheckName(c) + ": challenge");
  node_->Log(CheckName(c) + ": whistleblower: segment " + std::to_string(f.segment) +
             " of solver " + c.solver.ShortHex() + " replays to " + f.replayed_end.ShortHex() +
             ", committed " + f.solver_end.ShortHex() + "; challenging the " +
             std::string(protocol::CheckResultName(c.result)) + " unit");
  if (outbox_->Send({.dir = dir, .kind = VerifyAction::Kind::kChallenge},
                    ledger::ChallengeUnitTx{.task_id = c.task_id,
                                            .index = c.index,
                                            .node_id = node_->id(),
                                            .claim = std::move(claim),
                                            .bundle = {std::move(*bundle)}})) {
    ++node_->stats().challenges;
  }
  return Status::Ok();
}

}  // namespace meshlearn::node
