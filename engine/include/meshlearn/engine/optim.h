// Optimizers (SGD with momentum / Nesterov, AdamW), learning-rate schedules and global-norm
// gradient clipping — all written element-wise with an explicit order of operations and no libm,
// so an update gives the same bits on every machine.
//
//   [optimizer]
//   kind = "adamw"            # sgd | adamw
//   lr = 1e-3
//   beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0
//   momentum = 0.9, nesterov = true        # sgd
//   grad_clip = 1.0           # global L2 norm; 0 = off
//   schedule = "cosine"       # constant | cosine (with linear warm-up, down to min_lr)
//   warmup_steps = 100, min_lr = 1e-5
//
// Update rules (per element, float32, in this order; t = step + 1):
//   AdamW:  p -= lr*wd*p  (decoupled, only tensors of rank >= 2: weights, not biases/norms)
//           m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*(g*g)
//           p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - b_i^t  (PyTorch's form)
//   SGD:    g += wd*p (rank >= 2);  buf = mu*buf + g;  d = nesterov ? g + mu*buf : buf;  p -= lr*d
// Clipping: norm = sqrt(sum over params, in order, of SumSquaresTree(grad)); if norm > clip every
// gradient is multiplied by clip / (norm + 1e-6).
//
// Not thread-safe; one Optimizer per model.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshlearn/base/config.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/model.h"

namespace meshlearn::engine {

struct OptimizerSpec {
  std::string kind = "adamw";  // sgd | adamw
  double lr = 1e-3;
  double momentum = 0.0;                          // sgd
  bool nesterov = false;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double weight_decay = 0.0;
  double grad_clip = 0.0;             // 0 = off
  std::string schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  int64_t total_steps = 0;  // for the cosine schedule; set from the task's steps

  static Result<OptimizerSpec> FromConfig(const ConfigFile& optimizer);
  std::string ToJson() const;
  static Result<OptimizerSpec> FromJson(const std::string& json, const std::string& what);
};

class Optimizer {
 public:
  // Creates zeroed state for `params` (m, v or momentum buffers). The parameter list must not
  // change afterwards.
  Optimizer(OptimizerSpec spec, const std::vector<Param>& params);

  const OptimizerSpec& spec() const { return spec_; }
  // Learning rate for 0-based `step`, as a float (computed in double, rounded once).
  float LearningRate(int64_t step) const;

  // Clips and applies one update using each Param::grad. Returns the gradient norm before
  // clipping. `step` is 0-based (the bias correction uses t = step + 1).
  // Same as Update(params, step, GlobalGradNorm(params)).
  float Step(std::vector<Param>& params, int64_t step);
  // The update of Step with the global gradient norm given: a pipeline stage holds part of the
  // model's parameters, and the norm is SumGradSquares chained over every stage in model order
  // (pipeline.h), the same float sum GlobalGradNorm forms over the whole model.
  void Update(std::vector<Param>& params, int64_t step, float grad_norm);

  // Optimizer state tensors with stable names ("optim.m.<param>", "optim.v.<param>",
  // "optim.momentum.<param>"), in a fixed order, for checkpoints and the state hash.
  struct NamedState {
    std::string name;
    Tensor* tensor;
  };
  std::vector<NamedState> State();
  // The state tensors an optimizer of `spec` keeps for parameters named `param_names`, in
  // State()'s order and with its names, each with the index of the parameter whose shape it has.
  // The one derivation of those names and that order; needs no optimizer (a planner's, from
  // shapes alone).
  struct StateSlot {
    std::string name;
    size_t param = 0;
  };
  static std::vector<StateSlot> StateSlots(const OptimizerSpec& spec,
                                           std::span<const std::string> param_names);

 private:
  OptimizerSpec spec_;
  std::vector<std::string> param_names_;
  std::vector<Tensor> m_, v_;  // adamw: m, v; sgd: m = momentum buffer (if momentum > 0)
  // Fixed by the parameter list (Update's one parallel region over all of them): each
  // parameter's size, their total, and (adamw) whether weight decay applies to it.
  std::vector<int64_t> sizes_;
  int64_t total_size_ = 0;
  std::vector<bool> decays_;
};

// The learning rate of 0-based `step` under `spec`'s schedule (Optimizer::LearningRate).
float LearningRateAt(const OptimizerSpec& spec, int64_t step);

// The per-element pieces of Optimizer::Step, so that one parameter tile can be updated alone
// (the referee's tile rule, tile_rule.h) with the bits the whole step gives.
// AdamW's scalars at 0-based `step`; `clip` and `grad_scale` from the global gradient norm.
// decay_weight is left false: AdamWDecays says, per tensor.
AdamWStep AdamWScalars(const OptimizerSpec& spec, int64_t step, float grad_scale, bool clip);
bool AdamWDecays(const OptimizerSpec& spec, const Shape& shape);
// SGD on n elements of a parameter of `shape` (weight decay applies to rank >= 2): w, and the
// momentum buffer `buf` (null without momentum), in place; g already clipped.
void SgdUpdate(const OptimizerSpec& spec, int64_t step, const Shape& shape, float* w,
               const float* g, float* buf, int64_t n);

// sqrt(sum of squares of all gradients), in parameter order (deterministic):
// sqrt(SumGradSquares(params, 0)).
float GlobalGradNorm(const std::vector<Param>& params);
// `total` + SumSquaresTree of each gradient, added one parameter at a time in order (float).
float SumGradSquares(const std::vector<Param>& params, float total);
// Every gradient's block partials (SumSquaresBlocks, kernels.h) laid end to end in parameter
// order: what a clipped step commits as "grad_norm.blocks" (tile_rule.h). One parallel region
// over all gradients; SumGradSquares combines each gradient's run of them by the tree.
std::vector<float> GradSquareBlockPartials(const std::vector<Param>& params);

// Whether a step whose global gradient norm is `grad_norm` clips, and the factor every gradient
// is multiplied by: clip / (norm + 1e-6) when spec.grad_clip > 0 and norm > clip, else 1.
// Optimizer::Update and the tile rule of a clipped update (tile_rule.h) both use it.
struct GradClip {
  bool clip = false;
  float scale = 1.0f;
};
GradClip GradClipOf(const OptimizerSpec& spec, float grad_norm);

// The two halves of SumSquaresTree (kernels.h), so that the global norm can be committed and
// recomputed in pieces (tile_rule.h, "grad_norm.blocks" and "grad_norm"):
// appends to *partials the sequential sum of squares of each block of kSumBlock elements of x
// (acc = fma(x[i], x[i], acc) from 0; the last block cut short: ref::SumSquaresBlocks, the
// reference kernel, for a recompute);
void AppendSquareBlockPartials(const float* x, int64_t n, std::vector<float>* partials);
// and combines one tensor's block partials level by level (p[i] = p[2i] + p[2i+1], an odd last
// one moving up): CombineBlockPartials(partials of x) == SumSquaresTree(x, n), bit for bit.
float CombineBlockPartials(std::vector<float> partials);

}  // namespace meshlearn::engine
