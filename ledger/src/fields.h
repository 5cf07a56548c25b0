// Internal: visitors that turn a struct's Visit(s, v) field list into canonical encoding,
// decoding and JSON. Payload structs (tx.h) and NodeCapabilities use them, so a field is
// listed once and all four views agree.
#pragma once

#include <concepts>
#include <limits>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger::internal {

// Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). Strings in transactions must be
// valid so that every JSON view of them can be printed.
inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // continuation bytes missing
    for (int k = 1; k <= n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

struct NullVisitor {
  template <typename T>
  void operator()(const char*, T&) {}
};

template <typename T>
concept HasVisit = requires(T& t) { T::Visit(t, NullVisitor{}); };
// A struct that may be a list field: it bounds the list's length.
template <typename T>
concept HasVisitList = HasVisit<T> && requires { T::kMaxListLength; };

struct FieldEncoder {
  Encoder& e;
  void operator()(const char*, const uint8_t& v) { e.PutU8(v); }
  void operator()(const char*, const uint16_t& v) { e.PutU16(v); }
  void operator()(const char*, const uint32_t& v) { e.PutU32(v); }
  void operator()(const char*, const uint64_t& v) { e.PutU64(v); }
  void operator()(const char*, const int64_t& v) { e.PutI64(v); }
  void operator()(const char*, const bool& v) { e.PutBool(v); }
  void operator()(const char*, const std::string& v) { e.PutString(v); }
  void operator()(const char*, const PublicKey& v) { e.PutPublicKey(v); }
  void operator()(const char*, const Hash256& v) { e.PutHash(v); }
  void operator()(const char*, const std::vector<Hash256>& v) {
    e.PutU32(static_cast<uint32_t>(v.size()));
    for (const Hash256& h : v) e.PutHash(h);
  }
  void operator()(const char*, const std::vector<uint64_t>& v) {
    e.PutU32(static_cast<uint32_t>(v.size()));
    for (uint64_t x : v) e.PutU64(x);
  }
  void operator()(const char*, const WitnessField& v) { e.PutBytes(v.bytes); }
  void operator()(const char*, const BundleField& v) { e.PutString(v.text); }
  template <HasVisit T>
  void operator()(const char*, const T& v) {
    T::Visit(v, *this);
  }
  template <HasVisitList T>
  void operator()(const char*, const std::vector<T>& v) {
    e.PutU32(static_cast<uint32_t>(v.size()));
    for (const T& x : v) T::Visit(x, *this);
  }
};

// Stops at the first error (kept in `status`).
struct FieldDecoder {
  Decoder& d;
  Status status;
  void operator()(const char* n, uint8_t& v) { Do([&] { return d.GetU8(&v, n); }); }
  void operator()(const char* n, uint16_t& v) { Do([&] { return d.GetU16(&v, n); }); }
  void operator()(const char* n, uint32_t& v) { Do([&] { return d.GetU32(&v, n); }); }
  void operator()(const char* n, uint64_t& v) { Do([&] { return d.GetU64(&v, n); }); }
  void operator()(const char* n, int64_t& v) { Do([&] { return d.GetI64(&v, n); }); }
  void operator()(const char* n, bool& v) { Do([&] { return d.GetBool(&v, n); }); }
  void operator()(const char* n, std::string& v) {
    Do([&] { return d.GetString(&v, n, kMaxStringFieldLength); });
    if (status.ok() && !IsValidUtf8(v)) {
      status = InvalidArgument(std::string("field '") + n + "' is not valid UTF-8");
    }
  }
  void operator()(const char* n, PublicKey& v) { Do([&] { return d.GetPublicKey(&v, n); }); }
  void operator()(const char* n, Hash256& v) { Do([&] { return d.GetHash(&v, n); }); }
  void operator()(const char* n, std::vector<Hash256>& v) {
    uint32_t count = 0;
    Do([&] { return d.GetCount(&count, n, kMaxHashListLength, 32); });
    if (!status.ok()) return;
    v.resize(count);
    for (Hash256& h : v) Do([&] { return d.GetHash(&h, n); });
  }
  void operator()(const char* n, std::vector<uint64_t>& v) {
    uint32_t count = 0;
    Do([&] { return d.GetCount(&count, n, kMaxU64ListLength, 8); });
    if (!status.ok()) return;
    v.resize(count);
    for (uint64_t& x : v) Do([&] { return d.GetU64(&x, n); });
  }
  void operator()(const char* n, WitnessField& v) {
    Do([&] { return d.GetBytes(&v.bytes, n, static_cast<uint32_t>(kMaxWitnessBytes)); });
  }
  void operator()(const char* n, BundleField& v) {
    Do([&] { return d.GetString(&v.text, n, kMaxBundleBytes); });
    if (status.ok() && !IsValidUtf8(v.text)) {
      status = InvalidArgument(std::string("field '") + n + "' (a task bundle) is not valid UTF-8");
    }
  }
  template <HasVisit T>
  void operator()(const char*, T& v) {
    T::Visit(v, *this);
  }
  template <HasVisitList T>
  void operator()(const char* n, std::vector<T>& v) {
    uint32_t count = 0;
    Do([&] { return d.GetCount(&count, n, T::kMaxListLength); });
    if (!status.ok()) return;
    v.resize(count);
    for (T& x : v) T::Visit(x, *this);
  }

 private:
  template <typename F>
  void Do(F&& f) {
    if (status.ok()) status = f();
  }
};

struct FieldToJson {
  nlohmann::json& j;
  template <typename T>
    requires std::is_integral_v<T>
  void operator()(const char* n, const T& v) {
    j[n] = v;
  }
  void operator()(const char* n, const std::string& v) { j[n] = v; }
  void operator()(const char* n, const PublicKey& v) { j[n] = v.ToHex(); }
  void operator()(const char* n, const Hash256& v) { j[n] = v.ToHex(); }
  void operator()(const char* n, const std::vector<Hash256>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const Hash256& h : v) a.push_back(h.ToHex());
    j[n] = std::move(a);
  }
  void operator()(const char* n, const std::vector<uint64_t>& v) { j[n] = v; }
  void operator()(const char* n, const WitnessField& v) { j[n] = HexEncode(v.bytes); }
  void operator()(const char* n, const BundleField& v) { j[n] = v.text; }
  template <HasVisit T>
  void operator()(const char* n, const T& v) {
    nlohmann::json sub = nlohmann::json::object();
    T::Visit(v, FieldToJson{sub});
    j[n] = std::move(sub);
  }
  template <HasVisitList T>
  void operator()(const char* n, const std::vector<T>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const T& x : v) {
      nlohmann::json sub = nlohmann::json::object();
      T::Visit(x, FieldToJson{sub});
      a.push_back(std::move(sub));
    }
    j[n] = std::move(a);
  }
};

// Reads the fields named by Visit from a JSON object. A missing field keeps its default; a key
// that is no field is an error (catches typos); wrong types and out-of-range numbers too.
struct FieldFromJson {
  const nlohmann::json& j;
  std::string where;  // "Transfer payload"
  Status status;
  std::set<std::string> seen;

  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  void operator()(const char* n, T& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (f->is_number_unsigned()) {
      uint64_t u = f->get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        v = static_cast<T>(u);
        return;
      }
    } else if (f->is_number_integer()) {
      int64_t i = f->get<int64_t>();
      if (std::is_signed_v<T> && i >= static_cast<int64_t>(std::numeric_limits<T>::min())) {
        v = static_cast<T>(i);
        return;
      }
    }
    Fail(n, "must be an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                std::to_string(std::numeric_limits<T>::max()) + "], got " + f->dump());
  }
  void operator()(const char* n, bool& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_boolean()) return Fail(n, "must be true or false, got " + f->dump());
    v = f->get<bool>();
  }
  void operator()(const char* n, std::string& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_string()) return Fail(n, "must be a string, got " + f->dump());
    v = f->get<std::string>();
    if (v.size() > kMaxStringFieldLength) {
      Fail(n, "is longer than " + std::to_string(kMaxStringFieldLength) + " bytes");
    }
  }
  void operator()(const char* n, PublicKey& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_string()) return Fail(n, "must be a hex public key, got " + f->dump());
    auto r = PublicKey::FromHex(f->get<std::string>(), n);
    if (!r.ok()) return SetError(r.status());
    v = *r;
  }
  void operator()(const char* n, Hash256& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_string()) return Fail(n, "must be a hex hash, got " + f->dump());
    auto r = Hash256::FromHex(f->get<std::string>(), n);
    if (!r.ok()) return SetError(r.status());
    v = *r;
  }
  void operator()(const char* n, std::vector<Hash256>& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_array() || f->size() > kMaxHashListLength) {
      return Fail(n, "must be an array of at most " + std::to_string(kMaxHashListLength) +
                         " hex hashes");
    }
    v.clear();
    for (const nlohmann::json& e : *f) {
      if (!e.is_string()) return Fail(n, "must hold hex hashes, got " + e.dump());
      auto r = Hash256::FromHex(e.get<std::string>(), n);
      if (!r.ok()) return SetError(r.status());
      v.push_back(*r);
    }
  }
  void operator()(const char* n, std::vector<uint64_t>& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_array() || f->size() > kMaxU64ListLength) {
      return Fail(n, "must be an array of at most " + std::to_string(kMaxU64ListLength) +
                         " integers");
    }
    v.clear();
    for (const nlohmann::json& e : *f) {
      if (!e.is_number_unsigned()) {
        return Fail(n, "must hold integers in [0, 2^64), got " + e.dump());
      }
      v.push_back(e.get<uint64_t>());
    }
  }
  void operator()(const char* n, WitnessField& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_string() || f->get_ref<const std::string&>().size() > 2 * kMaxWitnessBytes) {
      return Fail(n, "must be the hex of at most " + std::to_string(kMaxWitnessBytes) + " bytes");
    }
    auto r = HexDecode(f->get<std::string>(), n);
    if (!r.ok()) return SetError(r.status());
    v.bytes = std::move(*r);
  }
  void operator()(const char* n, BundleField& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_string() || f->get_ref<const std::string&>().size() > kMaxBundleBytes) {
      return Fail(n, "must be a task bundle's text of at most " + std::to_string(kMaxBundleBytes) +
                         " bytes");
    }
    v.text = f->get<std::string>();
  }
  template <HasVisit T>
  void operator()(const char* n, T& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_object()) return Fail(n, "must be an object, got " + f->dump());
    FieldFromJson sub{*f, where + "." + n};
    T::Visit(v, sub);
    if (sub.status.ok()) sub.CheckNoUnknownKeys();
    if (!sub.status.ok()) SetError(sub.status);
  }
  template <HasVisitList T>
  void operator()(const char* n, std::vector<T>& v) {
    const nlohmann::json* f = Field(n);
    if (f == nullptr) return;
    if (!f->is_array() || f->size() > T::kMaxListLength) {
      return Fail(n,
                  "must be an array of at most " + std::to_string(T::kMaxListLength) + " objects");
    }
    v.assign(f->size(), T{});
    for (size_t i = 0; i < f->size(); ++i) {
      const nlohmann::json& e = (*f)[i];
      const std::string at = std::string(n) + "[" + std::to_string(i) + "]";
      if (!e.is_object()) return Fail(n, "must hold objects, got " + e.dump());
      FieldFromJson sub{e, where + "." + at};
      T::Visit(v[i], sub);
      if (sub.status.ok()) sub.CheckNoUnknownKeys();
      if (!sub.status.ok()) return SetError(sub.status);
    }
  }

  // Call after Visit: every key must have been a field. `also_allowed` keys are skipped.
  void CheckNoUnknownKeys(const std::set<std::string>& also_allowed = {}) {
    if (!status.ok()) return;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!seen.count(it.key()) && !also_allowed.count(it.key())) {
        status = InvalidArgument(where + ": unknown field '" + it.key() + "'");
        return;
      }
    }
  }

 private:
  const nlohmann::json* Field(const char* n) {
    if (!status.ok()) return nullptr;
    seen.insert(n);
    auto it = j.find(n);
    if (it == j.end()) return nullptr;
    return &*it;
  }
  void Fail(const char* n, const std::string& what) {
    SetError(InvalidArgument(where + ": field '" + n + "' " + what));
  }
  void SetError(Status s) {
    if (status.ok()) status = std::move(s);
  }
};

}  // namespace meshlearn::ledger::internal
