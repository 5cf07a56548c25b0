#include "meshlearn/ledger/follower.h"

#include <chrono>
#include <thread>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/log.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/rpc_answer.h"

namespace meshlearn::ledger {
namespace {

std::string ChainIdOr(const RpcAnswer& status, const std::string& otherwise) {
  Result<std::string> id = status.Str("chain_id");
  return id.ok() ? *id : otherwise;
}

}  // namespace

Follower::Follower(SharedChain* chain, RpcClient* upstream, PublicKey sequencer,
                   FollowerOptions options)
    : chain_(chain), upstream_(upstream), sequencer_(sequencer), options_(std::move(options)) {
  if (options_.batch == 0) options_.batch = 1;
}

Status Follower::CheckUpstream() {
  ML_ASSIGN_OR_RETURN(nlohmann::json st, upstream_->Call("chain_status", nlohmann::json::object()));
  RpcAnswer a("chain_status", st);
  auto [ours, chain_id] = chain_->With([](Chain& c) {
    return std::make_pair(c.genesis_hash().ToHex(), c.genesis().chain_id);
  });
  ML_ASSIGN_OR_RETURN(std::string theirs, a.Str("genesis_hash"));
  ML_ASSIGN_OR_RETURN(uint64_t height, a.U64("height"));
  if (theirs != ours) {
    return FailedPrecondition("the ledger at " + upstream_->url() + " runs chain '" +
                              ChainIdOr(a, "?") + "' with genesis " + theirs +
                              ", but our genesis.toml (chain '" + chain_id + "') hashes to " +
                              ours + "; use that chain's genesis.toml");
  }
  upstream_height_.store(height);
  return Status::Ok();
}

Status Follower::Refuse(uint64_t height, const std::string& raw_hex, const Status& why) {
  std::string where;
  if (!options_.evidence_dir.empty()) {
    Env* env = Env::Default();
    std::string path = JoinPath(options_.evidence_dir, "refused-block-" + std::to_string(height) + ".hex");
    if (env->CreateDirs(options_.evidence_dir).ok() && env->WriteFileAtomic(path, raw_hex + "\n").ok()) {
      where = "; the block is saved in " + path;
    }
  }
  Status s = PermissionDenied("REFUSED block " + std::to_string(height) + " from the sequencer at " +
                              upstream_->url() + ": " + why.message() +
                              ". The sequencer served a block that does not verify; this follower "
                              "stopped at height " + std::to_string(height - 1) + where);
  ML_LOG_ERROR("{}", s.message());
  return s;
}

Result<uint64_t> Follower::SyncOnce() {
  uint64_t applied = 0;
  for (;;) {
    uint64_t from = chain_->height() + 1;
    // The upstream's answer is decoded with checks: a wrong shape is Unavailable (Run retries;
    // a sequencer that answers nonsense is not followed, but not fatal either), never an abort.
    Result<nlohmann::json> answer =
        upstream_->Call("get_blocks", {{"from", from}, {"limit", options_.batch}});
    if (!answer.ok()) return Upstream(answer.status());
    RpcAnswer r("get_blocks", *answer);
    Result<uint64_t> upstream_height = r.U64("height");
    if (!upstream_height.ok()) return Upstream(upstream_height.status());
    Result<RpcAnswer> blocks = r.Array("blocks");
    if (!blocks.ok()) return Upstream(blocks.status());
    upstream_height_.store(*upstream_height);
    if (blocks->size() == 0) return applied;
    for (size_t i = 0; i < blocks->size(); ++i) {
      uint64_t height = chain_->height() + 1;
      RpcAnswer raw = blocks->At(i);
      Result<std::string> hex = raw.Str();
      if (!hex.ok()) return Upstream(hex.status());
      Result<Bytes> bytes = HexDecode(*hex, "block");
      if (!bytes.ok()) return Refuse(height, *hex, bytes.status());
      Result<Block> block = DecodeBlock(*bytes);
      if (!block.ok()) return Refuse(height, *hex, block.status());
      if (block->header.height != height) {
        return Refuse(height, *hex,
                      InvalidArgument("asked for block " + std::to_string(height) + ", got block " +
                                      std::to_string(block->header.height)));
      }
      if (sequencer_ == PublicKey{}) {
        // Trust on first use, for a genesis that names no sequencer.
        sequencer_ = block->header.sequencer;
        ML_LOG_WARN("genesis names no sequencer; pinning {} from block {}",
                    sequencer_.ToHex(), height);
      }
      Status s = chain_->With([&](Chain& c) {
        // A replicated chain: any candidate the genesis lists may sign (ApplyBlock checks it).
        const bool replicated = !c.genesis().sequencers.empty();
        return c.ApplyBlock(*block, replicated ? block->header.sequencer : sequencer_);
      });
      if (!s.ok()) {
        if (s.code() == StatusCode::kInternal || s.code() == StatusCode::kUnavailable) return s;
        return Refuse(height, *hex, s);
      }
      chain_->PublishHeight(height);
      ++applied;
    }
    if (blocks->size() >= options_.batch) {  // catching up: say how far
      ML_LOG_INFO("follower: verified up to block {} of {}", chain_->height(),
                  upstream_height_.load());
    }
  }
}

Status Follower::Upstream(const Status& s) {
  if (s.code() == StatusCode::kUnavailable) return s;
  // A refusal or an answer that does not decode: the upstream is not usable now; retried.
  return Unavailable(s.message());
}

Status Follower::Run() {
  while (!stop_.load()) {
    Result<uint64_t> n = SyncOnce();
    if (!n.ok()) {
      if (n.status().code() == StatusCode::kPermissionDenied) return n.status();
      if (n.status().code() == StatusCode::kUnavailable) {
        ML_LOG_WARN("follower: {}; retrying", n.status().message());
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.retry_ms));
        continue;
      }
      return n.status();
    }
    if (stop_.load()) break;
    Result<nlohmann::json> w = upstream_->Call(
        "wait_block", {{"after", chain_->height()}, {"timeout_ms", options_.long_poll_ms}});
    Status waited = w.ok() ? RpcAnswer("wait_block", *w).U64("height").status() : w.status();
    if (!waited.ok()) {
      ML_LOG_WARN("follower: {}; retrying", waited.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.retry_ms));
    }
  }
  return Status::Ok();
}

}  // namespace meshlearn::ledger
