#include "meshlearn/ledger/rate_limit.h"

#include <gtest/gtest.h>

#include "meshlearn/ledger/rpc_server.h"

namespace meshlearn::ledger {
namespace {

TEST(RateLimiter, BurstThenSustainedRate) {
  RateLimiter l({.rate_per_second = 10, .burst = 5, .max_clients = 100});
  int64_t t = 1'000'000;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l.Allow("a", t)) << i;
  EXPECT_FALSE(l.Allow("a", t));
  // 100 ms later exactly one token came back.
  t += 100'000;
  EXPECT_TRUE(l.Allow("a", t));
  EXPECT_FALSE(l.Allow("a", t));
  // A long idle refills up to the burst, not beyond.
  t += 60'000'000;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l.Allow("a", t));
  EXPECT_FALSE(l.Allow("a", t));
}

TEST(RateLimiter, ClientsAreIndependent) {
  RateLimiter l({.rate_per_second = 1, .burst = 1, .max_clients = 100});
  EXPECT_TRUE(l.Allow("a", 0));
  EXPECT_FALSE(l.Allow("a", 0));
  EXPECT_TRUE(l.Allow("b", 0));
}

TEST(RateLimiter, TableIsBoundedAndIdleClientsAreForgotten) {
  RateLimiter l({.rate_per_second = 1, .burst = 1, .max_clients = 2});
  EXPECT_TRUE(l.Allow("a", 0));
  EXPECT_TRUE(l.Allow("b", 0));
  EXPECT_TRUE(l.Allow("c", 0));  // evicts one of the two (neither is idle: the oldest)
  EXPECT_TRUE(l.Allow("d", 10'000'000));  // a, b, c idle now
}

TEST(RateLimiter, ZeroRateDisables) {
  RateLimiter l({.rate_per_second = 0, .burst = 1, .max_clients = 1});
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(l.Allow("a", 0));
}

TEST(ListenAddress, Parses) {
  auto ok = ParseListenAddress("127.0.0.1:7700");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->first, "127.0.0.1");
  EXPECT_EQ(ok->second, 7700);
  EXPECT_TRUE(ParseListenAddress("127.0.0.1:0").ok());
  for (const char* bad : {"127.0.0.1", ":80", "h:", "h:99999", "h:12x", "h:-1"}) {
    Result<std::pair<std::string, int>> r = ParseListenAddress(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("HOST:PORT"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace meshlearn::ledger
