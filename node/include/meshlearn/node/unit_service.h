// What a solver serves so that verifiers can replay its committed units (docs/verification.md):
// the unit's committed leaves (the state hashes its commitment is the Merkle root of) and its
// checkpoints (every hashed step after 0, the final state at H included: docs/verification.md
// "Result binding"), read from the unit's work directory (<data_dir>/units/<task>-<index>/),
// which the agent keeps until the unit's round is final.
//
// Methods (bodies in the canonical encoding, every field checked on decode):
//   "unit.manifest"    {task, index}                       -> UnitManifest
//   "unit.checkpoint"  {task, index, step, offset, length} -> bytes [offset, offset + length) of
//                      the checkpoint file of `step` (at most kMaxCheckpointSlice)
//
// The verifier trusts nothing it fetches: the leaves must hash to the on-chain commitment
// (MerkleRoot) and a checkpoint must hash to its committed leaf (ReplaySegment checks it). A
// forced-error unit is served consistently with what was committed: the forced leaves, and no
// checkpoint (none could hash to a forced leaf).
//
//   UnitService service(env);
//   service.Register(&router);                       // beside the blob services
//   service.Publish(manifest, {ckpt_path_1, ...});   // at commit time (and after a restart)
//   ...
//   ML_ASSIGN_OR_RETURN(UnitManifest m, FetchUnitManifest(transport, endpoint, task, index));
//   ML_ASSIGN_OR_RETURN(Bytes ckpt, FetchUnitCheckpoint(transport, endpoint, m, step));
//
// Thread-safety: UnitService is thread-safe (handlers may run on HTTP worker threads); its Env
// must be too (Env::Default is; a MemEnv serves a single-threaded simulation).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "meshlearn/base/bytes.h"
#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/status.h"
#include "meshlearn/net/transport.h"

namespace meshlearn::node {

inline constexpr char kMethodUnitManifest[] = "unit.manifest";
inline constexpr char kMethodUnitCheckpoint[] = "unit.checkpoint";
inline constexpr uint64_t kMaxCheckpointSlice = 4u << 20;
inline constexpr uint32_t kMaxManifestLeaves = 1u << 20;

struct UnitCheckpointRef {
  int64_t step = 0;   // a hashed step (0 < step <= H: the final state too, for result checks)
  uint64_t size = 0;  // bytes of the checkpoint file (safetensors)
};

struct UnitManifest {
  Hash256 task_id;
  uint32_t index = 0;
  std::vector<Hash256> leaves;  // the committed state hashes, leaf j = state after step j*k
  std::vector<UnitCheckpointRef> checkpoints;
};
Bytes EncodeUnitManifest(const UnitManifest& m);
Result<UnitManifest> DecodeUnitManifest(ByteSpan wire);

class UnitService {
 public:
  // `env` reads the checkpoint files; it must outlive the service.
  explicit UnitService(Env* env) : env_(env) {}

  // Registers "unit.manifest" and "unit.checkpoint".
  void Register(net::Router* router);

  // Serves `manifest` (replacing what was served for its unit); checkpoint_paths[i] is the file
  // of manifest.checkpoints[i].
  void Publish(UnitManifest manifest, std::vector<std::string> checkpoint_paths);
  void Withdraw(const Hash256& task, uint32_t index);
  bool Serves(const Hash256& task, uint32_t index) const;

 private:
  struct Entry {
    Bytes manifest;
    std::map<int64_t, std::pair<std::string, uint64_t>> files;  // step -> (path, size)
  };
  Result<Bytes> HandleManifest(const net::Request& r) const;
  Result<Bytes> HandleCheckpoint(const net::Request& r);

  Env* const env_;
  mutable std::mutex mu_;
  std::map<std::pair<Hash256, uint32_t>, Entry> units_;
  // The last checkpoint file read, so that a verifier's slices do not re-read it every time.
  std::string cached_path_;
  std::string cached_bytes_;
};

// The manifest of unit (task, index) from the solver at `endpoint`.
Result<UnitManifest> FetchUnitManifest(net::Transport* transport, const std::string& endpoint,
                                       const Hash256& task, uint32_t index,
                                       int64_t timeout_ms = 10'000);
// The whole checkpoint file of `step` listed in `manifest`, in slices.
Result<Bytes> FetchUnitCheckpoint(net::Transport* transport, const std::string& endpoint,
                                  const UnitManifest& manifest, int64_t step,
                                  int64_t timeout_ms = 30'000);

}  // namespace meshlearn::node
