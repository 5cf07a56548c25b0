// What the ledger computes to referee verification, shared with the nodes so both check and
// compute exactly the same thing (docs/verification.md, "Referee", "Result binding"): one
// disputed training step from its witness (ledger::StepWitness, RefereeStepTx), and the result a
// unit's final state gives (ProveResultTx).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

// The state hash after `step` (1-based) of a classification unit with stream `stream` trained at
// `lr_scale` of `spec` (the task bundle's), from witness `w`: its state must hash to `agreed`
// (the state after step - 1), its examples must be the batch of that step (BatchIndices over
// `num_examples`, in batch order) each proven against `data_root`; then one
// engine::StepOnBatch. InvalidArgument naming the first input that does not check (`where`
// prefixes every message); FailedPrecondition for a token task. Deterministic.
Result<Hash256> RunStepWitness(const engine::TaskSpec& spec, uint64_t stream, double lr_scale,
                               uint64_t num_examples, const Hash256& data_root, uint64_t step,
                               const Hash256& agreed, const StepWitness& w,
                               const std::string& where);

// Runs `steps` steps of a classification unit with stream `stream` from `state` (which moves to
// the end), each on its batch from `examples` (steps x batch_size of them, step after step, each
// checked as RunStepWitness checks one step's), and returns the end state's hash: the segment
// replay of a ProveFraudTx. InvalidArgument naming the first example that does not check
// (`where` prefixes every message). Deterministic.
Result<Hash256> RunSegmentSteps(const engine::TaskSpec& spec, uint64_t stream,
                                uint64_t num_examples, const Hash256& data_root,
                                engine::TrainState& state, uint64_t steps,
                                std::span<const StepWitnessExample> examples,
                                const std::string& where);

// `spec` itself, or, for a GPT whose vocab_size comes from the data (0 in the file, hence in the
// bundle), the spec with the vocab_size that gives exactly `num_weights` parameters (a GPT's
// parameter count is affine in the vocabulary; a task's params.model_bytes / 4). Lets a model be
// built from a task's bundle without its data (`task fetch`, the ledger's stage ruling). Errors
// if no vocabulary fits.
Result<engine::ModelSpec> ModelSpecForState(const engine::ModelSpec& spec, uint64_t num_weights);

// The blob id of the delta blob of `delta` (protocol/state_blob.h EncodeDelta): the id a
// BlobStore::Put of the encoded delta returns, which CommitUnit records as result_hash.
Hash256 DeltaBlobId(std::span<const float> delta);

// The result a unit trained from `global` to a final state with parameters `params` must commit:
// DeltaBlobId of the pseudo-gradient global - params, as the ledger computes it for a
// ProveResult. REQUIRES: equal sizes.
Hash256 ResultBlobId(std::span<const float> global, std::span<const float> params);

}  // namespace meshlearn::ledger
