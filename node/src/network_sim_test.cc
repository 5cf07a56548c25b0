// Whole-network tests in one process: a ledger, a simulated network and NodeAgents driven block
// by block (testing/sim_harness.h). The network's final global state must equal RunLocalDiloco's
// bit for bit: the same unit streams, the same aggregation, the same outer steps.
#include <gtest/gtest.h>

#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/unit_executor.h"
#include "testing/sim_harness.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node {
namespace {

using nlohmann::json;
using testing::SimHarness;
using testing::SimOptions;

std::vector<float> LocalReference(Env* env, const std::string& toml) {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(toml, "ref.toml", "");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(toml, "ref.toml");
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  EXPECT_TRUE(net.ok());
  auto trainer = engine::Trainer::Create(env, *spec);
  EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
  Result<LocalDilocoResult> r = RunLocalDiloco(trainer->get(), *net, {.eval_every_round = false});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->final_weights : std::vector<float>{};
}

void ExpectEveryUnitPaid(const json& task, uint32_t expected_units) {
  ASSERT_TRUE(task.contains("units")) << task.dump();
  EXPECT_EQ(task["units"].size(), expected_units);
  for (const json& u : task["units"]) {
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
  }
}

struct Fixture {
  MemEnv env;
  std::string toml;
  Fixture(uint64_t seed, uint32_t rounds, uint32_t units, uint32_t h, uint32_t k) {
    Result<std::string> t =
        testing::WriteSyntheticTask(&env, "/data", seed, 480, 160, 32, 4, rounds, units, h, k);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    toml = *t;
  }
};

TEST(NetworkSimTest, ThreeNodesTrainLikeLocalDiloco) {
  Fixture f(11, /*rounds=*/2, /*units=*/3, /*H=*/5, /*k=*/2);
  SimHarness sim({.seed = 11, .nodes = 3, .task_toml = f.toml, .env = &f.env});
  ASSERT_TRUE(sim.Setup().ok() || (ADD_FAILURE() << sim.Setup().ToString(), false));
  Status run = sim.RunUntilFinished(300);
  ASSERT_TRUE(run.ok()) << run.ToString();

  json task = sim.Task(true);
  EXPECT_EQ(task.value("status", std::string()), "finished");
  ExpectEveryUnitPaid(task, 6);
  EXPECT_EQ(task["round_results"].size(), 2u) << task.dump();

  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  std::vector<float> reference = LocalReference(&f.env, f.toml);
  ASSERT_EQ(final_state->weights.size(), reference.size());
  EXPECT_EQ(HashFloats(final_state->weights), HashFloats(reference));
  EXPECT_TRUE(sim.Totals().Check().ok());
  uint64_t done = 0;
  for (int i = 0; i < 3; ++i) done += sim.agent(i)->stats().units_completed;
  EXPECT_EQ(done, 6u);
}

TEST(NetworkSimTest, KilledMidUnitResumesFromCheckpoint) {
  Fixture f(12, /*rounds=*/2, /*units=*/3, /*H=*/6, /*k=*/2);
  SimHarness* simp = nullptr;
  int crashed = -1;
  SimHarness sim({.seed = 12, .nodes = 3, .task_toml = f.toml, .env = &f.env});
  simp = &sim;
  ASSERT_TRUE(sim.Setup().ok());
  // Every node crashes after the checkpoint at step 4 of its first unit; restarted one block
  // later, it must resume there (not start over) and still give the reference bits.
  for (int i = 0; i < 3; ++i) {
    sim.Kill(i);
    ASSERT_TRUE(sim.Restart(i, [&, i](AgentOptions& o) {
                     o.after_checkpoint = [&, i](const Hash256&, uint32_t, int64_t step) -> Status {
                       if (step == 4 && crashed == -1) {
                         crashed = i;
                         return Internal("crash: simulated kill -9");
                       }
                       return Status::Ok();
                     };
                   }).ok());
  }
  for (int b = 0; b < 300; ++b) {
    if (sim.Task(false).value("status", std::string()) == "finished") break;
    Status s = sim.Step();
    if (!s.ok()) {
      ASSERT_NE(s.message().find("crash: simulated"), std::string::npos) << s.ToString();
      ASSERT_GE(crashed, 0);
      simp->Kill(crashed);
      ASSERT_TRUE(simp->Step().ok());
      ASSERT_TRUE(simp->Restart(crashed, [](AgentOptions& o) { o.after_checkpoint = nullptr; }).ok());
    }
  }
  ASSERT_GE(crashed, 0);
  json task = sim.Task(true);
  ASSERT_EQ(task.value("status", std::string()), "finished") << task.dump();
  EXPECT_EQ(sim.agent(crashed)->stats().units_resumed, 1u);
  ExpectEveryUnitPaid(task, 6);
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), HashFloats(LocalReference(&f.env, f.toml)));
}

TEST(NetworkSimTest, RefusesUnitsThatDoNotFitInMemory) {
  Fixture f(13, /*rounds=*/1, /*units=*/2, /*H=*/3, /*k=*/0);
  std::vector<std::string> logs;
  SimHarness sim({.seed = 13,
                  .nodes = 2,
                  .task_toml = f.toml,
                  .node_options = {{}, {.memory_bytes = 1}},
                  .env = &f.env});
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(300);
  ASSERT_TRUE(run.ok()) << run.ToString();
  // The scheduler never gives the 1-byte node a unit; node 0 did all the work.
  EXPECT_EQ(sim.agent(0)->stats().units_completed, 2u);
  EXPECT_EQ(sim.agent(1)->stats().units_completed, 0u);
}

TEST(NetworkSimTest, HalfSpeedNodeGetsAboutHalfTheUnits) {
  Fixture f(14, /*rounds=*/2, /*units=*/28, /*H=*/2, /*k=*/1);
  SimHarness sim({.seed = 14,
                  .nodes = 4,
                  .task_toml = f.toml,
                  .node_options = {{}, {}, {}, {.speed_factor = 0.5}},
                  // Slow enough that compute, not the 2 ms latency, dominates a unit's time.
                  .throughput = 1'000'000,
                  .env = &f.env});
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  Status run = sim.RunUntilFinished(400);
  ASSERT_TRUE(run.ok()) << run.ToString();
  double fast = 0;
  for (int i = 0; i < 3; ++i) fast += sim.agent(i)->stats().units_completed;
  fast /= 3;
  double slow = sim.agent(3)->stats().units_completed;
  EXPECT_GT(slow, 0.3 * fast);
  EXPECT_LT(slow, 0.7 * fast) << "slow " << slow << " fast " << fast;
  Result<GlobalState> st = sim.FinalState();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&f.env, f.toml)));
}

Hash256 RunFiftyNodes(uint64_t seed) {
  Fixture f(seed, /*rounds=*/2, /*units=*/25, /*H=*/4, /*k=*/2);
  SimHarness sim({.seed = seed, .nodes = 50, .task_toml = f.toml, .env = &f.env});
  Status s = sim.Setup();
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = sim.RunUntilFinished(400);
  EXPECT_TRUE(s.ok()) << s.ToString();
  json task = sim.Task(true);
  ExpectEveryUnitPaid(task, 50);
  Result<GlobalState> st = sim.FinalState();
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (!st.ok()) return Hash256{};
  EXPECT_EQ(HashFloats(st->weights), HashFloats(LocalReference(&f.env, f.toml)));
  int workers = 0;
  for (int i = 0; i < 50; ++i) workers += sim.agent(i)->stats().units_completed > 0;
  EXPECT_GE(workers, 20);
  return HashFloats(st->weights);
}

TEST(NetworkSimTest, FiftyNodesSameSeedSameFinalState) {
  Hash256 a = RunFiftyNodes(21);
  Hash256 b = RunFiftyNodes(21);
  EXPECT_FALSE(a.IsZero());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace meshlearn::node
