// A local etcd cluster: N `etcd` processes on loopback (random free ports, data under one
// directory), started and stopped by their parent. For devnets, benchmarks and tests of the
// replicated sequencer (cluster.h); production clusters are run by their operators
// (docs/operators.md, "Running a replicated chain").
//
//   std::string bin = FindEtcd();                  // "" : not installed (etcd-server)
//   LocalEtcdCluster etcd;
//   ML_RETURN_IF_ERROR(etcd.Start(bin, 3, dir));
//   ... etcd.ClientUrls() ...                      // "http://127.0.0.1:P1,..."
//   etcd.Pause(0); etcd.Resume(0);                 // SIGSTOP / SIGCONT one member
//
// Fast Raft timings (heartbeat 50 ms, election 500 ms): a lease can be as short as 1 s. The
// members die with their parent (PR_SET_PDEATHSIG) and in the destructor, which also removes
// their data directories (64 MB of preallocated WAL each). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "meshlearn/base/status.h"

namespace meshlearn::ledger {

// The etcd binary: $MESHLEARN_ETCD, else `etcd` on PATH; "" if there is none.
std::string FindEtcd();

// A loopback TCP port nobody listens on now (the kernel's choice).
int FreeLoopbackPort();
// n distinct free ports (0 for any it could not bind), chosen while all n are held.
std::vector<int> FreeLoopbackPorts(int n);

class LocalEtcdCluster {
 public:
  struct Member {
    std::string name, client_url, peer_url, data_dir, log;
    pid_t pid = -1;
    bool paused = false;
  };

  LocalEtcdCluster() = default;
  LocalEtcdCluster(const LocalEtcdCluster&) = delete;
  LocalEtcdCluster& operator=(const LocalEtcdCluster&) = delete;
  ~LocalEtcdCluster();

  // Starts `n` members under `dir` (each logs to dir/etcd-mI.log) and waits until a write
  // commits. Unavailable, naming the log, if the cluster is not up within 30 s.
  Status Start(const std::string& bin, int n, const std::string& dir);
  // SIGKILLs every member.
  void StopAll();

  size_t size() const { return members_.size(); }
  const Member& member(size_t i) const { return members_[i]; }
  std::vector<std::string> ClientUrlList() const;
  std::string ClientUrls() const;  // comma-separated

  void Pause(size_t i);    // SIGSTOP: keeps its sockets, answers nothing (a partition)
  void Resume(size_t i);   // SIGCONT
  void Kill(size_t i);     // SIGKILL
  void Restart(size_t i);  // a killed member again, on its data directory

 private:
  void Launch(size_t i, const char* state);

  std::string bin_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace meshlearn::ledger
