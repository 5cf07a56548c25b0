// The task audit (task_audit.h) against whole networks in one process (testing/sim_harness.h):
// an honest network's record re-executes to every hash; a lazy solver's units are named; a
// record with one wrong hash fails at that hash; a sample is reproducible by its seed and
// rebuilds the start states nobody serves.
#include "meshlearn/node/task_audit.h"

#include <set>

#include <gtest/gtest.h>

#include "meshlearn/node/adversary.h"
#include "testing/sim_harness.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node {
namespace {

using nlohmann::json;
using testing::SimHarness;

// Blobs as the nodes hold them (every state and delta stays in their stores: no quota), except
// `refused`, which nobody serves.
BlobGetter NodeBlobs(SimHarness* sim, int nodes, std::set<std::string> refused = {}) {
  return [sim, nodes, refused](const Hash256& id) -> Result<Bytes> {
    if (refused.count(id.ToHex())) return NotFound("no node serves " + id.ShortHex());
    for (int i = 0; i < nodes; ++i) {
      if (sim->store(i)->HasBlob(net::BlobId{id})) return sim->store(i)->Get(net::BlobId{id});
    }
    return NotFound("no node has blob " + id.ShortHex());
  };
}

// 3 rounds x 3 units x H=4 (k=2) of the synthetic task on 3 nodes, run to the end.
struct Network {
  MemEnv env;
  std::unique_ptr<SimHarness> sim;
  json task;
  explicit Network(std::function<void(int, AgentOptions&)> agent_options = nullptr) {
    Result<std::string> toml =
        testing::WriteSyntheticTask(&env, "/data", 31, 480, 160, 32, 4,
                                    /*rounds=*/3, /*units=*/3, /*h=*/4, /*k=*/2);
    EXPECT_TRUE(toml.ok()) << toml.status().ToString();
    sim = std::make_unique<SimHarness>(testing::SimOptions{
        .seed = 31, .nodes = 3, .task_toml = *toml, .agent_options = agent_options, .env = &env});
    Status s = sim->Setup();
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = sim->RunUntilFinished(400);
    EXPECT_TRUE(s.ok()) << s.ToString();
    task = sim->Task(true);
    EXPECT_EQ(task.value("status", std::string()), "finished") << task.dump();
  }
  Result<AuditReport> Audit(const json& record, AuditOptions o,
                            std::set<std::string> refused = {}) {
    o.work_dir = "/audit";
    return AuditTaskRecord(&env, record, NodeBlobs(sim.get(), 3, std::move(refused)), o);
  }
};

class TaskAuditTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { honest_ = new Network(); }
  static void TearDownTestSuite() {
    delete honest_;
    honest_ = nullptr;
  }
  static Network* honest_;
};
Network* TaskAuditTest::honest_ = nullptr;

TEST_F(TaskAuditTest, FullAuditOfAnHonestNetworkPasses) {
  Result<AuditReport> r = honest_->Audit(honest_->task, {.full = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass) << r->first_mismatch;
  EXPECT_EQ(r->units_executed, 9u);
  ASSERT_EQ(r->chain.size(), 5u);  // initial, rounds 0..2, final
  for (const AuditState& s : r->chain) {
    EXPECT_EQ(s.check, AuditCheck::kAuditCheckPass) << s.name << ": " << s.note;
    EXPECT_EQ(s.computed, s.recorded) << s.name;
  }
  EXPECT_EQ(r->chain.back().recorded.ToHex(), honest_->task["final_state"].get<std::string>());
  for (const AuditUnit& u : r->units) {
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckPass) << u.index << ": " << u.note;
  }
  json j = AuditReportToJson(*r);
  EXPECT_EQ(j["verdict"], "PASS");
  EXPECT_EQ(j["units"].size(), 9u);
}

json& Unit(json& task, uint32_t index) {
  for (json& u : task["units"]) {
    if (u["index"] == index) return u;
  }
  ADD_FAILURE() << "no unit " << index;
  return task;
}

// Each record below differs from the honest one in one hash (a state also in weights_history,
// where the ledger keeps what each round trained from); the audit fails at that hash.
TEST_F(TaskAuditTest, ARecordWithOneWrongHashFailsThere) {
  const std::string other = std::string(63, '0') + "1";
  struct Case {
    std::function<void(json&)> tamper;
    std::string expect;
  };
  const Case cases[] = {
      {[&](json& t) { Unit(t, 4)["commitment"] = other; }, "round 1 unit 4"},
      {[&](json& t) { Unit(t, 7)["result_hash"] = other; }, "round 2 unit 7"},
      {[&](json& t) {
         t["round_results"][1]["state"] = other;
         t["weights_history"][2] = other;
       },
       "round 1 state"},
      {[&](json& t) {
         t["params"]["initial_state"] = other;
         t["weights_history"][0] = other;
       },
       "initial state"},
      {[&](json& t) { t["final_state"] = other; }, "final_state"},
      // A declared data root that is not the bundle's data: the task is refused as a whole.
      {[&](json& t) { t["params"]["data_root"] = other; },
       "task bundle: the submitter's data_root does not match the data in the bundle"},
  };
  for (const Case& c : cases) {
    json t = honest_->task;
    c.tamper(t);
    Result<AuditReport> r = honest_->Audit(t, {.full = true});
    ASSERT_TRUE(r.ok()) << c.expect << ": " << r.status().ToString();
    EXPECT_FALSE(r->pass) << c.expect;
    EXPECT_EQ(r->first_mismatch.rfind(c.expect, 0), 0u) << c.expect << " vs " << r->first_mismatch;
  }
  // A wrong commitment: that unit fails, every other unit and state still passes.
  json t = honest_->task;
  Unit(t, 4)["commitment"] = other;
  Result<AuditReport> r = honest_->Audit(t, {.full = true});
  ASSERT_TRUE(r.ok());
  for (const AuditUnit& u : r->units) {
    EXPECT_EQ(u.check, u.index == 4 ? AuditCheck::kAuditCheckFail : AuditCheck::kAuditCheckPass)
        << u.index;
  }
  EXPECT_NE(r->first_mismatch.find("commitment recorded " + other), std::string::npos)
      << r->first_mismatch;
}

TEST_F(TaskAuditTest, AnOpenTaskIsRefused) {
  json t = honest_->task;
  t["status"] = "open";
  Result<AuditReport> r = honest_->Audit(t, {.full = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("still open"), std::string::npos) << r.status().ToString();
}

// A record that claims pipeline stages its bundle does not cut is not re-run as stages (nor its
// units as whole-model units): it fails at the bundle. A pipeline task's audit is
// PipelineAuditTest (stage_test).
TEST_F(TaskAuditTest, ARecordWithStagesItsBundleDoesNotCutFailsAtTheBundle) {
  json t = honest_->task;
  t["params"]["stages"] = 3;
  Result<AuditReport> r = honest_->Audit(t, {.full = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  EXPECT_EQ(r->first_mismatch.rfind("task bundle: ", 0), 0u) << r->first_mismatch;
  EXPECT_EQ(r->units_executed, 0u);
}

TEST_F(TaskAuditTest, ASampleIsReproducibleAndRebuildsStatesNobodyServes) {
  Result<AuditReport> a = honest_->Audit(honest_->task, {.sample = 2, .seed = 5});
  Result<AuditReport> b = honest_->Audit(honest_->task, {.sample = 2, .seed = 5});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_TRUE(a->pass) << a->first_mismatch;
  std::vector<uint32_t> sa, sb;
  for (const AuditUnit& u : a->units)
    if (u.sampled) sa.push_back(u.index);
  for (const AuditUnit& u : b->units)
    if (u.sampled) sb.push_back(u.index);
  EXPECT_EQ(sa.size(), 2u);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(a->units_executed, 2u);  // every start state was served: no rebuild

  // Nobody serves the round states any more: a sampled unit of round 2 needs rounds 0 and 1
  // rebuilt from the initial weights (which checks them completely), or is refused over the cap.
  std::set<std::string> states;
  for (const json& rr : honest_->task["round_results"])
    states.insert(rr["state"].get<std::string>());
  uint64_t seed = 0;
  for (uint64_t s = 1; s < 100 && seed == 0; ++s) {
    Result<AuditReport> probe = honest_->Audit(honest_->task, {.sample = 1, .seed = s});
    ASSERT_TRUE(probe.ok());
    for (const AuditUnit& u : probe->units) {
      if (u.sampled && u.round == 2) seed = s;
    }
  }
  ASSERT_NE(seed, 0u);
  Result<AuditReport> c = honest_->Audit(honest_->task, {.sample = 1, .seed = seed}, states);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->pass) << c->first_mismatch;
  EXPECT_EQ(c->units_executed, 7u);  // rounds 0 and 1, and the sampled unit
  EXPECT_EQ(c->chain[1].check, AuditCheck::kAuditCheckPass);
  EXPECT_EQ(c->chain[2].check, AuditCheck::kAuditCheckPass);
  EXPECT_EQ(c->chain[3].check, AuditCheck::kAuditCheckSkipped);  // round 2's aggregate

  Result<AuditReport> d =
      honest_->Audit(honest_->task, {.sample = 1, .seed = seed, .max_rebuild_units = 5}, states);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("--full"), std::string::npos) << d.status().ToString();
}

// A lazy solver (adversary mode: every other inner step skipped) commits units the ledger
// accepts today; the audit re-executes them and names each one. Its deltas are still in the
// nodes' stores, so the aggregates are recomputed from what was committed and match: the
// aggregators were honest.
TEST(TaskAuditAdversaryTest, ALazySolversUnitsFailAndAreNamed) {
  Network lazy([](int node, AgentOptions& o) {
    if (node == 0) o.adversary = Adversary::kLazy;
  });
  Result<AuditReport> r = lazy.Audit(lazy.task, {.full = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  const std::string cheat = lazy.sim->node_key(0).public_key().ToHex();
  int cheats = 0;
  const AuditUnit* first = nullptr;
  for (const AuditUnit& u : r->units) {
    const bool lazy_unit = u.assignee == cheat;
    EXPECT_EQ(u.check, lazy_unit ? AuditCheck::kAuditCheckFail : AuditCheck::kAuditCheckPass)
        << u.index << " " << u.note;
    if (lazy_unit) {
      ++cheats;
      if (first == nullptr) first = &u;
    }
  }
  ASSERT_GT(cheats, 0) << lazy.task.dump();
  EXPECT_EQ(r->first_mismatch.rfind("round " + std::to_string(first->round) + " unit " +
                                        std::to_string(first->index) + " ",
                                    0),
            0u)
      << r->first_mismatch;
  EXPECT_NE(r->first_mismatch.find(cheat.substr(0, 16)), std::string::npos) << r->first_mismatch;
  for (const AuditState& s : r->chain) {
    EXPECT_EQ(s.check, AuditCheck::kAuditCheckPass) << s.name << ": " << s.note;
  }
}

}  // namespace
}  // namespace meshlearn::node
