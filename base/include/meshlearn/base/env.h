// Files come in through Env so tests can run on memory and inject faults (leveldb's idea).
//
// WriteFileAtomic is the only way we write a file that must survive a crash: it writes a
// temporary file in the same directory, fsyncs it, renames it over the target and fsyncs the
// directory. After a crash at any instant the target holds either the old or the new content,
// never a mix, and no temporary is left under the target's name.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

// A file read and written in place at offsets, for databases (the ledger's SQLite store opens
// its files through one of these when its Env is not the real file system). Nothing written is
// durable until Sync returns OK.
class RandomRWFile {
 public:
  virtual ~RandomRWFile() = default;
  // Up to `n` bytes at `offset` into `out`; fewer only at the end of the file.
  virtual Result<size_t> Read(uint64_t offset, size_t n, char* out) = 0;
  // Writes `data` at `offset`, growing the file (with zeros) if `offset` is past its end.
  virtual Status Write(uint64_t offset, std::string_view data) = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Status Sync() = 0;
  virtual Result<uint64_t> Size() = 0;
};

class Env {
 public:
  virtual ~Env() = default;

  // The whole file. Only regular files: a directory, FIFO or device (/dev/zero) is refused with
  // InvalidArgument naming the path and what it is, without blocking or reading.
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  // `mode` is the permission of a newly created file (0600 for secrets).
  virtual Status WriteFileAtomic(const std::string& path, std::string_view data,
                                 uint32_t mode = 0644) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual Status DeleteFile(const std::string& path) = 0;
  // Creates the directory and its parents; OK if it exists.
  virtual Status CreateDirs(const std::string& path, uint32_t mode = 0755) = 0;
  // Names (not paths) of the entries of a directory, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // Permission bits of a file (for checking that key files are 0600).
  virtual Result<uint32_t> FileMode(const std::string& path) = 0;
  // Opens `path` for reading and writing in place; `create`: make it (empty, 0644) if missing.
  // Its folder must exist.
  virtual Result<std::unique_ptr<RandomRWFile>> OpenRandomRW(const std::string& path,
                                                              bool create) = 0;

  // The real file system. Thread-safe.
  static Env* Default();
};

// An in-memory file system for tests. Thread-compatible (one thread at a time).
// Faults: FailWritesAfter(n) makes the (n+1)-th and later writes fail without touching the target
// (an atomic write, a RandomRWFile Write, Truncate or Sync each count one), as a full disk or a
// crash at that instant would. CutPower() is a power cut: every file opened with OpenRandomRW
// goes back to what its last Sync made durable, one never synced vanishes, and nothing can be
// written, created or deleted until RestorePower() (so a process object destroyed after the cut,
// closing its files, changes nothing, as a dead process would). An atomic write is durable when
// it returns; creating a folder or deleting a file is durable at once.
class MemEnv final : public Env {
 public:
  Result<std::string> ReadFile(const std::string& path) override;
  Status WriteFileAtomic(const std::string& path, std::string_view data,
                         uint32_t mode = 0644) override;
  bool FileExists(const std::string& path) override;
  Status DeleteFile(const std::string& path) override;
  Status CreateDirs(const std::string& path, uint32_t mode = 0755) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<uint32_t> FileMode(const std::string& path) override;
  Result<std::unique_ptr<RandomRWFile>> OpenRandomRW(const std::string& path,
                                                      bool create) override;

  void FailWritesAfter(int64_t n) { writes_left_ = n; }
  // Writes left before FailWritesAfter's fault: 0 once it fails them, -1 with no fault set.
  int64_t writes_left() const { return writes_left_; }
  void CutPower();
  void RestorePower() { powered_ = true; }

 private:
  class RWFile;
  struct File {
    std::string data;
    uint32_t mode;
    std::string synced;         // what a power cut leaves
    bool ever_synced = true;    // false: created by OpenRandomRW and never synced
  };
  Status TakeWrite(const std::string& path);
  std::map<std::string, File> files_;
  std::map<std::string, uint32_t> dirs_;
  int64_t writes_left_ = -1;  // -1: never fail
  bool powered_ = true;
};

// Joins path components with '/'.
std::string JoinPath(std::string_view a, std::string_view b);
// Expands a leading "~/" with $HOME.
std::string ExpandHome(std::string_view path);

// Paths: one rule for every file meshlearn writes or reads (docs/paths.md).
//   - A relative path given on the command line or in an environment variable ($MESHLEARN_HOME)
//     is relative to the working directory of the command.
//   - A relative path written inside a file (node.toml's data_dir, a task file's data paths) is
//     relative to the folder that holds that file, wherever the reader runs from.
//   - A leading "~/" is $HOME in both.
// Readers call ResolveInFile; writers call PathForFile, so what a writer writes is what a reader
// reads:
//
//   std::string v = PathForFile("out/devnet/node0/node.toml", "out/devnet/node0");  // "."
//   ResolveInFile("out/devnet/node0/node.toml", v);  // "out/devnet/node0"
//
// The folder of `path`: "a/b" for "a/b/c.toml", "." for "c.toml", "/" for "/c.toml".
std::string DirName(std::string_view path);
// What the path `p`, written inside the file `file`, names: `p` itself if absolute, $HOME/... for
// "~/...", else `p` under `file`'s folder (a path as `file` was named: relative to the working
// directory if `file` is).
std::string ResolveInFile(std::string_view file, std::string_view p);
// The same for a file in the folder `dir` ("" or "." for the working directory).
std::string ResolveInDir(std::string_view dir, std::string_view p);
// What to write inside the file `file` to name `target`, a path as the command line gives it
// (relative to the working directory, or absolute): an absolute or "~/" `target` as it is, else
// `target` relative to `file`'s folder ("." or "../data/x.gz").
std::string PathForFile(std::string_view file, std::string_view target);
// `p` as an absolute path (a relative `p` is taken under the working directory), with "." and
// ".." segments removed lexically. For paths from the command line and the environment that are
// handed to other processes or written into files.
std::string AbsolutePath(std::string_view p);

}  // namespace meshlearn
