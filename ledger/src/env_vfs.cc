#include "env_vfs.h"

#include <sqlite3.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace meshlearn::ledger {
namespace {

// A temporary file SQLite asks for without a name (statement journals, sorter spills): it lives
// and dies with its handle, so it never needs to be durable or to be in the Env.
class AnonymousFile final : public RandomRWFile {
 public:
  Result<size_t> Read(uint64_t offset, size_t n, char* out) override {
    if (offset >= data_.size()) return size_t{0};
    const size_t got = std::min<size_t>(n, data_.size() - offset);
    std::memcpy(out, data_.data() + offset, got);
    return got;
  }
  Status Write(uint64_t offset, std::string_view data) override {
    if (data_.size() < offset + data.size()) data_.resize(offset + data.size(), '\0');
    std::memcpy(data_.data() + offset, data.data(), data.size());
    return Status::Ok();
  }
  Status Truncate(uint64_t size) override {
    data_.resize(size, '\0');
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Result<uint64_t> Size() override { return static_cast<uint64_t>(data_.size()); }

 private:
  std::string data_;
};

// What SQLite allocates per open file (szOsFile bytes); `base` must come first.
struct EnvFile {
  sqlite3_file base;
  RandomRWFile* file;  // owned; deleted by Close
  Env* env;
  std::string* path;   // owned; set when the file is deleted on close
};

Env* EnvOf(sqlite3_vfs* vfs) { return static_cast<Env*>(vfs->pAppData); }
RandomRWFile* FileOf(sqlite3_file* f) { return reinterpret_cast<EnvFile*>(f)->file; }

int Close(sqlite3_file* f) {
  EnvFile* ef = reinterpret_cast<EnvFile*>(f);
  delete ef->file;
  ef->file = nullptr;
  if (ef->path != nullptr) {
    (void)ef->env->DeleteFile(*ef->path);  // SQLITE_OPEN_DELETEONCLOSE: gone or never made
    delete ef->path;
    ef->path = nullptr;
  }
  return SQLITE_OK;
}

int Read(sqlite3_file* f, void* out, int n, sqlite3_int64 offset) {
  Result<size_t> got = FileOf(f)->Read(static_cast<uint64_t>(offset), static_cast<size_t>(n),
                                       static_cast<char*>(out));
  if (!got.ok()) return SQLITE_IOERR_READ;
  if (*got < static_cast<size_t>(n)) {
    // SQLite requires the rest zeroed on a short read.
    std::memset(static_cast<char*>(out) + *got, 0, static_cast<size_t>(n) - *got);
    return SQLITE_IOERR_SHORT_READ;
  }
  return SQLITE_OK;
}

int Write(sqlite3_file* f, const void* data, int n, sqlite3_int64 offset) {
  Status s = FileOf(f)->Write(static_cast<uint64_t>(offset),
                              std::string_view(static_cast<const char*>(data), static_cast<size_t>(n)));
  return s.ok() ? SQLITE_OK : SQLITE_IOERR_WRITE;
}

int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  return FileOf(f)->Truncate(static_cast<uint64_t>(size)).ok() ? SQLITE_OK : SQLITE_IOERR_TRUNCATE;
}

int Sync(sqlite3_file* f, int) { return FileOf(f)->Sync().ok() ? SQLITE_OK : SQLITE_IOERR_FSYNC; }

int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  Result<uint64_t> s = FileOf(f)->Size();
  if (!s.ok()) return SQLITE_IOERR_FSTAT;
  *size = static_cast<sqlite3_int64>(*s);
  return SQLITE_OK;
}

// One connection per database (locking_mode=EXCLUSIVE): there is nobody to lock against.
int Lock(sqlite3_file*, int) { return SQLITE_OK; }
int Unlock(sqlite3_file*, int) { return SQLITE_OK; }
int CheckReservedLock(sqlite3_file*, int* out) {
  *out = 0;
  return SQLITE_OK;
}
int FileControl(sqlite3_file*, int, void*) { return SQLITE_NOTFOUND; }
int SectorSize(sqlite3_file*) { return 4096; }
// No promises (atomic writes, safe append, ...): SQLite then journals and syncs as it would on a
// disk that makes none.
int DeviceCharacteristics(sqlite3_file*) { return 0; }

const sqlite3_io_methods kIoMethods = {
    1,  // iVersion: no shared memory, no mmap
    Close, Read, Write, Truncate, Sync, FileSize, Lock, Unlock, CheckReservedLock, FileControl,
    SectorSize, DeviceCharacteristics,
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

int Open(sqlite3_vfs* vfs, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  EnvFile* ef = reinterpret_cast<EnvFile*>(f);
  ef->base.pMethods = nullptr;  // SQLite calls Close only if pMethods is set
  ef->file = nullptr;
  ef->env = EnvOf(vfs);
  ef->path = nullptr;
  if (name == nullptr) {
    ef->file = new AnonymousFile();
  } else {
    Result<std::unique_ptr<RandomRWFile>> file =
        ef->env->OpenRandomRW(name, (flags & SQLITE_OPEN_CREATE) != 0);
    if (!file.ok()) return SQLITE_CANTOPEN;
    ef->file = file->release();
    if (flags & SQLITE_OPEN_DELETEONCLOSE) ef->path = new std::string(name);
  }
  if (out_flags != nullptr) *out_flags = flags;
  ef->base.pMethods = &kIoMethods;
  return SQLITE_OK;
}

int Delete(sqlite3_vfs* vfs, const char* name, int) {
  Status s = EnvOf(vfs)->DeleteFile(name);
  if (s.ok()) return SQLITE_OK;
  return s.code() == StatusCode::kNotFound ? SQLITE_IOERR_DELETE_NOENT : SQLITE_IOERR_DELETE;
}

int Access(sqlite3_vfs* vfs, const char* name, int, int* out) {
  *out = EnvOf(vfs)->FileExists(name) ? 1 : 0;
  return SQLITE_OK;
}

int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  const size_t len = std::strlen(name);
  if (len + 1 > static_cast<size_t>(n)) return SQLITE_CANTOPEN;
  std::memcpy(out, name, len + 1);
  return SQLITE_OK;
}

// Randomness, sleep and time are the operating system's (SQLite uses them for temporary names
// and busy waits, never for what it stores).
sqlite3_vfs* Os() { return sqlite3_vfs_find(nullptr); }
int Randomness(sqlite3_vfs*, int n, char* out) { return Os()->xRandomness(Os(), n, out); }
int Sleep(sqlite3_vfs*, int us) { return Os()->xSleep(Os(), us); }
int CurrentTime(sqlite3_vfs*, double* t) { return Os()->xCurrentTime(Os(), t); }
int GetLastError(sqlite3_vfs*, int, char*) { return 0; }
int CurrentTimeInt64(sqlite3_vfs*, sqlite3_int64* t) {
  return Os()->xCurrentTimeInt64(Os(), t);
}

struct Registered {
  std::string name;
  sqlite3_vfs vfs;
};

}  // namespace

Result<const char*> SqliteVfsFor(Env* env) {
  if (env == Env::Default()) return static_cast<const char*>(nullptr);
  static std::mutex mu;
  static std::map<Env*, std::unique_ptr<Registered>> registered;  // never unregistered
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Registered>& r = registered[env];
  if (r == nullptr) {
    // An Env at an address a destroyed one had reuses its VFS: pAppData is that address.
    r = std::make_unique<Registered>();
    char name[64];
    std::snprintf(name, sizeof(name), "meshlearn-env-%p", static_cast<const void*>(env));
    r->name = name;
    sqlite3_vfs& v = r->vfs;
    std::memset(&v, 0, sizeof(v));
    v.iVersion = 2;
    v.szOsFile = sizeof(EnvFile);
    v.mxPathname = 4096;
    v.zName = r->name.c_str();
    v.pAppData = env;
    v.xOpen = Open;
    v.xDelete = Delete;
    v.xAccess = Access;
    v.xFullPathname = FullPathname;
    v.xRandomness = Randomness;
    v.xSleep = Sleep;
    v.xCurrentTime = CurrentTime;
    v.xGetLastError = GetLastError;
    v.xCurrentTimeInt64 = CurrentTimeInt64;
    if (int rc = sqlite3_vfs_register(&v, /*makeDflt=*/0); rc != SQLITE_OK) {
      const std::string name = r->name;
      r.reset();
      return Internal("cannot register the SQLite VFS " + name + ": " + sqlite3_errstr(rc));
    }
  }
  return static_cast<const char*>(r->name.c_str());
}

}  // namespace meshlearn::ledger
