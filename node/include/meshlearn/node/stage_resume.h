// Resuming a pipeline replica at the step where it lost a stage's node, with every record of the
// run on the new chain (issue 15; docs/protocol.md "The resume step").
//
// When stage L's node is lost in step k, the replica's kept stages hold their state at step k's
// start (a failed step changes no weights: ledger/stage_step.h), and for every step j < k what
// they exchanged with L: the records L signed and sent them (in their step commits' `received`)
// and the tensors they sent L with their own signed records (their commits' `sent`). The node
// that takes stage L over rebuilds L's state at step k without any checkpoint of L: it builds L
// from the round's start (StageFromGlobal, what every node reads from the chain) and re-runs L's
// steps 0..k-1 alone (RecomputeLostStage), its inputs the kept stages' tensors, each checked
// against its sender's signed record. A step is exact (tensors are a pure function of the step's
// inputs), so every tensor it sends is byte-equal to the one L's lost node sent: it checks each
// against that node's record (hash, size, tiled root) and signs its own. The kept stages then swap
// L's lost node's records in their commits of steps 0..k-1 for the new node's
// (SwapLostStageRecords: the same tensors, checked again), so that every record of the run is
// signed by the run's one chain (ledger ReplicaChainOf) and verifies there; their own records
// carry no chain (protocol::StageTransferSigningBytes), so they are not signed again. Then every
// stage runs steps k..H-1 on the new chain: the kept stages do not re-run steps 0..k-1.
//
// Either function failing -- a kept stage no longer holds a tensor L needs, or a recomputed
// tensor differs from what L's lost node signed (that node sent something its inputs do not give:
// it cheated, or its inputs were not these) -- means the resume at k cannot be made: the replica
// re-runs from the round's start on the new chain, as it did before this existed (bit-equal too).
//
//   // On the new node of stage L, given each kept stage's KeptStageSteps of steps 0..k-1:
//   ML_ASSIGN_OR_RETURN(RecomputedStage redone,
//                       RecomputeLostStage(*stage, new_ctx, L, earlier, key, batches, seed, k,
//                                          kept));
//   // On each kept stage, its commits of steps 0..k-1:
//   ML_RETURN_IF_ERROR(SwapLostStageRecords(my_commits, L, redone.commits, new_ctx));
//
// Thread-compatible: pure functions of their arguments (the stage is changed in place).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/stage_plane.h"
#include "meshlearn/node/stage_step.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::node {

// What one kept stage holds of the replica's steps 0..k-1: its step commits, in step order (the
// records it received and sent), and the tensors it sent, by their hash (StageTensorBytes). Only
// those it sent the lost stage are read.
struct KeptStageSteps {
  std::vector<protocol::StageStepCommit> commits;
  std::map<Hash256, Bytes> sent;
};

// What kept stage `stage` of ctx's replica serves of its steps 0..k-1 (its StageEvidence at
// `endpoint`): each step's commit (checked to be that step's) and the tensors it sent stage `lost`
// (FetchStageStepSent; served when its plane keeps what it sends, keep_sent). FailedPrecondition
// naming the step when the node serves no commit of it (NotFound), or a tensor of its commit
// addressed to `lost` it does not serve; ResourceExhausted when a tensor declares more than
// `max_tensor_bytes` (the data plane's bound on a push: StagePlaneOptions::max_tensor_bytes) or
// the tensors of the k steps more than `max_bytes` together, before those bytes are fetched; the
// transport's errors as they come.
Result<KeptStageSteps> FetchKeptStageSteps(net::Transport* transport, const std::string& endpoint,
                                           const StageContext& ctx, uint32_t stage, uint32_t lost,
                                           uint64_t k, uint64_t max_tensor_bytes = UINT64_MAX,
                                           uint64_t max_bytes = UINT64_MAX);

// What RecomputeLostStage re-ran: the lost stage's commits of steps 0..k-1, signed by the new
// node, and their losses (StageStepOutcome::loss: the last stage's mean micro-batch loss, which
// its CommitStage's loss counts; 0 on the others).
struct RecomputedStage {
  std::vector<protocol::StageStepCommit> commits;
  std::vector<float> losses;
};

// Steps 0..k-1 of stage `lost` of ctx's replica, re-run on `stage` (stage `lost` at the round's
// start: StageFromGlobal; its state's step must be 0) and signed with `key` (ctx.chain[lost] must
// be its public key): batches[j] and `dropout_seed` as for RunStageUnit; `kept` by stage, every
// stage of the chain but `lost`. Every input is the tensor a kept stage sent, checked against its
// record (CheckStageTensor: signed by ctx.chain[sender]); every output is checked against the
// record the lost node signed for it, which the receiving kept stage's commit holds. Each of
// those records must be signed by `earlier`, the node the ledger shows held stage `lost` before
// (UnitAssignment::Stage::earlier: the unit's last excluded node), whose run the kept stages
// shared: PermissionDenied naming the record and its signer otherwise, and for a zero `earlier`
// (the ledger shows none). `hooks`'
// checkpoint and publish are called for every step as RunStageUnit calls them (the new node
// serves these steps' evidence to verifiers); its adversary fields are not read.
// Returns the lost stage's commits and losses of steps 0..k-1, signed by `key`; `stage` is then
// at step k.
// Errors (the resume at k cannot be made; `stage` is then part way and must be built again):
// FailedPrecondition naming the tensor a kept stage no longer holds, or the record it lacks;
// DataLoss naming the tensor recomputed otherwise than the lost node sent it; InvalidArgument for
// arguments that do not fit (a `kept` without k commits of each stage, a stage not at step 0);
// a kept stage's tensor that does not match its record: CheckStageTensor's error.
Result<RecomputedStage> RecomputeLostStage(
    engine::Stage& stage, const StageContext& ctx, uint32_t lost, const protocol::NodeId& earlier,
    const KeyPair& key, std::span<const engine::Batch> batches, uint64_t dropout_seed, uint64_t k,
    const std::map<uint32_t, KeptStageSteps>& kept, const StageRunHooks& hooks = {});

// A kept stage's commits of steps 0..k-1 (`commits`, in step order) with every record it received
// from stage `lost` replaced by the record of the same key among `recomputed`'s sent records (the
// new node's commits of those steps: RecomputeLostStage's), after checking that the new record is
// signed by ctx.chain[lost] and names the same tensor (hash, size, tiled root) as the one it
// replaces. Nothing else of a commit changes (the stage's own records and state hashes), and
// `commits` is unchanged on error: FailedPrecondition naming a record `recomputed` lacks, DataLoss
// naming one whose tensor differs, PermissionDenied for a record not signed by the new node.
Status SwapLostStageRecords(std::vector<protocol::StageStepCommit>& commits, uint32_t lost,
                            std::span<const protocol::StageStepCommit> recomputed,
                            const StageContext& ctx);

// ---- On the network: the stage nodes of a replica agree on the step they resume at.
//
// Each stage node's run of a unit on a chain offers, before it trains, the steps it holds
// (StagePlane::OfferResume, answered by "stage.resume": a kept stage holds steps 0..k-1 of its
// run on the chain before, a fresh run none) and reads every other stage's offer. Every node
// derives the resume from the same offers (StageResumePointOf), so the kept nodes and the new one
// agree on k without a coordinator: no node resumes while its neighbours re-run from the round's
// start, or the other way round, unless an offer changed between two nodes' reads (a run that
// failed and restarted holding nothing); then they wait out one step deadline and, a resume being
// tried once per assignment (the Stager's), all re-run from the round's start.

// The resume of a replica whose stage s's run holds held[s] steps at its start: when exactly one
// stage holds none and every other some, the replica lost that stage's node (`lost`) and resumes
// at k, the fewest steps a kept stage holds (the step the lost node was lost in: a kept stage may
// hold one more when the lost node sent it all of that step's tensors and not the other kept
// stages -- the last stage sends the gradient total to stage 0 first -- and it rolls back to k);
// otherwise (k = 0) every stage runs from the round's start.
struct StageResumePoint {
  uint32_t lost = 0;
  uint64_t k = 0;
};
StageResumePoint StageResumePointOf(std::span<const uint64_t> held);

// What a stage node's run does before its steps (the Stager calls it on the run's thread, then
// RunStageUnit with `progress`): it reads the other stages' offers (unless `ask` is false: a
// resume was already tried for this assignment; then it holds nothing and trains from step 0)
// and returns the step it trains from, `progress` then holding the steps before it.
//   - k = 0: nothing to resume; a run that holds steps fails (FailedPrecondition: the replica
//     re-runs from the round's start and this stage must be built again from it).
//   - the lost stage (this node replaced its node): fetches every kept stage's steps 0..k-1
//     (FetchKeptStageSteps, each tensor at most options' max_tensor_bytes and each kept stage's
//     at most its inbox_bytes), re-runs them (RecomputeLostStage, with `hooks`, so it serves
//     their evidence) and decides k: the kept stages read that from its offer.
//   - a kept stage: waits for the lost stage's decision (k + 1 step deadlines: it re-runs k steps
//     alone); when it holds more than k steps, rolls `stage` back to step k's start from its
//     checkpoint of that step (`evidence`'s PublishedCheckpointState, which must hash to its
//     commit of step k's state_before) and drops its steps k..; fetches the lost stage's commits
//     of steps 0..k-1 (FetchStageStepCommit), swaps its own (SwapLostStageRecords) and serves
//     them (`evidence`: StageEvidence::ServeCommit).
// Any failure decides 0 and fails the run, naming why: the Stager then runs the unit again from
// the round's start (the other stages follow: a kept stage reads the lost one's 0, and a lost
// stage's neighbours fail their step k), bit-equal too. `endpoints` as the plane's SetChain;
// `earlier`: the node the ledger shows held this node's stage before (UnitAssignment::Stage::
// earlier; zero for none), whose records the lost stage's new node recomputes.
Result<uint64_t> StartStageRun(engine::Stage& stage, StagePlane& plane, const KeyPair& key,
                               net::Transport* transport, std::span<const std::string> endpoints,
                               std::span<const engine::Batch> batches, uint64_t dropout_seed,
                               const StageRunHooks& hooks, StageEvidence* evidence,
                               const StagePlaneOptions& options, bool ask,
                               const protocol::NodeId& earlier, StageRunProgress* progress);

}  // namespace meshlearn::node
