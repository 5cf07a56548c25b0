// The aggregator role (not a public header; docs/node.md "Aggregator"): for a round node_work
// assigns it, fetches every committed delta, aggregates them with the task's rule, takes the outer
// step, evaluates, stores the new state and commits it (CommitAggregate).
//
// One round, by its journal <data_dir>/aggregates/<T>-<r>.json (records.h AggregateDone):
//
//   kNew ──fetch deltas, aggregate, store──▶ kAggregated ──CommitAggregate──▶ kCommitting
//                                             (journal)                        ──ok──▶ kCommitted
//   a delta nobody can serve (or a stage unit's step commits): ReportUnavailable after
//   report_unavailable_after tries (the round re-runs without its solver); a re-run round has
//   other inputs, so its journal does not match and it is kNew again.
//
// A restart commits a kAggregated round again without recomputing it (the state blob is pinned).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "node_context.h"

namespace meshlearn::node {

class Aggregator {
 public:
  enum class RoundState : uint8_t { kNew, kAggregated, kCommitting, kCommitted };

  explicit Aggregator(NodeContext* node) : node_(node) {}

  // The aggregations of `work` to run (commits in flight left out; one committed ok and asked
  // again, after its round re-ran, is run again).
  std::vector<const AggregationAssignment*> Pending(const NodeWork& work);
  RoundState StateOf(const AggregationAssignment& a) const;
  Status Run(const AggregationAssignment& a);
  // True when `o` is a failed CommitAggregate of ours that its round's re-run overtook: another
  // party's transaction (a fraud proof, a forced error's reveal, a check settled abandoned)
  // executed first and reset units it aggregated, so the ledger no longer expected an aggregate
  // ("not expected: ... phase assigning"). The aggregator could not have known when it sent; the
  // re-run round is aggregated again when node_work asks. Read from get_task: some input of the
  // commit is no longer a committed unit of that round with that result. Call before OnOutcome.
  bool Overtaken(const TxOutcome& o);
  bool OnOutcome(const TxOutcome& o);

 private:
  // The new state of the round: aggregated now, or read back from the journal.
  struct Aggregate {
    Hash256 state;
    uint32_t accuracy_ppm = 0;
    uint64_t loss_micros = 0;
  };
  Result<Aggregate> Compute(const AggregationAssignment& a, TaskContext* ctx);
  // A pipeline task's round: the replicas' stage deltas applied stage by stage (ApplyStageRound)
  // to `state`; `replicas`: how many replicas it applied. A stage unit whose delta does not
  // decode or whose step commits do not check is reported (ReportMalformed) and no aggregate is
  // made (FailedPrecondition naming it): the round re-runs without its node.
  Status ApplyStages(const AggregationAssignment& a, TaskContext* ctx, GlobalState* state,
                     size_t* replicas);
  // Evaluates the round's new state, stores and pins it, journals the round.
  Result<Aggregate> Finish(const AggregationAssignment& a, TaskContext* ctx,
                           const GlobalState& state, const std::string& inputs);
  // The deltas of the round's committed units; a malformed one is logged and left out.
  Status FetchDeltas(const AggregationAssignment& a, TaskContext* ctx,
                     std::vector<std::vector<float>>* deltas, std::vector<protocol::UnitId>* ids);
  // Counts a failed fetch of unit `index`'s blobs (its result `result`); reports the unit
  // unavailable after report_unavailable_after of them.
  void ReportIfUnavailable(const Hash256& task_id, uint32_t index, const Hash256& result,
                           const Status& why);
  // Reports stage unit `in` (at `slot`) at once: its delta does not decode or its step commits do
  // not check (`why`), which no retry changes (the blobs are content-addressed).
  void ReportMalformed(const AggregationAssignment& a, const AggregationInput& in,
                       const ledger::StageSlot& slot, const Status& why);
  // Sends ReportUnavailableTx for unit `index` (the ledger re-runs its round without its solver),
  // once per unit and result; logs `why`.
  void Report(const Hash256& task_id, uint32_t index, const Hash256& result,
              const std::string& why);
  // Blob `blob` of input `in` (its result, or a stage unit's step commits), asked first of the
  // node that committed it (`endpoint_of`: node -> endpoint); a blob no node serves is reported
  // (ReportIfUnavailable).
  Result<Bytes> FetchInput(const AggregationAssignment& a, const AggregationInput& in,
                           const Hash256& blob,
                           const std::map<PublicKey, std::string>& endpoint_of);
  // Stage unit `in`'s step commits blob (in.stage_commits, which node_work names with the input;
  // `slot` its place), fetched as its delta is, checked against the unit's commitment
  // (CheckStageCommits) and pinned with the task's states, as its stage node pins it: served
  // while a fraud proof can reopen the task, after the stage node deleted it (docs/verification.md,
  // "An audit of a pipeline task"). `malformed`: Ok when kept, else why it does not check (none
  // named, does not decode, another unit's, not the commitment). An error when nobody serves it
  // (reported as an unserved delta is).
  Status KeepStageCommits(const AggregationAssignment& a, const AggregationInput& in,
                          const ledger::StageSlot& slot, const NetworkSpec& net,
                          const std::map<PublicKey, std::string>& endpoint_of, Status* malformed);

  NodeContext* node_;
  // (task, round) -> the CommitAggregate in flight, and the units it aggregated.
  struct InFlight {
    Hash256 tx;
    std::vector<AggregationInput> inputs;
  };
  std::map<std::pair<Hash256, uint32_t>, InFlight> commits_;
  std::set<std::pair<Hash256, uint32_t>> committed_;
  // (task, unit index) -> failed fetches of its delta or step commits.
  std::map<std::pair<Hash256, uint32_t>, uint32_t> fetch_failures_;
  // (task, unit index, its result) reported: once each (a re-run of the unit is another result).
  std::set<std::tuple<Hash256, uint32_t, Hash256>> reported_;
};

}  // namespace meshlearn::node
