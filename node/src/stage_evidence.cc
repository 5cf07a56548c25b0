#include "meshlearn/node/stage_evidence.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/env.h"

namespace meshlearn::node {

using protocol::StageStepCommit;
using protocol::StageTransfer;

namespace {

enum class StageSlicePart : uint8_t { kStageSliceCheckpoint = 0, kStageSliceTensor = 1 };

void PutStageRef(Encoder& e, const StageStepRef& r) {
  e.PutHash(r.task).PutU32(r.round).PutU32(r.replica).PutU32(r.stage).PutU64(r.step);
}

Status GetStageRef(Decoder& d, StageStepRef* r) {
  ML_RETURN_IF_ERROR(d.GetHash(&r->task, "task"));
  ML_RETURN_IF_ERROR(d.GetU32(&r->round, "round"));
  ML_RETURN_IF_ERROR(d.GetU32(&r->replica, "replica"));
  ML_RETURN_IF_ERROR(d.GetU32(&r->stage, "stage"));
  return d.GetU64(&r->step, "step");
}

struct StageSliceRequest {
  StageStepRef ref;
  StageSlicePart part = StageSlicePart::kStageSliceCheckpoint;
  Hash256 tensor;
  uint64_t offset = 0;
  uint64_t length = 0;
};

Bytes EncodeStageSliceRequest(const StageSliceRequest& q) {
  Encoder e;
  PutStageRef(e, q.ref);
  e.PutU8(static_cast<uint8_t>(q.part)).PutHash(q.tensor).PutU64(q.offset).PutU64(q.length);
  return e.Take();
}

Result<StageSliceRequest> DecodeStageSliceRequest(ByteSpan wire) {
  Decoder d(wire, "stage.slice request");
  StageSliceRequest q;
  ML_RETURN_IF_ERROR(GetStageRef(d, &q.ref));
  uint8_t part = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&part, "part"));
  if (part > 1) {
    return InvalidArgument("stage.slice request: part " + std::to_string(part) +
                           " is neither 0 (checkpoint) nor 1 (tensor)");
  }
  q.part = static_cast<StageSlicePart>(part);
  ML_RETURN_IF_ERROR(d.GetHash(&q.tensor, "tensor"));
  ML_RETURN_IF_ERROR(d.GetU64(&q.offset, "offset"));
  ML_RETURN_IF_ERROR(d.GetU64(&q.length, "length"));
  ML_RETURN_IF_ERROR(d.Finish());
  if (q.length == 0 || q.length > kMaxStageSlice) {
    return InvalidArgument("stage.slice request: length must be in [1, " +
                           std::to_string(kMaxStageSlice) + "], got " + std::to_string(q.length));
  }
  return q;
}

// Fetches `size` bytes of one part in slices.
Result<Bytes> StageFetchPart(net::Transport* transport, const std::string& endpoint,
                             StageSliceRequest q, uint64_t size, int64_t timeout_ms) {
  Bytes out;
  out.reserve(size);
  while (out.size() < size) {
    q.offset = out.size();
    q.length = std::min<uint64_t>(kMaxStageSlice, size - out.size());
    net::Request req{.method = kMethodStageSlice,
                     .body = EncodeStageSliceRequest(q),
                     .timeout_ms = timeout_ms,
                     .max_response_bytes = kMaxStageSlice + 64};
    Result<Bytes> answer = transport->Send(endpoint, std::move(req));
    // A part shorter than asked (the node's offset check): what it has, for the replay to judge.
    if (!answer.ok() && answer.status().code() == StatusCode::kInvalidArgument && !out.empty()) {
      break;
    }
    ML_ASSIGN_OR_RETURN(Bytes slice, std::move(answer));
    if (slice.empty() || slice.size() > q.length) {
      return DataLoss("stage.slice from " + endpoint + " has " + std::to_string(slice.size()) +
                      " bytes, asked " + std::to_string(q.length));
    }
    out.insert(out.end(), slice.begin(), slice.end());
  }
  return out;
}

}  // namespace

std::string StageStepRef::ToString() const {
  return "replica " + std::to_string(replica) + ", stage " + std::to_string(stage) + ", step " +
         std::to_string(step);
}

StageStepRef StageStepRefOf(const StageStepCommit& c) {
  return {c.task, c.round, c.replica, c.stage, c.step};
}

void StageEvidence::Register(net::Router* router) {
  router->Register(
      kMethodStageStep, [this](const net::Request& r) { return HandleStep(r); }, 256);
  router->Register(
      kMethodStageSlice, [this](const net::Request& r) { return HandleSlice(r); }, 256);
}

Status StageEvidence::DeleteLeftovers() {
  std::lock_guard<std::mutex> lock(mu_);
  Result<std::vector<std::string>> names = env_->ListDir(dir_);
  if (!names.ok() && names.status().code() == StatusCode::kNotFound) return Status::Ok();
  if (!names.ok()) return names.status().WithPrefix("stage evidence folder " + dir_);
  for (const std::string& n : *names) {
    const std::string path = JoinPath(dir_, n);
    Status deleted = env_->DeleteFile(path);
    if (!deleted.ok()) {
      return deleted.WithPrefix("stage evidence: an earlier process's file " + path +
                                " (delete it by hand)");
    }
  }
  return Status::Ok();
}

Status StageEvidence::SaveCheckpoint(const StageStepRef& ref, engine::TrainState& state) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!created_) {
      ML_RETURN_IF_ERROR(env_->CreateDirs(dir_).WithPrefix("stage evidence folder"));
      created_ = true;
    }
    path = JoinPath(dir_, ref.task.ToHex() + "-r" + std::to_string(ref.round) + "-p" +
                              std::to_string(ref.replica) + "-s" + std::to_string(ref.stage) +
                              "-t" + std::to_string(ref.step) + "-w" + std::to_string(++writes_) +
                              ".safetensors");
  }
  // Written outside the lock (tens of MB), so that verifiers are served meanwhile, a tensor at a
  // time from the state itself.
  uint64_t size = 0;
  Status written = [&]() -> Status {
    ML_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file,
                        env_->OpenRandomRW(path, /*create=*/true));
    ML_RETURN_IF_ERROR(file->Truncate(0));
    return engine::WriteCheckpoint(state, [&](std::string_view piece) -> Status {
      ML_RETURN_IF_ERROR(file->Write(size, piece));
      size += piece.size();
      return Status::Ok();
    });
  }();
  if (!written.ok()) {
    (void)env_->DeleteFile(path);
    return written.WithPrefix("the checkpoint of " + ref.ToString() + " (" + path + ")");
  }
  // Pending until the step's Publish: what is served of the step until then (an earlier run's,
  // the same when the stage is honest) stays served.
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = steps_[ref];
  if (!e.pending.file.empty()) (void)env_->DeleteFile(e.pending.file);  // a run that failed
  e.pending = {path, size};
  return Status::Ok();
}

Result<std::string> StageEvidence::CheckpointFile(const StageStepRef& ref) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = steps_.find(ref);
  if (it != steps_.end() && it->second.published) return it->second.checkpoint.file;
  if (it != steps_.end() && !it->second.pending.file.empty()) return it->second.pending.file;
  return NotFound("stage evidence: no checkpoint of " + ref.ToString());
}

Result<engine::TrainState> StageEvidence::PublishedCheckpointState(const StageStepRef& ref) const {
  Checkpoint c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = steps_.find(ref);
    if (it == steps_.end() || !it->second.published || it->second.checkpoint.file.empty()) {
      return NotFound("stage evidence: no published checkpoint of " + ref.ToString());
    }
    c = it->second.checkpoint;
  }
  return ReadCheckpointFile(ref, c);
}

Result<engine::TrainState> StageEvidence::PendingCheckpointState(const StageStepRef& ref) const {
  Checkpoint c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = steps_.find(ref);
    if (it == steps_.end() || it->second.pending.file.empty()) {
      return NotFound("stage evidence: no checkpoint of " + ref.ToString() +
                      " saved since the step was last published");
    }
    c = it->second.pending;
  }
  return ReadCheckpointFile(ref, c);
}

Result<engine::TrainState> StageEvidence::ReadCheckpointFile(const StageStepRef& ref,
                                                             const Checkpoint& c) const {
  const std::string& path = c.file;
  const uint64_t size = c.bytes;
  // Read without the lock, as HandleSlice reads it (a file withdrawn meanwhile fails the read).
  Result<std::unique_ptr<RandomRWFile>> file = env_->OpenRandomRW(path, /*create=*/false);
  if (!file.ok()) {
    return DataLoss("the checkpoint of " + ref.ToString() + " (" + path +
                    ") cannot be opened: " + file.status().message());
  }
  auto read = [&](uint64_t offset, std::span<char> out) -> Status {
    Result<size_t> got = (*file)->Read(offset, out.size(), out.data());
    if (!got.ok()) return got.status().WithPrefix("reading " + path);
    if (*got != out.size()) {
      return DataLoss("the checkpoint file " + path + " ends at byte " +
                      std::to_string(offset + *got) + ", before the " + std::to_string(size) +
                      " bytes it was written with");
    }
    return Status::Ok();
  };
  return engine::ReadCheckpoint(size, read,
                                "the checkpoint of " + ref.ToString() + " (" + path + ")");
}

void StageEvidence::DeleteFiles(const Entry& e) {
  if (!e.checkpoint.file.empty()) (void)env_->DeleteFile(e.checkpoint.file);
  if (!e.pending.file.empty()) (void)env_->DeleteFile(e.pending.file);
  ReleaseTensors(e.tensors);
}

std::string StageEvidence::TensorPath(const Hash256& tensor) const {
  return JoinPath(dir_, "tensor-" + tensor.ToHex() + ".f32");
}

void StageEvidence::ReleaseTensors(const std::map<Hash256, uint64_t>& tensors) {
  for (const auto& [hash, size] : tensors) {
    auto f = files_.find(hash);
    CHECK(f != files_.end() && f->second.refs > 0) << "tensor file " << hash.ShortHex();
    if (--f->second.refs > 0) continue;
    (void)env_->DeleteFile(TensorPath(hash));
    files_.erase(f);
  }
}

Result<std::string> StageEvidence::TensorFile(const Hash256& tensor) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (files_.count(tensor) == 0) {
    return NotFound("stage evidence: no served step lists tensor " + tensor.ShortHex());
  }
  return TensorPath(tensor);
}

Status StageEvidence::Publish(const StageStepCommit& commit, std::map<Hash256, Bytes> received) {
  const StageStepRef ref = StageStepRefOf(commit);
  auto no_checkpoint = [&] {
    return FailedPrecondition("stage evidence of " + ref.ToString() +
                              ": no checkpoint of the step's start was saved (SaveCheckpoint "
                              "before the step)");
  };
  // The step's tensors, counted as listed before any is written (so that a file another step
  // lists is not deleted meanwhile); the new ones are written outside the lock, so that
  // verifiers are served meanwhile.
  std::map<Hash256, uint64_t> tensors;
  std::vector<Hash256> fresh;  // files this call writes
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = steps_.find(ref);
    if (it == steps_.end() || it->second.pending.file.empty()) return no_checkpoint();
    for (const auto& [hash, bytes] : received) {
      tensors[hash] = bytes.size();
      TensorFileRef& f = files_[hash];
      if (f.refs++ == 0) {
        f.bytes = bytes.size();
        fresh.push_back(hash);
      }
    }
  }
  Status written = Status::Ok();
  for (const Hash256& hash : fresh) {
    auto t = received.find(hash);
    const std::string path = TensorPath(hash);
    // As a checkpoint file: written whole before any step that lists it is served (nothing
    // serves the name until then: no served step lists the hash), not synced (a restart deletes
    // every file of the folder).
    written = [&]() -> Status {
      ML_ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> file,
                          env_->OpenRandomRW(path, /*create=*/true));
      ML_RETURN_IF_ERROR(file->Truncate(0));
      return file->Write(
          0, std::string_view(reinterpret_cast<const char*>(t->second.data()), t->second.size()));
    }();
    if (!written.ok()) {
      written =
          written.WithPrefix("stage evidence of " + ref.ToString() + ": the tensor file " + path);
      break;
    }
    received.erase(t);  // on disk now: freed
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = steps_.find(ref);
  if (!written.ok() || it == steps_.end() || it->second.pending.file.empty()) {
    ReleaseTensors(tensors);  // the files written for this step alone go again
    return written.ok() ? no_checkpoint() : written;
  }
  Entry& e = it->second;
  if (!e.checkpoint.file.empty()) (void)env_->DeleteFile(e.checkpoint.file);  // an earlier run's
  ReleaseTensors(e.tensors);  // an earlier run's (the same hashes, when honest: counted twice now)
  e.published = true;
  e.commit = protocol::EncodeStageStepCommit(commit);
  e.tensors = std::move(tensors);
  e.checkpoint = std::move(e.pending);
  e.pending = {};
  return Status::Ok();
}

Status StageEvidence::ServeCommit(const StageStepCommit& commit) {
  const StageStepRef ref = StageStepRefOf(commit);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = steps_.find(ref);
  if (it == steps_.end() || !it->second.published) {
    return FailedPrecondition("stage evidence of " + ref.ToString() +
                              ": the step is not published; nothing to serve the commit beside");
  }
  it->second.commit = protocol::EncodeStageStepCommit(commit);
  return Status::Ok();
}

uint64_t StageEvidence::DropSent(const StageStepRef& unit) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t dropped = 0;
  for (auto& [ref, e] : steps_) {
    if (ref.task != unit.task || ref.round != unit.round || ref.replica != unit.replica ||
        ref.stage != unit.stage || !e.published) {
      continue;
    }
    Result<StageStepCommit> c = protocol::DecodeStageStepCommit(e.commit);
    if (!c.ok()) continue;  // encoded here: cannot happen
    std::map<Hash256, uint64_t> sent;
    std::erase_if(e.tensors, [&](const auto& kv) {
      const bool received =
          std::any_of(c->received.begin(), c->received.end(),
                      [&](const StageTransfer& r) { return r.tensor == kv.first; });
      if (!received) sent.insert(kv);
      return !received;
    });
    for (const auto& [hash, size] : sent) dropped += size;
    ReleaseTensors(sent);
  }
  return dropped;
}

void StageEvidence::Withdraw(const StageStepRef& ref) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = steps_.find(ref);
  if (it == steps_.end()) return;
  DeleteFiles(it->second);
  steps_.erase(it);
}

size_t StageEvidence::WithdrawRoundsBefore(const protocol::TaskId& task, uint32_t round) {
  return WithdrawIf(task, [round](const StageStepRef& ref) { return ref.round < round; });
}

size_t StageEvidence::WithdrawIf(const protocol::TaskId& task,
                                 const std::function<bool(const StageStepRef&)>& drop) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::erase_if(steps_, [&](const auto& kv) {
    if (kv.first.task != task || !drop(kv.first)) return false;
    DeleteFiles(kv.second);
    return true;
  });
}

uint64_t StageEvidence::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [ref, e] : steps_) {
    if (!e.published) continue;
    total += e.commit.size() + e.checkpoint.bytes;
  }
  for (const auto& [hash, f] : files_) total += f.bytes;
  return total;
}

uint64_t StageEvidence::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [ref, e] : steps_) total += e.commit.size();
  return total;
}

uint64_t StageEvidence::tensor_file_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [hash, f] : files_) total += f.bytes;
  return total;
}

uint64_t StageEvidence::checkpoint_file_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [ref, e] : steps_) total += e.published ? e.checkpoint.bytes : 0;
  return total;
}

Result<Bytes> StageEvidence::HandleStep(const net::Request& r) const {
  Decoder d(r.body, "stage.step request");
  StageStepRef ref;
  ML_RETURN_IF_ERROR(GetStageRef(d, &ref));
  ML_RETURN_IF_ERROR(d.Finish());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = steps_.find(ref);
  if (it == steps_.end() || !it->second.published) {
    return NotFound("stage.step: this node serves no " + ref.ToString());
  }
  Encoder e;
  e.PutBytes(it->second.commit).PutU64(it->second.checkpoint.bytes);
  return e.Take();
}

namespace {

// Bytes [offset, offset + min(length, size - offset)) of a part of `size` bytes.
Result<uint64_t> StageSliceLength(const StageSliceRequest& q, uint64_t size) {
  if (q.offset >= size) {
    return InvalidArgument("stage.slice: offset " + std::to_string(q.offset) + " is past the " +
                           std::to_string(size) + " bytes");
  }
  return std::min<uint64_t>(q.length, size - q.offset);
}

}  // namespace

Result<Bytes> StageEvidence::HandleSlice(const net::Request& r) const {
  ML_ASSIGN_OR_RETURN(StageSliceRequest q, DecodeStageSliceRequest(r.body));
  std::unique_lock<std::mutex> lock(mu_);
  auto it = steps_.find(q.ref);
  if (it == steps_.end() || !it->second.published) {
    return NotFound("stage.slice: this node serves no " + q.ref.ToString());
  }
  const bool tensor = q.part == StageSlicePart::kStageSliceTensor;
  uint64_t size = it->second.checkpoint.bytes;
  std::string path = it->second.checkpoint.file;
  if (tensor) {
    auto t = it->second.tensors.find(q.tensor);
    if (t == it->second.tensors.end()) {
      return NotFound("stage.slice: " + q.ref.ToString() + " received no tensor " +
                      q.tensor.ShortHex());
    }
    size = t->second;
    path = TensorPath(q.tensor);
  }
  lock.unlock();  // the file is read without the lock (a step withdrawn meanwhile: its file is
                  // gone, and the read fails)
  const std::string what = std::string(tensor ? "the tensor file " : "the checkpoint file ") +
                           path + " of " + q.ref.ToString();
  ML_ASSIGN_OR_RETURN(uint64_t n, StageSliceLength(q, size));
  Result<std::unique_ptr<RandomRWFile>> file = env_->OpenRandomRW(path, /*create=*/false);
  if (!file.ok()) {
    return DataLoss("stage.slice: " + what + " cannot be opened: " + file.status().message());
  }
  if (tensor) {
    // Written whole before any step listing it was served: one of another size was changed
    // behind the node's back.
    Result<uint64_t> on_disk = (*file)->Size();
    if (!on_disk.ok()) return on_disk.status().WithPrefix("stage.slice: " + what);
    if (*on_disk != size) {
      return DataLoss("stage.slice: " + what + " has " + std::to_string(*on_disk) +
                      " bytes, not the " + std::to_string(size) + " it was written with");
    }
  }
  Bytes out(n);
  Result<size_t> got = (*file)->Read(q.offset, n, reinterpret_cast<char*>(out.data()));
  if (!got.ok()) return got.status().WithPrefix("stage.slice: reading " + path);
  if (*got != n) {
    return DataLoss("stage.slice: " + what + " ends at byte " + std::to_string(q.offset + *got) +
                    ", before the " + std::to_string(size) + " bytes it was written with");
  }
  return out;
}

namespace {

// The commit of `ref` and the tensors of its records that `wanted` picks (received or sent).
Result<StageStepEvidence> FetchStageStepWith(
    net::Transport* transport, const std::string& endpoint, const StageStepRef& ref,
    const std::function<std::vector<StageTransfer>(const StageStepCommit&)>& wanted,
    int64_t timeout_ms, uint64_t max_tensor_bytes = UINT64_MAX) {
  Encoder e;
  PutStageRef(e, ref);
  net::Request req{.method = kMethodStageStep,
                   .body = e.Take(),
                   .timeout_ms = timeout_ms,
                   .max_response_bytes = 16 + protocol::kStageTransferWireBytes *
                                                  (2 * protocol::kMaxStageStepTransfers + 1)};
  ML_ASSIGN_OR_RETURN(Bytes answer, transport->Send(endpoint, std::move(req)));
  Decoder d(answer, "stage.step answer from " + endpoint);
  Bytes commit_bytes;
  uint64_t checkpoint_size = 0;
  ML_RETURN_IF_ERROR(d.GetBytes(&commit_bytes, "commit"));
  ML_RETURN_IF_ERROR(d.GetU64(&checkpoint_size, "checkpoint_bytes"));
  ML_RETURN_IF_ERROR(d.Finish());
  StageStepEvidence ev;
  Result<StageStepCommit> commit = protocol::DecodeStageStepCommit(commit_bytes);
  if (!commit.ok()) return commit.status().WithPrefix("stage.step answer from " + endpoint);
  ev.commit = std::move(*commit);
  if (!(StageStepRefOf(ev.commit) == ref)) {
    return InvalidArgument("stage.step answer from " + endpoint + ": the commit is of " +
                           StageStepRefOf(ev.commit).ToString() + ", asked " + ref.ToString());
  }
  if (checkpoint_size == 0 || checkpoint_size > kMaxEncodedLength) {
    return InvalidArgument("stage.step answer from " + endpoint + ": a checkpoint of " +
                           std::to_string(checkpoint_size) + " bytes (1 to " +
                           std::to_string(kMaxEncodedLength) + ")");
  }
  ev.checkpoint_bytes = checkpoint_size;
  StageSliceRequest q{.ref = ref, .part = StageSlicePart::kStageSliceTensor};
  const std::vector<StageTransfer> tensors = wanted(ev.commit);
  // A tensor's declared size is reserved before its bytes arrive: bounded before any is fetched.
  for (const StageTransfer& t : tensors) {
    if (t.bytes > max_tensor_bytes) {
      return ResourceExhausted("stage.step answer from " + endpoint + ": " + t.key.ToString() +
                               " declares " + std::to_string(t.bytes) + " bytes, over the " +
                               std::to_string(max_tensor_bytes) + " fetched of one tensor");
    }
  }
  for (const StageTransfer& t : tensors) {
    if (ev.blobs.count(t.tensor) > 0) continue;
    q.tensor = t.tensor;
    Result<Bytes> tensor = StageFetchPart(transport, endpoint, q, t.bytes, timeout_ms);
    if (tensor.status().code() == StatusCode::kNotFound) continue;  // the replay: `unserved`
    if (!tensor.ok()) return tensor.status();
    ev.blobs[t.tensor] = std::move(*tensor);
  }
  return ev;
}

}  // namespace

Result<StageStepEvidence> FetchStageStepRecords(net::Transport* transport,
                                                const std::string& endpoint,
                                                const StageStepRef& ref, int64_t timeout_ms) {
  return FetchStageStepWith(
      transport, endpoint, ref, [](const StageStepCommit& c) { return c.received; }, timeout_ms);
}

Result<StageStepEvidence> FetchStageStepSent(net::Transport* transport, const std::string& endpoint,
                                             const StageStepRef& ref, uint32_t to_stage,
                                             int64_t timeout_ms, uint64_t max_tensor_bytes) {
  return FetchStageStepWith(
      transport, endpoint, ref,
      [to_stage](const StageStepCommit& c) {
        std::vector<StageTransfer> out;
        for (const StageTransfer& t : c.sent) {
          if (t.key.to_stage == to_stage) out.push_back(t);
        }
        return out;
      },
      timeout_ms, max_tensor_bytes);
}

Result<protocol::StageStepCommit> FetchStageStepCommit(net::Transport* transport,
                                                       const std::string& endpoint,
                                                       const StageStepRef& ref,
                                                       int64_t timeout_ms) {
  ML_ASSIGN_OR_RETURN(
      StageStepEvidence ev,
      FetchStageStepWith(
          transport, endpoint, ref,
          [](const StageStepCommit&) { return std::vector<StageTransfer>(); }, timeout_ms));
  return std::move(ev.commit);
}

Result<StageStepEvidence> FetchStageStepEvidence(net::Transport* transport,
                                                 const std::string& endpoint,
                                                 const StageStepRef& ref, int64_t timeout_ms) {
  ML_ASSIGN_OR_RETURN(StageStepEvidence ev,
                      FetchStageStepRecords(transport, endpoint, ref, timeout_ms));
  const StageSliceRequest q{.ref = ref};
  ML_ASSIGN_OR_RETURN(ev.checkpoint,
                      StageFetchPart(transport, endpoint, q, ev.checkpoint_bytes, timeout_ms));
  return ev;
}

Status FetchStageCheckpointState(net::Transport* transport, const std::string& endpoint,
                                 const StageStepRef& ref, uint64_t size,
                                 Result<engine::TrainState>* state, int64_t timeout_ms) {
  // The last slice fetched: ReadCheckpoint reads the header, then the tensors in the file's
  // order, so that each slice is fetched once.
  uint64_t slice_at = 0;
  Bytes slice;
  Status fetch_error;  // a fetch that failed: the function's error, not the checkpoint's
  StageSliceRequest q{.ref = ref};
  auto read = [&](uint64_t offset, std::span<char> out) -> Status {
    size_t done = 0;
    while (done < out.size()) {
      const uint64_t at = offset + done;
      if (at < slice_at || at >= slice_at + slice.size()) {
        q.offset = at;
        q.length = std::min<uint64_t>(kMaxStageSlice, size - at);
        net::Request req{.method = kMethodStageSlice,
                         .body = EncodeStageSliceRequest(q),
                         .timeout_ms = timeout_ms,
                         .max_response_bytes = kMaxStageSlice + 64};
        Result<Bytes> answer = transport->Send(endpoint, std::move(req));
        // Past what the node has (its offset check, as StageFetchPart reads it): the file is
        // shorter than the node declared, the checkpoint's fault.
        if (!answer.ok() && answer.status().code() == StatusCode::kInvalidArgument && at > 0) {
          return DataLoss("the checkpoint served by " + endpoint + " ends before byte " +
                          std::to_string(at) + " of the " + std::to_string(size) +
                          " it declared (" + answer.status().message() + ")");
        }
        if (!answer.ok()) {
          fetch_error = answer.status();
          return fetch_error;
        }
        if (answer->empty() || answer->size() > q.length) {
          fetch_error =
              DataLoss("stage.slice from " + endpoint + " has " + std::to_string(answer->size()) +
                       " bytes, asked " + std::to_string(q.length));
          return fetch_error;
        }
        slice_at = at;
        slice = std::move(*answer);
      }
      const size_t from = static_cast<size_t>(at - slice_at);
      const size_t n = std::min(out.size() - done, slice.size() - from);
      std::memcpy(out.data() + done, slice.data() + from, n);
      done += n;
    }
    return Status::Ok();
  };
  *state = engine::ReadCheckpoint(size, read,
                                  "the checkpoint of " + ref.ToString() + " from " + endpoint);
  return fetch_error;
}

}  // namespace meshlearn::node
