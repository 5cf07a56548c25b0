#include "testing/sim_harness.h"

#include <stdlib.h>

#include <iostream>
#include <thread>

#include "meshlearn/base/check.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/node/blob_push.h"
#include "meshlearn/node/local_diloco.h"
#include "meshlearn/node/stage_unit.h"

namespace meshlearn::node::testing {

using nlohmann::json;

namespace {

KeyPair DerivedKey(uint64_t seed, const std::string& who) {
  Hasher h("meshlearn.sim.key");
  h.UpdateU64(seed).Update(who);
  Hash256 d = h.Finish();
  KeySeed s;
  std::copy(d.bytes.begin(), d.bytes.end(), s.bytes.begin());
  return KeyPair::FromSeed(s);
}

std::string TempDir() { return TestDir("sim"); }

}  // namespace

// The parties' ledger client: the in-process RPC of whichever ledger runs now, each call shown
// to the on_rpc observer.
class SimHarness::LedgerClient final : public ChainClient {
 public:
  explicit LedgerClient(SimHarness* sim) : sim_(sim) {}
  Result<json> Call(const std::string& method, const json& params) override {
    Result<json> r = sim_->rpc_client_->Call(method, params);
    if (sim_->options_.on_rpc) sim_->options_.on_rpc(method, params, r);
    return r;
  }
  std::string Describe() const override { return "in-process ledger"; }

 private:
  SimHarness* sim_;
};

SimHarness::SimHarness(SimOptions options)
    : options_(std::move(options)),
      clock_(1'700'000'000'000),
      seq_key_(DerivedKey(options_.seed, "sequencer")),
      submitter_(DerivedKey(options_.seed, "submitter")),
      referee_key_(DerivedKey(options_.seed, "referee")) {
  if (options_.env == nullptr) {
    own_env_ = std::make_unique<MemEnv>();
    env_ = own_env_.get();
  } else {
    env_ = options_.env;
  }
  options_.node_options.resize(options_.nodes);
  for (int i = 0; i < options_.nodes; ++i) {
    node_keys_.push_back(DerivedKey(options_.seed, "node" + std::to_string(i)));
  }
}

SimHarness::~SimHarness() {
  for (auto& server : servers_) {
    if (server) server->Stop();
  }
  agents_.clear();
  if (!chain_dir_.empty()) {
    std::string cmd = "rm -rf '" + chain_dir_ + "'";
    (void)!system(cmd.c_str());
  }
}

json SimHarness::Call(const std::string& method, const json& params) {
  Result<json> r = client_->Call(method, params);
  if (!r.ok()) return json{{"error", r.status().ToString()}};
  return *r;
}

json SimHarness::Task(bool units) {
  json p = {{"id", task_id_.ToHex()}};
  if (units) p["units"] = true;
  return Call("get_task", p);
}

uint64_t SimHarness::height() { return shared_->height(); }

ledger::Totals SimHarness::Totals() {
  return shared_->With([](ledger::Chain& c) { return c.GetTotals(); });
}

Status SimHarness::MakeAgent(int i) {
  const std::string name = "n" + std::to_string(i);
  routers_[i] = std::make_unique<net::Router>();
  const Clock* clock = clocks_[i] ? static_cast<const Clock*>(clocks_[i].get()) : net_->clock();
  net::Transport* transport = net_->node(name)->transport();
  uint16_t port = 0;
  if (options_.http) {
    // The agent needs its endpoint before it registers its services, and a server takes its
    // router's limits when it starts: a free port is taken first, served once all is registered.
    servers_.resize(agents_.size());
    http_transports_.resize(agents_.size());
    http_transports_[i] = std::make_unique<net::HttpTransport>();
    net::Router none;
    net::HttpServer probe(&none);
    ML_ASSIGN_OR_RETURN(port, probe.Start("127.0.0.1", 0));
    probe.Stop();
    agent_opts_[i].endpoint = "127.0.0.1:" + std::to_string(port);
    transport = http_transports_[i].get();
  }
  agents_[i] = std::make_unique<NodeAgent>(AgentDeps{.env = env_,
                                                     .clock = clock,
                                                     .transport = transport,
                                                     .store = stores_[i].get(),
                                                     .chain = client_.get(),
                                                     .key = node_keys_[i]},
                                           agent_opts_[i]);
  agents_[i]->RegisterServices(routers_[i].get());
  if (options_.http) {
    servers_[i] = std::make_unique<net::HttpServer>(routers_[i].get());
    ML_RETURN_IF_ERROR(servers_[i]->Start("127.0.0.1", port).status());
  }
  net_->node(name)->Serve(routers_[i].get());
  return agents_[i]->init_status();
}

Result<std::unique_ptr<TxSender>> SimHarness::SenderFor(const KeyPair& key) {
  auto sender = std::make_unique<TxSender>(client_.get(), key);
  ML_RETURN_IF_ERROR(sender->Init());
  return sender;
}

Result<int> SimHarness::AddLateChallenger(const KeyPair& key,
                                          std::function<void(AgentOptions&)> tweak) {
  const int i = static_cast<int>(agents_.size());
  const std::string name = "n" + std::to_string(i);
  net_->AddNode(name);
  node_keys_.push_back(key);
  stores_.emplace_back();
  routers_.emplace_back();
  agents_.emplace_back();
  clocks_.emplace_back();
  const std::string dir = options_.root + "/nodes/" + name;
  ML_ASSIGN_OR_RETURN(stores_[i], net::BlobStore::Open(env_, dir + "/blobs"));
  AgentOptions o;
  o.data_dir = dir;
  o.endpoint = name;
  o.roles = 0;
  o.late_challenger = true;
  o.fetch.request_timeout_ms = 2000;
  if (options_.log || options_.log_sink) {
    o.log = [name, i, echo = options_.log, sink = options_.log_sink](const std::string& line) {
      if (echo) std::cerr << "[" << name << "] " << line << "\n";
      if (sink) sink(i, line);
    };
  }
  if (tweak) tweak(o);
  agent_opts_.push_back(std::move(o));
  ML_RETURN_IF_ERROR(MakeAgent(i));
  return i;
}

Status SimHarness::Setup() {
  std::vector<PublicKey> funded = {submitter_.public_key(), referee_key_.public_key()};
  for (const KeyPair& k : node_keys_) funded.push_back(k.public_key());
  genesis_ = ledger::DevnetGenesis(funded, 1'000'000'000'000ull, "meshlearn-sim");
  genesis_.block_interval_ms = options_.block_interval_ms;
  genesis_.sequencer = seq_key_.public_key();
  genesis_.genesis_time_ms = clock_.NowMillis();
  if (options_.referee_in_genesis) genesis_.referee = referee_key_.public_key();
  if (options_.tweak_genesis) options_.tweak_genesis(genesis_);
  if (!options_.ledger_in_memory) chain_dir_ = TempDir();
  ML_RETURN_IF_ERROR(OpenLedger());
  client_ = std::make_unique<LedgerClient>(this);
  net_ = std::make_unique<net::SimNetwork>(options_.seed, options_.link);

  const int n = options_.nodes;
  stores_.resize(n);
  routers_.resize(n);
  agents_.resize(n);
  agent_opts_.resize(n);
  clocks_.resize(n);
  for (int i = 0; i < n; ++i) {
    const std::string name = "n" + std::to_string(i);
    net_->AddNode(name);
    const std::string dir = options_.root + "/nodes/" + name;
    const SimNodeOptions& no = options_.node_options[i];
    ML_ASSIGN_OR_RETURN(stores_[i], net::BlobStore::Open(env_, dir + "/blobs",
                                                         {.quota_bytes = no.blob_quota_bytes}));
    AgentOptions& o = agent_opts_[i];
    o.data_dir = dir;
    o.endpoint = name;
    o.roles = no.roles;
    o.capabilities = {.cores = 1,
                      .memory_bytes = no.memory_bytes,
                      .accelerator = "",
                      .throughput = options_.throughput,
                      .latency_ms = 2,
                      .bandwidth_bytes_per_s = 1'000'000'000};
    o.price = options_.price;
    o.stake = genesis_.params.MinStakeFor(no.roles);
    o.speed_factor = no.speed_factor;
    o.heartbeat_every_blocks = 5;
    o.fetch.request_timeout_ms = 2000;
    o.memory_limit_bytes = no.memory_limit_bytes;
    if (options_.log || options_.log_sink) {
      o.log = [name, i, echo = options_.log, sink = options_.log_sink](const std::string& line) {
        if (echo) std::cerr << "[" << name << "] " << line << "\n";
        if (sink) sink(i, line);
      };
    }
    if (options_.agent_options) options_.agent_options(i, o);
    if (no.clock_skew_ms != 0 || no.clock_rate != 1.0) {
      clocks_[i] = std::make_unique<SkewedClock>(net_->clock(), no.clock_skew_ms, no.clock_rate);
    }
    if (no.start_late) {
      net_->Kill(name);  // not running yet: Restart starts it
      continue;
    }
    ML_RETURN_IF_ERROR(MakeAgent(i));
  }
  net_->AddNode("submitter");
  if (options_.referee) {
    net_->AddNode("referee");
    ML_ASSIGN_OR_RETURN(referee_store_,
                        net::BlobStore::Open(env_, options_.root + "/referee/blobs"));
    referee_tx_ = std::make_unique<TxSender>(client_.get(), referee_key_);
    ML_RETURN_IF_ERROR(referee_tx_->Init());
    // The referee reads public blobs (bundle, data, start states) from the nodes.
    auto get = [this](const Hash256& id) -> Result<Bytes> {
      net::BlobId bid{id};
      if (!referee_store_->HasBlob(bid)) {
        std::vector<std::string> providers;
        for (int i = 0; i < options_.nodes; ++i) {
          if (agents_[i]) providers.push_back("n" + std::to_string(i));
        }
        net::Fetcher fetcher(net_->node("referee")->transport(), referee_store_.get());
        ML_RETURN_IF_ERROR(fetcher.Fetch(bid, providers).status());
      }
      return referee_store_->Get(bid);
    };
    // Tolerance mode: the referee fetches the defender's checkpoints from its unit service.
    // In http mode the nodes' registered endpoints are loopback HTTP addresses (a stage's
    // evidence is fetched from there).
    if (options_.http) referee_http_ = std::make_unique<net::HttpTransport>();
    RefereeOptions ro{.env = env_,
                      .work_dir = options_.root + "/referee/work",
                      .transport = options_.http ? static_cast<net::Transport*>(referee_http_.get())
                                                 : net_->node("referee")->transport()};
    if (options_.log || options_.log_sink) {
      ro.log = [echo = options_.log, sink = options_.log_sink](const std::string& line) {
        if (echo) std::cerr << "[referee] " << line << "\n";
        if (sink) sink(-1, line);
      };
    }
    referee_ = std::make_unique<RefereeService>(client_.get(), referee_tx_.get(), get, ro);
  }

  // Register every node.
  for (int b = 0; b < 20; ++b) {
    ML_RETURN_IF_ERROR(Step());
    bool all = true;
    for (int i = 0; i < n; ++i) {
      if (options_.node_options[i].start_late) continue;
      Result<std::optional<NodeInfo>> ni = GetNode(*client_, node_keys_[i].public_key());
      if (!ni.ok() || !*ni) all = false;
    }
    if (all) break;
    if (b == 19) return DeadlineExceeded("sim: nodes did not register in 20 blocks");
  }

  // The submitter: bundle, initial state, push to two nodes, SubmitTask.
  ML_ASSIGN_OR_RETURN(submitter_store_,
                      net::BlobStore::Open(env_, options_.root + "/submitter/blobs"));
  const std::string task_file = options_.root + "/submitter/task.toml";
  ML_RETURN_IF_ERROR(env_->WriteFileAtomic(task_file, options_.task_toml));
  ML_ASSIGN_OR_RETURN(bundle_, MakeBundle(env_, task_file, submitter_store_.get()));
  ML_ASSIGN_OR_RETURN(engine::TaskSpec spec, engine::TaskSpec::Load(env_, task_file));
  ML_ASSIGN_OR_RETURN(auto trainer, engine::Trainer::Create(env_, spec));
  ML_ASSIGN_OR_RETURN(NetworkSpec net, NetworkSpec::Load(env_, task_file));
  TaskFacts facts = ComputeTaskFacts(*trainer, net);
  ML_ASSIGN_OR_RETURN(net::BlobId init,
                      submitter_store_->Put(EncodeGlobalState(InitialState(*trainer))));
  ML_RETURN_IF_ERROR(submitter_store_->Pin(init));
  std::vector<net::BlobId> blobs = {bundle_.id, init};
  for (const BundleDataFile& f : bundle_.files) blobs.push_back(f.id);
  std::vector<std::string> targets = {agent_opts_[0].endpoint, agent_opts_[n > 1 ? 1 : 0].endpoint};
  if (targets[0] == targets[1]) targets.pop_back();
  net::Transport* submitter_transport = net_->node("submitter")->transport();
  if (options_.http) {
    submitter_http_ = std::make_unique<net::HttpTransport>();
    submitter_transport = submitter_http_.get();
  }
  for (const net::BlobId& id : blobs) {
    ML_RETURN_IF_ERROR(PushBlob(submitter_transport, submitter_store_.get(), id, targets).status());
  }

  submitter_tx_ = std::make_unique<TxSender>(client_.get(), submitter_);
  ML_RETURN_IF_ERROR(submitter_tx_->Init());
  ledger::TaskParams params = MakeTaskParams(facts, net, init.hash);
  if (net.stages > 1) ML_RETURN_IF_ERROR(AddPipelineTerms(trainer->task(), net, &params));
  if (options_.tweak_params) options_.tweak_params(params);
  task_id_ = ledger::TaskIdFor(submitter_.public_key(), submitter_tx_->next_nonce());
  ML_RETURN_IF_ERROR(submitter_tx_
                         ->Send(ledger::SubmitTaskTx{.spec_hash = bundle_.id.hash,
                                                     .budget = net.budget,
                                                     .price_cap = net.price_cap,
                                                     .memo = "sim",
                                                     .params = params})
                         .status());
  for (int b = 0; b < 5; ++b) {
    ML_RETURN_IF_ERROR(Step());
    (void)submitter_tx_->Poll();
    for (const TxOutcome& o : submitter_tx_->TakeOutcomes()) {
      if (!o.ok) return FailedPrecondition("sim: SubmitTask failed: " + o.reason);
      return Status::Ok();
    }
  }
  return DeadlineExceeded("sim: SubmitTask not included in 5 blocks");
}

Result<TxOutcome> SimHarness::SendAsSubmitter(ledger::TxPayload payload) {
  ML_ASSIGN_OR_RETURN(Hash256 id, submitter_tx_->Send(std::move(payload)));
  for (int i = 0; i < 5 && submitter_tx_->IsInFlight(id); ++i) {
    ML_RETURN_IF_ERROR(Step());
    ML_RETURN_IF_ERROR(submitter_tx_->Poll());
  }
  for (const TxOutcome& out : submitter_tx_->TakeOutcomes()) {
    if (out.id == id) return out;
  }
  return DeadlineExceeded("sim: transaction " + id.ShortHex() + " not included in 5 blocks");
}

Result<TxOutcome> SimHarness::ProveAsSubmitter(ledger::ProveFraudTx proof) {
  ML_ASSIGN_OR_RETURN(TxOutcome commit,
                      SendAsSubmitter(ledger::CommitProofTx{
                          .commitment = ledger::ProofCommitment(ledger::ProofWitnessId(proof),
                                                                submitter_.public_key()),
                          .prover = submitter_.public_key()}));
  if (!commit.ok) return commit;
  return SendAsSubmitter(std::move(proof));
}

Status SimHarness::Step() {
  clock_.AdvanceMillis(options_.block_interval_ms);
  ML_RETURN_IF_ERROR(sequencer_->ProduceOnce().status());
  ML_RETURN_IF_ERROR(shared_->With([](ledger::Chain& c) { return c.CheckInvariants(); }));
  ML_RETURN_IF_ERROR(TickAll());
  if (referee_) ML_RETURN_IF_ERROR(referee_->Poll().status());
  if (options_.on_block) options_.on_block(height());
  return Status::Ok();
}

Status SimHarness::TickAll() {
  for (size_t i = 0; i < agents_.size(); ++i) {
    NodeAgent* a = agents_[i].get();
    if (!a) continue;
    if (options_.skip_tick && options_.skip_tick(static_cast<int>(i))) continue;
    Result<TickReport> r = a->Tick();
    if (!r.ok() && options_.kill_on_crash &&
        r.status().message().find("simulated crash") != std::string::npos) {
      Kill(static_cast<int>(i));
      crashed_.push_back(static_cast<int>(i));
      continue;
    }
    if (!r.ok()) return r.status().WithPrefix("node " + a->id().ShortHex());
  }
  return Status::Ok();
}

Status SimHarness::RunUntilFinished(uint64_t max_blocks, std::chrono::milliseconds pause) {
  for (uint64_t b = 0; b < max_blocks; ++b) {
    json t = Task(false);
    if (t.value("status", std::string()) == "finished") return Status::Ok();
    if (t.contains("error")) return Internal("sim: get_task: " + t["error"].dump());
    ML_RETURN_IF_ERROR(Step());
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  return DeadlineExceeded("sim: the task did not finish in " + std::to_string(max_blocks) +
                          " blocks: " + Task(false).dump().substr(0, 2000));
}

Status SimHarness::OpenLedger() {
  if (options_.ledger_in_memory) {
    if (!ledger_env_) {
      ledger_env_ = std::make_unique<MemEnv>();
      ML_RETURN_IF_ERROR(ledger_env_->CreateDirs("/ledger"));
    }
    ML_ASSIGN_OR_RETURN(chain_,
                        ledger::Chain::Open(ledger_env_.get(), "/ledger/chain.db", genesis_));
  } else {
    ML_ASSIGN_OR_RETURN(chain_, ledger::Chain::Open(chain_dir_ + "/chain.db", genesis_));
  }
  shared_ = std::make_unique<ledger::SharedChain>(chain_.get());
  sequencer_ = std::make_unique<ledger::Sequencer>(shared_.get(), seq_key_, &clock_);
  rpc_ = std::make_unique<ledger::RpcService>(shared_.get(), sequencer_.get());
  rpc_client_ = std::make_unique<InProcessChainClient>(rpc_.get());
  return Status::Ok();
}

Status SimHarness::RestartLedger(bool power_cut) {
  CHECK(!power_cut || ledger_env_ != nullptr) << "RestartLedger(power_cut) needs ledger_in_memory";
  if (power_cut) ledger_env_->CutPower();
  rpc_client_.reset();
  rpc_.reset();
  sequencer_.reset();
  shared_.reset();
  chain_.reset();
  if (power_cut) ledger_env_->RestorePower();
  return OpenLedger();
}

void SimHarness::Cut(int i) {
  if (i < static_cast<int>(servers_.size()) && servers_[i]) servers_[i]->Stop();
  net_->Kill("n" + std::to_string(i));
}

void SimHarness::Kill(int i) {
  // Cut first: no request reaches an agent being destroyed.
  Cut(i);
  agents_[i].reset();
}

Status SimHarness::Restart(int i, std::function<void(AgentOptions&)> tweak) {
  if (tweak) tweak(agent_opts_[i]);
  net_->Restart("n" + std::to_string(i));
  return MakeAgent(i);
}

Result<GlobalState> SimHarness::FinalState() {
  json t = Task(false);
  ML_ASSIGN_OR_RETURN(Hash256 id, Hash256::FromHex(t.value("final_state", std::string())));
  std::vector<std::string> providers;
  for (int i = 0; i < options_.nodes; ++i) {
    if (agents_[i]) providers.push_back(agent_opts_[i].endpoint);
  }
  net::Fetcher fetcher(options_.http ? submitter_http_.get() : net_->node("submitter")->transport(),
                       submitter_store_.get());
  ML_RETURN_IF_ERROR(fetcher.Fetch(net::BlobId{id}, providers).status());
  ML_ASSIGN_OR_RETURN(Bytes b, submitter_store_->Get(net::BlobId{id}));
  return DecodeGlobalState(b);
}

}  // namespace meshlearn::node::testing
