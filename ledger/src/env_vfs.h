// The ledger's SQLite files go through Env (base/env.h), so a test can run a chain on a MemEnv and
// cut its power (MemEnv::CutPower) at any write.
//
//   ML_ASSIGN_OR_RETURN(const char* vfs, SqliteVfsFor(env));
//   sqlite3_open_v2(path, &db, flags, vfs);
//
// Env::Default() gets nullptr, SQLite's own unix VFS: the real file system needs its file locks
// and the WAL's shared memory, so that `meshlearn chain` commands can read a database that
// `chain serve` writes. Any other Env gets a VFS whose files are Env::OpenRandomRW files; it has
// no locks and no shared memory, so a database on it must be used by one connection, in
// `PRAGMA locking_mode=EXCLUSIVE` (which lets WAL keep its index in the heap). Store::Open does
// that.
#pragma once

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"

namespace meshlearn::ledger {

// The name of the VFS for `env` (registered with SQLite the first time), or nullptr for the
// real file system.
Result<const char*> SqliteVfsFor(Env* env);

}  // namespace meshlearn::ledger
