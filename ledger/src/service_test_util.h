// Shared fixtures for the service tests: a fresh chain in a temp directory with funded keys, a
// sequencer and an RPC service over it.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "meshlearn/base/clock.h"
#include "meshlearn/base/hex.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/ledger/chain.h"
#include "meshlearn/ledger/genesis.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/ledger/sequencer.h"
#include "meshlearn/ledger/shared_chain.h"
#include "meshlearn/ledger/tx.h"

namespace meshlearn::ledger::testing {

inline std::string TempDir() { return TestDir("ledgersvc"); }

// Runs `cmd` through the shell: its exit code (-1 if it did not exit) and its stdout.
inline std::pair<int, std::string> RunShell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p == nullptr ? -1 : pclose(p);
  return {status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The whole file (a server's log, a command's output); empty if it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline KeyPair KeyFromByte(uint8_t b) {
  KeySeed seed;
  seed.bytes.fill(b);
  return KeyPair::FromSeed(seed);
}

inline nlohmann::json Request(const std::string& method, nlohmann::json params = nlohmann::json::object(),
                              nlohmann::json id = 1) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
}

inline std::string TxHex(const Transaction& tx) { return HexEncode(EncodeTx(tx)); }

// A chain with accounts alice (key 1) and bob (key 2), each holding kFunds, sequenced by key 9.
struct TestLedger {
  static constexpr Amount kFunds = 1'000'000;
  static constexpr const char* kChainId = "meshlearn-test";

  explicit TestLedger(int64_t block_interval_ms = 1000, std::string dir_in = TempDir())
      : dir(std::move(dir_in)), alice(KeyFromByte(1)), bob(KeyFromByte(2)), seq_key(KeyFromByte(9)) {
    genesis = DevnetGenesis({alice.public_key(), bob.public_key()}, kFunds, kChainId);
    genesis.block_interval_ms = block_interval_ms;
    genesis.sequencer = seq_key.public_key();
    Result<std::unique_ptr<Chain>> c = Chain::Open(dir + "/chain.db", genesis);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    chain = std::move(c).value();
    shared = std::make_unique<SharedChain>(chain.get());
    sequencer = std::make_unique<Sequencer>(shared.get(), seq_key, &clock);
    rpc = std::make_unique<RpcService>(shared.get(), sequencer.get());
  }

  Transaction Transfer(const KeyPair& from, const KeyPair& to, Amount amount, uint64_t nonce) const {
    return BuildSignedTx(from, kChainId, nonce, TransferTx{.to = to.public_key(), .amount = amount, .memo = ""});
  }

  nlohmann::json Call(const std::string& method, nlohmann::json params = nlohmann::json::object()) {
    return rpc->HandleRpc(Request(method, std::move(params)));
  }

  Amount Balance(const KeyPair& k) {
    return shared->With([&](Chain& c) {
      Result<Account> a = c.GetAccount(k.public_key());
      return a.ok() ? a->balance : Amount{0};
    });
  }

  std::string dir;
  KeyPair alice, bob, seq_key;
  FakeClock clock{1'700'000'000'000};
  Genesis genesis;
  std::unique_ptr<Chain> chain;
  std::unique_ptr<SharedChain> shared;
  std::unique_ptr<Sequencer> sequencer;
  std::unique_ptr<RpcService> rpc;
};

inline int ErrorCode(const nlohmann::json& response) {
  if (!response.contains("error")) return 0;
  return response["error"]["code"].get<int>();
}

}  // namespace meshlearn::ledger::testing
