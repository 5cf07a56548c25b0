// What a stage signs for a tensor it sends is provable tile by tile: its record carries the
// tensor's tiled root in the grid the receiver's stage tile plan gives it (engine/tile_rule.h,
// PlanStageStepTiles), so one tile of a received tensor is proven alone against its sender's
// signature (protocol/stage_transfer.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/ledger/referee_tile.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/stage_step.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "pipeline_test_util.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace stage_tile_test {  // named: the tests build as unity translation units

using protocol::StageTensorKind;
using protocol::StageTransfer;

engine::ModelSpec StageGptSpec() {
  Result<engine::ModelSpec> spec = engine::ModelSpec::FromToml(
      "[model]\nkind = \"gpt\"\nn_layer = 4\nn_head = 2\nn_embd = 40\nblock_size = 24\n"
      "vocab_size = 37\n",
      "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}

engine::OptimizerSpec StageOptimizer() {
  engine::OptimizerSpec o;
  o.kind = "adamw";
  o.lr = 1e-2;
  o.grad_clip = 0.05;
  return o;
}

int64_t OpNamed(const engine::TilePlan& plan, const std::string& name) {
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    if (plan.ops[j].name == name) return static_cast<int64_t>(j);
  }
  return -1;
}

// One pipeline step (the first) of a GPT cut into stages, one stage traced (values kept): its plan,
// trace, state hash before the step, and the step's batch (random tokens).
struct TracedStage {
  engine::ModelSpec spec = StageGptSpec();
  engine::OptimizerSpec optimizer = StageOptimizer();
  engine::PipelineCut cut;
  engine::Batch batch;
  Hash256 state_before;
  engine::OpTrace trace;
  engine::TilePlan plan;
};
void TraceStage(int stage, int64_t batch, int64_t seq_len, int64_t micro_batches,
                uint64_t batch_seed, TracedStage* out) {
  std::vector<std::unique_ptr<engine::Stage>> stages;
  for (int s = 0; s < out->cut.stages(); ++s) {
    Result<std::unique_ptr<engine::Stage>> st =
        engine::Stage::Create(out->spec, out->optimizer, out->cut, s, micro_batches);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    stages.push_back(std::move(*st));
  }
  engine::InitPipeline(stages, 3);
  out->batch = stages[0]->state().model->EmptyBatch(batch, seq_len);
  Rng rng(batch_seed);
  // A GPT's tokens and targets of its vocabulary; a sequential model's examples and classes.
  const auto classes =
      static_cast<uint64_t>(out->spec.kind == "gpt" ? out->spec.gpt.vocab_size
                                                    : stages.back()->state().model->NumOutputs());
  for (int32_t& t : out->batch.tokens) t = static_cast<int32_t>(rng.Uniform(classes));
  for (int32_t& t : out->batch.targets) t = static_cast<int32_t>(rng.Uniform(classes));
  for (float& x : out->batch.inputs.vec()) x = static_cast<float>(rng.UniformDouble() * 2 - 1);
  out->state_before = engine::StateHash(stages[stage]->state());
  out->trace.set_keep_values(true);
  stages[stage]->set_op_trace(&out->trace);
  engine::RunPipelineStep(stages, out->batch, 5);
  stages[stage]->set_op_trace(nullptr);
  Result<engine::TilePlan> plan = engine::PlanStageStepTiles(
      out->spec, out->optimizer, out->cut.part(stage), batch, seq_len, micro_batches);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->ops.size(), out->trace.size());
  out->plan = std::move(*plan);
}

// The small GPT in 3 stages of 2 micro-batches, the middle stage traced.
void TraceMiddleStage(uint64_t batch_seed, TracedStage* out) {
  Result<engine::PipelineCut> cut = engine::MakeCut(out->spec, {0, 1, 3, 4});
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  out->cut = *cut;
  TraceStage(1, 4, 24, 2, batch_seed, out);
}

// Rules the last tile of every computed operator of a traced stage step (at its reduction's last
// block, or its first: `first_block`) from BuildTileWitness's footprint witness: the ruling is the
// honest tile, and a witness whose first input tile was changed is refused. Operators reading the
// task's token pages (the loss and its gradient) are left out: they are proven against pages as
// in a unit's step, and the witness here has none. Adds the operators ruled and the largest
// encoded witness.
void RuleEveryOperator(const TracedStage& traced, bool first_block, int64_t* ruled,
                       size_t* largest) {
  const engine::OpTrace& trace = traced.trace;
  const engine::TilePlan* plan = &traced.plan;
  const engine::Batch& batch = traced.batch;
  const Hash256& state_before = traced.state_before;
  TileRuleContext ctx;
  ctx.plan = *plan;
  // C_j = OperatorChainHash(C_{j-1}, out_j) from the stage's state hash, as the game chains it.
  std::vector<Hash256> chain{state_before};
  for (size_t j = 0; j < trace.size(); ++j) {
    chain.push_back(protocol::OperatorChainHash(chain.back(), trace.hash(j)));
  }
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    const engine::TileOp& op = plan->ops[j];
    if (op.kind == engine::TileOpKind::kTileOpState || op.kind == engine::TileOpKind::kTileOpLoss ||
        op.kind == engine::TileOpKind::kTileOpLossGrad) {
      continue;
    }
    SCOPED_TRACE(op.name);
    const int64_t jj = static_cast<int64_t>(j);
    const int64_t t = op.grid.count() - 1;  // the last tile: cut short at the edges
    const int64_t blocks = engine::ReductionBlocks(*plan, jj);
    const int64_t block = first_block ? 0 : std::max<int64_t>(blocks - 1, 0);
    protocol::RefereeTask task;
    task.whole_step = false;
    task.step = 1;  // 1-based: the step from the state after step 0 (the pipeline's first)
    task.operator_index = static_cast<uint32_t>(j + 1);
    task.input = chain[j];
    task.tile = true;
    task.tile_index = static_cast<uint64_t>(t);
    task.tile_count = static_cast<uint64_t>(op.grid.count());
    task.reduction_blocks = static_cast<uint32_t>(blocks);
    task.block = static_cast<uint32_t>(block);
    task.state_input = state_before;
    // The ruling is the tile itself (a leaf of its operator's root) after the last block, else
    // the partial sum S_{block+1} the block ends on (RuleTile).
    Hash256 honest =
        MerkleLeafHash(engine::TileHash(engine::ExtractTile(trace.values(j), op.grid, t)));
    if (blocks > 0) {
      Result<std::vector<std::vector<float>>> partials =
          engine::ReductionChain(*plan, jj, t, 0, trace, batch);
      ASSERT_TRUE(partials.ok()) << partials.status().ToString();
      task.partial_input = engine::TileHash((*partials)[static_cast<size_t>(block)]);
      if (block + 1 < blocks) {
        honest = engine::TileHash((*partials)[static_cast<size_t>(block + 1)]);
      }
    }
    task.defender_output = honest;
    task.challenger_output = Blake2b("a lie");
    Result<TileWitness> w = BuildTileWitness(ctx, task, trace, batch, nullptr, nullptr, nullptr);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    *largest = std::max(*largest, EncodeTileWitness(*w).size());
    Result<Hash256> ruling = RuleTile(ctx, task, *w);
    ASSERT_TRUE(ruling.ok()) << ruling.status().ToString();
    EXPECT_EQ(*ruling, honest);
    if (!w->tiles.empty()) {
      TileWitness bad = *w;
      bad.tiles[0].values[0] += 1.0f;
      EXPECT_FALSE(RuleTile(ctx, task, bad).ok());
    }
    ++*ruled;
  }
}

// A traced pipeline step of the GPT in 3 stages (2 micro-batches): stage 1's received tensors,
// signed as their senders sign them (SignStageTensor in rows of StageTileCols), carry the tiled
// roots stage 1's trace records for them; a tile of one is proven against the signed root, and a
// wrong proof or a wrong tile is not. The record's tiled root is signed and encoded.
TEST(StageTileCommitTest, AReceivedTileIsProvenAgainstItsSendersSignedTiledRoot) {
  TracedStage traced;
  ASSERT_NO_FATAL_FAILURE(TraceMiddleStage(8, &traced));
  const engine::ModelSpec& spec = traced.spec;
  const engine::OpTrace& trace = traced.trace;
  const engine::TilePlan* plan = &traced.plan;
  StageContext ctx{protocol::TaskId(Blake2b("stage tiles")), 0, 0, {}, StageTileCols(spec)};
  EXPECT_EQ(ctx.tile_cols, 40u);
  std::vector<KeyPair> keys;
  for (uint8_t s = 0; s < 3; ++s) {
    keys.push_back(testing::TestKey(static_cast<uint8_t>(40 + s)));
    ctx.chain.push_back(keys.back().public_key());
  }
  struct Received {
    const char* op;
    StageTensorKind kind;
    uint32_t from;
    int64_t micro_batch;
  };
  int64_t proven = 0;
  for (const Received& r :
       {Received{"mb0.recv.activation", StageTensorKind::kStageTensorActivation, 0, 0},
        Received{"mb1.recv.activation_grad", StageTensorKind::kStageTensorActivationGrad, 2, 1},
        Received{"recv.grad_squares", StageTensorKind::kStageTensorGradSquares, 0, -1}}) {
    SCOPED_TRACE(r.op);
    const int64_t j = OpNamed(*plan, r.op);
    ASSERT_GE(j, 0);
    const engine::TileOp& op = plan->ops[static_cast<size_t>(j)];
    ASSERT_TRUE(op.received);
    std::span<const float> values = trace.values(static_cast<size_t>(j));
    const StageTransfer record = SignStageTensor(ctx.Key(r.kind, r.from, 1, 0, r.micro_batch),
                                                 values, keys[r.from], ctx.tile_cols);
    ASSERT_TRUE(CheckStageTensor(record, values, ctx).ok());
    // The signed tiled root is the root the receiver's trace commits the input to.
    EXPECT_EQ(record.tiles, trace.hash(static_cast<size_t>(j)));
    EXPECT_EQ(engine::StageTensorGrid(static_cast<int64_t>(values.size()), ctx.tile_cols), op.grid);
    // Every tile of it is proven alone against the signed root; a tile proven at another index,
    // or with a changed value, is not.
    const std::vector<Hash256> hashes = engine::TileHashes(values, op.grid);
    for (int64_t t = 0; t < op.grid.count(); ++t) {
      const std::vector<float> tile = engine::ExtractTile(values, op.grid, t);
      const MerkleProof proof = MerkleProve(hashes, static_cast<uint64_t>(t));
      EXPECT_TRUE(MerkleVerify(record.tiles, engine::TileHash(tile), proof)) << t;
      if (op.grid.count() > 1) {
        const MerkleProof other =
            MerkleProve(hashes, static_cast<uint64_t>((t + 1) % op.grid.count()));
        EXPECT_FALSE(MerkleVerify(record.tiles, engine::TileHash(tile), other)) << t;
      }
      std::vector<float> changed = tile;
      changed[0] += 1.0f;
      EXPECT_FALSE(MerkleVerify(record.tiles, engine::TileHash(changed), proof)) << t;
      ++proven;
    }
    // The tiled root travels in the record and is signed.
    Result<StageTransfer> decoded = protocol::DecodeStageTransfer(EncodeStageTransfer(record));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, record);
    EXPECT_EQ(EncodeStageTransfer(record).size(), protocol::kStageTransferWireBytes);
    StageTransfer altered = record;
    altered.tiles = Blake2b("another root");
    EXPECT_FALSE(protocol::VerifyStageTransfer(altered, ctx.chain[r.from]).ok());
  }
  EXPECT_EQ(proven, 2 * 2 * 2 + 1);  // 48 x 40: 2 x 2 tiles each; the sum's one
}

// A receiver refuses a record whose tiled root is not its tensor's, or that is tiled in rows of
// another width than the replica's (its tiles would not be the stage tile plan's), naming why.
TEST(StageTileCommitTest, ARecordWithAWrongTiledRootOrWidthIsRefused) {
  StageContext ctx{protocol::TaskId(Blake2b("stage tiles")), 0, 0, {}, 40};
  const KeyPair sender = testing::TestKey(50);
  ctx.chain = {sender.public_key(), testing::TestKey(51).public_key()};
  std::vector<float> values(2 * 40 * 40);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.25f;
  const protocol::StageTensorKey key = ctx.Key(StageTensorKind::kStageTensorActivation, 0, 1, 0, 0);
  const StageTransfer good = SignStageTensor(key, values, sender, 40);
  ASSERT_TRUE(CheckStageTensor(good, values, ctx).ok());
  // Signed with the tensor's hash but another tensor's tiled root.
  std::vector<float> other = values;
  other[5] = -1.0f;
  const StageTransfer forged = protocol::SignStageTransfer(
      key, engine::TensorHash(values), SignStageTensor(key, other, sender, 40).tiles, 40,
      4 * values.size(), sender);
  Status st = CheckStageTensor(forged, values, ctx);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tiled root"), std::string::npos) << st.ToString();
  // Tiled in rows of another width.
  const StageTransfer wide = SignStageTensor(key, values, sender, 80);
  EXPECT_TRUE(CheckStageTensorValues(wide, values).ok());
  st = CheckStageTensor(wide, values, ctx);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rows of 80"), std::string::npos) << st.ToString();
}

// The ledger's tile rule (RuleTile, with BuildTileWitness's footprint witness) applied to a stage's
// step, off chain: for every operator the middle stage computes (a tile of it; a reduction's last
// block from its agreed partial sum), the tile task the game would end at is ruled for the honest
// output from a witness whose input tiles -- the received tensors' among them -- are proven
// against the agreed operator outputs chained from the stage's state hash; a witness with a
// wrong proof is refused. The on-chain wiring of a stage dispute's tile phase is not built yet.
TEST(StageTileCommitTest, TheTileRuleRulesEveryOperatorOfAStageStep) {
  TracedStage traced;
  ASSERT_NO_FATAL_FAILURE(TraceMiddleStage(9, &traced));
  int64_t ruled = 0;
  size_t largest = 0;
  ASSERT_NO_FATAL_FAILURE(RuleEveryOperator(traced, false, &ruled, &largest));
  EXPECT_GT(ruled, 100);
  EXPECT_LE(largest, kMaxTileWitnessBytes);
  RecordProperty("largest_witness_bytes", static_cast<int>(largest));
}

// The 10M GPT (examples/code-gpt-pipeline-devnet.toml: 6 blocks of 384, 172 tokens, 2 sequences of
// 64 tokens a step in 2 micro-batches, clipped AdamW) in its 4 stages: stages 1-3 hold 21-43 MB of
// weights and moments each, far over the whole-stage witness bound (kMaxStageWitnessMemory,
// 4 MiB), yet every one of their operators is ruled at a tile from a witness within
// kMaxTileWitnessBytes. The first reduction block of each tile, to keep the test short.
TEST(StageTileCommitTest, OnThe10mGptEveryOperatorOfEveryLaterStageIsRuledWithinTheTileBound) {
  const std::string dir = std::string(MESHLEARN_SOURCE_DIR) + "/examples";
  Result<std::string> text = Env::Default()->ReadFile(dir + "/code-gpt-pipeline-devnet.toml");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  Result<engine::ModelSpec> spec = engine::ModelSpec::FromToml(*text, "code-gpt-pipeline-devnet");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  engine::OptimizerSpec optimizer;
  optimizer.kind = "adamw";
  optimizer.lr = 1e-3;
  optimizer.beta2 = 0.99;
  optimizer.weight_decay = 0.1;
  optimizer.grad_clip = 1.0;
  Result<engine::PipelineCut> cut = engine::ChooseCut(*spec, optimizer, 4, 2, 64, 2);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  Result<std::vector<engine::StageCost>> costs = engine::CutCosts(*spec, optimizer, *cut, 2, 64, 2);
  ASSERT_TRUE(costs.ok()) << costs.status().ToString();
  int64_t ruled = 0;
  size_t largest = 0;
  for (int stage = 1; stage < 4; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_GT((*costs)[static_cast<size_t>(stage)].param_bytes +
                  (*costs)[static_cast<size_t>(stage)].optimizer_bytes,
              static_cast<double>(kMaxStageWitnessMemory));
    TracedStage traced;
    traced.spec = *spec;
    traced.optimizer = optimizer;
    traced.cut = *cut;
    ASSERT_NO_FATAL_FAILURE(TraceStage(stage, 2, 64, 2, 11, &traced));
    ASSERT_NO_FATAL_FAILURE(RuleEveryOperator(traced, true, &ruled, &largest));
  }
  EXPECT_GT(ruled, 500);
  EXPECT_LE(largest, kMaxTileWitnessBytes);
  std::printf(
      "[ stage    ] the 10M GPT's stages 1-3: %lld operators ruled, largest witness %zu bytes\n",
      static_cast<long long>(ruled), largest);
  RecordProperty("largest_witness_bytes", static_cast<int>(largest));
}

// A received operator's root is the tiled root its sender signed: the roots of stage 1's trace
// check against its commit's received records; a record of other values, or of another width, or
// a missing record, names the operator.
TEST(StageTileCommitTest, AReceivedOperatorsRootIsItsSignedRecordsTiledRoot) {
  TracedStage traced;
  ASSERT_NO_FATAL_FAILURE(TraceMiddleStage(10, &traced));
  const uint32_t cols = StageTileCols(traced.spec);
  StageContext ctx{protocol::TaskId(Blake2b("stage tiles")), 0, 0, {}, cols};
  std::vector<KeyPair> keys;
  for (uint8_t s = 0; s < 3; ++s) {
    keys.push_back(testing::TestKey(static_cast<uint8_t>(60 + s)));
    ctx.chain.push_back(keys.back().public_key());
  }
  protocol::StageStepCommit commit;
  commit.stage = 1;
  commit.stages = 3;
  int64_t inputs = 0;
  for (size_t j = 0; j < traced.plan.ops.size(); ++j) {
    const engine::TileOp& op = traced.plan.ops[j];
    if (!op.received) continue;
    // The record its sender signs for the values stage 1 used.
    const std::string kind = op.name.substr(op.name.find("recv.") + 5);
    const int64_t m = op.name.starts_with("mb") ? op.name[2] - '0' : -1;
    StageTensorKind k = StageTensorKind::kStageTensorActivation;
    uint32_t from = 0;
    if (kind == "activation_grad") k = StageTensorKind::kStageTensorActivationGrad, from = 2;
    if (kind == "grad_squares") k = StageTensorKind::kStageTensorGradSquares;
    if (kind == "grad_total") k = StageTensorKind::kStageTensorGradTotal, from = 2;
    commit.received.push_back(
        SignStageTensor(ctx.Key(k, from, 1, 0, m), traced.trace.values(j), keys[from], cols));
    const protocol::StageTransfer* r =
        StageInputRecord(traced.plan, static_cast<int64_t>(j), commit);
    ASSERT_NE(r, nullptr) << op.name;
    EXPECT_EQ(r->key.kind, k) << op.name;
    ++inputs;
  }
  EXPECT_EQ(inputs, 2 * 2 + 2);  // activations and gradients of 2 micro-batches; the two sums
  EXPECT_TRUE(CheckStageInputRoots(traced.plan, commit, traced.trace.hashes()).ok());
  // A root that is not the signed one.
  const int64_t act = OpNamed(traced.plan, "mb1.recv.activation");
  ASSERT_GE(act, 0);
  std::vector<Hash256> lie = traced.trace.hashes();
  lie[static_cast<size_t>(act)] = Blake2b("other activations");
  Status st = CheckStageInputRoots(traced.plan, commit, lie);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("mb1.recv.activation"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("the sender signed"), std::string::npos) << st.ToString();
  // Only the outputs given are checked (a prefix of the step's operators).
  EXPECT_TRUE(CheckStageInputRoots(traced.plan, commit,
                                   std::span<const Hash256>(lie).first(static_cast<size_t>(act)))
                  .ok());
  // A record of the same values tiled in another width (one row: not the operator's grid); a
  // missing record.
  protocol::StageStepCommit one_row = commit;
  const protocol::StageTransfer& first = commit.received.front();
  const int64_t first_op = OpNamed(traced.plan, "mb0.recv.activation");
  ASSERT_GE(first_op, 0);
  one_row.received.front() =
      SignStageTensor(first.key, traced.trace.values(static_cast<size_t>(first_op)), keys[0], 0);
  st = CheckStageInputRoots(traced.plan, one_row, traced.trace.hashes());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not in the operator's 48 x 40"), std::string::npos) << st.ToString();
  commit.received.pop_back();
  st = CheckStageInputRoots(traced.plan, commit, traced.trace.hashes());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no received record"), std::string::npos) << st.ToString();
}

// ---- A sequential model's stages.

// An MLP of the fashion MLP's kinds with dropout and layernorm (40 -> 48 -> 36 -> 5), cut into 3
// stages: [linear relu] [dropout layernorm linear] [gelu linear].
engine::ModelSpec StageMlpSpec() {
  Result<engine::ModelSpec> spec = engine::ModelSpec::FromToml(
      "[model]\ninput = [40]\n"
      "[[model.layers]]\nkind = \"linear\"\nout = 48\n[[model.layers]]\nkind = \"relu\"\n"
      "[[model.layers]]\nkind = \"dropout\"\np = 0.25\n[[model.layers]]\nkind = \"layernorm\"\n"
      "[[model.layers]]\nkind = \"linear\"\nout = 36\n[[model.layers]]\nkind = \"gelu\"\n"
      "[[model.layers]]\nkind = \"linear\"\nout = 5\n",
      "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}
constexpr int64_t kMlpBatch = 40, kMlpMicro = 2;  // 20 samples a micro-batch: tiles cut short

// Stage `stage` of the MLP's 3 stages traced (its step's dropout seed is TraceStage's, 5).
void TraceMlpStage(int stage, uint64_t batch_seed, TracedStage* out) {
  out->spec = StageMlpSpec();
  Result<engine::PipelineCut> cut = engine::MakeCut(out->spec, {0, 2, 5, 7});
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  out->cut = *cut;
  ASSERT_NO_FATAL_FAILURE(TraceStage(stage, kMlpBatch, 0, kMlpMicro, batch_seed, out));
  out->plan.dropout_seed = 5;
}

// A sequential model's stages tile what they send in the rows of the micro-batch's samples
// (StageTileRows; a width per boundary): every tensor the middle stage received, signed as its
// sender signs it, is tiled as its operator (the root its trace commits it to, provable tile by
// tile), and so is every tensor it sent, whose operator StageSentOperator names. One row, the
// width a sequential stage signed in before, is not the operator's grid.
TEST(StageTileCommitTest, ASequentialStagesTensorsAreTiledInTheRowsOfItsSamples) {
  TracedStage traced;
  ASSERT_NO_FATAL_FAILURE(TraceMlpStage(1, 12, &traced));
  const engine::ModelSpec& spec = traced.spec;
  const engine::TilePlan& plan = traced.plan;
  StageContext ctx{protocol::TaskId(Blake2b("mlp stage tiles")), 0, 0, {}, StageTileCols(spec),
                   StageTileRows(spec, kMlpBatch, kMlpMicro)};
  EXPECT_EQ(ctx.tile_cols, 0u);
  EXPECT_EQ(ctx.tile_rows, kMlpBatch / kMlpMicro);
  std::vector<KeyPair> keys;
  for (uint8_t s = 0; s < 3; ++s) {
    keys.push_back(testing::TestKey(static_cast<uint8_t>(70 + s)));
    ctx.chain.push_back(keys.back().public_key());
  }
  protocol::StageStepCommit commit;
  commit.stage = 1;
  commit.stages = 3;
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    const engine::TileOp& op = plan.ops[j];
    if (!op.received) continue;
    SCOPED_TRACE(op.name);
    const std::string kind = op.name.substr(op.name.find("recv.") + 5);
    const int64_t m = op.name.starts_with("mb") ? op.name[2] - '0' : -1;
    StageTensorKind k = StageTensorKind::kStageTensorActivation;
    uint32_t from = 0;
    if (kind == "activation_grad") k = StageTensorKind::kStageTensorActivationGrad, from = 2;
    if (kind == "grad_squares") k = StageTensorKind::kStageTensorGradSquares;
    if (kind == "grad_total") k = StageTensorKind::kStageTensorGradTotal, from = 2;
    std::span<const float> values = traced.trace.values(j);
    const StageTransfer record = SignStageTensor(ctx.Key(k, from, 1, 0, m), values, keys[from],
                                                 ctx.TileColsOf(values.size()));
    EXPECT_TRUE(CheckStageTensor(record, values, ctx).ok());
    EXPECT_TRUE(TiledAsOperator(record, op));
    EXPECT_EQ(record.tiles, traced.trace.hash(j));
    // Layer 2's input is 48 features wide, layer 4's output 36.
    if (kind == "activation") {
      EXPECT_EQ(record.tile_cols, 48u);
    } else if (kind == "activation_grad") {
      EXPECT_EQ(record.tile_cols, 36u);
    }
    // Tiled in one row, as before: not the operator's grid, and refused by a receiver.
    const StageTransfer one_row = SignStageTensor(ctx.Key(k, from, 1, 0, m), values, keys[from], 0);
    if (op.grid.rows > 1) {
      EXPECT_FALSE(TiledAsOperator(one_row, op));
      EXPECT_FALSE(CheckStageTensor(one_row, values, ctx).ok());
    }
    commit.received.push_back(record);
  }
  EXPECT_EQ(commit.received.size(), 2u * 2u + 2u);
  EXPECT_TRUE(CheckStageInputRoots(plan, commit, traced.trace.hashes()).ok());
  // What it sent: its last layer's output and its first layer's (the dropout's) input gradient,
  // per micro-batch, and the running sum of squares.
  struct Sent {
    StageTensorKind kind;
    uint32_t to;
    int64_t micro_batch;
    const char* op;
  };
  for (const Sent& sent :
       {Sent{StageTensorKind::kStageTensorActivation, 2, 0, "mb0.layers.4.out"},
        Sent{StageTensorKind::kStageTensorActivation, 2, 1, "mb1.layers.4.out"},
        Sent{StageTensorKind::kStageTensorActivationGrad, 0, 1, "mb1.layers.2.in.grad"},
        Sent{StageTensorKind::kStageTensorGradSquares, 2, -1, "grad_squares"}}) {
    SCOPED_TRACE(sent.op);
    const protocol::StageTensorKey key = ctx.Key(sent.kind, 1, sent.to, 0, sent.micro_batch);
    const int64_t j = StageSentOperator(plan, key);
    ASSERT_GE(j, 0);
    EXPECT_EQ(plan.ops[static_cast<size_t>(j)].name, sent.op);
    std::span<const float> values = traced.trace.values(static_cast<size_t>(j));
    const StageTransfer record =
        SignStageTensor(key, values, keys[1], ctx.TileColsOf(values.size()));
    EXPECT_TRUE(TiledAsOperator(record, plan.ops[static_cast<size_t>(j)]));
    EXPECT_EQ(record.tiles, traced.trace.hash(static_cast<size_t>(j)));
  }
}

// A sequential stage's step is ruled by tile like a GPT stage's: every operator the middle and
// last stages of the MLP compute (but the last stage's loss and its gradient, which read the
// batch's targets) is ruled at its last tile for the honest output from a footprint witness
// proven against the operator chain from the stage's state hash, and a witness with a changed
// input tile is refused.
TEST(StageTileCommitTest, TheTileRuleRulesEveryOperatorOfASequentialStageStep) {
  int64_t ruled = 0;
  size_t largest = 0;
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TracedStage traced;
    ASSERT_NO_FATAL_FAILURE(TraceMlpStage(stage, 13, &traced));
    ASSERT_NO_FATAL_FAILURE(RuleEveryOperator(traced, false, &ruled, &largest));
    ASSERT_NO_FATAL_FAILURE(RuleEveryOperator(traced, true, &ruled, &largest));
  }
  EXPECT_GT(ruled, 60);
  EXPECT_LE(largest, kMaxTileWitnessBytes);
}

// Over the stage witness bound, an exact-mode pipeline task with a data root needs the bundle
// with a mismatch whatever its model (MismatchNeedsBundle): a sequential model's stage (a data root
// over examples, no token pages) as a GPT's, so its dispute is played to a tile and never taken to
// the genesis key. Within the bound, without a data root, in tolerance mode, or for an unserved
// claim, it does not.
TEST(StageTileCommitTest, OverTheBoundAStagesMismatchNeedsTheBundleWhateverItsModel) {
  TaskParams p = testing::TestTaskParams();
  p.stages = 3;
  p.units_per_round = 3;
  p.data_root = Blake2b("pages");
  p.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
  p.stage_memory_bytes = {kMaxStageWitnessMemory, kMaxStageWitnessMemory + 1,
                          kMaxStageWitnessMemory};
  MismatchClaimField claim;
  claim.solver_end = Blake2b("solver end");
  claim.replayed_end = Blake2b("replayed end");
  EXPECT_TRUE(MismatchNeedsBundle(p, 1, claim));
  EXPECT_FALSE(MismatchNeedsBundle(p, 0, claim));  // within the bound: RefereeStageStep
  MismatchClaimField unserved = claim;
  unserved.replayed_end = StageUnservedLeaf(claim.solver_end);
  EXPECT_FALSE(MismatchNeedsBundle(p, 1, unserved));
  TaskParams tolerance = p;
  tolerance.tolerance_rel_l2_ppm = 1000;
  EXPECT_FALSE(MismatchNeedsBundle(tolerance, 1, claim));
  TaskParams no_root = p;
  no_root.data_root = Hash256{};
  no_root.data_page_tokens = 0;
  EXPECT_FALSE(MismatchNeedsBundle(no_root, 1, claim));
  TaskParams sequential = p;
  sequential.data_root = Blake2b("examples");
  sequential.data_page_tokens = 0;
  EXPECT_TRUE(MismatchNeedsBundle(sequential, 1, claim));
  EXPECT_FALSE(MismatchNeedsBundle(sequential, 0, claim));
  EXPECT_FALSE(MismatchNeedsBundle(sequential, 1, unserved));
}

// The ledger plans a sequential model's stage unit from the task's bundle and cut (TileContextOf:
// PlanStageStepTiles of the stage's part, rows of examples, not tokens), every stage with state to
// rule its chain end from. A cut with a stage without parameters (here a lone relu) is the
// engine's to refuse (engine::TaskPipelineCut, naming the stage): `task submit` never sends one,
// and the ledger plans no stage of it, so its disputes play whole steps that no key rules
// (PipelineVerificationTest.AStageWithoutParametersIsRuledByNoKey).
TEST(StageTileCommitTest, TheLedgerPlansEverySequentialStageButNoCutWithAStageWithoutParameters) {
  TaskRecord t;
  t.params = testing::TestTaskParams();
  t.params.stages = 3;
  t.params.units_per_round = 3;
  t.params.data_root = Blake2b("the examples' root");
  t.params.num_examples = 60000;
  WorkUnit u;
  auto context = [&](const std::string& cut, uint32_t stage) {
    const std::string bundle = pipeline_testing::FashionMlpPipelineBundle(cut);
    t.id = Blake2b("mlp pipeline " + cut);
    t.spec_hash = BuildManifest(AsBytes(bundle)).id().hash;
    u.task_id = t.id;
    u.index = stage;
    return TileContextOf(t, u, bundle, "reveal verdict: bundle");
  };
  for (uint32_t stage : {0u, 1u, 2u}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Result<TileRuleContext> ctx = context("[0, 2, 4, 5]", stage);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    EXPECT_FALSE(ctx->plan.tokens);
    EXPECT_GT(StateOperators(ctx->plan), 0u);
    EXPECT_GE(OpNamed(ctx->plan, "layers." + std::to_string(2 * stage) + ".out"), 0);
  }
  for (uint32_t stage : {0u, 1u, 2u}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Result<TileRuleContext> lone = context("[0, 1, 2, 5]", stage);
    ASSERT_FALSE(lone.ok());
    EXPECT_EQ(lone.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(lone.status().message().find("network.cut: stage 1 holds layers [1, 2) "
                                           "(model.layers[1] (relu)), none with parameters"),
              std::string::npos)
        << lone.status().ToString();
  }
}

}  // namespace stage_tile_test
}  // namespace meshlearn::ledger
