// The real HTTP server and client over loopback (127.0.0.1, ephemeral ports).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/blob.h"
#include "meshlearn/ledger/dashboard.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/rpc_server.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;
using testing::TestLedger;

// A raw client socket, for what a well-behaved client never does (slow headers, pipelining,
// absurd lengths). Every read waits at most `read_timeout_s`, so a test cannot hang.
class RawSocket {
 public:
  explicit RawSocket(int port, int read_timeout_s = 10) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{read_timeout_s, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawSocket() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(std::string_view bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `n` complete responses (by Content-Length) arrived, the peer closed, or a read
  // timed out. Returns the responses' status lines and bodies.
  std::vector<std::pair<std::string, std::string>> ReadResponses(size_t n) {
    std::vector<std::pair<std::string, std::string>> out;
    while (out.size() < n) {
      size_t head_end = buf_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        std::string head = buf_.substr(0, head_end);
        size_t length = 0;
        size_t cl = head.find("Content-Length: ");
        if (cl != std::string::npos) length = std::stoul(head.substr(cl + 16));
        if (buf_.size() >= head_end + 4 + length) {
          out.emplace_back(head.substr(0, head.find("\r\n")), buf_.substr(head_end + 4, length));
          buf_.erase(0, head_end + 4 + length);
          continue;
        }
      }
      char chunk[65536];
      ssize_t got = recv(fd_, chunk, sizeof(chunk), 0);
      if (got <= 0) break;
      buf_.append(chunk, static_cast<size_t>(got));
    }
    return out;
  }
  // True when an answer (or a close) is already waiting to be read.
  bool HasData() {
    char c;
    return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0;
  }
  // True when the server closed the connection (EOF or reset) within the read timeout.
  bool ClosedByServer() {
    char c[4096];
    for (;;) {
      ssize_t got = recv(fd_, c, sizeof(c), 0);
      if (got == 0) return true;
      if (got < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

std::string PostHead(size_t content_length) {
  return "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(content_length) + "\r\n\r\n";
}

std::string PostRequest(const std::string& body) { return PostHead(body.size()) + body; }


TEST(RpcHttp, StatusSendAndWaitOverLoopback) {
  TestLedger t(/*block_interval_ms=*/10);
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_GT(server.port(), 0);
  t.sequencer->Start();

  RpcClient rpc(server.url());
  Result<json> st = rpc.Call("chain_status", json::object());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ((*st)["chain_id"], TestLedger::kChainId);

  Result<std::string> chain_id = FetchChainId(rpc);
  ASSERT_TRUE(chain_id.ok());
  Result<uint64_t> nonce = FetchNextNonce(rpc, t.alice.public_key());
  ASSERT_TRUE(nonce.ok());
  Transaction tx = BuildSignedTx(t.alice, *chain_id, *nonce,
                                 TransferTx{.to = t.bob.public_key(), .amount = 42, .memo = "hi"});
  Result<json> done = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["status"], "included");
  EXPECT_EQ((*done)["receipt"]["ok"], true);
  // Sending it again after it was acknowledged: same receipt, paid once.
  Result<json> again = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["receipt"], (*done)["receipt"]);
  EXPECT_EQ(t.Balance(t.bob), TestLedger::kFunds + 42);

  // A refused transaction comes back as the ledger's Status.
  Transaction stale = BuildSignedTx(t.alice, *chain_id, 0,
                                    TransferTx{.to = t.bob.public_key(), .amount = 1, .memo = ""});
  Result<json> refused = SendTxAndWait(rpc, stale, 60000);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();

  t.sequencer->Stop();
  server.Stop();
}

TEST(RpcHttp, LongPollWakesOnNewBlock) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url());
  Result<json> r = Unavailable("not run");
  std::thread waiter([&] { r = rpc.Call("wait_block", {{"after", 0}, {"timeout_ms", 30000}}); });
  // Produce only once the waiter is parked (or has already returned, which the test catches).
  while (t.Call("chain_status")["result"]["height"] == 0 && t.sequencer->mempool_size() == 0) {
    ASSERT_TRUE(t.sequencer->ProduceOnce().ok());
  }
  waiter.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["timed_out"], false);
  EXPECT_GE((*r)["height"].get<uint64_t>(), 1u);
  server.Stop();
}

TEST(RpcHttp, StopWakesParkedLongPolls) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url(), {.retries = 0});
  Result<json> r = Unavailable("not run");
  std::thread waiter([&] { r = rpc.Call("wait_block", {{"after", 100}, {"timeout_ms", 30000}}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it park (not required)
  server.Stop();
  waiter.join();  // returns instead of hanging for 30 s
  SUCCEED();
}

// The largest transaction a node sends (a RefereeStep or ProveResult with a witness near
// kMaxWitnessBytes) goes through a server with default options: sent as hex, included in a block
// (here refused by execution: there is no such task, a receipt like any other).
TEST(RpcHttp, TheLargestTransactionFitsTheDefaultLimits) {
  TestLedger t(/*block_interval_ms=*/10);
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  t.sequencer->Start();
  RpcClient rpc(server.url());
  Bytes witness(kMaxWitnessBytes - 64, 0);
  for (size_t i = 0; i < witness.size(); ++i) witness[i] = static_cast<uint8_t>(i * 131);
  Transaction tx = BuildSignedTx(t.alice, TestLedger::kChainId, 0,
                                 ProveResultTx{.task_id = Blake2b("no such task"), .index = 0,
                                               .node_id = t.alice.public_key(),
                                               .witness = {std::move(witness)}});
  EXPECT_GT(EncodeTx(tx).size(), kMaxWitnessBytes);
  Result<json> done = SendTxAndWait(rpc, tx, 60000);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["status"], "included");
  EXPECT_EQ((*done)["receipt"]["ok"], false);
  t.sequencer->Stop();
  server.Stop();
}

TEST(RpcHttp, OversizeBodyGets413WithJsonRpcError) {
  TestLedger t;
  RpcServer server(t.rpc.get(), {.max_body_bytes = 1024});
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url());
  Result<std::pair<int, std::string>> r = rpc.PostRaw(std::string(4096, ' '));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->first, 413);
  json j = json::parse(r->second);
  EXPECT_EQ(j["error"]["code"], kRpcLimitExceeded);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("1024"), std::string::npos);
  server.Stop();
}

TEST(RpcHttp, RateLimitPerClient) {
  TestLedger t;
  RpcServerOptions opts;
  opts.rate_limit = {.rate_per_second = 0.001, .burst = 2, .max_clients = 10};
  RpcServer server(t.rpc.get(), opts);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RpcClient rpc(server.url(), {.retries = 0});
  std::string body = testing::Request("chain_status").dump();
  EXPECT_EQ(rpc.PostRaw(body)->first, 200);
  EXPECT_EQ(rpc.PostRaw(body)->first, 200);
  Result<std::pair<int, std::string>> limited = rpc.PostRaw(body);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->first, 429);
  EXPECT_EQ(json::parse(limited->second)["error"]["code"], kRpcLimitExceeded);
  Result<json> call = rpc.Call("chain_status", json::object());
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().code(), StatusCode::kResourceExhausted);
  server.Stop();
}

TEST(RpcHttp, WrongPathAndUnreachableServer) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client raw("127.0.0.1", server.port());
  httplib::Result r = raw.Post("/nowhere", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("POST JSON-RPC requests to /"), std::string::npos) << r->body;
  int port = server.port();
  server.Stop();

  RpcClient gone("http://127.0.0.1:" + std::to_string(port),
                 {.connect_timeout_ms = 500, .retries = 1, .retry_backoff_ms = 1});
  Result<json> st = gone.Call("chain_status", json::object());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(st.status().message().find("chain serve"), std::string::npos);
}

TEST(RpcHttp, PortInUseIsAClearError) {
  TestLedger t;
  RpcServer a(t.rpc.get());
  ASSERT_TRUE(a.Start("127.0.0.1", 0).ok());
  RpcServer b(t.rpc.get());
  Status s = b.Start("127.0.0.1", a.port());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--listen"), std::string::npos);
  a.Stop();
}


// Hostile input: 80 clients that each send one header line after another, never finishing their
// headers, held every server thread (64) with cpp-httplib's per-read timeout; nobody else was
// answered while they lasted. Now a connection holds no thread until its request has arrived.
TEST(RpcHttpHostile, SlowHeaderClientsDoNotFreezeTheServer) {
  TestLedger t;
  RpcServerOptions opts;
  opts.head_timeout_ms = 120'000;  // the slow clients stay connected for the whole test
  opts.rate_limit.rate_per_second = 1e6;
  opts.rate_limit.burst = 1e6;
  RpcServer server(t.rpc.get(), opts);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  constexpr int kSlow = 80;
  std::vector<std::unique_ptr<RawSocket>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawSocket>(server.port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("POST / HTTP/1.1\r\nHost: x\r\n"));
  }
  // They keep trickling header lines until the fresh client has its answer.
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int line = 0; !done.load(); ++line) {
      for (auto& s : slow) s->Send("X-Slow-" + std::to_string(line) + ": 1\r\n");
      for (int i = 0; i < 10 && !done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  RpcClient fresh(server.url(), {.connect_timeout_ms = 10'000, .read_timeout_ms = 20'000,
                                 .retries = 0});
  Result<json> st = fresh.Call("chain_status", json::object());
  const size_t connections = server.gate_stats().connections;
  done = true;
  trickle.join();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ((*st)["chain_id"], TestLedger::kChainId);
  EXPECT_GE(connections, static_cast<size_t>(kSlow));  // they were all still connected
  server.Stop();
}

// Header time is bounded per request in total, not per read: a client that keeps sending
// header lines is answered 408 and closed once head_timeout_ms has passed.
TEST(RpcHttpHostile, HeadersThatNeverEndAreCutOffByATotalDeadline) {
  TestLedger t;
  RpcServer server(t.rpc.get(), {.head_timeout_ms = 300});
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RawSocket s(server.port(), /*read_timeout_s=*/30);
  ASSERT_TRUE(s.Send("POST / HTTP/1.1\r\n"));
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int i = 0; !done.load() && i < 600; ++i) {  // at most 60 s
      if (!s.Send("X-Slow: " + std::to_string(i) + "\r\n")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto answer = s.ReadResponses(1);
  done = true;
  trickle.join();
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_NE(answer[0].first.find(" 408 "), std::string::npos) << answer[0].first;
  EXPECT_NE(answer[0].second.find("did not arrive within 300 ms"), std::string::npos)
      << answer[0].second;
  EXPECT_TRUE(s.ClosedByServer());
  EXPECT_GE(server.gate_stats().timed_out, 1u);
  server.Stop();
}

// An absurd Content-Length is refused from the headers alone: 413 arrives while the client has
// sent no body byte (it used to wait for the body until the 10 s read timeout).
TEST(RpcHttpHostile, AbsurdContentLengthIsRefusedAtOnce) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  for (std::string length : {"9223372036854775807", "99999999999999999999999", "-1", "12abc"}) {
    RawSocket s(server.port(), /*read_timeout_s=*/5);
    ASSERT_TRUE(s.Send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + "\r\n\r\n"));
    auto answer = s.ReadResponses(1);
    ASSERT_EQ(answer.size(), 1u) << length;
    const bool number = length != "-1" && length != "12abc";
    EXPECT_NE(answer[0].first.find(number ? " 413 " : " 400 "), std::string::npos)
        << length << ": " << answer[0].first;
    json error = json::parse(answer[0].second, nullptr, false);
    ASSERT_TRUE(error.is_object()) << answer[0].second;
    EXPECT_TRUE(error.contains("error")) << answer[0].second;
  }
  EXPECT_GE(server.gate_stats().refused_too_large, 2u);
  server.Stop();
}

// Four requests written at once on one connection are answered, in order.
TEST(RpcHttpHostile, PipelinedRequestsAreAnsweredInOrder) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  RawSocket s(server.port());
  std::string all;
  for (int id = 1; id <= 4; ++id) all += PostRequest(testing::Request("chain_status", json::object(), id).dump());
  ASSERT_TRUE(s.Send(all));
  auto answers = s.ReadResponses(4);
  ASSERT_EQ(answers.size(), 4u);
  for (int id = 1; id <= 4; ++id) {
    EXPECT_NE(answers[id - 1].first.find(" 200 "), std::string::npos);
    json j = json::parse(answers[id - 1].second);
    EXPECT_EQ(j["id"], id);
    EXPECT_EQ(j["result"]["chain_id"], TestLedger::kChainId);
  }
  server.Stop();
}

// Hostile input: 32 concurrent bodies of 16 MB were all read into memory at once (RSS about
// 2.5 GB). The bodies in flight now share one budget: past it the server answers 503 with
// Retry-After, small requests are still answered, and the counter never exceeds the budget.
TEST(RpcHttpHostile, ConcurrentLargeBodiesStayWithinTheBudget) {
  TestLedger t;
  RpcServerOptions opts;
  opts.body_budget_bytes = 40 << 20;
  opts.rate_limit.rate_per_second = 1e6;
  opts.rate_limit.burst = 1e6;
  RpcServer server(t.rpc.get(), opts);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const size_t big = opts.max_body_bytes;  // the largest body a client may send
  std::string body = testing::Request("chain_status").dump();
  body.insert(body.size() - 1, ",\"pad\":\"" + std::string(big - body.size() - 9, 'x') + "\"");
  ASSERT_EQ(body.size(), big);
  constexpr int kClients = 32;
  std::vector<std::unique_ptr<RawSocket>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawSocket>(server.port(), /*read_timeout_s=*/30));
    RawSocket& c = *clients.back();
    ASSERT_TRUE(c.connected());
    // The headers and half the body: the request is in flight, holding its share.
    ASSERT_TRUE(c.Send(PostHead(big)));
    c.Send(std::string_view(body).substr(0, big / 2));  // a refused one may be closed already
  }
  // Two fit; wait (bounded) until the gate has answered the other 30, then see who got what.
  for (int i = 0; i < 600 && server.gate_stats().refused_busy < kClients - 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int refused = 0;
  std::vector<RawSocket*> admitted;
  for (auto& c : clients) {
    if (!c->HasData()) {
      admitted.push_back(c.get());
      continue;
    }
    auto answer = c->ReadResponses(1);
    ASSERT_EQ(answer.size(), 1u);
    EXPECT_NE(answer[0].first.find(" 503 "), std::string::npos) << answer[0].first;
    ++refused;
  }
  EXPECT_EQ(admitted.size(), 2u);  // 40 MiB less the 4 MiB kept for small requests
  EXPECT_EQ(refused, kClients - static_cast<int>(admitted.size()));
  // Small requests are still served while the budget is full of large ones.
  RpcClient small(server.url(), {.retries = 0});
  Result<json> st = small.Call("chain_status", json::object());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (RawSocket* c : admitted) {
    ASSERT_TRUE(c->Send(std::string_view(body).substr(big / 2)));
  }
  for (RawSocket* c : admitted) {
    auto answer = c->ReadResponses(1);
    ASSERT_EQ(answer.size(), 1u);
    EXPECT_NE(answer[0].first.find(" 200 "), std::string::npos) << answer[0].first;
  }
  net::HttpGateStats stats = server.gate_stats();
  EXPECT_LE(stats.peak_body_bytes_in_flight, opts.body_budget_bytes);
  EXPECT_GE(stats.peak_body_bytes_in_flight, 2 * big);
  EXPECT_EQ(stats.refused_busy, static_cast<uint64_t>(refused));
  server.Stop();
  EXPECT_EQ(server.gate_stats().body_bytes_in_flight, 0u);
}

// The dashboard's downloads (dashboard.h) with the ledger and the nodes faked: each refusal says
// why, and a model is served only when its bytes are the blob the ledger recorded.
TEST(DashboardDownloads, RefuseWhatTheyCannotServeAndServeOnlyTheRecordedBlob) {
  const Bytes state = ToBytes("MLGS1 the trained weights");  // the id is of whatever bytes
  const BlobId final_id = BuildManifest(state).id();
  const std::string id(64, 'a'), aggregator(64, 'b'), zeros(64, '0');
  json task = {{"id", id},
               {"status", "finished"},
               {"final_state", final_id.ToHex()},
               {"params", {{"rounds", 3}, {"model_bytes", 100000}}},
               {"round_results", json::array({{{"aggregator", aggregator}}})},
               {"units", json::array()}};
  json nodes = json::array({{{"id", std::string(64, 'c')}, {"status", "active"}, {"endpoint", "http://127.0.0.1:1"}},
                            {{"id", aggregator}, {"status", "jailed"}, {"endpoint", "http://127.0.0.1:2"}},
                            {{"id", std::string(64, 'd')}, {"status", "unbonding"}, {"endpoint", "http://127.0.0.1:3"}}});
  std::vector<std::string> asked;
  Result<FetchedBlob> served = Unavailable("no provider has it");
  DashboardSources src;
  src.rpc = [&](const std::string& method, const json& params) -> Result<json> {
    if (method == "chain_status") return json{{"chain_id", "test"}, {"height", 7}};
    if (method == "list_nodes") return json{{"items", nodes}, {"next_cursor", nullptr}};
    if (method == "get_task") {
      if (params.at("id") != id) return NotFound("get_task: task not found");
      return task;
    }
    return Internal("unexpected call " + method);
  };
  src.fetch = [&](const BlobId& b, const std::vector<std::string>& endpoints,
                  uint64_t max_bytes) -> Result<FetchedBlob> {
    EXPECT_EQ(b, final_id);
    EXPECT_GE(max_bytes, 2 * 100000u);  // weights and momentum
    EXPECT_LE(max_bytes, 8 * 100000u);
    asked = endpoints;
    return served;
  };
  auto get = [&](const std::string& path) { return ServeTaskFile(path, src); };
  const std::string model = "/tasks/" + id + "/model";

  DashboardFile f = get("/tasks/xyz/model");
  EXPECT_EQ(f.http_status, 400);
  EXPECT_NE(f.body.find("'xyz' in /tasks/xyz/model is not a task id"), std::string::npos) << f.body;
  f = get("/tasks/" + std::string(64, 'e') + "/model");
  EXPECT_EQ(f.http_status, 404);
  EXPECT_NE(f.body.find("no task " + std::string(64, 'e') + " on this ledger (chain test)"),
            std::string::npos) << f.body;
  f = get("/tasks/" + id + "/weights");
  EXPECT_EQ(f.http_status, 404);
  EXPECT_NE(f.body.find("no file 'weights'"), std::string::npos) << f.body;
  EXPECT_TRUE(f.filename.empty());

  // No node serves it: 503, naming the state. The last round's aggregator is asked first; a
  // node that left is not asked.
  f = get(model);
  EXPECT_EQ(f.http_status, 503);
  EXPECT_NE(f.body.find("the final state " + final_id.ToHex() + " of task " + id +
                        " is not available from the nodes now (asked 2): no provider has it"),
            std::string::npos) << f.body;
  EXPECT_EQ(asked, (std::vector<std::string>{"127.0.0.1:2", "127.0.0.1:1"}));
  // A node serves other bytes: not served.
  served = FetchedBlob{ToBytes("MLGS1 other weights")};
  f = get(model);
  EXPECT_EQ(f.http_status, 502);
  EXPECT_NE(f.body.find("not the final state"), std::string::npos) << f.body;
  // The recorded blob: served as a file.
  served = FetchedBlob{state};
  f = get(model);
  ASSERT_EQ(f.http_status, 200) << f.body;
  EXPECT_EQ(f.body, std::string(state.begin(), state.end()));
  EXPECT_EQ(f.content_type, "application/octet-stream");
  EXPECT_EQ(f.filename, "task-aaaaaaaaaaaa-final-state-" + final_id.ToHex().substr(0, 12) + ".mlgs");
  // No node registered at all.
  nodes = json::array();
  f = get(model);
  EXPECT_EQ(f.http_status, 503);
  EXPECT_NE(f.body.find("no registered node to fetch it from"), std::string::npos) << f.body;
  // No final model: the task is open, or was cancelled.
  task["status"] = "open";
  task["final_state"] = zeros;
  f = get(model);
  EXPECT_EQ(f.http_status, 409);
  EXPECT_NE(f.body.find("task " + id + " is open (1 of 3 rounds done)"), std::string::npos) << f.body;
  task["status"] = "cancelled";
  f = get(model);
  EXPECT_EQ(f.http_status, 409);
  EXPECT_NE(f.body.find("is cancelled (1 of 3 rounds done): it has no final model"),
            std::string::npos) << f.body;
  // The audit record, at any status: the ledger's record and the chain it is of.
  f = get("/tasks/" + id + "/audit.json");
  ASSERT_EQ(f.http_status, 200) << f.body;
  EXPECT_EQ(f.content_type, "application/json");
  EXPECT_EQ(f.filename, "task-aaaaaaaaaaaa-record.json");
  const json record = json::parse(f.body);
  EXPECT_EQ(record["task"], task);
  EXPECT_EQ(record["chain_id"], "test");
  EXPECT_EQ(record["height"], 7);
}

// `chain serve`'s server answers the downloads' paths with the reason as text.
TEST(DashboardDownloads, TheServerAnswersTheirPaths) {
  TestLedger t;
  RpcServer server(t.rpc.get());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client raw("127.0.0.1", server.port());
  httplib::Result r = raw.Get("/tasks/" + std::string(64, '0') + "/model");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("no task " + std::string(64, '0')), std::string::npos) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  r = raw.Get("/tasks/nope/audit.json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("is not a task id"), std::string::npos) << r->body;
  server.Stop();
}

}  // namespace
}  // namespace meshlearn::ledger
