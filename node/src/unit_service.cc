#include "meshlearn/node/unit_service.h"

#include <algorithm>

#include "meshlearn/base/encoding.h"

namespace meshlearn::node {

namespace {

constexpr uint8_t kManifestVersion = 1;
constexpr uint32_t kMaxCheckpoints = 1u << 20;

Bytes EncodeUnitKey(const Hash256& task, uint32_t index) {
  Encoder e;
  e.PutHash(task).PutU32(index);
  return e.Take();
}

struct CheckpointRequest {
  Hash256 task;
  uint32_t index = 0;
  int64_t step = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

Bytes EncodeCheckpointRequest(const CheckpointRequest& r) {
  Encoder e;
  e.PutHash(r.task).PutU32(r.index).PutI64(r.step).PutU64(r.offset).PutU64(r.length);
  return e.Take();
}

Result<CheckpointRequest> DecodeCheckpointRequest(ByteSpan wire) {
  Decoder d(wire, "unit.checkpoint request");
  CheckpointRequest r;
  ML_RETURN_IF_ERROR(d.GetHash(&r.task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&r.index, "index"));
  ML_RETURN_IF_ERROR(d.GetI64(&r.step, "step"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.offset, "offset"));
  ML_RETURN_IF_ERROR(d.GetU64(&r.length, "length"));
  ML_RETURN_IF_ERROR(d.Finish());
  if (r.length == 0 || r.length > kMaxCheckpointSlice) {
    return InvalidArgument("unit.checkpoint request: length must be in [1, " +
                           std::to_string(kMaxCheckpointSlice) + "], got " +
                           std::to_string(r.length));
  }
  return r;
}

}  // namespace

Bytes EncodeUnitManifest(const UnitManifest& m) {
  Encoder e;
  e.PutU8(kManifestVersion).PutHash(m.task_id).PutU32(m.index);
  e.PutU32(static_cast<uint32_t>(m.leaves.size()));
  for (const Hash256& h : m.leaves) e.PutHash(h);
  e.PutU32(static_cast<uint32_t>(m.checkpoints.size()));
  for (const UnitCheckpointRef& c : m.checkpoints) e.PutI64(c.step).PutU64(c.size);
  return e.Take();
}

Result<UnitManifest> DecodeUnitManifest(ByteSpan wire) {
  Decoder d(wire, "unit manifest");
  UnitManifest m;
  uint8_t version = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "version"));
  if (version != kManifestVersion) {
    return InvalidArgument("unit manifest: unknown version " + std::to_string(version));
  }
  ML_RETURN_IF_ERROR(d.GetHash(&m.task_id, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&m.index, "index"));
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "leaves", kMaxManifestLeaves, 32));
  m.leaves.resize(n);
  for (Hash256& h : m.leaves) ML_RETURN_IF_ERROR(d.GetHash(&h, "leaf"));
  ML_RETURN_IF_ERROR(d.GetCount(&n, "checkpoints", kMaxCheckpoints, 16));
  m.checkpoints.resize(n);
  for (UnitCheckpointRef& c : m.checkpoints) {
    ML_RETURN_IF_ERROR(d.GetI64(&c.step, "step"));
    ML_RETURN_IF_ERROR(d.GetU64(&c.size, "size"));
  }
  ML_RETURN_IF_ERROR(d.Finish());
  return m;
}

void UnitService::Register(net::Router* router) {
  router->Register(
      kMethodUnitManifest, [this](const net::Request& r) { return HandleManifest(r); }, 64);
  router->Register(
      kMethodUnitCheckpoint, [this](const net::Request& r) { return HandleCheckpoint(r); }, 128);
}

void UnitService::Publish(UnitManifest manifest, std::vector<std::string> checkpoint_paths) {
  Entry e;
  for (size_t i = 0; i < manifest.checkpoints.size() && i < checkpoint_paths.size(); ++i) {
    e.files[manifest.checkpoints[i].step] = {checkpoint_paths[i], manifest.checkpoints[i].size};
  }
  e.manifest = EncodeUnitManifest(manifest);
  std::lock_guard<std::mutex> lock(mu_);
  units_[{manifest.task_id, manifest.index}] = std::move(e);
}

void UnitService::Withdraw(const Hash256& task, uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find({task, index});
  if (it == units_.end()) return;
  for (const auto& [step, file] : it->second.files) {
    if (file.first == cached_path_) {
      cached_path_.clear();
      cached_bytes_.clear();
    }
  }
  units_.erase(it);
}

bool UnitService::Serves(const Hash256& task, uint32_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return units_.count({task, index}) > 0;
}

Result<Bytes> UnitService::HandleManifest(const net::Request& r) const {
  Decoder d(r.body, "unit.manifest request");
  Hash256 task;
  uint32_t index = 0;
  ML_RETURN_IF_ERROR(d.GetHash(&task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&index, "index"));
  ML_RETURN_IF_ERROR(d.Finish());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find({task, index});
  if (it == units_.end()) {
    return NotFound("unit " + std::to_string(index) + " of task " + task.ShortHex() +
                    " is not served here (not committed by this node, or its round is final)");
  }
  return it->second.manifest;
}

Result<Bytes> UnitService::HandleCheckpoint(const net::Request& r) {
  ML_ASSIGN_OR_RETURN(CheckpointRequest q, DecodeCheckpointRequest(r.body));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find({q.task, q.index});
  if (it == units_.end()) {
    return NotFound("unit " + std::to_string(q.index) + " of task " + q.task.ShortHex() +
                    " is not served here");
  }
  auto f = it->second.files.find(q.step);
  if (f == it->second.files.end()) {
    return NotFound("no checkpoint at step " + std::to_string(q.step) + " of unit " +
                    std::to_string(q.index));
  }
  const auto& [path, size] = f->second;
  if (q.offset >= size) {
    return InvalidArgument("unit.checkpoint: offset " + std::to_string(q.offset) +
                           " is past the file's " + std::to_string(size) + " bytes");
  }
  if (cached_path_ != path) {
    Result<std::string> bytes = env_->ReadFile(path);
    if (!bytes.ok()) return Unavailable("checkpoint file: " + bytes.status().message());
    if (bytes->size() != size) {
      return DataLoss("checkpoint file " + path + " changed size since it was published");
    }
    cached_path_ = path;
    cached_bytes_ = std::move(*bytes);
  }
  const uint64_t n = std::min<uint64_t>(q.length, size - q.offset);
  return Bytes(cached_bytes_.begin() + static_cast<ptrdiff_t>(q.offset),
               cached_bytes_.begin() + static_cast<ptrdiff_t>(q.offset + n));
}

Result<UnitManifest> FetchUnitManifest(net::Transport* transport, const std::string& endpoint,
                                       const Hash256& task, uint32_t index, int64_t timeout_ms) {
  if (endpoint.empty()) return Unavailable("the solver has no endpoint");
  net::Request req{.method = kMethodUnitManifest, .body = EncodeUnitKey(task, index),
                   .timeout_ms = timeout_ms,
                   .max_response_bytes = 16 + 32ull * kMaxManifestLeaves + 16ull * 4096};
  ML_ASSIGN_OR_RETURN(Bytes body, transport->Send(endpoint, std::move(req)));
  ML_ASSIGN_OR_RETURN(UnitManifest m, DecodeUnitManifest(body));
  if (m.task_id != task || m.index != index) {
    return DataLoss("unit manifest from " + endpoint + " names another unit");
  }
  return m;
}

Result<Bytes> FetchUnitCheckpoint(net::Transport* transport, const std::string& endpoint,
                                  const UnitManifest& manifest, int64_t step,
                                  int64_t timeout_ms) {
  auto ref = std::find_if(manifest.checkpoints.begin(), manifest.checkpoints.end(),
                          [&](const UnitCheckpointRef& c) { return c.step == step; });
  if (ref == manifest.checkpoints.end()) {
    return NotFound("the solver lists no checkpoint at step " + std::to_string(step));
  }
  if (ref->size > kMaxEncodedLength) {
    return InvalidArgument("checkpoint of " + std::to_string(ref->size) + " bytes is too large");
  }
  Bytes out;
  out.reserve(ref->size);
  while (out.size() < ref->size) {
    CheckpointRequest q{.task = manifest.task_id,
                        .index = manifest.index,
                        .step = step,
                        .offset = out.size(),
                        .length = std::min<uint64_t>(kMaxCheckpointSlice, ref->size - out.size())};
    net::Request req{.method = kMethodUnitCheckpoint, .body = EncodeCheckpointRequest(q),
                     .timeout_ms = timeout_ms, .max_response_bytes = kMaxCheckpointSlice + 64};
    ML_ASSIGN_OR_RETURN(Bytes slice, transport->Send(endpoint, std::move(req)));
    if (slice.empty() || slice.size() > q.length) {
      return DataLoss("checkpoint slice from " + endpoint + " has " +
                      std::to_string(slice.size()) + " bytes, asked " +
                      std::to_string(q.length));
    }
    out.insert(out.end(), slice.begin(), slice.end());
  }
  return out;
}

}  // namespace meshlearn::node
