// Chain: the ledger's state machine plus its durable store.
//
// The state (accounts, nodes, tasks, work units, treasury, jackpot) lives in memory, in sorted
// maps; SQLite (WAL mode, synchronous=FULL) is the durable log and snapshot. Each block is one
// SQLite transaction holding the block, its receipts, the history index and every state row the
// block changed, so after a crash at any instant the database holds exactly the blocks whose
// ProduceBlock/ApplyBlock returned OK (and possibly the one in flight, all or nothing), and Open
// resumes at the last of them.
//
// Execution is deterministic: no clocks, no randomness other than what the block carries, and
// no iteration over unordered containers. The state hash is BLAKE2b over the canonical
// encoding of every record in key order, so a follower that replays the blocks gets the same
// hash, and ReplayFromGenesis proves it.
//
//   ML_ASSIGN_OR_RETURN(Genesis g, LoadGenesis(env, "genesis.toml"));
//   ML_ASSIGN_OR_RETURN(std::unique_ptr<Chain> chain, Chain::Open("ledger.db", g));
//   // sequencer:
//   ML_RETURN_IF_ERROR(chain->CheckTx(tx));            // mempool admission
//   ML_ASSIGN_OR_RETURN(Block b, chain->ProduceBlock({tx}, now_ms, sequencer_key));
//   // follower:
//   ML_RETURN_IF_ERROR(follower->ApplyBlock(b, sequencer_key.public_key()));
//
// Thread-safety: NOT thread-safe. One thread at a time, including the const getters (they
// share the SQLite connection); the RPC service wraps a Chain in a mutex. One Chain per database
// file: two processes writing the same file would diverge in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/state.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

class LedgerState;  // internal (src/ledger_state.h)
class Store;        // internal (src/store.h)

// A transaction that ProduceBlock left out of the block, and why.
struct RejectedTx {
  Hash256 tx_id;
  Status status;
};

// A receipt as stored: the receipt carries its block height and index.
struct TxRecord {
  Transaction tx;
  Receipt receipt;
};

class Chain {
 public:
  // Opens `db_path` (creating it from `genesis` if it does not exist) and loads the state.
  // Refuses a database made from a different genesis (FailedPrecondition) and a database whose
  // stored state does not hash to the last block's state hash (DataLoss).
  static Result<std::unique_ptr<Chain>> Open(const std::string& db_path, const Genesis& genesis);
  // The same on `env`'s file system: a MemEnv runs a chain in memory, and its power cut
  // (MemEnv::CutPower) loses exactly what SQLite had not synced (ledger/src/env_vfs.h).
  static Result<std::unique_ptr<Chain>> Open(Env* env, const std::string& db_path,
                                             const Genesis& genesis);

  ~Chain();
  Chain(const Chain&) = delete;
  Chain& operator=(const Chain&) = delete;

  const Genesis& genesis() const { return genesis_; }
  const Hash256& genesis_hash() const { return genesis_hash_; }

  // Mempool admission, against the current state: size <= kMaxTxBytes, chain id, signature,
  // known sender (or a faucet transaction on a faucet chain), nonce >= the account's next
  // nonce, and fee <= balance. Passing CheckTx does not mean the transaction will succeed.
  Status CheckTx(const Transaction& tx) const;

  // Sequencer path: executes `txs` in the given order on top of the current state, builds the
  // block (height = Height() + 1), signs it and commits it durably before returning.
  // Transactions that are not admissible at their turn (bad signature, wrong chain id, nonce !=
  // the sender's next nonce, unknown sender, too big) are left out of the block and, if
  // `rejected` is given, listed there; an empty block is still a block.
  // `before_commit` (optional) is called with the signed block after execution and before it
  // is made durable; its error aborts the block (state rolled back, nothing persisted) and is
  // returned. The replicated sequencer commits the block to etcd there (ledger/cluster.h).
  // REQUIRES: time_ms >= the previous block's time; sequencer is authorized by the genesis
  // (IsAuthorizedSequencer).
  Result<Block> ProduceBlock(std::vector<Transaction> txs, int64_t time_ms,
                             const KeyPair& sequencer,
                             std::vector<RejectedTx>* rejected = nullptr,
                             const std::function<Status(const Block&)>& before_commit = {});

  // Follower path: checks height, prev hash, chain id, time, the signature by
  // `expected_sequencer`, the tx root, then re-executes every transaction and refuses the block
  // (state unchanged, nothing persisted) if any transaction is inadmissible or the receipts
  // root or state hash differ. On OK the block is committed durably.
  Status ApplyBlock(const Block& block, const PublicKey& expected_sequencer);

  // ---- Reads.
  uint64_t Height() const { return height_; }   // 0 before the first block
  Hash256 StateHash() const { return state_hash_; }  // after the last block (or genesis)
  Hash256 LastBlockHash() const { return last_block_hash_; }  // GenesisHash at height 0
  int64_t LastBlockTime() const { return last_block_time_ms_; }
  Result<Block> GetBlock(uint64_t height) const;  // 1..Height()
  // NotFound for an account that never received anything.
  Result<Account> GetAccount(const PublicKey& key) const;
  // The nonce the next transaction from `key` must carry (0 for an unknown account).
  uint64_t NextNonce(const PublicKey& key) const;
  Result<TxRecord> GetTransaction(const Hash256& tx_id) const;
  Result<Receipt> GetReceipt(const Hash256& tx_id) const;
  Result<NodeRecord> GetNode(const PublicKey& node_id) const;
  std::vector<NodeRecord> ListNodes(uint64_t offset, uint64_t limit) const;  // by node id
  Result<TaskRecord> GetTask(const Hash256& task_id) const;
  std::vector<TaskRecord> ListTasks(uint64_t offset, uint64_t limit) const;  // by task id
  std::vector<WorkUnit> ListWorkUnits(const Hash256& task_id) const;
  Result<WorkUnit> GetWorkUnit(const Hash256& task_id, uint32_t index) const;
  // Transactions that name `key`: as sender or in any public-key field of the payload
  // (transfer or faucet recipient, node id), newest first.
  std::vector<TxRecord> ListAccountTxs(const PublicKey& key, uint64_t offset,
                                       uint64_t limit) const;
  Totals GetTotals() const;

  // Re-executes every stored block from genesis in a fresh in-memory state, checking each
  // block's state hash on the way, and compares the result with the live state.
  // OK iff they are equal; also returns the replayed final hash through `replayed`.
  Status ReplayFromGenesis(Hash256* replayed = nullptr) const;

  // For tests and debug builds: OK iff the books balance (Totals::Check).
  Status CheckInvariants() const;

 private:
  Chain(Genesis genesis, std::unique_ptr<Store> store, std::unique_ptr<LedgerState> state);
  // Checks the books, persists the block and moves the head; rolls the state back on error.
  Status CommitBlock(const Block& block, const std::vector<ByteSpan>& tx_wires);
  Result<TxRecord> TxAt(uint64_t height, uint32_t index) const;

  Genesis genesis_;
  Hash256 genesis_hash_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<LedgerState> state_;
  uint64_t height_ = 0;
  Hash256 last_block_hash_;
  int64_t last_block_time_ms_ = 0;
  Hash256 state_hash_;
};

}  // namespace meshlearn::ledger
