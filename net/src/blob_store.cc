#include "meshlearn/net/blob_store.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "meshlearn/base/log.h"

namespace meshlearn::net {
namespace {

bool IsHexName(const std::string& name) {
  if (name.size() != 2 * Hash256::kSize) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::set<Hash256> Distinct(const std::vector<Hash256>& v) { return {v.begin(), v.end()}; }

}  // namespace

BlobStore::BlobStore(Env* env, std::string dir, BlobStoreOptions options)
    : env_(env), dir_(std::move(dir)), options_(options), parallel_io_(env == Env::Default()) {}

Result<std::unique_ptr<BlobStore>> BlobStore::Open(Env* env, std::string dir,
                                                   BlobStoreOptions options) {
  std::unique_ptr<BlobStore> store(new BlobStore(env, std::move(dir), options));
  ML_RETURN_IF_ERROR(store->Load().WithPrefix("blob store " + store->dir_));
  return store;
}

std::string BlobStore::ChunkPath(const Hash256& h) const {
  return JoinPath(JoinPath(dir_, "chunks"), h.ToHex());
}
std::string BlobStore::ManifestPath(const BlobId& id) const {
  return JoinPath(JoinPath(dir_, "manifests"), id.ToHex());
}

Status BlobStore::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string chunk_dir = JoinPath(dir_, "chunks");
  std::string manifest_dir = JoinPath(dir_, "manifests");
  ML_RETURN_IF_ERROR(env_->CreateDirs(chunk_dir));
  ML_RETURN_IF_ERROR(env_->CreateDirs(manifest_dir));

  ML_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(chunk_dir));
  for (const std::string& name : names) {
    std::string path = JoinPath(chunk_dir, name);
    if (!IsHexName(name)) {  // a temporary left by a crash mid-write
      ML_RETURN_IF_ERROR(env_->DeleteFile(path));
      continue;
    }
    ML_ASSIGN_OR_RETURN(uint64_t size, env_->FileSize(path));
    Hash256 h = *Hash256::FromHex(name);
    chunks_[h] = size;
    used_bytes_ += size;
  }

  ML_ASSIGN_OR_RETURN(names, env_->ListDir(manifest_dir));
  for (const std::string& name : names) {
    std::string path = JoinPath(manifest_dir, name);
    if (!IsHexName(name)) {
      ML_RETURN_IF_ERROR(env_->DeleteFile(path));
      continue;
    }
    BlobId id{*Hash256::FromHex(name)};
    ML_ASSIGN_OR_RETURN(std::string data, env_->ReadFile(path));
    Result<Manifest> m = DecodeManifest(AsBytes(data), &id);
    if (!m.ok()) {
      ML_LOG_WARN("blob store {}: deleting bad manifest {}: {}", dir_, name, m.status().ToString());
      ML_RETURN_IF_ERROR(env_->DeleteFile(path));
      continue;
    }
    for (const Hash256& h : Distinct(m->chunks)) ++refs_[h];
    used_bytes_ += data.size();
    blobs_[id] = BlobInfo{std::move(*m), data.size(), 0};
  }

  std::string pins_path = JoinPath(dir_, "pins");
  if (env_->FileExists(pins_path)) {
    ML_ASSIGN_OR_RETURN(std::string text, env_->ReadFile(pins_path));
    std::istringstream in(text);
    std::string hex;
    uint32_t count = 0;
    while (in >> hex >> count) {
      Result<Hash256> h = Hash256::FromHex(hex, "pinned blob id");
      if (!h.ok() || count == 0) {
        return DataLoss(pins_path + ": bad line '" + hex + "'; delete the file to drop all pins");
      }
      pins_[BlobId{*h}] = count;
    }
    if (!in.eof()) return DataLoss(pins_path + ": unreadable; delete it to drop all pins");
  }
  return Status::Ok();
}

void BlobStore::TouchLocked(const BlobId& id) {
  auto it = blobs_.find(id);
  if (it != blobs_.end()) it->second.last_use = ++tick_;
}

Result<BlobId> BlobStore::Put(ByteSpan data, uint32_t chunk_size) {
  ML_RETURN_IF_ERROR(ValidateBlobSize(data.size(), chunk_size));
  Manifest m = BuildManifest(data, chunk_size);  // hashing outside the lock
  BlobId id = m.id();
  Bytes encoded = EncodeManifest(m);

  std::lock_guard<std::mutex> lock(mu_);
  uint64_t need = blobs_.count(id) ? 0 : encoded.size();
  std::set<Hash256> seen;
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    if (!chunks_.count(m.chunks[i]) && seen.insert(m.chunks[i]).second) need += m.ChunkLength(i);
  }
  ML_RETURN_IF_ERROR(MakeRoomLocked(need, &id));
  ++holds_[id];  // so the chunk writes below never evict the blob being written
  Status s = PutManifestLocked(m, std::move(encoded));
  for (size_t i = 0; s.ok() && i < m.chunks.size(); ++i) {
    if (chunks_.count(m.chunks[i])) continue;
    s = PutChunkLocked(m.chunks[i], data.subspan(m.ChunkOffset(i), m.ChunkLength(i)));
  }
  if (--holds_[id] == 0) holds_.erase(id);
  if (!s.ok()) return s;
  TouchLocked(id);
  return id;
}

Result<Bytes> BlobStore::Get(const BlobId& id) {
  ML_ASSIGN_OR_RETURN(Manifest m, GetManifest(id));
  Hold(id);
  Bytes out;
  out.reserve(m.total_size);
  Status s;
  for (size_t i = 0; i < m.chunks.size() && s.ok(); ++i) {
    Result<std::string> c = ReadChunk(m.chunks[i]);
    if (!c.ok()) {
      s = c.status().WithPrefix("blob " + id.ShortHex() + " chunk " + std::to_string(i));
    } else {
      out.insert(out.end(), c->begin(), c->end());
    }
  }
  Release(id);
  if (!s.ok()) return s;
  return out;
}

Result<Bytes> BlobStore::ReadRange(const BlobId& id, uint64_t offset, uint64_t length) {
  ML_ASSIGN_OR_RETURN(Manifest m, GetManifest(id));
  if (offset > m.total_size || length > m.total_size - offset) {
    return InvalidArgument("blob " + id.ShortHex() + " has " + std::to_string(m.total_size) +
                           " bytes; bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset + length) + ") are not in it");
  }
  Bytes out;
  out.reserve(length);
  if (length == 0) return out;
  Hold(id);
  Status s;
  const uint64_t first = offset / m.chunk_size, last = (offset + length - 1) / m.chunk_size;
  for (uint64_t i = first; i <= last && s.ok(); ++i) {
    Result<std::string> c = ReadChunk(m.chunks[i]);
    if (!c.ok()) {
      s = c.status().WithPrefix("blob " + id.ShortHex() + " chunk " + std::to_string(i));
      break;
    }
    const uint64_t start = i * m.chunk_size;  // the chunk's first byte in the blob
    const uint64_t from = std::max(offset, start) - start;
    const uint64_t to = std::min<uint64_t>(offset + length, start + c->size()) - start;
    out.insert(out.end(), c->begin() + static_cast<std::ptrdiff_t>(from),
               c->begin() + static_cast<std::ptrdiff_t>(to));
  }
  Release(id);
  if (!s.ok()) return s;
  if (out.size() != length) {
    return DataLoss("blob " + id.ShortHex() + ": its chunks hold " + std::to_string(out.size()) +
                    " of bytes [" + std::to_string(offset) + ", " +
                    std::to_string(offset + length) + ")");
  }
  return out;
}

Status BlobStore::PutManifest(const Manifest& m) {
  ML_RETURN_IF_ERROR(ValidateManifest(m));
  Bytes encoded = EncodeManifest(m);
  std::lock_guard<std::mutex> lock(mu_);
  BlobId id = m.id();
  if (blobs_.count(id)) {
    TouchLocked(id);
    return Status::Ok();
  }
  ML_RETURN_IF_ERROR(MakeRoomLocked(encoded.size(), &id));
  return PutManifestLocked(m, std::move(encoded));
}

Status BlobStore::PutManifestLocked(const Manifest& m, Bytes encoded) {
  BlobId id = m.id();
  if (blobs_.count(id)) return Status::Ok();
  ML_RETURN_IF_ERROR(env_->WriteFileAtomic(ManifestPath(id), AsStringView(encoded)));
  for (const Hash256& h : Distinct(m.chunks)) ++refs_[h];
  used_bytes_ += encoded.size();
  blobs_[id] = BlobInfo{m, encoded.size(), ++tick_};
  return Status::Ok();
}

Result<Manifest> BlobStore::GetManifest(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return NotFound("blob " + id.ShortHex() + ": no manifest in the store");
  it->second.last_use = ++tick_;
  return it->second.manifest;
}

Result<Bytes> BlobStore::GetManifestBytes(const BlobId& id) {
  ML_ASSIGN_OR_RETURN(Manifest m, GetManifest(id));
  return EncodeManifest(m);
}

bool BlobStore::HasManifest(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return blobs_.count(id) > 0;
}

Status BlobStore::PutChunk(const Hash256& hash, ByteSpan data) {
  if (data.size() > kMaxChunkSize) {
    return ResourceExhausted("chunk " + hash.ShortHex() + ": " + std::to_string(data.size()) +
                             " bytes exceeds the chunk limit of " + std::to_string(kMaxChunkSize));
  }
  Hash256 got = Blake2b(data);
  if (got != hash) {
    return InvalidArgument("chunk " + hash.ShortHex() + ": content hashes to " + got.ShortHex());
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!parallel_io_) return PutChunkLocked(hash, data);
  // Reserve the space under the lock, write without it (parallel fetches overlap their fsyncs),
  // publish under it. A chunk being written is not in chunks_, so nothing evicts or reads it.
  io_cv_.wait(lock, [&] { return !writing_.count(hash); });
  if (chunks_.count(hash)) return Status::Ok();
  ML_RETURN_IF_ERROR(MakeRoomLocked(data.size(), nullptr));
  used_bytes_ += data.size();
  writing_.insert(hash);
  lock.unlock();
  Status s = env_->WriteFileAtomic(ChunkPath(hash), AsStringView(data));
  lock.lock();
  writing_.erase(hash);
  if (s.ok() && !chunks_.count(hash)) {
    chunks_[hash] = data.size();
  } else {
    used_bytes_ -= data.size();  // failed, or Put wrote it meanwhile and counted it
  }
  io_cv_.notify_all();
  return s;
}

Status BlobStore::PutChunkLocked(const Hash256& hash, ByteSpan data) {
  if (chunks_.count(hash)) return Status::Ok();
  ML_RETURN_IF_ERROR(MakeRoomLocked(data.size(), nullptr));
  ML_RETURN_IF_ERROR(env_->WriteFileAtomic(ChunkPath(hash), AsStringView(data)));
  chunks_[hash] = data.size();
  used_bytes_ += data.size();
  return Status::Ok();
}

Result<Bytes> BlobStore::GetChunk(const Hash256& hash) {
  ML_ASSIGN_OR_RETURN(std::string data, ReadChunk(hash));
  return ToBytes(data);
}

Result<std::string> BlobStore::ReadChunk(const Hash256& hash) {
  std::string data;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!chunks_.count(hash)) return NotFound("chunk " + hash.ShortHex() + " is not in the store");
    if (parallel_io_) lock.unlock();
    Result<std::string> r = env_->ReadFile(ChunkPath(hash));
    if (!r.ok()) {
      // Evicted between the check and the read (parallel I/O only): simply not here any more.
      if (r.status().code() == StatusCode::kNotFound) {
        return NotFound("chunk " + hash.ShortHex() + " is not in the store");
      }
      return r.status();
    }
    data = std::move(*r);
  }
  if (Blake2b(AsBytes(data)) == hash) return data;  // hashed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end()) {
    ML_LOG_WARN("blob store {}: chunk {} is corrupt on disk; deleting it", dir_, hash.ShortHex());
    Status s = env_->DeleteFile(ChunkPath(hash));
    if (s.ok()) {
      used_bytes_ -= it->second;
      chunks_.erase(it);
      ++dropped_chunks_;
    }
  }
  return DataLoss("chunk " + hash.ShortHex() + " was corrupt on disk (deleted; fetch it again)");
}

bool BlobStore::HasChunk(const Hash256& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.count(hash) > 0;
}

bool BlobStore::HasBlobLocked(const BlobId& id) const {
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return false;
  for (const Hash256& h : it->second.manifest.chunks) {
    if (!chunks_.count(h)) return false;
  }
  return true;
}

bool BlobStore::HasBlob(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return HasBlobLocked(id);
}

Result<std::vector<size_t>> BlobStore::MissingChunks(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return NotFound("blob " + id.ShortHex() + ": no manifest in the store");
  std::vector<size_t> missing;
  const Manifest& m = it->second.manifest;
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    if (!chunks_.count(m.chunks[i])) missing.push_back(i);
  }
  return missing;
}

std::vector<BlobId> BlobStore::ListBlobs() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlobId> ids;
  for (const auto& [id, info] : blobs_) ids.push_back(id);
  return ids;
}

Status BlobStore::SavePinsLocked() {
  std::string text;
  for (const auto& [id, n] : pins_) text += id.ToHex() + " " + std::to_string(n) + "\n";
  return env_->WriteFileAtomic(JoinPath(dir_, "pins"), text);
}

Status BlobStore::Pin(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ++pins_[id];
  Status s = SavePinsLocked();
  if (!s.ok() && --pins_[id] == 0) pins_.erase(id);
  return s;
}

Status BlobStore::Unpin(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pins_.find(id);
  if (it == pins_.end()) return FailedPrecondition("blob " + id.ShortHex() + " is not pinned");
  if (--it->second == 0) pins_.erase(it);
  Status s = SavePinsLocked();
  if (!s.ok()) ++pins_[id];
  return s;
}

bool BlobStore::IsPinned(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return pins_.count(id) > 0;
}

void BlobStore::Hold(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ++holds_[id];
}

void BlobStore::Release(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(id);
  CHECK(it != holds_.end()) << "Release without Hold of blob " << id.ShortHex();
  if (--it->second == 0) holds_.erase(it);
}

bool BlobStore::EvictableLocked(const BlobId& id) const {
  return !pins_.count(id) && !holds_.count(id);
}

Status BlobStore::RemoveLocked(const BlobId& id) {
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return NotFound("blob " + id.ShortHex() + ": no manifest in the store");
  ML_RETURN_IF_ERROR(env_->DeleteFile(ManifestPath(id)));
  used_bytes_ -= it->second.manifest_bytes;
  for (const Hash256& h : Distinct(it->second.manifest.chunks)) {
    auto r = refs_.find(h);
    if (--r->second > 0) continue;
    refs_.erase(r);
    auto c = chunks_.find(h);
    if (c == chunks_.end()) continue;
    ML_RETURN_IF_ERROR(env_->DeleteFile(ChunkPath(h)));
    used_bytes_ -= c->second;
    chunks_.erase(c);
  }
  blobs_.erase(it);
  return Status::Ok();
}

Status BlobStore::Remove(const BlobId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!EvictableLocked(id)) {
    return FailedPrecondition("blob " + id.ShortHex() + " is pinned or in use; unpin it first");
  }
  return RemoveLocked(id);
}

Status BlobStore::DropOrphansLocked() {
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (refs_.count(it->first)) {
      ++it;
      continue;
    }
    ML_RETURN_IF_ERROR(env_->DeleteFile(ChunkPath(it->first)));
    used_bytes_ -= it->second;
    ++dropped_chunks_;
    it = chunks_.erase(it);
  }
  return Status::Ok();
}

Status BlobStore::MakeRoomLocked(uint64_t need, const BlobId* keep) {
  uint64_t quota = options_.quota_bytes;
  if (quota == 0 || used_bytes_ + need <= quota) return Status::Ok();
  if (need > quota) {
    return ResourceExhausted("blob store " + dir_ + ": " + std::to_string(need) +
                             " bytes do not fit the quota of " + std::to_string(quota));
  }
  // Dry run first, so that a write that cannot fit evicts nothing.
  uint64_t orphan_bytes = 0;
  for (const auto& [h, size] : chunks_) {
    if (!refs_.count(h)) orphan_bytes += size;
  }
  std::vector<std::pair<uint64_t, BlobId>> lru;
  for (const auto& [id, info] : blobs_) {
    if (EvictableLocked(id) && !(keep != nullptr && id == *keep))
      lru.push_back({info.last_use, id});
  }
  std::sort(lru.begin(), lru.end());
  uint64_t used = used_bytes_ - orphan_bytes;
  std::map<Hash256, uint32_t> refs = refs_;
  size_t victims = 0;
  while (used + need > quota && victims < lru.size()) {
    const BlobInfo& info = blobs_.at(lru[victims].second);
    used -= info.manifest_bytes;
    for (const Hash256& h : Distinct(info.manifest.chunks)) {
      if (--refs[h] == 0) {
        auto c = chunks_.find(h);
        if (c != chunks_.end()) used -= c->second;
      }
    }
    ++victims;
  }
  if (used + need > quota) {
    return ResourceExhausted("blob store " + dir_ + ": quota of " + std::to_string(quota) +
                             " bytes is full of pinned or in-use blobs (" +
                             std::to_string(used_bytes_) + " used, " + std::to_string(need) +
                             " more needed); unpin blobs or raise the quota");
  }
  ML_RETURN_IF_ERROR(DropOrphansLocked());
  for (size_t i = 0; i < victims; ++i) {
    ML_LOG_DEBUG("blob store {}: evicting blob {}", dir_, lru[i].second.ShortHex());
    ML_RETURN_IF_ERROR(RemoveLocked(lru[i].second));
    ++evicted_blobs_;
  }
  return Status::Ok();
}

Status BlobStore::CollectGarbage() {
  std::lock_guard<std::mutex> lock(mu_);
  ML_RETURN_IF_ERROR(DropOrphansLocked());
  if (options_.quota_bytes == 0 || used_bytes_ <= options_.quota_bytes) return Status::Ok();
  // Over quota (it was lowered, or pins were released): evict until within it.
  uint64_t over = used_bytes_ - options_.quota_bytes;
  used_bytes_ -= over;  // pretend the overflow is a pending write of `over` bytes
  Status s = MakeRoomLocked(over, nullptr);
  used_bytes_ += over;
  return s;
}

BlobStoreStats BlobStore::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  BlobStoreStats st;
  st.used_bytes = used_bytes_;
  st.quota_bytes = options_.quota_bytes;
  st.chunk_files = chunks_.size();
  st.manifests = blobs_.size();
  for (const auto& [id, info] : blobs_) st.complete_blobs += HasBlobLocked(id) ? 1 : 0;
  st.evicted_blobs = evicted_blobs_;
  st.dropped_chunks = dropped_chunks_;
  return st;
}

}  // namespace meshlearn::net
