// The layout of a meshlearn home directory: one set of paths, whoever uses the directory.
//
// A home is `$MESHLEARN_HOME` / `--home DIR` for the CLI, and a node's `data_dir` for the node
// daemon. They are the same kind of directory -- `meshlearn --home <data_dir> wallet withdraw
// --key node` must find the node's key and must not trip over the daemon's files -- so every
// user names its files through HomeLayout, never by joining strings of its own:
//
//   <home>/keys/<name>.key.json     key files (KeyStore); the node's key is "node"
//   <home>/outbox/                  signed transactions not yet seen included (mode 0700)
//       <key>.tx                    the one transaction a wallet/task command of key <key> awaits
//       node.daemon.txs             the node daemon's TxSender journal (several, one per line)
//       node.leave.txs              `meshlearn node leave`'s TxSender journal
//   <home>/blobs/                   the content-addressed blob store
//   <home>/audit/                   `task audit`'s work files
//   node daemon only: pins.json, secret_chain.json, units/, tasks/, aggregates/, verify/,
//                     stages/ (a stage unit's checkpoints for its verifiers: StageEvidence)
//
// A TxSender journal and a wallet entry never share a name: wallet entries end in ".tx", journals
// in ".txs", and key names cannot contain '/'.
//
// Before 2026-12 the node daemon kept its journal in a FILE named <data_dir>/outbox (and `node
// leave` in <data_dir>/outbox-cli), which made the wallet's outbox/ directory impossible.
// MigrateHomeLayout moves those files to their new names; every user of an outbox calls it first.
//
//   HomeLayout home(data_dir);
//   ML_RETURN_IF_ERROR(MigrateHomeLayout(home));
//   TxSender tx(&chain, key, {.env = env, .outbox_path = home.NodeDaemonJournal()});
#pragma once

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

class HomeLayout {
 public:
  explicit HomeLayout(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string KeysDir() const { return JoinPath(root_, "keys"); }
  std::string OutboxDir() const { return JoinPath(root_, "outbox"); }
  // The wallet's (and task commands') entry for key `key_name`.
  std::string WalletOutbox(const std::string& key_name) const {
    return JoinPath(OutboxDir(), key_name + ".tx");
  }
  std::string NodeDaemonJournal() const { return JoinPath(OutboxDir(), "node.daemon.txs"); }
  std::string NodeLeaveJournal() const { return JoinPath(OutboxDir(), "node.leave.txs"); }
  std::string BlobsDir() const { return JoinPath(root_, "blobs"); }
  std::string AuditDir() const { return JoinPath(root_, "audit"); }
  // The node daemon's own state.
  std::string PinsFile() const { return JoinPath(root_, "pins.json"); }
  std::string SecretChainFile() const { return JoinPath(root_, "secret_chain.json"); }
  std::string UnitsDir() const { return JoinPath(root_, "units"); }
  std::string TasksDir() const { return JoinPath(root_, "tasks"); }
  std::string AggregatesDir() const { return JoinPath(root_, "aggregates"); }
  std::string VerifyDir() const { return JoinPath(root_, "verify"); }
  std::string StageEvidenceDir() const { return JoinPath(root_, "stages"); }

  // The files of the old layout (see the top of this file).
  std::string LegacyDaemonOutboxFile() const { return JoinPath(root_, "outbox"); }
  std::string LegacyLeaveOutboxFile() const { return JoinPath(root_, "outbox-cli"); }

 private:
  std::string root_;
};

namespace home_layout_internal {

inline bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// rename(2) `from` to `to` unless `to` exists (then both are kept and the caller is told).
inline Status MoveIfAbsent(const std::string& from, const std::string& to) {
  // link + unlink: a rename that never replaces `to`, and that two processes migrating the same
  // home at once (the daemon starting while a wallet command runs) both see succeed.
  if (::link(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    if (err == ENOENT) return Status::Ok();  // another process moved it first
    struct stat a, b;
    const bool same = err == EEXIST && ::stat(from.c_str(), &a) == 0 &&
                      ::stat(to.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
                      a.st_ino == b.st_ino;
    if (err == EEXIST && !same) {
      return FailedPrecondition("cannot migrate " + from + " to " + to + ": both exist; keep the " +
                                "one whose transactions are still pending and delete the other");
    }
    if (err != EEXIST) {
      return Internal("cannot move " + from + " to " + to + ": " + std::strerror(err));
    }
  }
  if (::unlink(from.c_str()) != 0 && errno != ENOENT) {
    return Internal("cannot remove " + from + " after moving it to " + to + ": " +
                    std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace home_layout_internal

// Brings a home directory of the old layout to the current one: the node daemon's journal FILE
// <root>/outbox becomes outbox/node.daemon.txs, <root>/outbox-cli becomes outbox/node.leave.txs.
// Crash-safe: the journal is first renamed aside (outbox.migrating), then into the new
// directory; a run interrupted between the two is completed by the next. A no-op on a home of
// the current layout or one that does not exist yet. Real file system only (Env has no rename).
inline Status MigrateHomeLayout(const HomeLayout& home) {
  namespace hl = home_layout_internal;
  const std::string aside = home.LegacyDaemonOutboxFile() + ".migrating";
  if (hl::IsRegularFile(home.LegacyDaemonOutboxFile())) {
    ML_RETURN_IF_ERROR(hl::MoveIfAbsent(home.LegacyDaemonOutboxFile(), aside));
  }
  const bool have_aside = hl::IsRegularFile(aside);
  const bool have_leave = hl::IsRegularFile(home.LegacyLeaveOutboxFile());
  if (!have_aside && !have_leave) return Status::Ok();
  ML_RETURN_IF_ERROR(Env::Default()->CreateDirs(home.OutboxDir(), 0700));
  if (have_aside) ML_RETURN_IF_ERROR(hl::MoveIfAbsent(aside, home.NodeDaemonJournal()));
  if (have_leave) {
    ML_RETURN_IF_ERROR(hl::MoveIfAbsent(home.LegacyLeaveOutboxFile(), home.NodeLeaveJournal()));
  }
  return Status::Ok();
}

}  // namespace meshlearn
