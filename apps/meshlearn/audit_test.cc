// End-to-end test of `meshlearn task audit` (cmd_task_audit.cc) against a real devnet (a ledger
// and nodes as processes on loopback, `meshlearn devnet --keep`) training tests/devnet-tiny.toml:
// an open task is refused, the finished task's full audit PASSes from a fresh home (bundle, data
// and states fetched from the nodes), a seeded sample PASSes, and an unknown id, a bad id and an
// unreachable ledger give clear errors. And `--prove` as a real process (TaskAuditProve): a lazy
// solver whose checks only rubber-stamping verifiers draw escapes them; the audit finds its units,
// proves one on chain (ProveFraud; with --witness-limit 0 a LateChallenge whose game, after the
// audit is killed, `--resume-games` plays to its ruling), and the ledger slashes and jails the
// solver and pays the auditor the bounty. Audits that FAIL on a wrong recorded hash are tested in
// process: node/src/task_audit_test.cc.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::Child;
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
  EXPECT_NE(help.out.find("--witness-limit 0"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--resume-games --key alice"), std::string::npos) << help.out;
  // Refused before any network, each with its exit status (2: a usage error, as CLI11 reports
  // it) and the words that name the fix: --resume-games audits nothing; --witness-limit is for
  // --prove, and at most the ledger's; --prove signs with --key, and each needs the other.
  struct Refusal {
    std::string args;
    int code;
    std::string says;
  };
  const std::vector<Refusal> refusals = {
      {"--resume-games --full --key alice", 2, "--full excludes --resume-games"},
      {"--resume-games", 1, "--resume-games needs --key NAME"},
      {"--witness-limit 0", 1, "--witness-limit is only used with --prove"},
      {"--prove --key alice --witness-limit 8388609", 1,
       "over the ledger's limit of 8388608 bytes"},
      {"--full --prove", 1, "--prove needs --key NAME"},
      {"--key alice", 1, "--key alice is only used with --prove"},
  };
  for (const Refusal& r : refusals) {
    CmdResult c = Meshlearn(
        "task audit " + std::string(64, 'a') + " " + r.args + " --rpc http://127.0.0.1:9", home);
    EXPECT_EQ(c.code, r.code) << r.args << "\n" << c.out;
    EXPECT_NE(c.out.find(r.says), std::string::npos) << r.args << "\n" << c.out;
  }

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

// `meshlearn devnet --keep` training tests/devnet-tiny.toml on one lazy solver (node0) whose
// units only two rubber-stamping verifiers check (no forced errors: nothing catches them), so the
// task finishes with every unit a cheat, paid; the network stays up. `extra` adds flags.
class CheatingDevnet {
 public:
  explicit CheatingDevnet(const std::string& what, const std::vector<std::string>& extra = {})
      : dir_(TempDir(what) + "/d"), log_(dir_ + ".out") {
    pid_ = fork();
    if (pid_ == 0) {
      setenv("MESHLEARN_HOME", (dir_ + "-home").c_str(), 1);
      FILE* f = freopen(log_.c_str(), "w", stderr);
      FILE* o = freopen("/dev/null", "w", stdout);
      (void)f, (void)o;
      std::vector<std::string> args = {MESHLEARN_BIN};
      std::istringstream flags(
          "devnet --solvers 1 --verifiers 2 --adversary solver:lazy --adversary "
          "verifier:rubber_stamp --adversary verifier:rubber_stamp --forced-errors 0 --task "
          "tests/devnet-tiny.toml --block-interval-ms 200 --keep --no-check-reference --timeout "
          "240");
      for (std::string flag; flags >> flag;) args.push_back(flag);
      args.insert(args.end(), {"--out", dir_});
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(MESHLEARN_BIN, argv.data());
      _exit(127);
    }
    rpc_ = "http://127.0.0.1:" + WaitFor(log_, "ledger at http://127.0.0.1:", "0123456789", 60);
    id_ = WaitFor(log_, "task ", "0123456789abcdef", 120, /*min_len=*/64);
    up_ = !WaitFor(log_, "the network stays up", "", 240).empty();
  }
  ~CheatingDevnet() {
    if (pid_ > 0) kill(pid_, SIGINT), waitpid(pid_, nullptr, 0);
    // The devnet's logs when the test failed: which proof, move and ruling landed when.
    if (!::testing::Test::HasFailure()) return;
    std::printf("---- %s\n%s", log_.c_str(), ReadText(log_).c_str());
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/logs", ec)) {
      std::printf("---- %s\n%s", e.path().c_str(), ReadText(e.path().string()).c_str());
    }
  }
  CheatingDevnet(const CheatingDevnet&) = delete;
  CheatingDevnet& operator=(const CheatingDevnet&) = delete;

  // The ledger's URL ("http://127.0.0.1:" and a port), the task's id, and the task finished.
  bool up() const { return up_ && rpc_.size() > 17 && id_.size() == 64; }
  const std::string& rpc() const { return rpc_; }
  const std::string& id() const { return id_; }
  const std::string& dir() const { return dir_; }
  std::string log() const { return ReadText(log_); }

  // `meshlearn --json wallet balance` of the lazy solver's node key (its home is the devnet's
  // node0/): the account, with the node's status and earnings.
  json Solver() const {
    CmdResult b = Meshlearn("--json wallet balance --key node --rpc " + rpc_, dir_ + "/node0",
                            /*with_stderr=*/false);
    return json::parse(b.out, nullptr, false);
  }

 private:
  std::string dir_;
  std::string log_;
  pid_t pid_ = -1;
  std::string rpc_;
  std::string id_;
  bool up_ = false;
};

// A fresh home with key `name` (unencrypted), funded from the devnet's faucet; its public key.
std::string FundedKey(const std::string& home, const std::string& name, const std::string& rpc) {
  CmdResult k = Meshlearn("--json keys new " + name + " --no-passphrase", home, false);
  json kj = json::parse(k.out, nullptr, false);
  if (k.code != 0 || kj.is_discarded()) return "";
  if (Meshlearn("wallet faucet 100000 --key " + name + " --rpc " + rpc, home).code != 0) return "";
  return kj.value("public_key", std::string());
}

uint64_t BalanceOf(const std::string& home, const std::string& name, const std::string& rpc) {
  CmdResult b = Meshlearn("--json wallet balance --key " + name + " --rpc " + rpc, home, false);
  json j = json::parse(b.out, nullptr, false);
  return j.is_discarded() ? 0 : j.value("balance", uint64_t{0});
}

// The whole audit as a real process: it finds the lazy units, sends each one's ProveFraud; the
// first is executed (the solver slashed and jailed, the auditor paid the bounty, the task
// reopened within its audit window) and the rest are refused while their units run again.
TEST(TaskAuditProve, AFullAuditProvesALazySolversUnitOnChainAndIsPaidTheBounty) {
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  CheatingDevnet net("audit-prove");
  ASSERT_TRUE(net.up()) << net.log();
  const std::string auditor = net.dir() + "-auditor";
  const std::string pub = FundedKey(auditor, "auditor", net.rpc());
  ASSERT_EQ(pub.size(), 64u);
  const uint64_t before = BalanceOf(auditor, "auditor", net.rpc());
  ASSERT_EQ(before, 100000u);
  json solver = net.Solver();
  ASSERT_FALSE(solver.is_discarded());
  ASSERT_EQ(solver["node"]["status"], "active") << solver.dump(2);
  ASSERT_EQ(solver["node"]["earnings"]["slashed"], 0) << solver.dump(2);

  CmdResult audit = Meshlearn("--json task audit " + net.id().substr(0, 12) +
                                  " --full --prove --key auditor --rpc " + net.rpc(),
                              auditor, /*with_stderr=*/false);
  EXPECT_EQ(audit.code, 1) << audit.out;  // FAIL: the lazy units do not replay
  json j = json::parse(audit.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << audit.out;
  EXPECT_EQ(j["verdict"], "FAIL") << j.dump(2);
  json proven;
  int failed = 0, refused = 0;
  for (const json& u : j["units"]) {
    if (u["check"] != "fail") continue;
    ++failed;
    ASSERT_TRUE(u.contains("proof")) << u.dump(2);
    const json& p = u["proof"];
    EXPECT_TRUE(p.value("sent", false)) << p.dump(2);   // every one reached the ledger
    EXPECT_FALSE(p.value("late", false)) << p.dump(2);  // a tiny MLP's witness fits a tx
    if (p.value("ok", false)) {
      EXPECT_TRUE(proven.is_null()) << "a second proof executed: " << p.dump(2);
      proven = p;
    } else {
      // Its unit was taken back by the first proof's rewind: it runs again.
      ++refused;
      EXPECT_NE(p.value("error", std::string()).find("the ledger refused the proof"),
                std::string::npos)
          << p.dump(2);
      EXPECT_NE(p.value("error", std::string()).find("is not final yet"), std::string::npos)
          << p.dump(2);
      // Nor committed to: a commitment's deposit would be held until it expired.
      EXPECT_NE(p.value("commit_error", std::string()).find("no longer paid work"),
                std::string::npos)
          << p.dump(2);
    }
  }
  // Every unit re-executed is the lazy solver's: round 0's four at least (the later rounds only
  // where a node still serves the lazy deltas their start states were aggregated from).
  EXPECT_GE(failed, 4) << j.dump(2);
  EXPECT_EQ(refused, failed - 1);
  ASSERT_FALSE(proven.is_null()) << j.dump(2);
  EXPECT_GT(proven.value("slashed", uint64_t{0}), 0u) << proven.dump(2);
  EXPECT_GT(proven.value("bounty", uint64_t{0}), 0u) << proven.dump(2);
  EXPECT_TRUE(proven.value("rewound", false)) << proven.dump(2);  // within the audit window
  ASSERT_EQ(j["proven_frauds"].size(), 1u) << j.dump(2);
  EXPECT_EQ(j["proven_frauds"][0]["prover"], pub) << j.dump(2);

  // The ledger, read by other commands: the solver slashed what the proof says and jailed, the
  // auditor paid the bounty (fees are 0 on a devnet; its commitment's deposit back, and none held
  // for the refused proofs).
  solver = net.Solver();
  EXPECT_EQ(solver["node"]["status"], "jailed") << solver.dump(2);
  EXPECT_EQ(solver["node"]["earnings"]["slashed"], proven["slashed"]) << solver.dump(2);
  EXPECT_EQ(BalanceOf(auditor, "auditor", net.rpc()), before + proven.value("bounty", uint64_t{0}));
  CmdResult status = Meshlearn("--json task status " + net.id() + " --rpc " + net.rpc(), auditor,
                               /*with_stderr=*/false);
  json st = json::parse(status.out, nullptr, false);
  ASSERT_FALSE(st.is_discarded()) << status.out;
  EXPECT_EQ(st["verification"]["proven_frauds"].size(), 1u) << st.dump(2);
}

// --witness-limit 0: the proof goes late (LateChallenge with a bond) and the audit plays the
// game; killed while it plays, `--resume-games` with the same key plays the game on to its
// ruling, for the challenger (the lazy solver lied): slashed and jailed, the bond back and the
// bounty paid. A wrong key, and a resume with no game open, are clear errors.
TEST(TaskAuditProve, AStoppedChallengersLateGameIsResumedAndRuledForIt) {
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  // Turns of at least 30 s: the challenger is stopped between two of its moves, and the resume
  // must come within its turn (a silent challenger loses its bond).
  CheatingDevnet net("audit-late", {"--dispute-window-ms", "30000"});
  ASSERT_TRUE(net.up()) << net.log();
  const std::string auditor = net.dir() + "-auditor";
  ASSERT_EQ(FundedKey(auditor, "auditor", net.rpc()).size(), 64u);
  ASSERT_EQ(FundedKey(auditor, "other", net.rpc()).size(), 64u);
  const uint64_t before = BalanceOf(auditor, "auditor", net.rpc());

  {
    // One sampled unit (every unit is the lazy solver's; a sample may re-execute more where it
    // rebuilds a start state no node serves), proven late; stopped (kill -9) once the audit plays
    // the game.
    const std::string out = net.dir() + "-audit.out";
    Child audit(auditor, out,
                {"task", "audit", net.id(), "--sample", "1", "--seed", "1", "--prove", "--key",
                 "auditor", "--witness-limit", "0", "--rpc", net.rpc()},
                SIGKILL);
    ASSERT_FALSE(WaitFor(out, "playing the challenger's side of ", "", 120).empty())
        << ReadText(out);
  }
  CmdResult status = Meshlearn("--json task status " + net.id() + " --rpc " + net.rpc(), auditor,
                               /*with_stderr=*/false);
  json st = json::parse(status.out, nullptr, false);
  ASSERT_FALSE(st.is_discarded()) << status.out;
  const size_t open = st["verification"]["late_games"].size();
  ASSERT_GE(open, 1u) << st.dump(2);
  EXPECT_LT(BalanceOf(auditor, "auditor", net.rpc()), before);  // the bond is up

  // Another key challenged nothing.
  CmdResult wrong = Meshlearn(
      "task audit " + net.id() + " --resume-games --key other --rpc " + net.rpc(), auditor);
  EXPECT_EQ(wrong.code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("has key 'other'"), std::string::npos) << wrong.out;
  EXPECT_NE(wrong.out.find("pass the key that sent the LateChallenge"), std::string::npos)
      << wrong.out;

  CmdResult resumed = Meshlearn(
      "--json task audit " + net.id() + " --resume-games --key auditor --rpc " + net.rpc(), auditor,
      /*with_stderr=*/false);
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  json r = json::parse(resumed.out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << resumed.out;
  ASSERT_EQ(r["games"].size(), open) << r.dump(2);
  // The first game ruled proves the solver lied, and its rewind takes back every other unit the
  // games are on (moot: their bonds back).
  json game;
  for (const json& g : r["games"]) {
    EXPECT_GT(g.value("bond", uint64_t{0}), 0u) << g.dump(2);
    if (!g.value("proven", false)) {
      EXPECT_EQ(g["ruled"], "moot") << g.dump(2);
      continue;
    }
    EXPECT_TRUE(game.is_null()) << "a second game proven: " << r.dump(2);
    game = g;
  }
  ASSERT_FALSE(game.is_null()) << r.dump(2);
  EXPECT_EQ(game["ruled"], "challenger") << game.dump(2);
  EXPECT_GT(game.value("bounty", uint64_t{0}), 0u) << game.dump(2);

  json solver = net.Solver();
  EXPECT_EQ(solver["node"]["status"], "jailed") << solver.dump(2);
  EXPECT_EQ(solver["node"]["earnings"]["slashed"], game["slashed"]) << solver.dump(2);
  // The bonds back and the bounty.
  EXPECT_EQ(BalanceOf(auditor, "auditor", net.rpc()), before + game.value("bounty", uint64_t{0}));

  // Nothing is open any more.
  CmdResult again = Meshlearn(
      "task audit " + net.id() + " --resume-games --key auditor --rpc " + net.rpc(), auditor);
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_NE(again.out.find("has no open late game: nothing to resume"), std::string::npos)
      << again.out;
}

}  // namespace
