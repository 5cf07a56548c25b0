// GET /metrics of the real `meshlearn chain serve` and `meshlearn node run` processes on loopback:
// both pages pass Prometheus's `promtool check metrics` (skipped, visibly, where Debian's
// prometheus package is not installed), and their numbers move as blocks arrive.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/prometheus.h"
#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::Child;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::HttpGet;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;

// The value of sample `series` on `page`, or -1 if the page has none.
double Value(const std::string& page, const std::string& series) {
  return meshlearn::PrometheusSample(page, series).value_or(-1);
}

// "" when promtool accepts `page`; its complaint otherwise.
std::string Promtool(const std::string& page, const std::string& dir) {
  const std::string file = dir + "/page.txt";
  std::ofstream(file) << page;
  CmdResult r = Shell("promtool check metrics < " + file + " 2>&1");
  return r.code == 0 ? "" : "exit " + std::to_string(r.code) + ": " + r.out;
}

bool HavePromtool() { return Shell("command -v promtool").code == 0; }

TEST(Metrics, ChainServeAndNodeRunServePrometheusText) {
  const std::string home = meshlearn::process_test::TempDir("metrics");
  const std::string config = home + "/node.toml";
  auto write_config = [&](const std::string& rpc) {
    std::ofstream(config) << "data_dir = \"node\"\nrpc = \"" << rpc << "\"\nlisten = \"127.0.0.1:0\"\nstake = 200\nheartbeat_blocks = 2\n"
                          << "[capabilities]\nthroughput = 1000000000\nmemory_bytes = 1073741824\n"
                          << "cores = 1\n";
  };
  write_config("http://127.0.0.1:1");  // node init does not call the ledger
  CmdResult init = Meshlearn("--json node init --config " + config, home);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string node_id = nlohmann::json::parse(init.out)["node_id"];

  ChainServer chain(home, "--fund " + node_id + "=1000000");
  ASSERT_FALSE(chain.url().empty()) << ReadText(home + "/serve.out");
  const std::string chain_addr = chain.url().substr(std::string("http://").size());
  write_config(chain.url());
  const std::string log = home + "/node.log";
  Child node(home, log, {"node", "run", "--config", config});
  // listen port 0: the node binds a free port and says which (listen.json in its data dir).
  const std::string node_addr = meshlearn::process_test::NodeEndpoint(node, home + "/node");
  ASSERT_FALSE(node_addr.empty()) << ReadText(log);

  // The node's page once it acted on a block, then again two blocks later.
  std::string node_first;
  for (int i = 0; i < 300 && Value(node_first, "meshlearn_node_chain_height") <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    node_first = HttpGet(node_addr, "/metrics");
  }
  ASSERT_GT(Value(node_first, "meshlearn_node_chain_height"), 0) << node_first << ReadText(log);
  EXPECT_NE(ReadText(log).find("metrics at http://" + node_addr + "/metrics"),
            std::string::npos);
  std::string node_second;
  const double h1 = Value(node_first, "meshlearn_node_chain_height");
  for (int i = 0; i < 300 && Value(node_second, "meshlearn_node_chain_height") < h1 + 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    node_second = HttpGet(node_addr, "/metrics");
  }
  EXPECT_GE(Value(node_second, "meshlearn_node_chain_height"), h1 + 2) << node_second;
  EXPECT_GT(Value(node_second, "meshlearn_node_ticks_total{outcome=\"ok\"}"),
            Value(node_first, "meshlearn_node_ticks_total{outcome=\"ok\"}"));
  EXPECT_EQ(Value(node_second, "meshlearn_node_work_total{kind=\"units_completed\"}"), 0);
  EXPECT_GT(Value(node_second, "meshlearn_node_blob_store_bytes{kind=\"quota\"}"), 0);
  // The agent's gauges are on the page before the node has done any work (0, not absent: -1).
  EXPECT_EQ(Value(node_second, "meshlearn_node_stage_evidence_bytes"), 0) << node_second;
  EXPECT_EQ(Value(node_second, "meshlearn_node_whole_model_moments_bytes"), 0) << node_second;
  EXPECT_EQ(Value(node_second, "meshlearn_node_whole_model_gradient_bytes"), 0) << node_second;

  // The ledger's page: the node registered (active), the supply is where genesis put it.
  std::string chain_page;
  for (int i = 0; i < 300 && Value(chain_page, "meshlearn_nodes{status=\"active\"}") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    chain_page = HttpGet(chain_addr, "/metrics");
  }
  EXPECT_EQ(Value(chain_page, "meshlearn_nodes{status=\"active\"}"), 1) << chain_page;
  EXPECT_EQ(Value(chain_page, "meshlearn_tokens{where=\"staked\"}"), 200) << chain_page;
  EXPECT_GT(Value(chain_page, "meshlearn_chain_height"), 0);
  EXPECT_GT(Value(chain_page, "meshlearn_rpc_requests_total{method=\"node_work\",code=\"ok\"}"), 0)
      << chain_page;

  if (!HavePromtool()) {
    GTEST_SKIP() << "promtool not installed (Debian package prometheus): the pages' format was "
                    "not checked by Prometheus";
  }
  EXPECT_EQ(Promtool(node_second, home), "") << node_second;
  EXPECT_EQ(Promtool(chain_page, home), "") << chain_page;
}

}  // namespace
