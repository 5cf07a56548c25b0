// BlobStore: content-addressed blobs on disk under a data directory.
//
//   <dir>/chunks/<hex of chunk hash>     the bytes of one chunk
//   <dir>/manifests/<hex of blob id>     an encoded Manifest (blob.h)
//   <dir>/pins                           the pinned blob ids, one "hex count" a line
//
// Every file is written with Env::WriteFileAtomic, so after a crash a chunk or manifest file is
// either absent or complete; leftover temporaries (any name that is not 64 hex digits) are deleted
// by Open and are never visible. Chunks are checked against their hash when read: a file corrupted
// on disk is deleted and reported as DataLoss, so the fetcher can fetch it again.
//
// Space: `quota_bytes` bounds the bytes of chunk and manifest files. When a write would exceed
// it, the store first drops chunks no manifest refers to, then evicts whole blobs, least recently
// used first, skipping pinned and held blobs; if that is not enough the write fails with
// ResourceExhausted and nothing changes. Pins (Pin/Unpin) are persistent reference counts, for
// blobs the node must keep (its model, its task data). Holds (Hold/Release) are in-memory and are
// for work in progress (a fetch, a read), so a crash never leaks them. The use order for LRU is
// kept in memory only: after a restart, blobs not used since are evicted first, in id order.
//
//   ML_ASSIGN_OR_RETURN(auto store, BlobStore::Open(Env::Default(), "/var/lib/ml/blobs",
//                                                    {.quota_bytes = 10ull << 30}));
//   ML_ASSIGN_OR_RETURN(BlobId id, store->Put(data));
//   ML_RETURN_IF_ERROR(store->Pin(id));
//   ML_ASSIGN_OR_RETURN(Bytes back, store->Get(id));
//
// One BlobStore per directory at a time (Open deletes temporaries it did not write).
//
// Thread-safety: all methods are thread-safe (one internal mutex). Chunk hashing is done outside
// it. With Env::Default(), which is thread-safe, PutChunk and chunk reads also do their file I/O
// outside it, so parallel fetches overlap their fsyncs; any other Env (MemEnv is only
// thread-compatible) is only ever called under the mutex.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/net/blob.h"

namespace meshlearn::net {

struct BlobStoreOptions {
  uint64_t quota_bytes = 0;  // 0: no quota
};

struct BlobStoreStats {
  uint64_t used_bytes = 0;
  uint64_t quota_bytes = 0;
  uint64_t chunk_files = 0;
  uint64_t manifests = 0;
  uint64_t complete_blobs = 0;
  uint64_t evicted_blobs = 0;   // since Open
  uint64_t dropped_chunks = 0;  // orphan or corrupt chunk files deleted since Open
};

class BlobStore {
 public:
  // Opens (creating if needed) the store under `dir`. `env` must outlive the store.
  static Result<std::unique_ptr<BlobStore>> Open(Env* env, std::string dir,
                                                 BlobStoreOptions options = {});

  BlobStore(const BlobStore&) = delete;
  BlobStore& operator=(const BlobStore&) = delete;

  // Stores a whole blob (manifest first, then the chunks it does not have yet).
  Result<BlobId> Put(ByteSpan data, uint32_t chunk_size = kDefaultChunkSize);
  // Reads a whole blob, checking every chunk. NotFound if the manifest or a chunk is missing.
  Result<Bytes> Get(const BlobId& id);
  // Bytes [offset, offset + length) of a blob, reading (and checking) only the chunks that hold
  // them: a part of a large blob without the whole of it in memory. InvalidArgument when the
  // range runs past the blob's end; NotFound as Get.
  Result<Bytes> ReadRange(const BlobId& id, uint64_t offset, uint64_t length);

  // Stores a manifest (validated; its id is computed, not trusted). Idempotent.
  Status PutManifest(const Manifest& m);
  Result<Manifest> GetManifest(const BlobId& id);
  // The encoded manifest, as served to peers.
  Result<Bytes> GetManifestBytes(const BlobId& id);
  bool HasManifest(const BlobId& id);

  // Stores one chunk after checking that Blake2b(data) == hash (InvalidArgument otherwise) and
  // that it is not larger than kMaxChunkSize. Idempotent.
  Status PutChunk(const Hash256& hash, ByteSpan data);
  // NotFound if absent; DataLoss (and the file is deleted) if the file does not match its hash.
  Result<Bytes> GetChunk(const Hash256& hash);
  bool HasChunk(const Hash256& hash);

  // True iff the manifest and every chunk are present.
  bool HasBlob(const BlobId& id);
  // Indexes of the chunks of `id` not on disk. NotFound without the manifest.
  Result<std::vector<size_t>> MissingChunks(const BlobId& id);
  std::vector<BlobId> ListBlobs();  // every stored manifest, complete or not, sorted

  // Persistent reference counts. Pinning an id that is not stored yet is allowed (pin, then
  // fetch). Unpin of an unpinned id is FailedPrecondition.
  Status Pin(const BlobId& id);
  Status Unpin(const BlobId& id);
  bool IsPinned(const BlobId& id);
  // In-memory reference counts for work in progress. REQUIRES (Release): a matching Hold.
  void Hold(const BlobId& id);
  void Release(const BlobId& id);

  // Removes a blob's manifest and the chunks no other manifest uses. FailedPrecondition if the
  // blob is pinned or held.
  Status Remove(const BlobId& id);
  // Deletes chunks no manifest refers to, then evicts LRU unpinned blobs until within quota.
  Status CollectGarbage();

  BlobStoreStats stats();

 private:
  struct BlobInfo {
    Manifest manifest;
    uint64_t manifest_bytes = 0;
    uint64_t last_use = 0;
  };

  BlobStore(Env* env, std::string dir, BlobStoreOptions options);
  Status Load();
  std::string ChunkPath(const Hash256& h) const;
  std::string ManifestPath(const BlobId& id) const;

  // All *Locked methods REQUIRE mu_ held.
  Status PutManifestLocked(const Manifest& m, Bytes encoded);
  Status PutChunkLocked(const Hash256& hash, ByteSpan data);
  // Reads and verifies a chunk file; a corrupt one is deleted (DataLoss).
  Result<std::string> ReadChunk(const Hash256& hash);
  bool HasBlobLocked(const BlobId& id) const;
  bool EvictableLocked(const BlobId& id) const;
  // Frees space until `need` more bytes fit in the quota, or fails with nothing evicted beyond
  // what was needed. `keep` is never evicted.
  Status MakeRoomLocked(uint64_t need, const BlobId* keep);
  Status RemoveLocked(const BlobId& id);
  Status DropOrphansLocked();
  Status SavePinsLocked();
  void TouchLocked(const BlobId& id);

  Env* const env_;
  const std::string dir_;
  const BlobStoreOptions options_;
  const bool parallel_io_;  // env_ is thread-safe: chunk I/O may run outside mu_

  std::mutex mu_;
  std::map<Hash256, uint64_t> chunks_;  // chunk files on disk -> size
  std::map<Hash256, uint32_t> refs_;  // manifests listing a hash (each counts once), on disk or not
  std::map<BlobId, BlobInfo> blobs_;
  std::map<BlobId, uint32_t> pins_;
  std::map<BlobId, uint32_t> holds_;
  std::set<Hash256> writing_;      // chunks being written outside mu_ (parallel_io_)
  std::condition_variable io_cv_;  // signalled when a write outside mu_ ends
  uint64_t used_bytes_ = 0;
  uint64_t tick_ = 0;
  uint64_t evicted_blobs_ = 0;
  uint64_t dropped_chunks_ = 0;
};

}  // namespace meshlearn::net
