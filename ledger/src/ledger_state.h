// Internal: the ledger state in memory, with an undo journal.
//
// Each table is a sorted map (deterministic iteration for the state hash) that records the old
// value of a row before every change. Execution takes a Mark before a transaction and rolls
// back to it when the transaction fails; a block that is refused rolls back to the mark taken
// at its start. Changed keys are remembered (dirty) so the store writes only those rows.
//
// Not thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/state.h"

namespace meshlearn::ledger {

using WorkUnitKey = std::pair<Hash256, uint32_t>;  // (task id, index)

// Key order of the tables: the same order as K's operator< (bytewise for keys and hashes, so
// iteration, paging and the state hash are unchanged), but a 32-byte key compares as four
// big-endian words instead of a memcmp call: lookups are most of what execution does.
namespace internal {
inline bool Less32(const uint8_t* a, const uint8_t* b) {
  for (int i = 0; i < 32; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    if (x != y) return __builtin_bswap64(x) < __builtin_bswap64(y);
  }
  return false;
}
}  // namespace internal

template <typename K>
struct KeyLess {
  bool operator()(const K& a, const K& b) const { return a < b; }
};
template <>
struct KeyLess<PublicKey> {
  static_assert(PublicKey::kSize == 32);
  bool operator()(const PublicKey& a, const PublicKey& b) const {
    return internal::Less32(a.bytes.data(), b.bytes.data());
  }
};
template <>
struct KeyLess<Hash256> {
  static_assert(Hash256::kSize == 32);
  bool operator()(const Hash256& a, const Hash256& b) const {
    return internal::Less32(a.bytes.data(), b.bytes.data());
  }
};
template <>
struct KeyLess<WorkUnitKey> {
  bool operator()(const WorkUnitKey& a, const WorkUnitKey& b) const {
    if (a.first != b.first) return internal::Less32(a.first.bytes.data(), b.first.bytes.data());
    return a.second < b.second;
  }
};

template <typename K, typename V>
class JournaledMap {
 public:
  const V* Find(const K& k) const {
    auto it = rows_.find(k);
    return it == rows_.end() ? nullptr : &it->second;
  }
  // Journals the row, then returns it for changing; nullptr if absent (nothing journaled).
  V* FindMutable(const K& k) {
    auto it = rows_.find(k);
    if (it == rows_.end()) return nullptr;
    journal_.push_back({k, it->second});
    dirty_.insert(k);
    return &it->second;
  }
  // Inserts or replaces.
  void Put(const K& k, V v) {
    auto it = rows_.find(k);
    journal_.push_back({k, it == rows_.end() ? std::nullopt : std::optional<V>(it->second)});
    dirty_.insert(k);
    rows_.insert_or_assign(k, std::move(v));
  }
  void Erase(const K& k) {
    auto it = rows_.find(k);
    if (it == rows_.end()) return;
    journal_.push_back({k, std::move(it->second)});
    dirty_.insert(k);
    rows_.erase(it);
  }

  const std::map<K, V, KeyLess<K>>& rows() const { return rows_; }
  size_t JournalSize() const { return journal_.size(); }
  void RollbackTo(size_t mark) {
    while (journal_.size() > mark) {
      auto& [k, old] = journal_.back();
      if (old) {
        rows_.insert_or_assign(k, std::move(*old));
      } else {
        rows_.erase(k);
      }
      journal_.pop_back();
    }
  }
  void ClearJournal() { journal_.clear(); }
  const std::set<K, KeyLess<K>>& dirty() const { return dirty_; }
  void ClearDirty() { dirty_.clear(); }
  void MarkAllDirty() {
    for (const auto& [k, v] : rows_) dirty_.insert(k);
  }
  // Loading from the store: no journal, not dirty.
  void LoadRow(const K& k, V v) { rows_.insert_or_assign(k, std::move(v)); }

 private:
  std::map<K, V, KeyLess<K>> rows_;
  std::vector<std::pair<K, std::optional<V>>> journal_;
  std::set<K, KeyLess<K>> dirty_;
};

// Chain-wide counters.
struct Globals {
  Amount treasury = 0;
  Amount jackpot = 0;
  Amount minted = 0;
  bool operator==(const Globals&) const = default;
};

// Store table ids (part of the on-disk format).
enum class StateTable : uint8_t {
  kGlobals = 0,
  kAccounts = 1,
  kNodes = 2,
  kTasks = 3,
  kUnits = 4,
  kProofCommits = 5,
};

class LedgerState {
 public:
  struct Mark {
    size_t accounts, nodes, tasks, units, globals, proof_commits;
  };

  // The state before block 1: genesis balances minted.
  static LedgerState FromGenesis(const Genesis& g);

  JournaledMap<PublicKey, Account> accounts;
  JournaledMap<PublicKey, NodeRecord> nodes;
  JournaledMap<Hash256, TaskRecord> tasks;
  JournaledMap<WorkUnitKey, WorkUnit> units;
  JournaledMap<uint8_t, Globals> globals;  // one row, key 0
  // Live proof commitments (CommitProofTx), by commitment; at most kMaxProofCommitments.
  JournaledMap<Hash256, ProofCommit> proof_commits;

  const Globals& g() const;
  Globals* MutableGlobals();  // journals

  Mark GetMark() const;
  void RollbackTo(const Mark& m);
  void ClearJournal();
  void ClearDirty();
  void MarkAllDirty();

  // BLAKE2b over the canonical encoding of every row, table by table, in key order.
  Hash256 Hash() const;
  Totals ComputeTotals() const;

  // Row encodings for the store (value bytes; the key is encoded by the store).
  static Bytes EncodeGlobals(const Globals& g);
  static Status DecodeGlobals(ByteSpan b, Globals* g);
};

}  // namespace meshlearn::ledger
