// Shared plumbing of the `meshlearn` binary: global flags, command registration, output.
//
// A command lives in its own file apps/meshlearn/cmd_<name>.cc and registers itself:
//
//   static void AddFoo(CLI::App& root, GlobalOptions& g) {
//     CLI::App* cmd = root.add_subcommand("foo", "Does foo")->alias(...);
//     cmd->footer("Examples:\n  meshlearn foo --bar 3\n");
//     auto* bar = new int(0);  // options outlive this function: own them statically or via
//     cmd->add_option("--bar", *bar, "...");   // a struct captured by the callback
//     cmd->callback([&g, bar] { g.Exit(RunFoo(g, *bar)); });
//   }
//   MESHLEARN_COMMAND(50, AddFoo);   // 50: position in --help
//
// Commands print human text by default and one JSON document with --json (on stdout). Errors go
// to stderr as "error: <message>" (or {"error":{...}} with --json) and give exit code 1
// (2 for usage errors, from CLI11).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "meshlearn/base/status.h"

namespace meshlearn::cli {

struct GlobalOptions {
  bool json = false;
  std::string log_level = "info";
  // Where keys and local state live unless a command says otherwise. $MESHLEARN_HOME or
  // ~/.meshlearn.
  std::string home;
  int exit_code = 0;

  std::string KeysDir() const;

  // Records a command's outcome: prints the error (human or JSON) if not OK.
  void Exit(const Status& s);
  // Prints `j` if --json, else calls `human`. Then records success.
  void Output(const nlohmann::json& j, const std::function<void()>& human);
};

using CommandAdder = void (*)(CLI::App& root, GlobalOptions& g);

// Registers a command adder; called from static initialisers via MESHLEARN_COMMAND.
bool RegisterCommand(int order, CommandAdder adder);
void AddAllCommands(CLI::App& root, GlobalOptions& g);

// Reads a passphrase: from --passphrase-file if given, else $MESHLEARN_PASSPHRASE, else by
// prompting on the terminal without echo (twice when `confirm`), else empty (no encryption).
Result<std::string> ReadPassphrase(const std::string& passphrase_file, bool confirm,
                                   bool allow_prompt);

}  // namespace meshlearn::cli

#define MESHLEARN_COMMAND(order, adder) \
  static const bool ML_CONCAT_(ml_command_registered_, __LINE__) = \
      ::meshlearn::cli::RegisterCommand(order, adder)
