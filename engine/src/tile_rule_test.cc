// Tiled commitments (tile.h) and the one-tile recompute (tile_rule.h) on real training: every
// tile of every operator of a step, recomputed from its footprint alone with the reference
// kernels' order, equals the tile the whole step's fast kernels produced, bit for bit.
#include "meshlearn/engine/tile_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/optim.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace tile_rule_test {  // named: the tests build as unity translation units

// Shapes that cut every tensor into several tiles, with short tiles at the edges: batch 40 (two
// row blocks, the second of 8 rows), 70 inputs, hidden 40 and 36, 5 classes.
constexpr char kMlp[] = R"(
[task]
name = "tile-mlp"
seed = 9
[data]
format = "npy"
train_x = "unused"
train_y = "unused"
test_x = "unused"
test_y = "unused"
[model]
input = [70]
[[model.layers]]
kind = "linear"
out = 40
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 36
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 5
[optimizer]
kind = "adamw"
lr = 1e-2
weight_decay = 0.05
[train]
steps = 10
batch_size = 40
)";

TaskData SyntheticData() { return testing::RandomTaskData(200, {70}, 5, 4, -1.0f, 1.0f); }

std::unique_ptr<Trainer> MakeTrainer(const std::string& toml) {
  Result<TaskSpec> spec = TaskSpec::Parse(toml, "tile-mlp.toml", ".");
  CHECK(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, SyntheticData());
  CHECK(tr.ok()) << tr.status().ToString();
  return std::move(*tr);
}

using testing::SameBits;

// `toml` with optimizer.grad_clip = `clip` (its [optimizer] table is the one before [train]).
std::string Clipped(std::string toml, const char* clip) {
  toml.replace(toml.find("[train]"), 7, std::string("grad_clip = ") + clip + "\n[train]");
  return toml;
}

// One traced training step of `trainer` (its task's micro-batches) after `warmup` plain steps:
// the trainer, the step's number and batch, its trace (values kept), the gradient norm before
// clipping (StepOnBatch's) and the step's tile plan, which must follow the trace operator for
// operator.
struct TracedStep {
  std::unique_ptr<Trainer> trainer;
  int64_t step = 0;
  Batch batch;
  OpTrace trace;
  float norm = 0;
  TilePlan plan;
};
void TraceTrainerStep(std::unique_ptr<Trainer> trainer, int warmup, TracedStep* out) {
  out->trainer = std::move(trainer);
  for (int i = 0; i < warmup; ++i) out->trainer->Step();
  const TaskSpec& task = out->trainer->task();
  TrainState& st = out->trainer->state();
  out->step = st.step;
  out->batch = out->trainer->BatchForStep(st.step);
  out->trace.set_keep_values(true);
  st.model->set_op_trace(&out->trace);
  StepOnBatch(st, out->batch, DropoutSeed(task.seed, task.stream), &out->norm, task.micro_batches);
  st.model->set_op_trace(nullptr);
  Result<TilePlan> plan = PlanStepTiles(task.model, st.optimizer->spec(), task.batch_size,
                                        task.seq_len, task.micro_batches);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->ops.size(), out->trace.size());
  plan->dropout_seed = DropoutSeed(task.seed, task.stream);
  out->plan = std::move(*plan);
}

TEST(TileTest, GridsCutTensorsIntoTilesThatProveAlone) {
  TileGrid m = TileGrid::For(70, 40);
  EXPECT_EQ(m.row_tiles(), 3);
  EXPECT_EQ(m.col_tiles(), 2);
  EXPECT_EQ(m.count(), 6);
  TileGrid::Rect r = m.TileRect(5);
  EXPECT_EQ(r.r0, 64);
  EXPECT_EQ(r.r1, 70);
  EXPECT_EQ(r.c0, 32);
  EXPECT_EQ(r.c1, 40);
  EXPECT_EQ(m.TileAt(65, 33), 5);
  TileGrid v = TileGrid::For(1, 2500);
  EXPECT_EQ(v.count(), 3);
  EXPECT_EQ(v.TileRect(2).numel(), 452);
  EXPECT_EQ(TileGrid::ForShape({36}), TileGrid::For(1, 36));
  EXPECT_EQ(TileGrid::ForShape({4, 3, 5}), TileGrid::For(4, 15));

  std::vector<float> x(70 * 40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
  std::vector<Hash256> hashes = TileHashes(x, m);
  const Hash256 root = TensorRoot(x, m);
  EXPECT_EQ(root, MerkleRoot(hashes));
  for (int64_t t = 0; t < m.count(); ++t) {
    std::vector<float> tile = ExtractTile(x, m, t);
    EXPECT_EQ(static_cast<int64_t>(tile.size()), m.TileRect(t).numel());
    EXPECT_EQ(TileHash(tile), hashes[static_cast<size_t>(t)]);
    EXPECT_TRUE(MerkleVerify(root, TileHash(tile), MerkleProve(hashes, static_cast<uint64_t>(t))));
  }
  // A changed element changes its tile's hash only.
  x[65 * 40 + 33] += 1.0f;
  std::vector<Hash256> changed = TileHashes(x, m);
  for (int64_t t = 0; t < m.count(); ++t) EXPECT_EQ(changed[t] != hashes[t], t == 5) << t;
}

// Trains two steps and checks, at the second (Adam moments nonzero), that the plan is the
// trace's list of operators and that every tile of every computed operator recomputes from its
// footprint to the traced bits.
void ExpectEveryTileRecomputes(const std::string& toml) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(MakeTrainer(toml), 1, &traced));
  const int64_t M = traced.trainer->task().micro_batches;
  const int64_t step = traced.step;
  const Batch& batch = traced.batch;
  const OpTrace& trace = traced.trace;
  const TilePlan& plan = traced.plan;
  for (size_t j = 0; j < trace.size(); ++j) {
    EXPECT_EQ(plan.ops[j].name, trace.name(j)) << j;
    EXPECT_EQ(plan.ops[j].grid, trace.grid(j)) << trace.name(j);
  }
  int64_t checked = 0, reductions = 0;
  for (size_t j = 0; j < trace.size(); ++j) {
    const TileOp& op = plan.ops[j];
    if (op.kind == TileOpKind::kTileOpState) continue;
    const int64_t jj = static_cast<int64_t>(j);
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      SCOPED_TRACE(op.name + " tile " + std::to_string(t));
      const std::vector<float> want = ExtractTile(trace.values(j), op.grid, t);
      if (ReductionBlocks(plan, jj) > 0) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(plan, jj, t, step, trace, batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_EQ(static_cast<int64_t>(chain->size()), ReductionBlocks(plan, jj) + 1);
        EXPECT_TRUE(SameBits(chain->back(), want));
        ++reductions;
      } else {
        Result<TileFootprint> fp = Footprint(plan, jj, t, 0);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        Result<std::vector<float>> got =
            RecomputeTile(plan, jj, t, 0, step, GatherTileInputs(plan, *fp, trace, batch));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_TRUE(SameBits(*got, want));
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
  EXPECT_GT(reductions, 10);
  if (M > 1) {
    // Every micro-batch's operators, and the update reads the last one's accumulated gradients.
    const std::string last = "mb" + std::to_string(M - 1) + ".";
    int64_t updates = 0;
    for (const TileOp& op : plan.ops) {
      if (op.kind != TileOpKind::kTileOpAdamW && op.kind != TileOpKind::kTileOpSgd) continue;
      EXPECT_TRUE(plan.ops[static_cast<size_t>(op.w)].name.starts_with(last)) << op.name;
      ++updates;
    }
    EXPECT_GT(updates, 0);
    for (int64_t m = 0; m < M; ++m) {
      const std::string loss = "mb" + std::to_string(m) + ".loss";
      EXPECT_TRUE(std::any_of(plan.ops.begin(), plan.ops.end(), [&](const TileOp& op) {
        return op.name == loss;
      })) << loss;
    }
  }
  // The state's tiled commitment is the Merkle root over the input-state operators' roots.
  size_t n_state = 0;
  while (plan.ops[n_state].kind == TileOpKind::kTileOpState) ++n_state;
  std::unique_ptr<Trainer> again = MakeTrainer(toml);
  again->Step();
  EXPECT_EQ(StateTileRoot(again->state()),
            MerkleRoot(std::vector<Hash256>(
                trace.hashes().begin(), trace.hashes().begin() + static_cast<int64_t>(n_state))));
}

// The step runs on every fast path this CPU has (SIMD width, threads); the recompute always
// uses the reference order.
void OnEveryFastPath(const std::string& toml) {
  const KernelConfig saved = GetKernelConfig();
  for (SimdPath simd : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!SimdPathSupported(simd)) continue;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(SimdPathName(simd)) + " x " + std::to_string(threads));
      ASSERT_TRUE(SetKernelConfig({simd, threads}).ok());
      ExpectEveryTileRecomputes(toml);
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

TEST(TileRuleTest, EveryTileOfEveryOperatorRecomputesBitForBitAdamW) { OnEveryFastPath(kMlp); }

TEST(TileRuleTest, EveryTileOfEveryOperatorRecomputesBitForBitSgdNesterov) {
  std::string sgd = kMlp;
  sgd.replace(sgd.find("kind = \"adamw\""), 14, "kind = \"sgd\"\nmomentum = 0.9\nnesterov = true");
  OnEveryFastPath(sgd);
}

// `toml` (kMlp's [train] batch_size = 40) at batch size `batch` in `micro_batches` micro-batches.
std::string MicroBatched(std::string toml, int batch, int micro_batches) {
  toml.replace(toml.find("batch_size = 40"), 15,
               "batch_size = " + std::to_string(batch) +
                   "\nmicro_batches = " + std::to_string(micro_batches));
  return toml;
}

// A step in micro-batches (pipeline.h): every micro-batch's forward and backward, each
// parameter gradient's chain over the micro-batch's rows added into the previous micro-batch's
// accumulated gradient, then the (clipped) update; every tile recomputes to the traced bits. M = 2
// at batch 80 (two row blocks a micro-batch, the second of 8 rows) and M = 4 at batch 40.
TEST(TileRuleTest, AStepInMicroBatchesRecomputesEveryTileBitForBit) {
  OnEveryFastPath(MicroBatched(kMlp, 80, 2));
  OnEveryFastPath(MicroBatched(kMlp, 40, 4));
  ExpectEveryTileRecomputes(Clipped(MicroBatched(kMlp, 80, 2), "0.5"));
  std::string sgd = MicroBatched(kMlp, 40, 4);
  sgd.replace(sgd.find("kind = \"adamw\""), 14, "kind = \"sgd\"\nmomentum = 0.9");
  ExpectEveryTileRecomputes(sgd);
}

// The last block of a micro-batch's gradient tile reads the previous micro-batch's accumulated
// tile (the chain is added into it), and the footprint's batch rows are the step's.
TEST(TileRuleTest, AMicroBatchsGradientDependsOnThePreviousMicroBatchsTile) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(MakeTrainer(MicroBatched(kMlp, 80, 2)), 0, &traced));
  const Batch& batch = traced.batch;
  const OpTrace& trace = traced.trace;
  const TilePlan& plan = traced.plan;
  Trainer& tr = *traced.trainer;
  EXPECT_EQ(PlanStepTiles(tr.task().model, tr.state().optimizer->spec(), 80, 0, 3).status().code(),
            StatusCode::kInvalidArgument);
  int64_t j = -1, prev = -1;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].name == "mb1.layers.0.weight.grad") j = static_cast<int64_t>(i);
    if (plan.ops[i].name == "mb0.layers.0.weight.grad") prev = static_cast<int64_t>(i);
  }
  ASSERT_GE(j, 0);
  ASSERT_GE(prev, 0);
  const int64_t blocks = ReductionBlocks(plan, j);
  ASSERT_EQ(blocks, 2);
  Result<TileFootprint> first = Footprint(plan, j, 1, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->batch_rows.front(), 40) << "micro-batch 1 starts at row 40 of the step";
  for (const TileRef& r : first->tiles) EXPECT_NE(r.op, prev);
  Result<std::vector<std::vector<float>>> chain = ReductionChain(plan, j, 1, 0, trace, batch);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  Result<TileFootprint> fp = Footprint(plan, j, 1, blocks - 1);
  ASSERT_TRUE(fp.ok());
  ASSERT_EQ(fp->tiles.back(), (TileRef{prev, 1}));
  EXPECT_EQ(fp->batch_rows.back(), 79);
  TileInputs in = GatherTileInputs(plan, *fp, trace, batch);
  in.partial = (*chain)[static_cast<size_t>(blocks - 1)];
  Result<std::vector<float>> got = RecomputeTile(plan, j, 1, blocks - 1, 0, in);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(
      SameBits(*got, ExtractTile(trace.values(static_cast<size_t>(j)), plan.ops[j].grid, 1)));
  in.tiles.back()[3] += 0.5f;
  got = RecomputeTile(plan, j, 1, blocks - 1, 0, in);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(
      SameBits(*got, ExtractTile(trace.values(static_cast<size_t>(j)), plan.ops[j].grid, 1)));
}

// 64 examples of 1100 uniform inputs in [-0.5, 0.5), 5 classes: the data of the wide MLPs below.
TaskData WideMlpData() { return testing::RandomTaskData(64, {1100}, 5, 8, -0.5f, 0.5f); }

TEST(TileRuleTest, WideLayersAreNarrowedIntoTheirChainsBitForBit) {
  // 1100 inputs and a 1030-wide hidden layer: the first and last forwards (C = 1100, 1030) and
  // the wide layer's dX (OC = 1030) run over more than 1024 terms, so they are narrowed into
  // 256-wide blocks of their chains (5 blocks each, the last short).
  std::string wide = kMlp;
  wide.replace(wide.find("input = [70]"), 12, "input = [1100]");
  wide.replace(wide.find("out = 36"), 8, "out = 1030");
  const KernelConfig saved = GetKernelConfig();
  for (SimdPath simd : {SimdPath::kScalar, SimdPath::kAvx512}) {
    if (!SimdPathSupported(simd)) continue;
    ASSERT_TRUE(SetKernelConfig({simd, 2}).ok());
    Result<TaskSpec> spec = TaskSpec::Parse(wide, "wide.toml", ".");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, WideMlpData());
    ASSERT_TRUE(tr.ok()) << tr.status().ToString();
    TracedStep traced;
    ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(std::move(*tr), 0, &traced));
    const Batch& batch = traced.batch;
    const OpTrace& trace = traced.trace;
    const TilePlan& plan = traced.plan;
    for (const char* name : {"layers.0.out", "layers.4.out", "layers.2.in.grad"}) {
      int64_t j = -1;
      for (size_t i = 0; i < plan.ops.size(); ++i) {
        if (plan.ops[i].name == name) j = static_cast<int64_t>(i);
      }
      ASSERT_GE(j, 0);
      ASSERT_EQ(ReductionBlocks(plan, j), 5) << name;
      const TileGrid& g = plan.ops[static_cast<size_t>(j)].grid;
      for (int64_t t = 0; t < g.count(); t += 3) {
        Result<std::vector<std::vector<float>>> chain = ReductionChain(plan, j, t, 0, trace, batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_TRUE(
            SameBits(chain->back(), ExtractTile(trace.values(static_cast<size_t>(j)), g, t)))
            << name << " tile " << t;
      }
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

// Examples of 3 x 64 x 64 = 12,288 floats are committed in 12 chunks of 1024 (step_replay.h): a
// first layer's tiles read only the chunks holding their columns (a forward block of 256 inputs,
// a weight gradient tile's 32), the loss its rows' labels only, and each tile recomputes to the
// traced bits from inputs holding those chunks alone (GatherTileInputs zeroes the rest, as the
// ledger does with a witness's chunks).
TEST(TileRuleTest, AFirstLayerOverLargeExamplesReadsOnlyTheChunksOfItsColumnsBitForBit) {
  std::string wide = kMlp;
  wide.replace(wide.find("input = [70]"), 12, "input = [12288]");
  Result<TaskSpec> spec = TaskSpec::Parse(wide, "chunked.toml", ".");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<Trainer>> tr =
      Trainer::Create(*spec, testing::RandomTaskData(64, {12288}, 5, 12, -0.5f, 0.5f));
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(std::move(*tr), 1, &traced));
  const TilePlan& plan = traced.plan;
  ASSERT_EQ(ExampleChunks(plan.input_size), 12);
  int64_t first_layer = 0;
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    const TileOp& op = plan.ops[j];
    if (op.kind == TileOpKind::kTileOpState) continue;
    const int64_t jj = static_cast<int64_t>(j), blocks = ReductionBlocks(plan, jj);
    for (int64_t t = 0; t < op.grid.count(); t += 5) {
      SCOPED_TRACE(op.name + " tile " + std::to_string(t));
      for (int64_t b = 0; b < std::max<int64_t>(blocks, 1); ++b) {
        Result<TileFootprint> fp = Footprint(plan, jj, t, b);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        if (fp->batch_rows.empty()) {
          EXPECT_TRUE(fp->batch_chunks.empty());
          continue;
        }
        if (op.name == "loss" || op.name == "logits.grad") {
          EXPECT_TRUE(fp->batch_chunks.empty()) << "the loss reads its rows' labels only";
        } else {
          EXPECT_EQ(fp->batch_chunks.size(), 1u) << "one chunk of 1024 holds the tile's columns";
          ++first_layer;
        }
      }
      const std::vector<float> want = ExtractTile(traced.trace.values(j), op.grid, t);
      if (blocks > 0) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(plan, jj, t, traced.step, traced.trace, traced.batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        EXPECT_TRUE(SameBits(chain->back(), want));
      } else {
        Result<TileFootprint> fp = Footprint(plan, jj, t, 0);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        Result<std::vector<float>> got = RecomputeTile(
            plan, jj, t, 0, traced.step, GatherTileInputs(plan, *fp, traced.trace, traced.batch));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_TRUE(SameBits(*got, want));
      }
    }
  }
  EXPECT_GT(first_layer, 100);
}

// The fast SumSquaresTree sums 8 blocks at a time and splits a gradient of 2^16 elements or more
// over threads; the norm's operators recompute it block by block in the reference order. A clipped
// MLP whose first weight has 64 x 1100 = 70,400 elements takes both fast paths: on every SIMD
// width and thread count, the block partials, the norm and the clipped updates recompute to the
// traced bits, and the traced norm is the one the fast GlobalGradNorm gave the step (StepOnBatch's
// grad_norm): the reference combination of the partials is the fast sum, bit for bit.
TEST(TileRuleTest, TheNormOperatorsRecomputeOnEveryFastPathOverLargeGradients) {
  std::string wide = Clipped(kMlp, "0.05");
  wide.replace(wide.find("input = [70]"), 12, "input = [1100]");
  wide.replace(wide.find("out = 40"), 8, "out = 64");
  const KernelConfig saved = GetKernelConfig();
  for (SimdPath simd : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!SimdPathSupported(simd)) continue;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(SimdPathName(simd)) + " x " + std::to_string(threads));
      ASSERT_TRUE(SetKernelConfig({simd, threads}).ok());
      Result<TaskSpec> spec = TaskSpec::Parse(wide, "wide-clipped.toml", ".");
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, WideMlpData());
      ASSERT_TRUE(tr.ok()) << tr.status().ToString();
      TracedStep traced;  // after a step: nonzero moments
      ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(std::move(*tr), 1, &traced));
      const int64_t step = traced.step;
      const Batch& batch = traced.batch;
      const OpTrace& trace = traced.trace;
      const TilePlan& plan = traced.plan;
      const float norm = traced.norm;
      // The 6 updates and their 12 AdamW moments follow the norm's two operators.
      const int64_t n = static_cast<int64_t>(plan.ops.size()) - 12;
      const int64_t blocks = n - 8, norm_op = n - 7;
      ASSERT_EQ(plan.ops[static_cast<size_t>(norm_op)].name, "grad_norm");
      EXPECT_GT(norm, 0.05f) << "the clip must act";
      EXPECT_EQ(trace.values(static_cast<size_t>(norm_op))[0], norm);
      for (int64_t j : {blocks, norm_op}) {
        const TileGrid& g = plan.ops[static_cast<size_t>(j)].grid;
        for (int64_t t = 0; t < g.count(); ++t) {
          Result<std::vector<std::vector<float>>> chain =
              ReductionChain(plan, j, t, step, trace, batch);
          ASSERT_TRUE(chain.ok()) << chain.status().ToString();
          ASSERT_TRUE(
              SameBits(chain->back(), ExtractTile(trace.values(static_cast<size_t>(j)), g, t)))
              << plan.ops[static_cast<size_t>(j)].name << " tile " << t;
        }
      }
      for (int64_t j = norm_op + 1; j < n; ++j) {  // every clipped update, every tile
        const TileGrid& g = plan.ops[static_cast<size_t>(j)].grid;
        for (int64_t t = 0; t < g.count(); ++t) {
          Result<TileFootprint> fp = Footprint(plan, j, t, 0);
          ASSERT_TRUE(fp.ok()) << fp.status().ToString();
          Result<std::vector<float>> got =
              RecomputeTile(plan, j, t, 0, step, GatherTileInputs(plan, *fp, trace, batch));
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          ASSERT_TRUE(SameBits(*got, ExtractTile(trace.values(static_cast<size_t>(j)), g, t)))
              << plan.ops[static_cast<size_t>(j)].name << " tile " << t;
        }
      }
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

TEST(TileRuleTest, FootprintsAreSmallAndRefuseWhatIsNotAnOutput) {
  std::unique_ptr<Trainer> tr = MakeTrainer(kMlp);
  Result<TilePlan> plan =
      PlanStepTiles(tr->task().model, tr->state().optimizer->spec(), tr->task().batch_size);
  ASSERT_TRUE(plan.ok());
  // layers.0.out tile 0: 32 examples, the 2 x 3 tiles of layers.0.weight rows 0..31 (70 = 3 column
  // tiles), the bias tile.
  int64_t out0 = -1, dw0 = -1;
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    if (plan->ops[j].name == "layers.0.out") out0 = static_cast<int64_t>(j);
    if (plan->ops[j].name == "layers.0.weight.grad") dw0 = static_cast<int64_t>(j);
  }
  ASSERT_GE(out0, 0);
  Result<TileFootprint> fp = Footprint(*plan, out0, 0, 0);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->batch_rows.size(), 32u);
  EXPECT_EQ(fp->tiles.size(), 3u + 1);
  // dW is narrowed: 2 blocks of the batch (32 + 8 rows); block 1 reads 8 examples.
  EXPECT_EQ(ReductionBlocks(*plan, dw0), 2);
  Result<TileFootprint> b1 = Footprint(*plan, dw0, 0, 1);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(b1->batch_rows.size(), 8u);
  EXPECT_FALSE(Footprint(*plan, dw0, 0, 2).ok());
  EXPECT_FALSE(Footprint(*plan, out0, 0, 1).ok());
  EXPECT_FALSE(Footprint(*plan, out0, 99, 0).ok());
  Result<TileFootprint> state = Footprint(*plan, 0, 0, 0);
  EXPECT_EQ(state.status().code(), StatusCode::kFailedPrecondition);
  // Inputs that are not the footprint's are refused, not recomputed.
  TileInputs wrong;
  Result<std::vector<float>> r = RecomputeTile(*plan, out0, 0, 0, 0, wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input tiles given"), std::string::npos)
      << r.status().message();
}

TEST(TileRuleTest, WhatIsNotCoveredYetIsOpaqueAndRefused) {
  std::unique_ptr<Trainer> tr = MakeTrainer(kMlp);
  ModelSpec odd = tr->task().model;
  odd.layers[1].kind = "softplus";
  Result<TilePlan> g = PlanStepTiles(odd, tr->state().optimizer->spec(), 8);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("model.layers[1]"), std::string::npos);
}

// A clipped step (optimizer.grad_clip) commits its global gradient norm as two operators before
// the update: every gradient's block partials, then the norm; each update tile reads the norm's
// one tile besides its own elements. The clip is small enough to act at every step here.
TEST(TileRuleTest, AClippedUpdateReadsTheCommittedNormAndEveryTileRecomputesAdamW) {
  const std::string toml = Clipped(kMlp, "0.05");
  std::unique_ptr<Trainer> tr = MakeTrainer(toml);
  tr->Step();
  ASSERT_GT(tr->last_grad_norm(), 0.05f) << "the clip must act for this test to mean anything";
  Result<TilePlan> p = PlanStepTiles(tr->task().model, tr->state().optimizer->spec(), 40);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // The 6 parameters' updates follow the norm's two operators, and their 12 AdamW moments
  // after the update follow them (m of each, then v of each).
  const size_t n = p->ops.size() - 12;
  const TileOp& blocks = p->ops[n - 8];
  const TileOp& norm = p->ops[n - 7];
  EXPECT_EQ(blocks.name, "grad_norm.blocks");
  EXPECT_EQ(blocks.kind, TileOpKind::kTileOpGradSquareBlocks);
  EXPECT_EQ(blocks.grid.cols, 3 + 1 + 2 + 1 + 1 + 1);  // 2800, 40, 1440, 36, 180, 5 gradients
  EXPECT_EQ(norm.name, "grad_norm");
  EXPECT_EQ(norm.grid.count(), 1);
  EXPECT_EQ(ReductionBlocks(*p, static_cast<int64_t>(n - 7)), 6);  // a chain over the parameters
  EXPECT_EQ(ReductionBlocks(*p, static_cast<int64_t>(n - 8)), kTileFlat);
  for (const int64_t last : {static_cast<int64_t>(n) - 1, static_cast<int64_t>(n) + 5,
                             static_cast<int64_t>(p->ops.size()) - 1}) {
    const TileOp& up = p->ops[static_cast<size_t>(last)];
    EXPECT_EQ(up.kind, TileOpKind::kTileOpAdamW) << up.name;
    EXPECT_EQ(up.clip_norm, static_cast<int64_t>(n - 7)) << up.name;
    Result<TileFootprint> fp = Footprint(*p, last, 0, 0);
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    ASSERT_EQ(fp->tiles.size(), 5u);  // the parameter, its gradient, m, v and the norm
    EXPECT_EQ(fp->tiles.back(), (TileRef{static_cast<int64_t>(n - 7), 0}));
  }
  // The last parameter's update, then its moments after it: the same update's other outputs.
  const std::string last_param = p->ops[n - 1].name;
  EXPECT_EQ(p->ops[n + 5].name, "optim.m." + last_param);
  EXPECT_EQ(p->ops[n + 5].update_output, TileUpdateOutput::kTileUpdateFirstMoment);
  EXPECT_EQ(p->ops.back().name, "optim.v." + last_param);
  EXPECT_EQ(p->ops.back().update_output, TileUpdateOutput::kTileUpdateSecondMoment);
  EXPECT_EQ(UpdatedStateOperand(p->ops.back()), p->ops.back().v);
  EXPECT_EQ(p->ops[static_cast<size_t>(p->ops.back().v)].name, "in.optim.v." + last_param);
  // Partial 1 (of layers.0.weight's 70 x 40 = 2800 elements: elements 1024..2047, rows 14..29 of
  // its 40 x 70 view, columns 44..69 of row 14 to 0..17 of row 29) reads the 3 column tiles of
  // row block 0; a partial past the last is an empty block.
  Result<TileFootprint> b1 = Footprint(*p, static_cast<int64_t>(n - 8), 0, 1);
  ASSERT_TRUE(b1.ok()) << b1.status().ToString();
  EXPECT_EQ(b1->tiles.size(), 3u);
  Result<TileFootprint> past = Footprint(*p, static_cast<int64_t>(n - 8), 0, 9);
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(past->tiles.empty());
  OnEveryFastPath(toml);
}

TEST(TileRuleTest, AClippedUpdateRecomputesEveryTileSgdNesterov) {
  std::string sgd = Clipped(kMlp, "0.05");
  sgd.replace(sgd.find("kind = \"adamw\""), 14, "kind = \"sgd\"\nmomentum = 0.9\nnesterov = true");
  OnEveryFastPath(sgd);
}

// The norm's chain and the block partials are the engine's own sum: a changed gradient element
// changes exactly the partial that holds it, and a changed partial the norm.
TEST(TileRuleTest, TheNormOperatorsDependOnTheirWholeFootprint) {
  std::unique_ptr<Trainer> tr = MakeTrainer(Clipped(kMlp, "0.05"));
  Result<TilePlan> p = PlanStepTiles(tr->task().model, tr->state().optimizer->spec(), 40);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const int64_t blocks = static_cast<int64_t>(p->ops.size()) - 8 - 12, norm = blocks + 1;
  Rng rng(3);
  for (const auto& [op, block] :
       {std::pair<int64_t, int64_t>{blocks, 1}, {blocks, 2}, {norm, 0}, {norm, 3}}) {
    Result<TileFootprint> fp = Footprint(*p, op, 0, block);
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    TileInputs in;
    for (const TileRef& r : fp->tiles) {
      std::vector<float> v(
          static_cast<size_t>(p->ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel()));
      for (float& f : v) f = static_cast<float>(rng.UniformDouble()) - 0.5f;
      in.tiles.push_back(std::move(v));
    }
    if (block > 0) {
      in.partial.assign(
          static_cast<size_t>(p->ops[static_cast<size_t>(op)].grid.TileRect(0).numel()), 0.5f);
    }
    Result<std::vector<float>> base = RecomputeTile(*p, op, 0, block, 0, in);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    const size_t e = op == blocks ? static_cast<size_t>(block) : 0;
    for (size_t i = 0; i < in.tiles.size(); ++i) {
      TileInputs changed = in;
      for (float& f : changed.tiles[i]) f += 0.25f;
      Result<std::vector<float>> got = RecomputeTile(*p, op, 0, block, 0, changed);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_NE((*got)[e], (*base)[e]) << p->ops[static_cast<size_t>(op)].name << " input " << i;
      for (size_t k = 0; k < got->size(); ++k) {
        if (k != e) {
          EXPECT_EQ((*got)[k], (*base)[k]) << "only the block's own partial changes";
        }
      }
    }
  }
}

// A parameter above 8192 block partials (8M gradient elements; GPT-2's wte, none of the 10M
// GPT's) spans one grad_norm block per chunk of 8192 of them. A clipped MLP whose middle weight
// has 215,000 x 40 = 8,600,000 elements (8,399 partials: chunks of 8,192 and 207) after two
// small parameters: its chunk blocks' chain is, block by block, the engine's own sum (the total
// before the parameter, then the first chunk's tree; the parameter's whole tree added once),
// the last block the norm StepOnBatch clipped with, bit for bit.
TEST(TileRuleTest, AParameterAbove8192PartialsIsNarrowedIntoChunksOfTheNormBitForBit) {
  std::string big = Clipped(kMlp, "0.05");
  big.replace(big.find("out = 36"), 8, "out = 215000");
  Result<TaskSpec> spec = TaskSpec::Parse(big, "big-clipped.toml", ".");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(
      TraceTrainerStep(Trainer::Create(*spec, SyntheticData()).value(), 0, &traced));
  const Batch& batch = traced.batch;
  const OpTrace& trace = traced.trace;
  const TilePlan& plan = traced.plan;
  const float norm = traced.norm;
  const int64_t norm_op = static_cast<int64_t>(plan.ops.size()) - 6 - 12 - 1;
  const TileOp& n = plan.ops[static_cast<size_t>(norm_op)];
  ASSERT_EQ(n.name, "grad_norm");
  // Six parameters, the middle weight in two chunks.
  ASSERT_EQ(n.sources.size(), 6u);
  ASSERT_EQ(ReductionBlocks(plan, norm_op), 7);
  // The partials the engine traced, one run per parameter (2800, 40, 8.6M, 215,000, 1.075M, 5
  // elements).
  const std::span<const float> partials = trace.values(static_cast<size_t>(n.x));
  const std::vector<int64_t> counts = {3, 1, 8399, 210, 1050, 1};
  ASSERT_EQ(static_cast<int64_t>(partials.size()), 3 + 1 + 8399 + 210 + 1050 + 1);
  auto tree = [&](int64_t first, int64_t count) {
    return CombineBlockPartials(
        std::vector<float>(partials.begin() + first, partials.begin() + first + count));
  };
  // The engine's chain (optim.cc's SumGradSquares: total += the parameter's whole tree), with
  // the first chunk's tree where the chain stops inside the middle weight.
  std::vector<std::vector<float>> want = {{}};
  float total = 0;
  int64_t first = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (p == 2) want.push_back({total, tree(first, 8192)});  // the weight's first chunk
    total += tree(first, counts[p]);
    first += counts[p];
    want.push_back({p + 1 == counts.size() ? std::sqrt(total) : total});
  }
  EXPECT_EQ(want.back()[0], norm);
  EXPECT_GT(norm, 0.05f) << "the clip must act";
  Result<std::vector<std::vector<float>>> chain = ReductionChain(plan, norm_op, 0, 0, trace, batch);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  ASSERT_EQ(chain->size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_TRUE(SameBits(want[k], (*chain)[k])) << "S_" << k;
    if (k > 0 && k < want.size() - 1) {
      EXPECT_EQ(ReductionPartialFloats(plan, norm_op, 0, static_cast<int64_t>(k)),
                static_cast<int64_t>(want[k].size()));
    }
  }
  EXPECT_TRUE(SameBits(chain->back(), trace.values(static_cast<size_t>(norm_op))));
  // The chunk blocks read 8,192 and 207 partials (9 and 1 tiles of grad_norm.blocks: the
  // weight's partials start at 4); no block reads a whole parameter's run above the chunk.
  Result<TileFootprint> c0 = Footprint(plan, norm_op, 0, 2);
  Result<TileFootprint> c1 = Footprint(plan, norm_op, 0, 3);
  ASSERT_TRUE(c0.ok() && c1.ok());
  EXPECT_EQ(c0->tiles.size(), 9u);
  EXPECT_EQ(c1->tiles.size(), 1u);
}

// examples/fashion-cnn.toml's model (conv, relu, pool, conv, relu, pool, flatten, linear 1568 ->
// 128, relu, linear, with a gelu in place of the head's relu to cover it too) at batch 40: the
// plan is the trace's list; tiles of every covered operator recompute to the traced bits (the
// second conv narrowed into blocks of 4 of its 16 channels, the first linear into blocks of its
// 1568 inputs); nothing is opaque (the pools' and convs' gradients: tile_rule_conv_test.cc).
TEST(TileRuleTest, TheCnnsCoveredOperatorsRecomputeAndTheRestIsOpaque) {
  Result<TaskSpec> base = TaskSpec::Load(
      Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-cnn.toml");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ModelSpec model = base->model;
  ASSERT_EQ(model.layers.size(), 10u);
  model.layers[8].kind = "gelu";
  Result<TaskSpec> parsed = TaskSpec::Parse(kMlp, "cnn.toml", ".");  // batch 40, no files
  ASSERT_TRUE(parsed.ok());
  TaskSpec spec = std::move(*parsed);
  spec.model = model;
  spec.optimizer = base->optimizer;
  spec.optimizer.grad_clip = 0;
  const TaskData d = testing::RandomTaskData(64, {1, 28, 28}, 10, 21, -0.5f, 0.5f);
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(spec, d);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  TrainState& st = (*tr)->state();
  const Batch batch = (*tr)->BatchForStep(st.step);
  OpTrace trace;
  trace.set_keep_values(true);
  st.model->set_op_trace(&trace);
  StepOnBatch(st, batch, DropoutSeed(spec.seed, spec.stream));
  st.model->set_op_trace(nullptr);
  Result<TilePlan> plan = PlanStepTiles(spec.model, st.optimizer->spec(), spec.batch_size);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->ops.size(), trace.size());
  int64_t covered = 0, opaque = 0;
  for (size_t j = 0; j < trace.size(); ++j) {
    const TileOp& op = plan->ops[j];
    ASSERT_EQ(op.name, trace.name(j)) << j;
    ASSERT_EQ(op.grid, trace.grid(j)) << op.name;
    if (op.kind == TileOpKind::kTileOpState) continue;
    if (op.kind == TileOpKind::kTileOpOpaque) {
      ++opaque;
      EXPECT_FALSE(Footprint(*plan, static_cast<int64_t>(j), 0, 0).ok()) << op.name;
      continue;
    }
    ++covered;
    const int64_t jj = static_cast<int64_t>(j);
    // Every tile of a convolution (tiles cross output rows and channels); a sample elsewhere.
    const bool window = op.kind == TileOpKind::kTileOpConv || op.kind == TileOpKind::kTileOpMaxPool;
    const int64_t stride = window ? 1 : std::max<int64_t>(1, op.grid.count() / 40);
    for (int64_t t = 0; t < op.grid.count(); t += stride) {
      const std::vector<float> want = ExtractTile(trace.values(j), op.grid, t);
      if (ReductionBlocks(*plan, jj) > 0) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(*plan, jj, t, st.step - 1, trace, batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_TRUE(SameBits(chain->back(), want)) << op.name << " tile " << t;
      } else {
        Result<TileFootprint> fp = Footprint(*plan, jj, t, 0);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        Result<std::vector<float>> got =
            RecomputeTile(*plan, jj, t, 0, st.step - 1, GatherTileInputs(*plan, *fp, trace, batch));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_TRUE(SameBits(*got, want)) << op.name << " tile " << t;
      }
    }
  }
  std::printf("[ cnn      ] %lld covered operators, %lld opaque\n", static_cast<long long>(covered),
              static_cast<long long>(opaque));
  EXPECT_EQ(covered, 51);  // 2 conv, 2 pool, 3 relu/gelu, 2 linear, loss x2, 8 in.grads,
                           // 4 linear and 4 conv grads, 8 updates and their 16 AdamW moments
  EXPECT_EQ(opaque, 0);    // the pools' and convs' gradients too (tile_rule_conv_test.cc)
}

// A small GPT (2 layers, 2 heads, C = 40: tiles with short edges) on text, batch 2 x 24 tokens:
// on every fast path, every tile of every covered operator (the linears, layernorms, attention
// (tiles spanning two heads of 20 columns, and two sequences of 24 rows), gelus and residual
// adds; ln_f and the LM head; the backward's head input gradient, ln_f's backward and the linears'
// weight and bias gradients, chained block by block; the token embeddings (encoded: tiles of
// rows of two sequences, whose positions wrap), the token loss and its gradient, wte's gradient
// (the tied head's dW chain, then the rows by token) and wpe's (the rows by position), both
// chained block by block; the attention backward (qkv.grad: tiles of q, k and v columns of two
// heads and two sequences); the update) recomputes from its footprint to the traced bits:
// every computed operator is covered.
constexpr char kSmallGpt[] = R"(
[task]
name = "tile-gpt"
seed = 5
[data]
format = "text"
path = "/usr/share/common-licenses/GPL-3"
[model]
kind = "gpt"
n_layer = 2
n_head = 2
n_embd = 40
block_size = 24
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 2
batch_size = 2
)";

// One traced training step of the task `toml` (data paths relative to `dir`) after `warmup` plain
// steps (TraceTrainerStep).
void TraceStep(const std::string& toml, const std::string& dir, int warmup, TracedStep* out) {
  Result<TaskSpec> spec = TaskSpec::Parse(toml, "traced-step.toml", dir);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(Env::Default(), *spec);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(std::move(*tr), warmup, out));
}

// A 1-layer GPT of 2 heads, `n_embd` wide, with sequences of T tokens, on token files of a
// `vocab`-token vocabulary (train.bin and val.bin in a new TestDir, 4096 tokens each drawn
// uniformly from Rng(data_seed)): one traced step after `warmup` plain steps (TraceStep).
void TraceTokenGpt(const std::string& name, uint64_t task_seed, uint64_t data_seed, int64_t vocab,
                   int64_t n_embd, int64_t T, int warmup, TracedStep* out, int64_t n_head = 2) {
  const std::string dir = TestDir("tile-" + name);
  Rng rng(data_seed);
  for (const char* file : {"train.bin", "val.bin"}) {
    std::string bytes;
    for (int i = 0; i < 4096; ++i) {
      const uint16_t t = static_cast<uint16_t>(rng.Uniform(static_cast<uint64_t>(vocab)));
      bytes.push_back(static_cast<char>(t & 0xff));
      bytes.push_back(static_cast<char>(t >> 8));
    }
    ASSERT_TRUE(Env::Default()->WriteFileAtomic(dir + "/" + file, bytes).ok());
  }
  const std::string toml =
      "[task]\nname = \"" + name + "\"\nseed = " + std::to_string(task_seed) +
      "\n[data]\nformat = \"tokens\"\ntrain = \"train.bin\"\n"
      "val = \"val.bin\"\nvocab_size = " +
      std::to_string(vocab) +
      "\n[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = " + std::to_string(n_head) +
      "\nn_embd = " + std::to_string(n_embd) + "\nblock_size = " + std::to_string(T) +
      "\n[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
      "[train]\nsteps = 2\nbatch_size = 2\n";
  ASSERT_NO_FATAL_FAILURE(TraceStep(toml, dir, warmup, out));
}

// The index of the plan's operator `name`, or -1.
int64_t OpNamed(const TilePlan& plan, const std::string& name) {
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].name == name) return static_cast<int64_t>(i);
  }
  return -1;
}

// The floats a footprint reads: of every operand tile, or (only >= 0) of operand `only`'s.
int64_t FootprintFloats(const TilePlan& plan, const TileFootprint& fp, int64_t only = -1) {
  int64_t floats = 0;
  for (const TileRef& r : fp.tiles) {
    if (only < 0 || r.op == only) {
      floats += plan.ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel();
    }
  }
  return floats;
}

// Tile t of reduction operator j, chained block by block from the traced step (ReductionChain):
// `blocks` partials, ending at the traced tile, bit for bit.
void ExpectChainEndsAtTheTrace(const TracedStep& traced, int64_t j, int64_t t, int64_t blocks) {
  const TileOp& op = traced.plan.ops[static_cast<size_t>(j)];
  Result<std::vector<std::vector<float>>> chain = ReductionChain(
      traced.plan, j, t, traced.trainer->state().step - 1, traced.trace, traced.batch);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  ASSERT_EQ(static_cast<int64_t>(chain->size()), blocks + 1) << op.name;
  EXPECT_TRUE(
      SameBits(chain->back(), ExtractTile(traced.trace.values(static_cast<size_t>(j)), op.grid, t)))
      << op.name << " tile " << t;
}

void ExpectEveryCoveredGptTileRecomputes() {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceStep(kSmallGpt, ".", 1, &traced));
  const TrainState& st = traced.trainer->state();
  const Batch& batch = traced.batch;
  const OpTrace& trace = traced.trace;
  const TilePlan* plan = &traced.plan;
  int64_t covered = 0, checked = 0;
  std::map<TileOpKind, int64_t> kinds;
  for (size_t j = 0; j < trace.size(); ++j) {
    const TileOp& op = plan->ops[j];
    ASSERT_EQ(op.name, trace.name(j)) << j;
    ASSERT_EQ(op.grid, trace.grid(j)) << op.name;
    if (op.kind == TileOpKind::kTileOpState) continue;
    const int64_t jj = static_cast<int64_t>(j);
    if (op.kind == TileOpKind::kTileOpOpaque) {
      EXPECT_FALSE(op.opaque.empty()) << op.name;
      EXPECT_FALSE(Footprint(*plan, jj, 0, 0).ok()) << op.name;
      continue;
    }
    ++covered;
    ++kinds[op.kind];
    // The parameter gradients are reductions over the 48 rows: two blocks of 32, chained (wte's
    // twice: the tied head's chain, then the embedding's).
    const bool reduction = op.kind == TileOpKind::kTileOpLinearWeightGrad ||
                           op.kind == TileOpKind::kTileOpLinearBiasGrad ||
                           op.kind == TileOpKind::kTileOpLayerNormWeightGrad ||
                           op.kind == TileOpKind::kTileOpLayerNormBiasGrad ||
                           op.kind == TileOpKind::kTileOpEmbeddingGrad ||
                           op.kind == TileOpKind::kTileOpAttentionBackward;
    // (The attention backward's chains run over a sequence's 24 positions: one block.)
    const int64_t want_blocks = op.name == "transformer.wte.weight.grad"          ? 4
                                : op.kind == TileOpKind::kTileOpAttentionBackward ? 1
                                                                                  : 2;
    ASSERT_EQ(ReductionBlocks(*plan, jj), reduction ? want_blocks : 0) << op.name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      if (reduction) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(*plan, jj, t, st.step - 1, trace, batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_TRUE(SameBits(chain->back(), ExtractTile(trace.values(j), op.grid, t)))
            << op.name << " tile " << t;
        ++checked;
        continue;
      }
      Result<TileFootprint> fp = Footprint(*plan, jj, t, 0);
      ASSERT_TRUE(fp.ok()) << fp.status().ToString();
      Result<std::vector<float>> got =
          RecomputeTile(*plan, jj, t, 0, st.step - 1, GatherTileInputs(*plan, *fp, trace, batch));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_TRUE(SameBits(*got, ExtractTile(trace.values(j), op.grid, t)))
          << op.name << " tile " << t;
      ++checked;
    }
  }
  // Per layer: qkv, attproj, fch, fcproj; ln1, ln2; att, atty; fch_gelu; residual2, residual3.
  // Then ln_f and the LM head; the head's input gradient (ln_f.grad) and ln_f's backward (the
  // top residual gradient, ln_f's weight and bias gradients); per layer its backward but the
  // attention's (qkv.grad): the input gradients of its four linears and of its gelu, the two
  // layernorms' input gradients added into the residual gradients (residual3.grad,
  // residual.grad), the four linears' and the two layernorms' weight and bias gradients (19); and
  // the (unclipped) update of each of the 28 parameters and of its two AdamW moments; encoded,
  // the loss, logits.grad, and wte's and wpe's gradients.
  EXPECT_EQ(covered, 2 * 11 + 2 + 1 + 3 + 2 * 20 + 3 * 28 + 5);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAttentionBackward], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpEmbedding], 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpEmbeddingGrad], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLoss], 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLossGrad], 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpGeluInputGrad], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLayerNormInputGrad], 1 + 2 * 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLayerNormWeightGrad], 1 + 2 * 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLayerNormBiasGrad], 1 + 2 * 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLinearInputGrad], 1 + 2 * 4);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLinearWeightGrad], 2 * 4);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLinearBiasGrad], 2 * 4);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAttention], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAttentionOut], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAdamW], 3 * 28);  // each parameter, its m and its v
  EXPECT_EQ(kinds[TileOpKind::kTileOpLinear], 2 * 4 + 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLayerNorm], 2 * 2 + 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpGelu], 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpResidual], 2 * 2);
  EXPECT_GT(checked, 200);
}

TEST(TileRuleTest, EverySmallGptCoveredTileRecomputesBitForBitOnEveryFastPath) {
  const KernelConfig saved = GetKernelConfig();
  for (SimdPath simd : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!SimdPathSupported(simd)) continue;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(SimdPathName(simd)) + " x " + std::to_string(threads));
      ASSERT_TRUE(SetKernelConfig({simd, threads}).ok());
      ExpectEveryCoveredGptTileRecomputes();
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

// The small GPT at 4 sequences a step in M micro-batches (pipeline.h): each micro-batch's
// forward and backward ("mb<m>."), every parameter gradient's chain over the micro-batch's rows
// added into the previous micro-batch's, the tied head's wte gradient in its own chain
// ("mb<m>.<wte>.head.grad") and added to the embedding's once ("<wte>.grad"), then the clipped
// update: on every fast path, every tile of every operator recomputes to the traced bits, and
// no operator is opaque.
void ExpectEveryMicroBatchedGptTileRecomputes(int64_t M) {
  std::string toml = kSmallGpt;
  toml.replace(toml.find("batch_size = 2"), 14,
               "batch_size = 4\nmicro_batches = " + std::to_string(M));
  toml.replace(toml.find("[train]"), 7, "grad_clip = 1.0\n[train]");
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceStep(toml, ".", 1, &traced));
  const TilePlan& plan = traced.plan;
  ASSERT_EQ(plan.micro_batches, M);
  std::map<TileOpKind, int64_t> kinds;
  int64_t checked = 0;
  for (size_t j = 0; j < traced.trace.size(); ++j) {
    const TileOp& op = plan.ops[j];
    ASSERT_EQ(op.name, traced.trace.name(j)) << j;
    ASSERT_EQ(op.grid, traced.trace.grid(j)) << op.name;
    if (op.kind == TileOpKind::kTileOpState) continue;
    ASSERT_NE(op.kind, TileOpKind::kTileOpOpaque) << op.name;
    ++kinds[op.kind];
    const int64_t jj = static_cast<int64_t>(j);
    const int64_t step = traced.trainer->state().step - 1;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      const std::vector<float> want = ExtractTile(traced.trace.values(j), op.grid, t);
      if (ReductionBlocks(plan, jj) > 0) {
        Result<std::vector<std::vector<float>>> chain =
            ReductionChain(plan, jj, t, step, traced.trace, traced.batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_TRUE(SameBits(chain->back(), want)) << op.name << " tile " << t;
      } else {
        Result<TileFootprint> fp = Footprint(plan, jj, t, 0);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        Result<std::vector<float>> got = RecomputeTile(
            plan, jj, t, 0, step, GatherTileInputs(plan, *fp, traced.trace, traced.batch));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_TRUE(SameBits(*got, want)) << op.name << " tile " << t;
      }
      ++checked;
    }
  }
  // Per micro-batch: 2 layers' 4 linears' dW plus the head's; wte's and wpe's embedding chains;
  // one loss gradient. Once: wte's two gradients added (one residual add beside the layers' 2
  // a micro-batch), the norm, 3 x 28 AdamW outputs.
  EXPECT_EQ(kinds[TileOpKind::kTileOpLinearWeightGrad], M * (2 * 4 + 1));
  EXPECT_EQ(kinds[TileOpKind::kTileOpEmbeddingGrad], M * 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpLossGrad], M);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAttentionBackward], M * 2);
  EXPECT_EQ(kinds[TileOpKind::kTileOpResidual], M * 2 * 2 + 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpGradNorm], 1);
  EXPECT_EQ(kinds[TileOpKind::kTileOpAdamW], 3 * 28);
  EXPECT_GT(checked, 200 * M);
}

TEST(TileRuleTest, ASmallGptInMicroBatchesRecomputesEveryTileBitForBitOnEveryFastPath) {
  const KernelConfig saved = GetKernelConfig();
  for (SimdPath simd : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!SimdPathSupported(simd)) continue;
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(SimdPathName(simd)) + " x " + std::to_string(threads));
      ASSERT_TRUE(SetKernelConfig({simd, threads}).ok());
      for (int64_t M : {2, 4}) {
        SCOPED_TRACE("M = " + std::to_string(M));
        ExpectEveryMicroBatchedGptTileRecomputes(M);
      }
    }
  }
  ASSERT_TRUE(SetKernelConfig(saved).ok());
}

// A changed input in any tile of the footprint (for a layernorm, also the row's columns outside
// the tile's, and its weight and bias; for a residual add, either operand; for ln_f's input
// gradient, the rows of dout and of the input, and the weight, outside the tile's columns too)
// changes the recomputed tile: the footprint is what the value depends on.
TEST(TileRuleTest, GptLayerNormAndResidualTilesDependOnTheirWholeFootprint) {
  Result<TaskSpec> spec = TaskSpec::Parse(kSmallGpt, "tile-gpt.toml", ".");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->model.gpt.vocab_size = 64;  // a plan only: no data to take it from
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, spec->batch_size);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const char* op_name : {"h.1.ln2", "h.0.residual3", "residual.grad", "h.0.residual3.grad"}) {
    const std::string name = op_name;
    int64_t j = -1;
    for (size_t i = 0; i < plan->ops.size(); ++i) {
      if (plan->ops[i].name == name) j = static_cast<int64_t>(i);
    }
    ASSERT_GE(j, 0) << name;
    Result<TileFootprint> fp = Footprint(*plan, j, 0, 0);  // rows 0..31, columns 0..31
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    // A layernorm reads both column tiles of its input's rows, its weight and its bias; a
    // residual one tile of each operand.
    // A layernorm's input gradient (ln_f's: residual.grad) both column tiles of dout's rows and
    // of its input's rows, and the weight (one tile: each row's two sums over c read all of
    // them); ln2's (residual3.grad) also the tile of the residual gradient it adds into.
    const size_t want = name == "residual.grad"        ? 5u
                        : name == "h.0.residual3.grad" ? 6u
                        : name.ends_with("ln2")        ? 4u
                                                       : 2u;
    ASSERT_EQ(fp->tiles.size(), want) << name;
    TileInputs in;
    Rng rng(7);
    for (const TileRef& r : fp->tiles) {
      std::vector<float> v(
          static_cast<size_t>(plan->ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel()));
      for (float& f : v) f = static_cast<float>(rng.UniformDouble()) - 0.5f;
      in.tiles.push_back(std::move(v));
    }
    Result<std::vector<float>> base = RecomputeTile(*plan, j, 0, 0, 0, in);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    for (size_t i = 0; i < in.tiles.size(); ++i) {
      TileInputs changed = in;
      changed.tiles[i].front() += 0.25f;  // row 0 (and column 0 of a vector)
      Result<std::vector<float>> got = RecomputeTile(*plan, j, 0, 0, 0, changed);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_FALSE(SameBits(*got, *base)) << name << " input tile " << i;
    }
  }
}

// The token operators read their rows' tokens: changing any one token (or target) of the
// footprint changes the recomputed tile of encoded, the loss, logits.grad and a block of wte's
// gradient's rows by token; wpe's gradient reads no token.
TEST(TileRuleTest, GptTokenTilesDependOnTheirTokens) {
  Result<TaskSpec> spec = TaskSpec::Parse(kSmallGpt, "tile-gpt.toml", ".");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->model.gpt.vocab_size = 64;  // a plan only: no data to take it from
  Result<TilePlan> plan = PlanStepTiles(spec->model, spec->optimizer, spec->batch_size);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->tokens);
  const int64_t nb = (plan->batch + kTileRows - 1) / kTileRows;
  Rng rng(11);
  struct Case {
    const char* op;
    int64_t block;
    bool targets;  // the change is to a target (the loss), not a token
  };
  for (const Case& c :
       {Case{"encoded", 0, false}, Case{"loss", 0, true}, Case{"logits.grad", 0, true},
        Case{"transformer.wte.weight.grad", nb, false}}) {
    const std::string name = c.op;
    int64_t j = -1;
    for (size_t i = 0; i < plan->ops.size(); ++i) {
      if (plan->ops[i].name == name) j = static_cast<int64_t>(i);
    }
    ASSERT_GE(j, 0) << name;
    Result<TileFootprint> fp = Footprint(*plan, j, 0, c.block);
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    ASSERT_EQ(fp->batch_rows.size(), 32u) << name;
    TileInputs in;
    for (const TileRef& r : fp->tiles) {
      std::vector<float> v(
          static_cast<size_t>(plan->ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel()));
      for (float& f : v) f = static_cast<float>(rng.UniformDouble()) - 0.5f;
      in.tiles.push_back(std::move(v));
    }
    for (size_t i = 0; i < fp->batch_rows.size(); ++i) {
      in.tokens.push_back(static_cast<int32_t>(rng.Uniform(32)));  // rows of wte's tile 0
      in.y.push_back(static_cast<int32_t>(rng.Uniform(64)));
    }
    if (c.block > 0) {
      const TileGrid& g = plan->ops[static_cast<size_t>(j)].grid;
      in.partial.resize(static_cast<size_t>(2 * g.TileRect(0).numel()));
      for (float& f : in.partial) f = static_cast<float>(rng.UniformDouble());
    }
    Result<std::vector<float>> base = RecomputeTile(*plan, j, 0, c.block, 0, in);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    for (size_t i = 0; i < fp->batch_rows.size(); ++i) {
      TileInputs changed = in;
      int32_t& t = c.targets ? changed.y[i] : changed.tokens[i];
      t = (t + 1) % 32;
      Result<std::vector<float>> got = RecomputeTile(*plan, j, 0, c.block, 0, changed);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_FALSE(SameBits(*got, *base)) << name << " row " << i;
    }
    // A token outside the vocabulary is refused, not read.
    TileInputs bad = in;
    bad.tokens[0] = 64;
    EXPECT_FALSE(RecomputeTile(*plan, j, 0, c.block, 0, bad).ok()) << name;
  }
  int64_t wpe = -1;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    if (plan->ops[i].name == "transformer.wpe.weight.grad") wpe = static_cast<int64_t>(i);
  }
  ASSERT_GE(wpe, 0);
  Result<TileFootprint> fp = Footprint(*plan, wpe, 0, 0);
  ASSERT_TRUE(fp.ok());
  EXPECT_TRUE(fp->batch_rows.empty());
}

// A vocabulary wider than 1024: the operators that read a whole vocabulary are narrowed into
// blocks of 1024, so a block's footprint reads at most 1024 x 32 floats of it whatever the
// vocabulary, and every tile's chain ends at the traced bits. `encoded` in blocks of wte's rows
// (each setting the rows whose token it holds); the loss and its gradient in the reference
// softmax's order over the logits' columns (the max, then the sum, then the gradient's own tile).
// Real training on token files whose tokens spread over all three blocks of a 2,500 vocabulary.
TEST(TileRuleTest, AWideVocabularyIsNarrowedIntoBlocksOf1024BitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("wide-vocab", 3, 23, 2500, 40, 24, 0, &traced));
  const Batch& batch = traced.batch;
  const TilePlan* plan = &traced.plan;
  std::set<int64_t> blocks_hit;
  for (int32_t t : batch.tokens) blocks_hit.insert(t / 1024);
  for (int32_t t : batch.targets) blocks_hit.insert(4 + t / 1024);
  EXPECT_EQ(blocks_hit.size(), 6u) << "the batch's tokens and targets should reach every block";
  // encoded: 3 blocks of wte rows; the loss: 3 max blocks, 3 sum blocks; its gradient one more.
  const std::map<std::string, int64_t> want_blocks = {
      {"encoded", 3}, {"loss", 6}, {"logits.grad", 7}};
  for (const auto& [name, want] : want_blocks) {
    const int64_t j = OpNamed(*plan, name);
    ASSERT_GE(j, 0) << name;
    const TileOp& op = plan->ops[static_cast<size_t>(j)];
    ASSERT_EQ(ReductionBlocks(*plan, j), want) << name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < want; ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        // Of the vocabulary-wide operand: wte for encoded, the logits for the loss.
        const int64_t floats = FootprintFloats(*plan, *fp, op.x);
        EXPECT_GT(floats, 0) << name;
        EXPECT_LE(floats, 1024 * 32) << name << " tile " << t << " block " << k;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, want));
    }
  }
}

// A sequence longer than 256 positions: the attention forward is narrowed into blocks of 32
// positions, so a block's footprint reads at most four 32 x 32 tiles (q and k of 32 rows, or att
// and v of 32 positions; here hs = 8, so a head's q and k share a tile) whatever T, and every
// tile's chain ends at the traced bits: att in the reference kernel's order (9 blocks of the
// running max, 9 of the running sum, then the tile's own columns), atty's chain over the
// positions in 9 blocks. Real training of a 2-sequence batch of T = 288; at T = 256 (the 10M
// GPT's) both are recomputed whole, as before.
TEST(TileRuleTest, ALongSequenceIsNarrowedIntoBlocksOf32PositionsBitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("long-sequence", 5, 29, 64, 16, 288, 1, &traced));
  const TrainState& st = traced.trainer->state();
  const TilePlan* plan = &traced.plan;
  ASSERT_EQ(plan->seq_len, 288);
  const std::map<std::string, int64_t> want_blocks = {{"h.0.att", 19}, {"h.0.atty", 9}};
  for (const auto& [name, want] : want_blocks) {
    const int64_t j = OpNamed(*plan, name);
    ASSERT_GE(j, 0) << name;
    const TileOp& op = plan->ops[static_cast<size_t>(j)];
    ASSERT_EQ(ReductionBlocks(*plan, j), want) << name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < want; ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        EXPECT_LE(FootprintFloats(*plan, *fp), 4 * 32 * 32)
            << name << " tile " << t << " block " << k;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, want));
    }
  }
  // The same model at T = 256: recomputed whole (no blocks), as the 10M GPT's attention is.
  Result<TilePlan> short_plan =
      PlanStepTiles(traced.trainer->task().model, st.optimizer->spec(), 2, 256);
  ASSERT_TRUE(short_plan.ok()) << short_plan.status().ToString();
  for (size_t i = 0; i < short_plan->ops.size(); ++i) {
    const TileOpKind k = short_plan->ops[i].kind;
    if (k == TileOpKind::kTileOpAttention || k == TileOpKind::kTileOpAttentionOut) {
      EXPECT_EQ(ReductionBlocks(*short_plan, static_cast<int64_t>(i)), 0)
          << short_plan->ops[i].name;
    }
    if (k == TileOpKind::kTileOpAttentionBackward) {  // its chain's 8 blocks, no row sums
      EXPECT_EQ(ReductionBlocks(*short_plan, static_cast<int64_t>(i)), 8)
          << short_plan->ops[i].name;
      EXPECT_EQ(ReductionPartialFloats(*short_plan, static_cast<int64_t>(i), 0, 1), 32 * 32);
    }
  }
  // The attention backward (qkv.grad) above T = 256: 81 row-sum blocks (query block x key block)
  // of the groups a tile's q and k columns need, then the chain's 9 blocks of 32 positions, each
  // block reading a few tiles whatever T; every tile's chain ends at the traced bits.
  const int64_t qkv_grad = OpNamed(*plan, "h.0.qkv.grad");
  ASSERT_GE(qkv_grad, 0);
  const TileOp& attb = plan->ops[static_cast<size_t>(qkv_grad)];
  ASSERT_EQ(attb.kind, TileOpKind::kTileOpAttentionBackward);
  ASSERT_EQ(ReductionBlocks(*plan, qkv_grad), 9 * 9 + 9);
  for (int64_t t = 0; t < attb.grid.count(); ++t) {
    for (int64_t k = 0; k < 90; ++k) {
      Result<TileFootprint> fp = Footprint(*plan, qkv_grad, t, k);
      ASSERT_TRUE(fp.ok()) << fp.status().ToString();
      // Two heads' att tiles (dq's and dk's), dout's, v's and q's or k's: at most 10 tiles.
      EXPECT_LE(FootprintFloats(*plan, *fp), 10 * 32 * 32)
          << "qkv.grad tile " << t << " block " << k;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, qkv_grad, t, 90));
  }
}

// The attention backward at T = 300 (not a multiple of 32): row tile 9 of qkv.grad holds the
// last 12 positions of sequence 0 and the first 20 of sequence 1, so its row sums and chain
// blocks span two sequences (ceil(300 / 32) = 10 blocks: 100 row-sum blocks, then 10 of the
// chain, the last of 12 positions); every tile's chain ends at the traced bits.
TEST(TileRuleTest, TheAttentionBackwardOfASequenceNotAMultipleOf32IsNarrowedBitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("long-sequence-300", 6, 37, 64, 16, 300, 1, &traced));
  const TilePlan& plan = traced.plan;
  ASSERT_EQ(plan.seq_len, 300);
  const int64_t j = OpNamed(plan, "h.0.qkv.grad");
  ASSERT_GE(j, 0);
  ASSERT_EQ(ReductionBlocks(plan, j), 10 * 10 + 10);
  for (int64_t t = 0; t < plan.ops[static_cast<size_t>(j)].grid.count(); ++t) {
    ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, 10 * 10 + 10));
  }
}

// A wide head (n_head 1, hs = 512, at T = 128): recomputed whole, an att tile would read k of the
// sequence in its head and q of its rows (4 x 160 x 512 bytes, 320 KiB) and a qkv.grad block v
// of the sequence as well, both past the witness bound. Both are narrowed over the positions as a
// long sequence is (4 blocks of 32), and their dot products over the head's columns too: att's
// into two blocks of 256 (18 blocks: 4 of the max, 4 of the sum and the output, each twice),
// qkv.grad's dA = dout . v into four of 128 (80 blocks: 16 of the row sums and 4 of the chain,
// each four times). Every footprint reads at most 16 tiles (64 KiB) whatever hs; every att tile's
// chain, and those of qkv.grad's tiles in a column of q, of k and of v, end at the traced bits.
TEST(TileRuleTest, AWideHeadIsNarrowedOverItsColumnsBitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("wide-head", 8, 41, 64, 512, 128, 1, &traced, 1));
  const TilePlan& plan = traced.plan;
  const int64_t att = OpNamed(plan, "h.0.att"), qkv_grad = OpNamed(plan, "h.0.qkv.grad");
  ASSERT_GE(att, 0);
  ASSERT_GE(qkv_grad, 0);
  ASSERT_EQ(ReductionBlocks(plan, att), (2 * 4 + 1) * 2);
  ASSERT_EQ(ReductionBlocks(plan, qkv_grad), (4 * 4 + 4) * 4);
  ASSERT_EQ(ReductionBlocks(plan, OpNamed(plan, "h.0.atty")), 0);  // att and v of its columns
  for (const int64_t j : {att, qkv_grad}) {
    const TileOp& op = plan.ops[static_cast<size_t>(j)];
    const int64_t blocks = ReductionBlocks(plan, j);
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < blocks; ++k) {
        Result<TileFootprint> fp = Footprint(plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        // att: q of 32 rows and k of 32 positions in 256 columns; qkv.grad: dout and v of 32
        // positions in 128, and att's and k's or q's tile.
        EXPECT_LE(FootprintFloats(plan, *fp), 16 * 32 * 32) << op.name << " " << t << " " << k;
      }
      // Column tiles 3 (q), 20 (k) and 41 (v) of qkv.grad's 48 (C = 512: 16 tiles a part).
      const int64_t col = t % op.grid.col_tiles();
      if (j == att || col == 3 || col == 20 || col == 41) {
        ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, blocks));
      }
    }
  }
}

// The 10M GPT's shape (examples/code-gpt-10m.toml, one sequence of 256 tokens): the plan is the
// trace's operator list, and every tile of its covered forward operators (the first and last
// layer's qkv, attention projection, MLP up and down projections, the tied LM head; the first
// layer's layernorms, attention, gelu and residual adds, and ln_f) recomputes from its footprint
// to the traced bits, with a witness of at most 200 KiB of values.
// A model wider than 784 (GPT-2 medium's C = 1024 and up): the linears whose chain runs over C
// (the forward over its input's columns, dX over its output's) are narrowed into blocks of 256 of
// it, so a block reads 32 x 256 floats of each operand whatever C. At n_embd = 800 (4 blocks, the
// last short): qkv, attproj, fch and the tied head's forwards, and the input gradients of attproj
// (atty.grad) and fcproj (fch_gelu.grad); so are the layernorms' forwards and input gradients,
// their row reductions over C in blocks of 256 columns before the tile's own (9 and 13 blocks).
// Every tile's chain ends at the traced bits. At n_embd = 768 (GPT-2 small) the same operators
// are recomputed whole, as before.
TEST(TileRuleTest, AWideModelsLinearsAndLayerNormsAreNarrowedIntoBlocksOf256BitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("wide-embd", 7, 31, 64, 800, 40, 1, &traced));
  const TilePlan* plan = &traced.plan;
  const std::vector<std::string> names = {"h.0.qkv", "h.0.attproj",   "h.0.fch",
                                          "logits",  "h.0.atty.grad", "h.0.fch_gelu.grad"};
  for (const std::string& name : names) {
    const int64_t j = OpNamed(*plan, name);
    ASSERT_GE(j, 0) << name;
    const TileOp& op = plan->ops[static_cast<size_t>(j)];
    ASSERT_EQ(ReductionBlocks(*plan, j), 4) << name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < 4; ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        EXPECT_LE(FootprintFloats(*plan, *fp), 2 * 32 * 256 + 1024)
            << name << " tile " << t << " block " << k;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, 4));
    }
  }
  // The layernorms (ln1, ln2, ln_f) and their input gradients: the rows' mean and variance
  // sums in 4 column blocks each, (the backward's dmean and dnmean sums in 4 more,) then the
  // tile's columns; a block reads at most 3 x 32 x 256 floats and a weight vector tile.
  int64_t layernorms = 0;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    const TileOp& op = plan->ops[i];
    if (op.kind != TileOpKind::kTileOpLayerNorm &&
        op.kind != TileOpKind::kTileOpLayerNormInputGrad &&
        op.kind != TileOpKind::kTileOpLayerNormWeightGrad) {
      continue;
    }
    ++layernorms;
    const int64_t j = static_cast<int64_t>(i);
    // dweight: per 32-row block (3, the last of 16 rows), 8 sum blocks and 4 column chunks.
    const int64_t want = op.kind == TileOpKind::kTileOpLayerNorm            ? 9
                         : op.kind == TileOpKind::kTileOpLayerNormInputGrad ? 13
                                                                            : 3 * 12;
    ASSERT_EQ(ReductionBlocks(*plan, j), want) << op.name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < want; ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        EXPECT_LE(FootprintFloats(*plan, *fp), 3 * 32 * 256 + 1024)
            << op.name << " tile " << t << " block " << k;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, want));
    }
  }
  EXPECT_EQ(layernorms, 9);
  ModelSpec narrow = traced.trainer->task().model;
  narrow.gpt.n_embd = 768;
  Result<TilePlan> small_plan =
      PlanStepTiles(narrow, traced.trainer->state().optimizer->spec(), 2, 40);
  ASSERT_TRUE(small_plan.ok()) << small_plan.status().ToString();
  for (const std::string& name : names) {
    const int64_t j = OpNamed(*small_plan, name);
    ASSERT_GE(j, 0) << name;
    EXPECT_EQ(ReductionBlocks(*small_plan, j), 0) << name;
  }
  for (size_t i = 0; i < small_plan->ops.size(); ++i) {
    const TileOpKind k = small_plan->ops[i].kind;
    if (k == TileOpKind::kTileOpLayerNorm || k == TileOpKind::kTileOpLayerNormInputGrad) {
      EXPECT_EQ(ReductionBlocks(*small_plan, static_cast<int64_t>(i)), 0)
          << small_plan->ops[i].name;
    }
    if (k == TileOpKind::kTileOpLayerNormWeightGrad) {  // its 3 row blocks, whole rows
      EXPECT_EQ(ReductionBlocks(*small_plan, static_cast<int64_t>(i)), 3)
          << small_plan->ops[i].name;
    }
  }
}

// Above C = 1024 a layernorm's weight gradient has two tiles (kTileFlat columns, then the short
// rest): at n_embd 1100, per 32-row block (3, the last of 16 rows) 10 mean and variance sum
// blocks of 256 columns and 4 chunks of 256 of the tile's columns, the short tile's 76 columns
// all in its first chunk (its other three read nothing and pass the partial on). Every tile's
// chain ends at the traced tile bit for bit, each block within 32 x 256 floats of two operands.
TEST(TileRuleTest, ALayerNormWeightGradientAbove1024ColumnsIsNarrowedBitForBit) {
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTokenGpt("wide-ln-weight", 7, 31, 64, 1100, 40, 1, &traced));
  const TilePlan* plan = &traced.plan;
  int64_t dweights = 0;
  for (size_t i = 0; i < plan->ops.size(); ++i) {
    const TileOp& op = plan->ops[i];
    if (op.kind != TileOpKind::kTileOpLayerNormWeightGrad) continue;
    ++dweights;
    const int64_t j = static_cast<int64_t>(i);
    ASSERT_EQ(op.grid.count(), 2) << op.name;
    ASSERT_EQ(ReductionBlocks(*plan, j), 3 * (10 + 4)) << op.name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < 3 * 14; ++k) {
        Result<TileFootprint> fp = Footprint(*plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        EXPECT_LE(FootprintFloats(*plan, *fp), 2 * 32 * 256 + 1024)
            << op.name << " tile " << t << " block " << k;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectChainEndsAtTheTrace(traced, j, t, 3 * 14));
    }
  }
  EXPECT_EQ(dweights, 3);  // ln_1, ln_2, ln_f
}

TEST(TileRuleTest, GptLinearTilesRecomputeOnThe10mShape) {
  Result<TaskSpec> spec = TaskSpec::Load(
      Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/code-gpt-10m.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<TaskData> data = LoadTaskData(Env::Default(), *spec);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  spec->batch_size = 1;
  Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, std::move(*data));
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  TracedStep traced;
  ASSERT_NO_FATAL_FAILURE(TraceTrainerStep(std::move(*tr), 0, &traced));
  const Batch& batch = traced.batch;
  const OpTrace& trace = traced.trace;
  const TilePlan& plan = traced.plan;
  for (size_t j = 0; j < trace.size(); ++j) {
    ASSERT_EQ(plan.ops[j].name, trace.name(j)) << j;
    ASSERT_EQ(plan.ops[j].grid, trace.grid(j)) << trace.name(j);
  }
  const int64_t L = spec->model.gpt.n_layer - 1;
  int64_t checked = 0;
  for (const std::string& name :
       {std::string("h.0.qkv"), std::string("h.0.attproj"), std::string("h.0.fch"),
        std::string("h.0.fcproj"), "h." + std::to_string(L) + ".qkv",
        "h." + std::to_string(L) + ".fcproj", std::string("logits"), std::string("h.0.ln1"),
        std::string("h.0.residual2"), std::string("h.0.ln2"), std::string("h.0.fch_gelu"),
        std::string("h.0.residual3"), std::string("ln_f"), std::string("h.0.att"),
        std::string("h.0.atty"),
        // The clipped update (grad_clip = 1.0) and the global norm it reads.
        std::string("grad_norm.blocks"), std::string("grad_norm"),
        std::string("transformer.wte.weight"), std::string("transformer.h.0.mlp.c_fc.weight"),
        std::string("transformer.ln_f.bias"),
        // The backward: the LM head's input gradient (a chain over the 172 logits), the layernorms'
        // backward (whole rows; their weight and bias gradients, chains over the 256 rows in
        // blocks of 32), the gelu's input gradient, the linears' input gradients (ln2.grad's
        // chain over 4C = 1536 and ln1.grad's over 3C = 1152 narrowed into blocks of 256), their
        // weight and bias gradients (chains over the rows).
        std::string("ln_f.grad"), std::string("residual.grad"), std::string("h.0.fch.grad"),
        "h." + std::to_string(L) + ".fch_gelu.grad", "h." + std::to_string(L) + ".ln2.grad",
        "h." + std::to_string(L) + ".residual3.grad", std::string("h.0.atty.grad"),
        std::string("h.0.ln1.grad"), std::string("h.0.residual.grad"),
        std::string("transformer.h.0.ln_1.weight.grad"),
        "transformer.h." + std::to_string(L) + ".ln_2.bias.grad",
        std::string("transformer.ln_f.weight.grad"), std::string("transformer.ln_f.bias.grad"),
        std::string("transformer.h.0.attn.c_attn.weight.grad"),
        std::string("transformer.h.0.attn.c_attn.bias.grad"),
        std::string("transformer.h.0.attn.c_proj.weight.grad"),
        std::string("transformer.h.0.attn.c_proj.bias.grad"),
        std::string("transformer.h.0.mlp.c_fc.weight.grad"),
        std::string("transformer.h.0.mlp.c_fc.bias.grad"),
        "transformer.h." + std::to_string(L) + ".mlp.c_proj.weight.grad",
        "transformer.h." + std::to_string(L) + ".mlp.c_proj.bias.grad",
        // The token operators: encoded (the rows' tokens, wte's column strip over the 172
        // rows, wpe's rows), the token loss and its gradient (the logits rows and their targets),
        // wte's gradient (the tied head's chain over the rows, then the rows by token) and
        // wpe's (by position).
        std::string("encoded"), std::string("loss"), std::string("logits.grad"),
        std::string("transformer.wte.weight.grad"), std::string("transformer.wpe.weight.grad"),
        // The attention backward: q's, k's and v's gradients, chains over the 256 positions in
        // blocks of 32.
        std::string("h.0.qkv.grad"), "h." + std::to_string(L) + ".qkv.grad"}) {
    int64_t j = -1;
    for (size_t i = 0; i < plan.ops.size(); ++i) {
      if (plan.ops[i].name == name) j = static_cast<int64_t>(i);
    }
    ASSERT_GE(j, 0) << name;
    const TileOp& op = plan.ops[static_cast<size_t>(j)];
    ASSERT_NE(op.kind, TileOpKind::kTileOpOpaque) << name;
    int64_t footprint_floats = 0;
    // The down projection reads 4C = 1536 floats a row: narrowed into blocks of its chain; so are
    // the norm's operators.
    const int64_t blocks = ReductionBlocks(plan, j);
    // No parameter of the 10M GPT is above 8192 block partials (its largest, 1536 x 384, has
    // 576): its norm stays one block a parameter, the plan it had before the chunks.
    if (name == "grad_norm") {
      EXPECT_EQ(blocks, static_cast<int64_t>(op.sources.size()));
    }
    EXPECT_EQ(blocks > 0, name.ends_with("fcproj") || name.starts_with("grad_norm") ||
                              name.ends_with("weight.grad") || name.ends_with("bias.grad") ||
                              name.ends_with("ln1.grad") || name.ends_with("ln2.grad") ||
                              name.ends_with("qkv.grad"))
        << name;
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      for (int64_t k = 0; k < std::max<int64_t>(blocks, 1); ++k) {
        Result<TileFootprint> fp = Footprint(plan, j, t, k);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        int64_t floats = blocks > 0 ? op.grid.TileRect(t).numel() : 0;  // the partial sum
        for (const TileRef& r : fp->tiles) {
          floats += plan.ops[static_cast<size_t>(r.op)].grid.TileRect(r.tile).numel();
        }
        footprint_floats = std::max(footprint_floats, floats);
      }
      const std::vector<float> want = ExtractTile(trace.values(static_cast<size_t>(j)), op.grid, t);
      if (blocks > 0) {
        Result<std::vector<std::vector<float>>> chain = ReductionChain(plan, j, t, 0, trace, batch);
        ASSERT_TRUE(chain.ok()) << chain.status().ToString();
        ASSERT_TRUE(SameBits(chain->back(), want)) << name << " tile " << t;
      } else {
        Result<TileFootprint> fp = Footprint(plan, j, t, 0);
        ASSERT_TRUE(fp.ok()) << fp.status().ToString();
        Result<std::vector<float>> got =
            RecomputeTile(plan, j, t, 0, 0, GatherTileInputs(plan, *fp, trace, batch));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_TRUE(SameBits(*got, want)) << name << " tile " << t;
      }
      ++checked;
    }
    std::printf("[ gpt tile ] %-12s %4lld tiles, %lld blocks, footprint %7lld bytes of values\n",
                name.c_str(), static_cast<long long>(op.grid.count()),
                static_cast<long long>(blocks), static_cast<long long>(footprint_floats * 4));
    EXPECT_LE(footprint_floats * 4, 200 * 1024) << name;
  }
  EXPECT_GT(checked, 1000);
  // Every one of its 427 computed operators is covered (per layer 4 linears, 2 layernorms, att
  // and atty, a gelu and 2 residual adds, and its backward: 20; ln_f and the LM head, the head's
  // input gradient and ln_f's backward (3); the global norm's two operators and the clipped
  // update of each of the 76 parameters and of its two AdamW moments; encoded, the loss,
  // logits.grad, wte's and wpe's gradients).
  int64_t computed = 0, covered = 0;
  for (const TileOp& op : plan.ops) {
    if (op.kind == TileOpKind::kTileOpState) continue;
    ++computed;
    if (op.kind == TileOpKind::kTileOpOpaque) {
      EXPECT_FALSE(op.opaque.empty()) << op.name;
    } else {
      ++covered;
    }
  }
  EXPECT_EQ(computed, 427);
  EXPECT_EQ(covered, 6 * 11 + 6 * 20 + 2 + 1 + 3 + 2 + 3 * 76 + 5);
  EXPECT_EQ(covered, computed);
}

}  // namespace tile_rule_test
}  // namespace meshlearn::engine
