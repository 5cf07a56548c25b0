#include "meshlearn/engine/pipeline.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "meshlearn/engine/step_replay.h"

namespace meshlearn::engine {

namespace {

// A step of `batch` samples runs as `micro_batches` micro-batches of batch / M samples each: the
// one check of M that every function here taking it makes.
Status CheckMicroBatches(int64_t batch, int64_t micro_batches) {
  if (micro_batches < 1 || batch % micro_batches != 0) {
    return InvalidArgument("micro_batches (" + std::to_string(micro_batches) +
                           ") must be >= 1 and divide the batch size (" + std::to_string(batch) +
                           ")");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<Batch>> SplitBatch(const Batch& batch, int64_t micro_batches) {
  const int64_t B = batch.size;
  ML_RETURN_IF_ERROR(CheckMicroBatches(B, micro_batches));
  const int64_t b = B / micro_batches;
  std::vector<Batch> out;
  out.reserve(static_cast<size_t>(micro_batches));
  for (int64_t m = 0; m < micro_batches; ++m) {
    Batch mb;
    mb.size = b;
    mb.seq_len = batch.seq_len;
    if (!batch.tokens.empty()) {
      const int64_t n = b * batch.seq_len;
      mb.tokens.assign(batch.tokens.begin() + m * n, batch.tokens.begin() + (m + 1) * n);
      mb.targets.assign(batch.targets.begin() + m * n, batch.targets.begin() + (m + 1) * n);
    } else {
      const int64_t per = B > 0 ? batch.inputs.size() / B : 0;
      Shape s = batch.inputs.shape();
      if (!s.empty()) s[0] = b;
      mb.inputs = Tensor(s, std::vector<float>(batch.inputs.data() + m * b * per,
                                               batch.inputs.data() + (m + 1) * b * per));
      mb.targets.assign(batch.targets.begin() + m * b, batch.targets.begin() + (m + 1) * b);
    }
    out.push_back(std::move(mb));
  }
  return out;
}

float MicroBatchLossScale(int64_t micro_batches) {
  return 1.0f / static_cast<float>(micro_batches);
}

void AddTiedHeadGrad(Tensor& wte_grad, std::span<const float> head_grad) {
  CHECK_EQ(static_cast<int64_t>(head_grad.size()), wte_grad.size());
  float* g = wte_grad.data();
  for (size_t i = 0; i < head_grad.size(); ++i) g[i] = g[i] + head_grad[i];
}

Result<PipelineCut> MakeCut(const ModelSpec& spec, std::vector<int64_t> bounds,
                            const std::string& where) {
  const int64_t layers = CutLayerCount(spec);
  const std::string unit = spec.kind == "gpt" ? "blocks (model.n_layer)" : "layers";
  if (bounds.size() < 2) {
    return InvalidArgument(where + ": a cut lists S + 1 bounds from 0 to " +
                           std::to_string(layers) + " (the model's " + unit + "), got " +
                           std::to_string(bounds.size()));
  }
  if (bounds.front() != 0 || bounds.back() != layers) {
    return InvalidArgument(where + ": the bounds must start at 0 and end at " +
                           std::to_string(layers) + " (the model's " + unit + "), got [" +
                           std::to_string(bounds.front()) + ", ..., " +
                           std::to_string(bounds.back()) + "]");
  }
  for (size_t i = 1; i < bounds.size(); ++i) {
    if (bounds[i] <= bounds[i - 1]) {
      return InvalidArgument(where + ": bound " + std::to_string(i) + " (" +
                             std::to_string(bounds[i]) + ") must be greater than bound " +
                             std::to_string(i - 1) + " (" + std::to_string(bounds[i - 1]) +
                             "): every stage holds at least one of the model's " + unit);
    }
  }
  return PipelineCut{std::move(bounds)};
}

namespace {

// FLOPs squared need 128 bits (scheduler.cc does the same; __extension__ keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 PipeU128;

double PipeMoments(const OptimizerSpec& o) {
  return o.kind == "adamw" ? 2.0 : (o.kind == "sgd" && o.momentum > 0 ? 1.0 : 0.0);
}

// Stage costs from per-layer costs: the sums over [a, b) plus the GPT head's copy of wte.
StageCost PipeStageCost(const ModelSpec& spec, const OptimizerSpec& optimizer,
                        const std::vector<LayerCost>& layers, int64_t a, int64_t b, int64_t batch,
                        int64_t micro_batches) {
  StageCost c;
  double act_per_sample = 0;
  for (int64_t i = a; i < b; ++i) {
    const LayerCost& l = layers[static_cast<size_t>(i)];
    c.parameters += l.parameters;
    c.flops += l.flops * static_cast<uint64_t>(batch);
    act_per_sample += l.activation_floats;
  }
  const double weights = 4.0 * static_cast<double>(c.parameters);
  c.param_bytes = 2.0 * weights;
  if (spec.kind == "gpt" && a > 0 && b == static_cast<int64_t>(layers.size())) {
    c.param_bytes += static_cast<double>(TiedWeightAndGradBytes(spec));
  }
  c.optimizer_bytes = PipeMoments(optimizer) * weights;
  // M micro-batches of batch / M samples: all in flight in GPipe order.
  c.activation_bytes = 4.0 * act_per_sample * static_cast<double>(batch / micro_batches) *
                       static_cast<double>(micro_batches);
  return c;
}

}  // namespace

Result<std::vector<StageCost>> CutCosts(const ModelSpec& spec, const OptimizerSpec& optimizer,
                                        const PipelineCut& cut, int64_t batch, int64_t seq_len,
                                        int64_t micro_batches) {
  ML_ASSIGN_OR_RETURN(std::vector<LayerCost> layers, LayerCosts(spec, seq_len));
  ML_ASSIGN_OR_RETURN(PipelineCut checked, MakeCut(spec, cut.bounds));
  ML_RETURN_IF_ERROR(CheckMicroBatches(batch, micro_batches));
  std::vector<StageCost> out;
  for (int s = 0; s < checked.stages(); ++s) {
    out.push_back(PipeStageCost(spec, optimizer, layers, checked.bounds[s], checked.bounds[s + 1],
                                batch, micro_batches));
  }
  return out;
}

uint64_t TiedWeightAndGradBytes(const ModelSpec& spec) {
  if (spec.kind != "gpt") return 0;
  return 2 * 4 * static_cast<uint64_t>(spec.gpt.vocab_size) *
         static_cast<uint64_t>(spec.gpt.n_embd);
}

Result<std::vector<uint64_t>> CutBoundaryBytes(const ModelSpec& spec, const PipelineCut& cut,
                                               int64_t batch, int64_t seq_len,
                                               int64_t micro_batches) {
  ML_ASSIGN_OR_RETURN(PipelineCut checked, MakeCut(spec, cut.bounds));
  ML_RETURN_IF_ERROR(CheckMicroBatches(batch, micro_batches));
  std::vector<uint64_t> out;
  for (int s = 1; s < checked.stages(); ++s) {
    ML_ASSIGN_OR_RETURN(int64_t floats,
                        PartInputFloats(spec, checked.part(s), batch / micro_batches, seq_len));
    out.push_back(2 * 4 * static_cast<uint64_t>(micro_batches) * static_cast<uint64_t>(floats));
  }
  return out;
}

Result<PipelineCut> ChooseCut(const ModelSpec& spec, const OptimizerSpec& optimizer, int stages,
                              int64_t batch, int64_t seq_len, int64_t micro_batches) {
  const int64_t n = CutLayerCount(spec);
  const std::string unit = spec.kind == "gpt" ? "blocks (model.n_layer)" : "layers";
  if (stages < 1 || stages > n) {
    return InvalidArgument("stages (" + std::to_string(stages) + ") must be between 1 and the " +
                           std::to_string(n) + " " + unit +
                           " of the model: every stage holds at least one; use fewer stages or "
                           "a deeper model");
  }
  ML_RETURN_IF_ERROR(CheckMicroBatches(batch, micro_batches));
  ML_ASSIGN_OR_RETURN(std::vector<LayerCost> layers, LayerCosts(spec, seq_len));
  // Every stage holds a layer with parameters (TaskPipelineCut refuses a stage without), so no
  // cut exists into more stages than the model has such layers.
  const int64_t with_parameters = std::count_if(
      layers.begin(), layers.end(), [](const LayerCost& l) { return l.parameters > 0; });
  if (stages > with_parameters) {
    return InvalidArgument("stages (" + std::to_string(stages) + ") must be at most the " +
                           std::to_string(with_parameters) + " " + unit +
                           " with parameters of the model: every stage holds at least one "
                           "(a stage without parameters trains nothing); use fewer stages");
  }
  // Integer keys: FLOPs, then bytes (rounded up; the byte estimates are integers anyway).
  auto flops = [&](int64_t a, int64_t b) {
    return PipeStageCost(spec, optimizer, layers, a, b, batch, micro_batches).flops;
  };
  auto bytes = [&](int64_t a, int64_t b) {
    return static_cast<uint64_t>(std::ceil(
        PipeStageCost(spec, optimizer, layers, a, b, batch, micro_batches).total_bytes()));
  };
  auto holds_parameters = [&](int64_t a, int64_t b) {
    return PipeStageCost(spec, optimizer, layers, a, b, batch, micro_batches).parameters > 0;
  };
  const size_t N = static_cast<size_t>(n), S = static_cast<size_t>(stages);
  // best[k][i]: the optimum over cuts of layers [i, N) into k stages whose every stage has
  // flops <= flops_cap and bytes <= bytes_cap, of the stages' `key` combined by max (or by sum).
  // from[k][i]: the smallest next bound reaching it, so that reading `from` forward from layer 0
  // gives, for the additive objective, the lexicographically smallest optimal bounds.
  constexpr PipeU128 kInf = ~PipeU128{0};
  auto solve = [&](auto key, bool sum, PipeU128 flops_cap, PipeU128 bytes_cap,
                   std::vector<int64_t>* bounds) -> PipeU128 {
    std::vector<std::vector<PipeU128>> best(S + 1, std::vector<PipeU128>(N + 1, kInf));
    std::vector<std::vector<size_t>> from(S + 1, std::vector<size_t>(N + 1, N));
    best[0][N] = 0;
    for (size_t k = 1; k <= S; ++k) {
      for (size_t i = 0; i + k <= N; ++i) {
        for (size_t j = i + 1; j + (k - 1) <= N; ++j) {
          if (best[k - 1][j] == kInf) continue;
          const int64_t a = static_cast<int64_t>(i), b = static_cast<int64_t>(j);
          if (!holds_parameters(a, b)) continue;
          if (flops(a, b) > flops_cap || bytes(a, b) > bytes_cap) continue;
          const PipeU128 here = key(a, b);
          const PipeU128 v = sum ? here + best[k - 1][j] : std::max(here, best[k - 1][j]);
          if (v < best[k][i]) {
            best[k][i] = v;
            from[k][i] = j;
          }
        }
      }
    }
    if (bounds != nullptr && best[S][0] != kInf) {
      bounds->assign(1, 0);
      size_t i = 0;
      for (size_t k = S; k > 0; --k) {
        i = from[k][i];
        bounds->push_back(static_cast<int64_t>(i));
      }
    }
    return best[S][0];
  };
  // 1. the smallest largest-stage FLOPs; 2. under it, the smallest largest-stage memory; 3. under
  // both, the most even FLOPs (the smallest sum of squares), then the smallest bounds.
  auto flops_key = [&](int64_t a, int64_t b) { return PipeU128{flops(a, b)}; };
  auto bytes_key = [&](int64_t a, int64_t b) { return PipeU128{bytes(a, b)}; };
  auto square_key = [&](int64_t a, int64_t b) {
    const PipeU128 f = flops(a, b);
    return f * f;
  };
  const PipeU128 min_flops = solve(flops_key, false, kInf, kInf, nullptr);
  const PipeU128 min_bytes = solve(bytes_key, false, min_flops, kInf, nullptr);
  std::vector<int64_t> bounds;
  solve(square_key, true, min_flops, min_bytes, &bounds);
  return MakeCut(spec, std::move(bounds), "ChooseCut");
}

namespace {

// A stage without parameters (a lone activation, pool, dropout or flatten) trains nothing, so no
// node is paid to run one; nor could the ledger rule its step's chain end without a key, as it has
// no state to rule it from (docs/verification.md, "Who rules what"). InvalidArgument naming the
// stage, its layers and the fix.
Status CheckStagesHoldParameters(const TaskSpec& task, const PipelineCut& cut) {
  // A GPT's cut layers are its blocks, each with parameters.
  if (task.model.kind == "gpt") return Status::Ok();
  ML_ASSIGN_OR_RETURN(std::vector<LayerCost> layers, LayerCosts(task.model, task.seq_len));
  for (int s = 0; s < cut.stages(); ++s) {
    int64_t parameters = 0;
    std::string names;
    for (int64_t i = cut.bounds[s]; i < cut.bounds[s + 1]; ++i) {
      const LayerCost& l = layers[static_cast<size_t>(i)];
      parameters += l.parameters;
      names += (names.empty() ? "" : ", ") + l.name;
    }
    if (parameters > 0) continue;
    // The fix, concretely: the cut ChooseCut makes of as many stages, or fewer stages where the
    // model has too few layers with parameters for that many.
    Result<PipelineCut> best = ChooseCut(task.model, task.optimizer, cut.stages(), task.batch_size,
                                         task.seq_len, task.micro_batches);
    std::string fix;
    if (best.ok()) {
      fix = "move a bound so that stage " + std::to_string(s) +
            " holds a layer with parameters (a linear, conv2d or layernorm), e.g. network.cut = [";
      for (size_t i = 0; i < best->bounds.size(); ++i) {
        fix += (i == 0 ? "" : ", ") + std::to_string(best->bounds[i]);
      }
      fix += "] (the cut chosen when network.cut is left out)";
    } else {
      fix = "use fewer stages (" + best.status().message() + ")";
    }
    return InvalidArgument(task.path + ": network.cut: stage " + std::to_string(s) +
                           " holds layers [" + std::to_string(cut.bounds[s]) + ", " +
                           std::to_string(cut.bounds[s + 1]) + ") (" + names +
                           "), none with parameters: a stage that trains nothing is refused "
                           "(nobody is paid to run it, and the ledger could not rule its "
                           "disputes); " +
                           fix);
  }
  return Status::Ok();
}

}  // namespace

Result<PipelineCut> TaskPipelineCut(const TaskSpec& task, int stages,
                                    const std::vector<int64_t>& cut) {
  if (!cut.empty()) {
    if (static_cast<int64_t>(cut.size()) != int64_t{stages} + 1) {
      return InvalidArgument(task.path + ": network.cut lists " + std::to_string(cut.size()) +
                             " bounds but network.stages = " + std::to_string(stages) + " needs " +
                             std::to_string(stages + 1));
    }
    ML_ASSIGN_OR_RETURN(PipelineCut given, MakeCut(task.model, cut, task.path + ": network.cut"));
    ML_RETURN_IF_ERROR(CheckStagesHoldParameters(task, given));
    return given;
  }
  Result<PipelineCut> chosen = ChooseCut(task.model, task.optimizer, stages, task.batch_size,
                                         task.seq_len, task.micro_batches);
  if (!chosen.ok()) return chosen.status().WithPrefix(task.path + ": network.stages");
  return chosen;
}

TileGrid StageTensorGrid(int64_t floats, int64_t cols) {
  return cols > 0 && floats >= cols && floats % cols == 0 ? TileGrid::For(floats / cols, cols)
                                                          : TileGrid::For(1, floats);
}

Hash256 TensorHash(std::span<const float> values) {
  Hasher h("meshlearn.pipeline.tensor.v1");
  h.UpdateU64(values.size());
  static_assert(std::endian::native == std::endian::little, "float bytes are hashed as stored");
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4));
  return h.Finish();
}

const char* TransferKindName(TransferKind kind) {
  switch (kind) {
    case TransferKind::kTransferActivation:
      return "activation";
    case TransferKind::kTransferActivationGrad:
      return "activation_grad";
    case TransferKind::kTransferTiedHeadGrad:
      return "tied_head_grad";
    case TransferKind::kTransferGradSquares:
      return "grad_squares";
    case TransferKind::kTransferTiedWeight:
      return "tied_weight";
  }
  return "unknown";
}

// ---- Stage.

namespace {

// Restore's checks: `saved` holds the model part `part` of `model` and the optimizer `optimizer`
// of stage `index`, else InvalidArgument naming what differs.
Status CheckSavedStage(int index, const ModelSpec& model, ModelPart part,
                       const OptimizerSpec& optimizer, const TrainState& saved) {
  if (!saved.model || !saved.optimizer) {
    return InvalidArgument("stage " + std::to_string(index) +
                           ": the saved state has no model or no optimizer (a model file?)");
  }
  if (saved.model->spec().ToJson() != model.ToJson() || saved.model->part().begin != part.begin ||
      saved.model->part().end != part.end) {
    return InvalidArgument(
        "stage " + std::to_string(index) + " holds layers [" + std::to_string(part.begin) + ", " +
        std::to_string(part.end) + ") of " + model.ToJson() + "; the saved state holds [" +
        std::to_string(saved.model->part().begin) + ", " + std::to_string(saved.model->part().end) +
        ") of " + saved.model->spec().ToJson());
  }
  if (saved.optimizer->spec().ToJson() != optimizer.ToJson()) {
    return InvalidArgument("stage " + std::to_string(index) + ": the saved optimizer " +
                           saved.optimizer->spec().ToJson() + " differs from the stage's " +
                           optimizer.ToJson());
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Stage>> Stage::Create(const ModelSpec& model, const OptimizerSpec& optimizer,
                                             const PipelineCut& cut, int index,
                                             int64_t micro_batches) {
  return Create(model, optimizer, cut, index, micro_batches, TrainState{});
}

Result<std::unique_ptr<Stage>> Stage::Create(const ModelSpec& model, const OptimizerSpec& optimizer,
                                             const PipelineCut& cut, int index,
                                             int64_t micro_batches, TrainState saved) {
  if (index < 0 || index >= cut.stages()) {
    return InvalidArgument("stage " + std::to_string(index) + " of a cut of " +
                           std::to_string(cut.stages()) + " stages");
  }
  if (micro_batches < 1) {
    return InvalidArgument("micro_batches must be >= 1, got " + std::to_string(micro_batches));
  }
  std::unique_ptr<Stage> s(new Stage());
  s->index_ = index;
  s->micro_batches_ = micro_batches;
  if (saved.model == nullptr && saved.optimizer == nullptr) {  // a fresh stage
    ML_ASSIGN_OR_RETURN(s->state_.model, Model::CreatePart(model, cut.part(index)));
    s->state_.optimizer = std::make_unique<Optimizer>(optimizer, s->state_.model->params());
  } else {
    ML_RETURN_IF_ERROR(CheckSavedStage(index, model, cut.part(index), optimizer, saved));
    s->state_ = std::move(saved);
  }
  const size_t M = static_cast<size_t>(micro_batches);
  for (size_t m = 0; m < M; ++m) s->tapes_.push_back(s->state_.model->NewTape());
  s->batches_.resize(M);
  s->inputs_.resize(M);
  s->output_grads_.resize(M);
  s->losses_.assign(M, 0.0f);
  s->forwarded_.assign(M, false);
  if (s->state_.model->tied_head() && s->last()) {
    s->head_grad_ = Tensor({model.gpt.vocab_size, model.gpt.n_embd});
  }
  return s;
}

void Stage::BeginStep() {
  state_.model->ZeroGrad();
  head_grad_.Zero();
  forwarded_.assign(forwarded_.size(), false);
  if (trace_ == nullptr) return;
  RecordStepInputState(state_, *trace_);
  if (const Tensor* wte = state_.model->tied_weight()) trace_->Record("recv.tied_weight", *wte);
  micro_traces_.assign(static_cast<size_t>(micro_batches_), OpTrace());
  for (OpTrace& t : micro_traces_) {
    t.set_keep_values(trace_->keep_values());
    if (micro_batches_ > 1)
      t.set_name_prefix("mb" + std::to_string(&t - micro_traces_.data()) + ".");
  }
  traces_joined_ = false;
}

void Stage::JoinMicroBatchTraces() {
  if (trace_ == nullptr || traces_joined_) return;
  for (OpTrace& t : micro_traces_) trace_->Append(std::move(t));
  traces_joined_ = true;
}

bool Stage::Clipped() const { return state_.optimizer->spec().grad_clip > 0; }

namespace {

// A received tensor of a stage's micro-batch, viewed as its rows (a GPT's tokens, B x T; a
// sequential model's samples) x the rest, as the tile plan grids it.
void RecordReceived(OpTrace& trace, const std::string& name, std::span<const float> values,
                    const Model& model, const Batch& batch) {
  const int64_t rows = model.spec().kind == "gpt" ? batch.size * batch.seq_len : batch.size;
  trace.Record(name, values, rows, static_cast<int64_t>(values.size()) / rows);
}

}  // namespace

Result<std::span<const float>> Stage::Forward(int64_t m, const Batch& micro_batch,
                                              std::vector<float> input,
                                              const ForwardOptions& opts) {
  if (m < 0 || m >= micro_batches_) {
    return InvalidArgument("stage " + std::to_string(index_) + ": micro-batch " +
                           std::to_string(m) + " is not in [0, " + std::to_string(micro_batches_) +
                           ")");
  }
  Model& model = *state_.model;
  const int64_t want = first() ? 0 : model.PartInputSize(micro_batch.size, micro_batch.seq_len);
  if (static_cast<int64_t>(input.size()) != want) {
    return InvalidArgument("stage " + std::to_string(index_) + ", micro-batch " +
                           std::to_string(m) + ": the input activations have " +
                           std::to_string(input.size()) + " floats, the stage takes " +
                           std::to_string(want));
  }
  const size_t k = static_cast<size_t>(m);
  batches_[k] = micro_batch;
  inputs_[k] = std::move(input);
  OpTrace* trace = trace_ != nullptr ? &micro_traces_.at(k) : nullptr;
  if (trace != nullptr && !first()) {
    RecordReceived(*trace, "recv.activation", inputs_[k], model, batches_[k]);
  }
  model.set_op_trace(trace);
  losses_[k] = model.ForwardPart(*tapes_[k], batches_[k], inputs_[k], opts);
  model.set_op_trace(nullptr);
  forwarded_[k] = true;
  if (last()) return std::span<const float>();
  return model.PartOutput(*tapes_[k]);
}

Result<std::span<const float>> Stage::Backward(int64_t m, std::vector<float> output_grad) {
  if (m < 0 || m >= micro_batches_ || !forwarded_[static_cast<size_t>(m)]) {
    return InvalidArgument("stage " + std::to_string(index_) + ": micro-batch " +
                           std::to_string(m) + " has no forward pass this step");
  }
  const size_t k = static_cast<size_t>(m);
  Model& model = *state_.model;
  const int64_t want = last() ? 0 : static_cast<int64_t>(model.PartOutput(*tapes_[k]).size());
  if (static_cast<int64_t>(output_grad.size()) != want) {
    return InvalidArgument("stage " + std::to_string(index_) + ", micro-batch " +
                           std::to_string(m) + ": the output gradient has " +
                           std::to_string(output_grad.size()) + " floats, the stage's output " +
                           std::to_string(want));
  }
  output_grads_[k] = std::move(output_grad);
  BackwardOptions opts;
  opts.dloss = MicroBatchLossScale(micro_batches_);
  if (head_grad_.size() > 0) opts.tied_head_grad = head_grad_.data();
  OpTrace* trace = trace_ != nullptr ? &micro_traces_.at(k) : nullptr;
  if (trace != nullptr && !last()) {
    RecordReceived(*trace, "recv.activation_grad", output_grads_[k], model, batches_[k]);
  }
  model.set_op_trace(trace);
  model.BackwardPart(*tapes_[k], output_grads_[k], opts);
  model.set_op_trace(nullptr);
  if (trace != nullptr && head_grad_.size() > 0) {
    const TileGrid g = TileGrid::ForShape(head_grad_.shape());
    trace->Record(std::string(kGptWteName) + ".head.grad", tied_head_grad(), g.rows, g.cols);
  }
  forwarded_[k] = false;
  if (first()) return std::span<const float>();
  return model.PartInputGrad(*tapes_[k]);
}

std::span<const float> Stage::tied_head_grad() const {
  return {head_grad_.data(), static_cast<size_t>(head_grad_.size())};
}

void Stage::AddTiedHeadGrad(std::span<const float> head_grad) {
  CHECK(first() && state_.model->tied_head());
  JoinMicroBatchTraces();
  Tensor& wte_grad = state_.model->params()[0].grad;
  const TileGrid g = TileGrid::ForShape(wte_grad.shape());
  if (trace_ != nullptr && !last())
    trace_->Record("recv.tied_head_grad", head_grad, g.rows, g.cols);
  engine::AddTiedHeadGrad(wte_grad, head_grad);
  if (trace_ != nullptr) trace_->Record(std::string(kGptWteName) + ".grad", wte_grad);
}

float Stage::SumGradSquares(float running) {
  JoinMicroBatchTraces();
  const float total = engine::SumGradSquares(state_.model->params(), running);
  // A clipped step's norm is an operator chain across the stages (tile_rule.h): the running sum
  // received, the stage's block partials, the sum it sends on.
  if (trace_ != nullptr && Clipped()) {
    if (!first()) trace_->Record("recv.grad_squares", {&running, 1});
    trace_->Record("grad_norm.blocks", GradSquareBlockPartials(state_.model->params()));
    trace_->Record("grad_squares", {&total, 1});
  }
  return total;
}

void Stage::Update(int64_t step, float grad_norm) {
  JoinMicroBatchTraces();
  state_.optimizer->Update(state_.model->params(), step, grad_norm);
  state_.step = step + 1;
  if (trace_ != nullptr) RecordStepOutputState(state_, *trace_);
}

float Stage::FinishStep(int64_t step, float total) {
  JoinMicroBatchTraces();
  if (trace_ != nullptr && Clipped() && !last()) trace_->Record("recv.grad_total", {&total, 1});
  const float norm = std::sqrt(total);
  Update(step, norm);
  return norm;
}

Status Stage::Restore(TrainState saved) {
  ML_RETURN_IF_ERROR(CheckSavedStage(index_, state_.model->spec(), state_.model->part(),
                                     state_.optimizer->spec(), saved));
  state_ = std::move(saved);
  for (std::unique_ptr<Tape>& t : tapes_) t = state_.model->NewTape();
  return Status::Ok();
}

std::span<const float> Stage::tied_weight_source() const {
  CHECK(first() && state_.model->tied_head());
  const Tensor& w = state_.model->params()[0].value;
  return {w.data(), static_cast<size_t>(w.size())};
}

void Stage::SetTiedWeight(std::span<const float> wte) {
  Tensor* t = state_.model->tied_weight();
  CHECK(t != nullptr) << "stage " << index_ << " holds no copy of wte";
  CHECK_EQ(static_cast<int64_t>(wte.size()), t->size());
  std::copy(wte.begin(), wte.end(), t->data());
}

// ---- The schedule.

namespace {

// Stage 0 -> S-1: wte (a GPT cut into two or more stages); nothing otherwise.
void PipeShareTiedWeightInto(std::span<const std::unique_ptr<Stage>> stages, int64_t step,
                             std::vector<Transfer>* transfers) {
  Stage& first = *stages.front();
  Stage& last = *stages.back();
  if (stages.size() < 2 || !first.state().model->tied_head()) return;
  std::span<const float> wte = first.tied_weight_source();
  last.SetTiedWeight(wte);
  transfers->push_back({TransferKind::kTransferTiedWeight, first.index(), last.index(), step, -1,
                        static_cast<int64_t>(wte.size()), TensorHash(wte)});
}

}  // namespace

std::vector<Transfer> InitPipeline(std::span<const std::unique_ptr<Stage>> stages, uint64_t seed) {
  for (const std::unique_ptr<Stage>& s : stages) {
    s->state().model->Init(seed);
    s->state().seed = seed;
  }
  std::vector<Transfer> transfers;
  PipeShareTiedWeightInto(stages, 0, &transfers);
  return transfers;
}

std::vector<Transfer> ShareTiedWeight(std::span<const std::unique_ptr<Stage>> stages) {
  std::vector<Transfer> transfers;
  if (!stages.empty()) PipeShareTiedWeightInto(stages, stages.front()->state().step, &transfers);
  return transfers;
}

PipelineStepResult RunPipelineStep(std::span<const std::unique_ptr<Stage>> stages,
                                   const Batch& batch, uint64_t dropout_seed) {
  CHECK(!stages.empty());
  const int64_t M = stages.front()->micro_batches();
  const int64_t step = stages.front()->state().step;
  for (const std::unique_ptr<Stage>& s : stages) {
    CHECK_EQ(s->micro_batches(), M);
    CHECK_EQ(s->state().step, step) << "stage " << s->index() << " is at another step";
  }
  Result<std::vector<Batch>> micro = SplitBatch(batch, M);
  CHECK(micro.ok()) << micro.status().ToString();
  const size_t S = stages.size();
  PipelineStepResult r;
  auto record = [&](TransferKind kind, size_t from, size_t to, int64_t m,
                    std::span<const float> v) {
    r.transfers.push_back({kind, static_cast<int>(from), static_cast<int>(to), step, m,
                           static_cast<int64_t>(v.size()), TensorHash(v)});
  };
  for (const std::unique_ptr<Stage>& s : stages) s->BeginStep();
  // GPipe: every micro-batch forward through every stage.
  for (int64_t m = 0; m < M; ++m) {
    ForwardOptions opts{.train = true,
                        .dropout_seed = dropout_seed,
                        .step = static_cast<uint64_t>(step),
                        .micro_batch = static_cast<uint64_t>(m)};
    std::span<const float> out;
    for (size_t s = 0; s < S; ++s) {
      std::vector<float> input(out.begin(), out.end());
      if (s > 0) record(TransferKind::kTransferActivation, s - 1, s, m, input);
      Result<std::span<const float>> o =
          stages[s]->Forward(m, (*micro)[static_cast<size_t>(m)], std::move(input), opts);
      CHECK(o.ok()) << o.status().ToString();  // the previous stage's output: the right size
      out = *o;
    }
  }
  // Backward passes in increasing micro-batch order: each stage accumulates in StepOnBatch's
  // order.
  for (int64_t m = 0; m < M; ++m) {
    std::span<const float> grad;
    for (size_t s = S; s-- > 0;) {
      std::vector<float> output_grad(grad.begin(), grad.end());
      if (s + 1 < S) record(TransferKind::kTransferActivationGrad, s + 1, s, m, output_grad);
      Result<std::span<const float>> g = stages[s]->Backward(m, std::move(output_grad));
      CHECK(g.ok()) << g.status().ToString();
      grad = *g;
    }
  }
  float loss = 0.0f;
  for (int64_t m = 0; m < M; ++m) loss = loss + stages.back()->loss(m);
  r.loss = M == 1 ? loss : loss / static_cast<float>(M);
  // a. the head's wte gradient joins the embedding's.
  Stage& first = *stages.front();
  Stage& last = *stages.back();
  if (first.state().model->tied_head()) {
    std::span<const float> head = last.tied_head_grad();
    if (S > 1) record(TransferKind::kTransferTiedHeadGrad, S - 1, 0, -1, head);
    first.AddTiedHeadGrad(head);
  }
  // b. the gradient norm, chained in model order; every stage updates with it.
  float squares = 0.0f;
  for (size_t s = 0; s < S; ++s) {
    if (s > 0) record(TransferKind::kTransferGradSquares, s - 1, s, -1, {&squares, 1});
    squares = stages[s]->SumGradSquares(squares);
  }
  for (const std::unique_ptr<Stage>& s : stages) r.grad_norm = s->FinishStep(step, squares);
  // c. the head's copy of wte follows the update.
  PipeShareTiedWeightInto(stages, step, &r.transfers);
  return r;
}

}  // namespace meshlearn::engine
