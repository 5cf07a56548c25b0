// Content-addressed blobs: a blob is cut into fixed-size chunks (1 MiB by default), each named by
// its BLAKE2b hash; a manifest lists the chunk hashes, and the blob's id commits to the Merkle root
// of those hashes, the total size and the chunk size. Knowing only the id, a node can check a
// manifest from an untrusted peer (RecomputeId), then each chunk against the manifest.
//
//   Manifest m = BuildManifest(data);          // or BuildManifest(data, 4096) in tests
//   BlobId id = m.id();
//   Bytes wire = EncodeManifest(m);
//   Result<Manifest> back = DecodeManifest(wire, &id);   // refuses anything not matching `id`
//
// Thread-safety: all functions are pure; Manifest and BlobId are plain values. They live in base/
// because a blob id is a pure hash that the ledger computes too (a referee step's inputs, a unit's
// result); net/ moves blobs, and re-exports these names as net::BlobId etc. (net/blob.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

inline constexpr uint32_t kDefaultChunkSize = 1u << 20;  // 1 MiB
inline constexpr uint32_t kMaxChunkSize = 4u << 20;      // largest chunk a manifest may declare
inline constexpr uint64_t kMaxBlobSize = 1ull << 40;     // 1 TiB: bounds the chunk count
// A 1 TiB blob at 1 MiB chunks has 2^20 hashes, 32 MiB of manifest; we cap manifests lower and so
// bound blobs at 64 GiB with the default chunk size. Raise both together if ever needed.
inline constexpr uint32_t kMaxManifestChunks = 1u << 16;
inline constexpr uint32_t kManifestMagic = 0x4d424c4d;  // "MLBM" little-endian
inline constexpr uint8_t kManifestVersion = 1;

// The id of a blob: Blake2b("meshlearn.blob" | MerkleRoot(chunk hashes) | total_size | chunk_size).
struct BlobId {
  Hash256 hash;

  std::string ToHex() const { return hash.ToHex(); }
  std::string ShortHex() const { return hash.ShortHex(); }
  static Result<BlobId> FromHex(std::string_view hex);
  auto operator<=>(const BlobId&) const = default;
};

struct Manifest {
  uint64_t total_size = 0;
  uint32_t chunk_size = kDefaultChunkSize;
  std::vector<Hash256> chunks;  // ceil(total_size / chunk_size) hashes; none for an empty blob

  BlobId id() const;
  Hash256 merkle_root() const;
  size_t chunk_count() const { return chunks.size(); }
  // Byte length of chunk i (the last one may be short). REQUIRES: i < chunk_count().
  uint32_t ChunkLength(size_t i) const;
  uint64_t ChunkOffset(size_t i) const { return static_cast<uint64_t>(i) * chunk_size; }
  bool operator==(const Manifest&) const = default;
};

// Cuts `data` into chunks and hashes them. REQUIRES: 0 < chunk_size <= kMaxChunkSize and the chunk
// count fits kMaxManifestChunks (CHECKed: callers size their blobs; use ValidateBlobSize first
// for untrusted sizes).
Manifest BuildManifest(ByteSpan data, uint32_t chunk_size = kDefaultChunkSize);

// BuildManifest of a blob given a piece at a time (its pieces in order): the blob is never whole
// in memory, only the chunk under way (a verifier's hash of a result it never encodes whole:
// ledger::StageResultBlobId). BuildManifest is this builder given the whole blob.
//
//   ManifestBuilder b;
//   b.Append(header);
//   for (...) b.Append(piece);
//   BlobId id = b.Finish().id();
class ManifestBuilder {
 public:
  // REQUIRES: 0 < chunk_size <= kMaxChunkSize.
  explicit ManifestBuilder(uint32_t chunk_size = kDefaultChunkSize);
  void Append(ByteSpan piece);
  // The manifest of everything appended. REQUIRES: the size fits (BuildManifest's CHECK).
  Manifest Finish();

 private:
  Manifest m_;
  Bytes chunk_;  // the chunk under way, < chunk_size bytes
};

// OK iff a blob of `size` bytes with `chunk_size` chunks is allowed.
Status ValidateBlobSize(uint64_t size, uint32_t chunk_size);

// Checks the internal consistency of a manifest (sizes, counts); does not check any id.
Status ValidateManifest(const Manifest& m);

// Canonical encoding (base/encoding.h): magic u32, version u8, total_size u64, chunk_size u32,
// count u32, then `count` raw 32-byte hashes.
Bytes EncodeManifest(const Manifest& m);
// Decodes and validates. Refuses truncated input, trailing bytes, a wrong magic or version, a
// chunk count that does not match the sizes or exceeds kMaxManifestChunks, and, when `expected`
// is given, a manifest whose id is not *expected (InvalidArgument naming both ids).
Result<Manifest> DecodeManifest(ByteSpan wire, const BlobId* expected = nullptr);

// Checks one chunk against its hash and expected length.
Status VerifyChunk(const Manifest& m, size_t index, ByteSpan data);

}  // namespace meshlearn
