// A replay a verification role needs (not a public header): the agent's tick runs one job per
// tick, the most urgent first (verdicts, dispute moves and witnesses, by their deadline; a
// whistleblower's re-check when nothing else waits).
#pragma once

#include <cstdint>

#include "meshlearn/node/chain_client.h"

namespace meshlearn::node {

struct VerifyJob {
  // kTrace: the disputed step replayed with its operator trace (phases 2-4 of a tile dispute).
  enum class Kind { kVerdict, kDispute, kWhistle, kWitness, kTrace };
  Kind kind = Kind::kVerdict;
  const CheckAssignment* check = nullptr;  // in this tick's NodeWork
  uint64_t deadline = 0;
};

}  // namespace meshlearn::node
