#include "meshlearn/base/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace meshlearn {
namespace {

const char* FileKindName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  std::string m = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return NotFound(m);
  if (err == EACCES || err == EPERM) return PermissionDenied(m + " (check the file's permissions)");
  if (err == ENOSPC) return ResourceExhausted(m + " (free some disk space)");
  if (err == EISDIR) return InvalidArgument(m + " (a directory, not a regular file)");
  return Internal(m);
}

class PosixEnv final : public Env {
 public:
  Result<std::string> ReadFile(const std::string& path) override {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; we refuse it below anyway.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ErrnoStatus("cannot open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("cannot stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      // A character device (/dev/zero), a FIFO or a directory has no end or no size: reading it
      // whole would never finish, or exhaust memory.
      ::close(fd);
      return InvalidArgument("cannot read " + path + ": not a regular file (" +
                             FileKindName(st.st_mode) + ")");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    std::string out;
    if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
    char buf[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return ErrnoStatus("cannot read", path, err);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  Status WriteFileAtomic(const std::string& path, std::string_view data, uint32_t mode) override {
    static std::atomic<uint64_t> counter{0};
    std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                      std::to_string(counter.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return ErrnoStatus("cannot create", tmp, errno);
    // open() applies the umask; make the mode exact (0600 for secrets must be 0600).
    ::fchmod(fd, mode);
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        return ErrnoStatus("cannot write", tmp, err);
      }
      off += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus("cannot fsync", tmp, err);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      return ErrnoStatus("cannot rename onto", path, err);
    }
    int dfd = ::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return Status::Ok();
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus("cannot delete", path, errno);
    return Status::Ok();
  }

  Status CreateDirs(const std::string& path, uint32_t mode) override {
    if (path.empty()) return InvalidArgument("CreateDirs: empty path");
    std::string cur;
    size_t i = 0;
    while (i <= path.size()) {
      size_t slash = path.find('/', i);
      if (slash == std::string::npos) slash = path.size();
      cur = path.substr(0, slash);
      if (!cur.empty() && ::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
        return ErrnoStatus("cannot create directory", cur, errno);
      }
      i = slash + 1;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return FailedPrecondition(path + " exists and is not a directory");
    }
    return Status::Ok();
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return ErrnoStatus("cannot list", path, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  Result<uint32_t> FileMode(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot stat", path, errno);
    return static_cast<uint32_t>(st.st_mode & 07777);
  }

  Result<std::unique_ptr<RandomRWFile>> OpenRandomRW(const std::string& path,
                                                      bool create) override;
};

class PosixRWFile final : public RandomRWFile {
 public:
  PosixRWFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRWFile() override { ::close(fd_); }

  Result<size_t> Read(uint64_t offset, size_t n, char* out) override {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd_, out + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoStatus("cannot read", path_, errno);
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  Status Write(uint64_t offset, std::string_view data) override {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t w = ::pwrite(fd_, data.data() + done, data.size() - done,
                           static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus("cannot write", path_, errno);
      done += static_cast<size_t>(w);
    }
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return ErrnoStatus("cannot truncate", path_, errno);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return ErrnoStatus("cannot sync", path_, errno);
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return ErrnoStatus("cannot stat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  std::string path_;
  int fd_;
};

Result<std::unique_ptr<RandomRWFile>> PosixEnv::OpenRandomRW(const std::string& path,
                                                             bool create) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
  if (fd < 0) return ErrnoStatus("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is " + FileKindName(st.st_mode) + ", not a regular file");
  }
  return std::unique_ptr<RandomRWFile>(new PosixRWFile(path, fd));
}

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Result<std::string> MemEnv::ReadFile(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound("cannot open " + path + ": No such file or directory");
  return it->second.data;
}

Status MemEnv::TakeWrite(const std::string& path) {
  if (!powered_) return Unavailable("cannot write " + path + ": the power is cut");
  if (writes_left_ == 0) return Internal("cannot write " + path + ": injected fault");
  if (writes_left_ > 0) --writes_left_;
  return Status::Ok();
}

Status MemEnv::WriteFileAtomic(const std::string& path, std::string_view data, uint32_t mode) {
  ML_RETURN_IF_ERROR(TakeWrite(path));
  std::string dir = DirName(path);
  if (dir != "." && dir != "/" && !dirs_.count(dir)) {
    return NotFound("cannot create " + path + ": No such file or directory");
  }
  // rename replaces the inode, and its mode; the temporary was fsynced before it
  files_[path] = File{std::string(data), mode, std::string(data), true};
  return Status::Ok();
}

// A MemEnv file by name: it sees a delete (unlike a POSIX descriptor, which would keep the
// unlinked inode; SQLite never uses a file it deleted).
class MemEnv::RWFile final : public RandomRWFile {
 public:
  RWFile(MemEnv* env, std::string path) : env_(env), path_(std::move(path)) {}

  Result<size_t> Read(uint64_t offset, size_t n, char* out) override {
    ML_ASSIGN_OR_RETURN(File * f, Get());
    if (offset >= f->data.size()) return size_t{0};
    const size_t got = std::min<size_t>(n, f->data.size() - offset);
    std::memcpy(out, f->data.data() + offset, got);
    return got;
  }

  Status Write(uint64_t offset, std::string_view data) override {
    ML_RETURN_IF_ERROR(env_->TakeWrite(path_));
    ML_ASSIGN_OR_RETURN(File * f, Get());
    if (f->data.size() < offset + data.size()) f->data.resize(offset + data.size(), '\0');
    std::memcpy(f->data.data() + offset, data.data(), data.size());
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    ML_RETURN_IF_ERROR(env_->TakeWrite(path_));
    ML_ASSIGN_OR_RETURN(File * f, Get());
    f->data.resize(size, '\0');
    return Status::Ok();
  }

  Status Sync() override {
    ML_RETURN_IF_ERROR(env_->TakeWrite(path_));
    ML_ASSIGN_OR_RETURN(File * f, Get());
    f->synced = f->data;
    f->ever_synced = true;
    return Status::Ok();
  }

  Result<uint64_t> Size() override {
    ML_ASSIGN_OR_RETURN(File * f, Get());
    return static_cast<uint64_t>(f->data.size());
  }

 private:
  Result<File*> Get() {
    auto it = env_->files_.find(path_);
    if (it == env_->files_.end()) return NotFound(path_ + " was deleted while open");
    return &it->second;
  }

  MemEnv* env_;
  std::string path_;
};

Result<std::unique_ptr<RandomRWFile>> MemEnv::OpenRandomRW(const std::string& path,
                                                           bool create) {
  if (dirs_.count(path)) return InvalidArgument(path + " is a directory, not a regular file");
  if (!files_.count(path)) {
    if (!create) return NotFound("cannot open " + path + ": No such file or directory");
    if (!powered_) return Unavailable("cannot create " + path + ": the power is cut");
    const std::string dir = DirName(path);
    if (dir != "." && dir != "/" && !dirs_.count(dir)) {
      return NotFound("cannot create " + path + ": No such file or directory");
    }
    files_[path] = File{std::string(), 0644, std::string(), false};
  }
  return std::unique_ptr<RandomRWFile>(new RWFile(this, path));
}

void MemEnv::CutPower() {
  powered_ = false;
  for (auto it = files_.begin(); it != files_.end();) {
    if (!it->second.ever_synced) {
      it = files_.erase(it);
      continue;
    }
    it->second.data = it->second.synced;
    ++it;
  }
}

bool MemEnv::FileExists(const std::string& path) {
  return files_.count(path) > 0 || dirs_.count(path) > 0;
}

Status MemEnv::DeleteFile(const std::string& path) {
  if (!powered_) return Unavailable("cannot delete " + path + ": the power is cut");
  if (files_.erase(path) == 0) return NotFound("cannot delete " + path + ": No such file");
  return Status::Ok();
}

Status MemEnv::CreateDirs(const std::string& path, uint32_t mode) {
  std::string cur;
  size_t i = 0;
  while (i <= path.size()) {
    size_t slash = path.find('/', i);
    if (slash == std::string::npos) slash = path.size();
    cur = path.substr(0, slash);
    if (!cur.empty()) {
      if (files_.count(cur)) return FailedPrecondition(cur + " exists and is not a directory");
      dirs_.emplace(cur, mode);
    }
    i = slash + 1;
  }
  return Status::Ok();
}

Result<std::vector<std::string>> MemEnv::ListDir(const std::string& path) {
  if (!dirs_.count(path)) return NotFound("cannot list " + path + ": No such directory");
  std::vector<std::string> names;
  std::string prefix = path + "/";
  auto collect = [&](const std::string& p) {
    if (p.compare(0, prefix.size(), prefix) == 0 && p.find('/', prefix.size()) == std::string::npos) {
      names.push_back(p.substr(prefix.size()));
    }
  };
  for (const auto& [p, f] : files_) collect(p);
  for (const auto& [p, m] : dirs_) collect(p);
  std::sort(names.begin(), names.end());
  return names;
}

Result<uint64_t> MemEnv::FileSize(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound("cannot stat " + path + ": No such file");
  return static_cast<uint64_t>(it->second.data.size());
}

Result<uint32_t> MemEnv::FileMode(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return NotFound("cannot stat " + path + ": No such file");
  return it->second.mode;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (!b.empty() && b.front() == '/') return std::string(b);
  std::string out(a);
  if (out.back() != '/') out += '/';
  out += b;
  return out;
}

std::string ExpandHome(std::string_view path) {
  if (path.size() >= 2 && path[0] == '~' && path[1] == '/') {
    const char* home = std::getenv("HOME");
    return JoinPath(home ? home : "/root", path.substr(2));
  }
  return std::string(path);
}

std::string DirName(std::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string ResolveInFile(std::string_view file, std::string_view p) {
  return ResolveInDir(DirName(file), p);
}

std::string ResolveInDir(std::string_view dir, std::string_view p) {
  if (p.empty() || p.front() == '/') return std::string(p);
  if (p.starts_with("~/")) return ExpandHome(p);
  if (dir.empty() || dir == ".") return std::string(p);
  return JoinPath(dir, p);
}

std::string PathForFile(std::string_view file, std::string_view target) {
  if (target.empty() || target.front() == '/' || target.starts_with("~/")) {
    return std::string(target);
  }
  const std::filesystem::path rel = std::filesystem::path(AbsolutePath(target))
                                        .lexically_relative(AbsolutePath(DirName(file)));
  return rel.empty() ? AbsolutePath(target) : rel.string();
}

std::string AbsolutePath(std::string_view p) {
  namespace fs = std::filesystem;
  const std::string expanded = ExpandHome(p);
  std::error_code ec;
  fs::path abs = fs::path(expanded).is_absolute() ? fs::path(expanded)
                                                  : fs::current_path(ec) / expanded;
  std::string out = abs.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

}  // namespace meshlearn
