// End-to-end test of `meshlearn task audit` (cmd_task_audit.cc) against a real devnet (a ledger
// and nodes as processes on loopback, `meshlearn devnet --keep`) training tests/devnet-tiny.toml:
// an open task is refused, the finished task's full audit PASSes from a fresh home (bundle, data
// and states fetched from the nodes), a seeded sample PASSes, and an unknown id, a bad id and an
// unreachable ledger give clear errors. Audits that FAIL (a lazy solver, a wrong recorded hash) are
// tested in process: node/src/task_audit_test.cc.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
using meshlearn::process_test::TempDir;
using meshlearn::process_test::WaitFor;

using nlohmann::json;

TEST(TaskAudit, HelpAndBadInputs) {
  const std::string home = TempDir("audit");
  CmdResult help = Meshlearn("task audit --help", home);
  EXPECT_EQ(help.code, 0) << help.out;
  EXPECT_NE(help.out.find("Examples"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--full"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--seed"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--full --prove --key alice"), std::string::npos) << help.out;
  // --prove signs with --key; each without the other is refused before any network.
  CmdResult no_key = Meshlearn("task audit " + std::string(64, 'a') +
                                   " --full --prove --rpc "
                                   "http://127.0.0.1:9",
                               home);
  EXPECT_EQ(no_key.code, 1);
  EXPECT_NE(no_key.out.find("--prove needs --key NAME"), std::string::npos) << no_key.out;
  CmdResult key_alone = Meshlearn("task audit " + std::string(64, 'a') +
                                      " --key alice --rpc "
                                      "http://127.0.0.1:9",
                                  home);
  EXPECT_EQ(key_alone.code, 1);
  EXPECT_NE(key_alone.out.find("--key alice is only used with --prove"), std::string::npos)
      << key_alone.out;

  // Not hex at all: refused before any network. (A hex prefix like 12ab is a valid id prefix,
  // resolved by the ledger.)
  CmdResult bad_id = Meshlearn("task audit 12xz --rpc http://127.0.0.1:9", home);
  EXPECT_EQ(bad_id.code, 1);
  EXPECT_NE(bad_id.out.find("task id: expected hex digits"), std::string::npos) << bad_id.out;
  // No ledger listens there.
  CmdResult down =
      Meshlearn("task audit " + std::string(64, 'a') + " --rpc http://127.0.0.1:9", home);
  EXPECT_EQ(down.code, 1);
  EXPECT_NE(down.out.find("cannot reach the ledger"), std::string::npos) << down.out;
  EXPECT_NE(down.out.find("--rpc"), std::string::npos) << down.out;
}

TEST(TaskAudit, DevnetTaskPassesFullAndSampledAuditsAndBadInputsAreClear) {
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  const std::string dir = TempDir("audit") + "/d";  // removed when the tests pass
  const std::string log = dir + ".out";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (dir + "-home").c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    FILE* o = freopen("/dev/null", "w", stdout);
    (void)f, (void)o;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "2", "--task",
          "tests/devnet-tiny.toml", "--block-interval-ms", "200", "--keep", "--no-check-reference",
          "--timeout", "240", "--out", dir.c_str(), (char*)nullptr);
    _exit(127);
  }
  struct Stop {  // the devnet goes down whatever this test does
    pid_t pid;
    ~Stop() {
      if (pid > 0) kill(pid, SIGINT), waitpid(pid, nullptr, 0);
    }
  } stop{pid};

  const std::string rpc =
      "http://127.0.0.1:" + WaitFor(log, "ledger at http://127.0.0.1:", "0123456789", 60);
  const std::string id = WaitFor(log, "task ", "0123456789abcdef", 120, /*min_len=*/64);
  ASSERT_FALSE(rpc.empty() || id.empty()) << ReadText(log);
  const std::string auditor = dir + "-auditor";  // a fresh home: everything comes from the nodes

  // Still training: refused, with what to do.
  CmdResult open = Meshlearn("task audit " + id + " --rpc " + rpc, auditor);
  EXPECT_EQ(open.code, 1) << open.out;
  EXPECT_NE(open.out.find("still open"), std::string::npos) << open.out;

  ASSERT_FALSE(WaitFor(log, "the network stays up", "", 240).empty()) << ReadText(log);

  CmdResult full = Meshlearn("--json task audit " + id + " --full --rpc " + rpc, auditor,
                             /*with_stderr=*/false);
  ASSERT_EQ(full.code, 0) << full.out;
  json j = json::parse(full.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << full.out;
  EXPECT_EQ(j["verdict"], "PASS") << j.dump(2);
  EXPECT_EQ(j["units_executed"], 12);
  ASSERT_EQ(j["chain"].size(), 5u);  // initial, 3 rounds, final
  for (const json& s : j["chain"]) EXPECT_EQ(s["check"], "pass") << s.dump();
  for (const json& u : j["units"]) EXPECT_EQ(u["check"], "pass") << u.dump();

  CmdResult sample = Meshlearn("task audit " + id + " --sample 2 --seed 7 --rpc " + rpc, auditor);
  EXPECT_EQ(sample.code, 0) << sample.out;
  EXPECT_NE(sample.out.find("PASS (sample)"), std::string::npos) << sample.out;
  EXPECT_NE(sample.out.find("seed 7"), std::string::npos) << sample.out;
  EXPECT_NE(sample.out.find("initial "), std::string::npos) << sample.out;

  CmdResult unknown = Meshlearn("task audit " + std::string(64, 'a') + " --rpc " + rpc, auditor);
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.out.find("is not on the ledger"), std::string::npos) << unknown.out;

  kill(pid, SIGINT);  // --keep: Ctrl-C stops the network; devnet then finishes normally
  int status = 0;
  waitpid(pid, &status, 0);
  stop.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadText(log);
}

}  // namespace
