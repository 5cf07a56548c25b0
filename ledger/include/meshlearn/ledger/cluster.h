// A replicated sequencer: several candidates share an etcd cluster; one leads at a time and
// produces the blocks, the others follow from etcd and stand by. docs/operators.md, "Running a
// replicated chain", is the operator's view; docs/ledger.md the design.
//
// etcd keys, under Prefix(genesis) = "/meshlearn/<chain id>/<genesis hash, 16 hex>/":
//   leader            {"key", "url", "lease"} of the leader, attached to its lease
//   blocks/<height>   the block's canonical bytes (EncodeBlock: header, transactions,
//                     receipts and the sequencer's signature); height as 20 decimal digits
//
// Election: a candidate that sees no leader key grants itself a lease and creates the key in
// a transaction "leader absent -> put leader with my lease". It keeps the lease alive every
// TTL/4. It leads only while its lease is alive as far as it knows (its last renewal plus 9/10
// of the TTL, measured from before the request): when that passes -- etcd unreachable, the
// process paused -- it stops producing at once, before etcd could have given the lease away.
//
// Commit rule: a block is committed when the transaction "leader is still me AND
// blocks/<height> absent -> put blocks/<height>" succeeds. Only then is it committed to the
// local SQLite chain and its transactions answered "included". Two blocks at one height are
// impossible: etcd's transactions are linearizable and the key is created once; a deposed
// leader's transaction fails on either comparison (a new leader key holds another lease). A
// transaction whose answer was lost is read back (the block at that height is ours or not).
//
// Reads: a standby answers a read only once it has applied every block etcd held when the read
// arrived (CatchUp, called by RpcService before each read), so a client that fails over from the
// leader never reads a state older than one it was already answered from (a nonce, a receipt).
// The leader's chain is etcd's (it commits to etcd first, under the chain's lock).
//
// Following: every candidate, while not leading, applies the blocks etcd holds above its height
// with Chain::ApplyBlock -- signature by a key the genesis authorizes, every transaction
// re-executed, receipts root and state hash compared -- so a block that does not verify is
// refused, saved in evidence_dir and reported, never applied; Run then ends with
// PermissionDenied. A new leader first applies every block in etcd (the old leader can commit
// no more once the election is won), then produces the next height.
//
//   ClusterCandidate candidate(&shared, &sequencer, {.etcd = endpoints, .advertise_url = url});
//   std::thread t([&] { Status s = candidate.Run(); ... });   // until Stop() or a refusal
//   candidate.Stop(); t.join();
//
// Run is for one thread; the rest is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/etcd.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

namespace meshlearn::ledger {

struct ClusterOptions {
  std::vector<std::string> etcd;  // endpoints (ParseEtcdEndpoints)
  std::string advertise_url;      // this candidate's RPC URL, told to clients by the others
  int64_t lease_ttl_s = 2;        // etcd raises it to its minimum (1.5 election timeouts)
  int64_t poll_ms = 50;           // how often a follower looks for new blocks and the leader
  int64_t etcd_timeout_ms = 500;  // per etcd request; well under the TTL
  uint32_t batch = 100;           // blocks per etcd range read
  std::string evidence_dir;       // where a refused block is written ("" : nowhere)
  int64_t read_wait_ms = 2000;    // how long a standby's read waits to catch up (CatchUp)
};

// One time this candidate took over: the chain's height then and how long it had gone without
// a block (the wall-clock time since the last block in etcd).
struct Takeover {
  uint64_t height = 0;
  int64_t gap_ms = 0;
};

class ClusterCandidate {
 public:
  // Makes `sequencer` replicated (Sequencer::SetReplicated). `chain`, `sequencer` outlive this.
  ClusterCandidate(SharedChain* chain, Sequencer* sequencer, ClusterOptions options);
  ~ClusterCandidate();

  // The URL stored in the leader record (known once the RPC server listens). REQUIRES: before Run.
  void set_advertise_url(std::string url) { options_.advertise_url = std::move(url); }

  static std::string Prefix(const Genesis& genesis);
  static std::string BlockKey(const std::string& prefix, uint64_t height);

  // FailedPrecondition if etcd holds blocks of another history than the local chain (a local
  // block that etcd does not hold, or holds differently); Unavailable if etcd is unreachable.
  Status CheckEtcd();

  // CheckEtcd (retried while etcd is unreachable), then follows, campaigns, leads; until
  // Stop() (OK), a refused block (PermissionDenied) or another history (FailedPrecondition).
  Status Run();
  void Stop() { stop_.store(true); }

  // Read-after-apply for RPC reads (any thread): OK at once on the leader; on a standby, asks
  // etcd how many blocks it holds above the local height and waits (read_wait_ms at most) until
  // Run has applied them. Unavailable, saying why, when etcd cannot be asked or the wait runs
  // out: the client asks another candidate.
  Status CatchUp();

  // Applies the blocks etcd holds above the local height, verified; how many.
  Result<uint64_t> SyncFromEtcd();

  bool leading() const { return leading_.load(); }
  // For chain_status: leading, leader key and URL, etcd, prefix, takeovers (each {height,
  // gap_ms}) and their count.
  nlohmann::json StatusJson();
  std::vector<Takeover> takeovers();

 private:
  Status CommitToEtcd(const Block& block);  // the sequencer's commit hook
  Result<bool> Campaign();
  void StepDown(const std::string& why);
  bool LeaseAlive() const;
  Status Refuse(uint64_t height, const std::string& bytes, const Status& why);

  SharedChain* chain_;
  Sequencer* sequencer_;
  ClusterOptions options_;
  std::string prefix_;
  std::unique_ptr<EtcdClient> loop_etcd_;    // Run's thread
  std::unique_ptr<EtcdClient> commit_etcd_;  // the sequencer's thread (the commit hook)
  std::unique_ptr<EtcdClient> read_etcd_;    // RPC threads (CatchUp)

  std::atomic<bool> stop_{false};
  std::atomic<bool> leading_{false};
  std::atomic<bool> lost_{false};              // a commit found that we no longer lead
  std::atomic<int64_t> lease_deadline_ms_{0};  // steady clock
  int64_t lease_id_ = 0;
  int64_t lease_ttl_ms_ = 0;

  std::mutex mu_;              // the fields below
  std::string leader_record_;  // ours, while leading (the value the commit compares)
  std::string leader_key_hex_, leader_url_;
  std::vector<Takeover> takeovers_;
};

}  // namespace meshlearn::ledger
