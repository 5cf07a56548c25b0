// A checked view of a JSON-RPC answer from a ledger, for every client that decodes one (the
// RpcClient's envelope, the follower, the node's chain client, the CLI). The server is another
// machine: its answer may have any shape, and a wrong one must be an error that names the method
// and the field, never an uncaught nlohmann::type_error (an abort).
//
//   ML_ASSIGN_OR_RETURN(nlohmann::json result, rpc.Call("get_blocks", params));
//   RpcAnswer a("get_blocks", result);
//   ML_ASSIGN_OR_RETURN(uint64_t height, a.U64("height"));
//   ML_ASSIGN_OR_RETURN(RpcAnswer blocks, a.Array("blocks"));
//   for (size_t i = 0; i < blocks.size(); ++i) {
//     ML_ASSIGN_OR_RETURN(std::string hex, blocks.At(i).Str());
//   }
//
// Errors are DataLoss: "ledger answer to get_blocks: result.height must be an unsigned integer,
// got \"x\"". Readers with a default accept an absent or null field; a present field of the wrong
// type is still an error. The view does not own the JSON: it must outlive the view.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"

namespace meshlearn::ledger {

class RpcAnswer {
 public:
  // `path` names `j` in messages ("result", "result.units[2]").
  RpcAnswer(std::string method, const nlohmann::json& j, std::string path = "result");

  const nlohmann::json& raw() const { return *j_; }
  const std::string& method() const { return method_; }
  const std::string& path() const { return path_; }

  // OK when the value itself is an object (an array); else the error a reader would give.
  Status IsObject() const;
  Status IsArray() const;

  // Field `key` is present and not null (false when this is not an object).
  bool Has(std::string_view key) const;

  Result<uint64_t> U64(std::string_view key) const;
  Result<uint64_t> U64(std::string_view key, uint64_t if_absent) const;
  Result<uint32_t> U32(std::string_view key) const;
  Result<uint32_t> U32(std::string_view key, uint32_t if_absent) const;
  Result<int64_t> I64(std::string_view key, int64_t if_absent) const;
  Result<std::string> Str(std::string_view key) const;
  Result<std::string> Str(std::string_view key, std::string if_absent) const;
  Result<bool> Bool(std::string_view key) const;
  Result<bool> Bool(std::string_view key, bool if_absent) const;
  Result<Hash256> Hash(std::string_view key) const;
  Result<PublicKey> Key(std::string_view key) const;
  // A nested object or array, as a view (its path extends this one's).
  Result<RpcAnswer> Object(std::string_view key) const;
  Result<RpcAnswer> Array(std::string_view key) const;
  // An optional nested object: absent or null gives a view of null (Has() false for every key).
  Result<RpcAnswer> ObjectOrNull(std::string_view key) const;

  // The value itself.
  Result<uint64_t> U64() const;
  Result<std::string> Str() const;
  Result<Hash256> Hash() const;
  Result<PublicKey> Key() const;

  // Elements of an array view (size() is 0 for anything else).
  size_t size() const;
  RpcAnswer At(size_t i) const;

  // "ledger answer to <method>: <path>.<key> <what>, got <a short dump>".
  Status Bad(std::string_view key, std::string_view what) const;

 private:
  RpcAnswer Child(std::string_view key) const;
  std::string Where(std::string_view key) const;

  std::string method_;
  const nlohmann::json* j_;
  std::string path_;
};

}  // namespace meshlearn::ledger
