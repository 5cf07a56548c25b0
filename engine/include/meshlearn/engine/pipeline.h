// Micro-batches and pipeline stages: the engine side of pipeline-parallel training (issue 15).
//
// A training step of batch B may run as M micro-batches of B / M rows (train.micro_batches). The
// step's loss is the mean of the micro-batch means (equal sizes: the batch mean); each
// micro-batch's backward pass scales the logits' gradient by MicroBatchLossScale(M) / (B / M), as
// the kernels compute it, and adds into the parameter gradients; the optimizer runs once, after
// the last micro-batch. The fixed order, which every party follows:
//   1. zero the gradients (and the GPT head's separate wte gradient buffer);
//   2. for m = 0, 1, ..., M-1: forward and backward of micro-batch m (rows [m B/M, (m+1) B/M) of
//      the step's batch), each parameter gradient += that micro-batch's chain;
//   3. GPT: wte.grad[i] = wte.grad[i] + head_grad[i] (AddTiedHeadGrad). The LM head's gradient
//      of the tied embedding accumulates in its own buffer over the micro-batches, the embedding
//      lookup's in wte.grad, and the two are added once: a pipeline's last stage holds the head
//      and its first stage wte, and this is the one order both a pipeline and one process can
//      follow;
//   4. the global gradient norm: SumGradSquares over the parameters in model order (a pipeline
//      chains the running float from stage 0 to stage S-1), then clipping and the update.
// M = 1 is today's step bit for bit (StepOnBatch keeps its code path). Dropout masks of
// micro-batch m use the stream (step << 16 | layer) + (m << 48).
//
// A pipeline cuts the model into S contiguous stages (ModelPart ranges over the cut layers: a
// sequential model's layers, a GPT's blocks with the embeddings in stage 0 and ln_f + head in
// stage S-1). A Stage holds only its layers' parameters and optimizer state and runs
// ForwardPart / BackwardPart of the same model code on each micro-batch. RunPipelineStep runs S
// stages of one process in GPipe order: every micro-batch's forward pass through every stage,
// then the backward passes in increasing micro-batch order (each stage accumulates its gradients
// in the order of step 2 above), then the end of the step:
//   a. GPT, S > 1: stage S-1 sends its head's wte gradient to stage 0, which adds it (step 3);
//   b. the gradient sum of squares runs from stage 0 to stage S-1 (step 4); every stage takes
//      norm = sqrt(total) and applies its update;
//   c. GPT, S > 1: stage 0 sends the updated wte to stage S-1 (its copy for the head).
// Its parameters after any number of steps equal, bit for bit, those of the unsplit model
// trained by StepOnBatch with the same M (the oracle of issue 15; pipeline_test.cc).
//
// Every tensor that crosses a stage boundary is content-addressed (TensorHash) and listed in the
// step's transfers, so a stage can commit the hash of everything it received and sent.
//
//   ML_ASSIGN_OR_RETURN(PipelineCut cut, MakeCut(spec, {0, 2, 4, 6}));   // 3 stages
//   std::vector<std::unique_ptr<Stage>> stages;
//   for (int s = 0; s < cut.stages(); ++s) stages.push_back(*Stage::Create(spec, opt, cut, s, M));
//   InitPipeline(stages, seed);
//   PipelineStepResult r = RunPipelineStep(stages, batch, step, dropout_seed);
//
// Thread safety: like Model, one thread at a time per Stage; the kernels use the thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/train.h"

namespace meshlearn::engine {

// ---- Micro-batches.

// Rows [m B/M, (m+1) B/M) of `batch` for m = 0..M-1. InvalidArgument when M < 1 or M does not
// divide the batch size (naming both).
Result<std::vector<Batch>> SplitBatch(const Batch& batch, int64_t micro_batches);
// The dloss each micro-batch's backward pass gets: 1 / M (1 for M = 1).
float MicroBatchLossScale(int64_t micro_batches);
// wte.grad[i] = wte.grad[i] + head_grad[i]: the end of a GPT's micro-batched step (step 3 above).
void AddTiedHeadGrad(Tensor& wte_grad, std::span<const float> head_grad);

// ---- Cuts.

// Stage s holds cut layers [bounds[s], bounds[s+1]); bounds[0] = 0, bounds[S] = CutLayerCount.
struct PipelineCut {
  std::vector<int64_t> bounds;
  int stages() const { return static_cast<int>(bounds.size()) - 1; }
  ModelPart part(int stage) const { return {bounds[stage], bounds[stage + 1]}; }
};
// A cut from its S+1 bounds. InvalidArgument (prefixed by `where`) unless 0 = b0 < b1 < ... <
// bS = CutLayerCount(spec): the message names the bound at fault and the fix.
Result<PipelineCut> MakeCut(const ModelSpec& spec, std::vector<int64_t> bounds,
                            const std::string& where = "pipeline cut");

// What one stage costs at a step of `batch` samples in M micro-batches (GPipe keeps the
// activations of all M in flight).
struct StageCost {
  int64_t parameters = 0;       // weights the stage holds (not the GPT head's copy of wte)
  uint64_t flops = 0;           // training FLOPs of one step (all micro-batches)
  double param_bytes = 0;       // weights, their gradients, and a GPT last stage's wte copy +
                                // head gradient
  double optimizer_bytes = 0;   // moments (adamw 2, sgd with momentum 1 per weight)
  double activation_bytes = 0;  // M micro-batches of batch / M samples (LayerCosts estimate)
  double total_bytes() const { return param_bytes + optimizer_bytes + activation_bytes; }
};
// Per-stage costs of `cut` (from LayerCosts: one derivation). `seq_len`: GPT tokens per sample
// (0 = block_size). REQUIRES: micro_batches divides batch.
Result<std::vector<StageCost>> CutCosts(const ModelSpec& spec, const OptimizerSpec& optimizer,
                                        const PipelineCut& cut, int64_t batch, int64_t seq_len,
                                        int64_t micro_batches);

// A GPT's tied embedding wte and its gradient, in bytes (2 x 4 x vocab_size x n_embd): what the
// last stage holds beside its own parameters (its head's copy, CutCosts) and what travels between
// stages 0 and S-1 each step (a stage node's step tensors, node::StageTermsOf). 0 for a model
// without a tied embedding.
uint64_t TiedWeightAndGradBytes(const ModelSpec& spec);

// What one step moves across each boundary of `cut`, in bytes: entry s (s = 0..S-2) is the
// boundary between stages s and s+1, the activations stage s sends forward and the gradients of
// them stage s+1 sends back for each of the M micro-batches, 4 bytes a float:
//   2 x 4 x M x PartInputFloats(stage s+1, batch / M samples, seq_len)
// (RunPipelineStep's kTransferActivation and kTransferActivationGrad transfers, and the stage
// plane's pushes of them: pipeline_test.cc checks the sum). The end-of-step values are left out:
// the gradient sums are 4 bytes, and a GPT's tied weight and its gradient travel between stages 0
// and S-1, whichever nodes hold the stages between. The ledger's link cost of a boundary
// (TaskParams::stage_boundary_bytes, protocol::PlaceStages). `seq_len`: GPT tokens per sample (0
// = block_size). Errors: the cut's (MakeCut), or micro_batches < 1 or not dividing batch.
Result<std::vector<uint64_t>> CutBoundaryBytes(const ModelSpec& spec, const PipelineCut& cut,
                                               int64_t batch, int64_t seq_len,
                                               int64_t micro_batches);

// The contiguous cut into `stages` stages minimising the largest stage's FLOPs; among those, the
// largest stage's memory (CutCosts total_bytes); among those, the sum of the squared stage FLOPs
// (the rest as even as the largest allows); among those, the lexicographically smallest bounds.
// Only cuts whose every stage holds a layer with parameters are considered (a stage without one
// trains nothing: TaskPipelineCut refuses it). Deterministic (integer FLOPs and byte counts;
// dynamic programming over suffixes). An InvalidArgument when stages < 1, stages >
// CutLayerCount, or stages > the layers with parameters (naming both and the fix).
Result<PipelineCut> ChooseCut(const ModelSpec& spec, const OptimizerSpec& optimizer, int stages,
                              int64_t batch, int64_t seq_len, int64_t micro_batches);

// The cut of a task's pipeline of `stages` stages: `cut` when given (MakeCut, and every stage
// must hold a layer with parameters: a lone relu, pool, dropout or flatten stage trains nothing,
// and the ledger could not rule its disputes), else ChooseCut at the task's batch size, seq_len
// and micro_batches. Errors name "<task file>: network.cut" or "network.stages", and the fix (for
// a stage without parameters: the stage, its layers and ChooseCut's cut of as many stages).
// REQUIRES: the task's model is complete (a GPT's vocabulary filled in from its data: use the
// trainer's task).
Result<PipelineCut> TaskPipelineCut(const TaskSpec& task, int stages,
                                    const std::vector<int64_t>& cut);

// ---- Content-addressed transfers.

// BLAKE2b("meshlearn.pipeline.tensor.v1", element count, raw little-endian float32 bytes).
Hash256 TensorHash(std::span<const float> values);
// The tile grid (tile.h) a tensor of `floats` crossing a stage boundary is committed in beside its
// TensorHash (its signed record's tiled root): rows of `cols` floats (a GPT's boundary tensors
// are rows of n_embd: the grids PlanStageStepTiles gives the received tensors), or one row when
// cols is 0 or does not divide `floats` (the one-float sums).
TileGrid StageTensorGrid(int64_t floats, int64_t cols);

enum class TransferKind {
  kTransferActivation = 0,  // stage s -> s+1: output activations of micro-batch m
  kTransferActivationGrad,  // stage s+1 -> s: d loss / d those activations
  kTransferTiedHeadGrad,    // stage S-1 -> 0: the head's wte gradient (end of step)
  kTransferGradSquares,     // stage s -> s+1: the running gradient sum of squares (1 float)
  kTransferTiedWeight,      // stage 0 -> S-1: wte after the update (and at the start)
};
const char* TransferKindName(TransferKind kind);

struct Transfer {
  TransferKind kind = TransferKind::kTransferActivation;
  int from = 0, to = 0;      // stage indices
  int64_t step = 0;          // 0-based step index (the state's counter before the step)
  int64_t micro_batch = -1;  // -1: not per micro-batch
  int64_t floats = 0;
  Hash256 hash;  // TensorHash of what was sent; the receiver checks it
};

// ---- Stages.

// The name of a GPT's tied embedding (its first parameter, model.cc): a later stage's head reads
// a copy of it, and the head's gradient of it is traced as "<kGptWteName>.head.grad".
inline constexpr char kGptWteName[] = "transformer.wte.weight";

class Stage {
 public:
  // Stage `index` of `cut` with `micro_batches` micro-batches per step: the model part, its
  // optimizer (zeroed state), M tapes. InvalidArgument on a bad index or model part.
  static Result<std::unique_ptr<Stage>> Create(const ModelSpec& model,
                                               const OptimizerSpec& optimizer,
                                               const PipelineCut& cut, int index,
                                               int64_t micro_batches);
  // The same stage holding `saved` (LoadCheckpoint of the stage's SaveCheckpoint; Restore's
  // checks) in place of a fresh state: no second copy of the stage's tensors is allocated (a
  // verifier's replay, ledger/stage_replay.h), as Create then Restore would hold it.
  static Result<std::unique_ptr<Stage>> Create(const ModelSpec& model,
                                               const OptimizerSpec& optimizer,
                                               const PipelineCut& cut, int index,
                                               int64_t micro_batches, TrainState saved);

  int index() const { return index_; }
  bool first() const { return state_.model->has_input(); }
  bool last() const { return state_.model->has_loss(); }
  int64_t micro_batches() const { return micro_batches_; }
  // The stage's training state: its part of the model and its optimizer (StateHash covers
  // exactly the stage's parameters and moments).
  TrainState& state() { return state_; }
  std::vector<Param>& params() { return state_.model->params(); }

  // The stage's step as operators (op_trace.h), for the tile rule (tile_rule.h's
  // PlanStageStepTiles gives the order and the names): while set, BeginStep records the input
  // state (and a later last stage's copy of wte, which the caller sets before BeginStep), Forward
  // and Backward record what they received and micro-batch m's operators (joined in micro-batch
  // order when the step's end begins, whatever order the passes ran in), AddTiedHeadGrad,
  // SumGradSquares and FinishStep what they received and computed, and Update the output state.
  // The caller owns `trace` (keep_values as it chooses) and gives a fresh one each step.
  void set_op_trace(OpTrace* trace) { trace_ = trace; }

  // Zeroes the gradients (and the head's wte gradient) for a new step.
  void BeginStep();
  // Forward of micro-batch m; `input` (moved in, kept until Backward(m)) is the previous stage's
  // output (empty for the first stage). Returns the output activations (valid until the next
  // Forward(m)); for the last stage, an empty span (loss(m) holds the micro-batch's loss).
  // `input` comes from a peer: a wrong size (or m out of range) is an InvalidArgument naming
  // both sizes, and nothing runs.
  Result<std::span<const float>> Forward(int64_t m, const Batch& micro_batch,
                                         std::vector<float> input, const ForwardOptions& opts);
  float loss(int64_t m) const { return losses_[static_cast<size_t>(m)]; }
  // Backward of micro-batch m from d loss / d output (empty for the last stage). Returns
  // d loss / d input (empty for the first stage), valid until the next Forward(m).
  // InvalidArgument (nothing runs) when micro-batch m had no Forward this step or `output_grad`
  // (from a peer) has the wrong size.
  Result<std::span<const float>> Backward(int64_t m, std::vector<float> output_grad);

  // End of step. A GPT's last stage: the head's wte gradient of this step (all micro-batches).
  std::span<const float> tied_head_grad() const;
  // A GPT's first stage: adds the head's wte gradient (AddTiedHeadGrad).
  void AddTiedHeadGrad(std::span<const float> head_grad);
  // `running` + this stage's gradient squares (SumGradSquares, model order).
  float SumGradSquares(float running);
  // The optimizer update of 0-based step `step` with the global norm; then state().step = step+1.
  void Update(int64_t step, float grad_norm);
  // The end of the step from the total sum of squares (the last stage's SumGradSquares): norm =
  // sqrt(total), Update(step, norm); returns the norm.
  float FinishStep(int64_t step, float total);
  // Replaces the stage's state by `saved` (LoadCheckpoint of this stage's SaveCheckpoint): the
  // same model part and optimizer, else InvalidArgument naming what differs. A GPT's last stage
  // then needs wte again (ShareTiedWeight).
  Status Restore(TrainState saved);
  // A GPT's first stage: wte's values. A GPT's last stage (without wte): sets its copy.
  std::span<const float> tied_weight_source() const;
  void SetTiedWeight(std::span<const float> wte);

 private:
  Stage() = default;

  int index_ = 0;
  int64_t micro_batches_ = 1;
  TrainState state_;
  std::vector<std::unique_ptr<Tape>> tapes_;      // one per micro-batch
  std::vector<Batch> batches_;                    // micro-batch m, kept for its backward pass
  std::vector<std::vector<float>> inputs_;        // received activations of micro-batch m
  std::vector<std::vector<float>> output_grads_;  // received gradients of micro-batch m
  std::vector<float> losses_;
  std::vector<bool> forwarded_;  // micro-batch m ran Forward this step (Backward may run)
  Tensor head_grad_;             // GPT last stage: the head's wte gradient

  // Tracing (set_op_trace): the step's trace, each micro-batch's operators until the end of the
  // step joins them, and whether it has.
  void JoinMicroBatchTraces();
  bool Clipped() const;
  OpTrace* trace_ = nullptr;
  std::vector<OpTrace> micro_traces_;
  bool traces_joined_ = true;
};

// Initialises every stage's parameters as Model::Init(seed) initialises the whole model, and
// gives a GPT's last stage stage 0's wte. Returns the transfers (the wte copy).
std::vector<Transfer> InitPipeline(std::span<const std::unique_ptr<Stage>> stages, uint64_t seed);

// A GPT cut into two or more stages: stage 0's wte into the last stage's copy (after a resume).
// Returns the transfer (none for other models).
std::vector<Transfer> ShareTiedWeight(std::span<const std::unique_ptr<Stage>> stages);

struct PipelineStepResult {
  float loss = 0;                   // mean of the micro-batch losses (StepOnBatch's)
  float grad_norm = 0;              // before clipping
  std::vector<Transfer> transfers;  // in the order they happened
};

// One training step of `stages` (a whole cut, in order) on `batch`, at 0-based step
// `state().step` of stage 0 (every stage's counter must agree), in GPipe order (top of file).
// REQUIRES: the stages' micro_batches divide batch.size.
PipelineStepResult RunPipelineStep(std::span<const std::unique_ptr<Stage>> stages,
                                   const Batch& batch, uint64_t dropout_seed);

}  // namespace meshlearn::engine
