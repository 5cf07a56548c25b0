#include "meshlearn/protocol/comm_model.h"

#include "meshlearn/base/check.h"

namespace meshlearn::protocol {

CommModelResult CompareCommunication(const CommModelInput& in) {
  CHECK_GT(in.model_bytes, 0u);
  CHECK_GT(in.batch_size, 0u);
  CHECK_GT(in.inner_steps, 0u);
  CHECK_GE(in.num_solvers, 2u);
  const double model = static_cast<double>(in.model_bytes);
  const double batch = static_cast<double>(in.batch_size);
  const double h = static_cast<double>(in.inner_steps);
  const double n = static_cast<double>(in.num_solvers);

  CommModelResult r;
  r.diloco_bytes_per_sample = (model + static_cast<double>(in.commit_overhead_bytes)) / (h * batch);
  r.sync_parameter_server_bytes_per_sample = model / batch;
  r.sync_ring_allreduce_bytes_per_sample = 2.0 * (n - 1.0) / n * model / batch;
  r.ratio_vs_sync_parameter_server =
      r.sync_parameter_server_bytes_per_sample / r.diloco_bytes_per_sample;
  r.ratio_vs_sync_ring_allreduce =
      r.sync_ring_allreduce_bytes_per_sample / r.diloco_bytes_per_sample;
  return r;
}

}  // namespace meshlearn::protocol
