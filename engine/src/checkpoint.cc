#include "meshlearn/engine/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>

#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/safetensors.h"
#include "meshlearn/engine/tile.h"

namespace meshlearn::engine {
namespace {

void HashTensor(Hasher& h, const std::string& name, const Tensor& t) {
  h.UpdateU64(name.size());
  h.Update(name);
  h.UpdateU64(t.shape().size());
  for (int64_t d : t.shape()) h.UpdateU64(static_cast<uint64_t>(d));
  h.UpdateU64(static_cast<uint64_t>(t.size()) * 4);
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4));
}

Hash256 HashState(TrainState& st, bool with_optimizer);

void AddCommon(SafetensorsWriter& w, TrainState& st, bool with_optimizer) {
  w.SetMetadata("step", std::to_string(st.step));
  w.SetMetadata("seed", std::to_string(st.seed));
  w.SetMetadata("stream", std::to_string(st.stream));
  w.SetMetadata("model", st.model->spec().ToJson());
  if (!st.model->has_input() || !st.model->has_loss()) {  // a pipeline stage's part
    w.SetMetadata("part_begin", std::to_string(st.model->part().begin));
    w.SetMetadata("part_end", std::to_string(st.model->part().end));
  }
  w.SetMetadata("state_hash", HashState(st, with_optimizer).ToHex());
  for (const Param& p : st.model->params()) w.AddF32(p.name, p.value);
}

Result<uint64_t> ParseU64(const SafetensorsFile& f, const std::string& key) {
  ML_ASSIGN_OR_RETURN(std::string v, f.Metadata(key));
  if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos) {
    return DataLoss(f.name() + ": __metadata__." + key + " must be a decimal integer, got '" + v +
                    "'");
  }
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size()) {
    return DataLoss(f.name() + ": __metadata__." + key + " is out of range: '" + v + "'");
  }
  return out;
}

Hash256 HashState(TrainState& st, bool with_optimizer) {
  Hasher h("meshlearn.train_state.v1");
  h.UpdateU64(static_cast<uint64_t>(st.step));
  h.UpdateU64(st.seed);
  h.UpdateU64(st.stream);
  for (const Param& p : st.model->params()) HashTensor(h, p.name, p.value);
  if (st.optimizer && with_optimizer) {
    for (const Optimizer::NamedState& s : st.optimizer->State()) HashTensor(h, s.name, *s.tensor);
  }
  return h.Finish();
}

}  // namespace

std::vector<Hash256> StateTensorRoots(TrainState& st) {
  std::vector<Hash256> roots;
  auto add = [&](const Tensor& t) {
    roots.push_back(
        TensorRoot({t.data(), static_cast<size_t>(t.size())}, TileGrid::ForShape(t.shape())));
  };
  for (const Param& p : st.model->params()) add(p.value);
  if (st.optimizer) {
    for (const Optimizer::NamedState& s : st.optimizer->State()) add(*s.tensor);
  }
  return roots;
}

Hash256 StateHashOfRoots(int64_t step, uint64_t seed, uint64_t stream,
                         std::span<const Hash256> tensor_roots) {
  Hasher h("meshlearn.train_state.v2");
  h.UpdateU64(static_cast<uint64_t>(step));
  h.UpdateU64(seed);
  h.UpdateU64(stream);
  h.UpdateU64(tensor_roots.size());
  const Hash256 root = MerkleRoot(std::vector<Hash256>(tensor_roots.begin(), tensor_roots.end()));
  h.Update(ByteSpan(root.bytes.data(), root.bytes.size()));
  return h.Finish();
}

Hash256 StateHash(TrainState& st) {
  // A bare model keeps the flat form (model files, ModelStateHash); a training state is
  // committed by its tensors' tiled roots (the top of checkpoint.h).
  if (!st.optimizer) return HashState(st, /*with_optimizer=*/false);
  return StateHashOfRoots(st.step, st.seed, st.stream, StateTensorRoots(st));
}

Hash256 FlatStateHash(TrainState& st) { return HashState(st, /*with_optimizer=*/true); }

bool StateHashMatches(TrainState& st, const std::string& stored_hex) {
  return stored_hex == StateHash(st).ToHex() || stored_hex == FlatStateHash(st).ToHex();
}
Hash256 ModelStateHash(TrainState& st) { return HashState(st, /*with_optimizer=*/false); }

Status SaveCheckpoint(Env* env, const std::string& path, TrainState& st,
                      const std::map<std::string, std::string>& extra) {
  return env->WriteFileAtomic(path, CheckpointBytes(st, extra));
}

namespace {

// A checkpoint's file: the tensors viewed where the state holds them (not copied).
SafetensorsWriter CheckpointWriter(TrainState& st,
                                   const std::map<std::string, std::string>& extra) {
  CHECK(st.optimizer) << "SaveCheckpoint needs an optimizer";
  SafetensorsWriter w(SafetensorsWriter::Mode::kView);
  for (const auto& [k, v] : extra) w.SetMetadata(k, v);
  w.SetMetadata("format", kCheckpointFormat);
  w.SetMetadata("optimizer", st.optimizer->spec().ToJson());
  AddCommon(w, st, /*with_optimizer=*/true);
  for (const Optimizer::NamedState& s : st.optimizer->State()) w.AddF32(s.name, *s.tensor);
  return w;
}

}  // namespace

std::string CheckpointBytes(TrainState& st, const std::map<std::string, std::string>& extra) {
  return CheckpointWriter(st, extra).Serialize();
}

Status WriteCheckpoint(TrainState& st, const std::function<Status(std::string_view)>& sink,
                       const std::map<std::string, std::string>& extra) {
  return CheckpointWriter(st, extra).WriteTo(sink);
}

Status SaveModel(Env* env, const std::string& path, TrainState& st,
                 const std::map<std::string, std::string>& extra) {
  SafetensorsWriter w;
  w.SetMetadata("format", kModelFormat);
  for (const auto& [k, v] : extra) w.SetMetadata(k, v);
  // The stored hash covers what the file holds: parameters, step and counters, no optimizer.
  AddCommon(w, st, /*with_optimizer=*/false);
  return w.Write(env, path);
}

Result<TrainState> LoadCheckpoint(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return ReadCheckpoint(bytes, path);
}

Result<TrainState> ReadCheckpoint(std::string_view bytes, const std::string& name) {
  return ReadCheckpoint(
      bytes.size(),
      [bytes](uint64_t offset, std::span<char> out) -> Status {
        // ReadCheckpoint reads only within the size it was given.
        CHECK_LE(offset + out.size(), bytes.size());
        if (!out.empty()) std::memcpy(out.data(), bytes.data() + offset, out.size());
        return Status::Ok();
      },
      name);
}

Result<TrainState> ReadCheckpoint(uint64_t size, const ReadAtFn& read, const std::string& path) {
  // The header first (its length from the first 8 bytes), parsed with every check; then the
  // state it names is built and each tensor read into place.
  std::string first8(static_cast<size_t>(std::min<uint64_t>(8, size)), '\0');
  ML_RETURN_IF_ERROR(read(0, first8));
  ML_ASSIGN_OR_RETURN(uint64_t header_size, SafetensorsFile::HeaderSize(first8, size, path));
  std::string head(static_cast<size_t>(header_size), '\0');
  ML_RETURN_IF_ERROR(read(0, head));
  ML_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::ParseHeader(head, size, path));
  head = std::string();
  ML_ASSIGN_OR_RETURN(std::string format, f.Metadata("format"));
  if (format != kCheckpointFormat && format != kModelFormat) {
    return DataLoss(path + ": __metadata__.format is '" + format + "', expected '" +
                    kCheckpointFormat + "' or '" + kModelFormat + "'");
  }
  TrainState st;
  ML_ASSIGN_OR_RETURN(uint64_t step, ParseU64(f, "step"));
  st.step = static_cast<int64_t>(step);
  ML_ASSIGN_OR_RETURN(st.seed, ParseU64(f, "seed"));
  ML_ASSIGN_OR_RETURN(st.stream, ParseU64(f, "stream"));
  ML_ASSIGN_OR_RETURN(std::string model_json, f.Metadata("model"));
  Result<ModelSpec> spec = ModelSpec::FromJson(model_json, path);
  if (!spec.ok()) return DataLoss(spec.status().message());
  // A pipeline stage's checkpoint names its part of the model (part_begin, part_end).
  const bool part = f.Metadata("part_begin").ok() || f.Metadata("part_end").ok();
  int64_t begin = 0, end = -1;
  if (part) {
    ML_ASSIGN_OR_RETURN(uint64_t b, ParseU64(f, "part_begin"));
    ML_ASSIGN_OR_RETURN(uint64_t e, ParseU64(f, "part_end"));
    if (e > static_cast<uint64_t>(CutLayerCount(*spec))) {
      return DataLoss(path + ": __metadata__.part_end (" + std::to_string(e) +
                      ") is past the model's " + std::to_string(CutLayerCount(*spec)) +
                      " cut layers");
    }
    begin = static_cast<int64_t>(b);
    end = static_cast<int64_t>(e);
  }
  Result<std::unique_ptr<Model>> model =
      part ? Model::CreatePart(*spec, ModelPart{begin, end}) : Model::Create(*spec);
  if (!model.ok()) return DataLoss(path + ": " + model.status().message());
  st.model = std::move(*model);
  std::set<std::string> expected;
  // Each tensor of the state, of its shape, is read from the file into its own memory once every
  // one was found, in the file's order (a source read front to back: node/stage_evidence.h).
  std::vector<std::pair<const SafetensorsEntry*, Tensor*>> reads;
  auto find = [&](const std::string& tensor, Tensor& into) -> Status {
    ML_ASSIGN_OR_RETURN(const SafetensorsEntry* e, f.F32Entry(tensor, into.shape()));
    if (e->shape != into.shape()) {  // a scalar's empty `expect` checks no shape
      return DataLoss(path + ": tensor '" + tensor + "' has shape " + ShapeToString(e->shape) +
                      ", expected " + ShapeToString(into.shape()));
    }
    reads.emplace_back(e, &into);
    return Status::Ok();
  };
  for (Param& p : st.model->params()) {
    ML_RETURN_IF_ERROR(find(p.name, p.value));
    expected.insert(p.name);
  }
  if (format == kCheckpointFormat) {
    ML_ASSIGN_OR_RETURN(std::string opt_json, f.Metadata("optimizer"));
    Result<OptimizerSpec> ospec = OptimizerSpec::FromJson(opt_json, path);
    if (!ospec.ok()) return DataLoss(ospec.status().message());
    st.optimizer = std::make_unique<Optimizer>(*ospec, st.model->params());
    for (const Optimizer::NamedState& s : st.optimizer->State()) {
      ML_RETURN_IF_ERROR(find(s.name, *s.tensor));
      expected.insert(s.name);
    }
  }
  for (const auto& [name, e] : f.entries()) {
    if (!expected.count(name)) {
      return DataLoss(
          path + ": unexpected tensor '" + name + "' (not part of this model" +
          std::string(format == kModelFormat ? "; optimizer state in a model file?" : "") + ")");
    }
  }
  std::sort(reads.begin(), reads.end(),
            [](const auto& a, const auto& b) { return a.first->offset < b.first->offset; });
  for (const auto& [e, into] : reads) {
    ML_RETURN_IF_ERROR(read(e->offset, std::span<char>(reinterpret_cast<char*>(into->data()),
                                                       static_cast<size_t>(e->size()))));
  }
  // The stored hash must match what we loaded: catches edits that keep the file well-formed.
  Result<std::string> stored = f.Metadata("state_hash");
  if (stored.ok()) {
    std::string actual = StateHash(st).ToHex();
    if (!StateHashMatches(st, *stored)) {
      return DataLoss(path + ": state hash mismatch: metadata says " + *stored +
                      " but the tensors hash to " + actual + " (file modified or corrupt)");
    }
  }
  return st;
}

}  // namespace meshlearn::engine
