// The solver role (not a public header; docs/node.md "Solver"): trains the units node_work
// assigns, commits them, serves what it committed and, under verification, reveals each unit's
// secret.
//
// One unit, by its journals in <data_dir>/units/<T>-<i>/ (records.h):
//
//   kNew ──train──▶ kTraining ──H steps──▶ kTrained ──CommitUnit──▶ kCommitting ──ok──▶ kCommitted
//     │  (progress.json after        (done.json; delta      (commit.json;        (a round that
//     │   every checkpoint)           stored, pinned)        tx in flight)        re-runs: kTrained)
//     └─ refused (memory), or over max_units: stays kNew, expires at its deadline
//
// A restart resumes kTraining from the last checkpoint (the same bits as an uninterrupted run),
// commits a kTrained unit again (with its next secret, and a new forced-error draw), and serves a
// committed unit's leaves and checkpoints again when node_work lists its check.
//
// The secret chain (secret_chain.h) of the current registration is in <data_dir>/
// secret_chain.json (SecretEpoch); every (re-)registration starts a new epoch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "node_context.h"
#include "records.h"
#include "secrets.h"
#include "verify_outbox.h"

namespace meshlearn::node {

class Solver {
 public:
  enum class UnitState : uint8_t { kNew, kTraining, kTrained, kCommitting, kCommitted };

  Solver(NodeContext* node, VerifyOutbox* outbox)
      : node_(node), outbox_(outbox), secrets_(node) {}

  // This tick's node_work: the next secret index the ledger expects.
  // The ledger's next secret index for this node (node_work, fetched after the outcomes were
  // polled); OnOutcome moves it past each commit included in between.
  void set_next_secret_index(uint64_t i) { next_secret_index_ = i; }
  // The units of `work` to run, earliest deadline first (commits in flight are left out; a unit
  // committed ok and assigned again, after its round re-ran, is back to kTrained).
  std::vector<const UnitAssignment*> Pending(const NodeWork& work);
  UnitState StateOf(const UnitAssignment& a) const;

  // Runs (or resumes, or commits again) one unit. `skipped` (nothing ran: refused for memory,
  // or over max_units) and `crashed` (the checkpoint hook failed, or should_stop) say more.
  Status Run(const UnitAssignment& a);
  bool skipped() const { return skipped_; }
  bool crashed() const { return crashed_; }
  // The unit stopped at a checkpoint because `pause` asked (it resumes from there next time);
  // not a failure.
  bool paused() const { return paused_; }
  // Asked after each checkpoint before the last: an error pauses the unit there. The agent
  // pauses training for verification work whose window is short (agent.h, "Rounds in flight").
  void set_pause(std::function<Status()> pause) { pause_ = std::move(pause); }
  // A refusal found the node's real memory below what it registered: the lower value to report
  // (UpdateNode), 0 if none; Take... is true once per new value.
  uint64_t memory_reported() const { return memory_reported_; }
  bool TakeReregister() { return std::exchange(reregister_, false); }
  // Memory policy: false (and logged once, naming the need and the limit) when unit `a` needs more
  // memory than the node can give -- the scheduler's number: ctx.memory_need for a whole unit,
  // the task's stage_memory_bytes[stage] for a stage unit (the agent asks before the Stager
  // starts one); lowers the registered memory when the real limit is below it.
  bool FitsInMemory(const UnitAssignment& a, const TaskContext& ctx);
  // The memory the node can give to training: memory_limit_bytes when set (at most the
  // registered capabilities.memory_bytes), else the registered memory.
  uint64_t MemoryBytes() const;
  // The scheduler's need of unit `a` (what FitsInMemory compares with MemoryBytes).
  static uint64_t NeedBytes(const UnitAssignment& a, const TaskContext& ctx);

  // The solver's side of a check: serve what it committed (again, after a restart), reveal the
  // secret in the reveal window.
  void PlayCheck(const CheckAssignment& c);

  // The secret chain: a new epoch before a (re-)registration (its head goes in RegisterNode),
  // and a check of the registered anchor against the chain on disk.
  Result<Hash256> NewSecretEpoch() { return secrets_.NewEpoch(); }
  void CheckSecretChain(const NodeInfo& record) { secrets_.Check(record); }

  bool OnOutcome(const TxOutcome& o);
  void ForgetTask(const Hash256& task) { refused_logged_.erase(task); }

 private:
  std::string Name(const UnitAssignment& a) const;
  std::optional<UnitResume> LoadProgress(const UnitAssignment& a, const UnitWork& work,
                                         const std::string& dir);
  Result<UnitOutcome> Train(const UnitAssignment& a, TaskContext* ctx, const GlobalState& start,
                            const UnitWork& work, UnitResume* resume);
  Result<UnitOutcome> TrainAsAdversary(const UnitAssignment& a, TaskContext* ctx,
                                       const GlobalState& start, const UnitWork& work,
                                       const UnitRunOptions& run);
  // Adversary "copy": a committed delta of another unit of a's round.
  Result<std::vector<float>> PeerDelta(const UnitAssignment& a, uint64_t num_params);
  // Stores the delta and the final state, journals kTrained and commits.
  Status Finish(const UnitAssignment& a, TaskContext* ctx, const UnitOutcome& out);
  // Commits a trained unit with its secret index, as a forced error when drawn.
  Status Commit(const UnitAssignment& a, const journal::UnitDone& done);
  Status Publish(const Hash256& task, uint32_t index, const journal::UnitCommit& commit);
  // In the reveal window, or `late`: during the dispute a verifier started without it.
  void RevealSecret(const CheckAssignment& c, bool late);
  // The outbox's key of that reveal (one in time, one late).
  VerifyAction SecretAction(const CheckAssignment& c, bool late) const;

  NodeContext* node_;
  VerifyOutbox* outbox_;
  uint64_t next_secret_index_ = 0;
  struct CommitInFlight {
    Hash256 txid;
    uint64_t secret_index = 0;
  };
  // (task, unit index) -> the CommitUnit in flight.
  std::map<std::pair<Hash256, uint32_t>, CommitInFlight> commits_;
  std::set<std::pair<Hash256, uint32_t>> committed_;
  uint32_t units_taken_ = 0;
  bool skipped_ = false;
  bool paused_ = false;
  std::function<Status()> pause_;
  bool crashed_ = false;
  uint64_t memory_reported_ = 0;
  bool reregister_ = false;
  std::map<Hash256, std::string> refused_logged_;
  std::map<Hash256, UnitOutcome> last_outcome_;  // adversary "stale": the previous unit per task
  SolverSecrets secrets_;
};

}  // namespace meshlearn::node
