#include "meshlearn/ledger/genesis.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <type_traits>

#include "meshlearn/base/check.h"
#include "meshlearn/base/config.h"
#include "meshlearn/base/encoding.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger {

Amount ChainParams::MinStakeFor(uint32_t roles) const {
  Amount m = 0;
  if (roles & kRoleSolver) m = std::max(m, min_stake_solver);
  if (roles & kRoleVerifier) m = std::max(m, min_stake_verifier);
  if (roles & kRoleWhistleblower) m = std::max(m, min_stake_whistleblower);
  if (roles & kRoleAggregator) m = std::max(m, min_stake_aggregator);
  return m;
}

protocol::VerificationParams ChainParams::Verification() const {
  protocol::VerificationParams v;
  v.trusted_after = verify_trusted_after;
  v.floor_permille = verify_floor_permille;
  v.segments_per_check = verify_segments_per_check;
  v.forced_error_per_million = forced_error_per_million;
  return v;
}

namespace {

// ChainParams::Visit visitors: the genesis hash's encoding and the [params] table reader.
struct ParamEncoder {
  Encoder& e;
  void operator()(const char*, const uint64_t& v) { e.PutU64(v); }
  void operator()(const char*, const uint32_t& v) { e.PutU32(v); }
  void operator()(const char*, const bool& v) { e.PutBool(v); }
};

struct ParamReader {
  const ConfigFile& table;
  Status status;
  void operator()(const char* n, uint64_t& v) {
    if (!status.ok()) return;
    Result<int64_t> r = table.GetInt(n, static_cast<int64_t>(v), {.min = 0});
    if (r.ok()) v = static_cast<uint64_t>(*r);
    else status = r.status();
  }
  void operator()(const char* n, uint32_t& v) {
    if (!status.ok()) return;
    Result<int64_t> r = table.GetInt(n, v, {.min = 0, .max = UINT32_MAX});
    if (r.ok()) v = static_cast<uint32_t>(*r);
    else status = r.status();
  }
  void operator()(const char* n, bool& v) {
    if (!status.ok()) return;
    Result<bool> r = table.GetBool(n, v);
    if (r.ok()) v = *r;
    else status = r.status();
  }
};

}  // namespace

Status ValidateGenesis(const Genesis& g) {
  if (g.chain_id.empty() || g.chain_id.size() > kMaxChainIdLength) {
    return InvalidArgument("genesis: chain_id must be 1-64 characters, got '" + g.chain_id + "'");
  }
  for (char c : g.chain_id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) {
      return InvalidArgument("genesis: chain_id may only hold [A-Za-z0-9_.-], got '" +
                             g.chain_id + "'");
    }
  }
  if (g.block_interval_ms <= 0) {
    return InvalidArgument("genesis: block_interval_ms must be > 0, got " +
                           std::to_string(g.block_interval_ms));
  }
  if (g.params.treasury_cut_bps > 10000) {
    return InvalidArgument("genesis: params.treasury_cut_bps must be <= 10000, got " +
                           std::to_string(g.params.treasury_cut_bps));
  }
  if (g.params.slash_jackpot_bps > 10000) {
    return InvalidArgument("genesis: params.slash_jackpot_bps must be <= 10000, got " +
                           std::to_string(g.params.slash_jackpot_bps));
  }
  if (g.params.deadline_slack_permille < 1000) {
    return InvalidArgument("genesis: params.deadline_slack_permille must be >= 1000 (no less "
                           "than the estimate), got " +
                           std::to_string(g.params.deadline_slack_permille));
  }
  if (g.params.min_deadline_blocks == 0) {
    return InvalidArgument("genesis: params.min_deadline_blocks must be >= 1");
  }
  if (g.params.liveness_blocks == 0) {
    return InvalidArgument("genesis: params.liveness_blocks must be >= 1");
  }
  const ChainParams& p = g.params;
  if (p.unbonding_delay_blocks < p.audit_window_blocks) {
    return InvalidArgument(
        "genesis: params.unbonding_delay_blocks (" + std::to_string(p.unbonding_delay_blocks) +
        ") must be >= params.audit_window_blocks (" + std::to_string(p.audit_window_blocks) +
        "): a solver could withdraw its stake before a fraud proof within the audit window "
        "reaches it; raise unbonding_delay_blocks to at least " +
        std::to_string(p.audit_window_blocks) + " or lower audit_window_blocks");
  }
  if (Status v = protocol::ValidateVerificationParams(p.Verification()); !v.ok()) {
    return v.WithPrefix("genesis: params");
  }
  if (p.verifiers_per_unit == 0 || p.verifiers_per_unit > 64) {
    return InvalidArgument("genesis: params.verifiers_per_unit must be in [1, 64], got " +
                           std::to_string(p.verifiers_per_unit));
  }
  if (p.verdict_commit_blocks == 0 || p.verdict_reveal_blocks == 0 ||
      p.dispute_response_blocks == 0) {
    return InvalidArgument("genesis: params.verdict_commit_blocks, verdict_reveal_blocks and "
                           "dispute_response_blocks must be >= 1");
  }
  if (p.slash_multiple == 0) {
    return InvalidArgument("genesis: params.slash_multiple must be >= 1 (a cheater must lose "
                           "more than a unit pays)");
  }
  if (p.rounds_in_flight > kMaxRoundsInFlight) {
    return InvalidArgument("genesis: params.rounds_in_flight must be in [0, " +
                           std::to_string(kMaxRoundsInFlight) + "], got " +
                           std::to_string(p.rounds_in_flight));
  }
  if (!g.sequencers.empty()) {
    if (g.sequencers.size() > kMaxSequencers) {
      return InvalidArgument("genesis: sequencers lists " + std::to_string(g.sequencers.size()) +
                             " keys; at most " + std::to_string(kMaxSequencers));
    }
    std::set<PublicKey> keys;
    for (const PublicKey& k : g.sequencers) {
      if (k == PublicKey{}) return InvalidArgument("genesis: sequencers holds an all-zero key");
      if (!keys.insert(k).second) {
        return InvalidArgument("genesis: sequencers lists key " + k.ToHex() + " twice");
      }
    }
    if (!keys.count(g.sequencer)) {
      return InvalidArgument("genesis: sequencer " + g.sequencer.ToHex() +
                             " is not one of sequencers; name one of the listed keys (it is "
                             "the referee's default)");
    }
  }
  std::set<PublicKey> seen;
  Amount total = 0;
  for (const GenesisAccount& a : g.accounts) {
    if (!seen.insert(a.key).second) {
      return InvalidArgument("genesis: account " + a.key.ToHex() + " is listed twice");
    }
    if (__builtin_add_overflow(total, a.balance, &total)) {
      return InvalidArgument("genesis: total of account balances overflows a 64-bit amount");
    }
  }
  return Status::Ok();
}

Hash256 GenesisHash(const Genesis& g) {
  Encoder e;
  e.PutString(g.chain_id).PutI64(g.genesis_time_ms).PutI64(g.block_interval_ms);
  e.PutPublicKey(g.sequencer).PutBool(g.faucet);
  e.PutPublicKey(g.referee);
  ChainParams::Visit(g.params, ParamEncoder{e});
  e.PutU32(static_cast<uint32_t>(g.accounts.size()));
  for (const GenesisAccount& a : g.accounts) e.PutPublicKey(a.key).PutU64(a.balance);
  // Appended only when set, so a genesis without the list hashes as it always did.
  if (!g.sequencers.empty()) {
    e.PutU32(static_cast<uint32_t>(g.sequencers.size()));
    for (const PublicKey& k : g.sequencers) e.PutPublicKey(k);
  }
  // The params added since (ChainParams::VisitTail), appended only where they differ from their
  // defaults, each by name, after a tag: a genesis that keeps them hashes as it always did.
  std::vector<std::pair<std::string, Bytes>> tail, defaults;
  const auto collect = [](std::vector<std::pair<std::string, Bytes>>* out) {
    return [out](const char* n, const auto& v) {
      Encoder f;
      ParamEncoder{f}(n, v);
      out->emplace_back(n, f.bytes());
    };
  };
  ChainParams::VisitTail(g.params, collect(&tail));
  const ChainParams unset;
  ChainParams::VisitTail(unset, collect(&defaults));
  std::erase_if(tail, [&](const auto& f) {
    return std::find(defaults.begin(), defaults.end(), f) != defaults.end();
  });
  if (!tail.empty()) {
    e.PutString("params_tail").PutU32(static_cast<uint32_t>(tail.size()));
    for (const auto& [name, value] : tail) e.PutString(name).PutBytes(value);
  }
  Hasher h("meshlearn.genesis.v1");
  h.Update(e.bytes());
  return h.Finish();
}

Result<Genesis> ParseGenesis(std::string_view toml_text, std::string name) {
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(toml_text, name));
  ML_RETURN_IF_ERROR(cfg.CheckKnownKeys({"chain_id", "genesis_time_ms", "block_interval_ms",
                                         "sequencer", "sequencers", "referee", "faucet", "params",
                                         "accounts"}));
  Genesis g;
  ML_ASSIGN_OR_RETURN(g.chain_id, cfg.GetString("chain_id"));
  ML_ASSIGN_OR_RETURN(g.genesis_time_ms, cfg.GetInt("genesis_time_ms", 0, {.min = 0}));
  ML_ASSIGN_OR_RETURN(g.block_interval_ms, cfg.GetInt("block_interval_ms", 1000, {.min = 1}));
  ML_ASSIGN_OR_RETURN(std::string seq, cfg.GetString("sequencer", ""));
  if (!seq.empty()) {
    auto k = PublicKey::FromHex(seq, "sequencer");
    if (!k.ok()) return cfg.Error("sequencer", "must be a hex public key: " + k.status().message());
    g.sequencer = *k;
  }
  if (cfg.Has("sequencers")) {
    ML_ASSIGN_OR_RETURN(std::vector<std::string> keys, cfg.GetStringArray("sequencers"));
    if (keys.empty()) return cfg.Error("sequencers", "is empty; list the candidates' keys or drop it");
    for (size_t i = 0; i < keys.size(); ++i) {
      auto k = PublicKey::FromHex(keys[i], "sequencers");
      if (!k.ok()) {
        return cfg.Error("sequencers", "entry " + std::to_string(i) +
                                           " must be a hex public key: " + k.status().message());
      }
      g.sequencers.push_back(*k);
    }
  }
  ML_ASSIGN_OR_RETURN(std::string referee, cfg.GetString("referee", ""));
  if (!referee.empty()) {
    auto k = PublicKey::FromHex(referee, "referee");
    if (!k.ok()) return cfg.Error("referee", "must be a hex public key: " + k.status().message());
    g.referee = *k;
  }
  ML_ASSIGN_OR_RETURN(g.faucet, cfg.GetBool("faucet", false));
  if (cfg.Has("params")) {
    ML_ASSIGN_OR_RETURN(ConfigFile p, cfg.GetTable("params"));
    std::vector<std::string> keys;
    ChainParams::VisitAll(g.params, [&](const char* n, const auto&) { keys.emplace_back(n); });
    ML_RETURN_IF_ERROR(p.CheckKnownKeys(keys));
    ParamReader reader{p};
    ChainParams::VisitAll(g.params, reader);
    ML_RETURN_IF_ERROR(reader.status);
  }
  if (cfg.Has("accounts")) {
    ML_ASSIGN_OR_RETURN(std::vector<ConfigFile> accounts, cfg.GetTableArray("accounts"));
    for (const ConfigFile& a : accounts) {
      ML_RETURN_IF_ERROR(a.CheckKnownKeys({"key", "balance"}));
      ML_ASSIGN_OR_RETURN(std::string key_hex, a.GetString("key"));
      auto key = PublicKey::FromHex(key_hex, "key");
      if (!key.ok()) return a.Error("key", "must be a hex public key: " + key.status().message());
      ML_ASSIGN_OR_RETURN(int64_t balance, a.GetInt("balance", {.min = 0}));
      g.accounts.push_back({*key, static_cast<Amount>(balance)});
    }
  }
  Status s = ValidateGenesis(g);
  if (!s.ok()) return s.WithPrefix(name);
  return g;
}

Result<Genesis> LoadGenesis(Env* env, const std::string& path) {
  ML_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  return ParseGenesis(text, path);
}

std::string GenesisToToml(const Genesis& g) {
  // TOML integers are signed 64-bit; amounts above INT64_MAX cannot be written (ValidateGenesis
  // does not forbid them, LoadGenesis would refuse them), so WriteGenesis checks.
  std::ostringstream o;
  o << "# meshlearn genesis. Every node of this network must use the same file.\n";
  o << "chain_id = \"" << g.chain_id << "\"\n";
  o << "genesis_time_ms = " << g.genesis_time_ms << "\n";
  o << "block_interval_ms = " << g.block_interval_ms << "\n";
  if (g.sequencer != PublicKey{}) o << "sequencer = \"" << g.sequencer.ToHex() << "\"\n";
  if (!g.sequencers.empty()) {
    o << "sequencers = [";
    for (size_t i = 0; i < g.sequencers.size(); ++i) {
      o << (i ? ", " : "") << "\"" << g.sequencers[i].ToHex() << "\"";
    }
    o << "]\n";
  }
  if (g.referee != PublicKey{}) o << "referee = \"" << g.referee.ToHex() << "\"\n";
  o << "faucet = " << (g.faucet ? "true" : "false") << "\n\n";
  const ChainParams& p = g.params;
  o << "[params]\n";
  ChainParams::VisitAll(p, [&](const char* n, const auto& v) {
    o << n << " = ";
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) {
      o << (v ? "true" : "false");
    } else {
      o << v;
    }
    o << "\n";
  });
  for (const GenesisAccount& a : g.accounts) {
    o << "\n[[accounts]]\nkey = \"" << a.key.ToHex() << "\"\nbalance = " << a.balance << "\n";
  }
  return o.str();
}

Status WriteGenesis(Env* env, const std::string& path, const Genesis& g) {
  ML_RETURN_IF_ERROR(ValidateGenesis(g));
  constexpr uint64_t kMaxToml = static_cast<uint64_t>(INT64_MAX);
  const ChainParams& p = g.params;
  bool too_big = false;
  ChainParams::VisitAll(p, [&](const char*, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, uint64_t>) too_big |= v > kMaxToml;
  });
  if (too_big) return InvalidArgument(path + ": a parameter exceeds the TOML integer range");
  for (const GenesisAccount& a : g.accounts) {
    if (a.balance > kMaxToml) {
      return InvalidArgument(path + ": balance of " + a.key.ToHex() +
                             " exceeds the TOML integer range (2^63-1)");
    }
  }
  return env->WriteFileAtomic(path, GenesisToToml(g));
}

nlohmann::json GenesisToJson(const Genesis& g) {
  nlohmann::json accounts = nlohmann::json::array();
  for (const GenesisAccount& a : g.accounts) {
    accounts.push_back({{"key", a.key.ToHex()}, {"balance", a.balance}});
  }
  nlohmann::json params = nlohmann::json::object();
  ChainParams::VisitAll(g.params, [&](const char* n, const auto& v) { params[n] = v; });
  nlohmann::json j = {{"chain_id", g.chain_id},
          {"genesis_hash", GenesisHash(g).ToHex()},
          {"genesis_time_ms", g.genesis_time_ms},
          {"block_interval_ms", g.block_interval_ms},
          {"sequencer", g.sequencer.ToHex()},
          {"faucet", g.faucet},
          {"referee", g.referee.ToHex()},
          {"params", params},
          {"accounts", std::move(accounts)}};
  if (!g.sequencers.empty()) {  // a replicated chain's candidates
    nlohmann::json keys = nlohmann::json::array();
    for (const PublicKey& k : g.sequencers) keys.push_back(k.ToHex());
    j["sequencers"] = std::move(keys);
  }
  return j;
}

bool IsAuthorizedSequencer(const Genesis& g, const PublicKey& key) {
  if (!g.sequencers.empty()) {
    return std::find(g.sequencers.begin(), g.sequencers.end(), key) != g.sequencers.end();
  }
  return g.sequencer == PublicKey{} || key == g.sequencer;
}

std::vector<PublicKey> AuthorizedSequencers(const Genesis& g) {
  if (!g.sequencers.empty()) return g.sequencers;
  if (g.sequencer != PublicKey{}) return {g.sequencer};
  return {};
}

Genesis DevnetGenesis(const std::vector<PublicKey>& funded_keys, Amount balance_each,
                      std::string chain_id) {
  Genesis g;
  g.chain_id = std::move(chain_id);
  g.faucet = true;
  g.params.min_stake_solver = 100;
  g.params.min_stake_verifier = 100;
  g.params.min_stake_whistleblower = 100;
  g.params.min_stake_aggregator = 100;
  g.params.unbonding_delay_blocks = 10;
  g.params.audit_window_blocks = 10;
  g.params.liveness_blocks = 60;
  g.params.deadline_slack_permille = 6000;
  g.params.min_deadline_blocks = 20;
  // The node daemon plays every verification role (node/agent.h, "Verification").
  g.params.verification = true;
  for (const PublicKey& k : funded_keys) g.accounts.push_back({k, balance_each});
  return g;
}

std::string ChainGenesisPath(const std::string& dir) { return JoinPath(dir, "genesis.toml"); }
std::string ChainKeysDir(const std::string& dir) { return JoinPath(dir, "keys"); }
std::string ChainDbPath(const std::string& dir) { return JoinPath(dir, "chain.db"); }

namespace {

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Internal("cannot open directory " + dir + ": " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Internal("cannot sync directory " + dir + ": " + std::strerror(err));
  return Status::Ok();
}

Status ChainDirTaken(const std::string& dir) {
  if (std::filesystem::exists(ChainGenesisPath(dir))) {
    return AlreadyExists(ChainGenesisPath(dir) +
                         " exists: this directory already holds a chain; serve it with `meshlearn "
                         "chain serve --dir " + dir + "`, or init another --dir");
  }
  return AlreadyExists(dir + " exists and is not an empty directory; `chain init` creates a new "
                       "chain directory: give a new or empty --dir");
}

}  // namespace

std::string CandidateKeyName(size_t i) {
  return i == 0 ? std::string(kSequencerKeyName)
                : std::string(kSequencerKeyName) + "-" + std::to_string(i + 1);
}

Status CreateChainDir(const std::string& dir_in, const Genesis& g, const KeyPair& sequencer,
                      const std::vector<KeyPair>& candidates) {
  CHECK(g.sequencer == sequencer.public_key()) << "the genesis names another sequencer";
  for (size_t i = 0; i < candidates.size(); ++i) {
    CHECK(IsAuthorizedSequencer(g, candidates[i].public_key()))
        << "candidate key " << i + 2 << " is not in the genesis' sequencers";
  }
  namespace fs = std::filesystem;
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) return InvalidArgument("the chain directory is empty; name one with --dir");
  ML_RETURN_IF_ERROR(ValidateGenesis(g));
  std::error_code ec;
  // A clear answer for the common case; the rename below is what decides a race.
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return ChainDirTaken(dir);
  }
  Env* env = Env::Default();
  const std::string parent = DirName(dir);
  ML_RETURN_IF_ERROR(env->CreateDirs(parent, 0755));
  std::string tmpl = dir + ".init-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Internal("cannot create a temporary directory beside " + dir + ": " +
                    std::strerror(errno));
  }
  const std::string tmp = tmpl;  // mode 0700, as the chain directory must be
  auto discard = [&](Status s) {
    fs::remove_all(tmp, ec);
    return s;
  };
  Status s = WriteGenesis(env, ChainGenesisPath(tmp), g);
  if (s.ok()) s = KeyStore(env, ChainKeysDir(tmp)).Put(kSequencerKeyName, sequencer, "");
  for (size_t i = 0; i < candidates.size() && s.ok(); ++i) {
    s = KeyStore(env, ChainKeysDir(tmp)).Put(CandidateKeyName(i + 1), candidates[i], "");
  }
  if (s.ok()) s = SyncDir(tmp);
  if (!s.ok()) return discard(s.WithPrefix("cannot create chain directory " + dir));
  // rename(2) of a directory onto a path that is absent or an empty directory is atomic, and
  // fails (ENOTEMPTY/EEXIST) once another process's directory is in place: exactly one wins.
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    if (err == ENOTEMPTY || err == EEXIST || err == ENOTDIR || err == EISDIR) {
      return discard(ChainDirTaken(dir));
    }
    return discard(Internal("cannot rename " + tmp + " to " + dir + ": " + std::strerror(err)));
  }
  return SyncDir(parent);
}

}  // namespace meshlearn::ledger
