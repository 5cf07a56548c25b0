// A real etcd cluster on loopback for tests (LocalEtcdCluster, etcd_local.h). Tests skip,
// saying so, where the `etcd` binary is missing (Debian: apt-get install etcd-server).
#pragma once

#include <string>

#include "meshlearn/ledger/etcd_local.h"

namespace meshlearn::ledger::testing {

inline std::string FindEtcd() { return ledger::FindEtcd(); }
inline int FreePort() { return FreeLoopbackPort(); }

class EtcdCluster : public LocalEtcdCluster {
 public:
  // False, with `error` set, if the cluster did not come up.
  bool Start(const std::string& bin, int n, const std::string& dir, std::string* error) {
    Status s = LocalEtcdCluster::Start(bin, n, dir);
    if (!s.ok()) *error = s.ToString();
    return s.ok();
  }
};

}  // namespace meshlearn::ledger::testing
