#include "meshlearn/protocol/comm_model.h"

#include <gtest/gtest.h>

namespace meshlearn::protocol {
namespace {

TEST(CommModelTest, DilocoSendsHTimesLessThanSyncDataParallel) {
  CommModelInput in;
  in.model_bytes = 4 * 1'000'000;
  in.batch_size = 64;
  in.inner_steps = 50;
  in.num_solvers = 8;
  const CommModelResult r = CompareCommunication(in);
  EXPECT_DOUBLE_EQ(r.sync_parameter_server_bytes_per_sample, 4e6 / 64);
  EXPECT_DOUBLE_EQ(r.diloco_bytes_per_sample, 4e6 / (50 * 64));
  EXPECT_DOUBLE_EQ(r.sync_ring_allreduce_bytes_per_sample, 2.0 * 7 / 8 * 4e6 / 64);
  EXPECT_DOUBLE_EQ(r.ratio_vs_sync_parameter_server, 50.0);
  EXPECT_DOUBLE_EQ(r.ratio_vs_sync_ring_allreduce, 87.5);
  EXPECT_GE(r.ratio_vs_sync_parameter_server, 50.0);  // the target at H = 50

  // A commit overhead costs a little of the ratio.
  in.commit_overhead_bytes = 1000;
  const CommModelResult o = CompareCommunication(in);
  EXPECT_LT(o.ratio_vs_sync_parameter_server, 50.0);
  EXPECT_GT(o.ratio_vs_sync_parameter_server, 49.98);
}

}  // namespace
}  // namespace meshlearn::protocol
