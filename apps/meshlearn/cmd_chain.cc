// meshlearn chain init|serve|follow|status: run the ledger (the app-chain) and look at it.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/log.h"
#include "meshlearn/cli.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/cluster.h"
#include "meshlearn/ledger/etcd.h"
#include "meshlearn/ledger/follower.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/rpc_client.h"
#include "meshlearn/ledger/rpc_server.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

namespace meshlearn::cli {
namespace {

using ledger::Chain;
using ledger::Genesis;
using nlohmann::json;

struct ChainArgs {
  std::string dir;
  std::string chain_id = "meshlearn-devnet";
  int64_t block_interval_ms = 1000;
  std::vector<std::string> fund;
  bool faucet = false;
  bool devnet = false;
  std::string listen = "127.0.0.1:7700";
  std::string follow_listen = "127.0.0.1:7701";
  std::string rpc;
  std::string url;
  std::string sequencer;
  std::string genesis_hash;
  // init: the candidate keys of a replicated chain.
  int sequencers = 1;
  // serve: etcd endpoints (--cluster), the key of DIR/keys that signs, the URL other candidates
  // name, the leader's lease.
  std::string cluster;
  std::string key_name = ledger::kSequencerKeyName;
  std::string advertise;
  int64_t lease_ttl_s = 2;
  double rate_limit = 200;
  // Room for the largest transaction, a RefereeStep or ProveResult witness, as hex in JSON.
  size_t max_body = ledger::RpcLimits{}.max_body_bytes;
};

using ledger::ChainKeysDir;
std::string GenesisPath(const std::string& dir) { return ledger::ChainGenesisPath(dir); }
std::string DbPath(const std::string& dir) { return ledger::ChainDbPath(dir); }

// "alice" (a key in the key store) or 64 hex digits.
Result<PublicKey> ResolveKey(const std::string& who, const GlobalOptions& g, std::string_view what) {
  if (who.size() == 2 * PublicKey::kSize) {
    Result<PublicKey> k = PublicKey::FromHex(who, what);
    if (k.ok()) return k;
  }
  KeyStore store(Env::Default(), g.KeysDir());
  Result<KeyInfo> info = store.Info(who);
  if (!info.ok()) {
    return InvalidArgument(std::string(what) + " '" + who +
                           "' is neither a public key (64 hex digits) nor a key in " +
                           store.dir() + " (see `meshlearn keys list`)");
  }
  return info->public_key;
}

// Runs `f`, turning an exception (a malformed answer from `url` that a decoder did not check)
// into an error.
Status Guarded(const std::string& url, const std::function<Status()>& f) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss("the ledger at " + url + " gave a malformed answer: " + e.what());
  } catch (const std::exception& e) {
    return Internal("following " + url + ": " + e.what());
  }
}

// The signals the serving commands wait for: SIGINT and SIGTERM stop; SIGUSR1 is a worker thread
// asking the main thread to wake up.
sigset_t BlockStopSignals() { return BlockSignalsForSigwait({SIGINT, SIGTERM, SIGUSR1}); }

Status RunInit(GlobalOptions& g, ChainArgs& a) {
  Genesis gen = a.devnet ? ledger::DevnetGenesis({}, 0, a.chain_id) : Genesis{};
  gen.chain_id = a.chain_id;
  gen.block_interval_ms = a.block_interval_ms;
  gen.genesis_time_ms = SystemClock::Default()->NowMillis();
  gen.faucet = a.faucet || a.devnet;
  for (const std::string& f : a.fund) {
    size_t eq = f.rfind('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--fund '" + f + "' is not KEY=AMOUNT (e.g. --fund alice=1000000)");
    }
    ML_ASSIGN_OR_RETURN(uint64_t amount,
                        ParseUnsigned(std::string_view(f).substr(eq + 1), "--fund " + f.substr(0, eq) + "=AMOUNT"));
    ML_ASSIGN_OR_RETURN(PublicKey key, ResolveKey(f.substr(0, eq), g, "--fund"));
    gen.accounts.push_back({key, amount});
  }
  // The sequencer's key lives with the chain, unencrypted (the service starts unattended);
  // the directory is 0700 and the key file 0600. Both appear at once, or neither
  // (CreateChainDir): concurrent inits of one --dir cannot mix their genesis and key.
  const KeyPair seq = KeyPair::Generate();
  gen.sequencer = seq.public_key();
  std::vector<KeyPair> candidates;  // a replicated chain's other candidates
  if (a.sequencers > 1) {
    gen.sequencers.push_back(seq.public_key());
    for (int i = 1; i < a.sequencers; ++i) {
      candidates.push_back(KeyPair::Generate());
      gen.sequencers.push_back(candidates.back().public_key());
    }
  }
  ML_RETURN_IF_ERROR(ledger::CreateChainDir(a.dir, gen, seq, candidates));
  KeyStore keys(Env::Default(), ChainKeysDir(a.dir));
  json candidate_keys = json::array();
  for (int i = 0; i < static_cast<int>(gen.sequencers.size()); ++i) {
    candidate_keys.push_back({{"name", ledger::CandidateKeyName(i)},
                              {"key", gen.sequencers[i].ToHex()},
                              {"path", keys.PathOf(ledger::CandidateKeyName(i))}});
  }
  std::string hash = ledger::GenesisHash(gen).ToHex();
  json j = {{"dir", a.dir},
            {"genesis", GenesisPath(a.dir)},
            {"genesis_hash", hash},
            {"chain_id", gen.chain_id},
            {"sequencer", gen.sequencer.ToHex()},
            {"sequencer_key", keys.PathOf("sequencer")},
            {"faucet", gen.faucet},
            {"accounts", gen.accounts.size()},
            {"sequencers", candidate_keys}};
  g.Output(j, [&] {
    std::cout << "initialised chain '" << gen.chain_id << "' in " << a.dir << "\n"
              << "genesis:       " << GenesisPath(a.dir) << " (hash " << hash << ")\n"
              << "sequencer key: " << keys.PathOf("sequencer") << " ("
              << gen.sequencer.ShortHex() << "...)\n"
              << "block every " << gen.block_interval_ms << " ms; " << gen.accounts.size()
              << " funded account(s); faucet " << (gen.faucet ? "on" : "off") << "\n"
              << "next: meshlearn chain serve --dir " << a.dir << " --listen 127.0.0.1:7700\n";
    if (!candidate_keys.empty()) {
      std::cout << "replicated: " << candidate_keys.size() << " sequencer candidates:\n";
      for (const json& c : candidate_keys) {
        std::cout << "  " << c["name"].get<std::string>() << "  " << c["path"].get<std::string>()
                  << "\n";
      }
      std::cout << "copy " << a.dir << " to each candidate's machine and run there\n"
                << "  meshlearn chain serve --dir " << a.dir
                << " --cluster http://ETCD1:2379,... --key sequencer-N\n"
                << "(docs/operators.md, \"Running a replicated chain\")\n";
    }
  });
  return Status::Ok();
}

Result<Genesis> LoadChainGenesis(const std::string& dir) {
  Env* env = Env::Default();
  if (!env->FileExists(GenesisPath(dir))) {
    return NotFound(GenesisPath(dir) + " does not exist; create a chain with `meshlearn chain "
                    "init --dir " + dir + "` (or follow one with `meshlearn chain follow URL`)");
  }
  return ledger::LoadGenesis(env, GenesisPath(dir));
}

// One sequencer per chain directory: `chain serve` holds an exclusive lock on DIR/serve.lock for
// its life (flock: the kernel drops it when the process ends, so a killed server leaves none
// behind). A second `chain serve` of the directory once started beside the first and failed
// every block it produced on the database's unique height. Returns the lock's descriptor, kept
// open until the process exits; the file holds the holder's pid, named in the refusal.
Result<int> LockChainDir(const std::string& dir) {
  const std::string path = JoinPath(dir, "serve.lock");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return FailedPrecondition("cannot open " + path + ": " + std::strerror(errno) +
                              " (is --dir a chain directory you may write?)");
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK)
      return FailedPrecondition("cannot lock " + path + ": " + std::strerror(err));
    return FailedPrecondition(dir + " is already served by another `meshlearn chain serve` (pid " +
                              std::string(pid, n > 0 ? static_cast<size_t>(n) : 0) + ", holding " +
                              path + "): stop that process first, or serve another --dir");
  }
  const std::string me = std::to_string(getpid());
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    close(fd);
    return FailedPrecondition("cannot write " + path + ": " + std::strerror(errno));
  }
  return fd;
}

Status RunServe(GlobalOptions& g, ChainArgs& a) {
  ML_ASSIGN_OR_RETURN(auto listen, ledger::ParseListenAddress(a.listen));
  ML_ASSIGN_OR_RETURN(Genesis gen, LoadChainGenesis(a.dir));
  KeyStore keys(Env::Default(), ChainKeysDir(a.dir));
  ML_ASSIGN_OR_RETURN(KeyPair key, keys.Load(a.key_name, ""));
  if (!ledger::IsAuthorizedSequencer(gen, key.public_key())) {
    return FailedPrecondition(keys.PathOf(a.key_name) + " (" + key.public_key().ShortHex() +
                              "...) is not a sequencer named in " + GenesisPath(a.dir) +
                              " (sequencer / sequencers); pick the right --key");
  }
  std::vector<std::string> etcd;
  if (!a.cluster.empty()) {
    ML_ASSIGN_OR_RETURN(etcd, ledger::ParseEtcdEndpoints(a.cluster, "--cluster"));
  }
  ML_ASSIGN_OR_RETURN(const int lock_fd, LockChainDir(a.dir));
  (void)lock_fd;  // held until the process exits
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Chain> chain, Chain::Open(DbPath(a.dir), gen));
  sigset_t stop_signals = BlockStopSignals();

  ledger::SharedChain shared(chain.get());
  ledger::Sequencer sequencer(&shared, key, SystemClock::Default());
  std::unique_ptr<ledger::ClusterCandidate> candidate;
  if (!etcd.empty()) {
    candidate = std::make_unique<ledger::ClusterCandidate>(
        &shared, &sequencer,
        ledger::ClusterOptions{.etcd = etcd, .lease_ttl_s = a.lease_ttl_s, .evidence_dir = a.dir});
  }
  ledger::RpcLimits limits;
  limits.max_body_bytes = a.max_body;
  ledger::RpcServiceInfo info{.role = candidate ? "candidate" : "sequencer"};
  if (candidate) {
    // A standby answers reads only once it has applied what etcd holds (cluster.h).
    info.read_barrier = [&candidate] { return candidate->CatchUp(); };
    info.cluster_status = [&candidate] { return candidate->StatusJson(); };
  }
  ledger::RpcService service(&shared, &sequencer, limits, info);
  ledger::RpcServerOptions opts;
  opts.max_body_bytes = a.max_body;
  opts.rate_limit.rate_per_second = a.rate_limit;
  opts.rate_limit.burst = std::max(1.0, 2 * a.rate_limit);
  ledger::RpcServer server(&service, opts);
  ML_RETURN_IF_ERROR(server.Start(listen.first, listen.second));
  sequencer.Start();
  Status cluster_result;
  std::thread cluster_thread;
  if (candidate) {
    candidate->set_advertise_url(a.advertise.empty() ? server.url() : a.advertise);
    cluster_thread = std::thread([&] {
      cluster_result = candidate->Run();
      // A refused block or another history in etcd: stop the process, exit 1 with the reason.
      if (!cluster_result.ok()) kill(getpid(), SIGUSR1);
    });
  }

  // The dashboard is GET / of the same address (ledger/dashboard.h).
  json j = {{"url", server.url()},
            {"dashboard", server.url() + "/"},
            {"chain_id", gen.chain_id},
            {"height", shared.height()},
            {"genesis_hash", chain->genesis_hash().ToHex()},
            {"key", key.public_key().ToHex()}};
  if (candidate) {
    j["cluster"] = {{"etcd", etcd}, {"prefix", ledger::ClusterCandidate::Prefix(gen)}};
  }
  if (g.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << "serving chain '" << gen.chain_id << "' at " << server.url() << " (height "
              << shared.height() << ", a block every " << gen.block_interval_ms
              << " ms); Ctrl-C to stop\ndashboard: " << server.url() << "/" << std::endl;
    if (candidate) {
      std::cout << "sequencer candidate " << key.public_key().ShortHex() << "... on etcd "
                << a.cluster << " (leads when elected)" << std::endl;
    }
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  ML_LOG_INFO("signal {}: stopping", sig);
  if (candidate) {
    candidate->Stop();
    cluster_thread.join();
  }
  server.Stop();
  sequencer.Stop();
  if (!cluster_result.ok()) return cluster_result;
  if (candidate) {
    // What this candidate saw: each time it took over, how long the chain had gone without a
    // block (ms).
    json cs = candidate->StatusJson();
    if (g.json) {
      std::cout << json{{"stopped_at", shared.height()}, {"cluster", cs}}.dump() << std::endl;
    } else {
      std::cout << "led " << cs["takeovers"].size() << " time(s); gaps before taking over (ms):";
      for (const json& t : cs["takeovers"]) std::cout << " " << t["gap_ms"];
      std::cout << std::endl;
    }
  }
  if (!g.json) std::cout << "stopped at height " << shared.height() << std::endl;
  return Status::Ok();
}

Status RunFollow(GlobalOptions& g, ChainArgs& a) {
  Env* env = Env::Default();
  std::optional<std::pair<std::string, int>> listen;
  if (!a.follow_listen.empty()) {
    ML_ASSIGN_OR_RETURN(auto l, ledger::ParseListenAddress(a.follow_listen));
    listen = l;
  }
  ledger::RpcClient upstream(a.url, {.read_timeout_ms = 15000});
  if (!env->FileExists(GenesisPath(a.dir))) {
    // First start: take the genesis from the sequencer. The hash printed here is what an
    // operator compares with the one the network publishes (or pins with --genesis-hash).
    ML_ASSIGN_OR_RETURN(json gj, upstream.Call("get_genesis", json::object()));
    ML_RETURN_IF_ERROR(CheckRpcAnswer(gj, {a.url, "get_genesis"},
                                      {{"toml", JsonKind::kString, true},
                                       {"genesis_hash", JsonKind::kString}}));
    ML_ASSIGN_OR_RETURN(Genesis fetched, ledger::ParseGenesis(gj["toml"].get<std::string>(), a.url));
    std::string hash = ledger::GenesisHash(fetched).ToHex();
    if (!a.genesis_hash.empty() && a.genesis_hash != hash) {
      return FailedPrecondition("the genesis served by " + a.url + " hashes to " + hash +
                                ", not the --genesis-hash " + a.genesis_hash + "; wrong network?");
    }
    ML_RETURN_IF_ERROR(env->CreateDirs(a.dir, 0700));
    ML_RETURN_IF_ERROR(ledger::WriteGenesis(env, GenesisPath(a.dir), fetched));
    if (!g.json) {
      std::cerr << "fetched genesis of chain '" << fetched.chain_id << "' from " << a.url
                << " (hash " << hash << ")" << (a.genesis_hash.empty() ? "; pin it with --genesis-hash" : "")
                << std::endl;
    }
  }
  ML_ASSIGN_OR_RETURN(Genesis gen, LoadChainGenesis(a.dir));
  PublicKey seq = gen.sequencer;
  if (!a.sequencer.empty()) {
    ML_ASSIGN_OR_RETURN(seq, PublicKey::FromHex(a.sequencer, "--sequencer"));
  }
  ML_ASSIGN_OR_RETURN(std::unique_ptr<Chain> chain, Chain::Open(DbPath(a.dir), gen));
  sigset_t stop_signals = BlockStopSignals();
  ledger::SharedChain shared(chain.get());
  ledger::Follower follower(&shared, &upstream, seq,
                            {.long_poll_ms = 5000, .evidence_dir = a.dir});
  ML_RETURN_IF_ERROR(Guarded(a.url, [&] { return follower.CheckUpstream(); }));

  ledger::RpcService service(&shared, nullptr, {}, {.role = "follower", .upstream = a.url});
  ledger::RpcServer server(&service);
  if (listen) ML_RETURN_IF_ERROR(server.Start(listen->first, listen->second));

  Status result;
  std::atomic<bool> done{false};
  std::thread worker([&] {
    // An exception must not end the process from this thread (std::terminate): it is the
    // follower's result, reported by the main thread.
    result = Guarded(a.url, [&] { return follower.Run(); });
    done.store(true);
    kill(getpid(), SIGUSR1);
  });
  if (!g.json) {
    std::cout << "following " << a.url << " (chain '" << gen.chain_id << "', local height "
              << shared.height() << ", upstream " << follower.upstream_height() << ")"
              << (listen ? "; serving reads and the dashboard at " + server.url() + "/"
                         : std::string())
              << std::endl;
  } else {
    std::cout << json{{"following", a.url}, {"url", listen ? server.url() : ""}}.dump()
              << std::endl;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  follower.Stop();
  worker.join();
  if (listen) server.Stop();
  if (!result.ok()) return result;
  if (!g.json) std::cout << "stopped at height " << shared.height() << std::endl;
  return Status::Ok();
}

Status RunStatus(GlobalOptions& g, ChainArgs& a) {
  ledger::RpcClient rpc(ledger::DefaultRpcUrl(a.rpc), {.retries = 1});
  ML_ASSIGN_OR_RETURN(json st, rpc.Call("chain_status", json::object()));
  ML_RETURN_IF_ERROR(CheckRpcAnswer(st, {rpc.url(), "chain_status"},
                                    {{"chain_id", JsonKind::kString, true},
                                     {"role", JsonKind::kString},
                                     {"height", JsonKind::kUnsigned, true},
                                     {"state_hash", JsonKind::kString},
                                     {"last_block_hash", JsonKind::kString},
                                     {"last_block_time_ms", JsonKind::kInteger},
                                     {"genesis_hash", JsonKind::kString},
                                     {"sequencer", JsonKind::kString},
                                     {"mempool", JsonKind::kUnsigned},
                                     {"totals", JsonKind::kObject}}));
  g.Output(st, [&] {
    std::cout << "chain:        " << st.value("chain_id", std::string("?")) << " ("
              << st.value("role", std::string("?"))
              << " at " << rpc.url() << ")\n"
              << "height:       " << st.value("height", uint64_t{0}) << "\n"
              << "state hash:   " << st.value("state_hash", std::string()) << "\n"
              << "last block:   " << st.value("last_block_hash", std::string()) << " at "
              << st.value("last_block_time_ms", int64_t{0}) << " ms\n"
              << "genesis hash: " << st.value("genesis_hash", std::string()) << "\n"
              << "sequencer:    " << st.value("sequencer", std::string()) << "\n";
    if (st.contains("mempool")) std::cout << "mempool:      " << st["mempool"] << " pending\n";
    if (st.contains("totals")) std::cout << "totals:       " << st["totals"].dump() << "\n";
    if (st.contains("cluster") && st["cluster"].is_object()) {
      // A replicated sequencer's candidate: who leads, and what this candidate saw.
      const json& c = st["cluster"];
      const std::string leader = c.value("leader", std::string());
      std::cout << "leader:       "
                << (c.value("leading", false) ? "this candidate"
                    : leader.empty()
                        ? "none (an election is under way)"
                        : leader.substr(0, 16) + "... at " + c.value("leader_url", std::string()))
                << "\n"
                << "takeovers:    " << c.value("takeover_count", uint64_t{0})
                << " by this candidate";
      if (c.contains("takeovers") && c["takeovers"].is_array() && !c["takeovers"].empty()) {
        std::cout << " (gap without a block, ms:";
        for (const json& t : c["takeovers"]) std::cout << " " << t.value("gap_ms", int64_t{0});
        std::cout << ")";
      }
      std::cout << "\n";
    }
  });
  return Status::Ok();
}

void AddChain(CLI::App& root, GlobalOptions& g) {
  static ChainArgs a;
  CLI::App* chain = root.add_subcommand("chain", "Run the ledger (sequencer or follower) and inspect it");
  chain->require_subcommand(1);
  chain->footer(
      "Examples:\n"
      "  meshlearn keys new alice --no-passphrase\n"
      "  meshlearn chain init --dir ~/chain --fund alice=1000000 --faucet\n"
      "  meshlearn chain serve --dir ~/chain --listen 127.0.0.1:7700\n"
      "  meshlearn chain follow http://127.0.0.1:7700 --dir ~/follower --listen 127.0.0.1:7701\n"
      "  meshlearn chain status --rpc http://127.0.0.1:7701\n"
      "See docs/operators.md.");

  CLI::App* init = chain->add_subcommand("init", "Create a chain: genesis.toml and the sequencer key");
  init->add_option("--dir", a.dir, "Directory for the chain (created; must not hold one)")->required();
  init->add_option("--chain-id", a.chain_id, "Chain id (1-64 of A-Z a-z 0-9 _ . -)")->capture_default_str();
  init->add_option("--block-interval-ms", a.block_interval_ms, "Time between blocks")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  init->add_option("--fund", a.fund, "KEY=AMOUNT: a genesis balance (KEY: key name or hex); repeatable");
  init->add_flag("--faucet", a.faucet, "Allow Faucet transactions (devnets only)");
  init->add_flag("--devnet", a.devnet, "Devnet parameters: faucet, small stakes, short unbonding");
  init->add_option("--sequencers", a.sequencers,
                   "Sequencer candidates of a replicated chain (keys sequencer, sequencer-2, ...)")
      ->capture_default_str()->check(CLI::Range(1, static_cast<int>(ledger::kMaxSequencers)));
  init->footer("Examples:\n"
               "  meshlearn chain init --dir ./chain --faucet\n"
               "  meshlearn chain init --dir ./chain --chain-id test-1 --block-interval-ms 500 \\\n"
               "      --fund alice=1000000 --fund 3b6a27bc...=5000\n"
               "  meshlearn chain init --dir ./chain --sequencers 3   # a replicated chain");
  init->callback([&g] { g.Exit(RunInit(g, a)); });

  CLI::App* serve = chain->add_subcommand("serve", "Run the sequencer and its JSON-RPC API");
  serve->add_option("--dir", a.dir, "Chain directory (from `chain init`)")->required();
  serve->add_option("--listen", a.listen, "HOST:PORT for JSON-RPC (port 0: any free port)")
      ->capture_default_str();
  serve->add_option("--rate-limit", a.rate_limit, "Requests per second per client address (0: off)")
      ->capture_default_str();
  serve->add_option("--max-body", a.max_body, "Largest request body in bytes")->capture_default_str();
  serve->add_option("--cluster", a.cluster,
                    "etcd endpoints (comma-separated): run as one candidate of a replicated "
                    "sequencer");
  serve->add_option("--key", a.key_name, "The key in DIR/keys that signs blocks")
      ->capture_default_str();
  serve->add_option("--advertise", a.advertise,
                    "With --cluster: the RPC URL clients reach this candidate at (default: the "
                    "listening URL)");
  serve->add_option("--lease-ttl", a.lease_ttl_s,
                    "With --cluster: the leader's etcd lease in seconds (failover takes about "
                    "this long)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{600}));
  serve->footer("Examples:\n"
                "  meshlearn chain serve --dir ./chain\n"
                "  meshlearn chain serve --dir ./chain --listen 127.0.0.1:0 --json   # prints the URL\n"
                "  meshlearn chain serve --dir ./chain --key sequencer-2 --listen 127.0.0.1:7702 \\\n"
                "      --cluster http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379\n"
                "With --cluster, candidates elect a leader through etcd; clients take every\n"
                "candidate's URL (--rpc URL1,URL2,URL3) and fail over (docs/operators.md).\n"
                "Serves JSON-RPC (POST /), GET /metrics and the dashboard at GET / (open the URL in\n"
                "a browser).\n"
                "Stop with Ctrl-C or SIGTERM; a crash loses no acknowledged transaction.");
  serve->callback([&g] { g.Exit(RunServe(g, a)); });

  CLI::App* follow = chain->add_subcommand("follow", "Replay a sequencer's blocks, verify them, serve reads");
  follow->add_option("url", a.url, "The sequencer's RPC URL")->required();
  follow->add_option("--dir", a.dir, "Directory for this follower's copy of the chain")->required();
  follow->add_option("--listen", a.follow_listen, "HOST:PORT to serve read-only JSON-RPC ('' for none)")
      ->capture_default_str();
  follow->add_option("--sequencer", a.sequencer, "Expected sequencer key (default: genesis.toml's)");
  follow->add_option("--genesis-hash", a.genesis_hash, "Refuse a fetched genesis with another hash");
  follow->footer("Examples:\n"
                 "  meshlearn chain follow http://127.0.0.1:7700 --dir ./follower --listen 127.0.0.1:7701\n"
                 "  meshlearn chain follow http://seq:7700 --dir ./f --genesis-hash 9f2c...\n"
                 "A block that does not verify (signature, re-execution, state hash) is refused: the\n"
                 "follower stops, exits 1, and keeps the block in DIR/refused-block-H.hex.");
  follow->callback([&g] { g.Exit(RunFollow(g, a)); });

  CLI::App* status = chain->add_subcommand("status", "Show a ledger's height, state hash and totals");
  status->add_option("--rpc", a.rpc, "RPC URL (default $MESHLEARN_RPC or http://127.0.0.1:7700)");
  status->footer("Examples:\n  meshlearn chain status\n  meshlearn --json chain status --rpc http://127.0.0.1:7701");
  status->callback([&g] { g.Exit(RunStatus(g, a)); });
}

}  // namespace

MESHLEARN_COMMAND(30, AddChain);

}  // namespace meshlearn::cli
