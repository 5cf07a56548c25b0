#include "meshlearn/node/stage_step.h"

#include <utility>

#include "meshlearn/base/check.h"

namespace meshlearn::node {

using protocol::StageTensorKey;
using protocol::StageTransfer;

// ---- In one process.

class MemoryStageNetwork::Link final : public StageLink {
 public:
  Link(MemoryStageNetwork* net, int stage) : net_(net), stage_(stage) {}

  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    std::unique_lock<std::mutex> lock(net_->mu_);
    net_->cv_.wait(lock, [&] { return net_->boxes_.count(key) > 0; });
    auto it = net_->boxes_.find(key);
    Box box = std::move(it->second);
    net_->boxes_.erase(it);
    lock.unlock();
    ML_RETURN_IF_ERROR(CheckStageTensor(box.record, box.values, net_->ctx_));
    *record = box.record;
    return std::move(box.values);
  }

  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    CHECK_EQ(key.from_stage, static_cast<uint32_t>(stage_));
    StageTransfer record = SignStageTensor(key, values, net_->keys_[static_cast<size_t>(stage_)],
                                           net_->ctx_.TileColsOf(values.size()));
    {
      std::lock_guard<std::mutex> lock(net_->mu_);
      net_->sent_.push_back(record);
      net_->boxes_[key] = Box{record, std::vector<float>(values.begin(), values.end())};
    }
    net_->cv_.notify_all();
    return record;
  }

 private:
  MemoryStageNetwork* net_;
  int stage_;
};

MemoryStageNetwork::MemoryStageNetwork(StageContext ctx, std::vector<KeyPair> keys)
    : ctx_(std::move(ctx)), keys_(std::move(keys)) {
  CHECK_EQ(keys_.size(), ctx_.chain.size());
  for (size_t s = 0; s < keys_.size(); ++s) {
    CHECK(keys_[s].public_key() == ctx_.chain[s]);
    links_.push_back(std::make_unique<Link>(this, static_cast<int>(s)));
  }
}

MemoryStageNetwork::~MemoryStageNetwork() = default;

StageLink* MemoryStageNetwork::link(int stage) { return links_[static_cast<size_t>(stage)].get(); }

std::vector<StageTransfer> MemoryStageNetwork::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

}  // namespace meshlearn::node
