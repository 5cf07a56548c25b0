// Forced errors for pipeline stage units on the ledger (docs/verification.md, "Forced errors for
// stage units"): a stage unit is drawn as a unit is, commits its real step commits with the unit's
// forced state chain (protocol::ForceStageStepStates), and reveals those commits with its secret
// (RevealSecretTx::forced_commits), which the ledger checks. Checked against a follower after
// every block (FollowedChainFixture).
#include <algorithm>
#include <string>
#include <vector>

#include "execute.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using pipeline_testing::kGiB;
using pipeline_testing::kStages;
using protocol::CheckStage;
using protocol::StageStepCommit;

// Every stage unit is drawn (the rate is one in one), and two verifiers outside the replica check
// each: verifier_ and catcher_.
class ForcedStageTest : public pipeline_testing::PipelineVerificationTest {
 protected:
  ForcedStageTest() : catcher_(TestKey(42)) {
    genesis_.params.forced_error_per_million = 1'000'000;
    genesis_.params.verifiers_per_unit = 2;
    checkers_.insert(catcher_.public_key());  // carol's, as the verifier
  }

  // The catcher registers before the task is placed: it verifies only (no stage fits its memory).
  void StartWithCatcher() {
    StepOk({Q(alice_, Reg(catcher_, kRoleVerifier | kRoleWhistleblower, kGiB / 2))});
    Start();
  }

  // The secret unit `index`'s commit will bind (its node's next one) and the unit it names.
  Hash256 NextSecret(uint32_t index) {
    const WorkUnit u = Unit(index);
    return Secret(u.assignee, Node(u.assignee).secrets_committed + 1);
  }
  protocol::UnitId UnitIdOf(uint32_t index) {
    const WorkUnit u = Unit(index);
    return protocol::UnitId{task_id_, u.round, u.shard};
  }

  // Stage unit `index`'s H step commits as it trained them (round 0, replica 0: the states a
  // stand-in for its real ones; no records, which the forced form keeps as they are whatever they
  // are), and in the forced form when `forced`, with the secret its commit binds.
  std::vector<StageStepCommit> Commits(uint32_t index, bool forced) {
    std::vector<StageStepCommit> out;
    auto state = [&](uint64_t k) {
      return Hasher("true stage state").UpdateU64(index).UpdateU64(k).Finish();
    };
    for (uint64_t j = 0; j < kSteps; ++j) {
      out.push_back(StageStepCommit{.task = task_id_,
                                    .round = 0,
                                    .replica = index / kStages,
                                    .stage = index % kStages,
                                    .stages = kStages,
                                    .step = j,
                                    .state_before = state(j),
                                    .state_after = state(j + 1)});
    }
    if (forced) protocol::ForceStageStepStates(NextSecret(index), UnitIdOf(index), out);
    return out;
  }
  static std::vector<Hash256> LeavesOf(const std::vector<StageStepCommit>& commits) {
    std::vector<Hash256> leaves;
    for (const StageStepCommit& c : commits) leaves.push_back(protocol::StageStepLeaf(c));
    return leaves;
  }

  // Stage unit `index`'s RevealSecret carrying `forced_commits`.
  Transaction ForcedSecretTx(uint32_t index, Bytes forced_commits) {
    const WorkUnit u = Unit(index);
    return Q(alice_, RevealSecretTx{.task_id = task_id_,
                                    .index = index,
                                    .node_id = u.assignee,
                                    .secret = Secret(u.assignee, u.secret_index),
                                    .forced_commits = {std::move(forced_commits)}});
  }

  // Sends `txs` in one block: the first `refusals.size()` must be refused, each naming its text;
  // the rest accepted. (The reveal window is short: the bad reveals go in the good ones' block.)
  void StepRefusingFirst(const std::vector<std::pair<Transaction, std::string>>& refusals,
                         std::vector<Transaction> good) {
    std::vector<Transaction> txs;
    for (const auto& [tx, why] : refusals) txs.push_back(tx);
    txs.insert(txs.end(), good.begin(), good.end());
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
  }

  KeyPair catcher_;
};

// One stage unit in three drawn: with the test's keys, stage 1 alone (of the first replica).
// (333'347 since RegisterNode gained capabilities.disk_bytes, 2026-12-06: its bytes moved the
// beacons, and 333'339 drew stage 0 too.)
class ForcedStageOneDrawnTest : public ForcedStageTest {
 protected:
  static constexpr uint32_t kOneDrawnRate = 333'347;
  ForcedStageOneDrawnTest() { genesis_.params.forced_error_per_million = kOneDrawnRate; }
};

// The drawn stage 1 commits the forced form; the catcher finds it at step 0 (its replay of the
// real checkpoint ends at the real state, not the forced one) and verifier_ rubber-stamps it.
// Every malformed reveal is refused by name; the good one settles the check as a forced error:
// the rubber stamp slashed, the catcher paid from the jackpot, the stage not punished. Its replica
// re-runs whole, placed again in the block its siblings' clean checks settle (RerunForcedReplicas
// waits for them): the replica's other stages, committed, are paid their whole
// StageUnitCost for the work discarded, the drawn stage nothing (its re-run is paid, with its next
// secret), and every check of the replica goes.
TEST_F(ForcedStageOneDrawnTest, ADrawnStagesForcedFormCatchesTheRubberStampAndItsReplicaReruns) {
  StartWithCatcher();
  constexpr uint32_t kDrawn = 1;
  std::vector<PublicKey> first_run;
  std::vector<std::vector<StageStepCommit>> commits;
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) {
    ASSERT_EQ(Unit(st).status, WorkUnitStatus::kAssigned) << st;
    first_run.push_back(Unit(st).assignee);
    ASSERT_EQ(protocol::IsForcedError(NextSecret(st), Unit(st).assignment_beacon, UnitIdOf(st),
                                      kOneDrawnRate),
              st == kDrawn)
        << "stage " << st << ": pick another kOneDrawnRate that draws stage 1 alone";
    commits.push_back(Commits(st, /*forced=*/st == kDrawn));
    txs.push_back(Q(alice_, Commit(st, LeavesOf(commits.back()))));
  }
  EXPECT_EQ(commits[kDrawn][0].state_before, Commits(kDrawn, false)[0].state_before)
      << "step 0 starts at the true start";
  StepOk(txs);
  EXPECT_EQ(Check(kDrawn).config().forced_error_per_million, kOneDrawnRate);
  StepUntil(kDrawn, CheckStage::kCheckCommitVerdicts);
  const protocol::UnitCheck check = Check(kDrawn);
  ASSERT_EQ(check.verifiers().size(), 2u);
  for (const PublicKey& v : check.verifiers()) {
    EXPECT_TRUE(v == verifier_.public_key() || v == catcher_.public_key()) << v.ShortHex();
  }
  const std::vector<Hash256> leaves = LeavesOf(commits[kDrawn]);
  const Sealed stamp = Clean(kDrawn);
  Sealed caught = Mismatch(kDrawn, leaves, 0, Commits(kDrawn, false)[0].state_after);
  caught.salt = Blake2b("catcher's salt");
  // Its siblings, not drawn, are verified clean by both: their checks settle clean.
  std::vector<Transaction> sibling_seals;
  std::vector<std::pair<uint32_t, Sealed>> sibling_verdicts;
  for (uint32_t st = 0; st < kStages; ++st) {
    if (st == kDrawn) continue;
    Sealed by_catcher = Clean(st);
    by_catcher.salt = Blake2b("catcher's salt");
    sibling_seals.push_back(SealTx(st, Clean(st)));
    sibling_seals.push_back(SealTx(st, by_catcher, &catcher_));
    sibling_verdicts.emplace_back(st, by_catcher);
  }
  sibling_seals.push_back(SealTx(kDrawn, stamp));
  sibling_seals.push_back(SealTx(kDrawn, caught, &catcher_));
  StepOk(sibling_seals);
  StepUntil(kDrawn, CheckStage::kCheckRevealVerdicts);

  std::vector<StageStepCommit> short_list = commits[kDrawn];
  short_list.pop_back();
  std::vector<StageStepCommit> real = Commits(kDrawn, /*forced=*/false);
  Bytes garbage = protocol::EncodeStageStepCommits(commits[kDrawn]);
  garbage.resize(garbage.size() - 3);
  const std::string unit = "unit 1 of task " + task_id_.ShortHex();
  std::vector<std::pair<Transaction, std::string>> refusals = {
      {ForcedSecretTx(kDrawn, {}),
       "reveal secret: " + unit +
           " is a stage drawn for a forced error by this secret; forced_commits must carry its 4 "
           "step commits"},
      {ForcedSecretTx(kDrawn, protocol::EncodeStageStepCommits(short_list)),
       "reveal secret: forced_commits holds 3 step commits; " + unit + " has 4 steps"},
      {ForcedSecretTx(kDrawn, garbage),
       "reveal secret: forced_commits: stage step commits: truncated at field 'commit 3'"},
      // Its real commits are not what it committed.
      {ForcedSecretTx(kDrawn, protocol::EncodeStageStepCommits(real)),
       "reveal secret: forced_commits: the commit of step 0 is not the step's committed leaf"},
  };
  ASSERT_NO_FATAL_FAILURE(StepRefusingFirst(refusals, [&] {
    std::vector<Transaction> good;
    for (const auto& [st, by_catcher] : sibling_verdicts) {
      good.push_back(RevealTx(st, Clean(st)));
      good.push_back(RevealTx(st, by_catcher, "", &catcher_));
      good.push_back(SecretTx(st));
    }
    good.push_back(RevealTx(kDrawn, stamp));
    good.push_back(RevealTx(kDrawn, caught, bundle_, &catcher_));
    good.push_back(ForcedSecretTx(kDrawn, protocol::EncodeStageStepCommits(commits[kDrawn])));
    return good;
  }()));
  EXPECT_EQ(Node(first_run[kDrawn]).secret_anchor_index, 1u) << "the secret was revealed";
  for (int i = 0; i < 5 && HasCheck(kDrawn) && Check(kDrawn).stage() != CheckStage::kCheckSettled;
       ++i) {
    Step();
  }
  ASSERT_FALSE(HasCheck(kDrawn)) << "a forced stage's replica re-runs";
  const TaskRecord t = Task();
  EXPECT_EQ(t.verification.forced_error, 1u);
  EXPECT_EQ(t.verification.fraud, 0u);
  // The rubber stamp is slashed; the catcher shares the jackpot its slash filled.
  EXPECT_EQ(Node(verifier_.public_key()).reputation.slashes, 1u);
  EXPECT_GT(Node(verifier_.public_key()).earnings.slashed, 0u);
  EXPECT_EQ(Node(catcher_.public_key()).reputation.slashes, 0u);
  EXPECT_EQ(Node(catcher_.public_key()).earnings.jackpot_wins, 1u);
  EXPECT_GT(Node(catcher_.public_key()).earnings.jackpot, 0u);
  // No stage node is punished; the replica's other stages are paid their whole cost, the drawn one
  // nothing for this run.
  for (uint32_t st = 0; st < kStages; ++st) {
    EXPECT_EQ(Node(first_run[st]).reputation.slashes, 0u) << st;
    EXPECT_EQ(Node(first_run[st]).status, NodeStatus::kActive) << st;
    const Amount want = st == kDrawn ? 0 : StageUnitCost(t.params, kTestUnitCost, st);
    EXPECT_EQ(Node(first_run[st]).earnings.units, want) << "stage " << st;
  }
  // The whole replica runs again: every stage placed anew, no check left of the first run.
  Step();
  for (uint32_t st = 0; st < kStages; ++st) {
    EXPECT_EQ(Unit(st).status, WorkUnitStatus::kAssigned) << st;
    EXPECT_FALSE(HasCheck(st)) << st;
  }
  // The drawn stage's node commits its re-run with its next secret.
  if (Unit(kDrawn).assignee == first_run[kDrawn]) {
    EXPECT_EQ(NextSecret(kDrawn), Secret(first_run[kDrawn], 2));
  }
}

// A replica with a stage drawn for a forced error (stage 1, its forced form caught) and a sibling
// that cheats (stage 0, drawn too, commits its real states: its check, run to the end, rules
// fraud, ADrawnStageThatCommittedItsRealStatesIsSlashed; here it does not even reveal its secret)
// whose check is still open when stage 1's settles. A sibling's discarded work is paid only once
// its own check has settled clean, so the replica re-runs once the siblings' checks settle (here
// both abandoned: stage 2, drawn too, reveals nothing either) and no stage of it is paid for its
// first run; the supply is conserved (Produce checks the chain's totals after every block).
// Before, stage 1's settling paid both siblings their whole cost at once (the cheat 160) and
// dropped their checks: PipelineNetworkTest.ALazyStageDrawnForAForcedErrorIsCaughtOnItsRerun's
// lazy stage was paid 1 token so.
TEST_F(ForcedStageTest, ASiblingWhoseCheckIsOpenIsNotPaidWhenAForcedStagesReplicaReruns) {
  StartWithCatcher();
  constexpr uint32_t kDrawn = 1, kCheat = 0, kSibling = 2;
  std::vector<PublicKey> first_run;
  std::vector<std::vector<StageStepCommit>> commits;
  std::vector<Transaction> txs;
  for (uint32_t st = 0; st < kStages; ++st) {
    first_run.push_back(Unit(st).assignee);
    commits.push_back(Commits(st, /*forced=*/st != kCheat));
    txs.push_back(Q(alice_, Commit(st, LeavesOf(commits.back()))));
  }
  StepOk(txs);
  StepUntil(kDrawn, CheckStage::kCheckCommitVerdicts);
  const std::vector<Hash256> leaves = LeavesOf(commits[kDrawn]);
  const Sealed stamp = Clean(kDrawn);
  Sealed caught = Mismatch(kDrawn, leaves, 0, Commits(kDrawn, false)[0].state_after);
  caught.salt = Blake2b("catcher's salt");
  StepOk({SealTx(kDrawn, stamp), SealTx(kDrawn, caught, &catcher_)});
  StepUntil(kDrawn, CheckStage::kCheckRevealVerdicts);
  ASSERT_NE(Check(kCheat).stage(), CheckStage::kCheckSettled) << "the cheat's check is open";
  StepOk({RevealTx(kDrawn, stamp), RevealTx(kDrawn, caught, bundle_, &catcher_),
          ForcedSecretTx(kDrawn, protocol::EncodeStageStepCommits(commits[kDrawn]))});
  for (int i = 0; i < 5 && HasCheck(kDrawn) && Check(kDrawn).stage() != CheckStage::kCheckSettled;
       ++i) {
    Step();
  }
  EXPECT_EQ(Task().verification.forced_error, 1u);
  // Run on until the first run's checks are gone, whichever way they went.
  for (int i = 0; i < 40 && (HasCheck(kCheat) || HasCheck(kSibling)) &&
                  Unit(kCheat).assignee == first_run[kCheat];
       ++i) {
    Step();
  }
  EXPECT_EQ(Node(first_run[kCheat]).earnings.units, 0u)
      << "a stage whose own check did not settle clean is paid for its discarded attempt";
  EXPECT_EQ(Node(first_run[kDrawn]).earnings.units, 0u);
  EXPECT_EQ(Node(first_run[kSibling]).earnings.units, 0u) << "its check did not settle clean";
  EXPECT_EQ(Task().verification.abandoned, 2u);
  EXPECT_FALSE(HasCheck(kCheat)) << "the replica re-ran";
  EXPECT_FALSE(HasCheck(kDrawn)) << "the replica re-ran";
}

// A drawn stage that committed its real states (to get the verifiers that replay them clean
// slashed) and reveals the commits it committed is the cheater, as a forced unit that did not
// commit ForcedCommitment: slashed and jailed; the verifiers that called it clean were right.
TEST_F(ForcedStageTest, ADrawnStageThatCommittedItsRealStatesIsSlashed) {
  StartWithCatcher();
  constexpr uint32_t kDrawn = 1;
  const PublicKey cheater = Unit(kDrawn).assignee;
  const std::vector<StageStepCommit> real = Commits(kDrawn, /*forced=*/false);
  StepOk({Q(alice_, Commit(kDrawn, LeavesOf(real)))});
  StepUntil(kDrawn, CheckStage::kCheckCommitVerdicts);
  const Sealed a = Clean(kDrawn);
  Sealed b = Clean(kDrawn);
  b.salt = Blake2b("catcher's salt");
  StepOk({SealTx(kDrawn, a), SealTx(kDrawn, b, &catcher_)});
  StepUntil(kDrawn, CheckStage::kCheckRevealVerdicts);
  StepOk({RevealTx(kDrawn, a), RevealTx(kDrawn, b, "", &catcher_),
          ForcedSecretTx(kDrawn, protocol::EncodeStageStepCommits(real))});
  for (int i = 0; i < 5 && HasCheck(kDrawn) && Check(kDrawn).stage() != CheckStage::kCheckSettled;
       ++i) {
    Step();
  }
  ASSERT_FALSE(HasCheck(kDrawn)) << "fraud: the round re-runs";
  EXPECT_EQ(Task().verification.fraud, 1u);
  EXPECT_EQ(Task().verification.forced_error, 0u);
  EXPECT_EQ(Node(cheater).reputation.slashes, 1u);
  EXPECT_EQ(Node(cheater).status, NodeStatus::kJailed);
  for (const KeyPair* v : {&verifier_, &catcher_}) {
    EXPECT_EQ(Node(v->public_key()).reputation.slashes, 0u);
    EXPECT_GT(Node(v->public_key()).earnings.verification, 0u);
  }
}

}  // namespace
}  // namespace meshlearn::ledger
