// RpcService::HandleRpc / HandleBody without sockets: every method and every error path.
#include "meshlearn/ledger/rpc.h"

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/merkle.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/protocol/verification.h"
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
  // An id's length is said once (it read "expected 64 hex digits, got 12 (64 hex digits)").
  for (const char* method : {"get_tx", "get_task"}) {
    const std::string m = t.Call(method, {{"id", "78a88c4eecff"}})["error"]["message"];
    EXPECT_NE(m.find("params.id: expected 64 hex digits, got 12"), std::string::npos) << m;
    EXPECT_EQ(m.find("hex digits"), m.rfind("hex digits")) << m;
  }
  const std::string key = t.Call("get_account", {{"address", "abc"}})["error"]["message"];
  EXPECT_EQ(key.find("hex digits"), key.rfind("hex digits")) << key;
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

// get_block_txs: one block's transactions as canonical bytes with their receipts' ok, of one type
// when asked, in pages bounded by max_block_txs_bytes (one transaction always) and max_page, and
// every parameter checked.
TEST(Rpc, BlockTxsAreTheBlocksTransactionsInBoundedPages) {
  TestLedger t;
  std::vector<Transaction> sent;
  for (uint64_t n = 0; n < 3; ++n) {
    sent.push_back(t.Transfer(t.alice, t.bob, 10 + n, n));
    ASSERT_TRUE(t.Call("send_tx", {{"tx", TxHex(sent.back())}}).contains("result"));
  }
  ASSERT_TRUE(t.sequencer->ProduceOnce().ok());

  json all = t.Call("get_block_txs", {{"height", 1}});
  ASSERT_TRUE(all.contains("result")) << all.dump();
  ASSERT_EQ(all["result"]["txs"].size(), 3u);
  EXPECT_TRUE(all["result"]["next_cursor"].is_null());
  for (size_t i = 0; i < 3; ++i) {
    const json& x = all["result"]["txs"][i];
    EXPECT_EQ(x["position"], i);
    EXPECT_EQ(x["type"], "Transfer");
    EXPECT_EQ(x["ok"], true);
    EXPECT_EQ(x["tx_id"], TxId(sent[i]).ToHex());
    Result<Bytes> wire = HexDecode(x["tx"].get<std::string>());
    ASSERT_TRUE(wire.ok());
    Result<Transaction> back = DecodeTx(*wire);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(TxId(*back), TxId(sent[i]));
  }
  json none = t.Call("get_block_txs", {{"height", 1}, {"type", "ServeStageEvidence"}});
  EXPECT_TRUE(none["result"]["txs"].empty()) << none.dump();
  EXPECT_TRUE(none["result"]["next_cursor"].is_null());

  // Pages of two transactions' bytes: 2, then 1 from the cursor; a page of one byte still
  // carries one transaction.
  const uint64_t one = EncodeTx(sent[0]).size();
  for (const auto& [bound, first_page] : {std::pair<uint64_t, size_t>{2 * one + 1, 2},
                                          std::pair<uint64_t, size_t>{1, 1}}) {
    RpcLimits limits;
    limits.max_block_txs_bytes = bound;
    RpcService small(t.shared.get(), nullptr, limits);
    json p1 = small.HandleRpc(Request("get_block_txs", {{"height", 1}, {"type", "Transfer"}}));
    ASSERT_EQ(p1["result"]["txs"].size(), first_page) << p1.dump();
    ASSERT_EQ(p1["result"]["next_cursor"], first_page);
    json p2 = small.HandleRpc(
        Request("get_block_txs", {{"height", 1}, {"cursor", p1["result"]["next_cursor"]}}));
    ASSERT_FALSE(p2["result"]["txs"].empty()) << p2.dump();
    EXPECT_EQ(p2["result"]["txs"][0]["position"], first_page);
  }

  // Bad parameters, each named.
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"height", 1}, {"type", "Nope"}}, "params.type: unknown transaction type 'Nope'"},
      {{{"height", 1}, {"cursor", 4}}, "params.cursor must be 0..3"},
      {{{"height", 1}, {"limit", 4}}, "unknown parameter 'limit'"},
      {{{"height", -1}}, "params.height"},
      {json::object(), "params.height is required"},
  };
  for (const auto& [params, want] : bad) {
    json r = t.Call("get_block_txs", params);
    EXPECT_EQ(ErrorCode(r), kRpcInvalidParams) << r.dump();
    EXPECT_NE(r.dump().find(want), std::string::npos) << r.dump();
  }
  EXPECT_EQ(ErrorCode(t.Call("get_block_txs", {{"height", 0}})), kRpcNotFound);
  EXPECT_EQ(ErrorCode(t.Call("get_block_txs", {{"height", 2}})), kRpcNotFound);
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

// Hostile input: a batch of 32 wait_block calls of 1 s each held a server thread for 32 s. The
// long-polls of one batch now share one deadline (max_wait_ms), so the batch holds the thread
// no longer than a single long-poll may. (The bound below is half of what the batch took
// before, generous enough for a loaded machine.)
TEST(Rpc, LongPollsOfABatchShareOneDeadline) {
  TestLedger t;
  RpcLimits limits;
  limits.max_wait_ms = 400;
  RpcService rpc(t.shared.get(), t.sequencer.get(), limits);
  json batch = json::array();
  for (int i = 0; i < 32; ++i) {
    batch.push_back(Request("wait_block", {{"after", 1000}, {"timeout_ms", 400}}, i));
  }
  auto start = std::chrono::steady_clock::now();
  json answers = rpc.HandleRpc(batch);
  auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  ASSERT_TRUE(answers.is_array());
  ASSERT_EQ(answers.size(), 32u);
  for (const json& a : answers) EXPECT_EQ(a["result"]["timed_out"], true) << a.dump();
  EXPECT_LT(took_ms, 32 * 400 / 2);
  // send_tx's wait is a long-poll too: in the same batch after a spent wait it answers at once
  // with the transaction pending.
  json mixed = json::array({Request("wait_block", {{"after", 1000}, {"timeout_ms", 400}}, 1),
                            Request("send_tx",
                                    {{"tx", TxHex(t.Transfer(t.alice, t.bob, 1, 0))},
                                     {"wait_ms", 400}},
                                    2)});
  json r = rpc.HandleRpc(mixed);
  EXPECT_EQ(r[1]["result"]["status"], "pending") << r.dump();
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

// get_task's network fields and node_work: what a node reads to act, through a one-round task.
TEST(Rpc, NodeWorkAndTaskProgress) {
  TestLedger t;
  KeyPair node = testing::KeyFromByte(20);
  const Hash256 kSeed = Blake2b("the node's secret seed");
  auto send = [&](const KeyPair& from, TxPayload p) {
    uint64_t nonce = t.shared->With([&](Chain& c) { return c.NextNonce(from.public_key()); });
    Transaction tx = BuildSignedTx(from, TestLedger::kChainId, nonce, p);
    json r = t.Call("send_tx", {{"tx", TxHex(tx)}});
    EXPECT_TRUE(r.contains("result")) << r.dump();
    EXPECT_TRUE(t.sequencer->ProduceOnce().ok());
    json got = t.Call("get_tx", {{"id", r["result"]["tx_id"]}});
    EXPECT_EQ(got["result"]["receipt"]["ok"], true) << got.dump();
  };
  send(t.alice, RegisterNodeTx{.node_id = node.public_key(),
                               .endpoint = "http://n:1",
                               .roles = kRoleSolver | kRoleAggregator,
                               .capabilities = {.memory_bytes = 1ull << 30,
                                                .throughput = 1'000'000'000'000,
                                                .latency_ms = 1,
                                                .bandwidth_bytes_per_s = 1'000'000'000},
                               .price = 2,
                               .stake = 100,
                               .secret_head = protocol::SecretChainElement(kSeed, 0)});
  Hash256 init = Blake2b("init");
  // An exact-mode task on a verifying chain: it must declare a data root.
  TaskParams params{.rounds = 1, .units_per_round = 2, .inner_steps = 2, .batch_size = 4,
                    .checkpoint_interval = 1, .flops_per_sample = 1000, .model_bytes = 40,
                    .num_examples = 10, .seed = 1, .initial_state = init,
                    .data_root = Blake2b("examples")};
  uint64_t nonce = t.shared->With([&](Chain& c) { return c.NextNonce(t.bob.public_key()); });
  Hash256 task = TaskIdFor(t.bob.public_key(), nonce);
  send(t.bob, SubmitTaskTx{.spec_hash = Blake2b("bundle"), .budget = 1000, .price_cap = 5,
                           .params = params});

  json work = t.Call("node_work", {{"id", node.public_key().ToHex()}})["result"];
  EXPECT_EQ(work["height"], 2);
  ASSERT_EQ(work["units"].size(), 2u) << work.dump();
  EXPECT_EQ(work["aggregations"].size(), 0u);
  const json& u0 = work["units"][0];
  EXPECT_EQ(u0["task_id"], task.ToHex());
  EXPECT_EQ(u0["index"], 0);
  EXPECT_EQ(u0["round"], 0);
  EXPECT_EQ(u0["shard"], 0);
  EXPECT_EQ(u0["start_state"], init.ToHex());
  EXPECT_EQ(u0["spec_hash"], Blake2b("bundle").ToHex());
  EXPECT_GT(u0["deadline_height"].get<uint64_t>(), 2u);

  json task_json = t.Call("get_task", {{"id", task.ToHex()}, {"units", true}})["result"];
  EXPECT_EQ(task_json["phase"], "training");
  EXPECT_EQ(task_json["round"], 0);
  EXPECT_EQ(task_json["aggregator"], nullptr);
  EXPECT_EQ(task_json["params"]["initial_state"], init.ToHex());
  EXPECT_EQ(task_json["weights_history"], json::array({init.ToHex()}));
  ASSERT_EQ(task_json["units"].size(), 2u);
  for (const char* k : {"index", "round", "shard", "status", "assignee", "deadline_height",
                        "result_hash", "commitment", "loss_micros", "paid"}) {
    EXPECT_TRUE(task_json["units"][1].contains(k)) << k;
  }
  EXPECT_EQ(task_json["units"][1]["status"], "assigned");
  EXPECT_EQ(task_json["units"][1]["assignee"], node.public_key().ToHex());

  const std::vector<Hash256> leaves = {Blake2b("s0"), Blake2b("s1"), Blake2b("s2")};
  for (uint32_t i = 0; i < 2; ++i) {
    send(t.alice, CommitUnitTx{.task_id = task, .index = i, .node_id = node.public_key(),
                               .result_hash = Blake2b("delta" + std::to_string(i)),
                               .commitment = MerkleRoot(leaves), .loss_micros = 5,
                               .secret_index = i + 1, .leaves = leaves});
  }
  work = t.Call("node_work", {{"id", node.public_key().ToHex()}})["result"];
  EXPECT_EQ(work["units"].size(), 0u);
  // Verification: both units are under check, this node as their solver; its next commit will
  // use the third element of its secret chain.
  EXPECT_EQ(work["next_secret_index"], 3);
  ASSERT_EQ(work["checks"].size(), 2u) << work.dump();
  EXPECT_EQ(work["checks"][0]["roles"], json::array({"solver"}));
  EXPECT_EQ(work["checks"][0]["secret_index"], 1);
  EXPECT_EQ(work["checks"][0]["check"]["solver"], node.public_key().ToHex());
  EXPECT_EQ(work["checks"][0]["solver_endpoint"], "http://n:1");
  EXPECT_TRUE(work["checks"][0]["check"]["stage"] == "awaiting_beacon" ||
              work["checks"][0]["check"]["stage"] == "commit_verdicts")
      << work["checks"][0].dump();
  EXPECT_EQ(t.Call("referee_work", json::object())["result"]["disputes"].size(), 0u);
  ASSERT_EQ(work["aggregations"].size(), 1u) << work.dump();
  const json& agg = work["aggregations"][0];
  EXPECT_EQ(agg["task_id"], task.ToHex());
  EXPECT_EQ(agg["round"], 0);
  EXPECT_EQ(agg["start_state"], init.ToHex());
  ASSERT_EQ(agg["units"].size(), 2u);
  EXPECT_EQ(agg["units"][1]["index"], 1);
  EXPECT_EQ(agg["units"][1]["shard"], 1);
  EXPECT_EQ(agg["units"][1]["node"], node.public_key().ToHex());
  EXPECT_EQ(agg["units"][1]["result_hash"], Blake2b("delta1").ToHex());
  task_json = t.Call("get_task", {{"id", task.ToHex()}})["result"];
  EXPECT_EQ(task_json["aggregator"]["node"], node.public_key().ToHex());
  EXPECT_EQ(task_json["aggregator"]["round"], 0);

  send(t.alice, CommitAggregateTx{.task_id = task, .round = 0, .node_id = node.public_key(),
                                  .state_hash = Blake2b("final"), .test_accuracy_ppm = 900'000,
                                  .test_loss_micros = 100});
  // The round is final once its checks settle: the solver reveals its secrets in the window.
  task_json = t.Call("get_task", {{"id", task.ToHex()}})["result"];
  EXPECT_EQ(task_json["phase"], "awaiting_verification_window");
  for (int i = 0; i < 30; ++i) {
    work = t.Call("node_work", {{"id", node.public_key().ToHex()}})["result"];
    if (work["checks"].size() == 2 && work["checks"][0]["check"]["stage"] == "reveal_verdicts") {
      break;
    }
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  for (uint32_t i = 0; i < 2; ++i) {
    send(t.alice, RevealSecretTx{.task_id = task, .index = i, .node_id = node.public_key(),
                                 .secret = protocol::SecretChainElement(kSeed, i + 1)});
  }
  for (int i = 0; i < 30; ++i) {
    task_json = t.Call("get_task", {{"id", task.ToHex()}})["result"];
    if (task_json["status"] != "open") break;
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  EXPECT_EQ(task_json["status"], "finished");
  EXPECT_EQ(task_json["phase"], "final");
  EXPECT_EQ(task_json["final_state"], Blake2b("final").ToHex());
  ASSERT_EQ(task_json["round_results"].size(), 1u);
  EXPECT_EQ(task_json["round_results"][0]["state"], Blake2b("final").ToHex());
  EXPECT_EQ(task_json["round_results"][0]["test_accuracy_ppm"], 900'000);
  work = t.Call("node_work", {{"id", node.public_key().ToHex()}})["result"];
  EXPECT_EQ(work["units"].size() + work["aggregations"].size(), 0u);
  EXPECT_EQ(ErrorCode(t.Call("node_work", {{"id", "zz"}})), kRpcInvalidParams);
}

}  // namespace
}  // namespace meshlearn::ledger
