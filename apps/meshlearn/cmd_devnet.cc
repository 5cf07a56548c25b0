// meshlearn devnet: a whole meshlearn network on this machine, as real processes on loopback —
// one `meshlearn chain serve` and N `meshlearn node run` — that trains one task end to end:
// genesis funding the submitter and every node, wait for the nodes to register, submit the task
// (the code of `task submit`), show progress, fetch the final model, write report.json, stop
// every process (SIGTERM, then SIGKILL) on completion, on error and on Ctrl-C.
//
// Scenario flags for tests and demos: --speed I=F (solver I runs at F x speed), --kill I@U
// (solver I dies by SIGKILL mid-unit after it has committed U units: node.toml `crash_in_unit`,
// so the crash lands inside a unit every run rather than when a poll happens to catch one),
// --late I@R (start solver I only when round R begins). Children get PR_SET_PDEATHSIG, so even
// a kill -9 of devnet leaves no orphan.
//
// Verification (docs/verification.md) is on: every solver node is also a verifier (a node never
// verifies its own units) and --verifiers N adds verifier-only nodes; the devnet process runs
// the referee (node/referee.h) with the sequencer's key, which genesis names as the referee
// (--no-referee-service: none runs, and the dispute parties' own witnesses rule).
// --adversary ROLE:MODE makes a node cheat (node.toml `adversary`): solver modes go to the last
// solver nodes (the first flag to the last solver), verifier modes to the last verifier-only
// nodes, then to the last honest solvers. The report says what verification did: checks settled
// per result, the rulings the ledger executed (read from the chain, whoever sent them), who was
// slashed and how much, what every node earned.
//
// --sequencers N (N >= 2) runs a replicated sequencer (docs/operators.md, "Running a replicated
// chain") instead of one `chain serve`: a 3-member etcd on loopback (ledger/etcd_local.h) and N
// `chain serve --cluster` candidates, each with its own chain directory and key; nodes, the
// referee and the submitter get every candidate's URL (RpcClient fails over). --kill-sequencer R
// SIGKILLs whichever candidate leads when round R starts; the report lists every change of the
// block signer on the chain with its gap (the time between the last block of the old leader and
// the first of the new one).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/home_layout.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/progress.h"
#include "meshlearn/base/prometheus.h"
#include "meshlearn/cli.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/pipeline.h"
#include "meshlearn/ledger/block.h"
#include "meshlearn/ledger/etcd_local.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc_answer.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/adversary.h"
#include "meshlearn/node/bench.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/referee.h"
#include "meshlearn/protocol/scheduler.h"
#include "meshlearn/protocol/verification.h"
#include "task_client.h"

namespace meshlearn::cli {
namespace {

using nlohmann::json;

std::atomic<int> g_stop_signal{0};
constexpr int64_t kVerifyWindowMs = 4000;   // reveal and dispute windows, at least
constexpr int64_t kCommitWindowMs = 10000;  // the verdict commit window, at least
constexpr int64_t kAuditWindowMs = 300000;  // a finished task's audit window, at least
// A pipeline task's verdict commit window and the referee's time to rule, at least (RunDevnet).
constexpr int64_t kStageCommitWindowMs = 60000;
constexpr int64_t kStageRefereeMs = 60000;
// Under --memory-limit, every deadline of a pipeline task, at least (RunDevnet).
constexpr int64_t kLimitedDeadlineMs = 30000;
constexpr uint64_t kNodeStake = 100000;    // every devnet node's stake: covers a slash (node.toml)
void OnStopSignal(int sig) { g_stop_signal.store(sig); }

struct DevnetArgs {
  std::string task;
  std::string out = "out/devnet";
  int solvers = 4;
  int64_t block_interval_ms = 500;
  int64_t timeout_s = 3600;
  bool check_reference = true;
  std::vector<std::string> speed;  // "I=F"
  std::vector<std::string> kill;   // "I@U"
  std::vector<std::string> late;   // "I@R"
  uint64_t price = 1;
  bool keep = false;  // leave the network running after the task (for `meshlearn task ...`)
  std::vector<std::string> adversary;  // "ROLE:MODE"
  int verifiers = 0;                   // verifier-only nodes besides the solvers
  bool verification = true;
  // Whether this process runs the referee service (the sequencer's key, DevnetReferee). Without
  // it only the parties rule their disputes (RefereeStep, RefereeTile, RefereeStageStep: no key
  // needed), and a dispute only the genesis key can rule (RuleDispute) ends undecided.
  bool referee_service = true;
  int64_t forced_errors = -1;  // per million units; -1: the genesis default
  // Genesis rounds_in_flight. Here a unit trains in about a second and a round settles (checks,
  // then the 5-block verification window) over about three rounds' time, so 4 rounds in flight
  // keep the solvers busy (`devnet_bench --verification`; the ledger's default is 2).
  int64_t rounds_in_flight = 4;
  // Each dispute turn's window, at least (genesis dispute_response_blocks); 0: DisputeWindowMs of
  // the task. A party answers the turn that narrows a dispute to one step by replaying that step
  // with its operator trace: well under a second for the fashion MLP, about 5 s for the 10M GPT
  // on 2 loaded cores.
  int64_t dispute_window_ms = 0;
  // The task's [network] assurance and target_escape_ppm, overridden for this run ("" and 0: the
  // task file's).
  std::string assurance;
  uint32_t target_escape_ppm = 0;
  int sequencers = 1;          // >= 2: a replicated sequencer on a local etcd
  std::string kill_sequencer;  // "R": SIGKILL the leader when round R starts ("" : never)
  // The memory every node offers to training (node.toml memory_limit_bytes and [capabilities]
  // memory_bytes): "" for the machine's; bytes, or with a K, M or G suffix (KiB, MiB, GiB).
  std::string memory_limit;
};

// What a node did, from its GET /metrics (docs/operators.md, "Metrics"): the units it trained and
// committed (a unit whose round was later re-run without it included: the task's record no longer
// names it), and what its pipeline stages did.
struct ScrapedNodeMetrics {
  uint64_t units_trained = 0;
  uint64_t bytes_sent = 0;
  double seconds_running = 0, seconds_waiting = 0;
  uint64_t whole_models_built = 0;  // 0: no whole-model trainer (a pipeline task's aggregator
                                    // evaluates with the weights alone)
  uint64_t whole_model_moments_bytes = 0;  // after its last aggregation: 0 on a pipeline task
};
Result<ScrapedNodeMetrics> ScrapeNodeMetrics(const std::string& host_port) {
  httplib::Client client("http://" + host_port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Result r = client.Get("/metrics");
  if (!r || r->status != 200) {
    return Unavailable("GET http://" + host_port + "/metrics failed (" +
                       (r ? "status " + std::to_string(r->status) : httplib::to_string(r.error())) +
                       ")");
  }
  ScrapedNodeMetrics m;
  m.units_trained = static_cast<uint64_t>(
      PrometheusSample(r->body, "meshlearn_node_work_total{kind=\"units_completed\"}").value_or(0));
  m.bytes_sent = static_cast<uint64_t>(
      PrometheusSample(r->body, "meshlearn_node_stage_bytes_sent_total").value_or(0));
  m.seconds_running =
      PrometheusSample(r->body, "meshlearn_node_stage_seconds_total{kind=\"running\"}").value_or(0);
  m.seconds_waiting =
      PrometheusSample(r->body, "meshlearn_node_stage_seconds_total{kind=\"waiting\"}").value_or(0);
  m.whole_models_built = static_cast<uint64_t>(
      PrometheusSample(r->body, "meshlearn_node_work_total{kind=\"whole_models_built\"}")
          .value_or(0));
  m.whole_model_moments_bytes = static_cast<uint64_t>(
      PrometheusSample(r->body, "meshlearn_node_whole_model_moments_bytes").value_or(0));
  return m;
}

// --memory-limit as bytes (0: not given).
Result<uint64_t> ParseMemoryLimit(const std::string& text) {
  if (text.empty()) return uint64_t{0};
  std::string digits = text;
  uint64_t unit = 1;
  switch (digits.back()) {
    case 'K': unit = uint64_t{1} << 10; break;
    case 'M': unit = uint64_t{1} << 20; break;
    case 'G': unit = uint64_t{1} << 30; break;
    default: break;
  }
  if (unit > 1) digits.pop_back();
  Result<uint64_t> n = ParseUnsigned(digits, "--memory-limit");
  if (!n.ok() || *n == 0 || *n > (uint64_t{1} << 50) / unit) {
    return InvalidArgument("--memory-limit is '" + text +
                           "'; use a number of bytes, or one with a K, M or G suffix (KiB, MiB, "
                           "GiB), e.g. 200M");
  }
  return *n * unit;
}

// What one whole (unsplit) unit of the task needs: the ledger scheduler's RequiredMemoryBytes of
// the task's view -- params.memory_bytes, node::UnitMemoryBytes of the task (PrepareTask's
// MakeTaskParams), the number the nodes refuse units by.
uint64_t UnitMemoryBytes(const ledger::TaskParams& p) {
  return protocol::RequiredMemoryBytes(ledger::TaskSpecViewOf(Hash256{}, p, 0));
}

// Per stage of a pipeline task, the activation bytes of a step (engine::CutCosts of the task's
// cut: GPipe keeps the M micro-batches' activations in flight). A stage node's memory target
// (issue 15) is the single node's peak over S plus these: what a stage holds beyond its share of
// the whole model.
Result<std::vector<uint64_t>> StageActivationBytes(const PreparedTask& task) {
  const engine::TaskSpec& t = task.trainer ? task.trainer->task() : task.task;
  ML_ASSIGN_OR_RETURN(engine::PipelineCut cut,
                      engine::TaskPipelineCut(t, static_cast<int>(task.net.stages), task.net.cut));
  ML_ASSIGN_OR_RETURN(
      std::vector<engine::StageCost> costs,
      engine::CutCosts(t.model, t.optimizer, cut, t.batch_size, t.seq_len, t.micro_batches));
  std::vector<uint64_t> bytes;
  for (const engine::StageCost& c : costs) {
    bytes.push_back(static_cast<uint64_t>(std::ceil(c.activation_bytes)));
  }
  return bytes;
}

// --memory-limit against what the task needs: a node that holds less than a unit (or, pipelined,
// than its heaviest stage) is never eligible, and the devnet would wait forever.
Status CheckMemoryLimit(const PreparedTask& task, uint64_t limit, const std::string& text) {
  if (limit == 0) return Status::Ok();
  const ledger::TaskParams& p = task.params;
  if (p.stages > 1) {
    const uint64_t heaviest =
        *std::max_element(p.stage_memory_bytes.begin(), p.stage_memory_bytes.end());
    if (limit < heaviest) {
      return InvalidArgument(fmt::format(
          "--memory-limit {} ({} bytes) is below the heaviest of the task's {} stages ({} bytes): "
          "no node could train it; raise the limit or cut the model into more stages "
          "([network] stages)",
          text, limit, p.stages, heaviest));
    }
    return Status::Ok();
  }
  const uint64_t need = UnitMemoryBytes(p);
  if (limit < need) {
    return InvalidArgument(fmt::format(
        "--memory-limit {} ({} bytes) is below what one unit of the task needs ({} bytes): no "
        "node could train it; raise the limit, or cut the model into pipeline stages "
        "([network] stages, docs/submitters.md)",
        text, limit, need));
  }
  return Status::Ok();
}

constexpr int kEtcdMembers = 3;  // the smallest etcd cluster that survives losing a member
constexpr int kMaxSequencers = 9;

// --sequencers and --kill-sequencer, checked before anything starts. Sets `kill_round` (-1:
// none) and, for a replicated sequencer, `etcd_bin`.
Status CheckSequencerFlags(const DevnetArgs& a, uint64_t rounds, int64_t* kill_round,
                           std::string* etcd_bin) {
  *kill_round = -1;
  if (a.sequencers < 1 || a.sequencers > kMaxSequencers) {
    return InvalidArgument(fmt::format(
        "--sequencers is {}; use 1 (one `chain serve`) or 2..{} (candidates of a replicated "
        "sequencer on a {}-member etcd)",
        a.sequencers, kMaxSequencers, kEtcdMembers));
  }
  if (!a.kill_sequencer.empty()) {
    ML_ASSIGN_OR_RETURN(uint64_t r, ParseUnsigned(a.kill_sequencer, "--kill-sequencer"));
    if (a.sequencers < 2) {
      return InvalidArgument(
          "--kill-sequencer needs a replicated sequencer to fail over to: add --sequencers 3");
    }
    if (r >= rounds) {
      return InvalidArgument(fmt::format(
          "--kill-sequencer {} is not a round of the task: its rounds are 0..{} (numbered from 0)",
          r, rounds - 1));
    }
    *kill_round = static_cast<int64_t>(r);
  }
  if (a.sequencers >= 2) {
    *etcd_bin = ledger::FindEtcd();
    if (etcd_bin->empty() || access(etcd_bin->c_str(), X_OK) != 0) {
      return FailedPrecondition(
          "--sequencers " + std::to_string(a.sequencers) +
          " runs a local etcd cluster, but there is no etcd binary" +
          (etcd_bin->empty() ? std::string(" on PATH")
                             : " at $MESHLEARN_ETCD (" + *etcd_bin + ")") +
          "; install it: apt-get install etcd-server (scripts/setup.sh --test does), or run "
          "without --sequencers");
    }
  }
  return Status::Ok();
}

// --assurance and --target-escape-ppm in place of the task file's [network] assurance and
// target_escape_ppm, with the same checks and the ledger's terms (CheckTaskTerms) again.
Status OverrideAssurance(const DevnetArgs& a, PreparedTask* task) {
  if (a.assurance.empty()) {
    if (a.target_escape_ppm != 0) {
      return InvalidArgument("--target-escape-ppm needs --assurance target");
    }
    return Status::Ok();
  }
  protocol::AssuranceLevel level;
  if (a.assurance == "full") {
    level.kind = protocol::Assurance::kAssuranceFull;
  } else if (a.assurance == "target") {
    level.kind = protocol::Assurance::kAssuranceTarget;
  } else if (a.assurance != "economic") {
    return InvalidArgument("--assurance is '" + a.assurance +
                           "'; use economic, full or target (with --target-escape-ppm)");
  }
  level.target_escape_ppm = a.target_escape_ppm;
  ML_RETURN_IF_ERROR(protocol::ValidateAssurance(static_cast<uint8_t>(level.kind),
                                                 level.target_escape_ppm, "--assurance",
                                                 "--target-escape-ppm"));
  if (!a.verification && level.kind != protocol::Assurance::kAssuranceEconomic) {
    return InvalidArgument("--assurance " + a.assurance +
                           " replays units; it needs verification (drop --no-verification)");
  }
  task->net.assurance = level;
  task->params.assurance = static_cast<uint8_t>(level.kind);
  task->params.target_escape_ppm = level.target_escape_ppm;
  ledger::ChainParams chain;
  chain.verification = a.verification;
  return CheckTaskTerms(*task, chain);
}

// A child process whose stdout/stderr go to a log file.
struct Child {
  std::string name;
  pid_t pid = -1;
  std::string log;
  bool alive() const { return pid > 0; }
};

Result<Child> Spawn(const std::string& name, const std::vector<std::string>& args,
                    const std::string& log, const std::string& home) {
  Child c{name, -1, log};
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Internal("fork failed for " + name);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // devnet gone (even by kill -9): so is the child
    if (getppid() != parent) _exit(1);
    setpgid(0, 0);  // Ctrl-C on the terminal reaches devnet only; devnet stops the children
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    setenv("MESHLEARN_HOME", home.c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), fileno(stderr));
    std::vector<char*> argv;
    std::string self = "/proc/self/exe";
    static std::string exe;
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    exe = n > 0 ? std::string(buf, static_cast<size_t>(n)) : self;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (std::string& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  c.pid = pid;
  return c;
}

void Stop(Child& c, int sig = SIGTERM) {
  if (c.pid > 0) kill(c.pid, sig);
}

// SIGTERM every child, wait up to `grace_ms`, then SIGKILL and reap.
void StopAll(std::vector<Child>& children, int64_t grace_ms) {
  for (Child& c : children) Stop(c, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    bool any = false;
    for (Child& c : children) {
      if (c.pid <= 0) continue;
      if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
        c.pid = -1;
      } else {
        any = true;
      }
    }
    if (!any) return;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(grace_ms)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (Child& c : children) {
    if (c.pid > 0) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.pid = -1;
    }
  }
}

// Owns the children: stops them whatever way RunDevnet returns.
struct Fleet {
  std::vector<Child> children;
  ~Fleet() { StopAll(children, 5000); }
};

Status Interrupted() {
  return Unavailable(fmt::format("interrupted by signal {}; every devnet process was stopped",
                                 g_stop_signal.load()));
}

// A child bound port 0 and says where it listens (no port is picked here, freed and handed over:
// another socket could take it in between). Polls `read` every 50 ms for up to `seconds`; fails
// when the child exits first, or on Ctrl-C.
Result<std::string> WaitForBound(const Child& c, int seconds,
                                 const std::function<std::string()>& read) {
  for (int i = 0; i < seconds * 20; ++i) {
    if (g_stop_signal.load()) return Interrupted();
    std::string where = read();
    if (!where.empty()) return where;
    if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
      return Internal(c.name + " exited during start-up; see " + c.log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceeded(fmt::format("{} did not say where it listens within {} s; see {}",
                                      c.name, seconds, c.log));
}

// `meshlearn --json chain serve --listen 127.0.0.1:0`: its url, from the first line of its
// stdout ({"url": ...}, printed once it listens); its log lines (stderr) share the file.
Result<std::string> ChainServeUrl(Env* env, const Child& c) {
  return WaitForBound(c, 30, [&]() -> std::string {
    Result<std::string> text = env->ReadFile(c.log);
    if (!text.ok()) return "";
    for (size_t at = 0, eol; (eol = text->find('\n', at)) != std::string::npos; at = eol + 1) {
      if ((*text)[at] != '{') continue;
      json j = json::parse(text->substr(at, eol - at), nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("url") && j["url"].is_string()) return j["url"].get<std::string>();
    }
    return "";
  });
}

// `meshlearn node run` with listen = "127.0.0.1:0": the endpoint it bound and announces, from
// NodeListenFile (written atomically after the bind; its pid tells it from an earlier run's).
Result<std::string> NodeBoundEndpoint(Env* env, const Child& c, const std::string& data_dir) {
  return WaitForBound(c, 60, [&]() -> std::string {
    Result<std::string> text = env->ReadFile(NodeListenFile(data_dir));
    if (!text.ok()) return "";
    json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("pid") || !j["pid"].is_number_integer() ||
        j["pid"].get<int64_t>() != c.pid || !j.contains("endpoint") || !j["endpoint"].is_string()) {
      return "";
    }
    return j["endpoint"].get<std::string>();
  });
}

template <typename T>
Result<std::map<int, T>> ParseScenario(const std::vector<std::string>& items, char sep, int solvers,
                                       const std::string& flag) {
  std::map<int, T> out;
  for (const std::string& s : items) {
    const size_t p = s.find(sep);
    auto bad = [&] {
      return InvalidArgument(fmt::format("{} '{}' is not SOLVER{}VALUE with SOLVER in 0..{}", flag,
                                         s, sep, solvers - 1));
    };
    if (p == std::string::npos) return bad();
    Result<uint64_t> i = ParseUnsigned(std::string_view(s).substr(0, p), flag);
    if (!i.ok() || *i >= static_cast<uint64_t>(solvers)) return bad();
    const std::string value = s.substr(p + 1);
    if constexpr (std::is_same_v<T, double>) {
      try {
        size_t used = 0;
        out[static_cast<int>(*i)] = std::stod(value, &used);
        if (used != value.size()) return bad();
      } catch (...) {
        return bad();
      }
    } else {
      Result<uint64_t> v = ParseUnsigned(value, flag);
      if (!v.ok()) return v.status().WithPrefix(flag + " '" + s + "'");
      out[static_cast<int>(*i)] = static_cast<T>(*v);
    }
  }
  return out;
}

// One --adversary ROLE:MODE: node `node` runs adversary `mode` (node.toml `adversary`).
struct AdversaryPlan {
  int node = 0;
  std::string role;  // "solver" | "verifier"
  std::string mode;
};

// Nodes 0..solvers-1 are solvers (and verifiers with verification on), the next `verifiers` are
// verifier-only. A solver mode takes the last solver not yet given one; a verifier mode the last
// verifier-only node, else the last honest solver (which then cheats as a verifier only).
Result<std::vector<AdversaryPlan>> PlanAdversaries(const std::vector<std::string>& items,
                                                   int solvers, int verifiers, bool verification) {
  std::vector<bool> taken(static_cast<size_t>(solvers + verifiers), false);
  std::vector<AdversaryPlan> out;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    AdversaryPlan plan;
    if (colon != std::string::npos) {
      plan.role = item.substr(0, colon);
      plan.mode = item.substr(colon + 1);
    }
    if (plan.role != "solver" && plan.role != "verifier") {
      return InvalidArgument("--adversary '" + item +
                             "' is not ROLE:MODE with ROLE solver or verifier (e.g. solver:lazy, "
                             "verifier:rubber_stamp)");
    }
    Result<node::Adversary> adv = node::ParseAdversary(plan.mode);
    if (!adv.ok()) return adv.status().WithPrefix("--adversary '" + item + "'");
    if (*adv == node::Adversary::kNone) {
      return InvalidArgument("--adversary '" + item + "': \"none\" is no adversary; drop the flag");
    }
    const bool verifier_mode = plan.mode == "rubber_stamp";
    if ((plan.role == "verifier") != verifier_mode) {
      return InvalidArgument("--adversary '" + item + "': " + plan.mode + " is a " +
                             (verifier_mode ? "verifier" : "solver") + " mode; write " +
                             (verifier_mode ? "verifier:" : "solver:") + plan.mode);
    }
    if (verifier_mode && !verification) {
      return InvalidArgument("--adversary '" + item +
                             "' cheats as a verifier; it needs verification (drop "
                             "--no-verification)");
    }
    plan.node = -1;
    auto take_last = [&](int from, int to) {  // the last free node in [from, to)
      for (int i = to - 1; i >= from && plan.node < 0; --i) {
        if (!taken[static_cast<size_t>(i)]) plan.node = i;
      }
    };
    if (plan.role == "verifier") take_last(solvers, solvers + verifiers);
    if (plan.node < 0) take_last(0, solvers);
    if (plan.node < 0) {
      return InvalidArgument(
          fmt::format("--adversary '{}': every {} node already cheats; add "
                      "nodes (--solvers / --verifiers)",
                      item, plan.role));
    }
    taken[static_cast<size_t>(plan.node)] = true;
    out.push_back(plan);
  }
  return out;
}

// What verification did to a task, as the ledger keeps it (get_task): `settled` is the task's
// VerificationTally by result — every check the ledger settled, those of re-run rounds included —
// and `events` the check each unit of the final record carries (a check that ended in a re-run
// went with its round, so the tally can count more fraud than `events` shows).
json SettledChecks(const json& task) {
  const json tally = task.value("verification", json::object());
  json counts = json::object();
  for (const char* result : {"clean", "unchecked", "fraud", "forced_error", "abandoned"}) {
    counts[result] = tally.value(result, uint64_t{0});
  }
  json events = json::array();
  for (const json& u : task.value("units", json::array())) {
    const json& c = u.value("check", json());
    if (!c.is_object() || c.value("stage", "") != "settled") continue;
    events.push_back({{"unit", u.value("index", 0)},
                      {"round", u.value("round", 0)},
                      {"result", c.value("result", "")},
                      {"reason", c.value("reason", "")}});
  }
  // Taint (docs/verification.md): final rounds a proven cheater's work was in, run again, and
  // what it had been paid for them, taken back from its stake.
  const json taint = {{"rounds_rewound", tally.value("rounds_rewound", uint64_t{0})},
                      {"clawed_back", tally.value("clawed_back", uint64_t{0})}};
  return {{"settled", counts},
          {"events", events},
          {"taint", taint},
          {"rounds_dropped", tally.value("rounds_dropped", uint64_t{0})}};
}

// The referee of the devnet's disputes, on its own thread: the sequencer's key (genesis leaves
// `referee` zero), blobs fetched from the nodes into its own store, one pass per block. Stops
// (and joins) when destroyed, so every return path of RunDevnet stops it first.
class DevnetReferee {
 public:
  DevnetReferee(Env* env, std::string rpc_url, KeyPair key, std::string dir, std::string log)
      : thread_([this, env, rpc_url = std::move(rpc_url), key = std::move(key),
                 dir = std::move(dir),
                 log = std::move(log)] { Run(env, rpc_url, key, dir, log); }) {}
  ~DevnetReferee() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // The rulings sent so far.
  std::vector<node::RefereeRecord> rulings() const {
    std::lock_guard<std::mutex> l(mu_);
    return rulings_;
  }

 private:
  void Run(Env* env, const std::string& rpc_url, const KeyPair& key, const std::string& dir,
           const std::string& log_path) {
    std::ofstream log(log_path);
    auto line = [&](const std::string& s) { log << s << std::endl; };
    node::HttpChainClient chain(rpc_url);
    ledger::RpcClient blob_rpc(rpc_url, {.retries = 2});
    Result<std::unique_ptr<net::BlobStore>> store =
        net::BlobStore::Open(env, JoinPath(dir, "blobs"));
    if (!store.ok()) {
      line("referee: " + store.status().message());
      return;
    }
    node::TxSender tx(&chain, key);
    Status init = tx.Init();
    while (!init.ok() && !stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      init = tx.Init();
    }
    net::HttpTransport transport;  // tolerance-mode rulings fetch the defender's checkpoints
    node::RefereeService referee(
        &chain, &tx,
        [&](const Hash256& id) { return FetchBlob(blob_rpc, store->get(), net::BlobId{id}); },
        {.env = env, .work_dir = JoinPath(dir, "data"), .log = line, .transport = &transport});
    line("referee: key " + key.public_key().ToHex() +
         " (the sequencer's: genesis names it for RuleDispute; a RefereeStep needs no key), "
         "polling referee_work");
    uint64_t height = 0;
    while (!stop_.load()) {
      Result<uint64_t> h = node::WaitForBlockAbove(chain, height, 1000);
      if (h.ok()) height = *h;
      Result<std::vector<node::RefereeRecord>> sent = referee.Poll();
      if (!sent.ok()) line("referee: " + sent.status().message());
      std::lock_guard<std::mutex> l(mu_);
      rulings_ = referee.rulings();
    }
  }

  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<node::RefereeRecord> rulings_;  // guarded by mu_
  std::thread thread_;                        // last: starts once the members above exist
};

// Blob traffic of a finished devnet, measured from what every node holds: each copy of a blob on
// a node other than the one that made it (a solver's delta, an aggregator's state) or received it
// from the submitter (bundle, data, initial state) travelled over the network once.
struct Traffic {
  uint64_t delta_bytes = 0;  // solvers' uploads: deltas fetched by aggregators
  uint64_t deltas = 0;
  uint64_t state_bytes = 0;  // global states fetched by solvers
  uint64_t task_bytes = 0;   // bundle, data and initial state spread between nodes
};

Result<Traffic> MeasureTraffic(Env* env, const std::vector<std::string>& node_dirs,
                               const std::vector<PublicKey>& node_ids, const json& task,
                               const std::vector<std::string>& pushed_to_dirs,
                               const std::vector<net::BlobId>& published) {
  std::vector<std::unique_ptr<net::BlobStore>> stores;
  for (const std::string& d : node_dirs) {
    ML_ASSIGN_OR_RETURN(auto st, net::BlobStore::Open(env, HomeLayout(d).BlobsDir()));
    stores.push_back(std::move(st));
  }
  auto index_of = [&](const std::string& hex) -> int {
    for (size_t i = 0; i < node_ids.size(); ++i) {
      if (node_ids[i].ToHex() == hex) return static_cast<int>(i);
    }
    return -1;
  };
  // Copies of `id` on nodes other than `origins`, times its size.
  auto copies = [&](const std::string& hex, const std::vector<int>& origins) -> uint64_t {
    Result<Hash256> h = Hash256::FromHex(hex, "blob");
    if (!h.ok()) return 0;
    net::BlobId id{*h};
    uint64_t size = 0, n = 0;
    for (size_t i = 0; i < stores.size(); ++i) {
      if (!stores[i]->HasBlob(id)) continue;
      if (size == 0) {
        Result<net::Manifest> m = stores[i]->GetManifest(id);
        if (m.ok()) size = m->total_size;
      }
      if (std::find(origins.begin(), origins.end(), static_cast<int>(i)) == origins.end()) ++n;
    }
    return n * size;
  };
  Traffic t;
  for (const json& u : task.value("units", json::array())) {
    const std::string st = u.value("status", "");
    if (st != "committed" && st != "verified") continue;
    ++t.deltas;
    t.delta_bytes += copies(u.value("result_hash", ""), {index_of(u.value("assignee", ""))});
  }
  for (const json& r : task.value("round_results", json::array())) {
    t.state_bytes += copies(r.value("state", ""), {index_of(r.value("aggregator", ""))});
  }
  std::vector<int> pushed;
  for (const std::string& d : pushed_to_dirs) {
    for (size_t i = 0; i < node_dirs.size(); ++i) {
      if (node_dirs[i] == d) pushed.push_back(static_cast<int>(i));
    }
  }
  for (const net::BlobId& b : published) t.task_bytes += copies(b.ToHex(), pushed);
  return t;
}

// The candidate that leads now, by its own chain_status (cluster.leading), and its height; asks
// every live one (`urls[i]` empty: killed) until one leads, for up to `timeout_ms` (an election
// may be under way).
Result<std::pair<size_t, uint64_t>> FindLeader(const std::vector<std::string>& urls,
                                               int64_t timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last_error = "no candidate answered";
  while (std::chrono::steady_clock::now() < until) {
    for (size_t i = 0; i < urls.size(); ++i) {
      if (urls[i].empty()) continue;
      ledger::RpcClient one(urls[i],
                            {.connect_timeout_ms = 1000, .read_timeout_ms = 2000, .retries = 0});
      Result<json> st = one.Call("chain_status", json::object());
      if (!st.ok()) {
        last_error = urls[i] + ": " + st.status().message();
        continue;
      }
      ledger::RpcAnswer answer("chain_status", *st);
      Result<ledger::RpcAnswer> cluster = answer.Object("cluster");
      if (!cluster.ok()) return cluster.status();
      ML_ASSIGN_OR_RETURN(bool leading, cluster->Bool("leading"));
      ML_ASSIGN_OR_RETURN(uint64_t height, answer.U64("height"));
      if (leading) return std::make_pair(i, height);
    }
    if (g_stop_signal.load()) return Interrupted();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Unavailable("no sequencer candidate leads (asked each for " +
                     std::to_string(timeout_ms / 1000) + " s; last: " + last_error + ")");
}

// Calls `fn` with every block on the chain, from block 1 up, as get_blocks serves them (decoded);
// an error from `fn` stops the walk and is returned.
Status ForEachBlock(ledger::RpcClient& rpc, const std::function<Status(ledger::Block)>& fn) {
  for (uint64_t from = 1;;) {
    ML_ASSIGN_OR_RETURN(json page, rpc.Call("get_blocks", {{"from", from}, {"limit", 100}}));
    ledger::RpcAnswer answer("get_blocks", page);
    ML_ASSIGN_OR_RETURN(uint64_t height, answer.U64("height"));
    ML_ASSIGN_OR_RETURN(ledger::RpcAnswer blocks, answer.Array("blocks"));
    for (size_t i = 0; i < blocks.size(); ++i) {
      ML_ASSIGN_OR_RETURN(std::string hex, blocks.At(i).Str());
      ML_ASSIGN_OR_RETURN(Bytes wire, HexDecode(hex, "get_blocks: a block"));
      ML_ASSIGN_OR_RETURN(ledger::Block b, ledger::DecodeBlock(wire));
      ML_RETURN_IF_ERROR(fn(std::move(b)));
    }
    from += blocks.size();
    if (blocks.size() == 0 || from > height) return Status::Ok();
  }
}

// Every change of the block signer on the chain from block 1: the failovers, with how long the
// chain went without a block (the time between the old leader's last block and the new one's
// first, by the blocks' own times). `keys[i]` is candidate i's key; `killed_at` the height the
// killed leader had reached when it was killed (-1: none): the first change above it is the
// failover the kill caused.
Result<json> Failovers(ledger::RpcClient& rpc, const std::vector<PublicKey>& keys,
                       int64_t killed_at) {
  auto candidate = [&](const PublicKey& k) -> int {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == k) return static_cast<int>(i);
    }
    return -1;
  };
  json out = json::array();
  std::optional<ledger::BlockHeader> prev;
  bool kill_seen = false;
  ML_RETURN_IF_ERROR(ForEachBlock(rpc, [&](ledger::Block b) {
    if (prev && b.header.sequencer != prev->sequencer) {
      const bool after_kill =
          killed_at >= 0 && !kill_seen && prev->height >= static_cast<uint64_t>(killed_at);
      kill_seen = kill_seen || after_kill;
      out.push_back({{"height", b.header.height},
                     {"from", candidate(prev->sequencer)},
                     {"to", candidate(b.header.sequencer)},
                     {"last_block_ms", prev->time_ms},
                     {"next_block_ms", b.header.time_ms},
                     {"gap_ms", b.header.time_ms - prev->time_ms},
                     {"after_kill", after_kill}});
    }
    prev = b.header;
    return Status::Ok();
  }));
  return out;
}

// Every ruling the ledger executed on the task (RefereeStep, RefereeTile, RefereeStageStep,
// RuleDispute), whoever sent it: a dispute's party, the referee service or anyone. The ledger
// keeps each in the task's record (verification.rulings: who ruled, the unit and step, the
// parties, the witness's size, the sender, for whom); the report adds whom the sender is in the
// devnet. `referee` is the referee service's key, `node_ids` the devnet's nodes.
json RulingsOf(const json& task, const PublicKey& referee, const std::vector<PublicKey>& node_ids) {
  json out = json::array();
  for (json r : task["verification"].value("rulings", json::array())) {
    const std::string sender = r.value("sender", std::string());
    std::string sender_is = "an account outside the devnet";
    if (sender == referee.ToHex()) sender_is = "the referee service";
    for (size_t i = 0; i < node_ids.size(); ++i) {
      if (node_ids[i].ToHex() == sender) sender_is = fmt::format("node{}", i);
    }
    r["sender_is"] = sender_is;
    out.push_back(std::move(r));
  }
  return out;
}

// The dispute turns' window a devnet gives a task unless --dispute-window-ms says otherwise: a
// party answers the turn that narrows a dispute to one step with a traced replay of that step,
// whose cost grows with the state it loads, runs and hashes (about 5 s for the 10M GPT's 10.8M
// parameters on 2 loaded cores): kVerifyWindowMs, plus 2 s per whole million parameters (the
// fashion MLP's 0.7M: 4 s; the 10M GPT: 24 s).
int64_t DisputeWindowMs(const node::TaskFacts& facts) {
  return kVerifyWindowMs + 2000 * static_cast<int64_t>(facts.num_params / 1'000'000);
}

// Runs the devnet; `emit` gets the report once report.json is written (before --keep waits).
Status RunDevnet(GlobalOptions& g, const DevnetArgs& a,
                 const std::function<void(const json&)>& emit) {
  json report_storage;
  json* report = &report_storage;
  ML_RETURN_IF_ERROR(engine::ConfigureFromEnv());
  Env* env = Env::Default();
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  auto say = [&](const std::string& s) {
    if (!g.json) std::cerr << s << std::endl;
  };
  if (a.solvers < 1 || a.solvers > 64) return InvalidArgument("--solvers must be in 1..64");
  ML_ASSIGN_OR_RETURN(auto speeds, ParseScenario<double>(a.speed, '=', a.solvers, "--speed"));
  ML_ASSIGN_OR_RETURN(auto kills, ParseScenario<uint64_t>(a.kill, '@', a.solvers, "--kill"));
  ML_ASSIGN_OR_RETURN(auto lates, ParseScenario<uint64_t>(a.late, '@', a.solvers, "--late"));
  for (auto& [i, f] : speeds) {
    if (!(f > 0 && f <= 1)) return InvalidArgument("--speed factors must be in (0, 1]");
  }
  if (a.verifiers < 0 || a.verifiers > 64) return InvalidArgument("--verifiers must be in 0..64");
  if (a.verifiers > 0 && !a.verification) {
    return InvalidArgument(
        "--verifiers adds verifier nodes; it needs verification (drop "
        "--no-verification)");
  }
  if (a.forced_errors > 1'000'000) {
    return InvalidArgument("--forced-errors is per million units: 0..1000000");
  }
  if (a.rounds_in_flight < 0 || a.rounds_in_flight > static_cast<int64_t>(ledger::kMaxRoundsInFlight)) {
    return InvalidArgument(fmt::format(
        "--rounds-in-flight is {}; use 0 (a round starts when the one before it is final) to {}",
        a.rounds_in_flight, ledger::kMaxRoundsInFlight));
  }
  if (a.dispute_window_ms < 0 || a.dispute_window_ms > 3'600'000) {
    return InvalidArgument(fmt::format(
        "--dispute-window-ms is {}; use 1 to 3600000, or 0 (the default) for the task's own",
        a.dispute_window_ms));
  }
  ML_ASSIGN_OR_RETURN(const uint64_t memory_limit, ParseMemoryLimit(a.memory_limit));
  // Under --memory-limit the solvers and verifiers cannot hold the whole model, so they do not
  // aggregate: one more node, without the limit, aggregates every round (an aggregator holds the
  // round's global state and outer momentum whole).
  const int aggregator_nodes = memory_limit > 0 ? 1 : 0;
  const int total_nodes = a.solvers + a.verifiers + aggregator_nodes;
  ML_ASSIGN_OR_RETURN(std::vector<AdversaryPlan> adversaries,
                      PlanAdversaries(a.adversary, a.solvers, a.verifiers, a.verification));
  std::map<int, std::string> adversary_of;  // node -> mode
  for (const AdversaryPlan& p : adversaries) adversary_of[p.node] = p.mode;
  auto limited = [&](int i) { return memory_limit > 0 && i < a.solvers + a.verifiers; };
  auto roles_of = [&](int i) -> std::string {
    if (i >= a.solvers + a.verifiers) return "aggregator";
    const std::string aggregator = limited(i) ? "" : ",aggregator";
    if (!a.verification) return "solver" + aggregator;
    return i < a.solvers ? "solver,verifier" + aggregator : "verifier";
  };

  // 1. The task, validated before anything starts.
  ML_ASSIGN_OR_RETURN(PreparedTask task, PrepareTask(env, a.task));
  ML_RETURN_IF_ERROR(OverrideAssurance(a, &task));
  ML_RETURN_IF_ERROR(CheckMemoryLimit(task, memory_limit, a.memory_limit));
  const uint32_t stages = task.params.stages > 1 ? task.params.stages : 1;
  // A pipeline round is placed whole on R x S distinct nodes (a node holds one unit of a round);
  // a solver adversary, once jailed, leaves the re-run of its round one node short.
  if (stages > 1) {
    const int need = static_cast<int>(task.params.units_per_round) +
                     (std::any_of(adversaries.begin(), adversaries.end(),
                                  [](const AdversaryPlan& p) { return p.role == "solver"; })
                          ? 1
                          : 0);
    if (a.solvers < need) {
      return InvalidArgument(fmt::format(
          "--solvers {}: the task's rounds are {} replicas x {} stages, each stage on its own node, "
          "so it needs at least {} solvers{}; pass --solvers {}",
          a.solvers, task.net.units_per_round, stages, task.params.units_per_round,
          need > static_cast<int>(task.params.units_per_round)
              ? ", and one more for the re-run of a round after a cheating solver is jailed"
              : "",
          need));
    }
  }
  int64_t kill_round = -1;
  std::string etcd_bin;
  ML_RETURN_IF_ERROR(CheckSequencerFlags(a, task.net.rounds, &kill_round, &etcd_bin));
  const bool replicated = a.sequencers >= 2;
  const std::string pipeline_text =
      stages > 1 ? fmt::format(", pipelined: {} replicas x {} stages x {} micro-batches a step",
                               task.net.units_per_round, stages, task.task.micro_batches)
                 : "";
  say(fmt::format("devnet: {} ({} rounds x {} units x {} steps{}), {} solvers{}, verification {}",
                  a.task, task.net.rounds, task.net.units_per_round, task.net.inner_steps,
                  pipeline_text, a.solvers,
                  a.verifiers > 0 ? fmt::format(" + {} verifiers", a.verifiers) : "",
                  !a.verification ? "off"
                  : a.referee_service
                      ? "on (the ledger rules disputes from witnesses; the devnet's sequencer key "
                        "referees those it cannot)"
                      : "on (the ledger rules disputes from the parties' witnesses; no referee "
                        "service: --no-referee-service)"));
  if (memory_limit > 0) {
    say(fmt::format("memory: the solvers{} offer {} bytes each to training (--memory-limit); "
                    "node{} (no limit) aggregates",
                    a.verifiers > 0 ? " and verifiers" : "", memory_limit, total_nodes - 1));
  }
  for (const AdversaryPlan& p : adversaries) {
    say(fmt::format("node{} is an adversary: {} {}", p.node, p.role, p.mode));
  }

  // 2. Directories, keys, genesis.
  const std::string dir = a.out;
  if (env->FileExists(JoinPath(dir, "chain"))) {
    return AlreadyExists(JoinPath(dir, "chain") + " exists (an earlier devnet); remove " + dir +
                         " or pass another --out");
  }
  const std::string home = JoinPath(dir, "home");
  ML_RETURN_IF_ERROR(env->CreateDirs(home, 0700));
  ML_RETURN_IF_ERROR(env->CreateDirs(JoinPath(dir, "logs")));
  KeyStore user_keys(env, HomeLayout(home).KeysDir());
  ML_ASSIGN_OR_RETURN(KeyPair submitter, user_keys.Create("submitter", ""));
  std::vector<PublicKey> funded = {submitter.public_key()};
  std::vector<std::string> node_dirs;
  std::vector<PublicKey> node_ids;
  for (int i = 0; i < total_nodes; ++i) {
    std::string nd = JoinPath(dir, fmt::format("node{}", i));
    ML_RETURN_IF_ERROR(env->CreateDirs(nd, 0700));
    KeyStore ks(env, HomeLayout(nd).KeysDir());  // a node's data_dir is a home
    ML_ASSIGN_OR_RETURN(KeyPair nk, ks.Create("node", ""));
    node_dirs.push_back(nd);
    node_ids.push_back(nk.public_key());
    funded.push_back(nk.public_key());
  }
  const std::string chain_dir = JoinPath(dir, "chain");
  ML_RETURN_IF_ERROR(env->CreateDirs(chain_dir, 0700));
  KeyStore chain_keys(env, ledger::ChainKeysDir(chain_dir));
  ML_ASSIGN_OR_RETURN(KeyPair seq, chain_keys.Create(ledger::kSequencerKeyName, ""));
  // The sequencer's key is the referee: it sends RuleDispute, so it needs an account.
  if (a.verification) funded.push_back(seq.public_key());
  // A replicated sequencer's candidates: chain/ holds "sequencer", chain-I/ "sequencer-I"; each
  // directory is one candidate's (its chain.db, its key), as on separate machines.
  std::vector<std::string> cand_dirs = {chain_dir};
  std::vector<std::string> cand_keys = {ledger::kSequencerKeyName};
  std::vector<PublicKey> cand_ids = {seq.public_key()};
  for (int i = 2; i <= a.sequencers; ++i) {
    const std::string d = JoinPath(dir, fmt::format("chain-{}", i));
    ML_RETURN_IF_ERROR(env->CreateDirs(d, 0700));
    const std::string name = fmt::format("{}-{}", ledger::kSequencerKeyName, i);
    KeyStore ks(env, ledger::ChainKeysDir(d));
    ML_ASSIGN_OR_RETURN(KeyPair k, ks.Create(name, ""));
    cand_dirs.push_back(d);
    cand_keys.push_back(name);
    cand_ids.push_back(k.public_key());
  }
  const uint64_t balance = std::max<uint64_t>(task.net.budget * 2, 10'000'000);
  ledger::Genesis gen = ledger::DevnetGenesis(funded, balance);
  gen.block_interval_ms = a.block_interval_ms;
  // Verification on: every committed unit is checked by the rules of docs/verification.md.
  // genesis.referee stays zero: the sequencer's key rules disputes (this process holds it).
  gen.params.verification = a.verification;
  if (a.forced_errors >= 0) {
    gen.params.forced_error_per_million = static_cast<uint32_t>(a.forced_errors);
  }
  gen.params.rounds_in_flight = static_cast<uint32_t>(a.rounds_in_flight);
  // Windows of at least kVerifyWindowMs: a verifier drawn for its first unit of the task must
  // fetch and load the task's data (seconds) before it can replay and commit its verdict; at
  // 200 ms blocks the default 5-block windows closed first and the unit went unchecked. The
  // commit window is longer: a check of a `full` task replays the whole unit on a node that is
  // training its own (4 nodes on 2 cores took 5 s), and a verdict too late leaves the unit
  // abandoned, re-run with the rounds after it. Windows close once everyone is in
  // (docs/verification.md), so a long one costs time only when a party is silent.
  {
    auto blocks = [&](int64_t ms) {
      return static_cast<uint64_t>((ms + a.block_interval_ms - 1) /
                                   std::max<int64_t>(1, a.block_interval_ms));
    };
    ledger::ChainParams& p = gen.params;
    p.verdict_commit_blocks = std::max(p.verdict_commit_blocks, blocks(kCommitWindowMs));
    p.verdict_reveal_blocks = std::max(p.verdict_reveal_blocks, blocks(kVerifyWindowMs));
    p.dispute_response_blocks = std::max(
        p.dispute_response_blocks,
        blocks(a.dispute_window_ms > 0 ? a.dispute_window_ms : DisputeWindowMs(task.facts)));
    // A node pauses the unit it trains for an urgent check's replay, which the scheduler's
    // deadline (its estimate of the unit alone) does not count; the replay costs about what a
    // dispute turn's does, so every deadline is at least that (the 10M GPT: 24 s; one
    // DevnetLong run in three lost the lazy solver's unit so: its deadline passed while it
    // replayed a check, another node trained the unit, and nobody was slashed).
    p.min_deadline_blocks = std::max(p.min_deadline_blocks, blocks(DisputeWindowMs(task.facts)));
    // Time for `task audit --full --prove` against a --keep devnet to reopen the task (a full
    // audit of examples/fashion-mlp.toml re-executes its 48 units in about a minute); stake
    // stays bonded for at least as long (genesis requires it).
    p.audit_window_blocks = std::max(p.audit_window_blocks, blocks(kAuditWindowMs));
    if (stages > 1) {
      // A stage node replays a stage for its verdict only when that fits in its memory beside the
      // stage unit it trains (NodeAgent::WaitsForStageUnit), so a verdict may wait for a unit to
      // end (15-30 s for the 10M GPT's stages on 2 loaded cores; at 10 s the checks of the
      // nodes that trained went abandoned, and their units re-ran). A stage over the stage
      // witness bound is ruled by the genesis referee, this process, which replays the whole
      // stage step (longer than the default 20 blocks, 4 s at 200 ms, under that load).
      p.verdict_commit_blocks = std::max(p.verdict_commit_blocks, blocks(kStageCommitWindowMs));
      if (p.referee_blocks > 0) {
        p.referee_blocks = std::max(p.referee_blocks, blocks(kStageRefereeMs));
      }
      if (memory_limit > 0) {
        // One node aggregates (the only one that holds the whole model). Its first aggregation
        // builds the model's trainer and evaluates it, seconds the scheduler's estimate (the
        // deltas' transfer and sum: 2-3 s here) does not count, so a short deadline expires and
        // the round waits a deadline more for the same node (ForgiveAggregatorExcluded; before
        // it, the round waited for good).
        p.min_deadline_blocks = std::max(p.min_deadline_blocks, blocks(kLimitedDeadlineMs));
      }
    }
    p.unbonding_delay_blocks = std::max(p.unbonding_delay_blocks, p.audit_window_blocks);
  }
  gen.genesis_time_ms = SystemClock::Default()->NowMillis();
  gen.sequencer = seq.public_key();
  if (replicated) gen.sequencers = cand_ids;
  ML_RETURN_IF_ERROR(ledger::ValidateGenesis(gen));
  for (const std::string& d : cand_dirs) {
    ML_RETURN_IF_ERROR(ledger::WriteGenesis(env, ledger::ChainGenesisPath(d), gen));
  }

  // 3. Processes.
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ledger::LocalEtcdCluster etcd;  // declared before the fleet: it outlives the candidates
  Fleet fleet;
  if (replicated) {
    const std::string etcd_dir = JoinPath(dir, "etcd");
    ML_RETURN_IF_ERROR(env->CreateDirs(etcd_dir));
    Status up = etcd.Start(etcd_bin, kEtcdMembers, etcd_dir);
    if (!up.ok()) return up.WithPrefix("the devnet's etcd cluster (" + etcd_bin + ")");
    say(fmt::format("etcd: {} members at {} (data and logs in {})", kEtcdMembers, etcd.ClientUrls(),
                    etcd_dir));
  }
  // The ledger: one `chain serve`, or the candidates of a replicated sequencer.
  std::vector<std::string> cand_urls;
  std::vector<size_t> cand_child;  // index in fleet.children
  for (size_t i = 0; i < cand_dirs.size(); ++i) {
    // Port 0, read back from its --json first line: ChainServeUrl.
    std::vector<std::string> args = {"--json",   "chain",       "serve",        "--dir", cand_dirs[i],
                                     "--listen", "127.0.0.1:0", "--rate-limit", "0"};
    if (replicated) {
      for (const std::string& s :
           {std::string("--cluster"), etcd.ClientUrls(), std::string("--key"), cand_keys[i]}) {
        args.push_back(s);
      }
    }
    const std::string name = i == 0 ? "chain" : fmt::format("chain-{}", i + 1);
    ML_ASSIGN_OR_RETURN(Child c, Spawn(name, args, JoinPath(dir, "logs/" + name + ".log"), home));
    cand_child.push_back(fleet.children.size());
    fleet.children.push_back(c);
    ML_ASSIGN_OR_RETURN(std::string url, ChainServeUrl(env, c));
    cand_urls.push_back(url);
  }
  std::string rpc_url;  // every candidate, comma-separated: clients fail over (rpc_client.h)
  for (const std::string& u : cand_urls) rpc_url += (rpc_url.empty() ? "" : ",") + u;
  ledger::RpcClient rpc(rpc_url, {.retries = 5});
  {
    Status up = Unavailable("not started");
    for (int i = 0; i < 100 && !up.ok(); ++i) {
      if (g_stop_signal.load()) return Interrupted();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      up = rpc.Call("chain_status", json::object()).status();
    }
    if (!up.ok()) {
      return Unavailable("chain serve did not answer at " + rpc_url + " (see " +
                         JoinPath(dir, "logs/chain.log") + "): " + up.message());
    }
  }
  if (replicated) {
    Result<std::pair<size_t, uint64_t>> leader = FindLeader(cand_urls, 60000);
    if (!leader.ok()) {
      return leader.status().WithPrefix("the devnet's sequencer candidates (see " +
                                        JoinPath(dir, "logs/chain*.log") + ")");
    }
    say(fmt::format("ledger: {} sequencer candidates at {}; candidate {} leads", a.sequencers,
                    rpc_url, leader->first));
  } else {
    say("ledger at " + rpc_url);
  }
  say("dashboard: " + cand_urls[0] +
      "/ (open it in a browser: live while the devnet runs; --keep keeps it up after the task)");

  // One measurement of this machine for every node: they share it. Were each node to run the
  // benchmark itself, the nodes would measure each other's benchmarks at once, and one that
  // measured low would get a smaller share of the units, or none (the scheduler deals units by
  // reported throughput; --speed is applied by the node on top of this number).
  ML_ASSIGN_OR_RETURN(node::BenchResult machine, node::RunStandardBench({.seconds = 2.0}));
  say(fmt::format("benchmark: {:.2f} GFLOP/s (one measurement of this machine, reported by every node)",
                  static_cast<double>(machine.flops_per_s) / 1e9));

  std::vector<size_t> node_child(total_nodes, SIZE_MAX);
  std::vector<std::string> node_addr(total_nodes);  // host:port of its data plane and /metrics
  std::map<std::string, std::string> endpoint_dir;
  auto start_node = [&](int i) -> Status {
    // A path inside node.toml is relative to node.toml's folder (docs/paths.md): "." here.
    const std::string path = JoinPath(node_dirs[i], "node.toml");
    std::string cfg = fmt::format(
        "data_dir = \"{}\"\nrpc = \"{}\"\nlisten = \"127.0.0.1:0\"\nroles = \"{}\"\n"
        "price = {}\nstake = {}\nheartbeat_blocks = 5\nspeed_factor = {}\n",
        PathForFile(path, node_dirs[i]), rpc_url, roles_of(i), a.price, kNodeStake,
        speeds.count(i) ? speeds[i] : 1.0);
    if (adversary_of.count(i)) cfg += fmt::format("adversary = \"{}\"\n", adversary_of[i]);
    if (kills.count(i)) cfg += fmt::format("crash_in_unit = {}\n", kills[i]);
    if (limited(i)) cfg += fmt::format("memory_limit_bytes = {}\n", memory_limit);
    cfg += fmt::format("[capabilities]\nthroughput = {}\n", machine.flops_per_s);
    if (limited(i)) cfg += fmt::format("memory_bytes = {}\n", memory_limit);
    ML_RETURN_IF_ERROR(env->WriteFileAtomic(path, cfg));
    ML_ASSIGN_OR_RETURN(Child c, Spawn(fmt::format("node{}", i), {"node", "run", "--config", path},
                                       JoinPath(dir, fmt::format("logs/node{}.log", i)), home));
    node_child[i] = fleet.children.size();
    fleet.children.push_back(c);
    // listen port 0: the node binds a free port and announces it; read it back.
    ML_ASSIGN_OR_RETURN(node_addr[i], NodeBoundEndpoint(env, c, node_dirs[i]));
    endpoint_dir[node_addr[i]] = node_dirs[i];
    return Status::Ok();
  };
  int started = 0;
  for (int i = 0; i < total_nodes; ++i) {
    if (lates.count(i)) continue;
    ML_RETURN_IF_ERROR(start_node(i));
    ++started;
  }
  // Wait until they are registered and active.
  {
    size_t active = 0;
    for (int i = 0; i < 1200; ++i) {
      if (g_stop_signal.load()) return Interrupted();
      Result<std::vector<std::string>> eps = NodeEndpoints(rpc);
      active = eps.ok() ? eps->size() : 0;
      if (active >= static_cast<size_t>(started)) break;
      for (const Child& c : fleet.children) {
        if (c.pid > 0 && waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
          return Internal(c.name + " exited during start-up; see " + c.log);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (active < static_cast<size_t>(started)) {
      return DeadlineExceeded(fmt::format(
          "only {} of {} nodes registered within 120 s; see {}/logs", active, started, dir));
    }
  }
  say(fmt::format("{} node(s) registered ({:.1f}s)", started, elapsed()));

  // 4. Submit (the code of `task submit`).
  ML_ASSIGN_OR_RETURN(auto store, net::BlobStore::Open(env, HomeLayout(home).BlobsDir()));
  SubmitOptions so;
  so.memo = "devnet " + task.task.name;
  so.log = [&](const std::string& s) { say(s); };
  const double t_submit = elapsed();
  ML_ASSIGN_OR_RETURN(SubmittedTask sub,
                      SubmitPreparedTask(rpc, submitter, &task, store.get(), so));
  say(fmt::format("task {} submitted in block {}", sub.task_id.ToHex(), sub.height));
  std::unique_ptr<DevnetReferee> referee;
  if (a.verification && a.referee_service) {
    const std::string referee_dir = JoinPath(dir, "referee");
    ML_RETURN_IF_ERROR(env->CreateDirs(referee_dir));
    referee = std::make_unique<DevnetReferee>(env, rpc_url, seq, referee_dir,
                                              JoinPath(dir, "logs/referee.log"));
  }

  // 5. Watch, with the scenario events.
  ProgressBar bar("devnet", static_cast<int64_t>(task.total_units),
                  stages > 1 ? "stage units" : "units", !g.json);
  std::set<int> killed;  // solvers --kill took down (they died by SIGKILL as configured)
  std::map<int, bool> late_started;
  json events = json::array();
  // --kill-sequencer R: when round R starts, the candidate that leads then dies by SIGKILL.
  std::vector<std::string> live_urls = cand_urls;
  bool sequencer_killed = false;
  int64_t killed_height = -1;
  json killed_sequencer = nullptr;
  Status kill_status = Status::Ok();
  auto kill_leader = [&](uint64_t round) {
    sequencer_killed = true;
    Result<std::pair<size_t, uint64_t>> leader = FindLeader(live_urls, 30000);
    if (!leader.ok()) {
      kill_status =
          leader.status().WithPrefix(fmt::format("--kill-sequencer {}: no leader to kill", round));
      return;
    }
    const auto [i, height] = *leader;
    Child& c = fleet.children[cand_child[i]];
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);  // reaped here: the watch below must not count it as a failure
    c.pid = -1;
    live_urls[i].clear();
    killed_height = static_cast<int64_t>(height);
    killed_sequencer = {{"candidate", i},
                        {"key", cand_ids[i].ToHex()},
                        {"round", round},
                        {"height", height},
                        {"seconds", elapsed()}};
    events.push_back({{"event", "kill -9 sequencer"},
                      {"candidate", i},
                      {"key", cand_ids[i].ToHex()},
                      {"round", round},
                      {"height", height},
                      {"seconds", elapsed()}});
    say(
        fmt::format("round {} started: the leading sequencer candidate {} ({}) killed (-9) at "
                    "height {}",
                    round, i, c.name, height));
  };
  auto on_progress = [&](const json& j) {
    TaskProgress p = ProgressOf(j, TaskMetricOf(task.task));
    bar.Update(static_cast<int64_t>(p.units_committed), ProgressLine(p));
    if (kill_round >= 0 && !sequencer_killed &&
        p.rounds_done >= static_cast<uint64_t>(kill_round)) {
      kill_leader(static_cast<uint64_t>(kill_round));
    }
    for (auto& [i, at] : lates) {
      if (!late_started[i] && p.rounds_done > at) {  // round `at` (0-based) has finished
        late_started[i] = true;
        Status s = start_node(i);
        events.push_back({{"event", "join"},
                          {"solver", i},
                          {"node", node_ids[i].ToHex()},
                          {"after_round", at},
                          {"ok", s.ok()},
                          {"seconds", elapsed()}});
      }
    }
  };
  std::string died;
  // A process that exits on its own is a failure — say which and where its log is, rather than
  // wait for the timeout — except a --kill solver dying by SIGKILL: that is the scenario.
  auto stop = [&] {
    if (g_stop_signal.load()) return true;
    for (size_t ci = 0; ci < fleet.children.size(); ++ci) {
      Child& c = fleet.children[ci];
      int status = 0;
      if (c.pid <= 0 || waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.pid = -1;
      auto solver = std::find(node_child.begin(), node_child.end(), ci);
      const int i = static_cast<int>(solver - node_child.begin());
      if (solver != node_child.end() && kills.count(i) && WIFSIGNALED(status) &&
          WTERMSIG(status) == SIGKILL) {
        killed.insert(i);
        events.push_back({{"event", "kill -9"},
                          {"solver", i},
                          {"node", node_ids[i].ToHex()},
                          {"after_units", kills[i]},
                          {"seconds", elapsed()}});
        say(fmt::format("solver {} killed (-9) mid-unit after {} unit(s)", i, kills[i]));
        continue;
      }
      died = c.name + " exited unexpectedly (" +
             (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                  : "exit code " + std::to_string(WEXITSTATUS(status))) +
             "); see " + c.log;
      return true;
    }
    return false;
  };
  Result<json> watched = WatchTask(rpc, sub.task_id, a.timeout_s * 1000, on_progress, stop);
  if (!watched.ok()) {
    bar.Finish();
    if (g_stop_signal.load()) return Interrupted();
    if (!died.empty()) return Internal(died);
    return watched.status();
  }
  if (!kill_status.ok()) return kill_status;
  const double t_done = elapsed();
  json final_task = *watched;
  TaskProgress p = ProgressOf(final_task, TaskMetricOf(task.task));
  bar.Finish(ProgressLine(p));
  if (p.status != "finished") {
    return Internal("the task ended " + p.status + ", not finished: " + ProgressLine(p));
  }

  // 6. Fetch the final model.
  uint64_t fetched_bytes = 0;
  ML_ASSIGN_OR_RETURN(Hash256 fs, Hash256::FromHex(p.final_state, "final_state"));
  ML_ASSIGN_OR_RETURN(Bytes blob, FetchBlob(rpc, store.get(), net::BlobId{fs}, &fetched_bytes));
  const std::string model = JoinPath(dir, "model.safetensors");
  Hash256 weights_hash;
  ML_RETURN_IF_ERROR(WriteModel(env, task.task, blob, model, &weights_hash,
                                {.task_id = sub.task_id.ToHex(),
                                 .state = p.final_state,
                                 .round = static_cast<int64_t>(p.rounds_done) - 1}));
  const TaskMoney money = MoneyOf(final_task);

  // 7. Accounting: units per node, paid units, tokens (the vocabulary of TaskMoney,
  // docs/submitters.md), bytes moved, the token invariant.
  std::map<std::string, json> per_node;
  uint64_t paid_units = 0, committed = 0, unpaid_committed = 0;
  for (const json& u : final_task.value("units", json::array())) {
    const std::string who = u.value("assignee", "");
    const uint64_t paid = u.value("paid", uint64_t{0});
    const std::string st = u.value("status", "");
    json& n = per_node[who];
    if (n.is_null()) n = {{"units", 0}, {"paid_for_units", 0}};
    if (st == "committed" || st == "verified") {
      ++committed;
      n["units"] = n["units"].get<int>() + 1;
      if (paid == 0) ++unpaid_committed;
    }
    if (paid > 0) {
      ++paid_units;
      n["paid_for_units"] = n["paid_for_units"].get<uint64_t>() + paid;
    }
  }
  std::map<std::string, uint64_t> aggregator_paid;  // node -> tokens for aggregating
  for (const json& r : final_task.value("round_results", json::array())) {
    aggregator_paid[r.value("aggregator", "")] += r.value("aggregator_paid", uint64_t{0});
  }
  json nodes = json::array();
  json slashed = json::array();
  uint64_t stage_bytes = 0;  // a pipeline task's: summed over the nodes' /metrics
  double stage_running = 0, stage_waiting = 0;
  // The peak resident memory of the nodes that ran stage units and never built the whole model,
  // and of the nodes that only aggregate.
  uint64_t stage_peak_min = 0, stage_peak_max = 0, aggregator_peak = 0;
  for (int i = 0; i < total_nodes; ++i) {
    const std::string id = node_ids[i].ToHex();
    json n = per_node.count(id) ? per_node[id] : json{{"units", 0}, {"paid_for_units", 0}};
    n["solver"] = i;
    n["node"] = id;
    n["roles"] = roles_of(i);
    n["adversary"] = adversary_of.count(i) ? adversary_of[i] : "";
    n["speed"] = speeds.count(i) ? speeds[i] : 1.0;
    n["killed"] = killed.count(i) > 0;
    n["late"] = lates.count(i) > 0;
    // The node process's peak resident memory, read while it still runs (0: not running).
    const size_t ci = node_child[i];
    const pid_t pid = ci < fleet.children.size() ? fleet.children[ci].pid : -1;
    n["peak_rss_bytes"] = pid > 0 ? PeakRssBytes(pid) : 0;
    if (n["roles"] == "aggregator") {
      aggregator_peak = std::max(aggregator_peak, n["peak_rss_bytes"].get<uint64_t>());
    }
    ScrapedNodeMetrics sm;
    if (pid > 0) {
      Result<ScrapedNodeMetrics> scraped = ScrapeNodeMetrics(node_addr[i]);
      if (scraped.ok()) {
        sm = *scraped;
        n["units_trained"] = sm.units_trained;
      } else if (stages > 1) {
        // A pipeline task's memory and transfer checks read these: the report is incomplete.
        return scraped.status().WithPrefix(fmt::format("node{}'s metrics", i));
      } else {
        // Only the report's units_trained needs them: the trained model stands without it.
        say(fmt::format("warning: node{}'s metrics: {}; the report leaves its units_trained out", i,
                        scraped.status().ToString()));
      }
    }
    if (stages > 1 && pid > 0) {
      n["stage_bytes_sent"] = sm.bytes_sent;
      n["stage_seconds_running"] = sm.seconds_running;
      n["stage_seconds_waiting"] = sm.seconds_waiting;
      n["whole_models_built"] = sm.whole_models_built;
      n["whole_model_moments_bytes"] = sm.whole_model_moments_bytes;
      const uint64_t peak = n["peak_rss_bytes"].get<uint64_t>();
      if (n["units"].get<int>() > 0 && sm.whole_models_built == 0 && peak > 0) {
        stage_peak_min = stage_peak_min == 0 ? peak : std::min(stage_peak_min, peak);
        stage_peak_max = std::max(stage_peak_max, peak);
      }
      stage_bytes += sm.bytes_sent;
      stage_running += sm.seconds_running;
      stage_waiting += sm.seconds_waiting;
    }
    Result<json> nr = rpc.Call("get_node", {{"id", id}});
    if (nr.ok()) {
      // Verification pay and jackpot rewards as the ledger records them on the node (its
      // `earnings`, before the treasury's cut, as the task's tallies count pay): a cheating
      // solver's checks of other nodes' units show here apart from its units.
      const json e = nr->value("earnings", json::object());
      n["paid_for_verification"] = e.value("verification", uint64_t{0});
      n["checks_paid"] = e.value("checks_paid", uint64_t{0});
      n["jackpot_won"] = e.value("jackpot", uint64_t{0});
      n["reputation"] = nr->value("reputation", json::object());
      n["status"] = nr->value("status", "");
      const uint64_t stake = nr->value("stake", uint64_t{0});
      n["stake"] = stake;
      // Stake only shrinks by a slash while a node is registered (devnet nodes never add any).
      const uint64_t lost = stake < kNodeStake ? kNodeStake - stake : 0;
      n["slashed"] = lost;
      if (n["reputation"].value("slashes", uint64_t{0}) > 0) {
        slashed.push_back({{"solver", i},
                           {"node", id},
                           {"adversary", n["adversary"]},
                           {"amount", lost},
                           {"slashes", n["reputation"]["slashes"]},
                           {"status", n["status"]}});
      }
    }
    // earned: what the node's account gained (a devnet node is its own owner: every payment goes
    // to its key), i.e. its payments for units, aggregation and verification less the treasury's
    // cut of each, plus jackpot rewards. other_earnings, earned less what it was paid for units
    // and aggregation, is verification pay plus jackpot rewards less the treasury's cut of all of
    // the node's payments (kept for readers of report.json; paid_for_verification and
    // jackpot_won above are each apart).
    Result<json> acct = rpc.Call("get_account", {{"address", id}});
    if (acct.ok()) {
      const int64_t earned = static_cast<int64_t>(acct->value("balance", uint64_t{0})) -
                             static_cast<int64_t>(balance - kNodeStake);
      n["earned"] = earned;
      n["paid_for_aggregation"] = aggregator_paid[id];
      n["other_earnings"] = earned - static_cast<int64_t>(n["paid_for_units"].get<uint64_t>()) -
                            static_cast<int64_t>(aggregator_paid[id]);
    }
    nodes.push_back(n);
  }
  ML_ASSIGN_OR_RETURN(json chain_status, rpc.Call("chain_status", json::object()));
  const json totals = chain_status.value("totals", json::object());
  uint64_t sum = 0, minted = 0;
  for (const auto& [k, v] : totals.items()) {
    if (k == "minted" || k == "total_minted") {
      minted = v.get<uint64_t>();
    } else if (v.is_number_unsigned()) {
      sum += v.get<uint64_t>();
    }
  }
  const uint64_t model_bytes = task.params.model_bytes;
  // The sequencer: one, or a replicated one's candidates and every failover the chain shows.
  json sequencer_report = {{"candidates", a.sequencers}};
  if (replicated) {
    ML_ASSIGN_OR_RETURN(json failovers, Failovers(rpc, cand_ids, killed_height));
    sequencer_report = {{"candidates", a.sequencers}, {"etcd_members", kEtcdMembers},
                        {"etcd", etcd.ClientUrls()},  {"rpc", cand_urls},
                        {"killed", killed_sequencer}, {"failovers", failovers}};
  }

  *report = {{"task", a.task},
             {"task_id", sub.task_id.ToHex()},
             {"solvers", a.solvers},
             {"rounds", p.rounds_done},
             {"units_per_round", task.net.units_per_round},
             {"inner_steps", task.net.inner_steps},
             {"units", task.total_units},
             {"units_committed", committed},
             {"units_paid", paid_units},
             {"committed_unpaid", unpaid_committed},
             {"metric", MetricJson(p)},
             {"metric_text", MetricText(p)},
             {"money", MoneyJson(money)},
             {"money_text", MoneyLine(money)},
             {"spent", money.spent},
             {"refunded", money.refunded},
             {"budget", money.budget},
             {"bytes_published", sub.pushed_bytes},
             // The ledger's record of the model (a state blob id) and the hash of the weights in
             // model.safetensors (what `meshlearn eval` prints); `meshlearn task verify-model`
             // ties one to the other.
             {"final_state", p.final_state},
             {"final_weights_hash", weights_hash.ToHex()},
             {"model", model},
             {"seconds_total", elapsed()},
             {"seconds_training", t_done - t_submit},
             {"submit_height", sub.height},
             {"blocks_training", chain_status.value("height", uint64_t{0}) - sub.height},
             {"nodes", nodes},
             {"events", events},
             {"chain_totals", totals},
             {"token_invariant", minted == 0 ? json(nullptr) : json(minted == sum)},
             {"round_results", final_task.value("round_results", json::array())},
             {"sequencer", sequencer_report}};
  if (stages > 1) {
    ML_ASSIGN_OR_RETURN(const std::vector<uint64_t> stage_activations, StageActivationBytes(task));
    // The bubble measured: the share of the stage units' running time spent waiting for a
    // neighbour's tensor, over every stage node (on a shared machine, also for a neighbour that
    // waits for a core). GPipe's schedule alone would leave (S-1)/(M+S-1) of it idle.
    const double m = static_cast<double>(task.task.micro_batches);
    (*report)["pipeline"] = {
        {"stages", stages},
        {"replicas", task.net.units_per_round},
        {"micro_batches", task.task.micro_batches},
        {"bytes_activations", stage_bytes},
        {"bubble_fraction", stage_running > 0 ? stage_waiting / stage_running : 0.0},
        {"bubble_fraction_schedule", (stages - 1) / (m + stages - 1)},
        {"stage_memory_bytes", task.params.stage_memory_bytes},
        {"stage_activation_bytes", stage_activations},
        {"unpipelined_memory_bytes", UnitMemoryBytes(task.params)},
        {"memory_limit_bytes", memory_limit},
        // What a stage node's process held at its peak (VmHWM), over the nodes that ran stage
        // units only (they never build the whole model); 0 when none did. With the reference
        // check, single_node_peak_rss_bytes is that of `meshlearn diloco` on the same task, run
        // as its own process: the whole model trained on one node.
        {"stage_node_peak_rss_bytes", {{"min", stage_peak_min}, {"max", stage_peak_max}}},
        // What the scheduler asks of a round's aggregator (it builds the whole model to evaluate
        // and holds the round's deltas), against what the nodes that only aggregate held at
        // their peak (0 when there are none): the formula measured.
        {"aggregator_memory_bytes",
         protocol::AggregatorMemoryBytes(ledger::TaskSpecViewOf(Hash256{}, task.params, 0))},
        {"aggregator_peak_rss_bytes", aggregator_peak}};
  }
  if (a.verification) {
    // The referee service's own attempts, refused ones included, so that none is hidden. Read
    // before the task's rulings below: the service still runs, and an attempt it has seen
    // executed is then in the task's record that the later read returns.
    json attempts = json::array();
    for (const node::RefereeRecord& r :
         referee ? referee->rulings() : std::vector<node::RefereeRecord>{}) {
      attempts.push_back(
          {{"unit", r.dispute.index},
           {"step", r.dispute.task.step},
           {"defender", r.dispute.defender.ToHex()},
           {"challenger", r.dispute.challenger.ToHex()},
           {"output", r.ruling.output.ToHex()},
           {"for", r.ruling.output == r.dispute.task.defender_output     ? "defender"
                   : r.ruling.output == r.dispute.task.challenger_output ? "challenger"
                                                                         : "neither"},
           {"reason", r.ruling.reason},
           // RefereeStep: the ledger executed the step from the witness (`output` is what it
           // computes); RefereeTile: it recomputed one tile of one operator from the tile's
           // witness; RefereeStageStep: it replayed a pipeline stage's step from the whole stage
           // step's witness; RuleDispute: the genesis referee's ruling.
           {"tx", r.tx_type},
           {"tx_hash", r.tx_id.ToHex()},
           {"witness_bytes", r.ruling.witness_bytes},
           {"included", r.included},
           {"executed", r.ok},
           {"error", r.error}});
    }
    // What the ledger ruled, from the task's record as it is now: a party may post a ruling
    // before the referee service does (permissionless), and then the service's own attempt is
    // refused.
    ML_ASSIGN_OR_RETURN(json ruled_task, GetTask(rpc, sub.task_id, /*units=*/false));
    const json rulings = RulingsOf(ruled_task, seq.public_key(), node_ids);
    json checks = SettledChecks(final_task);
    (*report)["verification"] = {
        {"enabled", true},
        {"assurance", protocol::AssuranceName(task.net.assurance.kind)},
        {"referee", seq.public_key().ToHex()},
        {"forced_error_per_million", gen.params.forced_error_per_million},
        {"verifiers_per_unit", gen.params.verifiers_per_unit},
        {"adversaries", json::array()},
        {"checks", checks["settled"]},
        {"check_events", checks["events"]},
        {"taint", checks["taint"]},
        {"rounds_in_flight", gen.params.rounds_in_flight},
        {"dispute_window_ms", gen.params.dispute_response_blocks * a.block_interval_ms},
        {"rounds_dropped", checks["rounds_dropped"]},
        {"disputes_ruled", rulings},
        {"referee_attempts", attempts},
        {"slashed", slashed},
        {"jackpot", totals.value("jackpot", uint64_t{0})}};
    for (const AdversaryPlan& p : adversaries) {
      (*report)["verification"]["adversaries"].push_back({{"solver", p.node},
                                                          {"node", node_ids[p.node].ToHex()},
                                                          {"role", p.role},
                                                          {"mode", p.mode}});
    }
  } else {
    (*report)["verification"] = {{"enabled", false}};
  }

  // 8. Stop the network before the (CPU-heavy) reference check; --keep keeps it up until Ctrl-C,
  // after report.json is written.
  if (!a.keep) {
    if (referee) referee->Stop();
    StopAll(fleet.children, 5000);
    etcd.StopAll();
  }
  {
    std::vector<std::string> pushed_dirs;
    for (const std::string& ep : sub.pushed_to) {
      if (endpoint_dir.count(ep)) pushed_dirs.push_back(endpoint_dir[ep]);
    }
    ML_ASSIGN_OR_RETURN(
        Traffic tr, MeasureTraffic(env, node_dirs, node_ids, final_task, pushed_dirs, sub.blobs));
    const double samples =
        static_cast<double>(tr.deltas) * task.net.inner_steps * task.params.batch_size;
    const double per_sample = samples > 0 ? static_cast<double>(tr.delta_bytes) / samples : 0;
    const double n = std::max<double>(2, task.net.units_per_round);
    const double sync_ps = static_cast<double>(model_bytes) / task.params.batch_size;
    const double sync_ring = 2 * (n - 1) / n * sync_ps;
    (*report)["traffic"] = {
        {"solver_upload_bytes", tr.delta_bytes},
        {"deltas", tr.deltas},
        {"state_download_bytes", tr.state_bytes},
        {"task_blob_bytes_between_nodes", tr.task_bytes},
        {"submitter_push_bytes", sub.pushed_bytes},
        {"bytes_per_solver_sample", per_sample},
        {"sync_parameter_server_bytes_per_sample", sync_ps},
        {"sync_ring_allreduce_bytes_per_sample", sync_ring},
        {"ratio_vs_sync_parameter_server", per_sample > 0 ? sync_ps / per_sample : 0},
        {"ratio_vs_sync_ring_allreduce", per_sample > 0 ? sync_ring / per_sample : 0}};
    (*report)["bytes_moved"] =
        tr.delta_bytes + tr.state_bytes + tr.task_bytes + sub.pushed_bytes + fetched_bytes;
  }
  if (a.check_reference) {
    say("checking against the in-process reference (meshlearn diloco)...");
    node::LocalDilocoOptions lo;
    lo.eval_every_round = false;
    const double t_ref = elapsed();
    node::NetworkSpec net = task.net;
    ML_ASSIGN_OR_RETURN(node::LocalDilocoResult ref,
                        node::RunLocalDiloco(task.trainer.get(), net, lo));
    (*report)["reference_hash"] = ref.final_hash.ToHex();
    (*report)["reference_accuracy"] = ref.rounds.back().eval.accuracy;
    (*report)["reference_test_loss"] = ref.rounds.back().eval.loss;
    (*report)["reference_seconds"] = elapsed() - t_ref;
    (*report)["matches_reference"] = ref.final_hash == weights_hash;
    if (stages > 1) {
      // The single-node figure a stage node's memory is measured against: the same task trained
      // whole by `meshlearn diloco` in a process of its own, its peak resident memory as it reads
      // it itself (its report's peak_rss_bytes). In this process the reference shares memory
      // with the devnet's own; and wait4's ru_maxrss for the child would be the larger of its
      // peak and this process's memory at the fork (exec keeps the forked copy's peak): 758-795
      // MB there, the devnet's, where the child peaks at 610 MB.
      say("measuring the whole model on one node (meshlearn diloco as its own process)...");
      const std::string ref_dir = JoinPath(dir, "reference");
      ML_ASSIGN_OR_RETURN(Child c, Spawn("reference", {"diloco", a.task, "--out", ref_dir},
                                         JoinPath(dir, "logs/reference.log"), home));
      int wstatus = 0;
      if (waitpid(c.pid, &wstatus, 0) != c.pid || !WIFEXITED(wstatus) ||
          WEXITSTATUS(wstatus) != 0) {
        return Internal("meshlearn diloco " + a.task + " (the single-node memory figure) failed; " +
                        "see " + JoinPath(dir, "logs/reference.log"));
      }
      ML_ASSIGN_OR_RETURN(const std::string ref_text,
                          env->ReadFile(JoinPath(ref_dir, "report.json")));
      const json ref_report = json::parse(ref_text, nullptr, false);
      if (!ref_report.is_object() || !ref_report.contains("peak_rss_bytes") ||
          !ref_report["peak_rss_bytes"].is_number_unsigned()) {
        return Internal(JoinPath(ref_dir, "report.json") +
                        ": no peak_rss_bytes (the single-node memory figure)");
      }
      const uint64_t single = ref_report["peak_rss_bytes"].get<uint64_t>();
      json& pl = (*report)["pipeline"];
      pl["single_node_peak_rss_bytes"] = single;
      pl["stage_node_peak_fraction"] =
          single > 0 ? static_cast<double>(stage_peak_max) / static_cast<double>(single) : 0.0;
      // The issue's bound on a stage node's peak: 1/S of the single node's, plus the activations
      // of the stage that holds the most of them (a node may train any stage).
      const std::vector<uint64_t> acts = pl["stage_activation_bytes"].get<std::vector<uint64_t>>();
      pl["stage_node_peak_target_bytes"] =
          single / stages + *std::max_element(acts.begin(), acts.end());
    }
  }
  // In the file, "task" and "model" are relative to its folder (docs/paths.md).
  ML_RETURN_IF_ERROR(WriteReportFile(JoinPath(dir, "report.json"), *report, {"task", "model"}));
  (*report)["report"] = JoinPath(dir, "report.json");
  Status verdict = Status::Ok();
  if (a.check_reference && !(*report)["matches_reference"].get<bool>()) {
    verdict = DataLoss("the devnet's final weights " + weights_hash.ToHex() +
                       " differ from the in-process reference " +
                       (*report)["reference_hash"].get<std::string>() +
                       " (report: " + JoinPath(dir, "report.json") + ")");
  }
  if (verdict.ok() || !g.json) emit(*report);  // --json: one document, the report or the error
  if (a.keep) {
    std::cerr << "task finished; the network stays up for `meshlearn task ...` and `meshlearn "
                 "wallet ...` commands.\nThe submitter's key is \"submitter\" in "
              << AbsolutePath(home) << "/keys:\n  export MESHLEARN_HOME=" << AbsolutePath(home)
              << "\n  meshlearn task status " << sub.task_id.ToHex() << " --rpc " << rpc_url
              << "\n  meshlearn wallet balance --key submitter --rpc " << rpc_url
              << "\ndashboard: " << cand_urls[0] << "/\nCtrl-C stops it." << std::endl;
    while (!g_stop_signal.load()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g_stop_signal.store(0);
  }
  return verdict;
}

void PrintReport(GlobalOptions& g, const json& report);

void AddDevnet(CLI::App& root, GlobalOptions& g) {
  static DevnetArgs a;
  CLI::App* cmd = root.add_subcommand(
      "devnet",
      "Run a whole network on this machine (ledger + nodes as processes) and train a task");
  cmd->add_option("--task", a.task, "Task file with a [network] table")->required();
  cmd->add_option("--solvers", a.solvers,
                  "Nodes to start (solver and aggregator roles; with --memory-limit solvers only, "
                  "and one more node aggregates)")
      ->capture_default_str();
  cmd->add_option(
         "--out", a.out,
         "Directory for the chain, the nodes, logs, model and report.json (must not hold a devnet)")
      ->capture_default_str();
  cmd->add_option("--block-interval-ms", a.block_interval_ms, "Time between blocks")
      ->capture_default_str();
  cmd->add_option("--timeout", a.timeout_s, "Give up after this many seconds")
      ->capture_default_str();
  cmd->add_option("--price", a.price, "Every node's price, tokens per GFLOP")
      ->capture_default_str();
  cmd->add_flag(
      "--check-reference,!--no-check-reference", a.check_reference,
      "Compare the final weights with `meshlearn diloco` run in this process (default on)");
  cmd->add_flag(
      "--keep", a.keep,
      "After the task, keep the network running until Ctrl-C (try `meshlearn task ...` on it)");
  cmd->add_option("--speed", a.speed, "I=F: solver I runs at F x speed (e.g. 3=0.5); repeatable");
  cmd->add_option("--kill", a.kill,
                  "I@U: solver I dies by kill -9 mid-unit after committing U units of its own; repeatable");
  cmd->add_option("--late", a.late,
                  "I@R: start solver I only once round R (numbered from 0) finished; repeatable");
  cmd->add_option("--adversary", a.adversary,
                  "ROLE:MODE: one node cheats (solver:lazy|noisy|wrong_data|copy|stale|"
                  "wrong_result|noisy_last|targeted|drift|wrong_example, verifier:rubber_stamp); "
                  "repeatable");
  cmd->add_option("--verifiers", a.verifiers,
                  "Verifier-only nodes to add (every solver node verifies too)")
      ->capture_default_str();
  cmd->add_flag("--verification,!--no-verification", a.verification,
                "Check committed units, their disputes ruled from witnesses and by this "
                "process's referee service (default on)");
  cmd->add_flag("--referee-service,!--no-referee-service", a.referee_service,
                "Run the referee service with the sequencer's key (default on); without it the "
                "dispute parties' own witnesses rule, and a dispute only the genesis key can "
                "rule ends undecided");
  cmd->add_option("--assurance", a.assurance,
                  "economic | full | target: the task's [network] assurance for this run "
                  "(default: the task file's; docs/submitters.md, \"Assurance\")");
  cmd->add_option("--target-escape-ppm", a.target_escape_ppm,
                  "With --assurance target: the chance, per million, that one corrupted segment "
                  "escapes every check");
  cmd->add_option("--sequencers", a.sequencers,
                  "1: one `chain serve`; 2..9: candidates of a replicated sequencer on a local "
                  "3-member etcd (needs etcd-server; docs/operators.md, \"Running a replicated "
                  "chain\")")
      ->capture_default_str();
  cmd->add_option("--kill-sequencer", a.kill_sequencer,
                  "R: SIGKILL the leading sequencer candidate when round R (from 0) starts; the "
                  "report says how long the chain went without a block");
  cmd->add_option("--dispute-window-ms", a.dispute_window_ms,
                  "Each dispute turn's window, at least: a party replays the disputed step with "
                  "its operator trace within one (default 0: 4 s, plus 2 s per whole million "
                  "parameters of the task's model)")
      ->capture_default_str();
  cmd->add_option("--rounds-in-flight", a.rounds_in_flight,
                  "Aggregated rounds whose checks may run while later rounds train (genesis "
                  "rounds_in_flight; 0: each round waits for the one before it to be final; "
                  "default 4, the ledger's default is 2)");
  cmd->add_option("--memory-limit", a.memory_limit,
                  "The memory every node offers to training (bytes, or with K, M or G for KiB, "
                  "MiB, GiB; default: the machine's): below what a whole unit needs, only a "
                  "pipeline task whose every stage fits can run");
  cmd->add_option("--forced-errors", a.forced_errors,
                  "Forced errors per million units (genesis forced_error_per_million; default: "
                  "the ledger's)");
  cmd->footer(
      "Examples:\n"
      "  meshlearn devnet --solvers 4 --task examples/fashion-mlp.toml --out out/devnet\n"
      "  meshlearn --json devnet --solvers 4 --task examples/fashion-cnn.toml --out out/cnn\n"
      "  meshlearn devnet --solvers 4 --task examples/fashion-cnn.toml --no-check-reference\n"
      "  meshlearn devnet --solvers 4 --task tests/devnet-tiny.toml --out /tmp/d --keep  # then "
      "try `meshlearn task ...` on it\n"
      "  meshlearn devnet --solvers 4 --task tests/devnet-tiny.toml --out /tmp/d --kill 1@2 --late "
      "3@1\n"
      "  meshlearn devnet --solvers 4 --task tests/devnet-tiny.toml --out /tmp/d --adversary "
      "solver:lazy\n"
      "  meshlearn devnet --solvers 4 --task examples/fashion-mlp.toml --out /tmp/d --adversary "
      "solver:noisy --assurance full\n"
      "  meshlearn devnet --solvers 4 --task tests/devnet-tiny.toml --out /tmp/d --sequencers 3 "
      "--kill-sequencer 1\n"
      "  meshlearn devnet --solvers 6 --task tests/devnet-pipeline.toml --out /tmp/d "
      "--no-verification --memory-limit 8M\n"
      "Writes DIR/model.safetensors and DIR/report.json (the task's metric, rounds, units, money:\n"
      "spent = paid to solvers + verifiers + aggregators, treasury cut, refunded; bytes; the\n"
      "task's final state id and the weights hash vs the in-process reference); logs of every\n"
      "process in DIR/logs. Rounds are numbered from 0, as on the ledger.\n"
      "Ctrl-C stops every process it started.");
  cmd->callback([&g] { g.Exit(RunDevnet(g, a, [&g](const json& report) { PrintReport(g, report); })); });
}

// The report, as --json or as the human summary.
void PrintReport(GlobalOptions& g, const json& report) {
    g.Output(report, [&] {
      std::cout << fmt::format(
          "devnet: {} rounds, {} units ({} paid) on {} solvers in {:.0f}s: {}\n{}\n"
          "weights hash {}{}; final state {}\nmodel: {}\nreport: {}\n",
          report["rounds"].get<uint64_t>(), report["units_committed"].get<uint64_t>(),
          report["units_paid"].get<uint64_t>(), report["solvers"].get<int>(),
          report["seconds_training"].get<double>(), report["metric_text"].get<std::string>(),
          report["money_text"].get<std::string>(), report["final_weights_hash"].get<std::string>(),
          report.contains("matches_reference")
              ? (report["matches_reference"].get<bool>() ? " (= the in-process reference)"
                                                         : " (DIFFERS from the reference)")
              : "",
          report["final_state"].get<std::string>(), report["model"].get<std::string>(),
          report["report"].get<std::string>());
      const json seqr = report.value("sequencer", json::object());
      if (seqr.value("candidates", 1) > 1) {
        std::cout << fmt::format("sequencer: {} candidates on a {}-member etcd",
                                 seqr["candidates"].get<int>(), seqr.value("etcd_members", 0));
        const json& k = seqr["killed"];
        if (k.is_object()) {
          std::cout << fmt::format("; the leader (candidate {}) killed -9 when round {} started",
                                   k["candidate"].get<int>(), k["round"].get<uint64_t>());
        }
        std::cout << "\n";
        for (const json& f : seqr["failovers"]) {
          std::cout << fmt::format(
              "  failover{}: candidate {} -> {} at block {}: {} ms without a block\n",
              f["after_kill"].get<bool>() ? " (the kill)" : "", f["from"].get<int>(),
              f["to"].get<int>(), f["height"].get<uint64_t>(), f["gap_ms"].get<int64_t>());
        }
      }
      if (report.contains("pipeline")) {
        const json& pl = report["pipeline"];
        const uint32_t s = pl["stages"].get<uint32_t>();
        std::cout << fmt::format(
            "pipeline: {} stages x {} replicas, {} micro-batches; bubble {:.2f} (GPipe's schedule "
            "{:.2f}), {} bytes of activations",
            s, pl["replicas"].get<uint32_t>(), pl["micro_batches"].get<int64_t>(),
            pl["bubble_fraction"].get<double>(), pl["bubble_fraction_schedule"].get<double>(),
            pl["bytes_activations"].get<uint64_t>());
        const json peak = pl.value("stage_node_peak_rss_bytes", json::object());
        if (peak.value("max", uint64_t{0}) > 0) {
          std::cout << fmt::format("\n  stage nodes' peak memory {:.0f}-{:.0f} MB",
                                   peak["min"].get<uint64_t>() / 1e6,
                                   peak["max"].get<uint64_t>() / 1e6);
          if (pl.contains("single_node_peak_rss_bytes")) {
            const uint64_t single = pl["single_node_peak_rss_bytes"].get<uint64_t>();
            const uint64_t max = peak["max"].get<uint64_t>();
            const uint64_t target = pl["stage_node_peak_target_bytes"].get<uint64_t>();
            std::cout << fmt::format(
                "; the whole model on one node (meshlearn diloco) {:.0f} MB: a stage node "
                "holds at most {:.2f} of it (1/S = {:.2f})\n  target (issue 15): 1/S of it plus "
                "a stage's activations, {:.0f} + {:.0f} = {:.0f} MB; the heaviest stage node "
                "{:.0f} MB: {}",
                single / 1e6, pl["stage_node_peak_fraction"].get<double>(), 1.0 / s,
                single / s / 1e6, (target - single / s) / 1e6, target / 1e6, max / 1e6,
                max <= target ? "met" : "ABOVE it");
          }
        }
        std::cout << "\n";
      }
      const json& v = report["verification"];
      if (!v.value("enabled", false)) return;
      const json& c = v["checks"];
      std::cout << fmt::format(
          "verification: checks settled: {} clean, {} unchecked, {} fraud, {} forced error, {} "
          "abandoned; {} ruling(s) executed by the ledger\n",
          c["clean"].get<int>(), c["unchecked"].get<int>(), c["fraud"].get<int>(),
          c["forced_error"].get<int>(), c["abandoned"].get<int>(), v["disputes_ruled"].size());
      const json taint = v.value("taint", json::object());
      if (taint.value("rounds_rewound", uint64_t{0}) > 0) {
        std::cout << fmt::format(
            "  taint: a proven cheater's earlier work re-ran {} earlier round(s); {} tokens it had "
            "been paid for them came back from its stake\n",
            taint["rounds_rewound"].get<uint64_t>(), taint["clawed_back"].get<uint64_t>());
      }
      if (v.value("rounds_dropped", uint64_t{0}) > 0) {
        std::cout << fmt::format(
            "  rounds in flight: {} round(s) trained on a round that then re-ran were dropped\n",
            v["rounds_dropped"].get<uint64_t>());
      }
      for (const json& r : v["disputes_ruled"]) {
        // Which transaction ruled (RefereeTile, RefereeStep, RefereeStageStep, RuleDispute), from
        // how large a witness, and who sent it.
        std::cout << fmt::format(
            "  ruling on unit {} step {} by {} (witness {} bytes) from {} in block {}: for the {} "
            "({})\n",
            r["index"].get<uint32_t>(), r["step"].get<uint64_t>(), r["tx"].get<std::string>(),
            r["witness_bytes"].get<uint64_t>(), r["sender_is"].get<std::string>(),
            r["height"].get<uint64_t>(), r["for"].get<std::string>(),
            r["reason"].get<std::string>());
      }
      for (const json& r : v.value("referee_attempts", json::array())) {
        if (r.value("executed", false)) continue;  // listed above, with the ledger's rulings
        // `error` is the ledger's refusal of an included attempt; one not yet included has none.
        std::cout << fmt::format("  the referee service's {} on unit {} was not executed: {}\n",
                                 r["tx"].get<std::string>(), r["unit"].get<uint32_t>(),
                                 r.value("included", false) ? r.value("error", std::string())
                                                            : std::string("not included yet"));
      }
      for (const json& n : report["nodes"]) {
        const std::string adv = n.value("adversary", "");
        std::cout << fmt::format(
            "  node{} {}{}: {} units, paid {} for units, {} for aggregation, {} for verifying {} "
            "check(s), {} from the jackpot; earned {} in all, after the treasury's cut; slashed "
            "{} ({})\n",
            n["solver"].get<int>(), n.value("roles", ""),
            adv.empty() ? "" : " [adversary " + adv + "]", n["units"].get<int>(),
            n["paid_for_units"].get<uint64_t>(), n.value("paid_for_aggregation", uint64_t{0}),
            n.value("paid_for_verification", uint64_t{0}), n.value("checks_paid", uint64_t{0}),
            n.value("jackpot_won", uint64_t{0}), n.value("earned", int64_t{0}),
            n.value("slashed", uint64_t{0}), n.value("status", ""));
      }
      const json& m = report["metric"];
      if (report.contains("reference_accuracy") && m.contains("test_accuracy")) {
        std::cout << fmt::format("test accuracy {:.4f} vs {:.4f} for the honest in-process run\n",
                                 m["test_accuracy"].get<double>(),
                                 report["reference_accuracy"].get<double>());
      } else if (report.contains("reference_test_loss") && m.contains("test_loss")) {
        std::cout << fmt::format("test loss {:.4f} vs {:.4f} for the honest in-process run\n",
                                 m["test_loss"].get<double>(),
                                 report["reference_test_loss"].get<double>());
      }
    });
}

}  // namespace

MESHLEARN_COMMAND(20, AddDevnet);

}  // namespace meshlearn::cli
