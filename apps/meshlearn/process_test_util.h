// What the process tests of apps/ (cli_test, devnet_test, task_cli_test, audit_test,
// hostile_input_test) share: running the real binary, or any shell command line, as a child
// process, and reading what it wrote.
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

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

// A new directory under /tmp named after `what`.
inline std::string TempDir(const std::string& what) {
  std::string tmpl = "/tmp/meshlearn-" + what + "-XXXXXX";
  return mkdtemp(tmpl.data());
}

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

}  // namespace meshlearn::process_test
