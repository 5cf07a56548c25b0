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
// thread pool internally. Activations live in the model's Arena and are valid until the next
// Forward().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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
};

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

// The width of the model's logits (classes, or the vocabulary), without allocating it.
Result<int64_t> ModelOutputs(const ModelSpec& spec);

// Bytes this machine can give a process now: $MESHLEARN_MEMORY_BYTES when set (a cap, for
// operators and tests), else MemAvailable from /proc/meminfo, else the free physical pages.
// `source` (optional) says which, for messages.
uint64_t AvailableMemoryBytes(std::string* source = nullptr);

// "1.5 GiB", "300.0 MiB".
std::string FormatBytes(double bytes);

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

  const ModelSpec& spec() const { return spec_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  int64_t NumParameters() const;
  // Number of classes (sequential) or vocabulary size (GPT): the width of a logits row.
  virtual int64_t NumOutputs() const = 0;

  // Deterministic initialisation: parameter i from Philox(seed, stream = i).
  void Init(uint64_t seed);
  void ZeroGrad();

  // Runs the model and the mean softmax cross-entropy loss over all targets.
  virtual float Forward(const Batch& batch, const ForwardOptions& opts) = 0;
  // Logits of the last Forward: (B, classes) or (B*T, vocab).
  virtual TensorView logits() const = 0;
  // Accumulates d(loss)/d(param) into each Param::grad (call ZeroGrad() first).
  // REQUIRES: the last Forward() had opts.train.
  virtual void Backward() = 0;

  // A Batch of `n` samples with this model's input shape (zeros), for tests and tools.
  Batch EmptyBatch(int64_t n, int64_t seq_len = 0) const;

  // Per-operator output hashes (op_trace.h): while set, Forward and Backward record every
  // operator's output in a fixed order. Not owned; nullptr (the default) records nothing.
  void set_op_trace(OpTrace* trace) { trace_ = trace; }
  OpTrace* op_trace() const { return trace_; }

 protected:
  explicit Model(ModelSpec spec) : spec_(std::move(spec)) {}
  // Records a parameter's name and shape; its memory is allocated by AllocateParams(), after
  // Create has checked that it fits.
  Param& AddParam(std::string name, Shape shape);
  void AllocateParams();
  // Floats one training step keeps (activations, their gradients, scratch) for B samples of T
  // tokens, from the shapes Build() recorded. An estimate.
  virtual double ActivationFloats(int64_t B, int64_t T) const = 0;
  // The spec key holding the most weights, for messages.
  virtual std::string LargestKey() const = 0;
  int64_t PlannedParameters() const;
  MemoryEstimate PlannedMemory(int64_t B, int64_t T) const;  // without the optimizer
  friend Result<MemoryEstimate> EstimateMemory(const ModelSpec&, int64_t, int64_t,
                                               const std::string&, bool);
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
  std::vector<Param> params_;
  // Per-parameter init rule, parallel to params_.
  struct InitRule {
    std::string kind;  // kaiming xavier normal uniform zeros ones
    double fan_in = 0, fan_out = 0, std = 0;
  };
  std::vector<InitRule> init_;
  Arena arena_;
  OpTrace* trace_ = nullptr;
};

// Index of the largest logit of each row (first on ties).
std::vector<int32_t> ArgmaxRows(const float* logits, int64_t rows, int64_t cols);

}  // namespace meshlearn::engine
