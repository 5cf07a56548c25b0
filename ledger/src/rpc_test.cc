// RpcService::HandleRpc / HandleBody without sockets: every method and every error path.
#include "meshlearn/ledger/rpc.h"

#include <thread>

#include <gtest/gtest.h>

#include "meshlearn/ledger/block.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;
using testing::ErrorCode;
using testing::Request;
using testing::TestLedger;
using testing::TxHex;

TEST(Rpc, ChainStatus) {
  TestLedger t;
  json r = t.Call("chain_status");
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["jsonrpc"], "2.0");
  EXPECT_EQ(r["id"], 1);
  EXPECT_EQ(r["result"]["chain_id"], TestLedger::kChainId);
  EXPECT_EQ(r["result"]["height"], 0);
  EXPECT_EQ(r["result"]["role"], "sequencer");
  EXPECT_EQ(r["result"]["sequencer"], t.seq_key.public_key().ToHex());
  EXPECT_EQ(r["result"]["genesis_hash"], GenesisHash(t.genesis).ToHex());
}

TEST(Rpc, SendTxThenIncludedWithReceipt) {
  TestLedger t;
  Transaction tx = t.Transfer(t.alice, t.bob, 100, 0);
  json r = t.Call("send_tx", {{"tx", TxHex(tx)}});
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["status"], "pending");
  EXPECT_EQ(r["result"]["tx_id"], TxId(tx).ToHex());

  json pending = t.Call("get_tx", {{"id", TxId(tx).ToHex()}});
  EXPECT_EQ(pending["result"]["status"], "pending");

  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  json done = t.Call("get_tx", {{"id", TxId(tx).ToHex()}});
  ASSERT_EQ(done["result"]["status"], "included") << done.dump();
  EXPECT_EQ(done["result"]["height"], 1);
  EXPECT_EQ(done["result"]["receipt"]["ok"], true);
  EXPECT_EQ(done["result"]["tx"]["sender"], t.alice.public_key().ToHex());
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 100);
}

TEST(Rpc, ResendingTheSameTxPaysOnce) {
  TestLedger t;
  Transaction tx = t.Transfer(t.alice, t.bob, 500, 0);
  for (int i = 0; i < 3; ++i) {
    json r = t.Call("send_tx", {{"tx", TxHex(tx)}});
    EXPECT_EQ(r["result"]["status"], "pending") << r.dump();
  }
  EXPECT_EQ(t.sequencer->mempool_size(), 1u);
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  // After inclusion a resend (a client that timed out and retries) gets the receipt.
  for (int i = 0; i < 3; ++i) {
    json r = t.Call("send_tx", {{"tx", TxHex(tx)}});
    EXPECT_EQ(r["result"]["status"], "included") << r.dump();
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  EXPECT_EQ(t.Balance(t.alice), TestLedger::kFunds - 500);
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 500);
}

TEST(Rpc, SecondTxWithAPendingNonceIsRefused) {
  TestLedger t;
  ASSERT_TRUE(t.Call("send_tx", {{"tx", TxHex(t.Transfer(t.alice, t.bob, 1, 0))}}).contains("result"));
  json r = t.Call("send_tx", {{"tx", TxHex(t.Transfer(t.alice, t.bob, 2, 0))}});
  EXPECT_EQ(ErrorCode(r), kRpcTxRejected) << r.dump();
  EXPECT_EQ(r["error"]["data"]["status"], "FailedPrecondition");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("already taken"), std::string::npos);
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  // And once the first is in, the nonce is used for good.
  json late = t.Call("send_tx", {{"tx", TxHex(t.Transfer(t.alice, t.bob, 2, 0))}});
  EXPECT_EQ(ErrorCode(late), kRpcTxRejected) << late.dump();
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 1);
}

TEST(Rpc, SendTxWithWaitAnswersOnceCommitted) {
  TestLedger t;
  Transaction tx = t.Transfer(t.alice, t.bob, 7, 0);
  std::thread producer([&] {
    while (t.sequencer->mempool_size() == 0) std::this_thread::yield();
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  });
  json r = t.Call("send_tx", {{"tx", TxHex(tx)}, {"wait_ms", 30000}});
  producer.join();
  EXPECT_EQ(r["result"]["status"], "included") << r.dump();
  EXPECT_EQ(r["result"]["receipt"]["ok"], true);
}

TEST(Rpc, BadTransactions) {
  TestLedger t;
  // Not hex.
  json r = t.Call("send_tx", {{"tx", "zz"}});
  EXPECT_EQ(ErrorCode(r), kRpcInvalidParams) << r.dump();
  // Hex, but not a transaction.
  r = t.Call("send_tx", {{"tx", "00010203"}});
  EXPECT_EQ(ErrorCode(r), kRpcInvalidParams) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("does not decode"), std::string::npos);
  // A valid transaction whose signature was damaged.
  Transaction bad = t.Transfer(t.alice, t.bob, 1, 0);
  bad.signature.bytes[10] ^= 1;
  r = t.Call("send_tx", {{"tx", TxHex(bad)}});
  EXPECT_EQ(ErrorCode(r), kRpcTxRejected) << r.dump();
  EXPECT_EQ(r["error"]["data"]["status"], "PermissionDenied");
  // Changed after signing: the amount differs from what was signed.
  Transaction changed = t.Transfer(t.alice, t.bob, 1, 0);
  std::get<TransferTx>(changed.payload).amount = 1000;
  r = t.Call("send_tx", {{"tx", TxHex(changed)}});
  EXPECT_EQ(ErrorCode(r), kRpcTxRejected) << r.dump();
  // Another chain's transaction.
  Transaction other = BuildSignedTx(t.alice, "other-chain", 0, TransferTx{.to = t.bob.public_key(), .amount = 1, .memo = ""});
  r = t.Call("send_tx", {{"tx", TxHex(other)}});
  EXPECT_EQ(ErrorCode(r), kRpcTxRejected) << r.dump();
  // Too large to be a transaction.
  r = t.Call("send_tx", {{"tx", std::string(2 * kMaxTxBytes + 2, 'a')}});
  EXPECT_EQ(ErrorCode(r), kRpcLimitExceeded) << r.dump();
  EXPECT_EQ(t.sequencer->mempool_size(), 0u);
}

TEST(Rpc, MalformedRequests) {
  TestLedger t;
  auto body = [&](std::string_view text) { return json::parse(t.rpc->HandleBody(text)); };
  EXPECT_EQ(ErrorCode(body("{not json")), kRpcParseError);
  EXPECT_EQ(ErrorCode(body("")), kRpcParseError);
  EXPECT_EQ(ErrorCode(body("42")), kRpcInvalidRequest);
  EXPECT_EQ(ErrorCode(body(R"({"id":1,"method":"chain_status"})")), kRpcInvalidRequest);
  EXPECT_EQ(ErrorCode(body(R"({"jsonrpc":"2.0","id":1})")), kRpcInvalidRequest);
  EXPECT_EQ(ErrorCode(body(R"({"jsonrpc":"2.0","id":{},"method":"chain_status"})")), kRpcInvalidRequest);
  EXPECT_EQ(ErrorCode(body(R"({"jsonrpc":"2.0","id":1,"method":"chain_status","params":[1]})")),
            kRpcInvalidParams);
  json unknown = body(R"({"jsonrpc":"2.0","id":"x","method":"steal_funds"})");
  EXPECT_EQ(ErrorCode(unknown), kRpcMethodNotFound);
  EXPECT_EQ(unknown["id"], "x");
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("chain_status"), std::string::npos);
  // Invalid UTF-8 is not JSON: a parse error, not a crash when the method name is echoed.
  json utf = body("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}");
  EXPECT_EQ(ErrorCode(utf), kRpcParseError);
}

TEST(Rpc, DeepJsonIsRefusedBeforeParsing) {
  TestLedger t;
  std::string deep(100000, '[');
  json r = json::parse(t.rpc->HandleBody(deep));
  EXPECT_EQ(ErrorCode(r), kRpcLimitExceeded);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("deeper"), std::string::npos);
  // Brackets inside strings do not count.
  std::string ok = R"({"jsonrpc":"2.0","id":1,"method":"chain_status","params":{},"x":")" +
                   std::string(1000, '[') + "\"}";
  EXPECT_FALSE(JsonTooDeep(ok, 4));
  EXPECT_TRUE(JsonTooDeep("[[[[[", 4));
  EXPECT_FALSE(JsonTooDeep(R"(["\"[[[[[["])", 2));
}

TEST(Rpc, OversizeBody) {
  TestLedger t;
  std::string big(t.rpc->limits().max_body_bytes + 1, ' ');
  json r = json::parse(t.rpc->HandleBody(big));
  EXPECT_EQ(ErrorCode(r), kRpcLimitExceeded);
  EXPECT_EQ(r["error"]["data"]["status"], "ResourceExhausted");
}

TEST(Rpc, BadParams) {
  TestLedger t;
  EXPECT_EQ(ErrorCode(t.Call("get_block", json::object())), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_block", {{"height", "one"}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_block", {{"height", -1}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_block", {{"height", 1}, {"hieght", 2}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_account", {{"address", "abc"}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_tx", {{"id", 5}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("list_nodes", {{"limit", 0}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("list_nodes", {{"limit", 100000}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("wait_block", {{"after", 0}, {"timeout_ms", 10000000}})), kRpcInvalidParams);
  EXPECT_EQ(ErrorCode(t.Call("get_blocks", {{"from", 0}})), kRpcInvalidParams);
  json r = t.Call("get_block", {{"height", true}});
  EXPECT_NE(r["error"]["message"].get<std::string>().find("params.height"), std::string::npos) << r.dump();
}

TEST(Rpc, NotFound) {
  TestLedger t;
  EXPECT_EQ(ErrorCode(t.Call("get_block", {{"height", 1}})), kRpcNotFound);
  EXPECT_EQ(ErrorCode(t.Call("get_node", {{"id", t.bob.public_key().ToHex()}})), kRpcNotFound);
  EXPECT_EQ(ErrorCode(t.Call("get_task", {{"id", Hash256{}.ToHex()}})), kRpcNotFound);
  json unknown_tx = t.Call("get_tx", {{"id", Hash256{}.ToHex()}});
  EXPECT_EQ(unknown_tx["result"]["status"], "unknown");
  json nobody = t.Call("get_account", {{"address", testing::KeyFromByte(77).public_key().ToHex()}});
  EXPECT_EQ(nobody["result"]["exists"], false);
  EXPECT_EQ(nobody["result"]["balance"], 0);
}

TEST(Rpc, BlocksAccountsAndHistoryPages) {
  TestLedger t;
  for (uint64_t n = 0; n < 3; ++n) {
    ASSERT_TRUE(t.Call("send_tx", {{"tx", TxHex(t.Transfer(t.alice, t.bob, 10 + n, n))}}).contains("result"));
  }
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());  // empty block

  json b = t.Call("get_block", {{"height", 1}, {"raw", true}});
  ASSERT_TRUE(b.contains("result")) << b.dump();
  Result<Bytes> raw = HexDecode(b["result"]["raw"].get<std::string>());
  ASSERT_TRUE(raw.ok());
  Result<Block> decoded = DecodeBlock(*raw);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->txs.size(), 3u);

  json blocks = t.Call("get_blocks", {{"from", 1}, {"limit", 10}});
  EXPECT_EQ(blocks["result"]["blocks"].size(), 2u);
  EXPECT_EQ(blocks["result"]["height"], 2);

  json acct = t.Call("get_account", {{"address", t.alice.public_key().ToHex()}});
  EXPECT_EQ(acct["result"]["nonce"], 3);
  EXPECT_EQ(acct["result"]["exists"], true);

  json page1 = t.Call("account_history", {{"address", t.alice.public_key().ToHex()}, {"limit", 2}});
  ASSERT_TRUE(page1.contains("result")) << page1.dump();
  EXPECT_EQ(page1["result"]["items"].size(), 2u);
  EXPECT_EQ(page1["result"]["next_cursor"], 2);
  json page2 = t.Call("account_history",
                      {{"address", t.alice.public_key().ToHex()}, {"limit", 2}, {"cursor", 2}});
  EXPECT_EQ(page2["result"]["items"].size(), 1u);
  EXPECT_TRUE(page2["result"]["next_cursor"].is_null());

  json nodes = t.Call("list_nodes");
  EXPECT_TRUE(nodes["result"]["items"].empty());
  json tasks = t.Call("list_tasks", {{"limit", 5}});
  EXPECT_TRUE(tasks["result"]["items"].empty());
  json gen = t.Call("get_genesis");
  Result<Genesis> parsed = ParseGenesis(gen["result"]["toml"].get<std::string>());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(GenesisHash(*parsed), GenesisHash(t.genesis));
}

TEST(Rpc, Batch) {
  TestLedger t;
  json batch = json::array({Request("chain_status", json::object(), 1), Request("nope", json::object(), 2)});
  json r = t.rpc->HandleRpc(batch);
  ASSERT_TRUE(r.is_array());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(r[0].contains("result"));
  EXPECT_EQ(ErrorCode(r[1]), kRpcMethodNotFound);
  EXPECT_EQ(ErrorCode(t.rpc->HandleRpc(json::array())), kRpcInvalidRequest);
  json huge = json::array();
  for (int i = 0; i < 1000; ++i) huge.push_back(Request("chain_status"));
  EXPECT_EQ(ErrorCode(t.rpc->HandleRpc(huge)), kRpcLimitExceeded);
}

TEST(Rpc, WaitBlockLongPoll) {
  TestLedger t;
  json timed_out = t.Call("wait_block", {{"after", 0}, {"timeout_ms", 0}});
  EXPECT_EQ(timed_out["result"]["timed_out"], true);
  EXPECT_EQ(timed_out["result"]["height"], 0);
  // A waiter is woken by the block, well before its (long) timeout.
  json woken;
  std::thread waiter([&] { woken = t.Call("wait_block", {{"after", 0}, {"timeout_ms", 30000}}); });
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  waiter.join();
  EXPECT_EQ(woken["result"]["timed_out"], false) << woken.dump();
  EXPECT_EQ(woken["result"]["height"], 1);
  // Already above: answers at once.
  json now = t.Call("wait_block", {{"after", 0}, {"timeout_ms", 30000}});
  EXPECT_EQ(now["result"]["height"], 1);
}

TEST(Rpc, ShutdownWakesLongPolls) {
  TestLedger t;
  json r;
  std::thread waiter([&] { r = t.Call("wait_block", {{"after", 5}, {"timeout_ms", 30000}}); });
  while (t.Call("chain_status")["result"]["height"] != 0) {}
  t.rpc->Shutdown();
  waiter.join();
  EXPECT_TRUE(r.contains("result") || ErrorCode(r) == kRpcUnavailable) << r.dump();
  EXPECT_EQ(ErrorCode(t.Call("wait_block", {{"after", 5}})), kRpcUnavailable);
}

TEST(Rpc, FollowerIsReadOnly) {
  TestLedger t;
  RpcService follower(t.shared.get(), nullptr, {}, {.role = "follower", .upstream = "http://127.0.0.1:1"});
  json r = follower.HandleRpc(Request("send_tx", {{"tx", TxHex(t.Transfer(t.alice, t.bob, 1, 0))}}));
  EXPECT_EQ(ErrorCode(r), kRpcReadOnly) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("http://127.0.0.1:1"), std::string::npos);
  json st = follower.HandleRpc(Request("chain_status"));
  EXPECT_EQ(st["result"]["role"], "follower");
}

}  // namespace
}  // namespace meshlearn::ledger
