// The ledger as referee: it executes the one training step a dispute narrowed to, from a witness
// it checks against the chain (RefereeStepTx; engine/step_replay.h; docs/verification.md,
// "Referee"). Internal to the ledger (verification.cc calls it).
#pragma once

#include <span>
#include <string>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/task_model.h"

namespace meshlearn::ledger {

// A task bundle given in a witness, checked against the chain: its blob id must be the task's
// spec_hash (InvalidArgument, naming both, otherwise); the engine's spec and the [network] table
// through the parsers every node uses (FailedPrecondition when they refuse it). A GPT whose
// vocab_size the bundle leaves to its data gets the one params.model_bytes implies
// (ModelSpecForState), so the spec is the model the nodes train; FailedPrecondition when none
// fits.
struct TaskBundleSpec {
  engine::TaskSpec spec;
  protocol::NetworkSpec net;
};
Result<TaskBundleSpec> ParseTaskBundle(const TaskRecord& t, const std::string& bundle,
                                       const std::string& where);

// The batch of the step after `before` steps (0-based step index `before`), from `examples` (a
// witness's examples of that step): one per batch position, each the index the unit's sampler
// draws there (engine::BatchIndices), each proven against `data_root`. InvalidArgument naming the
// first example that does not check.
Result<engine::Batch> WitnessBatch(const engine::TaskSpec& spec, uint64_t stream, int64_t classes,
                                   uint64_t num_examples, const Hash256& data_root, int64_t before,
                                   std::span<const StepWitnessExample> examples,
                                   const std::string& where);

// The state hash after step `task.step` of unit `unit` of `task_record`, computed by the ledger
// from `witness`:
//   - the bundle must be the task's (its blob id is spec_hash), a classification task, and parse;
//   - the state (the agreed state after step - 1) must hash to task.input with the unit's model,
//     inner optimizer (the round's learning rate), seed and stream;
//   - the examples must be the batch of the step: one per batch position, each at the index the
//     unit's sampler draws there, each proven against params.data_root.
// InvalidArgument (naming the input and what is wrong) when the witness does not check out;
// FailedPrecondition for a token task. REQUIRES: the task has a data root and `task` is one
// whole step (verification.cc's LedgerExecutes, checked before the witness is even decoded).
// Deterministic: every follower computes the same output from the same transaction.
Result<Hash256> ExecuteRefereeStepWitness(const TaskRecord& task_record, const WorkUnit& unit,
                                          const protocol::RefereeTask& task,
                                          const StepWitness& witness);

// The delta blob id that unit `unit`'s committed final state gives (ProveResultTx), computed by
// the ledger from `witness`: the bundle must be the task's, the start state blob the round's
// (round 0: params.initial_state, else the previous round's aggregate), and the state must hash
// to the unit's last committed leaf (the state after step H, with the unit's model, optimizer,
// seed and stream). The result is the blob id of EncodeDelta(start weights - final parameters).
// InvalidArgument (naming what is wrong) when the witness does not check out.
Result<Hash256> ExecuteResultWitness(const TaskRecord& task_record, const WorkUnit& unit,
                                     const ResultWitness& witness);

struct StageResultWitness;  // stage_referee.h
// The same for a stage unit of a pipeline task (ProveResultTx, its witness a
// StageResultWitness): the bundle must be the task's, the start state blob the round's, the
// commit the stage's last step's (its StageStepLeaf the unit's last committed leaf, of this
// task, round, replica, stage and step H-1), and the state a stage checkpoint hashing to the
// commit's state_after. The result is StageResultBlobId of the round's start weights and that
// state. InvalidArgument (naming what is wrong and the fix) when the witness does not check out.
Result<Hash256> ExecuteStageResultWitness(const TaskRecord& task_record, const WorkUnit& unit,
                                          const StageResultWitness& witness);

// The state hash at the end of segment `segment` of unit `unit` (a ProveFraudTx), computed by the
// ledger from `witness`: the bundle must be the task's; the segment's start is, for segment 0,
// the unit's true start (witness.start_state must be the round's start blob; fresh optimizer
// moments), else witness.state, which must hash to the committed leaf `segment`; the examples
// must be the batches of the segment's steps in order, each proven against params.data_root.
// Then the segment's steps run (engine::StepOnBatch each). InvalidArgument (naming the input and
// what is wrong) when the witness does not check out; FailedPrecondition for a unit without
// leaves or a token task. The caller compares the result with leaves[segment + 1].
Result<Hash256> ExecuteSegmentWitness(const TaskRecord& task_record, const WorkUnit& unit,
                                      uint32_t segment, const SegmentWitness& witness);

}  // namespace meshlearn::ledger
