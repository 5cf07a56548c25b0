#include "meshlearn/net/blob_service.h"

#include <zstd.h>

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/log.h"

namespace meshlearn::net {

// ---- Messages --------------------------------------------------------------------------------

Bytes EncodeManifestRequest(const ManifestRequest& m) {
  Encoder e;
  e.PutHash(m.id.hash);
  return e.Take();
}

Result<ManifestRequest> DecodeManifestRequest(ByteSpan wire) {
  Decoder d(wire, "blob.manifest request");
  ManifestRequest m;
  ML_RETURN_IF_ERROR(d.GetHash(&m.id.hash, "id"));
  ML_RETURN_IF_ERROR(d.Finish());
  return m;
}

Bytes EncodeChunkRequest(const ChunkRequest& m) {
  Encoder e;
  e.PutHash(m.hash).PutBool(m.accept_zstd);
  return e.Take();
}

Result<ChunkRequest> DecodeChunkRequest(ByteSpan wire) {
  Decoder d(wire, "blob.chunk request");
  ChunkRequest m;
  ML_RETURN_IF_ERROR(d.GetHash(&m.hash, "hash"));
  ML_RETURN_IF_ERROR(d.GetBool(&m.accept_zstd, "accept_zstd"));
  ML_RETURN_IF_ERROR(d.Finish());
  return m;
}

Bytes EncodeChunkResponse(const ChunkResponse& m) {
  Encoder e;
  e.PutU8(static_cast<uint8_t>(m.encoding)).PutU32(m.raw_size).PutBytes(m.payload);
  return e.Take();
}

Result<ChunkResponse> DecodeChunkResponse(ByteSpan wire) {
  Decoder d(wire, "blob.chunk response");
  ChunkResponse m;
  uint8_t enc = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&enc, "encoding"));
  if (enc > static_cast<uint8_t>(ChunkEncoding::kChunkEncodingZstd)) {
    return InvalidArgument("blob.chunk response: unknown encoding " + std::to_string(enc));
  }
  m.encoding = static_cast<ChunkEncoding>(enc);
  ML_RETURN_IF_ERROR(d.GetU32(&m.raw_size, "raw_size"));
  if (m.raw_size > kMaxChunkSize) {
    return ResourceExhausted("blob.chunk response: raw_size " + std::to_string(m.raw_size) +
                             " exceeds the chunk limit of " + std::to_string(kMaxChunkSize));
  }
  ML_RETURN_IF_ERROR(d.GetBytes(&m.payload, "payload", kMaxChunkResponseBytes));
  ML_RETURN_IF_ERROR(d.Finish());
  return m;
}

Bytes ZstdCompress(ByteSpan data, int level) {
  Bytes out(ZSTD_compressBound(data.size()));
  size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  CHECK(!ZSTD_isError(n)) << "ZSTD_compress: " << ZSTD_getErrorName(n);
  out.resize(n);
  return out;
}

Result<Bytes> ZstdDecompress(ByteSpan data, size_t max_size) {
  // Streaming into a buffer of exactly max_size (+1 to tell "exactly full" from "more to come"):
  // the declared frame size is not trusted, and a bomb stops at the limit.
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  CHECK(ctx != nullptr);
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax, 23);  // bound decoder memory (8 MiB)
  Bytes out(std::min<size_t>(max_size, 1u << 20) + 1);
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  while (true) {
    size_t r = ZSTD_decompressStream(ctx.get(), &ob, &in);
    if (ZSTD_isError(r)) {
      return InvalidArgument(std::string("zstd: corrupt data: ") + ZSTD_getErrorName(r));
    }
    if (ob.pos > max_size) {
      return ResourceExhausted("zstd: data decompresses to more than the limit of " +
                               std::to_string(max_size) + " bytes");
    }
    if (r == 0 && in.pos == in.size) break;  // frame complete, input consumed
    if (ob.pos == ob.size) {                 // grow, but never past max_size + 1
      size_t grow = std::min(out.size() * 2, max_size + 1);
      out.resize(grow);
      ob.dst = out.data();
      ob.size = out.size();
      continue;
    }
    if (in.pos == in.size) return InvalidArgument("zstd: truncated data");
  }
  out.resize(ob.pos);
  return out;
}

Result<Bytes> DecodeChunkPayload(const ChunkResponse& m, size_t max_size) {
  if (m.raw_size > max_size) {
    return ResourceExhausted("chunk of " + std::to_string(m.raw_size) +
                             " bytes exceeds the expected size limit of " +
                             std::to_string(max_size));
  }
  Bytes data;
  if (m.encoding == ChunkEncoding::kChunkEncodingZstd) {
    ML_ASSIGN_OR_RETURN(data, ZstdDecompress(m.payload, max_size));
  } else {
    if (m.payload.size() > max_size) {
      return ResourceExhausted("chunk of " + std::to_string(m.payload.size()) +
                               " bytes exceeds the expected " + std::to_string(max_size));
    }
    data = m.payload;
  }
  if (data.size() != m.raw_size) {
    return InvalidArgument("chunk decodes to " + std::to_string(data.size()) +
                           " bytes but raw_size says " + std::to_string(m.raw_size));
  }
  return data;
}

// ---- Serving ---------------------------------------------------------------------------------

BlobService::BlobService(BlobStore* store, BlobServiceOptions options)
    : store_(store), options_(options) {}

void BlobService::Register(Router* router) {
  router->Register(
      kMethodBlobManifest, [this](const Request& r) { return HandleManifest(r); }, 64);
  router->Register(
      kMethodBlobChunk, [this](const Request& r) { return HandleChunk(r); }, 64);
}

Result<Bytes> BlobService::HandleManifest(const Request& request) {
  ML_ASSIGN_OR_RETURN(ManifestRequest req, DecodeManifestRequest(request.body));
  return store_->GetManifestBytes(req.id);
}

Result<Bytes> BlobService::HandleChunk(const Request& request) {
  ML_ASSIGN_OR_RETURN(ChunkRequest req, DecodeChunkRequest(request.body));
  ML_ASSIGN_OR_RETURN(Bytes data, store_->GetChunk(req.hash));
  ChunkResponse resp;
  resp.raw_size = static_cast<uint32_t>(data.size());
  if (options_.compress && req.accept_zstd) {
    Bytes z = ZstdCompress(data, options_.zstd_level);
    if (z.size() < data.size()) {
      resp.encoding = ChunkEncoding::kChunkEncodingZstd;
      resp.payload = std::move(z);
    }
  }
  if (resp.encoding == ChunkEncoding::kChunkEncodingRaw) resp.payload = std::move(data);
  return EncodeChunkResponse(resp);
}

// ---- Fetching --------------------------------------------------------------------------------

namespace {

// Requests of one chunk that may fail (time out, be refused) before the fetch gives up.
constexpr int kMaxAttemptsPerChunk = 8;
// Passes over the provider list looking for a manifest.
constexpr int kManifestRounds = 3;

// One fetch in progress. Every callback holds a shared_ptr to it.
class FetchJob : public std::enable_shared_from_this<FetchJob> {
 public:
  FetchJob(Transport* transport, BlobStore* store, const FetchOptions& options, BlobId id,
           std::vector<std::string> providers, Fetcher::DoneCallback done)
      : transport_(transport), store_(store), options_(options), id_(id), done_(std::move(done)) {
    for (std::string& p : providers) {
      bool dup = false;
      for (const Provider& q : providers_) dup = dup || q.endpoint == p;
      if (!dup) providers_.push_back(Provider{std::move(p)});
    }
  }

  void Start() {
    store_->Hold(id_);
    Result<Manifest> m = store_->GetManifest(id_);
    if (m.ok()) {
      StartChunks(std::move(*m));
      return;
    }
    RequestManifest(0);
  }

 private:
  struct Provider {
    std::string endpoint;
    size_t in_flight = 0;
    int consecutive_failures = 0;
    bool dropped = false;
    bool lacks_manifest = false;  // answered NotFound to the manifest request
  };
  struct Send {
    size_t chunk;
    size_t provider;
  };

  // ---- manifest phase: one provider at a time, in order; providers that failed for a transient
  // reason (timeout, broken connection) get up to kManifestRounds tries in all.
  void RequestManifest(size_t from) {
    size_t i = from;
    while (true) {
      while (i < providers_.size() && (providers_[i].dropped || providers_[i].lacks_manifest)) ++i;
      if (i < providers_.size() || ++manifest_round_ >= kManifestRounds) break;
      i = 0;  // another round over the providers that may still answer
      bool any = false;
      for (const Provider& p : providers_) any = any || !(p.dropped || p.lacks_manifest);
      if (!any) {
        i = providers_.size();
        break;
      }
    }
    if (i >= providers_.size()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Fail(Unavailable("blob " + id_.ShortHex() + ": no provider gave a valid manifest" +
                         ErrorSummaryLocked()));
        MaybeFinishLocked();
      }
      FinishIfDecided();
      return;
    }
    Request req{kMethodBlobManifest, EncodeManifestRequest({id_}), options_.request_timeout_ms,
                kMaxManifestBytes};
    auto self = shared_from_this();
    transport_->SendAsync(providers_[i].endpoint, std::move(req),
                          [self, i](Result<Bytes> r) { self->OnManifest(i, std::move(r)); });
  }

  void OnManifest(size_t i, Result<Bytes> r) {
    Result<Manifest> m = r.ok() ? DecodeManifest(*r, &id_) : Result<Manifest>(r.status());
    if (!m.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.failed_requests;
        // A provider that does not have the blob is not lying; one that sent junk is.
        bool liar = r.ok();
        NoteErrorLocked(i, m.status(), liar ? "sent a bad manifest: " : "manifest: ");
        if (liar) DropLocked(i, "sent a bad manifest: " + m.status().message());
        if (m.status().code() == StatusCode::kNotFound) providers_[i].lacks_manifest = true;
      }
      RequestManifest(i + 1);
      return;
    }
    Status s;
    if (m->total_size > options_.max_blob_bytes) {
      s = ResourceExhausted("blob " + id_.ShortHex() + " is " + std::to_string(m->total_size) +
                            " bytes, over the limit of " + std::to_string(options_.max_blob_bytes));
    } else {
      s = store_->PutManifest(*m).WithPrefix("blob " + id_.ShortHex());
    }
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Fail(s);
        MaybeFinishLocked();
      }
      FinishIfDecided();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.manifest_fetched = true;
    }
    StartChunks(std::move(*m));
  }

  // ---- chunk phase
  void StartChunks(Manifest m) {
    manifest_ = std::move(m);  // immutable from here on; read without the lock
    Result<std::vector<size_t>> missing = store_->MissingChunks(id_);
    std::vector<Send> sends;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!missing.ok()) {
        Fail(missing.status());
      } else {
        stats_.total_chunks = manifest_.chunk_count();
        stats_.chunks_already_present = manifest_.chunk_count() - missing->size();
        queue_.assign(missing->begin(), missing->end());
        lacks_.assign(manifest_.chunk_count(), {});
        last_failed_.assign(manifest_.chunk_count(), SIZE_MAX);
        attempts_.assign(manifest_.chunk_count(), 0);
      }
      sends = PumpLocked();
    }
    Issue(sends);
    FinishIfDecided();
  }

  // Picks (chunk, provider) pairs to send now. Finishes the fetch when nothing is left to do.
  std::vector<Send> PumpLocked() {
    std::vector<Send> sends;
    while (status_.ok() && in_flight_ < options_.max_in_flight && !queue_.empty()) {
      size_t chunk = queue_.front();
      // Least loaded provider that can serve this chunk, avoiding the one that just failed it
      // when there is another; earlier providers win ties, but rotating the start spreads
      // chunks evenly.
      if (attempts_[chunk] >= kMaxAttemptsPerChunk) {
        Fail(Unavailable("blob " + id_.ShortHex() + ": chunk " + std::to_string(chunk) +
                         " failed " + std::to_string(attempts_[chunk]) + " times" +
                         ErrorSummaryLocked()));
        break;
      }
      size_t best = providers_.size();
      bool best_avoided = false;
      bool any_eligible = false;
      for (size_t k = 0; k < providers_.size(); ++k) {
        size_t p = (rotate_ + k) % providers_.size();
        const Provider& pr = providers_[p];
        if (pr.dropped || lacks_[chunk].count(p)) continue;
        any_eligible = true;
        if (pr.in_flight >= options_.max_in_flight_per_provider) continue;
        bool avoided = last_failed_[chunk] == p;
        if (best == providers_.size() || (best_avoided && !avoided) ||
            (best_avoided == avoided && pr.in_flight < providers_[best].in_flight)) {
          best = p;
          best_avoided = avoided;
        }
      }
      if (!any_eligible) {
        Fail(Unavailable("blob " + id_.ShortHex() + ": chunk " + std::to_string(chunk) +
                         " could not be fetched from any provider" + ErrorSummaryLocked()));
        break;
      }
      if (best == providers_.size()) break;  // all eligible providers busy: wait for answers
      queue_.pop_front();
      rotate_ = (best + 1) % providers_.size();
      ++providers_[best].in_flight;
      ++in_flight_;
      ++attempts_[chunk];
      sends.push_back({chunk, best});
    }
    MaybeFinishLocked();
    return sends;
  }

  void Issue(const std::vector<Send>& sends) {
    auto self = shared_from_this();
    for (const Send& s : sends) {
      Request req{kMethodBlobChunk,
                  EncodeChunkRequest({manifest_.chunks[s.chunk], options_.accept_zstd}),
                  options_.request_timeout_ms, kMaxChunkResponseBytes};
      transport_->SendAsync(providers_[s.provider].endpoint, std::move(req),
                            [self, s](Result<Bytes> r) { self->OnChunk(s, std::move(r)); });
    }
  }

  void OnChunk(Send s, Result<Bytes> r) {
    // Decode, decompress and verify outside the lock: HTTP callbacks run in parallel.
    Status bad;     // the provider lied
    Status failed;  // the request failed
    Result<Bytes> data = Status(StatusCode::kInternal, "unset");
    uint64_t wire = 0;
    if (!r.ok()) {
      failed = r.status();
    } else {
      Result<ChunkResponse> resp = DecodeChunkResponse(*r);
      if (!resp.ok()) {
        bad = resp.status();
      } else {
        wire = resp->payload.size();
        uint32_t want = manifest_.ChunkLength(s.chunk);
        data = DecodeChunkPayload(*resp, want);
        if (!data.ok()) {
          bad = data.status();
        } else if (data->size() != want) {
          bad =
              InvalidArgument("chunk " + std::to_string(s.chunk) + ": expected " +
                              std::to_string(want) + " bytes, got " + std::to_string(data->size()));
        }
      }
    }
    Status stored;
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = !status_.ok();
    }
    if (!aborted && failed.ok() && bad.ok()) {
      // PutChunk checks the bytes against the manifest's hash (hashing once, not twice).
      stored = store_->PutChunk(manifest_.chunks[s.chunk], *data);
      if (stored.code() == StatusCode::kInvalidArgument)
        bad = stored.WithPrefix("chunk " + std::to_string(s.chunk));
    }

    std::vector<Send> sends;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
      Provider& pr = providers_[s.provider];
      --pr.in_flight;
      if (!failed.ok()) {
        ++stats_.failed_requests;
        NoteErrorLocked(s.provider, failed, "");
        queue_.push_back(s.chunk);
        if (failed.code() == StatusCode::kNotFound) {
          lacks_[s.chunk].insert(s.provider);  // it does not have the chunk; do not ask again
          --attempts_[s.chunk];
        } else {
          last_failed_[s.chunk] = s.provider;
          ++pr.consecutive_failures;
        }
        if (pr.consecutive_failures >= options_.max_consecutive_failures) {
          DropLocked(s.provider, std::to_string(pr.consecutive_failures) +
                                     " failures in a row, last: " + failed.message());
        }
      } else if (!bad.ok()) {
        ++stats_.failed_requests;
        NoteErrorLocked(s.provider, bad, "sent a bad chunk: ");
        DropLocked(s.provider,
                   "sent a bad chunk " + std::to_string(s.chunk) + ": " + bad.message());
        queue_.push_back(s.chunk);
      } else if (!stored.ok()) {  // the store refused good data: quota or disk
        Fail(stored.WithPrefix("blob " + id_.ShortHex() + ": storing chunk " +
                               std::to_string(s.chunk)));
      } else if (!aborted) {
        pr.consecutive_failures = 0;
        ++stats_.chunks_fetched;
        stats_.wire_bytes += wire;
        stats_.raw_bytes += data->size();
        ++stats_.chunks_by_provider[pr.endpoint];
      }
      sends = PumpLocked();
    }
    Issue(sends);
    FinishIfDecided();
  }

  void NoteErrorLocked(size_t p, const Status& s, const std::string& what) {
    std::string& e = last_error_[providers_[p].endpoint];
    e = what + s.ToString();
  }

  void DropLocked(size_t p, const std::string& why) {
    if (providers_[p].dropped) return;
    providers_[p].dropped = true;
    stats_.dropped_providers[providers_[p].endpoint] = why;
    ML_LOG_WARN("fetch {}: dropping provider {}: {}", id_.ShortHex(), providers_[p].endpoint, why);
  }

  std::string ErrorSummaryLocked() const {
    if (providers_.empty()) return " (no providers given)";
    std::string out;
    for (const Provider& p : providers_) {
      auto it = last_error_.find(p.endpoint);
      out += "; " + p.endpoint + ": " + (it == last_error_.end() ? "not asked" : it->second);
    }
    return out;
  }

  void Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

  // Decides whether the fetch is over: nothing in flight and either everything arrived or the
  // fetch failed. The caller then runs FinishIfDecided() after releasing mu_.
  void MaybeFinishLocked() {
    if (decided_ || in_flight_ > 0) return;
    if (status_.ok() && !queue_.empty()) return;
    decided_ = true;
  }

  // Runs `done` exactly once, without holding mu_ (the callback may do anything).
  void FinishIfDecided() {
    Status s;
    FetchStats st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!decided_ || finished_) return;
      finished_ = true;
      s = status_;
      st = stats_;
    }
    if (s.ok() && !store_->HasBlob(id_)) {
      // A chunk shared with an evictable blob was evicted under us, or was corrupt on disk.
      s = DataLoss("blob " + id_.ShortHex() + ": chunks vanished from the store during the fetch");
    }
    if (s.ok() && options_.pin) s = store_->Pin(id_);
    store_->Release(id_);
    done_(s, st);
  }

  Transport* const transport_;
  BlobStore* const store_;
  const FetchOptions options_;
  const BlobId id_;
  Fetcher::DoneCallback done_;
  std::vector<Provider> providers_;
  Manifest manifest_;

  std::mutex mu_;
  Status status_;
  FetchStats stats_;
  std::deque<size_t> queue_;
  std::vector<std::set<size_t>> lacks_;  // per chunk: providers that answered NotFound
  std::vector<size_t> last_failed_;      // per chunk: provider whose request last failed
  std::vector<int> attempts_;            // per chunk: requests that failed or are in flight
  std::map<std::string, std::string> last_error_;
  size_t in_flight_ = 0;
  size_t rotate_ = 0;
  int manifest_round_ = 0;
  bool decided_ = false;
  bool finished_ = false;
};

}  // namespace

Fetcher::Fetcher(Transport* transport, BlobStore* store, FetchOptions options)
    : transport_(transport), store_(store), options_(options) {
  CHECK_GT(options_.max_in_flight, 0u);
  CHECK_GT(options_.max_in_flight_per_provider, 0u);
}

void Fetcher::FetchAsync(const BlobId& id, std::vector<std::string> providers, DoneCallback done) {
  auto job = std::make_shared<FetchJob>(transport_, store_, options_, id, std::move(providers),
                                        std::move(done));
  job->Start();
}

Result<FetchStats> Fetcher::Fetch(const BlobId& id, std::vector<std::string> providers) {
  struct Slot {
    std::mutex mu;
    bool done = false;
    Status status;
    FetchStats stats;
  };
  auto slot = std::make_shared<Slot>();
  FetchAsync(id, std::move(providers), [slot](const Status& s, const FetchStats& st) {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->done = true;
    slot->status = s;
    slot->stats = st;
  });
  transport_->WaitUntil([&] {
    std::lock_guard<std::mutex> lock(slot->mu);
    return slot->done;
  });
  std::lock_guard<std::mutex> lock(slot->mu);
  if (!slot->done) return Unavailable("fetch of blob " + id.ShortHex() + " never completed");
  if (!slot->status.ok()) return slot->status;
  return slot->stats;
}

}  // namespace meshlearn::net
