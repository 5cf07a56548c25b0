#include "meshlearn/engine/model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "config_ranges.h"
#include "meshlearn/engine/init.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/threadpool.h"

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

Result<ModelSpec> ModelSpec::FromToml(std::string_view text, std::string what) {
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(text, std::move(what)));
  ML_ASSIGN_OR_RETURN(ConfigFile model, cfg.GetTable("model"));
  return FromConfig(model);
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
    const uint64_t stream = param_index_[i];  // the whole model's index: a part inits the same
    if (r.kind == "zeros") {
      w.Zero();
    } else if (r.kind == "ones") {
      std::fill(w.vec().begin(), w.vec().end(), 1.0f);
    } else if (r.kind == "kaiming") {  // He normal for ReLU: std = sqrt(2 / fan_in)
      FillNormal(w.data(), w.size(), static_cast<float>(std::sqrt(2.0 / r.fan_in)), seed, stream);
    } else if (r.kind == "xavier") {  // Glorot normal: std = sqrt(2 / (fan_in + fan_out))
      FillNormal(w.data(), w.size(), static_cast<float>(std::sqrt(2.0 / (r.fan_in + r.fan_out))),
                 seed, stream);
    } else if (r.kind == "uniform") {  // PyTorch's nn.Linear default: U(-1/sqrt(fan_in), ..)
      FillUniform(w.data(), w.size(), static_cast<float>(1.0 / std::sqrt(r.fan_in)), seed, stream);
    } else {
      CHECK(r.kind == "normal") << r.kind;
      FillNormal(w.data(), w.size(), static_cast<float>(r.std), seed, stream);
    }
  }
}

void Model::ZeroGrad() {
  // All gradients in one parallel region (ParallelForArrays): most are small.
  std::vector<int64_t> sizes(params_.size());
  int64_t total = 0;
  for (size_t k = 0; k < params_.size(); ++k) total += sizes[k] = params_[k].grad.size();
  ParallelForArrays(sizes.data(), static_cast<int64_t>(sizes.size()), ElementwiseThreads(total),
                    kElementPiece, [&](int64_t k, int64_t b, int64_t e) {
                      std::memset(params_[static_cast<size_t>(k)].grad.data() + b, 0,
                                  static_cast<size_t>(e - b) * sizeof(float));
                    });
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

uint64_t DropoutStream(uint64_t step, uint64_t layer, uint64_t micro_batch) {
  return (step << 16 | layer) + (micro_batch << 48);
}

namespace {

class SequentialTape final : public Tape {
 public:
  // Runtime pointers of one layer (into the arena).
  struct LayerActs {
    int32_t* argmax = nullptr;
    float* mask = nullptr;
    float* mean = nullptr;
    float* rstd = nullptr;
  };
  bool train = false;
  int64_t B = 0;
  std::vector<const float*> acts;  // acts[i - begin]: the input of layer i; acts.back(): output
  std::vector<LayerActs> layer;    // layer[i - begin]
  const float* logits = nullptr;
  float* probs = nullptr;
  const int32_t* targets = nullptr;
  const float* input_grad = nullptr;
};

class SequentialModel final : public Model {
 public:
  SequentialModel(ModelSpec spec, ModelPart part) : Model(std::move(spec), part) {}

  Status Build() {
    Shape s = spec_.input;  // per-sample shape
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      const LayerSpec& l = spec_.layers[i];
      const std::string where = "model.layers[" + std::to_string(i) + "] (" + l.kind + ")";
      const std::string prefix = "layers." + std::to_string(i) + ".";
      const bool keep = InPart(static_cast<int64_t>(i));
      Layer L;
      L.spec = l;
      L.in_shape = s;
      if (l.kind == "linear") {
        if (s.size() != 1) {
          return InvalidArgument(where + ": input has shape " + ShapeToString(s) +
                                 " but linear needs a vector; add a layer with kind = \"flatten\" "
                                 "before it");
        }
        L.weight = AddLinearLike(prefix, {l.out, s[0]}, l, s[0], l.out, keep);
        L.weight_elems = l.out * s[0];
        L.num_params = L.weight_elems + (l.bias ? l.out : 0);
        L.macs = s[0] * l.out;
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
                                 l.out * l.kernel * l.kernel, keep);
        L.weight_elems = l.out * fan_in;
        L.num_params = L.weight_elems + (l.bias ? l.out : 0);
        L.macs = fan_in * l.out * oh * ow;
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
        L.weight = keep ? static_cast<int>(params_.size()) : -1;
        AddParam(prefix + "weight", {s.back()}, keep).kind = "ones";
        AddParam(prefix + "bias", {s.back()}, keep).kind = "zeros";
        L.weight_elems = s.back();
        L.num_params = 2 * s.back();
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
  // scratch per layer: about twice each side. The loss's probabilities and logits' gradient go
  // with the last layer.
  std::vector<LayerCost> Costs(int64_t) const override {
    std::vector<LayerCost> out;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      LayerCost c;
      c.name = "model.layers[" + std::to_string(i) + "] (" + L.spec.kind + ")";
      c.parameters = L.num_params;
      c.flops = 6 * static_cast<uint64_t>(L.macs);
      c.activation_floats = 2.0 * static_cast<double>(NumElements(L.in_shape)) +
                            2.0 * static_cast<double>(NumElements(L.out_shape));
      if (i + 1 == layers_.size()) c.activation_floats += 2.0 * static_cast<double>(num_outputs_);
      out.push_back(std::move(c));
    }
    return out;
  }

  std::string LargestKey() const override {
    std::string key = "model.layers";
    int64_t most = -1;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].weight_elems == 0) continue;
      if (layers_[i].weight_elems > most) {
        most = layers_[i].weight_elems;
        key = "model.layers[" + std::to_string(i) + "] (" + layers_[i].spec.kind +
              ", out = " + std::to_string(layers_[i].spec.out) + ")";
      }
    }
    return key;
  }

  std::unique_ptr<Tape> MakeTape() const override { return std::make_unique<SequentialTape>(); }

  float ForwardPart(Tape& tape, const Batch& batch, std::span<const float> input,
                    const ForwardOptions& opts) override {
    SequentialTape& tp = static_cast<SequentialTape&>(tape);
    const int64_t B = batch.size;
    const size_t begin = static_cast<size_t>(part_.begin), end = static_cast<size_t>(part_.end);
    tp.arena.Reset();
    tp.train = opts.train;
    tp.B = B;
    tp.acts.assign(end - begin + 1, nullptr);
    tp.layer.assign(end - begin, {});
    tp.input_grad = nullptr;
    if (begin == 0) {
      CHECK_EQ(batch.inputs.size(), B * NumElements(spec_.input)) << "batch input shape";
      tp.acts[0] = batch.inputs.data();
    } else {
      CHECK_EQ(static_cast<int64_t>(input.size()), B * NumElements(layers_[begin].in_shape))
          << "input activations of layer " << begin;
      tp.acts[0] = input.data();
    }
    if (has_loss()) {
      CHECK_EQ(static_cast<int64_t>(batch.targets.size()), B);
      tp.targets = batch.targets.data();
    }
    for (size_t i = begin; i < end; ++i) {
      Layer& L = layers_[i];
      const LayerSpec& l = L.spec;
      SequentialTape::LayerActs& la = tp.layer[i - begin];
      const int64_t in_n = B * NumElements(L.in_shape);
      const int64_t out_n = B * NumElements(L.out_shape);
      const float* in = tp.acts[i - begin];
      if (l.kind == "flatten") {
        tp.acts[i - begin + 1] = in;
        continue;
      }
      float* out = tp.arena.Alloc({out_n}).data();
      tp.acts[i - begin + 1] = out;
      if ((l.kind == "linear" || l.kind == "conv2d") && FuseRelu(i, i + 1)) {
        // The ReLU is applied where the GEMM (or direct convolution) stores each tile; the
        // layer's output is not kept. The ReLU's backward masks with its output in its place:
        // relu(x) > 0 exactly when x > 0.
        if (l.kind == "linear") {
          LinearReluForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0],
                            l.out);
        } else {
          Conv2dReluForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0],
                            L.in_shape[1], L.in_shape[2], l.out, l.kernel, l.kernel, l.stride,
                            l.pad);
        }
        tp.acts[i - begin + 2] = out;
        ++i;
        continue;
      }
      if (l.kind == "linear") {
        LinearForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0], l.out);
      } else if (l.kind == "conv2d") {
        Conv2dForward(out, in, params_[L.weight].value.data(), Bias(L), B, L.in_shape[0],
                      L.in_shape[1], L.in_shape[2], l.out, l.kernel, l.kernel, l.stride, l.pad);
      } else if (l.kind == "maxpool2d") {
        la.argmax = tp.arena.AllocInt32(out_n);
        MaxPool2dForward(out, la.argmax, in, B, L.in_shape[0], L.in_shape[1], L.in_shape[2],
                         l.kernel, l.stride);
      } else if (l.kind == "relu") {
        ReluForward(out, in, in_n);
      } else if (l.kind == "gelu") {
        GeluForward(out, in, in_n);
      } else if (l.kind == "dropout") {
        if (opts.train && l.p > 0) {
          la.mask = tp.arena.Alloc({in_n}).data();
          DropoutForward(out, la.mask, in, in_n, static_cast<float>(l.p), opts.dropout_seed,
                         DropoutStream(opts.step, i, opts.micro_batch));
        } else {
          tp.acts[i - begin + 1] = in;
          la.mask = nullptr;
        }
      } else if (l.kind == "layernorm") {
        const int64_t C = L.in_shape.back();
        const int64_t N = in_n / C;
        la.mean = tp.arena.Alloc({N}).data();
        la.rstd = tp.arena.Alloc({N}).data();
        LayerNormForward(out, la.mean, la.rstd, in, params_[L.weight].value.data(),
                         params_[L.weight + 1].value.data(), N, C);
      }
      if (trace_)
        TraceOp("layers." + std::to_string(i) + ".out", tp.acts[i - begin + 1], B, out_n / B);
    }
    if (!has_loss()) return 0.0f;
    tp.logits = tp.acts.back();
    tp.probs = tp.arena.Alloc({B, num_outputs_}).data();
    float* losses = tp.arena.Alloc({B}).data();
    float loss =
        SoftmaxCrossEntropyForward(tp.probs, losses, tp.logits, tp.targets, B, num_outputs_);
    TraceOp("loss", losses, B, 1);
    return loss;
  }

  std::span<const float> PartOutput(const Tape& tape) const override {
    const SequentialTape& tp = static_cast<const SequentialTape&>(tape);
    const Layer& last = layers_[static_cast<size_t>(part_.end - 1)];
    return {tp.acts.back(), static_cast<size_t>(tp.B * NumElements(last.out_shape))};
  }

  std::span<const float> PartInputGrad(const Tape& tape) const override {
    const SequentialTape& tp = static_cast<const SequentialTape&>(tape);
    CHECK(tp.input_grad != nullptr) << "PartInputGrad: no BackwardPart of a part with an input";
    const Layer& first = layers_[static_cast<size_t>(part_.begin)];
    return {tp.input_grad, static_cast<size_t>(tp.B * NumElements(first.in_shape))};
  }

  int64_t PartInputSize(int64_t B, int64_t) const override {
    return B * NumElements(layers_[static_cast<size_t>(part_.begin)].in_shape);
  }

  TensorView TapeLogits(const Tape& tape) const override {
    const SequentialTape& tp = static_cast<const SequentialTape&>(tape);
    return TensorView(const_cast<float*>(tp.logits), {tp.B, num_outputs_});
  }

  void BackwardPart(Tape& tape, std::span<const float> output_grad,
                    const BackwardOptions& bopts) override {
    SequentialTape& tp = static_cast<SequentialTape&>(tape);
    CHECK(tp.train) << "Backward() needs a Forward() with opts.train";
    const int64_t B = tp.B;
    const size_t begin = static_cast<size_t>(part_.begin), end = static_cast<size_t>(part_.end);
    const float* dout = nullptr;
    if (has_loss()) {
      float* dlogits = tp.arena.AllocZeroed({B, num_outputs_}).data();
      SoftmaxCrossEntropyBackward(dlogits, tp.probs, tp.targets, bopts.dloss, B, num_outputs_);
      TraceOp("logits.grad", dlogits, B, num_outputs_);
      dout = dlogits;
    } else {
      CHECK_EQ(static_cast<int64_t>(output_grad.size()),
               B * NumElements(layers_[end - 1].out_shape))
          << "output gradient of layer " << end - 1;
      dout = output_grad.data();
    }
    // A convolution whose bias gradient a fused max pool's backward has added (none: end).
    size_t conv_bias_done = end;
    for (size_t ii = end; ii-- > begin;) {
      Layer& L = layers_[ii];
      const LayerSpec& l = L.spec;
      const SequentialTape::LayerActs& la = tp.layer[ii - begin];
      const int64_t in_n = B * NumElements(L.in_shape);
      const float* in = tp.acts[ii - begin];
      const bool need_dinp = ii > 0;  // no gradient for the data
      // flatten, and dropout without a mask: dout passes through.
      if (l.kind == "flatten" || (l.kind == "dropout" && !la.mask)) continue;
      if (l.kind == "linear" && ii >= 2 && FuseRelu(ii, ii - 1)) {
        // The ReLU before this layer (whose output is `in`) is folded into the input gradient's
        // GEMM, which writes the ReLU's input gradient whole: no zeroed buffer, no second pass.
        float* dinp = tp.arena.Alloc({in_n}).data();
        LinearReluBackward(dinp, params_[L.weight].grad.data(), BiasGrad(L), dout, in,
                           params_[L.weight].value.data(), B, L.in_shape[0], l.out);
        dout = dinp;
        --ii;  // the ReLU is done
        continue;
      }
      if (l.kind == "maxpool2d" && ii >= 2 && FuseRelu(ii, ii - 1)) {
        // The ReLU before this max pool (whose output is `in`) is folded into the pool's
        // backward, which writes the ReLU's input gradient whole, plane by plane. When that
        // gradient is a convolution's output gradient (in this part), the pool's backward also
        // adds the convolution's bias gradient from each plane it writes, and the convolution's
        // backward skips it. The ReLU's mask is read from the pool's output (the ReLU's output
        // at each argmax), a quarter of `in` for 2x2 windows.
        float* dinp = tp.arena.Alloc({in_n}).data();
        float* conv_dbias = nullptr;
        if (InPart(static_cast<int64_t>(ii) - 2) && layers_[ii - 2].spec.kind == "conv2d") {
          conv_dbias = BiasGrad(layers_[ii - 2]);
          conv_bias_done = ii - 2;
        }
        MaxPool2dReluBackward(dinp, conv_dbias, dout, la.argmax, tp.acts[ii - begin + 1], B,
                              L.in_shape[0], L.in_shape[1], L.in_shape[2], L.out_shape[1],
                              L.out_shape[2]);
        dout = dinp;
        --ii;  // the ReLU is done
        continue;
      }
      // A linear layer's or convolution's backward writes its input gradient whole (0 + chain,
      // the bits it would add into a zeroed buffer), so only the other layers' is zeroed.
      const bool writes_dinp = l.kind == "linear" || l.kind == "conv2d";
      float* dinp = !need_dinp    ? nullptr
                    : writes_dinp ? tp.arena.Alloc({in_n}).data()
                                  : tp.arena.AllocZeroed({in_n}).data();
      if (l.kind == "linear") {
        if (dinp != nullptr) {
          LinearBackwardOverwrite(dinp, params_[L.weight].grad.data(), BiasGrad(L), dout, in,
                                  params_[L.weight].value.data(), B, L.in_shape[0], l.out);
        } else {
          LinearBackward(nullptr, params_[L.weight].grad.data(), BiasGrad(L), dout, in,
                         params_[L.weight].value.data(), B, L.in_shape[0], l.out);
        }
      } else if (l.kind == "conv2d") {
        float* dbias = ii == conv_bias_done ? nullptr : BiasGrad(L);
        if (dinp != nullptr) {
          Conv2dBackwardOverwrite(dinp, params_[L.weight].grad.data(), dbias, dout, in,
                                  params_[L.weight].value.data(), B, L.in_shape[0], L.in_shape[1],
                                  L.in_shape[2], l.out, l.kernel, l.kernel, l.stride, l.pad);
        } else {
          Conv2dBackward(nullptr, params_[L.weight].grad.data(), dbias, dout, in,
                         params_[L.weight].value.data(), B, L.in_shape[0], L.in_shape[1],
                         L.in_shape[2], l.out, l.kernel, l.kernel, l.stride, l.pad);
        }
      } else if (!need_dinp) {
        // Elementwise / pooling layers first in the stack have nothing to accumulate.
      } else if (l.kind == "maxpool2d") {
        MaxPool2dBackward(dinp, dout, la.argmax, B, L.out_shape[0], L.out_shape[1], L.out_shape[2]);
      } else if (l.kind == "relu") {
        ReluBackward(dinp, dout, in, in_n);
      } else if (l.kind == "gelu") {
        GeluBackward(dinp, dout, in, in_n);
      } else if (l.kind == "dropout") {
        DropoutBackward(dinp, dout, la.mask, in_n);
      } else if (l.kind == "layernorm") {
        const int64_t C = L.in_shape.back();
        LayerNormBackward(dinp, params_[L.weight].grad.data(), params_[L.weight + 1].grad.data(),
                          dout, in, params_[L.weight].value.data(), la.mean, la.rstd, in_n / C, C);
      }
      if (l.kind == "layernorm" && !need_dinp) {
        // Parameter gradients still needed when layernorm is the first layer.
        const int64_t C = L.in_shape.back();
        float* scratch = tp.arena.AllocZeroed({in_n}).data();
        LayerNormBackward(scratch, params_[L.weight].grad.data(), params_[L.weight + 1].grad.data(),
                          dout, in, params_[L.weight].value.data(), la.mean, la.rstd, in_n / C, C);
      }
      if (trace_ && dinp) TraceOp("layers." + std::to_string(ii) + ".in.grad", dinp, B, in_n / B);
      dout = dinp;
    }
    tp.input_grad = begin > 0 ? dout : nullptr;
    TraceParamGrads();
  }

 private:
  struct Layer {
    LayerSpec spec;
    Shape in_shape, out_shape;
    int weight = -1;  // index into params_ (bias, if any, is weight + 1); -1: none or not kept
    int64_t num_params = 0;    // weights and biases
    int64_t weight_elems = 0;  // the weight alone (LargestKey)
    int64_t macs = 0;          // multiply-adds per sample of the forward pass
  };

  bool InPart(int64_t layer) const { return layer >= part_.begin && layer < part_.end; }

  // Whether layer `layer` and the ReLU `relu` next to it run as one fused kernel: both in this
  // part, and no op trace (it records each layer's output and input gradient on its own). The
  // pairs: a linear layer with the ReLU after it (forward) or before it (backward), a convolution
  // with the ReLU after it (forward), a max pool with the ReLU before it (backward). The fused
  // kernels give the same bits as the two ops.
  bool FuseRelu(size_t layer, size_t relu) const {
    const std::string& kind = layers_[layer].spec.kind;
    return trace_ == nullptr && InPart(static_cast<int64_t>(layer)) &&
           InPart(static_cast<int64_t>(relu)) &&
           (kind == "linear" || kind == "conv2d" || kind == "maxpool2d") &&
           layers_[relu].spec.kind == "relu";
  }

  int AddLinearLike(const std::string& prefix, Shape wshape, const LayerSpec& l, int64_t fan_in,
                    int64_t fan_out, bool keep) {
    int idx = keep ? static_cast<int>(params_.size()) : -1;
    const int64_t out = wshape[0];
    AddParam(prefix + "weight", std::move(wshape), keep) = {
        l.init, static_cast<double>(fan_in), static_cast<double>(fan_out), l.init_std};
    if (l.bias) AddParam(prefix + "bias", {out}, keep).kind = "zeros";
    return idx;
  }
  const float* Bias(const Layer& L) const {
    return L.spec.bias ? params_[L.weight + 1].value.data() : nullptr;
  }
  float* BiasGrad(Layer& L) { return L.spec.bias ? params_[L.weight + 1].grad.data() : nullptr; }

  std::vector<Layer> layers_;
  int64_t num_outputs_ = 0;
};

// ---------------------------------------------------------------------------------------------
// GPT-2 style decoder (llm.c's train_gpt2.c structure; weights tied between wte and the LM head).

class GptTape final : public Tape {
 public:
  struct Acts {
    const float* residual = nullptr;
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *preatt, *att, *attproj, *residual2, *ln2,
        *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
  };
  bool train = false;
  int64_t B = 0, T = 0;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int32_t* pos = nullptr;
  float* encoded = nullptr;
  std::vector<Acts> acts;  // acts[l - begin]
  const float* last_residual = nullptr;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;
  float *logits = nullptr, *probs = nullptr;
  const float* input_grad = nullptr;
};

class GptModel final : public Model {
 public:
  GptModel(ModelSpec spec, ModelPart part) : Model(std::move(spec), part) {}

  Status Build() {
    const GptSpec& g = spec_.gpt;
    if (g.vocab_size < 2) {
      return InvalidArgument("model.vocab_size must be >= 2 (or come from the data), got " +
                             std::to_string(g.vocab_size));
    }
    const int64_t C = g.n_embd, V = g.vocab_size, L = g.n_layer;
    const double proj_std = 0.02 / std::sqrt(2.0 * L);
    bool keep = has_input();
    auto normal = [&](const std::string& name, Shape s, double std) {
      AddParam(name, std::move(s), keep) = {"normal", 0, 0, std};
    };
    auto fixed = [&](const std::string& name, Shape s, const char* kind) {
      AddParam(name, std::move(s), keep).kind = kind;
    };
    normal("transformer.wte.weight", {V, C}, 0.02);
    normal("transformer.wpe.weight", {g.block_size, C}, 0.02);
    block_base_ = static_cast<int>(params_.size());
    for (int64_t l = 0; l < L; ++l) {
      keep = l >= part_.begin && l < part_.end;
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
    keep = has_loss();
    fixed("transformer.ln_f.weight", {C}, "ones");
    fixed("transformer.ln_f.bias", {C}, "zeros");
    if (has_loss() && !has_input()) tied_shape_ = {V, C};
    return Status::Ok();
  }

  int64_t NumOutputs() const override { return spec_.gpt.vocab_size; }

  // Per token and layer (llm.c's activation list): ~16 C plus the attention rows (2 NH T); then
  // the embeddings (2 C: with the first block) and ln_f, the logits and probabilities (2 C + 2 V:
  // with the last). Doubled for the backward pass's buffers.
  std::vector<LayerCost> Costs(int64_t T) const override {
    const GptSpec& g = spec_.gpt;
    T = SeqLenOrBlockSize(spec_, T);
    const double t = static_cast<double>(T);
    const uint64_t ut = static_cast<uint64_t>(T), C = static_cast<uint64_t>(g.n_embd),
                   V = static_cast<uint64_t>(g.vocab_size);
    std::vector<LayerCost> out;
    for (int64_t l = 0; l < g.n_layer; ++l) {
      LayerCost c;
      c.name = "transformer.h." + std::to_string(l);
      const uint64_t block = 12 * C * C + 13 * C;
      c.parameters = static_cast<int64_t>(block);
      c.flops = 6 * block * ut + 12 * ut * ut * C;
      c.activation_floats = 2.0 * (16.0 * g.n_embd + 2.0 * g.n_head * t) * t;
      if (l == 0) {  // wte and wpe; the FLOPs of wpe (6 x its weights, as every weight counts)
        const uint64_t emb = (V + static_cast<uint64_t>(g.block_size)) * C;
        c.name += " + embeddings";
        c.parameters += static_cast<int64_t>(emb);
        c.flops += 6 * static_cast<uint64_t>(g.block_size) * C * ut;
        c.activation_floats += 2.0 * (2.0 * g.n_embd) * t;
      }
      if (l + 1 == g.n_layer) {  // ln_f and the head's product with the tied wte
        c.name += " + ln_f + head";
        c.parameters += static_cast<int64_t>(2 * C);
        c.flops += 6 * (V * C + 2 * C) * ut;
        c.activation_floats += 2.0 * (2.0 * g.n_embd + 2.0 * g.vocab_size) * t;
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  std::string LargestKey() const override {
    const GptSpec& g = spec_.gpt;
    const double blocks = 12.0 * g.n_embd * g.n_embd * g.n_layer;
    const double embeddings = static_cast<double>(g.vocab_size + g.block_size) * g.n_embd;
    return blocks >= embeddings ? "model.n_layer = " + std::to_string(g.n_layer) +
                                      " x model.n_embd = " + std::to_string(g.n_embd)
                                : "model.vocab_size = " + std::to_string(g.vocab_size) +
                                      " x model.n_embd = " + std::to_string(g.n_embd);
  }

  std::unique_ptr<Tape> MakeTape() const override { return std::make_unique<GptTape>(); }

  // Parameter accessors: layer l, slot k (0..11 in the order of Build()).
  float* P(int64_t l, int k) { return params_[Slot(l, k)].value.data(); }
  float* G(int64_t l, int k) { return params_[Slot(l, k)].grad.data(); }
  // The tied embedding the head reads: wte, or a part's copy of it.
  const float* Wte() const { return has_input() ? params_[0].value.data() : tied_weight_.data(); }

  float ForwardPart(Tape& tape, const Batch& batch, std::span<const float> input,
                    const ForwardOptions& opts) override {
    GptTape& tp = static_cast<GptTape&>(tape);
    const GptSpec& g = spec_.gpt;
    const int64_t B = batch.size, T = batch.seq_len, C = g.n_embd, V = g.vocab_size, NH = g.n_head;
    CHECK(T >= 1 && T <= g.block_size) << "T=" << T;
    const int64_t N = B * T;
    tp.arena.Reset();
    tp.train = opts.train;
    tp.B = B;
    tp.T = T;
    tp.input_grad = nullptr;
    const float* residual = nullptr;
    if (has_input()) {
      CHECK_EQ(static_cast<int64_t>(batch.tokens.size()), B * T);
      tp.tokens = batch.tokens.data();
      tp.pos = tp.arena.AllocInt32(N);
      for (int64_t i = 0; i < N; ++i) tp.pos[i] = static_cast<int32_t>(i % T);
      float* tok = tp.arena.Alloc({N, C}).data();
      float* pos = tp.arena.Alloc({N, C}).data();
      tp.encoded = tp.arena.Alloc({N, C}).data();
      EmbeddingForward(tok, tp.tokens, params_[0].value.data(), N, C);
      EmbeddingForward(pos, tp.pos, params_[1].value.data(), N, C);
      ResidualForward(tp.encoded, tok, pos, N * C);
      TraceOp("encoded", tp.encoded, N, C);
      residual = tp.encoded;
    } else {
      CHECK_EQ(static_cast<int64_t>(input.size()), N * C)
          << "input activations of block " << part_.begin;
      residual = input.data();
    }
    if (has_loss()) {
      CHECK_EQ(static_cast<int64_t>(batch.targets.size()), B * T);
      tp.targets = batch.targets.data();
    }
    auto alloc = [&](int64_t n) { return tp.arena.Alloc({n}).data(); };
    tp.acts.assign(static_cast<size_t>(part_.end - part_.begin), {});
    for (int64_t l = part_.begin; l < part_.end; ++l) {
      GptTape::Acts& a = tp.acts[static_cast<size_t>(l - part_.begin)];
      a.residual = residual;
      a.ln1 = alloc(N * C);
      a.ln1_mean = alloc(N);
      a.ln1_rstd = alloc(N);
      a.qkv = alloc(N * 3 * C);
      a.atty = alloc(N * C);
      a.preatt = alloc(B * NH * T * T);
      a.att = alloc(B * NH * T * T);
      a.attproj = alloc(N * C);
      a.residual2 = alloc(N * C);
      a.ln2 = alloc(N * C);
      a.ln2_mean = alloc(N);
      a.ln2_rstd = alloc(N);
      a.fch = alloc(N * 4 * C);
      a.fch_gelu = alloc(N * 4 * C);
      a.fcproj = alloc(N * C);
      a.residual3 = alloc(N * C);
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
    tp.last_residual = residual;
    if (!has_loss()) return 0.0f;
    tp.lnf = alloc(N * C);
    tp.lnf_mean = alloc(N);
    tp.lnf_rstd = alloc(N);
    const int lnf = static_cast<int>(params_.size()) - 2;
    LayerNormForward(tp.lnf, tp.lnf_mean, tp.lnf_rstd, residual, params_[lnf].value.data(),
                     params_[lnf + 1].value.data(), N, C);
    tp.logits = alloc(N * V);
    LinearForward(tp.logits, tp.lnf, Wte(), nullptr, N, C, V);
    tp.probs = alloc(N * V);
    float* losses = alloc(N);
    float loss = SoftmaxCrossEntropyForward(tp.probs, losses, tp.logits, tp.targets, N, V);
    TraceOp("ln_f", tp.lnf, N, C);
    TraceOp("logits", tp.logits, N, V);
    TraceOp("loss", losses, N, 1);
    return loss;
  }

  std::span<const float> PartOutput(const Tape& tape) const override {
    const GptTape& tp = static_cast<const GptTape&>(tape);
    return {tp.last_residual, static_cast<size_t>(tp.B * tp.T * spec_.gpt.n_embd)};
  }

  std::span<const float> PartInputGrad(const Tape& tape) const override {
    const GptTape& tp = static_cast<const GptTape&>(tape);
    CHECK(tp.input_grad != nullptr) << "PartInputGrad: no BackwardPart of a part with an input";
    return {tp.input_grad, static_cast<size_t>(tp.B * tp.T * spec_.gpt.n_embd)};
  }

  int64_t PartInputSize(int64_t B, int64_t T) const override { return B * T * spec_.gpt.n_embd; }

  TensorView TapeLogits(const Tape& tape) const override {
    const GptTape& tp = static_cast<const GptTape&>(tape);
    return TensorView(tp.logits, {tp.B * tp.T, spec_.gpt.vocab_size});
  }

  void BackwardPart(Tape& tape, std::span<const float> output_grad,
                    const BackwardOptions& bopts) override {
    GptTape& tp = static_cast<GptTape&>(tape);
    CHECK(tp.train) << "Backward() needs a Forward() with opts.train";
    const GptSpec& g = spec_.gpt;
    const int64_t B = tp.B, T = tp.T, C = g.n_embd, V = g.vocab_size, NH = g.n_head;
    const int64_t N = B * T;
    auto alloc = [&](int64_t n) { return tp.arena.Alloc({n}).data(); };
    auto zeroed_alloc = [&](int64_t n) { return tp.arena.AllocZeroed({n}).data(); };
    const float* dresidual = nullptr;
    if (has_loss()) {
      const int lnf = static_cast<int>(params_.size()) - 2;
      float* head_grad = bopts.tied_head_grad;
      if (head_grad == nullptr) {
        CHECK(has_input()) << "a GPT part without wte needs BackwardOptions::tied_head_grad";
        head_grad = params_[0].grad.data();
      }
      float* dlogits = zeroed_alloc(N * V);
      SoftmaxCrossEntropyBackward(dlogits, tp.probs, tp.targets, bopts.dloss, N, V);
      float* dlnf = alloc(N * C);  // written whole (0 + chain): no zeroing
      LinearBackwardOverwrite(dlnf, head_grad, nullptr, dlogits, tp.lnf, Wte(), N, C, V);
      float* dres = zeroed_alloc(N * C);
      LayerNormBackward(dres, params_[lnf].grad.data(), params_[lnf + 1].grad.data(), dlnf,
                        tp.last_residual, params_[lnf].value.data(), tp.lnf_mean, tp.lnf_rstd, N,
                        C);
      TraceOp("logits.grad", dlogits, N, V);
      TraceOp("ln_f.grad", dlnf, N, C);
      TraceOp("residual.grad", dres, N, C);
      dresidual = dres;
    } else {
      CHECK_EQ(static_cast<int64_t>(output_grad.size()), N * C)
          << "output gradient of block " << part_.end - 1;
      dresidual = output_grad.data();
    }
    // One set of per-layer gradient buffers serves every layer (each is zeroed when the layer
    // starts using it, as a fresh zeroed buffer was): only the residual gradient crosses layers,
    // and it alternates between two buffers. For code-gpt-10m at 8 x 256 tokens this keeps ~360
    // MB of the peak resident set that a copy per layer took.
    float* const buf_dresidual2 = alloc(N * C);
    float* const buf_dfch_gelu = alloc(N * 4 * C);
    float* const buf_dfch = alloc(N * 4 * C);
    float* const buf_dln2 = alloc(N * C);
    float* const buf_dres_in[2] = {alloc(N * C), alloc(N * C)};
    float* const buf_datty = alloc(N * C);
    float* const buf_dqkv = alloc(N * 3 * C);
    float* const buf_dpreatt = alloc(B * NH * T * T);
    float* const buf_datt = alloc(B * NH * T * T);
    float* const buf_dln1 = alloc(N * C);
    auto zeroed = [](float* p, int64_t n) {
      ZeroFloats(p, n);
      return p;
    };
    for (int64_t l = part_.end; l-- > part_.begin;) {
      GptTape::Acts& a = tp.acts[static_cast<size_t>(l - part_.begin)];
      // residual3 = residual2 + fcproj: both gradients are 0 + dresidual (ResidualBackward into
      // zeroed buffers, here written without zeroing), one buffer's bits until LayerNormBackward
      // adds into dresidual2 below, so the fc projection's backward reads dresidual2.
      float* dresidual2 = buf_dresidual2;
      ResidualBackwardOverwrite(dresidual2, nullptr, dresidual, N * C);
      // The linear layers' and the GELU's input gradients are written whole (0 + chain, the bits
      // adding it to a zeroed buffer gives): no zeroing, and no scratch for running partials.
      float* dfch_gelu = buf_dfch_gelu;
      LinearBackwardOverwrite(dfch_gelu, G(l, 10), G(l, 11), dresidual2, a.fch_gelu, P(l, 10), N,
                              4 * C, C);
      float* dfch = buf_dfch;
      GeluBackwardOverwrite(dfch, dfch_gelu, a.fch, N * 4 * C);
      float* dln2 = buf_dln2;
      LinearBackwardOverwrite(dln2, G(l, 8), G(l, 9), dfch, a.ln2, P(l, 8), N, C, 4 * C);
      LayerNormBackward(dresidual2, G(l, 6), G(l, 7), dln2, a.residual2, P(l, 6), a.ln2_mean,
                        a.ln2_rstd, N, C);
      // residual2 = residual + attproj: as above, dattproj has dres_in's bits until
      // LayerNormBackward adds into dres_in.
      float* dres_in = buf_dres_in[l % 2];
      ResidualBackwardOverwrite(dres_in, nullptr, dresidual2, N * C);
      float* datty = buf_datty;
      LinearBackwardOverwrite(datty, G(l, 4), G(l, 5), dres_in, a.atty, P(l, 4), N, C, C);
      float* dqkv = zeroed(buf_dqkv, N * 3 * C);
      // AttentionBackward overwrites its two (B, NH, T, T) scratch outputs: no zeroing.
      float* dpreatt = buf_dpreatt;
      float* datt = buf_datt;
      AttentionBackward(dqkv, dpreatt, datt, datty, a.qkv, a.att, B, T, C, NH);
      float* dln1 = buf_dln1;
      LinearBackwardOverwrite(dln1, G(l, 2), G(l, 3), dqkv, a.ln1, P(l, 2), N, C, 3 * C);
      LayerNormBackward(dres_in, G(l, 0), G(l, 1), dln1, a.residual, P(l, 0), a.ln1_mean,
                        a.ln1_rstd, N, C);
      dresidual = dres_in;
      if (trace_) {
        const std::string p = "h." + std::to_string(l) + ".";
        // Every input gradient the layer computes, in the order it does (dattproj is
        // residual3.grad's copy; the attention's scratch is not an output): each one a tile
        // footprint reads (tile_rule.h).
        TraceOp(p + "fch_gelu.grad", dfch_gelu, N, 4 * C);
        TraceOp(p + "fch.grad", dfch, N, 4 * C);
        TraceOp(p + "ln2.grad", dln2, N, C);
        TraceOp(p + "residual3.grad", dresidual2, N, C);
        TraceOp(p + "atty.grad", datty, N, C);
        TraceOp(p + "qkv.grad", dqkv, N, 3 * C);
        TraceOp(p + "ln1.grad", dln1, N, C);
        TraceOp(p + "residual.grad", dres_in, N, C);
      }
    }
    if (has_input()) {
      // encoded = wte[tokens] + wpe[pos]
      EmbeddingBackward(params_[0].grad.data(), dresidual, tp.tokens, N, C, V);
      EmbeddingBackward(params_[1].grad.data(), dresidual, tp.pos, N, C, g.block_size);
    } else {
      tp.input_grad = dresidual;
    }
    TraceParamGrads();
  }

 private:
  size_t Slot(int64_t l, int k) const {
    return static_cast<size_t>(block_base_ + (l - part_.begin) * 12 + k);
  }

  int block_base_ = 0;  // index in params_ of the part's first block's first parameter
};

// Builds the model's plan: names, shapes, layers; nothing allocated yet.
Result<std::unique_ptr<Model>> Plan(const ModelSpec& spec, ModelPart part) {
  const int64_t layers = CutLayerCount(spec);
  if (part.end < 0) part.end = layers;
  if (part.begin < 0 || part.begin >= part.end || part.end > layers) {
    return InvalidArgument("model part [" + std::to_string(part.begin) + ", " +
                           std::to_string(part.end) + ") is not a non-empty range of the " +
                           std::to_string(layers) + " cut layers of the model (" +
                           (spec.kind == "gpt" ? "blocks" : "layers") + ")");
  }
  if (spec.kind == "gpt") {
    auto m = std::make_unique<GptModel>(spec, part);
    ML_RETURN_IF_ERROR(m->Build());
    return std::unique_ptr<Model>(std::move(m));
  }
  auto m = std::make_unique<SequentialModel>(spec, part);
  ML_RETURN_IF_ERROR(m->Build());
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace

int64_t CutLayerCount(const ModelSpec& spec) {
  return spec.kind == "gpt" ? spec.gpt.n_layer : static_cast<int64_t>(spec.layers.size());
}

Model::InitRule& Model::AddParam(std::string name, Shape shape, bool keep) {
  const uint64_t index = planned_params_++;
  if (!keep) {
    scratch_rule_ = {};
    return scratch_rule_;
  }
  params_.push_back(Param{std::move(name), Tensor(), Tensor()});
  param_shapes_.push_back(std::move(shape));
  param_index_.push_back(index);
  init_.push_back({});
  return init_.back();
}

void Model::AllocateParams(bool gradients) {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].value = Tensor(param_shapes_[i]);
    if (gradients) params_[i].grad = Tensor(param_shapes_[i]);
  }
  if (!tied_shape_.empty()) tied_weight_ = Tensor(tied_shape_);
  tape_ = MakeTape();
}

std::unique_ptr<Tape> Model::NewTape() const { return MakeTape(); }

float Model::Forward(const Batch& batch, const ForwardOptions& opts) {
  CHECK(has_input() && has_loss()) << "Forward() runs a whole model; a part runs ForwardPart()";
  return ForwardPart(*tape_, batch, {}, opts);
}

void Model::Backward(const BackwardOptions& opts) { BackwardPart(*tape_, {}, opts); }

double Model::ActivationFloats(int64_t B, int64_t T) const {
  double per_sample = 0;
  for (const LayerCost& c : Costs(T)) per_sample += c.activation_floats;
  return per_sample * static_cast<double>(B);
}

MemoryEstimate Model::PlannedMemory(int64_t B, int64_t T) const {
  MemoryEstimate e;
  e.num_parameters = PlannedParameters();
  e.parameters = 4.0 * static_cast<double>(e.num_parameters);
  e.gradients = e.parameters;
  e.activations = 4.0 * ActivationFloats(B, T);
  e.largest = LargestKey();
  return e;
}

Result<std::vector<LayerCost>> LayerCosts(const ModelSpec& spec, int64_t seq_len) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  return m->Costs(seq_len);
}

Result<uint64_t> TrainingFlopsPerSample(const ModelSpec& spec, int64_t seq_len) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  uint64_t flops = 0;
  for (const LayerCost& c : m->Costs(seq_len)) flops += c.flops;
  if (spec.kind == "gpt") return flops;
  return std::max<uint64_t>(flops, 6 * static_cast<uint64_t>(m->PlannedParameters()));
}

Result<MemoryEstimate> EstimateMemory(const ModelSpec& spec, int64_t batch, int64_t seq_len,
                                      const std::string& optimizer_kind, bool sgd_momentum) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  MemoryEstimate e = m->PlannedMemory(std::max<int64_t>(1, batch), seq_len);
  const double moments = optimizer_kind == "adamw"                 ? 2.0
                         : optimizer_kind == "sgd" && sgd_momentum ? 1.0
                                                                   : 0.0;
  e.optimizer = moments * e.parameters;
  return e;
}

Result<int64_t> ModelOutputs(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  return m->NumOutputs();
}

Result<std::vector<PlannedParam>> PlanParams(const ModelSpec& spec, ModelPart part) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, part));
  std::vector<PlannedParam> out;
  out.reserve(m->params().size());
  int64_t offset = 0;
  for (size_t i = 0; i < m->params().size(); ++i) {
    out.push_back({m->params()[i].name, m->param_shapes_[i], offset});
    offset += NumElements(m->param_shapes_[i]);
  }
  return out;
}

Result<int64_t> CountParameters(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  return m->PlannedParameters();
}

Result<int64_t> PartInputFloats(const ModelSpec& spec, ModelPart part, int64_t samples,
                                int64_t seq_len) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, part));
  return m->PartInputSize(samples, SeqLenOrBlockSize(spec, seq_len));
}

int64_t SeqLenOrBlockSize(const ModelSpec& spec, int64_t seq_len) {
  return spec.kind == "gpt" && seq_len <= 0 ? spec.gpt.block_size : seq_len;
}

Result<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  MemoryEstimate e = m->PlannedMemory(1, 1);
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  if (e.parameters + e.gradients > static_cast<double>(available)) {
    return ResourceExhausted(e.largest + ": the model has " + std::to_string(e.num_parameters) +
                             " parameters; its weights and gradients need " +
                             FormatBytes(e.parameters + e.gradients) + " but this machine has " +
                             FormatBytes(static_cast<double>(available)) + " available (" + source +
                             "); make the model smaller");
  }
  m->AllocateParams();
  return m;
}

Result<std::unique_ptr<Model>> Model::CreateForEvaluation(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  MemoryEstimate e = m->PlannedMemory(1, 1);
  std::string source;
  const uint64_t available = AvailableMemoryBytes(&source);
  if (e.parameters > static_cast<double>(available)) {
    return ResourceExhausted(e.largest + ": the model has " + std::to_string(e.num_parameters) +
                             " parameters; its weights need " + FormatBytes(e.parameters) +
                             " but this machine has " +
                             FormatBytes(static_cast<double>(available)) + " available (" + source +
                             "); make the model smaller");
  }
  m->AllocateParams(/*gradients=*/false);
  return m;
}

Result<std::unique_ptr<Model>> Model::CreateUnchecked(const ModelSpec& spec) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, {}));
  m->AllocateParams();
  return m;
}

Result<std::unique_ptr<Model>> Model::CreatePart(const ModelSpec& spec, ModelPart part) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Plan(spec, part));
  m->AllocateParams();
  return m;
}

}  // namespace meshlearn::engine
