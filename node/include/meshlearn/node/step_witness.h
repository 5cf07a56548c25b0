// The witness of one disputed training step (ledger::StepWitness): what a node posts in a
// RefereeStepTx so that the ledger executes the step itself (docs/verification.md, "Referee").
//
// A dispute in exact mode narrows to one whole step `step` of a unit: both parties agree on the
// state hash after step - 1 (RefereeTask::input) and disagree after `step`. The witness carries
// that agreed state in full (engine::FlatState: parameters and optimizer moments), the task
// bundle (its blob id is the task's spec_hash: the model, optimizer, seed, batch size) and the
// step's batch, each example with a Merkle proof against the task's data root
// (engine::DataTree). The ledger checks each against the chain and recomputes the step.
//
// Building it needs the agreed state, which is public only as a hash. The builder finds it:
//   1. the unit replayed from its start (the round's weights) to step - 1: the agreed input when
//      the defender's committed leaf at the dispute's first step was true (an honest defender,
//      or a challenger that replayed from the unit's start);
//   2. otherwise the defender's own checkpoint at the dispute's first step (which must hash to
//      the dispute's agreed leaf) replayed to step - 1: the defender cheated before the dispute
//      and the challenger replayed the segment from its false checkpoint, as verifiers do;
//   3. neither: no witness (the dispute ends undecided at the referee deadline, nobody
//      punished). An honest party only agrees to true hashes, so for an honest defender case 1
//      always holds, and for a challenger that replayed from the defender's checkpoint case 2.
//
//   engine::DataTree tree(trainer->data().train);           // once per task
//   ML_ASSIGN_OR_RETURN(BuiltStepWitness w,
//                       BuildStepWitness(trainer, global, work, task, bundle_text, tree,
//                                        {.first_step = dispute_first_step,
//                                         .agreed = dispute_agreed,
//                                         .checkpoint = load_defender_checkpoint}));
//   tx.Send(ledger::RefereeStepTx{task_id, index, {ledger::EncodeStepWitness(w.witness)}});
//   // w.output: the state hash the ledger will compute after `step`.
//
// Thread-compatible (the trainer is shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/dispute.h"

namespace meshlearn::node {

// The defender's checkpoint after `step` of the disputed unit (its unit service's file,
// engine::LoadCheckpoint'ed), or an error when it serves none.
using DefenderCheckpointLoader = std::function<Result<engine::TrainState>(int64_t step)>;

// Where a dispute started (check.dispute in get_task / referee_work), for the fallback (2).
struct DisputeStart {
  int64_t first_step = 0;  // DisputeConfig::first_step: the claimed segment's start
  Hash256 agreed;          // DisputeConfig::agreed: the defender's committed leaf there
  // Null: no fallback (only case 1).
  DefenderCheckpointLoader checkpoint;
};

struct BuiltStepWitness {
  ledger::StepWitness witness;
  // The state hash after `step` computed from the witness exactly as the ledger will
  // (StateFromFlat, StepOnBatch), cross-checked against the trainer's own step:
  // RuleDisputeTx::output's equivalent, for logs and reports.
  Hash256 output;
  Hash256 true_input;            // A(step - 1), replayed from the unit's start
  Hash256 true_output;           // A(step)
  bool from_checkpoint = false;  // the agreed state came from the defender's checkpoint (case 2)
  std::string reason;            // where the agreed state came from, whose output the step gives
};

// The witness of whole step `task.step` of unit `work` trained from `global` (see the top of this
// file). `bundle` is the task bundle text (the spec_hash blob), `tree` the DataTree of the
// trainer's training data. InvalidArgument for a task that is not an exact-mode whole step or a
// step outside 1..H, and for a token task (no DataTree); FailedPrecondition when neither the
// unit's start nor the defender's checkpoint reaches the agreed input (the message says what each
// gave).
Result<BuiltStepWitness> BuildStepWitness(engine::Trainer* trainer, std::span<const float> global,
                                          const UnitWork& work, const protocol::RefereeTask& task,
                                          std::string_view bundle, const engine::DataTree& tree,
                                          const DisputeStart& start = {});

// The trees a witness proves its batch with against the task's data root, built on first use:
// a token task's pages into `*pages`, a classification task's examples into `*tree`. Returns the
// examples (what ledger::BuildTileWitness reads them from), null for a token task.
const engine::ClassificationData* EnsureDataProofs(const engine::TaskData& data,
                                                   std::unique_ptr<engine::TokenPageTree>* pages,
                                                   std::unique_ptr<engine::DataTree>* tree);

// The disputed step replayed with an engine::OpTrace (values kept): what a party answers phases
// 2-4 of a dispute with the tile phase from (ledger::AnswerTileQuery) and builds a tile witness
// from (ledger::BuildTileWitness). The trainer is brought to the agreed state after step - 1
// (`input`) as BuildStepWitness finds it (the unit's start, else the defender's checkpoint), then
// runs the step as Trainer::Step does. InvalidArgument for a step outside 1..H;
// FailedPrecondition when the agreed state cannot be reached. Moves the trainer. `alter_batch`
// (testing's cheats only: a wrong_example party's ForgeExample, adversary.h) changes the step's
// batch before it runs: the trace is of the step as that party computed it.
struct TracedStep {
  int64_t step = 0;
  Hash256 input;   // the state hash after step - 1 (C_0)
  Hash256 output;  // the state hash after the step
  std::shared_ptr<engine::OpTrace> trace;
  engine::Batch batch;
};
Result<TracedStep> TraceDisputedStep(engine::Trainer* trainer, std::span<const float> global,
                                     const UnitWork& work, int64_t step, const Hash256& input,
                                     const DisputeStart& start = {},
                                     const std::function<void(engine::Batch&)>& alter_batch = {});

// The state hash after step `step` that `witness` gives, computed as the ledger does: the state
// rebuilt from witness.state (StateFromFlat with the unit's optimizer), checked to hash to
// `agreed`; every example checked at its batch position (BatchIndices) and against `data_root`;
// one StepOnBatch. Uses the trainer only for the task's spec (model, optimizer, seed, batch size)
// and the dataset size; its state is untouched. InvalidArgument naming the first input that does
// not check.
Result<Hash256> ExecuteStepWitness(const engine::Trainer& trainer, const UnitWork& work,
                                   int64_t step, const ledger::StepWitness& witness,
                                   const Hash256& agreed, const Hash256& data_root);

// ---- Fraud proofs after the fact (ProveFraudTx; docs/verification.md, "Fraud proofs after the
// fact"). An auditor replays a unit from its true start; the first segment j whose end is not the
// committed leaf j + 1 is the one to prove: its start is the committed leaf j (segment 0: the
// unit's true start, always), since every earlier segment ended on its leaf.
struct BuiltSegmentWitness {
  uint32_t segment = 0;
  ledger::SegmentWitness witness;
  Hash256 committed_end;  // leaves[segment + 1]
  Hash256 replayed_end;   // what the honest replay (and so the ledger) gets instead
};

// The witness of the first segment of unit `work` (trained from the round's start state
// `start_blob`, a global state blob) that does not replay to its committed leaf (`leaves`:
// SegmentCount + 1 of them). `bundle` is the task bundle text; the batches are proven by `tree`,
// the DataTree of a classification task's training data (each step's examples), or by `pages`, a
// token task's TokenPageTree (each step's pages, ledger::StepBatchPages): EnsureDataProofs gives
// the one the task needs. NotFound when every segment replays to its leaf (nothing to prove);
// InvalidArgument for a missing tree, a start blob that does not decode, or leaves of the wrong
// count. Moves the trainer.
Result<BuiltSegmentWitness> BuildSegmentWitness(engine::Trainer* trainer, ByteSpan start_blob,
                                                const UnitWork& work,
                                                std::span<const Hash256> leaves,
                                                std::string_view bundle,
                                                const engine::TokenPageTree* pages,
                                                const engine::DataTree* tree);

// The witness of segment `segment` of unit `work` (what ProveMerits carries: the segment a
// whistleblower's dispute was about, not necessarily the first that differs). The segment starts
// from the state `at_start` (a checkpoint at its first step, e.g. the solver's one the
// whistleblower replayed from; moved into the trainer) or, when null, from the unit replayed from
// the round's start `start_blob`; segment 0 always from the round's start. That state must hash
// to the committed leaf `segment` (the ledger checks it): FailedPrecondition otherwise. NotFound
// when the segment replays to its committed end (nothing to show); InvalidArgument as
// BuildSegmentWitness, and for a segment out of range. Moves the trainer.
Result<BuiltSegmentWitness> BuildSegmentWitnessOf(
    engine::Trainer* trainer, ByteSpan start_blob, const UnitWork& work,
    std::span<const Hash256> leaves, uint32_t segment, engine::TrainState* at_start,
    std::string_view bundle, const engine::TokenPageTree* pages, const engine::DataTree* tree);

// The size of a segment witness of `steps` steps (the start state, steps x one batch with its
// proofs: examples, or a token task's pages, the bundle), bounded as StepWitnessBound bounds a
// step's.
uint64_t SegmentWitnessBound(const engine::Trainer& trainer, uint64_t num_params, uint64_t steps);

// The data root a task's training data gives: what TaskParams::data_root must be. The DataTree
// root over its examples; a token task's, the TokenPageTree root over its train token stream
// (TaskParams::data_page_tokens = engine::kTokenPageTokens).
Hash256 TaskDataRoot(const engine::TaskData& data);

// An upper bound on what a RefereeStep witness of this task weighs: the state after a step with
// its optimizer moments, one batch of examples with their proofs, the bundle. A task whose
// witness could exceed ledger::kMaxWitnessBytes cannot have a whole step refereed by the ledger
// (its disputes play the tile phase; ComputeTaskFacts still declares its data root).
// (A ProveResult witness is bounded separately: see docs/verification.md, "Result binding".)
uint64_t StepWitnessBound(const engine::TaskSpec& task, uint64_t num_params);

}  // namespace meshlearn::node
