// Pipeline stages on their own nodes (issue 15): a stage's step against its neighbours
// (stage_step.h) equals RunPipelineStep bit for bit; a verifier's replay of one stage step
// (stage_replay.h) passes an honest stage and names (replica, stage, step, micro-batch) of every
// cheat; the HTTP data plane (stage_plane.h) trains 3 stage endpoints bit-equal to
// RunPipelineStep and fails a step by its deadline when a stage stops answering.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/config.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/model.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/engine/tile_rule.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/ledger/stage_referee.h"
#include "meshlearn/ledger/stage_replay.h"
#include "meshlearn/ledger/stage_serve.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/network_round.h"
#include "meshlearn/node/stage_check.h"
#include "meshlearn/node/stage_evidence.h"
#include "meshlearn/node/stage_plane.h"
#include "meshlearn/node/stage_replay.h"
#include "meshlearn/node/stage_resume.h"
#include "meshlearn/node/stage_step.h"
#include "meshlearn/node/stage_unit.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/round_phase.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/stage_placement.h"
#include "meshlearn/protocol/stage_state_claim.h"
#include "meshlearn/protocol/stage_transfer.h"
#include "testing/diloco_task.h"
#include "testing/pipeline_task.h"

namespace meshlearn::node {
namespace {

using engine::Batch;
using engine::ModelSpec;
using engine::Stage;
using protocol::StageStepCommit;
using protocol::StageTensorKey;
using protocol::StageTensorKind;
using protocol::StageTransfer;

// An MLP with dropout (masks per micro-batch) and layernorm, and a GPT (tied embedding: every
// end-of-step kind crosses the network).
constexpr char kStageMlp[] = R"(
input = [12]
[[model.layers]]
kind = "linear"
out = 16
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "dropout"
p = 0.25
[[model.layers]]
kind = "layernorm"
[[model.layers]]
kind = "linear"
out = 10
[[model.layers]]
kind = "gelu"
[[model.layers]]
kind = "linear"
out = 4
)";

constexpr char kStageGpt[] = R"(
kind = "gpt"
n_layer = 4
n_head = 2
n_embd = 16
block_size = 8
vocab_size = 11
)";

constexpr uint64_t kStageSeed = 7;
constexpr uint64_t kStageDropoutSeed = 99;
constexpr int64_t kStageBatch = 4;
constexpr int64_t kStageMicroBatches = 2;

ModelSpec StageParseModel(const char* toml) {
  Result<ModelSpec> spec = ModelSpec::FromToml(std::string("[model]\n") + toml, "model.toml");
  CHECK(spec.ok()) << spec.status().ToString();
  return *spec;
}

engine::OptimizerSpec StageOptimizer() {
  engine::OptimizerSpec o;
  o.kind = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.grad_clip = 0.05;  // small: clipping happens, so the norm's total matters on every stage
  return o;
}

// The batch of step `step`: a pure function of (model, step).
Batch StageBatch(const ModelSpec& spec, int64_t step) {
  Result<std::unique_ptr<engine::Model>> m = engine::Model::Create(spec);
  CHECK(m.ok()) << m.status().ToString();
  Batch b = (*m)->EmptyBatch(kStageBatch, spec.kind == "gpt" ? spec.gpt.block_size : 0);
  Rng rng(1000 + static_cast<uint64_t>(step));
  const int64_t classes = (*m)->NumOutputs();
  for (float& x : b.inputs.vec()) x = static_cast<float>(rng.UniformDouble() * 2.0 - 1.0);
  for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(classes)));
  for (int32_t& t : b.targets) {
    t = static_cast<int32_t>(rng.Uniform(static_cast<uint64_t>(classes)));
  }
  return b;
}

// 3 stages of the model (MLP: layers [0,2) [2,5) [5,7); GPT: embeddings + block 0, block 1,
// blocks 2-3 + head), initialised as one model.
std::vector<int64_t> StageBounds(const ModelSpec& spec) {
  return spec.kind == "gpt" ? std::vector<int64_t>{0, 1, 2, 4} : std::vector<int64_t>{0, 2, 5, 7};
}

// What a verifier replays a step of StageStages(spec) with: the cut, the optimizer, the
// micro-batches and the chain of stage nodes.
StageReplaySetup StageSetup(const ModelSpec& spec, std::vector<protocol::NodeId> chain) {
  StageReplaySetup setup;
  setup.model = spec;
  setup.optimizer = StageOptimizer();
  Result<engine::PipelineCut> cut = engine::MakeCut(spec, StageBounds(spec));
  CHECK(cut.ok()) << cut.status().ToString();
  setup.cut = *cut;
  setup.micro_batches = kStageMicroBatches;
  setup.chain = std::move(chain);
  return setup;
}

std::vector<std::unique_ptr<Stage>> StageStages(const ModelSpec& spec,
                                                std::vector<int64_t> bounds = {}) {
  if (bounds.empty()) bounds = StageBounds(spec);
  Result<engine::PipelineCut> cut = engine::MakeCut(spec, bounds);
  CHECK(cut.ok()) << cut.status().ToString();
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < cut->stages(); ++s) {
    Result<std::unique_ptr<Stage>> st =
        Stage::Create(spec, StageOptimizer(), *cut, s, kStageMicroBatches);
    CHECK(st.ok()) << st.status().ToString();
    stages.push_back(std::move(*st));
  }
  engine::InitPipeline(stages, kStageSeed);
  return stages;
}

KeyPair StageNodeKey(int s) {
  KeySeed seed;
  seed.bytes.fill(static_cast<uint8_t>(40 + s));
  return KeyPair::FromSeed(seed);
}

StageContext StageCtx(int stages = 3) {
  StageContext ctx;
  ctx.task = Blake2b("stage test task");
  ctx.round = 3;
  ctx.replica = 1;
  for (int s = 0; s < stages; ++s) ctx.chain.push_back(StageNodeKey(s).public_key());
  return ctx;
}

std::vector<KeyPair> StageKeys(int stages = 3) {
  std::vector<KeyPair> keys;
  for (int s = 0; s < stages; ++s) keys.push_back(StageNodeKey(s));
  return keys;
}

// What a stage node does around its link: it keeps (serves) every tensor it received, by hash,
// and an adversary may change what it sends.
class StageServingLink final : public StageLink {
 public:
  explicit StageServingLink(StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    Result<std::vector<float>> v = inner_->Receive(key, record);
    if (v.ok()) served[record->tensor] = StageTensorBytes(*v);
    return v;
  }
  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    if (corrupt && corrupt(key)) return inner_->Send(key, CorruptedStageTensor(values));
    return inner_->Send(key, values);
  }
  std::map<Hash256, Bytes> served;
  std::function<bool(const StageTensorKey&)> corrupt;

 private:
  StageLink* inner_;
};

// One step of every stage, each in its own thread, over `links`. Returns the outcomes.
// `wrong[s]`: the batch stage s trains on instead of the step's (a wrong_data adversary).
std::vector<StageStepOutcome> StageRunStep(std::vector<std::unique_ptr<Stage>>& stages,
                                           const StageContext& ctx,
                                           const std::vector<StageLink*>& links, int64_t step,
                                           const std::map<int, Batch>& wrong = {}) {
  const Batch batch = StageBatch(stages[0]->state().model->spec(), step);
  std::vector<Result<StageStepOutcome>> got(stages.size(), Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t s = 0; s < stages.size(); ++s) {
    const Batch& b = wrong.count(static_cast<int>(s)) ? wrong.at(static_cast<int>(s)) : batch;
    threads.emplace_back(
        [&, s] { got[s] = RunStageStep(*stages[s], ctx, b, kStageDropoutSeed, *links[s]); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<StageStepOutcome> out;
  for (Result<StageStepOutcome>& r : got) {
    CHECK(r.ok()) << r.status().ToString();
    out.push_back(std::move(*r));
  }
  return out;
}

TEST(StageStepTest, StagesTalkingThroughLinksEqualRunPipelineStep) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
    std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
    const StageContext ctx = StageCtx();
    MemoryStageNetwork net(ctx, StageKeys());
    std::vector<Hash256> last_after(3);
    for (int64_t step = 0; step < 3; ++step) {
      engine::PipelineStepResult r =
          engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
      std::vector<StageStepOutcome> out =
          StageRunStep(got, ctx, {net.link(0), net.link(1), net.link(2)}, step);
      EXPECT_EQ(out[2].loss, r.loss);
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(out[s].grad_norm, r.grad_norm) << "stage " << s;
        EXPECT_EQ(engine::StateHash(got[s]->state()), engine::StateHash(want[s]->state()))
            << "stage " << s << " after step " << step;
        const StageStepCommit& c = out[s].commit;
        EXPECT_TRUE(protocol::ValidateStageStepCommit(c).ok());
        EXPECT_TRUE(protocol::VerifyStageStepSignatures(c, ctx.chain).ok());
        EXPECT_EQ(c.state_after, engine::StateHash(got[s]->state()));
        if (step > 0) {
          EXPECT_EQ(c.state_before, last_after[s]) << "the chain of state hashes";
        }
        last_after[s] = c.state_after;
      }
      // Per step: M activations and M gradients across each of the 2 boundaries, the running sum
      // twice, the total twice; a GPT also the wte copy and the head's gradient.
      const size_t sends =
          out[0].commit.sent.size() + out[1].commit.sent.size() + out[2].commit.sent.size();
      EXPECT_EQ(sends, 2 * 2 * kStageMicroBatches + 4 + (spec.kind == "gpt" ? 2 : 0));
      // The activations and gradients the stages signed and sent across each boundary are the
      // bytes the ledger's placement weighs it by (engine::CutBoundaryBytes of the cut).
      std::vector<uint64_t> crossed(2, 0);
      for (const StageStepOutcome& o : out) {
        for (const StageTransfer& t : o.commit.sent) {
          if (t.key.kind == protocol::StageTensorKind::kStageTensorActivation ||
              t.key.kind == protocol::StageTensorKind::kStageTensorActivationGrad) {
            crossed[std::min(t.key.from_stage, t.key.to_stage)] += t.bytes;
          }
        }
      }
      Result<std::vector<uint64_t>> boundary = engine::CutBoundaryBytes(
          spec, engine::PipelineCut{StageBounds(spec)}, kStageBatch, 0, kStageMicroBatches);
      ASSERT_TRUE(boundary.ok()) << boundary.status().ToString();
      EXPECT_EQ(crossed, *boundary);
    }
  }
}

// Chains of 1, 2 and 4 stages (no middle stage, two middle stages; one stage sends nothing).
TEST(StageStepTest, ChainsOfOtherLengthsEqualRunPipelineStep) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    const std::vector<std::vector<int64_t>> cuts =
        spec.kind == "gpt" ? std::vector<std::vector<int64_t>>{{0, 4}, {0, 2, 4}, {0, 1, 2, 3, 4}}
                           : std::vector<std::vector<int64_t>>{{0, 7}, {0, 3, 7}, {0, 1, 3, 5, 7}};
    for (const std::vector<int64_t>& bounds : cuts) {
      const int S = static_cast<int>(bounds.size()) - 1;
      SCOPED_TRACE(spec.kind + " in " + std::to_string(S) + " stages");
      std::vector<std::unique_ptr<Stage>> want = StageStages(spec, bounds);
      std::vector<std::unique_ptr<Stage>> got = StageStages(spec, bounds);
      const StageContext ctx = StageCtx(S);
      MemoryStageNetwork net(ctx, StageKeys(S));
      std::vector<StageLink*> links;
      for (int s = 0; s < S; ++s) links.push_back(net.link(s));
      for (int64_t step = 0; step < 2; ++step) {
        engine::PipelineStepResult r =
            engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
        std::vector<StageStepOutcome> out = StageRunStep(got, ctx, links, step);
        EXPECT_EQ(out[static_cast<size_t>(S - 1)].loss, r.loss);
        size_t sends = 0;
        for (int s = 0; s < S; ++s) {
          EXPECT_EQ(engine::StateHash(got[s]->state()), engine::StateHash(want[s]->state()))
              << "stage " << s << " after step " << step;
          EXPECT_EQ(out[s].grad_norm, r.grad_norm);
          sends += out[s].commit.sent.size();
        }
        // M activations and M gradients per boundary, the running sum and the total per
        // boundary, and a GPT's wte and head gradient.
        const size_t boundaries = static_cast<size_t>(S - 1);
        EXPECT_EQ(sends, boundaries * (2 * kStageMicroBatches + 2) +
                             (spec.kind == "gpt" && S > 1 ? 2 : 0));
      }
    }
  }
}

// ---- Replay.

// A replica of 3 stages trained 2 steps over a memory network; before step 1 each stage's state
// is checkpointed. `before_step1` may tamper with the stages (an adversary).
struct StageReplayRun {
  ModelSpec spec;
  std::vector<StageStepCommit> commits;  // step 1's, per stage
  std::vector<std::map<Hash256, Bytes>> served;
  MemEnv env;
  std::vector<std::string> checkpoints;
};

// `adversary` runs before step 1, `after` after it (it may change a stage and its commit), and
// `wrong[s]` is the batch stage s trains step 1 on.
void StageRunForReplay(const char* toml, StageReplayRun* run,
                       const std::function<void(std::vector<std::unique_ptr<Stage>>&,
                                                std::vector<StageServingLink*>&)>& adversary,
                       const std::function<void(std::vector<std::unique_ptr<Stage>>&,
                                                std::vector<StageStepOutcome>&)>& after = nullptr,
                       const std::map<int, Batch>& wrong = {}) {
  run->spec = StageParseModel(toml);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(run->spec);
  const StageContext ctx = StageCtx();
  MemoryStageNetwork net(ctx, StageKeys());
  std::vector<std::unique_ptr<StageServingLink>> serving;
  std::vector<StageServingLink*> links;
  for (int s = 0; s < 3; ++s) {
    serving.push_back(std::make_unique<StageServingLink>(net.link(s)));
    links.push_back(serving.back().get());
  }
  std::vector<StageLink*> as_links(links.begin(), links.end());
  StageRunStep(stages, ctx, as_links, 0);
  for (int s = 0; s < 3; ++s) {
    run->checkpoints.push_back("stage" + std::to_string(s) + ".safetensors");
    CHECK(engine::SaveCheckpoint(&run->env, run->checkpoints.back(), stages[s]->state()).ok());
    serving[s]->served.clear();
  }
  if (adversary) adversary(stages, links);
  std::vector<StageStepOutcome> out = StageRunStep(stages, ctx, as_links, 1, wrong);
  if (after) after(stages, out);
  for (int s = 0; s < 3; ++s) {
    run->commits.push_back(out[s].commit);
    run->served.push_back(serving[s]->served);
  }
}

StageReplayResult StageReplay(StageReplayRun& run, int s) {
  const StageReplaySetup setup = StageSetup(run.spec, StageCtx().chain);
  Result<engine::TrainState> start = engine::LoadCheckpoint(&run.env, run.checkpoints[s]);
  CHECK(start.ok()) << start.status().ToString();
  Result<StageReplayResult> r =
      ReplayStageStep(setup, std::move(*start), run.commits[s], run.served[s],
                      StageBatch(run.spec, 1), kStageDropoutSeed);
  CHECK(r.ok()) << r.status().ToString();
  return *r;
}

bool StageHas(const StageReplayResult& r, const std::string& text) {
  return r.message.find(text) != std::string::npos;
}

TEST(StageReplayTest, HonestStagesPass) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    StageReplayRun run;
    StageRunForReplay(toml, &run, nullptr);
    for (int s = 0; s < 3; ++s) {
      StageReplayResult r = StageReplay(run, s);
      EXPECT_TRUE(r.ok()) << run.spec.kind << " stage " << s << ": " << r.message;
    }
  }
}

TEST(StageReplayTest, AStageThatComputesWrongIsCaughtAtItsFirstOutput) {
  // Stage 1 trains step 1 from other weights but commits the honest start state.
  StageReplayRun run;
  Hash256 honest_start;
  StageRunForReplay(kStageMlp, &run, [&](auto& stages, auto&) {
    honest_start = engine::StateHash(stages[1]->state());
    float& w = stages[1]->params()[0].value.vec()[0];
    w = w + 0.5f;
  });
  run.commits[1].state_before = honest_start;
  StageReplayResult r = StageReplay(run, 1);
  EXPECT_EQ(r.fault, StageFault::kStageFaultOutput) << r.message;
  EXPECT_EQ(r.replica, 1u);
  EXPECT_EQ(r.stage, 1u);
  EXPECT_EQ(r.step, 1u);
  EXPECT_EQ(r.micro_batch, 0);
  EXPECT_EQ(r.key.kind, StageTensorKind::kStageTensorActivation);
  EXPECT_TRUE(StageHas(r, "replica 1, stage 1, step 1, micro-batch 0: output: the stage sent"))
      << r.message;
  EXPECT_NE(r.claimed, r.replayed);
  // Stage 2 computed honestly from what it was sent: it passes.
  EXPECT_TRUE(StageReplay(run, 2).ok()) << StageReplay(run, 2).message;
}

TEST(StageReplayTest, AStageThatSendsCorruptedActivationsWhileComputingHonestlyIsCaught) {
  StageReplayRun run;
  StageRunForReplay(kStageMlp, &run, [](auto&, auto& links) {
    links[1]->corrupt = [](const StageTensorKey& k) {
      return k.kind == StageTensorKind::kStageTensorActivation && k.micro_batch == 1;
    };
  });
  StageReplayResult r = StageReplay(run, 1);
  EXPECT_EQ(r.fault, StageFault::kStageFaultOutput) << r.message;
  EXPECT_EQ(r.stage, 1u);
  EXPECT_EQ(r.micro_batch, 1);
  EXPECT_TRUE(StageHas(r, "replica 1, stage 1, step 1, micro-batch 1: output")) << r.message;
  // The receiver, which used what was signed, passes, and so does stage 0, which trained on the
  // gradients that came back: every honest stage of the replica passes, the cheat alone is named.
  EXPECT_TRUE(StageReplay(run, 2).ok()) << StageReplay(run, 2).message;
  EXPECT_TRUE(StageReplay(run, 0).ok()) << StageReplay(run, 0).message;
}

// A GPT stage with a faulty kernel: stage 1 computes micro-batch 0's activations (its last
// block's residual3) wrong at step 1 and sends them. Its trace of the step as it computed it
// (CorruptSentTrace) is the honest one but at that operator, whose values are the tensor it
// signed; the tile game over the step then narrows to that operator. A sent tensor that a later
// operator reads (stage 0's wte, the last stage's sum of squares) cannot be faked that way.
TEST(StageReplayTest, AFaultyKernelsTraceDiffersFromTheHonestOneAtTheOperatorItSentAlone) {
  const auto activation0 = [](const StageTensorKey& k) {
    return k.kind == StageTensorKind::kStageTensorActivation && k.micro_batch == 0;
  };
  StageReplayRun run;
  StageRunForReplay(kStageGpt, &run, [&](auto&, auto& links) { links[1]->corrupt = activation0; });
  const StageReplaySetup setup = StageSetup(run.spec, StageCtx().chain);
  auto trace = [&](int s, engine::OpTrace* out) {
    out->set_keep_values(true);
    Result<engine::TrainState> start = engine::LoadCheckpoint(&run.env, run.checkpoints[s]);
    ASSERT_TRUE(start.ok()) << start.status().ToString();
    Result<StageReplayResult> r =
        ReplayStageStep(setup, std::move(*start), run.commits[s], run.served[s],
                        StageBatch(run.spec, 1), kStageDropoutSeed, nullptr, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  };
  auto plan_of = [&](int s) {
    Result<engine::TilePlan> plan =
        engine::PlanStageStepTiles(run.spec, StageOptimizer(), setup.cut.part(s), kStageBatch,
                                   run.spec.gpt.block_size, kStageMicroBatches);
    CHECK(plan.ok()) << plan.status().ToString();
    return *plan;
  };
  engine::OpTrace honest;
  ASSERT_NO_FATAL_FAILURE(trace(1, &honest));
  const engine::TilePlan plan = plan_of(1);
  ASSERT_EQ(honest.size(), plan.ops.size());
  Result<engine::OpTrace> lie = CorruptSentTrace(plan, honest, run.commits[1], activation0);
  ASSERT_TRUE(lie.ok()) << lie.status().ToString();
  const StageTransfer* sent = nullptr;
  for (const StageTransfer& t : run.commits[1].sent) {
    if (activation0(t.key)) sent = &t;
  }
  ASSERT_NE(sent, nullptr);
  const int64_t k = ledger::StageSentOperator(plan, sent->key);
  ASSERT_GE(k, 0);
  EXPECT_TRUE(plan.ops[static_cast<size_t>(k)].name.ends_with("residual3"))
      << plan.ops[static_cast<size_t>(k)].name;
  EXPECT_EQ(engine::FirstDifference(honest, *lie), k);
  ASSERT_EQ(lie->size(), honest.size());
  for (size_t i = 0; i < honest.size(); ++i) {
    if (static_cast<int64_t>(i) == k) continue;
    EXPECT_EQ(lie->hash(i), honest.hash(i)) << plan.ops[i].name;
  }
  // The faulty operator's output is what the stage signed and sent.
  EXPECT_EQ(engine::TensorHash(lie->values(static_cast<size_t>(k))), sent->tensor);
  EXPECT_NE(engine::TensorHash(honest.values(static_cast<size_t>(k))), sent->tensor);

  // Stage 0's wte is an input of its step, the last stage's sum of squares sets its clipping.
  engine::OpTrace first, last;
  ASSERT_NO_FATAL_FAILURE(trace(0, &first));
  ASSERT_NO_FATAL_FAILURE(trace(2, &last));
  Result<engine::OpTrace> wte =
      CorruptSentTrace(plan_of(0), first, run.commits[0], [](const StageTensorKey& key) {
        return key.kind == StageTensorKind::kStageTensorTiedWeight;
      });
  EXPECT_EQ(wte.status().code(), StatusCode::kFailedPrecondition) << wte.status().ToString();
  Result<engine::OpTrace> total = CorruptSentTrace(
      plan_of(2), last, run.commits[2],
      [](const StageTensorKey& key) { return key.kind == StageTensorKind::kStageTensorGradTotal; });
  EXPECT_EQ(total.status().code(), StatusCode::kFailedPrecondition) << total.status().ToString();
  EXPECT_TRUE(total.status().message().find("reads grad_squares") != std::string::npos)
      << total.status().ToString();
}

// The solver adversary modes (node/adversary.h), each applied to one stage of the replica: the
// replay of every stage's step finds that stage, with the expected finding, and passes the
// other two.
TEST(StageReplayTest, EveryAdversaryModeOnOneStageIsCaughtAndNoHonestStageIs) {
  const ModelSpec spec = StageParseModel(kStageMlp);
  using Stages = std::vector<std::unique_ptr<Stage>>;
  using Outcomes = std::vector<StageStepOutcome>;
  struct Mode {
    std::string name;
    int cheat;
    StageFault fault;
    StageTensorKind kind;  // of the tensor at fault (output findings)
    std::function<void(Stages&, Outcomes&)> after;
    std::map<int, Batch> wrong;
    std::function<void(Stages&, std::vector<StageServingLink*>&)> before;
  };
  const Batch other = StageBatch(spec, 7);
  const auto kAct = StageTensorKind::kStageTensorActivation;
  std::vector<Mode> modes = {
      // lazy: does the passes but not the update, and commits the state it started from.
      {"lazy", 1, StageFault::kStageFaultState, kAct,
       [](Stages&, Outcomes& out) { out[1].commit.state_after = out[1].commit.state_before; }},
      // noisy: adds noise to its weights after the update and commits that state.
      {"noisy", 1, StageFault::kStageFaultState, kAct,
       [](Stages& st, Outcomes& out) {
         for (float& w : st[1]->params()[0].value.vec()) w = w + 1e-4f;
         out[1].commit.state_after = engine::StateHash(st[1]->state());
       }},
      // wrong_data: the first stage trains on other inputs, the last on other targets.
      {"wrong_data (inputs)", 0, StageFault::kStageFaultOutput, kAct, nullptr, {{0, other}}},
      {"wrong_data (targets)",
       2,
       StageFault::kStageFaultOutput,
       StageTensorKind::kStageTensorActivationGrad,
       nullptr,
       {{2, other}}},
      // wrong_result: commits a state it did not compute.
      {"wrong_result", 2, StageFault::kStageFaultState, kAct,
       [](Stages&, Outcomes& out) { out[2].commit.state_after = Blake2b("a made-up state"); }},
      // computes honestly, sends corrupted activations.
      {"corrupt activations",
       1,
       StageFault::kStageFaultOutput,
       kAct,
       nullptr,
       {},
       [](Stages&, std::vector<StageServingLink*>& links) {
         links[1]->corrupt = [](const StageTensorKey& k) {
           return k.kind == StageTensorKind::kStageTensorActivation && k.micro_batch == 0;
         };
       }},
  };
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    StageReplayRun run;
    StageRunForReplay(kStageMlp, &run, m.before, m.after, m.wrong);
    for (int s = 0; s < 3; ++s) {
      StageReplayResult r = StageReplay(run, s);
      if (s != m.cheat) {
        EXPECT_TRUE(r.ok()) << "honest stage " << s << ": " << r.message;
        continue;
      }
      EXPECT_EQ(r.fault, m.fault) << r.message;
      EXPECT_EQ(r.stage, static_cast<uint32_t>(s));
      EXPECT_EQ(r.replica, 1u);
      EXPECT_EQ(r.step, 1u);
      if (m.fault == StageFault::kStageFaultOutput) {
        EXPECT_EQ(r.key.kind, m.kind) << r.message;
        EXPECT_EQ(r.micro_batch, 0) << r.message;
      }
    }
  }
}

TEST(StageReplayTest, AReceivedInputThatDoesNotMatchItsSignedRecordIsCaught) {
  // Stage 2 serves, as the activation of micro-batch 0 it used, another tensor than stage 1 sent.
  StageReplayRun run;
  StageRunForReplay(kStageMlp, &run, nullptr);
  const StageTransfer& rec = run.commits[2].received[0];
  ASSERT_EQ(rec.key.kind, StageTensorKind::kStageTensorActivation);
  std::vector<float> other = StageTensorFromBytes(run.served[2].at(rec.tensor));
  other[1] = other[1] * 2.0f;
  run.served[2][rec.tensor] = StageTensorBytes(other);
  StageReplayResult r = StageReplay(run, 2);
  EXPECT_EQ(r.fault, StageFault::kStageFaultInput) << r.message;
  EXPECT_EQ(r.micro_batch, 0);
  EXPECT_TRUE(StageHas(r,
                       "replica 1, stage 2, step 1, micro-batch 0: input: the tensor the stage "
                       "used does not match the sender's signed record"))
      << r.message;

  // A record the stage made up (signed by itself, not by stage 1): the signature check.
  StageReplayRun forged;
  StageRunForReplay(kStageMlp, &forged, nullptr);
  StageTransfer& f = forged.commits[2].received[1];
  f = protocol::SignStageTransfer(f.key, Blake2b("made up"), f.bytes, StageNodeKey(2));
  r = StageReplay(forged, 2);
  EXPECT_EQ(r.fault, StageFault::kStageFaultRecord) << r.message;
  EXPECT_EQ(r.micro_batch, 1);
  EXPECT_TRUE(StageHas(r,
                       "replica 1, stage 2, step 1, micro-batch 1: record: replica 1, step 1, "
                       "micro-batch 1: activation stage 1 -> 2: sent by node"))
      << r.message;

  // An input not served at all.
  StageReplayRun unserved;
  StageRunForReplay(kStageMlp, &unserved, nullptr);
  unserved.served[1].clear();
  r = StageReplay(unserved, 1);
  EXPECT_EQ(r.fault, StageFault::kStageFaultUnserved) << r.message;
  EXPECT_EQ(r.micro_batch, 0);
}

// get_task's units of round 3 (StageCtx's) of a task of 2 replicas x 3 stages: replica 1's
// stage units on `chain`, placed with `beacon`; replica 0's on other nodes.
std::vector<UnitRecord> StageUnits(const std::vector<protocol::NodeId>& chain,
                                   const Hash256& beacon) {
  std::vector<UnitRecord> units;
  for (uint32_t shard = 0; shard < 6; ++shard) {
    UnitRecord u;
    u.index = 3 * 6 + shard;
    u.round = 3;
    u.shard = shard;
    u.status = ledger::WorkUnitStatus::kCommitted;
    u.assignee = shard / 3 == 1 ? chain[shard % 3] : StageNodeKey(10 + shard).public_key();
    u.assignment_beacon = shard / 3 == 1 ? beacon : Blake2b("replica 0's placement");
    units.push_back(u);
  }
  return units;
}

// A stage's check drawn for one run of its replica, and the replica placed again (stage 0 on
// another node) after a deadline before the check is judged: the devnet's false mismatch. The
// verifier read the replica's chain from get_task when it judged, took the new stage 0 node for
// the signer of the earlier run's tied-weight record, and found a "record" fault on an honest
// stage. A run is judged against the nodes placed with it (ReplicaRunChain, the ledger's
// derivation), and a run no longer its replica's is judged by no one.
TEST(StageReplayTest, ARunIsJudgedAgainstItsOwnChainAndAReplicaPlacedAgainWithdrawsItsChecks) {
  StageReplayRun run;
  StageRunForReplay(kStageGpt, &run, nullptr);
  const std::vector<protocol::NodeId> ran = StageCtx().chain;
  const Hash256 first = Blake2b("the block that placed the replica");
  const uint32_t index = 3 * 6 + 1 * 3 + 2;  // round 3, replica 1, stage 2
  auto replay = [&](const std::vector<protocol::NodeId>& chain) {
    Result<engine::TrainState> start = engine::LoadCheckpoint(&run.env, run.checkpoints[2]);
    CHECK(start.ok()) << start.status().ToString();
    Result<StageReplayResult> r =
        ReplayStageStep(StageSetup(run.spec, chain), std::move(*start), run.commits[2],
                        run.served[2], StageBatch(run.spec, 1), kStageDropoutSeed);
    CHECK(r.ok()) << r.status().ToString();
    return *r;
  };

  // While the run is the replica's: its chain, and stage 2's honest step replays clean.
  std::vector<UnitRecord> units = StageUnits(ran, first);
  Result<std::vector<protocol::NodeId>> chain = ReplicaRunChain(units, 3, index, first);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(*chain, ran);
  EXPECT_EQ(ReplicaRunChain(units, 3, index)->size(), 3u);  // a dispute's: the unit's own beacon
  EXPECT_TRUE(replay(*chain).ok()) << replay(*chain).message;

  // Stage 0 missed its deadline: the replica is placed again whole, stage 0 on another node.
  std::vector<protocol::NodeId> again = ran;
  again[0] = StageNodeKey(7).public_key();
  units = StageUnits(again, Blake2b("the block that placed it again"));
  // The replica's current nodes did not run the checked step: judged against them, the honest
  // tied-weight record (stage 0 -> 2, signed by the node that ran stage 0) reads as forged.
  const StageReplayResult wrong_chain = replay(again);
  EXPECT_EQ(wrong_chain.fault, StageFault::kStageFaultRecord) << wrong_chain.message;
  EXPECT_EQ(wrong_chain.key.kind, StageTensorKind::kStageTensorTiedWeight) << wrong_chain.message;
  // The check drawn for the first run gets no chain: it is withdrawn, nothing is judged.
  chain = ReplicaRunChain(units, 3, index, first);
  ASSERT_FALSE(chain.ok());
  EXPECT_EQ(chain.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(chain.status().message().find("the replica was placed again"), std::string::npos)
      << chain.status().ToString();
  // The new run's checks get the new chain; a unit get_task does not list gets none.
  EXPECT_EQ(*ReplicaRunChain(units, 3, index), again);
  EXPECT_EQ(ReplicaRunChain(units, 3, 99, first).status().code(), StatusCode::kNotFound);

  // A replica whose stage has no node yet (being placed again): no chain either.
  units[5].assignee = {};
  EXPECT_EQ(ReplicaRunChain(units, 3, index).status().code(), StatusCode::kFailedPrecondition);
}

TEST(StageReplayTest, AWrongUpdateAStartElsewhereAndMissingRecordsAreCaught) {
  StageReplayRun run;
  StageRunForReplay(kStageGpt, &run, nullptr);
  StageStepCommit honest = run.commits[0];
  run.commits[0].state_after = Blake2b("noisy update");
  StageReplayResult r = StageReplay(run, 0);
  EXPECT_EQ(r.fault, StageFault::kStageFaultState) << r.message;
  EXPECT_TRUE(StageHas(r, "replica 1, stage 0, step 1: state")) << r.message;

  run.commits[0] = honest;
  run.commits[0].state_before = Blake2b("elsewhere");
  EXPECT_EQ(StageReplay(run, 0).fault, StageFault::kStageFaultStart);

  run.commits[0] = honest;
  std::erase_if(run.commits[0].received, [](const StageTransfer& t) {
    return t.key.kind == StageTensorKind::kStageTensorTiedHeadGrad;
  });
  r = StageReplay(run, 0);
  EXPECT_EQ(r.fault, StageFault::kStageFaultMissing) << r.message;
  EXPECT_EQ(r.key.kind, StageTensorKind::kStageTensorTiedHeadGrad) << r.message;

  run.commits[0] = honest;
  std::swap(run.commits[0].sent[0], run.commits[0].sent[1]);
  EXPECT_EQ(StageReplay(run, 0).fault, StageFault::kStageFaultRecord);

  run.commits[0] = honest;
  EXPECT_TRUE(StageReplay(run, 0).ok());
}

// ---- The data plane over loopback HTTP.

// A stage node: its router, client, data plane, evidence (its checkpoint files in a folder of its
// own) and HTTP server (stopped first on destruction: the handlers use the plane).
struct StageNode {
  net::Router router;
  StageEvidence evidence{Env::Default(), TestDir("stage-evidence")};
  std::unique_ptr<net::HttpTransport> transport;
  std::unique_ptr<StagePlane> plane;
  std::unique_ptr<net::HttpServer> server;
};

// The node of stage s of ctx's replica, signing with `key`, serving on a free loopback port.
std::unique_ptr<StageNode> StageStartNode(const StageContext& ctx, int s, const KeyPair& key,
                                          const StagePlaneOptions& options) {
  auto n = std::make_unique<StageNode>();
  net::HttpTransportOptions topt;
  topt.threads = 2;
  n->transport = std::make_unique<net::HttpTransport>(topt);
  n->plane = std::make_unique<StagePlane>(ctx, s, key, n->transport.get(), options);
  n->plane->Register(&n->router);
  n->evidence.Register(&n->router);
  net::HttpServerOptions sopt;
  sopt.threads = 4;
  n->server = std::make_unique<net::HttpServer>(&n->router, sopt);
  Result<uint16_t> port = n->server->Start("127.0.0.1", 0);
  CHECK(port.ok()) << port.status().ToString();
  return n;
}

// Tells every node the chain and its endpoints.
void StageConnect(std::vector<std::unique_ptr<StageNode>>& nodes,
                  const std::vector<protocol::NodeId>& chain) {
  std::vector<std::string> endpoints;
  for (auto& n : nodes) endpoints.push_back(n->server->endpoint());
  for (auto& n : nodes) n->plane->SetChain(chain, endpoints);
}

std::vector<std::unique_ptr<StageNode>> StageNodes(const StageContext& ctx,
                                                   const StagePlaneOptions& options) {
  std::vector<std::unique_ptr<StageNode>> nodes;
  for (int s = 0; s < 3; ++s) nodes.push_back(StageStartNode(ctx, s, StageNodeKey(s), options));
  StageConnect(nodes, ctx.chain);
  return nodes;
}

// Stages `which` (each in its own thread, on its own node) run steps [first, last); returns each
// one's first error (or ok), and its outcomes.
std::vector<Status> StageRunOverHttp(std::vector<std::unique_ptr<Stage>>& stages,
                                     std::vector<std::unique_ptr<StageNode>>& nodes,
                                     const std::vector<int>& which, int64_t first, int64_t last,
                                     std::vector<std::vector<StageStepOutcome>>* outcomes) {
  const ModelSpec spec = stages[0]->state().model->spec();
  std::vector<Batch> batches;
  for (int64_t step = 0; step < last; ++step) batches.push_back(StageBatch(spec, step));
  std::vector<Status> status(stages.size(), Status::Ok());
  outcomes->assign(stages.size(), {});
  std::vector<std::thread> threads;
  for (int s : which) {
    threads.emplace_back([&, s] {
      for (int64_t step = first; step < last; ++step) {
        nodes[s]->plane->BeginStep(static_cast<uint64_t>(step));
        // As RunStageUnit: the step's start to its keeper, before the step's first tensor.
        Status kept =
            nodes[s]->plane->KeepCheckpoint(static_cast<uint64_t>(step), stages[s]->state());
        if (!kept.ok()) {
          status[s] = kept;
          return;
        }
        Result<StageStepOutcome> r =
            RunStageStep(*stages[s], nodes[s]->plane->context(), batches[step], kStageDropoutSeed,
                         *nodes[s]->plane->link());
        if (!r.ok()) {
          status[s] = r.status();
          return;
        }
        (*outcomes)[s].push_back(std::move(*r));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

TEST(StagePlaneTest, ThreeStageEndpointsTrainBitEqualToRunPipelineStep) {
  // Both also with inboxes that hold one tensor per sender at a time: senders are pushed back
  // and retry (and the next step's tensors must not block this step's).
  for (auto [toml, tight] : {std::pair{kStageMlp, false}, std::pair{kStageGpt, false},
                             std::pair{kStageMlp, true}, std::pair{kStageGpt, true}}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind + (tight ? " (one tensor per inbox)" : ""));
    StagePlaneOptions opt;
    opt.step_deadline_ms = 30'000;  // a stall fails the test in 30 s, not the default's 120
    if (tight) opt.inbox_bytes = 1;
    constexpr int64_t kSteps = 3;
    std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
    std::vector<float> losses;
    for (int64_t step = 0; step < kSteps; ++step) {
      losses.push_back(
          engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed).loss);
    }
    std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
    const StageContext ctx = StageCtx();
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, kSteps, &out);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      EXPECT_EQ(engine::StateHash(got[s]->state()), engine::StateHash(want[s]->state()))
          << "stage " << s;
      for (const engine::Param& p : got[s]->params()) {
        const engine::Param* q = nullptr;
        for (const engine::Param& w : want[s]->params()) {
          if (w.name == p.name) q = &w;
        }
        ASSERT_NE(q, nullptr) << p.name;
        EXPECT_EQ(p.value.vec(), q->value.vec()) << p.name;
      }
    }
    for (int64_t step = 0; step < kSteps; ++step) EXPECT_EQ(out[2][step].loss, losses[step]);
    uint64_t bytes = 0, pushes = 0, retries = 0, peak = 0;
    // The links each stage measured: per step, stage 1 pushes M activations and the running sum
    // to stage 2 and M gradients to stage 0.
    const StagePlaneStats middle = nodes[1]->plane->stats();
    ASSERT_EQ(middle.links.size(), 2u);
    EXPECT_EQ(middle.links.at(2).pushes, kSteps * (kStageMicroBatches + 1));
    EXPECT_EQ(middle.links.at(0).pushes, kSteps * kStageMicroBatches);
    EXPECT_EQ(middle.links.at(0).bytes + middle.links.at(2).bytes, middle.bytes_sent);
    EXPECT_LE(middle.links.at(0).min_push_us * middle.links.at(0).pushes,
              middle.links.at(0).push_us);
    // What the middle node reports of them (MeasuredLinks): its two neighbours' nodes, each
    // with a bandwidth derived from that link's bytes (not asserting any speed).
    const std::vector<ledger::NodeLink> reported = MeasuredLinks(middle, ctx.chain);
    ASSERT_EQ(reported.size(), 2u);
    std::set<PublicKey> peers = {reported[0].peer, reported[1].peer};
    EXPECT_EQ(peers, (std::set<PublicKey>{ctx.chain[0], ctx.chain[2]}));
    EXPECT_LT(reported[0].peer, reported[1].peer);
    for (const ledger::NodeLink& l : reported) {
      const StageLinkStats& m = middle.links.at(l.peer == ctx.chain[0] ? 0 : 2);
      EXPECT_GE(l.bandwidth_bytes_per_s, 1u);
      EXPECT_EQ(l.latency_ms, m.min_push_us / 1000);
    }
    for (auto& n : nodes) {
      const StagePlaneStats ps = n->plane->stats();
      bytes += ps.bytes_sent;
      pushes += ps.pushes_sent;
      retries += ps.push_retries;
      peak = std::max(peak, ps.peak_inbox_bytes);
    }
    std::printf(
        "%s%s: %lld steps over HTTP, %llu pushes, %llu tensor bytes, %llu retries, "
        "peak inbox %llu bytes\n",
        spec.kind.c_str(), tight ? " (one tensor per inbox)" : "", static_cast<long long>(kSteps),
        static_cast<unsigned long long>(pushes), static_cast<unsigned long long>(bytes),
        static_cast<unsigned long long>(retries), static_cast<unsigned long long>(peak));
    EXPECT_EQ(pushes, kSteps * (2 * 2 * kStageMicroBatches + 4 + (spec.kind == "gpt" ? 2 : 0)));
  }
}

TEST(StagePlaneTest, MeasuredLinksConvertTheStatsOfEveryPeerThatTookPushes) {
  const StageContext ctx = StageCtx(4);
  StagePlaneStats stats;
  // 3 MB in pushes whose round trips sum to 1.5 s, the fastest 2.999 ms: 2 MB/s, 2 ms.
  stats.links[3] = {.pushes = 4, .bytes = 3'000'000, .push_us = 1'500'000, .min_push_us = 2'999};
  // Round trips under a microsecond in all, the fastest under a millisecond: no division by
  // zero, 0 ms, and the bandwidth capped at the ledger's bound.
  stats.links[0] = {.pushes = 1, .bytes = 2'000'000'000, .push_us = 0, .min_push_us = 0};
  stats.links[1] = {.pushes = 0, .bytes = 0, .push_us = 0, .min_push_us = 0};     // none taken
  stats.links[9] = {.pushes = 1, .bytes = 10, .push_us = 10, .min_push_us = 10};  // no such stage
  // A push that took over a minute: capped at the ledger's bound.
  stats.links[2] = {.pushes = 1, .bytes = 1, .push_us = 90'000'000, .min_push_us = 90'000'000};
  std::vector<ledger::NodeLink> got = MeasuredLinks(stats, ctx.chain);
  std::vector<ledger::NodeLink> want = {
      {.peer = ctx.chain[3], .latency_ms = 2, .bandwidth_bytes_per_s = 2'000'000},
      {.peer = ctx.chain[0],
       .latency_ms = 0,
       .bandwidth_bytes_per_s = protocol::kMaxLinkBandwidthBytesPerS},
      {.peer = ctx.chain[2],
       .latency_ms = protocol::kMaxLinkLatencyMs,
       .bandwidth_bytes_per_s = 1}};
  std::sort(want.begin(), want.end(),
            [](const ledger::NodeLink& a, const ledger::NodeLink& b) { return a.peer < b.peer; });
  EXPECT_EQ(got, want);
}

TEST(StagePlaneTest, AStageThatStopsAnsweringFailsTheStepByItsDeadline) {
  const ModelSpec spec = StageParseModel(kStageMlp);
  const StageContext ctx = StageCtx();
  StagePlaneOptions opt;
  opt.step_deadline_ms = 800;
  // Stage 2's node is up but its stage never runs (it takes activations, sends nothing back);
  // then its node is down (nothing listens at its endpoint).
  for (bool node_down : {false, true}) {
    SCOPED_TRACE(node_down ? "node down" : "stage silent");
    std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
    const std::string stage2 = nodes[2]->server->endpoint();
    if (node_down) nodes[2]->server->Stop();
    std::vector<Hash256> before;
    for (auto& s : stages) before.push_back(engine::StateHash(s->state()));
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(stages, nodes, {0, 1}, 0, 1, &out);
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(st[s].code(), StatusCode::kDeadlineExceeded) << st[s].ToString();
      EXPECT_NE(st[s].message().find("replica 1, stage " + std::to_string(s) + ", step 0"),
                std::string::npos)
          << st[s].ToString();
      // No half-applied step: the weights and moments are those of the step's start.
      EXPECT_EQ(engine::StateHash(stages[s]->state()), before[s]) << "stage " << s;
      EXPECT_EQ(stages[s]->state().step, 0);
    }
    // Stage 1 names the stage that stopped answering, its node and its endpoint; stage 0 the
    // stage it waited for.
    EXPECT_NE(st[1].message().find("stage 2 (node " + ctx.chain[2].ShortHex() + " at " + stage2),
              std::string::npos)
        << st[1].ToString();
    EXPECT_NE(st[1].message().find(node_down ? "did not take replica 1, step 0, micro-batch 0: "
                                               "activation stage 1 -> 2"
                                             : "no replica 1, step 0, micro-batch 0: "
                                               "activation_grad stage 2 -> 1"),
              std::string::npos)
        << st[1].ToString();
    EXPECT_NE(st[0].message().find("activation_grad stage 1 -> 0 from stage 1"), std::string::npos)
        << st[0].ToString();
  }
}

// A stage unit no longer assigned (its round re-ran) is cancelled (Stager): the receive it waits
// on fails at once, and so does every later step, instead of holding the node until the step's
// deadline (here ten minutes: the test would time out if Cancel did nothing). The plane is
// cancelled once the receive waits (StagePlane::awaiting), not after a pause that a loaded machine
// can outlast before the receive starts (then it would test a receive begun after the Cancel).
TEST(StagePlaneTest, ACancelledPlaneFailsItsWaitingReceiveAndEveryLaterStep) {
  const StageContext ctx = StageCtx();
  StagePlaneOptions opt;
  opt.step_deadline_ms = 600'000;
  std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
  StagePlane& plane = *nodes[1]->plane;
  plane.BeginStep(0);
  EXPECT_FALSE(plane.awaiting());
  // The canceller gives up if the receive returns without ever waiting (the test then fails on
  // its answer below instead of hanging).
  std::atomic<bool> returned = false;
  std::thread canceller([&] {
    while (!plane.awaiting() && !returned)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    plane.Cancel();
  });
  StageTransfer record;
  Result<std::vector<float>> got =
      plane.link()->Receive(ctx.Key(StageTensorKind::kStageTensorActivation, 0, 1, 0, 0), &record);
  returned = true;
  canceller.join();
  EXPECT_FALSE(plane.awaiting());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition) << got.status().ToString();
  EXPECT_NE(got.status().message().find("cancelled (no longer assigned)"), std::string::npos)
      << got.status().ToString();
  plane.BeginStep(1);
  got =
      plane.link()->Receive(ctx.Key(StageTensorKind::kStageTensorActivation, 0, 1, 1, 0), &record);
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition) << got.status().ToString();
  Result<StageTransfer> sent = plane.link()->Send(
      ctx.Key(StageTensorKind::kStageTensorActivation, 1, 2, 1, 0), std::vector<float>{1, 2});
  EXPECT_EQ(sent.status().code(), StatusCode::kFailedPrecondition) << sent.status().ToString();
}

// ---- A whole task: DiLoCo rounds whose replicas are chains of stage endpoints.

// kPipelineGptTask (testing/pipeline_task.h), whose rounds node/src/pipeline_diloco_test.cc checks
// with the stages in one process, here with each stage an HTTP endpoint.
// What a stage node builds a stage unit from without the whole model (Stager): its stage, from
// the slices of the round's global weights (StageFromGlobal: the values the whole model's
// parameters of the same names hold), and its batches, from the unit's data stream alone
// (engine::DataStream: the trainer's BatchForStep after StartUnit).
TEST(StageUnitTest, AStageAndItsBatchesComeFromTheGlobalWeightsAndTheDataStreamAlone) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(o.task, o.data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  engine::Trainer* trainer = tr->get();
  const engine::TaskSpec& t = trainer->task();
  // Weights that differ in every coordinate, so a slice taken from the wrong offset shows.
  std::vector<float> global = trainer->FlatParams();
  for (size_t i = 0; i < global.size(); ++i) global[i] += 1e-3f * static_cast<float>(i % 997);
  Result<int64_t> count = engine::CountParameters(t.model);
  ASSERT_TRUE(count.ok()) << count.status().ToString();
  EXPECT_EQ(static_cast<size_t>(*count), global.size());
  const UnitWork work{.stream = 7, .lr_scale = 0.5};
  ASSERT_TRUE(trainer->StartUnit(work.stream, global, work.lr_scale).ok());
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(t, static_cast<int>(o.net.stages), o.net.cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  for (int s = 0; s < cut->stages(); ++s) {
    Result<std::unique_ptr<Stage>> got = StageFromGlobal(t, *cut, s, global, work.lr_scale);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    Result<std::unique_ptr<Stage>> want = Stage::Create(
        t.model, engine::UnitOptimizerSpec(t.optimizer, work.lr_scale), *cut, s, t.micro_batches);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    CopyWholeParams(*trainer->state().model, **want);
    EXPECT_EQ(StageFlatParams(**got), StageFlatParams(**want)) << "stage " << s;
    EXPECT_EQ(engine::StateHash((*got)->state()), engine::StateHash((*want)->state()))
        << "stage " << s;
  }
  Result<std::unique_ptr<Stage>> short_global =
      StageFromGlobal(t, *cut, 0, std::span<const float>(global).first(global.size() - 1), 1.0);
  ASSERT_FALSE(short_global.ok());
  EXPECT_NE(short_global.status().message().find("values for a model of"), std::string::npos)
      << short_global.status().ToString();
  engine::DataStream stream(t, trainer->data(), work.stream);
  for (int64_t step = 0; step < 4; ++step) {
    const Batch a = stream.BatchForStep(step);
    const Batch b = trainer->BatchForStep(step);
    EXPECT_EQ(a.tokens, b.tokens) << "step " << step;
    EXPECT_EQ(a.targets, b.targets) << "step " << step;
  }
}

TEST(StagePlaneTest, TwoReplicasOfThreeStageEndpointsEndBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  const NetworkSpec& net = o.net;
  const LocalDilocoResult& want = o.want;

  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(o.task, o.data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  engine::Trainer* trainer = tr->get();
  const engine::TaskSpec& t = trainer->task();
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(t, static_cast<int>(net.stages), net.cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  ASSERT_EQ(cut->stages(), 3);
  const protocol::TaskSpecView view = MakeTaskView(*trainer, net);
  GlobalState state = InitialState(*trainer);
  const uint64_t samples = UnitSamples(*trainer, net);
  uint64_t bytes = 0, checkpoint_bytes = 0, checkpoints = 0, steps = 0;
  for (uint32_t r = 0; r < net.rounds; ++r) {
    // Each replica: 3 stage nodes of its own, from the round's weights, on its unit's batches.
    struct Replica {
      UnitWork work;
      std::vector<engine::Batch> batches;
      std::vector<std::unique_ptr<Stage>> stages;
      std::vector<std::unique_ptr<StageNode>> nodes;
    };
    std::vector<Replica> replicas(net.units_per_round);
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      Replica& rep = replicas[i];
      rep.work = protocol::UnitWorkOf(net, view.seed, view.id, r, i);
      ASSERT_TRUE(trainer->StartUnit(rep.work.stream, state.weights, rep.work.lr_scale).ok());
      for (int64_t s = 0; s < rep.work.inner_steps; ++s) {
        rep.batches.push_back(trainer->BatchForStep(s));
      }
      StageContext ctx;
      ctx.task = view.id;
      ctx.round = r;
      ctx.replica = i;
      for (int s = 0; s < 3; ++s) {
        ctx.chain.push_back(StageNodeKey(static_cast<int>(10 * i) + s).public_key());
      }
      for (int s = 0; s < 3; ++s) {
        Result<std::unique_ptr<Stage>> st =
            Stage::Create(t.model, engine::UnitOptimizerSpec(t.optimizer, rep.work.lr_scale), *cut,
                          s, t.micro_batches);
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        CopyWholeParams(*trainer->state().model, **st);
        rep.stages.push_back(std::move(*st));
        rep.nodes.push_back(StageStartNode(ctx, s, StageNodeKey(static_cast<int>(10 * i) + s), {}));
      }
      StageConnect(rep.nodes, ctx.chain);
    }
    // Both replicas at once: 6 stage threads, each on its own endpoint.
    std::vector<Status> status(2 * 3, Status::Ok());
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      for (int s = 0; s < 3; ++s) {
        threads.emplace_back([&, i, s] {
          Replica& rep = replicas[i];
          const uint64_t seed = engine::DropoutSeed(t.seed, rep.work.stream);
          for (int64_t step = 0; step < rep.work.inner_steps; ++step) {
            rep.nodes[s]->plane->BeginStep(static_cast<uint64_t>(step));
            Status kept = rep.nodes[s]->plane->KeepCheckpoint(static_cast<uint64_t>(step),
                                                              rep.stages[s]->state());
            if (!kept.ok()) {
              status[3 * i + s] = kept;
              return;
            }
            Result<StageStepOutcome> o =
                RunStageStep(*rep.stages[s], rep.nodes[s]->plane->context(), rep.batches[step],
                             seed, *rep.nodes[s]->plane->link());
            if (!o.ok()) {
              status[3 * i + s] = o.status();
              return;
            }
          }
        });
      }
    }
    for (std::thread& th : threads) th.join();
    std::vector<std::vector<float>> deltas;  // RoundDelta holds a span: they must outlive it
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      for (int s = 0; s < 3; ++s) {
        ASSERT_TRUE(status[3 * i + s].ok()) << status[3 * i + s].ToString();
        const StagePlaneStats ps = replicas[i].nodes[s]->plane->stats();
        bytes += ps.bytes_sent;
        // Every step but the first (the round's start) replicated to the stage's keeper, which
        // holds the newest: the last step's start, as its node signed it.
        const int64_t h = replicas[i].work.inner_steps;
        EXPECT_EQ(ps.checkpoints_sent, static_cast<uint64_t>(h - 1));
        checkpoint_bytes += ps.checkpoint_bytes_sent;
        checkpoints += ps.checkpoints_sent;
        steps += static_cast<uint64_t>(h);
        const uint32_t keeper = protocol::StageCheckpointKeeper(static_cast<uint32_t>(s), 3);
        const std::map<uint32_t, KeptCheckpoint> kept = replicas[i].nodes[keeper]->plane->kept();
        ASSERT_EQ(kept.count(static_cast<uint32_t>(s)), 1u);
        EXPECT_EQ(kept.at(static_cast<uint32_t>(s)).claim.step, static_cast<uint64_t>(h - 1));
      }
      deltas.push_back(
          protocol::PseudoGradient(state.weights, GatherStageParams(replicas[i].stages)));
    }
    std::vector<RoundDelta> round;
    for (uint32_t i = 0; i < net.units_per_round; ++i) {
      round.push_back({.shard = i, .delta = deltas[i]});
    }
    ASSERT_TRUE(ApplyRound(&state, round, net, view.id, r, samples).ok());
    EXPECT_EQ(HashFloats(state.weights), want.rounds[r].global_hash) << "round " << r;
  }
  EXPECT_EQ(HashFloats(state.weights), want.final_hash);
  std::printf(
      "2 rounds x 2 replicas x 3 stages over HTTP: %llu tensor bytes between stages (%llu a stage "
      "step), %llu checkpoints to keepers of %llu bytes (%llu each)\n",
      static_cast<unsigned long long>(bytes),
      static_cast<unsigned long long>(bytes / std::max<uint64_t>(steps, 1)),
      static_cast<unsigned long long>(checkpoints),
      static_cast<unsigned long long>(checkpoint_bytes),
      static_cast<unsigned long long>(checkpoint_bytes / std::max<uint64_t>(checkpoints, 1)));
}

// A verifier fetches a stage step's evidence from the stage's node over HTTP (the commit, the
// checkpoint of the step's start, the received tensors) and replays it.
TEST(StagePlaneTest, AVerifierFetchesAStageStepFromItsNodeAndReplaysIt) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
    const StageContext ctx = StageCtx();
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, 1, &out);
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(st[s].ok()) << st[s].ToString();
    for (int s = 0; s < 3; ++s) {
      const StageStepRef ref{ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), 1};
      ASSERT_TRUE(nodes[s]->evidence.SaveCheckpoint(ref, got[s]->state()).ok());
    }
    st = StageRunOverHttp(got, nodes, {0, 1, 2}, 1, 2, &out);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      std::map<Hash256, Bytes> received = nodes[s]->plane->received();
      EXPECT_EQ(received.size(), out[s][0].commit.received.size());
      if (s == 2 && spec.kind != "gpt") {
        // The MLP's stage 2 serves, for micro-batch 1's activations, other floats than it got.
        Bytes& b = received.at(out[s][0].commit.received[1].tensor);
        b[0] ^= 1;
      }
      ASSERT_TRUE(nodes[s]->evidence.Publish(out[s][0].commit, received).ok());
    }

    const StageReplaySetup setup = StageSetup(spec, ctx.chain);
    net::HttpTransport verifier;
    for (int s = 0; s < 3; ++s) {
      const StageStepRef ref{ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), 1};
      Result<StageStepEvidence> ev =
          FetchStageStepEvidence(&verifier, nodes[s]->server->endpoint(), ref);
      ASSERT_TRUE(ev.ok()) << ev.status().ToString();
      EXPECT_EQ(ev->commit, out[s][0].commit);
      Result<engine::TrainState> start = StageCheckpointState(ev->checkpoint);
      ASSERT_TRUE(start.ok()) << start.status().ToString();
      Result<StageReplayResult> r = ReplayStageStep(setup, std::move(*start), ev->commit, ev->blobs,
                                                    StageBatch(spec, 1), kStageDropoutSeed);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (s == 2 && spec.kind != "gpt") {
        EXPECT_EQ(r->fault, StageFault::kStageFaultInput) << r->message;
        EXPECT_EQ(r->micro_batch, 1) << r->message;
      } else {
        EXPECT_TRUE(r->ok()) << "stage " << s << ": " << r->message;
      }
    }
    Result<StageStepEvidence> none = FetchStageStepEvidence(
        &verifier, nodes[0]->server->endpoint(), {ctx.task, ctx.round, ctx.replica, 0, 7});
    EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
    EXPECT_NE(none.status().message().find("serves no replica 1, stage 0, step 7"),
              std::string::npos)
        << none.status().ToString();
  }
}

// A verifier loads a stage's checkpoint as it fetches it (FetchStageCheckpointState: a slice in
// memory at a time, each tensor straight into the state): the same state, bit for bit, as the old
// path (the whole file's bytes fetched, then decoded); a file of another size than it is, or
// tampered with, does not load (the stage's `start` fault), with the reason; a step no longer
// served is NotFound. The result hash, computed a piece at a time from that state, is the one
// the delta's encoding gives (ResultBlobId of the start weights and the parameters).
TEST(StagePlaneTest, AVerifierLoadsAStageCheckpointAsItFetchesIt) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
    const StageContext ctx = StageCtx();
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
    std::vector<StageStepRef> refs;
    for (int s = 0; s < 3; ++s) {
      refs.push_back({ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), 0});
      ASSERT_TRUE(nodes[s]->evidence.SaveCheckpoint(refs[s], got[s]->state()).ok());
    }
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, 1, &out);
    net::HttpTransport verifier;
    Result<std::vector<engine::PlannedParam>> planned = engine::PlanParams(spec);
    ASSERT_TRUE(planned.ok()) << planned.status().ToString();
    std::vector<float> global;
    for (const engine::PlannedParam& p : *planned) {
      global.resize(static_cast<size_t>(p.offset + engine::NumElements(p.shape)));
    }
    for (size_t i = 0; i < global.size(); ++i) global[i] = 0.001f * static_cast<float>(i % 997);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      ASSERT_TRUE(nodes[s]->evidence.Publish(out[s][0].commit, nodes[s]->plane->received()).ok());
      const std::string endpoint = nodes[s]->server->endpoint();
      Result<StageStepEvidence> old = FetchStageStepEvidence(&verifier, endpoint, refs[s]);
      ASSERT_TRUE(old.ok()) << old.status().ToString();
      Result<StageStepEvidence> ev = FetchStageStepRecords(&verifier, endpoint, refs[s]);
      ASSERT_TRUE(ev.ok()) << ev.status().ToString();
      EXPECT_TRUE(ev->checkpoint.empty());
      EXPECT_EQ(ev->checkpoint_bytes, old->checkpoint.size());
      EXPECT_EQ(ev->commit, old->commit);
      EXPECT_EQ(ev->blobs, old->blobs);
      Result<engine::TrainState> want = StageCheckpointState(old->checkpoint);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      Result<engine::TrainState> streamed = engine::TrainState{};
      Status fetched =
          FetchStageCheckpointState(&verifier, endpoint, refs[s], ev->checkpoint_bytes, &streamed);
      ASSERT_TRUE(fetched.ok()) << fetched.ToString();
      ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
      EXPECT_EQ(engine::StateHash(*streamed), engine::StateHash(*want));
      EXPECT_EQ(engine::StateHash(*streamed), ev->commit.state_before);
      EXPECT_EQ(ToBytes(engine::CheckpointBytes(*streamed)), old->checkpoint);

      // The result hash a piece at a time = the hash of the delta's encoding.
      std::vector<float> start, params;
      for (const engine::Param& p : streamed->model->params()) {
        for (const engine::PlannedParam& q : *planned) {
          if (q.name != p.name) continue;
          const auto from = global.begin() + q.offset;
          start.insert(start.end(), from, from + engine::NumElements(q.shape));
        }
        params.insert(params.end(), p.value.vec().begin(), p.value.vec().end());
      }
      ASSERT_EQ(start.size(), params.size());
      Result<Hash256> id = ledger::StageResultBlobId(spec, global, *streamed);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      EXPECT_EQ(*id, ledger::ResultBlobId(start, params));  // the delta encoded whole

      // Declared shorter or longer than the file: it does not load, and says why.
      for (uint64_t size : {ev->checkpoint_bytes - 1, ev->checkpoint_bytes / 2}) {
        Result<engine::TrainState> cut = engine::TrainState{};
        ASSERT_TRUE(FetchStageCheckpointState(&verifier, endpoint, refs[s], size, &cut).ok());
        EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss) << cut.status().ToString();
        EXPECT_NE(cut.status().message().find("truncated"), std::string::npos)
            << cut.status().ToString();
      }
      Result<engine::TrainState> longer = engine::TrainState{};
      ASSERT_TRUE(
          FetchStageCheckpointState(&verifier, endpoint, refs[s], ev->checkpoint_bytes + 8, &longer)
              .ok());
      EXPECT_FALSE(longer.ok());
      EXPECT_NE(longer.status().message().find("trailing bytes"), std::string::npos)
          << longer.status().ToString();
      // A bit of its last tensor flipped on the node's disk: it does not hash to its state_hash.
      const std::string path = *nodes[s]->evidence.CheckpointFile(refs[s]);
      Bytes flipped = old->checkpoint;
      flipped[flipped.size() - 3] ^= 0x40;
      ASSERT_TRUE(Env::Default()->WriteFileAtomic(path, AsStringView(flipped)).ok());
      Result<engine::TrainState> tampered = engine::TrainState{};
      ASSERT_TRUE(
          FetchStageCheckpointState(&verifier, endpoint, refs[s], ev->checkpoint_bytes, &tampered)
              .ok());
      EXPECT_NE(tampered.status().message().find("state hash mismatch"), std::string::npos)
          << tampered.status().ToString();
      // No longer served: NotFound, nothing judged.
      nodes[s]->evidence.Withdraw(refs[s]);
      Result<engine::TrainState> gone = engine::TrainState{};
      EXPECT_EQ(FetchStageCheckpointState(&verifier, endpoint, refs[s], ev->checkpoint_bytes, &gone)
                    .code(),
                StatusCode::kNotFound);
    }
  }
}

// The continuity check of step t (CheckStageContinuity) reads step t-1's commit beside step t's.
// A stage that serves step t but withholds step t-1's commit is the finding `unserved` on step
// t-1 (its claim one the ledger rules as any unserved step: UnservedStageClaim, whole steps, and
// a stage that posts no witness by the referee's deadline loses, `ledger_test`
// `PipelineRulingTest.AStageThatPostsNoWitnessByTheRefereesDeadlineLoses`); before, the check was
// skipped ("continuity not checked") and a drifted step t passed. An honest stage, serving both,
// is never accused, at either step.
TEST(StagePlaneTest, AStageThatWithholdsThePreviousStepsCommitIsUnservedThereAndNoHonestOneIs) {
  const ModelSpec spec = StageParseModel(kStageMlp);
  std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
  const StageContext ctx = StageCtx();
  std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
  // Steps 0 and 1 of the three stages, each step's start kept and its commit published as the
  // Stager does.
  std::vector<std::vector<protocol::StageStepCommit>> commits(3);
  for (int64_t step = 0; step < 2; ++step) {
    for (int s = 0; s < 3; ++s) {
      const StageStepRef ref{ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s),
                             static_cast<uint64_t>(step)};
      ASSERT_TRUE(nodes[s]->evidence.SaveCheckpoint(ref, got[s]->state()).ok());
    }
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, step, step + 1, &out);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      ASSERT_TRUE(nodes[s]->evidence.Publish(out[s][0].commit, nodes[s]->plane->received()).ok());
      commits[s].push_back(out[s][0].commit);
    }
  }
  net::HttpTransport verifier;
  ledger::TaskParams params;
  params.stages = 3;
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const std::vector<Hash256> step_leaves = {protocol::StageStepLeaf(commits[s][0]),
                                              protocol::StageStepLeaf(commits[s][1])};
    const std::vector<Hash256> leaves = {protocol::StageCommitment(step_leaves), step_leaves[0],
                                         step_leaves[1]};
    const StageCheckInput in{.task_id = ctx.task,
                             .round = ctx.round,
                             .replica = ctx.replica,
                             .stage = s,
                             .transport = &verifier,
                             .endpoint = nodes[s]->server->endpoint()};
    // Honest: each step starts where it should (step 0 from the state it was trained from).
    for (uint64_t step = 0; step < 2; ++step) {
      Result<StageStepCheck> r = CheckStageContinuity(in, step, leaves, commits[s][0].state_before);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->leaf, leaves[step + 1]) << "step " << step << ": " << r->message;
      EXPECT_TRUE(r->replay.ok()) << r->message;
    }
    // Step 0's commit withheld while step 1 is served: step 1's check finds step 0 unserved, and
    // the verifier's claim on step 0 is an unserved claim.
    nodes[s]->evidence.Withdraw({ctx.task, ctx.round, ctx.replica, s, 0});
    Result<StageStepCheck> r = CheckStageContinuity(in, 1, leaves, Hash256{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->leaf, StageUnservedLeaf(leaves[1])) << r->message;
    EXPECT_EQ(r->replay.fault, StageFault::kStageFaultUnserved) << r->message;
    EXPECT_EQ(r->replay.step, 0u) << r->message;
    EXPECT_NE(r->message.find("step 0: unserved (read to check step 1's continuity)"),
              std::string::npos)
        << r->message;
    ledger::MismatchClaimField claim;
    claim.segment = static_cast<uint32_t>(r->replay.step);
    claim.start = leaves[r->replay.step];
    claim.solver_end = leaves[r->replay.step + 1];
    claim.replayed_end = r->leaf;
    EXPECT_TRUE(ledger::UnservedStageClaim(params, claim));
    // Step 1's own commit withheld too: unserved on step 1, as before.
    nodes[s]->evidence.Withdraw({ctx.task, ctx.round, ctx.replica, s, 1});
    r = CheckStageContinuity(in, 1, leaves, Hash256{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->leaf, StageUnservedLeaf(leaves[2])) << r->message;
    EXPECT_EQ(r->replay.step, 1u) << r->message;
  }
}

// A chain whose blocks hold given transactions, answering get_block_txs (ledger/rpc.h) a page of
// two at a time: what a verifier reads a stage's pieces served on chain from.
class BlockTxsChain : public ChainClient {
 public:
  void Add(uint64_t height, ledger::TxPayload payload, bool ok) {
    ledger::Transaction tx;
    tx.chain_id = "test";
    tx.nonce = next_nonce_++;
    tx.payload = std::move(payload);
    blocks_[height].push_back({tx, ok});
  }
  Result<nlohmann::json> Call(const std::string& method, const nlohmann::json& params) override {
    if (method != "get_block_txs") return Internal("unexpected call " + method);
    const uint64_t h = params.at("height").get<uint64_t>();
    const uint64_t cursor = params.value("cursor", uint64_t{0});
    const std::string type = params.value("type", std::string());
    const std::vector<std::pair<ledger::Transaction, bool>>& txs = blocks_[h];
    nlohmann::json out = nlohmann::json::array();
    uint64_t next = cursor;
    for (; next < txs.size(); ++next) {
      const ledger::Transaction& tx = txs[next].first;
      const std::string name(ledger::TxTypeName(ledger::PayloadType(tx.payload)));
      if (!type.empty() && name != type) continue;
      if (out.size() == 2) break;
      out.push_back({{"position", next},
                     {"tx_id", ledger::TxId(tx).ToHex()},
                     {"type", name},
                     {"ok", txs[next].second},
                     {"tx", HexEncode(ledger::EncodeTx(tx))}});
    }
    ++calls;
    return nlohmann::json{
        {"height", h},
        {"txs", std::move(out)},
        {"next_cursor", next < txs.size() ? nlohmann::json(next) : nlohmann::json(nullptr)}};
  }
  std::string Describe() const override { return "blocks of given transactions"; }
  int calls = 0;

 private:
  uint64_t next_nonce_ = 0;
  std::map<uint64_t, std::vector<std::pair<ledger::Transaction, bool>>> blocks_;
};

// A claim that a stage over the witness bound served nothing is answered by the stage's evidence
// in pieces (ledger/stage_serve.h): a party of the dispute builds every piece from what the stage
// node serves over HTTP (BuildStageServeTxs, what Disputes::RunStageServeEvidence posts), and the
// ledger's check of a ServeStageEvidence piece takes each one, for every stage of a GPT replica
// (its received tensors in rows of n_embd, as a task's stages tile them). A step the node no
// longer serves gives no piece. Put back together (AssembleStageServeEvidence), the pieces give the
// step's start state and received tensors, what a verifier replays the step from; a verifier
// reads them back from the blocks that executed them (ReadServedStagePieces over get_block_txs,
// BlockTxsChain below), skipping pieces the ledger refused and another unit's, and puts them
// together into a fresh stage (AssembleOnChainStageStep).
TEST(StagePlaneTest, AStageNodesServedStepGivesEveryPieceOfItsEvidenceAndTheLedgerTakesEach) {
  const ModelSpec spec = StageParseModel(kStageGpt);
  std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
  StageContext ctx = StageCtx();
  ctx.tile_cols = ledger::StageTileCols(spec);
  std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
  for (int s = 0; s < 3; ++s) {
    const StageStepRef ref{ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), 0};
    ASSERT_TRUE(nodes[s]->evidence.SaveCheckpoint(ref, got[s]->state()).ok());
  }
  std::vector<std::vector<StageStepOutcome>> out;
  std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, 1, &out);
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(st[s].ok()) << st[s].ToString();
    ASSERT_TRUE(nodes[s]->evidence.Publish(out[s][0].commit, nodes[s]->plane->received()).ok());
  }
  Result<engine::PipelineCut> cut = engine::MakeCut(spec, StageBounds(spec));
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  net::HttpTransport party;
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    ledger::TileRuleContext tc;
    Result<engine::TilePlan> plan =
        engine::PlanStageStepTiles(spec, StageOptimizer(), cut->part(static_cast<int>(s)),
                                   kStageBatch, spec.gpt.block_size, kStageMicroBatches);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    tc.plan = std::move(*plan);
    const StageCheckInput in{.task_id = ctx.task,
                             .round = ctx.round,
                             .replica = ctx.replica,
                             .stage = s,
                             .transport = &party,
                             .endpoint = nodes[s]->server->endpoint()};
    const Hash256 leaf = protocol::StageStepLeaf(out[s][0].commit);
    Result<std::vector<ledger::ServeStageEvidenceTx>> txs =
        BuildStageServeTxs(in, tc, "[task]", /*index=*/7, /*step=*/0, leaf);
    ASSERT_TRUE(txs.ok()) << txs.status().ToString();
    ASSERT_EQ(txs->size(), ledger::StageServePieceCount(tc.plan));
    protocol::RefereeTask task;
    task.whole_step = true;
    task.step = 1;
    task.defender_output = leaf;
    task.challenger_output = StageUnservedLeaf(leaf);
    std::vector<ledger::StageServePiece> pieces;
    for (const ledger::ServeStageEvidenceTx& tx : *txs) {
      EXPECT_EQ(tx.task_id, ctx.task);
      EXPECT_EQ(tx.index, 7u);
      EXPECT_EQ(tx.bundle.text, "[task]");
      Result<ledger::StageServePiece> piece = ledger::DecodeStageServePiece(tx.witness.bytes);
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      const Status taken = ledger::CheckStageServePiece(
          tc, task, ctx.task, ledger::StageSlot{ctx.round, ctx.replica, s}, 3, ctx.chain, tx.piece,
          *piece);
      EXPECT_TRUE(taken.ok()) << "piece " << tx.piece << ": " << taken.ToString();
      pieces.push_back(std::move(*piece));
    }
    // The verifier's side once every piece is on chain: put back together into a stage of the
    // same shapes (a fresh one), they give the step's start state and every tensor the stage
    // received, as its node holds them, which the verifier replays the step from.
    std::vector<std::unique_ptr<Stage>> fresh = StageStages(spec);
    Result<ledger::StageServedEvidence> ev =
        ledger::AssembleStageServeEvidence(tc, pieces, fresh[s]->state());
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    EXPECT_EQ(ev->commit, out[s][0].commit);
    EXPECT_EQ(engine::StateHash(fresh[s]->state()), out[s][0].commit.state_before);
    const std::map<Hash256, Bytes> held = nodes[s]->plane->received();
    EXPECT_EQ(ev->blobs.size(), out[s][0].commit.received.size());
    for (const protocol::StageTransfer& r : out[s][0].commit.received) {
      ASSERT_EQ(ev->blobs.count(r.tensor), 1u);
      ASSERT_EQ(held.count(r.tensor), 1u);
      EXPECT_TRUE(ev->blobs.at(r.tensor) == held.at(r.tensor)) << "a received tensor";
    }
    // On chain: piece 0 in block 3, a transfer in block 4, and in block 5 (read first: newest
    // first, a page of two transactions at a time) a piece 0 the ledger refused and another
    // unit's, each with other roots (taken, they would not assemble), then the other pieces.
    BlockTxsChain chain;
    chain.Add(3, (*txs)[0], true);
    chain.Add(4, ledger::TransferTx{.to = {}, .amount = 1, .memo = ""}, true);
    ledger::StageServePiece wrong = pieces[0];
    wrong.roots.seed += 1;
    ledger::ServeStageEvidenceTx refused = (*txs)[0];
    refused.witness = {ledger::EncodeStageServePiece(wrong)};
    ledger::ServeStageEvidenceTx other = refused;
    other.index = 8;
    chain.Add(5, refused, false);
    chain.Add(5, other, true);
    for (size_t p = 1; p < txs->size(); ++p) chain.Add(5, (*txs)[p], true);
    Result<std::vector<ledger::StageServePiece>> read =
        ReadServedStagePieces(chain, tc, ctx.task, 7, leaf, 2, 5);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    ASSERT_EQ(read->size(), pieces.size());
    for (size_t p = 0; p < pieces.size(); ++p) EXPECT_TRUE((*read)[p] == pieces[p]) << p;
    Result<std::vector<ledger::StageServePiece>> short_of_one =
        ReadServedStagePieces(chain, tc, ctx.task, 7, leaf, 5, 5);
    ASSERT_FALSE(short_of_one.ok());
    EXPECT_EQ(short_of_one.status().code(), StatusCode::kNotFound);
    EXPECT_NE(short_of_one.status().message().find("pieces 0 of the"), std::string::npos)
        << short_of_one.status().ToString();
    EXPECT_FALSE(ReadServedStagePieces(chain, tc, ctx.task, 7, Blake2b("another leaf"), 2, 5).ok())
        << "another step's pieces";
    std::vector<std::unique_ptr<Stage>> shapes = StageStages(spec);
    Result<OnChainStageStep> on_chain =
        AssembleOnChainStageStep(tc, *read, /*step=*/0, shapes[s]->state());
    ASSERT_TRUE(on_chain.ok()) << on_chain.status().ToString();
    EXPECT_EQ(on_chain->commit, out[s][0].commit);
    EXPECT_EQ(on_chain->blobs.size(), out[s][0].commit.received.size());
    Result<engine::TrainState> start = StageCheckpointState(on_chain->checkpoint);
    ASSERT_TRUE(start.ok()) << start.status().ToString();
    EXPECT_EQ(engine::StateHash(*start), out[s][0].commit.state_before);
    EXPECT_FALSE(AssembleOnChainStageStep(tc, *read, /*step=*/1, shapes[s]->state()).ok());
    // A commit other than the committed leaf's, or a step no longer served: no piece.
    EXPECT_EQ(BuildStageServeTxs(in, tc, "[task]", 7, 0, Blake2b("another leaf")).status().code(),
              StatusCode::kFailedPrecondition);
    nodes[s]->evidence.Withdraw({ctx.task, ctx.round, ctx.replica, s, 0});
    EXPECT_EQ(BuildStageServeTxs(in, tc, "[task]", 7, 0, leaf).status().code(),
              StatusCode::kFailedPrecondition);
  }
}

// A stage's evidence checkpoints are files (one a step, in the evidence's folder): served from
// there byte for byte as written, deleted when the step is withdrawn (one step, or the final
// rounds), and a missing or cut file is a clear error to the verifier, not a crash. A step is
// served only once its commit is published after its checkpoint; a step run again stays served
// as it was until the new run publishes it; and a process removes what an earlier process left in
// the folder when it starts (DeleteLeftovers).
TEST(StagePlaneTest, StageEvidenceServesCheckpointFilesAndDeletesThemWhenWithdrawn) {
  const ModelSpec spec = StageParseModel(kStageMlp);
  std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
  const StageContext ctx = StageCtx();
  std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
  std::vector<StageStepRef> refs;
  std::vector<std::string> want;  // each stage's checkpoint bytes of step 0's start
  for (int s = 0; s < 3; ++s) {
    refs.push_back({ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), 0});
    want.push_back(engine::CheckpointBytes(got[s]->state()));
    ASSERT_TRUE(nodes[s]->evidence.SaveCheckpoint(refs[s], got[s]->state()).ok());
  }
  std::vector<std::vector<StageStepOutcome>> out;
  std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, 1, &out);
  net::HttpTransport verifier;
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(st[s].ok()) << st[s].ToString();
    // Not served before its commit is.
    EXPECT_EQ(
        FetchStageStepEvidence(&verifier, nodes[s]->server->endpoint(), refs[s]).status().code(),
        StatusCode::kNotFound);
    EXPECT_EQ(nodes[s]->evidence.bytes(), 0u);
    ASSERT_TRUE(nodes[s]->evidence.Publish(out[s][0].commit, nodes[s]->plane->received()).ok());
    // The file holds the checkpoint, and the evidence counts it.
    Result<std::string> path = nodes[s]->evidence.CheckpointFile(refs[s]);
    ASSERT_TRUE(path.ok()) << path.status().ToString();
    Result<std::string> file = Env::Default()->ReadFile(*path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ(*file, want[s]);
    EXPECT_EQ(nodes[s]->evidence.checkpoint_file_bytes(), want[s].size());
    EXPECT_GT(nodes[s]->evidence.bytes(), want[s].size());
    Result<StageStepEvidence> ev =
        FetchStageStepEvidence(&verifier, nodes[s]->server->endpoint(), refs[s]);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    EXPECT_EQ(ev->checkpoint, ToBytes(want[s]));
    EXPECT_EQ(ev->commit, out[s][0].commit);
  }

  // A commit published without its checkpoint is refused.
  StageStepCommit later = out[0][0].commit;
  later.step = 5;
  Status no_checkpoint = nodes[0]->evidence.Publish(later, {});
  EXPECT_EQ(no_checkpoint.code(), StatusCode::kFailedPrecondition) << no_checkpoint.ToString();
  EXPECT_NE(no_checkpoint.message().find("no checkpoint"), std::string::npos)
      << no_checkpoint.ToString();

  // Stage 1's file cut short and stage 2's deleted behind the evidence's back: the verifier gets
  // an error naming the file.
  const std::string cut = *nodes[1]->evidence.CheckpointFile(refs[1]);
  ASSERT_TRUE(Env::Default()->WriteFileAtomic(cut, want[1].substr(0, want[1].size() / 2)).ok());
  Result<StageStepEvidence> short_file =
      FetchStageStepEvidence(&verifier, nodes[1]->server->endpoint(), refs[1]);
  EXPECT_EQ(short_file.status().code(), StatusCode::kDataLoss) << short_file.status().ToString();
  EXPECT_NE(short_file.status().message().find(cut), std::string::npos)
      << short_file.status().ToString();
  const std::string gone = *nodes[2]->evidence.CheckpointFile(refs[2]);
  ASSERT_TRUE(Env::Default()->DeleteFile(gone).ok());
  Result<StageStepEvidence> no_file =
      FetchStageStepEvidence(&verifier, nodes[2]->server->endpoint(), refs[2]);
  EXPECT_EQ(no_file.status().code(), StatusCode::kDataLoss) << no_file.status().ToString();
  EXPECT_NE(no_file.status().message().find(gone), std::string::npos)
      << no_file.status().ToString();

  // Withdrawn: no longer served, and the file is deleted.
  const std::string withdrawn = *nodes[0]->evidence.CheckpointFile(refs[0]);
  nodes[0]->evidence.Withdraw(refs[0]);
  EXPECT_FALSE(Env::Default()->FileExists(withdrawn));
  EXPECT_EQ(nodes[0]->evidence.CheckpointFile(refs[0]).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(nodes[0]->evidence.bytes(), 0u);
  EXPECT_EQ(
      FetchStageStepEvidence(&verifier, nodes[0]->server->endpoint(), refs[0]).status().code(),
      StatusCode::kNotFound);
  EXPECT_EQ(nodes[1]->evidence.WithdrawRoundsBefore(ctx.task, ctx.round), 0u);  // not final
  EXPECT_EQ(nodes[1]->evidence.WithdrawRoundsBefore(ctx.task, ctx.round + 1), 1u);
  EXPECT_FALSE(Env::Default()->FileExists(cut));
  EXPECT_EQ(nodes[1]->evidence.bytes(), 0u);

  // A restart: the new process deletes what the earlier one left in the same folder when it
  // starts (DeleteLeftovers, from the NodeAgent's constructor), before any step of its own.
  const std::string dir = std::filesystem::path(gone).parent_path().string();
  const std::string stale = JoinPath(dir, "left-by-an-earlier-process.safetensors");
  ASSERT_TRUE(Env::Default()->WriteFileAtomic(stale, "left by an earlier process").ok());
  StageEvidence restarted(Env::Default(), dir);
  ASSERT_TRUE(restarted.DeleteLeftovers().ok());
  EXPECT_FALSE(Env::Default()->FileExists(stale));
  EXPECT_TRUE(StageEvidence(Env::Default(), JoinPath(dir, "never-made")).DeleteLeftovers().ok());
  ASSERT_TRUE(restarted.SaveCheckpoint(refs[2], got[2]->state()).ok());
  Result<std::vector<std::string>> left = Env::Default()->ListDir(dir);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left,
            std::vector<std::string>{
                std::filesystem::path(*restarted.CheckpointFile(refs[2])).filename().string()});
  // Written again before a Publish (a run that failed): the earlier file is deleted.
  const std::string failed = *restarted.CheckpointFile(refs[2]);
  ASSERT_TRUE(restarted.SaveCheckpoint(refs[2], got[2]->state()).ok());
  EXPECT_NE(*restarted.CheckpointFile(refs[2]), failed);
  EXPECT_FALSE(Env::Default()->FileExists(failed));

  // A served step run again (its unit placed again): what was served stays served while the new
  // run's checkpoint is written and the step trains, and is replaced (its file deleted) when the
  // new run publishes the step.
  ASSERT_TRUE(nodes[0]->evidence.SaveCheckpoint(refs[0], got[0]->state()).ok());
  ASSERT_TRUE(nodes[0]->evidence.Publish(out[0][0].commit, {}).ok());
  const std::string served = *nodes[0]->evidence.CheckpointFile(refs[0]);
  const Bytes before = ToBytes(engine::CheckpointBytes(got[0]->state()));
  const Hash256 before_hash = engine::StateHash(got[0]->state());
  EXPECT_EQ(nodes[0]->evidence.PendingCheckpointState(refs[0]).status().code(),
            StatusCode::kNotFound);             // published: nothing saved since
  got[0]->params()[0].value.data()[0] += 1.0f;  // the new run's start differs
  const Bytes after = ToBytes(engine::CheckpointBytes(got[0]->state()));
  const Hash256 after_hash = engine::StateHash(got[0]->state());
  ASSERT_TRUE(nodes[0]->evidence.SaveCheckpoint(refs[0], got[0]->state()).ok());
  Result<StageStepEvidence> meanwhile =
      FetchStageStepEvidence(&verifier, nodes[0]->server->endpoint(), refs[0]);
  ASSERT_TRUE(meanwhile.ok()) << meanwhile.status().ToString();
  EXPECT_EQ(meanwhile->checkpoint, before);
  // Meanwhile (a run whose step failed there: the Stager's held run) the saved checkpoint loads
  // as the state it was written from, beside the served one.
  Result<engine::TrainState> pending = nodes[0]->evidence.PendingCheckpointState(refs[0]);
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_EQ(engine::StateHash(*pending), after_hash);
  Result<engine::TrainState> published = nodes[0]->evidence.PublishedCheckpointState(refs[0]);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_EQ(engine::StateHash(*published), before_hash);
  ASSERT_TRUE(nodes[0]->evidence.Publish(out[0][0].commit, {}).ok());
  EXPECT_EQ(nodes[0]->evidence.PendingCheckpointState(refs[0]).status().code(),
            StatusCode::kNotFound);
  Result<StageStepEvidence> republished =
      FetchStageStepEvidence(&verifier, nodes[0]->server->endpoint(), refs[0]);
  ASSERT_TRUE(republished.ok()) << republished.status().ToString();
  EXPECT_EQ(republished->checkpoint, after);
  EXPECT_FALSE(Env::Default()->FileExists(served));
  // Publishing again without a new checkpoint is refused (nothing to serve anew).
  EXPECT_EQ(nodes[0]->evidence.Publish(out[0][0].commit, {}).code(),
            StatusCode::kFailedPrecondition);
}

// The solver adversaries a stage node plays (SetStageAdversary's hooks), each on one stage of 3
// nodes that run a unit of 2 steps over HTTP with RunStageUnit and serve its evidence: every step
// of every stage is fetched and replayed. The cheating stage's cheated step is found (noisy: its
// state; wrong_data: its first output, on the first stage activations from another step's batch,
// on a later stage the activations of micro-batches 0 and 1 swapped) and every other step of
// every stage replays clean. wrong_result replays clean everywhere: its commit is honest, its
// result is not start - end (what no step replay can see, and StageResultBlobId of its final
// state, the verifier's and the ledger's derivation, shows).
TEST(StagePlaneTest, EveryStageAdversaryHookIsCaughtOnItsStepAloneOrIsInvisibleToTheReplay) {
  const ModelSpec spec = StageParseModel(kStageGpt);
  const StageContext ctx = StageCtx();
  const auto kAct = StageTensorKind::kStageTensorActivation;
  struct Mode {
    std::string name;
    int cheat;
    Adversary adversary;
    StageFault fault;      // of the cheated step (none: wrong_result)
    StageTensorKind kind;  // of the tensor at fault (output findings)
  };
  const std::vector<Mode> modes = {
      {"noisy", 1, Adversary::kNoisy, StageFault::kStageFaultState, kAct},
      {"wrong_data (first stage)", 0, Adversary::kWrongData, StageFault::kStageFaultOutput, kAct},
      {"wrong_data (middle stage)", 1, Adversary::kWrongData, StageFault::kStageFaultOutput, kAct},
      {"wrong_data (last stage)", 2, Adversary::kWrongData, StageFault::kStageFaultOutput,
       StageTensorKind::kStageTensorActivationGrad},
      {"wrong_result", 2, Adversary::kWrongResult, StageFault::kStageFaultNone, kAct},
  };
  constexpr int64_t kSteps = 2;
  std::vector<Batch> batches;
  for (int64_t step = 0; step < kSteps; ++step) batches.push_back(StageBatch(spec, step));
  UnitWork work;
  work.inner_steps = kSteps;
  work.stream = 12345;
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, {});
    std::vector<std::vector<float>> start;
    for (auto& st : stages) start.push_back(StageFlatParams(*st));
    // The round's start weights of the whole model (what a verifier and the ledger slice).
    const std::vector<float> global = GatherStageParams(stages);
    std::vector<Result<StageUnitOutcome>> out(3, Internal("not run"));
    std::vector<std::thread> threads;
    for (int s = 0; s < 3; ++s) {
      StageRunHooks hooks;
      StageEvidence* ev = &nodes[s]->evidence;
      hooks.checkpoint = [ev, &ctx, s](uint64_t step, engine::TrainState& state) {
        return ev->SaveCheckpoint(
            {ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), step}, state);
      };
      hooks.publish = [ev](const StageStepCommit& c, std::map<Hash256, Bytes> received) {
        return ev->Publish(c, std::move(received));
      };
      if (s == m.cheat) SetStageAdversary(m.adversary, work, &hooks);
      threads.emplace_back([&, s, hooks] {
        out[s] = RunStageUnit(*stages[s], *nodes[s]->plane, batches, kStageDropoutSeed, hooks);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(out[s].ok()) << out[s].status().ToString();

    const StageReplaySetup setup = StageSetup(spec, ctx.chain);
    net::HttpTransport verifier;
    // The cheated step: noisy perturbs after PoisonAfterSteps(2) = 1 step (step 0's commit
    // claims the perturbed state), wrong_data trains step PoisonAfterSteps(2) - 1 = 0 wrong.
    const uint64_t cheated = 0;
    for (int s = 0; s < 3; ++s) {
      for (uint64_t t = 0; t < static_cast<uint64_t>(kSteps); ++t) {
        Result<StageStepEvidence> ev =
            FetchStageStepEvidence(&verifier, nodes[s]->server->endpoint(),
                                   {ctx.task, ctx.round, ctx.replica, static_cast<uint32_t>(s), t});
        ASSERT_TRUE(ev.ok()) << ev.status().ToString();
        EXPECT_EQ(protocol::StageStepLeaf(ev->commit), out[s]->leaves[t]);
        Result<engine::TrainState> st = StageCheckpointState(ev->checkpoint);
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        Result<StageReplayResult> r = ReplayStageStep(setup, std::move(*st), ev->commit, ev->blobs,
                                                      batches[t], kStageDropoutSeed);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        if (s != m.cheat || t != cheated || m.fault == StageFault::kStageFaultNone) {
          EXPECT_TRUE(r->ok()) << "stage " << s << " step " << t << ": " << r->message;
          continue;
        }
        EXPECT_EQ(r->fault, m.fault) << r->message;
        EXPECT_EQ(r->stage, static_cast<uint32_t>(s));
        EXPECT_EQ(r->step, t);
        if (m.fault == StageFault::kStageFaultOutput) {
          EXPECT_EQ(r->key.kind, m.kind) << r->message;
          EXPECT_EQ(r->micro_batch, 0) << r->message;
        }
      }
      // Every stage's result is the delta of its own final state, but wrong_result's.
      const std::vector<float> honest =
          protocol::PseudoGradient(start[s], StageFlatParams(*stages[s]));
      EXPECT_EQ(out[s]->result_hash == ledger::DeltaBlobId(honest),
                !(s == m.cheat && m.adversary == Adversary::kWrongResult))
          << "stage " << s;
      // What a verifier and the ledger derive from the stage's final state and the whole start
      // (StageResultBlobId, by parameter name) is that honest delta's id.
      Result<Hash256> derived = ledger::StageResultBlobId(spec, global, stages[s]->state());
      ASSERT_TRUE(derived.ok()) << derived.status().ToString();
      EXPECT_EQ(*derived, ledger::DeltaBlobId(honest)) << "stage " << s;
      const std::vector<float> short_global(global.begin(), global.end() - 1);
      Result<Hash256> refused = ledger::StageResultBlobId(spec, short_global, stages[s]->state());
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(refused.status().message().find("the round's start state holds"), std::string::npos)
          << refused.status().ToString();
    }
  }
}

// A stage node killed in the middle of a step: its link fails once it has run micro-batch 0's
// forward pass, then its server goes down.
class StageDyingLink final : public StageLink {
 public:
  explicit StageDyingLink(StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    if (key.micro_batch == 1) return Unavailable("the node was killed");
    return inner_->Receive(key, record);
  }
  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    return inner_->Send(key, values);
  }

 private:
  StageLink* inner_;
};

TEST(StagePlaneTest, AStageNodeKilledMidStepIsReplacedAndTheReplicaEndsBitEqual) {
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
    for (int64_t step = 0; step < 4; ++step) {
      engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
    }
    std::vector<std::unique_ptr<Stage>> got = StageStages(spec);
    const StageContext ctx = StageCtx();
    StagePlaneOptions opt;
    opt.step_deadline_ms = 800;
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st = StageRunOverHttp(got, nodes, {0, 1, 2}, 0, 2, &out);
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(st[s].ok()) << st[s].ToString();
    // Every stage checkpoints the start of step 2.
    MemEnv env;
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(engine::SaveCheckpoint(&env, "s" + std::to_string(s), got[s]->state()).ok());
    }

    // Step 2: stage 2's node dies after its forward pass of micro-batch 0; the others fail the
    // step by its deadline, their weights untouched.
    Status died;
    std::thread dying([&] {
      nodes[2]->plane->BeginStep(2);
      died = nodes[2]->plane->KeepCheckpoint(2, got[2]->state());
      if (!died.ok()) return;
      StageDyingLink link(nodes[2]->plane->link());
      Result<StageStepOutcome> r =
          RunStageStep(*got[2], ctx, StageBatch(spec, 2), kStageDropoutSeed, link);
      died = r.status();
      nodes[2]->server->Stop();
    });
    st = StageRunOverHttp(got, nodes, {0, 1}, 2, 3, &out);
    dying.join();
    EXPECT_EQ(died.code(), StatusCode::kUnavailable) << died.ToString();
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(st[s].code(), StatusCode::kDeadlineExceeded) << st[s].ToString();
    }

    // The scheduler replaces stage 2's node by another (another key, another endpoint); every
    // stage of the replica resumes from its checkpoint of step 2's start, the new node from
    // stage 2's as its keeper (stage 1's node) holds it -- the dead node's own file is not read --
    // after checking it is the state the dead node signed; and the replica trains on, bit-equal
    // to the pipeline in one process. (The new node's plane starts at step 0: its peers' step-2
    // pushes that arrive before its BeginStep(2) are answered "not yet" and retried.)
    const std::map<uint32_t, KeptCheckpoint> kept = nodes[1]->plane->kept();
    ASSERT_EQ(kept.count(2u), 1u);
    const KeptCheckpoint& lost = kept.at(2);
    EXPECT_EQ(lost.claim.step, 2u);
    EXPECT_TRUE(protocol::VerifyStageStateClaim(lost.claim, ctx.chain[2]).ok());
    StageContext replaced = ctx;
    replaced.chain[2] = StageNodeKey(5).public_key();
    nodes[2] = StageStartNode(replaced, 2, StageNodeKey(5), opt);
    StageConnect(nodes, replaced.chain);
    Result<engine::PipelineCut> cut = engine::MakeCut(spec, StageBounds(spec));
    ASSERT_TRUE(cut.ok());
    Result<std::unique_ptr<Stage>> fresh =
        Stage::Create(spec, StageOptimizer(), *cut, 2, kStageMicroBatches);
    ASSERT_TRUE(fresh.ok());
    got[2] = std::move(*fresh);
    for (int s = 0; s < 2; ++s) {
      Result<engine::TrainState> saved = engine::LoadCheckpoint(&env, "s" + std::to_string(s));
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      ASSERT_TRUE(got[s]->Restore(std::move(*saved)).ok());
    }
    Result<engine::TrainState> from_keeper = ledger::StageCheckpointState(lost.checkpoint);
    ASSERT_TRUE(from_keeper.ok()) << from_keeper.status().ToString();
    EXPECT_EQ(engine::StateHash(*from_keeper), lost.claim.state);
    ASSERT_TRUE(got[2]->Restore(std::move(*from_keeper)).ok());
    EXPECT_EQ(engine::StateHash(got[2]->state()), lost.claim.state);
    st = StageRunOverHttp(got, nodes, {0, 1, 2}, 2, 4, &out);
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      EXPECT_EQ(engine::StateHash(got[s]->state()), engine::StateHash(want[s]->state()))
          << "stage " << s;
      // Its commits name the new node as stage 2's.
      for (const StageStepOutcome& o : out[s]) {
        EXPECT_TRUE(protocol::VerifyStageStepSignatures(o.commit, replaced.chain).ok());
      }
    }
  }
}

// What a kept stage's node holds for its steps (docs/protocol.md "The resume step"): every tensor
// it sent, by hash, beside what it received (StageServingLink's `served`).
class StageRecordingLink final : public StageLink {
 public:
  explicit StageRecordingLink(StageLink* inner) : inner_(inner) {}
  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    Result<std::vector<float>> v = inner_->Receive(key, record);
    if (v.ok()) received[key.step][record->tensor] = StageTensorBytes(*v);
    return v;
  }
  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    Result<StageTransfer> r = inner_->Send(key, values);
    if (r.ok()) sent[r->tensor] = StageTensorBytes(values);
    return r;
  }
  std::map<uint64_t, std::map<Hash256, Bytes>> received;  // by step
  std::map<Hash256, Bytes> sent;

 private:
  StageLink* inner_;
};

// A replica of 3 stages ran steps 0..k-1 on the first chain (StageCtx) and lost stage `lost`'s
// node in step k: what every stage holds then. The lost stage's node, its state and its commits
// are gone; `lost_state` is kept only for the test to compare the recomputed state with.
struct StageResumeRun {
  ModelSpec spec;
  std::vector<std::unique_ptr<Stage>> stages;  // at step k's start (the lost one: what it was)
  std::vector<std::vector<StageStepCommit>> commits;  // [stage][step]
  std::vector<std::vector<float>> losses;             // [stage][step]
  std::vector<std::unique_ptr<StageRecordingLink>> links;
  MemEnv env;  // "s<stage>.<step>": every stage's checkpoint of each step's start
};

void StageRunUntilLost(const char* toml, uint64_t k, StageResumeRun* run) {
  run->spec = StageParseModel(toml);
  run->stages = StageStages(run->spec);
  const StageContext ctx = StageCtx();
  MemoryStageNetwork net(ctx, StageKeys());
  std::vector<StageLink*> links;
  for (int s = 0; s < 3; ++s) {
    run->links.push_back(std::make_unique<StageRecordingLink>(net.link(s)));
    links.push_back(run->links.back().get());
  }
  run->commits.resize(3);
  run->losses.resize(3);
  for (uint64_t step = 0; step < k; ++step) {
    for (int s = 0; s < 3; ++s) {
      CHECK(engine::SaveCheckpoint(&run->env, "s" + std::to_string(s) + "." + std::to_string(step),
                                   run->stages[s]->state())
                .ok());
    }
    std::vector<StageStepOutcome> out =
        StageRunStep(run->stages, ctx, links, static_cast<int64_t>(step));
    for (int s = 0; s < 3; ++s) {
      run->commits[s].push_back(out[s].commit);
      run->losses[s].push_back(out[s].loss);
    }
  }
}

// What the kept stages give the new node: their commits and sent tensors.
std::map<uint32_t, KeptStageSteps> StageKeptSteps(const StageResumeRun& run, uint32_t lost) {
  std::map<uint32_t, KeptStageSteps> kept;
  for (uint32_t s = 0; s < 3; ++s) {
    if (s != lost) kept[s] = {.commits = run.commits[s], .sent = run.links[s]->sent};
  }
  return kept;
}

std::vector<Batch> StageBatches(const ModelSpec& spec, int64_t n) {
  std::vector<Batch> batches;
  for (int64_t step = 0; step < n; ++step) batches.push_back(StageBatch(spec, step));
  return batches;
}

std::unique_ptr<Stage> StageAtRoundStart(const ModelSpec& spec, int stage) {
  return std::move(StageStages(spec)[stage]);
}

TEST(StageResumeTest, ALostStageIsRecomputedFromItsNeighboursTensorsAndTheReplicaResumesAtItsStep) {
  constexpr uint64_t k = 2;
  for (const char* toml : {kStageMlp, kStageGpt}) {
    for (uint32_t lost = 0; lost < 3; ++lost) {
      StageResumeRun run;
      StageRunUntilLost(toml, k, &run);
      const ModelSpec& spec = run.spec;
      SCOPED_TRACE(spec.kind + " lost stage " + std::to_string(lost));
      std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
      for (int64_t step = 0; step < 4; ++step) {
        engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
      }
      const StageContext ctx = StageCtx();
      StageContext replaced = ctx;
      const KeyPair new_key = StageNodeKey(5);
      replaced.chain[lost] = new_key.public_key();

      // The new node rebuilds the lost stage from the round's start and re-runs its steps 0..k-1
      // from its neighbours' tensors, serving each step's evidence as a stage node does.
      std::unique_ptr<Stage> redo = StageAtRoundStart(spec, static_cast<int>(lost));
      MemEnv evidence;
      std::map<uint64_t, std::map<Hash256, Bytes>> redo_received;
      StageRunHooks hooks;
      hooks.checkpoint = [&](uint64_t step, engine::TrainState& state) {
        return engine::SaveCheckpoint(&evidence, "redo." + std::to_string(step), state);
      };
      hooks.publish = [&](const StageStepCommit& c, std::map<Hash256, Bytes> received) {
        redo_received[c.step] = std::move(received);
        return Status::Ok();
      };
      const std::vector<Batch> batches = StageBatches(spec, 4);
      Result<RecomputedStage> redone =
          RecomputeLostStage(*redo, replaced, lost, StageNodeKey(lost).public_key(), new_key,
                             batches, kStageDropoutSeed, k, StageKeptSteps(run, lost), hooks);
      ASSERT_TRUE(redone.ok()) << redone.status().ToString();
      ASSERT_EQ(redone->commits.size(), k);
      // Its losses too (the last stage's CommitStage counts them).
      EXPECT_EQ(redone->losses, run.losses[lost]);
      // The lost node's state at step k, bit for bit, with no checkpoint of it copied.
      EXPECT_EQ(engine::StateHash(redo->state()), engine::StateHash(run.stages[lost]->state()));
      // What the kept stages hold for it: the tensors they sent, beside those they received (and
      // hold for their verifiers anyway).
      uint64_t sent_bytes = 0, received_bytes = 0;
      for (uint32_t s = 0; s < 3; ++s) {
        if (s == lost) continue;
        for (const auto& [hash, t] : run.links[s]->sent) sent_bytes += t.size();
        for (const auto& [step, tensors] : run.links[s]->received) {
          for (const auto& [hash, t] : tensors) received_bytes += t.size();
        }
      }
      std::printf(
          "%s, stage %u lost at step %llu: the kept stages held %llu bytes they sent, "
          "beside %llu they received\n",
          spec.kind.c_str(), lost, static_cast<unsigned long long>(k),
          static_cast<unsigned long long>(sent_bytes),
          static_cast<unsigned long long>(received_bytes));

      // The kept stages swap the lost node's records for the new node's: then every step before k
      // verifies against the new chain, as the ledger checks a run (ReplicaChainOf); before the
      // swap, a neighbour's did not.
      std::vector<std::vector<StageStepCommit>> commits = run.commits;
      commits[lost] = redone->commits;
      for (uint32_t s = 0; s < 3; ++s) {
        if (s == lost) continue;
        const uint32_t neighbour = lost == 0 ? 1 : lost - 1;
        if (s == neighbour) {
          EXPECT_FALSE(protocol::VerifyStageStepSignatures(commits[s][k - 1], replaced.chain).ok());
        }
        ASSERT_TRUE(SwapLostStageRecords(commits[s], lost, redone->commits, replaced).ok());
        for (uint64_t j = 0; j < k; ++j) {
          EXPECT_EQ(commits[s][j].state_before, run.commits[s][j].state_before);
          EXPECT_EQ(commits[s][j].state_after, run.commits[s][j].state_after);
          EXPECT_EQ(commits[s][j].sent, run.commits[s][j].sent);
        }
      }
      for (uint32_t s = 0; s < 3; ++s) {
        for (uint64_t j = 0; j < k; ++j) {
          Status v = protocol::VerifyStageStepSignatures(commits[s][j], replaced.chain);
          EXPECT_TRUE(v.ok()) << "stage " << s << " step " << j << ": " << v.ToString();
        }
      }
      // A verifier's replay of a step before k, of the replaced stage and of a kept neighbour,
      // against the new chain, passes.
      const StageReplaySetup setup = StageSetup(spec, replaced.chain);
      {
        Result<engine::TrainState> start =
            engine::LoadCheckpoint(&evidence, "redo." + std::to_string(k - 1));
        ASSERT_TRUE(start.ok()) << start.status().ToString();
        Result<StageReplayResult> r =
            ReplayStageStep(setup, std::move(*start), commits[lost][k - 1], redo_received[k - 1],
                            StageBatch(spec, static_cast<int64_t>(k) - 1), kStageDropoutSeed);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_TRUE(r->ok()) << r->message;
      }
      for (uint32_t s = 0; s < 3; ++s) {
        if (s == lost) continue;
        Result<engine::TrainState> start =
            engine::LoadCheckpoint(&run.env, "s" + std::to_string(s) + "." + std::to_string(k - 1));
        ASSERT_TRUE(start.ok()) << start.status().ToString();
        Result<StageReplayResult> r = ReplayStageStep(
            setup, std::move(*start), commits[s][k - 1], run.links[s]->received[k - 1],
            StageBatch(spec, static_cast<int64_t>(k) - 1), kStageDropoutSeed);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_TRUE(r->ok()) << "stage " << s << ": " << r->message;
      }

      // Every stage runs steps k..3 on the new chain, over the HTTP data plane, each node
      // beginning at step k: the kept ones from where they are (they run no step before k
      // again), the new node from its recomputed state. Bit-equal to the pipeline in one
      // process, and every commit is the new chain's.
      run.stages[lost] = std::move(redo);
      for (uint32_t s = 0; s < 3; ++s) ASSERT_EQ(run.stages[s]->state().step, k);
      std::vector<std::unique_ptr<StageNode>> nodes;
      for (uint32_t s = 0; s < 3; ++s) {
        nodes.push_back(StageStartNode(replaced, static_cast<int>(s),
                                       s == lost ? new_key : StageNodeKey(static_cast<int>(s)),
                                       StagePlaneOptions{}));
      }
      StageConnect(nodes, replaced.chain);
      std::vector<std::vector<StageStepOutcome>> out;
      std::vector<Status> st =
          StageRunOverHttp(run.stages, nodes, {0, 1, 2}, static_cast<int64_t>(k), 4, &out);
      for (uint32_t s = 0; s < 3; ++s) {
        ASSERT_TRUE(st[s].ok()) << st[s].ToString();
        ASSERT_EQ(out[s].size(), 4 - k);
        for (const StageStepOutcome& o : out[s]) {
          EXPECT_TRUE(protocol::VerifyStageStepSignatures(o.commit, replaced.chain).ok());
        }
      }
      for (uint32_t s = 0; s < 3; ++s) {
        EXPECT_EQ(engine::StateHash(run.stages[s]->state()), engine::StateHash(want[s]->state()))
            << "stage " << s;
      }
    }
  }
}

// The same over HTTP, with what stage nodes serve: the kept stages' planes keep what they send
// (keep_sent) and their evidence serves it; the new node fetches it (FetchKeptStageSteps),
// re-runs the lost stage and serves its steps; each kept node fetches the new node's commits,
// swaps the records and serves its swapped commits (StageEvidence::ServeCommit); a verifier that
// fetches a step before k of any stage replays it against the new chain; and the replica trains
// on from step k over the same kept planes, bit-equal.
TEST(StageResumeTest, OverHttpTheNewNodeFetchesTheKeptStagesTensorsAndTheyServeTheSwappedSteps) {
  constexpr uint64_t k = 2;
  constexpr uint32_t lost = 1;
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
    for (int64_t step = 0; step < 4; ++step) {
      engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
    }
    const StageContext ctx = StageCtx();
    StagePlaneOptions opt;
    opt.keep_sent = true;
    opt.checkpoint_every = 0;
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
    std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
    const std::vector<Batch> batches = StageBatches(spec, 4);
    auto hooks_of = [&](StageEvidence* evidence, uint32_t s) {
      StageRunHooks hooks;
      hooks.checkpoint = [evidence, &ctx, s](uint64_t step, engine::TrainState& state) {
        return evidence->SaveCheckpoint({ctx.task, ctx.round, ctx.replica, s, step}, state);
      };
      hooks.publish = [evidence](const StageStepCommit& c, std::map<Hash256, Bytes> tensors) {
        return evidence->Publish(c, std::move(tensors));
      };
      return hooks;
    };
    // Steps 0..k-1, each stage node as a Stager runs it; then stage 1's node is gone.
    std::vector<Result<StageUnitOutcome>> first(3, Internal("not run"));
    {
      std::vector<std::thread> threads;
      for (uint32_t s = 0; s < 3; ++s) {
        threads.emplace_back([&, s] {
          first[s] =
              RunStageUnit(*stages[s], *nodes[s]->plane, std::span<const Batch>(batches).first(k),
                           kStageDropoutSeed, hooks_of(&nodes[s]->evidence, s));
        });
      }
      for (std::thread& t : threads) t.join();
    }
    for (uint32_t s = 0; s < 3; ++s) ASSERT_TRUE(first[s].ok()) << first[s].status().ToString();
    nodes[lost]->server->Stop();

    StageContext replaced = ctx;
    const KeyPair new_key = StageNodeKey(5);
    replaced.chain[lost] = new_key.public_key();
    std::unique_ptr<StageNode> fresh =
        StageStartNode(replaced, static_cast<int>(lost), new_key, opt);
    const std::string fresh_at = fresh->server->endpoint();
    std::map<uint32_t, KeptStageSteps> kept;
    for (uint32_t s : {0u, 2u}) {
      Result<KeptStageSteps> got = FetchKeptStageSteps(
          fresh->transport.get(), nodes[s]->server->endpoint(), replaced, s, lost, k);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      kept[s] = std::move(*got);
    }
    // A node that serves no such step: the resume cannot be made.
    Result<KeptStageSteps> none =
        FetchKeptStageSteps(fresh->transport.get(), fresh_at, replaced, 0, lost, k);
    EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition) << none.status().ToString();
    // What a kept node declares is bounded before its bytes are fetched: a tensor over the data
    // plane's bound, or the k steps' tensors over the budget.
    for (const auto& [tensor_bound, total_bound] :
         {std::pair<uint64_t, uint64_t>{4, UINT64_MAX}, {UINT64_MAX, 64}}) {
      Result<KeptStageSteps> over =
          FetchKeptStageSteps(fresh->transport.get(), nodes[0]->server->endpoint(), replaced, 0,
                              lost, k, tensor_bound, total_bound);
      EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
    }
    std::unique_ptr<Stage> redo = StageAtRoundStart(spec, static_cast<int>(lost));
    Result<RecomputedStage> redone =
        RecomputeLostStage(*redo, replaced, lost, StageNodeKey(lost).public_key(), new_key, batches,
                           kStageDropoutSeed, k, kept, hooks_of(&fresh->evidence, lost));
    ASSERT_TRUE(redone.ok()) << redone.status().ToString();
    EXPECT_EQ(engine::StateHash(redo->state()), engine::StateHash(stages[lost]->state()));

    // Each kept node fetches the new node's commits of steps 0..k-1, swaps, and serves the
    // swapped ones.
    for (uint32_t s : {0u, 2u}) {
      std::vector<StageStepCommit> theirs;
      for (uint64_t j = 0; j < k; ++j) {
        Result<StageStepEvidence> ev = FetchStageStepRecords(
            nodes[s]->transport.get(), fresh_at, {ctx.task, ctx.round, ctx.replica, lost, j});
        ASSERT_TRUE(ev.ok()) << ev.status().ToString();
        theirs.push_back(ev->commit);
      }
      std::vector<StageStepCommit> mine = first[s]->commits;
      ASSERT_TRUE(SwapLostStageRecords(mine, lost, theirs, replaced).ok());
      for (const StageStepCommit& c : mine) {
        ASSERT_TRUE(nodes[s]->evidence.ServeCommit(c).ok());
      }
    }
    nodes[lost] = std::move(fresh);
    // A verifier of any stage's step k-1, against the new chain.
    net::HttpTransport verifier;
    for (uint32_t s = 0; s < 3; ++s) {
      Result<StageStepEvidence> ev = FetchStageStepEvidence(
          &verifier, nodes[s]->server->endpoint(), {ctx.task, ctx.round, ctx.replica, s, k - 1});
      ASSERT_TRUE(ev.ok()) << ev.status().ToString();
      Result<engine::TrainState> start = StageCheckpointState(ev->checkpoint);
      ASSERT_TRUE(start.ok()) << start.status().ToString();
      Result<StageReplayResult> r =
          ReplayStageStep(StageSetup(spec, replaced.chain), std::move(*start), ev->commit,
                          ev->blobs, batches[k - 1], kStageDropoutSeed);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->ok()) << "stage " << s << ": " << r->message;
    }

    // Steps k..3 on the new chain, the kept nodes on their planes of steps 0..k-1.
    stages[lost] = std::move(redo);
    StageConnect(nodes, replaced.chain);
    std::vector<std::vector<StageStepOutcome>> out;
    std::vector<Status> st =
        StageRunOverHttp(stages, nodes, {0, 1, 2}, static_cast<int64_t>(k), 4, &out);
    for (uint32_t s = 0; s < 3; ++s) {
      ASSERT_TRUE(st[s].ok()) << st[s].ToString();
      EXPECT_EQ(engine::StateHash(stages[s]->state()), engine::StateHash(want[s]->state()))
          << "stage " << s;
    }
  }
}

// A stage run's evidence keeps every tensor it received and sent in a file of the evidence's
// folder, named by its hash, not in memory: after each step's Publish the plane holds none of the
// step's tensors (moved out, not copied) and the evidence's memory holds the step commits alone,
// whatever the steps; a fetch is served from the files, bit for bit; a file cut short or gone is
// an error naming it; the sent tensors' files go when the run ended whole (DropSent), the rest
// when the steps are withdrawn.
TEST(StageEvidenceFilesTest, AStageRunKeepsItsTensorsInFilesAndItsMemoryHoldsTheCommitsAlone) {
  constexpr uint64_t kSteps = 3;
  for (const char* toml : {kStageMlp, kStageGpt}) {
    const ModelSpec spec = StageParseModel(toml);
    SCOPED_TRACE(spec.kind);
    const StageContext ctx = StageCtx();
    StagePlaneOptions opt;
    opt.keep_sent = true;
    opt.checkpoint_every = 0;
    std::vector<std::unique_ptr<StageNode>> nodes = StageNodes(ctx, opt);
    std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
    const std::vector<Batch> batches = StageBatches(spec, static_cast<int>(kSteps));
    // What the plane still held after each step's Publish (the old store copied the step's
    // tensors out of the plane and kept them in memory).
    std::vector<uint64_t> plane_left(3, 0);
    std::vector<Result<StageUnitOutcome>> out(3, Internal("not run"));
    {
      std::vector<std::thread> threads;
      for (uint32_t s = 0; s < 3; ++s) {
        threads.emplace_back([&, s] {
          StageEvidence* evidence = &nodes[s]->evidence;
          StagePlane* plane = nodes[s]->plane.get();
          StageRunHooks hooks;
          hooks.checkpoint = [evidence, &ctx, s](uint64_t step, engine::TrainState& state) {
            return evidence->SaveCheckpoint({ctx.task, ctx.round, ctx.replica, s, step}, state);
          };
          hooks.publish = [&, evidence, plane, s](const StageStepCommit& c,
                                                  std::map<Hash256, Bytes> tensors) {
            Status published = evidence->Publish(c, std::move(tensors));
            for (const auto& m : {plane->received(), plane->sent()}) {
              for (const auto& [hash, b] : m) plane_left[s] += b.size();
            }
            return published;
          };
          out[s] = RunStageUnit(*stages[s], *nodes[s]->plane, batches, kStageDropoutSeed, hooks);
        });
      }
      for (std::thread& t : threads) t.join();
    }
    net::HttpTransport verifier;
    for (uint32_t s = 0; s < 3; ++s) {
      ASSERT_TRUE(out[s].ok()) << out[s].status().ToString();
      StageEvidence& ev = nodes[s]->evidence;
      EXPECT_EQ(plane_left[s], 0u) << "stage " << s;
      uint64_t commits = 0;
      std::map<Hash256, uint64_t> tensors;  // every tensor of its records, received and sent
      for (const StageStepCommit& c : out[s]->commits) {
        commits += protocol::EncodeStageStepCommit(c).size();
        for (const auto* list : {&c.received, &c.sent}) {
          for (const StageTransfer& r : *list) tensors[r.tensor] = r.bytes;
        }
      }
      ASSERT_FALSE(tensors.empty());
      uint64_t tensor_bytes = 0;
      for (const auto& [hash, bytes] : tensors) {
        tensor_bytes += bytes;
        Result<std::string> path = ev.TensorFile(hash);
        ASSERT_TRUE(path.ok()) << path.status().ToString();
        Result<std::string> file = Env::Default()->ReadFile(*path);
        ASSERT_TRUE(file.ok()) << file.status().ToString();
        ASSERT_EQ(file->size(), bytes) << *path;
        EXPECT_EQ(engine::TensorHash(StageTensorFromBytes(ToBytes(*file))), hash) << *path;
      }
      EXPECT_EQ(ev.tensor_file_bytes(), tensor_bytes) << "stage " << s;
      EXPECT_EQ(ev.memory_bytes(), commits) << "stage " << s;
      EXPECT_EQ(ev.bytes(), commits + ev.checkpoint_file_bytes() + tensor_bytes);
      // The files stay within the disk the ledger places the stage by (protocol::StageDiskBytes
      // of its memory need: StageTermsOf's formula, the engine's CutCosts total and one step's
      // tensors, the most of any step).
      Result<std::vector<engine::StageCost>> costs =
          engine::CutCosts(spec, StageOptimizer(), StageSetup(spec, ctx.chain).cut, kStageBatch,
                           spec.kind == "gpt" ? spec.gpt.block_size : 0, kStageMicroBatches);
      ASSERT_TRUE(costs.ok()) << costs.status().ToString();
      uint64_t step_tensors = 0;
      for (const StageStepCommit& c : out[s]->commits) {
        uint64_t step = 0;
        for (const auto* list : {&c.received, &c.sent}) {
          for (const StageTransfer& r : *list) step += r.bytes;
        }
        step_tensors = std::max(step_tensors, step);
      }
      const uint64_t need =
          static_cast<uint64_t>(std::ceil((*costs)[s].total_bytes())) + step_tensors;
      EXPECT_LE(ev.checkpoint_file_bytes() + ev.tensor_file_bytes(),
                protocol::StageDiskBytes(need, kSteps))
          << "stage " << s << ": checkpoints " << ev.checkpoint_file_bytes() << ", tensors "
          << ev.tensor_file_bytes() << ", need " << need;
      // Served from the files: every step's received tensors (what a verifier replays from) and
      // the tensors sent to each neighbour (what a resume re-runs it from), bit for bit.
      for (const StageStepCommit& c : out[s]->commits) {
        const StageStepRef ref = StageStepRefOf(c);
        Result<StageStepEvidence> got =
            FetchStageStepRecords(&verifier, nodes[s]->server->endpoint(), ref);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(got->blobs.size(), c.received.size());
        for (const StageTransfer& r : c.received) {
          ASSERT_EQ(got->blobs.count(r.tensor), 1u) << r.key.ToString();
          EXPECT_EQ(engine::TensorHash(StageTensorFromBytes(got->blobs.at(r.tensor))), r.tensor);
        }
        for (uint32_t to : {s - 1, s + 1}) {
          if (to >= 3) continue;
          Result<StageStepEvidence> sent =
              FetchStageStepSent(&verifier, nodes[s]->server->endpoint(), ref, to);
          ASSERT_TRUE(sent.ok()) << sent.status().ToString();
          size_t want = 0;
          for (const StageTransfer& r : c.sent) {
            if (r.key.to_stage != to) continue;
            ++want;
            ASSERT_EQ(sent->blobs.count(r.tensor), 1u) << r.key.ToString();
            EXPECT_EQ(sent->blobs.at(r.tensor),
                      ToBytes(*Env::Default()->ReadFile(*ev.TensorFile(r.tensor))));
          }
          EXPECT_GT(want, 0u);
          EXPECT_EQ(sent->blobs.size(), want);
        }
      }
    }

    // Stage 1's file of a tensor it received at step 0 cut short, and one of step 1's deleted
    // behind the evidence's back: the fetch is an error naming the file.
    const StageStepCommit& c0 = out[1]->commits[0];
    const std::string cut = *nodes[1]->evidence.TensorFile(c0.received[0].tensor);
    ASSERT_TRUE(Env::Default()->WriteFileAtomic(cut, "cut").ok());
    Result<StageStepEvidence> short_file =
        FetchStageStepRecords(&verifier, nodes[1]->server->endpoint(), StageStepRefOf(c0));
    EXPECT_EQ(short_file.status().code(), StatusCode::kDataLoss) << short_file.status().ToString();
    EXPECT_NE(short_file.status().message().find(cut), std::string::npos)
        << short_file.status().ToString();
    const StageStepCommit& c1 = out[1]->commits[1];
    const std::string gone = *nodes[1]->evidence.TensorFile(c1.received[0].tensor);
    ASSERT_TRUE(Env::Default()->DeleteFile(gone).ok());
    Result<StageStepEvidence> no_file =
        FetchStageStepRecords(&verifier, nodes[1]->server->endpoint(), StageStepRefOf(c1));
    EXPECT_EQ(no_file.status().code(), StatusCode::kDataLoss) << no_file.status().ToString();
    EXPECT_NE(no_file.status().message().find(gone), std::string::npos)
        << no_file.status().ToString();

    // The run ended whole: its sent tensors' files go, its received ones stay served.
    StageEvidence& ev0 = nodes[0]->evidence;
    const StageStepRef unit{ctx.task, ctx.round, ctx.replica, 0, 0};
    std::vector<std::string> sent_files, received_files;
    for (const StageStepCommit& c : out[0]->commits) {
      for (const StageTransfer& r : c.sent) sent_files.push_back(*ev0.TensorFile(r.tensor));
      for (const StageTransfer& r : c.received) received_files.push_back(*ev0.TensorFile(r.tensor));
    }
    const uint64_t before = ev0.tensor_file_bytes();
    const uint64_t dropped = ev0.DropSent(unit);
    EXPECT_GT(dropped, 0u);
    EXPECT_EQ(ev0.tensor_file_bytes(), before - dropped);
    for (const std::string& f : sent_files) EXPECT_FALSE(Env::Default()->FileExists(f)) << f;
    for (const std::string& f : received_files) EXPECT_TRUE(Env::Default()->FileExists(f)) << f;
    // Withdrawn (the round is final): no file of the evidence is left.
    const std::string dir = std::filesystem::path(received_files.at(0)).parent_path().string();
    EXPECT_EQ(ev0.WithdrawRoundsBefore(ctx.task, ctx.round + 1), kSteps);
    EXPECT_EQ(ev0.tensor_file_bytes(), 0u);
    EXPECT_EQ(ev0.bytes(), 0u);
    Result<std::vector<std::string>> left = Env::Default()->ListDir(dir);
    ASSERT_TRUE(left.ok()) << left.status().ToString();
    EXPECT_TRUE(left->empty()) << left->front();
  }
}

// A tensor file whose write fails (here the process's file size limit, RLIMIT_FSIZE, as a full
// disk would: the write stops part way) fails the step's Publish with an error naming the file,
// serves nothing of the step, and leaves no part of the file. In a child process, so that the
// limit binds nothing else.
TEST(StageEvidenceFilesTest, ATensorFileThatCannotBeWrittenFailsThePublishNamingItAndLeavesNoFile) {
  const std::string dir = JoinPath(TestDir("stage-full-disk"), "stages");
  const ModelSpec spec = StageParseModel(kStageMlp);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
  const StageContext ctx = StageCtx();
  const StageStepRef ref{ctx.task, ctx.round, ctx.replica, 1, 0};
  StageStepCommit commit;
  commit.task = ref.task;
  commit.round = ref.round;
  commit.replica = ref.replica;
  commit.stage = ref.stage;
  commit.stages = 3;
  commit.step = ref.step;
  const Bytes tensor(64 << 10, 7);  // 64 KiB, over the limit below (1 KiB)
  const Hash256 hash = Blake2b("a received tensor");
  fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 as expected; each other a failed expectation, named below.
    StageEvidence evidence(Env::Default(), dir);
    if (!evidence.SaveCheckpoint(ref, stages[1]->state()).ok()) _exit(2);
    signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing
    const struct rlimit limit = {1 << 10, 1 << 10};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(3);
    Status published = evidence.Publish(commit, {{hash, tensor}});
    const std::string file = JoinPath(dir, "tensor-" + hash.ToHex() + ".f32");
    if (published.ok()) _exit(4);
    if (published.message().find(file) == std::string::npos) {
      fprintf(stderr, "the error does not name %s: %s\n", file.c_str(),
              published.ToString().c_str());
      _exit(5);
    }
    if (Env::Default()->FileExists(file)) _exit(6);  // a part of it left
    if (evidence.TensorFile(hash).ok()) _exit(7);    // served
    if (evidence.tensor_file_bytes() != 0) _exit(8);
    if (evidence.PublishedCheckpointState(ref).status().code() != StatusCode::kNotFound) {
      _exit(9);  // the step is served
    }
    // A checkpoint that cannot be written fails the same way: named, and no part of it left
    // (the folder holds step 0's checkpoint alone).
    Status saved =
        evidence.SaveCheckpoint({ref.task, ref.round, ref.replica, 1, 1}, stages[1]->state());
    if (saved.ok() || saved.message().find(dir) == std::string::npos) _exit(10);
    Result<std::vector<std::string>> left = Env::Default()->ListDir(dir);
    if (!left.ok() || left->size() != 1) _exit(11);
    fprintf(stderr, "as expected: %s\n%s\n", published.ToString().c_str(),
            saved.ToString().c_str());
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: no checkpoint, 3: no setrlimit, 4: Publish succeeded, 5: the error does not name "
         "the file, 6: a part of the file is left, 7: the tensor is served, 8: tensor bytes "
         "counted, 9: the step is served, 10: a checkpoint write did not fail naming its file, "
         "11: a part of the checkpoint is left";
}

// When the resume at k cannot be made -- a kept stage's node no longer holds a tensor the lost
// stage needs, a recomputed tensor differs from what the lost node signed, or a swap is offered a
// record that is not the new node's or not the same tensor -- it fails naming the tensor, and the
// replica re-runs from the round's start on the new chain, bit-equal too.
TEST(StageResumeTest, AResumeThatCannotBeMadeFailsAndTheReplicaRerunsFromTheRoundsStart) {
  constexpr uint64_t k = 2;
  constexpr uint32_t lost = 1;
  for (const char* toml : {kStageMlp, kStageGpt}) {
    StageResumeRun run;
    StageRunUntilLost(toml, k, &run);
    const ModelSpec& spec = run.spec;
    SCOPED_TRACE(spec.kind);
    StageContext replaced = StageCtx();
    const KeyPair new_key = StageNodeKey(5);
    replaced.chain[lost] = new_key.public_key();
    const std::vector<Batch> batches = StageBatches(spec, 4);
    // With `earlier`, the ledger's earlier node of the lost stage: by default the one that ran it
    // with the kept stages.
    auto recompute_by = [&](const std::map<uint32_t, KeptStageSteps>& kept,
                            const protocol::NodeId& earlier) {
      std::unique_ptr<Stage> redo = StageAtRoundStart(spec, static_cast<int>(lost));
      return RecomputeLostStage(*redo, replaced, lost, earlier, new_key, batches, kStageDropoutSeed,
                                k, kept);
    };
    auto recompute = [&](const std::map<uint32_t, KeptStageSteps>& kept) {
      return recompute_by(kept, StageNodeKey(lost).public_key());
    };
    // Stage 0's node dropped the activation it sent in step 1.
    {
      std::map<uint32_t, KeptStageSteps> kept = StageKeptSteps(run, lost);
      const StageTransfer* act = nullptr;
      for (const StageTransfer& r : kept[0].commits[1].sent) {
        if (r.key.to_stage == lost) act = &r;
      }
      ASSERT_NE(act, nullptr);
      kept[0].sent.erase(act->tensor);
      Result<RecomputedStage> r = recompute(kept);
      EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
      EXPECT_NE(r.status().message().find("no longer holds"), std::string::npos);
    }
    // The lost node had sent stage 2 another tensor in step 1 than its inputs give (it signed
    // it): the recomputed one differs.
    {
      std::map<uint32_t, KeptStageSteps> kept = StageKeptSteps(run, lost);
      for (StageTransfer& r : kept[2].commits[1].received) {
        if (r.key.from_stage == lost) {
          r = SignStageTensor(r.key, CorruptedStageTensor(std::vector<float>(r.bytes / 4, 0.5f)),
                              StageNodeKey(lost), replaced.TileColsOf(r.bytes / 4));
        }
      }
      Result<RecomputedStage> r = recompute(kept);
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
      EXPECT_NE(r.status().message().find("the lost node sent"), std::string::npos);
    }
    // A kept stage's record of the lost node signed by another node than its other records.
    {
      std::map<uint32_t, KeptStageSteps> kept = StageKeptSteps(run, lost);
      for (StageTransfer& r : kept[2].commits[1].received) {
        if (r.key.from_stage == lost) {
          r = SignStageTensor(r.key, std::vector<float>(r.bytes / 4, 0.5f), StageNodeKey(7),
                              replaced.TileColsOf(r.bytes / 4));
        }
      }
      Result<RecomputedStage> r = recompute(kept);
      EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
    }
    // Every record of the lost stage signed, over the very tensors it sent, by one node that is
    // not the one the ledger shows held the stage before (kept stages that name their own lost
    // node): refused, naming it; and a ledger that shows no earlier node gives no resume.
    {
      std::map<uint32_t, KeptStageSteps> kept = StageKeptSteps(run, lost);
      const KeyPair other = StageNodeKey(7);
      for (auto& [s, steps] : kept) {
        for (StageStepCommit& c : steps.commits) {
          for (StageTransfer& r : c.received) {
            if (r.key.from_stage != lost) continue;
            const Bytes& bytes = run.links[lost]->sent.at(r.tensor);
            r = SignStageTensor(r.key, StageTensorFromBytes(bytes), other,
                                replaced.TileColsOf(r.bytes / 4));
          }
        }
      }
      Result<RecomputedStage> r = recompute_by(kept, other.public_key());
      ASSERT_TRUE(r.ok()) << "the same tensors signed by the ledger's earlier node resume: "
                          << r.status().ToString();
      r = recompute(kept);
      EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
      EXPECT_NE(r.status().message().find("the ledger's earlier node of stage"), std::string::npos)
          << r.status().ToString();
      r = recompute_by(StageKeptSteps(run, lost), protocol::NodeId{});
      EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
    }
    // A swap offered records another key signed, or of another tensor, leaves the commits as
    // they were.
    {
      Result<RecomputedStage> redone = recompute(StageKeptSteps(run, lost));
      ASSERT_TRUE(redone.ok()) << redone.status().ToString();
      std::vector<StageStepCommit> forged = redone->commits;
      for (StageTransfer& r : forged[0].sent) {
        r = SignStageTensor(r.key, std::vector<float>(r.bytes / 4, 0.0f), new_key,
                            replaced.TileColsOf(r.bytes / 4));
      }
      std::vector<StageStepCommit> mine = run.commits[2];
      Status swapped = SwapLostStageRecords(mine, lost, forged, replaced);
      EXPECT_EQ(swapped.code(), StatusCode::kDataLoss) << swapped.ToString();
      EXPECT_EQ(mine, run.commits[2]);
      StageContext other = replaced;
      other.chain[lost] = StageNodeKey(6).public_key();
      swapped = SwapLostStageRecords(mine, lost, redone->commits, other);
      EXPECT_EQ(swapped.code(), StatusCode::kPermissionDenied) << swapped.ToString();
      EXPECT_EQ(mine, run.commits[2]);
    }
    // The fallback: every stage from the round's start on the new chain, bit-equal.
    std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
    std::vector<std::unique_ptr<Stage>> again = StageStages(spec);
    std::vector<KeyPair> keys = StageKeys();
    keys[lost] = new_key;
    MemoryStageNetwork net(replaced, keys);
    std::vector<StageLink*> links{net.link(0), net.link(1), net.link(2)};
    for (int64_t step = 0; step < 4; ++step) {
      engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
      StageRunStep(again, replaced, links, step);
    }
    for (uint32_t s = 0; s < 3; ++s) {
      EXPECT_EQ(engine::StateHash(again[s]->state()), engine::StateHash(want[s]->state()));
    }
  }
}

// The resume point every stage node derives from the others' offers (StageResumePointOf): one
// stage holding nothing and every other some, k the fewest; anything else is the round's start.
TEST(StageResumeTest, TheResumePointIsOneFreshStageBesideStagesThatHoldStepsAtTheFewest) {
  auto point = [](std::vector<uint64_t> held) { return StageResumePointOf(held); };
  EXPECT_EQ(point({2, 0, 2}).k, 2u);
  EXPECT_EQ(point({2, 0, 2}).lost, 1u);
  EXPECT_EQ(point({0, 1, 1, 1}).lost, 0u);
  EXPECT_EQ(point({0, 1, 1, 1}).k, 1u);
  EXPECT_EQ(point({3, 3, 0}).lost, 2u);
  EXPECT_EQ(point({0, 0, 0}).k, 0u);  // a run from the round's start
  // Kept stages one step apart (the lost node sent one all of its step's tensors): the common
  // step, to which the one ahead rolls back.
  EXPECT_EQ(point({2, 0, 1}).k, 1u);
  EXPECT_EQ(point({2, 0, 1}).lost, 1u);
  EXPECT_EQ(point({2, 1, 0}).k, 1u);
  EXPECT_EQ(point({2, 1, 0}).lost, 2u);
  EXPECT_EQ(point({2, 0, 0}).k, 0u);  // two fresh stages
  EXPECT_EQ(point({2, 2, 2}).k, 0u);  // no fresh stage
  EXPECT_EQ(point({0}).k, 0u);
}

// A replica's three stage nodes over loopback HTTP lose stage 1's node in step k: the kept nodes'
// runs fail there holding steps 0..k-1 (RunStageUnit's progress). On the new chain every node
// offers what it holds and StartStageRun agrees on k with no coordinator: the new node fetches the
// kept stages' tensors and re-runs stage 1's steps 0..k-1, the kept nodes read its decision, swap
// its records into their commits and serve them; then every node trains steps k..3 only, and the
// replica ends bit-equal to RunPipelineStep, every record of stage 1 in the kept commits signed by
// the new node, and a verifier's replay of the replaced stage's steps before k passes against the
// new chain. With `unserved`, the new node cannot fetch a kept stage's step (no longer served),
// with `wrong_earlier` the ledger shows it another node than the one whose records the kept
// stages hold (StageNodeKey(7)): it decides 0, each kept node reads that and fails its run, and
// the replica re-runs from the round's start, bit-equal. With `ahead`, the lost node is the last
// stage's, lost in step k between its two sends of the gradient total: stage 0 took its total and
// finished step k, stage 1 did not, so the kept nodes hold k + 1 and k steps; they resume at k,
// stage 0 rolled back to step k's start from its own checkpoint of it (its step k trained again on
// the new chain).
void StageNodesLoseAStageAtK(bool unserved, bool ahead = false, bool wrong_earlier = false) {
  const bool fails = unserved || wrong_earlier;
  constexpr uint64_t k = 2;
  const uint32_t lost = ahead ? 2 : 1;
  const uint32_t other = ahead ? 0 : 2;  // a kept stage a verifier replays beside the lost one
  const ModelSpec spec = StageParseModel(kStageMlp);
  std::vector<std::unique_ptr<Stage>> want = StageStages(spec);
  for (int64_t step = 0; step < 4; ++step) {
    engine::RunPipelineStep(want, StageBatch(spec, step), kStageDropoutSeed);
  }
  const StageContext ctx = StageCtx();
  StagePlaneOptions opt;
  opt.keep_sent = true;
  opt.checkpoint_every = 0;
  opt.step_deadline_ms = 2'000;
  std::vector<std::unique_ptr<StageNode>> nodes;
  // With `ahead`: the last stage's node is lost (its plane stopped) as it sends step k's total to
  // stage 1, after it sent it to stage 0.
  StagePlaneOptions first_opt = opt;
  if (ahead) {
    first_opt.corrupt_sent = [&nodes, lost](const StageTensorKey& key) {
      if (key.kind == StageTensorKind::kStageTensorGradTotal && key.from_stage == lost &&
          key.to_stage == 1 && key.step == k) {
        nodes[lost]->plane->Cancel();
      }
      return false;
    };
  }
  nodes = StageNodes(ctx, first_opt);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
  const std::vector<Batch> batches = StageBatches(spec, 4);
  auto hooks_of = [](StageEvidence* evidence, const StageContext& c, uint32_t s) {
    StageRunHooks hooks;
    hooks.checkpoint = [evidence, c, s](uint64_t step, engine::TrainState& state) {
      return evidence->SaveCheckpoint({c.task, c.round, c.replica, s, step}, state);
    };
    hooks.publish = [evidence](const StageStepCommit& commit, std::map<Hash256, Bytes> tensors) {
      return evidence->Publish(commit, std::move(tensors));
    };
    return hooks;
  };
  // Stage 1's node trains steps 0..k-1 and no more; the kept stages' step k fails at its deadline.
  std::vector<StageRunProgress> progress(3);
  std::vector<Status> first(3, Status::Ok());
  {
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < 3; ++s) {
      threads.emplace_back([&, s] {
        std::span<const Batch> b(batches);
        first[s] =
            RunStageUnit(*stages[s], *nodes[s]->plane, s == lost && !ahead ? b.first(k) : b,
                         kStageDropoutSeed, hooks_of(&nodes[s]->evidence, ctx, s), &progress[s])
                .status();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  if (ahead) {
    EXPECT_EQ(first[lost].code(), StatusCode::kFailedPrecondition) << first[lost].ToString();
    EXPECT_NE(first[lost].message().find("cancelled"), std::string::npos) << first[lost].ToString();
  } else {
    ASSERT_TRUE(first[lost].ok()) << first[lost].ToString();
  }
  for (uint32_t s = 0; s < 3; ++s) {
    if (s == lost) continue;
    EXPECT_EQ(first[s].code(), StatusCode::kDeadlineExceeded) << first[s].ToString();
    ASSERT_EQ(progress[s].commits.size(), ahead && s == 0 ? k + 1 : k) << "stage " << s;
  }
  nodes[lost]->server->Stop();
  if (unserved) nodes[0]->evidence.Withdraw({ctx.task, ctx.round, ctx.replica, 0, k - 1});

  StageContext replaced = ctx;
  const KeyPair new_key = StageNodeKey(5);
  replaced.chain[lost] = new_key.public_key();
  nodes[lost] = StageStartNode(replaced, static_cast<int>(lost), new_key, opt);
  StageConnect(nodes, replaced.chain);
  stages[lost] = StageAtRoundStart(spec, static_cast<int>(lost));
  progress[lost] = {};
  std::vector<std::string> endpoints;
  for (auto& n : nodes) endpoints.push_back(n->server->endpoint());
  std::vector<KeyPair> keys{StageNodeKey(0), StageNodeKey(1), StageNodeKey(2)};
  keys[lost] = new_key;
  // What node_work shows each node (UnitAssignment::Stage::earlier): the lost stage's node before.
  std::vector<protocol::NodeId> earlier(3);
  earlier[lost] = wrong_earlier ? StageNodeKey(7).public_key() : StageNodeKey(lost).public_key();
  // Each node's run: its offer, the agreed start, then its steps from there.
  auto run_all = [&](bool ask, std::vector<Result<uint64_t>>* from,
                     std::vector<Result<StageUnitOutcome>>* out) {
    from->assign(3, Internal("not run"));
    out->assign(3, Internal("not run"));
    for (uint32_t s = 0; s < 3; ++s) nodes[s]->plane->OfferResume(progress[s].commits.size());
    std::vector<std::thread> threads;
    for (uint32_t s = 0; s < 3; ++s) {
      threads.emplace_back([&, s] {
        const StageRunHooks hooks = hooks_of(&nodes[s]->evidence, replaced, s);
        (*from)[s] = StartStageRun(*stages[s], *nodes[s]->plane, keys[s], nodes[s]->transport.get(),
                                   endpoints, batches, kStageDropoutSeed, hooks,
                                   &nodes[s]->evidence, opt, ask, earlier[s], &progress[s]);
        if ((*from)[s].ok()) {
          (*out)[s] = RunStageUnit(*stages[s], *nodes[s]->plane, batches, kStageDropoutSeed, hooks,
                                   &progress[s]);
        }
      });
    }
    for (std::thread& t : threads) t.join();
  };
  std::vector<Result<uint64_t>> from;
  std::vector<Result<StageUnitOutcome>> out;
  run_all(/*ask=*/true, &from, &out);
  if (fails) {
    // The new node names what it could not fetch, or whose records it refuses; the kept nodes
    // read its 0 and fail.
    EXPECT_EQ(from[lost].status().code(),
              unserved ? StatusCode::kFailedPrecondition : StatusCode::kPermissionDenied)
        << from[lost].status().ToString();
    for (uint32_t s : {0u, 1u, 2u}) {
      if (s == lost) continue;
      EXPECT_EQ(from[s].status().code(), StatusCode::kFailedPrecondition)
          << from[s].status().ToString();
      EXPECT_NE(from[s].status().message().find("runs from step 0"), std::string::npos)
          << from[s].status().ToString();
    }
    // The Stager's next run of each: from the round's start, asking nothing.
    stages = StageStages(spec);
    progress.assign(3, {});
    // (The Stager's next run has a plane of its own; these are at step 0 before any pushes.)
    for (auto& n : nodes) {
      n->plane->SetChain(replaced.chain, endpoints);
      n->plane->BeginStep(0);
    }
    run_all(/*ask=*/false, &from, &out);
  }
  for (uint32_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(from[s].ok()) << "stage " << s << ": " << from[s].status().ToString();
    EXPECT_EQ(*from[s], fails ? 0u : k) << "stage " << s;
    ASSERT_TRUE(out[s].ok()) << "stage " << s << ": " << out[s].status().ToString();
    EXPECT_EQ(engine::StateHash(stages[s]->state()), engine::StateHash(want[s]->state()))
        << "stage " << s;
    ASSERT_EQ(out[s]->commits.size(), 4u);
    // Every record of stage 1 the kept stages hold is the new node's.
    for (const StageStepCommit& c : out[s]->commits) {
      for (const StageTransfer& r : c.received) {
        if (r.key.from_stage == lost) {
          EXPECT_EQ(r.sender, new_key.public_key()) << "stage " << s;
        }
      }
    }
  }
  // A verifier of the replaced stage's steps before k, and of a kept stage's, against the new
  // chain (and of step k, which the stage ahead trained again from its rolled-back state).
  net::HttpTransport verifier;
  for (uint32_t s : {lost, other}) {
    for (uint64_t j = 0; j <= k; ++j) {
      Result<StageStepEvidence> ev = FetchStageStepEvidence(
          &verifier, nodes[s]->server->endpoint(), {ctx.task, ctx.round, ctx.replica, s, j});
      ASSERT_TRUE(ev.ok()) << ev.status().ToString();
      Result<engine::TrainState> start = StageCheckpointState(ev->checkpoint);
      ASSERT_TRUE(start.ok()) << start.status().ToString();
      Result<StageReplayResult> r =
          ReplayStageStep(StageSetup(spec, replaced.chain), std::move(*start), ev->commit,
                          ev->blobs, batches[j], kStageDropoutSeed);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->ok()) << "stage " << s << " step " << j << ": " << r->message;
    }
  }
  // The Stager drops what a run sent once it ended whole (DropSent): no resume reads it then, and
  // its verifiers replay from what it received, still served. (Stage lost - 1 sends the lost stage
  // its activations.)
  const uint32_t sender = lost - 1;
  EXPECT_GT(nodes[sender]->evidence.DropSent({ctx.task, ctx.round, ctx.replica, sender, 0}), 0u);
  Result<KeptStageSteps> gone = FetchKeptStageSteps(
      nodes[lost]->transport.get(), nodes[sender]->server->endpoint(), replaced, sender, lost, k);
  EXPECT_EQ(gone.status().code(), StatusCode::kFailedPrecondition) << gone.status().ToString();
  Result<StageStepEvidence> ev = FetchStageStepEvidence(
      &verifier, nodes[sender]->server->endpoint(), {ctx.task, ctx.round, ctx.replica, sender, 0});
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  Result<engine::TrainState> start = StageCheckpointState(ev->checkpoint);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  Result<StageReplayResult> r =
      ReplayStageStep(StageSetup(spec, replaced.chain), std::move(*start), ev->commit, ev->blobs,
                      batches[0], kStageDropoutSeed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok()) << r->message;
}

TEST(StageResumeTest, StageNodesAgreeOnTheLostStepOverHttpAndTheKeptOnesTrainOnlyTheStepsAfterIt) {
  StageNodesLoseAStageAtK(/*unserved=*/false);
}

TEST(StageResumeTest, AResumeTheNewNodeCannotMakeIsDecidedZeroAndEveryStageRerunsFromTheStart) {
  StageNodesLoseAStageAtK(/*unserved=*/true);
}

// Issue 15: the new node resumes only from records of the node the ledger shows held its stage
// before (node_work's `earlier`), not from whichever node the kept stages' records name.
TEST(StageResumeTest, ANewNodeRefusesRecordsOfAnotherNodeThanTheLedgersEarlierOneAndAllRerun) {
  StageNodesLoseAStageAtK(/*unserved=*/false, /*ahead=*/false, /*wrong_earlier=*/true);
}

// Issue 15: the lost node sent step k's gradient total to stage 0 and not to stage 1, so the kept
// stages hold k + 1 and k steps: stage 0 rolls back to step k's start from its own checkpoint, and
// the replica resumes at k, bit-equal.
TEST(StageResumeTest, AKeptStageAStepAheadRollsBackFromItsCheckpointAndTheReplicaResumesAtK) {
  StageNodesLoseAStageAtK(/*unserved=*/false, /*ahead=*/true);
}

TEST(StagePlaneTest, PushesAreCheckedAndTheInboxPushesBack) {
  const StageContext ctx = StageCtx();
  net::HttpTransport transport;
  StagePlaneOptions opt;
  opt.inbox_bytes = 1;  // one tensor at a time
  opt.step_deadline_ms = 50;
  StagePlane plane(ctx, 1, StageNodeKey(1), &transport, opt);
  plane.SetChain(ctx.chain, {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"});
  plane.BeginStep(0);
  const std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  auto key = [&](int64_t m, uint64_t step = 0) {
    return ctx.Key(StageTensorKind::kStageTensorActivation, 0, 1, step, m);
  };
  auto push = [&](const StageTransfer& rec, const std::vector<float>& values) {
    return plane
        .HandlePush(net::Request{kMethodStagePush,
                                 EncodeStagePush(rec, values, StageChainDigest(ctx.chain))})
        .status();
  };
  const StageTransfer a0 = SignStageTensor(key(0), a, StageNodeKey(0));
  EXPECT_TRUE(push(a0, a).ok());
  EXPECT_TRUE(push(a0, a).ok()) << "a retry of the same push";
  EXPECT_EQ(plane.stats().duplicates, 1u);
  Status st = push(SignStageTensor(key(0), b, StageNodeKey(0)), b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a second tensor"), std::string::npos) << st.ToString();

  // Back-pressure: the inbox is full until the stage takes what it holds.
  const StageTransfer a1 = SignStageTensor(key(1), b, StageNodeKey(0));
  st = push(a1, b);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("busy"), std::string::npos) << st.ToString();
  StageTransfer rec;
  Result<std::vector<float>> got = plane.link()->Receive(key(0), &rec);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a);
  EXPECT_EQ(rec, a0);
  EXPECT_TRUE(push(a1, b).ok());
  EXPECT_EQ(plane.stats().refused_busy, 1u);
  got = plane.link()->Receive(key(1), &rec);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, b);
  EXPECT_TRUE(push(a0, a).ok()) << "a push already taken, again: held for a re-run";
  got = plane.link()->Receive(key(0), &rec);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a);

  // Records that are not this stage's, not the chain's node's, or not the tensor's.
  StageContext other = ctx;
  other.replica = 0;
  st = push(SignStageTensor(other.Key(StageTensorKind::kStageTensorActivation, 0, 1, 0, 0), a,
                            StageNodeKey(0)),
            a);
  EXPECT_NE(st.message().find("is not for this node, which serves stage 1 of replica 1"),
            std::string::npos)
      << st.ToString();
  st = push(SignStageTensor(ctx.Key(StageTensorKind::kStageTensorActivation, 1, 2, 0, 0), a,
                            StageNodeKey(1)),
            a);
  EXPECT_NE(st.message().find("is not for this node"), std::string::npos) << st.ToString();
  st = push(SignStageTensor(key(1, 1), a, StageNodeKey(2)), a);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  st = push(SignStageTensor(key(1, 1), a, StageNodeKey(0)), b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the tensor received hashes to"), std::string::npos) << st.ToString();
  st = push(SignStageTensor(key(0, 5), a, StageNodeKey(0)), a);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << "not yet: the sender retries";
  EXPECT_NE(st.message().find("ahead of this stage's step 0"), std::string::npos) << st.ToString();
  Bytes truncated = EncodeStagePush(a0, a, StageChainDigest(ctx.chain));
  truncated.pop_back();
  EXPECT_FALSE(plane.HandlePush(net::Request{kMethodStagePush, truncated}).ok());

  // Mutated push bodies (bytes changed, cut, added) never crash the handler and are never taken:
  // the record's signature binds every field, the hash the floats.
  Rng rng(15);
  const Bytes body = EncodeStagePush(a0, a, StageChainDigest(ctx.chain));
  for (int i = 0; i < 2000; ++i) {
    Bytes m = body;
    for (uint64_t e = 1 + rng.Uniform(3); e > 0; --e) {
      const uint64_t what = rng.Uniform(3);
      if (what == 0 && !m.empty())
        m[rng.Uniform(m.size())] ^= static_cast<uint8_t>(1 + rng.Uniform(255));
      if (what == 1 && !m.empty()) m.resize(rng.Uniform(m.size()));
      if (what == 2) m.push_back(static_cast<uint8_t>(rng.Uniform(256)));
    }
    if (m == body) continue;
    const uint64_t taken = plane.stats().pushes_taken;
    Result<Bytes> r = plane.HandlePush(net::Request{kMethodStagePush, m});
    EXPECT_EQ(plane.stats().pushes_taken, taken) << "mutation " << i << " was taken";
    (void)r;
  }

  // A tensor that never comes: the step's deadline.
  got = plane.link()->Receive(key(3), &rec);
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("from stage 0 (node " + ctx.chain[0].ShortHex() +
                                        " at 127.0.0.1:1)"),
            std::string::npos)
      << got.status().ToString();
}

// A stage's node is replaced while a live neighbour's run of the old chain has not stopped yet:
// that stale run (here stage 2 of chain [0, 1, 2] at step 1) must neither take a push of the new
// chain [0, 9, 2] -- stage 0's step-0 tied weight was answered ok as a retry of a step it had
// passed, and lost to stage 2's next run -- nor refuse the replacement's (its signature is not
// the old chain's node's): both are answered Unavailable, so the senders retry until the stage
// runs on their chain, and nobody waits out a step deadline.
TEST(StagePlaneTest, APushOfAnotherChainIsRetriedNeitherTakenNorRefused) {
  const StageContext ctx = StageCtx();
  net::HttpTransport transport;
  StagePlane plane(ctx, 2, StageNodeKey(2), &transport, {.step_deadline_ms = 50});
  const std::vector<std::string> endpoints = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"};
  plane.SetChain(ctx.chain, endpoints);
  plane.BeginStep(1);
  std::vector<protocol::NodeId> replaced = ctx.chain;
  replaced[1] = StageNodeKey(9).public_key();
  const std::vector<float> w = {1, 2, 3}, a = {4, 5, 6};
  const StageTransfer tied = SignStageTensor(
      ctx.Key(StageTensorKind::kStageTensorTiedWeight, 0, 2, 0, -1), w, StageNodeKey(0));
  const StageTransfer act = SignStageTensor(
      ctx.Key(StageTensorKind::kStageTensorActivation, 1, 2, 0, 0), a, StageNodeKey(9));
  auto push = [&](const StageTransfer& rec, const std::vector<float>& values,
                  std::span<const protocol::NodeId> chain) {
    return plane
        .HandlePush(
            net::Request{kMethodStagePush, EncodeStagePush(rec, values, StageChainDigest(chain))})
        .status();
  };
  Status st = push(tied, w, replaced);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("(a stage's node was replaced); retry"), std::string::npos)
      << st.ToString();
  st = push(act, a, replaced);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_EQ(plane.stats().duplicates, 0u);
  EXPECT_EQ(plane.stats().pushes_taken, 0u);
  // The stage's run on the new chain (here the same plane, as the plane-level resume does) takes
  // both, and a push of the old chain is retried in turn.
  plane.SetChain(replaced, endpoints);
  plane.BeginStep(0);
  EXPECT_TRUE(push(tied, w, replaced).ok());
  EXPECT_TRUE(push(act, a, replaced).ok());
  EXPECT_EQ(plane.stats().pushes_taken, 2u);
  st = push(SignStageTensor(ctx.Key(StageTensorKind::kStageTensorActivation, 1, 2, 0, 1), a,
                            StageNodeKey(1)),
            a, ctx.chain);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  StageTransfer rec;
  Result<std::vector<float>> got = plane.link()->Receive(tied.key, &rec);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, w);
}

// A stage's keeper (docs/networking.md "Checkpoint replication") keeps a checkpoint only as the
// state the chain's node of the stage signed, for a stage it keeps, of its replica and chain; it
// keeps the newest of each stage, and keeps it when the chain changes (the stage's node was
// replaced: the point of keeping it).
TEST(StagePlaneTest, AKeeperKeepsOnlyTheCheckpointItsStagesNodeSigned) {
  const ModelSpec spec = StageParseModel(kStageGpt);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
  engine::RunPipelineStep(stages, StageBatch(spec, 0), kStageDropoutSeed);
  const StageContext ctx = StageCtx();
  ASSERT_EQ(protocol::StageCheckpointKeeper(0, 3), 1u);
  ASSERT_EQ(protocol::StageCheckpointKeeper(1, 3), 2u);
  ASSERT_EQ(protocol::StageCheckpointKeeper(2, 3), 1u);
  net::HttpTransport transport;
  StagePlane plane(ctx, 1, StageNodeKey(1), &transport, {.step_deadline_ms = 50});
  const std::vector<std::string> endpoints = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"};
  plane.SetChain(ctx.chain, endpoints);
  plane.BeginStep(1);
  auto claim_of = [&](uint32_t stage, uint64_t step, engine::TrainState& state,
                      const KeyPair& key) {
    return protocol::SignStageStateClaim({.task = ctx.task,
                                          .round = ctx.round,
                                          .replica = ctx.replica,
                                          .stages = 3,
                                          .stage = stage,
                                          .step = step},
                                         engine::StateHash(state), key);
  };
  auto bytes_of = [](engine::TrainState& state) {
    Result<Bytes> b = ledger::StageCheckpointBytes(state);
    CHECK(b.ok());
    return *b;
  };
  auto keep = [&](const protocol::StageStateClaim& c, const Bytes& checkpoint,
                  std::span<const protocol::NodeId> chain) {
    Encoder e;
    e.PutBytes(protocol::EncodeStageStateClaim(c));
    e.PutBytes(checkpoint);
    e.PutHash(StageChainDigest(chain));
    return plane.HandleKeep(net::Request{kMethodStageKeep, e.Take()}).status();
  };
  const Bytes s0 = bytes_of(stages[0]->state());
  const protocol::StageStateClaim c0 = claim_of(0, 1, stages[0]->state(), StageNodeKey(0));

  // The claim encodes and decodes as signed; a field changed after signing does not verify.
  Result<protocol::StageStateClaim> round_trip =
      protocol::DecodeStageStateClaim(protocol::EncodeStageStateClaim(c0));
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
  EXPECT_EQ(*round_trip, c0);
  protocol::StageStateClaim altered = c0;
  altered.step = 0;
  EXPECT_EQ(protocol::VerifyStageStateClaim(altered, ctx.chain[0]).code(),
            StatusCode::kPermissionDenied);

  // Refused: another node's signature, a checkpoint that is not the signed state, a stage this
  // one does not keep, another replica. Retried: another chain's.
  Status st = keep(claim_of(0, 1, stages[0]->state(), StageNodeKey(2)), s0, ctx.chain);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  st = keep(c0, bytes_of(stages[2]->state()), ctx.chain);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("its signed claim says"), std::string::npos) << st.ToString();
  st = keep(claim_of(1, 1, stages[1]->state(), StageNodeKey(1)), bytes_of(stages[1]->state()),
            ctx.chain);
  EXPECT_NE(st.message().find("is not one this stage keeps"), std::string::npos) << st.ToString();
  protocol::StageStateClaim other_replica = c0;
  other_replica.replica = 0;
  other_replica = protocol::SignStageStateClaim(other_replica, c0.state, StageNodeKey(0));
  st = keep(other_replica, s0, ctx.chain);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  std::vector<protocol::NodeId> replaced = ctx.chain;
  replaced[0] = StageNodeKey(9).public_key();
  st = keep(c0, s0, replaced);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_TRUE(plane.kept().empty());
  EXPECT_EQ(plane.stats().checkpoints_kept, 0u);

  // Kept: stage 0's and the last stage's, each its newest; an older one leaves it.
  ASSERT_TRUE(keep(c0, s0, ctx.chain).ok());
  const protocol::StageStateClaim c2 = claim_of(2, 3, stages[2]->state(), StageNodeKey(2));
  ASSERT_TRUE(keep(c2, bytes_of(stages[2]->state()), ctx.chain).ok());
  ASSERT_TRUE(keep(claim_of(2, 2, stages[2]->state(), StageNodeKey(2)),
                   bytes_of(stages[2]->state()), ctx.chain)
                  .ok());
  std::map<uint32_t, KeptCheckpoint> kept = plane.kept();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept.at(0).claim, c0);
  EXPECT_EQ(kept.at(0).checkpoint, s0);
  EXPECT_EQ(kept.at(2).claim, c2);
  EXPECT_EQ(plane.stats().checkpoints_kept, 3u);
  // Stage 0's node is replaced: what its lost node signed stays kept, and the new node's claims
  // are checked against the new chain.
  plane.SetChain(replaced, endpoints);
  EXPECT_EQ(plane.kept().at(0).claim, c0);
  st = keep(claim_of(0, 2, stages[0]->state(), StageNodeKey(0)), s0, replaced);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  const protocol::StageStateClaim c9 = claim_of(0, 2, stages[0]->state(), StageNodeKey(9));
  ASSERT_TRUE(keep(c9, s0, replaced).ok());
  EXPECT_EQ(plane.kept().at(0).claim, c9);
}

// A node keeps its neighbours' checkpoints past the run whose plane took them, and serves them
// ("stage.kept") to the node that replaces a lost stage, which checks each against the key of
// the node that signed it; a stage sends only the steps its checkpoint_every makes due.
TEST(StagePlaneTest, ANodeServesTheCheckpointsItKeepsPastTheRunThatTookThem) {
  const ModelSpec spec = StageParseModel(kStageGpt);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
  const StageContext ctx = StageCtx();
  net::Router router;
  StageHost host;
  host.Register(&router);
  net::HttpServer server(&router, net::HttpServerOptions{});
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const std::vector<std::string> endpoints = {"127.0.0.1:1", server.endpoint(), "127.0.0.1:3"};
  net::HttpTransport transport;
  // Stage 1's node runs the replica's unit (its plane attached); stage 0 keeps its checkpoints
  // there, every second step.
  auto run = std::make_unique<StagePlane>(ctx, 1, StageNodeKey(1), &transport,
                                          StagePlaneOptions{.step_deadline_ms = 5000});
  std::unique_ptr<StageHost::Attachment> attached = host.Attach(run.get());
  run->SetChain(ctx.chain, endpoints);
  StagePlane sender(ctx, 0, StageNodeKey(0), &transport,
                    {.step_deadline_ms = 5000, .checkpoint_every = 2});
  sender.SetChain(ctx.chain, endpoints);
  for (uint64_t step = 0; step < 4; ++step) {
    sender.BeginStep(step);
    ASSERT_TRUE(sender.KeepCheckpoint(step, stages[0]->state()).ok());
  }
  EXPECT_EQ(sender.stats().checkpoints_sent, 1u)
      << "step 2 only: 0 is the round's, 1 and 3 not due";
  const Hash256 state0 = engine::StateHash(stages[0]->state());
  auto fetch = [&](uint32_t stage, const protocol::NodeId& signer) {
    return FetchKeptCheckpoint(&transport, server.endpoint(), ctx.task, ctx.round, ctx.replica, 3,
                               stage, signer);
  };
  Result<KeptCheckpoint> got = fetch(0, ctx.chain[0]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->claim.step, 2u);
  EXPECT_EQ(got->claim.state, state0);
  EXPECT_EQ(sender.stats().checkpoint_bytes_sent, got->checkpoint.size());

  // The run ends (its plane goes with it): the node still serves what it kept.
  attached.reset();
  run.reset();
  got = fetch(0, ctx.chain[0]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->claim.step, 2u);
  EXPECT_EQ(host.kept_bytes(), got->checkpoint.size());
  // The fetcher checks it against the node it expects to have signed it; none of stage 2 is kept.
  EXPECT_EQ(fetch(0, ctx.chain[2]).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(fetch(2, ctx.chain[2]).status().code(), StatusCode::kNotFound);
  // Once its round is final, it is dropped.
  EXPECT_EQ(host.WithdrawKeptBefore(ctx.task, ctx.round), 0u);
  EXPECT_EQ(host.WithdrawKeptBefore(ctx.task, ctx.round + 1), 1u);
  EXPECT_EQ(fetch(0, ctx.chain[0]).status().code(), StatusCode::kNotFound);
}

// ---- The ledger places the stages (docs/protocol.md, "Pipeline stage units").

// A registered node of the ledger test: a persistent HTTP server whose "stage.push" goes to the
// stage unit the node runs now (StageHost), and its client.
struct LedgerStageNode {
  explicit LedgerStageNode(KeyPair k) : key(std::move(k)) {}
  KeyPair key;
  net::Router router;
  StageHost host;
  std::unique_ptr<net::HttpTransport> transport;
  std::unique_ptr<net::HttpServer> server;
};

// kPipelineGptTask on a ledger: SubmitTask with its pipeline terms (AddPipelineTerms), the ledger
// places every round's 2 replicas x 3 stages on six registered nodes (PlaceStages), each node
// runs its stage unit over HTTP with its neighbours, found in the node registry (RunStageUnit),
// and commits it (CommitStage); the ledger's aggregator gathers the replicas' stage deltas and
// applies the round (GatherStageFlats, ApplyRound). The task finishes on the ledger with the
// weights of `meshlearn diloco`, bit for bit.
TEST(StageLedgerTest, StagesPlacedByTheLedgerTrainOverHttpBitEqualToMeshlearnDiloco) {
  PipelineOracle o;
  ASSERT_NO_FATAL_FAILURE(LoadPipelineOracle(&o));
  const NetworkSpec& net = o.net;
  Result<std::unique_ptr<engine::Trainer>> tr = engine::Trainer::Create(o.task, o.data);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  engine::Trainer* trainer = tr->get();
  const engine::TaskSpec& t = trainer->task();
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(t, static_cast<int>(net.stages), net.cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  const protocol::TaskSpecView view = MakeTaskView(*trainer, net);
  const TaskFacts facts = ComputeTaskFacts(*trainer, net);
  GlobalState state = InitialState(*trainer);
  const uint64_t samples = UnitSamples(*trainer, net);

  ledger::TaskParams params = MakeTaskParams(facts, net, StateBlobId(state));
  // The facts carry the cut's terms (StageTermsOf), so MakeTaskParams alone gives them, and
  // AddPipelineTerms (which names a cut that cannot be made) gives the same.
  const ledger::TaskParams from_facts = params;
  ASSERT_TRUE(AddPipelineTerms(t, net, &params).ok());
  EXPECT_EQ(from_facts.stage_memory_bytes, params.stage_memory_bytes);
  EXPECT_EQ(from_facts.stage_flops, params.stage_flops);
  EXPECT_EQ(from_facts.stage_boundary_bytes, params.stage_boundary_bytes);
  ASSERT_EQ(params.stages, 3u);
  ASSERT_EQ(params.units_per_round, 6u);
  ASSERT_EQ(params.stage_memory_bytes.size(), 3u);
  // What a step moves across each boundary, as the ledger pairs the stages' nodes by it: the
  // cut's engine::CutBoundaryBytes, here (B, T, C) floats each way per micro-batch.
  Result<std::vector<uint64_t>> boundary =
      engine::CutBoundaryBytes(t.model, *cut, t.batch_size, t.seq_len, t.micro_batches);
  ASSERT_TRUE(boundary.ok()) << boundary.status().ToString();
  ASSERT_EQ(boundary->size(), 2u);
  const uint64_t one_way =
      uint64_t{4} * static_cast<uint64_t>(t.batch_size) *
      static_cast<uint64_t>(t.seq_len > 0 ? t.seq_len : t.model.gpt.block_size) *
      static_cast<uint64_t>(t.model.gpt.n_embd);
  EXPECT_EQ(*boundary, (std::vector<uint64_t>{2 * one_way, 2 * one_way}));
  EXPECT_EQ(facts.stage_boundary_bytes, *boundary);
  EXPECT_EQ(params.stage_boundary_bytes, *boundary);
  // Each stage's need is its CutCosts estimate and a copy of the tensors it receives and sends in
  // a step, which its node's plane holds until their evidence files are written (the files hold
  // the round's): the boundaries beside it, and the tied wte and its head gradient on stages 0
  // and 2.
  Result<std::vector<engine::StageCost>> costs =
      engine::CutCosts(t.model, t.optimizer, *cut, t.batch_size, t.seq_len, t.micro_batches);
  ASSERT_TRUE(costs.ok()) << costs.status().ToString();
  const uint64_t tied = uint64_t{2} * 4 * static_cast<uint64_t>(t.model.gpt.vocab_size) *
                        static_cast<uint64_t>(t.model.gpt.n_embd);
  const std::vector<uint64_t> step_tensors{(*boundary)[0] + tied, (*boundary)[0] + (*boundary)[1],
                                           (*boundary)[1] + tied};
  Result<StageTerms> terms = StageTermsOf(t, net);
  ASSERT_TRUE(terms.ok()) << terms.status().ToString();
  EXPECT_EQ(terms->step_tensor_bytes, step_tensors);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(params.stage_memory_bytes[s],
              static_cast<uint64_t>(std::ceil((*costs)[s].total_bytes())) + step_tensors[s])
        << s;
  }
  EXPECT_TRUE(ledger::ValidateTaskTerms(params, 1'000'000, 20, false, 0).ok());
  // A whole unit's need is the stages' formula for the whole model as one stage
  // (UnitMemoryBytes: engine::CutCosts), more than any stage's.
  Result<uint64_t> whole = UnitMemoryBytes(t);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  Result<std::vector<engine::StageCost>> one_stage = engine::CutCosts(
      t.model, t.optimizer, engine::PipelineCut{{0, engine::CutLayerCount(t.model)}}, t.batch_size,
      t.seq_len, t.micro_batches);
  ASSERT_TRUE(one_stage.ok()) << one_stage.status().ToString();
  EXPECT_EQ(*whole, static_cast<uint64_t>(std::ceil((*one_stage)[0].total_bytes())));
  EXPECT_EQ(params.memory_bytes, *whole);
  EXPECT_EQ(facts.memory_bytes, *whole);
  for (uint64_t need : params.stage_memory_bytes) EXPECT_LT(need, *whole);
  // A node checks the ledger's terms against the bundle it loaded, stages and memory included.
  EXPECT_TRUE(CheckBundleMatchesLedger(facts, net, params).ok());
  ledger::TaskParams other_need = params;
  other_need.memory_bytes = *whole + 1;
  Status wrong_need = CheckBundleMatchesLedger(facts, net, other_need);
  EXPECT_NE(
      wrong_need.message().find("needs memory_bytes = " + std::to_string(*whole) + " for a unit"),
      std::string::npos)
      << wrong_need.ToString();
  EXPECT_NE(wrong_need.message().find("params.memory_bytes = " + std::to_string(*whole + 1)),
            std::string::npos)
      << wrong_need.ToString();
  ledger::TaskParams undeclared = params;  // a task submitted without a need: the fallback's
  undeclared.memory_bytes = 0;
  EXPECT_TRUE(CheckBundleMatchesLedger(facts, net, undeclared).ok());
  ledger::TaskParams other_bytes = params;  // placed by other boundary bytes than the cut moves
  other_bytes.stage_boundary_bytes[1] += 4;
  Status wrong_bytes = CheckBundleMatchesLedger(facts, net, other_bytes);
  EXPECT_NE(wrong_bytes.message().find("the ledger's params.stage_boundary_bytes = [" +
                                       std::to_string((*boundary)[0]) + ", " +
                                       std::to_string((*boundary)[1] + 4) + "]"),
            std::string::npos)
      << wrong_bytes.ToString();
  // Placed by other per-stage needs than the cut's: a stage on a node too small for it.
  ledger::TaskParams other_memory = params;
  other_memory.stage_memory_bytes[2] /= 2;
  Status wrong_memory = CheckBundleMatchesLedger(facts, net, other_memory);
  EXPECT_NE(wrong_memory.message().find("the ledger's params.stage_memory_bytes = [" +
                                        std::to_string(params.stage_memory_bytes[0]) + ", " +
                                        std::to_string(params.stage_memory_bytes[1]) + ", " +
                                        std::to_string(params.stage_memory_bytes[2] / 2) + "]"),
            std::string::npos)
      << wrong_memory.ToString();
  ledger::TaskParams other_flops = params;
  other_flops.stage_flops[0] += 1;
  Status wrong_flops = CheckBundleMatchesLedger(facts, net, other_flops);
  EXPECT_NE(wrong_flops.message().find("params.stage_flops = [" +
                                       std::to_string(params.stage_flops[0] + 1) + ", "),
            std::string::npos)
      << wrong_flops.ToString();
  // The same from the task record as get_task answers it (a node's audit reads that): its lists
  // are parsed and compared as well.
  ledger::TaskRecord record;
  record.params = params;
  EXPECT_TRUE(CheckBundleMatchesLedger(facts, net, ledger::TaskToJson(record)).ok());
  record.params = other_memory;
  Status wrong_record = CheckBundleMatchesLedger(facts, net, ledger::TaskToJson(record));
  EXPECT_NE(wrong_record.message().find("params.stage_memory_bytes"), std::string::npos)
      << wrong_record.ToString();
  ledger::TaskParams unstaged = params;
  unstaged.stages = 1;
  Status mismatch = CheckBundleMatchesLedger(facts, net, unstaged);
  EXPECT_NE(mismatch.message().find("the task bundle says stages = 3 but the ledger's "
                                    "params.stages = 1"),
            std::string::npos)
      << mismatch.ToString();

  // The ledger, and six nodes owned by one account.
  const KeyPair submitter = StageNodeKey(90), owner = StageNodeKey(91),
                sequencer = StageNodeKey(92);
  ledger::Genesis g = ledger::DevnetGenesis({submitter.public_key(), owner.public_key()},
                                            1'000'000'000, "stage-chain");
  g.params.verification = false;           // stage units are not verified yet
  g.params.liveness_blocks = 100'000;      // no heartbeats in this test
  g.params.min_deadline_blocks = 100'000;  // blocks are made by hand: no deadline passes
  Result<std::unique_ptr<ledger::Chain>> opened =
      ledger::Chain::Open(TestDir("stage-ledger") + "/ledger.db", g);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ledger::Chain& chain = **opened;
  int64_t time_ms = 0;
  auto block = [&](std::vector<std::pair<const KeyPair*, ledger::TxPayload>> txs) {
    std::map<PublicKey, uint64_t> queued;
    std::vector<ledger::Transaction> signed_txs;
    for (auto& [from, p] : txs) {
      const uint64_t nonce = chain.NextNonce(from->public_key()) + queued[from->public_key()]++;
      signed_txs.push_back(ledger::BuildSignedTx(*from, g.chain_id, nonce, std::move(p)));
    }
    time_ms += 1000;
    Result<ledger::Block> b = chain.ProduceBlock(std::move(signed_txs), time_ms, sequencer);
    CHECK(b.ok()) << b.status().ToString();
    for (const ledger::Receipt& r : b->receipts) EXPECT_TRUE(r.ok) << r.reason;
    return b->receipts;
  };
  std::vector<std::unique_ptr<LedgerStageNode>> nodes;
  std::vector<std::pair<const KeyPair*, ledger::TxPayload>> regs;
  for (int k = 0; k < 6; ++k) {
    auto n = std::make_unique<LedgerStageNode>(StageNodeKey(60 + k));
    n->transport = std::make_unique<net::HttpTransport>(net::HttpTransportOptions{.threads = 2});
    n->host.Register(&n->router);
    n->server = std::make_unique<net::HttpServer>(&n->router, net::HttpServerOptions{.threads = 4});
    Result<uint16_t> port = n->server->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    regs.push_back({&owner, ledger::RegisterNodeTx{
                                .node_id = n->key.public_key(),
                                .endpoint = n->server->endpoint(),
                                .roles = ledger::kRoleSolver | ledger::kRoleAggregator,
                                .capabilities = {.cores = 2,
                                                 .memory_bytes = 1ull << 34,
                                                 .throughput = (k + 1) * 1'000'000'000'000ull,
                                                 .latency_ms = 1,
                                                 .bandwidth_bytes_per_s = 1'000'000'000},
                                .price = 1,
                                .stake = 1000}});
    nodes.push_back(std::move(n));
  }
  block(std::move(regs));
  ledger::SubmitTaskTx submit{.spec_hash = Blake2b("pipeline bundle"),
                              .budget = 100'000'000,
                              .price_cap = 1,
                              .params = params};
  const Hash256 task_id =
      ledger::TaskIdFor(submitter.public_key(), chain.NextNonce(submitter.public_key()));
  block({{&submitter, submit}});

  auto node_of = [&](const PublicKey& id) -> LedgerStageNode& {
    for (auto& n : nodes) {
      if (n->key.public_key() == id) return *n;
    }
    CHECK(false) << "not a test node";
    return *nodes[0];
  };
  for (uint32_t r = 0; r < net.rounds; ++r) {
    // The chains the ledger recorded: the assignees of the round's stage units.
    std::vector<std::vector<protocol::NodeId>> chains(2, std::vector<protocol::NodeId>(3));
    std::set<PublicKey> used;
    for (const ledger::WorkUnit& u : chain.ListWorkUnits(task_id)) {
      if (u.round != r) continue;
      ASSERT_EQ(u.status, ledger::WorkUnitStatus::kAssigned) << u.index;
      const ledger::StageSlot slot = ledger::StageSlotOf(params, u.index);
      chains[slot.replica][slot.stage] = u.assignee;
      used.insert(u.assignee);
    }
    ASSERT_EQ(used.size(), 6u) << "round " << r << ": a node per stage unit";
    // What each stage node reads: node_work lists its stage unit with the replica's chain and
    // the endpoints of its nodes (the registry's).
    {
      ledger::SharedChain shared(&chain);
      ledger::RpcService rpc(&shared, nullptr);
      for (const PublicKey& id : used) {
        nlohmann::json answer = rpc.HandleRpc({{"jsonrpc", "2.0"},
                                               {"id", 1},
                                               {"method", "node_work"},
                                               {"params", {{"id", id.ToHex()}}}});
        ASSERT_TRUE(answer.contains("result")) << answer.dump();
        Result<NodeWork> work = ParseNodeWork(answer["result"]);
        ASSERT_TRUE(work.ok()) << work.status().ToString();
        ASSERT_EQ(work->units.size(), 1u);
        const UnitAssignment& u = work->units[0];
        ASSERT_TRUE(u.stage.has_value());
        const ledger::StageSlot slot = ledger::StageSlotOf(params, u.index);
        EXPECT_EQ(u.stage->replica, slot.replica);
        EXPECT_EQ(u.stage->stage, slot.stage);
        EXPECT_EQ(u.stage->chain, chains[slot.replica]);
        for (uint32_t s = 0; s < 3; ++s) {
          EXPECT_EQ(u.stage->endpoints[s], node_of(chains[slot.replica][s]).server->endpoint());
        }
      }
    }

    struct Unit {
      uint32_t replica = 0;
      int stage = 0;
      UnitWork work;
      LedgerStageNode* node = nullptr;
      std::unique_ptr<Stage> stage_obj;
      std::unique_ptr<StagePlane> plane;
      std::unique_ptr<StageHost::Attachment> attached;
      Result<StageUnitOutcome> out = Unavailable("not run");
    };
    std::vector<std::vector<engine::Batch>> batches(2);
    std::vector<Unit> units;
    for (uint32_t i = 0; i < 2; ++i) {
      const UnitWork work = protocol::UnitWorkOf(net, view.seed, view.id, r, i);
      ASSERT_TRUE(trainer->StartUnit(work.stream, state.weights, work.lr_scale).ok());
      for (int64_t s = 0; s < work.inner_steps; ++s) batches[i].push_back(trainer->BatchForStep(s));
      StageContext ctx;
      ctx.task = task_id;
      ctx.round = r;
      ctx.replica = i;
      ctx.chain = chains[i];
      std::vector<std::string> endpoints;  // from the node registry
      for (const protocol::NodeId& id : chains[i]) {
        endpoints.push_back(chain.GetNode(id).value().endpoint);
      }
      for (int s = 0; s < 3; ++s) {
        Unit u;
        u.replica = i;
        u.stage = s;
        u.work = work;
        u.node = &node_of(chains[i][s]);
        Result<std::unique_ptr<Stage>> st =
            StageFromGlobal(t, *cut, s, state.weights, work.lr_scale);
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        u.stage_obj = std::move(*st);
        u.plane = std::make_unique<StagePlane>(ctx, s, u.node->key, u.node->transport.get());
        u.attached = u.node->host.Attach(u.plane.get());
        u.plane->SetChain(chains[i], endpoints);
        units.push_back(std::move(u));
      }
    }
    std::vector<std::thread> threads;
    for (Unit& u : units) {
      threads.emplace_back([&, up = &u] {
        up->out = RunStageUnit(*up->stage_obj, *up->plane, batches[up->replica],
                               engine::DropoutSeed(t.seed, up->work.stream));
      });
    }
    for (std::thread& th : threads) th.join();
    std::vector<std::pair<const KeyPair*, ledger::TxPayload>> commits;
    const std::vector<ledger::WorkUnit> placed = chain.ListWorkUnits(task_id);
    for (Unit& u : units) {
      ASSERT_TRUE(u.out.ok()) << u.out.status().ToString();
      const ledger::WorkUnit& unit =
          placed.at(ledger::StageUnitIndex(params, {r, u.replica, static_cast<uint32_t>(u.stage)}));
      commits.push_back(
          {&owner,
           ledger::CommitStageTx{
               .task_id = task_id,
               .round = r,
               .replica = u.replica,
               .stage = static_cast<uint32_t>(u.stage),
               .node_id = u.node->key.public_key(),
               .result_hash = u.out->result_hash,
               .commitment = u.out->commitment,
               .loss_micros = u.stage == 2 ? static_cast<uint64_t>(u.out->mean_loss * 1e6) : 0u,
               .assignment_beacon = unit.assignment_beacon}});
    }
    block(std::move(commits));

    // The aggregator the ledger assigned applies the round stage by stage over the replicas'
    // stage deltas (checked against the committed blob ids); gathering each replica's whole delta
    // and applying the round on it gives the same state.
    Result<protocol::RoundStateMachine> m =
        protocol::RoundStateMachine::Decode(chain.GetTask(task_id).value().runtime);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->phase(), protocol::RoundPhase::kRoundPhaseAggregating);
    ASSERT_TRUE(m->aggregator().has_value());
    const std::vector<ledger::WorkUnit> committed = chain.ListWorkUnits(task_id);
    std::vector<std::unique_ptr<Stage>> layout;                    // replica 0's stages: the shapes
    std::vector<std::vector<std::vector<float>>> stage_deltas(2);  // [replica][stage]
    for (Unit& u : units) {
      const uint32_t index =
          ledger::StageUnitIndex(params, {r, u.replica, static_cast<uint32_t>(u.stage)});
      EXPECT_EQ(committed.at(index).result_hash, ledger::DeltaBlobId(u.out->delta));
      stage_deltas[u.replica].push_back(u.out->delta);
      if (u.replica == 0) layout.push_back(std::move(u.stage_obj));
    }
    Result<StageLayout> shapes = StageLayoutOf(layout);
    ASSERT_TRUE(shapes.ok()) << shapes.status().ToString();
    GlobalState gathered = state;
    std::vector<std::vector<float>> deltas;  // RoundDelta holds a span: they must outlive it
    for (uint32_t i = 0; i < 2; ++i) {
      Result<std::vector<float>> whole = GatherStageFlats(*shapes, stage_deltas[i]);
      ASSERT_TRUE(whole.ok()) << whole.status().ToString();
      deltas.push_back(std::move(*whole));
    }
    std::vector<RoundDelta> round;
    for (uint32_t i = 0; i < 2; ++i) round.push_back({.shard = i, .delta = deltas[i]});
    ASSERT_TRUE(ApplyRound(&gathered, round, net, view.id, r, samples).ok());
    const std::vector<uint32_t> shards = {0, 1};
    if (r == 0) {  // a rule over whole deltas cannot be applied stage by stage
      NetworkSpec krum = net;
      krum.aggregation.rule = protocol::AggregationRule::kAggregationRuleKrum;
      GlobalState untouched = state;
      Status refused =
          ApplyStageRound(&untouched, *shapes, shards, stage_deltas, krum, view.id, r, samples);
      EXPECT_NE(refused.message().find("rule krum takes norms or distances"), std::string::npos)
          << refused.ToString();
      EXPECT_EQ(untouched, state);
    }
    Status staged =
        ApplyStageRound(&state, *shapes, shards, stage_deltas, net, view.id, r, samples);
    ASSERT_TRUE(staged.ok()) << staged.ToString();
    EXPECT_EQ(state, gathered) << "round " << r;
    EXPECT_EQ(HashFloats(state.weights), o.want.rounds[r].global_hash) << "round " << r;
    block({{&owner, ledger::CommitAggregateTx{.task_id = task_id,
                                              .round = r,
                                              .node_id = m->aggregator()->node,
                                              .state_hash = StateBlobId(state)}}});
  }
  // The last round is final once its verification window (network.verification_window_blocks)
  // has passed.
  for (uint64_t b = 0; b <= params.verification_window_blocks; ++b) block({});
  const ledger::TaskRecord done = chain.GetTask(task_id).value();
  EXPECT_EQ(done.status, ledger::TaskStatus::kFinished);
  EXPECT_EQ(done.final_state, StateBlobId(state));
  EXPECT_EQ(HashFloats(state.weights), o.want.final_hash);
}

// ApplyStageRound against ApplyRound over the gathered whole deltas, for every coordinate-wise
// rule, on a GPT's three stages with four replicas, one of them non-finite in one stage only (it
// is left out of every stage, as the whole round leaves it out), in its chunks and in finer ones.
TEST(StageLedgerTest, StageByStageAggregationEqualsTheWholeRoundForCoordinateWiseRules) {
  const ModelSpec spec = StageParseModel(kStageGpt);
  std::vector<std::unique_ptr<Stage>> stages = StageStages(spec);
  Result<StageLayout> layout = StageLayoutOf(stages);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  Rng rng(5);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.UniformDouble() * 2.0 - 1.0);
    return v;
  };
  const size_t size = layout->whole_size;
  GlobalState start{.weights = random(size), .momentum = random(size)};
  const std::vector<uint32_t> shards = {0, 1, 2, 3};
  std::vector<std::vector<std::vector<float>>> stage_deltas(shards.size());
  for (auto& replica : stage_deltas) {
    for (size_t s = 0; s < stages.size(); ++s) replica.push_back(random(layout->StageSize(s)));
  }
  stage_deltas[2][1][3] = std::nanf("");
  std::vector<std::vector<float>> deltas;
  for (const auto& replica : stage_deltas) {
    Result<std::vector<float>> d = GatherStageFlats(*layout, replica);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    deltas.push_back(std::move(*d));
  }
  std::vector<RoundDelta> round;
  for (size_t i = 0; i < shards.size(); ++i)
    round.push_back({.shard = shards[i], .delta = deltas[i]});
  for (protocol::AggregationRule rule : {protocol::AggregationRule::kAggregationRuleWeightedMean,
                                         protocol::AggregationRule::kAggregationRuleTrimmedMean,
                                         protocol::AggregationRule::kAggregationRuleMedian}) {
    NetworkSpec net;
    net.aggregation.rule = rule;
    net.aggregation.trim_fraction = 0.25;
    net.outer.lr = 0.7f;
    net.outer.momentum = 0.9f;
    net.outer.nesterov = true;
    GlobalState gathered = start, staged = start;
    Result<protocol::AggregateResult> agg =
        ApplyRound(&gathered, round, net, Blake2b("task"), 1, 100);
    ASSERT_TRUE(agg.ok()) << agg.status().ToString();
    EXPECT_EQ(agg->rejected.size(), 1u);
    Status s =
        ApplyStageRound(&staged, *layout, shards, stage_deltas, net, Blake2b("task"), 1, 100);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(staged, gathered) << protocol::AggregationRuleName(rule);
    EXPECT_NE(staged, start);
    // In chunks of 7 values (the parameters here are smaller than kStageRoundChunk): a round
    // applied to any cut of the coordinates is the same.
    GlobalState chunked = start;
    s = ApplyStageRound(&chunked, *layout, shards, stage_deltas, net, Blake2b("task"), 1, 100, 7);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(chunked, gathered) << protocol::AggregationRuleName(rule);
  }
}

// ---- The aggregator's memory (protocol::AggregatorMemoryBytes).

// A GPT of 3.2M parameters (13 MB of weights) on the GPL text, 2 replicas of 4 stages: big enough
// that its round, not the rest of the test process, is what the peak measures.
constexpr char kAggregatorMemoryTask[] = R"(
[task]
name = "aggregator-memory"
seed = 5
[data]
format = "text"
path = "/usr/share/common-licenses/GPL-3"
[model]
kind = "gpt"
n_layer = 4
n_head = 4
n_embd = 256
block_size = 32
[optimizer]
kind = "adamw"
lr = 1e-3
[train]
steps = 1
batch_size = 4
micro_batches = 2
seq_len = 32
eval_batches = 2
[network]
rounds = 1
units_per_round = 2
inner_steps = 1
stages = 4
aggregation = "mean"
)";

// `key`'s bytes in /proc/self/status ("VmRSS", "VmHWM"); 0 when it cannot be read.
uint64_t ProcStatusBytes(const std::string& key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::string(line).rfind(key + ":", 0) == 0) {
      kb = std::strtoull(line + key.size() + 1, nullptr, 10);
    }
  }
  std::fclose(f);
  return kb * 1024;
}

// Sets this process's peak resident memory (VmHWM) to its resident memory now (Linux 4.0+).
bool ResetPeakRss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// What MeasureAggregatorRound found: the round's peak above the process it started in, and the
// scheduler's bound on it (protocol::AggregatorMemoryBytes), now and as it was before a pipeline
// task declared its evaluator (a whole unit's training need in its place).
struct AggregatorRound {
  uint64_t peak = 0;
  uint64_t bound = 0;
  uint64_t old_bound = 0;
  uint64_t trainer_extra = 0;  // what a trainer holds beyond the evaluator: gradients, moments
  std::string report;
};

// The aggregator of a pipeline round of `text` (a task file; `dir` the directory its data paths
// are relative to), as Aggregator::Compute runs it (node/src/roles/aggregator.cc: the start state
// decoded from its blob, the whole model's weights to evaluate with (engine::Evaluator: no
// gradients or moments; a trainer until 2026-12-06), every stage blob fetched and decoded,
// ApplyStageRound, the new state evaluated and encoded), measured above the process it started
// in. The blobs the other nodes serve are made before the measurement starts, as they are not the
// aggregator's, and so is the task data, which the node loads with the task whatever its roles.
void MeasureAggregatorRound(const std::string& text, const std::string& dir, AggregatorRound* out) {
  Result<ConfigFile> cfg = ConfigFile::Parse(text, "aggregator.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  Result<NetworkSpec> net = NetworkSpec::FromConfig(*cfg);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  Result<engine::TaskSpec> task = engine::TaskSpec::Parse(text, "aggregator.toml", dir);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  Result<engine::TaskData> loaded = engine::LoadTaskData(Env::Default(), *task);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto data = std::make_shared<const engine::TaskData>(std::move(*loaded));
  Result<TaskFacts> facts = ComputeTaskFacts(*task, *data, *net);
  ASSERT_TRUE(facts.ok()) << facts.status().ToString();
  const ledger::TaskParams params = MakeTaskParams(*facts, *net, Hash256{});
  ASSERT_GT(params.eval_memory_bytes, 0u) << "a pipeline task declares its evaluator";
  out->bound = protocol::AggregatorMemoryBytes(ledger::TaskSpecViewOf(Hash256{}, params, 0));
  ledger::TaskParams undeclared = params;
  undeclared.eval_memory_bytes = 0;
  out->old_bound =
      protocol::AggregatorMemoryBytes(ledger::TaskSpecViewOf(Hash256{}, undeclared, 0));
  Result<engine::MemoryEstimate> trained =
      engine::EstimateMemory(task->model, task->batch_size, task->seq_len, task->optimizer.kind,
                             task->optimizer.momentum != 0);
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  out->trainer_extra = static_cast<uint64_t>(trained->gradients + trained->optimizer);
  Result<engine::PipelineCut> cut =
      engine::TaskPipelineCut(*task, static_cast<int>(net->stages), net->cut);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  Result<StageLayout> layout = StageLayoutOf(task->model, *cut);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->whole_size, facts->num_params);
  const uint32_t replicas = ledger::PipelineReplicas(params);

  // What the other nodes serve: the round's start state and every replica's stage deltas.
  Rng rng(11);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.UniformDouble() * 0.02 - 0.01);
    return v;
  };
  const Bytes start_blob = [&] {
    GlobalState start{.weights = random(layout->whole_size),
                      .momentum = random(layout->whole_size)};
    return EncodeGlobalState(start);
  }();
  std::vector<std::vector<Bytes>> stage_blobs(replicas);
  for (std::vector<Bytes>& replica : stage_blobs) {
    for (size_t s = 0; s < layout->stages.size(); ++s) {
      replica.push_back(EncodeDelta(random(layout->StageSize(s))));
    }
  }

  ASSERT_TRUE(ResetPeakRss()) << "/proc/self/clear_refs: cannot measure the peak";
  const uint64_t idle = ProcStatusBytes("VmRSS");
  std::vector<std::pair<std::string, uint64_t>> phases;  // the peak above `idle` after each
  auto phase = [&](const std::string& name) {
    const uint64_t hwm = ProcStatusBytes("VmHWM");
    phases.push_back({name, hwm > idle ? hwm - idle : 0});
  };
  {
    Result<GlobalState> state = DecodeGlobalState(Bytes(start_blob), facts->num_params);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    phase("start state decoded");
    // What Aggregator::Finish evaluates a pipeline round's state with: the weights alone.
    Result<std::unique_ptr<engine::Evaluator>> evaluator = engine::Evaluator::Create(*task, data);
    ASSERT_TRUE(evaluator.ok()) << evaluator.status().ToString();
    phase("evaluator built");
    {
      std::vector<std::vector<std::vector<float>>> deltas(replicas);  // [replica][stage]
      for (uint32_t r = 0; r < replicas; ++r) {
        for (size_t s = 0; s < layout->stages.size(); ++s) {
          const Bytes fetched = stage_blobs[r][s];
          Result<std::vector<float>> d = DecodeDelta(fetched, layout->StageSize(s));
          ASSERT_TRUE(d.ok()) << d.status().ToString();
          deltas[r].push_back(std::move(*d));
        }
      }
      phase("stage deltas decoded");
      std::vector<uint32_t> shards;
      for (uint32_t r = 0; r < replicas; ++r) shards.push_back(r);
      Status applied = ApplyStageRound(&*state, *layout, shards, deltas, *net, facts->content_id, 0,
                                       UnitSamples(*task, *net));
      ASSERT_TRUE(applied.ok()) << applied.ToString();
      phase("round applied");
    }
    ASSERT_TRUE((*evaluator)->SetFlatParams(state->weights).ok());
    const engine::EvalResult eval = (*evaluator)->Evaluate();
    EXPECT_TRUE(std::isfinite(eval.loss));
    phase("evaluated");
    const Bytes encoded = EncodeGlobalState(*state);
    EXPECT_EQ(encoded.size(), start_blob.size());
    phase("new state encoded");
  }
  out->peak = phases.back().second;
  auto mib = [](uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(b) / (1 << 20));
    return std::string(buf);
  };
  std::string report = "idle " + mib(idle) + "; peak above it:";
  for (const auto& [name, bytes] : phases) report += " " + name + " " + mib(bytes) + ",";
  report += " bound " + mib(out->bound) + " (evaluator " + mib(params.eval_memory_bytes) +
            ", model " + mib(params.model_bytes) + ", " + std::to_string(replicas) +
            " replicas); before: " + mib(out->old_bound) + " (unit need " +
            mib(params.memory_bytes) + "; a trainer's gradients and moments " +
            mib(out->trainer_extra) + ")";
  out->report = report;
  std::printf("%s\n", report.c_str());
}

// Every bound a MeasureAggregatorRound must meet: the round's peak within the bound.
void ExpectAggregatorRoundWithinTheBound(const AggregatorRound& r) {
  EXPECT_LE(r.peak, r.bound) << r.report;
}

// A 3.2M GPT's pipeline round (2 replicas x 4 stages) peaks within protocol::AggregatorMemoryBytes.
// Not under ASan, whose allocator keeps what is freed (its quarantine), so that the peak is not
// the round's.
TEST(StageLedgerTest, TheAggregatorsPeakIsWithinTheBound) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan keeps freed memory in its quarantine: the peak is not the round's";
#endif
  AggregatorRound r;
  ASSERT_NO_FATAL_FAILURE(MeasureAggregatorRound(kAggregatorMemoryTask, "/", &r));
  ExpectAggregatorRoundWithinTheBound(r);
  // Below the old bound (a whole unit's training need for the model) by at least what a trainer
  // holds beyond the evaluator, its gradients and AdamW moments (its evaluation forward is of the
  // training step's batch_size windows).
  EXPECT_LT(r.bound, r.old_bound) << r.report;
  EXPECT_GE(r.old_bound - r.bound, r.trainer_extra) << r.report;
}

// The same for a pipeline MLP (Fashion-MNIST 784-256-128-10, 2 replicas x 3 stages). A classifier
// evaluates in chunks of eval_batch_size samples (1000), over 15 times the training step's 64: its
// evaluator's activations are more than a whole unit's training need, so the bound is above the
// old one, which did not hold the evaluator's estimate.
TEST(StageLedgerTest, AnMlpAggregatorsPeakIsWithinTheBound) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan keeps freed memory in its quarantine: the peak is not the round's";
#endif
  AggregatorRound r;
  ASSERT_NO_FATAL_FAILURE(
      MeasureAggregatorRound(MlpTask(1, 2, 1, "mean") + "stages = 3\n", "/", &r));
  ExpectAggregatorRoundWithinTheBound(r);
  EXPECT_GT(r.bound, r.old_bound) << r.report;
}

// The same for a task file named by $MESHLEARN_AGGREGATOR_TASK (examples/code-gpt-pipeline.toml:
// the 10M GPT, whose evaluation takes minutes on one core, so not by default).
TEST(StageLedgerTest, ANamedTasksAggregatorsPeakIsWithinTheBound) {
  const char* path = std::getenv("MESHLEARN_AGGREGATOR_TASK");
  if (path == nullptr) GTEST_SKIP() << "set MESHLEARN_AGGREGATOR_TASK to a pipeline task file";
  Result<std::string> text = Env::Default()->ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  AggregatorRound r;
  ASSERT_NO_FATAL_FAILURE(
      MeasureAggregatorRound(*text, std::filesystem::path(path).parent_path().string(), &r));
  ExpectAggregatorRoundWithinTheBound(r);
}

}  // namespace
}  // namespace meshlearn::node
