// Pipeline tasks on the ledger (issue 15; docs/protocol.md, "Pipeline stage units"): a task with
// TaskParams::stages > 1 has R replicas x S stage units a round, placed by protocol::PlaceStages
// at the end of a block, committed stage by stage with CommitStage, aggregated and paid as units
// are; a stage whose node goes silent is placed again on a free node. Every refusal of the new
// fields is tested. Checked against a follower after every block (FollowedChainFixture).
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "execute.h"
#include "meshlearn/base/blob.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_step.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/state_blob.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "pipeline_test_util.h"
#include "stage_disk.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using pipeline_testing::kGiB;
using pipeline_testing::kReplicas;
using pipeline_testing::kRulingBundle;
using pipeline_testing::kStages;
using pipeline_testing::PipelineParams;
using pipeline_testing::PipelineRulingTest;
using pipeline_testing::PipelineVerificationTest;
using pipeline_testing::TestStageEvidence;
using protocol::RoundPhase;
using protocol::RoundStateMachine;
using testing::ExpectRulings;
using testing::FollowedChainFixture;
using testing::kTestPrice;
using testing::kTestUnitCost;
using testing::RulingBy;
using testing::TestKey;
using testing::TestTaskParams;

class PipelineStageTest : public FollowedChainFixture {
 protected:
  PipelineStageTest() {
    genesis_ = DevnetGenesis({alice_.public_key(), bob_.public_key()}, kFunds, "test-chain");
    genesis_.params.liveness_blocks = 1000;  // no heartbeats needed in these tests
    genesis_.params.verification = false;    // stage units are not verified yet
    genesis_.params.min_deadline_blocks = 4;
    // Seven nodes for six slots: (memory, throughput). Only n1 and n2 hold stage 2 (5 GiB); n3 is
    // the fastest but holds only stage 1.
    const std::vector<std::pair<uint64_t, uint64_t>> caps = {
        {8 * kGiB, 4'000'000'000'000}, {8 * kGiB, 3'000'000'000'000}, {2 * kGiB, 5'000'000'000'000},
        {2 * kGiB, 1'000'000'000'000}, {4 * kGiB, 2'000'000'000'000}, {4 * kGiB, 1'000'000'000'000},
        {4 * kGiB, 1'000'000'000'000}};
    for (size_t i = 0; i < caps.size(); ++i) {
      nodes_.push_back(TestKey(static_cast<uint8_t>(21 + i)));
      caps_.push_back(caps[i]);
    }
  }

  RegisterNodeTx Reg(size_t i) {
    return RegisterNodeTx{.node_id = nodes_[i].public_key(),
                          .endpoint = "http://stage" + std::to_string(i) + ":1",
                          .roles = kRoleSolver | kRoleAggregator,
                          .capabilities = {.cores = 4,
                                           .memory_bytes = caps_[i].first,
                                           .throughput = caps_[i].second,
                                           .latency_ms = 1,
                                           .bandwidth_bytes_per_s = 1'000'000'000},
                          .price = kTestPrice,
                          .stake = 100};
  }

  // The drawn aggregator of task_id_'s current round commits `state` for `round`.
  void CommitAggregate(uint32_t round, std::string_view state) {
    const RoundStateMachine m = Machine();
    ASSERT_TRUE(m.aggregator().has_value());
    for (const Receipt& x : Step({Q(alice_, CommitAggregateTx{.task_id = task_id_,
                                            .round = round,
                                            .node_id = m.aggregator()->node,
                                            .state_hash = Blake2b(state)})})) {
      ASSERT_TRUE(x.ok) << x.reason;
    }
  }

  // Registers every node (Reg), n1 declaring `n1_disk` bytes of disk and n2 `n2_disk`, the
  // others none (0: not checked), in one block.
  void RegisterWithDisks(uint64_t n1_disk, uint64_t n2_disk) {
    std::vector<Transaction> regs;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      RegisterNodeTx reg = Reg(i);
      if (i == 0) reg.capabilities.disk_bytes = n1_disk;
      if (i == 1) reg.capabilities.disk_bytes = n2_disk;
      regs.push_back(Q(alice_, reg));
    }
    for (const Receipt& r : Step(regs)) ASSERT_TRUE(r.ok) << r.reason;
  }

  // Registers the first `count` nodes (all owned by alice) and submits `p` from bob; the
  // submit's receipt.
  Receipt Start(const TaskParams& p, size_t count = 7, Amount budget = kBudget) {
    std::vector<Transaction> regs;
    for (size_t i = 0; i < count; ++i) regs.push_back(Q(alice_, Reg(i)));
    for (const Receipt& r : Step(regs)) EXPECT_TRUE(r.ok) << r.reason;
    return Submit(p, budget);
  }

  // Submits `p` from bob (the task becomes task_id_); the submit's receipt.
  Receipt Submit(const TaskParams& p, Amount budget = kBudget) {
    Transaction submit = Q(bob_, SubmitTaskTx{.spec_hash = Blake2b("pipeline bundle"),
                                              .budget = budget,
                                              .price_cap = 20,
                                              .params = p});
    task_id_ = TaskIdFor(bob_.public_key(), submit.nonce);
    return Step({submit})[0];
  }

  TaskRecord Task() { return chain_->GetTask(task_id_).value(); }
  RoundStateMachine Machine() { return RoundStateMachine::Decode(Task().runtime).value(); }
  WorkUnit Unit(uint32_t round, uint32_t replica, uint32_t stage) {
    const uint32_t index = StageUnitIndex(Task().params, {round, replica, stage});
    return chain_->ListWorkUnits(task_id_).at(index);
  }
  size_t NodeIndex(const PublicKey& id) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].public_key() == id) return i;
    }
    ADD_FAILURE() << "not a test node: " << id.ShortHex();
    return 0;
  }

  // The commit of the unit's current placement (its node and assignment beacon).
  CommitStageTx Commit(uint32_t round, uint32_t replica, uint32_t stage) {
    const std::string name =
        std::to_string(round) + "/" + std::to_string(replica) + "/" + std::to_string(stage);
    const WorkUnit u = Unit(round, replica, stage);
    return CommitStageTx{.task_id = task_id_,
                         .round = round,
                         .replica = replica,
                         .stage = stage,
                         .node_id = u.assignee,
                         .result_hash = Blake2b("stage delta " + name),
                         .commitment = Blake2b("stage commitment " + name),
                         .loss_micros = stage + 1 == kStages ? 2'000'000u + replica : 0u,
                         .commits = Blake2b("stage commits " + name),
                         .assignment_beacon = u.assignment_beacon};
  }

  // What PlaceStages gives for the round placed at `height` from the registered nodes (with the
  // links they reported, unless `links` is false): the chains the ledger must have recorded as
  // the units' assignees.
  std::vector<std::vector<protocol::NodeId>> WantChains(uint64_t height, bool links = true) {
    std::vector<protocol::NodeView> views;
    for (const KeyPair& k : nodes_) {
      NodeRecord n = chain_->GetNode(k.public_key()).value();
      views.push_back({.id = n.id,
                       .memory_bytes = n.capabilities.memory_bytes,
                       .disk_bytes = n.capabilities.disk_bytes,
                       .throughput_flops = n.capabilities.throughput,
                       .latency_ms = n.capabilities.latency_ms,
                       .bandwidth_bytes_per_s = n.capabilities.bandwidth_bytes_per_s,
                       .price_per_gflop = n.price,
                       .last_heartbeat_height = n.last_heartbeat_height});
      for (const NodeLink& l : n.links) {
        if (links) views.back().links.push_back({l.peer, l.latency_ms, l.bandwidth_bytes_per_s});
      }
    }
    const TaskRecord t = Task();
    std::vector<protocol::StageNeed> needs;
    for (uint32_t s = 0; s < kStages; ++s) {
      needs.push_back({t.params.stage_memory_bytes[s], t.params.stage_flops[s]});
    }
    Result<std::vector<std::vector<protocol::NodeId>>> chains = protocol::PlaceStages(
        TaskSpecViewOf(task_id_, t.params, t.price_cap), needs, t.params.stage_boundary_bytes,
        kReplicas, views, height, SchedulerParamsOf(genesis_));
    EXPECT_TRUE(chains.ok()) << chains.status().ToString();
    return chains.ok() ? *chains : std::vector<std::vector<protocol::NodeId>>{};
  }

  static constexpr Amount kBudget = 100'000;
  std::vector<KeyPair> nodes_;
  std::vector<std::pair<uint64_t, uint64_t>> caps_;
  Hash256 task_id_;
};

// Reported links pair the stages: without them round 0's chains are n5 -> n3 -> n1 and
// (n6 or n7) -> n4 -> n2 (memory and speed; 1-based names as above); n5 measured a fast link to
// n4 and n4 one to n2, so the first replica runs n5 -> n4 -> n2 and the second takes n3 and n1.
TEST_F(PipelineStageTest, ReportedLinksPairTheStagesOfEachReplica) {
  std::vector<Transaction> regs;
  for (size_t i = 0; i < nodes_.size(); ++i) regs.push_back(Q(alice_, Reg(i)));
  for (const Receipt& r : Step(regs)) ASSERT_TRUE(r.ok) << r.reason;
  auto fast = [&](size_t to) {
    return NodeLink{
        .peer = nodes_[to].public_key(), .latency_ms = 0, .bandwidth_bytes_per_s = 10'000'000'000};
  };
  for (const Receipt& r :
       Step({Q(alice_, ReportLinksTx{.node_id = nodes_[4].public_key(), .links = {fast(3)}}),
             Q(alice_, ReportLinksTx{.node_id = nodes_[3].public_key(), .links = {fast(1)}})})) {
    ASSERT_TRUE(r.ok) << r.reason;
  }
  ASSERT_TRUE(Submit(PipelineParams()).ok);
  const uint64_t height = chain_->Height();
  const std::vector<std::vector<protocol::NodeId>> without = WantChains(height, false);
  ASSERT_EQ(without.size(), kReplicas);
  ASSERT_EQ(without[0][0], nodes_[4].public_key());
  ASSERT_EQ(without[0][1], nodes_[2].public_key());
  ASSERT_EQ(without[1][1], nodes_[3].public_key());
  const std::vector<protocol::NodeId> first = {nodes_[4].public_key(), nodes_[3].public_key(),
                                               nodes_[1].public_key()};
  const std::vector<protocol::NodeId> second = {without[1][0], nodes_[2].public_key(),
                                                nodes_[0].public_key()};
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(Unit(0, 0, s).assignee, first[s]) << "stage " << s;
    EXPECT_EQ(Unit(0, 1, s).assignee, second[s]) << "stage " << s;
  }
  EXPECT_EQ(WantChains(height), (std::vector<std::vector<protocol::NodeId>>{first, second}));
}

// The ledger weighs each boundary's links by the task's own stage_boundary_bytes: n5 reported a
// near but slow link to n4 (0 ms, 10 MB/s); every other pair is the registered estimate (1 ms +
// 1 ms, 1 GB/s). At 1 MiB (PipelineParams) the slow link costs 105 ms against 3 ms, and the
// first boundary keeps n5 -> n3; a task that moves 1 KiB there (0.1 ms against 2 ms) pairs n5
// with n4. The second boundary has no reported link and keeps its order.
TEST_F(PipelineStageTest, TheLedgerWeighsEachBoundarysLinksByTheTasksBytes) {
  std::vector<Transaction> regs;
  for (size_t i = 0; i < nodes_.size(); ++i) regs.push_back(Q(alice_, Reg(i)));
  for (const Receipt& r : Step(regs)) ASSERT_TRUE(r.ok) << r.reason;
  const NodeLink slow{
      .peer = nodes_[3].public_key(), .latency_ms = 0, .bandwidth_bytes_per_s = 10'000'000};
  ASSERT_TRUE(
      Step({Q(alice_, ReportLinksTx{.node_id = nodes_[4].public_key(), .links = {slow}})})[0].ok);
  TaskParams p = PipelineParams();
  p.stage_boundary_bytes = {1u << 10, 1u << 20};
  ASSERT_TRUE(Submit(p).ok);
  const uint64_t height = chain_->Height();
  const std::vector<std::vector<protocol::NodeId>> without = WantChains(height, false);
  ASSERT_EQ(without.size(), kReplicas);
  ASSERT_EQ(without[0][0], nodes_[4].public_key());
  ASSERT_EQ(without[0][1], nodes_[2].public_key());
  ASSERT_EQ(without[1][1], nodes_[3].public_key());
  const std::vector<protocol::NodeId> first = {nodes_[4].public_key(), nodes_[3].public_key(),
                                               without[0][2]};
  const std::vector<protocol::NodeId> second = {without[1][0], nodes_[2].public_key(),
                                                without[1][2]};
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(Unit(0, 0, s).assignee, first[s]) << "stage " << s;
    EXPECT_EQ(Unit(0, 1, s).assignee, second[s]) << "stage " << s;
  }
  EXPECT_EQ(WantChains(height), (std::vector<std::vector<protocol::NodeId>>{first, second}));
}

TEST(PipelineStageSlotTest, UnitIndexIsRoundReplicaStage) {
  TaskParams p = PipelineParams();
  EXPECT_EQ(PipelineReplicas(p), kReplicas);
  EXPECT_EQ(StageUnitIndex(p, {1, 1, 2}), 1u * 6 + 1 * 3 + 2);
  for (uint32_t i = 0; i < p.rounds * p.units_per_round; ++i) {
    EXPECT_EQ(StageUnitIndex(p, StageSlotOf(p, i)), i);
  }
  EXPECT_EQ(StageSlotOf(p, 10), (StageSlot{1, 1, 1}));
  // A task without stages: the replica is the shard, the stage 0.
  TaskParams plain = TestTaskParams();
  EXPECT_EQ(PipelineReplicas(plain), plain.units_per_round);
  EXPECT_EQ(StageSlotOf(plain, 4), (StageSlot{1, 1, 0}));
}

// A stage unit is paid its stage's share of a unit's cost, so a pipelined task costs what the
// same training unpipelined does (plus rounding), not S times it.
TEST(PipelineStageSlotTest, AStageIsPaidItsShareOfTheUnitAndTheTaskCostsAboutAnUnpipelinedOne) {
  TaskParams p = PipelineParams();  // stage_flops 30:20:10 GFLOP
  EXPECT_EQ(StageUnitCost(p, 600, 0), 300u);
  EXPECT_EQ(StageUnitCost(p, 600, 1), 200u);
  EXPECT_EQ(StageUnitCost(p, 600, 2), 100u);
  EXPECT_EQ(StageUnitCost(p, 1, 2), 1u) << "rounded up: a stage is never paid nothing";
  EXPECT_EQ(StageUnitCost(p, 0, 2), 0u);
  p.stage_flops = {UINT64_MAX, UINT64_MAX, UINT64_MAX};        // no overflow in the share
  EXPECT_EQ(StageUnitCost(p, UINT64_MAX, 1), UINT64_MAX / 3);  // 2^64 - 1 = 3 x 6148914691236517205
  EXPECT_EQ(StageUnitCost(TestTaskParams(), 600, 0), 600u) << "a task without stages";
  // The budget SubmitTask asks: every replica's stages (one unit's cost, rounded up per stage),
  // each unit's verifications at that unit's cost (a stage check is paid at most its stage's
  // share), one aggregation, per round.
  p = PipelineParams();
  Amount unit = 0;
  const Amount most = MaxTaskCost(p, 20, &unit, 1);
  ASSERT_EQ(unit, 640u);  // 32 GFLOP at 20 a GFLOP
  const Amount stages =
      StageUnitCost(p, unit, 0) + StageUnitCost(p, unit, 1) + StageUnitCost(p, unit, 2);
  EXPECT_EQ(stages, 320u + 214u + 107u);
  EXPECT_EQ(most, p.rounds * (kReplicas * stages * 2 + unit));
  TaskParams plain = TestTaskParams();
  EXPECT_EQ(MaxTaskCost(plain, 20, &unit, 1),
            plain.rounds * (plain.units_per_round * 2 + 1) * unit);
}

TEST(PipelineStageSlotTest, ThePipelineFieldsSurviveEveryEncoding) {
  const KeyPair k = TestKey(9);
  SubmitTaskTx submit{
      .spec_hash = Blake2b("s"), .budget = 10, .price_cap = 1, .params = PipelineParams()};
  Transaction tx = BuildSignedTx(k, "c", 0, submit);
  Result<Transaction> back = DecodeTx(EncodeTx(tx));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<SubmitTaskTx>(back->payload).params, PipelineParams());
  nlohmann::json j = TxToJson(tx);
  EXPECT_EQ(j["payload"]["params"]["stage_memory_bytes"][2], 5 * kGiB);
  EXPECT_EQ(j["payload"]["params"]["stage_boundary_bytes"][1], 1u << 20);
  Result<Transaction> from_json = TxFromJson(j);
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
  EXPECT_EQ(std::get<SubmitTaskTx>(from_json->payload).params, PipelineParams());
  j["payload"]["params"]["stage_flops"] = nlohmann::json::array({1, -2, 3});
  Result<Transaction> negative = TxFromJson(j);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("stage_flops"), std::string::npos)
      << negative.status().ToString();
  // A list longer than kMaxU64ListLength does not decode.
  submit.params.stage_flops.assign(kMaxU64ListLength + 1, 1);
  Result<Transaction> too_long = DecodeTx(EncodeTx(BuildSignedTx(k, "c", 0, submit)));
  EXPECT_FALSE(too_long.ok());
}

TEST(PipelineStageSlotTest, TermsRefuseBadStageFields) {
  auto refused = [](const TaskParams& p, bool verification, const std::string& want) {
    Status s = ValidateTaskTerms(p, 1'000'000, 20, verification, 2);
    EXPECT_FALSE(s.ok()) << want;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();
  };
  EXPECT_TRUE(ValidateTaskTerms(PipelineParams(), 1'000'000, 20, false, 0).ok());
  TaskParams p = PipelineParams();
  p.stages = 0;
  refused(p, false, "params.stages must be in [1, 256]");
  p.stages = 257;
  refused(p, false, "params.stages must be in [1, 256]");
  p = PipelineParams();
  p.units_per_round = 7;
  refused(p, false, "params.units_per_round = 7 must be replicas x params.stages");
  p = PipelineParams();
  p.stage_flops.pop_back();
  refused(p, false, "must hold one entry per stage (3), got 3 and 2");
  p = PipelineParams();
  p.stage_memory_bytes[1] = 0;
  refused(p, false, "params.stage_memory_bytes[1] and params.stage_flops[1] must be > 0");
  p = TestTaskParams();
  p.stage_flops = {1};
  refused(p, false, "must be empty for a task without stages");
  // One boundary byte count between each two consecutive stages, in [1, 1 TiB].
  p = PipelineParams();
  p.stage_boundary_bytes.pop_back();
  refused(p, false,
          "params.stage_boundary_bytes must hold one entry per boundary between consecutive "
          "stages (params.stages - 1 = 2), got 1");
  p.stage_boundary_bytes = {1, 2, 3};
  refused(p, false, "(params.stages - 1 = 2), got 3");
  p = PipelineParams();
  p.stage_boundary_bytes[1] = 0;
  refused(p, false,
          "params.stage_boundary_bytes[1] = 0 must be in [1, 1099511627776]: the bytes a step "
          "moves between stages 1 and 2");
  p.stage_boundary_bytes[1] = protocol::kMaxStageBoundaryBytes + 1;
  refused(p, false, "params.stage_boundary_bytes[1] = 1099511627777 must be in [1, ");
  p.stage_boundary_bytes[1] = protocol::kMaxStageBoundaryBytes;
  EXPECT_TRUE(ValidateTaskTerms(p, 1'000'000, 20, false, 0).ok());
  p = TestTaskParams();
  p.stage_boundary_bytes = {1};
  refused(p, false, "params.stage_boundary_bytes must be empty for a task without stages");
  // The aggregator's evaluator is a pipeline task's term: an unsplit task's aggregator evaluates
  // with its units' trainer.
  p = TestTaskParams();
  p.eval_memory_bytes = 1;
  refused(p, false, "params.eval_memory_bytes = 1 must be 0 for a task without stages");
  p = PipelineParams();
  p.eval_memory_bytes = 1;
  EXPECT_TRUE(ValidateTaskTerms(p, 1'000'000, 20, false, 0).ok());
  // A verifying chain checks every stage unit (one leaf per step in CommitStage, exact replays).
  EXPECT_TRUE(ValidateTaskTerms(PipelineParams(), 1'000'000, 20, true, 2).ok());
  p = PipelineParams();
  p.inner_steps = 64;
  p.checkpoint_interval = 64;
  refused(p, true,
          "params.inner_steps = 64 with params.stages = 3: a stage unit commits one "
          "leaf per step, and at most 63 fit in a CommitStage on a verifying chain");
  EXPECT_TRUE(ValidateTaskTerms(p, 1'000'000, 20, false, 0).ok());
  p = PipelineParams();
  p.tolerance_rel_l2_ppm = 10;
  refused(p, true, "a stage step is replayed exactly; tolerance mode");
  // A client names the task file's keys.
  p = PipelineParams();
  p.units_per_round = 7;
  Status named = ValidateTaskTerms(p, 1'000'000, 20, false, 0,
                                   [](std::string_view f) { return "network." + std::string(f); });
  EXPECT_NE(named.message().find("network.units_per_round = 7"), std::string::npos)
      << named.ToString();
}

// The aggregator builds the whole model and holds the round's state and deltas
// (protocol::AggregatorMemoryBytes): a task whose stages fit the nodes but whose whole model none
// holds waits for an aggregator that does, and only that node aggregates.
TEST_F(PipelineStageTest, OnlyANodeThatHoldsTheWholeModelAggregates) {
  TaskParams p = PipelineParams();
  p.memory_bytes = 8 * kGiB;  // a whole unit: n1 and n2 (8 GiB) hold it, not the state as well
  ASSERT_TRUE(Start(p).ok);
  std::vector<Transaction> txs;
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) txs.push_back(Q(alice_, Commit(0, rep, s)));
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  for (int i = 0; i < 3; ++i) Step();
  ASSERT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
  EXPECT_FALSE(Machine().aggregator().has_value())
      << "node " << NodeIndex(Machine().aggregator()->node) << " cannot hold the round";
  // A node that holds it: 8 GiB + (2 replicas' deltas + weights and momentum + 3 for the largest
  // transient) x model_bytes.
  nodes_.push_back(TestKey(40));
  caps_.push_back({8 * kGiB + 7 * p.model_bytes, 1'000'000'000'000});
  for (const Receipt& x : Step({Q(alice_, Reg(nodes_.size() - 1))})) EXPECT_TRUE(x.ok) << x.reason;
  ASSERT_TRUE(Machine().aggregator().has_value());
  EXPECT_EQ(NodeIndex(Machine().aggregator()->node), nodes_.size() - 1);
}

// A pipeline task that declares its aggregator's evaluator (eval_memory_bytes: the weights and
// one evaluation forward, not the whole model's training state) is aggregated by a node that
// holds that, the state and the deltas, though not a whole unit's training need besides.
TEST_F(PipelineStageTest, ANodeThatHoldsTheEvaluatorAggregates) {
  TaskParams p = PipelineParams();
  p.memory_bytes = 12 * kGiB;      // a whole unit: what the old bound counted
  p.eval_memory_bytes = 8 * kGiB;  // n1 and n2 (8 GiB) hold it, not the state as well
  ASSERT_TRUE(Start(p).ok);
  std::vector<Transaction> txs;
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) txs.push_back(Q(alice_, Commit(0, rep, s)));
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  for (int i = 0; i < 3; ++i) Step();
  ASSERT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
  EXPECT_FALSE(Machine().aggregator().has_value())
      << "node " << NodeIndex(Machine().aggregator()->node) << " cannot hold the round";
  // Exactly the new bound (8 GiB + 7 x model_bytes), below the old (12 GiB + 7 x model_bytes).
  nodes_.push_back(TestKey(40));
  caps_.push_back({8 * kGiB + 7 * p.model_bytes, 1'000'000'000'000});
  for (const Receipt& x : Step({Q(alice_, Reg(nodes_.size() - 1))})) EXPECT_TRUE(x.ok) << x.reason;
  ASSERT_TRUE(Machine().aggregator().has_value());
  EXPECT_EQ(NodeIndex(Machine().aggregator()->node), nodes_.size() - 1);
}

TEST_F(PipelineStageTest, StagesArePlacedCommittedAggregatedAndReplaced) {
  Receipt submit = Start(PipelineParams());
  ASSERT_TRUE(submit.ok) << submit.reason;
  const uint64_t submit_height = chain_->Height();
  TaskRecord t = Task();
  EXPECT_EQ(t.unit_count, 2u * kReplicas * kStages);

  // ---- Round 0 placed at the end of the submit's block: exactly PlaceStages' chains, a node
  // per slot, each holding its stage; stage 2 (5 GiB) only on n1 and n2 (index 0 and 1).
  const std::vector<std::vector<protocol::NodeId>> want = WantChains(submit_height);
  ASSERT_EQ(want.size(), kReplicas);
  std::set<PublicKey> used;
  for (uint32_t r = 0; r < kReplicas; ++r) {
    for (uint32_t s = 0; s < kStages; ++s) {
      WorkUnit u = Unit(0, r, s);
      ASSERT_EQ(u.status, WorkUnitStatus::kAssigned) << r << "/" << s;
      EXPECT_EQ(u.assignee, want[r][s]) << r << "/" << s;
      EXPECT_GE(caps_[NodeIndex(u.assignee)].first, t.params.stage_memory_bytes[s]);
      EXPECT_GE(u.deadline_height, submit_height + genesis_.params.min_deadline_blocks);
      EXPECT_EQ(u.price, kTestPrice);
      EXPECT_TRUE(used.insert(u.assignee).second) << "a node holds two slots";
    }
    EXPECT_LE(NodeIndex(Unit(0, r, 2).assignee), 1u);
  }
  EXPECT_EQ(Unit(1, 0, 0).status, WorkUnitStatus::kPending);
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseTraining);

  // ---- Refusals: every new field, a CommitUnit on a pipeline task, a foreign stage.
  CommitStageTx bad_stage = Commit(0, 0, 0);
  bad_stage.stage = kStages;
  CommitStageTx bad_replica = Commit(0, 0, 0);
  bad_replica.replica = kReplicas;
  CommitStageTx bad_round = Commit(0, 0, 0);
  bad_round.round = 2;
  CommitStageTx foreign = Commit(0, 0, 1);
  foreign.node_id = Unit(0, 1, 1).assignee;  // the node of another replica's stage 1
  CommitStageTx loss_early = Commit(0, 0, 0);
  loss_early.loss_micros = 5;
  CommitStageTx no_commitment = Commit(0, 0, 0);
  no_commitment.commitment = Hash256{};
  CommitStageTx no_result = Commit(0, 0, 0);
  no_result.result_hash = Hash256{};
  CommitStageTx future = Commit(0, 0, 0);
  future.round = 1;  // a unit of round 1: not assigned yet
  CommitUnitTx as_unit{.task_id = task_id_,
                       .index = 0,
                       .node_id = Unit(0, 0, 0).assignee,
                       .result_hash = Blake2b("d"),
                       .commitment = Blake2b("c")};
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {Q(alice_, bad_stage),
       "stage 3 is out of range; task " + task_id_.ShortHex() + " has 3 stages (0..2)"},
      {Q(alice_, bad_replica),
       "replica 2 is out of range; task " + task_id_.ShortHex() + " has 2 replicas (0..1)"},
      {Q(alice_, bad_round), "round 2 is out of range"},
      {Q(alice_, foreign), "is not assigned stage 1 of replica 0 in round 0"},
      {Q(alice_, loss_early), "only the last stage (2) computes the loss"},
      {Q(alice_, no_commitment), "commitment is zero"},
      {Q(alice_, no_result), "result_hash is zero"},
      {Q(alice_, future), "the unit is pending"},
      {Q(alice_, as_unit),
       "is trained in pipeline stages (params.stages = 3): commit each "
       "stage's result with CommitStage"},
      {Q(bob_, Commit(0, 0, 0)), "the sender must be node"},
  };
  std::vector<Transaction> txs;
  for (const auto& [tx, why] : refusals) txs.push_back(tx);
  std::vector<Receipt> r = Step(txs);
  for (size_t i = 0; i < refusals.size(); ++i) {
    EXPECT_FALSE(r[i].ok) << refusals[i].second;
    EXPECT_NE(r[i].reason.find(refusals[i].second), std::string::npos) << r[i].reason;
  }
  EXPECT_EQ(r[3].code, StatusCode::kPermissionDenied);
  EXPECT_EQ(Unit(0, 0, 0).status, WorkUnitStatus::kAssigned);

  // ---- Every stage commits (one by the node's own key): the round aggregates.
  ASSERT_TRUE(Step({Q(alice_, TransferTx{.to = Unit(0, 0, 0).assignee, .amount = 10})})[0].ok);
  txs = {Q(nodes_[NodeIndex(Unit(0, 0, 0).assignee)], Commit(0, 0, 0))};
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) {
      if (rep != 0 || s != 0) txs.push_back(Q(alice_, Commit(0, rep, s)));
    }
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  WorkUnit last = Unit(0, 1, 2);
  EXPECT_EQ(last.status, WorkUnitStatus::kCommitted);
  EXPECT_EQ(last.commitment, Blake2b("stage commitment 0/1/2"));
  EXPECT_EQ(last.loss_micros, 2'000'001u);
  // The blob of its step commits is recorded (an audit compares them), as an optional tail of
  // the unit's encoding: a unit without it encodes as before the field, 32 bytes shorter.
  EXPECT_EQ(last.stage_commits, Blake2b("stage commits 0/1/2"));
  EXPECT_EQ(WorkUnitToJson(last)["stage_commits"], Blake2b("stage commits 0/1/2").ToHex());
  {
    Encoder e;
    EncodeWorkUnit(e, last);
    const Bytes with = e.Take();
    WorkUnit back;
    Decoder d(with);
    ASSERT_TRUE(DecodeWorkUnit(d, &back).ok());
    ASSERT_TRUE(d.Finish().ok());
    EXPECT_EQ(back, last);
    WorkUnit plain = last;
    plain.stage_commits = Hash256{};
    Encoder p;
    EncodeWorkUnit(p, plain);
    EXPECT_EQ(p.Take().size() + 32, with.size());
  }
  // A stage committed twice is refused.
  r = Step({Q(alice_, Commit(0, 0, 1))});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("unit committed"), std::string::npos) << r[0].reason;

  RoundStateMachine m = Machine();
  ASSERT_EQ(m.phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_TRUE(m.aggregator().has_value());
  const Amount alice_before = Balance(alice_);
  r = Step({Q(alice_, CommitAggregateTx{.task_id = task_id_,
                                        .round = 0,
                                        .node_id = m.aggregator()->node,
                                        .state_hash = Blake2b("state 1")})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  // Round 0 paid, all to alice: each stage unit its stage's share of a unit's cost (stage_flops
  // 30:20:10 of 320: 160, 107 and 54 tokens, rounded up), the aggregator one unit's cost.
  t = Task();
  EXPECT_EQ(t.rounds_settled, 1u);
  const std::vector<Amount> stage_cost = {160, 107, 54};
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(StageUnitCost(t.params, kTestUnitCost, s), stage_cost[s]) << s;
    EXPECT_EQ(Unit(0, 1, s).paid, stage_cost[s]) << s;
  }
  const Amount round_cost = kReplicas * (160 + 107 + 54) + kTestUnitCost;
  EXPECT_EQ(t.spent, round_cost);
  const auto net = [&](Amount a) { return a - BasisPoints(a, genesis_.params.treasury_cut_bps); };
  EXPECT_EQ(Balance(alice_),
            alice_before + kReplicas * (net(160) + net(107) + net(54)) + net(kTestUnitCost));
  EXPECT_EQ(Unit(0, 1, 2).status, WorkUnitStatus::kVerified);

  // ---- Round 1 placed from the new weights; the node of stage 1 of replica 1 goes silent while
  // every other stage commits.
  m = Machine();
  EXPECT_EQ(m.round(), 1u);
  EXPECT_EQ(m.round_weights(), Blake2b("state 1"));
  std::set<PublicKey> round1;
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) {
      ASSERT_EQ(Unit(1, rep, s).status, WorkUnitStatus::kAssigned);
      round1.insert(Unit(1, rep, s).assignee);
    }
  }
  EXPECT_EQ(round1.size(), kReplicas * kStages);
  const WorkUnit silent = Unit(1, 1, 1);
  const uint64_t first_blocks = silent.deadline_height - (chain_->Height());
  txs.clear();
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) {
      if (rep != 1 || s != 1) txs.push_back(Q(alice_, Commit(1, rep, s)));
    }
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  EXPECT_EQ(Unit(1, 1, 0).status, WorkUnitStatus::kCommitted);
  while (chain_->Height() <= silent.deadline_height) Step();
  // Its replica is placed again whole (a stage cannot train alone: its neighbours finished):
  // replica 1's committed stages are assigned again, unpaid and with no failure counted, on the
  // nodes outside replica 0 other than the silent one (the seventh takes its place), with twice
  // the time: the replica ran past its deadline once.
  std::set<PublicKey> again;
  const uint64_t replaced_at = Unit(1, 1, 0).deadline_height;
  for (uint32_t s = 0; s < kStages; ++s) {
    const WorkUnit u = Unit(1, 1, s);
    ASSERT_EQ(u.status, WorkUnitStatus::kAssigned) << s;
    EXPECT_NE(u.assignee, silent.assignee) << s;
    EXPECT_GE(caps_[NodeIndex(u.assignee)].first, t.params.stage_memory_bytes[s]) << s;
    EXPECT_EQ(u.deadline_height, replaced_at) << s;
    EXPECT_TRUE(u.stage_commits.IsZero()) << s << ": a stage placed again forgets its commits";
    again.insert(u.assignee);
    EXPECT_EQ(chain_->GetNode(u.assignee).value().reputation.failures, 0u) << s;
  }
  EXPECT_EQ(again.size(), kStages);
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(again.count(Unit(1, 0, s).assignee), 0u) << "a node of replica 0 took a stage";
    EXPECT_EQ(Unit(1, 0, s).status, WorkUnitStatus::kCommitted) << "replica 0 keeps its commits";
  }
  EXPECT_EQ(replaced_at - (silent.deadline_height + 1), 2 * first_blocks);
  EXPECT_EQ(Machine().PendingUnits().size(), 0u);
  EXPECT_EQ(chain_->GetNode(silent.assignee).value().reputation.failures, 1u);
  // The silent node's late commit is refused; the new chain's are taken.
  CommitStageTx late = Commit(1, 1, 1);
  late.node_id = silent.assignee;
  r = Step({Q(alice_, late), Q(alice_, Commit(1, 1, 0)), Q(alice_, Commit(1, 1, 1)),
            Q(alice_, Commit(1, 1, 2))});
  EXPECT_FALSE(r[0].ok);
  for (size_t i = 1; i < r.size(); ++i) EXPECT_TRUE(r[i].ok) << r[i].reason;

  m = Machine();
  ASSERT_TRUE(m.aggregator().has_value());
  r = Step({Q(alice_, CommitAggregateTx{.task_id = task_id_,
                                        .round = 1,
                                        .node_id = m.aggregator()->node,
                                        .state_hash = Blake2b("state 2")})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  t = Task();
  EXPECT_EQ(t.status, TaskStatus::kFinished);
  EXPECT_EQ(t.final_state, Blake2b("state 2"));
  EXPECT_EQ(t.spent, 2 * round_cost) << "a replica that re-ran is paid once";
  EXPECT_EQ(t.budget, t.escrow + t.spent + t.refunded);
}

// A node's declared disk (capabilities.disk_bytes) must hold a stage's files, StageDiskBytes =
// H x its memory need, or it does not get that stage. One replica: by memory and speed alone
// the chain is n1 -> n3 -> n2 (stage 0 takes the fastest node that holds it and leaves a node
// for stage 2's 5 GiB). n2 declares disk for H x 4 GiB only: it cannot hold stage 2's files, so
// stage 2 goes to n1, which declares exactly what stage 2 needs, and n2 takes stage 0 (3 GiB,
// whose files its disk holds). A node that declares none (0: from before the field) is not
// checked.
TEST_F(PipelineStageTest, AStageGoesOnlyToANodeWhoseDeclaredDiskHoldsItsFiles) {
  TaskParams p = PipelineParams();
  p.units_per_round = kStages;  // one replica
  const uint64_t stage2_disk = protocol::StageDiskBytes(p.stage_memory_bytes[2], p.inner_steps);
  ASSERT_EQ(stage2_disk, 5 * kGiB * p.inner_steps);
  ASSERT_NO_FATAL_FAILURE(RegisterWithDisks(/*n1: just enough*/ stage2_disk,
                                            /*n2: too little*/ 4 * kGiB * p.inner_steps));
  EXPECT_EQ(chain_->GetNode(nodes_[0].public_key())->capabilities.disk_bytes, stage2_disk);
  EXPECT_EQ(chain_->GetNode(nodes_[2].public_key())->capabilities.disk_bytes, 0u);
  ASSERT_TRUE(Submit(p).ok);
  EXPECT_EQ(Unit(0, 0, 0).assignee, nodes_[1].public_key());
  EXPECT_EQ(Unit(0, 0, 1).assignee, nodes_[2].public_key());
  EXPECT_EQ(Unit(0, 0, 2).assignee, nodes_[0].public_key());
  // The declared disk survives the database (the record's tail).
  Reopen();
  EXPECT_EQ(chain_->GetNode(nodes_[1].public_key())->capabilities.disk_bytes,
            4 * kGiB * p.inner_steps);
}

// A node keeps a stage unit's files until the unit's round is final, so the disk it declared is
// offered net of the units it holds (StageDiskHeld: every open task's units of rounds not final).
// n1 declares disk for one stage 2 unit's files but not two, and n2 too little for any (the other
// nodes' memory holds no stage 2): task A's stage 2 goes to n1; task B (the same stages) gets
// none while n1 holds A's, and gets n1 once A's round is final.
TEST_F(PipelineStageTest, ANodeHoldingAStageUnitGetsNoSecondItsDiskCannotHoldToo) {
  TaskParams p = PipelineParams();
  p.units_per_round = kStages;  // one replica
  p.rounds = 1;
  const uint64_t stage2_disk = protocol::StageDiskBytes(p.stage_memory_bytes[2], p.inner_steps);
  ASSERT_NO_FATAL_FAILURE(RegisterWithDisks(2 * stage2_disk - 1, 4 * kGiB * p.inner_steps));
  ASSERT_TRUE(Submit(p).ok);
  const Hash256 a = task_id_;
  ASSERT_EQ(Unit(0, 0, 2).assignee, nodes_[0].public_key());
  ASSERT_TRUE(Submit(p).ok);  // task B
  const Hash256 b = task_id_;
  Step();
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(Unit(0, 0, s).status, WorkUnitStatus::kPending) << "task B, stage " << s;
  }
  // A's stages commit: n1 still holds its files (the round is not final until aggregated).
  task_id_ = a;
  std::vector<Transaction> txs;
  for (uint32_t s = 0; s < kStages; ++s) txs.push_back(Q(alice_, Commit(0, 0, s)));
  for (const Receipt& x : Step(txs)) ASSERT_TRUE(x.ok) << x.reason;
  task_id_ = b;
  EXPECT_EQ(Unit(0, 0, 2).status, WorkUnitStatus::kPending);
  // A's round is aggregated and final (A finishes): n1's files of it no longer count, and B gets
  // n1.
  task_id_ = a;
  ASSERT_NO_FATAL_FAILURE(CommitAggregate(0, "A's state"));
  EXPECT_EQ(Task().rounds_settled, 1u);
  // The end of a block steps the tasks in id order: B's came before A's, which settled the round,
  // so B saw n1's files of it still counted. The next block places it.
  ASSERT_LT(b, a);
  task_id_ = b;
  EXPECT_EQ(Unit(0, 0, 2).status, WorkUnitStatus::kPending);
  Step();
  EXPECT_EQ(Unit(0, 0, 2).status, WorkUnitStatus::kAssigned);
  EXPECT_EQ(Unit(0, 0, 2).assignee, nodes_[0].public_key());
}

// The next round of the same task is placed in the block its round before becomes final (without
// verification, the block of its aggregate): the node has deleted that round's files before it
// sees the new unit (it reviews its pins before taking work), so they do not count then. n1,
// whose disk holds one stage 2 unit's files, takes round 1's stage 2 in that block.
TEST_F(PipelineStageTest, ARoundFinalInThisBlockNoLongerCountsAgainstTheNextRoundsDisk) {
  TaskParams p = PipelineParams();
  p.units_per_round = kStages;  // one replica, two rounds
  const uint64_t stage2_disk = protocol::StageDiskBytes(p.stage_memory_bytes[2], p.inner_steps);
  ASSERT_NO_FATAL_FAILURE(RegisterWithDisks(2 * stage2_disk - 1, 4 * kGiB * p.inner_steps));
  ASSERT_TRUE(Submit(p).ok);
  ASSERT_EQ(Unit(0, 0, 2).assignee, nodes_[0].public_key());
  std::vector<Transaction> txs;
  for (uint32_t s = 0; s < kStages; ++s) txs.push_back(Q(alice_, Commit(0, 0, s)));
  for (const Receipt& x : Step(txs)) ASSERT_TRUE(x.ok) << x.reason;
  ASSERT_NO_FATAL_FAILURE(CommitAggregate(0, "state 1"));
  EXPECT_EQ(Task().rounds_settled, 1u);
  EXPECT_EQ(Unit(1, 0, 2).status, WorkUnitStatus::kAssigned);
  EXPECT_EQ(Unit(1, 0, 2).assignee, nodes_[0].public_key());
}

TEST_F(PipelineStageTest, NoPlacementLeavesTheRoundPendingAndCommitStageNeedsStages) {
  // Stage 2 needs 9 GiB: no node holds it, so nothing is placed (the round waits).
  TaskParams p = PipelineParams();
  p.stage_memory_bytes[2] = 9 * kGiB;
  Receipt submit = Start(p);
  ASSERT_TRUE(submit.ok) << submit.reason;
  Step();
  for (uint32_t rep = 0; rep < kReplicas; ++rep) {
    for (uint32_t s = 0; s < kStages; ++s) {
      EXPECT_EQ(Unit(0, rep, s).status, WorkUnitStatus::kPending) << rep << "/" << s;
    }
  }
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAssigning);

  // A task without stages refuses CommitStage.
  Transaction plain = Q(bob_, SubmitTaskTx{.spec_hash = Blake2b("plain bundle"),
                                           .budget = kBudget,
                                           .price_cap = 20,
                                           .params = TestTaskParams()});
  const Hash256 plain_id = TaskIdFor(bob_.public_key(), plain.nonce);
  ASSERT_TRUE(Step({plain})[0].ok);
  WorkUnit u = chain_->ListWorkUnits(plain_id).at(0);
  ASSERT_EQ(u.status, WorkUnitStatus::kAssigned);
  std::vector<Receipt> r = Step({Q(alice_, CommitStageTx{.task_id = plain_id,
                                                         .node_id = u.assignee,
                                                         .result_hash = Blake2b("d"),
                                                         .commitment = Blake2b("c")})});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("has no pipeline stages (params.stages = 1): commit its units with "
                             "CommitUnit"),
            std::string::npos)
      << r[0].reason;
}

// One replica of three stages on four nodes: stages 0 and 2 fit only n1 and n2, so stage 1 has
// n3 and, once n3 lets it expire, n4. Each expiry sends the whole replica back (its committed
// stages 0 and 2 too: they cannot train again without stage 1) with twice the time. When n4 lets
// it expire too, the nodes that could take stage 1 all did once: it is open to them again (as
// any unit every eligible solver excluded is), instead of waiting forever.
TEST_F(PipelineStageTest, AStageEveryFreeNodeLetExpireIsOpenToThemAgain) {
  TaskParams p = PipelineParams();
  p.units_per_round = kStages;  // one replica
  Receipt submit = Start(p, 4);
  ASSERT_TRUE(submit.ok) << submit.reason;
  EXPECT_LE(NodeIndex(Unit(0, 0, 0).assignee), 1u);
  EXPECT_LE(NodeIndex(Unit(0, 0, 2).assignee), 1u);
  ASSERT_EQ(NodeIndex(Unit(0, 0, 1).assignee), 2u);  // n3: the fastest that holds stage 1
  const uint64_t blocks = Unit(0, 0, 1).deadline_height - chain_->Height();
  for (const Receipt& x : Step({Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 2))})) {
    EXPECT_TRUE(x.ok) << x.reason;
  }
  // Each try of the replica: every stage assigned, sharing one deadline 2^tries x `blocks` away.
  auto expect_replica = [&](uint32_t stage1_node, uint64_t backoff) {
    const uint64_t deadline = Unit(0, 0, 0).deadline_height;
    for (uint32_t s = 0; s < kStages; ++s) {
      EXPECT_EQ(Unit(0, 0, s).status, WorkUnitStatus::kAssigned) << s;
      EXPECT_EQ(Unit(0, 0, s).deadline_height, deadline) << s;
    }
    EXPECT_EQ(NodeIndex(Unit(0, 0, 1).assignee), stage1_node);
    EXPECT_EQ(deadline - chain_->Height(), backoff * blocks);
  };
  uint64_t deadline = Unit(0, 0, 1).deadline_height;
  while (chain_->Height() <= deadline) Step();
  expect_replica(3, 2);  // n4, the one node left
  for (const Receipt& x : Step({Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 2))})) {
    EXPECT_TRUE(x.ok) << x.reason;
  }
  deadline = Unit(0, 0, 1).deadline_height;
  while (chain_->Height() <= deadline) Step();
  // n4 expired it too: nobody may take stage 1 in that block; from the next, n3 and n4 may again.
  EXPECT_EQ(Unit(0, 0, 1).status, WorkUnitStatus::kPending);
  EXPECT_EQ(Unit(0, 0, 0).status, WorkUnitStatus::kPending);
  Step();
  expect_replica(2, 4);
  EXPECT_EQ(chain_->GetNode(nodes_[2].public_key()).value().reputation.failures, 1u);
  EXPECT_EQ(chain_->GetNode(nodes_[3].public_key()).value().reputation.failures, 1u);
  EXPECT_EQ(chain_->GetNode(nodes_[0].public_key()).value().reputation.failures, 0u);
  EXPECT_EQ(chain_->GetNode(nodes_[1].public_key()).value().reputation.failures, 0u);
  std::vector<Receipt> r =
      Step({Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 1)), Q(alice_, Commit(0, 0, 2))});
  for (const Receipt& x : r) EXPECT_TRUE(x.ok) << x.reason;
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
}

// Units long enough that the nodes' own deadlines differ (3.2 TFLOP: 7 blocks at 1 TFLOP/s, the
// 4-block floor at 5): every stage of a replica gets the latest of its nodes' deadlines, since a
// fast stage cannot finish before its slow neighbour.
TEST_F(PipelineStageTest, AReplicasStagesShareItsSlowestNodesDeadline) {
  TaskParams p = PipelineParams();
  p.flops_per_sample = 100'000'000'000;
  Receipt submit = Start(p, 7, 900'000);
  ASSERT_TRUE(submit.ok) << submit.reason;
  const uint64_t height = chain_->Height();
  const protocol::SchedulerParams sp = SchedulerParamsOf(genesis_);
  const protocol::TaskSpecView view = TaskSpecViewOf(task_id_, Task().params, Task().price_cap);
  std::set<uint64_t> deadlines;
  for (uint32_t r = 0; r < kReplicas; ++r) {
    uint64_t slowest = 0;
    for (uint32_t s = 0; s < kStages; ++s) {
      const NodeRecord n = chain_->GetNode(Unit(0, r, s).assignee).value();
      protocol::NodeView v{.id = n.id,
                           .memory_bytes = n.capabilities.memory_bytes,
                           .throughput_flops = n.capabilities.throughput,
                           .latency_ms = n.capabilities.latency_ms,
                           .bandwidth_bytes_per_s = n.capabilities.bandwidth_bytes_per_s};
      const uint64_t own =
          protocol::DeadlineHeight(height, protocol::EstimatedUnitMs(v, view, sp), 0, sp);
      deadlines.insert(own);
      slowest = std::max(slowest, own);
    }
    for (uint32_t s = 0; s < kStages; ++s) {
      EXPECT_EQ(Unit(0, r, s).deadline_height, slowest) << r << "/" << s;
    }
  }
  EXPECT_GT(deadlines.size(), 1u) << "the nodes' own deadlines must differ for this test to mean "
                                     "anything";
}

// Stage nodes that must heartbeat (liveness_blocks = 6) on a chain whose deadlines are far away:
// a stage node the chain shows gone is replaced long before its replica's deadline.
class PipelineLostStageTest : public PipelineStageTest {
 protected:
  PipelineLostStageTest() {
    genesis_.params.liveness_blocks = 6;
    genesis_.params.min_deadline_blocks = 1000;
    // n8: the fastest of all, and it holds every stage.
    nodes_.push_back(TestKey(28));
    caps_.push_back({8 * kGiB, 10'000'000'000'000});
  }

  // One replica placed on the first five nodes, then n8 registered (free); returns the chain. A
  // placement of the whole replica from then on would put its heaviest stage, stage 0, on n8:
  // only a replica whose live stages are kept leaves stage 0 where it was.
  std::vector<PublicKey> StartOneReplica() {
    TaskParams p = PipelineParams();
    p.units_per_round = kStages;
    Receipt submit = Start(p, 5);
    EXPECT_TRUE(submit.ok) << submit.reason;
    for (const Receipt& r : Step({Q(alice_, Reg(7))})) EXPECT_TRUE(r.ok) << r.reason;
    std::vector<PublicKey> chain;
    for (uint32_t s = 0; s < kStages; ++s) chain.push_back(Unit(0, 0, s).assignee);
    return chain;
  }

  // A block in which every registered node but `silent` heartbeats, with `txs`.
  void StepHeartbeats(const PublicKey& silent, std::vector<Transaction> txs = {}) {
    for (size_t i : {0, 1, 2, 3, 4, 7}) {
      if (nodes_[i].public_key() == silent) continue;
      txs.push_back(Q(alice_, HeartbeatTx{.node_id = nodes_[i].public_key()}));
    }
    for (const Receipt& r : Step(std::move(txs))) EXPECT_TRUE(r.ok) << r.reason;
  }

  // Steps until stage 1 has another node than `lost` (at most 20 blocks), then checks what the
  // issue asks: stages 0 and 2 kept on their nodes with a fresh deadline, shared with the new
  // stage 1 node; `lost` alone charged; the replica then commits and the round aggregates.
  void ExpectReplaced(const std::vector<PublicKey>& chain) {
    const PublicKey& lost = chain[1];
    for (int b = 0; b < 20 && Unit(0, 0, 1).assignee == lost; ++b) StepHeartbeats(lost);
    ASSERT_NE(Unit(0, 0, 1).assignee, lost);
    const uint64_t deadline = Unit(0, 0, 1).deadline_height;
    for (uint32_t s = 0; s < kStages; ++s) {
      EXPECT_EQ(Unit(0, 0, s).status, WorkUnitStatus::kAssigned) << s;
      EXPECT_EQ(Unit(0, 0, s).deadline_height, deadline) << s;
      if (s != 1) {
        EXPECT_EQ(Unit(0, 0, s).assignee, chain[s]) << "stage " << s << " was moved";
      }
    }
    EXPECT_GE(deadline, chain_->Height() + genesis_.params.min_deadline_blocks);
    EXPECT_EQ(Unit(0, 0, 1).assignee, nodes_[7].public_key());  // the fastest free node
    // The lost node is the stage's earlier node (node_work's `earlier`): the one whose records
    // the new node recomputes when the replica resumes (node/stage_resume.h). The kept stages
    // have none.
    EXPECT_EQ(Machine().LastExcluded(1), lost);
    EXPECT_EQ(Machine().LastExcluded(0), PublicKey{});
    EXPECT_EQ(Machine().LastExcluded(2), PublicKey{});
    for (size_t i : {0, 1, 2, 3, 4, 7}) {
      EXPECT_EQ(chain_->GetNode(nodes_[i].public_key()).value().reputation.failures,
                nodes_[i].public_key() == lost ? 1u : 0u)
          << "node " << i;
    }
    StepHeartbeats(
        lost, {Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 1)), Q(alice_, Commit(0, 0, 2))});
    EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
  }
};

// Its heartbeat older than liveness_blocks: the node is gone by the chain's own facts.
TEST_F(PipelineLostStageTest, AStageWhoseNodeStopsHeartbeatingMovesAloneAndOnlyItIsCharged) {
  const std::vector<PublicKey> chain = StartOneReplica();
  const uint64_t heartbeat = chain_->GetNode(chain[1]).value().last_heartbeat_height;
  for (int b = 0; b < 20 && Unit(0, 0, 1).assignee == chain[1]; ++b) StepHeartbeats(chain[1]);
  // In the first block in which its heartbeat is older than liveness_blocks, not before.
  EXPECT_EQ(chain_->Height(), heartbeat + genesis_.params.liveness_blocks + 1);
  ASSERT_NO_FATAL_FAILURE(ExpectReplaced(chain));
}

// A node that leaves (LeaveNode) is gone at once.
TEST_F(PipelineLostStageTest, AStageWhoseNodeLeavesMovesAloneAndOnlyItIsCharged) {
  const std::vector<PublicKey> chain = StartOneReplica();
  const uint64_t placed = chain_->Height();
  StepHeartbeats(chain[1], {Q(alice_, LeaveNodeTx{.node_id = chain[1]})});
  EXPECT_EQ(chain_->Height(), placed + 1);
  EXPECT_NE(Unit(0, 0, 1).assignee, chain[1]);  // replaced in the block that saw it leave
  ASSERT_NO_FATAL_FAILURE(ExpectReplaced(chain));
}

// A kept stage's node holds the same unit again after the re-placement, under a new beacon. Its
// commit of the run on the earlier chain (with the lost node), sent before the re-placement and
// landing two blocks after it, is refused for its assignment_beacon: its step records are signed
// by the earlier chain, and the unit's check would judge them against the new one (the node-side
// guard, Stager::Collect, only sees the placement of the moment it sends). The new placement's
// commit is taken.
TEST_F(PipelineLostStageTest, ACommitOfTheStagesEarlierPlacementIsRefusedAfterItIsPlacedAgain) {
  const std::vector<PublicKey> chain = StartOneReplica();
  const CommitStageTx stale = Commit(0, 0, 0);  // sent now, on the chain with chain[1]
  ASSERT_FALSE(stale.assignment_beacon.IsZero());
  StepHeartbeats(chain[1], {Q(alice_, LeaveNodeTx{.node_id = chain[1]})});
  ASSERT_NE(Unit(0, 0, 1).assignee, chain[1]);
  const WorkUnit kept = Unit(0, 0, 0);
  ASSERT_EQ(kept.status, WorkUnitStatus::kAssigned);
  ASSERT_EQ(kept.assignee, chain[0]) << "stage 0 must be kept on its node for this test";
  ASSERT_NE(kept.assignment_beacon, stale.assignment_beacon);
  StepHeartbeats(chain[1]);
  const std::vector<Receipt> r = Step({Q(alice_, stale)});
  EXPECT_FALSE(r[0].ok) << "the earlier placement's run was taken for the new one";
  EXPECT_EQ(r[0].code, StatusCode::kFailedPrecondition);
  EXPECT_NE(r[0].reason.find("assignment_beacon " + stale.assignment_beacon.ShortHex() +
                             " is not the current placement of stage 0 of replica 0 in round 0"),
            std::string::npos)
      << r[0].reason;
  EXPECT_NE(r[0].reason.find("placed with beacon " + kept.assignment_beacon.ShortHex()),
            std::string::npos)
      << r[0].reason;
  EXPECT_EQ(Unit(0, 0, 0).status, WorkUnitStatus::kAssigned);
  EXPECT_TRUE(Unit(0, 0, 0).result_hash.IsZero());
  // The new placement's stages commit (its own beacon) and the round aggregates.
  StepHeartbeats(chain[1], {Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 1)),
                            Q(alice_, Commit(0, 0, 2))});
  EXPECT_EQ(Unit(0, 0, 0).result_hash, Blake2b("stage delta 0/0/0"));
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
}

// The stage units whose files the ledger counts against each node's disk (ForEachStageUnitHeld:
// what StageDiskHeld sums, and what node_work lists to the node as `stage_units`, whose other runs'
// files it deletes: node::PinKeeper). Stage 0 commits, then stage 1's node leaves: it no longer
// holds its unit (its run's files are of a run never committed, which nothing reads), the new
// node does, and stage 0's node holds its stage again (its commit reset by the replica's re-run,
// the stage kept on it). Once the round is final no node holds any unit of it.
TEST_F(PipelineLostStageTest, TheStageUnitsCountedAgainstANodesDiskLeaveItWithTheUnit) {
  const std::vector<PublicKey> chain = StartOneReplica();
  using Slot = std::tuple<uint32_t, uint32_t, uint32_t>;  // round, replica, stage
  auto held = [&](const PublicKey& node) {
    const TaskRecord t = Task();
    std::set<Slot> out;
    ForEachStageUnitHeld(
        t, t.rounds_settled,
        [&](uint32_t index) {
          Result<WorkUnit> w = chain_->GetWorkUnit(task_id_, index);
          return w.ok() ? std::optional<WorkUnit>(std::move(*w)) : std::nullopt;
        },
        [&](const WorkUnit& u) {
          if (u.assignee != node) return;
          const StageSlot slot = StageSlotOf(t.params, u.index);
          out.insert({slot.round, slot.replica, slot.stage});
        });
    return out;
  };
  for (uint32_t s = 0; s < kStages; ++s) {
    EXPECT_EQ(held(chain[s]), (std::set<Slot>{{0, 0, s}})) << "stage " << s;
  }
  const PublicKey& fresh = nodes_[7].public_key();
  EXPECT_TRUE(held(fresh).empty());
  StepHeartbeats(PublicKey{}, {Q(alice_, Commit(0, 0, 0))});
  ASSERT_EQ(Unit(0, 0, 0).status, WorkUnitStatus::kCommitted);
  EXPECT_EQ(held(chain[0]), (std::set<Slot>{{0, 0, 0}}));  // committed: held until final
  StepHeartbeats(chain[1], {Q(alice_, LeaveNodeTx{.node_id = chain[1]})});
  ASSERT_EQ(Unit(0, 0, 1).assignee, fresh);
  ASSERT_EQ(Unit(0, 0, 0).status, WorkUnitStatus::kAssigned);
  ASSERT_EQ(Unit(0, 0, 0).assignee, chain[0]);
  EXPECT_TRUE(held(chain[1]).empty()) << "the node that left still holds its stage unit";
  EXPECT_EQ(held(fresh), (std::set<Slot>{{0, 0, 1}}));
  EXPECT_EQ(held(chain[0]), (std::set<Slot>{{0, 0, 0}}));
  EXPECT_EQ(held(chain[2]), (std::set<Slot>{{0, 0, 2}}));
  StepHeartbeats(chain[1], {Q(alice_, Commit(0, 0, 0)), Q(alice_, Commit(0, 0, 1)),
                            Q(alice_, Commit(0, 0, 2))});
  ASSERT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_NO_FATAL_FAILURE(CommitAggregate(0, "state 1"));
  ASSERT_EQ(Task().rounds_settled, 1u);
  for (const PublicKey& n : {chain[0], chain[1], chain[2], fresh}) {
    for (const Slot& slot : held(n)) EXPECT_NE(std::get<0>(slot), 0u) << "round 0 is final";
  }
}

TEST_F(PipelineVerificationTest, EveryStageUnitIsCheckedStepByStepAndPaidWhenClean) {
  Start();
  std::set<PublicKey> chain;
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_EQ(Unit(st).status, WorkUnitStatus::kAssigned) << st;
    chain.insert(Unit(st).assignee);
  }
  EXPECT_EQ(chain.count(verifier_.public_key()), 0u) << "the verifier holds no stage";
  CommitStages();
  for (uint32_t st = 0; st < kStages; ++st) {
    const WorkUnit u = Unit(st);
    EXPECT_EQ(u.secret_index, 1u);
    // The check runs over the commitment and the H step leaves: segment t is step t.
    EXPECT_EQ(u.leaves, protocol::StageCheckLeaves(StepLeaves(st)));
    const protocol::UnitCheck c = Check(st);
    EXPECT_EQ(c.config().commitment, protocol::StageCheckCommitment(StepLeaves(st)));
    EXPECT_EQ(c.config().inner_steps, kSteps);
    EXPECT_EQ(c.config().checkpoint_interval, 1u);
    EXPECT_EQ(c.config().forced_error_per_million, 0u);
    EXPECT_EQ(c.stage(), protocol::CheckStage::kCheckAwaitingBeacon);
  }
  Aggregate();
  const Amount alice_before = Balance(alice_);
  // New nodes: every stage unit is checked; the one verifier outside the replica is drawn, and
  // the steps it replays are steps of the stage.
  std::vector<Sealed> verdicts;
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) {
    const protocol::UnitCheck c = Check(st);
    ASSERT_EQ(c.stage(), protocol::CheckStage::kCheckCommitVerdicts);
    EXPECT_EQ(c.verifiers(), std::vector<protocol::NodeId>{verifier_.public_key()});
    ASSERT_FALSE(c.segments().empty());
    for (uint32_t step : c.segments()) EXPECT_LT(step, kSteps);
    verdicts.push_back(Clean(st));
    txs.push_back(SealTx(st, verdicts.back()));
  }
  StepOk(txs);
  StepUntil(0, protocol::CheckStage::kCheckRevealVerdicts);
  txs.clear();
  for (uint32_t st = 0; st < kStages; ++st) {
    txs.push_back(RevealTx(st, verdicts[st]));
    txs.push_back(SecretTx(st));
  }
  StepOk(txs);
  StepUntil(0, protocol::CheckStage::kCheckSettled);
  // A whistleblower's challenge names the stage unit and one of its steps (with the bundle, which
  // a challenge over the stage witness bound carries): a unit or a step out of range is refused
  // (the round is not final yet).
  ASSERT_TRUE(Machine().Unfinal(0));
  Sealed past_end = Mismatch(0, StepLeaves(0), kSteps - 1, Blake2b("x"));
  past_end.claim.segment = kSteps;
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {Q(alice_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = kStages,
                                 .node_id = verifier_.public_key(),
                                 .claim = Mismatch(0, StepLeaves(0), 1, Blake2b("x")).claim}),
       "challenge unit: index 3 is out of range; task " + task_id_.ShortHex() + " has 3 units"},
      {Q(alice_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = 0,
                                 .node_id = verifier_.public_key(),
                                 .claim = past_end.claim,
                                 .bundle = {bundle_}}),
       "the claim's states are not the solver's committed states of segment 4"},
  };
  txs.clear();
  for (const auto& [tx, why] : refusals) txs.push_back(tx);
  std::vector<Receipt> r = Step(txs);  // one block: the round's window is short
  for (size_t i = 0; i < refusals.size(); ++i) {
    EXPECT_FALSE(r[i].ok) << refusals[i].second;
    EXPECT_NE(r[i].reason.find(refusals[i].second), std::string::npos) << r[i].reason;
  }
  for (int i = 0; i < 20 && Task().status == TaskStatus::kOpen; ++i) Step();
  ASSERT_EQ(Task().status, TaskStatus::kFinished);
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.clean, kStages);
  EXPECT_EQ(t.verification.slashed, 0u);
  EXPECT_GT(t.verification.verifiers_paid, 0u);
  // Each check is paid for the steps it replays: the drawn ones and, when it was not drawn, the
  // last, which binds the result (protocol::StageStepsReplayed), out of the stage's share of the
  // unit (StageUnitCost, 30:20:10 here), not the whole unit's cost. So a check never costs more
  // than the task escrowed for it: its stage's share of a unit's cost at the cap per verifier
  // (MaxTaskCost).
  Amount want_paid = 0;
  for (uint32_t st = 0; st < kStages; ++st) {
    const std::vector<uint32_t> drawn = Check(st).segments();
    const uint32_t replayed = protocol::StageStepsReplayed(drawn, kSteps);
    EXPECT_EQ(replayed, drawn.size() + (std::count(drawn.begin(), drawn.end(), kSteps - 1) ? 0 : 1))
        << st;
    const Amount pay =
        protocol::VerifierPay(StageUnitCost(t.params, kTestUnitCost, st), replayed, kSteps);
    EXPECT_LE(pay, StageUnitCost(t.params, UnitCost(t, t.price_cap), st)) << st;
    want_paid += pay;
  }
  EXPECT_EQ(t.verification.verifiers_paid, want_paid);
  EXPECT_EQ(Node(verifier_.public_key()).earnings.verification, want_paid);
  EXPECT_EQ(Node(verifier_.public_key()).earnings.checks_paid, kStages);
  for (uint32_t st = 0; st < kStages; ++st) {
    EXPECT_EQ(Check(st).result(), protocol::CheckResult::kCheckClean) << Check(st).reason();
    EXPECT_EQ(Unit(st).status, WorkUnitStatus::kVerified);
    EXPECT_EQ(Unit(st).paid, StageUnitCost(t.params, kTestUnitCost, st));
    EXPECT_EQ(Node(Unit(st).assignee).reputation.units_verified_clean, 1u);
  }
  EXPECT_GT(Balance(alice_), alice_before);
}

// A stage settled clean, challenged by a whistleblower (the verifier, with a made-up finding and
// the bundle: the tile phase), falls silent in the operator phase. The ledger cannot rule a stage
// unit on its merits (ProveMerits carries a segment witness, not a stage step's:
// ProveMeritsRefusal), so no merits window opens to hold the round for nothing: the check settles
// at the block the stage's turn ends, a loss by silence alone (the stage slashed, its round re-run;
// the verifier that called it clean keeps its stake, its bounty the jackpot's share), and a
// ProveMerits is refused by the same rule.
TEST_F(PipelineVerificationTest, AStageSilentInAWhistleblowersDisputeLosesWithoutAMeritsWindow) {
  Start([](TaskParams& p) { p.verification_window_blocks = 40; });
  constexpr uint32_t kCheat = 1;
  const PublicKey stage = Unit(kCheat).assignee;
  ASSERT_NE(ProveMeritsRefusal(Task().params), nullptr);
  CommitStages();
  Aggregate();
  ASSERT_NO_FATAL_FAILURE(EveryStageVerifiedClean());
  ASSERT_NO_FATAL_FAILURE(StepUntil(kCheat, protocol::CheckStage::kCheckSettled));
  ASSERT_EQ(Check(kCheat).result(), protocol::CheckResult::kCheckClean);
  ASSERT_TRUE(Machine().Unfinal(Unit(kCheat).round));
  const std::vector<Hash256> leaves = StepLeaves(kCheat);
  StepOk({Q(alice_, ChallengeUnitTx{.task_id = task_id_,
                                    .index = kCheat,
                                    .node_id = verifier_.public_key(),
                                    .claim = Mismatch(kCheat, leaves, 1, Blake2b("made up")).claim,
                                    .bundle = {bundle_}})});
  ASSERT_EQ(Check(kCheat).stage(), protocol::CheckStage::kCheckDisputed);
  const Receipt merits = Step({Q(alice_, ProveMeritsTx{.task_id = task_id_,
                                                       .index = kCheat,
                                                       .node_id = verifier_.public_key(),
                                                       .segment = 1,
                                                       .witness = {Bytes{1, 2, 3}}})})[0];
  EXPECT_FALSE(merits.ok);
  EXPECT_NE(merits.reason.find("is a pipeline task"), std::string::npos) << merits.reason;
  const Amount jackpot_before = Node(verifier_.public_key()).earnings.jackpot;
  // The verifier answers the operator phase's opening query; the stage posts nothing. The game
  // resolves at the block after the turn's deadline, and so does the check: no merits window.
  const protocol::DisputeQuery q = Check(kCheat).dispute()->query();
  ASSERT_EQ(q.stage, protocol::DisputeStage::kDisputeOperators);
  StepOk({Q(alice_, DisputePostTx{.task_id = task_id_,
                                  .index = kCheat,
                                  .node_id = verifier_.public_key(),
                                  .position = q.position,
                                  .hash = Blake2b("the verifier's chain end")})});
  while (HasCheck(kCheat) && Check(kCheat).stage() == protocol::CheckStage::kCheckDisputed &&
         chain_->Height() <= q.deadline_height) {
    EXPECT_FALSE(Check(kCheat).awaits_merits());
    Step();
  }
  ASSERT_EQ(chain_->Height(), q.deadline_height + 1);
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud at once: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  EXPECT_EQ(Node(stage).reputation.slashes, 1u);
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);  // its clean verdict stands
  EXPECT_GT(Node(verifier_.public_key()).earnings.jackpot, jackpot_before);
}

// A stage's check gives each dispute turn twice its step's work (stage_flops) at 100 MFLOP/s
// (CheckResponseBlocks), at least the chain's flat dispute_response_blocks (2 here): the
// fixture's stages of 30, 20 and 10 GFLOP a step, in blocks of 1 s, 301, 201 and 101 blocks, twice.
TEST_F(PipelineVerificationTest, AStageChecksDisputeTurnIsTwiceItsStepsWorkAtTheTraceFloor) {
  Start();
  ASSERT_EQ(genesis_.block_interval_ms, 1000);
  ASSERT_EQ(genesis_.params.dispute_response_blocks, 2u);
  CommitStages();
  const TaskParams p = Task().params;
  ASSERT_EQ(p.stage_flops, (std::vector<uint64_t>{30'000'000'000, 20'000'000'000, 10'000'000'000}));
  const uint64_t want[kStages] = {602, 402, 202};
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_TRUE(HasCheck(st)) << st;
    EXPECT_EQ(Check(st).config().dispute_response_blocks, want[st]) << "stage " << st;
    EXPECT_EQ(CheckResponseBlocks(genesis_, p, st), want[st]) << "stage " << st;
  }
}

// The same with a flat turn of 5 blocks: a light stage (1 MFLOP a step: 2 x 1 block) keeps the
// flat turn, a heavier one (300 MFLOP: 2 x 4 blocks) gets its own.
class PipelineFlatTurnTest : public PipelineVerificationTest {
 protected:
  PipelineFlatTurnTest() { genesis_.params.dispute_response_blocks = 5; }
};

TEST_F(PipelineFlatTurnTest, ALightStageKeepsTheChainsFlatTurn) {
  Start([](TaskParams& p) { p.stage_flops = {1'000'000, 300'000'000, 30'000'000'000}; });
  CommitStages();
  const uint64_t want[kStages] = {5, 8, 602};
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_TRUE(HasCheck(st)) << st;
    EXPECT_EQ(Check(st).config().dispute_response_blocks, want[st]) << "stage " << st;
  }
}

// The ledger takes stage_flops as declared: a stage declaring the most work a u64 holds, or a
// PFLOP a step, gets an hour's turn (3,601 blocks of 1 s), not 2^64 / 10^8 s, so a silent party's
// game still ends and its round can become final.
TEST_F(PipelineFlatTurnTest, ADeclaredStageWorkBeyondAnHoursTraceGetsAnHoursTurn) {
  Start([](TaskParams& p) { p.stage_flops = {UINT64_MAX, 1'000'000'000'000'000, 1'000'000}; });
  CommitStages();
  const uint64_t want[kStages] = {3601, 3601, 5};
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_TRUE(HasCheck(st)) << st;
    EXPECT_EQ(Check(st).config().dispute_response_blocks, want[st]) << "stage " << st;
  }
}

// An honest stage, disputed by a made-up claim on its step 1, that takes longer than the chain's
// flat turn to answer (a traced replay of its step on a loaded node) but answers within its
// stage's turn is not timed out: its post is taken and the game goes on, nobody slashed. With the
// flat turn for every check it lost at the flat deadline, its round re-run.
TEST_F(PipelineVerificationTest, AnHonestStageAnsweringAfterTheFlatTurnWithinItsOwnIsNotTimedOut) {
  Start();
  constexpr uint32_t kStage = 1;
  const PublicKey stage = Unit(kStage).assignee;
  CommitStages();
  Aggregate();
  const Sealed made_up = Mismatch(kStage, StepLeaves(kStage), 1, Blake2b("made up"));
  ASSERT_NO_FATAL_FAILURE(VerdictsUntilDisputed(kStages, kStage, made_up, bundle_));
  const protocol::DisputeGame g = *Check(kStage).dispute();  // a copy: Check() is a value
  EXPECT_EQ(g.config().response_blocks, 402u);
  const protocol::DisputeQuery q = g.query();
  ASSERT_EQ(q.stage, protocol::DisputeStage::kDisputeOperators);
  EXPECT_EQ(q.deadline_height, g.config().start_height + 402);
  // The verifier answers at once; the stage is still tracing when the flat turn ends.
  StepOk({Q(alice_, DisputePostTx{.task_id = task_id_,
                                  .index = kStage,
                                  .node_id = verifier_.public_key(),
                                  .position = q.position,
                                  .hash = Blake2b("the verifier's chain end")})});
  const uint64_t flat_deadline = g.config().start_height + genesis_.params.dispute_response_blocks;
  while (chain_->Height() <= flat_deadline + 5) {
    Step();
    ASSERT_TRUE(HasCheck(kStage)) << "timed out at height " << chain_->Height();
    ASSERT_EQ(Check(kStage).stage(), protocol::CheckStage::kCheckDisputed);
  }
  const Receipt r = Step({Q(alice_, DisputePostTx{.task_id = task_id_,
                                                  .index = kStage,
                                                  .node_id = stage,
                                                  .position = q.position,
                                                  .hash = Blake2b("the stage's chain end")})})[0];
  EXPECT_TRUE(r.ok) << r.reason;
  EXPECT_GT(chain_->Height(), flat_deadline);
  EXPECT_LE(chain_->Height(), q.deadline_height);
  ASSERT_TRUE(HasCheck(kStage));
  ASSERT_EQ(Check(kStage).stage(), protocol::CheckStage::kCheckDisputed);
  const protocol::DisputeQuery next = Check(kStage).dispute()->query();
  EXPECT_TRUE(next.position != q.position || next.stage != q.stage ||
              next.deadline_height != q.deadline_height)
      << "both posted: the game moved on";
  EXPECT_EQ(Node(stage).reputation.slashes, 0u);
  EXPECT_EQ(Task().verification.fraud, 0u);
}

// A stage whose step 1 is wrong (its leaf from step 1 on is not what the replay gives): the
// verifier claims step 1, the stage does not win the ruling, and it alone is slashed; its
// replica's round runs again without it (the spare node takes its stage), no honest stage is
// slashed, and each is paid for step 0 alone, the one step of its stage no false tensor reached
// (1 of H = 4 steps of its StageUnitCost; the cheater nothing). The stages (the fashion MLP's, of
// 1 GiB declared) are over the stage witness bound, so the mismatch must carry the task bundle
// (MismatchNeedsBundle: refused by name without it) and the dispute plays the tile phase over the
// stage's plan; the stage, which cannot defend its step, posts nothing there and loses at the
// turn's deadline. Nobody's word is taken: the genesis key's RuleDispute is refused.
TEST_F(PipelineVerificationTest, AStageThatLiesAboutAStepIsSlashedAndItsReplicaRerunsWithoutIt) {
  Start();
  constexpr uint32_t kCheat = 1;
  const PublicKey cheater = Unit(kCheat).assignee;
  std::vector<PublicKey> first_run;
  for (uint32_t st = 0; st < kStages; ++st) first_run.push_back(Unit(st).assignee);
  CommitStages(kCheat);
  Aggregate();
  const std::vector<Hash256> lied = StepLeaves(kCheat, true, 1);
  const Hash256 truth = StepLeaves(kCheat)[1];
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, kCheat));
  std::vector<Sealed> verdicts;
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) {
    verdicts.push_back(st == kCheat ? Mismatch(st, lied, 1, truth) : Clean(st));
    txs.push_back(SealTx(st, verdicts.back()));
  }
  StepOk(txs);
  StepUntil(0, protocol::CheckStage::kCheckRevealVerdicts);
  // A claim that opens the sealed verdict (same step, same replayed leaf) but proves leaves that
  // are not the stage's committed ones is refused; so is the true claim without the bundle.
  Sealed forged = Mismatch(kCheat, StepLeaves(kCheat), 1, truth);
  forged.salt = verdicts[kCheat].salt;
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {RevealTx(kCheat, forged, bundle_), "not the solver's committed states of segment 1"},
      {RevealTx(kCheat, verdicts[kCheat]),
       "reveal verdict: bundle is empty, but unit 1 belongs to a stage of task " +
           task_id_.ShortHex() +
           " declared at 1073741824 bytes (params.stage_memory_bytes[1]), over the 4194304 a "
           "stage step's witness holds"}};
  // In the reveals' block, before them: the reveal window is short.
  txs.clear();
  for (const auto& [tx, why] : refusals) txs.push_back(tx);
  for (uint32_t st = 0; st < kStages; ++st) {
    txs.push_back(RevealTx(st, verdicts[st], st == kCheat ? bundle_ : std::string()));
    txs.push_back(SecretTx(st));
  }
  std::vector<Receipt> r = Step(txs);
  ASSERT_EQ(r.size(), txs.size());
  for (size_t i = 0; i < r.size(); ++i) {
    if (i < refusals.size()) {
      EXPECT_FALSE(r[i].ok) << refusals[i].second;
      EXPECT_NE(r[i].reason.find(refusals[i].second), std::string::npos) << r[i].reason;
    } else {
      EXPECT_TRUE(r[i].ok) << r[i].reason;
    }
  }
  StepUntil(kCheat, protocol::CheckStage::kCheckDisputed);
  // The bundle opens the tile phase over the stage's plan (the fashion MLP's second linear layer
  // and its relu), not a whole step at the referee; the genesis key has nothing to rule.
  const protocol::UnitCheck c = Check(kCheat);
  Result<TileRuleContext> plan = TileContextOf(Task(), Unit(kCheat), bundle_, "test");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(c.dispute()->config().num_operators, plan->plan.ops.size());
  ASSERT_EQ(c.dispute()->stage(), protocol::DisputeStage::kDisputeOperators);
  r = Step({Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = kCheat, .output = truth})});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("has no dispute waiting for the referee"), std::string::npos)
      << r[0].reason;
  ASSERT_NO_FATAL_FAILURE(StageSilentInTheTilePhase(kCheat));
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.fraud, 1u);
  // The stage's missed turn decided the game, not a ruling transaction: the task records none
  // (a ruling's record: PipelineRulingTest, and TileChainTest for a tile).
  EXPECT_TRUE(t.verification.rulings.empty()) << TaskToJson(t)["verification"].dump();
  // Slashed from the stage's share of the unit (StageUnitCost), as the stage is paid.
  EXPECT_EQ(t.verification.slashed,
            kSlashMultiple * StageUnitCost(t.params, kTestUnitCost, kCheat));
  EXPECT_LT(t.verification.slashed, kSlashMultiple * kTestUnitCost);
  const NodeRecord n = Node(cheater);
  EXPECT_EQ(n.reputation.slashes, 1u);
  EXPECT_EQ(n.status, NodeStatus::kJailed);
  ASSERT_EQ(t.params.inner_steps, 4u);
  for (const KeyPair& k : stagers_) {
    if (k.public_key() == cheater) {
      EXPECT_EQ(Node(k.public_key()).earnings.units, 0u) << "the cheater is paid nothing";
      continue;
    }
    EXPECT_EQ(Node(k.public_key()).reputation.slashes, 0u);
    EXPECT_EQ(Node(k.public_key()).stake, kStake);
  }
  for (uint32_t st = 0; st < kStages; ++st) {
    if (st == kCheat) continue;
    const Amount cost = StageUnitCost(t.params, kTestUnitCost, st);
    EXPECT_EQ(Node(first_run[st]).earnings.units, cost / 4) << "stage " << st << ": step 0 of 4";
  }
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);
  EXPECT_GT(Node(verifier_.public_key()).earnings.jackpot, 0u);
  // The replica runs again without the cheater: the spare node holds its stage.
  for (int i = 0; i < 5 && Unit(kCheat).status != WorkUnitStatus::kAssigned; ++i) Step();
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_EQ(Unit(st).status, WorkUnitStatus::kAssigned) << st;
    EXPECT_NE(Unit(st).assignee, cheater) << st;
  }
}

// A cut with a stage without parameters (here stage 1, the fashion MLP's lone relu) trains nothing
// there, and no state could rule that stage's chain end: `task submit` refuses it
// (engine::TaskPipelineCut). A task whose bundle has one anyway (sent around `task submit`) gets
// no tile plan for any stage (TileContextOf), so the mismatch, which must carry the bundle over
// the stage witness bound, plays whole steps. Before, the genesis key ruled them; now no key does:
// RuleDispute is refused, and the dispute ends undecided at the referee's deadline, the stage's
// replica re-run and nobody slashed.
TEST_F(PipelineVerificationTest, AStageWithoutParametersIsRuledByNoKey) {
  bundle_ = pipeline_testing::FashionMlpPipelineBundle("[0, 1, 2, 5]");
  Start();
  constexpr uint32_t kCheat = 1;
  CommitStages(kCheat);
  Aggregate();
  ASSERT_FALSE(LedgerRulesStageStep(Task().params, kCheat));
  const Hash256 truth = StepLeaves(kCheat)[1];
  ASSERT_NO_FATAL_FAILURE(VerdictsUntilDisputed(
      kStages, kCheat, Mismatch(kCheat, StepLeaves(kCheat, true, 1), 1, truth), bundle_));
  ASSERT_EQ(Check(kCheat).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  EXPECT_TRUE(Check(kCheat).dispute()->config().operator_tiles.empty()) << "no tile phase";
  const PublicKey stage_node = Unit(kCheat).assignee;
  ExpectEachRefused(
      {{Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = kCheat, .output = truth}),
        "is a pipeline stage, whose disputes the ledger rules itself; the genesis key rules none "
        "(RefereeTile, RefereeStageStep)"},
       {Q(alice_,
          RefereeStageStepTx{
              .task_id = task_id_, .index = kCheat, .witness = {EncodeStageStepWitness({})}}),
        "is not ruled from the step's replay"}});
  for (uint64_t i = 0; i <= genesis_.params.referee_blocks + 1 && HasCheck(kCheat) &&
                       Check(kCheat).stage() == protocol::CheckStage::kCheckDisputed;
       ++i) {
    Step();
  }
  ASSERT_TRUE(!HasCheck(kCheat) || Check(kCheat).stage() != protocol::CheckStage::kCheckDisputed)
      << "the referee's deadline ends the dispute";
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.fraud, 0u);
  EXPECT_EQ(t.verification.slashed, 0u);
  EXPECT_TRUE(t.verification.rulings.empty()) << TaskToJson(t)["verification"].dump();
  EXPECT_EQ(Node(stage_node).reputation.slashes, 0u);
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);
}

// Two replicas; stage 1 of replica 0 lies from step 1 on (of 4) and, disputed over its tile plan,
// does not defend it. Before the round re-runs, the work no false tensor reached is paid: replica
// 1's stages their whole StageUnitCost (trained from the round's honest start), replica 0's honest
// stages step 0's quarter of theirs, the cheater nothing.
TEST_F(PipelineVerificationTest, AFraudRoundsHonestStageWorkIsPaidBeforeItReruns) {
  for (uint8_t i = 4; i < 7; ++i) stagers_.push_back(TestKey(static_cast<uint8_t>(30 + i)));
  Start([](TaskParams& p) { p.units_per_round = 2 * kStages; });
  constexpr uint32_t kUnits = 2 * kStages, kCheat = 1;
  std::vector<PublicKey> first_run;
  for (uint32_t i = 0; i < kUnits; ++i) {
    ASSERT_EQ(Unit(i).status, WorkUnitStatus::kAssigned) << i;
    first_run.push_back(Unit(i).assignee);
  }
  std::vector<Transaction> txs;
  for (uint32_t i = 0; i < kUnits; ++i) {
    txs.push_back(Q(alice_, Commit(i, StepLeaves(i, i == kCheat, 1))));
  }
  StepOk(txs);
  Aggregate();
  for (uint32_t i = 0; i < kUnits; ++i) {
    ASSERT_EQ(Check(i).stage(), protocol::CheckStage::kCheckCommitVerdicts) << i;
  }
  ASSERT_NO_FATAL_FAILURE(VerdictsUntilDisputed(
      kUnits, kCheat, Mismatch(kCheat, StepLeaves(kCheat, true, 1), 1, StepLeaves(kCheat)[1]),
      bundle_));
  ASSERT_NO_FATAL_FAILURE(StageSilentInTheTilePhase(kCheat));
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  ASSERT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.fraud, 1u);
  for (uint32_t i = 0; i < kUnits; ++i) {
    const Amount cost = StageUnitCost(t.params, kTestUnitCost, i % kStages);
    const Amount want = i == kCheat ? 0 : i < kStages ? cost / 4 : cost;
    EXPECT_EQ(Node(first_run[i]).earnings.units, want)
        << "unit " << i << " (replica " << i / kStages << ", stage " << i % kStages << ")";
  }
}

TEST_F(PipelineVerificationTest, ACommitStageWithoutItsStepLeavesOrSecretIsRefused) {
  Start();
  const std::vector<Hash256> leaves = StepLeaves(0);
  CommitStageTx short_leaves = Commit(0, leaves);
  short_leaves.leaves.pop_back();
  CommitStageTx other_root = Commit(0, leaves);
  other_root.commitment = Blake2b("another commitment");
  CommitStageTx bad_secret = Commit(0, leaves);
  bad_secret.secret_index = 5;
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {Q(alice_, short_leaves),
       "commit stage: leaves must be the stage's 4 step leaves "
       "(StageStepLeaf of steps 0..3) whose StageCommitment is the "
       "commitment (got 3)"},
      {Q(alice_, other_root), "commit stage: leaves must be the stage's 4 step leaves"},
      {Q(alice_, bad_secret), "commit stage: secret_index must be 1"},
  };
  ExpectEachRefused(refusals);
  EXPECT_EQ(Unit(0).status, WorkUnitStatus::kAssigned);
  StepOk({Q(alice_, Commit(0, leaves))});
  // A mismatch on a stage unit carries the task's own bundle (over the stage witness bound it must:
  // above; it opens the tile phase over the stage's plan), and a stage unit has no after-the-fact
  // fraud proof.
  RevealVerdictTx with_bundle{.task_id = task_id_,
                              .index = 0,
                              .node_id = verifier_.public_key(),
                              .verdict = static_cast<uint8_t>(protocol::Verdict::kVerdictMismatch),
                              .bundle = {.text = "[model]"}};
  std::vector<Receipt> r = Step({Q(alice_, with_bundle)});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("reveal verdict: bundle: the witness's bundle has blob id"),
            std::string::npos)
      << r[0].reason;
}

// Adversary wrong_result on a stage: every step true, the committed result another delta. No
// step replay sees it; a ProveResult whose witness is the stage's last commit and its state
// after it does (ExecuteStageResultWitness): the ledger refuses every bad witness by name and an
// honest stage's right result ("nothing to prove"), and the good witness makes the check fraud at
// once (no dispute): the stage slashed and jailed, the round re-run, nobody else slashed.
TEST_F(PipelineRulingTest, AStagesWrongResultIsProvenFromItsFinalStateAndBadWitnessesRefused) {
  const std::vector<float> start = WholeStart();
  const Bytes start_blob =
      protocol::EncodeGlobalState(start, std::vector<float>(start.size(), 0.0f));
  ASSERT_NO_FATAL_FAILURE(StartRuled(BuildManifest(start_blob).id().hash));
  ASSERT_NO_FATAL_FAILURE(Train());
  std::vector<Hash256> right;  // each stage's result: StageResultBlobId of its final state
  for (uint32_t st = 0; st < kStages; ++st) {
    Result<engine::TrainState> fin = StageCheckpointState(final_[st]);
    ASSERT_TRUE(fin.ok()) << fin.status().ToString();
    Result<Hash256> id = StageResultBlobId(spec_.model, start, *fin);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    right.push_back(*id);
  }
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) {
    CommitStageTx c = Commit(st, Leaves(st));
    c.result_hash = st == kCheat ? Blake2b("the negated delta") : right[st];
    txs.push_back(Q(alice_, c));
  }
  StepOk(txs);
  const StageResultWitness good{
      .bundle = kRulingBundle,
      .start_state = start_blob,
      .commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kSteps - 1].commit),
      .state = final_[kCheat]};
  const Bytes good_bytes = EncodeStageResultWitness(good);
  std::printf("stage result witness: %zu bytes (start state %zu, final state %zu)\n",
              good_bytes.size(), good.start_state.size(), good.state.size());
  EXPECT_LE(good_bytes.size(), kMaxWitnessBytes);
  Result<StageResultWitness> round_trip = DecodeStageResultWitness(good_bytes);
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
  EXPECT_EQ(*round_trip, good);
  auto prove = [&](uint32_t index, const Bytes& witness) {
    return Q(alice_, ProveResultTx{.task_id = task_id_,
                                   .index = index,
                                   .node_id = verifier_.public_key(),
                                   .witness = {witness}});
  };
  auto with = [&](const std::function<void(StageResultWitness&)>& edit) {
    StageResultWitness w = good;
    edit(w);
    return prove(kCheat, EncodeStageResultWitness(w));
  };
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {with([&](StageResultWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kSteps - 2].commit);
       }),
       "is not the stage's last committed step"},
      {with([&](StageResultWitness& w) { w.state = evidence_[kCheat][kSteps - 1].checkpoint; }),
       "the state hashes to"},
      {with([&](StageResultWitness& w) { w.state.resize(10); }), "state: "},
      {with([&](StageResultWitness& w) {
         w.start_state = protocol::EncodeGlobalState(std::vector<float>(start.size(), 0.0f),
                                                     std::vector<float>(start.size(), 0.0f));
       }),
       "the witness's start state has blob id"},
      {with([&](StageResultWitness& w) { w.bundle += "\n"; }), "send the task's own bundle text"},
      {prove(kCheat, EncodeResultWitness({})), "a pipeline task's ProveResult carries"},
      // An honest stage's result is the delta of its final state.
      {prove(0, EncodeStageResultWitness(
                    {.bundle = kRulingBundle,
                     .start_state = start_blob,
                     .commit = protocol::EncodeStageStepCommit(evidence_[0][kSteps - 1].commit),
                     .state = final_[0]})),
       "nothing to prove"},
  };
  // All in one block (the stages reveal no secrets here: the checks must stay open).
  std::vector<Transaction> bad;
  for (const auto& [tx, why] : refusals) bad.push_back(tx);
  const std::vector<Receipt> refused = Step(bad);
  ASSERT_EQ(refused.size(), refusals.size());
  for (size_t i = 0; i < refusals.size(); ++i) {
    EXPECT_FALSE(refused[i].ok) << refusals[i].second;
    EXPECT_NE(refused[i].reason.find(refusals[i].second), std::string::npos) << refused[i].reason;
  }
  ASSERT_TRUE(HasCheck(kCheat));
  const PublicKey cheater = Unit(kCheat).assignee;
  std::vector<PublicKey> chain_before;
  std::vector<Amount> price_before;
  for (uint32_t st = 0; st < kStages; ++st) {
    chain_before.push_back(Unit(st).assignee);
    price_before.push_back(Unit(st).price);
  }
  std::vector<Receipt> r = Step({prove(kCheat, good_bytes)});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.fraud, 1u);
  EXPECT_EQ(t.verification.disputes, 0u);
  // A wrong result fed no tensor to the other stages: each is paid its whole stage cost for the
  // round the fraud discards (PayHonestStageWork with no false step); the cheater nothing.
  for (uint32_t st = 0; st < kStages; ++st) {
    const Amount want =
        st == kCheat ? 0 : StageUnitCost(t.params, UnitCost(t, price_before[st]), st);
    EXPECT_EQ(Node(chain_before[st]).earnings.units, want) << "stage " << st;
  }
  ExpectOnlyTheCheaterSlashed(cheater);
}

TEST_F(PipelineRulingTest, TheLedgerReplaysALazyStagesStepAndRefusesEveryBadWitness) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  // The lazy stage commits, for step 1, the state it started from as its state after.
  TestStageEvidence lie = evidence_[kCheat][kLieStep];
  lie.commit.state_after = lie.commit.state_before;
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  leaves[kCheat][kLieStep] = protocol::StageStepLeaf(lie.commit);
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) txs.push_back(Q(alice_, Commit(st, leaves[st])));
  StepOk(txs);
  Aggregate();
  // The verifier's replay of the served evidence (what node::CheckStageStep runs): the honest
  // stages replay to their leaves, the lazy one to a `state` finding.
  std::vector<protocol::NodeId> chain;
  for (uint32_t st = 0; st < kStages; ++st) chain.push_back(Unit(st).assignee);
  Result<StageReplaySetup> setup = StageReplaySetupOf(spec_, net_, work_.lr_scale, chain);
  ASSERT_TRUE(setup.ok());
  auto judge = [&](const TestStageEvidence& ev, const Hash256& leaf) {
    const engine::Batch batch = engine::MakeTokenBatch(
        data_.train_tokens,
        engine::WindowStarts(spec_.seed, work_.stream, static_cast<int64_t>(ev.commit.step),
                             spec_.batch_size,
                             static_cast<int64_t>(data_.train_tokens.tokens.size()), spec_.seq_len),
        spec_.seq_len);
    Result<StageStepCheck> c = JudgeStageStep(*setup, ev.commit, ev.checkpoint, ev.blobs, batch,
                                              engine::DropoutSeed(spec_.seed, work_.stream), leaf);
    CHECK(c.ok()) << c.status().ToString();
    return *c;
  };
  EXPECT_EQ(judge(evidence_[0][kLieStep], leaves[0][kLieStep]).leaf, leaves[0][kLieStep]);
  const StageStepCheck finding = judge(lie, leaves[kCheat][kLieStep]);
  ASSERT_EQ(finding.replay.fault, StageFault::kStageFaultState) << finding.message;
  ASSERT_NE(finding.leaf, leaves[kCheat][kLieStep]);
  ASSERT_NO_FATAL_FAILURE(VerdictsUntilReferee(
      kStages, kCheat, Mismatch(kCheat, leaves[kCheat], kLieStep, finding.leaf)));

  // The witness, built from the lazy stage's served evidence.
  Result<StageStepWitness> built =
      BuildStageStepWitness(kRulingBundle, lie.commit, lie.checkpoint, lie.blobs, spec_,
                            work_.stream, pages_.get(), nullptr, nullptr);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  const StageStepWitness good = *built;
  const Bytes good_bytes = EncodeStageStepWitness(good);
  std::printf("stage step witness: %zu bytes (checkpoint %zu, %zu received tensors, %zu pages)\n",
              good_bytes.size(), good.checkpoint.size(), good.received.size(), good.pages.size());
  EXPECT_LE(good_bytes.size(), kMaxWitnessBytes);
  Result<StageStepWitness> round_trip = DecodeStageStepWitness(good_bytes);
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
  EXPECT_EQ(*round_trip, good);

  auto with = [&](const std::function<void(StageStepWitness&)>& edit) {
    StageStepWitness w = good;
    edit(w);
    return Q(alice_,
             RefereeStageStepTx{
                 .task_id = task_id_, .index = kCheat, .witness = {EncodeStageStepWitness(w)}});
  };
  Bytes oversize(kMaxWitnessBytes + 1, 0);
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {with([&](StageStepWitness& w) { w.checkpoint = evidence_[kCheat][0].checkpoint; }),
       "the checkpoint (step 0) hashes to"},
      {with([&](StageStepWitness& w) { w.checkpoint.resize(10); }), "checkpoint: "},
      {with([&](StageStepWitness& w) { w.received[0][0] ^= 1; }),
       "received tensor 0 (" + lie.commit.received[0].key.ToString() +
           ") does not match its signed record"},
      {with([&](StageStepWitness& w) { w.received.pop_back(); }),
       "send the tensor of every received record"},
      {with([&](StageStepWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep].commit);
       }),
       "the stage committed " + leaves[kCheat][kLieStep].ShortHex() + " for the step"},
      {with([&](StageStepWitness& w) { w.pages.pop_back(); }), "token pages; the step's batch"},
      {with([&](StageStepWitness& w) { w.pages[0].tokens[0] ^= 1; }),
       "is not proven against the task's data root"},
      {with([&](StageStepWitness& w) { w.bundle += "\n"; }), "send the task's own bundle text"},
      {Q(alice_, RefereeStageStepTx{.task_id = task_id_, .index = kCheat, .witness = {oversize}}),
       "over the limit of " + std::to_string(kMaxWitnessBytes)},
      // Not at the referee: an honest stage's unit has no dispute.
      {Q(alice_, RefereeStageStepTx{.task_id = task_id_, .index = 0, .witness = {good_bytes}}),
       "unit 0 has no dispute waiting for the referee"},
      // No trusted party rules what the ledger replays: the genesis key is refused, and a unit's
      // step witness is pointed at the stage's.
      {Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = kCheat, .output = finding.leaf}),
       "send RefereeStageStep with the stage step's witness"},
      {Q(alice_,
         RefereeStepTx{.task_id = task_id_, .index = kCheat, .witness = {EncodeStepWitness({})}}),
       "send RefereeStageStep with the stage step's witness"},
  };
  ExpectEachRefused(refusals);
  ASSERT_TRUE(HasCheck(kCheat));
  ASSERT_EQ(Check(kCheat).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  // Anyone posts the good witness (here bob, no party of the dispute): the ledger replays the
  // step and rules with the finding leaf, so the verifier wins and the lazy stage is slashed.
  const PublicKey cheater = Unit(kCheat).assignee;
  const uint32_t round = Unit(kCheat).round;
  const uint64_t step = Check(kCheat).dispute()->referee_task().step;
  const Transaction ruling =
      Q(bob_, RefereeStageStepTx{.task_id = task_id_, .index = kCheat, .witness = {good_bytes}});
  std::vector<Receipt> r = Step({ruling});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  const uint64_t ruled_at = chain_->Height();
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.fraud, 1u);
  ExpectOnlyTheCheaterSlashed(cheater);
  // The task keeps the ruling (the refused witnesses left none), sent by bob, with its witness's
  // size.
  DisputeRuling want = RulingBy(ruling, ruled_at);
  want.index = kCheat;
  want.round = round;
  want.step = step;
  want.defender = cheater;
  want.challenger = verifier_.public_key();
  want.witness_bytes = good_bytes.size();
  want.challenger_honest = true;
  want.reason =
      "referee recomputed step " + std::to_string(step) + ": the defender's output is wrong";
  ExpectRulings(t, {want});
}

// The same ruling for an honest stage and a false claim: the ledger's replay gives the committed
// leaf, so the stage wins and the verifier who claimed otherwise loses.
TEST_F(PipelineRulingTest, AFalseClaimOnAnHonestStageLosesToTheLedgersReplay) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, Blake2b("a false finding")));
  const TestStageEvidence& ev = evidence_[kCheat][kLieStep];
  Result<StageStepWitness> w =
      BuildStageStepWitness(kRulingBundle, ev.commit, ev.checkpoint, ev.blobs, spec_, work_.stream,
                            pages_.get(), nullptr, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const uint64_t step = Check(kCheat).dispute()->referee_task().step;
  const Transaction ruling =
      Q(bob_, RefereeStageStepTx{
                  .task_id = task_id_, .index = kCheat, .witness = {EncodeStageStepWitness(*w)}});
  StepOk({ruling});
  const uint64_t ruled_at = chain_->Height();
  for (int i = 0; i < 5; ++i) Step();
  ASSERT_TRUE(HasCheck(kCheat)) << "no fraud: the round stands";
  EXPECT_NE(Check(kCheat).stage(), protocol::CheckStage::kCheckDisputed);
  EXPECT_EQ(Task().verification.fraud, 0u);
  EXPECT_EQ(Node(Unit(kCheat).assignee).reputation.slashes, 0u);
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 1u);
  DisputeRuling want = RulingBy(ruling, ruled_at);
  want.index = kCheat;
  want.round = Unit(kCheat).round;
  want.step = step;
  want.defender = Unit(kCheat).assignee;
  want.challenger = verifier_.public_key();
  want.witness_bytes = EncodeStageStepWitness(*w).size();
  want.defender_honest = true;
  want.reason =
      "referee recomputed step " + std::to_string(step) + ": the challenger's output is wrong";
  ExpectRulings(Task(), {want});
  EXPECT_EQ(TaskToJson(Task())["verification"]["rulings"][0]["for"], "defender");
}

// A stage whose committed commit lists a received record signed by a node that is not its
// sender's in the chain (it made up its own input): the commit is bound by the committed leaf, so
// this is the stage's `record` finding and the ledger rules against it -- not a refusal of the
// witness, which would leave a forged input unruled.
TEST_F(PipelineRulingTest, ACommittedRecordOfAnotherNodeIsRuledAgainstTheStage) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  TestStageEvidence forged = evidence_[kCheat][kLieStep];
  protocol::StageTransfer& r = forged.commit.received[0];
  r = protocol::SignStageTransfer(r.key, r.tensor, r.bytes, verifier_);
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  leaves[kCheat][kLieStep] = protocol::StageStepLeaf(forged.commit);
  Result<StageStepWitness> w =
      BuildStageStepWitness(kRulingBundle, forged.commit, forged.checkpoint, forged.blobs, spec_,
                            work_.stream, pages_.get(), nullptr, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // What every party's replay finds (the verifier's claim).
  std::vector<protocol::NodeId> chain;
  for (uint32_t st = 0; st < kStages; ++st) chain.push_back(Unit(st).assignee);
  Result<StageReplaySetup> setup = StageReplaySetupOf(spec_, net_, work_.lr_scale, chain);
  ASSERT_TRUE(setup.ok());
  Result<StageReplayResult> replay = ReplayStageStep(
      *setup, *StageCheckpointState(forged.checkpoint), forged.commit, forged.blobs,
      engine::MakeTokenBatch(
          data_.train_tokens,
          engine::WindowStarts(spec_.seed, work_.stream, kLieStep, spec_.batch_size,
                               static_cast<int64_t>(pages_->num_tokens()), spec_.seq_len),
          spec_.seq_len),
      engine::DropoutSeed(spec_.seed, work_.stream));
  ASSERT_TRUE(replay.ok());
  ASSERT_EQ(replay->fault, StageFault::kStageFaultRecord) << replay->message;
  ASSERT_NO_FATAL_FAILURE(
      CommitAndDispute(leaves, StageFindingLeaf(leaves[kCheat][kLieStep], *replay)));
  const PublicKey cheater = Unit(kCheat).assignee;
  StepOk({Q(bob_,
            RefereeStageStepTx{
                .task_id = task_id_, .index = kCheat, .witness = {EncodeStageStepWitness(*w)}})});
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
}

// ---- Fraud proofs after the fact on a stage unit (ProveFraudTx; docs/verification.md, "Fraud
// proofs after the fact"). The lazy stage's step 1 claims the state it started from; its
// verifier calls every stage clean without replaying (a rubber stamp), so the round is final,
// the task finishes and the lazy stage is paid. Anyone then proves step 1 with the witness a
// RefereeStageStep carries: the ledger replays it (RuleStageStepWitness) and the finding leaf is
// not the committed one.
class PipelineFraudProofTest : public PipelineRulingTest {
 protected:
  // Trains and commits the replica with kCheat's step kLieStep lazy (or as `lie` edits its
  // commit), and settles it clean until the task finishes with every stage paid. good_ is the
  // lazy step's witness.
  void RunLazyTask(const std::function<void(protocol::StageStepCommit&)>& lie = nullptr) {
    ASSERT_NO_FATAL_FAILURE(Train());
    lie_ = evidence_[kCheat][kLieStep];
    lie_.commit.state_after = lie_.commit.state_before;
    if (lie) {
      lie_.commit = evidence_[kCheat][kLieStep].commit;
      lie(lie_.commit);
      // A made-up received record comes with bytes of its own (nobody sent its tensor).
      for (const protocol::StageTransfer& r : lie_.commit.received) {
        lie_.blobs.try_emplace(r.tensor, Bytes(static_cast<size_t>(r.bytes), 0));
      }
    }
    for (uint32_t st = 0; st < kStages; ++st) leaves_.push_back(Leaves(st));
    leaves_[kCheat][kLieStep] = protocol::StageStepLeaf(lie_.commit);
    std::vector<Transaction> txs;
    for (uint32_t st = 0; st < kStages; ++st) txs.push_back(Q(alice_, Commit(st, leaves_[st])));
    StepOk(txs);
    Result<StageStepWitness> w =
        BuildStageStepWitness(kRulingBundle, lie_.commit, lie_.checkpoint, lie_.blobs, spec_,
                              work_.stream, pages_.get(), nullptr, nullptr);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    good_ = *w;
    // While the round is open its check rules the stage (verdicts, a dispute, ChallengeUnit).
    const Receipt early = Step({Prove(good_)})[0];
    EXPECT_FALSE(early.ok);
    EXPECT_NE(early.reason.find("is not final yet"), std::string::npos) << early.reason;
    Aggregate();
    EveryStageVerifiedClean();
    for (int i = 0; i < 20 && Task().status != TaskStatus::kFinished; ++i) Step();
    ASSERT_EQ(Task().status, TaskStatus::kFinished);
    for (uint32_t st = 0; st < kStages; ++st) {
      ASSERT_EQ(Unit(st).status, WorkUnitStatus::kVerified) << st;
      ASSERT_GT(Unit(st).paid, 0u) << st;
    }
  }

  Transaction Prove(const StageStepWitness& w, uint32_t index = kCheat, uint32_t step = kLieStep) {
    return Prove(EncodeStageStepWitness(w), index, step);
  }
  // Any account proves (here the genesis referee's, which holds funds: it proves as anyone).
  Transaction Prove(const Bytes& witness, uint32_t index, uint32_t step) {
    return Q(
        referee_,
        ProveFraudTx{.task_id = task_id_, .index = index, .segment = step, .witness = {witness}});
  }

  // The referee account's commitment to the proof of `w` (CommitProof): the bounty is the
  // earliest committer's, so a prover commits a block before it proves.
  Transaction CommitToProve(const StageStepWitness& w, uint32_t index = kCheat,
                            uint32_t step = kLieStep) {
    const ProveFraudTx proof{.task_id = task_id_,
                             .index = index,
                             .segment = step,
                             .witness = {EncodeStageStepWitness(w)}};
    return Q(referee_, CommitProofTx{.commitment = ProofCommitment(ProofWitnessId(proof),
                                                                   referee_.public_key()),
                                     .prover = referee_.public_key()});
  }

  TestStageEvidence lie_;
  std::vector<std::vector<Hash256>> leaves_;
  StageStepWitness good_;
};

// Within the audit window: every bad witness is refused by name and changes nothing (an honest
// stage's true step "nothing to prove"); the good one slashes and jails the lazy stage, claws back
// its pay into the escrow, reopens the task and rewinds it to round 0, which is placed again
// without the lazy stage. The honest stages keep what they were paid, as under taint.
TEST_F(PipelineFraudProofTest, ALazyStagesStepIsProvenAfterTheFactAndReopensTheTask) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(RunLazyTask());
  const PublicKey cheater = Unit(kCheat).assignee;
  const Amount paid = Unit(kCheat).paid;
  const Amount slash = protocol::SlashAmount(
      StageUnitCost(Task().params, UnitCost(Task(), Unit(kCheat).price), kCheat), kSlashMultiple);
  std::vector<PublicKey> chain;
  std::vector<Amount> earned;
  for (uint32_t st = 0; st < kStages; ++st) {
    chain.push_back(Unit(st).assignee);
    earned.push_back(Node(chain.back()).earnings.units);
  }
  auto with = [&](const std::function<void(StageStepWitness&)>& edit) {
    StageStepWitness w = good_;
    edit(w);
    return Prove(w);
  };
  const TestStageEvidence& honest = evidence_[0][kLieStep];
  Result<StageStepWitness> honest_witness =
      BuildStageStepWitness(kRulingBundle, honest.commit, honest.checkpoint, honest.blobs, spec_,
                            work_.stream, pages_.get(), nullptr, nullptr);
  ASSERT_TRUE(honest_witness.ok()) << honest_witness.status().ToString();
  const std::vector<std::pair<Transaction, std::string>> refusals = {
      // An honest stage's step replays to its leaf.
      {Prove(*honest_witness, 0),
       "step 1 of unit 0 of task " + task_id_.ShortHex() + " replays to its committed leaf"},
      // The lazy stage's step as it trained it is not what it committed.
      {with([&](StageStepWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep].commit);
       }),
       "prove fraud (task " + task_id_.ShortHex() +
           ", unit 1: replica 0, stage 1, step 1): " + "the witness's commit has leaf"},
      {with([&](StageStepWitness& w) { w.checkpoint = evidence_[kCheat][0].checkpoint; }),
       "the checkpoint (step 0) hashes to"},
      {with([&](StageStepWitness& w) { w.received[0][0] ^= 1; }),
       "does not match its signed record"},
      {with([&](StageStepWitness& w) { w.pages[0].tokens[0] ^= 1; }),
       "is not proven against the task's data root"},
      {with([&](StageStepWitness& w) { w.bundle += "\n"; }), "send the task's own bundle text"},
      // The witness of step 1 offered as step 2's: step 2's committed leaf is another commit's.
      {Prove(good_, kCheat, kLieStep + 1), "the witness's commit has leaf"},
      {Prove(good_, kCheat, kSteps), "a stage unit's segment is its step, and unit 1 of task " +
                                         task_id_.ShortHex() + " has 4 steps"},
      {Prove(EncodeSegmentWitness({}), kCheat, kLieStep),
       "a pipeline stage's proof carries a stage step witness"},
  };
  // All in one block: the audit window (10 blocks on a devnet genesis) must stay open.
  const TaskRecord before = Task();
  std::vector<Transaction> bad;
  for (const auto& [tx, why] : refusals) bad.push_back(tx);
  const std::vector<Receipt> refused = Step(bad);
  ASSERT_EQ(refused.size(), refusals.size());
  for (size_t i = 0; i < refusals.size(); ++i) {
    EXPECT_FALSE(refused[i].ok) << refusals[i].second;
    EXPECT_NE(refused[i].reason.find(refusals[i].second), std::string::npos) << refused[i].reason;
  }
  EXPECT_EQ(Task(), before);
  EXPECT_EQ(Node(cheater).reputation.slashes, 0u);

  const Amount prover_before = Balance(referee_);
  StepOk({CommitToProve(good_)});
  ASSERT_LE(chain_->Height() + 1, AuditWindowEnd(before, genesis_.params.audit_window_blocks));
  const std::vector<Receipt> r = Step({Prove(good_)});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_EQ(f.index, kCheat);
  EXPECT_EQ(f.segment, kLieStep);
  EXPECT_EQ(f.solver, cheater);
  EXPECT_EQ(f.prover, referee_.public_key());
  EXPECT_TRUE(f.rewound);
  EXPECT_EQ(f.rewound_to, 0u);
  EXPECT_EQ(f.clawed_back, paid);
  EXPECT_EQ(f.slashed, slash);
  EXPECT_GT(f.bounty, 0u);
  EXPECT_EQ(Balance(referee_), prover_before + f.bounty);
  EXPECT_EQ(t.status, TaskStatus::kOpen);
  EXPECT_EQ(t.verification.reopened, 1u);
  EXPECT_EQ(t.verification.rounds_rewound, 1u);
  EXPECT_TRUE(t.final_state.IsZero());
  EXPECT_EQ(t.escrow, paid + t.verification.redo_escrow);
  EXPECT_EQ(t.budget, t.escrow + t.spent + t.refunded);
  ExpectOnlyTheCheaterSlashed(cheater);
  EXPECT_EQ(Node(cheater).earnings.clawed_back, paid);
  for (uint32_t st = 0; st < kStages; ++st) {
    if (st == kCheat) continue;
    EXPECT_EQ(Node(chain[st]).earnings.units, earned[st]) << "stage " << st;
  }
  // The proven unit runs again: a second proof finds it unfinal.
  const Receipt again = Step({Prove(good_)})[0];
  EXPECT_FALSE(again.ok);
  EXPECT_NE(again.reason.find("is not final yet"), std::string::npos) << again.reason;
  // Round 0 is placed again, whole, on the three stage nodes left.
  for (int i = 0; i < 10 && Unit(kCheat).assignee == PublicKey{}; ++i) Step();
  for (uint32_t st = 0; st < kStages; ++st) {
    EXPECT_NE(Unit(st).assignee, PublicKey{}) << st;
    EXPECT_NE(Unit(st).assignee, cheater) << st;
  }
}
// A paid stage that moved its state between steps 0 and 1 (drift: step 1 replays clean) is
// proven after the fact from its two committed commits, the witness its continuity claim's
// dispute is ruled with; an honest stage's continuity witness is refused.
TEST_F(PipelineFraudProofTest, ADriftedStageIsProvenFromItsTwoCommitsAfterTheFact) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(RunLazyTask([](protocol::StageStepCommit& c) {
    c.state_before = Blake2b("the state moved between the steps");
  }));
  const PublicKey cheater = Unit(kCheat).assignee;
  auto continuity = [&](uint32_t stage, const protocol::StageStepCommit& commit) {
    return EncodeStageContinuityWitness(
        {.commit = protocol::EncodeStageStepCommit(commit),
         .previous = protocol::EncodeStageStepCommit(evidence_[stage][kLieStep - 1].commit)});
  };
  const Receipt honest =
      Step({Prove(continuity(0, evidence_[0][kLieStep].commit), 0, kLieStep)})[0];
  EXPECT_FALSE(honest.ok);
  EXPECT_NE(honest.reason.find("nothing to rule"), std::string::npos) << honest.reason;
  EXPECT_EQ(Node(cheater).reputation.slashes, 0u);
  const Receipt r = Step({Prove(continuity(kCheat, lie_.commit), kCheat, kLieStep)})[0];
  ASSERT_TRUE(r.ok) << r.reason;
  ASSERT_EQ(Task().verification.proven_frauds.size(), 1u);
  EXPECT_EQ(Task().verification.proven_frauds[0].index, kCheat);
  EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
}

// A paid stage whose step 1 commit holds a received record its sender never signed (a tensor
// nobody sent) is proven after the fact from that commit alone (StageRecordWitness, other
// empty); an honest stage's received record, signed by its sender, is "nothing to prove".
TEST_F(PipelineFraudProofTest, AMadeUpReceivedRecordIsProvenFromTheStagesCommitAlone) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(RunLazyTask([](protocol::StageStepCommit& c) {
    ASSERT_FALSE(c.received.empty());
    c.received[0].tensor = Blake2b("a tensor nobody sent");
  }));
  const PublicKey cheater = Unit(kCheat).assignee;
  auto record = [](const protocol::StageStepCommit& c, uint32_t i) {
    return EncodeStageRecordWitness({.commit = protocol::EncodeStageStepCommit(c), .record = i});
  };
  auto refused = [&](const Bytes& w, uint32_t index, const std::string& why) {
    const TaskRecord before = Task();
    const Receipt r = Step({Prove(w, index, kLieStep)})[0];
    EXPECT_FALSE(r.ok) << why;
    EXPECT_NE(r.reason.find(why), std::string::npos) << r.reason;
    EXPECT_EQ(Task().verification.proven_frauds, before.verification.proven_frauds);
  };
  refused(record(evidence_[0][kLieStep].commit, 0), 0, "nothing to prove");
  refused(record(lie_.commit, 99), kCheat, "is out of range");
  refused(record(evidence_[kCheat][kLieStep].commit, 0), kCheat,
          "is not the stage's committed step");
  Bytes garbage = record(lie_.commit, 0);
  garbage.push_back(0);
  refused(garbage, kCheat, "stage record witness");
  EXPECT_EQ(Node(cheater).reputation.slashes, 0u);
  const Receipt r = Step({Prove(record(lie_.commit, 0), kCheat, kLieStep)})[0];
  ASSERT_TRUE(r.ok) << r.reason;
  ASSERT_EQ(Task().verification.proven_frauds.size(), 1u);
  EXPECT_EQ(Task().verification.proven_frauds[0].index, kCheat);
  EXPECT_EQ(Task().verification.proven_frauds[0].segment, kLieStep);
  EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
  EXPECT_EQ(Node(cheater).status, NodeStatus::kJailed);
}

// A paid stage that signed one tensor to its neighbour and committed another among what it sent
// is proven after the fact from the receiver's commit (whose record carries its signature) and
// its own (StageRecordWitness with other); the receiver, whose record is signed, and an honest
// sender, whose commit lists what it sent, are "nothing to prove".
TEST_F(PipelineFraudProofTest, ASentRecordItsCommitDoesNotListIsProvenFromBothCommits) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(RunLazyTask([](protocol::StageStepCommit& c) {
    ASSERT_FALSE(c.sent.empty());
    c.sent[0].tensor = Blake2b("not what was sent");
  }));
  const PublicKey cheater = Unit(kCheat).assignee;
  const protocol::StageTransfer sent = evidence_[kCheat][kLieStep].commit.sent[0];
  const uint32_t to = sent.key.to_stage;
  const protocol::StageStepCommit& receiver = evidence_[to][kLieStep].commit;
  uint32_t at = 0;
  while (at < receiver.received.size() && receiver.received[at].key != sent.key) ++at;
  ASSERT_LT(at, receiver.received.size());
  auto record = [](const protocol::StageStepCommit& c, uint32_t i, Bytes other) {
    return EncodeStageRecordWitness(
        {.commit = protocol::EncodeStageStepCommit(c), .record = i, .other = std::move(other)});
  };
  auto refused = [&](const Bytes& w, uint32_t index, const std::string& why) {
    const Receipt r = Step({Prove(w, index, kLieStep)})[0];
    EXPECT_FALSE(r.ok) << why;
    EXPECT_NE(r.reason.find(why), std::string::npos) << r.reason;
  };
  refused(record(receiver, at, {}), to, "is signed by its sender");
  // The honest stage 0 sent stage 1 (the cheater) a record its commit lists.
  uint32_t from0 = 0;
  while (from0 < lie_.commit.received.size() && lie_.commit.received[from0].key.from_stage != 0) {
    ++from0;
  }
  ASSERT_LT(from0, lie_.commit.received.size());
  refused(
      record(evidence_[0][kLieStep].commit, from0, protocol::EncodeStageStepCommit(lie_.commit)), 0,
      "among what it sent; nothing to prove");
  refused(record(lie_.commit, at, protocol::EncodeStageStepCommit(lie_.commit)), kCheat,
          "not another stage of the replica");
  refused(record(lie_.commit, at + 99, protocol::EncodeStageStepCommit(receiver)), kCheat,
          "is out of range");
  EXPECT_EQ(Node(cheater).reputation.slashes, 0u);
  const Receipt r = Step({Prove(record(lie_.commit, at, protocol::EncodeStageStepCommit(receiver)),
                                kCheat, kLieStep)})[0];
  ASSERT_TRUE(r.ok) << r.reason;
  ASSERT_EQ(Task().verification.proven_frauds.size(), 1u);
  EXPECT_EQ(Task().verification.proven_frauds[0].index, kCheat);
  EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
}

// After the audit window the model stands: the proof slashes and jails the lazy stage and claws
// its pay back to the submitter; the task stays finished. A stage over the stage witness bound
// cannot be proven: the ledger does not replay its step.
TEST_F(PipelineFraudProofTest, AfterTheAuditWindowAStageProofLeavesTheModel) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(RunLazyTask());
  const TaskRecord finished = Task();
  while (chain_->Height() + 1 <= AuditWindowEnd(finished, genesis_.params.audit_window_blocks)) {
    Step();
  }
  const PublicKey cheater = Unit(kCheat).assignee;
  const Amount paid = Unit(kCheat).paid;
  const Amount submitter_before = Balance(bob_);
  StepOk({Prove(good_)});
  const TaskRecord t = Task();
  ASSERT_EQ(t.verification.proven_frauds.size(), 1u);
  const ProvenFraud& f = t.verification.proven_frauds[0];
  EXPECT_FALSE(f.rewound);
  EXPECT_EQ(f.clawed_back, paid);
  EXPECT_EQ(Balance(bob_), submitter_before + paid);
  EXPECT_EQ(t.status, TaskStatus::kFinished);
  EXPECT_EQ(t.final_state, finished.final_state);
  EXPECT_EQ(t.round_results, finished.round_results);
  ExpectOnlyTheCheaterSlashed(cheater);
  const Receipt again = Step({Prove(good_)})[0];
  EXPECT_FALSE(again.ok);
  EXPECT_NE(again.reason.find("already"), std::string::npos) << again.reason;
}

TEST_F(PipelineFraudProofTest, AStageOverTheWitnessBoundIsNotProvenOnChain) {
  ASSERT_NO_FATAL_FAILURE(StartRuled(Hash256{}, [](TaskParams& p) {
    p.stage_memory_bytes = {8u << 20, 8u << 20, 8u << 20};
  }));
  ASSERT_NO_FATAL_FAILURE(RunLazyTask());
  const TaskRecord before = Task();
  const Receipt r = Step({Prove(good_)})[0];
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("over the stage witness bound"), std::string::npos) << r.reason;
  EXPECT_EQ(Task(), before);
}

// A stage that serves nothing for its disputed step (the verifier's finding is `unserved`) and
// posts no witness: nobody else holds the stage's checkpoint and inputs, so past the referee's
// deadline the ledger rules against the stage, as against a party that missed its turn; it is
// slashed, and the verifier is not. (Before, the dispute ended undecided and the stage was never
// punished.) The same deadline with an honest stage: see AFalseClaimOnAnHonestStage..., whose
// stage's witness is posted and wins.
TEST_F(PipelineRulingTest, AStageThatPostsNoWitnessByTheRefereesDeadlineLoses) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, Blake2b("unserved")));
  const PublicKey stage = Unit(kCheat).assignee;
  const uint64_t deadline = Check(kCheat).dispute()->query().deadline_height;
  while (chain_->Height() < deadline) {
    Step();
    ASSERT_TRUE(HasCheck(kCheat));
    ASSERT_EQ(Check(kCheat).stage(), protocol::CheckStage::kCheckDisputed) << "ruled early";
  }
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  EXPECT_EQ(Node(stage).reputation.slashes, 1u);
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 0u);
}

// A stage that moves its state between steps 0 and 1 and commits step 1 as it then trained it
// (adversary drift): step 1 replays clean from its checkpoint, but its state_before is not step
// 0's state_after. The verifier's continuity claim (StageContinuityLeaf, no bundle) is ruled by
// the ledger from the two committed commits, no replay: every bad witness is refused by name, and
// anyone's good one rules against the stage.
TEST_F(PipelineRulingTest, AStageThatMovesItsStateBetweenStepsLosesToItsTwoCommits) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  protocol::StageStepCommit drifted = evidence_[kCheat][kLieStep].commit;
  drifted.state_before = Blake2b("the state moved between the steps");
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  leaves[kCheat][kLieStep] = protocol::StageStepLeaf(drifted);
  const Hash256 claim = StageContinuityLeaf(leaves[kCheat][kLieStep]);
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, claim));
  ASSERT_EQ(Check(kCheat).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  EXPECT_TRUE(Check(kCheat).dispute()->config().operator_tiles.empty())
      << "no tile phase: the claim carries no bundle";

  const StageContinuityWitness good{
      .commit = protocol::EncodeStageStepCommit(drifted),
      .previous = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep - 1].commit)};
  const Bytes good_bytes = EncodeStageContinuityWitness(good);
  std::printf("stage continuity witness of step %llu: %zu bytes\n",
              static_cast<unsigned long long>(kLieStep), good_bytes.size());
  EXPECT_LE(good_bytes.size(), kMaxWitnessBytes);
  Result<StageContinuityWitness> round_trip = DecodeStageContinuityWitness(good_bytes);
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
  EXPECT_EQ(*round_trip, good);
  EXPECT_TRUE(IsStageContinuityWitness(good_bytes));
  EXPECT_FALSE(IsStageContinuityWitness(EncodeStageStepWitness({})));

  auto post = [&](const Bytes& w) {
    return Q(alice_, RefereeStageStepTx{.task_id = task_id_, .index = kCheat, .witness = {w}});
  };
  auto with = [&](const std::function<void(StageContinuityWitness&)>& edit) {
    StageContinuityWitness w = good;
    edit(w);
    return post(EncodeStageContinuityWitness(w));
  };
  // Step 0's commit as the stage would need it to be: ending where step 1 starts. Not committed.
  protocol::StageStepCommit moved_previous = evidence_[kCheat][kLieStep - 1].commit;
  moved_previous.state_after = drifted.state_before;
  Bytes truncated = good_bytes;
  truncated.resize(truncated.size() - 1);
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {with([&](StageContinuityWitness& w) {
         w.previous = protocol::EncodeStageStepCommit(moved_previous);
       }),
       "previous (leaf " + protocol::StageStepLeaf(moved_previous).ShortHex()},
      {with([&](StageContinuityWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep].commit);
       }),
       "commit (leaf "},
      {with([&](StageContinuityWitness& w) {
         w.commit = protocol::EncodeStageStepCommit(evidence_[0][kLieStep].commit);
       }),
       "is not the stage's committed step 1"},
      {with([&](StageContinuityWitness& w) { w.previous = w.commit; }),
       "is not the stage's committed step 0"},
      {with([&](StageContinuityWitness& w) { w.bundle = kRulingBundle; }),
       "carries a bundle or a start state"},
      {with([&](StageContinuityWitness& w) { w.commit.resize(3); }), "commit: "},
      {post(truncated), "stage continuity witness"},
      // The claim is about the states between the steps: the step's own replay does not rule it.
      {post(EncodeStageStepWitness({})), "is a continuity claim"},
      {Q(referee_, RuleDisputeTx{.task_id = task_id_, .index = kCheat, .output = claim}),
       "send RefereeStageStep"},
  };
  ExpectEachRefused(refusals);
  ASSERT_TRUE(HasCheck(kCheat));
  ASSERT_EQ(Check(kCheat).dispute()->stage(), protocol::DisputeStage::kDisputeReferee);
  const PublicKey cheater = Unit(kCheat).assignee;
  std::vector<Receipt> r = Step(
      {Q(bob_, RefereeStageStepTx{.task_id = task_id_, .index = kCheat, .witness = {good_bytes}})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  for (int i = 0; i < 5 && HasCheck(kCheat); ++i) Step();
  EXPECT_FALSE(HasCheck(kCheat)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  ExpectOnlyTheCheaterSlashed(cheater);
}

// A continuity claim on an honest stage: its commits show step 1 starting where step 0 ended, so
// the ledger refuses the witness (nothing to rule), the stage cannot be made to lose, and by the
// referee's deadline the claim, unproven, loses.
TEST_F(PipelineRulingTest, AContinuityClaimOnAnHonestStageIsRefusedAndLosesByTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(StartRuled());
  ASSERT_NO_FATAL_FAILURE(Train());
  std::vector<std::vector<Hash256>> leaves;
  for (uint32_t st = 0; st < kStages; ++st) leaves.push_back(Leaves(st));
  ASSERT_NO_FATAL_FAILURE(CommitAndDispute(leaves, StageContinuityLeaf(leaves[kCheat][kLieStep])));
  const StageContinuityWitness honest{
      .commit = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep].commit),
      .previous = protocol::EncodeStageStepCommit(evidence_[kCheat][kLieStep - 1].commit)};
  std::vector<Receipt> r =
      Step({Q(bob_, RefereeStageStepTx{.task_id = task_id_,
                                       .index = kCheat,
                                       .witness = {EncodeStageContinuityWitness(honest)}})});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("nothing to rule"), std::string::npos) << r[0].reason;
  const PublicKey stage = Unit(kCheat).assignee;
  const uint64_t deadline = Check(kCheat).dispute()->query().deadline_height;
  while (chain_->Height() < deadline) {
    Step();
    ASSERT_TRUE(HasCheck(kCheat));
    ASSERT_EQ(Check(kCheat).stage(), protocol::CheckStage::kCheckDisputed) << "ruled early";
  }
  for (int i = 0;
       i < 5 && HasCheck(kCheat) && Check(kCheat).stage() == protocol::CheckStage::kCheckDisputed;
       ++i) {
    Step();
  }
  ASSERT_TRUE(HasCheck(kCheat)) << "no fraud: the round stands";
  EXPECT_NE(Check(kCheat).stage(), protocol::CheckStage::kCheckDisputed);
  EXPECT_EQ(Task().verification.fraud, 0u);
  EXPECT_EQ(Node(stage).reputation.slashes, 0u);
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 1u);
}

// Step 0 must start from the stage's slice of the round's start state with fresh moments, as a
// Stager builds it: the ledger derives it from the witness's start state (the round's, by blob
// id) and bundle (StageFromGlobal) and compares it with the commit's state_before.
TEST_F(PipelineRulingTest, StepZeroMustStartFromTheStagesSliceOfTheRoundsStartState) {
  const std::vector<float> start = WholeStart();
  const Bytes start_blob =
      protocol::EncodeGlobalState(start, std::vector<float>(start.size(), 0.0f));
  ASSERT_NO_FATAL_FAILURE(StartRuled(BuildManifest(start_blob).id().hash));
  ASSERT_NO_FATAL_FAILURE(Train());
  // The honest start: the stage as the replica's InitPipeline made it (the same weights, sliced
  // independently of the ledger), with a fresh state's seed, as StageFromGlobal builds it.
  Result<engine::TrainState> st0 = StageCheckpointState(evidence_[kCheat][0].checkpoint);
  ASSERT_TRUE(st0.ok()) << st0.status().ToString();
  st0->seed = engine::TrainState{}.seed;
  protocol::StageStepCommit honest = evidence_[kCheat][0].commit;
  honest.state_before = engine::StateHash(*st0);
  protocol::StageStepCommit moved = honest;
  moved.state_before = Blake2b("a stage that did not start from the round's state");
  auto rule = [&](const protocol::StageStepCommit& commit, const StageContinuityWitness& w) {
    WorkUnit u = Unit(kCheat);
    std::vector<Hash256> leaves = Leaves(kCheat);
    leaves[0] = protocol::StageStepLeaf(commit);
    u.leaves = protocol::StageCheckLeaves(leaves);
    return RuleStageContinuity(Task(), u, 0, leaves[0], w, "test");
  };
  const StageContinuityWitness good{.commit = protocol::EncodeStageStepCommit(moved),
                                    .bundle = kRulingBundle,
                                    .start_state = start_blob};
  std::printf("stage continuity witness of step 0: %zu bytes (start state %zu)\n",
              EncodeStageContinuityWitness(good).size(), start_blob.size());
  EXPECT_LE(EncodeStageContinuityWitness(good).size(), kMaxWitnessBytes);
  Result<StageStepCheck> found = rule(moved, good);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->leaf, StageContinuityLeaf(protocol::StageStepLeaf(moved)));
  EXPECT_EQ(found->replay.fault, StageFault::kStageFaultContinuity);
  EXPECT_EQ(found->replay.replayed, honest.state_before);
  EXPECT_EQ(found->replay.claimed, moved.state_before);

  StageContinuityWitness w = good;
  w.commit = protocol::EncodeStageStepCommit(honest);
  Result<StageStepCheck> agreed = rule(honest, w);
  EXPECT_EQ(agreed.status().code(), StatusCode::kFailedPrecondition) << agreed.status().ToString();
  EXPECT_NE(agreed.status().message().find("nothing to rule"), std::string::npos)
      << agreed.status().ToString();

  const std::vector<std::pair<std::function<void(StageContinuityWitness&)>, std::string>> bad = {
      {[&](StageContinuityWitness& w) {
         w.start_state = protocol::EncodeGlobalState(std::vector<float>(start.size(), 0.0f),
                                                     std::vector<float>(start.size(), 0.0f));
       },
       "the witness's start state has blob id"},
      {[](StageContinuityWitness& w) { w.bundle += "\n"; }, "send the task's own bundle text"},
      {[&](StageContinuityWitness& w) {
         w.previous = protocol::EncodeStageStepCommit(evidence_[kCheat][0].commit);
       },
       "step 0 has none"},
  };
  for (const auto& [edit, why] : bad) {
    StageContinuityWitness b = good;
    edit(b);
    Result<StageStepCheck> r = rule(moved, b);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace meshlearn::ledger
