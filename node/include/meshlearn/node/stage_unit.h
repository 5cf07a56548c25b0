// A pipeline task's stage unit on a node (issue 15; docs/protocol.md "Pipeline stage units"): what
// a node placed on stage s of replica r in round n runs and commits, the ledger terms of a
// pipeline task, and how the aggregator turns a replica's S stage deltas back into one unit's
// delta.
//
// The ledger places (round, replica, stage) units on nodes (PlaceStages) and records the chain
// of each replica as its units' assignees. A stage node then
//   1. builds its stage from the round's global weights (StageFromGlobal: the unit's inner rate,
//      protocol::UnitWorkOf of (round, replica), as for a whole unit),
//   2. runs the unit's H steps against its neighbours over the data plane (RunStageUnit: one
//      StagePlane per stage unit, attached to the node's StageHost, which serves "stage.push"),
//   3. commits CommitStage with the stage's delta blob id and its StageCommitment.
// The aggregator combines the replicas stage by stage (ApplyStageRound: ApplyRound on each
// stage's slice, for the coordinate-wise rules), or gathers each replica's stage deltas in model
// order (GatherStageFlats) -- the replica's delta is then exactly the unsplit unit's
// pseudo-gradient (elementwise global - local) -- and calls ApplyRound (network_round.h). Either
// way the round is ApplyRound's, the one derivation `meshlearn diloco` uses.
//
//   ledger::TaskParams p = MakeTaskParams(facts, net, initial);
//   ML_RETURN_IF_ERROR(AddPipelineTerms(trainer->task(), net, &p));      // stages, needs
//   ...
//   StageHost host;  host.Register(&router);                             // once per node
//   ML_ASSIGN_OR_RETURN(auto stage, StageFromGlobal(task, cut, s, state.weights, lr_scale));
//   StagePlane plane(ctx, s, key, &transport);
//   StageHost::Attachment a = host.Attach(&plane);
//   plane.SetChain(chain, endpoints);
//   ML_ASSIGN_OR_RETURN(StageUnitOutcome out, RunStageUnit(*stage, plane, batches, seed));
//
// Thread-safety: StageHost is thread-safe; the rest are pure or use their arguments only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/stage_plane.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::node {

// ---- Weights between a whole model and its stages (by parameter name).

// Sets `stage`'s parameters to `whole`'s of the same names. REQUIRES: the stage is a part of
// whole's model.
void CopyWholeParams(const engine::Model& whole, engine::Stage& stage);
// The stage's parameters, flat, in its params() order.
std::vector<float> StageFlatParams(engine::Stage& stage);
// Where each stage's parameters sit in the whole model's flat vector (its params() order: the
// layout of weights and deltas on the wire), from the spec alone: engine::PlanParams of the model
// and of each stage's part, so nothing is allocated. An aggregator needs only this of the stages
// (building them would hold their weights and optimizer moments: a second whole model).
struct StageLayout {
  struct Range {
    size_t offset = 0;  // floats before the parameter in the whole flat vector
    size_t size = 0;
  };
  std::vector<std::vector<Range>> stages;  // stage s's parameters, in its params() order
  size_t whole_size = 0;                   // the model's parameter count
  // The floats of stage s's flat vector (its delta's size).
  size_t StageSize(size_t s) const;
};
// The layout of `cut`'s stages of the model `spec`. InvalidArgument when a parameter of the model
// is in no stage or in two. Errors: PlanParams'.
Result<StageLayout> StageLayoutOf(const engine::ModelSpec& spec, const engine::PipelineCut& cut);
// The same for built stages: `stages[s]` is stage s, each a part of one model's spec.
Result<StageLayout> StageLayoutOf(std::span<const std::unique_ptr<engine::Stage>> stages);

// The whole model's flat vector (its params() order) from per-stage flat vectors, `flats[s]` laid
// out as `layout`'s stage s. InvalidArgument when the sizes do not match the layout.
Result<std::vector<float>> GatherStageFlats(const StageLayout& layout,
                                            std::span<const std::vector<float>> flats);
// The stages' own parameters gathered in whole's order. REQUIRES: they cover the whole model.
std::vector<float> GatherStageParams(std::span<const std::unique_ptr<engine::Stage>> stages);

// ---- Aggregation, stage by stage.

// Round `round`'s aggregation stage by stage: stage s's values of `state` (its parameters'
// weights and outer momentum) take ApplyRound (network_round.h) over the replicas' stage-s deltas,
// `deltas[i][s]` the stage-s delta of the replica with shard `shards[i]`, laid out as `layout`'s
// stage s. A replica with a non-finite value in any stage is left out of every stage, as
// ApplyRound leaves out a non-finite whole delta. For a coordinate-wise rule (mean, trimmed_mean,
// median) this is ApplyRound over the replicas' gathered whole deltas, bit for bit, and so
// `meshlearn diloco`'s round; so it is applied `chunk_values` values of a parameter at a time
// (kStageRoundChunk; tests cut finer), and beyond `state` and the deltas the aggregator holds a
// few chunks, not copies of the model (the rule's accumulator is in doubles). The rules with norms
// or distances over the whole delta (centered_clip, krum) are refused (InvalidArgument naming the
// rule): gather the whole deltas (GatherStageFlats) and call ApplyRound for those. Every argument
// is checked before `state` changes; an error of ApplyRound itself (after the checks) leaves
// `state` with the earlier chunks applied.
inline constexpr size_t kStageRoundChunk = size_t{1} << 16;
Status ApplyStageRound(GlobalState* state, const StageLayout& layout,
                       std::span<const uint32_t> shards,
                       std::span<const std::vector<std::vector<float>>> deltas,
                       const NetworkSpec& net, const Hash256& content_id, uint32_t round,
                       uint64_t samples_per_unit, size_t chunk_values = kStageRoundChunk);

// ---- The ledger's terms of a pipeline task.

// A pipeline task's terms, for the cut engine::TaskPipelineCut chooses or checks: per stage its
// memory (engine::CutCosts total bytes, rounded up, plus the step's tensors its node's plane
// holds until their evidence files are written: step_tensor_bytes) and training FLOPs of one
// step, and per boundary the bytes a step moves across it (engine::CutBoundaryBytes). The one
// derivation of TaskFacts' (ComputeTaskFacts) and so of the ledger's (MakeTaskParams) and of what a
// node compares them with (CheckBundleMatchesLedger). And what the round's aggregator holds of the
// whole model: it trains none of it, it evaluates each round's state with the weights alone
// (engine::EstimateEvaluationMemory's total, rounded up; TaskParams::eval_memory_bytes, which
// protocol::AggregatorMemoryBytes counts in place of a whole unit's training need).
struct StageTerms {
  std::vector<uint64_t> memory_bytes;  // per stage, step_tensor_bytes included
  // Per stage: the bytes of the tensors it receives and sends in one step (the boundaries on
  // either side; a GPT's tied weight and head gradient on stages 0 and S-1), which its node's
  // plane holds for one step before StageEvidence writes them to files (docs/node.md).
  std::vector<uint64_t> step_tensor_bytes;
  std::vector<uint64_t> flops;           // per stage
  std::vector<uint64_t> boundary_bytes;  // per boundary s|s+1
  uint64_t eval_memory_bytes = 0;        // the aggregator's engine::Evaluator
};
// For net.stages > 1; empty lists and eval_memory_bytes 0 for one stage. Errors are TaskPipelineCut's (naming
// network.stages or network.cut) and the cut's costs'.
Result<StageTerms> StageTermsOf(const engine::TaskSpec& task, const NetworkSpec& net);

// StageTermsOf into params' stage_memory_bytes, stage_flops, stage_boundary_bytes and
// eval_memory_bytes
// (MakeTaskParams already set stages and units_per_round = replicas x stages, and the lists when
// the cut could be made): what `task submit` calls so that a cut that cannot be made is named to
// the submitter. Nothing changes for S = 1.
Status AddPipelineTerms(const engine::TaskSpec& task, const NetworkSpec& net,
                        ledger::TaskParams* params);

// The memory a node needs to train one whole (unsplit) unit of `task`: the same formula as a
// stage's (engine::CutCosts total bytes, rounded up) for the whole model as one stage, at the
// task's batch size, seq_len and micro_batches -- weights and their gradients, optimizer moments
// (2 per weight for AdamW, 1 for SGD with momentum) and the activations of a step. TaskFacts::
// memory_bytes, hence TaskParams::memory_bytes (MakeTaskParams): the one number the scheduler
// places whole units by and a node refuses them by. REQUIRES: the task's model is complete (a
// GPT's vocabulary from its data). Errors: the model spec's own.
Result<uint64_t> UnitMemoryBytes(const engine::TaskSpec& task);

// ---- A stage unit.

// Stage `stage` of `cut` trained from `global` (the round's global weights: the whole model's
// flat vector, GlobalState::weights) at the unit's inner-rate factor `lr_scale`. Only the stage
// is built: each of its parameters is copied from its slice of `global` (engine::PlanParams), and
// the whole model is never allocated, so a stage node holds its stage and not the model. The
// values are those the whole model's parameters of the same names would hold. InvalidArgument
// when `global` does not have the model's parameter count (naming both).
Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       std::span<const float> global,
                                                       double lr_scale);
// The same from weights read in parts (state_blob.h: BlobWeightsReader reads them from the state
// blob's chunks, so a stage node never holds the whole global state); `global.size` is checked
// as the span's size is.
Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       const GlobalWeightsReader& global,
                                                       double lr_scale);

struct StageUnitOutcome {
  std::vector<float> delta;     // the stage's pseudo-gradient: start - end, params() order
  Hash256 result_hash;          // ledger::DeltaBlobId(delta): CommitStage's result_hash
  std::vector<Hash256> leaves;  // StageStepLeaf of every step
  Hash256 commitment;           // protocol::StageCommitment(leaves)
  float mean_loss = 0;          // the last stage: the mean of its steps' losses; else 0
  std::vector<protocol::StageStepCommit> commits;  // every step's, for the stage's evidence
};

// The stage unit a step commits blob is checked against: what its CommitStage and the task say.
struct StageCommitsOf {
  Hash256 task_id;
  uint32_t round = 0;
  uint32_t replica = 0;
  uint32_t stage = 0;
  uint32_t stages = 0;       // the task's stages
  uint64_t inner_steps = 0;  // the task's H
  Hash256 commitment;        // the unit's committed StageCommitment
};
// A stage unit's step commits blob (CommitStage's `commits`: protocol::EncodeStageStepCommits of
// its steps' commits), decoded and checked against `unit`: one commit per inner step, each of
// its task, round, replica and stage, and their leaves' StageCommitment its commitment. DataLoss
// naming what is wrong otherwise (the caller names the blob). The audit compares its replayed
// steps with them (task_audit.h); the round's aggregator checks the blob before it keeps it
// with the task's states, so that it is served after the stage node deleted it.
Result<std::vector<protocol::StageStepCommit>> CheckStageCommits(ByteSpan blob,
                                                                 const StageCommitsOf& unit);

// The unit's steps 0..batches.size()-1 of `stage` over `plane` (BeginStep, then RunStageStep
// with plane.context()): batches[i] is step i's whole batch (the unit's BatchForStep), and
// `dropout_seed` the unit's (engine::DropoutSeed of the task seed and the unit's stream). The
// first failed step's error (a silent neighbour: DeadlineExceeded naming it) ends the run; the
// stage's weights then hold the steps before it.
struct StageRunHooks {
  // When set, called before every step with the step's index (0..H-1) and the stage's state at
  // the step's start (StageEvidence::SaveCheckpoint writes it to a file a verifier replays
  // from); an error ends the run.
  std::function<Status(uint64_t step, engine::TrainState& state)> checkpoint;
  // When set, gets every step's evidence as the step ends (what StageEvidence::Publish serves
  // verifiers beside the checkpoint): its commit and the tensors the stage received
  // (StagePlane::received), and, with StagePlaneOptions::keep_sent, those it sent
  // (StagePlane::sent); an error ends the run.
  std::function<Status(const protocol::StageStepCommit& commit, std::map<Hash256, Bytes> received)>
      publish;
  // Testing only: the solver adversaries on a stage (SetStageAdversary fills these from the
  // node's mode; docs/verification.md "Pipeline stages", "Stage adversaries").
  // lazy: every step's commit claims the state the step started from, as if the stage had
  // skipped its update.
  bool lazy_commit = false;
  // noisy: after `perturb_after` steps (0: never) the stage's parameters take PerturbParams of
  // `perturb_stream`; that step's commit and every later one hash the perturbed state.
  int64_t perturb_after = 0;
  uint64_t perturb_stream = 0;
  // drift: the perturbation is not committed (that step's state_after is the state it trained
  // to): the next step starts from a state no step ended at (the continuity check's finding).
  bool perturb_uncommitted = false;
  // wrong_data: step `wrong_data_step` (-1: none) trains on the wrong input, committing the
  // records of the right one: the first stage on the batch of the next step (step + 1 mod H;
  // InvalidArgument for H = 1), a later stage on micro-batch 1's received activations for
  // micro-batch 0 and micro-batch 0's for 1 (InvalidArgument for one micro-batch).
  int64_t wrong_data_step = -1;
  // wrong_result: trains honestly and commits the negated delta (not start - end).
  bool negate_result = false;
  // Testing only (AgentOptions::malformed_stage_result): trains honestly and commits its delta
  // without its last value, a blob no aggregator decodes as the stage's delta.
  bool malformed_result = false;
};
// The hooks with which a stage node plays adversary `adv` on a stage unit of `work`: lazy, noisy
// and drift (after PoisonAfterSteps(H) steps), wrong_data (step PoisonAfterSteps(H) - 1) and
// wrong_result;
// every other mode leaves them honest (a stage trains honestly).
void SetStageAdversary(Adversary adv, const UnitWork& work, StageRunHooks* hooks);
// What a run of a stage unit has done so far: the stage's weights at the round's start (its
// delta's start) and each step's commit and loss, in step order. A run that fails keeps the steps
// before the failed one (the stage then holds that step's start: stage_step.h), so that a kept
// stage resumes there (stage_resume.h, "The resume step" of docs/protocol.md).
struct StageRunProgress {
  std::vector<float> start;  // empty: the run has not begun (RunStageUnit takes the stage's)
  std::vector<protocol::StageStepCommit> commits;
  std::vector<float> losses;  // StageStepOutcome::loss of each step
};
// With `progress`, runs from step progress->commits.size() (the stage at that step's start),
// adding each step to it as it ends; the outcome counts every step of it (leaves, commitment,
// mean loss), its delta the stage's end against progress->start (a run that ends moves its start
// and commits into the outcome). InvalidArgument when progress
// holds more steps than `batches`, or steps without a start.
Result<StageUnitOutcome> RunStageUnit(engine::Stage& stage, StagePlane& plane,
                                      std::span<const engine::Batch> batches, uint64_t dropout_seed,
                                      const StageRunHooks& hooks = {},
                                      StageRunProgress* progress = nullptr);

// Testing only: what a stage whose kernel computed a tensor it sent wrongly claims in the tile
// dispute over its step (AgentOptions::corrupt_sent_in_trace; docs/verification.md "Stage
// adversaries"). The stage sent CorruptedStageTensor of an operator's output for every record of
// `commit.sent` that `corrupt` matches (StagePlaneOptions::corrupt_sent); its faulty kernel
// computed that output, so its trace is `honest` (the step traced from what it served, following
// `plan`, its values kept) with each such operator's output (ledger::StageSentOperator) replaced
// by the tensor as sent. That is the whole of the faulty step's trace only when no later
// operator reads the output (the activations a stage sends, its last block's residual3, and
// their gradient, its first block's residual.grad, are read by none: the step's backward passes
// the gradient through the residual): FailedPrecondition naming the operator otherwise, or when
// the plan has no operator for a matched record.
Result<engine::OpTrace> CorruptSentTrace(
    const engine::TilePlan& plan, const engine::OpTrace& honest,
    const protocol::StageStepCommit& commit,
    const std::function<bool(const protocol::StageTensorKey&)>& corrupt);

// One node's data-plane service: registers "stage.push" once on the node's router and hands each
// push to the plane of the stage unit the node runs now (a node runs one stage unit at a time and
// a new plane for each). With no plane attached a push is answered Unavailable, which the
// sender's plane retries until its step's deadline (a neighbour that starts its stage first).
//
// It also keeps its neighbours' checkpoints past the run whose plane took them (checkpoint
// replication, stage_plane.h: the plane's kept() when its attachment ends), newest step per
// (task, round, replica, stage), and serves them to the node that replaces a lost stage:
//
//   "stage.kept"  {task, round, replica, stage} -> {claim: EncodeStageStateClaim, checkpoint}
//
// (the attached plane's, else the host's; NotFound when it keeps none). FetchKeptCheckpoint checks
// what comes back.
class StageHost {
 public:
  StageHost() = default;
  StageHost(const StageHost&) = delete;
  StageHost& operator=(const StageHost&) = delete;

  // Registers "stage.push" (bodies up to `max_push_bytes`: StagePlaneOptions::max_tensor_bytes
  // plus the record), "stage.keep" (a stage checkpoint: up to kMaxEncodedLength) and
  // "stage.resume" (stage_plane.h: the attached plane answers). `router`
  // must outlive the server that serves it.
  void Register(net::Router* router, uint64_t max_push_bytes = (64ull << 20) + 4096);

  // Pushes go to `plane` until the attachment is destroyed. REQUIRES: none attached now.
  class Attachment {
   public:
    ~Attachment();
    Attachment(Attachment&&) = delete;

   private:
    friend class StageHost;
    explicit Attachment(StageHost* host) : host_(host) {}
    StageHost* host_;
  };
  std::unique_ptr<Attachment> Attach(StagePlane* plane);

  // The newest checkpoint of (task, round, replica, stage) this node keeps: the attached plane's,
  // else one a finished run's plane took. nullopt when none.
  std::optional<KeptCheckpoint> Kept(const Hash256& task, uint32_t round, uint32_t replica,
                                     uint32_t stage) const;
  // Drops what is kept of `task`'s rounds before `round` (their rounds are final); the count.
  size_t WithdrawKeptBefore(const Hash256& task, uint32_t round);
  // The bytes of the checkpoints kept past their runs.
  uint64_t kept_bytes() const;

 private:
  using KeptKey = std::tuple<Hash256, uint32_t, uint32_t, uint32_t>;  // task, round, replica, stage
  Result<Bytes> HandlePush(const net::Request& request);
  Result<Bytes> HandleKeep(const net::Request& request);
  Result<Bytes> HandleResume(const net::Request& request);
  Result<Bytes> HandleKept(const net::Request& request) const;
  // Keeps `k` unless a checkpoint of a later step of its stage is kept. REQUIRES: mu_ held.
  void KeepLocked(KeptCheckpoint k);

  mutable std::mutex mu_;
  StagePlane* plane_ = nullptr;             // guarded by mu_; the handler runs under it
  std::map<KeptKey, KeptCheckpoint> kept_;  // guarded by mu_
};

inline constexpr char kMethodStageKept[] = "stage.kept";

// The checkpoint of stage `stage` of (task, round, replica) in a chain of `stages` that the node
// at `endpoint` keeps (its "stage.kept"), checked: the claim is of that stage, signed by
// `signer` (the stage's node in the chain that ran it), and the checkpoint loads and hashes to
// the claimed state. NotFound when the node keeps none; PermissionDenied or InvalidArgument for
// one that does not check out; the transport's errors.
Result<KeptCheckpoint> FetchKeptCheckpoint(net::Transport* transport, const std::string& endpoint,
                                           const Hash256& task, uint32_t round, uint32_t replica,
                                           uint32_t stages, uint32_t stage,
                                           const protocol::NodeId& signer);

}  // namespace meshlearn::node
