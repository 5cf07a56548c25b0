#include "meshlearn/cli.h"

#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "meshlearn/base/env.h"

namespace meshlearn::cli {
namespace {

std::vector<std::pair<int, CommandAdder>>& Registry() {
  static std::vector<std::pair<int, CommandAdder>> r;
  return r;
}

std::string PromptNoEcho(const char* prompt) {
  std::fprintf(stderr, "%s", prompt);
  std::fflush(stderr);
  termios old{};
  bool tty = ::tcgetattr(STDIN_FILENO, &old) == 0;
  if (tty) {
    termios quiet = old;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    ::tcsetattr(STDIN_FILENO, TCSANOW, &quiet);
  }
  std::string line;
  std::getline(std::cin, line);
  if (tty) ::tcsetattr(STDIN_FILENO, TCSANOW, &old);
  std::fprintf(stderr, "\n");
  return line;
}

}  // namespace

std::string GlobalOptions::KeysDir() const { return JoinPath(home, "keys"); }

void GlobalOptions::Exit(const Status& s) {
  if (s.ok()) return;
  exit_code = 1;
  if (json) {
    nlohmann::json j = {{"error", {{"code", std::string(StatusCodeName(s.code()))},
                                   {"message", s.message()}}}};
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cerr << "error: " << s.message() << std::endl;
  }
}

void GlobalOptions::Output(const nlohmann::json& j, const std::function<void()>& human) {
  if (json) {
    std::cout << j.dump(2) << std::endl;
  } else {
    human();
  }
}

bool RegisterCommand(int order, CommandAdder adder) {
  Registry().emplace_back(order, adder);
  return true;
}

void AddAllCommands(CLI::App& root, GlobalOptions& g) {
  auto r = Registry();
  std::stable_sort(r.begin(), r.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, adder] : r) adder(root, g);
}

Result<std::string> ReadPassphrase(const std::string& passphrase_file, bool confirm,
                                   bool allow_prompt) {
  if (!passphrase_file.empty()) {
    Result<std::string> text = Env::Default()->ReadFile(passphrase_file);
    if (!text.ok()) return text.status().WithPrefix("--passphrase-file");
    std::string p = *text;
    while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.pop_back();
    if (p.empty()) {
      return InvalidArgument("--passphrase-file " + passphrase_file +
                             " is empty; write the passphrase on its first line");
    }
    return p;
  }
  if (const char* env = std::getenv("MESHLEARN_PASSPHRASE")) return std::string(env);
  if (!allow_prompt || ::isatty(STDIN_FILENO) == 0) return std::string();
  std::string p = PromptNoEcho("passphrase (empty for none): ");
  if (confirm && !p.empty()) {
    std::string again = PromptNoEcho("repeat passphrase: ");
    if (again != p) return InvalidArgument("passphrases do not match; try again");
  }
  return p;
}

}  // namespace meshlearn::cli
