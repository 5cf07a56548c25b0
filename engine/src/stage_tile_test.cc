// A pipeline stage's step as operators (Stage::set_op_trace, PlanStageStepTiles): the tile rule
// of a unit's step applied to a stage's, whose inputs are its state and the tensors its
// neighbours sent (docs/verification.md, "Pipeline stages").
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace stage_tile_test {  // named: the tests build as unity translation units

// A GPT whose tensors cut into several tiles with short edges (C = 40, V = 37, 48 rows a
// micro-batch), 4 blocks cut into 3 stages (the first with the embeddings, the last with ln_f and
// the tied head), each step in 2 micro-batches, clipped (the norm chains across the stages).
constexpr char kStageGpt[] = R"(
[model]
kind = "gpt"
n_layer = 4
n_head = 2
n_embd = 40
block_size = 24
vocab_size = 37
)";
constexpr int64_t kBatch = 4, kSeq = 24, kMicro = 2;

ModelSpec StageGptSpec() {
  Result<ModelSpec> spec = ModelSpec::FromToml(kStageGpt, "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}

Batch StageBatch(const Model& m, int64_t step) {
  Batch b = m.EmptyBatch(kBatch, kSeq);
  Rng rng(500 + static_cast<uint64_t>(step));
  for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.Uniform(37));
  for (int32_t& t : b.targets) t = static_cast<int32_t>(rng.Uniform(37));
  return b;
}

struct StagePipeline {
  PipelineCut cut;
  std::vector<std::unique_ptr<Stage>> stages;
};

// The stages of `spec` cut at `bounds`, each initialised from the pipeline's `seed`.
StagePipeline MakeStagePipeline(const ModelSpec& spec, const OptimizerSpec& optimizer,
                                std::vector<int64_t> bounds, int64_t micro_batches, uint64_t seed) {
  StagePipeline p;
  Result<PipelineCut> cut = MakeCut(spec, std::move(bounds));
  CHECK(cut.ok()) << cut.status().ToString();
  p.cut = *cut;
  for (int s = 0; s < p.cut.stages(); ++s) {
    Result<std::unique_ptr<Stage>> st = Stage::Create(spec, optimizer, p.cut, s, micro_batches);
    CHECK(st.ok()) << st.status().ToString();
    p.stages.push_back(std::move(*st));
  }
  InitPipeline(p.stages, seed);
  return p;
}

// The GPT's: three stages of its 4 cut layers.
StagePipeline MakeStagePipeline() {
  return MakeStagePipeline(StageGptSpec(), testing::ClippedAdamW(), {0, 1, 3, 4}, kMicro, 3);
}

// Stage s's operator of `name`, or -1.
int64_t OpNamed(const TilePlan& plan, const std::string& name) {
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (plan.ops[j].name == name) return static_cast<int64_t>(j);
  }
  return -1;
}

// One traced pipeline step (the second: AdamW's moments nonzero) of the 3 stages; every stage's
// plan follows its trace operator for operator, and every tile of every computed operator
// recomputes from its footprint to the traced bits (the reference kernels' order against the
// fast kernels'). What the stages received and sent are operators of the traces, the traced
// output state is the state the stage ends with, and tracing changes nothing.
TEST(StageTileTest, EveryTileOfEveryStageRecomputesBitForBit) {
  StagePipeline traced = MakeStagePipeline();
  StagePipeline plain = MakeStagePipeline();
  const Batch warm = StageBatch(*traced.stages[0]->state().model, 0);
  RunPipelineStep(traced.stages, warm, 11);
  RunPipelineStep(plain.stages, warm, 11);
  const Batch batch = StageBatch(*traced.stages[0]->state().model, 1);
  const int64_t step = traced.stages[0]->state().step;
  std::vector<OpTrace> traces(traced.stages.size());
  for (size_t s = 0; s < traced.stages.size(); ++s) {
    traces[s].set_keep_values(true);
    traced.stages[s]->set_op_trace(&traces[s]);
  }
  const PipelineStepResult r = RunPipelineStep(traced.stages, batch, 11);
  for (const std::unique_ptr<Stage>& s : traced.stages) s->set_op_trace(nullptr);
  const PipelineStepResult untraced = RunPipelineStep(plain.stages, batch, 11);
  EXPECT_EQ(r.grad_norm, untraced.grad_norm);
  EXPECT_GT(r.grad_norm, 0.05f) << "the step must clip";

  Result<TilePlan> whole =
      PlanStepTiles(StageGptSpec(), testing::ClippedAdamW(), kBatch, kSeq, kMicro);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  std::set<TileOpKind> whole_kinds, stage_kinds;
  for (const TileOp& op : whole->ops) whole_kinds.insert(op.kind);
  int64_t checked = 0;
  for (size_t s = 0; s < traced.stages.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    Stage& stage = *traced.stages[s];
    const OpTrace& trace = traces[s];
    EXPECT_EQ(StateHash(stage.state()), StateHash(plain.stages[s]->state()));
    Result<TilePlan> plan =
        PlanStageStepTiles(StageGptSpec(), testing::ClippedAdamW(),
                           traced.cut.part(static_cast<int>(s)), kBatch, kSeq, kMicro);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->ops.size(), trace.size());
    for (size_t j = 0; j < trace.size(); ++j) {
      ASSERT_EQ(plan->ops[j].name, trace.name(j)) << j;
      ASSERT_EQ(plan->ops[j].grid, trace.grid(j)) << trace.name(j);
    }
    // The step's output state is its last operators: the stage's state after the step.
    const std::vector<Param>& params = stage.params();
    for (const Param& p : params) {
      const int64_t j = OpNamed(*plan, p.name);
      ASSERT_GE(j, 0) << p.name;
      EXPECT_TRUE(testing::SameBits(trace.values(static_cast<size_t>(j)),
                                    {p.value.data(), static_cast<size_t>(p.value.size())}))
          << p.name;
    }
    // Every tensor the stage received is an input operator of its step ("recv.<what>", the
    // values whose TensorHash the sender's transfer carries); every one it sent is a computed
    // operator.
    int64_t received = 0;
    for (const Transfer& t : r.transfers) {
      if (t.step != step) continue;
      const std::string mb = t.micro_batch >= 0 ? "mb" + std::to_string(t.micro_batch) + "." : "";
      std::string recv, sent;
      switch (t.kind) {
        case TransferKind::kTransferActivation:
          recv = mb + "recv.activation";
          sent = mb + "h." + std::to_string(traced.cut.bounds[s + 1] - 1) + ".residual3";
          break;
        case TransferKind::kTransferActivationGrad:
          recv = mb + "recv.activation_grad";
          sent = mb + "h." + std::to_string(traced.cut.bounds[s]) + ".residual.grad";
          break;
        case TransferKind::kTransferTiedHeadGrad:
          recv = "recv.tied_head_grad";
          sent = "mb" + std::to_string(kMicro - 1) + "." + kGptWteName + ".head.grad";
          break;
        case TransferKind::kTransferGradSquares:
          recv = "recv.grad_squares";
          sent = "grad_squares";
          break;
        case TransferKind::kTransferTiedWeight:
          continue;  // the next step's copy (this step's is "recv.tied_weight", checked below)
      }
      const std::string& name = t.to == static_cast<int>(s) ? recv : sent;
      if (t.to != static_cast<int>(s) && t.from != static_cast<int>(s)) continue;
      const int64_t j = OpNamed(*plan, name);
      ASSERT_GE(j, 0) << name;
      EXPECT_EQ(plan->ops[static_cast<size_t>(j)].received, t.to == static_cast<int>(s)) << name;
      EXPECT_EQ(TensorHash(trace.values(static_cast<size_t>(j))), t.hash) << name;
      if (t.to == static_cast<int>(s)) ++received;
    }
    // Activations (s > 0) and gradients (s < S-1) of each micro-batch; the head's gradient (stage
    // 0); the running sum of squares (s > 0).
    const bool first = s == 0, last = s + 1 == traced.stages.size();
    EXPECT_EQ(received, (first ? 0 : kMicro + 1) + (last ? 0 : kMicro) + (first ? 1 : 0));
    if (s + 1 == traced.stages.size()) {
      EXPECT_GE(OpNamed(*plan, "recv.tied_weight"), 0);
    } else {
      const int64_t total = OpNamed(*plan, "recv.grad_total");
      ASSERT_GE(total, 0);
      EXPECT_EQ(std::sqrt(trace.values(static_cast<size_t>(total))[0]), r.grad_norm);
    }
    // Every tile of every operator the stage computed.
    for (size_t j = 0; j < trace.size(); ++j) {
      const TileOp& op = plan->ops[j];
      if (op.kind == TileOpKind::kTileOpState) continue;
      ASSERT_NE(op.kind, TileOpKind::kTileOpOpaque) << op.name;
      stage_kinds.insert(op.kind);
      const int64_t jj = static_cast<int64_t>(j);
      for (int64_t t = 0; t < op.grid.count(); ++t) {
        const std::vector<float> want = ExtractTile(trace.values(j), op.grid, t);
        if (ReductionBlocks(*plan, jj) > 0) {
          Result<std::vector<std::vector<float>>> chain =
              ReductionChain(*plan, jj, t, step, trace, batch);
          ASSERT_TRUE(chain.ok()) << chain.status().ToString();
          ASSERT_TRUE(testing::SameBits(chain->back(), want)) << op.name << " tile " << t;
        } else {
          Result<TileFootprint> fp = Footprint(*plan, jj, t, 0);
          ASSERT_TRUE(fp.ok()) << fp.status().ToString();
          Result<std::vector<float>> got =
              RecomputeTile(*plan, jj, t, 0, step, GatherTileInputs(*plan, *fp, trace, batch));
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          ASSERT_TRUE(testing::SameBits(*got, want)) << op.name << " tile " << t;
        }
        ++checked;
      }
    }
  }
  // The stages together compute every kind of operator the whole model's step does.
  whole_kinds.erase(TileOpKind::kTileOpState);
  EXPECT_EQ(stage_kinds, whole_kinds);
  EXPECT_GT(checked, 1000);
  RecordProperty("tiles_checked", static_cast<int>(checked));
}

// A stage's received tensors are inputs of its step: a changed tile of one changes the tiles
// that read it, and the stage's norm chain starts from the running sum it received.
TEST(StageTileTest, AStagesOperatorsDependOnWhatItReceived) {
  StagePipeline p = MakeStagePipeline();
  const Batch batch = StageBatch(*p.stages[0]->state().model, 0);
  OpTrace trace;
  trace.set_keep_values(true);
  p.stages[1]->set_op_trace(&trace);
  RunPipelineStep(p.stages, batch, 11);
  p.stages[1]->set_op_trace(nullptr);
  Result<TilePlan> plan = PlanStageStepTiles(StageGptSpec(), testing::ClippedAdamW(), p.cut.part(1),
                                             kBatch, kSeq, kMicro);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->ops.size(), trace.size());
  // The first block's ln1 reads the activation received from stage 0.
  const int64_t ln1 = OpNamed(*plan, "mb1.h.1.ln1");
  ASSERT_GE(ln1, 0);
  const int64_t act = plan->ops[static_cast<size_t>(ln1)].x;
  EXPECT_EQ(plan->ops[static_cast<size_t>(act)].name, "mb1.recv.activation");
  EXPECT_TRUE(plan->ops[static_cast<size_t>(act)].received);
  Result<TileFootprint> fp = Footprint(*plan, ln1, 0, 0);
  ASSERT_TRUE(fp.ok()) << fp.status().ToString();
  TileInputs in = GatherTileInputs(*plan, *fp, trace, batch);
  Result<std::vector<float>> honest = RecomputeTile(*plan, ln1, 0, 0, 0, in);
  ASSERT_TRUE(honest.ok()) << honest.status().ToString();
  for (size_t i = 0; i < fp->tiles.size(); ++i) {
    if (fp->tiles[i].op == act) in.tiles[i][0] += 0.5f;
  }
  Result<std::vector<float>> changed = RecomputeTile(*plan, ln1, 0, 0, 0, in);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_FALSE(testing::SameBits(*honest, *changed));
  // grad_squares = the received running sum + the stage's squares, without a square root.
  const int64_t sq = OpNamed(*plan, "grad_squares");
  ASSERT_GE(sq, 0);
  const TileOp& op = plan->ops[static_cast<size_t>(sq)];
  EXPECT_TRUE(op.squares);
  EXPECT_EQ(plan->ops[static_cast<size_t>(op.v)].name, "recv.grad_squares");
  Result<TileFootprint> first = Footprint(*plan, sq, 0, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  TileInputs sin = GatherTileInputs(*plan, *first, trace, batch);
  Result<std::vector<float>> s0 = RecomputeTile(*plan, sq, 0, 0, 0, sin);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  for (size_t i = 0; i < first->tiles.size(); ++i) {
    if (first->tiles[i].op == op.v) sin.tiles[i][0] += 1.0f;
  }
  Result<std::vector<float>> s1 = RecomputeTile(*plan, sq, 0, 0, 0, sin);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  EXPECT_FALSE(testing::SameBits(*s0, *s1));
}

// ---- Sequential models' stages.

// Every other layer kind an MLP stage holds: dropout (its mask drawn from the model's layer index
// and the micro-batch), layernorm, gelu.
constexpr char kStageMixedMlp[] = R"(
[model]
input = [40]
[[model.layers]]
kind = "linear"
out = 48
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "dropout"
p = 0.25
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "linear"
out = 36
[[model.layers]]
kind = "gelu"
[[model.layers]]
kind = "linear"
out = 5
)";

constexpr uint64_t kSeqDropoutSeed = 23;

ModelSpec SeqSpec(const char* toml) {
  Result<ModelSpec> spec = ModelSpec::FromToml(toml, "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}

// The model of an example task file (examples/NAME): the fashion MLP and CNN as users train them.
ModelSpec ExampleSpec(const std::string& name) {
  Result<TaskSpec> task =
      TaskSpec::Load(Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/" + name);
  CHECK(task.ok()) << task.status().ToString();
  return task->model;
}

Batch SeqBatch(const Model& m, int64_t size, int64_t step) {
  Batch b = m.EmptyBatch(size);
  Rng rng(700 + static_cast<uint64_t>(step));
  for (float& x : b.inputs.vec()) x = static_cast<float>(rng.UniformDouble() * 2.0 - 1.0);
  for (int32_t& t : b.targets) {
    t = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(m.NumOutputs())));
  }
  return b;
}

// What a sequential stage sends: the output of its last layer that is not a flatten (a flatten
// passes its input on), and the input gradient of its first layer that records one (a flatten,
// or a dropout that keeps everything, passes the gradient on unrecorded); a stage with no such
// layer passes on what it received.
std::string SeqSentActivation(const ModelSpec& spec, ModelPart part) {
  for (int64_t i = part.end; i-- > part.begin;) {
    if (spec.layers[static_cast<size_t>(i)].kind != "flatten")
      return "layers." + std::to_string(i) + ".out";
  }
  return "recv.activation";
}
std::string SeqSentGrad(const ModelSpec& spec, ModelPart part) {
  for (int64_t i = part.begin; i < part.end; ++i) {
    const LayerSpec& l = spec.layers[static_cast<size_t>(i)];
    if (l.kind != "flatten" && !(l.kind == "dropout" && !(l.p > 0)))
      return "layers." + std::to_string(i) + ".in.grad";
  }
  return "recv.activation_grad";
}

// Tiles 0, the middle one and the last of an operator (none of an empty one: a stage without
// parameters has no gradient partials).
std::vector<int64_t> SampledTiles(const TileGrid& grid) {
  if (grid.count() == 0) return {};
  std::set<int64_t> t = {0, grid.count() / 2, grid.count() - 1};
  return {t.begin(), t.end()};
}

// The contract of a sequential model's stage plan (PlanStageStepTiles), as the GPT's test above
// checks it: one traced pipeline step (the second: the optimizer's state nonzero) of `bounds`;
// every stage's plan follows its trace operator for operator (names and grids), its output state
// is the state the stage ends with, what it received are input operators and what it sent
// computed ones (by TensorHash), and the first, middle and last tiles of every computed operator
// recompute from their footprints to the traced bits (the reference kernels' order against the
// fast kernels'). Returns the tiles checked.
int64_t ExpectSeqStagesRecompute(const ModelSpec& spec, const OptimizerSpec& optimizer,
                                 const std::vector<int64_t>& bounds, int64_t batch_size,
                                 int64_t micro_batches) {
  StagePipeline traced = MakeStagePipeline(spec, optimizer, bounds, micro_batches, 5);
  StagePipeline plain = MakeStagePipeline(spec, optimizer, bounds, micro_batches, 5);
  const Model& model = *traced.stages[0]->state().model;
  const Batch warm = SeqBatch(model, batch_size, 0);
  RunPipelineStep(traced.stages, warm, kSeqDropoutSeed);
  RunPipelineStep(plain.stages, warm, kSeqDropoutSeed);
  const Batch batch = SeqBatch(model, batch_size, 1);
  const int64_t step = traced.stages[0]->state().step;
  std::vector<OpTrace> traces(traced.stages.size());
  for (size_t s = 0; s < traced.stages.size(); ++s) {
    traces[s].set_keep_values(true);
    traced.stages[s]->set_op_trace(&traces[s]);
  }
  const PipelineStepResult r = RunPipelineStep(traced.stages, batch, kSeqDropoutSeed);
  for (const std::unique_ptr<Stage>& s : traced.stages) s->set_op_trace(nullptr);
  const PipelineStepResult untraced = RunPipelineStep(plain.stages, batch, kSeqDropoutSeed);
  EXPECT_EQ(r.grad_norm, untraced.grad_norm);
  const bool clipped = optimizer.grad_clip > 0;
  if (clipped) {
    EXPECT_GT(r.grad_norm, optimizer.grad_clip) << "the step must clip";
  }

  Result<TilePlan> whole = PlanStepTiles(spec, optimizer, batch_size, 0, micro_batches);
  EXPECT_TRUE(whole.ok()) << whole.status().ToString();
  if (!whole.ok()) return 0;
  std::set<TileOpKind> whole_kinds, stage_kinds;
  for (const TileOp& op : whole->ops) whole_kinds.insert(op.kind);
  int64_t checked = 0;
  for (size_t s = 0; s < traced.stages.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    Stage& stage = *traced.stages[s];
    const OpTrace& trace = traces[s];
    const ModelPart part = traced.cut.part(static_cast<int>(s));
    EXPECT_EQ(StateHash(stage.state()), StateHash(plain.stages[s]->state()));
    Result<TilePlan> plan = PlanStageStepTiles(spec, optimizer, part, batch_size, 0, micro_batches);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    if (!plan.ok()) return checked;
    plan->dropout_seed = kSeqDropoutSeed;
    EXPECT_EQ(plan->ops.size(), trace.size());
    if (plan->ops.size() != trace.size()) return checked;
    for (size_t j = 0; j < trace.size(); ++j) {
      EXPECT_EQ(plan->ops[j].name, trace.name(j)) << j;
      EXPECT_EQ(plan->ops[j].grid, trace.grid(j)) << trace.name(j);
      if (plan->ops[j].name != trace.name(j) || !(plan->ops[j].grid == trace.grid(j)))
        return checked;
    }
    for (const Param& p : stage.params()) {
      const int64_t j = OpNamed(*plan, p.name);
      EXPECT_GE(j, 0) << p.name;
      if (j < 0) continue;
      EXPECT_TRUE(testing::SameBits(trace.values(static_cast<size_t>(j)),
                                    {p.value.data(), static_cast<size_t>(p.value.size())}))
          << p.name;
    }
    int64_t received = 0;
    for (const Transfer& t : r.transfers) {
      if (t.step != step) continue;
      if (t.to != static_cast<int>(s) && t.from != static_cast<int>(s)) continue;
      const std::string mb =
          t.micro_batch >= 0 && micro_batches > 1 ? "mb" + std::to_string(t.micro_batch) + "." : "";
      std::string recv, sent;
      switch (t.kind) {
        case TransferKind::kTransferActivation:
          recv = mb + "recv.activation";
          sent = mb + SeqSentActivation(spec, part);
          break;
        case TransferKind::kTransferActivationGrad:
          recv = mb + "recv.activation_grad";
          sent = mb + SeqSentGrad(spec, part);
          break;
        case TransferKind::kTransferGradSquares:
          if (!clipped) continue;  // an unclipped step's sum is not an operator: no norm
          recv = "recv.grad_squares";
          sent = "grad_squares";
          break;
        default:
          ADD_FAILURE() << "a sequential pipeline sent " << TransferKindName(t.kind);
          continue;
      }
      const bool to_here = t.to == static_cast<int>(s);
      const std::string& name = to_here ? recv : sent;
      const int64_t j = OpNamed(*plan, name);
      EXPECT_GE(j, 0) << name;
      if (j < 0) continue;
      // A sent tensor is computed, but a stage with nothing to record passes on a received one.
      EXPECT_EQ(plan->ops[static_cast<size_t>(j)].received,
                to_here || name.find("recv.") != name.npos)
          << name;
      EXPECT_EQ(TensorHash(trace.values(static_cast<size_t>(j))), t.hash) << name;
      if (to_here) ++received;
    }
    const bool first = s == 0, last = s + 1 == traced.stages.size();
    EXPECT_EQ(received,
              (first ? 0 : micro_batches + (clipped ? 1 : 0)) + (last ? 0 : micro_batches));
    if (clipped && !last) {
      const int64_t total = OpNamed(*plan, "recv.grad_total");
      EXPECT_GE(total, 0);
      if (total >= 0) {
        EXPECT_EQ(std::sqrt(trace.values(static_cast<size_t>(total))[0]), r.grad_norm);
      }
    }
    for (size_t j = 0; j < trace.size(); ++j) {
      const TileOp& op = plan->ops[j];
      if (op.kind == TileOpKind::kTileOpState) continue;
      EXPECT_NE(op.kind, TileOpKind::kTileOpOpaque) << op.name;
      stage_kinds.insert(op.kind);
      const int64_t jj = static_cast<int64_t>(j);
      for (int64_t t : SampledTiles(op.grid)) {
        const std::vector<float> want = ExtractTile(trace.values(j), op.grid, t);
        std::vector<float> got;
        if (ReductionBlocks(*plan, jj) > 0) {
          Result<std::vector<std::vector<float>>> chain =
              ReductionChain(*plan, jj, t, step, trace, batch);
          EXPECT_TRUE(chain.ok()) << op.name << ": " << chain.status().ToString();
          if (chain.ok()) got = chain->back();
        } else {
          Result<TileFootprint> fp = Footprint(*plan, jj, t, 0);
          EXPECT_TRUE(fp.ok()) << op.name << ": " << fp.status().ToString();
          if (!fp.ok()) continue;
          Result<std::vector<float>> one =
              RecomputeTile(*plan, jj, t, 0, step, GatherTileInputs(*plan, *fp, trace, batch));
          EXPECT_TRUE(one.ok()) << op.name << ": " << one.status().ToString();
          if (one.ok()) got = *one;
        }
        EXPECT_TRUE(testing::SameBits(got, want)) << op.name << " tile " << t;
        ++checked;
      }
    }
  }
  // The stages together compute every kind of operator the whole model's step does.
  whole_kinds.erase(TileOpKind::kTileOpState);
  EXPECT_EQ(stage_kinds, whole_kinds);
  return checked;
}

// The fashion MLP in 3 stages, 2 micro-batches, clipped: a stage that starts with an activation
// (its input gradient reads the activations it received) and one that ends with a linear.
TEST(StageTileTest, FashionMlpStagesRecomputeBitForBit) {
  const int64_t checked = ExpectSeqStagesRecompute(ExampleSpec("fashion-mlp.toml"),
                                                   testing::ClippedAdamW(), {0, 2, 3, 5},
                                                   /*batch_size=*/12, /*micro_batches=*/2);
  EXPECT_GT(checked, 100);
  RecordProperty("tiles_checked", static_cast<int>(checked));
}

// Dropout, layernorm and gelu in stages, unclipped SGD with momentum (no norm operators): a later
// stage that starts with the dropout (its mask drawn from the model's layer index, not the
// stage's) and sends back the dropout's input gradient.
TEST(StageTileTest, MixedMlpStagesRecomputeBitForBit) {
  OptimizerSpec sgd;
  sgd.kind = "sgd";
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  const int64_t checked = ExpectSeqStagesRecompute(SeqSpec(kStageMixedMlp), sgd, {0, 2, 5, 7},
                                                   /*batch_size=*/8, /*micro_batches=*/2);
  EXPECT_GT(checked, 50);
}

// A small CNN in 5 stages of one layer each but the first (conv relu | maxpool | flatten | linear
// as [conv] [relu] [maxpool] [flatten] [linear]): stages without parameters (their norm chain adds
// nothing; the relu's and the pool's input gradients are what they send back) and one of only the
// flatten, which records no operator and sends on what it received.
TEST(StageTileTest, OneLayerStagesWithoutParametersRecomputeBitForBit) {
  constexpr char kSmallCnn[] = R"(
[model]
input = [1, 8, 8]
[[model.layers]]
kind = "conv2d"
out = 4
kernel = 3
pad = 1
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 5
)";
  const int64_t checked =
      ExpectSeqStagesRecompute(SeqSpec(kSmallCnn), testing::ClippedAdamW(), {0, 1, 2, 3, 4, 5},
                               /*batch_size=*/40, /*micro_batches=*/2);
  EXPECT_GT(checked, 50);
}

// The fashion CNN in 3 stages: a stage that starts with a convolution of the received pooled
// activations, and one that starts with the flatten (what it sends back is its linear's input
// gradient, viewed as the received activations' rows).
TEST(StageTileTest, FashionCnnStagesRecomputeBitForBit) {
  const int64_t checked = ExpectSeqStagesRecompute(ExampleSpec("fashion-cnn.toml"),
                                                   testing::ClippedAdamW(), {0, 3, 6, 10},
                                                   /*batch_size=*/4, /*micro_batches=*/1);
  EXPECT_GT(checked, 100);
}

}  // namespace stage_tile_test
}  // namespace meshlearn::engine
