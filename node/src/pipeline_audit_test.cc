// The audit of a pipeline task (task_audit.h; docs/verification.md, "An audit of a pipeline task")
// against stage nodes in one process (testing/sim_harness.h: agents on loopback HTTP training
// kPipelineGptTask, 2 rounds x 2 replicas x 3 stages x 3 steps): an honest task audits clean with
// every step of every stage compared with its committed commit; a record whose stage commits are
// missing, not served or another stage's fails naming them; each unit's stage commits are kept
// and served by its round's aggregator, so that the audit compares every step with the stage
// nodes' copies gone; a lazy stage whose checks every verifier rubber-stamped (so the task paid it
// and finished) is found at its step, and the witness the audit builds is accepted by the
// ledger, which slashes the stage's node.
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_audit.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "testing/pipeline_task.h"
#include "testing/sim_harness.h"

// A namespace of its own: stage_test is a unity build, and pipeline_network_test.cc has helpers of
// the same names.
namespace meshlearn::node::pipeline_audit {
namespace {

using nlohmann::json;

// Blobs as the nodes hold them, except `refused`, which nobody serves.
BlobGetter NodeBlobs(testing::SimHarness* sim, int nodes, std::set<std::string> refused = {}) {
  return [sim, nodes, refused](const Hash256& id) -> Result<Bytes> {
    if (refused.count(id.ToHex())) return NotFound("no node serves " + id.ShortHex());
    for (int i = 0; i < nodes; ++i) {
      if (sim->store(i)->HasBlob(net::BlobId{id})) return sim->store(i)->Get(net::BlobId{id});
    }
    return NotFound("no node has blob " + id.ShortHex());
  };
}

// The pipeline network tests' chain (pipeline_network_test.cc: six agents, kPipelineGptTask, no
// unit expires while stages train in real time), with verification when `verifying`: seven
// agents, each a solver, aggregator and verifier, every step of a checked stage unit replayed, no
// forced errors and no window that closes before every party acted.
testing::SimOptions AuditedPipelineOptions(uint64_t seed, const std::string& dir, bool verifying) {
  testing::SimOptions opt;
  opt.seed = seed;
  opt.nodes = verifying ? 7 : 6;
  opt.env = Env::Default();
  opt.root = TestDir(dir);
  opt.http = true;
  opt.task_toml = std::string(kPipelineGptTask) + "budget = 100000000000\nprice_cap = 1000\n";
  if (verifying) {
    opt.node_options.resize(7);
    for (testing::SimNodeOptions& n : opt.node_options) {
      n.roles = ledger::kRoleSolver | ledger::kRoleAggregator | ledger::kRoleVerifier;
    }
  }
  opt.tweak_genesis = [verifying](ledger::Genesis& g) {
    g.params.verification = verifying;
    g.params.min_deadline_blocks = 1'000'000;
    if (verifying) {
      g.params.verify_segments_per_check = 64;
      g.params.forced_error_per_million = 0;
      g.params.verifiers_per_unit = 1;
      g.params.verdict_commit_blocks = 1'000'000;
      g.params.verdict_reveal_blocks = 1'000'000;
      g.params.dispute_response_blocks = 1'000'000;
    }
  };
  return opt;
}

// Steps blocks until the task finishes (or `max_blocks`), 5 ms apart for the stage threads; false
// when it did not, with the reason as a test failure.
bool RunToTheEnd(testing::SimHarness& sim, int max_blocks) {
  Status run = sim.RunUntilFinished(max_blocks, std::chrono::milliseconds(5));
  if (!run.ok()) ADD_FAILURE() << run.ToString();
  return run.ok();
}

json& Unit(json& task, uint32_t index) {
  for (json& u : task["units"]) {
    if (u["index"] == index) return u;
  }
  ADD_FAILURE() << "no unit " << index;
  return task;
}

// Rounds x replicas x stages x inner steps of kPipelineGptTask.
constexpr uint64_t kStageSteps = 2 * 2 * 3 * 3;

struct HonestPipeline {
  std::unique_ptr<testing::SimHarness> sim;
  json task;
  std::string dir;
  HonestPipeline() {
    testing::SimOptions opt = AuditedPipelineOptions(15, "pipeline-audit", false);
    dir = opt.root;
    sim = std::make_unique<testing::SimHarness>(opt);
    Status s = sim->Setup();
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(RunToTheEnd(*sim, 20'000)) << sim->Task(true).dump().substr(0, 3000);
    task = sim->Task(true);
  }
  Result<AuditReport> Audit(const json& record, AuditOptions o,
                            std::set<std::string> refused = {}) {
    o.work_dir = dir + "/audit";
    return AuditTaskRecord(Env::Default(), record, NodeBlobs(sim.get(), 6, std::move(refused)), o);
  }
};

class PipelineAuditTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { honest_ = new HonestPipeline(); }
  static void TearDownTestSuite() {
    delete honest_;
    honest_ = nullptr;
  }
  static HonestPipeline* honest_;
};
HonestPipeline* PipelineAuditTest::honest_ = nullptr;

TEST_F(PipelineAuditTest, AnHonestTaskAuditsCleanWithEveryStageStepCompared) {
  ASSERT_EQ(honest_->task.value("status", std::string()), "finished");
  Result<AuditReport> r = honest_->Audit(honest_->task, {.full = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass) << r->first_mismatch;
  EXPECT_EQ(r->stages, 3u);
  EXPECT_EQ(r->units_executed, 12u);
  EXPECT_EQ(r->stage_steps_compared, kStageSteps);
  for (const AuditUnit& u : r->units) {
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckPass) << u.index << ": " << u.note;
    EXPECT_EQ(u.steps_compared, 3u) << u.index;
    EXPECT_EQ(u.fraud_segment, -1) << u.index;
    EXPECT_FALSE(u.stage_commits.IsZero()) << u.index;
    EXPECT_EQ(static_cast<uint32_t>(u.replica * 3 + u.stage), u.shard) << u.index;
  }
  ASSERT_EQ(r->chain.size(), 4u);  // initial, rounds 0 and 1, final
  for (const AuditState& s : r->chain) {
    EXPECT_EQ(s.check, AuditCheck::kAuditCheckPass) << s.name << ": " << s.note;
  }
  EXPECT_EQ(r->chain.back().recorded.ToHex(), honest_->task["final_state"].get<std::string>());
  const json j = AuditReportToJson(*r);
  EXPECT_EQ(j["verdict"], "PASS");
  EXPECT_EQ(j["stages"], 3);
  EXPECT_EQ(j["stage_steps_compared"], kStageSteps);
  ASSERT_EQ(j["units"].size(), 12u);
  EXPECT_EQ(j["units"][4]["replica"], 1);
  EXPECT_EQ(j["units"][4]["stage"], 1);
  EXPECT_EQ(j["units"][4]["steps_compared"], 3);
  EXPECT_TRUE(j["units"][4]["stage_commits"].is_string());
  // What keeping the commits public costs: one blob per stage unit (printed for the docs).
  BlobGetter get = NodeBlobs(honest_->sim.get(), 6);
  for (const AuditUnit& u : r->units) {
    if (u.round != 0 || u.replica != 0) continue;
    Result<Bytes> blob = get(u.stage_commits);
    ASSERT_TRUE(blob.ok()) << blob.status().ToString();
    std::printf("stage %d's step commits: %zu bytes for %u steps\n", u.stage, blob->size(),
                r->inner_steps);
  }

  // A sample re-runs the replica of each unit it draws, whole.
  Result<AuditReport> s = honest_->Audit(honest_->task, {.sample = 1, .seed = 3});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->pass) << s->first_mismatch;
  EXPECT_EQ(s->units_executed, 3u);
  EXPECT_EQ(s->stage_steps_compared, 9u);
}

// Unit 0 is stage 0 of replica 0 in round 0; unit 1 its stage 1.
TEST_F(PipelineAuditTest, MissingOrMalformedStepCommitsFailNamingWhatIsMissing) {
  const std::string first = "round 0 replica 0 stage 0 (unit 0, node ";
  auto expect_fails = [&](const json& record, std::set<std::string> refused,
                          const std::string& why) {
    Result<AuditReport> r = honest_->Audit(record, {.full = true}, std::move(refused));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->pass);
    EXPECT_EQ(r->first_mismatch.rfind(first, 0), 0u) << r->first_mismatch;
    EXPECT_NE(r->first_mismatch.find(why), std::string::npos) << r->first_mismatch;
    for (const AuditUnit& u : r->units) {
      EXPECT_EQ(u.check, u.index == 0 ? AuditCheck::kAuditCheckFail : AuditCheck::kAuditCheckPass)
          << u.index << ": " << u.note;
    }
    // Its steps are not compared; every other stage's are, and the rounds still recompute (its
    // delta is the re-run's).
    EXPECT_EQ(r->stage_steps_compared, kStageSteps - 3);
    for (const AuditState& s : r->chain) {
      EXPECT_EQ(s.check, AuditCheck::kAuditCheckPass) << s.name << ": " << s.note;
    }
  };
  json none = honest_->task;
  Unit(none, 0)["stage_commits"] = nullptr;
  expect_fails(none, {}, "its CommitStage named no step commits (stage_commits is null)");
  const std::string blob = Unit(none, 1)["stage_commits"].get<std::string>();
  expect_fails(honest_->task, {Unit(honest_->task, 0)["stage_commits"].get<std::string>()},
               " is not served by any node");
  json other = honest_->task;
  Unit(other, 0)["stage_commits"] = blob;
  expect_fails(other, {}, "step 0's commit is of round 0 replica 0 stage 1 of 3");
}

// A stage unit's step commits whose step 1 holds a received record its sender never signed (the
// record and its blob rewritten here, the unit's commitment with them: the honest nodes made no
// such commit): the audit names the unit at that step and, since the sender's commit does not
// list the record and its signature does not verify, builds the StageRecordWitness of the commit
// alone (the ledger's rule of it: PipelineFraudProofTest.AMadeUpReceivedRecordIsProven...).
TEST_F(PipelineAuditTest, AMadeUpReceivedRecordIsProvenFromTheStagesCommitAlone) {
  json record = honest_->task;
  json& unit = Unit(record, 1);  // round 0, replica 0, stage 1
  BlobGetter all = NodeBlobs(honest_->sim.get(), 6);
  const Hash256 id = Hash256::FromHex(unit["stage_commits"].get<std::string>()).value();
  Result<Bytes> blob = all(id);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  std::vector<protocol::StageStepCommit> commits =
      protocol::DecodeStageStepCommits(*blob, 64).value();
  ASSERT_EQ(commits.size(), 3u);
  ASSERT_FALSE(commits[1].received.empty());
  commits[1].received[0].tensor = Blake2b("a tensor nobody sent");
  const Bytes made_up = protocol::EncodeStageStepCommits(commits);
  const Hash256 made_up_id = BuildManifest(made_up).id().hash;
  std::vector<Hash256> leaves;
  for (const protocol::StageStepCommit& c : commits) leaves.push_back(protocol::StageStepLeaf(c));
  unit["stage_commits"] = made_up_id.ToHex();
  unit["commitment"] = protocol::StageCommitment(leaves).ToHex();
  BlobGetter get = [&](const Hash256& h) -> Result<Bytes> {
    if (h == made_up_id) return made_up;
    return all(h);
  };
  std::vector<StageFraudProof> proofs;
  AuditOptions o{.full = true, .work_dir = honest_->dir + "/audit"};
  o.on_stage_fraud = [&](const AuditUnit&, const StageFraudProof& w) -> json {
    proofs.push_back(w);
    return {{"sent", false}, {"error", "not sent (test)"}};
  };
  Result<AuditReport> r = AuditTaskRecord(Env::Default(), record, get, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  for (const AuditUnit& u : r->units) {
    if (u.index != 1) {
      EXPECT_EQ(u.check, AuditCheck::kAuditCheckPass) << u.index << ": " << u.note;
      continue;
    }
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckFail);
    EXPECT_EQ(u.fraud_segment, 1) << u.note;
    EXPECT_EQ(u.note.rfind("step 1: received record 0 ", 0), 0u) << u.note;
  }
  ASSERT_EQ(proofs.size(), 1u);
  EXPECT_EQ(proofs[0].kind, StageFraudProof::kRecord);
  Result<ledger::StageRecordWitness> w = ledger::DecodeStageRecordWitness(proofs[0].witness);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->record, 0u);
  EXPECT_TRUE(w->other.empty());
  EXPECT_EQ(protocol::DecodeStageStepCommit(w->commit).value(), commits[1]);
}

// A final round holding a stage unit whose committed delta does not decode (the record's
// result_hash rewritten here to a blob of too few floats, served): the audit names the unit, the
// stage's fault, and says why its round is not recomputed (its aggregator reports such a unit:
// Aggregator::ApplyStages); it goes on from the round's recorded state, so round 1 is still
// recomputed and every other unit passes.
TEST_F(PipelineAuditTest, AStageDeltaThatDoesNotDecodeIsNamedAsTheStagesFault) {
  json record = honest_->task;
  const Bytes garbage = EncodeDelta(std::vector<float>{1.0f, 2.0f, 3.0f});
  const Hash256 garbage_id = BuildManifest(garbage).id().hash;
  Unit(record, 1)["result_hash"] = garbage_id.ToHex();  // round 0, replica 0, stage 1
  BlobGetter all = NodeBlobs(honest_->sim.get(), 6);
  BlobGetter get = [&](const Hash256& h) -> Result<Bytes> {
    if (h == garbage_id) return garbage;
    return all(h);
  };
  AuditOptions o{.full = true, .work_dir = honest_->dir + "/audit"};
  Result<AuditReport> r = AuditTaskRecord(Env::Default(), record, get, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  for (const AuditUnit& u : r->units) {
    if (u.index != 1) {
      EXPECT_EQ(u.check, AuditCheck::kAuditCheckPass) << u.index << ": " << u.note;
      continue;
    }
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckFail);
    EXPECT_EQ(u.fraud_segment, -1) << u.note;  // every step agrees: only its result is wrong
    EXPECT_NE(u.note.find("its committed delta " + garbage_id.ShortHex() + " does not decode ("),
              std::string::npos)
        << u.note;
    EXPECT_NE(u.note.find("the stage's fault, which its round's aggregator reports"),
              std::string::npos)
        << u.note;
  }
  ASSERT_EQ(r->chain.size(), 4u);  // initial, rounds 0 and 1, final
  EXPECT_NE(r->chain[1].check, AuditCheck::kAuditCheckPass);
  EXPECT_EQ(r->chain[1].note.rfind("not recomputed: round 0 replica 0 stage 1 (unit 1, node ", 0),
            0u)
      << r->chain[1].note;
  EXPECT_NE(r->chain[1].note.find("does not decode"), std::string::npos) << r->chain[1].note;
  EXPECT_EQ(r->chain[2].check, AuditCheck::kAuditCheckPass) << r->chain[2].note;
}

// The round's aggregator checks each stage unit's step commits blob and keeps it with the task's
// states (aggregator.h): an audit that gets each blob from its round's aggregator alone, as when
// every stage node deleted its copy or left, still compares every stage step.
TEST_F(PipelineAuditTest, TheRoundsAggregatorServesTheStepCommitsOfItsStageUnits) {
  HonestPipeline& h = *honest_;
  ASSERT_EQ(h.task.value("status", std::string()), "finished");
  const std::string state_reason = "state:" + h.sim->task_id().ToHex();
  std::map<std::string, int> aggregator_of;  // step commits blob -> its round's aggregator
  int elsewhere = 0;  // stage units whose stage node is not their round's aggregator
  for (const json& u : h.task["units"]) {
    const uint32_t round = u.value("round", 0u);
    const std::string agg = h.task["round_results"].at(round).value("aggregator", std::string());
    int node = -1;
    for (int i = 0; i < 6; ++i) {
      if (h.sim->node_key(i).public_key().ToHex() == agg) node = i;
    }
    ASSERT_GE(node, 0) << "round " << round << "'s aggregator " << agg << " is no node";
    const std::string blob = u.value("stage_commits", std::string());
    ASSERT_FALSE(blob.empty()) << u.dump();
    Result<Hash256> id = Hash256::FromHex(blob, "stage_commits");
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_EQ(h.sim->agent(node)->pin_book()->Reasons(*id).count(state_reason), 1u)
        << "unit " << u.value("index", 0u) << "'s step commits are not pinned by aggregator "
        << node;
    aggregator_of[blob] = node;
    elsewhere += u.value("assignee", std::string()) != agg;
  }
  ASSERT_EQ(aggregator_of.size(), 12u);
  EXPECT_GT(elsewhere, 0) << "every stage unit's node aggregated its round: the test means nothing";
  BlobGetter all = NodeBlobs(h.sim.get(), 6);
  BlobGetter get = [&](const Hash256& id) -> Result<Bytes> {
    const auto agg = aggregator_of.find(id.ToHex());
    if (agg == aggregator_of.end()) return all(id);
    return h.sim->store(agg->second)->Get(net::BlobId{id});
  };
  AuditOptions o{.full = true, .work_dir = h.dir + "/audit"};
  Result<AuditReport> r = AuditTaskRecord(Env::Default(), h.task, get, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass) << r->first_mismatch;
  EXPECT_EQ(r->stage_steps_compared, kStageSteps);
}

// A cheating stage node on a verifying chain whose other nodes rubber-stamp every check: it is paid
// and the task finishes. `sim` runs it; `cheat` is its node id, `units` its stage units, `record`
// the finished task (get_task with units).
constexpr int kCheater = 5;
struct UncaughtStage {
  testing::SimOptions opt;
  std::unique_ptr<testing::SimHarness> sim;
  std::string cheat;
  json record;
  std::set<uint32_t> units;
  // Runs the task to its end with node kCheater playing `adversary`; false (with the reason as a
  // test failure) when the run means nothing: it did not finish, the cheater was caught while it
  // ran, or it was never placed on a stage.
  // `cheat_options`, when given, sets the cheater's other options (its data plane's).
  bool Run(Adversary adversary, uint64_t seed, const std::string& dir,
           std::function<void(AgentOptions&)> cheat_options = {}) {
    opt = AuditedPipelineOptions(seed, dir, true);
    // The seventh node is the slowest: the first placement leaves it out, so the cheater has a
    // stage.
    opt.node_options[6].speed_factor = 0.25;
    opt.agent_options = [adversary, cheat_options](int node, AgentOptions& a) {
      a.adversary = node == kCheater ? adversary : Adversary::kRubberStamp;
      if (node == kCheater && cheat_options) cheat_options(a);
    };
    sim = std::make_unique<testing::SimHarness>(opt);
    Status setup = sim->Setup();
    if (!setup.ok()) {
      ADD_FAILURE() << setup.ToString();
      return false;
    }
    if (!RunToTheEnd(*sim, 40'000)) {
      ADD_FAILURE() << sim->Task(true).dump().substr(0, 4000);
      return false;
    }
    cheat = sim->node_key(kCheater).public_key().ToHex();
    const json cheater = sim->Call("get_node", {{"id", cheat}});
    if (cheater["reputation"].value("slashes", uint64_t{1}) != 0u) {
      ADD_FAILURE() << "the cheater was caught while the task ran: the audit has nothing to find";
      return false;
    }
    record = sim->Task(true);
    for (const json& u : record["units"]) {
      if (u.value("assignee", std::string()) == cheat) {
        units.insert(u.value("index", 0u));
        EXPECT_EQ(u.value("status", std::string()), "verified") << u.dump();
      }
    }
    if (units.empty()) ADD_FAILURE() << "the cheater was never placed on a stage: meaningless";
    return !units.empty();
  }
  // The audit's on_stage_fraud: sends each witness as the submitter's ProveFraud and answers with
  // its receipt ({"ok", "error"}), counting them in `sent` by kind.
  std::function<json(const AuditUnit&, const StageFraudProof&)> ProveOnChain(
      std::map<std::string, int>* sent) {
    return [this, sent](const AuditUnit& u, const StageFraudProof& w) -> json {
      ++(*sent)[std::string(StageFraudProofName(w.kind))];
      std::printf("unit %u step %d: a ProveFraud %s witness of %zu bytes\n", u.index,
                  u.fraud_segment, std::string(StageFraudProofName(w.kind)).c_str(),
                  w.witness.size());
      Result<TxOutcome> out = sim->ProveAsSubmitter(
          ledger::ProveFraudTx{.task_id = sim->task_id(),
                               .index = u.index,
                               .segment = static_cast<uint32_t>(u.fraud_segment),
                               .witness = {w.witness}});
      if (!out.ok()) return {{"ok", false}, {"error", out.status().message()}};
      return {{"ok", out->ok}, {"error", out->reason}};
    };
  }
  // Whether the ledger recorded a proven fraud of unit `index` at step `step`, and the cheater is
  // slashed and jailed.
  void ExpectProven(uint32_t index, uint32_t step) {
    const json cheater = sim->Call("get_node", {{"id", cheat}});
    EXPECT_GE(cheater["reputation"].value("slashes", uint64_t{0}), 1u) << cheater.dump();
    EXPECT_EQ(cheater.value("status", std::string()), "jailed") << cheater.dump();
    const json after = sim->Task(false);
    bool proven = false;
    for (const json& f : after["verification"]["proven_frauds"]) {
      proven |= f.value("index", 0u) == index && f.value("segment", step + 1) == step;
    }
    EXPECT_TRUE(proven) << after["verification"].dump();
  }
};

// A lazy stage (every step's commit claims the state it started from): the audit finds each of
// its stage units at step 0 (its state_after) and proves the first with the step witness it
// builds; the ledger replays it and slashes the node. The later units of the same node are refused
// once the first proof has rewound the task (they run again).
TEST(PipelineAuditProofTest, AnUncaughtLazyStageIsFoundAtItsStepAndProvenOnChain) {
  UncaughtStage run;
  if (!run.Run(Adversary::kLazy, 17, "pipeline-audit-lazy")) return;
  const std::set<uint32_t>& lazy = run.units;
  const std::string& cheat = run.cheat;
  std::map<std::string, int> sent;
  AuditOptions o{.full = true, .work_dir = run.opt.root + "/audit"};
  o.on_stage_fraud = run.ProveOnChain(&sent);
  testing::SimHarness& sim = *run.sim;
  const json& record = run.record;
  Result<AuditReport> r = AuditTaskRecord(Env::Default(), record, NodeBlobs(&sim, 7), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  EXPECT_EQ(r->stage_steps_compared, kStageSteps);
  const AuditUnit* first = nullptr;
  for (const AuditUnit& u : r->units) {
    if (!lazy.count(u.index)) {
      EXPECT_EQ(u.check, AuditCheck::kAuditCheckPass) << u.index << ": " << u.note;
      EXPECT_TRUE(u.proof.is_null()) << u.index;
      continue;
    }
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckFail) << u.index;
    EXPECT_EQ(u.fraud_segment, 0) << u.index << ": " << u.note;
    EXPECT_EQ(u.note.rfind("step 0: state_after ", 0), 0u) << u.note;
    if (first == nullptr) {
      first = &u;
    } else {
      // The first proof reopened the task and rewound it to its round: this one runs again.
      EXPECT_FALSE(u.proof.value("ok", true)) << u.proof.dump();
      EXPECT_NE(u.proof.value("error", std::string()).find("is not final"), std::string::npos)
          << u.proof.dump();
    }
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(
      r->first_mismatch.rfind(
          "round " + std::to_string(first->round) + " replica " + std::to_string(first->replica) +
              " stage " + std::to_string(first->stage) + " (unit " + std::to_string(first->index) +
              ", node " + cheat.substr(0, 16) + "): step 0: state_after ",
          0),
      0u)
      << r->first_mismatch;
  // Its lazy commits hash what the stage started from; its delta and what it sent are honest,
  // so every round recomputes.
  for (const AuditState& s : r->chain) {
    EXPECT_EQ(s.check, AuditCheck::kAuditCheckPass) << s.name << ": " << s.note;
  }
  EXPECT_EQ(sent, (std::map<std::string, int>{{"step", static_cast<int>(lazy.size())}}));
  EXPECT_TRUE(first->proof.value("ok", false)) << first->proof.dump();
  run.ExpectProven(first->index, 0);
}

// A drifting stage (noisy's perturbation between two steps, each step committed as trained): every
// step replays clean from its own state_before, so only continuity sees it. The audit finds each of
// its stage units at step PoisonAfterSteps(3) = 1, whose state_before is not step 0's state_after,
// whatever the step received, and proves the first from the two commits alone
// (StageContinuityWitness); the ledger rules it as it rules a continuity claim and slashes the
// node. Its neighbours, which received what its drifted state sent, are named with it as the
// sender and are not proven.
TEST(PipelineAuditProofTest, AnUncaughtDriftingStageIsProvenFromItsTwoCommitsOnChain) {
  UncaughtStage run;
  if (!run.Run(Adversary::kDrift, 17, "pipeline-audit-drift")) return;
  std::map<std::string, int> sent;
  AuditOptions o{.full = true, .work_dir = run.opt.root + "/audit"};
  o.on_stage_fraud = run.ProveOnChain(&sent);
  Result<AuditReport> r =
      AuditTaskRecord(Env::Default(), run.record, NodeBlobs(run.sim.get(), 7), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  const AuditUnit* first = nullptr;
  for (const AuditUnit& u : r->units) {
    if (!run.units.count(u.index)) {
      // An honest stage proven by nothing: at most named as receiving what the drift sent.
      if (u.check == AuditCheck::kAuditCheckFail && u.fraud_segment >= 0) {
        EXPECT_NE(u.note.find("received"), std::string::npos) << u.index << ": " << u.note;
        EXPECT_FALSE(u.proof.value("sent", true)) << u.proof.dump();
      }
      continue;
    }
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckFail) << u.index;
    EXPECT_EQ(u.fraud_segment, 1) << u.index << ": " << u.note;
    EXPECT_EQ(u.note.rfind("step 1: state_before ", 0), 0u) << u.note;
    if (first == nullptr) first = &u;
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(sent, (std::map<std::string, int>{{"continuity", static_cast<int>(run.units.size())}}));
  EXPECT_TRUE(first->proof.value("ok", false)) << first->proof.dump();
  run.ExpectProven(first->index, 1);
}

// A stage that computes its part honestly and commits what it computed, but sends (and signs) its
// neighbours a corrupted tensor at step 1 (StagePlaneOptions::corrupt_sent with
// commit_uncorrupted): its own commit agrees with the re-run everywhere; its receivers, whose
// records carry its signature, differ at step 1. The audit names it at step 1 and proves its unit
// from the two commits (StageRecordWitness: its commit, the record, the receiver's commit as
// other; the ledger's rule of it: PipelineFraudProofTest.ASentRecordItsCommitDoesNotList...); the
// ledger slashes and jails its node. The receivers are named as having received it, not proven.
// Before, the audit named the sender's fault in the receiver's note and sent nothing.
TEST(PipelineAuditProofTest, AStageThatSignsWhatItsCommitDoesNotListIsProvenOnChain) {
  UncaughtStage run;
  auto hide = [](AgentOptions& a) {
    a.stage_plane.corrupt_sent = [](const protocol::StageTensorKey& k) {
      return k.step == 1 && k.micro_batch == 0;
    };
    a.stage_plane.commit_uncorrupted = true;
  };
  if (!run.Run(Adversary::kRubberStamp, 17, "pipeline-audit-hidden-send", hide)) return;
  std::map<std::string, int> sent;
  AuditOptions o{.full = true, .work_dir = run.opt.root + "/audit"};
  o.on_stage_fraud = run.ProveOnChain(&sent);
  Result<AuditReport> r =
      AuditTaskRecord(Env::Default(), run.record, NodeBlobs(run.sim.get(), 7), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass);
  const AuditUnit* first = nullptr;
  for (const AuditUnit& u : r->units) {
    if (!run.units.count(u.index)) {
      // An honest stage: at most named as receiving what the cheater sent (or what it computed
      // from that), never proven.
      if (u.check == AuditCheck::kAuditCheckFail) {
        EXPECT_NE(u.note.find("received"), std::string::npos) << u.index << ": " << u.note;
      }
      // (A proof sent answers with its receipt, {"ok", "error"}; one not sent says so.)
      EXPECT_FALSE(u.proof.is_object() && u.proof.contains("ok"))
          << u.index << ": " << u.proof.dump();
      continue;
    }
    EXPECT_EQ(u.check, AuditCheck::kAuditCheckFail) << u.index;
    EXPECT_EQ(u.fraud_segment, 1) << u.index << ": " << u.note;
    EXPECT_EQ(u.note.rfind("step 1: it signed received record ", 0), 0u) << u.note;
    EXPECT_NE(u.note.find("which its commit does not list among what it sent"), std::string::npos)
        << u.note;
    if (first == nullptr) first = &u;
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(sent, (std::map<std::string, int>{{"record", static_cast<int>(run.units.size())}}));
  EXPECT_TRUE(first->proof.value("ok", false)) << first->proof.dump();
  run.ExpectProven(first->index, 1);
}

// A stage node whose every stage unit commits a delta that does not decode (its delta less its
// last value: AgentOptions::malformed_stage_result), on a chain without verification (nobody checks
// its result before the round's aggregator fetches it). The aggregator reports the unit
// (ReportUnavailableTx) instead of leaving its replica out: the round re-runs without the node,
// whose units the task's record no longer holds, and the task ends with the honest run's final
// state, bit for bit. Before, the aggregator left the replica out (logged, bad_deltas): the round
// aggregated one replica, every stage of the other was paid for a replica the model never got,
// the bad one's commits blob was pinned by nobody but its node, and the final state was another.
TEST_F(PipelineAuditTest, AStageWhoseDeltaDoesNotDecodeIsReportedAndItsRoundRerunsWithoutIt) {
  testing::SimOptions opt = AuditedPipelineOptions(15, "pipeline-audit-malformed", false);
  opt.nodes = 7;
  opt.node_options.resize(7);
  // The seventh node is the slowest: the first placement leaves it out, so node kCheater has a
  // stage.
  opt.node_options[6].speed_factor = 0.25;
  opt.agent_options = [](int node, AgentOptions& a) {
    a.malformed_stage_result = node == kCheater;
  };
  testing::SimHarness sim(opt);
  Status setup = sim.Setup();
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  ASSERT_TRUE(RunToTheEnd(sim, 40'000)) << sim.Task(true).dump().substr(0, 3000);
  uint64_t bad = 0;
  for (int i = 0; i < 7; ++i) bad += sim.agent(i)->stats().bad_deltas;
  ASSERT_GT(bad, 0u) << "no aggregator fetched the malformed delta: the test means nothing";
  const json task = sim.Task(true);
  const std::string cheat = sim.node_key(kCheater).public_key().ToHex();
  for (const json& u : task["units"]) {
    EXPECT_NE(u.value("assignee", std::string()), cheat) << u.dump();
  }
  EXPECT_EQ(task.value("final_state", std::string()),
            honest_->task.value("final_state", std::string()));
  std::printf("%llu malformed stage deltas reported\n", static_cast<unsigned long long>(bad));
}

}  // namespace
}  // namespace meshlearn::node::pipeline_audit
