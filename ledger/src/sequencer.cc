#include "meshlearn/ledger/sequencer.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "meshlearn/base/check.h"
#include "meshlearn/base/log.h"

namespace meshlearn::ledger {

std::string_view TxStateName(TxState s) {
  switch (s) {
    case TxState::kUnknown: return "unknown";
    case TxState::kPending: return "pending";
    case TxState::kIncluded: return "included";
    case TxState::kRejected: return "rejected";
  }
  return "unknown";
}

nlohmann::json TxStatusToJson(const TxStatusInfo& s) {
  nlohmann::json j = {{"tx_id", s.tx_id.ToHex()}, {"status", std::string(TxStateName(s.state))}};
  if (s.receipt) {
    j["height"] = s.receipt->height;
    j["receipt"] = ReceiptToJson(*s.receipt);
  }
  if (s.state == TxState::kRejected) {
    j["error"] = {{"code", std::string(StatusCodeName(s.error.code()))},
                  {"message", s.error.message()}};
  }
  return j;
}

TxStatusInfo LookupCommitted(SharedChain* chain, const Hash256& tx_id) {
  TxStatusInfo info;
  info.tx_id = tx_id;
  Result<Receipt> r = chain->With([&](Chain& c) { return c.GetReceipt(tx_id); });
  if (r.ok()) {
    info.state = TxState::kIncluded;
    info.receipt = *r;
  }
  return info;
}

Sequencer::Sequencer(SharedChain* chain, KeyPair key, Clock* clock, SequencerOptions options)
    : chain_(chain), key_(std::move(key)), clock_(clock), options_(options) {
  if (options_.block_interval_ms <= 0) {
    options_.block_interval_ms =
        chain_->With([](Chain& c) { return c.genesis().block_interval_ms; });
  }
}

Sequencer::~Sequencer() { Stop(); }

Result<TxStatusInfo> Sequencer::Submit(const Transaction& tx) {
  Result<TxStatusInfo> r = Admit(tx);
  if (!r.ok()) {
    tx_outcomes_.Add({"refused", std::string(StatusCodeName(r.status().code()))});
  } else {
    tx_outcomes_.Add({r->state == TxState::kIncluded ? "already_included" : "admitted", ""});
  }
  return r;
}

Result<TxStatusInfo> Sequencer::Admit(const Transaction& tx) {
  Hash256 id = TxId(tx);
  std::lock_guard<std::mutex> lock(mu_);
  if (!leading_) return Unavailable(why_not_leading_);
  if (by_id_.count(id)) return TxStatusInfo{id, TxState::kPending, std::nullopt, Status::Ok()};

  // A resend of a committed transaction gets its receipt, not a nonce error: the sender learns
  // that its first attempt went through.
  Status check;
  uint64_t next_nonce = 0;
  std::optional<Receipt> receipt;
  chain_->With([&](Chain& c) {
    Result<Receipt> r = c.GetReceipt(id);
    if (r.ok()) {
      receipt = *r;
      return;
    }
    check = c.CheckTx(tx);
    next_nonce = c.NextNonce(tx.sender);
  });
  if (receipt) return TxStatusInfo{id, TxState::kIncluded, receipt, Status::Ok()};
  if (!check.ok()) return check;

  SlotKey slot{tx.sender, tx.nonce};
  if (auto it = pool_.find(slot); it != pool_.end()) {
    return FailedPrecondition("nonce " + std::to_string(tx.nonce) + " of " +
                              tx.sender.ShortHex() + " is already taken by pending transaction " +
                              it->second.id.ToHex() + "; wait for it, or sign with nonce " +
                              std::to_string(tx.nonce + 1));
  }
  if (tx.nonce > next_nonce + options_.max_nonce_gap) {
    return ResourceExhausted("nonce " + std::to_string(tx.nonce) + " is more than " +
                             std::to_string(options_.max_nonce_gap) +
                             " ahead of the account's next nonce " + std::to_string(next_nonce) +
                             "; send the earlier transactions first");
  }
  if (pool_.size() >= options_.max_mempool) {
    return ResourceExhausted("the mempool is full (" + std::to_string(options_.max_mempool) +
                             " transactions); retry after the next block");
  }
  pool_.emplace(slot, Pending{tx, id});
  by_id_.emplace(id, slot);
  rejected_.erase(id);  // admissible now (e.g. a resend after the account was funded)
  return TxStatusInfo{id, TxState::kPending, std::nullopt, Status::Ok()};
}

TxStatusInfo Sequencer::Lookup(const Hash256& tx_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_id_.count(tx_id)) return {tx_id, TxState::kPending, std::nullopt, Status::Ok()};
    if (auto it = rejected_.find(tx_id); it != rejected_.end()) {
      return {tx_id, TxState::kRejected, std::nullopt, it->second};
    }
  }
  return LookupCommitted(chain_, tx_id);
}

TxStatusInfo Sequencer::WaitFor(const Hash256& tx_id, int64_t timeout_ms) {
  // Real time, not clock_: this is a wait on other threads, not a block timestamp.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // Height first: a block committed after this read wakes the wait below.
    uint64_t h = chain_->height();
    TxStatusInfo info = Lookup(tx_id);
    int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (info.state != TxState::kPending || left_ms <= 0 || chain_->shutting_down()) return info;
    chain_->WaitAbove(h, left_ms);
  }
}

void Sequencer::Reject(const Hash256& id, Status why) {
  if (rejected_.emplace(id, std::move(why)).second) rejected_order_.push_back(id);
  while (rejected_order_.size() > options_.remembered_rejections) {
    rejected_.erase(rejected_order_.front());
    rejected_order_.pop_front();
  }
}

void Sequencer::SetReplicated(std::function<Status(const Block&)> before_commit) {
  std::lock_guard<std::mutex> lock(mu_);
  replicated_ = true;
  leading_ = false;
  why_not_leading_ = "this sequencer candidate is not the leader (yet); send to another";
  before_commit_ = std::move(before_commit);
}

void Sequencer::SetLeading(bool leading, std::string why_not) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(replicated_ || leading) << "SetLeading(false) on a sequencer that is not replicated";
  leading_ = leading;
  if (!why_not.empty()) why_not_leading_ = std::move(why_not);
  if (!leading) {
    // Never acknowledged: their senders resend to the new leader, which admits them once.
    for (size_t i = 0; i < pool_.size(); ++i) {
      tx_outcomes_.Add({"dropped", std::string(StatusCodeName(StatusCode::kUnavailable))});
    }
    pool_.clear();
    by_id_.clear();
  }
}

bool Sequencer::leading() {
  std::lock_guard<std::mutex> lock(mu_);
  return leading_;
}

Result<Block> Sequencer::ProduceOnce() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!leading_) return Unavailable(why_not_leading_);
  Result<Block> block = Internal("unset");
  std::vector<RejectedTx> rejected;
  std::vector<std::pair<Hash256, Status>> stale;
  chain_->With([&](Chain& c) {
    // Per sender (in key order), the run of consecutive nonces from the next one.
    std::vector<Transaction> txs;
    auto it = pool_.begin();
    while (it != pool_.end()) {
      const PublicKey sender = it->first.first;
      uint64_t expect = c.NextNonce(sender);
      for (; it != pool_.end() && it->first.first == sender; ++it) {
        uint64_t nonce = it->first.second;
        if (nonce < expect) {
          stale.emplace_back(it->second.id,
                             FailedPrecondition("nonce " + std::to_string(nonce) +
                                                " was used by another transaction; the account's "
                                                "next nonce is " + std::to_string(expect)));
        } else if (nonce == expect && txs.size() < options_.max_block_txs) {
          txs.push_back(it->second.tx);
          ++expect;
        }
      }
    }
    int64_t now = std::max(clock_->NowMillis(), c.LastBlockTime());
    block = c.ProduceBlock(std::move(txs), now, key_, &rejected, before_commit_);
  });
  if (!block.ok()) {
    ML_LOG_ERROR("sequencer: producing a block failed: {}", block.status().ToString());
    return block.status();
  }
  for (const Transaction& tx : block->txs) {
    auto slot = by_id_.find(TxId(tx));
    if (slot == by_id_.end()) continue;
    pool_.erase(slot->second);
    by_id_.erase(slot);
  }
  for (RejectedTx& r : rejected) stale.emplace_back(r.tx_id, r.status);
  for (auto& [id, why] : stale) {
    if (auto slot = by_id_.find(id); slot != by_id_.end()) {
      pool_.erase(slot->second);
      by_id_.erase(slot);
    }
    ML_LOG_DEBUG("sequencer: dropped tx {}: {}", id.ShortHex(), why.message());
    tx_outcomes_.Add({"dropped", std::string(StatusCodeName(why.code()))});
    Reject(id, why);
  }
  blocks_produced_.fetch_add(1);
  chain_->PublishHeight(block->header.height);
  return block;
}

void Sequencer::Start() {
  std::lock_guard<std::mutex> lock(loop_mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Sequencer::Stop() {
  {
    std::lock_guard<std::mutex> lock(loop_mu_);
    stop_ = true;
  }
  loop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Sequencer::Loop() {
  using std::chrono::milliseconds;
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    next += milliseconds(options_.block_interval_ms);
    {
      std::unique_lock<std::mutex> lock(loop_mu_);
      if (loop_cv_.wait_until(lock, next, [this] { return stop_; })) return;
    }
    Result<Block> b = ProduceOnce();
    if (b.ok() && !b->txs.empty()) {
      ML_LOG_DEBUG("block {} with {} txs", b->header.height, b->txs.size());
    }
    // Behind schedule (a slow disk): start the next interval from now rather than bursting.
    auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;
  }
}

size_t Sequencer::mempool_size() {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.size();
}

}  // namespace meshlearn::ledger
