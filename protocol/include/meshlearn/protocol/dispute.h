// The dispute game: two-phase bisection with a referee (Verde-style refereed delegation;
// DESIGN.md, "One task, end to end", step 7).
//
// A defender (the solver) and a challenger (a verifier or whistleblower) agree on the training
// state after step `first_step` and disagree on the state after `last_step`. The game narrows the
// disagreement by bisection, both parties posting the hash at the midpoint each turn:
//
//   phase 1 (steps)      positions are training steps in [first, last]; equal hashes at the
//                        midpoint move the agreed end up, different ones move the disputed end
//                        down, until one step separates them;
//   phase 2 (operators)  inside that step, positions 0..num_operators over the chained operator
//                        hashes C_0 = agreed state hash, C_j = OperatorChainHash(C_{j-1}, out_j)
//                        (the engine records out_j, the hash of operator j's output, in a fixed
//                        order); the parties first post C_n, then bisect down to one operator;
//   phase 3 (tiles)      when the config gives the operators' tile counts (operator_tiles),
//                        the game narrows operator j further, to one tile of its output: both
//                        parties first post out_j, the operator's tiled root (engine/tile.h),
//                        which must chain to their C_j (OperatorChainHash(C_{j-1}, out_j)); then,
//                        from the root down, both post the two children of the disputed Merkle
//                        node (PostChildren; each pair must hash to the party's node) and the
//                        game descends into the first child that differs, down to one leaf:
//                        MerkleLeafHash(TileHash(tile t));
//   phase 4 (reduction)  when that operator's tiles are long reductions (operator_blocks > 0),
//                        the parties bisect the tile's partial sums S_0 = 0, S_1, .., S_K over
//                        the fixed blocks of the engine's reduction order (positions 1..K-1
//                        post TileHash(S_k); position K is the disputed leaf), down to one block;
//   referee              the ledger computes that single transition (one block or one tile of
//                        one operator, one operator, or one whole step when num_operators == 0,
//                        the parties agree on C_n, or the operator has no tiles: the step's
//                        input state) from inputs it checks against the agreed hashes, and
//                        Rule()s with the correct output. In a tile-phase game the last two
//                        whole steps are also ruled from roots (RefereeRoots): the correct
//                        state hash from the agreed C_n, the input-state operator's correct C_j
//                        (RuleOperator) from the agreed input state.
//
// A party whose claim equals the referee's output wins; a party that posts nothing by a turn's
// deadline loses at once. Because an honest party only ever posts true hashes, every hash both
// parties agree on is true, so the final transition starts from a true input and the honest
// party's output is the referee's: an honest party never loses.
//
// Pure: heights come in with the calls. The state has one canonical encoding (Encode/Decode) so
// the ledger keeps it in its state hash; a game without a tile phase encodes as it always did
// (version 1), one with it as version 2, and one whose referee task is ruled from roots
// (RefereeTask::roots) as version 3: version 2 followed by the roots fields.
//
//   Result<DisputeGame> g = DisputeGame::Create(config);
//   DisputeQuery q = g->query();                           // stage, position, deadline
//   g->Post(DisputeParty::kDefender, q.position, h_defender, height);
//   g->Post(DisputeParty::kChallenger, q.position, h_challenger, height);
//   g->OnBlock(height);                                    // deadlines
//   if (g->stage() == DisputeStage::kDisputeReferee) g->Rule(referee_output_hash);
//   g->outcome();                                          // who was honest
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/protocol/types.h"

namespace meshlearn::protocol {

enum class DisputeParty : uint8_t {
  kDefender = 0,    // the solver whose work is challenged
  kChallenger = 1,  // the verifier (or whistleblower) that found a mismatch
};
std::string_view DisputePartyName(DisputeParty p);

enum class DisputeStage : uint8_t {
  kDisputeSteps = 0,      // phase 1: bisecting training steps
  kDisputeOperators = 1,  // phase 2: bisecting the operators of one step
  kDisputeReferee = 2,    // waiting for the referee's computation
  kDisputeResolved = 3,
  kDisputeTiles = 4,      // phase 3: bisecting one operator's output tiles
  kDisputeReduction = 5,  // phase 4: bisecting one tile's reduction blocks
};
std::string_view DisputeStageName(DisputeStage s);

// C_j = BLAKE2b("meshlearn.dispute.op", C_{j-1}, out_j): one hash commits to every operator
// output up to j, so agreeing on C_j means agreeing on all of them.
Hash256 OperatorChainHash(const Hash256& previous, const Hash256& operator_output);

struct DisputeConfig {
  UnitId unit;
  NodeId defender;
  NodeId challenger;
  uint64_t first_step = 0;  // both agree on the state after this step
  uint64_t last_step = 0;   // they disagree on the state after this step (> first_step)
  Hash256 agreed;           // state hash after first_step
  Hash256 defender_claim;   // state hash after last_step, per the defender
  Hash256 challenger_claim; // ... per the challenger (!= defender_claim)
  uint32_t num_operators = 0;  // recorded operator outputs per step; 0: the referee runs steps
  uint64_t response_blocks = 10;  // blocks each turn may take
  uint64_t start_height = 0;
  // Tolerance mode (a task for hardware without bitwise reproducibility, verification.h): state
  // hashes never agree across machines, so there is nothing to bisect. The game goes straight
  // to the referee, which replays the whole segment from the agreed start state and rules
  // whether the defender's committed end state is within the task's tolerance (RuleTolerance).
  bool tolerance = false;
  // Blocks the referee has to rule once the game reaches it (0: no limit). Past them the game
  // ends undecided: nobody was shown to lie, nobody is punished.
  uint64_t referee_blocks = 0;
  // Phase 3: the number of output tiles of each operator (operator j at index j - 1), from the
  // engine's tile plan (engine/tile_rule.h); 0 for an operator that is not recomputed by tile
  // (the step's input state: a dispute there goes to the whole-step referee). Empty: no tile
  // phase, the referee recomputes one whole operator. Else exactly num_operators entries.
  std::vector<uint64_t> operator_tiles;
  // Phase 4: the reduction blocks of each operator's tiles (0: recomputed whole). Empty, or
  // num_operators entries.
  std::vector<uint32_t> operator_blocks;
};

// What both parties must post now.
struct DisputeQuery {
  DisputeStage stage = DisputeStage::kDisputeSteps;
  // A step (phase 1), an operator chain index C_position (phase 2), the operator j (phase 3's
  // opening: post out_j), a node index at `level` (phase 3: PostChildren), a block boundary k
  // (phase 4: post TileHash(S_k)).
  uint64_t position = 0;
  uint64_t step = 0;      // phases 2-4: the step whose operators are bisected
  uint64_t deadline_height = 0;
  uint32_t operator_index = 0;  // phases 3-4: the disputed operator j (1-based)
  bool children = false;        // phase 3: post the two children of node (level, position)
  uint32_t level = 0;           // phase 3: the node's level (0 = the leaves, the tiles)
  uint64_t tile = 0;            // phase 4: the disputed tile
};

// How a whole step that the operator phase of a tile-phase game ended at is ruled from roots
// (protocol/dispute.h, the referee; ledger/referee_tile.h, RuleRoots): the state hash is
// StateHashOfRoots of the state's tensors' tiled roots (engine/checkpoint.h), and those roots
// are the step's first operator outputs (the input state, "in.<name>") and its last ones (the
// state it leaves), so both cases are ruled from a witness of roots, whatever the model's size.
enum class RefereeRoots : uint8_t {
  kRootsNone = 0,
  // Both parties agreed on the chain end C_n (`chain_end`) but not on the state after the step:
  // the correct state hash is StateHashOfRoots of the step's last operator outputs.
  kRootsChainEnd = 1,
  // The disputed operator (`operator_index`) has no tiles: an operator of the step's input state
  // (its correct output is that tensor's root in the agreed input state, so the correct C_j is
  // OperatorChainHash(operator_input, root)), or one computed without a footprint yet (the
  // roots do not rule it; the whole step does).
  kRootsOperator = 2,
};

// The single transition the referee computes once the game has narrowed it.
struct RefereeTask {
  bool whole_step = true;       // true: one training step; false: one operator of `step`
  // Tolerance mode: the whole segment from `first_step` to `step`, judged by RuleTolerance.
  bool segment = false;
  uint64_t first_step = 0;
  uint64_t step = 0;            // from the state after step - 1 to the state after step
  uint32_t operator_index = 0;  // 1-based operator index when !whole_step
  // Input hash the referee must start from (a state hash for a whole step, C_{j-1} for an
  // operator) and the two claimed outputs (a state hash, or C_j).
  Hash256 input;
  Hash256 defender_output;
  Hash256 challenger_output;
  // Phases 3-4: one tile of operator `operator_index` (input: the agreed C_{j-1}). The referee
  // recomputes tile `tile_index` (of `tile_count`), or, when reduction_blocks > 0, its block
  // `block`: from S_block (TileHash = partial_input; block 0 starts from zeros, partial_input
  // is zero) to S_{block+1}. The outputs are in the form the parties posted: the leaf
  // MerkleLeafHash(TileHash(tile)) when the result is the tile (no reduction, or the last
  // block), else TileHash(S_{block+1}).
  bool tile = false;
  uint64_t tile_index = 0;
  uint64_t tile_count = 0;
  uint32_t reduction_blocks = 0;
  uint32_t block = 0;
  Hash256 state_input;    // C_0: the state hash the step starts from
  Hash256 partial_input;  // TileHash(S_block); zero for block 0
  // A whole step of a tile-phase game that the ledger also rules from roots (RefereeRoots; the
  // task stays a whole step, so a whole-step referee rules it as before). kRootsChainEnd: the
  // agreed C_n. kRootsOperator: operator_index is the disputed operator j, operator_input the
  // agreed C_{j-1}, and the parties' C_j; RuleOperator rules on those.
  RefereeRoots roots = RefereeRoots::kRootsNone;
  Hash256 chain_end;
  Hash256 operator_input;
  Hash256 defender_operator_output;
  Hash256 challenger_operator_output;
};

struct DisputeOutcome {
  bool defender_honest = false;
  bool challenger_honest = false;
  bool undecided = false;  // the referee did not rule in time (both count as honest)
  // Decided by the challenger's silence alone: the defender posted, the challenger missed its
  // turn, so nothing was ruled about the claim. Set when the game resolves at the missed
  // deadline and not encoded: UnitCheck::OnBlock reads it in the call that resolved the game.
  bool challenger_silent = false;
  // Decided by the defender's silence: it missed its turn (the challenger posted or was silent
  // too), so nothing was ruled about the defender's work either. Set and read as
  // challenger_silent is (not encoded).
  bool defender_silent = false;
  // defender_honest and challenger_honest both true with undecided false: a claim of availability
  // answered (RuleServed: the stage served its step's evidence on chain), which shows neither
  // party's work wrong; the step itself is checked from that evidence afterwards.
  std::string reason;  // "referee: defender's output differs", "challenger missed its turn", ...
};

class DisputeGame {
 public:
  static Result<DisputeGame> Create(const DisputeConfig& config);

  const DisputeConfig& config() const { return config_; }
  DisputeStage stage() const { return stage_; }
  // Valid in the steps and operators stages.
  DisputeQuery query() const;
  // Valid in the referee stage. For a whole step, `step` is the step the referee executes: from
  // the agreed state after step-1 to the state after step.
  const RefereeTask& referee_task() const { return referee_; }
  // Valid once resolved.
  const DisputeOutcome& outcome() const { return outcome_; }
  // The (1-based) step the steps stage narrowed to, the referee task's step for an exact-mode
  // game: kept once the game moves on to the step's operators, its tiles, the referee or a
  // resolution (a party silent in a later stage loses at that step). 0 while the steps are
  // bisected, for a game resolved before it narrowed to one, and in tolerance mode.
  uint64_t step() const { return step_; }
  // Turns played so far (both parties posted): at most ceil(log2(steps)) + 1 + ceil(log2(ops)).
  uint32_t turns() const { return turns_; }

  // A party's hash for the current query. Refused (nothing changes): a resolved or referee
  // stage, a position that is not the query's, a post after the deadline, a second post by
  // the same party this turn. The second post of a turn advances the game.
  // Phase 3's opening: the party's out_j, refused unless OperatorChainHash(C_{j-1}, out_j) is
  // the party's C_j. Phase 4: TileHash(S_position).
  Status Post(DisputeParty party, uint64_t position, const Hash256& hash, uint64_t height);
  // Phase 3: the two children of the disputed node (query().level, query().position), refused
  // unless MerkleInnerHash(left, right) is the party's node hash.
  Status PostChildren(DisputeParty party, uint64_t position, const Hash256& left,
                      const Hash256& right, uint64_t height);

  // A new block. After a turn's deadline, a party that has not posted loses (both: both lose).
  // In the referee stage, after referee_blocks the game ends undecided. Heights never decrease.
  Status OnBlock(uint64_t height);
  // The referee stage waits until `height` (query().deadline_height) if that is later than its
  // deadline now: the ledger's serving window of a stage claimed to have served nothing, over the
  // stage witness bound, whose evidence takes more blocks to post than referee_blocks
  // (ledger/stage_serve.h, ServeWindowBlocks). FailedPrecondition outside the referee stage.
  Status ExtendRefereeDeadline(uint64_t height);

  // The referee's computed output for referee_task(): the party whose output equals it is
  // honest; if neither does, both lied. Not for a tolerance-mode segment.
  Status Rule(const Hash256& correct_output);
  // A kRootsChainEnd task (RefereeTask::roots): the correct state hash after the step, which the
  // ledger derives from the roots of the agreed chain end. Rules as Rule does; only the outcome's
  // reason differs (the step was ruled from roots, not recomputed). FailedPrecondition for any
  // other task.
  Status RuleChainEnd(const Hash256& correct_state);
  // A kRootsOperator task (RefereeTask::roots): the correct C_j of the disputed operator,
  // compared with the parties' C_j (a party that posted a wrong C_j lied; the other wins).
  // FailedPrecondition for any other task.
  Status RuleOperator(const Hash256& correct_operator_output);
  // A whole step whose claim is that the defender served nothing for it (a pipeline stage over
  // the stage witness bound, ledger/stage_serve.h), ruled by whether its evidence came on chain:
  // `served` (every piece in by the serving window's end): the claim is answered and neither
  // party is shown to lie (both honest, not undecided: the claimant could not fetch what the
  // stage then published; the step's computation is checked from that evidence afterwards);
  // not served (`window_end` passed with a piece missing): the defender loses, as a silent party.
  // The outcome's reason says which. FailedPrecondition outside the referee stage or for a
  // tolerance-mode segment.
  Status RuleServed(bool served, uint64_t window_end);
  // Tolerance mode: whether the defender's committed end state is within tolerance of the
  // referee's replay of the segment (then the defender was honest, else the challenger).
  Status RuleTolerance(bool defender_within_tolerance);

  Bytes Encode() const;
  static Result<DisputeGame> Decode(ByteSpan bytes);

 private:
  explicit DisputeGame(const DisputeConfig& config);
  void Advance();  // after both posts of a turn
  void EnterReferee(bool whole_step, uint64_t step, uint32_t op, const Hash256& input,
                    const Hash256& d_out, const Hash256& c_out, uint64_t height);
  void StartTurn(uint64_t height);
  // Ends the game with the referee's ruling: `how` says what it ruled and how.
  void Resolve(bool defender_honest, bool challenger_honest, const std::string& how);
  bool tiled() const { return !config_.operator_tiles.empty(); }
  Status CheckTurn(const std::string& who, uint64_t position, uint64_t height,
                   std::optional<Hash256>& slot) const;
  void EnterTiles(uint64_t height);  // phase 2 narrowed to operator op_
  void DescendTiles(uint64_t height);  // skip promoted nodes; leaf: phase 4 or the referee
  void EnterTileReferee(uint64_t height);

  DisputeConfig config_;
  DisputeStage stage_ = DisputeStage::kDisputeSteps;
  // Bisection interval: agreed at lo (hash lo_hash), disputed at hi (claims d_hi, c_hi).
  uint64_t lo_ = 0;
  uint64_t hi_ = 0;
  Hash256 lo_hash_;
  Hash256 d_hi_;
  Hash256 c_hi_;
  // Phase 2 needs the step being bisected and its state claims (the whole-step fallback).
  uint64_t step_ = 0;
  Hash256 step_input_;
  Hash256 step_d_out_;
  Hash256 step_c_out_;
  bool chain_end_known_ = false;  // phase 2: C_n claims posted
  uint64_t position_ = 0;
  uint64_t deadline_ = 0;
  uint64_t last_post_height_ = 0;  // height of the post that completed the last turn
  std::optional<Hash256> d_post_;
  std::optional<Hash256> c_post_;
  uint32_t turns_ = 0;
  RefereeTask referee_;
  DisputeOutcome outcome_;
  // Phases 3-4 (version 2).
  uint32_t op_ = 0;          // the disputed operator j
  Hash256 op_input_;         // C_{j-1}
  bool root_known_ = false;  // phase 3: out_j posted
  uint32_t level_ = 0;       // phase 3: the disputed node
  uint64_t node_ = 0;
  std::optional<Hash256> d_right_;  // phase 3: the right children posted this turn
  std::optional<Hash256> c_right_;
  uint64_t tile_ = 0;        // phase 4: the disputed tile
};

}  // namespace meshlearn::protocol
