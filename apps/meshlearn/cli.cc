#include "meshlearn/cli.h"

#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/ledger/rpc_client.h"

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

namespace {

// CLI11 shows a flag declared "--check-reference,!--no-check-reference" as
// "--check-reference, --no-check-reference{false}": the value the negated name stores, which
// reads as a default and contradicts a description saying "default on". A flag's names are
// shown alone; its description says what it does and what the default is.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    if (is_positional || opt->get_expected_max() != 0) {
      return CLI::Formatter::make_option_name(opt, is_positional);
    }
    std::vector<std::string> names;
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    if (names.empty()) return CLI::Formatter::make_option_name(opt, is_positional);
    return CLI::detail::join(names);
  }
};

std::set<const CLI::Option*>& OwnRangeOptions() {
  static std::set<const CLI::Option*> options;
  return options;
}

void ApplyCliRules(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    if (opt->get_expected_max() == 0) continue;  // a flag
    const std::string type = opt->get_type_name();
    if (type.rfind("UINT", 0) == 0) {
      opt->transform(CLI::Validator(
          [](std::string& v) -> std::string {
            Result<uint64_t> n = ParseUnsigned(v, "");
            if (!n.ok()) return n.status().message();
            v = std::to_string(*n);
            return std::string();
          },
          ""));
    } else if (type.rfind("INT", 0) == 0) {
      const bool own_range = OwnRangeOptions().count(opt) > 0;
      opt->transform(CLI::Validator(
          [own_range](std::string& v) -> std::string {
            Result<int64_t> n = ParseSigned(v, "");
            if (!n.ok()) return n.status().message();
            if (*n < 0 && !own_range) {
              return "'" + v + "' is negative; this option takes 0 or more";
            }
            v = std::to_string(*n);
            return std::string();
          },
          ""));
    }
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) ApplyCliRules(sub);
}

}  // namespace

CLI::Option* OwnRange(CLI::Option* opt) {
  OwnRangeOptions().insert(opt);
  return opt;
}

void AddAllCommands(CLI::App& root, GlobalOptions& g) {
  // Subcommands copy their parent's formatter when they are added: set it first.
  root.formatter(std::make_shared<HelpFormatter>());
  auto r = Registry();
  std::stable_sort(r.begin(), r.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, adder] : r) adder(root, g);
  ApplyCliRules(&root);
}

Result<uint64_t> ParseUnsigned(std::string_view text, std::string_view what) {
  const std::string quoted =
      (what.empty() ? "" : std::string(what) + ": ") + "'" + std::string(text) + "'";
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits) {
    return InvalidArgument(quoted + " is not a plain non-negative integer; write decimal digits "
                           "only (0 to 18446744073709551615), no sign, exponent or separators");
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) {
    return InvalidArgument(quoted + " is out of range: the largest is 18446744073709551615");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument(quoted + " is not a plain non-negative integer");
  }
  return v;
}

Result<int64_t> ParseSigned(std::string_view text, std::string_view what) {
  const std::string quoted =
      (what.empty() ? "" : std::string(what) + ": ") + "'" + std::string(text) + "'";
  std::string_view body = text;
  if (!body.empty() && body.front() == '-') body.remove_prefix(1);
  const bool digits = !body.empty() && std::all_of(body.begin(), body.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits) {
    return InvalidArgument(quoted + " is not a plain integer; write decimal digits only (an "
                           "optional leading '-'), no exponent or separators");
  }
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) {
    return InvalidArgument(quoted + " is out of range: -9223372036854775808 to "
                           "9223372036854775807");
  }
  if (ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument(quoted + " is not a plain integer");
  }
  return v;
}

CLI::Validator PlainUnsigned() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        Result<uint64_t> n = ParseUnsigned(v, "");
        if (!n.ok()) return n.status().message();
        v = std::to_string(*n);
        return std::string();
      },
      "");
}

CLI::Validator PlainSigned() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        Result<int64_t> n = ParseSigned(v, "");
        if (!n.ok()) return n.status().message();
        v = std::to_string(*n);
        return std::string();
      },
      "");
}

std::string WithContext(std::string_view context, const std::string& reason) {
  const std::string prefix = std::string(context) + ": ";
  if (reason.rfind(prefix, 0) == 0) return reason;
  return prefix + reason;
}

namespace {

const char* KindName(JsonKind k) {
  switch (k) {
    case JsonKind::kString: return "a string";
    case JsonKind::kUnsigned: return "a non-negative integer";
    case JsonKind::kInteger: return "an integer";
    case JsonKind::kNumber: return "a number";
    case JsonKind::kBool: return "a boolean";
    case JsonKind::kObject: return "an object";
    case JsonKind::kArray: return "an array";
    case JsonKind::kAny: return "a value";
  }
  return "a value";
}

bool HasKind(const nlohmann::json& v, JsonKind k) {
  switch (k) {
    case JsonKind::kString: return v.is_string();
    case JsonKind::kUnsigned: return v.is_number_unsigned();
    case JsonKind::kInteger:  // read as int64_t: an unsigned value past INT64_MAX would wrap
      return v.is_number_integer() &&
             (!v.is_number_unsigned() ||
              v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    case JsonKind::kNumber: return v.is_number();
    case JsonKind::kBool: return v.is_boolean();
    case JsonKind::kObject: return v.is_object();
    case JsonKind::kArray: return v.is_array();
    case JsonKind::kAny: return true;
  }
  return false;
}

// A short rendering of a bad value for the error message.
std::string Excerpt(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

Status MalformedAnswer(const RpcWhere& where, const std::string& what) {
  return DataLoss("the ledger at " + where.url + " answered " + where.method +
                  " with a malformed result: " + what);
}

Status CheckRpcAnswer(const nlohmann::json& answer, const RpcWhere& where,
                      std::initializer_list<JsonField> fields) {
  if (!answer.is_object()) {
    return MalformedAnswer(where, "expected an object, got " + Excerpt(answer));
  }
  for (const JsonField& f : fields) {
    auto it = answer.find(f.name);
    if (it == answer.end()) {
      if (f.required) return MalformedAnswer(where, std::string("field '") + f.name + "' is missing");
      continue;
    }
    if (it->is_null() && f.nullable) continue;
    if (!HasKind(*it, f.kind)) {
      return MalformedAnswer(where, std::string("field '") + f.name + "' should be " +
                                        KindName(f.kind) + ", got " + Excerpt(*it));
    }
  }
  return Status::Ok();
}

Status CheckIdText(std::string_view what, const std::string& typed) {
  if (typed.empty() || typed.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return InvalidArgument(std::string(what) +
                           ": expected hex digits (the id, or any unique prefix of it), got '" +
                           typed + "'");
  }
  if (typed.size() > 64) {
    return InvalidArgument(std::string(what) + ": expected at most 64 hex digits, got " +
                           std::to_string(typed.size()));
  }
  return Status::Ok();
}

Result<std::string> ResolveIdPrefix(std::string_view noun, const std::string& typed,
                                    const std::string& where,
                                    const std::function<Status(const IdVisitor&)>& candidates) {
  const std::string what = std::string(noun) + " id";
  ML_RETURN_IF_ERROR(CheckIdText(what, typed));
  std::string want = typed;
  for (char& c : want) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (want.size() == 64) return want;
  std::vector<std::string> matches;
  ML_RETURN_IF_ERROR(candidates([&](const std::string& full) {
    if (full.size() == 64 && full.rfind(want, 0) == 0 &&
        std::find(matches.begin(), matches.end(), full) == matches.end()) {
      matches.push_back(full);
    }
  }));
  if (matches.empty()) {
    return NotFound(what + ": no " + std::string(noun) + " " + where + " has an id starting with " +
                    want);
  }
  if (matches.size() > 1) {
    std::string names;
    for (size_t i = 0; i < matches.size() && i < 10; ++i) names += "\n  " + matches[i];
    if (matches.size() > 10) names += "\n  ... (" + std::to_string(matches.size()) + " in all)";
    return InvalidArgument(what + ": " + std::to_string(matches.size()) + " " + std::string(noun) +
                           "s have ids starting with " + want + " (" + where +
                           "); type more of the id:" + names);
  }
  return matches[0];
}

Status ForEachListedId(ledger::RpcClient& rpc, const std::string& method,
                       const nlohmann::json& params, const IdVisitor& each) {
  nlohmann::json cursor = nullptr;
  for (int page = 0; page < 100000; ++page) {
    nlohmann::json p = params.is_object() ? params : nlohmann::json::object();
    p["limit"] = 100;
    if (!cursor.is_null()) p["cursor"] = cursor;
    ML_ASSIGN_OR_RETURN(nlohmann::json res, rpc.Call(method, p));
    ML_RETURN_IF_ERROR(CheckRpcAnswer(
        res, {rpc.url(), method},
        {{"items", JsonKind::kArray, true}, {"next_cursor", JsonKind::kAny, false, true}}));
    for (const nlohmann::json& item : res["items"]) {
      if (item.is_object() && item.contains("id") && item["id"].is_string()) {
        each(item["id"].get<std::string>());
      }
    }
    cursor = res.contains("next_cursor") ? res["next_cursor"] : nlohmann::json(nullptr);
    if (cursor.is_null() || (cursor.is_string() && cursor.get<std::string>().empty())) break;
  }
  return Status::Ok();
}

Status WriteReportFile(const std::string& path, const nlohmann::json& report,
                       std::initializer_list<const char*> path_keys) {
  nlohmann::json in_file = report;
  for (const char* key : path_keys) {
    auto it = in_file.find(key);
    if (it != in_file.end() && it->is_string() && !it->get<std::string>().empty()) {
      *it = PathForFile(path, it->get<std::string>());
    }
  }
  return Env::Default()->WriteFileAtomic(path, in_file.dump(2) + "\n");
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

sigset_t BlockSignalsForSigwait(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

uint64_t PeakRssBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace meshlearn::cli
