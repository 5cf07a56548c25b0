// Issue 15, the first "Done when": a pipeline task trained by real NodeAgents. An in-process
// ledger places every round's 2 replicas x 3 stages on six agents that serve and call each other
// over loopback HTTP (SimOptions::http); each agent runs its stage unit on a thread of its own
// beside its neighbours (Stager), commits it (CommitStage), and the round's aggregator applies it
// stage by stage (ApplyStageRound). The task ends on the ledger with `meshlearn diloco`'s weights,
// bit for bit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/home_layout.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "testing/pipeline_task.h"
#include "testing/sim_harness.h"

namespace meshlearn::node {
namespace {

using nlohmann::json;

// Six agents serving on loopback HTTP, kPipelineGptTask submitted, on a chain without
// verification (VerifyingPipelineSimOptions turns it on).
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

// The same on a verifying chain (docs/verification.md, "Pipeline stages"): seven agents, each a
// solver, aggregator and verifier (a stage unit is verified by a node of another replica, or the
// seventh), every step of every checked stage unit replayed, a referee (node/referee.h) for the
// stage steps disputed. Blocks are made as fast as the loop turns while stages train and
// verifiers replay in real time: no window may close for that (each closes early once every
// party has acted).
testing::SimOptions VerifyingPipelineSimOptions(uint64_t seed, const std::string& dir) {
  testing::SimOptions opt = PipelineSimOptions(seed, dir);
  opt.log = std::getenv("MESHLEARN_SIM_LOG") != nullptr;  // every agent's log to stderr
  opt.nodes = 7;
  opt.referee = true;
  opt.node_options.resize(7);
  for (testing::SimNodeOptions& n : opt.node_options) {
    n.roles = ledger::kRoleSolver | ledger::kRoleAggregator | ledger::kRoleVerifier;
  }
  opt.tweak_genesis = [](ledger::Genesis& g) {
    g.params.verification = true;
    g.params.verify_segments_per_check = 64;
    g.params.forced_error_per_million = 0;
    g.params.verifiers_per_unit = 1;
    g.params.min_deadline_blocks = 1'000'000;
    g.params.verdict_commit_blocks = 1'000'000;
    g.params.verdict_reveal_blocks = 1'000'000;
    g.params.dispute_response_blocks = 1'000'000;
  };
  return opt;
}

// Blocks 5 ms apart (the stages train on their own threads meanwhile) until `done`, at most
// `max_blocks`; whether `done` holds. A block that fails is a test failure.
bool StepUntil(testing::SimHarness& sim, int max_blocks, const std::function<bool()>& done) {
  for (int b = 0; b < max_blocks && !done(); ++b) {
    Status stepped = sim.Step();
    if (!stepped.ok()) {
      ADD_FAILURE() << stepped.ToString();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

json NodeRecordOf(testing::SimHarness& sim, int i) {
  return sim.Call("get_node", {{"id", sim.node_key(i).public_key().ToHex()}});
}

// Asserts that node `cheater` of the first `nodes` was slashed and jailed and no other node was
// slashed.
void ExpectOnlyTheCheaterSlashedAndJailed(testing::SimHarness& sim, int cheater, int nodes) {
  const json record = NodeRecordOf(sim, cheater);
  EXPECT_GE(record["reputation"].value("slashes", uint64_t{0}), 1u) << record.dump();
  EXPECT_EQ(record.value("status", std::string()), "jailed") << record.dump();
  for (int i = 0; i < nodes; ++i) {
    if (i == cheater) continue;
    const json n = NodeRecordOf(sim, i);
    EXPECT_EQ(n["reputation"].value("slashes", uint64_t{1}), 0u)
        << "honest node " << i << ": " << n.dump();
  }
}

// Steps blocks until the task finishes (or `max_blocks`), 5 ms apart for the stage threads; false
// when it did not, with the reason as a test failure.
bool RunToTheEnd(testing::SimHarness& sim, int max_blocks) {
  Status run = sim.RunUntilFinished(max_blocks, std::chrono::milliseconds(5));
  if (!run.ok()) ADD_FAILURE() << run.ToString();
  return run.ok();
}

TEST(PipelineNetworkTest, SixAgentsTrainTwoReplicasOfThreeStagesBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  ASSERT_EQ(o.net.stages, 3u);
  ASSERT_EQ(o.net.units_per_round, 2u);

  testing::SimOptions opt = PipelineSimOptions(15, "pipeline-network");
  std::set<int> stage_nodes_committed;
  std::set<int> aggregated;                // nodes that ran an aggregation (ok or failed)
  std::map<int, uint64_t> steps_released;  // stage steps each node stopped serving
  std::mutex mu;
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (line.find("(CommitStage)") != std::string::npos) stage_nodes_committed.insert(node);
    if (line.rfind("aggregate ", 0) == 0 || line.rfind("aggregation of task ", 0) == 0) {
      aggregated.insert(node);
    }
    const size_t at = line.find("no longer serving ");
    if (at != std::string::npos) {
      steps_released[node] += std::strtoull(line.c_str() + at + 18, nullptr, 10);
    }
  };
  // The units' records (get_task with units): no role of this chain reads them but an
  // aggregator whose CommitAggregate failed (Aggregator::Overtaken). node_work gives the round's
  // aggregator each stage unit's commitment and step commits blob with its input.
  std::atomic<uint64_t> unit_listings{0};
  opt.on_rpc = [&](const std::string& method, const json& params, const Result<json>&) {
    if (method == "get_task" && params.value("units", false)) ++unit_listings;
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
  // ... and reported the links its stage measured (ReportLinks): each to other nodes of the
  // network, every one with a bandwidth (what the pushes moved); no speed is asserted.
  std::set<std::string> node_ids;
  for (int i = 0; i < 6; ++i) node_ids.insert(sim.node_key(i).public_key().ToHex());
  for (int i = 0; i < 6; ++i) {
    const std::string me = sim.node_key(i).public_key().ToHex();
    json n = sim.Call("get_node", {{"id", me}});
    ASSERT_TRUE(n.contains("links")) << n.dump();
    EXPECT_FALSE(n["links"].empty()) << "node " << i << " reported no links";
    for (const json& l : n["links"]) {
      const std::string peer = l["peer"].get<std::string>();
      EXPECT_TRUE(node_ids.count(peer) != 0 && peer != me) << "node " << i << ": " << l.dump();
      EXPECT_GE(l["bandwidth_bytes_per_s"].get<uint64_t>(), 1u);
    }
  }
  // No node built the whole model's trainer (weights, gradients and optimizer moments of every
  // layer): a stage node holds its stage, and the round's aggregator, which evaluates the whole
  // model and trains none of it, holds its weights alone (TaskContext::Evaluator): no gradient
  // and no optimizer moment of the whole model after its aggregations.
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_LT(aggregated.size(), 6u) << "no node ran stage units only";
    ASSERT_FALSE(aggregated.empty());
    for (int i = 0; i < 6; ++i) {
      const AgentStats& st = sim.agent(i)->stats();
      EXPECT_EQ(st.whole_models_built, 0u) << "node " << i;
      EXPECT_EQ(st.whole_model_gradient_bytes, 0u) << "node " << i;
      EXPECT_EQ(st.whole_model_moments_bytes, 0u) << "node " << i;
    }
  }
  // The evidence of a final round's stage steps is no longer served and its checkpoint files are
  // deleted: once the task is final, every node has released every step it trained (one stage a
  // round: rounds x inner_steps), and its stages/ folder is empty.
  const uint64_t trained = uint64_t{o.net.rounds} * o.net.inner_steps;
  auto all_released = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return steps_released.size() == 6 &&
           std::all_of(steps_released.begin(), steps_released.end(),
                       [&](const auto& kv) { return kv.second == trained; });
  };
  for (int b = 0; b < 2'000 && !all_released(); ++b) {
    ASSERT_TRUE(sim.Step().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Every CommitAggregate's outcome is in by now (the blocks above): an ok one a round at least.
  uint64_t aggregates_ok = 0, aggregates_failed = 0;
  for (int i = 0; i < 6; ++i) {
    const AgentStats& st = sim.agent(i)->stats();
    aggregates_ok += st.aggregations_ok;
    aggregates_failed += st.aggregations - st.aggregations_ok;
  }
  EXPECT_GE(aggregates_ok, o.net.rounds);
  EXPECT_LE(unit_listings.load(), aggregates_failed);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(steps_released.size(), 6u);
  for (const auto& [node, steps] : steps_released) EXPECT_EQ(steps, trained) << "node " << node;
  for (int i = 0; i < 6; ++i) {
    const std::string stages =
        HomeLayout(opt.root + "/nodes/n" + std::to_string(i)).StageEvidenceDir();
    Result<std::vector<std::string>> left = Env::Default()->ListDir(stages);
    ASSERT_TRUE(left.ok()) << stages << ": " << left.status().ToString();  // the node wrote there
    EXPECT_TRUE(left->empty()) << stages << " keeps " << left->size() << " file(s)";
  }
}

// Stage evidence files an earlier process left in a node's stages/ folder are deleted when the
// node starts (its NodeAgent is built), not at its first stage step, which may never come.
TEST(PipelineNetworkTest, ANodeDeletesTheStageEvidenceAnEarlierProcessLeftWhenItStarts) {
  testing::SimOptions opt = PipelineSimOptions(23, "pipeline_evidence_leftovers");
  opt.nodes = 1;
  const std::string stages = HomeLayout(opt.root + "/nodes/n0").StageEvidenceDir();
  const std::string stale = JoinPath(stages, "left-by-an-earlier-process.safetensors");
  ASSERT_TRUE(Env::Default()->CreateDirs(stages).ok());
  ASSERT_TRUE(Env::Default()->WriteFileAtomic(stale, "an earlier process's checkpoint").ok());
  testing::SimHarness sim(opt);
  ASSERT_TRUE(sim.Setup().ok());
  EXPECT_FALSE(Env::Default()->FileExists(stale));
  Result<std::vector<std::string>> left = Env::Default()->ListDir(stages);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_TRUE(left->empty()) << stages << " keeps " << left->size() << " file(s)";
}

// A node keeps a stage unit's files until the unit's round is final, as the ledger counts them
// against its declared disk (ledger StageDiskHeld), or until it sees the task closed: a cancelled
// task's units are never checked or paid, so its stage files go at once, not with its blobs
// release_after_blocks later (here never). Without that, the files of the round under way when
// the task was cancelled stayed.
TEST(PipelineNetworkTest, ACancelledTasksStageFilesAreDeletedOnceTheNodeSeesItClosed) {
  testing::SimOptions opt = PipelineSimOptions(17, "pipeline-network-cancel");
  opt.agent_options = [](int, AgentOptions& a) { a.release_after_blocks = 1'000'000; };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  // The files in each node's stages/ folder.
  auto files = [&] {
    size_t n = 0;
    for (int i = 0; i < opt.nodes; ++i) {
      const std::string dir =
          HomeLayout(opt.root + "/nodes/n" + std::to_string(i)).StageEvidenceDir();
      if (Result<std::vector<std::string>> names = Env::Default()->ListDir(dir); names.ok()) {
        n += names->size();
      }
    }
    return n;
  };
  int b = 0;
  for (; b < 20'000 && files() == 0; ++b) {
    ASSERT_TRUE(sim.Step().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(files(), 0u) << "no stage wrote a file in " << b << " blocks";
  ASSERT_EQ(sim.Task(false).value("status", std::string()), "open");
  Result<TxOutcome> cancel = sim.SendAsSubmitter(ledger::CancelTaskTx{.task_id = sim.task_id()});
  ASSERT_TRUE(cancel.ok()) << cancel.status().ToString();
  ASSERT_TRUE(cancel->ok) << cancel->reason;
  ASSERT_EQ(sim.Task(false).value("status", std::string()), "cancelled");
  // A stage thread may publish a step before its node sees the cancel: the next review deletes it.
  for (b = 0; b < 2'000 && files() != 0; ++b) {
    ASSERT_TRUE(sim.Step().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(files(), 0u) << "stage files left " << b << " blocks after the cancel";
}

// A node deletes the files of a stage run whose unit the ledger no longer counts as its own
// (node_work's stage_units: the unit was placed on another node before the node committed it) at
// its next pin review, not when the round is final: no check, dispute or resume reads them, and
// the ledger no longer counts them against its disk. Seven agents; replica 0's stage 1 node sits
// out its ticks from its round 0 run's start (its thread trains on and writes its files, and it
// commits nothing), then leaves: the ledger places its stage on another node. Once it ticks again
// its stages/ folder is empty while round 0 is not yet final, and every node that committed a
// round 0 unit keeps its files. Without the review's sweep they stayed until the round was final.
TEST(PipelineNetworkTest, AStageRunsFilesAreDeletedOnceItsUnitIsPlacedOnAnotherNode) {
  testing::SimOptions opt = PipelineSimOptions(24, "pipeline-network-moved-files");
  opt.log = std::getenv("MESHLEARN_SIM_LOG") != nullptr;
  opt.nodes = 7;
  opt.node_options.resize(7);
  opt.tweak_genesis = [base = opt.tweak_genesis](ledger::Genesis& g) {
    base(g);
    g.params.liveness_blocks = 1'000'000;  // the node that sits out stays live until it leaves
  };
  std::mutex mu;
  int moved = -1;           // replica 0's stage 1 node of the first round 0 run
  bool sit_out = true;      // it sits out its ticks
  std::set<int> committed;  // replica 1's nodes that committed their round 0 stage
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (moved < 0 && line.find(" r0 replica 0 stage 1: training") != std::string::npos) {
      moved = node;
    }
    if (line.find(" r0 replica 1 stage ") != std::string::npos &&
        line.find("(CommitStage)") != std::string::npos) {
      committed.insert(node);
    }
  };
  opt.skip_tick = [&](int node) {
    std::lock_guard<std::mutex> lock(mu);
    return sit_out && node == moved;
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto files = [&](int node) -> size_t {
    const std::string dir =
        HomeLayout(opt.root + "/nodes/n" + std::to_string(node)).StageEvidenceDir();
    Result<std::vector<std::string>> names = Env::Default()->ListDir(dir);
    return names.ok() ? names->size() : 0;
  };
  auto step_until = [&](int max_blocks, const std::function<bool()>& done) {
    return StepUntil(sim, max_blocks, done);
  };
  // Replica 1's three stages commit (their units are never placed again here), and the node that
  // sits out has written files of its run.
  ASSERT_TRUE(step_until(20'000, [&] {
    std::lock_guard<std::mutex> lock(mu);
    return moved >= 0 && committed.size() >= 3 && files(moved) > 0;
  })) << "replica 1 never committed, or replica 0's stage 1 node wrote no file";
  int node;
  {
    std::lock_guard<std::mutex> lock(mu);
    node = moved;
  }
  const std::string key = sim.node_key(node).public_key().ToHex();
  auto held_by_node = [&] {
    return sim.Call("node_work", {{"id", key}}).value("stage_units", json::array()).size();
  };
  ASSERT_EQ(held_by_node(), 1u);
  Result<Hash256> left = sim.agent(node)->tx_sender().Send(
      ledger::LeaveNodeTx{.node_id = sim.node_key(node).public_key()});
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  ASSERT_TRUE(step_until(2'000, [&] { return held_by_node() == 0; }))
      << "the ledger still counts replica 0's stage 1 as the node's after it left";
  {
    std::lock_guard<std::mutex> lock(mu);
    sit_out = false;
  }
  ASSERT_TRUE(step_until(2'000, [&] { return files(node) == 0; }))
      << "node " << node << " keeps " << files(node)
      << " stage file(s) of a unit it no longer holds";
  EXPECT_EQ(sim.Task(false).value("rounds_settled", 99u), 0u) << "round 0 is final already";
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(committed.size(), 3u);
  for (int n : committed) EXPECT_GT(files(n), 0u) << "node " << n << " committed in round 0";
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

// Issue 15, "a stage node killed mid-step and one that leaves are replaced": seven agents, the
// seventh the slowest, so the first placement leaves it free. The node of replica 0's middle stage
// is held in round 0's step 1 (its first send of the step waits) until the test kills it (`kill`)
// or it leaves (LeaveNode, confirmed before it goes on). The ledger sees it gone from its own
// facts (a heartbeat older than liveness_blocks; a node that left), charges it alone the missed
// deadline, keeps the replica's two other stages on their nodes (a fresh assignment each: their
// runs stop and start again with the new chain) and places the lost stage on the free node. The
// task ends with `meshlearn diloco`'s weights, bit for bit, and no other node counts a failure.
// The replica resumes on the new chain at the step the node was lost in (docs/protocol.md "The
// resume step"); with `resume_fails` the new node cannot (its fetch budget is one byte) and the
// replica runs again from the round's start, bit-equal too. With `ahead` the node held is the
// last stage's, at its send of step 1's gradient total to stage 1, after it sent it to stage 0:
// stage 0 finished step 1, stage 1 did not, and the node leaves (released once the kept stages
// run on the new chain, so that stage 1 never takes that total): stage 0 rolls back to step 1's
// start from its own checkpoint and the replica resumes at step 1. With `verifying` the chain
// verifies every stage unit (VerifyingPipelineSimOptions): the verifiers replay every step of the
// resumed replica's stage units, the recomputed ones and the kept ones with their swapped
// records, against the new chain; none is fraud and no node is slashed. With `deadline_first` the
// test ticks the nodes without making a block (so the ledger cannot replace the killed node yet)
// until each kept stage's step deadline has failed its run on the old chain and its run again on
// that chain (which can train nothing without the lost node) has failed too: the kept stages still
// hold steps 0..k-1 (Stager's Held, their stages loaded again from their failed step's checkpoint)
// and the replica resumes at k all the same.
struct LoseAStage {
  bool kill = true;
  bool resume_fails = false;
  bool ahead = false;
  bool verifying = false;
  bool deadline_first = false;
};
void LoseAStageNodeMidStep(const LoseAStage& how, uint64_t seed, const std::string& dir) {
  const bool kill = how.kill;
  const bool resume_fails = how.resume_fails;
  // The stage whose node is lost, the kept ones, and one a verifier replays beside it.
  const uint32_t lost_stage = how.ahead ? 2 : 1;
  const std::vector<uint32_t> kept_stages =
      how.ahead ? std::vector<uint32_t>{0, 1} : std::vector<uint32_t>{0, 2};
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  testing::SimOptions opt =
      how.verifying ? VerifyingPipelineSimOptions(seed, dir) : PipelineSimOptions(seed, dir);
  opt.log = std::getenv("MESHLEARN_SIM_LOG") != nullptr;
  opt.nodes = 7;
  opt.node_options.resize(7);
  opt.node_options[6].speed_factor = 0.25;
  std::mutex mu;
  std::condition_variable cv;
  int victim = -1;  // the node held in replica 0's lost stage, round 0, step 1
  bool released = false;
  bool others_released = false;  // replica 1, held on a verifying chain (below)
  opt.agent_options = [&](int node, AgentOptions& a) {
    // The live stages wait for the lost node until the ledger replaces it or this deadline
    // passes; their runs on the new chain take pushes of that chain only (StageChainDigest), so
    // none of those waits out a deadline (`new_chain_failures`). Where it passes first on the old
    // chain (`deadline_first`: 5 s), the kept stages hold their steps for the resume all the same.
    a.stage_plane.step_deadline_ms = how.deadline_first ? 5'000 : 10'000;
    // The free node that replaces the lost one fetches at most inbox_bytes of each kept stage's
    // tensors for the resume (StartStageRun): 1 byte, and it cannot resume.
    if (resume_fails && node == 6) a.stage_plane.inbox_bytes = 1;
    // The plane's send hook sees every tensor the node sends: the first one of replica 0's stage
    // 1 in round 0's step 1 (with `ahead`: the last stage's total to stage 1) waits there until
    // the test releases it (nothing is corrupted).
    a.stage_plane.corrupt_sent = [&, node](const protocol::StageTensorKey& k) {
      if (how.verifying && k.round == 0 && k.replica == 1 && k.from_stage == 0 && k.step == 1) {
        // On a verifying chain replica 1 commits round 0 only once the lost node is gone on the
        // ledger: it left (not active), or, killed, the ledger replaced it (its heartbeat older
        // than liveness_blocks). The ledger draws a check's verifiers among live active nodes;
        // drawn, the lost node would verify nothing, and its check would wait out a
        // million-block window.
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return others_released; });
        return false;
      }
      if (k.round != 0 || k.replica != 0 || k.from_stage != lost_stage || k.step != 1) return false;
      if (how.ahead &&
          (k.kind != protocol::StageTensorKind::kStageTensorGradTotal || k.to_stage != 1)) {
        return false;
      }
      std::unique_lock<std::mutex> lock(mu);
      if (victim >= 0) return false;
      victim = node;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
      return false;
    };
  };
  // Round 0, replica 0: each stage's node when it started training, and the node that committed it.
  std::map<uint32_t, std::set<int>> trained, committed;
  std::set<int> victim_commits;
  // Every start and failure of a run of replica 0 in round 0, in order, by node and stage: told
  // apart by chain once the run is over.
  std::vector<std::tuple<int, uint32_t, std::string>> runs;
  // Round 0, replica 0: the step each stage's node resumed at (its "resumed at step k" line).
  std::map<uint32_t, std::map<int, uint64_t>> resumed;
  std::map<int, uint64_t> commits_of;  // CommitStage lines by node, any round
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (line.find("(CommitStage)") != std::string::npos) ++commits_of[node];
    for (uint32_t st = 0; st < 3; ++st) {
      const std::string name = " r0 replica 0 stage " + std::to_string(st);
      if (line.find(name + " failed") != std::string::npos) runs.emplace_back(node, st, line);
      if (line.find(name + ":") == std::string::npos) continue;
      const size_t at = line.find(": resumed at step ");
      if (at != std::string::npos) {
        resumed[st][node] = std::strtoull(line.c_str() + at + 18, nullptr, 10);
      }
      if (line.find(": training") != std::string::npos) {
        trained[st].insert(node);
        runs.emplace_back(node, st, line);
      }
      if (line.find("(CommitStage)") != std::string::npos) committed[st].insert(node);
    }
    if (line.find("(CommitStage)") != std::string::npos && node == victim) {
      victim_commits.insert(node);
    }
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto held = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return victim;
  };
  auto release = [&](bool others) {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    others_released = others_released || others;
    cv.notify_all();
  };
  // A held node is released whatever happens, before the agents are destroyed (they wait for
  // their stage threads).
  struct Releaser {
    std::function<void(bool)> release;
    ~Releaser() { release(true); }
  } releaser{release};
  for (int b = 0; b < 20'000 && held() < 0; ++b) {
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int lost = held();
  ASSERT_GE(lost, 0) << "no node reached replica 0's stage " << lost_stage << " in round 0";
  ASSERT_NE(lost, 6);
  std::map<uint32_t, std::set<int>> neighbours;  // replica 0's other stages before the loss
  {
    std::lock_guard<std::mutex> lock(mu);
    neighbours = trained;
  }
  for (uint32_t st : kept_stages) ASSERT_EQ(neighbours[st].size(), 1u) << "stage " << st;
  const std::string gone = sim.node_key(lost).public_key().ShortHex();
  // Whether every kept stage's node has started a run on the new chain (its run on the old one
  // is over then).
  auto kept_on_new_chain = [&] {
    std::lock_guard<std::mutex> lock(mu);
    std::set<uint32_t> on;
    for (const auto& [node, st, line] : runs) {
      if (line.find(": training") != std::string::npos &&
          line.find("(chain ") != std::string::npos && line.find(gone) == std::string::npos &&
          neighbours[st].count(node) != 0) {
        on.insert(st);
      }
    }
    return on.size() == kept_stages.size();
  };
  if (kill) {
    // It cannot finish the step: its network is cut before it is let go, so no neighbour's
    // answer reaches it (released first, stage 2's gradient could come back and stage 1's reach
    // stage 0 before the kill: stage 0 would finish step 1 on the old chain and train it again).
    sim.Cut(lost);
    release(/*others=*/!how.verifying);
    sim.Kill(lost);
    if (how.deadline_first) {
      // Ticks and no block (SimHarness::TickAll), 25 ms apart, until each kept stage's node
      // logged two failed runs of the unit (its step deadline on the old chain, then its run
      // again there): the ledger, which replaces the killed node after liveness_blocks, makes no
      // block meanwhile, so both fail before the replacement however slowly the machine runs.
      // (Blocks 25 ms apart, with liveness_blocks 1,000, raced the two 5 s deadlines.)
      auto failed_twice = [&] {
        std::lock_guard<std::mutex> lock(mu);
        for (uint32_t st : kept_stages) {
          const int n = *neighbours[st].begin();
          if (std::count_if(runs.begin(), runs.end(), [&](const auto& r) {
                return std::get<0>(r) == n && std::get<1>(r) == st &&
                       std::get<2>(r).find(" failed") != std::string::npos;
              }) < 2) {
            return false;
          }
        }
        return true;
      };
      auto on_new_chain = [&] {
        std::lock_guard<std::mutex> lock(mu);
        return std::any_of(runs.begin(), runs.end(), [&](const auto& r) {
          return std::get<2>(r).find(": training") != std::string::npos &&
                 std::get<2>(r).find(gone) == std::string::npos;
        });
      };
      const uint64_t height = sim.height();
      for (int t = 0; t < 4'000 && !failed_twice(); ++t) {  // 100 s: a hang, not a race
        Status ticked = sim.TickAll();
        ASSERT_TRUE(ticked.ok()) << ticked.ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
      ASSERT_EQ(sim.height(), height);
      ASSERT_FALSE(on_new_chain()) << "a kept stage ran on a new chain before the replacement";
      ASSERT_TRUE(failed_twice()) << "the kept stages' runs on the old chain did not fail twice";
    }
    // On a verifying chain the killed node stays active (its stake is whole): it is not drawn
    // to verify once its heartbeat is older than liveness_blocks. The ledger replaced it then
    // (ExpireGoneStages, the same rule): replica 1 goes on once another node trains its stage.
    auto replaced = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return std::any_of(trained[lost_stage].begin(), trained[lost_stage].end(),
                         [&](int n) { return n != lost; });
    };
    for (int b = 0; b < 20'000 && how.verifying && !replaced(); ++b) {
      Status stepped = sim.Step();
      ASSERT_TRUE(stepped.ok()) << stepped.ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(!how.verifying || replaced()) << "the killed node's stage was not placed again";
    release(/*others=*/true);
  } else {
    Result<Hash256> left = sim.agent(lost)->tx_sender().Send(
        ledger::LeaveNodeTx{.node_id = sim.node_key(lost).public_key()});
    ASSERT_TRUE(left.ok()) << left.status().ToString();
    for (int b = 0; b < 20 && NodeRecordOf(sim, lost).value("status", std::string()) != "unbonding";
         ++b) {
      Status stepped = sim.Step();
      ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    }
    ASSERT_EQ(NodeRecordOf(sim, lost).value("status", std::string()), "unbonding");
    // With `ahead`, the held total must never reach stage 1's run of the old chain: released
    // once the kept stages run on the new chain, which takes no push of the old one
    // (StageChainDigest).
    for (int b = 0; b < 20'000 && how.ahead && !kept_on_new_chain(); ++b) {
      Status stepped = sim.Step();
      ASSERT_TRUE(stepped.ok()) << stepped.ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(!how.ahead || kept_on_new_chain());
    release(/*others=*/true);
  }
  if (!resume_fails) {
    // A verifier's check (CheckStageStep, what a verifier of the stage unit runs) of step 0,
    // before the step the replica resumed at, of the replaced stage on its new node and of a kept
    // stage whose records of the lost one were swapped for the new node's (with `ahead`, stage 0,
    // which rolled back): both replay clean against the new chain. Blocks stop meanwhile, so the
    // round is not final and its steps are served.
    auto new_node_resumed = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return resumed[lost_stage].empty() ? -1 : resumed[lost_stage].begin()->first;
    };
    auto lost_stage_committed = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return !committed[lost_stage].empty();
    };
    for (int b = 0; b < 20'000 && new_node_resumed() < 0 && !lost_stage_committed(); ++b) {
      Status stepped = sim.Step();
      ASSERT_TRUE(stepped.ok()) << stepped.ToString();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const int fresh = new_node_resumed();
    ASSERT_GE(fresh, 0) << "the new node of replica 0's stage " << lost_stage << " did not resume";
    std::vector<protocol::NodeId> chain(3);
    chain[lost_stage] = sim.node_key(fresh).public_key();
    for (uint32_t st : kept_stages) chain[st] = sim.node_key(*neighbours[st].begin()).public_key();
    Result<TaskFacts> facts = ComputeTaskFacts(o.task, o.data, o.net);
    ASSERT_TRUE(facts.ok()) << facts.status().ToString();
    net::HttpTransport verifier;
    for (const auto& [stage, node] :
         {std::pair<uint32_t, int>{lost_stage, fresh},
          std::pair<uint32_t, int>{kept_stages[0], *neighbours[kept_stages[0]].begin()}}) {
      const std::string endpoint = NodeRecordOf(sim, node).value("endpoint", std::string());
      const StageCheckInput in{.task = &o.task,
                               .data = &o.data,
                               .net = &o.net,
                               .facts = &*facts,
                               .task_id = sim.task_id(),
                               .round = 0,
                               .replica = 0,
                               .stage = stage,
                               .chain = chain,
                               .transport = &verifier,
                               .endpoint = endpoint};
      Result<protocol::StageStepCommit> served = FetchStageStepCommit(
          &verifier, endpoint, {.task = sim.task_id(), .round = 0, .replica = 0, .stage = stage});
      ASSERT_TRUE(served.ok()) << served.status().ToString();
      const Hash256 leaf = protocol::StageStepLeaf(*served);
      Result<StageStepCheck> check = CheckStageStep(in, 0, leaf);
      ASSERT_TRUE(check.ok()) << check.status().ToString();
      EXPECT_EQ(check->leaf, leaf) << "stage " << stage << ": " << check->message;
    }
  }
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  // The lost node alone is charged; the stage it held went to another node, and its neighbours
  // committed their stages where they had started them.
  EXPECT_GE(NodeRecordOf(sim, lost)["reputation"].value("failures", uint64_t{0}), 1u);
  for (int i = 0; i < 7; ++i) {
    if (i == lost) continue;
    EXPECT_EQ(NodeRecordOf(sim, i)["reputation"].value("failures", uint64_t{1}), 0u)
        << "honest node " << i;
  }
  if (how.verifying) {
    // Every stage unit's check replayed its steps (the resumed replica's too: the new node's
    // recomputed steps and the kept stages' with their swapped records, against the new chain)
    // and found it clean; no node is slashed.
    const json task = sim.Task(true);
    EXPECT_EQ(task["verification"].value("fraud", uint64_t{1}), 0u) << task["verification"].dump();
    EXPECT_GE(task["verification"].value("clean", uint64_t{0}),
              uint64_t{o.net.rounds} * o.net.units_per_round * o.net.stages)
        << task["verification"].dump();
    uint64_t replays = 0;
    for (int i = 0; i < 7; ++i) {
      if (i == lost && kill) continue;
      replays += sim.agent(i)->stats().replays;
    }
    EXPECT_GE(replays, uint64_t{o.net.rounds} * o.net.units_per_round * o.net.stages);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(NodeRecordOf(sim, i)["reputation"].value("slashes", uint64_t{1}), 0u)
          << "node " << i;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(victim_commits.empty()) << "the lost node committed a stage";
  ASSERT_EQ(committed[lost_stage].size(), 1u);
  EXPECT_NE(*committed[lost_stage].begin(), lost);
  for (uint32_t st : kept_stages) EXPECT_EQ(committed[st], neighbours[st]) << "stage " << st;
  // Every stage ran on the new chain (the lost node's replaced), and none of those runs failed:
  // one that did is the replacement race, where the replica waited out a step deadline before it
  // ran again (StageChainDigest). A resume that cannot be made fails each stage's first run on
  // the new chain, naming why ("no resume"), and the replica runs again from the round's start.
  std::set<std::pair<int, uint32_t>> on_new_chain;
  std::vector<std::string> new_chain_failures;
  for (const auto& [node, st, line] : runs) {
    if (line.find(": training") != std::string::npos) {
      if (line.find("(chain ") != std::string::npos && line.find(gone) == std::string::npos) {
        on_new_chain.insert({node, st});
      } else {
        on_new_chain.erase({node, st});
      }
    } else if (on_new_chain.count({node, st}) != 0) {
      new_chain_failures.push_back("node " + std::to_string(node) + ": " + line);
    }
  }
  EXPECT_EQ(on_new_chain.size(), 3u);
  if (!resume_fails) {
    EXPECT_TRUE(new_chain_failures.empty()) << ::testing::PrintToString(new_chain_failures);
  } else {
    EXPECT_FALSE(new_chain_failures.empty());
    for (const std::string& f : new_chain_failures) {
      EXPECT_NE(f.find("no resume"), std::string::npos) << f;
    }
  }
  // The resume step (docs/protocol.md, "The resume step"): the replica resumed on the new chain
  // at the step its node was lost in (the victim was held in step 1): the new node re-ran the
  // lost stage's steps before it alone, and the kept stages did not train them again -- each
  // node trained every step it committed exactly once (AgentStats::stage_steps_trained), the new
  // node all but the k it re-ran (stage_steps_recomputed). With `ahead`, stage 0 trained step k
  // once more: it had finished it on the old chain and rolled back to its start. When the resume
  // cannot be made, no stage resumed and the kept stages trained steps 0..k-1 twice.
  const int fresh = *committed[lost_stage].begin();
  const uint64_t h = o.net.inner_steps;
  if (!resume_fails) {
    ASSERT_EQ(resumed[lost_stage].size(), 1u) << "the new node did not resume";
    const uint64_t k = resumed[lost_stage].begin()->second;
    EXPECT_EQ(resumed[lost_stage].begin()->first, fresh);
    EXPECT_EQ(k, 1u);
    for (uint32_t st : kept_stages) {
      const int n = *neighbours[st].begin();
      EXPECT_EQ(resumed[st], (std::map<int, uint64_t>{{n, k}})) << "stage " << st;
      const uint64_t again = how.ahead && st == 0 ? 1 : 0;
      EXPECT_EQ(sim.agent(n)->stats().stage_steps_trained, commits_of[n] * h + again)
          << "node " << n;
      EXPECT_EQ(sim.agent(n)->stats().stage_resumes, 1u) << "node " << n;
    }
    EXPECT_EQ(sim.agent(fresh)->stats().stage_steps_recomputed, k);
    EXPECT_EQ(sim.agent(fresh)->stats().stage_steps_trained, commits_of[fresh] * h - k);
  } else {
    EXPECT_TRUE(resumed.empty()) << "a stage resumed";
    for (uint32_t st : kept_stages) {
      const int n = *neighbours[st].begin();
      EXPECT_EQ(sim.agent(n)->stats().stage_steps_trained, commits_of[n] * h + 1) << "node " << n;
    }
    EXPECT_EQ(sim.agent(fresh)->stats().stage_steps_recomputed, 0u);
  }
}

TEST(PipelineNetworkTest, AStageNodeKilledMidStepIsReplacedAndTheTaskEndsBitEqual) {
  LoseAStageNodeMidStep({.kill = true}, 18, "pipeline-network-kill");
}

// The kept stages' step deadline fails their step on the old chain, and their runs again on it,
// before the ledger replaces the killed node: they hold their steps all the same and the replica
// resumes at the lost step (Stager's Held), bit-equal, only the killed node charged.
TEST(PipelineNetworkTest, AKeptStageWhoseStepDeadlineFiresBeforeTheReplacementStillResumes) {
  LoseAStageNodeMidStep({.kill = true, .deadline_first = true}, 18, "pipeline-network-deadline");
}

// A stage run that ends whole after its unit was placed again is not committed (Stager::Collect):
// its step records are signed by the chain it ran on, while the ledger, which takes a CommitStage
// from whichever node holds the stage now, and every verifier judge the unit's check against the
// new placement's chain (ReplicaRunChain). On the 10M GPT's devnet a node kept on its stage by a
// re-placement committed its old chain's run so: its verifier found the records "sent by node X,
// but stage 1 of the replica is node Y", neither party could trace the step, both missed their
// turns, and the task stalled with two nodes jailed. Seven agents, the seventh the slowest (free):
// replica 0's stages 0 and 1 sit out their ticks from the start of their round 0 runs, whose
// threads go on and end whole (stage 2's node commits its run). Then stage 1's node leaves: the
// ledger keeps stage 0 on its node with a fresh assignment (another beacon) and places stage 1 on
// the seventh. Only then does stage 0's node tick again, its old run ended: it commits a run on the
// new chain alone, and the task ends with `meshlearn diloco`'s weights, bit for bit.
TEST(PipelineNetworkTest, AStageRunThatEndsAfterItsUnitWasPlacedAgainIsNotCommitted) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  testing::SimOptions opt = PipelineSimOptions(23, "pipeline-network-placed-again");
  opt.log = std::getenv("MESHLEARN_SIM_LOG") != nullptr;
  opt.nodes = 7;
  opt.node_options.resize(7);
  opt.node_options[6].speed_factor = 0.25;
  opt.tweak_genesis = [base = opt.tweak_genesis](ledger::Genesis& g) {
    base(g);
    // The nodes that sit out their ticks stay live: the one that leaves is gone by its LeaveNode.
    g.params.liveness_blocks = 1'000'000;
  };
  std::mutex mu;
  std::map<uint32_t, int> node_of;      // replica 0's stages in round 0: the node of the first run
  bool sit_out = true;                  // replica 0's stages 0 and 1 sit out their ticks
  std::vector<std::string> kept_lines;  // stage 0's node's log, from its first run
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    for (uint32_t st = 0; st < 3; ++st) {
      if (line.find(" r0 replica 0 stage " + std::to_string(st) + ": training") !=
              std::string::npos &&
          node_of.count(st) == 0) {
        node_of[st] = node;
      }
    }
    if (node_of.count(0) != 0 && node == node_of[0]) kept_lines.push_back(line);
  };
  opt.skip_tick = [&](int node) {
    std::lock_guard<std::mutex> lock(mu);
    if (!sit_out) return false;
    for (uint32_t st : {0u, 1u}) {
      if (node_of.count(st) != 0 && node_of[st] == node) return true;
    }
    return false;
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto step_until = [&](int max_blocks, const std::function<bool()>& done) {
    return StepUntil(sim, max_blocks, done);
  };
  auto placed = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return node_of.size() == 3;
  };
  ASSERT_TRUE(step_until(20'000, placed)) << "replica 0's round 0 stages never all started";
  int kept, lost;
  {
    std::lock_guard<std::mutex> lock(mu);
    kept = node_of[0];
    lost = node_of[1];
  }
  ASSERT_NE(kept, 6);
  ASSERT_NE(lost, 6);
  // Stage 0's run has ended whole once it serves its last step (it ends right after; its node's
  // next tick, whenever it comes, finds it ended).
  net::HttpTransport fetcher;
  const std::string kept_endpoint = NodeRecordOf(sim, kept).value("endpoint", std::string());
  auto last_step_served = [&] {
    return FetchStageStepCommit(&fetcher, kept_endpoint,
                                {.task = sim.task_id(),
                                 .round = 0,
                                 .replica = 0,
                                 .stage = 0,
                                 .step = o.net.inner_steps - 1},
                                2'000)
        .ok();
  };
  ASSERT_TRUE(step_until(20'000, last_step_served)) << "stage 0 never trained its last step";
  Result<Hash256> left = sim.agent(lost)->tx_sender().Send(
      ledger::LeaveNodeTx{.node_id = sim.node_key(lost).public_key()});
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  // The ledger places replica 0 again: stage 0 kept on its node, with a fresh assignment whose
  // chain names the seventh node for stage 1.
  const std::string seventh = sim.node_key(6).public_key().ToHex();
  std::string old_beacon, new_beacon;
  auto kept_unit = [&](std::string* beacon) {
    const json work = sim.Call("node_work", {{"id", sim.node_key(kept).public_key().ToHex()}});
    for (const json& u : work.value("units", json::array())) {
      if (u.value("round", 99u) != 0 || !u.contains("stage") || u["stage"]["replica"] != 0) {
        continue;
      }
      *beacon = u.value("assignment_beacon", std::string());
      return u["stage"]["chain"][1].value("node", std::string()) == seventh;
    }
    return false;
  };
  kept_unit(&old_beacon);
  ASSERT_TRUE(step_until(2'000, [&] { return kept_unit(&new_beacon); }))
      << "the ledger did not place replica 0's stage 1 on the seventh node, stage 0 kept: "
      << sim.Call("node_work", {{"id", sim.node_key(kept).public_key().ToHex()}}).dump();
  EXPECT_NE(new_beacon, old_beacon);
  {
    std::lock_guard<std::mutex> lock(mu);
    sit_out = false;
  }
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  // Stage 0's node committed round 0 once, after a run on the new chain (one that names the
  // seventh node), and said why its old run was not committed.
  std::lock_guard<std::mutex> lock(mu);
  const std::string seventh_short = sim.node_key(6).public_key().ShortHex();
  bool on_new_chain = false, dropped = false;
  int commits = 0;
  for (const std::string& line : kept_lines) {
    if (line.find(" r0 replica 0 stage 0") == std::string::npos) continue;
    if (line.find(": training") != std::string::npos) {
      on_new_chain = line.find(seventh_short) != std::string::npos;
    }
    dropped |= line.find("ended after the unit was placed again") != std::string::npos;
    if (line.find("(CommitStage)") != std::string::npos) {
      ++commits;
      EXPECT_TRUE(on_new_chain) << "committed a run of the old chain: "
                                << ::testing::PrintToString(kept_lines);
    }
  }
  EXPECT_EQ(commits, 1) << ::testing::PrintToString(kept_lines);
  EXPECT_TRUE(dropped) << ::testing::PrintToString(kept_lines);
}

TEST(PipelineNetworkTest, AStageNodeThatLeavesMidStepIsReplacedAndTheTaskEndsBitEqual) {
  LoseAStageNodeMidStep({.kill = false}, 19, "pipeline-network-leave");
}

TEST(PipelineNetworkTest, AReplicaThatCannotResumeAtTheLostStepRerunsFromTheStartBitEqual) {
  LoseAStageNodeMidStep({.kill = true, .resume_fails = true}, 20, "pipeline-network-noresume");
}

// Issue 15: the last stage's node leaves between its two sends of step 1's gradient total, so the
// kept stages finished different numbers of steps (stage 0 two, stage 1 one): stage 0 rolls back
// to step 1's start from its own checkpoint and the replica resumes at step 1, bit-equal.
TEST(PipelineNetworkTest, AStageNodeLostBetweenItsTotalsIsReplacedAndTheStageAheadRollsBack) {
  LoseAStageNodeMidStep({.kill = false, .ahead = true}, 21, "pipeline-network-ahead");
}

// Issue 15: the resume on a verifying chain: every stage unit of the resumed replica is checked
// (the replaced stage's recomputed steps and the kept stages' swapped records replayed against
// the new chain), none is fraud, no node is slashed, and the task ends bit-equal. The node leaves.
TEST(PipelineNetworkTest, OnAVerifyingChainAResumedReplicaIsVerifiedCleanAndEndsBitEqual) {
  LoseAStageNodeMidStep({.kill = false, .verifying = true}, 22, "pipeline-network-verify-resume");
}

// The same with the node killed: it stays active on the ledger (its stake is whole), but its
// heartbeat is older than liveness_blocks, so no check draws it to verify (a check that drew it
// would wait out its million-block commit window and the task would not end).
TEST(PipelineNetworkTest, OnAVerifyingChainAKilledStageNodeIsNotDrawnToVerifyAndTheTaskEnds) {
  LoseAStageNodeMidStep({.kill = true, .verifying = true}, 23, "pipeline-network-verify-kill");
}

// A node that offers a memory limit holds one stage at a time (NodeAgent::WaitsForStageUnit,
// docs/node.md): a check's replay of a stage waits while the node's own stage unit trains, and
// runs once that unit has ended. Seven agents, each with a limit; replica 1's first stage is held
// in round 0's step 1 (its first send of the step waits), so that replica's three nodes train
// (their stages wait on each other) while replica 0's stage units commit and their checks fall to
// the nodes of replica 1 (the seventh node does not verify). The hold is released once such a
// node has let a check wait, or has replayed one. In every node's log, no verdict is reached
// while the node trains a stage unit, and every check that waited is replayed after the unit
// ended; the task ends with `meshlearn diloco`'s weights.
TEST(PipelineNetworkTest, UnderAMemoryLimitAStageCheckWaitsForTheNodesOwnStageUnitThenRuns) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  testing::SimOptions opt = VerifyingPipelineSimOptions(21, "pipeline-network-one-stage");
  // The seventh node is the slowest: the first placement leaves it out of both replicas. It does
  // not verify: a stage unit's check is drawn among the nodes of no replica of its own
  // (StageVerifierCandidates), so each of replica 0's checks falls to a node of replica 1 -- the
  // three nodes the hold keeps training -- whatever the beacon draws.
  opt.node_options[6].speed_factor = 0.25;
  opt.node_options[6].roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  // Any limit: a node that offers one replays a stage only while it trains none (FitsBeside).
  for (testing::SimNodeOptions& n : opt.node_options) n.memory_limit_bytes = 1ull << 30;
  std::mutex mu;
  std::condition_variable cv;
  int holder = -1;  // the node of replica 1's stage 0, held in round 0's step 1
  bool released = false;
  opt.agent_options = [&](int node, AgentOptions& a) {
    // The send hook sees every tensor a stage sends (nothing is corrupted).
    a.stage_plane.corrupt_sent = [&, node](const protocol::StageTensorKey& k) {
      if (k.round != 0 || k.replica != 1 || k.from_stage != 0 || k.step != 1) return false;
      std::unique_lock<std::mutex> lock(mu);
      holder = node;
      cv.wait(lock, [&] { return released; });
      return false;
    };
  };
  // Each node's log, read in order (the agents log from the test's thread, a tick at a time).
  struct NodeLog {
    bool training = false;                   // between a stage unit's "training" line and its end
    uint64_t units_ended = 0;                // stage units that ended (committed, or failed)
    std::map<std::string, uint64_t> waited;  // check -> units_ended when its replay waited
    std::vector<std::string> verdicts_while_training;
    std::vector<std::string> replayed_before_the_unit_ended;
    std::set<std::string> verdicts;  // checks this node reached a verdict on
  };
  std::map<int, NodeLog> logs;
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    NodeLog& l = logs[node];
    if (line.find(" steps with its neighbours") != std::string::npos) l.training = true;
    if (line.find("(CommitStage)") != std::string::npos ||
        line.find(" failed (nothing committed)") != std::string::npos) {
      l.training = false;
      ++l.units_ended;
    }
    if (line.rfind("check ", 0) != 0) return;
    const std::string check = line.substr(0, line.find(':'));
    if (line.find("waits for this node's stage unit") != std::string::npos) {
      l.waited.emplace(check, l.units_ended);
    }
    if (line.find(": verdict ") != std::string::npos) {
      l.verdicts.insert(check);
      if (l.training) l.verdicts_while_training.push_back(line);
      const auto w = l.waited.find(check);
      if (w != l.waited.end() && w->second == l.units_ended) {
        l.replayed_before_the_unit_ended.push_back(line);
      }
    }
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  };
  // The held node is released whatever happens, before the agents are destroyed (they wait for
  // their stage threads).
  struct Releaser {
    std::function<void()> release;
    ~Releaser() { release(); }
  } releaser{release};
  // Replica 1's nodes: those training while it is held (the holder's neighbours wait on it).
  auto a_replica_1_node_met_a_check = [&] {
    std::lock_guard<std::mutex> lock(mu);
    if (holder < 0) return false;
    for (const auto& [node, l] : logs) {
      if (l.training && (!l.waited.empty() || !l.verdicts.empty())) return true;
    }
    return false;
  };
  for (int b = 0; b < 20'000 && !a_replica_1_node_met_a_check(); ++b) {
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(a_replica_1_node_met_a_check()) << "no check fell to a node of the held replica";
  release();
  // Every check that waited is replayed once its node's unit has ended: a check dropped instead
  // would hold the task until its verdict window closes (a million blocks here). The bound counts
  // the blocks in which a check that waited could run (its node's unit had ended since), not those
  // in which the held replica still trains: those take wall-clock time, which blocks made as fast
  // as the loop turns do not measure (a bound on all blocks raced that training on a loaded
  // machine).
  auto waiting = [&](bool could_run) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> left;
    for (const auto& [node, l] : logs) {
      for (const auto& [check, ended] : l.waited) {
        if (l.verdicts.count(check) == 0 && (!could_run || l.units_ended > ended)) {
          left.push_back(std::to_string(node) + ": " + check);
        }
      }
    }
    return left;
  };
  int could_run = 0;  // blocks in which a check that waited could run
  for (int b = 0; b < 20'000 && !waiting(false).empty() && could_run < 1'000; ++b) {
    if (!waiting(true).empty()) ++could_run;
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(waiting(false).empty()) << "waited for the node's stage unit and never ran: "
                                      << ::testing::PrintToString(waiting(false));
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  std::lock_guard<std::mutex> lock(mu);
  size_t waited = 0;
  for (const auto& [node, l] : logs) {
    EXPECT_TRUE(l.verdicts_while_training.empty())
        << "node " << node << " replayed a check while it trained a stage unit: "
        << ::testing::PrintToString(l.verdicts_while_training);
    EXPECT_TRUE(l.replayed_before_the_unit_ended.empty())
        << "node " << node << ": " << ::testing::PrintToString(l.replayed_before_the_unit_ended);
    waited += l.waited.size();
  }
  EXPECT_GE(waited, 1u) << "no check waited for a stage unit: nothing shown";
}

// A dispute's trace of a stage step is a stage replay too (NodeAgent::WaitsForStageUnit): under a
// memory limit it waits while the node's own stage unit trains, but only while its turn leaves it
// the time its replays take (TraceWaitEnd: at most the first half of the blocks its turn had left,
// less when this node's stage replays took more than a quarter of them); then the node stops its
// unit (Stager::StopForReplay) and the trace runs once the unit ended, within what the node offers,
// rather than lose the turn. Seven agents with a limit, the seventh the slowest and no verifier, so
// that a stage unit's check falls to a node of the other replica; node 0 is lazy, and neither
// aggregates nor verifies. Its round 0 check is a mismatch, disputed over the stage's plan, where
// both parties trace the step. Its verifier (the challenger) replays it before its round 1 stage
// unit starts (no stage unit starts while a replay is due), then sits out `busy_blocks` of its
// ticks (what a replay that took that many blocks looks like to the node: its next tick comes that
// much later); the lazy node sits its ticks out, so its secret stays unrevealed and the dispute
// unopened, until the challenger's round 1 unit trains, held in its first send for as long as the
// test likes (the hold lets go once the node stops the unit). Then the dispute opens: the
// challenger's trace waits for its unit, the node stops the unit, and the trace runs after it
// ended; `expect` gets what the challenger's log showed, in blocks; the challenger answers in
// time, the lazy node is slashed and no honest node is. Every step is counted in blocks the test
// makes, not in time.
constexpr uint64_t kTraceTurn = 60;  // dispute_response_blocks: each dispute turn
struct TraceWaitSeen {
  int64_t trace_waited = -1;  // block of its trace's first wait for the unit
  int64_t stopped = -1;       // block the node stopped its unit for the trace
  int64_t traced = -1;        // block its trace ran
  bool traced_while_training = false;
  std::string lines;  // the challenger's log, each line with its block
};
void PlayATraceBesideAHeldStageUnit(const std::string& dir, uint64_t busy_blocks,
                                    const std::function<void(const TraceWaitSeen&)>& expect) {
  constexpr int kCheater = 0;
  testing::SimOptions opt = VerifyingPipelineSimOptions(22, dir);
  opt.node_options[6].speed_factor = 0.25;
  opt.node_options[6].roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  // Neither an aggregator nor a verifier: the rounds go on while it sits out its ticks.
  opt.node_options[kCheater].roles = ledger::kRoleSolver;
  for (testing::SimNodeOptions& n : opt.node_options) n.memory_limit_bytes = 1ull << 30;
  opt.tweak_genesis = [verifying = opt.tweak_genesis](ledger::Genesis& g) {
    verifying(g);
    g.params.dispute_response_blocks = kTraceTurn;
    // The lazy node sits out its ticks (and heartbeats) for as many blocks as round 1's placement
    // takes: it stays live, so that nothing is placed again meanwhile.
    g.params.liveness_blocks = 1'000'000;
  };
  std::mutex mu;
  std::condition_variable cv;
  int challenger = -1;  // the verifier of the lazy node's round 0 unit
  bool released = false;
  bool paused = false;      // the lazy node sits out its ticks
  uint64_t busy_until = 0;  // the challenger sits out its ticks before this block
  TraceWaitSeen seen;
  opt.agent_options = [&](int node, AgentOptions& a) {
    if (node == kCheater) a.adversary = Adversary::kLazy;
    // The send hook sees every tensor a stage sends: the challenger's from round 1 on wait there
    // until the test releases them or the node stopped its unit (nothing is corrupted).
    a.stage_plane.corrupt_sent = [&, node](const protocol::StageTensorKey& k) {
      std::unique_lock<std::mutex> lock(mu);
      if (node == challenger && k.round >= 1) {
        cv.wait(lock, [&] { return released || seen.stopped >= 0; });
      }
      return false;
    };
  };
  // The challenger's log, read in order, with the test's block count at each line.
  uint64_t block = 0;
  opt.skip_tick = [&](int node) {
    std::lock_guard<std::mutex> lock(mu);
    return (paused && node == kCheater) || (node == challenger && block < busy_until);
  };
  std::string check;      // "check T/I r0 sS": the lazy node's round 0 check
  bool training = false;  // the challenger's round 1 stage unit started, not ended
  std::vector<std::string> challenger_lines;
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (challenger < 0 && line.rfind("check ", 0) == 0 && line.find(" r0 s") != std::string::npos &&
        line.find(": verdict mismatch") != std::string::npos) {
      // Only the lazy node cheats: the one round 0 mismatch is on its unit. Its verifier has just
      // replayed it (and sent the sealed verdict): the lazy node reveals nothing from now on.
      challenger = node;
      check = line.substr(0, line.find(':'));
      paused = true;
      busy_until = block + 1 + busy_blocks;
      return;
    }
    if (node != challenger) return;
    challenger_lines.push_back(std::to_string(block) + ": " + line);
    const bool round1_unit = line.find(" r1 replica ") != std::string::npos;
    if (round1_unit && line.find(" steps with its neighbours") != std::string::npos) {
      training = true;
    }
    if (round1_unit && (line.find("(CommitStage)") != std::string::npos ||
                        line.find(" failed (nothing committed)") != std::string::npos)) {
      training = false;
    }
    if (round1_unit && line.find(": stopping it: " + check) != std::string::npos &&
        seen.stopped < 0) {
      seen.stopped = static_cast<int64_t>(block);
      cv.notify_all();
    }
    if (line.rfind(check + ": ", 0) != 0) return;
    // After the verdict, the check's only replay that waits for a stage unit is the trace
    // (StageReplayNeed: a dispute's range replay and a witness do not).
    if (line.find("waits for this node's stage unit") != std::string::npos &&
        seen.trace_waited < 0) {
      seen.trace_waited = static_cast<int64_t>(block);
    }
    if (line.find(": traced it from the stage's served evidence") != std::string::npos &&
        seen.traced < 0) {
      seen.traced = static_cast<int64_t>(block);
      seen.traced_while_training = training;
    }
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    paused = false;
    cv.notify_all();
  };
  // The challenger is released whatever happens, before the agents are destroyed (they wait for
  // their stage threads).
  struct Releaser {
    std::function<void()> release;
    ~Releaser() { release(); }
  } releaser{release};
  // Once the node stopped its unit for the trace, no block is made until the unit's thread has
  // ended (it ends as soon as it runs again: its hold lets go and its plane is cancelled). Blocks
  // made as fast as the loop turns while that thread waited for a core counted against the turn:
  // on a loaded machine the trace ran tens of blocks late, where the daemon's blocks come seconds
  // apart.
  bool stop_seen = false;
  auto step_until = [&](int max_blocks, const std::function<bool()>& done) {
    for (int b = 0; b < max_blocks; ++b) {
      int stopped_node = -1;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (done()) return true;
        ++block;
        if (!stop_seen && seen.stopped >= 0) {
          stop_seen = true;
          stopped_node = challenger;
        }
      }
      for (int w = 0; stopped_node >= 0 && sim.agent(stopped_node)->stage_unit_running(); ++w) {
        if (w == 60'000) {  // a minute: a hang, not a race
          ADD_FAILURE() << "the unit stopped for the trace did not end";
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      Status stepped = sim.Step();
      if (!stepped.ok()) {
        ADD_FAILURE() << stepped.ToString();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::lock_guard<std::mutex> lock(mu);
    return done();
  };
  auto lines = [&] { return ::testing::PrintToString(challenger_lines); };  // REQUIRES: mu
  auto dump = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return lines();
  };
  ASSERT_TRUE(step_until(20'000, [&] { return challenger >= 0; }))
      << "no verifier found the lazy node's round 0 unit wrong";
  ASSERT_NE(challenger, kCheater);
  // The lazy node sits out while round 0 is aggregated and round 1 placed, until the challenger's
  // round 1 unit has started (its replay of the check ran first: a unit does not start while one
  // is due).
  ASSERT_TRUE(step_until(20'000, [&] { return training; }))
      << "the challenger's round 1 stage unit never started: " << dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_LT(seen.trace_waited, 0)
        << "the dispute opened before the lazy node revealed its secret";
    paused = false;
  }
  // The dispute opens: the challenger's trace waits for its unit, which the hold keeps training,
  // until the node stops it; then the trace runs, before the turn's deadline.
  ASSERT_TRUE(step_until(static_cast<int>(4 * kTraceTurn), [&] { return seen.traced >= 0; }))
      << "the challenger never traced the disputed step: " << dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_GE(seen.trace_waited, 0) << "the trace never waited for the stage unit: " << lines();
    seen.lines = lines();
    std::printf(
        "the challenger's trace waited for its stage unit at block %lld, the node stopped the "
        "unit at block %lld, the trace ran at block %lld (%s the unit; a turn of %llu blocks)\n",
        static_cast<long long>(seen.trace_waited), static_cast<long long>(seen.stopped),
        static_cast<long long>(seen.traced), seen.traced_while_training ? "beside" : "after",
        static_cast<unsigned long long>(kTraceTurn));
    expect(seen);
    // In time, whatever it waited: a move at the turn's last block would be late.
    EXPECT_LT(seen.traced - seen.trace_waited, static_cast<int64_t>(kTraceTurn)) << lines();
  }
  release();
  // The dispute goes on to its ruling: the lazy node is slashed, the challenger (which answered
  // in time) and every other node are not.
  auto slashes = [&](int i) {
    return NodeRecordOf(sim, i)["reputation"].value("slashes", uint64_t{0});
  };
  bool slashed = false;
  for (int b = 0; b < 5'000 && !slashed; ++b) {
    slashed = slashes(kCheater) >= 1;
    if (slashed) break;
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(slashed) << sim.Task(true)["verification"].dump() << "\n" << dump();
  for (int i = 0; i < 7; ++i) {
    if (i == kCheater) continue;
    EXPECT_EQ(slashes(i), 0u) << "honest node " << i << ": " << NodeRecordOf(sim, i).dump();
  }
  // Each party's trace held the stage for its job only: the task's data it read for the step's
  // batch was dropped before the replay, not kept through the ticks after, beside the stage units
  // they train (AgentStats::stage_held_bytes; a node that aggregated holds the data with its
  // whole-model trainer, which the count leaves out).
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(sim.agent(i)->stats().stage_held_bytes, 0u) << "node " << i << ": " << dump();
  }
}

// The challenger's replays took a block each (a tick each): its trace waits through half of what
// its turn had left, then the node stops its unit and the trace runs after the unit ended, not
// beside it (within the node's offer), before the turn's deadline.
TEST(PipelineNetworkTest, UnderAMemoryLimitADisputesTraceWaitsForTheStageUnitThroughHalfItsTurn) {
  PlayATraceBesideAHeldStageUnit("pipeline-network-trace-wait", 0, [](const TraceWaitSeen& s) {
    ASSERT_GE(s.stopped, 0) << "the node never stopped its unit for the trace: " << s.lines;
    // Half of what was left of the turn when it first waited, give or take the blocks the dispute
    // took to reach this node's tick.
    EXPECT_GE(s.stopped - s.trace_waited, static_cast<int64_t>(kTraceTurn / 2) - 5) << s.lines;
    EXPECT_FALSE(s.traced_while_training) << s.lines;
    EXPECT_GT(s.traced, s.stopped) << s.lines;
  });
}

// The challenger's verdict replay took 40 blocks (its next tick came that much later, as on a
// loaded machine: on the 10M GPT's devnet at load 30 a trace took 105 blocks of a 120-block turn,
// and a defender that waited half its turn first was ruled silent). Twice that is more than its
// turn leaves: its trace does not wait for the unit, the node stops the unit at once, and the trace
// runs after it ended, well before the half-turn a node that did not measure its replays waits.
TEST(PipelineNetworkTest, UnderAMemoryLimitADisputesTraceWaitsNoLongerThanItsTurnLeavesItsReplay) {
  PlayATraceBesideAHeldStageUnit(
      "pipeline-network-trace-wait-busy", 40, [](const TraceWaitSeen& s) {
        ASSERT_GE(s.stopped, 0) << "the node never stopped its unit for the trace: " << s.lines;
        EXPECT_LE(s.stopped - s.trace_waited, 2) << s.lines;
        EXPECT_FALSE(s.traced_while_training) << s.lines;
        EXPECT_GT(s.traced, s.stopped) << s.lines;
        EXPECT_LT(s.traced - s.trace_waited, static_cast<int64_t>(kTraceTurn / 2) - 5) << s.lines;
      });
}

// A stage node that cheats on a verifying chain -- the adversary `lazy` (every step's commit claims
// the state it started from), `noisy` (its stage's weights perturbed after step 1, the perturbed
// state committed), `drift` (the same perturbation, not committed: step 2 starts from a state no
// step ended at; the verifier's continuity check finds it and the ledger rules the two commits),
// `wrong_data` (step 1 trained on the wrong input: the first stage on step 2's batch, a later stage
// on micro-batches 0 and 1's activations swapped), `wrong_result` (honest steps, the negated delta
// committed: the verifier's result check proves it, no dispute), one that computes its part
// honestly and sends corrupted activations of micro-batch 0, or a faulty kernel (one operator of
// step 1 computed wrong, its output sent, the step defended as computed: the game ends at a tile of
// that operator, the others' at the agreed chain end) -- the verifier drawn for its stage unit
// replays a step from what it serves and claims the mismatch with the task bundle, both parties
// play the game over the stage's plan from their traces of the step, the ledger rules it by
// RefereeTile against the stage and slashes it alone (no honest stage node is slashed; its
// neighbours, which used what it sent, replay clean), the round runs again without it, and the task
// ends with `meshlearn diloco`'s weights, bit for bit, every unit's work paid to an honest node.
struct CheatingStage {
  const char* name;
  std::function<void(AgentOptions&)> cheat;
  // Caught by a stage step's replay and a dispute the ledger rules (RefereeTile); else
  // (wrong_result: every step replays clean) by the verifier's result check and a ProveResult.
  bool disputed = true;
  // A faulty kernel (AgentOptions::corrupt_sent_in_trace): the stage's own trace of the step
  // shows its lie, so the parties' traces differ at the operator whose output it sent, and the
  // game ends at a tile of that operator instead of the agreed chain end.
  bool faulty_kernel = false;
  // drift: every step replays clean; the verifier's continuity check finds the step that does
  // not start where the previous one ended, and a party's continuity witness (RefereeStageStep)
  // rules the whole-step game: no tile phase, and the referee service has nothing to replay.
  bool continuity = false;
};
class CheatingStageTest : public ::testing::TestWithParam<CheatingStage> {};

// What the faulty kernel computes wrong: step 1's activations of micro-batch 0 (the stage's last
// block's residual3), or, on the last stage, which sends none, their gradient (its first block's
// residual.grad): one operator of one step, whichever stage the cheater is placed on.
bool FaultyKernelSends(const protocol::StageTensorKey& k) {
  if (k.step != 1 || k.micro_batch != 0) return false;
  return k.kind == protocol::StageTensorKind::kStageTensorActivation ||
         (k.kind == protocol::StageTensorKind::kStageTensorActivationGrad &&
          k.from_stage + 1 == k.stages);
}

// The 1-based operator index, in the plan of stage `stage` of the oracle's task, of the tensor
// FaultyKernelSends matches for that stage.
int64_t FaultyKernelOperator(const PipelineOracle& o, uint32_t stage) {
  Result<std::unique_ptr<engine::Trainer>> trainer = engine::Trainer::Create(o.task, o.data);
  if (!trainer.ok()) {
    ADD_FAILURE() << trainer.status().ToString();
    return -1;
  }
  const engine::TaskSpec& t = (*trainer)->task();  // the model's vocabulary from the data
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(t, static_cast<int>(o.net.stages), o.net.cut);
  if (!cut.ok()) {
    ADD_FAILURE() << cut.status().ToString();
    return -1;
  }
  Result<engine::TilePlan> plan =
      engine::PlanStageStepTiles(t.model, t.optimizer, cut->part(static_cast<int>(stage)),
                                 t.batch_size, t.seq_len, t.micro_batches);
  if (!plan.ok()) {
    ADD_FAILURE() << plan.status().ToString();
    return -1;
  }
  const bool last = stage + 1 == o.net.stages;
  protocol::StageTensorKey key{.stages = o.net.stages,
                               .from_stage = stage,
                               .to_stage = last ? stage - 1 : stage + 1,
                               .step = 1,
                               .micro_batch = 0,
                               .kind = last ? protocol::StageTensorKind::kStageTensorActivationGrad
                                            : protocol::StageTensorKind::kStageTensorActivation};
  EXPECT_TRUE(FaultyKernelSends(key));
  const int64_t op = ledger::StageSentOperator(*plan, key);
  EXPECT_GE(op, 0) << key.ToString();
  std::printf("faulty kernel on stage %u: operator %lld (%s) of %zu\n", stage,
              static_cast<long long>(op + 1),
              op >= 0 ? plan->ops[static_cast<size_t>(op)].name.c_str() : "none", plan->ops.size());
  return op + 1;
}

TEST_P(CheatingStageTest, IsCaughtSlashedAndTheTaskEndsBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  constexpr int kCheater = 5;
  testing::SimOptions opt =
      VerifyingPipelineSimOptions(17, std::string("pipeline-network-") + GetParam().name);
  // The seventh node is the slowest: the first placement leaves it out, so the cheater has a stage.
  opt.node_options[6].speed_factor = 0.25;
  opt.agent_options = [cheat = GetParam().cheat](int node, AgentOptions& a) {
    if (node == kCheater) cheat(a);
  };
  std::mutex mu;
  std::vector<std::string> cheater_lines;
  std::set<int> aggregated;  // nodes that ran an aggregation (ok or failed)
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (line.rfind("aggregate ", 0) == 0 || line.rfind("aggregation of task ", 0) == 0) {
      aggregated.insert(node);
    }
    if (node == kCheater) cheater_lines.push_back(line);
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
  {
    std::lock_guard<std::mutex> lock(mu);
    bool committed = false;
    for (const std::string& l : cheater_lines)
      committed |= l.find("(CommitStage)") != std::string::npos;
    ASSERT_TRUE(committed) << "the cheater was never placed on a stage: the test means nothing";
  }
  Result<GlobalState> final_state = sim.FinalState();
  ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
  EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  const json task = sim.Task(true);
  EXPECT_GE(task["verification"].value("fraud", uint64_t{0}), 1u) << task["verification"].dump();
  EXPECT_GE(task["verification"].value("clean", uint64_t{0}), 12u) << task["verification"].dump();
  ExpectOnlyTheCheaterSlashedAndJailed(sim, kCheater, 7);
  // A node that trained and verified stage units (each check replays a stage from its step's
  // checkpoint, with the step's batch from the data) never built the whole model; the round's
  // aggregator evaluates it, so it builds one.
  {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t stage_only_replays = 0;
    for (int i = 0; i < 7; ++i) {
      if (aggregated.count(i)) continue;
      EXPECT_EQ(sim.agent(i)->stats().whole_models_built, 0u)
          << "node " << i << " trained and verified stage units only";
      stage_only_replays += sim.agent(i)->stats().replays;
    }
    EXPECT_GE(stage_only_replays, 1u) << "no node verified without aggregating: nothing shown";
  }
  // Between two ticks no node held a stage task's data or a stage dispute trace's operator values
  // (the faulty kernel's game reads them at a tile, every move of phases 3-4 and its witness):
  // what the next tick's stage unit would train beside (AgentStats::stage_held_bytes).
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(sim.agent(i)->stats().stage_held_bytes, 0u) << "node " << i;
  }
  // The verifier's mismatch carried the task bundle (a GPT stage), so the game narrowed the stage's
  // step to a tile, an input operator or the agreed chain end of its plan, and the ledger ruled it
  // itself by RefereeTile (a tile's footprint, or the committed commit's roots; the genesis key's
  // RuleDispute and a whole step's RefereeStageStep are refused for it): the referee service sent
  // that, never a RuleDispute, and a party posted it too.
  ASSERT_NE(sim.referee(), nullptr);
  const std::vector<RefereeRecord> rulings = sim.referee()->rulings();
  if (!GetParam().disputed) {
    // No game: the verifier proved the result wrong from the stage's state after its last step
    // (ProveResult with a StageResultWitness), which settled the check as fraud at once.
    EXPECT_EQ(task["verification"].value("disputes", uint64_t{1}), 0u)
        << task["verification"].dump();
    EXPECT_TRUE(rulings.empty());
    uint64_t proven = 0;
    for (int i = 0; i < 7; ++i) proven += sim.agent(i)->stats().results_proven;
    EXPECT_GE(proven, 1u);
    EXPECT_EQ(sim.agent(kCheater)->stats().results_proven, 0u);
  }
  if (GetParam().continuity) {
    EXPECT_GE(task["verification"].value("disputes", uint64_t{0}), 1u)
        << task["verification"].dump();
    EXPECT_TRUE(rulings.empty());
  }
  const bool tiled = GetParam().disputed && !GetParam().continuity;
  ASSERT_GE(rulings.size(), tiled ? 1u : 0u);
  uint64_t party_witnesses = 0;
  for (int i = 0; i < 7; ++i) party_witnesses += sim.agent(i)->stats().tile_witnesses;
  EXPECT_GE(party_witnesses, tiled ? 1u : 0u);
  for (const RefereeRecord& r : rulings) {
    EXPECT_EQ(r.tx_type, "RefereeTile") << r.ruling.reason;
    EXPECT_TRUE(r.ruling.tile) << r.ruling.reason;
    EXPECT_GT(r.ruling.witness_bytes, 0u);
    EXPECT_LE(r.ruling.witness_bytes, ledger::kMaxTileWitnessBytes);
    EXPECT_EQ(r.ruling.output == r.dispute.task.challenger_output, true) << r.ruling.reason;
    if (GetParam().faulty_kernel) {
      // Ruled at a tile of the faulty operator of step 1 (the game's step 2), not at the chain
      // end or an input operator's roots.
      const protocol::RefereeTask& t = r.dispute.task;
      EXPECT_TRUE(t.tile) << "ruled from roots (" << static_cast<int>(t.roots) << ") at operator "
                          << t.operator_index << ": " << r.ruling.reason;
      EXPECT_EQ(t.step, 2u);
      EXPECT_EQ(static_cast<int64_t>(t.operator_index),
                FaultyKernelOperator(o, r.dispute.shard % o.net.stages));
    }
    std::printf("%s: ruling by %s, witness %llu bytes (%s): %s\n", GetParam().name,
                r.tx_type.c_str(), static_cast<unsigned long long>(r.ruling.witness_bytes),
                r.ok ? "executed" : ("refused: " + r.error).c_str(), r.ruling.reason.c_str());
  }
  const std::string cheater_id = sim.node_key(kCheater).public_key().ToHex();
  for (const json& u : task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), cheater_id) << u.dump();
    EXPECT_GT(u.value("paid", uint64_t{0}), 0u) << u.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CheatingStageTest,
    ::testing::Values(
        CheatingStage{"lazy", [](AgentOptions& a) { a.adversary = Adversary::kLazy; }},
        CheatingStage{"noisy", [](AgentOptions& a) { a.adversary = Adversary::kNoisy; }},
        CheatingStage{"wrong_data", [](AgentOptions& a) { a.adversary = Adversary::kWrongData; }},
        CheatingStage{"wrong_result",
                      [](AgentOptions& a) { a.adversary = Adversary::kWrongResult; }, false},
        CheatingStage{"drift", [](AgentOptions& a) { a.adversary = Adversary::kDrift; }, true,
                      false, true},
        CheatingStage{"corrupt_activations",
                      [](AgentOptions& a) {
                        a.stage_plane.corrupt_sent = [](const protocol::StageTensorKey& k) {
                          return k.kind == protocol::StageTensorKind::kStageTensorActivation &&
                                 k.micro_batch == 0;
                        };
                      }},
        CheatingStage{"faulty_kernel",
                      [](AgentOptions& a) {
                        a.stage_plane.corrupt_sent = FaultyKernelSends;
                        a.corrupt_sent_in_trace = true;
                      },
                      true, true}),
    [](const ::testing::TestParamInfo<CheatingStage>& p) { return std::string(p.param.name); });

// The served-on-chain scenario: kPipelineGptTask wide enough (n_embd 256) that every stage is
// over the stage witness bound, one round, node kWithholder a stage that withholds its steps'
// evidence over the data plane (AgentOptions::withhold_stage_evidence: it answers every
// "stage.step" with NotFound), and with `lazy` computes them lazily (every commit claims the state
// it started from). Its verifier can fetch nothing, so it claims that the stage served nothing for
// the step; the stage answers on chain (ServeStageEvidence).
constexpr int kWithholder = 5;
void WithholdingStageSimOptions(uint64_t seed, const std::string& dir, bool lazy,
                                testing::SimOptions* out) {
  std::string toml = kPipelineGptTask;
  const auto set = [&](const std::string& from, const std::string& to) {
    const size_t at = toml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    toml.replace(at, from.size(), to);
  };
  ASSERT_NO_FATAL_FAILURE(set("n_embd = 16", "n_embd = 256"));
  ASSERT_NO_FATAL_FAILURE(set("rounds = 2", "rounds = 1"));
  // The recheck comes within the round's window, which restarts when the served claim settles.
  ASSERT_NO_FATAL_FAILURE(
      set("inner_lr_final = 0.5", "inner_lr_final = 0.5\nverification_window_blocks = 60"));
  testing::SimOptions opt = VerifyingPipelineSimOptions(seed, dir);
  opt.task_toml = toml + "budget = 100000000000\nprice_cap = 1000\n";
  opt.node_options[6].speed_factor = 0.25;  // left out of the first placement: the cheater stages
  // Blocks come as fast as the loop turns: the serving window (after the referee's deadline) must
  // not close before the stage's node has posted its pieces.
  opt.tweak_genesis = [verifying = opt.tweak_genesis](ledger::Genesis& g) {
    verifying(g);
    g.params.referee_blocks = 1'000'000;
  };
  opt.agent_options = [lazy](int node, AgentOptions& a) {
    if (node != kWithholder) return;
    if (lazy) a.adversary = Adversary::kLazy;
    a.withhold_stage_evidence = true;
  };
  *out = std::move(opt);
}

// A stage over the stage witness bound that withholds its steps' evidence over the data plane and
// computes them lazily (WithholdingStageSimOptions). Its verifier can fetch nothing, so it claims
// that the stage served nothing for the step; the stage answers on chain, every piece of the
// step's evidence (ServeStageEvidence), which rules the claim "served" (nobody slashed). The
// verifier's node then checks the step by itself (Disputes::RunServedRecheck): it reads the pieces
// back from the blocks (get_block_txs), replays the step from them, finds the lazy commit and
// challenges it with the task bundle (ChallengeUnit, which the ledger takes from the claimant
// without the whistleblower role); the tile phase, traced from the pieces on chain by both parties,
// ends at the commit's chain end, RefereeTile rules it, and the stage alone is slashed.
TEST(PipelineNetworkTest, AStageThatServesItsLazyStepOnlyOnChainIsRecheckedAndSlashed) {
  constexpr int kCheater = kWithholder;
  testing::SimOptions opt;
  ASSERT_NO_FATAL_FAILURE(
      WithholdingStageSimOptions(29, "pipeline-network-served-lazy", /*lazy=*/true, &opt));
  std::mutex mu;
  std::vector<std::string> rechecks;
  opt.log_sink = [&](int node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (line.find("served on chain does not replay from its pieces") != std::string::npos) {
      rechecks.push_back(std::to_string(node) + ": " + line);
    }
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
  const json task = sim.Task(true);
  for (const json& bytes : task["params"]["stage_memory_bytes"]) {
    ASSERT_GT(bytes.get<uint64_t>(), ledger::kMaxStageWitnessMemory)
        << "a stage within the bound is ruled whole (RefereeStageStep): the test means nothing";
  }
  const std::string cheater_id = sim.node_key(kCheater).public_key().ToHex();
  // The claim answered on chain, then the step ruled from the recheck's challenge.
  bool served = false, ruled = false;
  for (const json& r : task["verification"]["rulings"]) {
    std::printf("ruling %s on stage %llu: for %s: %s\n", r.value("tx", "").c_str(),
                static_cast<unsigned long long>(r.value("stage", uint64_t{0})),
                r.value("for", "").c_str(), r.value("reason", "").c_str());
    if (r.value("defender", "") != cheater_id) continue;
    if (r.value("tx", "") == "ServeStageEvidence") {
      served = true;
      EXPECT_EQ(r.value("for", ""), "both") << r.dump();
    } else if (served && r.value("tx", "") == "RefereeTile") {
      ruled = true;
      EXPECT_EQ(r.value("for", ""), "challenger") << r.dump();
    }
  }
  EXPECT_TRUE(served) << "the stage never served a step on chain: " << task["verification"].dump();
  EXPECT_TRUE(ruled) << "no ruling after the served one: " << task["verification"].dump();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(rechecks.empty()) << "no node rechecked the served step";
    for (const std::string& l : rechecks) std::printf("recheck: %s\n", l.c_str());
  }
  EXPECT_GE(task["verification"].value("fraud", uint64_t{0}), 1u) << task["verification"].dump();
  ExpectOnlyTheCheaterSlashedAndJailed(sim, kCheater, 7);
  // The recheck read the task's data for the step's batch and dropped it, as every stage job does.
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(sim.agent(i)->stats().stage_held_bytes, 0u) << "node " << i;
  }
  for (const json& u : task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), cheater_id) << u.dump();
  }
}

// The recheck of a served step is kept across a restart (Disputes::RunServedRecheck journals what
// it found, recheck-<step>-<height>.json, before it sends anything). The scenario above, with node
// 6 the only verifier (the claimant), which crashes right after its recheck's journal is written
// (AgentOptions::after_served_recheck) and is restarted one block later without the hook. Kept is
// what the node finds after the restart: its record as written, or with `corrupt` bytes that are
// not a journal, which the node logs, naming the file, and checks the step again.
struct RecheckRestart {
  bool lazy = false;     // the withholding stage is lazy: the recheck finds it wrong
  bool corrupt = false;  // the journal is overwritten with garbage before the restart
};

struct RecheckRestartRun {
  std::vector<std::string> replays;   // node 6's "served on chain ... from its pieces" lines
  std::vector<std::string> kept;      // node 6's "its recheck before a restart found it ..."
  std::vector<std::string> rejected;  // node 6's "checking the served step again"
  std::set<int> crashed;
  json task;
  std::string withholder;  // its node id, hex
};

void RunRecheckRestart(const RecheckRestart& p, const std::string& dir, RecheckRestartRun* run) {
  constexpr int kClaimant = 6;
  testing::SimOptions opt;
  ASSERT_NO_FATAL_FAILURE(WithholdingStageSimOptions(31, dir, p.lazy, &opt));
  // Node 6 alone verifies: the claimant is known, and it holds no stage of the first placement
  // (whose served evidence a restart would lose).
  for (int i = 0; i < 6; ++i) {
    opt.node_options[i].roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  }
  std::mutex mu;
  opt.log_sink = [&](int node, const std::string& line) {
    if (node != kClaimant) return;
    std::lock_guard<std::mutex> lock(mu);
    if (line.find("served on chain replays clean from its pieces") != std::string::npos ||
        line.find("served on chain does not replay from its pieces") != std::string::npos) {
      run->replays.push_back(line);
    }
    if (line.find("its recheck before a restart found it") != std::string::npos) {
      run->kept.push_back(line);
    }
    if (line.find("checking the served step again") != std::string::npos) {
      run->rejected.push_back(line);
    }
  };
  opt.agent_options = [withholding = opt.agent_options, &mu, run](int node, AgentOptions& a) {
    withholding(node, a);
    if (node == kWithholder) return;
    a.after_served_recheck = [&mu, run, node](const Hash256&, uint32_t, bool) -> Status {
      std::lock_guard<std::mutex> lock(mu);
      run->crashed.insert(node);
      return Internal("crash: simulated kill -9 after the recheck's journal");
    };
  };
  const std::string root = opt.root;
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  std::set<int> restarted;
  bool finished = false;
  for (int b = 0; b < 40'000 && !finished; ++b) {
    finished = sim.Task(false).value("status", std::string()) == "finished";
    if (finished) break;
    Status step = sim.Step();
    ASSERT_TRUE(step.ok()) << step.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::set<int> due;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int i : run->crashed) {
        if (!restarted.count(i)) due.insert(i);
      }
    }
    for (int i : due) {
      sim.Kill(i);
      if (p.corrupt) {
        int corrupted = 0;
        const std::filesystem::path verify = root + "/nodes/n" + std::to_string(i) + "/verify";
        for (const auto& f : std::filesystem::recursive_directory_iterator(verify)) {
          if (f.path().filename().string().starts_with("recheck-")) {
            std::ofstream(f.path(), std::ios::trunc) << "{\"journal\": \"served_rech";
            ++corrupted;
          }
        }
        ASSERT_EQ(corrupted, 1) << "no recheck journal under " << verify;
      }
      ASSERT_TRUE(sim.Restart(i, [](AgentOptions& a) { a.after_served_recheck = nullptr; }).ok());
      restarted.insert(i);
    }
  }
  ASSERT_TRUE(finished) << sim.Task(true).dump().substr(0, 4000);
  run->task = sim.Task(true);
  run->withholder = sim.node_key(kWithholder).public_key().ToHex();
  if (p.lazy) {
    ExpectOnlyTheCheaterSlashedAndJailed(sim, kWithholder, 7);
  } else {
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(NodeRecordOf(sim, i)["reputation"].value("slashes", uint64_t{1}), 0u) << i;
    }
  }
}

// Whether `task` has a ServeStageEvidence ruling on the withholder, then (`ruled`) a RefereeTile
// ruling for the challenger after it.
void ExpectServedThenRuled(const json& task, const std::string& withholder, bool ruled) {
  bool served = false, tile = false;
  for (const json& r : task["verification"]["rulings"]) {
    if (r.value("defender", "") != withholder) continue;
    if (r.value("tx", "") == "ServeStageEvidence") served = true;
    if (served && r.value("tx", "") == "RefereeTile") {
      tile = true;
      EXPECT_EQ(r.value("for", ""), "challenger") << r.dump();
    }
  }
  EXPECT_TRUE(served) << task["verification"].dump();
  EXPECT_EQ(tile, ruled) << task["verification"].dump();
}

TEST(PipelineNetworkTest, AClaimantRestartedBeforeItsChallengeSendsTheFindingItJournaled) {
  RecheckRestartRun run;
  ASSERT_NO_FATAL_FAILURE(RunRecheckRestart({.lazy = true}, "pipeline-network-recheck-kept", &run));
  EXPECT_EQ(run.crashed, std::set<int>{6});
  ExpectServedThenRuled(run.task, run.withholder, /*ruled=*/true);
  // Replayed once, before the crash; challenged after the restart from the journal.
  EXPECT_EQ(run.replays.size(), 1u) << ::testing::PrintToString(run.replays);
  ASSERT_EQ(run.kept.size(), 1u) << ::testing::PrintToString(run.kept);
  EXPECT_NE(run.kept[0].find("found it wrong"), std::string::npos) << run.kept[0];
  EXPECT_TRUE(run.rejected.empty()) << ::testing::PrintToString(run.rejected);
}

TEST(PipelineNetworkTest, AClaimantRestartedAfterACleanRecheckDoesNotReplayTheServedStepAgain) {
  RecheckRestartRun run;
  ASSERT_NO_FATAL_FAILURE(
      RunRecheckRestart({.lazy = false}, "pipeline-network-recheck-clean", &run));
  EXPECT_EQ(run.crashed, std::set<int>{6});
  ExpectServedThenRuled(run.task, run.withholder, /*ruled=*/false);
  EXPECT_EQ(run.replays.size(), 1u) << ::testing::PrintToString(run.replays);
  ASSERT_EQ(run.kept.size(), 1u) << ::testing::PrintToString(run.kept);
  EXPECT_NE(run.kept[0].find("found it clean"), std::string::npos) << run.kept[0];
}

// A recheck journal that does not read back (a torn disk, a hand edit) is no finding: the node logs
// it, naming the file, and checks the step again (one more replay), as for no journal at all.
TEST(PipelineNetworkTest, AClaimantsCorruptRecheckJournalIsLoggedAndTheServedStepCheckedAgain) {
  RecheckRestartRun run;
  ASSERT_NO_FATAL_FAILURE(RunRecheckRestart({.lazy = false, .corrupt = true},
                                            "pipeline-network-recheck-corrupt", &run));
  EXPECT_EQ(run.crashed, std::set<int>{6});
  EXPECT_EQ(run.replays.size(), 2u) << ::testing::PrintToString(run.replays);
  EXPECT_TRUE(run.kept.empty()) << ::testing::PrintToString(run.kept);
  ASSERT_EQ(run.rejected.size(), 1u) << ::testing::PrintToString(run.rejected);
  EXPECT_NE(run.rejected[0].find("recheck-"), std::string::npos) << run.rejected[0];
}

// Forced errors for stage units (docs/verification.md, "Forced errors for stage units"): every
// stage unit is drawn (the rate is one in one). Six stage nodes, and two verifier nodes outside
// every replica, so both check every stage unit: one honest, one a rubber stamp (approves without
// replaying). Each drawn stage trains and sends honestly, commits and serves its steps with the
// forced states beside its real checkpoints, and reveals them with its secret; the honest verifier
// finds it (its replay of step 0 ends elsewhere, a later step's checkpoint does not hash to its
// forced start), the rubber stamp approves it and is slashed, the forced stage settles as a forced
// error (no dispute, no fraud, nothing abandoned) and its replica runs again. No stage node and
// not the honest verifier is slashed. (Every re-run is drawn again, so the task never ends: the
// test ends once the rubber stamp is slashed.)
TEST(PipelineNetworkTest, ADrawnStageIsCaughtByAnHonestVerifierAndARubberStampIsSlashed) {
  testing::SimOptions opt = VerifyingPipelineSimOptions(23, "pipeline-network-forced");
  constexpr int kHonest = 6, kStamp = 7;
  opt.nodes = 8;
  opt.node_options.resize(8);
  for (int i = 0; i < 6; ++i) {
    opt.node_options[i].roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  }
  opt.node_options[kHonest].roles = ledger::kRoleVerifier;
  opt.node_options[kStamp].roles = ledger::kRoleVerifier;
  opt.tweak_genesis = [verifying = opt.tweak_genesis](ledger::Genesis& g) {
    verifying(g);
    g.params.forced_error_per_million = 1'000'000;
    g.params.verifiers_per_unit = 2;
  };
  opt.agent_options = [](int node, AgentOptions& a) {
    if (node == kStamp) a.adversary = Adversary::kRubberStamp;
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  auto slashes = [&](int i) {
    return NodeRecordOf(sim, i)["reputation"].value("slashes", uint64_t{0});
  };
  for (int b = 0; b < 20'000 && slashes(kStamp) == 0; ++b) {
    Status stepped = sim.Step();
    ASSERT_TRUE(stepped.ok()) << stepped.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(slashes(kStamp), 0u) << "the rubber stamp approved no forced stage";
  const json verification = sim.Task(false)["verification"];
  EXPECT_GE(verification.value("forced_error", uint64_t{0}), 1u) << verification.dump();
  EXPECT_EQ(verification.value("fraud", uint64_t{1}), 0u) << verification.dump();
  EXPECT_EQ(verification.value("abandoned", uint64_t{1}), 0u) << verification.dump();
  EXPECT_EQ(verification.value("disputes", uint64_t{1}), 0u) << verification.dump();
  uint64_t forced = 0;
  for (int i = 0; i < 6; ++i) forced += sim.agent(i)->stats().forced_errors;
  EXPECT_GE(forced, 1u);
  EXPECT_GE(sim.agent(kHonest)->stats().mismatches, 1u);
  EXPECT_EQ(sim.agent(kStamp)->stats().replays, 0u) << "it never replayed anything";
  for (int i = 0; i < kStamp; ++i) {
    EXPECT_EQ(slashes(i), 0u) << "honest node " << i << ": " << NodeRecordOf(sim, i).dump();
  }
  // The honest verifier shares the jackpot the rubber stamp's stake fed.
  EXPECT_GE(NodeRecordOf(sim, kHonest)["earnings"].value("jackpot_wins", uint64_t{0}), 1u);
}

// The forced step commits (forced-N.commits) node `i` keeps in its unit directories.
std::vector<std::string> ForcedCommitsFiles(const testing::SimOptions& opt, int i) {
  std::vector<std::string> found;
  const std::string units = opt.root + "/nodes/n" + std::to_string(i) + "/units";
  Result<std::vector<std::string>> dirs = Env::Default()->ListDir(units);
  if (!dirs.ok()) return found;  // the node never wrote a unit file
  for (const std::string& d : *dirs) {
    Result<std::vector<std::string>> names = Env::Default()->ListDir(units + "/" + d);
    if (!names.ok()) continue;
    for (const std::string& n : *names) {
      if (n.starts_with("forced-")) found.push_back(d + "/" + n);
    }
  }
  return found;
}

// Forced errors now and then on a pipeline task: one stage unit in five is drawn; each drawn
// stage is caught by the honest verifiers, its replica runs again, nobody is slashed, and the task
// ends with `meshlearn diloco`'s weights, bit for bit. Which stages are drawn depends on the
// blocks, so a seed may draw none (each of the task's four replica runs draws none with
// probability 0.8^3): the first seed that draws one counts. Once every round is final, the
// forced commits a drawn stage kept for its reveal are deleted with its unit directory (the pin
// review's, as a unit's checkpoints are). Returns the forced errors settled.
uint64_t RunPipelineWithForcedErrors(const PipelineOracle& o, uint64_t seed) {
  testing::SimOptions opt =
      VerifyingPipelineSimOptions(seed, "pipeline-network-forced-" + std::to_string(seed));
  opt.tweak_genesis = [verifying = opt.tweak_genesis](ledger::Genesis& g) {
    verifying(g);
    g.params.forced_error_per_million = 200'000;
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  EXPECT_TRUE(setup.ok()) << setup.ToString();
  if (!setup.ok() || !RunToTheEnd(sim, 40'000)) {
    ADD_FAILURE() << "seed " << seed << ": the task did not finish";
    return 0;
  }
  const json verification = sim.Task(false)["verification"];
  EXPECT_EQ(verification.value("fraud", uint64_t{1}), 0u) << verification.dump();
  EXPECT_EQ(verification.value("abandoned", uint64_t{1}), 0u) << verification.dump();
  for (int i = 0; i < opt.nodes; ++i) {
    EXPECT_EQ(NodeRecordOf(sim, i)["reputation"].value("slashes", uint64_t{1}), 0u)
        << "honest node " << i;
  }
  Result<GlobalState> final_state = sim.FinalState();
  EXPECT_TRUE(final_state.ok()) << final_state.status().ToString();
  if (final_state.ok()) {
    EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
  }
  // Every round is final with the task: each node's next pin review deletes its units' files.
  auto units_left = [&] {
    size_t n = 0;
    for (int i = 0; i < opt.nodes; ++i) n += sim.agent(i)->pin_book()->Units().size();
    return n;
  };
  for (int b = 0; b < 100 && units_left() > 0; ++b) EXPECT_TRUE(sim.Step().ok());
  EXPECT_EQ(units_left(), 0u);
  for (int i = 0; i < opt.nodes; ++i) {
    const std::vector<std::string> left = ForcedCommitsFiles(opt, i);
    EXPECT_TRUE(left.empty()) << "node " << i << " keeps " << left.size()
                              << " forced commits file(s), e.g. " << left.front();
  }
  return verification.value("forced_error", uint64_t{0});
}

TEST(PipelineNetworkTest, ForcedStagesAreCaughtAndRerunAndTheTaskIsBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  uint64_t forced = 0;
  for (uint64_t seed = 31; seed < 35 && forced == 0 && !HasFailure(); ++seed) {
    forced = RunPipelineWithForcedErrors(o, seed);
  }
  EXPECT_GT(forced, 0u) << "no seed drew a forced stage";
}

// A lazy stage whose first attempt is drawn for a forced error commits its unit twice: the forced
// attempt settles as a forced error (its verifier's mismatch is the catch: the stage's real leaves
// are never checked, so its replica re-runs whole once its siblings' checks settle, the drawn
// stage unpaid; no deadline and no heartbeat is involved), and the re-run's commit is a lazy
// one, checked afresh: every step of it is false, so its check finds it whatever step it
// replays, and the stage is slashed and jailed. Nothing of the forced attempt reaches the model
// or the stage's earnings. (The Dashboard test's run 2026-12-06 01:08 where "a lazy stage
// committed its unit twice".) Which attempt is drawn depends on the blocks: a seed whose lazy
// stage's first commit is not drawn is dropped at that commit, and the first seed that draws it
// counts.
TEST(PipelineNetworkTest, ALazyStageDrawnForAForcedErrorIsCaughtOnItsRerun) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  constexpr int kCheater = 5;
  bool tested = false;
  for (uint64_t seed = 41; seed < 61 && !tested && !HasFailure(); ++seed) {
    testing::SimOptions opt =
        VerifyingPipelineSimOptions(seed, "pipeline-network-lazy-forced-" + std::to_string(seed));
    // The seventh node is the slowest: the first placement leaves it out, so the cheater has a
    // stage (as CheatingStageTest).
    opt.node_options[6].speed_factor = 0.25;
    opt.tweak_genesis = [verifying = opt.tweak_genesis](ledger::Genesis& g) {
      verifying(g);
      g.params.forced_error_per_million = 250'000;
    };
    opt.agent_options = [](int node, AgentOptions& a) {
      if (node == kCheater) a.adversary = Adversary::kLazy;
    };
    std::mutex mu;
    int commits = 0;           // the cheater's CommitStage lines
    bool first_drawn = false;  // its first commit was drawn for a forced error
    opt.log_sink = [&](int node, const std::string& line) {
      if (node != kCheater) return;
      std::lock_guard<std::mutex> lock(mu);
      if (commits == 0 && line.find("drawn for a forced error") != std::string::npos) {
        first_drawn = true;
      }
      if (line.find("(CommitStage)") != std::string::npos) ++commits;
    };
    testing::SimHarness sim(opt);
    Status setup = sim.Setup();
    ASSERT_TRUE(setup.ok()) << setup.ToString();
    auto committed = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return commits > 0;
    };
    for (int b = 0; b < 20'000 && !committed(); ++b) {
      ASSERT_TRUE(sim.Step().ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(committed()) << "seed " << seed << ": the cheater was never placed on a stage";
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_drawn) continue;  // its first attempt was checked as any: CheatingStageTest's
    }
    tested = true;
    ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 4000);
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_GE(commits, 2) << "the cheater committed once: its forced attempt was not re-run";
    }
    const json task = sim.Task(true);
    const json& v = task["verification"];
    // The forced attempt settled (the catch ruled, not dropped), and a lazy attempt was fraud.
    EXPECT_GE(v.value("forced_error", uint64_t{0}), 1u) << v.dump();
    EXPECT_GE(v.value("fraud", uint64_t{0}), 1u) << v.dump();
    EXPECT_GE(sim.agent(kCheater)->stats().forced_errors, 1u);
    ExpectOnlyTheCheaterSlashedAndJailed(sim, kCheater, 7);
    // No attempt of it reached the model, and none was paid: a lazy attempt committed beside
    // another stage of its replica drawn for a forced error waits for its own check, which rules
    // it, before the replica re-runs (RerunForcedReplicas; before, seeds 45 and 42 paid this
    // cheater 1 token so: docs/verification.md, "A cheating stage drawn for a forced error").
    const json cheater = NodeRecordOf(sim, kCheater);
    std::printf("the cheater's earnings: %s\n", cheater["earnings"].dump().c_str());
    EXPECT_EQ(cheater["earnings"].value("units", uint64_t{0}), 0u) << cheater.dump();
    const std::string cheater_id = sim.node_key(kCheater).public_key().ToHex();
    for (const json& u : task["units"]) {
      EXPECT_NE(u.value("assignee", std::string()), cheater_id) << u.dump();
    }
    Result<GlobalState> final_state = sim.FinalState();
    ASSERT_TRUE(final_state.ok()) << final_state.status().ToString();
    EXPECT_EQ(HashFloats(final_state->weights), o.want.final_hash);
    std::printf("seed %llu: the lazy stage's first attempt drawn; %d commits; %s\n",
                static_cast<unsigned long long>(seed), commits, v.dump().c_str());
  }
  EXPECT_TRUE(tested) << "no seed drew the lazy stage's first attempt for a forced error";
}

}  // namespace
}  // namespace meshlearn::node
