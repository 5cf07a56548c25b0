// SimNetwork: many nodes in one process on virtual time, FoundationDB style. One seeded Rng
// decides every random thing (jitter, loss), events run in (time, sequence) order, so the same
// seed and the same calls give the same deliveries at the same virtual times, every run.
//
// Model: each directed link has a latency, a uniform jitter, a bandwidth (messages on a link are
// serialized one after another), a loss probability and a duplication probability. Jitter
// reorders: a message drawn a long jitter arrives after one sent later on the same link. A
// duplicated message arrives twice (the copy up to latency + jitter later), so a request's
// handler may run twice and a response may come back twice (the caller sees the first). A partition
// blocks every pair of nodes on opposite sides. A killed node loses everything in flight to and
// from it, its outstanding requests never call back (the process is gone), and requests sent to it
// time out; Restart brings it back, serving the same Router. A handler runs when the request
// arrives and takes no virtual time. A lost request or response surfaces as DeadlineExceeded after
// Request::timeout_ms.
//
//   SimNetwork net(/*seed=*/42, LinkParams{.latency_us = 2000});
//   SimNode* a = net.AddNode("a");
//   SimNode* b = net.AddNode("b");
//   b->Serve(&router_b);
//   Result<Bytes> r = a->transport()->Send("b", Request{"echo", ...});   // runs the event loop
//   net.Partition({"a"});  net.Heal();  net.Kill("b");  net.Restart("b");
//
// Thread-safety: none. The network, its nodes and their transports are used from one thread, the
// one running the event loop (Step/Run*/WaitUntil/Send); callbacks run on it too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/net/transport.h"

namespace meshlearn::net {

struct LinkParams {
  int64_t latency_us = 1000;
  int64_t jitter_us = 0;                   // extra delay, uniform in [0, jitter_us]
  double bandwidth_bytes_per_sec = 125e6;  // 1 Gbit/s; <= 0 means unlimited
  double loss = 0.0;                       // probability that one message is dropped
  double duplicate = 0.0;                  // probability that one message is delivered twice
};

struct SimStats {
  uint64_t sent = 0;
  uint64_t delivered = 0;
  uint64_t dropped_loss = 0;
  uint64_t dropped_partition = 0;
  uint64_t dropped_dead = 0;
  uint64_t timeouts = 0;
  uint64_t duplicated = 0;  // extra copies delivered (counted in `delivered` too)
};

class SimNetwork;

class SimNode {
 public:
  const std::string& name() const { return name_; }
  // Requests sent through it come from this node. Owned by the node.
  Transport* transport() { return transport_.get(); }
  // Serves `router` (nullptr: serve nothing; requests then fail NotFound). `router` must outlive
  // the node or be replaced first.
  void Serve(const Router* router) { router_ = router; }
  bool alive() const { return alive_; }

 private:
  friend class SimNetwork;
  class NodeTransport;
  SimNode(SimNetwork* net, std::string name);

  SimNetwork* net_;
  std::string name_;
  std::unique_ptr<Transport> transport_;
  const Router* router_ = nullptr;
  bool alive_ = true;
  uint64_t epoch_ = 0;  // bumped by Kill: events of an older epoch are void
  uint64_t next_request_id_ = 1;
  std::map<uint64_t, ResponseCallback> pending_;
};

class SimNetwork {
 public:
  explicit SimNetwork(uint64_t seed, LinkParams default_link = {});
  ~SimNetwork();
  SimNetwork(const SimNetwork&) = delete;
  SimNetwork& operator=(const SimNetwork&) = delete;

  uint64_t seed() const { return seed_; }

  // REQUIRES: `name` is new and a valid endpoint (non-empty, no whitespace).
  SimNode* AddNode(const std::string& name);
  // nullptr if there is no such node.
  SimNode* node(const std::string& name);

  // Sets the link parameters of a -> b and b -> a.
  void SetLink(const std::string& a, const std::string& b, const LinkParams& params);
  // Sets the parameters of every link, those used so far and those not yet (a chaos workload
  // turning delay, loss or duplication on and off for the whole network).
  void SetAllLinks(const LinkParams& params);
  // Blocks every pair of nodes with one in `side` and the other not (nodes added later are on
  // the other side). Replaces any earlier partition.
  void Partition(const std::vector<std::string>& side);
  void Heal();
  // REQUIRES: the node exists.
  void Kill(const std::string& name);
  void Restart(const std::string& name);

  // Virtual time. The clock only moves when events run.
  const Clock* clock() const { return &clock_; }
  int64_t NowMicros() const { return clock_.MonotonicMicros(); }
  // Runs `fn` on the event loop `delay_us` from now.
  void Schedule(int64_t delay_us, std::function<void()> fn);

  // Runs the next event; false if there are none.
  bool Step();
  // Runs events until none is left or `max_events` ran. Returns the number run.
  uint64_t RunUntilIdle(uint64_t max_events = 100'000'000);
  // Runs events until done() (checked before each) or no events are left. Returns done().
  bool RunUntil(const std::function<bool()>& done, uint64_t max_events = 100'000'000);
  // Runs every event due within the next `us` microseconds, then sets the clock to that time.
  void RunFor(int64_t us);

  // One line per send, delivery and drop ("t=1234 a>b req blob.chunk 1090 delivered"), if enabled.
  void EnableTrace(bool on) { trace_on_ = on; }
  const std::vector<std::string>& trace() const { return trace_; }
  const SimStats& stats() const { return stats_; }

 private:
  friend class SimNode::NodeTransport;
  struct Event {
    int64_t time;
    uint64_t seq;
    std::function<void()> fn;
  };
  struct EventLater {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  struct LinkState {
    LinkParams params;
    int64_t busy_until = 0;
  };

  void SendFrom(SimNode* from, const std::string& to, Request request, ResponseCallback done);
  // Carries `bytes` from -> to; runs `arrive` on arrival unless the message is lost, blocked or
  // either end died (epochs changed) meanwhile.
  void Transmit(SimNode* from, SimNode* to, size_t bytes, const std::string& what,
                std::function<void()> arrive);
  // Runs `arrive` at `arrival` unless either end died (epochs changed) or a partition blocks the
  // pair by then.
  void Deliver(SimNode* from, SimNode* to, int64_t arrival, std::function<void()> arrive);
  bool Blocked(const std::string& a, const std::string& b) const;
  LinkState& Link(const std::string& a, const std::string& b);
  void Trace(const std::string& line);

  const uint64_t seed_;
  Rng rng_;
  // Duplication draws have their own stream, so turning duplication on does not move the loss
  // and jitter draws of a seed.
  Rng dup_rng_;
  LinkParams default_link_;
  FakeClock clock_;
  uint64_t next_seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  std::map<std::string, std::unique_ptr<SimNode>> nodes_;
  std::map<std::pair<std::string, std::string>, LinkState> links_;
  std::set<std::string> partition_side_;
  bool partitioned_ = false;
  bool trace_on_ = false;
  std::vector<std::string> trace_;
  SimStats stats_;
};

}  // namespace meshlearn::net
