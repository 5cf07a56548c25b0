// A replay a verification role needs (not a public header): the agent's tick runs one job per
// tick, the most urgent first (verdicts, dispute moves and witnesses, by their deadline, see
// OrderUrgentJobs; a whistleblower's re-check when nothing else waits).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/node/chain_client.h"

namespace meshlearn::node {

struct VerifyJob {
  // kTrace: the disputed step replayed with its operator trace (phases 2-4 of a tile dispute).
  enum class Kind { kVerdict, kDispute, kWhistle, kWitness, kTrace };
  Kind kind = Kind::kVerdict;
  const CheckAssignment* check = nullptr;  // in this tick's NodeWork
  uint64_t deadline = 0;  // the last height a transaction it sends may land in
};

// The job's check and kind, as a key that lasts across ticks (`check` does not).
std::string VerifyJobKey(const VerifyJob& job);

// Orders a tick's urgent jobs, the one to run first at the front: earliest deadline first, except
// that a job whose last run failed (`failed_at`: VerifyJobKey -> the height it failed at) comes
// after every job that has not failed, the one that failed longest ago first, and a job that can
// no longer make its deadline (deadline <= height: what it sends lands in a later block) comes
// last. One job runs per tick, so a job that keeps failing (a verdict whose start state's only
// provider is partitioned away) would otherwise take every tick and starve a dispute move due a
// block later: the honest challenger missed its turn and was slashed (chaos seed 29). Forgets
// the failures of jobs no longer in `urgent`.
void OrderUrgentJobs(uint64_t height, std::vector<VerifyJob>* urgent,
                     std::map<std::string, uint64_t>* failed_at);

}  // namespace meshlearn::node
