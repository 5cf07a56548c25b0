// Playing the dispute game of a check this node is a party to (not a public header; docs/node.md
// "Disputes"; protocol/dispute.h): the solver defends, the verifier or whistleblower that claimed
// a mismatch challenges.
//
// One dispute, by the query node_work shows and the journal <data_dir>/verify/<T>-<i>-<h>/
// dispute-<first>-<last>.json (records.h DisputeHashes):
//
//   steps stage, range [first, last]:
//     kToReplay ──replay the range once (a job)──▶ kReplayed ──DisputePost(position)──▶ posted
//     (the next query narrows the range: a new journal, kToReplay again)
//   referee stage at one whole step of a task with a data root:
//     the party that is not cheating posts the step's witness (RefereeStep), once
//   operators, tiles, reduction stages (a dispute opened with the task bundle, the tile phase):
//     the disputed step replayed once with its operator trace (a job; kept in memory, replayed
//     again after a restart), each query answered from it (ledger::AnswerTileQuery) by
//     DisputePost or DisputeChildren; at the referee, one tile: the party that is not cheating
//     posts the tile's witness (RefereeTile, ledger::BuildTileWitness), once
//   a pipeline stage's step (a GPT stage's mismatch with the bundle: one step, opened at the
//     operator phase): the same moves, from the step traced from what the stage node serves
//     (node/stage_check.h TraceStageStep: its commit, its checkpoint, the tensors it received),
//     by the stage node and its verifier alike; at the referee, RefereeTile with a tile's witness
//     or, for an input operator or the agreed chain end, a StageRootsWitness of the served
//     commit (BuildStageTileTx)
//
// The replay starts from a state this node trusts at the range's start: its own checkpoint as
// the defender, the solver's checkpoint its verdict or challenge started from as the challenger,
// else the unit's start. A restart reads the range's hashes back from the journal.
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/step_witness.h"
#include "node_context.h"
#include "records.h"
#include "verify_job.h"
#include "verify_outbox.h"

namespace meshlearn::node {

// The outbox action of a referee witness that posts `what` (a step; a tile; a piece of a stage's
// evidence) for the dispute `d` of the check whose folder is `dir`. A check can be disputed again
// after a dispute settles (a whistleblower's challenge of a settled unit), at the same step and
// tile; that dispute's witness or evidence must go out again, so the challenger, which names the
// dispute, is part of the action.
VerifyAction WitnessAction(const std::string& dir, const DisputeView& d,
                           std::initializer_list<uint64_t> what);

class Disputes {
 public:
  enum class RangeState : uint8_t { kToReplay, kReplayed };

  Disputes(NodeContext* node, VerifyOutbox* outbox) : node_(node), outbox_(outbox) {}

  // A query to this node (steps stage): the post now, or the replay into `urgent`. The referee
  // stage: the witness job into `urgent`.
  void Play(const CheckAssignment& c, std::vector<VerifyJob>* urgent);
  RangeState StateOf(const CheckAssignment& c);
  Status RunReplay(const CheckAssignment& c);
  // A party of a dispute that reached the referee at one whole step of a task with a data root
  // posts the step's witness itself (RefereeStepTx; node/step_witness.h): the ledger executes
  // the step, and the honest party needs nobody else to win.
  Status RunStepWitness(const CheckAssignment& c);
  // A pipeline stage's disputed step: the whole stage step's witness from the stage node's served
  // evidence (node/stage_check.h BuildStageStepTx), posted as RefereeStageStep when the ledger
  // rules the stage (ledger::LedgerRulesStageStep).
  Status RunStageStepWitness(const CheckAssignment& c, TaskContext* ctx,
                             const VerifyAction& action);
  // A claim that a stage over the witness bound served nothing for the step: every piece of the
  // step's evidence (node/stage_check.h BuildStageServeTxs), posted as ServeStageEvidence by
  // either party that can fetch it (the stage's node always can), each piece once, within the
  // ledger's serving window.
  Status RunStageServeEvidence(const CheckAssignment& c, TaskContext* ctx);
  // A continuity claim's witness (the two commits; step 0: the bundle and the round's start
  // state), posted as RefereeStageStep by either party when the stage's served commits show it.
  Status RunStageContinuityWitness(const CheckAssignment& c, TaskContext* ctx,
                                   const VerifyAction& action);
  // The disputed step of a tile dispute replayed with its trace; then the query's move.
  Status RunTrace(const CheckAssignment& c);
  // A step this node claimed a stage served nothing for, which the stage then served on chain
  // (CheckAssignment::served with this node the challenger; the check settled clean): the step
  // checked from its pieces (ReadOnChainStageStep, CheckStageStep), and, where it does not replay
  // to its committed leaf, challenged with the finding and the task bundle (ChallengeUnit, which
  // the ledger takes from the claimant whatever its roles); else recorded clean. Once a step,
  // across restarts too: what the replay found is journaled first (recheck-<step>-<height>.json,
  // records.h ServedRecheck), and a restarted node sends the kept finding, or nothing for a clean
  // one, without replaying the step again.
  Status RunServedRecheck(const CheckAssignment& c);
  // The check of `dir` is over.
  void Forget(const std::string& dir);
  // What the traces of pipeline stage steps hold of their operators' values now: 0 between jobs
  // (a move or a witness that reads them traces the step again, a stage replay, and drops them
  // once sent), so that none sits beside the node's next stage unit (AgentStats::stage_held_bytes).
  uint64_t StageValueBytes() const;

 private:
  // The disputed step as this node claims it (a cheating defender: its own update),
  // with the chain's view of the tile phase it was answered in.
  struct TraceEntry {
    TracedStep step;
    ledger::TileRuleContext ctx;
    std::string bundle;
    // A pipeline stage's step: the trace and batch in `step` are these, and a roots task is
    // ruled against this served commit (node/stage_check.h BuildStageTileTx).
    std::optional<TracedStageStep> stage;
  };
  // Phases 2-4: the move for the current query, from the traced step.
  void PostTileMove(const CheckAssignment& c);
  // The outbox action of the move answering the current query of a tile-phase dispute.
  VerifyAction TileMoveAction(const CheckAssignment& c) const;
  // The current query's move is still to send and needs the operators' values of a stage step
  // that `e` does not hold (phases 3-4): it waits for a trace job (RunTrace).
  bool WaitsForValues(const CheckAssignment& c, const TraceEntry& e) const;
  // A stage step's trace keeps its roots and drops its operators' values.
  void DropStageValues(TraceEntry* e);
  // The referee stage at one tile: the witness (RefereeTile).
  Status RunTileWitness(const CheckAssignment& c);
  // A pipeline stage's disputed step (the tile phase over the stage's plan) traced from what the
  // stage node serves, into `entry` (its trace, batch and served commit). FailedPrecondition when
  // nothing can be traced (the caller gives up); fetch errors as they come (tried again).
  // The values of its outputs are kept only with `keep_values` (TraceStageStep).
  Status TraceStage(const CheckAssignment& c, TaskContext* ctx, uint64_t step, TraceEntry* entry,
                    bool keep_values);
  // A stage's step is traced first without values (the operator phase and a roots witness read
  // only the roots); each move or witness that needs a tile's (phases 3-4, a tile witness) traces
  // the entry `key` of game step `step` again, keeping them, in a job (Play queues it), and drops
  // them once sent (DropStageValues). Nothing for a unit's step.
  Status KeepStageValues(const CheckAssignment& c, const std::string& key, uint64_t step);
  // The referee stage of a stage dispute: RefereeTile from the traced step `e` (a tile's
  // witness, its footprint's batch read from the task's data in `ctx`; or the served commit's
  // roots, which read no data), sent once under `action`.
  Status PostStageTile(const CheckAssignment& c, const TraceEntry& e, TaskContext* ctx,
                       const VerifyAction& action);
  // What a stage unit's step is judged from (node/stage_check.h): the task, its data (kept alive
  // in `*data`; none read when `data` is null), the disputed run's chain and the stage node's
  // endpoint.
  Result<StageCheckInput> StageInputOf(const CheckAssignment& c, TaskContext* ctx,
                                       std::shared_ptr<const engine::TaskData>* data);
  // The key of the disputed step's trace in traces_.
  std::string TraceKey(const CheckAssignment& c, uint64_t step) const;
  // The key of a serving claim's evidence in serve_pieces_ (its check, step and challenger).
  std::string ServeKey(const CheckAssignment& c) const;
  // Every piece of the serving claim's evidence sent or given up: its witness job would take the
  // tick's one job and do nothing, for as long as the window lasts (tens of blocks), so it is not
  // queued. A piece the chain refuses is not done any more, and the job comes back.
  bool EvidenceServed(const CheckAssignment& c) const;
  // The outbox action of the recheck of served step `s` (its challenge, or its clean marker).
  VerifyAction RecheckAction(const CheckAssignment& c, const ServedStageStep& s) const;
  // The served step of `c` this node claimed and has not rechecked yet, or nullptr.
  const ServedStageStep* RecheckDue(const CheckAssignment& c) const;
  // The journal of the recheck of served step `s` (records.h ServedRecheck), and that record
  // when it reads back as this step's: NotFound when none, DataLoss naming the file when it is
  // not (corrupt, another step's or another commitment's).
  std::string RecheckPath(const CheckAssignment& c, const ServedStageStep& s) const;
  Result<journal::ServedRecheck> KeptRecheck(const CheckAssignment& c,
                                             const ServedStageStep& s) const;
  // Game step `step` of stage unit `c` as served on chain (ReadOnChainStageStep, kept until the
  // check is over), or nullptr when the stage did not serve it on chain.
  Result<const OnChainStageStep*> OnChainStepOf(const CheckAssignment& c, TaskContext* ctx,
                                                const StageCheckInput& in, uint64_t step);
  // Where the agreed state of the dispute can come from (node/step_witness.h).
  DisputeStart StartOf(const CheckAssignment& c) const;
  std::string JournalPath(const CheckAssignment& c) const;
  // The checkpoint this node trusts at the dispute's first step ("" = none).
  std::string TrustedCheckpoint(const CheckAssignment& c) const;
  void PostMove(const CheckAssignment& c);

  NodeContext* node_;
  VerifyOutbox* outbox_;
  // journal path -> state hashes after every step of the disputed range.
  std::map<std::string, std::vector<Hash256>> hashes_;
  // TraceKey -> the traced step.
  std::map<std::string, TraceEntry> traces_;
  // ServeKey -> the number of pieces of that claim's evidence, known once built.
  std::map<std::string, uint32_t> serve_pieces_;
  // The check's folder + "/on-chain-" + game step -> that step as served on chain.
  std::map<std::string, std::unique_ptr<const OnChainStageStep>> on_chain_;
};

// The chain's view of the tile phase for check `c` (ledger::TileContextOf on this node's copy of
// the task and its bundle, `*bundle` set to the text): what a mismatch's RevealVerdict or
// ChallengeUnit carries (`to_open`), and what a party answers a tile dispute with. An error when
// the task is not served by the tile phase (the dispute then plays whole steps) or, `to_open`,
// when the node's options turn it off.
Result<ledger::TileRuleContext> TileContextFor(NodeContext& node, const CheckAssignment& c,
                                               std::string* bundle, bool to_open);

// The bundle field of a mismatch `claim` on check `c` (RevealVerdict, ChallengeUnit): the task
// bundle whenever the ledger requires it (ledger::MismatchNeedsBundle: a token task with a data
// root over its pages, a classification task whose state may be over the whole step's witness
// bound, a pipeline stage over the stage witness bound, a GPT's or a sequential model's; whatever
// AgentOptions::tile_disputes says) or the tile phase serves the task (TileContextFor, to_open);
// else "" (whole steps; a stage's claim that it served nothing, ledger::UnservedStageClaim).
// An error only when the ledger requires the bundle and this node cannot send it (not fetched,
// over the field's bound): the mismatch would be refused without it.
Result<std::string> MismatchBundle(NodeContext& node, const CheckAssignment& c,
                                   const ledger::MismatchClaimField& claim);

}  // namespace meshlearn::node
