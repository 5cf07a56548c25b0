// The tile rule (tile_rule.h) on the fashion CNN's gradients: every tile of the convolutions'
// input, weight and bias gradients and of the max-pools' input gradients, recomputed from its
// footprint alone (block by block where narrowed) with the reference kernels' order, equals the
// tile the whole step's fast kernels produced, bit for bit; and every block's footprint stays
// under the 256 KiB witness bound.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace tile_rule_conv_test {  // named: the tests build as unity translation units

bool IsWindowGrad(TileOpKind k) {
  return k == TileOpKind::kTileOpConvInputGrad || k == TileOpKind::kTileOpConvWeightGrad ||
         k == TileOpKind::kTileOpConvBiasGrad || k == TileOpKind::kTileOpMaxPoolInputGrad;
}

// The bytes of values a footprint names (its tiles, its examples with their targets, chunked
// examples by the chunks it reads, the partial sum): what a witness of the block carries besides
// proofs.
int64_t FootprintBytes(const TilePlan& plan, int64_t op, int64_t tile, int64_t block,
                       const TileFootprint& fp) {
  return 4 * TileRuleFootprintFloats(plan, op, tile, block, fp) +
         4 * static_cast<int64_t>(fp.batch_rows.size());
}

// Asserts that each operator's largest footprint in `largest` (ExpectEveryTileRecomputes) leaves
// room for the proofs under the 256 KiB witness bound, and prints it after `label` where `print`.
void ExpectUnderTheBound(const std::string& label, const std::map<std::string, int64_t>& largest,
                         bool print = true) {
  for (const auto& [name, bytes] : largest) {
    if (print) {
      std::printf("[ %s] %-22s largest footprint %lld bytes\n", label.c_str(), name.c_str(),
                  static_cast<long long>(bytes));
    }
    EXPECT_LE(bytes, 240 * 1024) << label << " " << name << ": room for the proofs under 256 KiB";
  }
}

// Takes one step of `spec` on `data` (nonzero Adam moments), traces the second, and checks that
// nothing in its plan is opaque and that every tile of every operator `check` picks recomputes
// (block by block where narrowed) to the traced bits. Returns, per operator checked, its largest
// footprint's bytes; `checked` counts the operators.
std::map<std::string, int64_t> ExpectEveryTileRecomputes(const TaskSpec& spec, const TaskData& data,
                                                         bool (*check)(TileOpKind),
                                                         int64_t* checked) {
  std::map<std::string, int64_t> largest;  // operator -> its largest footprint's bytes
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(spec, data);
  EXPECT_TRUE(tr.ok()) << tr.status().ToString();
  if (!tr.ok()) return largest;
  (*tr)->Step();
  TrainState& st = (*tr)->state();
  const int64_t step = st.step, M = spec.micro_batches;
  const Batch batch = (*tr)->BatchForStep(step);
  OpTrace trace;
  trace.set_keep_values(true);
  st.model->set_op_trace(&trace);
  StepOnBatch(st, batch, DropoutSeed(spec.seed, spec.stream), nullptr, M);
  st.model->set_op_trace(nullptr);
  Result<TilePlan> plan = PlanStepTiles(spec.model, st.optimizer->spec(), batch.size, 0, M);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return largest;
  plan->dropout_seed = DropoutSeed(spec.seed, spec.stream);
  EXPECT_EQ(plan->ops.size(), trace.size());
  *checked = 0;
  for (size_t j = 0; j < trace.size() && j < plan->ops.size(); ++j) {
    const TileOp& op = plan->ops[j];
    EXPECT_EQ(op.name, trace.name(j));
    EXPECT_EQ(op.grid, trace.grid(j)) << op.name;
    EXPECT_NE(op.kind, TileOpKind::kTileOpOpaque) << op.name << ": every operator is covered";
    if (!check(op.kind)) continue;
    ++*checked;
    const int64_t jj = static_cast<int64_t>(j);
    const int64_t blocks = ReductionBlocks(*plan, jj);
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      SCOPED_TRACE(op.name + " tile " + std::to_string(t));
      for (int64_t k = 0; k < std::max<int64_t>(blocks, 1); ++k) {
        Result<TileFootprint> fp = Footprint(*plan, jj, t, k);
        EXPECT_TRUE(fp.ok()) << fp.status().ToString();
        if (!fp.ok()) return largest;
        int64_t& most = largest[op.name];
        most = std::max(most, FootprintBytes(*plan, jj, t, k, *fp));
      }
      const std::vector<float> want = ExtractTile(trace.values(j), op.grid, t);
      std::vector<float> got;
      if (blocks > 0) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(*plan, jj, t, step, trace, batch);
        EXPECT_TRUE(chain.ok()) << chain.status().ToString();
        if (!chain.ok()) return largest;
        got = chain->back();
      } else {
        Result<TileFootprint> fp = Footprint(*plan, jj, t, 0);
        Result<std::vector<float>> one =
            RecomputeTile(*plan, jj, t, 0, step, GatherTileInputs(*plan, *fp, trace, batch));
        EXPECT_TRUE(one.ok()) << one.status().ToString();
        if (!one.ok()) return largest;
        got = *one;
      }
      EXPECT_TRUE(testing::SameBits(got, want));
      if (::testing::Test::HasFailure()) return largest;  // one tile's failure says it
    }
  }
  return largest;
}

// The task of a synthetic tile test: `name` and `seed`, a model over `input` (its dimensions as
// TOML, "3, 32, 32") with `layers` (its [[model.layers]] tables), AdamW at lr 1e-2, 10 steps of
// `batch`. The data files are never read: the tests make their own data.
Result<TaskSpec> SyntheticTask(const std::string& name, int seed, const std::string& input,
                               const std::string& layers, int batch) {
  const std::string toml =
      "[task]\nname = \"" + name + "\"\nseed = " + std::to_string(seed) +
      "\n[data]\nformat = \"npy\"\ntrain_x = \"unused\"\ntrain_y = "
      "\"unused\"\ntest_x = \"unused\"\ntest_y = \"unused\"\n[model]\ninput = [" +
      input + "]\n" + layers +
      "[optimizer]\nkind = \"adamw\"\nlr = 1e-2\n[train]\nsteps = 10\n"
      "batch_size = " +
      std::to_string(batch) + "\n";
  return TaskSpec::Parse(toml, name + ".toml", ".");
}

// examples/fashion-cnn.toml's model and optimizer at batch 40 (two row blocks, the second of 8
// rows), in `micro_batches` micro-batches, on random images: every tile of every conv and pool
// gradient recomputes to the traced bits, each block's footprint under the bound.
void ExpectConvGradientsRecompute(int64_t micro_batches) {
  Result<TaskSpec> spec = TaskSpec::Load(
      Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-cnn.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->batch_size = 40;
  spec->micro_batches = micro_batches;
  const TaskData d = testing::RandomTaskData(80, {1, 28, 28}, 10, 33, -0.5f, 0.5f);
  int64_t ops = 0;
  const std::map<std::string, int64_t> largest =
      ExpectEveryTileRecomputes(*spec, d, IsWindowGrad, &ops);
  // Per micro-batch: two pool and one conv input gradients, two convs' weight and bias.
  EXPECT_EQ(ops, 7 * micro_batches);
  ExpectUnderTheBound("conv grad M=" + std::to_string(micro_batches), largest);
}

TEST(TileRuleConvTest, EveryConvAndPoolGradientTileRecomputesBitForBit) {
  ExpectConvGradientsRecompute(1);
}

// Micro-batched: each micro-batch's conv weight and bias gradient ends by adding into the
// previous micro-batch's accumulated one.
TEST(TileRuleConvTest, EveryConvAndPoolGradientTileRecomputesInMicroBatches) {
  ExpectConvGradientsRecompute(2);
}

// A pool gradient element takes the gradient of exactly the windows whose argmax it is: in the
// footprint of a pool gradient tile, raising one input of the forward (making it its window's
// maximum) moves that window's gradient onto it, and nothing else.
TEST(TileRuleConvTest, APoolGradientFollowsItsWindowsArgmax) {
  Result<TaskSpec> spec = TaskSpec::Load(
      Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-cnn.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 40);
  ASSERT_TRUE(plan.ok());
  int64_t pool = -1;
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    if (plan->ops[j].name == "layers.5.in.grad") pool = static_cast<int64_t>(j);
  }
  ASSERT_GE(pool, 0);
  const TileOp& o = plan->ops[static_cast<size_t>(pool)];
  ASSERT_EQ(o.kind, TileOpKind::kTileOpMaxPoolInputGrad);
  // Tile 0: rows 0..31, columns 0..31 of channel 0 of the 14 x 14 input: input rows 0..2, the
  // pooled rows 0..1 of dout and input rows 0..3 of the forward (the windows').
  Result<TileFootprint> fp = Footprint(*plan, pool, 0, 0);
  ASSERT_TRUE(fp.ok()) << fp.status().ToString();
  TileInputs in;
  for (const TileRef& r : fp->tiles) {
    const int64_t n = plan->ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel();
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = r.op == o.x ? 1.0f + static_cast<float>(i) : 0.0f;
    in.tiles.push_back(v);
  }
  Result<std::vector<float>> base = RecomputeTile(*plan, pool, 0, 0, 0, in);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  // All-zero windows: the argmax is each window's first element (the strict '>' scan).
  EXPECT_EQ((*base)[0], 1.0f);   // row 0, (0, 0): window (0, 0)'s dout
  EXPECT_EQ((*base)[1], 0.0f);   // (0, 1)
  EXPECT_EQ((*base)[15], 0.0f);  // (1, 1)
  // Raise the forward's (1, 1) in row 0 (the pool input's tile, columns 0..31 hold (0..2, *)).
  for (size_t i = 0; i < fp->tiles.size(); ++i) {
    if (fp->tiles[i].op == o.w && fp->tiles[i].tile == 0) in.tiles[i][15] = 2.0f;
  }
  Result<std::vector<float>> moved = RecomputeTile(*plan, pool, 0, 0, 0, in);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*moved)[0], 0.0f);
  EXPECT_EQ((*moved)[15], 1.0f);
  for (size_t e = 0; e < moved->size(); ++e) {
    if (e != 0 && e != 15) {
      EXPECT_EQ((*moved)[e], (*base)[e]) << e;
    }
  }
}

bool IsLayerNormKind(TileOpKind k) {
  return k == TileOpKind::kTileOpLayerNorm || k == TileOpKind::kTileOpLayerNormInputGrad ||
         k == TileOpKind::kTileOpLayerNormWeightGrad || k == TileOpKind::kTileOpLayerNormBiasGrad;
}

// A sequential model's layernorm layers (over each sample's features) are the GPT's layernorm on
// the batch's rows: the first on the examples (no input gradient; its weight gradient reads
// them), one between a linear and a relu. Batch 40 (a short second row block), 70 inputs, 36
// features; every tile of their forwards, input gradient and weight and bias gradients
// recomputes to the traced bits, unsplit and in two micro-batches.
TEST(TileRuleConvTest, SequentialLayerNormLayersRecomputeBitForBit) {
  for (int64_t M : {1, 2}) {
    SCOPED_TRACE("micro_batches " + std::to_string(M));
    Result<TaskSpec> spec = SyntheticTask("tile-layernorm", 5, "70", R"([[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "linear"
out = 36
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 5
)",
                                          40);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec->micro_batches = M;
    const TaskData d = testing::RandomTaskData(200, {70}, 5, 8, -1.0f, 1.0f);
    int64_t ops = 0;
    ExpectEveryTileRecomputes(*spec, d, IsLayerNormKind, &ops);
    // Per micro-batch: two forwards, one input gradient, two weight and two bias gradients.
    EXPECT_EQ(ops, 7 * M);
  }
}

bool IsDropoutOrLayerNormKind(TileOpKind k) {
  return k == TileOpKind::kTileOpDropout || k == TileOpKind::kTileOpDropoutInputGrad ||
         IsLayerNormKind(k);
}

// A small CNN with dropout and layernorm layers over its images' last dimension, on 2 x 6 x 10
// images (runs of W = 10 that 32-column tiles cut across), at batch 40 (a short second row
// block), unsplit and in two micro-batches (each drawing its own masks): `leading` puts a dropout
// first (on the examples; else the first layernorm reads them). Every tile of every dropout and
// layernorm operator (forward, input gradient, and the weight and bias gradients' chains over
// the runs, block by block) recomputes to the traced bits, its mask drawn from the plan's dropout
// seed; nothing in the plan is opaque; every footprint is under the witness bound.
TEST(TileRuleConvTest, DropoutAndImageLayerNormLayersRecomputeBitForBit) {
  constexpr char kLayers[] = R"(
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "conv2d"
out = 3
kernel = 3
pad = 1
[[model.layers]]
kind = "dropout"
p = 0.3
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "dropout"
p = 0.0
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "dropout"
p = 0.5
[[model.layers]]
kind = "linear"
out = 5
)";
  for (const bool leading : {false, true}) {
    for (int64_t M : {1, 2}) {
      SCOPED_TRACE(std::string(leading ? "a leading dropout" : "a leading layernorm") +
                   ", micro_batches " + std::to_string(M));
      Result<TaskSpec> spec = SyntheticTask(
          "tile-dropout", 11, "2, 6, 10",
          std::string(leading ? "[[model.layers]]\nkind = \"dropout\"\np = 0.2\n" : "") + kLayers,
          40);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      spec->micro_batches = M;
      const TaskData d = testing::RandomTaskData(200, {2, 6, 10}, 5, 13, -1.0f, 1.0f);
      int64_t ops = 0;
      const std::map<std::string, int64_t> largest =
          ExpectEveryTileRecomputes(*spec, d, IsDropoutOrLayerNormKind, &ops);
      // Per micro-batch: two layernorms (forward, input gradient but the first layer's, weight
      // and bias gradients), the dropouts' forwards (the p = 0 one passing its input through)
      // and the input gradients of those with p > 0 but the first layer.
      EXPECT_EQ(ops, (leading ? 14 : 12) * M);
      ExpectUnderTheBound("dropout", largest, /*print=*/M == 1 && !leading);
    }
  }
}

// A layernorm over an image's rows wider than 256 is narrowed over blocks of 256 of each run's
// columns: on 2 x W images, W = 300 (runs that 32-column tiles cut across, so a tile's partial
// carries two runs' statistics, and a last column block of 44; unsplit, in two micro-batches,
// and as the first layer, reading the examples), W = 1024 (four whole blocks, the weight one
// tile) and W = 1100 (a weight of two tiles, the second of 76), at batch 40 (a short second row
// block). Every tile of its forward, input
// gradient (a relu comes first) and weight and bias gradients (a chain over the runs, one run a
// block, the weight's narrowed into sum sub-blocks and column chunks) recomputes block by block
// to the fast kernels' traced bits; nothing is opaque; every footprint is under the bound at
// any W (the blocks, not the rows, set its size).
TEST(TileRuleConvTest, ALayerNormOverImageRowsWiderThan256IsNarrowedBitForBit) {
  struct Case {
    int64_t W, M;
    bool leading;  // the layernorm first, reading the examples (no input gradient)
  };
  for (const Case& c : {Case{300, 1, false}, Case{300, 2, false}, Case{300, 1, true},
                        Case{1024, 1, false}, Case{1100, 1, false}}) {
    const int64_t W = c.W, M = c.M;
    {
      SCOPED_TRACE("W " + std::to_string(W) + ", micro_batches " + std::to_string(M) +
                   (c.leading ? ", leading" : ""));
      Result<TaskSpec> spec =
          SyntheticTask("tile-wide-norm", 3, "2, " + std::to_string(W),
                        std::string(c.leading ? "" : "[[model.layers]]\nkind = \"relu\"\n") + R"(
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                        40);
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      spec->micro_batches = M;
      const TaskData d = testing::RandomTaskData(120, {2, W}, 3, 17, -1.0f, 1.0f);
      int64_t ops = 0;
      const std::map<std::string, int64_t> largest =
          ExpectEveryTileRecomputes(*spec, d, IsLayerNormKind, &ops);
      // Its output, input gradient (not the first layer's), weight and bias gradients.
      EXPECT_EQ(ops, (c.leading ? 3 : 4) * M);
      ExpectUnderTheBound("wide norm W " + std::to_string(W), largest,
                          /*print=*/M == 1 && !c.leading);
      Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 40, 0, M);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      for (size_t j = 0; j < plan->ops.size(); ++j) {
        if (!IsLayerNormKind(plan->ops[j].kind)) continue;
        EXPECT_GT(ReductionBlocks(*plan, static_cast<int64_t>(j)), 0) << plan->ops[j].name;
      }
    }
  }
}

bool IsWindowedKind(TileOpKind k) {
  return k == TileOpKind::kTileOpConv || k == TileOpKind::kTileOpMaxPool || IsWindowGrad(k);
}

// A conv2d and a max-pool over images wider than 32 read only the columns their tiles' windows
// reach (a block of 4 (channel, kh) pairs of a conv's chain, in the reference order), not whole
// image rows: a 3 x 3 conv at W = 512 (each tile inside one output row; before, a tile read its
// 2 channels' 3 whole rows, 384 KiB), and a 5 x 5 conv of stride 2 at W = 500 whose 250-wide output
// rows put tiles across two rows, and whose pool's 125-wide single-row planes put them across two
// channels. The conv's weight and bias gradients, whose row blocks would read more than 2 x 784
// floats a sample (the outputs' 4 x 512; dW's two 4 x 500 input planes), chain one sample's run
// of 32 outputs of a row a block. Every tile of the conv, its input, weight and bias gradients, the
// pool and its input gradient recomputes block by block to the fast kernels' traced bits (also in
// two micro-batches), each footprint under the bound.
TEST(TileRuleConvTest, AConvAndPoolOverWideImagesReadTheirWindowsColumnsBitForBit) {
  struct Case {
    int64_t W, kernel, stride, pad, M;
    int64_t mid = 0;  // > 0: a 3 x 3 conv to this many channels (and a relu) before the conv
  };
  // The 1 x 1 conv over 12 channels is at W = 64: its dW's pair chunks and run blocks need only
  // images wide enough to narrow (over 32, and over 2 x 784 floats a sample), and at W = 512 its
  // 3 x 3 conv to 12 channels (61,440 blocks of dW and db) was most of the test's time.
  for (const Case& c : {Case{512, 3, 1, 1, 1}, Case{500, 5, 2, 2, 1}, Case{512, 3, 1, 1, 2},
                        Case{64, 1, 1, 0, 1, 12}}) {
    SCOPED_TRACE("W " + std::to_string(c.W) + ", kernel " + std::to_string(c.kernel) +
                 ", micro_batches " + std::to_string(c.M) + ", mid " + std::to_string(c.mid));
    const std::string mid =
        c.mid == 0 ? ""
                   : "[[model.layers]]\nkind = \"conv2d\"\nout = " + std::to_string(c.mid) +
                         "\nkernel = 3\npad = 1\n[[model.layers]]\nkind = \"relu\"\n";
    const std::string layers = R"([[model.layers]]
kind = "relu"
)" + mid + R"(
[[model.layers]]
kind = "conv2d"
out = 3
kernel = )" + std::to_string(c.kernel) +
                               R"(
stride = )" + std::to_string(c.stride) +
                               R"(
pad = )" + std::to_string(c.pad) +
                               R"(
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)";
    Result<TaskSpec> spec =
        SyntheticTask("tile-wide-conv", 5, "2, 4, " + std::to_string(c.W), layers, 40);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec->micro_batches = c.M;
    const TaskData d = testing::RandomTaskData(80, {2, 4, c.W}, 3, 29, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsWindowedKind, &ops);
    // The conv, the pool, their input gradients, the conv's dW and db, per micro-batch (each
    // micro-batch's dW and db end by adding into the previous one's).
    EXPECT_EQ(ops, 6 * c.M + (c.mid > 0 ? 4 : 0));  // the mid conv has no pool
    ExpectUnderTheBound("wide conv W " + std::to_string(c.W), largest,
                        /*print=*/c.M == 1 && c.mid == 0);
    // The conv and its input gradient chain in blocks of pairs (2 x 3 and 3 x KH of them).
    if (c.M > 1) continue;
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 40);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    if (c.mid > 0) {
      // The 1 x 1 conv's dW tile spans its 12 pairs (c, 0): two chunks of 8, so 40 samples x 4
      // rows x 2 runs x 3 output channels x 2.
      for (size_t j = 0; j < plan->ops.size(); ++j) {
        if (plan->ops[j].name != "layers.3.weight.grad") continue;
        EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), 40 * 4 * 2 * 3 * 2);
        std::printf("[ wide conv] 1 x 1 dW over 12 channels largest footprint %lld bytes\n",
                    static_cast<long long>(largest.at("layers.3.weight.grad")));
      }
      continue;
    }
    for (size_t j = 0; j < plan->ops.size(); ++j) {
      const TileOp& op = plan->ops[j];
      if (op.kind == TileOpKind::kTileOpConvWeightGrad ||
          op.kind == TileOpKind::kTileOpConvBiasGrad) {
        // 40 samples x the output rows x their runs of 32 x one output channel a group (a dW
        // tile's 3 rows, a db tile's 3 columns); but at W = 500 db's 500 positions a sample fit
        // a row block (2 of them, one 500-position plane a group).
        const int64_t OH = c.W == 512 ? 4 : 2, OW = c.W == 512 ? 512 : 250;
        const bool row_blocks = c.W == 500 && op.kind == TileOpKind::kTileOpConvBiasGrad;
        EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)),
                  row_blocks ? 2 * 3 : 40 * OH * ((OW + 31) / 32) * 3)
            << op.name;
      }
      if (op.kind != TileOpKind::kTileOpConv && op.kind != TileOpKind::kTileOpConvInputGrad) {
        continue;
      }
      const int64_t pairs = (op.kind == TileOpKind::kTileOpConv ? 2 : 3) * c.kernel;
      EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), (pairs + 3) / 4) << op.name;
    }
  }
}

bool IsConvWeightGrad(TileOpKind k) { return k == TileOpKind::kTileOpConvWeightGrad; }

// A 3 x 3 conv of stride 7 over 3 channels of 3 x 250 images (after a relu: the conv reads an
// activation, not the examples): its weight gradient's block, one sample's run of 32 outputs of a
// row, reads for each (c, kh) pair of its chunk one input row's window columns, 31 x 7 + 3 = 220
// floats in up to 8 tiles (rows of 250 start inside a tile); a chunk of 8 pairs (of a dW tile's
// 9) read 62 tiles and dout's 2, 256 KiB. The chunks hold 5 pairs at this stride instead (two
// chunks a tile still), so every block stays under the bound, and every dW tile chains to the
// traced bits.
TEST(TileRuleConvTest, AConvWeightGradientAtALargeStrideReadsFewerPairsABlockBitForBit) {
  Result<TaskSpec> spec = SyntheticTask("tile-stride-conv", 6, "3, 3, 250", R"([[model.layers]]
kind = "relu"
[[model.layers]]
kind = "conv2d"
out = 2
kernel = 3
stride = 7
pad = 0
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                                        32);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const TaskData d = testing::RandomTaskData(64, {3, 3, 250}, 3, 31, -1.0f, 1.0f);
  int64_t ops = 0;
  const std::map<std::string, int64_t> largest =
      ExpectEveryTileRecomputes(*spec, d, IsConvWeightGrad, &ops);
  EXPECT_EQ(ops, 1);
  ExpectUnderTheBound("stride 7", largest);
  // 32 samples x 1 output row x 2 runs (OW = 36) x one output channel a group (2) x 2 chunks.
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    if (plan->ops[j].kind != TileOpKind::kTileOpConvWeightGrad) continue;
    EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), 32 * 1 * 2 * 2 * 2);
  }
}

bool IsConvOrInputGrad(TileOpKind k) {
  return k == TileOpKind::kTileOpConv || k == TileOpKind::kTileOpConvInputGrad;
}

// A conv2d over 4 channels of images no wider than 32 with a large kernel: a 7 x 7 kernel at
// stride 1 over 30 x 30 (its 900-float planes put tiles across two planes, so a block of 4
// channels read every row of each: 4 x 32 x 4 x 900 bytes, 450 KiB, and its input gradient as
// much of dout), and an 11 x 11 kernel at stride 4 over 32 x 32 (6 x 6 outputs reaching 31 of
// its 32 rows: 496 KiB). Both read their windows' columns in blocks of (channel, kh) pairs instead,
// as over wide images (a block's pairs fewer where its tile crosses many short rows), each
// footprint under the bound, and every tile of the conv and its input gradient chains to the traced
// bits.
TEST(TileRuleConvTest, AConvWithALargeKernelOverNarrowImagesReadsItsWindowsColumnsBitForBit) {
  struct Case {
    int64_t W, kernel, stride, pad;
  };
  for (const Case& c : {Case{30, 7, 1, 3}, Case{32, 11, 4, 0}}) {
    SCOPED_TRACE("W " + std::to_string(c.W) + ", kernel " + std::to_string(c.kernel));
    const std::string w = std::to_string(c.W);
    Result<TaskSpec> spec =
        SyntheticTask("tile-large-kernel", 7, "4, " + w + ", " + w,
                      "[[model.layers]]\nkind = \"relu\"\n[[model.layers]]\nkind = \"conv2d\"\nout "
                      "= 4\nkernel = " +
                          std::to_string(c.kernel) + "\nstride = " + std::to_string(c.stride) +
                          "\npad = " + std::to_string(c.pad) + R"(
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                      32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {4, c.W, c.W}, 3, 37, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsConvOrInputGrad, &ops);
    EXPECT_EQ(ops, 2);
    ExpectUnderTheBound(
        "large kernel " + std::to_string(c.kernel) + " stride " + std::to_string(c.stride),
        largest);
  }
}

bool IsConvOverExamples(TileOpKind k) {
  return k == TileOpKind::kTileOpConv || k == TileOpKind::kTileOpConvWeightGrad ||
         k == TileOpKind::kTileOpConvBiasGrad;
}

// A first layer's conv2d over chunked examples (step_replay.h): over 3 x 32 x 32 images, 3 chunks
// of 1024 floats, one a channel, a forward tile recomputed whole read every chunk of its 32
// examples (32 x 3 x 4 KiB, 384 KiB of values); narrowed, one (c, kh) pair a block, it reads one
// chunk of each. Over 1 x 64 x 64 (4 chunks of 16 rows) likewise, and a weight gradient block (one
// sample's run of an output row) reads the chunks of its pairs' rows, one or two, not all four.
// Every footprint is under the bound and every tile of the conv and its weight and bias gradients
// chains to the traced bits.
TEST(TileRuleConvTest, AFirstLayerConvOverChunkedExamplesReadsOnlyItsWindowsChunksBitForBit) {
  struct Case {
    int64_t C, H;
    size_t dw_chunks;  // the most a weight gradient block reads
  };
  for (const Case& c : {Case{3, 32, 3}, Case{1, 64, 2}}) {
    SCOPED_TRACE(std::to_string(c.C) + " x " + std::to_string(c.H) + " x " + std::to_string(c.H));
    ASSERT_GT(ExampleChunks(c.C * c.H * c.H), 0) << "the examples must be chunked";
    Result<TaskSpec> spec =
        SyntheticTask("tile-conv-over-chunks", 9,
                      std::to_string(c.C) + ", " + std::to_string(c.H) + ", " + std::to_string(c.H),
                      R"([[model.layers]]
kind = "conv2d"
out = 4
kernel = 3
pad = 1
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = 4
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                      32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {c.C, c.H, c.H}, 3, 41, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsConvOverExamples, &ops);
    EXPECT_EQ(ops, 3);
    ExpectUnderTheBound("conv over chunks " + std::to_string(c.C) + " x " + std::to_string(c.H) +
                            " x " + std::to_string(c.H),
                        largest);
    // Each forward block reads the one chunk of its pair's rows, each weight gradient block the
    // chunks of its pairs' rows.
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, d);
    ASSERT_TRUE(tr.ok()) << tr.status().ToString();
    Result<TilePlan> plan =
        PlanStepTiles(spec->model, (*tr)->state().optimizer->spec(), spec->batch_size, 0, 1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int64_t j = 0; j < static_cast<int64_t>(plan->ops.size()); ++j) {
      const TileOp& op = plan->ops[static_cast<size_t>(j)];
      if (op.kind != TileOpKind::kTileOpConv && op.kind != TileOpKind::kTileOpConvWeightGrad) {
        continue;
      }
      for (int64_t t = 0; t < op.grid.count(); ++t) {
        for (int64_t k = 0; k < std::max<int64_t>(ReductionBlocks(*plan, j), 1); ++k) {
          Result<TileFootprint> fp = Footprint(*plan, j, t, k);
          ASSERT_TRUE(fp.ok()) << fp.status().ToString();
          if (fp->batch_rows.empty()) continue;  // the padding only
          ASSERT_LE(fp->batch_chunks.size(), op.kind == TileOpKind::kTileOpConv ? 1u : c.dw_chunks)
              << op.name << " tile " << t << " block " << k;
        }
      }
    }
  }
}

bool IsConv(TileOpKind k) { return k == TileOpKind::kTileOpConv; }

// A first layer's conv2d over chunked planes larger than a chunk, its outputs not a multiple of 32
// wide (pad 0): a tile's 32 outputs are runs of two output rows, whose pair's input rows can lie
// in two chunks (over 1 x 64 x 64, rows 15 and 16 of a plane: chunks 0 and 1), so one pair's
// block read two chunks of each of its 32 examples (256 KiB of values). The tile is cut into
// pieces of one run each, every block reading one chunk; over 1 x 48 x 48, whose 48-float rows
// straddle chunks themselves, pieces of 16 examples too (two chunks of 16). Every forward tile
// chains to the traced bits.
TEST(TileRuleConvTest, AFirstLayerConvWhoseRunsStraddleChunksReadsOneRunABlockBitForBit) {
  struct Case {
    int64_t H;
    size_t chunks;   // the most a forward block reads
    size_t rows;     // of examples
    int64_t pieces;  // of a tile
  };
  for (const Case& c : {Case{64, 1, 32, 2}, Case{48, 2, 16, 4}}) {
    SCOPED_TRACE("1 x " + std::to_string(c.H) + " x " + std::to_string(c.H));
    ASSERT_GT(ExampleChunks(c.H * c.H), 0) << "the examples must be chunked";
    Result<TaskSpec> spec = SyntheticTask("tile-conv-straddling-chunks", 10,
                                          "1, " + std::to_string(c.H) + ", " + std::to_string(c.H),
                                          R"([[model.layers]]
kind = "conv2d"
out = 4
kernel = 3
pad = 0
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                                          32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {1, c.H, c.H}, 3, 43, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsConv, &ops);
    EXPECT_EQ(ops, 1);
    ExpectUnderTheBound(
        "straddling chunks 1 x " + std::to_string(c.H) + " x " + std::to_string(c.H), largest);
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int64_t j = 0; j < static_cast<int64_t>(plan->ops.size()); ++j) {
      const TileOp& op = plan->ops[static_cast<size_t>(j)];
      if (op.kind != TileOpKind::kTileOpConv) continue;
      // The 3 pairs (0, kh) a piece, one a block.
      ASSERT_EQ(ReductionBlocks(*plan, j), 3 * c.pieces);
      for (int64_t t = 0; t < op.grid.count(); ++t) {
        for (int64_t k = 0; k < ReductionBlocks(*plan, j); ++k) {
          Result<TileFootprint> fp = Footprint(*plan, j, t, k);
          ASSERT_TRUE(fp.ok()) << fp.status().ToString();
          ASSERT_LE(fp->batch_chunks.size(), c.chunks) << "tile " << t << " block " << k;
          ASSERT_LE(fp->batch_rows.size(), c.rows) << "tile " << t << " block " << k;
        }
      }
    }
  }
}

// A conv2d over images whose outputs are one column wide (a 33-wide kernel of stride 8 over 40
// columns; 281 rows give 32 output rows): a tile is 32 runs of one output each, at 32 input rows
// 320 floats apart, so even a block of one (c, kh) pair read 32 rows' window columns in 2 tiles
// each, 64 tiles (256 KiB). The tile is cut into pieces of 20 runs (the second of 12; 2 tiles a
// run, 40 tiles a piece: 160 KiB), every block under the bound, and every tile of the conv and of
// its input gradient chains to the traced bits.
TEST(TileRuleConvTest, AConvWithOneColumnOfOutputsReadsAPieceOfItsTileABlockBitForBit) {
  Result<TaskSpec> spec =
      SyntheticTask("tile-one-column-conv", 11, "1, 281, 40", R"([[model.layers]]
kind = "relu"
[[model.layers]]
kind = "conv2d"
out = 4
kernel = 33
stride = 8
pad = 0
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                    32);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const TaskData d = testing::RandomTaskData(64, {1, 281, 40}, 3, 47, -1.0f, 1.0f);
  int64_t ops = 0;
  const std::map<std::string, int64_t> largest =
      ExpectEveryTileRecomputes(*spec, d, IsConvOrInputGrad, &ops);
  EXPECT_EQ(ops, 2);
  ExpectUnderTheBound("one column", largest);
  // 33 pairs (0, kh), one a block, for each of a tile's 2 pieces (32 runs, up to 20 a piece).
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    if (plan->ops[j].kind != TileOpKind::kTileOpConv) continue;
    EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), 33 * 2);
  }
}

bool IsConvOrWeightGrad(TileOpKind k) {
  return k == TileOpKind::kTileOpConv || k == TileOpKind::kTileOpConvWeightGrad;
}

// A 3 x 3 conv of stride 64 over 2 channels of 3 x 2563 images (41 outputs a row): one pair's
// window columns of a run of 32 outputs, 31 x 64 + 3 = 1,987 floats, lie in 63 tiles, so a weight
// gradient block of one pair read 252 KiB of them, and so did a forward block of one pair. Both
// take runs of 20 outputs instead (1,219 floats, at most 40 tiles): the weight gradient's blocks
// are one sample's run of 20, the forward's tile is cut into pieces of one 20-output segment.
// Every block is under the bound, and every tile of the conv and of its dW chains to the traced
// bits.
TEST(TileRuleConvTest, AConvPastStride40CutsAPairsRowIntoRunsOf20OutputsBitForBit) {
  Result<TaskSpec> spec = SyntheticTask("tile-stride-64-conv", 12, "2, 3, 2563", R"([[model.layers]]
kind = "relu"
[[model.layers]]
kind = "conv2d"
out = 2
kernel = 3
stride = 64
pad = 0
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                                        32);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const TaskData d = testing::RandomTaskData(64, {2, 3, 2563}, 3, 53, -1.0f, 1.0f);
  int64_t ops = 0;
  const std::map<std::string, int64_t> largest =
      ExpectEveryTileRecomputes(*spec, d, IsConvOrWeightGrad, &ops);
  EXPECT_EQ(ops, 2);
  ExpectUnderTheBound("stride 64", largest);
  // dW: 32 samples x 1 output row x 3 runs of 20 (OW = 41) x one output channel a group (2) x 6
  // chunks of one pair. The forward: its 6 pairs (c, kh), one a block, for each of a tile's 4
  // segments (two output rows' runs, each cut at multiples of 20 outputs).
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    if (plan->ops[j].kind == TileOpKind::kTileOpConvWeightGrad) {
      EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), 32 * 1 * 3 * 2 * 6);
    }
    if (plan->ops[j].kind == TileOpKind::kTileOpConv) {
      EXPECT_EQ(ReductionBlocks(*plan, static_cast<int64_t>(j)), 6 * 4);
    }
  }
}

// A max-pool of `kernel` and `stride` (0: the kernel), a flatten and a linear to 3.
std::string PoolLayers(int64_t kernel, int64_t stride = 0) {
  return "[[model.layers]]\nkind = \"maxpool2d\"\nkernel = " + std::to_string(kernel) +
         (stride > 0 ? "\nstride = " + std::to_string(stride) : std::string()) +
         "\n[[model.layers]]\nkind = \"flatten\"\n[[model.layers]]\nkind = \"linear\"\nout = 3\n";
}

bool IsPool(TileOpKind k) {
  return k == TileOpKind::kTileOpMaxPool || k == TileOpKind::kTileOpMaxPoolInputGrad;
}

// An 8 x 8 max-pool of stride 8 over 2 channels of 16 x 600 images (75 outputs a row, after a
// relu: it reads an activation), and a 6 x 6 one over 12 x 600 (100 a row): a forward tile read,
// per output row run (two a tile), the window's k input rows of its outputs' window columns,
// 32 s + k floats in up to 10 tiles a row: 76 tiles (311,296 bytes of values) and 46 (188,416),
// whole. Its tile is cut into pieces of one segment of at most 16 (26) outputs, whose k rows of
// window columns lie in at most 40 tiles: every block is under the bound, and every tile of the
// pool and of its input gradient (which reads only the windows reaching its 32 inputs) recomputes
// to the traced bits. Prints each forward's largest whole tile (before) and block (after).
TEST(TileRuleConvTest, AMaxPoolWithALargeWindowOverWideImagesReadsAPieceOfItsTileBitForBit) {
  for (const int64_t k : {8, 6}) {
    SCOPED_TRACE("window " + std::to_string(k));
    const int64_t H = 2 * k;
    Result<TaskSpec> spec = SyntheticTask("tile-large-pool", 13,
                                          "2, " + std::to_string(H) + ", 600", R"([[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = )" + std::to_string(k) + R"(
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 3
)",
                                          32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {2, H, 600}, 3, 59, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsPool, &ops);
    EXPECT_EQ(ops, 2);
    ExpectUnderTheBound("pool " + std::to_string(k) + "x" + std::to_string(k), largest);
    // The forward: a tile's pieces, one a block (up to 4 segments: two runs cut at multiples of
    // 16, or 26, outputs); its whole tile (every piece's tiles, as read before) past the bound.
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (size_t j = 0; j < plan->ops.size(); ++j) {
      const TileOp& op = plan->ops[j];
      if (op.kind != TileOpKind::kTileOpMaxPool) continue;
      const int64_t jj = static_cast<int64_t>(j), blocks = ReductionBlocks(*plan, jj);
      EXPECT_EQ(blocks, 4);
      int64_t whole = 0;
      for (int64_t t = 0; t < op.grid.count(); ++t) {
        std::vector<std::pair<int64_t, int64_t>> tiles;
        for (int64_t b = 0; b < blocks; ++b) {
          Result<TileFootprint> fp = Footprint(*plan, jj, t, b);
          ASSERT_TRUE(fp.ok()) << fp.status().ToString();
          for (const TileRef& r : fp->tiles) tiles.emplace_back(r.op, r.tile);
        }
        std::sort(tiles.begin(), tiles.end());
        tiles.erase(std::unique(tiles.begin(), tiles.end()), tiles.end());
        int64_t floats = 0;
        for (const auto& [o, tt] : tiles) {
          floats += plan->ops[static_cast<size_t>(o)].grid.TileRect(tt).numel();
        }
        whole = std::max(whole, 4 * floats);
      }
      std::printf("[ pool %lldx%lld] %-18s largest whole tile (before) %lld bytes\n",
                  static_cast<long long>(k), static_cast<long long>(k), op.name.c_str(),
                  static_cast<long long>(whole));
      EXPECT_GT(whole, 160 * 1024) << "the window reads more than a block may, whole";
    }
  }
}

// Each windowed operator's largest footprint (FootprintBytes) over every tile and block of
// `plan`, from the plan alone: no step is taken. `grads`: with the conv's weight and bias
// gradients.
std::map<std::string, int64_t> LargestWindowFootprints(const TilePlan& plan, bool grads = true) {
  std::map<std::string, int64_t> largest;
  for (int64_t j = 0; j < static_cast<int64_t>(plan.ops.size()); ++j) {
    const TileOp& op = plan.ops[static_cast<size_t>(j)];
    const bool param_grad =
        op.kind == TileOpKind::kTileOpConvWeightGrad || op.kind == TileOpKind::kTileOpConvBiasGrad;
    if ((op.kind != TileOpKind::kTileOpMaxPool && !IsWindowGrad(op.kind) &&
         op.kind != TileOpKind::kTileOpConv) ||
        (param_grad && !grads)) {
      continue;
    }
    const int64_t blocks = ReductionBlocks(plan, j);
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < std::max<int64_t>(blocks, 1); ++k) {
        Result<TileFootprint> fp = Footprint(plan, j, t, k);
        EXPECT_TRUE(fp.ok()) << fp.status().ToString();
        if (!fp.ok()) return largest;
        int64_t& most = largest[op.name];
        most = std::max(most, FootprintBytes(plan, j, t, k, *fp));
      }
    }
  }
  return largest;
}

// A relu, a max-pool of `kernel` and `stride` (0: the kernel), a flatten and a linear to 3.
std::string PoolAfterRelu(int64_t kernel, int64_t stride = 0) {
  return "[[model.layers]]\nkind = \"relu\"\n" + PoolLayers(kernel, stride);
}

// A max-pool over narrow images (32 wide or less) read its tile's rows of every plane it spans,
// all of them where the tile spans two: over two 400 x 30 planes (a 2 x 2 pool: 200 x 15
// outputs, 3,000 a plane, so tiles across planes) 3,072,000 bytes of values, and over 3 x 31 x 31
// (a 3 x 3 pool, 100 outputs a plane) 245,760, past the 240 KiB a witness has for values. Past
// that such a pool reads its windows' columns as over a wide image (in pieces where needed):
// every tile of the pool and of its input gradient recomputes to the traced bits, every block
// under the bound. (The fashion CNN's pools, at most 52 tiles whole, read whole rows as before:
// the pinned plans of TileRuleTest and TileDisputeTest.)
TEST(TileRuleConvTest, AMaxPoolOverNarrowPlanesPastTheBoundReadsItsWindowsColumnsBitForBit) {
  struct Case {
    int64_t C, H, W, kernel;
  };
  for (const Case& c : {Case{2, 400, 30, 2}, Case{3, 31, 31, 3}}) {
    const std::string shape =
        std::to_string(c.C) + ", " + std::to_string(c.H) + ", " + std::to_string(c.W);
    SCOPED_TRACE(shape);
    Result<TaskSpec> spec =
        SyntheticTask("tile-narrow-pool", 14, shape, PoolAfterRelu(c.kernel), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {c.C, c.H, c.W}, 3, 61, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsPool, &ops);
    EXPECT_EQ(ops, 2);
    ExpectUnderTheBound("narrow pool " + shape, largest);
  }
}

// A first layer's max-pool over chunked examples read every chunk of its tile's rows: over
// 3 x 40 x 40 (a 2 x 2 pool, tiles across two 400-output planes) four chunks of each of its 32
// examples, 524,416 bytes of values; over 1 x 96 x 96 (3 x 3) and 1 x 64 x 64 (8 x 8) a window's
// rows straddling a chunk, two, 262,272. It reads its windows' columns in pieces of one segment
// (an output row's run) of as many examples as keep their chunks within 40 (16 where a segment
// can read two): every tile recomputes to the traced bits, every block under the bound; over
// 3 x 64 x 64 at 2 x 2 (each window's two rows inside one chunk) a tile is one piece of one chunk,
// and over 1 x 64 x 64 at 8 x 8 (a segment's 8 rows in one chunk) 5 pieces of all 32 examples.
TEST(TileRuleConvTest, AFirstLayerMaxPoolOverChunkedExamplesReadsAPieceOfItsTileBitForBit) {
  struct Case {
    int64_t C, H, kernel, blocks;
  };
  for (const Case& c :
       {Case{3, 40, 2, 3 * 2}, Case{1, 96, 3, 2}, Case{1, 64, 8, 5}, Case{3, 64, 2, 0}}) {
    const std::string shape =
        std::to_string(c.C) + ", " + std::to_string(c.H) + ", " + std::to_string(c.H);
    SCOPED_TRACE(shape + " at " + std::to_string(c.kernel));
    ASSERT_GT(ExampleChunks(c.C * c.H * c.H), 0) << "the examples must be chunked";
    Result<TaskSpec> spec = SyntheticTask("tile-first-pool", 15, shape, PoolLayers(c.kernel), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {c.C, c.H, c.H}, 3, 67, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsPool, &ops);
    EXPECT_EQ(ops, 1);  // the model's first layer: no input gradient
    ExpectUnderTheBound("first pool " + shape, largest);
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int64_t j = 0;
    while (j < static_cast<int64_t>(plan->ops.size()) && plan->ops[j].name != "layers.0.out") ++j;
    ASSERT_LT(j, static_cast<int64_t>(plan->ops.size()));
    ASSERT_EQ(plan->ops[j].kind, TileOpKind::kTileOpMaxPool);
    EXPECT_EQ(ReductionBlocks(*plan, j), c.blocks);
    for (int64_t t = 0; t < plan->ops[j].grid.count(); ++t) {
      for (int64_t k = 0; k < std::max<int64_t>(ReductionBlocks(*plan, j), 1); ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        EXPECT_LE(fp->batch_rows.size() * fp->batch_chunks.size(), 40u)
            << "tile " << t << " block " << k;
      }
    }
  }
}

// A first layer's max-pool whose window's rows span more 1,024-float chunks of one example than
// a witness holds: a 64 x 64 window over 1 x 64 x 2000 (one output's window: 125 chunks, 500
// KiB) and a 32 x 32 one of stride 16 over 1 x 48 x 2000 (overlapping windows, 62 chunks with
// the partial past 240 KiB), both refused by the plan before. Its pieces (one segment, one
// example) read the window in chunks of 20 rows (39 chunks at the worst alignment), one a
// block, each output's running maximum carried in its own element of the partial: 32 pieces of
// 32 examples x 4 chunks (2 for the 32 x 32). Every tile recomputes to the traced bits, every
// block under the bound and within 40 chunks.
TEST(TileRuleConvTest, AFirstLayerMaxPoolOverManyChunksReadsItsWindowInChunksOfRowsBitForBit) {
  struct Case {
    int64_t H, k, s, blocks;
  };
  for (const Case& c : {Case{64, 64, 64, 32 * 32 * 4}, Case{48, 32, 16, 32 * 32 * 2}}) {
    const std::string shape = "1, " + std::to_string(c.H) + ", 2000";
    SCOPED_TRACE(shape + " at " + std::to_string(c.k));
    Result<TaskSpec> spec =
        SyntheticTask("tile-first-pool-rows", 16, shape, PoolLayers(c.k, c.s), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int64_t j = 0;
    while (j < static_cast<int64_t>(plan->ops.size()) && plan->ops[j].name != "layers.0.out") ++j;
    ASSERT_LT(j, static_cast<int64_t>(plan->ops.size()));
    ASSERT_EQ(plan->ops[j].kind, TileOpKind::kTileOpMaxPool);
    EXPECT_EQ(ReductionBlocks(*plan, j), c.blocks);
    for (int64_t t = 0; t < plan->ops[j].grid.count(); ++t) {
      for (int64_t b = 0; b < c.blocks; ++b) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, b);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        ASSERT_LE(fp->batch_rows.size() * fp->batch_chunks.size(), 40u)
            << "tile " << t << " block " << b;
      }
    }
    const TaskData d = testing::RandomTaskData(64, {1, c.H, 2000}, 3, 73, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsPool, &ops);
    EXPECT_EQ(ops, 1);  // the model's first layer: no input gradient
    ExpectUnderTheBound("first pool " + std::to_string(c.k) + " over " + shape, largest);
  }
}

// A max-pool's input gradient tile read the windows of every output reaching its 32 inputs, whole
// (their argmax): a 16 x 16 window of stride 8 over 2 x 40 x 601 (74 outputs a row, overlapping
// windows; tiles that wrap a row and a plane) 290,816 bytes of values, and 20 x 20 of stride 10
// over 2 x 50 x 600 more, past the bound: the plan refused such a pool. Its tile is now a chain
// over those outputs in the kernel's increasing order (dinp[argmax] += dout), a group of
// consecutive outputs of a row a block, as many as keep it within 48 tiles (the 16 x 16: 2 runs x
// 2 output rows x 2 groups of 3, 8 blocks, where one output a block made 24; the 20 x 20, whose
// one output reads 42 tiles, groups of 2, 12 blocks where one output a block made 24; the partial,
// the tile's accumulators). A 16 x 16 window of stride 1 over 4 x 64 x 64 (task_cli_test's pool):
// groups of 18 outputs, 16 rows x 3, 48 blocks where one output a block made 752.
// A 32 x 32 window of stride 16 over 2 x 80 x 601, whose one output's window alone (64 tiles)
// passed the bound, forward and input gradient, is read in two chunks of its rows (20 and 12), the
// input gradient's partial carrying each row's running maximum and its index (2 runs x 2 rows x 4
// outputs x 2 chunks: 32 blocks). Every tile of the pool and of its input gradient recomputes to
// the traced bits, every block under the bound. Prints the largest whole tile (before) and block
// (after).
TEST(TileRuleConvTest, AMaxPoolInputGradientPastTheBoundIsAChainOverItsOutputsBitForBit) {
  struct Case {
    int64_t k, s, H, W, blocks;
    int64_t C = 2;
  };
  for (const Case& c : {Case{16, 8, 40, 601, 8}, Case{20, 10, 50, 600, 12},
                        Case{32, 16, 80, 601, 2 * 16}, Case{16, 1, 64, 64, 48, 4}}) {
    const std::string shape =
        std::to_string(c.C) + ", " + std::to_string(c.H) + ", " + std::to_string(c.W);
    SCOPED_TRACE("window " + std::to_string(c.k) + " over " + shape);
    Result<TaskSpec> spec =
        SyntheticTask("tile-chain-pool", 19, shape, PoolAfterRelu(c.k, c.s), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int64_t j = 0;
    while (j < static_cast<int64_t>(plan->ops.size()) && plan->ops[j].name != "layers.1.in.grad") {
      ++j;
    }
    ASSERT_LT(j, static_cast<int64_t>(plan->ops.size()));
    const TileOp& op = plan->ops[static_cast<size_t>(j)];
    ASSERT_EQ(op.kind, TileOpKind::kTileOpMaxPoolInputGrad);
    EXPECT_TRUE(op.window_chain);
    EXPECT_EQ(ReductionBlocks(*plan, j), c.blocks);
    // The whole tile, as read before: the union of its blocks' tiles.
    int64_t whole = 0;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      std::vector<std::pair<int64_t, int64_t>> tiles;
      for (int64_t b = 0; b < c.blocks; ++b) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, b);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        for (const TileRef& r : fp->tiles) tiles.emplace_back(r.op, r.tile);
      }
      std::sort(tiles.begin(), tiles.end());
      tiles.erase(std::unique(tiles.begin(), tiles.end()), tiles.end());
      int64_t floats = 0;
      for (const auto& [o, tt] : tiles) {
        floats += plan->ops[static_cast<size_t>(o)].grid.TileRect(tt).numel();
      }
      whole = std::max(whole, 4 * floats);
    }
    std::printf("[ pool %lldx%lld] %-18s largest whole tile (before) %lld bytes\n",
                static_cast<long long>(c.k), static_cast<long long>(c.k), op.name.c_str(),
                static_cast<long long>(whole));
    EXPECT_GT(whole, 240 * 1024) << "the windows read more than a witness may, whole";
    const TaskData d = testing::RandomTaskData(64, {c.C, c.H, c.W}, 3, 71, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsPool, &ops);
    EXPECT_EQ(ops, 2);
    ExpectUnderTheBound("pool " + std::to_string(c.k) + "x" + std::to_string(c.k), largest);
  }
}

// A max-pool's block is bounded by its whole witness (values, each tile's Merkle proof, the fixed
// parts: TileRuleMaxPoolBlockWitnessBytes), not its values alone: a one-output chain block of a 29
// x 29 window reads 2 k + 2 = 60 tiles (245,760 bytes of values), with ~400 bytes of proof a tile
// past the 262,144-byte bound at the worst alignment. Over windows 20 to 33 of strides 1, k / 2
// and k over 600- and 601-wide activations, and a first layer's over 1 x H x 2000, every max-pool
// of every plan (forward and input gradient: row chunks, groups of outputs, first-layer chunks)
// has its worst-alignment witness within the bound; one output's window is read whole up to 25
// rows, in chunks of its rows past (the plan read 26 to 29 rows whole before).
TEST(TileRuleConvTest, EveryMaxPoolBlocksWorstWitnessIsWithinTheBound) {
  int planned = 0;
  int64_t largest = 0;
  for (int64_t k = 20; k <= 33; ++k) {
    for (int64_t s : {int64_t{1}, k / 2, k}) {
      for (const std::string& shape : {"2, " + std::to_string(k + 3 * s) + ", 600",
                                       "2, " + std::to_string(k + 3 * s) + ", 601",
                                       "1, " + std::to_string(k + 3 * s) + ", 2000"}) {
        const bool first = shape[0] == '1';
        SCOPED_TRACE(std::to_string(k) + " stride " + std::to_string(s) + " over " + shape);
        Result<TaskSpec> spec = SyntheticTask("tile-pool-witness", 17, shape,
                                              first ? PoolLayers(k, s) : PoolAfterRelu(k, s), 32);
        ASSERT_TRUE(spec.ok()) << spec.status().ToString();
        Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        ++planned;
        for (size_t j = 0; j < plan->ops.size(); ++j) {
          const TileOp& op = plan->ops[j];
          if (op.kind != TileOpKind::kTileOpMaxPool &&
              op.kind != TileOpKind::kTileOpMaxPoolInputGrad) {
            continue;
          }
          Result<int64_t> bytes = TileRuleMaxPoolBlockWitnessBytes(*plan, static_cast<int64_t>(j));
          ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
          largest = std::max(largest, *bytes);
          EXPECT_LE(*bytes, 256 * 1024) << op.name;
        }
      }
    }
  }
  std::printf("[ pool witness] %d plans, largest worst-alignment block witness %lld bytes\n",
              planned, static_cast<long long>(largest));
}

// The blocks of a max-pool input gradient's chain when each was one output (helper-116's plan,
// before the groups of outputs): the most runs of a tile, times the output rows reaching an input
// row, times the outputs of a row reaching a run, times the chunks of a window's rows (two past
// 29 rows, up to the sweep's 32).
int64_t OneOutputChainBlocks(int64_t k, int64_t s, int64_t H, int64_t W) {
  const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  const int64_t runs = W % 32 == 0 ? 1 : std::min<int64_t>(32, 30 / W + 2);
  const int64_t rows = std::min(OH, (k + s - 1) / s);
  const int64_t cols = std::min(OW, (std::min<int64_t>(W, 32) + k - 2) / s + 1);
  return runs * rows * cols * (k > 29 ? 2 : 1);
}
uint32_t CeilLog2(int64_t n) {
  return n <= 1 ? 0 : static_cast<uint32_t>(std::bit_width(static_cast<uint64_t>(n - 1)));
}

// Every max-pool over activations is planned with every block under the bound: a forward cut
// down to chunks of one output's window's rows, its input gradient a chain over groups of its
// outputs (one output, in chunks of its window's rows, past 29). apps/meshlearn task_cli_test's
// model, 16 x 16 of stride 1 over 4 x 64 x 64 (one run a tile, 16 output rows x 47 outputs
// reaching it: 752 blocks of one output, now 48 of up to 18), and a 64 x 64 window of stride 32
// over 2 x 160 x 601 (rows in 5 chunks of 13) are planned; over a sweep of windows 2 to 32,
// strides 1, k / 2 and k, widths 40, 600 and 601, all 63 (16 were refused before the chain, 36 by
// the worst-alignment arithmetic alone). A first layer's window whose rows span more 1,024-float
// chunks of its examples than a witness holds (64 x 64 over 1 x 64 x 2000) is planned too, read in
// chunks of its rows (it was refused). Prints, for every chained input gradient of the sweep, its
// blocks and the block phase's bisection turns (ceil log2 of the blocks) with one output a block
// (before) and with the groups (after), and its largest block.
TEST(TileRuleConvTest, AMaxPoolOfAnyWindowOverActivationsIsPlannedUnderTheBound) {
  {
    Result<TaskSpec> spec =
        SyntheticTask("tile-first-rows-pool", 16, "1, 64, 2000", PoolLayers(64, 64), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ExpectUnderTheBound("first pool 64 x 64 over 1 x 64 x 2000", LargestWindowFootprints(*plan));
    for (const auto& [k, s, shape] :
         {std::tuple<int64_t, int64_t, std::string>{16, 8, "2, 40, 601"},
          {32, 16, "2, 80, 601"},
          {64, 32, "2, 160, 601"}}) {
      SCOPED_TRACE(std::to_string(k) + " over " + shape);
      Result<TaskSpec> pooled =
          SyntheticTask("tile-chain-pool", 16, shape, PoolAfterRelu(k, s), 32);
      ASSERT_TRUE(pooled.ok()) << pooled.status().ToString();
      Result<TilePlan> taken = PlanStepTiles(pooled->model, pooled->optimizer, 32);
      ASSERT_TRUE(taken.ok()) << taken.status().ToString();
      ExpectUnderTheBound("pool " + std::to_string(k) + " x " + std::to_string(k),
                          LargestWindowFootprints(*taken));
    }
    Result<TaskSpec> fashion =
        SyntheticTask("tile-cli-pool", 16, "1, 28, 28",
                      "[[model.layers]]\nkind = \"conv2d\"\nout = 4\nkernel = 5\npad = 20\n"
                      "[[model.layers]]\nkind = \"relu\"\n" +
                          PoolLayers(16, 1),
                      32);
    ASSERT_TRUE(fashion.ok()) << fashion.status().ToString();
    Result<TilePlan> planned = PlanStepTiles(fashion->model, fashion->optimizer, 32);
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    bool found = false;
    for (size_t j = 0; j < planned->ops.size(); ++j) {
      if (planned->ops[j].name != "layers.2.in.grad") continue;
      found = true;
      EXPECT_TRUE(planned->ops[j].window_chain);
      EXPECT_EQ(OneOutputChainBlocks(16, 1, 64, 64), 752);
      EXPECT_EQ(ReductionBlocks(*planned, static_cast<int64_t>(j)), 48);
    }
    EXPECT_TRUE(found);
  }
  int taken = 0, refused = 0, chained = 0, grouped = 0;
  uint32_t turns_before = 0, turns_after = 0;
  int64_t largest_chained = 0;
  for (int64_t k : {2, 4, 8, 12, 16, 20, 32}) {
    for (int64_t s : {int64_t{1}, std::max<int64_t>(1, k / 2), k}) {
      for (int64_t W : {40, 600, 601}) {
        const int64_t H = k + 3 * s;
        const std::string shape = "2, " + std::to_string(H) + ", " + std::to_string(W);
        Result<TaskSpec> spec =
            SyntheticTask("tile-pool-sweep", 17, shape, PoolAfterRelu(k, s), 32);
        ASSERT_TRUE(spec.ok()) << spec.status().ToString();
        Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
        if (!plan.ok()) {
          ++refused;
          std::printf("[ pool sweep] refused: %lld x %lld of stride %lld over %s\n",
                      static_cast<long long>(k), static_cast<long long>(k),
                      static_cast<long long>(s), shape.c_str());
          EXPECT_NE(plan.status().ToString().find("model.layers[1] (maxpool2d"), std::string::npos)
              << plan.status().ToString();
          continue;
        }
        ++taken;
        const std::string label =
            "pool " + std::to_string(k) + " stride " + std::to_string(s) + " over " + shape;
        const std::map<std::string, int64_t> largest = LargestWindowFootprints(*plan);
        ExpectUnderTheBound(label, largest, /*print=*/false);
        for (size_t j = 0; j < plan->ops.size(); ++j) {
          const TileOp& op = plan->ops[j];
          if (op.name != "layers.1.in.grad" || !op.window_chain) continue;
          ++chained;
          const int64_t before = OneOutputChainBlocks(k, s, H, W);
          const int64_t after = ReductionBlocks(*plan, static_cast<int64_t>(j));
          EXPECT_LE(after, before) << label;
          grouped += after < before;
          turns_before += CeilLog2(before);
          turns_after += CeilLog2(after);
          const int64_t bytes = largest.at(op.name);
          largest_chained = std::max(largest_chained, bytes);
          std::printf(
              "[ pool sweep] %-34s chain blocks %4lld -> %3lld, block turns %2u -> %2u, largest "
              "block %6lld bytes\n",
              label.c_str(), static_cast<long long>(before), static_cast<long long>(after),
              CeilLog2(before), CeilLog2(after), static_cast<long long>(bytes));
        }
      }
    }
  }
  std::printf("[ pool sweep] %d pools planned, every block under the bound; %d refused\n", taken,
              refused);
  std::printf(
      "[ pool sweep] %d chained input gradients, %d of them grouped: block turns %u -> %u in all, "
      "largest block %lld bytes\n",
      chained, grouped, turns_before, turns_after, static_cast<long long>(largest_chained));
  EXPECT_EQ(taken, 63);
  EXPECT_EQ(refused, 0);
  EXPECT_GT(grouped, 0);
  EXPECT_LT(turns_after, turns_before);
}

// A conv2d block read the weight's rows of its output channels in every (c, kh, kw) column of its
// channels: a 48 x 48 kernel to 32 channels, 32 x 2,304 floats a channel (288 KiB), so over
// 1 x 56 x 56 its forward's largest block read 356,352 bytes of values and its input gradient's
// 311,296 (a 40 x 40 kernel's forward 253,952). Past 8 tiles of weight a channel such a conv reads
// only its block's pairs' KW weight columns, counted in its block: every tile of the conv and of
// its input gradient recomputes to the traced bits, every block under the bound; over the kernels
// the engine takes (24, 40 and 64) to 32 and 64 channels, narrow and wide images, strides 1 and 16,
// and over unchunked examples (a 32 x 32 kernel over 1 x 32 x 32: the examples and 32 x 1,024
// floats of weight, 256 KiB, read whole before), every block is under the bound, and over 4 x 16 x
// 16 (a 16 x 16 kernel: its rows and its block's weight, 256 KiB whole) too.
TEST(TileRuleConvTest, AConvWithALargeKernelReadsItsPairsWeightColumnsBitForBit) {
  const auto conv = [](int64_t kernel, int64_t out, int64_t stride) {
    return "[[model.layers]]\nkind = \"conv2d\"\nout = " + std::to_string(out) +
           "\nkernel = " + std::to_string(kernel) + "\nstride = " + std::to_string(stride) +
           "\npad = 0\n[[model.layers]]\nkind = \"relu\"\n[[model.layers]]\nkind = "
           "\"flatten\"\n[[model.layers]]\nkind = \"linear\"\nout = 3\n";
  };
  {
    Result<TaskSpec> spec =
        SyntheticTask("tile-large-kernel-conv", 18, "1, 56, 56",
                      "[[model.layers]]\nkind = \"relu\"\n" + conv(48, 32, 1), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const TaskData d = testing::RandomTaskData(64, {1, 56, 56}, 3, 71, -1.0f, 1.0f);
    int64_t ops = 0;
    const std::map<std::string, int64_t> largest =
        ExpectEveryTileRecomputes(*spec, d, IsConvOrInputGrad, &ops);
    EXPECT_EQ(ops, 2);
    ExpectUnderTheBound("48 x 48 conv to 32", largest);
  }
  struct Case {
    int64_t k, out, stride;
    bool wide;
    int64_t C = 2, pad = 2;  // pad: the image is k + pad x stride rows high
  };
  int planned = 0;
  // The last: a 16 x 16 kernel to 32 channels over 4 x 16 x 16, its rows (128 KiB) and 8 tiles of
  // weight a channel of its block's 4 (128 KiB) read whole before.
  for (const Case& c :
       {Case{24, 32, 1, false}, Case{24, 64, 16, true}, Case{40, 32, 1, false},
        Case{40, 64, 16, false}, Case{40, 32, 16, true}, Case{64, 32, 1, false},
        Case{64, 64, 16, false}, Case{64, 32, 16, true}, Case{16, 32, 1, false, 4, 0}}) {
    const int64_t H = c.k + c.pad * c.stride, W = c.wide ? H + 40 : H;
    const std::string shape =
        std::to_string(c.C) + ", " + std::to_string(H) + ", " + std::to_string(W);
    Result<TaskSpec> spec =
        SyntheticTask("tile-conv-sweep", 19, shape,
                      "[[model.layers]]\nkind = \"relu\"\n" + conv(c.k, c.out, c.stride), 32);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, 32);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ++planned;
    ExpectUnderTheBound("conv " + std::to_string(c.k) + " to " + std::to_string(c.out) +
                            " stride " + std::to_string(c.stride) + " over " + shape,
                        LargestWindowFootprints(*plan, /*grads=*/false), /*print=*/false);
  }
  Result<TaskSpec> first = SyntheticTask("tile-conv-sweep", 19, "1, 32, 32", conv(32, 32, 1), 32);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<TilePlan> plan = PlanStepTiles(first->model, first->optimizer, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ExpectUnderTheBound("32 x 32 conv over 1 x 32 x 32 examples", LargestWindowFootprints(*plan));
  std::printf("[ conv sweep] %d large-kernel convs planned, every block under the bound\n",
              planned + 1);
}

}  // namespace tile_rule_conv_test
}  // namespace meshlearn::engine
