// Runs the real `meshlearn` binary and checks its output and exit codes.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

struct CmdResult {
  int code;
  std::string out;  // stdout and stderr together
};

CmdResult Meshlearn(const std::string& args, const std::string& home) {
  std::string cmd = "MESHLEARN_HOME=" + home + " " + MESHLEARN_BIN + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string TempHome() {
  char tmpl[] = "/tmp/meshlearn-cli-XXXXXX";
  return mkdtemp(tmpl);
}

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

}  // namespace
