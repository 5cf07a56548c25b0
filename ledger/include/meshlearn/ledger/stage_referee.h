// The ruling of one pipeline stage's step (issue 15; docs/verification.md "Pipeline stages", "The
// dispute"): the one function that decides what a stage step replays to -- a verifier drawn for
// a stage unit, the referee service and the ledger all call JudgeStageStep -- and the witness
// with which the ledger rules a stage dispute itself (RefereeStageStepTx), no key trusted.
//
// A stage step's witness is the whole step: the task bundle (its blob id is the task's
// spec_hash: it gives the model, the cut, the optimizer and the unit's work), the stage's
// committed StageStepCommit (its StageStepLeaf must be the committed leaf of the disputed step),
// the stage's checkpoint of the step's start (it must hash to the commit's state_before), the
// tensor of every record the stage received (each must match its signed record), and the step's
// batch proven against the task's data root (a token task's pages, a classification task's
// examples). The ledger refuses a witness that does not check out, naming what, and otherwise
// runs the replay (ReplayStageStep: every record's signature against the replica's chain of
// nodes the ledger placed, RunStageStep) and rules with StageFindingLeaf.
//
//   // A party (or a referee service) with the stage node's served evidence (node/stage_check.h
//   // BuildStageStepTx does this):
//   ML_ASSIGN_OR_RETURN(StageStepWitness w,
//                       BuildStageStepWitness(bundle, ev.commit, ev.checkpoint, ev.blobs, task,
//                                             work.stream, &page_tree, nullptr, nullptr));
//   RefereeStageStepTx tx{.task_id = id, .index = unit, .witness = {EncodeStageStepWitness(w)}};
//
// Deterministic: every follower computes the same ruling from the same transaction.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/data.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::ledger {

// ---- The one ruling.

// What the task fixes about stage `replay`'s replay: the task's model, the unit's inner optimizer
// (the task's at `lr_scale`), the cut of `net`, the task's micro-batches, and `chain` (the
// replica's nodes, stage by stage).
Result<StageReplaySetup> StageReplaySetupOf(const engine::TaskSpec& task,
                                            const protocol::NetworkSpec& net, double lr_scale,
                                            std::vector<protocol::NodeId> chain);

struct StageStepCheck {
  Hash256 leaf;              // StageFindingLeaf (== the committed leaf: nothing found)
  StageReplayResult replay;  // the replay's finding (fault none when it ran clean)
  std::string message;       // what was found, for logs and receipts
};

// What stage step `commit` replays to, from `start` (the stage's state at the step's start, as its
// checkpoint file loads: StageCheckpointState, or engine::ReadCheckpoint as a verifier fetches
// it), the received tensors `blobs` (by their records' hashes), the step's `batch` and
// `dropout_seed`: a checkpoint that does not load (`start` an error) is the `start` finding, else
// ReplayStageStep; the leaf is StageFindingLeaf(committed_leaf, finding). A Status error only
// when the setup does not fit the commit. REQUIRES: StageStepLeaf(commit) == committed_leaf (a
// commit that is not the committed leaf is the caller's `unserved`).
// `after` (optional): on a clean replay, the stage's state after the step.
Result<StageStepCheck> JudgeStageStep(const StageReplaySetup& setup,
                                      const protocol::StageStepCommit& commit,
                                      Result<engine::TrainState> start,
                                      const std::map<Hash256, Bytes>& blobs,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      const Hash256& committed_leaf,
                                      engine::TrainState* after = nullptr);
// The same from the `checkpoint` file's bytes (a witness's): StageCheckpointState of them.
Result<StageStepCheck> JudgeStageStep(const StageReplaySetup& setup,
                                      const protocol::StageStepCommit& commit, ByteSpan checkpoint,
                                      const std::map<Hash256, Bytes>& blobs,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      const Hash256& committed_leaf,
                                      engine::TrainState* after = nullptr);

// ---- The ledger's witness.

// One page of a token task's train stream (engine::TokenPageTree), proven against the data root.
using StageWitnessPage = TileWitnessPage;

struct StageStepWitness {
  std::string bundle;           // the task bundle text (blob id == spec_hash)
  Bytes commit;                 // protocol::EncodeStageStepCommit of the stage's commit
  Bytes checkpoint;             // the stage's checkpoint file of the step's start
  std::vector<Bytes> received;  // commit.received[i]'s tensor (StageTensorBytes), in order
  // The step's batch: a token task's pages (engine::TokenPagesOfRows of every row, increasing),
  // or a classification task's examples (in batch order); each proven against the data root.
  std::vector<StageWitnessPage> pages;
  std::vector<StepWitnessExample> examples;
  bool operator==(const StageStepWitness&) const = default;
};
Bytes EncodeStageStepWitness(const StageStepWitness& w);
// Refuses truncated or trailing bytes and sizes over kMaxWitnessBytes (InvalidArgument, naming
// the field).
Result<StageStepWitness> DecodeStageStepWitness(ByteSpan bytes);

// The largest stage (TaskParams::stage_memory_bytes: its weights, optimizer moments and
// activations) whose step the ledger rules from a witness: half of kMaxWitnessBytes, the other
// half for the step's pages or examples and the bundle. A larger stage's dispute plays the tile
// phase, and a claim that it served nothing is answered by its evidence in pieces (stage_serve.h,
// ServeStageEvidenceTx).
inline constexpr uint64_t kMaxStageWitnessMemory = kMaxWitnessBytes / 2;

// Whether the ledger rules a dispute on stage `stage` of `p` from a witness (RefereeStageStep)
// rather than taking the genesis referee's word: a pipeline task with a data root (the batch is
// proven) whose stage fits kMaxStageWitnessMemory.
bool LedgerRulesStageStep(const TaskParams& p, uint32_t stage);

// The witness of stage step `commit` from what its node serves (node::StageStepEvidence: the
// commit, its checkpoint, the received tensors by hash) and the step's data: `pages` (a token
// task: its TokenPageTree) or `train` and `tree` (a classification task); the batch is drawn as
// the unit's (seed, stream, step). FailedPrecondition naming what is missing (a tensor not
// served, no data for the task's kind).
Result<StageStepWitness> BuildStageStepWitness(
    const std::string& bundle, const protocol::StageStepCommit& commit, const Bytes& checkpoint,
    const std::map<Hash256, Bytes>& blobs, const engine::TaskSpec& task, uint64_t stream,
    const engine::TokenPageTree* pages, const engine::ClassificationData* train,
    const engine::DataTree* tree);

// One stage unit of a replica as the ledger records it: its node and the beacon of the block that
// placed it (WorkUnit::assignee and assignment_beacon; get_task's units carry both).
struct StagePlacement {
  protocol::NodeId node;
  Hash256 beacon;
};

// The nodes that ran the run of stage `stage` of a replica placed with `beacon`, stage by stage:
// the nodes whose signatures its step records carry. `placed[s]` is stage s's unit of the replica
// as the ledger records it now. A replica is placed whole, in one block (each of its stage units
// gets that block's assignment_beacon), and placed again whole (RerunPartialReplicas, a re-run
// after a cheat), so the chain of a run is the replica's units that carry its beacon.
// FailedPrecondition naming the stage whose unit is of another placement or has no node: the run
// placed with `beacon` is no longer the replica's (it was placed again since; its units' checks
// were cleared with them), and its records are judged against no chain -- never against the
// replica's later nodes, which did not sign them.
//
// The one derivation of a stage run's chain: the ledger rules a stage dispute with it
// (RefereeStageStepTx), a verifier judges a drawn step with it (with the beacon of the check it
// was drawn for), the genesis referee and a dispute's parties build their witness with it.
Result<std::vector<protocol::NodeId>> ReplicaRunChain(std::span<const StagePlacement> placed,
                                                      uint32_t stage, const Hash256& beacon);

// How a stage ruling's messages name what it judges: "`what` (task T, unit U: replica R, stage S,
// step N)", or "...step N: `claim`)" for a named kind of claim.
std::string StageStepWhere(std::string_view what, const TaskRecord& task_record,
                           const WorkUnit& unit, uint64_t step, std::string_view claim = {});

// The ledger's ruling of the dispute on stage unit `unit` of `task_record`, from `witness`
// (RefereeStageStepTx): the leaf to rule with (DisputeGame::Rule). `committed_leaf`: the stage's
// committed leaf of step `step` (the dispute's defender output); `chain`: the replica's nodes.
// InvalidArgument naming the input that does not check out (a bundle that is not the task's, a
// commit that is not the committed leaf, a checkpoint that does not hash to state_before, a
// received tensor that does not match its signed record or is missing, a page or example not of
// the batch or not proven); the finding of the replay otherwise. A fraud proof after the fact
// (ProveFraudTx on a stage unit) judges step `step` of a final round with the same function, the
// committed leaf being the unit's recorded one; `what` names the transaction in its messages.
Result<StageStepCheck> RuleStageStepWitness(const TaskRecord& task_record, const WorkUnit& unit,
                                            uint64_t step, const Hash256& committed_leaf,
                                            const std::vector<protocol::NodeId>& chain,
                                            const StageStepWitness& witness,
                                            std::string_view what = "referee stage step");

// ---- A stage step's received inputs in its tile plan (engine::PlanStageStepTiles).
//
// A stage step's tile plan has an input operator for every tensor the stage received
// ("[mb<m>.]recv.<kind>", <kind> the StageTensorKindName of its record). Its root is not the
// stage's to choose: it is the tiled root the sender signed. So where the stage's output roots
// out_1..out_k are agreed or claimed (a tile-phase game over a stage step), each received
// operator's root must be its record's `tiles`, as an input-state operator's roots must hash to
// the agreed state hash.

// The received record of plan operator `op` in `commit.received`: the one of its kind and
// micro-batch addressed to the commit's stage. nullptr when `op` is not a received operator or
// the commit lists no such record.
const protocol::StageTransfer* StageInputRecord(const engine::TilePlan& plan, int64_t op,
                                                const protocol::StageStepCommit& commit);

// Whether `record`'s tiled root is of its tensor in `op`'s grid (engine::StageTensorGrid of its
// size and tile_cols): the tiles the stage plan reads it in, whatever the model (a GPT's rows of
// n_embd, a sequential model's samples).
bool TiledAsOperator(const protocol::StageTransfer& record, const engine::TileOp& op);

// Every received operator j < outputs.size() has outputs[j] == its record's tiles, tiled as the
// operator (TiledAsOperator). InvalidArgument naming the first operator that is not (no record,
// another grid, another root).
Status CheckStageInputRoots(const engine::TilePlan& plan, const protocol::StageStepCommit& commit,
                            std::span<const Hash256> outputs);

// ---- A stage step's tile phase on chain (issue 16; docs/verification.md "Pipeline stages", "The
// dispute").
//
// A GPT stage's mismatch that carries the task bundle opens its (one-step) dispute with the tile
// phase over the stage's plan (TileContextOf: PlanStageStepTiles of the task's cut). The game's
// C_0 is its agreed start (the previous step's leaf); the operators' roots are tied to what the
// stage committed by the roots rulings below, so a lie anywhere ends at a tile (RuleTile, the
// unit's rule unchanged) or at one of them:
//   kRootsChainEnd  both parties agreed on C_n: the witness carries the committed commit and the
//                   n roots; the stage's commit is right exactly when it follows from them
//                   (StageCommitFollowsFromRoots): the defender (the stage) wins, else the
//                   challenger;
//   kRootsOperator  an input operator: of the stage's state ("in.<name>"), whose correct root is
//                   the tensor's in the commit's state_before (the k state roots must give it),
//                   or a received one ("recv.<kind>"), whose correct root is the tiled root its
//                   sender signed in the commit's record (CheckStageInputRoots' rule).
// A stage whose commit is not of the disputed step or is not signed by the replica's chain loses
// either ruling (it is the stage's own `unserved` or `record` fault).

// The operator of stage plan `plan` whose output is the tensor of a sent record `key`: the
// activations of micro-batch m (a GPT part's last block's "residual3"; a sequential part's last
// "layers.<i>.out"), their gradient (the first block's "residual.grad"; the first layer's
// "layers.<i>.in.grad"; a sequential part that records neither: the received tensor it passes
// on), wte (its "in.<wte>" operator), the head's wte gradient (the last micro-batch's accumulated
// "<wte>.head.grad") and the sums of squares ("grad_squares"). -1 when the plan has none.
int64_t StageSentOperator(const engine::TilePlan& plan, const protocol::StageTensorKey& key);

// The records a stage's commit must list as sent, by the plan of stage `stage` of `stages`: the
// count of each kind (one per micro-batch and neighbour, grad_total once per other stage).
size_t StageSentRecordCount(const engine::TilePlan& plan, uint32_t stage, uint32_t stages);

// Whether `commit` (of stage `stage`'s step) follows from `outputs`, all n operator roots of its
// plan traced from its start: the first k give state_before (with the state's `seed` and
// `stream`), the last k state_after, every received operator's root is its record's tiled root
// and every sent record's is its operator's, both tiled as their operators (TiledAsOperator), and
// the commit lists every record the plan sends and receives. InvalidArgument naming the first that
// does not.
Status StageCommitFollowsFromRoots(const TileRuleContext& ctx,
                                   const protocol::StageStepCommit& commit, uint64_t seed,
                                   uint64_t stream, std::span<const Hash256> outputs);

// The witness of a stage dispute's roots ruling (RefereeTile's witness on a pipeline task whose
// referee task is ruled from roots).
struct StageRootsWitness {
  Bytes commit;         // protocol::EncodeStageStepCommit of the stage's committed step
  uint64_t seed = 0;    // the stage state's seed and stream (its checkpoint holds them): the
  uint64_t stream = 0;  // state hashes commit to them beside the tensors' roots
  // kRootsChainEnd: out_1..out_n; kRootsOperator: the stage state's k roots out_1..out_k.
  std::vector<Hash256> outputs;
  bool operator==(const StageRootsWitness&) const = default;
};
Bytes EncodeStageRootsWitness(const StageRootsWitness& w);
// Refuses truncated or trailing bytes and more roots than kMaxTileOperators.
Result<StageRootsWitness> DecodeStageRootsWitness(ByteSpan bytes);

// The witness for roots task `task` from a traced run of the stage's step from its start
// (`trace`, following ctx.plan; only its roots are read), the stage's committed `commit` and its
// state's seed and stream. FailedPrecondition when the task is not ruled from roots.
Result<StageRootsWitness> BuildStageRootsWitness(const TileRuleContext& ctx,
                                                 const protocol::RefereeTask& task,
                                                 const engine::OpTrace& trace,
                                                 const protocol::StageStepCommit& commit,
                                                 uint64_t seed, uint64_t stream);

// The ledger's ruling of a stage dispute's roots task (kRootsChainEnd: the output to give
// DisputeGame::RuleChainEnd; kRootsOperator: DisputeGame::RuleOperator's), from `w`: `slot` and
// `stages` the disputed unit's, `chain` the replica's nodes (ReplicaRunChain). The commit must be
// the committed one (StageStepLeaf == task.defender_output) and the roots must chain to the
// agreed hashes and give the commit's state_before, else InvalidArgument (the witness is refused,
// nothing ruled). A commit of another step, or with a record not signed by the chain, rules
// against the stage (the challenger's output).
Result<Hash256> RuleStageRoots(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                               const Hash256& task_id, const StageSlot& slot, uint32_t stages,
                               const std::vector<protocol::NodeId>& chain,
                               const StageRootsWitness& w);

// ---- A stage unit's result (ProveResultTx on a pipeline task).
//
// A stage unit's result_hash must be the delta of the state its last step leaf commits to: the
// stage's slice of the round's start weights minus its parameters after step H-1 (what the
// Stager commits). Step replays cannot see a stage that trains honestly and commits another delta
// (adversary wrong_result); a verifier that replayed the last step clean has that state and
// compares, and proves a wrong one with this witness.

// The delta blob id that the stage state `final_state` gives (ResultBlobId): its parameters (the
// stage's part, by name) against their slice of `global`, the round's start weights of the whole
// `model` (its params() order). InvalidArgument when `global` is not the model's size or a
// parameter of the stage is not the model's.
Result<Hash256> StageResultBlobId(const engine::ModelSpec& model, std::span<const float> global,
                                  const engine::TrainState& final_state);
// The same, reading the stage's slices of the start weights (`global_size` floats) through `read`
// (offset, out): a verifier of a stage unit reads them from the state blob's chunks without the
// whole state in memory (node::GlobalWeightsReader). The overload above reads from memory.
// The delta is hashed as it is computed, a piece at a time (protocol::EncodeDeltaHeader,
// DeltaFloatBytes, ManifestBuilder: DeltaBlobId's blob, never encoded whole), so that a check
// holds no copy of the stage's parameters, of their start weights or of the delta.
using GlobalSliceReader = std::function<Status(uint64_t offset, std::span<float> out)>;
Result<Hash256> StageResultBlobId(const engine::ModelSpec& model, uint64_t global_size,
                                  const GlobalSliceReader& read,
                                  const engine::TrainState& final_state);

// The witness that a stage unit's committed result is not the delta of its committed final
// state: the task bundle (blob id == spec_hash), the round's start state blob, the stage's commit
// of its last step (its StageStepLeaf the unit's last committed leaf) and the stage's checkpoint
// file after that step (hashing to the commit's state_after). ProveResultTx's witness on a
// pipeline task.
struct StageResultWitness {
  std::string bundle;
  Bytes start_state;  // the global state blob the round started from
  Bytes commit;       // protocol::EncodeStageStepCommit of the stage's last step
  Bytes state;        // the stage's checkpoint file after its last step
  bool operator==(const StageResultWitness&) const = default;
};
Bytes EncodeStageResultWitness(const StageResultWitness& w);
// Refuses truncated or trailing bytes and sizes over kMaxWitnessBytes (InvalidArgument, naming
// the field).
Result<StageResultWitness> DecodeStageResultWitness(ByteSpan bytes);

// ---- The states between a stage's steps (the `continuity` finding).
//
// A step's replay starts from the stage's checkpoint of the step, which must hash to the commit's
// state_before; the replay cannot see where that state came from. So step t's state_before must
// also be step t-1's state_after (both committed: leaves t-1 and t of the stage's check), and step
// 0's the stage's slice of the round's start state with fresh moments (StageFromGlobal): else
// the stage moved its state between two steps and committed each step as it then trained it,
// which every step's replay passes. A verifier drawn for step t compares them (node/stage_check.h
// CheckStageContinuity); its claim is StageContinuityLeaf of the step's leaf, and the ledger
// rules it from the two commits alone (no replay), or for step 0 from the commit and the round's
// start state.

// The stage `stage` of `cut` built from the round's start weights (`global_size` floats of the
// whole model, in its PlanParams order, read through `read`), with fresh optimizer moments and
// the unit's inner rate (`lr_scale`): the stage's state at its step 0, what a Stager trains from
// and the ledger rules step 0's continuity with. InvalidArgument when `global_size` is not the
// model's parameter count.
Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       uint64_t global_size,
                                                       const GlobalSliceReader& read,
                                                       double lr_scale);

// The witness of a continuity claim on step t of a stage unit (RefereeStageStep's and
// ProveFraud's witness for such a claim; told from a StageStepWitness by its magic).
struct StageContinuityWitness {
  Bytes commit;  // protocol::EncodeStageStepCommit of the stage's step t (its committed leaf t)
  // t > 0: step t-1's commit (its committed leaf t-1); bundle and start_state empty.
  Bytes previous;
  // t == 0: the task bundle (blob id == spec_hash) and the round's start state blob; previous
  // empty.
  std::string bundle;
  Bytes start_state;
  bool operator==(const StageContinuityWitness&) const = default;
};
Bytes EncodeStageContinuityWitness(const StageContinuityWitness& w);
// Refuses another magic, truncated or trailing bytes and sizes over kMaxWitnessBytes
// (InvalidArgument, naming the field).
Result<StageContinuityWitness> DecodeStageContinuityWitness(ByteSpan bytes);
// Whether `bytes` are a StageContinuityWitness (start with its magic): how the ledger tells one
// from a StageStepWitness.
bool IsStageContinuityWitness(ByteSpan bytes);

// A stage unit's claim that step `claim.segment` does not start where the stage's previous step
// ended (its replayed_end is StageContinuityLeaf of its solver_end). As an unserved claim, its
// dispute is played over the whole step without the tile phase (whose traces all start from the
// committed state_before and agree: the roots would rule for the stage), and the claimant, who
// holds both commits, posts the witness (a stage cannot disprove it: an honest stage's commits
// make the ledger refuse the witness), so by the referee's deadline the claim unposted loses.
bool ContinuityStageClaim(const TaskParams& params, const MismatchClaimField& claim);

// The ledger's ruling of a continuity claim on step `step` of stage unit `unit` (a dispute's,
// whose defender output is `committed_leaf`, or ProveFraud's) from `w`: the commit must be the
// committed leaf of the step (unit.leaves[step + 1] and `committed_leaf`), of this task, round,
// replica, stage and step; for step > 0 `previous` the committed leaf of step - 1
// (unit.leaves[step]) and of step - 1; for step 0 the bundle the task's and the start state the
// round's. InvalidArgument naming the input that does not check out; FailedPrecondition when the
// states agree (nothing to rule: the claim is refused). Otherwise the finding: leaf
// StageContinuityLeaf(committed_leaf), its claimed the commit's state_before and replayed the state
// it had to start from.
Result<StageStepCheck> RuleStageContinuity(const TaskRecord& task_record, const WorkUnit& unit,
                                           uint64_t step, const Hash256& committed_leaf,
                                           const StageContinuityWitness& w,
                                           std::string_view what = "referee stage step");

// The witness that a stage's step t holds a received record that was never sent as committed
// (ProveFraud on a stage unit; told from the other stage witnesses by its magic), from the public
// step commits alone (docs/verification.md, "An audit of a pipeline task"):
//   - `commit`: the proven stage's commit of step t (its committed leaf t);
//   - `other` empty: the proven stage received `commit.received[record]`, and that record is not
//     signed by its sender (the replica's node of key.from_stage): the stage made it up;
//   - `other` given: the receiving stage's commit of step t (its committed leaf t), whose
//     `received[record]` the proven stage signed as its sender, while its own commit's sent
//     records do not list it: the stage sent what it did not commit.
struct StageRecordWitness {
  Bytes commit;
  uint32_t record = 0;
  Bytes other;
  bool operator==(const StageRecordWitness&) const = default;
};
Bytes EncodeStageRecordWitness(const StageRecordWitness& w);
// Refuses another magic, truncated or trailing bytes and sizes over kMaxWitnessBytes
// (InvalidArgument, naming the field).
Result<StageRecordWitness> DecodeStageRecordWitness(ByteSpan bytes);
bool IsStageRecordWitness(ByteSpan bytes);

// The ledger's ruling of a StageRecordWitness on step `step` of stage unit `unit` (ProveFraud):
// `replica` the replica's stage units by stage (null where none), `chain` its nodes
// (ReplicaRunChain). Each commit must be its stage's committed leaf of the step (of this task,
// round, replica, stage and step), else InvalidArgument; a record index out of range, or one not
// sent to (or by) the proven stage, InvalidArgument. FailedPrecondition ("nothing to prove") when
// the record is signed by its sender and (with `other`) listed among the proven stage's sent
// records. Otherwise the finding: a `record` fault of the proven stage, its leaf StageFindingLeaf
// of the committed leaf.
Result<StageStepCheck> RuleStageRecord(const TaskRecord& task_record, const WorkUnit& unit,
                                       uint64_t step, std::span<const WorkUnit* const> replica,
                                       const std::vector<protocol::NodeId>& chain,
                                       const StageRecordWitness& w,
                                       std::string_view what = "prove fraud");

}  // namespace meshlearn::ledger
