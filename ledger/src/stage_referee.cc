#include "meshlearn/ledger/stage_referee.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "meshlearn/base/blob.h"
#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/engine/checkpoint.h"
#include "meshlearn/engine/op_trace.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/ledger/stage_step.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/state_blob.h"
#include "referee_step.h"
#include "witness_codec.h"

namespace meshlearn::ledger {

Result<StageReplaySetup> StageReplaySetupOf(const engine::TaskSpec& task,
                                            const protocol::NetworkSpec& net, double lr_scale,
                                            std::vector<protocol::NodeId> chain) {
  StageReplaySetup setup;
  setup.model = task.model;
  setup.optimizer = engine::UnitOptimizerSpec(task.optimizer, lr_scale);
  ML_ASSIGN_OR_RETURN(setup.cut,
                      engine::TaskPipelineCut(task, static_cast<int>(net.stages), net.cut));
  setup.micro_batches = task.micro_batches;
  setup.chain = std::move(chain);
  return setup;
}

Result<StageStepCheck> JudgeStageStep(const StageReplaySetup& setup,
                                      const protocol::StageStepCommit& commit,
                                      Result<engine::TrainState> start,
                                      const std::map<Hash256, Bytes>& blobs,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      const Hash256& committed_leaf, engine::TrainState* after) {
  StageStepCheck out;
  const std::string name = "replica " + std::to_string(commit.replica) + ", stage " +
                           std::to_string(commit.stage) + ", step " + std::to_string(commit.step);
  if (!start.ok()) {
    // A checkpoint that does not load cannot hash to state_before: the stage's `start` fault.
    out.replay.fault = StageFault::kStageFaultStart;
    out.replay.replica = commit.replica;
    out.replay.stage = commit.stage;
    out.replay.step = commit.step;
    out.replay.claimed = commit.state_before;
    out.leaf = StageFindingLeaf(committed_leaf, out.replay);
    out.message = name + ": start: its checkpoint does not load (" + start.status().message() + ")";
    return out;
  }
  ML_ASSIGN_OR_RETURN(out.replay, ReplayStageStep(setup, std::move(*start), commit, blobs, batch,
                                                  dropout_seed, after));
  out.leaf = StageFindingLeaf(committed_leaf, out.replay);
  out.message = out.replay.ok() ? name + ": replays to its committed leaf" : out.replay.message;
  return out;
}

Result<StageStepCheck> JudgeStageStep(const StageReplaySetup& setup,
                                      const protocol::StageStepCommit& commit, ByteSpan checkpoint,
                                      const std::map<Hash256, Bytes>& blobs,
                                      const engine::Batch& batch, uint64_t dropout_seed,
                                      const Hash256& committed_leaf, engine::TrainState* after) {
  return JudgeStageStep(setup, commit, StageCheckpointState(checkpoint), blobs, batch, dropout_seed,
                        committed_leaf, after);
}

// ---- The witness's encoding.

namespace {

constexpr std::string_view kStageWitnessMagic = "meshlearn.stage_step_witness.v1";

}  // namespace

Bytes EncodeStageStepWitness(const StageStepWitness& w) {
  Encoder e;
  e.PutString(kStageWitnessMagic).PutString(w.bundle).PutBytes(w.commit).PutBytes(w.checkpoint);
  e.PutU32(static_cast<uint32_t>(w.received.size()));
  for (const Bytes& b : w.received) e.PutBytes(b);
  PutWitnessPages(e, w.pages);
  PutWitnessExamples(e, w.examples);
  return e.Take();
}

Result<StageStepWitness> DecodeStageStepWitness(ByteSpan bytes) {
  if (bytes.size() > kMaxWitnessBytes) {
    return InvalidArgument("stage step witness: " + std::to_string(bytes.size()) +
                           " bytes, over the limit of " + std::to_string(kMaxWitnessBytes) +
                           " (a stage whose state does not fit is ruled by the genesis referee)");
  }
  Decoder d(bytes, "stage step witness");
  ML_RETURN_IF_ERROR(GetWitnessMagic(d, "stage step witness", kStageWitnessMagic));
  StageStepWitness w;
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));  // as a step witness's
  ML_RETURN_IF_ERROR(d.GetBytes(&w.commit, "commit", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.checkpoint, "checkpoint", kMaxWitnessBytes));
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "received", kMaxWitnessItems, 4));
  w.received.resize(n);
  for (Bytes& b : w.received) ML_RETURN_IF_ERROR(d.GetBytes(&b, "received", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(GetWitnessPages(d, &w.pages));
  ML_RETURN_IF_ERROR(GetWitnessExamples(d, &w.examples));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

namespace {

constexpr std::string_view kStageResultWitnessMagic = "meshlearn.stage_result_witness.v1";

}  // namespace

Bytes EncodeStageResultWitness(const StageResultWitness& w) {
  Encoder e;
  e.PutString(kStageResultWitnessMagic)
      .PutString(w.bundle)
      .PutBytes(w.start_state)
      .PutBytes(w.commit)
      .PutBytes(w.state);
  return e.Take();
}

Result<StageResultWitness> DecodeStageResultWitness(ByteSpan bytes) {
  if (bytes.size() > kMaxWitnessBytes) {
    return InvalidArgument("stage result witness: " + std::to_string(bytes.size()) +
                           " bytes, over the limit of " + std::to_string(kMaxWitnessBytes));
  }
  Decoder d(bytes, "stage result witness");
  ML_RETURN_IF_ERROR(
      GetWitnessMagic(d, "stage result witness", kStageResultWitnessMagic,
                      " (a pipeline task's ProveResult carries a StageResultWitness)"));
  StageResultWitness w;
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.start_state, "start_state", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.commit, "commit", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.state, "state", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Result<Hash256> StageResultBlobId(const engine::ModelSpec& model, std::span<const float> global,
                                  const engine::TrainState& final_state) {
  return StageResultBlobId(
      model, global.size(),
      [global](uint64_t offset, std::span<float> out) {
        std::copy_n(global.begin() + static_cast<std::ptrdiff_t>(offset), out.size(), out.begin());
        return Status::Ok();
      },
      final_state);
}

Result<Hash256> StageResultBlobId(const engine::ModelSpec& model, uint64_t global_size,
                                  const GlobalSliceReader& read,
                                  const engine::TrainState& final_state) {
  ML_ASSIGN_OR_RETURN(std::vector<engine::PlannedParam> planned, engine::PlanParams(model));
  std::map<std::string, std::pair<size_t, size_t>> at;  // name -> (offset, size) in the weights
  size_t offset = 0;
  for (const engine::PlannedParam& p : planned) {
    const size_t n = static_cast<size_t>(engine::NumElements(p.shape));
    at[p.name] = {static_cast<size_t>(p.offset), n};
    offset = static_cast<size_t>(p.offset) + n;
  }
  if (offset != global_size) {
    return InvalidArgument("stage result: the round's start state holds " +
                           std::to_string(global_size) + " weights, the model has " +
                           std::to_string(offset));
  }
  // DeltaBlobId of the stage's delta (its start weights minus its parameters, in params()
  // order), built a piece at a time: the delta blob's header, then each piece of the delta.
  uint64_t total = 0;
  for (const engine::Param& p : final_state.model->params()) {
    const auto it = at.find(p.name);
    if (it == at.end() || it->second.second != static_cast<size_t>(p.value.size())) {
      return InvalidArgument("stage result: the stage's parameter '" + p.name + "' (" +
                             std::to_string(p.value.size()) +
                             " values) is not one of the task's model");
    }
    total += it->second.second;
  }
  ManifestBuilder blob;
  blob.Append(protocol::EncodeDeltaHeader(total));
  constexpr size_t kPiece = kDefaultChunkSize / sizeof(float);
  std::vector<float> delta;
  for (const engine::Param& p : final_state.model->params()) {
    const auto [begin, count] = at.at(p.name);
    const std::span<const float> params = p.value.vec();
    for (size_t from = 0; from < count; from += kPiece) {
      const size_t n = std::min(kPiece, count - from);
      delta.resize(n);
      ML_RETURN_IF_ERROR(
          read(begin + from, delta)
              .WithPrefix("stage result: the round's start weights of '" + p.name + "'"));
      protocol::PseudoGradientInPlace(delta, params.subspan(from, n));
      blob.Append(protocol::DeltaFloatBytes(delta));
    }
  }
  return blob.Finish().id().hash;
}

bool LedgerRulesStageStep(const TaskParams& p, uint32_t stage) {
  return IsPipelineTask(p) && !p.data_root.IsZero() && stage < p.stage_memory_bytes.size() &&
         p.stage_memory_bytes[stage] <= kMaxStageWitnessMemory;
}

Result<StageStepWitness> BuildStageStepWitness(
    const std::string& bundle, const protocol::StageStepCommit& commit, const Bytes& checkpoint,
    const std::map<Hash256, Bytes>& blobs, const engine::TaskSpec& task, uint64_t stream,
    const engine::TokenPageTree* pages, const engine::ClassificationData* train,
    const engine::DataTree* tree) {
  StageStepWitness w;
  w.bundle = bundle;
  w.commit = protocol::EncodeStageStepCommit(commit);
  w.checkpoint = checkpoint;
  for (const protocol::StageTransfer& t : commit.received) {
    auto it = blobs.find(t.tensor);
    if (it == blobs.end()) {
      return FailedPrecondition("stage step witness: the received tensor " + t.tensor.ShortHex() +
                                " (" + t.key.ToString() + ") was not served");
    }
    w.received.push_back(it->second);
  }
  const int64_t step = static_cast<int64_t>(commit.step);
  if (pages != nullptr) {
    w.pages = ProvenPages(*pages, StepBatchPages(task, stream, step, pages->num_tokens()));
  } else if (train != nullptr && tree != nullptr) {
    const int64_t per = train->size() == 0 ? 0 : train->x.size() / train->size();
    for (int64_t i :
         engine::BatchIndices(task.seed, stream, train->size(), task.batch_size, step)) {
      const float* x = train->x.data() + i * per;
      w.examples.push_back({.index = static_cast<uint64_t>(i),
                            .x = std::vector<float>(x, x + per),
                            .y = train->y[static_cast<size_t>(i)],
                            .proof = tree->Prove(i)});
    }
  } else {
    return FailedPrecondition(
        "stage step witness: no data to prove the step's batch with (a token task's page tree, "
        "or a classification task's examples and data tree)");
  }
  return w;
}

Result<std::vector<protocol::NodeId>> ReplicaRunChain(std::span<const StagePlacement> placed,
                                                      uint32_t stage, const Hash256& beacon) {
  if (stage >= placed.size()) {
    return InvalidArgument("replica chain: stage " + std::to_string(stage) + " of a replica of " +
                           std::to_string(placed.size()) + " stages");
  }
  std::vector<protocol::NodeId> chain;
  for (uint32_t s = 0; s < placed.size(); ++s) {
    if (placed[s].beacon != beacon || placed[s].node == protocol::NodeId{}) {
      return FailedPrecondition(
          "replica chain: stage " + std::to_string(s) + "'s unit " +
          (placed[s].node == protocol::NodeId{}
               ? std::string("has no node")
               : "is on node " + placed[s].node.ShortHex() + ", placed with beacon " +
                     placed[s].beacon.ShortHex()) +
          ", not of the run of stage " + std::to_string(stage) + " placed with beacon " +
          beacon.ShortHex() +
          ": the replica was placed again since that run, whose records no chain judges now");
    }
    chain.push_back(placed[s].node);
  }
  return chain;
}

std::string StageStepWhere(std::string_view what, const TaskRecord& t, const WorkUnit& unit,
                           uint64_t step, std::string_view claim) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  return std::string(what) + " (task " + t.id.ShortHex() + ", unit " + std::to_string(unit.index) +
         ": replica " + std::to_string(slot.replica) + ", stage " + std::to_string(slot.stage) +
         ", step " + std::to_string(step) + (claim.empty() ? "" : ": " + std::string(claim)) + ")";
}

Result<StageStepCheck> RuleStageStepWitness(const TaskRecord& t, const WorkUnit& unit,
                                            uint64_t step, const Hash256& committed_leaf,
                                            const std::vector<protocol::NodeId>& chain,
                                            const StageStepWitness& w, std::string_view what) {
  const StageSlot slot = StageSlotOf(t.params, unit.index);
  const std::string where = StageStepWhere(what, t, unit, step);
  ML_ASSIGN_OR_RETURN(TaskBundleSpec b, ParseTaskBundle(t, w.bundle, where));
  // The commit: the one the stage committed for this step.
  Result<protocol::StageStepCommit> commit = protocol::DecodeStageStepCommit(w.commit);
  if (!commit.ok()) return InvalidArgument(where + ": commit: " + commit.status().message());
  const Hash256 leaf = protocol::StageStepLeaf(*commit);
  if (leaf != committed_leaf) {
    return InvalidArgument(where + ": the witness's commit has leaf " + leaf.ShortHex() +
                           ", the stage committed " + committed_leaf.ShortHex() +
                           " for the step; send the commit the stage node serves for it");
  }
  if (commit->task != t.id || commit->round != slot.round || commit->replica != slot.replica ||
      commit->stage != slot.stage || commit->stages != t.params.stages || commit->step != step) {
    // The stage committed a leaf of another step: what the verifier's CheckStageStep finds when
    // the served commit is not of the step asked (`unserved`); it rules the same.
    StageStepCheck out;
    out.replay.fault = StageFault::kStageFaultUnserved;
    out.leaf = StageUnservedLeaf(committed_leaf);
    out.message = where + ": unserved: the committed leaf is of another step's commit";
    return out;
  }
  // The received tensors: each the one its signed record names (the poster's to get right: a
  // tensor the sender did not sign proves nothing about the stage).
  if (w.received.size() != commit->received.size()) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.received.size()) +
                           " received tensors, the commit lists " +
                           std::to_string(commit->received.size()) +
                           " records; send the tensor of every received record, in order");
  }
  std::map<Hash256, Bytes> blobs;
  for (size_t i = 0; i < w.received.size(); ++i) {
    const protocol::StageTransfer& r = commit->received[i];
    const Bytes& bytes = w.received[i];
    Status st = bytes.size() % 4 != 0
                    ? InvalidArgument(std::to_string(bytes.size()) + " bytes, not whole float32s")
                    : protocol::CheckReceivedTensor(
                          r, engine::TensorHash(StageTensorFromBytes(bytes)), bytes.size());
    if (!st.ok()) {
      return InvalidArgument(where + ": received tensor " + std::to_string(i) + " (" +
                             r.key.ToString() + ") does not match its signed record: " +
                             st.message() + "; send the tensor the sender signed");
    }
    blobs[r.tensor] = bytes;
  }
  // The checkpoint: the stage's state at the step's start.
  Result<engine::TrainState> start = StageCheckpointState(w.checkpoint);
  if (!start.ok()) {
    return InvalidArgument(where + ": checkpoint: " + start.status().message() +
                           "; send the stage's checkpoint of the step's start");
  }
  const Hash256 before = engine::StateHash(*start);
  if (before != commit->state_before || static_cast<uint64_t>(start->step) != step) {
    return InvalidArgument(where + ": the checkpoint (step " + std::to_string(start->step) +
                           ") hashes to " + before.ShortHex() + ", the commit starts from " +
                           commit->state_before.ShortHex() +
                           "; send the stage's checkpoint of the step's start");
  }
  // The unit's work as its stages train it, and the step's batch proven in the data.
  const protocol::UnitWork work = protocol::UnitWorkOf(
      b.net, b.spec.seed, engine::TaskContentId(b.spec), slot.round, slot.replica);
  engine::Batch batch;
  if (t.params.data_page_tokens != 0) {
    if (!w.examples.empty()) {
      return InvalidArgument(where +
                             ": the witness has examples; a token task's batch is proven "
                             "by its pages");
    }
    ML_ASSIGN_OR_RETURN(
        batch, WitnessTokenBatch(b.spec, work.stream, t.params.num_examples, t.params.data_root,
                                 static_cast<int64_t>(step), w.pages, where));
  } else {
    if (!w.pages.empty()) {
      return InvalidArgument(where +
                             ": the witness has token pages; a classification task's "
                             "batch is proven by its examples");
    }
    Result<std::unique_ptr<engine::Model>> m = engine::Model::Create(b.spec.model);
    if (!m.ok()) return FailedPrecondition(where + ": " + m.status().message());
    ML_ASSIGN_OR_RETURN(
        batch, WitnessBatch(b.spec, work.stream, (*m)->NumOutputs(), t.params.num_examples,
                            t.params.data_root, static_cast<int64_t>(step), w.examples, where));
  }
  ML_ASSIGN_OR_RETURN(StageReplaySetup setup,
                      StageReplaySetupOf(b.spec, b.net, work.lr_scale, chain));
  Result<StageStepCheck> out =
      JudgeStageStep(setup, *commit, w.checkpoint, blobs, batch,
                     engine::DropoutSeed(b.spec.seed, work.stream), committed_leaf);
  if (!out.ok()) return FailedPrecondition(where + ": " + out.status().message());
  return out;
}

const protocol::StageTransfer* StageInputRecord(const engine::TilePlan& plan, int64_t op,
                                                const protocol::StageStepCommit& commit) {
  if (op < 0 || op >= static_cast<int64_t>(plan.ops.size())) return nullptr;
  const engine::TileOp& o = plan.ops[static_cast<size_t>(op)];
  if (!o.received) return nullptr;
  // "[mb<m>.]recv.<kind>": the micro-batch prefix only in a step of M > 1 micro-batches.
  int64_t micro_batch = -1;
  std::string_view name = o.name;
  if (name.starts_with("mb")) {
    const size_t dot = name.find('.');
    micro_batch = std::stoll(std::string(name.substr(2, dot - 2)));
    name.remove_prefix(dot + 1);
  }
  if (!name.starts_with("recv.")) return nullptr;
  name.remove_prefix(5);
  for (const protocol::StageTransfer& r : commit.received) {
    if (r.key.to_stage != commit.stage || name != protocol::StageTensorKindName(r.key.kind)) {
      continue;
    }
    // A one-micro-batch step names no micro-batch: its per-micro-batch records are of 0.
    const int64_t want =
        protocol::StageTensorPerMicroBatch(r.key.kind) && micro_batch < 0 ? 0 : micro_batch;
    if (r.key.micro_batch == want) return &r;
  }
  return nullptr;
}

bool TiledAsOperator(const protocol::StageTransfer& record, const engine::TileOp& op) {
  return record.bytes % 4 == 0 && engine::StageTensorGrid(static_cast<int64_t>(record.bytes / 4),
                                                          record.tile_cols) == op.grid;
}

Status CheckStageInputRoots(const engine::TilePlan& plan, const protocol::StageStepCommit& commit,
                            std::span<const Hash256> outputs) {
  for (size_t j = 0; j < outputs.size() && j < plan.ops.size(); ++j) {
    const engine::TileOp& o = plan.ops[j];
    if (!o.received) continue;
    const protocol::StageTransfer* r = StageInputRecord(plan, static_cast<int64_t>(j), commit);
    const std::string what = "operator " + std::to_string(j + 1) + " (" + o.name + ")";
    if (r == nullptr) {
      return InvalidArgument(what + ": the commit lists no received record of it");
    }
    if (!TiledAsOperator(*r, o)) {
      return InvalidArgument(what + ": its record of " + std::to_string(r->bytes) +
                             " bytes is tiled in rows of " + std::to_string(r->tile_cols) +
                             " floats, not in the operator's " + std::to_string(o.grid.rows) +
                             " x " + std::to_string(o.grid.cols));
    }
    if (outputs[j] != r->tiles) {
      return InvalidArgument(what + ": root " + outputs[j].ShortHex() +
                             ", the sender signed the tiled root " + r->tiles.ShortHex() + " (" +
                             r->key.ToString() + ")");
    }
  }
  return Status::Ok();
}

// ---- A stage step's tile phase on chain.

namespace {

constexpr std::string_view kStageRootsWitnessMagic = "meshlearn.stage_roots_witness.v1";
// As a dispute's operators (protocol/unit_check.cc kMaxTileOperators).
constexpr uint32_t kMaxStageRoots = 1u << 12;

// The last operator of `plan` whose name `match`es: a micro-batch's last forward block, or its
// first block's gradient (the backward runs from the top block down).
template <typename Match>
int64_t LastOpWhere(const engine::TilePlan& plan, Match match) {
  for (size_t j = plan.ops.size(); j-- > 0;) {
    if (match(plan.ops[j].name)) return static_cast<int64_t>(j);
  }
  return -1;
}

int64_t OpNamed(const engine::TilePlan& plan, const std::string& name) {
  return LastOpWhere(plan, [&](const std::string& n) { return n == name; });
}

// "mb<m>." in a step of M > 1 micro-batches (OpTrace's name prefix), else nothing.
std::string MicroBatchPrefix(const engine::TilePlan& plan, int64_t m) {
  return plan.micro_batches > 1 ? "mb" + std::to_string(m) + "." : std::string();
}

size_t ReceivedOperators(const engine::TilePlan& plan) {
  return static_cast<size_t>(std::count_if(plan.ops.begin(), plan.ops.end(),
                                           [](const engine::TileOp& o) { return o.received; }));
}

}  // namespace

int64_t StageSentOperator(const engine::TilePlan& plan, const protocol::StageTensorKey& key) {
  using protocol::StageTensorKind;
  const std::string wte = engine::kGptWteName;
  switch (key.kind) {
    case StageTensorKind::kStageTensorActivation:
    case StageTensorKind::kStageTensorActivationGrad: {
      // A GPT's (token plan's) last block's residual3 and first block's residual.grad; a
      // sequential model's last layer output and its first layer's input gradient (the backward
      // runs down the layers: the micro-batch's last one). A sequential stage with no such
      // operator (a lone flatten: what it records neither) passes on what it received.
      const bool forward = key.kind == StageTensorKind::kStageTensorActivation;
      const std::string prefix = MicroBatchPrefix(plan, key.micro_batch);
      const std::string_view suffix = plan.tokens ? (forward ? ".residual3" : ".residual.grad")
                                                  : (forward ? ".out" : ".in.grad");
      const std::string_view layer = plan.tokens ? "h." : "layers.";
      const int64_t op = LastOpWhere(plan, [&](std::string_view n) {
        return n.starts_with(prefix) && n.ends_with(suffix) && n.find(layer) != n.npos;
      });
      if (op >= 0 || plan.tokens) return op;
      return OpNamed(plan, prefix + (forward ? "recv.activation" : "recv.activation_grad"));
    }
    case StageTensorKind::kStageTensorTiedWeight:
      return OpNamed(plan, "in." + wte);
    case StageTensorKind::kStageTensorTiedHeadGrad:
      return OpNamed(plan, MicroBatchPrefix(plan, plan.micro_batches - 1) + wte + ".head.grad");
    case StageTensorKind::kStageTensorGradSquares:
    case StageTensorKind::kStageTensorGradTotal:
      return OpNamed(plan, "grad_squares");
  }
  return -1;
}

size_t StageSentRecordCount(const engine::TilePlan& plan, uint32_t stage, uint32_t stages) {
  const bool first = stage == 0, last = stage + 1 == stages;
  const bool clipped = plan.optimizer.grad_clip > 0;
  const auto M = static_cast<size_t>(plan.micro_batches);
  size_t n = 0;
  if (!last) n += M + (clipped ? 1 : 0);  // the activations and the running sum, to s+1
  if (!first) n += M;                     // the activations' gradients, to s-1
  // A tied head: wte to the last stage, its gradient back to stage 0 (each plan receives the
  // other's); the total sum of squares from the last stage to every other one.
  if (first && !last && OpNamed(plan, "recv.tied_head_grad") >= 0) ++n;
  if (last && !first && OpNamed(plan, "recv.tied_weight") >= 0) ++n;
  if (last && !first && clipped) n += stages - 1;
  return n;
}

Status StageCommitFollowsFromRoots(const TileRuleContext& ctx,
                                   const protocol::StageStepCommit& commit, uint64_t seed,
                                   uint64_t stream, std::span<const Hash256> outputs) {
  const engine::TilePlan& plan = ctx.plan;
  const size_t n = plan.ops.size(), k = StateOperators(plan);
  if (outputs.size() != n || k == 0 || 2 * k > n) {
    return InvalidArgument(std::to_string(outputs.size()) + " roots for a plan of " +
                           std::to_string(n) + " operators, " + std::to_string(k) +
                           " of its state");
  }
  const auto step = static_cast<int64_t>(commit.step);
  if (engine::StateHashOfRoots(step, seed, stream, outputs.first(k)) != commit.state_before) {
    return InvalidArgument("the state roots do not give the commit's state_before " +
                           commit.state_before.ShortHex());
  }
  // The step leaves the tensors it started from, in the same order, as its last k operators.
  for (size_t i = 0; i < k; ++i) {
    if ("in." + plan.ops[n - k + i].name != plan.ops[i].name) {
      return FailedPrecondition("operator " + std::to_string(n - k + i + 1) + " (" +
                                plan.ops[n - k + i].name + ") is not the state tensor " +
                                plan.ops[i].name + " after the step");
    }
  }
  const Hash256 after = engine::StateHashOfRoots(step + 1, seed, stream, outputs.last(k));
  if (after != commit.state_after) {
    return InvalidArgument("the roots give the state after the step " + after.ShortHex() +
                           ", the commit's state_after is " + commit.state_after.ShortHex());
  }
  ML_RETURN_IF_ERROR(CheckStageInputRoots(plan, commit, outputs));
  if (commit.received.size() != ReceivedOperators(plan)) {
    return InvalidArgument("the commit lists " + std::to_string(commit.received.size()) +
                           " received records, the step receives " +
                           std::to_string(ReceivedOperators(plan)));
  }
  const size_t sends = StageSentRecordCount(plan, commit.stage, commit.stages);
  if (commit.sent.size() != sends) {
    return InvalidArgument("the commit lists " + std::to_string(commit.sent.size()) +
                           " sent records, the step sends " + std::to_string(sends));
  }
  for (const protocol::StageTransfer& r : commit.sent) {
    const int64_t op = StageSentOperator(plan, r.key);
    if (op < 0) return InvalidArgument(r.key.ToString() + ": no operator of the step sends it");
    const std::string what = r.key.ToString() + " (operator " + std::to_string(op + 1) + ", " +
                             plan.ops[static_cast<size_t>(op)].name + ")";
    if (!TiledAsOperator(r, plan.ops[static_cast<size_t>(op)])) {
      return InvalidArgument(what + ": " + std::to_string(r.bytes) + " bytes tiled in rows of " +
                             std::to_string(r.tile_cols) + " floats, not in the operator's " +
                             std::to_string(plan.ops[static_cast<size_t>(op)].grid.rows) + " x " +
                             std::to_string(plan.ops[static_cast<size_t>(op)].grid.cols));
    }
    if (r.tiles != outputs[static_cast<size_t>(op)]) {
      return InvalidArgument(what + ": the stage signed the tiled root " + r.tiles.ShortHex() +
                             ", the operator's root is " +
                             outputs[static_cast<size_t>(op)].ShortHex());
    }
  }
  return Status::Ok();
}

Bytes EncodeStageRootsWitness(const StageRootsWitness& w) {
  Encoder e;
  e.PutString(kStageRootsWitnessMagic).PutBytes(w.commit).PutU64(w.seed).PutU64(w.stream);
  e.PutU32(static_cast<uint32_t>(w.outputs.size()));
  for (const Hash256& h : w.outputs) e.PutHash(h);
  return e.Take();
}

Result<StageRootsWitness> DecodeStageRootsWitness(ByteSpan bytes) {
  Decoder d(bytes, "stage roots witness");
  ML_RETURN_IF_ERROR(GetWitnessMagic(d, "stage roots witness", kStageRootsWitnessMagic));
  StageRootsWitness w;
  ML_RETURN_IF_ERROR(d.GetBytes(&w.commit, "commit", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetU64(&w.seed, "seed"));
  ML_RETURN_IF_ERROR(d.GetU64(&w.stream, "stream"));
  uint32_t n = 0;
  ML_RETURN_IF_ERROR(d.GetCount(&n, "outputs", kMaxStageRoots, 32));
  w.outputs.resize(n);
  for (Hash256& h : w.outputs) ML_RETURN_IF_ERROR(d.GetHash(&h, "outputs"));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Result<StageRootsWitness> BuildStageRootsWitness(const TileRuleContext& ctx,
                                                 const protocol::RefereeTask& task,
                                                 const engine::OpTrace& trace,
                                                 const protocol::StageStepCommit& commit,
                                                 uint64_t seed, uint64_t stream) {
  const engine::TilePlan& plan = ctx.plan;
  if (!RulesFromRoots(plan, task)) {
    return FailedPrecondition("stage roots witness: the referee task (step " +
                              std::to_string(task.step) +
                              ") is not a whole step ruled from this step's roots");
  }
  if (trace.size() != plan.ops.size()) {
    return FailedPrecondition("stage roots witness: the trace of the step has " +
                              std::to_string(trace.size()) + " operators, the stage's plan " +
                              std::to_string(plan.ops.size()));
  }
  StageRootsWitness w{EncodeStageStepCommit(commit), seed, stream, {}};
  // A received operator is ruled from its record alone.
  const bool received = task.roots == protocol::RefereeRoots::kRootsOperator &&
                        plan.ops[task.operator_index - 1].received;
  const size_t m = task.roots == protocol::RefereeRoots::kRootsChainEnd ? plan.ops.size()
                   : received                                           ? 0
                                                                        : StateOperators(plan);
  w.outputs.assign(trace.hashes().begin(), trace.hashes().begin() + static_cast<ptrdiff_t>(m));
  return w;
}

Result<Hash256> RuleStageRoots(const TileRuleContext& ctx, const protocol::RefereeTask& task,
                               const Hash256& task_id, const StageSlot& slot, uint32_t stages,
                               const std::vector<protocol::NodeId>& chain,
                               const StageRootsWitness& w) {
  const engine::TilePlan& plan = ctx.plan;
  const std::string where = "stage roots rule (step " + std::to_string(task.step) + ")";
  if (task.roots == protocol::RefereeRoots::kRootsNone || task.step == 0 ||
      !RulesFromRoots(plan, task)) {
    return FailedPrecondition(where + ": the referee task is not a stage step ruled from roots");
  }
  Result<protocol::StageStepCommit> commit = protocol::DecodeStageStepCommit(w.commit);
  if (!commit.ok()) return InvalidArgument(where + ": commit: " + commit.status().message());
  const Hash256 leaf = protocol::StageStepLeaf(*commit);
  if (leaf != task.defender_output) {
    return InvalidArgument(where + ": the witness's commit has leaf " + leaf.ShortHex() +
                           ", the stage committed " + task.defender_output.ShortHex() +
                           "; send the commit the stage node serves for the step");
  }
  const bool end = task.roots == protocol::RefereeRoots::kRootsChainEnd;
  const size_t n = plan.ops.size(), k = StateOperators(plan);
  const bool received = !end && plan.ops[task.operator_index - 1].received;
  const size_t want = end ? n : received ? 0 : k;
  if (w.outputs.size() != want) {
    return InvalidArgument(where + ": the witness has " + std::to_string(w.outputs.size()) +
                           " roots; " +
                           (end        ? "the agreed chain end needs all " + std::to_string(n)
                            : received ? std::string("a received operator is ruled from its "
                                                     "record alone: none")
                                       : "the stage's state has " + std::to_string(k)));
  }
  if (end) {
    Hash256 c = task.input;
    for (const Hash256& out : w.outputs) c = protocol::OperatorChainHash(c, out);
    if (c != task.chain_end) {
      return InvalidArgument(where + ": the witness's roots chain to " + c.ShortHex() +
                             ", not to the agreed C_" + std::to_string(n) + " " +
                             task.chain_end.ShortHex());
    }
  }
  // The stage's own faults rule against it, whatever the roots: a committed leaf of another
  // step's commit (`unserved`), a record the replica's chain did not sign (`record`).
  const Hash256& against = end ? task.challenger_output : task.challenger_operator_output;
  if (commit->task != task_id || commit->round != slot.round || commit->replica != slot.replica ||
      commit->stage != slot.stage || commit->stages != stages || commit->step != task.step - 1 ||
      !protocol::VerifyStageStepSignatures(*commit, chain).ok()) {
    return against;
  }
  if (received) {
    const protocol::StageTransfer* r =
        StageInputRecord(plan, static_cast<int64_t>(task.operator_index) - 1, *commit);
    if (r == nullptr || !TiledAsOperator(*r, plan.ops[task.operator_index - 1])) {
      return against;  // `missing`
    }
    return protocol::OperatorChainHash(task.operator_input, r->tiles);
  }
  // The stage state's roots: they must give the commit's state_before (with the state's seed and
  // stream), the start both parties traced from.
  const std::span<const Hash256> state = std::span<const Hash256>(w.outputs).first(k);
  if (engine::StateHashOfRoots(static_cast<int64_t>(commit->step), w.seed, w.stream, state) !=
      commit->state_before) {
    return InvalidArgument(where + ": the witness's " + std::to_string(k) + " state roots (seed " +
                           std::to_string(w.seed) + ", stream " + std::to_string(w.stream) +
                           ") do not give the commit's state_before " +
                           commit->state_before.ShortHex());
  }
  if (!end) return protocol::OperatorChainHash(task.operator_input, state[task.operator_index - 1]);
  Status follows = StageCommitFollowsFromRoots(ctx, *commit, w.seed, w.stream, w.outputs);
  if (follows.code() == StatusCode::kFailedPrecondition) return follows;
  return follows.ok() ? task.defender_output : against;
}

Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       uint64_t global_size,
                                                       const GlobalSliceReader& read,
                                                       double lr_scale) {
  ML_ASSIGN_OR_RETURN(std::vector<engine::PlannedParam> planned, engine::PlanParams(task.model));
  const int64_t count =
      planned.empty() ? 0 : planned.back().offset + engine::NumElements(planned.back().shape);
  if (static_cast<int64_t>(global_size) != count) {
    return InvalidArgument("stage " + std::to_string(stage) +
                           " from the global weights: " + std::to_string(global_size) +
                           " values for a model of " + std::to_string(count) + " parameters");
  }
  std::map<std::string, const engine::PlannedParam*> by_name;
  for (const engine::PlannedParam& p : planned) by_name[p.name] = &p;
  ML_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Stage> st,
      engine::Stage::Create(task.model, engine::UnitOptimizerSpec(task.optimizer, lr_scale), cut,
                            stage, task.micro_batches));
  for (engine::Param& p : st->params()) {
    const engine::PlannedParam& at = *by_name.at(p.name);  // a part's names are the model's
    CHECK(p.value.shape() == at.shape) << p.name;
    ML_RETURN_IF_ERROR(read(static_cast<uint64_t>(at.offset),
                            std::span<float>(p.value.data(), static_cast<size_t>(p.value.size()))));
  }
  return st;
}

namespace {

constexpr std::string_view kStageContinuityWitnessMagic = "meshlearn.stage_continuity_witness.v1";
constexpr std::string_view kStageRecordWitnessMagic = "meshlearn.stage_record_witness.v1";

}  // namespace

Bytes EncodeStageContinuityWitness(const StageContinuityWitness& w) {
  Encoder e;
  e.PutString(kStageContinuityWitnessMagic)
      .PutBytes(w.commit)
      .PutBytes(w.previous)
      .PutString(w.bundle)
      .PutBytes(w.start_state);
  return e.Take();
}

bool IsStageContinuityWitness(ByteSpan bytes) {
  return HasWitnessMagic(bytes, kStageContinuityWitnessMagic);
}

Result<StageContinuityWitness> DecodeStageContinuityWitness(ByteSpan bytes) {
  if (bytes.size() > kMaxWitnessBytes) {
    return InvalidArgument("stage continuity witness: " + std::to_string(bytes.size()) +
                           " bytes, over the limit of " + std::to_string(kMaxWitnessBytes));
  }
  Decoder d(bytes, "stage continuity witness");
  ML_RETURN_IF_ERROR(GetWitnessMagic(d, "stage continuity witness", kStageContinuityWitnessMagic));
  StageContinuityWitness w;
  ML_RETURN_IF_ERROR(d.GetBytes(&w.commit, "commit", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.previous, "previous", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetString(&w.bundle, "bundle", 1u << 20));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.start_state, "start_state", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

Bytes EncodeStageRecordWitness(const StageRecordWitness& w) {
  Encoder e;
  e.PutString(kStageRecordWitnessMagic).PutBytes(w.commit).PutU32(w.record).PutBytes(w.other);
  return e.Take();
}

bool IsStageRecordWitness(ByteSpan bytes) {
  return HasWitnessMagic(bytes, kStageRecordWitnessMagic);
}

Result<StageRecordWitness> DecodeStageRecordWitness(ByteSpan bytes) {
  if (bytes.size() > kMaxWitnessBytes) {
    return InvalidArgument("stage record witness: " + std::to_string(bytes.size()) +
                           " bytes, over the limit of " + std::to_string(kMaxWitnessBytes));
  }
  Decoder d(bytes, "stage record witness");
  ML_RETURN_IF_ERROR(GetWitnessMagic(d, "stage record witness", kStageRecordWitnessMagic));
  StageRecordWitness w;
  ML_RETURN_IF_ERROR(d.GetBytes(&w.commit, "commit", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.GetU32(&w.record, "record"));
  ML_RETURN_IF_ERROR(d.GetBytes(&w.other, "other", kMaxWitnessBytes));
  ML_RETURN_IF_ERROR(d.Finish());
  return w;
}

}  // namespace meshlearn::ledger
