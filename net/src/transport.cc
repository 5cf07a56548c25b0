#include "meshlearn/net/transport.h"

#include <memory>
#include <mutex>
#include <optional>

namespace meshlearn::net {

Status ValidateMethod(std::string_view method) {
  if (method.empty() || method.size() > kMaxMethodLength) {
    return InvalidArgument("method name must be 1.." + std::to_string(kMaxMethodLength) +
                           " characters, got " + std::to_string(method.size()));
  }
  for (char c : method) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return InvalidArgument("method name may use only [a-z0-9._-], got '" + std::string(method) +
                             "'");
  }
  return Status::Ok();
}

void Router::Register(std::string method, Handler handler, size_t max_request_bytes) {
  Status s = ValidateMethod(method);
  CHECK(s.ok()) << s.ToString();
  CHECK(!handlers_.count(method)) << "method registered twice: " << method;
  max_request_bytes_ = std::max(max_request_bytes_, max_request_bytes);
  handlers_.emplace(std::move(method), Entry{std::move(handler), max_request_bytes});
}

Result<Bytes> Router::Dispatch(const Request& request) const {
  auto it = handlers_.find(request.method);
  if (it == handlers_.end()) return NotFound("unknown method '" + request.method + "'");
  if (request.body.size() > it->second.max_request_bytes) {
    return ResourceExhausted(request.method + ": request of " +
                             std::to_string(request.body.size()) + " bytes exceeds the limit of " +
                             std::to_string(it->second.max_request_bytes));
  }
  return it->second.handler(request);
}

Result<Bytes> Transport::Send(const std::string& endpoint, Request request) {
  // Shared with the callback, which may outlive this frame if WaitUntil returns early.
  struct Slot {
    std::mutex mu;
    std::optional<Result<Bytes>> result;
  };
  auto slot = std::make_shared<Slot>();
  SendAsync(endpoint, std::move(request), [slot](Result<Bytes> r) {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->result.emplace(std::move(r));
  });
  WaitUntil([&] {
    std::lock_guard<std::mutex> lock(slot->mu);
    return slot->result.has_value();
  });
  std::lock_guard<std::mutex> lock(slot->mu);
  if (!slot->result.has_value()) {
    return Unavailable("request to " + endpoint +
                       " never completed (simulation ran out of events)");
  }
  return std::move(*slot->result);
}

}  // namespace meshlearn::net
