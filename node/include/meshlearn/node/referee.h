// The referee of verification disputes (docs/verification.md, "Referee"): when a dispute
// (protocol/dispute.h) has narrowed a disagreement between a solver (the defender) and a
// challenger to one training step of one unit, somebody must compute that step.
//
// A task with a data root (TaskParams::data_root: every classification task `meshlearn task
// submit` makes) is refereed by the ledger itself: the service builds the step's witness
// (node/step_witness.h: the agreed state in full, the bundle, the batch with Merkle proofs) and
// posts RefereeStepTx{task, index, witness}; the ledger checks the witness against the chain,
// executes the step and rules with its own output. Anyone may post it: for these disputes the
// service is permissionless, its key needs only an account to pay for the transaction.
//
// A dispute narrowed to one tile of one operator (the tile phase, docs/verification.md "Tiles")
// is refereed by the ledger too: the service replays the step with its operator trace
// (TraceDisputedStep) and posts RefereeTileTx{task, index, bundle, witness}
// (ledger::BuildTileWitness: the tile's input tiles and examples with their proofs). So are the
// two whole steps of the tile phase that follow from roots (protocol::RefereeRoots: both parties
// agreed on the step's operator outputs, or the disputed operator is of the step's input state):
// the service replays the step and posts RefereeTileTx with a witness of the operator output
// roots (ledger::RuleRoots), whatever the model's size.
//
// A pipeline stage's whole step over the stage witness bound (a claim that the stage served
// nothing) is not the service's to rule: the stage's evidence in pieces answers it
// (ledger/stage_serve.h, ServeStageEvidenceTx, which the dispute's parties post), or the stage
// loses at the serving window's end; the ledger refuses RuleDispute for every stage claim.
//
// Everything else -- tolerance-mode segments, and whole steps the ledger neither executes nor
// rules from roots (a verifying chain refuses an exact-mode task without a data root) -- is
// ruled with RuleDisputeTx{task, index, output}, signed with the key genesis names as `referee`
// (all zero: the sequencer's key). The ledger accepts that ruling from that key only; it does not
// re-run it.
//
// Everything the referee computes comes from public data: the task bundle and its data (blobs,
// task_bundle.h), the round's start state (a blob) and the unit's stream (UnitSeed of the task
// seed and UnitId{content id, round, shard}, as the solver trains it). So any follower can re-run
// a ruling and check the referee.
//
// The ruling on a whole-step task {step, input, defender_output, challenger_output} the ledger
// does not execute (RuleDisputeTx; with a data root over examples the ledger executes the step
// from the agreed state, step_witness.h):
//   A(s) = the unit's state hash after step s, replayed from the unit's start (StateHashAfterStep)
//   input == A(step-1)   output = A(step): whoever posted the true transition wins;
//   input != A(step-1)   output = challenger_output: the agreed state is not the unit's true
//                        state, so the defender committed (its leaf at the dispute's first step)
//                        or agreed to a false state: it cheated before this step. A challenger
//                        that replayed a segment from the solver's own (false) checkpoint posted
//                        the true transition from that state, which the referee cannot rebuild
//                        without the checkpoint; ruling against the defender is right whatever the
//                        challenger did.
// An honest defender only posts true hashes, so every hash it agreed to is true (case 1) and it
// wins; an honest challenger wins in both cases. An operator-level task without tiles is not
// played on this chain and is refused (a tile task: ComputeTileWitness).
//
// The ruling on a tolerance-mode segment {first_step, step, input, defender_output} (a task for
// hardware without bitwise reproducibility: hashes never agree across machines, so the game goes
// straight here, RuleSegment): RuleDisputeTx::tolerance_verdict = 1 when the defender's committed
// end state is within the task's tolerance (protocol::WithinTolerance, get_task params) of the
// unit's true state after `step`, replayed from the unit's start; 2 when it is not, or when the
// defender cannot show its state. The defender's state is its checkpoint at `step` from its unit
// service (unit_service.h), which must hash to its committed leaf `defender_output`; at step H,
// where a solver keeps no checkpoint, its committed pseudo-gradient (the result_hash blob) stands
// for it: end parameters = round start weights - delta, compared with the replay's delta applied
// the same way. Replaying from the unit's start (not from the agreed state, the defender's own
// checkpoint) also rules against a defender that cheated before the segment.
//
//   RefereeService referee(&chain, &tx, get_blob, {.env = env, .work_dir = dir + "/referee",
//                                                  .transport = transport});  // checkpoints
//   while (running) {
//     Result<std::vector<RefereeRecord>> sent = referee.Poll();   // once per block
//   }
//
// Thread-compatible: one Poll at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/transport.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/node/unit_executor.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::node {

// The state hash after inner step `step` (0..H; 0 is the unit's start state) of unit `work`
// trained from `global`: the unit replayed from its start, exactly as UnitExecutor runs it (the
// leaves of an honest commitment are StateHashAfterStep at HashedSteps).
Result<Hash256> StateHashAfterStep(engine::Trainer* trainer, std::span<const float> global,
                                   const UnitWork& work, int64_t step);

struct RefereeRuling {
  // RuleDisputeTx::output. A tolerance-mode segment: the replay's end state hash (informative:
  // the ledger reads tolerance_verdict). An input-state operator ruled from roots: the state
  // claim of the party whose operator output the roots give (the ledger compares the C_j).
  Hash256 output;
  Hash256 true_input;       // A(step - 1); a segment: A(first_step)
  Hash256 true_output;      // A(step)
  bool input_true = false;  // task.input == true_input
  // RuleDisputeTx::tolerance_verdict: 0 exact mode; a segment: 1 the defender's end state is
  // within tolerance, 2 it is not or the defender did not show it.
  uint8_t tolerance_verdict = 0;
  bool defender_shown = false;       // a segment: the defender showed its committed end state
  protocol::StateDistance distance;  // ... and its distance to the true one
  std::string reason;                // which side the output favours and why (logs, reports)
  // Posted as RefereeStepTx (the ledger executes the step; `output` is what it will compute
  // from the witness) rather than RuleDisputeTx.
  bool ledger_executes = false;
  bool tile = false;  // ... as RefereeTileTx: one tile of one operator (ledger::RuleTile)
  bool from_checkpoint = false;  // ... the agreed state came from the defender's checkpoint
  uint64_t witness_bytes = 0;    // ... EncodeStepWitness's size
};

// The ruling on a whole-step `task` (see the top of this file). InvalidArgument for an
// operator-level task or a step outside 1..H; FailedPrecondition for a tolerance-mode segment
// (RuleSegment rules those).
Result<RefereeRuling> RuleWholeStep(engine::Trainer* trainer, std::span<const float> global,
                                    const UnitWork& work, const protocol::RefereeTask& task);

// What the defender of a tolerance-mode dispute showed of its committed end state (after
// task.step). At most one of the two; neither: it showed nothing (`missing` says why).
struct DefenderEndState {
  // step < H: its checkpoint at `step` (engine::LoadCheckpoint of what its unit service served);
  // it counts only if it hashes to task.defender_output.
  engine::TrainState* checkpoint = nullptr;
  // step == H: its committed pseudo-gradient (DecodeDelta of the result_hash blob).
  const std::vector<float>* delta = nullptr;
  std::string missing;
};

// The parameters of a training state (a loaded checkpoint), in model order: what
// Trainer::FlatParams gives for the trainer's own state.
std::vector<float> StateParams(const engine::TrainState& state);
// global - delta: the end parameters a pseudo-gradient (global - local) stands for. Compare a
// committed delta with a replay as EndParamsOfDelta(global, delta) against
// EndParamsOfDelta(global, protocol::PseudoGradient(global, replayed)): an honest delta is then
// at distance 0. REQUIRES: equal sizes.
std::vector<float> EndParamsOfDelta(std::span<const float> global, std::span<const float> delta);

// The tolerance verdict on end parameters (pure): 1 when `defender` is given and
// protocol::WithinTolerance(Distance(*defender, truth), tolerance), else 2 (a size that is not
// truth's counts as outside). Sets tolerance_verdict, defender_shown, distance and reason.
RefereeRuling JudgeTolerance(const std::vector<float>* defender, std::span<const float> truth,
                             const protocol::ToleranceParams& tolerance);

// The ruling on a tolerance-mode segment (see the top of this file): replays the unit from its
// start to task.step (A(first_step) and A(step) on the way) and judges `defender` against the
// true end state. InvalidArgument for a task that is not a segment or a range outside 0..H.
Result<RefereeRuling> RuleSegment(engine::Trainer* trainer, std::span<const float> global,
                                  const UnitWork& work, const protocol::RefereeTask& task,
                                  const DefenderEndState& defender,
                                  const protocol::ToleranceParams& tolerance);

// One dispute waiting for the referee (rpc.h, referee_work).
struct RefereeDispute {
  Hash256 task_id;
  uint32_t index = 0;
  uint32_t round = 0;
  uint32_t shard = 0;
  Hash256 start_state;  // blob id of the global state the unit's round trains from
  Hash256 spec_hash;    // blob id of the task bundle
  PublicKey defender;
  PublicKey challenger;
  Hash256 result_hash;  // the solver's committed delta blob (a tolerance ruling at step H)
  // Where the game started (DisputeConfig): the claimed segment's first step and the defender's
  // committed leaf there, on which both agreed. A witness whose agreed state is not the unit's
  // true one is built from the defender's checkpoint there.
  uint64_t first_step = 0;
  Hash256 agreed;
  protocol::RefereeTask task;
};
Result<std::vector<RefereeDispute>> ParseRefereeWork(const nlohmann::json& j);
Result<std::vector<RefereeDispute>> GetRefereeWork(ChainClient& chain);

// Returns the bytes of blob `id` (content-verified), or an error when nobody serves it.
using RefereeBlobSource = std::function<Result<Bytes>(const Hash256& id)>;
// Returns the bytes of the defender's checkpoint file after `step` of the dispute's unit (a
// tolerance ruling's end state; a step witness's agreed state when the defender cheated before
// the dispute).
using RefereeCheckpointSource =
    std::function<Result<Bytes>(const RefereeDispute& dispute, int64_t step)>;

struct RefereeOptions {
  Env* env = nullptr;    // required: the bundles' data files are written under work_dir
  std::string work_dir;  // required
  std::function<void(const std::string&)> log;  // one line per ruling, fetch, refusal
  size_t max_cached_tasks = 4;                  // trainers kept (least recently used dropped)
  // Where the defender's checkpoints come from. Null: from the defender's unit service
  // (endpoint from get_node, FetchUnitManifest / FetchUnitCheckpoint) over `transport`. With
  // neither, tolerance-mode disputes are not ruled, nor whole steps whose agreed state only the
  // defender's checkpoint gives (they end undecided: nobody punished).
  RefereeCheckpointSource fetch_checkpoint;
  net::Transport* transport = nullptr;
  // Passes in which fetching the defender's state (its checkpoint, or its delta at step H) may
  // fail before the referee rules that the defender cannot show it (tolerance_verdict 2). A
  // served state that does not hash to the committed leaf counts at once. A step witness that
  // cannot be built is tried as many passes, then given up (the dispute ends undecided).
  int state_fetch_passes = 3;
};

// A ruling the service sent.
struct RefereeRecord {
  RefereeDispute dispute;
  RefereeRuling ruling;
  std::string tx_type;  // the transaction sent: RefereeStep, RefereeTile, RefereeStageStep
                        // (ruling.ledger_executes) or RuleDispute
  Hash256 tx_id;
  bool included = false;  // set by a later Poll once the ledger executed it
  bool ok = false;        // ... successfully
  std::string error;      // the ledger's refusal, if any
};

class RefereeService {
 public:
  // `chain` and `tx` must outlive the service; `tx` is initialized (TxSender::Init) with the
  // referee's key, and its outcomes belong to the service (Poll takes them).
  RefereeService(ChainClient* chain, TxSender* tx, RefereeBlobSource get, RefereeOptions options);
  ~RefereeService();

  // One pass: collects the outcomes of rulings in flight, reads referee_work and sends a ruling
  // (a RefereeStepTx or a RuleDisputeTx) for every dispute that has none in flight. Returns the
  // rulings sent in this pass. A dispute that cannot be computed (a blob nobody serves) is logged
  // and retried on the next pass. A task whose bundle disagrees with the ledger's record (its
  // data_root among them: CheckBundleMatchesLedger) is refused, logged once and never ruled.
  Result<std::vector<RefereeRecord>> Poll();

  // Every ruling sent so far, in order.
  const std::vector<RefereeRecord>& rulings() const { return rulings_; }

 private:
  struct TaskTrainer;
  Result<TaskTrainer*> TrainerFor(const Hash256& spec_hash);
  // A ruling and the transaction that carries it.
  struct Computed {
    RefereeRuling ruling;
    ledger::TxPayload tx;
  };
  Result<Computed> Compute(const RefereeDispute& d);
  // A stage unit's step (a pipeline task): CheckStageStep from what the stage node serves.
  Result<Computed> ComputeStageStep(const RefereeDispute& d, TaskTrainer* t);
  // A stage dispute that played the tile phase (its mismatch carried the bundle), at a tile or a
  // roots task: RefereeTile from the step traced from what the stage node serves
  // (node/stage_check.h TraceStageStep, BuildStageTileTx), whatever the stage's size.
  Result<Computed> ComputeStageTile(const RefereeDispute& d, TaskTrainer* t, const TaskInfo& info,
                                    const StageCheckInput& in);
  Result<RefereeRuling> ComputeSegment(const RefereeDispute& d, TaskTrainer* t,
                                       const ledger::TaskParams& params,
                                       std::span<const float> global, const UnitWork& work);
  Result<Computed> ComputeStepWitness(const RefereeDispute& d, TaskTrainer* t,
                                      std::span<const float> global, const UnitWork& work);
  // One tile (a dispute with the tile phase): the step traced, the tile's witness (RefereeTile).
  // A tile task's witness, or (a whole step ruled from roots, ledger::RulesFromRoots) a witness
  // of the step's operator output roots; both go in a RefereeTileTx.
  Result<Computed> ComputeTileWitness(const RefereeDispute& d, TaskTrainer* t,
                                      const ledger::TaskParams& params,
                                      std::span<const float> global, const UnitWork& work);
  bool CanFetchCheckpoints() const;
  Result<Bytes> FetchCheckpoint(const RefereeDispute& d, int64_t step);
  Result<engine::TrainState> LoadDefenderCheckpoint(const RefereeDispute& d, int64_t step);
  void Log(const std::string& line);

  ChainClient* chain_;
  TxSender* tx_;
  RefereeBlobSource get_;
  RefereeOptions options_;
  std::map<Hash256, std::unique_ptr<TaskTrainer>> trainers_;  // by spec_hash
  uint64_t use_clock_ = 0;
  std::vector<RefereeRecord> rulings_;
  std::map<Hash256, size_t> in_flight_;  // tx id -> index in rulings_
  // (task, index, step, input, defender_output, challenger_output) ruled and in flight.
  using Key = std::tuple<Hash256, uint32_t, uint64_t, Hash256, Hash256, Hash256>;
  static Key KeyOf(const RefereeDispute& d);
  std::map<Key, Hash256> pending_;
  // Rulings computed whose send failed: sent again without replaying the unit again.
  std::map<Key, Computed> computed_;
  // Passes in which the defender's state could not be fetched (tolerance mode), or a step
  // witness could not be built.
  std::map<Key, int> fetch_failures_;
  std::set<Key> given_up_;  // step witnesses that could not be built: undecided
  // Tasks refused (their bundle disagrees with the ledger), by task id: the reason.
  std::map<Hash256, std::string> refused_;
};

}  // namespace meshlearn::node
