// Task bundles, state and delta blobs, and the upload service: round trips and refusals.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "meshlearn/base/encoding.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/net/sim_transport.h"
#include "meshlearn/node/blob_push.h"
#include "meshlearn/node/state_blob.h"
#include "meshlearn/node/task_bundle.h"
#include "testing/synthetic_task.h"

namespace meshlearn::node {
namespace {

TEST(StateBlobTest, RoundTripAndRefusals) {
  std::vector<float> w = {1.0f, -2.5f, 3.25f}, m = {0.0f, 0.5f, -0.125f};
  Bytes blob = EncodeGlobalState(w, m);
  EXPECT_EQ(blob.size(), 5u + 8u + 24u);
  EXPECT_EQ(std::string(blob.begin(), blob.begin() + 5), "MLGS1");
  Result<GlobalState> s = DecodeGlobalState(blob, 3);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->weights, w);
  EXPECT_EQ(s->momentum, m);
  // Read in parts (a stage unit's start): the count from the header and the blob's size, checked
  // as the whole blob is; the weights read from a store's chunks.
  const ByteSpan head(blob.data(), protocol::kGlobalStateHeaderSize);
  EXPECT_EQ(protocol::GlobalStateCount(head, blob.size(), 3).value(), 3u);
  EXPECT_FALSE(protocol::GlobalStateCount(head, blob.size(), 4).ok());      // wrong model size
  EXPECT_FALSE(protocol::GlobalStateCount(head, blob.size() - 1, 3).ok());  // truncated
  EXPECT_FALSE(protocol::GlobalStateCount(head, blob.size() + 1, 3).ok());  // trailing bytes
  {
    MemEnv env;
    Result<std::unique_ptr<net::BlobStore>> store = net::BlobStore::Open(&env, "/blobs");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    Result<net::BlobId> id = (*store)->Put(blob, /*chunk_size=*/8);  // floats across chunks
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    Result<GlobalWeightsReader> reader = BlobWeightsReader(store->get(), *id, 3);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ(reader->size, 3u);
    std::vector<float> part(2);
    ASSERT_TRUE(reader->read(1, part).ok());
    EXPECT_EQ(part, std::vector<float>(w.begin() + 1, w.end()));
    EXPECT_FALSE(BlobWeightsReader(store->get(), *id, 4).ok());
  }

  EXPECT_FALSE(DecodeGlobalState(blob, 4).ok());  // wrong model size
  Bytes trailing = blob;
  trailing.push_back(0);
  Result<GlobalState> t = DecodeGlobalState(trailing);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("trailing"), std::string::npos);
  Bytes truncated(blob.begin(), blob.end() - 1);
  EXPECT_NE(DecodeGlobalState(truncated).status().message().find("truncated"), std::string::npos);
  EXPECT_FALSE(DecodeGlobalState(Bytes(blob.begin(), blob.begin() + 7)).ok());
  Bytes bad_magic = blob;
  bad_magic[0] = 'X';
  EXPECT_NE(DecodeGlobalState(bad_magic).status().message().find("magic"), std::string::npos);
  // A delta is not a state and vice versa.
  EXPECT_FALSE(DecodeDelta(blob).ok());
  // A huge declared count is refused before any allocation.
  Bytes huge = blob;
  for (int i = 0; i < 8; ++i) huge[5 + i] = 0xff;
  EXPECT_FALSE(DecodeGlobalState(huge).ok());
}

TEST(StateBlobTest, DeltaKeepsNonFiniteValues) {
  std::vector<float> d = {1.0f, std::numeric_limits<float>::quiet_NaN(), -1e30f};
  Result<std::vector<float>> back = DecodeDelta(EncodeDelta(d), 3);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)[0], 1.0f);
  EXPECT_TRUE(std::isnan((*back)[1]));
  EXPECT_FALSE(DecodeDelta(EncodeDelta(d), 2).ok());
  Bytes empty = EncodeDelta(std::vector<float>{});
  ASSERT_TRUE(DecodeDelta(empty).ok());
  EXPECT_TRUE(DecodeDelta(empty)->empty());
}

TEST(TaskBundleTest, RewriteKeepsEverythingElse) {
  std::string toml =
      "[task]\nname = \"x\"\n[data]\nformat = \"npy\"\ntrain_x = \"a.npy\"  # c\n"
      "  train_y = 'b.npy'\n[model]\ntrain_x = \"not data\"\n";
  Result<std::string> out = RewriteDataPaths(toml, {{"train_x", "blob:1"}, {"train_y", "blob:2"}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out,
            "[task]\nname = \"x\"\n[data]\nformat = \"npy\"\ntrain_x = \"blob:1\"\n"
            "train_y = \"blob:2\"\n[model]\ntrain_x = \"not data\"\n");
  Result<std::string> missing = RewriteDataPaths(toml, {{"test_x", "blob:3"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("data.test_x"), std::string::npos);
}

TEST(TaskBundleTest, MakeAndLoad) {
  MemEnv env;
  Result<std::string> toml =
      testing::WriteSyntheticTask(&env, "/sub/data", 3, 64, 32, 8, 4, 2, 2, 3, 1);
  ASSERT_TRUE(toml.ok()) << toml.status().ToString();
  ASSERT_TRUE(env.WriteFileAtomic("/sub/task.toml", *toml).ok());
  auto store = net::BlobStore::Open(&env, "/sub/blobs");
  ASSERT_TRUE(store.ok());
  Result<TaskBundle> b = MakeBundle(&env, "/sub/task.toml", store->get());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->files.size(), 4u);
  EXPECT_EQ(b->text.find("/sub/data"), std::string::npos);
  EXPECT_NE(b->text.find("# synthetic test task"), std::string::npos);  // comments kept
  EXPECT_TRUE((*store)->HasBlob(b->id));
  EXPECT_TRUE((*store)->IsPinned(b->files[0].id));

  // A node: resolve each blob to a file of its own.
  ASSERT_TRUE(env.CreateDirs("/node").ok());
  int resolved = 0;
  Result<LoadedBundle> loaded = LoadBundle(
      b->text, [&](const net::BlobId& id, const std::string& key) -> Result<std::string> {
        ++resolved;
        ML_ASSIGN_OR_RETURN(Bytes data, (*store)->Get(id));
        std::string path = "/node/" + key;
        ML_RETURN_IF_ERROR(env.WriteFileAtomic(path, AsStringView(data)));
        return path;
      });
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(resolved, 4);
  EXPECT_EQ(loaded->task.data.train_x, "/node/train_x");
  EXPECT_EQ(loaded->net.rounds, 2u);
  auto trainer = engine::Trainer::Create(&env, loaded->task);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  TaskFacts f = ComputeTaskFacts(**trainer, loaded->net);
  EXPECT_EQ(f.num_params, 8u * 16 + 16 + 16 * 4 + 4);
  EXPECT_EQ(f.model_bytes, 4 * f.num_params);
  EXPECT_EQ(f.num_examples, 64u);
  EXPECT_GE(f.flops_per_sample, 6 * f.num_params);
  GlobalState s0 = InitialState(**trainer);
  EXPECT_EQ(s0.weights.size(), f.num_params);
  EXPECT_EQ(s0.momentum, std::vector<float>(f.num_params, 0.0f));

  // Refusals: a plain path instead of a blob, a bad hex id, no [network].
  std::string plain = b->text;
  plain.replace(plain.find("blob:"), 5, "file:");
  EXPECT_NE(BundleDataBlobs(plain).status().message().find("blob:<64 hex digits>"), std::string::npos);
  std::string bad_hex = b->text;
  bad_hex.replace(bad_hex.find("blob:") + 5, 2, "zz");
  EXPECT_FALSE(BundleDataBlobs(bad_hex).ok());
  std::string no_net = b->text.substr(0, b->text.find("[network]"));
  EXPECT_FALSE(LoadBundle(no_net, [](const net::BlobId&, const std::string&) -> Result<std::string> {
                 return std::string("/x");
               }).ok());
  EXPECT_FALSE(LoadBundle(std::string(kMaxBundleBytes + 1, '#'),
                          [](const net::BlobId&, const std::string&) -> Result<std::string> {
                            return std::string("/x");
                          }).ok());
}

class UploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = net::BlobStore::Open(&env_, "/server", {.quota_bytes = 64 << 10});
    ASSERT_TRUE(s.ok());
    server_store_ = std::move(*s);
    auto c = net::BlobStore::Open(&env_, "/client");
    ASSERT_TRUE(c.ok());
    client_store_ = std::move(*c);
    upload_ = std::make_unique<BlobUploadService>(server_store_.get(),
                                                  UploadOptions{.max_blob_bytes = 32 << 10});
    download_ = std::make_unique<net::BlobService>(server_store_.get());
    upload_->Register(&router_);
    download_->Register(&router_);
    net_.AddNode("client");
    net_.AddNode("server")->Serve(&router_);
    net_.AddNode("down");  // serves nothing
  }

  Result<Bytes> Call(const std::string& method, Bytes body) {
    return net_.node("client")->transport()->Send("server", net::Request{method, std::move(body)});
  }

  MemEnv env_;
  std::unique_ptr<net::BlobStore> server_store_, client_store_;
  std::unique_ptr<BlobUploadService> upload_;
  std::unique_ptr<net::BlobService> download_;
  net::Router router_;
  net::SimNetwork net_{5};
};

TEST_F(UploadTest, PushThenFetch) {
  Bytes data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  Result<net::BlobId> id = client_store_->Put(data, 4096);
  ASSERT_TRUE(id.ok());
  Result<PushStats> st = PushBlob(net_.node("client")->transport(), client_store_.get(), *id,
                                  {"server"});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->chunks_sent, 3u);
  EXPECT_TRUE(server_store_->HasBlob(*id));
  EXPECT_TRUE(server_store_->IsPinned(*id));
  // Pushing again is harmless.
  EXPECT_TRUE(PushBlob(net_.node("client")->transport(), client_store_.get(), *id, {"server"}).ok());

  // One endpoint down: min_success decides.
  Result<PushStats> partial = PushBlob(net_.node("client")->transport(), client_store_.get(), *id,
                                       {"server", "down"}, {.min_success = 1, .timeout_ms = 1000});
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  EXPECT_EQ(partial->failed.size(), 1u);
  Result<PushStats> all = PushBlob(net_.node("client")->transport(), client_store_.get(), *id,
                                   {"server", "down"}, {.timeout_ms = 1000});
  EXPECT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("down"), std::string::npos);
}

TEST_F(UploadTest, RefusesMalformedUploads) {
  Bytes chunk = ToBytes("some chunk bytes");
  // Wrong hash.
  Result<Bytes> r = Call(kMethodBlobPutChunk, EncodePutChunkRequest({Blake2b("other"), chunk}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not hash"), std::string::npos);
  // Truncated / trailing bytes.
  Bytes good = EncodePutChunkRequest({Blake2b(chunk), chunk});
  EXPECT_FALSE(Call(kMethodBlobPutChunk, Bytes(good.begin(), good.end() - 1)).ok());
  Bytes extra = good;
  extra.push_back(1);
  EXPECT_FALSE(Call(kMethodBlobPutChunk, extra).ok());
  EXPECT_EQ(server_store_->stats().chunk_files, 0u);
  // Garbage manifest.
  EXPECT_FALSE(Call(kMethodBlobPutManifest, ToBytes("not a manifest")).ok());
  // A manifest whose chunks were never uploaded.
  net::Manifest m = net::BuildManifest(chunk);
  Result<Bytes> missing = Call(kMethodBlobPutManifest, net::EncodeManifest(m));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(server_store_->HasManifest(m.id()));
  // Over the upload size limit.
  net::Manifest big;
  big.total_size = 40 << 10;
  big.chunk_size = 4096;
  big.chunks.assign(10, Blake2b("x"));
  Result<Bytes> too_big = Call(kMethodBlobPutManifest, net::EncodeManifest(big));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  // The right order works.
  ASSERT_TRUE(Call(kMethodBlobPutChunk, good).ok());
  ASSERT_TRUE(Call(kMethodBlobPutManifest, net::EncodeManifest(m)).ok());
  EXPECT_TRUE(server_store_->HasBlob(m.id()));
}

TEST_F(UploadTest, QuotaRefusesUploads) {
  // 64 KiB quota, pinned uploads: the store fills up and refuses more.
  int accepted = 0;
  Status last;
  for (int i = 0; i < 40; ++i) {
    Bytes data(4000, static_cast<uint8_t>(i));
    Result<net::BlobId> id = client_store_->Put(data);
    ASSERT_TRUE(id.ok());
    Result<PushStats> st = PushBlob(net_.node("client")->transport(), client_store_.get(), *id,
                                    {"server"}, {.attempts = 1});
    if (st.ok()) ++accepted;
    else last = st.status();
  }
  EXPECT_GT(accepted, 5);
  EXPECT_LT(accepted, 40);
  EXPECT_NE(last.message().find("quota"), std::string::npos) << last.ToString();
}

}  // namespace
}  // namespace meshlearn::node
