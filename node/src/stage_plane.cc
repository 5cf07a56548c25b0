#include "meshlearn/node/stage_plane.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "meshlearn/base/check.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/ledger/stage_replay.h"

namespace meshlearn::node {

using protocol::StageTensorKey;
using protocol::StageTransfer;
using StagePlaneClock = std::chrono::steady_clock;

Hash256 StageChainDigest(std::span<const protocol::NodeId> chain) {
  Hasher h("meshlearn.pipeline.stage_chain.v1");
  h.UpdateU64(chain.size());
  for (const protocol::NodeId& n : chain) h.Update(n.span());
  return h.Finish();
}

std::vector<float> CorruptedStageTensor(std::span<const float> values) {
  std::vector<float> out(values.begin(), values.end());
  if (!out.empty()) out[0] = out[0] + 1e-3f;
  return out;
}

Bytes EncodeStagePush(const StageTransfer& record, std::span<const float> values,
                      const Hash256& chain) {
  Encoder e;
  e.PutBytes(protocol::EncodeStageTransfer(record));
  e.PutBytes(StageTensorBytes(values));
  e.PutHash(chain);
  return e.Take();
}

class StagePlane::Link final : public StageLink {
 public:
  explicit Link(StagePlane* plane) : plane_(plane) {}
  Result<std::vector<float>> Receive(const StageTensorKey& key, StageTransfer* record) override {
    return plane_->Take(key, record);
  }
  Result<StageTransfer> Send(const StageTensorKey& key, std::span<const float> values) override {
    if (plane_->options_.corrupt_sent && plane_->options_.corrupt_sent(key)) {
      Result<StageTransfer> sent = plane_->Push(key, CorruptedStageTensor(values));
      if (!sent.ok() || !plane_->options_.commit_uncorrupted) return sent;
      return SignStageTensor(key, values, plane_->key_, plane_->ctx_.TileColsOf(values.size()));
    }
    return plane_->Push(key, values);
  }

 private:
  StagePlane* plane_;
};

StagePlane::StagePlane(StageContext ctx, int stage, const KeyPair& key, net::Transport* transport,
                       StagePlaneOptions options)
    : ctx_(std::move(ctx)),
      stage_(static_cast<uint32_t>(stage)),
      stages_(ctx_.stages()),
      key_(key),
      transport_(transport),
      options_(options),
      link_(std::make_unique<Link>(this)) {
  CHECK_LT(stage_, ctx_.stages());
  endpoints_.assign(ctx_.chain.size(), "");
  chain_digest_ = StageChainDigest(ctx_.chain);
  CHECK(key_.public_key() == ctx_.chain[stage_]) << "stage " << stage << " signs with its node key";
  deadline_ = StagePlaneClock::now() + std::chrono::milliseconds(options_.step_deadline_ms);
}

StagePlane::~StagePlane() = default;

void StagePlane::Register(net::Router* router) {
  router->Register(
      kMethodStagePush, [this](const net::Request& r) { return HandlePush(r); },
      options_.max_tensor_bytes + protocol::kStageTransferWireBytes + 16 + Hash256::kSize);
  router->Register(
      kMethodStageKeep, [this](const net::Request& r) { return HandleKeep(r); }, kMaxEncodedLength);
  router->Register(
      kMethodStageResume, [this](const net::Request& r) { return HandleResume(r); },
      Hash256::kSize + 16);
}

void StagePlane::SetChain(std::vector<protocol::NodeId> chain, std::vector<std::string> endpoints) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK_EQ(chain.size(), ctx_.chain.size());
  CHECK_EQ(endpoints.size(), ctx_.chain.size());
  CHECK(chain[stage_] == key_.public_key()) << "stage " << stage_ << " is this node";
  ctx_.chain = std::move(chain);
  chain_digest_ = StageChainDigest(ctx_.chain);
  endpoints_ = std::move(endpoints);
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    if (it->second.record.sender != ctx_.chain[it->first.from_stage]) {
      StageUnhold(it->first.from_stage, it->second.record.bytes);
      it = inbox_.erase(it);
    } else {
      ++it;
    }
  }
  taken_.clear();  // a replaced node's step starts over
}

StageContext StagePlane::context() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ctx_;
}

namespace {
Status Cancelled(const std::string& what) {
  return FailedPrecondition(what + ": the stage unit's run was cancelled (no longer assigned)");
}
}  // namespace

void StagePlane::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  deadline_ = StagePlaneClock::now();
  cv_.notify_all();
}

void StagePlane::BeginStep(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  deadline_ = StagePlaneClock::now();
  if (!cancelled_) deadline_ += std::chrono::milliseconds(options_.step_deadline_ms);
  taken_.clear();
  received_.clear();
  sent_.clear();
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    if (it->first.step < step) {
      StageUnhold(it->first.from_stage, it->second.record.bytes);
      it = inbox_.erase(it);
    } else {
      ++it;
    }
  }
  cv_.notify_all();
}

StageLink* StagePlane::link() { return link_.get(); }

void StagePlane::StageUnhold(uint32_t from_stage, uint64_t bytes) {
  held_bytes_ -= bytes;
  held_from_[from_stage] -= bytes;
}

std::map<Hash256, Bytes> StagePlane::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

std::map<Hash256, Bytes> StagePlane::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

std::map<Hash256, Bytes> StagePlane::TakeStepTensors() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<Hash256, Bytes> out = std::move(received_);
  out.merge(sent_);
  received_.clear();
  sent_.clear();
  return out;
}

StagePlaneStats StagePlane::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool StagePlane::awaiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !(awaited_ == protocol::StageTensorKey());
}

std::vector<ledger::NodeLink> MeasuredLinks(const StagePlaneStats& stats,
                                            std::span<const protocol::NodeId> chain) {
  std::vector<ledger::NodeLink> out;
  for (const auto& [stage, l] : stats.links) {
    if (l.pushes == 0 || l.bytes == 0 || stage >= chain.size()) continue;
    // In double: bytes x 10^6 overflows 64 bits past 18 TB, and a measurement needs no exact
    // rounding (the ledger stores the integer it is given).
    const double rate =
        static_cast<double>(l.bytes) * 1e6 / static_cast<double>(std::max<uint64_t>(l.push_us, 1));
    out.push_back({.peer = chain[stage],
                   .latency_ms = static_cast<uint32_t>(
                       std::min<uint64_t>(l.min_push_us / 1000, protocol::kMaxLinkLatencyMs)),
                   .bandwidth_bytes_per_s = static_cast<uint64_t>(std::clamp(
                       rate, 1.0, static_cast<double>(protocol::kMaxLinkBandwidthBytesPerS)))});
  }
  std::sort(out.begin(), out.end(),
            [](const ledger::NodeLink& a, const ledger::NodeLink& b) { return a.peer < b.peer; });
  return out;
}

std::string StagePlane::PeerName(uint32_t stage) const {
  return "stage " + std::to_string(stage) + " (node " + ctx_.chain[stage].ShortHex() + " at " +
         endpoints_[stage] + ")";
}

Result<Bytes> StagePlane::HandlePush(const net::Request& request) {
  const std::string me = "stage.push to stage " + std::to_string(stage_) + " of replica " +
                         std::to_string(ctx_.replica);
  Decoder d(request.body, "stage.push");
  Bytes record_bytes, tensor_bytes;
  ML_RETURN_IF_ERROR(d.GetBytes(&record_bytes, "record",
                                static_cast<uint32_t>(protocol::kStageTransferWireBytes)));
  ML_RETURN_IF_ERROR(d.GetBytes(
      &tensor_bytes, "tensor",
      static_cast<uint32_t>(std::min<uint64_t>(options_.max_tensor_bytes, kMaxEncodedLength))));
  Hash256 chain;
  ML_RETURN_IF_ERROR(d.GetHash(&chain, "chain"));
  ML_RETURN_IF_ERROR(d.Finish());
  Result<StageTransfer> rec = protocol::DecodeStageTransfer(record_bytes);
  if (!rec.ok()) return rec.status().WithPrefix(me);
  const StageTensorKey& k = rec->key;
  if (k.task != ctx_.task || k.round != ctx_.round || k.replica != ctx_.replica ||
      k.stages != stages_ || k.to_stage != stage_) {
    return InvalidArgument(me + ": " + k.ToString() + " (task " + k.task.ShortHex() + ", round " +
                           std::to_string(k.round) + ", " + std::to_string(k.stages) +
                           " stages) is not for this node, which serves stage " +
                           std::to_string(stage_) + " of replica " + std::to_string(ctx_.replica) +
                           " of task " + ctx_.task.ShortHex() + ", round " +
                           std::to_string(ctx_.round));
  }
  if (tensor_bytes.size() % 4 != 0) {
    return InvalidArgument(me + ": " + k.ToString() + ": the tensor has " +
                           std::to_string(tensor_bytes.size()) + " bytes, not whole float32s");
  }
  // A sender on another chain than this plane's: one of the two runs is stale (a stage's node
  // was replaced and its neighbours' runs restart on the new chain), so the tensor is neither
  // judged against this chain's nodes nor taken; the sender retries until the receiving node runs
  // the unit on its chain (or its own run is stopped).
  auto other_chain = [&] {
    return Unavailable(me + ": " + k.ToString() + ": the sender runs the replica on chain " +
                       chain.ShortHex() + ", this stage on " + chain_digest_.ShortHex() +
                       " (a stage's node was replaced); retry");
  };
  std::vector<float> values = StageTensorFromBytes(tensor_bytes);
  // The signature and the hash, outside the lock (hashing a large tensor takes a while).
  StageContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (chain != chain_digest_) return other_chain();
    ctx = ctx_;
  }
  Status checked = ledger::CheckStageTensor(*rec, values, ctx);
  if (!checked.ok()) return checked.WithPrefix(me);

  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) {
    // The unit's run is stopped (a fresh assignment of it starts a new run with its own plane,
    // from step 0): a push taken here would be lost to that run, or counted a duplicate of a
    // step this run had passed. The sender retries until the new plane is attached.
    return Unavailable(me + ": " + k.ToString() + ": this stage's run was stopped; retry");
  }
  if (chain != chain_digest_) return other_chain();
  if (resume_ && resume_->held > 0 && resume_->start.value_or(0) == 0) {
    // A kept stage that has not decided to resume at a step it holds (at most the steps it holds:
    // one ahead rolls back; stage_resume.h): a tensor taken now would be lost when it re-runs
    // from the round's start on a plane of its own.
    return Unavailable(me + ": " + k.ToString() + ": this stage decides where it resumes; retry");
  }
  if (ctx_.chain[k.from_stage] != ctx.chain[k.from_stage]) {
    return Unavailable(me + ": " + k.ToString() + ": stage " + std::to_string(k.from_stage) +
                       "'s node was replaced while the push was checked; retry");
  }
  if (k.step < step_) {  // a retry of a push the stage already used: done
    ++stats_.duplicates;
    return Bytes();
  }
  if (k.step > step_ + 1) {
    // Not yet: a stage that joined the replica (a replacement) begins the step after the others
    // may have; the sender retries until its deadline.
    return Unavailable(me + ": " + k.ToString() + " is ahead of this stage's step " +
                       std::to_string(step_) + " by more than one; retry");
  }
  auto held = inbox_.find(k);
  auto taken = taken_.find(k);
  const Hash256* before = held != inbox_.end()    ? &held->second.record.tensor
                          : taken != taken_.end() ? &taken->second
                                                  : nullptr;
  if (before != nullptr && *before != rec->tensor) {
    return InvalidArgument(me + ": " + k.ToString() + ": a second tensor (" +
                           rec->tensor.ShortHex() + ") for a key already sent with " +
                           before->ShortHex() + " (the sender signed both)");
  }
  if (held != inbox_.end()) {  // a retry of a push held: done
    ++stats_.duplicates;
    return Bytes();
  }
  // New, or the same tensor as one taken: held (again), for a re-run of the step after a
  // failure; a lost answer's retry also lands here and is dropped with its step.
  // Back-pressure per sending stage: each sender's tensors are taken in the order it sends them
  // (stage_step.h), so refusing a sender only until its own earlier tensors are taken cannot
  // stall the schedule; and the tensor the stage is waiting for is never refused.
  uint64_t& from_sender = held_from_[k.from_stage];
  if (from_sender > 0 && from_sender + rec->bytes > options_.inbox_bytes && !(awaited_ == k)) {
    ++stats_.refused_busy;
    return ResourceExhausted(me + ": busy, the inbox holds " + std::to_string(from_sender) +
                             " bytes from stage " + std::to_string(k.from_stage) + " (at most " +
                             std::to_string(options_.inbox_bytes) + "); retry");
  }
  from_sender += rec->bytes;
  held_bytes_ += rec->bytes;
  stats_.peak_inbox_bytes = std::max(stats_.peak_inbox_bytes, held_bytes_);
  ++stats_.pushes_taken;
  inbox_[k] = Held{*rec, std::move(values)};
  cv_.notify_all();
  return Bytes();
}

Result<std::vector<float>> StagePlane::Take(const StageTensorKey& key, StageTransfer* record) {
  std::unique_lock<std::mutex> lock(mu_);
  awaited_ = key;
  const auto t0 = std::chrono::steady_clock::now();
  const bool arrived = !cancelled_ && cv_.wait_until(lock, deadline_, [&] {
    return cancelled_ || inbox_.count(key) > 0;
  }) && !cancelled_;
  stats_.wait_us += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  awaited_ = protocol::StageTensorKey();
  if (cancelled_) return Cancelled(key.ToString());
  if (!arrived) {
    return DeadlineExceeded("no " + key.ToString() + " from " + PeerName(key.from_stage) +
                            " within the step's deadline of " +
                            std::to_string(options_.step_deadline_ms) +
                            " ms: the stage stopped answering");
  }
  auto it = inbox_.find(key);
  Held h = std::move(it->second);
  inbox_.erase(it);
  StageUnhold(key.from_stage, h.record.bytes);
  taken_[key] = h.record.tensor;
  received_[h.record.tensor] = StageTensorBytes(h.values);
  *record = h.record;
  return std::move(h.values);
}

Result<StageTransfer> StagePlane::Push(const StageTensorKey& key, std::span<const float> values) {
  CHECK_EQ(key.from_stage, stage_);
  StageTransfer record = SignStageTensor(key, values, key_, ctx_.TileColsOf(values.size()));
  if (record.bytes > options_.max_tensor_bytes) {
    return ResourceExhausted(key.ToString() + ": " + std::to_string(record.bytes) +
                             " bytes, over the data plane's limit of " +
                             std::to_string(options_.max_tensor_bytes) +
                             " (use more micro-batches, or raise max_tensor_bytes on every stage)");
  }
  Hash256 chain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    chain = chain_digest_;
  }
  const Bytes body = EncodeStagePush(record, values, chain);
  ML_ASSIGN_OR_RETURN(uint64_t us, Deliver(kMethodStagePush, body, key.to_stage, key.ToString()));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.pushes_sent;
  stats_.bytes_sent += record.bytes;
  StageLinkStats& link = stats_.links[key.to_stage];
  link.min_push_us = link.pushes == 0 ? us : std::min(link.min_push_us, us);
  ++link.pushes;
  link.bytes += record.bytes;
  link.push_us += us;
  if (options_.keep_sent) sent_[record.tensor] = StageTensorBytes(values);
  return record;
}

Result<uint64_t> StagePlane::Deliver(const char* method, const Bytes& body, uint32_t to,
                                     const std::string& what) {
  StagePlaneClock::time_point deadline;
  std::string endpoint, peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deadline = deadline_;
    endpoint = endpoints_[to];
    peer = PeerName(to);
  }
  if (endpoint.empty()) {
    return FailedPrecondition(what + ": no endpoint for stage " + std::to_string(to) +
                              " (SetChain before the step)");
  }
  int64_t backoff = options_.retry_initial_ms;
  Status last = Status::Ok();
  for (bool first = true;; first = false) {
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - StagePlaneClock::now())
            .count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return Cancelled(what);
    }
    if (left <= 0) {
      return DeadlineExceeded(peer + " did not take " + what + " within the step's deadline of " +
                              std::to_string(options_.step_deadline_ms) + " ms" +
                              (last.ok() ? "" : " (last answer: " + last.ToString() + ")"));
    }
    if (!first) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.push_retries;
    }
    net::Request req;
    req.method = method;
    req.body = body;
    req.timeout_ms = std::min(left, options_.request_timeout_ms);
    const StagePlaneClock::time_point sent_at = StagePlaneClock::now();
    Result<Bytes> r = transport_->Send(endpoint, std::move(req));
    if (r.ok()) {
      return static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(StagePlaneClock::now() - sent_at)
              .count());
    }
    last = r.status();
    const StatusCode code = last.code();
    if (code != StatusCode::kResourceExhausted && code != StatusCode::kUnavailable &&
        code != StatusCode::kDeadlineExceeded) {
      return last.WithPrefix(peer + " refused " + what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff, left)));
    backoff = std::min(backoff * 2, options_.retry_max_ms);
  }
}

namespace {

Bytes EncodeStageKeep(const protocol::StageStateClaim& claim, ByteSpan checkpoint,
                      const Hash256& chain) {
  Encoder e;
  e.PutBytes(protocol::EncodeStageStateClaim(claim));
  e.PutBytes(checkpoint);
  e.PutHash(chain);
  return e.Take();
}

}  // namespace

Status StagePlane::KeepCheckpoint(uint64_t step, engine::TrainState& state) {
  if (stages_ < 2 || options_.checkpoint_every == 0 || step == 0 ||
      step % options_.checkpoint_every != 0) {
    return Status::Ok();
  }
  ML_ASSIGN_OR_RETURN(Bytes checkpoint, ledger::StageCheckpointBytes(state));
  if (checkpoint.size() > options_.max_checkpoint_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.checkpoints_skipped;
    return Status::Ok();
  }
  const uint32_t keeper = protocol::StageCheckpointKeeper(stage_, stages_);
  Hash256 chain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    chain = chain_digest_;
  }
  const protocol::StageStateClaim claim =
      protocol::SignStageStateClaim({.task = ctx_.task,
                                     .round = ctx_.round,
                                     .replica = ctx_.replica,
                                     .stages = stages_,
                                     .stage = stage_,
                                     .step = step},
                                    engine::StateHash(state), key_);
  const std::string what = "the checkpoint of " + protocol::StageStateClaimName(claim);
  ML_RETURN_IF_ERROR(
      Deliver(kMethodStageKeep, EncodeStageKeep(claim, checkpoint, chain), keeper, what).status());
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.checkpoints_sent;
  stats_.checkpoint_bytes_sent += checkpoint.size();
  return Status::Ok();
}

Status CheckKeptCheckpoint(const KeptCheckpoint& k, const protocol::NodeId& signer) {
  ML_RETURN_IF_ERROR(protocol::VerifyStageStateClaim(k.claim, signer));
  const std::string name = protocol::StageStateClaimName(k.claim);
  Result<engine::TrainState> state = ledger::StageCheckpointState(k.checkpoint);
  if (!state.ok()) return state.status().WithPrefix("the checkpoint of " + name);
  const Hash256 got = engine::StateHash(*state);
  if (got != k.claim.state) {
    return InvalidArgument("the checkpoint of " + name + " hashes to " + got.ShortHex() +
                           ", its signed claim says " + k.claim.state.ShortHex());
  }
  return Status::Ok();
}

std::map<uint32_t, KeptCheckpoint> StagePlane::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

Result<Bytes> StagePlane::HandleKeep(const net::Request& request) {
  const std::string me = "stage.keep to stage " + std::to_string(stage_) + " of replica " +
                         std::to_string(ctx_.replica);
  Decoder d(request.body, "stage.keep");
  Bytes claim_bytes, checkpoint;
  ML_RETURN_IF_ERROR(d.GetBytes(&claim_bytes, "claim", 4096));
  ML_RETURN_IF_ERROR(d.GetBytes(&checkpoint, "checkpoint"));
  Hash256 chain;
  ML_RETURN_IF_ERROR(d.GetHash(&chain, "chain"));
  ML_RETURN_IF_ERROR(d.Finish());
  Result<protocol::StageStateClaim> claim = protocol::DecodeStageStateClaim(claim_bytes);
  if (!claim.ok()) return claim.status().WithPrefix(me);
  const std::string name = protocol::StageStateClaimName(*claim);
  if (claim->task != ctx_.task || claim->round != ctx_.round || claim->replica != ctx_.replica ||
      claim->stages != stages_ ||
      protocol::StageCheckpointKeeper(claim->stage, stages_) != stage_) {
    return InvalidArgument(me + ": the checkpoint of " + name + " (task " + claim->task.ShortHex() +
                           ", " + std::to_string(claim->stages) +
                           " stages) is not one this stage keeps");
  }
  protocol::NodeId sender;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || chain != chain_digest_) {
      // As a push of another chain or to a stopped run: the sender retries into the run of its
      // chain, which keeps it.
      return Unavailable(me + ": the checkpoint of " + name +
                         " comes from another chain or a stopped run; retry");
    }
    sender = ctx_.chain[claim->stage];
  }
  // The checkpoint must be the state its node signed: its keeper holds nothing else, so the node
  // that restores it restores what the stage's own run reached.
  KeptCheckpoint k{*claim, std::move(checkpoint)};
  Status checked = CheckKeptCheckpoint(k, sender);
  if (!checked.ok()) return checked.WithPrefix(me);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(k.claim.stage);
  if (it == kept_.end() || it->second.claim.step <= k.claim.step) {
    kept_[k.claim.stage] = std::move(k);
  }
  ++stats_.checkpoints_kept;
  return Bytes();
}

void StagePlane::OfferResume(uint64_t held) {
  std::lock_guard<std::mutex> lock(mu_);
  resume_ = StageResumeAnswer{.held = held};
}

void StagePlane::DecideStart(uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resume_) resume_ = StageResumeAnswer{};
  resume_->start = step;
}

Result<Bytes> StagePlane::HandleResume(const net::Request& request) {
  Decoder d(request.body, "stage.resume");
  Hash256 chain;
  ML_RETURN_IF_ERROR(d.GetHash(&chain, "chain"));
  ML_RETURN_IF_ERROR(d.Finish());
  std::lock_guard<std::mutex> lock(mu_);
  // Another chain's run, a stopped one or one that has not offered yet: its answer would not be
  // this chain's run's (the asker retries until it is).
  if (cancelled_ || chain != chain_digest_ || !resume_) {
    return Unavailable("stage.resume to stage " + std::to_string(stage_) + " of replica " +
                       std::to_string(ctx_.replica) + ": its run on chain " + chain.ShortHex() +
                       " has not offered yet; retry");
  }
  Encoder e;
  e.PutU64(resume_->held).PutU8(resume_->start ? 1 : 0).PutU64(resume_->start.value_or(0));
  return e.Take();
}

Result<StageResumeAnswer> StagePlane::AskResume(uint32_t stage, int64_t deadline_ms, bool decided) {
  const StagePlaneClock::time_point deadline =
      StagePlaneClock::now() + std::chrono::milliseconds(deadline_ms);
  std::string endpoint, peer;
  Hash256 chain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK_LT(stage, stages_);
    endpoint = endpoints_[stage];
    peer = PeerName(stage);
    chain = chain_digest_;
  }
  const std::string what = "stage.resume of " + peer;
  if (endpoint.empty()) return FailedPrecondition(what + ": no endpoint (SetChain first)");
  Encoder e;
  e.PutHash(chain);
  const Bytes body = e.Take();
  int64_t backoff = options_.retry_initial_ms;
  Status last = Status::Ok();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return Cancelled(what);
    }
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - StagePlaneClock::now())
            .count();
    if (left <= 0) {
      return DeadlineExceeded(what + ": no " + (decided ? "decided " : "") + "answer within " +
                              std::to_string(deadline_ms) + " ms" +
                              (last.ok() ? "" : " (last: " + last.ToString() + ")"));
    }
    Result<Bytes> r = transport_->Send(
        endpoint, net::Request{.method = kMethodStageResume,
                               .body = body,
                               .timeout_ms = std::min(left, options_.request_timeout_ms),
                               .max_response_bytes = 64});
    if (r.ok()) {
      Decoder d(*r, what);
      StageResumeAnswer a;
      uint8_t has_start = 0;
      uint64_t start = 0;
      ML_RETURN_IF_ERROR(d.GetU64(&a.held, "held"));
      ML_RETURN_IF_ERROR(d.GetU8(&has_start, "decided"));
      ML_RETURN_IF_ERROR(d.GetU64(&start, "start"));
      ML_RETURN_IF_ERROR(d.Finish());
      if (has_start > 1) return InvalidArgument(what + ": decided must be 0 or 1");
      if (has_start == 1) a.start = start;
      if (!decided || a.start) return a;
      last = Unavailable("not decided yet");
    } else {
      last = r.status();
      const StatusCode code = last.code();
      if (code != StatusCode::kResourceExhausted && code != StatusCode::kUnavailable &&
          code != StatusCode::kDeadlineExceeded) {
        return last.WithPrefix(what);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff, left)));
    backoff = std::min(backoff * 2, options_.retry_max_ms);
  }
}

}  // namespace meshlearn::node
