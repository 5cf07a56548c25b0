// The dashboard (ledger/dashboard.h) that `meshlearn chain serve` answers at GET /, in a real
// browser: a devnet with a lazy solver trains tests/devnet-tiny.toml and stays up (--keep);
// Debian's headless chromium loads the URL devnet printed, and the numbers in its DOM must equal
// what the ledger's RPC answers through `meshlearn task status --json` and `meshlearn wallet
// balance` (tokens paid, the slash, accuracy per round) and what devnet's report.json says of the
// lazy solver (slashed, jailed, never paid). A screenshot of the page is saved as a test artifact
// ($MESHLEARN_TEST_ARTIFACTS, else BUILD_DIR/test-artifacts/dashboard.png) and its path printed.
// Skipped, visibly, without chromium (scripts/setup.sh installs it for the test run) or without
// Fashion-MNIST.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "meshlearn/base/blob.h"
#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::Child;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::HttpAnswer;
using meshlearn::process_test::HttpGet;
using meshlearn::process_test::HttpRequest;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
using meshlearn::process_test::TempDir;
using meshlearn::process_test::WaitFor;
using nlohmann::json;

std::string Chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// chromium --headless with a profile of its own in `dir`; `args` before the URL. --no-sandbox:
// tests run as root in CI, where chromium's sandbox refuses to start; the page is our own.
// The virtual time budget lets the page's script run (its RPC calls, a few live updates) before
// the DOM is dumped or the screenshot taken.
std::string ChromiumCommand(const std::string& dir, const std::string& args,
                            const std::string& url) {
  return Chromium() +
         " --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" + dir +
         " --virtual-time-budget=3000 " + args + " '" + url + "' 2>" + dir + ".log";
}

// Runs ChromiumCommand under `timeout`. What chromium prints (--dump-dom's DOM) goes to DIR.out
// and is read from there, not through a pipe: a helper process chromium leaves behind (its crash
// handler) could hold a pipe open after chromium itself has ended, and the test would wait on it
// until ctest's limit. A chromium that never ends fails the test with code 124 (`timeout`'s),
// named in the assertion, instead of hanging it.
constexpr int kChromiumSeconds = 180;
CmdResult RunChromium(const std::string& dir, const std::string& args, const std::string& url) {
  const std::string out = dir + ".out";
  CmdResult r = Shell("timeout -k 10 " + std::to_string(kChromiumSeconds) + " " +
                      ChromiumCommand(dir, args, url) + " >" + out);
  r.out = ReadText(out);
  return r;
}

// What a failed RunChromium says: its exit code (124: it did not end in kChromiumSeconds) and its
// log.
std::string ChromiumFailure(const CmdResult& r, const std::string& dir) {
  return "chromium exited " + std::to_string(r.code) +
         (r.code == 124 ? " (it did not end in " + std::to_string(kChromiumSeconds) + " s)" : "") +
         "; its log:\n" + ReadText(dir + ".log");
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The text of the element with data-k="key" in a dumped DOM ("" if none).
std::string DomValue(const std::string& dom, const std::string& key) {
  const std::string attr = "data-k=\"" + key + "\"";
  const size_t at = dom.find(attr);
  if (at == std::string::npos) return "";
  const size_t open = dom.find('>', at);
  const size_t close = dom.find('<', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return dom.substr(open + 1, close - open - 1);
}

std::string Fixed4(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

std::string ArtifactDir() {
  const char* env = std::getenv("MESHLEARN_TEST_ARTIFACTS");
  return env && *env ? env : MESHLEARN_BINARY_DIR "/test-artifacts";
}

// GET / is the page: self-contained (no script, style or image from anywhere else) and the same
// on a bare chain as on a busy one.
TEST(Dashboard, ChainServeAnswersThePageAtSlash) {
  const std::string home = TempDir("dashboard");
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ChainServer chain(home);
  ASSERT_FALSE(chain.url().empty()) << ReadText(home + "/serve.out");
  const std::string host_port = chain.url().substr(std::string("http://").size());
  const std::string page = HttpGet(host_port, "/");
  ASSERT_NE(page.find("<title>meshlearn dashboard</title>"), std::string::npos)
      << page.substr(0, 400);
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link rel=\"stylesheet\""), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  // The one http:// in it is the SVG namespace name, which is never fetched.
  for (size_t at = page.find("http://"); at != std::string::npos;
       at = page.find("http://", at + 1)) {
    EXPECT_EQ(page.compare(at, 26, "http://www.w3.org/2000/svg"), 0) << page.substr(at, 60);
  }
  // The task view's downloads refuse, saying why, what they cannot serve (the rest:
  // DashboardDownloads.* in ledger_service_test, and the devnet test below).
  const std::string zeros(64, '0');
  HttpAnswer bad = HttpRequest(host_port, "/tasks/not-a-task/model");
  EXPECT_EQ(bad.status, 400) << bad.headers;
  EXPECT_NE(bad.body.find("'not-a-task' in /tasks/not-a-task/model is not a task id"),
            std::string::npos) << bad.body;
  for (const char* file : {"/model", "/audit.json"}) {
    HttpAnswer unknown = HttpRequest(host_port, "/tasks/" + zeros + file);
    EXPECT_EQ(unknown.status, 404) << file;
    EXPECT_NE(unknown.body.find("no task " + zeros + " on this ledger"), std::string::npos)
        << unknown.body;
  }
  // `chain serve` says where it is.
  EXPECT_NE(ReadText(home + "/serve.out").find("\"dashboard\":\"" + chain.url() + "/\""),
            std::string::npos)
      << ReadText(home + "/serve.out");
}

TEST(Dashboard, ChromiumShowsTheDevnetsNumbersAndTheLazySolversSlash) {
  if (Chromium().empty())
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --test installs it)";
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "Fashion-MNIST not installed";
  }
  const auto t0 = std::chrono::steady_clock::now();  // for the log only: where the time went
  const std::string dir = TempDir("dashboard");
  const std::string out = dir + "/d", log = dir + "/devnet.log";
  Child devnet(dir + "/home", log,
               {"devnet", "--solvers", "4", "--task", MESHLEARN_SOURCE_DIR "/tests/devnet-tiny.toml",
                "--block-interval-ms", "200", "--adversary", "solver:lazy", "--no-check-reference",
                "--keep", "--out", out},
               SIGINT);
  // While the task runs, its model is refused (409) with the reason.
  const std::string running = WaitFor(log, "task ", "0123456789abcdef", 300, /*min_len=*/64);
  ASSERT_EQ(running.size(), 64u) << ReadText(log);
  {
    const std::string early = WaitFor(log, "dashboard: ", "abcdefghijklmnopqrstuvwxyz0123456789:/.", 1, 10);
    ASSERT_EQ(early.rfind("http://", 0), 0u) << ReadText(log);
    const HttpAnswer a = HttpRequest(early.substr(7, early.size() - 8), "/tasks/" + running + "/model");
    if (a.status == 409) {
      EXPECT_NE(a.body.find("task " + running + " is open"), std::string::npos) << a.body;
    } else {  // only if the task finished within a moment of its submission
      EXPECT_EQ(a.status, 200) << a.headers << "\n" << a.body.substr(0, 400);
    }
    std::cout << "model of the running task: HTTP " << a.status << std::endl;
  }
  ASSERT_NE(WaitFor(log, "Ctrl-C stops it", "", 300), "") << ReadText(log);
  std::cout << "devnet task finished after " << SecondsSince(t0) << " s" << std::endl;
  // The URL as devnet printed it (the first time, when the ledger came up).
  const std::string url =
      WaitFor(log, "dashboard: ", "abcdefghijklmnopqrstuvwxyz0123456789:/.", 1, 10);
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << ReadText(log);
  ASSERT_EQ(url.back(), '/') << url;
  const std::string rpc = url.substr(0, url.size() - 1);
  const std::string host_port = rpc.substr(std::string("http://").size());

  const json report = json::parse(ReadText(out + "/report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ReadText(out + "/report.json");
  const std::string task_id = report["task_id"];
  const json& slashed = report["verification"]["slashed"];
  ASSERT_EQ(slashed.size(), 1u) << report.dump(2);
  const std::string lazy = slashed[0]["node"];

  // What the RPC answers, through the CLI commands the page must agree with.
  auto cli = [&](const std::string& args) {
    CmdResult r = Shell("MESHLEARN_HOME=" + out + "/home " + MESHLEARN_BIN + " --json " + args +
                        " --rpc " + rpc + " 2>&1");
    EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  };
  const json status = cli("task status " + task_id);
  ASSERT_EQ(status["status"], "finished") << status.dump(2);
  EXPECT_EQ(task_id, running);

  // The page as chromium renders it, the lazy solver selected.
  const std::string page_url = url + "#task=" + task_id + "&node=" + lazy;
  CmdResult dumped = RunChromium(dir + "/chromium", "--dump-dom", page_url);
  ASSERT_EQ(dumped.code, 0) << ChromiumFailure(dumped, dir + "/chromium");
  const std::string& dom = dumped.out;
  std::cout << "chromium --dump-dom done after " << SecondsSince(t0) << " s" << std::endl;
  ASSERT_NE(DomValue(dom, "task-id"), "") << dom.substr(0, 2000);
  EXPECT_EQ(DomValue(dom, "task-id"), task_id);
  EXPECT_EQ(DomValue(dom, "task-status"), "finished");

  // Tokens, as `task status --json` reports them.
  const json& money = status["money"];
  EXPECT_EQ(DomValue(dom, "task-budget"), std::to_string(money["budget"].get<uint64_t>()));
  EXPECT_EQ(DomValue(dom, "task-spent"), std::to_string(money["spent"].get<uint64_t>()));
  EXPECT_EQ(DomValue(dom, "task-paid-solvers"),
            std::to_string(money["paid_to_solvers"].get<uint64_t>()));
  EXPECT_EQ(DomValue(dom, "task-paid-verifiers"),
            std::to_string(money["paid_to_verifiers"].get<uint64_t>()));
  EXPECT_EQ(DomValue(dom, "task-paid-aggregators"),
            std::to_string(money["paid_to_aggregators"].get<uint64_t>()));
  EXPECT_EQ(DomValue(dom, "task-refunded"), std::to_string(money["refunded"].get<uint64_t>()));
  EXPECT_GT(money["paid_to_solvers"].get<uint64_t>(), 0u);

  // The slash: the ledger's count for the task, and what the lazy solver's stake lost.
  const uint64_t slash = status["verification"]["slashed"].get<uint64_t>();
  EXPECT_GT(slash, 0u);
  EXPECT_EQ(DomValue(dom, "task-slashed"), std::to_string(slash));
  EXPECT_EQ(slash, slashed[0]["amount"].get<uint64_t>()) << report.dump(2);
  EXPECT_EQ(DomValue(dom, "node-" + lazy + "-status"), "jailed");
  // The dispute timeline names the lazy solver as the one who committed a disputed unit. It need
  // not be the first dispute: a forced error drawn for an honest solver is disputed too, and which
  // comes first depends on the block hashes.
  EXPECT_EQ(dom.find("data-k=\"disputes\" data-count=\"0\""), std::string::npos);
  EXPECT_NE(dom.find("data-k=\"disputes\" data-count=\""), std::string::npos);
  std::vector<std::string> dispute_solvers;
  for (int i = 0;; ++i) {
    std::string solver = DomValue(dom, "dispute-" + std::to_string(i) + "-solver");
    if (solver.empty()) break;
    dispute_solvers.push_back(solver);
  }
  EXPECT_NE(std::find(dispute_solvers.begin(), dispute_solvers.end(), lazy.substr(0, 10)),
            dispute_solvers.end())
      << "lazy solver " << lazy << "; disputes' solvers: " << json(dispute_solvers).dump();

  // Accuracy and test loss per round, and the plot of them.
  const json& rounds = status["round_results"];
  ASSERT_EQ(rounds.size(), 3u) << status.dump(2);
  for (const json& r : rounds) {
    const std::string n = std::to_string(r["round"].get<int>());
    EXPECT_EQ(DomValue(dom, "round-" + n + "-accuracy"),
              Fixed4(r["test_accuracy_ppm"].get<uint32_t>() / 1e6))
        << n;
    EXPECT_EQ(DomValue(dom, "round-" + n + "-test-loss"),
              Fixed4(r["test_loss_micros"].get<uint64_t>() / 1e6))
        << n;
  }
  EXPECT_NE(dom.find("id=\"loss-plot\" data-points=\"3\""), std::string::npos);

  // Per node: what devnet's report counted from the same records, the wallet's balance, and
  // the earnings by kind the ledger records on the node (get_node, through `wallet balance`).
  const json& v = status["verification"];
  uint64_t verification = 0, jackpot = 0, stake_slashed = 0, units_paid = 0;
  for (const json& n : report["nodes"]) {
    const std::string id = n["node"];
    EXPECT_EQ(DomValue(dom, "node-" + id + "-units"), std::to_string(n["units"].get<int>())) << id;
    EXPECT_EQ(DomValue(dom, "node-" + id + "-stake"), std::to_string(n["stake"].get<uint64_t>()))
        << id;
    EXPECT_EQ(DomValue(dom, "node-" + id + "-slashes"),
              std::to_string(n["reputation"]["slashes"].get<uint64_t>()))
        << id;
    const json wallet = cli("wallet balance " + id);
    EXPECT_EQ(DomValue(dom, "node-" + id + "-balance"),
              std::to_string(wallet["balance"].get<uint64_t>()))
        << id;
    ASSERT_TRUE(wallet.contains("node")) << wallet.dump(2);
    const json& e = wallet["node"]["earnings"];
    for (const char* kind : {"units", "aggregation", "verification", "jackpot"}) {
      EXPECT_EQ(DomValue(dom, "node-" + id + "-paid-" + kind),
                std::to_string(e[kind].get<uint64_t>()))
          << id << " " << kind;
    }
    EXPECT_EQ(DomValue(dom, "node-" + id + "-slashed"), std::to_string(e["slashed"].get<uint64_t>()))
        << id;
    // Without a rewound round the units' records hold every payment, as the report sums them.
    if (v["rounds_rewound"].get<uint64_t>() == 0) {
      EXPECT_EQ(e["units"].get<uint64_t>(), n["paid_for_units"].get<uint64_t>()) << id;
      EXPECT_EQ(e["aggregation"].get<uint64_t>(), n["paid_for_aggregation"].get<uint64_t>()) << id;
    }
    verification += e["verification"].get<uint64_t>();
    jackpot += e["jackpot"].get<uint64_t>();
    stake_slashed += e["slashed"].get<uint64_t>();
    units_paid += e["units"].get<uint64_t>();
  }
  // The nodes' records add up to the task's (one task on this chain): verifiers paid, jackpot,
  // slashed stake; the lazy solver's own record holds the whole slash and no pay.
  EXPECT_GT(verification, 0u);
  EXPECT_EQ(verification, v["verifiers_paid"].get<uint64_t>());
  EXPECT_EQ(verification, money["paid_to_verifiers"].get<uint64_t>());
  EXPECT_EQ(jackpot, v["jackpot_paid"].get<uint64_t>());
  EXPECT_EQ(stake_slashed, slash);
  EXPECT_EQ(DomValue(dom, "node-" + lazy + "-slashed"), std::to_string(slash));
  EXPECT_EQ(DomValue(dom, "node-" + lazy + "-paid-units"), "0");
  EXPECT_GE(units_paid, money["paid_to_solvers"].get<uint64_t>());
  // The selected node's earnings, and the transactions behind them.
  EXPECT_EQ(DomValue(dom, "detail-units"), "0");
  EXPECT_NE(DomValue(dom, "detail-units-txs"), "0");  // its CommitUnits, paid nothing

  // The task view's downloads, through the page's links: the model is the blob the ledger
  // recorded as the final state; the audit record is the ledger's record.
  const std::string model_href = "/tasks/" + task_id + "/model";
  EXPECT_NE(dom.find("href=\"" + model_href + "\""), std::string::npos);
  const HttpAnswer model = HttpRequest(host_port, model_href);
  ASSERT_EQ(model.status, 200) << model.headers << "\n" << model.body.substr(0, 400);
  EXPECT_NE(model.headers.find("Content-Disposition: attachment"), std::string::npos)
      << model.headers;
  EXPECT_EQ(model.body.substr(0, 5), "MLGS1");
  EXPECT_EQ(meshlearn::BuildManifest(meshlearn::AsBytes(model.body)).id().ToHex(),
            status["final_state"].get<std::string>());
  const std::string audit_href = "/tasks/" + task_id + "/audit.json";
  EXPECT_NE(dom.find("href=\"" + audit_href + "\""), std::string::npos);
  const HttpAnswer audit = HttpRequest(host_port, audit_href);
  ASSERT_EQ(audit.status, 200) << audit.headers << "\n" << audit.body.substr(0, 400);
  const json record = json::parse(audit.body, nullptr, false);
  ASSERT_FALSE(record.is_discarded()) << audit.body.substr(0, 400);
  EXPECT_EQ(record["task"]["id"], task_id);
  EXPECT_EQ(record["task"]["final_state"], status["final_state"]);
  EXPECT_EQ(record["task"]["weights_history"], status["weights_history"]);
  EXPECT_EQ(record["task"]["units"].size(), status["units"].size());
  EXPECT_EQ(record["task"]["verification"], status["verification"]);

  // Live: the page re-read the ledger as blocks arrived, without being reloaded.
  const std::string first = DomValue(dom, "first-height"), last = DomValue(dom, "height");
  ASSERT_FALSE(first.empty() || last.empty()) << dom.substr(0, 2000);
  EXPECT_GE(std::stoi(DomValue(dom, "updates")), 2);
  EXPECT_GT(std::stoull(last), std::stoull(first));

  // The screenshot, kept as the test's artifact. #updates=3: the page stops polling after three
  // updates, so that chromium sees it idle and takes the picture.
  std::filesystem::create_directories(ArtifactDir());
  const std::string png = ArtifactDir() + "/dashboard.png";
  std::filesystem::remove(png);
  CmdResult shot = RunChromium(dir + "/chromium-shot",
                               "--hide-scrollbars --window-size=1600,3200 --screenshot=" + png,
                               page_url + "&updates=3");
  ASSERT_EQ(shot.code, 0) << ChromiumFailure(shot, dir + "/chromium-shot");
  const std::string bytes = ReadText(png);
  ASSERT_GT(bytes.size(), 20000u) << png;
  EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n");
  std::cout << "dashboard screenshot: " << png << " (after " << SecondsSince(t0) << " s)"
            << std::endl;
  RecordProperty("screenshot", png);
}

// A pipeline task's dispute on the page: the lazy stage's unit (committed by CommitStage) in the
// dispute timeline, decided by the ledger's own ruling (RefereeTile of the stage step's roots, or
// RefereeStageStep of its continuity), the one the devnet's report read from the chain.
TEST(Dashboard, ChromiumShowsALazyStagesDisputeDecidedByTheLedgersReplay) {
  if (Chromium().empty()) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --test installs it)";
  }
  const std::string dir = TempDir("dashboard");
  const std::string out = dir + "/d", log = dir + "/devnet.log";
  // As Devnet.ALazyStageOnAVerifyingChain...: the honest nodes report 0.9x the machine's
  // throughput, so the lazy one (node6) always takes a stage.
  Child devnet(dir + "/home", log,
               {"devnet", "--solvers", "7", "--task",
                MESHLEARN_SOURCE_DIR "/tests/devnet-pipeline.toml", "--block-interval-ms", "200",
                "--adversary", "solver:lazy", "--speed", "0=0.9", "--speed", "1=0.9", "--speed",
                "2=0.9", "--speed", "3=0.9", "--speed", "4=0.9", "--speed", "5=0.9",
                "--no-check-reference", "--keep", "--out", out},
               SIGINT);
  ASSERT_NE(WaitFor(log, "Ctrl-C stops it", "", 300), "") << ReadText(log);
  const std::string url =
      WaitFor(log, "dashboard: ", "abcdefghijklmnopqrstuvwxyz0123456789:/.", 1, 10);
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << ReadText(log);
  const json report = json::parse(ReadText(out + "/report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ReadText(out + "/report.json");
  const json& slashed = report["verification"]["slashed"];
  ASSERT_EQ(slashed.size(), 1u) << report.dump(2);
  const std::string lazy = slashed[0]["node"];
  const std::string task_id = report["task_id"];
  CmdResult dumped =
      RunChromium(dir + "/chromium", "--dump-dom", url + "#task=" + task_id + "&node=" + lazy);
  ASSERT_EQ(dumped.code, 0) << ChromiumFailure(dumped, dir + "/chromium");
  const std::string& dom = dumped.out;
  // The dumped page, kept as the test's artifact.
  std::filesystem::create_directories(ArtifactDir());
  const std::string page = ArtifactDir() + "/dashboard-pipeline.html";
  std::ofstream(page) << dom;
  ASSERT_EQ(DomValue(dom, "task-id"), task_id) << dom.substr(0, 2000);
  EXPECT_EQ(DomValue(dom, "node-" + lazy + "-status"), "jailed");
  // The lazy stage's entries in the dispute timeline (not necessarily the first: a forced error
  // drawn for an honest stage is disputed too, in block-hash order; and the timeline has an entry
  // per attempt, so a lazy stage that committed its unit twice has two) include the ruling the
  // devnet's report read from the chain for it: a RefereeTile (the game played over the stage's
  // plan to the agreed chain end's roots) or a RefereeStageStep (the stage's step replayed, or
  // its continuity ruled from two commits). Which one depends on the step the beacon drew, so the
  // test asks the report.
  const json* ruling = nullptr;
  for (const json& d : report["verification"]["disputes_ruled"]) {
    if (d.value("defender", "") == lazy) ruling = &d;
  }
  ASSERT_NE(ruling, nullptr) << report["verification"].dump(2);
  const std::string tx = (*ruling)["tx"];
  ASSERT_TRUE(tx == "RefereeTile" || tx == "RefereeStageStep") << ruling->dump();
  const std::string how =
      (tx == "RefereeTile" ? "ruled the whole step from its operator roots) itself (RefereeTile"
                           : "does not start where the stage's previous step ended) itself "
                             "(RefereeStageStep") +
      std::string(" at block ") + std::to_string((*ruling)["height"].get<uint64_t>());
  std::vector<std::string> lazy_entries;
  for (int i = 0;; ++i) {
    const size_t at = dom.find("data-k=\"dispute-" + std::to_string(i) + "-solver\"");
    if (at == std::string::npos) break;
    // An entry ends at its last line ("the solver now ..."; the dump also holds the page's
    // script, which spells every line's text, after the last entry).
    const size_t end = dom.find("the solver now", at);
    ASSERT_NE(end, std::string::npos) << dom.substr(at);
    if (DomValue(dom, "dispute-" + std::to_string(i) + "-solver") == lazy.substr(0, 10)) {
      lazy_entries.push_back(dom.substr(at, end - at));
    }
  }
  ASSERT_FALSE(lazy_entries.empty()) << "no dispute names the lazy stage " << lazy;
  const auto ruled = std::find_if(lazy_entries.begin(), lazy_entries.end(),
                                  [&](const std::string& e) { return e.find(how) != e.npos; });
  ASSERT_NE(ruled, lazy_entries.end()) << ruling->dump() << "\n" << json(lazy_entries).dump(2);
  EXPECT_EQ(ruled->find("no ruling transaction"), std::string::npos) << *ruled;
}

}  // namespace
