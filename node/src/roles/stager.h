// The stage role (not a public header; docs/protocol.md "Pipeline stage units", docs/node.md
// "Stage units"): runs the pipeline stage units node_work assigns. A stage trains only while its
// neighbours train theirs (activations forward, gradients back over the data plane), so it runs
// on a thread of its own: the tick starts it and goes on (verification, aggregation, heartbeats),
// and a later tick commits what it produced.
//
// One stage unit (task, index):
//
//   waiting ──every stage placed──▶ running ──H steps──▶ trained ──CommitStage──▶ committing
//   (a zero node in its chain)      (thread)   │         (delta stored, pinned)     ──ok──▶
//   committed
//                                              └─ a step failed (a silent neighbour past its
//                                                 deadline, or the unit was assigned afresh):
//                                                 logged, nothing stored or committed; started
//                                                 again from step 0 while still assigned, or from
//                                                 the failed step k when a fresh assignment
//                                                 replaced a lost neighbour (StartStageRun; its
//                                                 steps held across its runs on the old chain)
//
// A node runs one stage unit at a time: its StageHost hands "stage.push" to that unit's plane.
// A restart forgets a running unit (it is run again from the start: a stage is cheap next to
// the round, and its neighbours restart with it when their steps miss their deadlines).
//
// Thread-compatible: Pending, Start, Collect and OnOutcome run on the agent's Tick thread; only
// the RunStageUnit call runs on the unit's thread, on objects no one else touches until it ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "meshlearn/base/home_layout.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/stage_unit.h"
#include "node_context.h"

namespace meshlearn::node {

class Stager {
 public:
  // Its steps' checkpoints are files in the node's HomeLayout::StageEvidenceDir.
  explicit Stager(NodeContext* node)
      : node_(node),
        evidence_(node->env(), HomeLayout(node->options().data_dir).StageEvidenceDir()) {}
  ~Stager();  // stops a running unit (StagePlane::Cancel) and waits for its thread
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Deletes the stage evidence files an earlier process left (StageEvidence::DeleteLeftovers):
  // the node calls it when it starts.
  Status DeleteEvidenceLeftovers() { return evidence_.DeleteLeftovers(); }

  // Registers the node's data plane ("stage.push") and what it serves verifiers of its stage
  // steps ("stage.step", "stage.slice": StageEvidence) on its router (the evidence on
  // `evidence_router` when given: AgentOptions::withhold_stage_evidence).
  void Register(net::Router* router, net::Router* evidence_router = nullptr) {
    host_.Register(router);
    evidence_.Register(evidence_router != nullptr ? evidence_router : router);
  }

  // The stage units of `work` to start: not running, not committing, not committed.
  std::vector<const UnitAssignment*> Pending(const NodeWork& work) const;
  bool running() const { return run_ != nullptr; }
  // The running unit's thread has ended: its outcome waits for the next Collect.
  bool run_ended() const { return run_ && run_->done.load(std::memory_order_acquire); }
  // Stops the running unit (StagePlane::Cancel: the step it is in fails and changes no weight),
  // logging `why`, for a dispute move that can no longer wait for it to end
  // (NodeAgent::WaitsForStageUnit): its stage is not kept for a resume, so that once the run
  // ended the move's replay holds no more than the node offers; the unit runs again, from step 0,
  // while it stays assigned (its neighbours' steps fail and run again with it). Nothing when no
  // unit runs or it is stopped already.
  void StopForReplay(const std::string& why);

  // Starts `a` on its own thread and returns (Ok with nothing started while a stage of its chain
  // waits for a node). REQUIRES: a.stage, !running().
  Status Start(const UnitAssignment& a);

  // A finished unit: stored and committed (CommitStage; on a verifying chain with its step
  // leaves and the node's next secret, `work`'s next_secret_index), or, when a step failed,
  // logged and dropped. Nothing when none finished.
  Status Collect(const NodeWork& work);
  bool OnOutcome(const TxOutcome& o);

  // Rounds [0, finalized) of `task` are final (UINT32_MAX: the task is released): the evidence
  // of their steps is no longer served, and its checkpoint files are deleted; nor are the
  // neighbours' checkpoints the node keeps of them (StageHost::WithdrawKeptBefore). With `held`
  // (node_work's stage_units: the units the ledger counts against the node's disk), the same of
  // every step of `task` whose unit is not in it: a run the node never committed whose unit
  // expired or was placed on another node, or one whose commit a re-run reset -- no check,
  // dispute or resume reads them (docs/node.md, "Stage tensors live in files"). A held run of such
  // a unit goes too.
  void ReleaseEvidence(const Hash256& task, uint32_t finalized,
                       const std::vector<HeldStageUnit>* held = nullptr);
  const StageEvidence& evidence() const { return evidence_; }

 private:
  struct Run {
    UnitAssignment a;
    TaskContext* ctx = nullptr;
    std::unique_ptr<engine::Stage> stage;
    std::unique_ptr<StagePlane> plane;
    std::unique_ptr<StageHost::Attachment> attached;
    std::vector<engine::Batch> batches;
    uint64_t dropout_seed = 0;
    // The steps done (RunStageUnit's progress): a failed run's are kept (held_) for a resume.
    StageRunProgress progress;
    bool ask = true;    // reads its neighbours' offers (StartStageRun): the assignment's 1st run
    bool kept = false;  // resumes a run of the chain before (held_), as a kept stage
    uint64_t from = 0;  // the step it trained from (StartStageRun's)
    Result<StageUnitOutcome> out = Unavailable("not run");
    bool whole = false;   // RunStageUnit ended whole (whether or not Collect commits it)
    uint64_t run_us = 0;  // RunStageUnit's wall time
    std::atomic<bool> done{false};
    bool cancelled = false;           // Cancel sent to its plane (tick thread only)
    bool stopped_for_replay = false;  // StopForReplay: its stage is not held for a resume
    std::thread thread;
  };
  using Key = std::tuple<Hash256, uint32_t, Hash256>;
  static Key KeyOf(const UnitAssignment& a);
  static std::string Name(const UnitAssignment& a);
  Status Commit(const Run& run, const NodeWork& work);
  // On a verifying chain, before CommitStage: when the secret `tx` binds draws the unit for a
  // forced error (docs/verification.md, "Forced errors for stage units"), rewrites `commits` (the
  // unit's real step commits) and `tx`'s leaves and commitment to their forced form
  // (protocol::ForceStageStepStates), serves those commits in place of the real ones (its real
  // checkpoints stay) and keeps them for the Solver's RevealSecret (ForcedStageCommitsPath).
  // Nothing otherwise.
  Status ForceIfDrawn(const UnitAssignment& a, std::vector<protocol::StageStepCommit>& commits,
                      ledger::CommitStageTx& tx);
  // Remembers the links `plane` measured (MeasuredLinks of the run's chain) and, when it measured
  // any, reports every link remembered (ReportLinksTx replaces the node's earlier report): so a
  // peer measured in an earlier unit stays reported. One report in flight at a time; a run that
  // finds one in flight is reported with the next.
  void ReportLinks(const StagePlaneStats& plane, const UnitAssignment& a);

  NodeContext* node_;
  StageHost host_;
  // Every step the node trained, served until its round is final (a verifier replays it from
  // there; the check of a stage unit settles before its round is final): ReleaseEvidence.
  StageEvidence evidence_;
  uint64_t confirmed_secret_index_ = 0;  // of the last CommitStage the ledger took
  std::unique_ptr<Run> run_;
  // A failed run's stage and steps (its stage at the failed step's start), kept while the unit is
  // assigned to this node: when its next assignment's chain replaced another stage's node, the
  // run resumes from them (StartStageRun) rather than from the round's start. One at a time (a
  // node runs one stage unit at a time): the stage it would build again anyway. Its stage is in
  // memory until the next run starts; a run that does not resume from it frees it (the held
  // stage is then the failed step's checkpoint in the evidence, and progress.start empty) and
  // keeps the steps, unless it is another assignment of the same unit (which trains it from the
  // round's start). So a kept stage whose step deadline fires on the old chain, before the ledger
  // replaces its lost neighbour, still resumes at the step it failed in: its runs again on the
  // old chain train nothing and hold nothing, and leave it held. Dropped when a run of its unit
  // trains a step (that run's evidence replaces its steps') or ends whole, when the unit is no
  // longer the node's (DropHeld), or when its round is final (ReleaseEvidence).
  struct Held {
    UnitAssignment a;
    std::unique_ptr<engine::Stage> stage;  // null: freed (LoadHeldStage)
    StageRunProgress progress;
  };
  std::optional<Held> held_;
  // Whether `held` resumes on assignment `a`: the same unit and round start, on a chain that
  // replaced exactly one other stage's node.
  static bool ResumesOn(const Held& held, const UnitAssignment& a);
  // A kept run from a held run whose stage was freed: sets `run`'s progress.start to its stage
  // (built from the round's start) and restores the stage from its evidence's checkpoint of step
  // k (StageEvidence::PendingCheckpointState, k = its steps), which must be the state its step
  // k-1 ended in (state_after): NotFound or DataLoss otherwise, the stage unchanged.
  Status LoadHeldStage(Run& run);
  // Drops the held run and the tensors it sent (StageEvidence::DropSent): its unit is no longer
  // the node's, so no neighbour resumes from them.
  void DropHeld();
  // Assignments a run was started for: a resume is tried on the first run of each only.
  std::set<Key> started_;
  // (task, unit index, assignment beacon) -> the CommitStage in flight. The beacon tells one
  // assignment of a unit from the next (a round re-run after a stage was caught cheating places
  // the same unit again, to be trained again).
  struct InFlight {
    Hash256 txid;
    uint64_t secret_index = 0;  // 0 without verification
  };
  std::map<Key, InFlight> commits_;
  std::set<Key> committed_;
  // The last measured link to each peer and the run that measured it (the count of runs that
  // measured any): beyond protocol::kMaxNodeLinks peers, the least recently measured are dropped.
  std::map<PublicKey, std::pair<uint64_t, ledger::NodeLink>> links_;
  uint64_t link_runs_ = 0;
};

}  // namespace meshlearn::node
