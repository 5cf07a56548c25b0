// One training step of a work unit, rebuilt from nothing but public, hash-checked inputs: what the
// ledger runs when it referees a dispute that has narrowed to one step (docs/verification.md,
// "Referee"), and what a node uses to build the witness it posts for that ruling.
//
// Step numbering: "step s" (s >= 1) turns the state after s - 1 steps (TrainState::step == s - 1)
// into the state after s steps. Its batch and its dropout masks are those of the 0-based step
// index s - 1, the state's counter before the step (Trainer::Step draws BatchForStep(state.step)).
//
// A unit's step s is a pure function of
//   - the task's model and inner optimizer (the task bundle; UnitOptimizerSpec for the unit's
//     round), its batch size and seed;
//   - the unit's stream (protocol::UnitSeed) and s;
//   - the training state after step s - 1 (parameters, optimizer moments), whose StateHash the
//     two parties agreed on;
//   - the batch of step s: examples of the training set at BatchIndices(seed, stream, n, B, s - 1),
//     each proven against the task's data root (DataTree) with a Merkle proof.
// So anyone holding these recomputes the state after step s bit for bit, as Trainer::Step does.
//
//   // A node building a witness for step s (its trainer is at state s - 1):
//   std::vector<float> flat = FlatState(trainer->state());
//   DataTree tree(trainer->data().train);           // once per task
//   for (int64_t i : BatchIndices(seed, stream, tree.size(), B, s - 1)) tree.Prove(i) ...
//
//   // The referee (ledger), with the B proven examples in batch order in `examples`:
//   ML_ASSIGN_OR_RETURN(TrainState st, StateFromFlat(model, UnitOptimizerSpec(opt, scale), flat,
//                                                    s - 1, seed, stream));
//   if (StateHash(st) != agreed) ...                // the witness is not the agreed state
//   StepOnBatch(st, MakeClassificationBatch(examples, {0, ..., B-1}), DropoutSeed(seed, stream));
//   Hash256 output = StateHash(st);                 // the state after step s
//
// Thread safety: free functions on caller-owned values; DataTree is immutable after construction
// (Prove may be called from several threads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/data.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/train.h"

namespace meshlearn::engine {

// The id a network task's unit streams derive from (protocol::UnitId::content_id): a hash of the
// task's name, seed and model spec. Solvers, verifiers and the ledger all use this, never the
// ledger's task id, so a network run and an in-process run (node/local_diloco.h) train the same
// streams.
Hash256 TaskContentId(const TaskSpec& task);

// The inner optimizer of a work unit: the task's [optimizer] at a constant rate lr x lr_scale, no
// warm-up (Trainer::StartUnit's rule; both use this function). StartUnit checks that lr_scale is
// in (0, 1]; this function does not.
OptimizerSpec UnitOptimizerSpec(const OptimizerSpec& task_optimizer, double lr_scale);

// The dropout seed of every step of stream `stream` (Trainer::Step's rule).
uint64_t DropoutSeed(uint64_t task_seed, uint64_t stream);

// What a traced step records first and last (op_trace.h): its input state ("in.<name>": every
// parameter, then every optimizer state tensor), and its output state (the same tensors after the
// update, under their own names), each in its tile grid. A pipeline stage's step records its own
// the same way (pipeline.h's Stage).
void RecordStepInputState(TrainState& state, OpTrace& trace);
void RecordStepOutputState(TrainState& state, OpTrace& trace);

// One optimizer step of `state` on `batch` at step state.step, then state.step += 1: exactly what
// Trainer::Step does after drawing its batch (Trainer::Step calls this). Records into the model's
// OpTrace when one is attached. Returns the batch loss; stores the gradient norm before clipping
// in *grad_norm when given (Trainer::last_grad_norm). `micro_batches` (the task's
// train.micro_batches) > 1 runs the step as that many micro-batches in pipeline.h's fixed order;
// 1 is the plain step. REQUIRES: state has an optimizer; micro_batches divides batch.size.
float StepOnBatch(TrainState& state, const Batch& batch, uint64_t dropout_seed,
                  float* grad_norm = nullptr, int64_t micro_batches = 1);

// StateHash(state) of the state a traced step has just left in `state`, from the tiled roots of
// its output state that the step's trace recorded last (op_trace.h), without hashing the state's
// tensors again: a party that traces a step (a dispute's disputed step) pays one hash pass over
// the state instead of two. CHECK-fails when the trace does not end with the state's tensors
// (names and count). REQUIRES: `trace` recorded the step that left `state` (StepOnBatch with it
// attached), and neither changed since.
Hash256 StateHashOfTracedStep(TrainState& state, const OpTrace& trace);

// How many floats FlatState holds for a model of `num_params` parameters trained with
// `optimizer`: the parameters and the optimizer's state (adamw: m and v; sgd: a momentum buffer
// when momentum > 0). What a witness of the state weighs, before any model is built.
int64_t FlatStateSize(int64_t num_params, const OptimizerSpec& optimizer);

// Every float of the training state in StateHash order: each parameter (model order), then each
// optimizer state tensor (Optimizer::State order). REQUIRES: state has an optimizer.
std::vector<float> FlatState(TrainState& state);

// A training state of `model` with optimizer `optimizer`, its tensors filled from `flat`
// (FlatState's layout) and its counters set. InvalidArgument when the spec does not build or
// `flat` has the wrong length (the message names both lengths).
Result<TrainState> StateFromFlat(const ModelSpec& model, const OptimizerSpec& optimizer,
                                 std::span<const float> flat, int64_t step, uint64_t seed,
                                 uint64_t stream);

// Dataset indices of the batch of a classification unit at 0-based step index `step` (the state's
// counter before the step; BatchSampler's rule). Builds the epoch's permutation: O(n).
std::vector<int64_t> BatchIndices(uint64_t seed, uint64_t stream, int64_t n, int64_t batch,
                                  int64_t step);

// The most rows a task's batch has (train.batch_size's range in a task file). BatchIndices and
// WindowStarts allocate one entry a row, so whoever draws a batch of a size it was given (the
// ledger's tile rule, from a task's bundle) refuses a larger one first.
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 20;

// The leaf of training example `index` over the example as the engine trains on it (after
// normalisation). An example of at most kExampleChunkFloats floats: BLAKE2b("meshlearn.example",
// index, y, x as little-endian float32). A larger one: ChunkedExampleLeaf over the root of its
// chunk tree (ExampleChunkRoot), so that a tile reading a few of its columns is proven by those
// chunks alone (docs/verification.md, "The witness bound, and how it depends on the shapes").
Hash256 ExampleLeaf(uint64_t index, std::span<const float> x, int32_t y);

// Examples of more than kExampleChunkFloats floats (a 3 x 32 x 32 image and larger) are committed
// in chunks of that many consecutive floats, the last one short: 32 examples' whole floats would
// not fit a tile's witness past about 1,800 floats an example, and 1024 keeps every example of at
// most 1024 floats (Fashion-MNIST's 784) under its unchunked leaf, so those data roots stay.
inline constexpr int64_t kExampleChunkFloats = 1024;

// The number of chunks of an example of `floats` floats: 0 when it is not chunked (at most
// kExampleChunkFloats floats), else floats / kExampleChunkFloats rounded up.
int64_t ExampleChunks(int64_t floats);

// The leaf of chunk `chunk` of an example: BLAKE2b("meshlearn.example_chunk", chunk, its floats
// as little-endian float32).
Hash256 ExampleChunkLeaf(uint64_t chunk, std::span<const float> floats);

// The floats of chunk `chunk` of `x`. REQUIRES: 0 <= chunk < ExampleChunks(x.size()).
std::span<const float> ExampleChunk(std::span<const float> x, int64_t chunk);

// The Merkle root (base/merkle.h) over ExampleChunkLeaf of each chunk of `x`, in order, and the
// proof of one chunk against it. REQUIRES: ExampleChunks(x.size()) > 0; 0 <= chunk < that.
// Each hashes every chunk of `x`; to prove several chunks of one example, hash them once
// (ExampleChunkLeaves) and take the root and the proofs from the leaves, the same bytes.
Hash256 ExampleChunkRoot(std::span<const float> x);
MerkleProof ProveExampleChunk(std::span<const float> x, int64_t chunk);
std::vector<Hash256> ExampleChunkLeaves(std::span<const float> x);
Hash256 ExampleChunkRoot(const std::vector<Hash256>& leaves);
MerkleProof ProveExampleChunk(const std::vector<Hash256>& leaves, int64_t chunk);

// The leaf of a chunked example `index` of `floats` floats and class `y` from the root of its
// chunk tree: BLAKE2b("meshlearn.example_chunked", index, y, floats, chunk_root). What the ledger
// checks a chunked example's proof with, from chunks it verified against `chunk_root`.
Hash256 ChunkedExampleLeaf(uint64_t index, int32_t y, uint64_t floats, const Hash256& chunk_root);

// The Merkle tree (base/merkle.h) over ExampleLeaf of every training example, in dataset order:
// its root is the task's data root (ledger TaskParams::data_root). Building hashes the whole
// training set once; each proof is then O(log n).
class DataTree {
 public:
  explicit DataTree(const ClassificationData& train);
  const Hash256& root() const { return root_; }
  int64_t size() const { return static_cast<int64_t>(leaf_count_); }
  // REQUIRES: 0 <= index < size().
  MerkleProof Prove(int64_t index) const;

 private:
  uint64_t leaf_count_ = 0;
  std::vector<std::vector<Hash256>> levels_;  // levels_[0]: leaf hashes (MerkleLeafHash)
  Hash256 root_;
};

// Token tasks' data leaves. The train token stream (TaskData::train_tokens, the stream
// WindowStarts draws from) is cut into pages of kTokenPageTokens consecutive tokens, the last one
// short; the Merkle tree (base/merkle.h) over TokenPageLeaf of every page, in order, has the
// task's data root as its root (TaskParams::data_root of a token task; num_examples is the
// stream's length). A batch row (b, t) of step s reads the token at position
// WindowStarts(...)[b] + t and its target at the next position: 32 consecutive rows lie in at most
// 3 pages (2 when the rows are of one sequence), so a tile's tokens cost 4 to 12 KiB with their
// proofs, whatever the stream's length. Pages of 1024 tokens: small enough that a tile's pages
// stay a few KiB, large enough that a stream of 2^30 tokens has a 20-level tree.
inline constexpr int64_t kTokenPageTokens = 1024;

// The leaf of page `page`: BLAKE2b("meshlearn.token_page", page, its tokens as little-endian
// int32).
Hash256 TokenPageLeaf(uint64_t page, std::span<const int32_t> tokens);

// The page tree of a token stream. Keeps a copy of the stream (to open pages). Immutable after
// construction.
class TokenPageTree {
 public:
  explicit TokenPageTree(std::span<const int32_t> tokens);
  const Hash256& root() const { return root_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_pages() const { return static_cast<int64_t>(leaves_.size()); }
  // REQUIRES: 0 <= page < num_pages().
  std::span<const int32_t> Page(int64_t page) const;
  MerkleProof Prove(int64_t page) const;

 private:
  std::vector<int32_t> tokens_;
  std::vector<Hash256> leaves_;  // TokenPageLeaf of each page
  Hash256 root_;
};

// The data root of a token stream: TokenPageTree(tokens).root().
Hash256 TokenDataRoot(std::span<const int32_t> tokens);

// The pages a batch's rows `rows` (indices b * T + t of a batch of sequences of T tokens) read:
// each row's token and its target, at WindowStarts(seed, stream, step, B, n_tokens, T)[b] + t and
// the position after. Increasing, each once. REQUIRES: n_tokens >= T + 1; rows < B * T.
std::vector<int64_t> TokenPagesOfRows(uint64_t seed, uint64_t stream, int64_t step, int64_t B,
                                      int64_t T, int64_t n_tokens,
                                      const std::vector<int64_t>& rows);

}  // namespace meshlearn::engine
