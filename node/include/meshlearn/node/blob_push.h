// Pushing blobs to nodes, like a pinning service: the submitter uploads the task bundle, the data
// files and the initial state to a few registered nodes before SubmitTask; every other node then
// fetches them from those (net::Fetcher over every registered endpoint) and serves them in turn.
//
// A node serves, besides net::BlobService's "blob.manifest"/"blob.chunk", two upload methods:
//   "blob.put_chunk"     PutChunkRequest{hash, data}: stored iff BLAKE2b(data) == hash, the chunk
//                        is at most kMaxChunkSize and the store's quota allows it.
//   "blob.put_manifest"  PutManifestRequest{manifest (net::EncodeManifest)}: accepted iff it
//                        decodes and validates, the blob is within max_blob_bytes and every
//                        chunk is already present; the blob is then complete and pinned.
// Both answer an empty body. A malformed upload is refused with InvalidArgument (what is
// wrong), an over-size one with ResourceExhausted, a manifest with chunks missing with
// FailedPrecondition (how many); nothing is stored for a refused request.
//
//   BlobUploadService upload(&store, {.max_blob_bytes = 1ull << 30});
//   upload.Register(&router);                       // with BlobService on the same router
//
//   ML_ASSIGN_OR_RETURN(PushStats st,
//                       PushBlob(transport, &store, id, {"127.0.0.1:7801", "127.0.0.1:7802"}));
//
// Thread-safety: the service is thread-safe (BlobStore is). PushBlob sends synchronously through
// the transport (Transport::Send), so on a SimNetwork it runs the event loop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/net/blob.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/net/transport.h"

namespace meshlearn::node {

inline constexpr char kMethodBlobPutChunk[] = "blob.put_chunk";
inline constexpr char kMethodBlobPutManifest[] = "blob.put_manifest";

struct PutChunkRequest {
  Hash256 hash;
  Bytes data;
};
Bytes EncodePutChunkRequest(const PutChunkRequest& m);
Result<PutChunkRequest> DecodePutChunkRequest(ByteSpan wire);

struct UploadOptions {
  uint64_t max_blob_bytes = 4ull << 30;  // larger manifests are refused (ResourceExhausted)
  bool pin = true;                       // pin a completed upload (the node keeps it)
  // Set: called with the id of every completed upload INSTEAD of pinning it (the node agent
  // records why it keeps the blob, node/pin_book.h); an error refuses the upload.
  std::function<Status(const net::BlobId&)> on_complete;
};

class BlobUploadService {
 public:
  // `store` must outlive the service.
  explicit BlobUploadService(net::BlobStore* store, UploadOptions options = {});
  // Registers kMethodBlobPutChunk and kMethodBlobPutManifest.
  void Register(net::Router* router);

  Result<Bytes> HandlePutChunk(const net::Request& request);
  Result<Bytes> HandlePutManifest(const net::Request& request);

 private:
  net::BlobStore* store_;
  UploadOptions options_;
};

struct PushStats {
  uint64_t chunks_sent = 0;
  uint64_t bytes_sent = 0;
  std::vector<std::string> succeeded;          // endpoints that now hold the blob
  std::map<std::string, std::string> failed;   // endpoint -> why
};

struct PushOptions {
  // Success needs this many endpoints to accept the blob; 0 = all of them.
  size_t min_success = 0;
  int64_t timeout_ms = 60'000;  // per request
  int attempts = 3;             // per request, for transport errors
};

// Uploads blob `id` (complete in `store`) to every endpoint. Errors: NotFound if the blob is
// not complete locally; Unavailable naming each endpoint's failure when fewer than min_success
// accepted it.
Result<PushStats> PushBlob(net::Transport* transport, net::BlobStore* store, const net::BlobId& id,
                           const std::vector<std::string>& endpoints, PushOptions options = {});

}  // namespace meshlearn::node
