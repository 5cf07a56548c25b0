// The genesis file: what a chain starts from. Every node of a network must load the same one;
// GenesisHash identifies it and Chain::Open refuses a database made from another.
//
// genesis.toml:
//   chain_id = "meshlearn-devnet"
//   genesis_time_ms = 0
//   block_interval_ms = 1000
//   sequencer = "<hex public key>"      # optional; if set, only this key may sign blocks
//   faucet = true                       # devnets only
//   [params]                            # every key optional, defaults below
//   min_stake_solver = 1000
//   min_stake_verifier = 1000
//   min_stake_whistleblower = 1000
//   min_stake_aggregator = 1000
//   unbonding_delay_blocks = 100
//   treasury_cut_bps = 200              # of every payout from escrow, in basis points
//   slash_jackpot_bps = 5000            # share of slashed stake that goes to the jackpot pool
//   faucet_max_amount = 1000000000
//   liveness_blocks = 30                # scheduler: a node is live if its heartbeat is this recent
//   deadline_slack_permille = 2000      # scheduler: deadline = estimate x slack / 1000 ...
//   min_deadline_blocks = 5             # ... but at least this many blocks after assignment
//   [[accounts]]
//   key = "<hex public key>"
//   balance = 1000000
//
//   ML_ASSIGN_OR_RETURN(Genesis g, LoadGenesis(Env::Default(), "genesis.toml"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshlearn/base/env.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/sign.h"
#include "meshlearn/base/status.h"
#include "meshlearn/ledger/state.h"

namespace meshlearn::ledger {

struct ChainParams {
  Amount min_stake_solver = 1000;
  Amount min_stake_verifier = 1000;
  Amount min_stake_whistleblower = 1000;
  Amount min_stake_aggregator = 1000;
  uint64_t unbonding_delay_blocks = 100;
  uint32_t treasury_cut_bps = 200;   // <= 10000
  uint32_t slash_jackpot_bps = 5000;  // <= 10000
  Amount faucet_max_amount = 1'000'000'000;
  // Scheduler knobs (protocol::SchedulerParams): generous values let a loaded machine keep up.
  uint64_t liveness_blocks = 30;
  uint32_t deadline_slack_permille = 2000;  // >= 1000
  uint64_t min_deadline_blocks = 5;         // >= 1
  bool operator==(const ChainParams&) const = default;

  // The stake a node with these roles must keep while active: the largest of the roles' minima.
  Amount MinStakeFor(uint32_t roles) const;
};

struct GenesisAccount {
  PublicKey key;
  Amount balance = 0;
  bool operator==(const GenesisAccount&) const = default;
};

struct Genesis {
  std::string chain_id = "meshlearn-devnet";
  int64_t genesis_time_ms = 0;
  int64_t block_interval_ms = 1000;
  PublicKey sequencer;  // all zero: any key may sequence (the follower passes its own)
  bool faucet = false;
  ChainParams params;
  std::vector<GenesisAccount> accounts;  // distinct keys
  bool operator==(const Genesis&) const = default;
};

// Checks chain id (1-64 chars of [A-Za-z0-9_.-]), interval > 0, bps <= 10000, distinct account
// keys, and that the total balance fits in an Amount.
Status ValidateGenesis(const Genesis& g);
Hash256 GenesisHash(const Genesis& g);  // over the canonical encoding

Result<Genesis> ParseGenesis(std::string_view toml_text, std::string name = "genesis.toml");
Result<Genesis> LoadGenesis(Env* env, const std::string& path);
std::string GenesisToToml(const Genesis& g);
Status WriteGenesis(Env* env, const std::string& path, const Genesis& g);
nlohmann::json GenesisToJson(const Genesis& g);

// A devnet genesis: faucet on, each key funded with `balance_each`, small minimum stakes,
// a short unbonding delay (10 blocks) so local tests move quickly, and generous scheduler
// knobs (liveness 60 blocks, slack 6000 permille, deadlines at least 20 blocks) so a loaded
// machine does not miss deadlines.
Genesis DevnetGenesis(const std::vector<PublicKey>& funded_keys, Amount balance_each,
                      std::string chain_id = "meshlearn-devnet");

}  // namespace meshlearn::ledger
