#include "meshlearn/engine/tile_rule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "kernels_internal.h"
#include "meshlearn/base/check.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/math.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"

namespace meshlearn::engine {
namespace {

// Names here carry a TileRule prefix: the engine builds as unity translation units.

std::string TileRuleOpName(const TilePlan& plan, int64_t op) {
  return "op " + std::to_string(op) + " (" + plan.ops[static_cast<size_t>(op)].name + ")";
}

bool TileRuleIsReduction(TileOpKind k) {
  return k == TileOpKind::kTileOpLinearWeightGrad || k == TileOpKind::kTileOpLinearBiasGrad ||
         k == TileOpKind::kTileOpLayerNormWeightGrad || k == TileOpKind::kTileOpLayerNormBiasGrad ||
         k == TileOpKind::kTileOpConvWeightGrad || k == TileOpKind::kTileOpConvBiasGrad;
}

// The number of 32-row blocks of a batch of B rows.
int64_t TileRuleRowBlocks(int64_t B) { return (B + kTileRows - 1) / kTileRows; }

// The rows [b0, b1) of reduction block `block` of a batch of B.
std::pair<int64_t, int64_t> TileRuleBlockRows(int64_t B, int64_t block) {
  const int64_t b0 = block * kTileRows;
  return {b0, std::min(B, b0 + kTileRows)};
}

// The rows of one micro-batch's activations (the step's batch when not micro-batched).
int64_t TileRuleRows(const TilePlan& plan) { return plan.batch / plan.micro_batches; }

// The accumulated gradient a parameter gradient of micro-batch m > 0 adds into at the end of its
// chain (micro-batch m-1's; -1: a zeroed one). wte's gradient with the tied head's chain (M = 1)
// uses v for ln_f.
int64_t TileRuleAddedInto(const TileOp& o) {
  if (o.kind == TileOpKind::kTileOpEmbeddingGrad) return o.b >= 0 ? -1 : o.v;
  return TileRuleIsReduction(o.kind) ? o.v : -1;
}

// Appends the tiles of `op` covering [r0, r1) x [c0, c1) (rows and columns of its rows x cols
// view), or the batch rows [r0, r1) when op is the batch, and of chunked examples the chunks
// holding columns [c0, c1) (none for an empty range: the rows' labels only).
void TileRuleCover(const TilePlan& plan, int64_t op, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                   TileFootprint& fp) {
  if (op == kTileOperandBatch) {
    for (int64_t r = r0; r < r1; ++r) fp.batch_rows.push_back(r);
    if (ExampleChunks(plan.input_size) > 0 && r1 > r0 && c1 > c0) {
      for (int64_t k = c0 / kExampleChunkFloats; k <= (c1 - 1) / kExampleChunkFloats; ++k) {
        fp.batch_chunks.push_back(k);
      }
    }
    return;
  }
  const TileGrid& g = plan.ops[static_cast<size_t>(op)].grid;
  if (r1 <= r0 || c1 <= c0) return;
  for (int64_t rt = r0 / g.tile_rows; rt <= (r1 - 1) / g.tile_rows; ++rt) {
    for (int64_t ct = c0 / g.tile_cols; ct <= (c1 - 1) / g.tile_cols; ++ct) {
      fp.tiles.push_back(TileRef{op, rt * g.col_tiles() + ct});
    }
  }
}

// The columns of operand `op` (the batch: one example's floats).
int64_t TileRuleCols(const TilePlan& plan, int64_t op) {
  return op == kTileOperandBatch ? plan.input_size : plan.ops[static_cast<size_t>(op)].grid.cols;
}

// A linear forward tile reads 32 input rows and 32 weight rows of C floats: 256 C bytes (dX the
// same of OC). Up to C = 784 (Fashion-MNIST's input; 196 KiB of values, about 238 KiB with their
// proofs at GPT-2 small's 768) it is recomputed whole; above (GPT-2 medium's C = 1024 would need
// 256 KiB of values alone), its chain over c is narrowed into blocks of kTileLinearBlock columns
// (64 KiB of inputs each).
constexpr int64_t kTileLinearWholeMax = 784;
constexpr int64_t kTileLinearBlock = 256;
// A sequential model's layernorm over an image's last dimension W (TileOp::conv = {W}) normalises
// runs of W of each sample's columns: its rows n = (sample, run) of the (B, F) tensors it reads
// and writes, in row-major order. A forward or input-gradient tile reads the whole runs its
// columns fall in (at most 32 x (32 + 2 W - 2) floats an operand): up to W =
// kTileImageNormWidthMax it is recomputed whole; wider, the runs' reductions are narrowed over
// blocks of kTileLinearBlock of each run's columns as a wide layernorm's rows are
// (TileRuleLayerNormBlocks: a tile's columns fall in one or two runs, whose statistics its
// partial carries). Its weight and bias gradients chain over the rows n from 0, in blocks of
// max(1, kTileImageNormBlock / W) rows (a block's runs are contiguous in the tensor: at most 16
// of its tiles an operand, 64 KiB); wider than kTileImageNormWidthMax a block is one run, the
// weight gradient's narrowed as a wide layernorm's row block is (TileRuleLayerNormWeightBlocks)
// and the bias gradient's reading the tile's columns of the run.
constexpr int64_t kTileImageNormWidthMax = 256;
constexpr int64_t kTileImageNormBlock = 256;
// W, or 0 for any other operator (a layernorm over the tensor's rows among them).
int64_t TileRuleImageNormWidth(const TileOp& o) {
  const bool norm = o.kind == TileOpKind::kTileOpLayerNorm ||
                    o.kind == TileOpKind::kTileOpLayerNormInputGrad ||
                    o.kind == TileOpKind::kTileOpLayerNormWeightGrad ||
                    o.kind == TileOpKind::kTileOpLayerNormBiasGrad;
  return norm && !o.conv.empty() ? o.conv[0] : 0;
}
// The columns [f0, f1) of the whole runs of W that columns [c0, c1) fall in.
std::pair<int64_t, int64_t> TileRuleImageNormRuns(int64_t W, int64_t c0, int64_t c1) {
  return {c0 / W * W, (c1 + W - 1) / W * W};
}
// The width a layernorm normalises: an image's W, or the tensor's columns.
int64_t TileRuleNormWidth(const TilePlan& plan, const TileOp& o) {
  const int64_t W = TileRuleImageNormWidth(o);
  return W > 0 ? W : TileRuleCols(plan, o.x);
}
// The widest a layernorm's rows are recomputed whole at (kTileImageNormWidthMax over an image:
// its tiles read two runs, and 32 rows of them).
int64_t TileRuleNormWholeMax(const TileOp& o) {
  return TileRuleImageNormWidth(o) > 0 ? kTileImageNormWidthMax : kTileLinearWholeMax;
}
// The rows a layernorm forward or input-gradient tile normalises: runs [j0, j0 + nj) of width C
// of each of the tile's R tensor rows (a layernorm over the tensor's rows: the one run j0 = 0 of
// C = its columns; over an image: the one or two runs of W the tile's columns fall in). A
// narrowed tile's statistic s = jj R + r is that of run j0 + jj of its row r.
struct TileRuleNormRuns {
  int64_t C = 0, j0 = 0, nj = 1;
  // The run-relative columns [w0, w1) of run j0 + jj that tensor columns [c0, c1) cover.
  std::pair<int64_t, int64_t> Cols(int64_t jj, int64_t c0, int64_t c1) const {
    const int64_t f = (j0 + jj) * C;
    return {std::max(c0, f) - f, std::min(c1, f + C) - f};
  }
};
TileRuleNormRuns TileRuleNormRunsOf(const TilePlan& plan, const TileOp& o,
                                    const TileGrid::Rect& t) {
  const int64_t W = TileRuleImageNormWidth(o);
  if (W == 0) return {TileRuleCols(plan, o.x), 0, 1};
  return {W, t.c0 / W, (t.c1 - 1) / W - t.c0 / W + 1};
}
// An image layernorm gradient's chain: its rows (runs) and the rows of each of its blocks.
struct TileRuleImageNormChain {
  int64_t rows = 0, per = 1;
  int64_t blocks() const { return (rows + per - 1) / per; }
};
TileRuleImageNormChain TileRuleImageNormChainOf(const TilePlan& plan, const TileOp& o) {
  const int64_t W = TileRuleImageNormWidth(o);
  return {TileRuleRows(plan) * (TileRuleCols(plan, o.x) / W),
          std::max<int64_t>(1, kTileImageNormBlock / W)};
}
// The rows [n0, n1) of a layernorm weight or bias gradient's reduction block `block`: 32 rows of
// the batch, or an image layernorm's block of runs.
std::pair<int64_t, int64_t> TileRuleNormBlockRows(const TilePlan& plan, const TileOp& o,
                                                  int64_t block) {
  if (TileRuleImageNormWidth(o) == 0) return TileRuleBlockRows(TileRuleRows(plan), block);
  const TileRuleImageNormChain ch = TileRuleImageNormChainOf(plan, o);
  return {block * ch.per, std::min(ch.rows, (block + 1) * ch.per)};
}
// A layernorm tile (forward, or input gradient) reads its rows' whole width C for their row
// reductions: up to C = TileRuleNormWholeMax it is recomputed whole; above, the reductions are
// narrowed over nb blocks of kTileLinearBlock columns (of each of its runs: TileRuleNormRuns) in
// kernels_ref.cc's order: blocks 0..nb-1 the rows' running sum (the mean's), nb..2nb-1 their
// running sum of squared deviations (the partial: the RN = R nj means, then the RN sums); the
// input gradient then nb..3nb-1 its two sums dmean and dnmean (the partial: RN means, RN rstds,
// RN dmeans, RN dnmeans); the last block the tile's own columns. The number of column blocks nb,
// or 0 when whole.
int64_t TileRuleLayerNormBlocks(const TilePlan& plan, const TileOp& o) {
  if (o.kind != TileOpKind::kTileOpLayerNorm && o.kind != TileOpKind::kTileOpLayerNormInputGrad) {
    return 0;
  }
  const int64_t C = TileRuleNormWidth(plan, o);
  return C > TileRuleNormWholeMax(o) ? (C + kTileLinearBlock - 1) / kTileLinearBlock : 0;
}
// A layernorm dweight tile's row block (32 rows; over an image, its block of runs) reads those
// rows' whole input (their mean and rstd): above C = TileRuleNormWholeMax each row block is
// narrowed into `per` sub-blocks, 2 nb of the rows' mean and variance sums (as the forward's;
// the partial: the tile's accumulators, then the rows' sums, or means and sums of squares), then
// nq chunks of kTileLinearBlock of the tile's columns continuing their fma chains over the
// block's rows. nb = 0 when whole.
struct TileRuleLnWeight {
  int64_t nb = 0, nq = 0;
  int64_t per() const { return 2 * nb + nq; }
};
TileRuleLnWeight TileRuleLayerNormWeightBlocks(const TilePlan& plan, const TileOp& o) {
  if (o.kind != TileOpKind::kTileOpLayerNormWeightGrad) return {};
  const int64_t C = TileRuleNormWidth(plan, o);
  if (C <= TileRuleNormWholeMax(o)) return {};
  return {(C + kTileLinearBlock - 1) / kTileLinearBlock,
          (std::min(C, o.grid.tile_cols) + kTileLinearBlock - 1) / kTileLinearBlock};
}
// An `encoded` tile reads wte's column strip of its 32 columns over the whole vocabulary (the
// footprint is fixed before the tokens are known): 128 V bytes. Up to V = 1024 rows it is
// recomputed whole; above, it is narrowed into blocks of kTileEmbeddingBlock vocabulary rows
// (128 KiB of wte each, whatever V): S_0 = zeros, and S_{k+1} is S_k with every row whose token
// falls in block k set to wte[token] + wpe[position], so the last partial is the tile.
constexpr int64_t kTileEmbeddingWholeMax = 1024;
constexpr int64_t kTileEmbeddingBlock = 1024;
// A loss or loss-gradient tile reads its rows' whole logits (4 x 32 x V bytes). Up to V = 1024
// it is recomputed whole; above, it follows the reference softmax's order over the vocabulary in
// blocks of kTileSoftmaxBlock columns: blocks 0..nb-1 the running max (the partial: the tile's R
// rows' maxima), blocks nb..2nb-1 the running sum of Exp(x - max) (the partial: R maxima, R sums
// and R target logits, set by the block holding the target); the loss ends with the last sum
// block, the gradient reads its own logits tile in one block more.
constexpr int64_t kTileSoftmaxWholeMax = 1024;
constexpr int64_t kTileSoftmaxBlock = 1024;
int64_t TileRuleSoftmaxBlocks(const TilePlan& plan) {
  return plan.classes > kTileSoftmaxWholeMax
             ? (plan.classes + kTileSoftmaxBlock - 1) / kTileSoftmaxBlock
             : 0;
}
// An attention tile reads a whole sequence: att's row (b, h, t) the causal softmax over k of
// rows 0..t (4 T hs bytes), atty's element (b, t, c) the chain over att's row and v's column c
// (about 256 T bytes a tile). Up to T = kTileAttentionWholeMax (the 10M GPT's 256) they are
// recomputed whole; above, over the sequence's positions in blocks of kTileAttentionBlock:
// att in the reference kernel's order (kernels_ref.cc's AttentionForward), blocks 0..nb-1 the
// running max of each row's pre-softmax (the partial: the tile's R rows' maxima), blocks
// nb..2nb-1 the running sum of Exp(pre - max) (the partial: R maxima, then R sums), block 2nb
// the tile's own columns (Exp(pre - max) * (1 / sum), 0 past the diagonal); atty its chain
// over t2 from 0 in blocks of positions (the partial: the tile's accumulators).
constexpr int64_t kTileAttentionWholeMax = 256;
constexpr int64_t kTileAttentionBlock = kTileRows;
// A wide head narrows att and the attention backward the same way at any T: recomputed whole, a
// tile reads its rows' q and k of up to T + 32 positions in the head's hs columns (the backward v
// and dout as many), (T + 32) hs floats, which at hs = 512 and T = 256 would be 576 KiB. Up to
// kTileAttentionWholeFloats (the 10M GPT's 288 x 64; at T = 256, hs up to 128) they are recomputed
// whole, as they always were. Narrowed, att's dot products q_t . k_t2 (fma chains over the head's
// columns from 0) are cut into blocks of kTileAttentionHeadBlock columns, so its blocks read at
// most 4 x 64 x kTileAttentionHeadBlock bytes (64 KiB) whatever hs: each of its 2 nb + 1 blocks of
// positions is nh = ceil(hs / kTileAttentionHeadBlock) blocks, the first nh - 1 continuing the
// dots of the tile's rows and the block's keys (the partial: the block's statistics, then the R x
// keys dots), the last finishing them and applying the block's max, sum or output. A head of up
// to 256 columns is one block (nh = 1): a long sequence's plan is the one it always was.
constexpr int64_t kTileAttentionWholeFloats = (kTileAttentionWholeMax + kTileRows) * 128;
constexpr int64_t kTileAttentionHeadBlock = 256;
// The blocks of positions of a narrowed attention operator's sequence, or 0 when whole (atty's
// chain reads att and v of the tile's own columns, whatever hs: only a long sequence narrows it).
int64_t TileRuleAttentionBlocks(const TileOp& o) {
  const int64_t T = o.conv[0], hs = o.conv[2] / o.conv[1];
  const bool wide_head =
      o.kind != TileOpKind::kTileOpAttentionOut && (T + kTileRows) * hs > kTileAttentionWholeFloats;
  return T > kTileAttentionWholeMax || wide_head
             ? (T + kTileAttentionBlock - 1) / kTileAttentionBlock
             : 0;
}
// The blocks of a narrowed att tile's dot products over the head's columns (1 but for a head
// wider than kTileAttentionHeadBlock), and the columns [i0, i1) of sub-block ib.
int64_t TileRuleAttentionHeadBlocks(const TileOp& o) {
  const int64_t hs = o.conv[2] / o.conv[1];
  return o.kind == TileOpKind::kTileOpAttention && TileRuleAttentionBlocks(o) > 0
             ? (hs + kTileAttentionHeadBlock - 1) / kTileAttentionHeadBlock
             : 1;
}
std::pair<int64_t, int64_t> TileRuleAttentionHeadCols(const TileOp& o, int64_t ib) {
  const int64_t hs = o.conv[2] / o.conv[1], i0 = ib * kTileAttentionHeadBlock;
  return {i0, std::min(hs, i0 + kTileAttentionHeadBlock)};
}
// The key positions [k0, k1) of block `block` of a narrowed att tile; defined below, with the other
// sequence walkers.
std::pair<int64_t, int64_t> TileRuleAttentionKeys(const TileOp& o, const TileGrid::Rect& t,
                                                  int64_t block);

// The attention backward above T = kTileAttentionWholeMax: each qkv.grad tile's chain is
// preceded by the softmax backward's row sums s_t = the chain over t2 of att[t, t2] dA[t, t2]
// (kernels_ref.cc's AttentionBackward), which a dq element needs for its own row and a dk element
// for every query row. The groups (b * NH + h) whose sums a tile's q and k columns need, in the
// order its rows and columns are walked; defined below, with the other sequence walkers.
std::vector<int64_t> TileRuleBackwardSumGroups(const TileOp& o, const TileGrid::Rect& t);
// A narrowed backward's dA = dout . v dots (fma chains over the head's hs columns from 0), which
// its sum blocks and its q and k chain blocks recompute, read 32 rows of dout and of v in the
// head's columns for each group or segment (up to four a tile: 4 x 4 x 64 x hs bytes). Above
// kTileAttentionBackwardHeadBlock columns each block (its index ob in the unnarrowed order) is cut
// into nh = ceil(hs / kTileAttentionBackwardHeadBlock) blocks ob * nh + ib of the head's columns:
// the first nh - 1 continue the block's dots (the partial: the block's, then the dots), the last
// finishes them and applies the block (at most 4 x 4 x 64 x 128 bytes of dout and v, 128 KiB,
// whatever hs). A head of up to 128 columns is one block, as it always was.
constexpr int64_t kTileAttentionBackwardHeadBlock = 128;
int64_t TileRuleBackwardHeadBlocks(const TileOp& o) {
  const int64_t hs = o.conv[2] / o.conv[1];
  return TileRuleAttentionBlocks(o) > 0
             ? (hs + kTileAttentionBackwardHeadBlock - 1) / kTileAttentionBackwardHeadBlock
             : 1;
}
// The dots block ob of a narrowed backward tile carries between its column blocks: a sum block's
// for each of its groups' query rows and key positions, a chain block's dP rows and keys of each
// of the tile's q and k segments; defined below, with the other sequence walkers.
int64_t TileRuleBackwardDots(const TileOp& o, const TileGrid::Rect& t, int64_t ob);

// The global norm's block `block` (kTileOpGradNorm): which chunk of its parameter's block
// partials it combines (0 but for a parameter above kTileNormChunk partials); its partial holds
// the total before the parameter and the roots of the chunks before this one; -1 for a stage
// without parameters (no blocks). Defined below, with the other walkers of the gradients' block
// partials.
int64_t TileRuleNormChunk(const TilePlan& plan, const TileOp& o, int64_t block);
// The chunks of rows a max-pool's window is read in (below, with the windows).
int64_t TileRulePoolRowChunks(const TileOp& o);

// The floats of the partial sum S_block a reduction tile `t` continues from: the tile's, but for
// wte's gradient past the tied head's blocks, which carries the head's finished dW tile and the
// embedding's own accumulator (EmbeddingBackward adds its sum to the gradient once, at the end),
// and for a narrowed softmax's (kTileSoftmaxBlock).
int64_t TileRulePartialSize(const TilePlan& plan, const TileOp& o, const TileGrid::Rect& t,
                            int64_t block) {
  if (o.kind == TileOpKind::kTileOpEmbeddingGrad && o.b >= 0 &&
      block >= TileRuleRowBlocks(TileRuleRows(plan))) {
    return 2 * t.numel();
  }
  if (o.kind == TileOpKind::kTileOpLoss || o.kind == TileOpKind::kTileOpLossGrad) {
    // The rows' maxima, then their maxima, sums and target logits.
    const int64_t R = t.r1 - t.r0;
    return block <= TileRuleSoftmaxBlocks(plan) ? R : 3 * R;
  }
  if (const int64_t nb = TileRuleLayerNormBlocks(plan, o); nb > 0) {
    // The rows' sums, then means and sums of squares, then means, rstds, dmeans and dnmeans.
    const int64_t R = (t.r1 - t.r0) * TileRuleNormRunsOf(plan, o, t).nj;
    return block <= nb ? R : block <= 2 * nb ? 2 * R : 4 * R;
  }
  if (const TileRuleLnWeight lw = TileRuleLayerNormWeightBlocks(plan, o); lw.nb > 0) {
    // The accumulators, then the row block's sums (or means and sums of squares).
    const int64_t sub = block % lw.per();
    const auto [b0, b1] = TileRuleNormBlockRows(plan, o, block / lw.per());
    return t.numel() + (sub == 0 ? 0 : sub <= lw.nb ? 1 : 2) * (b1 - b0);
  }
  if (o.kind == TileOpKind::kTileOpAttention) {
    // The rows' maxima, then maxima and sums; inside a block of positions pb (a wide head's), the
    // statistics it continues and the dots of its rows and keys so far.
    const int64_t R = t.r1 - t.r0, nb = TileRuleAttentionBlocks(o);
    const int64_t nh = TileRuleAttentionHeadBlocks(o), pb = block / nh;
    if (block % nh == 0) return pb <= nb ? R : 2 * R;
    const auto [k0, k1] = TileRuleAttentionKeys(o, t, pb);
    return (pb < nb ? R : 2 * R) + R * (k1 - k0);
  }
  if (o.kind == TileOpKind::kTileOpAttentionBackward && TileRuleAttentionBlocks(o) > 0) {
    // The row sums of every group the tile needs (T each), then the tile's accumulators; inside
    // a wide head's block, then its dots so far.
    const int64_t nh = TileRuleBackwardHeadBlocks(o);
    return static_cast<int64_t>(TileRuleBackwardSumGroups(o, t).size()) * o.conv[0] + t.numel() +
           (block % nh == 0 ? 0 : TileRuleBackwardDots(o, t, block / nh));
  }
  // A max-pool input gradient's chain over windows past 25 rows: the accumulators, then each row's
  // running maximum and its index in the window.
  if (o.kind == TileOpKind::kTileOpMaxPoolInputGrad && o.window_chain &&
      TileRulePoolRowChunks(o) > 1) {
    return t.numel() + 2 * (t.r1 - t.r0);
  }
  // (A stage without parameters has no block, chunk -1: its one value is recomputed whole.)
  if (o.kind == TileOpKind::kTileOpGradNorm) return 1 + TileRuleNormChunk(plan, o, block);
  return t.numel();
}

// A conv2d tile's chain runs over (c, kh, kw): above this many input channels it is narrowed into
// blocks of this many.
constexpr int64_t kTileConvChannels = 4;

// The geometry a conv2d output tile (columns [c0, c1) of its (B, OC*OH*OW) view) touches: output
// channels [oc0, oc1), and the input rows [ih0, ih1) its output rows read (all the output rows
// when the tile spans channels).
struct TileRuleConvSpan {
  int64_t oc0, oc1, ih0, ih1;
};
// The planes [p0, p1) and rows [h0, h1) that columns [c0, c1) of a (B, planes*PH*PW) view cover
// (all the rows when they span planes).
struct TileRulePlaneSpan {
  int64_t p0, p1, h0, h1;
};
// The rows [h0, h1) of plane p that columns [c0, c1) of a (B, planes*PH*PW) view cover.
std::pair<int64_t, int64_t> TileRulePlaneRows(int64_t PH, int64_t PW, int64_t c0, int64_t c1,
                                              int64_t p) {
  const int64_t per = PH * PW;
  const int64_t lo = std::max(c0, p * per) - p * per, hi = std::min(c1, (p + 1) * per) - p * per;
  return {lo / PW, (hi - 1) / PW + 1};
}
TileRulePlaneSpan TileRulePlanesOf(int64_t planes, int64_t PH, int64_t PW, int64_t c0, int64_t c1) {
  const int64_t per = PH * PW;
  TileRulePlaneSpan r{c0 / per, std::min(planes, (c1 - 1) / per + 1), 0, PH};
  if (r.p1 - r.p0 == 1) std::tie(r.h0, r.h1) = TileRulePlaneRows(PH, PW, c0, c1, r.p0);
  return r;
}
// A windowed operator's (kTileOpConv's conv vector, a max-pool's with pad 0) output height and
// width.
int64_t TileRuleOutH(const TileOp& o) {
  return (o.conv[1] + 2 * o.conv[7] - o.conv[4]) / o.conv[6] + 1;
}
int64_t TileRuleOutW(const TileOp& o) {
  return (o.conv[2] + 2 * o.conv[7] - o.conv[5]) / o.conv[6] + 1;
}
TileRuleConvSpan TileRuleConvOf(const TileOp& o, int64_t c0, int64_t c1) {
  const int64_t H = o.conv[1], OC = o.conv[3], KH = o.conv[4], s = o.conv[6], pad = o.conv[7];
  const TileRulePlaneSpan ps = TileRulePlanesOf(OC, TileRuleOutH(o), TileRuleOutW(o), c0, c1);
  TileRuleConvSpan r{ps.p0, ps.p1, 0, 0};
  r.ih0 = std::max<int64_t>(0, ps.h0 * s - pad);
  r.ih1 = std::max(r.ih0, std::min(H, (ps.h1 - 1) * s - pad + KH));
  return r;
}
// A windowed operator over images wider than kTileConvWholeWidth (and not reading the examples,
// which a footprint carries whole) reads only the columns its tile's windows reach, not whole
// image rows (a 3 x 3 conv's block over whole rows of W = 512 read 768 KiB): a max-pool tile the
// windows of its own outputs (its input gradient the windows reaching its inputs), a conv2d tile
// the window columns of a block of kTileConvWideRows consecutive pairs of its chain, (c, kh) for
// the forward, (oc, kh) for the input gradient, in the reference kernels' order (kernels.h: the
// chain runs over (c, kh, kw), or (oc, kh, kw)). A pair reads one input (or output gradient) row
// per row of the tile: at most 4 x 32 x 2 x (31 s + KW + 64) bytes a pair. Up to W = 32 (the
// fashion CNN's 28 and 14) the footprints read whole rows, as they always did, but for a conv2d
// whose rows would pass the bound (below). A conv2d over chunked examples is narrowed so too
// (TileRuleConvOverChunks).
constexpr int64_t kTileConvWholeWidth = 32;
constexpr int64_t kTileConvWideRows = 4;
// A conv2d forward or input gradient over narrower images reads, for each of its block's
// kTileConvChannels channels, whole rows: those its tile's outputs' windows reach (the input
// gradient: the output rows whose windows reach its inputs), every row of the plane where a tile
// spans two planes. A large kernel or stride reaches many rows (a 7 x 7 kernel over 4 channels of
// 30 x 30: 4 x 32 x 4 x 30 x 30 bytes, 450 KiB; an 11 x 11 of stride 4 over 32 x 32, 31 of its
// rows: 496 KiB); past kTileConvRowsFloats
// (160 KiB of values; the fashion CNN's second conv reads 98 KiB) such a conv reads its windows'
// columns as over a wide image.
constexpr int64_t kTileConvRowsFloats = 40 * kTileRows * kTileCols;
// A max-pool's blocks are bounded by their whole witness, not their values alone: a block of 60
// tiles (240 KiB) with ~400 bytes of proof a tile passes the 256 KiB bound (ledger
// kMaxTileWitnessBytes). TileRuleWitnessBytes prices a block's witness at the worst: its values,
// each tile's (or example chunk's) header and Merkle proof, each example's leaf and proof, and the
// fixed parts (magic, counts, the output roots of the operators before it). Where the plan is cut
// without its operators' sizes (the chunks of a window's rows, the groups of a chain's outputs) a
// proof is priced at kTileWorstProofLevels levels (an operator of 16M tiles, 64 GiB) and the fixed
// parts at kTileWitnessFixedBytes (the roots of 126 operators); TileRuleCheckWindowBlocks then
// checks every max-pool block with its plan's own proof levels and operator count.
constexpr int64_t kTileWitnessBytes = 256 * 1024;
constexpr int64_t kTileWorstProofLevels = 24;
constexpr int64_t kTileWitnessFixedBytes = 4 * 1024;
// The witness bytes of a block reading `floats` floats of values in `tiles` tiles or example
// chunks and `examples` examples' leaves, its tiles' proofs `levels` deep, `fixed` bytes besides.
constexpr int64_t TileRuleWitnessBytes(int64_t floats, int64_t tiles, int64_t examples,
                                       int64_t levels = kTileWorstProofLevels,
                                       int64_t fixed = kTileWitnessFixedBytes) {
  // A proof: index, leaf count, sibling count and its siblings.
  const int64_t proof = 8 + 8 + 4 + 32 * levels;
  const int64_t example_proof = 8 + 8 + 4 + 32 * kTileWorstProofLevels;
  // A tile: op, index, value count, proof (a chunk: its count and proof, less); an example
  // (chunked: index, label, chunk root, proof, chunk count).
  return fixed + 4 * floats + tiles * (4 + 8 + 4 + proof) +
         examples * (8 + 4 + 32 + 4 + example_proof);
}
// Whether a block of `tiles` whole tiles of values (and `extra` floats more) fits the bound at the
// worst (kTileWorstProofLevels, kTileWitnessFixedBytes).
constexpr bool TileRuleTilesFitWitness(int64_t tiles, int64_t extra = 0, int64_t examples = 0) {
  return TileRuleWitnessBytes(tiles * kTileRows * kTileCols + extra, tiles + (extra > 0),
                              examples) <= kTileWitnessBytes;
}
// The rows a tile of a (B, planes x PH x PW) view touches: one plane's rows a run of kTileCols
// columns crosses, or (a tile across two planes) all of them.
int64_t TileRuleTileRows(int64_t PH, int64_t PW) {
  if ((PH * PW) % kTileCols != 0) return PH;
  return std::min(PH, (kTileCols - 1 + PW - 1) / PW + 1);
}
// The most planes of PH x PW a tile's kTileCols columns span.
int64_t TileRuleTilePlanes(int64_t planes, int64_t PH, int64_t PW) {
  const int64_t P = PH * PW;
  return std::min(
      planes, P % kTileCols == 0 ? std::max<int64_t>(1, kTileCols / P) : (kTileCols - 2) / P + 2);
}
// The tiles a max-pool forward tile over narrow images reads whole: its rows of every plane it
// spans (every row of them where it spans two), at most two tiles more a plane than their floats.
int64_t TileRulePoolRowsTiles(const TileOp& o) {
  const int64_t H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
  const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o);
  const int64_t floats = std::min(H, (TileRuleTileRows(OH, OW) - 1) * s + k) * W;
  return TileRuleTilePlanes(o.conv[0], OH, OW) * ((floats + kTileCols - 2) / kTileCols + 1);
}
bool TileRuleConvRowsOver(const TileOp& o) {
  // A max-pool tile over narrow images read, past the witness bound (4 x 32 x 2 x 400 x 30
  // bytes over two 400 x 30 planes: 3 MiB), reads its windows' columns as over a wide image; the
  // fashion CNN's pools read whole rows (its first, a tile across two 28 x 28 planes: 52 tiles).
  if (o.kind == TileOpKind::kTileOpMaxPool) {
    return !TileRuleTilesFitWitness(TileRulePoolRowsTiles(o));
  }
  if (o.kind != TileOpKind::kTileOpConv && o.kind != TileOpKind::kTileOpConvInputGrad) return false;
  const auto rows = TileRuleTileRows;
  const int64_t H = o.conv[1], W = o.conv[2], KH = o.conv[4], s = o.conv[6];
  const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o);
  const bool forward = o.kind == TileOpKind::kTileOpConv;
  const int64_t n = std::min(kTileConvChannels, forward ? o.conv[0] : o.conv[3]);
  const int64_t read = forward ? std::min(H, (rows(OH, OW) - 1) * s + KH) * W
                               : std::min(OH, (rows(H, W) + KH - 2) / s + 1) * OW;
  // And the weight's columns of its block's channels (forward) or its tile's planes (the input
  // gradient), in tiles of min(OC, 32) rows: with a large kernel over small images (a 16 x 16 one
  // to 32 channels over 4 x 16 x 16: 4 x 32 x 256 floats of rows and as many of weight, 256 KiB)
  // they pass the bound together. The fashion CNN's convs read 400 and 3,200 floats of weight.
  const int64_t weight = std::min(o.conv[3], kTileRows) * KH * o.conv[5] *
                         (forward ? n : TileRuleTilePlanes(o.conv[0], H, W));
  return n * kTileRows * read + weight > kTileConvRowsFloats;
}
// A first layer's conv2d over chunked examples (more than kExampleChunkFloats floats: a 3 x 32 x 32
// image and larger, step_replay.h) would read every chunk of its tile's 32 examples when recomputed
// whole (3 x 32 x 32: 384 KiB of values). It reads its windows' columns as over a wide image
// instead, one (c, kh) pair a block (TileRuleConvWidePairs): a pair reads, per output row run of
// its tile, one input row of channel c, in the chunks holding it. 32 examples' chunk is 128 KiB of
// values, so a block has no room for a second chunk: over 32 x 32 images a channel's plane is one
// chunk, so every block reads one, whatever the kernel; over larger planes a tile whose runs' rows
// straddle a chunk boundary (outputs not a multiple of 32 wide) reads two. Unchunked examples (the
// fashion CNN's 784 floats) are still read whole, as they always were.
// A first layer's max-pool over chunked examples likewise read every chunk of its rows (a tile
// across two 40 x 40 planes of 3 x 40 x 40 examples: four chunks of 32 examples, 512 KiB), and
// reads its windows' columns too, in pieces (TileRuleConvPiecesOf).
bool TileRuleConvOverChunks(const TileOp& o) {
  return (o.kind == TileOpKind::kTileOpConv || o.kind == TileOpKind::kTileOpMaxPool) &&
         o.x == kTileOperandBatch && ExampleChunks(o.conv[0] * o.conv[1] * o.conv[2]) > 0;
}
// A conv2d forward or input-gradient block read the weight's rows of its tile's output channels
// (the forward) or of its block's (the input gradient) in every (c, kh, kw) column of the block's
// channels: min(OC, 32) x KH x KW floats a channel, 288 KiB at a 48 x 48 kernel to 32 channels,
// past the bound with nothing else. Past kTileConvWeightWholeFloats (every kernel a model or test
// used before reads less: the 33 x 33 one to 4 channels 4,356 floats) a block reads only its
// pairs' (c, kh) (or (oc, kh)) KW weight columns, and such a conv is narrowed as over wide images,
// its pairs' weight tiles counted in a block's (TileRuleConvWidePairs); over the examples (whole
// where unchunked) one pair a block.
constexpr int64_t kTileConvWeightWholeFloats = 8 * kTileRows * kTileCols;
bool TileRuleConvWeightByPairs(const TileOp& o) {
  if (o.kind != TileOpKind::kTileOpConv && o.kind != TileOpKind::kTileOpConvInputGrad) return false;
  return std::min(o.conv[3], kTileRows) * o.conv[4] * o.conv[5] > kTileConvWeightWholeFloats;
}
// The weight tiles one pair of such a block reads at most: KW columns (at the worst alignment) of
// the forward tile's output channels (up to two tile rows), or of one output channel in each input
// plane the input-gradient tile spans.
int64_t TileRuleConvPairWeightTiles(const TileOp& o) {
  const int64_t cols = (o.conv[5] + kTileCols - 2) / kTileCols + 1;
  if (o.kind == TileOpKind::kTileOpConv) return 2 * cols;
  return TileRuleTilePlanes(o.conv[0], o.conv[1], o.conv[2]) * cols;
}
bool TileRuleWindowWide(const TileOp& o) {
  if (o.x == kTileOperandBatch) return TileRuleConvOverChunks(o) || TileRuleConvWeightByPairs(o);
  return o.conv[2] > kTileConvWholeWidth || TileRuleConvRowsOver(o) || TileRuleConvWeightByPairs(o);
}
// A wide conv2d block's pairs each read, per output (or input) row run of its tile, one row's
// window columns: kTileConvWideRows pairs a block, fewer where they would read more than
// kTileConvRowsFloats (a large kernel and stride over narrow images, whose tile crosses many short
// rows), at least one. Over the wide images every model and test used before (3 x 3 at stride 1,
// 5 x 5 at stride 2) it is kTileConvWideRows.
int64_t TileRuleConvWidePairs(const TileOp& o) {
  if (TileRuleConvOverChunks(o) || o.x == kTileOperandBatch) return 1;
  const bool forward = o.kind == TileOpKind::kTileOpConv;
  const int64_t W = o.conv[2], KW = o.conv[5], s = o.conv[6], OW = TileRuleOutW(o);
  const int64_t PW = forward ? OW : W;  // the tile's row runs
  const int64_t runs = std::min(kTileCols, (kTileCols - 1 + PW - 1) / PW + 1);
  const int64_t width = std::min(PW, kTileCols);
  const int64_t cols =
      forward ? std::min(W, (width - 1) * s + KW) : std::min(OW, (width + KW - 2) / s + 1);
  int64_t tiles = runs * ((cols - 1 + kTileCols - 1) / kTileCols + 1);
  if (TileRuleConvWeightByPairs(o)) tiles += TileRuleConvPairWeightTiles(o);
  return std::clamp<int64_t>(kTileConvRowsFloats / (kTileRows * kTileCols) / tiles, 1,
                             kTileConvWideRows);
}
// Calls fn(p, h, w0, w1) for each run of columns [c0, c1) of a (B, planes*PH*PW) view inside one
// row: plane p, row h, its columns [w0, w1).
template <typename F>
void ForEachPlaneRun(int64_t PH, int64_t PW, int64_t c0, int64_t c1, F&& fn) {
  for (int64_t c = c0; c < c1;) {
    const int64_t p = c / (PH * PW), h = (c % (PH * PW)) / PW, w0 = c % PW;
    const int64_t w1 = std::min(PW, w0 + (c1 - c));
    fn(p, h, w0, w1);
    c += w1 - w0;
  }
}
// The blocks of TileRuleConvWidePairs pairs a wide conv2d forward or input gradient's chain runs
// in.
int64_t TileRuleConvPairBlocks(const TileOp& o) {
  const int64_t n = o.kind == TileOpKind::kTileOpConv ? o.conv[0] : o.conv[3];
  const int64_t per = TileRuleConvWidePairs(o);
  return (n * o.conv[4] + per - 1) / per;
}
// The tiles of values a block of a windowed operator reads at most: kTileConvRowsFloats (160 KiB).
constexpr int64_t kTileWindowTiles = kTileConvRowsFloats / (kTileRows * kTileCols);
// The most outputs of a row whose windows' columns of one input row, (n - 1) s + KW floats, lie
// in `tiles` tiles (by default 40: 160 KiB, kTileConvRowsFloats, and kTileConvGradPairTiles), at
// least one: kTileCols up to stride 40 at a 3 x 3 kernel, 20 at stride 64.
int64_t TileRuleWindowRunWidth(int64_t s, int64_t KW, int64_t tiles = kTileWindowTiles) {
  // tiles(n) = ((n - 1) s + KW - 1 + kTileCols - 1) / kTileCols + 1 <= tiles.
  const int64_t most = (tiles - 1) * kTileCols + 1 - KW;
  return std::clamp<int64_t>(most < 0 ? 1 : most / s + 1, 1, kTileCols);
}
// The columns of a row one segment of a first layer's max-pool reads (a segment: up to as many
// outputs of an output row as TileRuleConvPiecesOf cuts them into, at most kTileCols).
int64_t TileRulePoolSegmentCols(const TileOp& o) {
  const int64_t W = o.conv[2], k = o.conv[4], s = o.conv[6];
  const int64_t width = TileRuleWindowRunWidth(s, k, std::max<int64_t>(1, kTileWindowTiles / k));
  return std::min(W, (std::min({TileRuleOutW(o), kTileCols, width}) - 1) * s + k);
}
// The most chunks of an example `rows` rows of one segment of a first layer's max-pool's windows
// read (below, with the pieces).
int64_t TileRulePoolSegmentChunks(const TileOp& o, int64_t cols, int64_t rows);
// A first layer's max-pool reads whole 1,024-float chunks of its examples: a window of k rows over
// rows of W floats spans about k W / 1,024 of them, so one example's window alone can pass the
// bound (a 64 x 64 window over 1 x 64 x 2000: 125 chunks, 500 KiB; the plan refused such a pool).
// Where one example's segment with the partial's tile passes the witness bound, its window
// is read in chunks of rows, one a block, as a forward's over activations is
// (TileRulePoolRowChunks; the partial carries each output's running maximum in its own element):
// as many rows as lie in kTileWindowTiles chunks of the example at the worst alignment (20 rows
// of 2,000 floats: 39 chunks), at least one (at most two chunks: the engine's windows are at most
// 64 wide). Every pool planned before (its window's chunks under the bound) reads its whole
// window a block, as it did.
int64_t TileRulePoolExampleRowChunk(const TileOp& o) {
  const int64_t k = o.conv[4], cols = TileRulePoolSegmentCols(o);
  // One example's chunks and the partial's tile, its leaf beside them.
  if (TileRuleTilesFitWitness(TileRulePoolSegmentChunks(o, cols, k) + 1, 0, 1)) return k;
  int64_t q = k;
  while (q > 1 && TileRulePoolSegmentChunks(o, cols, q) > kTileWindowTiles) --q;
  return q;
}
// A max-pool's one output's window, k rows of k columns (two tiles a row at the worst alignment up
// to k = 33, three to 64), with its block's other tile or two (dout, the partial) and their
// proofs, passes the witness bound past k = 25 (TileRuleTilesFitWitness: 2 k + 2 = 54 tiles at
// k = 26, 268,696 bytes at the worst; up to 29 rows were read whole before, 60 tiles, ~269 KB
// with proofs of 11 levels). Such a window is read in chunks of rows, each a block, in the
// forward's scan order (kh, then kw): the forward's piece (one output) carries its running maximum
// in the partial's own element; the input gradient's chain carries each row's running maximum and
// its index in the window (exact in a float: below 4,096) beside the accumulators, and adds dout
// into the argmax after the window's last chunk. A chunk is kTileWindowTiles / (tiles a row) rows:
// 20 up to k = 33 (two chunks from 26), 13 to 64 (five). Up to k = 25 a block reads the whole
// window.
int64_t TileRulePoolRowChunk(const TileOp& o) {
  const int64_t k = o.conv[4], tiles = (k + kTileCols - 2) / kTileCols + 1;
  // Only a forward read by its windows' columns (TileRuleWindowWide; not a first layer's, whose
  // pieces are cut by the chunks of its examples), or an input gradient's chain, reads one output's
  // window a block.
  if (o.kind == TileOpKind::kTileOpMaxPool && TileRuleConvOverChunks(o)) {
    return TileRulePoolExampleRowChunk(o);
  }
  const bool cut = o.kind == TileOpKind::kTileOpMaxPoolInputGrad
                       ? o.window_chain
                       : o.x != kTileOperandBatch && TileRuleWindowWide(o);
  if (!cut || TileRuleTilesFitWitness(k * tiles + 2)) return k;
  return kTileWindowTiles / tiles;
}
int64_t TileRulePoolRowChunks(const TileOp& o) {
  const int64_t q = TileRulePoolRowChunk(o);
  return (o.conv[4] + q - 1) / q;
}
// Even one pair a block can read too much of a wide conv2d forward: per output row run of its
// tile one input row's window columns, and a tile crosses up to 32 short rows. So its tile's
// outputs are cut into pieces, each running its whole chain (every pair block, from the bias)
// before the next piece starts (the elements' chains are independent; a piece's block leaves the
// others as the partial has them): pieces of `runs` consecutive segments of the tile (its output
// row runs in ForEachPlaneRun's order, each cut at multiples of `width` outputs), and, over
// chunked examples whose rows straddle a chunk, of half its rows. Where a tile reads little
// enough (every shape a model or test used before), one piece: the whole tile.
//   - Past stride 40 (at a 3 x 3 kernel) one pair's window columns of a run of 32 outputs lie in
//     more than 40 tiles (63 at stride 64: 252 KiB): segments are `width` outputs at most
//     (TileRuleWindowRunWidth).
//   - Over activations (narrow images with a kernel nearly as wide: OW of 1 or 2): a pair reads
//     each segment's window columns in up to `tiles` tiles; past 40 tiles for one pair, a piece is
//     as many segments as fit them (at OW 1, 32 runs of 2 tiles each read 256 KiB before).
//   - Over chunked examples (a first layer over planes larger than a chunk,
//     TileRuleConvOverChunks): a tile's runs at different output rows read different input rows,
//     in different chunks where the rows straddle a chunk boundary (two chunks of 32 examples:
//     256 KiB), unless a chunk holds whole planes; so a piece is one segment (one input row: one
//     chunk, as a block over a 32 x 32 plane reads). Where an image row itself can straddle a
//     chunk (W not dividing kExampleChunkFloats), a segment's window columns can read two or three
//     chunks: a piece is then 16 of the tile's examples.
// A max-pool forward over wide images is cut the same way (it has no pairs: a piece is one block),
// but its segment reads the window's k input rows, not one: segments are as many outputs as fit
// 40 / k tiles a row, and a piece as many segments as fit 40 tiles (an 8 x 8 window of stride 8
// over 600-wide rows: 16-output segments, one a piece, where the whole tile read 76 tiles). Up to
// a 4 x 4 window of stride 4 (every shape a model or test used before) a tile is one piece (at
// most 40 tiles: 2 runs of 4 rows of 5 tiles, or narrower runs of 2). Past k = 20 even
// one output's window (two tiles a row) passes 40 tiles: such a window's piece is one output (up
// to 52 tiles at k = 25; past that its rows are read in chunks, one a block:
// TileRulePoolRowChunks).
// The most chunks of an example one segment of a first layer's max-pool reads: its window's k
// rows, (k - 1) W + cols floats from its first, in one chunk where a plane lies in one, or where
// the windows' rows are aligned blocks of a chunk (3 x 64 x 64 at 2 x 2: rows 2 oh and 2 oh + 1,
// 128 floats); else as many as that span can cross.
// Where its window's rows are read in chunks (TileRulePoolExampleRowChunk), `rows` of them.
int64_t TileRulePoolSegmentChunks(const TileOp& o, int64_t cols, int64_t rows) {
  const int64_t H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
  const bool aligned =
      (H * W) % kExampleChunkFloats == 0 && kExampleChunkFloats % (s * W) == 0 && k <= s;
  if (kExampleChunkFloats % (H * W) == 0 || aligned) return 1;
  return ((rows - 1) * W + cols + kExampleChunkFloats - 2) / kExampleChunkFloats + 1;
}
struct TileRuleConvPieces {
  int64_t runs = kTileCols;   // segments a piece; kTileCols: every segment of the tile
  int64_t run_groups = 1;     // the pieces over a tile's segments
  int64_t row_parts = 1;      // the pieces over its rows (1 or 2)
  int64_t width = kTileCols;  // the most outputs of a segment (at least OW: whole runs)
  int64_t count() const { return run_groups * row_parts; }
};
TileRuleConvPieces TileRuleConvPiecesOf(const TileOp& o) {
  TileRuleConvPieces p;
  const bool pool = o.kind == TileOpKind::kTileOpMaxPool;
  if ((o.kind != TileOpKind::kTileOpConv && !pool) || !TileRuleWindowWide(o)) return p;
  const int64_t H = o.conv[1], W = o.conv[2], KW = o.conv[5], s = o.conv[6];
  // The input rows a segment's windows read a block: a pair's one, or a max-pool window's k.
  const int64_t rows = pool ? o.conv[4] : 1;
  const int64_t OW = TileRuleOutW(o);
  const int64_t width =
      TileRuleWindowRunWidth(s, KW, std::max<int64_t>(1, kTileWindowTiles / rows));
  // The most segments a tile's 32 columns make (its row runs: one where rows are whole tiles;
  // and each cut at multiples of width), and the most tiles one segment's window columns of a row
  // lie in.
  int64_t runs = OW % kTileCols == 0 ? 1 : std::min(kTileCols, (kTileCols - 2) / OW + 2);
  p.width = OW;
  if (width < std::min(OW, kTileCols)) {
    p.width = width;
    runs = std::min(kTileCols, runs + (kTileCols - 1) / width + 1);
  }
  const int64_t cols = std::min(W, (std::min({OW, kTileCols, p.width}) - 1) * s + KW);
  const int64_t tiles = (cols - 1 + kTileCols - 1) / kTileCols + 1;
  int64_t per = runs;
  if (TileRuleConvOverChunks(o) && pool) {
    // A first layer's max-pool: a piece is one segment (TileRulePoolSegmentChunks of each of its
    // examples), of as many of its examples (a power of two) as keep their chunks within
    // kTileWindowTiles (16 where a segment reads two chunks).
    per = 1;
    const int64_t chunks = TileRulePoolSegmentChunks(o, cols, TileRulePoolRowChunk(o));
    while (kTileRows / p.row_parts * chunks > kTileWindowTiles && p.row_parts < kTileRows) {
      p.row_parts *= 2;
    }
  } else if (TileRuleConvOverChunks(o)) {
    if (kExampleChunkFloats % (H * W) != 0 || p.width < OW) per = 1;
    if (kExampleChunkFloats % W != 0) p.row_parts = 2;
  } else if (runs * rows * tiles > kTileWindowTiles) {
    per = std::max<int64_t>(1, kTileWindowTiles / (rows * tiles));
  }
  p.runs = per;
  p.run_groups = (runs + per - 1) / per;
  return p;
}
// The outputs of tile `t` that block `block` of a conv2d forward computes (rows [r0, r1), columns
// [c0, c1): a piece, or the whole tile; empty past a short tile's segments or rows), and the block
// of pairs it runs for them (TileRuleConvPairs).
struct TileRuleConvPiece {
  int64_t r0, r1, c0, c1, pair_block;
};
TileRuleConvPiece TileRuleConvPieceOf(const TileOp& o, const TileGrid::Rect& t, int64_t blocks,
                                      int64_t block) {
  const TileRuleConvPieces p = TileRuleConvPiecesOf(o);
  if (blocks == 0 || p.count() == 1) return {t.r0, t.r1, t.c0, t.c1, block};
  // A max-pool's piece is one block, or one a chunk of its window's rows (TileRulePoolRowChunks:
  // pair_block is then the chunk).
  const int64_t nb =
      o.kind == TileOpKind::kTileOpMaxPool ? TileRulePoolRowChunks(o) : TileRuleConvPairBlocks(o);
  const int64_t piece = block / nb;
  const int64_t group = piece / p.row_parts, part = piece % p.row_parts;
  const int64_t rows = kTileRows / p.row_parts;
  TileRuleConvPiece r{std::min(t.r1, t.r0 + part * rows), std::min(t.r1, t.r0 + (part + 1) * rows),
                      t.c1, t.c1, block % nb};
  int64_t run = 0, c = t.c0;
  ForEachPlaneRun(TileRuleOutH(o), TileRuleOutW(o), t.c0, t.c1,
                  [&](int64_t, int64_t, int64_t w0, int64_t w1) {
                    for (int64_t a = w0; a < w1;) {  // the run's segments
                      const int64_t b = std::min(w1, (a / p.width + 1) * p.width);
                      if (run / p.runs == group) {
                        if (r.c0 == t.c1) r.c0 = c;
                        r.c1 = c + (b - a);
                      }
                      c += b - a;
                      ++run;
                      a = b;
                    }
                  });
  return r;
}
// The pairs [q0, q1) of the chain over (c or oc, kh) that block `block` of a conv2d forward or
// input-gradient tile runs (q = channel * KH + kh): all of them when whole (blocks == 0), a block
// of kTileConvChannels channels, or (wide) a block of TileRuleConvWidePairs pairs (of a forward
// cut into pieces, its piece's: TileRuleConvPieceOf).
std::pair<int64_t, int64_t> TileRuleConvPairs(const TileOp& o, int64_t blocks, int64_t block) {
  const int64_t n = o.kind == TileOpKind::kTileOpConv ? o.conv[0] : o.conv[3], KH = o.conv[4];
  if (blocks == 0) return {0, n * KH};
  if (TileRuleWindowWide(o)) {
    const int64_t per = TileRuleConvWidePairs(o), q0 = block % TileRuleConvPairBlocks(o) * per;
    return {q0, std::min(n * KH, q0 + per)};
  }
  return {block * kTileConvChannels * KH, std::min(n, (block + 1) * kTileConvChannels) * KH};
}
// The outputs [ow0, ow1) of a windowed operator's row whose windows (KW columns from ow * s -
// pad) reach input columns [w0, w1).
std::pair<int64_t, int64_t> TileRuleWindowCols(const TileOp& o, int64_t w0, int64_t w1) {
  const int64_t KW = o.conv[5], s = o.conv[6], pad = o.conv[7];
  const int64_t lo = w0 + pad - KW + 1;
  const int64_t ow0 = lo <= 0 ? 0 : (lo + s - 1) / s;
  const int64_t ow1 = std::min(TileRuleOutW(o), (w1 - 1 + pad) / s + 1);
  return {ow0, std::max(ow0, ow1)};
}
// The input columns [iw0, iw1) the windows of outputs [ow0, ow1) of a row read (inside the image).
std::pair<int64_t, int64_t> TileRuleWindowInputCols(const TileOp& o, int64_t ow0, int64_t ow1) {
  const int64_t W = o.conv[2], KW = o.conv[5], s = o.conv[6], pad = o.conv[7];
  const int64_t iw0 = std::max<int64_t>(0, ow0 * s - pad);
  return {iw0, std::max(iw0, std::min(W, (ow1 - 1) * s - pad + KW))};
}

// The tiles a block of a max-pool input gradient's chain over its outputs reads at most, its
// outputs a group of TileRulePoolChainSlots (below, with the chain): at most 48 where a group is
// more than one output, 2 k + 2 for one output's window.
int64_t TileRulePoolChainGroupTiles(const TileOp& o);

// The most floats of values a block of a max-pool forward or input-gradient tile reads (whole
// tiles of kTileRows x kTileCols, chunks of 32 examples, the partial's tile), by the footprints'
// arithmetic at the worst alignment of the windows' columns in the tiles. The tile plan narrows or
// refuses a max-pool whose block's witness (these values with their proofs:
// TileRuleBlockWitnessBytes) passes the 256 KiB bound (PlanStepTiles). A forward tile is cut into
// pieces (TileRuleConvPiecesOf) down to one output's window, k rows in up to two tiles each; a
// whole input-gradient tile reads, for each input row run (two where its 32 columns wrap a row),
// the outputs whose windows reach it and those windows' k rows (the windows' argmax), which passes
// the bound from windows of about 16 rows over wide images (a 16 x 16 window of stride 8 over
// 601-wide rows: 290,816 bytes); past it the tile is a chain over those outputs
// (TileOp::window_chain), one output's window a block.
int64_t TileRuleWindowBlockFloats(const TilePlan& plan, const TileOp& o) {
  constexpr int64_t kTile = kTileRows * kTileCols;
  const int64_t H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
  const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o);
  // The tiles of a row's window columns [a, a + n) at the worst alignment.
  const auto row_tiles = [](int64_t n) { return n <= 0 ? 0 : (n + kTileCols - 2) / kTileCols + 1; };
  if (o.kind == TileOpKind::kTileOpMaxPool) {
    const TileRuleConvPieces p = TileRuleConvPiecesOf(o);
    const int64_t partial = p.count() > 1 || TileRulePoolRowChunks(o) > 1 ? kTile : 0;
    if (o.x == kTileOperandBatch) {
      if (!TileRuleConvOverChunks(o)) return kTileRows * plan.input_size;  // whole examples
      // A segment of the piece's examples (a chunk of its window's rows).
      const int64_t cols = TileRulePoolSegmentCols(o);
      return kTileRows / p.row_parts * TileRulePoolSegmentChunks(o, cols, TileRulePoolRowChunk(o)) *
                 kExampleChunkFloats +
             partial;
    }
    if (!TileRuleWindowWide(o)) return TileRulePoolRowsTiles(o) * kTile;
    // A piece's segments, each k rows of its windows' columns (or a chunk of them).
    const int64_t cols = std::min(W, (std::min({OW, kTileCols, p.width}) - 1) * s + k);
    const int64_t rows = TileRulePoolRowChunk(o);
    return p.runs * rows * row_tiles(cols) * kTile + (rows < k ? kTile : partial);
  }
  if (o.kind != TileOpKind::kTileOpMaxPoolInputGrad) return 0;
  // Narrowed into a chain over its outputs (TileRulePoolChainSlots): a block reads one output's
  // dout (one tile) and its window's k rows of k columns, with the tile's accumulators.
  // A window past 25 rows in chunks of rows, the partial carrying each row's running maximum and
  // its index.
  if (o.window_chain) {
    const int64_t rows = TileRulePoolRowChunk(o);
    if (rows < k) return (2 + rows * row_tiles(k)) * kTile + 2 * kTileRows;
    // A group of outputs (TileRulePoolChainSlots): one row's, or whole rows.
    return TileRulePoolChainGroupTiles(o) * kTile;
  }
  // The output rows reaching an input row (one for a plane's first or last row), the outputs of a
  // row reaching a run of n input columns inside a row (n_ow) or at its start or end (edge), and
  // the input rows of their windows.
  const int64_t n_oh = std::min(OH, (k + s - 1) / s);
  const int64_t rows = std::min(H, (n_oh - 1) * s + k);
  const auto n_ow = [&](int64_t n) { return std::min(OW, (n + k - 2) / s + 1); };
  const auto edge = [&](int64_t n) { return std::min(OW, (n - 1) / s + 1); };
  if (W > kTileConvWholeWidth) {
    // A tile's columns are one run of kTileCols, or two: the end of a row and the start of the
    // next, whose windows' columns are contiguous in the (B, C H W) view (so a row of windows of
    // both lies in the columns within k - 1 of the tile's, shifted by whole rows), or, across two
    // planes, the end of one plane's last row and the start of the next plane's first.
    const int64_t one = n_oh * row_tiles(n_ow(kTileCols)) +
                        rows * row_tiles(std::min(W, (n_ow(kTileCols) - 1) * s + k));
    const int64_t wrap = (n_oh + 1) * row_tiles(n_ow(kTileCols) + 1) +
                         std::min(H + 1, rows + s) * row_tiles(kTileCols + 2 * k - 2);
    int64_t planes = 0;
    for (int64_t a = 1; o.conv[0] > 1 && a < kTileCols; ++a) {
      const int64_t e0 = edge(a), e1 = edge(kTileCols - a);
      planes = std::max(planes, row_tiles(e0) + row_tiles(e1) +
                                    k * (row_tiles(std::min(W, (e0 - 1) * s + k)) +
                                         row_tiles(std::min(W, (e1 - 1) * s + k))));
    }
    return std::max({one, wrap, planes}) * kTile;
  }
  // Over narrow images, per plane the tile spans: the output rows reaching its rows, their dout
  // and the input rows of their windows, whole.
  const int64_t tile_rows = std::min(H, (kTileCols - 1 + W - 1) / W + 1);
  const int64_t oh = std::min(OH, (tile_rows + k - 2) / s + 1);
  const int64_t tiles = row_tiles(oh * OW) + row_tiles(std::min(H, (oh - 1) * s + k) * W);
  return TileRuleTilePlanes(o.conv[0], H, W) * tiles * kTile;
}

// The proof levels of the plan's operators' tiles at most (their output roots' trees).
int64_t TileRulePlanProofLevels(const TilePlan& plan) {
  int64_t tiles = 1;
  for (const TileOp& o : plan.ops) tiles = std::max(tiles, o.grid.count());
  int64_t levels = 0;
  while ((int64_t{1} << levels) < tiles) ++levels;
  return levels;
}
// The witness bytes of a block of operator `j` reading `floats` floats of values (whole tiles, the
// partial's tile and, a first layer's, chunks of its examples) and `examples` examples' leaves:
// TileRuleWitnessBytes with the plan's proof levels (its largest operator's tiles; an example's
// proof at kTileWorstProofLevels, the data set's size unknown here) and the output roots of the
// j operators before it.
int64_t TileRuleBlockWitnessBytes(const TilePlan& plan, int64_t j, int64_t floats,
                                  int64_t examples) {
  constexpr int64_t kTile = kTileRows * kTileCols;
  // Magic (its length and up to 27 bytes), the counts of outputs, tiles, examples, partial,
  // pages and chunked examples, and the roots.
  const int64_t fixed = 4 + 27 + 6 * 4 + 32 * j;
  return TileRuleWitnessBytes(floats, (floats + kTile - 1) / kTile, examples,
                              TileRulePlanProofLevels(plan), fixed);
}
int64_t TileRuleWindowBlockWitnessBytes(const TilePlan& plan, int64_t op) {
  const TileOp& o = plan.ops[static_cast<size_t>(op)];
  // A first layer's block reads a piece's examples (TileRuleConvPiecesOf: a part of the tile's).
  const int64_t examples = o.x != kTileOperandBatch ? 0
                           : TileRuleConvOverChunks(o)
                               ? kTileRows / TileRuleConvPiecesOf(o).row_parts
                               : kTileRows;
  return TileRuleBlockWitnessBytes(plan, op, TileRuleWindowBlockFloats(plan, o), examples);
}

// The blocks of a tile row a max-pool's footprints are read exactly over, past which its
// arithmetic bound rules alone.
constexpr int64_t kTileWindowCheckTiles = 1 << 14;
// The most bytes a witness of a block of max-pool operator `j` takes: TileRuleWindowBlockFloats's
// arithmetic (at the worst alignment) with its proofs, or, past the bound, the largest of the
// witnesses of every block of its first tile row read exactly (every tile row reads the same
// columns, the last one fewer rows), up to kTileWindowCheckTiles blocks; past that the arithmetic.
Result<int64_t> TileRuleWindowWorstWitnessBytes(const TilePlan& plan, int64_t j) {
  const TileOp& o = plan.ops[static_cast<size_t>(j)];
  int64_t bytes = TileRuleWindowBlockWitnessBytes(plan, j);
  const int64_t blocks = std::max<int64_t>(ReductionBlocks(plan, j), 1);
  if (bytes <= kTileWitnessBytes || o.grid.col_tiles() * blocks > kTileWindowCheckTiles) {
    return bytes;
  }
  bytes = 0;
  for (int64_t t = 0; t < o.grid.col_tiles(); ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      ML_ASSIGN_OR_RETURN(TileFootprint fp, Footprint(plan, j, t, b));
      bytes = std::max(bytes, TileRuleFootprintWitnessBytes(plan, j, t, b, fp));
    }
  }
  return bytes;
}
// Narrows, or refuses, a plan's max-pools (forward or input gradient) whose blocks' witnesses could
// pass kTileWitnessBytes (TileRuleWindowWorstWitnessBytes: values, proofs and fixed parts, at the
// worst alignment or read exactly). An input gradient past the bound whole is made a chain over
// its outputs (TileOp::window_chain: every pool the plan took before keeps its plan), past 25 rows
// over chunks of each window's rows (TileRulePoolRowChunks), as a forward's one-output pieces are
// (a first layer's too, by the chunks of its examples its rows lie in:
// TileRulePoolExampleRowChunk); what still passes (no window the engine builds, kernels being at
// most 64) is refused.
Status TileRuleCheckWindowBlocks(TilePlan& plan) {
  for (int64_t j = 0; j < static_cast<int64_t>(plan.ops.size()); ++j) {
    TileOp& o = plan.ops[static_cast<size_t>(j)];
    if (o.kind != TileOpKind::kTileOpMaxPool && o.kind != TileOpKind::kTileOpMaxPoolInputGrad) {
      continue;
    }
    ML_ASSIGN_OR_RETURN(int64_t bytes, TileRuleWindowWorstWitnessBytes(plan, j));
    if (bytes <= kTileWitnessBytes) continue;
    if (o.kind == TileOpKind::kTileOpMaxPoolInputGrad && !o.window_chain) {
      o.window_chain = true;
      ML_ASSIGN_OR_RETURN(bytes, TileRuleWindowWorstWitnessBytes(plan, j));
      if (bytes <= kTileWitnessBytes) continue;
    }
    // "layers.<i>.out" or "layers.<i>.in.grad" (after a micro-batch's prefix).
    const size_t at = o.name.find("layers.");
    const std::string layer = o.name.substr(at, o.name.find('.', at + 7) - at);
    const auto n = [](int64_t v) { return std::to_string(v); };
    return FailedPrecondition(
        "tile rule: model." + layer.substr(0, 6) + "[" + layer.substr(7) + "] (maxpool2d, a " +
        n(o.conv[4]) + " x " + n(o.conv[4]) + " window of stride " + n(o.conv[6]) + " over " +
        n(o.conv[0]) + " x " + n(o.conv[1]) + " x " + n(o.conv[2]) + "): a block of its " +
        (o.kind == TileOpKind::kTileOpMaxPool ? "output" : "input gradient") +
        "'s witness can reach " + n(bytes) + " bytes (values and proofs), past the " +
        n(kTileWitnessBytes) +
        "-byte bound of a tile witness, so the ledger could not rule it; "
        "the tile plan cuts a max-pool's blocks down to chunks of one output's window's rows "
        "(docs/verification.md, \"The witness bound\"): use a smaller window or narrower "
        "images");
  }
  return Status::Ok();
}

// The gradients of a windowed operator: the output rows [oh0, oh1) whose windows (KH rows from
// oh * s - pad) reach input rows [h0, h1), the only outputs whose gradient flows into them.
std::pair<int64_t, int64_t> TileRuleWindowRows(const TileOp& o, int64_t h0, int64_t h1) {
  const int64_t KH = o.conv[4], s = o.conv[6], pad = o.conv[7];
  const int64_t lo = h0 + pad - KH + 1;  // the first output row oh with oh * s - pad + KH > h0
  const int64_t oh0 = lo <= 0 ? 0 : (lo + s - 1) / s;
  const int64_t oh1 = std::min(TileRuleOutH(o), (h1 - 1 + pad) / s + 1);
  return {oh0, std::max(oh0, oh1)};
}
// A max-pool input gradient whose whole tile passes the bound (TileOp::window_chain) is a chain
// over the outputs reaching it. Each input element adds, from 0, dout of the windows whose argmax
// it is, in increasing output order (kernels.h's MaxPool2dBackward); the elements' chains are
// independent, so the tile's chain runs over its input row runs (ForEachPlaneRun: one, or two
// where its columns wrap a row or a plane) one after the other, and over each run's outputs (those
// whose windows reach it: output rows TileRuleWindowRows by columns TileRuleWindowCols) in
// increasing (oh, ow), one output a block adding its dout into the run's element that is its
// argmax, if any. (An output reaching both runs is visited twice, once for each run's elements:
// each element still sees its outputs in increasing order.) Every tile has the same slots: the
// most runs a tile's kTileCols columns make, times the most output rows reaching an input row,
// times the most outputs of a row reaching a run; a slot past a tile's runs or its run's outputs
// leaves the partial as it is. One output's block reads dout of its output (one tile) and its
// window's k rows of k columns (two tiles a row up to k = 33): with the partial, 2k + 2 tiles,
// whose witness fits the bound up to k = 25 (the forward's one-output piece reads as much).
// A block is a group of consecutive slots of its run, in the same order: `group` outputs of one
// output row, or (where a whole row fits, group == cols) `row_group` whole rows of them; the
// recompute visits its outputs in increasing (oh, ow), so every element still sees its outputs
// in the kernel's order, and the chain's partial after a group is the one-output chain's after its
// last output. The groups are as large as keep a block within kTilePoolGroupTiles tiles at the
// worst alignment: dout of its outputs, each window row's columns of its outputs and the partial's
// tile. (A 16 x 16 window of stride 1 over 4 x 64 x 64: 18 outputs a block, 48 blocks where one
// output a block made 752; 20 x 20 of stride 1: 14 outputs, 43 tiles, one more than one output's
// window.) A window past 25 rows (read in chunks of its rows), or whose two outputs pass
// kTilePoolGroupTiles (k >= 23), is one output a block, as before.
// 48 tiles: 192 KiB of values, and 64 KiB left for the block's tiles' proofs and the output roots
// (TileRuleTilesFitWitness: 239,296 bytes at the worst), under the 256 KiB witness bound.
constexpr int64_t kTilePoolGroupTiles = 48;
static_assert(TileRuleTilesFitWitness(kTilePoolGroupTiles));
struct TileRulePoolChainSlots {
  int64_t runs = 0, rows = 0, cols = 0;
  int64_t group = 1;      // outputs of a row a block (<= cols)
  int64_t row_group = 1;  // whole rows a block (> 1 only where group == cols)
  int64_t per_row() const { return (cols + group - 1) / group; }
  int64_t per_run() const {
    return group < cols ? rows * per_row() : (rows + row_group - 1) / row_group;
  }
  int64_t count() const { return runs * per_run(); }
};
// The tiles of n consecutive floats of a row at the worst alignment.
int64_t TileRuleRunTiles(int64_t n) { return n <= 0 ? 0 : (n + kTileCols - 2) / kTileCols + 1; }
// The tiles a chain block of `outputs` consecutive outputs of `rows` output rows reads at most:
// dout (a run of its outputs a row), the distinct input rows of their windows (each the union of
// its outputs' window columns) and the partial's tile.
int64_t TileRulePoolChainBlockTiles(const TileOp& o, int64_t outputs, int64_t rows) {
  const int64_t W = o.conv[2], k = o.conv[4], s = o.conv[6];
  const int64_t span = std::min(W, (outputs - 1) * s + k);
  const int64_t window = std::min(TileRuleRunTiles(span), outputs * TileRuleRunTiles(k));
  const int64_t input_rows = std::min(rows * k, (rows - 1) * s + k);
  return rows * TileRuleRunTiles(outputs) + input_rows * window + 1;
}
TileRulePoolChainSlots TileRulePoolChainSlotsOf(const TileOp& o) {
  const int64_t W = o.conv[2], k = o.conv[4], s = o.conv[6];
  TileRulePoolChainSlots sl;
  sl.runs = W % kTileCols == 0 ? 1 : std::min(kTileCols, (kTileCols - 2) / W + 2);
  sl.rows = std::min(TileRuleOutH(o), (k + s - 1) / s);
  sl.cols = std::min(TileRuleOutW(o), (std::min(W, kTileCols) + k - 2) / s + 1);
  if (TileRulePoolRowChunks(o) > 1) return sl;
  while (sl.group < sl.cols &&
         TileRulePoolChainBlockTiles(o, sl.group + 1, 1) <= kTilePoolGroupTiles) {
    ++sl.group;
  }
  while (sl.group == sl.cols && sl.row_group < sl.rows &&
         TileRulePoolChainBlockTiles(o, sl.cols, sl.row_group + 1) <= kTilePoolGroupTiles) {
    ++sl.row_group;
  }
  return sl;
}
int64_t TileRulePoolChainGroupTiles(const TileOp& o) {
  const TileRulePoolChainSlots sl = TileRulePoolChainSlotsOf(o);
  return TileRulePoolChainBlockTiles(o, sl.group, sl.row_group);
}
// Block `block` of such a tile (a group of slots, TileRulePoolChainSlots): its run (channel c,
// input row ih, columns [iw0, iw1), the run's first column in the tile col0) and its outputs, rows
// [oh0, oh1) by columns [ow0, ow1); empty past the tile's runs or its run's outputs.
struct TileRulePoolChainBlock {
  bool empty = true;
  int64_t c = 0, ih = 0, iw0 = 0, iw1 = 0, col0 = 0, oh0 = 0, oh1 = 0, ow0 = 0, ow1 = 0;
};
TileRulePoolChainBlock TileRulePoolChainBlockOf(const TileOp& o, const TileGrid::Rect& t,
                                                int64_t block) {
  const TileRulePoolChainSlots sl = TileRulePoolChainSlotsOf(o);
  const int64_t run = block / sl.per_run(), g = block % sl.per_run();
  // The group's slots: rows [rr0, rr1) by columns [cc0, cc1) of the run's.
  int64_t rr0 = g, rr1 = g + 1, cc0 = 0, cc1 = sl.cols;
  if (sl.group < sl.cols) {
    rr0 = g / sl.per_row(), rr1 = rr0 + 1;
    cc0 = g % sl.per_row() * sl.group, cc1 = cc0 + sl.group;
  } else {
    rr0 = g * sl.row_group, rr1 = rr0 + sl.row_group;
  }
  TileRulePoolChainBlock b;
  int64_t i = 0, col = 0;
  bool found = false;
  ForEachPlaneRun(o.conv[1], o.conv[2], t.c0, t.c1,
                  [&](int64_t c, int64_t ih, int64_t w0, int64_t w1) {
                    if (i++ == run) {
                      found = true;
                      b.c = c, b.ih = ih, b.iw0 = w0, b.iw1 = w1, b.col0 = col;
                    }
                    col += w1 - w0;
                  });
  if (!found) return b;
  const auto [oh0, oh1] = TileRuleWindowRows(o, b.ih, b.ih + 1);
  const auto [ow0, ow1] = TileRuleWindowCols(o, b.iw0, b.iw1);
  b.oh0 = oh0 + rr0, b.oh1 = std::min(oh1, oh0 + rr1);
  b.ow0 = ow0 + cc0, b.ow1 = std::min(ow1, ow0 + cc1);
  b.empty = b.oh0 >= b.oh1 || b.ow0 >= b.ow1;
  return b;
}
// A conv's weight and bias gradient tiles chain every element over (b, oh, ow) (kernels.h):
// block (k, g) continues, over the batch's row block k, the elements of the tile's output
// channel group g, groups of as many output planes as fit kTileConvGradPositions positions (at
// least one): its dout columns span a group's planes, whatever the tile's width.
constexpr int64_t kTileConvGradPositions = 784;
// A row block reads, a sample, up to max(OH OW, kTileConvGradPositions) floats of dout and (dW)
// the whole planes of the input channels its tile's columns span (or the examples). Where that
// passes 2 kTileConvGradPositions floats (the fashion CNN's first conv: 784 + its 784-float
// examples; its second: 784 + 3 x 196) the block would grow with the planes (two 512 x 512
// planes: 64 MiB), so each element's chain over (b, oh, ow) is cut, in the same order, into
// blocks of one sample's run of up to kTileCols outputs of one output row, a group being one
// output channel: block ((b OH + oh) nq + j) groups + g, nq = ceil(OW / kTileCols). A block
// reads 32 x 32 of dout (the sample's tile rows) in at most two tiles, and dW, for each (c, kh)
// pair of its tile's columns, one input row's window columns (TileRuleWindowInputCols).
bool TileRuleConvGradWide(const TileOp& o) {
  const int64_t C = o.conv[0], HW = o.conv[1] * o.conv[2], KK = o.conv[4] * o.conv[5];
  int64_t floats = std::max(TileRuleOutH(o) * TileRuleOutW(o), kTileConvGradPositions);
  if (o.kind == TileOpKind::kTileOpConvWeightGrad) {
    // The channels a tile's columns of (c, kh, kw) can span.
    floats +=
        (o.w == kTileOperandBatch ? C : std::min(C, (o.grid.tile_cols + KK - 2) / KK + 1)) * HW;
  }
  return floats > 2 * kTileConvGradPositions;
}
int64_t TileRuleConvGradGroup(const TileOp& o) {
  if (TileRuleConvGradWide(o)) return 1;
  return std::max<int64_t>(1, kTileConvGradPositions / (TileRuleOutH(o) * TileRuleOutW(o)));
}
// A wide dW block reads an input row for each (c, kh) pair of its tile's columns: 32 of them at a
// 1 x 1 kernel, 2 to 3 tiles each, so a wide dW tile's columns are cut into chunks of this many
// pairs (its elements' chains are independent: a chunk is a group as an output channel is). A
// pair reads its input row's window columns of the block's run of kTileCols outputs, 31 s + KW
// floats in up to ceil((31 s + KW - 1) / 32) + 1 tiles: 5 at a 3 x 3 kernel of stride 4, but 8 at
// stride 7, where 8 pairs would read 256 KiB. So a chunk holds fewer pairs where its pairs would
// read more than kTileConvGradPairTiles tiles (160 KiB), at least one (at a 3 x 3 kernel, 5 pairs
// at stride 7, one from stride 20; past stride 40 the run is narrower, below). Up to
// stride 4 at kernels up to 5 wide (every shape a model or test used before this rule) a chunk is
// kTileConvGradPairs pairs, as it always was.
constexpr int64_t kTileConvGradPairTiles = 40;
// Past stride ~40 (at a 3 x 3 kernel) one pair's row alone, 31 s + KW floats, lies in more than
// kTileConvGradPairTiles tiles (at stride 64, 63 tiles: 252 KiB), so a wide dW's run of outputs is
// narrower there: as many outputs as one pair's window columns fit in kTileConvGradPairTiles tiles
// ((n - 1) s + KW floats; 20 at stride 64), at least one. Otherwise, and for db, kTileCols.
int64_t TileRuleConvGradRunWidth(const TileOp& o) {
  if (o.kind != TileOpKind::kTileOpConvWeightGrad) return kTileCols;
  static_assert(kTileConvGradPairTiles == kTileConvRowsFloats / (kTileRows * kTileCols));
  return TileRuleWindowRunWidth(o.conv[6], o.conv[5]);
}
constexpr int64_t kTileConvGradPairs = 8;
int64_t TileRuleConvGradChunkPairs(const TileOp& o) {
  const int64_t span = (TileRuleConvGradRunWidth(o) - 1) * o.conv[6] + o.conv[5];
  const int64_t tiles = (span - 1 + kTileCols - 1) / kTileCols + 1;
  return std::clamp<int64_t>(kTileConvGradPairTiles / tiles, 1, kTileConvGradPairs);
}
// The pair chunks of a wide dW tile (the widest tile's, at most (tile_cols - 2) / KW + 2 pairs),
// or 1.
int64_t TileRuleConvGradPairChunks(const TileOp& o) {
  if (o.kind != TileOpKind::kTileOpConvWeightGrad || !TileRuleConvGradWide(o)) return 1;
  const int64_t KW = o.conv[5], per = TileRuleConvGradChunkPairs(o);
  const int64_t pairs = std::min(o.conv[0] * o.conv[4], (o.grid.tile_cols - 2) / KW + 2);
  return (pairs + per - 1) / per;
}
// The groups of a tile (the widest tile's output channels: a weight tile's rows, a bias tile's
// columns; a wide dW's times its pair chunks).
int64_t TileRuleConvGradGroups(const TileOp& o) {
  const int64_t oc = std::min(
      o.conv[3], o.kind == TileOpKind::kTileOpConvWeightGrad ? o.grid.tile_rows : o.grid.tile_cols);
  return (oc + TileRuleConvGradGroup(o) - 1) / TileRuleConvGradGroup(o) *
         TileRuleConvGradPairChunks(o);
}
// The output channels [oc0, oc1) of group g of tile `t` (empty past a short tile's end).
std::pair<int64_t, int64_t> TileRuleConvGradChannels(const TileOp& o, const TileGrid::Rect& t,
                                                     int64_t g) {
  const bool weight = o.kind == TileOpKind::kTileOpConvWeightGrad;
  const int64_t t0 = weight ? t.r0 : t.c0, t1 = weight ? t.r1 : t.c1;
  const int64_t oc0 =
      std::min(t1, t0 + g / TileRuleConvGradPairChunks(o) * TileRuleConvGradGroup(o));
  return {oc0, std::min(t1, oc0 + TileRuleConvGradGroup(o))};
}
// The (c, kh) pairs [q0, q1) (q = j / KW of a dW column j) of group g of dW tile `t`: all of the
// tile's, or a wide dW's chunk of them (empty past the tile's last pair).
std::pair<int64_t, int64_t> TileRuleConvGradPairs(const TileOp& o, const TileGrid::Rect& t,
                                                  int64_t g) {
  const int64_t KW = o.conv[5], first = t.c0 / KW, last = (t.c1 - 1) / KW + 1;
  const int64_t chunks = TileRuleConvGradPairChunks(o);
  if (chunks == 1) return {first, last};
  const int64_t per = TileRuleConvGradChunkPairs(o);
  const int64_t q0 = std::min(last, first + g % chunks * per);
  return {q0, std::min(last, q0 + per)};
}
// The (b, oh, ow) positions of a weight or bias gradient's block: samples [b0, b1), output rows
// [oh0, oh1), columns [ow0, ow1) (a row block's whole planes; wide, one sample's run of a row).
struct TileRuleConvGradSpan {
  int64_t b0, b1, oh0, oh1, ow0, ow1;
};
TileRuleConvGradSpan TileRuleConvGradSpanOf(const TilePlan& plan, const TileOp& o, int64_t block) {
  const int64_t rest = block / TileRuleConvGradGroups(o), OH = TileRuleOutH(o);
  const int64_t OW = TileRuleOutW(o);
  if (!TileRuleConvGradWide(o)) {
    const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), rest);
    return {b0, b1, 0, OH, 0, OW};
  }
  const int64_t rw = TileRuleConvGradRunWidth(o);
  const int64_t nq = (OW + rw - 1) / rw, j = rest % nq, oh = rest / nq % OH;
  const int64_t b = rest / nq / OH, ow0 = j * rw;
  return {b, b + 1, oh, oh + 1, ow0, std::min(OW, ow0 + rw)};
}

// Dense values of `op`'s rectangle [r0, r1) x [c0, c1), from the footprint's tiles of `op` (or
// its examples). The inputs were size-checked against the footprint first.
std::vector<float> TileRuleDense(const TilePlan& plan, const TileFootprint& fp,
                                 const TileInputs& in, int64_t op, int64_t r0, int64_t r1,
                                 int64_t c0, int64_t c1) {
  const int64_t R = r1 - r0, K = c1 - c0;
  std::vector<float> out(static_cast<size_t>(R * K), 0.0f);
  if (op == kTileOperandBatch) {
    for (size_t i = 0; i < fp.batch_rows.size(); ++i) {
      const int64_t r = fp.batch_rows[i];
      if (r < r0 || r >= r1) continue;
      std::copy(in.x[i].begin() + c0, in.x[i].begin() + c1, out.begin() + (r - r0) * K);
    }
    return out;
  }
  const TileGrid& g = plan.ops[static_cast<size_t>(op)].grid;
  for (size_t i = 0; i < fp.tiles.size(); ++i) {
    if (fp.tiles[i].op != op) continue;
    const TileGrid::Rect t = g.TileRect(fp.tiles[i].tile);
    const int64_t tw = t.c1 - t.c0;
    for (int64_t r = std::max(r0, t.r0); r < std::min(r1, t.r1); ++r) {
      for (int64_t c = std::max(c0, t.c0); c < std::min(c1, t.c1); ++c) {
        out[static_cast<size_t>((r - r0) * K + (c - c0))] =
            in.tiles[i][static_cast<size_t>((r - t.r0) * tw + (c - t.c0))];
      }
    }
  }
  return out;
}

// Calls fn(g, t0, t1) for each group g of T consecutive rows (a sequence, or a sequence's head)
// that rows [r0, r1) touch, t0..t1 being the rows' positions inside the group. The footprint and
// the recompute of a tile walk its rows the same way.
template <typename F>
void ForEachSequenceSpan(int64_t r0, int64_t r1, int64_t T, F&& fn) {
  for (int64_t g = r0 / T; g <= (r1 - 1) / T; ++g) {
    fn(g, std::max(r0, g * T) - g * T, std::min(r1, (g + 1) * T) - g * T);
  }
}

// An image layernorm's (TileRuleImageNormWidth) rows [n0, n1) of width W, in a (B, F) tensor:
// fn(b, f0, f1) for each sample b they cover, columns [f0, f1) (whole runs, contiguous in
// row-major order). The footprint and the recompute of a weight or bias gradient block walk them
// the same way.
template <typename F>
void ForEachImageNormSpan(int64_t n0, int64_t n1, int64_t W, int64_t cols, F&& fn) {
  ForEachSequenceSpan(n0 * W, n1 * W, cols, fn);
}

// TileRuleCover, naming each tile (each example) once: a narrowed image layernorm's runs can
// share a tile, and every run of a row reads the same example. (A footprint's covers of the
// batch name rows in increasing order, so the examples stay in order.)
void TileRuleCoverOnce(const TilePlan& plan, int64_t op, int64_t r0, int64_t r1, int64_t c0,
                       int64_t c1, TileFootprint& fp) {
  TileFootprint part;
  TileRuleCover(plan, op, r0, r1, c0, c1, part);
  for (const TileRef& r : part.tiles) {
    if (std::find(fp.tiles.begin(), fp.tiles.end(), r) == fp.tiles.end()) fp.tiles.push_back(r);
  }
  for (int64_t r : part.batch_rows) {
    if (std::find(fp.batch_rows.begin(), fp.batch_rows.end(), r) == fp.batch_rows.end()) {
      fp.batch_rows.push_back(r);
    }
  }
  fp.batch_chunks.insert(fp.batch_chunks.end(), part.batch_chunks.begin(), part.batch_chunks.end());
}

// A layernorm's rows [n0, n1) (the tensor's rows, or an image's runs n = (sample, run) of W):
// fn(row, f) for each, its tensor row and the tensor column its run starts at. The footprint and
// the recompute of a narrowed weight or bias gradient block walk them the same way.
template <typename F>
void ForEachNormRow(const TilePlan& plan, const TileOp& o, int64_t n0, int64_t n1, F&& fn) {
  const int64_t W = TileRuleImageNormWidth(o), cols = TileRuleCols(plan, o.x);
  for (int64_t n = n0; n < n1; ++n) {
    if (W == 0) {
      fn(n, int64_t{0});
    } else {
      fn(n * W / cols, n * W % cols);
    }
  }
}

// The columns [c0, c1) of a qkv-shaped (3C wide) tensor cut by part (0 q, 1 k, 2 v) and head:
// fn(part, h, i0, i1) for each piece, i the column inside the head.
template <typename F>
void ForEachHeadSegment(int64_t c0, int64_t c1, int64_t C, int64_t hs, F&& fn) {
  for (int64_t c = c0; c < c1;) {
    const int64_t part = c / C, h = (c % C) / hs;
    const int64_t end = std::min(c1, part * C + (h + 1) * hs);
    fn(part, h, c - part * C - h * hs, end - part * C - h * hs);
    c = end;
  }
}

std::vector<int64_t> TileRuleBackwardSumGroups(const TileOp& o, const TileGrid::Rect& t) {
  const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
  std::vector<int64_t> groups;
  ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t, int64_t) {
    ForEachHeadSegment(t.c0, t.c1, C, hs, [&](int64_t part, int64_t h, int64_t, int64_t) {
      const int64_t gr = b * NH + h;
      if (part < 2 && std::find(groups.begin(), groups.end(), gr) == groups.end()) {
        groups.push_back(gr);
      }
    });
  });
  return groups;
}

int64_t TileRuleBackwardDots(const TileOp& o, const TileGrid::Rect& t, int64_t ob) {
  const int64_t T = o.conv[0], C = o.conv[2], hs = C / o.conv[1], nb = TileRuleAttentionBlocks(o);
  const auto span = [&](int64_t blk) {
    const int64_t p0 = blk * kTileAttentionBlock;
    return std::min(T, p0 + kTileAttentionBlock) - p0;
  };
  if (ob < nb * nb) {
    return static_cast<int64_t>(TileRuleBackwardSumGroups(o, t).size()) * span(ob / nb) *
           span(ob % nb);
  }
  const int64_t nk = span(ob - nb * nb);
  int64_t dots = 0;
  ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t, int64_t p0, int64_t p1) {
    ForEachHeadSegment(t.c0, t.c1, C, hs, [&](int64_t part, int64_t, int64_t, int64_t) {
      if (part < 2) dots += (p1 - p0) * nk;  // q's rows x the block's keys, or k's transposed
    });
  });
  return dots;
}

// The key positions [k0, k1) block `block` of a narrowed att tile reads (TileRuleAttentionBlocks):
// a max or sum block's positions, or (the output block, 2 nb) the tile's own columns.
std::pair<int64_t, int64_t> TileRuleAttentionKeys(const TileOp& o, const TileGrid::Rect& t,
                                                  int64_t block) {
  const int64_t nb = TileRuleAttentionBlocks(o);
  if (block == 2 * nb) return {t.c0, t.c1};
  const int64_t k0 = (block % nb) * kTileAttentionBlock;
  return {k0, std::min(o.conv[0], k0 + kTileAttentionBlock)};
}

// Calls fn(gr, b, h, q0, t1, k0, kend) for each (b, h) group of a narrowed att tile's rows that
// block `block` reads keys for: the rows q0..t1 that reach the block's keys k0.. (row t reads
// keys t2 <= t), and the keys k0..kend below the group's last row. The footprint and the
// recompute walk a block the same way.
template <typename F>
void ForEachAttentionBlockSpan(const TileOp& o, const TileGrid::Rect& t, int64_t block, F&& fn) {
  const int64_t T = o.conv[0], NH = o.conv[1];
  const auto [k0, k1] = TileRuleAttentionKeys(o, t, block);
  ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t gr, int64_t t0, int64_t t1) {
    const int64_t q0 = std::max(t0, k0);
    if (q0 >= t1) return;  // every row's keys end before the block: it changes nothing
    fn(gr, gr / NH, gr % NH, q0, t1, k0, std::min(k1, t1));
  });
}

// Block `block` of a narrowed att tile `t`, continued from `in.partial` (TileRuleAttentionBlocks):
// the reference kernel's row max (pre[0] first, then pre[t2] > m ? pre[t2] : m), then its sum
// (sum + Exp(pre - m) from 0), then the tile's columns (Exp(pre - m) * (1 / sum); 0 past the
// diagonal), with pre = (the fma chain over i of q[t, i] k[t2, i] from 0) * (1 / sqrt(hs)). A
// wide head's block of positions pb is nh blocks of the head's columns: the dots continue over
// each (the partial after all but the last: the statistics, then the R x keys dots), and the last
// applies the block's step.
std::vector<float> TileRuleAttentionBlock(const TilePlan& plan, const TileFootprint& fp,
                                          const TileInputs& in, const TileOp& o,
                                          const TileGrid::Rect& t, int64_t block) {
  internal::FpEnvGuard fp_guard;
  const int64_t T = o.conv[0], C = o.conv[2], hs = C / o.conv[1];
  const int64_t nb = TileRuleAttentionBlocks(o), R = t.r1 - t.r0, K = t.c1 - t.c0;
  const int64_t nh = TileRuleAttentionHeadBlocks(o), pb = block / nh, ib = block % nh;
  const auto [i0, i1] = TileRuleAttentionHeadCols(o, ib);
  const auto [b0, b1] = TileRuleAttentionKeys(o, t, pb);
  const int64_t nk = b1 - b0, ns = pb < nb ? R : 2 * R;
  const bool last = ib + 1 == nh;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  const auto at = [](int64_t i) { return static_cast<size_t>(i); };
  // The maxima (R), then the maxima and sums (2 R); a wide head's dots of the rows and keys.
  std::vector<float> acc(at(ns), 0.0f), dots(at(R * nk), 0.0f);
  const size_t stats = std::min(at(ns), in.partial.size());
  std::copy(in.partial.begin(), in.partial.begin() + static_cast<std::ptrdiff_t>(stats),
            acc.begin());
  if (ib > 0) {
    std::copy(in.partial.begin() + static_cast<std::ptrdiff_t>(stats), in.partial.end(),
              dots.begin());
  }
  std::vector<float> out(at(pb == 2 * nb && last ? R * K : 0), 0.0f);
  ForEachAttentionBlockSpan(
      o, t, pb,
      [&](int64_t gr, int64_t b, int64_t h, int64_t q0, int64_t t1, int64_t k0, int64_t kend) {
        const int64_t ni = i1 - i0;
        const std::vector<float> q =
            TileRuleDense(plan, fp, in, o.x, b * T + q0, b * T + t1, h * hs + i0, h * hs + i1);
        const std::vector<float> k = TileRuleDense(plan, fp, in, o.x, b * T + k0, b * T + kend,
                                                   C + h * hs + i0, C + h * hs + i1);
        for (int64_t tt = q0; tt < t1; ++tt) {
          const int64_t r = gr * T + tt - t.r0, end = std::min(kend, tt + 1);
          for (int64_t t2 = k0; t2 < end; ++t2) {
            float& dot = dots[at(r * nk + t2 - b0)];
            for (int64_t i = 0; i < ni; ++i) {
              dot = __builtin_fmaf(q[at((tt - q0) * ni + i)], k[at((t2 - k0) * ni + i)], dot);
            }
          }
          if (!last) continue;
          const auto pre = [&](int64_t t2) { return dots[at(r * nk + t2 - b0)] * scale; };
          if (pb < nb) {
            float m = pb == 0 ? pre(0) : acc[at(r)];
            for (int64_t t2 = pb == 0 ? 1 : k0; t2 < end; ++t2) {
              const float p = pre(t2);
              m = p > m ? p : m;
            }
            acc[at(r)] = m;
          } else if (pb < 2 * nb) {
            float sum = acc[at(R + r)];
            for (int64_t t2 = k0; t2 < end; ++t2) sum = sum + Exp(pre(t2) - acc[at(r)]);
            acc[at(R + r)] = sum;
          } else {
            const float inv = 1.0f / acc[at(R + r)];
            for (int64_t t2 = k0; t2 < end; ++t2) {
              out[at(r * K + t2 - t.c0)] = Exp(pre(t2) - acc[at(r)]) * inv;
            }
          }
        }
      });
  if (!last) {
    acc.insert(acc.end(), dots.begin(), dots.end());
    return acc;
  }
  return pb < 2 * nb ? acc : out;
}

// One gradient's share of "grad_norm.blocks": its operator, the index of its first block partial
// and how many it has (one per kSumBlock elements, the last cut short).
struct TileRuleSquareRange {
  int64_t grad = 0, first = 0, count = 0;
};
std::vector<TileRuleSquareRange> TileRuleSquareRanges(const TilePlan& plan, const TileOp& o) {
  std::vector<TileRuleSquareRange> ranges;
  int64_t first = 0;
  for (int64_t g : o.sources) {
    const int64_t n = plan.ops[static_cast<size_t>(g)].grid.size();
    ranges.push_back({g, first, (n + kSumBlock - 1) / kSumBlock});
    first += ranges.back().count;
  }
  return ranges;
}

// The gradient elements block partial `e` of "grad_norm.blocks" sums the squares of: elements
// [e0, e1) of gradient operator `grad` (flat, row-major), whose grid has `cols` columns. False
// when e is past the last partial.
struct TileRuleSquareBlock {
  int64_t grad = 0, e0 = 0, e1 = 0, cols = 1;
};
bool TileRuleSquareBlockOf(const TilePlan& plan, const TileOp& o, int64_t e,
                           TileRuleSquareBlock* out) {
  for (const TileRuleSquareRange& r : TileRuleSquareRanges(plan, o)) {
    if (e < r.first || e >= r.first + r.count) continue;
    const TileGrid& g = plan.ops[static_cast<size_t>(r.grad)].grid;
    out->grad = r.grad;
    out->e0 = (e - r.first) * kSumBlock;
    out->e1 = std::min(g.size(), out->e0 + kSumBlock);
    out->cols = g.cols;
    return true;
  }
  return false;
}

// The global norm (kTileOpGradNorm) adds each parameter's tree of block partials to the total in
// turn (optim.cc's SumGradSquares), one parameter a block: the block reads all its partials, 4
// bytes a kSumBlock gradient elements (196 KiB for GPT-2 medium's wte, 307 KiB for XL's). Above
// kTileNormChunk partials a parameter spans one block per chunk of kTileNormChunk partials
// instead (32 KiB, in at most 9 tiles of grad_norm.blocks). The split is exact because
// CombinePartialsTree (kernels_internal.h) adds level by level in pairs from the left: node j
// of level L is the tree of partials [j 2^L, (j + 1) 2^L) (the last one cut short, which is
// that shorter run's own tree), so with a chunk of 2^L partials the parameter's tree is the tree
// over its chunks' trees, bit for bit. A chunk block's partial carries the total before the
// parameter and the roots of the chunks before it; the parameter's last chunk combines the roots
// and adds them to the total. A parameter of up to kTileNormChunk partials (8M elements: every
// parameter of the 10M GPT) is one block, as it always was.
constexpr int64_t kTileNormChunk = 8192;
static_assert((kTileNormChunk & (kTileNormChunk - 1)) == 0,
              "a chunk must be a whole subtree of the pairwise tree: a power of two");

// One block of the global norm's chain: partials [first, first + count) of grad_norm.blocks,
// chunk `chunk` of its parameter's `chunks`.
struct TileRuleNormBlock {
  int64_t first = 0, count = 0, chunk = 0, chunks = 1;
};
std::vector<TileRuleNormBlock> TileRuleNormBlocks(const TilePlan& plan, const TileOp& o) {
  std::vector<TileRuleNormBlock> blocks;
  for (const TileRuleSquareRange& r : TileRuleSquareRanges(plan, o)) {
    const int64_t chunks = std::max<int64_t>(1, (r.count + kTileNormChunk - 1) / kTileNormChunk);
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t p0 = k * kTileNormChunk, p1 = std::min(r.count, p0 + kTileNormChunk);
      blocks.push_back({r.first + p0, p1 - p0, k, chunks});
    }
  }
  return blocks;
}

int64_t TileRuleNormChunk(const TilePlan& plan, const TileOp& o, int64_t block) {
  const std::vector<TileRuleNormBlock> blocks = TileRuleNormBlocks(plan, o);
  return blocks.empty() ? -1 : blocks.at(static_cast<size_t>(block)).chunk;
}

// The plan of a whole step (stage == nullptr: PlanStepTiles) or of one pipeline stage's step
// (PlanStageStepTiles: the part `*stage` of a GPT or a sequential model).
Result<TilePlan> TileRulePlan(const ModelSpec& model, const OptimizerSpec& optimizer, int64_t batch,
                              int64_t seq_len, int64_t micro_batches, const ModelPart* stage) {
  if (model.kind != "sequential" && model.kind != "gpt") {
    return FailedPrecondition("tile rule: a '" + model.kind + "' model is not covered");
  }
  if (optimizer.kind != "adamw" && optimizer.kind != "sgd") {
    return InvalidArgument("tile rule: unknown optimizer kind '" + optimizer.kind + "'");
  }
  if (batch < 1)
    return InvalidArgument("tile rule: batch must be >= 1, got " + std::to_string(batch));
  if (micro_batches < 1 || batch % micro_batches != 0) {
    return InvalidArgument("tile rule: micro_batches (" + std::to_string(micro_batches) +
                           ") must be >= 1 and divide the batch size (" + std::to_string(batch) +
                           "); fix train.micro_batches");
  }
  // A step in M micro-batches (pipeline.h): each micro-batch's forward and backward over its
  // rows samples, named "mb<m>." (op_trace.h), then the norm and the update once.
  const int64_t M = micro_batches, rows = batch / M;
  // From the spec's shapes alone: nothing is allocated, so the ledger plans a model of any size.
  // A stage plans its own parameters (PlanParams of its part: what the stage holds, in its order).
  Result<std::vector<PlannedParam>> shapes =
      PlanParams(model, stage != nullptr ? *stage : ModelPart{});
  if (!shapes.ok()) return InvalidArgument("tile rule: " + shapes.status().message());
  const std::vector<PlannedParam>& params = *shapes;
  Result<int64_t> outputs = ModelOutputs(model);
  if (!outputs.ok()) return InvalidArgument("tile rule: " + outputs.status().message());
  TilePlan plan;
  plan.batch = batch;
  plan.micro_batches = M;
  plan.input_size = model.kind == "gpt" ? 0 : NumElements(model.input);
  plan.classes = *outputs;
  plan.optimizer = optimizer;
  // Op name -> index. A micro-batch's operators are found by their unprefixed names: the
  // current micro-batch's (the last one's after the loop: the gradients the update reads).
  std::map<std::string, int64_t> index;
  std::string prefix;        // "mb<m>." while planning micro-batch m of M > 1
  int64_t batch_offset = 0;  // the micro-batch's first row of the step's batch (activation rows)
  auto add = [&](TileOp op) {
    index[op.name] = static_cast<int64_t>(plan.ops.size());
    op.name = prefix + op.name;
    op.batch_offset = batch_offset;
    plan.ops.push_back(std::move(op));
    return static_cast<int64_t>(plan.ops.size()) - 1;
  };
  auto state_op = [&](const std::string& name) {
    auto it = index.find("in." + name);
    return it == index.end() ? int64_t{-1} : it->second;
  };
  auto begin_micro_batch = [&](int64_t mb) {
    prefix = M > 1 ? "mb" + std::to_string(mb) + "." : "";
    batch_offset = mb * (plan.batch / M);
  };
  auto end_micro_batches = [&] {
    prefix.clear();
    batch_offset = 0;
  };
  // The input state, in StateHash order (step_replay.cc records it so).
  std::vector<std::string> param_names;
  for (const PlannedParam& p : params) {
    add({"in." + p.name, TileOpKind::kTileOpState, TileGrid::ForShape(p.shape), p.shape});
    param_names.push_back(p.name);
  }
  for (const Optimizer::StateSlot& s : Optimizer::StateSlots(optimizer, param_names)) {
    const Shape& shape = params[s.param].shape;
    add({"in." + s.name, TileOpKind::kTileOpState, TileGrid::ForShape(shape), shape});
  }
  // A tensor a stage received from a neighbour (pipeline.h): an input of its step, like the
  // state, named "recv.<what>" (Stage records it so).
  auto received = [&](const std::string& what, Shape shape) {
    TileOp op{"recv." + what, TileOpKind::kTileOpState, TileGrid::ForShape(shape), shape};
    op.received = true;
    return add(std::move(op));
  };
  const bool staged = stage != nullptr;
  const bool first_stage = !staged || stage->begin == 0;
  const bool last_stage = !staged || stage->end == CutLayerCount(model);
  // The update (StepOnBatch records every parameter after it), the same for every model; a
  // clipped one after the global norm's two operators (step_replay.cc records them so).
  const bool adam = optimizer.kind == "adamw";
  auto add_updates = [&] {
    int64_t norm = -1;
    if (optimizer.grad_clip > 0) {
      // A stage chains the running sum of squares from the one stage s-1 sent (none for stage
      // 0) and sends it on without the square root; every stage takes the norm from the total
      // (the last stage's own sum, the one it sent the others).
      const int64_t running = staged && !first_stage ? received("grad_squares", {1}) : -1;
      std::vector<int64_t> grads;
      int64_t partials = 0;
      for (const PlannedParam& p : params) {
        grads.push_back(index[p.name + ".grad"]);
        partials += (NumElements(p.shape) + kSumBlock - 1) / kSumBlock;
      }
      TileOp blocks{"grad_norm.blocks",
                    TileOpKind::kTileOpGradSquareBlocks,
                    TileGrid::For(1, partials),
                    {partials}};
      blocks.sources = grads;
      TileOp n{staged ? "grad_squares" : "grad_norm",
               TileOpKind::kTileOpGradNorm,
               TileGrid::For(1, 1),
               {1}};
      n.x = add(std::move(blocks));
      n.v = running;
      n.squares = staged;
      n.sources = std::move(grads);
      norm = add(std::move(n));
      if (staged && !last_stage) norm = received("grad_total", {1});
    }
    std::map<std::string, TileOp> updates;  // parameter name -> its update
    for (const PlannedParam& p : params) {
      TileOp up{p.name, adam ? TileOpKind::kTileOpAdamW : TileOpKind::kTileOpSgd,
                TileGrid::ForShape(p.shape), p.shape};
      up.x = state_op(p.name);
      up.w = index[p.name + ".grad"];
      up.b = state_op(adam ? "optim.m." + p.name : "optim.momentum." + p.name);
      up.v = adam ? state_op("optim.v." + p.name) : -1;
      up.clip_norm = norm;
      up.squares = staged && norm >= 0;
      updates[p.name] = up;
      add(std::move(up));
    }
    // Then the optimizer state the update leaves behind, in Optimizer::State() order
    // (step_replay.cc records it so): the same update, its other outputs.
    for (const PlannedParam& p : params) {
      const std::string m_name = (adam ? "optim.m." : "optim.momentum.") + p.name;
      if (state_op(m_name) < 0) continue;  // SGD without momentum keeps no state
      TileOp moment = updates.at(p.name);
      moment.name = m_name;
      moment.update_output = TileUpdateOutput::kTileUpdateFirstMoment;
      add(std::move(moment));
    }
    if (adam) {
      for (const PlannedParam& p : params) {
        TileOp moment = updates.at(p.name);
        moment.name = "optim.v." + p.name;
        moment.update_output = TileUpdateOutput::kTileUpdateSecondMoment;
        add(std::move(moment));
      }
    }
  };
  if (model.kind == "gpt") {
    // model.cc's GptModel: Forward, Backward, then the gradients, in its trace order. Every
    // operator has a footprint (a parameter the plan does not know would stay opaque).
    const GptSpec& g = model.gpt;
    const int64_t T = SeqLenOrBlockSize(model, seq_len);
    const int64_t N = rows * T, C = g.n_embd, V = g.vocab_size;
    // A stage holds blocks [begin, end): the embeddings only with block 0, ln_f and the head only
    // with the last block; the head of a later stage reads its received copy of wte.
    const int64_t begin = staged ? stage->begin : 0, end = staged ? stage->end : g.n_layer;
    const int64_t emb = first_stage ? 2 : 0;  // parameters before the first block's
    const Shape wte_shape{V, C};
    const std::string wte_name = "transformer.wte.weight";
    const int64_t wte_op =
        first_stage ? state_op(wte_name) : (last_stage ? received("tied_weight", wte_shape) : -1);
    // The head's wte gradient accumulates in its own buffer in a step of micro-batches and in a
    // pipeline's last stage (pipeline.h, step 3), and is added to wte's once, after them.
    const bool head_buffer = M > 1 || staged;
    plan.batch = batch * T;
    plan.tokens = true;
    plan.seq_len = T;
    auto linear = [&](const std::string& name, int64_t x, int64_t out, int64_t param) {
      TileOp op{name, TileOpKind::kTileOpLinear, TileGrid::For(N, out), {N, out}};
      op.x = x;
      op.w = state_op(params[static_cast<size_t>(param)].name);
      op.b = param + 1 < static_cast<int64_t>(params.size()) &&
                     params[static_cast<size_t>(param + 1)].shape.size() == 1 &&
                     params[static_cast<size_t>(param + 1)].name.ends_with(".bias")
                 ? state_op(params[static_cast<size_t>(param + 1)].name)
                 : -1;
      return add(std::move(op));
    };
    constexpr char kNoFootprint[] = "no footprint yet for this GPT operator";
    auto layernorm = [&](const std::string& name, int64_t x, int64_t param) {
      TileOp op{name, TileOpKind::kTileOpLayerNorm, TileGrid::For(N, C), {N, C}};
      op.x = x;
      op.w = state_op(params[static_cast<size_t>(param)].name);
      op.b = state_op(params[static_cast<size_t>(param + 1)].name);
      CHECK(op.w >= 0 && op.b >= 0) << name;
      return add(std::move(op));
    };
    auto residual = [&](const std::string& name, int64_t a, int64_t b) {
      TileOp op{name, TileOpKind::kTileOpResidual, TileGrid::For(N, C), {N, C}};
      op.x = a;
      op.w = b;
      return add(std::move(op));
    };
    for (int64_t mb = 0; mb < M; ++mb) {
      begin_micro_batch(mb);
      // encoded = wte[token] + wpe[position] (EmbeddingForward twice, ResidualForward).
      // A later stage starts from the activations stage s-1 sent.
      int64_t resid = -1;
      if (first_stage) {
        TileOp enc{"encoded", TileOpKind::kTileOpEmbedding, TileGrid::For(N, C), {N, C}};
        enc.x = state_op(params[0].name);
        enc.w = state_op(params[1].name);
        enc.conv = {T};
        resid = add(std::move(enc));
      } else {
        resid = received("activation", {N, C});
      }
      for (int64_t l = begin; l < end; ++l) {
        const std::string p = "h." + std::to_string(l) + ".";
        const int64_t base = emb + 12 * (l - begin);  // the layer's 12 parameters (P(l, k))
        const int64_t ln1 = layernorm(p + "ln1", resid, base);
        const int64_t qkv = linear(p + "qkv", ln1, 3 * C, base + 2);
        const int64_t NHT = rows * g.n_head * T;
        TileOp att{p + "att", TileOpKind::kTileOpAttention, TileGrid::For(NHT, T), {NHT, T}};
        att.x = qkv;
        att.conv = {T, g.n_head, C};
        TileOp y{p + "atty", TileOpKind::kTileOpAttentionOut, TileGrid::For(N, C), {N, C}};
        y.x = add(std::move(att));
        y.w = qkv;
        y.conv = {T, g.n_head, C};
        const int64_t atty = add(std::move(y));
        const int64_t attproj = linear(p + "attproj", atty, C, base + 4);
        const int64_t r2 = residual(p + "residual2", resid, attproj);
        const int64_t ln2 = layernorm(p + "ln2", r2, base + 6);
        const int64_t fch = linear(p + "fch", ln2, 4 * C, base + 8);
        TileOp gelu{p + "fch_gelu", TileOpKind::kTileOpGelu, TileGrid::For(N, 4 * C), {N, 4 * C}};
        gelu.x = fch;
        const int64_t fcproj = linear(p + "fcproj", add(std::move(gelu)), C, base + 10);
        resid = residual(p + "residual3", r2, fcproj);
      }
      // The residual gradient entering each layer (the top one's: ln_f's backward, or what stage
      // s+1 sent); each layer's traced gradients.
      const size_t L = static_cast<size_t>(g.n_layer);
      std::vector<int64_t> dres_in(L + 1, -1), dres2(L, -1), dfch(L, -1), dqkv(L, -1), dln1(L, -1),
          dln2(L, -1);
      int64_t lnf = -1, dlogits = -1, dlnf_op = -1;
      // ln_f's weight: the part's last two parameters (none before the last stage).
      const int64_t lnf_w = last_stage ? static_cast<int64_t>(params.size()) - 2 : -1;
      if (last_stage) {
        lnf = layernorm("ln_f", resid, lnf_w);
        // The tied head: ln_f @ wte^T, no bias.
        const int64_t logits = linear("logits", lnf, V, 0);
        plan.ops[static_cast<size_t>(logits)].w = wte_op;
        plan.ops[static_cast<size_t>(logits)].b = -1;
        // The token loss and its gradient: the logits rows and their target tokens (rows are
        // independent, as a classifier's are).
        TileOp loss{"loss", TileOpKind::kTileOpLoss, TileGrid::For(N, 1), {N, 1}};
        loss.x = logits;
        add(std::move(loss));
        TileOp lgrad{"logits.grad", TileOpKind::kTileOpLossGrad, TileGrid::For(N, V), {N, V}};
        lgrad.x = logits;
        dlogits = add(std::move(lgrad));
        // The head's input gradient: dlogits @ wte (kernels.h's dinp chain over the V logits).
        TileOp dlnf{"ln_f.grad", TileOpKind::kTileOpLinearInputGrad, TileGrid::For(N, C), {N, C}};
        dlnf.x = dlogits;
        dlnf.w = wte_op;
        dlnf_op = add(std::move(dlnf));
      }
      auto ln_input_grad = [&](const std::string& name, int64_t dout, int64_t ln, int64_t weight,
                               int64_t into) {
        TileOp op{name, TileOpKind::kTileOpLayerNormInputGrad, TileGrid::For(N, C), {N, C}};
        op.x = dout;
        op.w = plan.ops[static_cast<size_t>(ln)].x;  // the layernorm's input
        op.b = state_op(params[static_cast<size_t>(weight)].name);
        op.v = into;
        return add(std::move(op));
      };
      auto input_grad = [&](const std::string& name, int64_t cols, int64_t dout, int64_t weight) {
        TileOp op{name, TileOpKind::kTileOpLinearInputGrad, TileGrid::For(N, cols), {N, cols}};
        op.x = dout;
        op.w = state_op(params[static_cast<size_t>(weight)].name);
        return add(std::move(op));
      };
      const size_t top = static_cast<size_t>(end);
      dres_in[top] = last_stage ? ln_input_grad("residual.grad", dlnf_op, lnf, lnf_w, -1)
                                : received("activation_grad", {N, C});
      // Each layer as BackwardPart runs it (kernels on zeroed buffers): the down projection's dX,
      // the gelu's, the up projection's dX, ln2's backward added into the residual gradient
      // (ResidualBackward's 0 + the gradient entering the layer), the attention projection's dX
      // (from dattproj = 0 + residual3.grad), the attention backward, qkv's dX, and ln1's
      // backward added into 0 + residual3.grad.
      for (int64_t l = end; l-- > begin;) {
        const std::string p = "h." + std::to_string(l) + ".";
        const size_t ls = static_cast<size_t>(l);
        const int64_t base = emb + 12 * (l - begin);
        const int64_t dfch_gelu =
            input_grad(p + "fch_gelu.grad", 4 * C, dres_in[ls + 1], base + 10);
        TileOp gelu{
            p + "fch.grad", TileOpKind::kTileOpGeluInputGrad, TileGrid::For(N, 4 * C), {N, 4 * C}};
        gelu.x = dfch_gelu;
        gelu.w = index.at(p + "fch");
        dfch[ls] = add(std::move(gelu));
        dln2[ls] = input_grad(p + "ln2.grad", C, dfch[ls], base + 8);
        dres2[ls] = ln_input_grad(p + "residual3.grad", dln2[ls], index.at(p + "ln2"), base + 6,
                                  dres_in[ls + 1]);
        const int64_t datty = input_grad(p + "atty.grad", C, dres2[ls], base + 4);
        TileOp attb{p + "qkv.grad",
                    TileOpKind::kTileOpAttentionBackward,
                    TileGrid::For(N, 3 * C),
                    {N, 3 * C}};
        attb.x = datty;
        attb.w = index.at(p + "qkv");
        attb.b = index.at(p + "att");
        attb.conv = {T, g.n_head, C};
        dqkv[ls] = add(std::move(attb));
        dln1[ls] = input_grad(p + "ln1.grad", C, dqkv[ls], base + 2);
        dres_in[ls] =
            ln_input_grad(p + "residual.grad", dln1[ls], index.at(p + "ln1"), base, dres2[ls]);
      }
      // The parameter gradients. A block's four linears (model.cc's GptModel::BackwardPart):
      // LinearBackward's dweight and dbias on zeroed gradients, from the traced gradient of the
      // linear's output and its traced input. Their output gradients are traced as:
      //   qkv      dqkv, "qkv.grad";
      //   attproj  dattproj = 0 + dresidual2 (ResidualBackward on a zeroed buffer, after ln2's
      //            backward has added into dresidual2), "residual3.grad";
      //   fch      dfch, "fch.grad";
      //   fcproj   dfcproj = 0 + the residual gradient entering the layer (the next layer's
      //            "residual.grad", the top one's for the last layer).
      // 0 + d differs from d only for d = -0, which no chain (from +0) can tell from +0.
      auto fwd = [&](const std::string& name) {
        auto it = index.find(name);
        CHECK(it != index.end()) << name;
        return it->second;
      };
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const PlannedParam& param = params[pi];
        const TileGrid grid = TileGrid::ForShape(param.shape);
        TileOp op{param.name + ".grad", TileOpKind::kTileOpOpaque, grid, param.shape};
        op.opaque = kNoFootprint;
        const int64_t k = static_cast<int64_t>(pi) - emb;
        if (first_stage && pi < 2) {
          // wte (pi 0): the tied head's dW (LinearBackward on the zeroed gradient: its chain over
          // the rows, then 0 + the sum), then EmbeddingBackward's row sums by token added to it;
          // wpe (pi 1): EmbeddingBackward's row sums by position on its zeroed gradient. Both
          // read the residual gradient entering the first layer.
          op.kind = TileOpKind::kTileOpEmbeddingGrad;
          op.x = dres_in[0];
          op.conv = {T, pi == 0 ? 1 : 0};
          if (pi == 0 && !head_buffer) {
            op.b = dlogits;
            op.v = lnf;
          }
          op.opaque.clear();
        } else if (last_stage &&
                   static_cast<int64_t>(pi) >= lnf_w) {  // ln_f's: chains over the rows
          op.kind = static_cast<int64_t>(pi) == lnf_w ? TileOpKind::kTileOpLayerNormWeightGrad
                                                      : TileOpKind::kTileOpLayerNormBiasGrad;
          op.x = dlnf_op;
          op.w = static_cast<int64_t>(pi) == lnf_w ? resid : -1;
          op.opaque.clear();
        } else if (k >= 0 && k < 12 * (end - begin)) {
          const int64_t l = begin + k / 12, slot = k % 12;
          const size_t ls = static_cast<size_t>(l);
          const std::string p = "h." + std::to_string(l) + ".";
          int64_t dout = -1, in = -1;
          if (slot == 0 || slot == 1)
            dout = dln1[ls], in = plan.ops[static_cast<size_t>(fwd(p + "ln1"))].x;
          if (slot == 6 || slot == 7) dout = dln2[ls], in = fwd(p + "residual2");
          if (slot == 2 || slot == 3) dout = dqkv[ls], in = fwd(p + "ln1");
          if (slot == 4 || slot == 5) dout = dres2[ls], in = fwd(p + "atty");
          if (slot == 8 || slot == 9) dout = dfch[ls], in = fwd(p + "ln2");
          if (slot == 10 || slot == 11) dout = dres_in[ls + 1], in = fwd(p + "fch_gelu");
          if (dout >= 0) {
            const bool weight = slot % 2 == 0;
            const bool ln = slot == 0 || slot == 1 || slot == 6 || slot == 7;
            op.kind = ln ? (weight ? TileOpKind::kTileOpLayerNormWeightGrad
                                   : TileOpKind::kTileOpLayerNormBiasGrad)
                         : (weight ? TileOpKind::kTileOpLinearWeightGrad
                                   : TileOpKind::kTileOpLinearBiasGrad);
            op.x = dout;
            op.w = weight ? in : -1;
            op.opaque.clear();
          }
        }
        // Micro-batch m > 0 adds into micro-batch m-1's accumulated gradient.
        if (mb > 0 && op.kind != TileOpKind::kTileOpOpaque) op.v = index.at(param.name + ".grad");
        add(std::move(op));
      }
      if (head_buffer && last_stage) {
        // The tied head's wte gradient, in its own buffer (pipeline.h, step 3): LinearBackward's
        // dweight of the micro-batch added into the previous micro-batch's.
        TileOp head{wte_name + ".head.grad", TileOpKind::kTileOpLinearWeightGrad,
                    TileGrid::ForShape(wte_shape), wte_shape};
        head.x = dlogits;
        head.w = lnf;
        if (mb > 0) head.v = index.at(wte_name + ".head.grad");
        add(std::move(head));
      }
    }
    end_micro_batches();
    if (head_buffer && first_stage) {
      // AddTiedHeadGrad: wte.grad[i] = wte.grad[i] + head_grad[i], elementwise; the head's
      // gradient as the last stage sent it (its own in a one-stage pipeline).
      const int64_t head =
          last_stage ? index.at(wte_name + ".head.grad") : received("tied_head_grad", wte_shape);
      TileOp sum{wte_name + ".grad", TileOpKind::kTileOpResidual, TileGrid::ForShape(wte_shape),
                 wte_shape};
      sum.x = index.at(wte_name + ".grad");
      sum.w = head;
      add(std::move(sum));
    }
    add_updates();
    return plan;
  }
  // Forward (model.cc's sequential Forward), with the layers' output shapes (per sample) computed
  // as Model::Create does; every layer kind the engine builds has a footprint. A stage plans its
  // layers [begin, end) under the whole model's layer indices (its operators' names and dropout
  // streams are the model's, model.cc's ForwardPart), walking the layers before it for their
  // shapes: a later stage's first layer reads the activations stage s-1 sent, and an earlier
  // stage's backward starts from the gradient stage s+1 sent (Stage records both so).
  const size_t begin = staged ? static_cast<size_t>(stage->begin) : 0;
  const size_t end = staged ? static_cast<size_t>(stage->end) : model.layers.size();
  struct Linear {
    int64_t in_op, dout_op = -1, C, OC;
    bool bias;
  };
  for (int64_t mb = 0; mb < M; ++mb) {
    begin_micro_batch(mb);
    std::vector<int64_t> in_op(model.layers.size());  // the activation each layer reads
    std::vector<int64_t> in_features(model.layers.size());
    std::map<size_t, Linear> linears;
    std::map<size_t, int64_t> windowed;    // a conv or pool layer's forward operator
    std::map<size_t, int64_t> conv_dout;   // a conv layer's output gradient
    std::map<size_t, int64_t> norm_dout;   // a planned layernorm layer's output gradient
    std::map<size_t, int64_t> norm_width;  // its rows' width W over an image (0: each sample's)
    int64_t act = kTileOperandBatch;
    Shape cur = model.input;  // one sample's shape
    for (size_t i = 0; i < end; ++i) {
      const LayerSpec& l = model.layers[i];
      const std::string name = "layers." + std::to_string(i);
      const int64_t features = NumElements(cur);
      const bool held = i >= begin;  // a layer of the stage (every layer of a whole step)
      if (i == begin && !first_stage) act = received("activation", {rows, features});
      in_op[i] = act;
      in_features[i] = features;
      if (l.kind == "flatten") {
        cur = {features};
        continue;
      }
      TileOp op{name + ".out", TileOpKind::kTileOpOpaque, {}, {}};
      op.x = act;
      if (l.kind == "linear") {
        op.kind = TileOpKind::kTileOpLinear;
        op.w = state_op(name + ".weight");
        op.b = l.bias ? state_op(name + ".bias") : -1;
        CHECK(!held || op.w >= 0) << name;
        linears[i] = Linear{act, -1, features, l.out, l.bias};
        cur = {l.out};
      } else if (l.kind == "relu") {
        op.kind = TileOpKind::kTileOpRelu;
      } else if (l.kind == "gelu") {
        op.kind = TileOpKind::kTileOpGelu;
      } else if (l.kind == "conv2d" && cur.size() == 3) {
        const int64_t s = l.stride > 0 ? l.stride : 1;
        op.kind = TileOpKind::kTileOpConv;
        op.conv = {cur[0], cur[1], cur[2], l.out, l.kernel, l.kernel, s, l.pad};
        op.w = state_op(name + ".weight");
        op.b = l.bias ? state_op(name + ".bias") : -1;
        CHECK(!held || op.w >= 0) << name;
        cur = {l.out, (cur[1] + 2 * l.pad - l.kernel) / s + 1,
               (cur[2] + 2 * l.pad - l.kernel) / s + 1};
      } else if (l.kind == "layernorm") {
        // Over the features of each sample (the GPT's layernorm on its rows), or over the last
        // dimension W of an image (its rows (c, h): runs of W of each sample's columns, conv =
        // {W}; wider than kTileImageNormWidthMax narrowed over blocks of each run).
        op.kind = TileOpKind::kTileOpLayerNorm;
        op.w = state_op(name + ".weight");
        op.b = state_op(name + ".bias");
        CHECK(!held || op.w >= 0) << name;
        if (cur.size() > 1) op.conv = {cur.back()};
        norm_dout[i] = -1;
        norm_width[i] = cur.size() > 1 ? cur.back() : 0;
      } else if (l.kind == "dropout") {
        // Its mask is drawn per element from the step's dropout seed and the layer's stream
        // (model.cc's forward); p = 0 passes its input through (the same bits).
        op.kind = TileOpKind::kTileOpDropout;
        op.conv = {static_cast<int64_t>(i), mb};
        op.dropout_p = static_cast<float>(l.p);
      } else if (l.kind == "maxpool2d" && cur.size() == 3) {
        const int64_t s = l.stride > 0 ? l.stride : l.kernel;
        op.kind = TileOpKind::kTileOpMaxPool;
        op.conv = {cur[0], cur[1], cur[2], cur[0], l.kernel, l.kernel, s, 0};
        cur = {cur[0], (cur[1] - l.kernel) / s + 1, (cur[2] - l.kernel) / s + 1};
      } else {
        return FailedPrecondition("tile rule: model.layers[" + std::to_string(i) + "] is a '" +
                                  l.kind + "' layer the tile plan does not know");
      }
      const int64_t out = NumElements(cur);
      op.grid = TileGrid::For(rows, out);
      op.shape = {rows, out};
      if (!held) continue;  // before the stage: its shape only
      const bool window =
          op.kind == TileOpKind::kTileOpConv || op.kind == TileOpKind::kTileOpMaxPool;
      act = add(std::move(op));
      if (window) windowed[i] = act;
    }
    const int64_t logits = act;
    if (last_stage) {
      if (logits == kTileOperandBatch) return InvalidArgument("tile rule: the model has no layers");
      TileOp loss{"loss", TileOpKind::kTileOpLoss, TileGrid::For(rows, 1), {rows, 1}};
      loss.x = logits;
      add(std::move(loss));
      TileOp grad{"logits.grad",
                  TileOpKind::kTileOpLossGrad,
                  TileGrid::For(rows, plan.classes),
                  {rows, plan.classes}};
      grad.x = logits;
      add(std::move(grad));
    }
    // Backward (model.cc's sequential Backward): a flatten, and a dropout that kept everything
    // (p = 0), pass the gradient through unrecorded; the model's first layer has no input
    // gradient (a later stage's first layer has: it is what the stage sends back).
    int64_t dout =
        last_stage ? index["logits.grad"] : received("activation_grad", {rows, NumElements(cur)});
    for (size_t ii = end; ii-- > begin;) {
      const LayerSpec& l = model.layers[ii];
      if (l.kind == "flatten" || (l.kind == "dropout" && !(l.p > 0))) continue;
      if (l.kind == "linear") linears[ii].dout_op = dout;
      if (l.kind == "conv2d") conv_dout[ii] = dout;
      if (norm_dout.contains(ii)) norm_dout[ii] = dout;
      if (ii == 0) continue;
      const std::string layer = "layers." + std::to_string(ii);
      TileOp op{layer + ".in.grad",
                TileOpKind::kTileOpOpaque,
                TileGrid::For(rows, in_features[ii]),
                {rows, in_features[ii]}};
      op.x = dout;
      if (l.kind == "linear") {
        op.kind = TileOpKind::kTileOpLinearInputGrad;
        op.w = state_op(layer + ".weight");
      } else if (l.kind == "relu" || l.kind == "gelu") {
        op.kind =
            l.kind == "relu" ? TileOpKind::kTileOpReluInputGrad : TileOpKind::kTileOpGeluInputGrad;
        op.w = in_op[ii];
      } else if (l.kind == "conv2d" || l.kind == "maxpool2d") {
        const bool conv = l.kind == "conv2d";
        op.kind = conv ? TileOpKind::kTileOpConvInputGrad : TileOpKind::kTileOpMaxPoolInputGrad;
        op.w = conv ? state_op(layer + ".weight") : in_op[ii];
        op.conv = plan.ops[static_cast<size_t>(windowed.at(ii))].conv;
      } else if (norm_dout.contains(ii)) {
        // LayerNormBackward on a zeroed gradient (v = -1).
        op.kind = TileOpKind::kTileOpLayerNormInputGrad;
        op.w = in_op[ii];
        op.b = state_op(layer + ".weight");
        if (norm_width.at(ii) > 0) op.conv = {norm_width.at(ii)};
      } else if (l.kind == "dropout") {
        // DropoutBackward on a zeroed gradient: the forward's mask (p > 0 here).
        op.kind = TileOpKind::kTileOpDropoutInputGrad;
        op.conv = {static_cast<int64_t>(ii), mb};
        op.dropout_p = static_cast<float>(l.p);
      } else {  // every layer the forward planned has an input gradient above
        return FailedPrecondition("tile rule: model.layers[" + std::to_string(ii) + "] is a '" +
                                  l.kind + "' layer without an input gradient in the tile plan");
      }
      dout = add(std::move(op));
    }
    // Parameter gradients, in parameter order (Model::TraceParamGrads).
    for (const PlannedParam& p : params) {
      // "layers.<i>.weight" / "layers.<i>.bias"
      const size_t dot = p.name.find('.', 7);
      const size_t layer = static_cast<size_t>(std::stoll(p.name.substr(7, dot - 7)));
      const bool weight = p.name.ends_with(".weight");
      const TileGrid grid = TileGrid::ForShape(p.shape);
      TileOp g{p.name + ".grad", TileOpKind::kTileOpOpaque, grid, p.shape};
      auto it = linears.find(layer);
      if (it != linears.end()) {
        g.kind = weight ? TileOpKind::kTileOpLinearWeightGrad : TileOpKind::kTileOpLinearBiasGrad;
        g.x = it->second.dout_op;
        g.w = weight ? it->second.in_op : -1;
      } else if (auto c = conv_dout.find(layer); c != conv_dout.end()) {
        g.kind = weight ? TileOpKind::kTileOpConvWeightGrad : TileOpKind::kTileOpConvBiasGrad;
        g.x = c->second;
        g.w = weight ? in_op[layer] : -1;
        g.conv = plan.ops[static_cast<size_t>(windowed.at(layer))].conv;
      } else if (auto n = norm_dout.find(layer); n != norm_dout.end()) {
        g.kind =
            weight ? TileOpKind::kTileOpLayerNormWeightGrad : TileOpKind::kTileOpLayerNormBiasGrad;
        g.x = n->second;
        g.w = weight ? in_op[layer] : -1;
        if (norm_width.at(layer) > 0) g.conv = {norm_width.at(layer)};
      } else {  // only linear, conv2d and layernorm layers have parameters
        return FailedPrecondition("tile rule: " + p.name + " is a parameter of no layer the tile " +
                                  "plan knows");
      }
      // Micro-batch m > 0 adds into micro-batch m-1's accumulated gradient.
      g.v = mb > 0 ? index.at(p.name + ".grad") : -1;
      add(std::move(g));
    }
  }
  end_micro_batches();
  add_updates();
  ML_RETURN_IF_ERROR(TileRuleCheckWindowBlocks(plan));
  return plan;
}

}  // namespace

Result<int64_t> TileRuleMaxPoolBlockWitnessBytes(const TilePlan& plan, int64_t op) {
  if (op < 0 || op >= static_cast<int64_t>(plan.ops.size())) {
    return InvalidArgument("TileRuleMaxPoolBlockWitnessBytes: operator " + std::to_string(op) +
                           " out of range [0, " + std::to_string(plan.ops.size()) + ")");
  }
  const TileOpKind kind = plan.ops[static_cast<size_t>(op)].kind;
  if (kind != TileOpKind::kTileOpMaxPool && kind != TileOpKind::kTileOpMaxPoolInputGrad) {
    return InvalidArgument("TileRuleMaxPoolBlockWitnessBytes: operator " +
                           plan.ops[static_cast<size_t>(op)].name +
                           " is not a max-pool (forward or input gradient)");
  }
  return TileRuleWindowWorstWitnessBytes(plan, op);
}

int64_t TileRuleFootprintFloats(const TilePlan& plan, int64_t op, int64_t tile, int64_t block,
                                const TileFootprint& fp) {
  int64_t floats = ReductionPartialFloats(plan, op, tile, block);
  for (const TileRef& r : fp.tiles) {
    floats += plan.ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel();
  }
  int64_t example = plan.input_size;
  if (ExampleChunks(plan.input_size) > 0) {
    example = 0;
    for (int64_t k : fp.batch_chunks) {
      example += std::min(plan.input_size, (k + 1) * kExampleChunkFloats) - k * kExampleChunkFloats;
    }
  }
  return floats + static_cast<int64_t>(fp.batch_rows.size()) * example;
}

int64_t TileRuleFootprintWitnessBytes(const TilePlan& plan, int64_t op, int64_t tile, int64_t block,
                                      const TileFootprint& fp) {
  return TileRuleBlockWitnessBytes(plan, op, TileRuleFootprintFloats(plan, op, tile, block, fp),
                                   static_cast<int64_t>(fp.batch_rows.size()));
}

Result<TilePlan> PlanStepTiles(const ModelSpec& model, const OptimizerSpec& optimizer,
                               int64_t batch, int64_t seq_len, int64_t micro_batches) {
  return TileRulePlan(model, optimizer, batch, seq_len, micro_batches, nullptr);
}

Result<TilePlan> PlanStageStepTiles(const ModelSpec& model, const OptimizerSpec& optimizer,
                                    ModelPart part, int64_t batch, int64_t seq_len,
                                    int64_t micro_batches) {
  if (part.end < 0) part.end = CutLayerCount(model);
  return TileRulePlan(model, optimizer, batch, seq_len, micro_batches, &part);
}

int64_t UpdatedStateOperand(const TileOp& op) {
  if (op.kind != TileOpKind::kTileOpAdamW && op.kind != TileOpKind::kTileOpSgd) return -1;
  switch (op.update_output) {
    case TileUpdateOutput::kTileUpdateParam:
      return op.x;
    case TileUpdateOutput::kTileUpdateFirstMoment:
      return op.b;
    case TileUpdateOutput::kTileUpdateSecondMoment:
      return op.v;
  }
  return -1;
}

Hash256 StateTileRoot(TrainState& state) {
  CHECK(state.optimizer) << "StateTileRoot needs a training state with an optimizer";
  return MerkleRoot(StateTensorRoots(state));
}

int64_t ReductionBlocks(const TilePlan& plan, int64_t op) {
  if (op < 0 || op >= static_cast<int64_t>(plan.ops.size())) return 0;
  const TileOp& o = plan.ops[static_cast<size_t>(op)];
  if (o.kind == TileOpKind::kTileOpLinear || o.kind == TileOpKind::kTileOpLinearInputGrad) {
    // The forward's chain runs over the input width C, dX's over the output width OC (the
    // columns of x in both).
    const int64_t C = TileRuleCols(plan, o.x);
    return C > kTileLinearWholeMax ? (C + kTileLinearBlock - 1) / kTileLinearBlock : 0;
  }
  // A conv's input gradient chains over (oc, kh, kw): narrowed the same way, by output channels.
  // Over wide images both are narrowed into blocks of kTileConvWideRows (channel, kh) pairs.
  if (o.kind == TileOpKind::kTileOpConv || o.kind == TileOpKind::kTileOpConvInputGrad) {
    const int64_t n = o.kind == TileOpKind::kTileOpConv ? o.conv[0] : o.conv[3];
    if (const int64_t pairs = n * o.conv[4]; TileRuleWindowWide(o)) {
      // A forward whose tile is cut into pieces runs every pair block for each piece.
      const int64_t pieces = TileRuleConvPiecesOf(o).count();
      if (pieces > 1) return pieces * TileRuleConvPairBlocks(o);
      return pairs > TileRuleConvWidePairs(o) ? TileRuleConvPairBlocks(o) : 0;
    }
    return n > kTileConvChannels ? (n + kTileConvChannels - 1) / kTileConvChannels : 0;
  }
  // A max-pool input gradient narrowed into a chain over its outputs: one output a block.
  // (Past 25 window rows: one a chunk of its rows, TileRulePoolRowChunks.)
  if (o.kind == TileOpKind::kTileOpMaxPoolInputGrad && o.window_chain) {
    return TileRulePoolChainSlotsOf(o).count() * TileRulePoolRowChunks(o);
  }
  // A max-pool forward whose tile is cut into pieces (TileRuleConvPiecesOf): a piece a block, or
  // one a chunk of its window's rows.
  if (o.kind == TileOpKind::kTileOpMaxPool) {
    const int64_t pieces = TileRuleConvPiecesOf(o).count(), chunks = TileRulePoolRowChunks(o);
    return pieces > 1 || chunks > 1 ? pieces * chunks : 0;
  }
  if (o.kind == TileOpKind::kTileOpConvWeightGrad || o.kind == TileOpKind::kTileOpConvBiasGrad) {
    const int64_t OW = TileRuleOutW(o), groups = TileRuleConvGradGroups(o);
    if (TileRuleConvGradWide(o)) {
      const int64_t rw = TileRuleConvGradRunWidth(o);
      return TileRuleRows(plan) * TileRuleOutH(o) * ((OW + rw - 1) / rw) * groups;
    }
    return TileRuleRowBlocks(TileRuleRows(plan)) * groups;
  }
  if (o.kind == TileOpKind::kTileOpEmbedding) {
    const int64_t V = plan.classes;
    return V > kTileEmbeddingWholeMax ? (V + kTileEmbeddingBlock - 1) / kTileEmbeddingBlock : 0;
  }
  if (o.kind == TileOpKind::kTileOpLoss || o.kind == TileOpKind::kTileOpLossGrad) {
    const int64_t nb = TileRuleSoftmaxBlocks(plan);
    return nb == 0 ? 0 : 2 * nb + (o.kind == TileOpKind::kTileOpLossGrad ? 1 : 0);
  }
  // The block partials are independent sums of kSumBlock gradient elements each (up to 4 KiB of
  // values, in at most 40 of their tiles): a tile of them is narrowed to one, the chain S_k being
  // the tile with its first k partials filled in (the rest 0).
  if (o.kind == TileOpKind::kTileOpGradSquareBlocks) return kTileFlat;
  // The norm chains over the parameters (optim.cc's SumGradSquares): S_{k+1} = S_k + the
  // combination of parameter k's block partials, a parameter above kTileNormChunk partials in
  // one block per chunk of them.
  if (o.kind == TileOpKind::kTileOpGradNorm) {
    return static_cast<int64_t>(TileRuleNormBlocks(plan, o).size());
  }
  // The embeddings' gradients chain over the rows in blocks of 32; wte's first runs the tied
  // head's dW chain (as many blocks again).
  if (o.kind == TileOpKind::kTileOpEmbeddingGrad) {
    return (o.b >= 0 ? 2 : 1) * TileRuleRowBlocks(TileRuleRows(plan));
  }
  // The attention backward: every element a chain over the sequence's T positions (keys for dq,
  // queries for dk and dv), in blocks of 32.
  // Above T = 256 (or a wide head: TileRuleAttentionBlocks), first the row sums of the groups
  // the tile needs (block qb * nb + kb: the query positions of block qb over the key positions of
  // block kb), then the chain; a head wider than 128, each block over its columns' blocks.
  if (o.kind == TileOpKind::kTileOpAttentionBackward) {
    const int64_t nb = TileRuleAttentionBlocks(o);
    return nb == 0 ? TileRuleRowBlocks(o.conv[0]) : (nb * nb + nb) * TileRuleBackwardHeadBlocks(o);
  }
  // The attention forward over a long sequence: att's max, sum and output blocks, atty's chain.
  if (o.kind == TileOpKind::kTileOpAttention) {
    const int64_t nb = TileRuleAttentionBlocks(o);
    return nb == 0 ? 0 : (2 * nb + 1) * TileRuleAttentionHeadBlocks(o);
  }
  if (o.kind == TileOpKind::kTileOpAttentionOut) return TileRuleAttentionBlocks(o);
  // A layernorm wider than kTileLinearWholeMax: its row reductions in column blocks, then the
  // tile's columns.
  if (const int64_t nb = TileRuleLayerNormBlocks(plan, o); nb > 0) {
    return (o.kind == TileOpKind::kTileOpLayerNorm ? 2 : 3) * nb + 1;
  }
  if (!TileRuleIsReduction(o.kind)) return 0;
  const int64_t row_blocks = TileRuleImageNormWidth(o) > 0
                                 ? TileRuleImageNormChainOf(plan, o).blocks()
                                 : TileRuleRowBlocks(TileRuleRows(plan));
  if (const TileRuleLnWeight lw = TileRuleLayerNormWeightBlocks(plan, o); lw.nb > 0) {
    return lw.per() * row_blocks;
  }
  return row_blocks;
}

int64_t ReductionPartialFloats(const TilePlan& plan, int64_t op, int64_t tile, int64_t block) {
  if (block == 0 || ReductionBlocks(plan, op) == 0) return 0;
  const TileOp& o = plan.ops[static_cast<size_t>(op)];
  return TileRulePartialSize(plan, o, o.grid.TileRect(tile), block);
}

Result<TileFootprint> Footprint(const TilePlan& plan, int64_t op, int64_t tile, int64_t block) {
  if (op < 0 || op >= static_cast<int64_t>(plan.ops.size())) {
    return InvalidArgument("tile rule: operator " + std::to_string(op) +
                           " out of range (the step has " + std::to_string(plan.ops.size()) + ")");
  }
  const TileOp& o = plan.ops[static_cast<size_t>(op)];
  if (tile < 0 || tile >= o.grid.count()) {
    return InvalidArgument("tile rule: " + TileRuleOpName(plan, op) + " has " +
                           std::to_string(o.grid.count()) + " tiles, not tile " +
                           std::to_string(tile));
  }
  const int64_t blocks = ReductionBlocks(plan, op);
  if (blocks > 0 ? (block < 0 || block >= blocks) : block != 0) {
    return InvalidArgument("tile rule: " + TileRuleOpName(plan, op) + " has " +
                           std::to_string(std::max<int64_t>(blocks, 1)) +
                           " reduction block(s), not block " + std::to_string(block));
  }
  const TileGrid::Rect t = o.grid.TileRect(tile);
  TileFootprint fp;
  switch (o.kind) {
    case TileOpKind::kTileOpState:
      return FailedPrecondition("tile rule: " + TileRuleOpName(plan, op) +
                                " is the step's input state, not computed by the step");
    case TileOpKind::kTileOpOpaque:
      return FailedPrecondition("tile rule: " + TileRuleOpName(plan, op) + ": " + o.opaque);
    case TileOpKind::kTileOpLinear: {
      // Whole: every column c of the rows; narrowed: block `block`'s columns, the bias with the
      // first block (the chain starts from it).
      const int64_t C = TileRuleCols(plan, o.x);
      const int64_t k0 = blocks > 0 ? block * kTileLinearBlock : 0;
      const int64_t k1 = blocks > 0 ? std::min(C, k0 + kTileLinearBlock) : C;
      TileRuleCover(plan, o.x, t.r0, t.r1, k0, k1, fp);
      TileRuleCover(plan, o.w, t.c0, t.c1, k0, k1, fp);
      if (o.b >= 0 && block == 0) TileRuleCover(plan, o.b, 0, 1, t.c0, t.c1, fp);
      break;
    }
    case TileOpKind::kTileOpRelu:
    case TileOpKind::kTileOpGelu:
    case TileOpKind::kTileOpDropout:  // the mask is drawn, not read
    case TileOpKind::kTileOpDropoutInputGrad:
      TileRuleCover(plan, o.x, t.r0, t.r1, t.c0, t.c1, fp);
      break;
    case TileOpKind::kTileOpResidual:
      TileRuleCover(plan, o.x, t.r0, t.r1, t.c0, t.c1, fp);
      TileRuleCover(plan, o.w, t.r0, t.r1, t.c0, t.c1, fp);
      break;
    case TileOpKind::kTileOpAttention: {
      // Row (b, h, t) is the softmax over t2 <= t of q_t . k_t2 in head h: q of its rows, k of
      // the sequence's rows 0..t (whatever the tile's columns). Narrowed: the block's keys, and
      // q of the rows that reach them.
      // A wide head's block: the columns of its sub-block of the head.
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      if (blocks > 0) {
        const int64_t nh = TileRuleAttentionHeadBlocks(o);
        const auto [i0, i1] = TileRuleAttentionHeadCols(o, block % nh);
        ForEachAttentionBlockSpan(
            o, t, block / nh,
            [&](int64_t, int64_t b, int64_t h, int64_t q0, int64_t t1, int64_t k0, int64_t kend) {
              TileRuleCover(plan, o.x, b * T + q0, b * T + t1, h * hs + i0, h * hs + i1, fp);
              TileRuleCover(plan, o.x, b * T + k0, b * T + kend, C + h * hs + i0, C + h * hs + i1,
                            fp);
            });
        break;
      }
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t gr, int64_t t0, int64_t t1) {
        const int64_t b = gr / NH, h = gr % NH;
        TileRuleCover(plan, o.x, b * T + t0, b * T + t1, h * hs, (h + 1) * hs, fp);
        TileRuleCover(plan, o.x, b * T, b * T + t1, C + h * hs, C + (h + 1) * hs, fp);
      });
      break;
    }
    case TileOpKind::kTileOpAttentionOut: {
      // Row (b, t), column c (head h = c / hs) chains att[(b, h, t), t2] * v[(b, t2), c] over
      // every t2 < T (kernels.h; att is 0 past t): the att rows of the tile's heads, and the v
      // columns of the tile over the whole sequence. Narrowed: the block's positions t2 of both.
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      const int64_t k0 = blocks > 0 ? block * kTileAttentionBlock : 0;
      const int64_t k1 = blocks > 0 ? std::min(T, k0 + kTileAttentionBlock) : T;
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t t0, int64_t t1) {
        for (int64_t h = t.c0 / hs; h <= (t.c1 - 1) / hs; ++h) {
          const int64_t gr = b * NH + h;
          TileRuleCover(plan, o.x, gr * T + t0, gr * T + t1, k0, k1, fp);
        }
        TileRuleCover(plan, o.w, b * T + k0, b * T + k1, 2 * C + t.c0, 2 * C + t.c1, fp);
      });
      break;
    }
    case TileOpKind::kTileOpEmbedding: {
      // Row r is wte's row of its token plus wpe's row of its position r % T: the rows' tokens
      // (proven by the pages holding them), wte's column strip c (the footprint cannot know
      // which rows the tokens pick: 4 x V x 32 bytes; narrowed: block `block`'s rows of it) and
      // wpe's rows of the positions.
      const int64_t v0 = blocks > 0 ? block * kTileEmbeddingBlock : 0;
      const int64_t v1 =
          blocks > 0 ? std::min(plan.classes, v0 + kTileEmbeddingBlock) : plan.classes;
      TileRuleCover(plan, kTileOperandBatch, t.r0, t.r1, 0, 0, fp);
      TileRuleCover(plan, o.x, v0, v1, t.c0, t.c1, fp);
      ForEachSequenceSpan(t.r0, t.r1, o.conv[0], [&](int64_t, int64_t t0, int64_t t1) {
        TileRuleCover(plan, o.w, t0, t1, t.c0, t.c1, fp);
      });
      break;
    }
    case TileOpKind::kTileOpEmbeddingGrad: {
      const int64_t nb = TileRuleRowBlocks(TileRuleRows(plan));
      if (o.b >= 0 && block < nb) {
        // wte's tied-head block: logits.grad's rows of the block in the tile's rows v (its
        // columns), ln_f's rows of the block in columns c.
        const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), block);
        TileRuleCover(plan, o.b, b0, b1, t.r0, t.r1, fp);
        TileRuleCover(plan, o.v, b0, b1, t.c0, t.c1, fp);
        break;
      }
      // An embedding block: the block's rows of the residual gradient in columns c, and (wte)
      // the rows' tokens, which pick the rows they add into.
      const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), o.b >= 0 ? block - nb : block);
      if (o.conv[1] == 1) TileRuleCover(plan, kTileOperandBatch, b0, b1, 0, 0, fp);
      TileRuleCover(plan, o.x, b0, b1, t.c0, t.c1, fp);
      break;
    }
    case TileOpKind::kTileOpAttentionBackward: {
      // kernels_ref.cc's AttentionBackward, per sequence b and head h, positions [k0, k1) of the
      // block: dv[t2, i] chains att[t, t2] dout[t, i] over t; dq[t, i] chains dP[t, t2] k[t2, i]
      // over t2; dk[t2, i] chains dP[t, t2] q[t, i] over t; dP[t, .] = att[t, .] (dA[t, .] -
      // s_t) needs the whole row t of att and of dA = dout[t, :] . v[t2, :] (all t2). So: v's
      // dout and att columns of the block's rows; q's whole att rows and dout rows of its own
      // positions, v of the whole sequence, k of the block's rows; k's the same for the block's
      // rows, and q of the block's rows.
      //
      // Above T = 256 or at a wide head (nb blocks of 32 positions), the row sums s_t come first,
      // as agreed partials: block qb * nb + kb reads, for each group the tile needs, att of the
      // query block qb's rows in the key block kb's columns, dout of those rows and v of the key
      // block's rows (the head's hs columns). Then chain block k (block nb * nb + k): v's as above;
      // q's att of its rows in the block's columns, dout of its rows, v and k of the block's rows;
      // k's att of the block's rows in its columns, dout and q of the block's rows, v of its rows.
      //
      // A wide head's block ob * nh + ib (TileRuleBackwardHeadBlocks): dout and v in its columns
      // [d0, d1) of the head for the dots, and the rest (att, the tile's own columns) with the
      // last, which applies the block.
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      const int64_t nb = TileRuleAttentionBlocks(o), nh = TileRuleBackwardHeadBlocks(o);
      const int64_t ob = block / nh, d0 = block % nh * kTileAttentionBackwardHeadBlock;
      const int64_t d1 = nb > 0 ? std::min(hs, d0 + kTileAttentionBackwardHeadBlock) : hs;
      const bool last = block % nh + 1 == nh;
      if (nb > 0 && ob < nb * nb) {
        const int64_t q0 = (ob / nb) * kTileAttentionBlock;
        const int64_t q1 = std::min(T, q0 + kTileAttentionBlock);
        const int64_t s0 = (ob % nb) * kTileAttentionBlock;
        const int64_t s1 = std::min(T, s0 + kTileAttentionBlock);
        for (int64_t gr : TileRuleBackwardSumGroups(o, t)) {
          const int64_t base = (gr / NH) * T, hc = (gr % NH) * hs;
          if (last) TileRuleCover(plan, o.b, gr * T + q0, gr * T + q1, s0, s1, fp);
          TileRuleCover(plan, o.x, base + q0, base + q1, hc + d0, hc + d1, fp);
          TileRuleCover(plan, o.w, base + s0, base + s1, 2 * C + hc + d0, 2 * C + hc + d1, fp);
        }
        break;
      }
      const int64_t k0 = (nb > 0 ? ob - nb * nb : block) * kTileRows;
      const int64_t k1 = std::min(T, k0 + kTileRows);
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t p0, int64_t p1) {
        const int64_t base = b * T;
        ForEachHeadSegment(t.c0, t.c1, C, hs, [&](int64_t part, int64_t h, int64_t i0, int64_t i1) {
          const int64_t arow = (b * NH + h) * T, hc = h * hs;
          if (part == 2) {
            if (!last) return;
            TileRuleCover(plan, o.b, arow + k0, arow + k1, p0, p1, fp);
            TileRuleCover(plan, o.x, base + k0, base + k1, hc + i0, hc + i1, fp);
            return;
          }
          const int64_t other = part == 0 ? C : 0;  // q reads k of the block, k reads q
          if (nb > 0) {  // dP's query rows [r0, r1) and key positions [c0, c1)
            const int64_t r0 = part == 0 ? p0 : k0, r1 = part == 0 ? p1 : k1;
            const int64_t c0 = part == 0 ? k0 : p0, c1 = part == 0 ? k1 : p1;
            if (last) TileRuleCover(plan, o.b, arow + r0, arow + r1, c0, c1, fp);
            TileRuleCover(plan, o.x, base + r0, base + r1, hc + d0, hc + d1, fp);
            TileRuleCover(plan, o.w, base + c0, base + c1, 2 * C + hc + d0, 2 * C + hc + d1, fp);
            if (!last) return;
            TileRuleCover(plan, o.w, base + k0, base + k1, other + hc + i0, other + hc + i1, fp);
            return;
          }
          const int64_t r0 = part == 0 ? p0 : k0, r1 = part == 0 ? p1 : k1;
          TileRuleCover(plan, o.b, arow + r0, arow + r1, 0, T, fp);
          TileRuleCover(plan, o.x, base + r0, base + r1, hc, hc + hs, fp);
          TileRuleCover(plan, o.w, base, base + T, 2 * C + hc, 2 * C + hc + hs, fp);
          TileRuleCover(plan, o.w, base + k0, base + k1, other + hc + i0, other + hc + i1, fp);
        });
      });
      break;
    }
    case TileOpKind::kTileOpLayerNorm: {
      // A row's mean and variance read the whole row; column c applies weight[c] and bias[c].
      // Narrowed: a sum block reads its columns of the rows; the last block the tile's. Over an
      // image: the whole runs of the tile's columns, and the whole weight and bias (W).
      // Narrowed over an image: a sum block its columns of each of the tile's runs; the last
      // block the weight and bias columns of each run's part of the tile.
      const int64_t nb = TileRuleLayerNormBlocks(plan, o);
      if (const int64_t W = TileRuleImageNormWidth(o); W > 0 && nb == 0) {
        const auto [f0, f1] = TileRuleImageNormRuns(W, t.c0, t.c1);
        TileRuleCover(plan, o.x, t.r0, t.r1, f0, f1, fp);
        TileRuleCover(plan, o.w, 0, 1, 0, W, fp);
        TileRuleCover(plan, o.b, 0, 1, 0, W, fp);
        break;
      }
      const TileRuleNormRuns ru = TileRuleNormRunsOf(plan, o, t);
      if (nb > 0 && block < 2 * nb) {
        const int64_t k0 = (block % nb) * kTileLinearBlock,
                      k1 = std::min(ru.C, k0 + kTileLinearBlock);
        for (int64_t jj = 0; jj < ru.nj; ++jj) {
          const int64_t f = (ru.j0 + jj) * ru.C;
          TileRuleCoverOnce(plan, o.x, t.r0, t.r1, f + k0, f + k1, fp);
        }
        break;
      }
      TileRuleCover(plan, o.x, t.r0, t.r1, nb > 0 ? t.c0 : 0,
                    nb > 0 ? t.c1 : TileRuleCols(plan, o.x), fp);
      for (int64_t operand : {o.w, o.b}) {
        for (int64_t jj = 0; jj < ru.nj; ++jj) {
          const auto [w0, w1] = ru.Cols(jj, t.c0, t.c1);
          TileRuleCoverOnce(plan, operand, 0, 1, w0, w1, fp);
        }
      }
      break;
    }
    case TileOpKind::kTileOpMaxPool: {
      // Channel c of the output reads channel c of the input, the rows its windows cover.
      const int64_t H = o.conv[1], W = o.conv[2];
      if (TileRuleWindowWide(o)) {
        // Over a wide image: each output row's run of the tile (of the block's piece of it, where
        // a large window cut it: TileRuleConvPieceOf), its windows' columns of their rows
        // (TileRuleWindowWide).
        const int64_t k = o.conv[4], s = o.conv[6];
        const TileRuleConvPiece pc = TileRuleConvPieceOf(o, t, blocks, block);
        if (pc.r0 >= pc.r1 || pc.c0 >= pc.c1) break;  // past a short tile's segments
        // (A window past 25 rows: the block's chunk of them, pc.pair_block.)
        const int64_t q = TileRulePoolRowChunk(o), kh0 = pc.pair_block * q;
        const int64_t kh1 = std::min(k, kh0 + q);
        ForEachPlaneRun(TileRuleOutH(o), TileRuleOutW(o), pc.c0, pc.c1,
                        [&](int64_t c, int64_t oh, int64_t ow0, int64_t ow1) {
                          const auto [iw0, iw1] = TileRuleWindowInputCols(o, ow0, ow1);
                          for (int64_t ih = oh * s + kh0; ih < oh * s + kh1; ++ih) {
                            const int64_t f = (c * H + ih) * W;
                            TileRuleCoverOnce(plan, o.x, pc.r0, pc.r1, f + iw0, f + iw1, fp);
                          }
                        });
        break;
      }
      const TileRuleConvSpan cs = TileRuleConvOf(o, t.c0, t.c1);
      for (int64_t c = cs.oc0; c < cs.oc1; ++c) {
        TileRuleCover(plan, o.x, t.r0, t.r1, (c * H + cs.ih0) * W, (c * H + cs.ih1) * W, fp);
      }
      break;
    }
    case TileOpKind::kTileOpConv: {
      const int64_t H = o.conv[1], W = o.conv[2], KH = o.conv[4], KK = KH * o.conv[5];
      // The block's piece of the tile (TileRuleConvPieceOf: the whole tile but where it is cut).
      const TileRuleConvPiece pc = TileRuleConvPieceOf(o, t, blocks, block);
      if (pc.r0 >= pc.r1 || pc.c0 >= pc.c1) break;  // past a short tile's rows or runs
      const TileRuleConvSpan cs = TileRuleConvOf(o, pc.c0, pc.c1);
      const auto [q0, q1] = TileRuleConvPairs(o, blocks, block);
      const int64_t cb0 = q0 / KH, cb1 = (q1 - 1) / KH + 1;
      if (TileRuleWindowWide(o)) {
        // Each output row's run of the piece: the columns its windows read, in the input row each
        // of the block's pairs (c, kh) puts under it (over chunked examples, the chunks holding
        // them: TileRuleConvOverChunks).
        const int64_t s = o.conv[6], pad = o.conv[7];
        ForEachPlaneRun(TileRuleOutH(o), TileRuleOutW(o), pc.c0, pc.c1,
                        [&](int64_t, int64_t oh, int64_t ow0, int64_t ow1) {
                          const auto [iw0, iw1] = TileRuleWindowInputCols(o, ow0, ow1);
                          for (int64_t q = q0; q < q1; ++q) {
                            const int64_t ih = oh * s - pad + q % KH;
                            if (ih < 0 || ih >= H || iw0 == iw1) continue;
                            const int64_t f = (q / KH * H + ih) * W;
                            TileRuleCoverOnce(plan, o.x, pc.r0, pc.r1, f + iw0, f + iw1, fp);
                          }
                        });
      } else if (o.x == kTileOperandBatch) {
        TileRuleCover(plan, o.x, t.r0, t.r1, 0, TileRuleCols(plan, o.x), fp);
      } else {
        for (int64_t c = cb0; c < cb1; ++c) {
          TileRuleCover(plan, o.x, t.r0, t.r1, (c * H + cs.ih0) * W, (c * H + cs.ih1) * W, fp);
        }
      }
      if (TileRuleConvWeightByPairs(o)) {
        // A large kernel's weight: the KW columns of each of the block's pairs (c, kh).
        const int64_t KW = o.conv[5];
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t w0 = q / KH * KK + q % KH * KW;
          TileRuleCoverOnce(plan, o.w, cs.oc0, cs.oc1, w0, w0 + KW, fp);
        }
      } else {
        TileRuleCover(plan, o.w, cs.oc0, cs.oc1, cb0 * KK, cb1 * KK, fp);
      }
      if (o.b >= 0 && pc.pair_block == 0) TileRuleCover(plan, o.b, 0, 1, cs.oc0, cs.oc1, fp);
      break;
    }
    case TileOpKind::kTileOpConvInputGrad: {
      // Input (c, ih, iw) chains dout[oc, oh, ow] w[oc, c, kh, kw] over (oc, kh, kw): the
      // output rows whose windows reach the tile's input rows, in every output channel (of the
      // block), and the weight's rows of those channels in the tile's input channels' columns.
      const int64_t C = o.conv[0], H = o.conv[1], W = o.conv[2], KH = o.conv[4];
      const int64_t KK = KH * o.conv[5], OH = TileRuleOutH(o), OW = TileRuleOutW(o);
      const TileRulePlaneSpan ps = TileRulePlanesOf(C, H, W, t.c0, t.c1);
      const auto [oh0, oh1] = TileRuleWindowRows(o, ps.h0, ps.h1);
      const auto [q0, q1] = TileRuleConvPairs(o, blocks, block);
      const int64_t ob0 = q0 / KH, ob1 = (q1 - 1) / KH + 1;
      if (TileRuleWindowWide(o)) {
        // Each input row's run of the tile: the outputs whose windows reach it, in the output
        // row each of the block's pairs (oc, kh) puts over it (oh s - pad + kh = ih).
        const int64_t s = o.conv[6], pad = o.conv[7];
        ForEachPlaneRun(H, W, t.c0, t.c1, [&](int64_t, int64_t ih, int64_t iw0, int64_t iw1) {
          const auto [ow0, ow1] = TileRuleWindowCols(o, iw0, iw1);
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t th = ih + pad - q % KH;
            if (th < 0 || th % s != 0 || th / s >= OH || ow0 == ow1) continue;
            const int64_t f = (q / KH * OH + th / s) * OW;
            TileRuleCoverOnce(plan, o.x, t.r0, t.r1, f + ow0, f + ow1, fp);
          }
        });
      } else {
        for (int64_t oc = ob0; oc < ob1; ++oc) {
          TileRuleCover(plan, o.x, t.r0, t.r1, (oc * OH + oh0) * OW, (oc * OH + oh1) * OW, fp);
        }
      }
      if (TileRuleConvWeightByPairs(o)) {
        // A large kernel's weight: for each of the block's pairs (oc, kh), its KW columns in each
        // of the tile's input planes.
        const int64_t KW = o.conv[5];
        for (int64_t q = q0; q < q1; ++q) {
          for (int64_t c = ps.p0; c < ps.p1; ++c) {
            const int64_t w0 = c * KK + q % KH * KW;
            TileRuleCoverOnce(plan, o.w, q / KH, q / KH + 1, w0, w0 + KW, fp);
          }
        }
      } else {
        TileRuleCover(plan, o.w, ob0, ob1, ps.p0 * KK, ps.p1 * KK, fp);
      }
      break;
    }
    case TileOpKind::kTileOpMaxPoolInputGrad: {
      // Input (c, ih, iw) receives dout of the windows whose argmax it is: per channel, the
      // output rows whose windows reach the tile's rows of it, and the input rows of those
      // windows (their argmax).
      const int64_t C = o.conv[0], H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
      const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o);
      if (o.window_chain) {
        // A chain over the outputs reaching the tile (TileRulePoolChainBlockOf): the block's
        // outputs' dout and their windows' k rows, output by output.
        // (Past 25 rows: one output, the block's chunk of its rows, dout with the last.)
        const int64_t rc = TileRulePoolRowChunks(o), q = TileRulePoolRowChunk(o);
        const int64_t kh0 = block % rc * q, kh1 = std::min(k, kh0 + q);
        const TileRulePoolChainBlock pb = TileRulePoolChainBlockOf(o, t, block / rc);
        if (pb.empty) break;  // past the tile's runs or its run's outputs
        for (int64_t oh = pb.oh0; oh < pb.oh1; ++oh) {
          const int64_t f = (pb.c * OH + oh) * OW;
          if (kh1 == k) TileRuleCoverOnce(plan, o.x, t.r0, t.r1, f + pb.ow0, f + pb.ow1, fp);
          for (int64_t ow = pb.ow0; ow < pb.ow1; ++ow) {
            for (int64_t h = oh * s + kh0; h < oh * s + kh1; ++h) {
              const int64_t x0 = (pb.c * H + h) * W + ow * s;
              TileRuleCoverOnce(plan, o.w, t.r0, t.r1, x0, x0 + k, fp);
            }
          }
        }
        break;
      }
      if (TileRuleWindowWide(o)) {
        // Over a wide image: each input row's run of the tile, the outputs whose windows reach
        // it and those windows' columns of their rows (TileRuleWindowWide).
        ForEachPlaneRun(H, W, t.c0, t.c1, [&](int64_t c, int64_t ih, int64_t iw0, int64_t iw1) {
          const auto [oh0, oh1] = TileRuleWindowRows(o, ih, ih + 1);
          const auto [ow0, ow1] = TileRuleWindowCols(o, iw0, iw1);
          if (ow0 == ow1) return;
          const auto [xw0, xw1] = TileRuleWindowInputCols(o, ow0, ow1);
          for (int64_t oh = oh0; oh < oh1; ++oh) {
            const int64_t f = (c * OH + oh) * OW;
            TileRuleCoverOnce(plan, o.x, t.r0, t.r1, f + ow0, f + ow1, fp);
            for (int64_t h = oh * s; h < oh * s + k; ++h) {
              TileRuleCoverOnce(plan, o.w, t.r0, t.r1, (c * H + h) * W + xw0, (c * H + h) * W + xw1,
                                fp);
            }
          }
        });
        break;
      }
      const TileRulePlaneSpan ps = TileRulePlanesOf(C, H, W, t.c0, t.c1);
      for (int64_t c = ps.p0; c < ps.p1; ++c) {
        const auto [h0, h1] = TileRulePlaneRows(H, W, t.c0, t.c1, c);
        const auto [oh0, oh1] = TileRuleWindowRows(o, h0, h1);
        if (oh0 == oh1) continue;
        TileRuleCover(plan, o.x, t.r0, t.r1, (c * OH + oh0) * OW, (c * OH + oh1) * OW, fp);
        TileRuleCover(plan, o.w, t.r0, t.r1, (c * H + oh0 * s) * W, (c * H + (oh1 - 1) * s + k) * W,
                      fp);
      }
      break;
    }
    case TileOpKind::kTileOpConvWeightGrad:
    case TileOpKind::kTileOpConvBiasGrad: {
      // Block (k, g): row block k of dout in the group's output planes; dW also the row block of
      // the layer's input in the tile's input channels (all their rows: every position).
      const int64_t groups = TileRuleConvGradGroups(o), P = TileRuleOutH(o) * TileRuleOutW(o);
      const TileRuleConvGradSpan sp = TileRuleConvGradSpanOf(plan, o, block);
      const int64_t b0 = sp.b0, b1 = sp.b1;
      const auto [oc0, oc1] = TileRuleConvGradChannels(o, t, block % groups);
      if (oc0 >= oc1) break;
      if (TileRuleConvGradWide(o)) {
        // One sample's run of one output row (TileRuleConvGradWide), for dW in a chunk of the
        // tile's pairs (none past its last).
        const int64_t H = o.conv[1], W = o.conv[2], KH = o.conv[4];
        const int64_t OW = TileRuleOutW(o), oh = sp.oh0;
        const auto [q0, q1] = TileRuleConvGradPairs(o, t, block % groups);
        if (q0 >= q1) break;
        for (int64_t oc = oc0; oc < oc1; ++oc) {
          const int64_t f = oc * P + oh * OW;
          TileRuleCover(plan, o.x, b0, b1, f + sp.ow0, f + sp.ow1, fp);
        }
        if (o.kind != TileOpKind::kTileOpConvWeightGrad) break;
        // Unchunked examples are read whole (one sample's: at most 4 KiB); chunked ones (a
        // first layer over 3 x 32 x 32 images and larger) by the chunks holding the pairs' rows,
        // so a block stays under the bound at any image size.
        if (o.w == kTileOperandBatch && ExampleChunks(plan.input_size) == 0) {
          TileRuleCover(plan, o.w, b0, b1, 0, TileRuleCols(plan, o.w), fp);
          break;
        }
        const auto [iw0, iw1] = TileRuleWindowInputCols(o, sp.ow0, sp.ow1);
        for (int64_t q = q0; q < q1; ++q) {  // the group's (c, kh) pairs of the tile
          const int64_t ih = oh * o.conv[6] - o.conv[7] + q % KH;
          if (ih < 0 || ih >= H || iw0 == iw1) continue;
          const int64_t f = (q / KH * H + ih) * W;
          TileRuleCoverOnce(plan, o.w, b0, b1, f + iw0, f + iw1, fp);
        }
        break;
      }
      TileRuleCover(plan, o.x, b0, b1, oc0 * P, oc1 * P, fp);
      if (o.kind == TileOpKind::kTileOpConvWeightGrad) {
        const int64_t HW = o.conv[1] * o.conv[2], KK = o.conv[4] * o.conv[5];
        if (o.w == kTileOperandBatch) {
          TileRuleCover(plan, o.w, b0, b1, 0, TileRuleCols(plan, o.w), fp);
        } else {
          TileRuleCover(plan, o.w, b0, b1, (t.c0 / KK) * HW, ((t.c1 - 1) / KK + 1) * HW, fp);
        }
      }
      break;
    }
    case TileOpKind::kTileOpLoss:
    case TileOpKind::kTileOpLossGrad: {
      // Whole: the rows' logits and targets. Narrowed: a max block its columns of the rows'
      // logits; a sum block its columns and the targets; the gradient's last block the tile's
      // own logits and the targets.
      const int64_t nb = TileRuleSoftmaxBlocks(plan);
      int64_t v0 = 0, v1 = plan.classes;
      if (blocks > 0 && block < 2 * nb) {
        v0 = (block % nb) * kTileSoftmaxBlock;
        v1 = std::min(plan.classes, v0 + kTileSoftmaxBlock);
      } else if (blocks > 0) {
        v0 = t.c0;
        v1 = t.c1;
      }
      TileRuleCover(plan, o.x, t.r0, t.r1, v0, v1, fp);
      if (blocks == 0 || block >= nb) TileRuleCover(plan, kTileOperandBatch, t.r0, t.r1, 0, 0, fp);
      break;
    }
    case TileOpKind::kTileOpLinearInputGrad: {
      const int64_t OC = TileRuleCols(plan, o.x);
      const int64_t k0 = blocks > 0 ? block * kTileLinearBlock : 0;
      const int64_t k1 = blocks > 0 ? std::min(OC, k0 + kTileLinearBlock) : OC;
      TileRuleCover(plan, o.x, t.r0, t.r1, k0, k1, fp);
      TileRuleCover(plan, o.w, k0, k1, t.c0, t.c1, fp);
      break;
    }
    case TileOpKind::kTileOpReluInputGrad:
    case TileOpKind::kTileOpGeluInputGrad:
      TileRuleCover(plan, o.x, t.r0, t.r1, t.c0, t.c1, fp);
      TileRuleCover(plan, o.w, t.r0, t.r1, t.c0, t.c1, fp);
      break;
    case TileOpKind::kTileOpLinearWeightGrad: {
      const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), block);
      TileRuleCover(plan, o.x, b0, b1, t.r0, t.r1, fp);  // dout[:, o]
      TileRuleCover(plan, o.w, b0, b1, t.c0, t.c1, fp);  // inp[:, c]
      break;
    }
    case TileOpKind::kTileOpLinearBiasGrad: {
      const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), block);
      TileRuleCover(plan, o.x, b0, b1, t.c0, t.c1, fp);
      break;
    }
    case TileOpKind::kTileOpLayerNormInputGrad: {
      // A row's dinp reads the row's whole dout and input (its mean, variance and the two sums
      // over c) and the whole weight; the gradient it adds into, the tile's elements.
      // Narrowed: a mean or variance block its columns of the input rows; a dmean / dnmean
      // block its columns of dout, the input and the weight; the last block the tile's.
      // Over an image, as the forward's: each of the tile's runs (whole, or a block of each).
      const int64_t C = TileRuleCols(plan, o.x);
      const int64_t nb = TileRuleLayerNormBlocks(plan, o);
      if (const int64_t W = TileRuleImageNormWidth(o); W > 0 && nb == 0) {
        const auto [f0, f1] = TileRuleImageNormRuns(W, t.c0, t.c1);
        TileRuleCover(plan, o.x, t.r0, t.r1, f0, f1, fp);
        TileRuleCover(plan, o.w, t.r0, t.r1, f0, f1, fp);
        TileRuleCover(plan, o.b, 0, 1, 0, W, fp);
        break;
      }
      const TileRuleNormRuns ru = TileRuleNormRunsOf(plan, o, t);
      if (nb > 0 && block < 3 * nb) {
        const int64_t k0 = (block % nb) * kTileLinearBlock,
                      k1 = std::min(ru.C, k0 + kTileLinearBlock);
        for (int64_t jj = 0; jj < ru.nj; ++jj) {
          const int64_t f = (ru.j0 + jj) * ru.C;
          if (block >= 2 * nb) TileRuleCoverOnce(plan, o.x, t.r0, t.r1, f + k0, f + k1, fp);
          TileRuleCoverOnce(plan, o.w, t.r0, t.r1, f + k0, f + k1, fp);
        }
        if (block >= 2 * nb) TileRuleCover(plan, o.b, 0, 1, k0, k1, fp);
        break;
      }
      const int64_t c0 = nb > 0 ? t.c0 : 0, c1 = nb > 0 ? t.c1 : C;
      TileRuleCover(plan, o.x, t.r0, t.r1, c0, c1, fp);
      TileRuleCover(plan, o.w, t.r0, t.r1, c0, c1, fp);
      for (int64_t jj = 0; jj < ru.nj; ++jj) {
        const auto [w0, w1] = ru.Cols(jj, c0, c1);
        TileRuleCoverOnce(plan, o.b, 0, 1, w0, w1, fp);
      }
      if (o.v >= 0) TileRuleCover(plan, o.v, t.r0, t.r1, t.c0, t.c1, fp);
      break;
    }
    case TileOpKind::kTileOpLayerNormWeightGrad:
    case TileOpKind::kTileOpLayerNormBiasGrad: {
      // Block `block`'s rows of dout's columns c; dweight also the block's whole input rows
      // (each row's mean and variance). Narrowed dweight: a sum sub-block its columns of the
      // block's input rows; a chunk its 256 of the tile's columns of dout and the input.
      // Over an image wider than kTileImageNormWidthMax, a block is one run: narrowed dweight
      // its sum sub-blocks and chunks of that run's columns, dbias the tile's columns of it.
      // Run-relative columns [k0, k1) of the layernorm's rows [n0, n1) of `operand`.
      auto cover_rows = [&](int64_t operand, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
        if (TileRuleImageNormWidth(o) == 0) return TileRuleCover(plan, operand, n0, n1, k0, k1, fp);
        ForEachNormRow(plan, o, n0, n1, [&](int64_t row, int64_t f) {
          TileRuleCoverOnce(plan, operand, row, row + 1, f + k0, f + k1, fp);
        });
      };
      if (const TileRuleLnWeight lw = TileRuleLayerNormWeightBlocks(plan, o); lw.nb > 0) {
        const int64_t sub = block % lw.per(), C = TileRuleNormWidth(plan, o);
        const auto [b0, b1] = TileRuleNormBlockRows(plan, o, block / lw.per());
        if (sub < 2 * lw.nb) {
          const int64_t k0 = (sub % lw.nb) * kTileLinearBlock;
          cover_rows(o.w, b0, b1, k0, std::min(C, k0 + kTileLinearBlock));
        } else {
          const int64_t c0 = t.c0 + (sub - 2 * lw.nb) * kTileLinearBlock;
          const int64_t c1 = std::min(t.c1, c0 + kTileLinearBlock);
          if (c0 < c1) {
            cover_rows(o.x, b0, b1, c0, c1);
            cover_rows(o.w, b0, b1, c0, c1);
          }
        }
        break;
      }
      const auto [b0, b1] = TileRuleNormBlockRows(plan, o, block);
      const bool dweight = o.kind == TileOpKind::kTileOpLayerNormWeightGrad;
      if (TileRuleImageNormWidth(o) > kTileImageNormWidthMax) {  // dbias: one run
        cover_rows(o.x, b0, b1, t.c0, t.c1);
        break;
      }
      if (const int64_t W = TileRuleImageNormWidth(o); W > 0) {
        // The block's runs (the tile is the whole W): of dout, then of the input. Runs of
        // consecutive samples can share a tile; each is named once.
        for (int64_t operand : {o.x, dweight ? o.w : -1}) {
          if (operand == -1) continue;
          TileFootprint part;
          ForEachImageNormSpan(b0, b1, W, TileRuleCols(plan, o.x),
                               [&](int64_t b, int64_t f0, int64_t f1) {
                                 TileRuleCover(plan, operand, b, b + 1, f0, f1, part);
                               });
          for (const TileRef& r : part.tiles) {
            if (std::find(fp.tiles.begin(), fp.tiles.end(), r) == fp.tiles.end()) {
              fp.tiles.push_back(r);
            }
          }
          fp.batch_rows.insert(fp.batch_rows.end(), part.batch_rows.begin(), part.batch_rows.end());
          fp.batch_chunks.insert(fp.batch_chunks.end(), part.batch_chunks.begin(),
                                 part.batch_chunks.end());
        }
        break;
      }
      TileRuleCover(plan, o.x, b0, b1, t.c0, t.c1, fp);
      if (dweight) TileRuleCover(plan, o.w, b0, b1, 0, TileRuleCols(plan, o.w), fp);
      break;
    }
    case TileOpKind::kTileOpAdamW:
    case TileOpKind::kTileOpSgd:
      for (int64_t operand : {o.x, o.w, o.b, o.v}) {
        if (operand >= 0) TileRuleCover(plan, operand, t.r0, t.r1, t.c0, t.c1, fp);
      }
      if (o.clip_norm >= 0) TileRuleCover(plan, o.clip_norm, 0, 1, 0, 1, fp);  // its scale
      break;
    case TileOpKind::kTileOpGradSquareBlocks: {
      // Block `block` of the tile is its partial e = c0 + block: the gradient elements it sums,
      // row segment by row segment of the gradient's grid (none past the last partial).
      TileRuleSquareBlock sb;
      if (!TileRuleSquareBlockOf(plan, o, t.c0 + block, &sb) || t.c0 + block >= t.c1) break;
      for (int64_t r = sb.e0 / sb.cols; r <= (sb.e1 - 1) / sb.cols; ++r) {
        const int64_t c0 = std::max(sb.e0, r * sb.cols) - r * sb.cols;
        const int64_t c1 = std::min(sb.e1, (r + 1) * sb.cols) - r * sb.cols;
        TileRuleCover(plan, sb.grad, r, r + 1, c0, c1, fp);
      }
      break;
    }
    case TileOpKind::kTileOpGradNorm: {
      // Block k: parameter k's block partials (or one chunk of them); none for a stage without
      // parameters (a lone activation or pool), whose sum is the one it received.
      const std::vector<TileRuleNormBlock> nbs = TileRuleNormBlocks(plan, o);
      if (!nbs.empty()) {
        const TileRuleNormBlock& nb = nbs[static_cast<size_t>(block)];
        TileRuleCover(plan, o.x, 0, 1, nb.first, nb.first + nb.count, fp);
      }
      if (o.v >= 0 && block == 0) TileRuleCover(plan, o.v, 0, 1, 0, 1, fp);  // the chain's start
      break;
    }
  }
  // Attention and the block partials: a tile named twice (rectangles of one operand sharing a
  // tile: q and k of a head, two heads' rows, two row segments of a gradient) is listed once,
  // where it first appears.
  const bool attention =
      o.kind == TileOpKind::kTileOpAttention || o.kind == TileOpKind::kTileOpAttentionOut ||
      o.kind == TileOpKind::kTileOpEmbedding || o.kind == TileOpKind::kTileOpAttentionBackward ||
      o.kind == TileOpKind::kTileOpGradSquareBlocks;
  for (size_t i = 1; attention && i < fp.tiles.size();) {
    if (std::find(fp.tiles.begin(), fp.tiles.begin() + static_cast<int64_t>(i), fp.tiles[i]) !=
        fp.tiles.begin() + static_cast<int64_t>(i)) {
      fp.tiles.erase(fp.tiles.begin() + static_cast<int64_t>(i));
    } else {
      ++i;
    }
  }
  // A micro-batch's parameter gradient ends by adding its chain into the previous micro-batch's
  // accumulated gradient (pipeline.h): the last block also reads that tile.
  if (const int64_t into = TileRuleAddedInto(o);
      into >= 0 && block + 1 == std::max<int64_t>(blocks, 1)) {
    TileRuleCover(plan, into, t.r0, t.r1, t.c0, t.c1, fp);
  }
  std::sort(fp.batch_rows.begin(), fp.batch_rows.end());
  fp.batch_rows.erase(std::unique(fp.batch_rows.begin(), fp.batch_rows.end()), fp.batch_rows.end());
  std::sort(fp.batch_chunks.begin(), fp.batch_chunks.end());
  fp.batch_chunks.erase(std::unique(fp.batch_chunks.begin(), fp.batch_chunks.end()),
                        fp.batch_chunks.end());
  for (int64_t& row : fp.batch_rows) row += o.batch_offset;  // the step's batch positions
  return fp;
}

namespace {

// Block `block` of a narrowed loss or loss-gradient tile `t` (kTileSoftmaxBlock), continued from
// `partial`: ref::SoftmaxCrossEntropyForward's max, then its sum, over the block's columns in the
// same order, then (the last block) its loss, or the backward's (p - [v == target]) / B on a
// zeroed gradient for the tile's columns. `logits(v0, v1)` gives the rows' logits in columns
// [v0, v1), `targets()` their targets.
template <typename Logits, typename Targets>
std::vector<float> SoftmaxBlock(const TilePlan& plan, const TileOp& o, const TileGrid::Rect& t,
                                int64_t block, const std::vector<float>& partial, Logits&& logits,
                                Targets&& targets) {
  internal::FpEnvGuard fp_guard;
  const int64_t nb = TileRuleSoftmaxBlocks(plan), R = t.r1 - t.r0;
  const auto at = [](int64_t i) { return static_cast<size_t>(i); };
  if (block < nb) {  // the running max: m = x[0], then m = x[v] > m ? x[v] : m for v = 1..V-1
    const int64_t v0 = block * kTileSoftmaxBlock,
                  v1 = std::min(plan.classes, v0 + kTileSoftmaxBlock);
    const std::vector<float> x = logits(v0, v1);
    const int64_t W = v1 - v0;
    std::vector<float> m(at(R));
    for (int64_t r = 0; r < R; ++r) {
      float mr = block == 0 ? x[at(r * W)] : partial[at(r)];
      for (int64_t v = block == 0 ? 1 : 0; v < W; ++v) {
        mr = x[at(r * W + v)] > mr ? x[at(r * W + v)] : mr;
      }
      m[at(r)] = mr;
    }
    return m;
  }
  // The sums carry [maxima, sums, target logits].
  std::vector<float> acc(at(3 * R), 0.0f);
  if (block == nb) {
    std::copy(partial.begin(), partial.begin() + R, acc.begin());
  } else {
    acc = partial;
  }
  const std::vector<int32_t> y = targets();
  if (block < 2 * nb) {  // sum = sum + Exp(x[v] - m) for v = 0..V-1
    const int64_t v0 = (block - nb) * kTileSoftmaxBlock;
    const int64_t v1 = std::min(plan.classes, v0 + kTileSoftmaxBlock), W = v1 - v0;
    const std::vector<float> x = logits(v0, v1);
    for (int64_t r = 0; r < R; ++r) {
      const float m = acc[at(r)];
      float sum = acc[at(R + r)];
      for (int64_t v = 0; v < W; ++v) sum = sum + Exp(x[at(r * W + v)] - m);
      acc[at(R + r)] = sum;
      const int64_t target = y[at(r)];
      if (target >= v0 && target < v1) acc[at(2 * R + r)] = x[at(r * W + target - v0)];
    }
    if (block < 2 * nb - 1 || o.kind == TileOpKind::kTileOpLossGrad) return acc;
    std::vector<float> losses(at(R));  // Log(sum) - (x[target] - m)
    for (int64_t r = 0; r < R; ++r) {
      losses[at(r)] = Log(acc[at(R + r)]) - (acc[at(2 * R + r)] - acc[at(r)]);
    }
    return losses;
  }
  // The gradient's block: dlogits = 0 + (Exp(x - m) / sum - [v == target]) * (1 / B).
  const int64_t K = t.c1 - t.c0;
  const std::vector<float> x = logits(t.c0, t.c1);
  const float scale =
      MicroBatchLossScale(plan.micro_batches) / static_cast<float>(TileRuleRows(plan));
  std::vector<float> out(at(R * K));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < K; ++c) {
      const float p = Exp(x[at(r * K + c)] - acc[at(r)]) / acc[at(R + r)];
      const float ind = t.c0 + c == y[at(r)] ? 1.0f : 0.0f;
      out[at(r * K + c)] = 0.0f + (p - ind) * scale;
    }
  }
  return out;
}

}  // namespace

namespace {

// One block of a narrowed attention backward tile (TileRuleAttentionBlocks; Footprint's
// blocks), in kernels_ref.cc's AttentionBackward order. The partial: the row sums of the groups
// TileRuleBackwardSumGroups names (T each: s_t, the chain over t2 from 0 of att[t, t2] dA[t, t2],
// dA[t, t2] = the chain over i of dout[t, i] v[t2, i], 0 past the diagonal), then the tile's
// accumulators. A sum block continues the sums of its query rows over its key positions; a chain
// block continues dv[t2, i] (over t of att[t, t2] dout[t, i]), dq[t, i] (over t2 of dP[t, t2]
// k[t2, i]) and dk[t2, i] (over t of dP[t, t2] q[t, i]), dP[t, t2] = att[t, t2] (dA[t, t2] -
// s_t) (0 past the diagonal); the last applies the kernel's "dqkv += acc" (v) or "+= acc *
// scale" (q, k) on a zeroed gradient. A wide head's block is cut over the head's columns
// (TileRuleBackwardHeadBlocks): all but the last of its column blocks continue its dA dots alone.
std::vector<float> TileRuleAttentionBackwardBlock(const TilePlan& plan, const TileFootprint& fp,
                                                  const TileInputs& in, const TileOp& o,
                                                  const TileGrid::Rect& t, int64_t block,
                                                  float scale) {
  const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH, K = t.c1 - t.c0;
  const int64_t nb = TileRuleAttentionBlocks(o), n = t.numel();
  const std::vector<int64_t> groups = TileRuleBackwardSumGroups(o, t);
  const int64_t ns = static_cast<int64_t>(groups.size()) * T;
  // A wide head's column block [d0, d1) of block ob (TileRuleBackwardHeadBlocks): the dots so far
  // follow the block's partial.
  const int64_t nh = TileRuleBackwardHeadBlocks(o), ob = block / nh;
  const int64_t d0 = block % nh * kTileAttentionBackwardHeadBlock;
  const int64_t d1 = std::min(hs, d0 + kTileAttentionBackwardHeadBlock), nd = d1 - d0;
  const bool last = block % nh + 1 == nh;
  std::vector<float> st(static_cast<size_t>(ns + n), 0.0f);
  std::vector<float> dots(static_cast<size_t>(TileRuleBackwardDots(o, t, ob)), 0.0f);
  if (!in.partial.empty()) {
    std::copy(in.partial.begin(), in.partial.begin() + ns + n, st.begin());
    if (block % nh > 0) std::copy(in.partial.begin() + ns + n, in.partial.end(), dots.begin());
  }
  auto dense = [&](int64_t operand, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    return TileRuleDense(plan, fp, in, operand, r0, r1, c0, c1);
  };
  auto sum_of = [&](int64_t gr, int64_t tt) -> float& {
    const int64_t g = std::find(groups.begin(), groups.end(), gr) - groups.begin();
    return st[static_cast<size_t>(g * T + tt)];
  };
  // Continues the dots dA[tt, t2] (0 past the diagonal) of rows [r0, r1) and keys [c0, c1) at
  // `d` from dout's rows (g) and v's rows (v) in the block's nd columns (finished by the last).
  auto continue_dots = [&](const std::vector<float>& g, const std::vector<float>& v, int64_t r0,
                           int64_t r1, int64_t c0, int64_t c1, float* d) {
    for (int64_t tt = r0; tt < r1; ++tt) {
      for (int64_t t2 = c0; t2 < std::min(c1, tt + 1); ++t2) {
        float& x = d[(tt - r0) * (c1 - c0) + t2 - c0];
        for (int64_t i = 0; i < nd; ++i) {
          x = __builtin_fmaf(g[static_cast<size_t>((tt - r0) * nd + i)],
                             v[static_cast<size_t>((t2 - c0) * nd + i)], x);
        }
      }
    }
  };
  int64_t off = 0;  // the next group's or segment's dots
  if (ob < nb * nb) {
    const int64_t q0 = (ob / nb) * kTileAttentionBlock;
    const int64_t q1 = std::min(T, q0 + kTileAttentionBlock);
    const int64_t s0 = (ob % nb) * kTileAttentionBlock;
    const int64_t s1 = std::min(T, s0 + kTileAttentionBlock), ncol = s1 - s0;
    for (int64_t gr : groups) {
      const int64_t base = (gr / NH) * T, hc = (gr % NH) * hs;
      const std::vector<float> g = dense(o.x, base + q0, base + q1, hc + d0, hc + d1);
      const std::vector<float> v =
          dense(o.w, base + s0, base + s1, 2 * C + hc + d0, 2 * C + hc + d1);
      float* d = dots.data() + off;
      off += (q1 - q0) * ncol;
      continue_dots(g, v, q0, q1, s0, s1, d);
      if (!last) continue;
      const std::vector<float> a = dense(o.b, gr * T + q0, gr * T + q1, s0, s1);
      for (int64_t tt = q0; tt < q1; ++tt) {
        float& s = sum_of(gr, tt);
        for (int64_t t2 = s0; t2 < s1; ++t2) {
          const size_t e = static_cast<size_t>((tt - q0) * ncol + t2 - s0);
          s = __builtin_fmaf(a[e], t2 > tt ? 0.0f : d[e], s);
        }
      }
    }
    if (!last) st.insert(st.end(), dots.begin(), dots.end());
    return st;
  }
  const int64_t k0 = (ob - nb * nb) * kTileAttentionBlock;
  const int64_t k1 = std::min(T, k0 + kTileAttentionBlock), nk = k1 - k0;
  float* acc = st.data() + ns;
  ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t p0, int64_t p1) {
    const int64_t base = b * T, np = p1 - p0;
    ForEachHeadSegment(t.c0, t.c1, C, hs, [&](int64_t part, int64_t h, int64_t i0, int64_t i1) {
      const int64_t gr = b * NH + h, arow = gr * T, hc = h * hs, ni = i1 - i0;
      auto at = [&](int64_t p, int64_t i) -> float& {
        return acc[(base + p - t.r0) * K + part * C + hc + i - t.c0];
      };
      if (part == 2) {  // dv[p, i]: over the block's queries tt
        if (!last) return;
        const std::vector<float> a = dense(o.b, arow + k0, arow + k1, p0, p1);  // (nk, np)
        const std::vector<float> g = dense(o.x, base + k0, base + k1, hc + i0, hc + i1);
        for (int64_t p = p0; p < p1; ++p) {
          for (int64_t i = i0; i < i1; ++i) {
            float& x = at(p, i);
            for (int64_t tt = 0; tt < nk; ++tt) {
              x = __builtin_fmaf(a[static_cast<size_t>(tt * np + p - p0)],
                                 g[static_cast<size_t>(tt * ni + i - i0)], x);
            }
          }
        }
        return;
      }
      // dP's query rows [r0, r1) and key positions [c0, c1): q's rows and the block's keys, or
      // the block's queries and k's rows.
      const int64_t r0 = part == 0 ? p0 : k0, r1 = part == 0 ? p1 : k1;
      const int64_t c0 = part == 0 ? k0 : p0, c1 = part == 0 ? k1 : p1;
      const int64_t nr = r1 - r0, nc = c1 - c0;
      const std::vector<float> g = dense(o.x, base + r0, base + r1, hc + d0, hc + d1);
      const std::vector<float> v =
          dense(o.w, base + c0, base + c1, 2 * C + hc + d0, 2 * C + hc + d1);
      float* d = dots.data() + off;
      off += nr * nc;
      continue_dots(g, v, r0, r1, c0, c1, d);
      if (!last) return;
      const std::vector<float> a = dense(o.b, arow + r0, arow + r1, c0, c1);  // (nr, nc)
      const int64_t other = part == 0 ? C : 0;
      const std::vector<float> kq =
          dense(o.w, base + k0, base + k1, other + hc + i0, other + hc + i1);  // (nk, ni)
      std::vector<float> dp(static_cast<size_t>(nr * nc));
      for (int64_t tt = r0; tt < r1; ++tt) {
        const float s = sum_of(gr, tt);
        for (int64_t t2 = c0; t2 < c1; ++t2) {
          const size_t e = static_cast<size_t>((tt - r0) * nc + t2 - c0);
          dp[e] = t2 <= tt ? a[e] * (d[e] - s) : 0.0f;
        }
      }
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t i = i0; i < i1; ++i) {
          float& x = at(p, i);
          for (int64_t j = 0; j < nk; ++j) {  // dq: over the block's keys; dk: its queries
            const float dd = part == 0 ? dp[static_cast<size_t>((p - p0) * nc + j)]
                                       : dp[static_cast<size_t>(j * nc + p - p0)];
            x = __builtin_fmaf(dd, kq[static_cast<size_t>(j * ni + i - i0)], x);
          }
        }
      }
    });
  });
  if (!last) {
    st.insert(st.end(), dots.begin(), dots.end());
    return st;
  }
  if (ob + 1 < nb * nb + nb) return st;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    const bool v_col = (t.c0 + e % K) / C == 2;
    out[static_cast<size_t>(e)] = v_col ? 0.0f + acc[e] : 0.0f + acc[e] * scale;
  }
  return out;
}

}  // namespace

Result<std::vector<float>> RecomputeTile(const TilePlan& plan, int64_t op, int64_t tile,
                                         int64_t block, int64_t step, const TileInputs& in) {
  ML_ASSIGN_OR_RETURN(TileFootprint fp, Footprint(plan, op, tile, block));
  // The rows of the operator's micro-batch, from here on.
  for (int64_t& row : fp.batch_rows) row -= plan.ops[static_cast<size_t>(op)].batch_offset;
  const std::string what =
      "tile rule: " + TileRuleOpName(plan, op) + " tile " + std::to_string(tile);
  // The inputs must be exactly the footprint's, each of its tile's size.
  if (in.tiles.size() != fp.tiles.size()) {
    return InvalidArgument(what + ": " + std::to_string(in.tiles.size()) +
                           " input tiles given, the footprint has " +
                           std::to_string(fp.tiles.size()));
  }
  for (size_t i = 0; i < fp.tiles.size(); ++i) {
    const TileGrid& g = plan.ops[static_cast<size_t>(fp.tiles[i].op)].grid;
    const int64_t want = g.TileRect(fp.tiles[i].tile).numel();
    if (static_cast<int64_t>(in.tiles[i].size()) != want) {
      return InvalidArgument(
          what + ": input tile " + std::to_string(i) + " (tile " +
          std::to_string(fp.tiles[i].tile) + " of " + TileRuleOpName(plan, fp.tiles[i].op) +
          ") has " + std::to_string(in.tiles[i].size()) + " floats, not " + std::to_string(want));
    }
  }
  if (plan.tokens) {
    if (in.tokens.size() != fp.batch_rows.size() || in.y.size() != fp.batch_rows.size() ||
        !in.x.empty()) {
      return InvalidArgument(what + ": " + std::to_string(in.tokens.size()) + " tokens and " +
                             std::to_string(in.y.size()) + " targets given, the footprint reads " +
                             std::to_string(fp.batch_rows.size()) + " rows' (and no examples)");
    }
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= plan.classes || in.y[i] < 0 ||
          in.y[i] >= plan.classes) {
        return InvalidArgument(what + ": row " + std::to_string(fp.batch_rows[i]) + " has token " +
                               std::to_string(in.tokens[i]) + " and target " +
                               std::to_string(in.y[i]) + "; the vocabulary has " +
                               std::to_string(plan.classes));
      }
    }
  } else if (in.x.size() != fp.batch_rows.size() || in.y.size() != fp.batch_rows.size() ||
             !in.tokens.empty()) {
    return InvalidArgument(what + ": " + std::to_string(in.x.size()) + " examples given, the " +
                           "footprint reads " + std::to_string(fp.batch_rows.size()));
  }
  for (size_t i = 0; !plan.tokens && i < in.x.size(); ++i) {
    if (static_cast<int64_t>(in.x[i].size()) != plan.input_size || in.y[i] < 0 ||
        in.y[i] >= plan.classes) {
      return InvalidArgument(
          what + ": example " + std::to_string(i) + " has " + std::to_string(in.x[i].size()) +
          " floats and class " + std::to_string(in.y[i]) + "; the model takes " +
          std::to_string(plan.input_size) + " and " + std::to_string(plan.classes) + " classes");
    }
  }
  const TileOp& o = plan.ops[static_cast<size_t>(op)];
  const TileGrid::Rect t = o.grid.TileRect(tile);
  const int64_t R = t.r1 - t.r0, K = t.c1 - t.c0;
  const int64_t blocks = ReductionBlocks(plan, op);
  const int64_t partial_size = TileRulePartialSize(plan, o, t, block);
  if (blocks > 0 && !in.partial.empty() &&
      static_cast<int64_t>(in.partial.size()) != partial_size) {
    return InvalidArgument(what + ": the partial sum has " + std::to_string(in.partial.size()) +
                           " floats, block " + std::to_string(block) + "'s " +
                           std::to_string(partial_size));
  }
  if ((blocks == 0 || block == 0) && !in.partial.empty()) {
    return InvalidArgument(what + ": block 0 starts from the chain's start; no partial sum");
  }
  if (blocks > 0 && block > 0 && in.partial.empty()) {
    return InvalidArgument(what + ": block " + std::to_string(block) +
                           " continues from the agreed partial sum; none given");
  }
  auto dense = [&](int64_t operand, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    return TileRuleDense(plan, fp, in, operand, r0, r1, c0, c1);
  };
  auto targets = [&](int64_t r0, int64_t r1) {
    std::vector<int32_t> y;
    for (size_t i = 0; i < fp.batch_rows.size(); ++i) {
      if (fp.batch_rows[i] >= r0 && fp.batch_rows[i] < r1) y.push_back(in.y[i]);
    }
    return y;
  };
  // The end of a parameter gradient's chain: "grad += sum" on a zeroed gradient (0 + sum), or on
  // the previous micro-batch's accumulated gradient.
  const int64_t added_into = TileRuleAddedInto(o);
  const std::vector<float> prior = added_into >= 0 && block + 1 == std::max<int64_t>(blocks, 1)
                                       ? dense(added_into, t.r0, t.r1, t.c0, t.c1)
                                       : std::vector<float>(static_cast<size_t>(t.numel()), 0.0f);
  std::vector<float> out(static_cast<size_t>(t.numel()), 0.0f);
  // A narrowed layernorm's row reductions (TileRuleLayerNormBlocks), blocks 0..2nb-1 of input
  // operand `xop`, in ref::LayerNormForward's order: m = m + x from 0, then m / C, then
  // v = fma(x - m, x - m, v) from 0, for each of the RN rows the tile normalises (its R rows'
  // runs: TileRuleNormRuns). Returns the partial after the block.
  const int64_t ln_nb = TileRuleLayerNormBlocks(plan, o);
  auto ln_stats_block = [&](int64_t xop) {
    internal::FpEnvGuard fp_guard;
    const TileRuleNormRuns ru = TileRuleNormRunsOf(plan, o, t);
    const int64_t C = ru.C, R = (t.r1 - t.r0) * ru.nj;  // R: the RN rows, run by run
    const int64_t k0 = (block % ln_nb) * kTileLinearBlock, k1 = std::min(C, k0 + kTileLinearBlock);
    const int64_t W = k1 - k0;
    std::vector<float> x;
    for (int64_t jj = 0; jj < ru.nj; ++jj) {
      const int64_t f = (ru.j0 + jj) * C;
      const std::vector<float> run = dense(xop, t.r0, t.r1, f + k0, f + k1);
      x.insert(x.end(), run.begin(), run.end());
    }
    std::vector<float> st;
    if (block < ln_nb) {
      st = block == 0 ? std::vector<float>(static_cast<size_t>(R), 0.0f) : in.partial;
      for (int64_t r = 0; r < R; ++r) {
        float m = st[static_cast<size_t>(r)];
        for (int64_t k = 0; k < W; ++k) m = m + x[static_cast<size_t>(r * W + k)];
        st[static_cast<size_t>(r)] = m;
      }
      return st;
    }
    if (block == ln_nb) {
      st.assign(static_cast<size_t>(2 * R), 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        st[static_cast<size_t>(r)] = in.partial[static_cast<size_t>(r)] / static_cast<float>(C);
      }
    } else {
      st = in.partial;
    }
    for (int64_t r = 0; r < R; ++r) {
      const float m = st[static_cast<size_t>(r)];
      float v = st[static_cast<size_t>(R + r)];
      for (int64_t k = 0; k < W; ++k) {
        const float xm = x[static_cast<size_t>(r * W + k)] - m;
        v = __builtin_fmaf(xm, xm, v);
      }
      st[static_cast<size_t>(R + r)] = v;
    }
    return st;
  };
  switch (o.kind) {
    case TileOpKind::kTileOpState:
    case TileOpKind::kTileOpOpaque:
      return FailedPrecondition(what + ": not recomputed by tile");
    case TileOpKind::kTileOpLinear: {
      const int64_t C = TileRuleCols(plan, o.x);
      if (blocks == 0) {
        std::vector<float> x = dense(o.x, t.r0, t.r1, 0, C);
        std::vector<float> w = dense(o.w, t.c0, t.c1, 0, C);
        std::vector<float> b;
        if (o.b >= 0) b = dense(o.b, 0, 1, t.c0, t.c1);
        ref::LinearForward(out.data(), x.data(), w.data(), o.b >= 0 ? b.data() : nullptr, R, C, K);
        break;
      }
      // One block of the chain over c (kernels.h: acc = fma(inp[b,c], weight[o,c], acc) from
      // bias[o], or 0), continued from the agreed partial; the last block's accumulator is out.
      internal::FpEnvGuard fp_guard;
      const int64_t k0 = block * kTileLinearBlock, k1 = std::min(C, k0 + kTileLinearBlock);
      const int64_t W = k1 - k0;
      std::vector<float> x = dense(o.x, t.r0, t.r1, k0, k1);
      std::vector<float> w = dense(o.w, t.c0, t.c1, k0, k1);
      if (block == 0) {
        if (o.b >= 0) {
          std::vector<float> b = dense(o.b, 0, 1, t.c0, t.c1);
          for (int64_t r = 0; r < R; ++r) std::copy(b.begin(), b.end(), out.begin() + r * K);
        }
      } else {
        out = in.partial;
      }
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < K; ++c) {
          float a = out[static_cast<size_t>(r * K + c)];
          for (int64_t k = 0; k < W; ++k) a = __builtin_fmaf(x[r * W + k], w[c * W + k], a);
          out[static_cast<size_t>(r * K + c)] = a;
        }
      }
      break;
    }
    case TileOpKind::kTileOpRelu: {
      std::vector<float> x = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      ref::ReluForward(out.data(), x.data(), t.numel());
      break;
    }
    case TileOpKind::kTileOpGelu: {
      std::vector<float> x = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      ref::GeluForward(out.data(), x.data(), t.numel());
      break;
    }
    case TileOpKind::kTileOpDropout:
    case TileOpKind::kTileOpDropoutInputGrad: {
      // kernels_ref.cc's DropoutForward (out = x * mask) and DropoutBackward on a zeroed
      // gradient (0 + dout * mask), element i of the micro-batch's tensor drawing its mask from
      // the step's seed and the layer's stream alone; p = 0 passes the input through.
      internal::FpEnvGuard fp_guard;
      const std::vector<float> x = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      const float p = o.dropout_p;
      if (!(p > 0.0f)) {
        out = x;
        break;
      }
      const float keep_scale = 1.0f / (1.0f - p);
      const uint64_t stream =
          DropoutStream(static_cast<uint64_t>(step), static_cast<uint64_t>(o.conv[0]),
                        static_cast<uint64_t>(o.conv[1]));
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < K; ++c) {
          const uint64_t i = static_cast<uint64_t>((t.r0 + r) * o.grid.cols + t.c0 + c);
          const float mask = internal::DropoutMaskAt(i, p, keep_scale, plan.dropout_seed, stream);
          const size_t e = static_cast<size_t>(r * K + c);
          out[e] = o.kind == TileOpKind::kTileOpDropout ? x[e] * mask : 0.0f + x[e] * mask;
        }
      }
      break;
    }
    case TileOpKind::kTileOpResidual: {
      std::vector<float> a = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      std::vector<float> b = dense(o.w, t.r0, t.r1, t.c0, t.c1);
      ref::ResidualForward(out.data(), a.data(), b.data(), t.numel());
      break;
    }
    case TileOpKind::kTileOpAttention: {
      if (blocks > 0) return TileRuleAttentionBlock(plan, fp, in, o, t, block);
      // Per (b, h) group of the tile's rows t0..t1: the reference kernel on the sequence's first
      // t1 positions of head h alone (B = 1, NH = 1, C = hs: the same scale and order; a row
      // reads only q of its own position and k of positions <= it; v is not read for att).
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t gr, int64_t t0, int64_t t1) {
        const int64_t b = gr / NH, h = gr % NH;
        const std::vector<float> q = dense(o.x, b * T + t0, b * T + t1, h * hs, (h + 1) * hs);
        const std::vector<float> k = dense(o.x, b * T, b * T + t1, C + h * hs, C + (h + 1) * hs);
        std::vector<float> qkv(static_cast<size_t>(t1 * 3 * hs), 0.0f);
        for (int64_t tt = 0; tt < t1; ++tt) {
          if (tt >= t0) {
            std::copy(q.begin() + (tt - t0) * hs, q.begin() + (tt - t0 + 1) * hs,
                      qkv.begin() + tt * 3 * hs);
          }
          std::copy(k.begin() + tt * hs, k.begin() + (tt + 1) * hs, qkv.begin() + tt * 3 * hs + hs);
        }
        std::vector<float> y(static_cast<size_t>(t1 * hs)), pre(static_cast<size_t>(t1 * t1)),
            a(static_cast<size_t>(t1 * t1));
        ref::AttentionForward(y.data(), pre.data(), a.data(), qkv.data(), 1, t1, hs, 1);
        for (int64_t tt = t0; tt < t1; ++tt) {
          for (int64_t c = t.c0; c < t.c1; ++c) {
            out[static_cast<size_t>((gr * T + tt - t.r0) * K + (c - t.c0))] =
                c < t1 ? a[static_cast<size_t>(tt * t1 + c)] : 0.0f;
          }
        }
      });
      break;
    }
    case TileOpKind::kTileOpAttentionOut: {
      // kernels.h: out[b, t, h * hs + i] = chain over t2 < T of fma(att[(b, h, t), t2],
      // v[(b, t2), h * hs + i], acc) from 0. Narrowed: the block's positions t2 in [k0, k1),
      // continued from the agreed accumulators.
      internal::FpEnvGuard fp_guard;
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      const int64_t k0 = blocks > 0 ? block * kTileAttentionBlock : 0;
      const int64_t k1 = blocks > 0 ? std::min(T, k0 + kTileAttentionBlock) : T, W = k1 - k0;
      if (block > 0) out = in.partial;
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t t0, int64_t t1) {
        const std::vector<float> v = dense(o.w, b * T + k0, b * T + k1, 2 * C + t.c0, 2 * C + t.c1);
        for (int64_t h = t.c0 / hs; h <= (t.c1 - 1) / hs; ++h) {
          const int64_t gr = b * NH + h;
          const std::vector<float> a = dense(o.x, gr * T + t0, gr * T + t1, k0, k1);
          for (int64_t tt = t0; tt < t1; ++tt) {
            for (int64_t c = std::max(t.c0, h * hs); c < std::min(t.c1, (h + 1) * hs); ++c) {
              float acc = out[static_cast<size_t>((b * T + tt - t.r0) * K + (c - t.c0))];
              for (int64_t t2 = k0; t2 < k1; ++t2) {
                acc = __builtin_fmaf(a[static_cast<size_t>((tt - t0) * W + t2 - k0)],
                                     v[static_cast<size_t>((t2 - k0) * K + (c - t.c0))], acc);
              }
              out[static_cast<size_t>((b * T + tt - t.r0) * K + (c - t.c0))] = acc;
            }
          }
        }
      });
      break;
    }
    case TileOpKind::kTileOpLayerNorm: {
      if (const int64_t W = TileRuleImageNormWidth(o); W > 0 && ln_nb == 0) {
        // The reference kernel over the whole runs of the tile's rows (a run's result depends on
        // that run alone, and the whole weight and bias); the tile's columns are the recorded
        // bits.
        const auto [f0, f1] = TileRuleImageNormRuns(W, t.c0, t.c1);
        const int64_t L = f1 - f0, N = R * (L / W);
        const std::vector<float> x = dense(o.x, t.r0, t.r1, f0, f1);
        const std::vector<float> w = dense(o.w, 0, 1, 0, W), b = dense(o.b, 0, 1, 0, W);
        std::vector<float> y(static_cast<size_t>(R * L)), mean(static_cast<size_t>(N)),
            rstd(static_cast<size_t>(N));
        ref::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                              W);
        for (int64_t r = 0; r < R; ++r) {
          std::copy(y.begin() + r * L + (t.c0 - f0), y.begin() + r * L + (t.c1 - f0),
                    out.begin() + r * K);
        }
        break;
      }
      if (ln_nb > 0 && block < 2 * ln_nb) {
        out = ln_stats_block(o.x);
        break;
      }
      if (ln_nb > 0) {
        // The last block: the rows' mean and variance from the agreed partial, then the
        // kernel's fma((x - m) * s, weight, bias) over the tile's columns (column c of run j
        // reads weight and bias c - j C).
        internal::FpEnvGuard fp_guard;
        const TileRuleNormRuns ru = TileRuleNormRunsOf(plan, o, t);
        const int64_t C = ru.C, RN = R * ru.nj;
        const std::vector<float> x = dense(o.x, t.r0, t.r1, t.c0, t.c1);
        std::vector<float> w, b;  // the K columns' weights and biases
        for (int64_t jj = 0; jj < ru.nj; ++jj) {
          const auto [w0, w1] = ru.Cols(jj, t.c0, t.c1);
          const std::vector<float> wj = dense(o.w, 0, 1, w0, w1), bj = dense(o.b, 0, 1, w0, w1);
          w.insert(w.end(), wj.begin(), wj.end());
          b.insert(b.end(), bj.begin(), bj.end());
        }
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t c = 0; c < K; ++c) {
            const int64_t sr = ((t.c0 + c) / C - ru.j0) * R + r;  // its row's statistic
            const float m = in.partial[static_cast<size_t>(sr)];
            const float v = in.partial[static_cast<size_t>(RN + sr)] / static_cast<float>(C);
            const float s = 1.0f / __builtin_sqrtf(v + internal::kLayerNormEps);
            const size_t i = static_cast<size_t>(r * K + c);
            out[i] = __builtin_fmaf((x[i] - m) * s, w[static_cast<size_t>(c)],
                                    b[static_cast<size_t>(c)]);
          }
        }
        break;
      }
      // The reference kernel over the tile's whole rows (a row's result depends on that row
      // alone), with weight and bias zero outside the tile's columns (column c reads only its
      // own); the tile's columns are the recorded bits.
      const int64_t C = TileRuleCols(plan, o.x);
      std::vector<float> x = dense(o.x, t.r0, t.r1, 0, C);
      std::vector<float> w(static_cast<size_t>(C), 0.0f), b(static_cast<size_t>(C), 0.0f);
      const std::vector<float> wt = dense(o.w, 0, 1, t.c0, t.c1);
      const std::vector<float> bt = dense(o.b, 0, 1, t.c0, t.c1);
      std::copy(wt.begin(), wt.end(), w.begin() + t.c0);
      std::copy(bt.begin(), bt.end(), b.begin() + t.c0);
      std::vector<float> rows(static_cast<size_t>(R * C)), mean(static_cast<size_t>(R)),
          rstd(static_cast<size_t>(R));
      ref::LayerNormForward(rows.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R,
                            C);
      for (int64_t r = 0; r < R; ++r) {
        std::copy(rows.begin() + r * C + t.c0, rows.begin() + r * C + t.c1, out.begin() + r * K);
      }
      break;
    }
    case TileOpKind::kTileOpMaxPool: {
      // kernels.h: the window's first element, replaced by every later one that is greater.
      const int64_t H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
      const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
      // Only the block's piece's outputs are computed (TileRuleConvPieceOf); the others keep the
      // partial (0 before the first piece). Only the piece's rows of the input rows its outputs'
      // windows cover are read (a first layer's: one example's rows of 2,000 floats, not the
      // tile's 32).
      const TileRuleConvPiece pc = TileRuleConvPieceOf(o, t, blocks, block);
      const bool any = pc.r0 < pc.r1 && pc.c0 < pc.c1;
      const TileRuleConvSpan cs = TileRuleConvOf(o, any ? pc.c0 : t.c0, any ? pc.c1 : t.c1);
      const int64_t IH = cs.ih1 - cs.ih0;
      const int64_t q = TileRulePoolRowChunk(o);
      std::vector<std::vector<float>> chan;  // per channel: (pc.r1 - pc.r0, IH, W)
      for (int64_t c = cs.oc0; any && c < cs.oc1; ++c) {
        chan.push_back(dense(o.x, pc.r0, pc.r1, (c * H + cs.ih0) * W, (c * H + cs.ih1) * W));
      }
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t jj = 0; jj < K; ++jj) {
          const int64_t j = t.c0 + jj, c = j / (OH * OW), oh = (j % (OH * OW)) / OW, ow = j % OW;
          if (t.r0 + r < pc.r0 || t.r0 + r >= pc.r1 || j < pc.c0 || j >= pc.c1) {
            const size_t e = static_cast<size_t>(r * K + jj);
            out[e] = block > 0 ? in.partial[e] : 0.0f;
            continue;
          }
          const std::vector<float>& x = chan[static_cast<size_t>(c - cs.oc0)];
          const int64_t pr = t.r0 + r - pc.r0;
          auto at = [&](int64_t ih, int64_t iw) { return x[(pr * IH + ih - cs.ih0) * W + iw]; };
          // A window past 25 rows: the block's chunk of rows, from the running maximum the
          // partial holds after the chunks before it.
          const int64_t kh0 = pc.pair_block * q, kh1 = std::min(k, kh0 + q);
          float best = kh0 == 0 ? at(oh * s, ow * s) : in.partial[static_cast<size_t>(r * K + jj)];
          for (int64_t kh = kh0; kh < kh1; ++kh) {
            for (int64_t kw = 0; kw < k; ++kw) {
              const float v = at(oh * s + kh, ow * s + kw);
              if (v > best) best = v;
            }
          }
          out[static_cast<size_t>(r * K + jj)] = best;
        }
      }
      break;
    }
    case TileOpKind::kTileOpConv: {
      // kernels.h: out[b,oc,oh,ow] = chain over (c, kh, kw) of fma(x, or 0 in the padding,
      // w[oc,c,kh,kw], acc) from bias[oc] (or 0); narrowed: its pairs (c, kh) [q0, q1)
      // (TileRuleConvPairs), continued from the agreed partial.
      internal::FpEnvGuard fp_guard;
      const int64_t H = o.conv[1], W = o.conv[2], KH = o.conv[4], KW = o.conv[5];
      const int64_t s = o.conv[6], pad = o.conv[7];
      const int64_t OH = (H + 2 * pad - KH) / s + 1, OW = (W + 2 * pad - KW) / s + 1;
      const TileRuleConvSpan cs = TileRuleConvOf(o, t.c0, t.c1);
      const auto [q0, q1] = TileRuleConvPairs(o, blocks, block);
      // Only the block's piece's outputs move (TileRuleConvPieceOf); the others keep the partial.
      const TileRuleConvPiece pc = TileRuleConvPieceOf(o, t, blocks, block);
      const int64_t cb0 = q0 / KH, cb1 = (q1 - 1) / KH + 1;
      const int64_t NC = cb1 - cb0, IH = cs.ih1 - cs.ih0;
      // The input rows [r0, r1) over input rows [ih0, ih1) of channels [cb0, cb1): (R, NC, IH, W).
      std::vector<float> x(static_cast<size_t>(R * NC * IH * W), 0.0f);
      for (int64_t c = cb0; c < cb1; ++c) {
        const int64_t col0 = (c * H + cs.ih0) * W, col1 = (c * H + cs.ih1) * W;
        std::vector<float> part = dense(o.x, t.r0, t.r1, col0, col1);
        for (int64_t r = 0; r < R; ++r) {
          std::copy(part.begin() + r * IH * W, part.begin() + (r + 1) * IH * W,
                    x.begin() + (r * NC + (c - cb0)) * IH * W);
        }
      }
      const int64_t KK = KH * KW, WC = NC * KK;
      std::vector<float> w = dense(o.w, cs.oc0, cs.oc1, cb0 * KK, cb1 * KK);
      std::vector<float> b;
      if (o.b >= 0 && pc.pair_block == 0) b = dense(o.b, 0, 1, cs.oc0, cs.oc1);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t jj = 0; jj < K; ++jj) {
          const int64_t j = t.c0 + jj, oc = j / (OH * OW), oh = (j % (OH * OW)) / OW, ow = j % OW;
          const size_t e = static_cast<size_t>(r * K + jj);
          if (t.r0 + r < pc.r0 || t.r0 + r >= pc.r1 || j < pc.c0 || j >= pc.c1) {
            out[e] = block > 0 ? in.partial[e] : 0.0f;
            continue;
          }
          float acc = pc.pair_block > 0 ? in.partial[e] : (b.empty() ? 0.0f : b[oc - cs.oc0]);
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t c = q / KH, kh = q % KH;
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t ih = oh * s - pad + kh, iw = ow * s - pad + kw;
              const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
              const float xv =
                  inside ? x[((r * NC + (c - cb0)) * IH + (ih - cs.ih0)) * W + iw] : 0.0f;
              const float wv = w[(oc - cs.oc0) * WC + (c - cb0) * KK + kh * KW + kw];
              acc = __builtin_fmaf(xv, wv, acc);
            }
          }
          out[e] = acc;
        }
      }
      break;
    }
    case TileOpKind::kTileOpConvInputGrad: {
      // kernels.h: dinp[b,c,ih,iw] += the chain over (oc, kh, kw) from 0 of fma(g, w[oc,c,kh,kw],
      // acc), g = dout[b,oc,oh,ow] where ih = oh * s - pad + kh (and iw likewise) has a solution
      // in range, else 0. Narrowed: its pairs (oc, kh) [q0, q1) (TileRuleConvPairs), continued
      // from the agreed partial; after the last, "dinp += acc" on a zeroed gradient.
      internal::FpEnvGuard fp_guard;
      const int64_t C = o.conv[0], H = o.conv[1], W = o.conv[2];
      const int64_t KH = o.conv[4], KW = o.conv[5], s = o.conv[6], pad = o.conv[7];
      const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o), KK = KH * KW;
      const TileRulePlaneSpan ps = TileRulePlanesOf(C, H, W, t.c0, t.c1);
      const auto [oh0, oh1] = TileRuleWindowRows(o, ps.h0, ps.h1);
      const auto [q0, q1] = TileRuleConvPairs(o, blocks, block);
      const int64_t ob0 = q0 / KH, ob1 = (q1 - 1) / KH + 1;
      const int64_t NR = oh1 - oh0, WC = (ps.p1 - ps.p0) * KK;
      std::vector<std::vector<float>> d;  // per output channel of the block: (R, NR, OW)
      for (int64_t oc = ob0; oc < ob1; ++oc) {
        d.push_back(dense(o.x, t.r0, t.r1, (oc * OH + oh0) * OW, (oc * OH + oh1) * OW));
      }
      const std::vector<float> w = dense(o.w, ob0, ob1, ps.p0 * KK, ps.p1 * KK);
      if (block > 0) out = in.partial;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t jj = 0; jj < K; ++jj) {
          const int64_t j = t.c0 + jj, c = j / (H * W), ih = (j % (H * W)) / W, iw = j % W;
          float acc = out[static_cast<size_t>(r * K + jj)];
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t oc = q / KH, kh = q % KH;
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t th = ih + pad - kh, tw = iw + pad - kw;
              float g = 0.0f;
              if (th >= 0 && tw >= 0 && th % s == 0 && tw % s == 0 && th / s < OH && tw / s < OW) {
                g = d[static_cast<size_t>(oc - ob0)]
                     [static_cast<size_t>((r * NR + th / s - oh0) * OW + tw / s)];
              }
              acc = __builtin_fmaf(
                  g, w[static_cast<size_t>((oc - ob0) * WC + (c - ps.p0) * KK + kh * KW + kw)],
                  acc);
            }
          }
          out[static_cast<size_t>(r * K + jj)] = acc;
        }
      }
      if (block + 1 == std::max<int64_t>(blocks, 1)) {
        for (float& a : out) a = 0.0f + a;
      }
      break;
    }
    case TileOpKind::kTileOpMaxPoolInputGrad: {
      // kernels.h: dinp[argmax[i]] += dout[i] over the outputs i in increasing order, on a zeroed
      // gradient, argmax[i] being the window's first element replaced by every later greater one
      // (the forward's scan): input (c, ih, iw) adds, from 0, dout of the windows reaching it
      // whose argmax it is, in increasing (oh, ow).
      internal::FpEnvGuard fp_guard;
      const int64_t C = o.conv[0], H = o.conv[1], W = o.conv[2], k = o.conv[4], s = o.conv[6];
      const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o);
      if (o.window_chain) {
        // The chain over the outputs reaching the tile (TileRulePoolChainBlockOf): the block's
        // output, by the forward's scan, adds its dout into its argmax where that is an element
        // of the block's run; every other element keeps the agreed accumulator (0 before block 0).
        // Past 25 rows a block is a chunk of the window's rows: the partial carries, after the
        // accumulators, each row's running maximum and its index in the window (kh k + kw), and
        // dout is added after the last chunk.
        const int64_t rc = TileRulePoolRowChunks(o), q = TileRulePoolRowChunk(o), n = t.numel();
        const int64_t kh0 = block % rc * q, kh1 = std::min(k, kh0 + q);
        if (block > 0) out = in.partial;
        out.resize(static_cast<size_t>(n + (rc > 1 ? 2 * R : 0)), 0.0f);
        const TileRulePoolChainBlock pb = TileRulePoolChainBlockOf(o, t, block / rc);
        // The block's outputs in increasing (oh, ow) (TileRulePoolChainSlots: a group of them;
        // past 25 rows, one).
        for (int64_t oh = pb.oh0; !pb.empty && oh < pb.oh1; ++oh) {
          for (int64_t ow = pb.ow0; ow < pb.ow1; ++ow) {
            const int64_t f = (pb.c * OH + oh) * OW + ow;
            const std::vector<float> d =
                kh1 == k ? dense(o.x, t.r0, t.r1, f, f + 1) : std::vector<float>();
            std::vector<std::vector<float>> win;  // the chunk's rows of the window: (R, k) each
            for (int64_t kh = kh0; kh < kh1; ++kh) {
              const int64_t x0 = (pb.c * H + oh * s + kh) * W + ow * s;
              win.push_back(dense(o.w, t.r0, t.r1, x0, x0 + k));
            }
            for (int64_t r = 0; r < R; ++r) {
              float& run_best = rc > 1 ? out[static_cast<size_t>(n + r)] : out[0];
              float& run_at = rc > 1 ? out[static_cast<size_t>(n + R + r)] : out[0];
              float best = kh0 == 0 ? win[0][static_cast<size_t>(r * k)] : run_best;
              int64_t at = kh0 == 0 ? 0 : static_cast<int64_t>(run_at);
              for (int64_t kh = kh0; kh < kh1; ++kh) {
                for (int64_t kw = 0; kw < k; ++kw) {
                  const float v =
                      win[static_cast<size_t>(kh - kh0)][static_cast<size_t>(r * k + kw)];
                  if (v > best) {
                    best = v;
                    at = kh * k + kw;
                  }
                }
              }
              if (kh1 < k) {  // the window goes on in the next block
                run_best = best;
                run_at = static_cast<float>(at);
                continue;
              }
              if (rc > 1) run_best = run_at = 0.0f;
              const int64_t ih = oh * s + at / k, iw = ow * s + at % k;
              if (ih != pb.ih || iw < pb.iw0 || iw >= pb.iw1) continue;
              float& acc = out[static_cast<size_t>(r * K + pb.col0 + iw - pb.iw0)];
              acc = acc + d[static_cast<size_t>(r)];
            }
          }
        }
        if (block + 1 == blocks) out.resize(static_cast<size_t>(n));
        break;
      }
      const TileRulePlaneSpan ps = TileRulePlanesOf(C, H, W, t.c0, t.c1);
      struct Plane {
        int64_t oh0 = 0, oh1 = 0, ih0 = 0, IH = 0;
        std::vector<float> d, x;  // (R, oh1 - oh0, OW) and (R, IH, W)
      };
      std::vector<Plane> planes;  // per channel of the tile
      for (int64_t c = ps.p0; c < ps.p1; ++c) {
        const auto [h0, h1] = TileRulePlaneRows(H, W, t.c0, t.c1, c);
        Plane pl;
        std::tie(pl.oh0, pl.oh1) = TileRuleWindowRows(o, h0, h1);
        if (pl.oh1 > pl.oh0) {
          pl.ih0 = pl.oh0 * s;
          pl.IH = (pl.oh1 - 1) * s + k - pl.ih0;
          pl.d = dense(o.x, t.r0, t.r1, (c * OH + pl.oh0) * OW, (c * OH + pl.oh1) * OW);
          pl.x = dense(o.w, t.r0, t.r1, (c * H + pl.ih0) * W, (c * H + pl.ih0 + pl.IH) * W);
        }
        planes.push_back(std::move(pl));
      }
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t jj = 0; jj < K; ++jj) {
          const int64_t j = t.c0 + jj, c = j / (H * W), ih = (j % (H * W)) / W, iw = j % W;
          const Plane& pl = planes[static_cast<size_t>(c - ps.p0)];
          const int64_t NR = pl.oh1 - pl.oh0;
          auto at = [&](int64_t h, int64_t ww) {
            return pl.x[static_cast<size_t>((r * pl.IH + h - pl.ih0) * W + ww)];
          };
          float acc = 0.0f;
          for (int64_t oh = pl.oh0; oh < pl.oh1; ++oh) {
            for (int64_t ow = 0; ow < OW; ++ow) {
              if (ih < oh * s || ih >= oh * s + k || iw < ow * s || iw >= ow * s + k) continue;
              int64_t bh = oh * s, bw = ow * s;
              float best = at(bh, bw);
              for (int64_t kh = 0; kh < k; ++kh) {
                for (int64_t kw = 0; kw < k; ++kw) {
                  if (at(oh * s + kh, ow * s + kw) > best) {
                    best = at(oh * s + kh, ow * s + kw);
                    bh = oh * s + kh;
                    bw = ow * s + kw;
                  }
                }
              }
              if (bh == ih && bw == iw) {
                acc = acc + pl.d[static_cast<size_t>((r * NR + oh - pl.oh0) * OW + ow)];
              }
            }
          }
          out[static_cast<size_t>(r * K + jj)] = acc;
        }
      }
      break;
    }
    case TileOpKind::kTileOpConvWeightGrad:
    case TileOpKind::kTileOpConvBiasGrad: {
      // kernels.h: dweight[oc, c, kh, kw] chains fma(dout[b,oc,oh,ow], x, acc) over (b, oh, ow)
      // from 0 (x = inp[b, c, oh * s - pad + kh, ow * s - pad + kw], or 0 in the padding); dbias
      // chains acc + dout[b, oc, p] over (b, p). Block (k, g) continues the group's elements
      // over row block k from the agreed partial; after the last block, "grad += acc" on a
      // zeroed gradient (or the previous micro-batch's). Over wide planes a block is one
      // sample's run of one output row (TileRuleConvGradWide), in the same order.
      internal::FpEnvGuard fp_guard;
      const int64_t C = o.conv[0], H = o.conv[1], W = o.conv[2], KH = o.conv[4], KW = o.conv[5];
      const int64_t s = o.conv[6], pad = o.conv[7], KK = KH * KW;
      const int64_t OH = TileRuleOutH(o), OW = TileRuleOutW(o), P = OH * OW;
      const int64_t groups = TileRuleConvGradGroups(o);
      const TileRuleConvGradSpan sp = TileRuleConvGradSpanOf(plan, o, block);
      const int64_t b0 = sp.b0, b1 = sp.b1;
      const auto [oc0, oc1] = TileRuleConvGradChannels(o, t, block % groups);
      std::vector<float> acc = in.partial.empty() ? out : in.partial;
      const bool weight = o.kind == TileOpKind::kTileOpConvWeightGrad;
      const auto [q0, q1] = TileRuleConvGradPairs(o, t, block % groups);
      if (oc0 < oc1 && q0 < q1) {
        const std::vector<float> d = dense(o.x, b0, b1, oc0 * P, oc1 * P);  // (NB, NO, P)
        const int64_t NB = b1 - b0, NO = oc1 - oc0;
        if (weight) {
          // The input rows of the tile's channels [ci0, ci1): (NB, NC, H, W).
          const int64_t ci0 = t.c0 / KK, ci1 = std::min(C, (t.c1 - 1) / KK + 1), NC = ci1 - ci0;
          const std::vector<float> x = dense(o.w, b0, b1, ci0 * H * W, ci1 * H * W);
          for (int64_t oc = oc0; oc < oc1; ++oc) {
            for (int64_t jj = 0; jj < K; ++jj) {
              const int64_t j = t.c0 + jj, c = j / KK, kh = (j % KK) / KW, kw = j % KW;
              if (j / KW < q0 || j / KW >= q1) continue;  // another group's pair
              float a = acc[static_cast<size_t>((oc - t.r0) * K + jj)];
              for (int64_t b = 0; b < NB; ++b) {
                for (int64_t oh = sp.oh0; oh < sp.oh1; ++oh) {
                  for (int64_t ow = sp.ow0; ow < sp.ow1; ++ow) {
                    const int64_t ih = oh * s - pad + kh, iw = ow * s - pad + kw;
                    const float xv =
                        (ih >= 0 && ih < H && iw >= 0 && iw < W)
                            ? x[static_cast<size_t>(((b * NC + c - ci0) * H + ih) * W + iw)]
                            : 0.0f;
                    a = __builtin_fmaf(
                        d[static_cast<size_t>((b * NO + oc - oc0) * P + oh * OW + ow)], xv, a);
                  }
                }
              }
              acc[static_cast<size_t>((oc - t.r0) * K + jj)] = a;
            }
          }
        } else {
          for (int64_t oc = oc0; oc < oc1; ++oc) {
            float a = acc[static_cast<size_t>(oc - t.c0)];
            for (int64_t b = 0; b < NB; ++b) {
              for (int64_t oh = sp.oh0; oh < sp.oh1; ++oh) {
                for (int64_t ow = sp.ow0; ow < sp.ow1; ++ow) {
                  a = a + d[static_cast<size_t>((b * NO + oc - oc0) * P + oh * OW + ow)];
                }
              }
            }
            acc[static_cast<size_t>(oc - t.c0)] = a;
          }
        }
      }
      if (block + 1 == blocks) {
        for (size_t i = 0; i < acc.size(); ++i) acc[i] = prior[i] + acc[i];
      }
      out = std::move(acc);
      break;
    }
    case TileOpKind::kTileOpLoss:
    case TileOpKind::kTileOpLossGrad: {
      const int64_t V = plan.classes;
      if (blocks > 0) {
        out = SoftmaxBlock(
            plan, o, t, block, in.partial,
            [&](int64_t v0, int64_t v1) { return dense(o.x, t.r0, t.r1, v0, v1); },
            [&] { return targets(t.r0, t.r1); });
        break;
      }
      std::vector<float> logits = dense(o.x, t.r0, t.r1, 0, V);
      std::vector<int32_t> y = targets(t.r0, t.r1);
      std::vector<float> probs(static_cast<size_t>(R * V)), losses(static_cast<size_t>(R));
      // Rows are independent: the rows of the tile give the same probabilities and losses as
      // the whole batch does.
      ref::SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), y.data(), R, V);
      if (o.kind == TileOpKind::kTileOpLoss) {
        out = losses;
        break;
      }
      // The gradient's scale is 1 / B of the whole batch: run the reference backward over a
      // batch of B rows, zero but for the tile's.
      const int64_t B = TileRuleRows(plan);
      std::vector<float> all_probs(static_cast<size_t>(B * V), 0.0f);
      std::vector<int32_t> all_y(static_cast<size_t>(B), 0);
      std::vector<float> dlogits(static_cast<size_t>(B * V), 0.0f);
      std::copy(probs.begin(), probs.end(), all_probs.begin() + t.r0 * V);
      std::copy(y.begin(), y.end(), all_y.begin() + t.r0);
      ref::SoftmaxCrossEntropyBackward(dlogits.data(), all_probs.data(), all_y.data(),
                                       MicroBatchLossScale(plan.micro_batches), B, V);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < K; ++c) out[r * K + c] = dlogits[(t.r0 + r) * V + t.c0 + c];
      }
      break;
    }
    case TileOpKind::kTileOpLinearInputGrad: {
      const int64_t OC = TileRuleCols(plan, o.x);
      if (blocks == 0) {
        std::vector<float> d = dense(o.x, t.r0, t.r1, 0, OC);
        std::vector<float> w = dense(o.w, 0, OC, t.c0, t.c1);  // (OC, K): weight columns c
        ref::LinearBackward(out.data(), nullptr, nullptr, d.data(), nullptr, w.data(), R, K, OC);
        break;
      }
      // One block of the chain over o (kernels.h: acc = fma(dout[b,o], weight[o,c], acc) from
      // 0), continued from the agreed partial; after the last, the kernel's "dinp += acc" on a
      // zeroed gradient.
      internal::FpEnvGuard fp_guard;
      const int64_t k0 = block * kTileLinearBlock, k1 = std::min(OC, k0 + kTileLinearBlock);
      const int64_t W = k1 - k0;
      std::vector<float> d = dense(o.x, t.r0, t.r1, k0, k1);  // (R, W)
      std::vector<float> w = dense(o.w, k0, k1, t.c0, t.c1);  // (W, K)
      if (block > 0) out = in.partial;
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < K; ++c) {
          float a = out[static_cast<size_t>(r * K + c)];
          for (int64_t k = 0; k < W; ++k) a = __builtin_fmaf(d[r * W + k], w[k * K + c], a);
          out[static_cast<size_t>(r * K + c)] = a;
        }
      }
      if (block + 1 == blocks) {
        for (float& a : out) a = 0.0f + a;
      }
      break;
    }
    case TileOpKind::kTileOpReluInputGrad: {
      std::vector<float> d = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      std::vector<float> x = dense(o.w, t.r0, t.r1, t.c0, t.c1);
      ref::ReluBackward(out.data(), d.data(), x.data(), t.numel());
      break;
    }
    case TileOpKind::kTileOpGeluInputGrad: {
      std::vector<float> d = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      std::vector<float> x = dense(o.w, t.r0, t.r1, t.c0, t.c1);
      ref::GeluBackward(out.data(), d.data(), x.data(), t.numel());
      break;
    }
    case TileOpKind::kTileOpLinearWeightGrad:
    case TileOpKind::kTileOpLinearBiasGrad: {
      // One block of the sequential chain over the batch (kernels.h: dweight chains
      // fma(dout[b,o], inp[b,c], acc) over b from 0; dbias chains acc + dout[b,o]), continued
      // from the agreed partial; after the last block, the kernel's "grad += sum" on a zeroed
      // gradient.
      internal::FpEnvGuard fp_guard;
      const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), block);
      std::vector<float> acc = in.partial.empty() ? out : in.partial;
      const bool weight = o.kind == TileOpKind::kTileOpLinearWeightGrad;
      // dW tile rows are output features o (dout columns), columns are input features c.
      const int64_t o0 = weight ? t.r0 : t.c0, o1 = weight ? t.r1 : t.c1;
      std::vector<float> d = dense(o.x, b0, b1, o0, o1);  // (b1-b0, O)
      const int64_t O = o1 - o0;
      if (weight) {
        std::vector<float> x = dense(o.w, b0, b1, t.c0, t.c1);  // (b1-b0, K)
        for (int64_t oo = 0; oo < O; ++oo) {
          for (int64_t c = 0; c < K; ++c) {
            float a = acc[static_cast<size_t>(oo * K + c)];
            for (int64_t b = 0; b < b1 - b0; ++b)
              a = __builtin_fmaf(d[b * O + oo], x[b * K + c], a);
            acc[static_cast<size_t>(oo * K + c)] = a;
          }
        }
      } else {
        for (int64_t oo = 0; oo < O; ++oo) {
          float a = acc[static_cast<size_t>(oo)];
          for (int64_t b = 0; b < b1 - b0; ++b) a = a + d[b * O + oo];
          acc[static_cast<size_t>(oo)] = a;
        }
      }
      if (block + 1 == blocks) {
        // dweight / dbias (zeroed, or the previous micro-batch's) += acc
        for (size_t i = 0; i < acc.size(); ++i) acc[i] = prior[i] + acc[i];
      }
      out = std::move(acc);
      break;
    }
    case TileOpKind::kTileOpLayerNormInputGrad: {
      if (const int64_t W = TileRuleImageNormWidth(o); W > 0 && ln_nb == 0) {
        // The reference backward over the whole runs (a sequential model's: into a zeroed
        // gradient), their mean and rstd from the reference forward, as the rows' below.
        const auto [f0, f1] = TileRuleImageNormRuns(W, t.c0, t.c1);
        const int64_t L = f1 - f0, N = R * (L / W);
        const std::vector<float> d = dense(o.x, t.r0, t.r1, f0, f1);
        const std::vector<float> x = dense(o.w, t.r0, t.r1, f0, f1);
        const std::vector<float> w = dense(o.b, 0, 1, 0, W);
        std::vector<float> dinp(static_cast<size_t>(R * L), 0.0f), y(static_cast<size_t>(R * L)),
            mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
        ref::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N,
                              W);
        ref::LayerNormBackward(dinp.data(), nullptr, nullptr, d.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), N, W);
        for (int64_t r = 0; r < R; ++r) {
          std::copy(dinp.begin() + r * L + (t.c0 - f0), dinp.begin() + r * L + (t.c1 - f0),
                    out.begin() + r * K);
        }
        break;
      }
      if (ln_nb > 0 && block < 2 * ln_nb) {
        out = ln_stats_block(o.w);
        break;
      }
      if (ln_nb > 0) {
        // ref::LayerNormBackward's order: rstd = 1 / sqrt(v / C + eps); over c from 0,
        // dmean = dmean + dnorm and dnmean = fma(dnorm, norm, dnmean) (norm = (x - m) * rstd,
        // dnorm = weight * dout), in blocks; the last block divides both by C and adds
        // ((dnorm - dmean) - norm * dnmean) * rstd into the tile (0 + the residual gradient's).
        // Over an image, each of the RN rows (runs) the tile normalises, as the forward's.
        internal::FpEnvGuard fp_guard;
        const TileRuleNormRuns ru = TileRuleNormRunsOf(plan, o, t);
        const int64_t C = ru.C, RN = R * ru.nj;
        std::vector<float> st = in.partial;
        if (block == 2 * ln_nb) {
          st.assign(static_cast<size_t>(4 * RN), 0.0f);
          for (int64_t r = 0; r < RN; ++r) {
            const float v = in.partial[static_cast<size_t>(RN + r)] / static_cast<float>(C);
            st[static_cast<size_t>(r)] = in.partial[static_cast<size_t>(r)];
            st[static_cast<size_t>(RN + r)] = 1.0f / __builtin_sqrtf(v + internal::kLayerNormEps);
          }
        }
        if (block < 3 * ln_nb) {  // a block of dmean and dnmean's sums, run by run
          const int64_t k0 = (block - 2 * ln_nb) * kTileLinearBlock;
          const int64_t k1 = std::min(C, k0 + kTileLinearBlock), W = k1 - k0;
          const std::vector<float> w = dense(o.b, 0, 1, k0, k1);
          for (int64_t jj = 0; jj < ru.nj; ++jj) {
            const int64_t f = (ru.j0 + jj) * C;
            const std::vector<float> d = dense(o.x, t.r0, t.r1, f + k0, f + k1);
            const std::vector<float> x = dense(o.w, t.r0, t.r1, f + k0, f + k1);
            for (int64_t r = 0; r < R; ++r) {
              const int64_t sr = jj * R + r;
              const float m = st[static_cast<size_t>(sr)], s = st[static_cast<size_t>(RN + sr)];
              float dmean = st[static_cast<size_t>(2 * RN + sr)];
              float dnmean = st[static_cast<size_t>(3 * RN + sr)];
              for (int64_t k = 0; k < W; ++k) {
                const size_t i = static_cast<size_t>(r * W + k);
                const float norm = (x[i] - m) * s;
                const float dnorm = w[static_cast<size_t>(k)] * d[i];
                dmean = dmean + dnorm;
                dnmean = __builtin_fmaf(dnorm, norm, dnmean);
              }
              st[static_cast<size_t>(2 * RN + sr)] = dmean;
              st[static_cast<size_t>(3 * RN + sr)] = dnmean;
            }
          }
          out = std::move(st);
          break;
        }
        // The last block: the tile's columns (column c of run j reads weight c - j C).
        const std::vector<float> d = dense(o.x, t.r0, t.r1, t.c0, t.c1);
        const std::vector<float> x = dense(o.w, t.r0, t.r1, t.c0, t.c1);
        std::vector<float> w;
        for (int64_t jj = 0; jj < ru.nj; ++jj) {
          const auto [w0, w1] = ru.Cols(jj, t.c0, t.c1);
          const std::vector<float> wj = dense(o.b, 0, 1, w0, w1);
          w.insert(w.end(), wj.begin(), wj.end());
        }
        std::vector<float> prior_g(static_cast<size_t>(R * K), 0.0f);
        if (o.v >= 0) {
          const std::vector<float> g = dense(o.v, t.r0, t.r1, t.c0, t.c1);
          for (size_t i = 0; i < g.size(); ++i) prior_g[i] = 0.0f + g[i];
        }
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t c = 0; c < K; ++c) {
            const int64_t sr = ((t.c0 + c) / C - ru.j0) * R + r;  // its row's statistic
            const float m = st[static_cast<size_t>(sr)], s = st[static_cast<size_t>(RN + sr)];
            const float dmean = st[static_cast<size_t>(2 * RN + sr)] / static_cast<float>(C);
            const float dnmean = st[static_cast<size_t>(3 * RN + sr)] / static_cast<float>(C);
            const size_t i = static_cast<size_t>(r * K + c);
            const float norm = (x[i] - m) * s;
            const float dnorm = w[static_cast<size_t>(c)] * d[i];
            const float dval = ((dnorm - dmean) - norm * dnmean) * s;
            out[i] = prior_g[i] + dval;
          }
        }
        break;
      }
      // The reference backward over the tile's whole rows (each row's result depends on that
      // row alone), its mean and rstd from the reference forward (the fast path's bits, by
      // kernels.h's contract), adding into the gradient's tile (zeros elsewhere, not read back).
      const int64_t C = TileRuleCols(plan, o.x);
      const std::vector<float> d = dense(o.x, t.r0, t.r1, 0, C);
      const std::vector<float> x = dense(o.w, t.r0, t.r1, 0, C);
      const std::vector<float> w = dense(o.b, 0, 1, 0, C);
      std::vector<float> dinp(static_cast<size_t>(R * C), 0.0f);
      if (o.v >= 0) {  // ResidualBackward's copy of it into a zeroed buffer: 0 + prior
        const std::vector<float> prior = dense(o.v, t.r0, t.r1, t.c0, t.c1);
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t c = 0; c < K; ++c) {
            dinp[static_cast<size_t>(r * C + t.c0 + c)] =
                0.0f + prior[static_cast<size_t>(r * K + c)];
          }
        }
      }
      std::vector<float> y(static_cast<size_t>(R * C)), mean(static_cast<size_t>(R)),
          rstd(static_cast<size_t>(R));
      ref::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), R, C);
      ref::LayerNormBackward(dinp.data(), nullptr, nullptr, d.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), R, C);
      for (int64_t r = 0; r < R; ++r) {
        std::copy(dinp.begin() + r * C + t.c0, dinp.begin() + r * C + t.c1, out.begin() + r * K);
      }
      break;
    }
    case TileOpKind::kTileOpLayerNormWeightGrad:
    case TileOpKind::kTileOpLayerNormBiasGrad: {
      // One block of the chain over the rows (kernels_ref.cc: dw = fma(norm, dout, dw), db = db +
      // dout, from 0, norm = (x - mean) * rstd), continued from the agreed partial; after the
      // last block the kernel's "grad += sum" on a zeroed gradient.
      internal::FpEnvGuard fp_guard;
      // Run-relative columns [c0, c1) of the layernorm's rows [n0, n1) of `operand` (NB rows of
      // c1 - c0): of the tensor, or an image's runs (TileRuleNormBlockRows).
      const int64_t image_w = TileRuleImageNormWidth(o);
      auto norm_rows = [&](int64_t operand, int64_t n0, int64_t n1, int64_t c0, int64_t c1) {
        if (image_w == 0) return dense(operand, n0, n1, c0, c1);
        std::vector<float> rows;
        ForEachNormRow(plan, o, n0, n1, [&](int64_t row, int64_t f) {
          const std::vector<float> v = dense(operand, row, row + 1, f + c0, f + c1);
          rows.insert(rows.end(), v.begin(), v.end());
        });
        return rows;
      };
      if (const TileRuleLnWeight lw = TileRuleLayerNormWeightBlocks(plan, o); lw.nb > 0) {
        // Narrowed dweight (TileRuleLayerNormWeightBlocks): the partial is the K accumulators,
        // then the row block's NB sums (or NB means and NB sums of squares).
        const int64_t sub = block % lw.per(), C = TileRuleNormWidth(plan, o);
        const auto [b0, b1] = TileRuleNormBlockRows(plan, o, block / lw.per());
        const int64_t NB = b1 - b0;
        std::vector<float> st =
            in.partial.empty() ? std::vector<float>(static_cast<size_t>(K), 0.0f) : in.partial;
        if (sub < 2 * lw.nb) {
          const int64_t k0 = (sub % lw.nb) * kTileLinearBlock;
          const int64_t k1 = std::min(C, k0 + kTileLinearBlock), W = k1 - k0;
          const std::vector<float> x = norm_rows(o.w, b0, b1, k0, k1);
          if (sub == 0) st.resize(static_cast<size_t>(K + NB), 0.0f);
          if (sub < lw.nb) {
            for (int64_t n = 0; n < NB; ++n) {
              float m = st[static_cast<size_t>(K + n)];
              for (int64_t k = 0; k < W; ++k) m = m + x[static_cast<size_t>(n * W + k)];
              st[static_cast<size_t>(K + n)] = m;
            }
          } else {
            if (sub == lw.nb) {
              st.resize(static_cast<size_t>(K + 2 * NB), 0.0f);
              for (int64_t n = 0; n < NB; ++n) {
                st[static_cast<size_t>(K + n)] =
                    st[static_cast<size_t>(K + n)] / static_cast<float>(C);
              }
            }
            for (int64_t n = 0; n < NB; ++n) {
              const float m = st[static_cast<size_t>(K + n)];
              float v = st[static_cast<size_t>(K + NB + n)];
              for (int64_t k = 0; k < W; ++k) {
                const float xm = x[static_cast<size_t>(n * W + k)] - m;
                v = __builtin_fmaf(xm, xm, v);
              }
              st[static_cast<size_t>(K + NB + n)] = v;
            }
          }
        } else {
          const int64_t c0 = (sub - 2 * lw.nb) * kTileLinearBlock;
          const int64_t c1 = std::min(K, c0 + kTileLinearBlock), W = c1 - c0;
          if (W > 0) {
            const std::vector<float> d = norm_rows(o.x, b0, b1, t.c0 + c0, t.c0 + c1);
            const std::vector<float> x = norm_rows(o.w, b0, b1, t.c0 + c0, t.c0 + c1);
            for (int64_t c = 0; c < W; ++c) {
              float a = st[static_cast<size_t>(c0 + c)];
              for (int64_t n = 0; n < NB; ++n) {
                const float m = st[static_cast<size_t>(K + n)];
                const float v = st[static_cast<size_t>(K + NB + n)] / static_cast<float>(C);
                const float s = 1.0f / __builtin_sqrtf(v + internal::kLayerNormEps);
                const float norm = (x[static_cast<size_t>(n * W + c)] - m) * s;
                a = __builtin_fmaf(norm, d[static_cast<size_t>(n * W + c)], a);
              }
              st[static_cast<size_t>(c0 + c)] = a;
            }
          }
          if (sub + 1 == lw.per()) st.resize(static_cast<size_t>(K));  // the row block is done
        }
        if (block + 1 == blocks) {
          for (int64_t i = 0; i < K; ++i) {
            st[static_cast<size_t>(i)] = prior[static_cast<size_t>(i)] + st[static_cast<size_t>(i)];
          }
        }
        out = std::move(st);
        break;
      }
      const auto [b0, b1] = TileRuleNormBlockRows(plan, o, block);
      const int64_t NB = b1 - b0;
      std::vector<float> acc = in.partial.empty() ? out : in.partial;
      // The block's rows (an image's runs: up to W = kTileImageNormWidthMax the tile holds the
      // whole W; wider, a block is one run, of which dbias reads the tile's columns).
      const std::vector<float> d = norm_rows(o.x, b0, b1, t.c0, t.c1);  // (NB, K)
      if (o.kind == TileOpKind::kTileOpLayerNormWeightGrad) {
        const int64_t C = TileRuleNormWidth(plan, o);
        const std::vector<float> x = norm_rows(o.w, b0, b1, 0, C);
        const std::vector<float> ones(static_cast<size_t>(C), 1.0f);
        std::vector<float> y(static_cast<size_t>(NB * C)), mean(static_cast<size_t>(NB)),
            rstd(static_cast<size_t>(NB));
        ref::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), ones.data(),
                              ones.data(), NB, C);
        for (int64_t c = 0; c < K; ++c) {
          float a = acc[static_cast<size_t>(c)];
          for (int64_t n = 0; n < NB; ++n) {
            const float norm = (x[n * C + t.c0 + c] - mean[n]) * rstd[n];
            a = __builtin_fmaf(norm, d[n * K + c], a);
          }
          acc[static_cast<size_t>(c)] = a;
        }
      } else {
        for (int64_t c = 0; c < K; ++c) {
          float a = acc[static_cast<size_t>(c)];
          for (int64_t n = 0; n < NB; ++n) a = a + d[n * K + c];
          acc[static_cast<size_t>(c)] = a;
        }
      }
      if (block + 1 == blocks) {
        // dweight / dbias (zeroed, or the previous micro-batch's) += acc
        for (size_t i = 0; i < acc.size(); ++i) acc[i] = prior[i] + acc[i];
      }
      out = std::move(acc);
      break;
    }
    case TileOpKind::kTileOpAttentionBackward: {
      // kernels_ref.cc's AttentionBackward, element by element, over the block's positions of
      // each chain (continued from the agreed partial); after the last block the kernel's
      // "dqkv += acc" (v) or "+= acc * scale" (q, k) on a zeroed gradient.
      internal::FpEnvGuard fp_guard;
      const int64_t T = o.conv[0], NH = o.conv[1], C = o.conv[2], hs = C / NH;
      const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
      if (TileRuleAttentionBlocks(o) > 0) {
        out = TileRuleAttentionBackwardBlock(plan, fp, in, o, t, block, scale);
        break;
      }
      const int64_t k0 = block * kTileRows, k1 = std::min(T, k0 + kTileRows), nk = k1 - k0;
      std::vector<float> acc = in.partial.empty() ? out : in.partial;
      std::vector<int8_t> part_of(static_cast<size_t>(t.numel()), 0);
      // Columns [c0, c1) of row tt of dP, from the whole row tt of att (a) and of dout (g), and
      // v of the whole sequence (T x hs).
      auto dp_row = [&](const float* a, const float* g, const std::vector<float>& v, int64_t tt,
                        int64_t c0, int64_t c1, float* dp) {
        std::vector<float> da(static_cast<size_t>(T));
        for (int64_t t2 = 0; t2 < T; ++t2) {
          float d = 0.0f;
          for (int64_t i = 0; i < hs; ++i) d = __builtin_fmaf(g[i], v[t2 * hs + i], d);
          da[static_cast<size_t>(t2)] = t2 <= tt ? d : 0.0f;
        }
        float s = 0.0f;
        for (int64_t t2 = 0; t2 < T; ++t2) s = __builtin_fmaf(a[t2], da[t2], s);
        for (int64_t t2 = c0; t2 < c1; ++t2) {
          dp[t2 - c0] = t2 <= tt ? a[t2] * (da[static_cast<size_t>(t2)] - s) : 0.0f;
        }
      };
      ForEachSequenceSpan(t.r0, t.r1, T, [&](int64_t b, int64_t p0, int64_t p1) {
        const int64_t base = b * T, np = p1 - p0;
        ForEachHeadSegment(t.c0, t.c1, C, hs, [&](int64_t part, int64_t h, int64_t i0, int64_t i1) {
          const int64_t arow = (b * NH + h) * T, hc = h * hs, ni = i1 - i0;
          auto at = [&](int64_t p, int64_t i) {
            const size_t e = static_cast<size_t>((base + p - t.r0) * K + part * C + hc + i - t.c0);
            part_of[e] = static_cast<int8_t>(part);
            return e;
          };
          // acc[p, i] += the chain over the block's rows tt of l[tt, p] * r[tt, i] (l: nk x np,
          // r: nk x ni): dv's and dk's order.
          auto chain_over_block = [&](const std::vector<float>& l, const std::vector<float>& r) {
            for (int64_t p = p0; p < p1; ++p) {
              for (int64_t i = i0; i < i1; ++i) {
                float& x = acc[at(p, i)];
                for (int64_t tt = 0; tt < nk; ++tt) {
                  x = __builtin_fmaf(l[static_cast<size_t>(tt * np + p - p0)],
                                     r[static_cast<size_t>(tt * ni + i - i0)], x);
                }
              }
            }
          };
          if (part == 2) {
            const std::vector<float> a = dense(o.b, arow + k0, arow + k1, p0, p1);  // (nk, np)
            const std::vector<float> g = dense(o.x, base + k0, base + k1, hc + i0, hc + i1);
            chain_over_block(a, g);
            return;
          }
          const int64_t r0 = part == 0 ? p0 : k0, r1 = part == 0 ? p1 : k1;
          const std::vector<float> a = dense(o.b, arow + r0, arow + r1, 0, T);  // (rows, T)
          const std::vector<float> g = dense(o.x, base + r0, base + r1, hc, hc + hs);
          const std::vector<float> v = dense(o.w, base, base + T, 2 * C + hc, 2 * C + hc + hs);
          const int64_t other = part == 0 ? C : 0;
          const std::vector<float> kq =
              dense(o.w, base + k0, base + k1, other + hc + i0, other + hc + i1);  // (nk, ni)
          if (part == 0) {  // dq[p, i]: over the block's keys t2
            std::vector<float> dp(static_cast<size_t>(nk));
            for (int64_t p = p0; p < p1; ++p) {
              dp_row(a.data() + (p - p0) * T, g.data() + (p - p0) * hs, v, p, k0, k1, dp.data());
              for (int64_t i = i0; i < i1; ++i) {
                float& x = acc[at(p, i)];
                for (int64_t t2 = 0; t2 < nk; ++t2) {
                  x = __builtin_fmaf(dp[static_cast<size_t>(t2)],
                                     kq[static_cast<size_t>(t2 * ni + i - i0)], x);
                }
              }
            }
            return;
          }
          // dk[p, i]: over the block's queries t, dP[t, p] from row t.
          std::vector<float> dp(static_cast<size_t>(nk * np));
          for (int64_t tt = 0; tt < nk; ++tt) {
            dp_row(a.data() + tt * T, g.data() + tt * hs, v, k0 + tt, p0, p1, dp.data() + tt * np);
          }
          chain_over_block(dp, kq);
        });
      });
      if (block + 1 < blocks) {
        out = std::move(acc);
        break;
      }
      for (size_t e = 0; e < acc.size(); ++e) {
        out[e] = part_of[e] == 2 ? 0.0f + acc[e] : 0.0f + acc[e] * scale;
      }
      break;
    }
    case TileOpKind::kTileOpEmbedding: {
      // model.cc: EmbeddingForward copies the rows (no rounding), ResidualForward adds them.
      // Narrowed (a vocabulary above kTileEmbeddingWholeMax): block `block` sets the rows whose
      // token is in its vocabulary rows [v0, v1) on the partial S_block, the rest kept.
      internal::FpEnvGuard fp_guard;
      const int64_t T = o.conv[0];
      const int64_t v0 = blocks > 0 ? block * kTileEmbeddingBlock : 0;
      const int64_t v1 =
          blocks > 0 ? std::min(plan.classes, v0 + kTileEmbeddingBlock) : plan.classes;
      if (blocks > 0 && !in.partial.empty()) out = in.partial;
      const std::vector<float> wte = dense(o.x, v0, v1, t.c0, t.c1);  // (v1 - v0, K)
      const std::vector<float> wpe = dense(o.w, 0, T, t.c0, t.c1);    // (T, K)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t tok = in.tokens[static_cast<size_t>(r)], pos = (t.r0 + r) % T;
        if (tok < v0 || tok >= v1) continue;
        for (int64_t c = 0; c < K; ++c) {
          out[static_cast<size_t>(r * K + c)] =
              wte[static_cast<size_t>((tok - v0) * K + c)] + wpe[static_cast<size_t>(pos * K + c)];
        }
      }
      break;
    }
    case TileOpKind::kTileOpEmbeddingGrad: {
      // wte: the tied head's dW chain (kernels.h: fma(dlogits[n, v], ln_f[n, c], acc) over n
      // from 0; then the zeroed gradient's 0 + acc), then EmbeddingBackward's: for each row v
      // some token hits, acc = the chain over n of acc + dres[n, c] for tokens[n] == v, from 0,
      // and grad += acc. wpe: the same by position on a zeroed gradient. In micro-batches, wte
      // has no head blocks and both add into the previous micro-batch's accumulated tile. A row
      // nothing hits keeps its value, which is what + 0 gives: neither the head's 0 + acc nor a
      // chain from +0 (nor a sum of such values) can be -0.
      internal::FpEnvGuard fp_guard;
      const int64_t nb = TileRuleRowBlocks(TileRuleRows(plan)), n = t.numel();
      const bool head = o.b >= 0;
      if (head && block < nb) {
        const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), block);
        std::vector<float> acc = in.partial.empty() ? out : in.partial;
        const std::vector<float> d = dense(o.b, b0, b1, t.r0, t.r1);  // (NB, R)
        const std::vector<float> x = dense(o.v, b0, b1, t.c0, t.c1);  // (NB, K)
        for (int64_t vv = 0; vv < R; ++vv) {
          for (int64_t c = 0; c < K; ++c) {
            float a = acc[static_cast<size_t>(vv * K + c)];
            for (int64_t b = 0; b < b1 - b0; ++b)
              a = __builtin_fmaf(d[static_cast<size_t>(b * R + vv)],
                                 x[static_cast<size_t>(b * K + c)], a);
            acc[static_cast<size_t>(vv * K + c)] = a;
          }
        }
        if (block + 1 < nb) {
          out = std::move(acc);
          break;
        }
        // The head's dW is done (0 + acc into the zeroed gradient); the embedding's own
        // accumulator starts from 0.
        out.assign(static_cast<size_t>(2 * n), 0.0f);
        for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = 0.0f + acc[i];
        break;
      }
      const int64_t T = o.conv[0];
      const auto [b0, b1] = TileRuleBlockRows(TileRuleRows(plan), head ? block - nb : block);
      std::vector<float> state = in.partial;
      if (state.empty()) state.assign(static_cast<size_t>(n), 0.0f);
      float* acc = state.data() + (head ? n : 0);
      const std::vector<float> d = dense(o.x, b0, b1, t.c0, t.c1);  // (NB, K)
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t id = o.conv[1] == 1 ? in.tokens[static_cast<size_t>(b - b0)] : b % T;
        if (id < t.r0 || id >= t.r1) continue;
        for (int64_t c = 0; c < K; ++c) {
          float& a = acc[(id - t.r0) * K + c];
          a = a + d[static_cast<size_t>((b - b0) * K + c)];
        }
      }
      if (block + 1 < blocks) {
        out = std::move(state);
        break;
      }
      for (int64_t i = 0; i < n; ++i) {
        out[static_cast<size_t>(i)] =
            (head ? state[static_cast<size_t>(i)] : prior[static_cast<size_t>(i)]) + acc[i];
      }
      break;
    }
    case TileOpKind::kTileOpAdamW:
    case TileOpKind::kTileOpSgd: {
      std::vector<float> w = dense(o.x, t.r0, t.r1, t.c0, t.c1);
      std::vector<float> g = dense(o.w, t.r0, t.r1, t.c0, t.c1);
      std::vector<float> m, v;
      if (o.b >= 0) m = dense(o.b, t.r0, t.r1, t.c0, t.c1);
      if (o.v >= 0) v = dense(o.v, t.r0, t.r1, t.c0, t.c1);
      // Clipped: the factor of the agreed global norm, as Optimizer::Update forms it.
      // A stage's clip_norm holds the total sum of squares: the norm is its square root, as
      // Stage::FinishStep takes it.
      const float clip_value = o.clip_norm >= 0 ? dense(o.clip_norm, 0, 1, 0, 1)[0] : 0.0f;
      const GradClip clip =
          o.clip_norm >= 0
              ? GradClipOf(plan.optimizer, o.squares ? std::sqrt(clip_value) : clip_value)
              : GradClip{};
      if (o.kind == TileOpKind::kTileOpAdamW) {
        AdamWStep s = AdamWScalars(plan.optimizer, step, clip.scale, clip.clip);
        s.decay_weight = AdamWDecays(plan.optimizer, o.shape);
        ref::AdamWUpdate(w.data(), g.data(), m.data(), v.data(), t.numel(), s);
      } else {
        if (clip.clip) {
          for (float& gi : g) gi = gi * clip.scale;
        }
        SgdUpdate(plan.optimizer, step, o.shape, w.data(), g.data(), o.b >= 0 ? m.data() : nullptr,
                  t.numel());
      }
      switch (o.update_output) {
        case TileUpdateOutput::kTileUpdateParam:
          out = std::move(w);
          break;
        case TileUpdateOutput::kTileUpdateFirstMoment:
          out = std::move(m);
          break;
        case TileUpdateOutput::kTileUpdateSecondMoment:
          out = std::move(v);
          break;
      }
      break;
    }
    case TileOpKind::kTileOpGradSquareBlocks: {
      // S_{block+1}: S_block with partial c0 + block summed (kernels.h's SumSquaresTree block:
      // acc = fma(g, g, acc) from 0 over its kSumBlock elements).
      if (block > 0) out = in.partial;
      TileRuleSquareBlock sb;
      if (!TileRuleSquareBlockOf(plan, o, t.c0 + block, &sb) || t.c0 + block >= t.c1) break;
      const int64_t r0 = sb.e0 / sb.cols, r1 = (sb.e1 - 1) / sb.cols + 1;
      const int64_t c0 = r1 - r0 == 1 ? sb.e0 - r0 * sb.cols : 0;
      const int64_t c1 = r1 - r0 == 1 ? sb.e1 - r0 * sb.cols : sb.cols;
      const std::vector<float> g = dense(sb.grad, r0, r1, c0, c1);
      const int64_t skip = sb.e0 - r0 * sb.cols - c0;
      std::vector<float> partial;
      AppendSquareBlockPartials(g.data() + skip, sb.e1 - sb.e0, &partial);
      out[static_cast<size_t>(block)] = partial.at(0);
      break;
    }
    case TileOpKind::kTileOpGradNorm: {
      // optim.cc: total = 0; total += SumSquaresTree(grad) parameter by parameter; norm =
      // sqrt(total). Block k adds parameter k's tree of partials to the agreed S_k; the last
      // block also takes the square root. A parameter in chunks (TileRuleNormBlocks) carries
      // the roots of its chunks' trees in the partial, after the total, until its last chunk
      // combines them.
      internal::FpEnvGuard fp_guard;
      const std::vector<TileRuleNormBlock> nbs = TileRuleNormBlocks(plan, o);
      if (nbs.empty()) {
        // No parameters: SumGradSquares adds nothing to the running sum it received (0 for a
        // first stage).
        const float before = o.v >= 0 ? dense(o.v, 0, 1, 0, 1)[0] : 0.0f;
        out.assign(1, o.squares ? before : std::sqrt(before));
        break;
      }
      const TileRuleNormBlock nb = nbs[static_cast<size_t>(block)];
      std::vector<float> roots;
      if (nb.chunk > 0) roots.assign(in.partial.begin() + 1, in.partial.end());
      roots.push_back(CombineBlockPartials(dense(o.x, 0, 1, nb.first, nb.first + nb.count)));
      // A stage's chain starts from the running sum stage s-1 sent (SumGradSquares(running)).
      const float before =
          block > 0 ? in.partial[0] : (o.v >= 0 ? dense(o.v, 0, 1, 0, 1)[0] : 0.0f);
      if (nb.chunk + 1 < nb.chunks) {
        out.assign(1, before);
        out.insert(out.end(), roots.begin(), roots.end());
        break;
      }
      const float total = before + CombineBlockPartials(std::move(roots));
      out.assign(1, block + 1 == blocks && !o.squares ? std::sqrt(total) : total);
      break;
    }
  }
  return out;
}

TileInputs GatherTileInputs(const TilePlan& plan, const TileFootprint& fp, const OpTrace& trace,
                            const Batch& batch) {
  TileInputs in;
  for (const TileRef& r : fp.tiles) {
    in.tiles.push_back(ExtractTile(trace.values(static_cast<size_t>(r.op)),
                                   plan.ops[static_cast<size_t>(r.op)].grid, r.tile));
  }
  for (int64_t row : fp.batch_rows) {
    if (plan.tokens) {
      in.tokens.push_back(batch.tokens[static_cast<size_t>(row)]);
      in.y.push_back(batch.targets[static_cast<size_t>(row)]);
      continue;
    }
    const float* x = batch.inputs.data() + row * plan.input_size;
    if (ExampleChunks(plan.input_size) > 0) {
      // Only the footprint's chunks, as a witness carries them (TileInputs::x).
      std::vector<float>& xi = in.x.emplace_back(static_cast<size_t>(plan.input_size), 0.0f);
      for (int64_t k : fp.batch_chunks) {
        const int64_t c0 = k * kExampleChunkFloats;
        const int64_t c1 = std::min(plan.input_size, c0 + kExampleChunkFloats);
        std::copy(x + c0, x + c1, xi.begin() + c0);
      }
    } else {
      in.x.emplace_back(x, x + plan.input_size);
    }
    in.y.push_back(batch.targets[static_cast<size_t>(row)]);
  }
  return in;
}

Result<std::vector<std::vector<float>>> ReductionChain(const TilePlan& plan, int64_t op,
                                                       int64_t tile, int64_t step,
                                                       const OpTrace& trace, const Batch& batch) {
  const int64_t blocks = ReductionBlocks(plan, op);
  CHECK_GT(blocks, 0) << "ReductionChain of a non-reduction operator";
  std::vector<std::vector<float>> chain;
  std::vector<float> partial;
  for (int64_t k = 0; k < blocks; ++k) {
    chain.push_back(partial);
    ML_ASSIGN_OR_RETURN(TileFootprint fp, Footprint(plan, op, tile, k));
    TileInputs in = GatherTileInputs(plan, fp, trace, batch);
    in.partial = partial;
    ML_ASSIGN_OR_RETURN(partial, RecomputeTile(plan, op, tile, k, step, in));
  }
  chain.push_back(partial);
  return chain;
}

}  // namespace meshlearn::engine
