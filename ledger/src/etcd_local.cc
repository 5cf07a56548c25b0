#include "meshlearn/ledger/etcd_local.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "meshlearn/ledger/etcd.h"

namespace meshlearn::ledger {

std::string FindEtcd() {
  if (const char* e = std::getenv("MESHLEARN_ETCD"); e && *e) return e;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    if (colon == std::string::npos) colon = p.size();
    std::string candidate = p.substr(start, colon - start) + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = colon + 1;
  }
  return "";
}

std::vector<int> FreeLoopbackPorts(int n) {
  // Every socket stays bound until all n ports are chosen: a port closed at once can be the
  // kernel's next pick again (two members once got the same peer port, and etcd refused the
  // cluster's duplicate url).
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      break;
    }
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  ports.resize(static_cast<size_t>(n), 0);
  return ports;
}

int FreeLoopbackPort() { return FreeLoopbackPorts(1)[0]; }

LocalEtcdCluster::~LocalEtcdCluster() {
  StopAll();
  // etcd preallocates 64 MB of WAL per member: a local cluster's data goes with it.
  std::error_code ec;
  for (const Member& m : members_) std::filesystem::remove_all(m.data_dir, ec);
}

void LocalEtcdCluster::StopAll() {
  for (size_t i = 0; i < members_.size(); ++i) Kill(i);
}

Status LocalEtcdCluster::Start(const std::string& bin, int n, const std::string& dir) {
  if (bin.empty()) return NotFound("no etcd binary; install it: apt-get install etcd-server");
  bin_ = bin;
  std::string initial;
  const std::vector<int> ports = FreeLoopbackPorts(2 * n);  // distinct
  for (int i = 0; i < n; ++i) {
    Member m;
    m.name = "m" + std::to_string(i);
    m.client_url = "http://127.0.0.1:" + std::to_string(ports[2 * i]);
    m.peer_url = "http://127.0.0.1:" + std::to_string(ports[2 * i + 1]);
    m.data_dir = dir + "/etcd-" + m.name;
    m.log = dir + "/etcd-" + m.name + ".log";
    initial += (i ? "," : "") + m.name + "=" + m.peer_url;
    members_.push_back(m);
  }
  initial_cluster_ = initial;
  for (size_t i = 0; i < members_.size(); ++i) Launch(i, "new");
  EtcdClient etcd(ClientUrlList(), {.timeout_ms = 1000});
  for (int tries = 0; tries < 300; ++tries) {
    if (etcd.Put("/meshlearn-local/ready", "1").ok()) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Unavailable("the local etcd cluster did not come up in 30 s; see " + members_[0].log);
}

std::vector<std::string> LocalEtcdCluster::ClientUrlList() const {
  std::vector<std::string> out;
  for (const Member& m : members_) out.push_back(m.client_url);
  return out;
}

std::string LocalEtcdCluster::ClientUrls() const {
  std::string out;
  for (const Member& m : members_) out += (out.empty() ? "" : ",") + m.client_url;
  return out;
}

void LocalEtcdCluster::Pause(size_t i) {
  if (members_[i].pid > 0 && !members_[i].paused) kill(members_[i].pid, SIGSTOP);
  members_[i].paused = true;
}

void LocalEtcdCluster::Resume(size_t i) {
  if (members_[i].pid > 0 && members_[i].paused) kill(members_[i].pid, SIGCONT);
  members_[i].paused = false;
}

void LocalEtcdCluster::Kill(size_t i) {
  Member& m = members_[i];
  if (m.pid <= 0) return;
  kill(m.pid, SIGKILL);
  int status;
  waitpid(m.pid, &status, 0);
  m.pid = -1;
  m.paused = false;
}

void LocalEtcdCluster::Restart(size_t i) {
  if (members_[i].pid <= 0) Launch(i, "existing");
}

void LocalEtcdCluster::Launch(size_t i, const char* state) {
  Member& m = members_[i];
  // Everything the child needs is prepared before fork (only async-signal-safe calls after).
  std::vector<std::string> args = {bin_,
                                   "--name",
                                   m.name,
                                   "--data-dir",
                                   m.data_dir,
                                   "--listen-client-urls",
                                   m.client_url,
                                   "--advertise-client-urls",
                                   m.client_url,
                                   "--listen-peer-urls",
                                   m.peer_url,
                                   "--initial-advertise-peer-urls",
                                   m.peer_url,
                                   "--initial-cluster",
                                   initial_cluster_,
                                   "--initial-cluster-state",
                                   state,
                                   "--initial-cluster-token",
                                   "meshlearn-local",
                                   "--heartbeat-interval",
                                   "50",
                                   "--election-timeout",
                                   "500",
                                   "--logger",
                                   "zap",
                                   "--log-level",
                                   "warn",
                                   "--max-request-bytes",
                                   std::to_string(kEtcdMaxRequestBytes)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  m.pid = fork();
  if (m.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
    int fd = open(m.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
}

}  // namespace meshlearn::ledger
