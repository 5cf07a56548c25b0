// Internal: the SQLite store behind a Chain.
//
// Schema (one file, WAL mode, synchronous=FULL):
//   meta(key TEXT PRIMARY KEY, value BLOB)        genesis_hash, height, last_block_hash,
//                                                 last_block_time, state_hash
//   blocks(height INTEGER PRIMARY KEY, hash, data)    EncodeBlock
//   tx_index(k INTEGER, loc INTEGER)                  where each transaction is: k = the first
//                                                     8 bytes of its id, loc = height << 24 | idx
//   account_ids(key BLOB PRIMARY KEY, id INTEGER)     a local number for every account key
//   account_history(acct INTEGER, loc INTEGER)        history index (TxParties), by number
//   state(tbl INTEGER, key BLOB, value BLOB)           the state rows (StateTable)
// Every block is written in one SQLite transaction, so a crash leaves all of it or none.
//
// The two indexes take most of the write cost of a block (one row per transaction and one per
// party, at random places in their B-trees), so their rows are small integers: ~3x more rows
// per page than 32-byte keys, so a block dirties (and the WAL fsyncs) ~3x fewer pages. tx_index
// keys are id prefixes, so a lookup yields candidates that the caller checks against the full
// id (a collision needs ~2^32 transactions by chance; it costs a lookup one extra block read).
//
// Indexes are derived data (a function of the blocks), so they are written in batches: the rows
// of recent blocks stay in memory (and answer lookups from there) until kFlushRows rows or
// kFlushBlocks blocks are pending, then go into the tables inside that block's transaction,
// which also records the 'indexed' height in meta. Random inserts from many blocks then share
// B-tree pages, so far fewer pages are written per block. Nothing durable depends on it: on open
// the blocks above the 'indexed' height are re-indexed into memory, so a crash loses nothing.
// A database from before this layout (txs/account_txs tables) has them rebuilt on open.
//
// Not thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ledger_state.h"
#include "meshlearn/base/bytes.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/block.h"

struct sqlite3;
struct sqlite3_stmt;

namespace meshlearn::ledger {

struct StoredMeta {
  Hash256 genesis_hash;
  uint64_t height = 0;
  Hash256 last_block_hash;
  int64_t last_block_time = 0;
  Hash256 state_hash;
};

class Store {
 public:
  // `path` on `env`'s file system (env_vfs.h: Env::Default() is the real one, any other Env is
  // used by this one connection alone).
  static Result<std::unique_ptr<Store>> Open(Env* env, const std::string& path);
  ~Store();

  // Empty if the database is new.
  Result<std::optional<StoredMeta>> ReadMeta();
  // Loads every state row.
  Status LoadState(LedgerState* state);

  // Writes the meta and every dirty row of `state` (then clears the dirty sets), plus the block
  // and its indexes if `block` is given, in one transaction. Nothing is written on error.
  Status Commit(const StoredMeta& meta, LedgerState* state, const Block* block,
                const Bytes* encoded_block);

  Result<Block> GetBlock(uint64_t height);
  // (height, index) of every transaction whose id starts like `id`'s (usually one, none if
  // unknown); the caller checks the full id.
  Result<std::vector<std::pair<uint64_t, uint32_t>>> FindTxCandidates(const Hash256& id);
  // (height, index) pairs, newest first.
  Result<std::vector<std::pair<uint64_t, uint32_t>>> ListAccountTxs(const PublicKey& key,
                                                                    uint64_t offset,
                                                                    uint64_t limit);

 private:
  class Stmt;
  explicit Store(sqlite3* db);
  Status Exec(const char* sql);
  Status Error(const char* what) const;
  Status Prepare(const char* sql, sqlite3_stmt** out);
  // Index rows not yet in the tables: those of the blocks after the 'indexed' height.
  struct PendingIndex {
    std::vector<std::pair<int64_t, int64_t>> txs;            // (TxKey, loc)
    std::map<PublicKey, std::vector<int64_t>, KeyLess<PublicKey>> history;  // locs ascending
    size_t rows = 0;
    uint64_t blocks = 0;
    uint64_t height = 0;  // of the last block indexed here
  };
  // Flushed once this many rows or blocks are pending (bounds memory and the work on open).
  static constexpr size_t kFlushRows = 32768;
  static constexpr uint64_t kFlushBlocks = 256;
  static void IndexBlock(const Block& block, PendingIndex* into);
  // Inside a write transaction: writes the rows and sets the 'indexed' height.
  Status FlushIndexes(const std::vector<const PendingIndex*>& parts, uint64_t height);
  // On open: indexes the blocks after the 'indexed' height into pending_.
  Status LoadPendingIndexes();
  // The local number of an account key, assigning the next one if new (inside a write
  // transaction; new numbers are cached in new_ids_ until the transaction commits).
  Result<int64_t> AccountId(const PublicKey& key);
  // Looks an account number up without assigning one; 0 if the key has none.
  Result<int64_t> FindAccountId(const PublicKey& key);
  // Databases written before tx_index/account_history: rebuilds both from the blocks.
  Status MigrateIndexes();

  sqlite3* db_;
  sqlite3_stmt* put_meta_ = nullptr;
  sqlite3_stmt* put_indexed_ = nullptr;
  sqlite3_stmt* put_block_ = nullptr;
  sqlite3_stmt* put_tx_ = nullptr;
  sqlite3_stmt* put_account_tx_ = nullptr;
  sqlite3_stmt* get_account_id_ = nullptr;
  sqlite3_stmt* put_account_id_ = nullptr;
  sqlite3_stmt* put_state_ = nullptr;
  sqlite3_stmt* del_state_ = nullptr;
  sqlite3_stmt* get_block_ = nullptr;
  sqlite3_stmt* get_tx_ = nullptr;
  sqlite3_stmt* list_account_txs_ = nullptr;
  // Account numbers known to be committed, and those assigned in the open write transaction.
  std::map<PublicKey, int64_t, KeyLess<PublicKey>> account_ids_;
  std::map<PublicKey, int64_t, KeyLess<PublicKey>> new_ids_;
  int64_t next_account_id_ = 0;  // 0: not read yet
  PendingIndex pending_;
};

}  // namespace meshlearn::ledger
