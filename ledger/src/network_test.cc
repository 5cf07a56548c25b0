// Network training on the ledger: a whole task driven through blocks (SubmitTask, the
// end-of-block scheduler and round machine, CommitUnit, CommitAggregate, payments, refund),
// checked against a follower (ApplyBlock) and ReplayFromGenesis after every block.
#include <functional>
#include <map>
#include <set>

#include "execute.h"
#include "meshlearn/protocol/round_phase.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using protocol::RoundPhase;
using protocol::RoundStateMachine;
using testing::FollowedChainFixture;
using testing::TestKey;
using testing::TestTaskParams;

using testing::kTestPrice;
using testing::kTestUnitCost;

class NetworkTest : public FollowedChainFixture {
 protected:
  NetworkTest() : dave_(TestKey(4)), n1_(TestKey(11)), n2_(TestKey(12)), n3_(TestKey(13)) {
    genesis_ = DevnetGenesis(
        {alice_.public_key(), bob_.public_key(), carol_.public_key(), dave_.public_key()}, kFunds,
        "test-chain");
    genesis_.params.liveness_blocks = 1000;  // no heartbeats needed in these tests
    // Scheduling, commits and payments alone; verification_test.cc covers the checks.
    genesis_.params.verification = false;
    genesis_.params.min_deadline_blocks = 4;
    genesis_.params.deadline_slack_permille = 2000;
    owner_[n1_.public_key()] = &alice_;
    owner_[n2_.public_key()] = &bob_;
    owner_[n3_.public_key()] = &carol_;
  }

  RegisterNodeTx Reg(const KeyPair& node, uint64_t throughput) {
    return RegisterNodeTx{.node_id = node.public_key(),
                          .endpoint = "http://node:1",
                          .roles = kRoleSolver | kRoleAggregator,
                          .capabilities = {.cores = 4,
                                           .memory_bytes = 1ull << 30,
                                           .throughput = throughput,
                                           .latency_ms = 1,
                                           .bandwidth_bytes_per_s = 1'000'000'000},
                          .price = kTestPrice,
                          .stake = 100};
  }

  SubmitTaskTx Submit(Amount budget) {
    TaskParams p = TestTaskParams();
    p.units_per_round = 6;
    p.num_examples = 600;
    return SubmitTaskTx{.spec_hash = Blake2b("bundle"),
                        .budget = budget,
                        .price_cap = 20,
                        .memo = "fashion",
                        .params = p};
  }

  TaskRecord Task() { return chain_->GetTask(task_id_).value(); }
  RoundStateMachine Machine() { return RoundStateMachine::Decode(Task().runtime).value(); }
  std::vector<WorkUnit> Units() { return chain_->ListWorkUnits(task_id_); }
  NodeRecord Node(const KeyPair& k) { return chain_->GetNode(k.public_key()).value(); }

  CommitUnitTx Commit(const WorkUnit& u) {
    return CommitUnitTx{.task_id = task_id_,
                        .index = u.index,
                        .node_id = u.assignee,
                        .result_hash = Blake2b("delta " + std::to_string(u.index)),
                        .commitment = Blake2b("root " + std::to_string(u.index)),
                        .loss_micros = 1000 + u.index};
  }
  // The commit of `u`, signed by its assignee's owner.
  Transaction OwnerCommit(const WorkUnit& u) { return Q(*owner_.at(u.assignee), Commit(u)); }

  // Registers the three nodes (n1 four times as fast) and submits the task; returns the
  // submit's receipt.
  Receipt Start(Amount budget) {
    std::vector<Receipt> r =
        Step({Q(alice_, Reg(n1_, 4'000'000'000'000)), Q(bob_, Reg(n2_, 1'000'000'000'000)),
              Q(carol_, Reg(n3_, 1'000'000'000'000)),
              // n1 signs some of its commits itself.
              Q(alice_, TransferTx{.to = n1_.public_key(), .amount = 10})});
    for (const Receipt& x : r) EXPECT_TRUE(x.ok) << x.reason;
    Transaction submit = Q(dave_, Submit(budget));
    task_id_ = TaskIdFor(dave_.public_key(), submit.nonce);
    return Step({submit})[0];
  }

  KeyPair dave_, n1_, n2_, n3_;
  std::map<PublicKey, const KeyPair*> owner_;
  Hash256 task_id_;
};

TEST_F(NetworkTest, WholeTaskThroughBlocks) {
  constexpr Amount kBudget = 100'000;
  Receipt submit = Start(kBudget);
  ASSERT_TRUE(submit.ok) << submit.reason;
  const uint64_t submit_height = chain_->Height();
  EXPECT_EQ(Balance(dave_), kFunds - kBudget);
  TaskRecord t = Task();
  EXPECT_EQ(t.unit_count, 12u);  // all 2 x 6 units exist from the start
  EXPECT_EQ(t.params.units_per_round, 6u);
  ASSERT_EQ(Units().size(), 12u);

  // ---- Round 0 assigned at the end of the submit's block; the fast node gets the most.
  std::map<PublicKey, int> per_node;
  for (const WorkUnit& u : Units()) {
    EXPECT_EQ(u.round, u.index / 6);
    EXPECT_EQ(u.shard, u.index % 6);
    if (u.round == 0) {
      ASSERT_EQ(u.status, WorkUnitStatus::kAssigned) << u.index;
      EXPECT_GE(u.deadline_height, submit_height + genesis_.params.min_deadline_blocks);
      EXPECT_EQ(u.price, kTestPrice);
      per_node[u.assignee]++;
    } else {
      EXPECT_EQ(u.status, WorkUnitStatus::kPending);
    }
  }
  EXPECT_GT(per_node[n1_.public_key()], per_node[n2_.public_key()]);
  EXPECT_GT(per_node[n1_.public_key()], per_node[n3_.public_key()]);
  ASSERT_GE(per_node[n3_.public_key()], 1);  // the node that will be late
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseTraining);

  // ---- Commits: n1 and n2 commit (one by n1's own key); n3 stays silent. Foreign commits fail.
  std::vector<Transaction> txs;
  std::vector<uint32_t> late;  // n3's units
  bool self_signed = false;
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    if (u.assignee == n3_.public_key()) {
      late.push_back(u.index);
      continue;
    }
    if (u.assignee == n1_.public_key() && !self_signed) {
      txs.push_back(Q(n1_, Commit(u)));
      self_signed = true;
    } else {
      txs.push_back(OwnerCommit(u));
    }
  }
  const size_t good = txs.size();
  WorkUnit n3_unit = Units()[late[0]];
  CommitUnitTx foreign = Commit(n3_unit);
  foreign.node_id = n2_.public_key();  // bob claims n3's unit for his node
  txs.push_back(Q(bob_, foreign));
  txs.push_back(Q(dave_, Commit(n3_unit)));  // dave neither is nor owns n3
  std::vector<Receipt> r = Step(txs);
  for (size_t i = 0; i < good; ++i) EXPECT_TRUE(r[i].ok) << r[i].reason;
  EXPECT_FALSE(r[good].ok);
  EXPECT_NE(r[good].reason.find("not assigned to node"), std::string::npos) << r[good].reason;
  EXPECT_EQ(r[good + 1].code, StatusCode::kPermissionDenied) << r[good + 1].reason;
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    bool is_late = u.assignee == n3_.public_key();
    EXPECT_EQ(u.status, is_late ? WorkUnitStatus::kAssigned : WorkUnitStatus::kCommitted);
    if (!is_late) {
      EXPECT_EQ(u.result_hash, Blake2b("delta " + std::to_string(u.index)));
      EXPECT_EQ(u.commitment, Blake2b("root " + std::to_string(u.index)));
      EXPECT_EQ(u.loss_micros, 1000u + u.index);
    }
  }

  // ---- n3 misses its deadline: its units are reassigned to the others, its failures counted.
  const uint64_t deadline = n3_unit.deadline_height;
  while (chain_->Height() <= deadline) Step();
  for (uint32_t i : late) {
    WorkUnit u = Units()[i];
    EXPECT_EQ(u.status, WorkUnitStatus::kAssigned) << i;
    EXPECT_NE(u.assignee, n3_.public_key()) << i;
    EXPECT_GT(u.deadline_height, chain_->Height());
  }
  EXPECT_EQ(Node(n3_).reputation.failures, late.size());
  EXPECT_EQ(Node(n3_).reputation.clean_streak, 0u);
  EXPECT_EQ(Node(n1_).reputation.failures, 0u);

  // A late commit by n3 is refused; the new assignees commit.
  txs = {Q(carol_, Commit(n3_unit))};
  for (uint32_t i : late) txs.push_back(OwnerCommit(Units()[i]));
  r = Step(txs);
  EXPECT_FALSE(r[0].ok);
  for (size_t i = 1; i < r.size(); ++i) EXPECT_TRUE(r[i].ok) << r[i].reason;

  // ---- Every unit committed: an aggregator is assigned at the end of that block.
  RoundStateMachine m = Machine();
  EXPECT_EQ(m.phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_TRUE(m.aggregator().has_value());
  PublicKey agg0 = m.aggregator()->node;
  nlohmann::json j = TaskToJson(Task());
  EXPECT_EQ(j["phase"], "aggregating");
  EXPECT_EQ(j["round"], 0);
  EXPECT_EQ(j["aggregator"]["node"], agg0.ToHex());
  EXPECT_EQ(j["weights_history"].size(), 1u);
  EXPECT_EQ(j["weights_history"][0], TestTaskParams().initial_state.ToHex());
  EXPECT_EQ(j["params"]["units_per_round"], 6);

  // Snapshot balances before any payment.
  std::map<PublicKey, Amount> before;
  for (const KeyPair* k : {&alice_, &bob_, &carol_}) before[k->public_key()] = Balance(*k);
  Amount treasury_before = chain_->GetTotals().treasury;

  // Only the assigned aggregator may commit round 0.
  const KeyPair* other_owner = nullptr;
  PublicKey other_node;
  for (const KeyPair* n : {&n1_, &n2_, &n3_}) {
    if (n->public_key() != agg0) {
      other_node = n->public_key();
      other_owner = owner_.at(other_node);
      break;
    }
  }
  CommitAggregateTx agg{.task_id = task_id_,
                        .round = 0,
                        .node_id = other_node,
                        .state_hash = Blake2b("state 1"),
                        .test_accuracy_ppm = 700'000,
                        .test_loss_micros = 900'000};
  CommitAggregateTx wrong_round = agg;
  wrong_round.node_id = agg0;
  wrong_round.round = 1;
  CommitAggregateTx right = agg;
  right.node_id = agg0;
  r = Step({Q(*other_owner, agg), Q(*owner_.at(agg0), wrong_round), Q(*owner_.at(agg0), right)});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("not the aggregator"), std::string::npos) << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  ASSERT_TRUE(r[2].ok) << r[2].reason;

  // ---- Round 0 final and paid at once: 6 units + the aggregator, each kTestUnitCost, to owners.
  t = Task();
  EXPECT_EQ(t.rounds_settled, 1u);
  ASSERT_EQ(t.round_results.size(), 1u);
  EXPECT_EQ(t.round_results[0].state, Blake2b("state 1"));
  EXPECT_EQ(t.round_results[0].test_accuracy_ppm, 700'000u);
  EXPECT_EQ(t.round_results[0].aggregator, agg0);
  EXPECT_EQ(t.round_results[0].aggregator_paid, kTestUnitCost);
  EXPECT_EQ(t.spent, 7 * kTestUnitCost);
  EXPECT_EQ(t.escrow, kBudget - 7 * kTestUnitCost);
  const Amount cut = BasisPoints(kTestUnitCost, genesis_.params.treasury_cut_bps);
  std::map<PublicKey, Amount> expected = before;
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    EXPECT_EQ(u.status, WorkUnitStatus::kVerified) << u.index;
    EXPECT_EQ(u.paid, kTestUnitCost);
    EXPECT_NE(u.assignee, n3_.public_key());  // the late node is never paid for them
    expected[owner_.at(u.assignee)->public_key()] += kTestUnitCost - cut;
  }
  expected[owner_.at(agg0)->public_key()] += kTestUnitCost - cut;
  for (const KeyPair* k : {&alice_, &bob_, &carol_}) {
    EXPECT_EQ(Balance(*k), expected[k->public_key()]) << k->public_key().ShortHex();
  }
  EXPECT_EQ(chain_->GetTotals().treasury, treasury_before + 7 * cut);
  EXPECT_EQ(Node(n1_).reputation.units_completed + Node(n2_).reputation.units_completed, 6u);

  // ---- Round 1 trains from the new state; run it to the end.
  m = Machine();
  EXPECT_EQ(m.round(), 1u);
  EXPECT_EQ(m.round_weights(), Blake2b("state 1"));
  txs.clear();
  for (const WorkUnit& u : Units()) {
    if (u.round != 1) continue;
    ASSERT_EQ(u.status, WorkUnitStatus::kAssigned) << u.index;
    txs.push_back(OwnerCommit(u));
  }
  r = Step(txs);
  for (const Receipt& x : r) EXPECT_TRUE(x.ok) << x.reason;
  m = Machine();
  ASSERT_TRUE(m.aggregator().has_value());
  EXPECT_EQ(m.aggregator()->round, 1u);
  PublicKey agg1 = m.aggregator()->node;
  CommitAggregateTx last{.task_id = task_id_,
                         .round = 1,
                         .node_id = agg1,
                         .state_hash = Blake2b("state 2"),
                         .test_accuracy_ppm = 800'000,
                         .test_loss_micros = 600'000};
  r = Step({Q(*owner_.at(agg1), last)});
  ASSERT_TRUE(r[0].ok) << r[0].reason;

  // ---- Finished: final state recorded, the rest refunded to the submitter.
  t = Task();
  EXPECT_EQ(t.status, TaskStatus::kFinished);
  EXPECT_EQ(t.final_state, Blake2b("state 2"));
  EXPECT_EQ(t.rounds_settled, 2u);
  EXPECT_EQ(t.spent, 14 * kTestUnitCost);
  EXPECT_EQ(t.escrow, 0u);
  EXPECT_EQ(t.refunded, kBudget - 14 * kTestUnitCost);
  EXPECT_EQ(Balance(dave_), kFunds - 14 * kTestUnitCost);
  for (const WorkUnit& u : Units()) EXPECT_EQ(u.status, WorkUnitStatus::kVerified) << u.index;
  j = TaskToJson(t);
  EXPECT_EQ(j["phase"], "final");
  EXPECT_EQ(j["round"], 2);
  EXPECT_EQ(j["weights_history"].size(), 3u);
  EXPECT_EQ(j["final_state"], Blake2b("state 2").ToHex());
  EXPECT_EQ(j["round_results"].size(), 2u);
  EXPECT_EQ(j["round_results"][1]["test_accuracy_ppm"], 800'000);

  // A commit after the end is refused; later blocks leave the finished task alone.
  r = Step({Q(*owner_.at(agg1), last)});
  EXPECT_FALSE(r[0].ok);
  Hash256 before_empty = Task().runtime.empty() ? Hash256{} : Blake2b(Task().runtime);
  Step();
  EXPECT_EQ(Blake2b(Task().runtime), before_empty);

  Hash256 replayed;
  Status s = chain_->ReplayFromGenesis(&replayed);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(replayed, chain_->StateHash());
  // The records survive a restart.
  Reopen();
  EXPECT_EQ(Task().final_state, Blake2b("state 2"));
}

TEST_F(NetworkTest, ABudgetBelowTheMostTheTaskCanCostIsRefused) {
  // 2 rounds x (6 units + 1 aggregation) x 32 GFLOP x price cap 20 = 8960 tokens.
  constexpr Amount kMost = 2 * 7 * 32 * 20;
  Amount before = Balance(dave_);
  Receipt r = Start(kMost - 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("raise budget or lower price_cap"), std::string::npos) << r.reason;
  EXPECT_EQ(Balance(dave_), before);
  EXPECT_FALSE(chain_->GetTask(task_id_).ok());
  Transaction again = Q(dave_, Submit(kMost));
  task_id_ = TaskIdFor(dave_.public_key(), again.nonce);
  Receipt ok = Step({again})[0];
  EXPECT_TRUE(ok.ok) << ok.reason;
  EXPECT_EQ(Task().escrow, kMost);
}

TEST_F(NetworkTest, CancelPaysTheCommittedUnitsFirst) {
  ASSERT_TRUE(Start(100'000).ok);
  std::vector<Transaction> txs;
  const WorkUnit first = Units().front();
  txs.push_back(OwnerCommit(first));
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  std::vector<Receipt> r = Step({Q(dave_, CancelTaskTx{.task_id = task_id_})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  TaskRecord t = Task();
  EXPECT_EQ(t.status, TaskStatus::kCancelled);
  Amount paid = 0;
  for (const WorkUnit& u : Units()) {
    if (u.index == first.index) {
      EXPECT_EQ(u.status, WorkUnitStatus::kVerified);
      EXPECT_EQ(u.paid, kTestUnitCost);
    } else {
      EXPECT_EQ(u.paid, 0u);
    }
    paid += u.paid;
  }
  EXPECT_EQ(t.spent, paid);
  EXPECT_EQ(t.escrow, 0u);
  EXPECT_EQ(t.refunded, 100'000 - paid);
  EXPECT_TRUE(chain_->CheckInvariants().ok());
}

TEST_F(NetworkTest, AnUnavailableDeltaRerunsTheRoundWithoutItsSolver) {
  ASSERT_TRUE(Start(100'000).ok);
  std::vector<Transaction> txs;
  for (const WorkUnit& u : Units()) {
    if (u.round == 0) txs.push_back(OwnerCommit(u));
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  RoundStateMachine m = Machine();
  ASSERT_EQ(m.phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_TRUE(m.aggregator().has_value());
  const PublicKey agg = m.aggregator()->node;
  const WorkUnit lost = Units().front();
  const PublicKey solver = lost.assignee;
  const uint64_t failures = chain_->GetNode(solver).value().reputation.failures;
  PublicKey other_node;
  for (const KeyPair* k : {&n1_, &n2_, &n3_}) {
    if (k->public_key() != agg) other_node = k->public_key();
  }
  const WorkUnit round1 = Units().back();
  std::vector<Receipt> r = Step({
      // Only the assigned aggregator may report...
      Q(*owner_.at(other_node),
        ReportUnavailableTx{.task_id = task_id_, .index = lost.index, .node_id = other_node}),
      // ... and only a unit of the round it aggregates.
      Q(*owner_.at(agg),
        ReportUnavailableTx{.task_id = task_id_, .index = round1.index, .node_id = agg}),
  });
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("not the assigned aggregator"), std::string::npos) << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  r = Step({Q(*owner_.at(agg),
              ReportUnavailableTx{.task_id = task_id_, .index = lost.index, .node_id = agg})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_EQ(chain_->GetNode(solver).value().reputation.failures, failures + 1);
  // The round runs again from the same weights; the solver gets none of its units.
  m = Machine();
  EXPECT_EQ(m.round(), 0u);
  EXPECT_NE(m.phase(), RoundPhase::kRoundPhaseAggregating);
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    EXPECT_NE(u.status, WorkUnitStatus::kCommitted);
    EXPECT_EQ(u.paid, 0u);
    EXPECT_NE(u.assignee, solver) << "unit " << u.index;
  }
  // The rest of the task completes and the books balance.
  for (int i = 0; i < 20 && Task().status == TaskStatus::kOpen; ++i) {
    std::vector<Transaction> more;
    for (const WorkUnit& u : Units()) {
      if (u.status == WorkUnitStatus::kAssigned) more.push_back(OwnerCommit(u));
    }
    RoundStateMachine mm = Machine();
    if (mm.aggregator().has_value() && mm.phase() == RoundPhase::kRoundPhaseAggregating) {
      PublicKey a = mm.aggregator()->node;
      more.push_back(Q(*owner_.at(a),
                       CommitAggregateTx{.task_id = task_id_,
                                         .round = mm.round(),
                                         .node_id = a,
                                         .state_hash = Blake2b("s" + std::to_string(mm.round()))}));
    }
    Step(more);
  }
  EXPECT_EQ(Task().status, TaskStatus::kFinished);
  for (const WorkUnit& u : Units()) {
    if (u.round == 0) {
      EXPECT_NE(u.assignee, solver);
    }
  }
  EXPECT_TRUE(chain_->CheckInvariants().ok());
  EXPECT_TRUE(chain_->ReplayFromGenesis().ok());
}

TEST_F(NetworkTest, AnAccuracyOver100PercentIsRefused) {
  ASSERT_TRUE(Start(100'000).ok);
  std::vector<Transaction> txs;
  for (const WorkUnit& u : Units()) {
    if (u.round == 0) txs.push_back(OwnerCommit(u));
  }
  for (const Receipt& x : Step(txs)) EXPECT_TRUE(x.ok) << x.reason;
  ASSERT_TRUE(Machine().aggregator().has_value());
  PublicKey agg = Machine().aggregator()->node;
  CommitAggregateTx c{.task_id = task_id_,
                      .round = 0,
                      .node_id = agg,
                      .state_hash = Blake2b("s1"),
                      .test_accuracy_ppm = 1'000'001};
  std::vector<Receipt> r = Step({Q(*owner_.at(agg), c)});
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("test_accuracy_ppm"), std::string::npos) << r[0].reason;
  EXPECT_TRUE(Task().round_results.empty());
  c.test_accuracy_ppm = 1'000'000;
  r = Step({Q(*owner_.at(agg), c)});
  EXPECT_TRUE(r[0].ok) << r[0].reason;
}

TEST_F(NetworkTest, CancelStopsTheTask) {
  ASSERT_TRUE(Start(50'000).ok);
  std::vector<Receipt> r = Step({Q(dave_, CancelTaskTx{.task_id = task_id_})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_EQ(Balance(dave_), kFunds);
  for (const WorkUnit& u : Units()) EXPECT_EQ(u.status, WorkUnitStatus::kCancelled);
  WorkUnit u = Units()[0];
  r = Step({OwnerCommit(u)});
  EXPECT_FALSE(r[0].ok);
  Step();
  EXPECT_TRUE(chain_->ReplayFromGenesis().ok());
}

// A unit every eligible solver let expire once excludes them all; it used to stay pending
// forever (a devnet's redo hung so after commits refused for a stale secret index). They are
// forgiven: the unit is offered to them again, and the expiry stays on their record.
TEST_F(NetworkTest, AUnitEverySolverLetExpireIsOfferedToThemAgain) {
  ASSERT_TRUE(Step({Q(alice_, Reg(n1_, 1'000'000'000'000))})[0].ok);
  Transaction submit = Q(dave_, Submit(10'000));
  task_id_ = TaskIdFor(dave_.public_key(), submit.nonce);
  ASSERT_TRUE(Step({submit})[0].ok);
  uint64_t first_deadline = 0;
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    ASSERT_EQ(u.status, WorkUnitStatus::kAssigned) << u.index;
    first_deadline = std::max(first_deadline, u.deadline_height);
  }
  // n1 commits nothing: every unit expires, and n1 is the only solver there is.
  while (chain_->Height() <= first_deadline + 2) Step();
  EXPECT_GT(Node(n1_).reputation.failures, 0u);
  for (const WorkUnit& u : Units()) {
    if (u.round != 0) continue;
    EXPECT_EQ(u.status, WorkUnitStatus::kAssigned) << u.index;
    EXPECT_EQ(u.assignee, n1_.public_key()) << u.index;
    EXPECT_GT(u.deadline_height, first_deadline) << u.index;
  }
}

// The same for a round's aggregation: when the only node able to aggregate lets it expire, the
// round used to wait forever in the aggregating phase (a devnet's 10M GPT pipeline task stalled
// so: no stage node holds the whole model). It is offered the aggregation again, with the expiry
// on its record, and the round finishes.
TEST_F(NetworkTest, AnAggregationEveryAggregatorLetExpireIsOfferedToThemAgain) {
  ASSERT_TRUE(Step({Q(alice_, Reg(n1_, 1'000'000'000'000))})[0].ok);
  Transaction submit = Q(dave_, Submit(10'000));
  task_id_ = TaskIdFor(dave_.public_key(), submit.nonce);
  ASSERT_TRUE(Step({submit})[0].ok);
  std::vector<Transaction> commits;
  for (const WorkUnit& u : Units()) {
    if (u.round == 0) commits.push_back(OwnerCommit(u));
  }
  for (const Receipt& x : Step(commits)) ASSERT_TRUE(x.ok) << x.reason;
  ASSERT_TRUE(Machine().aggregator().has_value());
  ASSERT_EQ(Machine().aggregator()->node, n1_.public_key());
  const uint64_t first_deadline = Machine().aggregator()->deadline_height;
  const uint32_t failures = Node(n1_).reputation.failures;
  // n1 aggregates nothing: the aggregation expires, and n1 is the only aggregator there is.
  while (chain_->Height() <= first_deadline + 2) Step();
  EXPECT_EQ(Node(n1_).reputation.failures, failures + 1);
  RoundStateMachine m = Machine();
  EXPECT_EQ(m.phase(), RoundPhase::kRoundPhaseAggregating);
  ASSERT_TRUE(m.aggregator().has_value()) << "the round waits for an aggregator forever";
  EXPECT_EQ(m.aggregator()->node, n1_.public_key());
  EXPECT_GT(m.aggregator()->deadline_height, first_deadline);
  std::vector<Receipt> r =
      Step({Q(*owner_.at(n1_.public_key()), CommitAggregateTx{.task_id = task_id_,
                                                              .round = 0,
                                                              .node_id = n1_.public_key(),
                                                              .state_hash = Blake2b("s1")})});
  ASSERT_TRUE(r[0].ok) << r[0].reason;
  ASSERT_EQ(Task().round_results.size(), 1u);
  EXPECT_EQ(Task().round_results[0].aggregator, n1_.public_key());
  EXPECT_TRUE(chain_->CheckInvariants().ok());
  EXPECT_TRUE(chain_->ReplayFromGenesis().ok());
}

TEST_F(NetworkTest, NoEligibleNodeLeavesUnitsPending) {
  // The task's price cap is below every node's price: nothing is assigned, nothing is paid.
  ASSERT_TRUE(Step({Q(alice_, Reg(n1_, 1'000'000'000'000))})[0].ok);
  SubmitTaskTx s = Submit(10'000);
  s.price_cap = kTestPrice - 1;
  Transaction submit = Q(dave_, s);
  task_id_ = TaskIdFor(dave_.public_key(), submit.nonce);
  ASSERT_TRUE(Step({submit})[0].ok);
  Step();
  for (const WorkUnit& u : Units()) EXPECT_EQ(u.status, WorkUnitStatus::kPending);
  EXPECT_EQ(Machine().phase(), RoundPhase::kRoundPhaseAssigning);
  EXPECT_EQ(Task().escrow, 10'000u);
}

TEST_F(NetworkTest, BadSubmitParamsAreRefusedWithNoStateChange) {
  struct Case {
    const char* name;
    std::function<void(SubmitTaskTx&)> edit;
    const char* expect;  // in the reason
  };
  std::vector<Case> cases = {
      {"rounds 0", [](SubmitTaskTx& s) { s.params.rounds = 0; }, "rounds"},
      {"units 0", [](SubmitTaskTx& s) { s.params.units_per_round = 0; }, "units_per_round"},
      {"inner steps 0", [](SubmitTaskTx& s) { s.params.inner_steps = 0; }, "inner_steps"},
      {"batch 0", [](SubmitTaskTx& s) { s.params.batch_size = 0; }, "batch_size"},
      {"examples 0", [](SubmitTaskTx& s) { s.params.num_examples = 0; }, "examples"},
      {"fewer examples than shards", [](SubmitTaskTx& s) { s.params.num_examples = 5; },
       "examples"},
      {"model 0", [](SubmitTaskTx& s) { s.params.model_bytes = 0; }, "model_bytes"},
      {"model not float32", [](SubmitTaskTx& s) { s.params.model_bytes = 4001; }, "model_bytes"},
      {"flops 0", [](SubmitTaskTx& s) { s.params.flops_per_sample = 0; }, "flops_per_sample"},
      {"price cap 0", [](SubmitTaskTx& s) { s.price_cap = 0; }, "price_cap"},
      {"no initial state", [](SubmitTaskTx& s) { s.params.initial_state = Hash256{}; },
       "initial_state"},
      {"too many units",
       [](SubmitTaskTx& s) {
         s.params.rounds = 1000;
         s.params.units_per_round = 101;
         s.params.num_examples = 1'000'000;
       },
       "100000"},
      {"checkpoint 0", [](SubmitTaskTx& s) { s.params.checkpoint_interval = 0; },
       "checkpoint_interval"},
      {"checkpoint > steps", [](SubmitTaskTx& s) { s.params.checkpoint_interval = 5; },
       "checkpoint_interval"},
      {"no spec", [](SubmitTaskTx& s) { s.spec_hash = Hash256{}; }, "spec_hash"},
      {"budget 0", [](SubmitTaskTx& s) { s.budget = 0; }, "budget"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SubmitTaskTx s = Submit(1000);
    c.edit(s);
    Totals totals = chain_->GetTotals();
    Receipt r = Step({Q(dave_, s)})[0];
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.code, StatusCode::kInvalidArgument) << r.reason;
    EXPECT_NE(r.reason.find(c.expect), std::string::npos) << r.reason;
    EXPECT_EQ(chain_->GetTotals(), totals);
    EXPECT_EQ(Balance(dave_), kFunds);
  }
  EXPECT_TRUE(chain_->ListTasks(0, 10).empty());
  EXPECT_TRUE(chain_->ReplayFromGenesis().ok());
}

TEST_F(NetworkTest, GenesisSchedulerKnobsRoundTrip) {
  Genesis g = DevnetGenesis({alice_.public_key()}, 5);
  EXPECT_EQ(g.params.liveness_blocks, 60u);
  EXPECT_EQ(g.params.deadline_slack_permille, 6000u);
  EXPECT_EQ(g.params.min_deadline_blocks, 20u);
  auto back = ParseGenesis(GenesisToToml(g));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  EXPECT_EQ(GenesisHash(*back), GenesisHash(g));
  Genesis other = g;
  other.params.min_deadline_blocks = 21;
  EXPECT_NE(GenesisHash(other), GenesisHash(g));
  EXPECT_EQ(GenesisToJson(g)["params"]["deadline_slack_permille"], 6000);
  other.params.deadline_slack_permille = 999;
  EXPECT_FALSE(ValidateGenesis(other).ok());
}

}  // namespace
}  // namespace meshlearn::ledger
