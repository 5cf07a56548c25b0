// The real HTTP server and client over loopback (127.0.0.1, ephemeral ports).
#include <httplib.h>

#include <thread>

#include <gtest/gtest.h>

#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/rpc_server.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;
using testing::TestLedger;

TEST(RpcHttp, StatusSendAndWaitOverLoopback) {
  TestLedger t(/*block_interval_ms=*/10);
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_GT(server.port(), 0);
  t.sequencer->Start();

  RpcClient rpc(server.url());
  Result<json> st = rpc.Call("chain_status", json::object());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ((*st)["chain_id"], TestLedger::kChainId);

  Result<std::string> chain_id = FetchChainId(rpc);
  ASSERT_TRUE(chain_id.ok());
  Result<uint64_t> nonce = FetchNextNonce(rpc, t.alice.public_key());
  ASSERT_TRUE(nonce.ok());
  Transaction tx = BuildSignedTx(t.alice, *chain_id, *nonce,
                                 TransferTx{.to = t.bob.public_key(), .amount = 42, .memo = "hi"});
  Result<json> done = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["status"], "included");
  EXPECT_EQ((*done)["receipt"]["ok"], true);
  // Sending it again after it was acknowledged: same receipt, paid once.
  Result<json> again = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["receipt"], (*done)["receipt"]);
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 42);

  // A refused transaction comes back as the ledger's Status.
  Transaction stale = BuildSignedTx(t.alice, *chain_id, 0,
                                    TransferTx{.to = t.bob.public_key(), .amount = 1, .memo = ""});
  Result<json> refused = SendTxAndWait(rpc, stale, 60000);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();

  t.sequencer->Stop();
  server.Stop();
}

TEST(RpcHttp, LongPollWakesOnNewBlock) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url());
  Result<json> r = Unavailable("not run");
  std::thread waiter([&] { r = rpc.Call("wait_block", {{"after", 0}, {"timeout_ms", 30000}}); });
  // Produce only once the waiter is parked (or has already returned, which the test catches).
  while (t.Call("chain_status")["result"]["height"] == 0 && t.sequencer->mempool_size() == 0) {
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  waiter.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["timed_out"], false);
  EXPECT_GE((*r)["height"].get<uint64_t>(), 1u);
  server.Stop();
}

TEST(RpcHttp, StopWakesParkedLongPolls) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url(), {.retries = 0});
  Result<json> r = Unavailable("not run");
  std::thread waiter([&] { r = rpc.Call("wait_block", {{"after", 100}, {"timeout_ms", 30000}}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it park (not required)
  server.Stop();
  waiter.join();  // returns instead of hanging for 30 s
  SUCCEED();
}

// The largest transaction a node sends (a RefereeStep or ProveResult with a witness near
// kMaxWitnessBytes) goes through a server with default options: sent as hex, included in a block
// (here refused by execution: there is no such task, a receipt like any other).
TEST(RpcHttp, TheLargestTransactionFitsTheDefaultLimits) {
  TestLedger t(/*block_interval_ms=*/10);
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  t.sequencer->Start();
  RpcClient rpc(server.url());
  Bytes witness(kMaxWitnessBytes - 64, 0);
  for (size_t i = 0; i < witness.size(); ++i) witness[i] = static_cast<uint8_t>(i * 131);
  Transaction tx = BuildSignedTx(t.alice, TestLedger::kChainId, 0,
                                 ProveResultTx{.task_id = Blake2b("no such task"), .index = 0,
                                               .node_id = t.alice.public_key(),
                                               .witness = {std::move(witness)}});
  EXPECT_GT(EncodeTx(tx).size(), kMaxWitnessBytes);
  Result<json> done = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["status"], "included");
  EXPECT_EQ((*done)["receipt"]["ok"], false);
  t.sequencer->Stop();
  server.Stop();
}

TEST(RpcHttp, OversizeBodyGets413WithJsonRpcError) {
  TestLedger t;
  RpcServer server(t.rpc.get(), {.max_body_bytes = 1024});
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url());
  Result<std::pair<int, std::string>> r = rpc.PostRaw(std::string(4096, ' '));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->first, 413);
  json j = json::parse(r->second);
  EXPECT_EQ(j["error"]["code"], kRpcLimitExceeded);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("1024"), std::string::npos);
  server.Stop();
}

TEST(RpcHttp, RateLimitPerClient) {
  TestLedger t;
  RpcServerOptions opts;
  opts.rate_limit = {.rate_per_second = 0.001, .burst = 2, .max_clients = 10};
  RpcServer server(t.rpc.get(), opts);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url(), {.retries = 0});
  std::string body = testing::Request("chain_status").dump();
  EXPECT_EQ(rpc.PostRaw(body)->first, 200);
  EXPECT_EQ(rpc.PostRaw(body)->first, 200);
  Result<std::pair<int, std::string>> limited = rpc.PostRaw(body);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->first, 429);
  EXPECT_EQ(json::parse(limited->second)["error"]["code"], kRpcLimitExceeded);
  Result<json> call = rpc.Call("chain_status", json::object());
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), StatusCode::kResourceExhausted);
  server.Stop();
}

TEST(RpcHttp, WrongPathAndUnreachableServer) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client raw("127.0.0.1", server.port());
  httplib::Result r = raw.Post("/nowhere", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("POST JSON-RPC requests to /"), std::string::npos) << r->body;
  int port = server.port();
  server.Stop();

  RpcClient gone("http://127.0.0.1:" + std::to_string(port),
                 {.connect_timeout_ms = 500, .retries = 1, .retry_backoff_ms = 1});
  Result<json> st = gone.Call("chain_status", json::object());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(st.status().message().find("chain serve"), std::string::npos);
}

TEST(RpcHttp, PortInUseIsAClearError) {
  TestLedger t;
  RpcServer a(t.rpc.get());
  ASSERT_TRUE(a.Start("127.0.0.1", 0).ok());
  RpcServer b(t.rpc.get());
  Status s = b.Start("127.0.0.1", a.port());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--listen"), std::string::npos);
  a.Stop();
}

}  // namespace
}  // namespace meshlearn::ledger
