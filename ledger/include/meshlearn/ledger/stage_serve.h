// A pipeline stage's step evidence served in pieces (issue 16; docs/verification.md "Pipeline
// stages", "A stage claimed to have served nothing, over the witness bound"): the answer of a stage
// to a claim that it served nothing for a step (UnservedStageClaim) when its whole step does not
// fit one witness (LedgerRulesStageStep false), so that no key rules that claim either.
//
// The claim is about availability, which no replay decides: the ledger must see the evidence
// exist. So the stage posts it in pieces (ServeStageEvidenceTx), each checkable on its own against
// roots the chain already holds, and the ledger keeps which pieces it has seen (WorkUnit's
// StageServeRecord), not their bytes: they are in the blocks, which every follower keeps.
//
//   piece 0      the committed commit (its StageStepLeaf the disputed step's committed leaf) and
//                the k roots of the stage's state, which must give the commit's state_before
//                (engine::StateHashOfRoots with the state's seed and stream), as RuleStageRoots
//                checks them;
//   piece p > 0  the same roots again, and tiles [(p-1) * kServeTilesPerPiece, p *
//                kServeTilesPerPiece) of the evidence: every tile of the stage state's k tensors
//                (the plan's "in.<name>" operators, in plan order), each proven against its root,
//                then every tile of each received tensor (the plan's "recv.<kind>" operators, in
//                plan order), proven against the tiled root its sender signed in the commit's
//                record (StageInputRecord, TiledAsOperator).
//
// Every piece repeats the roots (a commit and k hashes, small) so that each one is checked alone,
// with no piece's bytes kept in the state. The ledger derives the plan from the task bundle each
// transaction carries (TileContextOf, as RefereeTile does).
//
//   Result<TileRuleContext> ctx = TileContextOf(task, unit, bundle, "serve");
//   Result<std::vector<StageServePiece>> pieces =
//       BuildStageServePieces(*ctx, commit, checkpoint, blobs);
//   for (uint32_t p = 0; p < pieces->size(); ++p) {
//     ServeStageEvidenceTx tx{.task_id = id, .index = unit, .piece = p, .bundle = {bundle},
//                             .witness = {EncodeStageServePiece((*pieces)[p])}};
//     ...
//   }
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::ledger {

// Tiles of a piece p > 0: at most 4 MiB of values (a tile holds at most engine::kTileFlat floats)
// and their Merkle proofs, under kMaxWitnessBytes with room for the commit.
inline constexpr uint64_t kServeTilesPerPiece = 1024;

// The pieces one block carries: the transactions of a block stay under half of kMaxBlockBytes
// (chain.cc), and a piece is at most a large transaction.
inline constexpr uint64_t kServePiecesPerBlock = (kMaxBlockBytes / 2) / kMaxLargeTxBytes;

struct StageServePiece {
  StageRootsWitness roots;  // the committed commit, the state's seed and stream, its k roots
  std::vector<TileWitnessTile> tiles;  // piece p > 0: its tiles, in the evidence's order
  bool operator==(const StageServePiece&) const = default;
};
Bytes EncodeStageServePiece(const StageServePiece& p);
// Refuses another magic, truncated or trailing bytes and more tiles than kServeTilesPerPiece
// (InvalidArgument, naming the field).
Result<StageServePiece> DecodeStageServePiece(ByteSpan bytes);

// The evidence's tiles (the stage state's, then the received tensors') and its pieces (piece 0,
// then one per kServeTilesPerPiece tiles) in `plan`, a stage step's (PlanStageStepTiles).
uint64_t StageServeTileCount(const engine::TilePlan& plan);
uint32_t StageServePieceCount(const engine::TilePlan& plan);

// The blocks after the referee's deadline that a stage of `declared` bytes
// (TaskParams::stage_memory_bytes: its weights, moments and activations, which bound its
// checkpoint and the tensors it received) has to post its evidence: its pieces,
// 1 + 2 * ceil(declared / kMaxWitnessBytes) (a piece carries at most half of kMaxWitnessBytes of
// values, and tiles cut short at a tensor's edges fill it less), at most
// StageServeRecord::kMaxPieces, at kServePiecesPerBlock a block. Set by the evidence's size and
// the chain's capacity, never by a node's speed.
uint64_t ServeWindowBlocks(uint64_t declared);
// Those pieces: 1 + 2 * ceil(declared / kMaxWitnessBytes), at most StageServeRecord::kMaxPieces.
uint64_t ServeDeclaredPieces(uint64_t declared);
// The bond a mismatch `claim` on unit `index` of `params` posts (WorkUnit::serve_bonds): for a
// claim that a stage over the stage witness bound served nothing (UnservedStageClaim, and
// LedgerRulesStageStep false: the stage must then serve its evidence in pieces), its declared
// stage's pieces (ServeDeclaredPieces) x `per_piece` (genesis params.serve_bond_per_piece); 0 for
// any other claim. InvalidArgument when that overflows an amount.
Result<Amount> ServeBondOf(const TaskParams& params, uint32_t index,
                           const MismatchClaimField& claim, Amount per_piece);
// The blocks `pieces` pieces take at kServePiecesPerBlock a block (at most
// StageServeRecord::kMaxPieces of them).
uint64_t ServePieceBlocks(uint64_t pieces);
// The serving window's last height: `referee_deadline` (the height the game's referee deadline was
// when the window opened; with referee_blocks 0, the height the game reached the referee) plus
// ServeWindowBlocks(declared), or, once the first piece brought the bundle and so the evidence's
// real piece count `pieces` (StageServePieceCount of the plan; 0 before), ServePieceBlocks(pieces)
// where that is more: a stage declared smaller than its evidence is not cut off, and the window
// never shrinks.
uint64_t ServeWindowEnd(uint64_t referee_deadline, uint64_t declared, uint32_t pieces);

// Whether piece `piece` of `p` is the stage's evidence for the unserved claim `task` (the referee
// task of a dispute on stage `slot` of a replica of `stages`; defender_output the committed leaf
// of step task.step - 1 of the stage): its commit is the committed leaf, of this task, round,
// replica, stage and step, signed by `chain` (the replica's nodes, ReplicaRunChain); its roots
// give the commit's state_before; and for p > 0 its tiles are exactly the piece's, each proven
// against its root. InvalidArgument naming what does not check out (the piece is refused,
// nothing recorded), and for every piece of an evidence of more than StageServeRecord::kMaxPieces
// pieces (its bitmap would not fit a unit's record).
Status CheckStageServePiece(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                            const Hash256& task_id, const StageSlot& slot, uint32_t stages,
                            const std::vector<protocol::NodeId>& chain, uint32_t piece,
                            const StageServePiece& p);

// Every piece of the evidence of stage step `commit` from what the stage node holds: its
// `checkpoint` of the step's start and the tensors it received, by their records' hashes
// (`blobs`, StageTensorBytes). FailedPrecondition naming what is missing or does not match
// (a checkpoint that does not load or whose tensors are not the plan's state, a received tensor
// not held or not of its record's size).
Result<std::vector<StageServePiece>> BuildStageServePieces(const TileRuleContext& ctx,
                                                           const protocol::StageStepCommit& commit,
                                                           const Bytes& checkpoint,
                                                           const std::map<Hash256, Bytes>& blobs);

// The stage step's evidence put back together from its pieces on chain: what a verifier replays
// the step from (ReplayStageStep) once the stage has served it, since the served claim rules
// nothing about the step's computation (docs/verification.md, "A stage claimed to have served
// nothing, over the witness bound").
struct StageServedEvidence {
  protocol::StageStepCommit commit;  // the committed commit (piece 0's)
  std::map<Hash256, Bytes> blobs;    // the received tensors by their records' hashes
                                     // (StageTensorBytes), as a stage node serves them
};
// From every piece of the evidence (pieces[p] is piece p, each one CheckStageServePiece took: they
// are in the blocks that executed them) in `ctx`'s plan. `state` is a training state of the
// stage's shapes with an optimizer (any of its states: the round's start state cut to the stage,
// an earlier checkpoint); its values, seed, stream and step become the step's start state, which
// must hash to the commit's state_before. InvalidArgument naming what does not fit (a piece count
// that is not the plan's, a tile out of place or of the wrong size, a state of other shapes).
Result<StageServedEvidence> AssembleStageServeEvidence(const TileRuleContext& ctx,
                                                       std::span<const StageServePiece> pieces,
                                                       engine::TrainState& state);

// Whether the ledger waits for a stage's pieces on this dispute (it is at the referee): an
// unserved claim (the challenger's output StageUnservedLeaf of the defender's) on a whole step of
// a stage over the witness bound (LedgerRulesStageStep false).
bool ServesStageEvidence(const TaskParams& params, uint32_t index,
                         const protocol::DisputeGame& game);

}  // namespace meshlearn::ledger
