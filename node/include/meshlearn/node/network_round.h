// What the network computes for a task, in one place: the step from a round's committed deltas
// to the next global state, and the ledger facts a task bundle must agree with. The work of unit
// (round, shard) is protocol::UnitWorkOf (protocol/task_model.h). Everyone who computes these
// calls these functions -- the in-process reference (RunLocalDiloco), the solver and the
// aggregator (NodeAgent), and the auditor (task_audit.h) -- so a re-execution reproduces the
// network's hashes bit for bit and cannot drift from it.
//
//   UnitExecutor ex(trainer);
//   UnitWork w = protocol::UnitWorkOf(net, facts, round, shard);
//   ML_ASSIGN_OR_RETURN(UnitOutcome out, ex.Run(state.weights, w));
//   ...
//   std::vector<RoundDelta> deltas = {{.shard = 0, .delta = out0.delta}, ...};
//   ML_ASSIGN_OR_RETURN(protocol::AggregateResult agg,
//                       ApplyRound(&state, deltas, net, facts.content_id, round,
//                                  UnitSamples(*trainer, net)));
//   Hash256 next = StateBlobId(state);   // what CommitAggregate records as the round's state
//
// All functions are pure (ApplyRound changes only *state) and thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/network_task.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::node {

// Samples one unit trains on (H x samples per step): every unit's weight in the weighted mean.
uint64_t UnitSamples(const engine::TaskSpec& task, const NetworkSpec& net);
uint64_t UnitSamples(const engine::Trainer& trainer, const NetworkSpec& net);

// One committed unit's pseudo-gradient. `delta` must stay alive during ApplyRound.
struct RoundDelta {
  uint32_t shard = 0;
  std::span<const float> delta;
};

// The aggregation step of round `round`: combines the deltas with the task's rule (any order,
// protocol::Aggregate sorts them) and applies the outer optimizer to *state (weights and outer
// momentum), which becomes the next round's global state.
// REQUIRES: every delta has state->weights.size() floats.
Result<protocol::AggregateResult> ApplyRound(GlobalState* state, std::span<const RoundDelta> deltas,
                                             const NetworkSpec& net, const Hash256& content_id,
                                             uint32_t round, uint64_t samples_per_unit);

// The blob id of a global state as the ledger records it (CommitAggregate's state: the id a
// BlobStore::Put of EncodeGlobalState returns). A delta's, CommitUnit's result_hash, is
// ledger::DeltaBlobId (ledger/step_witness.h), which the ledger computes itself for a ProveResult.
Hash256 StateBlobId(const GlobalState& state);

// The bundle (what nodes train) must describe the task the ledger schedules and pays: a
// submitter that published a bundle whose [network] table or data disagree with SubmitTask's
// params would have nodes compute something nobody can check. `task` is get_task's answer.
// The bundle's side is MakeTaskParams of it, so the node compares exactly what a submitter of this
// bundle would have sent. InvalidArgument naming the first field that differs (a nonzero
// params.memory_bytes too: the need the scheduler placed by must be the one the node computes
// from the bundle; and params.stage_boundary_bytes, the bytes the ledger paired a pipeline's
// stage nodes by, which must be what the bundle's cut moves); a nonzero params.data_root that is
// not facts.data_root (the DataTree of the data the node loaded) is refused with both roots: the
// ledger could never check a disputed step's examples against it.
Status CheckBundleMatchesLedger(const TaskFacts& facts, const NetworkSpec& net,
                                const nlohmann::json& task);
// The same against the ledger's params decoded (chain_client.h's TaskInfo::params); a zero
// data_root declares none.
Status CheckBundleMatchesLedger(const TaskFacts& facts, const NetworkSpec& net,
                                const ledger::TaskParams& params);

}  // namespace meshlearn::node
