#include "meshlearn/engine/optim.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "config_ranges.h"
#include "kernels_internal.h"
#include "meshlearn/engine/init.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/threadpool.h"

namespace meshlearn::engine {

Result<OptimizerSpec> OptimizerSpec::FromConfig(const ConfigFile& c) {
  OptimizerSpec s;
  ML_ASSIGN_OR_RETURN(s.kind, c.GetEnum("kind", {"sgd", "adamw", "adam"}));
  if (s.kind == "adam") s.kind = "adamw";  // Adam is AdamW with weight_decay = 0
  ML_ASSIGN_OR_RETURN(s.lr, c.GetDouble("lr", DRange(0, 100, true, false)));
  ML_ASSIGN_OR_RETURN(s.weight_decay, c.GetDouble("weight_decay", 0.0, DRange(0, 1, false, false)));
  ML_ASSIGN_OR_RETURN(s.grad_clip,
                      c.GetDouble("grad_clip", 0.0, DRange(0, std::nullopt, false, false)));
  ML_ASSIGN_OR_RETURN(s.schedule,
                      c.GetEnum("schedule", {"constant", "cosine"}, std::string("constant")));
  ML_ASSIGN_OR_RETURN(s.warmup_steps, c.GetInt("warmup_steps", 0, IRange(0, std::nullopt)));
  ML_ASSIGN_OR_RETURN(s.min_lr, c.GetDouble("min_lr", 0.0, DRange(0, std::nullopt, false, false)));
  if (s.min_lr > s.lr) {
    return c.Error("min_lr", "(" + std::to_string(s.min_lr) + ") must be <= lr (" +
                                 std::to_string(s.lr) + ")");
  }
  std::vector<std::string> known = {"kind",     "lr",           "weight_decay", "grad_clip",
                                    "schedule", "warmup_steps", "min_lr"};
  if (s.kind == "sgd") {
    ML_ASSIGN_OR_RETURN(s.momentum, c.GetDouble("momentum", 0.0, DRange(0, 1, false, true)));
    ML_ASSIGN_OR_RETURN(s.nesterov, c.GetBool("nesterov", false));
    if (s.nesterov && s.momentum == 0) {
      return c.Error("nesterov", "needs momentum > 0 (set optimizer.momentum, e.g. 0.9)");
    }
    known.insert(known.end(), {"momentum", "nesterov"});
  } else {
    ML_ASSIGN_OR_RETURN(s.beta1, c.GetDouble("beta1", 0.9, DRange(0, 1, false, true)));
    ML_ASSIGN_OR_RETURN(s.beta2, c.GetDouble("beta2", 0.999, DRange(0, 1, false, true)));
    ML_ASSIGN_OR_RETURN(s.eps, c.GetDouble("eps", 1e-8, DRange(0, std::nullopt, true, false)));
    known.insert(known.end(), {"beta1", "beta2", "eps"});
  }
  ML_RETURN_IF_ERROR(c.CheckKnownKeys(known));
  return s;
}

std::string OptimizerSpec::ToJson() const {
  nlohmann::json j = {{"kind", kind},
                      {"lr", lr},
                      {"momentum", momentum},
                      {"nesterov", nesterov},
                      {"beta1", beta1},
                      {"beta2", beta2},
                      {"eps", eps},
                      {"weight_decay", weight_decay},
                      {"grad_clip", grad_clip},
                      {"schedule", schedule},
                      {"warmup_steps", warmup_steps},
                      {"min_lr", min_lr},
                      {"total_steps", total_steps}};
  return j.dump();
}

Result<OptimizerSpec> OptimizerSpec::FromJson(const std::string& json, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(what + ": bad optimizer spec: not a JSON object");
  }
  try {
    OptimizerSpec s;
    s.kind = j.at("kind").get<std::string>();
    s.lr = j.at("lr").get<double>();
    s.momentum = j.at("momentum").get<double>();
    s.nesterov = j.at("nesterov").get<bool>();
    s.beta1 = j.at("beta1").get<double>();
    s.beta2 = j.at("beta2").get<double>();
    s.eps = j.at("eps").get<double>();
    s.weight_decay = j.at("weight_decay").get<double>();
    s.grad_clip = j.at("grad_clip").get<double>();
    s.schedule = j.at("schedule").get<std::string>();
    s.warmup_steps = j.at("warmup_steps").get<int64_t>();
    s.min_lr = j.at("min_lr").get<double>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(what + ": bad optimizer spec: " + e.what());
  }
}

Optimizer::Optimizer(OptimizerSpec spec, const std::vector<Param>& params)
    : spec_(std::move(spec)) {
  for (const Param& p : params) {
    param_names_.push_back(p.name);
    sizes_.push_back(p.value.size());
    total_size_ += p.value.size();
    decays_.push_back(AdamWDecays(spec_, p.value.shape()));
    if (spec_.kind == "adamw") {
      m_.emplace_back(p.value.shape());
      v_.emplace_back(p.value.shape());
    } else if (spec_.momentum > 0) {
      m_.emplace_back(p.value.shape());
    }
  }
}

float Optimizer::LearningRate(int64_t step) const { return LearningRateAt(spec_, step); }

float LearningRateAt(const OptimizerSpec& spec, int64_t step) {
  const double lr = spec.lr;
  if (spec.warmup_steps > 0 && step < spec.warmup_steps) {
    return static_cast<float>(lr * static_cast<double>(step + 1) /
                              static_cast<double>(spec.warmup_steps));
  }
  if (spec.schedule == "constant") return static_cast<float>(lr);
  const int64_t span = spec.total_steps - spec.warmup_steps;
  if (span <= 0) return static_cast<float>(spec.min_lr);
  double progress = static_cast<double>(step - spec.warmup_steps) / static_cast<double>(span);
  if (progress > 1.0) progress = 1.0;
  // cos(pi * progress) = cos(2 pi * progress/2), from the engine's own polynomial.
  double c = DetCos2Pi(progress * 0.5);
  return static_cast<float>(spec.min_lr + 0.5 * (lr - spec.min_lr) * (1.0 + c));
}

std::vector<float> GradSquareBlockPartials(const std::vector<Param>& params) {
  std::vector<int64_t> sizes(params.size());
  int64_t elements = 0, blocks = 0;
  std::vector<int64_t> first(params.size());  // parameter k's first block
  for (size_t k = 0; k < params.size(); ++k) {
    sizes[k] = params[k].grad.size();
    first[k] = blocks;
    elements += sizes[k];
    blocks += (sizes[k] + kSumBlock - 1) / kSumBlock;
  }
  std::vector<float> partials(static_cast<size_t>(blocks));
  // One region over every gradient, cut at block boundaries (pieces of 8 blocks): a model's many
  // small gradients would each run on one thread.
  ParallelForArrays(sizes.data(), static_cast<int64_t>(sizes.size()), ElementwiseThreads(elements),
                    8 * kSumBlock, [&](int64_t k, int64_t b, int64_t e) {
                      const size_t i = static_cast<size_t>(k);
                      SumSquaresBlocks(params[i].grad.data() + b, e - b,
                                       partials.data() + first[i] + b / kSumBlock);
                    });
  return partials;
}

float SumGradSquares(const std::vector<Param>& params, float total) {
  std::vector<float> partials = GradSquareBlockPartials(params);
  internal::FpEnvGuard fp_guard;  // the tree's adds, as SumSquaresTree's
  float* p = partials.data();
  for (const Param& param : params) {
    const int64_t nb = (param.grad.size() + kSumBlock - 1) / kSumBlock;
    total += nb == 0 ? 0.0f : internal::CombinePartialsTree(p, nb);
    p += nb;
  }
  return total;
}

float GlobalGradNorm(const std::vector<Param>& params) {
  return std::sqrt(SumGradSquares(params, 0.0f));
}

GradClip GradClipOf(const OptimizerSpec& spec, float norm) {
  GradClip c;
  c.clip = spec.grad_clip > 0 && norm > static_cast<float>(spec.grad_clip);
  c.scale = c.clip ? static_cast<float>(spec.grad_clip) / (norm + 1e-6f) : 1.0f;
  return c;
}

void AppendSquareBlockPartials(const float* x, int64_t n, std::vector<float>* partials) {
  const size_t at = partials->size();
  partials->resize(at + static_cast<size_t>((n + kSumBlock - 1) / kSumBlock));
  ref::SumSquaresBlocks(x, n, partials->data() + at);
}

float CombineBlockPartials(std::vector<float> p) {
  internal::FpEnvGuard fp_guard;
  if (p.empty()) return 0.0f;
  return internal::CombinePartialsTree(p.data(), static_cast<int64_t>(p.size()));
}

namespace {

// b^t by repeated squaring in double: a fixed sequence of IEEE multiplications.
double PowInt(double b, int64_t t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r *= b;
    b *= b;
    t >>= 1;
  }
  return r;
}

}  // namespace

float Optimizer::Step(std::vector<Param>& params, int64_t step) {
  const float norm = GlobalGradNorm(params);
  Update(params, step, norm);
  return norm;
}

void Optimizer::Update(std::vector<Param>& params, int64_t step, float norm) {
  CHECK_EQ(params.size(), param_names_.size());
  const auto [clip, scale] = GradClipOf(spec_, norm);
  if (spec_.kind == "adamw") {
    // The per-element update (clipping included) is the AdamWUpdate kernel: SIMD lanes and
    // threads over elements, the reference's formula (kernels.h) bit for bit.
    // All parameters in one parallel region (ParallelForArrays): the small ones would each run
    // on one thread.
    const AdamWStep s = AdamWScalars(spec_, step, scale, clip);
    ParallelForArrays(sizes_.data(), static_cast<int64_t>(sizes_.size()),
                      ElementwiseThreads(total_size_), kElementPiece,
                      [&](int64_t k, int64_t b, int64_t e) {
                        const size_t i = static_cast<size_t>(k);
                        AdamWStep sk = s;
                        sk.decay_weight = decays_[i];
                        Param& p = params[i];
                        AdamWUpdate(p.value.data() + b, p.grad.data() + b, m_[i].data() + b,
                                    v_[i].data() + b, e - b, sk);
                      });
  } else {
    if (clip) {
      for (Param& p : params) {
        float* g = p.grad.data();
        for (int64_t i = 0; i < p.grad.size(); ++i) g[i] = g[i] * scale;
      }
    }
    const bool momentum = spec_.momentum > 0;
    for (size_t k = 0; k < params.size(); ++k) {
      Param& p = params[k];
      SgdUpdate(spec_, step, p.value.shape(), p.value.data(), p.grad.data(),
                momentum ? m_[k].data() : nullptr, p.value.size());
    }
  }
}

AdamWStep AdamWScalars(const OptimizerSpec& spec, int64_t step, float grad_scale, bool clip) {
  const float lr = LearningRateAt(spec, step);
  const float wd = static_cast<float>(spec.weight_decay);
  const int64_t t = step + 1;
  AdamWStep s;
  s.b1 = static_cast<float>(spec.beta1);
  s.b2 = static_cast<float>(spec.beta2);
  s.one_minus_b1 = static_cast<float>(1.0 - spec.beta1);
  s.one_minus_b2 = static_cast<float>(1.0 - spec.beta2);
  s.step_size = static_cast<float>(lr / (1.0 - PowInt(spec.beta1, t)));
  s.bc2_sqrt = std::sqrt(static_cast<float>(1.0 - PowInt(spec.beta2, t)));
  s.eps = static_cast<float>(spec.eps);
  s.decay = 1.0f - lr * wd;
  s.grad_scale = grad_scale;
  s.scale_grad = clip;
  return s;
}

bool AdamWDecays(const OptimizerSpec& spec, const Shape& shape) {
  return static_cast<float>(spec.weight_decay) != 0.0f && shape.size() >= 2;
}

void SgdUpdate(const OptimizerSpec& spec, int64_t step, const Shape& shape, float* w,
               const float* g, float* buf, int64_t n) {
  const float lr = LearningRateAt(spec, step);
  const float wd = static_cast<float>(spec.weight_decay);
  const float mu = static_cast<float>(spec.momentum);
  const bool decayed = wd != 0.0f && shape.size() >= 2;
  for (int64_t i = 0; i < n; ++i) {
    float gi = decayed ? g[i] + wd * w[i] : g[i];
    float d = gi;
    if (buf) {
      float b = mu * buf[i] + gi;
      buf[i] = b;
      d = spec.nesterov ? gi + mu * b : b;
    }
    w[i] = w[i] - lr * d;
  }
}

std::vector<Optimizer::StateSlot> Optimizer::StateSlots(const OptimizerSpec& spec,
                                                        std::span<const std::string> param_names) {
  std::vector<StateSlot> out;
  const bool adam = spec.kind == "adamw";
  if (adam || spec.momentum > 0) {  // the constructor's m_ (adamw: m; sgd: the momentum buffer)
    for (size_t k = 0; k < param_names.size(); ++k) {
      out.push_back({(adam ? "optim.m." : "optim.momentum.") + param_names[k], k});
    }
  }
  if (adam) {  // v_
    for (size_t k = 0; k < param_names.size(); ++k) out.push_back({"optim.v." + param_names[k], k});
  }
  return out;
}

std::vector<Optimizer::NamedState> Optimizer::State() {
  std::vector<NamedState> out;
  for (const StateSlot& slot : StateSlots(spec_, param_names_)) {
    Tensor* t = out.size() < m_.size() ? &m_[slot.param] : &v_[slot.param];
    out.push_back({slot.name, t});
  }
  CHECK_EQ(out.size(), m_.size() + v_.size());
  return out;
}

}  // namespace meshlearn::engine
