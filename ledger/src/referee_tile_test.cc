// The dispute game narrowed to ONE TILE of one operator, played end to end on real training of a
// fashion-MLP-shaped model (784-256-128-10, AdamW, batch 128), and ruled by RuleTile from a
// witness of input tiles proven against commitments both parties agreed to. An honest party and
// a liar train the same unit; the liar lies at the step (the state only), at an operator (a real
// wrong computation), or at one tile of any operator the model has (forward, loss, gradients,
// long reductions, the optimizer update). Each party answers every query from its own run; the
// game goes through its canonical encoding after every turn, as the ledger stores it. The honest
// side wins in either role; a silent party loses at every phase; a witness with a wrong proof,
// a wrong tile, or an input not agreed is refused; every witness is at most 256 KiB.
#include "meshlearn/ledger/referee_tile.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/check.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/merkle.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/engine/train.h"
#include "meshlearn/protocol/dispute.h"
#include "meshlearn/protocol/task_model.h"
#include "meshlearn/protocol/unit_check.h"
#include "meshlearn/protocol/verification.h"
#include "test_util.h"

namespace meshlearn::ledger {
namespace referee_tile_test {  // named: the tests build as unity translation units

using engine::OpTrace;
using engine::TilePlan;
using engine::Trainer;
using protocol::DisputeConfig;
using protocol::DisputeGame;
using protocol::DisputeOutcome;
using protocol::DisputeParty;
using protocol::DisputeQuery;
using protocol::DisputeStage;
using protocol::RefereeTask;

constexpr char kFashionMlp[] = R"(
[task]
name = "tile-dispute-mlp"
seed = 3
[data]
format = "npy"
train_x = "unused"
train_y = "unused"
test_x = "unused"
test_y = "unused"
[model]
input = [784]
[[model.layers]]
kind = "linear"
out = 256
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 128
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "linear"
out = 10
init = "xavier"
[optimizer]
kind = "adamw"
lr = 2e-3
[train]
steps = 4
batch_size = 128
)";

constexpr uint64_t kSteps = 4;    // the disputed segment: steps 1..4 (agreed: the start state)
constexpr uint64_t kLieStep = 3;  // the step inside which the liar goes wrong
constexpr int64_t kExamples = 512;

// Synthetic 10-class data shaped like Fashion-MNIST, no files.
const engine::TaskData& Data() {
  static const engine::TaskData* data = [] {
    auto* d = new engine::TaskData;
    Rng rng(17);
    std::vector<float> x(static_cast<size_t>(kExamples * 784));
    for (float& v : x) v = static_cast<float>(rng.UniformDouble()) * 2.0f - 1.0f;
    d->train.x = engine::Tensor({kExamples, 784}, x);
    d->train.y.resize(kExamples);
    for (int64_t i = 0; i < kExamples; ++i) d->train.y[i] = static_cast<int32_t>(rng.Uniform(10));
    d->train.num_classes = 10;
    d->test = d->train;
    return d;
  }();
  return *data;
}

const engine::DataTree& Tree();

// The model under test: how to train it, and the chain's view of the unit (what the ledger
// decodes from the task record).
struct Setup {
  std::function<std::unique_ptr<Trainer>()> make;
  // The trainer the setup built its context from, at its initial state: the first run (the
  // honest one) takes it, so the model is initialised once per setup (MakeTrainer, Train).
  mutable std::unique_ptr<Trainer> fresh;
  TileRuleContext ctx;
  const engine::ClassificationData* train = nullptr;  // the examples witnesses read (or none)
  const engine::DataTree* tree = nullptr;
  const engine::TokenPageTree* pages = nullptr;  // a token task's pages (or none)
};

TileRuleContext ContextOf(Trainer& tr, uint64_t num_examples, const Hash256& data_root) {
  TileRuleContext c;
  Result<TilePlan> plan =
      engine::PlanStepTiles(tr.task().model, tr.state().optimizer->spec(), tr.task().batch_size,
                            tr.task().seq_len, tr.task().micro_batches);
  CHECK(plan.ok()) << plan.status().ToString();
  c.plan = std::move(*plan);
  c.seed = tr.task().seed;
  c.stream = tr.task().stream;
  c.plan.dropout_seed = engine::DropoutSeed(c.seed, c.stream);
  c.num_examples = num_examples;
  c.data_root = data_root;
  return c;
}

const Setup& FashionSetup() {
  static const Setup* setup = [] {
    auto* s = new Setup;
    s->make = [] {
      Result<engine::TaskSpec> spec =
          engine::TaskSpec::Parse(kFashionMlp, "tile-dispute.toml", ".");
      CHECK(spec.ok()) << spec.status().ToString();
      Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*spec, Data());
      CHECK(tr.ok()) << tr.status().ToString();
      return std::move(*tr);
    };
    s->fresh = s->make();
    s->ctx = ContextOf(*s->fresh, static_cast<uint64_t>(kExamples), Tree().root());
    s->train = &Data().train;
    s->tree = &Tree();
    return s;
  }();
  return *setup;
}

// The setup of a token task (a GPT): its trainers share the task's data, and its data root is over
// the train stream's token pages.
const Setup* TokenSetup(engine::TaskSpec spec, engine::TaskData data) {
  auto* s = new Setup;
  auto shared_spec = std::make_shared<const engine::TaskSpec>(std::move(spec));
  auto shared = std::make_shared<const engine::TaskData>(std::move(data));
  s->make = [shared_spec, shared] {
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*shared_spec, shared);
    CHECK(tr.ok()) << tr.status().ToString();
    return std::move(*tr);
  };
  s->pages = new engine::TokenPageTree(shared->train_tokens.tokens);
  s->fresh = s->make();
  s->ctx = ContextOf(*s->fresh, static_cast<uint64_t>(s->pages->num_tokens()), s->pages->root());
  return s;
}

// examples/code-gpt-10m.toml (10.8M parameters, the code corpus) at one sequence of 256 tokens,
// its data root over the train stream's token pages.
const Setup& GptSetup() {
  static const Setup* setup = [] {
    Result<engine::TaskSpec> spec = engine::TaskSpec::Load(
        Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/code-gpt-10m.toml");
    CHECK(spec.ok()) << spec.status().ToString();
    Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *spec);
    CHECK(data.ok()) << data.status().ToString();
    spec->batch_size = 1;
    return TokenSetup(std::move(*spec), std::move(*data));
  }();
  return *setup;
}

// A small GPT (1 layer, 2 heads of 8, vocabulary 64) over sequences of T = 288, above the 256
// where the attention forward is narrowed into blocks of 32 positions; two sequences a step, on
// synthetic token files, its data root over their token pages.
const Setup& LongGptSetup() {
  static const Setup* setup = [] {
    char dir_template[] = "/tmp/meshlearn-tile-long-XXXXXX";
    CHECK(mkdtemp(dir_template) != nullptr);
    const std::string dir = dir_template;
    Rng rng(31);
    for (const char* name : {"train.bin", "val.bin"}) {
      std::string bytes;
      for (int i = 0; i < 4096; ++i) {
        const uint16_t t = static_cast<uint16_t>(rng.Uniform(64));
        bytes.push_back(static_cast<char>(t & 0xff));
        bytes.push_back(static_cast<char>(t >> 8));
      }
      CHECK(Env::Default()->WriteFileAtomic(dir + "/" + name, bytes).ok());
    }
    Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(R"(
[task]
name = "tile-long-sequence"
seed = 7
[data]
format = "tokens"
train = "train.bin"
val = "val.bin"
vocab_size = 64
[model]
kind = "gpt"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 288
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 4
batch_size = 2
)",
                                                            "tile-long.toml", dir);
    CHECK(spec.ok()) << spec.status().ToString();
    Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *spec);
    CHECK(data.ok()) << data.status().ToString();
    std::filesystem::remove_all(dir);  // the data is in memory now
    return TokenSetup(std::move(*spec), std::move(*data));
  }();
  return *setup;
}

// The setup of a task over examples: its trainers share the task's data, and its data root is the
// tree over its training examples (engine::DataTree).
const Setup* ExampleSetup(engine::TaskSpec spec, engine::TaskData data) {
  auto* s = new Setup;
  auto shared_spec = std::make_shared<const engine::TaskSpec>(std::move(spec));
  auto shared = std::make_shared<const engine::TaskData>(std::move(data));
  s->make = [shared_spec, shared] {
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*shared_spec, *shared);
    CHECK(tr.ok()) << tr.status().ToString();
    return std::move(*tr);
  };
  s->tree = new engine::DataTree(shared->train);
  s->train = &shared->train;  // kept alive by `make`
  s->fresh = s->make();
  s->ctx = ContextOf(*s->fresh, static_cast<uint64_t>(s->tree->size()), s->tree->root());
  return s;
}

// examples/fashion-cnn.toml's model on the same synthetic examples as 1 x 28 x 28 images, AdamW
// at batch 128.
const Setup& CnnSetup() {
  static const Setup* setup = [] {
    Result<engine::TaskSpec> cnn = engine::TaskSpec::Load(
        Env::Default(), std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-cnn.toml");
    CHECK(cnn.ok()) << cnn.status().ToString();
    Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(kFashionMlp, "tile-cnn.toml", ".");
    CHECK(spec.ok()) << spec.status().ToString();
    spec->model = cnn->model;
    engine::TaskData data;
    data.train.x = engine::Tensor(
        {kExamples, 1, 28, 28},
        std::vector<float>(Data().train.x.data(), Data().train.x.data() + kExamples * 784));
    data.train.y = Data().train.y;
    data.train.num_classes = 10;
    data.test = data.train;
    return ExampleSetup(std::move(*spec), std::move(data));
  }();
  return *setup;
}

// `toml`'s model on 256 synthetic examples of `shape` (more than 1024 floats: each example's leaf
// is the root of its chunks of 1024 floats, engine::ExampleLeaf), so a first-layer tile's witness
// carries only the chunks it reads.
const Setup* ChunkedSetupOf(const std::string& toml, const std::vector<int64_t>& shape) {
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(toml, "tile-chunked.toml", ".");
  CHECK(spec.ok()) << spec.status().ToString();
  constexpr int64_t kChunkedExamples = 256;
  int64_t floats = 1;
  for (int64_t d : shape) floats *= d;
  engine::TaskData data;
  Rng rng(23);
  std::vector<float> x(static_cast<size_t>(kChunkedExamples * floats));
  for (float& v : x) v = static_cast<float>(rng.UniformDouble()) - 0.5f;
  engine::Shape dims = {kChunkedExamples};
  dims.insert(dims.end(), shape.begin(), shape.end());
  data.train.x = engine::Tensor(dims, x);
  data.train.y.resize(kChunkedExamples);
  for (int32_t& y : data.train.y) y = static_cast<int32_t>(rng.Uniform(10));
  data.train.num_classes = 10;
  data.test = data.train;
  return ExampleSetup(std::move(*spec), std::move(data));
}

// The fashion MLP's layers, 32 wide first, on examples of 3 x 64 x 64 = 12,288 floats (12 chunks)
// at batch 64.
const Setup& ChunkedSetup() {
  static const Setup* setup = [] {
    std::string toml = kFashionMlp;
    toml.replace(toml.find("input = [784]"), 13, "input = [12288]");
    toml.replace(toml.find("out = 256"), 9, "out = 32");
    toml.replace(toml.find("batch_size = 128"), 16, "batch_size = 64");
    return ChunkedSetupOf(toml, {3 * 64 * 64});
  }();
  return *setup;
}

// A first-layer conv2d (4 channels, 3 x 3, pad 1) over 3 x 32 x 32 images (3 chunks, one a
// channel), a relu, a 4 x 4 max-pool and the fashion MLP's last layer, at batch 32.
// The fashion MLP's task with the model `layers` (its [[model.layers]] tables) over images of
// `shape` (chunked), at batch 32.
const Setup* ChunkedLayersSetup(const std::vector<int64_t>& shape, const std::string& layers) {
  std::string toml = kFashionMlp, input;
  for (int64_t d : shape) input += (input.empty() ? "" : ", ") + std::to_string(d);
  const size_t from = toml.find("input = [784]"), to = toml.find("[optimizer]");
  toml.replace(from, to - from, "input = [" + input + "]\n" + layers);
  toml.replace(toml.find("batch_size = 128"), 16, "batch_size = 32");
  return ChunkedSetupOf(toml, shape);
}

const Setup& ChunkedCnnSetup() {
  static const Setup* setup = ChunkedLayersSetup({3, 32, 32}, R"([[model.layers]]
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
out = 10
init = "xavier"
)");
  return *setup;
}

// A first-layer conv2d (4 channels, 3 x 3, pad 0: 62 outputs a row) over 1 x 64 x 64 images (4
// chunks of 16 rows), a relu, a 2 x 2 max-pool and a linear to the 10 classes, at batch 32.
const Setup& StraddlingCnnSetup() {
  static const Setup* setup = ChunkedLayersSetup({1, 64, 64}, R"([[model.layers]]
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
out = 10
init = "xavier"
)");
  return *setup;
}

// A relu, then `conv` (a conv2d table) over `shape`, a relu and a linear to the 10 classes.
const Setup* ConvAfterReluSetup(const std::vector<int64_t>& shape, const std::string& conv) {
  return ChunkedLayersSetup(shape,
                            "[[model.layers]]\nkind = \"relu\"\n" + conv + R"([[model.layers]]
kind = "relu"
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 10
init = "xavier"
)");
}

const Setup* g_setup = nullptr;  // the model the current test plays

std::unique_ptr<Trainer> MakeTrainer() {
  return g_setup->fresh ? std::move(g_setup->fresh) : g_setup->make();
}
const TileRuleContext& Context() { return g_setup->ctx; }

const engine::DataTree& Tree() {
  static const engine::DataTree* tree = new engine::DataTree(Data().train);
  return *tree;
}

int64_t OpIndex(const std::string& name) {
  const TilePlan& plan = Context().plan;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    if (plan.ops[i].name == name) return static_cast<int64_t>(i);
  }
  ADD_FAILURE() << "no operator " << name;
  return 0;
}

enum class LieKind {
  kNone,
  kStepState,    // the state after the step is off (an optimizer moment) while every operator
                 // output it posts is the honest one: the operator chains agree
  kMoment,       // one element of one optimizer moment after the step is off (lie.op names it:
                 // "optim.m.<param>"), in the state and in the operator output it posts alike
  kInputState,   // the step starts from a corrupted weight: its input state differs
  kWrongUpdate,  // the step's update uses twice the learning rate (a real wrong computation)
  kTile,         // one element of one operator's output is off (posted as computed)
  // A lazy solver's claim (node::SkippedUpdateTrace, node/src/adversary.cc; ledger tests cannot
  // link node): the step's forward and backward pass as computed, every parameter after the
  // update the one before it.
  kSkippedUpdate,
};

struct Lie {
  LieKind kind = LieKind::kNone;
  std::string op;  // kTile: the operator
  int64_t row = 0, col = 0;
  int64_t block = 0;  // kTile on a reduction: the first block whose partial sum is off
};

struct StepRecord {
  std::shared_ptr<const OpTrace> trace;  // kept values; a liar shares the honest run's steps
  engine::Batch batch;
  std::vector<Hash256> roots;                  // the output roots the party claims
  std::map<int64_t, std::vector<float>> fake;  // op -> the values it claims instead
};

struct PartyRun {
  Lie lie;
  std::vector<Hash256> state;  // state[s]: after step s
  // The honest run's engine::FlatState after step kLieStep - 1 (a whole step's input) and after
  // step kLieStep.
  std::vector<float> before_lie, after_lie;
  std::vector<StepRecord> steps;  // steps[s] for s >= 1
  // PartialChain's last chain, of (step, operator, tile): the reduction phase asks for one tile's
  // partial sums at every turn, and computing the whole chain anew for each answer was most of a
  // long chain's test time (a wide conv's dW over 19,200 blocks: 62% of it). A run is not changed
  // once trained, so its chain of a tile is too.
  mutable std::optional<std::tuple<uint64_t, int64_t, uint64_t>> chain_of;
  mutable std::vector<std::vector<float>> chain;
  // TileLevels' last levels, of (step, operator), for the same reason (the tile phase asks for
  // the children of one operator's tree at every turn).
  mutable std::optional<std::pair<uint64_t, int64_t>> levels_of;
  mutable std::vector<std::vector<Hash256>> levels;

  std::span<const float> Values(uint64_t s, int64_t op) const {
    const StepRecord& r = steps.at(s);
    auto it = r.fake.find(op);
    if (it != r.fake.end()) return it->second;
    return r.trace->values(static_cast<size_t>(op));
  }
};

// Step st.step + 1 of `tr`'s run as `lie`'s party computes it; `traced`: with its operator trace
// (its outputs kept at the step the game narrows to, the lie's), else no trace and no roots.
StepRecord TrainStep(Trainer& tr, const Lie& lie, bool lying, uint64_t dropout, bool traced) {
  engine::TrainState& st = tr.state();
  StepRecord rec;
  rec.batch = tr.BatchForStep(st.step);
  auto trace = traced ? std::make_shared<OpTrace>() : nullptr;
  if (trace) trace->set_keep_values(lying);  // the game narrows to the lie's step only
  if (lying && lie.kind == LieKind::kInputState) st.model->params()[2].value.data()[5] += 1e-3f;
  std::unique_ptr<engine::Optimizer> right;
  if (lying && lie.kind == LieKind::kWrongUpdate) {
    engine::OptimizerSpec fast = st.optimizer->spec();
    fast.lr *= 2;
    auto wrong = std::make_unique<engine::Optimizer>(fast, st.model->params());
    std::vector<engine::Optimizer::NamedState> from = st.optimizer->State();
    std::vector<engine::Optimizer::NamedState> to = wrong->State();
    for (size_t i = 0; i < from.size(); ++i) *to[i].tensor = *from[i].tensor;
    right = std::exchange(st.optimizer, std::move(wrong));
  }
  st.model->set_op_trace(trace.get());
  engine::StepOnBatch(st, rec.batch, dropout, nullptr, tr.task().micro_batches);
  st.model->set_op_trace(nullptr);
  if (right) {
    std::vector<engine::Optimizer::NamedState> from = st.optimizer->State();
    std::vector<engine::Optimizer::NamedState> to = right->State();
    for (size_t i = 0; i < from.size(); ++i) *to[i].tensor = *from[i].tensor;
    st.optimizer = std::move(right);
  }
  if (trace) rec.roots = trace->hashes();
  rec.trace = std::move(trace);
  return rec;
}

const PartyRun& Honest();

// Whether a liar of `kind` computes the step it lies at as the honest party does, and lies only
// in what it claims or carries on from after it.
bool LiesAfterTheStep(LieKind kind) {
  return kind == LieKind::kStepState || kind == LieKind::kMoment || kind == LieKind::kTile ||
         kind == LieKind::kSkippedUpdate;
}

// A trainer of the current model for a liar, kept from the run before (the honest run's first):
// a liar starts from a state of the honest run (Load), so the model's initialisation (a normal
// draw per parameter) is not paid again for every lie.
std::unique_ptr<Trainer>& SpareTrainer() {
  static std::map<const Setup*, std::unique_ptr<Trainer>> spares;
  return spares[g_setup];
}

// Puts `tr` at `flat` (engine::FlatState's layout) after `step` steps of its own stream: the
// state engine::StateFromFlat builds, with the trainer's model and optimizer.
void Load(Trainer& tr, std::span<const float> flat, uint64_t step) {
  engine::TrainState& st = tr.state();
  Result<engine::TrainState> loaded = engine::StateFromFlat(
      st.model->spec(), st.optimizer->spec(), flat, static_cast<int64_t>(step), st.seed, st.stream);
  CHECK(loaded.ok()) << loaded.status().ToString();
  st = std::move(*loaded);
}

// A party's run of steps 1..kSteps. The honest run (Lie{}) trains them all. A liar's run is the
// honest one up to the step it lies at, so it shares the honest run's records and states of the
// steps before. A liar that computes that step starts from the honest state after step
// kLieStep - 1 (its hash computed anew: the callers check it against the honest run's); one that
// lies after the step's computation (LiesAfterTheStep) shares the honest record of step kLieStep
// too and carries on from the honest state after it, changed as it lies. The steps after the
// lie's give only the liar's claim (the state after the last), and the game never narrows to
// them: the liar does not trace them.
PartyRun Train(const Lie& lie) {
  const bool liar = lie.kind != LieKind::kNone;
  const PartyRun* honest = liar ? &Honest() : nullptr;
  std::unique_ptr<Trainer> tr = liar && SpareTrainer() ? std::move(SpareTrainer()) : MakeTrainer();
  engine::TrainState& st = tr->state();
  const uint64_t dropout = engine::DropoutSeed(tr->task().seed, tr->task().stream);
  PartyRun run;
  run.lie = lie;
  uint64_t first = 1;
  if (!liar) {
    run.state.push_back(engine::StateHash(st));
    run.steps.emplace_back();
  } else if (LiesAfterTheStep(lie.kind)) {
    run.state.assign(honest->state.begin(), honest->state.begin() + kLieStep);
    run.steps.assign(honest->steps.begin(), honest->steps.begin() + kLieStep);
    first = kLieStep;
  } else {
    run.state.assign(honest->state.begin(), honest->state.begin() + (kLieStep - 1));
    run.steps.assign(honest->steps.begin(), honest->steps.begin() + kLieStep);
    Load(*tr, honest->before_lie, kLieStep - 1);
    run.state.push_back(engine::StateHash(st));
    first = kLieStep;
  }
  for (uint64_t s = first; s <= kSteps; ++s) {
    const bool lying = s == kLieStep;
    if (lying && !liar) run.before_lie = engine::FlatState(st);
    StepRecord rec;
    if (liar && lying && LiesAfterTheStep(lie.kind)) {
      rec = honest->steps.at(kLieStep);
      Load(*tr, honest->after_lie, kLieStep);
    } else {
      rec = TrainStep(*tr, lie, lying, dropout, !liar || lying);
      if (lying && !liar) run.after_lie = engine::FlatState(st);
    }
    if (lying && lie.kind == LieKind::kStepState)
      st.optimizer->State()[0].tensor->data()[0] += 1e-3f;
    if (lying && lie.kind == LieKind::kMoment) {
      // A lie in the state only, shown by the operator that records the moment after the update:
      // the state it carries on from and the output root it posts hold the same wrong element.
      const int64_t op = OpIndex(lie.op);
      const engine::TileGrid& g = rec.trace->grid(static_cast<size_t>(op));
      const size_t e = static_cast<size_t>(lie.row * g.cols + lie.col);
      engine::Tensor* moment = nullptr;
      for (const engine::Optimizer::NamedState& ns : st.optimizer->State()) {
        if (ns.name == lie.op) moment = ns.tensor;
      }
      CHECK(moment != nullptr) << "no optimizer moment " << lie.op;
      moment->data()[e] += 0.25f;
      std::span<const float> v = rec.trace->values(static_cast<size_t>(op));
      std::vector<float> fake(v.begin(), v.end());
      fake.at(e) += 0.25f;
      rec.roots[static_cast<size_t>(op)] = engine::TensorRoot(fake, g);
      rec.fake[op] = std::move(fake);
    }
    if (lying && lie.kind == LieKind::kTile) {
      const int64_t op = OpIndex(lie.op);
      const engine::TileGrid& g = rec.trace->grid(static_cast<size_t>(op));
      std::span<const float> v = rec.trace->values(static_cast<size_t>(op));
      std::vector<float> fake(v.begin(), v.end());
      fake.at(static_cast<size_t>(lie.row * g.cols + lie.col)) +=
          0.25f;  // a lie off the grid throws
      rec.roots[static_cast<size_t>(op)] = engine::TensorRoot(fake, g);
      rec.fake[op] = std::move(fake);
      // The liar carries on from a state of its own.
      st.model->params()[0].value.data()[0] += 1e-3f;
    }
    if (lying && lie.kind == LieKind::kSkippedUpdate) {
      const TilePlan& plan = Context().plan;
      for (size_t op = 0; op < plan.ops.size(); ++op) {
        const engine::TileOp& o = plan.ops[op];
        const int64_t from = engine::UpdatedStateOperand(o);
        if (from < 0) continue;
        std::span<const float> before = rec.trace->values(static_cast<size_t>(from));
        std::vector<float> fake(before.begin(), before.end());
        rec.roots[op] = engine::TensorRoot(fake, o.grid);
        rec.fake[static_cast<int64_t>(op)] = std::move(fake);
      }
      st.model->params()[0].value.data()[0] += 1e-3f;
    }
    // The state after a step as its trace committed it (its output state's roots), unless the
    // liar changed its state after the step's computation.
    const bool as_traced = rec.trace && !(liar && lying);
    run.steps.push_back(std::move(rec));
    run.state.push_back(as_traced ? engine::StateHashOfTracedStep(st, *run.steps.back().trace)
                                  : engine::StateHash(st));
  }
  SpareTrainer() = std::move(tr);
  return run;
}

// C_j of step s in `run`: C_0 is the state the step starts from.
Hash256 ChainHash(const PartyRun& run, uint64_t s, uint64_t j) {
  Hash256 c = run.state.at(s - 1);
  for (uint64_t op = 1; op <= j; ++op) {
    c = protocol::OperatorChainHash(c, run.steps.at(s).roots.at(op - 1));
  }
  return c;
}

// The Merkle levels over op `op`'s tiles as the party claims them: levels[0] the leaf nodes.
const std::vector<std::vector<Hash256>>& TileLevels(const PartyRun& run, uint64_t s, int64_t op) {
  if (run.levels_of == std::make_pair(s, op)) return run.levels;
  const engine::TileGrid& g = Context().plan.ops[static_cast<size_t>(op)].grid;
  std::vector<Hash256> hashes = engine::TileHashes(run.Values(s, op), g);
  std::vector<std::vector<Hash256>> levels(1);
  for (const Hash256& h : hashes) levels[0].push_back(MerkleLeafHash(h));
  while (levels.back().size() > 1) {
    const std::vector<Hash256>& l = levels.back();
    std::vector<Hash256> next;
    for (size_t i = 0; i + 1 < l.size(); i += 2) next.push_back(MerkleInnerHash(l[i], l[i + 1]));
    if (l.size() % 2 == 1) next.push_back(l.back());
    levels.push_back(std::move(next));
  }
  EXPECT_EQ(levels.back()[0], run.steps.at(s).roots.at(static_cast<size_t>(op)));
  run.levels_of = std::make_pair(s, op);
  run.levels = std::move(levels);
  return run.levels;
}

// The party's partial sums S_0..S_K of a reduction tile (S_K: the tile it claims).
const std::vector<std::vector<float>>& PartialChain(const PartyRun& run, uint64_t s, int64_t op,
                                                    uint64_t tile) {
  if (run.chain_of == std::make_tuple(s, op, tile)) return run.chain;
  const TilePlan& plan = Context().plan;
  const StepRecord& r = run.steps.at(s);
  Result<std::vector<std::vector<float>>> chain = engine::ReductionChain(
      plan, op, static_cast<int64_t>(tile), static_cast<int64_t>(s) - 1, *r.trace, r.batch);
  CHECK(chain.ok()) << chain.status().ToString();
  auto it = r.fake.find(op);
  if (it != r.fake.end()) {
    const engine::TileGrid& g = plan.ops[static_cast<size_t>(op)].grid;
    const engine::TileGrid::Rect rect = g.TileRect(static_cast<int64_t>(tile));
    const Lie& lie = run.lie;
    if (lie.row >= rect.r0 && lie.row < rect.r1 && lie.col >= rect.c0 && lie.col < rect.c1) {
      const size_t e =
          static_cast<size_t>((lie.row - rect.r0) * (rect.c1 - rect.c0) + (lie.col - rect.c0));
      for (size_t k = static_cast<size_t>(lie.block) + 1; k < chain->size(); ++k) {
        if (k + 1 < chain->size()) (*chain)[k][e] += 0.25f;  // S_k; the last is the fake tile
      }
      chain->back() = engine::ExtractTile(it->second, g, static_cast<int64_t>(tile));
    }
  }
  run.chain_of = std::make_tuple(s, op, tile);
  run.chain = std::move(*chain);
  return run.chain;
}

struct Move {
  Hash256 hash;
  std::optional<std::pair<Hash256, Hash256>> children;
};

Move Answer(const PartyRun& run, const DisputeQuery& q) {
  if (q.stage != DisputeStage::kDisputeSteps && !run.steps.at(q.step).trace) {
    ADD_FAILURE() << "the game narrowed to step " << q.step << ", not the lie's (" << kLieStep
                  << "): the liar did not trace it";
    return {};
  }
  switch (q.stage) {
    case DisputeStage::kDisputeSteps:
      return {run.state.at(q.position), std::nullopt};
    case DisputeStage::kDisputeOperators:
      return {ChainHash(run, q.step, q.position), std::nullopt};
    case DisputeStage::kDisputeTiles: {
      const int64_t op = static_cast<int64_t>(q.operator_index) - 1;
      if (!q.children)
        return {run.steps.at(q.step).roots.at(static_cast<size_t>(op)), std::nullopt};
      const std::vector<std::vector<Hash256>>& levels = TileLevels(run, q.step, op);
      const std::vector<Hash256>& below = levels.at(q.level - 1);
      return {Hash256{}, std::make_pair(below.at(2 * q.position), below.at(2 * q.position + 1))};
    }
    case DisputeStage::kDisputeReduction: {
      const int64_t op = static_cast<int64_t>(q.operator_index) - 1;
      return {engine::TileHash(PartialChain(run, q.step, op, q.tile).at(q.position)), std::nullopt};
    }
    default:
      ADD_FAILURE() << "no move in stage " << protocol::DisputeStageName(q.stage);
      return {};
  }
}

// The witness for a tile task, built from `run` by the ledger library's BuildTileWitness (anyone
// holding the agreed inputs can: every input is agreed, so the liar's witness is the honest one's).
TileWitness BuildWitness(const PartyRun& run, const RefereeTask& task) {
  const StepRecord& r = run.steps.at(task.step);
  Result<TileWitness> w = BuildTileWitness(Context(), task, *r.trace, r.batch, g_setup->train,
                                           g_setup->tree, g_setup->pages);
  CHECK(w.ok()) << w.status().ToString();
  return std::move(*w);
}

struct Silence {
  DisputeStage stage = DisputeStage::kDisputeResolved;  // never: nobody is silent
  bool children = false;                                // kDisputeTiles: at the children
  DisputeParty party = DisputeParty::kDefender;
};

struct Played {
  std::optional<RefereeTask> task;
  DisputeOutcome outcome;
  uint32_t turns = 0;
  size_t witness_bytes = 0;
};

size_t g_largest_witness = 0;

DisputeConfig Config(const PartyRun& defender, const PartyRun& challenger) {
  DisputeConfig c;
  c.unit = protocol::UnitId{Blake2b("tile-dispute"), 0, 0};
  c.defender.bytes.fill(1);
  c.challenger.bytes.fill(2);
  c.first_step = 0;
  c.last_step = kSteps;
  c.agreed = defender.state[0];
  c.defender_claim = defender.state[kSteps];
  c.challenger_claim = challenger.state[kSteps];
  c.num_operators = static_cast<uint32_t>(Context().plan.ops.size());
  c.response_blocks = 5;
  c.start_height = 100;
  SetTilePhase(Context().plan, &c);
  return c;
}

Played Play(const PartyRun& defender, const PartyRun& challenger, const PartyRun& honest,
            std::optional<Silence> silence = std::nullopt) {
  Played p;
  Result<DisputeGame> created = DisputeGame::Create(Config(defender, challenger));
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return p;
  DisputeGame g = std::move(*created);
  uint64_t height = g.config().start_height;
  while (g.stage() != DisputeStage::kDisputeReferee &&
         g.stage() != DisputeStage::kDisputeResolved) {
    const DisputeQuery q = g.query();
    ++height;
    const bool quiet = silence && q.stage == silence->stage &&
                       (q.stage != DisputeStage::kDisputeTiles || q.children == silence->children);
    for (DisputeParty party : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
      if (quiet && silence->party == party) continue;
      const Move m = Answer(party == DisputeParty::kDefender ? defender : challenger, q);
      Status s = m.children ? g.PostChildren(party, q.position, m.children->first,
                                             m.children->second, height)
                            : g.Post(party, q.position, m.hash, height);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    if (quiet) {
      height = q.deadline_height + 1;
      EXPECT_TRUE(g.OnBlock(height).ok());
      EXPECT_EQ(g.stage(), DisputeStage::kDisputeResolved);
    } else {
      EXPECT_TRUE(g.OnBlock(height).ok());
    }
    const Bytes bytes = g.Encode();
    EXPECT_EQ(bytes[0], g.referee_task().roots == protocol::RefereeRoots::kRootsNone ? 2 : 3)
        << "a game with the tile phase encodes as version 2 (3: its referee task ruled from "
           "roots)";
    Result<DisputeGame> decoded = DisputeGame::Decode(bytes);
    EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
    if (!decoded.ok()) return p;
    EXPECT_EQ(decoded->Encode(), bytes);
    g = std::move(*decoded);
  }
  if (g.stage() == DisputeStage::kDisputeReferee) {
    p.task = g.referee_task();
    if (p.task->tile) {
      const TileWitness w = BuildWitness(defender, *p.task);
      const Bytes encoded = EncodeTileWitness(w);
      p.witness_bytes = encoded.size();
      g_largest_witness = std::max(g_largest_witness, encoded.size());
      Result<TileWitness> decoded = DecodeTileWitness(encoded);
      EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
      Result<Hash256> ruled = RuleTile(Context(), *p.task, decoded.ok() ? *decoded : w);
      EXPECT_TRUE(ruled.ok()) << ruled.status().ToString();
      if (ruled.ok()) {
        EXPECT_TRUE(g.Rule(*ruled).ok());
      }
    } else if (RulesFromRoots(Context().plan, *p.task)) {
      // A whole step that follows from roots: the witness is the honest run's operator output
      // roots (anyone's run of the step from the agreed state gives the same), and RuleRoots
      // gives the true state after the step, or the true C_j of the input-state operator.
      const StepRecord& r = honest.steps.at(p.task->step);
      Result<TileWitness> w =
          BuildTileWitness(Context(), *p.task, *r.trace, r.batch, nullptr, nullptr, nullptr);
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      if (!w.ok()) return p;
      const Bytes encoded = EncodeTileWitness(*w);
      p.witness_bytes = encoded.size();
      Result<TileWitness> decoded = DecodeTileWitness(encoded);
      EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
      Result<Hash256> ruled = RuleRoots(Context(), *p.task, decoded.ok() ? *decoded : *w);
      EXPECT_TRUE(ruled.ok()) << ruled.status().ToString();
      if (ruled.ok() && p.task->roots == protocol::RefereeRoots::kRootsChainEnd) {
        EXPECT_EQ(*ruled, honest.state.at(p.task->step)) << "the true state after the step";
        EXPECT_TRUE(g.Rule(*ruled).ok());
      } else if (ruled.ok()) {
        EXPECT_EQ(*ruled, ChainHash(honest, p.task->step, p.task->operator_index));
        EXPECT_TRUE(g.RuleOperator(*ruled).ok());
      }
    } else {
      // The whole step: the ledger's existing referee (ExecuteRefereeStepWitness) computes the
      // state after it; here the honest run's, which is the task's true state.
      EXPECT_TRUE(p.task->whole_step);
      EXPECT_TRUE(g.Rule(honest.state.at(p.task->step)).ok());
    }
  }
  EXPECT_EQ(g.stage(), DisputeStage::kDisputeResolved);
  p.outcome = g.outcome();
  p.turns = g.turns();
  return p;
}

uint32_t CeilLog2(uint64_t n) { return n <= 1 ? 0 : static_cast<uint32_t>(std::bit_width(n - 1)); }

const PartyRun& Honest() {
  static std::map<const Setup*, PartyRun> runs;  // owned: LeakSanitizer sees no lost run
  auto it = runs.find(g_setup);
  if (it == runs.end()) it = runs.emplace(g_setup, Train(Lie{})).first;
  return it->second;
}

// Plays `lie` in both roles: the game must reach the lie's operator and tile (and block), and
// the rule must make the honest side win. `want_roots`: a whole step ruled from roots, of that
// kind.
void ExpectTheHonestSideWins(
    const Lie& lie, bool want_whole_step,
    protocol::RefereeRoots want_roots = protocol::RefereeRoots::kRootsNone) {
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(lie);
  for (uint64_t s = 0; s < kLieStep; ++s) ASSERT_EQ(honest.state[s], liar.state[s]) << s;
  ASSERT_NE(honest.state[kSteps], liar.state[kSteps]);
  for (DisputeParty liar_role : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
    SCOPED_TRACE("liar: " + std::string(protocol::DisputePartyName(liar_role)));
    const bool defender_lies = liar_role == DisputeParty::kDefender;
    Played p = defender_lies ? Play(liar, honest, honest) : Play(honest, liar, honest);
    ASSERT_TRUE(p.task.has_value()) << p.outcome.reason;
    EXPECT_EQ(p.task->step, kLieStep);
    EXPECT_EQ(p.task->whole_step, want_whole_step);
    if (want_roots != protocol::RefereeRoots::kRootsNone) {
      EXPECT_EQ(p.task->roots, want_roots);
      EXPECT_TRUE(RulesFromRoots(Context().plan, *p.task));
      EXPECT_GT(p.witness_bytes, 0u);
      EXPECT_LE(p.witness_bytes, kMaxTileWitnessBytes);
      std::printf("[ roots    ] %s: %2u turns, witness %6zu bytes\n",
                  want_roots == protocol::RefereeRoots::kRootsChainEnd
                      ? "chain end agreed"
                      : ("input-state operator " + std::to_string(p.task->operator_index)).c_str(),
                  p.turns, p.witness_bytes);
    }
    if ((lie.kind == LieKind::kTile || lie.kind == LieKind::kMoment) && !want_whole_step) {
      const int64_t op = OpIndex(lie.op);
      const engine::TileOp& o = Context().plan.ops[static_cast<size_t>(op)];
      EXPECT_EQ(p.task->operator_index, static_cast<uint32_t>(op + 1));
      EXPECT_TRUE(p.task->tile);
      EXPECT_EQ(p.task->tile_index, static_cast<uint64_t>(o.grid.TileAt(lie.row, lie.col)));
      EXPECT_EQ(p.task->block, engine::ReductionBlocks(Context().plan, op) > 0
                                   ? static_cast<uint32_t>(lie.block)
                                   : 0u);
      const uint32_t bound = CeilLog2(kSteps) + 1 + CeilLog2(Context().plan.ops.size()) + 1 +
                             CeilLog2(o.grid.count()) +
                             CeilLog2(engine::ReductionBlocks(Context().plan, op));
      EXPECT_LE(p.turns, bound);
      EXPECT_LE(p.witness_bytes, kMaxTileWitnessBytes);
      std::printf("[ tile     ] %-22s tile %4llu block %u: %2u turns, witness %6zu bytes\n",
                  lie.op.c_str(), static_cast<unsigned long long>(p.task->tile_index),
                  p.task->block, p.turns, p.witness_bytes);
    }
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    EXPECT_FALSE(p.outcome.undecided);
  }
}

// Plays every lie of `lies` in both roles, each to be ruled by tile for the honest side, and
// holds the largest witness they needed to the bound (printed for `model`).
void ExpectTheHonestSideWinsAtEveryTile(const std::vector<Lie>& lies, const char* model) {
  g_largest_witness = 0;
  for (const Lie& lie : lies) {
    SCOPED_TRACE(lie.op);
    ExpectTheHonestSideWins(lie, false);
  }
  std::printf("[ tile     ] %s, largest witness: %zu bytes (bound %zu)\n", model, g_largest_witness,
              kMaxTileWitnessBytes);
  EXPECT_LE(g_largest_witness, kMaxTileWitnessBytes);
}

TEST(TileDisputeTest, ALieAtOneTileOfEveryKindOfOperatorLosesToTheTileRule) {
  g_setup = &FashionSetup();
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 40, 40},               // matmul on the batch's examples
      {LieKind::kTile, "layers.1.out", 5, 200},               // relu
      {LieKind::kTile, "layers.2.out", 100, 70},              // matmul on an activation
      {LieKind::kTile, "loss", 77, 0},                        // softmax cross-entropy
      {LieKind::kTile, "logits.grad", 3, 7},                  // its gradient
      {LieKind::kTile, "layers.4.in.grad", 64, 100},          // linear dX
      {LieKind::kTile, "layers.3.in.grad", 10, 10},           // relu backward
      {LieKind::kTile, "layers.0.weight.grad", 200, 700, 2},  // dW over the batch: narrowed
      {LieKind::kTile, "layers.2.weight.grad", 3, 4, 0},
      {LieKind::kTile, "layers.4.bias.grad", 0, 7, 3},  // db over the batch: narrowed
      {LieKind::kTile, "layers.2.weight", 50, 60},      // the AdamW update
      {LieKind::kTile, "layers.4.bias", 0, 2},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "fashion MLP");
}

TEST(TileDisputeTest, AWrongComputationAtAnOperatorIsNarrowedToATileAndLoses) {
  g_setup = &FashionSetup();
  // Twice the learning rate: forward and backward agree, the first differing output is the first
  // updated parameter, every tile of it differs; the game takes the first.
  ExpectTheHonestSideWins(Lie{LieKind::kWrongUpdate}, false);
}

// A lie in the state only whose operator outputs are the honest ones: the chains agree at C_n
// while the state hashes differ, so no operator is disputed; the game ends at the whole step,
// which the agreed C_n decides from roots (the state hash is StateHashOfRoots of the step's last
// operator outputs): RuleRoots gives the true state from the n output roots.
TEST(TileDisputeTest, ALieInTheStateOnlyWithHonestOperatorsIsRuledFromRoots) {
  g_setup = &FashionSetup();
  ExpectTheHonestSideWins(Lie{LieKind::kStepState}, true, protocol::RefereeRoots::kRootsChainEnd);
}

// A lie in an optimizer moment only (the parameters after the step are right): the moments after
// the update are operators of the step (op_trace.h), so the game narrows to the lied tile of the
// moment and the tile rule recomputes it from the same footprint as the parameter's update.
TEST(TileDisputeTest, ALieInAnOptimizerMomentOnlyLosesToTheTileRule) {
  g_setup = &FashionSetup();
  const std::vector<Lie> lies = {
      {LieKind::kMoment, "optim.m.layers.0.weight", 200, 700},
      {LieKind::kMoment, "optim.v.layers.2.weight", 50, 60},
      {LieKind::kMoment, "optim.v.layers.4.bias", 0, 7},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "fashion MLP, moments");
}

TEST(TileDisputeTest, ALieInTheStepsInputStateIsRuledFromRoots) {
  g_setup = &FashionSetup();
  // The liar posts a wrong root of an "in.<name>" operator (its step starts from a corrupted
  // weight): the game ends at that operator, which has no tiles; the agreed input state hash is
  // StateHashOfRoots of the state's tensor roots, so those roots give its true C_j.
  ExpectTheHonestSideWins(Lie{LieKind::kInputState}, true, protocol::RefereeRoots::kRootsOperator);
}

// A roots witness that does not check out is refused, naming what: a wrong root (the chain or the
// state hash does not come out), one root too few, a tile or an example beside the roots; a task
// that is not ruled from roots is refused too. The honest witness still rules for the honest side.
TEST(TileDisputeTest, AWrongRootsWitnessIsRefused) {
  g_setup = &FashionSetup();
  const PartyRun& honest = Honest();
  for (LieKind kind : {LieKind::kStepState, LieKind::kInputState}) {
    const PartyRun liar = Train(Lie{kind});
    Result<DisputeGame> g = DisputeGame::Create(Config(liar, honest));
    ASSERT_TRUE(g.ok());
    uint64_t height = g->config().start_height;
    while (g->stage() != DisputeStage::kDisputeReferee) {
      ASSERT_NE(g->stage(), DisputeStage::kDisputeResolved);
      const DisputeQuery q = g->query();
      ++height;
      ASSERT_TRUE(g->Post(DisputeParty::kDefender, q.position, Answer(liar, q).hash, height).ok());
      ASSERT_TRUE(
          g->Post(DisputeParty::kChallenger, q.position, Answer(honest, q).hash, height).ok());
    }
    const RefereeTask task = g->referee_task();
    ASSERT_TRUE(RulesFromRoots(Context().plan, task));
    const StepRecord& r = honest.steps.at(task.step);
    Result<TileWitness> good =
        BuildTileWitness(Context(), task, *r.trace, r.batch, nullptr, nullptr, nullptr);
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    auto refused = [&](const TileWitness& w, const std::string& why) {
      Result<Hash256> out = RuleRoots(Context(), task, w);
      ASSERT_FALSE(out.ok()) << why;
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().ToString();
      EXPECT_NE(out.status().message().find(why), std::string::npos) << out.status().ToString();
    };
    TileWitness w = *good;
    w.outputs.back().bytes[3] ^= 1;
    refused(w, kind == LieKind::kStepState ? "not to the agreed C_" : "not the agreed input state");
    w = *good;
    w.outputs.front().bytes[0] ^= 1;
    refused(w, kind == LieKind::kStepState ? "not to the agreed C_" : "not the agreed input state");
    w = *good;
    w.outputs.pop_back();
    refused(w, "operator output roots");
    w = *good;
    w.tiles.push_back(TileWitnessTile{1, 0, {1.0f}, {}});
    refused(w, "holds operator output roots only");
    w = *good;
    w.examples.push_back(StepWitnessExample{});
    refused(w, "holds operator output roots only");
    // The liar's own run does not give the agreed roots of an input state it changed.
    if (kind == LieKind::kInputState) {
      const StepRecord& lr = liar.steps.at(task.step);
      Result<TileWitness> lw =
          BuildTileWitness(Context(), task, *lr.trace, lr.batch, nullptr, nullptr, nullptr);
      ASSERT_TRUE(lw.ok());
      refused(*lw, "not the agreed input state");
    }
    // A tile task is not ruled from roots, nor is a roots task by the tile rule.
    RefereeTask not_roots = task;
    not_roots.roots = protocol::RefereeRoots::kRootsNone;
    EXPECT_EQ(RuleRoots(Context(), not_roots, *good).status().code(),
              StatusCode::kFailedPrecondition);
    EXPECT_FALSE(RuleTile(Context(), task, *good).ok());
    // The honest witness rules for the honest challenger.
    Result<Hash256> out = RuleRoots(Context(), task, *good);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    if (task.roots == protocol::RefereeRoots::kRootsChainEnd) {
      ASSERT_TRUE(g->Rule(*out).ok());
    } else {
      ASSERT_TRUE(g->RuleOperator(*out).ok());
    }
    EXPECT_TRUE(g->outcome().challenger_honest) << g->outcome().reason;
    EXPECT_FALSE(g->outcome().defender_honest) << g->outcome().reason;
  }
}

TEST(TileDisputeTest, APartySilentAtAnyPhaseLoses) {
  g_setup = &FashionSetup();
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.0.weight.grad", 200, 700, 2});
  const std::vector<Silence> phases = {
      {DisputeStage::kDisputeSteps, false},     {DisputeStage::kDisputeOperators, false},
      {DisputeStage::kDisputeTiles, false},  // the output root
      {DisputeStage::kDisputeTiles, true},   // the children of a node
      {DisputeStage::kDisputeReduction, false},
  };
  for (Silence silence : phases) {
    for (DisputeParty silent : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
      for (bool defender_lies : {true, false}) {
        silence.party = silent;
        SCOPED_TRACE(std::string(protocol::DisputeStageName(silence.stage)) +
                     (silence.children ? " (children)" : "") + ", " +
                     std::string(protocol::DisputePartyName(silent)) + " silent, " +
                     (defender_lies ? "defender" : "challenger") + " lies");
        Played p = defender_lies ? Play(liar, honest, honest, silence)
                                 : Play(honest, liar, honest, silence);
        EXPECT_FALSE(p.task.has_value()) << "the game ended at the missed deadline";
        EXPECT_EQ(p.outcome.defender_honest, silent != DisputeParty::kDefender);
        EXPECT_EQ(p.outcome.challenger_honest, silent != DisputeParty::kChallenger);
        EXPECT_EQ(p.outcome.reason,
                  std::string(protocol::DisputePartyName(silent)) + " missed its turn");
      }
    }
  }
}

TEST(TileDisputeTest, OnThe10mGptALieAtACoveredTileLosesToTheTileRule) {
  g_setup = &GptSetup();
  const std::vector<Lie> lies = {
      {LieKind::kTile, "h.0.qkv", 100, 500},
      {LieKind::kTile, "h.5.fcproj", 7, 300, 3},  // 4C = 1536 inputs: narrowed into 6 blocks
      {LieKind::kTile, "logits", 200, 100},       // the tied LM head
      // The row-wise and attention operators (whole input rows; q and k of the sequence so far):
      {LieKind::kTile, "h.2.ln2", 200, 200},
      {LieKind::kTile, "h.3.att", 1279, 100},  // head 4's last position: k over all 256 rows
      {LieKind::kTile, "h.4.atty", 255, 50},
      {LieKind::kTile, "h.1.residual2", 100, 383},
      {LieKind::kTile, "h.0.fch_gelu", 10, 1000},
      // The clipped update (grad_clip = 1.0) and the global norm its scale comes from: a partial
      // sum of squares of 1024 gradient elements (tile 4, its partial 904: narrowed to it), the
      // norm's chain over the 76 parameters (off from parameter 40 on), an updated tile.
      {LieKind::kTile, "grad_norm.blocks", 0, 5000, 904},
      {LieKind::kTile, "grad_norm", 0, 0, 40},
      {LieKind::kTile, "transformer.wte.weight", 100, 200},
      {LieKind::kTile, "transformer.h.3.mlp.c_fc.weight", 1000, 300},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "10M GPT");
}

// The attention forward over a sequence of T = 288 (narrowed: att's 9 max blocks, 9 sum blocks and
// its output block; atty's 9 blocks of its chain), each side lying: the game narrows to the block
// the lie starts at and the ledger rules it from the agreed partial (the rows' maxima, then maxima
// and sums, then the tile's accumulators) for the honest side.
TEST(TileDisputeTest, ALieInTheNarrowedAttentionOfALongSequenceLosesToTheTileRule) {
  g_setup = &LongGptSetup();
  const int64_t att = OpIndex("h.0.att");
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, att), 19);
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("h.0.atty")), 9);
  // att row 384 is sequence 0, head 1, position 96 (tile row 384..415); element 5 of the tile
  // (column 69) is also row 5's entry of the maxima and sums the partials carry.
  const std::vector<Lie> lies = {
      {LieKind::kTile, "h.0.att", 384, 69, 3},   // from a max block on
      {LieKind::kTile, "h.0.att", 384, 69, 11},  // from a sum block on
      {LieKind::kTile, "h.0.att", 384, 69, 18},  // the output block only
      {LieKind::kTile, "h.0.atty", 300, 10, 5},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "GPT at T = 288");
}

// The attention backward over a sequence of T = 288 (narrowed: 81 blocks of the softmax
// backward's row sums, query block x key block, then 9 blocks of its chain), each side lying:
// a lie in a row sum (a q/k tile's partial starts with its two heads' 288 sums each), one in the
// accumulators of a chain block, and one in a dv tile's last block; the ledger rules each from
// the agreed partial for the honest side.
TEST(TileDisputeTest, ALieInTheNarrowedAttentionBackwardOfALongSequenceLosesToTheTileRule) {
  g_setup = &LongGptSetup();
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("h.0.qkv.grad")), 90);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "h.0.qkv.grad", 100, 5, 30},   // dq's tile: a row-sum block
      {LieKind::kTile, "h.0.qkv.grad", 127, 31, 85},  // dk of head 1: an accumulator, chain block 4
      {LieKind::kTile, "h.0.qkv.grad", 300, 40, 89},  // dv: the last block
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "GPT at T = 288, attention backward");
}

// The 10M GPT (a token task) at the two whole steps that follow from roots, each side lying: a
// lie in the state only (the chain end agreed: a witness of its 655 operator output roots) and a
// lie in the step's input state (an "in.<name>" operator: its 228 tensor roots). Slow.
TEST(TileDisputeTest, OnThe10mGptTheWholeStepsThatFollowFromRootsAreRuledFromRoots) {
  g_setup = &GptSetup();
  ExpectTheHonestSideWins(Lie{LieKind::kStepState}, true, protocol::RefereeRoots::kRootsChainEnd);
  ExpectTheHonestSideWins(Lie{LieKind::kInputState}, true, protocol::RefereeRoots::kRootsOperator);
}

// The 10M GPT's gradients with footprints (all but the embeddings', the token loss's and the
// attention backward's): the LM head's input gradient (a chain over the 172 logits), the
// linears' input gradients (narrowed above 1024 outputs), the gelu's, the layernorms' backward
// (input gradients from whole rows, added into the residual gradient; weight and bias gradients)
// and the linears' weight and bias gradients. The parameter gradients are chains over the 256
// rows, narrowed into blocks of 32; the lie starts at the block named.
TEST(TileDisputeTest, OnThe10mGptALieAtAGradientTileLosesToTheTileRule) {
  g_setup = &GptSetup();
  const std::vector<Lie> lies = {
      {LieKind::kTile, "ln_f.grad", 100, 200},
      {LieKind::kTile, "residual.grad", 255, 383},  // ln_f's backward: whole rows
      {LieKind::kTile, "transformer.ln_f.weight.grad", 0, 300, 4},
      {LieKind::kTile, "transformer.ln_f.bias.grad", 0, 10, 0},
      {LieKind::kTile, "h.5.fch_gelu.grad", 30, 1500},  // the down projection's dX
      {LieKind::kTile, "h.3.fch.grad", 100, 1000},      // the gelu's
      {LieKind::kTile, "h.2.ln2.grad", 64, 64, 4},  // the up projection's: 1536 outputs, narrowed
      {LieKind::kTile, "h.4.residual3.grad", 200, 10},  // ln2's backward + the residual gradient
      {LieKind::kTile, "h.0.atty.grad", 255, 0},
      {LieKind::kTile, "h.1.ln1.grad", 128, 300, 2},  // qkv's dX: 1152 outputs, narrowed
      {LieKind::kTile, "h.1.residual.grad", 3, 3},
      {LieKind::kTile, "transformer.h.2.ln_1.weight.grad", 0, 100, 6},
      {LieKind::kTile, "transformer.h.3.ln_2.bias.grad", 0, 383, 1},
      {LieKind::kTile, "transformer.h.2.attn.c_attn.weight.grad", 500, 100, 3},
      {LieKind::kTile, "transformer.h.0.attn.c_attn.bias.grad", 0, 1100, 0},
      {LieKind::kTile, "transformer.h.1.attn.c_proj.weight.grad", 383, 383, 7},
      {LieKind::kTile, "transformer.h.1.attn.c_proj.bias.grad", 0, 50, 5},
      {LieKind::kTile, "transformer.h.4.mlp.c_fc.weight.grad", 1000, 300, 6},
      {LieKind::kTile, "transformer.h.3.mlp.c_fc.bias.grad", 0, 1200, 2},
      {LieKind::kTile, "transformer.h.5.mlp.c_proj.weight.grad", 100, 1500, 1},
      {LieKind::kTile, "transformer.h.5.mlp.c_proj.bias.grad", 0, 7, 4},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "10M GPT gradients");
}

DisputeGame GameAtReferee(const PartyRun& liar);
void ExpectRefused(const RefereeTask& task, const TileWitness& w, const std::string& what);

// The 10M GPT's token operators, their batch rows' tokens proven by the pages of the train stream
// that hold them (the task's data root): encoded (the rows' tokens, wte's column strip, wpe's
// rows), the token loss and its gradient (the logits rows, their targets), wte's gradient (the
// tied head's dW chain over the rows, blocks 0-7, then the rows by token, blocks 8-15) and wpe's
// (the rows by position; block 2 holds positions 64-95); and the attention backward (qkv.grad: a
// tile of one head's q, k or v gradient, its chains over the sequence's 256 positions narrowed
// into blocks of 32).
TEST(TileDisputeTest, OnThe10mGptALieAtATokenOperatorOrTheAttentionBackwardLoses) {
  g_setup = &GptSetup();
  const std::vector<Lie> lies = {
      {LieKind::kTile, "encoded", 100, 200},
      {LieKind::kTile, "loss", 77, 0},
      {LieKind::kTile, "logits.grad", 200, 100},
      {LieKind::kTile, "transformer.wte.weight.grad", 50, 100, 3},   // the head's chain
      {LieKind::kTile, "transformer.wte.weight.grad", 50, 100, 11},  // the rows by token
      {LieKind::kTile, "transformer.wte.weight.grad", 171, 383, 15},
      {LieKind::kTile, "transformer.wpe.weight.grad", 70, 5, 2},
      {LieKind::kTile, "transformer.wpe.weight.grad", 255, 0, 0},
      {LieKind::kTile, "h.2.qkv.grad", 100, 50, 3},   // dq: over the block's keys
      {LieKind::kTile, "h.2.qkv.grad", 200, 400, 5},  // dk: over the block's queries
      {LieKind::kTile, "h.4.qkv.grad", 10, 1000, 0},  // dv
      {LieKind::kTile, "h.0.qkv.grad", 255, 383, 7},  // dq of the last position, last block
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "10M GPT token operators and attention backward");
  // Token pages that do not check out are refused by name: a changed token, a page dropped, a
  // page's proof for another page, a page cut short, examples in place of pages, and a context
  // whose data root is not the pages'.
  const PartyRun liar = Train(Lie{LieKind::kTile, "encoded", 100, 200});
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness good = BuildWitness(Honest(), task);
  ASSERT_FALSE(good.pages.empty());
  const Bytes bytes = EncodeTileWitness(good);
  EXPECT_NE(std::string(bytes.begin(), bytes.begin() + 64).find("meshlearn.tile_witness.v2"),
            std::string::npos)
      << "a witness with pages encodes as v2";
  Result<Hash256> ok = RuleTile(Context(), task, good);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, task.challenger_output);
  {
    TileWitness w = good;
    w.pages[0].tokens[5] = (w.pages[0].tokens[5] + 1) % 172;
    ExpectRefused(task, w, "a changed token");
  }
  {
    TileWitness w = good;
    w.pages.pop_back();
    ExpectRefused(task, w, "a page dropped");
  }
  {
    TileWitness w = good;
    w.pages[0].proof.index += 1;
    ExpectRefused(task, w, "another page's proof");
  }
  {
    TileWitness w = good;
    w.pages[0].tokens.pop_back();
    ExpectRefused(task, w, "a page cut short");
  }
  {
    TileWitness w = good;
    w.examples.push_back(StepWitnessExample{});
    ExpectRefused(task, w, "examples in place of pages");
  }
  {
    TileRuleContext other = Context();
    other.data_root = Blake2b("another corpus");
    Result<Hash256> r = RuleTile(other, task, good);
    EXPECT_FALSE(r.ok()) << "pages of another corpus were accepted";
  }
  Result<TileWitness> decoded = DecodeTileWitness(EncodeTileWitness(good));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(EncodeTileWitness(*decoded), EncodeTileWitness(good));
}

// A lazy party on the 10M GPT (clipping at 1.0, and the clip acts at the disputed step): it claims
// the step's forward and backward pass and the global norm as anyone computes them, and every
// parameter unchanged by the update. The game narrows to the first tile of the first updated
// parameter, a clipped AdamW tile, and the tile rule recomputes it from the parameter, gradient,
// moment tiles and the agreed norm.
TEST(TileDisputeTest, OnThe10mGptALazyPartyLosesAtAClippedUpdateTile) {
  g_setup = &GptSetup();
  const PartyRun& honest = Honest();
  const int64_t norm = OpIndex("grad_norm");
  const float g = honest.steps.at(kLieStep).trace->values(static_cast<size_t>(norm))[0];
  ASSERT_GT(g, 1.0f) << "the clip must act at the disputed step";
  std::printf("[ tile     ] 10M GPT step %llu: global gradient norm %.4f (clipped to 1.0)\n",
              static_cast<unsigned long long>(kLieStep), static_cast<double>(g));
  const PartyRun lazy = Train(Lie{LieKind::kSkippedUpdate});
  const int64_t wte = OpIndex("transformer.wte.weight");
  for (DisputeParty liar_role : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
    SCOPED_TRACE("lazy: " + std::string(protocol::DisputePartyName(liar_role)));
    const bool defender_lies = liar_role == DisputeParty::kDefender;
    Played p = defender_lies ? Play(lazy, honest, honest) : Play(honest, lazy, honest);
    ASSERT_TRUE(p.task.has_value()) << p.outcome.reason;
    EXPECT_EQ(p.task->step, kLieStep);
    EXPECT_TRUE(p.task->tile);
    EXPECT_EQ(p.task->operator_index, static_cast<uint32_t>(wte + 1));
    EXPECT_EQ(p.task->tile_index, 0u);
    EXPECT_LE(p.witness_bytes, kMaxTileWitnessBytes);
    std::printf("[ tile     ] lazy %-10s ruled at %s tile %llu: %u turns, witness %zu bytes\n",
                defender_lies ? "defender" : "challenger", "transformer.wte.weight",
                static_cast<unsigned long long>(p.task->tile_index), p.turns, p.witness_bytes);
    EXPECT_EQ(p.outcome.defender_honest, !defender_lies) << p.outcome.reason;
    EXPECT_EQ(p.outcome.challenger_honest, defender_lies) << p.outcome.reason;
    EXPECT_FALSE(p.outcome.undecided);
  }
}

TEST(TileDisputeTest, OnTheFashionCnnALieAtACoveredTileLosesToTheTileRule) {
  g_setup = &CnnSetup();
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 70, 2000},             // the first conv, on the examples
      {LieKind::kTile, "layers.3.out", 9, 700, 2},            // the second: 16 channels, narrowed
      {LieKind::kTile, "layers.1.out", 5, 3000},              // relu on the first conv
      {LieKind::kTile, "layers.5.out", 30, 1000},             // the second max pool
      {LieKind::kTile, "layers.7.out", 40, 100, 3},           // linear over 1568 inputs: narrowed
      {LieKind::kTile, "layers.7.weight.grad", 50, 1000, 1},  // dW over the batch: narrowed
      {LieKind::kTile, "layers.4.in.grad", 100, 5000},        // relu backward
      {LieKind::kTile, "layers.3.in.grad", 9, 700, 2},        // conv dX: 32 output channels,
                                                              // narrowed into blocks of 4
      {LieKind::kTile, "layers.5.in.grad", 30, 1000},         // max-pool backward (the argmax)
      {LieKind::kTile, "layers.2.in.grad", 5, 3000},          // the first pool's
      {LieKind::kTile, "layers.3.weight.grad", 20, 300, 5},   // conv dW: (row block, channels)
      {LieKind::kTile, "layers.0.weight.grad", 3, 20, 19},    // the first conv's, on examples
      {LieKind::kTile, "layers.0.bias.grad", 0, 7, 7},        // conv db
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "fashion CNN");
}

// A first layer over examples of 12,288 floats (3 x 64 x 64): the forward's 256-wide blocks and
// the weight gradient's tiles each read one chunk of 1024 floats of their 32 examples, the loss
// their labels only, so every witness is within the bound (a block of the forward carried 32
// whole examples before, about 1.5 MiB); the ledger rules each lie for the honest side.
TEST(TileDisputeTest, OnLargeExamplesAFirstLayerLieLosesWithOnlyTheChunksItReads) {
  g_setup = &ChunkedSetup();
  ASSERT_EQ(engine::ExampleChunks(Context().plan.input_size), 12);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 40, 20, 30},           // block 30 of 48: inputs 7680..
      {LieKind::kTile, "layers.0.weight.grad", 20, 9000, 1},  // dW over the batch: block 1 of 2
      {LieKind::kTile, "loss", 50, 0},                        // the labels only
      {LieKind::kTile, "layers.2.out", 10, 100},              // not on the examples
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "linear over 3 x 64 x 64");
  // The forward block's witness as it was before the examples were chunked: its 32 examples
  // whole, each proven by its whole-example leaf.
  const PartyRun liar = Train(lies[0]);
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness w = BuildWitness(Honest(), task);
  ASSERT_EQ(w.chunked.size(), 32u);
  TileWitness whole = w;
  whole.chunked.clear();
  for (const TileWitnessChunkedExample& e : w.chunked) {
    const float* x = g_setup->train->x.data() + e.index * 12288;
    whole.examples.push_back({e.index, std::vector<float>(x, x + 12288), e.y, e.proof});
  }
  const size_t before = EncodeTileWitness(whole).size(), after = EncodeTileWitness(w).size();
  std::printf(
      "[ chunks   ] layers.0.out block %u: witness %zu bytes with whole examples, %zu "
      "with their chunks\n",
      task.block, before, after);
  EXPECT_GT(before, kMaxTileWitnessBytes);
  EXPECT_LE(after, kMaxTileWitnessBytes);
}

// A first-layer conv2d over 3 x 32 x 32 images: its forward, narrowed to one (c, kh) pair a block,
// reads one chunk (one channel) of each of its tile's 32 examples, where recomputed whole it read
// all three (a witness of 411,965 bytes); its weight gradient's blocks one sample's chunks of their
// pairs' rows. The ledger rules each lie for the honest side, every witness within the bound.
TEST(TileDisputeTest, OnLargeExamplesAFirstLayerConvLieLosesWithOnlyTheChunksItReads) {
  g_setup = &ChunkedCnnSetup();
  ASSERT_EQ(engine::ExampleChunks(Context().plan.input_size), 3);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 20, 2100, 4},          // block 4 of 9: channel 1, kh 1
      {LieKind::kTile, "layers.0.weight.grad", 2, 20, 3000},  // a sample's run, its pairs' chunks
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "conv over 3 x 32 x 32");
}

// A first-layer conv2d over 1 x 64 x 64 images with 62 outputs a row: tile 29's runs are output
// rows 14 (2 outputs) and 15, whose pair (0, 1) reads input rows 15 and 16, in chunks 0 and 1, so
// its block read two chunks of each of 32 examples. The tile is cut into pieces of one run each
// (engine TileRuleConvPieceOf): a lie at block 4 (the second piece's pair (0, 1): row 16 only) is
// ruled from one chunk of each example.
TEST(TileDisputeTest, OnLargeExamplesAConvWhoseRunsStraddleChunksIsRuledFromOneChunkAnExample) {
  g_setup = &StraddlingCnnSetup();
  ASSERT_EQ(engine::ExampleChunks(Context().plan.input_size), 4);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 5, 938, 4},  // tile 29, output row 15, column 8
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "conv over 1 x 64 x 64, runs across chunks");
}

// A conv2d whose outputs are one column wide (a 33-wide kernel of stride 8 over 1 x 281 x 40): a
// tile's 32 runs each read one input row's window columns, so one pair's block read 64 tiles
// (256 KiB). Its tile is cut into pieces of up to 20 runs: a lie at the second piece's sixth pair
// block (block 33 + 5) is ruled from a witness of 20 runs' tiles at most.
TEST(TileDisputeTest, AConvWithOneColumnOfOutputsIsRuledFromAPieceOfItsTile) {
  static const auto* setup = ConvAfterReluSetup({1, 281, 40}, R"([[model.layers]]
kind = "conv2d"
out = 4
kernel = 33
stride = 8
pad = 0
)");
  g_setup = setup;
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.out", 3, 25, 33 + 5},  // tile 0, output row 25: the second piece
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "one-column conv over 1 x 281 x 40");
}

// A 3 x 3 conv of stride 64 over 2 x 3 x 2563 (41 outputs a row): a forward or weight gradient
// block's pair read 31 x 64 + 3 window columns of its row in 63 tiles; both take runs of 20 outputs
// instead. A lie at the forward's tile 1 (output channel 0's outputs 32..40, channel 1's 0..22:
// segments of 8, 1, 20 and 3 outputs), block 2 x 6 + 3 (the third segment's pair (1, 0)), and one
// at the weight gradient's block ((3 OH + 0) 3 + 1) 12 + 1 (sample 3, the run of outputs 20..39,
// output channel 0's pair chunk 1), each ruled from at most 40 tiles of the input.
TEST(TileDisputeTest, AConvPastStride40IsRuledFromRunsOf20Outputs) {
  static const auto* setup = ConvAfterReluSetup({2, 3, 2563}, R"([[model.layers]]
kind = "conv2d"
out = 2
kernel = 3
stride = 64
pad = 0
)");
  g_setup = setup;
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.out", 7, 32 + 9 + 5, 2 * 6 + 3},
      {LieKind::kTile, "layers.1.weight.grad", 0, 4, (3 * 3 + 1) * 12 + 1},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "stride-64 conv over 2 x 3 x 2563");
}

// An 8 x 8 max-pool of stride 8 over 2 x 16 x 600 (75 outputs a row): a forward tile recomputed
// whole read its outputs' windows, 8 input rows of up to 10 tiles each for each of its two row
// runs (311,296 bytes of values). Its tile is cut into pieces of one segment of at most 16
// outputs (engine TileRuleConvPiecesOf): a lie at tile 1 (channel 0's outputs 32..63: segments
// 32..47 and 48..63), block 1 (the second segment), is ruled from at most 40 tiles of the input.
TEST(TileDisputeTest, AMaxPoolWithALargeWindowIsRuledFromAPieceOfItsTile) {
  static const auto* setup = ConvAfterReluSetup({2, 16, 600}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 8
)");
  g_setup = setup;
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.out", 7, 50, 1},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "8 x 8 max-pool over 2 x 16 x 600");
}

// A first layer's 2 x 2 max-pool over 3 x 40 x 40 examples (3 x 20 x 20 outputs, 400 a plane; 5
// chunks an example): a tile across two planes read every row of both, four chunks of each of
// its 32 examples (524,416 bytes of values). It is cut into pieces of one segment of 16 examples
// (a segment's two rows can straddle a chunk: engine TileRuleConvPiecesOf): a lie at tile 12
// (channel 0's outputs 384..399, channel 1's 0..15), row 20, output 405 (the second segment, the
// second half of the examples: block 1 x 2 + 1) is ruled from the chunks of 16 examples.
TEST(TileDisputeTest, OnLargeExamplesAFirstLayerMaxPoolIsRuledFromAPieceOfItsTile) {
  static const auto* setup = ChunkedLayersSetup({3, 40, 40}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 2
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 10
init = "xavier"
)");
  g_setup = setup;
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 20, 405, 3},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "first-layer 2 x 2 max-pool over 3 x 40 x 40");
}

// A first layer's 32 x 32 max-pool over 1 x 32 x 2000 examples (62 outputs; 63 chunks an
// example): one output's window spans 62 chunks of its example (with the partial, past the 240 KiB
// of values a witness carries), and the plan refused it at submission. Its pieces (one output of
// one example) read the window in chunks of 20 rows (39 chunks at the worst alignment) and 12, one
// a block, the running maximum carried in the output's own element of the partial (engine
// TileRulePoolExampleRowChunk: 32 x 32 pieces x 2, 2,048 blocks): a lie at tile 0, row 20, output
// 5 (piece 5 x 32 + 20), in its second chunk (block 2 x 180 + 1), and one at tile 1, row 3, output
// 40 (its eighth segment: piece 8 x 32 + 3), in its first (block 2 x 259), are each ruled from 39
// chunks of one example.
TEST(TileDisputeTest, OnLargeExamplesAFirstLayerMaxPoolOverManyChunksIsRuledFromAChunkOfItsRows) {
  static const auto* setup = ChunkedLayersSetup({1, 32, 2000}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 32
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 10
init = "xavier"
)");
  g_setup = setup;
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("layers.0.out")), 32 * 32 * 2);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.0.out", 20, 5, 2 * 180 + 1},
      {LieKind::kTile, "layers.0.out", 3, 40, 2 * 259},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "first-layer 32 x 32 max-pool over 1 x 32 x 2000");
}

// A 2 x 2 max-pool over 2 x 400 x 30 (narrow images; 200 x 15 outputs, 3,000 a plane): a tile
// across two planes read every row of both (3,072,000 bytes of values); it reads its windows'
// columns as over a wide image instead. A lie at tile 93 (channel 0's outputs 2976..2999, channel
// 1's 0..7) is ruled from those windows.
TEST(TileDisputeTest, AMaxPoolOverTallNarrowPlanesIsRuledFromItsWindowsColumns) {
  static const auto* setup = ConvAfterReluSetup({2, 400, 30}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 2
)");
  g_setup = setup;
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.out", 7, 3003, 0},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "2 x 2 max-pool over 2 x 400 x 30");
}

// A 16 x 16 max-pool of stride 8 over 2 x 40 x 601 (4 x 74 outputs a plane, overlapping windows):
// an input-gradient tile read the windows of every output reaching its 32 inputs, whole (290,816
// bytes of values), and the tile plan refused the pool. Its tile is a chain over those outputs, a
// group of 3 consecutive outputs of a row a block (engine TileRulePoolChainBlockOf: 2 runs x 2
// output rows x 2 groups, 8 blocks; one output a block made 24; the partial, the tile's
// accumulators): a lie at tile 376 (channel 0's row 20, columns 12..43: output rows 1 and 2 by
// outputs 0..5), block 2 (outputs (0, 2, 0..2)), one at tile 18 (row 0's columns 576..600 and row
// 1's 0..6), block 4 (the second run's first group, output (0, 0, 0) alone), and one at tile 751
// (channel 0's last row and channel 1's first), block 4 (outputs (1, 0, 0..2)), are each ruled
// from a group's dout and its windows' 16 rows.
TEST(TileDisputeTest, AMaxPoolsInputGradientPastTheBoundIsRuledFromAGroupOfOutputsWindows) {
  static const auto* setup = ConvAfterReluSetup({2, 40, 601}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 16
stride = 8
)");
  g_setup = setup;
  const int64_t j = OpIndex("layers.1.in.grad");
  ASSERT_TRUE(Context().plan.ops[static_cast<size_t>(j)].window_chain);
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, j), 8);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.in.grad", 9, 20 * 601 + 20, 2},
      {LieKind::kTile, "layers.1.in.grad", 9, 601 + 3, 4},
      {LieKind::kTile, "layers.1.in.grad", 5, 40 * 601 + 10, 4},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "16 x 16 max-pool's input gradient over 2 x 40 x 601");
}

// apps/meshlearn task_cli_test's pool, 16 x 16 of stride 1 over 4 x 64 x 64 (49 x 49 outputs a
// plane): its input gradient's chain was one output a block, 752 of them (one run a tile, 16
// output rows x 47 outputs reaching it: 10 turns of bisecting the blocks); a block is now 18
// consecutive outputs of a row (their dout in 2 tiles, their windows' 16 rows of 33 columns in 2
// tiles each, the partial's: 35 tiles at the worst alignment), 16 rows x 3 groups, 48 blocks (6
// turns). A lie at tile 61 (channel 0's row 30, columns 32..63), block 7 x 3 + 1 (output row 7
// of those reaching it, its outputs 18 to 31), is ruled for the honest side in both roles.
TEST(TileDisputeTest, AMaxPoolsInputGradientChainOfGroupsOfOutputsTakesFewerTurns) {
  static const auto* setup = ConvAfterReluSetup({4, 64, 64}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 16
stride = 1
)");
  g_setup = setup;
  const int64_t j = OpIndex("layers.1.in.grad");
  ASSERT_TRUE(Context().plan.ops[static_cast<size_t>(j)].window_chain);
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, j), 48);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.in.grad", 5, 30 * 64 + 40, 7 * 3 + 1},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies,
                                     "16 x 16 stride-1 max-pool's input gradient over 4 x 64 x 64");
}

// A 32 x 32 max-pool of stride 16 over 2 x 80 x 601: one output's window alone (32 rows of two
// tiles, 64) passed the bound, forward and input gradient, and the plan refused the pool. Both read
// it in two chunks of rows (20 and 12), one a block: a lie at the forward's tile 0, block 5 x 2 + 1
// (output 5's second chunk, continuing the running maximum its own element holds), and at the
// input gradient's tile 376 (channel 0's row 20, columns 12..43), block 6 x 2 (output (0, 1, 2)'s
// first chunk: the partial's running maximum and index) and 6 x 2 + 1 (its last: dout added into
// the argmax), are each ruled from one chunk of one window.
TEST(TileDisputeTest, AMaxPoolWithAWindowPast29RowsIsRuledFromAChunkOfItsRows) {
  static const auto* setup = ConvAfterReluSetup({2, 80, 601}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 32
stride = 16
)");
  g_setup = setup;
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("layers.1.out")), 32 * 2);
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("layers.1.in.grad")), 16 * 2);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.out", 3, 5, 5 * 2 + 1},
      {LieKind::kTile, "layers.1.in.grad", 9, 20 * 601 + 20, 6 * 2},
      {LieKind::kTile, "layers.1.in.grad", 9, 20 * 601 + 20, 6 * 2 + 1},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "32 x 32 max-pool over 2 x 80 x 601");
}

// A 29 x 29 max-pool of stride 1 over 2 x 32 x 608 (rows of whole tiles: every window row at the
// same offset in its tiles): output (0, 0, 140)'s window, columns 140..168 of rows 0..28, crosses
// the tile boundary at 160 in every one of its 29 rows. Its input gradient's chain block read it
// whole (2 x 29 tiles, dout's, the partial's: 60 tiles, 245,760 bytes of values), and with each
// tile's proof (11 levels: 388 bytes) its witness was about 269 KB, past the 262,144-byte bound.
// The plan now prices a block's witness with its proofs (engine TileRuleMaxPoolBlockWitnessBytes)
// and reads a window past 25 rows in chunks of its rows (20 and 9 here): a lie at tile 537
// (channel 0's row 28, columns 160..191; output rows 0..3 by outputs 132..191 reach it), that
// output's first chunk (slot 8 of output row 0), is ruled from 20 rows of its window, the witness
// under the bound.
TEST(TileDisputeTest, AMaxPoolsWorstAlignedWindowOf29RowsIsRuledWithItsWitnessUnderTheBound) {
  static const auto* setup = ConvAfterReluSetup({2, 32, 608}, R"([[model.layers]]
kind = "maxpool2d"
kernel = 29
stride = 1
)");
  g_setup = setup;
  const int64_t j = OpIndex("layers.1.in.grad");
  ASSERT_TRUE(Context().plan.ops[static_cast<size_t>(j)].window_chain);
  // One run a tile, 4 output rows by 60 outputs reaching it, each in chunks of its window's rows.
  const int64_t chunks = engine::ReductionBlocks(Context().plan, j) / (4 * 60);
  EXPECT_EQ(chunks, 2);
  const std::vector<Lie> lies = {
      {LieKind::kTile, "layers.1.in.grad", 9, 28 * 608 + 170, 8 * chunks},
  };
  ExpectTheHonestSideWinsAtEveryTile(lies, "29 x 29 max-pool's input gradient over 2 x 32 x 608");
}

// A chunked example's chunk must be the footprint's and proven against the example's chunk root,
// and the example's leaf over that root proven against the data root; a witness that carries the
// example whole (the format of smaller examples) is refused too.
TEST(TileDisputeTest, OnLargeExamplesAChangedOrUnprovenChunkIsRefused) {
  g_setup = &ChunkedSetup();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.0.weight.grad", 20, 9000, 1});
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness good = BuildWitness(Honest(), task);
  ASSERT_FALSE(good.chunked.empty());
  ASSERT_EQ(good.chunked[0].chunks.size(), 1u);
  // The builder hashes an example's chunks once (engine::ExampleChunkLeaves) for its root and
  // proofs: the same bytes as each chunk proven from the example's floats.
  for (const TileWitnessChunkedExample& e : good.chunked) {
    const std::span<const float> x(g_setup->train->x.data() + e.index * 12288, 12288);
    EXPECT_EQ(e.chunk_root, engine::ExampleChunkRoot(x));
    for (const TileWitnessChunk& c : e.chunks) {
      EXPECT_EQ(c.proof, engine::ProveExampleChunk(x, static_cast<int64_t>(c.proof.index)));
    }
  }
  Result<Hash256> ok = RuleTile(Context(), task, good);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, task.challenger_output);  // the honest side's
  {
    Result<TileWitness> decoded = DecodeTileWitness(EncodeTileWitness(good));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->chunked, good.chunked);
  }
  {
    TileWitness w = good;
    w.chunked[3].chunks[0].values[100] += 0.5f;  // a changed chunk
    ExpectRefused(task, w, "a changed chunk");
  }
  {
    TileWitness w = good;
    w.chunked[3].chunks[0].proof.siblings[0].bytes[0] ^= 1;  // a chunk proof that does not verify
    ExpectRefused(task, w, "a chunk proof that does not verify");
  }
  {
    // Another chunk of the same example, validly proven against its chunk root: not the one the
    // tile reads.
    TileWitness w = good;
    const TileWitnessChunkedExample& e = w.chunked[3];
    const std::span<const float> x(g_setup->train->x.data() + e.index * 12288, 12288);
    const int64_t other = static_cast<int64_t>(e.chunks[0].proof.index + 1) % 12;
    const std::span<const float> c = engine::ExampleChunk(x, other);
    w.chunked[3].chunks[0] = TileWitnessChunk{std::vector<float>(c.begin(), c.end()),
                                              engine::ProveExampleChunk(x, other)};
    ExpectRefused(task, w, "another chunk of the example");
  }
  {
    TileWitness w = good;
    w.chunked[3].chunk_root.bytes[0] ^= 1;  // chunks of another example's tree
    ExpectRefused(task, w, "a chunk root not under the data root");
  }
  {
    TileWitness w = good;
    w.chunked[3].chunks.clear();
    ExpectRefused(task, w, "a missing chunk");
  }
  {
    TileWitness w = good;
    std::swap(w.chunked[2], w.chunked[3]);  // proven examples, at the wrong rows
    ExpectRefused(task, w, "examples out of the batch's order");
  }
  {
    TileWitness w = good;
    const TileWitnessChunkedExample e = w.chunked.back();
    w.chunked.pop_back();
    const float* x = g_setup->train->x.data() + e.index * 12288;
    w.examples.push_back({e.index, std::vector<float>(x, x + 12288), e.y, e.proof});
    ExpectRefused(task, w, "a whole example instead of its chunks");
  }
}

// The batch's draws allocate a row of the plan's batch size (engine::BatchIndices): a context whose
// plan says a batch larger than any task trains on is refused, by name, before any is drawn.
TEST(TileDisputeTest, APlanWithABatchPastTheEnginesLimitIsRefusedBeforeItsBatchIsDrawn) {
  g_setup = &ChunkedSetup();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.0.out", 20, 10, 1});
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness good = BuildWitness(Honest(), task);
  ASSERT_FALSE(good.chunked.empty());
  ASSERT_TRUE(RuleTile(Context(), task, good).ok());
  TileRuleContext ctx = Context();
  ctx.plan.batch = int64_t{1} << 40;  // 8 TiB of indices
  Result<Hash256> r = RuleTile(ctx, task, good);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("batch of 1099511627776 rows"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("kMaxBatchSize"), std::string::npos);
}

// A chunked example is read as a row of the task's input_size floats (zeros but for its chunks),
// and the task's bundle sets input_size to any value (its plan allocates nothing): a witness
// whose rows would cost more than kMaxTileExampleBytes of the ledger's memory is refused before
// any row is built, whatever the witness carries (a data root over fabricated leaves proves any).
TEST(TileDisputeTest, OnExamplesTooLargeToHoldAChunkedWitnessIsRefusedBeforeItsRowsAreBuilt) {
  g_setup = &ChunkedSetup();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.0.weight.grad", 20, 9000, 1});
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness good = BuildWitness(Honest(), task);
  ASSERT_EQ(good.chunked.size(), 32u);
  TileRuleContext huge = Context();
  huge.plan.input_size = int64_t{1} << 40;  // 4 TiB a row
  Result<Hash256> r = RuleTile(huge, task, good);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("kMaxTileExampleBytes"), std::string::npos)
      << r.status().message();
  // The task's own size is within it: 32 rows of 12,288 floats, 1.5 MiB.
  EXPECT_LE(good.chunked.size() * 12288 * sizeof(float), kMaxTileExampleBytes);
}

// Plays `lie` with the liar as defender up to the referee stage and returns the game there.
DisputeGame GameAtReferee(const PartyRun& liar) {
  const PartyRun& honest = Honest();
  Result<DisputeGame> g = DisputeGame::Create(Config(liar, honest));
  CHECK(g.ok());
  uint64_t height = 100;
  while (g->stage() != DisputeStage::kDisputeReferee) {
    CHECK(g->stage() != DisputeStage::kDisputeResolved) << g->outcome().reason;
    const DisputeQuery q = g->query();
    ++height;
    for (DisputeParty party : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
      const Move m = Answer(party == DisputeParty::kDefender ? liar : honest, q);
      Status s = m.children ? g->PostChildren(party, q.position, m.children->first,
                                              m.children->second, height)
                            : g->Post(party, q.position, m.hash, height);
      CHECK(s.ok()) << s.ToString();
    }
  }
  return std::move(*g);
}

void ExpectRefused(const RefereeTask& task, const TileWitness& w, const std::string& what) {
  Result<Hash256> r = RuleTile(Context(), task, w);
  ASSERT_FALSE(r.ok()) << "a witness with " << what << " was accepted";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  std::printf("[ refused  ] %s: %s\n", what.c_str(), r.status().message().c_str());
}

TEST(TileDisputeTest, MalformedWitnessesAreRefused) {
  g_setup = &FashionSetup();
  const PartyRun& honest = Honest();
  // A matmul tile on the batch: tiles, proofs and examples.
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.2.out", 100, 70});
  DisputeGame g = GameAtReferee(liar);
  const RefereeTask task = g.referee_task();
  ASSERT_TRUE(task.tile);
  const TileWitness good = BuildWitness(honest, task);
  Result<Hash256> ok = RuleTile(Context(), task, good);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, task.challenger_output);  // the honest side's leaf
  EXPECT_NE(*ok, task.defender_output);
  {
    TileWitness w = good;
    w.tiles[0].values[3] += 1.0f;  // values that are not the agreed tile's
    ExpectRefused(task, w, "a wrong proof");
  }
  {
    TileWitness w = good;
    w.tiles[1].proof = w.tiles[0].proof;  // another tile's proof
    ExpectRefused(task, w, "another tile's proof");
  }
  {
    TileWitness w = good;
    std::swap(w.tiles[0], w.tiles[1]);  // proven tiles, but not the footprint's at that place
    ExpectRefused(task, w, "a wrong tile");
  }
  {
    TileWitness w = good;
    w.tiles.pop_back();
    ExpectRefused(task, w, "a missing tile");
  }
  {
    // The disputed operator's own output (the honest party's, validly proven against its own
    // root) is not an input anyone agreed to.
    TileWitness w = good;
    const int64_t op = static_cast<int64_t>(task.operator_index) - 1;
    const engine::TileGrid& grid = Context().plan.ops[static_cast<size_t>(op)].grid;
    std::vector<Hash256> hashes = engine::TileHashes(honest.Values(task.step, op), grid);
    w.tiles[0] = TileWitnessTile{task.operator_index, 0,
                                 engine::ExtractTile(honest.Values(task.step, op), grid, 0),
                                 MerkleProve(hashes, 0)};
    ExpectRefused(task, w, "an input not agreed to");
  }
  {
    TileWitness w = good;
    w.outputs[5] = Blake2b("not agreed");
    ExpectRefused(task, w, "outputs that do not chain to C_{j-1}");
  }
  {
    RefereeTask other = task;
    other.tile_index = task.tile_index == 0 ? 1 : 0;  // the witness is for another tile
    Result<Hash256> r = RuleTile(Context(), other, good);
    EXPECT_FALSE(r.ok()) << "a witness for another tile was accepted";
  }
  // A tile that reads the batch: examples must be the batch's and proven.
  const PartyRun liar0 = Train(Lie{LieKind::kTile, "layers.0.out", 40, 40});
  DisputeGame g0 = GameAtReferee(liar0);
  const RefereeTask task0 = g0.referee_task();
  const TileWitness good0 = BuildWitness(honest, task0);
  ASSERT_TRUE(RuleTile(Context(), task0, good0).ok());
  {
    TileWitness w = good0;
    std::swap(w.examples[0], w.examples[1]);
    ExpectRefused(task0, w, "examples out of batch order");
  }
  {
    TileWitness w = good0;
    w.examples[2].x[10] += 0.5f;
    ExpectRefused(task0, w, "an example not in the data");
  }
  {
    TileWitness w = good0;
    w.examples[2].y = (w.examples[2].y + 1) % 10;
    ExpectRefused(task0, w, "a relabelled example");
  }
  // A reduction block: the partial sum must be the agreed one.
  const PartyRun liar2 = Train(Lie{LieKind::kTile, "layers.0.weight.grad", 200, 700, 2});
  DisputeGame g2 = GameAtReferee(liar2);
  const RefereeTask task2 = g2.referee_task();
  ASSERT_EQ(task2.block, 2u);
  const TileWitness good2 = BuildWitness(honest, task2);
  ASSERT_TRUE(RuleTile(Context(), task2, good2).ok());
  {
    TileWitness w = good2;
    w.partial[0] += 1.0f;
    ExpectRefused(task2, w, "a partial sum not agreed to");
  }
  // The game itself refuses moves that do not hash to the party's own claims.
  {
    Result<DisputeGame> fresh = DisputeGame::Create(Config(liar, honest));
    ASSERT_TRUE(fresh.ok());
    DisputeGame h = std::move(*fresh);
    uint64_t height = 100;
    while (h.stage() != DisputeStage::kDisputeTiles) {
      const DisputeQuery q = h.query();
      ++height;
      ASSERT_TRUE(h.Post(DisputeParty::kDefender, q.position, Answer(liar, q).hash, height).ok());
      ASSERT_TRUE(
          h.Post(DisputeParty::kChallenger, q.position, Answer(honest, q).hash, height).ok());
    }
    const DisputeQuery q = h.query();
    Status bad = h.Post(DisputeParty::kDefender, q.position, Answer(honest, q).hash, height);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << "a root not chaining to its C_j";
    ASSERT_TRUE(h.Post(DisputeParty::kDefender, q.position, Answer(liar, q).hash, height).ok());
    ASSERT_TRUE(h.Post(DisputeParty::kChallenger, q.position, Answer(honest, q).hash, height).ok());
    const DisputeQuery c = h.query();
    ASSERT_TRUE(c.children);
    const Move m = Answer(liar, c);
    Status swapped = h.PostChildren(DisputeParty::kDefender, c.position, m.children->second,
                                    m.children->first, height);
    EXPECT_EQ(swapped.code(), StatusCode::kInvalidArgument) << "children not hashing to the node";
  }
}

// ---- On chain: the same game played with real transactions (RevealVerdict with the task bundle,
// DisputePost, DisputeChildren, RefereeTile) on a ledger with verification on, every block
// replayed by a follower. The solver trains unit 0 of a one-unit task (H = 4, one segment), the
// drawn verifier replays it; one of them lies. The honest side wins by RefereeTile (by RefereeStep
// when the lie is in the state only), and the genesis referee's word is refused.

const std::string& ChainBundle() {
  static const std::string* b = new std::string(
      std::string(kFashionMlp) +
      "[network]\nrounds = 1\nunits_per_round = 1\ninner_steps = 4\ncheckpoint_interval = 4\n");
  return *b;
}

// The same task with a wider MLP (784-512-128-10: 468,874 parameters, so up to 5,626,488 bytes of
// state with AdamW's moments, over kMaxStepWitnessState).
const std::string& ChainWideMlpBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainBundle();
    bundle.replace(bundle.find("out = 256"), 9, "out = 512");
    return new std::string(bundle);
  }();
  return *b;
}

// The same task with examples/fashion-cnn.toml's model (the same examples as 1 x 28 x 28 images).
const std::string& ChainCnnBundle() {
  static const std::string* b = [] {
    Result<std::string> cnn =
        Env::Default()->ReadFile(std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-cnn.toml");
    CHECK(cnn.ok()) << cnn.status().ToString();
    const size_t m0 = cnn->find("[model]"), m1 = cnn->find("[optimizer]");
    std::string bundle = ChainBundle();
    const size_t b0 = bundle.find("[model]"), b1 = bundle.find("[optimizer]");
    bundle.replace(b0, b1 - b0, cnn->substr(m0, m1 - m0));
    return new std::string(bundle);
  }();
  return *b;
}

// The model of `bundle` trained as unit 0 of the chain task: the unit's stream and inner rate
// (UnitWorkOf, as every solver derives them), from the task's initial weights.
Setup* MakeChainSetup(const std::string& bundle, const engine::TaskData* data,
                      const std::string& dir = ".") {
  auto* s = new Setup;
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle, "tile-chain.toml", dir);
  CHECK(spec.ok()) << spec.status().ToString();
  Result<ConfigFile> cfg = ConfigFile::Parse(bundle, "tile-chain.toml");
  CHECK(cfg.ok());
  Result<protocol::NetworkSpec> net = protocol::NetworkSpec::FromConfig(*cfg);
  CHECK(net.ok()) << net.status().ToString();
  const protocol::UnitWork work =
      protocol::UnitWorkOf(*net, spec->seed, engine::TaskContentId(*spec), 0, 0);
  auto shared = std::make_shared<const engine::TaskSpec>(std::move(*spec));
  // The trainers read the data in place (it lives as long as the tests).
  const std::shared_ptr<const engine::TaskData> in_place(std::shared_ptr<void>(), data);
  s->make = [shared, work, in_place] {
    Result<std::unique_ptr<Trainer>> tr = Trainer::Create(*shared, in_place);
    CHECK(tr.ok()) << tr.status().ToString();
    const std::vector<float> start = (*tr)->FlatParams();
    CHECK((*tr)->StartUnit(work.stream, start, work.lr_scale).ok());
    return std::move(*tr);
  };
  s->fresh = s->make();
  s->ctx = ContextOf(*s->fresh, static_cast<uint64_t>(kExamples), Tree().root());
  s->train = &Data().train;  // the same floats whatever the shape: the same leaves
  s->tree = &Tree();
  return s;
}

// examples/code-gpt-10m.toml (10.8M parameters, a token task: no data root) at one sequence of 256
// tokens a step, as unit 0 of a one-unit task, with its data. The bundle names the vocabulary
// size the data gives (a bundle that leaves it to the data gets it from the task's model_bytes:
// TileContextTest.AGptWithoutItsVocabularySizeTakesItFromTheTaskWeights).
struct GptTask {
  std::string bundle;
  engine::TaskData data;
};
const GptTask& ChainGpt() {
  static const GptTask* t = [] {
    const std::string dir = std::string(MESHLEARN_SOURCE_DIR) + "/examples";
    Result<std::string> text = Env::Default()->ReadFile(dir + "/code-gpt-10m.toml");
    CHECK(text.ok()) << text.status().ToString();
    Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(*text, "code-gpt-10m.toml", dir);
    CHECK(spec.ok()) << spec.status().ToString();
    auto* out = new GptTask;
    Result<engine::TaskData> data = engine::LoadTaskData(Env::Default(), *spec);
    CHECK(data.ok()) << data.status().ToString();
    out->data = std::move(*data);
    std::string bundle = *text;
    const size_t at = bundle.find("batch_size = 8");
    CHECK(at != std::string::npos);
    bundle.replace(at, 14, "batch_size = 1");
    const size_t model = bundle.find("[model]\n");
    CHECK(model != std::string::npos);
    bundle.insert(model + 8, "vocab_size = " + std::to_string(spec->model.gpt.vocab_size) + "\n");
    bundle +=
        "\n[network]\nrounds = 1\nunits_per_round = 1\ninner_steps = 4\n"
        "checkpoint_interval = 4\n";
    out->bundle = std::move(bundle);
    return out;
  }();
  return *t;
}
const std::string& ChainGptBundle() { return ChainGpt().bundle; }

const Setup& ChainSetup() {
  static const Setup* setup = MakeChainSetup(ChainBundle(), &Data());
  return *setup;
}

// The chain's GPT task of `bundle` declares its data root over its token pages
// (data_page_tokens).
const Setup* MakeChainGptSetup(const std::string& bundle) {
  Setup* s =
      MakeChainSetup(bundle, &ChainGpt().data, std::string(MESHLEARN_SOURCE_DIR) + "/examples");
  s->pages = new engine::TokenPageTree(ChainGpt().data.train_tokens.tokens);
  s->ctx.num_examples = static_cast<uint64_t>(s->pages->num_tokens());
  s->ctx.data_root = s->pages->root();
  return s;
}
// The chain's GPT setup. Submit reads a token task's pages from the setup a test plays, never
// building this one for another test (initialising the 10M GPT was most of every other chain
// test's time: 1 s of 1.6 s in release, 9.5 s of 11 s under ASan).
const Setup& ChainGptSetup() {
  static const Setup* setup = MakeChainGptSetup(ChainGptBundle());
  return *setup;
}

// The chain's GPT task at two sequences a step in two micro-batches (train.micro_batches = 2):
// its plan follows the micro-batched step (PlanStepTiles), its data root over its token pages.
const std::string& ChainGptMicroBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainGptBundle();
    const size_t at = bundle.find("batch_size = 1");
    CHECK(at != std::string::npos);
    bundle.replace(at, 14, "batch_size = 2\nmicro_batches = 2");
    return new std::string(std::move(bundle));
  }();
  return *b;
}
const Setup& ChainGptMicroSetup() {
  static const Setup* setup = MakeChainGptSetup(ChainGptMicroBundle());
  return *setup;
}

// The chain's GPT task with one head of 512 columns over sequences of 128 (one layer): its
// attention and attention backward are narrowed over the positions and over the head's columns.
const std::string& ChainWideHeadGptBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainGptBundle();
    const std::vector<std::pair<std::string, std::string>> edits = {
        {"n_layer = 6", "n_layer = 1"},
        {"n_head = 6", "n_head = 1"},
        {"n_embd = 384", "n_embd = 512"},
        {"block_size = 256", "block_size = 128"},
        {"seq_len = 256", "seq_len = 128"}};
    for (const auto& [from, to] : edits) {
      const size_t at = bundle.find(from);
      CHECK(at != std::string::npos) << from;
      bundle.replace(at, from.size(), to);
    }
    return new std::string(std::move(bundle));
  }();
  return *b;
}
const Setup& ChainWideHeadGptSetup() {
  static const Setup* setup = MakeChainGptSetup(ChainWideHeadGptBundle());
  return *setup;
}

// The synthetic examples as 1 x 28 x 28 images.
const engine::TaskData* ChainCnnImages() {
  static const engine::TaskData* images = [] {
    auto* data = new engine::TaskData;
    data->train.x = engine::Tensor(
        {kExamples, 1, 28, 28},
        std::vector<float>(Data().train.x.data(), Data().train.x.data() + kExamples * 784));
    data->train.y = Data().train.y;
    data->train.num_classes = 10;
    data->test = data->train;
    return data;
  }();
  return images;
}

const Setup& ChainCnnSetup() {
  static const Setup* setup = MakeChainSetup(ChainCnnBundle(), ChainCnnImages());
  return *setup;
}

// The CNN with a dropout layer (p = 0.25) after its flatten (layers.7): its tiles' masks are
// drawn from the unit's dropout seed, which the ledger derives from the task and the unit.
const std::string& ChainCnnDropoutBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainCnnBundle();
    const std::string flatten = "kind = \"flatten\"\n";
    const size_t at = bundle.find(flatten);
    CHECK_NE(at, std::string::npos);
    bundle.insert(at + flatten.size(), "[[model.layers]]\nkind = \"dropout\"\np = 0.25\n");
    return new std::string(bundle);
  }();
  return *b;
}

const Setup& ChainCnnDropoutSetup() {
  static const Setup* setup = MakeChainSetup(ChainCnnDropoutBundle(), ChainCnnImages());
  return *setup;
}

// The CNN with a layernorm over its first pooled images' last dimension (16 x 14 x 14: runs of
// W = 14; layers.3) and a dropout on those images (layers.4).
const std::string& ChainCnnNormBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainCnnBundle();
    const std::string pool = "kernel = 2          # -> (16, 14, 14)\n";
    const size_t at = bundle.find(pool);
    CHECK_NE(at, std::string::npos);
    bundle.insert(at + pool.size(),
                  "[[model.layers]]\nkind = \"layernorm\"\n[[model.layers]]\nkind = "
                  "\"dropout\"\np = 0.1\n");
    return new std::string(bundle);
  }();
  return *b;
}

const Setup& ChainCnnNormSetup() {
  static const Setup* setup = MakeChainSetup(ChainCnnNormBundle(), ChainCnnImages());
  return *setup;
}

// A model whose layernorm normalises rows of 392 (the examples as 2 x 392): wider than the 256 a
// tile of it is recomputed whole at, so its operators are narrowed over blocks of 256 of each
// run's columns.
const std::string& ChainWideNormBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainBundle();
    const size_t b0 = bundle.find("[model]"), b1 = bundle.find("[optimizer]");
    bundle.replace(b0, b1 - b0,
                   "[model]\ninput = [2, 392]\n[[model.layers]]\nkind = \"layernorm\"\n"
                   "[[model.layers]]\nkind = \"flatten\"\n[[model.layers]]\nkind = \"linear\"\n"
                   "out = 10\n\n");
    return new std::string(bundle);
  }();
  return *b;
}

const Setup& ChainWideNormSetup() {
  static const Setup* setup = [] {
    auto* rows = new engine::TaskData;  // the synthetic examples as 2 x 392
    rows->train.x = engine::Tensor(
        {kExamples, 2, 392},
        std::vector<float>(Data().train.x.data(), Data().train.x.data() + kExamples * 784));
    rows->train.y = Data().train.y;
    rows->train.num_classes = 10;
    rows->test = rows->train;
    return MakeChainSetup(ChainWideNormBundle(), rows);
  }();
  return *setup;
}

// A conv2d over images 196 wide (the examples as 2 x 2 x 196, after a relu so that the conv
// reads an activation): wider than the 32 its tiles read whole image rows up to, so its forward
// and input gradient read only their windows' columns, in blocks of 4 (channel, kh) pairs of
// their chains.
const std::string& ChainWideConvBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainBundle();
    const size_t b0 = bundle.find("[model]"), b1 = bundle.find("[optimizer]");
    bundle.replace(b0, b1 - b0,
                   "[model]\ninput = [2, 2, 196]\n[[model.layers]]\nkind = \"relu\"\n"
                   "[[model.layers]]\nkind = \"conv2d\"\nout = 2\nkernel = 3\npad = 1\n"
                   "[[model.layers]]\nkind = \"flatten\"\n[[model.layers]]\nkind = \"linear\"\n"
                   "out = 10\n\n");
    return new std::string(bundle);
  }();
  return *b;
}

const Setup& ChainWideConvSetup() {
  static const Setup* setup = [] {
    auto* images = new engine::TaskData;  // the synthetic examples as 2 x 2 x 196
    images->train.x = engine::Tensor(
        {kExamples, 2, 2, 196},
        std::vector<float>(Data().train.x.data(), Data().train.x.data() + kExamples * 784));
    images->train.y = Data().train.y;
    images->train.num_classes = 10;
    images->test = images->train;
    return MakeChainSetup(ChainWideConvBundle(), images);
  }();
  return *setup;
}

// A conv2d over the examples as two channels of one row of 392 (after a relu), padded by 2 so
// that its output planes are 3 x 394: its weight gradient's row blocks would read more than
// 2 x 784 floats a sample (3 x 394 of dout and 2 x 392 of input), so each element's chain runs
// one sample's run of 32 outputs of a row a block (128 samples x 3 rows x 13 runs x 2 output
// channels). Just over that bound is enough: a row of 784 (25 runs a row) chained twice the
// blocks for the same rule, and every answer of the dispute recomputes the chain.
const std::string& ChainWideConvGradBundle() {
  static const std::string* b = [] {
    std::string bundle = ChainBundle();
    const size_t b0 = bundle.find("[model]"), b1 = bundle.find("[optimizer]");
    bundle.replace(b0, b1 - b0,
                   "[model]\ninput = [2, 1, 392]\n[[model.layers]]\nkind = \"relu\"\n"
                   "[[model.layers]]\nkind = \"conv2d\"\nout = 2\nkernel = 3\npad = 2\n"
                   "[[model.layers]]\nkind = \"flatten\"\n[[model.layers]]\nkind = \"linear\"\n"
                   "out = 10\n\n");
    return new std::string(bundle);
  }();
  return *b;
}

const Setup& ChainWideConvGradSetup() {
  static const Setup* setup = [] {
    auto* images = new engine::TaskData;  // the synthetic examples as 2 x 1 x 392
    images->train.x = engine::Tensor(
        {kExamples, 2, 1, 392},
        std::vector<float>(Data().train.x.data(), Data().train.x.data() + kExamples * 784));
    images->train.y = Data().train.y;
    images->train.num_classes = 10;
    images->test = images->train;
    return MakeChainSetup(ChainWideConvGradBundle(), images);
  }();
  return *setup;
}

using protocol::CheckStage;
using protocol::UnitCheck;
using protocol::Verdict;
using testing::ExpectRulings;
using testing::RulingBy;

class TileChainTest : public testing::FollowedChainFixture {
 protected:
  TileChainTest()
      : gina_(testing::TestKey(7)),
        referee_(testing::TestKey(8)),
        solver_(testing::TestKey(21)),
        verifier_(testing::TestKey(23)),
        wb_(testing::TestKey(25)) {
    genesis_ = DevnetGenesis(
        {alice_.public_key(), bob_.public_key(), gina_.public_key(), referee_.public_key()}, kFunds,
        "tile-chain");
    testing::SetVerifyingTestParams(genesis_.params);
    genesis_.referee = referee_.public_key();
    owner_[solver_.public_key()] = &alice_;
    owner_[verifier_.public_key()] = &bob_;
    owner_[wb_.public_key()] = &referee_;
  }

  void SetUp() override {
    FollowedChainFixture::SetUp();
    g_setup = &ChainSetup();
  }
  // Plays the fashion CNN's task instead (before Submit).
  void UseCnn() {
    bundle_ = &ChainCnnBundle();
    g_setup = &ChainCnnSetup();
  }
  // The same with a dropout layer (before Submit).
  void UseCnnWithDropout() {
    bundle_ = &ChainCnnDropoutBundle();
    g_setup = &ChainCnnDropoutSetup();
  }
  // The same with a layernorm and a dropout on its images (before Submit).
  void UseCnnWithImageLayerNorm() {
    bundle_ = &ChainCnnNormBundle();
    g_setup = &ChainCnnNormSetup();
  }
  // A model with a layernorm over rows of 392, narrowed (before Submit).
  void UseWideImageLayerNorm() {
    bundle_ = &ChainWideNormBundle();
    g_setup = &ChainWideNormSetup();
  }
  // A model with a conv2d over images 196 wide, narrowed to its windows' columns (before
  // Submit).
  void UseWideConv() {
    bundle_ = &ChainWideConvBundle();
    g_setup = &ChainWideConvSetup();
  }
  // A model whose conv2d weight gradient chains a sample's run of a row a block (before
  // Submit).
  void UseWideConvGrad() {
    bundle_ = &ChainWideConvGradBundle();
    g_setup = &ChainWideConvGradSetup();
  }
  // Plays the 10M GPT's task instead (a token task; before Submit).
  void UseGpt() {
    bundle_ = &ChainGptBundle();
    g_setup = &ChainGptSetup();
  }
  // The same in two micro-batches of one sequence a step.
  void UseGptInMicroBatches() {
    bundle_ = &ChainGptMicroBundle();
    g_setup = &ChainGptMicroSetup();
  }
  // A one-layer GPT with one head of 512 columns (before Submit).
  void UseWideHeadGpt() {
    bundle_ = &ChainWideHeadGptBundle();
    g_setup = &ChainWideHeadGptSetup();
  }

  Transaction N(const KeyPair& node, TxPayload p) { return Q(*owner_.at(node.public_key()), p); }
  void StepOk(std::vector<Transaction> txs) {
    for (const Receipt& r : Step(std::move(txs))) EXPECT_TRUE(r.ok) << r.reason;
  }
  static Hash256 Secret(const KeyPair& node, uint64_t i) {
    return protocol::SecretChainElement(Blake2b("seed " + node.public_key().ToHex()), i);
  }
  RegisterNodeTx Reg(const KeyPair& node, uint32_t roles) {
    return RegisterNodeTx{.node_id = node.public_key(),
                          .endpoint = "http://node:1",
                          .roles = roles,
                          .capabilities = {.cores = 4,
                                           .memory_bytes = 1ull << 30,
                                           .throughput = 1'000'000'000'000,
                                           .latency_ms = 1,
                                           .bandwidth_bytes_per_s = 1'000'000'000},
                          .price = testing::kTestPrice,
                          .stake = 100'000,
                          .secret_head = Secret(node, 0)};
  }
  TaskRecord Task() { return chain_->GetTask(task_id_).value(); }
  WorkUnit Unit() { return chain_->GetWorkUnit(task_id_, 0).value(); }
  UnitCheck Check() { return UnitCheck::Decode(Unit().check).value(); }
  bool HasCheck() { return !Unit().check.empty(); }
  NodeRecord Node(const KeyPair& k) { return chain_->GetNode(k.public_key()).value(); }

  // Registers the solver and the verifier and submits the one-unit task; the unit is assigned.
  // `tweak` (optional) then edits the params.
  void Submit(const std::function<void(TaskParams&)>& tweak = nullptr) {
    StepOk({N(solver_, Reg(solver_, kRoleSolver)), N(verifier_, Reg(verifier_, kRoleVerifier))});
    ASSERT_FALSE(::testing::Test::HasFailure());
    TaskParams p = testing::TestTaskParams();
    p.rounds = 1;
    p.units_per_round = 1;
    p.inner_steps = kSteps;
    p.checkpoint_interval = kSteps;
    p.batch_size = 128;
    p.num_examples = kExamples;
    p.verification_window_blocks = 12;
    // A token task's data root is over its train stream's pages (its batches are not examples).
    p.data_root = Tree().root();
    if (g_setup != nullptr && g_setup->pages != nullptr) {
      p.data_root = g_setup->pages->root();
      p.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
      p.num_examples = static_cast<uint64_t>(g_setup->pages->num_tokens());
    }
    if (tweak) tweak(p);
    const Amount budget = MaxTaskCost(p, 20, nullptr, genesis_.params.verifiers_per_unit);
    Transaction submit =
        Q(gina_, SubmitTaskTx{.spec_hash = BuildManifest(AsBytes(*bundle_)).id().hash,
                              .budget = budget,
                              .price_cap = 20,
                              .params = p});
    task_id_ = TaskIdFor(gina_.public_key(), submit.nonce);
    StepOk({submit});
    for (int i = 0; i < 10 && Unit().status != WorkUnitStatus::kAssigned; ++i) Step();
    ASSERT_EQ(Unit().status, WorkUnitStatus::kAssigned);
    ASSERT_EQ(Unit().assignee, solver_.public_key());
  }

  // The solver commits unit 0 with step leaves `leaves`; its check waits for verdicts.
  void CommitUnit(const std::vector<Hash256>& leaves) {
    StepOk({N(solver_, CommitUnitTx{.task_id = task_id_,
                                    .index = 0,
                                    .node_id = solver_.public_key(),
                                    .result_hash = Blake2b("delta"),
                                    .commitment = MerkleRoot(leaves),
                                    .loss_micros = 1,
                                    .secret_index = Node(solver_).secrets_committed + 1,
                                    .leaves = leaves})});
    for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckCommitVerdicts; ++i) Step();
    ASSERT_EQ(Check().stage(), CheckStage::kCheckCommitVerdicts);
  }

  // For CommitAndDispute's refused_reveals: the two ways to open the dispute without the task
  // bundle, the verifier's mismatch and a whistleblower's challenge, each refused for `why`.
  std::function<std::vector<std::pair<Transaction, std::string>>(const Hash256& salt)>
  WithoutTheBundle(const std::string& why) {
    return [this, why](const Hash256& salt) {
      return std::vector<std::pair<Transaction, std::string>>{
          {N(verifier_, RevealVerdictTx{.task_id = task_id_,
                                        .index = 0,
                                        .node_id = verifier_.public_key(),
                                        .verdict = static_cast<uint8_t>(Verdict::kVerdictMismatch),
                                        .salt = salt,
                                        .claim = claim_,
                                        .bundle = {""}}),
           why},
          {N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                  .index = 0,
                                  .node_id = wb_.public_key(),
                                  .claim = claim_}),
           why}};
    };
  }

  // The solver commits `solver`'s states; the drawn verifier claims segment 0 ends at
  // `verifier`'s state (revealed with `bundle`); the dispute opens.
  void CommitAndDispute(
      const PartyRun& solver, const PartyRun& verifier, const std::string& bundle,
      std::function<std::vector<std::pair<Transaction, std::string>>(const Hash256& salt)>
          refused_reveals = nullptr) {
    const std::vector<Hash256> leaves = {solver.state[0], solver.state[kSteps]};
    ASSERT_NO_FATAL_FAILURE(CommitUnit(leaves));
    ASSERT_EQ(Check().verifiers().at(0), verifier_.public_key());
    auto proof = [&](uint64_t i) {
      MerkleProof m = MerkleProve(leaves, i);
      return MerkleProofField{.index = m.index, .leaf_count = m.leaf_count, .siblings = m.siblings};
    };
    claim_ = MismatchClaimField{.segment = 0,
                                .start = leaves[0],
                                .start_proof = proof(0),
                                .solver_end = leaves[1],
                                .end_proof = proof(1),
                                .replayed_end = verifier.state[kSteps]};
    const Hash256 salt = Blake2b("salt");
    StepOk(
        {N(verifier_, CommitVerdictTx{.task_id = task_id_,
                                      .index = 0,
                                      .node_id = verifier_.public_key(),
                                      .commitment = protocol::VerdictCommitment(
                                          Verdict::kVerdictMismatch, salt, verifier_.public_key(),
                                          Check().config().unit,
                                          protocol::MismatchEvidence(0, claim_.replayed_end))})});
    for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckRevealVerdicts; ++i) Step();
    ASSERT_EQ(Check().stage(), CheckStage::kCheckRevealVerdicts);
    // Transactions that must be refused (with these reasons) go first, in the same block: the
    // reveal window is short.
    std::vector<std::pair<Transaction, std::string>> refused;
    if (refused_reveals) refused = refused_reveals(salt);
    std::vector<Transaction> txs;
    for (const auto& [tx, why] : refused) txs.push_back(tx);
    txs.push_back(
        N(verifier_, RevealVerdictTx{.task_id = task_id_,
                                     .index = 0,
                                     .node_id = verifier_.public_key(),
                                     .verdict = static_cast<uint8_t>(Verdict::kVerdictMismatch),
                                     .salt = salt,
                                     .claim = claim_,
                                     .bundle = {bundle}}));
    txs.push_back(N(solver_, RevealSecretTx{.task_id = task_id_,
                                            .index = 0,
                                            .node_id = solver_.public_key(),
                                            .secret = Secret(solver_, Unit().secret_index),
                                            .start_leaf = solver.state[0]}));
    std::vector<Receipt> receipts = Step(txs);
    ASSERT_EQ(receipts.size(), txs.size());
    for (size_t i = 0; i < receipts.size(); ++i) {
      if (i < refused.size()) {
        EXPECT_FALSE(receipts[i].ok) << refused[i].second;
        EXPECT_NE(receipts[i].reason.find(refused[i].second), std::string::npos)
            << receipts[i].reason;
      } else {
        EXPECT_TRUE(receipts[i].ok) << receipts[i].reason;
      }
    }
    for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckDisputed; ++i) Step();
    ASSERT_EQ(Check().stage(), CheckStage::kCheckDisputed);
  }

  // Both parties answer every query of the game from their runs, as transactions, until it
  // reaches the referee or resolves; a silent party posts nothing at `silence`'s phase.
  void PlayOnChain(const PartyRun& defender, const PartyRun& challenger,
                   std::optional<Silence> silence = std::nullopt) {
    for (int turn = 0; turn < 80; ++turn) {
      if (!HasCheck() || Check().stage() != CheckStage::kCheckDisputed) return;
      const protocol::DisputeGame g = *Check().dispute();
      if (g.stage() == DisputeStage::kDisputeReferee ||
          g.stage() == DisputeStage::kDisputeResolved) {
        return;
      }
      const DisputeQuery q = g.query();
      const bool quiet =
          silence && q.stage == silence->stage &&
          (q.stage != DisputeStage::kDisputeTiles || q.children == silence->children);
      std::vector<Transaction> txs;
      for (DisputeParty party : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
        if (quiet && silence->party == party) continue;
        const KeyPair& node = party == DisputeParty::kDefender            ? solver_
                              : g.config().challenger == wb_.public_key() ? wb_
                                                                          : verifier_;
        const PartyRun& run = party == DisputeParty::kDefender ? defender : challenger;
        const Move m = Answer(run, q);
        if (q.stage != DisputeStage::kDisputeSteps && run.steps.at(q.step).fake.empty() &&
            run.steps.at(q.step).trace) {
          // What a node answers (ledger::AnswerTileQuery) is this test's honest answer.
          const StepRecord& rec = run.steps.at(q.step);
          Result<DisputeMoveAnswer> a =
              AnswerTileQuery(Context(), q, run.state.at(q.step - 1), *rec.trace, rec.batch);
          EXPECT_TRUE(a.ok()) << a.status().ToString();
          if (a.ok()) {
            EXPECT_EQ(a->children, m.children.has_value());
            if (m.children) {
              EXPECT_EQ(a->left, m.children->first);
              EXPECT_EQ(a->right, m.children->second);
            } else {
              EXPECT_EQ(a->hash, m.hash);
            }
          }
        }
        if (m.children) {
          txs.push_back(N(node, DisputeChildrenTx{.task_id = task_id_,
                                                  .index = 0,
                                                  .node_id = node.public_key(),
                                                  .position = q.position,
                                                  .left = m.children->first,
                                                  .right = m.children->second}));
        } else {
          txs.push_back(N(node, DisputePostTx{.task_id = task_id_,
                                              .index = 0,
                                              .node_id = node.public_key(),
                                              .position = q.position,
                                              .hash = m.hash}));
        }
      }
      StepOk(txs);
      if (quiet) {
        for (uint64_t i = 0; i <= g.config().response_blocks; ++i) Step();
      }
    }
    ADD_FAILURE() << "the game did not end";
  }

  RefereeTask RefereeTaskNow() {
    EXPECT_EQ(Check().stage(), CheckStage::kCheckDisputed);
    EXPECT_EQ(Check().dispute()->stage(), DisputeStage::kDisputeReferee);
    return Check().dispute()->referee_task();
  }

  Transaction RefereeTile(const KeyPair& sender, const Bytes& witness) {
    return RefereeTile(sender, witness, *bundle_);
  }
  Transaction RefereeTile(const KeyPair& sender, const Bytes& witness, const std::string& bundle) {
    return Q(
        sender,
        RefereeTileTx{.task_id = task_id_, .index = 0, .bundle = {bundle}, .witness = {witness}});
  }

  // The genesis referee's word is refused for a dispute the ledger rules itself.
  void ExpectGenesisRefereeRefused(const RefereeTask& task, const std::string& instead) {
    std::vector<Receipt> r =
        Step({Q(referee_,
                RuleDisputeTx{.task_id = task_id_, .index = 0, .output = task.challenger_output})});
    EXPECT_EQ(r.at(0).code, StatusCode::kFailedPrecondition) << r.at(0).reason;
    EXPECT_NE(r.at(0).reason.find(instead), std::string::npos) << r.at(0).reason;
  }

  // After the ruling: the liar lost (slashed), the honest side did not.
  void ExpectTheLiarSlashed(bool solver_lies) {
    for (int i = 0; i < 6 && HasCheck() && Check().stage() != CheckStage::kCheckSettled; ++i) {
      Step();
    }
    if (solver_lies) {
      EXPECT_FALSE(HasCheck()) << "fraud: the round re-runs without the cheater";
      EXPECT_EQ(Node(solver_).reputation.slashes, 1u);
      EXPECT_EQ(Node(verifier_).reputation.slashes, 0u);
    } else {
      ASSERT_TRUE(HasCheck());
      EXPECT_EQ(Check().result(), protocol::CheckResult::kCheckClean) << Check().reason();
      EXPECT_EQ(Node(verifier_).reputation.slashes, 1u);
      EXPECT_EQ(Node(solver_).reputation.slashes, 0u);
    }
  }

  // Plays `lie` on chain with the liar in `solver_lies`' role: returns the ruling transaction's
  // witness size (0 for a whole step).
  size_t PlayLieOnChain(const PartyRun& liar, bool solver_lies, bool want_tile) {
    const PartyRun& honest = Honest();
    const PartyRun& solver = solver_lies ? liar : honest;
    const PartyRun& verifier = solver_lies ? honest : liar;
    Submit();
    CommitAndDispute(solver, verifier, *bundle_);
    if (::testing::Test::HasFatalFailure()) return 0;
    EXPECT_TRUE(Check().has_tile_phase());
    EXPECT_EQ(Unit().check[0], 2) << "a check with the tile phase encodes as version 2";
    PlayOnChain(solver, verifier);
    const RefereeTask task = RefereeTaskNow();
    const uint32_t turns = Check().dispute()->turns();
    EXPECT_EQ(task.step, kLieStep);
    EXPECT_EQ(task.tile, want_tile);
    size_t bytes = 0;
    // The ruling transaction that executes, kept in the task's record (checked at the end).
    Transaction ruling;
    const uint32_t round = Unit().round;
    if (task.tile) {
      ExpectGenesisRefereeRefused(task, "RefereeTile");
      // A RefereeStep does not rule a tile.
      std::vector<Receipt> r =
          Step({Q(gina_, RefereeStepTx{.task_id = task_id_, .index = 0, .witness = {Bytes{1}}})});
      EXPECT_NE(r.at(0).reason.find("send RefereeTile"), std::string::npos) << r.at(0).reason;
      // Anyone (here the submitter) posts the witness, built from the honest run; the ledger
      // recomputes the tile.
      Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), *bundle_, "test");
      EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
      const StepRecord& rec = honest.steps.at(task.step);
      Result<TileWitness> w = BuildTileWitness(*ctx, task, *rec.trace, rec.batch, &Data().train,
                                               &Tree(), g_setup->pages);
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      const Bytes encoded = EncodeTileWitness(*w);
      bytes = encoded.size();
      EXPECT_LE(bytes, kMaxTileWitnessBytes);
      ruling = RefereeTile(gina_, encoded);
      StepOk({ruling});
      std::printf(
          "[ on chain ] %-22s tile %4llu block %u: %2u turns, RefereeTile witness %6zu "
          "bytes\n",
          Context().plan.ops.at(task.operator_index - 1).name.c_str(),
          static_cast<unsigned long long>(task.tile_index), task.block, turns, bytes);
    } else if (task.roots != protocol::RefereeRoots::kRootsNone &&
               RulesFromRoots(TileContextOf(Task(), Unit(), *bundle_, "test")->plan, task)) {
      // A whole step that follows from roots: the genesis key is refused (for a token task too),
      // a wrong roots witness is refused, the honest run's roots rule.
      ExpectGenesisRefereeRefused(task, "RefereeTile");
      Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), *bundle_, "test");
      EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
      const StepRecord& rec = honest.steps.at(task.step);
      Result<TileWitness> w =
          BuildTileWitness(*ctx, task, *rec.trace, rec.batch, nullptr, nullptr, nullptr);
      EXPECT_TRUE(w.ok()) << w.status().ToString();
      TileWitness wrong = *w;
      wrong.outputs.back().bytes[0] ^= 1;
      std::vector<Receipt> r = Step({RefereeTile(gina_, EncodeTileWitness(wrong))});
      EXPECT_EQ(r.at(0).code, StatusCode::kInvalidArgument) << r.at(0).reason;
      EXPECT_NE(r.at(0).reason.find("referee tile: roots rule"), std::string::npos)
          << r.at(0).reason;
      EXPECT_EQ(Check().dispute()->stage(), DisputeStage::kDisputeReferee);
      const Bytes encoded = EncodeTileWitness(*w);
      bytes = encoded.size();
      EXPECT_LE(bytes, kMaxTileWitnessBytes);
      ruling = RefereeTile(gina_, encoded);
      StepOk({ruling});
      if (HasCheck() && Check().dispute().has_value() &&
          Check().dispute()->stage() == DisputeStage::kDisputeResolved) {
        // The reason says how it was ruled (from roots, not by recomputing the step). A copy:
        // Check() returns a temporary.
        const std::string reason = Check().dispute()->outcome().reason;
        EXPECT_NE(reason.find(task.roots == protocol::RefereeRoots::kRootsChainEnd
                                  ? "from the roots of the agreed chain end"
                                  : "from the input state's roots"),
                  std::string::npos)
            << reason;
      }
      std::printf("[ on chain ] %s of step %llu: %2u turns, RefereeTile roots witness %6zu bytes\n",
                  task.roots == protocol::RefereeRoots::kRootsChainEnd
                      ? "chain end agreed"
                      : ("input-state operator " + std::to_string(task.operator_index)).c_str(),
                  static_cast<unsigned long long>(task.step), turns, bytes);
    } else {
      ExpectGenesisRefereeRefused(task, "RefereeStep");
      if (task.roots == protocol::RefereeRoots::kRootsOperator) {
        // An operator without tiles that the step computes (no footprint yet): roots do not rule
        // it (a RefereeTile of the input state's roots is refused, naming the whole step).
        Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), *bundle_, "test");
        EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
        TileWitness roots;
        roots.outputs.assign(honest.steps.at(task.step).roots.begin(),
                             honest.steps.at(task.step).roots.begin() + 4);
        std::vector<Receipt> r = Step({RefereeTile(gina_, EncodeTileWitness(roots))});
        EXPECT_EQ(r.at(0).code, StatusCode::kFailedPrecondition) << r.at(0).reason;
        EXPECT_NE(r.at(0).reason.find("the whole step decides"), std::string::npos)
            << r.at(0).reason;
        std::printf("[ on chain ] %s (no footprint): RefereeTile of roots refused, RefereeStep\n",
                    ctx->plan.ops.at(task.operator_index - 1).name.c_str());
      }
      StepWitness w{.bundle = *bundle_, .state = honest.before_lie, .examples = {}};
      for (int64_t i : engine::BatchIndices(Context().seed, Context().stream, kExamples, 128,
                                            static_cast<int64_t>(task.step) - 1)) {
        StepWitnessExample e{.index = static_cast<uint64_t>(i),
                             .x = {},
                             .y = Data().train.y[static_cast<size_t>(i)],
                             .proof = Tree().Prove(i)};
        e.x.assign(Data().train.x.data() + i * 784, Data().train.x.data() + (i + 1) * 784);
        w.examples.push_back(std::move(e));
      }
      ruling = Q(gina_,
                 RefereeStepTx{.task_id = task_id_, .index = 0, .witness = {EncodeStepWitness(w)}});
      StepOk({ruling});
    }
    const uint64_t ruled_at = chain_->Height();
    // Ruled: the check settles (a cheating solver's round re-runs, dropping it).
    if (HasCheck()) {
      EXPECT_EQ(Check().dispute()->stage(), DisputeStage::kDisputeResolved);
    }
    ExpectTheLiarSlashed(solver_lies);
    // The task keeps the ruling, whichever transaction made it and whatever became of the check:
    // the refused transactions before it left none. The reason is the game's (how it was ruled),
    // ending with whose output was wrong.
    DisputeRuling want = RulingBy(ruling, ruled_at);
    want.index = 0;
    want.round = round;
    want.step = task.step;
    want.defender = solver_.public_key();
    want.challenger = verifier_.public_key();
    want.witness_bytes = std::get_if<RefereeStepTx>(&ruling.payload)
                             ? std::get<RefereeStepTx>(ruling.payload).witness.bytes.size()
                             : bytes;
    want.defender_honest = !solver_lies;
    want.challenger_honest = solver_lies;
    const TaskRecord t = Task();
    if (!t.verification.rulings.empty()) {
      const std::string& reason = t.verification.rulings.back().reason;
      const std::string suffix =
          solver_lies ? ": the defender's output is wrong" : ": the challenger's output is wrong";
      EXPECT_TRUE(reason.rfind("referee ", 0) == 0 && reason.ends_with(suffix)) << reason;
      want.reason = reason;
    }
    ExpectRulings(t, {want});
    return bytes;
  }

  static constexpr Amount kFunds = 1'000'000;
  const std::string* bundle_ = &ChainBundle();
  KeyPair gina_, referee_, solver_, verifier_, wb_;
  std::map<PublicKey, const KeyPair*> owner_;
  Hash256 task_id_;
  MismatchClaimField claim_;
};

class TileChainLieTest : public TileChainTest, public ::testing::WithParamInterface<bool> {};

TEST_P(TileChainLieTest, ALieAtATileIsRuledOnChainByRefereeTile) {
  const bool solver_lies = GetParam();
  // A first-layer tile: 32 examples proven against the data root and a block of the weight (the
  // largest witness of this model).
  PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.out", 40, 40}), solver_lies, true);
}

TEST_P(TileChainLieTest, ALieAtAReductionBlockIsRuledOnChainByRefereeTile) {
  PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.weight.grad", 200, 700, 2}), GetParam(), true);
}

TEST_P(TileChainLieTest, AWrongOperatorIsNarrowedToATileAndRuledOnChain) {
  PlayLieOnChain(Train(Lie{LieKind::kWrongUpdate}), GetParam(), true);
}

// The two whole steps that follow from roots, through real transactions: a lie in the state only
// (the chain end agreed) and a lie in the step's input state (an "in.<name>" operator); each
// ruled by a RefereeTile with a witness of operator output roots, the genesis key refused.
TEST_P(TileChainLieTest, ALieInTheStateOnlyIsRuledOnChainFromRoots) {
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kStepState}), GetParam(), false), 0u);
}

TEST_P(TileChainLieTest, ALieInTheStepsInputStateIsRuledOnChainFromRoots) {
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kInputState}), GetParam(), false), 0u);
}

// A lie in an AdamW moment only, through real transactions: narrowed to a tile of the moment
// after the update and ruled by RefereeTile, the genesis key's RuleDispute refused.
TEST_P(TileChainLieTest, ALieInAnOptimizerMomentIsRuledOnChainByRefereeTile) {
  PlayLieOnChain(Train(Lie{LieKind::kMoment, "optim.v.layers.0.weight", 100, 300}), GetParam(),
                 true);
}

INSTANTIATE_TEST_SUITE_P(EachSideLies, TileChainLieTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "SolverLies" : "VerifierLies";
});

// The fashion CNN through the same transactions: lies at both convolutions (the second narrowed
// into blocks of 4 input channels) and at the narrowed 1568-input linear, each ruled on chain.
TEST_P(TileChainLieTest, OnTheFashionCnnAFirstConvTileIsRuledOnChain) {
  UseCnn();
  PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.out", 70, 2000}), GetParam(), true);
}

TEST_P(TileChainLieTest, OnTheFashionCnnASecondConvBlockIsRuledOnChain) {
  UseCnn();
  PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.out", 9, 700, 2}), GetParam(), true);
}

TEST_P(TileChainLieTest, OnTheFashionCnnANarrowedLinearBlockIsRuledOnChain) {
  UseCnn();
  PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.7.out", 40, 100, 3}), GetParam(), true);
}

// A dropout layer's tiles (in the CNN with one after its flatten): the ledger draws each
// element's mask from the unit's dropout seed (the task's seed and the unit's stream), so a lie
// at its output or at its input gradient is ruled by RefereeTile from the input tile alone.
TEST_P(TileChainLieTest, OnACnnWithDropoutADropoutTileIsRuledOnChainByRefereeTile) {
  UseCnnWithDropout();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.7.out", 9, 700}), GetParam(), true),
            0u);
}

TEST_P(TileChainLieTest, OnACnnWithDropoutADropoutGradientTileIsRuledOnChainByRefereeTile) {
  UseCnnWithDropout();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.7.in.grad", 20, 1000}), GetParam(), true),
      0u);
}

// A layernorm over the CNN's images' last dimension (runs of 14): a lie at its output (the runs
// of the tile's rows), at its input gradient, and at a block of its weight gradient's chain over
// the runs, and a lie at the dropout on those images; each ruled by RefereeTile.
TEST_P(TileChainLieTest, OnACnnWithAnImageLayerNormItsTileIsRuledOnChainByRefereeTile) {
  UseCnnWithImageLayerNorm();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.out", 9, 700}), GetParam(), true),
            0u);
}

TEST_P(TileChainLieTest, OnACnnWithAnImageLayerNormItsGradientTileIsRuledOnChainByRefereeTile) {
  UseCnnWithImageLayerNorm();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.in.grad", 5, 2000}), GetParam(), true),
      0u);
}

TEST_P(TileChainLieTest, OnACnnWithAnImageLayerNormAWeightGradientBlockIsRuledOnChain) {
  UseCnnWithImageLayerNorm();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.weight.grad", 0, 5, 7}), GetParam(), true),
      0u);
}

TEST_P(TileChainLieTest, OnACnnWithAnImageLayerNormADropoutOnTheImagesIsRuledOnChain) {
  UseCnnWithImageLayerNorm();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.4.out", 30, 3000}), GetParam(), true),
            0u);
}

// A layernorm over rows of 392 (wider than the 256 an image layernorm's tile is recomputed whole
// at), which was the last operator of a sequential model without a footprint: a lie at its
// output (in a tile across its two runs, the liar's sums honest) narrows to the tile's last
// block (its own columns, from both runs' agreed statistics), and one at a block of its weight
// gradient's chain (one run a block, narrowed into sum sub-blocks and column chunks), each ruled
// by RefereeTile within the bound, not by the whole step (whose 8 MiB witness would not fit over
// a larger model).
TEST_P(TileChainLieTest, OnAWideImageLayerNormItsTileIsRuledOnChainByRefereeTile) {
  UseWideImageLayerNorm();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.out", 9, 400, 4}), GetParam(), true), 0u);
}

TEST_P(TileChainLieTest, OnAWideImageLayerNormAWeightGradientBlockIsRuledOnChain) {
  UseWideImageLayerNorm();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.weight.grad", 0, 5, 10}),
                           GetParam(), true),
            0u);
}

// A conv2d over images 196 wide, whose block over whole image rows would grow with the width: a
// lie at its output's second block (pairs (1, 1), (1, 2) of its chain over (c, kh), reading the
// window columns of two input rows) and one at its input gradient's second block, each ruled by
// RefereeTile.
TEST_P(TileChainLieTest, OnAWideConvABlockOfItsOutputIsRuledOnChainByRefereeTile) {
  UseWideConv();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.1.out", 9, 500, 1}), GetParam(), true), 0u);
}

TEST_P(TileChainLieTest, OnAWideConvABlockOfItsInputGradientIsRuledOnChain) {
  UseWideConv();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.1.in.grad", 30, 300, 1}),
                           GetParam(), true),
            0u);
}

// A lie at a block of a conv2d weight gradient narrowed to one sample's run of 32 outputs of a
// row (block 2601 of 9,984: sample 33's, output row 1, its first run, output channel 1), ruled by
// RefereeTile for the honest side.
TEST_P(TileChainLieTest, OnAWideConvAWeightGradientRunBlockIsRuledOnChain) {
  UseWideConvGrad();
  // The chain runs a run of a row a block (a row block of the batch would be 4 blocks a group).
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("layers.1.weight.grad")),
            128 * 3 * 13 * 2);
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.1.weight.grad", 1, 4, 2601}),
                           GetParam(), true),
            0u);
}

// The CNN's gradients through the same transactions: a block of the second conv's input
// gradient (narrowed into blocks of 4 of its 32 output channels), a tile of the second max-pool's
// (its windows' argmax recomputed from the forward's input), and a block of each conv's weight
// gradient (a row block of the batch over a group of output channels), each ruled by RefereeTile.
TEST_P(TileChainLieTest, OnTheFashionCnnAConvInputGradientBlockIsRuledOnChain) {
  UseCnn();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.in.grad", 9, 700, 2}), GetParam(), true),
      0u);
}

TEST_P(TileChainLieTest, OnTheFashionCnnAMaxPoolGradientTileIsRuledOnChain) {
  UseCnn();
  EXPECT_GT(
      PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.5.in.grad", 30, 1000}), GetParam(), true),
      0u);
}

TEST_P(TileChainLieTest, OnTheFashionCnnAConvWeightGradientBlockIsRuledOnChain) {
  UseCnn();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.3.weight.grad", 20, 300, 5}),
                           GetParam(), true),
            0u);
}

// The first conv's: its block reads 32 of the batch's examples, proven against the data root,
// and one output plane of dout (the largest CNN witness).
TEST_P(TileChainLieTest, OnTheFashionCnnAFirstConvWeightGradientBlockIsRuledOnChain) {
  UseCnn();
  EXPECT_GT(PlayLieOnChain(Train(Lie{LieKind::kTile, "layers.0.weight.grad", 3, 20, 19}),
                           GetParam(), true),
            0u);
}

// The 10M GPT (a token task, its data root over its token pages) through the same transactions:
// a lie at a qkv tile, the liar the solver, ruled by RefereeTile. Slow (two traced runs of 4 steps
// of 10.8M parameters).
TEST_F(TileChainTest, OnThe10mGptALinearTileIsRuledOnChain) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kTile, "h.0.qkv", 100, 500}), true, true);
  EXPECT_GT(bytes, 0u);
}

// A one-layer GPT with one head of 512 columns at T = 128, whose att tile recomputed whole would
// read 320 KiB of q and k: att is narrowed over its positions and over the head's columns in two
// blocks of 256 (18 blocks), its backward's dA dots in four of 128 (80 blocks). A lie from att's
// second column block of its first max block (the agreed partial carries the dots of the first
// 256 columns; the solver lies) and one from the third column block of a row-sum block of a k
// tile of qkv.grad (the verifier lies), each ruled by RefereeTile from a witness under 256 KiB.
TEST_F(TileChainTest, OnAWideHeadGptAnAttentionColumnBlockIsRuledOnChain) {
  UseWideHeadGpt();
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("h.0.att")), 18);
  // Element 20 of tile (1, 0) is also row 20's entry of the statistics every partial starts with.
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kTile, "h.0.att", 32, 20, 1}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, 256u * 1024);
}

TEST_F(TileChainTest, OnAWideHeadGptAnAttentionBackwardColumnBlockIsRuledOnChain) {
  UseWideHeadGpt();
  ASSERT_EQ(engine::ReductionBlocks(Context().plan, OpIndex("h.0.qkv.grad")), 80);
  const size_t bytes =
      PlayLieOnChain(Train(Lie{LieKind::kTile, "h.0.qkv.grad", 40, 600, 22}), false, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, 256u * 1024);
}

// A lie at the 10M GPT's token embeddings: the witness carries the pages of the train stream
// holding the tile's 32 tokens, proven against the task's data root; ruled by RefereeTile.
TEST_F(TileChainTest, OnThe10mGptATokenEmbeddingTileIsRuledOnChain) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kTile, "encoded", 40, 300}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// The 10M GPT (a token task, whose whole steps the ledger does not execute) at the two whole
// steps that follow from roots, the liar the solver: the genesis key's RuleDispute is refused and
// a RefereeTile of operator output roots rules (655 roots: 21 KB; 228 input-state roots: 7 KB).
// Slow.
TEST_F(TileChainTest, OnThe10mGptALieInTheStateOnlyIsRuledOnChainFromRoots) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kStepState}), true, false);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

TEST_F(TileChainTest, OnThe10mGptALieInTheStepsInputStateIsRuledOnChainFromRoots) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kInputState}), true, false);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// Lies at the 10M GPT's gradients through the same transactions (one game a ledger): a
// layernorm's input gradient added into the residual gradient (whole rows), and a block of a
// layernorm weight gradient's chain over the rows; each ruled by RefereeTile within the bound.
TEST_F(TileChainTest, OnThe10mGptAGradientTileIsRuledOnChain) {
  UseGpt();
  const size_t bytes =
      PlayLieOnChain(Train(Lie{LieKind::kTile, "h.1.residual.grad", 3, 3}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

TEST_F(TileChainTest, OnThe10mGptAGradientChainBlockIsRuledOnChain) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(
      Train(Lie{LieKind::kTile, "transformer.h.2.ln_1.weight.grad", 0, 100, 6}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// A solver of the 10M GPT lying only in an AdamW moment (wte's second moment, a clipped step):
// before the moments were operators this ended at a whole step of a token task, ruled by the
// genesis key; now RefereeTile rules a tile of the moment. Slow.
TEST_F(TileChainTest, OnThe10mGptALieInAnOptimizerMomentIsRuledOnChain) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(
      Train(Lie{LieKind::kMoment, "optim.v.transformer.wte.weight", 40, 300}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// A lazy solver of the 10M GPT (it skipped the update of a clipped step) through the same
// transactions: ruled by RefereeTile at a clipped AdamW tile, and slashed.
TEST_F(TileChainTest, OnThe10mGptALazySolverIsRuledOnChainAtAClippedUpdateTile) {
  UseGpt();
  const size_t bytes = PlayLieOnChain(Train(Lie{LieKind::kSkippedUpdate}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// A token task's mismatch must carry the task bundle (DisputeNeedsBundle): played over whole
// steps, its dispute could only be ruled by the genesis key (the ledger does not execute a token
// task's step). A reveal or a challenge without it is refused, naming the fix; with it the
// dispute plays the operator and tile phases, and where it ends (here the chain end both agree
// to, the states after the step differing) the genesis key is refused. Nothing is trained: the
// parties' hashes stand in for runs (the ledger checks none before the referee).
TEST_F(TileChainTest, OnThe10mGptAMismatchWithoutTheBundleIsRefused) {
  UseGpt();
  PartyRun solver, verifier;
  for (uint64_t s = 0; s <= kSteps; ++s) {
    solver.state.push_back(Blake2b("state " + std::to_string(s)));
    verifier.state.push_back(s < kSteps ? solver.state.back() : Blake2b("other state"));
  }
  StepOk({N(wb_, Reg(wb_, kRoleWhistleblower))});
  Submit();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(DisputeNeedsBundle(Task().params));
  const std::string why = "bundle is empty, but unit 0 belongs to token task";
  CommitAndDispute(solver, verifier, ChainGptBundle(), WithoutTheBundle(why));
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(Check().has_tile_phase());
  EXPECT_EQ(Check().dispute()->config().num_operators, Context().plan.ops.size());
  // Steps 1..kSteps - 1 agreed, the last one disputed; its operator chain end agreed.
  for (int turn = 0; turn < 10; ++turn) {
    const protocol::DisputeGame g = *Check().dispute();
    if (g.stage() == DisputeStage::kDisputeReferee) break;
    const DisputeQuery q = g.query();
    ASSERT_TRUE(q.stage == DisputeStage::kDisputeSteps ||
                q.stage == DisputeStage::kDisputeOperators);
    auto post = [&](const KeyPair& node, const PartyRun& run) {
      const Hash256 h = q.stage == DisputeStage::kDisputeSteps ? run.state.at(q.position)
                                                               : Blake2b("agreed chain end");
      return N(node, DisputePostTx{.task_id = task_id_,
                                   .index = 0,
                                   .node_id = node.public_key(),
                                   .position = q.position,
                                   .hash = h});
    };
    StepOk({post(solver_, solver), post(verifier_, verifier)});
  }
  const RefereeTask task = RefereeTaskNow();
  EXPECT_EQ(task.step, kSteps);
  EXPECT_EQ(task.roots, protocol::RefereeRoots::kRootsChainEnd);
  ExpectGenesisRefereeRefused(task, "RefereeTile");
  std::vector<Receipt> r =
      Step({Q(gina_, RefereeStepTx{.task_id = task_id_, .index = 0, .witness = {Bytes{1}}})});
  EXPECT_FALSE(r.at(0).ok);
}

// A classification task's whole step is ruled from a witness that carries the unit's state
// (RefereeStep), which the ledger sizes from the task record alone: params.model_bytes (which every
// node checks against the bundle) with two optimizer moments (MaxUnitStateBytes). Over
// kMaxStepWitnessState the mismatch must carry the bundle (DisputeNeedsBundle): played over whole
// steps, its dispute could end undecided with no witness that fits. The wider MLP's reveal or
// challenge without it is refused by name; with it the dispute plays the tile phase. The fashion
// MLP's state (235,146 parameters) is within the bound: its mismatch needs none. Nothing is
// trained: the parties' hashes stand in for runs.
TEST_F(TileChainTest, AClassificationModelOverTheStepWitnessBoundNeedsTheBundle) {
  auto params_of = [](const std::string& bundle) {
    Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(bundle, "tile-chain.toml", "");
    CHECK(spec.ok()) << spec.status().ToString();
    Result<int64_t> n = engine::CountParameters(spec->model);
    CHECK(n.ok()) << n.status().ToString();
    return static_cast<uint64_t>(*n);
  };
  TaskParams small = testing::TestTaskParams();
  small.units_per_round = 1;
  small.model_bytes = 4 * params_of(ChainBundle());
  EXPECT_EQ(small.model_bytes, 4u * 235'146);
  EXPECT_FALSE(DisputeNeedsBundle(small));
  // The bound itself: a state of at most kMaxStepWitnessState needs none, one float more does.
  small.model_bytes = kMaxStepWitnessState / 3 / 4 * 4;
  EXPECT_FALSE(DisputeNeedsBundle(small));
  small.model_bytes += 4;
  EXPECT_TRUE(DisputeNeedsBundle(small));
  small.tolerance_rel_l2_ppm = 1000;  // tolerance mode: segments, no tile phase
  EXPECT_FALSE(DisputeNeedsBundle(small));

  bundle_ = &ChainWideMlpBundle();
  const uint64_t wide = 4 * params_of(*bundle_);
  EXPECT_EQ(wide, 4u * 468'874);
  PartyRun solver, verifier;
  for (uint64_t s = 0; s <= kSteps; ++s) {
    solver.state.push_back(Blake2b("state " + std::to_string(s)));
    verifier.state.push_back(s < kSteps ? solver.state.back() : Blake2b("other state"));
  }
  StepOk({N(wb_, Reg(wb_, kRoleWhistleblower))});
  Submit([&](TaskParams& p) { p.model_bytes = wide; });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(MaxUnitStateBytes(Task().params), 3 * wide);
  ASSERT_TRUE(DisputeNeedsBundle(Task().params));
  const std::string why = "bundle is empty, but unit 0 belongs to task " + task_id_.ShortHex() +
                          ", whose training state may hold 5626488 bytes (params.model_bytes and "
                          "two optimizer moments), over the 4194304 a whole step's witness holds";
  CommitAndDispute(solver, verifier, *bundle_, WithoutTheBundle(why));
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(Check().has_tile_phase());
  Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), *bundle_, "test");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_EQ(Check().dispute()->config().num_operators, ctx->plan.ops.size());
}

// Only a mismatch carries the bundle: a clean verdict on a token task is revealed without one
// (the 10M GPT devnet never ended when the ledger asked every reveal of a token task for it).
TEST_F(TileChainTest, OnThe10mGptACleanVerdictIsRevealedWithoutTheBundle) {
  UseGpt();
  Submit();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(DisputeNeedsBundle(Task().params));
  ASSERT_NO_FATAL_FAILURE(CommitUnit({Blake2b("state 0"), Blake2b("state end")}));
  const Hash256 salt = Blake2b("salt");
  StepOk({N(verifier_, CommitVerdictTx{.task_id = task_id_,
                                       .index = 0,
                                       .node_id = verifier_.public_key(),
                                       .commitment = protocol::VerdictCommitment(
                                           Verdict::kVerdictClean, salt, verifier_.public_key(),
                                           Check().config().unit)})});
  for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckRevealVerdicts; ++i) Step();
  ASSERT_EQ(Check().stage(), CheckStage::kCheckRevealVerdicts);
  auto reveal = [&](const std::string& bundle) {
    return N(verifier_, RevealVerdictTx{.task_id = task_id_,
                                        .index = 0,
                                        .node_id = verifier_.public_key(),
                                        .verdict = static_cast<uint8_t>(Verdict::kVerdictClean),
                                        .salt = salt,
                                        .bundle = {bundle}});
  };
  std::vector<Receipt> r = Step({reveal(ChainGptBundle()), reveal("")});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].ok) << "a clean verdict with a bundle";
  EXPECT_NE(r[0].reason.find("leave it empty with a clean verdict"), std::string::npos)
      << r[0].reason;
  EXPECT_TRUE(r[1].ok) << r[1].reason;
}

// The 10M GPT trained in two micro-batches (a token task with a data root over its pages): its
// plan follows the micro-batched step, so the mismatch's bundle opens the tile phase, and a lie
// at a tile of micro-batch 1 (its qkv; its accumulated gradient, whose chain ends by adding into
// micro-batch 0's tile) is narrowed to that tile and ruled by RefereeTile for the honest side,
// whichever side lies; the genesis key's RuleDispute is refused (PlayLieOnChain). Slow (traced
// runs of 4 steps of 10.8M parameters at two sequences).
TEST_P(TileChainLieTest, OnAGptTrainedInMicroBatchesALieIsRuledOnChainByRefereeTile) {
  UseGptInMicroBatches();
  const size_t bytes =
      PlayLieOnChain(Train(Lie{LieKind::kTile, "mb1.h.0.qkv", 100, 500}), GetParam(), true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

TEST_F(TileChainTest, OnAGptTrainedInMicroBatchesAnAccumulatedGradientBlockIsRuledOnChain) {
  UseGptInMicroBatches();
  const int64_t op = OpIndex("mb1.transformer.h.0.ln_1.weight.grad");
  const int64_t last = engine::ReductionBlocks(Context().plan, op) - 1;
  ASSERT_GT(last, 0);
  const size_t bytes = PlayLieOnChain(
      Train(Lie{LieKind::kTile, "mb1.transformer.h.0.ln_1.weight.grad", 0, 100, last}), true, true);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, kMaxTileWitnessBytes);
}

// A GPT whose vocabulary is left to its data is planned with the vocabulary its task's weights
// were made with (params.model_bytes): the same plan as the bundle naming it. A task whose
// model_bytes no vocabulary gives is refused by name, and the ledger never aborts on it.
TEST(TileContextTest, AGptWithoutItsVocabularySizeTakesItFromTheTaskWeights) {
  Result<std::string> text =
      Env::Default()->ReadFile(std::string(MESHLEARN_SOURCE_DIR) + "/examples/code-gpt-10m.toml");
  ASSERT_TRUE(text.ok());
  const std::string bundle =
      *text + "\n[network]\nrounds = 1\nunits_per_round = 1\ninner_steps = 4\n";
  TaskRecord t;
  t.id = Blake2b("gpt task");
  t.spec_hash = BuildManifest(AsBytes(bundle)).id().hash;
  WorkUnit u;
  u.task_id = t.id;
  Result<TileRuleContext> ctx = TileContextOf(t, u, bundle, "reveal verdict: bundle");
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kFailedPrecondition) << ctx.status().ToString();
  EXPECT_NE(ctx.status().message().find("vocab_size"), std::string::npos)
      << ctx.status().ToString();
  // With the size named, it plans.
  std::string named = bundle;
  named.insert(named.find("[model]\n") + 8, "vocab_size = 256\n");
  const Hash256 unnamed_hash = t.spec_hash;
  t.spec_hash = BuildManifest(AsBytes(named)).id().hash;
  Result<TileRuleContext> ok = TileContextOf(t, u, named, "reveal verdict: bundle");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  // Without it, from a task whose weights are that model's: the same plan, operator by operator.
  Result<engine::TaskSpec> named_spec = engine::TaskSpec::Parse(named, "named bundle", "");
  ASSERT_TRUE(named_spec.ok()) << named_spec.status().ToString();
  Result<engine::MemoryEstimate> size = engine::EstimateMemory(named_spec->model, 1, 1, "", false);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  t.spec_hash = unnamed_hash;
  t.params.model_bytes = static_cast<uint64_t>(size->num_parameters) * 4;
  Result<TileRuleContext> derived = TileContextOf(t, u, bundle, "reveal verdict: bundle");
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  ASSERT_EQ(derived->plan.ops.size(), ok->plan.ops.size());
  for (size_t i = 0; i < ok->plan.ops.size(); ++i) {
    EXPECT_EQ(derived->plan.ops[i].name, ok->plan.ops[i].name) << i;
    EXPECT_EQ(derived->plan.ops[i].shape, ok->plan.ops[i].shape) << ok->plan.ops[i].name;
    EXPECT_EQ(derived->plan.ops[i].grid, ok->plan.ops[i].grid) << ok->plan.ops[i].name;
  }
  // Weights that no vocabulary gives (one too many): refused by name.
  t.params.model_bytes += 4;
  Result<TileRuleContext> odd = TileContextOf(t, u, bundle, "reveal verdict: bundle");
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kFailedPrecondition) << odd.status().ToString();
  EXPECT_NE(odd.status().message().find("vocab_size"), std::string::npos)
      << odd.status().ToString();
  t.spec_hash = BuildManifest(AsBytes(named)).id().hash;
  t.params.model_bytes = 0;
  // Without a data root over its token pages, the operators reading the batch's tokens are opaque
  // (their disputes play the whole step); with one, covered. wpe's gradient reads positions only.
  auto kind_of = [](const TileRuleContext& c, const std::string& name) {
    for (const engine::TileOp& op : c.plan.ops) {
      if (op.name == name) return op.kind;
    }
    ADD_FAILURE() << "no operator " << name;
    return engine::TileOpKind::kTileOpState;
  };
  const char* token_ops[] = {"encoded", "loss", "logits.grad", "transformer.wte.weight.grad"};
  for (const char* name : token_ops) {
    EXPECT_EQ(kind_of(*ok, name), engine::TileOpKind::kTileOpOpaque) << name;
  }
  EXPECT_EQ(kind_of(*ok, "transformer.wpe.weight.grad"), engine::TileOpKind::kTileOpEmbeddingGrad);
  t.params.data_root = Blake2b("the token pages");
  t.params.data_page_tokens = static_cast<uint32_t>(engine::kTokenPageTokens);
  Result<TileRuleContext> pages = TileContextOf(t, u, named, "reveal verdict: bundle");
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  EXPECT_EQ(pages->data_root, t.params.data_root);
  for (const char* name : token_ops) {
    EXPECT_NE(kind_of(*pages, name), engine::TileOpKind::kTileOpOpaque) << name;
  }
}

// A bundle is the submitter's text, and the ledger plans a step from the spec's shapes alone: one
// declaring a model of 2^20 x 2^20 weights (4 TiB) is planned like any other, tile grids and all,
// without allocating it (this test would die of memory, not fail, if TileContextOf built the
// model).
TEST(TileContextTest, AModelOfAnySizeIsPlannedFromItsShapesAlone) {
  const std::string bundle = R"(
[task]
name = "huge"
seed = 1
[data]
format = "idx"
train_images = "unused"
train_labels = "unused"
test_images = "unused"
test_labels = "unused"
[model]
input = [1048576]
[[model.layers]]
kind = "linear"
out = 1048576
[[model.layers]]
kind = "linear"
out = 10
[train]
steps = 4
batch_size = 8
[optimizer]
kind = "adamw"
lr = 0.001
[network]
rounds = 1
units_per_round = 1
inner_steps = 4
)";
  TaskRecord t;
  t.id = Blake2b("huge task");
  t.spec_hash = BuildManifest(AsBytes(bundle)).id().hash;
  t.params.data_root = Blake2b("some data");
  WorkUnit u;
  u.task_id = t.id;
  Result<TileRuleContext> ctx = TileContextOf(t, u, bundle, "reveal verdict: bundle");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  int64_t weights = 0;
  const engine::TileOp* big = nullptr;
  for (const engine::TileOp& op : ctx->plan.ops) {
    if (op.name.starts_with("in.layers.")) weights += engine::NumElements(op.shape);
    if (op.name == "layers.0.weight") big = &op;
  }
  // The parameters (2^40 + 2^20 + 10 x 2^20 + 10), then AdamW's two moments of each.
  const int64_t params = (int64_t{1} << 40) + (int64_t{1} << 20) + 10 * (int64_t{1} << 20) + 10;
  EXPECT_EQ(weights, params);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(engine::NumElements(big->shape), int64_t{1} << 40);
  EXPECT_EQ(big->kind, engine::TileOpKind::kTileOpAdamW);
  EXPECT_EQ(big->grid, engine::TileGrid::ForShape(big->shape));
  EXPECT_EQ(ctx->plan.classes, 10);
}

struct WitnessLargest {
  size_t bytes = 0;
  std::string op;
  int64_t tile = 0, block = 0;
};

// The largest encoded witness of each operator kind of a GPT-2 shaped step (n_layer, n_head,
// n_embd; T = 1024, V = 50257, one sequence, AdamW clipped at 1.0), from shapes alone: see the
// test below. *ops: the plan's operator count. Empty (with a failure) if it cannot be planned.
std::map<engine::TileOpKind, WitnessLargest> LargestGpt2Witnesses(int n_layer, int n_head,
                                                                  int n_embd, size_t* ops) {
  const std::string toml = R"(
[task]
name = "gpt2"
seed = 1
[data]
format = "text"
path = "unused"
[model]
kind = "gpt"
n_layer = )" + std::to_string(n_layer) +
                           "\nn_head = " + std::to_string(n_head) +
                           "\nn_embd = " + std::to_string(n_embd) + R"(
block_size = 1024
[optimizer]
kind = "adamw"
lr = 6e-4
grad_clip = 1.0
[train]
steps = 1
batch_size = 1
)";
  Result<engine::TaskSpec> spec = engine::TaskSpec::Parse(toml, "gpt2.toml", ".");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  if (!spec.ok()) return {};
  spec->model.gpt.vocab_size = 50257;  // a plan only: no data to take it from
  constexpr int64_t kT = 1024;
  Result<TilePlan> plan = engine::PlanStepTiles(spec->model, spec->optimizer, 1, kT);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  *ops = plan->ops.size();
  constexpr int64_t kStreamTokens = 9'000'000'000;
  const int64_t stream_pages =
      (kStreamTokens + engine::kTokenPageTokens - 1) / engine::kTokenPageTokens;
  // A proof of leaf `index` of `count` (MerkleProve's shape: no sibling where a node is promoted).
  auto proof_of = [](uint64_t index, uint64_t count) {
    MerkleProof p;
    p.index = index;
    p.leaf_count = count;
    for (uint64_t w = count, pos = index; w > 1; w = (w + 1) / 2, pos /= 2) {
      if ((pos ^ 1) < w) p.siblings.emplace_back();
    }
    return p;
  };
  auto middle_layer = [n_layer](const std::string& name) {
    for (int l = 1; l + 1 < n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      if (name.starts_with(p) || name.find("." + p) != std::string::npos) return true;
    }
    return false;
  };
  std::map<engine::TileOpKind, WitnessLargest> largest;
  for (size_t j = 0; j < plan->ops.size(); ++j) {
    const engine::TileOp& o = plan->ops[j];
    if (o.kind == engine::TileOpKind::kTileOpState || o.kind == engine::TileOpKind::kTileOpOpaque ||
        middle_layer(o.name)) {
      continue;
    }
    const int64_t op = static_cast<int64_t>(j), count = o.grid.count();
    const int64_t nb = std::max<int64_t>(1, engine::ReductionBlocks(*plan, op));
    std::vector<int64_t> blocks;
    for (int64_t k = 0; k < nb; ++k) {
      if (nb <= 160 || k < 2 || k == nb / 2 || k >= nb - 2) blocks.push_back(k);
    }
    for (int64_t tile : {int64_t{0}, count / 2, count - 1}) {
      for (int64_t block : blocks) {
        Result<engine::TileFootprint> fp = engine::Footprint(*plan, op, tile, block);
        EXPECT_TRUE(fp.ok()) << o.name << ": " << fp.status().ToString();
        if (!fp.ok()) return {};
        TileWitness w;
        w.outputs.assign(j, Hash256{});
        for (const engine::TileRef& r : fp->tiles) {
          const engine::TileGrid& g = plan->ops[static_cast<size_t>(r.op)].grid;
          w.tiles.push_back(TileWitnessTile{
              static_cast<uint32_t>(r.op + 1), static_cast<uint64_t>(r.tile),
              std::vector<float>(static_cast<size_t>(g.TileRect(r.tile).numel())),
              proof_of(static_cast<uint64_t>(r.tile), static_cast<uint64_t>(g.count()))});
        }
        if (!fp->batch_rows.empty()) {
          for (int64_t p :
               engine::TokenPagesOfRows(1, 0, 0, 1, kT, kStreamTokens, fp->batch_rows)) {
            w.pages.push_back(TileWitnessPage{
                static_cast<uint64_t>(p),
                std::vector<int32_t>(static_cast<size_t>(engine::kTokenPageTokens)),
                proof_of(static_cast<uint64_t>(p), static_cast<uint64_t>(stream_pages))});
          }
        }
        w.partial.resize(
            static_cast<size_t>(engine::ReductionPartialFloats(*plan, op, tile, block)));
        const size_t bytes = EncodeTileWitness(w).size();
        WitnessLargest& l = largest[o.kind];
        if (bytes > l.bytes) l = WitnessLargest{bytes, o.name, tile, block};
      }
    }
  }
  return largest;
}

// Issue 16's bound from shapes alone (PlanStepTiles allocates nothing): GPT-2 small (n_layer 12,
// n_head 12, n_embd 768, T = 1024, V = 50257; one sequence, AdamW clipped at 1.0). For every
// covered operator, the encoded witness (EncodeTileWitness) of its first, middle and last tiles
// at every reduction block (five of them past 160: the first two, the middle, the last two),
// sized as BuildTileWitness would fill it: the output roots of the operators before it, the
// footprint's tiles with Merkle proofs as deep as their operands' grids, the pages of a 9e9-token
// stream (GPT-2's OpenWebText) holding its rows' tokens, and the partial sum. Layers 1..10 repeat
// layer 0's and 11's footprints between their operator indices, so they are skipped. Each
// operator kind's largest witness is printed; each must be within kMaxTileWitnessBytes, the
// attention backward's too: above T = 256 its softmax backward's row sums s_t (the chain over t2
// of att * datt, which a dk block needs for 32 other rows) are chained first in the tile's own
// partial, so no block reads a whole row of att or v of the whole sequence.
TEST(TileContextTest, Gpt2SmallWitnessesAreWithinTheBoundFromShapesAlone) {
  size_t ops = 0;
  std::map<engine::TileOpKind, WitnessLargest> largest = LargestGpt2Witnesses(12, 12, 768, &ops);
  ASSERT_FALSE(largest.empty());
  std::printf("gpt2-small: %zu operators\n", ops);
  // Every kind a clipped AdamW GPT step has (not relu, SGD, conv, pool, opaque).
  EXPECT_EQ(largest.size(), 21u);
  for (const auto& [kind, l] : largest) {
    std::printf("gpt2-small kind %d: largest witness %zu bytes (%s tile %lld block %lld)\n",
                static_cast<int>(kind), l.bytes, l.op.c_str(), static_cast<long long>(l.tile),
                static_cast<long long>(l.block));
    EXPECT_LE(l.bytes, kMaxTileWitnessBytes) << l.op << " tile " << l.tile << " block " << l.block;
  }
  // The attention forward, narrowed above T = 256: a block of att reads q of 32 rows and k of 32
  // positions, of atty att's 32 columns and v of 32 positions, whatever T.
  EXPECT_LT(largest[engine::TileOpKind::kTileOpAttention].bytes, 64u << 10);
  EXPECT_LT(largest[engine::TileOpKind::kTileOpAttentionOut].bytes, 64u << 10);
  // The attention backward, narrowed above T = 256 (its row sums first): a block reads 32 x 32 of
  // att and 32 positions of dout, v and q or k in one head, with the partial (the group's T row
  // sums and the tile's accumulators), whatever T.
  EXPECT_LT(largest[engine::TileOpKind::kTileOpAttentionBackward].bytes, 64u << 10);
}

// The same from shapes alone for the wider GPT-2s (issue 16): medium (24 layers, 16 heads,
// n_embd 1024) and XL (48, 25, 1600). Every kind's largest witness is printed, and every kind is
// within kMaxTileWitnessBytes on both: the linears' forwards and input gradients and the
// layernorms' forwards, input gradients and dweights are narrowed above 784 columns into blocks
// of 256 (the layernorms' row sums first), and the global norm's chain reads a parameter above
// 8192 block partials (wte's 50257 C elements, 4 bytes a 1024: 196 KiB at medium, 307 KiB at XL,
// on top of the roots of the operators before it) one chunk of 8192 at a time, 32 KiB whatever
// the parameter's size.
TEST(TileContextTest, Gpt2MediumAndXlWitnessesFromShapesAlone) {
  using engine::TileOpKind;
  struct Shape {
    const char* name;
    int n_layer, n_head, n_embd;
  };
  for (const Shape& sh : {Shape{"gpt2-medium", 24, 16, 1024}, Shape{"gpt2-xl", 48, 25, 1600}}) {
    size_t ops = 0;
    std::map<TileOpKind, WitnessLargest> largest =
        LargestGpt2Witnesses(sh.n_layer, sh.n_head, sh.n_embd, &ops);
    ASSERT_FALSE(largest.empty()) << sh.name;
    EXPECT_EQ(largest.size(), 21u) << sh.name;
    std::printf("%s: %zu operators\n", sh.name, ops);
    for (const auto& [kind, l] : largest) {
      std::printf("%s kind %d: largest witness %zu bytes (%s tile %lld block %lld)\n", sh.name,
                  static_cast<int>(kind), l.bytes, l.op.c_str(), static_cast<long long>(l.tile),
                  static_cast<long long>(l.block));
      EXPECT_LE(l.bytes, kMaxTileWitnessBytes)
          << sh.name << " " << l.op << " tile " << l.tile << " block " << l.block;
    }
    // The narrowed linears and layernorms: a block reads 32 x 256 floats of each operand (and a
    // weight vector tile), whatever C.
    for (TileOpKind k : {TileOpKind::kTileOpLinear, TileOpKind::kTileOpLinearInputGrad,
                         TileOpKind::kTileOpLayerNorm, TileOpKind::kTileOpLayerNormInputGrad,
                         TileOpKind::kTileOpLayerNormWeightGrad}) {
      EXPECT_LT(largest[k].bytes, 200u << 10) << sh.name << " kind " << static_cast<int>(k);
    }
    // The norm: the roots of the operators before it (32 bytes each) and at most 8192 partials
    // in 9 tiles with their proofs.
    EXPECT_LT(largest[TileOpKind::kTileOpGradNorm].bytes, 32 * ops + (40u << 10)) << sh.name;
  }
}

// A party silent at one phase (param: phase x which party; the solver lies) loses at the missed
// deadline, whichever side lies, with no referee. A fresh chain each: the loser is jailed.
class TileChainSilenceTest : public TileChainTest, public ::testing::WithParamInterface<int> {};

TEST_P(TileChainSilenceTest, APartySilentAtAnyPhaseLosesOnChain) {
  const std::vector<Silence> phases = {
      {DisputeStage::kDisputeSteps, false},     {DisputeStage::kDisputeOperators, false},
      {DisputeStage::kDisputeTiles, false},     {DisputeStage::kDisputeTiles, true},
      {DisputeStage::kDisputeReduction, false},
  };
  Silence silence = phases.at(static_cast<size_t>(GetParam() / 4));
  silence.party = GetParam() % 2 == 0 ? DisputeParty::kDefender : DisputeParty::kChallenger;
  const bool solver_lies = (GetParam() / 2) % 2 == 0;
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.0.weight.grad", 200, 700, 2});
  const PartyRun& solver = solver_lies ? liar : honest;
  const PartyRun& verifier = solver_lies ? honest : liar;
  Submit();
  CommitAndDispute(solver, verifier, ChainBundle());
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  PlayOnChain(solver, verifier, silence);
  for (int i = 0; i < 6 && HasCheck() && Check().stage() != CheckStage::kCheckSettled; ++i) Step();
  // The silent party lost at the missed deadline, honest or not; no referee was asked.
  EXPECT_EQ(Node(solver_).reputation.slashes, silence.party == DisputeParty::kDefender ? 1u : 0u);
  EXPECT_EQ(Node(verifier_).reputation.slashes,
            silence.party == DisputeParty::kChallenger ? 1u : 0u);
}

// 5 phases x (defender, challenger silent) x (solver, verifier lies).
std::string SilenceName(const ::testing::TestParamInfo<int>& info) {
  static const char* kPhase[] = {"Steps", "Operators", "TileRoot", "TileChildren", "Reduction"};
  return std::string(kPhase[info.param / 4]) +
         (info.param % 2 == 0 ? "DefenderSilent" : "ChallengerSilent") +
         ((info.param / 2) % 2 == 0 ? "SolverLies" : "VerifierLies");
}
INSTANTIATE_TEST_SUITE_P(EachPhase, TileChainSilenceTest, ::testing::Range(0, 20), SilenceName);

TEST_F(TileChainTest, WitnessesThatDoNotCheckOutAreRefusedAndTheHonestOneRules) {
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.2.out", 100, 70});
  Submit();
  // The opening transaction's bundle is checked: another task's text, or on a clean verdict.
  CommitAndDispute(liar, honest, ChainBundle());
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  PlayOnChain(liar, honest);
  const RefereeTask task = RefereeTaskNow();
  ASSERT_TRUE(task.tile);
  ExpectGenesisRefereeRefused(task, "RefereeTile");
  Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), ChainBundle(), "test");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  const StepRecord& rec = honest.steps.at(task.step);
  const TileWitness good =
      BuildTileWitness(*ctx, task, *rec.trace, rec.batch, &Data().train, &Tree()).value();
  auto refused = [&](const Transaction& tx, const std::string& why) {
    std::vector<Receipt> r = Step({tx});
    EXPECT_FALSE(r.at(0).ok) << why;
    EXPECT_NE(r.at(0).reason.find(why), std::string::npos) << r.at(0).reason;
  };
  {
    TileWitness w = good;
    w.tiles[0].values[3] += 1.0f;
    refused(RefereeTile(gina_, EncodeTileWitness(w)), "is not proven against its agreed output");
  }
  {
    TileWitness w = good;
    std::swap(w.tiles[0], w.tiles[1]);
    refused(RefereeTile(gina_, EncodeTileWitness(w)), "the footprint needs tile");
  }
  {
    // The disputed operator's own output is no agreed input.
    TileWitness w = good;
    const int64_t op = static_cast<int64_t>(task.operator_index) - 1;
    const engine::TileGrid& grid = Context().plan.ops[static_cast<size_t>(op)].grid;
    std::vector<Hash256> hashes = engine::TileHashes(honest.Values(task.step, op), grid);
    w.tiles[0] = TileWitnessTile{task.operator_index, 0,
                                 engine::ExtractTile(honest.Values(task.step, op), grid, 0),
                                 MerkleProve(hashes, 0)};
    refused(RefereeTile(gina_, EncodeTileWitness(w)), "whose output is not agreed");
  }
  {
    TileWitness w = good;
    w.outputs[5] = Blake2b("not agreed");
    refused(RefereeTile(gina_, EncodeTileWitness(w)), "not to the agreed C_");
  }
  refused(RefereeTile(gina_, EncodeTileWitness(good), ChainBundle() + "# another task\n"),
          "spec_hash");
  refused(RefereeTile(gina_, EncodeTileWitness(good), ""), "bundle is empty");
  refused(RefereeTile(gina_, Bytes{1, 2, 3}), "referee tile: witness");
  refused(RefereeTile(gina_, Bytes(kMaxTileWitnessBytes + 1, 0)), "over the tile witness bound");
  ASSERT_EQ(Check().dispute()->stage(), DisputeStage::kDisputeReferee);
  // The honest witness, posted by the liar itself: it is the same witness (every input agreed).
  StepOk({N(solver_, RefereeTileTx{.task_id = task_id_,
                                   .index = 0,
                                   .bundle = {ChainBundle()},
                                   .witness = {EncodeTileWitness(good)}})});
  // Ruled: nothing is left to rule (the round re-runs without the cheater).
  refused(RefereeTile(gina_, EncodeTileWitness(good)), "referee tile: unit 0");
  ExpectTheLiarSlashed(true);
}

// Phase 3's moves are checked: children that do not hash to the party's node, children out of
// turn (in the steps stage), a node that is no party: each refused by name, nothing changes.
// A whistleblower's ChallengeUnit carries the bundle the same way: a lazy verifier called a lying
// solver's unit clean; the whistleblower challenges it, the dispute plays the tile phase and the
// ledger rules by RefereeTile: the solver and the verifier that approved it are slashed.
TEST_F(TileChainTest, AWhistleblowersChallengeWithTheBundlePlaysTheTilePhase) {
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.2.out", 100, 70});
  StepOk({N(wb_, Reg(wb_, kRoleWhistleblower))});
  Submit();
  const std::vector<Hash256> leaves = {liar.state[0], liar.state[kSteps]};
  ASSERT_NO_FATAL_FAILURE(CommitUnit(leaves));
  const Hash256 salt = Blake2b("salt");
  StepOk({N(verifier_, CommitVerdictTx{.task_id = task_id_,
                                       .index = 0,
                                       .node_id = verifier_.public_key(),
                                       .commitment = protocol::VerdictCommitment(
                                           Verdict::kVerdictClean, salt, verifier_.public_key(),
                                           Check().config().unit, Hash256{})})});
  for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckRevealVerdicts; ++i) Step();
  StepOk({N(verifier_, RevealVerdictTx{.task_id = task_id_,
                                       .index = 0,
                                       .node_id = verifier_.public_key(),
                                       .verdict = static_cast<uint8_t>(Verdict::kVerdictClean),
                                       .salt = salt}),
          N(solver_, RevealSecretTx{.task_id = task_id_,
                                    .index = 0,
                                    .node_id = solver_.public_key(),
                                    .secret = Secret(solver_, Unit().secret_index),
                                    .start_leaf = liar.state[0]})});
  for (int i = 0; i < 5 && Check().stage() != CheckStage::kCheckSettled; ++i) Step();
  ASSERT_EQ(Check().result(), protocol::CheckResult::kCheckClean) << Check().reason();
  auto proof = [&](uint64_t i) {
    MerkleProof m = MerkleProve(leaves, i);
    return MerkleProofField{.index = m.index, .leaf_count = m.leaf_count, .siblings = m.siblings};
  };
  const MismatchClaimField claim{.segment = 0,
                                 .start = leaves[0],
                                 .start_proof = proof(0),
                                 .solver_end = leaves[1],
                                 .end_proof = proof(1),
                                 .replayed_end = honest.state[kSteps]};
  StepOk({N(wb_, ChallengeUnitTx{.task_id = task_id_,
                                 .index = 0,
                                 .node_id = wb_.public_key(),
                                 .claim = claim,
                                 .bundle = {ChainBundle()}})});
  ASSERT_EQ(Check().stage(), CheckStage::kCheckDisputed);
  EXPECT_TRUE(Check().has_tile_phase());
  EXPECT_EQ(Check().dispute()->config().challenger, wb_.public_key());
  PlayOnChain(liar, honest);
  const RefereeTask task = RefereeTaskNow();
  ASSERT_TRUE(task.tile);
  ExpectGenesisRefereeRefused(task, "RefereeTile");
  Result<TileRuleContext> ctx = TileContextOf(Task(), Unit(), ChainBundle(), "test");
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  const StepRecord& rec = honest.steps.at(task.step);
  const TileWitness w =
      BuildTileWitness(*ctx, task, *rec.trace, rec.batch, &Data().train, &Tree()).value();
  StepOk({RefereeTile(gina_, EncodeTileWitness(w))});
  for (int i = 0; i < 6 && HasCheck() && Check().stage() != CheckStage::kCheckSettled; ++i) Step();
  EXPECT_EQ(Node(solver_).reputation.slashes, 1u);
  EXPECT_EQ(Node(verifier_).reputation.slashes, 1u) << "it approved the lie";
  EXPECT_EQ(Node(wb_).reputation.slashes, 0u);
}

TEST_F(TileChainTest, BadChildrenAreRefused) {
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.2.out", 100, 70});
  Submit();
  CommitAndDispute(liar, honest, ChainBundle());
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto children = [&](const KeyPair& node, const KeyPair& signer, uint64_t position,
                      const Hash256& left, const Hash256& right) {
    return Q(signer, DisputeChildrenTx{.task_id = task_id_,
                                       .index = 0,
                                       .node_id = node.public_key(),
                                       .position = position,
                                       .left = left,
                                       .right = right});
  };
  auto refused = [&](const Transaction& tx, const std::string& why) {
    std::vector<Receipt> r = Step({tx});
    EXPECT_FALSE(r.at(0).ok) << why;
    EXPECT_NE(r.at(0).reason.find(why), std::string::npos) << r.at(0).reason;
  };
  // In the steps stage there are no children to post.
  ASSERT_EQ(Check().dispute()->stage(), DisputeStage::kDisputeSteps);
  refused(children(solver_, alice_, 0, Blake2b("l"), Blake2b("r")), "posted children in stage");
  // Play to the first children query.
  for (int turn = 0; turn < 40; ++turn) {
    const DisputeQuery q = Check().dispute()->query();
    if (q.stage == DisputeStage::kDisputeTiles && q.children) break;
    std::vector<Transaction> txs;
    for (DisputeParty party : {DisputeParty::kDefender, DisputeParty::kChallenger}) {
      const KeyPair& node = party == DisputeParty::kDefender ? solver_ : verifier_;
      const Move m = Answer(party == DisputeParty::kDefender ? liar : honest, q);
      txs.push_back(N(node, DisputePostTx{.task_id = task_id_,
                                          .index = 0,
                                          .node_id = node.public_key(),
                                          .position = q.position,
                                          .hash = m.hash}));
    }
    StepOk(txs);
  }
  const DisputeQuery q = Check().dispute()->query();
  ASSERT_TRUE(q.children);
  const Move m = Answer(liar, q);
  // One block (a turn is 2 blocks): two refused, then the right children, taken.
  std::vector<Receipt> r =
      Step({children(solver_, alice_, q.position, m.children->second, m.children->first),
            children(gina_, gina_, q.position, m.children->first, m.children->second),
            children(solver_, alice_, q.position, m.children->first, m.children->second)});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].reason.find("dispute children: dispute: defender's children of node"),
            std::string::npos)
      << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  EXPECT_NE(r[1].reason.find("dispute children: node"), std::string::npos) << r[1].reason;
  EXPECT_TRUE(r[2].ok) << r[2].reason;
  // A second post of the same turn is refused too.
  refused(children(solver_, alice_, q.position, m.children->first, m.children->second),
          "dispute children: dispute: defender");
}

TEST_F(TileChainTest, AMismatchWithoutTheBundlePlaysWholeStepsAndABadBundleIsRefused) {
  const PartyRun& honest = Honest();
  const PartyRun liar = Train(Lie{LieKind::kTile, "layers.2.out", 100, 70});
  Submit();
  auto reveal = [&](Verdict verdict, const Hash256& salt, const std::string& bundle) {
    return N(verifier_, RevealVerdictTx{.task_id = task_id_,
                                        .index = 0,
                                        .node_id = verifier_.public_key(),
                                        .verdict = static_cast<uint8_t>(verdict),
                                        .salt = salt,
                                        .claim = claim_,
                                        .bundle = {bundle}});
  };
  CommitAndDispute(liar, honest, "", [&](const Hash256& salt) {
    return std::vector<std::pair<Transaction, std::string>>{
        {reveal(Verdict::kVerdictMismatch, salt, ChainBundle() + "# another task\n"),
         "the task's spec_hash"},
        {reveal(Verdict::kVerdictClean, salt, ChainBundle()),
         "leave it empty with a clean verdict"}};
  });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // Without the bundle the dispute is as before: version 1, whole steps.
  EXPECT_FALSE(Check().has_tile_phase());
  EXPECT_EQ(Unit().check[0], 1) << "a check without the tile phase encodes as before";
  EXPECT_EQ(Check().dispute()->Encode()[0], 1);
  PlayOnChain(liar, honest);
  const RefereeTask task = RefereeTaskNow();
  EXPECT_TRUE(task.whole_step);
  EXPECT_FALSE(task.tile);
  EXPECT_EQ(task.step, kLieStep);
  std::vector<Receipt> r = Step({RefereeTile(gina_, Bytes{1})});
  EXPECT_NE(r.at(0).reason.find("waits for a whole step"), std::string::npos) << r.at(0).reason;
}

}  // namespace referee_tile_test
}  // namespace meshlearn::ledger
