// RpcClient over several endpoints (issue 18): a dead endpoint and a sequencer candidate that is
// not the leader are skipped; the call lands on the one that answers. Real HTTP on loopback.
#include <gtest/gtest.h>

#include "etcd_test_util.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/rpc_server.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;
using testing::TestLedger;

TEST(RpcFailover, SkipsADeadEndpointAndAStandbyCandidate) {
  // The leader: an ordinary sequencer.
  TestLedger leader(/*block_interval_ms=*/10);
  RpcServer leader_server(leader.rpc.get());
  ASSERT_TRUE(leader_server.Start("127.0.0.1", 0).ok());
  leader.sequencer->Start();
  // A standby candidate (same genesis, own chain): refuses sends with Unavailable.
  TestLedger standby(/*block_interval_ms=*/10);
  standby.sequencer->SetReplicated([](const Block&) { return Status::Ok(); });
  RpcServer standby_server(standby.rpc.get());
  ASSERT_TRUE(standby_server.Start("127.0.0.1", 0).ok());
  std::string dead = "http://127.0.0.1:" + std::to_string(testing::FreePort());

  RpcClient rpc(dead + "," + standby_server.url() + "," + leader_server.url(),
                {.connect_timeout_ms = 300, .retries = 1, .retry_backoff_ms = 10});
  EXPECT_EQ(rpc.endpoint_count(), 3u);
  // Reads: the first that answers (the standby serves reads).
  Result<json> st = rpc.Call("chain_status", json::object());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(rpc.url(), standby_server.url());

  // A send: the standby says Unavailable (not the leader), the leader takes it.
  Transaction tx = leader.Transfer(leader.alice, leader.bob, 42, 0);
  Result<json> done = SendTxAndWait(rpc, tx, 20000);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["status"], "included");
  EXPECT_EQ(rpc.url(), leader_server.url());
  EXPECT_EQ(leader.Balance(leader.bob), TestLedger::kFunds + 42);
  EXPECT_EQ(standby.Balance(standby.bob), TestLedger::kFunds);

  // One endpoint behaves as before: the standby's refusal is the answer.
  RpcClient only(standby_server.url(), {.retries = 0});
  Result<json> refused = only.Call("send_tx", {{"tx", testing::TxHex(tx)}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("not the leader"), std::string::npos)
      << refused.status().message();

  // Nothing answers: Unavailable, naming an endpoint.
  RpcClient none(dead, {.connect_timeout_ms = 200, .retries = 0});
  Result<json> gone = none.Call("chain_status", json::object());
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find(dead), std::string::npos);
  leader.sequencer->Stop();
  leader_server.Stop();
  standby_server.Stop();
}

}  // namespace
}  // namespace meshlearn::ledger
