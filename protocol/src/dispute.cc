#include "meshlearn/protocol/dispute.h"

#include <algorithm>
#include <utility>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/merkle.h"

namespace meshlearn::protocol {
namespace {

constexpr uint8_t kDisputeEncodingVersion = 1;       // no tile phase
constexpr uint8_t kDisputeEncodingVersionTiles = 2;  // with the tile phase (operator_tiles)
constexpr uint8_t kDisputeEncodingVersionRoots = 3;  // 2, its referee task ruled from roots
constexpr uint32_t kMaxReasonLength = 256;
constexpr uint32_t kMaxOperators = 1u << 20;

// The levels of a Merkle tree (base/merkle.h) over n leaves: level 0 holds the leaves, each
// level above ceil(half) as many nodes (an odd last node is promoted), the top one node.
uint32_t MerkleTopLevel(uint64_t n) {
  uint32_t level = 0;
  for (uint64_t w = n; w > 1; w = (w + 1) / 2) ++level;
  return level;
}
uint64_t MerkleWidthAt(uint64_t n, uint32_t level) {
  uint64_t w = n;
  for (uint32_t l = 0; l < level; ++l) w = (w + 1) / 2;
  return w;
}

void PutOptionalHash(Encoder& e, const std::optional<Hash256>& h) {
  e.PutBool(h.has_value());
  if (h) e.PutHash(*h);
}

Status GetOptionalHash(Decoder& d, std::optional<Hash256>* h, std::string_view field) {
  bool present = false;
  ML_RETURN_IF_ERROR(d.GetBool(&present, field));
  h->reset();
  if (present) {
    Hash256 v;
    ML_RETURN_IF_ERROR(d.GetHash(&v, field));
    *h = v;
  }
  return Status::Ok();
}

}  // namespace

std::string_view DisputePartyName(DisputeParty p) {
  return p == DisputeParty::kDefender ? "defender" : "challenger";
}

std::string_view DisputeStageName(DisputeStage s) {
  switch (s) {
    case DisputeStage::kDisputeSteps:
      return "steps";
    case DisputeStage::kDisputeOperators:
      return "operators";
    case DisputeStage::kDisputeReferee:
      return "referee";
    case DisputeStage::kDisputeResolved:
      return "resolved";
    case DisputeStage::kDisputeTiles:
      return "tiles";
    case DisputeStage::kDisputeReduction:
      return "reduction";
  }
  return "unknown";
}

Hash256 OperatorChainHash(const Hash256& previous, const Hash256& operator_output) {
  return Hasher("meshlearn.dispute.op").Update(previous).Update(operator_output).Finish();
}

Result<DisputeGame> DisputeGame::Create(const DisputeConfig& config) {
  if (config.last_step <= config.first_step) {
    return InvalidArgument("dispute: last_step " + std::to_string(config.last_step) +
                           " must be after first_step " + std::to_string(config.first_step));
  }
  if (config.defender_claim == config.challenger_claim) {
    return InvalidArgument("dispute: the two claims are equal; there is nothing to dispute");
  }
  if (config.response_blocks == 0) {
    return InvalidArgument("dispute: response_blocks must be >= 1, got 0");
  }
  if (config.defender == config.challenger) {
    return InvalidArgument("dispute: a node cannot challenge itself");
  }
  if (!config.operator_tiles.empty() && config.operator_tiles.size() != config.num_operators) {
    return InvalidArgument("dispute: operator_tiles has " +
                           std::to_string(config.operator_tiles.size()) + " entries, the step " +
                           std::to_string(config.num_operators) + " operators");
  }
  if (!config.operator_blocks.empty() &&
      config.operator_blocks.size() != config.operator_tiles.size()) {
    return InvalidArgument("dispute: operator_blocks has " +
                           std::to_string(config.operator_blocks.size()) +
                           " entries; give one per operator with operator_tiles, or none");
  }
  return DisputeGame(config);
}

DisputeGame::DisputeGame(const DisputeConfig& config)
    : config_(config),
      lo_(config.first_step),
      hi_(config.last_step),
      lo_hash_(config.agreed),
      d_hi_(config.defender_claim),
      c_hi_(config.challenger_claim) {
  deadline_ = config.start_height;
  if (config.tolerance) {
    EnterReferee(true, config.last_step, 0, config.agreed, config.defender_claim,
                 config.challenger_claim, config.start_height);
    referee_.segment = true;
    referee_.first_step = config.first_step;
  } else if (hi_ - lo_ == 1) {
    Advance();  // nothing to bisect: go straight to the step (phase 2 or the referee)
  } else {
    StartTurn(config.start_height);
  }
}

void DisputeGame::StartTurn(uint64_t height) {
  if (stage_ != DisputeStage::kDisputeOperators || chain_end_known_) {
    position_ = lo_ + (hi_ - lo_) / 2;
  } else {
    position_ = config_.num_operators;  // phase 2 opens with the chain end C_n
  }
  deadline_ = height + config_.response_blocks;
  d_post_.reset();
  c_post_.reset();
  d_right_.reset();
  c_right_.reset();
}

DisputeQuery DisputeGame::query() const {
  DisputeQuery q{stage_, position_, stage_ == DisputeStage::kDisputeSteps ? 0 : step_, deadline_};
  if (stage_ == DisputeStage::kDisputeTiles || stage_ == DisputeStage::kDisputeReduction) {
    q.operator_index = op_;
    q.children = stage_ == DisputeStage::kDisputeTiles && root_known_;
    q.level = level_;
    q.tile = tile_;
  }
  return q;
}

void DisputeGame::EnterTiles(uint64_t height) {
  stage_ = DisputeStage::kDisputeTiles;
  root_known_ = false;
  position_ = op_;
  deadline_ = height + config_.response_blocks;
  d_post_.reset();
  c_post_.reset();
  d_right_.reset();
  c_right_.reset();
}

void DisputeGame::DescendTiles(uint64_t height) {
  const uint64_t tiles = config_.operator_tiles[op_ - 1];
  while (level_ > 0) {
    if (2 * node_ + 1 >= MerkleWidthAt(tiles, level_ - 1)) {  // promoted: the same hash below
      node_ = 2 * node_;
      --level_;
      continue;
    }
    position_ = node_;
    deadline_ = height + config_.response_blocks;
    d_post_.reset();
    c_post_.reset();
    d_right_.reset();
    c_right_.reset();
    return;
  }
  tile_ = node_;
  const uint32_t blocks = config_.operator_blocks.empty() ? 0 : config_.operator_blocks[op_ - 1];
  if (blocks == 0) {
    EnterTileReferee(height);
    return;
  }
  // Phase 4: S_0 = 0 is known to both; the disputed leaf is position `blocks`.
  stage_ = DisputeStage::kDisputeReduction;
  lo_ = 0;
  hi_ = blocks;
  lo_hash_ = Hash256{};
  if (hi_ - lo_ > 1) {
    StartTurn(height);
  } else {
    EnterTileReferee(height);
  }
}

void DisputeGame::EnterTileReferee(uint64_t height) {
  const bool reduction = stage_ == DisputeStage::kDisputeReduction;
  EnterReferee(false, step_, op_, op_input_, d_hi_, c_hi_, height);
  referee_.tile = true;
  referee_.tile_index = tile_;
  referee_.tile_count = config_.operator_tiles[op_ - 1];
  referee_.reduction_blocks =
      config_.operator_blocks.empty() ? 0 : config_.operator_blocks[op_ - 1];
  referee_.block = reduction ? static_cast<uint32_t>(lo_) : 0;
  referee_.state_input = step_input_;
  referee_.partial_input = reduction ? lo_hash_ : Hash256{};
}

void DisputeGame::EnterReferee(bool whole_step, uint64_t step, uint32_t op, const Hash256& input,
                               const Hash256& d_out, const Hash256& c_out, uint64_t height) {
  stage_ = DisputeStage::kDisputeReferee;
  deadline_ = height + config_.referee_blocks;
  d_right_.reset();
  c_right_.reset();
  referee_ = RefereeTask{.whole_step = whole_step,
                         .step = step,
                         .operator_index = op,
                         .input = input,
                         .defender_output = d_out,
                         .challenger_output = c_out};
}

// Called when a turn completes (both posted), and once from the constructor when the claimed
// range is already a single step.
void DisputeGame::Advance() {
  uint64_t height = deadline_;  // turns advance at the latest at their deadline; see Post
  if (d_post_ && c_post_) {
    ++turns_;
    const Hash256& d = *d_post_;
    const Hash256& c = *c_post_;
    if (stage_ == DisputeStage::kDisputeTiles) {
      if (!root_known_) {  // the opening: out_j, checked against C_j when posted
        root_known_ = true;
        d_hi_ = d;
        c_hi_ = c;
        level_ = MerkleTopLevel(config_.operator_tiles[op_ - 1]);
        node_ = 0;
      } else {  // the children of the disputed node: descend into the first that differs
        const bool left = d != c;
        node_ = 2 * node_ + (left ? 0 : 1);
        d_hi_ = left ? d : *d_right_;
        c_hi_ = left ? c : *c_right_;
        --level_;
      }
      DescendTiles(last_post_height_);
      return;
    }
    if (stage_ == DisputeStage::kDisputeOperators && !chain_end_known_) {
      chain_end_known_ = true;
      if (d == c) {
        // Same operator outputs, different states: the state hash a party posted does not follow
        // from its operator outputs. The whole step decides; with the tile phase, the agreed
        // C_n decides it from roots (the state is StateHashOfRoots of the last outputs).
        EnterReferee(true, step_, 0, step_input_, step_d_out_, step_c_out_, last_post_height_);
        if (tiled()) {
          referee_.roots = RefereeRoots::kRootsChainEnd;
          referee_.chain_end = d;
        }
        return;
      }
      lo_ = 0;
      hi_ = config_.num_operators;
      lo_hash_ = step_input_;  // C_0 = the agreed state hash
      d_hi_ = d;
      c_hi_ = c;
    } else if (d == c) {
      lo_ = position_;
      lo_hash_ = d;
    } else {
      hi_ = position_;
      d_hi_ = d;
      c_hi_ = c;
    }
    height = last_post_height_;
  }
  if (hi_ - lo_ > 1) {
    StartTurn(height);
    return;
  }
  if (stage_ == DisputeStage::kDisputeReduction) {
    EnterTileReferee(height);
    return;
  }
  if (stage_ == DisputeStage::kDisputeSteps) {
    step_ = hi_;
    step_input_ = lo_hash_;
    step_d_out_ = d_hi_;
    step_c_out_ = c_hi_;
    if (config_.num_operators == 0) {
      EnterReferee(true, step_, 0, step_input_, step_d_out_, step_c_out_, height);
      return;
    }
    stage_ = DisputeStage::kDisputeOperators;
    chain_end_known_ = false;
    StartTurn(height);
    return;
  }
  // Phase 2 narrowed to one operator: C_lo agreed, C_hi disputed, hi = lo + 1.
  if (tiled()) {
    op_ = static_cast<uint32_t>(hi_);
    op_input_ = lo_hash_;
    if (config_.operator_tiles[op_ - 1] == 0) {
      // The step's input state (not computed by the step), or an operator without a footprint:
      // the whole step decides; the input state's operator also from roots (RuleOperator).
      EnterReferee(true, step_, 0, step_input_, step_d_out_, step_c_out_, height);
      referee_.roots = RefereeRoots::kRootsOperator;
      referee_.operator_index = op_;
      referee_.operator_input = op_input_;
      referee_.defender_operator_output = d_hi_;
      referee_.challenger_operator_output = c_hi_;
      return;
    }
    EnterTiles(height);
    return;
  }
  EnterReferee(false, step_, static_cast<uint32_t>(hi_), lo_hash_, d_hi_, c_hi_, height);
}

Status DisputeGame::CheckTurn(const std::string& who, uint64_t position, uint64_t height,
                              std::optional<Hash256>& slot) const {
  if (position != position_) {
    return InvalidArgument("dispute: " + who + " posted position " + std::to_string(position) +
                           ", the game asks for " + std::to_string(position_));
  }
  if (height > deadline_) {
    return DeadlineExceeded("dispute: " + who + " posted at height " + std::to_string(height) +
                            ", after the turn's deadline " + std::to_string(deadline_));
  }
  if (slot) return AlreadyExists("dispute: " + who + " already posted this turn");
  return Status::Ok();
}

Status DisputeGame::Post(DisputeParty party, uint64_t position, const Hash256& hash,
                         uint64_t height) {
  std::string who(DisputePartyName(party));
  const bool opening = stage_ == DisputeStage::kDisputeTiles && !root_known_;
  if (stage_ != DisputeStage::kDisputeSteps && stage_ != DisputeStage::kDisputeOperators &&
      stage_ != DisputeStage::kDisputeReduction && !opening) {
    return FailedPrecondition("dispute: " + who + " posted one hash in stage " +
                              std::string(DisputeStageName(stage_)) +
                              (stage_ == DisputeStage::kDisputeTiles
                                   ? "; post the node's two children (PostChildren)"
                                   : "; no move is expected"));
  }
  std::optional<Hash256>& slot = party == DisputeParty::kDefender ? d_post_ : c_post_;
  ML_RETURN_IF_ERROR(CheckTurn(who, position, height, slot));
  if (opening) {
    const Hash256& claim = party == DisputeParty::kDefender ? d_hi_ : c_hi_;
    if (OperatorChainHash(op_input_, hash) != claim) {
      return InvalidArgument("dispute: " + who + "'s output root of operator " +
                             std::to_string(op_) + " does not chain from the agreed C_" +
                             std::to_string(op_ - 1) + " to its own C_" + std::to_string(op_));
    }
  }
  slot = hash;
  last_post_height_ = height;
  if (d_post_ && c_post_) Advance();
  return Status::Ok();
}

Status DisputeGame::PostChildren(DisputeParty party, uint64_t position, const Hash256& left,
                                 const Hash256& right, uint64_t height) {
  std::string who(DisputePartyName(party));
  if (stage_ != DisputeStage::kDisputeTiles || !root_known_) {
    return FailedPrecondition("dispute: " + who + " posted children in stage " +
                              std::string(DisputeStageName(stage_)) +
                              (stage_ == DisputeStage::kDisputeTiles ? " before the output root"
                                                                     : "; no node is disputed"));
  }
  const bool defender = party == DisputeParty::kDefender;
  std::optional<Hash256>& slot = defender ? d_post_ : c_post_;
  ML_RETURN_IF_ERROR(CheckTurn(who, position, height, slot));
  if (MerkleInnerHash(left, right) != (defender ? d_hi_ : c_hi_)) {
    return InvalidArgument("dispute: " + who + "'s children of node " + std::to_string(node_) +
                           " (level " + std::to_string(level_) +
                           ") do not hash to its own node");
  }
  slot = left;
  (defender ? d_right_ : c_right_) = right;
  last_post_height_ = height;
  if (d_post_ && c_post_) Advance();
  return Status::Ok();
}

Status DisputeGame::ExtendRefereeDeadline(uint64_t height) {
  if (stage_ != DisputeStage::kDisputeReferee) {
    return FailedPrecondition("dispute: only the referee stage's deadline is extended, not " +
                              std::string(DisputeStageName(stage_)) + "'s");
  }
  deadline_ = std::max(deadline_, height);
  return Status::Ok();
}

Status DisputeGame::OnBlock(uint64_t height) {
  if (stage_ == DisputeStage::kDisputeReferee) {
    if (config_.referee_blocks == 0 || height <= deadline_) return Status::Ok();
    stage_ = DisputeStage::kDisputeResolved;
    outcome_.defender_honest = outcome_.challenger_honest = outcome_.undecided = true;
    outcome_.reason = "the referee did not rule within " + std::to_string(config_.referee_blocks) +
                      " blocks";
    return Status::Ok();
  }
  if (stage_ == DisputeStage::kDisputeResolved) return Status::Ok();
  if (height <= deadline_) return Status::Ok();
  stage_ = DisputeStage::kDisputeResolved;
  outcome_.defender_honest = d_post_.has_value();
  outcome_.challenger_honest = c_post_.has_value();
  outcome_.challenger_silent = d_post_.has_value() && !c_post_.has_value();
  outcome_.defender_silent = !d_post_.has_value();
  if (!d_post_ && !c_post_) {
    outcome_.reason = "both parties missed their turn";
  } else {
    outcome_.reason = std::string(DisputePartyName(d_post_ ? DisputeParty::kChallenger
                                                           : DisputeParty::kDefender)) +
                      " missed its turn";
  }
  return Status::Ok();
}

Status DisputeGame::Rule(const Hash256& correct_output) {
  if (stage_ != DisputeStage::kDisputeReferee) {
    return FailedPrecondition("dispute: the referee rules only in the referee stage, not in " +
                              std::string(DisputeStageName(stage_)));
  }
  if (referee_.segment) {
    return InvalidArgument("dispute: a tolerance-mode segment is ruled with RuleTolerance");
  }
  std::string what = referee_.whole_step
                         ? "step " + std::to_string(referee_.step)
                         : "operator " + std::to_string(referee_.operator_index) + " of step " +
                               std::to_string(referee_.step);
  if (referee_.tile) {
    what = "tile " + std::to_string(referee_.tile_index) +
           (referee_.reduction_blocks > 0
                ? " (reduction block " + std::to_string(referee_.block) + ")"
                : std::string()) +
           " of " + what;
  }
  Resolve(referee_.defender_output == correct_output, referee_.challenger_output == correct_output,
          "referee recomputed " + what);
  return Status::Ok();
}

Status DisputeGame::RuleServed(bool served, uint64_t window_end) {
  if (stage_ != DisputeStage::kDisputeReferee || referee_.segment || !referee_.whole_step) {
    return FailedPrecondition(
        "dispute: RuleServed rules a whole step's claim at the referee stage");
  }
  stage_ = DisputeStage::kDisputeResolved;
  outcome_.defender_honest = served;
  outcome_.challenger_honest = true;
  const std::string step = std::to_string(referee_.step);
  outcome_.reason =
      served ? "the stage served step " + step +
                   "'s evidence on chain: the claim that it served nothing is answered (the step "
                   "is checked from that evidence)"
             : "the stage did not serve step " + step +
                   "'s evidence by its serving window's end (height " + std::to_string(window_end) +
                   ")";
  return Status::Ok();
}

Status DisputeGame::RuleChainEnd(const Hash256& correct_state) {
  if (stage_ != DisputeStage::kDisputeReferee || referee_.roots != RefereeRoots::kRootsChainEnd) {
    return FailedPrecondition(
        "dispute: RuleChainEnd rules a step whose chain end both parties agreed to, at the "
        "referee stage only (stage " +
        std::string(DisputeStageName(stage_)) + ")");
  }
  Resolve(referee_.defender_output == correct_state, referee_.challenger_output == correct_state,
          "referee ruled step " + std::to_string(referee_.step) +
              " from the roots of the agreed chain end");
  return Status::Ok();
}

Status DisputeGame::RuleOperator(const Hash256& correct_operator_output) {
  if (stage_ != DisputeStage::kDisputeReferee ||
      referee_.roots != RefereeRoots::kRootsOperator) {
    return FailedPrecondition(
        "dispute: RuleOperator rules an operator without tiles at the referee stage only "
        "(stage " + std::string(DisputeStageName(stage_)) + ")");
  }
  Resolve(referee_.defender_operator_output == correct_operator_output,
          referee_.challenger_operator_output == correct_operator_output,
          "referee ruled operator " + std::to_string(referee_.operator_index) + " of step " +
              std::to_string(referee_.step) + " from the input state's roots");
  return Status::Ok();
}

void DisputeGame::Resolve(bool defender_honest, bool challenger_honest, const std::string& how) {
  stage_ = DisputeStage::kDisputeResolved;
  outcome_.defender_honest = defender_honest;
  outcome_.challenger_honest = challenger_honest;
  outcome_.reason = how + (defender_honest     ? ": the challenger's output is wrong"
                           : challenger_honest ? ": the defender's output is wrong"
                                               : ": both outputs are wrong");
}

Status DisputeGame::RuleTolerance(bool defender_within_tolerance) {
  if (stage_ != DisputeStage::kDisputeReferee || !referee_.segment) {
    return FailedPrecondition("dispute: RuleTolerance rules a tolerance-mode segment at the "
                              "referee stage only");
  }
  stage_ = DisputeStage::kDisputeResolved;
  outcome_.defender_honest = defender_within_tolerance;
  outcome_.challenger_honest = !defender_within_tolerance;
  outcome_.reason = "referee replayed steps " + std::to_string(referee_.first_step) + ".." +
                    std::to_string(referee_.step) + ": the defender's state is " +
                    (defender_within_tolerance ? "within" : "outside") + " the task's tolerance";
  return Status::Ok();
}

Bytes DisputeGame::Encode() const {
  Encoder e;
  const bool v2 = tiled();
  const bool v3 = v2 && referee_.roots != RefereeRoots::kRootsNone;
  e.PutU8(v3   ? kDisputeEncodingVersionRoots
          : v2 ? kDisputeEncodingVersionTiles
               : kDisputeEncodingVersion);
  e.PutHash(config_.unit.task).PutU32(config_.unit.round).PutU32(config_.unit.shard);
  e.PutPublicKey(config_.defender).PutPublicKey(config_.challenger);
  e.PutU64(config_.first_step).PutU64(config_.last_step);
  e.PutHash(config_.agreed).PutHash(config_.defender_claim).PutHash(config_.challenger_claim);
  e.PutU32(config_.num_operators).PutU64(config_.response_blocks).PutU64(config_.start_height);
  e.PutBool(config_.tolerance).PutU64(config_.referee_blocks);
  if (v2) {
    e.PutU32(static_cast<uint32_t>(config_.operator_tiles.size()));
    for (uint64_t t : config_.operator_tiles) e.PutU64(t);
    e.PutU32(static_cast<uint32_t>(config_.operator_blocks.size()));
    for (uint32_t b : config_.operator_blocks) e.PutU32(b);
  }
  e.PutU8(static_cast<uint8_t>(stage_));
  e.PutU64(lo_).PutU64(hi_).PutHash(lo_hash_).PutHash(d_hi_).PutHash(c_hi_);
  e.PutU64(step_).PutHash(step_input_).PutHash(step_d_out_).PutHash(step_c_out_);
  e.PutBool(chain_end_known_).PutU64(position_).PutU64(deadline_).PutU64(last_post_height_);
  PutOptionalHash(e, d_post_);
  PutOptionalHash(e, c_post_);
  e.PutU32(turns_);
  e.PutBool(referee_.whole_step).PutU64(referee_.step).PutU32(referee_.operator_index);
  e.PutBool(referee_.segment).PutU64(referee_.first_step);
  e.PutHash(referee_.input).PutHash(referee_.defender_output).PutHash(referee_.challenger_output);
  e.PutBool(outcome_.defender_honest).PutBool(outcome_.challenger_honest);
  e.PutBool(outcome_.undecided);
  e.PutString(outcome_.reason);
  if (v2) {
    e.PutU32(op_).PutHash(op_input_).PutBool(root_known_).PutU32(level_).PutU64(node_);
    PutOptionalHash(e, d_right_);
    PutOptionalHash(e, c_right_);
    e.PutU64(tile_);
    e.PutBool(referee_.tile).PutU64(referee_.tile_index).PutU64(referee_.tile_count);
    e.PutU32(referee_.reduction_blocks).PutU32(referee_.block);
    e.PutHash(referee_.state_input).PutHash(referee_.partial_input);
  }
  if (v3) {
    e.PutU8(static_cast<uint8_t>(referee_.roots)).PutHash(referee_.chain_end);
    e.PutHash(referee_.operator_input).PutHash(referee_.defender_operator_output);
    e.PutHash(referee_.challenger_operator_output);
  }
  return e.Take();
}

Result<DisputeGame> DisputeGame::Decode(ByteSpan bytes) {
  Decoder d(bytes);
  uint8_t version = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&version, "dispute.version"));
  if (version != kDisputeEncodingVersion && version != kDisputeEncodingVersionTiles &&
      version != kDisputeEncodingVersionRoots) {
    return InvalidArgument("dispute: unknown encoding version " + std::to_string(version));
  }
  const bool v3 = version == kDisputeEncodingVersionRoots;
  const bool v2 = version == kDisputeEncodingVersionTiles || v3;
  DisputeConfig c;
  ML_RETURN_IF_ERROR(d.GetHash(&c.unit.task, "dispute.unit.task"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.unit.round, "dispute.unit.round"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.unit.shard, "dispute.unit.shard"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c.defender, "dispute.defender"));
  ML_RETURN_IF_ERROR(d.GetPublicKey(&c.challenger, "dispute.challenger"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.first_step, "dispute.first_step"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.last_step, "dispute.last_step"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.agreed, "dispute.agreed"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.defender_claim, "dispute.defender_claim"));
  ML_RETURN_IF_ERROR(d.GetHash(&c.challenger_claim, "dispute.challenger_claim"));
  ML_RETURN_IF_ERROR(d.GetU32(&c.num_operators, "dispute.num_operators"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.response_blocks, "dispute.response_blocks"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.start_height, "dispute.start_height"));
  ML_RETURN_IF_ERROR(d.GetBool(&c.tolerance, "dispute.tolerance"));
  ML_RETURN_IF_ERROR(d.GetU64(&c.referee_blocks, "dispute.referee_blocks"));
  if (v2) {
    uint32_t n = 0;
    ML_RETURN_IF_ERROR(d.GetCount(&n, "dispute.operator_tiles", kMaxOperators, 8));
    c.operator_tiles.resize(n);
    for (uint64_t& t : c.operator_tiles) ML_RETURN_IF_ERROR(d.GetU64(&t, "dispute.operator_tiles"));
    ML_RETURN_IF_ERROR(d.GetCount(&n, "dispute.operator_blocks", kMaxOperators, 4));
    c.operator_blocks.resize(n);
    for (uint32_t& b : c.operator_blocks) {
      ML_RETURN_IF_ERROR(d.GetU32(&b, "dispute.operator_blocks"));
    }
    if (c.operator_tiles.empty()) {
      return InvalidArgument("dispute: version 2 is the tile phase; operator_tiles is empty");
    }
  }
  ML_ASSIGN_OR_RETURN(DisputeGame g, Create(c));
  uint8_t stage = 0;
  ML_RETURN_IF_ERROR(d.GetU8(&stage, "dispute.stage"));
  const DisputeStage last =
      v2 ? DisputeStage::kDisputeReduction : DisputeStage::kDisputeResolved;
  if (stage > static_cast<uint8_t>(last)) {
    return InvalidArgument("dispute: unknown stage " + std::to_string(stage));
  }
  g.stage_ = static_cast<DisputeStage>(stage);
  ML_RETURN_IF_ERROR(d.GetU64(&g.lo_, "dispute.lo"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.hi_, "dispute.hi"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.lo_hash_, "dispute.lo_hash"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.d_hi_, "dispute.defender_hi"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.c_hi_, "dispute.challenger_hi"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.step_, "dispute.step"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.step_input_, "dispute.step_input"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.step_d_out_, "dispute.step_defender_out"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.step_c_out_, "dispute.step_challenger_out"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.chain_end_known_, "dispute.chain_end_known"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.position_, "dispute.position"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.deadline_, "dispute.deadline"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.last_post_height_, "dispute.last_post_height"));
  ML_RETURN_IF_ERROR(GetOptionalHash(d, &g.d_post_, "dispute.defender_post"));
  ML_RETURN_IF_ERROR(GetOptionalHash(d, &g.c_post_, "dispute.challenger_post"));
  ML_RETURN_IF_ERROR(d.GetU32(&g.turns_, "dispute.turns"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.referee_.whole_step, "dispute.referee.whole_step"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.referee_.step, "dispute.referee.step"));
  ML_RETURN_IF_ERROR(d.GetU32(&g.referee_.operator_index, "dispute.referee.operator"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.referee_.segment, "dispute.referee.segment"));
  ML_RETURN_IF_ERROR(d.GetU64(&g.referee_.first_step, "dispute.referee.first_step"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.input, "dispute.referee.input"));
  ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.defender_output, "dispute.referee.defender_output"));
  ML_RETURN_IF_ERROR(
      d.GetHash(&g.referee_.challenger_output, "dispute.referee.challenger_output"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.outcome_.defender_honest, "dispute.defender_honest"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.outcome_.challenger_honest, "dispute.challenger_honest"));
  ML_RETURN_IF_ERROR(d.GetBool(&g.outcome_.undecided, "dispute.undecided"));
  ML_RETURN_IF_ERROR(d.GetString(&g.outcome_.reason, "dispute.reason", kMaxReasonLength));
  if (v2) {
    ML_RETURN_IF_ERROR(d.GetU32(&g.op_, "dispute.operator"));
    ML_RETURN_IF_ERROR(d.GetHash(&g.op_input_, "dispute.operator_input"));
    ML_RETURN_IF_ERROR(d.GetBool(&g.root_known_, "dispute.root_known"));
    ML_RETURN_IF_ERROR(d.GetU32(&g.level_, "dispute.level"));
    ML_RETURN_IF_ERROR(d.GetU64(&g.node_, "dispute.node"));
    ML_RETURN_IF_ERROR(GetOptionalHash(d, &g.d_right_, "dispute.defender_right"));
    ML_RETURN_IF_ERROR(GetOptionalHash(d, &g.c_right_, "dispute.challenger_right"));
    ML_RETURN_IF_ERROR(d.GetU64(&g.tile_, "dispute.tile"));
    ML_RETURN_IF_ERROR(d.GetBool(&g.referee_.tile, "dispute.referee.tile"));
    ML_RETURN_IF_ERROR(d.GetU64(&g.referee_.tile_index, "dispute.referee.tile_index"));
    ML_RETURN_IF_ERROR(d.GetU64(&g.referee_.tile_count, "dispute.referee.tile_count"));
    ML_RETURN_IF_ERROR(d.GetU32(&g.referee_.reduction_blocks, "dispute.referee.blocks"));
    ML_RETURN_IF_ERROR(d.GetU32(&g.referee_.block, "dispute.referee.block"));
    ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.state_input, "dispute.referee.state_input"));
    ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.partial_input, "dispute.referee.partial_input"));
  }
  if (v3) {
    uint8_t roots = 0;
    ML_RETURN_IF_ERROR(d.GetU8(&roots, "dispute.referee.roots"));
    if (roots != static_cast<uint8_t>(RefereeRoots::kRootsChainEnd) &&
        roots != static_cast<uint8_t>(RefereeRoots::kRootsOperator)) {
      return InvalidArgument("dispute: version 3 is a referee task ruled from roots; roots is " +
                             std::to_string(roots));
    }
    g.referee_.roots = static_cast<RefereeRoots>(roots);
    ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.chain_end, "dispute.referee.chain_end"));
    ML_RETURN_IF_ERROR(d.GetHash(&g.referee_.operator_input, "dispute.referee.operator_input"));
    ML_RETURN_IF_ERROR(
        d.GetHash(&g.referee_.defender_operator_output, "dispute.referee.defender_operator"));
    ML_RETURN_IF_ERROR(
        d.GetHash(&g.referee_.challenger_operator_output, "dispute.referee.challenger_operator"));
    const bool op = g.referee_.roots == RefereeRoots::kRootsOperator;
    if ((g.stage_ != DisputeStage::kDisputeReferee && g.stage_ != DisputeStage::kDisputeResolved) ||
        !g.referee_.whole_step || g.referee_.tile || g.referee_.segment ||
        (op && (g.referee_.operator_index == 0 || g.referee_.operator_index > c.num_operators ||
                c.operator_tiles[g.referee_.operator_index - 1] != 0))) {
      return InvalidArgument(
          "dispute: a referee task ruled from roots is a whole step at the referee (an "
          "operator's: one without tiles)");
    }
  }
  ML_RETURN_IF_ERROR(d.Finish());
  if (g.stage_ == DisputeStage::kDisputeTiles || g.stage_ == DisputeStage::kDisputeReduction) {
    if (g.op_ == 0 || g.op_ > c.num_operators || c.operator_tiles[g.op_ - 1] == 0) {
      return InvalidArgument("dispute: the disputed operator " + std::to_string(g.op_) +
                             " has no tiles");
    }
    const uint64_t tiles = c.operator_tiles[g.op_ - 1];
    // A right child is held exactly while its party's left child is, in a children turn.
    const bool children = g.stage_ == DisputeStage::kDisputeTiles && g.root_known_;
    if (g.d_right_.has_value() != (children && g.d_post_.has_value()) ||
        g.c_right_.has_value() != (children && g.c_post_.has_value())) {
      return InvalidArgument("dispute: a posted child without its pair");
    }
    if (g.stage_ == DisputeStage::kDisputeTiles && !g.root_known_ && g.position_ != g.op_) {
      return InvalidArgument("dispute: the output-root turn asks for another operator");
    }
    if (g.stage_ == DisputeStage::kDisputeTiles && g.root_known_ &&
        (g.level_ > MerkleTopLevel(tiles) || g.node_ >= MerkleWidthAt(tiles, g.level_) ||
         g.level_ == 0 || g.position_ != g.node_)) {
      return InvalidArgument("dispute: the disputed node is outside the operator's tile tree");
    }
    if (g.stage_ == DisputeStage::kDisputeReduction &&
        (g.tile_ >= tiles || c.operator_blocks.empty() ||
         g.hi_ > c.operator_blocks[g.op_ - 1] || g.position_ <= g.lo_ || g.position_ >= g.hi_)) {
      return InvalidArgument("dispute: the reduction interval is outside the tile's blocks");
    }
  }
  // States the game cannot reach.
  if (g.lo_ >= g.hi_ && g.stage_ != DisputeStage::kDisputeReferee &&
      g.stage_ != DisputeStage::kDisputeResolved) {
    return InvalidArgument("dispute: bisection interval is empty");
  }
  if (g.stage_ == DisputeStage::kDisputeSteps &&
      (g.lo_ < c.first_step || g.hi_ > c.last_step || g.position_ <= g.lo_ ||
       g.position_ >= g.hi_)) {
    return InvalidArgument("dispute: step interval outside the disputed segment");
  }
  if (g.stage_ == DisputeStage::kDisputeOperators && g.chain_end_known_ &&
      g.hi_ > c.num_operators) {
    return InvalidArgument("dispute: operator interval outside the step's operators");
  }
  return g;
}

}  // namespace meshlearn::protocol
