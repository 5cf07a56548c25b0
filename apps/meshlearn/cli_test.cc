// Runs the real `meshlearn` binary and checks its output and exit codes.
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
using meshlearn::process_test::WaitFor;
using nlohmann::json;
std::string TempHome() { return meshlearn::process_test::TempDir("cli"); }

TEST(Cli, HelpListsCommandsWithExamples) {
  CmdResult r = Meshlearn("--help", TempHome());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("keys"), std::string::npos);
  EXPECT_NE(r.out.find("version"), std::string::npos);
  EXPECT_NE(r.out.find("Examples"), std::string::npos);
}

// House rule: every command's --help shows examples. Walks the command tree as `--help` lists
// it (a subcommand's help inherits its parent's footer unless it sets its own, which must then
// carry examples itself).
std::vector<std::string> SubcommandsIn(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream in(help);
  std::string line;
  bool listing = false;
  while (std::getline(in, line)) {
    if (line == "Subcommands:") {
      listing = true;
    } else if (listing && line.empty()) {
      listing = false;
    } else if (listing && line.size() > 2 && line[0] == ' ' && line[2] != ' ') {
      names.push_back(line.substr(2, line.find(' ', 2) - 2));
    }
  }
  return names;
}

TEST(Cli, EveryCommandsHelpShowsExamples) {
  std::string home = TempHome();
  std::vector<std::string> commands = SubcommandsIn(Meshlearn("--help", home).out);
  ASSERT_GE(commands.size(), 10u);
  size_t checked = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    CmdResult r = Meshlearn(commands[i] + " --help", home);
    ASSERT_EQ(r.code, 0) << commands[i] << ": " << r.out;
    EXPECT_NE(r.out.find("Examples"), std::string::npos)
        << "meshlearn " << commands[i] << " --help:\n"
        << r.out;
    ++checked;
    if (commands[i].find(' ') == std::string::npos) {
      for (const std::string& sub : SubcommandsIn(r.out))
        commands.push_back(commands[i] + " " + sub);
    }
  }
  // The command tree: 12 commands, and the subcommands of keys, chain, wallet, task and node.
  EXPECT_GE(checked, 40u);
}

// devnet --help names every adversary mode a node accepts (node/src/adversary.cc's kNames; each
// is accepted by --adversary: docs/operators.md, "Adversary modes").
TEST(Cli, DevnetHelpNamesEveryAdversaryMode) {
  CmdResult r = Meshlearn("devnet --help", TempHome());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* mode : {"lazy", "noisy", "wrong_data", "copy", "stale", "wrong_result",
                           "noisy_last", "targeted", "drift", "wrong_example", "rubber_stamp"}) {
    EXPECT_NE(r.out.find(mode), std::string::npos) << mode << " missing from:\n" << r.out;
  }
}

// `node run` declares the disk it offers to pipeline stage files (the ledger places stages by
// it): a limit above the free space of its data dir, from --disk-limit or node.toml's
// disk_limit_bytes, is refused at start, naming where it came from and the fix, before the node
// registers or benchmarks anything (the ledger here is not even running).
TEST(Cli, NodeRunRefusesADiskLimitAboveItsDataDirsFreeSpace) {
  const std::string home = TempHome();
  const std::string dir = meshlearn::process_test::TempDir("cli-node-disk");
  const uint16_t port = meshlearn::process_test::FreePort();
  auto write_config = [&](const std::string& extra) {
    std::ofstream(dir + "/node.toml") << "data_dir = \"data\"\n"
                                      << "rpc = \"http://127.0.0.1:1\"\n"
                                      << "listen = \"127.0.0.1:" << port << "\"\n"
                                      << "endpoint = \"127.0.0.1:7801\"\n"
                                      << extra << "[capabilities]\n"
                                      << "throughput = 1000000000\n";
  };
  auto run = [&](const std::string& args, int seconds = 60) {
    return Shell("MESHLEARN_HOME=" + home + " timeout " + std::to_string(seconds) + " " +
                 MESHLEARN_BIN + " node run --config " + dir + "/node.toml " + args + " 2>&1");
  };
  const std::string huge = "4000000000000000000";  // 4 EB: more than any disk has free
  write_config("");
  CmdResult flag = run("--disk-limit " + huge);
  EXPECT_EQ(flag.code, 1) << flag.out;
  EXPECT_NE(flag.out.find("--disk-limit = " + huge + " bytes is more disk than the data dir"),
            std::string::npos)
      << flag.out;
  EXPECT_NE(flag.out.find("Lower --disk-limit to at most"), std::string::npos) << flag.out;
  // The largest value a user can type is a limit like any other (it once meant "not given" and
  // was ignored): refused too. A run that ignored it would go on until `timeout` (exit 124).
  const std::string most = "18446744073709551615";  // UINT64_MAX
  CmdResult most_flag = run("--disk-limit " + most, 10);
  EXPECT_EQ(most_flag.code, 1) << most_flag.out;
  EXPECT_NE(most_flag.out.find("--disk-limit = " + most + " bytes is more disk than the data dir"),
            std::string::npos)
      << most_flag.out;
  write_config("disk_limit_bytes = " + huge + "\n");
  CmdResult key = run("");
  EXPECT_EQ(key.code, 1) << key.out;
  EXPECT_NE(key.out.find("disk_limit_bytes (" + dir + "/node.toml) = " + huge), std::string::npos)
      << key.out;
  // The flag replaces the key: a limit the disk holds passes the check (the node then goes on to
  // its ledger, which is not there, until `timeout` stops it).
  CmdResult fits = run("--disk-limit 1048576", 5);
  EXPECT_EQ(fits.out.find("more disk than the data dir"), std::string::npos) << fits.out;
  EXPECT_NE(fits.out.find("disk for stage files: 1 MiB"), std::string::npos) << fits.out;
  // A restart after a crash: the stage files the last process left (256 MiB here) are deleted
  // before the free space is measured, as the agent would delete them at its start, so a limit
  // 128 MiB over what is free beside them fits (before, such a node failed the check on every
  // restart and never reached the agent that would have freed the space).
  const std::filesystem::path stages = std::filesystem::path(dir) / "data" / "stages";
  ASSERT_TRUE(std::filesystem::is_directory(stages.parent_path())) << "the node's data dir";
  std::filesystem::create_directories(stages);
  {
    std::ofstream left(stages / "checkpoint-left-by-a-crash.bin", std::ios::binary);
    const std::string mib(1 << 20, 'x');
    for (int i = 0; i < 256; ++i) left << mib;
    ASSERT_TRUE(left.good());
  }
  struct statvfs fs {};
  ASSERT_EQ(statvfs(stages.c_str(), &fs), 0);
  const uint64_t free_beside = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  CmdResult restart = run("--disk-limit " + std::to_string(free_beside + (128u << 20)), 5);
  EXPECT_EQ(restart.out.find("more disk than the data dir"), std::string::npos) << restart.out;
  EXPECT_NE(restart.out.find("disk for stage files"), std::string::npos) << restart.out;
  EXPECT_FALSE(std::filesystem::exists(stages / "checkpoint-left-by-a-crash.bin"));
}

TEST(Cli, VersionJson) {
  CmdResult r = Meshlearn("--json version", TempHome());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("git_commit"));
  EXPECT_TRUE(j.contains("cpu_features"));
}

TEST(Cli, BadLogLevelIsAUsageError) {
  CmdResult r = Meshlearn("--log-level loud version", TempHome());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("trace, debug, info"), std::string::npos) << r.out;
}

TEST(Cli, KeysLifecycle) {
  std::string home = TempHome();
  CmdResult created = Meshlearn("--json keys new alice --no-passphrase", home);
  ASSERT_EQ(created.code, 0) << created.out;
  std::string pk = nlohmann::json::parse(created.out)["public_key"];

  CmdResult dup = Meshlearn("keys new alice --no-passphrase", home);
  EXPECT_EQ(dup.code, 1);
  EXPECT_NE(dup.out.find("already exists"), std::string::npos);

  CmdResult list = Meshlearn("--json keys list", home);
  ASSERT_EQ(list.code, 0);
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["public_key"], pk);

  std::string backup = home + "/backup.json";
  ASSERT_EQ(Meshlearn("keys export alice " + backup, home).code, 0);
  std::string other = TempHome();
  CmdResult imp = Meshlearn("--json keys import " + backup, other);
  ASSERT_EQ(imp.code, 0) << imp.out;
  EXPECT_EQ(nlohmann::json::parse(imp.out)["public_key"], pk);

  CmdResult err = Meshlearn("--json keys show nobody", home);
  EXPECT_EQ(err.code, 1);
  EXPECT_TRUE(nlohmann::json::parse(err.out).contains("error"));
}

TEST(Cli, EncryptedKeyWithPassphraseFile) {
  std::string home = TempHome();
  std::string pass = home + "/pass.txt";
  FILE* f = fopen(pass.c_str(), "w");
  fputs("correct horse\n", f);
  fclose(f);
  CmdResult r = Meshlearn("--json keys new bob --passphrase-file " + pass, home);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["encrypted"], true);
}

uint64_t Balance(const std::string& who, const std::string& url, const std::string& home) {
  CmdResult r = Meshlearn("--json wallet balance " + who + " --rpc " + url + " 2>/dev/null", home);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? 0 : j.value("balance", uint64_t{0});
}

// One sequencer per chain directory: a second `chain serve` of a served directory is refused,
// naming the process that holds it and the fix (it once started beside the first and failed every
// block it produced on the database's unique height), and the first serves on.
TEST(Cli, ASecondChainServeOfTheSameDirectoryIsRefused) {
  std::string home = TempHome();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ChainServer server(home);
  ASSERT_FALSE(server.url().empty()) << "chain serve did not start";
  // Under `timeout`: without the lock the second server would serve on.
  CmdResult second = Shell("MESHLEARN_HOME=" + home + " timeout 30 " + MESHLEARN_BIN +
                           " chain serve --dir " + home + "/chain --listen 127.0.0.1:0 2>&1");
  EXPECT_EQ(second.code, 1) << second.out;
  EXPECT_NE(second.out.find("is already served by another `meshlearn chain serve` (pid "),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("stop that process first, or serve another --dir"), std::string::npos)
      << second.out;
  EXPECT_EQ(Balance("alice", server.url(), home), 1000000u);
}

// A send that timed out is retried by running the same command again: the wallet resends the
// very same signed transaction (kept in $MESHLEARN_HOME/outbox), so it is paid once. A different
// command is refused while it is unconfirmed; after a confirmed send, the same command pays again.
TEST(Cli, WalletRetryAfterTimeoutPaysOnce) {
  std::string home = TempHome();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).code, 0);
  ChainServer server(home);
  ASSERT_FALSE(server.url().empty()) << "chain serve did not start";
  const std::string rpc = " --rpc " + server.url();

  // --timeout 0: the wait ends at once, as a timeout would; the transaction waits in the outbox.
  CmdResult timed_out = Meshlearn("wallet transfer bob 100 --key alice --timeout 0" + rpc, home);
  EXPECT_EQ(timed_out.code, 1);
  EXPECT_NE(timed_out.out.find("Re-running this same command"), std::string::npos) << timed_out.out;
  EXPECT_TRUE(std::ifstream(home + "/outbox/alice.tx").good());

  CmdResult other = Meshlearn("wallet transfer bob 7 --key alice" + rpc, home);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("unconfirmed transaction"), std::string::npos) << other.out;

  CmdResult retry = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(retry.code, 0) << retry.out;
  EXPECT_NE(retry.out.find("resending the earlier"), std::string::npos) << retry.out;
  CmdResult again = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(again.code, 0) << again.out;  // a confirmed send left no outbox: a new payment
  EXPECT_EQ(Balance("bob", server.url(), home), 200u);
  EXPECT_FALSE(std::ifstream(home + "/outbox/alice.tx").good());
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// A tiny character-level GPT on the GPL text Debian's base-files installs.
std::string TinyLmTask(const std::string& extra = "") {
  return "[task]\nname = \"tiny-lm\"\nseed = 3\n"
         "[data]\nformat = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\n"
         "val_fraction = 0.1\n"
         "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
         "[train]\nsteps = 2\nbatch_size = 4\nseq_len = 16\neval_batches = 1\n" +
         extra;
}

// Regression (issue 12, report.json paths): a path inside a file is relative to that file's
// folder (docs/paths.md); report.json said "model": "rel/out/model.safetensors", relative to the
// working directory of `train`, which a reader resolving against the report's folder misses.
TEST(Cli, TrainReportNamesItsFilesRelativeToItself) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  std::ofstream(cwd + "/lm.toml") << TinyLmTask();
  CmdResult r = Shell("cd " + cwd + " && MESHLEARN_HOME=home " + MESHLEARN_BIN +
                      " --json train lm.toml --no-eval --out rel/out 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const json printed = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(printed.is_discarded()) << r.out;
  EXPECT_EQ(printed["model"], "rel/out/model.safetensors");  // stdout: the command line's paths
  const std::filesystem::path dir = cwd + "/rel/out";
  const json report = json::parse(ReadText(dir / "report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded());
  EXPECT_EQ(report["model"], "model.safetensors");
  EXPECT_EQ(report["checkpoint"], "checkpoint.safetensors");
  EXPECT_EQ(report["task_file"], "../../lm.toml");
  for (const char* key : {"model", "checkpoint", "task_file"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(dir / report[key].get<std::string>())) << key;
  }
  // An absolute --out: an absolute path means itself everywhere, the report's folder included.
  CmdResult abs = Meshlearn("train " + cwd + "/lm.toml --no-eval --out " + cwd + "/abs", cwd);
  ASSERT_EQ(abs.code, 0) << abs.out;
  const json abs_report = json::parse(ReadText(cwd + "/abs/report.json"), nullptr, false);
  ASSERT_FALSE(abs_report.is_discarded());
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(cwd + "/abs") /
                                               abs_report["model"].get<std::string>()));
}

// A small GPT's network task over the GPL's text, with `pipeline` appended to its [network]
// table, written to DIR/pipe.toml; returns that path.
std::string PipeTask(const std::string& dir, const std::string& pipeline) {
  std::ofstream(dir + "/pipe.toml")
      << "[task]\nname = \"pipe-lm\"\nseed = 3\n"
         "[data]\nformat = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\n"
         "[model]\nkind = \"gpt\"\nn_layer = 3\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
         "[train]\nsteps = 2\nbatch_size = 4\nmicro_batches = 2\neval_batches = 1\n"
         "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\nbudget = 100000\n"
         "price_cap = 100\n"
      << pipeline;
  return dir + "/pipe.toml";
}

// `meshlearn diloco` reports its own peak resident memory (peak_rss_bytes): the single-node figure
// a devnet measures a pipeline's stage nodes against. A devnet spawns it while holding hundreds
// of MB itself, and wait4's ru_maxrss for the child counts those (the fork copies the parent's
// pages into the child's count, and exec keeps that peak): the devnet read 758-795 MB there for
// a child that peaked at 610 MB. This test's process plays the devnet.
TEST(Cli, DilocoReportsItsOwnPeakMemoryNotThatOfTheProcessThatSpawnedIt) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  const std::string task = PipeTask(cwd, "stages = 3\n");
  const std::string out = cwd + "/out";
  constexpr size_t kHeld = size_t{256} << 20;
  const std::string held(kHeld, 'x');  // resident: every page written
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MESHLEARN_HOME", cwd.c_str(), 1);
    FILE* quiet = freopen("/dev/null", "w", stdout);
    (void)quiet;
    dup2(fileno(stdout), fileno(stderr));
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "diloco", task.c_str(), "--out", out.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // What the devnet read before: this process's memory at the fork, not the child's.
  EXPECT_GE(static_cast<uint64_t>(ru.ru_maxrss) * 1024, uint64_t{held.size()});
  const json report = json::parse(ReadText(out + "/report.json"), nullptr, false);
  ASSERT_TRUE(report.is_object()) << ReadText(out + "/report.json");
  ASSERT_TRUE(report.contains("peak_rss_bytes")) << report.dump();
  const uint64_t peak = report["peak_rss_bytes"].get<uint64_t>();
  EXPECT_GT(peak, 0u);
  // The small GPT's run holds a few tens of MB: far below what its parent held.
  EXPECT_LT(peak, uint64_t{kHeld}) << report.dump();
}

// Issue 15: a pipeline task (network.stages > 1) is trained by `meshlearn diloco`, unsplit with
// its micro-batches (bit-equal to its stages: engine PipelineTest.*, node PipelineDilocoTest.*),
// which reports the cut; `task submit` checks the cut and takes the task for a chain that
// verifies (its stage units are checked as units are: docs/verification.md, "Pipeline stages").
TEST(Cli, PipelineTasksRunInDilocoAndSubmitChecksTheirCut) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  auto task = [&](const std::string& pipeline) { return PipeTask(cwd, pipeline); };
  CmdResult d = Meshlearn("--json diloco " + task("stages = 3\n"), cwd, false);
  ASSERT_EQ(d.code, 0) << d.out;
  const json report = json::parse(d.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << d.out;
  EXPECT_EQ(report["pipeline"]["stages"], 3);
  EXPECT_EQ(report["pipeline"]["replicas"], 2);
  EXPECT_EQ(report["pipeline"]["micro_batches"], 2);
  EXPECT_EQ(report["pipeline"]["cut"], json::array({0, 1, 2, 3}));
  EXPECT_EQ(report["pipeline"]["per_stage"].size(), 3u);

  CmdResult submit = Meshlearn("task submit " + task("stages = 3\n") + " --dry-run", cwd);
  EXPECT_EQ(submit.code, 0) << submit.out;
  // Checked against the default chain, which verifies.
  EXPECT_NE(submit.out.find("is valid (SubmitTask's checks, for default chain parameters"),
            std::string::npos)
      << submit.out;
  EXPECT_NE(submit.out.find("memory a node needs: "), std::string::npos) << submit.out;
  // The memory needs the ledger places by: a whole unit's (the engine's estimate, in the params
  // SubmitTask carries), each stage's (all below it), and an aggregator's (the unit's, plus the
  // round's 2 replica deltas, weights and outer momentum).
  CmdResult dry =
      Meshlearn("--json task submit " + task("stages = 3\n") + " --dry-run", cwd, false);
  ASSERT_EQ(dry.code, 0) << dry.out;
  const json prepared = json::parse(dry.out, nullptr, false);
  ASSERT_FALSE(prepared.is_discarded()) << dry.out;
  const uint64_t unit = prepared["memory_bytes"].get<uint64_t>();
  const uint64_t model = prepared["model_bytes"].get<uint64_t>();
  EXPECT_EQ(prepared["params"]["memory_bytes"], unit);
  EXPECT_GT(unit, 4 * model) << "weights, gradients and two AdamW moments, and activations";
  ASSERT_EQ(prepared["stage_memory_bytes"].size(), 3u);
  for (const json& s : prepared["stage_memory_bytes"]) EXPECT_LT(s.get<uint64_t>(), unit);
  // What a step moves across each of the 2 boundaries, the placement's link cost
  // (engine::CutBoundaryBytes): (B, T, C) = (4, 16, 16) floats forward and as many back.
  EXPECT_EQ(prepared["params"]["stage_boundary_bytes"], json::array({8192, 8192}));
  // protocol::AggregatorMemoryBytes: the evaluator it evaluates with (params.eval_memory_bytes:
  // the weights and one evaluation forward, not a whole unit's gradients and moments), 2 replicas'
  // deltas, the state and 3 for the largest transient.
  const uint64_t eval = prepared["params"]["eval_memory_bytes"].get<uint64_t>();
  EXPECT_GT(eval, model);
  EXPECT_LT(eval, unit) << "a unit adds gradients and two AdamW moments";
  EXPECT_EQ(prepared["aggregator_memory_bytes"], eval + (2 + 5) * model);
  EXPECT_NE(submit.out.find("memory a node needs: " + std::to_string(unit) +
                            " bytes for a whole unit, stages "),
            std::string::npos)
      << submit.out;
  CmdResult bad_cut =
      Meshlearn("task submit " + task("stages = 3\ncut = [0, 2, 2, 3]\n") + " --dry-run", cwd);
  EXPECT_NE(bad_cut.out.find("network.cut bound 2 (2) must be greater than bound 1 (2)"),
            std::string::npos)
      << bad_cut.out;
  CmdResult too_many = Meshlearn("diloco " + task("stages = 4\n"), cwd);
  EXPECT_NE(too_many.code, 0);
  EXPECT_NE(too_many.out.find("pipe.toml: network.stages: stages (4) must be between 1 and the 3 "
                              "blocks (model.n_layer)"),
            std::string::npos)
      << too_many.out;
}

// A .npy file (format 1.0) of `descr` ("<f4", "|u1") and `shape` ("(8, 4)") holding `data`.
void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              const std::string& data) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  std::ofstream(path, std::ios::binary) << out << h << data;
}

// A sequential model's cut as a task file gives it: a stage of only a relu holds no parameters,
// trains nothing, and its disputes could only go to a trusted key, so `task submit` refuses it,
// naming the stage, its layers and a cut that works; the cut chosen when network.cut is left out
// holds parameters in every stage, and more stages than the model has layers with parameters are
// refused (docs/submitters.md, "Micro-batches and pipeline stages").
TEST(Cli, TaskSubmitRefusesACutWithAStageWithoutParameters) {
  const std::string base = TempHome();
  const std::string zeros(16 * 4 * 4, '\0');
  WriteNpy(base + "/train_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/train_y.npy", "|u1", "(16,)", std::string(16, '\0'));
  WriteNpy(base + "/test_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/test_y.npy", "|u1", "(16,)", std::string(16, '\1'));
  auto task = [&](const std::string& pipeline) {
    std::ofstream(base + "/mlp.toml")
        << "[task]\nname = \"mlp-cut\"\nseed = 5\n"
           "[data]\nformat = \"npy\"\ntrain_x = \"train_x.npy\"\ntrain_y = \"train_y.npy\"\n"
           "test_x = \"test_x.npy\"\ntest_y = \"test_y.npy\"\n"
           "[model]\ninput = [4]\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 8\n[[model.layers]]\nkind = \"relu\"\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 8\n[[model.layers]]\nkind = \"relu\"\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 3\n"
           "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
           "[train]\nsteps = 2\nbatch_size = 4\neval_batch_size = 16\neval_batches = 1\n"
           "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\nbudget = 100000\n"
           "price_cap = 100\n"
        << pipeline;
    return base + "/mlp.toml";
  };
  CmdResult lone =
      Meshlearn("task submit " + task("stages = 3\ncut = [0, 1, 2, 5]\n") + " --dry-run", base);
  EXPECT_NE(lone.code, 0);
  EXPECT_NE(lone.out.find("mlp.toml: network.cut: stage 1 holds layers [1, 2) (model.layers[1] "
                          "(relu)), none with parameters"),
            std::string::npos)
      << lone.out;
  EXPECT_NE(lone.out.find("move a bound so that stage 1 holds a layer with parameters"),
            std::string::npos)
      << lone.out;
  EXPECT_EQ(lone.out.find("mlp.toml: " + base + "/mlp.toml"), std::string::npos)
      << "the file named once: " << lone.out;
  CmdResult chosen = Meshlearn("task submit " + task("stages = 3\n") + " --dry-run", base);
  EXPECT_EQ(chosen.code, 0) << chosen.out;
  CmdResult four = Meshlearn("task submit " + task("stages = 4\n") + " --dry-run", base);
  EXPECT_NE(four.code, 0);
  EXPECT_NE(four.out.find("mlp.toml: network.stages: stages (4) must be at most the 3 layers "
                          "with parameters of the model"),
            std::string::npos)
      << four.out;
}

// Regression (issue 12 item 8): the metric a command shows is decided by the task's kind (its
// spec, from the bundle), not guessed from the numbers. Before, "no round reported accuracy" meant
// "a language model": a classifier whose test accuracy is exactly 0 was shown with a perplexity
// and no accuracy. A language model shows its loss and perplexity and never a "test accuracy"
// (status, watch, fetch, devnet's report.json); the classifier shows its accuracy, even 0.
TEST(Cli, TheMetricShownIsTheTasksKind) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string base = TempHome();
  const std::string net =
      "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\n"
      "aggregation = \"mean\"\nbudget = 100000\nprice_cap = 100\n";
  std::ofstream(base + "/lm.toml") << TinyLmTask(net);
  // The classifier: every training label 0, every test label 1, all inputs 0, so only the
  // biases learn and every test sample is predicted 0: test accuracy exactly 0.
  const std::string zeros(16 * 4 * 4, '\0');
  WriteNpy(base + "/train_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/train_y.npy", "|u1", "(16,)", std::string(16, '\0'));
  WriteNpy(base + "/test_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/test_y.npy", "|u1", "(16,)", std::string(16, '\1'));
  std::ofstream(base + "/zero.toml")
      << "[task]\nname = \"zero-acc\"\nseed = 5\n"
         "[data]\nformat = \"npy\"\ntrain_x = \"train_x.npy\"\ntrain_y = \"train_y.npy\"\n"
         "test_x = \"test_x.npy\"\ntest_y = \"test_y.npy\"\n"
         "[model]\ninput = [4]\n[[model.layers]]\nkind = \"linear\"\nout = 3\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1.0\n"
         "[train]\nsteps = 2\nbatch_size = 4\neval_batch_size = 16\neval_batches = 1\n"
      << net;

  const std::string dir = base + "/d";
  const std::string log = base + "/devnet.out";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (base + "/devnet-home").c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    FILE* o = freopen("/dev/null", "w", stdout);
    (void)f, (void)o;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "2", "--task",
          (base + "/lm.toml").c_str(), "--block-interval-ms", "200", "--keep",
          "--no-check-reference", "--no-verification", "--timeout", "300", "--out", dir.c_str(),
          (char*)nullptr);
    _exit(127);
  }
  struct Stop {  // the devnet goes down whatever this test does
    pid_t pid;
    ~Stop() {
      if (pid > 0) kill(pid, SIGINT), waitpid(pid, nullptr, 0);
    }
  } stop{pid};
  const std::string port = WaitFor(log, "ledger at http://127.0.0.1:", "0123456789", 90);
  ASSERT_FALSE(port.empty()) << ReadText(log);
  const std::string rpc = " --rpc http://127.0.0.1:" + port;
  ASSERT_FALSE(WaitFor(log, "the network stays up", "", 240).empty()) << ReadText(log);
  const std::string user = base + "/user";  // a fresh home: the bundle comes from the nodes

  const json report = json::parse(ReadText(dir + "/report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ReadText(log);
  const std::string lm = report["task_id"];
  EXPECT_TRUE(report["metric"].contains("test_perplexity")) << report["metric"];
  EXPECT_FALSE(report["metric"].contains("test_accuracy")) << report["metric"];

  CmdResult st = Meshlearn("--json task status " + lm.substr(0, 12) + rpc, user, false);
  ASSERT_EQ(st.code, 0) << st.out;
  const json t = json::parse(st.out, nullptr, false);
  ASSERT_FALSE(t.is_discarded()) << st.out;
  EXPECT_TRUE(t["metric"].contains("test_loss")) << t["metric"];
  EXPECT_TRUE(t["metric"].contains("test_perplexity")) << t["metric"];
  EXPECT_FALSE(t["metric"].contains("test_accuracy")) << t["metric"];
  CmdResult human = Meshlearn("task status " + lm.substr(0, 12) + rpc, user);
  ASSERT_EQ(human.code, 0) << human.out;
  EXPECT_TRUE(Has(human.out, "round   0: test loss ")) << human.out;
  EXPECT_TRUE(Has(human.out, ", perplexity ")) << human.out;
  EXPECT_FALSE(Has(human.out, "accuracy")) << human.out;
  EXPECT_FALSE(Has(human.out, "test acc")) << human.out;
  EXPECT_FALSE(Has(human.out, "warning")) << human.out;
  CmdResult watch = Meshlearn("task watch " + lm.substr(0, 12) + rpc, user);
  ASSERT_EQ(watch.code, 0) << watch.out;
  EXPECT_TRUE(Has(watch.out, "finished: test loss ")) << watch.out;
  EXPECT_FALSE(Has(watch.out, "accuracy")) << watch.out;
  // Fetched from the test's folder with a relative --out: report.json names the model relative
  // to its own folder, as every path inside a file (docs/paths.md).
  CmdResult fetch = Shell("cd " + base + " && MESHLEARN_HOME=" + user + " " + MESHLEARN_BIN +
                          " task fetch " + lm.substr(0, 12) + " --out lm-out" + rpc + " 2>&1");
  ASSERT_EQ(fetch.code, 0) << fetch.out;
  EXPECT_TRUE(Has(fetch.out, "test loss ")) << fetch.out;
  EXPECT_TRUE(Has(fetch.out, "perplexity")) << fetch.out;
  EXPECT_FALSE(Has(fetch.out, "accuracy")) << fetch.out;
  const json fetched = json::parse(ReadText(base + "/lm-out/report.json"), nullptr, false);
  ASSERT_FALSE(fetched.is_discarded());
  EXPECT_FALSE(fetched["metric"].contains("test_accuracy")) << fetched["metric"];
  EXPECT_EQ(fetched["model"], "model.safetensors");
  EXPECT_TRUE(std::filesystem::is_regular_file(base + "/lm-out/model.safetensors"));

  // The zero-accuracy classifier, on the same network, from the devnet's submitter.
  const std::string submitter = dir + "/home";
  CmdResult sub = Meshlearn("--json task submit " + base + "/zero.toml --key submitter" + rpc,
                            submitter, false);
  ASSERT_EQ(sub.code, 0) << sub.out;
  const std::string zero = json::parse(sub.out)["task_id"];
  CmdResult zwatch =
      Meshlearn("--json task watch " + zero.substr(0, 12) + " --timeout 200" + rpc, user, false);
  ASSERT_EQ(zwatch.code, 0) << zwatch.out;
  std::istringstream lines(zwatch.out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  const json zfin = json::parse(last, nullptr, false);
  ASSERT_FALSE(zfin.is_discarded()) << zwatch.out;
  ASSERT_EQ(zfin["status"], "finished") << last;
  ASSERT_EQ(zfin["round_results"][0]["test_accuracy_ppm"], 0) << last;  // the premise
  EXPECT_EQ(zfin["metric"]["test_accuracy"], 0.0) << zfin["metric"];
  EXPECT_FALSE(zfin["metric"].contains("test_perplexity")) << zfin["metric"];
  CmdResult zst = Meshlearn("task status " + zero.substr(0, 12) + rpc, user);
  ASSERT_EQ(zst.code, 0) << zst.out;
  EXPECT_TRUE(Has(zst.out, "round   0: test accuracy 0.0000, loss ")) << zst.out;
  EXPECT_FALSE(Has(zst.out, "perplexity")) << zst.out;
}

}  // namespace
