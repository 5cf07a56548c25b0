// Communication cost model: bytes a solver sends per training sample with DiLoCo (one delta every
// H inner steps) versus synchronous data-parallel training (a gradient every step), for the same
// model. The formulas are what the network benchmark compares its measured bytes against.
//
//   CommModelInput in{.model_bytes = 4 * params, .batch_size = 64, .inner_steps = 50,
//                     .num_solvers = 8};
//   CommModelResult r = CompareCommunication(in);
//   // r.ratio_vs_sync_parameter_server == 50 (= H), r.ratio_vs_sync_ring_allreduce == 87.5
//
// What a solver sends:
//   DiLoCo (our protocol): per unit, one upload of its delta (model_bytes) plus a commitment
//     overhead (transactions, Merkle root), for H x batch_size samples.
//   Sync DP, parameter server: per step, one gradient upload (model_bytes) for batch_size samples.
//   Sync DP, ring all-reduce:  per step, 2 (N - 1) / N x model_bytes for batch_size samples.
// Downloads (the round's weights) are not counted: both schemes receive about as much as a
// parameter-server worker sends. The ratio against the parameter server is exactly H when
// commit_overhead_bytes is 0 (same topology, H times fewer messages).
#pragma once

#include <cstdint>

namespace meshlearn::protocol {

struct CommModelInput {
  uint64_t model_bytes = 0;  // bytes of one gradient / delta / weight copy
  uint32_t batch_size = 0;   // samples per step per solver
  uint32_t inner_steps = 0;  // H
  uint32_t num_solvers = 0;  // N, for the ring all-reduce baseline (>= 2)
  // Extra bytes a solver sends per unit in our protocol (commit transaction, Merkle root, ...).
  uint64_t commit_overhead_bytes = 0;
};

struct CommModelResult {
  double diloco_bytes_per_sample = 0;
  double sync_parameter_server_bytes_per_sample = 0;
  double sync_ring_allreduce_bytes_per_sample = 0;
  double ratio_vs_sync_parameter_server = 0;  // sync / DiLoCo
  double ratio_vs_sync_ring_allreduce = 0;
};

// REQUIRES: model_bytes, batch_size, inner_steps > 0 and num_solvers >= 2.
CommModelResult CompareCommunication(const CommModelInput& in);

}  // namespace meshlearn::protocol
