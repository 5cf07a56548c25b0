// The node's journals: one on-disk format for every record a role keeps across a restart (a
// unit's progress and result, what it committed, an aggregate, a verdict, a dispute's replayed
// hashes, the secret chain's epoch). Not a public header.
//
// A journal file is one JSON object, written atomically (Env::WriteFileAtomic), so a crash leaves
// the old record or the new one, never half of either:
//
//   {"journal": "unit_progress", "version": 1, "record": {"start_state": "ab12...", ...}}
//
// A record type names its fields once in Visit (the way ledger/tx_types.h does), and its kind
// and version in kKind / kVersion; writing and reading both follow from Visit. Reading is strict:
// another kind, another version, a missing field, a field of the wrong type or one the record
// does not have is a DataLoss naming the file and the field. A role treats such a file as absent
// (it redoes the work), exactly as it treats a file that is not there.
//
//   struct UnitProgress {
//     static constexpr std::string_view kKind = "unit_progress";
//     static constexpr uint32_t kVersion = 1;
//     Hash256 start_state; int64_t step = 0; ...
//     template <typename S, typename V> static void Visit(S& s, V&& v) {
//       v("start_state", s.start_state); v("step", s.step); ...
//     }
//   };
//   ML_RETURN_IF_ERROR(WriteJournal(env, path, progress));
//   ML_ASSIGN_OR_RETURN(UnitProgress p, ReadJournal<UnitProgress>(env, path));
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"

namespace meshlearn::node::journal {

namespace detail {

struct ToJson {
  nlohmann::json& j;
  template <typename T>
    requires std::is_integral_v<T>
  void operator()(const char* n, const T& v) {
    j[n] = v;
  }
  void operator()(const char* n, const std::string& v) { j[n] = v; }
  void operator()(const char* n, const Hash256& v) { j[n] = v.ToHex(); }
  void operator()(const char* n, const std::vector<Hash256>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const Hash256& h : v) a.push_back(h.ToHex());
    j[n] = std::move(a);
  }
  void operator()(const char* n, const std::vector<uint64_t>& v) { j[n] = v; }
};

struct FromJson {
  const nlohmann::json& j;
  const std::string& where;
  Status status;
  std::set<std::string> names;

  Status Bad(const char* n, std::string_view what) const {
    return DataLoss(where + ": field " + n + " " + std::string(what));
  }
  const nlohmann::json* Field(const char* n) {
    names.insert(n);
    if (!status.ok()) return nullptr;
    auto it = j.find(n);
    if (it == j.end()) {
      status = Bad(n, "missing");
      return nullptr;
    }
    return &*it;
  }
  static Result<Hash256> HashOf(const nlohmann::json& v, const std::string& where) {
    if (!v.is_string()) return DataLoss(where + " is not a hex string");
    Result<Hash256> h = Hash256::FromHex(v.get<std::string>(), where);
    if (!h.ok()) return DataLoss(h.status().message());  // a damaged file, like the rest
    return h;
  }

  template <typename T>
    requires std::is_integral_v<T>
  void operator()(const char* n, T& v) {
    const nlohmann::json* f = Field(n);
    if (!f) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!f->is_boolean()) status = Bad(n, "must be true or false");
      else v = f->get<bool>();
    } else if constexpr (std::is_signed_v<T>) {
      if (!f->is_number_integer()) status = Bad(n, "must be an integer");
      else v = f->get<T>();
    } else {
      if (!f->is_number_unsigned() && !(f->is_number_integer() && f->get<int64_t>() >= 0)) {
        status = Bad(n, "must be an unsigned integer");
      } else if (f->get<uint64_t>() > std::numeric_limits<T>::max()) {
        status = Bad(n, "is out of range");
      } else {
        v = f->get<T>();
      }
    }
  }
  void operator()(const char* n, std::string& v) {
    const nlohmann::json* f = Field(n);
    if (!f) return;
    if (!f->is_string()) status = Bad(n, "must be a string");
    else v = f->get<std::string>();
  }
  void operator()(const char* n, Hash256& v) {
    const nlohmann::json* f = Field(n);
    if (!f) return;
    Result<Hash256> h = HashOf(*f, where + ": field " + n);
    if (!h.ok()) status = h.status();
    else v = *h;
  }
  void operator()(const char* n, std::vector<Hash256>& v) {
    const nlohmann::json* f = Field(n);
    if (!f) return;
    if (!f->is_array()) {
      status = Bad(n, "must be a list of hashes");
      return;
    }
    v.clear();
    for (const nlohmann::json& e : *f) {
      Result<Hash256> h = HashOf(e, where + ": field " + n);
      if (!h.ok()) {
        status = h.status();
        return;
      }
      v.push_back(*h);
    }
  }
  void operator()(const char* n, std::vector<uint64_t>& v) {
    const nlohmann::json* f = Field(n);
    if (!f) return;
    v.clear();
    for (const nlohmann::json& e : f->is_array() ? *f : nlohmann::json::array()) {
      if (!e.is_number_unsigned() && !(e.is_number_integer() && e.get<int64_t>() >= 0)) {
        status = Bad(n, "must be a list of unsigned integers");
        return;
      }
      v.push_back(e.get<uint64_t>());
    }
    if (!f->is_array()) status = Bad(n, "must be a list of unsigned integers");
  }
};

}  // namespace detail

// The file's text: {"journal", "version", "record"}.
template <typename R>
std::string EncodeJournal(const R& r) {
  nlohmann::json record = nlohmann::json::object();
  R::Visit(r, detail::ToJson{record});
  nlohmann::json j = {{"journal", std::string(R::kKind)},
                      {"version", R::kVersion},
                      {"record", std::move(record)}};
  return j.dump();
}

template <typename R>
Result<R> DecodeJournal(std::string_view text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(where + " is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "journal" && it.key() != "version" && it.key() != "record") {
      return DataLoss(where + ": unknown key " + it.key());
    }
  }
  if (!j.contains("journal") || j["journal"] != std::string(R::kKind)) {
    return DataLoss(where + " is not a " + std::string(R::kKind) + " journal");
  }
  if (!j.contains("version") || j["version"] != R::kVersion) {
    return DataLoss(where + ": " + std::string(R::kKind) + " journal version " +
                    (j.contains("version") ? j["version"].dump() : std::string("(none)")) +
                    ", this node reads version " + std::to_string(R::kVersion));
  }
  if (!j.contains("record") || !j["record"].is_object()) {
    return DataLoss(where + ": no record object");
  }
  const nlohmann::json& record = j["record"];
  R r;
  detail::FromJson d{record, where, Status::Ok(), {}};
  R::Visit(r, d);
  ML_RETURN_IF_ERROR(d.status);
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (!d.names.count(it.key())) return DataLoss(where + ": unknown field " + it.key());
  }
  return r;
}

template <typename R>
Status WriteJournal(Env* env, const std::string& path, const R& r) {
  return env->WriteFileAtomic(path, EncodeJournal(r));
}

// NotFound when there is no file; DataLoss when it is not a readable R.
template <typename R>
Result<R> ReadJournal(Env* env, const std::string& path) {
  if (!env->FileExists(path)) return NotFound(path + " does not exist");
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  return DecodeJournal<R>(text, path);
}

}  // namespace meshlearn::node::journal
