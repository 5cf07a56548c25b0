// Models built from a TOML spec: a sequential stack of layers (MLP, CNN) or a GPT-style decoder.
//
// Spec (the [model] table of a task file):
//
//   [model]                           # sequential (the default kind)
//   input = [1, 28, 28]               # per-sample input shape
//   [[model.layers]]
//   kind = "conv2d"                   # linear conv2d maxpool2d relu gelu flatten dropout layernorm
//   out = 32                          # linear: out features; conv2d: out channels
//   kernel = 5                        # conv2d/maxpool2d (maxpool stride defaults to kernel)
//   pad = 2                           # conv2d, default 0; stride default 1
//   init = "kaiming"                  # kaiming | xavier | normal (std = init_std) | uniform
//
//   [model]                           # GPT-2 style decoder (llm.c layout, nanoGPT names)
//   kind = "gpt"
//   n_layer = 2, n_head = 4, n_embd = 128, block_size = 64, vocab_size = 96
//
// The last layer of a sequential model produces the class logits (softmax cross-entropy loss);
// a GPT predicts the next token at every position (tied input/output embeddings).
//
// Parameters have stable names (PyTorch-compatible: "layers.3.weight" is nn.Sequential's
// "3.weight"; GPT names follow nanoGPT, "transformer.h.0.attn.c_attn.weight") and are initialised
// deterministically from (seed, parameter index) with Philox (see init.h).
//
// Thread-safety: a Model is used by one thread at a time; the kernels it calls use the engine's
// thread pool internally. Activations live in a Tape (the model's own for Forward/Backward) and
// are valid until the next Forward() on it.
//
// Parts: Model::CreatePart builds a contiguous range of the model's layers (a pipeline stage,
// pipeline.h) with only their parameters; Forward/Backward of a whole model are ForwardPart /
// BackwardPart over all of its layers, so a part runs exactly the whole model's code.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/config.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/tensor.h"

namespace meshlearn::engine {

struct LayerSpec {
  std::string kind;    // linear conv2d maxpool2d relu gelu flatten dropout layernorm
  int64_t out = 0;     // linear: out features; conv2d: out channels
  int64_t kernel = 0;  // conv2d, maxpool2d
  int64_t stride = 0;  // conv2d default 1; maxpool2d default = kernel
  int64_t pad = 0;     // conv2d
  double p = 0.0;      // dropout probability
  std::string init = "kaiming";
  double init_std = 0.02;  // for init = "normal"
  bool bias = true;
};

struct GptSpec {
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
};

struct ModelSpec {
  std::string kind = "sequential";  // "sequential" | "gpt"
  Shape input;                      // sequential: per-sample input shape
  std::vector<LayerSpec> layers;    // sequential
  GptSpec gpt;                      // gpt

  // Parses and validates the [model] table (shapes are checked by Model::Create).
  static Result<ModelSpec> FromConfig(const ConfigFile& model);
  // The [model] table of a TOML document (`what` names it in errors): a model written inline.
  static Result<ModelSpec> FromToml(std::string_view text, std::string what);
  // Compact JSON (stored in safetensors __metadata__ so a model file describes itself).
  std::string ToJson() const;
  static Result<ModelSpec> FromJson(const std::string& json, const std::string& what);
};

// One named parameter with its gradient (same shape).
struct Param {
  std::string name;
  Tensor value;
  Tensor grad;
};

// One mini-batch. Sequential models read `inputs` (B, input...) and `targets` (B) class ids;
// GPT models read `tokens` and `targets`, both (B, T) with T <= block_size.
struct Batch {
  int64_t size = 0;     // B
  int64_t seq_len = 0;  // T (GPT only)
  Tensor inputs;
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
};

struct ForwardOptions {
  bool train = false;         // keep activations for Backward(); apply dropout
  uint64_t dropout_seed = 0;  // dropout mask of layer l at step s: Philox(seed, s<<16 | l)
  uint64_t step = 0;
  // Micro-batch m of a step (train.micro_batches): its dropout stream is (s<<16 | l) + (m<<48),
  // so micro-batches draw different masks and micro-batch 0 draws today's.
  uint64_t micro_batch = 0;
};

// The dropout stream of layer `layer` at step `step`, micro-batch `micro_batch`:
// (step << 16 | layer) + (micro_batch << 48), the Philox counter's high half of every element of
// the layer's mask (kernels.h's DropoutForward). The one formula the model's forward and the tile
// rule's recompute of a dropout tile (tile_rule.h) draw from.
uint64_t DropoutStream(uint64_t step, uint64_t layer, uint64_t micro_batch);

struct BackwardOptions {
  // d(loss)/d(this batch's mean loss): the kernels scale the logits' gradient by dloss / B. A
  // step of M micro-batches passes MicroBatchLossScale(M) (pipeline.h), so the step's loss is the
  // mean of the micro-batch means.
  float dloss = 1.0f;
  // GPT: where the LM head adds its gradient of the tied embedding wte (V, C). nullptr: into
  // wte's own gradient (today's Backward). A micro-batched step and a pipeline's last stage keep
  // it apart and add it to wte's gradient once, after every micro-batch (pipeline.h).
  float* tied_head_grad = nullptr;
};

// A contiguous range [begin, end) of a model's cut layers: what one pipeline stage holds
// (pipeline.h). A sequential model is cut between its layers (0..layers.size()); a GPT between
// its blocks (0..n_layer): the part with begin 0 also holds the embeddings (wte, wpe), the part
// with end n_layer also holds ln_f and the LM head. end = -1 means "to the end".
struct ModelPart {
  int64_t begin = 0;
  int64_t end = -1;
};

// The number of cut layers of a spec (sequential: layers; GPT: n_layer).
int64_t CutLayerCount(const ModelSpec& spec);

// What training a model needs in memory, from its spec alone (nothing is allocated): the
// parameters, their gradients, the optimizer's moments and what one training step keeps at a
// batch size. The activations are an estimate (within a small factor); the rest is exact. For
// refusing what cannot fit before trying, instead of dying in std::bad_alloc.
struct MemoryEstimate {
  double parameters = 0;  // bytes of the weights
  double gradients = 0;
  double optimizer = 0;    // moments: 2 per weight for adamw, 1 for sgd with momentum
  double activations = 0;  // of one training step at the batch size
  int64_t num_parameters = 0;
  std::string largest;  // the spec key holding the most weights ("model.layers[1] (linear)")
  double total() const { return parameters + gradients + optimizer + activations; }
};

// `batch` and `seq_len` (GPT; 0 = block_size) of a training step; `optimizer_kind` "adamw" or
// "sgd" ("" = none: a model that is only evaluated). Errors: the spec's own (shapes).
Result<MemoryEstimate> EstimateMemory(const ModelSpec& spec, int64_t batch, int64_t seq_len,
                                      const std::string& optimizer_kind, bool sgd_momentum);

// What each cut layer of a model costs, from its spec alone (pipeline.h chooses cuts from these).
// GPT: cut layer l is block l; the embeddings (wte, wpe) are counted in layer 0 and ln_f with the
// LM head in the last, as they go with the first and the last stage. The head's matrix product
// with the tied wte counts as the last layer's FLOPs, wte's weights as layer 0's parameters.
struct LayerCost {
  std::string name;              // "model.layers[3] (linear)", "transformer.h.0 + embeddings"
  int64_t parameters = 0;        // weights the layer holds
  uint64_t flops = 0;            // training FLOPs per sample (forward + backward: 6 x MACs)
  double activation_floats = 0;  // floats a training step keeps per sample (ActivationFloats)
};
// `seq_len` (GPT; 0 = block_size): the tokens of one sample. Errors: the spec's own (shapes).
Result<std::vector<LayerCost>> LayerCosts(const ModelSpec& spec, int64_t seq_len);
// Training FLOPs of one sample of the whole model: the sum of LayerCosts' flops, and for a
// sequential model at least 6 x parameters (biases and norms have weights but no products).
// What a task's flops_per_sample is (node::EstimateFlopsPerSample calls it).
Result<uint64_t> TrainingFlopsPerSample(const ModelSpec& spec, int64_t seq_len);

// The width of the model's logits (classes, or the vocabulary), without allocating it.
Result<int64_t> ModelOutputs(const ModelSpec& spec);

// A parameter of the whole model as its spec plans it (nothing is allocated): its name, shape
// and where its values start in the model's flat vector (params() order, the layout of weights
// and deltas on the wire: Trainer::FlatParams). A pipeline stage node takes its stage's
// parameters from the round's global vector by these, without building the whole model.
struct PlannedParam {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // floats before it in the flat vector
};
// Errors: the spec's own (shapes). With a `part`: that part's parameters, as the stage holding it
// (Model::CreatePart) has them, offsets within the part's own flat vector (a pipeline stage's
// tile plan, tile_rule.h).
Result<std::vector<PlannedParam>> PlanParams(const ModelSpec& spec, ModelPart part = {});
// The tokens of one sample of a GPT step with `seq_len` (every "0 = block_size" of this header and
// tile_rule.h means this): `seq_len`, or the model's block_size where `seq_len` <= 0. Models
// without tokens: `seq_len` unchanged (unused).
int64_t SeqLenOrBlockSize(const ModelSpec& spec, int64_t seq_len);
// Floats of the input that part `part` of the model takes for `samples` samples of `seq_len`
// tokens (GPT; 0 = block_size): the part's Model::PartInputSize, from its spec alone (nothing is
// allocated). A pipeline stage holds what a peer sends it to that size (Stage::Forward; its
// gradient, Stage::Backward, has the size of the previous part's output, the same), so it is what
// crosses the boundary into the part (pipeline.h CutBoundaryBytes). Errors: the spec's own
// (shapes), or a part that is not a non-empty range of the cut layers.
Result<int64_t> PartInputFloats(const ModelSpec& spec, ModelPart part, int64_t samples,
                                int64_t seq_len);
// The whole model's parameter count, from its spec alone: what a created model's NumParameters()
// and the length of its flat vector are (the one count: EstimateMemory's num_parameters too).
Result<int64_t> CountParameters(const ModelSpec& spec);

// Bytes this machine can give a process now: $MESHLEARN_MEMORY_BYTES when set (a cap, for
// operators and tests), else MemAvailable from /proc/meminfo, else the free physical pages.
// `source` (optional) says which, for messages.
uint64_t AvailableMemoryBytes(std::string* source = nullptr);

// "1.5 GiB", "300.0 MiB".
std::string FormatBytes(double bytes);

// What one forward pass keeps for its backward pass (activations in an Arena, pointers into
// them). A model keeps one for Forward()/Backward(); a pipeline stage keeps one per micro-batch in
// flight (NewTape()). Opaque; each model kind defines its own.
class Tape {
 public:
  virtual ~Tape() = default;
  Arena arena;
};

class Model {
 public:
  virtual ~Model() = default;

  // Validates shapes; parameters are zero until Init() or a load. Refuses (ResourceExhausted,
  // naming the spec key and the machine's memory) a model whose weights and gradients do not
  // fit in AvailableMemoryBytes(), before allocating them.
  static Result<std::unique_ptr<Model>> Create(const ModelSpec& spec);
  // The same without the memory check, for code whose outcome must be the same on every machine
  // (the ledger executing a witness): the caller bounds the model's size itself, before
  // calling (StateFromFlat compares the planned parameter count with the floats it was given).
  static Result<std::unique_ptr<Model>> CreateUnchecked(const ModelSpec& spec);
  // A whole model to evaluate: its parameters' values alone, no gradients (every Param::grad is
  // empty; Backward is not for it). Refuses, as Create does, weights that do not fit.
  static Result<std::unique_ptr<Model>> CreateForEvaluation(const ModelSpec& spec);
  // A part of the model (a pipeline stage's layers): only the part's parameters are allocated,
  // under their full-model names and initialised as the full model initialises them. A GPT part
  // with the head but not the embeddings also holds a copy of wte (tied_weight()), which its
  // owner refreshes after every update. InvalidArgument when the range is empty or out of
  // bounds (naming both).
  static Result<std::unique_ptr<Model>> CreatePart(const ModelSpec& spec, ModelPart part);

  const ModelSpec& spec() const { return spec_; }
  const ModelPart& part() const { return part_; }
  bool has_input() const { return part_.begin == 0; }         // reads the batch's inputs/tokens
  bool has_loss() const { return part_.end == cut_layers_; }  // computes the loss
  // GPT parts with the head but without wte: the copy of wte the head reads. Else nullptr.
  Tensor* tied_weight() { return tied_weight_.size() > 0 ? &tied_weight_ : nullptr; }
  // Whether the model ties its input embedding to its output head (GPT).
  bool tied_head() const { return spec_.kind == "gpt"; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  int64_t NumParameters() const;
  // Number of classes (sequential) or vocabulary size (GPT): the width of a logits row.
  virtual int64_t NumOutputs() const = 0;

  // Deterministic initialisation: parameter i from Philox(seed, stream = i).
  void Init(uint64_t seed);
  void ZeroGrad();

  // Runs the model and the mean softmax cross-entropy loss over all targets.
  // REQUIRES: a whole model (not a part). `batch` stays alive until Backward().
  float Forward(const Batch& batch, const ForwardOptions& opts);
  // Logits of the last Forward: (B, classes) or (B*T, vocab).
  TensorView logits() const { return TapeLogits(*tape_); }
  // Accumulates d(loss)/d(param) into each Param::grad (call ZeroGrad() first).
  // REQUIRES: the last Forward() had opts.train.
  void Backward(const BackwardOptions& opts = {});

  // ---- Parts (pipeline stages). The same code runs a whole model and a part.
  std::unique_ptr<Tape> NewTape() const;
  // Runs the part's layers on `batch` (a micro-batch), starting from `input` (the previous
  // part's output; empty for a part with has_input()). Returns the mean loss when has_loss(),
  // else 0. `batch` and `input` must stay alive until BackwardPart() on the same tape.
  virtual float ForwardPart(Tape& tape, const Batch& batch, std::span<const float> input,
                            const ForwardOptions& opts) = 0;
  // The part's output activations after ForwardPart (a part without the loss): sequential
  // (B, out shape of layer end-1), GPT (B, T, C).
  virtual std::span<const float> PartOutput(const Tape& tape) const = 0;
  // Accumulates the part's parameter gradients from `output_grad` (d loss / d PartOutput; empty
  // for a part with has_loss()). REQUIRES: ForwardPart with opts.train on `tape`.
  virtual void BackwardPart(Tape& tape, std::span<const float> output_grad,
                            const BackwardOptions& opts) = 0;
  // d loss / d input after BackwardPart, for a part without has_input(); valid until the next
  // ForwardPart on `tape`.
  virtual std::span<const float> PartInputGrad(const Tape& tape) const = 0;
  // Floats of the input ForwardPart expects for B samples of T tokens (a part without
  // has_input(): the previous part's output), for checking what a peer sent.
  virtual int64_t PartInputSize(int64_t B, int64_t T) const = 0;

  // A Batch of `n` samples with this model's input shape (zeros), for tests and tools.
  Batch EmptyBatch(int64_t n, int64_t seq_len = 0) const;

  // Per-operator output hashes (op_trace.h): while set, Forward and Backward record every
  // operator's output in a fixed order. Not owned; nullptr (the default) records nothing.
  void set_op_trace(OpTrace* trace) { trace_ = trace; }
  OpTrace* op_trace() const { return trace_; }

 protected:
  // Per-parameter init rule, parallel to params_.
  struct InitRule {
    std::string kind;  // kaiming xavier normal uniform zeros ones
    double fan_in = 0, fan_out = 0, std = 0;
  };
  // REQUIRES: `part` resolved (0 <= begin < end <= CutLayerCount(spec)).
  Model(ModelSpec spec, ModelPart part)
      : spec_(std::move(spec)), part_(part), cut_layers_(CutLayerCount(spec_)) {}
  // Records the next parameter of the whole model (name, shape; its index in the whole model is
  // its init stream). A part keeps it only when `keep` (its layers'); the returned rule is then
  // the parameter's, else a scratch one. Memory is allocated by AllocateParams(), after Create
  // has checked that it fits.
  InitRule& AddParam(std::string name, Shape shape, bool keep = true);
  void AllocateParams(bool gradients = true);
  virtual TensorView TapeLogits(const Tape& tape) const = 0;
  virtual std::unique_ptr<Tape> MakeTape() const = 0;
  // The whole model's LayerCosts at T tokens (0 = block_size), from the shapes Build() recorded.
  virtual std::vector<LayerCost> Costs(int64_t T) const = 0;
  // Floats one training step keeps (activations, their gradients, scratch) for B samples of T
  // tokens: B x the sum of Costs(T)'s activation_floats. An estimate.
  double ActivationFloats(int64_t B, int64_t T) const;
  friend Result<std::vector<LayerCost>> LayerCosts(const ModelSpec&, int64_t);
  friend Result<uint64_t> TrainingFlopsPerSample(const ModelSpec&, int64_t);
  // The spec key holding the most weights, for messages.
  virtual std::string LargestKey() const = 0;
  int64_t PlannedParameters() const;
  MemoryEstimate PlannedMemory(int64_t B, int64_t T) const;  // without the optimizer
  friend Result<MemoryEstimate> EstimateMemory(const ModelSpec&, int64_t, int64_t,
                                               const std::string&, bool);
  friend Result<std::vector<PlannedParam>> PlanParams(const ModelSpec&, ModelPart);
  friend Result<int64_t> CountParameters(const ModelSpec&);
  std::vector<Shape> param_shapes_;  // parallel to params_
  // An operator output viewed as rows x cols (its tile grid, tile.h); rows = 1 for a vector.
  void TraceOp(const std::string& name, const float* values, int64_t rows, int64_t cols) {
    if (trace_) trace_->Record(name, {values, static_cast<size_t>(rows * cols)}, rows, cols);
  }
  // Every parameter gradient, in parameter order (the end of Backward).
  void TraceParamGrads() {
    if (!trace_) return;
    for (const Param& p : params_) {
      const TileGrid g = TileGrid::ForShape(p.grad.shape());
      trace_->Record(p.name + ".grad", {p.grad.data(), static_cast<size_t>(p.grad.size())}, g.rows,
                     g.cols);
    }
  }

  ModelSpec spec_;
  ModelPart part_;          // resolved: 0 <= begin < end <= cut_layers_
  int64_t cut_layers_ = 0;  // CutLayerCount(spec_)
  std::vector<Param> params_;
  std::vector<InitRule> init_;         // parallel to params_
  std::vector<uint64_t> param_index_;  // parallel to params_: index in the whole model
  uint64_t planned_params_ = 0;        // parameters of the whole model recorded so far
  InitRule scratch_rule_;
  Shape tied_shape_;            // a GPT part with the head but not wte: wte's shape
  Tensor tied_weight_;          // allocated with the parameters
  std::unique_ptr<Tape> tape_;  // Forward()/Backward()'s
  OpTrace* trace_ = nullptr;
};

// Index of the largest logit of each row (first on ties).
std::vector<int32_t> ArgmaxRows(const float* logits, int64_t rows, int64_t cols);

}  // namespace meshlearn::engine
