// The etcd client against a real single-member etcd on loopback (skipped, saying so, without
// the etcd binary), and its pure parts (base64, endpoint lists) without one.
#include "meshlearn/ledger/etcd.h"

#include <gtest/gtest.h>

#include "etcd_test_util.h"
#include "service_test_util.h"

namespace meshlearn::ledger {
namespace {

TEST(Base64, RoundTripsEveryLengthAndByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 1) {
    std::string in = all.substr(0, n);
    Result<std::string> out = Base64Decode(Base64Encode(in));
    ASSERT_TRUE(out.ok()) << n;
    EXPECT_EQ(*out, in) << n;
  }
  EXPECT_EQ(Base64Encode("a"), "YQ==");
  EXPECT_EQ(Base64Encode("ab"), "YWI=");
  EXPECT_EQ(Base64Encode("abc"), "YWJj");
  EXPECT_FALSE(Base64Decode("YQ=").ok());
  EXPECT_FALSE(Base64Decode("Y=Q=").ok());
  EXPECT_FALSE(Base64Decode("YQ*=").ok());
}

TEST(EtcdEndpoints, ParsesAListAndNamesTheBadEntry) {
  Result<std::vector<std::string>> eps =
      ParseEtcdEndpoints("http://127.0.0.1:2379,http://10.0.0.2:22379/", "--cluster");
  ASSERT_TRUE(eps.ok()) << eps.status().ToString();
  EXPECT_EQ(*eps, (std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:22379"}));
  for (const char* bad : {"", "127.0.0.1:2379", "http://127.0.0.1", "http://h:23x9",
                          "http://127.0.0.1:2379,,http://127.0.0.1:2380", "https://h:1"}) {
    Result<std::vector<std::string>> r = ParseEtcdEndpoints(bad, "--cluster");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--cluster"), std::string::npos) << r.status().message();
  }
}

TEST(EtcdClient, UnreachableIsUnavailable) {
  EtcdClient etcd({"http://127.0.0.1:" + std::to_string(testing::FreePort())}, {.timeout_ms = 300});
  Result<int64_t> r = etcd.Put("k", "v");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("cannot reach etcd"), std::string::npos);
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string bin = testing::FindEtcd();
    if (bin.empty()) GTEST_SKIP() << "no etcd binary (apt-get install etcd-server); skipped";
    std::string error;
    ASSERT_TRUE(cluster_.Start(bin, 1, testing::TempDir(), &error)) << error;
  }
  testing::EtcdCluster cluster_;
};

TEST_F(EtcdTest, PutGetRangeDelete) {
  EtcdClient etcd(cluster_.ClientUrlList());
  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(etcd.Put("/t/b/2", binary).ok());
  ASSERT_TRUE(etcd.Put("/t/b/1", "one").ok());
  ASSERT_TRUE(etcd.Put("/t/c", "other").ok());
  Result<std::optional<EtcdKv>> got = etcd.Get("/t/b/2");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, binary);
  EXPECT_GT((*got)->create_revision, 0);
  Result<std::optional<EtcdKv>> none = etcd.Get("/t/none");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  Result<std::vector<EtcdKv>> range = etcd.Range("/t/b/", EtcdClient::PrefixEnd("/t/b/"));
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  ASSERT_EQ(range->size(), 2u);  // not /t/c
  EXPECT_EQ((*range)[0].key, "/t/b/1");
  EXPECT_EQ((*range)[1].key, "/t/b/2");
  Result<std::vector<EtcdKv>> limited = etcd.Range("/t/", EtcdClient::PrefixEnd("/t/"), 1);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->size(), 1u);

  ASSERT_TRUE(etcd.Delete("/t/b/1").ok());
  EXPECT_FALSE(etcd.Get("/t/b/1")->has_value());
}

// A block holding a Fashion-MNIST step witness is 3.3 MB; etcd's default request limit (1.5 MB)
// refused it and the replicated devnet stalled. The local cluster's members take the largest
// block, and the client waits for it.
TEST_F(EtcdTest, ABlockWithAStepWitnessFits) {
  EtcdClient etcd(cluster_.ClientUrlList());
  std::string big(4'000'000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 24);
  Result<int64_t> put = etcd.Put("/t/big", big);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  Result<std::optional<EtcdKv>> got = etcd.Get("/t/big");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, big);
}

TEST_F(EtcdTest, TxnIsACompareAndSwap) {
  EtcdClient etcd(cluster_.ClientUrlList());
  // Absent -> put: the first wins, the second finds the key and changes nothing.
  Result<bool> first = etcd.Txn({EtcdCompare::Absent("/h/1")}, {{"/h/1", "block-a"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(*first);
  Result<bool> second = etcd.Txn({EtcdCompare::Absent("/h/1")}, {{"/h/1", "block-b"}});
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);
  EXPECT_EQ(etcd.Get("/h/1")->value().value, "block-a");

  // Every comparison must hold: a value compare that fails blocks the put.
  ASSERT_TRUE(etcd.Put("/leader", "me").ok());
  Result<bool> wrong = etcd.Txn(
      {EtcdCompare::ValueEquals("/leader", "you"), EtcdCompare::Absent("/h/2")}, {{"/h/2", "x"}});
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(*wrong);
  EXPECT_FALSE(etcd.Get("/h/2")->has_value());
  Result<bool> right =
      etcd.Txn({EtcdCompare::ValueEquals("/leader", "me"), EtcdCompare::Absent("/h/2")},
               {{"/h/2", "x"}, {"/h/2-sig", "y"}});
  ASSERT_TRUE(right.ok());
  EXPECT_TRUE(*right);
  EXPECT_EQ(etcd.Get("/h/2-sig")->value().value, "y");
  // A value compare on a missing key fails.
  Result<bool> missing = etcd.Txn({EtcdCompare::ValueEquals("/nobody", "")}, {{"/h/3", "x"}});
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(*missing);
}

TEST_F(EtcdTest, LeaseKeepsAndRevokeDeletesItsKeys) {
  EtcdClient etcd(cluster_.ClientUrlList());
  Result<EtcdLease> lease = etcd.GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_GE(lease->ttl_s, 5);
  Result<bool> won = etcd.Txn({EtcdCompare::Absent("/leader")}, {{"/leader", "a", lease->id}});
  ASSERT_TRUE(won.ok() && *won);
  EXPECT_EQ(etcd.Get("/leader")->value().lease, lease->id);
  Result<int64_t> ttl = etcd.KeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(*ttl, 0);

  ASSERT_TRUE(etcd.RevokeLease(lease->id).ok());
  EXPECT_FALSE(etcd.Get("/leader")->has_value()) << "the leader key outlived its lease";
  Result<int64_t> gone = etcd.KeepAlive(lease->id);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
}

TEST_F(EtcdTest, ExpiredLeaseDeletesItsKeys) {
  EtcdClient etcd(cluster_.ClientUrlList());
  Result<EtcdLease> lease = etcd.GrantLease(1);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(etcd.Put("/ephemeral", "x", lease->id).ok());
  // Not renewed: etcd deletes the key once the TTL passes (polled, no timed assertion).
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = !etcd.Get("/ephemeral")->has_value();
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(etcd.KeepAlive(lease->id).status().code(), StatusCode::kNotFound);
}

TEST_F(EtcdTest, SkipsAnEndpointThatDoesNotAnswer) {
  std::vector<std::string> eps = {"http://127.0.0.1:" + std::to_string(testing::FreePort())};
  eps.push_back(cluster_.member(0).client_url);
  EtcdClient etcd(eps, {.timeout_ms = 300});
  ASSERT_TRUE(etcd.Put("/k", "v").ok());
  EXPECT_EQ(etcd.Get("/k")->value().value, "v");
  // A paused member (SIGSTOP) times out: Unavailable, not a hang.
  cluster_.Pause(0);
  Result<int64_t> r = etcd.Put("/k", "w");
  cluster_.Resume(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace meshlearn::ledger
