#include "meshlearn/engine/model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "meshlearn/engine/init.h"
#include "meshlearn/engine/kernels.h"
#include "config_ranges.h"

namespace meshlearn::engine {
namespace {

const std::vector<std::string> kLayerKinds = {"linear", "conv2d",  "maxpool2d", "relu",
                                              "gelu",   "flatten", "dropout",   "layernorm"};

Result<LayerSpec> ParseLayer(const ConfigFile& t) {
  LayerSpec l;
  ML_ASSIGN_OR_RETURN(l.kind, t.GetEnum("kind", kLayerKinds));
  std::vector<std::string> known = {"kind"};
  if (l.kind == "linear" || l.kind == "conv2d") {
    ML_ASSIGN_OR_RETURN(l.out, t.GetInt("out", IRange(1, 1 << 20)));
    ML_ASSIGN_OR_RETURN(l.init, t.GetEnum("init", {"kaiming", "xavier", "normal", "uniform"},
                                          std::string("kaiming")));
    ML_ASSIGN_OR_RETURN(l.init_std,
                        t.GetDouble("init_std", 0.02, DRange(0, std::nullopt, true, false)));
    ML_ASSIGN_OR_RETURN(l.bias, t.GetBool("bias", true));
    known.insert(known.end(), {"out", "init", "init_std", "bias"});
  }
  if (l.kind == "conv2d") {
    ML_ASSIGN_OR_RETURN(l.kernel, t.GetInt("kernel", IRange(1, 64)));
    ML_ASSIGN_OR_RETURN(l.stride, t.GetInt("stride", 1, IRange(1, 64)));
    ML_ASSIGN_OR_RETURN(l.pad, t.GetInt("pad", 0, IRange(0, 64)));
    known.insert(known.end(), {"kernel", "stride", "pad"});
  }
  if (l.kind == "maxpool2d") {
    ML_ASSIGN_OR_RETURN(l.kernel, t.GetInt("kernel", IRange(1, 64)));
    ML_ASSIGN_OR_RETURN(l.stride, t.GetInt("stride", l.kernel, IRange(1, 64)));
    known.insert(known.end(), {"kernel", "stride"});
  }
  if (l.kind == "dropout") {
    ML_ASSIGN_OR_RETURN(l.p, t.GetDouble("p", DRange(0, 1, false, true)));
    known.push_back("p");
  }
  ML_RETURN_IF_ERROR(t.CheckKnownKeys(known));
  return l;
}

}  // namespace

Result<ModelSpec> ModelSpec::FromConfig(const ConfigFile& m) {
  ModelSpec s;
  ML_ASSIGN_OR_RETURN(s.kind, m.GetEnum("kind", {"sequential", "gpt"}, std::string("sequential")));
  if (s.kind == "gpt") {
    ML_RETURN_IF_ERROR(
        m.CheckKnownKeys({"kind", "n_layer", "n_head", "n_embd", "block_size", "vocab_size"}));
    ML_ASSIGN_OR_RETURN(s.gpt.n_layer, m.GetInt("n_layer", IRange(1, 256)));
    ML_ASSIGN_OR_RETURN(s.gpt.n_head, m.GetInt("n_head", IRange(1, 256)));
    ML_ASSIGN_OR_RETURN(s.gpt.n_embd, m.GetInt("n_embd", IRange(1, 65536)));
    ML_ASSIGN_OR_RETURN(s.gpt.block_size, m.GetInt("block_size", IRange(1, 65536)));
    // vocab_size may be omitted for text data (taken from the data); 0 means "from the data".
    ML_ASSIGN_OR_RETURN(s.gpt.vocab_size, m.GetInt("vocab_size", 0, IRange(0, 1 << 24)));
    if (s.gpt.n_embd % s.gpt.n_head != 0) {
      return m.Error("n_embd", "(" + std::to_string(s.gpt.n_embd) +
                                   ") must be divisible by n_head (" +
                                   std::to_string(s.gpt.n_head) + ")");
    }
    return s;
  }
  ML_RETURN_IF_ERROR(m.CheckKnownKeys({"kind", "input", "layers"}));
  ML_ASSIGN_OR_RETURN(s.input, m.GetIntArray("input"));
  if (s.input.empty() || s.input.size() > 3) {
    return m.Error("input", "must list 1 to 3 dimensions, e.g. [784] or [1, 28, 28]");
  }
  for (int64_t d : s.input) {
    if (d < 1) return m.Error("input", "dimensions must be >= 1");
  }
  ML_ASSIGN_OR_RETURN(std::vector<ConfigFile> layers, m.GetTableArray("layers"));
  if (layers.empty()) return m.Error("layers", "must list at least one layer ([[model.layers]])");
  for (const ConfigFile& t : layers) {
    ML_ASSIGN_OR_RETURN(LayerSpec l, ParseLayer(t));
    s.layers.push_back(std::move(l));
  }
  return s;
}

std::string ModelSpec::ToJson() const {
  nlohmann::json j;
  j["kind"] = kind;
  if (kind == "gpt") {
    j["n_layer"] = gpt.n_layer;
    j["n_head"] = gpt.n_head;
    j["n_embd"] = gpt.n_embd;
    j["block_size"] = gpt.block_size;
    j["vocab_size"] = gpt.vocab_size;
  } else {
    j["input"] = input;
    nlohmann::json ls = nlohmann::json::array();
    for (const LayerSpec& l : layers) {
      nlohmann::json lj = {{"kind", l.kind}};
      if (l.kind == "linear" || l.kind == "conv2d") {
        lj["out"] = l.out;
        lj["init"] = l.init;
        lj["init_std"] = l.init_std;
        lj["bias"] = l.bias;
      }
      if (l.kind == "conv2d" || l.kind == "maxpool2d") {
        lj["kernel"] = l.kernel;
        lj["stride"] = l.stride;
      }
      if (l.kind == "conv2d") lj["pad"] = l.pad;
      if (l.kind == "dropout") lj["p"] = l.p;
      ls.push_back(lj);
    }
    j["layers"] = ls;
  }
  return j.dump();
}

Result<ModelSpec> ModelSpec::FromJson(const std::string& json, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  auto bad = [&](const std::string& m) { return InvalidArgument(what + ": bad model spec: " + m); };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  try {
    ModelSpec s;
    s.kind = j.at("kind").get<std::string>();
    if (s.kind == "gpt") {
      s.gpt.n_layer = j.at("n_layer").get<int64_t>();
      s.gpt.n_head = j.at("n_head").get<int64_t>();
      s.gpt.n_embd = j.at("n_embd").get<int64_t>();
      s.gpt.block_size = j.at("block_size").get<int64_t>();
      s.gpt.vocab_size = j.at("vocab_size").get<int64_t>();
      return s;
    }
    if (s.kind != "sequential") return bad("unknown kind '" + s.kind + "'");
    s.input = j.at("input").get<Shape>();
    for (const nlohmann::json& lj : j.at("layers")) {
      LayerSpec l;
      l.kind = lj.at("kind").get<std::string>();
      l.out = lj.value("out", int64_t{0});
      l.init = lj.value("init", std::string("kaiming"));
      l.init_std = lj.value("init_std", 0.02);
      l.bias = lj.value("bias", true);
      l.kernel = lj.value("kernel", int64_t{0});
      l.stride = lj.value("stride", int64_t{0});
      l.pad = lj.value("pad", int64_t{0});
      l.p = lj.value("p", 0.0);
      s.layers.push_back(l);
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.value.size();
  return n;
}

Param& Model::AddParam(std::string name, Shape shape) {
  params_.push_back(Param{std::move(name), Tensor(), Tensor()});
  param_shapes_.push_back(std::move(shape));
  init_.push_back({});
  return params_.back();
}

void Model::AllocateParams() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].value = Tensor(param_shapes_[i]);
    params_[i].grad = Tensor(param_shapes_[i]);
  }
}

int64_t Model::PlannedParameters() const {
  int64_t n = 0;
  for (const Shape& s : param_shapes_) n += NumElements(s);
  return n;
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

uint64_t AvailableMemoryBytes(std::string* source) {
  if (const char* cap = std::getenv("MESHLEARN_MEMORY_BYTES"); cap && *cap) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(cap, &end, 10);
    if (end && *end == 0 && v > 0) {
      if (source) *source = "$MESHLEARN_MEMORY_BYTES";
      return v;
    }
  }
  // /proc files are small; read them directly (Env::ReadFile is for the task's files).
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (std::fgets(line, sizeof(line), f)) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        found = true;
        break;
      }
    }
    std::fclose(f);
    if (found) {
      if (source) *source = "MemAvailable in /proc/meminfo";
      return kb * 1024;
    }
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (source) *source = "free physical memory";
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : UINT64_MAX;
}

void Model::Init(uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& w = params_[i].value;
    const InitRule& r = init_[i];
    if (r.kind == "zeros") {
      w.Zero();
    } else if (r.kind == "ones") {
      std::fill(w.vec().begin(), w.vec().end(), 1.0f);
    } else if (r.kind == "kaiming") {  // He normal for ReLU: std = sqrt(2 / fan_in)
      FillNormal(w.data(), w.size(), static_cast<float>(std::sqrt(2.0 / r.fan_in)), seed, i);
    } else if (r.kind == "xavier") {  // Glorot normal: std = sqrt(2 / (fan_in + fan_out))
      FillNormal(w.data(), w.size(), static_cast<float>(std::sqrt(2.0 / (r.fan_in + r.fan_out))),
                 seed, i);
    } else if (r.kind == "uniform") {  // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), ..)
      FillUniform(w.data(), w.size(), static_cast<float>(1.0 / std::sqrt(r.fan_in)), seed, i);
    } else {
      CHECK(r.kind == "normal") << r.kind;
      FillNormal(w.data(), w.size(), static_cast<float>(r.std), seed, i);
    }
  }
}

void Model::ZeroGrad() {
  for (Param& p : params_) p.grad.Zero();
}

Batch Model::EmptyBatch(int64_t n, int64_t seq_len) const {
  Batch b;
  b.size = n;
  if (spec_.kind == "gpt") {
    b.seq_len = seq_len;
    b.tokens.assign(n * seq_len, 0);
    b.targets.assign(n * seq_len, 0);
  } else {
    Shape s = {n};
    s.insert(s.end(), spec_.input.begin(), spec_.input.end());
    b.inputs = Tensor(s);
    b.targets.assign(n, 0);
  }
  return b;
}

std::vector<int32_t> ArgmaxRows(const float* logits, int64_t rows, int64_t cols) {
  std::vector<int32_t> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * cols;
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (x[c] > x[best]) best = c;
    }
    out[r] = static_cast<int32_t>(best);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Sequential models.

namespace {

class SequentialModel final : public Model {
 public:
  explicit SequentialModel(ModelSpec spec) : Model(std::move(spec)) {}

  Status Build() {
    Shape s = spec_.input;  // per-sample shape
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      const LayerSpec& l = spec_.layers[i];
      const std::string where = "model.layers[" + std::to_string(i) + "] (" + l.kind + ")";
      const std::string prefix = "layers." + std::to_string(i) + ".";
      Layer L;
      L.spec = l;
      L.in_shape = s;
      if (l.kind == "linear") {
        if (s.size() != 1) {
          return InvalidArgument(where + ": input has shape " + ShapeToString(s) +
                                 " but linear needs a vector; add a layer with kind = \"flatten\" "
                                 "before it");
        }
        L.weight = AddLinearLike(prefix, {l.out, s[0]}, l, s[0], l.out);
        s = {l.out};
      } else if (l.kind == "conv2d") {
        if (s.size() != 3) {
          return InvalidArgument(where + ": input has shape " + ShapeToString(s) +
                                 " but conv2d needs (channels, height, width); set model.input = "
                                 "[C, H, W]");
        }
        int64_t oh = (s[1] + 2 * l.pad - l.kernel) / l.stride + 1;
        int64_t ow = (s[2] + 2 * l.pad - l.kernel) / l.stride + 1;
        if (s[1] + 2 * l.pad < l.kernel || s[2] + 2 * l.pad < l.kernel) {
          return InvalidArgument(where + ": kernel " + std::to_string(l.kernel) +
                                 " is larger than the padded input " + ShapeToString(s));
        }
        int64_t fan_in = s[0] * l.kernel * l.kernel;
        L.weight = AddLinearLike(prefix, {l.out, s[0], l.kernel, l.kernel}, l, fan_in,
                                 l.out * l.kernel * l.kernel);
        s = {l.out, oh, ow};
      } else if (l.kind == "maxpool2d") {
        if (s.size() != 3 || s[1] < l.kernel || s[2] < l.kernel) {
          return InvalidArgument(where + ": input has shape " + ShapeToString(s) +
                                 "; maxpool2d needs (channels, height, width) at least kernel (" +
                                 std::to_string(l.kernel) + ") high and wide");
        }
        s = {s[0], (s[1] - l.kernel) / l.stride + 1, (s[2] - l.kernel) / l.stride + 1};
      } else if (l.kind == "flatten") {
        s = {NumElements(s)};
      } else if (l.kind == "layernorm") {
        L.weight = static_cast<int>(params_.size());
        AddParam(prefix + "weight", {s.back()});
        init_.back().kind = "ones";
        AddParam(prefix + "bias", {s.back()});
        init_.back().kind = "zeros";
      }
      L.out_shape = s;
      layers_.push_back(L);
    }
    if (s.size() != 1 || s[0] < 2) {
      return InvalidArgument(
          "model.layers: the last layer must output a vector of class logits "
          "(at least 2), got shape " +
          ShapeToString(s) + "; end with a linear layer with out = number of classes");
    }
    num_outputs_ = s[0];
    return Status::Ok();
  }

  int64_t NumOutputs() const override { return num_outputs_; }

  // Forward keeps every layer's output (and masks, argmax); Backward one input gradient and
  // scratch per layer: about twice each side.
  double ActivationFloats(int64_t B, int64_t) const override {
    double per_sample = 2.0 * static_cast<double>(num_outputs_);
    for (const Layer& L : layers_) {
      per_sample += 2.0 * static_cast<double>(NumElements(L.in_shape)) +
                    2.0 * static_cast<double>(NumElements(L.out_shape));
    }
    return per_sample * static_cast<double>(B);
  }

  std::string LargestKey() const override {
    std::string key = "model.layers";
    int64_t most = -1;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].weight < 0) continue;
      int64_t n = NumElements(param_shapes_[static_cast<size_t>(layers_[i].weight)]);
      if (n > most) {
        most = n;
        key = "model.layers[" + std::to_string(i) + "] (" + layers_[i].spec.kind + ", out = " +
              std::to_string(layers_[i].spec.out) + ")";
      }
    }
    return key;
  }

  float Forward(const Batch& batch, const ForwardOptions& opts) override {
    const int64_t B = batch.size;
    CHECK_EQ(batch.inputs.size(), B * NumElements(spec_.input)) << "batch input shape";
    CHECK_EQ(static_cast<int64_t>(batch.targets.size()), B);
    arena_.Reset();
    train_ = opts.train;
    B_ = B;
    acts_.assign(layers_.size() + 1, nullptr);
    acts_[0] = batch.inputs.data();
    targets_ = batch.targets.data();
    for (size_t i = 0; i < layers_.size(); ++i) {
      Layer& L = layers_[i];
      const LayerSpec& l = L.spec;
      const int64_t in_n = B * NumElements(L.in_shape);
      const int64_t out_n = B * NumElements(L.out_shape);
      const float* in = acts_[i];
      if (l.kind == "flatten") {
        acts_[i + 1] = acts_[i];
        continue;
      }
      float* out = arena_.Alloc({out_n}).data();
      acts_[i + 1] = out;
      if (l.kind == "linear") {
        LinearForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0], l.out);
      } else if (l.kind == "conv2d") {
        Conv2dForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0],
                      L.in_shape[1], L.in_shape[2], l.out, l.kernel, l.kernel, l.stride, l.pad);
      } else if (l.kind == "maxpool2d") {
        L.argmax = arena_.AllocInt32(out_n);
        MaxPool2dForward(out, L.argmax, in, B, L.in_shape[0], L.in_shape[1], L.in_shape[2],
                         l.kernel, l.stride);
      } else if (l.kind == "relu") {
        ReluForward(out, in, in_n);
      } else if (l.kind == "gelu") {
        GeluForward(out, in, in_n);
      } else if (l.kind == "dropout") {
        if (opts.train && l.p > 0) {
          L.mask = arena_.Alloc({in_n}).data();
          DropoutForward(out, L.mask, in, in_n, static_cast<float>(l.p), opts.dropout_seed,
                         opts.step << 16 | i);
        } else {
          acts_[i + 1] = acts_[i];
          L.mask = nullptr;
        }
      } else if (l.kind == "layernorm") {
        const int64_t C = L.in_shape.back();
        const int64_t N = in_n / C;
        L.mean = arena_.Alloc({N}).data();
        L.rstd = arena_.Alloc({N}).data();
        LayerNormForward(out, L.mean, L.rstd, in, params_[L.weight].value.data(),
                         params_[L.weight + 1].value.data(), N, C);
      }
      if (trace_) TraceOp("layers." + std::to_string(i) + ".out", acts_[i + 1], B, out_n / B);
    }
    logits_ = acts_.back();
    probs_ = arena_.Alloc({B, num_outputs_}).data();
    float* losses = arena_.Alloc({B}).data();
    float loss = SoftmaxCrossEntropyForward(probs_, losses, logits_, targets_, B, num_outputs_);
    TraceOp("loss", losses, B, 1);
    return loss;
  }

  TensorView logits() const override {
    return TensorView(const_cast<float*>(logits_), {B_, num_outputs_});
  }

  void Backward() override {
    CHECK(train_) << "Backward() needs a Forward() with opts.train";
    const int64_t B = B_;
    float* dout = arena_.AllocZeroed({B, num_outputs_}).data();
    SoftmaxCrossEntropyBackward(dout, probs_, targets_, 1.0f, B, num_outputs_);
    TraceOp("logits.grad", dout, B, num_outputs_);
    for (size_t ii = layers_.size(); ii-- > 0;) {
      Layer& L = layers_[ii];
      const LayerSpec& l = L.spec;
      const int64_t in_n = B * NumElements(L.in_shape);
      const float* in = acts_[ii];
      const bool need_dinp = ii > 0;  // no gradient for the data
      if (l.kind == "flatten" || (l.kind == "dropout" && !L.mask)) continue;  // dout passes through
      float* dinp = need_dinp ? arena_.AllocZeroed({in_n}).data() : nullptr;
      if (l.kind == "linear") {
        LinearBackward(dinp, params_[L.weight].grad.data(), BiasGrad(L), dout, in,
                       params_[L.weight].value.data(), B, L.in_shape[0], l.out);
      } else if (l.kind == "conv2d") {
        Conv2dBackward(dinp, params_[L.weight].grad.data(), BiasGrad(L), dout, in,
                       params_[L.weight].value.data(), B, L.in_shape[0], L.in_shape[1],
                       L.in_shape[2], l.out, l.kernel, l.kernel, l.stride, l.pad);
      } else if (!need_dinp) {
        // Elementwise / pooling layers first in the stack have nothing to accumulate.
      } else if (l.kind == "maxpool2d") {
        MaxPool2dBackward(dinp, dout, L.argmax, B, L.out_shape[0], L.out_shape[1], L.out_shape[2]);
      } else if (l.kind == "relu") {
        ReluBackward(dinp, dout, in, in_n);
      } else if (l.kind == "gelu") {
        GeluBackward(dinp, dout, in, in_n);
      } else if (l.kind == "dropout") {
        DropoutBackward(dinp, dout, L.mask, in_n);
      } else if (l.kind == "layernorm") {
        const int64_t C = L.in_shape.back();
        LayerNormBackward(dinp, params_[L.weight].grad.data(), params_[L.weight + 1].grad.data(),
                          dout, in, params_[L.weight].value.data(), L.mean, L.rstd, in_n / C, C);
      }
      if (l.kind == "layernorm" && !need_dinp) {
        // Parameter gradients still needed when layernorm is the first layer.
        const int64_t C = L.in_shape.back();
        float* scratch = arena_.AllocZeroed({in_n}).data();
        LayerNormBackward(scratch, params_[L.weight].grad.data(), params_[L.weight + 1].grad.data(),
                          dout, in, params_[L.weight].value.data(), L.mean, L.rstd, in_n / C, C);
      }
      if (trace_ && dinp) TraceOp("layers." + std::to_string(ii) + ".in.grad", dinp, B, in_n / B);
      dout = dinp;
    }
    TraceParamGrads();
  }

 private:
  struct Layer {
    LayerSpec spec;
    Shape in_shape, out_shape;
    int weight = -1;  // index into params_ (bias, if any, is weight + 1)
    bool has_bias = false;
    int32_t* argmax = nullptr;
    float* mask = nullptr;
    float* mean = nullptr;
    float* rstd = nullptr;
  };

  int AddLinearLike(const std::string& prefix, Shape wshape, const LayerSpec& l, int64_t fan_in,
                    int64_t fan_out) {
    int idx = static_cast<int>(params_.size());
    AddParam(prefix + "weight", wshape);
    init_.back() = {l.init, static_cast<double>(fan_in), static_cast<double>(fan_out), l.init_std};
    if (l.bias) {
      AddParam(prefix + "bias", {wshape[0]});
      init_.back().kind = "zeros";
    }
    return idx;
  }
  const float* Bias(const Layer& L) const {
    return L.spec.bias ? params_[L.weight + 1].value.data() : nullptr;
  }
  float* BiasGrad(Layer& L) { return L.spec.bias ? params_[L.weight + 1].grad.data() : nullptr; }

  std::vector<Layer> layers_;
  int64_t num_outputs_ = 0;
  // Per-step state.
  bool train_ = false;
  int64_t B_ = 0;
  std::vector<const float*> acts_;
  const float* logits_ = nullptr;
  float* probs_ = nullptr;
  const int32_t* targets_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// GPT-2 style decoder (llm.c's train_gpt2.c structure; weights tied between wte and the LM head).

class GptModel final : public Model {
 public:
  explicit GptModel(ModelSpec spec) : Model(std::move(spec)) {}

  Status Build() {
    const GptSpec& g = spec_.gpt;
    if (g.vocab_size < 2) {
      return InvalidArgument("model.vocab_size must be >= 2 (or come from the data), got " +
                             std::to_string(g.vocab_size));
    }
    const int64_t C = g.n_embd, V = g.vocab_size, L = g.n_layer;
    const double proj_std = 0.02 / std::sqrt(2.0 * L);
    auto normal = [&](const std::string& name, Shape s, double std) {
      AddParam(name, std::move(s));
      init_.back() = {"normal", 0, 0, std};
    };
    auto fixed = [&](const std::string& name, Shape s, const char* kind) {
      AddParam(name, std::move(s));
      init_.back().kind = kind;
    };
    normal("transformer.wte.weight", {V, C}, 0.02);
    normal("transformer.wpe.weight", {g.block_size, C}, 0.02);
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      fixed(p + "ln_1.weight", {C}, "ones");
      fixed(p + "ln_1.bias", {C}, "zeros");
      normal(p + "attn.c_attn.weight", {3 * C, C}, 0.02);
      fixed(p + "attn.c_attn.bias", {3 * C}, "zeros");
      normal(p + "attn.c_proj.weight", {C, C}, proj_std);
      fixed(p + "attn.c_proj.bias", {C}, "zeros");
      fixed(p + "ln_2.weight", {C}, "ones");
      fixed(p + "ln_2.bias", {C}, "zeros");
      normal(p + "mlp.c_fc.weight", {4 * C, C}, 0.02);
      fixed(p + "mlp.c_fc.bias", {4 * C}, "zeros");
      normal(p + "mlp.c_proj.weight", {C, 4 * C}, proj_std);
      fixed(p + "mlp.c_proj.bias", {C}, "zeros");
    }
    fixed("transformer.ln_f.weight", {C}, "ones");
    fixed("transformer.ln_f.bias", {C}, "zeros");
    return Status::Ok();
  }

  int64_t NumOutputs() const override { return spec_.gpt.vocab_size; }

  // Per token and layer (llm.c's activation list): ~16 C plus the attention rows (2 NH T); then
  // the logits and probabilities (2 V). Doubled for the backward pass's buffers.
  double ActivationFloats(int64_t B, int64_t T) const override {
    const GptSpec& g = spec_.gpt;
    if (T <= 0) T = g.block_size;
    const double per_token =
        static_cast<double>(g.n_layer) * (16.0 * g.n_embd + 2.0 * g.n_head * T) +
        4.0 * g.n_embd + 2.0 * g.vocab_size;
    return 2.0 * per_token * static_cast<double>(B) * static_cast<double>(T);
  }

  std::string LargestKey() const override {
    const GptSpec& g = spec_.gpt;
    const double blocks = 12.0 * g.n_embd * g.n_embd * g.n_layer;
    const double embeddings = static_cast<double>(g.vocab_size + g.block_size) * g.n_embd;
    return blocks >= embeddings
               ? "model.n_layer = " + std::to_string(g.n_layer) + " x model.n_embd = " +
                     std::to_string(g.n_embd)
               : "model.vocab_size = " + std::to_string(g.vocab_size) + " x model.n_embd = " +
                     std::to_string(g.n_embd);
  }

  // Parameter accessors: layer l, slot k (0..11 in the order of Build()).
  float* P(int64_t l, int k) { return params_[2 + l * 12 + k].value.data(); }
  float* G(int64_t l, int k) { return params_[2 + l * 12 + k].grad.data(); }

  float Forward(const Batch& batch, const ForwardOptions& opts) override {
    const GptSpec& g = spec_.gpt;
    const int64_t B = batch.size, T = batch.seq_len, C = g.n_embd, V = g.vocab_size, NH = g.n_head,
                  NL = g.n_layer;
    CHECK(T >= 1 && T <= g.block_size) << "T=" << T;
    CHECK_EQ(static_cast<int64_t>(batch.tokens.size()), B * T);
    CHECK_EQ(static_cast<int64_t>(batch.targets.size()), B * T);
    const int64_t N = B * T;
    arena_.Reset();
    train_ = opts.train;
    B_ = B;
    T_ = T;
    tokens_ = batch.tokens.data();
    targets_ = batch.targets.data();
    pos_ = arena_.AllocInt32(N);
    for (int64_t i = 0; i < N; ++i) pos_[i] = static_cast<int32_t>(i % T);

    float* tok = arena_.Alloc({N, C}).data();
    float* pos = arena_.Alloc({N, C}).data();
    encoded_ = arena_.Alloc({N, C}).data();
    EmbeddingForward(tok, tokens_, params_[0].value.data(), N, C);
    EmbeddingForward(pos, pos_, params_[1].value.data(), N, C);
    ResidualForward(encoded_, tok, pos, N * C);
    TraceOp("encoded", encoded_, N, C);

    acts_.assign(NL, {});
    const float* residual = encoded_;
    for (int64_t l = 0; l < NL; ++l) {
      Acts& a = acts_[l];
      a.residual = residual;
      a.ln1 = Alloc(N * C);
      a.ln1_mean = Alloc(N);
      a.ln1_rstd = Alloc(N);
      a.qkv = Alloc(N * 3 * C);
      a.atty = Alloc(N * C);
      a.preatt = Alloc(B * NH * T * T);
      a.att = Alloc(B * NH * T * T);
      a.attproj = Alloc(N * C);
      a.residual2 = Alloc(N * C);
      a.ln2 = Alloc(N * C);
      a.ln2_mean = Alloc(N);
      a.ln2_rstd = Alloc(N);
      a.fch = Alloc(N * 4 * C);
      a.fch_gelu = Alloc(N * 4 * C);
      a.fcproj = Alloc(N * C);
      a.residual3 = Alloc(N * C);
      LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, P(l, 0), P(l, 1), N, C);
      LinearForward(a.qkv, a.ln1, P(l, 2), P(l, 3), N, C, 3 * C);
      AttentionForward(a.atty, a.preatt, a.att, a.qkv, B, T, C, NH);
      LinearForward(a.attproj, a.atty, P(l, 4), P(l, 5), N, C, C);
      ResidualForward(a.residual2, residual, a.attproj, N * C);
      LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, P(l, 6), P(l, 7), N, C);
      LinearForward(a.fch, a.ln2, P(l, 8), P(l, 9), N, C, 4 * C);
      GeluForward(a.fch_gelu, a.fch, N * 4 * C);
      LinearForward(a.fcproj, a.fch_gelu, P(l, 10), P(l, 11), N, 4 * C, C);
      ResidualForward(a.residual3, a.residual2, a.fcproj, N * C);
      residual = a.residual3;
      if (trace_) {
        const std::string p = "h." + std::to_string(l) + ".";
        TraceOp(p + "ln1", a.ln1, N, C);
        TraceOp(p + "qkv", a.qkv, N, 3 * C);
        TraceOp(p + "att", a.att, B * NH * T, T);
        TraceOp(p + "atty", a.atty, N, C);
        TraceOp(p + "attproj", a.attproj, N, C);
        TraceOp(p + "residual2", a.residual2, N, C);
        TraceOp(p + "ln2", a.ln2, N, C);
        TraceOp(p + "fch", a.fch, N, 4 * C);
        TraceOp(p + "fch_gelu", a.fch_gelu, N, 4 * C);
        TraceOp(p + "fcproj", a.fcproj, N, C);
        TraceOp(p + "residual3", a.residual3, N, C);
      }
    }
    last_residual_ = residual;
    lnf_ = Alloc(N * C);
    lnf_mean_ = Alloc(N);
    lnf_rstd_ = Alloc(N);
    const int lnf = static_cast<int>(params_.size()) - 2;
    LayerNormForward(lnf_, lnf_mean_, lnf_rstd_, residual, params_[lnf].value.data(),
                     params_[lnf + 1].value.data(), N, C);
    logits_ = Alloc(N * V);
    LinearForward(logits_, lnf_, params_[0].value.data(), nullptr, N, C, V);
    probs_ = Alloc(N * V);
    float* losses = Alloc(N);
    float loss = SoftmaxCrossEntropyForward(probs_, losses, logits_, targets_, N, V);
    TraceOp("ln_f", lnf_, N, C);
    TraceOp("logits", logits_, N, V);
    TraceOp("loss", losses, N, 1);
    return loss;
  }

  TensorView logits() const override {
    return TensorView(logits_, {B_ * T_, spec_.gpt.vocab_size});
  }

  void Backward() override {
    CHECK(train_) << "Backward() needs a Forward() with opts.train";
    const GptSpec& g = spec_.gpt;
    const int64_t B = B_, T = T_, C = g.n_embd, V = g.vocab_size, NH = g.n_head, NL = g.n_layer;
    const int64_t N = B * T;
    const int lnf = static_cast<int>(params_.size()) - 2;
    float* dlogits = Zeroed(N * V);
    SoftmaxCrossEntropyBackward(dlogits, probs_, targets_, 1.0f, N, V);
    float* dlnf = Zeroed(N * C);
    LinearBackward(dlnf, params_[0].grad.data(), nullptr, dlogits, lnf_, params_[0].value.data(), N,
                   C, V);
    float* dresidual = Zeroed(N * C);
    LayerNormBackward(dresidual, params_[lnf].grad.data(), params_[lnf + 1].grad.data(), dlnf,
                      last_residual_, params_[lnf].value.data(), lnf_mean_, lnf_rstd_, N, C);
    TraceOp("logits.grad", dlogits, N, V);
    TraceOp("ln_f.grad", dlnf, N, C);
    TraceOp("residual.grad", dresidual, N, C);
    // One set of per-layer gradient buffers serves every layer (each is zeroed when the layer
    // starts using it, as a fresh zeroed buffer was): only the residual gradient crosses layers,
    // and it alternates between two buffers. For code-gpt-10m at 8 x 256 tokens this keeps ~360
    // MB of the peak resident set that a copy per layer took.
    float* const buf_dresidual2 = Alloc(N * C);
    float* const buf_dfcproj = Alloc(N * C);
    float* const buf_dfch_gelu = Alloc(N * 4 * C);
    float* const buf_dfch = Alloc(N * 4 * C);
    float* const buf_dln2 = Alloc(N * C);
    float* const buf_dres_in[2] = {Alloc(N * C), Alloc(N * C)};
    float* const buf_dattproj = Alloc(N * C);
    float* const buf_datty = Alloc(N * C);
    float* const buf_dqkv = Alloc(N * 3 * C);
    float* const buf_dpreatt = Alloc(B * NH * T * T);
    float* const buf_datt = Alloc(B * NH * T * T);
    float* const buf_dln1 = Alloc(N * C);
    auto zeroed = [](float* p, int64_t n) {
      ZeroFloats(p, n);
      return p;
    };
    for (int64_t l = NL; l-- > 0;) {
      Acts& a = acts_[l];
      // residual3 = residual2 + fcproj
      float* dresidual2 = zeroed(buf_dresidual2, N * C);
      float* dfcproj = zeroed(buf_dfcproj, N * C);
      ResidualBackward(dresidual2, dfcproj, dresidual, N * C);
      float* dfch_gelu = zeroed(buf_dfch_gelu, N * 4 * C);
      LinearBackward(dfch_gelu, G(l, 10), G(l, 11), dfcproj, a.fch_gelu, P(l, 10), N, 4 * C, C);
      float* dfch = zeroed(buf_dfch, N * 4 * C);
      GeluBackward(dfch, dfch_gelu, a.fch, N * 4 * C);
      float* dln2 = zeroed(buf_dln2, N * C);
      LinearBackward(dln2, G(l, 8), G(l, 9), dfch, a.ln2, P(l, 8), N, C, 4 * C);
      LayerNormBackward(dresidual2, G(l, 6), G(l, 7), dln2, a.residual2, P(l, 6), a.ln2_mean,
                        a.ln2_rstd, N, C);
      // residual2 = residual + attproj
      float* dres_in = zeroed(buf_dres_in[l % 2], N * C);
      float* dattproj = zeroed(buf_dattproj, N * C);
      ResidualBackward(dres_in, dattproj, dresidual2, N * C);
      float* datty = zeroed(buf_datty, N * C);
      LinearBackward(datty, G(l, 4), G(l, 5), dattproj, a.atty, P(l, 4), N, C, C);
      float* dqkv = zeroed(buf_dqkv, N * 3 * C);
      // AttentionBackward overwrites its two (B, NH, T, T) scratch outputs: no zeroing.
      float* dpreatt = buf_dpreatt;
      float* datt = buf_datt;
      AttentionBackward(dqkv, dpreatt, datt, datty, a.qkv, a.att, B, T, C, NH);
      float* dln1 = zeroed(buf_dln1, N * C);
      LinearBackward(dln1, G(l, 2), G(l, 3), dqkv, a.ln1, P(l, 2), N, C, 3 * C);
      LayerNormBackward(dres_in, G(l, 0), G(l, 1), dln1, a.residual, P(l, 0), a.ln1_mean,
                        a.ln1_rstd, N, C);
      dresidual = dres_in;
      if (trace_) {
        const std::string p = "h." + std::to_string(l) + ".";
        TraceOp(p + "residual3.grad", dresidual2, N, C);
        TraceOp(p + "fch.grad", dfch, N, 4 * C);
        TraceOp(p + "qkv.grad", dqkv, N, 3 * C);
        TraceOp(p + "residual.grad", dres_in, N, C);
      }
    }
    // encoded = wte[tokens] + wpe[pos]
    EmbeddingBackward(params_[0].grad.data(), dresidual, tokens_, N, C, V);
    EmbeddingBackward(params_[1].grad.data(), dresidual, pos_, N, C, g.block_size);
    TraceParamGrads();
  }

 private:
  struct Acts {
    const float* residual = nullptr;
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *preatt, *att, *attproj, *residual2, *ln2,
        *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
  };
  float* Alloc(int64_t n) { return arena_.Alloc({n}).data(); }
  float* Zeroed(int64_t n) { return arena_.AllocZeroed({n}).data(); }

  bool train_ = false;
  int64_t B_ = 0, T_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  int32_t* pos_ = nullptr;
  float* encoded_ = nullptr;
  std::vector<Acts> acts_;
  const float* last_residual_ = nullptr;
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  float *logits_ = nullptr, *probs_ = nullptr;
};

}  // namespace

namespace {

// Builds the model's plan: names, shapes, layers; nothing allocated yet.
Result<std::unique_ptr<Model>> Plan(const ModelSpec& spec) {
  if (spec.kind == "gpt") {
    auto m = std::make_unique<GptModel>(spec);
    ML_RETURN_IF_ERROR(m->Build());
    return std::unique_ptr<Model>(std::move(m));
  }
  auto m = std::make_unique<SequentialModel>(spec);
  ML_RETURN_IF_ERROR(m->Build());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

MemoryEstimate Model::PlannedMemory(int64_t B, int64_t T) const {
  MemoryEstimate e;
  e.num_parameters = PlannedParameters();
  e.parameters = 4.0 * static_cast<double>(e.num_parameters);
  e.gradients = e.parameters;
  e.activations = 4.0 * ActivationFloats(B, T);
  e.largest = LargestKey();
  return e;
}

Result<MemoryEstimate> EstimateMemory(const ModelSpec& spec, int64_t batch, int64_t seq_len,
                                      const std::string& optimizer_kind, bool sgd_momentum) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec));
  MemoryEstimate e = m->PlannedMemory(std::max<int64_t>(1, batch), seq_len);
  const double moments = optimizer_kind == "adamw"                  ? 2.0
                         : optimizer_kind == "sgd" && sgd_momentum ? 1.0
                                                                   : 0.0;
  e.optimizer = moments * e.parameters;
  return e;
}

Result<int64_t> ModelOutputs(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec));
  return m->NumOutputs();
}

Result<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec));
  MemoryEstimate e = m->PlannedMemory(1, 1);
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  if (e.parameters + e.gradients > static_cast<double>(available)) {
    return ResourceExhausted(e.largest + ": the model has " + std::to_string(e.num_parameters) +
                             " parameters; its weights and gradients need " +
                             FormatBytes(e.parameters + e.gradients) + " but this machine has " +
                             FormatBytes(static_cast<double>(available)) + " available (" +
                             source + "); make the model smaller");
  }
  m->AllocateParams();
  return m;
}

Result<std::unique_ptr<Model>> Model::CreateUnchecked(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec));
  m->AllocateParams();
  return m;
}

}  // namespace meshlearn::engine
