#include "meshlearn/ledger/genesis.h"

#include <set>
#include <sstream>

#include "meshlearn/base/config.h"
#include "meshlearn/base/encoding.h"
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
  const ChainParams& p = g.params;
  e.PutU64(p.min_stake_solver).PutU64(p.min_stake_verifier).PutU64(p.min_stake_whistleblower);
  e.PutU64(p.min_stake_aggregator).PutU64(p.unbonding_delay_blocks);
  e.PutU32(p.treasury_cut_bps).PutU32(p.slash_jackpot_bps).PutU64(p.faucet_max_amount);
  e.PutU64(p.liveness_blocks).PutU32(p.deadline_slack_permille).PutU64(p.min_deadline_blocks);
  e.PutU32(static_cast<uint32_t>(g.accounts.size()));
  for (const GenesisAccount& a : g.accounts) e.PutPublicKey(a.key).PutU64(a.balance);
  Hasher h("meshlearn.genesis.v1");
  h.Update(e.bytes());
  return h.Finish();
}

Result<Genesis> ParseGenesis(std::string_view toml_text, std::string name) {
  ML_ASSIGN_OR_RETURN(ConfigFile cfg, ConfigFile::Parse(toml_text, name));
  ML_RETURN_IF_ERROR(cfg.CheckKnownKeys({"chain_id", "genesis_time_ms", "block_interval_ms",
                                         "sequencer", "faucet", "params", "accounts"}));
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
  ML_ASSIGN_OR_RETURN(g.faucet, cfg.GetBool("faucet", false));
  if (cfg.Has("params")) {
    ML_ASSIGN_OR_RETURN(ConfigFile p, cfg.GetTable("params"));
    ML_RETURN_IF_ERROR(p.CheckKnownKeys(
        {"min_stake_solver", "min_stake_verifier", "min_stake_whistleblower",
         "min_stake_aggregator", "unbonding_delay_blocks", "treasury_cut_bps",
         "slash_jackpot_bps", "faucet_max_amount", "liveness_blocks",
         "deadline_slack_permille", "min_deadline_blocks"}));
    ChainParams& cp = g.params;
    auto get_u64 = [&](const char* key, uint64_t* out) -> Status {
      ML_ASSIGN_OR_RETURN(int64_t v, p.GetInt(key, static_cast<int64_t>(*out), {.min = 0}));
      *out = static_cast<uint64_t>(v);
      return Status::Ok();
    };
    ML_RETURN_IF_ERROR(get_u64("min_stake_solver", &cp.min_stake_solver));
    ML_RETURN_IF_ERROR(get_u64("min_stake_verifier", &cp.min_stake_verifier));
    ML_RETURN_IF_ERROR(get_u64("min_stake_whistleblower", &cp.min_stake_whistleblower));
    ML_RETURN_IF_ERROR(get_u64("min_stake_aggregator", &cp.min_stake_aggregator));
    ML_RETURN_IF_ERROR(get_u64("unbonding_delay_blocks", &cp.unbonding_delay_blocks));
    ML_RETURN_IF_ERROR(get_u64("faucet_max_amount", &cp.faucet_max_amount));
    ML_RETURN_IF_ERROR(get_u64("liveness_blocks", &cp.liveness_blocks));
    ML_RETURN_IF_ERROR(get_u64("min_deadline_blocks", &cp.min_deadline_blocks));
    ML_ASSIGN_OR_RETURN(int64_t slack, p.GetInt("deadline_slack_permille",
                                                cp.deadline_slack_permille,
                                                {.min = 1000, .max = 1000000}));
    cp.deadline_slack_permille = static_cast<uint32_t>(slack);
    ML_ASSIGN_OR_RETURN(int64_t cut, p.GetInt("treasury_cut_bps", cp.treasury_cut_bps,
                                              {.min = 0, .max = 10000}));
    cp.treasury_cut_bps = static_cast<uint32_t>(cut);
    ML_ASSIGN_OR_RETURN(int64_t jp, p.GetInt("slash_jackpot_bps", cp.slash_jackpot_bps,
                                             {.min = 0, .max = 10000}));
    cp.slash_jackpot_bps = static_cast<uint32_t>(jp);
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
  o << "faucet = " << (g.faucet ? "true" : "false") << "\n\n";
  const ChainParams& p = g.params;
  o << "[params]\n";
  o << "min_stake_solver = " << p.min_stake_solver << "\n";
  o << "min_stake_verifier = " << p.min_stake_verifier << "\n";
  o << "min_stake_whistleblower = " << p.min_stake_whistleblower << "\n";
  o << "min_stake_aggregator = " << p.min_stake_aggregator << "\n";
  o << "unbonding_delay_blocks = " << p.unbonding_delay_blocks << "\n";
  o << "treasury_cut_bps = " << p.treasury_cut_bps << "\n";
  o << "slash_jackpot_bps = " << p.slash_jackpot_bps << "\n";
  o << "faucet_max_amount = " << p.faucet_max_amount << "\n";
  o << "liveness_blocks = " << p.liveness_blocks << "\n";
  o << "deadline_slack_permille = " << p.deadline_slack_permille << "\n";
  o << "min_deadline_blocks = " << p.min_deadline_blocks << "\n";
  for (const GenesisAccount& a : g.accounts) {
    o << "\n[[accounts]]\nkey = \"" << a.key.ToHex() << "\"\nbalance = " << a.balance << "\n";
  }
  return o.str();
}

Status WriteGenesis(Env* env, const std::string& path, const Genesis& g) {
  ML_RETURN_IF_ERROR(ValidateGenesis(g));
  constexpr uint64_t kMaxToml = static_cast<uint64_t>(INT64_MAX);
  const ChainParams& p = g.params;
  for (uint64_t v : {p.min_stake_solver, p.min_stake_verifier, p.min_stake_whistleblower,
                     p.min_stake_aggregator, p.unbonding_delay_blocks, p.faucet_max_amount,
                     p.liveness_blocks, p.min_deadline_blocks}) {
    if (v > kMaxToml) return InvalidArgument(path + ": a parameter exceeds the TOML integer range");
  }
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
  const ChainParams& p = g.params;
  return {{"chain_id", g.chain_id},
          {"genesis_hash", GenesisHash(g).ToHex()},
          {"genesis_time_ms", g.genesis_time_ms},
          {"block_interval_ms", g.block_interval_ms},
          {"sequencer", g.sequencer.ToHex()},
          {"faucet", g.faucet},
          {"params",
           {{"min_stake_solver", p.min_stake_solver},
            {"min_stake_verifier", p.min_stake_verifier},
            {"min_stake_whistleblower", p.min_stake_whistleblower},
            {"min_stake_aggregator", p.min_stake_aggregator},
            {"unbonding_delay_blocks", p.unbonding_delay_blocks},
            {"treasury_cut_bps", p.treasury_cut_bps},
            {"slash_jackpot_bps", p.slash_jackpot_bps},
            {"faucet_max_amount", p.faucet_max_amount},
            {"liveness_blocks", p.liveness_blocks},
            {"deadline_slack_permille", p.deadline_slack_permille},
            {"min_deadline_blocks", p.min_deadline_blocks}}},
          {"accounts", std::move(accounts)}};
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
  g.params.liveness_blocks = 60;
  g.params.deadline_slack_permille = 6000;
  g.params.min_deadline_blocks = 20;
  for (const PublicKey& k : funded_keys) g.accounts.push_back({k, balance_each});
  return g;
}

}  // namespace meshlearn::ledger
