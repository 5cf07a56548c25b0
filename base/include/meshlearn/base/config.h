// TOML configuration files (genesis, node, task, model specs) with errors that name the file, the
// key and the fix:  "task.toml: optimizer.lr must be > 0, got -1".
//
//   ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Load(env, "task.toml"));
//   ML_ASSIGN_OR_RETURN(double lr, cfg.GetDouble("optimizer.lr", {.min = 0, .min_exclusive = true}));
//   ML_ASSIGN_OR_RETURN(int64_t steps, cfg.GetInt("steps", 100));   // with a default
//   ML_RETURN_IF_ERROR(cfg.CheckKnownKeys({"model", "optimizer", "steps"}));  // catches typos
//
// Keys are dotted paths into nested tables. toml++ stays behind this interface so that most of
// the code base does not compile its (large) header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshlearn/base/env.h"
#include "meshlearn/base/status.h"

namespace meshlearn {

struct IntRange {
  std::optional<int64_t> min;
  std::optional<int64_t> max;
};
struct DoubleRange {
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;
  bool max_exclusive = false;
};

class ConfigFile {
 public:
  static Result<ConfigFile> Load(Env* env, const std::string& path);
  // `name` stands for the file in error messages.
  static Result<ConfigFile> Parse(std::string_view text, std::string name);

  ConfigFile(const ConfigFile&);
  ConfigFile& operator=(const ConfigFile&);
  ConfigFile(ConfigFile&&) noexcept;
  ConfigFile& operator=(ConfigFile&&) noexcept;
  ~ConfigFile();

  const std::string& name() const { return name_; }
  bool Has(std::string_view key) const;

  // Required values: a missing key or a value of the wrong type is an error.
  Result<int64_t> GetInt(std::string_view key, IntRange range = {}) const;
  Result<double> GetDouble(std::string_view key, DoubleRange range = {}) const;  // ints accepted
  Result<std::string> GetString(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  // With a default for a missing key; a present key of the wrong type is still an error.
  Result<int64_t> GetInt(std::string_view key, int64_t def, IntRange range = {}) const;
  Result<double> GetDouble(std::string_view key, double def, DoubleRange range = {}) const;
  Result<std::string> GetString(std::string_view key, std::string def) const;
  Result<bool> GetBool(std::string_view key, bool def) const;
  // A string that must be one of `choices`.
  Result<std::string> GetEnum(std::string_view key, const std::vector<std::string>& choices,
                              std::optional<std::string> def = std::nullopt) const;

  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  // A sub-table as its own ConfigFile; its errors still name the full key ("model.layers[2].kind").
  Result<ConfigFile> GetTable(std::string_view key) const;
  // An array of tables ([[layers]]).
  Result<std::vector<ConfigFile>> GetTableArray(std::string_view key) const;

  // Every top-level key of this table must be in `known`; an unknown key is reported with the
  // closest known one ("unknown key 'optimzer' (did you mean 'optimizer'?)").
  Status CheckKnownKeys(const std::vector<std::string>& known) const;
  std::vector<std::string> Keys() const;

  // An error about `key` in this file: "<file>: <prefix><key> <what>".
  Status Error(std::string_view key, std::string_view what) const;

 private:
  struct Impl;
  ConfigFile(std::string name, std::string prefix, std::shared_ptr<const Impl> impl);
  const void* Find(std::string_view key) const;  // toml::node*
  std::string FullKey(std::string_view key) const;

  std::string name_;
  std::string prefix_;  // "model.layers[2]." for sub-tables
  std::shared_ptr<const Impl> impl_;
};

}  // namespace meshlearn
