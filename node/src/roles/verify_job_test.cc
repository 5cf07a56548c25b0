// The order of a tick's urgent verification jobs (roles/verify_job.h OrderUrgentJobs): dispute
// moves first, earliest deadline first, a job that failed after the ones that did not, a job past
// its deadline last.
#include "verify_job.h"

#include <gtest/gtest.h>

#include "disputes.h"
#include "meshlearn/base/hash.h"

namespace meshlearn::node {
namespace {

CheckAssignment Check(uint32_t index) {
  CheckAssignment c;
  c.task_id = Blake2b("task");
  c.index = index;
  c.commit_height = 10 + index;
  return c;
}

std::vector<uint32_t> Order(const std::vector<VerifyJob>& jobs) {
  std::vector<uint32_t> out;
  for (const VerifyJob& j : jobs) out.push_back(j.check->index);
  return out;
}

TEST(OrderUrgentJobsTest, EarliestDeadlineFirstWhenNothingFailed) {
  const CheckAssignment a = Check(1), b = Check(2), c = Check(3);
  std::vector<VerifyJob> jobs = {{VerifyJob::Kind::kVerdict, &a, 33},
                                 {VerifyJob::Kind::kVerdict, &b, 30},
                                 {VerifyJob::Kind::kVerdict, &c, 31}};
  std::map<std::string, uint64_t> failed;
  OrderUrgentJobs(28, &jobs, &failed);
  EXPECT_EQ(Order(jobs), (std::vector<uint32_t>{2, 3, 1}));
  std::vector<VerifyJob> moves = {{VerifyJob::Kind::kTrace, &a, 33},
                                  {VerifyJob::Kind::kWitness, &b, 30},
                                  {VerifyJob::Kind::kDispute, &c, 31}};
  OrderUrgentJobs(28, &moves, &failed);
  EXPECT_EQ(Order(moves), (std::vector<uint32_t>{2, 3, 1}));
}

// Chaos seed 561: the defender of a dispute, back from a kill with its turn due at 13, owed a
// verdict due no later; the verdict's replay took its first tick back, the move went out in the
// turn's last tick, the ledger lost that block's mempool and the move landed late. A party's
// dispute move goes before any verdict, whatever their deadlines.
TEST(OrderUrgentJobsTest, ADisputeMoveGoesBeforeAnEarlierVerdict) {
  const CheckAssignment verdict = Check(5), dispute = Check(1), trace = Check(2),
                        witness = Check(3);
  std::map<std::string, uint64_t> failed;
  for (VerifyJob::Kind kind :
       {VerifyJob::Kind::kDispute, VerifyJob::Kind::kTrace, VerifyJob::Kind::kWitness}) {
    const CheckAssignment* c = kind == VerifyJob::Kind::kDispute ? &dispute
                               : kind == VerifyJob::Kind::kTrace ? &trace
                                                                 : &witness;
    std::vector<VerifyJob> jobs = {{VerifyJob::Kind::kVerdict, &verdict, 12}, {kind, c, 13}};
    OrderUrgentJobs(11, &jobs, &failed);
    EXPECT_EQ(Order(jobs), (std::vector<uint32_t>{c->index, 5}));
  }
}

// Chaos seed 29: a verdict (deadline 30) whose start state's only provider was partitioned away
// failed every tick and, first by its deadline, took every tick from the challenger's dispute
// move (deadline 31), which then landed late and the honest challenger was slashed. Dispute moves
// now go first anyway; a failing job still yields to one that has not failed, of either kind.
TEST(OrderUrgentJobsTest, AJobThatFailedYieldsToOneThatDidNot) {
  const CheckAssignment verdict = Check(4), other = Check(2), dispute = Check(1);
  std::vector<VerifyJob> jobs = {{VerifyJob::Kind::kVerdict, &verdict, 30},
                                 {VerifyJob::Kind::kVerdict, &other, 31}};
  std::map<std::string, uint64_t> failed;
  OrderUrgentJobs(28, &jobs, &failed);
  ASSERT_EQ(jobs.front().check, &verdict);
  failed[VerifyJobKey(jobs.front())] = 28;  // its fetch failed this tick

  std::vector<VerifyJob> next = {{VerifyJob::Kind::kVerdict, &verdict, 30},
                                 {VerifyJob::Kind::kVerdict, &other, 31}};
  OrderUrgentJobs(29, &next, &failed);
  EXPECT_EQ(Order(next), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(failed.size(), 1u);

  // A dispute move that failed yields to a verdict that has not.
  std::vector<VerifyJob> mixed = {{VerifyJob::Kind::kTrace, &dispute, 31},
                                  {VerifyJob::Kind::kVerdict, &other, 31}};
  failed[VerifyJobKey(mixed.front())] = 29;
  OrderUrgentJobs(29, &mixed, &failed);
  EXPECT_EQ(Order(mixed), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(failed.size(), 1u) << "the verdict no longer urgent: its failure is forgotten";

  // The verdict is the only urgent job: it runs again.
  std::vector<VerifyJob> alone = {{VerifyJob::Kind::kVerdict, &verdict, 30}};
  OrderUrgentJobs(29, &alone, &failed);
  EXPECT_EQ(Order(alone), (std::vector<uint32_t>{4}));
}

TEST(OrderUrgentJobsTest, FailedJobsTakeTurnsTheOneThatFailedLongestAgoFirst) {
  const CheckAssignment a = Check(1), b = Check(2);
  std::map<std::string, uint64_t> failed;
  std::vector<VerifyJob> jobs = {{VerifyJob::Kind::kVerdict, &a, 40},
                                 {VerifyJob::Kind::kVerdict, &b, 41}};
  failed[VerifyJobKey(jobs[0])] = 21;
  failed[VerifyJobKey(jobs[1])] = 20;
  OrderUrgentJobs(22, &jobs, &failed);
  EXPECT_EQ(Order(jobs), (std::vector<uint32_t>{2, 1}));
}

TEST(OrderUrgentJobsTest, AJobPastItsDeadlineGoesLastAndForgottenFailuresAreDropped) {
  const CheckAssignment a = Check(1), b = Check(2), gone = Check(3);
  std::map<std::string, uint64_t> failed;
  failed[VerifyJobKey({VerifyJob::Kind::kVerdict, &gone, 25})] = 24;
  std::vector<VerifyJob> jobs = {{VerifyJob::Kind::kVerdict, &a, 30},
                                 {VerifyJob::Kind::kTrace, &b, 31}};
  failed[VerifyJobKey(jobs[1])] = 29;
  // At height 30 what the verdict sends lands at 31, after its window: the failed dispute
  // move, still in time, goes first.
  OrderUrgentJobs(30, &jobs, &failed);
  EXPECT_EQ(Order(jobs), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(failed.size(), 1u) << "the failure of a job no longer urgent is forgotten";
  // The same check's verdict and dispute jobs are kept apart.
  EXPECT_NE(VerifyJobKey({VerifyJob::Kind::kVerdict, &a, 30}),
            VerifyJobKey({VerifyJob::Kind::kTrace, &a, 30}));
}

// A dispute's trace waits for the node's own stage unit through at most half of what its turn had
// left when it first waited, and no longer than leaves twice the blocks the node's stage replays
// took, plus the blocks a move needs to land.
TEST(TraceWaitEndTest, LeavesTheTraceTwiceWhatTheNodesReplaysTook) {
  // A turn of 120 blocks left at height 100: half of it with nothing measured or short replays.
  EXPECT_EQ(TraceWaitEnd(100, 220, 0), 160u);
  EXPECT_EQ(TraceWaitEnd(100, 220, 20), 160u);  // 44 blocks kept: less than the half
  // Replays of 40 blocks: 84 kept, so it waits 36 blocks, not 60.
  EXPECT_EQ(TraceWaitEnd(100, 220, 40), 220u - 2 * 40 - kMoveSendBlocks);
  // A trace of 105 blocks (the 10M GPT's devnet at load 30) does not wait at all.
  EXPECT_EQ(TraceWaitEnd(100, 220, 105), 100u);
  EXPECT_EQ(TraceWaitEnd(100, 100, 0), 100u);  // no turn left
  EXPECT_EQ(TraceWaitEnd(100, 90, 0), 100u);
}

// A referee witness is sent once per dispute, not once per check: a whistleblower's dispute of a
// settled unit at the step an earlier dispute already served is another action, so the stage's
// node posts that step's evidence again instead of finding it sent and losing the claim.
TEST(WitnessActionTest, ASecondDisputeOfACheckAtTheSameStepIsAnotherAction) {
  DisputeView first, second;
  first.challenger.bytes.fill(1);
  second.challenger = first.challenger;
  second.challenger.bytes[31] = 2;  // differs only in the key's last word
  const VerifyAction a = WitnessAction("verify/t-1-10", first, {3, 1});
  EXPECT_EQ(a, WitnessAction("verify/t-1-10", first, {3, 1}));
  EXPECT_NE(a, WitnessAction("verify/t-1-10", second, {3, 1}));
  EXPECT_NE(a, WitnessAction("verify/t-1-10", first, {3, 2}));
  EXPECT_EQ(a.kind, VerifyAction::Kind::kWitness);
}

}  // namespace
}  // namespace meshlearn::node
