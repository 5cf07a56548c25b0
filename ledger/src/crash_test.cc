// Crash test: a real `meshlearn chain serve` process under a stream of transactions is killed
// with SIGKILL at random moments, many times. After each kill the database is opened again and
//   - replaying every block from genesis gives the live state hash (Chain::ReplayFromGenesis),
//   - the books balance,
//   - every transaction the server acknowledged (answered "included") is there, in the block
//     it was acknowledged in,
// and the restarted server serves the same blocks. 15 kills by default; MESHLEARN_SLOW_TESTS=1
// for 100. The seed is printed; MESHLEARN_CRASH_SEED=N replays a run's kill schedule.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc_client.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;

using testing::ReadAll;

struct Server {
  pid_t pid = -1;
  std::string url;
  std::string log;
};

// Starts `meshlearn --json <args>` with output to `log` and waits for its first JSON line with
// `url_key` (the URL it serves). pid -1 if it exited first.
Server StartMeshlearn(const std::vector<std::string>& args, const std::string& home,
                      const std::string& log, const char* url_key) {
  Server s;
  s.log = log;
  s.pid = fork();
  if (s.pid == 0) {
    int fd = open(s.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("MESHLEARN_HOME", home.c_str(), 1);
    std::vector<char*> argv;
    std::string bin = MESHLEARN_BIN;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  for (;;) {
    std::string out = ReadAll(s.log);
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("{", 0) != 0) continue;
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains(url_key)) {
        s.url = j[url_key];
        return s;
      }
    }
    int status;
    if (waitpid(s.pid, &status, WNOHANG) == s.pid) {
      ADD_FAILURE() << "meshlearn exited before listening:\n" << out;
      s.pid = -1;
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Server StartServer(const std::string& dir, const std::string& home, int run) {
  return StartMeshlearn({"--json", "--log-level", "warn", "chain", "serve", "--dir", dir, "--listen",
                         "127.0.0.1:0", "--rate-limit", "0"},
                        home, dir + "/serve-" + std::to_string(run) + ".log", "url");
}

void Kill(Server& s) {
  if (s.pid <= 0) return;
  kill(s.pid, SIGKILL);
  int status;
  waitpid(s.pid, &status, 0);
  s.pid = -1;
}

struct Acked {
  Hash256 id;
  uint64_t height;
};

// Sends transfers from `from` in windows of kWindow (admitted together, so blocks hold many
// transactions and a kill often lands in the middle of a commit), until the server dies or
// `stop`. Records each transaction the server acknowledged as included.
void SendUntilDead(const std::string& url, const KeyPair& from, const KeyPair& to,
                   std::atomic<bool>& stop, std::mutex& mu, std::vector<Acked>& acked,
                   uint64_t seed) {
  constexpr int kWindow = 8;
  RpcClient rpc(url, {.connect_timeout_ms = 1000, .read_timeout_ms = 5000, .retries = 0});
  std::mt19937_64 rng(seed);
  Result<uint64_t> nonce = FetchNextNonce(rpc, from.public_key());
  if (!nonce.ok()) return;
  uint64_t n = *nonce;
  while (!stop.load()) {
    std::vector<Transaction> window;
    for (int i = 0; i < kWindow; ++i) {
      window.push_back(BuildSignedTx(from, testing::TestLedger::kChainId, n + i,
                                     TransferTx{.to = to.public_key(), .amount = 1 + rng() % 100, .memo = ""}));
      Result<json> r = rpc.Call("send_tx", {{"tx", testing::TxHex(window.back())}});
      if (!r.ok()) return;  // the server was killed
    }
    for (const Transaction& tx : window) {
      std::string hex = testing::TxHex(tx);
      for (;;) {  // resend the same bytes until acknowledged: never pays twice
        Result<json> r = rpc.Call("send_tx", {{"tx", hex}, {"wait_ms", 1000}});
        if (!r.ok()) return;
        if ((*r)["status"] == "included") {
          std::lock_guard<std::mutex> lock(mu);
          acked.push_back({TxId(tx), (*r)["height"].get<uint64_t>()});
          break;
        }
        if ((*r)["status"] != "pending" || stop.load()) return;
      }
    }
    n += kWindow;
  }
}

TEST(ChainCrash, KilledServerLosesNoAcknowledgedTransaction) {
  const int kills = std::getenv("MESHLEARN_SLOW_TESTS") ? 100 : 15;
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("MESHLEARN_CRASH_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("crash test seed %llu (MESHLEARN_CRASH_SEED=%llu replays the kill schedule)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);

  std::string home = testing::TempDir();
  std::string dir = home + "/chain";
  std::vector<KeyPair> senders;
  for (uint8_t i = 1; i <= 4; ++i) senders.push_back(testing::KeyFromByte(i));
  std::string init = std::string("MESHLEARN_HOME=") + home + " " + MESHLEARN_BIN +
                     " chain init --dir " + dir + " --chain-id " +
                     testing::TestLedger::kChainId + " --block-interval-ms 20";
  for (const KeyPair& k : senders) init += " --fund " + k.public_key().ToHex() + "=1000000000";
  ASSERT_EQ(std::system((init + " > " + home + "/init.log 2>&1").c_str()), 0) << ReadAll(home + "/init.log");
  Result<Genesis> genesis = LoadGenesis(Env::Default(), dir + "/genesis.toml");
  ASSERT_TRUE(genesis.ok()) << genesis.status().ToString();

  std::vector<Acked> acked;
  std::mutex mu;
  uint64_t last_height = 0;
  Hash256 last_state;
  for (int k = 0; k < kills; ++k) {
    Server server = StartServer(dir, home, k);
    ASSERT_GT(server.pid, 0);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (size_t i = 0; i < senders.size(); ++i) {
      threads.emplace_back(SendUntilDead, server.url, std::cref(senders[i]),
                           std::cref(senders[(i + 1) % senders.size()]), std::ref(stop),
                           std::ref(mu), std::ref(acked), rng());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 400));
    Kill(server);
    stop.store(true);
    for (std::thread& t : threads) t.join();

    // Restart (in this process): the replay and the acknowledgements.
    Result<std::unique_ptr<Chain>> chain = Chain::Open(dir + "/chain.db", *genesis);
    ASSERT_TRUE(chain.ok()) << "kill " << k << ": " << chain.status().ToString();
    Chain& c = **chain;
    EXPECT_GE(c.Height(), last_height) << "kill " << k << ": the chain went backwards";
    last_height = c.Height();
    if (last_height > 0) last_state = c.GetBlock(last_height)->header.state_hash;
    Hash256 replayed;
    Status replay = c.ReplayFromGenesis(&replayed);
    ASSERT_TRUE(replay.ok()) << "kill " << k << ": " << replay.ToString();
    EXPECT_EQ(replayed, c.StateHash());
    ASSERT_TRUE(c.CheckInvariants().ok()) << "kill " << k;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const Acked& a : acked) {
        Result<Receipt> r = c.GetReceipt(a.id);
        ASSERT_TRUE(r.ok()) << "kill " << k << ": acknowledged tx " << a.id.ToHex() << " is lost";
        EXPECT_EQ(r->height, a.height);
      }
    }
    std::printf("kill %d: height %llu, %zu acknowledged txs, replay ok\n", k + 1,
                static_cast<unsigned long long>(c.Height()), acked.size());
  }
  EXPECT_GT(acked.size(), 0u) << "no transaction was ever acknowledged; see " << dir << "/serve-*.log";

  // Finally the real server, restarted, serves the same history.
  Server server = StartServer(dir, home, kills);
  ASSERT_GT(server.pid, 0);
  RpcClient rpc(server.url);
  Result<json> b = rpc.Call("get_block", {{"height", last_height}});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)["header"]["state_hash"], last_state.ToHex()) << b->dump();
  Kill(server);
}

}  // namespace
}  // namespace meshlearn::ledger

namespace meshlearn::ledger {
namespace {

struct Cli {
  int code;
  std::string out;
  json j;  // stdout parsed, when it is JSON
};

Cli Meshlearn(const std::string& args, const std::string& home) {
  std::string cmd = "MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN + " " + args + " 2>" + home + "/stderr.txt";
  auto [code, out] = testing::RunShell(cmd);
  Cli r{code, out + ReadAll(home + "/stderr.txt"), json()};
  r.j = json::parse(out, nullptr, false);
  return r;
}

// The CLI end to end: init, serve, wallet commands, a follower, and the follower refusing sends.
TEST(ChainCli, InitServeWalletFollow) {
  std::string home = testing::TempDir();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).code, 0);
  std::string dir = home + "/chain";
  Cli init = Meshlearn("--json chain init --dir " + dir + " --fund alice=1000 --faucet --block-interval-ms 50", home);
  ASSERT_EQ(init.code, 0) << init.out;
  EXPECT_EQ(init.j["accounts"], 1);
  Cli again = Meshlearn("chain init --dir " + dir, home);
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.out.find("already holds a chain"), std::string::npos) << again.out;

  Server seq = StartServer(dir, home, 0);
  ASSERT_GT(seq.pid, 0);
  std::string rpc = " --rpc " + seq.url;

  Cli bal = Meshlearn("--json wallet balance --key alice" + rpc, home);
  ASSERT_EQ(bal.code, 0) << bal.out;
  EXPECT_EQ(bal.j["balance"], 1000);

  Cli tr = Meshlearn("--json wallet transfer bob 250 --key alice --memo hi" + rpc, home);
  ASSERT_EQ(tr.code, 0) << tr.out;
  EXPECT_EQ(tr.j["status"], "included");
  EXPECT_EQ(tr.j["receipt"]["ok"], true);

  Cli human = Meshlearn("wallet transfer bob 5 --key alice" + rpc, home);
  ASSERT_EQ(human.code, 0) << human.out;
  EXPECT_NE(human.out.find("included in block"), std::string::npos) << human.out;

  Cli too_much = Meshlearn("--json wallet transfer bob 999999 --key alice" + rpc, home);
  EXPECT_EQ(too_much.code, 1) << too_much.out;

  Cli faucet = Meshlearn("--json wallet faucet 500 --key bob" + rpc, home);
  ASSERT_EQ(faucet.code, 0) << faucet.out;
  Cli bob = Meshlearn("--json wallet balance --key bob" + rpc, home);
  EXPECT_EQ(bob.j["balance"], 250 + 5 + 500) << bob.out;

  Cli hist = Meshlearn("--json wallet history --key alice --limit 2" + rpc, home);
  ASSERT_EQ(hist.code, 0) << hist.out;
  EXPECT_EQ(hist.j["items"].size(), 2u);
  EXPECT_FALSE(hist.j["next_cursor"].is_null());

  Cli st = Meshlearn("--json chain status" + rpc, home);
  ASSERT_EQ(st.code, 0) << st.out;
  uint64_t height = st.j["height"];
  EXPECT_GE(height, 3u);

  Cli help = Meshlearn("wallet transfer --help", home);
  EXPECT_NE(help.out.find("Examples"), std::string::npos);

  // A follower catches up, serves the same state, and refuses sends.
  Server fol = StartMeshlearn({"--json", "chain", "follow", seq.url, "--dir", home + "/follower",
                               "--listen", "127.0.0.1:0"},
                              home, home + "/follow.log", "url");
  ASSERT_GT(fol.pid, 0);
  RpcClient frpc(fol.url);
  for (;;) {
    Result<json> w = frpc.Call("wait_block", {{"after", height - 1}, {"timeout_ms", 1000}});
    ASSERT_TRUE(w.ok()) << w.status().ToString() << ReadAll(fol.log);
    if ((*w)["height"].get<uint64_t>() >= height) break;
  }
  RpcClient srpc(seq.url);
  Result<json> a = srpc.Call("get_block", {{"height", height}});
  Result<json> b = frpc.Call("get_block", {{"height", height}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)["header"], (*b)["header"]);
  Cli ro = Meshlearn("wallet transfer bob 1 --key alice --rpc " + fol.url, home);
  EXPECT_EQ(ro.code, 1);
  EXPECT_NE(ro.out.find("read-only"), std::string::npos) << ro.out;
  Cli fst = Meshlearn("--json chain status --rpc " + fol.url, home);
  EXPECT_EQ(fst.j["role"], "follower");

  Kill(fol);
  Kill(seq);
}

}  // namespace
}  // namespace meshlearn::ledger
