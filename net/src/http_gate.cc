#include "meshlearn/net/http_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "meshlearn/base/check.h"
#include "meshlearn/base/log.h"

namespace meshlearn::net {
namespace {

// What a refused connection may still send us (read and dropped) before it is closed.
constexpr int64_t kDrainMs = 2'000;
constexpr size_t kDrainMaxBytes = 64 << 20;
// Bytes read from one connection per wake-up, so one fast sender does not starve the others.
constexpr size_t kReadPerWake = 1 << 20;
// A body at least this large is followed by malloc_trim: glibc keeps freed memory otherwise.
constexpr size_t kTrimAfterBytes = 1 << 20;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void AddressOf(const sockaddr_storage& ss, std::string* ip, int* port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    *port = ntohs(a->sin6_port);
  }
  *ip = text;
}

const char* Reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Writes what fits now (a refusal is small; the socket buffer takes it).
void SendNow(int fd, const std::string& bytes) {
  (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

// Named (not anonymous) because HttpGate::Impl, which has external linkage, holds Conns.
namespace http_gate_internal {

// A connection between requests, receiving one, or being handled by a worker. The gate thread
// owns it while it waits for bytes; a worker while it handles its request.
struct Conn {
  enum class Phase { kIdle, kHead, kBody, kDrain };
  int fd = -1;
  std::string remote_ip;
  int remote_port = 0;
  std::string local_ip;
  int local_port = 0;
  std::string buf;  // bytes received and not yet consumed by a handled request
  size_t pos = 0;   // a worker's read position in buf (0 while the gate owns it)
  Phase phase = Phase::kIdle;
  int64_t deadline_ms = 0;
  size_t head_len = 0;
  size_t head_scanned = 0;  // bytes of buf already searched for the head's end
  size_t body_len = 0;
  size_t reserved = 0;  // body budget held
  size_t drained = 0;
};

}  // namespace http_gate_internal

namespace {

using http_gate_internal::Conn;

// cpp-httplib's view of one buffered request: reads stop at the request's end, so what follows
// (a pipelined request) stays for the next one; writes go to the socket within one deadline.
class GateStream : public httplib::Stream {
 public:
  GateStream(Conn& conn, size_t end, int64_t write_timeout_ms)
      : conn_(conn), end_(end), write_timeout_ms_(write_timeout_ms) {}

  bool is_readable() const override { return conn_.pos < end_; }
  bool is_writable() const override { return WaitWritable(); }

  ssize_t read(char* ptr, size_t size) override {
    size_t n = std::min(size, end_ - conn_.pos);
    std::memcpy(ptr, conn_.buf.data() + conn_.pos, n);
    conn_.pos += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      ssize_t n = send(conn_.fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!WaitWritable()) return -1;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = conn_.remote_ip;
    port = conn_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = conn_.local_ip;
    port = conn_.local_port;
  }
  socket_t socket() const override { return conn_.fd; }

 private:
  // The write deadline starts at the first write: a long-poll's wait is the handler's, not this.
  bool WaitWritable() const {
    int64_t now = NowMs();
    if (write_deadline_ms_ == 0) write_deadline_ms_ = now + write_timeout_ms_;
    for (;;) {
      int64_t left = write_deadline_ms_ - now;
      if (left <= 0) return false;
      pollfd p{conn_.fd, POLLOUT, 0};
      int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r > 0) return (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
      if (r < 0 && errno != EINTR) return false;
      now = NowMs();
    }
  }

  Conn& conn_;
  size_t end_;
  int64_t write_timeout_ms_;
  mutable int64_t write_deadline_ms_ = 0;
};

// Runs what httplib's accept loop hands it at once, on the accept thread: our
// process_and_close_socket only passes the socket on to the gate.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

class HttpGate::Impl {
 public:
  explicit Impl(HttpGateOptions options) : opts_(std::move(options)), server_(this) {
    opts_.workers = std::max(1, opts_.workers);
    server_.new_task_queue = [] { return new InlineQueue(); };
    server_.set_payload_max_length(opts_.max_body_bytes);
    server_.set_keep_alive_timeout(std::max<time_t>(1, opts_.idle_timeout_ms / 1000));
    server_.set_tcp_nodelay(true);
    // httplib's default also sets SO_REUSEPORT, which would let a second server bind the same
    // port and take half the requests; a port in use must be an error instead.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes),
                 sizeof(yes));
    });
  }

  ~Impl() { Stop(); }

  httplib::Server& server() { return server_; }

  Result<int> Start(const std::string& host, int port) {
    CHECK(!started_) << "HttpGate::Start called twice";
    int bound = port == 0 ? server_.bind_to_any_port(host)
                          : (server_.bind_to_port(host, port) ? port : -1);
    if (bound <= 0) {
      return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                         " (in use, or not a local address?)");
    }
    server_.RaiseBacklog();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK(wake_fd_ >= 0) << "eventfd: " << std::strerror(errno);
    started_ = true;
    gate_thread_ = std::thread([this] { GateLoop(); });
    for (int i = 0; i < opts_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
    listen_done_ = false;
    listen_thread_ = std::thread([this] {
      server_.listen_after_bind();
      listen_done_ = true;
    });
    // httplib's stop() is a no-op until its accept loop runs; wait for it so that a Stop() right
    // after Start() cannot leave the thread listening forever.
    while (!server_.is_running() && !listen_done_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return bound;
  }

  void Stop() {
    if (!started_) return;
    started_ = false;
    server_.stop();
    if (listen_thread_.joinable()) listen_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    Wake();
    ready_cv_.notify_all();
    if (gate_thread_.joinable()) gate_thread_.join();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    for (auto& c : incoming_) Close(std::move(c));
    for (auto& c : ready_) Close(std::move(c));
    incoming_.clear();
    ready_.clear();
    close(wake_fd_);
    wake_fd_ = -1;
  }

  HttpGateStats stats() const {
    HttpGateStats s;
    s.connections = connections_.load();
    {
      std::lock_guard<std::mutex> lock(budget_mu_);
      s.body_bytes_in_flight = in_flight_;
      s.peak_body_bytes_in_flight = peak_in_flight_;
    }
    s.requests = requests_.load();
    s.refused_too_large = refused_too_large_.load();
    s.refused_busy = refused_busy_.load();
    s.timed_out = timed_out_.load();
    return s;
  }

  // On httplib's accept thread.
  void Accept(int fd) {
    if (connections_.load() >= opts_.max_connections) {
      ++refused_busy_;
      SendNow(fd, Refusal(503, "the server has " + std::to_string(opts_.max_connections) +
                                   " connections open, its limit; retry in a second"));
      shutdown(fd, SHUT_RDWR);
      close(fd);
      return;
    }
    int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      AddressOf(ss, &c->remote_ip, &c->remote_port);
    }
    len = sizeof(ss);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      AddressOf(ss, &c->local_ip, &c->local_port);
    }
    c->deadline_ms = NowMs() + opts_.idle_timeout_ms;
    ++connections_;
    ToGate(std::move(c));
  }

 private:
  class Server : public httplib::Server {
   public:
    explicit Server(Impl* impl) : impl_(impl) {}
    bool Process(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
      return process_request(strm, close_connection, connection_closed, nullptr);
    }
    // cpp-httplib listens with a backlog of 5: a burst of connections (many clients at once,
    // or a flood) overflows it and the kernel drops SYNs, which clients retry only after 1 s,
    // 3 s, ... Listening again on a bound socket raises the backlog.
    void RaiseBacklog() { ::listen(svr_sock_, SOMAXCONN); }

   private:
    bool process_and_close_socket(socket_t sock) override {
      impl_->Accept(sock);
      return true;
    }
    Impl* impl_;
  };

  enum class Next { kWait, kDispatch, kClose };

  void Wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
  }

  // A new connection, or one a worker has answered and that stays open.
  void ToGate(std::unique_ptr<Conn> c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        incoming_.push_back(std::move(c));
      }
    }
    if (c) {
      Close(std::move(c));
      return;
    }
    Wake();
  }

  void Close(std::unique_ptr<Conn> c) {
    if (!c) return;
    Release(c->reserved);
    close(c->fd);
    --connections_;
  }

  bool Reserve(size_t bytes) {
    std::lock_guard<std::mutex> lock(budget_mu_);
    size_t limit = opts_.body_budget_bytes;
    if (bytes > opts_.small_body_bytes) {
      limit = limit > opts_.small_reserve_bytes ? limit - opts_.small_reserve_bytes : 0;
    }
    // Alone, any body within max_body_bytes is admitted (the budget is at least that large):
    // a refusal must mean "busy, retry", never "never".
    if (in_flight_ != 0 && in_flight_ + bytes > limit) return false;
    in_flight_ += bytes;
    peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
    return true;
  }

  void Release(size_t& bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(budget_mu_);
    in_flight_ -= bytes;
    bytes = 0;
  }

  std::string Refusal(int status, const std::string& message) const {
    std::string body = opts_.refusal_body ? opts_.refusal_body(status, message) : message + "\n";
    std::string r = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
    r += "Content-Type: " + opts_.refusal_content_type + "\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    r += "Connection: close\r\n";
    if (status == 503) r += "Retry-After: 1\r\n";
    r += "\r\n";
    return r + body;
  }

  // Answers `status` and closes: the reply is written, our side shut, and what the client still
  // sends is read and dropped for a while so that it reads the reply rather than a reset.
  Next Refuse(Conn& c, int status, const std::string& message, int64_t now) {
    Release(c.reserved);
    // Counted before the answer is sent: a client that has read it sees it counted (a test that
    // reads the answer, then the counter, raced the increment when it came after the send).
    if (status == 413) ++refused_too_large_;
    if (status == 503) ++refused_busy_;
    if (status == 408) ++timed_out_;
    SendNow(c.fd, Refusal(status, message));
    shutdown(c.fd, SHUT_WR);
    c.phase = Conn::Phase::kDrain;
    c.deadline_ms = now + kDrainMs;
    std::string().swap(c.buf);
    return Next::kWait;
  }

  // Parses the head (buf[0, head_len)) for what the gate needs: the body's length, and whether
  // the client waits for "100 Continue". Refuses what it cannot bound.
  Next StartBody(Conn& c, int64_t now) {
    std::string_view head(c.buf.data(), c.head_len);
    size_t line_start = head.find("\r\n") + 2;  // skip the request line
    bool has_length = false;
    uint64_t length = 0;
    bool too_large = false;
    size_t expect_begin = std::string::npos, expect_end = 0;
    while (line_start < head.size()) {
      size_t line_end = head.find("\r\n", line_start);
      if (line_end == std::string::npos || line_end == line_start) break;
      std::string_view line = head.substr(line_start, line_end - line_start);
      size_t colon = line.find(':');
      if (colon != std::string_view::npos) {
        std::string_view name = Trim(line.substr(0, colon));
        std::string_view value = Trim(line.substr(colon + 1));
        if (EqualsIgnoreCase(name, "Content-Length")) {
          uint64_t v = 0;
          auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
          bool digits = !value.empty() && end == value.data() + value.size();
          if (ec == std::errc::result_out_of_range) {
            too_large = true;
          } else if (ec != std::errc() || !digits) {
            return Refuse(c, 400, "Content-Length '" + std::string(value.substr(0, 40)) +
                                      "' is not a number", now);
          } else if (has_length && v != length) {
            return Refuse(c, 400, "two different Content-Length headers", now);
          }
          has_length = true;
          length = v;
        } else if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
          return Refuse(c, 411, "send the body with a Content-Length, not chunked", now);
        } else if (EqualsIgnoreCase(name, "Expect") && EqualsIgnoreCase(value, "100-continue")) {
          expect_begin = line_start;
          expect_end = line_end + 2;
        }
      }
      line_start = line_end + 2;
    }
    if (too_large || length > opts_.max_body_bytes) {
      return Refuse(c, 413,
                    "request body is larger than the server's limit of " +
                        std::to_string(opts_.max_body_bytes) + " bytes; send less per request",
                    now);
    }
    if (length > 0 && !Reserve(length)) {
      return Refuse(c, 503,
                    "the server is receiving " + std::to_string(opts_.body_budget_bytes >> 20) +
                        " MiB of request bodies, its limit; retry in a second",
                    now);
    }
    c.reserved = length;
    c.body_len = length;
    if (expect_begin != std::string::npos) {
      // We answer it here; cpp-httplib must not answer it again after the body.
      c.buf.erase(expect_begin, expect_end - expect_begin);
      c.head_len -= expect_end - expect_begin;
      if (c.buf.size() < c.head_len + c.body_len) SendNow(c.fd, "HTTP/1.1 100 Continue\r\n\r\n");
    }
    c.buf.reserve(c.head_len + c.body_len);
    c.phase = Conn::Phase::kBody;
    c.deadline_ms = now + opts_.body_timeout_ms +
                    static_cast<int64_t>(length * 1000 /
                                         std::max<size_t>(1, opts_.min_body_bytes_per_s));
    return Next::kWait;
  }

  // Moves a connection on with the bytes it has: a complete request is dispatched.
  Next Advance(Conn& c, int64_t now) {
    if (c.phase == Conn::Phase::kDrain) return Next::kWait;
    if (c.phase == Conn::Phase::kIdle) {
      if (c.buf.empty()) return Next::kWait;
      c.phase = Conn::Phase::kHead;
      c.deadline_ms = now + opts_.head_timeout_ms;
      c.head_scanned = 0;
    }
    if (c.phase == Conn::Phase::kHead) {
      // Search only what arrived since the last look (a head trickled byte by byte costs linear,
      // not quadratic, time on this one thread).
      size_t end = c.buf.find("\r\n\r\n", c.head_scanned > 3 ? c.head_scanned - 3 : 0);
      c.head_scanned = c.buf.size();
      if (end == std::string::npos || end + 4 > opts_.max_head_bytes) {
        if (c.buf.size() >= opts_.max_head_bytes) {
          return Refuse(c, 431,
                        "request line and headers exceed " +
                            std::to_string(opts_.max_head_bytes) + " bytes",
                        now);
        }
        return Next::kWait;
      }
      c.head_len = end + 4;
      if (Next n = StartBody(c, now); c.phase != Conn::Phase::kBody) return n;
    }
    return c.buf.size() >= c.head_len + c.body_len ? Next::kDispatch : Next::kWait;
  }

  size_t Want(const Conn& c) const {
    switch (c.phase) {
      case Conn::Phase::kIdle:
      case Conn::Phase::kHead:
        return c.buf.size() < opts_.max_head_bytes ? opts_.max_head_bytes - c.buf.size() : 0;
      case Conn::Phase::kBody: {
        size_t total = c.head_len + c.body_len;
        return c.buf.size() < total ? total - c.buf.size() : 0;
      }
      case Conn::Phase::kDrain: return 0;
    }
    return 0;
  }

  Next OnReadable(Conn& c, std::vector<char>& scratch, int64_t now) {
    size_t read_now = 0;
    for (;;) {
      bool drain = c.phase == Conn::Phase::kDrain;
      size_t want = drain ? scratch.size() : std::min(Want(c), scratch.size());
      if (want == 0 || read_now >= kReadPerWake) break;
      ssize_t n = recv(c.fd, scratch.data(), want, 0);
      if (n > 0) {
        read_now += static_cast<size_t>(n);
        if (drain) {
          c.drained += static_cast<size_t>(n);
          if (c.drained > kDrainMaxBytes) return Next::kClose;
          continue;
        }
        c.buf.append(scratch.data(), static_cast<size_t>(n));
        Next next = Advance(c, now);
        if (next != Next::kWait) return next;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return Next::kClose;  // closed by the client, or an error
    }
    return Next::kWait;
  }

  Next OnDeadline(Conn& c, int64_t now) {
    switch (c.phase) {
      case Conn::Phase::kIdle:
      case Conn::Phase::kDrain: return Next::kClose;
      case Conn::Phase::kHead:
        return Refuse(c, 408,
                      "the request's headers did not arrive within " +
                          std::to_string(opts_.head_timeout_ms) + " ms",
                      now);
      case Conn::Phase::kBody:
        return Refuse(c, 408,
                      "the request's body of " + std::to_string(c.body_len) +
                          " bytes did not arrive in time",
                      now);
    }
    return Next::kClose;
  }

  void GateLoop() {
    std::vector<std::unique_ptr<Conn>> conns;
    std::vector<pollfd> fds;
    std::vector<char> scratch(64 << 10);
    for (;;) {
      std::deque<std::unique_ptr<Conn>> arrived;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
        arrived.swap(incoming_);
      }
      int64_t now = NowMs();
      for (auto& c : arrived) {
        Next next = Advance(*c, now);  // a returned connection may hold a pipelined request
        if (next == Next::kDispatch) {
          Dispatch(std::move(c));
        } else if (next == Next::kClose) {
          Close(std::move(c));
        } else {
          conns.push_back(std::move(c));
        }
      }

      fds.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      int64_t next_deadline = now + 1000;
      for (const auto& c : conns) {
        fds.push_back({c->fd, POLLIN, 0});
        next_deadline = std::min(next_deadline, c->deadline_ms);
      }
      int r = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, next_deadline - now)));
      if (r < 0 && errno != EINTR) {
        ML_LOG_ERROR("http gate: poll: {}", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
      }
      now = NowMs();
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = *conns[i];
        Next next = Next::kWait;
        if (r > 0 && fds[i + 1].revents != 0) next = OnReadable(c, scratch, now);
        if (next == Next::kWait && c.deadline_ms <= now) next = OnDeadline(c, now);
        if (next == Next::kDispatch) {
          Dispatch(std::move(conns[i]));
        } else if (next == Next::kClose) {
          Close(std::move(conns[i]));
        }
      }
      std::erase_if(conns, [](const std::unique_ptr<Conn>& c) { return c == nullptr; });
    }
    for (auto& c : conns) Close(std::move(c));
  }

  void Dispatch(std::unique_ptr<Conn> c) {
    ++requests_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(c));
    }
    ready_cv_.notify_one();
  }

  void WorkerLoop() {
    for (;;) {
      std::unique_ptr<Conn> c;
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
        if (ready_.empty()) return;
        c = std::move(ready_.front());
        ready_.pop_front();
        stopping = stopping_;
      }
      const size_t end = c->head_len + c->body_len;
      const bool large = c->reserved >= kTrimAfterBytes;
      bool closed = false;
      bool ok = false;
      {
        GateStream strm(*c, end, opts_.write_timeout_ms);
        ok = server_.Process(strm, /*close_connection=*/stopping, closed);
      }
      Release(c->reserved);
      c->buf.erase(0, end);
      c->pos = 0;
      if (c->buf.capacity() > 2 * opts_.max_head_bytes) c->buf.shrink_to_fit();
      if (large) malloc_trim(0);
      if (!ok || closed || stopping) {
        Close(std::move(c));
        continue;
      }
      c->phase = Conn::Phase::kIdle;
      c->head_len = c->body_len = 0;
      c->deadline_ms = NowMs() + opts_.idle_timeout_ms;
      ToGate(std::move(c));
    }
  }

  HttpGateOptions opts_;
  Server server_;
  bool started_ = false;
  std::atomic<bool> listen_done_{false};
  std::thread listen_thread_;
  std::thread gate_thread_;
  std::vector<std::thread> workers_;
  int wake_fd_ = -1;

  std::mutex mu_;  // guards incoming_, ready_, stopping_
  std::condition_variable ready_cv_;
  std::deque<std::unique_ptr<Conn>> incoming_;
  std::deque<std::unique_ptr<Conn>> ready_;
  bool stopping_ = false;

  mutable std::mutex budget_mu_;
  size_t in_flight_ = 0;
  size_t peak_in_flight_ = 0;

  std::atomic<size_t> connections_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> refused_too_large_{0};
  std::atomic<uint64_t> refused_busy_{0};
  std::atomic<uint64_t> timed_out_{0};
};

HttpGate::HttpGate(HttpGateOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HttpGate::~HttpGate() = default;
httplib::Server& HttpGate::server() { return impl_->server(); }
Result<int> HttpGate::Start(const std::string& host, int port) { return impl_->Start(host, port); }
void HttpGate::Stop() { impl_->Stop(); }
HttpGateStats HttpGate::stats() const { return impl_->stats(); }

}  // namespace meshlearn::net
