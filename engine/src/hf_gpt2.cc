#include "meshlearn/engine/hf_gpt2.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "meshlearn/engine/safetensors.h"

namespace meshlearn::engine {
namespace {

using nlohmann::json;

constexpr char kHfFormat[] = "meshlearn.hf_gpt2.v1";

// The matrices of GPT-2's Conv1D layers: stored [in, out] by Hugging Face, [out, in] here.
bool IsConv1DWeight(const std::string& name) {
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) return true;
  }
  return false;
}

// (rows, cols) row-major -> (cols, rows) row-major. A copy of every float: exact.
Tensor Transposed(const Tensor& t) {
  CHECK_EQ(t.shape().size(), 2u);
  const int64_t r = t.shape()[0], c = t.shape()[1];
  Tensor out({c, r});
  const float* src = t.data();
  float* dst = out.data();
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  }
  return out;
}

Shape TransposedShape(const Shape& s) { return {s[1], s[0]}; }

std::string Latin1ToUtf8(uint8_t b) {
  if (b < 0x80) return std::string(1, static_cast<char>(b));
  return {static_cast<char>(0xC0 | (b >> 6)), static_cast<char>(0x80 | (b & 0x3F))};
}

std::string U64(uint64_t v) { return std::to_string(v); }

Result<uint64_t> MetaU64(const SafetensorsFile& f, const std::string& key) {
  ML_ASSIGN_OR_RETURN(std::string v, f.Metadata(key));
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    return DataLoss(f.name() + ": __metadata__." + key + " must be a decimal integer, got '" + v +
                    "'");
  }
  return out;
}

// ---- config.json

Result<ModelSpec> ParseConfig(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(file + ": not a JSON object");
  auto field_error = [&](const std::string& field, const std::string& what) {
    return DataLoss(file + ": field '" + field + "': " + what);
  };
  auto get_int = [&](const std::string& field, int64_t lo, int64_t hi) -> Result<int64_t> {
    if (!j.contains(field)) return field_error(field, "missing (a GPT2Config needs it)");
    const json& v = j[field];
    if (!v.is_number_integer()) return field_error(field, "must be an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return field_error(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                    "], got " + std::to_string(x));
    }
    return x;
  };
  ModelSpec s;
  s.kind = "gpt";
  ML_ASSIGN_OR_RETURN(s.gpt.vocab_size, get_int("vocab_size", 2, 1 << 24));
  ML_ASSIGN_OR_RETURN(s.gpt.block_size, get_int("n_positions", 1, 65536));
  ML_ASSIGN_OR_RETURN(s.gpt.n_embd, get_int("n_embd", 1, 65536));
  ML_ASSIGN_OR_RETURN(s.gpt.n_layer, get_int("n_layer", 1, 256));
  ML_ASSIGN_OR_RETURN(s.gpt.n_head, get_int("n_head", 1, 256));
  if (s.gpt.n_embd % s.gpt.n_head != 0) {
    return field_error("n_head", "must divide n_embd (" + std::to_string(s.gpt.n_embd) + "), got " +
                                     std::to_string(s.gpt.n_head));
  }
  // What meshlearn's GPT is; a config asking for another architecture is refused, not ignored.
  if (j.contains("model_type") && j["model_type"] != "gpt2") {
    return field_error("model_type", "must be \"gpt2\", got " + j["model_type"].dump());
  }
  if (j.contains("activation_function") && j["activation_function"] != "gelu_new") {
    return field_error("activation_function",
                       "must be \"gelu_new\" (GELU, tanh form: what meshlearn's GPT computes), "
                       "got " +
                           j["activation_function"].dump());
  }
  if (j.contains("layer_norm_epsilon")) {
    const json& e = j["layer_norm_epsilon"];
    if (!e.is_number() || e.get<double>() != 1e-5) {
      return field_error("layer_norm_epsilon",
                         "must be 1e-05 (meshlearn's LayerNorm), got " + e.dump());
    }
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null() &&
      !(j["n_inner"].is_number_integer() && j["n_inner"].get<int64_t>() == 4 * s.gpt.n_embd)) {
    return field_error(
        "n_inner", "must be null or 4 * n_embd = " + std::to_string(4 * s.gpt.n_embd) + ", got " +
                       j["n_inner"].dump());
  }
  for (const char* flag : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    if (j.contains(flag) && j[flag] != false) {
      return field_error(flag, std::string("must be false, got ") + j[flag].dump());
    }
  }
  for (const char* flag : {"tie_word_embeddings", "scale_attn_weights"}) {
    if (j.contains(flag) && j[flag] != true) {
      return field_error(flag,
                         std::string("must be true (meshlearn's GPT), got ") + j[flag].dump());
    }
  }
  return s;
}

std::string ConfigJson(const GptSpec& g) {
  json j = {
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"vocab_size", g.vocab_size},
      {"n_positions", g.block_size},
      {"n_ctx", g.block_size},
      {"n_embd", g.n_embd},
      {"n_layer", g.n_layer},
      {"n_head", g.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      {"use_cache", true},
  };
  return j.dump(2) + "\n";
}

// ---- vocab.json

std::string VocabFileJson(const std::vector<uint8_t>& vocab) {
  json a = json::array();
  for (uint8_t b : vocab) a.push_back(Latin1ToUtf8(b));
  return a.dump() + "\n";
}

Result<std::vector<uint8_t>> ParseVocabFile(const std::string& text, const std::string& file,
                                            int64_t vocab_size) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return DataLoss(file + ": not a JSON array of characters (index = token id)");
  }
  if (static_cast<int64_t>(j.size()) > vocab_size) {
    return DataLoss(file + ": " + std::to_string(j.size()) +
                    " entries, more than config.json's vocab_size " + std::to_string(vocab_size));
  }
  std::vector<uint8_t> out;
  std::set<uint8_t> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    auto bad = [&](const std::string& what) {
      return DataLoss(file + ": entry " + std::to_string(i) + ": " + what);
    };
    if (!j[i].is_string()) return bad("must be a string, got " + j[i].dump());
    const std::string s = j[i].get<std::string>();
    int code = -1;
    if (s.size() == 1 && static_cast<unsigned char>(s[0]) < 0x80) {
      code = static_cast<unsigned char>(s[0]);
    } else if (s.size() == 2 && (static_cast<unsigned char>(s[0]) == 0xC2 ||
                                 static_cast<unsigned char>(s[0]) == 0xC3)) {
      code = (static_cast<unsigned char>(s[0]) & 0x1F) << 6 |
             (static_cast<unsigned char>(s[1]) & 0x3F);
    }
    if (code < 0) {
      return bad("must be one character U+0000..U+00FF (one byte), got " + j[i].dump());
    }
    if (!seen.insert(static_cast<uint8_t>(code)).second) {
      return bad(j[i].dump() + " appears twice");
    }
    out.push_back(static_cast<uint8_t>(code));
  }
  return out;
}

}  // namespace

std::string VocabToJson(const std::vector<uint8_t>& vocab) {
  json a = json::array();
  for (uint8_t b : vocab) a.push_back(static_cast<int>(b));
  return a.dump();
}

Result<std::vector<uint8_t>> VocabFromJson(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return DataLoss(what + ": vocab must be a JSON array of byte values");
  }
  std::vector<uint8_t> out;
  std::set<int> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() > 255 ||
        !seen.insert(j[i].get<int>()).second) {
      return DataLoss(what + ": vocab entry " + std::to_string(i) + " is " + j[i].dump() +
                      ", expected a distinct integer in [0, 255]");
    }
    out.push_back(static_cast<uint8_t>(j[i].get<int>()));
  }
  return out;
}

std::string HfGpt2Name(const std::string& name, bool* transposed) {
  *transposed = false;
  if (name.rfind("transformer.", 0) != 0) return "";
  *transposed = IsConv1DWeight(name);
  return name;  // nanoGPT's names are Hugging Face's; only the Conv1D layouts differ
}

Status SaveHfGpt2(Env* env, const std::string& dir, TrainState& st,
                  const std::vector<uint8_t>& vocab) {
  const ModelSpec& spec = st.model->spec();
  if (spec.kind != "gpt") {
    return InvalidArgument("the Hugging Face GPT-2 layout is for GPT models; this is a " +
                           spec.kind + " model");
  }
  std::vector<uint8_t> v = vocab;
  if (v.empty()) {
    if (spec.gpt.vocab_size > 256) {
      return InvalidArgument("the model has no stored vocabulary and vocab_size " +
                             std::to_string(spec.gpt.vocab_size) +
                             " > 256: vocab.json cannot name its tokens as bytes");
    }
    for (int64_t i = 0; i < spec.gpt.vocab_size; ++i) v.push_back(static_cast<uint8_t>(i));
  }
  if (static_cast<int64_t>(v.size()) > spec.gpt.vocab_size) {
    return InvalidArgument("the vocabulary has " + std::to_string(v.size()) +
                           " entries but the model's vocab_size is " +
                           std::to_string(spec.gpt.vocab_size));
  }
  ML_RETURN_IF_ERROR(env->CreateDirs(dir));
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.SetMetadata("meshlearn.format", kHfFormat);
  w.SetMetadata("meshlearn.step", U64(static_cast<uint64_t>(st.step)));
  w.SetMetadata("meshlearn.seed", U64(st.seed));
  w.SetMetadata("meshlearn.stream", U64(st.stream));
  w.SetMetadata("meshlearn.state_hash", ModelStateHash(st).ToHex());
  for (const Param& p : st.model->params()) {
    bool t = false;
    const std::string name = HfGpt2Name(p.name, &t);
    CHECK(!name.empty()) << p.name;
    if (t) {
      w.AddF32(name, Transposed(p.value));
    } else {
      w.AddF32(name, p.value);
    }
  }
  ML_RETURN_IF_ERROR(w.Write(env, JoinPath(dir, kHfModelFile)));
  if (st.optimizer) {
    SafetensorsWriter o;
    o.SetMetadata("format", "pt");
    o.SetMetadata("meshlearn.format", kHfFormat);
    o.SetMetadata("optimizer", st.optimizer->spec().ToJson());
    o.SetMetadata("step", U64(static_cast<uint64_t>(st.step)));
    o.SetMetadata("seed", U64(st.seed));
    o.SetMetadata("stream", U64(st.stream));
    o.SetMetadata("state_hash", StateHash(st).ToHex());
    for (const Optimizer::NamedState& s : st.optimizer->State()) {
      // "optim.m.transformer.h.0.attn.c_attn.weight": laid out like its parameter.
      if (s.tensor->shape().size() == 2 && IsConv1DWeight(s.name)) {
        o.AddF32(s.name, Transposed(*s.tensor));
      } else {
        o.AddF32(s.name, *s.tensor);
      }
    }
    ML_RETURN_IF_ERROR(o.Write(env, JoinPath(dir, kHfOptimizerFile)));
  } else if (env->FileExists(JoinPath(dir, kHfOptimizerFile))) {
    // A stale optimizer file beside new weights would resume from the wrong moments.
    ML_RETURN_IF_ERROR(env->DeleteFile(JoinPath(dir, kHfOptimizerFile)));
  }
  ML_RETURN_IF_ERROR(env->WriteFileAtomic(JoinPath(dir, kHfConfigFile), ConfigJson(spec.gpt)));
  return env->WriteFileAtomic(JoinPath(dir, kHfVocabFile), VocabFileJson(v));
}

Result<LoadedModel> LoadHfGpt2(Env* env, const std::string& dir) {
  const std::string config_path = JoinPath(dir, kHfConfigFile);
  const std::string vocab_path = JoinPath(dir, kHfVocabFile);
  const std::string model_path = JoinPath(dir, kHfModelFile);
  const std::string opt_path = JoinPath(dir, kHfOptimizerFile);
  ML_ASSIGN_OR_RETURN(std::string config_text, env->ReadFile(config_path));
  ML_ASSIGN_OR_RETURN(ModelSpec spec, ParseConfig(config_text, config_path));
  LoadedModel out;
  out.hf = true;
  if (env->FileExists(vocab_path)) {
    ML_ASSIGN_OR_RETURN(std::string vocab_text, env->ReadFile(vocab_path));
    ML_ASSIGN_OR_RETURN(out.vocab, ParseVocabFile(vocab_text, vocab_path, spec.gpt.vocab_size));
  }
  ML_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Read(env, model_path));
  Result<std::unique_ptr<Model>> model = Model::Create(spec);
  if (!model.ok()) return model.status().WithPrefix(config_path);
  TrainState& st = out.state;
  st.model = std::move(*model);
  std::set<std::string> expected;
  for (Param& p : st.model->params()) {
    bool t = false;
    const std::string name = HfGpt2Name(p.name, &t);
    if (t) {
      ML_ASSIGN_OR_RETURN(Tensor hf, f.GetF32(name, TransposedShape(p.value.shape())));
      p.value = Transposed(hf);
    } else {
      ML_ASSIGN_OR_RETURN(p.value, f.GetF32(name, p.value.shape()));
    }
    expected.insert(name);
  }
  for (const auto& [name, e] : f.entries()) {
    if (expected.count(name)) continue;
    const bool buffer = name.rfind("transformer.h.", 0) == 0 &&
                        (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
    if (buffer) continue;  // the causal mask buffers of older transformers versions
    if (name == "lm_head.weight") {
      ML_ASSIGN_OR_RETURN(Tensor lm, f.GetF32(name, st.model->params()[0].value.shape()));
      if (std::memcmp(lm.data(), st.model->params()[0].value.data(), 4 * lm.size()) != 0) {
        return DataLoss(model_path +
                        ": tensor 'lm_head.weight' differs from 'transformer.wte.weight'; "
                        "meshlearn's GPT ties them (tie_word_embeddings)");
      }
      continue;
    }
    return DataLoss(model_path + ": unexpected tensor '" + name + "' (not part of a GPT-2 of " +
                    config_path + "'s shape)");
  }
  // meshlearn's own counters and hash when it wrote the file; a file from elsewhere has none.
  if (f.metadata().count("meshlearn.step")) {
    ML_ASSIGN_OR_RETURN(uint64_t step, MetaU64(f, "meshlearn.step"));
    st.step = static_cast<int64_t>(step);
    ML_ASSIGN_OR_RETURN(st.seed, MetaU64(f, "meshlearn.seed"));
    ML_ASSIGN_OR_RETURN(st.stream, MetaU64(f, "meshlearn.stream"));
    if (Result<std::string> stored = f.Metadata("meshlearn.state_hash"); stored.ok()) {
      const std::string actual = ModelStateHash(st).ToHex();
      if (*stored != actual) {
        return DataLoss(model_path + ": __metadata__.meshlearn.state_hash is " + *stored +
                        " but the tensors hash to " + actual + " (file modified or corrupt)");
      }
    }
  }
  if (env->FileExists(opt_path)) {
    ML_ASSIGN_OR_RETURN(SafetensorsFile o, SafetensorsFile::Read(env, opt_path));
    ML_ASSIGN_OR_RETURN(std::string opt_json, o.Metadata("optimizer"));
    Result<OptimizerSpec> ospec = OptimizerSpec::FromJson(opt_json, opt_path);
    if (!ospec.ok()) return DataLoss(ospec.status().message());
    ML_ASSIGN_OR_RETURN(uint64_t step, MetaU64(o, "step"));
    ML_ASSIGN_OR_RETURN(uint64_t seed, MetaU64(o, "seed"));
    ML_ASSIGN_OR_RETURN(uint64_t stream, MetaU64(o, "stream"));
    if (static_cast<int64_t>(step) != st.step || seed != st.seed || stream != st.stream) {
      return DataLoss(opt_path + ": step/seed/stream " + std::to_string(step) + "/" +
                      std::to_string(seed) + "/" + std::to_string(stream) + " differ from " +
                      model_path + "'s " + std::to_string(st.step) + "/" + std::to_string(st.seed) +
                      "/" + std::to_string(st.stream) + " (files of two different states)");
    }
    st.optimizer = std::make_unique<Optimizer>(*ospec, st.model->params());
    std::set<std::string> names;
    for (const Optimizer::NamedState& s : st.optimizer->State()) {
      if (s.tensor->shape().size() == 2 && IsConv1DWeight(s.name)) {
        ML_ASSIGN_OR_RETURN(Tensor hf, o.GetF32(s.name, TransposedShape(s.tensor->shape())));
        *s.tensor = Transposed(hf);
      } else {
        ML_ASSIGN_OR_RETURN(*s.tensor, o.GetF32(s.name, s.tensor->shape()));
      }
      names.insert(s.name);
    }
    for (const auto& [name, e] : o.entries()) {
      if (!names.count(name)) {
        return DataLoss(opt_path + ": unexpected tensor '" + name + "' (not a moment of " +
                        model_path + "'s parameters under this optimizer)");
      }
    }
    ML_ASSIGN_OR_RETURN(std::string stored, o.Metadata("state_hash"));
    const std::string actual = StateHash(st).ToHex();
    if (!StateHashMatches(st, stored)) {
      return DataLoss(opt_path + ": __metadata__.state_hash is " + stored +
                      " but the weights and moments hash to " + actual +
                      " (file modified, or from another state)");
    }
  }
  return out;
}

Result<LoadedModel> LoadModel(Env* env, const std::string& path) {
  if (env->FileExists(JoinPath(path, kHfConfigFile))) return LoadHfGpt2(env, path);
  LoadedModel out;
  ML_ASSIGN_OR_RETURN(out.state, LoadCheckpoint(env, path));
  ML_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Read(env, path));
  if (f.metadata().count(kVocabMetadataKey)) {
    ML_ASSIGN_OR_RETURN(out.vocab, VocabFromJson(f.metadata().at(kVocabMetadataKey), path));
  }
  return out;
}

}  // namespace meshlearn::engine
