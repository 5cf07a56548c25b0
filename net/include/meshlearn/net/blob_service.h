// Blob transfer over a Transport: BlobService serves manifests and chunks out of a BlobStore;
// Fetcher gets a blob from several providers at once.
//
// Methods (bodies in the canonical encoding, every field checked on decode):
//   "blob.manifest"  ManifestRequest{id}            -> encoded Manifest (blob.h)
//   "blob.chunk"     ChunkRequest{hash, accept_zstd} -> ChunkResponse{encoding, raw_size, payload}
//
// The fetcher trusts nothing a provider says: the manifest must hash to the requested id, every
// chunk must decompress to at most its manifest length and hash to its manifest hash. A provider
// that sends a bad manifest or a bad chunk is dropped for the rest of the fetch and the work goes
// to the others; one that fails to answer three times in a row is dropped too. The manifest is
// asked of one provider at a time, in order, for up to three rounds. Chunks already in
// the store are not fetched again, so a fetch that failed half way (a provider died, the network
// split) resumes where it stopped when called again.
//
//   BlobService service(&store);
//   service.Register(&router);              // then serve `router` over HTTP or a SimNode
//
//   Fetcher fetcher(transport, &store, {.pin = true});
//   Result<FetchStats> st = fetcher.Fetch(id, {"10.0.0.2:7000", "10.0.0.3:7000"});
//
// Thread-safety: BlobService is thread-safe (its handlers may run concurrently). A Fetcher may run
// several fetches at once, from any threads the Transport allows. Each fetch's bookkeeping is
// guarded by its own mutex; decoding, verifying and storing chunks run in parallel on the
// transport's threads. `done` runs once, after every request of the fetch has completed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/net/blob.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/net/transport.h"

namespace meshlearn::net {

inline constexpr char kMethodBlobManifest[] = "blob.manifest";
inline constexpr char kMethodBlobChunk[] = "blob.chunk";
inline constexpr size_t kMaxManifestBytes = 21 + 32ull * kMaxManifestChunks;
inline constexpr size_t kMaxChunkResponseBytes = 16 + kMaxChunkSize + (kMaxChunkSize >> 7) + 1024;

// ---- Messages --------------------------------------------------------------------------------

enum class ChunkEncoding : uint8_t {
  kChunkEncodingRaw = 0,
  kChunkEncodingZstd = 1,
};

struct ManifestRequest {
  BlobId id;
};
Bytes EncodeManifestRequest(const ManifestRequest& m);
Result<ManifestRequest> DecodeManifestRequest(ByteSpan wire);

struct ChunkRequest {
  Hash256 hash;
  bool accept_zstd = true;
};
Bytes EncodeChunkRequest(const ChunkRequest& m);
Result<ChunkRequest> DecodeChunkRequest(ByteSpan wire);

struct ChunkResponse {
  ChunkEncoding encoding = ChunkEncoding::kChunkEncodingRaw;
  uint32_t raw_size = 0;  // bytes after decoding; <= kMaxChunkSize
  Bytes payload;
};
Bytes EncodeChunkResponse(const ChunkResponse& m);
Result<ChunkResponse> DecodeChunkResponse(ByteSpan wire);
// Decodes the payload to the chunk bytes. Refuses (ResourceExhausted) anything that would
// decompress to more than `max_size` bytes, without allocating more than that; refuses a raw_size
// that does not match the result.
Result<Bytes> DecodeChunkPayload(const ChunkResponse& m, size_t max_size);

// zstd one-shot helpers. ZstdDecompress never produces more than `max_size` bytes: a frame that
// would (a "zip bomb") is refused with ResourceExhausted.
Bytes ZstdCompress(ByteSpan data, int level);
Result<Bytes> ZstdDecompress(ByteSpan data, size_t max_size);

// ---- Serving ---------------------------------------------------------------------------------

struct BlobServiceOptions {
  bool compress = true;  // zstd a chunk if the peer accepts it and it gets smaller
  int zstd_level = 1;
};

class BlobService {
 public:
  // `store` must outlive the service.
  explicit BlobService(BlobStore* store, BlobServiceOptions options = {});
  // Registers kMethodBlobManifest and kMethodBlobChunk.
  void Register(Router* router);

  Result<Bytes> HandleManifest(const Request& request);
  Result<Bytes> HandleChunk(const Request& request);

 private:
  BlobStore* store_;
  BlobServiceOptions options_;
};

// ---- Fetching --------------------------------------------------------------------------------

struct FetchOptions {
  size_t max_in_flight = 8;  // chunk requests outstanding, all providers together
  size_t max_in_flight_per_provider = 4;
  int max_consecutive_failures = 3;  // then the provider is dropped for this fetch
  int64_t request_timeout_ms = 30'000;
  bool accept_zstd = true;
  uint64_t max_blob_bytes = kMaxBlobSize;  // refuse (ResourceExhausted) larger blobs
  bool pin = false;                        // Pin the blob in the store once complete
};

struct FetchStats {
  uint64_t total_chunks = 0;
  uint64_t chunks_already_present = 0;  // on disk before this fetch: the resumed part
  uint64_t chunks_fetched = 0;
  uint64_t wire_bytes = 0;       // chunk payload bytes received (compressed)
  uint64_t raw_bytes = 0;        // chunk bytes stored
  uint64_t failed_requests = 0;  // transport errors, NotFound, refused data
  bool manifest_fetched = false;
  std::map<std::string, uint64_t> chunks_by_provider;
  // Providers dropped for lying or failing, with the reason.
  std::map<std::string, std::string> dropped_providers;
};

class Fetcher {
 public:
  using DoneCallback = std::function<void(const Status&, const FetchStats&)>;

  // `transport` and `store` must outlive every fetch started.
  Fetcher(Transport* transport, BlobStore* store, FetchOptions options = {});

  // Starts fetching `id` from `providers` (endpoints; order is a preference, ties go to the
  // earlier one). `done` runs once, on a transport thread or the event loop (or inside FetchAsync
  // when there is nothing to send, e.g. the blob is already complete): OK when the whole
  // blob is in the store; otherwise the error names what was missing and why each provider
  // failed, and whatever chunks did arrive stay in the store for the next attempt.
  void FetchAsync(const BlobId& id, std::vector<std::string> providers, DoneCallback done);

  // FetchAsync, then Transport::WaitUntil it is done.
  Result<FetchStats> Fetch(const BlobId& id, std::vector<std::string> providers);

 private:
  Transport* transport_;
  BlobStore* store_;
  FetchOptions options_;
};

}  // namespace meshlearn::net
