// Audit of a task: re-executes its work units from the ledger's record and checks every hash the
// network committed, from the initial weights to the final model (`meshlearn task audit`,
// docs/submitters.md "Audit a task", docs/verification.md "Audit").
//
// A unit is a pure function of (task, its round's start state, its stream), and a round's state
// a pure function of its start state and its units' deltas (network_round.h, the very functions
// the nodes run). So from the task bundle and its data alone anyone can recompute
//
//   initial state   InitialState(trainer)                   vs params.initial_state
//   unit (r, i)     the Merkle root of its state hashes      vs the unit's commitment
//                   and the blob id of its delta             vs the unit's result_hash
//   round r state   ApplyRound(round r's start, the deltas)  vs round_results[r].state
//   final           the last round's state                   vs final_state
//
// Full audit (options.full): every committed unit of every finished round, from the initial
// weights. PASS means the final model is exactly what the task's data, seed and rules give.
//
// Sampled audit: `sample` committed units drawn with `seed` (the same seed draws the same units).
// A sampled unit trains from its round's recorded start state; the audit asks `get` for it (the
// blob id is content-addressed: whoever serves it serves the recorded state). Nodes let go of
// superseded states, so it may be gone: then the audit rebuilds it by re-executing whole rounds
// from the nearest earlier state it can get (the initial state at worst); those rounds are
// checked completely. If that needs more than `max_rebuild_units` units besides the sampled ones,
// it stops before any training with an error that says so (use a full audit, or raise the cap). A
// sampled PASS says that the sampled units (and the rebuilt rounds) reproduce; the aggregates of
// the other rounds are not recomputed (their states show as "fetched" or "skipped").
//
// A pipeline task (params.stages > 1; docs/verification.md, "An audit of a pipeline task") is
// audited replica by replica: each replica of a round is re-run in this process, its stages
// talking through in-memory links (the same RunStageStep its nodes ran), from the round's start
// state, and every step of every stage is compared with the stage's committed step commit (the
// blob its CommitStage named, WorkUnit::stage_commits): the state hashes and every received and
// sent record's tensor (the signatures are the nodes' and not re-made). A unit is a stage unit
// here: its delta is compared with its result_hash, and its round's state is recomputed from the
// replicas' deltas gathered in model order. At a stage's first step that differs, the re-run's
// checkpoint and received tensors are what the committed commit had to start from and receive
// (every earlier step agreed), so with on_stage_fraud the audit builds the step's ProveFraud
// witness itself. A step that does not start where the stage's previous step ended (its committed
// state_before is not step t-1's committed state_after, or step 0's not the stage's slice of the
// round's start state) is proven from the commits alone (ledger::StageContinuityWitness: the two
// commits, or step 0's with the bundle and the round's start state), whatever it received. A step
// that received a record the re-run did not send is its sender's fault when the sender's commit
// lists that record (found at the sender's own step); one that its sender did not sign is the
// stage's own, proven from its commit alone (ledger::StageRecordWitness); one its sender signed
// and its sender's commit does not list is the sender's, named at that step and proven against
// the sender's unit from the two commits (StageRecordWitness with other). A sampled audit re-runs
// the whole replica of each sampled stage unit.
//
// After a mismatch the audit goes on where it can: a later round whose recorded start state can
// still be fetched is checked from that state, so one report names every bad unit it can reach.
//
//   AuditOptions o{.full = true, .work_dir = home + "/audit/" + id.ToHex()};
//   ML_ASSIGN_OR_RETURN(AuditReport r, AuditTask(env, chain, id, get_blob, o));
//   if (!r.pass) std::cout << "FAIL: " << r.first_mismatch << "\n";
//
// Thread-compatible: one audit per call; it builds its own trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/step_witness.h"

namespace meshlearn::node {

enum class AuditCheck : uint8_t {
  kAuditCheckPass = 0,  // recomputed, equal to the record
  kAuditCheckFail,      // recomputed, differs from the record
  kAuditCheckFetched,   // a state the audit did not recompute: the recorded blob, served by a node
  kAuditCheckSkipped,   // not re-executed (not sampled, or its input was unavailable)
};
// "pass", "fail", "fetched", "skipped".
std::string_view AuditCheckName(AuditCheck check);

struct AuditUnit {
  uint32_t index = 0;  // round x units_per_round + shard
  uint32_t round = 0;
  uint32_t shard = 0;
  std::string assignee;         // node id (hex) that committed it
  std::string status;           // the ledger's unit status
  Hash256 commitment;           // recorded (CommitUnit)
  Hash256 result;               // recorded delta blob id
  Hash256 replayed_commitment;  // zero unless re-executed
  Hash256 replayed_result;
  bool sampled = false;  // drawn by a sampled audit (else: full, or rebuilding its round's state)
  AuditCheck check = AuditCheck::kAuditCheckSkipped;
  std::string note;  // why it was skipped, or what differs
  std::vector<Hash256> leaves;  // recorded (CommitUnit): the state hashes after steps 0, k, ..., H
  // With AuditOptions::on_fraud: the first segment that does not replay to its leaf (-1: none
  // found or not asked) and on_fraud's answer (what became of the proof; null when not asked).
  int32_t fraud_segment = -1;
  nlohmann::json proof;
  // A pipeline task's stage unit (-1 otherwise): its replica and stage, the blob of its step
  // commits (CommitStageTx::commits; zero when none was named), and how many of its steps were
  // compared with the re-run. For a stage unit fraud_segment is the first step whose commit
  // differs from the re-run's, found whether or not proofs were asked.
  int32_t replica = -1;
  int32_t stage = -1;
  Hash256 stage_commits;
  uint64_t steps_compared = 0;
};

// One link of the chain initial -> round 0 -> ... -> final.
struct AuditState {
  std::string name;    // "initial", "round 0", ..., "final"
  int32_t round = -1;  // the round that produced it (-1: initial)
  Hash256 recorded;    // blob id on the ledger
  Hash256 computed;    // zero unless recomputed
  AuditCheck check = AuditCheck::kAuditCheckSkipped;
  std::string note;
};

struct AuditReport {
  Hash256 task_id;
  std::string task_name;
  std::string status;           // finished | cancelled
  uint32_t rounds = 0;          // the task's
  uint32_t rounds_audited = 0;  // rounds with a recorded result
  uint32_t units_per_round = 0;
  uint32_t inner_steps = 0;
  uint32_t stages = 1;                // params.stages (1: no pipeline)
  uint64_t stage_steps_compared = 0;  // stage steps compared with their commits, all units
  bool full = false;
  uint64_t seed = 0;    // sampled audit
  uint32_t sample = 0;  // units drawn
  std::vector<AuditState> chain;
  std::vector<AuditUnit> units;  // every unit of the audited rounds, by index
  uint64_t units_executed = 0;
  // The record's verification.proven_frauds when the audit read it (units already proven
  // fraudulent on chain, ProveFraudTx), and verification.fraud_rounds.
  nlohmann::json proven_frauds = nlohmann::json::array();
  nlohmann::json fraud_rounds = nlohmann::json::array();
  bool pass = false;
  std::string first_mismatch;  // empty on PASS: the first failed check, in chain order
};

struct AuditProgress {
  uint64_t steps_done = 0;   // inner steps re-executed so far
  uint64_t steps_total = 0;  // of the whole audit
  uint64_t units_done = 0;
  uint64_t units_total = 0;
  std::string status;  // "round 1 unit 5"
};

// The ProveFraud witness the audit built for a stage unit's step AuditUnit::fraud_segment.
struct StageFraudProof {
  enum Kind {
    // The step starts where the re-run's does and received what the re-run sent, but its state
    // after the step or what it sent differs: a ledger::StageStepWitness, built from the re-run's
    // checkpoint and tensors and the committed commit (ledger::BuildStageStepWitness).
    kStep,
    // The step does not start where the stage's previous step ended: a
    // ledger::StageContinuityWitness of its committed commits (step 0: its commit, the bundle and
    // the round's start state).
    kContinuity,
    // It received a record its sender did not sign (the sender's commit does not list it): a
    // ledger::StageRecordWitness of its committed commit alone. Or it signed a record its
    // receiver's commit holds and its own commit does not list: the StageRecordWitness of its
    // committed commit with the receiver's as other.
    kRecord,
  } kind = kStep;
  Bytes witness;  // the encoded witness ProveFraudTx carries
};
// "step", "continuity", "record".
std::string_view StageFraudProofName(StageFraudProof::Kind kind);

struct AuditOptions {
  bool full = false;
  uint32_t sample = 3;
  uint64_t seed = 0;
  // Sampled audit: the most units it re-executes only to rebuild start states nobody serves.
  uint64_t max_rebuild_units = 100;
  // Where the bundle's data files are written (a later audit of the task reuses them). Required.
  std::string work_dir;
  std::function<void(const AuditProgress&)> on_progress;
  std::function<void(const std::string&)> log;  // decisions worth telling a human
  // Fraud proofs (`task audit --prove`): for every re-executed unit whose commitment does not
  // replay, the audit builds the witness of the first segment that does not reach its committed
  // leaf (BuildSegmentWitness, from the unit's true start) and calls this with it; whatever it
  // returns is kept as AuditUnit::proof. Null: no witness is built.
  std::function<nlohmann::json(const AuditUnit&, const BuiltSegmentWitness&)> on_fraud;
  // The same for a pipeline task: for every stage unit whose step fraud_segment is its own fault,
  // the audit builds that step's witness and calls this with it. Null: none built.
  std::function<nlohmann::json(const AuditUnit&, const StageFraudProof&)> on_stage_fraud;
};

// Returns the bytes of blob `id` (content-verified), or an error when no one serves it.
using BlobGetter = std::function<Result<Bytes>(const Hash256& id)>;

// What `task audit --prove` sends for unit `u` of `task` (its get_task answer with units) whose
// segment w.segment does not replay to its leaf (on_fraud's arguments; docs/verification.md,
// "Fraud proofs after the fact" and "Over 8 MiB: a late dispute"):
//   - the witness encoded fits `max_witness_bytes` (a transaction's bound, kMaxWitnessBytes):
//     ProveFraudTx, the ledger re-executes the segment in one transaction;
//   - over it: LateChallengeTx, which opens a dispute game on the segment (its end, the state
//     hash the replay reached), with the least bond (ledger::LateChallengeMinBond: the unit's
//     cost at its solver's price) and the task bundle where a mismatch needs it
//     (ledger::MismatchNeedsBundle: the tile phase; fetched by `get`, else ""). Its sender then
//     plays the challenger's side until the game is ruled (AgentOptions::late_challenger), or
//     loses its bond by silence.
struct FraudProofSend {
  ledger::TxPayload tx;
  bool late = false;           // a LateChallengeTx
  uint64_t witness_bytes = 0;  // the segment witness encoded
  ledger::Amount bond = 0;     // late: the bond it puts up
};
Result<FraudProofSend> FraudProofFor(const nlohmann::json& task, const AuditUnit& u,
                                     const BuiltSegmentWitness& w, const BlobGetter& get,
                                     uint64_t max_witness_bytes = ledger::kMaxWitnessBytes);

// Audits the task whose get_task answer (with units) is `task`.
// Errors (no verdict): an open task or one without a finished round (FailedPrecondition), a
// record that does not parse (DataLoss), a bundle or data blob nobody serves, a sample that
// needs more than max_rebuild_units units to rebuild start states.
Result<AuditReport> AuditTaskRecord(Env* env, const nlohmann::json& task, const BlobGetter& get,
                                    const AuditOptions& options);

// Reads the task from `chain` (get_task with units), then AuditTaskRecord. An unknown task id is
// NotFound naming the ledger.
Result<AuditReport> AuditTask(Env* env, ChainClient& chain, const Hash256& task_id,
                              const BlobGetter& get, const AuditOptions& options);

// The report as JSON (what `meshlearn --json task audit` prints).
nlohmann::json AuditReportToJson(const AuditReport& report);

}  // namespace meshlearn::node
