// GET /metrics of the RPC server, over real HTTP on loopback: the page is valid Prometheus text
// (checked by Prometheus's own `promtool check metrics` where the prometheus package is
// installed; skipped, visibly, where it is not), its numbers are the chain's, and they move as
// blocks commit.
#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "meshlearn/base/prometheus.h"
#include "meshlearn/ledger/metrics.h"
#include "meshlearn/ledger/rpc_server.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestLedger;

// The value of sample `series` on `page`, or -1 if the page has none.
double Value(const std::string& page, const std::string& series) {
  return PrometheusSample(page, series).value_or(-1);
}

std::string Scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  httplib::Result r = client.Get("/metrics");
  EXPECT_TRUE(r) << "GET /metrics failed";
  if (!r) return "";
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  return r->body;
}

// promtool's verdict on `page`: "" when it passes, its complaint otherwise; nullopt when the
// prometheus package is not installed.
std::optional<std::string> Promtool(const std::string& page, const std::string& dir) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) return std::nullopt;
  const std::string in = dir + "/metrics.txt", out = dir + "/promtool.txt";
  std::ofstream(in) << page;
  const int rc = std::system(("promtool check metrics < " + in + " > " + out + " 2>&1").c_str());
  std::ifstream f(out);
  std::string said((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return rc == 0 ? std::string() : "exit " + std::to_string(rc) + ": " + said;
}

TEST(LedgerMetrics, PromtoolAcceptsThePageAndItFollowsTheChain) {
  TestLedger t;
  RpcServer server(t.rpc.get(), {});
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  std::string first = Scrape(server.port());
  EXPECT_EQ(Value(first, "meshlearn_chain_height"), 0);
  EXPECT_EQ(Value(first, "meshlearn_tokens{where=\"balances\"}"), 2.0 * TestLedger::kFunds);
  EXPECT_EQ(Value(first, "meshlearn_tokens{where=\"minted\"}"), 2.0 * TestLedger::kFunds);

  // A transfer and a refused one (bad nonce), then two blocks.
  auto ok = t.Call("send_tx", {{"tx", testing::TxHex(t.Transfer(t.alice, t.bob, 5, 0))}});
  ASSERT_TRUE(ok.contains("result")) << ok.dump();
  auto bad = t.Call("send_tx", {{"tx", testing::TxHex(t.Transfer(t.alice, t.bob, 5, 0 + 1000))}});
  ASSERT_TRUE(bad.contains("error")) << bad.dump();
  t.Call("no_such_method");
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());

  std::string second = Scrape(server.port());
  EXPECT_EQ(Value(second, "meshlearn_chain_height"), 2);
  EXPECT_EQ(Value(second, "meshlearn_blocks_produced_total"), 2);
  EXPECT_EQ(Value(second, "meshlearn_mempool_transactions"), 0);
  EXPECT_EQ(Value(second, "meshlearn_transactions_total{outcome=\"admitted\",reason=\"\"}"), 1);
  EXPECT_EQ(Value(second, "meshlearn_transactions_total{outcome=\"refused\",reason=\"ResourceExhausted\"}"), 1)
      << second;
  EXPECT_EQ(Value(second, "meshlearn_rpc_requests_total{method=\"send_tx\",code=\"ok\"}"), 1);
  EXPECT_EQ(Value(second, "meshlearn_rpc_requests_total{method=\"unknown\",code=\"-32601\"}"), 1)
      << second;
  EXPECT_EQ(Value(second, "meshlearn_tokens{where=\"minted\"}"), 2.0 * TestLedger::kFunds);
  EXPECT_EQ(Value(second, "meshlearn_tasks{status=\"open\"}"), 0);
  EXPECT_EQ(Value(second, "meshlearn_checks_settled_total{result=\"fraud\"}"), 0);

  const std::string dir = testing::TempDir();
  for (const std::string& page : {first, second}) {
    std::optional<std::string> verdict = Promtool(page, dir);
    if (!verdict) GTEST_SKIP() << "promtool not installed (Debian package prometheus): the page's "
                                  "format was not checked by Prometheus";
    EXPECT_EQ(*verdict, "") << page;
  }
  server.Stop();
}

}  // namespace
}  // namespace meshlearn::ledger
