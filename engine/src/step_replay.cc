#include "meshlearn/engine/step_replay.h"

#include "meshlearn/engine/pipeline.h"

#include <algorithm>
#include <bit>
#include <string>

namespace meshlearn::engine {
namespace {

int64_t StateFloatCount(TrainState& state) {
  int64_t n = state.model->NumParameters();
  for (const Optimizer::NamedState& s : state.optimizer->State()) n += s.tensor->size();
  return n;
}

}  // namespace

int64_t FlatStateSize(int64_t num_params, const OptimizerSpec& optimizer) {
  const int64_t slots = optimizer.kind == "adamw" ? 2 : (optimizer.momentum > 0 ? 1 : 0);
  return num_params * (1 + slots);
}

Hash256 TaskContentId(const TaskSpec& task) {
  Hasher h("meshlearn.local_task");
  h.Update(task.name).UpdateU64(task.seed).Update(task.model.ToJson());
  return h.Finish();
}

OptimizerSpec UnitOptimizerSpec(const OptimizerSpec& task_optimizer, double lr_scale) {
  OptimizerSpec inner = task_optimizer;
  // A unit restarts its optimizer at step 0, so a warm-up or a cosine over [train].steps would
  // replay the same ramp in every unit: a unit's inner rate is constant (lr x lr_scale), and the
  // network task decays it across rounds instead (network.inner_lr_final).
  inner.schedule = "constant";
  inner.warmup_steps = 0;
  inner.lr *= lr_scale;
  inner.min_lr *= lr_scale;
  return inner;
}

uint64_t DropoutSeed(uint64_t task_seed, uint64_t stream) {
  // Dropout masks depend on the work-unit stream too, so units draw different masks.
  return task_seed + stream * 0x9E3779B97F4A7C15ULL;
}

// The update is the step's last operator: every parameter after it, then every optimizer state
// tensor after it (op_trace.h), each in its tile grid, so the state the step leaves behind is
// operator outputs a dispute can narrow to a tile of (tile_rule.h's update operators).
void RecordStepOutputState(TrainState& state, OpTrace& trace) {
  for (const Param& p : state.model->params()) trace.Record(p.name, p.value);
  for (const Optimizer::NamedState& s : state.optimizer->State()) trace.Record(s.name, *s.tensor);
}

Hash256 StateHashOfTracedStep(TrainState& state, const OpTrace& trace) {
  // RecordStepOutputState's layout: every parameter, then every optimizer state tensor, each in
  // its shape's grid, as StateTensorRoots roots them.
  const std::vector<Param>& params = state.model->params();
  const std::vector<Optimizer::NamedState> moments = state.optimizer->State();
  const size_t n = params.size() + moments.size();
  CHECK_GE(trace.size(), n) << "StateHashOfTracedStep: the trace has " << trace.size()
                            << " operators, the state " << n << " tensors";
  const size_t first = trace.size() - n;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = i < params.size() ? params[i].name : moments[i - params.size()].name;
    CHECK_EQ(trace.name(first + i), name) << "StateHashOfTracedStep: the trace does not end with "
                                             "the step's output state";
  }
  return StateHashOfRoots(state.step, state.seed, state.stream,
                          std::span<const Hash256>(trace.hashes()).subspan(first));
}

// The step's input state comes first in its trace (op_trace.h).
void RecordStepInputState(TrainState& state, OpTrace& trace) {
  for (const Param& p : state.model->params()) trace.Record("in." + p.name, p.value);
  for (const Optimizer::NamedState& s : state.optimizer->State()) {
    trace.Record("in." + s.name, *s.tensor);
  }
}

namespace {

// A clipped update's scale is a reduction over every gradient: it is committed as two operators,
// every gradient's SumSquaresTree block partials and then the norm they combine to (tile_rule.h),
// so one tile of the update, and the norm itself, can be ruled alone.
void RecordGradNorm(TrainState& state, float norm) {
  OpTrace* trace = state.model->op_trace();
  if (trace == nullptr || !(state.optimizer->spec().grad_clip > 0)) return;
  trace->Record("grad_norm.blocks", GradSquareBlockPartials(state.model->params()));
  trace->Record("grad_norm", {&norm, 1});
}

// Steps 1-4 of pipeline.h for M > 1 micro-batches. Traced (op_trace.h): micro-batch m's
// operators as "mb<m>.<name>", the parameter gradients as accumulated after it; a GPT's tied
// head gradient of micro-batch m as "mb<m>.<wte>.head.grad", and "<wte>.grad" once the two are
// added; the norm and the update as an unsplit step records them.
float StepOnMicroBatches(TrainState& state, const Batch& batch, uint64_t dropout_seed,
                         float* grad_norm, int64_t micro_batches) {
  Result<std::vector<Batch>> parts = SplitBatch(batch, micro_batches);
  CHECK(parts.ok()) << parts.status().ToString();
  const int64_t step = state.step;
  Model& m = *state.model;
  m.ZeroGrad();
  BackwardOptions bopts;
  bopts.dloss = MicroBatchLossScale(micro_batches);
  Tensor head_grad;
  if (m.tied_head()) {
    head_grad = Tensor(m.params()[0].value.shape());
    bopts.tied_head_grad = head_grad.data();
  }
  OpTrace* trace = m.op_trace();
  if (trace != nullptr) RecordStepInputState(state, *trace);
  const TileGrid wte_grid = TileGrid::ForShape(m.params()[0].grad.shape());
  float loss = 0.0f;
  for (int64_t k = 0; k < micro_batches; ++k) {
    ForwardOptions opts{.train = true,
                        .dropout_seed = dropout_seed,
                        .step = static_cast<uint64_t>(step),
                        .micro_batch = static_cast<uint64_t>(k)};
    if (trace != nullptr) trace->set_name_prefix("mb" + std::to_string(k) + ".");
    loss = loss + m.Forward((*parts)[static_cast<size_t>(k)], opts);
    m.Backward(bopts);
    if (trace != nullptr && m.tied_head()) {
      trace->Record(m.params()[0].name + ".head.grad",
                    {head_grad.data(), static_cast<size_t>(head_grad.size())}, wte_grid.rows,
                    wte_grid.cols);
    }
    if (trace != nullptr) trace->set_name_prefix("");
  }
  if (m.tied_head()) {
    Tensor& wte_grad = m.params()[0].grad;
    AddTiedHeadGrad(wte_grad, {head_grad.data(), static_cast<size_t>(head_grad.size())});
    if (trace != nullptr) {
      trace->Record(m.params()[0].name + ".grad",
                    {wte_grad.data(), static_cast<size_t>(wte_grad.size())}, wte_grid.rows,
                    wte_grid.cols);
    }
  }
  // Optimizer::Step's norm and update, with the norm committed between them.
  const float norm = GlobalGradNorm(m.params());
  RecordGradNorm(state, norm);
  state.optimizer->Update(m.params(), step, norm);
  if (trace != nullptr) RecordStepOutputState(state, *trace);
  state.step = step + 1;
  if (grad_norm != nullptr) *grad_norm = norm;
  return loss / static_cast<float>(micro_batches);
}

}  // namespace

float StepOnBatch(TrainState& state, const Batch& batch, uint64_t dropout_seed, float* grad_norm,
                  int64_t micro_batches) {
  CHECK(state.optimizer) << "StepOnBatch needs a training state with an optimizer";
  if (micro_batches != 1) {
    return StepOnMicroBatches(state, batch, dropout_seed, grad_norm, micro_batches);
  }
  const int64_t step = state.step;
  Model& m = *state.model;
  if (OpTrace* trace = m.op_trace()) RecordStepInputState(state, *trace);
  m.ZeroGrad();
  ForwardOptions opts{
      .train = true, .dropout_seed = dropout_seed, .step = static_cast<uint64_t>(step)};
  const float loss = m.Forward(batch, opts);
  m.Backward();
  const float norm = GlobalGradNorm(m.params());
  RecordGradNorm(state, norm);
  state.optimizer->Update(m.params(), step, norm);
  if (OpTrace* trace = m.op_trace()) RecordStepOutputState(state, *trace);
  state.step = step + 1;
  if (grad_norm != nullptr) *grad_norm = norm;
  return loss;
}

std::vector<float> FlatState(TrainState& state) {
  CHECK(state.optimizer) << "FlatState needs a training state with an optimizer";
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(StateFloatCount(state)));
  for (const Param& p : state.model->params()) {
    flat.insert(flat.end(), p.value.data(), p.value.data() + p.value.size());
  }
  for (const Optimizer::NamedState& s : state.optimizer->State()) {
    flat.insert(flat.end(), s.tensor->data(), s.tensor->data() + s.tensor->size());
  }
  return flat;
}

Result<TrainState> StateFromFlat(const ModelSpec& model, const OptimizerSpec& optimizer,
                                 std::span<const float> flat, int64_t step, uint64_t seed,
                                 uint64_t stream) {
  if (optimizer.kind != "adamw" && optimizer.kind != "sgd") {
    return InvalidArgument("StateFromFlat: optimizer kind must be adamw or sgd, got '" +
                           optimizer.kind + "'");
  }
  if (step < 0) {
    return InvalidArgument("StateFromFlat: step must be >= 0, got " + std::to_string(step));
  }
  // The ledger runs this while executing a block: its outcome must not depend on this machine's
  // memory. The flat state (bounded by the witness size) holds at least every parameter, so a
  // spec planning more parameters than `flat` has floats is refused before anything is
  // allocated, the same way everywhere.
  Result<MemoryEstimate> planned = EstimateMemory(model, 1, 1, optimizer.kind, false);
  if (!planned.ok()) {
    return InvalidArgument("StateFromFlat: the model spec does not build: " +
                           planned.status().message());
  }
  const int64_t want = FlatStateSize(planned->num_parameters, optimizer);
  if (static_cast<int64_t>(flat.size()) != want) {
    return InvalidArgument(
        "StateFromFlat: the flat state has " + std::to_string(flat.size()) + " floats but model " +
        model.ToJson() + " with optimizer " + optimizer.kind + " expects " + std::to_string(want) +
        " (" + std::to_string(planned->num_parameters) + " parameters, then the optimizer state)");
  }
  Result<std::unique_ptr<Model>> m = Model::CreateUnchecked(model);
  if (!m.ok()) {
    return InvalidArgument("StateFromFlat: the model spec does not build: " + m.status().message());
  }
  TrainState st;
  st.model = std::move(*m);
  st.optimizer = std::make_unique<Optimizer>(optimizer, st.model->params());
  st.step = step;
  st.seed = seed;
  st.stream = stream;
  CHECK(StateFloatCount(st) == want) << "FlatStateSize disagrees with the built state";
  size_t off = 0;
  auto fill = [&](float* dst, int64_t n) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(off), n, dst);
    off += static_cast<size_t>(n);
  };
  for (Param& p : st.model->params()) fill(p.value.data(), p.value.size());
  for (const Optimizer::NamedState& s : st.optimizer->State())
    fill(s.tensor->data(), s.tensor->size());
  CHECK_EQ(off, flat.size());
  return st;
}

std::vector<int64_t> BatchIndices(uint64_t seed, uint64_t stream, int64_t n, int64_t batch,
                                  int64_t step) {
  return BatchSampler(seed, stream, n, batch).Indices(step);
}

namespace {

// The label's 4 bytes, little-endian, as both example leaves hash it.
void UpdateLabel(Hasher& h, int32_t y) {
  const uint32_t uy = static_cast<uint32_t>(y);
  const uint8_t yb[4] = {static_cast<uint8_t>(uy), static_cast<uint8_t>(uy >> 8),
                         static_cast<uint8_t>(uy >> 16), static_cast<uint8_t>(uy >> 24)};
  h.Update(ByteSpan(yb, 4));
}

// The float bytes are hashed as they lie in memory, like StateHash's tensors.
void UpdateFloats(Hasher& h, std::span<const float> x) {
  static_assert(std::endian::native == std::endian::little,
                "meshlearn hashes little-endian floats");
  h.Update(ByteSpan(reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(float)));
}

}  // namespace

std::vector<Hash256> ExampleChunkLeaves(std::span<const float> x) {
  const int64_t n = ExampleChunks(static_cast<int64_t>(x.size()));
  CHECK_GT(n, 0) << "an example of " << x.size() << " floats is not chunked";
  std::vector<Hash256> leaves;
  leaves.reserve(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    leaves.push_back(ExampleChunkLeaf(static_cast<uint64_t>(c), ExampleChunk(x, c)));
  }
  return leaves;
}

Hash256 ExampleLeaf(uint64_t index, std::span<const float> x, int32_t y) {
  if (ExampleChunks(static_cast<int64_t>(x.size())) > 0) {
    return ChunkedExampleLeaf(index, y, x.size(), ExampleChunkRoot(x));
  }
  Hasher h("meshlearn.example");
  h.UpdateU64(index);
  UpdateLabel(h, y);
  UpdateFloats(h, x);
  return h.Finish();
}

int64_t ExampleChunks(int64_t floats) {
  return floats <= kExampleChunkFloats ? 0
                                       : (floats + kExampleChunkFloats - 1) / kExampleChunkFloats;
}

Hash256 ExampleChunkLeaf(uint64_t chunk, std::span<const float> floats) {
  Hasher h("meshlearn.example_chunk");
  h.UpdateU64(chunk);
  UpdateFloats(h, floats);
  return h.Finish();
}

std::span<const float> ExampleChunk(std::span<const float> x, int64_t chunk) {
  CHECK_GE(chunk, 0);
  CHECK_LT(chunk, ExampleChunks(static_cast<int64_t>(x.size())));
  const size_t c0 = static_cast<size_t>(chunk * kExampleChunkFloats);
  return x.subspan(c0, std::min(x.size() - c0, static_cast<size_t>(kExampleChunkFloats)));
}

Hash256 ExampleChunkRoot(std::span<const float> x) {
  return ExampleChunkRoot(ExampleChunkLeaves(x));
}

MerkleProof ProveExampleChunk(std::span<const float> x, int64_t chunk) {
  return ProveExampleChunk(ExampleChunkLeaves(x), chunk);
}

Hash256 ExampleChunkRoot(const std::vector<Hash256>& leaves) { return MerkleRoot(leaves); }

MerkleProof ProveExampleChunk(const std::vector<Hash256>& leaves, int64_t chunk) {
  CHECK(chunk >= 0 && chunk < static_cast<int64_t>(leaves.size()))
      << "chunk " << chunk << " of " << leaves.size();
  return MerkleProve(leaves, static_cast<uint64_t>(chunk));
}

Hash256 ChunkedExampleLeaf(uint64_t index, int32_t y, uint64_t floats, const Hash256& chunk_root) {
  Hasher h("meshlearn.example_chunked");
  h.UpdateU64(index);
  UpdateLabel(h, y);
  h.UpdateU64(floats);
  h.Update(chunk_root.span());
  return h.Finish();
}

DataTree::DataTree(const ClassificationData& train) {
  const int64_t n = train.size();
  leaf_count_ = static_cast<uint64_t>(n);
  if (n == 0) {
    root_ = MerkleRoot({});
    return;
  }
  const int64_t per = train.x.size() / n;  // floats per example
  std::vector<Hash256> level(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::span<const float> x(train.x.data() + i * per, static_cast<size_t>(per));
    level[static_cast<size_t>(i)] =
        MerkleLeafHash(ExampleLeaf(static_cast<uint64_t>(i), x, train.y[static_cast<size_t>(i)]));
  }
  levels_.push_back(std::move(level));
  // base/merkle.cc's shape: pair neighbours, promote an odd last node unchanged.
  while (levels_.back().size() > 1) {
    const std::vector<Hash256>& cur = levels_.back();
    std::vector<Hash256> next;
    next.reserve((cur.size() + 1) / 2);
    for (size_t i = 0; i + 1 < cur.size(); i += 2)
      next.push_back(MerkleInnerHash(cur[i], cur[i + 1]));
    if (cur.size() % 2 == 1) next.push_back(cur.back());
    levels_.push_back(std::move(next));
  }
  root_ = levels_.back()[0];
}

MerkleProof DataTree::Prove(int64_t index) const {
  CHECK_GE(index, 0);
  CHECK_LT(static_cast<uint64_t>(index), leaf_count_);
  MerkleProof proof;
  proof.index = static_cast<uint64_t>(index);
  proof.leaf_count = leaf_count_;
  uint64_t pos = proof.index;
  for (size_t l = 0; l + 1 < levels_.size(); ++l) {
    const uint64_t sibling = pos ^ 1;
    if (sibling < levels_[l].size()) proof.siblings.push_back(levels_[l][sibling]);
    pos /= 2;
  }
  return proof;
}

Hash256 TokenPageLeaf(uint64_t page, std::span<const int32_t> tokens) {
  static_assert(std::endian::native == std::endian::little,
                "meshlearn hashes little-endian tokens");
  Hasher h("meshlearn.token_page");
  h.UpdateU64(page);
  h.UpdateU64(static_cast<uint64_t>(tokens.size()));
  h.Update(
      ByteSpan(reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size() * sizeof(int32_t)));
  return h.Finish();
}

TokenPageTree::TokenPageTree(std::span<const int32_t> tokens)
    : tokens_(tokens.begin(), tokens.end()) {
  const int64_t n = num_tokens();
  for (int64_t p = 0; p * kTokenPageTokens < n; ++p) {
    leaves_.push_back(TokenPageLeaf(static_cast<uint64_t>(p), Page(p)));
  }
  root_ = MerkleRoot(leaves_);
}

std::span<const int32_t> TokenPageTree::Page(int64_t page) const {
  CHECK(page >= 0 && page * kTokenPageTokens < num_tokens()) << "token page " << page;
  const int64_t p0 = page * kTokenPageTokens;
  const int64_t p1 = std::min(num_tokens(), p0 + kTokenPageTokens);
  return {tokens_.data() + p0, static_cast<size_t>(p1 - p0)};
}

MerkleProof TokenPageTree::Prove(int64_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "token page " << page;
  return MerkleProve(leaves_, static_cast<uint64_t>(page));
}

Hash256 TokenDataRoot(std::span<const int32_t> tokens) { return TokenPageTree(tokens).root(); }

std::vector<int64_t> TokenPagesOfRows(uint64_t seed, uint64_t stream, int64_t step, int64_t B,
                                      int64_t T, int64_t n_tokens,
                                      const std::vector<int64_t>& rows) {
  const std::vector<int64_t> starts = WindowStarts(seed, stream, step, B, n_tokens, T);
  std::vector<int64_t> pages;
  for (int64_t r : rows) {
    CHECK(r >= 0 && r < B * T) << "batch row " << r;
    const int64_t pos = starts[static_cast<size_t>(r / T)] + r % T;
    pages.push_back(pos / kTokenPageTokens);
    pages.push_back((pos + 1) / kTokenPageTokens);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return pages;
}

}  // namespace meshlearn::engine
