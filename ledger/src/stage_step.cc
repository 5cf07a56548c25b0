#include "meshlearn/ledger/stage_step.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "meshlearn/base/check.h"
#include "meshlearn/engine/checkpoint.h"

namespace meshlearn::ledger {

using protocol::StageTensorKey;
using protocol::StageTensorKind;
using protocol::StageTransfer;

protocol::StageTensorKey StageContext::Key(StageTensorKind kind, uint32_t from, uint32_t to,
                                           uint64_t step, int64_t micro_batch) const {
  StageTensorKey k;
  k.task = task;
  k.round = round;
  k.replica = replica;
  k.stages = stages();
  k.from_stage = from;
  k.to_stage = to;
  k.step = step;
  k.micro_batch = micro_batch;
  k.kind = kind;
  return k;
}

Bytes StageTensorBytes(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "floats travel as stored");
  Bytes out(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<float> StageTensorFromBytes(ByteSpan bytes) {
  CHECK_EQ(bytes.size() % sizeof(float), 0u);
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

uint32_t StageTileCols(const engine::ModelSpec& model) {
  return model.kind == "gpt" ? static_cast<uint32_t>(model.gpt.n_embd) : 0;
}

int64_t StageTileRows(const engine::ModelSpec& model, int64_t batch_size, int64_t micro_batches) {
  return model.kind == "gpt" || micro_batches < 1 ? 0 : batch_size / micro_batches;
}

uint32_t StageContext::TileColsOf(size_t floats) const {
  if (tile_rows <= 0) return tile_cols;
  const auto rows = static_cast<size_t>(tile_rows);
  return floats % rows == 0 ? static_cast<uint32_t>(floats / rows) : 0;
}

namespace {

Hash256 StageTensorTiles(std::span<const float> values, uint32_t tile_cols) {
  return engine::TensorRoot(
      values, engine::StageTensorGrid(static_cast<int64_t>(values.size()), tile_cols));
}

}  // namespace

StageTransfer SignStageTensor(const StageTensorKey& key, std::span<const float> values,
                              const KeyPair& sender, uint32_t tile_cols) {
  return protocol::SignStageTransfer(key, engine::TensorHash(values),
                                     StageTensorTiles(values, tile_cols), tile_cols,
                                     4 * values.size(), sender);
}

Status CheckStageTensorValues(const StageTransfer& record, std::span<const float> values) {
  ML_RETURN_IF_ERROR(
      protocol::CheckReceivedTensor(record, engine::TensorHash(values), 4 * values.size()));
  return protocol::CheckReceivedTiles(record, StageTensorTiles(values, record.tile_cols));
}

Status CheckStageTensor(const StageTransfer& record, std::span<const float> values,
                        const StageContext& ctx) {
  if (record.key.from_stage >= ctx.stages()) {
    return InvalidArgument(record.key.ToString() + ": the replica's chain has " +
                           std::to_string(ctx.stages()) + " stages");
  }
  ML_RETURN_IF_ERROR(protocol::VerifyStageTransfer(record, ctx.chain[record.key.from_stage]));
  if (record.tile_cols != ctx.TileColsOf(values.size())) {
    return InvalidArgument(record.key.ToString() + ": tiled in rows of " +
                           std::to_string(record.tile_cols) + " floats, the replica's tensors in " +
                           std::to_string(ctx.TileColsOf(values.size())));
  }
  return CheckStageTensorValues(record, values);
}

namespace {

// "replica 1, stage 2, step 3": the prefix of a stage's errors.
std::string StageName(const StageContext& ctx, int stage, int64_t step) {
  return "replica " + std::to_string(ctx.replica) + ", stage " + std::to_string(stage) + ", step " +
         std::to_string(step);
}

}  // namespace

Result<StageStepOutcome> RunStageStep(engine::Stage& stage, const StageContext& ctx,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      StageLink& link) {
  const uint32_t S = ctx.stages();
  const uint32_t s = static_cast<uint32_t>(stage.index());
  CHECK_LT(s, S);
  const uint32_t last_stage = S - 1;
  const int64_t M = stage.micro_batches();
  const int64_t step = stage.state().step;
  const uint64_t ustep = static_cast<uint64_t>(step);
  const std::string name = StageName(ctx, stage.index(), step);
  ML_ASSIGN_OR_RETURN(std::vector<engine::Batch> micro, engine::SplitBatch(batch, M));

  StageStepOutcome out;
  protocol::StageStepCommit& c = out.commit;
  c.task = ctx.task;
  c.round = ctx.round;
  c.replica = ctx.replica;
  c.stage = s;
  c.stages = S;
  c.step = ustep;
  c.state_before = engine::StateHash(stage.state());

  auto receive = [&](StageTensorKind kind, uint32_t from, int64_t m) -> Result<std::vector<float>> {
    StageTransfer record;
    Result<std::vector<float>> v = link.Receive(ctx.Key(kind, from, s, ustep, m), &record);
    if (!v.ok()) return v.status().WithPrefix(name);
    c.received.push_back(record);
    return v;
  };
  auto send = [&](StageTensorKind kind, uint32_t to, int64_t m, std::span<const float> v) {
    Result<StageTransfer> record = link.Send(ctx.Key(kind, s, to, ustep, m), v);
    if (!record.ok()) return record.status().WithPrefix(name);
    c.sent.push_back(*record);
    return Status::Ok();
  };
  // A once-per-step tensor of the size the stage needs (a peer's tensor: checked, not assumed).
  auto expect_size = [&](const std::vector<float>& v, size_t want, const char* what) {
    if (v.size() == want) return Status::Ok();
    return InvalidArgument(name + ": the " + std::string(what) + " received has " +
                           std::to_string(v.size()) + " floats, the stage needs " +
                           std::to_string(want));
  };

  // 0. The head's copy of wte.
  engine::Model& model = *stage.state().model;
  const bool tied = model.tied_head() && S > 1;
  if (tied && s == 0) {
    ML_RETURN_IF_ERROR(
        send(StageTensorKind::kStageTensorTiedWeight, last_stage, -1, stage.tied_weight_source()));
  }
  if (tied && s == last_stage) {
    ML_ASSIGN_OR_RETURN(std::vector<float> wte,
                        receive(StageTensorKind::kStageTensorTiedWeight, 0, -1));
    ML_RETURN_IF_ERROR(expect_size(wte, static_cast<size_t>(model.tied_weight()->size()), "wte"));
    stage.SetTiedWeight(wte);
  }

  // 1. Forward passes, GPipe order.
  stage.BeginStep();
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> input;
    if (s > 0) {
      ML_ASSIGN_OR_RETURN(input, receive(StageTensorKind::kStageTensorActivation, s - 1, m));
    }
    engine::ForwardOptions opts{.train = true,
                                .dropout_seed = dropout_seed,
                                .step = ustep,
                                .micro_batch = static_cast<uint64_t>(m)};
    Result<std::span<const float>> o =
        stage.Forward(m, micro[static_cast<size_t>(m)], std::move(input), opts);
    if (!o.ok()) return o.status().WithPrefix(name);
    if (s < last_stage) {
      ML_RETURN_IF_ERROR(send(StageTensorKind::kStageTensorActivation, s + 1, m, *o));
    }
  }
  // 2. Backward passes in increasing micro-batch order.
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> grad;
    if (s < last_stage) {
      ML_ASSIGN_OR_RETURN(grad, receive(StageTensorKind::kStageTensorActivationGrad, s + 1, m));
    }
    Result<std::span<const float>> g = stage.Backward(m, std::move(grad));
    if (!g.ok()) return g.status().WithPrefix(name);
    if (s > 0) ML_RETURN_IF_ERROR(send(StageTensorKind::kStageTensorActivationGrad, s - 1, m, *g));
  }
  if (s == last_stage) {
    float loss = 0.0f;
    for (int64_t m = 0; m < M; ++m) loss = loss + stage.loss(m);
    out.loss = M == 1 ? loss : loss / static_cast<float>(M);
  }
  // 3. The head's wte gradient joins the embedding's: sent from the last stage to stage 0, or,
  // a GPT in one stage, added where it is.
  if (model.tied_head() && S == 1) stage.AddTiedHeadGrad(stage.tied_head_grad());
  if (tied && s == last_stage) {
    ML_RETURN_IF_ERROR(
        send(StageTensorKind::kStageTensorTiedHeadGrad, 0, -1, stage.tied_head_grad()));
  }
  if (tied && s == 0) {
    ML_ASSIGN_OR_RETURN(std::vector<float> head,
                        receive(StageTensorKind::kStageTensorTiedHeadGrad, last_stage, -1));
    ML_RETURN_IF_ERROR(expect_size(head, static_cast<size_t>(stage.params()[0].grad.size()),
                                   "head's wte gradient"));
    stage.AddTiedHeadGrad(head);
  }
  // 4. The gradient norm, chained in model order.
  float running = 0.0f;
  if (s > 0) {
    ML_ASSIGN_OR_RETURN(std::vector<float> r,
                        receive(StageTensorKind::kStageTensorGradSquares, s - 1, -1));
    ML_RETURN_IF_ERROR(expect_size(r, 1, "running sum of squares"));
    running = r[0];
  }
  const float squares = stage.SumGradSquares(running);
  float total = squares;
  if (s < last_stage) {
    ML_RETURN_IF_ERROR(send(StageTensorKind::kStageTensorGradSquares, s + 1, -1, {&squares, 1}));
    ML_ASSIGN_OR_RETURN(std::vector<float> t,
                        receive(StageTensorKind::kStageTensorGradTotal, last_stage, -1));
    ML_RETURN_IF_ERROR(expect_size(t, 1, "sum of squares"));
    total = t[0];
  } else {
    for (uint32_t to = 0; to < last_stage; ++to) {
      ML_RETURN_IF_ERROR(send(StageTensorKind::kStageTensorGradTotal, to, -1, {&total, 1}));
    }
  }
  // 5. The update: the only change to the stage's weights.
  // (FinishStep: norm = sqrt(total), and a traced stage records the total it received.)
  out.grad_norm = stage.FinishStep(step, total);
  c.state_after = engine::StateHash(stage.state());
  return out;
}

}  // namespace meshlearn::ledger
