#include "meshlearn/base/blob.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/merkle.h"

namespace meshlearn {

Result<BlobId> BlobId::FromHex(std::string_view hex) {
  ML_ASSIGN_OR_RETURN(Hash256 h, Hash256::FromHex(hex, "blob id"));
  return BlobId{h};
}

Hash256 Manifest::merkle_root() const { return MerkleRoot(chunks); }

BlobId Manifest::id() const {
  Hasher h("meshlearn.blob");
  h.Update(merkle_root());
  h.UpdateU64(total_size);
  h.UpdateU64(chunk_size);
  return BlobId{h.Finish()};
}

uint32_t Manifest::ChunkLength(size_t i) const {
  CHECK_LT(i, chunks.size());
  uint64_t off = ChunkOffset(i);
  uint64_t left = total_size - off;
  return static_cast<uint32_t>(left < chunk_size ? left : chunk_size);
}

static uint64_t ChunkCountFor(uint64_t size, uint32_t chunk_size) {
  return (size + chunk_size - 1) / chunk_size;
}

Status ValidateBlobSize(uint64_t size, uint32_t chunk_size) {
  if (chunk_size == 0 || chunk_size > kMaxChunkSize) {
    return InvalidArgument("blob chunk_size must be in [1, " + std::to_string(kMaxChunkSize) +
                           "], got " + std::to_string(chunk_size));
  }
  if (size > kMaxBlobSize) {
    return ResourceExhausted("blob size " + std::to_string(size) + " exceeds the limit of " +
                             std::to_string(kMaxBlobSize) + " bytes");
  }
  if (ChunkCountFor(size, chunk_size) > kMaxManifestChunks) {
    return ResourceExhausted(
        "blob of " + std::to_string(size) + " bytes needs " +
        std::to_string(ChunkCountFor(size, chunk_size)) + " chunks, more than the limit of " +
        std::to_string(kMaxManifestChunks) + "; split it or use larger chunks");
  }
  return Status::Ok();
}

Manifest BuildManifest(ByteSpan data, uint32_t chunk_size) {
  Status s = ValidateBlobSize(data.size(), chunk_size);
  CHECK(s.ok()) << s.ToString();
  ManifestBuilder b(chunk_size);
  b.Append(data);
  return b.Finish();
}

ManifestBuilder::ManifestBuilder(uint32_t chunk_size) {
  CHECK(chunk_size > 0 && chunk_size <= kMaxChunkSize) << "chunk size " << chunk_size;
  m_.chunk_size = chunk_size;
}

void ManifestBuilder::Append(ByteSpan piece) {
  m_.total_size += piece.size();
  const size_t n = m_.chunk_size;
  if (!chunk_.empty()) {  // fill the chunk under way first
    const size_t take = std::min(n - chunk_.size(), piece.size());
    chunk_.insert(chunk_.end(), piece.begin(), piece.begin() + static_cast<std::ptrdiff_t>(take));
    piece = piece.subspan(take);
    if (chunk_.size() < n) return;
    m_.chunks.push_back(Blake2b(chunk_));
    chunk_.clear();
  }
  // Whole chunks straight from the piece; the rest waits for the next piece or Finish.
  while (piece.size() >= n) {
    m_.chunks.push_back(Blake2b(piece.subspan(0, n)));
    piece = piece.subspan(n);
  }
  chunk_.assign(piece.begin(), piece.end());
}

Manifest ManifestBuilder::Finish() {
  Status s = ValidateBlobSize(m_.total_size, m_.chunk_size);
  CHECK(s.ok()) << s.ToString();
  if (!chunk_.empty()) m_.chunks.push_back(Blake2b(chunk_));
  chunk_.clear();
  Manifest out = std::move(m_);
  m_ = Manifest{.total_size = 0, .chunk_size = out.chunk_size, .chunks = {}};
  return out;
}

Status ValidateManifest(const Manifest& m) {
  ML_RETURN_IF_ERROR(ValidateBlobSize(m.total_size, m.chunk_size).WithPrefix("manifest"));
  uint64_t want = ChunkCountFor(m.total_size, m.chunk_size);
  if (m.chunks.size() != want) {
    return InvalidArgument("manifest: " + std::to_string(m.total_size) + " bytes in chunks of " +
                           std::to_string(m.chunk_size) + " need " + std::to_string(want) +
                           " chunk hashes, got " + std::to_string(m.chunks.size()));
  }
  return Status::Ok();
}

Bytes EncodeManifest(const Manifest& m) {
  Encoder e;
  e.PutU32(kManifestMagic).PutU8(kManifestVersion).PutU64(m.total_size).PutU32(m.chunk_size);
  e.PutU32(static_cast<uint32_t>(m.chunks.size()));
  for (const Hash256& h : m.chunks) e.PutHash(h);
  return e.Take();
}

Result<Manifest> DecodeManifest(ByteSpan wire, const BlobId* expected) {
  Decoder d(wire, "manifest");
  uint32_t magic = 0;
  uint8_t version = 0;
  Manifest m;
  ML_RETURN_IF_ERROR(d.GetU32(&magic, "magic"));
  if (magic != kManifestMagic) return InvalidArgument("manifest: bad magic, not a blob manifest");
  ML_RETURN_IF_ERROR(d.GetU8(&version, "version"));
  if (version != kManifestVersion) {
    return InvalidArgument("manifest: unsupported version " + std::to_string(version) +
                           " (this build reads version " + std::to_string(kManifestVersion) + ")");
  }
  ML_RETURN_IF_ERROR(d.GetU64(&m.total_size, "total_size"));
  ML_RETURN_IF_ERROR(d.GetU32(&m.chunk_size, "chunk_size"));
  ML_RETURN_IF_ERROR(ValidateBlobSize(m.total_size, m.chunk_size).WithPrefix("manifest"));
  uint32_t count = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&count, "chunks", kMaxManifestChunks, Hash256::kSize));
  m.chunks.resize(count);
  for (uint32_t i = 0; i < count; ++i) ML_RETURN_IF_ERROR(d.GetHash(&m.chunks[i], "chunk hash"));
  ML_RETURN_IF_ERROR(d.Finish());
  ML_RETURN_IF_ERROR(ValidateManifest(m));
  if (expected != nullptr) {
    BlobId got = m.id();
    if (got != *expected) {
      return InvalidArgument("manifest: describes blob " + got.ShortHex() + ", expected " +
                             expected->ShortHex() + " (wrong or forged manifest)");
    }
  }
  return m;
}

Status VerifyChunk(const Manifest& m, size_t index, ByteSpan data) {
  if (index >= m.chunks.size()) {
    return InvalidArgument("chunk index " + std::to_string(index) + " out of range (blob has " +
                           std::to_string(m.chunks.size()) + " chunks)");
  }
  if (data.size() != m.ChunkLength(index)) {
    return InvalidArgument("chunk " + std::to_string(index) + ": expected " +
                           std::to_string(m.ChunkLength(index)) + " bytes, got " +
                           std::to_string(data.size()));
  }
  Hash256 h = Blake2b(data);
  if (h != m.chunks[index]) {
    return InvalidArgument("chunk " + std::to_string(index) + ": hash " + h.ShortHex() +
                           " does not match manifest hash " + m.chunks[index].ShortHex());
  }
  return Status::Ok();
}

}  // namespace meshlearn
