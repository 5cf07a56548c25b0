// `meshlearn chain init --sequencers 3` and `meshlearn chain serve --cluster` end to end (issue
// 18): a 3-member etcd and three real `chain serve` candidates on loopback; the CLI's wallet
// takes the three URLs (--rpc URL1,URL2,URL3), a transfer is included, the leader is killed
// with SIGKILL, the next transfer is included by the new leader, and every surviving candidate,
// asked alone, counts both exactly once at once (read-after-apply); `chain status` names the
// leader. Skipped, saying so, without the etcd binary.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "etcd_test_util.h"
#include "meshlearn/ledger/cluster.h"
#include "meshlearn/ledger/genesis.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;

using testing::ReadAll;

// `meshlearn ARGS` with MESHLEARN_HOME=home; its exit code and stdout parsed as JSON.
std::pair<int, json> Meshlearn(const std::string& args, const std::string& home) {
  std::string cmd =
      "MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN + " " + args + " 2>>" + home + "/stderr.txt";
  auto [code, out] = testing::RunShell(cmd);
  return {code, json::parse(out, nullptr, false)};
}

pid_t Serve(const std::vector<std::string>& args, const std::string& home, const std::string& log) {
  std::string bin = MESHLEARN_BIN;
  std::vector<std::string> all = {bin};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string env = "MESHLEARN_HOME=" + home;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    putenv(env.data());
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

TEST(ClusterCli, InitServeTransferKillTheLeaderTransferAgain) {
  std::string bin = testing::FindEtcd();
  if (bin.empty()) GTEST_SKIP() << "no etcd binary (apt-get install etcd-server); skipped";
  std::string home = testing::TempDir();
  testing::EtcdCluster etcd;
  std::string error;
  ASSERT_TRUE(etcd.Start(bin, 3, home, &error)) << error;
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).first, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).first, 0);
  auto [code, init] = Meshlearn("--json chain init --dir " + home +
                                    "/base --sequencers 3 --fund alice=1000000 "
                                    "--block-interval-ms 50",
                                home);
  ASSERT_EQ(code, 0) << ReadAll(home + "/stderr.txt");
  ASSERT_EQ(init["sequencers"].size(), 3u) << init.dump();
  EXPECT_EQ(init["sequencers"][1]["name"], "sequencer-2");
  Result<Genesis> genesis = LoadGenesis(Env::Default(), home + "/base/genesis.toml");
  ASSERT_TRUE(genesis.ok()) << genesis.status().ToString();
  ASSERT_EQ(genesis->sequencers.size(), 3u);

  std::vector<pid_t> pids;
  std::vector<std::string> urls;
  for (size_t i = 0; i < 3; ++i) {
    std::string d = home + "/c" + std::to_string(i);
    std::filesystem::copy(home + "/base", d, std::filesystem::copy_options::recursive);
    urls.push_back("http://127.0.0.1:" + std::to_string(testing::FreePort()));
    pids.push_back(Serve({"--json", "--log-level", "warn", "chain", "serve", "--dir", d, "--key",
                          CandidateKeyName(i), "--listen", urls[i].substr(7), "--cluster",
                          etcd.member(i).client_url, "--lease-ttl", "1", "--rate-limit", "0"},
                         home, d + "/serve.log"));
  }
  std::string rpc = " --rpc " + urls[0] + "," + urls[1] + "," + urls[2];
  auto [c1, t1] = Meshlearn("--json wallet transfer bob 5 --key alice" + rpc, home);
  ASSERT_EQ(c1, 0) << ReadAll(home + "/stderr.txt") << ReadAll(home + "/c0/serve.log");
  EXPECT_EQ(t1["status"], "included");
  auto [c2, st] = Meshlearn("--json chain status" + rpc, home);
  ASSERT_EQ(c2, 0);
  EXPECT_EQ(st["role"], "candidate");

  // Kill the leader (the URL in etcd's leader record).
  EtcdClient client(etcd.ClientUrlList());
  Result<std::optional<EtcdKv>> leader = client.Get(ClusterCandidate::Prefix(*genesis) + "leader");
  ASSERT_TRUE(leader.ok() && leader->has_value());
  json rec = json::parse((*leader)->value);
  int killed = -1;
  for (size_t i = 0; i < 3; ++i) {
    if (rec["url"] == urls[i]) killed = static_cast<int>(i);
  }
  ASSERT_GE(killed, 0) << rec.dump();
  kill(pids[killed], SIGKILL);
  waitpid(pids[killed], nullptr, 0);

  auto [c3, t2] = Meshlearn("--json wallet transfer bob 7 --key alice" + rpc, home);
  ASSERT_EQ(c3, 0) << t2.dump() << ReadAll(home + "/stderr.txt");
  EXPECT_EQ(t2["status"], "included");
  EXPECT_GT(t2["height"].get<uint64_t>(), t1["height"].get<uint64_t>());
  // Read-after-apply: every surviving candidate, asked alone right after the transfer, answers
  // with both transfers (a standby waits until it has applied what etcd holds; before, one
  // answered 5 here). chain_status names the one leader: exactly one says it leads, the other
  // names it, and the leader counts its takeover.
  int leaders = 0;
  std::string leader_key;
  for (size_t i = 0; i < 3; ++i) {
    if (static_cast<int>(i) == killed) continue;
    auto [c4, bal] = Meshlearn("--json wallet balance --key bob --rpc " + urls[i], home);
    ASSERT_EQ(c4, 0) << ReadAll(home + "/stderr.txt");
    EXPECT_EQ(bal["balance"], 12) << "candidate " << i << ": each transfer exactly once";
    auto [c5, cs] = Meshlearn("--json chain status --rpc " + urls[i], home);
    ASSERT_EQ(c5, 0) << ReadAll(home + "/stderr.txt");
    ASSERT_TRUE(cs["cluster"].is_object()) << cs.dump();
    if (cs["cluster"]["leading"].get<bool>()) {
      ++leaders;
      EXPECT_GE(cs["cluster"]["takeover_count"].get<int>(), 1) << cs.dump();
      leader_key = cs["sequencer_key"].get<std::string>();
    }
  }
  EXPECT_EQ(leaders, 1);
  // The standby names it (it reads etcd's leader record every 50 ms: wait for the next read).
  for (size_t i = 0; i < 3; ++i) {
    if (static_cast<int>(i) == killed) continue;
    json cs;
    for (int t = 0; t < 100; ++t) {
      auto [c6, answer] = Meshlearn("--json chain status --rpc " + urls[i], home);
      ASSERT_EQ(c6, 0);
      cs = answer;
      if (cs["cluster"]["leader"] == leader_key) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(cs["cluster"]["leader"], leader_key) << cs.dump();
  }
  // The text form says who leads.
  auto [c7, text] = testing::RunShell("MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN +
                                      " chain status" + rpc + " 2>&1");
  EXPECT_EQ(c7, 0) << text;
  EXPECT_NE(text.find("leader:       "), std::string::npos) << text;
  EXPECT_NE(text.find("takeovers:    "), std::string::npos) << text;
  for (size_t i = 0; i < 3; ++i) {
    if (static_cast<int>(i) == killed) continue;
    kill(pids[i], SIGTERM);
    int status = 0;
    waitpid(pids[i], &status, 0);
    // Its last line: what it saw as a candidate (--json).
    std::string log = ReadAll(home + "/c" + std::to_string(i) + "/serve.log");
    json stopped;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("stopped_at")) stopped = j;
    }
    ASSERT_TRUE(stopped.is_object()) << log;
    EXPECT_TRUE(stopped["cluster"]["takeovers"].is_array()) << log;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << ReadAll(home + "/c" + std::to_string(i) + "/serve.log");
  }
}

}  // namespace
}  // namespace meshlearn::ledger
