#include "meshlearn/net/sim_transport.h"

#include <cmath>
#include <utility>

namespace meshlearn::net {
namespace {

// Bytes a message costs on the wire beyond its body (method, framing).
constexpr size_t kMessageOverhead = 64;

}  // namespace

class SimNode::NodeTransport final : public Transport {
 public:
  explicit NodeTransport(SimNode* node) : node_(node) {}
  void SendAsync(const std::string& endpoint, Request request, ResponseCallback done) override {
    node_->net_->SendFrom(node_, endpoint, std::move(request), std::move(done));
  }
  void WaitUntil(const std::function<bool()>& done) override { node_->net_->RunUntil(done); }

 private:
  SimNode* node_;
};

SimNode::SimNode(SimNetwork* net, std::string name)
    : net_(net), name_(std::move(name)), transport_(std::make_unique<NodeTransport>(this)) {}

SimNetwork::SimNetwork(uint64_t seed, LinkParams default_link)
    : seed_(seed),
      rng_(seed, /*stream=*/0x5e7),
      dup_rng_(seed, /*stream=*/0xd0b),
      default_link_(default_link) {}

SimNetwork::~SimNetwork() = default;

SimNode* SimNetwork::AddNode(const std::string& name) {
  CHECK(!name.empty() && name.find_first_of(" \t\n") == std::string::npos)
      << "bad simulated node name '" << name << "'";
  CHECK(!nodes_.count(name)) << "simulated node added twice: " << name;
  auto* n = new SimNode(this, name);
  nodes_.emplace(name, std::unique_ptr<SimNode>(n));
  return n;
}

SimNode* SimNetwork::node(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : it->second.get();
}

SimNetwork::LinkState& SimNetwork::Link(const std::string& a, const std::string& b) {
  auto it = links_.find({a, b});
  if (it == links_.end()) it = links_.emplace(std::make_pair(a, b), LinkState{default_link_}).first;
  return it->second;
}

void SimNetwork::SetLink(const std::string& a, const std::string& b, const LinkParams& params) {
  Link(a, b).params = params;
  Link(b, a).params = params;
}

void SimNetwork::SetAllLinks(const LinkParams& params) {
  default_link_ = params;
  for (auto& [ends, link] : links_) link.params = params;
}

void SimNetwork::Partition(const std::vector<std::string>& side) {
  partition_side_ = {side.begin(), side.end()};
  partitioned_ = true;
  Trace("t=" + std::to_string(NowMicros()) + " partition " + std::to_string(side.size()));
}

void SimNetwork::Heal() {
  partition_side_.clear();
  partitioned_ = false;
  Trace("t=" + std::to_string(NowMicros()) + " heal");
}

bool SimNetwork::Blocked(const std::string& a, const std::string& b) const {
  return partitioned_ && partition_side_.count(a) != partition_side_.count(b);
}

void SimNetwork::Kill(const std::string& name) {
  SimNode* n = node(name);
  CHECK(n != nullptr) << "Kill of unknown simulated node " << name;
  n->alive_ = false;
  ++n->epoch_;
  n->pending_.clear();  // the process is gone: its callbacks never run
  Trace("t=" + std::to_string(NowMicros()) + " kill " + name);
}

void SimNetwork::Restart(const std::string& name) {
  SimNode* n = node(name);
  CHECK(n != nullptr) << "Restart of unknown simulated node " << name;
  n->alive_ = true;
  Trace("t=" + std::to_string(NowMicros()) + " restart " + name);
}

void SimNetwork::Trace(const std::string& line) {
  if (trace_on_) trace_.push_back(line);
}

void SimNetwork::Schedule(int64_t delay_us, std::function<void()> fn) {
  CHECK_GE(delay_us, 0);
  events_.push(Event{NowMicros() + delay_us, next_seq_++, std::move(fn)});
}

bool SimNetwork::Step() {
  if (events_.empty()) return false;
  // Copy out before popping: the callback may push new events.
  Event e = std::move(const_cast<Event&>(events_.top()));
  events_.pop();
  if (e.time > NowMicros()) clock_.AdvanceMicros(e.time - NowMicros());
  e.fn();
  return true;
}

uint64_t SimNetwork::RunUntilIdle(uint64_t max_events) {
  uint64_t n = 0;
  while (n < max_events && Step()) ++n;
  return n;
}

bool SimNetwork::RunUntil(const std::function<bool()>& done, uint64_t max_events) {
  for (uint64_t n = 0; n < max_events; ++n) {
    if (done()) return true;
    if (!Step()) break;
  }
  return done();
}

void SimNetwork::RunFor(int64_t us) {
  int64_t end = NowMicros() + us;
  while (!events_.empty() && events_.top().time <= end) Step();
  if (end > NowMicros()) clock_.AdvanceMicros(end - NowMicros());
}

void SimNetwork::Transmit(SimNode* from, SimNode* to, size_t bytes, const std::string& what,
                          std::function<void()> arrive) {
  ++stats_.sent;
  std::string prefix = "t=" + std::to_string(NowMicros()) + " " + from->name_ + ">" + to->name_ +
                       " " + what + " " + std::to_string(bytes);
  if (Blocked(from->name_, to->name_)) {
    ++stats_.dropped_partition;
    Trace(prefix + " blocked");
    return;
  }
  LinkState& link = Link(from->name_, to->name_);
  const LinkParams& p = link.params;
  // Always draw both numbers so the random stream does not depend on the link settings' zeros.
  double loss_draw = rng_.UniformDouble();
  uint64_t jitter_draw = rng_.NextU64();
  if (loss_draw < p.loss) {
    ++stats_.dropped_loss;
    Trace(prefix + " lost");
    return;
  }
  int64_t start = std::max(NowMicros(), link.busy_until);
  int64_t tx_us = 0;
  if (p.bandwidth_bytes_per_sec > 0) {
    tx_us = static_cast<int64_t>(
        std::ceil(static_cast<double>(bytes + kMessageOverhead) * 1e6 / p.bandwidth_bytes_per_sec));
  }
  link.busy_until = start + tx_us;
  int64_t jitter = p.jitter_us > 0 ? static_cast<int64_t>(jitter_draw % (p.jitter_us + 1)) : 0;
  int64_t arrival = link.busy_until + p.latency_us + jitter;
  // Drawn for every message too, from their own stream (see dup_rng_).
  double dup_draw = dup_rng_.UniformDouble();
  uint64_t dup_delay_draw = dup_rng_.NextU64();
  Trace(prefix + " arrives t=" + std::to_string(arrival));
  Deliver(from, to, arrival, arrive);
  if (dup_draw < p.duplicate) {
    int64_t extra = static_cast<int64_t>(dup_delay_draw % (p.latency_us + p.jitter_us + 1));
    Trace(prefix + " duplicate arrives t=" + std::to_string(arrival + extra));
    Deliver(from, to, arrival + extra, [this, arrive] {
      ++stats_.duplicated;
      arrive();
    });
  }
}

void SimNetwork::Deliver(SimNode* from, SimNode* to, int64_t arrival,
                         std::function<void()> arrive) {
  uint64_t from_epoch = from->epoch_;
  uint64_t to_epoch = to->epoch_;
  events_.push(Event{arrival, next_seq_++,
                     [this, from, to, from_epoch, to_epoch, arrive = std::move(arrive)] {
                       if (from->epoch_ != from_epoch || to->epoch_ != to_epoch || !to->alive_) {
                         ++stats_.dropped_dead;
                         return;
                       }
                       if (Blocked(from->name_, to->name_)) {
                         ++stats_.dropped_partition;
                         return;
                       }
                       ++stats_.delivered;
                       arrive();
                     }});
}

void SimNetwork::SendFrom(SimNode* from, const std::string& to_name, Request request,
                          ResponseCallback done) {
  CHECK(from->alive_) << "simulated node " << from->name_ << " sends while killed";
  uint64_t rid = from->next_request_id_++;
  from->pending_.emplace(rid, std::move(done));
  uint64_t epoch = from->epoch_;

  // Completes request `rid` of `from` once, unless it already completed or `from` died.
  auto complete = [from, rid, epoch](Result<Bytes> r) -> bool {
    if (from->epoch_ != epoch) return false;
    auto it = from->pending_.find(rid);
    if (it == from->pending_.end()) return false;
    ResponseCallback cb = std::move(it->second);
    from->pending_.erase(it);
    cb(std::move(r));
    return true;
  };

  SimNode* to = node(to_name);
  Status bad = ValidateMethod(request.method);
  if (to == nullptr || !bad.ok()) {
    Status s = to == nullptr ? Unavailable("no simulated node '" + to_name + "'") : bad;
    Schedule(0, [complete, s] { complete(s); });
    return;
  }
  int64_t timeout_us = std::max<int64_t>(request.timeout_ms, 0) * 1000;
  std::string method = request.method;
  Schedule(timeout_us, [this, complete, to_name, method, timeout_ms = request.timeout_ms] {
    if (complete(DeadlineExceeded("peer " + to_name + ": no answer to " + method + " within " +
                                  std::to_string(timeout_ms) + " ms"))) {
      ++stats_.timeouts;
    }
  });

  size_t req_bytes = request.body.size() + request.method.size();
  auto shared_req = std::make_shared<Request>(std::move(request));
  Transmit(from, to, req_bytes, "req " + method, [this, from, to, shared_req, complete] {
    Result<Bytes> r = to->router_ == nullptr ? Result<Bytes>(NotFound("node serves no methods"))
                                             : to->router_->Dispatch(*shared_req);
    size_t resp_bytes = r.ok() ? r->size() : r.status().message().size();
    auto shared_resp = std::make_shared<Result<Bytes>>(std::move(r));
    Transmit(to, from, resp_bytes, "resp " + shared_req->method,
             [to, shared_req, shared_resp, complete] {
               Result<Bytes>& resp = *shared_resp;
               if (!resp.ok()) {
                 complete(resp.status().WithPrefix("peer " + to->name_));
               } else if (resp->size() > shared_req->max_response_bytes) {
                 complete(ResourceExhausted(
                     "peer " + to->name_ + ": response to " + shared_req->method + " of " +
                     std::to_string(resp->size()) + " bytes exceeds the limit of " +
                     std::to_string(shared_req->max_response_bytes)));
               } else {
                 complete(std::move(*shared_resp));
               }
             });
  });
}

}  // namespace meshlearn::net
