#include "meshlearn/base/config.h"

#include <algorithm>
#include <sstream>

#include <toml++/toml.h>

namespace meshlearn {

struct ConfigFile::Impl {
  toml::table root;
};

namespace {

// Levenshtein distance, for "did you mean" hints on misspelt keys.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string Show(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.as_string()->get() << '"';
  } else if (n.is_integer()) {
    os << n.as_integer()->get();
  } else if (n.is_floating_point()) {
    os << n.as_floating_point()->get();
  } else if (n.is_boolean()) {
    os << (n.as_boolean()->get() ? "true" : "false");
  } else {
    os << TypeName(n);
  }
  return os.str();
}

std::string NumberText(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

ConfigFile::ConfigFile(std::string name, std::string prefix, std::shared_ptr<const Impl> impl)
    : name_(std::move(name)), prefix_(std::move(prefix)), impl_(std::move(impl)) {}
ConfigFile::ConfigFile(const ConfigFile&) = default;
ConfigFile& ConfigFile::operator=(const ConfigFile&) = default;
ConfigFile::ConfigFile(ConfigFile&&) noexcept = default;
ConfigFile& ConfigFile::operator=(ConfigFile&&) noexcept = default;
ConfigFile::~ConfigFile() = default;

Result<ConfigFile> ConfigFile::Load(Env* env, const std::string& path) {
  Result<std::string> text = env->ReadFile(path);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

Result<ConfigFile> ConfigFile::Parse(std::string_view text, std::string name) {
  auto impl = std::make_shared<Impl>();
  try {
    impl->root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return InvalidArgument(name + ":" + std::to_string(where.line) + ":" +
                           std::to_string(where.column) + ": invalid TOML: " +
                           std::string(e.description()));
  }
  return ConfigFile(std::move(name), "", std::move(impl));
}

std::string ConfigFile::FullKey(std::string_view key) const { return prefix_ + std::string(key); }

const void* ConfigFile::Find(std::string_view key) const {
  return impl_->root.at_path(FullKey(key)).node();
}

bool ConfigFile::Has(std::string_view key) const { return Find(key) != nullptr; }

Status ConfigFile::Error(std::string_view key, std::string_view what) const {
  return InvalidArgument(name_ + ": " + FullKey(key) + " " + std::string(what));
}

Result<int64_t> ConfigFile::GetInt(std::string_view key, IntRange range) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (an integer)");
  if (!n->is_integer()) return Error(key, "must be an integer, got " + Show(*n));
  int64_t v = n->as_integer()->get();
  if (range.min && v < *range.min) {
    return Error(key, "must be >= " + std::to_string(*range.min) + ", got " + std::to_string(v));
  }
  if (range.max && v > *range.max) {
    return Error(key, "must be <= " + std::to_string(*range.max) + ", got " + std::to_string(v));
  }
  return v;
}

Result<double> ConfigFile::GetDouble(std::string_view key, DoubleRange range) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (a number)");
  double v;
  if (n->is_floating_point()) {
    v = n->as_floating_point()->get();
  } else if (n->is_integer()) {
    v = static_cast<double>(n->as_integer()->get());
  } else {
    return Error(key, "must be a number, got " + Show(*n));
  }
  if (!(v == v) || v - v != 0) return Error(key, "must be a finite number, got " + Show(*n));
  if (range.min && (range.min_exclusive ? !(v > *range.min) : !(v >= *range.min))) {
    return Error(key, std::string("must be ") + (range.min_exclusive ? "> " : ">= ") +
                          NumberText(*range.min) + ", got " + Show(*n));
  }
  if (range.max && (range.max_exclusive ? !(v < *range.max) : !(v <= *range.max))) {
    return Error(key, std::string("must be ") + (range.max_exclusive ? "< " : "<= ") +
                          NumberText(*range.max) + ", got " + Show(*n));
  }
  return v;
}

Result<std::string> ConfigFile::GetString(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (a string)");
  if (!n->is_string()) return Error(key, "must be a string, got " + Show(*n));
  return n->as_string()->get();
}

Result<bool> ConfigFile::GetBool(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (true or false)");
  if (!n->is_boolean()) return Error(key, "must be true or false, got " + Show(*n));
  return n->as_boolean()->get();
}

Result<int64_t> ConfigFile::GetInt(std::string_view key, int64_t def, IntRange range) const {
  if (!Has(key)) return def;
  return GetInt(key, range);
}
Result<double> ConfigFile::GetDouble(std::string_view key, double def, DoubleRange range) const {
  if (!Has(key)) return def;
  return GetDouble(key, range);
}
Result<std::string> ConfigFile::GetString(std::string_view key, std::string def) const {
  if (!Has(key)) return def;
  return GetString(key);
}
Result<bool> ConfigFile::GetBool(std::string_view key, bool def) const {
  if (!Has(key)) return def;
  return GetBool(key);
}

Result<std::string> ConfigFile::GetEnum(std::string_view key,
                                        const std::vector<std::string>& choices,
                                        std::optional<std::string> def) const {
  std::string v;
  if (!Has(key) && def) {
    v = *def;
  } else {
    ML_ASSIGN_OR_RETURN(v, GetString(key));
  }
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  return Error(key, "must be one of " + list + ", got \"" + v + "\"");
}

Result<std::vector<int64_t>> ConfigFile::GetIntArray(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (an array of integers)");
  if (!n->is_array()) return Error(key, "must be an array of integers, got " + Show(*n));
  std::vector<int64_t> out;
  size_t i = 0;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_integer()) {
      return Error(std::string(key) + "[" + std::to_string(i) + "]",
                   "must be an integer, got " + Show(e));
    }
    out.push_back(e.as_integer()->get());
    ++i;
  }
  return out;
}

Result<std::vector<std::string>> ConfigFile::GetStringArray(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add it (an array of strings)");
  if (!n->is_array()) return Error(key, "must be an array of strings, got " + Show(*n));
  std::vector<std::string> out;
  size_t i = 0;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_string()) {
      return Error(std::string(key) + "[" + std::to_string(i) + "]",
                   "must be a string, got " + Show(e));
    }
    out.push_back(e.as_string()->get());
    ++i;
  }
  return out;
}

Result<ConfigFile> ConfigFile::GetTable(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add a [" + FullKey(key) + "] table");
  if (!n->is_table()) return Error(key, "must be a table, got " + Show(*n));
  return ConfigFile(name_, FullKey(key) + ".", impl_);
}

Result<std::vector<ConfigFile>> ConfigFile::GetTableArray(std::string_view key) const {
  auto* n = static_cast<const toml::node*>(Find(key));
  if (n == nullptr) return Error(key, "is missing; add one or more [[" + FullKey(key) + "]] tables");
  if (!n->is_array_of_tables()) return Error(key, "must be an array of tables ([[" + FullKey(key) + "]])");
  std::vector<ConfigFile> out;
  for (size_t i = 0; i < n->as_array()->size(); ++i) {
    out.push_back(ConfigFile(name_, FullKey(key) + "[" + std::to_string(i) + "].", impl_));
  }
  return out;
}

std::vector<std::string> ConfigFile::Keys() const {
  std::vector<std::string> keys;
  const toml::node* n = prefix_.empty() ? &impl_->root
                                        : impl_->root.at_path(prefix_.substr(0, prefix_.size() - 1)).node();
  if (n == nullptr || !n->is_table()) return keys;
  for (const auto& [k, v] : *n->as_table()) keys.emplace_back(k.str());
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status ConfigFile::CheckKnownKeys(const std::vector<std::string>& known) const {
  for (const std::string& k : Keys()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string best;
    size_t best_d = 3;  // only suggest close matches
    for (const std::string& c : known) {
      size_t d = EditDistance(k, c);
      if (d < best_d) {
        best_d = d;
        best = c;
      }
    }
    std::string hint = best.empty() ? "; remove it" : " (did you mean '" + best + "'?)";
    std::string list;
    for (const auto& c : known) list += (list.empty() ? "" : ", ") + c;
    return InvalidArgument(name_ + ": unknown key '" + FullKey(k) + "'" + hint +
                           "; known keys here: " + list);
  }
  return Status::Ok();
}

}  // namespace meshlearn
