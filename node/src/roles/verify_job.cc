#include "verify_job.h"

#include <algorithm>
#include <compare>
#include <set>

namespace meshlearn::node {

bool IsDisputeMove(VerifyJob::Kind kind) {
  return kind == VerifyJob::Kind::kDispute || kind == VerifyJob::Kind::kTrace ||
         kind == VerifyJob::Kind::kWitness;
}

std::string VerifyJobKey(const VerifyJob& job) {
  const CheckAssignment& c = *job.check;
  return c.task_id.ToHex() + "/" + std::to_string(c.index) + "/" +
         std::to_string(c.commit_height) + "/" + std::to_string(static_cast<int>(job.kind));
}

void OrderUrgentJobs(uint64_t height, std::vector<VerifyJob>* urgent,
                     std::map<std::string, uint64_t>* failed_at) {
  // Forget the failures of jobs no longer urgent (done, given up, or their check moved on).
  std::set<std::string> keys;
  for (const VerifyJob& j : *urgent) keys.insert(VerifyJobKey(j));
  std::erase_if(*failed_at, [&](const auto& kv) { return !keys.count(kv.first); });
  struct Rank {
    bool late;           // a transaction sent now lands after its deadline
    uint64_t failed_at;  // 0: it has not failed since it last ran well; else 1 + that height
    bool not_a_move;     // not this node's turn in a dispute (a verdict, a re-check)
    uint64_t deadline;
    auto operator<=>(const Rank&) const = default;
  };
  auto rank = [&](const VerifyJob& j) {
    auto f = failed_at->find(VerifyJobKey(j));
    return Rank{.late = j.deadline <= height,
                .failed_at = f == failed_at->end() ? 0 : f->second + 1,
                .not_a_move = !IsDisputeMove(j.kind),
                .deadline = j.deadline};
  };
  std::stable_sort(urgent->begin(), urgent->end(),
                   [&](const VerifyJob& a, const VerifyJob& b) { return rank(a) < rank(b); });
}

uint64_t TraceWaitEnd(uint64_t first_waited, uint64_t deadline, uint64_t replay_blocks) {
  if (deadline <= first_waited) return first_waited;
  const uint64_t left = deadline - first_waited;
  const uint64_t reserve = std::max(left - left / 2, 2 * replay_blocks + kMoveSendBlocks);
  return reserve >= left ? first_waited : deadline - reserve;
}

}  // namespace meshlearn::node
