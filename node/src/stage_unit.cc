#include "meshlearn/node/stage_unit.h"

#include <cmath>
#include <map>
#include <string>

#include "meshlearn/base/check.h"
#include "meshlearn/engine/step_replay.h"
#include "meshlearn/ledger/step_witness.h"
#include "meshlearn/protocol/aggregate.h"
#include "meshlearn/protocol/stage_transfer.h"

namespace meshlearn::node {

void CopyWholeParams(const engine::Model& whole, engine::Stage& stage) {
  std::map<std::string, const engine::Tensor*> by_name;
  for (const engine::Param& p : whole.params()) by_name[p.name] = &p.value;
  for (engine::Param& p : stage.params()) p.value.vec() = by_name.at(p.name)->vec();
}

std::vector<float> StageFlatParams(engine::Stage& stage) {
  std::vector<float> flat;
  for (const engine::Param& p : stage.params()) {
    flat.insert(flat.end(), p.value.vec().begin(), p.value.vec().end());
  }
  return flat;
}

Result<std::vector<float>> GatherStageFlats(const engine::Model& whole,
                                            std::span<const std::unique_ptr<engine::Stage>> layout,
                                            std::span<const std::vector<float>> flats) {
  if (layout.size() != flats.size()) {
    return InvalidArgument("gather stage deltas: " + std::to_string(flats.size()) +
                           " stage vectors for " + std::to_string(layout.size()) + " stages");
  }
  // Where each parameter's values sit in its stage's flat vector.
  std::map<std::string, std::span<const float>> by_name;
  for (size_t s = 0; s < layout.size(); ++s) {
    size_t at = 0;
    for (const engine::Param& p : layout[s]->params()) {
      const size_t n = p.value.vec().size();
      if (at + n > flats[s].size()) break;
      by_name[p.name] = std::span<const float>(flats[s]).subspan(at, n);
      at += n;
    }
    if (at != flats[s].size()) {
      return InvalidArgument("gather stage deltas: stage " + std::to_string(s) + " holds " +
                             std::to_string(at) + " parameters, its vector " +
                             std::to_string(flats[s].size()));
    }
  }
  std::vector<float> out;
  for (const engine::Param& p : whole.params()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      return InvalidArgument("gather stage deltas: parameter " + p.name + " is in no stage");
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::vector<float> GatherStageParams(const engine::Model& whole,
                                     std::span<const std::unique_ptr<engine::Stage>> stages) {
  std::vector<std::vector<float>> flats;
  for (const std::unique_ptr<engine::Stage>& st : stages) flats.push_back(StageFlatParams(*st));
  Result<std::vector<float>> out = GatherStageFlats(whole, stages, flats);
  CHECK(out.ok()) << out.status().ToString();
  return std::move(*out);
}

Status AddPipelineTerms(const engine::TaskSpec& task, const NetworkSpec& net,
                        ledger::TaskParams* params) {
  if (net.stages <= 1) return Status::Ok();
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(task, static_cast<int>(net.stages), net.cut));
  ML_ASSIGN_OR_RETURN(std::vector<engine::StageCost> costs,
                      engine::CutCosts(task.model, task.optimizer, cut, task.batch_size,
                                       task.seq_len, task.micro_batches));
  params->stage_memory_bytes.clear();
  params->stage_flops.clear();
  for (const engine::StageCost& c : costs) {
    params->stage_memory_bytes.push_back(static_cast<uint64_t>(std::ceil(c.total_bytes())));
    params->stage_flops.push_back(c.flops);
  }
  return Status::Ok();
}

Result<std::unique_ptr<engine::Stage>> StageFromGlobal(const engine::TaskSpec& task,
                                                       const engine::PipelineCut& cut, int stage,
                                                       const engine::Model& whole,
                                                       double lr_scale) {
  ML_ASSIGN_OR_RETURN(std::unique_ptr<engine::Stage> st,
                      engine::Stage::Create(task.model,
                                            engine::UnitOptimizerSpec(task.optimizer, lr_scale),
                                            cut, stage, task.micro_batches));
  CopyWholeParams(whole, *st);
  return st;
}

Result<StageUnitOutcome> RunStageUnit(engine::Stage& stage, StagePlane& plane,
                                      std::span<const engine::Batch> batches,
                                      uint64_t dropout_seed) {
  const std::vector<float> start = StageFlatParams(stage);
  StageUnitOutcome out;
  double loss_sum = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    plane.BeginStep(static_cast<uint64_t>(i));
    ML_ASSIGN_OR_RETURN(StageStepOutcome step, RunStageStep(stage, plane.context(), batches[i],
                                                            dropout_seed, *plane.link()));
    loss_sum += step.loss;
    out.leaves.push_back(protocol::StageStepLeaf(step.commit));
    out.commits.push_back(std::move(step.commit));
  }
  if (stage.last() && !batches.empty()) {
    out.mean_loss = static_cast<float>(loss_sum / static_cast<double>(batches.size()));
  }
  out.delta = protocol::PseudoGradient(start, StageFlatParams(stage));
  out.result_hash = ledger::DeltaBlobId(out.delta);
  out.commitment = protocol::StageCommitment(out.leaves);
  return out;
}

void StageHost::Register(net::Router* router, uint64_t max_push_bytes) {
  router->Register(
      kMethodStagePush, [this](const net::Request& r) { return HandlePush(r); },
      static_cast<size_t>(max_push_bytes));
}

std::unique_ptr<StageHost::Attachment> StageHost::Attach(StagePlane* plane) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(plane_ == nullptr) << "a stage host runs one stage unit at a time";
  plane_ = plane;
  return std::unique_ptr<Attachment>(new Attachment(this));
}

StageHost::Attachment::~Attachment() {
  std::lock_guard<std::mutex> lock(host_->mu_);
  host_->plane_ = nullptr;
}

Result<Bytes> StageHost::HandlePush(const net::Request& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (plane_ == nullptr) {
    return Unavailable("stage.push: this node runs no stage unit yet (retry)");
  }
  return plane_->HandlePush(request);
}

}  // namespace meshlearn::node
