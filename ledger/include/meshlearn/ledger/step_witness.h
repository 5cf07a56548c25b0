// What the ledger computes to referee verification, shared with the nodes so both check and
// compute exactly the same thing (docs/verification.md, "Referee", "Result binding"): one
// disputed training step from its witness (ledger::StepWitness, RefereeStepTx), and the result a
// unit's final state gives (ProveResultTx).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/step_replay.h"
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

// Runs `steps` steps of a unit with stream `stream` from `state` (which moves to the end) and
// returns the end state's hash: the segment replay of a ProveFraudTx. Each step runs on its batch
// from the witness: a classification task's from `examples` (steps x batch_size of them, step
// after step, each checked as RunStepWitness checks one step's; `pages` empty), a token task's
// from `pages` (step after step, the pages StepBatchPages lists for that step, each proven against
// `data_root` over the `num_examples` tokens of the train stream, as a RefereeStageStep's batch
// is; `examples` empty). InvalidArgument naming the first example or page that does not check
// (`where` prefixes every message). Deterministic.
Result<Hash256> RunSegmentSteps(const engine::TaskSpec& spec, uint64_t stream,
                                uint64_t num_examples, const Hash256& data_root,
                                engine::TrainState& state, uint64_t steps,
                                std::span<const StepWitnessExample> examples,
                                std::span<const TileWitnessPage> pages, const std::string& where);

// ---- A token task's batch, proven by its pages (engine::TokenPageTree over the train stream).

// Whether `spec` trains on a token stream (a GPT on text) rather than on examples.
bool IsTokenTask(const engine::TaskSpec& spec);

// The pages of a train stream of `num_tokens` tokens that the batch of the step after `before`
// steps of a unit with stream `stream` reads (engine::TokenPagesOfRows of every row of the batch,
// increasing): what a witness proves that step's batch with.
std::vector<int64_t> StepBatchPages(const engine::TaskSpec& spec, uint64_t stream, int64_t before,
                                    int64_t num_tokens);

// Pages `want` of `tree` with their tokens and proofs, in that order: what a witness carries
// (RefereeTile's, RefereeStageStep's and ProveFraud's).
std::vector<TileWitnessPage> ProvenPages(const engine::TokenPageTree& tree,
                                         std::span<const int64_t> want);

// The token batch of the step after `before` steps of a unit with stream `stream` from `pages`:
// exactly StepBatchPages, each of full length and proven against `data_root` (CheckWitnessPages),
// laid end to end and cut into the batch's windows as the trainer cuts the stream
// (engine::WindowStarts, MakeTokenBatch). InvalidArgument naming the first page that does not
// check (`where` prefixes every message).
Result<engine::Batch> WitnessTokenBatch(const engine::TaskSpec& spec, uint64_t stream,
                                        uint64_t num_tokens, const Hash256& data_root,
                                        int64_t before, std::span<const TileWitnessPage> pages,
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
