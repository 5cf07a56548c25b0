// Hostile input against the real `meshlearn` binary (issue 12): bad amounts, a ledger answering
// wrong-shaped JSON, unsafe or corrupt key files, concurrent `keys new` and `chain init`, and one
// home-directory layout for the node daemon and the wallet.
//
// The "ledger" of the malformed-answer tests is FakeLedger: a real HTTP server on loopback in this
// process that answers each JSON-RPC method with a result the test chooses.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/home_layout.h"

#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
// A shell command line, stderr with stdout.
CmdResult Shell(const std::string& command) {
  return meshlearn::process_test::Shell(command + " 2>&1");
}
std::string TempDir() { return meshlearn::process_test::TempDir("hostile"); }

using nlohmann::json;
namespace fs = std::filesystem;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A JSON-RPC endpoint on 127.0.0.1 that answers `method` with `answers[method]` as its result
// (anything: a wrong shape is the point) and an unknown method with a JSON-RPC error. One request
// per connection ("Connection: close").
class FakeLedger {
 public:
  explicit FakeLedger(std::map<std::string, json> answers) : answers_(std::move(answers)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeLedger() {
    stop_.store(true);
    thread_.join();
    close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  void Serve() {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      timeval tv{2, 0};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      Handle(c);
      close(c);
    }
  }

  void Handle(int c) {
    std::string in;
    char buf[4096];
    size_t header_end = std::string::npos;
    size_t body_len = 0;
    for (;;) {
      if (header_end == std::string::npos) {
        header_end = in.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          std::smatch m;
          std::string headers = in.substr(0, header_end);
          if (std::regex_search(headers, m, std::regex("[Cc]ontent-[Ll]ength: *([0-9]+)"))) {
            body_len = std::stoul(m[1]);
          }
        }
      }
      if (header_end != std::string::npos && in.size() >= header_end + 4 + body_len) break;
      ssize_t n = recv(c, buf, sizeof(buf), 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    ++requests_;
    json req = json::parse(in.substr(header_end + 4, body_len), nullptr, false);
    json resp = {{"jsonrpc", "2.0"}, {"id", req.is_object() ? req.value("id", json(1)) : json(1)}};
    const std::string method =
        req.is_object() && req.contains("method") && req["method"].is_string() ? req["method"].get<std::string>() : "";
    auto it = answers_.find(method);
    if (it != answers_.end()) {
      resp["result"] = it->second;
    } else {
      resp["error"] = {{"code", -32601}, {"message", "unknown method " + method}};
    }
    const std::string body = resp.dump();
    const std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = send(c, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  std::map<std::string, json> answers_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
};

// Good answers for the calls a send makes before its transaction goes out.
std::map<std::string, json> ChainBasics() {
  return {{"chain_status", {{"chain_id", "fake-1"}, {"height", 3}}},
          {"get_account", {{"balance", 1000}, {"nonce", 0}, {"exists", true}}}};
}

const std::string kZeroKey(64, '0');
const std::string kBob = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29";

// ---- Hostile 1: every integer the CLI parses is a plain decimal in range.

TEST(HostileAmounts, RefusedBeforeAnythingIsSignedOrSent) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  FakeLedger ledger(ChainBasics());
  const std::string rpc = " --rpc " + ledger.url();
  const std::vector<std::string> bad = {"-5", "-1", "18446744073709551616", "1e23", "0x10",
                                        "+5", "5.0", "1_000", "' 5'", "''"};
  for (const std::string& v : bad) {
    SCOPED_TRACE("value " + v);
    std::vector<std::string> commands = {
        "wallet transfer " + kBob + " " + v + " --key alice",
        "wallet transfer " + kBob + " 5 --key alice --fee " + v,
        "wallet stake " + kBob + " " + v + " --key alice",
        "wallet unstake " + kBob + " " + v + " --key alice",
        "wallet faucet " + v + " --key alice",
        "wallet history --key alice --limit " + v,
    };
    for (const std::string& c : commands) {
      CmdResult r = Meshlearn(c + rpc, home);
      EXPECT_EQ(r.code, 2) << c << "\n" << r.out;
      EXPECT_TRUE(r.out.find("is not a plain") != std::string::npos ||
                  r.out.find("is out of range") != std::string::npos)
          << c << "\n" << r.out;
    }
  }
  // Nothing reached the ledger: nothing was signed, no nonce was used.
  // Signed options too: a plain integer, no exponent.
  CmdResult timeout = Meshlearn("wallet transfer " + kBob + " 5 --key alice --timeout 1e3" + rpc, home);
  EXPECT_EQ(timeout.code, 2) << timeout.out;
  EXPECT_EQ(ledger.requests(), 0);
  EXPECT_FALSE(fs::exists(home + "/outbox/alice.tx"));
  // A plain amount passes the parser and goes on to the ledger.
  CmdResult ok = Meshlearn("wallet transfer " + kBob + " 250 --key alice --timeout 0" + rpc, home);
  EXPECT_NE(ok.code, 2) << ok.out;
  EXPECT_GT(ledger.requests(), 0);
}

// Regression (issue 12): signed integer options took negative numbers silently (`task submit
// --replicas -1`, `train --threads -1`). No meshlearn option takes one: each is refused as a
// usage error before the command runs; options that check their own range keep their message.
TEST(HostileAmounts, NegativeIntegerOptionsAreRefused) {
  const std::string home = TempDir();
  WriteText(home + "/t.toml", "[task]\nname = \"x\"\n");
  const std::vector<std::string> commands = {
      "task submit t.toml --key k --replicas -1",
      "train t.toml --threads -1",
      "train t.toml --steps -1",
      "train t.toml --seed -7",
      "eval m.safetensors --task t.toml --threads -1",
      "devnet --task t.toml --solvers -2",
      "devnet --task t.toml --forced-errors -1",
      "task watch abc --timeout -5",
      "diloco t.toml --rounds -1",
      "chain init --dir " + home + "/c --block-interval-ms -100",
      "wallet transfer bob 5 --key alice --timeout -1"};
  for (const std::string& c : commands) {
    CmdResult r = Meshlearn(c, home);
    EXPECT_EQ(r.code, 2) << c << "\n" << r.out;
    EXPECT_NE(r.out.find("is negative; this option takes 0 or more"), std::string::npos)
        << c << "\n"
        << r.out;
  }
  EXPECT_FALSE(fs::exists(home + "/c"));
  // generate's own checks name their ranges.
  CmdResult tokens = Meshlearn("generate m.safetensors --prompt x --tokens -3", home);
  EXPECT_NE(tokens.out.find("--tokens must be >= 1, got -3"), std::string::npos) << tokens.out;
}

TEST(HostileAmounts, ChainInitFundRefusesBadAmounts) {
  const std::string home = TempDir();
  for (std::string v : {"-5", "18446744073709551616", "1e23", "0x10", ""}) {
    const std::string dir = home + "/chain";
    CmdResult r = Meshlearn("chain init --dir " + dir + " --fund " + kBob + "=" + v, home);
    EXPECT_EQ(r.code, 1) << v << "\n" << r.out;
    EXPECT_NE(r.out.find("--fund"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir)) << "a refused init left " << dir;
  }
  // Signed options take a plain integer too (CLI11 would read 010 as octal 8).
  CmdResult octal = Meshlearn("chain init --dir " + home + "/c2 --block-interval-ms 1e3", home);
  EXPECT_EQ(octal.code, 2) << octal.out;
}

// ---- Hostile 5: a wrong-shaped answer is an error (exit 1) naming what was wrong, never an abort.

struct Malformed {
  std::string name;
  std::map<std::string, json> answers;
  std::string command;  // after "meshlearn", before "--rpc URL"
  std::string expect;   // in the output
};

TEST(HostileLedger, WrongShapedAnswersAreErrorsNotAborts) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  auto with_basics = [](const std::string& more) {
    std::map<std::string, json> a = ChainBasics();
    const json extra = json::parse(more);
    for (auto it = extra.begin(); it != extra.end(); ++it) a[it.key()] = it.value();
    return a;
  };
  auto answers = [](const std::string& text) {
    return json::parse(text).get<std::map<std::string, json>>();
  };
  const std::string transfer = "wallet transfer " + kBob + " 5 --key alice --timeout 5";
  std::vector<Malformed> cases = {
      {"status: height is a string", answers(R"({"chain_status": {"height": "x", "chain_id": "c"}})"),
       "chain status", "chain_status with a malformed result"},
      {"status: not an object", answers(R"({"chain_status": [1, 2]})"), "chain status",
       "chain_status with a malformed result"},
      {"balance: balance is a string", answers(R"({"get_account": {"balance": "x", "nonce": 1}})"),
       "wallet balance " + kBob, "get_account with a malformed result"},
      {"balance: a number", answers(R"({"get_account": 7})"), "wallet balance " + kBob,
       "get_account"},
      {"history: items not an array", answers(R"({"account_history": {"items": 5}})"),
       "wallet history " + kBob, "account_history with a malformed result"},
      {"history: bad item",
       answers(R"({"account_history": {"items": [{"receipt": 5}], "next_cursor": null}})"),
       "wallet history " + kBob, "items[0]"},
      {"history: next_cursor a string",
       answers(R"({"account_history": {"items": [], "next_cursor": "x"}})"),
       "wallet history " + kBob, "next_cursor"},
      {"transfer: send_tx answers a string", with_basics(R"({"send_tx": "garbage"})"), transfer,
       "send_tx"},
      {"transfer: get_tx receipt a string",
       with_basics(R"({"send_tx": {"status": "included"},
                       "get_tx": {"status": "included", "receipt": "x", "height": 4}})"),
       transfer, "get_tx"},
      {"transfer: nonce a string",
       answers(R"({"chain_status": {"chain_id": "c"}, "get_account": {"nonce": "x"}})"), transfer,
       "nonce"},
      {"task status",
       answers(R"({"get_task": {"status": 5, "units": "x", "round": "y"},
                   "list_tasks": {"items": 5}, "chain_status": {"height": "x"}})"),
       "task status " + kZeroKey, "error"},
      {"follow: genesis toml a number", answers(R"({"get_genesis": {"toml": 5}})"),
       "chain follow URL --listen '' --dir " + home + "/follower", "get_genesis"},
  };
  for (Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    FakeLedger ledger(c.answers);
    std::string cmd = c.command;
    if (size_t p = cmd.find("URL"); p != std::string::npos) {
      cmd.replace(p, 3, ledger.url());
    } else {
      cmd += " --rpc " + ledger.url();
    }
    CmdResult r = Meshlearn(cmd, home);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
    // --json: one JSON error document on stdout.
    CmdResult j = Meshlearn("--json " + cmd + " 2>/dev/null", home);
    EXPECT_EQ(j.code, 1) << j.out;
    json doc = json::parse(j.out, nullptr, false);
    EXPECT_TRUE(!doc.is_discarded() && doc.contains("error")) << j.out;
  }
}

// A malformed answer to a transfer leaves the signed transaction in the outbox: re-running the
// command resends those same bytes instead of signing a second transfer with a fresh nonce (the
// entry was once dropped before the answer was checked).
TEST(HostileLedger, AMalformedReceiptKeepsTheTransactionToResend) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  std::map<std::string, json> answers = ChainBasics();
  answers["send_tx"] = json::parse(R"({"status": "included"})");
  answers["get_tx"] = json::parse(R"({"status": "included", "receipt": "x", "height": 4})");
  FakeLedger ledger(answers);
  const std::string cmd =
      "wallet transfer " + kBob + " 5 --key alice --timeout 5 --rpc " + ledger.url();
  CmdResult first = Meshlearn(cmd, home);
  EXPECT_EQ(first.code, 1) << first.out;
  const std::string outbox = home + "/outbox/alice.tx";
  const std::string pending = ReadText(outbox);
  ASSERT_FALSE(pending.empty()) << "the outbox entry was dropped: " << first.out;
  CmdResult again = Meshlearn(cmd, home);
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_EQ(ReadText(outbox), pending) << "a second transaction was signed";
}

// A follower given a good genesis, then a chain_status of the wrong shape: an error, not an abort
// (from the main thread or the follower's).
TEST(HostileLedger, FollowerStartsAgainstAWrongShapedUpstream) {
  const std::string home = TempDir();
  CmdResult init = Meshlearn("--json chain init --dir " + home + "/chain --devnet", home);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string hash = json::parse(init.out)["genesis_hash"];
  const std::string toml = ReadText(home + "/chain/genesis.toml");
  for (const json& status : {json{{"height", "x"}}, json("x"), json{{"chain_id", 5}},
                             json{{"genesis_hash", hash}, {"height", "x"}},
                             json{{"genesis_hash", 7}}}) {
    SCOPED_TRACE(status.dump());
    FakeLedger ledger({{"get_genesis", {{"toml", toml}}},
                       {"chain_status", status},
                       {"get_blocks", {{"height", "x"}, {"blocks", 5}}},
                       {"wait_block", {{"height", "x"}}}});
    const std::string dir = TempDir() + "/f";
    // `timeout`: a follower that kept running would fail the test, not hang it.
    CmdResult r = Shell("MESHLEARN_HOME=" + home + " timeout 60 " + MESHLEARN_BIN + " chain follow " +
                      ledger.url() + " --listen '' --dir " + dir);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  }
}

// ---- Hostile 6: keys.

TEST(HostileKeys, AKeyFileOthersCanReadIsNotUsed) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  const std::string file = home + "/keys/alice.key.json";
  ASSERT_EQ(chmod(file.c_str(), 0644), 0);
  ASSERT_EQ(chmod((home + "/keys").c_str(), 0755), 0);
  FakeLedger ledger(ChainBasics());
  CmdResult r = Meshlearn("wallet transfer " + kBob + " 5 --key alice --rpc " + ledger.url(), home);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("chmod 600 " + file), std::string::npos) << r.out;
  EXPECT_EQ(ledger.requests(), 0);
  // A keys directory that others can write is refused too.
  ASSERT_EQ(chmod(file.c_str(), 0600), 0);
  ASSERT_EQ(chmod((home + "/keys").c_str(), 0777), 0);
  r = Meshlearn("wallet transfer " + kBob + " 5 --key alice --rpc " + ledger.url(), home);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("chmod 700"), std::string::npos) << r.out;
  EXPECT_EQ(ledger.requests(), 0);
}

TEST(HostileKeys, ListShowsGoodKeysAndReportsABadFile) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new carol --no-passphrase", home).code, 0);
  WriteText(home + "/keys/bob.key.json", "{not json");
  CmdResult r = Meshlearn("--json keys list", home);
  ASSERT_EQ(r.code, 0) << r.out;
  json list = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(list.is_array()) << r.out;
  std::set<std::string> good, bad;
  for (const json& k : list) (k.contains("error") ? bad : good).insert(k["name"]);
  EXPECT_EQ(good, (std::set<std::string>{"alice", "carol"}));
  EXPECT_EQ(bad, (std::set<std::string>{"bob"}));
  CmdResult human = Meshlearn("keys list", home);
  EXPECT_NE(human.out.find("alice"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("bob  UNREADABLE"), std::string::npos) << human.out;
}

// 12 processes create the same key at once: exactly one succeeds, and the file holds its key.
TEST(HostileKeys, ConcurrentKeysNewCreateExactlyOne) {
  const std::string home = TempDir();
  const std::string script =
      "for i in $(seq 1 12); do (MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN +
      " --json keys new race --no-passphrase > " + home + "/out.$i 2>&1; echo $? > " + home +
      "/rc.$i) & done; wait";
  ASSERT_EQ(Shell(script).code, 0);
  int created = 0;
  std::string winner;
  for (int i = 1; i <= 12; ++i) {
    const std::string rc = ReadText(home + "/rc." + std::to_string(i));
    const std::string out = ReadText(home + "/out." + std::to_string(i));
    if (rc == "0\n") {
      ++created;
      winner = json::parse(out)["public_key"];
    } else {
      EXPECT_EQ(rc, "1\n") << out;
      EXPECT_NE(out.find("already exists"), std::string::npos) << out;
    }
  }
  EXPECT_EQ(created, 1);
  CmdResult show = Meshlearn("--json keys show race", home);
  ASSERT_EQ(show.code, 0) << show.out;
  EXPECT_EQ(json::parse(show.out)["public_key"], winner);
  // No temporary is left beside the key.
  int files = 0;
  for (const auto& e : fs::directory_iterator(home + "/keys")) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

// ---- Hostile 7: concurrent `chain init` of one directory.

TEST(HostileChainInit, ConcurrentInitsCreateExactlyOneConsistentChain) {
  const std::string base = TempDir();
  const std::string dir = base + "/chain";
  const std::string script =
      "for i in $(seq 1 8); do (MESHLEARN_HOME=" + base + "/home " + MESHLEARN_BIN +
      " --json chain init --devnet --dir " + dir + " > " + base + "/out.$i 2>&1; echo $? > " +
      base + "/rc.$i) & done; wait";
  ASSERT_EQ(Shell(script).code, 0);
  int won = 0;
  json winner;
  for (int i = 1; i <= 8; ++i) {
    const std::string rc = ReadText(base + "/rc." + std::to_string(i));
    const std::string out = ReadText(base + "/out." + std::to_string(i));
    if (rc == "0\n") {
      ++won;
      winner = json::parse(out);
    } else {
      EXPECT_EQ(rc, "1\n") << out;
      EXPECT_NE(out.find("exists"), std::string::npos) << out;
    }
  }
  ASSERT_EQ(won, 1);
  // The genesis on disk is the winner's, and names the key on disk as its sequencer.
  const std::string toml = ReadText(dir + "/genesis.toml");
  EXPECT_NE(toml.find(winner["sequencer"].get<std::string>()), std::string::npos) << toml;
  json key = json::parse(ReadText(dir + "/keys/sequencer.key.json"));
  EXPECT_EQ(key["public_key"], winner["sequencer"]);
  // Nothing half-made is left beside it.
  for (const auto& e : fs::directory_iterator(base)) {
    EXPECT_EQ(e.path().filename().string().find("chain.init"), std::string::npos) << e.path();
  }
  // chain serve accepts it (genesis and key agree).
  CmdResult again = Meshlearn("chain init --dir " + dir, base + "/home");
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.out.find("already holds a chain"), std::string::npos) << again.out;
}

// ---- Hostile 4: absurd models and data are refused with the key and the machine's memory named,
// never end in std::bad_alloc (rc 134), through the commands a user runs.

TEST(HostileModels, AbsurdModelsAndNonRegularDataAreRefusedNotAborted) {
  const std::string dir = TempDir();
  const std::string data =
      "[data]\nformat = \"idx\"\n"
      "train_images = \"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\"\n"
      "train_labels = \"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\"\n"
      "test_images = \"/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz\"\n"
      "test_labels = \"/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz\"\n";
  const std::string rest =
      "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n[train]\nsteps = 1\nbatch_size = 8\n"
      "[network]\nrounds = 1\nunits_per_round = 1\ninner_steps = 2\nbudget = 100000000\n"
      "price_cap = 100\n";
  const std::string wide_mlp = data +
                               "[model]\ninput = [784]\n[[model.layers]]\nkind = \"linear\"\n"
                               "out = 1048576\n[[model.layers]]\nkind = \"linear\"\nout = 10\n" +
                               rest;
  const std::string huge_gpt =
      "[data]\nformat = \"text\"\npath = \"" + dir + "/corpus.txt\"\n"
      "[model]\nkind = \"gpt\"\nn_layer = 256\nn_head = 64\nn_embd = 65536\n"
      "block_size = 64\n" + rest;
  WriteText(dir + "/corpus.txt", std::string(4096, 'a') + "bcdefgh\n");
  const std::string dev_zero = "[data]\nformat = \"idx\"\ntrain_images = \"/dev/zero\"\n"
                               "train_labels = \"/dev/zero\"\ntest_images = \"/dev/zero\"\n"
                               "test_labels = \"/dev/zero\"\n[model]\ninput = [784]\n"
                               "[[model.layers]]\nkind = \"linear\"\nout = 10\n" + rest;
  struct Case {
    std::string name, toml, expect;
    bool needs_fashion;
  };
  const Case cases[] = {{"wide-mlp", wide_mlp, "model.layers", true},
                        {"huge-gpt", huge_gpt, "model.n_layer", false},
                        {"dev-zero", dev_zero, "data.train_images", false}};
  const bool fashion = std::ifstream(
      "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good();
  for (const Case& c : cases) {
    if (c.needs_fashion && !fashion) continue;
    const std::string path = dir + "/" + c.name + ".toml";
    WriteText(path, c.toml);
    for (const std::string& cmd : {"train " + path + " --out " + dir + "/out-" + c.name,
                                   "task submit " + path + " --dry-run"}) {
      CmdResult r = Shell("MESHLEARN_MEMORY_BYTES=1073741824 MESHLEARN_HOME=" + dir + "/home " +
                          MESHLEARN_BIN + " " + cmd);
      EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find("error:"), std::string::npos) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find(c.expect), std::string::npos) << cmd << "\n" << r.out;
      EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << cmd << "\n" << r.out;
    }
  }
}

// ---- Item 10: --help shows no "{false}"/"{true}" beside flags, in any command.

TEST(Help, FlagsShowNoStoredValues) {
  const std::string home = TempDir();
  for (std::string c : {"", "devnet", "wallet transfer", "chain init", "keys new",
                               "node run", "task submit", "train"}) {
    CmdResult r = Meshlearn(c + " --help", home);
    EXPECT_EQ(r.code, 0) << c << "\n" << r.out;
    EXPECT_EQ(r.out.find("{false}"), std::string::npos) << c << "\n" << r.out;
    EXPECT_EQ(r.out.find("{true}"), std::string::npos) << c << "\n" << r.out;
  }
  CmdResult devnet = Meshlearn("devnet --help", home);
  EXPECT_NE(devnet.out.find("--check-reference,--no-check-reference"), std::string::npos)
      << devnet.out;
}

// ---- Item 1: one layout for a home directory, whoever uses it.

// An old node data dir: the daemon's journal was a FILE named outbox (and `node leave`'s was
// outbox-cli). The migration moves both into outbox/ and is idempotent.
TEST(HomeLayout, MigratesTheOldOutboxFiles) {
  const std::string root = TempDir();
  WriteText(root + "/outbox", "daemon-journal\n");
  WriteText(root + "/outbox-cli", "leave-journal\n");
  meshlearn::HomeLayout home(root);
  ASSERT_TRUE(meshlearn::MigrateHomeLayout(home).ok());
  EXPECT_TRUE(fs::is_directory(root + "/outbox"));
  EXPECT_EQ(ReadText(home.NodeDaemonJournal()), "daemon-journal\n");
  EXPECT_EQ(ReadText(home.NodeLeaveJournal()), "leave-journal\n");
  EXPECT_FALSE(fs::exists(root + "/outbox-cli"));
  ASSERT_TRUE(meshlearn::MigrateHomeLayout(home).ok());
  EXPECT_EQ(ReadText(home.NodeDaemonJournal()), "daemon-journal\n");
  // A migration interrupted after the first rename is completed by the next.
  const std::string other = TempDir();
  WriteText(other + "/outbox.migrating", "x\n");
  ASSERT_TRUE(meshlearn::MigrateHomeLayout(meshlearn::HomeLayout(other)).ok());
  EXPECT_EQ(ReadText(other + "/outbox/node.daemon.txs"), "x\n");
}

// The issue's two failures, end to end: funding a node with `--home <data_dir> wallet faucet`
// before its first `node run` (the node then looped on "cannot read .../outbox: Is a directory"
// and never registered), and the withdraw command `node leave` prints (it failed with ".../outbox
// exists and is not a directory").
TEST(HomeLayout, NodeDataDirIsAWalletHome) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ChainServer chain(home);
  ASSERT_FALSE(chain.url().empty()) << ReadText(home + "/serve.out");
  const std::string data = home + "/node";
  const std::string config = home + "/node.toml";
  WriteText(config, "data_dir = \"node\"\nrpc = \"" + chain.url() + "\"\nlisten = \"127.0.0.1:0\"\nstake = 200\nheartbeat_blocks = 2\n"
                        "[capabilities]\nthroughput = 1000000000\nmemory_bytes = 1073741824\n"
                        "cores = 1\n");
  CmdResult init = Meshlearn("--json node init --config " + config, home);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string node_id = json::parse(init.out)["node_id"];

  // Fund the node through its data dir, before it ever ran.
  CmdResult faucet = Meshlearn("--home " + data + " wallet faucet 5000 --key node --rpc " +
                                   chain.url(), home);
  ASSERT_EQ(faucet.code, 0) << faucet.out;
  EXPECT_TRUE(fs::is_directory(data + "/outbox"));

  const std::string log = home + "/node.log";
  pid_t node = fork();
  if (node == 0) {
    setenv("MESHLEARN_HOME", home.c_str(), 1);
    if (!freopen(log.c_str(), "w", stdout) || !freopen(log.c_str(), "a", stderr)) _exit(127);
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "node", "run", "--config", config.c_str(), (char*)nullptr);
    _exit(127);
  }
  bool registered = false;
  for (int i = 0; i < 600 && !registered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    registered = ReadText(log).find("registered node " + node_id) != std::string::npos;
  }
  EXPECT_TRUE(registered) << ReadText(log);
  EXPECT_EQ(ReadText(log).find("Is a directory"), std::string::npos) << ReadText(log);

  CmdResult leave = Meshlearn("node leave --config " + config, home);
  ASSERT_EQ(leave.code, 0) << leave.out;
  // Leaving twice: the ledger's reason, once ("leave node: node ... already left").
  CmdResult twice = Meshlearn("node leave --config " + config, home);
  EXPECT_EQ(twice.code, 1) << twice.out;
  EXPECT_NE(twice.out.find("already left"), std::string::npos) << twice.out;
  EXPECT_EQ(twice.out.find("leave node: leave node:"), std::string::npos) << twice.out;
  // The daemon notices and exits by itself.
  int status = -1;
  for (int i = 0; i < 600 && waitpid(node, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (status == -1) {
    kill(node, SIGTERM);
    waitpid(node, &status, 0);
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(leave.out, m, std::regex("`meshlearn (--home [^`]*)`"))) << leave.out;
  // The printed command, exactly (the ledger from $MESHLEARN_RPC, as the docs say). After the
  // devnet's unbonding delay (10 blocks) the stake is withdrawn.
  const std::string hint = std::string("MESHLEARN_RPC=") + chain.url() + " " + MESHLEARN_BIN + " " +
                           m[1].str();
  CmdResult withdraw{1, ""};
  for (int i = 0; i < 60; ++i) {
    withdraw = Shell(hint);
    if (withdraw.code == 0 || withdraw.out.find("matured") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(withdraw.code, 0) << hint << "\n" << withdraw.out;
  EXPECT_NE(withdraw.out.find("withdraw included in block"), std::string::npos) << withdraw.out;
  EXPECT_EQ(withdraw.out.find("not a directory"), std::string::npos) << withdraw.out;
}

// Regression (issue 12 item 10): the 12-digit ids the CLI prints are accepted as input. `wallet
// send` printed "sent tx 78a88c4eecff" and `wallet tx 78a88c4eecff` failed with "expected 64 hex
// digits, got 12 (64 hex digits)"; `task audit` prints 12-digit node ids that `wallet stake`
// refused. A transaction prefix is resolved among the wallet's own transactions (the ledger looks
// one up by its whole id), a node prefix among the registered nodes.
TEST(ShortIds, PrintedTxAndNodePrefixesAreAccepted) {
  const std::string home = TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).code, 0);
  ChainServer chain(home);
  ASSERT_FALSE(chain.url().empty()) << ReadText(home + "/serve.out");
  const std::string rpc = " --rpc " + chain.url();

  CmdResult sent = Meshlearn("wallet transfer bob 25 --key alice" + rpc, home);
  ASSERT_EQ(sent.code, 0) << sent.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(sent.out, m, std::regex("sent tx ([0-9a-f]{12}) "))) << sent.out;
  const std::string short_id = m[1].str();
  ASSERT_TRUE(std::regex_search(sent.out, m, std::regex("tx: ([0-9a-f]{64})"))) << sent.out;
  const std::string full_id = m[1].str();
  ASSERT_EQ(full_id.substr(0, 12), short_id);

  // The printed prefix, as it was printed, and shorter; with and without --key.
  for (const std::string& typed : {short_id, short_id.substr(0, 6)}) {
    CmdResult tx = Meshlearn("--json wallet tx " + typed + rpc, home, false);
    ASSERT_EQ(tx.code, 0) << typed << ": " << tx.out;
    const json t = json::parse(tx.out, nullptr, false);
    ASSERT_FALSE(t.is_discarded()) << tx.out;
    EXPECT_EQ(t["tx"]["id"], full_id) << tx.out;
  }
  EXPECT_EQ(Meshlearn("wallet tx " + short_id + " --key alice" + rpc, home).code, 0);
  // The history shows the same prefix.
  CmdResult hist = Meshlearn("wallet history --key alice" + rpc, home);
  EXPECT_NE(hist.out.find("tx " + short_id), std::string::npos) << hist.out;
  // No such transaction among alice's and bob's: an error naming where it looked, not a crash.
  const std::string other = std::string(full_id[0] == 'f' ? "e" : "f") + full_id.substr(1, 11);
  CmdResult none = Meshlearn("wallet tx " + other + rpc, home);
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find("no transaction"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("alice, bob"), std::string::npos) << none.out;
  CmdResult junk = Meshlearn("wallet tx 78a8zz" + rpc, home);
  EXPECT_EQ(junk.code, 1) << junk.out;
  EXPECT_NE(junk.out.find("transaction id: expected hex digits"), std::string::npos) << junk.out;

  // A node, registered; `wallet stake` by the 12-digit prefix `task audit` prints.
  const std::string config = home + "/node.toml";
  WriteText(config, "data_dir = \"node\"\nrpc = \"" + chain.url() +
                        "\"\nlisten = \"127.0.0.1:0\"\nstake = 200\nheartbeat_blocks = 2\n"
                        "[capabilities]\nthroughput = 1000000000\nmemory_bytes = 1073741824\n"
                        "cores = 1\n");
  CmdResult init = Meshlearn("--json node init --config " + config, home);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string node_id = json::parse(init.out)["node_id"];
  ASSERT_EQ(Meshlearn("--home " + home + "/node wallet faucet 5000 --key node" + rpc, home).code,
            0);
  const std::string log = home + "/node.log";
  meshlearn::process_test::Child node(home, log, {"node", "run", "--config", config});
  bool registered = false;
  for (int i = 0; i < 600 && !registered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    registered = ReadText(log).find("registered node " + node_id) != std::string::npos;
  }
  ASSERT_TRUE(registered) << ReadText(log);
  CmdResult stake = Meshlearn(
      "--home " + home + "/node wallet stake " + node_id.substr(0, 12) + " 100 --key node" + rpc,
      home);
  EXPECT_EQ(stake.code, 0) << stake.out;
  EXPECT_NE(stake.out.find("stake included in block"), std::string::npos) << stake.out;
  EXPECT_NE(stake.out.find(": ok"), std::string::npos) << stake.out;
  CmdResult no_node = Meshlearn("--home " + home + "/node wallet stake " +
                                    std::string(node_id[0] == 'f' ? "e" : "f") +
                                    node_id.substr(1, 11) + " 100 --key node" + rpc,
                                home);
  EXPECT_EQ(no_node.code, 1) << no_node.out;
  EXPECT_NE(no_node.out.find("node id: no node on " + chain.url()), std::string::npos)
      << no_node.out;
}

}  // namespace
