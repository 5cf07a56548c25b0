#include "verifier.h"

#include "disputes.h"
#include "journal.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/protocol/verification.h"
#include "segment_checker.h"

namespace meshlearn::node {

namespace {

using Kind = VerifyAction::Kind;
using protocol::CheckStage;

ledger::MerkleProofField ProofField(const std::vector<Hash256>& leaves, uint64_t index) {
  MerkleProof p = MerkleProve(leaves, index);
  return ledger::MerkleProofField{
      .index = p.index, .leaf_count = p.leaf_count, .siblings = std::move(p.siblings)};
}

}  // namespace

Result<ledger::MismatchClaimField> ClaimOf(const journal::Finding& f) {
  const uint32_t seg = f.segment;
  if (seg + 1ull >= f.leaves.size()) return DataLoss("the claim's segment is out of range");
  ledger::MismatchClaimField c;
  c.segment = seg;
  c.start = f.leaves[seg];
  c.start_proof = ProofField(f.leaves, seg);
  c.solver_end = f.leaves[seg + 1];
  c.end_proof = ProofField(f.leaves, seg + 1);
  c.replayed_end = f.replayed_end;
  return c;
}

std::string Verifier::JournalPath(const CheckAssignment& c) const {
  return JoinPath(node_->VerifyDir(c), "verdict.json");
}

Verifier::VerdictState Verifier::StateOf(const CheckAssignment& c) const {
  // Decided once the journal exists (a damaged one is not replayed again: its reveal fails).
  if (!node_->env()->FileExists(JournalPath(c))) return VerdictState::kToReplay;
  const std::string dir = node_->VerifyDir(c);
  if (outbox_->Sent({.dir = dir, .kind = Kind::kReveal})) return VerdictState::kRevealed;
  if (outbox_->Sent({.dir = dir, .kind = Kind::kCommit})) return VerdictState::kCommitted;
  return VerdictState::kDecided;
}

void Verifier::Play(const CheckAssignment& c, std::vector<VerifyJob>* urgent) {
  const std::string dir = node_->VerifyDir(c);
  const VerdictState state = StateOf(c);
  const bool commit_window = c.stage == CheckStage::kCheckCommitVerdicts;
  const bool reveal_window = c.stage == CheckStage::kCheckRevealVerdicts;
  if (commit_window && state == VerdictState::kToReplay) {
    urgent->push_back({VerifyJob::Kind::kVerdict, &c, c.deadline_height});
    return;
  }
  if (state == VerdictState::kToReplay || (!commit_window && !reveal_window)) return;
  Result<journal::VerdictRecord> v =
      journal::ReadJournal<journal::VerdictRecord>(node_->env(), JournalPath(c));
  if (commit_window && v.ok()) {
    // Decided before a restart: the commitment may not have gone out (the outbox knows).
    outbox_->Send({.dir = dir, .kind = Kind::kCommit},
                  ledger::CommitVerdictTx{.task_id = c.task_id,
                                          .index = c.index,
                                          .node_id = node_->id(),
                                          .commitment = v->commitment});
  } else if (reveal_window) {
    RevealVerdict(c);
  }
  // A result found wrong before a restart: prove it (ProveResult sends it once).
  if (!outbox_->Sent({.dir = dir, .kind = Kind::kProve}) && v.ok() && v->finding.result_wrong) {
    ProveResult(*node_, *outbox_, c);
  }
}

Status Verifier::RunVerdict(const CheckAssignment& c) {
  const std::string dir = node_->VerifyDir(c);
  ML_RETURN_IF_ERROR(node_->env()->CreateDirs(dir));
  const bool rubber_stamp = CheatsAsVerifier(node_->options().adversary);
  SegmentFinding f;
  if (!rubber_stamp) {
    // A stage unit (a pipeline task): its drawn steps, each replayed alone from what the stage
    // node serves.
    ML_ASSIGN_OR_RETURN(TaskContext * ctx, node_->GetTask(c.task_id));
    if (ctx->bundle.net.stages > 1) {
      ML_ASSIGN_OR_RETURN(f, CheckStageSteps(*node_, c, c.segments));
    } else {
      ML_ASSIGN_OR_RETURN(f, CheckSegments(*node_, c, c.segments, dir));
    }
    ++node_->stats().replays;
  }  // else rubber stamp: "clean", nothing replayed
  const protocol::Verdict verdict =
      f.mismatch ? protocol::Verdict::kVerdictMismatch : protocol::Verdict::kVerdictClean;
  // The salt hides the verdict until the reveal: secret (the node key) and the same after a
  // restart.
  const KeySeed& seed = node_->key().seed();
  const Hash256 salt = Hasher("meshlearn.node.verdict_salt.v1")
                           .Update(ByteSpan(seed.bytes.data(), seed.bytes.size()))
                           .Update(c.task_id)
                           .UpdateU64(c.index)
                           .UpdateU64(c.commit_height)
                           .Finish();
  const Hash256 evidence =
      f.mismatch ? protocol::MismatchEvidence(f.segment, f.replayed_end) : Hash256{};
  const journal::VerdictRecord v{
      .finding = f.Record(),
      .verdict = static_cast<uint32_t>(verdict),
      .salt = salt,
      .commitment = protocol::VerdictCommitment(
          verdict, salt, node_->id(), protocol::UnitId{c.task_id, c.round, c.shard}, evidence)};
  ML_RETURN_IF_ERROR(journal::WriteJournal(node_->env(), JournalPath(c), v));
  std::string segs;
  for (uint32_t s : c.segments) segs += (segs.empty() ? "" : ",") + std::to_string(s);
  node_->Log(CheckName(c) + ": verdict " + std::string(protocol::VerdictName(verdict)) +
             (rubber_stamp ? " (rubber stamp, nothing replayed)"
                           : " (segments " + segs + " of solver " + c.solver.ShortHex() + ")") +
             (f.mismatch ? ": segment " + std::to_string(f.segment) + " replays to " +
                               f.replayed_end.ShortHex() + ", committed " + f.solver_end.ShortHex()
                         : ""));
  if (outbox_->Send({.dir = dir, .kind = Kind::kCommit},
                    ledger::CommitVerdictTx{.task_id = c.task_id,
                                            .index = c.index,
                                            .node_id = node_->id(),
                                            .commitment = v.commitment})) {
    ++node_->stats().verdicts_committed;
    if (f.mismatch) ++node_->stats().mismatches;
  }
  // After the verdict's commitment (same block, in order): the proof settles the check and
  // voids the verdicts.
  if (f.result == ResultCheck::kWrong) ProveResult(*node_, *outbox_, c);
  return Status::Ok();
}

void Verifier::RevealVerdict(const CheckAssignment& c) {
  const VerifyAction action{.dir = node_->VerifyDir(c), .kind = Kind::kReveal};
  if (outbox_->Sent(action)) return;
  Result<journal::VerdictRecord> v =
      journal::ReadJournal<journal::VerdictRecord>(node_->env(), JournalPath(c));
  if (!v.ok()) {
    node_->Log(CheckName(c) + ": cannot reveal the verdict: " + v.status().message());
    outbox_->GiveUp(action);
    return;
  }
  ledger::RevealVerdictTx tx{.task_id = c.task_id,
                             .index = c.index,
                             .node_id = node_->id(),
                             .verdict = static_cast<uint8_t>(v->verdict),
                             .salt = v->salt};
  if (v->finding.mismatch) {
    Result<ledger::MismatchClaimField> claim = ClaimOf(v->finding);
    if (!claim.ok()) {
      node_->Log(CheckName(c) + ": cannot reveal the verdict: " + claim.status().message());
      outbox_->GiveUp(action);
      return;
    }
    tx.claim = std::move(*claim);
    // The task bundle, when the ledger requires it or can narrow the dispute to one tile (ruled
    // by RefereeTile; a GPT stage unit's too, over its stage's plan).
    Result<std::string> bundle = MismatchBundle(*node_, c, tx.claim);
    if (!bundle.ok()) {  // the reveal would be refused without it: try again next poll
      node_->Log(CheckName(c) + ": cannot reveal the mismatch yet: " + bundle.status().message());
      return;
    }
    tx.bundle.text = std::move(*bundle);
    if (!outbox_->Done(action)) (void)NoteServeBond(*node_, c, tx.claim);
  }
  if (outbox_->Send(action, std::move(tx))) ++node_->stats().verdicts_revealed;
}

ledger::Amount NoteServeBond(NodeContext& node, const CheckAssignment& c,
                             const ledger::MismatchClaimField& claim) {
  Result<TaskContext*> ctx = node.GetTask(c.task_id);
  Result<const ledger::ChainParams*> params = node.GenesisParams();
  if (!ctx.ok() || !params.ok()) return 0;  // the ledger decides; nothing to note
  Result<ledger::Amount> bond =
      ledger::ServeBondOf((*ctx)->info.params, c.index, claim, (*params)->serve_bond_per_piece);
  if (!bond.ok() || *bond == 0) return 0;
  node.Log(CheckName(c) + ": claiming that the stage served nothing for step " +
           std::to_string(claim.segment) + ": its serve bond of " + std::to_string(*bond) +
           " goes with the claim (the stage's if it serves its evidence on chain, back if not)");
  return *bond;
}

void ProveResult(NodeContext& node, VerifyOutbox& outbox, const CheckAssignment& c) {
  const std::string dir = node.VerifyDir(c);
  const VerifyAction action{.dir = dir, .kind = Kind::kProve};
  if (outbox.Done(action)) return;  // not the witness's I/O again every poll
  auto give_up = [&](const std::string& why) {
    if (!outbox.Failed(action)) node.Log(CheckName(c) + ": cannot prove the wrong result: " + why);
    outbox.GiveUp(action);
  };
  // The witness: the task bundle, the round's start state blob and the final state (saved by
  // the check that found the result wrong). All three are local: pinned or in the check's dir.
  Result<TaskContext*> ctx = node.GetTask(c.task_id);
  if (!ctx.ok()) return give_up(ctx.status().message());
  Result<Bytes> bundle = node.FetchBlob((*ctx)->info.spec_hash, {}, "");
  Result<Bytes> start = node.FetchBlob(c.start_state, {}, StateReason(c.task_id));
  if (!bundle.ok()) return give_up("the task bundle: " + bundle.status().message());
  if (!start.ok()) return give_up("the round's start state: " + start.status().message());
  Bytes witness;
  if ((*ctx)->bundle.net.stages > 1) {
    // A stage unit: the stage's last commit and its state after it (CheckStageSteps kept both).
    Result<std::string> commit = node.env()->ReadFile(JoinPath(dir, kStageFinalCommitFile));
    Result<std::string> state = node.env()->ReadFile(JoinPath(dir, kStageFinalStateFile));
    if (!commit.ok()) return give_up("the stage's last commit: " + commit.status().message());
    if (!state.ok()) return give_up("the stage's final state: " + state.status().message());
    witness = ledger::EncodeStageResultWitness({.bundle = std::string(AsStringView(*bundle)),
                                                .start_state = std::move(*start),
                                                .commit = ToBytes(*commit),
                                                .state = ToBytes(*state)});
  } else {
    Result<engine::TrainState> st =
        engine::LoadCheckpoint(node.env(), JoinPath(dir, "final.safetensors"));
    if (!st.ok()) return give_up("the final state: " + st.status().message());
    witness = ledger::EncodeResultWitness({.bundle = std::string(AsStringView(*bundle)),
                                           .start_state = std::move(*start),
                                           .state = engine::FlatState(*st)});
  }
  if (witness.size() > ledger::kMaxWitnessBytes) {
    return give_up("its witness is " + std::to_string(witness.size()) + " bytes, over the " +
                   std::to_string(ledger::kMaxWitnessBytes) + " a transaction may carry");
  }
  node.Log(CheckName(c) + ": result of unit " + std::to_string(c.index) + " (" +
           c.result_hash.ShortHex() +
           ") is not the delta of its committed final state: proving "
           "it (ProveResult, " +
           std::to_string(witness.size()) + "-byte witness)");
  if (outbox.SendProof(action, ledger::ProveResultTx{.task_id = c.task_id,
                                                     .index = c.index,
                                                     .node_id = node.id(),
                                                     .witness = {std::move(witness)}})) {
    ++node.stats().results_proven;
  }
}

}  // namespace meshlearn::node
