// End-to-end tests of `meshlearn devnet` with real processes on loopback (a ledger and nodes), on
// the tiny task tests/devnet-tiny.toml, and of `meshlearn task submit` refusing bad task files
// before anything is escrowed.
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

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
std::string TempDir() { return meshlearn::process_test::TempDir("devnet"); }

using nlohmann::json;

bool HaveFashion() {
  return std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good();
}

json ReadReport(const std::string& dir) {
  std::ifstream in(dir + "/report.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

// No process of a devnet may outlive it.
void ExpectNoOrphans(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    EXPECT_EQ(cmdline.find(dir + "/"), std::string::npos)
        << "still running: pid " << name << ": " << cmdline;
    // A process started with relative paths names no `dir` on its command line: its working
    // directory does.
    std::error_code ec;
    const std::string cwd = std::filesystem::read_symlink(e.path() / "cwd", ec).string();
    if (!ec && !cmdline.empty()) {
      EXPECT_NE(cwd.rfind(dir, 0), 0u)
          << "still running in " << cwd << ": pid " << name << ": " << cmdline;
    }
  }
}

// Prints the devnet's logs (dir/logs: the chain's and every node's, a few KB each) when the test
// has failed by the time it goes out of scope, so a failure seen only in CI says what the
// network did (which check ran, which proof landed when) instead of only the failed assertion.
class LogsOnFailure {
 public:
  explicit LogsOnFailure(std::string dir) : dir_(std::move(dir)) {}
  ~LogsOnFailure() {
    if (!::testing::Test::HasFailure()) return;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/logs", ec)) {
      std::printf("---- %s\n%s", e.path().c_str(), ReadText(e.path().string()).c_str());
    }
    if (ec) std::printf("---- no logs under %s/logs: %s\n", dir_.c_str(), ec.message().c_str());
  }

 private:
  std::string dir_;
};

// Runs `command` (a shell command line) in the working directory `cwd`; stdout and stderr
// together.
[[maybe_unused]] CmdResult RunIn(const std::string& cwd, const std::string& command) {
  return Shell("cd '" + cwd + "' && " + command + " 2>&1");
}

// The main job's command line as scripts/run.sh writes it: the `exec "$bin" devnet ...` line
// (continuations joined) with "$bin" and "$out" filled in from the script and "$@" empty.
[[maybe_unused]] std::string RunShDevnetCommand() {
  std::string script = ReadText(MESHLEARN_SOURCE_DIR "/scripts/run.sh");
  for (size_t p; (p = script.find("\\\n")) != std::string::npos;) script.replace(p, 2, " ");
  std::istringstream lines(script);
  std::string line, out, exec;
  while (std::getline(lines, line)) {
    if (line.rfind("out=", 0) == 0) out = line.substr(4);
    if (line.rfind("exec \"$bin\" devnet", 0) == 0) exec = line;
  }
  if (out.empty() || exec.empty()) return "";
  auto replace = [&](const std::string& from, const std::string& to) {
    for (size_t p; (p = exec.find(from)) != std::string::npos;) exec.replace(p, from.size(), to);
  };
  replace("exec \"$bin\"", MESHLEARN_BIN);
  replace("\"$out\"", out);
  replace("\"$@\"", "");
  return exec;
}

void CheckCommon(const json& r, int rounds = 3) {
  ASSERT_FALSE(r.is_discarded());
  EXPECT_EQ(r["rounds"], rounds);
  EXPECT_EQ(r["units_committed"], 4 * rounds);
  // Every committed unit was paid, and nothing else was.
  EXPECT_EQ(r["units_paid"], r["units_committed"]);
  EXPECT_EQ(r["committed_unpaid"], 0);
  EXPECT_TRUE(r["matches_reference"].get<bool>()) << r.dump(2);
  ASSERT_FALSE(r["token_invariant"].is_null()) << "chain_status has no totals";
  EXPECT_TRUE(r["token_invariant"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["spent"].get<uint64_t>() + r["refunded"].get<uint64_t>(),
            r["budget"].get<uint64_t>());
  // One money vocabulary (docs/submitters.md): spent is what solvers, verifiers and aggregators
  // were paid; what the solvers were paid is what the nodes' units were paid.
  const json& m = r["money"];
  EXPECT_EQ(m["spent"], r["spent"]);
  EXPECT_EQ(m["spent"].get<uint64_t>(), m["paid_to_solvers"].get<uint64_t>() +
                                            m["paid_to_verifiers"].get<uint64_t>() +
                                            m["paid_to_aggregators"].get<uint64_t>())
      << m.dump(2);
  uint64_t units = 0, aggregation = 0, verification = 0;
  for (const json& n : r["nodes"]) {
    units += n["paid_for_units"].get<uint64_t>();
    aggregation += n["paid_for_aggregation"].get<uint64_t>();
    verification += n["paid_for_verification"].get<uint64_t>();
  }
  EXPECT_EQ(units, m["paid_to_solvers"].get<uint64_t>()) << r.dump(2);
  EXPECT_EQ(aggregation, m["paid_to_aggregators"].get<uint64_t>()) << r.dump(2);
  // Each node's verification pay, as the ledger records it on the node, adds up to the task's.
  EXPECT_EQ(verification, m["paid_to_verifiers"].get<uint64_t>()) << r.dump(2);
  // The file devnet wrote is the model the ledger recorded, by the weights hash.
  EXPECT_EQ(r["final_weights_hash"].get<std::string>().size(), 64u);
  EXPECT_EQ(r["final_state"].get<std::string>().size(), 64u);
}

TEST(Devnet, TinyTaskFinishesPaysCommittedUnitsAndEqualsReference) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  CmdResult r = Meshlearn(
      "--json devnet --solvers 4 --task tests/devnet-tiny.toml --block-interval-ms 200 "
      "--timeout 300 --out " +
          dir,
      dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  CheckCommon(rep);
  ExpectNoOrphans(dir);
}

// A pipeline task (issue 15) through the real processes: the ledger places 2 replicas x 3 stages
// on 6 node daemons, the stages exchange activations over their data planes, the aggregator
// combines the replicas stage by stage, and the final weights are `meshlearn diloco`'s, bit for
// bit. (Stage units are not verified yet: --no-verification; a verifying chain refuses the task.)
// The pipeline task on six stage nodes that each offer 400 KiB to training (--memory-limit), and
// a seventh node without the limit that aggregates: every stage fits (its heaviest needs 320,768
// bytes), the final weights are the in-process reference's, and report.json's pipeline section
// adds up to what the nodes' /metrics say.
TEST(Devnet, APipelineTaskTrainsOnStageNodesToTheReference) {
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  CmdResult r = Meshlearn(
      "--json devnet --solvers 6 --task tests/devnet-pipeline.toml "
      "--block-interval-ms 200 --no-verification --timeout 300 "
      "--memory-limit 400K --out " +
          dir,
      dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  ASSERT_FALSE(rep.is_discarded());
  EXPECT_TRUE(rep["matches_reference"].get<bool>()) << rep.dump(2);
  EXPECT_EQ(rep["units"], 12) << "2 rounds x 2 replicas x 3 stages";
  EXPECT_EQ(rep["units_paid"], rep["units_committed"]) << rep.dump(2);
  int with_units = 0;
  uint64_t bytes_sent = 0;
  ASSERT_EQ(rep["nodes"].size(), 7u) << "6 solvers under the limit and one aggregator";
  for (const json& n : rep["nodes"]) {
    EXPECT_GT(n["peak_rss_bytes"].get<uint64_t>(), 0u) << n.dump();
    if (n["roles"] == "aggregator") continue;
    EXPECT_EQ(n["roles"], "solver") << "a node under the limit does not aggregate";
    with_units += n["units"].get<int>() > 0;
    EXPECT_GT(n["stage_bytes_sent"].get<uint64_t>(), 0u) << "every stage sends to a neighbour";
    EXPECT_LE(n["stage_seconds_waiting"].get<double>(), n["stage_seconds_running"].get<double>());
    bytes_sent += n["stage_bytes_sent"].get<uint64_t>();
  }
  EXPECT_EQ(with_units, 6) << "every stage node took a stage";
  // The train loss shown is the last stages' (the others compute none): not diluted by their
  // zeros, which once showed a third of it.
  const double train = rep["metric"]["train_loss"].get<double>();
  const double test = rep["metric"]["test_loss"].get<double>();
  EXPECT_GT(train, 0.5 * test) << rep["metric"].dump();
  EXPECT_LT(train, 2.0 * test) << rep["metric"].dump();
  const json& p = rep["pipeline"];
  EXPECT_EQ(p["stages"], 3) << p.dump();
  EXPECT_EQ(p["replicas"], 2);
  EXPECT_EQ(p["micro_batches"], 2);
  EXPECT_EQ(p["memory_limit_bytes"], 400 * 1024);
  ASSERT_EQ(p["stage_memory_bytes"].size(), 3u);
  for (const json& m : p["stage_memory_bytes"]) EXPECT_LE(m.get<uint64_t>(), 400u * 1024);
  EXPECT_EQ(p["bytes_activations"].get<uint64_t>(), bytes_sent);
  EXPECT_DOUBLE_EQ(p["bubble_fraction_schedule"].get<double>(), 0.5) << "(S-1)/(M+S-1) = 2/4";
  EXPECT_GT(p["bubble_fraction"].get<double>(), 0.0);
  EXPECT_LT(p["bubble_fraction"].get<double>(), 1.0);
  // The single node's figure is what `meshlearn diloco` read of itself (reference/report.json),
  // not wait4's ru_maxrss of the child, which counted the devnet's memory at the fork.
  const json ref = json::parse(ReadText(dir + "/reference/report.json"), nullptr, false);
  ASSERT_TRUE(ref.is_object()) << ReadText(dir + "/reference/report.json");
  EXPECT_GT(ref["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(p["single_node_peak_rss_bytes"], ref["peak_rss_bytes"]) << p.dump();
  ExpectNoOrphans(dir);
}

// The pipeline task on a verifying chain with a lazy stage node among 7 (R x S = 6 stage units a
// round, and one more node for the re-run once the cheater is jailed): a verifier replays the lazy
// stage's step, the dispute names the stage, the step and what differs, the lazy node alone is
// slashed and jailed, and the final weights are the honest in-process run's. Too few solvers for
// the re-run is refused up front. The devnet runs no referee service: a party's own RefereeTile
// rules the dispute, and the report lists that ruling, read from the chain (it once listed only
// the referee service's transactions, and so showed none when a party ruled first).
TEST(Devnet, ALazyStageOnAVerifyingChainIsSlashedAndTheModelIsTheReference) {
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  CmdResult few = Meshlearn(
      "devnet --solvers 6 --task tests/devnet-pipeline.toml "
      "--adversary solver:lazy --out " +
          dir,
      dir + "-home");
  EXPECT_NE(few.code, 0);
  EXPECT_NE(few.out.find("--solvers 6: the task's rounds are 2 replicas x 3 stages"),
            std::string::npos)
      << few.out;
  EXPECT_NE(few.out.find("pass --solvers 7"), std::string::npos) << few.out;
  // 7 nodes for 6 stage units a round: one is left out of each round. The honest ones report 0.9x
  // the machine's throughput, so the lazy one (node6, the fastest) always takes a stage.
  CmdResult r = Meshlearn(
      "--json devnet --solvers 7 --task tests/devnet-pipeline.toml "
      "--block-interval-ms 200 --timeout 300 --adversary solver:lazy --no-referee-service "
      "--speed 0=0.9 --speed 1=0.9 --speed 2=0.9 --speed 3=0.9 --speed 4=0.9 "
      "--speed 5=0.9 --out " +
          dir,
      dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  ASSERT_FALSE(rep.is_discarded());
  EXPECT_TRUE(rep["matches_reference"].get<bool>()) << rep.dump(2);
  const json& v = rep["verification"];
  ASSERT_TRUE(v.value("enabled", false));
  EXPECT_GE(v["checks"]["fraud"].get<int>(), 1) << v.dump(2);
  ASSERT_EQ(v["slashed"].size(), 1u) << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["adversary"], "lazy");
  EXPECT_EQ(v["slashed"][0]["status"], "jailed");
  ASSERT_GE(v["disputes_ruled"].size(), 1u) << v.dump(2);
  const json& ruling = v["disputes_ruled"][0];
  EXPECT_EQ(ruling["for"], "challenger") << ruling.dump();
  EXPECT_TRUE(ruling.contains("stage") && ruling.contains("replica")) << ruling.dump();
  // The ledger ruled it itself; no RuleDispute was needed (the genesis key's is refused for it).
  // A lazy stage commits each step's state_after as its state_before while it trains on, so which
  // ruling depends on the step the beacon drew for the check: step 0 is replayed, and the
  // verifier's mismatch carried the task bundle (a GPT stage), so the game was played over the
  // stage's plan and ruled by RefereeTile (the agreed chain end's roots against the committed
  // commit, a few KiB); a later step does not start where the step before it ended, a continuity
  // claim ruled by RefereeStageStep from the two commits.
  // Each was sent by a node of the devnet (no referee service ran) and is named by its block and
  // transaction.
  for (const json& d : v["disputes_ruled"]) {
    EXPECT_TRUE(d["tx"] == "RefereeTile" || d["tx"] == "RefereeStageStep") << d.dump();
    EXPECT_GT(d["witness_bytes"].get<uint64_t>(), 0u) << d.dump();
    EXPECT_LE(d["witness_bytes"].get<uint64_t>(), 256u << 10) << d.dump();
    EXPECT_EQ(d["sender_is"].get<std::string>().rfind("node", 0), 0u) << d.dump();
    EXPECT_GT(d["height"].get<uint64_t>(), 0u) << d.dump();
    EXPECT_EQ(d["tx_id"].get<std::string>().size(), 64u) << d.dump();
  }
  // The ruling for the challenger names the lazy node as the defender.
  EXPECT_EQ(ruling["defender"], v["slashed"][0]["node"]) << ruling.dump();
  EXPECT_EQ(v["referee_attempts"].size(), 0u) << v.dump(2);
  ExpectNoOrphans(dir);
}

// A memory limit no node could train the task under is refused before anything starts, naming
// the stage (or the unit) that does not fit and the fix; so is a limit that is not a size.
TEST(Devnet, AMemoryLimitThatNothingFitsIsRefusedUpFront) {
  const std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  struct Case {
    std::string args, want;
  } cases[] = {
      {"--task tests/devnet-pipeline.toml --solvers 6 --no-verification --memory-limit 100K",
       "below the heaviest of the task's 3 stages (338688 bytes)"},
      {"--task tests/devnet-tiny.toml --memory-limit 1K", "below what one unit of the task needs"},
      {"--task tests/devnet-tiny.toml --memory-limit 12X", "--memory-limit is '12X'"},
      {"--task tests/devnet-tiny.toml --memory-limit 0", "--memory-limit is '0'"},
      {"--task tests/devnet-tiny.toml --memory-limit 99999999999G", "--memory-limit is"},
  };
  for (const Case& c : cases) {
    if (c.args.find("devnet-tiny") != std::string::npos && !HaveFashion()) continue;
    CmdResult r = Meshlearn("devnet " + c.args + " --out " + dir, dir + "-home");
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing made for " << c.args;
  }
}

// The README's first command, as a newcomer runs it: scripts/run.sh's devnet command line, flags
// and relative --out exactly as the script writes them, from a fresh working directory, on the
// tiny task placed where the script's task file is. A relative --out once made every node read
// its data_dir against the wrong folder, make a second, unfunded key and never register, while
// every test (all with absolute directories) passed.
TEST(Devnet, TheMainJobAsScriptsRunShWritesIt) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string command = RunShDevnetCommand();
  ASSERT_NE(command, "") << "scripts/run.sh has no `exec \"$bin\" devnet` line or no out=";
  ASSERT_NE(command.find("--out out/devnet"), std::string::npos) << command;
  ASSERT_NE(command.find("--adversary solver:lazy"), std::string::npos) << command;
  ASSERT_NE(command.find("--assurance full"), std::string::npos) << command;
  const std::string cwd = TempDir();
  std::filesystem::create_directories(cwd + "/examples");
  std::filesystem::create_directories(cwd + "/out");  // run.sh: mkdir -p out
  std::filesystem::copy_file(MESHLEARN_SOURCE_DIR "/tests/devnet-tiny.toml",
                             cwd + "/examples/fashion-mlp.toml");
  CmdResult r = RunIn(cwd, "MESHLEARN_HOME=home " + command + " --timeout 300");
  ASSERT_EQ(r.code, 0) << command << "\n" << r.out;
  EXPECT_NE(r.out.find("(= the in-process reference)"), std::string::npos) << r.out;
  json rep = ReadReport(cwd + "/out/devnet");
  CheckCommon(rep);
  // The hash printed beside the weights hash is the task's final state (the blob id the ledger
  // recorded for it), not a hash of the ledger's state: named so.
  EXPECT_NE(r.out.find("; final state " + rep["final_state"].get<std::string>() + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("ledger state"), std::string::npos) << r.out;
  const json& v = rep["verification"];
  EXPECT_EQ(v["assurance"], "full") << v.dump(2);
  ASSERT_EQ(v["slashed"].size(), 1u) << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["adversary"], "lazy");
  EXPECT_GT(v["slashed"][0]["amount"].get<uint64_t>(), 0u);
  // Every node used the one data directory devnet made for it: no node made a second one (with
  // a second, unfunded key) under a path resolved twice.
  for (int i = 0; i < 4; ++i) {
    const std::string nd = cwd + "/out/devnet/node" + std::to_string(i);
    EXPECT_TRUE(std::filesystem::exists(nd + "/keys")) << nd;
    EXPECT_FALSE(std::filesystem::exists(nd + "/out")) << nd << " holds a second data dir";
  }
  // Paths inside report.json are relative to its folder (docs/paths.md), as every reader of a
  // file resolves them: read from elsewhere, they name the model and the task file (they read
  // "out/devnet/model.safetensors", relative to the devnet's working directory).
  const std::filesystem::path report_dir = cwd + "/out/devnet";
  EXPECT_EQ(rep["model"], "model.safetensors") << rep.dump(2);
  EXPECT_TRUE(std::filesystem::is_regular_file(report_dir / rep["model"].get<std::string>()));
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::equivalent(report_dir / rep["task"].get<std::string>(),
                                          cwd + "/examples/fashion-mlp.toml", ec))
      << rep["task"] << " " << ec.message();
  ExpectNoOrphans(cwd);
}

// `meshlearn devnet` with no --out at all writes to out/devnet under the working directory, and
// --keep writes report.json when the task ends (not at Ctrl-C), prints commands that work as
// printed (the submitter's key and home, --rpc), and stops every process at Ctrl-C.
TEST(Devnet, NoOutAndKeepWriteTheReportWhenTheTaskEnds) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string cwd = TempDir();
  const std::string log = cwd + "/devnet.log";
  pid_t pid = fork();
  if (pid == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(126);
    setenv("MESHLEARN_HOME", "home", 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    (void)f;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "4", "--task",
          MESHLEARN_SOURCE_DIR "/tests/devnet-tiny.toml", "--block-interval-ms", "200", "--keep",
          (char*)nullptr);
    _exit(127);
  }
  const std::string dir = cwd + "/out/devnet";
  bool kept = false;
  for (int i = 0; i < 3000 && !kept; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kept = ReadText(log).find("Ctrl-C stops it") != std::string::npos;
    if (waitpid(pid, nullptr, WNOHANG) == pid) break;
  }
  const std::string text = ReadText(log);
  ASSERT_TRUE(kept) << text;
  // The report is there while the network is still up.
  json rep = ReadReport(dir);
  CheckCommon(rep);
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "devnet exited before Ctrl-C";
  // The printed commands work as printed, from another working directory.
  EXPECT_NE(text.find("\"submitter\""), std::string::npos) << text;
  std::istringstream lines(text);
  std::string line;
  int ran = 0;
  std::string exports;
  while (std::getline(lines, line)) {
    const size_t at = line.find("export MESHLEARN_HOME=");
    if (at != std::string::npos) exports = line.substr(at);
    const size_t cmd = line.find("meshlearn task status ");
    const size_t bal = line.find("meshlearn wallet balance ");
    const size_t start = cmd != std::string::npos ? cmd : bal;
    if (start == std::string::npos || exports.empty()) continue;
    const std::string args = line.substr(start + std::string("meshlearn ").size());
    CmdResult r = RunIn("/", exports + " && " + MESHLEARN_BIN + " " + args);
    EXPECT_EQ(r.code, 0) << line << "\n" << r.out;
    ++ran;
  }
  EXPECT_EQ(ran, 2) << text;
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadText(log);
  ExpectNoOrphans(cwd);
}

// --adversary solver:lazy: one node runs every other inner step; it loses the dispute (by its
// deadline or the ledger's ruling). --adversary solver:wrong_result: one node trains honestly
// and commits another delta; a verifier proves it to the ledger (ProveResult, a real HTTP
// transaction). Either way the cheater is slashed, jailed and never paid for a unit; the round
// re-runs without it, so the final model is still exactly the honest in-process reference.
// --adversary solver:noisy with --assurance full (issue 19): one node perturbs its state once, in
// one segment, and commits a consistent hash chain; full assurance replays every segment of every
// unit, so it is caught the same way.
struct CheaterCase {
  std::string mode;
  std::string assurance;  // "": the task file's (economic)
};
void PrintTo(const CheaterCase& c, std::ostream* os) {
  *os << "solver:" << c.mode << (c.assurance.empty() ? "" : ", --assurance " + c.assurance);
}
class DevnetCheater : public ::testing::TestWithParam<CheaterCase> {};

TEST_P(DevnetCheater, IsSlashedUnpaidAndTheModelIsTheHonestOne) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string mode = GetParam().mode;
  const std::string assurance = GetParam().assurance;
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  CmdResult r = Meshlearn(
      "--json devnet --solvers 4 --task tests/devnet-tiny.toml --block-interval-ms 200 "
      "--timeout 300 --adversary solver:" +
          mode + " --out " + dir + (assurance.empty() ? "" : " --assurance " + assurance),
      dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  CheckCommon(rep);  // every committed unit paid; final weights = the in-process reference
  const json& v = rep["verification"];
  ASSERT_TRUE(v.value("enabled", false)) << rep.dump(2);
  ASSERT_EQ(v["adversaries"].size(), 1u);
  const int cheater = v["adversaries"][0]["solver"].get<int>();
  EXPECT_EQ(v["adversaries"][0]["mode"], mode);
  EXPECT_EQ(v["assurance"], assurance.empty() ? "economic" : assurance) << v.dump(2);
  EXPECT_EQ(v["dispute_window_ms"].get<int64_t>(), 4000)
      << v.dump(2);  // a model under 1M parameters
  if (assurance == "full") {
    EXPECT_EQ(v["checks"]["unchecked"].get<int>(), 0) << v.dump(2);  // every unit replayed
  }
  EXPECT_GE(v["checks"]["fraud"].get<int>(), 1) << v.dump(2);
  ASSERT_EQ(v["slashed"].size(), 1u) << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["solver"].get<int>(), cheater);
  EXPECT_GT(v["slashed"][0]["amount"].get<uint64_t>(), 0u);
  // The rulings are the chain's: each of the referee service's transactions that the ledger
  // executed is listed among them, as sent by the service (a party's may be listed too).
  for (const json& attempt : v["referee_attempts"]) {
    if (!attempt["executed"].get<bool>()) continue;
    int listed = 0;
    for (const json& d : v["disputes_ruled"]) {
      if (d["tx_id"] != attempt["tx_hash"]) continue;
      ++listed;
      EXPECT_EQ(d["sender_is"], "the referee service") << d.dump();
      EXPECT_EQ(d["for"], attempt["for"]) << d.dump() << attempt.dump();
    }
    EXPECT_EQ(listed, 1) << attempt.dump() << v.dump(2);
  }
  // Whoever sent it, every ruling the chain executed was on the cheater's work and for the
  // challenger (an honest verifier): no honest node is ever ruled against.
  const std::string cheater_id = v["adversaries"][0]["node"].get<std::string>();
  for (const json& d : v["disputes_ruled"]) {
    EXPECT_EQ(d["defender"], cheater_id) << d.dump();
    EXPECT_EQ(d["for"], "challenger") << d.dump();
  }
  for (const json& n : rep["nodes"]) {
    if (n["solver"].get<int>() == cheater) {
      EXPECT_EQ(n["status"], "jailed") << n.dump(2);
      EXPECT_EQ(n["paid_for_units"].get<uint64_t>(), 0u)
          << n.dump(2);  // no unit of it was ever paid
      EXPECT_EQ(n["units"].get<int>(), 0) << n.dump(2);
    } else {
      EXPECT_EQ(n["slashed"].get<uint64_t>(), 0u) << n.dump(2);
      EXPECT_EQ(n["reputation"]["slashes"].get<uint64_t>(), 0u) << n.dump(2);
    }
  }
  ExpectNoOrphans(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, DevnetCheater,
                         ::testing::Values(CheaterCase{"lazy", ""}, CheaterCase{"wrong_result", ""},
                                           CheaterCase{"noisy", "full"}),
                         [](const ::testing::TestParamInfo<CheaterCase>& p) {
                           return p.param.mode +
                                  (p.param.assurance.empty() ? "" : "_" + p.param.assurance);
                         });

// --assurance and --target-escape-ppm are checked like the task file's keys, before anything
// starts: nothing is written under --out.
TEST(Devnet, BadAssuranceOptionsAreRefusedBeforeAnythingStarts) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--assurance paranoid", "--assurance is 'paranoid'; use economic, full or target"},
      {"--assurance target", "--target-escape-ppm"},
      {"--assurance full --target-escape-ppm 1000", "--target-escape-ppm"},
      {"--target-escape-ppm 1000", "--target-escape-ppm needs --assurance target"},
      {"--assurance target --target-escape-ppm 1000000", "--target-escape-ppm"},
      {"--assurance full --no-verification", "it needs verification"},
      {"--dispute-window-ms -1", "--dispute-window-ms: '-1' is negative"},
      {"--dispute-window-ms 3600001", "--dispute-window-ms is 3600001; use 1 to 3600000, or 0"}};
  for (const auto& [flags, expect] : cases) {
    CmdResult r =
        Meshlearn("devnet --solvers 2 --task tests/devnet-tiny.toml --out " + dir + " " + flags,
                  dir + "-home");
    EXPECT_NE(r.code, 0) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << flags << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir)) << flags << " left " << dir;
  }
}

// Ctrl-C (SIGINT) in the middle of a task: devnet stops every process it started and fails.
TEST(Devnet, InterruptStopsEveryProcess) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  const std::string out = dir + ".out";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (dir + "-home").c_str(), 1);
    FILE* f = freopen(out.c_str(), "w", stderr);
    (void)f;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "2", "--task",
          "tests/devnet-tiny.toml", "--block-interval-ms", "200", "--out", dir.c_str(),
          (char*)nullptr);
    _exit(127);
  }
  // Wait until the task is submitted (the nodes are up and working).
  bool submitted = false;
  for (int i = 0; i < 600 && !submitted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(out);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    submitted = text.find("submitted in block") != std::string::npos;
  }
  ASSERT_TRUE(submitted);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("interrupted by signal 2"), std::string::npos) << text;
  ExpectNoOrphans(dir);
}

// A task file that leaves out checkpoint_interval gets its documented default, inner_steps
// (docs/submitters.md), from every party: `task submit` accepts it and sends k = H, the ledger
// records k = H, every solver commits the states after steps 0 and H only, every node's bundle
// agrees with the ledger (a node refuses a task whose bundle does not), and the network trains it
// to the in-process reference. devnet submits with `task submit`'s own functions (PrepareTask,
// SubmitPreparedTask); --keep leaves the ledger up to be asked what it recorded. Once the file's
// k = 0 meant "default" to one reader and was refused by another (issue 13).
TEST(Devnet, ATaskWithoutCheckpointIntervalIsTrainedWithTheDefault) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir();
  std::string text = ReadText(MESHLEARN_SOURCE_DIR "/tests/devnet-tiny.toml");
  const std::string k_line = "checkpoint_interval = 5\n";
  ASSERT_NE(text.find(k_line), std::string::npos);
  text.erase(text.find(k_line), k_line.size());
  ASSERT_EQ(text.find("checkpoint_interval"), std::string::npos);
  ASSERT_NE(text.find("inner_steps = 10\n"), std::string::npos);
  const std::string task = dir + "/no-k.toml";
  std::ofstream(task) << text;

  CmdResult dry = Meshlearn("--json task submit " + task + " --dry-run", dir + "/home", false);
  ASSERT_EQ(dry.code, 0) << dry.out;
  const json plan = json::parse(dry.out, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << dry.out;
  EXPECT_EQ(plan["params"]["checkpoint_interval"], 10) << dry.out;

  const std::string out = dir + "/d";
  const std::string log = dir + "/devnet.log";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (dir + "/home").c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    (void)f;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "2", "--task", task.c_str(),
          "--block-interval-ms", "200", "--keep", "--out", out.c_str(), (char*)nullptr);
    _exit(127);
  }
  bool kept = false;
  for (int i = 0; i < 3000 && !kept; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kept = ReadText(log).find("Ctrl-C stops it") != std::string::npos;
    if (waitpid(pid, nullptr, WNOHANG) == pid) break;
  }
  const std::string said = ReadText(log);
  if (!kept) {
    kill(pid, SIGINT);
    waitpid(pid, nullptr, 0);
  }
  ASSERT_TRUE(kept) << said;
  CheckCommon(ReadReport(out));

  // The ledger's record of the task, through the command devnet printed.
  std::string exports, status_args;
  std::istringstream lines(said);
  for (std::string line; std::getline(lines, line);) {
    if (size_t at = line.find("export MESHLEARN_HOME="); at != std::string::npos) {
      exports = line.substr(at);
    }
    if (size_t at = line.find("meshlearn task status "); at != std::string::npos) {
      status_args = line.substr(at + std::string("meshlearn ").size());
    }
  }
  ASSERT_FALSE(exports.empty()) << said;
  ASSERT_FALSE(status_args.empty()) << said;
  CmdResult st = Shell(exports + " && " + MESHLEARN_BIN + " --json " + status_args);
  kill(pid, SIGINT);
  int exit_status = 0;
  waitpid(pid, &exit_status, 0);
  ASSERT_EQ(st.code, 0) << st.out;
  const json record = json::parse(st.out, nullptr, false);
  ASSERT_FALSE(record.is_discarded()) << st.out;
  EXPECT_EQ(record["status"], "finished") << st.out;
  EXPECT_EQ(record["params"]["inner_steps"], 10) << st.out;
  EXPECT_EQ(record["params"]["checkpoint_interval"], 10) << st.out;
  int committed = 0;
  for (const json& u : record["units"]) {
    if (u["leaves"].empty()) continue;
    ++committed;
    EXPECT_EQ(u["leaves"].size(), 2u) << u.dump();  // the states after step 0 and step H
  }
  EXPECT_GE(committed, 12) << st.out;
  ExpectNoOrphans(dir);
}

// Label "slow" (apps/CMakeLists.txt). kill -9 of a solver in the middle of its second unit (every
// run: node.toml crash_in_unit): the task still completes, the unit is reassigned after its
// deadline and the killed node is never paid for it; a node joining mid-task gets work; a node at
// half speed gets fewer units.
TEST(DevnetSlow, ChurnKillJoinAndHalfSpeed) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  // tests/devnet-tiny.toml with 8 rounds, so that the late node has rounds left to join.
  std::ifstream in("tests/devnet-tiny.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  text.replace(text.find("rounds = 3"), 10, "rounds = 8");
  const std::string task = dir + "-churn.toml";
  std::ofstream(task) << text;
  CmdResult r = Meshlearn("--json devnet --solvers 5 --task " + task +
                              " --block-interval-ms 200 "
                              "--timeout 600 --kill 1@1 --late 4@1 --speed 2=0.5 --out " +
                              dir,
                          dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  CheckCommon(rep, 8);
  ASSERT_EQ(rep["events"].size(), 2u) << rep.dump(2);
  int killed = 0;
  for (const json& n : rep["nodes"]) {
    if (n["killed"].get<bool>()) {
      ++killed;
      EXPECT_EQ(n["solver"], 1) << n.dump();
      // It died in its second unit, which it never committed; its first stays in the record
      // unless that round was re-run without it (its delta died with it before the aggregator
      // fetched it: ReportUnavailable).
      EXPECT_LE(n["units"].get<int>(), 1) << n.dump();
      EXPECT_GE(n["reputation"].value("failures", 0), 1) << n.dump();
    }
    if (n["late"].get<bool>()) {
      EXPECT_GE(n["units"].get<int>(), 1) << n.dump();
    }
  }
  EXPECT_EQ(killed, 1) << rep.dump(2);
  ExpectNoOrphans(dir);
}

// The 10M GPT (examples/code-gpt-10m-devnet.toml: 10.8M parameters, AdamW clipping at 1.0, one
// sequence of 64 tokens a step, 2 rounds of 2 units of 4 inner steps, every segment replayed)
// with a lazy solver, an honest one and a verifier-only node: the lazy unit is disputed with the
// tile phase, the game narrows to a clipped AdamW tile of the step it skipped, and the ledger
// rules it by RefereeTile from a witness of at most 256 KiB (no key involved); the lazy node is
// slashed and the final model is the honest in-process reference's. Label "long" (minutes on 2
// cores: MESHLEARN_SLOW_TESTS=1). Two solvers of equal weight (one throughput measurement for
// both, fresh reputations) are dealt exactly one unit each of round 0's two (the scheduler deals
// floor or ceil of m x weight / total: here 1), so the lazy node always trains one; among three
// solvers it sat out both rounds about one run in nine, and nothing was disputed. The
// verifier-only node verifies the honest solver's re-run units once the lazy one is jailed.
TEST(DevnetLong, The10mGptWithALazySolverIsRuledByTheLedgerAtATile) {
  if (!std::ifstream("/usr/lib/python3.11/os.py").good()) {
    GTEST_SKIP() << "the code corpus (/usr/lib/python3.11) is not installed";
  }
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  const std::string args =
      "--json devnet --solvers 2 --verifiers 1 --task examples/code-gpt-10m-devnet.toml "
      "--block-interval-ms 200 "
      "--timeout 1800 --adversary solver:lazy --out " +
      dir;
  CmdResult r = Meshlearn(args, dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  ASSERT_FALSE(rep.is_discarded());
  // The precondition, not the property: the lazy node trained a unit (from its metrics: the task's
  // record names the unit's re-run, not the lazy node).
  int lazy_units = -1;
  for (const json& n : rep["nodes"]) {
    if (n["adversary"] == "lazy") lazy_units = n.value("units_trained", -1);
  }
  ASSERT_GE(lazy_units, 1) << "the lazy node was never dealt a unit, so there was nothing to "
                              "dispute: the scheduler's deal, not verification: "
                           << rep["nodes"].dump(2);
  EXPECT_TRUE(rep["matches_reference"].get<bool>()) << rep.dump(2);
  const json& v = rep["verification"];
  ASSERT_TRUE(v.value("enabled", false)) << rep.dump(2);
  // The devnet's window for a 10.8M-parameter model: 4 s + 2 s per whole million.
  EXPECT_EQ(v["dispute_window_ms"].get<int64_t>(), 24000) << v.dump(2);
  ASSERT_EQ(v["slashed"].size(), 1u) << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["adversary"], "lazy");
  int tile_rulings = 0;
  for (const json& ruling : v["disputes_ruled"]) {
    std::printf("[ devnet   ] ruling on unit %u step %llu by %s, witness %llu bytes, for the %s\n",
                ruling["index"].get<uint32_t>(),
                static_cast<unsigned long long>(ruling["step"].get<uint64_t>()),
                ruling["tx"].get<std::string>().c_str(),
                static_cast<unsigned long long>(ruling["witness_bytes"].get<uint64_t>()),
                ruling["for"].get<std::string>().c_str());
    EXPECT_NE(ruling["tx"], "RuleDispute") << "no key rules an exact-mode dispute";
    if (ruling["tx"] == "RefereeTile") {
      ++tile_rulings;
      EXPECT_GT(ruling["witness_bytes"].get<uint64_t>(), 0u);
      EXPECT_LE(ruling["witness_bytes"].get<uint64_t>(), 256u * 1024) << ruling.dump(2);
    }
  }
  EXPECT_GE(tile_rulings, 1) << v.dump(2);
  ExpectNoOrphans(dir);
}

// The 10M GPT cut into 4 stages x 2 replicas (examples/code-gpt-pipeline-devnet.toml) on a
// verifying chain, on 9 stage nodes that each offer 100 MiB to training (8 stage units a round and
// one more for the re-run once the cheater is jailed), one of them a lazy stage node: every stage
// fits (the heaviest needs 70.9 MB), one whole unit would not (216 MB), so the ledger can place it
// only as stages. The lazy node is caught by a verifier checking its stage's step, slashed and
// jailed by the ledger's own ruling (a RefereeTile, or for a continuity claim a RefereeStageStep:
// no key), no honest node is slashed, and
// the final weights are `meshlearn diloco`'s, bit for bit.
// Every stage node's peak resident memory meets issue 15's bound: 1/S of the whole model trained
// on one node plus a stage's activations (a node that verifies a stage while it trains its own
// stays within what it offers: NodeAgent::WaitsForStageUnit). Label "long".
TEST(DevnetLong, TheGptPipelineOnAVerifyingChainUnderAMemoryLimitSlashesALazyStage) {
  if (!std::ifstream("/usr/lib/python3.11/os.py").good()) {
    GTEST_SKIP() << "the code corpus (/usr/lib/python3.11) is not installed";
  }
  std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  // The honest nodes report 0.9x the machine's throughput, so the lazy one (node8, the fastest)
  // always takes a stage.
  CmdResult r = Meshlearn(
      "--json devnet --solvers 9 --task examples/code-gpt-pipeline-devnet.toml "
      "--block-interval-ms 200 --memory-limit 100M --adversary solver:lazy "
      "--speed 0=0.9 --speed 1=0.9 --speed 2=0.9 --speed 3=0.9 --speed 4=0.9 "
      "--speed 5=0.9 --speed 6=0.9 --speed 7=0.9 --timeout 1800 --out " +
          dir,
      dir + "-home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(dir);
  ASSERT_FALSE(rep.is_discarded());
  EXPECT_TRUE(rep["matches_reference"].get<bool>()) << rep.dump(2);
  const json& v = rep["verification"];
  ASSERT_TRUE(v.value("enabled", false));
  EXPECT_GE(v["checks"]["fraud"].get<int>(), 1) << v.dump(2);
  ASSERT_EQ(v["slashed"].size(), 1u) << "the lazy node alone: " << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["adversary"], "lazy");
  EXPECT_EQ(v["slashed"][0]["status"], "jailed");
  // The ledger rules it itself, within the 256 KiB witness bound; no key rules it. A 10M GPT
  // stage is over the stage witness bound, so a replayed step's dispute plays the tile phase (the
  // ledger requires the bundle: MismatchNeedsBundle) and ends in a RefereeTile; a drawn step after
  // the first finds the lazy stage's step starting elsewhere than the previous one ended, a
  // continuity claim ruled by RefereeStageStep from the two commits, whatever the stage's size.
  int for_challenger = 0;
  for (const json& d : v["disputes_ruled"]) {
    std::printf(
        "[ devnet   ] ruling on unit %u step %llu by %s, witness %llu bytes, from %s, for the %s\n",
        d["index"].get<uint32_t>(), static_cast<unsigned long long>(d["step"].get<uint64_t>()),
        d["tx"].get<std::string>().c_str(),
        static_cast<unsigned long long>(d["witness_bytes"].get<uint64_t>()),
        d["sender_is"].get<std::string>().c_str(), d["for"].get<std::string>().c_str());
    EXPECT_TRUE(d["tx"] == "RefereeTile" || d["tx"] == "RefereeStageStep") << d.dump();
    EXPECT_LE(d["witness_bytes"].get<uint64_t>(), 256u * 1024) << d.dump();
    for_challenger += d["for"] == "challenger";
  }
  EXPECT_GE(for_challenger, 1) << v.dump(2);
  const json& p = rep["pipeline"];
  EXPECT_EQ(p["stages"], 4) << p.dump();
  EXPECT_EQ(p["replicas"], 2);
  EXPECT_EQ(p["micro_batches"], 2);
  const uint64_t limit = p["memory_limit_bytes"].get<uint64_t>();
  EXPECT_EQ(limit, 100u << 20);
  EXPECT_LT(limit, p["unpipelined_memory_bytes"].get<uint64_t>()) << "a whole unit must not fit";
  for (const json& m : p["stage_memory_bytes"]) EXPECT_LE(m.get<uint64_t>(), limit);
  EXPECT_GT(p["bytes_activations"].get<uint64_t>(), 0u);
  // What a node's process held with the task loaded: its log's `loaded` line (resident kB /
  // 1000 "MB"); 0, and a failed expectation, when the line is missing.
  auto loaded_resident = [&](const json& n) -> uint64_t {
    const std::string log =
        ReadText(dir + "/logs/node" + std::to_string(n["solver"].get<int>()) + ".log");
    const size_t loaded = log.find(": loaded (");
    const size_t at = loaded == std::string::npos ? loaded : log.find("(resident ", loaded);
    EXPECT_NE(at, std::string::npos) << "no `loaded (... resident` line: " << n.dump();
    return at == std::string::npos ? 0 : std::stoull(log.substr(at + 10)) * 1000 * 1024;
  };
  int stage_nodes = 0, aggregators = 0;
  for (const json& n : rep["nodes"]) {
    const uint64_t peak = n["peak_rss_bytes"].get<uint64_t>();
    if (n["roles"] == "aggregator") {
      // The scheduler's AggregatorMemoryBytes bounds what an aggregator holds beyond the loaded
      // process (a formula below it would let the ledger draw an aggregator that runs out of
      // memory).
      const uint64_t formula = p["aggregator_memory_bytes"].get<uint64_t>();
      aggregators += n.value("paid_for_aggregation", uint64_t{0}) > 0;
      EXPECT_LE(peak, loaded_resident(n) + formula) << n.dump();
      // It keeps the whole model's trainer for the next round, not its optimizer moments.
      EXPECT_EQ(n["whole_model_moments_bytes"], 0) << n.dump();
      std::printf("[ devnet   ] aggregator node%d: peak %llu bytes, loaded %llu, formula %llu\n",
                  n["solver"].get<int>(), static_cast<unsigned long long>(peak),
                  static_cast<unsigned long long>(loaded_resident(n)),
                  static_cast<unsigned long long>(formula));
      continue;
    }
    stage_nodes += n["units"].get<int>() > 0;
    // A stage node holds its stage: it never builds the whole model's trainer, to train or to
    // verify.
    EXPECT_EQ(n["whole_models_built"], 0) << n.dump();
    // What it held beyond the process with the task loaded is at most what it offers to
    // training: one stage at a time. A check replayed beside the node's own stage unit took it
    // 107-152 MB above (docs/submitters.md).
    EXPECT_LE(peak, loaded_resident(n) + limit) << "node" << n["solver"] << " above its offer";
  }
  EXPECT_GE(stage_nodes, 8) << "every stage of both replicas on a node of its own";
  EXPECT_GE(aggregators, 1) << "a node that only aggregates applied the rounds";
  EXPECT_GT(p["aggregator_peak_rss_bytes"].get<uint64_t>(), 0u) << p.dump();
  // Measured, not estimated: every stage node's peak resident memory against the whole model
  // trained on one node (`meshlearn diloco` as its own process), divided by S, plus the heaviest
  // stage's activations of a step (engine::CutCosts). Before a check waited for its node's stage
  // unit, a node replaying one stage while it trained another peaked at 0.30-0.38 of the single
  // node (docs/submitters.md).
  const uint64_t stage_peak = p["stage_node_peak_rss_bytes"]["max"].get<uint64_t>();
  const uint64_t single = p["single_node_peak_rss_bytes"].get<uint64_t>();
  const uint64_t target = p["stage_node_peak_target_bytes"].get<uint64_t>();
  EXPECT_GT(stage_peak, 0u);
  ASSERT_EQ(p["stage_activation_bytes"].size(), 4u);
  uint64_t activations = 0;
  for (const json& a : p["stage_activation_bytes"]) {
    activations = std::max(activations, a.get<uint64_t>());
  }
  EXPECT_GT(activations, 0u);
  EXPECT_EQ(target, single / 4 + activations);
  EXPECT_LE(stage_peak, target) << p.dump();
  std::printf("[ devnet   ] pipeline %s\n", p.dump().c_str());
  ExpectNoOrphans(dir);
}

// The etcd binary the devnet would use ($MESHLEARN_ETCD, else `etcd` on PATH); "" if none.
std::string EtcdBinary() {
  if (const char* e = std::getenv("MESHLEARN_ETCD"); e && *e) return e;
  CmdResult r = Shell("command -v etcd 2>/dev/null");
  return r.code == 0 ? r.out : "";
}

// The main job (scripts/run.sh: a lazy solver among 4) on a replicated sequencer (issue 18):
// --sequencers 3 runs a 3-member etcd and three `chain serve --cluster` candidates, and
// --kill-sequencer 4 SIGKILLs whichever leads when round 4 starts. The chain fails over; the
// task still finishes with the lazy solver slashed and the weights of the honest in-process run,
// and the report gives the failover's gap (the chain's time without a block). Label "slow".
TEST(DevnetSlow, ReplicatedSequencerSurvivesItsLeaderKilledMidTask) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  if (EtcdBinary().empty()) {
    GTEST_SKIP() << "no etcd binary (apt-get install etcd-server, or scripts/setup.sh --test); "
                    "skipped";
  }
  const std::string dir = TempDir();
  // tests/devnet-tiny.toml with 6 rounds, so that round 4 starts mid-task.
  std::string text = ReadText(MESHLEARN_SOURCE_DIR "/tests/devnet-tiny.toml");
  ASSERT_NE(text.find("rounds = 3\n"), std::string::npos);
  text.replace(text.find("rounds = 3\n"), 10, "rounds = 6");
  const std::string task = dir + "/six-rounds.toml";
  std::ofstream(task) << text;
  const std::string out = dir + "/d";
  CmdResult r = Meshlearn("--json devnet --solvers 4 --task " + task +
                              " --block-interval-ms 200 --timeout 600 --adversary solver:lazy "
                              "--sequencers 3 --kill-sequencer 4 --out " +
                              out,
                          dir + "/home");
  ASSERT_EQ(r.code, 0) << r.out;
  json rep = ReadReport(out);
  CheckCommon(rep, 6);  // every committed unit paid once; the weights = the in-process reference
  const json& v = rep["verification"];
  ASSERT_EQ(v["slashed"].size(), 1u) << v.dump(2);
  EXPECT_EQ(v["slashed"][0]["adversary"], "lazy");
  EXPECT_GT(v["slashed"][0]["amount"].get<uint64_t>(), 0u);
  const json& s = rep["sequencer"];
  EXPECT_EQ(s["candidates"], 3) << s.dump(2);
  EXPECT_EQ(s["etcd_members"], 3) << s.dump(2);
  ASSERT_TRUE(s["killed"].is_object()) << s.dump(2);
  EXPECT_EQ(s["killed"]["round"], 4) << s.dump(2);
  // The kill shows on the chain: the first change of block signer after it is from the killed
  // candidate to another, with the time the chain went without a block.
  int after_kill = 0;
  for (const json& f : s["failovers"]) {
    if (!f["after_kill"].get<bool>()) continue;
    ++after_kill;
    EXPECT_EQ(f["from"], s["killed"]["candidate"]) << s.dump(2);
    EXPECT_NE(f["to"], s["killed"]["candidate"]) << s.dump(2);
    EXPECT_GE(f["to"].get<int>(), 0) << "a block signed by no candidate: " << s.dump(2);
    EXPECT_GT(f["gap_ms"].get<int64_t>(), 0) << s.dump(2);
    EXPECT_EQ(f["gap_ms"].get<int64_t>(),
              f["next_block_ms"].get<int64_t>() - f["last_block_ms"].get<int64_t>());
    std::printf("failover after the kill: block %llu, %lld ms without a block\n",
                static_cast<unsigned long long>(f["height"].get<uint64_t>()),
                static_cast<long long>(f["gap_ms"].get<int64_t>()));
  }
  EXPECT_EQ(after_kill, 1) << s.dump(2);
  // The text report names it too.
  EXPECT_NE(rep.dump().find("kill -9 sequencer"), std::string::npos) << rep["events"].dump(2);
  ExpectNoOrphans(dir);  // the etcd members and the surviving candidates are gone too
}

// --sequencers and --kill-sequencer are checked before anything starts.
TEST(Devnet, BadSequencerOptionsAreRefusedBeforeAnythingStarts) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir() + "/d";
  LogsOnFailure logs(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--sequencers 0", "--sequencers is 0; use 1"},
      {"--sequencers 10", "--sequencers is 10; use 1"},
      {"--kill-sequencer 1", "--kill-sequencer needs a replicated sequencer"},
      {"--sequencers 3 --kill-sequencer 3",
       "--kill-sequencer 3 is not a round of the task: its "
       "rounds are 0..2"},
      {"--sequencers 3 --kill-sequencer x", "--kill-sequencer"}};
  for (const auto& [flags, expect] : cases) {
    CmdResult r =
        Meshlearn("devnet --solvers 2 --task tests/devnet-tiny.toml --out " + dir + " " + flags,
                  dir + "-home");
    EXPECT_NE(r.code, 0) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << flags << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir)) << flags << " left " << dir;
  }
  // No etcd: the error says how to install it.
  CmdResult r = Shell("MESHLEARN_ETCD=/nonexistent/etcd MESHLEARN_HOME=" + dir + "-home " +
                      MESHLEARN_BIN + " devnet --solvers 2 --task tests/devnet-tiny.toml --out " +
                      dir + " --sequencers 3 2>&1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("apt-get install etcd-server"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/etcd"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir)) << "left " << dir;
}

TEST(TaskSubmit, BadTaskFilesAreRefusedBeforeEscrow) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  std::string dir = TempDir();
  std::ifstream in("tests/devnet-tiny.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string good = ss.str();
  struct Case {
    std::string from, to, expect;
  };
  const Case cases[] = {
      {"budget = 100000", "budget = 0", "network.budget"},
      {"price_cap = 100", "price_cap = 0", "network.price_cap"},
      {"units_per_round = 4", "units_per_round = 0", "units_per_round"},
      {"inner_steps = 10", "inner_steps = -3", "inner_steps"},
      {"checkpoint_interval = 5", "checkpoint_interval = 50", "checkpoint_interval"},
      {"aggregation = \"mean\"", "aggregation = \"avg\"", "aggregation"},
      {"budget = 100000", "budget = 149", "below the most this task can cost"},
  };
  for (const Case& c : cases) {
    std::string text = good;
    text.replace(text.find(c.from), c.from.size(), c.to);
    const std::string path = dir + "/bad.toml";
    std::ofstream(path) << text;
    // No ledger is running at this --rpc: a refusal here happened before any network call.
    CmdResult r = Meshlearn("task submit " + path + " --key nobody --rpc http://127.0.0.1:9", dir);
    EXPECT_EQ(r.code, 1) << c.to << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.to << "\n" << r.out;
  }
  CmdResult ok = Meshlearn("task submit tests/devnet-tiny.toml --dry-run", dir);
  EXPECT_EQ(ok.code, 0) << ok.out;
}

}  // namespace
