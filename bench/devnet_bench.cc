// Network training benchmarks, from real devnets (`meshlearn devnet`: a ledger and 4 nodes as
// processes on loopback), printed as JSON lines; every ratio's baseline is measured or derived in
// the same run:
//
//  1. comm: bytes each solver sends per training sample (its delta blobs, as fetched by the
//     aggregators: copies counted on the nodes' blob stores) with H = 50, against synchronous
//     data-parallel training of the same model that sends a gradient every step (parameter
//     server: model_bytes / batch per sample; ring all-reduce: 2 (N-1)/N x that). Target: >= 50x.
//  2. time to target: devnet wall time from submit until the first round whose test accuracy
//     reaches the target, against `meshlearn train` of the same file in one process.
//  3. verification cost (--verification): the task's devnet training time (submit to the final
//     round) with verification off, then economic assurance with rounds in flight 0 (each round
//     waits for the one before it to be final: the old order) and with the ledger's default,
//     then full assurance; each over the unverified time (targets: economic <= 1.2x, full
//     <= 1.5x), with verifier compute per solver compute (what verifiers were paid over what
//     solvers were paid: at one price, pay is proportional to the steps each ran) and the final
//     weights' hash (the same in every run: verification does not change the model).
//
// Usage: devnet_bench [--task examples/fashion-mlp.toml] [--target 0.88] [--skip-time]
//                     [--verification]
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

std::string Run(const std::string& cmd, int* code) {
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Replace(std::string text, const std::string& key, const std::string& value) {
  // Replaces the line "key = ..." inside [network].
  size_t net = text.find("[network]");
  size_t at = text.find("\n" + key + " =", net);
  if (net == std::string::npos || at == std::string::npos) return text;
  size_t end = text.find('\n', at + 1);
  return text.substr(0, at + 1) + key + " = " + value + text.substr(end);
}

std::string TempDir() {
  char tmpl[] = "/tmp/meshlearn-devnet-bench-XXXXXX";
  return mkdtemp(tmpl);
}

// 3. One devnet run of `task` per setting, the same seed: training seconds against the unverified
// run's.
int VerificationCost(const std::string& bin, const std::string& task, const std::string& dir) {
  struct Setting {
    const char* name;
    const char* flags;
  };
  const Setting settings[] = {
      {"unverified", "--no-verification"},
      {"economic_in_order", "--assurance economic --rounds-in-flight 0"},
      {"economic", "--assurance economic"},
      {"full", "--assurance full"},
  };
  double unverified_s = 0;
  for (const Setting& s : settings) {
    int code = 0;
    const std::string out_dir = dir + "/" + s.name;
    std::string out = Run("MESHLEARN_HOME=" + out_dir + "-home " + bin +
                              " --json devnet --solvers 4 --no-check-reference " + s.flags +
                              " --task " + task + " --out " + out_dir,
                          &code);
    json r = json::parse(out, nullptr, false);
    if (code != 0 || r.is_discarded() || !r.contains("seconds_training")) {
      std::cerr << "devnet (" << s.name << ") failed: " << out << "\n";
      return 1;
    }
    const double seconds = r["seconds_training"].get<double>();
    if (unverified_s == 0) unverified_s = seconds;
    const json money = r.value("money", json::object());
    const double solvers = money.value("paid_to_solvers", 0.0);
    const json v = r.value("verification", json::object());
    std::cout << json{{"bench", "devnet_verification_cost"},
                      {"task", task},
                      {"setting", s.name},
                      {"flags", s.flags},
                      {"seconds_training", seconds},
                      {"ratio_vs_unverified", seconds / unverified_s},
                      {"verifier_per_solver_compute",
                       solvers > 0 ? money.value("paid_to_verifiers", 0.0) / solvers : 0.0},
                      {"rounds_in_flight", v.value("rounds_in_flight", json())},
                      {"rounds_dropped", v.value("rounds_dropped", json())},
                      {"checks", v.value("checks", json())},
                      {"final_weights_hash", r.value("final_weights_hash", "")},
                      {"test_accuracy", r.value("test_accuracy", json())}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string task = std::string(MESHLEARN_SOURCE_DIR) + "/examples/fashion-mlp.toml";
  double target = 0.88;
  bool skip_time = false;
  bool verification = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--task" && i + 1 < argc) task = argv[++i];
    else if (a == "--target" && i + 1 < argc) target = std::stod(argv[++i]);
    else if (a == "--skip-time") skip_time = true;
    else if (a == "--verification") verification = true;
    else {
      std::cerr << "usage: devnet_bench [--task FILE] [--target ACC] [--skip-time] "
                   "[--verification]\n";
      return 2;
    }
  }
  const std::string bin = MESHLEARN_BIN;
  const std::string dir = TempDir();
  struct RemoveDir {  // the devnets' directories go with the bench, whatever path returns
    std::string path;
    ~RemoveDir() { std::filesystem::remove_all(path); }
  } remove_dir{dir};
  const std::string text = ReadFile(task);
  if (text.empty()) {
    std::cerr << "cannot read " << task << "\n";
    return 1;
  }
  int code = 0;
  if (verification) return VerificationCost(bin, task, dir);

  // 1. Communication with H = 50 (2 rounds are enough: the ratio is per sample).
  {
    std::string t = Replace(Replace(text, "inner_steps", "50"), "rounds", "2");
    // The data paths are absolute in the examples; relative ones resolve from the task's dir.
    const std::string path = dir + "/h50.toml";
    std::ofstream(path) << t;
    std::string out = Run("MESHLEARN_HOME=" + dir + "/home " + bin + " --json devnet --solvers 4 "
                          "--no-check-reference --block-interval-ms 200 --task " + path +
                          " --out " + dir + "/h50", &code);
    json r = json::parse(out, nullptr, false);
    if (code != 0 || r.is_discarded() || !r.contains("traffic")) {
      std::cerr << "devnet (H=50) failed: " << out << "\n";
      return 1;
    }
    const json& tr = r["traffic"];
    std::cout << json{{"bench", "devnet_comm"},
                      {"task", task},
                      {"inner_steps", 50},
                      {"solvers", 4},
                      {"deltas", tr["deltas"]},
                      {"bytes_per_solver_sample", tr["bytes_per_solver_sample"]},
                      {"sync_parameter_server_bytes_per_sample", tr["sync_parameter_server_bytes_per_sample"]},
                      {"sync_ring_allreduce_bytes_per_sample", tr["sync_ring_allreduce_bytes_per_sample"]},
                      {"ratio_vs_sync_parameter_server", tr["ratio_vs_sync_parameter_server"]},
                      {"ratio_vs_sync_ring_allreduce", tr["ratio_vs_sync_ring_allreduce"]},
                      {"target_ratio", 50}}
                     .dump()
              << std::endl;
  }
  if (skip_time) return 0;

  // 2. Time to target accuracy: devnet (4 solvers) vs `meshlearn train` (one process).
  {
    auto t0 = std::chrono::steady_clock::now();
    std::string out = Run(bin + " --json train " + task + " --out " + dir + "/train", &code);
    double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    json tr = json::parse(out, nullptr, false);
    double train_acc = tr.is_discarded() ? 0 : tr.value("test_accuracy", 0.0);

    out = Run("MESHLEARN_HOME=" + dir + "/home2 " + bin + " --json devnet --solvers 4 "
              "--no-check-reference --task " + task + " --out " + dir + "/full", &code);
    json r = json::parse(out, nullptr, false);
    if (code != 0 || r.is_discarded()) {
      std::cerr << "devnet failed: " << out << "\n";
      return 1;
    }
    // Seconds from submit to the first round at the target, from the rounds' commit heights.
    double to_target = -1;
    const double per_block = r.value("seconds_training", 0.0) /
                             std::max<double>(1, r.value("blocks_training", 1.0));
    for (const json& rr : r["round_results"]) {
      if (rr.value("test_accuracy_ppm", 0) / 1e6 >= target) {
        to_target = (rr.value("committed_height", 0.0) - r.value("submit_height", 0.0)) * per_block;
        break;
      }
    }
    std::cout << json{{"bench", "devnet_time_to_target"},
                      {"task", task},
                      {"target", target},
                      {"solvers", 4},
                      {"devnet_accuracy", r["test_accuracy"]},
                      {"devnet_seconds_to_target", to_target},
                      {"devnet_seconds_total", r["seconds_training"]},
                      {"train_accuracy", train_acc},
                      {"train_seconds", train_s},
                      {"ratio_devnet_over_train", to_target > 0 ? to_target / train_s : -1},
                      {"cores", sysconf(_SC_NPROCESSORS_ONLN)}}
                     .dump()
              << std::endl;
  }
  return 0;
}
