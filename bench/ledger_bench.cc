// ledger_bench: block execution throughput of signed transfers against the raw ed25519 verify
// rate, measured on the same machine in the same run.
//
//   ledger_bench [--txs=20000] [--block=1000] [--senders=1000] [--rounds=3]
//                [--benchmarks=verify,produce,apply]
//
// Cases (one JSON line each):
//   verify   libsodium ed25519 verify of the same signed messages: the baseline
//   produce  Chain::ProduceBlock: admission, execution, state hash, signing and the durable
//            SQLite commit of every block (WAL, synchronous=FULL)
//   apply    Chain::ApplyBlock of the same blocks on a follower (re-execution + commit)
// "ratio" is tx/s of the case divided by verifies/s of the baseline (wall clock, best of the
// rounds); "cpu_ratio" the same on process CPU time; "insn_ratio" on user-space instructions
// retired (Linux perf counters; immune to other load, but blind to IPC and to time spent in the
// kernel, e.g. fsync). The target is >= 0.8.
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
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/ledger/chain.h"

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

struct Rate {
  double wall = 0;  // best operations per wall-clock second
  double cpu = 0;   // best operations per CPU second
  double insns = 0;  // fewest user-space instructions per operation (0: not available)
  void Add(int ops, const Timer& t) {
    wall = std::max(wall, ops / t.Wall());
    cpu = std::max(cpu, ops / t.Cpu());
    int64_t n = t.Insns();
    if (n > 0) insns = insns == 0 ? static_cast<double>(n) / ops : std::min(insns, static_cast<double>(n) / ops);
  }
};

struct Flags {
  int txs = 20000;
  int block = 1000;
  int senders = 1000;
  int rounds = 3;
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
                   "[--benchmarks=verify,produce,apply]\n");
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

  // The machine may be shared: each round measures every case once, interleaved, and each case
  // keeps its best round, so a burst of load elsewhere does not skew the ratio.
  Rate verify, produce, apply;
  for (int round = 0; round < flags.rounds; ++round) {
    {
      Timer t;
      int ok = 0;
      for (size_t i = 0; i < txs.size(); ++i) {
        ok += meshlearn::Verify(txs[i].sender, messages[i], txs[i].signature) ? 1 : 0;
      }
      verify.Add(flags.txs, t);
      if (ok != flags.txs) {
        std::fprintf(stderr, "ledger_bench: %d signatures failed to verify\n", flags.txs - ok);
        return 1;
      }
    }
    if (!Wants(flags, "produce") && !Wants(flags, "apply")) continue;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::vector<Block> blocks;
    auto chain = Chain::Open(dir + "/sequencer.db", genesis);
    if (!chain.ok()) {
      std::fprintf(stderr, "ledger_bench: %s\n", chain.status().ToString().c_str());
      return 1;
    }
    Timer t;
    int64_t time_ms = 0;
    for (int i = 0; i < flags.txs; i += flags.block) {
      int end = std::min(flags.txs, i + flags.block);
      std::vector<Transaction> batch(txs.begin() + i, txs.begin() + end);
      auto b = (*chain)->ProduceBlock(std::move(batch), time_ms += 1000, sequencer);
      if (!b.ok() || static_cast<int>(b->txs.size()) != end - i) {
        std::fprintf(stderr, "ledger_bench: block failed: %s\n", b.status().ToString().c_str());
        return 1;
      }
      blocks.push_back(std::move(*b));
    }
    produce.Add(flags.txs, t);
    if (!(*chain)->CheckInvariants().ok()) return 1;
    if (!Wants(flags, "apply")) continue;
    auto follower = Chain::Open(dir + "/follower.db", genesis);
    if (!follower.ok()) return 1;
    Timer ta;
    for (const Block& b : blocks) {
      meshlearn::Status s = (*follower)->ApplyBlock(b, sequencer.public_key());
      if (!s.ok()) {
        std::fprintf(stderr, "ledger_bench: apply failed: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    apply.Add(flags.txs, ta);
  }

  auto report = [&](const char* name, const Rate& r, bool ratio) {
    nlohmann::json j = common;
    j["case"] = name;
    j["per_s"] = static_cast<int64_t>(r.wall);
    j["us_per_op"] = 1e6 / r.wall;
    j["cpu_per_s"] = static_cast<int64_t>(r.cpu);
    if (r.insns > 0) j["insns_per_op"] = static_cast<int64_t>(r.insns);
    if (ratio) {
      j["ratio"] = r.wall / verify.wall;
      j["cpu_ratio"] = r.cpu / verify.cpu;
      if (r.insns > 0 && verify.insns > 0) j["insn_ratio"] = verify.insns / r.insns;
      j["target_ratio"] = 0.8;
    }
    Print(j);
  };
  if (Wants(flags, "verify")) report("verify", verify, false);
  if (Wants(flags, "produce")) report("produce", produce, true);
  if (Wants(flags, "apply")) report("apply", apply, true);
  std::filesystem::remove_all(dir);
  return 0;
}
