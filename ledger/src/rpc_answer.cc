#include "meshlearn/ledger/rpc_answer.h"

namespace meshlearn::ledger {
namespace {

using json = nlohmann::json;

const json& Null() {
  static const json* null = new json(nullptr);
  return *null;
}

std::string ShortDump(const json& j) {
  // Invalid UTF-8 in a string would make dump() throw; replace it.
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

bool IsU64(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

}  // namespace

RpcAnswer::RpcAnswer(std::string method, const json& j, std::string path)
    : method_(std::move(method)), j_(&j), path_(std::move(path)) {}

std::string RpcAnswer::Where(std::string_view key) const {
  return key.empty() ? path_ : path_ + "." + std::string(key);
}

Status RpcAnswer::Bad(std::string_view key, std::string_view what) const {
  const json& v = key.empty() ? *j_ : (j_->is_object() && j_->contains(key) ? (*j_)[std::string(key)] : Null());
  std::string got = !key.empty() && j_->is_object() && !j_->contains(key) ? "nothing" : ShortDump(v);
  return DataLoss("ledger answer to " + method_ + ": " + Where(key) + " " + std::string(what) +
                  ", got " + got);
}

Status RpcAnswer::IsObject() const {
  return j_->is_object() ? Status::Ok() : Bad("", "must be an object");
}
Status RpcAnswer::IsArray() const {
  return j_->is_array() ? Status::Ok() : Bad("", "must be an array");
}

bool RpcAnswer::Has(std::string_view key) const {
  if (!j_->is_object()) return false;
  auto it = j_->find(key);
  return it != j_->end() && !it->is_null();
}

RpcAnswer RpcAnswer::Child(std::string_view key) const {
  if (!j_->is_object()) return RpcAnswer(method_, Null(), Where(key));
  auto it = j_->find(key);
  return RpcAnswer(method_, it == j_->end() ? Null() : *it, Where(key));
}

Result<uint64_t> RpcAnswer::U64(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  const json& v = Child(key).raw();
  if (!IsU64(v)) return Bad(key, "must be an unsigned integer");
  return v.get<uint64_t>();
}
Result<uint64_t> RpcAnswer::U64(std::string_view key, uint64_t if_absent) const {
  ML_RETURN_IF_ERROR(IsObject());
  return Has(key) ? U64(key) : Result<uint64_t>(if_absent);
}
Result<uint32_t> RpcAnswer::U32(std::string_view key) const {
  ML_ASSIGN_OR_RETURN(uint64_t v, U64(key));
  if (v > UINT32_MAX) return Bad(key, "must fit 32 bits");
  return static_cast<uint32_t>(v);
}
Result<uint32_t> RpcAnswer::U32(std::string_view key, uint32_t if_absent) const {
  ML_RETURN_IF_ERROR(IsObject());
  return Has(key) ? U32(key) : Result<uint32_t>(if_absent);
}
Result<int64_t> RpcAnswer::I64(std::string_view key, int64_t if_absent) const {
  ML_RETURN_IF_ERROR(IsObject());
  if (!Has(key)) return if_absent;
  const json& v = Child(key).raw();
  if (!v.is_number_integer()) return Bad(key, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Bad(key, "must fit 64 signed bits");
  }
  return v.get<int64_t>();
}
Result<std::string> RpcAnswer::Str(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  const json& v = Child(key).raw();
  if (!v.is_string()) return Bad(key, "must be a string");
  return v.get<std::string>();
}
Result<std::string> RpcAnswer::Str(std::string_view key, std::string if_absent) const {
  ML_RETURN_IF_ERROR(IsObject());
  return Has(key) ? Str(key) : Result<std::string>(std::move(if_absent));
}
Result<bool> RpcAnswer::Bool(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  const json& v = Child(key).raw();
  if (!v.is_boolean()) return Bad(key, "must be true or false");
  return v.get<bool>();
}
Result<bool> RpcAnswer::Bool(std::string_view key, bool if_absent) const {
  ML_RETURN_IF_ERROR(IsObject());
  return Has(key) ? Bool(key) : Result<bool>(if_absent);
}
Result<Hash256> RpcAnswer::Hash(std::string_view key) const {
  ML_ASSIGN_OR_RETURN(std::string hex, Str(key));
  Result<Hash256> h = Hash256::FromHex(hex, Where(key));
  if (!h.ok()) return Bad(key, "must be 64 hex digits");
  return h;
}
Result<PublicKey> RpcAnswer::Key(std::string_view key) const {
  ML_ASSIGN_OR_RETURN(std::string hex, Str(key));
  Result<PublicKey> k = PublicKey::FromHex(hex, Where(key));
  if (!k.ok()) return Bad(key, "must be a public key (64 hex digits)");
  return k;
}
Result<RpcAnswer> RpcAnswer::Object(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  RpcAnswer c = Child(key);
  if (!c.raw().is_object()) return Bad(key, "must be an object");
  return c;
}
Result<RpcAnswer> RpcAnswer::Array(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  RpcAnswer c = Child(key);
  if (!c.raw().is_array()) return Bad(key, "must be an array");
  return c;
}
Result<RpcAnswer> RpcAnswer::ObjectOrNull(std::string_view key) const {
  ML_RETURN_IF_ERROR(IsObject());
  if (!Has(key)) return RpcAnswer(method_, Null(), Where(key));
  return Object(key);
}

Result<uint64_t> RpcAnswer::U64() const {
  if (!IsU64(*j_)) return Bad("", "must be an unsigned integer");
  return j_->get<uint64_t>();
}
Result<std::string> RpcAnswer::Str() const {
  if (!j_->is_string()) return Bad("", "must be a string");
  return j_->get<std::string>();
}
Result<Hash256> RpcAnswer::Hash() const {
  ML_ASSIGN_OR_RETURN(std::string hex, Str());
  Result<Hash256> h = Hash256::FromHex(hex, path_);
  if (!h.ok()) return Bad("", "must be 64 hex digits");
  return h;
}
Result<PublicKey> RpcAnswer::Key() const {
  ML_ASSIGN_OR_RETURN(std::string hex, Str());
  Result<PublicKey> k = PublicKey::FromHex(hex, path_);
  if (!k.ok()) return Bad("", "must be a public key (64 hex digits)");
  return k;
}

size_t RpcAnswer::size() const { return j_->is_array() ? j_->size() : 0; }

RpcAnswer RpcAnswer::At(size_t i) const {
  const json& v = j_->is_array() && i < j_->size() ? (*j_)[i] : Null();
  return RpcAnswer(method_, v, path_ + "[" + std::to_string(i) + "]");
}

}  // namespace meshlearn::ledger
