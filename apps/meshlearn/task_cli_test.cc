// End-to-end tests of the submitter's commands (`meshlearn task quote|submit|status|watch|fetch|
// verify-model|cancel`, cmd_task.cc) as a user runs them: the real binary against a real devnet
// (`meshlearn devnet --keep`, a ledger and 4 nodes on loopback) training a copy of
// tests/devnet-tiny.toml WITHOUT checkpoint_interval (its default, inner_steps, must be what every
// path sends). What they pin down (issue 12):
//   - a file the ledger accepts is what --dry-run and quote call valid, and the reverse: they run
//     SubmitTask's own checks, naming the file's keys;
//   - the quote's expected spend is within 5% of what the task spent;
//   - one money vocabulary (spent = solvers + verifiers + aggregators; treasury cut; refunded),
//     the same in status, watch and fetch, and the nodes earned exactly what the ledger paid
//     them less the treasury's cut;
//   - rounds are numbered from 0 everywhere; a finished task's watch prints no rate;
//   - the fetched model ties to the ledger's state in one command (verify-model), and eval
//     prints the same weights hash;
//   - any unique prefix of a task id is accepted; printed follow-up commands carry --rpc;
//     a cancelled task reads "cancelled".
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
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
using meshlearn::process_test::WaitFor;
std::string TempDir() { return meshlearn::process_test::TempDir("taskcli"); }

using nlohmann::json;

bool HaveFashion() {
  return std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good();
}

// tests/devnet-tiny.toml with the lines starting with `drop` left out and `extra` appended to
// its [network] table (the last table of the file), written into `dir`.
std::string TinyTask(const std::string& dir, const std::string& drop, const std::string& extra,
                     const std::string& name = "task.toml") {
  std::istringstream in(ReadText("tests/devnet-tiny.toml"));
  std::string out, line;
  while (std::getline(in, line)) {
    if (!drop.empty() && line.rfind(drop, 0) == 0) continue;
    out += line + "\n";
  }
  out += extra;
  const std::string path = dir + "/" + name;
  std::ofstream(path) << out;
  return path;
}

json Parse(const CmdResult& r) { return json::parse(r.out, nullptr, false); }

bool Has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

// Issue 19: the assurance a task file asks for is what quote prices and prints (the probability
// that one corrupted segment escapes its check, from protocol::PlanCheck), and a malformed one
// is refused naming the key. tests/devnet-tiny.toml: H = 10, k = 5, so 2 segments; the chain's
// defaults (no ledger answers) check a trusted solver's units half the time, one segment each.
TEST(TaskCli, QuotePricesAndPrintsTheAssurance) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir();
  const std::string no_ledger = " --rpc http://127.0.0.1:9";
  struct Case {
    std::string extra;
    std::string level;
    double escape;
    uint32_t segments;
  };
  for (const Case& c : {Case{"", "economic", 0.75, 1},
                        Case{"assurance = \"full\"\n", "full", 0.0, 2},
                        Case{"assurance = \"target\"\ntarget_escape_ppm = 500000\n", "target",
                             0.5, 1}}) {
    SCOPED_TRACE(c.level);
    const std::string file = TinyTask(dir, "assurance", c.extra, c.level + ".toml");
    CmdResult q = Meshlearn("--json task quote " + file + no_ledger, dir, false);
    ASSERT_EQ(q.code, 0) << q.out;
    const json j = Parse(q);
    ASSERT_FALSE(j.is_discarded()) << q.out;
    EXPECT_EQ(j["assurance"]["level"], c.level) << j.dump(2);
    EXPECT_DOUBLE_EQ(j["assurance"]["escape_probability"].get<double>(), c.escape) << j.dump(2);
    EXPECT_EQ(j["assurance"]["least_segments_replayed"], c.segments) << j.dump(2);
    EXPECT_EQ(j["params"]["assurance"], c.level == "economic" ? 0 : c.level == "full" ? 1 : 2);
    if (c.level == "full") {
      CmdResult text = Meshlearn("task quote " + file + no_ledger, dir);
      EXPECT_TRUE(Has(text.out, "assurance full: a checked unit replays 2 of its 2 segment(s)"))
          << text.out;
      EXPECT_TRUE(Has(text.out, "one corrupted segment escapes with probability 0")) << text.out;
    }
  }
  for (const auto& [extra, key] :
       std::vector<std::pair<std::string, std::string>>{
           {"assurance = \"paranoid\"\n", "network.assurance"},
           {"assurance = \"target\"\n", "network.assurance"},
           {"assurance = \"target\"\ntarget_escape_ppm = 0\n", "network.target_escape_ppm"},
           {"target_escape_ppm = 100\n", "network.target_escape_ppm"}}) {
    const std::string file = TinyTask(dir, "assurance", extra, "bad.toml");
    CmdResult bad = Meshlearn("task quote " + file + no_ledger, dir);
    EXPECT_EQ(bad.code, 1) << extra << bad.out;
    EXPECT_TRUE(Has(bad.out, key)) << extra << bad.out;
  }
}

// Regression (issue 12 item 2): a file without checkpoint_interval was "valid" for --dry-run and
// quote, then refused by the ledger after a 31 MB upload (k = 0). Its default is inner_steps, and
// --dry-run runs every check SubmitTask makes, naming the file's keys. No ledger needed.
TEST(TaskCli, DryRunRunsTheLedgersChecksAndDefaultsCheckpointInterval) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir();
  const std::string no_ledger = " --rpc http://127.0.0.1:9";

  const std::string file = TinyTask(dir, "checkpoint_interval", "");
  CmdResult ok = Meshlearn("--json task submit " + file + " --dry-run" + no_ledger, dir, false);
  ASSERT_EQ(ok.code, 0) << ok.out;
  json j = Parse(ok);
  ASSERT_FALSE(j.is_discarded()) << ok.out;
  EXPECT_TRUE(j["valid"].get<bool>());
  EXPECT_EQ(j["params"]["checkpoint_interval"], 10) << j.dump(2);  // = inner_steps
  EXPECT_EQ(j["params"]["inner_steps"], 10);

  // A check only the ledger made before: at most 63 segments per unit on a verifying chain.
  // inner_steps = 100 with k = 1: 101 committed states, over the 64 a commit carries.
  const std::string many = TinyTask(dir, "inner_steps", "", "many.toml");
  {
    std::string text = ReadText(many);
    const std::string k = "checkpoint_interval = 5";
    text.replace(text.find(k), k.size(), "inner_steps = 100\ncheckpoint_interval = 1");
    std::ofstream(many) << text;
  }
  CmdResult segs = Meshlearn("task submit " + many + " --dry-run" + no_ledger, dir);
  EXPECT_EQ(segs.code, 1) << segs.out;
  EXPECT_TRUE(Has(segs.out, "network.inner_steps / network.checkpoint_interval gives 101 "
                            "committed states per unit"))
      << segs.out;
  EXPECT_TRUE(Has(segs.out, "raise network.checkpoint_interval")) << segs.out;
  CmdResult segs_quote = Meshlearn("task quote " + many + no_ledger, dir);
  EXPECT_EQ(segs_quote.code, 1) << segs_quote.out;
  EXPECT_TRUE(Has(segs_quote.out, "network.checkpoint_interval")) << segs_quote.out;

  // An explicit 0 is refused with the key's range.
  const std::string zero = TinyTask(dir, "checkpoint_interval", "checkpoint_interval = 0\n",
                                    "zero.toml");
  CmdResult z = Meshlearn("task submit " + zero + " --dry-run" + no_ledger, dir);
  EXPECT_EQ(z.code, 1) << z.out;
  EXPECT_TRUE(Has(z.out, "network.checkpoint_interval must be >= 1, got 0")) << z.out;

  // Bad ids are refused before any network: not hex, or too long.
  CmdResult bad = Meshlearn("task status 12xz" + no_ledger, dir);
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(Has(bad.out, "task id: expected hex digits")) << bad.out;
  CmdResult longer = Meshlearn("task status " + std::string(65, 'a') + no_ledger, dir);
  EXPECT_EQ(longer.code, 1);
  EXPECT_TRUE(Has(longer.out, "at most 64 hex digits")) << longer.out;
}

// Issue 16: the ledger rules an exact-mode task's disputes at one tile of one operator, from a
// witness of at most 256 KiB, and --dry-run plans the step's tiles as the ledger would. A max-pool
// whose input gradient read whole 16 x 16 windows of stride 1 over 4 x 64 x 64, and one whose single
// 32 x 32 window passed the bound, were refused at submission; the plan now reads a max-pool's
// input gradient as a chain over its outputs and a window past 29 rows in chunks of its rows, so
// both are accepted. (A first layer's window over more chunks of its examples than a witness
// holds, which Fashion-MNIST's 28 x 28 cannot make, was the plan's last refusal; it is now read in
// chunks of its rows: engine TileRuleConvTest.AMaxPoolOfAnyWindowOverActivationsIsPlannedUnder
// TheBound.)
TEST(TaskCli, DryRunAcceptsAMaxPoolOfAnyWindow) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string dir = TempDir();
  for (const char* kernel : {"16", "32"}) {
    SCOPED_TRACE(std::string("window ") + kernel);
    const std::string file = TinyTask(dir, "", "", std::string("pool") + kernel + ".toml");
    std::string text = ReadText(file);
    const size_t from = text.find("[model]"), to = text.find("[optimizer]");
    ASSERT_NE(from, std::string::npos);
    text.replace(from, to - from, std::string(R"([model]
input = [1, 28, 28]
[[model.layers]]
kind = "conv2d"
out = 4
kernel = 5
pad = 20
[[model.layers]]
kind = "relu"
[[model.layers]]
kind = "maxpool2d"
kernel = )") + kernel + R"(
stride = 1
[[model.layers]]
kind = "flatten"
[[model.layers]]
kind = "linear"
out = 10

)");
    std::ofstream(file) << text;
    CmdResult r = Meshlearn("--json task submit " + file + " --dry-run --rpc http://127.0.0.1:9",
                            dir, false);
    ASSERT_EQ(r.code, 0) << r.out;
    json j = Parse(r);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_TRUE(j["valid"].get<bool>());
  }
}

TEST(TaskCli, DevnetTaskReadsTheSameInEveryCommand) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::string base = TempDir();
  const std::string dir = base + "/d";
  const std::string log = base + "/devnet.out";
  // No checkpoint_interval: the real SubmitTask must accept what --dry-run accepted.
  const std::string file = TinyTask(base, "checkpoint_interval", "");
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (base + "/devnet-home").c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    FILE* o = freopen("/dev/null", "w", stdout);
    (void)f, (void)o;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "4", "--task", file.c_str(),
          "--block-interval-ms", "200", "--keep", "--no-check-reference", "--timeout", "400",
          "--out", dir.c_str(), (char*)nullptr);
    _exit(127);
  }
  struct Stop {  // the devnet goes down whatever this test does
    pid_t pid;
    ~Stop() {
      if (pid > 0) kill(pid, SIGINT), waitpid(pid, nullptr, 0);
    }
  } stop{pid};

  const std::string rpc_url =
      "http://127.0.0.1:" + WaitFor(log, "ledger at http://127.0.0.1:", "0123456789", 90);
  const std::string id = WaitFor(log, "task ", "0123456789abcdef", 180, /*min_len=*/64);
  ASSERT_FALSE(rpc_url.size() <= 17 || id.empty()) << ReadText(log);
  const std::string rpc = " --rpc " + rpc_url;
  const std::string user = base + "/user";  // a fresh home: blobs come from the nodes
  const std::string submitter_home = dir + "/home";

  // The quote, from the nodes as they registered (all new: every unit verified).
  CmdResult quote = Meshlearn("--json task quote " + file + rpc, user, false);
  ASSERT_EQ(quote.code, 0) << quote.out;
  const json q = Parse(quote);
  ASSERT_FALSE(q.is_discarded()) << quote.out;
  ASSERT_TRUE(q.contains("cost")) << q.dump(2);
  EXPECT_GT(q["estimated_seconds"].get<double>(), 1.0) << q.dump(2);
  EXPECT_GT(q["expected"]["paid_to_verifiers"].get<uint64_t>(), 0u) << q.dump(2);

  // Watch the running task to its end: one JSON line per change, the task's metric in each.
  CmdResult watch = Meshlearn("--json task watch " + id.substr(0, 12) + " --timeout 400" + rpc,
                              user, false);
  ASSERT_EQ(watch.code, 0) << watch.out;
  {
    std::istringstream lines(watch.out);
    std::string line, last;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      last = line;
      json l = json::parse(line, nullptr, false);
      ASSERT_FALSE(l.is_discarded()) << line;
      if (l.value("rounds_done", 0) > 0) {
        EXPECT_TRUE(l.contains("test_loss")) << line;
        EXPECT_TRUE(l.contains("test_accuracy")) << line;  // a classifier
      }
    }
    json fin = json::parse(last, nullptr, false);
    ASSERT_FALSE(fin.is_discarded()) << last;
    EXPECT_EQ(fin["status"], "finished") << last;
  }
  ASSERT_FALSE(WaitFor(log, "the network stays up", "", 120).empty()) << ReadText(log);

  // Status, by a 12-digit prefix (what every command prints) and by a 1-digit one.
  CmdResult st = Meshlearn("--json task status " + id.substr(0, 12) + rpc, user, false);
  ASSERT_EQ(st.code, 0) << st.out;
  const json t = Parse(st);
  ASSERT_FALSE(t.is_discarded()) << st.out;
  EXPECT_EQ(t["id"], id);
  EXPECT_EQ(Meshlearn("task status " + id.substr(0, 1) + rpc, user).code, 0);
  CmdResult none = Meshlearn("task status " + std::string(id[0] == 'f' ? "e" : "f") +
                             id.substr(1, 11) + rpc, user);
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(Has(none.out, "no task on")) << none.out;

  // The params the ledger accepted are the ones quote and --dry-run computed (initial_state
  // apart: it exists once the blobs are stored).
  EXPECT_EQ(t["params"]["checkpoint_interval"], 10);
  for (const auto& [k, v] : t["params"].items()) {
    if (k == "initial_state") continue;
    EXPECT_EQ(q["params"][k], v) << k;
  }

  // Money: one vocabulary, each number one meaning.
  const json& m = t["money"];
  const uint64_t spent = m["spent"].get<uint64_t>();
  EXPECT_EQ(spent, t["spent"].get<uint64_t>());
  EXPECT_EQ(spent, m["paid_to_solvers"].get<uint64_t>() + m["paid_to_verifiers"].get<uint64_t>() +
                       m["paid_to_aggregators"].get<uint64_t>());
  EXPECT_EQ(m["budget"].get<uint64_t>(),
            spent + m["refunded"].get<uint64_t>() + m["escrow"].get<uint64_t>());
  EXPECT_EQ(m["to_nodes"].get<uint64_t>(), spent - m["treasury_cut"].get<uint64_t>());
  uint64_t units_paid = 0;
  for (const json& u : t["units"]) units_paid += u["paid"].get<uint64_t>();
  EXPECT_EQ(m["paid_to_solvers"].get<uint64_t>(), units_paid);
  EXPECT_GT(m["paid_to_verifiers"].get<uint64_t>(), 0u);  // verification pay is part of spent

  // The quote within 5% of the spend (issue 12 item 4: it left out verification pay).
  const double quoted = q["cost"].get<double>();
  EXPECT_LE(std::abs(quoted - static_cast<double>(spent)), 0.05 * static_cast<double>(spent))
      << "quoted " << quoted << ", spent " << spent << "\n" << q.dump(2) << "\n" << m.dump(2);

  // Rounds from 0 (the ledger's numbering), the same in status and fetch.
  CmdResult human = Meshlearn("task status " + id.substr(0, 12) + rpc, user);
  ASSERT_EQ(human.code, 0) << human.out;
  EXPECT_TRUE(Has(human.out, "round   0: test accuracy")) << human.out;
  EXPECT_TRUE(Has(human.out, "round   2: test accuracy")) << human.out;
  EXPECT_FALSE(Has(human.out, "round   3:")) << human.out;
  EXPECT_TRUE(Has(human.out, "rounds 3/3 done")) << human.out;
  EXPECT_TRUE(Has(human.out, "spent " + std::to_string(spent) + " = solvers ")) << human.out;
  // Until its audit window closes the model may still change (a fraud proof reopens the task):
  // the ledger says until when, status prints it.
  const uint64_t audit_end = t["audit_window_end"].get<uint64_t>();
  // A devnet's window is at least 300 s: 1500 blocks of this devnet's 200 ms.
  EXPECT_EQ(audit_end, t["closed_height"].get<uint64_t>() + 1500) << t.dump(2);
  EXPECT_TRUE(Has(human.out, "audit window: until block " + std::to_string(audit_end)))
      << human.out;

  // A finished task's watch: the result, no rate or ETA.
  CmdResult done = Meshlearn("task watch " + id.substr(0, 12) + rpc, user);
  ASSERT_EQ(done.code, 0) << done.out;
  EXPECT_FALSE(Has(done.out, "/s")) << done.out;
  EXPECT_TRUE(Has(done.out, "finished: test accuracy")) << done.out;
  EXPECT_TRUE(Has(done.out, "fetch it: meshlearn task fetch " + id.substr(0, 12) + rpc))
      << done.out;

  // Fetch, then tie the file to the ledger's record with one command; eval prints its hash.
  const std::string out = base + "/fetched";
  CmdResult fetch = Meshlearn("--json task fetch " + id.substr(0, 12) + " --out " + out + rpc,
                              user, false);
  ASSERT_EQ(fetch.code, 0) << fetch.out;
  const json f = Parse(fetch);
  ASSERT_FALSE(f.is_discarded()) << fetch.out;
  EXPECT_EQ(f["state"], t["final_state"]);
  EXPECT_EQ(f["round"], 2);
  EXPECT_EQ(f["money"], m);
  EXPECT_EQ(f["round_results"][0]["round"], 0);
  const std::string model = out + "/model.safetensors";
  CmdResult verify = Meshlearn("task verify-model " + id.substr(0, 12) + " " + model + rpc, user);
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_TRUE(Has(verify.out, "OK: ")) << verify.out;
  EXPECT_TRUE(Has(verify.out, t["final_state"].get<std::string>())) << verify.out;
  // The human fetch names the state as what it is: the task's final state (its blob id).
  CmdResult human_fetch =
      Meshlearn("task fetch " + id.substr(0, 12) + " --out " + base + "/fetched-again" + rpc, user);
  ASSERT_EQ(human_fetch.code, 0) << human_fetch.out;
  EXPECT_TRUE(Has(human_fetch.out, "final state " + t["final_state"].get<std::string>()))
      << human_fetch.out;
  EXPECT_FALSE(Has(human_fetch.out, "ledger state")) << human_fetch.out;
  CmdResult eval = Meshlearn("eval " + model + " --task " + file, user);
  EXPECT_EQ(eval.code, 0) << eval.out;
  EXPECT_TRUE(Has(eval.out, "weights hash " + f["weights_hash"].get<std::string>())) << eval.out;
  EXPECT_TRUE(Has(eval.out, "state " + t["final_state"].get<std::string>() + " of task " + id))
      << eval.out;
  EXPECT_FALSE(Has(eval.out, "step 0")) << eval.out;

  // A second task from the submitter's key: the printed follow-up carries --rpc; cancelled at
  // once, it reads "cancelled"; two tasks on the ledger, a 1-digit prefix may be ambiguous.
  CmdResult sub = Meshlearn("task submit " + file + " --key submitter" + rpc, submitter_home);
  ASSERT_EQ(sub.code, 0) << sub.out;
  const std::string hint = "watch it: meshlearn task watch ";
  ASSERT_TRUE(Has(sub.out, hint)) << sub.out;
  const std::string hint_line = sub.out.substr(sub.out.find(hint));
  EXPECT_TRUE(Has(hint_line.substr(0, hint_line.find('\n')), rpc)) << sub.out;
  const std::string second = hint_line.substr(hint.size(), 12);
  CmdResult cancel =
      Meshlearn("task cancel " + second + " --key submitter" + rpc, submitter_home);
  ASSERT_EQ(cancel.code, 0) << cancel.out;
  EXPECT_TRUE(Has(cancel.out, "cancelled; spent ")) << cancel.out;
  CmdResult cst = Meshlearn("task status " + second + rpc, user);
  EXPECT_EQ(cst.code, 0) << cst.out;
  EXPECT_TRUE(Has(cst.out, ": cancelled\n")) << cst.out;
  if (second[0] == id[0]) {
    CmdResult amb = Meshlearn("task status " + id.substr(0, 1) + rpc, user);
    EXPECT_EQ(amb.code, 1);
    EXPECT_TRUE(Has(amb.out, "2 tasks have ids starting with")) << amb.out;
    EXPECT_TRUE(Has(amb.out, id)) << amb.out;
  }

  kill(pid, SIGINT);  // --keep: Ctrl-C stops the network; devnet then writes its report
  int status = 0;
  waitpid(pid, &status, 0);
  stop.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadText(log);

  // What the nodes' accounts gained from the task is what the ledger paid them less the
  // treasury's cut (docs/submitters.md, "Where the tokens go"), plus any jackpot rewards.
  const json report = json::parse(ReadText(dir + "/report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ReadText(log);
  int64_t earned = 0;
  for (const json& n : report["nodes"]) earned += n.value("earned", int64_t{0});
  EXPECT_EQ(earned, static_cast<int64_t>(m["to_nodes"].get<uint64_t>() +
                                         t["verification"]["jackpot_paid"].get<uint64_t>()))
      << report.dump(2);
}

}  // namespace
