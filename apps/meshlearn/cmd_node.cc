// meshlearn node init|bench|run|leave: run a training node (docs/operators.md, "Run a node").
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/home_layout.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/log.h"
#include "meshlearn/base/prometheus.h"
#include "meshlearn/cli.h"
#include "meshlearn/ledger/tx.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/node/agent.h"
#include "meshlearn/node/bench.h"
#include "meshlearn/node/chain_client.h"
#include "meshlearn/node/stage_evidence.h"

namespace meshlearn::cli {
namespace {

using nlohmann::json;

struct NodeArgs {
  std::string config = "node.toml";
  double seconds = 2.0;
  bool rejoin = false;
  // --disk-limit: replaces node.toml's disk_limit_bytes when given (any value, UINT64_MAX too,
  // is checked against the free space).
  std::optional<uint64_t> disk_limit;
};

// node.toml, validated (see the footer of `meshlearn node --help` and docs/operators.md).
struct NodeConfig {
  std::string path;
  std::string data_dir;
  std::string rpc = "http://127.0.0.1:7700";
  std::string listen = "127.0.0.1:7801";
  std::string endpoint;  // default: listen
  // listen has port 0 and no endpoint is set: the endpoint is the address the server binds
  // (RunNode sets it once bound).
  bool endpoint_from_bound = false;
  uint32_t roles = ledger::kRoleSolver | ledger::kRoleAggregator;
  uint64_t price = 1;
  uint64_t stake = 1000;
  uint64_t heartbeat_blocks = 5;
  uint64_t blob_quota_bytes = 10ull << 30;
  double speed_factor = 1.0;
  uint32_t max_units = 0;
  uint64_t memory_limit_bytes = 0;
  uint64_t disk_limit_bytes = 0;  // 0: nine tenths of the data dir's free space (OfferedDiskBytes)
  uint64_t release_after_blocks = 100;
  bool keep_final_states = false;
  node::Adversary adversary = node::Adversary::kNone;  // testing only
  // Testing only: after committing this many units, the node kills itself with SIGKILL at the
  // first checkpoint of its next unit (a crash mid-unit at a reproducible point); -1: never.
  int64_t crash_in_unit = -1;
  double whistleblower_sample = 0.2;
  int64_t verification_poll_ms = 1000;
  bool have_capabilities = false;
  ledger::NodeCapabilities capabilities;
  uint32_t latency_ms = 5;
  uint64_t bandwidth_bytes_per_s = 100'000'000;
};

// `listen`: "host:port" (net::ParseHostPort), or "host:0": the server binds a free port.
Status ParseListen(const std::string& listen, std::string* host, uint16_t* port) {
  const size_t start = listen.rfind("http://", 0) == 0 ? 7 : 0;  // as ParseHostPort
  const size_t colon = listen.rfind(':');
  if (colon != std::string::npos && colon > start &&
      listen.compare(colon + 1, std::string::npos, "0") == 0) {
    *host = listen.substr(start, colon - start);
    *port = 0;
    return Status::Ok();
  }
  return net::ParseHostPort(listen, host, port);
}

Result<NodeConfig> LoadNodeConfig(const std::string& path) {
  Env* env = Env::Default();
  if (!env->FileExists(path)) {
    return NotFound(path + " does not exist; write one (see `meshlearn node --help` for an "
                           "example) or pass --config PATH");
  }
  ML_ASSIGN_OR_RETURN(ConfigFile c, ConfigFile::Load(env, path));
  ML_RETURN_IF_ERROR(c.CheckKnownKeys({"data_dir", "rpc", "listen", "endpoint", "roles", "price",
                                       "stake", "heartbeat_blocks", "blob_quota_bytes",
                                       "speed_factor", "max_units", "memory_limit_bytes",
                                       "disk_limit_bytes", "release_after_blocks", "keep_final_states",
                                       "adversary", "crash_in_unit", "whistleblower_sample",
                                       "verification_poll_ms", "capabilities"}));
  NodeConfig n;
  n.path = path;
  ML_ASSIGN_OR_RETURN(n.data_dir, c.GetString("data_dir"));
  if (n.data_dir.empty()) return c.Error("data_dir", "is empty; name a directory for keys, blobs and progress");
  n.data_dir = ResolveInFile(path, n.data_dir);  // relative to node.toml's folder (docs/paths.md)
  ML_ASSIGN_OR_RETURN(n.rpc, c.GetString("rpc", n.rpc));
  ML_ASSIGN_OR_RETURN(n.listen, c.GetString("listen", n.listen));
  uint16_t listen_port = 0;
  std::string listen_host;
  {
    Status s = ParseListen(n.listen, &listen_host, &listen_port);
    if (!s.ok()) return c.Error("listen", "must be \"host:port\" (e.g. \"0.0.0.0:7801\"): " + s.message());
  }
  ML_ASSIGN_OR_RETURN(n.endpoint, c.GetString("endpoint", ""));
  if (listen_port == 0) {
    // Port 0: the server picks a free port when it starts; what peers dial is derived from it.
    if (!n.endpoint.empty()) {
      return c.Error("endpoint", "is \"" + n.endpoint + "\" while listen = \"" + n.listen +
                                     "\" takes whatever port is free when the node starts: the "
                                     "advertised port could not be the bound one. Remove endpoint "
                                     "(the node then announces the address it bound), or give "
                                     "listen a fixed port");
    }
    n.endpoint_from_bound = true;
  }
  if (n.endpoint.empty()) n.endpoint = n.listen;
  if (n.endpoint_from_bound && listen_host == "0.0.0.0") {
    return c.Error("listen", "is \"" + n.listen + "\": with port 0 the endpoint peers dial is "
                             "the bound address, and 0.0.0.0 cannot be dialed; listen on this "
                             "machine's address (e.g. \"127.0.0.1:0\"), or give listen a fixed "
                             "port and set endpoint");
  }
  if (!n.endpoint_from_bound) {
    std::string host;
    uint16_t port = 0;
    if (!net::ParseHostPort(n.endpoint, &host, &port).ok()) {
      return c.Error("endpoint", "must be \"host:port\" that other nodes can dial, e.g. \"203.0.113.5:7801\"");
    }
    if (host == "0.0.0.0") {
      return c.Error("endpoint", "is 0.0.0.0, which peers cannot dial; set endpoint to this machine's address");
    }
  }
  ML_ASSIGN_OR_RETURN(std::string roles, c.GetString("roles", "solver,aggregator"));
  Result<uint32_t> r = ledger::ParseRoles(roles);
  if (!r.ok()) return c.Error("roles", "is not valid: " + r.status().message());
  n.roles = *r;
  ML_ASSIGN_OR_RETURN(int64_t price, c.GetInt("price", 1, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t stake, c.GetInt("stake", 1000, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t hb, c.GetInt("heartbeat_blocks", 5, {.min = 1, .max = 100000}));
  ML_ASSIGN_OR_RETURN(int64_t quota, c.GetInt("blob_quota_bytes", int64_t{10} << 30, {.min = 1 << 20}));
  ML_ASSIGN_OR_RETURN(n.speed_factor, c.GetDouble("speed_factor", 1.0, {.min = 0, .max = 1, .min_exclusive = true}));
  ML_ASSIGN_OR_RETURN(int64_t max_units, c.GetInt("max_units", 0, {.min = 0, .max = 1 << 30}));
  n.price = static_cast<uint64_t>(price);
  n.stake = static_cast<uint64_t>(stake);
  n.heartbeat_blocks = static_cast<uint64_t>(hb);
  n.blob_quota_bytes = static_cast<uint64_t>(quota);
  n.max_units = static_cast<uint32_t>(max_units);
  ML_ASSIGN_OR_RETURN(int64_t mem_limit, c.GetInt("memory_limit_bytes", 0, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t disk_limit, c.GetInt("disk_limit_bytes", 0, {.min = 0}));
  ML_ASSIGN_OR_RETURN(int64_t release, c.GetInt("release_after_blocks", 100, {.min = 0}));
  ML_ASSIGN_OR_RETURN(n.keep_final_states, c.GetBool("keep_final_states", false));
  {
    ML_ASSIGN_OR_RETURN(std::string adv, c.GetString("adversary", ""));
    Result<node::Adversary> parsed = node::ParseAdversary(adv);
    if (!parsed.ok()) {
      return c.Error("adversary", "must be one of " + node::AdversaryChoices() +
                                      " (testing only; leave it out for an honest node), got \"" +
                                      adv + "\"");
    }
    n.adversary = *parsed;
  }
  ML_ASSIGN_OR_RETURN(n.crash_in_unit, c.GetInt("crash_in_unit", -1, {.min = -1, .max = 1 << 30}));
  ML_ASSIGN_OR_RETURN(n.whistleblower_sample,
                      c.GetDouble("whistleblower_sample", 0.2, {.min = 0, .max = 1}));
  ML_ASSIGN_OR_RETURN(n.verification_poll_ms,
                      c.GetInt("verification_poll_ms", 1000, {.min = 0, .max = 3'600'000}));
  n.memory_limit_bytes = static_cast<uint64_t>(mem_limit);
  n.disk_limit_bytes = static_cast<uint64_t>(disk_limit);
  n.release_after_blocks = static_cast<uint64_t>(release);
  if (c.Has("capabilities")) {
    ML_ASSIGN_OR_RETURN(ConfigFile caps, c.GetTable("capabilities"));
    ML_RETURN_IF_ERROR(caps.CheckKnownKeys(
        {"throughput", "memory_bytes", "cores", "latency_ms", "bandwidth_bytes_per_s", "accelerator"}));
    ML_ASSIGN_OR_RETURN(int64_t tp, caps.GetInt("throughput", 0, {.min = 0}));
    ML_ASSIGN_OR_RETURN(int64_t mem, caps.GetInt("memory_bytes", 0, {.min = 0}));
    ML_ASSIGN_OR_RETURN(int64_t cores, caps.GetInt("cores", 0, {.min = 0, .max = 1 << 20}));
    ML_ASSIGN_OR_RETURN(int64_t lat, caps.GetInt("latency_ms", 5, {.min = 0, .max = 1 << 30}));
    ML_ASSIGN_OR_RETURN(int64_t bw, caps.GetInt("bandwidth_bytes_per_s", 100'000'000, {.min = 1}));
    ML_ASSIGN_OR_RETURN(n.capabilities.accelerator, caps.GetString("accelerator", ""));
    n.latency_ms = static_cast<uint32_t>(lat);
    n.bandwidth_bytes_per_s = static_cast<uint64_t>(bw);
    n.capabilities.throughput = static_cast<uint64_t>(tp);
    n.capabilities.memory_bytes = static_cast<uint64_t>(mem);
    n.capabilities.cores = static_cast<uint32_t>(cores);
    n.capabilities.latency_ms = n.latency_ms;
    n.capabilities.bandwidth_bytes_per_s = n.bandwidth_bytes_per_s;
    // Throughput 0 means "measure at start"; a partial table is completed from the machine.
    n.have_capabilities = tp > 0;
  }
  return n;
}

// The node's key: <data_dir>/keys/node.key.json, created on first use. Encrypted with
// $MESHLEARN_PASSPHRASE when set (a daemon cannot prompt). The data dir is a home directory
// (home_layout.h), brought to the current layout here, before any command of `node` uses it.
Result<KeyPair> LoadOrCreateNodeKey(const NodeConfig& c, bool* created) {
  Env* env = Env::Default();
  ML_RETURN_IF_ERROR(env->CreateDirs(c.data_dir, 0700));
  const HomeLayout home(c.data_dir);
  ML_RETURN_IF_ERROR(MigrateHomeLayout(home));
  KeyStore store(env, home.KeysDir());
  const char* pass_env = getenv("MESHLEARN_PASSPHRASE");
  std::string pass = pass_env ? pass_env : "";
  if (store.Info("node").ok()) {
    if (created) *created = false;
    return store.Load("node", pass);
  }
  if (created) *created = true;
  return store.Create("node", pass);
}

Status RunInit(GlobalOptions& g, const NodeArgs& a) {
  ML_ASSIGN_OR_RETURN(NodeConfig c, LoadNodeConfig(a.config));
  bool created = false;
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadOrCreateNodeKey(c, &created));
  json j = {{"node_id", key.public_key().ToHex()}, {"data_dir", c.data_dir},
            {"key_created", created}, {"endpoint", c.endpoint}};
  g.Output(j, [&] {
    std::cout << "node id:  " << key.public_key().ToHex() << (created ? " (new key)" : "")
              << "\ndata dir: " << c.data_dir << "\nendpoint: " << c.endpoint
              << "\nFund this id with enough tokens for its stake (" << c.stake
              << "), then run `meshlearn node run --config " << a.config << "`.\n";
  });
  return Status::Ok();
}

Status RunBench(GlobalOptions& g, const NodeArgs& a) {
  if (!g.json) std::cerr << "benchmarking for " << a.seconds << " s..." << std::endl;
  ML_ASSIGN_OR_RETURN(node::BenchResult b, node::RunStandardBench({.seconds = a.seconds}));
  g.Output(b.ToJson(), [&] {
    std::cout << "throughput: " << b.flops_per_s / 1e9 << " GFLOP/s (" << b.steps << " steps in "
              << b.seconds << " s, MLP 784-256-128-10, batch 64)\nmemory:     "
              << b.memory_bytes / (1 << 20) << " MiB\ncores:      " << b.cores
              << "\n\nFor node.toml:\n[capabilities]\nthroughput = " << b.flops_per_s
              << "\nmemory_bytes = " << b.memory_bytes << "\ncores = " << b.cores
              << "\nlatency_ms = " << b.latency_ms
              << "\nbandwidth_bytes_per_s = " << b.bandwidth_bytes_per_s << "\n";
  });
  return Status::Ok();
}

// GET /metrics of `node run` (docs/operators.md, "Metrics"). The agent is single-threaded: the
// daemon's loop copies what it needs here after every Tick, and scrapes (server threads) read the
// copy, the blob store (thread-safe) and the HTTP server's counters.
class NodeMetrics {
 public:
  void AfterTick(const node::TickReport& r, double seconds, const node::AgentStats& stats) {
    // A Tick runs at most one unit or one aggregation (agent.h); its time is that work's time.
    if (r.units_run > 0) unit_seconds_.Observe(seconds / r.units_run);
    if (r.aggregations_run > 0) aggregation_seconds_.Observe(seconds / r.aggregations_run);
    if (r.verifications_run > 0) verification_seconds_.Observe(seconds / r.verifications_run);
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = stats;
    height_ = r.height;
    ++ticks_;
  }
  void TickFailed() {
    std::lock_guard<std::mutex> lock(mu_);
    ++tick_failures_;
  }

  std::string Text(net::BlobStore* store, const net::HttpGateStats& http) const {
    node::AgentStats st;
    uint64_t height = 0, ticks = 0, failures = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = stats_;
      height = height_;
      ticks = ticks_;
      failures = tick_failures_;
    }
    PrometheusText out;
    out.Family("meshlearn_node_chain_height", "gauge", "Height the node last acted on.")
        .Sample("meshlearn_node_chain_height", {}, height);
    out.Family("meshlearn_node_ticks_total", "counter", "Agent ticks, by outcome.")
        .Sample("meshlearn_node_ticks_total", {{"outcome", "ok"}}, ticks)
        .Sample("meshlearn_node_ticks_total", {{"outcome", "error"}}, failures);
    out.Family("meshlearn_node_work_total", "counter", "Work this node did, by kind.");
    for (const auto& [kind, n] : std::initializer_list<std::pair<const char*, uint64_t>>{
             {"units_completed", st.units_completed},
             {"units_resumed", st.units_resumed},
             {"units_paused", st.units_paused},
             {"units_refused_memory", st.units_refused},
             {"commits_ok", st.commits_ok},
             {"commits_failed", st.commits_failed},
             {"aggregations", st.aggregations},
             {"aggregations_ok", st.aggregations_ok},
             {"forced_errors", st.forced_errors},
             {"segment_replays", st.replays},
             {"verdicts_committed", st.verdicts_committed},
             {"verdicts_mismatch", st.mismatches},
             {"challenges", st.challenges},
             {"dispute_posts", st.dispute_posts},
             {"results_checked", st.results_checked},
             {"results_proven", st.results_proven},
             {"whole_models_built", st.whole_models_built},
             {"transactions_failed", st.tx_failed}}) {
      out.Sample("meshlearn_node_work_total", {{"kind", kind}}, n);
    }
    out.Family("meshlearn_node_stage_bytes_sent_total", "counter",
               "Tensor bytes this node's pipeline stages sent to their neighbours.")
        .Sample("meshlearn_node_stage_bytes_sent_total", {}, st.stage_bytes_sent);
    out.Family("meshlearn_node_stage_seconds_total", "counter",
               "Time this node's pipeline stage units ran, and the part of it they waited for a "
               "neighbour's tensor (the pipeline's bubble).")
        .Sample("meshlearn_node_stage_seconds_total", {{"kind", "running"}},
                static_cast<double>(st.stage_run_us) / 1e6)
        .Sample("meshlearn_node_stage_seconds_total", {{"kind", "waiting"}},
                static_cast<double>(st.stage_wait_us) / 1e6);
    out.Family("meshlearn_node_stage_evidence_bytes", "gauge",
               "Bytes this node serves of its pipeline stage steps for their verifiers (a "
               "checkpoint file and the tensors received and sent a step, on disk), until their "
               "rounds are final.")
        .Sample("meshlearn_node_stage_evidence_bytes", {}, st.stage_evidence_bytes);
    out.Family("meshlearn_node_whole_model_moments_bytes", "gauge",
               "Optimizer moment bytes this node's whole-model trainer holds after its last "
               "aggregation (0 on a pipeline task: its aggregator builds no trainer).")
        .Sample("meshlearn_node_whole_model_moments_bytes", {}, st.whole_model_moments_bytes);
    out.Family("meshlearn_node_whole_model_gradient_bytes", "gauge",
               "Gradient bytes this node's whole-model trainer holds after its last aggregation "
               "(0 on a pipeline task: its aggregator evaluates with the weights alone).")
        .Sample("meshlearn_node_whole_model_gradient_bytes", {}, st.whole_model_gradient_bytes);
    out.Family("meshlearn_node_work_seconds", "histogram",
               "Time of the agent tick that ran a unit, an aggregation or a verification.");
    unit_seconds_.Write(out, "meshlearn_node_work_seconds", {{"kind", "unit"}});
    aggregation_seconds_.Write(out, "meshlearn_node_work_seconds", {{"kind", "aggregation"}});
    verification_seconds_.Write(out, "meshlearn_node_work_seconds", {{"kind", "verification"}});
    const net::BlobStoreStats b = store->stats();
    out.Family("meshlearn_node_blob_store_bytes", "gauge", "Blob store usage and quota.")
        .Sample("meshlearn_node_blob_store_bytes", {{"kind", "used"}}, b.used_bytes)
        .Sample("meshlearn_node_blob_store_bytes", {{"kind", "quota"}}, b.quota_bytes);
    out.Family("meshlearn_node_blobs", "gauge", "Complete blobs held.")
        .Sample("meshlearn_node_blobs", {}, b.complete_blobs);
    out.Family("meshlearn_node_blobs_evicted_total", "counter", "Blobs evicted (LRU) since start.")
        .Sample("meshlearn_node_blobs_evicted_total", {}, b.evicted_blobs);
    out.Family("meshlearn_node_http_connections", "gauge", "Open connections to the blob server.")
        .Sample("meshlearn_node_http_connections", {}, static_cast<uint64_t>(http.connections));
    out.Family("meshlearn_node_http_requests_total", "counter",
               "Requests to the blob server: handled, or refused (too large, busy, timed out).")
        .Sample("meshlearn_node_http_requests_total", {{"outcome", "handled"}}, http.requests)
        .Sample("meshlearn_node_http_requests_total", {{"outcome", "too_large"}},
                http.refused_too_large)
        .Sample("meshlearn_node_http_requests_total", {{"outcome", "busy"}}, http.refused_busy)
        .Sample("meshlearn_node_http_requests_total", {{"outcome", "timed_out"}}, http.timed_out);
    return out.text();
  }

 private:
  static std::vector<double> Bounds() { return {0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}; }
  mutable std::mutex mu_;
  node::AgentStats stats_;
  uint64_t height_ = 0, ticks_ = 0, tick_failures_ = 0;
  Histogram unit_seconds_{Bounds()}, aggregation_seconds_{Bounds()}, verification_seconds_{Bounds()};
};

Status RunDaemon(GlobalOptions& g, const NodeArgs& a) {
  (void)g;
  // Every allocation of 1 MiB or more (tensors, blobs, decoded states) gets pages of its own,
  // returned to the system when freed. glibc's default raises this threshold to the size of the
  // largest block freed so far (up to 32 MiB), after which a stage unit's tensors came from heaps
  // that kept their pages: each unit a node ran stacked on the last one's memory (a stage node of
  // the 10M GPT pipeline devnet peaked at 540-720 MB; with this, 265-425 MB: docs/submitters.md).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ML_ASSIGN_OR_RETURN(NodeConfig c, LoadNodeConfig(a.config));
  bool created = false;
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadOrCreateNodeKey(c, &created));
  ML_LOG_INFO("node {} ({}), data dir {}", key.public_key().ToHex(), created ? "new key" : "key loaded",
              c.data_dir);
  // The disk it offers to stage files, checked against what the data dir has free before
  // anything else runs (the data dir exists: the key is in it). The stage files an earlier process
  // left are deleted first (the agent would delete them at its start: StageEvidence::
  // DeleteLeftovers), so a restart measures the disk it will have, and a limit that fitted before
  // a crash still fits.
  ML_RETURN_IF_ERROR(node::StageEvidence(Env::Default(), HomeLayout(c.data_dir).StageEvidenceDir())
                         .DeleteLeftovers());
  const bool disk_flag = a.disk_limit.has_value();
  ML_ASSIGN_OR_RETURN(const uint64_t free_disk, node::FreeDiskBytes(c.data_dir));
  ML_ASSIGN_OR_RETURN(
      const uint64_t disk,
      node::OfferedDiskBytes(a.disk_limit.value_or(c.disk_limit_bytes), free_disk, c.data_dir,
                             disk_flag ? "--disk-limit" : "disk_limit_bytes (" + c.path + ")"));
  ML_LOG_INFO("disk for stage files: {} MiB of the {} MiB free in {} ({})", disk >> 20,
              free_disk >> 20, c.data_dir,
              disk_flag ? "--disk-limit"
                        : (c.disk_limit_bytes != 0 ? "disk_limit_bytes" : "nine tenths of it"));
  ledger::NodeCapabilities caps = c.capabilities;
  if (!c.have_capabilities) {
    ML_LOG_INFO("no [capabilities] in {}: running the standard benchmark (`meshlearn node bench`)", c.path);
    ML_ASSIGN_OR_RETURN(node::BenchResult b,
                        node::RunStandardBench({.seconds = 2.0,
                                                .latency_ms = c.latency_ms,
                                                .bandwidth_bytes_per_s = c.bandwidth_bytes_per_s}));
    ledger::NodeCapabilities measured = b.ToCapabilities();
    if (caps.memory_bytes != 0) measured.memory_bytes = caps.memory_bytes;
    if (caps.cores != 0) measured.cores = caps.cores;
    measured.accelerator = caps.accelerator;
    caps = measured;
    ML_LOG_INFO("benchmark: {:.2f} GFLOP/s, {} MiB, {} cores", caps.throughput / 1e9,
                caps.memory_bytes >> 20, caps.cores);
  } else {
    // A table that gives the throughput but not memory_bytes or cores: this machine's.
    if (caps.memory_bytes == 0) caps.memory_bytes = node::PhysicalMemoryBytes();
    if (caps.cores == 0) caps.cores = node::OnlineCores();
  }
  caps.disk_bytes = disk;
  Env* env = Env::Default();
  ML_ASSIGN_OR_RETURN(std::unique_ptr<net::BlobStore> store,
                      net::BlobStore::Open(env, HomeLayout(c.data_dir).BlobsDir(),
                                           {.quota_bytes = c.blob_quota_bytes}));
  node::HttpChainClient chain(c.rpc, {.read_timeout_ms = 15000});
  net::HttpTransport transport;
  std::atomic<bool> stop{false};

  node::AgentOptions opts;
  opts.data_dir = c.data_dir;
  opts.endpoint = c.endpoint;
  opts.roles = c.roles;
  opts.capabilities = caps;
  opts.price = c.price;
  opts.stake = c.stake;
  opts.heartbeat_every_blocks = c.heartbeat_blocks;
  opts.speed_factor = c.speed_factor;
  opts.sleep = [](int64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); };
  opts.max_units = c.max_units;
  opts.log = [](const std::string& line) { ML_LOG_INFO("{}", line); };
  opts.should_stop = [&stop] { return stop.load(); };
  opts.rejoin = a.rejoin;
  opts.memory_limit_bytes = c.memory_limit_bytes;
  opts.release_after_blocks = c.release_after_blocks;
  opts.keep_final_states = c.keep_final_states;
  opts.adversary = c.adversary;
  opts.whistleblower_sample = c.whistleblower_sample;
  opts.verification_poll_ms = c.verification_poll_ms;
  if (c.crash_in_unit >= 0) {
    // Units are told apart by (task, index); the (crash_in_unit + 1)-th one dies at its first
    // checkpoint, before its commit: the unit stays assigned until its deadline.
    auto seen = std::make_shared<std::set<std::pair<Hash256, uint32_t>>>();
    opts.after_checkpoint = [seen, n = c.crash_in_unit](const Hash256& task, uint32_t index,
                                                        int64_t) -> Status {
      seen->insert({task, index});
      if (static_cast<int64_t>(seen->size()) > n) {
        ML_LOG_WARN("crash_in_unit = {}: killing this node (SIGKILL) mid-unit, as configured", n);
        raise(SIGKILL);
      }
      return Status::Ok();
    };
  }
  node::NodeAgent agent({.env = env,
                         .clock = SystemClock::Default(),
                         .transport = &transport,
                         .store = store.get(),
                         .chain = &chain,
                         .key = key},
                        opts);
  net::Router router;
  if (!agent.init_status().ok()) return agent.init_status();
  agent.RegisterServices(&router);

  sigset_t stop_signals = BlockSignalsForSigwait({SIGINT, SIGTERM});
  NodeMetrics metrics;
  net::HttpServer* server_ptr = nullptr;
  net::HttpServerOptions server_options;
  server_options.metrics = [&metrics, &server_ptr, &store] {
    return metrics.Text(store.get(), server_ptr ? server_ptr->gate_stats() : net::HttpGateStats{});
  };
  net::HttpServer server(&router, server_options);
  server_ptr = &server;
  std::string host;
  uint16_t port = 0;
  ML_RETURN_IF_ERROR(ParseListen(c.listen, &host, &port));
  Result<uint16_t> bound = server.Start(host, port);
  if (!bound.ok()) {
    return bound.status().WithPrefix("cannot serve blobs on listen = \"" + c.listen + "\" (" +
                                     c.path + "); is the port in use?");
  }
  if (c.endpoint_from_bound) {
    c.endpoint = host + ":" + std::to_string(*bound);
    agent.set_endpoint(c.endpoint);
  }
  ML_LOG_INFO("serving blobs on {}:{} (metrics at http://{}:{}/metrics), advertised as {}; ledger {}",
              host, *bound, host, *bound, c.endpoint, c.rpc);
  {
    // After the bind, so a parent that reads it (cmd_devnet.cc) finds the port listening.
    const json where = {{"pid", static_cast<int64_t>(getpid())},
                        {"listen", host + ":" + std::to_string(*bound)},
                        {"endpoint", c.endpoint}};
    ML_RETURN_IF_ERROR(env->WriteFileAtomic(NodeListenFile(c.data_dir), where.dump() + "\n"));
  }

  Status loop_status;
  std::atomic<bool> self_stop{false};
  auto stop_self = [&](Status why) {
    loop_status = std::move(why);
    self_stop.store(true);
    kill(getpid(), SIGTERM);  // wakes sigwait below
  };
  std::thread loop([&] {
    uint64_t failures = 0;
    while (!stop.load()) {
      const auto tick_start = std::chrono::steady_clock::now();
      Result<node::TickReport> r = agent.Tick();
      if (r.ok()) {
        metrics.AfterTick(*r,
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - tick_start).count(),
                          agent.stats());
      } else {
        metrics.TickFailed();
      }
      if (stop.load()) break;
      if (agent.left()) {
        if (!agent.was_active()) {
          // Started on a node that had left: nothing to do. Say how to come back.
          stop_self(FailedPrecondition(
              "node " + key.public_key().ToHex() + " has left the network (meshlearn node leave); "
              "it takes no work. To rejoin, run `meshlearn node run --config " + a.config +
              " --rejoin` (RegisterNode again, bonding stake = " + std::to_string(c.stake) +
              " from the node's account)"));
          break;
        }
        if (agent.tx_sender().in_flight() == 0) {
          ML_LOG_INFO("the node left the network (meshlearn node leave) and has no transaction "
                      "in flight: stopping");
          stop_self(Status::Ok());
          break;
        }
      }
      if (!r.ok()) {
        ++failures;
        ML_LOG_WARN("tick: {} (retrying)", r.status().ToString());
        for (int i = 0; i < 20 && !stop.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(std::min<uint64_t>(100 * failures, 100)));
        }
        continue;
      }
      failures = 0;
      if (r->busy) continue;
      Result<uint64_t> h = node::WaitForBlockAbove(chain, r->height, 2000);
      if (!h.ok()) {
        ML_LOG_WARN("waiting for a block: {}", h.status().ToString());
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
  });
  int sig = 0;
  sigwait(&stop_signals, &sig);
  if (!self_stop.load()) {
    ML_LOG_INFO("signal {}: stopping (a unit in progress resumes from its last checkpoint)", sig);
  }
  stop.store(true);
  loop.join();
  server.Stop();
  ML_LOG_INFO("stopped; units completed {}, aggregations {}", agent.stats().units_completed,
              agent.stats().aggregations);
  return loop_status;
}

Status RunLeave(GlobalOptions& g, const NodeArgs& a) {
  ML_ASSIGN_OR_RETURN(NodeConfig c, LoadNodeConfig(a.config));
  ML_ASSIGN_OR_RETURN(KeyPair key, LoadOrCreateNodeKey(c, nullptr));
  node::HttpChainClient chain(c.rpc);
  const HomeLayout home(c.data_dir);
  ML_RETURN_IF_ERROR(Env::Default()->CreateDirs(home.OutboxDir(), 0700));
  node::TxSender tx(&chain, key, {.env = Env::Default(), .outbox_path = home.NodeLeaveJournal()});
  ML_RETURN_IF_ERROR(tx.Init());
  ML_ASSIGN_OR_RETURN(
      node::TxOutcome o,
      tx.SendAndWait(ledger::LeaveNodeTx{.node_id = key.public_key()}, 60000,
                     [](int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }));
  // The ledger's reasons already name the transaction ("leave node: node ... already left").
  if (!o.ok) return FailedPrecondition(WithContext("leave node", o.reason));
  json j = {{"node_id", key.public_key().ToHex()}, {"tx_id", o.id.ToHex()}, {"height", o.height}};
  g.Output(j, [&] {
    std::cout << "node " << key.public_key().ToHex() << " left in block " << o.height
              << "; its stake is unbonding (withdraw it later with `meshlearn --home " << c.data_dir << " wallet withdraw --key node`).\n"
              << "Stop the daemon (SIGTERM) once its units in flight are committed.\n";
  });
  return Status::Ok();
}

void AddNode(CLI::App& root, GlobalOptions& g) {
  static NodeArgs a;
  CLI::App* n = root.add_subcommand("node", "Run a training node: bench, run, leave");
  n->require_subcommand(1);
  n->footer(
      "Examples:\n"
      "  meshlearn node bench                        # measure this machine\n"
      "  meshlearn node init --config node.toml      # create the node key, print its id\n"
      "  meshlearn node run --config node.toml       # register, heartbeat, train, aggregate\n"
      "  meshlearn node leave --config node.toml     # unregister, start unbonding the stake\n"
      "\nnode.toml:\n"
      "  data_dir = \"~/.meshlearn/node\"     # keys, blobs, unit progress (crash-safe)\n"
      "  rpc = \"http://127.0.0.1:7700\"     # the ledger\n"
      "  listen = \"127.0.0.1:7801\"         # blob server\n"
      "  endpoint = \"\"                     # what peers dial; default = listen\n"
      "                                    # (listen port 0: a free port; endpoint left unset)\n"
      "  roles = \"solver,aggregator\"       # also verifier, whistleblower\n"
      "  price = 1                         # tokens per 10^9 training FLOPs\n"
      "  stake = 1000                      # bonded at registration\n"
      "  heartbeat_blocks = 5\n"
      "  blob_quota_bytes = 10737418240     # unpinned blobs are evicted LRU beyond this\n"
      "  release_after_blocks = 100        # unpin a closed task's blobs this many blocks later\n"
      "  keep_final_states = false         # ... but keep final models this node holds\n"
      "  memory_limit_bytes = 0            # memory really available to a unit (0: capabilities)\n"
      "  disk_limit_bytes = 0              # disk for pipeline stage files (0: 9/10 of the free)\n"
      "  speed_factor = 1.0                # < 1: a deliberately slow node (tests, demos)\n"
      "  whistleblower_sample = 0.2        # whistleblower: share of settled units re-checked\n"
      "  verification_poll_ms = 1000       # while training: look for due replays this often\n"
      "  # crash_in_unit = 2                # testing only: kill -9 itself mid-unit after 2 units\n"
      "  # adversary = \"lazy\"              # testing only: lazy|noisy|wrong_data|copy|stale|\n"
      "                                    #   wrong_result (honest training, negated delta)|\n"
      "                                    #   noisy_last|targeted (poison one segment)|\n"
      "                                    #   wrong_example (one step's batch forged)|\n"
      "                                    #   rubber_stamp (a verifier that never replays)\n"
      "  [capabilities]                    # optional: paste `node bench`; measured if absent\n"
      "  throughput = 20000000000\n"
      "  memory_bytes = 17179869184\n");

  CLI::App* bench = n->add_subcommand("bench", "Measure training throughput, memory and cores");
  bench->add_option("--seconds", a.seconds, "How long to measure")->capture_default_str();
  bench->footer("Examples:\n  meshlearn node bench\n  meshlearn --json node bench --seconds 5");
  bench->callback([&g] { g.Exit(RunBench(g, a)); });

  CLI::App* init = n->add_subcommand("init", "Create the node's data dir and key; print its id");
  init->add_option("--config", a.config, "node.toml")->capture_default_str();
  init->footer("Examples:\n  meshlearn node init --config node.toml\n  meshlearn --json node init --config n1/node.toml");
  init->callback([&g] { g.Exit(RunInit(g, a)); });

  CLI::App* run = n->add_subcommand("run", "Run the node daemon until SIGTERM or Ctrl-C");
  run->add_option("--config", a.config, "node.toml")->capture_default_str();
  run->add_flag("--rejoin", a.rejoin,
                "If the node left the network (node leave), register it again (bonds `stake` anew)");
  run->add_option("--disk-limit", a.disk_limit,
                  "Bytes of disk offered to pipeline stage files (replaces node.toml's "
                  "disk_limit_bytes; at most the data dir's free space; 0: nine tenths of it)");
  run->footer(
      "Examples:\n  meshlearn node run --config node.toml\n"
      "It registers the node if needed, heartbeats, trains the units assigned to it (with a\n"
      "checkpoint every k steps: killed, it resumes there), aggregates rounds it is assigned and\n"
      "serves blobs to other nodes. SIGTERM/SIGINT stop it cleanly.\n"
      "It declares the disk it offers to pipeline stage files (--disk-limit, disk_limit_bytes;\n"
      "default nine tenths of the data dir's free space): a limit above the free space is an\n"
      "error, and the ledger places a stage only where the disk holds its files.\n"
      "A node that left (node leave) exits with an error unless started with --rejoin.");
  run->callback([&g] { g.Exit(RunDaemon(g, a)); });

  CLI::App* leave = n->add_subcommand("leave", "Unregister the node and start unbonding its stake");
  leave->add_option("--config", a.config, "node.toml")->capture_default_str();
  leave->footer("Examples:\n  meshlearn node leave --config node.toml");
  leave->callback([&g] { g.Exit(RunLeave(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(45, AddNode);

}  // namespace meshlearn::cli
