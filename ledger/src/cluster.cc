#include "meshlearn/ledger/cluster.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/log.h"

namespace meshlearn::ledger {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SleepMs(int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::string AsString(const Bytes& b) { return std::string(b.begin(), b.end()); }

}  // namespace

ClusterCandidate::ClusterCandidate(SharedChain* chain, Sequencer* sequencer, ClusterOptions options)
    : chain_(chain), sequencer_(sequencer), options_(std::move(options)) {
  prefix_ = chain_->With([](Chain& c) { return Prefix(c.genesis()); });
  EtcdOptions eo{.timeout_ms = options_.etcd_timeout_ms};
  loop_etcd_ = std::make_unique<EtcdClient>(options_.etcd, eo);
  commit_etcd_ = std::make_unique<EtcdClient>(options_.etcd, eo);
  read_etcd_ = std::make_unique<EtcdClient>(options_.etcd, eo);
  if (options_.batch == 0) options_.batch = 1;
  sequencer_->SetReplicated([this](const Block& b) { return CommitToEtcd(b); });
}

ClusterCandidate::~ClusterCandidate() = default;

std::string ClusterCandidate::Prefix(const Genesis& genesis) {
  return "/meshlearn/" + genesis.chain_id + "/" + GenesisHash(genesis).ToHex().substr(0, 16) + "/";
}

std::string ClusterCandidate::BlockKey(const std::string& prefix, uint64_t height) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%020llu", static_cast<unsigned long long>(height));
  return prefix + "blocks/" + digits;
}

Status ClusterCandidate::CheckEtcd() {
  auto [height, local] = chain_->With([](Chain& c) {
    Bytes b;
    if (c.Height() > 0) b = EncodeBlock(*c.GetBlock(c.Height()));
    return std::make_pair(c.Height(), b);
  });
  if (height == 0) return Status::Ok();
  ML_ASSIGN_OR_RETURN(std::optional<EtcdKv> kv, loop_etcd_->Get(BlockKey(prefix_, height)));
  if (!kv) {
    return FailedPrecondition(
        "the local chain is at height " + std::to_string(height) + " but etcd (" +
        options_.etcd.front() + ", prefix " + prefix_ + ") holds no block " +
        std::to_string(height) +
        ": wrong etcd cluster, or etcd lost data; restore etcd from its backup "
        "(docs/operators.md, \"Running a replicated chain\")");
  }
  if (kv->value != AsString(local)) {
    return FailedPrecondition("block " + std::to_string(height) +
                              " in etcd differs from the local chain's; this chain.db belongs to "
                              "another history (start the candidate on a fresh directory)");
  }
  return Status::Ok();
}

Status ClusterCandidate::Refuse(uint64_t height, const std::string& bytes, const Status& why) {
  std::string where;
  if (!options_.evidence_dir.empty()) {
    Env* env = Env::Default();
    std::string path =
        JoinPath(options_.evidence_dir, "refused-block-" + std::to_string(height) + ".hex");
    Bytes raw(bytes.begin(), bytes.end());
    if (env->CreateDirs(options_.evidence_dir).ok() &&
        env->WriteFileAtomic(path, HexEncode(raw) + "\n").ok()) {
      where = "; the block is saved in " + path;
    }
  }
  Status s = PermissionDenied("REFUSED block " + std::to_string(height) + " from etcd (" + prefix_ +
                              "): " + why.message() +
                              ". A block that does not verify is never applied; this candidate "
                              "stopped at height " +
                              std::to_string(height - 1) + where);
  ML_LOG_ERROR("{}", s.message());
  return s;
}

Result<uint64_t> ClusterCandidate::SyncFromEtcd() {
  uint64_t applied = 0;
  const std::string end = EtcdClient::PrefixEnd(prefix_ + "blocks/");
  for (;;) {
    uint64_t from = chain_->height() + 1;
    ML_ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs,
                        loop_etcd_->Range(BlockKey(prefix_, from), end, options_.batch));
    if (kvs.empty()) return applied;
    for (const EtcdKv& kv : kvs) {
      uint64_t height = chain_->height() + 1;
      if (kv.key != BlockKey(prefix_, height)) {
        return Refuse(height, kv.value,
                      DataLoss("etcd holds " + kv.key + " where block " + std::to_string(height) +
                               " was expected (a gap in the chain)"));
      }
      Bytes wire(kv.value.begin(), kv.value.end());
      Result<Block> block = DecodeBlock(wire);
      if (!block.ok()) return Refuse(height, kv.value, block.status());
      // Chain::ApplyBlock checks that the signer is authorized by the genesis
      // (IsAuthorizedSequencer), the signature, and the state hash by re-execution.
      Status s =
          chain_->With([&](Chain& c) { return c.ApplyBlock(*block, block->header.sequencer); });
      if (!s.ok()) {
        if (s.code() == StatusCode::kInternal || s.code() == StatusCode::kUnavailable) return s;
        return Refuse(height, kv.value, s);
      }
      chain_->PublishHeight(height);
      ++applied;
    }
  }
}

Status ClusterCandidate::CatchUp() {
  if (leading_.load() && !lost_.load() && LeaseAlive()) return Status::Ok();
  const int64_t deadline = SteadyMs() + options_.read_wait_ms;
  // etcd's height: a request that fails (a member slow to answer, the machine loaded) is tried
  // again until the deadline.
  const uint64_t local = chain_->height();
  Result<int64_t> ahead = Unavailable("not asked");
  for (;;) {
    ahead =
        read_etcd_->Count(BlockKey(prefix_, local + 1), EtcdClient::PrefixEnd(prefix_ + "blocks/"));
    if (ahead.ok() || SteadyMs() + options_.poll_ms >= deadline || stop_.load()) break;
    SleepMs(options_.poll_ms);
  }
  if (!ahead.ok()) {
    return Unavailable(
        "this sequencer candidate is a standby and cannot ask etcd how far the chain "
        "is (" +
        ahead.status().message() + "); ask another candidate");
  }
  const uint64_t target = local + static_cast<uint64_t>(std::max<int64_t>(0, *ahead));
  for (uint64_t h = chain_->height(); h < target; h = chain_->height()) {
    const int64_t left = deadline - SteadyMs();
    if (left <= 0 || chain_->shutting_down() || stop_.load()) {
      return Unavailable("this sequencer candidate is a standby at height " + std::to_string(h) +
                         ", behind etcd's " + std::to_string(target) +
                         "; ask another candidate or retry");
    }
    chain_->WaitAbove(h, left);
  }
  return Status::Ok();
}

bool ClusterCandidate::LeaseAlive() const { return SteadyMs() < lease_deadline_ms_.load(); }

Status ClusterCandidate::CommitToEtcd(const Block& block) {
  // Runs in the sequencer's thread, inside ProduceOnce, with the chain locked.
  std::string record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record = leader_record_;
  }
  if (!leading_.load() || lost_.load() || !LeaseAlive()) {
    return Unavailable("not committing block " + std::to_string(block.header.height) +
                       ": this candidate's lease is not known to be alive");
  }
  const std::string key = BlockKey(prefix_, block.header.height);
  const std::string bytes = AsString(EncodeBlock(block));
  Result<bool> won = commit_etcd_->Txn(
      {EtcdCompare::ValueEquals(prefix_ + "leader", record), EtcdCompare::Absent(key)},
      {{key, bytes}});
  if (won.ok() && *won) return Status::Ok();
  if (!won.ok()) {
    // The answer was lost: the transaction may have been applied. Read back.
    Result<std::optional<EtcdKv>> kv = commit_etcd_->Get(key);
    if (kv.ok() && kv->has_value() && (*kv)->value == bytes) return Status::Ok();
  }
  lost_.store(true);
  return FailedPrecondition("block " + std::to_string(block.header.height) +
                            " was not committed to etcd (" +
                            (won.ok() ? std::string("another leader holds the lease or the height")
                                      : won.status().message()) +
                            "); stepping down");
}

Result<bool> ClusterCandidate::Campaign() {
  const int64_t asked = SteadyMs();
  ML_ASSIGN_OR_RETURN(EtcdLease lease, loop_etcd_->GrantLease(options_.lease_ttl_s));
  nlohmann::json rec = {{"key", sequencer_->public_key().ToHex()},
                        {"url", options_.advertise_url},
                        {"lease", std::to_string(lease.id)}};
  std::string record = rec.dump();
  Result<bool> won = loop_etcd_->Txn({EtcdCompare::Absent(prefix_ + "leader")},
                                     {{prefix_ + "leader", record, lease.id}});
  if (!won.ok() || !*won) {
    (void)loop_etcd_->RevokeLease(lease.id);
    if (!won.ok()) return won.status();
    return false;
  }
  lease_id_ = lease.id;
  lease_ttl_ms_ = lease.ttl_s * 1000;
  lease_deadline_ms_.store(asked + lease_ttl_ms_ * 9 / 10);
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_record_ = record;
  }
  // Everything in etcd is final now: the old leader's commits compare the leader key.
  Result<uint64_t> synced = SyncFromEtcd();
  if (!synced.ok() || !LeaseAlive()) {
    (void)loop_etcd_->RevokeLease(lease.id);
    lease_deadline_ms_.store(0);
    if (!synced.ok()) return synced.status();
    return false;
  }
  int64_t last_time = chain_->With([](Chain& c) { return c.LastBlockTime(); });
  Takeover t{chain_->height(), last_time > 0 ? SystemClock::Default()->NowMillis() - last_time : 0};
  lost_.store(false);
  leading_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    takeovers_.push_back(t);
    leader_key_hex_ = sequencer_->public_key().ToHex();
    leader_url_ = options_.advertise_url;
  }
  sequencer_->SetLeading(true);
  ML_LOG_INFO("cluster: leading from height {} (lease {}, {} ms since the last block)", t.height,
              lease.id, t.gap_ms);
  return true;
}

void ClusterCandidate::StepDown(const std::string& why) {
  // SetLeading waits for a block in flight; after it returns nothing more is produced.
  sequencer_->SetLeading(false,
                         "this sequencer candidate stopped leading (" + why + "); send to another");
  leading_.store(false);
  lease_deadline_ms_.store(0);
  (void)loop_etcd_->RevokeLease(lease_id_);  // lets the others elect at once (if reachable)
  lease_id_ = 0;
  ML_LOG_WARN("cluster: stopped leading at height {}: {}", chain_->height(), why);
}

Status ClusterCandidate::Run() {
  int64_t next_keepalive = 0;
  int64_t last_warning = 0;
  auto warn = [&](const Status& s) {
    if (SteadyMs() - last_warning < 5000) return;  // at most every 5 s
    last_warning = SteadyMs();
    ML_LOG_WARN("cluster: {}", s.message());
  };
  // The local chain must be a prefix of etcd's; etcd may still be starting (retried).
  for (;;) {
    Status check = CheckEtcd();
    if (check.ok()) break;
    if (check.code() != StatusCode::kUnavailable) return check;
    warn(check);
    if (stop_.load()) return Status::Ok();
    SleepMs(options_.poll_ms * 4);
  }
  while (!stop_.load()) {
    if (leading_.load()) {
      if (lost_.load()) {
        StepDown("a block commit found another leader");
        continue;
      }
      if (!LeaseAlive()) {
        StepDown("the lease could not be renewed in time");
        continue;
      }
      if (SteadyMs() >= next_keepalive) {
        const int64_t asked = SteadyMs();
        Result<int64_t> ttl = loop_etcd_->KeepAlive(lease_id_);
        if (ttl.ok()) {
          lease_deadline_ms_.store(asked + *ttl * 1000 * 9 / 10);
          next_keepalive = asked + lease_ttl_ms_ / 4;
        } else if (ttl.status().code() == StatusCode::kNotFound) {
          StepDown("the lease expired");
          continue;
        } else {
          warn(ttl.status());
          next_keepalive = asked + options_.poll_ms;
        }
      }
      SleepMs(
          std::min<int64_t>(options_.poll_ms, std::max<int64_t>(1, next_keepalive - SteadyMs())));
      continue;
    }
    Result<uint64_t> synced = SyncFromEtcd();
    if (!synced.ok()) {
      if (synced.status().code() == StatusCode::kPermissionDenied) return synced.status();
      warn(synced.status());
      SleepMs(options_.poll_ms);
      continue;
    }
    Result<std::optional<EtcdKv>> leader = loop_etcd_->Get(prefix_ + "leader");
    if (!leader.ok()) {
      warn(leader.status());
    } else if (leader->has_value()) {
      nlohmann::json rec = nlohmann::json::parse((*leader)->value, nullptr, false);
      std::lock_guard<std::mutex> lock(mu_);
      leader_key_hex_ = rec.is_object() ? rec.value("key", std::string()) : std::string();
      leader_url_ = rec.is_object() ? rec.value("url", std::string()) : std::string();
    } else {
      {
        std::lock_guard<std::mutex> lock(mu_);
        leader_key_hex_.clear();  // nobody leads until the election is won
        leader_url_.clear();
      }
      Result<bool> won = Campaign();
      if (!won.ok()) {
        if (won.status().code() == StatusCode::kPermissionDenied) return won.status();
        warn(won.status());
      } else if (*won) {
        next_keepalive = SteadyMs() + lease_ttl_ms_ / 4;
        continue;
      }
    }
    {
      std::string url;
      {
        std::lock_guard<std::mutex> lock(mu_);
        url = leader_url_;
      }
      sequencer_->SetLeading(false, url.empty()
                                        ? "no sequencer leads now (an election is under way); retry"
                                        : "this sequencer candidate is not the leader; the leader "
                                          "is at " +
                                              url);
    }
    SleepMs(options_.poll_ms);
  }
  if (leading_.load()) StepDown("stopping");
  return Status::Ok();
}

nlohmann::json ClusterCandidate::StatusJson() {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json t = nlohmann::json::array();
  for (const Takeover& x : takeovers_) t.push_back({{"height", x.height}, {"gap_ms", x.gap_ms}});
  const size_t count = t.size();
  return {{"leading", leading_.load()}, {"leader", leader_key_hex_}, {"leader_url", leader_url_},
          {"etcd", options_.etcd},      {"prefix", prefix_},         {"takeovers", std::move(t)},
          {"takeover_count", count}};
}

std::vector<Takeover> ClusterCandidate::takeovers() {
  std::lock_guard<std::mutex> lock(mu_);
  return takeovers_;
}

}  // namespace meshlearn::ledger
