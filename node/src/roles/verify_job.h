// A replay a verification role needs (not a public header): the agent's tick runs one job per
// tick, the most urgent first (this node's dispute moves and witnesses, then verdicts, each by
// deadline, see OrderUrgentJobs; a whistleblower's re-check when nothing else waits).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/node/chain_client.h"

namespace meshlearn::node {

struct VerifyJob {
  // kTrace: the disputed step replayed with its operator trace (phases 2-4 of a tile dispute).
  // kMerits: a whistleblower's witness of its dispute's segment, in the merits window its silent
  // solver left (ProveMerits). kRecheck: a stage step this node claimed served nothing, checked
  // from its pieces on chain.
  enum class Kind { kVerdict, kDispute, kWhistle, kWitness, kTrace, kMerits, kRecheck };
  Kind kind = Kind::kVerdict;
  const CheckAssignment* check = nullptr;  // in this tick's NodeWork
  uint64_t deadline = 0;  // the last height a transaction it sends may land in
};

// The job's check and kind, as a key that lasts across ticks (`check` does not).
std::string VerifyJobKey(const VerifyJob& job);

// Whether a job is this node's move in a dispute it is party to (a replay for a step-range post,
// a step's trace, the referee's witness): a party that misses its turn loses the dispute and its
// stake, where a verdict that misses its window counts its verifier one failure.
bool IsDisputeMove(VerifyJob::Kind kind);

// Orders a tick's urgent jobs, the one to run first at the front: this node's dispute moves before
// its other jobs, each earliest deadline first, except that a job whose last run failed
// (`failed_at`: VerifyJobKey -> the height it failed at) comes after every job that has not
// failed, the one that failed longest ago first, and a job that can no longer make its deadline
// (deadline <= height: what it sends lands in a later block) comes last. One job runs per tick,
// so a job that keeps failing (a verdict whose start state's only provider is partitioned away)
// would otherwise take every tick and starve a dispute move due a block later: the honest
// challenger missed its turn and was slashed (chaos seed 29). A dispute move goes before an
// earlier verdict because a move left for a later tick has no block to spare: chaos seed 561's
// defender, back from a kill with two ticks of its turn left, replayed a verdict due no later
// first, posted its move in the turn's last tick, the ledger lost power that block (its mempool
// with it) and the resent move landed a block late: the honest defender was slashed. A verdict it
// delays may miss its window, which costs its verifier a failure and the unit a check of its own
// (abandoned), never a stake. Forgets the failures of jobs no longer in `urgent`.
void OrderUrgentJobs(uint64_t height, std::vector<VerifyJob>* urgent,
                     std::map<std::string, uint64_t>* failed_at);

// The blocks a dispute move leaves itself after its stage replay, to be sent and land.
inline constexpr uint64_t kMoveSendBlocks = 4;

// The height from which a dispute's trace of a stage step (or a tile's witness, which traces it
// again) stops waiting for this node's own stage unit to end (NodeAgent::WaitsForStageUnit):
// `first_waited` the height it first waited at, `deadline` its turn's, `replay_blocks` the most
// blocks a stage replay of this node has taken (0: none measured yet). It waits through at most
// the first half of what was left of its turn, and no longer than leaves twice the blocks its
// replays took, plus kMoveSendBlocks: a trace under load takes as long as the replays before it
// did, and a wait that leaves it less loses the turn (on the 10M GPT's devnet at load 30, a
// defender waited 40 of the 116 blocks its turn had left, traced for 105 and was ruled silent).
// first_waited when it does not wait.
uint64_t TraceWaitEnd(uint64_t first_waited, uint64_t deadline, uint64_t replay_blocks);

}  // namespace meshlearn::node
