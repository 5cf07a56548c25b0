// The gate in front of the nodes' HTTP server (HttpServer), over loopback: slow peers and
// pipelined requests. The ledger's RPC server has the same tests against its limits
// (ledger/src/rpc_http_test.cc, RpcHttpHostile).
#include "meshlearn/net/http_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/net/http_transport.h"

namespace meshlearn::net {
namespace {

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};  // no read in these tests waits longer
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// Peers that never finish their headers held one of cpp-httplib's threads each, for as long as
// they kept sending; with more of them than threads, nobody else was served.
TEST(HttpGateTest, SlowPeersDoNotBlockTheServer) {
  Router router;
  router.Register(
      "echo", [](const Request& r) -> Result<Bytes> { return r.body; }, 1000);
  HttpServer server(&router, {.threads = 4, .head_timeout_ms = 120'000});
  Result<uint16_t> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    int fd = Connect(*port);
    ASSERT_GE(fd, 0);
    SendAll(fd, "POST /ml/v1/echo HTTP/1.1\r\nHost: x\r\n");
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int line = 0; !done.load(); ++line) {
      for (int fd : slow) SendAll(fd, "X-Slow-" + std::to_string(line) + ": 1\r\n");
      for (int i = 0; i < 10 && !done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  HttpTransport client;
  Result<Bytes> r = client.Send(server.endpoint(),
                                Request{.method = "echo", .body = ToBytes("hello"),
                                        .timeout_ms = 20'000});
  done = true;
  trickle.join();
  for (int fd : slow) close(fd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(AsStringView(*r), "hello");
  server.Stop();
}

// Requests written back to back on one connection are all answered, in order (cpp-httplib
// dropped what it had read past the first).
TEST(HttpGateTest, PipelinedRequestsAreAnsweredInOrder) {
  HttpGate gate({.workers = 2});
  gate.server().Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.body, "text/plain");
  });
  Result<int> port = gate.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  int fd = Connect(*port);
  ASSERT_GE(fd, 0);
  std::string all;
  for (int i = 0; i < 4; ++i) {
    std::string body = "request " + std::to_string(i);
    all += "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  }
  SendAll(fd, all);
  std::string got;
  char buf[4096];
  while (got.find("request 3") == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    size_t next = got.find("request " + std::to_string(i), at);
    ASSERT_NE(next, std::string::npos) << "answer " << i << " missing in:\n" << got;
    at = next;
  }
  gate.Stop();
}

}  // namespace
}  // namespace meshlearn::net
