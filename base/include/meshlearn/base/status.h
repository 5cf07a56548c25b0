// Status and Result<T>: how library code reports errors. No exceptions cross a library boundary.
//
//   Result<Tensor> t = LoadTensor(path);
//   if (!t.ok()) return t.status();
//   Use(*t);
//
// Messages name the input and the fix: "task.toml: optimizer.lr must be > 0, got -1".
// Add a code only when some caller reacts to it differently.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "meshlearn/base/check.h"

namespace meshlearn {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the input is malformed or out of range; fix the input
  kNotFound,           // a named thing does not exist
  kAlreadyExists,      // creating something that is there
  kFailedPrecondition, // the system is not in a state to do this (e.g. insufficient funds)
  kPermissionDenied,   // bad signature, wrong passphrase
  kDataLoss,           // a stored file is corrupt or truncated
  kUnavailable,        // a peer or service cannot be reached now; retrying may help
  kDeadlineExceeded,   // timed out
  kResourceExhausted,  // size, rate or quota limit
  kInternal,           // a bug or an OS error we did not expect
};

std::string_view StatusCodeName(StatusCode code);
// The code StatusCodeName gives `name`, for an error that crossed a process boundary (a JSON-RPC
// answer's status). An error is never OK: "OK" and unknown names give kInternal.
StatusCode ErrorCodeFromName(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: task.toml: ..." ("OK" when ok).
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>", same code. For adding context
  // ("genesis.toml: " + inner error) as an error travels up.
  Status WithPrefix(std::string_view prefix) const;

  bool operator==(const Status&) const = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status FailedPrecondition(std::string message);
Status PermissionDenied(std::string message);
Status DataLoss(std::string message);
Status Unavailable(std::string message);
Status DeadlineExceeded(std::string message);
Status ResourceExhausted(std::string message);
Status Internal(std::string message);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    CHECK(!status_.ok()) << "Result constructed from an OK Status without a value";
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace meshlearn

// Returns early from the enclosing function if `expr` (a Status) is not OK.
#define ML_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    ::meshlearn::Status ml_status_ = (expr);       \
    if (!ml_status_.ok()) return ml_status_;       \
  } while (0)

#define ML_CONCAT_INNER_(a, b) a##b
#define ML_CONCAT_(a, b) ML_CONCAT_INNER_(a, b)

// ML_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its Status.
#define ML_ASSIGN_OR_RETURN(lhs, expr) \
  ML_ASSIGN_OR_RETURN_IMPL_(ML_CONCAT_(ml_result_, __LINE__), lhs, expr)
#define ML_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
