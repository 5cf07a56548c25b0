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
//
// The replay starts from a state this node trusts at the range's start: its own checkpoint as
// the defender, the solver's checkpoint its verdict or challenge started from as the challenger,
// else the unit's start. A restart reads the range's hashes back from the journal.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/node/step_witness.h"
#include "node_context.h"
#include "verify_job.h"
#include "verify_outbox.h"

namespace meshlearn::node {

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
  // The disputed step of a tile dispute replayed with its trace; then the query's move.
  Status RunTrace(const CheckAssignment& c);
  // The check of `dir` is over.
  void Forget(const std::string& dir);

 private:
  // Phases 2-4: the move for the current query, from the traced step.
  void PostTileMove(const CheckAssignment& c);
  // The referee stage at one tile: the witness (RefereeTile).
  Status RunTileWitness(const CheckAssignment& c);
  // The key of the disputed step's trace in traces_.
  std::string TraceKey(const CheckAssignment& c, uint64_t step) const;
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
  // TraceKey -> the disputed step as this node claims it (a cheating defender: its own update),
  // with the chain's view of the tile phase it was answered in.
  struct TraceEntry {
    TracedStep step;
    ledger::TileRuleContext ctx;
    std::string bundle;
  };
  std::map<std::string, TraceEntry> traces_;
};

// The chain's view of the tile phase for check `c` (ledger::TileContextOf on this node's copy of
// the task and its bundle, `*bundle` set to the text): what a mismatch's RevealVerdict or
// ChallengeUnit carries (`to_open`), and what a party answers a tile dispute with. An error when
// the task is not served by the tile phase (the dispute then plays whole steps) or, `to_open`,
// when the node's options turn it off.
Result<ledger::TileRuleContext> TileContextFor(NodeContext& node, const CheckAssignment& c,
                                               std::string* bundle, bool to_open);

// The bundle field of a mismatch on check `c` (RevealVerdict, ChallengeUnit): the task bundle
// whenever the ledger requires it (ledger::DisputeNeedsBundle: a token task with a data root over
// its pages, whatever AgentOptions::tile_disputes says) or the tile phase serves the task
// (TileContextFor, to_open); else "" (whole steps; a stage unit's step). An error only when the
// ledger requires the bundle and this node cannot send it (not fetched, over the field's bound):
// the mismatch would be refused without it.
Result<std::string> MismatchBundle(NodeContext& node, const CheckAssignment& c);

}  // namespace meshlearn::node
