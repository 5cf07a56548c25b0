#include "store.h"

#include <sqlite3.h>

#include <algorithm>

#include "env_vfs.h"
#include "execute.h"
#include "meshlearn/base/encoding.h"

namespace meshlearn::ledger {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS blocks(height INTEGER PRIMARY KEY, hash BLOB NOT NULL,
                                  data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tx_index(k INTEGER NOT NULL, loc INTEGER NOT NULL,
                                    PRIMARY KEY(k, loc)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS account_ids(key BLOB PRIMARY KEY, id INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS account_history(acct INTEGER NOT NULL, loc INTEGER NOT NULL,
                                           PRIMARY KEY(acct, loc)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state(tbl INTEGER NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
                                 PRIMARY KEY(tbl, key)) WITHOUT ROWID;
)sql";

Bytes EncodeMeta(const StoredMeta& m) {
  Encoder e;
  e.PutHash(m.genesis_hash).PutU64(m.height).PutHash(m.last_block_hash);
  e.PutI64(m.last_block_time).PutHash(m.state_hash);
  return e.Take();
}

Status DecodeMeta(ByteSpan b, StoredMeta* m) {
  Decoder d(b, "ledger meta");
  ML_RETURN_IF_ERROR(d.GetHash(&m->genesis_hash, "genesis_hash"));
  ML_RETURN_IF_ERROR(d.GetU64(&m->height, "height"));
  ML_RETURN_IF_ERROR(d.GetHash(&m->last_block_hash, "last_block_hash"));
  ML_RETURN_IF_ERROR(d.GetI64(&m->last_block_time, "last_block_time"));
  ML_RETURN_IF_ERROR(d.GetHash(&m->state_hash, "state_hash"));
  return d.Finish();
}

// Index locations: height << 24 | index (kMaxTxsPerBlock < 2^24), so rows sort by position.
constexpr int kLocShift = 24;
static_assert(kMaxTxsPerBlock < (1u << kLocShift));
int64_t Loc(uint64_t height, uint32_t idx) {
  return static_cast<int64_t>((height << kLocShift) | idx);
}
std::pair<uint64_t, uint32_t> FromLoc(int64_t loc) {
  auto u = static_cast<uint64_t>(loc);
  return {u >> kLocShift, static_cast<uint32_t>(u & ((1u << kLocShift) - 1))};
}
// tx_index key: the first 8 bytes of the id, as a signed integer.
int64_t TxKey(const Hash256& id) {
  uint64_t k = 0;
  for (int i = 0; i < 8; ++i) k = (k << 8) | id.bytes[i];
  return static_cast<int64_t>(k);
}

Bytes UnitKey(const WorkUnitKey& k) {
  Bytes b(k.first.bytes.begin(), k.first.bytes.end());
  for (int i = 3; i >= 0; --i) b.push_back(static_cast<uint8_t>(k.second >> (8 * i)));
  return b;
}

ByteSpan ColumnBlob(sqlite3_stmt* st, int col) {
  const void* p = sqlite3_column_blob(st, col);
  int n = sqlite3_column_bytes(st, col);
  return {static_cast<const uint8_t*>(p), static_cast<size_t>(n)};
}

// Resets a statement when it goes out of scope, so it can be reused.
class Reset {
 public:
  explicit Reset(sqlite3_stmt* st) : st_(st) {}
  ~Reset() {
    sqlite3_reset(st_);
    sqlite3_clear_bindings(st_);
  }

 private:
  sqlite3_stmt* st_;
};

}  // namespace

Store::Store(sqlite3* db) : db_(db) {}

Store::~Store() {
  for (sqlite3_stmt* st : {put_meta_, put_indexed_, put_block_, put_tx_, put_account_tx_, get_account_id_,
                           put_account_id_, put_state_, del_state_, get_block_, get_tx_,
                           list_account_txs_}) {
    sqlite3_finalize(st);
  }
  sqlite3_close(db_);
}

Status Store::Error(const char* what) const {
  return Internal(std::string("ledger store: ") + what + ": " + sqlite3_errmsg(db_));
}

Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Internal(std::string("ledger store: ") + msg);
  }
  return Status::Ok();
}

Status Store::Prepare(const char* sql, sqlite3_stmt** out) {
  if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, out, nullptr) != SQLITE_OK) {
    return Error(sql);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Store>> Store::Open(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(const char* vfs, SqliteVfsFor(env));
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, vfs);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Unavailable(path + ": cannot open ledger database: " + msg);
  }
  std::unique_ptr<Store> s(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL + FULL: a commit is durable when it returns, and readers do not block the writer.
  // Checkpoints every 8192 pages (32 MiB of WAL) rather than SQLite's 1000: a block rewrites
  // many of the index and state pages the last few blocks wrote, and a checkpoint copies only
  // the newest version of each page, so fewer checkpoints write (and fsync) less. Commits stay
  // durable either way (the WAL is fsynced at every commit).
  // An Env's VFS has no locks and no shared memory (env_vfs.h): one connection, WAL index in
  // the heap.
  if (vfs != nullptr) ML_RETURN_IF_ERROR(s->Exec("PRAGMA locking_mode=EXCLUSIVE;"));
  ML_RETURN_IF_ERROR(s->Exec(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=-65536; "
      "PRAGMA wal_autocheckpoint=8192;"));
  ML_RETURN_IF_ERROR(s->Exec(kSchema));
  ML_RETURN_IF_ERROR(s->Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES('head', ?)",
                                &s->put_meta_));
  ML_RETURN_IF_ERROR(s->Prepare("INSERT INTO blocks(height, hash, data) VALUES(?, ?, ?)",
                                &s->put_block_));
  ML_RETURN_IF_ERROR(
      s->Prepare("INSERT OR IGNORE INTO tx_index(k, loc) VALUES(?, ?)", &s->put_tx_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "INSERT OR IGNORE INTO account_history(acct, loc) VALUES(?, ?)", &s->put_account_tx_));
  ML_RETURN_IF_ERROR(
      s->Prepare("SELECT id FROM account_ids WHERE key = ?", &s->get_account_id_));
  ML_RETURN_IF_ERROR(
      s->Prepare("INSERT INTO account_ids(key, id) VALUES(?, ?)", &s->put_account_id_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "INSERT OR REPLACE INTO state(tbl, key, value) VALUES(?, ?, ?)", &s->put_state_));
  ML_RETURN_IF_ERROR(s->Prepare("DELETE FROM state WHERE tbl = ? AND key = ?", &s->del_state_));
  ML_RETURN_IF_ERROR(s->Prepare("SELECT data FROM blocks WHERE height = ?", &s->get_block_));
  ML_RETURN_IF_ERROR(s->Prepare("SELECT loc FROM tx_index WHERE k = ?", &s->get_tx_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "SELECT loc FROM account_history WHERE acct = ? ORDER BY loc DESC LIMIT ? OFFSET ?",
      &s->list_account_txs_));
  ML_RETURN_IF_ERROR(s->Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES('indexed', ?)",
                                &s->put_indexed_));
  ML_RETURN_IF_ERROR(s->MigrateIndexes());
  ML_RETURN_IF_ERROR(s->LoadPendingIndexes());
  return s;
}

Status Store::MigrateIndexes() {
  sqlite3_stmt* st = nullptr;
  ML_RETURN_IF_ERROR(
      Prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'txs'", &st));
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc == SQLITE_DONE) return Status::Ok();
  if (rc != SQLITE_ROW) return Error("read schema");
  ML_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto rebuild = [&]() -> Status {
    ML_RETURN_IF_ERROR(Prepare("SELECT data FROM blocks ORDER BY height", &st));
    Status s = Status::Ok();
    PendingIndex all;
    while (s.ok() && (rc = sqlite3_step(st)) == SQLITE_ROW) {
      auto b = DecodeBlock(ColumnBlob(st, 0));
      if (b.ok()) {
        IndexBlock(*b, &all);
      } else {
        s = b.status();
      }
    }
    if (s.ok() && rc != SQLITE_DONE) s = Error("read blocks");
    sqlite3_finalize(st);
    ML_RETURN_IF_ERROR(s);
    ML_RETURN_IF_ERROR(FlushIndexes({&all}, all.height));
    return Exec("DROP TABLE txs; DROP TABLE IF EXISTS account_txs;");
  };
  Status s = rebuild();
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    new_ids_.clear();
    next_account_id_ = 0;
    return s.WithPrefix("ledger store: rebuilding the indexes");
  }
  ML_RETURN_IF_ERROR(Exec("COMMIT"));
  account_ids_.merge(new_ids_);
  new_ids_.clear();
  return Status::Ok();
}

Result<int64_t> Store::FindAccountId(const PublicKey& key) {
  if (auto it = account_ids_.find(key); it != account_ids_.end()) return it->second;
  if (auto it = new_ids_.find(key); it != new_ids_.end()) return it->second;
  Reset r(get_account_id_);
  sqlite3_bind_blob(get_account_id_, 1, key.bytes.data(), PublicKey::kSize, SQLITE_STATIC);
  int rc = sqlite3_step(get_account_id_);
  if (rc == SQLITE_DONE) return int64_t{0};
  if (rc != SQLITE_ROW) return Error("read account id");
  int64_t id = sqlite3_column_int64(get_account_id_, 0);
  account_ids_.emplace(key, id);
  return id;
}

Result<int64_t> Store::AccountId(const PublicKey& key) {
  ML_ASSIGN_OR_RETURN(int64_t id, FindAccountId(key));
  if (id != 0) return id;
  if (next_account_id_ == 0) {
    sqlite3_stmt* st = nullptr;
    ML_RETURN_IF_ERROR(Prepare("SELECT COALESCE(MAX(id), 0) + 1 FROM account_ids", &st));
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) next_account_id_ = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return Error("read account ids");
  }
  id = next_account_id_;
  Reset r(put_account_id_);
  sqlite3_bind_blob(put_account_id_, 1, key.bytes.data(), PublicKey::kSize, SQLITE_STATIC);
  sqlite3_bind_int64(put_account_id_, 2, id);
  if (sqlite3_step(put_account_id_) != SQLITE_DONE) return Error("write account id");
  next_account_id_++;
  new_ids_.emplace(key, id);
  return id;
}

void Store::IndexBlock(const Block& block, PendingIndex* into) {
  uint64_t h = block.header.height;
  for (uint32_t i = 0; i < block.txs.size(); ++i) {
    int64_t loc = Loc(h, i);
    into->txs.emplace_back(TxKey(block.receipts[i].tx_id), loc);
    for (const PublicKey& k : TxParties(block.txs[i])) {
      into->history[k].push_back(loc);
      into->rows++;
    }
  }
  into->rows += block.txs.size();
  into->blocks++;
  into->height = h;
}

Status Store::FlushIndexes(const std::vector<const PendingIndex*>& parts, uint64_t height) {
  // Rows in key order: consecutive inserts land on the same B-tree pages.
  std::vector<std::pair<int64_t, int64_t>> rows;
  auto put = [&](sqlite3_stmt* st, const char* what) -> Status {
    std::sort(rows.begin(), rows.end());
    for (const auto& [k, loc] : rows) {
      Reset r(st);
      sqlite3_bind_int64(st, 1, k);
      sqlite3_bind_int64(st, 2, loc);
      if (sqlite3_step(st) != SQLITE_DONE) return Error(what);
    }
    return Status::Ok();
  };
  for (const PendingIndex* p : parts) rows.insert(rows.end(), p->txs.begin(), p->txs.end());
  ML_RETURN_IF_ERROR(put(put_tx_, "write tx index"));
  rows.clear();
  for (const PendingIndex* p : parts) {
    for (const auto& [key, locs] : p->history) {
      ML_ASSIGN_OR_RETURN(int64_t id, AccountId(key));
      for (int64_t loc : locs) rows.emplace_back(id, loc);
    }
  }
  ML_RETURN_IF_ERROR(put(put_account_tx_, "write account history"));
  Encoder e;
  e.PutU64(height);
  Bytes v = e.Take();
  Reset r(put_indexed_);
  sqlite3_bind_blob(put_indexed_, 1, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  if (sqlite3_step(put_indexed_) != SQLITE_DONE) return Error("write indexed height");
  return Status::Ok();
}

Status Store::LoadPendingIndexes() {
  uint64_t indexed = 0;
  sqlite3_stmt* st = nullptr;
  ML_RETURN_IF_ERROR(Prepare("SELECT value FROM meta WHERE key = 'indexed'", &st));
  int rc = sqlite3_step(st);
  Status s = Status::Ok();
  if (rc == SQLITE_ROW) {
    Decoder d(ColumnBlob(st, 0), "indexed height");
    s = d.GetU64(&indexed, "height");
    if (s.ok()) s = d.Finish();
  } else if (rc != SQLITE_DONE) {
    s = Error("read indexed height");
  }
  sqlite3_finalize(st);
  ML_RETURN_IF_ERROR(s);
  ML_RETURN_IF_ERROR(Prepare("SELECT data FROM blocks WHERE height > ? ORDER BY height", &st));
  sqlite3_bind_int64(st, 1, static_cast<int64_t>(indexed));
  while (s.ok() && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    auto b = DecodeBlock(ColumnBlob(st, 0));
    if (b.ok()) {
      IndexBlock(*b, &pending_);
    } else {
      s = b.status();
    }
  }
  if (s.ok() && rc != SQLITE_DONE) s = Error("read blocks");
  sqlite3_finalize(st);
  return s.ok() ? s : s.WithPrefix("ledger store: indexing the newest blocks");
}

Result<std::optional<StoredMeta>> Store::ReadMeta() {
  sqlite3_stmt* st = nullptr;
  ML_RETURN_IF_ERROR(Prepare("SELECT value FROM meta WHERE key = 'head'", &st));
  std::optional<StoredMeta> out;
  int rc = sqlite3_step(st);
  Status s = Status::Ok();
  if (rc == SQLITE_ROW) {
    StoredMeta m;
    s = DecodeMeta(ColumnBlob(st, 0), &m);
    if (s.ok()) out = m;
  } else if (rc != SQLITE_DONE) {
    s = Error("read meta");
  }
  sqlite3_finalize(st);
  if (!s.ok()) return s;
  return out;
}

Status Store::LoadState(LedgerState* state) {
  sqlite3_stmt* st = nullptr;
  ML_RETURN_IF_ERROR(Prepare("SELECT tbl, key, value FROM state ORDER BY tbl, key", &st));
  Status s = Status::Ok();
  bool have_globals = false;
  int rc = SQLITE_DONE;
  while (s.ok() && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    int tbl = sqlite3_column_int(st, 0);
    ByteSpan value = ColumnBlob(st, 2);
    Decoder d(value, "state row");
    switch (static_cast<StateTable>(tbl)) {
      case StateTable::kGlobals: {
        Globals g;
        s = LedgerState::DecodeGlobals(value, &g);
        if (s.ok()) state->globals.LoadRow(0, g);
        have_globals = true;
        break;
      }
      case StateTable::kAccounts: {
        Account a;
        s = DecodeAccount(d, &a);
        if (s.ok()) s = d.Finish();
        if (s.ok()) state->accounts.LoadRow(a.key, std::move(a));
        break;
      }
      case StateTable::kNodes: {
        NodeRecord n;
        s = DecodeNode(d, &n);
        if (s.ok()) s = d.Finish();
        if (s.ok()) state->nodes.LoadRow(n.id, std::move(n));
        break;
      }
      case StateTable::kTasks: {
        TaskRecord t;
        s = DecodeTask(d, &t);
        if (s.ok()) s = d.Finish();
        if (s.ok()) state->tasks.LoadRow(t.id, std::move(t));
        break;
      }
      case StateTable::kUnits: {
        WorkUnit u;
        s = DecodeWorkUnit(d, &u);
        if (s.ok()) s = d.Finish();
        if (s.ok()) state->units.LoadRow({u.task_id, u.index}, std::move(u));
        break;
      }
      case StateTable::kProofCommits: {
        ProofCommit c;
        s = DecodeProofCommit(d, &c);
        if (s.ok()) s = d.Finish();
        if (s.ok()) state->proof_commits.LoadRow(c.commitment, c);
        break;
      }
      default:
        s = DataLoss("ledger store: unknown state table " + std::to_string(tbl));
    }
  }
  if (s.ok() && rc != SQLITE_DONE) s = Error("read state");
  sqlite3_finalize(st);
  if (s.ok() && !have_globals) s = DataLoss("ledger store: state has no globals row");
  return s.ok() ? s : s.WithPrefix("ledger store");
}

Status Store::Commit(const StoredMeta& meta, LedgerState* state, const Block* block,
                     const Bytes* encoded_block) {
  ML_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  PendingIndex block_index;
  bool flushed = false;
  auto write = [&]() -> Status {
    auto bind_blob = [](sqlite3_stmt* st, int i, ByteSpan b) {
      // STATIC: every buffer bound here outlives the sqlite3_step that reads it.
      return sqlite3_bind_blob(st, i, b.data(), static_cast<int>(b.size()), SQLITE_STATIC);
    };
    auto step = [&](sqlite3_stmt* st, const char* what) -> Status {
      Reset r(st);
      if (sqlite3_step(st) != SQLITE_DONE) return Error(what);
      return Status::Ok();
    };
    auto put_row = [&](StateTable tbl, ByteSpan key, const Bytes* value) -> Status {
      sqlite3_stmt* st = value ? put_state_ : del_state_;
      sqlite3_bind_int(st, 1, static_cast<int>(tbl));
      bind_blob(st, 2, key);
      if (value) bind_blob(st, 3, *value);
      return step(st, "write state row");
    };
    if (block) {
      uint64_t h = block->header.height;
      Hash256 bh = BlockHash(block->header);
      sqlite3_bind_int64(put_block_, 1, static_cast<int64_t>(h));
      bind_blob(put_block_, 2, bh.span());
      bind_blob(put_block_, 3, *encoded_block);
      ML_RETURN_IF_ERROR(step(put_block_, "write block"));
      IndexBlock(*block, &block_index);
      if (pending_.rows + block_index.rows >= kFlushRows || pending_.blocks + 1 >= kFlushBlocks) {
        ML_RETURN_IF_ERROR(FlushIndexes({&pending_, &block_index}, h));
        flushed = true;
      }
    }
    Encoder e;
    for (const PublicKey& k : state->accounts.dirty()) {
      const Account* a = state->accounts.Find(k);
      Bytes v;
      if (a) {
        e = Encoder();
        EncodeAccount(e, *a);
        v = e.Take();
      }
      ML_RETURN_IF_ERROR(put_row(StateTable::kAccounts, k.span(), a ? &v : nullptr));
    }
    for (const PublicKey& k : state->nodes.dirty()) {
      const NodeRecord* n = state->nodes.Find(k);
      Bytes v;
      if (n) {
        e = Encoder();
        EncodeNode(e, *n);
        v = e.Take();
      }
      ML_RETURN_IF_ERROR(put_row(StateTable::kNodes, k.span(), n ? &v : nullptr));
    }
    for (const Hash256& k : state->tasks.dirty()) {
      const TaskRecord* t = state->tasks.Find(k);
      Bytes v;
      if (t) {
        e = Encoder();
        EncodeTask(e, *t);
        v = e.Take();
      }
      ML_RETURN_IF_ERROR(put_row(StateTable::kTasks, k.span(), t ? &v : nullptr));
    }
    for (const WorkUnitKey& k : state->units.dirty()) {
      const WorkUnit* u = state->units.Find(k);
      Bytes v;
      if (u) {
        e = Encoder();
        EncodeWorkUnit(e, *u);
        v = e.Take();
      }
      ML_RETURN_IF_ERROR(put_row(StateTable::kUnits, UnitKey(k), u ? &v : nullptr));
    }
    for (const Hash256& k : state->proof_commits.dirty()) {
      const ProofCommit* c = state->proof_commits.Find(k);
      Bytes v;
      if (c) {
        e = Encoder();
        EncodeProofCommit(e, *c);
        v = e.Take();
      }
      ML_RETURN_IF_ERROR(put_row(StateTable::kProofCommits, k.span(), c ? &v : nullptr));
    }
    // Globals are written every commit (one small row).
    {
      Bytes v = LedgerState::EncodeGlobals(state->g());
      uint8_t key = 0;
      ML_RETURN_IF_ERROR(put_row(StateTable::kGlobals, ByteSpan(&key, 1), &v));
    }
    Bytes m = EncodeMeta(meta);
    bind_blob(put_meta_, 1, m);
    return step(put_meta_, "write meta");
  };
  Status s = write();
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    new_ids_.clear();
    next_account_id_ = 0;
    return s;
  }
  Status committed = Exec("COMMIT");
  if (!committed.ok()) {
    (void)Exec("ROLLBACK");
    new_ids_.clear();
    next_account_id_ = 0;
    return committed;
  }
  account_ids_.merge(new_ids_);
  new_ids_.clear();
  if (flushed) {
    pending_ = PendingIndex();
  } else if (block) {
    pending_.txs.insert(pending_.txs.end(), block_index.txs.begin(), block_index.txs.end());
    for (auto& [key, locs] : block_index.history) {
      std::vector<int64_t>& into = pending_.history[key];
      into.insert(into.end(), locs.begin(), locs.end());
    }
    pending_.rows += block_index.rows;
    pending_.blocks++;
    pending_.height = block_index.height;
  }
  state->ClearDirty();
  return Status::Ok();
}

Result<Block> Store::GetBlock(uint64_t height) {
  Reset r(get_block_);
  sqlite3_bind_int64(get_block_, 1, static_cast<int64_t>(height));
  int rc = sqlite3_step(get_block_);
  if (rc == SQLITE_DONE) return NotFound("block " + std::to_string(height) + " not found");
  if (rc != SQLITE_ROW) return Error("read block");
  auto b = DecodeBlock(ColumnBlob(get_block_, 0));
  if (!b.ok()) return DataLoss("ledger store: block " + std::to_string(height) + ": " +
                               b.status().message());
  return b;
}

Result<std::vector<std::pair<uint64_t, uint32_t>>> Store::FindTxCandidates(const Hash256& id) {
  Reset r(get_tx_);
  sqlite3_bind_int64(get_tx_, 1, TxKey(id));
  std::vector<std::pair<uint64_t, uint32_t>> out;
  int rc;
  while ((rc = sqlite3_step(get_tx_)) == SQLITE_ROW) {
    out.push_back(FromLoc(sqlite3_column_int64(get_tx_, 0)));
  }
  if (rc != SQLITE_DONE) return Error("read tx index");
  int64_t k = TxKey(id);
  for (const auto& [pk, loc] : pending_.txs) {
    if (pk == k) out.push_back(FromLoc(loc));
  }
  return out;
}

Result<std::vector<std::pair<uint64_t, uint32_t>>> Store::ListAccountTxs(const PublicKey& key,
                                                                         uint64_t offset,
                                                                         uint64_t limit) {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  // Newest first: the blocks not yet flushed, then the table.
  if (auto it = pending_.history.find(key); it != pending_.history.end()) {
    const std::vector<int64_t>& locs = it->second;
    if (offset < locs.size()) {
      for (auto l = locs.rbegin() + static_cast<std::ptrdiff_t>(offset);
           l != locs.rend() && out.size() < limit; ++l) {
        out.push_back(FromLoc(*l));
      }
      offset = 0;
    } else {
      offset -= locs.size();
    }
    limit -= out.size();
  }
  if (limit == 0) return out;
  ML_ASSIGN_OR_RETURN(int64_t id, FindAccountId(key));
  if (id == 0) return out;  // in no flushed block
  Reset r(list_account_txs_);
  sqlite3_bind_int64(list_account_txs_, 1, id);
  auto clamp = [](uint64_t v) { return static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX)); };
  sqlite3_bind_int64(list_account_txs_, 2, clamp(limit));
  sqlite3_bind_int64(list_account_txs_, 3, clamp(offset));
  int rc;
  while ((rc = sqlite3_step(list_account_txs_)) == SQLITE_ROW) {
    out.push_back(FromLoc(sqlite3_column_int64(list_account_txs_, 0)));
  }
  if (rc != SQLITE_DONE) return Error("read account history");
  return out;
}

}  // namespace meshlearn::ledger
