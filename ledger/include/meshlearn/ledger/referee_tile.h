// The ledger as referee of ONE TILE of one operator of a training step: the rule a dispute game
// narrowed to a tile (protocol/dispute.h, phases 3 and 4) is settled by, from a witness of at most
// a few hundred KiB whatever the model's size (engine/tile_rule.h; docs/verification.md, "Tiles").
// Public so that a party or a referee service can build and size witnesses with the ledger's own
// types. On chain: a mismatch (RevealVerdict, ChallengeUnit) carrying the task bundle opens a
// dispute with the tile phase (TileContextOf, SetTilePhase); RefereeTile carries the witness and
// the ledger rules with RuleTile (ledger/src/verification.cc).
//
//   TileRuleContext ctx = ...;              // from the task record and the unit (below)
//   SetTilePhase(ctx.plan, &config);        // when the dispute is opened
//   ...                                     // the game reaches the referee with a tile task
//   Result<Hash256> out = RuleTile(ctx, game.referee_task(), witness);
//   if (out.ok()) game.Rule(*out);          // a refused witness rules nothing
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/data.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/dispute.h"

namespace meshlearn::ledger {

// What the chain knows about the disputed unit, decoded: the step's operator plan (the task's
// model, the unit's inner optimizer, the batch size) and what draws and proves its batches.
struct TileRuleContext {
  engine::TilePlan plan;
  uint64_t seed = 0;          // the task's seed
  uint64_t stream = 0;        // the unit's stream
  uint64_t num_examples = 0;  // a token task: the train stream's tokens
  // The Merkle root over the examples (engine::DataTree), or over a token task's pages
  // (engine::TokenPageTree; plan.tokens).
  Hash256 data_root;
};

// TileWitnessPage (tx.h): one page of a token task's train stream, proven against the data root.
// Whether a witness's `pages` are exactly the pages `want` of a token stream of `n` tokens (what
// engine::TokenPagesOfRows lists for the rows `reader` names: "the footprint's rows", "the step's
// batch"), each of its full length and proven against the task's `data_root`; errors start with
// `where`. The one check of RefereeTile's and RefereeStageStep's token pages.
Status CheckWitnessPages(std::span<const TileWitnessPage> pages, const std::vector<int64_t>& want,
                         int64_t n, const Hash256& data_root, const std::string& where,
                         const std::string& reader);

// One input tile: tile `tile` of operator `op` (1-based, as the game counts), its values, and
// its Merkle proof against that operator's agreed output root.
struct TileWitnessTile {
  uint32_t op = 0;
  uint64_t tile = 0;
  std::vector<float> values;
  MerkleProof proof;
  bool operator==(const TileWitnessTile&) const = default;
};

// One chunk of a chunked example (engine::ExampleChunk): its floats and its Merkle proof against
// the example's chunk root (proof.index is the chunk).
struct TileWitnessChunk {
  std::vector<float> values;
  MerkleProof proof;
  bool operator==(const TileWitnessChunk&) const = default;
};

// An example of more than engine::kExampleChunkFloats floats, carried as the chunks a tile reads:
// its leaf engine::ChunkedExampleLeaf(index, y, floats, chunk_root), proven against the task's
// data root, and the footprint's chunks (engine::TileFootprint::batch_chunks, in order), each
// proven against chunk_root.
struct TileWitnessChunkedExample {
  uint64_t index = 0;  // dataset index (must be the batch's index at its position)
  int32_t y = 0;       // class id
  Hash256 chunk_root;  // engine::ExampleChunkRoot of the example
  MerkleProof proof;   // of its leaf against the task's data root
  std::vector<TileWitnessChunk> chunks;
  bool operator==(const TileWitnessChunkedExample&) const = default;
};

// The most bytes of chunked examples RuleTile builds for one tile: their rows, each of the task's
// input_size floats (engine::TileInputs::x reads a row whole, zeros but for the chunks the tile
// reads). The witness no longer bounds them (it carries the chunks only) and the task's bundle
// sets input_size to any value, so a witness whose rows would cost more is refused. 64 MiB holds
// 32 rows of a 3 x 224 x 224 image (18.4 MiB).
inline constexpr uint64_t kMaxTileExampleBytes = 64u << 20;

struct TileWitness {
  // out_1 .. out_{j-1}: the output roots of the operators before the disputed one j, which
  // chain from the step's agreed state hash C_0 to the agreed C_{j-1}.
  std::vector<Hash256> outputs;
  // The footprint's tiles (engine::Footprint), in its order.
  std::vector<TileWitnessTile> tiles;
  // The footprint's batch rows, in order: each the example the unit's sampler draws at that
  // position of the step's batch, proven against the task's data root. Examples of more than
  // engine::kExampleChunkFloats floats are in `chunked` instead, this one empty.
  std::vector<StepWitnessExample> examples;
  // The footprint's batch rows of a task whose examples are chunked, in order: each with the
  // chunks the footprint reads only.
  std::vector<TileWitnessChunkedExample> chunked;
  // A token task: the pages holding the footprint's batch rows' tokens and targets
  // (engine::TokenPagesOfRows), in increasing order, each proven against the data root.
  std::vector<TileWitnessPage> pages;
  // A reduction block > 0: the agreed partial sum S_block (its TileHash is the task's
  // partial_input). Empty for block 0.
  std::vector<float> partial;
};

// The encoded witness (what a transaction would carry) and its inverse. Decode refuses
// truncated or trailing bytes. A witness with token pages encodes as version 2 (the pages after
// the partial sum); one with chunked examples as version 3 (version 2's layout, then the chunked
// examples); one with neither, exactly as before (version 1).
Bytes EncodeTileWitness(const TileWitness& w);
Result<TileWitness> DecodeTileWitness(ByteSpan bytes);

// The witness bound the tile rule is designed to (issue 16): kMaxTileWitnessBytes (256 KiB, tx.h).

// The witness for tile task `task`, built by anyone who ran its step (a party, a referee
// service): `trace` is that run's OpTrace, recorded with keep_values (only the operators before
// the disputed one are read: the agreed ones, so the liar's witness is the honest one's); `batch`
// the step's batch (for a reduction block's agreed partial sum); `train` and `tree` the task's
// training data and its DataTree (the examples the footprint reads; may be null when it reads
// none); `pages` a token task's page tree (the rows' tokens; may be null when it reads none).
// FailedPrecondition when the task is not a tile of a covered operator of ctx.plan. For a task
// ruled from roots (RulesFromRoots) it builds RuleRoots' witness: the prefix of `trace`'s output
// roots it reads (only those are read; batch, data and pages may be empty).
Result<TileWitness> BuildTileWitness(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                                     const engine::OpTrace& trace, const engine::Batch& batch,
                                     const engine::ClassificationData* train,
                                     const engine::DataTree* tree,
                                     const engine::TokenPageTree* pages = nullptr);

// The chain's view of unit `unit` of task `task` for the tile phase, from the task's `bundle`
// (its blob id must be the task's spec_hash): the step's plan (PlanStepTiles with the task's
// model, the unit's inner optimizer, the batch size and its micro-batches), the task's seed, the
// unit's stream and
// the data root. What the ledger derives when a dispute opens with a bundle (the tile counts,
// SetTilePhase) and when it rules a tile (RefereeTile); a node calls it to build what the ledger
// will check. InvalidArgument for a bundle that is not the task's; FailedPrecondition (naming
// why, `where` first) for a task the tile phase does not serve: tolerance mode, a classification
// task without a data root, a layer PlanStepTiles cannot plan. The plan comes from
// the spec's shapes alone, so a model of any size is planned without allocating it. A token task
// without a data root is served, but the operators that read its batch's tokens (encoded, the loss,
// logits.grad, wte's gradient) are opaque in its plan (TokenOpsOpaque): nothing proves the tokens.
// (No dispute reaches either case on chain: a verifying chain refuses an exact-mode task without a
// data root, ValidateTaskTerms.)
Result<TileRuleContext> TileContextOf(const TaskRecord& task, const WorkUnit& unit,
                                      const std::string& bundle, const std::string& where);

// The most bytes of training state a unit of a task with these params holds, from what its
// record pins: params.model_bytes (its weights, 4 x the bundle's parameter count, which every node
// checks against the bundle: node::CheckBundleMatchesLedger) and up to two optimizer moments of
// their size (AdamW's m and v; SGD keeps one momentum buffer or none). Without the bundle the
// ledger does not know the optimizer, so it counts the most any keeps. Saturating.
uint64_t MaxUnitStateBytes(const TaskParams& params);

// The largest unit state (MaxUnitStateBytes) whose whole step the ledger rules from a witness
// without the bundle (RefereeStep: the witness carries the state): half of kMaxWitnessBytes, the
// other half for the step's examples and the bundle, as for a stage (kMaxStageWitnessMemory).
// A model of up to about 350k parameters.
inline constexpr uint64_t kMaxStepWitnessState = kMaxWitnessBytes / 2;

// Whether a mismatch (RevealVerdict) or a challenge (ChallengeUnit) that opens a dispute on a
// unit of a task with these params must carry the task bundle: an exact-mode task with a data
// root, not trained in pipeline stages (their rule is MismatchNeedsBundle's), that is either a
// token task (a data root over its pages, params.data_page_tokens) or a classification task
// whose state may be over kMaxStepWitnessState. The ledger does not execute a token task's whole
// step (RefereeStep reads examples), and a whole step of a larger classification model may have
// no witness that fits, so a dispute played over whole steps could only be ruled by the genesis
// key or end undecided; with the bundle it plays the operator and tile phases and ends at a tile
// (RuleTile) or at a whole step ruled from roots (RuleRoots). The ledger refuses the transaction
// without it; every node sends it (node/roles/disputes.h, MismatchBundle). A bundle TileContextOf
// refuses with FailedPrecondition (a plan the tile phase does not serve) still opens the dispute,
// over whole steps.
bool DisputeNeedsBundle(const TaskParams& params);

// Why the ledger cannot replay a unit's segment from a SegmentWitness (ExecuteSegmentWitness:
// ProveFraud, ProveMerits) of a task with these params, or nullptr where it can: an exact-mode
// task with a data root (over examples or token pages). A pipeline stage's step is another
// witness (ProveFraud's own rule).
const char* SegmentReplayRefusal(const TaskParams& params);

// Why a whistleblower's dispute on a unit of a task with these params cannot be ruled on its
// merits (ProveMeritsTx), or nullptr where it can: SegmentReplayRefusal's tasks, a pipeline task
// (ProveMerits carries a segment witness, not a stage step's), and a task whose unit state
// (MaxUnitStateBytes) may be over kMaxStepWitnessState, whose segment witness (the start state,
// then the segment's batches) may not fit a transaction. The one rule for both ends: the ledger
// refuses ProveMerits on such a task, and a solver's silence in a whistleblower's dispute there
// opens no merits window (protocol::Merits::kMeritsNotShowable): it settles at once as a loss by
// silence alone, not holding its round `dispute_response_blocks` more blocks for nothing
// (docs/verification.md, "A solver silent in a whistleblower's dispute"). A node sends
// ProveMerits only where this is nullptr.
const char* ProveMeritsRefusal(const TaskParams& params);

// A stage unit's claim that the stage served nothing for the step (the `unserved` finding: the
// claim's replayed_end is StageUnservedLeaf of its solver_end). Its dispute is played over the
// whole step: the tile phase needs both parties to trace the step from the stage's served
// evidence, and the challenger has none, so it could not answer. A stage that does serve its step
// posts its whole-step witness (RefereeStageStep) and wins; one that does not loses by the
// referee's deadline (RuleUnpostedStageStep), within kMaxStageWitnessMemory. Over it the stage
// posts its evidence in pieces (stage_serve.h, ServeStageEvidenceTx) by the end of a serving
// window, or loses then.
bool UnservedStageClaim(const TaskParams& params, const MismatchClaimField& claim);

// Whether the mismatch or challenge `claim` on unit `index` must carry the bundle. A unit of a
// task that is not a pipeline's: DisputeNeedsBundle. A pipeline stage's: an exact-mode task with a
// data root whose stage is over kMaxStageWitnessMemory (!LedgerRulesStageStep), whatever its
// model (a GPT's stage or a sequential model's: the tile phase plans both), so that only its tile
// phase rules it and never the genesis key, unless the claim is an unserved or a continuity one,
// which must not carry it (UnservedStageClaim, ContinuityStageClaim: both are played over the
// whole step and ruled from their own witnesses). A stage within the bound may be played either way: both are
// ruled by the ledger (RefereeTile, RefereeStageStep).
bool MismatchNeedsBundle(const TaskParams& params, uint32_t index, const MismatchClaimField& claim);

// A party's move in phases 2-4 of a dispute (protocol::DisputeQuery of stage operators, tiles or
// reduction) from its own run of the disputed step: `state_input` is the state hash the step
// starts from (C_0), `trace` that run's OpTrace of the step (keep_values; it follows ctx.plan),
// `batch` its batch. `hash` for DisputePost; with `children`, `left` and `right` for
// DisputeChildren. What every party (the node's dispute role, tests) posts, so an honest party's
// moves are the true ones by construction. InvalidArgument for a query of another stage or out of
// the plan's range.
struct DisputeMoveAnswer {
  Hash256 hash;
  bool children = false;
  Hash256 left, right;
};
Result<DisputeMoveAnswer> AnswerTileQuery(const TileRuleContext& ctx,
                                          const protocol::DisputeQuery& query,
                                          const Hash256& state_input, const engine::OpTrace& trace,
                                          const engine::Batch& batch);

// Makes the operators of a token plan that read the batch's tokens opaque, with `why`: what
// TileContextOf does for a token task without a data root.
void TokenOpsOpaque(engine::TilePlan* plan, const std::string& why);

// The tile phase of a dispute over steps of `plan`: the tile count of every operator (0 for the
// step's input state and for an operator without a footprint yet, which the whole-step referee
// rules) and its reduction blocks.
void SetTilePhase(const engine::TilePlan& plan, protocol::DisputeConfig* config);

// The correct output for `task` (a tile task of the referee stage) in the form the parties
// posted (RefereeTask: the tile's leaf, or TileHash of the next partial sum), computed from
// `witness` alone. InvalidArgument, naming what is wrong, when the witness does not check out:
// outputs that do not chain to the agreed C_{j-1}; an input tile that is not the footprint's (a
// wrong operator or tile index), of an operator not agreed to (j or later), or with a wrong
// proof; an example that is not the batch's or not proven against the data root; token pages that
// are not the ones the rows read, or not proven against the data root; a partial sum
// that is not the agreed one. FailedPrecondition when the task is not a tile task of this plan.
Result<Hash256> RuleTile(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                         const TileWitness& witness);

// The whole steps of a tile-phase game that are ruled from roots (protocol::RefereeRoots), with
// no step executed and no key: RefereeTile carries a TileWitness that holds only `outputs`, a
// prefix of the step's operator output roots (at most 32 bytes an operator: 21 KB for the 10M
// GPT's 655), and RuleRoots computes the correct output:
//   kRootsChainEnd  outputs = out_1..out_n, which must chain from the step's agreed input state
//                   hash (task.input) to the agreed C_n (task.chain_end); the correct state
//                   after the step is StateHashOfRoots(step, seed, stream, the last k outputs)
//                   (k: the plan's input-state operators; the step leaves the same tensors, in
//                   the same order, as its last k operators): DisputeGame::Rule;
//   kRootsOperator  outputs = out_1..out_k, the agreed input state's tensor roots, which must
//                   give StateHashOfRoots(step - 1, seed, stream, outputs) == task.input; the
//                   correct C_j of the disputed input-state operator j is
//                   OperatorChainHash(task.operator_input, outputs[j - 1]):
//                   DisputeGame::RuleOperator.
// InvalidArgument (naming what) for a witness that does not check out: roots that do not chain
// to the agreed C_n or do not hash to the agreed input state, a wrong count, input tiles,
// examples, pages or a partial sum. FailedPrecondition for a task that is not ruled from roots:
// not a roots task, or (kRootsOperator) an operator computed by the step without a footprint
// (RulesFromRoots is false: the whole step decides).
Result<Hash256> RuleRoots(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                          const TileWitness& witness);
// The step's input-state operators ("in.<name>"): the plan's first k, one per state tensor. A
// pipeline stage's plan follows them with what it received ("recv.<kind>", also kTileOpState,
// TileOp::received), which are not of its state: they are not counted.
size_t StateOperators(const engine::TilePlan& plan);
// Whether RuleRoots rules `task` on this plan: a kRootsChainEnd task, or a kRootsOperator task
// whose operator is of the step's input state (engine::TileOpKind::kTileOpState).
bool RulesFromRoots(const engine::TilePlan& plan, const protocol::RefereeTask& task);

}  // namespace meshlearn::ledger
