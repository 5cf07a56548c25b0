#include "store.h"

#include <sqlite3.h>

#include "execute.h"
#include "meshlearn/base/encoding.h"

namespace meshlearn::ledger {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS blocks(height INTEGER PRIMARY KEY, hash BLOB NOT NULL,
                                  data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS txs(id BLOB PRIMARY KEY, height INTEGER NOT NULL,
                               idx INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS account_txs(account BLOB NOT NULL, height INTEGER NOT NULL,
                                       idx INTEGER NOT NULL,
                                       PRIMARY KEY(account, height, idx)) WITHOUT ROWID;
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
  for (sqlite3_stmt* st : {put_meta_, put_block_, put_tx_, put_account_tx_, put_state_, del_state_,
                           get_block_, get_tx_, list_account_txs_}) {
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

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Unavailable(path + ": cannot open ledger database: " + msg);
  }
  std::unique_ptr<Store> s(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL + FULL: a commit is durable when it returns, and readers do not block the writer.
  ML_RETURN_IF_ERROR(s->Exec(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA cache_size=-32768;"));
  ML_RETURN_IF_ERROR(s->Exec(kSchema));
  ML_RETURN_IF_ERROR(s->Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES('head', ?)",
                                &s->put_meta_));
  ML_RETURN_IF_ERROR(s->Prepare("INSERT INTO blocks(height, hash, data) VALUES(?, ?, ?)",
                                &s->put_block_));
  ML_RETURN_IF_ERROR(
      s->Prepare("INSERT OR REPLACE INTO txs(id, height, idx) VALUES(?, ?, ?)", &s->put_tx_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "INSERT OR IGNORE INTO account_txs(account, height, idx) VALUES(?, ?, ?)",
      &s->put_account_tx_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "INSERT OR REPLACE INTO state(tbl, key, value) VALUES(?, ?, ?)", &s->put_state_));
  ML_RETURN_IF_ERROR(s->Prepare("DELETE FROM state WHERE tbl = ? AND key = ?", &s->del_state_));
  ML_RETURN_IF_ERROR(s->Prepare("SELECT data FROM blocks WHERE height = ?", &s->get_block_));
  ML_RETURN_IF_ERROR(s->Prepare("SELECT height, idx FROM txs WHERE id = ?", &s->get_tx_));
  ML_RETURN_IF_ERROR(s->Prepare(
      "SELECT height, idx FROM account_txs WHERE account = ? ORDER BY height DESC, idx DESC "
      "LIMIT ? OFFSET ?",
      &s->list_account_txs_));
  return s;
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
      for (uint32_t i = 0; i < block->txs.size(); ++i) {
        const Hash256& id = block->receipts[i].tx_id;
        bind_blob(put_tx_, 1, id.span());
        sqlite3_bind_int64(put_tx_, 2, static_cast<int64_t>(h));
        sqlite3_bind_int(put_tx_, 3, static_cast<int>(i));
        ML_RETURN_IF_ERROR(step(put_tx_, "write tx index"));
        for (const PublicKey& k : TxParties(block->txs[i])) {
          bind_blob(put_account_tx_, 1, k.span());
          sqlite3_bind_int64(put_account_tx_, 2, static_cast<int64_t>(h));
          sqlite3_bind_int(put_account_tx_, 3, static_cast<int>(i));
          ML_RETURN_IF_ERROR(step(put_account_tx_, "write account history"));
        }
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
    return s;
  }
  ML_RETURN_IF_ERROR(Exec("COMMIT"));
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

Result<std::pair<uint64_t, uint32_t>> Store::FindTx(const Hash256& id) {
  Reset r(get_tx_);
  sqlite3_bind_blob(get_tx_, 1, id.bytes.data(), Hash256::kSize, SQLITE_TRANSIENT);
  int rc = sqlite3_step(get_tx_);
  if (rc == SQLITE_DONE) return NotFound("transaction " + id.ToHex() + " not found");
  if (rc != SQLITE_ROW) return Error("read tx index");
  return std::make_pair(static_cast<uint64_t>(sqlite3_column_int64(get_tx_, 0)),
                        static_cast<uint32_t>(sqlite3_column_int(get_tx_, 1)));
}

Result<std::vector<std::pair<uint64_t, uint32_t>>> Store::ListAccountTxs(const PublicKey& key,
                                                                         uint64_t offset,
                                                                         uint64_t limit) {
  Reset r(list_account_txs_);
  sqlite3_bind_blob(list_account_txs_, 1, key.bytes.data(), PublicKey::kSize, SQLITE_TRANSIENT);
  auto clamp = [](uint64_t v) { return static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX)); };
  sqlite3_bind_int64(list_account_txs_, 2, clamp(limit));
  sqlite3_bind_int64(list_account_txs_, 3, clamp(offset));
  std::vector<std::pair<uint64_t, uint32_t>> out;
  int rc;
  while ((rc = sqlite3_step(list_account_txs_)) == SQLITE_ROW) {
    out.emplace_back(static_cast<uint64_t>(sqlite3_column_int64(list_account_txs_, 0)),
                     static_cast<uint32_t>(sqlite3_column_int(list_account_txs_, 1)));
  }
  if (rc != SQLITE_DONE) return Error("read account history");
  return out;
}

}  // namespace meshlearn::ledger
