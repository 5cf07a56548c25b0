#include "meshlearn/net/blob_service.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "meshlearn/base/rng.h"
#include "meshlearn/net/sim_transport.h"
#include "test_util.h"

namespace meshlearn::net {
namespace {

using test_util::kTestChunk;
using test_util::RandomBytes;

// One simulated node with its own in-memory disk, store and blob service.
struct Peer {
  Peer(SimNetwork* net, const std::string& name, uint64_t quota = 0) {
    store = std::move(*BlobStore::Open(&env, "/blobs", {.quota_bytes = quota}));
    service = std::make_unique<BlobService>(store.get());
    service->Register(&router);
    node = net->AddNode(name);
    node->Serve(&router);
  }
  MemEnv env;
  std::unique_ptr<BlobStore> store;
  std::unique_ptr<BlobService> service;
  Router router;
  SimNode* node = nullptr;
};

// A provider that answers with whatever the test tells it to.
struct Liar {
  Liar(SimNetwork* net, const std::string& name) {
    router.Register(
        kMethodBlobManifest, [this](const Request&) { return manifest(); }, 64);
    router.Register(
        kMethodBlobChunk, [this](const Request& r) { return chunk(r); }, 64);
    net->AddNode(name)->Serve(&router);
  }
  std::function<Result<Bytes>()> manifest = [] { return Result<Bytes>(NotFound("no")); };
  std::function<Result<Bytes>(const Request&)> chunk = [](const Request&) {
    return Result<Bytes>(NotFound("no"));
  };
  Router router;
};

class BlobFetchTest : public ::testing::Test {
 protected:
  BlobFetchTest() : net_(7, LinkParams{.latency_us = 500, .bandwidth_bytes_per_sec = 50e6}) {}

  BlobId Seed(Peer* p) {
    Result<BlobId> id = p->store->Put(data_, kTestChunk);
    CHECK(id.ok()) << id.status().ToString();
    return *id;
  }

  SimNetwork net_;
  Bytes data_ = RandomBytes(40 * kTestChunk + 123, 99);
  Manifest manifest_ = BuildManifest(data_, kTestChunk);
};

TEST_F(BlobFetchTest, FromThreeProvidersInParallel) {
  Peer p1(&net_, "p1"), p2(&net_, "p2"), p3(&net_, "p3"), me(&net_, "me");
  BlobId id = Seed(&p1);
  Seed(&p2);
  Seed(&p3);
  Fetcher fetcher(me.node->transport(), me.store.get(), {.pin = true});
  Result<FetchStats> st = fetcher.Fetch(id, {"p1", "p2", "p3"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*me.store->Get(id), data_);
  EXPECT_TRUE(me.store->IsPinned(id));
  EXPECT_EQ(st->total_chunks, 41u);
  EXPECT_EQ(st->chunks_fetched, 41u);
  EXPECT_TRUE(st->manifest_fetched);
  ASSERT_EQ(st->chunks_by_provider.size(), 3u);
  for (const auto& [p, n] : st->chunks_by_provider) EXPECT_GE(n, 10u) << p;
  EXPECT_TRUE(st->dropped_providers.empty());
}

TEST_F(BlobFetchTest, CompressesOnTheWire) {
  Peer p1(&net_, "p1"), me(&net_, "me");
  data_ = Bytes(20 * kTestChunk, 0);
  for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<uint8_t>(i / 512);
  BlobId id = Seed(&p1);
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"p1"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->raw_bytes, data_.size());
  EXPECT_LT(st->wire_bytes * 10, st->raw_bytes);
  EXPECT_EQ(*me.store->Get(id), data_);
}

TEST_F(BlobFetchTest, LyingProviderWrongChunkBytesIsDropped) {
  Liar liar(&net_, "liar");
  Peer good(&net_, "good"), me(&net_, "me");
  BlobId id = Seed(&good);
  liar.manifest = [&] { return Result<Bytes>(EncodeManifest(manifest_)); };
  liar.chunk = [&](const Request& r) {
    ChunkRequest q = *DecodeChunkRequest(r.body);
    ChunkResponse resp;
    resp.payload = RandomBytes(kTestChunk, q.hash.bytes[0]);  // right size, wrong bytes
    resp.raw_size = kTestChunk;
    return Result<Bytes>(EncodeChunkResponse(resp));
  };
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"liar", "good"});  // the liar is asked first
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*me.store->Get(id), data_);
  ASSERT_EQ(st->dropped_providers.count("liar"), 1u);
  EXPECT_NE(st->dropped_providers["liar"].find("bad chunk"), std::string::npos);
  EXPECT_EQ(st->chunks_by_provider.count("liar"), 0u);
  EXPECT_EQ(st->chunks_by_provider["good"], 41u);
}

TEST_F(BlobFetchTest, LyingProviderBadManifestIsRefused) {
  Liar forger(&net_, "forger"), junk(&net_, "junk");
  Peer good(&net_, "good"), me(&net_, "me");
  BlobId id = Seed(&good);
  Manifest other = BuildManifest(RandomBytes(3 * kTestChunk, 5), kTestChunk);
  forger.manifest = [&] { return Result<Bytes>(EncodeManifest(other)); };  // valid, wrong blob
  junk.manifest = [&] { return Result<Bytes>(ToBytes("definitely not a manifest")); };
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"forger", "junk", "good"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(*me.store->Get(id), data_);
  EXPECT_EQ(st->dropped_providers.count("forger"), 1u);
  EXPECT_EQ(st->dropped_providers.count("junk"), 1u);
  EXPECT_FALSE(me.store->HasManifest(other.id()));
}

TEST_F(BlobFetchTest, FlakyProviderIsAskedAgain) {
  Liar flaky(&net_, "flaky");
  Peer backing(&net_, "backing"), me(&net_, "me");
  BlobId id = Seed(&backing);
  int manifest_calls = 0, chunk_calls = 0;
  flaky.manifest = [&] {
    if (manifest_calls++ == 0) return Result<Bytes>(Unavailable("busy, try later"));
    return backing.store->GetManifestBytes(id);
  };
  flaky.chunk = [&](const Request& r) {
    if (chunk_calls++ % 3 == 0) return Result<Bytes>(Unavailable("busy, try later"));
    return backing.service->HandleChunk(r);
  };
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"flaky"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(manifest_calls, 2);
  EXPECT_GT(st->failed_requests, 10u);
  EXPECT_EQ(*me.store->Get(id), data_);
}

TEST_F(BlobFetchTest, OnlyLiarsFailsCleanlyAndStoresNothingBad) {
  Liar liar(&net_, "liar");
  Peer me(&net_, "me");
  BlobId id = manifest_.id();
  liar.manifest = [&] { return Result<Bytes>(EncodeManifest(manifest_)); };
  liar.chunk = [&](const Request&) {
    return Result<Bytes>(
        EncodeChunkResponse({ChunkEncoding::kChunkEncodingRaw, 3, ToBytes("bad")}));
  };
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"liar"});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(st.status().message().find("liar"), std::string::npos) << st.status().ToString();
  EXPECT_EQ(me.store->stats().chunk_files, 0u);
  EXPECT_FALSE(me.store->HasBlob(id));
}

TEST_F(BlobFetchTest, ZstdBombIsRefusedBySizeLimit) {
  Liar bomber(&net_, "bomber");
  Peer good(&net_, "good"), me(&net_, "me");
  BlobId id = Seed(&good);
  Bytes bomb = ZstdCompress(Bytes(64u << 20, 0), 3);  // 64 MiB of zeros in a few KiB
  ASSERT_LT(bomb.size(), 64u << 10);
  bomber.manifest = [&] { return Result<Bytes>(EncodeManifest(manifest_)); };
  bomber.chunk = [&](const Request&) {
    return Result<Bytes>(EncodeChunkResponse({ChunkEncoding::kChunkEncodingZstd, kTestChunk, bomb}));
  };
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"bomber", "good"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->dropped_providers.count("bomber"), 1u);
  EXPECT_NE(st->dropped_providers["bomber"].find("limit"), std::string::npos)
      << st->dropped_providers["bomber"];
  EXPECT_EQ(*me.store->Get(id), data_);
}

TEST(ZstdTest, DecompressLimits) {
  Bytes data = RandomBytes(10'000, 1);
  Bytes z = ZstdCompress(data, 3);
  EXPECT_EQ(*ZstdDecompress(z, 10'000), data);
  EXPECT_EQ(ZstdDecompress(z, 9'999).status().code(), StatusCode::kResourceExhausted);
  Bytes zeros = ZstdCompress(Bytes(3u << 20, 0), 1);
  EXPECT_EQ(ZstdDecompress(zeros, 1u << 20).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ZstdDecompress(zeros, 3u << 20)->size(), 3u << 20);
  Bytes cut(z.begin(), z.begin() + z.size() / 2);
  EXPECT_FALSE(ZstdDecompress(cut, 10'000).ok());
  EXPECT_FALSE(ZstdDecompress(ToBytes("not zstd at all"), 10'000).ok());
}

TEST(BlobMessagesTest, MalformedMessagesAreRefused) {
  ChunkRequest q{Blake2b("x"), true};
  Bytes w = EncodeChunkRequest(q);
  EXPECT_TRUE(DecodeChunkRequest(w).ok());
  w.push_back(0);
  EXPECT_FALSE(DecodeChunkRequest(w).ok());  // trailing byte
  w.pop_back();
  w.back() = 2;  // a bool that is neither 0 nor 1
  EXPECT_FALSE(DecodeChunkRequest(w).ok());
  EXPECT_FALSE(DecodeManifestRequest(Bytes(31, 0)).ok());

  ChunkResponse r{ChunkEncoding::kChunkEncodingRaw, 3, ToBytes("abc")};
  Bytes rw = EncodeChunkResponse(r);
  EXPECT_TRUE(DecodeChunkResponse(rw).ok());
  rw[0] = 7;  // unknown encoding
  EXPECT_FALSE(DecodeChunkResponse(rw).ok());
  r.raw_size = kMaxChunkSize + 1;
  EXPECT_EQ(DecodeChunkResponse(EncodeChunkResponse(r)).status().code(),
            StatusCode::kResourceExhausted);
  r.raw_size = 4;  // disagrees with the payload
  EXPECT_FALSE(DecodeChunkPayload(r, 10).ok());
}

TEST_F(BlobFetchTest, ServiceRefusesMalformedRequestsAndChangesNothing) {
  Peer p(&net_, "p"), me(&net_, "me");
  Seed(&p);
  BlobStoreStats before = p.store->stats();
  Transport* t = me.node->transport();
  EXPECT_EQ(t->Send("p", Request{kMethodBlobChunk, ToBytes("short")}).status().code(),
            StatusCode::kDataLoss)
      << "truncated request";
  EXPECT_EQ(t->Send("p", Request{kMethodBlobManifest, Bytes(200, 0)}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t->Send("p", Request{kMethodBlobChunk, EncodeChunkRequest({Blake2b("?"), true})})
                .status()
                .code(),
            StatusCode::kNotFound);
  BlobStoreStats after = p.store->stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.chunk_files, before.chunk_files);
}

TEST_F(BlobFetchTest, ResumesAfterProviderDiesMidFetch) {
  Peer p1(&net_, "p1"), me(&net_, "me");
  BlobId id = Seed(&p1);
  net_.SetLink("p1", "me", LinkParams{.latency_us = 1000, .bandwidth_bytes_per_sec = 1e6});
  FetchOptions opts{.request_timeout_ms = 2000};
  Fetcher fetcher(me.node->transport(), me.store.get(), opts);
  // 41 chunks of 4 KiB at 1 MB/s take ~170 ms; kill the provider at 60 ms.
  net_.Schedule(60'000, [&] { net_.Kill("p1"); });
  Result<FetchStats> first = fetcher.Fetch(id, {"p1"});
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable) << first.status().ToString();
  size_t missing = me.store->MissingChunks(id)->size();
  EXPECT_GT(missing, 0u);
  EXPECT_LT(missing, 41u);

  net_.Restart("p1");
  Result<FetchStats> second = fetcher.Fetch(id, {"p1"});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->manifest_fetched);  // already on disk
  EXPECT_EQ(second->chunks_already_present, 41u - missing);
  EXPECT_EQ(second->chunks_fetched, missing);
  EXPECT_EQ(*me.store->Get(id), data_);
}

TEST_F(BlobFetchTest, PartitionedProviderIsRoutedAround) {
  Peer p1(&net_, "p1"), p2(&net_, "p2"), me(&net_, "me");
  BlobId id = Seed(&p1);
  Seed(&p2);
  Fetcher fetcher(me.node->transport(), me.store.get(), {.request_timeout_ms = 1000});
  net_.Partition({"me", "p2"});  // p1 is cut off
  Result<FetchStats> st = fetcher.Fetch(id, {"p1", "p2"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->chunks_by_provider.count("p1"), 0u);
  EXPECT_EQ(*me.store->Get(id), data_);

  Peer me2(&net_, "me2");  // outside the partition with p1 only
  Fetcher f2(me2.node->transport(), me2.store.get(), {.request_timeout_ms = 1000});
  net_.Partition({"me2"});
  EXPECT_FALSE(f2.Fetch(id, {"p1", "p2"}).ok());
  net_.Heal();
  EXPECT_TRUE(f2.Fetch(id, {"p1", "p2"}).ok());
}

TEST_F(BlobFetchTest, QuotaTooSmallFailsWithResourceExhausted) {
  Peer p1(&net_, "p1"), me(&net_, "me", /*quota=*/10 * kTestChunk);
  BlobId id = Seed(&p1);
  Fetcher fetcher(me.node->transport(), me.store.get());
  Result<FetchStats> st = fetcher.Fetch(id, {"p1"});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kResourceExhausted) << st.status().ToString();
}

TEST_F(BlobFetchTest, MaxBlobBytesRefusesLargeBlobs) {
  Peer p1(&net_, "p1"), me(&net_, "me");
  BlobId id = Seed(&p1);
  Fetcher fetcher(me.node->transport(), me.store.get(), {.max_blob_bytes = 1000});
  EXPECT_EQ(fetcher.Fetch(id, {"p1"}).status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(me.store->HasManifest(id));
}

// 50 nodes; one has the blob; the others fetch it at once from the seeder and a few random
// peers that may not have it yet. Returns a digest of the run.
std::string SwarmRun(uint64_t seed) {
  SimNetwork net(
      seed,
      LinkParams{
          .latency_us = 3000, .jitter_us = 2000, .bandwidth_bytes_per_sec = 20e6, .loss = 0.01});
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 50; ++i) {
    peers.push_back(std::make_unique<Peer>(&net, "n" + std::to_string(i)));
  }
  Bytes data = RandomBytes(16 * kTestChunk, seed);
  BlobId id = *peers[0]->store->Put(data, kTestChunk);
  Rng rng(seed);
  std::vector<std::unique_ptr<Fetcher>> fetchers;
  std::string digest;
  int ok = 0;
  for (int i = 1; i < 50; ++i) {
    std::vector<std::string> providers = {"n" + std::to_string(rng.Uniform(50)), "n0",
                                          "n" + std::to_string(rng.Uniform(50))};
    fetchers.push_back(std::make_unique<Fetcher>(peers[i]->node->transport(), peers[i]->store.get(),
                                                 FetchOptions{.request_timeout_ms = 500}));
    fetchers.back()->FetchAsync(id, providers, [&, i](const Status& s, const FetchStats& st) {
      ok += s.ok();
      digest += std::to_string(i) + ":" + std::to_string(net.NowMicros()) + ":" +
                std::to_string(st.chunks_fetched) + ":" + std::to_string(st.failed_requests) +
                (s.ok() ? "" : s.ToString()) + "\n";
    });
  }
  net.RunUntilIdle();
  EXPECT_EQ(ok, 49) << digest;
  for (int i = 1; i < 50; ++i) EXPECT_EQ(*peers[i]->store->Get(id), data) << i;
  return digest;
}

TEST(BlobSwarmTest, FiftyNodesDeterministic) {
  std::string a = SwarmRun(11);
  std::string b = SwarmRun(11);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, SwarmRun(12));
}

}  // namespace
}  // namespace meshlearn::net
