// What sampled verification costs and what cheating earns (docs/verification.md, "Economics").
// Pure functions of the verification rules (verification.h, unit_check.h): how often a cheating
// unit is caught, how often a cheater gets through a whole task, whether cheating pays, and how
// much compute the verifiers spend per unit of solver compute. Nothing here runs on the ledger;
// it is the analysis the defaults of VerificationParams are chosen by, checked against a
// simulation that uses the ledger's real draws (SimulateSolver; economics_test, verify_bench).
//
//   EconomicsReport r = AnalyzeEconomics(VerificationParams{}, kDefaultSlashMultiple,
//                                        TaskShape{}, {.faked_fraction = 0.1});
//   // r.overhead = 0.05 (verifier compute / solver compute), r.escape_task = 0.0075
//
// Notation (every formula below uses it):
//   H  inner steps of a unit; k its checkpoint interval; S = SegmentCount(H, k) segments, all of
//      k steps but the last, of l = H - (S-1)k steps
//   r  = min(segments_per_check, S): segments replayed per checked unit
//   V  verifiers per checked unit (each replays the same r segments)
//   U  units one solver does in a task
//   p  probability (VerificationProbabilityPermille / 1000) that a unit of the solver is checked
//   n  = ceil(f H) steps of a unit faked by a cheater that fakes a fraction f of its steps;
//      s = n / H is the share of a unit's compute it saves
//   M  slash multiple: a caught solver loses SlashAmount(unit cost, M) = M unit costs
//
// Detection of a cheating unit that is checked, q. A replayed segment exposes the cheat iff it
// contains a faked step (ReplaySegment starts from the solver's own committed state, so an honest
// segment after a faked one still replays to its committed end):
//   faked steps spread uniformly (n distinct steps, uniform over the H):
//     q = 1 - [(1 - r/S) h(r k) + (r/S) h((r-1) k + l)],  h(L) = C(H-L, n) / C(H, n)
//     (h(L): no faked step among L replayed steps; the short last segment is replayed with
//     probability r/S)
//   faked steps concentrated in whole segments (the fewest: B = min(S, ceil(n / k))):
//     q = 1 - C(S-B, r) / C(S, r)
// Per unit the cheat is caught with probability d = p q; a cheater that keeps p through a task
// (one at the floor: an unchecked unit leaves its streak alone, a clean check only lengthens it)
// escapes the whole task with probability (1 - d)^U. AnalyzeSolver computes the same exactly from
// any starting reputation (p follows the streak unit by unit).
//
// Expected value. Against honest work, a cheated unit saves s of the unit's cost (the solver's
// cost of a unit is taken equal to its pay: no margin, the most a cheat can save); a caught unit
// is not paid and is slashed, 1 + M unit costs. A caught cheater stops cheating (its later units
// are checked always and earn nothing extra). Per cheated unit, in unit costs:
//   gain = s - d (1 + M)
// and over a task gain x E[cheated units], E = (1 - (1-d)^U) / d. With k dividing H every pattern
// has q >= s (r >= 1), so gain <= s (1 - p (1 + M)): p (1 + M) > 1 makes EVERY cheating pattern
// lose money, however small.
//
// Verifier overhead, verifier compute as a fraction of solver compute (each segment is replayed
// with probability r/S, so the expected replayed steps are r H / S even with a short last one):
//   overhead = p V r / S
// A node's p falls with its clean streak (verification.h): a new node is checked always, an honest
// long-lived node at the floor. The headline is that steady state, p = floor_permille / 1000;
// NewNodeOverhead gives a new node's mean over its first units. Forced errors add up to
// forced_error_per_million / 10^6 of a unit (a forced unit is re-run), reported apart.
//
// Thread-safe: every function is pure.
#pragma once

#include <cstdint>

#include "meshlearn/protocol/types.h"
#include "meshlearn/protocol/verification.h"

namespace meshlearn::protocol {

// The chain's default slash multiple (ledger::ChainParams::slash_multiple, repeated here because
// the protocol cannot include the ledger; verify_bench reads the ledger's own). With the default
// floor, p (1 + M) = 0.5 x 11 > 1: every cheating pattern loses money. M = 2 would be enough.
inline constexpr uint32_t kDefaultSlashMultiple = 10;

// One solver's share of a task. The defaults are examples/fashion-mlp.toml run by
// `meshlearn devnet --solvers 4`: 12 rounds x 4 units over 4 solvers, H = 100, k = 10.
struct TaskShape {
  uint32_t units_per_solver = 12;     // U
  uint64_t inner_steps = 100;         // H
  uint64_t checkpoint_interval = 10;  // k (0: one segment, the whole unit)
  uint32_t verifiers_per_unit = 1;    // V (UnitCheckConfig::verifiers_per_unit)
};

enum class CheatSpread : uint8_t {
  kCheatSpreadSteps = 0,  // the faked steps are a uniform random subset of the unit's steps
  kCheatSpreadSegments,   // the faked steps fill the fewest whole segments
};

// How a solver cheats on every unit (until caught). faked_fraction 0 is an honest solver;
// 1 a lazy one (every segment wrong, nothing computed).
struct CheatPattern {
  double faked_fraction = 0;  // f in [0, 1]
  CheatSpread spread = CheatSpread::kCheatSpreadSteps;
};

// n = ceil(f H) (a fraction within 1e-9 of a whole step counts as that step), at most H.
uint64_t FakedSteps(const CheatPattern& cheat, uint64_t inner_steps);

// q: probability that a checked unit of this cheater is caught (0 for an honest solver).
double DetectionIfChecked(const VerificationParams& params, const TaskShape& shape,
                          const CheatPattern& cheat);

// An honest node long past its probation (a clean streak of 10^6 verified units).
Reputation SteadyStateReputation();
// p of that node, permille: max(floor, ceil(1000 / streak)) = floor_permille.
uint32_t SteadyStatePermille(const VerificationParams& params);

// p V r / S: verifier compute per unit of solver compute for units checked with probability
// `check_permille`.
double VerifierOverhead(uint32_t check_permille, const VerificationParams& params,
                        const TaskShape& shape);

// One solver through one task of `shape.units_per_solver` units, starting from reputation
// `start`, cheating with `cheat` until caught. Exact: the distribution over the solver's streak
// is carried unit by unit, with p = VerificationProbabilityPermille at each.
struct SolverOutlook {
  double escape = 1;            // P(no unit of the task is caught)
  double expected_checks = 0;   // E[units checked] (all of them, also after a catch)
  double expected_cheated = 0;  // E[units cheated] (those up to and including the catch)
  double gain = 0;              // E[gain of cheating over honest work], in unit costs
};
SolverOutlook AnalyzeSolver(const VerificationParams& params, uint32_t slash_multiple,
                            const TaskShape& shape, const CheatPattern& cheat,
                            const Reputation& start);

// Mean verifier overhead over the first shape.units_per_solver units of a new honest node
// (Reputation{}: checked always for its first trusted_after units).
double NewNodeOverhead(const VerificationParams& params, const TaskShape& shape);

// The smallest whole slash multiple that makes `gain = s - d (1 + M)` negative; UINT32_MAX when
// d == 0 (no slash deters a cheat that is never caught).
uint32_t MinDeterringSlashMultiple(double saved_share, double detect_per_unit);

// A rubber-stamp verifier (approves without replaying) saves the replay, r/S of a unit's cost,
// per check, and is caught by a forced error with probability f = forced_error_per_million /
// 10^6 per check (whistleblowers only add to that), losing its pay for the check (r/S) and M
// unit costs. Its gain per check, in unit costs:
//   gain = r/S - f (r/S + M)
// negative iff f > (r/S) / (r/S + M). With r/S = 1/10 and M = 10 that is f > 0.99%.
double RubberStampGainPerCheck(const VerificationParams& params, uint32_t slash_multiple,
                               const TaskShape& shape);

// The headline numbers, for a cheater and an honest node at the steady state.
struct EconomicsReport {
  uint32_t segments = 0;            // S
  uint32_t segments_replayed = 0;   // r
  uint32_t check_permille = 0;      // p x 1000 at the steady state (the floor)
  double saved_share = 0;           // s
  double detect_if_checked = 0;     // q
  double detect_per_unit = 0;       // d = p q
  double escape_task = 0;           // (1 - d)^U
  double gain_per_unit = 0;         // s - d (1 + M), in unit costs
  double gain_task = 0;             // over the task (AnalyzeSolver), in unit costs
  uint32_t min_slash_multiple = 0;  // MinDeterringSlashMultiple(s, d)
  double overhead = 0;              // p V r / S at the steady state
  double new_node_overhead = 0;     // NewNodeOverhead
  double forced_error_rerun = 0;    // forced_error_per_million / 10^6 of a unit, on top
};
EconomicsReport AnalyzeEconomics(const VerificationParams& params, uint32_t slash_multiple,
                                 const TaskShape& shape, const CheatPattern& cheat);

// ---- Monte-Carlo check of the formulas with the ledger's real draws.
// Simulates `tasks` independent tasks of one solver starting from reputation `start`. Unit u of
// task t gets the beacon BLAKE2b(seed, t, u); SelectedForVerification with the solver's current
// VerificationProbabilityPermille decides whether it is checked, SegmentsToReplay which segments
// are replayed. The cheater picks its faked steps (or segments) from its own seeded stream. The
// committed leaves are a hash chain (an honest segment's end is one function of its start, a
// faked segment's another); a verifier "replays" a segment by recomputing the honest end from the
// committed start and flags the unit when it differs from the committed end. A flagged unit
// slashes the solver (later units: p = 1, honest); a clean check lengthens its streak, as
// UnitCheck settles them. Deterministic in (arguments, seed).
struct SimulatedSolver {
  uint64_t tasks = 0;
  uint64_t tasks_escaped = 0;  // no unit of the task flagged
  uint64_t units = 0;
  uint64_t units_checked = 0;
  uint64_t units_flagged = 0;  // every flag (an honest solver must have none)
  uint64_t cheated = 0;        // units that carried faked steps
  uint64_t cheated_checked = 0;
  uint64_t cheated_caught = 0;
  uint64_t replayed_steps = 0;  // steps replayed, summed over the V verifiers
  uint64_t solver_steps = 0;    // units x H
  double gain_sum = 0;          // per task, in unit costs (for the mean and its standard error)
  double gain_sq_sum = 0;
};
SimulatedSolver SimulateSolver(const VerificationParams& params, uint32_t slash_multiple,
                               const TaskShape& shape, const CheatPattern& cheat,
                               const Reputation& start, uint64_t tasks, uint64_t seed);

}  // namespace meshlearn::protocol
