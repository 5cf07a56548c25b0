// The standard benchmark a node reports at registration (`meshlearn node bench`): training
// throughput of a fixed engine workload (the Fashion-MNIST MLP 784-256-128-10, AdamW, batch 64,
// synthetic in-memory data), the machine's memory and cores.
//
// FLOP/s = steps x batch x EstimateFlopsPerSample(workload) / seconds, the same FLOP count the
// scheduler uses for tasks (task_bundle.h), so estimated unit times are consistent. Latency and
// bandwidth are not measured here (there is no peer to measure against): they come from the
// node's config, or defaults.
//
//   ML_ASSIGN_OR_RETURN(BenchResult b, RunStandardBench({.seconds = 2.0}));
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "meshlearn/base/status.h"
#include "meshlearn/ledger/state.h"

namespace meshlearn::node {

struct BenchOptions {
  double seconds = 2.0;  // measure for at least this long (and at least 5 steps)
  uint32_t latency_ms = 5;
  uint64_t bandwidth_bytes_per_s = 100'000'000;
};

struct BenchResult {
  uint64_t flops_per_s = 0;
  uint64_t memory_bytes = 0;  // physical memory
  uint32_t cores = 0;
  int64_t steps = 0;
  double seconds = 0;
  uint32_t latency_ms = 0;
  uint64_t bandwidth_bytes_per_s = 0;

  ledger::NodeCapabilities ToCapabilities() const;
  nlohmann::json ToJson() const;
};

Result<BenchResult> RunStandardBench(const BenchOptions& options = {});

// Physical memory and online cores of this machine.
uint64_t PhysicalMemoryBytes();
uint32_t OnlineCores();

// The bytes free to an unprivileged writer on the file system that holds `path` (statvfs:
// f_bavail x f_frsize). Errors name the path.
Result<uint64_t> FreeDiskBytes(const std::string& path);
// The disk a node offers to its pipeline stage files (NodeCapabilities::disk_bytes, which the
// scheduler places stages by: protocol::StageDiskBytes), measured when it starts: `limit` when not
// 0 (node.toml disk_limit_bytes or `node run --disk-limit`), which must not exceed `free_bytes`
// (FreeDiskBytes of the data dir): FailedPrecondition naming `what` (the flag or key that set
// it), both figures, the data dir and the fix, since a stage placed by it would fail mid-run
// with ENOSPC. 0: nine tenths of `free_bytes` (a tenth kept for blobs, journals and everything
// else the data dir holds), at least 1 (0 would declare none).
Result<uint64_t> OfferedDiskBytes(uint64_t limit, uint64_t free_bytes, const std::string& data_dir,
                                  const std::string& what);

}  // namespace meshlearn::node
