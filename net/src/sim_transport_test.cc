#include "meshlearn/net/sim_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

namespace meshlearn::net {
namespace {

Router EchoRouter() {
  Router r;
  r.Register(
      "echo", [](const Request& q) -> Result<Bytes> { return q.body; }, 1 << 20);
  r.Register(
      "big", [](const Request&) -> Result<Bytes> { return Bytes(10'000, 1); }, 16);
  r.Register(
      "fail", [](const Request&) -> Result<Bytes> { return PermissionDenied("nope"); }, 16);
  return r;
}

TEST(SimTransportTest, RequestResponseOnVirtualTime) {
  SimNetwork net(1, LinkParams{.latency_us = 1000, .bandwidth_bytes_per_sec = 0});
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  Result<Bytes> r = a->transport()->Send("b", Request{"echo", ToBytes("hello")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(AsStringView(*r), "hello");
  EXPECT_EQ(net.NowMicros(), 2000);  // one latency each way, infinite bandwidth
}

TEST(SimTransportTest, BandwidthSerializesMessages) {
  SimNetwork net(1, LinkParams{.latency_us = 0, .bandwidth_bytes_per_sec = 1e6});
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  int done = 0;
  // Two 100 KB requests: the second waits for the first on the a->b link.
  for (int i = 0; i < 2; ++i) {
    a->transport()->SendAsync("b", Request{"echo", Bytes(100'000 - 64 - 4, 0)},
                              [&](Result<Bytes> r) { done += r.ok(); });
  }
  net.RunUntilIdle();
  EXPECT_EQ(done, 2);
  // Requests: 0.1 s each on a->b, back to back; responses likewise on b->a.
  EXPECT_GE(net.NowMicros(), 290'000);
}

TEST(SimTransportTest, ErrorsAndLimits) {
  SimNetwork net(1);
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  Transport* t = a->transport();
  EXPECT_EQ(t->Send("b", Request{"nosuch", {}}).status().code(), StatusCode::kNotFound);
  Result<Bytes> f = t->Send("b", Request{"fail", {}});
  EXPECT_EQ(f.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(f.status().message().find("peer b"), std::string::npos);
  EXPECT_EQ(t->Send("b", Request{"big", Bytes(17, 0)}).status().code(),
            StatusCode::kResourceExhausted);  // request over the method's limit
  Request small{"big", {}};
  small.max_response_bytes = 1000;
  EXPECT_EQ(t->Send("b", small).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t->Send("c", Request{"echo", {}}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(t->Send("b", Request{"Bad Method", {}}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SimTransportTest, PartitionBlocksUntilHealed) {
  SimNetwork net(3);
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  SimNode* c = net.AddNode("c");
  net.AddNode("b")->Serve(&router);
  net.Partition({"a"});
  Request q{"echo", ToBytes("x")};
  q.timeout_ms = 500;
  EXPECT_EQ(a->transport()->Send("b", q).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(c->transport()->Send("b", q).ok());  // same side as b
  net.Heal();
  EXPECT_TRUE(a->transport()->Send("b", q).ok());
  EXPECT_EQ(net.stats().timeouts, 1u);
}

TEST(SimTransportTest, LossGivesDeadlineExceeded) {
  SimNetwork net(4, LinkParams{.loss = 1.0});
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  Request q{"echo", {}};
  q.timeout_ms = 100;
  EXPECT_EQ(a->transport()->Send("b", q).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(net.NowMicros(), 100'000);
  EXPECT_EQ(net.stats().dropped_loss, 1u);
}

TEST(SimTransportTest, KillAndRestart) {
  SimNetwork net(5);
  Router router = EchoRouter();
  SimNode* a = net.AddNode("a");
  SimNode* b = net.AddNode("b");
  b->Serve(&router);
  Request q{"echo", {}};
  q.timeout_ms = 200;
  net.Kill("b");
  EXPECT_FALSE(b->alive());
  EXPECT_EQ(a->transport()->Send("b", q).status().code(), StatusCode::kDeadlineExceeded);
  net.Restart("b");
  EXPECT_TRUE(a->transport()->Send("b", q).ok());

  // A killed sender never hears back, even after restarting.
  bool called = false;
  a->transport()->SendAsync("b", q, [&](Result<Bytes>) { called = true; });
  net.Kill("a");
  net.Restart("a");
  net.RunUntilIdle();
  EXPECT_FALSE(called);

  // A response in flight when the server dies is lost: the caller times out.
  std::optional<Result<Bytes>> got;
  a->transport()->SendAsync("b", q, [&](Result<Bytes> r) { got.emplace(std::move(r)); });
  net.RunFor(1500);  // the request has arrived (1 ms), the response is on its way
  net.Kill("b");
  net.RunUntilIdle();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kDeadlineExceeded);
}

// Duplication: every message arrives twice, so the handler runs twice per request, and the
// caller still completes exactly once, with the first response.
TEST(SimTransportTest, DuplicatedMessagesRunTheHandlerTwiceAndCompleteOnce) {
  SimNetwork net(6, LinkParams{.latency_us = 1000, .jitter_us = 500, .duplicate = 1.0});
  int handled = 0;
  Router router;
  router.Register(
      "count",
      [&](const Request& q) -> Result<Bytes> {
        ++handled;
        return q.body;
      },
      1 << 10);
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  int completions = 0;
  a->transport()->SendAsync("b", Request{"count", ToBytes("x")},
                            [&](Result<Bytes> r) { completions += r.ok(); });
  net.RunUntilIdle();
  EXPECT_EQ(handled, 2);
  EXPECT_EQ(completions, 1);
  // Request twice, and each handler run answers twice: 2 + 4 messages, 3 of them copies.
  EXPECT_EQ(net.stats().duplicated, 3u);
  EXPECT_EQ(net.stats().timeouts, 0u);
}

// Jitter larger than the spacing of two messages reorders them; SetAllLinks changes links that
// were used already and those that were not.
TEST(SimTransportTest, JitterReordersAndSetAllLinksAppliesEverywhere) {
  SimNetwork net(7, LinkParams{.latency_us = 1000, .bandwidth_bytes_per_sec = 0});
  std::vector<int> order;
  Router router;
  router.Register(
      "seq",
      [&](const Request& q) -> Result<Bytes> {
        order.push_back(q.body[0]);
        return Bytes{};
      },
      16);
  SimNode* a = net.AddNode("a");
  net.AddNode("b")->Serve(&router);
  net.AddNode("c")->Serve(&router);
  ASSERT_TRUE(a->transport()->Send("b", Request{"seq", Bytes{0}}).ok());  // a->b exists now
  order.clear();
  net.SetAllLinks(
      LinkParams{.latency_us = 1000, .jitter_us = 100'000, .bandwidth_bytes_per_sec = 0});
  bool reordered = false;
  for (const char* to : {"b", "c"}) {
    order.clear();
    for (int i = 0; i < 20; ++i) {
      a->transport()->SendAsync(to, Request{"seq", Bytes{static_cast<uint8_t>(i)}},
                                [](Result<Bytes>) {});
    }
    net.RunUntilIdle();
    ASSERT_EQ(order.size(), 20u);
    reordered |= !std::is_sorted(order.begin(), order.end());
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < 20; ++i) EXPECT_EQ(sorted[i], i);
    EXPECT_FALSE(std::is_sorted(order.begin(), order.end())) << "to " << to;
  }
  EXPECT_TRUE(reordered);
}

// 50 nodes each send to 5 random others over lossy, jittery links; returns the trace.
std::vector<std::string> RunMesh(uint64_t seed, int* ok_count) {
  SimNetwork net(
      seed,
      LinkParams{
          .latency_us = 2000, .jitter_us = 1500, .bandwidth_bytes_per_sec = 10e6, .loss = 0.05});
  net.EnableTrace(true);
  Router router = EchoRouter();
  std::vector<SimNode*> nodes;
  for (int i = 0; i < 50; ++i) {
    nodes.push_back(net.AddNode("n" + std::to_string(i)));
    nodes.back()->Serve(&router);
  }
  Rng pick(seed ^ 0xabc);
  *ok_count = 0;
  std::vector<std::string> results;
  for (int i = 0; i < 50; ++i) {
    for (int k = 0; k < 5; ++k) {
      std::string to = "n" + std::to_string(pick.Uniform(50));
      Request q{"echo", Bytes(pick.Uniform(5000), static_cast<uint8_t>(i))};
      q.timeout_ms = 1000;
      nodes[i]->transport()->SendAsync(to, q, [&, i, to](Result<Bytes> r) {
        *ok_count += r.ok();
        results.push_back("t=" + std::to_string(net.NowMicros()) + " n" + std::to_string(i) + "<" +
                          to + " " + (r.ok() ? "ok" : r.status().ToString()));
      });
    }
  }
  net.Partition({"n0", "n1", "n2"});
  net.RunFor(5000);
  net.Heal();
  net.Kill("n7");
  net.RunUntilIdle();
  std::vector<std::string> all = net.trace();
  all.insert(all.end(), results.begin(), results.end());
  return all;
}

TEST(SimTransportTest, SameSeedSameRun) {
  int ok1 = 0, ok2 = 0, ok3 = 0;
  std::vector<std::string> t1 = RunMesh(42, &ok1);
  std::vector<std::string> t2 = RunMesh(42, &ok2);
  std::vector<std::string> t3 = RunMesh(43, &ok3);
  ASSERT_GT(t1.size(), 500u);
  EXPECT_EQ(t1, t2) << "seed 42 did not reproduce";
  EXPECT_EQ(ok1, ok2);
  EXPECT_NE(t1, t3);
  EXPECT_GT(ok1, 150);  // most messages survive 5% loss each way
  EXPECT_LT(ok1, 250);  // but not all
}

}  // namespace
}  // namespace meshlearn::net
