// Internal: the SQLite store behind a Chain.
//
// Schema (one file, WAL mode, synchronous=FULL):
//   meta(key TEXT PRIMARY KEY, value BLOB)        genesis_hash, height, last_block_hash,
//                                                 last_block_time, state_hash
//   blocks(height INTEGER PRIMARY KEY, hash, data)    EncodeBlock
//   txs(id BLOB PRIMARY KEY, height, idx)              where each transaction is
//   account_txs(account, height, idx)                  history index (TxParties)
//   state(tbl INTEGER, key BLOB, value BLOB)           the state rows (StateTable)
// Every block is written in one SQLite transaction, so a crash leaves all of it or none.
//
// Not thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ledger_state.h"
#include "meshlearn/base/bytes.h"
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
  static Result<std::unique_ptr<Store>> Open(const std::string& path);
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
  // (height, index) of a transaction.
  Result<std::pair<uint64_t, uint32_t>> FindTx(const Hash256& id);
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

  sqlite3* db_;
  sqlite3_stmt* put_meta_ = nullptr;
  sqlite3_stmt* put_block_ = nullptr;
  sqlite3_stmt* put_tx_ = nullptr;
  sqlite3_stmt* put_account_tx_ = nullptr;
  sqlite3_stmt* put_state_ = nullptr;
  sqlite3_stmt* del_state_ = nullptr;
  sqlite3_stmt* get_block_ = nullptr;
  sqlite3_stmt* get_tx_ = nullptr;
  sqlite3_stmt* list_account_txs_ = nullptr;
};

}  // namespace meshlearn::ledger
