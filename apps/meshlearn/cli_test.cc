// Runs the real `meshlearn` binary and checks its output and exit codes.
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
using meshlearn::process_test::WaitFor;
using nlohmann::json;
std::string TempHome() { return meshlearn::process_test::TempDir("cli"); }

TEST(Cli, HelpListsCommandsWithExamples) {
  CmdResult r = Meshlearn("--help", TempHome());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("keys"), std::string::npos);
  EXPECT_NE(r.out.find("version"), std::string::npos);
  EXPECT_NE(r.out.find("Examples"), std::string::npos);
}

// House rule: every command's --help shows examples. Walks the command tree as `--help` lists
// it (a subcommand's help inherits its parent's footer unless it sets its own, which must then
// carry examples itself).
std::vector<std::string> SubcommandsIn(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream in(help);
  std::string line;
  bool listing = false;
  while (std::getline(in, line)) {
    if (line == "Subcommands:") {
      listing = true;
    } else if (listing && line.empty()) {
      listing = false;
    } else if (listing && line.size() > 2 && line[0] == ' ' && line[2] != ' ') {
      names.push_back(line.substr(2, line.find(' ', 2) - 2));
    }
  }
  return names;
}

TEST(Cli, EveryCommandsHelpShowsExamples) {
  std::string home = TempHome();
  std::vector<std::string> commands = SubcommandsIn(Meshlearn("--help", home).out);
  ASSERT_GE(commands.size(), 10u);
  size_t checked = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    CmdResult r = Meshlearn(commands[i] + " --help", home);
    ASSERT_EQ(r.code, 0) << commands[i] << ": " << r.out;
    EXPECT_NE(r.out.find("Examples"), std::string::npos)
        << "meshlearn " << commands[i] << " --help:\n"
        << r.out;
    ++checked;
    if (commands[i].find(' ') == std::string::npos) {
      for (const std::string& sub : SubcommandsIn(r.out))
        commands.push_back(commands[i] + " " + sub);
    }
  }
  // The command tree: 12 commands, and the subcommands of keys, chain, wallet, task and node.
  EXPECT_GE(checked, 40u);
}

// ---- The commands the docs show, checked against the binary.
//
// README.md and docs/*.md show `meshlearn ...` command lines (```sh blocks, inline code spans)
// and name files of the repository. Every subcommand a doc shows must exist, every --flag must be
// one its command's --help lists, with a value where the flag takes one, and every repository path
// a doc names must exist: a flag renamed or a file moved fails here, not in a newcomer's shell.

struct DocCommand {
  std::string where;                // "docs/keys.md:9"
  std::vector<std::string> tokens;  // from "meshlearn" on
  bool from_help = false;           // an example of a command's --help, not a doc's
};

// Splits a shell-like line on blanks, keeping "double quoted" text as one token (quotes dropped).
std::vector<std::string> ShellTokens(const std::string& line) {
  std::vector<std::string> tokens;
  std::string cur;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && (c == ' ' || c == '\t')) {
      if (any) tokens.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) tokens.push_back(cur);
  return tokens;
}

// The command in `line` from its "meshlearn" (or ".../meshlearn") token up to a comment or the
// end of a shell command (|, &&, ;, >); empty when the line runs no meshlearn.
std::vector<std::string> MeshlearnTokens(const std::string& line) {
  std::vector<std::string> all = ShellTokens(line), out;
  size_t i = 0;
  // "meshlearn", or the built binary ("build/apps/meshlearn"; not the folder apps/meshlearn, nor
  // MESHLEARN_BIN=... naming it for a script).
  auto is_bin = [](const std::string& t) {
    return t == "meshlearn" ||
           (t.ends_with("/meshlearn") && t.find("build/") != std::string::npos &&
            t.find('=') == std::string::npos);
  };
  while (i < all.size() && !is_bin(all[i])) ++i;
  for (; i < all.size(); ++i) {
    const std::string& t = all[i];
    if (t.starts_with("#") || t == "|" || t == "&&" || t == ";" || t.starts_with(">") ||
        t.starts_with("2>"))
      break;
    out.push_back(t);
  }
  return out;
}

// Every meshlearn command `text` (a Markdown file, `rel` its path) shows: the lines of its shell
// blocks (```sh, ```bash, ```console or unmarked; a trailing backslash continues a line, a
// leading "$ " is a prompt) and its inline code spans.
std::vector<DocCommand> DocCommands(const std::string& rel, const std::string& text) {
  std::vector<DocCommand> commands;
  std::istringstream in(text);
  std::string line, logical, prose;
  bool fenced = false, shell = false;
  int number = 0, logical_start = 0;
  std::vector<int> prose_lines;  // prose[i]'s line number
  while (std::getline(in, line)) {
    ++number;
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 3, "```") == 0) {
      const std::string lang = line.substr(first + 3);
      if (!fenced)
        shell =
            lang.empty() || lang == "sh" || lang == "bash" || lang == "console" || lang == "shell";
      fenced = !fenced;
      prose += '\n';
      prose_lines.push_back(number);
      continue;
    }
    if (!fenced) {
      prose += line;
      prose_lines.insert(prose_lines.end(), line.size(), number);
      prose += '\n';
      prose_lines.push_back(number);
      continue;
    }
    if (!shell) continue;
    if (logical.empty()) logical_start = number;
    std::string part = line.substr(first == std::string::npos ? line.size() : first);
    if (part.starts_with("$ ")) part = part.substr(2);
    if (part.ends_with("\\")) {
      logical += part.substr(0, part.size() - 1) + " ";
      continue;
    }
    logical += part;
    std::vector<std::string> tokens = MeshlearnTokens(logical);
    if (!tokens.empty()) commands.push_back({rel + ":" + std::to_string(logical_start), tokens});
    logical.clear();
  }
  // Inline code spans (they may wrap a line); a blank line ends a paragraph and any open span.
  for (size_t open = prose.find('`'); open != std::string::npos;) {
    const size_t close = prose.find('`', open + 1);
    if (close == std::string::npos) break;
    std::string span = prose.substr(open + 1, close - open - 1);
    if (span.find("\n\n") != std::string::npos) {  // not a span: an unpaired backtick
      open = prose.find('`', open + 1);
      continue;
    }
    for (char& c : span)
      if (c == '\n') c = ' ';
    std::vector<std::string> tokens = MeshlearnTokens(span);
    if (!tokens.empty())
      commands.push_back({rel + ":" + std::to_string(prose_lines[open]), tokens});
    open = prose.find('`', close + 1);
  }
  return commands;
}

// README.md and docs/*.md, relative to the source tree.
std::vector<std::string> DocFiles() {
  std::vector<std::string> files = {"README.md"};
  for (const auto& e : std::filesystem::directory_iterator(MESHLEARN_SOURCE_DIR "/docs")) {
    if (e.path().extension() == ".md") files.push_back("docs/" + e.path().filename().string());
  }
  std::sort(files.begin() + 1, files.end());
  return files;
}

// The top-level folders of the repository: a token starting with one of them is a repo path.
bool IsRepoPath(const std::string& t) {
  for (const char* top :
       {"apps/", "base/", "bench/", "cmake/", "docs/", "engine/", "examples/", "fuzz/", "ledger/",
        "net/", "node/", "protocol/", "python/", "scripts/", "tests/", "tools/", ".ci/"}) {
    if (t.starts_with(top) && t.size() > std::string(top).size()) return true;
  }
  return false;
}

// Whether the repo path a doc names exists. Docs name a library header by its library
// ("node/adversary.h" is node/include/meshlearn/node/adversary.h), a source by its library
// ("node/agent.cc" is node/src/agent.cc) and a benchmark by its program ("bench/ledger_bench").
bool RepoPathExists(const std::string& p) {
  const std::string src = MESHLEARN_SOURCE_DIR "/";
  const size_t slash = p.find('/');
  const std::string top = p.substr(0, slash), rest = p.substr(slash + 1);
  for (const std::string& c :
       {p, top + "/include/meshlearn/" + top + "/" + rest, top + "/src/" + rest, p + ".cc"}) {
    if (std::filesystem::exists(src + c)) return true;
  }
  return false;
}

// The word `flag` ("--out") as an option of `help` (not as the prefix of a longer flag): the
// position of its entry in the options list, npos if absent.
size_t OptionIn(const std::string& help, const std::string& flag) {
  for (size_t at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    const bool word_end =
        end == help.size() || !(std::isalnum(static_cast<unsigned char>(help[end])) ||
                                help[end] == '-' || help[end] == '_');
    const size_t line_start = help.rfind('\n', at) + 1;  // npos + 1 == 0
    const std::string lead = help.substr(line_start, at - line_start);
    // An options-list entry: "  --out TEXT ..." or "  -o,--out TEXT ...".
    const bool entry = lead.find_first_not_of(' ') == std::string::npos ||
                       (lead.ends_with(",") && lead.find_first_not_of(' ') != std::string::npos &&
                        lead[lead.find_first_not_of(' ')] == '-');
    if (word_end && entry) return at;
  }
  return std::string::npos;
}

// Whether the option whose entry starts at `at` takes a value: CLI11 prints its type, upper case,
// after one space ("--out TEXT", "--solvers INT=4"); a switch has its description after the
// padding ("--keep      Keep ...") or a constraint ("--full Excludes: --resume-games").
bool TakesValue(const std::string& help, size_t at, const std::string& flag) {
  size_t i = at + flag.size();
  if (i + 1 >= help.size() || help[i] != ' ' ||
      !std::isupper(static_cast<unsigned char>(help[i + 1])))
    return false;
  for (++i; i < help.size() && std::isalnum(static_cast<unsigned char>(help[i])); ++i) {
    if (std::islower(static_cast<unsigned char>(help[i]))) return false;
  }
  return true;
}

TEST(Cli, EveryCommandTheDocsShowNamesFlagsItsHelpLists) {
  const std::string home = TempHome();
  std::map<std::string, std::string> helps;  // "task audit" -> its --help
  auto help_of = [&](const std::string& path) -> const std::string& {
    auto it = helps.find(path);
    if (it != helps.end()) return it->second;
    CmdResult r = Meshlearn(path + (path.empty() ? "" : " ") + "--help", home);
    EXPECT_EQ(r.code, 0) << "meshlearn " << path << " --help: " << r.out;
    return helps[path] = r.out;
  };
  size_t commands = 0, flags = 0, paths = 0;
  std::map<std::pair<std::string, std::string>, std::string> doc_flags;  // {command, flag} -> where
  // One command line as `where` shows it: its subcommands exist, its flags are options of the
  // subcommand they follow (or global ones), a flag that takes a value has one, and the repository
  // paths it names exist.
  auto check = [&](const DocCommand& c) {
    ++commands;
    std::string shown;  // "meshlearn task fetch ..."
    for (const std::string& t : c.tokens) shown += (shown.empty() ? "" : " ") + t;
    std::string path;  // the subcommand reached so far ("" is the root)
    bool positional_seen = false;
    for (size_t i = 1; i < c.tokens.size(); ++i) {
      std::string t = c.tokens[i];
      // Placeholders and prose around a command: "[--tokens N", "...", "leave);".
      while (!t.empty() && (t.front() == '[' || t.front() == '(')) t.erase(0, 1);
      while (!t.empty() && std::string("]),;.").find(t.back()) != std::string::npos) t.pop_back();
      if (t.empty()) continue;
      if (t.starts_with("--")) {
        const std::string flag = t.substr(0, t.find('='));
        const std::string* help = &help_of(path);
        size_t at = OptionIn(*help, flag);
        if (at == std::string::npos) {  // a global flag (--json, --home) after a subcommand
          help = &help_of("");
          at = OptionIn(*help, flag);
        }
        ++flags;
        if (at != std::string::npos && help == &help_of(path) && !c.from_help)
          doc_flags.emplace(std::make_pair(path, flag), c.where);
        if (at == std::string::npos) {
          ADD_FAILURE() << c.where << ": `" << shown << "`: `meshlearn " << path << "` has no "
                        << flag << " (its --help:\n"
                        << help_of(path) << ")";
          continue;
        }
        if (TakesValue(*help, at, flag) && t.find('=') == std::string::npos) {
          if (i + 1 >= c.tokens.size() || c.tokens[i + 1].starts_with("-")) {
            ADD_FAILURE() << c.where << ": `" << shown << "`: " << flag
                          << " takes a value and is shown without one";
          } else {
            const std::string value = c.tokens[++i];
            if (IsRepoPath(value)) {
              ++paths;
              EXPECT_TRUE(RepoPathExists(value)) << c.where << ": " << value << " does not exist";
            }
          }
        }
        continue;
      }
      if (IsRepoPath(t)) {
        ++paths;
        EXPECT_TRUE(RepoPathExists(t)) << c.where << ": " << t << " does not exist";
      }
      if (positional_seen || t.starts_with("-")) continue;
      const std::vector<std::string> subs = SubcommandsIn(help_of(path));
      if (subs.empty()) {
        positional_seen = true;
        continue;
      }
      // A subcommand, or alternatives of one ("submit/watch/fetch", "stake|unstake").
      std::string first;
      for (size_t a = 0, b; a <= t.size(); a = b + 1) {
        b = t.find_first_of("/|", a);
        if (b == std::string::npos) b = t.size();
        const std::string alt = t.substr(a, b - a);
        if (first.empty()) first = alt;
        EXPECT_NE(std::find(subs.begin(), subs.end(), alt), subs.end())
            << c.where << ": `" << shown << "`: `meshlearn " << path << "` has no subcommand "
            << alt;
      }
      path += (path.empty() ? "" : " ") + first;
    }
  };
  for (const std::string& rel : DocFiles()) {
    const std::string text = ReadText(MESHLEARN_SOURCE_DIR "/" + rel);
    ASSERT_FALSE(text.empty()) << rel;
    for (const DocCommand& c : DocCommands(rel, text)) check(c);
    // Every file of the repository a doc names: a whole code span that is a path, or a path
    // with an extension anywhere ("node/stage_step.h", "examples/fashion-mlp.toml").
    for (size_t at = 0; at < text.size(); ++at) {
      if (at > 0 && (std::isalnum(static_cast<unsigned char>(text[at - 1])) ||
                     std::string("/._~-").find(text[at - 1]) != std::string::npos))
        continue;
      size_t end = at;
      while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) ||
                                   std::string("/._+-").find(text[end]) != std::string::npos))
        ++end;
      std::string p = text.substr(at, end - at);
      while (!p.empty() && (p.back() == '.' || p.back() == '/')) p.pop_back();
      if (p.empty() || !IsRepoPath(p) || (end < text.size() && text[end] == '<')) continue;
      const bool whole_span =
          at > 0 && text[at - 1] == '`' && end < text.size() && text[end] == '`';
      const bool has_extension = p.rfind('.') != std::string::npos && p.rfind('.') > p.rfind('/');
      if (!whole_span && !has_extension) continue;
      ++paths;
      EXPECT_TRUE(RepoPathExists(p))
          << rel << ":" << 1 + std::count(text.begin(), text.begin() + at, '\n') << ": names " << p
          << ", which is not in the repository";
      at = end;
    }
  }
  // Every command's --help examples are docs too ("a && b" shows two commands).
  const size_t doc_commands = commands;
  std::vector<std::string> tree = {""};
  for (size_t k = 0; k < tree.size(); ++k) {
    for (const std::string& sub : SubcommandsIn(help_of(tree[k])))
      tree.push_back(tree[k] + (tree[k].empty() ? "" : " ") + sub);
  }
  for (const std::string& path : tree) {
    const std::string help = help_of(path);
    const size_t examples = help.find("Examples:");
    if (examples == std::string::npos) continue;
    std::istringstream lines(help.substr(examples));
    std::string line;
    while (std::getline(lines, line)) {
      for (size_t a = 0, b; a <= line.size(); a = b + 2) {
        b = line.find("&&", a);
        if (b == std::string::npos) b = line.size();
        std::vector<std::string> tokens = MeshlearnTokens(line.substr(a, b - a));
        if (!tokens.empty()) check({"meshlearn " + path + " --help", tokens, true});
      }
    }
  }
  EXPECT_GE(commands - doc_commands, 40u)
      << "examples found in the --help of " << tree.size() << " commands";
  commands = doc_commands;
  // A flag the docs show is shown by its command's --help examples too (house rule: --help shows
  // examples), but the global flags (--json, --home) and --rpc, which every command that talks to
  // a ledger takes.
  for (const auto& [command_flag, where] : doc_flags) {
    const auto& [path, flag] = command_flag;
    if (path.empty() || flag == "--rpc") continue;
    const std::string& help = help_of(path);
    const size_t examples = help.find("Examples:");
    bool shown = false;
    for (size_t at = help.find(flag, examples);
         examples != std::string::npos && !shown && at != std::string::npos;
         at = help.find(flag, at + 1)) {
      const size_t end = at + flag.size();
      shown = end == help.size() || !(std::isalnum(static_cast<unsigned char>(help[end])) ||
                                      help[end] == '-' || help[end] == '_');
    }
    EXPECT_TRUE(shown) << where << " shows `meshlearn " << path << " ... " << flag
                       << "`; no example of `meshlearn " << path << " --help` does:\n"
                       << help;
  }
  // The README is self-contained: it names no file outside the repository (an absolute path such
  // as /usr/share/..., or one under ~, would be one; an HTTP path such as /metrics is not a file).
  const std::string readme = ReadText(MESHLEARN_SOURCE_DIR "/README.md");
  for (size_t at = 0; at < readme.size(); ++at) {
    const bool token_start =
        at == 0 || std::string(" \n(`\"'").find(readme[at - 1]) != std::string::npos;
    const bool absolute = readme[at] == '/' && at + 1 < readme.size() &&
                          readme.find_first_of("/ \n`)", at + 1) != std::string::npos &&
                          readme[readme.find_first_of("/ \n`)", at + 1)] == '/';
    if (token_start && (absolute || readme.compare(at, 2, "~/") == 0)) {
      ADD_FAILURE() << "README.md:" << 1 + std::count(readme.begin(), readme.begin() + at, '\n')
                    << " names a path outside the repository: "
                    << readme.substr(at, readme.find_first_of(" \n`)", at) - at);
    }
  }
  // The docs show 219 commands naming 349 flags, the --help examples included, and 505 paths
  // (counted so that a parser that finds nothing fails).
  EXPECT_GE(commands, 150u);
  EXPECT_GE(flags, 150u);
  EXPECT_GE(paths, 100u);
  std::printf("checked %zu commands, %zu flags, %zu paths\n", commands, flags, paths);
}

// The README says what `bash scripts/run.sh` runs: that command line is the script's `exec
// "$bin" devnet ...` (its --out and "$@" aside), so the two cannot drift apart.
TEST(Cli, TheReadmeShowsTheDevnetCommandScriptsRunShRuns) {
  const std::string readme = ReadText(MESHLEARN_SOURCE_DIR "/README.md");
  const std::string lead = "`scripts/run.sh` runs `";
  const size_t at = readme.find(lead);
  ASSERT_NE(at, std::string::npos) << "README.md no longer says " << lead << "...`";
  std::string shown =
      readme.substr(at + lead.size(), readme.find('`', at + lead.size()) - at - lead.size());
  for (char& c : shown)
    if (c == '\n') c = ' ';
  std::string script = ReadText(MESHLEARN_SOURCE_DIR "/scripts/run.sh");
  for (size_t p; (p = script.find("\\\n")) != std::string::npos;) script.replace(p, 2, " ");
  std::vector<std::string> runs;
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("exec \"$bin\" devnet")) continue;
    runs = ShellTokens(line);
    runs.erase(runs.begin());  // exec
    runs.front() = "meshlearn";
  }
  ASSERT_FALSE(runs.empty()) << "scripts/run.sh has no `exec \"$bin\" devnet` line";
  std::erase(runs, "$@");
  const auto out = std::find(runs.begin(), runs.end(), "--out");
  if (out != runs.end()) runs.erase(out, out + 2);
  EXPECT_EQ(ShellTokens(shown), runs) << "README.md shows: " << shown;
}

// The body of the first ```toml block after `marker` in `text`; empty if there is none.
std::string TomlBlockAfter(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return "";
  const size_t open = text.find("```toml\n", at);
  if (open == std::string::npos) return "";
  const size_t body = open + 8;
  const size_t close = text.find("\n```", body);
  return close == std::string::npos ? "" : text.substr(body, close + 1 - body);
}

// The configuration the docs show is accepted as shown: operators.md's node.toml (`node init`
// checks every key) and diloco.md's [network] table (with examples/fashion-mlp.toml's engine
// tables, by `task submit --dry-run`). diloco.md once showed stages = 1 with a 5-bound cut,
// which every task file copying it was refused for.
TEST(Cli, TheConfigFilesTheDocsShowAreAccepted) {
  const std::string dir = TempHome();
  std::string node = TomlBlockAfter(ReadText(MESHLEARN_SOURCE_DIR "/docs/operators.md"),
                                    "`node.toml` (every key is checked");
  ASSERT_NE(node, "") << "docs/operators.md no longer shows node.toml";
  // Its data_dir (~/.meshlearn/node) becomes one of this test's.
  const size_t data_dir = node.find("data_dir = ");
  ASSERT_NE(data_dir, std::string::npos) << node;
  node.replace(data_dir, node.find('\n', data_dir) - data_dir, "data_dir = \"node-data\"");
  std::ofstream(dir + "/node.toml") << node;
  CmdResult init = Meshlearn("node init --config " + dir + "/node.toml", dir);
  EXPECT_EQ(init.code, 0) << node << init.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/node-data/keys/node.key.json")) << init.out;

  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good())
    GTEST_SKIP() << "Fashion-MNIST (dataset-fashion-mnist) not installed";
  const std::string network =
      TomlBlockAfter(ReadText(MESHLEARN_SOURCE_DIR "/docs/diloco.md"), "# Network tasks");
  ASSERT_NE(network.find("[network]"), std::string::npos) << "docs/diloco.md: " << network;
  std::string task = ReadText(MESHLEARN_SOURCE_DIR "/examples/fashion-mlp.toml");
  ASSERT_NE(task.find("\n[network]"), std::string::npos);
  task = task.substr(0, task.find("\n[network]") + 1) + network;
  std::ofstream(dir + "/diloco-network.toml") << task;
  // No ledger at --rpc: the checks run for the default chain parameters.
  CmdResult dry = Meshlearn(
      "task submit " + dir + "/diloco-network.toml --dry-run --rpc http://127.0.0.1:1", dir);
  EXPECT_EQ(dry.code, 0) << network << dry.out;
  EXPECT_NE(dry.out.find("is valid"), std::string::npos) << dry.out;
}

// Every section a doc or a --help sends the reader to by name (`docs/verification.md, "Rounds in
// flight"`, `submitters.md "Assurance"`) is there: a heading holding the name, or a paragraph led
// by it in bold or italics (`**Memory a node needs.**`). A renamed section fails here, not a
// reader.
TEST(Cli, EverySectionTheDocsNameExists) {
  std::map<std::string, std::string> docs;  // "docs/node.md" -> its text
  for (const std::string& rel : DocFiles()) docs[rel] = ReadText(MESHLEARN_SOURCE_DIR "/" + rel);
  auto has_section = [](const std::string& text, const std::string& name) {
    if (text.find("*" + name) != std::string::npos) return true;  // **Name.** or *Name*
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("#") && line.find(name) != std::string::npos) return true;
    }
    return false;
  };
  // Where references are: the docs, and every command's --help.
  std::map<std::string, std::string> texts = docs;
  const std::string home = TempHome();
  std::vector<std::string> tree = {""};
  for (size_t k = 0; k < tree.size(); ++k) {
    const std::string help = Meshlearn(tree[k] + (tree[k].empty() ? "" : " ") + "--help", home).out;
    texts["meshlearn " + tree[k] + (tree[k].empty() ? "" : " ") + "--help"] = help;
    for (const std::string& sub : SubcommandsIn(help))
      tree.push_back(tree[k] + (tree[k].empty() ? "" : " ") + sub);
  }
  size_t checked = 0;
  for (const auto& [rel, text] : texts) {
    for (size_t md = text.find(".md"); md != std::string::npos; md = text.find(".md", md + 1)) {
      size_t start = md;
      while (start > 0 && (std::islower(static_cast<unsigned char>(text[start - 1])) ||
                           text[start - 1] == '_' || text[start - 1] == '/'))
        --start;
      std::string target = text.substr(start, md + 3 - start);
      if (target == ".md") continue;
      if (!target.starts_with("docs/") && target != "README.md") target = "docs/" + target;
      size_t at = md + 3;
      if (at < text.size() && text[at] == ',') ++at;
      // One or more "Name" after it: `docs/x.md, "A", "B"`; a name may wrap a line.
      for (;;) {
        while (at < text.size() && (text[at] == ' ' || text[at] == '\n')) ++at;
        if (at >= text.size() || text[at] != '"') break;
        const size_t close = text.find('"', at + 1);
        if (close == std::string::npos) break;
        std::string name;
        for (size_t i = at + 1; i < close; ++i) {
          const char c = text[i] == '\n' ? ' ' : text[i];
          if (c != ' ' || (!name.empty() && name.back() != ' ')) name += c;
        }
        const size_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
        auto doc = docs.find(target);
        if (doc == docs.end()) {
          ADD_FAILURE() << rel << ":" << line << ": names " << target << ", which is not a doc";
          break;
        }
        ++checked;
        EXPECT_TRUE(has_section(doc->second, name))
            << rel << ":" << line << ": " << target << " has no section \"" << name << "\"";
        at = close + 1;
        if (at < text.size() && text[at] == ',') ++at;
      }
    }
  }
  // 115 references in the docs and 4 in --help when this test was written: a parser that finds
  // none fails.
  EXPECT_GE(checked, 100u);
}

// devnet --help names every adversary mode a node accepts (node/src/adversary.cc's kNames; each
// is accepted by --adversary: docs/operators.md, "Adversary modes").
TEST(Cli, DevnetHelpNamesEveryAdversaryMode) {
  CmdResult r = Meshlearn("devnet --help", TempHome());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* mode : {"lazy", "noisy", "wrong_data", "copy", "stale", "wrong_result",
                           "noisy_last", "targeted", "drift", "wrong_example", "rubber_stamp"}) {
    EXPECT_NE(r.out.find(mode), std::string::npos) << mode << " missing from:\n" << r.out;
  }
}

// `node run` with listen = "127.0.0.1:0" binds a free port itself (no port is picked, freed and
// handed to it, for another socket to take first): the ledger's record of the node carries the
// port it bound, the same one it reports in <data_dir>/listen.json, and it answers there. A fixed
// endpoint beside port 0 (the advertised port could not be the bound one), or 0.0.0.0:0 (the
// derived endpoint could not be dialed), is refused at start, naming the keys.
TEST(Cli, NodeRunOnPortZeroAnnouncesThePortItBound) {
  const std::string home = TempHome();
  const std::string config = home + "/node.toml";
  auto write_config = [&](const std::string& rpc, const std::string& listen,
                          const std::string& extra = "") {
    std::ofstream(config) << "data_dir = \"node\"\nrpc = \"" << rpc << "\"\nlisten = \"" << listen
                          << "\"\n"
                          << extra << "stake = 200\nheartbeat_blocks = 2\n"
                          << "[capabilities]\nthroughput = 1000000000\nmemory_bytes = 1073741824\n"
                          << "cores = 1\n";
  };
  write_config("http://127.0.0.1:1", "127.0.0.1:0", "endpoint = \"127.0.0.1:7801\"\n");
  CmdResult fixed = Meshlearn("node run --config " + config, home);
  EXPECT_EQ(fixed.code, 1) << fixed.out;
  EXPECT_NE(fixed.out.find(config + ": endpoint is \"127.0.0.1:7801\" while listen = "
                                    "\"127.0.0.1:0\""),
            std::string::npos)
      << fixed.out;
  write_config("http://127.0.0.1:1", "0.0.0.0:0");
  CmdResult any = Meshlearn("node run --config " + config, home);
  EXPECT_EQ(any.code, 1) << any.out;
  EXPECT_NE(any.out.find(config + ": listen is \"0.0.0.0:0\""), std::string::npos) << any.out;

  write_config("http://127.0.0.1:1", "127.0.0.1:0");  // node init does not call the ledger
  CmdResult init = Meshlearn("--json node init --config " + config, home);
  ASSERT_EQ(init.code, 0) << init.out;
  const std::string node_id = json::parse(init.out)["node_id"];
  ChainServer chain(home, "--fund " + node_id + "=1000000");
  ASSERT_FALSE(chain.url().empty()) << ReadText(home + "/serve.out");
  const std::string chain_addr = chain.url().substr(std::string("http://").size());
  write_config(chain.url(), "127.0.0.1:0");
  const std::string log = home + "/node.log";
  meshlearn::process_test::Child node(home, log, {"node", "run", "--config", config});
  const std::string bound = meshlearn::process_test::NodeEndpoint(node, home + "/node");
  ASSERT_FALSE(bound.empty()) << ReadText(log);
  ASSERT_EQ(bound.rfind("127.0.0.1:", 0), 0u) << bound;
  EXPECT_NE(bound, "127.0.0.1:0");
  // The ledger's record: registered at the bound port.
  std::string registered;
  for (int i = 0; i < 600 && registered.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto answer = meshlearn::process_test::HttpRequest(
        chain_addr, "/",
        R"({"jsonrpc":"2.0","id":1,"method":"list_nodes","params":{"limit":100}})");
    const json j = json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("result")) continue;
    for (const json& n : j["result"].value("items", json::array())) {
      if (n.value("id", "") == node_id && n.value("status", "") == "active") {
        registered = n.value("endpoint", "");
      }
    }
  }
  EXPECT_EQ(registered, bound) << ReadText(log);
  EXPECT_NE(ReadText(log).find("advertised as " + bound), std::string::npos) << ReadText(log);
  // It answers there.
  const auto metrics = meshlearn::process_test::HttpRequest(bound, "/metrics");
  EXPECT_EQ(metrics.status, 200) << metrics.headers;
  EXPECT_NE(metrics.body.find("meshlearn_node_chain_height"), std::string::npos) << metrics.body;
}

// `node run` declares the disk it offers to pipeline stage files (the ledger places stages by
// it): a limit above the free space of its data dir, from --disk-limit or node.toml's
// disk_limit_bytes, is refused at start, naming where it came from and the fix, before the node
// registers or benchmarks anything (the ledger here is not even running).
TEST(Cli, NodeRunRefusesADiskLimitAboveItsDataDirsFreeSpace) {
  const std::string home = TempHome();
  const std::string dir = meshlearn::process_test::TempDir("cli-node-disk");
  auto write_config = [&](const std::string& extra) {
    std::ofstream(dir + "/node.toml") << "data_dir = \"data\"\n"
                                      << "rpc = \"http://127.0.0.1:1\"\n"
                                      << "listen = \"127.0.0.1:0\"\n"
                                      << extra << "[capabilities]\n"
                                      << "throughput = 1000000000\n";
  };
  auto run = [&](const std::string& args, int seconds = 60) {
    return Shell("MESHLEARN_HOME=" + home + " timeout " + std::to_string(seconds) + " " +
                 MESHLEARN_BIN + " node run --config " + dir + "/node.toml " + args + " 2>&1");
  };
  const std::string huge = "4000000000000000000";  // 4 EB: more than any disk has free
  write_config("");
  CmdResult flag = run("--disk-limit " + huge);
  EXPECT_EQ(flag.code, 1) << flag.out;
  EXPECT_NE(flag.out.find("--disk-limit = " + huge + " bytes is more disk than the data dir"),
            std::string::npos)
      << flag.out;
  EXPECT_NE(flag.out.find("Lower --disk-limit to at most"), std::string::npos) << flag.out;
  // The largest value a user can type is a limit like any other (it once meant "not given" and
  // was ignored): refused too. A run that ignored it would go on until `timeout` (exit 124).
  const std::string most = "18446744073709551615";  // UINT64_MAX
  CmdResult most_flag = run("--disk-limit " + most, 10);
  EXPECT_EQ(most_flag.code, 1) << most_flag.out;
  EXPECT_NE(most_flag.out.find("--disk-limit = " + most + " bytes is more disk than the data dir"),
            std::string::npos)
      << most_flag.out;
  write_config("disk_limit_bytes = " + huge + "\n");
  CmdResult key = run("");
  EXPECT_EQ(key.code, 1) << key.out;
  EXPECT_NE(key.out.find("disk_limit_bytes (" + dir + "/node.toml) = " + huge), std::string::npos)
      << key.out;
  // The flag replaces the key: a limit the disk holds passes the check (the node then goes on to
  // its ledger, which is not there, until `timeout` stops it).
  CmdResult fits = run("--disk-limit 1048576", 5);
  EXPECT_EQ(fits.out.find("more disk than the data dir"), std::string::npos) << fits.out;
  EXPECT_NE(fits.out.find("disk for stage files: 1 MiB"), std::string::npos) << fits.out;
  // A restart after a crash: the stage files the last process left (256 MiB here) are deleted
  // before the free space is measured, as the agent would delete them at its start, so a limit
  // 128 MiB over what is free beside them fits (before, such a node failed the check on every
  // restart and never reached the agent that would have freed the space).
  const std::filesystem::path stages = std::filesystem::path(dir) / "data" / "stages";
  ASSERT_TRUE(std::filesystem::is_directory(stages.parent_path())) << "the node's data dir";
  std::filesystem::create_directories(stages);
  {
    std::ofstream left(stages / "checkpoint-left-by-a-crash.bin", std::ios::binary);
    const std::string mib(1 << 20, 'x');
    for (int i = 0; i < 256; ++i) left << mib;
    ASSERT_TRUE(left.good());
  }
  struct statvfs fs {};
  ASSERT_EQ(statvfs(stages.c_str(), &fs), 0);
  const uint64_t free_beside = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  CmdResult restart = run("--disk-limit " + std::to_string(free_beside + (128u << 20)), 5);
  EXPECT_EQ(restart.out.find("more disk than the data dir"), std::string::npos) << restart.out;
  EXPECT_NE(restart.out.find("disk for stage files"), std::string::npos) << restart.out;
  EXPECT_FALSE(std::filesystem::exists(stages / "checkpoint-left-by-a-crash.bin"));
}

TEST(Cli, VersionJson) {
  CmdResult r = Meshlearn("--json version", TempHome());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("git_commit"));
  EXPECT_TRUE(j.contains("cpu_features"));
}

TEST(Cli, BadLogLevelIsAUsageError) {
  CmdResult r = Meshlearn("--log-level loud version", TempHome());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("trace, debug, info"), std::string::npos) << r.out;
}

TEST(Cli, KeysLifecycle) {
  std::string home = TempHome();
  CmdResult created = Meshlearn("--json keys new alice --no-passphrase", home);
  ASSERT_EQ(created.code, 0) << created.out;
  std::string pk = nlohmann::json::parse(created.out)["public_key"];

  CmdResult dup = Meshlearn("keys new alice --no-passphrase", home);
  EXPECT_EQ(dup.code, 1);
  EXPECT_NE(dup.out.find("already exists"), std::string::npos);

  CmdResult list = Meshlearn("--json keys list", home);
  ASSERT_EQ(list.code, 0);
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["public_key"], pk);

  std::string backup = home + "/backup.json";
  ASSERT_EQ(Meshlearn("keys export alice " + backup, home).code, 0);
  std::string other = TempHome();
  CmdResult imp = Meshlearn("--json keys import " + backup, other);
  ASSERT_EQ(imp.code, 0) << imp.out;
  EXPECT_EQ(nlohmann::json::parse(imp.out)["public_key"], pk);

  CmdResult err = Meshlearn("--json keys show nobody", home);
  EXPECT_EQ(err.code, 1);
  EXPECT_TRUE(nlohmann::json::parse(err.out).contains("error"));
}

TEST(Cli, EncryptedKeyWithPassphraseFile) {
  std::string home = TempHome();
  std::string pass = home + "/pass.txt";
  FILE* f = fopen(pass.c_str(), "w");
  fputs("correct horse\n", f);
  fclose(f);
  CmdResult r = Meshlearn("--json keys new bob --passphrase-file " + pass, home);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["encrypted"], true);
}

uint64_t Balance(const std::string& who, const std::string& url, const std::string& home) {
  CmdResult r = Meshlearn("--json wallet balance " + who + " --rpc " + url + " 2>/dev/null", home);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? 0 : j.value("balance", uint64_t{0});
}

// One sequencer per chain directory: a second `chain serve` of a served directory is refused,
// naming the process that holds it and the fix (it once started beside the first and failed every
// block it produced on the database's unique height), and the first serves on.
TEST(Cli, ASecondChainServeOfTheSameDirectoryIsRefused) {
  std::string home = TempHome();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ChainServer server(home);
  ASSERT_FALSE(server.url().empty()) << "chain serve did not start";
  // Under `timeout`: without the lock the second server would serve on.
  CmdResult second = Shell("MESHLEARN_HOME=" + home + " timeout 30 " + MESHLEARN_BIN +
                           " chain serve --dir " + home + "/chain --listen 127.0.0.1:0 2>&1");
  EXPECT_EQ(second.code, 1) << second.out;
  EXPECT_NE(second.out.find("is already served by another `meshlearn chain serve` (pid "),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("stop that process first, or serve another --dir"), std::string::npos)
      << second.out;
  EXPECT_EQ(Balance("alice", server.url(), home), 1000000u);
}

// A send that timed out is retried by running the same command again: the wallet resends the
// very same signed transaction (kept in $MESHLEARN_HOME/outbox), so it is paid once. A different
// command is refused while it is unconfirmed; after a confirmed send, the same command pays again.
TEST(Cli, WalletRetryAfterTimeoutPaysOnce) {
  std::string home = TempHome();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).code, 0);
  ChainServer server(home);
  ASSERT_FALSE(server.url().empty()) << "chain serve did not start";
  const std::string rpc = " --rpc " + server.url();

  // --timeout 0: the wait ends at once, as a timeout would; the transaction waits in the outbox.
  CmdResult timed_out = Meshlearn("wallet transfer bob 100 --key alice --timeout 0" + rpc, home);
  EXPECT_EQ(timed_out.code, 1);
  EXPECT_NE(timed_out.out.find("Re-running this same command"), std::string::npos) << timed_out.out;
  EXPECT_TRUE(std::ifstream(home + "/outbox/alice.tx").good());

  CmdResult other = Meshlearn("wallet transfer bob 7 --key alice" + rpc, home);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("unconfirmed transaction"), std::string::npos) << other.out;

  CmdResult retry = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(retry.code, 0) << retry.out;
  EXPECT_NE(retry.out.find("resending the earlier"), std::string::npos) << retry.out;
  CmdResult again = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(again.code, 0) << again.out;  // a confirmed send left no outbox: a new payment
  EXPECT_EQ(Balance("bob", server.url(), home), 200u);
  EXPECT_FALSE(std::ifstream(home + "/outbox/alice.tx").good());
}

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// A tiny character-level GPT on the GPL text Debian's base-files installs.
std::string TinyLmTask(const std::string& extra = "") {
  return "[task]\nname = \"tiny-lm\"\nseed = 3\n"
         "[data]\nformat = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\n"
         "val_fraction = 0.1\n"
         "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
         "[train]\nsteps = 2\nbatch_size = 4\nseq_len = 16\neval_batches = 1\n" +
         extra;
}

// Regression (issue 12, report.json paths): a path inside a file is relative to that file's
// folder (docs/paths.md); report.json said "model": "rel/out/model.safetensors", relative to the
// working directory of `train`, which a reader resolving against the report's folder misses.
TEST(Cli, TrainReportNamesItsFilesRelativeToItself) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  std::ofstream(cwd + "/lm.toml") << TinyLmTask();
  CmdResult r = Shell("cd " + cwd + " && MESHLEARN_HOME=home " + MESHLEARN_BIN +
                      " --json train lm.toml --no-eval --out rel/out 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const json printed = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(printed.is_discarded()) << r.out;
  EXPECT_EQ(printed["model"], "rel/out/model.safetensors");  // stdout: the command line's paths
  const std::filesystem::path dir = cwd + "/rel/out";
  const json report = json::parse(ReadText(dir / "report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded());
  EXPECT_EQ(report["model"], "model.safetensors");
  EXPECT_EQ(report["checkpoint"], "checkpoint.safetensors");
  EXPECT_EQ(report["task_file"], "../../lm.toml");
  for (const char* key : {"model", "checkpoint", "task_file"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(dir / report[key].get<std::string>())) << key;
  }
  // An absolute --out: an absolute path means itself everywhere, the report's folder included.
  CmdResult abs = Meshlearn("train " + cwd + "/lm.toml --no-eval --out " + cwd + "/abs", cwd);
  ASSERT_EQ(abs.code, 0) << abs.out;
  const json abs_report = json::parse(ReadText(cwd + "/abs/report.json"), nullptr, false);
  ASSERT_FALSE(abs_report.is_discarded());
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(cwd + "/abs") /
                                               abs_report["model"].get<std::string>()));
}

// A small GPT's network task over the GPL's text, with `pipeline` appended to its [network]
// table, written to DIR/pipe.toml; returns that path.
std::string PipeTask(const std::string& dir, const std::string& pipeline) {
  std::ofstream(dir + "/pipe.toml")
      << "[task]\nname = \"pipe-lm\"\nseed = 3\n"
         "[data]\nformat = \"text\"\npath = \"/usr/share/common-licenses/GPL-3\"\n"
         "[model]\nkind = \"gpt\"\nn_layer = 3\nn_head = 2\nn_embd = 16\nblock_size = 16\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
         "[train]\nsteps = 2\nbatch_size = 4\nmicro_batches = 2\neval_batches = 1\n"
         "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\nbudget = 100000\n"
         "price_cap = 100\n"
      << pipeline;
  return dir + "/pipe.toml";
}

// `meshlearn diloco` reports its own peak resident memory (peak_rss_bytes): the single-node figure
// a devnet measures a pipeline's stage nodes against. A devnet spawns it while holding hundreds
// of MB itself, and wait4's ru_maxrss for the child counts those (the fork copies the parent's
// pages into the child's count, and exec keeps that peak): the devnet read 758-795 MB there for
// a child that peaked at 610 MB. This test's process plays the devnet.
TEST(Cli, DilocoReportsItsOwnPeakMemoryNotThatOfTheProcessThatSpawnedIt) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  const std::string task = PipeTask(cwd, "stages = 3\n");
  const std::string out = cwd + "/out";
  constexpr size_t kHeld = size_t{256} << 20;
  const std::string held(kHeld, 'x');  // resident: every page written
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MESHLEARN_HOME", cwd.c_str(), 1);
    FILE* quiet = freopen("/dev/null", "w", stdout);
    (void)quiet;
    dup2(fileno(stdout), fileno(stderr));
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "diloco", task.c_str(), "--out", out.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // What the devnet read before: this process's memory at the fork, not the child's.
  EXPECT_GE(static_cast<uint64_t>(ru.ru_maxrss) * 1024, uint64_t{held.size()});
  const json report = json::parse(ReadText(out + "/report.json"), nullptr, false);
  ASSERT_TRUE(report.is_object()) << ReadText(out + "/report.json");
  ASSERT_TRUE(report.contains("peak_rss_bytes")) << report.dump();
  const uint64_t peak = report["peak_rss_bytes"].get<uint64_t>();
  EXPECT_GT(peak, 0u);
  // The small GPT's run holds a few tens of MB: far below what its parent held.
  EXPECT_LT(peak, uint64_t{kHeld}) << report.dump();
}

// Issue 15: a pipeline task (network.stages > 1) is trained by `meshlearn diloco`, unsplit with
// its micro-batches (bit-equal to its stages: engine PipelineTest.*, node PipelineDilocoTest.*),
// which reports the cut; `task submit` checks the cut and takes the task for a chain that
// verifies (its stage units are checked as units are: docs/verification.md, "Pipeline stages").
TEST(Cli, PipelineTasksRunInDilocoAndSubmitChecksTheirCut) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string cwd = TempHome();
  auto task = [&](const std::string& pipeline) { return PipeTask(cwd, pipeline); };
  CmdResult d = Meshlearn("--json diloco " + task("stages = 3\n"), cwd, false);
  ASSERT_EQ(d.code, 0) << d.out;
  const json report = json::parse(d.out, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << d.out;
  EXPECT_EQ(report["pipeline"]["stages"], 3);
  EXPECT_EQ(report["pipeline"]["replicas"], 2);
  EXPECT_EQ(report["pipeline"]["micro_batches"], 2);
  EXPECT_EQ(report["pipeline"]["cut"], json::array({0, 1, 2, 3}));
  EXPECT_EQ(report["pipeline"]["per_stage"].size(), 3u);

  CmdResult submit = Meshlearn("task submit " + task("stages = 3\n") + " --dry-run", cwd);
  EXPECT_EQ(submit.code, 0) << submit.out;
  // Checked against the default chain, which verifies.
  EXPECT_NE(submit.out.find("is valid (SubmitTask's checks, for default chain parameters"),
            std::string::npos)
      << submit.out;
  EXPECT_NE(submit.out.find("memory a node needs: "), std::string::npos) << submit.out;
  // The memory needs the ledger places by: a whole unit's (the engine's estimate, in the params
  // SubmitTask carries), each stage's (all below it), and an aggregator's (the unit's, plus the
  // round's 2 replica deltas, weights and outer momentum).
  CmdResult dry =
      Meshlearn("--json task submit " + task("stages = 3\n") + " --dry-run", cwd, false);
  ASSERT_EQ(dry.code, 0) << dry.out;
  const json prepared = json::parse(dry.out, nullptr, false);
  ASSERT_FALSE(prepared.is_discarded()) << dry.out;
  const uint64_t unit = prepared["memory_bytes"].get<uint64_t>();
  const uint64_t model = prepared["model_bytes"].get<uint64_t>();
  EXPECT_EQ(prepared["params"]["memory_bytes"], unit);
  EXPECT_GT(unit, 4 * model) << "weights, gradients and two AdamW moments, and activations";
  ASSERT_EQ(prepared["stage_memory_bytes"].size(), 3u);
  for (const json& s : prepared["stage_memory_bytes"]) EXPECT_LT(s.get<uint64_t>(), unit);
  // What a step moves across each of the 2 boundaries, the placement's link cost
  // (engine::CutBoundaryBytes): (B, T, C) = (4, 16, 16) floats forward and as many back.
  EXPECT_EQ(prepared["params"]["stage_boundary_bytes"], json::array({8192, 8192}));
  // protocol::AggregatorMemoryBytes: the evaluator it evaluates with (params.eval_memory_bytes:
  // the weights and one evaluation forward, not a whole unit's gradients and moments), 2 replicas'
  // deltas, the state and 3 for the largest transient.
  const uint64_t eval = prepared["params"]["eval_memory_bytes"].get<uint64_t>();
  EXPECT_GT(eval, model);
  EXPECT_LT(eval, unit) << "a unit adds gradients and two AdamW moments";
  EXPECT_EQ(prepared["aggregator_memory_bytes"], eval + (2 + 5) * model);
  EXPECT_NE(submit.out.find("memory a node needs: " + std::to_string(unit) +
                            " bytes for a whole unit, stages "),
            std::string::npos)
      << submit.out;
  CmdResult bad_cut =
      Meshlearn("task submit " + task("stages = 3\ncut = [0, 2, 2, 3]\n") + " --dry-run", cwd);
  EXPECT_NE(bad_cut.out.find("network.cut bound 2 (2) must be greater than bound 1 (2)"),
            std::string::npos)
      << bad_cut.out;
  CmdResult too_many = Meshlearn("diloco " + task("stages = 4\n"), cwd);
  EXPECT_NE(too_many.code, 0);
  EXPECT_NE(too_many.out.find("pipe.toml: network.stages: stages (4) must be between 1 and the 3 "
                              "blocks (model.n_layer)"),
            std::string::npos)
      << too_many.out;
}

// A .npy file (format 1.0) of `descr` ("<f4", "|u1") and `shape` ("(8, 4)") holding `data`.
void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              const std::string& data) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h.push_back(' ');
  h.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  std::ofstream(path, std::ios::binary) << out << h << data;
}

// A sequential model's cut as a task file gives it: a stage of only a relu holds no parameters,
// trains nothing, and its disputes could only go to a trusted key, so `task submit` refuses it,
// naming the stage, its layers and a cut that works; the cut chosen when network.cut is left out
// holds parameters in every stage, and more stages than the model has layers with parameters are
// refused (docs/submitters.md, "Micro-batches and pipeline stages").
TEST(Cli, TaskSubmitRefusesACutWithAStageWithoutParameters) {
  const std::string base = TempHome();
  const std::string zeros(16 * 4 * 4, '\0');
  WriteNpy(base + "/train_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/train_y.npy", "|u1", "(16,)", std::string(16, '\0'));
  WriteNpy(base + "/test_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/test_y.npy", "|u1", "(16,)", std::string(16, '\1'));
  auto task = [&](const std::string& pipeline) {
    std::ofstream(base + "/mlp.toml")
        << "[task]\nname = \"mlp-cut\"\nseed = 5\n"
           "[data]\nformat = \"npy\"\ntrain_x = \"train_x.npy\"\ntrain_y = \"train_y.npy\"\n"
           "test_x = \"test_x.npy\"\ntest_y = \"test_y.npy\"\n"
           "[model]\ninput = [4]\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 8\n[[model.layers]]\nkind = \"relu\"\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 8\n[[model.layers]]\nkind = \"relu\"\n"
           "[[model.layers]]\nkind = \"linear\"\nout = 3\n"
           "[optimizer]\nkind = \"adamw\"\nlr = 1e-3\n"
           "[train]\nsteps = 2\nbatch_size = 4\neval_batch_size = 16\neval_batches = 1\n"
           "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\nbudget = 100000\n"
           "price_cap = 100\n"
        << pipeline;
    return base + "/mlp.toml";
  };
  CmdResult lone =
      Meshlearn("task submit " + task("stages = 3\ncut = [0, 1, 2, 5]\n") + " --dry-run", base);
  EXPECT_NE(lone.code, 0);
  EXPECT_NE(lone.out.find("mlp.toml: network.cut: stage 1 holds layers [1, 2) (model.layers[1] "
                          "(relu)), none with parameters"),
            std::string::npos)
      << lone.out;
  EXPECT_NE(lone.out.find("move a bound so that stage 1 holds a layer with parameters"),
            std::string::npos)
      << lone.out;
  EXPECT_EQ(lone.out.find("mlp.toml: " + base + "/mlp.toml"), std::string::npos)
      << "the file named once: " << lone.out;
  CmdResult chosen = Meshlearn("task submit " + task("stages = 3\n") + " --dry-run", base);
  EXPECT_EQ(chosen.code, 0) << chosen.out;
  CmdResult four = Meshlearn("task submit " + task("stages = 4\n") + " --dry-run", base);
  EXPECT_NE(four.code, 0);
  EXPECT_NE(four.out.find("mlp.toml: network.stages: stages (4) must be at most the 3 layers "
                          "with parameters of the model"),
            std::string::npos)
      << four.out;
}

// Regression (issue 12 item 8): the metric a command shows is decided by the task's kind (its
// spec, from the bundle), not guessed from the numbers. Before, "no round reported accuracy" meant
// "a language model": a classifier whose test accuracy is exactly 0 was shown with a perplexity
// and no accuracy. A language model shows its loss and perplexity and never a "test accuracy"
// (status, watch, fetch, devnet's report.json); the classifier shows its accuracy, even 0.
TEST(Cli, TheMetricShownIsTheTasksKind) {
  if (!std::ifstream("/usr/share/common-licenses/GPL-3").good()) {
    GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 (base-files) not installed";
  }
  const std::string base = TempHome();
  const std::string net =
      "[network]\nrounds = 1\nunits_per_round = 2\ninner_steps = 2\n"
      "aggregation = \"mean\"\nbudget = 100000\nprice_cap = 100\n";
  std::ofstream(base + "/lm.toml") << TinyLmTask(net);
  // The classifier: every training label 0, every test label 1, all inputs 0, so only the
  // biases learn and every test sample is predicted 0: test accuracy exactly 0.
  const std::string zeros(16 * 4 * 4, '\0');
  WriteNpy(base + "/train_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/train_y.npy", "|u1", "(16,)", std::string(16, '\0'));
  WriteNpy(base + "/test_x.npy", "<f4", "(16, 4)", zeros);
  WriteNpy(base + "/test_y.npy", "|u1", "(16,)", std::string(16, '\1'));
  std::ofstream(base + "/zero.toml")
      << "[task]\nname = \"zero-acc\"\nseed = 5\n"
         "[data]\nformat = \"npy\"\ntrain_x = \"train_x.npy\"\ntrain_y = \"train_y.npy\"\n"
         "test_x = \"test_x.npy\"\ntest_y = \"test_y.npy\"\n"
         "[model]\ninput = [4]\n[[model.layers]]\nkind = \"linear\"\nout = 3\n"
         "[optimizer]\nkind = \"adamw\"\nlr = 1.0\n"
         "[train]\nsteps = 2\nbatch_size = 4\neval_batch_size = 16\neval_batches = 1\n"
      << net;

  const std::string dir = base + "/d";
  const std::string log = base + "/devnet.out";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("MESHLEARN_HOME", (base + "/devnet-home").c_str(), 1);
    FILE* f = freopen(log.c_str(), "w", stderr);
    FILE* o = freopen("/dev/null", "w", stdout);
    (void)f, (void)o;
    execl(MESHLEARN_BIN, MESHLEARN_BIN, "devnet", "--solvers", "2", "--task",
          (base + "/lm.toml").c_str(), "--block-interval-ms", "200", "--keep",
          "--no-check-reference", "--no-verification", "--timeout", "300", "--out", dir.c_str(),
          (char*)nullptr);
    _exit(127);
  }
  struct Stop {  // the devnet goes down whatever this test does
    pid_t pid;
    ~Stop() {
      if (pid > 0) kill(pid, SIGINT), waitpid(pid, nullptr, 0);
    }
  } stop{pid};
  const std::string port = WaitFor(log, "ledger at http://127.0.0.1:", "0123456789", 90);
  ASSERT_FALSE(port.empty()) << ReadText(log);
  const std::string rpc = " --rpc http://127.0.0.1:" + port;
  ASSERT_FALSE(WaitFor(log, "the network stays up", "", 240).empty()) << ReadText(log);
  const std::string user = base + "/user";  // a fresh home: the bundle comes from the nodes

  const json report = json::parse(ReadText(dir + "/report.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << ReadText(log);
  const std::string lm = report["task_id"];
  EXPECT_TRUE(report["metric"].contains("test_perplexity")) << report["metric"];
  EXPECT_FALSE(report["metric"].contains("test_accuracy")) << report["metric"];

  CmdResult st = Meshlearn("--json task status " + lm.substr(0, 12) + rpc, user, false);
  ASSERT_EQ(st.code, 0) << st.out;
  const json t = json::parse(st.out, nullptr, false);
  ASSERT_FALSE(t.is_discarded()) << st.out;
  EXPECT_TRUE(t["metric"].contains("test_loss")) << t["metric"];
  EXPECT_TRUE(t["metric"].contains("test_perplexity")) << t["metric"];
  EXPECT_FALSE(t["metric"].contains("test_accuracy")) << t["metric"];
  CmdResult human = Meshlearn("task status " + lm.substr(0, 12) + rpc, user);
  ASSERT_EQ(human.code, 0) << human.out;
  EXPECT_TRUE(Has(human.out, "round   0: test loss ")) << human.out;
  EXPECT_TRUE(Has(human.out, ", perplexity ")) << human.out;
  EXPECT_FALSE(Has(human.out, "accuracy")) << human.out;
  EXPECT_FALSE(Has(human.out, "test acc")) << human.out;
  EXPECT_FALSE(Has(human.out, "warning")) << human.out;
  CmdResult watch = Meshlearn("task watch " + lm.substr(0, 12) + rpc, user);
  ASSERT_EQ(watch.code, 0) << watch.out;
  EXPECT_TRUE(Has(watch.out, "finished: test loss ")) << watch.out;
  EXPECT_FALSE(Has(watch.out, "accuracy")) << watch.out;
  // Fetched from the test's folder with a relative --out: report.json names the model relative
  // to its own folder, as every path inside a file (docs/paths.md).
  CmdResult fetch = Shell("cd " + base + " && MESHLEARN_HOME=" + user + " " + MESHLEARN_BIN +
                          " task fetch " + lm.substr(0, 12) + " --out lm-out" + rpc + " 2>&1");
  ASSERT_EQ(fetch.code, 0) << fetch.out;
  EXPECT_TRUE(Has(fetch.out, "test loss ")) << fetch.out;
  EXPECT_TRUE(Has(fetch.out, "perplexity")) << fetch.out;
  EXPECT_FALSE(Has(fetch.out, "accuracy")) << fetch.out;
  const json fetched = json::parse(ReadText(base + "/lm-out/report.json"), nullptr, false);
  ASSERT_FALSE(fetched.is_discarded());
  EXPECT_FALSE(fetched["metric"].contains("test_accuracy")) << fetched["metric"];
  EXPECT_EQ(fetched["model"], "model.safetensors");
  EXPECT_TRUE(std::filesystem::is_regular_file(base + "/lm-out/model.safetensors"));

  // The zero-accuracy classifier, on the same network, from the devnet's submitter.
  const std::string submitter = dir + "/home";
  CmdResult sub = Meshlearn("--json task submit " + base + "/zero.toml --key submitter" + rpc,
                            submitter, false);
  ASSERT_EQ(sub.code, 0) << sub.out;
  const std::string zero = json::parse(sub.out)["task_id"];
  CmdResult zwatch =
      Meshlearn("--json task watch " + zero.substr(0, 12) + " --timeout 200" + rpc, user, false);
  ASSERT_EQ(zwatch.code, 0) << zwatch.out;
  std::istringstream lines(zwatch.out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  const json zfin = json::parse(last, nullptr, false);
  ASSERT_FALSE(zfin.is_discarded()) << zwatch.out;
  ASSERT_EQ(zfin["status"], "finished") << last;
  ASSERT_EQ(zfin["round_results"][0]["test_accuracy_ppm"], 0) << last;  // the premise
  EXPECT_EQ(zfin["metric"]["test_accuracy"], 0.0) << zfin["metric"];
  EXPECT_FALSE(zfin["metric"].contains("test_perplexity")) << zfin["metric"];
  CmdResult zst = Meshlearn("task status " + zero.substr(0, 12) + rpc, user);
  ASSERT_EQ(zst.code, 0) << zst.out;
  EXPECT_TRUE(Has(zst.out, "round   0: test accuracy 0.0000, loss ")) << zst.out;
  EXPECT_FALSE(Has(zst.out, "perplexity")) << zst.out;
}

}  // namespace
