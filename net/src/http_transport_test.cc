#include "meshlearn/net/http_transport.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>

#include "meshlearn/base/rng.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/net/blob_service.h"
#include "test_util.h"

namespace meshlearn::net {
namespace {

using test_util::RandomBytes;

TEST(HttpTransportTest, ParseHostPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(ParseHostPort("127.0.0.1:8080", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8080);
  ASSERT_TRUE(ParseHostPort("http://localhost:1", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  EXPECT_FALSE(ParseHostPort("127.0.0.1", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1:0", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1:70000", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort(":80", &host, &port).ok());
  EXPECT_FALSE(ParseHostPort("h:8x", &host, &port).ok());
}

TEST(HttpTransportTest, RequestsErrorsAndLimitsOnLoopback) {
  Router router;
  router.Register(
      "echo", [](const Request& r) -> Result<Bytes> { return r.body; }, 1000);
  router.Register(
      "big", [](const Request&) -> Result<Bytes> { return Bytes(100'000, 7); }, 10);
  router.Register(
      "deny", [](const Request&) -> Result<Bytes> { return PermissionDenied("bad signature"); },
      10);
  HttpServer server(&router);
  Result<uint16_t> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_GT(*port, 0);
  HttpTransport client({.threads = 2});
  std::string ep = server.endpoint();

  Result<Bytes> r = client.Send(ep, Request{"echo", ToBytes("hello")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(AsStringView(*r), "hello");

  Result<Bytes> d = client.Send(ep, Request{"deny", {}});
  EXPECT_EQ(d.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(d.status().message().find("bad signature"), std::string::npos);
  EXPECT_EQ(client.Send(ep, Request{"nosuch", {}}).status().code(), StatusCode::kNotFound);
  // Over the method's limit but under the server's: refused by the router.
  EXPECT_EQ(client.Send(ep, Request{"big", Bytes(100, 0)}).status().code(),
            StatusCode::kResourceExhausted);
  // Over every limit: refused by the server before it reads the body.
  EXPECT_EQ(client.Send(ep, Request{"echo", Bytes(5000, 0)}).status().code(),
            StatusCode::kResourceExhausted);
  Request capped{"big", {}};
  capped.max_response_bytes = 1000;
  EXPECT_EQ(client.Send(ep, capped).status().code(), StatusCode::kResourceExhausted);
  // The connection is still usable afterwards.
  EXPECT_TRUE(client.Send(ep, Request{"big", {}}).ok());

  server.Stop();
  Request q{"echo", {}};
  q.timeout_ms = 2000;
  EXPECT_EQ(client.Send(ep, q).status().code(), StatusCode::kUnavailable);
}

TEST(HttpTransportTest, ConcurrentAsyncRequests) {
  Router router;
  router.Register(
      "echo", [](const Request& r) -> Result<Bytes> { return r.body; }, 1000);
  HttpServer server(&router);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  HttpTransport client({.threads = 4});
  std::atomic<int> ok{0};
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i) {
    Bytes body = ToBytes(std::to_string(i));
    client.SendAsync(server.endpoint(), Request{"echo", body}, [&, body](Result<Bytes> r) {
      if (r.ok() && *r == body) ++ok;
      ++done;
    });
  }
  client.WaitUntil([&] { return done.load() == 50; });
  EXPECT_EQ(ok.load(), 50);
}

// Two real providers on loopback, each with an on-disk store, and a fetcher with its own store.
TEST(HttpTransportTest, FetchBlobFromTwoProviders) {
  const std::string dir = TestDir("net");
  Bytes data = RandomBytes(5 * kDefaultChunkSize + 1000, 3);
  struct Provider {
    std::unique_ptr<BlobStore> store;
    std::unique_ptr<BlobService> service;
    Router router;
    std::unique_ptr<HttpServer> server;
  };
  Provider p[2];
  BlobId id;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 2; ++i) {
    p[i].store = std::move(*BlobStore::Open(Env::Default(), dir + "/p" + std::to_string(i)));
    id = *p[i].store->Put(data);
    p[i].service = std::make_unique<BlobService>(p[i].store.get());
    p[i].service->Register(&p[i].router);
    p[i].server = std::make_unique<HttpServer>(&p[i].router);
    ASSERT_TRUE(p[i].server->Start("127.0.0.1", 0).ok());
    endpoints.push_back(p[i].server->endpoint());
  }
  auto mine = std::move(*BlobStore::Open(Env::Default(), dir + "/me"));
  HttpTransport client;
  Fetcher fetcher(&client, mine.get(), {.max_in_flight_per_provider = 2});
  Result<FetchStats> st = fetcher.Fetch(id, endpoints);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->chunks_fetched, 6u);
  EXPECT_EQ(st->chunks_by_provider.size(), 2u);  // both were used
  EXPECT_EQ(*mine->Get(id), data);

  // A provider that went away: the other one serves everything.
  BlobId id2 = *p[1].store->Put(RandomBytes(3 * kDefaultChunkSize, 4));
  ASSERT_TRUE(p[0].store->Put(RandomBytes(3 * kDefaultChunkSize, 4)).ok());
  p[0].server->Stop();
  Result<FetchStats> st2 = fetcher.Fetch(id2, endpoints);
  ASSERT_TRUE(st2.ok()) << st2.status().ToString();
  EXPECT_EQ(st2->chunks_by_provider.count(endpoints[0]), 0u);
  EXPECT_TRUE(mine->HasBlob(id2));
}

// Over real sockets too, a provider that lies is refused and the blob comes from the honest one.
TEST(HttpTransportTest, LyingProviderOverHttpIsRefused) {
  const std::string dir = TestDir("net");
  Bytes data = RandomBytes(3 * 4096 + 10, 5);
  auto good_store = std::move(*BlobStore::Open(Env::Default(), dir + "/good"));
  BlobId id = *good_store->Put(data, 4096);
  BlobService good_service(good_store.get());
  Router good_router;
  good_service.Register(&good_router);
  HttpServer good(&good_router);
  ASSERT_TRUE(good.Start("127.0.0.1", 0).ok());

  Router liar_router;
  Manifest real = *good_store->GetManifest(id);
  liar_router.Register(
      kMethodBlobManifest, [&](const Request&) -> Result<Bytes> { return EncodeManifest(real); },
      64);
  liar_router.Register(
      kMethodBlobChunk,
      [](const Request&) -> Result<Bytes> {
        ChunkResponse bomb{ChunkEncoding::kChunkEncodingZstd, 4096,
                           ZstdCompress(Bytes(16u << 20, 0), 1)};
        return EncodeChunkResponse(bomb);
      },
      64);
  HttpServer liar(&liar_router);
  ASSERT_TRUE(liar.Start("127.0.0.1", 0).ok());

  auto mine = std::move(*BlobStore::Open(Env::Default(), dir + "/me"));
  HttpTransport client;
  Fetcher fetcher(&client, mine.get());
  Result<FetchStats> st = fetcher.Fetch(id, {liar.endpoint(), good.endpoint()});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->dropped_providers.count(liar.endpoint()), 1u);
  EXPECT_EQ(st->chunks_by_provider.count(liar.endpoint()), 0u);
  EXPECT_EQ(*mine->Get(id), data);
}

}  // namespace
}  // namespace meshlearn::net
