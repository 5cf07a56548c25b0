// PinBook: why a node keeps each blob pinned, so that it can let go of it when the reason ends.
//
// A node pins what it must keep serving or re-reading (task data, global states, its deltas);
// everything unpinned is evicted by the BlobStore's LRU when its quota needs room. The book maps
// each blob to a set of reasons (strings, node/agent.h lists the ones the agent uses, e.g.
// "task:<task hex>", "delta:<task hex>:<round>") and keeps the store's pin count of a blob at
// exactly 1 while it has a reason and the blob is in the store, 0 otherwise. It also records the
// unit work directories (checkpoints) the node has created, and when the node first saw a task
// closed, so that clean-up survives restarts.
//
// Persistence: one JSON file (<data_dir>/pins.json), rewritten atomically on every change BEFORE
// the store's pins change. Open() then reconciles the store with the book: a blob with a reason
// is pinned (a crash between the write and the Pin), a pinned blob without one is unpinned (a
// crash between the write and the Unpin, or pins made before the book existed). So a restart
// neither leaks a pin forever nor drops one still needed. Pins of blobs that are not in the store
// at all (BlobStore::ListBlobs does not list them) are never made by the book.
//
//   ML_ASSIGN_OR_RETURN(auto book, PinBook::Open(env, dir + "/pins.json", store));
//   ML_RETURN_IF_ERROR(book->Add(delta_id, "delta:" + task.ToHex() + ":3"));
//   ML_RETURN_IF_ERROR(book->Remove([](const Hash256&, const std::string& r) {
//     return r.starts_with("delta:");
//   }).status());
//
// Thread-safety: thread-safe (one mutex; the agent's Tick and the upload service both add).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/net/blob_store.h"

namespace meshlearn::node {

class PinBook {
 public:
  using UnitKey = std::pair<Hash256, uint32_t>;  // (task, unit index)

  // Loads the book at `path` (absent: empty) and reconciles `store`'s pins with it. `env` and
  // `store` must outlive the book.
  static Result<std::unique_ptr<PinBook>> Open(Env* env, std::string path, net::BlobStore* store);

  // Records `reason` for blob `id` and pins it if it is in the store (now, or at the next Add or
  // Open once it is). Idempotent.
  Status Add(const Hash256& id, const std::string& reason);
  // Drops every (blob, reason) for which `drop` is true, then unpins the blobs left without a
  // reason. Returns how many blobs were unpinned.
  Result<size_t> Remove(
      const std::function<bool(const Hash256& id, const std::string& reason)>& drop);
  std::set<std::string> Reasons(const Hash256& id);
  std::map<Hash256, std::set<std::string>> Snapshot();

  // Unit work directories (checkpoints, progress) -> the unit's round. Recorded before the
  // unit's first file is written, forgotten once its files are deleted.
  Status AddUnit(const Hash256& task, uint32_t index, uint32_t round);
  Status RemoveUnits(const std::vector<UnitKey>& units);
  std::map<UnitKey, uint32_t> Units();

  // The height at which the node first saw `task` finished or cancelled (0: not seen).
  uint64_t ClosedSeen(const Hash256& task);
  Status SetClosedSeen(const Hash256& task, uint64_t height);
  Status ForgetTask(const Hash256& task);  // drops the closed mark
  // Every task named by a reason ("<kind>:<task hex>[:...]"), a unit or a closed mark, except
  // the reasons in `exclude_kinds` (e.g. "keep-final", which outlives its task).
  std::set<Hash256> Tasks(const std::set<std::string>& exclude_kinds = {});

  // Makes the store's pins match the book (Open does this).
  Status Reconcile();

  // "task:ab.." -> ("task", ab..); false when the reason names no task.
  static bool ParseTaskReason(const std::string& reason, std::string* kind, Hash256* task);

 private:
  PinBook(Env* env, std::string path, net::BlobStore* store)
      : env_(env), path_(std::move(path)), store_(store) {}
  Status Load();
  Status SaveLocked();
  Status PinLocked(const Hash256& id);    // pin once, if stored
  Status UnpinLocked(const Hash256& id);  // down to 0

  Env* const env_;
  const std::string path_;
  net::BlobStore* const store_;
  std::mutex mu_;
  std::map<Hash256, std::set<std::string>> reasons_;
  std::map<UnitKey, uint32_t> units_;
  std::map<Hash256, uint64_t> closed_;
};

}  // namespace meshlearn::node
