// Deliberately cheating solvers, for tests and demos of verification (docs/verification.md,
// docs/operators.md "Adversary modes"). Never for real work: every mode commits a unit that
// looks well-formed to the ledger (a result blob and the Merkle root of a list of state hashes)
// but that an honest replay of at least one of its segments (node::ReplaySegment) does not
// reach, or (wrong_result) whose result is not the delta of its committed final state.
//
//   lazy        runs only every other inner step, but hashes and checkpoints its states as if it
//               had run them all (state.step advances on the skipped steps too);
//   noisy       trains honestly, then perturbs the weights with small deterministic noise after
//               step max(1, H/2);
//   wrong_data  trains on another unit's data stream, labelling its states with its own stream;
//   copy        commits another solver's delta for the same round when it can get one, with the
//               commitment of a lazy run of its own unit (no delta: behaves as lazy);
//   stale       re-commits its own result and commitment of an earlier round of the task (none
//               yet: behaves as lazy);
//   wrong_result  trains honestly (every leaf true, commitment and checkpoints honest) but commits
//               the honest delta negated (-delta, a sign-flip model poisoning: the aggregate is
//               pushed uphill). No segment replay can see it; the result check can
//               (docs/verification.md "Result binding": a verifier proves it, ProveResult).
//
// And two that poison the model while training honestly almost everywhere (issue 19): each
// changes one segment of a unit, so a one-segment check catches it with probability 1/segments.
//   noisy_last  honest in every unit except those of the task's last round
//               (AdversaryInputs::last_round), where it is noisy: poison that no later round
//               dilutes, at the one moment a checker has least time to find it;
//   targeted    trains honestly, then after step max(1, H/2) adds kTargetedShift to every weight
//               of output class 0 (row 0 of the model's last weight matrix and element 0 of its
//               last bias): a small nudge of the model toward one class, as a backdoor would.
//
// And one that lies in the forward pass of one step (issue 16):
//   wrong_example  trains honestly, except that step max(1, H/2) reads its batch with one value
//               of the first example changed (ForgeExample: its first input + 1; a token task's
//               first token another), and commits what that step computed: the lie enters the
//               step at the operator that reads the batch's examples (the first layer's forward;
//               a GPT's embedding), and every state from that step on follows from it. In a
//               dispute it claims the step as it computed it (its trace of the forged batch), so
//               the game narrows to a tile of that operator, which the ledger recomputes from the
//               examples proven against the task's data root (RefereeTile). It lies as a
//               challenger too: a challenge it plays (a late challenger account's,
//               AgentOptions::late_challenger) claims the same forged run of the challenged
//               unit, a false challenge that loses at that tile.
//
// A cheating solver defends its units in a dispute: it answers every turn with its own states
// (its unit run again with a state hash after every step), so the game narrows to one step and
// the ledger executes that step (RefereeStep) and rules against it. In a dispute with the tile
// phase a lazy solver goes on claiming what it did: the step's forward and backward pass as
// anyone computes them from the agreed state, but its parameters after the step the ones before
// it (SkippedUpdateTrace): the game narrows to a tile of the first updated parameter and the
// ledger recomputes it (RefereeTile); a wrong_example solver claims its forged step (above). Every
// other cheat has no step to show and stays silent (it loses at the deadline).
//
// A stage node of a pipeline task (issue 15) plays lazy, noisy, wrong_data and wrong_result on its
// stage unit (node/stage_unit.h SetStageAdversary; docs/verification.md "Stage adversaries");
// the other solver modes train a stage honestly.
//
// And one cheating verifier:
//   rubber_stamp  solves honestly, but as a verifier commits and reveals "clean" without
//                 replaying anything (and as a whistleblower never challenges): it loses its
//                 stake the first time it approves a forced error.
//
//   ML_ASSIGN_OR_RETURN(Adversary adv, ParseAdversary("lazy"));
//   ML_ASSIGN_OR_RETURN(UnitOutcome out, RunAdversaryUnit(adv, trainer, global, work, opts, {}));
#pragma once

#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/tile_rule.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/status.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/node/unit_executor.h"

namespace meshlearn::node {

enum class Adversary : uint8_t {
  kNone,
  kLazy,
  kNoisy,
  kWrongData,
  kCopy,
  kStale,
  kRubberStamp,
  kWrongResult,
  kNoisyLast,
  kTargeted,
  // A stage node's: noisy's perturbation between two steps, each step committed as trained (the
  // perturbed state is the next step's state_before, not the previous step's state_after), so
  // every step replays clean and only the continuity check sees it. A whole unit: noisy.
  kDrift,
  // One example of one step's batch forged (above): a lie in that step's forward pass.
  kWrongExample,
};

// What `targeted` adds to each weight of output class 0.
inline constexpr float kTargetedShift = 0.05f;

// noisy's poison: adds uniform noise in [-1e-3, 1e-3] to every value of `params`,
// deterministically from the unit's stream `stream` (a unit's whole model, or a stage's part).
void PerturbParams(std::vector<engine::Param>& params, uint64_t stream);
// The number of steps after which noisy (and targeted) poison a unit of `inner_steps` steps:
// max(1, inner_steps / 2).
int64_t PoisonAfterSteps(int64_t inner_steps);

// Whether `a` cheats as a solver (every mode but kNone and the verifier mode kRubberStamp).
bool CheatsAsSolver(Adversary a);
// Whether a node of mode `a` claims its own (cheating) run in a dispute it plays as the defender
// (every solver cheat: CheatsAsSolver) or as the challenger (kWrongExample only).
bool LiesInDisputes(Adversary a, bool defender);
// Whether `a` cheats as a verifier (kRubberStamp).
bool CheatsAsVerifier(Adversary a);

// "none", "lazy", "noisy", "wrong_data", "copy", "stale", "rubber_stamp", "wrong_result",
// "noisy_last", "targeted", "drift", "wrong_example".
std::string_view AdversaryName(Adversary a);
// "" and "none" -> kNone; an unknown name -> InvalidArgument naming the allowed values.
Result<Adversary> ParseAdversary(std::string_view name);
// The allowed values, for error messages: "\"lazy\", \"noisy\", ...".
std::string AdversaryChoices();

// What a cheating solver borrows.
struct AdversaryInputs {
  // wrong_data: the stream it trains on instead of its own; 0 = a stream derived from its own.
  uint64_t other_stream = 0;
  // copy: another solver's delta for the same round (empty: none could be had).
  std::span<const float> peer_delta;
  // stale: the outcome it committed for an earlier round of the task (null: none yet).
  const UnitOutcome* earlier = nullptr;
  // noisy_last: the unit belongs to the task's last round (else it runs honestly).
  bool last_round = false;
};

// Runs `work` as adversary `adv` would and returns what it commits. The outcome is well-formed:
// commitment == MerkleRoot(state_hashes), one state hash per HashedSteps step, delta_hash ==
// HashFloats(delta). options.on_step / on_checkpoint / should_stop are honoured (checkpoints are
// the adversary's own states, labelled with work.stream and the hashed step); options.resume is
// ignored (an adversary restarts the unit: same bits). kNone and kRubberStamp (an honest solver)
// run the honest UnitExecutor, and so do kWrongResult (resume honoured) before negating the
// delta and kNoisyLast outside the last round. In every mode the trainer's state afterwards is the
// one the last state hash is of (what a node saves as its checkpoint at H), except stale
// re-committing an earlier outcome.
Result<UnitOutcome> RunAdversaryUnit(Adversary adv, engine::Trainer* trainer,
                                     std::span<const float> global, const UnitWork& work,
                                     const UnitRunOptions& options, const AdversaryInputs& in);

// wrong_example's lie, in place: the first value of the batch's first example + 1 (a token
// batch: its first token 0, or 1 where it was 0: another token of any vocabulary of 2 or more,
// the targets untouched, read by the embedding lookup `encoded`).
void ForgeExample(engine::Batch& batch);
// The step (1-based: the step that ends at that state) whose batch wrong_example forges in a unit
// of `inner_steps` steps: PoisonAfterSteps(inner_steps).
int64_t ForgedExampleStep(int64_t inner_steps);

// What a lazy solver that skipped a step claims in a tile dispute: `honest` (the step traced from
// the agreed state, following `plan`) with every optimizer update's output replaced by the
// parameter or moment it updates, as it was before the step.
engine::OpTrace SkippedUpdateTrace(const engine::TilePlan& plan, const engine::OpTrace& honest);

}  // namespace meshlearn::node
