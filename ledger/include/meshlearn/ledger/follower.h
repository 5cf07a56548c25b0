// The follower: keeps a local Chain in step with a sequencer by downloading its blocks over
// JSON-RPC and applying them with Chain::ApplyBlock, which checks the signature, re-executes
// every transaction and compares the receipts root and the state hash.
//
// A block that does not verify is never applied: the follower stops at the last good height and
// returns the reason (a lying sequencer is caught, never followed). The refused block is kept
// as evidence in `evidence_dir` if one is given.
//
//   RpcClient upstream("http://127.0.0.1:7700");
//   Follower follower(&shared, &upstream, genesis.sequencer, {.evidence_dir = dir});
//   ML_RETURN_IF_ERROR(follower.CheckUpstream());   // same genesis?
//   Status s = follower.Run();                      // until Stop() or a refused block
//
// Run is meant for one thread; Stop may be called from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/shared_chain.h"

namespace meshlearn::ledger {

struct FollowerOptions {
  int64_t long_poll_ms = 20000;  // wait_block timeout per call
  uint32_t batch = 100;          // blocks per get_blocks call
  int64_t retry_ms = 1000;       // after the upstream is unreachable
  std::string evidence_dir = "";      // where a refused block is written (empty: nowhere)
};

class Follower {
 public:
  // `sequencer`: the key blocks must be signed by (genesis.sequencer; when that is all zero,
  // the key in the first block is pinned and must sign every later one). On a replicated chain
  // (genesis.sequencers listed) any listed key signs; `sequencer` is not used. `upstream` may
  // list every candidate (RpcClient's failover).
  Follower(SharedChain* chain, RpcClient* upstream, PublicKey sequencer,
           FollowerOptions options = {});

  // FailedPrecondition if the upstream serves another genesis or chain id.
  Status CheckUpstream();

  // Downloads and applies every block the upstream has above our height; returns how many were
  // applied. A refused block ends it with PermissionDenied, naming the height and the reason.
  Result<uint64_t> SyncOnce();

  // SyncOnce, then long-poll for the next block, forever. Returns OK after Stop(), or the
  // error of a refused block. An unreachable upstream, or one whose answers do not decode
  // (a wrong shape: checked, never an abort), is retried every retry_ms, not an error.
  Status Run();
  void Stop() { stop_.store(true); }

  uint64_t upstream_height() const { return upstream_height_.load(); }

 private:
  Status Refuse(uint64_t height, const std::string& raw_hex, const Status& why);
  // An upstream call that failed or answered something that does not decode, as Unavailable.
  Status Upstream(const Status& s);

  SharedChain* chain_;
  RpcClient* upstream_;
  PublicKey sequencer_;
  FollowerOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> upstream_height_{0};
};

}  // namespace meshlearn::ledger
