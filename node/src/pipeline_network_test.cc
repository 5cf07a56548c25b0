// Issue 15, the first "Done when": a pipeline task trained by real NodeAgents. An in-process
// ledger places every round's 2 replicas x 3 stages on six agents that serve and call each other
// over loopback HTTP (SimOptions::http); each agent runs its stage unit on a thread of its own
// beside its neighbours (Stager), commits it (CommitStage), and the round's aggregator applies it
// stage by stage (ApplyStageRound). The task ends on the ledger with `meshlearn diloco`'s weights,
// bit for bit.
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/test_dir.h"
#include "meshlearn/node/state_blob.h"
#include "testing/pipeline_task.h"
#include "testing/sim_harness.h"

namespace meshlearn::node {
namespace {

using nlohmann::json;

// Six agents serving on loopback HTTP, kPipelineGptTask submitted, on a chain without
// verification (stage units are not verified yet: the ledger refuses them there).
testing::SimOptions PipelineSimOptions(uint64_t seed, const std::string& dir) {
  testing::SimOptions opt;
  opt.seed = seed;
  opt.nodes = 6;
  opt.env = Env::Default();
  opt.root = TestDir(dir);
  opt.http = true;
  // kPipelineGptTask ends with its [network] table: the submitter's terms go there.
  opt.task_toml = std::string(kPipelineGptTask) + "budget = 100000000000\nprice_cap = 1000\n";
  opt.tweak_genesis = [](ledger::Genesis& g) {
    g.params.verification = false;
    // Blocks are made as fast as the test's loop turns while stages train in real time: no unit
    // may expire for that.
    g.params.min_deadline_blocks = 1'000'000;
  };
  return opt;
}

TEST(PipelineNetworkTest, SixAgentsTrainTwoReplicasOfThreeStagesBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  ASSERT_EQ(o.net.stages, 3u);
  ASSERT_EQ(o.net.units_per_round, 2u);

  testing::SimOptions opt = PipelineSimOptions(15, "pipeline-network");
  std::set<int> stage_nodes_committed;
  std::mutex mu;
  opt.log_sink = [&](int node, const std::string& line) {
    if (line.find("(CommitStage)") != std::string::npos) {
      std::lock_guard<std::mutex> lock(mu);
      stage_nodes_committed.insert(node);
    }
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  // The ledger places stages on live nodes: blocks go on while the stage threads train.
  bool finished = false;
  for (int b = 0; b < 20'000 && !finished; ++b) {
    json t = sim.Task(false);
    ASSERT_FALSE(t.contains("error")) << t.dump();
    finished = t.value("status", std::string()) == "finished";
    if (finished) break;
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(finished) << sim.Task(true).dump().substr(0, 3000);
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  // Every agent ran a stage (six stage units a round, one per node).
  EXPECT_EQ(stage_nodes_committed.size(), 6u);
}

// A stage whose steps fail (here node 5's own, by a 1 ms step deadline; its neighbours then wait
// for it past their 3 s deadlines: a silent neighbour) commits nothing: no CommitStage from any
// stage of its replica, and the round is not aggregated. Every failed run is logged and the unit
// runs again while it stays assigned.
TEST(PipelineNetworkTest, AStageWhoseStepsFailCommitsNothingOfItsReplica) {
  testing::SimOptions opt = PipelineSimOptions(16, "pipeline-network-fail");
  opt.agent_options = [](int node, AgentOptions& a) {
    a.stage_plane.step_deadline_ms = node == 5 ? 1 : 3'000;
  };
  std::mutex mu;
  std::vector<std::pair<int, std::string>> lines;
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back({node, line});
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  // Until node 5 has failed twice (it runs its unit again after the first failure).
  auto failures_of_5 = [&] {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [node, line] : lines) {
      n += node == 5 && line.find("failed (nothing committed)") != std::string::npos;
    }
    return n;
  };
  for (int b = 0; b < 20'000 && failures_of_5() < 2; ++b) {
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(failures_of_5(), 2);
  std::lock_guard<std::mutex> lock(mu);
  std::string replica;  // "replica R " of node 5's unit, from its "training" line
  for (const auto& [node, line] : lines) {
    const size_t at = line.find(" replica ");
    if (node == 5 && at != std::string::npos && line.find(": training") != std::string::npos) {
      replica = line.substr(at, line.find(" stage ", at + 1) - at);
    }
  }
  ASSERT_FALSE(replica.empty());
  for (const auto& [node, line] : lines) {
    if (line.find("(CommitStage)") == std::string::npos) continue;
    EXPECT_NE(node, 5) << line;
    EXPECT_EQ(line.find(replica + " stage "), std::string::npos)
        << "a stage of node 5's replica committed: " << line;
  }
  const json t = sim.Task(false);
  EXPECT_NE(t.value("status", std::string()), "finished") << t.dump();
}

}  // namespace
}  // namespace meshlearn::node
