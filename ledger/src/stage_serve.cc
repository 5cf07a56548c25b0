#include "meshlearn/ledger/stage_serve.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/stage_step.h"
#include "witness_codec.h"

namespace meshlearn::ledger {
namespace {

constexpr std::string_view kStageServePieceMagic = "meshlearn.stage_serve_piece.v1";

// The operators whose tiles are the evidence, in its order: the stage state's k (the first k of
// the plan), then every received one in plan order.
std::vector<size_t> EvidenceOperators(const engine::TilePlan& plan) {
  const size_t k = StateOperators(plan);
  std::vector<size_t> ops;
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (j < k || plan.ops[j].received) ops.push_back(j);
  }
  return ops;
}

// Tile `tile` of the evidence as (operator, tile of the operator). REQUIRES: tile <
// StageServeTileCount(plan).
std::pair<size_t, uint64_t> EvidenceTile(const engine::TilePlan& plan,
                                         const std::vector<size_t>& ops, uint64_t tile) {
  for (size_t j : ops) {
    const uint64_t count = static_cast<uint64_t>(plan.ops[j].grid.count());
    if (tile < count) return {j, tile};
    tile -= count;
  }
  return {plan.ops.size(), 0};
}

// The first tile of piece `piece` > 0 and its tile count.
std::pair<uint64_t, uint64_t> PieceTiles(uint64_t tiles, uint32_t piece) {
  if (piece == 0) return {0, 0};
  const uint64_t first = std::min(tiles, (piece - 1) * kServeTilesPerPiece);
  return {first, std::min(kServeTilesPerPiece, tiles - first)};
}

}  // namespace

Bytes EncodeStageServePiece(const StageServePiece& p) {
  Encoder e;
  e.PutString(kStageServePieceMagic).PutBytes(EncodeStageRootsWitness(p.roots));
  PutWitnessTiles(e, p.tiles);
  return e.Take();
}

Result<StageServePiece> DecodeStageServePiece(ByteSpan bytes) {
  Decoder d(bytes, "stage evidence piece");
  ML_RETURN_IF_ERROR(GetWitnessMagic(d, "stage evidence piece", kStageServePieceMagic));
  StageServePiece p;
  Bytes roots;
  ML_RETURN_IF_ERROR(d.GetBytes(&roots, "roots", kMaxWitnessBytes));
  Result<StageRootsWitness> w = DecodeStageRootsWitness(roots);
  if (!w.ok()) return w.status().WithPrefix("stage evidence piece: roots");
  p.roots = std::move(*w);
  ML_RETURN_IF_ERROR(GetWitnessTiles(d, &p.tiles, static_cast<uint32_t>(kServeTilesPerPiece), 12));
  ML_RETURN_IF_ERROR(d.Finish());
  return p;
}

uint64_t StageServeTileCount(const engine::TilePlan& plan) {
  uint64_t n = 0;
  for (size_t j : EvidenceOperators(plan)) n += static_cast<uint64_t>(plan.ops[j].grid.count());
  return n;
}

uint32_t StageServePieceCount(const engine::TilePlan& plan) {
  // Saturated, not truncated: a plan of more pieces than a uint32 counts (a model's shapes may
  // be any size) keeps a count over StageServeRecord::kMaxPieces, which CheckStageServePiece
  // refuses.
  const uint64_t tiles = StageServeTileCount(plan);
  const uint64_t pieces =
      1 + tiles / kServeTilesPerPiece + (tiles % kServeTilesPerPiece != 0 ? 1 : 0);
  return static_cast<uint32_t>(std::min<uint64_t>(pieces, UINT32_MAX));
}

uint64_t ServeDeclaredPieces(uint64_t declared) {
  // Rounded up without adding to `declared`, which the task's submitter sets to any value (a
  // declaration near UINT64_MAX must not wrap to one piece), and no more than a record keeps (a
  // larger evidence is refused: CheckStageServePiece).
  const uint64_t witnesses =
      declared / kMaxWitnessBytes + (declared % kMaxWitnessBytes != 0 ? 1 : 0);
  return std::min<uint64_t>(1 + 2 * witnesses, StageServeRecord::kMaxPieces);
}

uint64_t ServeWindowBlocks(uint64_t declared) {
  return ServePieceBlocks(ServeDeclaredPieces(declared));
}

Result<Amount> ServeBondOf(const TaskParams& params, uint32_t index,
                           const MismatchClaimField& claim, Amount per_piece) {
  if (!UnservedStageClaim(params, claim)) return Amount{0};
  const uint32_t stage = StageSlotOf(params, index).stage;
  if (LedgerRulesStageStep(params, stage)) return Amount{0};  // its whole step is one witness
  const uint64_t pieces = ServeDeclaredPieces(params.stage_memory_bytes[stage]);
  Amount bond = 0;
  if (__builtin_mul_overflow(pieces, per_piece, &bond)) {
    return InvalidArgument("the serve bond of " + std::to_string(pieces) + " pieces at " +
                           std::to_string(per_piece) +
                           " a piece (genesis params.serve_bond_per_piece) overflows an amount");
  }
  return bond;
}

uint64_t ServePieceBlocks(uint64_t pieces) {
  pieces = std::min<uint64_t>(pieces, StageServeRecord::kMaxPieces);
  return pieces / kServePiecesPerBlock + (pieces % kServePiecesPerBlock != 0 ? 1 : 0);
}

uint64_t ServeWindowEnd(uint64_t referee_deadline, uint64_t declared, uint32_t pieces) {
  return referee_deadline + std::max(ServeWindowBlocks(declared), ServePieceBlocks(pieces));
}

Status CheckStageServePiece(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                            const Hash256& task_id, const StageSlot& slot, uint32_t stages,
                            const std::vector<protocol::NodeId>& chain, uint32_t piece,
                            const StageServePiece& p) {
  const engine::TilePlan& plan = ctx.plan;
  const std::string where = "stage evidence piece " + std::to_string(piece);
  const uint32_t pieces = StageServePieceCount(plan);
  if (pieces > StageServeRecord::kMaxPieces) {
    return InvalidArgument(where + ": the stage step's evidence has " + std::to_string(pieces) +
                           " pieces, over the most a unit's record keeps (" +
                           std::to_string(StageServeRecord::kMaxPieces) +
                           "); no serving window could take them");
  }
  if (piece >= pieces) {
    return InvalidArgument(where + ": the stage step's evidence has " + std::to_string(pieces) +
                           " pieces (" + std::to_string(StageServeTileCount(plan)) + " tiles, " +
                           std::to_string(kServeTilesPerPiece) + " a piece)");
  }
  // 1. The committed commit, of the disputed step, signed by the replica's chain.
  Result<protocol::StageStepCommit> commit = protocol::DecodeStageStepCommit(p.roots.commit);
  if (!commit.ok()) return InvalidArgument(where + ": commit: " + commit.status().message());
  const Hash256 leaf = protocol::StageStepLeaf(*commit);
  if (leaf != task.defender_output) {
    return InvalidArgument(where + ": the commit has leaf " + leaf.ShortHex() +
                           ", not the stage's committed leaf " + task.defender_output.ShortHex() +
                           " of the disputed step; send the commit the stage committed");
  }
  if (commit->task != task_id || commit->round != slot.round || commit->replica != slot.replica ||
      commit->stage != slot.stage || commit->stages != stages || commit->step != task.step - 1) {
    return InvalidArgument(
        where + ": the committed commit is of task " + commit->task.ShortHex() + ", round " +
        std::to_string(commit->round) + ", replica " + std::to_string(commit->replica) +
        ", stage " + std::to_string(commit->stage) + " of " + std::to_string(commit->stages) +
        ", step " + std::to_string(commit->step) + "; the dispute is on step " +
        std::to_string(task.step - 1) + " of stage " + std::to_string(slot.stage) +
        " (the stage committed another step's "
        "commit: no evidence answers that)");
  }
  if (Status st = protocol::VerifyStageStepSignatures(*commit, chain); !st.ok()) {
    return InvalidArgument(where +
                           ": the committed commit has a record the replica's chain did "
                           "not sign: " +
                           st.message());
  }
  // 2. The stage state's k roots give the commit's state_before.
  const size_t k = StateOperators(plan);
  if (p.roots.outputs.size() != k) {
    return InvalidArgument(where + ": " + std::to_string(p.roots.outputs.size()) +
                           " state roots; the stage's state has " + std::to_string(k) + " tensors");
  }
  if (engine::StateHashOfRoots(static_cast<int64_t>(commit->step), p.roots.seed, p.roots.stream,
                               p.roots.outputs) != commit->state_before) {
    return InvalidArgument(
        where + ": the " + std::to_string(k) + " state roots (seed " +
        std::to_string(p.roots.seed) + ", stream " + std::to_string(p.roots.stream) +
        ") do not give the commit's state_before " + commit->state_before.ShortHex());
  }
  // 3. The piece's tiles, each proven against its operator's root: a state tensor's from the
  // roots above, a received tensor's the tiled root its sender signed.
  const std::vector<size_t> ops = EvidenceOperators(plan);
  const auto [first, count] = PieceTiles(StageServeTileCount(plan), piece);
  if (p.tiles.size() != count) {
    return InvalidArgument(where + ": " + std::to_string(p.tiles.size()) + " tiles; the piece is " +
                           std::to_string(count) + " tiles of the evidence from tile " +
                           std::to_string(first));
  }
  for (uint64_t i = 0; i < count; ++i) {
    const TileWitnessTile& t = p.tiles[i];
    const auto [j, tile] = EvidenceTile(plan, ops, first + i);
    const engine::TileOp& op = plan.ops[j];
    const std::string what = "operator " + std::to_string(j + 1) + " (" + op.name + ")";
    if (t.op != j + 1 || t.tile != tile) {
      return InvalidArgument(where + ": tile " + std::to_string(i) + " is tile " +
                             std::to_string(t.tile) + " of operator " + std::to_string(t.op) +
                             "; the piece's tile " + std::to_string(i) + " is tile " +
                             std::to_string(tile) + " of " + what);
    }
    Hash256 root;
    if (j < k) {
      root = p.roots.outputs[j];
    } else {
      const protocol::StageTransfer* r = StageInputRecord(plan, static_cast<int64_t>(j), *commit);
      if (r == nullptr || !TiledAsOperator(*r, op)) {
        return InvalidArgument(where + ": the committed commit has no received record tiled as " +
                               what + " (the stage's `missing` fault: no evidence answers it)");
      }
      root = r->tiles;
    }
    if (t.proof.index != tile || t.proof.leaf_count != static_cast<uint64_t>(op.grid.count()) ||
        !MerkleVerify(root, engine::TileHash(t.values), t.proof)) {
      return InvalidArgument(where + ": tile " + std::to_string(tile) + " of " + what +
                             " is not proven against its root " + root.ShortHex());
    }
  }
  return Status::Ok();
}

Result<std::vector<StageServePiece>> BuildStageServePieces(const TileRuleContext& ctx,
                                                           const protocol::StageStepCommit& commit,
                                                           const Bytes& checkpoint,
                                                           const std::map<Hash256, Bytes>& blobs) {
  const engine::TilePlan& plan = ctx.plan;
  Result<engine::TrainState> start = StageCheckpointState(checkpoint);
  if (!start.ok()) {
    return FailedPrecondition("stage evidence: checkpoint: " + start.status().message());
  }
  if (!start->optimizer) {
    return FailedPrecondition("stage evidence: the checkpoint has no optimizer state");
  }
  // The evidence's tensors, in its operators' order: the state's (as StateTensorRoots lists them:
  // every parameter, then every optimizer state tensor), then every received one.
  std::vector<std::vector<float>> tensors;
  for (const engine::Param& prm : start->model->params()) {
    tensors.emplace_back(prm.value.data(), prm.value.data() + prm.value.size());
  }
  for (const engine::Optimizer::NamedState& s : start->optimizer->State()) {
    tensors.emplace_back(s.tensor->data(), s.tensor->data() + s.tensor->size());
  }
  const size_t k = StateOperators(plan);
  if (tensors.size() != k) {
    return FailedPrecondition("stage evidence: the checkpoint has " +
                              std::to_string(tensors.size()) +
                              " tensors; the stage plan's state has " + std::to_string(k));
  }
  const std::vector<size_t> ops = EvidenceOperators(plan);
  for (size_t j : ops) {
    if (j < k) continue;
    const protocol::StageTransfer* r = StageInputRecord(plan, static_cast<int64_t>(j), commit);
    const auto it = r == nullptr ? blobs.end() : blobs.find(r->tensor);
    if (it == blobs.end() || it->second.size() % 4 != 0) {
      return FailedPrecondition("stage evidence: no tensor held for operator " +
                                std::to_string(j + 1) + " (" + plan.ops[j].name + ")");
    }
    tensors.push_back(StageTensorFromBytes(it->second));
  }
  StageServePiece roots;
  roots.roots = StageRootsWitness{.commit = protocol::EncodeStageStepCommit(commit),
                                  .seed = start->seed,
                                  .stream = start->stream,
                                  .outputs = {}};
  std::vector<std::vector<Hash256>> hashes(ops.size());
  for (size_t e = 0; e < ops.size(); ++e) {
    const engine::TileGrid& g = plan.ops[ops[e]].grid;
    if (static_cast<int64_t>(tensors[e].size()) != g.size()) {
      return FailedPrecondition("stage evidence: operator " + std::to_string(ops[e] + 1) + " (" +
                                plan.ops[ops[e]].name + ") has " +
                                std::to_string(tensors[e].size()) + " values; its grid " +
                                std::to_string(g.size()));
    }
    hashes[e] = engine::TileHashes(tensors[e], g);
    if (e < k) roots.roots.outputs.push_back(MerkleRoot(hashes[e]));
  }
  std::vector<StageServePiece> pieces(StageServePieceCount(plan), roots);
  uint64_t at = 0;
  for (size_t e = 0; e < ops.size(); ++e) {
    const engine::TileGrid& g = plan.ops[ops[e]].grid;
    for (int64_t t = 0; t < g.count(); ++t, ++at) {
      pieces[1 + at / kServeTilesPerPiece].tiles.push_back(
          TileWitnessTile{.op = static_cast<uint32_t>(ops[e] + 1),
                          .tile = static_cast<uint64_t>(t),
                          .values = engine::ExtractTile(tensors[e], g, t),
                          .proof = MerkleProve(hashes[e], static_cast<uint64_t>(t))});
    }
  }
  return pieces;
}

Result<StageServedEvidence> AssembleStageServeEvidence(const TileRuleContext& ctx,
                                                       std::span<const StageServePiece> pieces,
                                                       engine::TrainState& state) {
  const engine::TilePlan& plan = ctx.plan;
  const uint32_t count = StageServePieceCount(plan);
  if (pieces.size() != count) {
    return InvalidArgument("stage evidence: " + std::to_string(pieces.size()) +
                           " pieces; the stage step's evidence has " + std::to_string(count));
  }
  Result<protocol::StageStepCommit> commit =
      protocol::DecodeStageStepCommit(pieces[0].roots.commit);
  if (!commit.ok()) return InvalidArgument("stage evidence: commit: " + commit.status().message());
  // Every tile into its tensor, at its place in the operator's grid (ExtractTile's inverse).
  const std::vector<size_t> ops = EvidenceOperators(plan);
  std::map<size_t, std::vector<float>> tensors;
  for (size_t j : ops) tensors[j].assign(static_cast<size_t>(plan.ops[j].grid.size()), 0.0f);
  const uint64_t tiles = StageServeTileCount(plan);
  for (uint32_t p = 1; p < count; ++p) {
    const auto [first, n] = PieceTiles(tiles, p);
    if (pieces[p].tiles.size() != n) {
      return InvalidArgument("stage evidence: piece " + std::to_string(p) + " has " +
                             std::to_string(pieces[p].tiles.size()) + " tiles, not " +
                             std::to_string(n));
    }
    for (uint64_t i = 0; i < n; ++i) {
      const TileWitnessTile& t = pieces[p].tiles[i];
      const auto [j, tile] = EvidenceTile(plan, ops, first + i);
      const engine::TileGrid& g = plan.ops[j].grid;
      const engine::TileGrid::Rect r = g.TileRect(static_cast<int64_t>(tile));
      if (t.op != j + 1 || t.tile != tile || static_cast<int64_t>(t.values.size()) != r.numel()) {
        return InvalidArgument("stage evidence: piece " + std::to_string(p) + "'s tile " +
                               std::to_string(i) + " is not tile " + std::to_string(tile) +
                               " of operator " + std::to_string(j + 1) + " (" + plan.ops[j].name +
                               ")");
      }
      std::vector<float>& out = tensors[j];
      const float* v = t.values.data();
      for (int64_t row = r.r0; row < r.r1; ++row, v += r.c1 - r.c0) {
        std::copy(v, v + (r.c1 - r.c0), out.begin() + row * g.cols + r.c0);
      }
    }
  }
  // The state's tensors, in StateTensorRoots order: every parameter, then every optimizer state.
  if (!state.optimizer) return InvalidArgument("stage evidence: the state has no optimizer");
  std::vector<std::span<float>> slots;
  for (engine::Param& prm : state.model->params()) {
    slots.emplace_back(prm.value.data(), static_cast<size_t>(prm.value.size()));
  }
  for (const engine::Optimizer::NamedState& st : state.optimizer->State()) {
    slots.emplace_back(st.tensor->data(), static_cast<size_t>(st.tensor->size()));
  }
  const size_t k = StateOperators(plan);
  if (slots.size() != k) {
    return InvalidArgument("stage evidence: the state has " + std::to_string(slots.size()) +
                           " tensors; the stage plan's state has " + std::to_string(k));
  }
  for (size_t j = 0; j < k; ++j) {
    const std::vector<float>& v = tensors[j];
    if (slots[j].size() != v.size()) {
      return InvalidArgument("stage evidence: the state's tensor " + std::to_string(j) + " has " +
                             std::to_string(slots[j].size()) + " values; operator " +
                             std::to_string(j + 1) + " (" + plan.ops[j].name + ") " +
                             std::to_string(v.size()));
    }
    std::copy(v.begin(), v.end(), slots[j].begin());
  }
  state.step = static_cast<int64_t>(commit->step);
  state.seed = pieces[0].roots.seed;
  state.stream = pieces[0].roots.stream;
  if (engine::StateHash(state) != commit->state_before) {
    return InvalidArgument(
        "stage evidence: the pieces' state does not hash to the commit's "
        "state_before " +
        commit->state_before.ShortHex());
  }
  StageServedEvidence ev{.commit = *commit, .blobs = {}};
  for (size_t j : ops) {
    if (j < k) continue;
    const protocol::StageTransfer* r = StageInputRecord(plan, static_cast<int64_t>(j), *commit);
    if (r == nullptr) {
      return InvalidArgument("stage evidence: the commit has no received record for operator " +
                             std::to_string(j + 1) + " (" + plan.ops[j].name + ")");
    }
    ev.blobs[r->tensor] = StageTensorBytes(tensors[j]);
  }
  return ev;
}

bool ServesStageEvidence(const TaskParams& params, uint32_t index,
                         const protocol::DisputeGame& game) {
  if (!IsPipelineTask(params) || game.stage() != protocol::DisputeStage::kDisputeReferee) {
    return false;
  }
  const protocol::RefereeTask& task = game.referee_task();
  return task.whole_step && !task.tile && !task.segment && task.step != 0 &&
         task.roots == protocol::RefereeRoots::kRootsNone &&
         task.challenger_output == StageUnservedLeaf(task.defender_output) &&
         !LedgerRulesStageStep(params, StageSlotOf(params, index).stage);
}

}  // namespace meshlearn::ledger
