#include "meshlearn/node/blob_push.h"

#include "meshlearn/base/encoding.h"
#include "meshlearn/net/blob_service.h"

namespace meshlearn::node {

Bytes EncodePutChunkRequest(const PutChunkRequest& m) {
  Encoder e;
  e.PutHash(m.hash).PutBytes(m.data);
  return e.Take();
}

Result<PutChunkRequest> DecodePutChunkRequest(ByteSpan wire) {
  Decoder d(wire, "blob.put_chunk request");
  PutChunkRequest m;
  ML_RETURN_IF_ERROR(d.GetHash(&m.hash, "hash"));
  ML_RETURN_IF_ERROR(d.GetBytes(&m.data, "data", net::kMaxChunkSize));
  ML_RETURN_IF_ERROR(d.Finish());
  return m;
}

BlobUploadService::BlobUploadService(net::BlobStore* store, UploadOptions options)
    : store_(store), options_(options) {}

void BlobUploadService::Register(net::Router* router) {
  router->Register(
      kMethodBlobPutChunk, [this](const net::Request& r) { return HandlePutChunk(r); },
      net::kMaxChunkSize + 64);
  router->Register(
      kMethodBlobPutManifest, [this](const net::Request& r) { return HandlePutManifest(r); },
      net::kMaxManifestBytes + 16);
}

Result<Bytes> BlobUploadService::HandlePutChunk(const net::Request& request) {
  ML_ASSIGN_OR_RETURN(PutChunkRequest m, DecodePutChunkRequest(request.body));
  if (Blake2b(m.data) != m.hash) {
    return InvalidArgument("blob.put_chunk: the data does not hash to " + m.hash.ShortHex() +
                           " (corrupted upload)");
  }
  ML_RETURN_IF_ERROR(store_->PutChunk(m.hash, m.data).WithPrefix("blob.put_chunk"));
  return Bytes{};
}

Result<Bytes> BlobUploadService::HandlePutManifest(const net::Request& request) {
  Result<net::Manifest> m = net::DecodeManifest(request.body);
  if (!m.ok()) return m.status().WithPrefix("blob.put_manifest");
  if (m->total_size > options_.max_blob_bytes) {
    return ResourceExhausted("blob.put_manifest: blob of " + std::to_string(m->total_size) +
                             " bytes is over this node's upload limit " +
                             std::to_string(options_.max_blob_bytes));
  }
  size_t missing = 0;
  for (const Hash256& h : m->chunks) {
    if (!store_->HasChunk(h)) ++missing;
  }
  if (missing > 0) {
    return FailedPrecondition("blob.put_manifest: " + std::to_string(missing) + " of " +
                              std::to_string(m->chunks.size()) +
                              " chunks were not uploaded (send them with blob.put_chunk first)");
  }
  net::BlobId id = m->id();
  ML_RETURN_IF_ERROR(store_->PutManifest(*m).WithPrefix("blob.put_manifest"));
  if (!store_->HasBlob(id)) {
    // A chunk was evicted in between (quota pressure): the client retries.
    return FailedPrecondition("blob.put_manifest: chunks of " + id.ShortHex() +
                              " were dropped meanwhile (store full?); upload again");
  }
  if (options_.on_complete) {
    ML_RETURN_IF_ERROR(options_.on_complete(id).WithPrefix("blob.put_manifest"));
  } else if (options_.pin && !store_->IsPinned(id)) {
    ML_RETURN_IF_ERROR(store_->Pin(id));
  }
  return Bytes{};
}

namespace {

Result<Bytes> SendWithRetry(net::Transport* t, const std::string& ep, const std::string& method,
                            const Bytes& body, const PushOptions& o) {
  Status last;
  for (int i = 0; i < std::max(1, o.attempts); ++i) {
    net::Request r{.method = method, .body = body, .timeout_ms = o.timeout_ms};
    Result<Bytes> out = t->Send(ep, std::move(r));
    if (out.ok()) return out;
    last = out.status();
    StatusCode c = last.code();
    if (c != StatusCode::kUnavailable && c != StatusCode::kDeadlineExceeded) break;
  }
  return last;
}

}  // namespace

Result<PushStats> PushBlob(net::Transport* transport, net::BlobStore* store, const net::BlobId& id,
                           const std::vector<std::string>& endpoints, PushOptions options) {
  if (!store->HasBlob(id)) {
    return NotFound("push: blob " + id.ShortHex() + " is not complete in the local store");
  }
  ML_ASSIGN_OR_RETURN(net::Manifest m, store->GetManifest(id));
  store->Hold(id);
  PushStats stats;
  for (const std::string& ep : endpoints) {
    Status st;
    for (size_t i = 0; i < m.chunks.size() && st.ok(); ++i) {
      Result<Bytes> chunk = store->GetChunk(m.chunks[i]);
      if (!chunk.ok()) {
        st = chunk.status();
        break;
      }
      Bytes body = EncodePutChunkRequest({m.chunks[i], std::move(*chunk)});
      Result<Bytes> r = SendWithRetry(transport, ep, kMethodBlobPutChunk, body, options);
      if (!r.ok()) st = r.status();
      else {
        ++stats.chunks_sent;
        stats.bytes_sent += body.size();
      }
    }
    if (st.ok()) {
      st = SendWithRetry(transport, ep, kMethodBlobPutManifest, net::EncodeManifest(m), options)
               .status();
    }
    if (st.ok()) stats.succeeded.push_back(ep);
    else stats.failed[ep] = st.message();
  }
  store->Release(id);
  size_t need = options.min_success == 0 ? endpoints.size() : options.min_success;
  if (stats.succeeded.size() < need) {
    std::string why;
    for (const auto& [ep, msg] : stats.failed) why += "; " + ep + ": " + msg;
    return Unavailable("push of blob " + id.ShortHex() + " reached " +
                       std::to_string(stats.succeeded.size()) + " of " + std::to_string(need) +
                       " required nodes" + why);
  }
  return stats;
}

}  // namespace meshlearn::node
