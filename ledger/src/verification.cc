// Verified training: the ledger runs one protocol::UnitCheck per committed unit (kept encoded in
// WorkUnit::check) and applies what it decides (docs/verification.md).
//
//   CommitUnit     opens the check: the solver's next secret is bound to the unit, the round's
//                  finality is held until the check settles
//   CommitVerdict  a drawn verifier's sealed verdict           -> UnitCheck::OnVerdictCommitted
//   RevealVerdict  ... opened, with a mismatch's evidence       -> UnitCheck::OnVerdictRevealed
//   RevealSecret   the solver's secret for the unit             -> UnitCheck::OnSecretRevealed
//   DisputePost    a party's move in the bisection game         -> DisputeGame::Post
//   DisputeChildren  phase 3's move: the two children of a tile node -> DisputeGame::PostChildren
//   ChallengeUnit  a whistleblower disputes a settled unit      -> UnitCheck::OnChallenge
//   ProveMerits    after the solver lost a whistleblower's dispute by its silence alone: the
//                  witness of the disputed segment, replayed as ProveFraud's (ExecuteSegment-
//                  Witness); it does not reach the committed end -> UnitCheck::OnMeritsShown
//   RefereeStep    the witness of the narrowed step: the ledger executes it itself (a task
//                  with a data root, exact mode; referee_step.h)    -> DisputeGame::Rule
//   RefereeTile    the witness of the narrowed tile (a dispute opened with the task bundle:
//                  the tile phase): the ledger recomputes it (referee_tile.h) -> DisputeGame::Rule;
//                  or, for the whole steps of the tile phase ruled from roots (the chain end
//                  agreed, an input-state operator), a witness of operator output roots
//                  (RuleRoots; a pipeline stage's: its committed commit and roots,
//                  stage_referee.h RuleStageRoots) -> DisputeGame::Rule / RuleOperator
//   ProveResult    the witness that a unit's result is not the delta of its committed final
//                  state: the ledger computes it; fraud at once -> UnitCheck::OnResultDisproved
//   ProveFraud     after the fact (a final round): the witness of one segment that does not
//                  replay to its committed end (a pipeline stage's: of one step, as
//                  RefereeStageStep's); the ledger replays it; the solver slashed,
//                  its pay for the unit clawed back, the prover's bounty, the round marked;
//                  while the task is open or within its audit window after it finished, the
//                  task is reopened and rewound as taint does (ApplyRerun)
//   CommitProof    (proof_commits.cc) a prover's commitment to the witness of a ProveFraud,
//                  ProveResult or ProveMerits it will send: each pays its bounty to the earliest
//                  committer to its witness (TakeProofCommitter), not to whoever sent it first
//   LateChallenge  after the fact, for a unit whose segment witness does not fit a ProveFraud:
//                  opens a DisputeGame on the unit of a final round (WorkUnit::late), the solver
//                  against the sender, whose moves are DisputePost / DisputeChildren and whose
//                  rulings RefereeStep / RefereeTile, as a live dispute's; DriveLateGames (end of
//                  block) keeps its deadlines; ruled for the challenger: ProveFraud's effects
//                  (ApplyProvenFraud); for the solver: the bond pays its re-run (SettleLateGame)
//   RefereeStageStep  the witness of a pipeline stage's disputed step (the whole stage step:
//                  checkpoint, commit, received tensors, batch; stage_referee.h): the ledger
//                  replays it itself -> DisputeGame::Rule
//   ServeStageEvidence  one piece of a stage's step evidence (stage_serve.h), answering a claim
//                  that a stage over the witness bound served nothing for the step: checked
//                  alone, recorded in the unit's StageServeRecord; the last piece rules the claim
//                  served -> DisputeGame::RuleServed(true) (nobody slashed; the step is then
//                  checked by a ChallengeUnit from the evidence on chain); a piece missing at the
//                  serving window's end rules against the stage -> RuleServed(false) (EndBlock)
//   RuleDispute    the genesis referee's ruling, for what the ledger cannot execute: a
//                  tolerance-mode segment, a whole step of a token task played without the tile
//                  phase -> DisputeGame::Rule; refused for whatever the ledger rules, every
//                  pipeline stage's claim included. (A verifying chain refuses an
//                  exact-mode task without a data root at SubmitTask: ValidateTaskTerms.)
//   EndBlock       beacons, closed windows, deadlines -> effects: slash, pay verifiers, jackpot,
//                  reputation; fraud rewinds the round, a forced error or an abandoned unit
//                  re-runs that unit (DriveChecks)
//
// Deterministic like the rest of the runtime: the only randomness is the block seed.
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "execute.h"
#include "meshlearn/base/log.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/protocol/decompose.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "referee_step.h"

namespace meshlearn::ledger {
namespace {

using protocol::CheckEffects;
using protocol::CheckStage;
using protocol::UnitCheck;

Result<UnitCheck> LoadCheck(const WorkUnit& u) {
  Result<UnitCheck> c = UnitCheck::Decode(u.check);
  if (!c.ok()) {
    return DataLoss("unit " + std::to_string(u.index) + " of task " + u.task_id.ShortHex() +
                    ": " + c.status().message());
  }
  return c;
}

void SaveCheck(LedgerState& s, const Hash256& task_id, uint32_t index, const UnitCheck& c) {
  Bytes enc = c.Encode();
  const WorkUnit* u = s.units.Find({task_id, index});
  if (u == nullptr || u->check == enc) return;
  s.units.FindMutable({task_id, index})->check = std::move(enc);
}

// The unit a verification transaction names: open task, existing unit, under check.
Result<const WorkUnit*> CheckedUnit(const LedgerState& s, const Hash256& task_id, uint32_t index,
                                    std::string_view what) {
  ML_ASSIGN_OR_RETURN(const TaskRecord* t, OpenTaskFor(s, task_id, what));
  if (index >= t->unit_count) {
    return InvalidArgument(std::string(what) + ": index " + std::to_string(index) +
                           " is out of range; task " + task_id.ShortHex() + " has " +
                           std::to_string(t->unit_count) + " units");
  }
  const WorkUnit* u = s.units.Find({task_id, index});
  if (u == nullptr || u->check.empty()) {
    return FailedPrecondition(std::string(what) + ": unit " + std::to_string(index) +
                              " of task " + task_id.ShortHex() +
                              " is not under verification (not committed, or its round re-ran)");
  }
  return u;
}

MerkleProof ProofOf(const MerkleProofField& f) {
  return MerkleProof{.index = f.index, .leaf_count = f.leaf_count, .siblings = f.siblings};
}

protocol::MismatchClaim ClaimOf(const MismatchClaimField& f) {
  protocol::MismatchClaim c;
  c.segment = f.segment;
  c.start = f.start;
  c.start_proof = ProofOf(f.start_proof);
  c.solver_end = f.solver_end;
  c.end_proof = ProofOf(f.end_proof);
  c.replayed_end = f.replayed_end;
  return c;
}

// Who may sign RuleDispute: the genesis referee, else the sequencer.
PublicKey RefereeKey(const Genesis& g) { return g.referee == PublicKey{} ? g.sequencer : g.referee; }

// The nodes a check may draw its verifiers from, in id order (UnitCheck draws from them; the
// solver is skipped there): every active verifier, and those of them live at `height` (a
// heartbeat within liveness_blocks, HeartbeatLive: the scheduler's rule for placing work).
struct VerifierPool {
  std::vector<protocol::NodeId> active, live;
};
VerifierPool VerifierCandidates(const LedgerState& s, const Genesis& g, uint64_t height) {
  const protocol::SchedulerParams sp = SchedulerParamsOf(g);
  VerifierPool out;
  for (const auto& [id, n] : s.nodes.rows()) {
    if ((n.roles & kRoleVerifier) == 0 || n.status != NodeStatus::kActive) continue;
    out.active.push_back(id);
    if (protocol::HeartbeatLive(n.last_heartbeat_height, height, sp)) out.live.push_back(id);
  }
  return out;
}

// The candidates that may verify unit `index`: for a stage unit, none of its replica's nodes
// (they signed the stage's inputs or used its outputs: a neighbour has a stake in its verdict).
std::vector<protocol::NodeId> StageVerifierCandidates(const LedgerState& s, const Hash256& task_id,
                                                      uint32_t index,
                                                      std::vector<protocol::NodeId> candidates) {
  const TaskParams& p = s.tasks.Find(task_id)->params;
  if (!IsPipelineTask(p)) return candidates;
  const StageSlot slot = StageSlotOf(p, index);
  for (uint32_t stage = 0; stage < p.stages; ++stage) {
    const WorkUnit* w =
        s.units.Find({task_id, StageUnitIndex(p, {slot.round, slot.replica, stage})});
    if (w != nullptr) std::erase(candidates, w->assignee);
  }
  return candidates;
}

// The candidates a check draws from: the live ones that may verify unit `index` (not its solver,
// StageVerifierCandidates), so a node that fell silent -- killed, cut off -- is not drawn to a
// check it would let wait out its commit window. Where none of them is live (a chain whose
// verifiers do not heartbeat), every active one, as before liveness counted. Where every
// candidate is live, both are the same list: the draw is what it was.
//
// Neither list holds a node linked to the solver (LinkedToCheater: its own key, its owner's
// account, any node of that owner): one operator on both sides could approve its own lazy work
// without a replay, and catch its own forced errors from the secret it holds. Where every
// candidate is so linked the list is empty, as on a chain with no verifier: an economic check
// settles unchecked, a full or target one waits for a beacon with an unlinked verifier
// (UnitCheck::OnBeacon). A chain whose nodes each have their own owner draws as before.
std::vector<protocol::NodeId> DrawableVerifiers(const LedgerState& s, const Hash256& task_id,
                                                uint32_t index, const protocol::NodeId& solver,
                                                const VerifierPool& pool) {
  auto unlinked = [&](const std::vector<protocol::NodeId>& from) {
    std::vector<protocol::NodeId> out = StageVerifierCandidates(s, task_id, index, from);
    std::erase_if(out, [&](const protocol::NodeId& n) { return LinkedToCheater(s, solver, n); });
    return out;
  };
  std::vector<protocol::NodeId> live = unlinked(pool.live);
  if (!live.empty()) return live;
  return unlinked(pool.active);
}

protocol::Reputation ReputationOf(const NodeRecord& n) {
  protocol::Reputation r;
  r.completed = n.reputation.units_completed;
  r.verified_clean = n.reputation.units_verified_clean;
  r.clean_streak = n.reputation.clean_streak;
  r.failures = n.reputation.failures;
  r.slashes = n.reputation.slashes;
  return r;
}

// Pays `amount` from the jackpot pool, split equally among `winners` (their owners), never more
// than the pool holds; each winner's earnings record its share.
Status PayJackpotShares(LedgerState& s, const std::vector<protocol::NodeId>& winners,
                        Amount amount, Amount* paid) {
  if (winners.empty()) return Status::Ok();
  Amount share = std::min(amount, s.g().jackpot) / winners.size();
  if (share == 0) return Status::Ok();
  for (const protocol::NodeId& w : winners) {
    const NodeRecord* n = s.nodes.Find(w);
    if (n == nullptr) continue;
    ML_RETURN_IF_ERROR(PayFromJackpot(s, n->owner, share));
    NodeEarnings& e = s.nodes.FindMutable(w)->earnings;
    ML_RETURN_IF_ERROR(CheckedAdd(e.jackpot, share, &e.jackpot, "node earnings"));
    e.jackpot_wins++;
    *paid += share;
  }
  return Status::Ok();
}

// SlashNode, and the node's earnings record what it lost.
Status SlashAndRecord(LedgerState& s, const ChainParams& p, const protocol::NodeId& node,
                      Amount amount, Amount* slashed) {
  ML_RETURN_IF_ERROR(SlashNode(s, p, node, amount, slashed));
  NodeEarnings& e = s.nodes.FindMutable(node)->earnings;
  return CheckedAdd(e.slashed, *slashed, &e.slashed, "node earnings");
}

// Slashes a cheating solver; "the cheater's stake pays for the redo": up to `redo_rounds`
// rounds' most cost of what went to the treasury is added to the task's escrow (and budget).
Status SlashSolverIntoEscrow(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                             const protocol::NodeId& solver, Amount amount, Amount* slashed_out,
                             Amount* to_escrow_out, uint32_t redo_rounds = 1) {
  Amount slashed = 0;
  ML_RETURN_IF_ERROR(SlashAndRecord(s, p, solver, amount, &slashed));
  *slashed_out = slashed;
  const TaskRecord* t = s.tasks.Find(task_id);
  TaskParams one_round = t->params;  // the most the redo can cost: MaxTaskCost of its rounds
  one_round.rounds = redo_rounds;
  const Amount redo = MaxTaskCost(one_round, t->price_cap, nullptr, p.verifiers_per_unit);
  Amount to_escrow = std::min({redo, slashed - BasisPoints(slashed, p.slash_jackpot_bps),
                               s.g().treasury});
  if (to_escrow == 0) return Status::Ok();
  Globals* g = s.MutableGlobals();
  g->treasury -= to_escrow;
  *to_escrow_out = to_escrow;
  TaskRecord* mt = s.tasks.FindMutable(task_id);
  ML_RETURN_IF_ERROR(CheckedAdd(mt->escrow, to_escrow, &mt->escrow, "task escrow"));
  return CheckedAdd(mt->budget, to_escrow, &mt->budget, "task budget");
}

// What the effects of a block's checks ask of the task: fraud re-runs the whole round (its
// cheater excluded); a forced error or an abandoned unit re-runs that unit only. `round` is the
// earliest round that must run again: when it is a settling round (an earlier one than the
// current round, rounds in flight), the rounds trained on its aggregate go with it.
struct Rerun {
  bool whole_round = false;
  uint32_t round = UINT32_MAX;
  std::vector<uint32_t> shards;  // of `round`
  std::vector<protocol::NodeId> exclude;
  std::vector<protocol::NodeId> cheaters;  // proven fraudulent: their earlier work is tainted
  // Pipeline tasks: each stage unit proven fraudulent (by index) with the steps of it that came
  // before the proven false one (its replica's stages did those honestly).
  std::vector<std::pair<uint32_t, uint64_t>> stage_faults;
  // Pipeline tasks: each stage unit (by index) settled as a forced error. Its replica re-runs
  // whole, and its other stages are paid their whole cost (PayHonestStageWork).
  std::vector<uint32_t> forced_stages;
};

// Applies one event's effects for unit `index`, noting in *rerun what must run again.
Status ApplyEffects(LedgerState& s, const ChainParams& p, const Hash256& task_id, uint32_t index,
                    const UnitCheck& c, const CheckEffects& fx, Rerun* rerun) {
  const TaskRecord* t = s.tasks.Find(task_id);
  const WorkUnit* u = s.units.Find({task_id, index});
  // A stage unit's check is priced by its stage: its verifiers are paid, and its cheater slashed,
  // from the stage's share of the unit, as its solver is paid.
  const Amount unit_cost = AssignedUnitCost(*t, *u);
  const Amount slash = protocol::SlashAmount(unit_cost, p.slash_multiple);
  const protocol::NodeId solver = c.config().solver;
  VerificationTally tally = t->verification;
  Amount solver_slashed = 0;  // what this event's slash of the solver took
  for (const protocol::NodeId& n : fx.slash) {
    Amount slashed = 0, to_escrow = 0;
    if (n == solver) {
      ML_RETURN_IF_ERROR(SlashSolverIntoEscrow(s, p, task_id, n, slash, &slashed, &to_escrow));
      solver_slashed = slashed;
    } else {
      ML_RETURN_IF_ERROR(SlashAndRecord(s, p, n, slash, &slashed));
    }
    tally.slashed += slashed;
    tally.redo_escrow += to_escrow;
  }
  for (const protocol::NodeId& n : fx.failures) CountFailure(s, n);
  // Rewards from the jackpot, never to the solver's own nodes (LinkedToCheater): a solver's owner
  // catching, challenging or proving its own unit would get back what its slash took, or, for a
  // forced error, be paid for a mismatch its secret told it of without a replay.
  auto unlinked = [&](const std::vector<protocol::NodeId>& nodes) {
    std::vector<protocol::NodeId> out;
    for (const protocol::NodeId& n : nodes) {
      if (!LinkedToCheater(s, solver, n) && std::find(out.begin(), out.end(), n) == out.end()) {
        out.push_back(n);
      }
    }
    return out;
  };
  // A forced error's catchers share the jackpot, one slash each at most: nobody is slashed for a
  // forced error, the pool is what pays for catching one.
  const std::vector<protocol::NodeId> catchers = unlinked(fx.jackpot_winners);
  ML_RETURN_IF_ERROR(PayJackpotShares(s, catchers, slash * catchers.size(), &tally.jackpot_paid));
  // A verifier's dispute won against the solver, and a whistleblower's win: never more than this
  // event's slash of the solver took (as ProveFraud's bounty), so a solver and its challenger in
  // league never gain (a solver whose stake is spent, by an earlier slash or by unbonding, would
  // otherwise fund a whole slash's reward from the jackpot, which other slashes filled, for each
  // unit it loses); a whistleblower winning by the solver's silence alone gets only what that
  // slash put into the jackpot.
  for (const protocol::NodeId& n : unlinked(fx.rewarded)) {
    ML_RETURN_IF_ERROR(PayJackpotShares(s, {n}, solver_slashed, &tally.jackpot_paid));
  }
  if (fx.bounty && !unlinked({*fx.bounty}).empty()) {
    const Amount bounty =
        fx.bounty_by_silence ? BasisPoints(solver_slashed, p.slash_jackpot_bps) : solver_slashed;
    ML_RETURN_IF_ERROR(PayJackpotShares(s, {*fx.bounty}, bounty, &tally.jackpot_paid));
  }
  const uint32_t segments =
      protocol::SegmentCount(c.config().inner_steps, c.config().checkpoint_interval);
  // A stage unit's check also replays the stage's last step to bind its result (its segments
  // are its steps): paid for the steps it replays, not only the drawn ones.
  const uint32_t replayed = IsPipelineTask(t->params)
                                ? protocol::StageStepsReplayed(c.segments(), c.config().inner_steps)
                                : static_cast<uint32_t>(c.segments().size());
  const Amount verifier_pay = protocol::VerifierPay(unit_cost, replayed, segments);
  for (const protocol::NodeId& n : fx.pay_verifiers) {
    const NodeRecord* node = s.nodes.Find(n);
    Amount amount = std::min(verifier_pay, s.tasks.Find(task_id)->escrow);
    if (node == nullptr || amount == 0) continue;
    ML_RETURN_IF_ERROR(PayFromEscrow(s, p, task_id, node->owner, amount));
    NodeEarnings& e = s.nodes.FindMutable(n)->earnings;
    ML_RETURN_IF_ERROR(CheckedAdd(e.verification, amount, &e.verification, "node earnings"));
    e.checks_paid++;
    tally.verifiers_paid += amount;
  }
  if (fx.settled) {
    switch (c.result()) {
      case protocol::CheckResult::kCheckClean: ++tally.clean; break;
      case protocol::CheckResult::kCheckUnchecked: ++tally.unchecked; break;
      case protocol::CheckResult::kCheckFraud: ++tally.fraud; break;
      case protocol::CheckResult::kCheckForcedError: ++tally.forced_error; break;
      case protocol::CheckResult::kCheckAbandoned: ++tally.abandoned; break;
      case protocol::CheckResult::kCheckPending: break;
    }
    if (c.dispute() && c.dispute()->stage() == protocol::DisputeStage::kDisputeResolved) {
      ++tally.disputes;
    }
  }
  if (tally != s.tasks.Find(task_id)->verification) {
    s.tasks.FindMutable(task_id)->verification = tally;
  }
  if (fx.solver_clean) {
    if (NodeRecord* n = s.nodes.FindMutable(solver)) {
      n->reputation.units_verified_clean++;
      n->reputation.clean_streak++;
    }
  }
  // A forced stage's real leaves were never checked, so its delta is not usable, and a stage
  // cannot train again alone (RerunPartialReplicas): its whole replica re-runs, once the checks of
  // its other committed stages have settled (RerunForcedReplicas), so that each of them is paid
  // only if its own check settled clean (PayHonestStageWork).
  const bool forced_stage =
      IsPipelineTask(t->params) && c.result() == protocol::CheckResult::kCheckForcedError;
  if (fx.rerun_unit && !forced_stage) {
    if (u->round < rerun->round) rerun->shards.clear();  // an earlier round re-runs whole
    rerun->round = std::min(rerun->round, u->round);
    if (c.result() == protocol::CheckResult::kCheckFraud) {
      rerun->whole_round = true;
    } else if (u->round == rerun->round) {
      rerun->shards.push_back(u->shard);
    }
    // A cheater, or a solver that vanished (its failure is counted): the re-run goes without
    // it. A forced error or an undecided dispute excludes nobody.
    if (c.result() == protocol::CheckResult::kCheckFraud ||
        std::find(fx.failures.begin(), fx.failures.end(), solver) != fx.failures.end()) {
      rerun->exclude.push_back(solver);
    }
    if (c.result() == protocol::CheckResult::kCheckFraud) {
      rerun->cheaters.push_back(solver);
      if (IsPipelineTask(t->params)) {
        // Check segment t of a stage unit is its step t, the game's (1-based) step t + 1:
        // steps 0..t-1 came before the false one, whether the referee ruled the step or the
        // stage fell silent in its operator or tile phase. Fraud not narrowed to a step: none did.
        const bool at_step = c.dispute() && c.dispute()->stage() ==
                                                protocol::DisputeStage::kDisputeResolved;
        const uint64_t step = at_step ? c.dispute()->step() : 0;
        rerun->stage_faults.emplace_back(index, step > 0 ? step - 1 : 0);
      }
    }
  }
  return Status::Ok();
}

// The earliest round before `before` holding a unit of one of `cheaters` that went into an
// aggregate: paid (a final round) or committed (a settling round); `before` when there is none.
uint32_t FirstTaintedRound(const LedgerState& s, const Hash256& task_id,
                           const std::vector<protocol::NodeId>& cheaters, uint32_t before) {
  const uint32_t per_round = s.tasks.Find(task_id)->params.units_per_round;
  for (uint32_t r = 0; r < before; ++r) {
    for (uint32_t shard = 0; shard < per_round; ++shard) {
      const WorkUnit* w = s.units.Find({task_id, r * per_round + shard});
      if (w != nullptr &&
          (w->status == WorkUnitStatus::kVerified || w->status == WorkUnitStatus::kCommitted) &&
          std::find(cheaters.begin(), cheaters.end(), w->assignee) != cheaters.end()) {
        return r;
      }
    }
  }
  return before;
}

// Whether stage unit `w`'s own check settled clean (or it had none): what its discarded work must
// show to be paid when its replica re-runs for a forced stage.
bool SettledClean(const WorkUnit& w) {
  if (w.check.empty()) return true;
  Result<UnitCheck> c = UnitCheck::Decode(w.check);
  return c.ok() && c->stage() == CheckStage::kCheckSettled &&
         (c->result() == protocol::CheckResult::kCheckClean ||
          c->result() == protocol::CheckResult::kCheckUnchecked);
}

// Each replica of rounds [from, to] with a committed stage whose check settled as a forced error,
// once no committed stage of it has a check still open: noted in *rerun to re-run whole now, its
// forced stages in forced_stages (PayHonestStageWork pays the others whose checks settled clean).
// A sibling's check left open would be dropped with the reset, and the sibling paid for work no
// check ruled on (a lazy stage was: PipelineNetworkTest.ALazyStageDrawnForAForcedErrorIsCaught-
// OnItsRerun); waiting for it keeps the round unfinal (its holds), and fraud it rules re-runs
// the round whole.
void RerunForcedReplicas(const LedgerState& s, const Hash256& task_id, uint32_t from, uint32_t to,
                         Rerun* rerun) {
  const TaskParams& params = s.tasks.Find(task_id)->params;
  if (!IsPipelineTask(params) || params.stages == 0) return;
  const uint32_t replicas = params.units_per_round / params.stages;
  for (uint32_t round = from; round <= to; ++round) {
    for (uint32_t replica = 0; replica < replicas; ++replica) {
      std::vector<uint32_t> forced;
      bool open = false;
      for (uint32_t stage = 0; stage < params.stages; ++stage) {
        const uint32_t index = StageUnitIndex(params, {round, replica, stage});
        const WorkUnit* w = s.units.Find({task_id, index});
        if (w == nullptr || w->status != WorkUnitStatus::kCommitted || w->check.empty()) continue;
        Result<UnitCheck> c = UnitCheck::Decode(w->check);
        if (!c.ok() || c->stage() != CheckStage::kCheckSettled) {
          open = true;
        } else if (c->result() == protocol::CheckResult::kCheckForcedError) {
          forced.push_back(index);
        }
      }
      if (forced.empty() || open) continue;
      if (round < rerun->round) rerun->shards.clear();  // an earlier round re-runs whole
      rerun->round = std::min(rerun->round, round);
      rerun->forced_stages.insert(rerun->forced_stages.end(), forced.begin(), forced.end());
      if (round != rerun->round) continue;
      for (uint32_t stage = 0; stage < params.stages; ++stage) {
        rerun->shards.push_back(StageUnitIndex(params, {round, replica, stage}) -
                                round * params.units_per_round);
      }
    }
  }
}

// A pipeline round re-run after fraud: the stage work of it that no proven-false tensor reached
// is paid now, since the re-run discards it (issue 15: "the honest stages of that replica are
// paid for the work they did honestly, and nobody is paid for work built on a proven-false
// input"). A replica without a fault was trained from the round's honest start: each of its
// committed stages gets its whole StageUnitCost. In a replica with a stage proven false at step
// k, every stage's steps from k on used (or fed) that step's tensors, so each of its honest stages
// gets k / H of its cost. The cheaters get nothing, and the redo is paid as any unit is. Rounds
// trained on top of the fraud round's aggregate are built on false input: not paid.
//
// A replica of the re-run round with a stage settled as a forced error re-runs too (a round
// without fraud re-runs only those replicas): nothing false was sent, so its other stages get
// their whole cost; the drawn stage, as a forced unit, is paid for its re-run only.
Status PayHonestStageWork(LedgerState& s, const ChainParams& p, const Hash256& task_id,
                          const Rerun& rerun) {
  const TaskRecord* t = s.tasks.Find(task_id);
  const bool fraud = rerun.whole_round && !rerun.stage_faults.empty();
  if (!IsPipelineTask(t->params) || (!fraud && rerun.forced_stages.empty())) {
    return Status::Ok();
  }
  const TaskParams& params = t->params;
  // The steps paid to each replica of the round that re-runs: the earliest false step of a
  // faulty one, all of a forced one's.
  std::map<uint32_t, uint64_t> honest_steps;
  for (const auto& [index, steps] : fraud ? rerun.stage_faults
                                          : std::vector<std::pair<uint32_t, uint64_t>>{}) {
    const StageSlot slot = StageSlotOf(params, index);
    if (slot.round != rerun.round) continue;
    auto [it, fresh] = honest_steps.emplace(slot.replica, steps);
    if (!fresh) it->second = std::min(it->second, steps);
  }
  std::set<uint32_t> forced_replicas;  // with a forced stage and no false step
  for (uint32_t index : rerun.forced_stages) {
    const StageSlot slot = StageSlotOf(params, index);
    if (slot.round != rerun.round) continue;
    if (honest_steps.emplace(slot.replica, params.inner_steps).second) {
      forced_replicas.insert(slot.replica);
    }
  }
  for (uint32_t shard = 0; shard < params.units_per_round; ++shard) {
    const uint32_t index = rerun.round * params.units_per_round + shard;
    const WorkUnit* w = s.units.Find({task_id, index});
    if (w == nullptr || w->status != WorkUnitStatus::kCommitted ||
        std::find(rerun.cheaters.begin(), rerun.cheaters.end(), w->assignee) !=
            rerun.cheaters.end() ||
        std::find(rerun.forced_stages.begin(), rerun.forced_stages.end(), index) !=
            rerun.forced_stages.end()) {
      continue;
    }
    const StageSlot slot = StageSlotOf(params, index);
    const auto fault = honest_steps.find(slot.replica);
    if (fault == honest_steps.end() && !fraud) continue;  // a replica that keeps its work
    // A forced stage's sibling only for work its own check ruled clean.
    if (forced_replicas.contains(slot.replica) && !SettledClean(*w)) continue;
    const uint64_t steps = fault == honest_steps.end() ? params.inner_steps : fault->second;
    const Amount cost = AssignedUnitCost(*t, *w);
    const uint64_t h = std::max<uint64_t>(params.inner_steps, 1);  // cost x steps / h, steps <= h
    const Amount amount =
        std::min(cost / h * steps + cost % h * steps / h, s.tasks.Find(task_id)->escrow);
    const NodeRecord* n = s.nodes.Find(w->assignee);
    if (amount == 0 || n == nullptr) continue;
    ML_RETURN_IF_ERROR(PayFromEscrow(s, p, task_id, n->owner, amount));
    NodeEarnings& e = s.nodes.FindMutable(w->assignee)->earnings;
    ML_RETURN_IF_ERROR(CheckedAdd(e.units, amount, &e.units, "node earnings"));
    t = s.tasks.Find(task_id);
  }
  return Status::Ok();
}

// Applies what a block's checks asked (Rerun). Within the current round, a forced error or an
// abandoned unit re-runs only its units, the others keeping their commits and checks, and fraud
// re-runs the round from its start weights (every unit pending; the deterministic ones come
// back with the same results). Either way `exclude` (cheaters, vanished solvers) is failed and
// left out of what re-runs, and an aggregate of the round is dropped (it aggregates again). In
// a settling round the same happens after the task went back to it (RerunUnitsOf, RewindTo):
// the rounds trained on top of its aggregate are dropped (unpaid: not final).
//
// Taint (docs/verification.md): a proven cheater's earlier work in the task is not trusted
// either, checked clean or not (a check replays a sample of segments). When a cheater has units
// in earlier rounds, final or settling, the task goes back to the first of them: those rounds'
// units run again (the honest ones keep what they were paid; the redo is paid anew from the
// escrow), and what the cheater was paid for them comes back out of its stake into the escrow.
//
// A fraud proof after the fact (ExecuteProveFraud) asks for the same with `rerun.round` a final
// round, of an open task or of a finished one it reopened: the final rounds from the first
// tainted one on are rewound, and the unfinal ones (settling, current) dropped.
Status ApplyRerun(LedgerState& s, const Hash256& task_id, protocol::RoundStateMachine& m,
                  const Rerun& rerun) {
  if (rerun.round == UINT32_MAX) return Status::Ok();
  const uint32_t per_round = s.tasks.Find(task_id)->params.units_per_round;
  const uint32_t rounds = s.tasks.Find(task_id)->params.rounds;
  const uint32_t settled = s.tasks.Find(task_id)->rounds_settled;
  const uint32_t current = m.round();
  const std::vector<protocol::NodeId>& exclude = rerun.exclude;
  uint32_t first = rerun.round;
  if (rerun.whole_round) first = FirstTaintedRound(s, task_id, rerun.cheaters, rerun.round);
  if (!rerun.whole_round) {
    // A settling round goes back with its other commits; the rounds after it are dropped.
    ML_RETURN_IF_ERROR(m.RerunUnitsOf(rerun.round, rerun.shards, exclude));
    for (uint32_t shard : rerun.shards) {
      WorkUnit* w = s.units.FindMutable({task_id, rerun.round * per_round + shard});
      if (w == nullptr) continue;
      if (w->status == WorkUnitStatus::kCommitted &&
          std::find(exclude.begin(), exclude.end(), w->assignee) != exclude.end()) {
        ML_RETURN_IF_ERROR(FailWorkUnit(s, task_id, w->index));
      }
      ResetWorkUnit(w);
    }
    for (uint32_t index = (rerun.round + 1) * per_round; index < (current + 1) * per_round;
         ++index) {
      if (WorkUnit* w = s.units.FindMutable({task_id, index})) ResetWorkUnit(w);
    }
    TaskRecord* t = s.tasks.FindMutable(task_id);
    if (t->round_results.size() > rerun.round) t->round_results.resize(rerun.round);
    t->verification.rounds_dropped += current - rerun.round;
    return Status::Ok();
  }
  ML_RETURN_IF_ERROR(m.RewindTo(first, exclude));
  // Rounds [first, current] run again. The excluded nodes' unpaid commits in the round that
  // asked for the re-run, or later, are failures; what the cheaters were paid in final rounds
  // comes back.
  std::map<protocol::NodeId, Amount> paid_to_cheater;
  for (uint32_t index = first * per_round; index < (current + 1) * per_round; ++index) {
    WorkUnit* w = s.units.FindMutable({task_id, index});
    if (w == nullptr) continue;
    const bool excluded = std::find(exclude.begin(), exclude.end(), w->assignee) != exclude.end();
    if (w->status == WorkUnitStatus::kCommitted && excluded && w->round >= rerun.round) {
      ML_RETURN_IF_ERROR(FailWorkUnit(s, task_id, index));
    }
    if (w->status == WorkUnitStatus::kVerified &&
        std::find(rerun.cheaters.begin(), rerun.cheaters.end(), w->assignee) !=
            rerun.cheaters.end()) {
      paid_to_cheater[w->assignee] += w->paid;
    }
    ResetWorkUnit(w);
    w->paid = 0;
  }
  Amount clawed = 0;
  for (const auto& [node, amount] : paid_to_cheater) {
    ML_RETURN_IF_ERROR(ClawBack(s, task_id, node, amount, &clawed));
  }
  TaskRecord* t = s.tasks.FindMutable(task_id);
  if (t->round_results.size() > first) t->round_results.resize(first);
  t->rounds_settled = std::min(t->rounds_settled, first);
  if (rerun.round < settled) {  // after the fact: rounds [first, settled) were final
    t->verification.rounds_rewound += settled - first;
    t->verification.rounds_dropped += std::min(current + 1, rounds) - settled;
  } else {
    t->verification.rounds_rewound += rerun.round - first;
    t->verification.rounds_dropped += current - rerun.round;
  }
  t->verification.clawed_back += clawed;
  return Status::Ok();
}

}  // namespace

Status OpenUnitCheck(ExecContext& ctx, const Hash256& task_id, uint32_t index,
                     const PublicKey& solver, uint64_t secret_index,
                     protocol::RoundStateMachine& m, std::string_view what) {
  const ChainParams& p = ctx.params();
  const std::string w(what);
  NodeRecord* n = ctx.state.nodes.FindMutable(solver);
  if (n == nullptr) return NotFound(w + ": node " + solver.ToHex() + " is not registered");
  if (secret_index != n->secrets_committed + 1) {
    return InvalidArgument(w + ": secret_index must be " +
                           std::to_string(n->secrets_committed + 1) +
                           " (the node's next secret chain element), got " +
                           std::to_string(secret_index));
  }
  const uint64_t distance = secret_index - n->secret_anchor_index;
  if (distance > protocol::kMaxSecretDistance || secret_index > protocol::kSecretChainLength) {
    return FailedPrecondition(w + ": node " + solver.ShortHex() + " has " +
                              std::to_string(distance) +
                              " unrevealed secrets or an exhausted chain; reveal them first");
  }
  const TaskRecord* t = ctx.state.tasks.Find(task_id);
  const WorkUnit* u = ctx.state.units.Find({task_id, index});
  protocol::UnitCheckConfig cfg;
  cfg.unit = protocol::UnitId{task_id, u->round, u->shard};
  cfg.solver = solver;
  cfg.result = u->result_hash;
  cfg.commitment = u->commitment;
  cfg.inner_steps = t->params.inner_steps;
  cfg.checkpoint_interval = t->params.checkpoint_interval;
  cfg.forced_error_per_million = p.forced_error_per_million;
  if (IsPipelineTask(t->params)) {
    // A stage unit: segment t is step t, its end step t's leaf (protocol::StageCheckLeaves).
    // It is drawn for forced errors at the chain's rate, as a unit is; the ledger checks a drawn
    // stage's forced form from the step commits its RevealSecret carries (ForcedStageForm).
    cfg.commitment = MerkleRoot(u->leaves);
    cfg.checkpoint_interval = 1;
  }
  // Whole steps until a mismatch brings the task bundle: then UnitCheck::SetTilePhase sets the
  // step's plan (docs/verification.md, "Tiles").
  cfg.num_operators = 0;
  cfg.secret_anchor = n->secret_anchor;
  cfg.secret_distance = distance;
  cfg.assignment_beacon = u->assignment_beacon;
  cfg.commit_height = ctx.height;
  cfg.commit_blocks = p.verdict_commit_blocks;
  cfg.reveal_blocks = p.verdict_reveal_blocks;
  // A stage's turns fit a traced replay of its step (CheckResponseBlocks); a unit's are the
  // chain's flat dispute_response_blocks.
  cfg.dispute_response_blocks = CheckResponseBlocks(ctx.genesis, t->params, index);
  cfg.verifiers_per_unit = p.verifiers_per_unit;
  cfg.referee_blocks = p.referee_blocks;
  cfg.tolerance = t->params.tolerance_rel_l2_ppm != 0 || t->params.tolerance_cosine_gap_ppb != 0;
  Result<UnitCheck> c = UnitCheck::Create(cfg);
  if (!c.ok()) return c.status().WithPrefix(what);
  n->secrets_committed = secret_index;
  WorkUnit* mu = ctx.state.units.FindMutable({task_id, index});
  mu->secret_index = secret_index;
  mu->check = c->Encode();
  m.HoldFinality();
  return Status::Ok();
}

void AddAwaitingSecrets(const LedgerState& s, const Hash256& task_id,
                      const protocol::RoundStateMachine& m, AwaitingSecrets& awaiting) {
  if (m.phase() == protocol::RoundPhase::kRoundPhaseFinal) return;
  const uint32_t per_round = s.tasks.Find(task_id)->params.units_per_round;
  for (uint32_t index = m.final_rounds() * per_round; index < (m.round() + 1) * per_round;
       ++index) {
    const WorkUnit* u = s.units.Find({task_id, index});
    if (u == nullptr || u->check.empty()) continue;
    Result<UnitCheck> c = LoadCheck(*u);
    if (!c.ok() || !c->AwaitsVerdicts()) continue;
    auto [it, added] = awaiting.try_emplace(c->config().solver, u->secret_index);
    if (!added) it->second = std::min(it->second, u->secret_index);
  }
}

// A stage step's witness (RefereeStageStep) holds the stage's checkpoint and the tensors it
// received: the stage is the one party sure to hold them (a verifier whose finding is `unserved`
// was never given them). So when the ledger rules a stage's step itself (LedgerRulesStageStep)
// and nobody posted the witness by the referee's deadline, the stage loses, as a party that
// misses its turn does; an honest stage always can post its own. Without this, a stage that
// serves nothing would end its dispute undecided: its replica re-run, and it never punished.
Status RuleUnpostedStageStep(const TaskRecord& t, uint32_t index, uint64_t height, UnitCheck& c) {
  if (!IsPipelineTask(t.params) || c.stage() != CheckStage::kCheckDisputed) return Status::Ok();
  protocol::DisputeGame* game = c.mutable_dispute();
  // A continuity claim is the claimant's to prove (it holds both commits, and a stage cannot
  // disprove it: ContinuityStageClaim): unposted by the deadline, it loses, whatever the bound.
  if (game != nullptr && game->stage() == protocol::DisputeStage::kDisputeReferee &&
      game->config().referee_blocks != 0 && height > game->query().deadline_height &&
      game->referee_task().challenger_output ==
          StageContinuityLeaf(game->referee_task().defender_output)) {
    ML_LOG_INFO(
        "ledger: task {} unit {}: no continuity witness by the referee's deadline {}: "
        "ruled for the stage",
        t.id.ShortHex(), index, game->query().deadline_height);
    return game->Rule(game->referee_task().defender_output);
  }
  // A game with the tile phase (the stage's plan) ends at a tile or at roots whose witness both
  // parties hold (each traced the step): its unposted ruling ends undecided, as a unit's does.
  if (game == nullptr || game->stage() != protocol::DisputeStage::kDisputeReferee ||
      game->config().referee_blocks == 0 || height <= game->query().deadline_height ||
      !game->config().operator_tiles.empty() ||
      !LedgerRulesStageStep(t.params, StageSlotOf(t.params, index).stage)) {
    return Status::Ok();
  }
  ML_LOG_INFO("ledger: task {} unit {}: no stage step witness by the referee's deadline {}: "
              "ruled against the stage",
              t.id.ShortHex(), index, game->query().deadline_height);
  return game->Rule(game->referee_task().challenger_output);
}

// A claim that stage unit `index`, over the stage witness bound, served nothing for a step
// (UnservedStageClaim; docs/verification.md, "A stage claimed to have served nothing, over the
// witness bound") posts its bond: the declared stage's pieces x genesis
// params.serve_bond_per_piece (ServeBondOf; nothing for any other claim), from the claim's sender
// `payer`, held on the unit (WorkUnit::serve_bonds) until the claim is answered. One a claimant:
// its later claim on the unit keeps the bond it holds. A stage within the bound posts its whole
// step in one transaction (RefereeStageStep), and its claimant posts none. FailedPrecondition
// naming the bond and the balance when the payer cannot pay (the transaction is refused, and pays
// nothing).
static Status PostServeBond(LedgerState& s, const ChainParams& cp, const Hash256& task_id,
                            uint32_t index, const MismatchClaimField& claim,
                            const PublicKey& claimant, const PublicKey& payer,
                            std::string_view what) {
  const TaskParams& p = s.tasks.Find(task_id)->params;
  Result<Amount> bond = ServeBondOf(p, index, claim, cp.serve_bond_per_piece);
  if (!bond.ok()) return bond.status().WithPrefix(std::string(what));
  WorkUnit* u = s.units.FindMutable({task_id, index});
  if (*bond == 0) return Status::Ok();
  for (const ServeBond& b : u->serve_bonds) {
    if (b.claimant == claimant) return Status::Ok();
  }
  if (u->serve_bonds.size() >= WorkUnit::kMaxServeBonds) {
    return ResourceExhausted(std::string(what) + ": unit " + std::to_string(index) + " holds " +
                             std::to_string(u->serve_bonds.size()) +
                             " claims that it served nothing already; wait for them to be "
                             "answered");
  }
  Status paid = Debit(s, payer, *bond, "the serve bond");
  if (!paid.ok()) {
    return FailedPrecondition(
        std::string(what) + ": a claim that stage unit " + std::to_string(index) +
        " served nothing posts a bond of " + std::to_string(*bond) + " (" +
        std::to_string(*bond / cp.serve_bond_per_piece) +
        " pieces of its declared evidence x genesis params.serve_bond_per_piece " +
        std::to_string(cp.serve_bond_per_piece) +
        "), paid to the stage if it serves them on chain, back to the sender if not: " +
        paid.message() + "; fund the sender's account first");
  }
  u->serve_bonds.push_back({.claimant = claimant, .payer = payer, .amount = *bond});
  return Status::Ok();
}

// The serve bond `claimant` holds on unit `index`, if any, released: paid to the owner of node
// `stage` (the stage served every piece of its evidence: the claim is answered) or, with `stage`
// null, back to its payer (the stage did not serve, or the claim ended without it serving).
static Status ReleaseServeBond(LedgerState& s, const Hash256& task_id, uint32_t index,
                               const PublicKey& claimant, const PublicKey* stage) {
  WorkUnit* u = s.units.FindMutable({task_id, index});
  auto it = std::find_if(u->serve_bonds.begin(), u->serve_bonds.end(),
                         [&](const ServeBond& b) { return b.claimant == claimant; });
  if (it == u->serve_bonds.end()) return Status::Ok();
  const ServeBond bond = *it;
  u->serve_bonds.erase(it);
  PublicKey to = bond.payer;
  if (stage != nullptr) {
    const NodeRecord* n = s.nodes.Find(*stage);
    to = n != nullptr ? n->owner : *stage;
  }
  ML_LOG_INFO("ledger: task {} unit {}: the serve bond {} of {} {}", task_id.ShortHex(), index,
              bond.amount, claimant.ShortHex(),
              stage != nullptr ? "paid to the stage that served" : "back to its payer");
  return Credit(s, to, bond.amount);
}

// Every serve bond still held on unit `index` back to its payer: the unit's check settled or was
// dropped (a re-run), or its task closed, without the stage serving those claims.
Status RefundServeBonds(LedgerState& s, const Hash256& task_id, uint32_t index) {
  WorkUnit* u = s.units.FindMutable({task_id, index});
  while (u != nullptr && !u->serve_bonds.empty()) {
    ML_RETURN_IF_ERROR(ReleaseServeBond(s, task_id, index, u->serve_bonds.front().claimant,
                                        nullptr));
  }
  return Status::Ok();
}

// The serving window of a stage over the witness bound claimed to have served nothing
// (stage_serve.h): from the block its dispute is at the referee, the ledger takes the stage's
// evidence in pieces (ServeStageEvidenceTx) until ServeWindowBlocks of the declared stage after
// the referee's deadline, which the game's deadline is extended to. With referee_blocks 0 (no
// referee deadline) the window has the same bound, from the height the game reached the referee:
// a stage that posts nothing must not hold its claim, and its round, forever. Opens `u`'s record
// for the dispute's step (once) and returns whether the game waits for pieces. A record of another
// dispute is dropped.
Result<bool> OpenServeWindow(const TaskParams& p, WorkUnit& u, protocol::DisputeGame& game) {
  if (!ServesStageEvidence(p, u.index, game)) {
    u.serve = StageServeRecord{};
    return false;
  }
  const uint64_t step = game.referee_task().step;
  if (u.serve.open() && u.serve.step == step) return true;
  const uint64_t end = ServeWindowEnd(game.query().deadline_height,
                                      p.stage_memory_bytes[StageSlotOf(p, u.index).stage], 0);
  u.serve = StageServeRecord{.step = step, .window_end = end, .pieces = 0, .served = {}};
  ML_RETURN_IF_ERROR(game.ExtendRefereeDeadline(end));
  return true;
}

// At the end of its serving window a stage that has not posted every piece of its evidence loses,
// as a party that misses its turn does: the claim that it served nothing stands. (The piece that
// completes the evidence rules the claim at once: ExecuteServeStageEvidence.)
Status DriveServeWindow(LedgerState& s, const TaskRecord& t, uint32_t index, uint64_t height,
                        UnitCheck& c) {
  protocol::DisputeGame* game = c.mutable_dispute();
  const WorkUnit* u = s.units.Find({t.id, index});
  if (!IsPipelineTask(t.params) || c.stage() != CheckStage::kCheckDisputed || game == nullptr ||
      (!u->serve.open() && !ServesStageEvidence(t.params, index, *game))) {
    return Status::Ok();
  }
  WorkUnit* mu = s.units.FindMutable({t.id, index});
  ML_ASSIGN_OR_RETURN(const bool serving, OpenServeWindow(t.params, *mu, *game));
  if (!serving || height <= mu->serve.window_end) return Status::Ok();
  ML_LOG_INFO("ledger: task {} unit {}: the stage's evidence incomplete at the end of its serving "
              "window {}: ruled against the stage",
              t.id.ShortHex(), index, mu->serve.window_end);
  const uint64_t end = mu->serve.window_end;
  mu->serve = StageServeRecord{};
  ML_RETURN_IF_ERROR(
      ReleaseServeBond(s, t.id, index, game->config().challenger, /*stage=*/nullptr));
  return game->RuleServed(false, end);
}

Status DriveChecks(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& seed,
                   const Hash256& task_id, protocol::RoundStateMachine& m,
                   const AwaitingSecrets& awaiting) {
  if (m.phase() == protocol::RoundPhase::kRoundPhaseFinal) return Status::Ok();
  const ChainParams& p = g.params;
  const protocol::VerificationParams vp = p.Verification();
  const uint32_t per_round = s.tasks.Find(task_id)->params.units_per_round;
  VerifierPool candidates;
  bool have_candidates = false;
  Rerun rerun;
  // Every unfinal round: the settling ones (rounds in flight) and the current one.
  const uint32_t from = m.final_rounds(), to = m.round();
  std::vector<uint32_t> open(to - from + 1, 0);  // checks still unsettled after this block
  for (uint32_t index = from * per_round; index < (to + 1) * per_round; ++index) {
    const uint32_t round = index / per_round;
    const WorkUnit* u = s.units.Find({task_id, index});
    if (u == nullptr) continue;
    // The serve bonds of claims that ended without the stage serving (a check settled or dropped
    // with a re-run) go back (RefundServeBonds).
    if (u->check.empty()) {
      if (!u->serve_bonds.empty()) ML_RETURN_IF_ERROR(RefundServeBonds(s, task_id, index));
      continue;
    }
    ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
    if (c.stage() == CheckStage::kCheckSettled) {
      if (!u->serve_bonds.empty()) ML_RETURN_IF_ERROR(RefundServeBonds(s, task_id, index));
      continue;
    }
    CheckEffects fx;
    if (c.stage() == CheckStage::kCheckAwaitingBeacon) {
      if (c.config().commit_height >= height) {  // the beacon is the next block's seed
        ++open[round - from];
        continue;
      }
      if (!have_candidates) {
        candidates = VerifierCandidates(s, g, height);
        have_candidates = true;
      }
      // What the task bought (its assurance) and what the solver's record earns it decide how
      // often and how much is replayed; a solver no longer registered is checked always.
      const NodeRecord* solver = s.nodes.Find(c.config().solver);
      const TaskParams& tp = s.tasks.Find(task_id)->params;
      const protocol::AssuranceLevel level{
          .kind = static_cast<protocol::Assurance>(tp.assurance),
          .target_escape_ppm = tp.target_escape_ppm};
      protocol::Reputation slashed;
      slashed.slashes = 1;
      const protocol::CheckPlan plan = protocol::PlanCheck(
          level, solver == nullptr ? slashed : ReputationOf(*solver),
          protocol::SegmentCount(c.config().inner_steps, c.config().checkpoint_interval), vp);
      protocol::VerificationParams unit_vp = vp;
      unit_vp.segments_per_check = plan.segments;
      // Full and target assurance promise a replay by another node: with no verifier the
      // check waits (holding the round) instead of settling unchecked.
      const bool wait = level.kind != protocol::Assurance::kAssuranceEconomic;
      ML_ASSIGN_OR_RETURN(
          fx, c.OnBeacon(seed, plan.probability_permille,
                         DrawableVerifiers(s, task_id, index, c.config().solver, candidates),
                         unit_vp, height, wait));
    } else {
      ML_RETURN_IF_ERROR(DriveServeWindow(s, *s.tasks.Find(task_id), index, height, c));
      ML_RETURN_IF_ERROR(RuleUnpostedStageStep(*s.tasks.Find(task_id), index, height, c));
      const auto floor = awaiting.find(c.config().solver);
      const bool earlier_awaits = floor != awaiting.end() && floor->second < u->secret_index;
      // The merits window opens only where ProveMerits can rule (the same rule refuses it).
      const protocol::Merits merits = ProveMeritsRefusal(s.tasks.Find(task_id)->params) == nullptr
                                          ? protocol::Merits::kMeritsShowable
                                          : protocol::Merits::kMeritsNotShowable;
      ML_ASSIGN_OR_RETURN(fx, c.OnBlock(height, /*earlier_verdicts_in=*/!earlier_awaits, merits));
    }
    SaveCheck(s, task_id, index, c);
    if (c.stage() != CheckStage::kCheckSettled) ++open[round - from];
    ML_RETURN_IF_ERROR(ApplyEffects(s, p, task_id, index, c, fx, &rerun));
    if (c.stage() == CheckStage::kCheckSettled) {
      ML_RETURN_IF_ERROR(RefundServeBonds(s, task_id, index));
    }
    if (fx.settled) {
      ML_LOG_INFO("ledger: task {} unit {}: {} ({})", task_id.ShortHex(), index,
                  protocol::CheckResultName(c.result()), c.reason());
    }
  }
  RerunForcedReplicas(s, task_id, from, to, &rerun);
  ML_RETURN_IF_ERROR(PayHonestStageWork(s, p, task_id, rerun));
  ML_RETURN_IF_ERROR(ApplyRerun(s, task_id, m, rerun));
  // The checks that went with a re-run: every one from the round a whole-round re-run went back
  // to; the rounds after a round whose units re-ran.
  uint32_t dropped_from = UINT32_MAX;
  if (rerun.round != UINT32_MAX) dropped_from = rerun.whole_round ? m.round() : rerun.round + 1;
  // One hold per unsettled check of each unfinal round, the newest first: rounds become final
  // in order, so only the oldest's release can finalize (and cascade).
  for (uint32_t r = m.round() + 1; r-- > std::min(from, m.final_rounds());) {
    if (!m.Unfinal(r)) continue;
    const uint32_t holds = r >= dropped_from || r < from ? 0 : open[r - from];
    ML_RETURN_IF_ERROR(m.SetHolds(r, holds).status());
  }
  return Status::Ok();
}

// ---- Transactions.

// A mismatch's `bundle` (RevealVerdict, ChallengeUnit): the step's tile plan from it, set on the
// check so that the dispute it opens narrows to one tile. Nothing for an empty bundle, except that
// a mismatch whose whole step the ledger could not rule from a witness must carry it
// (MismatchNeedsBundle: a token task's, a classification task's whose state may be over
// kMaxStepWitnessState, a stage's over kMaxStageWitnessMemory): without it the genesis key would
// rule the whole step its dispute would end at, or nobody would. A stage's claim that it served
// nothing must not: the challenger could not trace the step to answer the tile phase
// (UnservedStageClaim).
//
// TilePhaseOf: the layout the bundle gives (nullopt: whole steps), SetTilePhaseFrom sets it on the
// check; a late game (LateChallenge) puts it in its DisputeConfig.
Result<std::optional<protocol::DisputeConfig>> TilePhaseOf(const LedgerState& s,
                                                           const WorkUnit& u,
                                                           const BundleField& bundle,
                                                           const MismatchClaimField& claim,
                                                           std::string_view what) {
  const TaskRecord* t = s.tasks.Find(u.task_id);
  const TaskParams& p = t->params;
  const bool needed = MismatchNeedsBundle(p, u.index, claim);
  if (bundle.text.empty()) {
    if (!needed) return std::optional<protocol::DisputeConfig>{};
    std::string why;
    if (IsPipelineTask(p)) {
      const uint32_t stage = StageSlotOf(p, u.index).stage;
      why = "a stage of task " + u.task_id.ShortHex() + " declared at " +
            std::to_string(p.stage_memory_bytes[stage]) + " bytes (params.stage_memory_bytes[" +
            std::to_string(stage) + "]), over the " + std::to_string(kMaxStageWitnessMemory) +
            " a stage step's witness holds";
    } else if (p.data_page_tokens != 0) {
      why = "token task " + u.task_id.ShortHex() + " (a data root over its pages)";
    } else {
      why = "task " + u.task_id.ShortHex() + ", whose training state may hold " +
            std::to_string(MaxUnitStateBytes(p)) +
            " bytes (params.model_bytes and two optimizer moments), over the " +
            std::to_string(kMaxStepWitnessState) + " a whole step's witness holds";
    }
    return InvalidArgument(std::string(what) + ": bundle is empty, but unit " +
                           std::to_string(u.index) + " belongs to " + why +
                           ", whose whole steps only the tile phase rules without the genesis "
                           "key; send the task's bundle (the blob whose id is its spec_hash " +
                           t->spec_hash.ShortHex() + ") with the mismatch");
  }
  if (UnservedStageClaim(t->params, claim)) {
    return InvalidArgument(std::string(what) + ": unit " + std::to_string(u.index) +
                           " is a stage the claim says served nothing for the step (its "
                           "replayed_end is the unserved leaf of its solver_end): that dispute "
                           "is played over the whole step; send no bundle");
  }
  if (ContinuityStageClaim(t->params, claim)) {
    return InvalidArgument(std::string(what) + ": unit " + std::to_string(u.index) +
                           " is a stage the claim says does not start the step where its "
                           "previous step ended (its replayed_end is the continuity leaf of its "
                           "solver_end): that dispute is played over the whole step; send no "
                           "bundle");
  }
  // A stage unit's: its stage's plan (a GPT's or a sequential model's, TileContextOf).
  Result<TileRuleContext> context =
      TileContextOf(*t, u, bundle.text, std::string(what) + ": bundle");
  if (needed && context.status().code() == StatusCode::kFailedPrecondition) {
    // The task's own bundle (its blob id checked: InvalidArgument otherwise), whose plan the tile
    // phase does not serve: no token task today (a GPT trained in micro-batches is planned too,
    // since PlanStepTiles follows their gradient order), and for a stage only a cut the engine
    // refuses (engine::TaskPipelineCut: a stage without parameters, say), which `task submit`
    // never sends and no honest node trains. Its dispute plays whole steps, as before; a stage's
    // is ruled by no key (ExecuteRuleDispute), so over the stage witness bound it ends undecided.
    ML_LOG_INFO(
        "ledger: task {} unit {}: {} (a mismatch the ledger requires the bundle with carries it "
        "all the same); the dispute plays whole steps",
        u.task_id.ShortHex(), u.index, context.status().message());
    return std::optional<protocol::DisputeConfig>{};
  }
  ML_ASSIGN_OR_RETURN(TileRuleContext tc, std::move(context));
  protocol::DisputeConfig layout;
  SetTilePhase(tc.plan, &layout);
  layout.num_operators = static_cast<uint32_t>(tc.plan.ops.size());
  return std::optional<protocol::DisputeConfig>(std::move(layout));
}

Status SetTilePhaseFrom(const LedgerState& s, const WorkUnit& u, const BundleField& bundle,
                        const MismatchClaimField& claim, UnitCheck& c, std::string_view what) {
  ML_ASSIGN_OR_RETURN(std::optional<protocol::DisputeConfig> layout,
                      TilePhaseOf(s, u, bundle, claim, what));
  if (!layout) return Status::Ok();
  Status st = c.SetTilePhase(layout->num_operators, std::move(layout->operator_tiles),
                             std::move(layout->operator_blocks));
  return st.WithPrefix(std::string(what));
}

// ---- Late disputes (LateChallengeTx; docs/verification.md, "Over 8 MiB: a late dispute").

// The throughput a late game's turns are sized by: one slow CPU core's training FLOPs a second.
// An honest solver answers from a re-run of the unit (a final round's evidence is not kept), so
// its turn must fit that re-run on any machine that could have trained the unit, not a fast one.
constexpr uint64_t kLateFloorFlopsPerSecond = 1'000'000'000;

Amount LateChallengeMinBond(const TaskRecord& t, const WorkUnit& u) {
  return AssignedUnitCost(t, u);
}

uint64_t BlocksForMs(const Genesis& g, uint64_t ms) {
  const uint64_t interval = std::max<uint64_t>(SchedulerParamsOf(g).block_interval_ms, 1);
  return ms / interval + 1;
}

uint64_t BlocksForFlops(const Genesis& g, uint64_t flops, uint64_t flops_per_second) {
  return BlocksForMs(g, flops / std::max<uint64_t>(flops_per_second / 1000, 1) + 1);
}

uint64_t LateResponseBlocks(const Genesis& g, const TaskRecord& t) {
  const uint64_t flops = protocol::UnitFlops(TaskSpecViewOf(t.id, t.params, t.price_cap));
  return std::max(g.params.dispute_response_blocks,
                  BlocksForFlops(g, flops, kLateFloorFlopsPerSecond));
}

// The throughput a stage dispute's turns are sized by. A party answers a stage step's dispute
// from that step traced (its operator trace and every operator's tile roots), which costs two to
// five times a plain step (docs/verification.md's verify_referee bench: the 10M GPT's step 1.7 s,
// traced 3.3 s), on a node whose cores its own stage unit shares (the devnet's lazy stage, at
// load 30, traced a step of 1.5 to 2.8 GFLOP in 21 s): 100 MFLOP/s, a tenth of the late game's
// plain re-run floor.
constexpr uint64_t kStageTraceFloorFlopsPerSecond = 100'000'000;

// The longest a stage's turn is sized to, whatever its declared stage_flops: an hour (twice a
// step of 180 GFLOP at the floor; a node tracing at 10 GFLOP/s does 36 TFLOP in it, the 10M GPT's
// heaviest stage step being 2.8 GFLOP on the devnet). The ledger takes stage_flops as the
// submitter declares it (honest nodes refuse a task whose bundle gives other figures), so without
// a ceiling a task declaring 2^64 would give a silent party a turn that never ends: its round never
// final, the solver's stake held (StakeHold) for good.
constexpr uint64_t kStageTurnCeilingMs = 3'600'000;

uint64_t CheckResponseBlocks(const Genesis& g, const TaskParams& p, uint32_t index) {
  if (!IsPipelineTask(p)) return g.params.dispute_response_blocks;
  const uint64_t flops = p.stage_flops.at(StageSlotOf(p, index).stage);
  const uint64_t sized = std::min(2 * BlocksForFlops(g, flops, kStageTraceFloorFlopsPerSecond),
                                  BlocksForMs(g, kStageTurnCeilingMs));
  return std::max(g.params.dispute_response_blocks, sized);
}

Result<protocol::DisputeGame> LoadLateGame(const WorkUnit& u) {
  Result<protocol::DisputeGame> g = protocol::DisputeGame::Decode(u.late.game);
  if (!g.ok()) {
    return DataLoss("unit " + std::to_string(u.index) + " of task " + u.task_id.ShortHex() +
                    ": late game: " + g.status().message());
  }
  return g;
}

void SaveLateGame(LedgerState& s, const WorkUnit& u, const protocol::DisputeGame& g) {
  Bytes enc = g.Encode();
  if (u.late.game == enc) return;
  s.units.FindMutable({u.task_id, u.index})->late.game = std::move(enc);
}

// The unit whose late game a move or a ruling names, or nullptr when none is open on it (the
// unit's check's dispute, if any, is the one).
const WorkUnit* LateGameUnit(const LedgerState& s, const Hash256& task_id, uint32_t index) {
  const WorkUnit* u = s.units.Find({task_id, index});
  return u != nullptr && u->late.open() ? u : nullptr;
}

// `node`'s side in the late game on `u`: the solver's node (signed by its owner, as every
// dispute move), or the challenger, the account that sent the LateChallenge (signed by itself).
Result<protocol::DisputeParty> LatePartyOf(const ExecContext& ctx, const WorkUnit& u,
                                           const protocol::DisputeGame& g, const PublicKey& node,
                                           std::string_view what) {
  if (node == g.config().defender) {
    ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, node, ctx.tx.sender, what));
    return protocol::DisputeParty::kDefender;
  }
  if (node == g.config().challenger) {
    if (ctx.tx.sender != node) {
      return PermissionDenied(std::string(what) + ": the challenger " + node.ShortHex() +
                              " of the late game on unit " + std::to_string(u.index) +
                              " signs its own moves (it is the account that sent the "
                              "LateChallenge)");
    }
    return protocol::DisputeParty::kChallenger;
  }
  return PermissionDenied(std::string(what) + ": node " + node.ShortHex() +
                          " is not a party of the late game on unit " + std::to_string(u.index));
}

// Whether the late game on `u` has nothing left to decide: the unit is no longer the defender's
// paid work (a fraud proof or a rewind took it back), or its solver was proven fraudulent for it
// meanwhile (ProveFraud).
bool LateGameMoot(const TaskRecord& t, const WorkUnit& u, const protocol::DisputeGame& g) {
  if (u.status != WorkUnitStatus::kVerified || u.assignee != g.config().defender) return true;
  return std::ranges::any_of(t.verification.proven_frauds, [&](const ProvenFraud& f) {
    return f.index == u.index && f.solver == g.config().defender;
  });
}

Status CreditJackpot(LedgerState& s, Amount amount) {
  Globals* g = s.MutableGlobals();
  return CheckedAdd(g->jackpot, amount, &g->jackpot, "jackpot");
}

Status ApplyProvenFraud(LedgerState& s, const ChainParams& p, uint64_t height,
                        const Hash256& task_id, uint32_t index, uint32_t segment,
                        const PublicKey& prover, const std::optional<PublicKey>& payee);

// Closes the late game on unit `index` (its record and the task's entry) and returns what it held.
LateGame CloseLateGame(LedgerState& s, const Hash256& task_id, uint32_t index) {
  WorkUnit* u = s.units.FindMutable({task_id, index});
  LateGame late = std::move(u->late);
  u->late = LateGame{};
  std::erase(s.tasks.FindMutable(task_id)->verification.late_games, index);
  return late;
}

// Ends the resolved late game on unit `index`. The solver shown to lie (or silent): ProveFraud's
// effects (ApplyProvenFraud: slash, jail, claw-back, a reopen and rewind within the audit window),
// the challenger's bond back and its bounty, unless it lied too (then its bond goes to the
// jackpot). Otherwise (the solver honest, the challenger silent, or nobody posted the referee's
// witness in time): the bond pays the solver's owner its re-run, the unit's cost
// (LateChallengeMinBond), and the rest goes to the jackpot.
Status SettleLateGame(LedgerState& s, const ChainParams& p, uint64_t height,
                      const Hash256& task_id, uint32_t index, const protocol::DisputeGame& game) {
  const protocol::DisputeOutcome& o = game.outcome();
  const TaskRecord* t = s.tasks.Find(task_id);
  const WorkUnit* u = s.units.Find({task_id, index});
  const Amount rerun = LateChallengeMinBond(*t, *u);
  const LateGame late = CloseLateGame(s, task_id, index);
  ML_LOG_INFO("ledger: task {} unit {}: late game of {} on segment {} ended: {}",
              task_id.ShortHex(), index, late.challenger.ShortHex(), late.segment, o.reason);
  if (!o.undecided && !o.defender_honest) {
    // The game's challenger played it under its bond: the bounty is its (no copier can take a
    // game's win), unless it lied too.
    ML_RETURN_IF_ERROR(ApplyProvenFraud(
        s, p, height, task_id, index, late.segment, late.challenger,
        o.challenger_honest ? std::optional<PublicKey>(late.challenger) : std::nullopt));
    return o.challenger_honest ? Credit(s, late.challenger, late.bond)
                               : CreditJackpot(s, late.bond);
  }
  const NodeRecord* n = s.nodes.Find(game.config().defender);
  const Amount to_solver = n == nullptr ? 0 : std::min(rerun, late.bond);
  if (to_solver > 0) ML_RETURN_IF_ERROR(Credit(s, n->owner, to_solver));
  return CreditJackpot(s, late.bond - to_solver);
}

Status ExecuteCommitVerdict(ExecContext& ctx, const CommitVerdictTx& tx) {
  constexpr std::string_view kWhat = "commit verdict";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  ML_RETURN_IF_ERROR(c.OnVerdictCommitted(tx.node_id, tx.commitment, ctx.height));
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  return Status::Ok();
}

Status ExecuteRevealVerdict(ExecContext& ctx, const RevealVerdictTx& tx) {
  constexpr std::string_view kWhat = "reveal verdict";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  if (tx.verdict != static_cast<uint8_t>(protocol::Verdict::kVerdictClean) &&
      tx.verdict != static_cast<uint8_t>(protocol::Verdict::kVerdictMismatch)) {
    return InvalidArgument("reveal verdict: verdict must be 1 (clean) or 2 (mismatch), got " +
                           std::to_string(tx.verdict));
  }
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  const auto verdict = static_cast<protocol::Verdict>(tx.verdict);
  if (verdict != protocol::Verdict::kVerdictMismatch && !tx.bundle.text.empty()) {
    return InvalidArgument(
        "reveal verdict: bundle is for a mismatch (the dispute's tile plan); "
        "leave it empty with a clean verdict");
  }
  if (verdict == protocol::Verdict::kVerdictMismatch) {  // only a mismatch opens a dispute
    ML_RETURN_IF_ERROR(SetTilePhaseFrom(ctx.state, *u, tx.bundle, tx.claim, c, kWhat));
  }
  protocol::MismatchClaim claim = ClaimOf(tx.claim);
  ML_RETURN_IF_ERROR(c.OnVerdictRevealed(
      tx.node_id, verdict, tx.salt,
      verdict == protocol::Verdict::kVerdictMismatch ? &claim : nullptr, ctx.height));
  if (verdict == protocol::Verdict::kVerdictMismatch) {
    ML_RETURN_IF_ERROR(PostServeBond(ctx.state, ctx.params(), tx.task_id, tx.index, tx.claim,
                                     tx.node_id, ctx.tx.sender, kWhat));
  }
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  return Status::Ok();
}

// A stage unit's RevealSecret (docs/verification.md, "Forced errors for stage units"): whether
// the H step commits it carries have the forced form, given whether its secret draws the unit
// (`drawn`). The reveal is refused, naming the fix, when the field does not show what the stage
// committed: commits sent for a unit not drawn, none or another number than H for a drawn one,
// bytes that do not decode, a commit whose StageStepLeaf is not the step's committed leaf. Commits
// that are the committed ones but not in the forced form (protocol::CheckForcedStageForm: not
// naming the unit and step, or other states) are what the stage committed while drawn: false,
// and the check settles as a forced unit's that did not commit ForcedCommitment (fraud).
Result<bool> ForcedStageForm(const TaskRecord& t, const WorkUnit& u, const UnitCheck& c,
                             const RevealSecretTx& tx, bool drawn) {
  const std::string unit = "unit " + std::to_string(tx.index) + " of task " + t.id.ShortHex();
  if (!drawn) {
    if (tx.forced_commits.bytes.empty()) return false;
    return InvalidArgument("reveal secret: " + unit +
                           " is not drawn for a forced error by this secret; forced_commits "
                           "must be empty");
  }
  const uint32_t h = t.params.inner_steps;
  if (tx.forced_commits.bytes.empty()) {
    return InvalidArgument("reveal secret: " + unit +
                           " is a stage drawn for a forced error by this secret; forced_commits "
                           "must carry its " + std::to_string(h) +
                           " step commits (protocol::EncodeStageStepCommits)");
  }
  Result<std::vector<protocol::StageStepCommit>> commits =
      protocol::DecodeStageStepCommits(tx.forced_commits.bytes, h);
  if (!commits.ok()) return commits.status().WithPrefix("reveal secret: forced_commits");
  if (commits->size() != h || u.leaves.size() != size_t{h} + 1) {
    return InvalidArgument("reveal secret: forced_commits holds " +
                           std::to_string(commits->size()) + " step commits; " + unit +
                           " has " + std::to_string(h) + " steps");
  }
  for (uint32_t j = 0; j < h; ++j) {
    if (protocol::StageStepLeaf((*commits)[j]) != u.leaves[j + 1]) {
      return InvalidArgument("reveal secret: forced_commits: the commit of step " +
                             std::to_string(j) + " is not the step's committed leaf " +
                             u.leaves[j + 1].ShortHex() + " (send the commits the stage "
                             "committed, in step order)");
    }
  }
  Status form = protocol::CheckForcedStageForm(tx.secret, c.config().unit, *commits);
  if (!form.ok()) {
    ML_LOG_INFO("ledger: task {} unit {}: drawn for a forced error, and committed another form: {}",
                t.id.ShortHex(), tx.index, form.message());
  }
  return form.ok();
}

Status ExecuteRevealSecret(ExecContext& ctx, const RevealSecretTx& tx) {
  constexpr std::string_view kWhat = "reveal secret";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  if (c.config().solver != tx.node_id) {
    return PermissionDenied("reveal secret: node " + tx.node_id.ShortHex() +
                            " is not the solver of unit " + std::to_string(tx.index));
  }
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  if (IsPipelineTask(t->params)) {
    ML_RETURN_IF_ERROR(c.OnStageSecretRevealed(
        tx.secret, [&](bool drawn) { return ForcedStageForm(*t, *u, c, tx, drawn); },
        ctx.height));
  } else {
    if (!tx.forced_commits.bytes.empty()) {
      return InvalidArgument("reveal secret: forced_commits is for a pipeline stage unit drawn "
                             "for a forced error; unit " + std::to_string(tx.index) +
                             " of task " + tx.task_id.ShortHex() + " is a unit: leave it empty");
    }
    ML_RETURN_IF_ERROR(c.OnSecretRevealed(tx.secret, tx.start_leaf, ctx.height));
  }
  const uint64_t secret_index = u->secret_index;
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  // The deepest known element of the chain moves down: later units' secrets are checked
  // against it (and it reveals nothing about them).
  NodeRecord* n = ctx.state.nodes.FindMutable(tx.node_id);
  if (secret_index > n->secret_anchor_index) {
    n->secret_anchor = tx.secret;
    n->secret_anchor_index = secret_index;
  }
  return Status::Ok();
}

// The running dispute on unit `index` and `node`'s side in it (a move's checks).
struct DisputeMove {
  UnitCheck check;
  protocol::DisputeParty party;
};
Result<DisputeMove> MoveOf(const ExecContext& ctx, const Hash256& task_id, uint32_t index,
                           const PublicKey& node, std::string_view what) {
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, node, ctx.tx.sender, what));
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, task_id, index, what));
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  const protocol::DisputeGame* game = c.mutable_dispute();
  if (c.stage() != CheckStage::kCheckDisputed || game == nullptr) {
    return FailedPrecondition(std::string(what) + ": unit " + std::to_string(index) +
                              " has no dispute running (stage " +
                              std::string(protocol::CheckStageName(c.stage())) + ")");
  }
  protocol::DisputeParty party;
  if (node == game->config().defender) {
    party = protocol::DisputeParty::kDefender;
  } else if (node == game->config().challenger) {
    party = protocol::DisputeParty::kChallenger;
  } else {
    return PermissionDenied(std::string(what) + ": node " + node.ShortHex() +
                            " is not a party of the dispute on unit " + std::to_string(index));
  }
  return DisputeMove{std::move(c), party};
}

Status ExecuteDisputePost(ExecContext& ctx, const DisputePostTx& tx) {
  if (const WorkUnit* u = LateGameUnit(ctx.state, tx.task_id, tx.index)) {
    ML_ASSIGN_OR_RETURN(protocol::DisputeGame g, LoadLateGame(*u));
    ML_ASSIGN_OR_RETURN(protocol::DisputeParty party,
                        LatePartyOf(ctx, *u, g, tx.node_id, "dispute post"));
    ML_RETURN_IF_ERROR(g.Post(party, tx.position, tx.hash, ctx.height));
    SaveLateGame(ctx.state, *u, g);
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(DisputeMove m, MoveOf(ctx, tx.task_id, tx.index, tx.node_id, "dispute post"));
  ML_RETURN_IF_ERROR(m.check.mutable_dispute()->Post(m.party, tx.position, tx.hash, ctx.height));
  SaveCheck(ctx.state, tx.task_id, tx.index, m.check);
  return Status::Ok();
}

Status ExecuteDisputeChildren(ExecContext& ctx, const DisputeChildrenTx& tx) {
  if (const WorkUnit* u = LateGameUnit(ctx.state, tx.task_id, tx.index)) {
    ML_ASSIGN_OR_RETURN(protocol::DisputeGame g, LoadLateGame(*u));
    ML_ASSIGN_OR_RETURN(protocol::DisputeParty party,
                        LatePartyOf(ctx, *u, g, tx.node_id, "dispute children"));
    Status st = g.PostChildren(party, tx.position, tx.left, tx.right, ctx.height);
    if (!st.ok()) return st.WithPrefix("dispute children");
    SaveLateGame(ctx.state, *u, g);
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(DisputeMove m,
                      MoveOf(ctx, tx.task_id, tx.index, tx.node_id, "dispute children"));
  Status s =
      m.check.mutable_dispute()->PostChildren(m.party, tx.position, tx.left, tx.right, ctx.height);
  if (!s.ok()) return s.WithPrefix("dispute children");
  SaveCheck(ctx.state, tx.task_id, tx.index, m.check);
  return Status::Ok();
}

// Whether `node` claimed that stage unit `u` served nothing for a step the stage then served on
// chain (a ServeStageEvidence ruling on the unit's round with `node` its challenger), and `claim`
// is a finding on that step other than "served nothing" (which is refused below: the evidence is
// on chain): the recheck of docs/verification.md, "A stage claimed to have served nothing",
// step 4, which the claimant sends from the pieces whatever its roles.
static bool ServedStageClaimant(const TaskRecord& t, const WorkUnit& u, const PublicKey& node,
                                const MismatchClaimField& claim) {
  if (!IsPipelineTask(t.params) || UnservedStageClaim(t.params, claim)) return false;
  for (const DisputeRuling& r : t.verification.rulings) {
    if (r.index == u.index && r.round == u.round &&
        r.tx == static_cast<uint16_t>(TxType::kServeStageEvidence) && r.challenger == node &&
        r.step == claim.segment + 1ull) {
      return true;
    }
  }
  return false;
}

Status ExecuteChallengeUnit(ExecContext& ctx, const ChallengeUnitTx& tx) {
  constexpr std::string_view kWhat = "challenge unit";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  const NodeRecord* wb = ctx.state.nodes.Find(tx.node_id);
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  // The claimant of a claim that a stage served nothing, which the stage answered by serving the
  // step on chain (ServedStageClaimant), may check that step from the evidence without the
  // whistleblower role: its claim is what put the evidence there. Anyone else needs the role.
  const bool claimant = ServedStageClaimant(*t, *u, tx.node_id, tx.claim);
  if (((wb->roles & kRoleWhistleblower) == 0 && !claimant) ||
      wb->status != NodeStatus::kActive) {
    return PermissionDenied(
        "challenge unit: node " + tx.node_id.ShortHex() +
        " is not an active whistleblower (its stake is the challenge's bond), nor the claimant "
        "of a stage step served on chain challenging that step with a finding");
  }
  ML_ASSIGN_OR_RETURN(protocol::RoundStateMachine m, LoadMachine(*t));
  if (!m.Unfinal(u->round)) {
    return FailedPrecondition("challenge unit: round " + std::to_string(u->round) +
                              " of task " + tx.task_id.ShortHex() +
                              " is final; a challenge must come before its window closes");
  }
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  if (UnservedStageClaim(t->params, tx.claim)) {
    // A step whose evidence the stage served on chain (a ServeStageEvidence ruling on this unit):
    // the claim that it served nothing is answered there for good; the step is checked from that
    // evidence, with a finding and the bundle (the tile phase), not served again.
    for (const DisputeRuling& r : t->verification.rulings) {
      if (r.index == tx.index && r.round == u->round &&
          r.tx == static_cast<uint16_t>(TxType::kServeStageEvidence) &&
          r.step == tx.claim.segment + 1ull) {
        return FailedPrecondition(
            "challenge unit: stage unit " + std::to_string(tx.index) + " served step " +
            std::to_string(r.step) + "'s evidence on chain at height " + std::to_string(r.height) +
            " (ServeStageEvidence); replay the step from those pieces "
            "(ledger::AssembleStageServeEvidence) and send a finding with the task's bundle");
      }
    }
  }
  ML_RETURN_IF_ERROR(SetTilePhaseFrom(ctx.state, *u, tx.bundle, tx.claim, c, kWhat));
  ML_RETURN_IF_ERROR(c.OnChallenge(tx.node_id, ClaimOf(tx.claim), ctx.height));
  ML_RETURN_IF_ERROR(PostServeBond(ctx.state, ctx.params(), tx.task_id, tx.index, tx.claim,
                                   tx.node_id, ctx.tx.sender, kWhat));
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  // DriveChecks keeps one hold per unsettled check.
  ML_ASSIGN_OR_RETURN(uint32_t holds, m.HoldsOf(u->round));
  ML_RETURN_IF_ERROR(m.SetHolds(u->round, holds + 1).status());
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

Status ExecuteProveMerits(ExecContext& ctx, const ProveMeritsTx& tx) {
  constexpr std::string_view kWhat = "prove merits";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  // Any active checker may show them, a verifier as well as a whistleblower: whoever replays the
  // disputed segment holds the evidence (the whistleblower that challenged may have crashed, or be
  // the solver's accomplice and keep it back).
  const NodeRecord* prover = ctx.state.nodes.Find(tx.node_id);
  if ((prover->roles & (kRoleWhistleblower | kRoleVerifier)) == 0 ||
      prover->status != NodeStatus::kActive) {
    return PermissionDenied("prove merits: node " + tx.node_id.ShortHex() +
                            " is not an active verifier or whistleblower");
  }
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  // The rule that opens the merits window (DriveChecks) and nothing else: a window opened before
  // that rule (stored state) closes into a loss by silence, as it always did.
  if (const char* why = ProveMeritsRefusal(t->params); why != nullptr) {
    return FailedPrecondition("prove merits: task " + tx.task_id.ShortHex() + " is " + why +
                              "; a solver's silence in a whistleblower's dispute settles at once "
                              "as a loss by silence alone");
  }
  // The window, the segment and the prover first (cheap; the check is saved only if shown).
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  // The bounty: the earliest node that committed to this witness (TakeProofCommitter).
  const std::optional<PublicKey> payee = TakeProofCommitter(
      ctx.state, ProofWitnessId(tx), tx.node_id, ctx.height, /*nodes_only=*/true);
  Result<CheckEffects> fx = c.OnMeritsShown(tx.node_id, tx.segment, ctx.height, payee);
  if (!fx.ok()) return fx.status().WithPrefix("prove merits");
  Result<SegmentWitness> w = DecodeSegmentWitness(tx.witness.bytes);
  if (!w.ok()) return w.status().WithPrefix("prove merits");
  Result<Hash256> end = ExecuteSegmentWitness(*t, *u, tx.segment, *w);
  if (!end.ok()) return end.status().WithPrefix("prove merits");
  if (*end == u->leaves[tx.segment + 1]) {
    return FailedPrecondition("prove merits: segment " + std::to_string(tx.segment) + " of unit " +
                              std::to_string(tx.index) + " replays to its committed end " +
                              end->ShortHex() + "; the whistleblower's claim is not shown");
  }
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  ML_ASSIGN_OR_RETURN(protocol::RoundStateMachine m, LoadMachine(*t));
  Rerun rerun;
  ML_RETURN_IF_ERROR(ApplyEffects(ctx.state, ctx.params(), tx.task_id, tx.index, c, *fx, &rerun));
  ML_LOG_INFO("ledger: task {} unit {}: {} ({})", tx.task_id.ShortHex(), tx.index,
              protocol::CheckResultName(c.result()), c.reason());
  ML_RETURN_IF_ERROR(ApplyRerun(ctx.state, tx.task_id, m, rerun));
  // The next block's DriveChecks sets the round's holds from the checks left open.
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

// The dispute on unit `index` waiting for the referee (with its unit and check).
struct RefereeStage {
  const WorkUnit* unit = nullptr;
  UnitCheck check;
};
Result<RefereeStage> DisputeAtReferee(const LedgerState& s, const Hash256& task_id,
                                      uint32_t index, std::string_view what) {
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(s, task_id, index, what));
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  const auto& game = c.dispute();
  if (c.stage() != CheckStage::kCheckDisputed || !game.has_value() ||
      game->stage() != protocol::DisputeStage::kDisputeReferee) {
    return FailedPrecondition(std::string(what) + ": unit " + std::to_string(index) +
                              " has no dispute waiting for the referee");
  }
  return RefereeStage{u, std::move(c)};
}

// Keeps the ruling the transaction being executed made on unit `index` in the task's record
// (DisputeRuling), so that what it decided outlives the unit's check; `game` is the unit's game,
// which the ruling has just resolved.
void RecordRuling(ExecContext& ctx, const Hash256& task_id, uint32_t index,
                  const protocol::DisputeGame& game, uint64_t witness_bytes) {
  ctx.state.tasks.FindMutable(task_id)->verification.rulings.push_back(
      DisputeRuling{.tx = static_cast<uint16_t>(PayloadType(ctx.tx.payload)),
                    .tx_id = ctx.tx_id,
                    .sender = ctx.tx.sender,
                    .height = ctx.height,
                    .index = index,
                    .round = ctx.state.units.Find({task_id, index})->round,
                    .step = game.referee_task().step,
                    .defender = game.config().defender,
                    .challenger = game.config().challenger,
                    .witness_bytes = witness_bytes,
                    .defender_honest = game.outcome().defender_honest,
                    .challenger_honest = game.outcome().challenger_honest,
                    .reason = game.outcome().reason});
}

// The game a ledger ruling (RefereeStep, RefereeTile) names on a unit at the referee: its late
// game (LateChallenge) when one is open, else its check's dispute (DisputeAtReferee).
struct GameAtReferee {
  const WorkUnit* unit = nullptr;
  std::optional<UnitCheck> check;
  std::optional<protocol::DisputeGame> late;
  protocol::DisputeGame* game() { return check ? check->mutable_dispute() : &*late; }
};
Result<GameAtReferee> GameAtRefereeOf(const LedgerState& s, const Hash256& task_id,
                                      uint32_t index, std::string_view what) {
  if (const WorkUnit* u = LateGameUnit(s, task_id, index)) {
    ML_ASSIGN_OR_RETURN(protocol::DisputeGame g, LoadLateGame(*u));
    if (g.stage() != protocol::DisputeStage::kDisputeReferee) {
      return FailedPrecondition(std::string(what) + ": the late game on unit " +
                                std::to_string(index) + " is not waiting for the referee (stage " +
                                std::string(protocol::DisputeStageName(g.stage())) + ")");
    }
    return GameAtReferee{.unit = u, .check = std::nullopt, .late = std::move(g)};
  }
  // A closed task's units are disputed only by late games: "the task is finished" would hide
  // why there is nothing to rule (most often the other party's witness ruled the game first).
  if (const TaskRecord* t = s.tasks.Find(task_id); t != nullptr && t->status != TaskStatus::kOpen) {
    return FailedPrecondition(std::string(what) + ": unit " + std::to_string(index) + " of task " +
                              task_id.ShortHex() + " (" + std::string(TaskStatusName(t->status)) +
                              ") has no late game waiting for the referee: none was opened on it, "
                              "or it is ruled already");
  }
  ML_ASSIGN_OR_RETURN(RefereeStage r, DisputeAtReferee(s, task_id, index, what));
  return GameAtReferee{.unit = r.unit, .check = std::move(r.check), .late = std::nullopt};
}
// Keeps what a ruling decided: the check, or the late game, which the ruling ends
// (SettleLateGame); the task keeps the ruling either way (RecordRuling).
Status SaveRuled(ExecContext& ctx, const Hash256& task_id, uint32_t index, GameAtReferee& r,
                 uint64_t witness_bytes) {
  RecordRuling(ctx, task_id, index, *r.game(), witness_bytes);
  if (r.check) {
    SaveCheck(ctx.state, task_id, index, *r.check);
    return Status::Ok();
  }
  return SettleLateGame(ctx.state, ctx.params(), ctx.height, task_id, index, *r.late);
}

// Whether the ledger executes this dispute's ruling itself (RefereeStep) rather than taking the
// genesis referee's word (RuleDispute): a whole step of a task with a data root over examples. A
// token task's data root (over pages) proves the tokens of a tile (RefereeTile); its whole step
// is not executed by the ledger (a step witness of its state would not fit): its mismatch must
// carry the bundle (DisputeNeedsBundle), so its dispute plays the tile phase, and the two whole
// steps that phase ends at (a lie in the step's input state or in the state only) are ruled from
// roots (LedgerRulesFromRoots); only a token task whose plan the tile phase does not serve
// (none today; micro-batched steps are planned too) plays whole steps, ruled by the genesis
// referee. A stage unit's step is not a
// unit's step (its inputs are its neighbours' signed tensors): it is ruled from its own witness
// (RefereeStageStep, LedgerRulesStageStep), never by RefereeStep.
bool LedgerExecutes(const TaskRecord& t, const protocol::RefereeTask& task) {
  return !t.params.data_root.IsZero() && t.params.data_page_tokens == 0 &&
         !IsPipelineTask(t.params) && task.whole_step &&
         !task.segment;
}

// Whether the ledger rules this whole step from roots itself (RefereeTile with a roots witness,
// referee_tile.h RuleRoots) so that the genesis referee's word is refused: the chain end agreed
// (the state follows from the operator outputs); an operator without tiles of a task with a
// data root the tile phase proves batches with (examples, or token pages), where every operator
// without tiles is of the step's input state or (a classification task) executed by RefereeStep.
// Without a data root (only in tolerance mode, which plays no tile phase, since a verifying
// chain refuses an exact-mode task without one) an operator without tiles may be one whose tokens
// cannot be proven (TokenOpsOpaque). Both kinds only arise in a game with the tile phase, whose
// bundle the ledger accepted (TileContextOf), so a RefereeTile can always carry it.
bool LedgerRulesFromRoots(const TaskRecord& t, const protocol::RefereeTask& task) {
  if (task.segment || !task.whole_step || task.tile) return false;
  if (task.roots == protocol::RefereeRoots::kRootsChainEnd) return true;
  return task.roots == protocol::RefereeRoots::kRootsOperator && !t.params.data_root.IsZero() &&
         (t.params.data_page_tokens == 0 ||
          t.params.data_page_tokens == static_cast<uint32_t>(engine::kTokenPageTokens));
}

Status ExecuteRefereeStep(ExecContext& ctx, const RefereeStepTx& tx) {
  constexpr std::string_view kWhat = "referee step";
  ML_ASSIGN_OR_RETURN(GameAtReferee r, GameAtRefereeOf(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  protocol::DisputeGame* game = r.game();
  if (game->referee_task().tile) {
    return FailedPrecondition("referee step: the dispute on unit " + std::to_string(tx.index) +
                              " narrowed to one tile; send RefereeTile with the tile's witness");
  }
  if (IsPipelineTask(t->params)) {
    const uint32_t stage = StageSlotOf(t->params, tx.index).stage;
    return FailedPrecondition(
        "referee step: the dispute on unit " + std::to_string(tx.index) +
        " is on a pipeline stage's step, which is not a unit's step" +
        (LedgerRulesStageStep(t->params, stage)
             ? "; send RefereeStageStep with the stage step's witness"
             : "; the stage's state does not fit a witness: its dispute plays the tile phase, or "
               "a claim that it served nothing is answered by its evidence in pieces "
               "(ServeStageEvidence)"));
  }
  if (!LedgerExecutes(*t, game->referee_task())) {
    return FailedPrecondition(
        "referee step: the dispute on unit " + std::to_string(tx.index) +
        (game->referee_task().segment      ? " is not about one whole step (tolerance mode)"
         : t->params.data_root.IsZero()    ? " belongs to a task without a data root"
         : t->params.data_page_tokens != 0 ? " belongs to a token task, whose whole steps the "
                                             "ledger does not execute yet"
                                           : " is not about one whole step") +
        "; the genesis referee rules it (RuleDispute)");
  }
  Result<StepWitness> w = DecodeStepWitness(tx.witness.bytes);
  if (!w.ok()) return w.status().WithPrefix("referee step");
  ML_ASSIGN_OR_RETURN(Hash256 output,
                      ExecuteRefereeStepWitness(*t, *r.unit, game->referee_task(), *w));
  ML_RETURN_IF_ERROR(game->Rule(output));
  return SaveRuled(ctx, tx.task_id, tx.index, r, tx.witness.bytes.size());
}

// The nodes that ran stage unit `index`'s run, stage by stage (what signed its records):
// ReplicaRunChain over the replica's units as recorded now, with the unit's own placement beacon.
Result<std::vector<protocol::NodeId>> ReplicaChainOf(const LedgerState& s, const TaskRecord& t,
                                                     uint32_t index) {
  const StageSlot slot = StageSlotOf(t.params, index);
  std::vector<StagePlacement> placed(t.params.stages);
  for (uint32_t stage = 0; stage < t.params.stages; ++stage) {
    const WorkUnit* u =
        s.units.Find({t.id, StageUnitIndex(t.params, {slot.round, slot.replica, stage})});
    if (u != nullptr) placed[stage] = {u->assignee, u->assignment_beacon};
  }
  return ReplicaRunChain(placed, slot.stage, placed[slot.stage].beacon);
}

Status ExecuteRefereeStageStep(ExecContext& ctx, const RefereeStageStepTx& tx) {
  constexpr std::string_view kWhat = "referee stage step";
  ML_ASSIGN_OR_RETURN(RefereeStage r, DisputeAtReferee(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  protocol::DisputeGame* game = r.check.mutable_dispute();
  const protocol::RefereeTask& task = game->referee_task();
  if (!IsPipelineTask(t->params)) {
    return FailedPrecondition("referee stage step: unit " + std::to_string(tx.index) + " of task " +
                              tx.task_id.ShortHex() +
                              " is not a pipeline stage's; send RefereeStep or RefereeTile");
  }
  if (task.tile || task.segment || !task.whole_step || task.step == 0) {
    return FailedPrecondition("referee stage step: the dispute on unit " +
                              std::to_string(tx.index) + " is not about one whole stage step");
  }
  // A continuity claim is ruled from the two commits (or step 0's commit and the round's start
  // state), whatever the stage's size; every other claim from the step's replay.
  const bool continuity = task.challenger_output == StageContinuityLeaf(task.defender_output);
  if (continuity != IsStageContinuityWitness(tx.witness.bytes)) {
    return InvalidArgument(
        continuity ? "referee stage step: the dispute on unit " + std::to_string(tx.index) +
                         " is a continuity claim (its step does not start where the previous "
                         "ended); send a StageContinuityWitness of the two commits"
                   : "referee stage step: the witness is a StageContinuityWitness, but the "
                     "dispute on unit " +
                         std::to_string(tx.index) +
                         " is not a continuity claim; send the stage step's witness");
  }
  StageStepCheck c;
  if (continuity) {
    Result<StageContinuityWitness> w = DecodeStageContinuityWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("referee stage step");
    ML_ASSIGN_OR_RETURN(c,
                        RuleStageContinuity(*t, *r.unit, task.step - 1, task.defender_output, *w));
  } else {
    const uint32_t stage = StageSlotOf(t->params, tx.index).stage;
    if (!LedgerRulesStageStep(t->params, stage) &&
        task.roots != protocol::RefereeRoots::kRootsNone) {
      return FailedPrecondition(
          "referee stage step: the dispute on unit " + std::to_string(tx.index) + " (stage " +
          std::to_string(stage) +
          ") is over the stage witness bound, and the dispute plays the tile phase; send "
          "RefereeTile with a witness of the stage's commit and roots "
          "(ledger::BuildStageRootsWitness)");
    }
    if (!LedgerRulesStageStep(t->params, stage)) {
      return FailedPrecondition(
          "referee stage step: the dispute on unit " + std::to_string(tx.index) + " (stage " +
          std::to_string(stage) +
          ") is not ruled from the step's replay: the stage needs " +
          std::to_string(t->params.stage_memory_bytes[stage]) +
          " bytes, over the witness bound of " + std::to_string(kMaxStageWitnessMemory) +
          " (a pipeline task is in exact mode, so it has a data root: ValidateTaskTerms); there "
          "only a claim that the stage served nothing is played whole, and answered by the "
          "stage's evidence in pieces (ServeStageEvidence)");
    }
    Result<StageStepWitness> w = DecodeStageStepWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("referee stage step");
    // Segment t of a stage unit's check is step t: the referee's (1-based) step t + 1.
    Result<std::vector<protocol::NodeId>> chain = ReplicaChainOf(ctx.state, *t, tx.index);
    if (!chain.ok()) return chain.status().WithPrefix("referee stage step");
    ML_ASSIGN_OR_RETURN(c, RuleStageStepWitness(*t, *r.unit, task.step - 1, task.defender_output,
                                                *chain, *w));
  }
  ML_LOG_INFO("ledger: task {} unit {}: stage {} ruled from a {}-byte witness: {}",
              tx.task_id.ShortHex(), tx.index, continuity ? "continuity" : "step",
              tx.witness.bytes.size(), c.message);
  ML_RETURN_IF_ERROR(game->Rule(c.leaf));
  SaveCheck(ctx.state, tx.task_id, tx.index, r.check);
  RecordRuling(ctx, tx.task_id, tx.index, *game, tx.witness.bytes.size());
  return Status::Ok();
}

Status ExecuteServeStageEvidence(ExecContext& ctx, const ServeStageEvidenceTx& tx) {
  constexpr std::string_view kWhat = "serve stage evidence";
  ML_ASSIGN_OR_RETURN(RefereeStage r, DisputeAtReferee(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  protocol::DisputeGame* game = r.check.mutable_dispute();
  if (!ServesStageEvidence(t->params, tx.index, *game)) {
    return FailedPrecondition(
        "serve stage evidence: the dispute on unit " + std::to_string(tx.index) + " of task " +
        tx.task_id.ShortHex() +
        " is not a claim that a pipeline stage over the stage witness bound served nothing for a "
        "whole step; only that claim is answered by the stage's evidence in pieces");
  }
  const std::string where = "serve stage evidence (task " + tx.task_id.ShortHex() + ", unit " +
                            std::to_string(tx.index) + ", piece " + std::to_string(tx.piece) + ")";
  WorkUnit* mu = ctx.state.units.FindMutable({tx.task_id, tx.index});
  ML_RETURN_IF_ERROR(OpenServeWindow(t->params, *mu, *game).status());
  if (ctx.height > mu->serve.window_end) {
    return FailedPrecondition(where + ": the serving window ended at height " +
                              std::to_string(mu->serve.window_end));
  }
  if (tx.bundle.text.empty()) {
    return InvalidArgument(where +
                           ": bundle is empty; send the task's bundle (its blob id is the "
                           "task's spec_hash " +
                           t->spec_hash.ShortHex() + ")");
  }
  ML_ASSIGN_OR_RETURN(TileRuleContext tc, TileContextOf(*t, *mu, tx.bundle.text, where));
  Result<StageServePiece> piece = DecodeStageServePiece(tx.witness.bytes);
  if (!piece.ok()) return piece.status().WithPrefix(where);
  Result<std::vector<protocol::NodeId>> chain = ReplicaChainOf(ctx.state, *t, tx.index);
  if (!chain.ok()) return chain.status().WithPrefix(where);
  ML_RETURN_IF_ERROR(CheckStageServePiece(tc, game->referee_task(), tx.task_id,
                                          StageSlotOf(t->params, tx.index), t->params.stages,
                                          *chain, tx.piece, *piece)
                         .WithPrefix(where));
  StageServeRecord& rec = mu->serve;
  if (rec.pieces == 0) {
    // The first piece brings the bundle, so the plan's real piece count: the window, set from the
    // declared stage memory (the submitter's number), grows to what that count needs (never
    // shrinks), so that a stage declared smaller than its evidence is not cut off.
    rec.pieces = StageServePieceCount(tc.plan);
    rec.served.assign(StageServeRecord::BitmapBytes(rec.pieces), 0);
    const uint64_t declared = t->params.stage_memory_bytes[StageSlotOf(t->params, tx.index).stage];
    const uint64_t needed =
        ServeWindowEnd(rec.window_end - ServeWindowBlocks(declared), declared, rec.pieces);
    if (needed > rec.window_end) {
      ML_LOG_INFO(
          "ledger: task {} unit {}: the stage's evidence has {} pieces; its serving window "
          "grows from height {} to {}",
          tx.task_id.ShortHex(), tx.index, rec.pieces, rec.window_end, needed);
      rec.window_end = needed;
      ML_RETURN_IF_ERROR(game->ExtendRefereeDeadline(needed));
    }
  }
  uint8_t& byte = rec.served[tx.piece / 8];
  const uint8_t bit = static_cast<uint8_t>(1u << (tx.piece % 8));
  if ((byte & bit) != 0) return FailedPrecondition(where + ": the piece is served already");
  byte |= bit;
  uint32_t served = 0;
  for (uint32_t p = 0; p < rec.pieces; ++p) served += rec.Has(p) ? 1 : 0;
  ML_LOG_INFO("ledger: task {} unit {}: stage evidence piece {} served ({} of {})",
              tx.task_id.ShortHex(), tx.index, tx.piece, served, rec.pieces);
  if (served == rec.pieces) {
    // The evidence is on chain, every piece checked: the claim that the stage served nothing is
    // answered. It shows nobody's computation wrong (RuleServed: the claimant is not slashed);
    // the step is then checked from that evidence (a challenge with the bundle plays the tile
    // phase: docs/verification.md, "A stage claimed to have served nothing").
    ML_RETURN_IF_ERROR(game->RuleServed(true, rec.window_end));
    rec = StageServeRecord{};
    // The claimant's bond pays the stage for posting what it claimed was not there.
    const PublicKey stage = game->config().defender;
    ML_RETURN_IF_ERROR(
        ReleaseServeBond(ctx.state, tx.task_id, tx.index, game->config().challenger, &stage));
    SaveCheck(ctx.state, tx.task_id, tx.index, r.check);
    RecordRuling(ctx, tx.task_id, tx.index, *game, tx.witness.bytes.size());
    return Status::Ok();
  }
  SaveCheck(ctx.state, tx.task_id, tx.index, r.check);
  return Status::Ok();
}

Status ExecuteRefereeTile(ExecContext& ctx, const RefereeTileTx& tx) {
  constexpr std::string_view kWhat = "referee tile";
  ML_ASSIGN_OR_RETURN(GameAtReferee r, GameAtRefereeOf(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  protocol::DisputeGame* game = r.game();
  const protocol::RefereeTask& task = game->referee_task();
  const bool roots = task.roots != protocol::RefereeRoots::kRootsNone;
  if (!task.tile && !roots) {
    return FailedPrecondition(
        "referee tile: the dispute on unit " + std::to_string(tx.index) +
        " waits for a whole step" +
        (LedgerExecutes(*t, task)
             ? " (send RefereeStep with the step's witness)"
             : " the ledger cannot execute (the genesis referee's RuleDispute)"));
  }
  if (tx.witness.bytes.size() > kMaxTileWitnessBytes) {
    return InvalidArgument("referee tile: witness is " + std::to_string(tx.witness.bytes.size()) +
                           " bytes, over the tile witness bound of " +
                           std::to_string(kMaxTileWitnessBytes));
  }
  if (tx.bundle.text.empty()) {
    return InvalidArgument(
        "referee tile: bundle is empty; send the task's bundle (its blob id is "
        "the task's spec_hash " +
        t->spec_hash.ShortHex() + ")");
  }
  const std::string where =
      "referee tile (task " + tx.task_id.ShortHex() + ", unit " + std::to_string(tx.index) + ")";
  ML_ASSIGN_OR_RETURN(TileRuleContext tc, TileContextOf(*t, *r.unit, tx.bundle.text, where));
  // A whole step of the tile phase ruled from roots: the state after it (the chain end agreed),
  // or the correct C_j of an input-state operator (referee_tile.h, RuleRoots). A stage step's
  // roots are ruled against the stage's committed commit (stage_referee.h, RuleStageRoots).
  Result<Hash256> output = Hash256{};
  if (roots && IsPipelineTask(t->params)) {
    Result<StageRootsWitness> sw = DecodeStageRootsWitness(tx.witness.bytes);
    if (!sw.ok()) return sw.status().WithPrefix("referee tile: witness");
    Result<std::vector<protocol::NodeId>> chain = ReplicaChainOf(ctx.state, *t, tx.index);
    if (!chain.ok()) return chain.status().WithPrefix("referee tile");
    output = RuleStageRoots(tc, task, tx.task_id, StageSlotOf(t->params, tx.index),
                            t->params.stages, *chain, *sw);
  } else {
    Result<TileWitness> w = DecodeTileWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("referee tile: witness");
    output = roots ? RuleRoots(tc, task, *w) : RuleTile(tc, task, *w);
  }
  if (!output.ok()) return output.status().WithPrefix("referee tile");
  if (task.roots == protocol::RefereeRoots::kRootsOperator) {
    ML_RETURN_IF_ERROR(game->RuleOperator(*output));
  } else if (task.roots == protocol::RefereeRoots::kRootsChainEnd) {
    ML_RETURN_IF_ERROR(game->RuleChainEnd(*output));
  } else {
    ML_RETURN_IF_ERROR(game->Rule(*output));
  }
  return SaveRuled(ctx, tx.task_id, tx.index, r, tx.witness.bytes.size());
}

Status ExecuteProveResult(ExecContext& ctx, const ProveResultTx& tx) {
  constexpr std::string_view kWhat = "prove result";
  ML_RETURN_IF_ERROR(CheckNodeSender(ctx.state, tx.node_id, ctx.tx.sender, kWhat));
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, CheckedUnit(ctx.state, tx.task_id, tx.index, kWhat));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  ML_ASSIGN_OR_RETURN(protocol::RoundStateMachine m, LoadMachine(*t));
  if (!m.Unfinal(u->round)) {
    return FailedPrecondition("prove result: round " + std::to_string(u->round) + " of task " +
                              tx.task_id.ShortHex() + " is final");
  }
  // A stage unit (a pipeline task) is proven against its stage's state after its last step.
  const bool stage = IsPipelineTask(t->params);
  Hash256 computed;
  if (stage) {
    Result<StageResultWitness> w = DecodeStageResultWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("prove result");
    ML_ASSIGN_OR_RETURN(computed, ExecuteStageResultWitness(*t, *u, *w));
  } else {
    Result<ResultWitness> w = DecodeResultWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("prove result");
    ML_ASSIGN_OR_RETURN(computed, ExecuteResultWitness(*t, *u, *w));
  }
  if (computed == u->result_hash) {
    return FailedPrecondition("prove result: unit " + std::to_string(tx.index) +
                              "'s result " + u->result_hash.ShortHex() +
                              " is the delta of its committed final state; nothing to prove");
  }
  ML_ASSIGN_OR_RETURN(UnitCheck c, LoadCheck(*u));
  // The bounty: the earliest node that committed to this witness (TakeProofCommitter).
  const std::optional<PublicKey> payee = TakeProofCommitter(
      ctx.state, ProofWitnessId(tx), tx.node_id, ctx.height, /*nodes_only=*/true);
  ML_ASSIGN_OR_RETURN(CheckEffects fx, c.OnResultDisproved(tx.node_id, ctx.height, payee));
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  Rerun rerun;
  ML_RETURN_IF_ERROR(ApplyEffects(ctx.state, ctx.params(), tx.task_id, tx.index, c, fx, &rerun));
  ML_LOG_INFO("ledger: task {} unit {}: {} ({})", tx.task_id.ShortHex(), tx.index,
              protocol::CheckResultName(c.result()), c.reason());
  if (stage) {
    // A wrong result feeds no tensor to the replica's other stages: every step they trained was
    // honest, so each is paid its whole cost before the round re-runs (PayHonestStageWork).
    const uint64_t h = ctx.state.tasks.Find(tx.task_id)->params.inner_steps;
    for (auto& [index, steps] : rerun.stage_faults) {
      if (index == tx.index) steps = h;
    }
    ML_RETURN_IF_ERROR(PayHonestStageWork(ctx.state, ctx.params(), tx.task_id, rerun));
  }
  ML_RETURN_IF_ERROR(ApplyRerun(ctx.state, tx.task_id, m, rerun));
  // The next block's DriveChecks sets the round's holds from the checks left open.
  SaveMachine(ctx.state, tx.task_id, m);
  return Status::Ok();
}

// The unit a fraud proof after the fact names (ProveFraud, LateChallenge): a paid unit of a final
// round, with its leaves.
Result<const WorkUnit*> FinalPaidUnit(const LedgerState& s, const Hash256& task_id, uint32_t index,
                                      const std::string& what) {
  const TaskRecord* t = s.tasks.Find(task_id);
  if (t == nullptr) return NotFound(what + ": task " + task_id.ToHex() + " not found");
  if (index >= t->unit_count) {
    return InvalidArgument(what + ": index " + std::to_string(index) + " is out of range; task " +
                           task_id.ShortHex() + " has " + std::to_string(t->unit_count) +
                           " units");
  }
  const WorkUnit* u = s.units.Find({task_id, index});
  const std::string unit = "unit " + std::to_string(index) + " of task " + task_id.ShortHex();
  if (u == nullptr) return NotFound(what + ": " + unit + " not found");
  // Final rounds only: until then the unit's check (verdicts, a dispute, ChallengeUnit) rules.
  if (u->round >= t->rounds_settled) {
    return FailedPrecondition(what + ": round " + std::to_string(u->round) + " of task " +
                              task_id.ShortHex() +
                              " is not final yet; while it is open a verifier's mismatch or a "
                              "whistleblower's ChallengeUnit disputes the unit");
  }
  if (u->status != WorkUnitStatus::kVerified || u->leaves.empty()) {
    return FailedPrecondition(what + ": " + unit + " is " +
                              std::string(WorkUnitStatusName(u->status)) +
                              (u->leaves.empty() ? " and has no committed leaves" : "") +
                              "; only a paid unit of a final round with its leaves can be proven");
  }
  return u;
}

// Whether unit `u`'s solver can still answer for it: not proven fraudulent for it already (once
// per unit and solver), and stake still bonded to slash.
Status SolverAnswerable(const LedgerState& s, const TaskRecord& t, const WorkUnit& u,
                        const std::string& what) {
  const std::string unit = "unit " + std::to_string(u.index) + " of task " + t.id.ShortHex();
  for (const ProvenFraud& f : t.verification.proven_frauds) {
    // (A rewind re-ran the unit by another solver: that work is the new solver's to answer for.)
    if (f.index == u.index && f.solver == u.assignee) {
      return FailedPrecondition(what + ": " + unit + " was proven fraudulent at height " +
                                std::to_string(f.height) + " already");
    }
  }
  const NodeRecord* n = s.nodes.Find(u.assignee);
  if (n == nullptr || BondedStake(s, *n) == 0) {
    return FailedPrecondition(
        what + ": the solver " + u.assignee.ShortHex() + " of " + unit +
        " has no stake bonded any more (unbonded and withdrawn): nothing is left to slash; a "
        "proof must come within the unbonding delay (params.unbonding_delay_blocks, at least "
        "params.audit_window_blocks) after the solver unstakes");
  }
  return Status::Ok();
}

// What a unit proven fraudulent after its round was final costs its solver (ProveFraud, and a late
// dispute ruled for its challenger): see ProveFraudTx. `prover` sent the proof; `payee` gets the
// bounty (a ProveFraud's earliest committer, TakeProofCommitter; a late game's challenger unless
// it lied too); none: it stays in the jackpot. REQUIRES: the unit is paid, of a final round, and
// not proven already.
Status ApplyProvenFraud(LedgerState& s, const ChainParams& p, uint64_t height,
                        const Hash256& task_id, uint32_t index, uint32_t segment,
                        const PublicKey& prover, const std::optional<PublicKey>& payee) {
  const TaskRecord* t = s.tasks.Find(task_id);
  const WorkUnit* u = s.units.Find({task_id, index});
  const PublicKey solver = u->assignee;
  // Proven. While the task is open, or within its audit window after it finished, the proof
  // does what fraud found during the task does (taint, ApplyRerun): a finished task is reopened,
  // the task goes back to the first round that holds a paid unit of the solver, what it was paid
  // for every unit from there comes back into the escrow, and the rounds run again without it.
  // After the window the model is final: only what the unit was paid goes back, to the
  // submitter. Either way the solver is slashed as for a lost dispute (while rewinding, into the
  // escrow first: it pays for the redo), and the prover gets its bounty.
  ProvenFraud f{.round = u->round,
                .index = index,
                .segment = segment,
                .solver = solver,
                .prover = prover,
                .height = height};
  const Amount slash = protocol::SlashAmount(AssignedUnitCost(*t, *u), p.slash_multiple);
  const bool reopen =
      t->status == TaskStatus::kFinished && height <= AuditWindowEnd(*t, p.audit_window_blocks);
  f.rewound = reopen || t->status == TaskStatus::kOpen;
  Amount to_escrow = 0;
  if (f.rewound) {
    ML_ASSIGN_OR_RETURN(protocol::RoundStateMachine m, LoadMachine(*t));
    TaskRecord* mt = s.tasks.FindMutable(task_id);
    if (reopen) {
      // Open again, its escrow empty (refunded at the finish) until the claw-back and the
      // slash fund the redo; the final state is what the redo ends with.
      mt->status = TaskStatus::kOpen;
      mt->closed_height = 0;
      mt->final_state = Hash256{};
      ++mt->verification.reopened;
    }
    Rerun rerun{.whole_round = true,
                .round = u->round,
                .shards = {},
                .exclude = {solver},
                .cheaters = {solver}};
    f.rewound_to = FirstTaintedRound(s, task_id, rerun.cheaters, rerun.round);
    const uint32_t redo_rounds =
        std::min(m.round() + 1, mt->params.rounds) - f.rewound_to;  // rounds that run again
    const Amount clawed_before = mt->verification.clawed_back;
    ML_RETURN_IF_ERROR(ApplyRerun(s, task_id, m, rerun));
    SaveMachine(s, task_id, m);
    f.clawed_back = s.tasks.Find(task_id)->verification.clawed_back - clawed_before;
    ML_RETURN_IF_ERROR(SlashSolverIntoEscrow(s, p, task_id, solver, slash, &f.slashed,
                                             &to_escrow, redo_rounds));
  } else {
    Amount clawed = 0;
    ML_RETURN_IF_ERROR(ClawBack(s, task_id, solver, u->paid, &clawed));
    f.clawed_back = clawed;
    ML_RETURN_IF_ERROR(SlashAndRecord(s, p, solver, slash, &f.slashed));
    s.tasks.FindMutable(task_id)->verification.clawed_back += f.clawed_back;
  }
  // A whistleblower's reward (at most one slash, never more than the pool holds), capped by what
  // this slash took; nothing to the solver, its owner or the owner's other nodes
  // (LinkedToCheater): proving one's own fraud gets none of the slash back.
  f.bounty = payee && !LinkedToCheater(s, solver, *payee) ? std::min(f.slashed, s.g().jackpot) : 0;
  if (f.bounty > 0) ML_RETURN_IF_ERROR(PayFromJackpot(s, *payee, f.bounty));
  TaskRecord* mt = s.tasks.FindMutable(task_id);
  mt->verification.slashed += f.slashed;
  mt->verification.redo_escrow += to_escrow;
  mt->verification.proven_frauds.push_back(f);
  ML_LOG_INFO(
      "ledger: task {} unit {} (round {}): fraud proven after the fact in segment {}: "
      "slashed {}, clawed back {}, bounty {} to {}{}",
      task_id.ShortHex(), index, f.round, segment, f.slashed, f.clawed_back, f.bounty,
      payee ? payee->ShortHex() : std::string("nobody (no commitment: it stays in the jackpot)"),
      f.rewound ? (reopen ? ", task reopened" : "") + std::string(", rewound to round ") +
                      std::to_string(f.rewound_to)
                : std::string(", after the audit window: the model stays"));
  return Status::Ok();
}

Status ExecuteProveFraud(ExecContext& ctx, const ProveFraudTx& tx) {
  ML_ASSIGN_OR_RETURN(const WorkUnit* u,
                      FinalPaidUnit(ctx.state, tx.task_id, tx.index, "prove fraud"));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  const std::string unit = "unit " + std::to_string(tx.index) + " of task " + tx.task_id.ShortHex();
  // A stage unit's segment t is its step t (OpenUnitCheck): the proof is the witness of that
  // whole stage step, which the ledger replays as it rules a stage dispute (RefereeStageStep), so
  // only where it rules those (a data root, the stage within kMaxStageWitnessMemory).
  const bool stage = IsPipelineTask(t->params);
  if (stage) {
    const uint32_t s = StageSlotOf(t->params, tx.index).stage;
    if (!LedgerRulesStageStep(t->params, s)) {
      return FailedPrecondition(
          "prove fraud: " + unit + " is stage " + std::to_string(s) +
          " of a pipeline task, which needs " + std::to_string(t->params.stage_memory_bytes[s]) +
          " bytes, over the stage witness bound of " + std::to_string(kMaxStageWitnessMemory) +
          ": the ledger cannot replay its step from a witness");
    }
  } else if (const char* why = SegmentReplayRefusal(t->params); why != nullptr) {
    return FailedPrecondition("prove fraud: task " + tx.task_id.ShortHex() + " is " + why);
  }
  ML_RETURN_IF_ERROR(SolverAnswerable(ctx.state, *t, *u, "prove fraud"));
  Hash256 end, committed;
  if (stage) {
    // Step t's leaf commits the step's start and end states and every tensor it received and
    // sent: the replay's finding leaf (StageFindingLeaf) differs from it exactly when the step
    // does not replay. Its records are judged against the chain of nodes that ran the run. The
    // unit's leaves are its check's (StageCheckLeaves: the commitment, then the step leaves), so
    // step t's leaf is leaves[t + 1], where a unit's segment t ends.
    const uint64_t steps = u->leaves.size() - 1;
    if (tx.segment >= steps) {
      return InvalidArgument("prove fraud: segment " + std::to_string(tx.segment) +
                             " is out of range: a stage unit's segment is its step, and " + unit +
                             " has " + std::to_string(steps) + " steps");
    }
    committed = u->leaves[tx.segment + 1];
    StageStepCheck c;
    if (IsStageContinuityWitness(tx.witness.bytes)) {
      // The step does not start where the previous one ended: the two commits prove it.
      Result<StageContinuityWitness> w = DecodeStageContinuityWitness(tx.witness.bytes);
      if (!w.ok()) return w.status().WithPrefix("prove fraud");
      ML_ASSIGN_OR_RETURN(c, RuleStageContinuity(*t, *u, tx.segment, committed, *w, "prove fraud"));
    } else if (IsStageRecordWitness(tx.witness.bytes)) {
      // A received record that was never sent as committed: the commits of the step prove it.
      Result<StageRecordWitness> w = DecodeStageRecordWitness(tx.witness.bytes);
      if (!w.ok()) return w.status().WithPrefix("prove fraud");
      Result<std::vector<protocol::NodeId>> chain = ReplicaChainOf(ctx.state, *t, tx.index);
      if (!chain.ok()) return chain.status().WithPrefix("prove fraud");
      const StageSlot slot = StageSlotOf(t->params, tx.index);
      std::vector<const WorkUnit*> replica(t->params.stages);
      for (uint32_t s = 0; s < t->params.stages; ++s) {
        replica[s] = ctx.state.units.Find(
            {tx.task_id, StageUnitIndex(t->params, {slot.round, slot.replica, s})});
      }
      ML_ASSIGN_OR_RETURN(c, RuleStageRecord(*t, *u, tx.segment, replica, *chain, *w));
    } else {
      Result<StageStepWitness> w = DecodeStageStepWitness(tx.witness.bytes);
      if (!w.ok()) {
        return w.status().WithPrefix(
            "prove fraud: a pipeline stage's proof carries a stage step witness "
            "(ledger::BuildStageStepWitness), a continuity witness "
            "(ledger::StageContinuityWitness) or a record witness (ledger::StageRecordWitness)");
      }
      Result<std::vector<protocol::NodeId>> chain = ReplicaChainOf(ctx.state, *t, tx.index);
      if (!chain.ok()) return chain.status().WithPrefix("prove fraud");
      ML_ASSIGN_OR_RETURN(
          c, RuleStageStepWitness(*t, *u, tx.segment, committed, *chain, *w, "prove fraud"));
    }
    end = c.leaf;
    if (end != committed) {
      ML_LOG_INFO("ledger: task {} unit {}: stage step {} proven from a {}-byte witness: {}",
                  tx.task_id.ShortHex(), tx.index, tx.segment, tx.witness.bytes.size(), c.message);
    }
  } else {
    Result<SegmentWitness> w = DecodeSegmentWitness(tx.witness.bytes);
    if (!w.ok()) return w.status().WithPrefix("prove fraud");
    ML_ASSIGN_OR_RETURN(end, ExecuteSegmentWitness(*t, *u, tx.segment, *w));
    committed = u->leaves[tx.segment + 1];
  }
  if (end == committed) {
    return FailedPrecondition("prove fraud: " + std::string(stage ? "step " : "segment ") +
                              std::to_string(tx.segment) + " of " + unit +
                              " replays to its committed " + (stage ? "leaf " : "end ") +
                              committed.ShortHex() + "; nothing to prove");
  }
  // The bounty: the earliest committer to this witness, not whoever sent it first.
  const std::optional<PublicKey> payee = TakeProofCommitter(
      ctx.state, ProofWitnessId(tx), ctx.tx.sender, ctx.height, /*nodes_only=*/false);
  return ApplyProvenFraud(ctx.state, ctx.params(), ctx.height, tx.task_id, tx.index, tx.segment,
                          ctx.tx.sender, payee);
}

Status ExecuteLateChallenge(ExecContext& ctx, const LateChallengeTx& tx) {
  const std::string what = "late challenge";
  ML_ASSIGN_OR_RETURN(const WorkUnit* u, FinalPaidUnit(ctx.state, tx.task_id, tx.index, what));
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  const std::string unit = "unit " + std::to_string(tx.index) + " of task " + tx.task_id.ShortHex();
  if (IsPipelineTask(t->params)) {
    return FailedPrecondition(what + ": " + unit +
                              " is a pipeline stage; a stage's step is proven by ProveFraud with "
                              "its stage step witness, not by a late game over segments");
  }
  if (const char* why = SegmentReplayRefusal(t->params); why != nullptr) {
    return FailedPrecondition(what + ": task " + tx.task_id.ShortHex() + " is " + why);
  }
  ML_RETURN_IF_ERROR(SolverAnswerable(ctx.state, *t, *u, what));
  if (u->late.open()) {
    return FailedPrecondition(what + ": a late game on segment " +
                              std::to_string(u->late.segment) + " of " + unit +
                              " is open already (challenger " + u->late.challenger.ShortHex() +
                              "); its outcome decides the unit");
  }
  const uint64_t segments = u->leaves.size() - 1;
  if (tx.segment >= segments) {
    return InvalidArgument(what + ": segment " + std::to_string(tx.segment) +
                           " is out of range; " + unit + " has " + std::to_string(segments) +
                           " segments");
  }
  const Hash256& committed = u->leaves[tx.segment + 1];
  if (tx.end.IsZero() || tx.end == committed) {
    return InvalidArgument(what + ": end must be the state hash your replay of segment " +
                           std::to_string(tx.segment) + " reaches, other than its committed leaf " +
                           committed.ShortHex());
  }
  if (ctx.tx.sender == u->assignee) {
    return InvalidArgument(what + ": a solver cannot challenge its own unit");
  }
  const Amount min_bond = LateChallengeMinBond(*t, *u);
  if (tx.bond < min_bond) {
    return InvalidArgument(what + ": bond must be at least " + std::to_string(min_bond) +
                           " (the unit's cost: what the solver's re-run to answer is worth), got " +
                           std::to_string(tx.bond));
  }
  // The dispute a whistleblower's mismatch on the segment would open (UnitCheck::DisputeOver),
  // with the committed leaves in place of proven ones and the late game's turns.
  const MismatchClaimField claim{.segment = tx.segment,
                                 .start = u->leaves[tx.segment],
                                 .start_proof = {},
                                 .solver_end = committed,
                                 .end_proof = {},
                                 .replayed_end = tx.end};
  ML_ASSIGN_OR_RETURN(std::optional<protocol::DisputeConfig> layout,
                      TilePhaseOf(ctx.state, *u, tx.bundle, claim, what));
  protocol::DisputeConfig dc = layout.value_or(protocol::DisputeConfig{});
  dc.unit = protocol::UnitId{tx.task_id, u->round, u->shard};
  dc.defender = u->assignee;
  dc.challenger = ctx.tx.sender;
  const protocol::SegmentSteps steps = protocol::SegmentStepsOf(
      t->params.inner_steps, t->params.checkpoint_interval, tx.segment);
  dc.first_step = steps.first_step;
  dc.last_step = steps.last_step;
  dc.agreed = u->leaves[tx.segment];
  dc.defender_claim = committed;
  dc.challenger_claim = tx.end;
  dc.response_blocks = LateResponseBlocks(ctx.genesis, *t);
  dc.start_height = ctx.height;
  dc.tolerance = false;  // SegmentReplayRefusal: exact mode only
  dc.referee_blocks = ctx.params().referee_blocks;
  Result<protocol::DisputeGame> game = protocol::DisputeGame::Create(dc);
  if (!game.ok()) return game.status().WithPrefix(what);
  ML_RETURN_IF_ERROR(Debit(ctx.state, ctx.tx.sender, tx.bond, "late challenge bond"));
  ctx.state.units.FindMutable({tx.task_id, tx.index})->late =
      LateGame{.challenger = ctx.tx.sender,
               .segment = tx.segment,
               .bond = tx.bond,
               .game = game->Encode()};
  ctx.state.tasks.FindMutable(tx.task_id)->verification.late_games.push_back(tx.index);
  ML_LOG_INFO("ledger: task {} unit {}: late game opened on segment {} by {} (bond {}, turns of "
              "{} blocks)",
              tx.task_id.ShortHex(), tx.index, tx.segment, ctx.tx.sender.ShortHex(), tx.bond,
              dc.response_blocks);
  return Status::Ok();
}

Status DriveLateGames(LedgerState& s, const Genesis& g, uint64_t height, const Hash256& task_id) {
  const std::vector<uint32_t> open = s.tasks.Find(task_id)->verification.late_games;
  for (uint32_t index : open) {
    const WorkUnit* u = s.units.Find({task_id, index});
    if (u == nullptr || !u->late.open()) {
      return DataLoss("task " + task_id.ShortHex() + ": late_games names unit " +
                      std::to_string(index) + ", which has no late game");
    }
    ML_ASSIGN_OR_RETURN(protocol::DisputeGame game, LoadLateGame(*u));
    if (LateGameMoot(*s.tasks.Find(task_id), *u, game)) {
      // Nothing left to decide: the challenger gets its bond back.
      const LateGame late = CloseLateGame(s, task_id, index);
      ML_LOG_INFO("ledger: task {} unit {}: late game closed: the unit was taken back meanwhile",
                  task_id.ShortHex(), index);
      ML_RETURN_IF_ERROR(Credit(s, late.challenger, late.bond));
      continue;
    }
    ML_RETURN_IF_ERROR(game.OnBlock(height));
    if (game.stage() == protocol::DisputeStage::kDisputeResolved) {
      ML_RETURN_IF_ERROR(SettleLateGame(s, g.params, height, task_id, index, game));
    } else {
      SaveLateGame(s, *u, game);
    }
  }
  return Status::Ok();
}

std::map<PublicKey, StakeHold> OpenCheckHold(const LedgerState& s, const ChainParams& p,
                                             const std::set<PublicKey>& nodes, uint64_t height) {
  std::map<PublicKey, StakeHold> least;
  auto keep = [&](const PublicKey& node, StakeHold h) {
    auto [it, added] = least.try_emplace(node, h);
    if (!added && h.holds_from < it->second.holds_from) it->second = std::move(h);
  };
  // Whether a hold from `holds_from` would keep more of `node`'s entries than the one it has.
  auto wider = [&](const PublicKey& node, uint64_t holds_from) {
    auto it = least.find(node);
    return it == least.end() || holds_from < it->second.holds_from;
  };
  for (const auto& [id, t] : s.tasks.rows()) {
    for (uint32_t index : t.verification.late_games) {
      const WorkUnit* u = s.units.Find({id, index});
      if (u == nullptr || !u->late.open()) continue;
      Result<protocol::DisputeGame> game = LoadLateGame(*u);
      if (!game.ok() || !nodes.contains(game->config().defender)) continue;
      // Its unit's round is final: committed before any entry matured that a slash could reach.
      keep(game->config().defender,
           StakeHold{.task_id = id,
                     .index = index,
                     .round = u->round,
                     .part = "solved",
                     .why = "a late dispute on it (LateChallenge) is open; the stake is "
                            "released once the game is ruled",
                     .retry_height = std::max(height, game->query().deadline_height) + 1,
                     .holds_from = 0});
    }
    if (t.status != TaskStatus::kOpen || t.runtime.empty()) continue;
    Result<protocol::RoundStateMachine> m = LoadMachine(t);
    if (!m.ok() || m->phase() == protocol::RoundPhase::kRoundPhaseFinal) continue;
    const uint32_t per_round = t.params.units_per_round;
    for (uint32_t index = m->final_rounds() * per_round; index < (m->round() + 1) * per_round;
         ++index) {
      const WorkUnit* u = s.units.Find({id, index});
      if (u == nullptr || !m->Unfinal(u->round)) continue;
      const std::string released = "round " + std::to_string(u->round) + " is final";
      // Entries unbonded at or after the unit's assignment (release_height = unbonding height
      // + the delay) were bonded when it was assigned.
      const protocol::Assignment* a = m->AssignmentOf(u->round, u->shard);
      const bool assigned = a != nullptr && nodes.contains(a->node);
      const uint64_t since_assigned =
          assigned && a->assigned_height <= UINT64_MAX - p.unbonding_delay_blocks
              ? a->assigned_height + p.unbonding_delay_blocks
              : UINT64_MAX;
      if (u->check.empty()) {
        if (!assigned || u->status != WorkUnitStatus::kAssigned) continue;
        keep(a->node,
             StakeHold{.task_id = id,
                       .index = index,
                       .round = u->round,
                       .part = "was assigned",
                       .why = "has not committed it (deadline height " +
                              std::to_string(a->deadline_height) +
                              "); the stake is released once it is committed, its check has "
                              "settled and " +
                              released + ", or the assignment expires",
                       .retry_height = std::max(height, a->deadline_height) + 1,
                       .holds_from = since_assigned});
        continue;
      }
      Result<UnitCheck> c = LoadCheck(*u);
      if (!c.ok()) continue;
      // The end of the window the check is in now: a lower bound on when it can be over (a
      // dispute's next turns, a merits window and the round's finality may come after it).
      uint64_t end = height;
      if (c->stage() == CheckStage::kCheckCommitVerdicts ||
          c->stage() == CheckStage::kCheckRevealVerdicts) {
        end = std::max(end, c->deadline_height());
      }
      if (c->dispute()) end = std::max(end, c->dispute()->query().deadline_height);
      if (c->awaits_merits()) end = std::max(end, c->merits_deadline());
      const uint64_t committed = c->config().commit_height;
      // The solver and the drawn verifiers: slashable until the check has settled and the round
      // is final (a whistleblower's win slashes the verifiers that called the unit clean).
      auto check_hold = [&](const PublicKey& node, bool verifier) {
        const uint64_t holds_from =
            std::min(committed, a != nullptr && a->node == node ? since_assigned : UINT64_MAX);
        if (!wider(node, holds_from)) return;
        std::string why = c->stage() == CheckStage::kCheckSettled
                              ? "its check settled " +
                                    std::string(protocol::CheckResultName(c->result())) +
                                    " in round " + std::to_string(u->round) +
                                    ", which is not final: a whistleblower may still challenge it"
                              : "its check is " + std::string(protocol::CheckStageName(c->stage()));
        why += "; the stake is released once the check has settled and " + released;
        keep(node, StakeHold{.task_id = id,
                             .index = index,
                             .round = u->round,
                             .part = verifier ? "was drawn to verify" : "solved",
                             .why = std::move(why),
                             .retry_height = end + 1,
                             .holds_from = holds_from});
      };
      const std::vector<protocol::NodeId>& drawn = c->verifiers();
      if (nodes.contains(c->config().solver)) check_hold(c->config().solver, false);
      for (const protocol::NodeId& v : drawn) {
        if (v != c->config().solver && nodes.contains(v)) check_hold(v, true);
      }
      // A whistleblower's challenge (ChallengeUnit): its stake is the challenge's bond, taken
      // (UnitCheck's slash) when it loses the dispute, by a ruling or by missing its turn. Its
      // entries that matured after the challenge are held while the dispute runs (its merits
      // window included); once it settles the challenge can slash it no more, whatever the
      // round. A drawn verifier's own dispute is its verdict's, held above.
      if (c->stage() == CheckStage::kCheckDisputed && c->dispute()) {
        const PublicKey& wb = c->dispute()->config().challenger;
        const uint64_t holds_from = c->dispute()->config().start_height;
        if (nodes.contains(wb) && wb != c->config().solver &&
            std::find(drawn.begin(), drawn.end(), wb) == drawn.end() && wider(wb, holds_from)) {
          keep(wb, StakeHold{.task_id = id,
                             .index = index,
                             .round = u->round,
                             .part = "challenged",
                             .why = "its challenge (ChallengeUnit) is disputed; the stake is "
                                    "released once the dispute is over (a loss slashes it)",
                             .retry_height = end + 1,
                             .holds_from = holds_from});
        }
      }
    }
  }
  return least;
}

Status ExecuteRuleDispute(ExecContext& ctx, const RuleDisputeTx& tx) {
  constexpr std::string_view kWhat = "rule dispute";
  const PublicKey referee = RefereeKey(ctx.genesis);
  if (referee == PublicKey{} || ctx.tx.sender != referee) {
    return PermissionDenied("rule dispute: only the chain's referee " +
                            (referee == PublicKey{} ? std::string("(none configured)")
                                              : referee.ShortHex()) +
                            " may rule");
  }
  ML_ASSIGN_OR_RETURN(RefereeStage r, DisputeAtReferee(ctx.state, tx.task_id, tx.index, kWhat));
  UnitCheck& c = r.check;
  protocol::DisputeGame* game = c.mutable_dispute();
  if (game->referee_task().tile) {
    return FailedPrecondition("rule dispute: the dispute on unit " + std::to_string(tx.index) +
                              " of task " + tx.task_id.ShortHex() +
                              " narrowed to one tile, which the ledger recomputes itself; send "
                              "RefereeTile with the tile's witness");
  }
  const TaskRecord* t = ctx.state.tasks.Find(tx.task_id);
  if (LedgerRulesFromRoots(*t, game->referee_task())) {
    return FailedPrecondition(
        "rule dispute: the dispute on unit " + std::to_string(tx.index) + " of task " +
        tx.task_id.ShortHex() + " ended at " +
        (game->referee_task().roots == protocol::RefereeRoots::kRootsChainEnd
             ? std::string("a step whose operator outputs both parties agreed to")
             : "operator " + std::to_string(game->referee_task().operator_index) +
                   " of the step's input state") +
        ", which the ledger rules itself from roots; send RefereeTile with the task's bundle "
        "and a witness of the operator output roots (" +
        (IsPipelineTask(t->params) ? "a pipeline stage's, with its commit: "
                                     "ledger::BuildStageRootsWitness)"
                                   : "ledger::BuildTileWitness)") +
        (game->referee_task().roots == protocol::RefereeRoots::kRootsOperator &&
                 LedgerExecutes(*t, game->referee_task())
             ? std::string(" for an operator of the input state, or RefereeStep with the "
                           "step's witness for one without a footprint")
             : std::string()));
  }
  if (IsPipelineTask(t->params) &&
      LedgerRulesStageStep(t->params, StageSlotOf(t->params, tx.index).stage)) {
    return FailedPrecondition("rule dispute: unit " + std::to_string(tx.index) + " of task " +
                              tx.task_id.ShortHex() +
                              " is a pipeline stage whose step the ledger replays itself; send "
                              "RefereeStageStep with the stage step's witness");
  }
  // Over the stage witness bound the key rules no stage claim either. Every stage mismatch there
  // carried the bundle and played the tile phase (MismatchNeedsBundle), a continuity claim is
  // ruled from its commits (RefereeStageStep, any size), a claim that the stage served nothing is
  // answered by its evidence in pieces (ServeStageEvidence) or lost at its serving window's end,
  // and a stage without parameters, whose chain end no state could rule, is refused with its cut
  // (engine::TaskPipelineCut): a whole-step game of any other stage claim has a bundle whose cut
  // the engine refuses, which no key should rule either.
  if (IsPipelineTask(t->params)) {
    const bool unserved = ServesStageEvidence(t->params, tx.index, *game);
    return FailedPrecondition(
        "rule dispute: unit " + std::to_string(tx.index) + " of task " + tx.task_id.ShortHex() +
        " is a pipeline stage, whose disputes the ledger rules itself; the genesis key rules "
        "none" +
        (unserved ? std::string(": the claim that the stage served nothing for the step is "
                                "answered by its evidence in pieces (ServeStageEvidence) by the "
                                "end of its serving window, or ruled against the stage then")
                  : std::string(" (RefereeTile, RefereeStageStep)")));
  }
  if (LedgerExecutes(*t, game->referee_task())) {
    return FailedPrecondition("rule dispute: task " + tx.task_id.ShortHex() +
                              " has a data root, so the ledger executes the disputed step "
                              "itself; send RefereeStep with the step's witness");
  }
  // Left to the genesis key: tolerance mode (a segment) and a token task whose plan the tile
  // phase does not serve (its mismatch carried the bundle, so a whole-step game of a token task
  // with a data root means TileContextOf refused the task's own bundle: no such plan today, since
  // micro-batched steps are planned too). No exact-mode task without a data root reaches here: a
  // verifying chain refuses it at SubmitTask (ValidateTaskTerms).
  if (game->referee_task().segment) {
    if (tx.tolerance_verdict != 1 && tx.tolerance_verdict != 2) {
      return InvalidArgument("rule dispute: unit " + std::to_string(tx.index) +
                             " is verified in tolerance mode; tolerance_verdict must be 1 "
                             "(within tolerance) or 2 (outside), got " +
                             std::to_string(tx.tolerance_verdict));
    }
    ML_RETURN_IF_ERROR(game->RuleTolerance(tx.tolerance_verdict == 1));
  } else {
    if (tx.tolerance_verdict != 0) {
      return InvalidArgument("rule dispute: unit " + std::to_string(tx.index) +
                             " is verified exactly; rule with `output` and tolerance_verdict 0");
    }
    ML_RETURN_IF_ERROR(game->Rule(tx.output));
  }
  SaveCheck(ctx.state, tx.task_id, tx.index, c);
  RecordRuling(ctx, tx.task_id, tx.index, *game, /*witness_bytes=*/0);
  return Status::Ok();
}

nlohmann::json UnitCheckToJson(const UnitCheck& c) {
  nlohmann::json verifiers = nlohmann::json::array();
  for (const protocol::NodeId& v : c.verifiers()) verifiers.push_back(v.ToHex());
  nlohmann::json j = {{"stage", std::string(protocol::CheckStageName(c.stage()))},
                      {"result", std::string(protocol::CheckResultName(c.result()))},
                      {"reason", c.reason()},
                      {"solver", c.config().solver.ToHex()},
                      {"commit_height", c.config().commit_height},
                      {"deadline_height", c.deadline_height()},
                      {"verifiers", std::move(verifiers)},
                      {"segments", c.segments()},
                      {"num_segments", protocol::SegmentCount(c.config().inner_steps,
                                                              c.config().checkpoint_interval)},
                      {"dispute", nullptr}};
  // A whistleblower's dispute lost by the solver's silence: the last height its merits may be
  // shown at (ProveMerits), only while the window is open.
  if (c.awaits_merits()) j["merits_deadline"] = c.merits_deadline();
  if (const auto& d = c.dispute()) j["dispute"] = DisputeGameToJson(*d);
  return j;
}

nlohmann::json DisputeGameToJson(const protocol::DisputeGame& game) {
  const protocol::DisputeGame* d = &game;
  {
    nlohmann::json dj = {{"stage", std::string(protocol::DisputeStageName(d->stage()))},
                         {"defender", d->config().defender.ToHex()},
                         {"challenger", d->config().challenger.ToHex()},
                         {"first_step", d->config().first_step},
                         {"last_step", d->config().last_step},
                         {"agreed", d->config().agreed.ToHex()},
                         {"turns", d->turns()}};
    dj["num_operators"] = d->config().num_operators;
    dj["tile_phase"] = !d->config().operator_tiles.empty();
    const protocol::DisputeStage st = d->stage();
    if (st == protocol::DisputeStage::kDisputeSteps ||
        st == protocol::DisputeStage::kDisputeOperators ||
        st == protocol::DisputeStage::kDisputeTiles ||
        st == protocol::DisputeStage::kDisputeReduction) {
      protocol::DisputeQuery q = d->query();
      dj["query"] = {{"stage", std::string(protocol::DisputeStageName(q.stage))},
                     {"position", q.position},
                     {"step", q.step},
                     {"deadline_height", q.deadline_height},
                     {"operator_index", q.operator_index},
                     {"children", q.children},
                     {"level", q.level},
                     {"tile", q.tile}};
    } else if (st == protocol::DisputeStage::kDisputeReferee) {
      const protocol::RefereeTask& r = d->referee_task();
      dj["referee"] = {{"whole_step", r.whole_step},
                       {"segment", r.segment},
                       {"first_step", r.first_step},
                       {"step", r.step},
                       {"operator_index", r.operator_index},
                       {"input", r.input.ToHex()},
                       {"defender_output", r.defender_output.ToHex()},
                       {"challenger_output", r.challenger_output.ToHex()},
                       {"tile", r.tile},
                       {"tile_index", r.tile_index},
                       {"tile_count", r.tile_count},
                       {"reduction_blocks", r.reduction_blocks},
                       {"block", r.block},
                       {"state_input", r.state_input.ToHex()},
                       {"partial_input", r.partial_input.ToHex()},
                       {"roots", static_cast<int>(r.roots)}};
      if (r.roots != protocol::RefereeRoots::kRootsNone) {
        dj["referee"]["chain_end"] = r.chain_end.ToHex();
        dj["referee"]["operator_input"] = r.operator_input.ToHex();
        dj["referee"]["defender_operator_output"] = r.defender_operator_output.ToHex();
        dj["referee"]["challenger_operator_output"] = r.challenger_operator_output.ToHex();
      }
    } else {
      dj["outcome"] = {{"defender_honest", d->outcome().defender_honest},
                       {"challenger_honest", d->outcome().challenger_honest},
                       {"reason", d->outcome().reason}};
    }
    return dj;
  }
}

}  // namespace meshlearn::ledger
