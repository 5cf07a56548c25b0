// The sequencer: a mempool of admitted transactions and a loop that turns it into a block every
// genesis.block_interval_ms.
//
// Admission (Submit): the transaction must pass Chain::CheckTx. The mempool is keyed by tx id
// (the same signed transaction twice is one entry) and by (sender, nonce) (a second transaction
// with a nonce already pending is refused), so resending a transaction -- e.g. a client retrying
// after a timeout -- never pays twice: while pending it is the same entry, once included its
// receipt is returned, and its nonce can never be used again.
//
// Ordering is deterministic: by sender key, then nonce. A block takes, for each sender, the run
// of consecutive nonces starting at the sender's next nonce; a transaction waiting for a missing
// earlier nonce stays pending (at most max_nonce_gap ahead), one whose nonce was used by another
// transaction is dropped with a reason.
//
// Acknowledgement: a transaction is "included" only once its block is committed durably
// (ProduceBlock returned); that is when WaitFor and get_tx report it.
//
// Replicated (SetReplicated, used by ClusterCandidate in cluster.h): the sequencer is one of
// several candidates and produces only while it leads. Until SetLeading(true) it refuses
// transactions with Unavailable (the client fails over to the leader) and makes no block; each
// block passes the commit hook (the etcd compare-and-swap) before it is committed locally, so
// nothing is acknowledged that etcd does not hold. SetLeading(false) drops the mempool: those
// transactions were never acknowledged, and their senders resend them to the new leader.
//
//   Sequencer seq(&shared, sequencer_key, SystemClock::Default());
//   seq.Start();                               // background loop
//   Result<TxStatusInfo> st = seq.Submit(tx);  // pending, or included (a resend)
//   TxStatusInfo done = seq.WaitFor(st->tx_id, 10000);
//   seq.Stop();
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/prometheus.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

struct SequencerOptions {
  size_t max_mempool = 20000;
  uint64_t max_nonce_gap = 64;  // how far past a sender's next nonce a pending tx may be
  uint32_t max_block_txs = 5000;
  size_t remembered_rejections = 10000;  // get_tx answers "rejected: why" for this many
  int64_t block_interval_ms = 0;         // 0: the genesis block interval
};

enum class TxState { kUnknown, kPending, kIncluded, kRejected };
std::string_view TxStateName(TxState s);

struct TxStatusInfo {
  Hash256 tx_id;
  TxState state = TxState::kUnknown;
  std::optional<Receipt> receipt;  // when included
  Status error;                    // when rejected
};
nlohmann::json TxStatusToJson(const TxStatusInfo& s);

// What the chain says about a tx id: included (with receipt) or unknown.
TxStatusInfo LookupCommitted(SharedChain* chain, const Hash256& tx_id);

class Sequencer {
 public:
  // `chain` and `clock` must outlive the sequencer.
  Sequencer(SharedChain* chain, KeyPair key, Clock* clock, SequencerOptions options = {});
  ~Sequencer();
  Sequencer(const Sequencer&) = delete;
  Sequencer& operator=(const Sequencer&) = delete;

  // Admits `tx` (see the top of this file). Errors: CheckTx's, FailedPrecondition for a nonce
  // already pending, ResourceExhausted for a full mempool or a too distant nonce.
  Result<TxStatusInfo> Submit(const Transaction& tx);

  // pending / included / rejected / unknown.
  TxStatusInfo Lookup(const Hash256& tx_id);

  // Blocks until `tx_id` is no longer pending or `timeout_ms` passes; returns its state then.
  TxStatusInfo WaitFor(const Hash256& tx_id, int64_t timeout_ms);

  // Builds, signs and commits one block from the mempool now, at the clock's time. The loop
  // calls this; tests call it directly.
  Result<Block> ProduceOnce();

  // Makes this sequencer a cluster candidate (see the top of this file): not leading, and every
  // block passes `before_commit` first. REQUIRES: before Start().
  void SetReplicated(std::function<Status(const Block&)> before_commit);
  // Starts or stops producing and admitting. `why_not` is the error Submit gives meanwhile
  // (e.g. "not the leader; the leader is at URL"). Waits for a block in progress.
  void SetLeading(bool leading, std::string why_not = "");
  bool leading();

  // The loop: ProduceOnce every block interval (empty blocks too: time moves on chain).
  void Start();
  // Stops the loop; idempotent. Pending transactions are dropped (never acknowledged).
  void Stop();

  size_t mempool_size();
  const PublicKey& public_key() const { return key_.public_key(); }
  int64_t block_interval_ms() const { return options_.block_interval_ms; }

  // What happened to submitted transactions, keyed by {outcome, reason}: {"admitted", ""},
  // {"already_included", ""}, {"refused", <status code>} at Submit, {"dropped", <status code>}
  // when a pending one was left out of a block. For GET /metrics.
  const LabeledCounters& tx_outcomes() const { return tx_outcomes_; }
  uint64_t blocks_produced() const { return blocks_produced_.load(); }

 private:
  struct Pending {
    Transaction tx;
    Hash256 id;
  };
  using SlotKey = std::pair<PublicKey, uint64_t>;  // (sender, nonce)

  Result<TxStatusInfo> Admit(const Transaction& tx);
  void Reject(const Hash256& id, Status why);  // REQUIRES: mu_ held
  void Loop();

  SharedChain* chain_;
  KeyPair key_;
  Clock* clock_;
  SequencerOptions options_;

  std::mutex mu_;  // mempool and rejections; taken before the chain's lock
  std::map<SlotKey, Pending> pool_;
  std::map<Hash256, SlotKey> by_id_;
  std::map<Hash256, Status> rejected_;
  std::deque<Hash256> rejected_order_;
  bool replicated_ = false;
  bool leading_ = true;  // always, unless replicated
  std::string why_not_leading_;
  std::function<Status(const Block&)> before_commit_;

  LabeledCounters tx_outcomes_;
  std::atomic<uint64_t> blocks_produced_{0};

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace meshlearn::ledger
