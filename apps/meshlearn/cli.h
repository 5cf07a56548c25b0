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

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "meshlearn/base/home_layout.h"
#include "meshlearn/base/status.h"

namespace meshlearn::ledger {
class RpcClient;
}

namespace meshlearn::cli {

struct GlobalOptions {
  bool json = false;
  std::string log_level = "info";
  // Where keys and local state live unless a command says otherwise. $MESHLEARN_HOME or
  // ~/.meshlearn.
  std::string home;
  int exit_code = 0;

  // The home's files (home_layout.h): the same layout as a node's data_dir.
  HomeLayout Home() const { return HomeLayout(home); }
  std::string KeysDir() const { return Home().KeysDir(); }

  // Records a command's outcome: prints the error (human or JSON) if not OK.
  void Exit(const Status& s);
  // Prints `j` if --json, else calls `human`. Then records success.
  void Output(const nlohmann::json& j, const std::function<void()>& human);
};

using CommandAdder = void (*)(CLI::App& root, GlobalOptions& g);

// Registers a command adder; called from static initialisers via MESHLEARN_COMMAND.
bool RegisterCommand(int order, CommandAdder adder);
// Adds every registered command to `root`, then applies the CLI-wide rules to all of them:
// every integer option (CLI11 type INT or UINT: amounts, fees, stakes, prices, counts) takes
// only a plain decimal integer in its type's range (see PlainUnsigned), and --help shows flags
// without CLI11's "{false}" marks.
void AddAllCommands(CLI::App& root, GlobalOptions& g);

// ---- Integers from the command line.
//
// CLI11 reads an unsigned option with strtoull(s, 0): "-5" wraps to 2^64-5, "0x10" is hex, "010"
// is octal and an overflow clamps to 2^64-1. meshlearn takes token amounts from the command line,
// so every integer is a plain decimal: digits only (a leading '-' for signed options), in range.
// AddAllCommands applies these to every INT/UINT option of every command; an option declared
// otherwise (a std::string parsed later, or a custom type_name) calls ParseUnsigned itself.
//
//   cmd->add_option("--fee", fee)->transform(PlainUnsigned());   // not needed: automatic
//   ML_ASSIGN_OR_RETURN(uint64_t amount, ParseUnsigned(text, "--fund alice=AMOUNT"));
//
// `what` names the input in the error: "--fee: '-1' is not a plain non-negative integer ..." (no
// name when empty: CLI11 puts the option's name in front of a validator's message).
//
// No integer option of meshlearn takes a negative number (counts, amounts, times, seeds; a -1
// default means "not given" and is never typed): a signed option refuses one ("--replicas: '-1'
// is negative; ..."), unless declared with OwnRange, for an option whose command checks its range
// itself with a message that names it (`generate --tokens must be >= 1, got -3`).
//
//   OwnRange(cmd->add_option("--tokens", tokens, "..."));
CLI::Option* OwnRange(CLI::Option* opt);
// Where `meshlearn node run` says which address it bound, once its server listens:
// {"pid": ..., "listen": "host:port", "endpoint": "host:port"}, written atomically after the bind
// (a parent that started the node with `listen = "host:0"` reads the port from it; it checks pid:
// a file left by an earlier run names another). docs/operators.md.
inline std::string NodeListenFile(const std::string& data_dir) {
  return JoinPath(data_dir, "listen.json");
}

Result<uint64_t> ParseUnsigned(std::string_view text, std::string_view what);
Result<int64_t> ParseSigned(std::string_view text, std::string_view what);
// CLI11 validators that refuse anything else and rewrite the value in canonical decimal (so
// CLI11's own base-0 conversion never sees "010").
CLI::Validator PlainUnsigned();
CLI::Validator PlainSigned();

// `reason` with `context: ` in front, unless it already starts with it (the ledger's receipt
// reasons already name their transaction: "leave node: node ... already left").
std::string WithContext(std::string_view context, const std::string& reason);

// ---- Answers from a ledger's JSON-RPC API.
//
// An endpoint may be wrong, old or hostile: its answers are checked before use, and a wrong shape
// is an error that names the endpoint and the method, never an exception:
//
//   ML_ASSIGN_OR_RETURN(json st, rpc.Call("chain_status", json::object()));
//   ML_RETURN_IF_ERROR(CheckRpcAnswer(st, {rpc.url(), "chain_status"},
//                                     {{"height", JsonKind::kUnsigned, true},
//                                      {"chain_id", JsonKind::kString, true}}));
//   st.value("height", uint64_t{0});   // now safe
enum class JsonKind { kString, kUnsigned, kInteger, kNumber, kBool, kObject, kArray, kAny };
struct JsonField {
  const char* name;
  JsonKind kind;
  bool required = false;
  bool nullable = false;  // null is allowed (e.g. next_cursor at the last page)
};
struct RpcWhere {
  std::string url;
  std::string method;  // "account_history", or "account_history (items[3].receipt)"
};
// OK if `answer` is an object whose listed fields have their kinds (required ones present).
Status CheckRpcAnswer(const nlohmann::json& answer, const RpcWhere& where,
                      std::initializer_list<JsonField> fields);
// The error CheckRpcAnswer gives, for callers with checks of their own.
Status MalformedAnswer(const RpcWhere& where, const std::string& what);

// ---- Ids a user types.
//
// The CLI prints ids (tasks, nodes, transactions) as their first 12 hex digits; every command that
// takes an id takes the whole id or any unique prefix of it, resolved by this one function:
//
//   ML_ASSIGN_OR_RETURN(std::string hex, ResolveIdPrefix("task", typed, "on " + rpc.url(),
//       [&](const IdVisitor& each) { return ForEachListedId(rpc, "list_tasks", {}, each); }));
//
// `typed` must be 1..64 hex digits (CheckIdText); 64 are returned as they are (lowercase) without
// calling `candidates`. Otherwise `candidates` is called with a visitor for every full id there is
// (duplicates are fine) and the one id that starts with `typed` is returned. No match ("task id:
// no task on http://... has an id starting with 3fa") or several ("task id: 2 tasks have ids
// starting with 3fa (on http://...); type more of the id:" and the ids, up to 10) is an error.
// `noun` names the kind ("task", "node", "transaction"); `where` where the candidates come from.
using IdVisitor = std::function<void(const std::string& full_id)>;
Result<std::string> ResolveIdPrefix(std::string_view noun, const std::string& typed,
                                    const std::string& where,
                                    const std::function<Status(const IdVisitor&)>& candidates);
// The syntax ResolveIdPrefix wants: 1..64 hex digits. Errors name `what` ("task id").
Status CheckIdText(std::string_view what, const std::string& typed);
// Pages through a paged ledger list method (list_tasks, list_nodes, account_history with
// `params` {"address": ...}) and calls `each` with every item's "id".
Status ForEachListedId(ledger::RpcClient& rpc, const std::string& method,
                       const nlohmann::json& params, const IdVisitor& each);

// Writes `report` to the file `path` (atomically, pretty-printed) with the paths under
// `path_keys` (top-level keys whose values are paths as the command line gives them, relative to
// the working directory or absolute) written for that file: relative to its folder, the rule for
// every path inside a file (docs/paths.md; PathForFile). So out/devnet/report.json says
// "model": "model.safetensors", which a reader resolves against out/devnet/ from any directory.
// What the command prints (--json on stdout) keeps the command line's paths.
Status WriteReportFile(const std::string& path, const nlohmann::json& report,
                       std::initializer_list<const char*> path_keys);

// Reads a passphrase: from --passphrase-file if given, else $MESHLEARN_PASSPHRASE, else by
// prompting on the terminal without echo (twice when `confirm`), else empty (no encryption).
Result<std::string> ReadPassphrase(const std::string& passphrase_file, bool confirm,
                                   bool allow_prompt);

// Blocks `signals` in the calling thread, and so in every thread it starts afterwards, and returns
// them as a set: a long-running command (chain serve, node run) then waits for them with sigwait
// in its main thread instead of a signal handler.
sigset_t BlockSignalsForSigwait(std::initializer_list<int> signals);

// The peak resident memory of live process `pid` (VmHWM of /proc/PID/status: its own address
// space's peak since it last exec'd), or 0 when it cannot be read. A process measures itself
// with getpid(): getrusage's ru_maxrss, and wait4's for a child, would also count the memory of
// the process that forked it (exec keeps the forked address space's peak in ru_maxrss).
uint64_t PeakRssBytes(pid_t pid);

}  // namespace meshlearn::cli

#define MESHLEARN_COMMAND(order, adder) \
  static const bool ML_CONCAT_(ml_command_registered_, __LINE__) = \
      ::meshlearn::cli::RegisterCommand(order, adder)
