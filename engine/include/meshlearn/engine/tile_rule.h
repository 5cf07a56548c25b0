// One tile of one operator of a training step, recomputed from nothing but the input tiles it
// depends on: what the referee runs once a dispute has narrowed to a tile (protocol/dispute.h,
// the tile phase; docs/verification.md, "Tiles").
//
// A TilePlan lists the operators of one training step in OpTrace's order (op_trace.h), each with
// its tile grid and its operands (earlier operators, or the batch's examples). For an output tile
// t of operator j:
//   Footprint(plan, j, t, block)   which operand tiles (and batch examples) it depends on;
//   RecomputeTile(plan, j, t, ...) its values from just those, with the reference kernel's order
//                                  of floating-point operations (kernels.h), so the result is bit
//                                  for bit the tile the whole step's fast kernels produced.
//
// Footprints (32 x 32 tiles, tile.h):
//   linear forward   out[r, o]      rows r of the input (a row block x all C) and rows o of the
//                                   weight (a row block x all C), the bias elements o; above
//                                   C = 784 (the fashion MLP's input; GPT-2 small's 768 and
//                                   every plan before are unchanged) its chain over c is
//                                   narrowed into blocks of 256 columns, the first starting from
//                                   the bias (the partial: the tile's accumulators), 64 KiB of
//                                   inputs a block whatever C;
//   relu, gelu (and their gradients) the same elements of its input (and of the incoming
//                                   gradient);
//   residual add                    the same elements of both its inputs;
//   layernorm out[r, c]             the whole rows r of its input (all C), weight and bias c;
//                                   above C = 784 (GPT-2 small's 768 and every plan before are
//                                   unchanged) NARROWED like the loss's softmax, in
//                                   kernels_ref.cc's LayerNormForward order: nb = ceil(C / 256)
//                                   column blocks, blocks 0..nb-1 the rows' running sum m = m + x
//                                   from 0 (its partial: the tile's R rows' sums), nb..2nb-1 the
//                                   running v = fma(x - m, x - m, v) from 0 with m = sum / C (its
//                                   partial: R means, then R sums), block 2nb the tile's columns
//                                   (rstd = 1 / sqrt(v / C + eps)); a block reads 32 x 256
//                                   floats of the input, the last the tile's and weight and bias;
//   attention att[(b, h, t), t2]    q of rows t of sequence b, head h, and k of its rows 0..t;
//   attention out atty[(b, t), c]   the att rows (b, h, t) of the heads h of columns c (all T),
//                                   and v of columns c of every row of sequence b;
//                                   above T = 256 (the 10M GPT's T; at or below it the plans are
//                                   unchanged) both are NARROWED over the sequence's positions
//                                   in blocks of 32 (nb = T / 32 blocks): att in the reference
//                                   kernel's order, blocks 0..nb-1 the rows' running max of
//                                   pre = q . k * (1 / sqrt(hs)) (its partial: the tile's rows'
//                                   maxima), nb..2nb-1 their running sum of Exp(pre - max) (its
//                                   partial: maxima, then sums), block 2nb the tile's own
//                                   columns (Exp(pre - max) * (1 / sum)); a block reads q of the
//                                   tile's rows that reach its keys and k of its 32 positions
//                                   (the last block: of the tile's columns): about 256 hs bytes
//                                   (the qkv tiles holding them; twice that where a tile's rows
//                                   cross into a second sequence or head, T not a multiple of 32);
//                                   atty its chain over t2 from 0, block k reading att's columns
//                                   of its 32 positions in the tile's rows (each head of the
//                                   tile's columns) and v of those positions in the tile's
//                                   columns (the partial: the tile's accumulators), 8 KiB at
//                                   hs >= 32, whatever T;
//   loss, loss gradient             the logits rows of the tile, the examples of those rows (their
//                                   targets; a GPT's: the rows' target tokens);
//   encoded[r, c] (GPT)             the rows' tokens (batch rows: a token task proves them by the
//                                   pages of its train stream holding them, step_replay.h's
//                                   TokenPageTree), wte's whole column strip c (all V rows: the
//                                   footprint cannot know which rows the tokens pick; 4 V 32
//                                   bytes, 22 KiB at V = 172) and wpe's rows of the positions
//                                   r % T;
//   wte, wpe gradients dW[v, c] (GPT) NARROWED like dW: wte's chain first runs the tied head's dW
//                                   (blocks 0..K-1: logits.grad's and ln_f's rows of the block,
//                                   then the head's 0 + sum), then EmbeddingBackward's row sums by
//                                   token (blocks K..2K-1: the block's rows of the residual
//                                   gradient entering the first layer, columns c, and the rows'
//                                   tokens; its partial sums carry the head's finished tile and
//                                   the embedding's own accumulator, added once at the end); wpe's
//                                   the row sums by position r % T (K blocks, no tokens);
//   attention backward qkv.grad[(b, t), c] (GPT) NARROWED: every element is a chain over the
//                                   sequence's positions (keys for dq, queries for dk and dv), in
//                                   blocks of 32; block k of a dv column reads the att columns of
//                                   its positions and atty.grad of the block's rows; of a dq
//                                   column, its whole att rows and atty.grad rows (dP's row sum),
//                                   v of the whole sequence (dA) and k of the block's rows; of a
//                                   dk column, the same for the block's rows and q of them. The
//                                   backward's datt/dpreatt scratch is recomputed, not traced.
//                                   Above T = 256 (at or below it the plans are unchanged) the
//                                   softmax backward's row sums s_t (the chain over t2 of
//                                   att[t, t2] * dA[t, t2]) are chained FIRST, in the tile's own
//                                   partial: blocks qb * nb + kb (nb = ceil(T / 32)) continue the
//                                   sums of query block qb over key block kb, for every (b, h)
//                                   the tile's q and k columns need (all T rows each), reading
//                                   att's 32 x 32 of the group, dout of the query rows and v of
//                                   the key rows (the head's hs columns); then the nb chain
//                                   blocks read only the block's 32 positions: dq att of its rows
//                                   in the block's columns, dout of its rows, v and k of the
//                                   block's rows; dk att of the block's rows in its columns,
//                                   dout and q of the block's rows, v of its rows; each takes the
//                                   agreed s_t from the partial (groups x T sums, then the
//                                   tile's accumulators). No new traced operator: the sums are
//                                   partials of the disputed tile, like att's max and sum;
//   linear input gradient dX[r, c]  rows r of the output gradient (all OC) and columns c of the
//                                   weight (all OC); above OC = 784 its chain over o is narrowed
//                                   into blocks of 256 (the GPT's ln2.grad, ln1.grad; above
//                                   n_embd 784 also atty.grad, fch_gelu.grad);
//   layernorm input gradient dX[r, c] (GPT) the whole rows r of the output gradient and of the
//                                   layernorm's input (each row's mean, rstd and two sums over c),
//                                   the whole weight, and the tile of the residual gradient it is
//                                   added into (ResidualBackward's 0 + g; none for ln_f); above
//                                   C = 784 NARROWED: blocks 0..2nb-1 the input rows' mean and
//                                   variance sums as the forward's, 2nb..3nb-1 LayerNormBackward's
//                                   dmean = dmean + dnorm and dnmean = fma(dnorm, norm, dnmean)
//                                   over the block's columns (dout, input and weight of them; the
//                                   partial: R means, R rstds, R dmeans, R dnmeans), block 3nb
//                                   the tile's columns (and the residual gradient's tile);
//   layernorm dweight[c], dbias[c]  a reduction over the rows: NARROWED like dW below, block k
//                                   reading rows k of the output gradient (columns c) and, for
//                                   dweight, the whole rows k of the input (their mean and rstd);
//                                   above C = 784 dweight's row block k is itself 2 nb + nq
//                                   blocks: the rows' mean and variance sums in nb column blocks
//                                   of 256 each (as the forward's), then nq = ceil(min(C, 1024)
//                                   / 256) chunks of 256 of the tile's columns continuing their
//                                   fma chains over the block's rows (dout and input of them; a
//                                   chunk past a short tile's columns reads nothing); the partial:
//                                   the tile's accumulators, then the row block's sums;
//   linear dW[o, c], db[o]          a reduction over the whole batch: NARROWED. The batch is cut
//                                   into fixed blocks of kTileRows rows; the engine's sum is one
//                                   sequential chain over the batch (kernels.h), so the partial
//                                   accumulator after block k is a well-defined value S_k (S_0 =
//                                   0). The footprint of (tile, block k) is block k's rows of the
//                                   output gradient and of the input (or of the examples), and
//                                   RecomputeTile continues the chain from the agreed S_k to
//                                   S_{k+1}; after the last block it also applies the final
//                                   "grad += sum" (0 + S_K), giving the recorded tile;
//   optimizer update                the same elements of the parameter, its gradient, and the
//                                   optimizer moments (from the step's input state); clipped
//                                   (optimizer.grad_clip > 0), also the one tile of "grad_norm".
//                                   The same footprint for the updated parameter and for each
//                                   updated moment (AdamW's m and v, SGD's momentum buffer),
//                                   which are operators of their own after every parameter
//                                   (TileOp::update_output);
//   grad_norm.blocks[e]             (clipped steps) partial e of SumSquaresTree (kernels.h): the
//                                   squares of 1024 consecutive elements of one gradient, chained
//                                   by fma from 0. NARROWED: a tile holds 1024 independent
//                                   partials (4 MiB of gradient), so its block k is its partial k
//                                   alone (S_k = the tile with partials 0..k-1 filled in, 0 after);
//                                   the footprint of a block is the gradient tiles its 1024
//                                   elements lie in, row segment by row segment: whatever the
//                                   gradient's width C, at most 34 tiles and 136 KiB of values
//                                   (the worst C, 1085, found by enumerating every C to 2100 and
//                                   every alignment; a vector's block is one tile; 128 KiB on
//                                   the 10M GPT, in its 1536-wide down projection), plus the
//                                   4 KiB partial;
//   grad_norm (1 value)             sqrt of the chain over the parameters, in order, of
//                                   "total + the pairwise tree of that parameter's partials"
//                                   (optim.cc's SumGradSquares). NARROWED: block k is parameter k;
//                                   its footprint the tiles of grad_norm.blocks holding that
//                                   parameter's ceil(n / 1024) partials (4 bytes a 1024
//                                   elements), and the last block also takes the square root.
//                                   Above 8192 partials (8M elements; GPT-2's wte, every
//                                   parameter of the 10M GPT is below) a parameter takes one
//                                   block per chunk of 8192 partials (32 KiB in at most 9 tiles,
//                                   whatever the parameter's size): the pairwise tree's node over
//                                   an aligned run of 2^13 leaves is that run's own tree, so a
//                                   chunk block computes its chunk's tree and the parameter's
//                                   last chunk the tree over the chunks' roots, bit for bit the
//                                   whole tree; the partial is the total before the parameter,
//                                   then the roots of its chunks so far (1 + chunk floats);
// The input state tensors ("in.<name>") are operators of the plan but are not recomputed: they
// are the step's input (RecomputeTile refuses them).
//
// Micro-batches (train.micro_batches = M > 1; pipeline.h's order). The plan follows the trace of
// StepOnBatch with M micro-batches (op_trace.h): the input state; for m = 0..M-1, micro-batch m's
// forward and backward operators over its B / M rows (TilePlan::batch stays the whole step's;
// TileOp::batch_offset is where the micro-batch starts, and a footprint's batch_rows are the
// step's batch positions), named "mb<m>.<name>", and its parameter gradients as accumulated
// after it: the footprints above over the micro-batch's rows, NARROWED the same way, but the last
// block's "grad += sum" adds S_K into micro-batch m-1's accumulated tile (the gradient operator's
// operand v, read by the last block as one more footprint tile) instead of into zero; the loss
// gradient is scaled by MicroBatchLossScale(M) / (B / M) as the kernels scale it. A GPT's tied
// head gradient accumulates in its own buffer: "mb<m>.<wte>.head.grad" is the head's dW chained
// the same way (a linear dW with v the previous micro-batch's), wte's own per-micro-batch
// gradient is the embedding's alone (no head blocks), and after the last micro-batch
// "<wte>.grad" = the two added elementwise (AddTiedHeadGrad, a kTileOpResidual). Then the norm
// and the update as for M = 1, reading the last micro-batch's gradients and "<wte>.grad". M = 1
// is the unsplit plan, unchanged.
//
// A conv2d output tile reads, for its samples, the input rows its output rows see, in every
// channel: over 4 channels its chain (over (c, kh, kw), kernels.h) is narrowed into blocks of 4
// channels. Its gradients (kernels.h's Conv2dBackward, MaxPool2dBackward):
//   conv input gradient dX[r, (c, ih, iw)]  each element a chain over (oc, kh, kw) from 0, then
//                                   "dinp += acc": the output gradient's rows r, in the output
//                                   rows whose windows reach the tile's input rows (all of them
//                                   when the tile spans two input channels), of every output
//                                   channel, and the weight's rows of those channels in the
//                                   tile's input channels' columns; over 4 output channels
//                                   NARROWED into blocks of 4 (the partial: the accumulators);
//                                   4 x 32 x 4 x (rows reached) x OW bytes of dout a block,
//                                   rounded up to whole tiles (the fashion CNN's second conv:
//                                   at most 128 KiB);
//   conv dW[oc, (c, kh, kw)], db[oc] each element a chain over (b, oh, ow) from 0 (dW: fma of
//                                   dout and the input, 0 in the padding; db: adds), then
//                                   "grad += acc": NARROWED into blocks (k, g) = k * G + g, row
//                                   block k of 32 samples over output-channel group g of the
//                                   tile (groups of max(1, 784 / (OH OW)) output planes, G of
//                                   them for the widest tile; a group past a short tile's end
//                                   reads nothing): dout's rows of block k in the group's
//                                   planes, dW also the layer's input rows of block k in the
//                                   tile's input channels (all H W positions; the first conv's:
//                                   the 32 examples); 4 x 32 x (784 + channels x H W) bytes
//                                   plus tile rounding (the fashion CNN: at most 204,480 bytes,
//                                   the first conv's dW with its 32 examples); an input of more
//                                   positions grows with H W (not narrowed further);
//   max-pool input gradient dX[r, (c, ih, iw)]  "dinp[argmax] += dout" from 0 over the outputs in
//                                   increasing order: per channel of the tile, the pooled
//                                   gradient's rows whose windows reach the tile's rows, and the
//                                   forward input's rows of those windows (the argmax, by the
//                                   forward's first-then-strictly-greater scan); at most 36 KiB
//                                   on the fashion CNN; where that passes the bound
//                                   (TileOp::window_chain) NARROWED into a chain over the outputs
//                                   reaching the tile, each input row run's outputs in increasing
//                                   (oh, ow), a group of consecutive outputs of a row (or whole
//                                   rows) a block, within 48 tiles: their dout and their k rows'
//                                   window columns (the partial: the tile's accumulators; one
//                                   output a block where two pass 48 tiles); a window past 29
//                                   rows (its one output's 2 tiles a row pass the bound),
//                                   forward or input gradient, in chunks of 20 rows (13 past
//                                   33), the partial carrying the running maximum (and, for the
//                                   gradient, its index in the window); a first layer's window
//                                   spanning more of its examples' 1,024-float chunks than a
//                                   witness holds, in chunks of rows within 40 chunks;
//   dropout out[r, c], dX[r, c]     the same elements of its input (of the output gradient), and
//                                   the mask, which is not an input: the recompute draws each
//                                   element's mask from its position in the micro-batch's tensor
//                                   (i = r * cols + c), the step's dropout seed (TilePlan::
//                                   dropout_seed: the ledger's DropoutSeed(task seed, unit
//                                   stream), never the witness's) and the layer's stream
//                                   (model.h's DropoutStream(step, layer, micro-batch)), as the
//                                   whole step's counter-based Philox draw does, element by
//                                   element (kernels.h): 4 KiB;
//   layernorm over an image's last dimension W (rows (c, h) of each sample, conv = {W}):
//     out[r, f], dX[r, f]           the whole runs of W columns the tile's columns fall in, of the
//                                   tile's rows (of the input; dX also of the output gradient),
//                                   and the whole weight (and bias) of W: at most 32 x (32 + 2 W
//                                   - 2) floats an operand, 68 KiB at W = 256; above W = 256
//                                   NARROWED as a wide layernorm over rows (below) over blocks of
//                                   256 of each of the one or two runs the tile's columns fall in
//                                   (the partial: each of the tile's rows' runs' statistics, run
//                                   by run), the last block the tile's own columns and the weight
//                                   (and bias) columns they read: at most 2 x 32 x 288 floats an
//                                   operand a block, whatever W;
//     dweight[w], dbias[w]          a chain over the layernorm's rows n = (sample, run) from 0:
//                                   NARROWED into blocks of max(1, 256 / W) rows (a run of the
//                                   output gradient and, for dweight, of the input per row: about
//                                   1 KiB of values an operand, contiguous in the tensor, in at
//                                   most 16 of its tiles); the partial: the tile's accumulators.
//                                   Above W = 256 a block is one run: dbias reads the tile's
//                                   columns of it (at most 33 tiles), dweight is narrowed as a
//                                   wide layernorm's row block (2 nb sum sub-blocks of 256 of the
//                                   run's input, then chunks of 256 of the tile's columns).
//
// Covered today: in sequential models, linear, relu, gelu, conv2d, maxpool2d and dropout layers,
// and layernorm layers over each sample's features (the GPT's layernorm operators on the batch's
// rows) or over an image's last dimension, their outputs and gradients (all of the fashion MLP
// and of the fashion CNN), with AdamW or SGD, clipped
// or not (a clipped step commits its global gradient norm as the two operators above, between
// the gradients and the update); in a GPT, the whole forward: the token embeddings (encoded), the
// linear operators (qkv, attention projection, MLP up and down projections, the tied LM head),
// the layernorms (ln1, ln2, ln_f), attention (att, atty), the MLP's gelu, the residual adds
// (residual2, residual3) and the token loss; the whole backward: logits.grad,
// the linears' input gradients (ln_f.grad through the tied head, fch_gelu.grad, ln2.grad,
// atty.grad, ln1.grad), the gelu's (fch.grad), the layernorms' input gradients added into the
// residual gradient (residual.grad, residual3.grad), every linear's and layernorm's weight and
// bias gradient, wte's and wpe's, the attention backward (qkv.grad); and the (clipped) update of
// every parameter: all 275 of the 10M GPT's computed operators. Every operator of a plan the
// engine builds has a footprint; an operator without one would be in the plan with its name and
// grid but opaque (kTileOpOpaque: Footprint refuses it, naming why), and an opaque gradient
// would not keep the norm and the update from being ruled: both read gradients only as agreed
// inputs. A GPT
// plan's batch rows are tokens (TilePlan::tokens; TileInputs::tokens and y, the targets); the
// ledger makes the operators reading them opaque for a token task without a data root over its
// pages (ledger/referee_tile.h, TokenOpsOpaque). PlanStepTiles refuses a layer kind it does not
// know (FailedPrecondition).
//
//   ML_ASSIGN_OR_RETURN(TilePlan plan, PlanStepTiles(model, optimizer, batch_size, seq_len, M));
//   ML_ASSIGN_OR_RETURN(TileFootprint fp, Footprint(plan, j, t, block));
//   TileInputs in = GatherTileInputs(plan, fp, trace, batch);      // a party, from its own run
//   in.partial = ...;                                              // reductions: S_block
//   ML_ASSIGN_OR_RETURN(std::vector<float> out, RecomputeTile(plan, j, t, block, step, in));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshlearn/base/status.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/tile.h"

namespace meshlearn::engine {

enum class TileOpKind : uint8_t {
  kTileOpState = 0,         // an input state tensor: not recomputed
  kTileOpLinear,            // out = x @ w^T + b
  kTileOpRelu,              // out = relu(x)
  kTileOpLoss,              // per-sample softmax cross-entropy of logits x (B x 1)
  kTileOpLossGrad,          // d loss / d logits x
  kTileOpLinearInputGrad,   // x = dout, w = weight
  kTileOpReluInputGrad,     // x = dout, w = the relu's input
  kTileOpLinearWeightGrad,  // x = dout, w = the layer's input; reduction over the batch; v =
                            // the previous micro-batch's accumulated gradient (-1: zeroed)
  kTileOpLinearBiasGrad,    // x = dout; reduction over the batch; v as above
  kTileOpAdamW,             // x = parameter, w = gradient, b = m, v = v
  kTileOpSgd,               // x = parameter, w = gradient, b = momentum buffer (or none)
  kTileOpOpaque,            // computed by the step, but without a footprint yet
  kTileOpGelu,              // out = gelu(x)
  kTileOpGeluInputGrad,     // x = dout, w = the gelu's input
  kTileOpConv,              // out = conv2d(x, w) + b; chain over (c, kh, kw), narrowed by channels
  kTileOpMaxPool,           // out = the window maxima of x (conv holds C, H, W, C, k, k, stride, 0)
  kTileOpResidual,          // out = x + w (elementwise)
  kTileOpLayerNorm,         // out = layernorm of x's rows, w = weight, b = bias (vectors of C)
  kTileOpAttention,         // att: causal softmax(q k^T / sqrt(hs)) of x = qkv (conv: T, NH, C)
  kTileOpAttentionOut,      // atty = att @ v: x = att, w = qkv (conv: T, NH, C)
  kTileOpGradSquareBlocks,  // every gradient's SumSquaresTree block partials (sources: the
                            // gradient operators); each element its own reduction block
  kTileOpGradNorm,          // the global gradient norm from x = the block partials (sources as
                            // x's); a chain over the parameters
  kTileOpLayerNormInputGrad,   // x = dout, w = the layernorm's input, b = its weight; v = the
                               // gradient it adds into (-1: a zeroed one)
  kTileOpLayerNormWeightGrad,  // x = dout, w = the layernorm's input; reduction over the rows;
                               // v as a linear dW's
  kTileOpLayerNormBiasGrad,    // x = dout; reduction over the rows; v as above
  kTileOpEmbedding,            // encoded = wte[token] + wpe[position]: x = wte, w = wpe (conv: T)
  kTileOpEmbeddingGrad,        // wte / wpe gradient: x = the residual gradient entering the first
                         // layer; conv: T, 1 (rows by token, wte) or 0 (rows by position, wpe);
                         // wte also b = logits.grad, v = ln_f (the tied head's dW, chained
                         // first); a reduction over the rows. Without the head (b = -1,
                         // micro-batches), v as a linear dW's
  kTileOpAttentionBackward,  // qkv.grad: x = atty.grad, w = qkv, b = att (conv: T, NH, C); each
                             // element a chain over the sequence's positions, narrowed (above
                             // T = 256 after the softmax backward's row sums)
  kTileOpConvInputGrad,      // x = dout, w = weight (conv: the forward's); each element a chain
                             // over (oc, kh, kw), narrowed by output channels
  kTileOpConvWeightGrad,     // x = dout, w = the layer's input (conv: the forward's); a
                             // reduction over (b, oh, ow); v as a linear dW's
  kTileOpConvBiasGrad,       // x = dout (conv: the forward's); a reduction over (b, oh, ow); v
                             // as above
  kTileOpMaxPoolInputGrad,   // x = dout, w = the pool's input (its windows' argmax; conv: the
                             // forward's)
  kTileOpDropout,            // out = x * mask (conv: the layer's index, the micro-batch; p)
  kTileOpDropoutInputGrad,   // dX = 0 + dout * mask: x = dout (conv and p: the forward's)
};

// What an update operator (kTileOpAdamW, kTileOpSgd) records: the updated parameter (named as
// the parameter), or one optimizer state tensor after the update (named as Optimizer::State()
// names it: "optim.m.<param>", "optim.v.<param>", "optim.momentum.<param>"), so that a lie in
// the state the step leaves behind narrows to a tile of a moment like any operator output.
enum class TileUpdateOutput : uint8_t {
  kTileUpdateParam = 0,
  kTileUpdateFirstMoment = 1,   // AdamW's m, SGD's momentum buffer
  kTileUpdateSecondMoment = 2,  // AdamW's v
};

// An operand that is the batch's examples (x rows, y targets), not an operator.
inline constexpr int64_t kTileOperandBatch = -2;

struct TileOp {
  std::string name;  // OpTrace's name
  // kTileOpOpaque: why it has no footprint yet.
  TileOpKind kind = TileOpKind::kTileOpState;
  TileGrid grid;
  Shape shape;  // the tensor's shape (parameters: for the optimizer's weight-decay rule)
  // Operands: indices into TilePlan::ops (< this op's index), kTileOperandBatch, or -1 (none).
  int64_t x = -1, w = -1, b = -1, v = -1;
  std::string opaque;
  // kTileOpConv: C, H, W, OC, KH, KW, stride, pad (kernels.h's Conv2dForward); the attention
  // kinds: T, NH, C; the dropout kinds: the layer's index and the micro-batch (its mask's stream,
  // model.h's DropoutStream); the layernorm kinds of a layer over an image's last dimension: W, the
  // width of the rows it normalises (runs of W of each sample's columns; empty: the rows are the
  // tensor's).
  std::vector<int64_t> conv;
  // The dropout kinds: the layer's drop probability (its mask keeps a draw >= p, scaled by
  // 1 / (1 - p)).
  float dropout_p = 0.0f;
  // The global-norm operators: the gradient operators, in parameter order.
  std::vector<int64_t> sources;
  // A clipped update (kTileOpAdamW, kTileOpSgd with optimizer.grad_clip > 0): the step's
  // kTileOpGradNorm operator, whose one value sets the clipping factor; -1 when not clipped.
  int64_t clip_norm = -1;
  // The update kinds: which of the update's outputs this operator records (one update computes
  // all of them from the same footprint): the parameter, or an optimizer moment after it.
  TileUpdateOutput update_output = TileUpdateOutput::kTileUpdateParam;
  // An operator of micro-batch m of a step in M > 1 micro-batches: m * B / M, where its rows
  // start in the step's batch (its footprints' batch_rows are the step's batch positions).
  int64_t batch_offset = 0;
  // A pipeline stage's plan (PlanStageStepTiles): a tensor the stage received from a neighbour
  // ("recv.<what>", kTileOpState: an input of the step like its state, proven against the
  // sender's signed tiled root instead of the state hash).
  bool received = false;
  // A pipeline stage's clipped norm: kTileOpGradNorm is the running sum of squares the stage
  // sends on ("grad_squares": from v's one value, the sum stage s-1 sent, or 0 for stage 0; no
  // square root), and an update's clip_norm holds the total sum of squares, whose square root
  // is the norm.
  bool squares = false;
  // A max-pool's input gradient (kTileOpMaxPoolInputGrad) whose whole tile would read past the
  // 240 KiB of values a witness carries (the windows of every output reaching it: a 16 x 16
  // window of stride 8 over 601-wide rows, 290,816 bytes): PlanStepTiles sets it, and the tile is
  // NARROWED into a chain over the outputs reaching it, a group of consecutive outputs a block
  // (the kernel's dinp[argmax] += dout in increasing output order; the partial: the tile's
  // accumulators), one output in chunks of its rows past 29.
  bool window_chain = false;
};

struct TilePlan {
  std::vector<TileOp> ops;
  int64_t batch = 0;          // B (a GPT: B x T, the rows of its activations): the whole step's
  int64_t micro_batches = 1;  // M: each operator of a micro-batch has batch / M rows
  int64_t input_size = 0;     // floats of one example (0 for a GPT: its rows read tokens)
  int64_t classes = 0;
  // A GPT: the batch operand's rows are tokens (TileInputs::tokens, y the targets), in sequences
  // of seq_len.
  bool tokens = false;
  int64_t seq_len = 0;
  OptimizerSpec optimizer;
  // The step's dropout seed (step_replay.h's DropoutSeed(task seed, unit stream)), which a dropout
  // tile's mask is drawn from. PlanStepTiles leaves it 0: whoever rules or builds a witness sets
  // it from the task and unit it knows (the ledger: ledger/referee_tile.h's TileContextOf), never
  // from a witness.
  uint64_t dropout_seed = 0;
};

// An update operator's (kTileOpAdamW, kTileOpSgd) operand that holds, in the step's input state,
// what the operator outputs after it: the parameter (x), the first moment (b) or the second (v).
// -1 for any other operator.
int64_t UpdatedStateOperand(const TileOp& op);

// The training state committed the way operator outputs are (tile.h): the Merkle root over the
// tiled roots of every parameter and then every optimizer state tensor, in StateHash order (the
// order of the step's "in.<name>" operators): the root StateHash commits to (checkpoint.h's
// StateHashOfRoots), so one tile of the input state is provable against the agreed state hash.
// REQUIRES: state has an optimizer.
Hash256 StateTileRoot(TrainState& state);

// The plan of one training step of `model` trained by `optimizer` at batch size `batch` (a GPT:
// of `seq_len` tokens, 0 = block_size) in `micro_batches` micro-batches (train.micro_batches;
// 1: the unsplit step). FailedPrecondition (naming what) for a sequential layer it cannot plan;
// InvalidArgument when micro_batches does not divide batch.
Result<TilePlan> PlanStepTiles(const ModelSpec& model, const OptimizerSpec& optimizer,
                               int64_t batch, int64_t seq_len = 0, int64_t micro_batches = 1);

// The plan of one pipeline stage's step (pipeline.h): stage `part` of a GPT or of a sequential
// model, as Stage records it with an OpTrace attached (Stage::set_op_trace): the stage's input
// state ("in.<name>": its parameters, then its optimizer state); a GPT's later stage's copy of
// wte, "recv.tied_weight" (the last stage of S > 1); for m = 0..M-1 (names prefixed "mb<m>." when
// M > 1): the activations received from stage s-1 ("recv.activation", stages s > 0; rows of n_embd
// floats for a GPT, a sequential model's micro-batch rows x the features its first layer reads),
// the stage's forward operators, the gradient received from stage s+1 ("recv.activation_grad",
// stages s < S-1, rows as its output's), its backward operators and accumulated parameter
// gradients, and a GPT's last stage's head wte gradient ("<wte>.head.grad", accumulated in its own
// buffer whatever M); a GPT's stage 0 then adds the head's gradient ("recv.tied_head_grad" from
// the last stage, S > 1) into "<wte>.grad"; a clipped step ("recv.grad_squares" from stage s-1,
// s > 0) "grad_norm.blocks" and "grad_squares" (the running sum it sends on), then
// "recv.grad_total" (s < S-1: the last stage's "grad_squares"); and the update as a whole step's.
// A sequential stage's operators keep the whole model's layer indices ("layers.<i>.out": names,
// and a dropout's mask stream), and its first layer has an input gradient unless it is the
// model's first; a stage without parameters (a lone activation, pool or flatten) has an empty
// "grad_norm.blocks" and a "grad_squares" that is the sum it received, recomputed whole. Every
// tensor the stage sends is one of its operators (a GPT's last block's
// residual3, first block's residual.grad, the head gradient; a sequential stage's last layer's
// output and its first layer's input gradient, skipping a flatten, which records neither, and a
// dropout of p = 0, which records no gradient; and grad_squares), so a dispute over what it sent
// narrows to a tile like any other (a stage of nothing but such layers passes on what it
// received). Footprints and RecomputeTile apply unchanged; the received tensors are inputs (the
// ledger proves their tiles against the sender's signed tiled roots).
Result<TilePlan> PlanStageStepTiles(const ModelSpec& model, const OptimizerSpec& optimizer,
                                    ModelPart part, int64_t batch, int64_t seq_len = 0,
                                    int64_t micro_batches = 1);

// Number of fixed reduction blocks a tile of op j is narrowed into (dW, db: the batch in blocks of
// kTileRows rows; a wide linear: its chain in blocks of 256; a conv: 4 channels a block, its input
// gradient 4 output channels a block, its dW and db a row block of kTileRows over an
// output-channel group a block; a conv2d forward or max-pool over wide images whose tile reads
// too much: its tile in pieces of output segments (a max-pool's piece one block); a max-pool
// input gradient with TileOp::window_chain: a group of the outputs reaching the tile a block; att and atty
// above T = 256: 2 nb + 1 and nb blocks of 32 positions (nb = T / 32, rounded up); `encoded` of
// a vocabulary above 1024: wte's rows in blocks of 1024, each setting its tokens' rows;
// grad_norm.blocks: kTileFlat, one partial a block, those past a short last tile's end changing
// nothing; grad_norm: one parameter a block, or one chunk of 8192 of a parameter's partials), or
// 0 when op j's tiles are recomputed whole.
int64_t ReductionBlocks(const TilePlan& plan, int64_t op);

// The floats of the partial sum S_block that block `block` of tile `tile` of a reduction op j
// continues from (TileInputs::partial; what a witness carries): the tile's, but a narrowed
// softmax's or attention's row statistics, wte's gradient's two tiles past the tied head, and a
// chunked parameter's roots so far after grad_norm's total. 0 for block 0 and for an operator whose
// tiles are recomputed whole. REQUIRES: the indices are in range (Footprint accepts them).
int64_t ReductionPartialFloats(const TilePlan& plan, int64_t op, int64_t tile, int64_t block);

struct TileRef {
  int64_t op = 0;
  int64_t tile = 0;
  bool operator==(const TileRef&) const = default;
};

struct TileFootprint {
  std::vector<TileRef> tiles;       // operand tiles, in a fixed order
  std::vector<int64_t> batch_rows;  // batch positions whose examples are read, increasing
  // Examples of more than kExampleChunkFloats floats (step_replay.h): the chunks of each example
  // of batch_rows the tile reads, increasing (none when it reads their labels only). Empty for
  // smaller examples, which are read whole.
  std::vector<int64_t> batch_chunks;
};

// The operand tiles output tile `tile` of op `op` depends on; for a reduction op, those of fixed
// block `block` only (0 <= block < ReductionBlocks; else block must be 0). InvalidArgument for an
// index out of range; FailedPrecondition for an input state operator.
Result<TileFootprint> Footprint(const TilePlan& plan, int64_t op, int64_t tile, int64_t block);

// The floats of values footprint `fp` of block `block` of tile `tile` of operator `op` names: its
// tiles, the examples it reads (by the chunks it reads where chunked) and the partial. A witness
// of the block carries these (plus one label per example) beside its proofs; the plan narrows or
// refuses a max-pool whose blocks' witnesses could pass the bound by it (with their proofs:
// TileRuleMaxPoolBlockWitnessBytes).
int64_t TileRuleFootprintFloats(const TilePlan& plan, int64_t op, int64_t tile, int64_t block,
                                const TileFootprint& fp);

// The bytes the plan prices a witness of footprint `fp` (block `block` of tile `tile` of operator
// `op`) at: its values (TileRuleFootprintFloats), a header and a Merkle proof at the plan's proof
// levels (its largest operator's tiles) for each of its tiles and example chunks, each example's
// leaf with a proof of 24 levels (the data set's size is not the plan's) and the fixed parts
// (magic, counts, the output roots of the operators before `op`). A token task's pages are not
// priced. The engine cannot see the ledger's encoder; ledger test TileWitnessPriceTest pins this
// to what ledger::EncodeTileWitness makes of the witness BuildTileWitness builds.
// TileRuleMaxPoolBlockWitnessBytes reads a max-pool's blocks by it past its arithmetic bound.
int64_t TileRuleFootprintWitnessBytes(const TilePlan& plan, int64_t op, int64_t tile, int64_t block,
                                      const TileFootprint& fp);

// The most bytes a witness of a block of max-pool operator `op` (forward or input gradient) of
// `plan` can take: its values, each tile's (or example chunk's) Merkle proof at the plan's proof
// levels (its largest operator's tiles), its examples' leaves (a proof of 24 levels) and the fixed
// parts, at the worst alignment of its windows (or, past the bound by that arithmetic, its first
// tile row's blocks read exactly). PlanStepTiles narrows or refuses every max-pool past the
// ledger's 256 KiB bound (kMaxTileWitnessBytes) by it. InvalidArgument for an operator out of
// range or not a max-pool.
Result<int64_t> TileRuleMaxPoolBlockWitnessBytes(const TilePlan& plan, int64_t op);

// The values a footprint names.
struct TileInputs {
  std::vector<std::vector<float>> tiles;  // tiles[i]: footprint.tiles[i]'s values (ExtractTile)
  // x[i], y[i]: the example at footprint.batch_rows[i], of the model's input size; a chunked
  // example's floats outside footprint.batch_chunks are zeros (the tile does not read them).
  std::vector<std::vector<float>> x;
  std::vector<int32_t> y;
  // A token plan (TilePlan::tokens): the input token of each footprint.batch_rows[i] (x is
  // empty; y holds the targets).
  std::vector<int32_t> tokens;
  // A reduction op: the partial accumulator S_block of the tile (empty for block 0: zeros).
  std::vector<float> partial;
};

// Recomputes output tile `tile` of op `op` at 0-based step index `step` (the optimizer's
// schedule) from `inputs`. A reduction op returns S_{block+1}, or the output tile itself after
// the last block. InvalidArgument (naming what) when the inputs do not match the footprint.
Result<std::vector<float>> RecomputeTile(const TilePlan& plan, int64_t op, int64_t tile,
                                         int64_t block, int64_t step, const TileInputs& inputs);

// What a party that ran the step holds: the footprint's values, from its trace (recorded with
// keep_values) and the step's batch. REQUIRES: `trace` follows `plan`.
TileInputs GatherTileInputs(const TilePlan& plan, const TileFootprint& footprint,
                            const OpTrace& trace, const Batch& batch);

// The chain of a reduction tile from a party's run: partials[k] = S_k for k = 0..blocks-1 (S_0
// empty = zeros), and the output tile last. REQUIRES: ReductionBlocks(plan, op) > 0.
Result<std::vector<std::vector<float>>> ReductionChain(const TilePlan& plan, int64_t op,
                                                       int64_t tile, int64_t step,
                                                       const OpTrace& trace, const Batch& batch);

}  // namespace meshlearn::engine
