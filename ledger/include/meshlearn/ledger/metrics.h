// GET /metrics of `meshlearn chain serve`: the ledger in the Prometheus text format
// (docs/operators.md, "Metrics"). Every number is read from the chain's state at the scrape (the
// same records get_task and list_nodes answer from; nothing is counted twice), except the
// sequencer's and the RPC service's counters, which only those see.
#pragma once

#include <string>

#include "meshlearn/ledger/rpc.h"

namespace meshlearn::ledger {

// The metrics page of `service`'s chain (and its sequencer, when it has one).
std::string LedgerMetricsText(const RpcService& service);

}  // namespace meshlearn::ledger
