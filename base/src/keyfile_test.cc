#include "meshlearn/base/keyfile.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "meshlearn/base/encoding.h"
#include "meshlearn/base/hash.h"
#include "meshlearn/base/hex.h"

namespace meshlearn {
namespace {

class KeyStoreTest : public ::testing::Test {
 protected:
  MemEnv env_;
  KeyStore store_{&env_, "/keys", KdfCost::Minimum()};
};

TEST_F(KeyStoreTest, PlainKeyRoundTripWithMode0600) {
  KeyPair kp = *store_.Create("alice", "");
  KeyPair back = *store_.Load("alice", "");
  EXPECT_EQ(back.public_key(), kp.public_key());
  EXPECT_EQ(*env_.FileMode(store_.PathOf("alice")), 0600u);
  EXPECT_FALSE(store_.Info("alice")->encrypted);
}

TEST_F(KeyStoreTest, EncryptedRightPassphrase) {
  KeyPair kp = *store_.Create("bob", "correct horse");
  EXPECT_TRUE(store_.Info("bob")->encrypted);
  Result<KeyPair> back = store_.Load("bob", "correct horse");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->public_key(), kp.public_key());
  // The file does not contain the seed in the clear.
  std::string text = *env_.ReadFile(store_.PathOf("bob"));
  EXPECT_EQ(text.find(HexEncode(kp.seed().bytes)), std::string::npos);
}

TEST_F(KeyStoreTest, WrongPassphraseIsClearAndChangesNothing) {
  ASSERT_TRUE(store_.Create("bob", "correct horse").ok());
  std::string before = *env_.ReadFile(store_.PathOf("bob"));
  Result<KeyPair> r = store_.Load("bob", "battery staple");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("wrong passphrase"), std::string::npos);
  EXPECT_EQ(*env_.ReadFile(store_.PathOf("bob")), before);
  Result<KeyPair> none = store_.Load("bob", "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("encrypted"), std::string::npos);
}

TEST_F(KeyStoreTest, CorruptFilesAreReportedAsCorrupt) {
  ASSERT_TRUE(store_.Create("carol", "pw").ok());
  std::string path = store_.PathOf("carol");
  std::string good = *env_.ReadFile(path);
  // Flip one hex digit of the ciphertext: the checksum catches it before decryption.
  std::string bad = good;
  size_t pos = bad.find("\"secret\": \"") + 11;
  bad[pos] = bad[pos] == '0' ? '1' : '0';
  ASSERT_TRUE(env_.WriteFileAtomic(path, bad, 0600).ok());
  Result<KeyPair> r = store_.Load("carol", "pw");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("corrupt"), std::string::npos);
  // Truncated file.
  ASSERT_TRUE(env_.WriteFileAtomic(path, good.substr(0, good.size() / 2), 0600).ok());
  r = store_.Load("carol", "pw");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  // Not JSON at all.
  ASSERT_TRUE(env_.WriteFileAtomic(path, "\x01\x02garbage", 0600).ok());
  EXPECT_EQ(store_.Load("carol", "pw").status().code(), StatusCode::kDataLoss);
}

TEST_F(KeyStoreTest, NeverOverwritesAKey) {
  KeyPair first = *store_.Create("dave", "");
  Result<KeyPair> again = store_.Create("dave", "");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_.Load("dave", "")->public_key(), first.public_key());
}

TEST_F(KeyStoreTest, ExportImportRestoresTheSameKey) {
  KeyPair kp = *store_.Create("erin", "pw");
  ASSERT_TRUE(env_.CreateDirs("/backup").ok());
  ASSERT_TRUE(store_.Export("erin", "/backup/erin.json").ok());
  EXPECT_EQ(*env_.FileMode("/backup/erin.json"), 0600u);
  KeyStore other(&env_, "/other-keys", KdfCost::Minimum());
  // An encrypted backup is decrypted at import (to check its secret): it needs the passphrase.
  Result<KeyInfo> no_pass = other.Import("/backup/erin.json", "");
  EXPECT_EQ(no_pass.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(no_pass.status().message().find("passphrase"), std::string::npos);
  EXPECT_EQ(other.Import("/backup/erin.json", "", "wrong").status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_FALSE(env_.FileExists(other.PathOf("erin")));
  Result<KeyInfo> info = other.Import("/backup/erin.json", "", "pw");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->name, "erin");
  EXPECT_EQ(other.Load("erin", "pw")->public_key(), kp.public_key());
  // Import refuses to overwrite and validates the backup.
  EXPECT_EQ(other.Import("/backup/erin.json", "", "pw").status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(env_.WriteFileAtomic("/backup/bad.json", "{}", 0600).ok());
  EXPECT_FALSE(other.Import("/backup/bad.json", "x").ok());
  EXPECT_FALSE(env_.FileExists(other.PathOf("x")));
}

// The checksum of keyfile.cc, recomputed: what someone who edits a key file by hand (or a buggy
// tool) produces -- a file that is intact by its checksum but whose secret is not its key's.
std::string Rechecksum(nlohmann::json j) {
  Encoder e;
  e.PutString(j["format"].get<std::string>()).PutU32(j["version"].get<uint32_t>())
      .PutString(j["name"].get<std::string>()).PutString(j["public_key"].get<std::string>())
      .PutString(j["encryption"].get<std::string>()).PutString(j["kdf_salt"].get<std::string>())
      .PutString(j["nonce"].get<std::string>()).PutU64(j["kdf_opslimit"].get<uint64_t>())
      .PutU64(j["kdf_memlimit"].get<uint64_t>()).PutString(j["secret"].get<std::string>());
  j["checksum"] = Blake2b(e.bytes()).ToHex();
  return j.dump(2);
}

// Before: such a backup was stored by Import and failed only when the key was first used.
TEST_F(KeyStoreTest, ImportRefusesASecretThatIsNotThePublicKeys) {
  ASSERT_TRUE(env_.CreateDirs("/backup").ok());
  for (const std::string& pass : {std::string(), std::string("pw")}) {
    SCOPED_TRACE(pass.empty() ? "clear" : "encrypted");
    nlohmann::json a = nlohmann::json::parse(EncodeKeyFile("a", KeyPair::Generate(), pass,
                                                           KdfCost::Minimum()));
    nlohmann::json b = nlohmann::json::parse(EncodeKeyFile("b", KeyPair::Generate(), pass,
                                                           KdfCost::Minimum()));
    a["public_key"] = b["public_key"];
    ASSERT_TRUE(env_.WriteFileAtomic("/backup/mixed.json", Rechecksum(a), 0600).ok());
    ASSERT_TRUE(store_.Info("a").status().code() == StatusCode::kNotFound);
    Result<KeyInfo> r = store_.Import("/backup/mixed.json", "mixed", pass);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("does not match"), std::string::npos) << r.status().ToString();
    EXPECT_FALSE(env_.FileExists(store_.PathOf("mixed")));
  }
}

// Before: a key file of mode 0644 was used without a word.
TEST_F(KeyStoreTest, LoadRefusesAKeyFileOthersCanRead) {
  KeyPair kp = *store_.Create("frank", "");
  const std::string path = store_.PathOf("frank");
  std::string text = *env_.ReadFile(path);
  ASSERT_TRUE(env_.WriteFileAtomic(path, text, 0644).ok());
  Result<KeyPair> r = store_.Load("frank", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("chmod 600 " + path), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(store_.Info("frank").ok());  // the public part is still shown
  ASSERT_TRUE(env_.WriteFileAtomic(path, text, 0600).ok());
  EXPECT_EQ(store_.Load("frank", "")->public_key(), kp.public_key());
}

// Before: one corrupt file made List fail as a whole.
TEST_F(KeyStoreTest, ListReportsABadFileAndListsTheRest) {
  ASSERT_TRUE(store_.Create("gina", "").ok());
  ASSERT_TRUE(store_.Create("hugo", "").ok());
  ASSERT_TRUE(env_.WriteFileAtomic(store_.PathOf("bad"), "{garbage", 0600).ok());
  Result<KeyListing> l = store_.List();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->keys.size(), 2u);
  EXPECT_EQ(l->keys[0].name, "gina");
  EXPECT_EQ(l->keys[1].name, "hugo");
  ASSERT_EQ(l->unreadable.size(), 1u);
  EXPECT_EQ(l->unreadable[0].name, "bad");
  EXPECT_EQ(l->unreadable[0].why.code(), StatusCode::kDataLoss);
}

TEST(KeyStoreNames, Validation) {
  EXPECT_TRUE(KeyStore::ValidateName("node-1.a_b").ok());
  EXPECT_FALSE(KeyStore::ValidateName("").ok());
  EXPECT_FALSE(KeyStore::ValidateName("../etc/passwd").ok());
  EXPECT_FALSE(KeyStore::ValidateName(".hidden").ok());
  EXPECT_FALSE(KeyStore::ValidateName(std::string(65, 'a')).ok());
}

}  // namespace
}  // namespace meshlearn
