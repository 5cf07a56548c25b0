// ledger_bench: block execution throughput of signed transfers against the raw ed25519 verify
// rate, measured on the same machine in the same run.
//
//   ledger_bench [--txs=20000] [--block=1000] [--senders=1000] [--rounds=5]
//                [--benchmarks=verify,produce,apply[,cluster]]
//
// Cases (one JSON line each):
//   verify   libsodium ed25519 verify (crypto_sign_verify_detached, one thread) of the same
//            signed messages: the baseline
//   produce  Chain::ProduceBlock: admission (which verifies every signature), execution, state
//            hash, signing and the durable SQLite commit of every block (WAL, synchronous=FULL)
//   apply    Chain::ApplyBlock of the same blocks on a follower (verifies every signature again,
//            re-executes, commits)
//   cluster  (opt-in) the sequencer's whole path, Sequencer::Submit of a block's transactions
//            then ProduceOnce, on a replicated sequencer (the leader of a ClusterCandidate on a
//            local 3-member etcd: every block also goes through etcd's compare-and-swap before
//            its SQLite commit) against the single-process sequencer, the two alternating block
//            by block in the same run. "ratio" = cluster tx/s / single tx/s (median over
//            `rounds` groups of blocks), target 0.5; "etcd_ms_per_block" is where the extra time
//            goes. Skipped, saying so, without the etcd binary.
// Pairing: the machine may be shared, so every block is timed right after a raw verify of that
// block's own transactions, and a round's ratio for a case is (its tx/s) / (verifies/s of the
// verifies paired with it): both sides see the same load. "ratio" is the median of the rounds'
// wall-clock ratios ("ratio_min"/"ratio_max": the spread), "cpu_ratio" the same on process CPU
// time, "insn_ratio" on user-space instructions retired (Linux perf counters, where allowed;
// immune to other load, but blind to IPC and to time in the kernel, e.g. fsync). per_s and
// cpu_per_s are the best round's. The target is >= 0.8.
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/clock.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/cluster.h"
#include "meshlearn/ledger/etcd_local.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"

using meshlearn::KeyPair;
using meshlearn::KeySeed;
using namespace meshlearn::ledger;

namespace {

// User-space instructions retired by this process: unlike time, not disturbed by other load
// on the machine. -1 when the kernel does not allow counting (perf_event_paranoid).
class InstructionCounter {
 public:
  InstructionCounter() {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_HARDWARE;
    attr.size = sizeof(attr);
    attr.config = PERF_COUNT_HW_INSTRUCTIONS;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    fd_ = static_cast<int>(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
    if (fd_ >= 0) ioctl(fd_, PERF_EVENT_IOC_ENABLE, 0);
  }
  ~InstructionCounter() {
    if (fd_ >= 0) close(fd_);
  }
  int64_t Read() const {
    int64_t v = -1;
    if (fd_ < 0 || read(fd_, &v, sizeof(v)) != sizeof(v)) return -1;
    return v;
  }

 private:
  int fd_ = -1;
};

InstructionCounter& Instructions() {
  static InstructionCounter counter;
  return counter;
}

// Wall-clock and process CPU time of one measured section. CPU time is the fairer comparison
// on a shared machine (other processes' load does not count), wall time includes waiting for
// fsync; both are reported.
class Timer {
 public:
  Timer()
      : wall_(std::chrono::steady_clock::now()),
        cpu_(CpuSeconds()),
        insns_(Instructions().Read()) {}
  // Instructions retired since construction, or -1.
  int64_t Insns() const {
    int64_t now = Instructions().Read();
    return (now < 0 || insns_ < 0) ? -1 : now - insns_;
  }
  double Wall() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count();
  }
  double Cpu() const { return CpuSeconds() - cpu_; }

 private:
  static double CpuSeconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  std::chrono::steady_clock::time_point wall_;
  double cpu_;
  int64_t insns_;
};

// Time spent in one case during one round, summed over its timed sections.
struct Span {
  double wall = 0, cpu = 0;
  int64_t insns = 0;  // -1: not available
  void Add(const Timer& t) {
    wall += t.Wall();
    cpu += t.Cpu();
    int64_t n = t.Insns();
    insns = (n < 0 || insns < 0) ? -1 : insns + n;
  }
};

struct Rate {
  double wall = 0;  // best operations per wall-clock second
  double cpu = 0;   // best operations per CPU second
  double insns = 0;  // fewest user-space instructions per operation (0: not available)
  void Add(int ops, const Span& t) {
    wall = std::max(wall, ops / t.wall);
    cpu = std::max(cpu, ops / t.cpu);
    if (t.insns > 0) {
      double per = static_cast<double>(t.insns) / ops;
      insns = insns == 0 ? per : std::min(insns, per);
    }
  }
};

// Per-round ratios of a case against the verifies paired with it.
struct Ratios {
  std::vector<double> wall, cpu, insn;
  void Add(const Span& c, const Span& v) {
    wall.push_back(v.wall / c.wall);
    cpu.push_back(v.cpu / c.cpu);
    if (c.insns > 0 && v.insns > 0) insn.push_back(static_cast<double>(v.insns) / c.insns);
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Flags {
  int txs = 20000;
  int block = 1000;
  int senders = 1000;
  int rounds = 5;
  std::string benchmarks = "verify,produce,apply";
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> const char* {
      if (a.substr(0, name.size()) == name && a.size() > name.size() && a[name.size()] == '=') {
        return argv[i] + name.size() + 1;
      }
      return nullptr;
    };
    if (const char* v = value("--txs")) {
      f.txs = std::atoi(v);
    } else if (const char* v = value("--block")) {
      f.block = std::atoi(v);
    } else if (const char* v = value("--senders")) {
      f.senders = std::atoi(v);
    } else if (const char* v = value("--rounds")) {
      f.rounds = std::atoi(v);
    } else if (const char* v = value("--benchmarks")) {
      f.benchmarks = v;
    } else {
      std::fprintf(stderr,
                   "usage: ledger_bench [--txs=N] [--block=N] [--senders=N] [--rounds=N] "
                   "[--benchmarks=verify,produce,apply[,cluster]]\n");
      std::exit(2);
    }
  }
  if (f.txs <= 0 || f.block <= 0 || f.senders <= 0 || f.rounds <= 0) {
    std::fprintf(stderr, "ledger_bench: --txs, --block, --senders and --rounds must be > 0\n");
    std::exit(2);
  }
  return f;
}

bool Wants(const Flags& f, std::string_view name) {
  return ("," + f.benchmarks + ",").find("," + std::string(name) + ",") != std::string::npos;
}

void Print(const nlohmann::json& j) { std::printf("%s\n", j.dump().c_str()); }

// The cluster case (see the top of the file). Returns the process exit status.
int RunCluster(const Flags& flags, Genesis genesis, const KeyPair& key,
               const std::vector<std::vector<Transaction>>& batches, const std::string& dir,
               nlohmann::json j) {
  j["case"] = "cluster";
  std::string bin = FindEtcd();
  if (bin.empty()) {
    j["skipped"] = "no etcd binary (apt-get install etcd-server)";
    Print(j);
    return 0;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  LocalEtcdCluster etcd;
  if (meshlearn::Status s = etcd.Start(bin, 3, dir); !s.ok()) {
    std::fprintf(stderr, "ledger_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  genesis.sequencer = key.public_key();
  genesis.sequencers = {key.public_key()};
  auto single_chain = Chain::Open(dir + "/single.db", genesis);
  auto cluster_chain = Chain::Open(dir + "/cluster.db", genesis);
  if (!single_chain.ok() || !cluster_chain.ok()) return 1;
  SharedChain single_shared(single_chain->get()), cluster_shared(cluster_chain->get());
  SequencerOptions so;
  so.max_block_txs = static_cast<uint32_t>(flags.block);
  so.max_mempool = static_cast<size_t>(flags.block) * 2;
  Sequencer single(&single_shared, key, meshlearn::SystemClock::Default(), so);
  Sequencer leader(&cluster_shared, key, meshlearn::SystemClock::Default(), so);
  ClusterCandidate candidate(&cluster_shared, &leader,
                             {.etcd = etcd.ClientUrlList(), .advertise_url = "bench"});
  meshlearn::Status run_status;
  std::thread run([&] { run_status = candidate.Run(); });
  for (int i = 0; i < 3000 && !candidate.leading(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!candidate.leading()) {
    std::fprintf(stderr, "ledger_bench: the cluster candidate was not elected\n");
    candidate.Stop();
    run.join();
    return 1;
  }
  auto produce = [&](Sequencer& seq, const std::vector<Transaction>& batch, Span* into) {
    Timer t;
    for (const Transaction& tx : batch) {
      if (!seq.Submit(tx).ok()) return false;
    }
    auto b = seq.ProduceOnce();
    into->Add(t);
    return b.ok() && b->txs.size() == batch.size();
  };
  // `rounds` groups of consecutive blocks; in each, the two sequencers alternate block by block.
  size_t groups = std::min<size_t>(static_cast<size_t>(flags.rounds), batches.size());
  Rate single_rate, cluster_rate;
  Ratios ratio;
  Span single_all, cluster_all;
  int txs_all = 0;
  bool ok = true;
  for (size_t g = 0; g < groups && ok; ++g) {
    Span s_span, c_span;
    int n = 0;
    // Contiguous groups: a batch's nonces follow the previous batch's.
    const size_t end = (g + 1) * batches.size() / groups;
    for (size_t bi = g * batches.size() / groups; bi < end && ok; ++bi) {
      ok = produce(single, batches[bi], &s_span) && produce(leader, batches[bi], &c_span);
      n += static_cast<int>(batches[bi].size());
    }
    single_rate.Add(n, s_span);
    cluster_rate.Add(n, c_span);
    ratio.Add(c_span, s_span);
    single_all.wall += s_span.wall;
    cluster_all.wall += c_span.wall;
    txs_all += n;
  }
  candidate.Stop();
  run.join();
  if (!ok) {
    std::fprintf(stderr, "ledger_bench: a cluster block failed (see the log)\n");
    return 1;
  }
  // Both produced the same chain, and etcd holds every cluster block.
  if (single_shared.With([](Chain& c) { return c.StateHash(); }) !=
      cluster_shared.With([](Chain& c) { return c.StateHash(); })) {
    std::fprintf(stderr, "ledger_bench: the cluster's state differs from the single sequencer's\n");
    return 1;
  }
  j["per_s"] = static_cast<int64_t>(cluster_rate.wall);
  j["single_per_s"] = static_cast<int64_t>(single_rate.wall);
  j["cpu_per_s"] = static_cast<int64_t>(cluster_rate.cpu);
  j["ratio"] = Median(ratio.wall);
  j["ratio_min"] = *std::min_element(ratio.wall.begin(), ratio.wall.end());
  j["ratio_max"] = *std::max_element(ratio.wall.begin(), ratio.wall.end());
  j["cpu_ratio"] = Median(ratio.cpu);
  size_t blocks = batches.size();
  j["etcd_ms_per_block"] = 1e3 * (cluster_all.wall - single_all.wall) / static_cast<double>(blocks);
  j["single_ms_per_block"] = 1e3 * single_all.wall / static_cast<double>(blocks);
  j["blocks"] = blocks;
  j["target_ratio"] = 0.5;
  Print(j);
  (void)txs_all;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);

  std::vector<KeyPair> senders;
  std::vector<meshlearn::PublicKey> keys;
  for (int i = 0; i < flags.senders; ++i) {
    KeySeed s;
    s.bytes.fill(0);
    s.bytes[0] = static_cast<uint8_t>(i);
    s.bytes[1] = static_cast<uint8_t>(i >> 8);
    s.bytes[2] = static_cast<uint8_t>(i >> 16);
    senders.push_back(KeyPair::FromSeed(s));
    keys.push_back(senders.back().public_key());
  }
  Genesis genesis = DevnetGenesis(keys, 1'000'000'000, "bench");
  KeySeed seq_seed;
  seq_seed.bytes.fill(0xee);
  KeyPair sequencer = KeyPair::FromSeed(seq_seed);

  // Signed transfers, round-robin over the senders, each to the next sender (not timed).
  std::vector<Transaction> txs;
  txs.reserve(flags.txs);
  std::vector<uint64_t> nonces(flags.senders, 0);
  for (int i = 0; i < flags.txs; ++i) {
    int s = i % flags.senders;
    txs.push_back(BuildSignedTx(senders[s], genesis.chain_id, nonces[s]++,
                                TransferTx{.to = keys[(s + 1) % flags.senders], .amount = 1}));
  }

  nlohmann::json common = {{"bench", "ledger"}, {"txs", flags.txs}, {"block", flags.block},
                           {"senders", flags.senders}, {"rounds", flags.rounds}};
  std::vector<meshlearn::Bytes> messages;
  messages.reserve(txs.size());
  for (const Transaction& tx : txs) messages.push_back(SigningBytes(tx));
  std::string dir = (std::filesystem::temp_directory_path() /
                     ("ledger_bench_" + std::to_string(::getpid())))
                        .string();

  // Raw verification of transactions [begin, end): the baseline, timed into `into`.
  auto verify_range = [&](size_t begin, size_t end, Span* into) {
    Timer t;
    int ok = 0;
    for (size_t i = begin; i < end; ++i) {
      ok += meshlearn::Verify(txs[i].sender, messages[i], txs[i].signature) ? 1 : 0;
    }
    into->Add(t);
    return ok == static_cast<int>(end - begin);
  };
  std::vector<std::vector<Transaction>> batches;
  for (int i = 0; i < flags.txs; i += flags.block) {
    batches.emplace_back(txs.begin() + i, txs.begin() + std::min(flags.txs, i + flags.block));
  }

  // Every round measures every case once; within a round each block is paired with a raw
  // verify of its own transactions (see the top of the file).
  Rate verify, produce, apply;
  Ratios produce_ratio, apply_ratio;
  for (int round = 0; round < flags.rounds; ++round) {
    Span v_produce, t_produce, v_apply, t_apply;
    bool wants_chain = Wants(flags, "produce") || Wants(flags, "apply");
    if (!wants_chain) {
      if (!verify_range(0, txs.size(), &v_produce)) return 1;
      verify.Add(flags.txs, v_produce);
      continue;
    }
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::vector<Block> blocks;
    auto chain = Chain::Open(dir + "/sequencer.db", genesis);
    if (!chain.ok()) {
      std::fprintf(stderr, "ledger_bench: %s\n", chain.status().ToString().c_str());
      return 1;
    }
    int64_t time_ms = 0;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      size_t begin = bi * static_cast<size_t>(flags.block);
      if (!verify_range(begin, begin + batches[bi].size(), &v_produce)) {
        std::fprintf(stderr, "ledger_bench: a signature failed to verify\n");
        return 1;
      }
      std::vector<Transaction> batch = batches[bi];  // the chain takes its input by value
      Timer t;
      auto b = (*chain)->ProduceBlock(std::move(batch), time_ms += 1000, sequencer);
      t_produce.Add(t);
      if (!b.ok() || b->txs.size() != batches[bi].size()) {
        std::fprintf(stderr, "ledger_bench: block failed: %s\n", b.status().ToString().c_str());
        return 1;
      }
      blocks.push_back(std::move(*b));
    }
    verify.Add(flags.txs, v_produce);
    produce.Add(flags.txs, t_produce);
    produce_ratio.Add(t_produce, v_produce);
    if (!(*chain)->CheckInvariants().ok()) return 1;
    if (!Wants(flags, "apply")) continue;
    auto follower = Chain::Open(dir + "/follower.db", genesis);
    if (!follower.ok()) return 1;
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      size_t begin = bi * static_cast<size_t>(flags.block);
      if (!verify_range(begin, begin + blocks[bi].txs.size(), &v_apply)) return 1;
      Timer t;
      meshlearn::Status s = (*follower)->ApplyBlock(blocks[bi], sequencer.public_key());
      t_apply.Add(t);
      if (!s.ok()) {
        std::fprintf(stderr, "ledger_bench: apply failed: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    verify.Add(flags.txs, v_apply);
    apply.Add(flags.txs, t_apply);
    apply_ratio.Add(t_apply, v_apply);
  }

  auto report = [&](const char* name, const Rate& r, const Ratios* ratio) {
    nlohmann::json j = common;
    j["case"] = name;
    j["per_s"] = static_cast<int64_t>(r.wall);
    j["us_per_op"] = 1e6 / r.wall;
    j["cpu_per_s"] = static_cast<int64_t>(r.cpu);
    if (r.insns > 0) j["insns_per_op"] = static_cast<int64_t>(r.insns);
    if (ratio) {
      j["ratio"] = Median(ratio->wall);
      j["ratio_min"] = *std::min_element(ratio->wall.begin(), ratio->wall.end());
      j["ratio_max"] = *std::max_element(ratio->wall.begin(), ratio->wall.end());
      j["cpu_ratio"] = Median(ratio->cpu);
      j["cpu_ratio_min"] = *std::min_element(ratio->cpu.begin(), ratio->cpu.end());
      if (!ratio->insn.empty()) j["insn_ratio"] = Median(ratio->insn);
      j["target_ratio"] = 0.8;
    }
    Print(j);
  };
  if (Wants(flags, "verify")) report("verify", verify, nullptr);
  if (Wants(flags, "produce")) report("produce", produce, &produce_ratio);
  if (Wants(flags, "apply")) report("apply", apply, &apply_ratio);
  int status = 0;
  if (Wants(flags, "cluster")) {
    status = RunCluster(flags, genesis, sequencer, batches, dir + "-cluster", common);
    std::filesystem::remove_all(dir + "-cluster");
  }
  std::filesystem::remove_all(dir);
  return status;
}
