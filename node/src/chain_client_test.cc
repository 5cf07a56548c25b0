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

#include "meshlearn/ledger/state.h"

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
  fake.SetResult(
      "node_work",
      {{"height", 1},
       {"stage_units", {{{"task_id", hex}, {"round", 0}, {"replica", "one"}, {"stage", 0}}}}});
  ExpectNamed(GetNodeWork(chain, Key(1).public_key()).status(), "node_work",
              "result.stage_units[0].replica");
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

// The task, unit and check records are strict: a field this node does not know, or a missing
// one, is an error naming it (a renamed field must not silently read as 0). The well-formed
// records come from the ledger's own writers (TaskToJson, WorkUnitToJson).
json GoodTask() {
  ledger::TaskRecord t;
  t.params.inner_steps = 8;
  return ledger::TaskToJson(t);
}

json GoodUnit() {
  ledger::WorkUnit u;
  u.status = ledger::WorkUnitStatus::kCommitted;
  return ledger::WorkUnitToJson(u);
}

// A node_work check entry as the ledger writes it (ledger/src/rpc.cc node_work).
json GoodCheck() {
  const std::string hex(64, 'a');
  json c = GoodUnit();
  c["check"] = {{"stage", "commit_verdicts"}, {"result", "pending"}, {"reason", ""},
                {"solver", hex},             {"commit_height", 3}, {"deadline_height", 9},
                {"verifiers", {hex}},        {"segments", {0}},    {"num_segments", 2},
                {"dispute", nullptr}};
  c["roles"] = {"verifier"};
  c["start_state"] = hex;
  c["spec_hash"] = hex;
  c["solver_endpoint"] = "127.0.0.1:1";
  return c;
}

json WorkWith(json check) {
  return {{"height", 1}, {"units", json::array()}, {"aggregations", json::array()},
          {"checks", {std::move(check)}}, {"next_secret_index", 1}};
}

TEST(ChainClientRecords, WellFormedRecordsDecodeTyped) {
  const json task = GoodTask();  // RpcAnswer is a view: the JSON must outlive it
  Result<TaskInfo> t = ParseTask(ledger::RpcAnswer("get_task", task));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->params.inner_steps, 8u);
  EXPECT_EQ(t->status, ledger::TaskStatus::kOpen);
  json with_units = GoodTask();
  with_units["units"] = {GoodUnit()};
  t = ParseTask(ledger::RpcAnswer("get_task", with_units));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->units.size(), 1u);
  EXPECT_EQ(t->units[0].status, ledger::WorkUnitStatus::kCommitted);

  Result<NodeWork> w = ParseNodeWork(WorkWith(GoodCheck()));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->checks.size(), 1u);
  EXPECT_EQ(w->checks[0].stage, protocol::CheckStage::kCheckCommitVerdicts);
  EXPECT_EQ(w->checks[0].result, protocol::CheckResult::kCheckPending);
  EXPECT_TRUE(w->checks[0].HasRole(CheckRole::kCheckRoleVerifier));
  EXPECT_FALSE(w->checks[0].HasRole(CheckRole::kCheckRoleSolver));
}

TEST(ChainClientRecords, TaskWithAMissingOrUnknownFieldIsRefusedNamingIt) {
  json task = GoodTask();
  task["params"].erase("inner_steps");
  Status s = ParseTask(ledger::RpcAnswer("get_task", task)).status();
  ExpectNamed(s, "get_task", "result.params.inner_steps");
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.ToString();

  task = GoodTask();
  task["params"]["inner_stepz"] = 8;  // a renamed field
  s = ParseTask(ledger::RpcAnswer("get_task", task)).status();
  ExpectNamed(s, "get_task", "result.params.inner_stepz");
  EXPECT_NE(s.message().find("not a field"), std::string::npos) << s.ToString();

  task = GoodTask();
  task.erase("weights_history");
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.weights_history");
  task = GoodTask();
  task.erase("budget");  // not read by a node, still part of the record
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.budget");
  task = GoodTask();
  task["colour"] = "blue";
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.colour");
  task = GoodTask();
  task["status"] = "paused";  // not a TaskStatus name
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.status");
}

TEST(ChainClientRecords, UnitWithAMissingOrUnknownFieldIsRefusedNamingIt) {
  json task = GoodTask();
  task["units"] = {GoodUnit()};
  task["units"][0].erase("assignee");
  Status s = ParseTask(ledger::RpcAnswer("get_task", task)).status();
  ExpectNamed(s, "get_task", "result.units[0].assignee");
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.ToString();

  task["units"] = {GoodUnit()};
  task["units"][0]["assigned_to"] = std::string(64, 'a');
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.units[0].assigned_to");
  task["units"] = {GoodUnit()};
  task["units"][0]["status"] = "done";
  ExpectNamed(ParseTask(ledger::RpcAnswer("get_task", task)).status(), "get_task",
              "result.units[0].status");
}

TEST(ChainClientRecords, CheckWithAMissingOrUnknownFieldIsRefusedNamingIt) {
  json check = GoodCheck();
  check["check"].erase("deadline_height");
  Status s = ParseNodeWork(WorkWith(check)).status();
  ExpectNamed(s, "node_work", "result.checks[0].check.deadline_height");
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s.ToString();

  check = GoodCheck();
  check["check"]["deadline"] = 9;
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].check.deadline");
  check = GoodCheck();
  check.erase("solver_endpoint");
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].solver_endpoint");
  check = GoodCheck();
  check["check"]["stage"] = "voting";  // not a CheckStage name
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].check.stage");
  check = GoodCheck();
  check["roles"] = {"auditor"};  // not a role
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work", "result.checks[0].roles[0]");
  // A dispute in the steps stage must carry its query.
  check = GoodCheck();
  check["check"]["dispute"] = {{"stage", "steps"},      {"defender", std::string(64, 'a')},
                               {"challenger", std::string(64, 'b')}, {"first_step", 0},
                               {"last_step", 4},        {"agreed", std::string(64, 'c')},
                               {"turns", 0}};
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].check.dispute.query");
  check["check"]["dispute"]["query"] = {{"position", 2}, {"step", 2}, {"deadline_height", 7}};
  Result<NodeWork> w = ParseNodeWork(WorkWith(check));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->checks[0].dispute.has_value());
  EXPECT_EQ(w->checks[0].dispute->stage, protocol::DisputeStage::kDisputeSteps);
  EXPECT_EQ(w->checks[0].dispute->position, 2u);
}

// A stage unit's steps served on chain (node_work "served", rpc.h): each its game step, the
// ruling's height and the claimant, typed; absent on every other check; a step that is not one of
// the unit's, or a field missing or unknown, is refused naming it.
TEST(ChainClientRecords, ACheckListsTheStageStepsServedOnChain) {
  const std::string a(64, 'a');
  json check = GoodCheck();
  check["leaves"] = {a, a, a};  // the commitment and two steps
  Result<NodeWork> w = ParseNodeWork(WorkWith(check));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE(w->checks[0].served.empty());
  check["served"] = {{{"step", 2}, {"height", 40}, {"challenger", a}}};
  w = ParseNodeWork(WorkWith(check));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->checks[0].served.size(), 1u);
  EXPECT_EQ(w->checks[0].served[0].step, 2u);
  EXPECT_EQ(w->checks[0].served[0].height, 40u);
  EXPECT_EQ(w->checks[0].served[0].challenger.ToHex(), a);
  ASSERT_NE(w->checks[0].ServedStep(2), nullptr);
  EXPECT_EQ(w->checks[0].ServedStep(1), nullptr);
  for (const json& bad : {json{{"step", 3}, {"height", 40}, {"challenger", a}},
                          json{{"step", 0}, {"height", 40}, {"challenger", a}}}) {
    check["served"] = {bad};
    ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
                "result.checks[0].served[0].step");
  }
  check["served"] = {{{"step", 1}, {"challenger", a}}};
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].served[0].height");
  check["served"] = {{{"step", 1}, {"height", 4}, {"challenger", a}, {"piece", 0}}};
  ExpectNamed(ParseNodeWork(WorkWith(check)).status(), "node_work",
              "result.checks[0].served[0].piece");
}

// A pipeline task's aggregation inputs carry each stage unit's commitment and step commits blob
// (null: none named); a unit task's have neither, and decode with both zero.
TEST(ChainClientRecords, AggregationInputsCarryAStageUnitsCommitmentAndStepCommits) {
  const std::string a(64, 'a'), b(64, 'b'), c(64, 'c');
  const json stage_input = {{"index", 3},       {"shard", 3},      {"node", a},
                            {"result_hash", b}, {"commitment", c}, {"stage_commits", a}};
  json plain_input = {{"index", 1}, {"shard", 1}, {"node", a}, {"result_hash", b}};
  json unnamed = stage_input;
  unnamed["stage_commits"] = nullptr;
  auto work = [&](json inputs) {
    return json{{"height", 1},
                {"units", json::array()},
                {"aggregations",
                 {{{"task_id", a},
                   {"round", 0},
                   {"deadline_height", 9},
                   {"start_state", b},
                   {"spec_hash", c},
                   {"units", std::move(inputs)}}}},
                {"checks", json::array()},
                {"next_secret_index", 1}};
  };
  Result<NodeWork> w = ParseNodeWork(work({stage_input, plain_input, unnamed}));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->aggregations.size(), 1u);
  const std::vector<AggregationInput>& in = w->aggregations[0].units;
  ASSERT_EQ(in.size(), 3u);
  EXPECT_EQ(in[0].commitment.ToHex(), c);
  EXPECT_EQ(in[0].stage_commits.ToHex(), a);
  EXPECT_TRUE(in[1].commitment.IsZero());
  EXPECT_TRUE(in[1].stage_commits.IsZero());
  EXPECT_EQ(in[2].commitment.ToHex(), c);
  EXPECT_TRUE(in[2].stage_commits.IsZero());
  // Strict as every record: a field the node does not know is refused, naming it.
  plain_input["stage_commitz"] = a;
  ExpectNamed(ParseNodeWork(work({plain_input})).status(), "node_work",
              "result.aggregations[0].units[0].stage_commitz");
}

}  // namespace
}  // namespace meshlearn::node
