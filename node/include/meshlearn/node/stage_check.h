// One step of a stage unit checked on a verifying chain (issue 15; docs/verification.md,
// "Pipeline stages"): what a verifier drawn for the stage unit and the genesis referee ruling its
// dispute both run, so that both derive the same value from the same evidence.
//
// The stage's step is replayed alone from what its node serves (stage_evidence.h: the step's
// commit, its checkpoint of the step's start, the tensors it received), on the step's batch of
// the replica's work (protocol::UnitWorkOf of (round, replica), as the Stager trains it), with
// ledger::JudgeStageStep -- the function the ledger rules a stage dispute with
// (RefereeStageStepTx), so the verifier, the referee service and the ledger derive one value.
// The result is StageFindingLeaf: the committed step leaf when the replay finds
// nothing, another hash naming the finding otherwise. A node that serves no evidence for the step
// (NotFound), or a commit whose StageStepLeaf is not the committed leaf, is the finding
// `unserved` (StageUnservedLeaf): a stage must show what it committed. Any other fetch error is
// returned (retried later): a verifier never claims a mismatch for a network fault.
//
// Only the stage is built (ReplayStageStep creates it from the step's checkpoint), never the
// whole model: the step's batch is drawn from the task's data (engine::DataStream, as the Stager
// draws it), and no weight of the round's start state is read. The checkpoint is loaded as it is
// fetched (FetchStageCheckpointState): a check holds the stage's state once, never its file's
// bytes beside it (docs/submitters.md, "A stage node's memory").
//
//   StageCheckInput in{.task = &ctx->task, .data = data.get(), .net = &net, .facts = &facts,
//                      .task_id = id, .round = r, .replica = rep, .stage = s, .chain = chain,
//                      .transport = transport, .endpoint = url};
//   ML_ASSIGN_OR_RETURN(StageStepCheck c, CheckStageStep(in, step, committed_leaf));
//   if (c.leaf != committed_leaf) ...   // a mismatch: c.message says what
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/stage_replay.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"

namespace meshlearn::node {

// A stage step's evidence as the stage served it on chain (ServeStageEvidence pieces, ledger/
// stage_serve.h), put back together (ReadOnChainStageStep): what every party checks and traces
// the step from once the stage answered a claim that it served nothing, whatever its node serves
// over the data plane since.
struct OnChainStageStep {
  uint64_t step = 0;                 // the stage's step (the game's step + 1)
  protocol::StageStepCommit commit;  // the committed commit
  std::map<Hash256, Bytes> blobs;    // the received tensors, by their records' hashes
  Bytes checkpoint;                  // the step's start state (StageCheckpointBytes)
};

struct StageCheckInput {
  const engine::TaskSpec* task = nullptr;  // the task's (TaskContext::task)
  const engine::TaskData* data = nullptr;  // its data (TaskContext::Data): the step's batch
  const NetworkSpec* net = nullptr;
  const TaskFacts* facts = nullptr;
  protocol::TaskId task_id;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  std::vector<protocol::NodeId> chain;  // the replica's nodes, stage by stage
  net::Transport* transport = nullptr;
  std::string endpoint;  // the stage node's
  // Steps' batches drawn beforehand (StageStepBatch), by step: a step found here is not drawn
  // from `data`, which may then be null (a verifier drops the task's data before it replays).
  const std::map<uint64_t, engine::Batch>* batches = nullptr;
  // The step's evidence served on chain: for its step, the commit, the received tensors and the
  // start state come from it, not from the stage node at `endpoint`.
  const OnChainStageStep* on_chain = nullptr;
};

// Step `step`'s batch of the replica's stream: a pure function of (seed, stream, step) and the
// data, the batch the Stager trained the step on (engine::DataStream). REQUIRES: in.data.
engine::Batch StageStepBatch(const StageCheckInput& in, uint64_t step);

// The leaf, the replay's finding and a message (ledger/stage_referee.h: the ledger rules a stage
// dispute with the same JudgeStageStep).
using ledger::StageStepCheck;

// Where a step that replayed clean ended: its commit as served and the stage's state after it (a
// stage unit's result check starts from its last step's: StageResultBlobId).
struct StageStepEnd {
  protocol::StageStepCommit commit;
  engine::TrainState state;
};

// `end` (optional): set when the step replays to its committed leaf.
Result<StageStepCheck> CheckStageStep(const StageCheckInput& in, uint64_t step,
                                      const Hash256& committed_leaf, StageStepEnd* end = nullptr);

// The ledger's ruling of a stage dispute (RefereeStageStepTx; anyone posts it): the witness of
// stage step `step` built from what the stage node at in.endpoint serves (its commit, which must
// be `committed_leaf`'s, its checkpoint of the step's start, the tensors it received) and the
// step's batch proven in the task's data: `pages` for a token task (built on first use), else
// `tree` over the task's examples (built on first use). `bundle` is the task bundle's text.
// The size is the caller's to report (witness.bytes). FailedPrecondition when the node does not
// serve the committed step (no witness can be built) or a tensor of it; fetch errors as they come.
Result<ledger::RefereeStageStepTx> BuildStageStepTx(const StageCheckInput& in,
                                                    const std::string& bundle, uint32_t index,
                                                    uint64_t step, const Hash256& committed_leaf,
                                                    std::unique_ptr<engine::TokenPageTree>* pages,
                                                    std::unique_ptr<engine::DataTree>* tree);

// The answer to a claim that a stage over the witness bound served nothing for step `step`
// (ledger/stage_serve.h): every piece of the step's evidence, as ServeStageEvidence transactions,
// built from what the stage node at in.endpoint serves (its commit, which must be
// `committed_leaf`'s, its checkpoint of the step's start, the tensors it received). `ctx` is the
// stage's plan (ledger::TileContextOf of `bundle`, the task bundle's text). FailedPrecondition
// when the node does not serve the committed step or a tensor of it; fetch errors as they come.
Result<std::vector<ledger::ServeStageEvidenceTx>> BuildStageServeTxs(
    const StageCheckInput& in, const ledger::TileRuleContext& ctx, const std::string& bundle,
    uint32_t index, uint64_t step, const Hash256& committed_leaf);

// Every piece of the evidence of the stage step whose committed leaf is `committed_leaf`, served
// on chain for stage unit `index` of task `task` (ServeStageEvidence transactions that executed
// ok, pieces[p] piece p), read from blocks `to_height` down to `from_height` (get_block_txs, a
// page at a time; the newest first, as the ruling's block holds the last piece) in `ctx`'s plan.
// Pieces of another unit, task or step, or refused by the ledger are skipped. NotFound naming
// the pieces not in those blocks; chain errors as they come.
Result<std::vector<ledger::StageServePiece>> ReadServedStagePieces(
    ChainClient& chain, const ledger::TileRuleContext& ctx, const protocol::TaskId& task,
    uint32_t index, const Hash256& committed_leaf, uint64_t from_height, uint64_t to_height);

// Stage step `step` put back together from its pieces on chain (ledger::AssembleStageServeEvidence)
// into `shapes`, a training state of the stage's shapes (the stage built from the round's start
// weights: every value comes from the pieces). InvalidArgument when they do not assemble or are
// of another step.
Result<OnChainStageStep> AssembleOnChainStageStep(const ledger::TileRuleContext& ctx,
                                                  std::span<const ledger::StageServePiece> pieces,
                                                  uint64_t step, engine::TrainState& shapes);

// ---- The states between a stage's steps (ledger/stage_referee.h, RuleStageContinuity).
//
// A step's replay starts from its checkpoint, which must hash to the commit's state_before; where
// that state came from is checked here: step t > 0 must start from step t-1's committed
// state_after (its served commit, beside step t's), step 0 from the stage's slice of the round's
// start state with fresh moments (StageStartSliceHash). A difference is the finding `continuity`
// (ledger::StageContinuityLeaf): a stage that moves its weights between two steps and commits
// each step as it then trains it replays clean at every step.

// StateHash of the stage's state at step 0, as the Stager builds it (StageFromGlobal of the round's
// start weights read through `global`, with the unit's inner rate) and the ledger derives it.
Result<Hash256> StageStartSliceHash(const StageCheckInput& in, const GlobalWeightsReader& global);

// Whether step `step` starts where the stage's previous step ended. `leaves`: the check's
// (protocol::StageCheckLeaves: the commitment, then one leaf per step), against which both served
// commits are checked; `start_slice`: StageStartSliceHash (read only for step 0). The finding is
// on step `replay.step`: `step`, with the leaf leaves[step + 1] when the states agree,
// StageContinuityLeaf of it when they differ, StageUnservedLeaf of it when the step's own commit
// is not served or not its leaf; or `step` - 1, with StageUnservedLeaf(leaves[step]), when the
// previous step's commit is not served or not its leaf (a stage that withholds it would escape
// the check otherwise: the claim is on that step, which the ledger rules as any unserved step).
// Fetch errors other than NotFound are returned (retried later).
Result<StageStepCheck> CheckStageContinuity(const StageCheckInput& in, uint64_t step,
                                            std::span<const Hash256> leaves,
                                            const Hash256& start_slice);

// The witness of a continuity claim on step `step`, whose committed leaf is `committed_leaf`,
// from what the stage node serves: its commit of the step and (step > 0) of the step before, or
// (step 0) `bundle` and the round's start state blob `start_state` (read through `global`, for
// StageStartSliceHash). FailedPrecondition when the node does not serve a commit, the served
// commit is not the committed leaf, or the states agree (the ledger would refuse the witness).
Result<ledger::StageContinuityWitness> BuildStageContinuityWitness(
    const StageCheckInput& in, uint64_t step, const Hash256& committed_leaf,
    const std::string& bundle, const Bytes& start_state, const GlobalWeightsReader* global);

// ---- A stage dispute's tile phase (issue 16; ledger/stage_referee.h, "A stage step's tile phase
// on chain").
//
// A GPT stage's mismatch that carries the task bundle plays the operator and tile phases over the
// stage's plan (ledger::TileContextOf: PlanStageStepTiles). Every party -- the stage node
// defending, the verifier challenging, a referee service -- answers from the same traced replay
// of the disputed step, from what the stage node serves (its commit, its checkpoint of the step's
// start, the tensors it received): the inputs CheckStageStep judges the step from.

// The disputed stage step replayed with its operator trace (every operator of the stage's plan;
// a sent tensor that differs from its record is a finding and the step runs on).
struct TracedStageStep {
  protocol::StageStepCommit commit;  // as the stage node serves it
  std::shared_ptr<engine::OpTrace> trace;
  engine::Batch batch;
  uint64_t seed = 0;    // the stage state's seed and stream, as its checkpoint holds them (a roots
  uint64_t stream = 0;  // witness carries them: the state hashes commit to them)
};

// Stage step `step` traced from what the stage node at in.endpoint serves. FailedPrecondition
// when it serves no evidence for the step or its checkpoint does not load (nothing to trace);
// fetch errors as they come. The trace keeps every operator's output values only with
// `keep_values`: a tile's moves (phases 3-4) and witness read them, while the operator phase and
// a roots witness read only the roots, and the values of a stage step hold its state several
// times over (parameters, gradients and both moments before and after: a node offering 100 MB to
// a 10M GPT stage peaked at 350-400 MB with them).
Result<TracedStageStep> TraceStageStep(const StageCheckInput& in, uint64_t step, bool keep_values);

// The RefereeTile that rules referee task `task` of the dispute on stage unit `index` of task
// `task_id`, from `traced`: a tile's footprint witness (ledger::BuildTileWitness; the batch's
// token pages or examples proven in `data`, their tree built in `*pages` or `*tree` on first use),
// or, for a roots task, a ledger::StageRootsWitness of the served commit, which must be the
// committed one (task.defender_output; else FailedPrecondition: the ledger would refuse it).
// `bundle` is the task bundle's text. FailedPrecondition also for a witness over
// ledger::kMaxTileWitnessBytes.
Result<ledger::RefereeTileTx> BuildStageTileTx(
    const ledger::TileRuleContext& ctx, const protocol::RefereeTask& task,
    const TracedStageStep& traced, const engine::TaskData& data, const protocol::TaskId& task_id,
    uint32_t index, const std::string& bundle, std::unique_ptr<engine::TokenPageTree>* pages,
    std::unique_ptr<engine::DataTree>* tree);

// The nodes that ran the run of stage unit `index` placed with `beacon`, stage by stage, from
// get_task's units: ledger::ReplicaRunChain, the derivation the ledger rules a stage dispute
// with. A verifier passes the beacon of the check it was drawn for (CheckAssignment::
// assignment_beacon), a dispute's parties the unit's own. FailedPrecondition when the replica was
// placed again since that run (its check is withdrawn: nothing of it is judged). REQUIRES:
// stages > 1.
Result<std::vector<protocol::NodeId>> ReplicaRunChain(const std::vector<UnitRecord>& units,
                                                      uint32_t stages, uint32_t index,
                                                      const Hash256& beacon);
// The same with the unit's own beacon as get_task lists it (a unit in dispute: its run is the
// replica's current one).
Result<std::vector<protocol::NodeId>> ReplicaRunChain(const std::vector<UnitRecord>& units,
                                                      uint32_t stages, uint32_t index);

}  // namespace meshlearn::node
