// What the process tests of apps/ (cli_test, devnet_test, task_cli_test, audit_test,
// hostile_input_test, metrics_test) share: running the real binary, or any shell command line, as
// a child process, a ledger as a real `chain serve`, and reading what they wrote.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "meshlearn/base/test_dir.h"

namespace meshlearn::process_test {

struct CmdResult {
  int code;         // the exit status; 128 + N when killed by signal N (134: abort)
  std::string out;  // stdout, and stderr where the command line sends it there
};

// Runs `command` with /bin/sh; its stdout is captured (append " 2>&1" for stderr too).
inline CmdResult Shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  if (WIFSIGNALED(status)) return {128 + WTERMSIG(status), out};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `meshlearn ARGS` with $MESHLEARN_HOME = `home`; stderr with stdout unless `with_stderr` is false.
inline CmdResult Meshlearn(const std::string& args, const std::string& home,
                           bool with_stderr = true) {
  return Shell("MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN + " " + args +
               (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// A new directory under /tmp named after `what`, removed when the test passed (base/test_dir.h).
inline std::string TempDir(const std::string& what) { return meshlearn::TestDir(what); }

// The whole file; empty if it cannot be read.
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Waits until `path` holds `before` followed by a token of at least `min_len` characters from
// `token_chars` and returns the token ("" after `seconds`); with no token_chars, `before` itself
// once it appears. (Plain string search: GCC's <regex> trips -Wmaybe-uninitialized under the
// sanitizers.)
inline std::string WaitFor(const std::string& path, const std::string& before,
                           const std::string& token_chars, int seconds, size_t min_len = 1) {
  for (int i = 0; i < seconds * 10; ++i) {
    const std::string text = ReadText(path);
    for (size_t at = text.find(before); at != std::string::npos; at = text.find(before, at + 1)) {
      if (token_chars.empty()) return before;
      const size_t start = at + before.size();
      const size_t end = text.find_first_not_of(token_chars, start);
      std::string token = text.substr(start, end == std::string::npos ? end : end - start);
      if (token.size() >= min_len) return token;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// `meshlearn ARGS...` as a child process with $MESHLEARN_HOME = `home`, stdout and stderr to
// `log`; sent `stop_signal` (SIGINT: as Ctrl-C) and reaped when destroyed.
class Child {
 public:
  Child(const std::string& home, const std::string& log, std::vector<std::string> args,
        int stop_signal = SIGTERM)
      : stop_signal_(stop_signal) {
    pid_ = fork();
    if (pid_ == 0) {
      setenv("MESHLEARN_HOME", home.c_str(), 1);
      if (!freopen(log.c_str(), "w", stdout) || !freopen(log.c_str(), "a", stderr)) _exit(127);
      std::vector<char*> argv{const_cast<char*>(MESHLEARN_BIN)};
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(MESHLEARN_BIN, argv.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, stop_signal_);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  pid_t pid() const { return pid_; }

 private:
  int stop_signal_;
  pid_t pid_ = -1;
};

// A ledger sequencer as a real process on loopback: `chain init --devnet` (200 ms blocks, a
// faucet) in home/chain with `funds` ("--fund alice=1000000 ..."), then `chain serve` on a free
// port. url() is empty if it did not come up within 30 s (its output: home/serve.out).
class ChainServer {
 public:
  explicit ChainServer(const std::string& home, const std::string& funds = "--fund alice=1000000")
      : out_(home + "/serve.out") {
    const int init = Meshlearn("chain init --dir " + home + "/chain --devnet --block-interval-ms 200 " +
                                   funds, home).code;
    if (init != 0) return;
    child_ = std::make_unique<Child>(
        home, out_,
        std::vector<std::string>{"--json", "chain", "serve", "--dir", home + "/chain", "--listen",
                                 "127.0.0.1:0"});
    // The first line of --json output is {"url": ...}.
    const std::string key = "\"url\":\"";
    for (int i = 0; i < 300 && url_.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::string text = ReadText(out_);
      const size_t at = text.find(key);
      const size_t end = at == std::string::npos ? at : text.find('"', at + key.size());
      if (end != std::string::npos) url_ = text.substr(at + key.size(), end - at - key.size());
    }
  }
  const std::string& url() const { return url_; }

 private:
  std::string out_;
  std::unique_ptr<Child> child_;
  std::string url_;
};

// The endpoint a `node run` child (`listen = "127.0.0.1:0"` in its node.toml: no port is picked
// here and handed over, for another socket to take first) bound and announces: from
// <data_dir>/listen.json, written atomically after the bind (NodeListenFile, cli.h), once it names
// this child's pid. "" after `seconds`.
inline std::string NodeEndpoint(const Child& node, const std::string& data_dir, int seconds = 60) {
  const std::string path = data_dir + "/listen.json";
  const std::string pid = "\"pid\":" + std::to_string(node.pid()) + ",";
  const std::string pid_last = "\"pid\":" + std::to_string(node.pid()) + "}";
  for (int i = 0; i < seconds * 10; ++i) {
    const std::string text = ReadText(path);
    if (text.find(pid) != std::string::npos || text.find(pid_last) != std::string::npos) {
      return WaitFor(path, "\"endpoint\":\"", "0123456789.:", 1, 3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// GET http://host:port/path (HTTP/1.0 over a plain socket), or POST `post_json` there when it is
// not empty: the status code (0 on any failure to connect or read), the header block and the body.
struct HttpAnswer {
  int status = 0;
  std::string headers;  // the status line and header lines, as received
  std::string body;
};
inline HttpAnswer HttpRequest(const std::string& url_host_port, const std::string& path,
                              const std::string& post_json = "") {
  const size_t colon = url_host_port.rfind(':');
  if (colon == std::string::npos) return {};
  const int port = std::atoi(url_host_port.c_str() + colon + 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        post_json.empty()
            ? "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
            : "POST " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                  "Content-Length: " + std::to_string(post_json.size()) + "\r\n\r\n" + post_json;
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 9, "HTTP/1.1 ") != 0 || body == std::string::npos) return {};
  return {std::atoi(response.c_str() + 9), response.substr(0, body), response.substr(body + 4)};
}

// The body of GET http://host:port/path ("" on any failure or a status other than 200).
inline std::string HttpGet(const std::string& url_host_port, const std::string& path) {
  HttpAnswer a = HttpRequest(url_host_port, path);
  return a.status == 200 ? a.body : "";
}

}  // namespace meshlearn::process_test
