// Kernels against PyTorch golden fixtures (engine/testdata/kernels/*.bin, written by
// tools/gen_kernel_fixtures.py from float64 PyTorch). Runs the fast kernels on the active
// configuration; bitwise equality with the reference kernels is kernels_test's job, so this
// checks that the canonical order computes the right function, within tight tolerances:
//   |got - want| <= rtol * (|want| + max|want|)   with rtol = 1e-5 (1e-6 for math.h functions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "meshlearn/engine/kernels.h"
#include "meshlearn/engine/math.h"

namespace meshlearn::engine {
namespace {

struct FixtureTensor {
  std::vector<int64_t> dims;
  std::vector<float> f;    // dtype 0
  std::vector<int32_t> i;  // dtype 1
};
using Fixture = std::map<std::string, FixtureTensor>;

bool ReadFixture(const std::string& name, Fixture* out, std::string* error) {
  std::string path = MESHLEARN_SOURCE_DIR;
  path.append("/engine/testdata/kernels/").append(name).append(".bin");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open (run /usr/bin/python3 tools/gen_kernel_fixtures.py)";
    return false;
  }
  auto u32 = [&] {
    uint32_t v = 0;
    in.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  char magic[4];
  in.read(magic, 4);
  if (!in || std::memcmp(magic, "MLKF", 4) != 0) {
    *error = path + ": bad magic";
    return false;
  }
  if (uint32_t version = u32(); version != 1) {
    *error = path + ": unsupported version " + std::to_string(version);
    return false;
  }
  const uint32_t count = u32();
  for (uint32_t t = 0; t < count && in; ++t) {
    std::string key(u32(), '\0');
    in.read(key.data(), static_cast<std::streamsize>(key.size()));
    const uint32_t dtype = u32(), ndim = u32();
    FixtureTensor ft;
    int64_t n = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t dim = 0;
      in.read(reinterpret_cast<char*>(&dim), 8);
      ft.dims.push_back(dim);
      n *= dim;
    }
    if (dtype == 0) {
      ft.f.resize(static_cast<size_t>(n));
      in.read(reinterpret_cast<char*>(ft.f.data()), n * 4);
    } else {
      ft.i.resize(static_cast<size_t>(n));
      in.read(reinterpret_cast<char*>(ft.i.data()), n * 4);
    }
    (*out)[key] = std::move(ft);
  }
  if (!in) {
    *error = path + ": truncated";
    return false;
  }
  return true;
}

class FixturesTest : public ::testing::Test {
 protected:
  void Load(const std::string& name) {
    std::string error;
    ASSERT_TRUE(ReadFixture(name, &fx_, &error)) << error;
  }
  std::vector<float> F(const std::string& key) {
    EXPECT_TRUE(fx_.count(key)) << key;
    return fx_[key].f;
  }
  std::vector<int32_t> I(const std::string& key) {
    EXPECT_TRUE(fx_.count(key)) << key;
    return fx_[key].i;
  }
  void ExpectClose(const std::string& key, const std::vector<float>& got, double rtol = 1e-5) {
    const std::vector<float>& want = fx_[key].f;
    ASSERT_EQ(got.size(), want.size()) << key;
    double scale = 0;
    for (float w : want) scale = std::fmax(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], rtol * (std::fabs(want[i]) + scale)) << key << "[" << i << "]";
    }
  }
  Fixture fx_;
};

TEST_F(FixturesTest, Linear) {
  Load("linear");
  auto s = I("shape");
  const int64_t B = s[0], C = s[1], OC = s[2];
  auto x = F("x"), w = F("w"), b = F("b"), dout = F("dout");
  std::vector<float> out(B * OC), dx(B * C), dw(OC * C), db(OC);
  LinearForward(out.data(), x.data(), w.data(), b.data(), B, C, OC);
  LinearBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), B, C, OC);
  ExpectClose("out", out);
  ExpectClose("dx", dx);
  ExpectClose("dw", dw);
  ExpectClose("db", db);
}

TEST_F(FixturesTest, Conv2d) {
  Load("conv2d");
  auto s = I("shape");
  const int64_t B = s[0], C = s[1], H = s[2], W = s[3], OC = s[4], KH = s[5], KW = s[6], S = s[7],
                P = s[8];
  auto x = F("x"), w = F("w"), b = F("b"), dout = F("dout");
  std::vector<float> out(dout.size()), dx(x.size()), dw(w.size()), db(b.size());
  Conv2dForward(out.data(), x.data(), w.data(), b.data(), B, C, H, W, OC, KH, KW, S, P);
  Conv2dBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), B, C, H, W, OC,
                 KH, KW, S, P);
  ExpectClose("out", out);
  ExpectClose("dx", dx);
  ExpectClose("dw", dw);
  ExpectClose("db", db);
}

TEST_F(FixturesTest, MaxPool2d) {
  Load("maxpool2d");
  auto s = I("shape");
  const int64_t B = s[0], C = s[1], H = s[2], W = s[3], K = s[4], S = s[5];
  const int64_t OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  auto x = F("x"), dout = F("dout");
  std::vector<float> out(B * C * OH * OW), dx(x.size());
  std::vector<int32_t> am(out.size());
  MaxPool2dForward(out.data(), am.data(), x.data(), B, C, H, W, K, S);
  MaxPool2dBackward(dx.data(), dout.data(), am.data(), B, C, OH, OW);
  ExpectClose("out", out);
  ExpectClose("dx", dx);
}

TEST_F(FixturesTest, ReluGelu) {
  for (const char* name : {"relu", "gelu"}) {
    fx_.clear();
    Load(name);
    auto x = F("x"), dout = F("dout");
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<float> out(n), dx(n);
    if (std::string(name) == "relu") {
      ReluForward(out.data(), x.data(), n);
      ReluBackward(dx.data(), dout.data(), x.data(), n);
    } else {
      GeluForward(out.data(), x.data(), n);
      GeluBackward(dx.data(), dout.data(), x.data(), n);
    }
    ExpectClose("out", out);
    ExpectClose("dx", dx);
  }
}

TEST_F(FixturesTest, SoftmaxCrossEntropy) {
  Load("softmax_ce");
  auto logits = F("logits");
  auto targets = I("targets");
  const int64_t B = fx_["logits"].dims[0], V = fx_["logits"].dims[1];
  std::vector<float> probs(B * V), losses(B), dlogits(B * V);
  float loss =
      SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), targets.data(), B, V);
  SoftmaxCrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), 1.0f, B, V);
  ExpectClose("probs", probs);
  ExpectClose("losses", losses);
  ExpectClose("loss", {loss});
  ExpectClose("dlogits", dlogits);
}

TEST_F(FixturesTest, LayerNorm) {
  Load("layernorm");
  auto x = F("x"), w = F("w"), b = F("b"), dout = F("dout");
  const int64_t N = fx_["x"].dims[0], C = fx_["x"].dims[1];
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  ExpectClose("out", out);
  ExpectClose("mean", mean);
  ExpectClose("rstd", rstd);
  ExpectClose("dx", dx);
  ExpectClose("dw", dw);
  ExpectClose("db", db);
}

TEST_F(FixturesTest, Embedding) {
  Load("embedding");
  auto table = F("table"), dout = F("dout");
  auto ids = I("ids");
  const int64_t V = fx_["table"].dims[0], C = fx_["table"].dims[1],
                N = static_cast<int64_t>(ids.size());
  std::vector<float> out(N * C), dtable(V * C);
  EmbeddingForward(out.data(), ids.data(), table.data(), N, C);
  EmbeddingBackward(dtable.data(), dout.data(), ids.data(), N, C, V);
  ExpectClose("out", out);
  ExpectClose("dtable", dtable);
}

TEST_F(FixturesTest, Attention) {
  Load("attention");
  auto s = I("shape");
  const int64_t B = s[0], T = s[1], C = s[2], NH = s[3];
  auto qkv = F("qkv"), dout = F("dout");
  std::vector<float> out(B * T * C), pre(B * NH * T * T), att(pre.size()), dpre(pre.size()),
      datt(pre.size()), dqkv(qkv.size());
  AttentionForward(out.data(), pre.data(), att.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), dpre.data(), datt.data(), dout.data(), qkv.data(), att.data(), B,
                    T, C, NH);
  ExpectClose("out", out);
  ExpectClose("att", att);
  ExpectClose("dqkv", dqkv);
}

TEST_F(FixturesTest, MathFunctions) {
  Load("math");
  auto x = F("x"), xp = F("xpos");
  std::vector<float> e(x.size()), t(x.size()), r(x.size()), l(xp.size());
  for (size_t i = 0; i < x.size(); ++i) {
    e[i] = Exp(x[i]);
    t[i] = Tanh(x[i]);
    r[i] = Erf(x[i]);
  }
  for (size_t i = 0; i < xp.size(); ++i) l[i] = Log(xp[i]);
  // Relative to each value (the scale term would hide errors in small values).
  auto rel = [&](const std::string& key, const std::vector<float>& got) {
    const auto& want = fx_[key].f;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-30) << key << "[" << i << "]";
  };
  rel("exp", e);
  rel("tanh", t);
  rel("erf", r);
  rel("log", l);
}

}  // namespace
}  // namespace meshlearn::engine
