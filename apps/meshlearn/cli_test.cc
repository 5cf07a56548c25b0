// Runs the real `meshlearn` binary and checks its output and exit codes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process_test_util.h"

namespace {

using meshlearn::process_test::ChainServer;
using meshlearn::process_test::CmdResult;
using meshlearn::process_test::Meshlearn;
using meshlearn::process_test::ReadText;
using meshlearn::process_test::Shell;
std::string TempHome() { return meshlearn::process_test::TempDir("cli"); }

TEST(Cli, HelpListsCommandsWithExamples) {
  CmdResult r = Meshlearn("--help", TempHome());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("keys"), std::string::npos);
  EXPECT_NE(r.out.find("version"), std::string::npos);
  EXPECT_NE(r.out.find("Examples"), std::string::npos);
}

TEST(Cli, VersionJson) {
  CmdResult r = Meshlearn("--json version", TempHome());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.contains("git_commit"));
  EXPECT_TRUE(j.contains("cpu_features"));
}

TEST(Cli, BadLogLevelIsAUsageError) {
  CmdResult r = Meshlearn("--log-level loud version", TempHome());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("trace, debug, info"), std::string::npos) << r.out;
}

TEST(Cli, KeysLifecycle) {
  std::string home = TempHome();
  CmdResult created = Meshlearn("--json keys new alice --no-passphrase", home);
  ASSERT_EQ(created.code, 0) << created.out;
  std::string pk = nlohmann::json::parse(created.out)["public_key"];

  CmdResult dup = Meshlearn("keys new alice --no-passphrase", home);
  EXPECT_EQ(dup.code, 1);
  EXPECT_NE(dup.out.find("already exists"), std::string::npos);

  CmdResult list = Meshlearn("--json keys list", home);
  ASSERT_EQ(list.code, 0);
  EXPECT_EQ(nlohmann::json::parse(list.out)[0]["public_key"], pk);

  std::string backup = home + "/backup.json";
  ASSERT_EQ(Meshlearn("keys export alice " + backup, home).code, 0);
  std::string other = TempHome();
  CmdResult imp = Meshlearn("--json keys import " + backup, other);
  ASSERT_EQ(imp.code, 0) << imp.out;
  EXPECT_EQ(nlohmann::json::parse(imp.out)["public_key"], pk);

  CmdResult err = Meshlearn("--json keys show nobody", home);
  EXPECT_EQ(err.code, 1);
  EXPECT_TRUE(nlohmann::json::parse(err.out).contains("error"));
}

TEST(Cli, EncryptedKeyWithPassphraseFile) {
  std::string home = TempHome();
  std::string pass = home + "/pass.txt";
  FILE* f = fopen(pass.c_str(), "w");
  fputs("correct horse\n", f);
  fclose(f);
  CmdResult r = Meshlearn("--json keys new bob --passphrase-file " + pass, home);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["encrypted"], true);
}

uint64_t Balance(const std::string& who, const std::string& url, const std::string& home) {
  CmdResult r = Meshlearn("--json wallet balance " + who + " --rpc " + url + " 2>/dev/null", home);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  return j.is_discarded() ? 0 : j.value("balance", uint64_t{0});
}

// A send that timed out is retried by running the same command again: the wallet resends the
// very same signed transaction (kept in $MESHLEARN_HOME/outbox), so it is paid once. A different
// command is refused while it is unconfirmed; after a confirmed send, the same command pays again.
TEST(Cli, WalletRetryAfterTimeoutPaysOnce) {
  std::string home = TempHome();
  ASSERT_EQ(Meshlearn("keys new alice --no-passphrase", home).code, 0);
  ASSERT_EQ(Meshlearn("keys new bob --no-passphrase", home).code, 0);
  ChainServer server(home);
  ASSERT_FALSE(server.url().empty()) << "chain serve did not start";
  const std::string rpc = " --rpc " + server.url();

  // --timeout 0: the wait ends at once, as a timeout would; the transaction waits in the outbox.
  CmdResult timed_out = Meshlearn("wallet transfer bob 100 --key alice --timeout 0" + rpc, home);
  EXPECT_EQ(timed_out.code, 1);
  EXPECT_NE(timed_out.out.find("Re-running this same command"), std::string::npos) << timed_out.out;
  EXPECT_TRUE(std::ifstream(home + "/outbox/alice.tx").good());

  CmdResult other = Meshlearn("wallet transfer bob 7 --key alice" + rpc, home);
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.out.find("unconfirmed transaction"), std::string::npos) << other.out;

  CmdResult retry = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(retry.code, 0) << retry.out;
  EXPECT_NE(retry.out.find("resending the earlier"), std::string::npos) << retry.out;
  CmdResult again = Meshlearn("wallet transfer bob 100 --key alice --timeout 30" + rpc, home);
  ASSERT_EQ(again.code, 0) << again.out;  // a confirmed send left no outbox: a new payment
  EXPECT_EQ(Balance("bob", server.url(), home), 200u);
  EXPECT_FALSE(std::ifstream(home + "/outbox/alice.tx").good());
}

}  // namespace
