// The node's chain client against a fake JSON-RPC server on loopback whose answers have the
// wrong shape: every one is an error that names the method and the field, never an abort
// (they were read with unchecked nlohmann access, which throws type_error).
#include "meshlearn/node/chain_client.h"

#include <httplib.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

namespace meshlearn::node {
namespace {

using nlohmann::json;

// Answers each method with the `result` (or the whole response) it is given.
class FakeLedger {
 public:
  FakeLedger() {
    server_.Post("/", [this](const httplib::Request& req, httplib::Response& res) {
      json request = json::parse(req.body, nullptr, false);
      std::string method = request.value("method", std::string());
      json answer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto whole = responses_.find(method);
        if (whole != responses_.end()) {
          answer = whole->second;
        } else {
          auto r = results_.find(method);
          answer = {{"jsonrpc", "2.0"},
                    {"id", request.value("id", json(nullptr))},
                    {"result", r == results_.end() ? json(nullptr) : r->second}};
        }
      }
      res.set_content(answer.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeLedger() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void SetResult(const std::string& method, json result) {
    std::lock_guard<std::mutex> lock(mu_);
    responses_.erase(method);
    results_[method] = std::move(result);
  }
  void SetResponse(const std::string& method, json response) {
    std::lock_guard<std::mutex> lock(mu_);
    responses_[method] = std::move(response);
  }

 private:
  std::mutex mu_;
  std::map<std::string, json> results_;
  std::map<std::string, json> responses_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

KeyPair Key(uint8_t b) {
  KeySeed seed;
  seed.bytes.fill(b);
  return KeyPair::FromSeed(seed);
}

// The error names the method and the field.
void ExpectNamed(const Status& s, const std::string& method, const std::string& field) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(method), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(field), std::string::npos) << s.ToString();
}

TEST(ChainClientHostile, WrongShapedAnswersAreErrorsNotAborts) {
  FakeLedger fake;
  HttpChainClient chain(fake.url(), {.connect_timeout_ms = 5000, .retries = 0});
  const std::string hex(64, 'a');

  fake.SetResult("chain_status", {{"chain_id", 5}, {"height", 1}});
  ExpectNamed(GetChainStatus(chain).status(), "chain_status", "result.chain_id");
  fake.SetResult("chain_status", {{"chain_id", "c"}, {"height", "x"}});
  ExpectNamed(GetChainStatus(chain).status(), "chain_status", "result.height");
  fake.SetResult("chain_status", "status");
  ExpectNamed(GetChainStatus(chain).status(), "chain_status", "result");

  fake.SetResult("wait_block", {{"height", -3}});
  ExpectNamed(WaitForBlockAbove(chain, 0, 10).status(), "wait_block", "result.height");

  json node = {{"id", hex}, {"owner", hex}, {"endpoint", 5}};
  fake.SetResult("get_node", node);
  ExpectNamed(GetNode(chain, Key(1).public_key()).status(), "get_node", "result.endpoint");
  fake.SetResult("list_nodes", {{"items", {{{"id", hex}, {"owner", hex}, {"stake", "lots"}}}}});
  ExpectNamed(ListNodes(chain).status(), "list_nodes", "result.items[0].stake");
  fake.SetResult("list_nodes", {{"items", json::array()}, {"next_cursor", "more"}});
  ExpectNamed(ListNodes(chain).status(), "list_nodes", "result.next_cursor");

  fake.SetResult("node_work", {{"height", 1}, {"units", {{{"task_id", hex}, {"index", "0"}}}}});
  ExpectNamed(GetNodeWork(chain, Key(1).public_key()).status(), "node_work",
              "result.units[0].index");
  fake.SetResult("node_work", {{"height", 1}, {"checks", "none"}});
  ExpectNamed(GetNodeWork(chain, Key(1).public_key()).status(), "node_work", "result.checks");
  fake.SetResult("node_work", {{"height", 1}, {"checks", {{{"task_id", hex}, {"index", 0}, {"round", 0},
                                                        {"shard", 0}, {"result_hash", hex},
                                                        {"commitment", hex},
                                                        {"assignment_beacon", hex},
                                                        {"secret_index", 1}, {"start_state", hex},
                                                        {"check", {{"stage", 4}}}}}}});
  ExpectNamed(GetNodeWork(chain, Key(1).public_key()).status(), "node_work",
              "result.checks[0].check.stage");

  fake.SetResult("get_task", {{"spec_hash", hex}, {"status", {{"open", true}}}});
  ExpectNamed(GetTask(chain, Hash256{}).status(), "get_task", "result.status");

  // The envelope itself: an error that is not an object, a message that is not a string.
  fake.SetResponse("chain_status", {{"jsonrpc", "2.0"}, {"id", 1}, {"error", 5}});
  EXPECT_FALSE(GetChainStatus(chain).ok());
  fake.SetResponse("chain_status",
                {{"jsonrpc", "2.0"}, {"id", 1}, {"error", {{"message", {1}}, {"data", 2}}}});
  EXPECT_FALSE(GetChainStatus(chain).ok());
}

TEST(ChainClientHostile, TxSenderSurvivesWrongShapes) {
  FakeLedger fake;
  HttpChainClient chain(fake.url(), {.connect_timeout_ms = 5000, .retries = 0});
  fake.SetResult("chain_status", {{"chain_id", "c"}, {"height", 1}});
  fake.SetResult("get_account", {{"nonce", "x"}});
  TxSender sender(&chain, Key(1));
  ExpectNamed(sender.Init(), "get_account", "result.nonce");

  fake.SetResult("get_account", {{"nonce", 0}});
  ASSERT_TRUE(sender.Init().ok());
  fake.SetResult("send_tx", {{"status", "pending"}});
  Result<Hash256> id = sender.Send(ledger::HeartbeatTx{.node_id = Key(2).public_key()});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  // get_tx answers of the wrong shape: an error from Poll, the transaction stays in flight.
  for (json answer : {json("included"), json{{"status", 1}},
                      json{{"status", "included"}, {"receipt", "ok"}},
                      json{{"status", "included"}, {"receipt", {{"ok", "yes"}}}},
                      json{{"status", "included"}, {"height", "x"}, {"receipt", {{"ok", true}}}}}) {
    fake.SetResult("get_tx", answer);
    Status s = sender.Poll();
    EXPECT_FALSE(s.ok()) << answer.dump();
    EXPECT_NE(s.message().find("get_tx"), std::string::npos) << s.ToString();
    EXPECT_EQ(sender.in_flight(), 1u) << answer.dump();
  }
  fake.SetResult("get_tx", {{"status", "rejected"}, {"error", "no"}});
  EXPECT_TRUE(sender.Poll().ok());
  EXPECT_EQ(sender.in_flight(), 0u);
}

}  // namespace
}  // namespace meshlearn::node
