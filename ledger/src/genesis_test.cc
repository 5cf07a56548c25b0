#include "meshlearn/ledger/genesis.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <type_traits>

#include <gtest/gtest.h>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/keyfile.h"
#include "meshlearn/base/test_dir.h"
#include "meshlearn/ledger/chain.h"

#include "test_util.h"

namespace meshlearn::ledger {
namespace {

using testing::TestKey;

TEST(GenesisTest, WriteThenLoadGivesTheSameGenesis) {
  MemEnv env;
  Genesis g = DevnetGenesis({TestKey(1).public_key(), TestKey(2).public_key()}, 500, "dev-1");
  g.sequencer = TestKey(3).public_key();
  g.params.treasury_cut_bps = 123;
  ASSERT_TRUE(WriteGenesis(&env, "/g.toml", g).ok());
  auto back = LoadGenesis(&env, "/g.toml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  EXPECT_EQ(GenesisHash(*back), GenesisHash(g));
  EXPECT_EQ(GenesisToJson(g)["genesis_hash"], GenesisHash(g).ToHex());
}

TEST(GenesisTest, MinimalFileUsesDefaults) {
  auto g = ParseGenesis("chain_id = \"x\"\n");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->block_interval_ms, 1000);
  EXPECT_FALSE(g->faucet);
  EXPECT_EQ(g->params, ChainParams{});
  EXPECT_TRUE(g->accounts.empty());
}

TEST(GenesisTest, ErrorsNameTheProblem) {
  auto expect_error = [](const std::string& text, const std::string& part) {
    auto g = ParseGenesis(text, "genesis.toml");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(part), std::string::npos) << g.status().ToString();
  };
  std::string key = TestKey(1).public_key().ToHex();
  expect_error("chain_idd = \"x\"\n", "chain_idd");
  expect_error("chain_id = \"bad id\"\n", "chain_id");
  expect_error("chain_id = \"x\"\nblock_interval_ms = 0\n", "block_interval_ms");
  expect_error("chain_id = \"x\"\n[params]\ntreasury_cut_bps = 10001\n", "treasury_cut_bps");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"zz\"\nbalance = 1\n", "key");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"" + key + "\"\nbalance = -1\n", "balance");
  expect_error("chain_id = \"x\"\n[[accounts]]\nkey = \"" + key + "\"\nbalance = 1\n[[accounts]]\nkey = \"" +
                   key + "\"\nbalance = 2\n",
               "twice");
}

// A solver must still be bonded when a fraud proof arrives within a task's audit window.
TEST(GenesisTest, TheUnbondingDelayCoversTheAuditWindow) {
  auto g = ParseGenesis(
      "chain_id = \"x\"\n[params]\nunbonding_delay_blocks = 50\n"
      "audit_window_blocks = 51\n",
      "genesis.toml");
  ASSERT_FALSE(g.ok());
  const std::string m = g.status().message();
  for (const char* part : {"params.unbonding_delay_blocks (50)", "params.audit_window_blocks (51)",
                           "raise unbonding_delay_blocks to at least 51"}) {
    EXPECT_NE(m.find(part), std::string::npos) << m;
  }
  g = ParseGenesis(
      "chain_id = \"x\"\n[params]\nunbonding_delay_blocks = 51\n"
      "audit_window_blocks = 51\n");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->params.audit_window_blocks, 51u);
  EXPECT_LE(ChainParams{}.audit_window_blocks, ChainParams{}.unbonding_delay_blocks);
  const Genesis devnet = DevnetGenesis({TestKey(1).public_key()}, 5);
  EXPECT_TRUE(ValidateGenesis(devnet).ok());
  EXPECT_LE(devnet.params.audit_window_blocks, devnet.params.unbonding_delay_blocks);
  Genesis changed = devnet;
  changed.params.audit_window_blocks--;
  EXPECT_NE(GenesisHash(changed), GenesisHash(devnet));
}

TEST(GenesisTest, TotalBalanceMustFit) {
  Genesis g = DevnetGenesis({TestKey(1).public_key(), TestKey(2).public_key()}, UINT64_MAX / 2 + 1);
  EXPECT_FALSE(ValidateGenesis(g).ok());
}

TEST(GenesisTest, HashDependsOnEverything) {
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 5);
  Hash256 h = GenesisHash(g);
  Genesis g2 = g;
  g2.params.unbonding_delay_blocks++;
  EXPECT_NE(GenesisHash(g2), h);
  g2 = g;
  g2.faucet = false;
  EXPECT_NE(GenesisHash(g2), h);
  g2 = g;
  g2.chain_id = "other";
  EXPECT_NE(GenesisHash(g2), h);
}

// A param of the genesis encoding's tail (`field`, written `name` in TOML and JSON), `g` at its
// default: set to 7 or to 0 (none), the genesis hashes otherwise than `g` and than each other;
// set, it round-trips through the TOML file and shows in the JSON; parsed from TOML, it reads back.
void ExpectTailParamHashedAndRoundTripped(const Genesis& g, Amount ChainParams::*field,
                                          const std::string& name) {
  Genesis set = g;
  set.params.*field = 7;
  EXPECT_NE(GenesisHash(set), GenesisHash(g)) << name;
  Genesis none = g;
  none.params.*field = 0;
  EXPECT_NE(GenesisHash(none), GenesisHash(g)) << name;
  EXPECT_NE(GenesisHash(none), GenesisHash(set)) << name;
  MemEnv env;
  ASSERT_TRUE(WriteGenesis(&env, "/g.toml", set).ok());
  auto back = LoadGenesis(&env, "/g.toml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->params.*field, 7u) << name;
  EXPECT_EQ(GenesisHash(*back), GenesisHash(set)) << name;
  EXPECT_EQ(GenesisToJson(set)["params"][name], 7) << name;
  auto parsed = ParseGenesis("chain_id = \"x\"\n[params]\n" + name + " = 3\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->params.*field, 3u) << name;
}

// ChainParams::serve_bond_per_piece came after the genesis encoding was fixed: a genesis that
// keeps its default hashes exactly as the encoding before it (written out here), so no chain's
// genesis hash, nor any state hash, changed with it; one that sets it hashes otherwise, and it
// round-trips through TOML and JSON like every param.
TEST(GenesisTest, TheServeBondPerPieceIsHashedOnlyWhereItIsNotTheDefault) {
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 5);
  ASSERT_EQ(g.params.serve_bond_per_piece, ChainParams::kDefaultServeBondPerPiece);
  ASSERT_EQ(ChainParams::kDefaultServeBondPerPiece, 100u);
  Encoder e;
  e.PutString(g.chain_id).PutI64(g.genesis_time_ms).PutI64(g.block_interval_ms);
  e.PutPublicKey(g.sequencer).PutBool(g.faucet);
  e.PutPublicKey(g.referee);
  ChainParams::Visit(g.params, [&](const char*, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) {
      e.PutBool(v);
    } else if constexpr (sizeof(v) == 4) {
      e.PutU32(v);
    } else {
      e.PutU64(v);
    }
  });
  e.PutU32(static_cast<uint32_t>(g.accounts.size()));
  for (const GenesisAccount& a : g.accounts) e.PutPublicKey(a.key).PutU64(a.balance);
  Hasher before("meshlearn.genesis.v1");
  before.Update(e.bytes());
  EXPECT_EQ(GenesisHash(g), before.Finish());
  ExpectTailParamHashedAndRoundTripped(g, &ChainParams::serve_bond_per_piece,
                                       "serve_bond_per_piece");
  EXPECT_FALSE(ParseGenesis("chain_id = \"x\"\n[params]\nserve_bond_per_piece = -1\n").ok());
}

// ChainParams::proof_commit_deposit came after the genesis encoding was fixed too: at its default
// a genesis hashes as before (the test above writes that encoding out with every tail param at
// its default); set, it hashes otherwise and round-trips through TOML and JSON.
TEST(GenesisTest, TheProofCommitDepositIsHashedOnlyWhereItIsNotTheDefault) {
  const Genesis g = DevnetGenesis({TestKey(1).public_key()}, 5);
  ASSERT_EQ(g.params.proof_commit_deposit, ChainParams::kDefaultProofCommitDeposit);
  ASSERT_EQ(ChainParams::kDefaultProofCommitDeposit, 100u);
  ExpectTailParamHashedAndRoundTripped(g, &ChainParams::proof_commit_deposit,
                                       "proof_commit_deposit");
}

// A replicated chain's candidates (issue 18): listed, round-tripped, hashed, enforced.
TEST(GenesisTest, SequencersListTheCandidates) {
  MemEnv env;
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 500, "dev-1");
  Hash256 single = GenesisHash(g);
  g.sequencer = TestKey(3).public_key();
  Hash256 one = GenesisHash(g);
  g.sequencers = {TestKey(3).public_key(), TestKey(4).public_key(), TestKey(5).public_key()};
  ASSERT_TRUE(ValidateGenesis(g).ok());
  EXPECT_NE(GenesisHash(g), one);
  EXPECT_NE(one, single);
  ASSERT_TRUE(WriteGenesis(&env, "/g.toml", g).ok());
  auto back = LoadGenesis(&env, "/g.toml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  EXPECT_EQ(GenesisHash(*back), GenesisHash(g));
  EXPECT_TRUE(IsAuthorizedSequencer(g, TestKey(4).public_key()));
  EXPECT_FALSE(IsAuthorizedSequencer(g, TestKey(6).public_key()));
  EXPECT_EQ(AuthorizedSequencers(g).size(), 3u);
  EXPECT_EQ(GenesisToJson(g)["sequencers"].size(), 3u);

  // Without the list: the single sequencer, or anyone on a genesis that names none.
  Genesis plain = DevnetGenesis({}, 0);
  EXPECT_TRUE(IsAuthorizedSequencer(plain, TestKey(6).public_key()));
  EXPECT_TRUE(AuthorizedSequencers(plain).empty());
  EXPECT_FALSE(GenesisToJson(plain).contains("sequencers"));
  plain.sequencer = TestKey(3).public_key();
  EXPECT_FALSE(IsAuthorizedSequencer(plain, TestKey(6).public_key()));
  EXPECT_TRUE(IsAuthorizedSequencer(plain, TestKey(3).public_key()));
}

TEST(GenesisTest, SequencersErrorsNameTheFileAndTheKey) {
  auto expect_error = [](const std::string& text, const std::string& part) {
    auto g = ParseGenesis(text, "cluster/genesis.toml");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(part), std::string::npos) << g.status().ToString();
    EXPECT_NE(g.status().message().find("cluster/genesis.toml"), std::string::npos)
        << g.status().ToString();
  };
  std::string a = TestKey(1).public_key().ToHex(), b = TestKey(2).public_key().ToHex();
  std::string head = "chain_id = \"x\"\nsequencer = \"" + a + "\"\n";
  expect_error(head + "sequencers = [\"" + a + "\", \"zz\"]\n", "sequencers");
  expect_error(head + "sequencers = [\"" + a + "\", \"zz\"]\n", "entry 1");
  expect_error(head + "sequencers = []\n", "sequencers");
  expect_error(head + "sequencers = [\"" + a + "\", \"" + a + "\"]\n", "twice");
  expect_error(head + "sequencers = [\"" + b + "\"]\n", "is not one of sequencers");
  expect_error("chain_id = \"x\"\nsequencers = [\"" + b + "\"]\n", "is not one of sequencers");
  auto ok = ParseGenesis(head + "sequencers = [\"" + b + "\", \"" + a + "\"]\n", "g.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->sequencers.size(), 2u);
}

// The chain enforces the list: any listed key produces and is applied, an unlisted one is not.
TEST(GenesisTest, TheChainAcceptsEveryListedSequencerAndNoOther) {
  testing::TempDir dir;
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 500, "dev-1");
  g.sequencer = TestKey(3).public_key();
  g.sequencers = {TestKey(3).public_key(), TestKey(4).public_key()};
  auto producer = Chain::Open(dir.File("a.db"), g);
  auto follower = Chain::Open(dir.File("b.db"), g);
  ASSERT_TRUE(producer.ok() && follower.ok());
  Result<Block> b1 = (*producer)->ProduceBlock({}, 10, TestKey(3));
  ASSERT_TRUE(b1.ok()) << b1.status().ToString();
  Result<Block> b2 = (*producer)->ProduceBlock({}, 20, TestKey(4));
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  Result<Block> rogue = (*producer)->ProduceBlock({}, 30, TestKey(5));
  ASSERT_FALSE(rogue.ok());
  EXPECT_EQ(rogue.status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE((*follower)->ApplyBlock(*b1, TestKey(3).public_key()).ok());
  EXPECT_TRUE((*follower)->ApplyBlock(*b2, TestKey(4).public_key()).ok());

  // A block signed (validly) by an unlisted key is refused.
  Block forged = *(*producer)->ProduceBlock({}, 40, TestKey(3));
  forged.header.sequencer = TestKey(5).public_key();
  forged.signature = TestKey(5).Sign(BlockHash(forged.header).span());
  Status s = (*follower)->ApplyBlock(forged, TestKey(5).public_key());
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
}

std::string TempDir() { return TestDir("genesis"); }

size_t Entries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// Before: `chain init` made the directory, then the key, then the genesis, each step checked
// apart, so concurrent inits of one directory could all succeed and mix their files.
TEST(ChainDirTest, CreatedWholeOnceAndNeverReplaced) {
  const std::string base = TempDir();
  const std::string dir = base + "/chain";
  Genesis g = DevnetGenesis({TestKey(1).public_key()}, 5);
  g.sequencer = TestKey(7).public_key();
  ASSERT_TRUE(CreateChainDir(dir, g, TestKey(7)).ok());
  Result<Genesis> back = LoadGenesis(Env::Default(), ChainGenesisPath(dir));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, g);
  Result<KeyPair> key = KeyStore(Env::Default(), ChainKeysDir(dir)).Load(kSequencerKeyName, "");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(key->public_key(), g.sequencer);

  Genesis other = g;
  other.sequencer = TestKey(8).public_key();
  Status again = CreateChainDir(dir, other, TestKey(8));
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("already holds a chain"), std::string::npos) << again.ToString();
  EXPECT_EQ(*LoadGenesis(Env::Default(), ChainGenesisPath(dir)), g);
  EXPECT_EQ(Entries(base), 1u);  // no temporary left beside it

  // An empty directory is taken; one holding anything else is not touched.
  const std::string empty = base + "/empty";
  std::filesystem::create_directory(empty);
  EXPECT_TRUE(CreateChainDir(empty, g, TestKey(7)).ok());
  const std::string busy = base + "/busy";
  std::filesystem::create_directory(busy);
  std::ofstream(busy + "/notes.txt") << "mine";
  Status s = CreateChainDir(busy, g, TestKey(7));
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Entries(busy), 1u);
  EXPECT_EQ(Entries(base), 3u);
}

TEST(ChainDirTest, ConcurrentCreatorsExactlyOneWins) {
  const std::string dir = TempDir() + "/chain";
  std::vector<std::thread> threads;
  std::atomic<int> won{0};
  std::atomic<int> refused{0};
  for (uint8_t i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      Genesis g = DevnetGenesis({}, 0);
      g.sequencer = TestKey(10 + i).public_key();
      Status s = CreateChainDir(dir, g, TestKey(10 + i));
      if (s.ok()) {
        ++won;
      } else if (s.code() == StatusCode::kAlreadyExists) {
        ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), 7);
  Result<Genesis> g = LoadGenesis(Env::Default(), ChainGenesisPath(dir));
  ASSERT_TRUE(g.ok());
  Result<KeyPair> key = KeyStore(Env::Default(), ChainKeysDir(dir)).Load(kSequencerKeyName, "");
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->public_key(), g->sequencer);
  EXPECT_EQ(Entries(DirName(dir)), 1u);
}

}  // namespace
}  // namespace meshlearn::ledger
