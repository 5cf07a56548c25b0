// SubmitTask, CancelTask, and the escrow / work-unit primitives.
#include "execute.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::ChainFixture;
using testing::TestKey;

class TasksTest : public ChainFixture {
 protected:
  SubmitTaskTx Submit(Amount budget) {
    return SubmitTaskTx{
        .spec_hash = Blake2b("spec"), .budget = budget, .price_cap = 10, .memo = "mnist",
        .params = testing::TestTaskParams()};
  }
};

TEST_F(TasksTest, SubmitEscrowsBudget) {
  Transaction tx = Tx(alice_, Submit(5000));
  Hash256 id = TaskIdFor(alice_.public_key(), tx.nonce);
  Receipt r = Run(tx);
  ASSERT_TRUE(r.ok) << r.reason;
  auto t = chain_->GetTask(id);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->escrow, 5000u);
  EXPECT_EQ(t->status, TaskStatus::kOpen);
  EXPECT_EQ(t->memo, "mnist");
  EXPECT_EQ(Balance(alice_), kFunds - 5000);
  EXPECT_EQ(chain_->GetTotals().escrow, 5000u);
  EXPECT_EQ(chain_->ListTasks(0, 10).size(), 1u);
}

TEST_F(TasksTest, SubmitFailures) {
  Receipt r = Run(Tx(alice_, Submit(kFunds + 1)));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("insufficient funds"), std::string::npos);
  r = Run(Tx(alice_, Submit(UINT64_MAX)));
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(Run(Tx(alice_, Submit(0))).ok);
  SubmitTaskTx s = Submit(100);
  s.spec_hash = Hash256{};
  EXPECT_FALSE(Run(Tx(alice_, s)).ok);
  s = Submit(100);
  s.price_cap = 0;
  EXPECT_FALSE(Run(Tx(alice_, s)).ok);
  EXPECT_EQ(Balance(alice_), kFunds);
  EXPECT_TRUE(chain_->ListTasks(0, 10).empty());
}

// Regression: a client could not run SubmitTask's checks before publishing (a task file without
// checkpoint_interval passed `task submit --dry-run`, then SubmitTask refused k = 0). The checks
// are one function, ValidateTaskTerms, which names the fields as its caller's user knows them.
TEST_F(TasksTest, ValidateTaskTermsIsWhatSubmitTaskChecks) {
  SubmitTaskTx s = Submit(5000);
  s.params.checkpoint_interval = 0;
  const Status terms = ValidateTaskTerms(s.params, s.budget, s.price_cap, true, 1);
  ASSERT_FALSE(terms.ok());
  EXPECT_NE(terms.message().find("params.checkpoint_interval must be in [1, params.inner_steps = "),
            std::string::npos)
      << terms.message();
  Receipt r = Run(Tx(alice_, s));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, "submit task: " + terms.message());

  auto file_key = [](std::string_view f) { return "network." + std::string(f); };
  const Status named = ValidateTaskTerms(s.params, s.budget, s.price_cap, true, 1, file_key);
  EXPECT_NE(named.message().find("network.checkpoint_interval must be in [1, "
                                 "network.inner_steps = "),
            std::string::npos)
      << named.message();

  // The budget check depends on the chain's verifiers per unit, as SubmitTask's does.
  SubmitTaskTx ok = Submit(5000);
  Amount unit = 0;
  const Amount most = MaxTaskCost(ok.params, ok.price_cap, &unit, 1);
  EXPECT_TRUE(ValidateTaskTerms(ok.params, most, ok.price_cap, true, 1).ok());
  const Status low = ValidateTaskTerms(ok.params, most - 1, ok.price_cap, true, 1, file_key);
  ASSERT_FALSE(low.ok());
  EXPECT_NE(low.message().find("network.budget = " + std::to_string(most - 1) +
                               " is below the most this task can cost, " + std::to_string(most)),
            std::string::npos)
      << low.message();
  EXPECT_TRUE(ValidateTaskTerms(ok.params, MaxTaskCost(ok.params, ok.price_cap, nullptr, 0),
                                ok.price_cap, false, 1)
                  .ok());
}

// The ledger rules an exact-mode task's disputes from batches proven against its data root, so a
// verifying chain refuses one without a root, naming the fields as the caller knows them (the
// genesis key rules no exact-mode dispute for want of a root). A tolerance-mode task, and any task
// on a chain that does not verify, may still come without one.
TEST_F(TasksTest, AnExactModeTaskOnAVerifyingChainNeedsADataRoot) {
  SubmitTaskTx s = Submit(5000);
  s.params.data_root = Hash256{};
  Receipt r = Run(Tx(alice_, s));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason,
            "submit task: params.data_root is zero: an exact-mode task "
            "(params.tolerance_rel_l2_ppm and params.tolerance_cosine_gap_ppb both 0) "
            "on a verifying chain has its disputes ruled by the ledger against its data "
            "root; declare data_root, the Merkle root over the task's examples/token "
            "pages; `meshlearn task submit` computes it from the bundle's data");
  auto file_key = [](std::string_view f) { return "network." + std::string(f); };
  const Status named = ValidateTaskTerms(s.params, s.budget, s.price_cap, true, 1, file_key);
  EXPECT_NE(named.message().find("network.data_root is zero: an exact-mode task "
                                 "(network.tolerance_rel_l2_ppm and "
                                 "network.tolerance_cosine_gap_ppb both 0)"),
            std::string::npos)
      << named.message();
  EXPECT_TRUE(ValidateTaskTerms(s.params, s.budget, s.price_cap, false, 1).ok());
  s.params.tolerance_rel_l2_ppm = 100;
  EXPECT_TRUE(ValidateTaskTerms(s.params, s.budget, s.price_cap, true, 1).ok());
  EXPECT_TRUE(Run(Tx(alice_, s)).ok);
}

// A data root is over examples (data_page_tokens 0) or over a token task's pages of 1024 tokens
// (engine::TokenPageTree); any other page size, or pages without a root, is refused by name.
TEST_F(TasksTest, DataPageTokensIsZeroOrTheEnginesPageWithARoot) {
  SubmitTaskTx s = Submit(5000);
  s.params.data_page_tokens = 1024;
  s.params.data_root = Hash256{};
  Receipt r = Run(Tx(alice_, s));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("params.data_page_tokens must be 0"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("no data_root"), std::string::npos) << r.reason;
  s.params.data_root = Blake2b("pages");
  s.params.data_page_tokens = 512;
  r = Run(Tx(alice_, s));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("got 512"), std::string::npos) << r.reason;
  s.params.data_page_tokens = 1024;
  r = Run(Tx(alice_, s));
  ASSERT_TRUE(r.ok) << r.reason;
  EXPECT_EQ(chain_->ListTasks(0, 10).at(0).params.data_page_tokens, 1024u);
}

TEST_F(TasksTest, CancelRefundsUnspent) {
  Transaction tx = Tx(alice_, Submit(5000));
  Hash256 id = TaskIdFor(alice_.public_key(), tx.nonce);
  ASSERT_TRUE(Run(tx).ok);
  EXPECT_EQ(Run(Tx(bob_, CancelTaskTx{.task_id = id})).code, StatusCode::kPermissionDenied);
  EXPECT_EQ(Run(Tx(alice_, CancelTaskTx{.task_id = Blake2b("nope")})).code, StatusCode::kNotFound);
  Receipt r = Run(Tx(alice_, CancelTaskTx{.task_id = id}));
  ASSERT_TRUE(r.ok) << r.reason;
  auto t = chain_->GetTask(id);
  EXPECT_EQ(t->status, TaskStatus::kCancelled);
  EXPECT_EQ(t->escrow, 0u);
  EXPECT_EQ(t->refunded, 5000u);
  EXPECT_EQ(Balance(alice_), kFunds);
  r = Run(Tx(alice_, CancelTaskTx{.task_id = id}));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.reason.find("cancelled"), std::string::npos) << r.reason;
}

// The work-unit lifecycle on a bare state, as the network issue will drive it.
TEST(TaskPrimitivesTest, WorkUnitLifecyclePaysAndKeepsBooks) {
  KeyPair submitter = TestKey(80), owner = TestKey(81), node = TestKey(82);
  Genesis g = DevnetGenesis({submitter.public_key(), owner.public_key()}, 10'000, "prim");
  g.params.verification = false;  // settling credits the streak itself (no checks)
  g.params.treasury_cut_bps = 1000;  // 10%
  LedgerState s = LedgerState::FromGenesis(g);
  NodeRecord n;
  n.id = node.public_key();
  n.owner = owner.public_key();
  n.roles = kRoleSolver;
  s.nodes.Put(n.id, n);
  Hash256 id = TaskIdFor(submitter.public_key(), 0);
  TaskRecord t;
  t.id = id;
  t.submitter = submitter.public_key();
  t.budget = t.escrow = 1000;
  t.price_cap = 300;  // per GFLOP; one unit here is 1 GFLOP, so a unit costs at most 300
  t.params = testing::TestTaskParams();
  t.params.inner_steps = 1;
  t.params.batch_size = 1;
  t.params.checkpoint_interval = 1;
  s.tasks.Put(id, t);
  ASSERT_TRUE(Debit(s, submitter.public_key(), 1000, "budget").ok());
  ASSERT_TRUE(s.ComputeTotals().Check().ok());

  uint32_t u0 = 99, u1 = 99;
  ASSERT_TRUE(AddWorkUnit(s, id, &u0).ok());
  ASSERT_TRUE(AddWorkUnit(s, id, &u1).ok());
  EXPECT_EQ(u0, 0u);
  EXPECT_EQ(u1, 1u);
  EXPECT_FALSE(CommitWorkUnit(s, id, u0, Blake2b("r")).ok());  // not assigned
  ASSERT_TRUE(AssignWorkUnit(s, id, u0, node.public_key(), 50).ok());
  ASSERT_TRUE(AssignWorkUnit(s, id, u1, node.public_key(), 50).ok());
  EXPECT_FALSE(AssignWorkUnit(s, id, u0, node.public_key(), 50).ok());  // already assigned
  ASSERT_TRUE(CommitWorkUnit(s, id, u0, Blake2b("r")).ok());
  EXPECT_FALSE(SettleWorkUnit(s, g.params, id, u0, 301).ok());  // over the price cap
  ASSERT_TRUE(SettleWorkUnit(s, g.params, id, u0, 200).ok());
  EXPECT_EQ(s.accounts.Find(owner.public_key())->balance, 10'000u + 180);
  EXPECT_EQ(s.g().treasury, 20u);
  EXPECT_EQ(s.tasks.Find(id)->escrow, 800u);
  EXPECT_EQ(s.tasks.Find(id)->spent, 200u);
  // The task keeps what the treasury took of its payments: spent - treasury_cut is what the
  // nodes' owners received.
  EXPECT_EQ(s.tasks.Find(id)->treasury_cut, 20u);
  EXPECT_EQ(TaskToJson(*s.tasks.Find(id))["treasury_cut"], 20u);
  EXPECT_EQ(s.nodes.Find(node.public_key())->reputation.clean_streak, 1u);
  ASSERT_TRUE(s.ComputeTotals().Check().ok());

  ASSERT_TRUE(FailWorkUnit(s, id, u1).ok());
  EXPECT_EQ(s.nodes.Find(node.public_key())->reputation.failures, 1u);
  EXPECT_EQ(s.nodes.Find(node.public_key())->reputation.clean_streak, 0u);

  ASSERT_TRUE(CloseTask(s, id, TaskStatus::kFinished, 7).ok());
  EXPECT_EQ(s.tasks.Find(id)->closed_height, 7u);
  EXPECT_EQ(s.accounts.Find(submitter.public_key())->balance, 10'000u - 200);
  EXPECT_EQ(s.tasks.Find(id)->refunded, 800u);
  EXPECT_FALSE(PayFromEscrow(s, g.params, id, owner.public_key(), 1).ok());  // closed
  EXPECT_FALSE(AddWorkUnit(s, id, &u0).ok());
  ASSERT_TRUE(s.ComputeTotals().Check().ok());
}

TEST(TaskPrimitivesTest, EscrowCannotGoNegative) {
  KeyPair submitter = TestKey(80);
  Genesis g = DevnetGenesis({submitter.public_key()}, 100, "prim");
  LedgerState s = LedgerState::FromGenesis(g);
  Hash256 id = TaskIdFor(submitter.public_key(), 0);
  TaskRecord t;
  t.id = id;
  t.submitter = submitter.public_key();
  t.budget = t.escrow = 50;
  s.tasks.Put(id, t);
  ASSERT_TRUE(Debit(s, submitter.public_key(), 50, "budget").ok());
  EXPECT_FALSE(PayFromEscrow(s, g.params, id, submitter.public_key(), 51).ok());
  EXPECT_TRUE(PayFromEscrow(s, g.params, id, submitter.public_key(), 50).ok());
  EXPECT_TRUE(s.ComputeTotals().Check().ok());
}

}  // namespace
}  // namespace meshlearn::ledger
